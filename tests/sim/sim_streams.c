/* tests/sim/sim_streams.c -- the deterministic simulation of streams
 * (issue 11): frontends running the real receive state machine
 * (egress/rx.c) and model workers exchange real encoded wire messages
 * (proto/codec.c) over the simulated bus (sim.c), which drops, duplicates,
 * delays, reorders, freezes and kills. Time is simulated; one seed decides
 * everything, so a failing seed replays exactly.
 *
 *   sim_streams [--seed S] [--seeds N] [--messages M] [--profile NAME] [--verbose]
 *
 * Profiles: clean (no faults), lossy (drops, duplicates, jitter), chaos
 * (lossy + killed and frozen workers + cancels), hostile (chaos + workers
 * that ignore credit, send after their final, send garbage), bigwindow
 * (lossy with a 2^20 credit window), migrate (lossy + killed, frozen and
 * draining workers, every stream allowed 2 migrations: the frontend moves
 * a stream to another worker under a new request id, as egress/migrate.c
 * does, and the new worker resumes at resume_from_seq), grow (chaos +
 * migrations with a tuned window: a first window of 4 that may grow to 64,
 * workers that accept 32 at most, a byte bound of 2,048 on every other
 * stream, which half of those may grow fourfold), bytes (chaos + one migration + workers that
 * ignore credit, on a fixed window of 64 items with 1 KiB of byte credit: bytes bind), idle
 * (the default heartbeat of 250 ms and silence limit of 1,500 ms; workers pause 1 to 4 s
 * between items and lose half their heartbeats, on a bus that loses nothing else: stream
 * probes must keep every stream alive), idlelossy (the same on a lossy bus, with killed and
 * frozen workers and cancels), backlog (idle streams behind a frontend whose delivery is held
 * 1 to 8 s now and then, I17), reconnect (streams behind a frontend whose connection drops now
 * and then, I18), frontend (both the holds and the drops), fechaos (those and every other
 * fault), all (each in turn; the default). Items are 24 to 151 bytes.
 *
 * Every profile's workers beat as real ones do with Request.idle_heartbeat_ms: a stream with
 * nothing new since its last beat, not waiting for credit and not finished, only every idle
 * spacing; and answer a PROBE naming a stream with whether they know it and its last seq. The
 * frontend asks (egress/rx.h act->ask) as egress/probe.c does, one probe out per stream, and
 * feeds an answer to its probe out, from the stream's worker, as a heartbeat.
 *
 * Checked after every step (an invariant broken aborts with the seed):
 *   I1 exactly one terminal per stream, and nothing after it;
 *   I2 the data delivered is an in-order prefix 1..k, each item once, with
 *      its own content;
 *   I3 a stream whose worker is healthy (alive, not frozen, not hostile,
 *      not cancelled) on a bus that loses nothing completes, with every item;
 *   I4 no stream stays open: at the end every terminal was delivered;
 *   I5 memory: never more queued than the credit window, nor held than the
 *      reorder window;
 *   I6 every control message the frontend sends is one the worker's decoder
 *      accepts (a RESEND range too wide for it would never repair a gap);
 *   I7 an item past the worker's final that reached the frontend before the
 *      terminal was delivered never leaves the stream "completed": it ends
 *      with item_after_final (or another error), nothing is dropped silently;
 *   I8 every cancel reaches its handler or prevents it: a cancelled stream
 *      whose worker was not killed has a worker that saw the CANCEL/KILL or
 *      had already finished it. The frontend sends lost cancels again with
 *      the router's own table (egress/cancels.c); without it, seed 1 of the
 *      chaos profile breaks I8;
 *   I9 a stream that completed delivered every item its worker(s) produced,
 *      however many times it moved;
 *   I10 the terminal counts the moves the frontend made, never more than the
 *      limit, and while a stream moves at most twice the window is queued
 *      (I5's bound doubles then). The migrate profile must see streams that
 *      moved and completed, or it tested nothing;
 *   I11 window tuning: no grant runs past its own acknowledgement by more
 *      than the window the worker accepted (the real worker would clamp
 *      it); the window never exceeds what the worker accepted nor, after a
 *      grant, the byte bound (unless at its first size); I5's bound is the
 *      largest window the stream used. The grow profile must see windows
 *      that grew, or it tested nothing;
 *   I12 byte credit: the data bytes queued and held from the current
 *      worker never exceed the byte window in force plus the largest item
 *      seen, and the byte window stays between its first size and its
 *      most. The bytes profile must see a worker wait for byte credit, the
 *      grow profile a byte window grow.
 *   I13 queue-node blocks (egress/rx.h): a block's nodes are consecutive in
 *      the queue; until a stream moves, every block but the first (being
 *      consumed) and the last (being filled) is exactly full of live nodes;
 *      and beyond its live nodes a stream's blocks pin at most 2 x
 *      SWE_QBLOCK_MAX, plus one block a run cut short by a move or the
 *      terminal. Workers send up to 8 items in one wrapper now and then, as
 *      a coalescing worker does, so runs are fed as egress/mux.c feeds them;
 *      the run must see nodes share blocks.
 *   I14 the worker's resend ring (ingress/ring.h): each simulated worker
 *      runs the library's ring beside its own copies, keeping what a real
 *      worker keeps (streams with a window, up to window + 1 unacknowledged)
 *      and taking the acknowledgements the frontend sends. Every RESEND is
 *      checked against it: what the ring still holds in the range is the
 *      item's own bytes, and nothing kept and unacknowledged is missing; the
 *      ring's chunks never exceed 2 x the unacknowledged bytes +
 *      2 x SWN_CHUNK_MAX, and a ring with nothing unacknowledged holds no
 *      chunk. The run must see resends answered from the ring;
 *   I15 no data item reaches the consumer after its cancel call, also when
 *      the worker's final had come while items waited (the stream then ends
 *      CANCELLED, not with the final's terminal). The run must see such a
 *      cancel.
 *   I16 lost idle heartbeats cost nothing while the asks are answered: in
 *      the idle profile (I3's conditions, heartbeats lost) every stream
 *      completes with every item, although workers go silent for longer
 *      than the silence limit; the run must see asks answered, and a
 *      stream kept alive by answers alone past its silence limit. Every
 *      profile checks that an answer is fed only for the probe out, from
 *      the stream's worker, and that no stream has two probes out.
 *   I17 a frontend behind on its own queue never ends a stream for the
 *      silence it caused (egress/backlog.h): in the backlog profile the
 *      frontend's delivery is held 1 to 8 s now and then (what the bus
 *      delivers waits, in order, while its timer runs on and judges silence
 *      by the backlog's quiet time, looked at every scan), and I3 holds;
 *      the quiet time never runs ahead of now, and the run must see healthy *      streams complete
 * although the frontend was behind them by more than their silence limit. I18 a frontend whose own
 * connection drops (0.2 to 3 s) loses nothing for good: in the reconnect profile what the bus
 * delivers to it meanwhile is lost (NATS cannot deliver to a client that is not connected), what it
 * sends waits and goes out in order when it is back (nats.c's reconnect buffer), and its timer
 * judges no silence while it is down and counts silence and gaps from its return
 * (swe_rx_silence_from, as egress/stream.c does); I3 holds, and the run must see healthy streams
 * complete with every item although items of theirs were lost while it was down. Exit status 0 when
 * every seed held every invariant. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "egress/backlog.h"
#include "egress/cancels.h"
#include "egress/rx.h"
#include "ingress/ring.h"
#include "proto/sw_codec.h"
#include "tests/sim/sim.h"

enum { K_REQ = 1, K_ITEM, K_CTL, K_BOUNCE, K_PRB };

#define MAX_STREAMS 512
#define NWORKERS 4
#define FE_NODE NWORKERS /* the frontend's node index */
#define TICK_MS 25

typedef struct profile {
    const char *name;
    sim_faults f;
    double p_kill, p_freeze, p_cancel, p_hostile;
    uint32_t window;
    int64_t hb_ms;
    unsigned migrations; /* allowed per stream */
    double p_drain;      /* a worker drains: it hands its streams back */
    uint32_t window_max; /* window tuning: 0 = a fixed window */
    uint32_t worker_max; /* the workers' max_window */
    size_t window_bytes;
    double p_pause;     /* before an item, a worker pauses 1 to 4 s (idle) */
    double p_beat_lost; /* a worker's heartbeat is lost (as swx_ingress_drop_beats) */
    double p_hold;      /* the frontend's delivery is held 1 to 8 s (I17) */
    double p_down;      /* the frontend's connection is down 0.2 to 3 s (I18) */
} profile;

/* clang-format off */
static const profile profiles[] = {
    {"clean", {0, 0, 0, 2, 0}, 0, 0, 0, 0, 16, 50, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"lossy", {0.03, 0.02, 0, 8, 0}, 0, 0, 0, 0, 16, 50, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"chaos", {0.03, 0.02, 0, 8, 0}, 0.2, 0.2, 0.1, 0, 16, 50, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"hostile", {0.02, 0.02, 0, 6, 0}, 0.1, 0.1, 0.1, 0.3, 8, 50, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    /* rare heartbeats: gaps are repaired by the timer's resends */
    {"bigwindow", {0.03, 0.01, 0, 8, 0}, 0, 0, 0, 0, 1u << 20, 400, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"migrate", {0.03, 0.02, 0, 8, 0}, 0.3, 0.2, 0.05, 0, 16, 50, 2, 0.2, 0, 0, 0, 0, 0, 0, 0},
    {"grow", {0.03, 0.02, 0, 8, 0}, 0.2, 0.2, 0.05, 0, 4, 50, 2, 0.1, 64, 32, 2048, 0, 0, 0, 0},
    /* a fixed window of 64 items and 1 KiB of byte credit: bytes bind */
    {"bytes", {0.03, 0.02, 0, 8, 0}, 0.1, 0.1, 0.05, 0.1, 64, 50, 1, 0.05, 0, 0, 1024, 0, 0, 0, 0},
    /* idle streams whose beats are lost: only the asks keep them alive */
    {"idle", {0, 0.02, 0, 8, 0}, 0, 0, 0, 0, 16, 250, 0, 0, 0, 0, 0, 0.02, 0.5, 0, 0},
    {"idlelossy", {0.03, 0.02, 0, 8, 0}, 0.1, 0.1, 0.05, 0, 16, 250, 1, 0.05, 0, 0, 0, 0.02, 0.3, 0, 0},
    /* idle streams, some of their beats lost, behind a frontend whose
     * delivery is held now and then, as a consumer's callback holds the
     * mux's thread */
    {"backlog", {0, 0.02, 0, 8, 0}, 0, 0, 0, 0, 16, 250, 0, 0, 0, 0, 0, 0.02, 0.3, 1, 0},
    /* idle and busy streams behind a frontend whose connection drops now
     * and then: what is delivered to it meanwhile is lost, what it sends
     * waits for the reconnect (nats.c's reconnect buffer) */
    {"reconnect", {0, 0.02, 0, 8, 0}, 0, 0, 0, 0, 16, 250, 0, 0, 0, 0, 0, 0.02, 0.3, 0, 1},
    /* both: a frontend held now and then, and its connection dropping */
    {"frontend", {0, 0.02, 0, 8, 0}, 0, 0, 0, 0, 16, 250, 0, 0, 0, 0, 0, 0.02, 0.3, 0.6, 0.6},
    /* and with every other fault: loss, kills, freezes, drains, cancels, hostile workers, a move */
    {"fechaos", {0.03, 0.02, 0, 8, 0}, 0.2, 0.2, 0.05, 0.1, 16, 250, 1, 0.05, 0, 0, 0, 0.02, 0.3, 0.6, 0.6},
};
/* clang-format on */

/* ---------------------------------------------------------------- state */

#define PAYLOAD_MAX 160

typedef struct wstream {
    int used;
    uint8_t wid[16];   /* the request id this worker got */
    uint64_t base;     /* items the consumer had when this worker started (resume_from_seq - 1) */
    uint64_t next_seq; /* next seq to assign */
    uint64_t credit_limit; /* may send seq <= this */
    uint32_t wmax;         /* the largest window it accepts */
    int grow;              /* it answers credit_window_max with seq 1 */
    uint64_t credit_bytes; /* byte credit (Request.credit_bytes; answered with seq 1), 0 = none */
    uint64_t byte_limit;   /* may start an item while sent_bytes < byte_limit */
    uint64_t sent_bytes;
    int stalled; /* it waits for credit (said in heartbeats) */
    uint64_t acked;
    int n; /* data items the handler produces */
    int produced;
    uint64_t final_seq; /* 0 = not yet */
    int final_acked;
    int cancelled, killed;
    int hostile_credit, hostile_after_final, hostile_garbage;
    uint8_t **ring; /* encoded wrappers by seq (1..n+2) */
    size_t *ring_len;
    size_t ring_cap;
    swn_ring rg;         /* I14: the library's ring, beside ring[] (window > 0) */
    uint8_t *rg_kept;    /* I14: by seq, 1 if rg took it */
    uint64_t rg_unacked; /* I14: bytes kept in rg above rg.acked */
    int64_t idle_hb;     /* Request.idle_heartbeat_ms, used above hb_ms (0: none) */
    int64_t last_beat;   /* when it last beat (sent or lost) */
    uint64_t beat_seq;   /* the last_seq of that beat (UINT64_MAX: none yet) */
    int early_cancel;    /* a CANCEL or KILL came before the request (ingress/control.c's
                            early cancels): it is never started */
} wstream;

typedef struct fstream {
    int used;
    uint8_t id[16];
    int worker;
    swe_rx rx;
    int n;         /* what the worker will produce */
    uint64_t last; /* last data seq delivered */
    int terminal;  /* delivered */
    sw_terminal term;
    int faulty;         /* its worker was killed, frozen, hostile; or it was cancelled */
    int after_final_rx; /* an item past the final reached the frontend before the terminal */
    int cancel_sent;    /* the frontend cancelled (or killed) it */
    int cancel_called;  /* the consumer called cancel (I15), whatever it returned */
    int worker_killed;  /* its worker's node was killed */
    int done_pops;
    uint8_t wid[16];     /* the request id on the wire now (id until the first move) */
    unsigned used_mask;  /* workers the stream was on */
    unsigned moves;      /* migrations made */
    uint32_t max_window; /* the largest window the frontend used */
    size_t max_bytes;    /* the most data bytes queued and held (byte credit) */
    uint64_t max_wbytes; /* the largest byte window the frontend used */
    uint64_t ask_pid;    /* the stream probe out (0: none), as egress/sprobe.c keeps it */
    int64_t answered_at; /* the last answer fed as a heartbeat after a lost beat (I16) */
    int pauses;          /* its workers' idle pauses so far */
    int behind;          /* open while the frontend was behind by more than its silence limit */
    int lost_down;       /* an item of it was lost while the frontend's connection was down */
    wstream w[NWORKERS]; /* the worker side, one per worker the stream was on */
} fstream;

typedef struct world {
    sim *s;
    const profile *p;
    uint64_t seed;
    int verbose;
    fstream st[MAX_STREAMS];
    int nstreams;
    int wnode[NWORKERS];
    int fnode;
    uint64_t messages;
    uint64_t completed, errors_by[256], cancelled_terms, after_final_seen;
    uint64_t cancels, cancel_resends;
    swe_cancels fc; /* the frontend's cancels waiting for an answer (egress/cancels.c) */
    int failed;
    int draining[NWORKERS];
    uint64_t migrations, mig_failed, moved_completed;
    uint64_t grown;       /* streams whose window grew */
    uint64_t bgrown;      /* streams whose byte window grew */
    uint64_t byte_stalls; /* a worker waited for byte credit (item credit left) */
    uint64_t batches;     /* messages of more than one item */
    uint64_t probe_seq;   /* the last stream probe id given out */
    uint64_t asks, answers, beats_lost;
    /* I17: what the bus delivered to the frontend waits here, in order,
     * while its delivery is held (profiles with holds) */
    struct fe_msg {
        int from, kind;
        int64_t delay; /* oq: a request's reliable delay (-1: not a request) */
        uint8_t *data;
        size_t len;
    } * fq;
    size_t fq_head, fq_n, fq_cap;
    uint64_t taken, done; /* messages delivered to the frontend, and handled */
    int64_t held_until;   /* its delivery is held until then */
    swe_backlog bl;       /* egress/backlog.c, looked at every scan */
    int64_t quiet;        /* the quiet time of the last look */
    /* I18: the frontend's connection is down until down_until; up_ms: when
     * it last came back (0: never went down). What it sends meanwhile
     * waits in oq (`from`: the node it goes to; a request goes reliably,
     * after `delay` ms), and goes out in order when it is back. */
    int64_t down_until, up_ms;
    struct fe_msg *oq;
    size_t oq_n, oq_cap;
    uint64_t lost_down; /* deliveries to the frontend lost while it was down */
} world;

/* Queue nodes found sharing a block (I13), over the whole run: the blocks
 * must have been exercised. */
static uint64_t g_block_nodes;

/* I14: items a RESEND found in a worker's resend ring, over the whole run. */
static uint64_t g_ring_resent;
static uint64_t g_cancel_behind_final; /* cancels that replaced a terminal queued behind data */
/* I16: asks answered (fed as heartbeats), and streams that an answer kept
 * alive past their silence limit (its beats lost all along), over the run */
static uint64_t g_asks_answered, g_kept_by_answers;
/* I17: holds of the frontend's delivery, and streams that completed
 * although the frontend was behind by more than their silence limit */
static uint64_t g_holds, g_kept_behind;
/* I18: the frontend's connection drops, and healthy streams that completed
 * with every item although some were lost while it was down */
static uint64_t g_downs, g_repaired_after_down;
/* What a bus node points to: its world and its node index. */
typedef struct node_box {
    world *wd;
    int index;
} node_box;

#define FAIL(wd, ...)                                                                           \
    do {                                                                                        \
        fprintf(stderr,                                                                         \
                "sim_streams: seed 0x%llx profile %s t=%lld: ", (unsigned long long)(wd)->seed, \
                (wd)->p->name, (long long)sim_now((wd)->s));                                    \
        fprintf(stderr, __VA_ARGS__);                                                           \
        fprintf(stderr, "\n");                                                                  \
        abort();                                                                                \
    } while (0)

/* The frontend's view: the stream whose request id on the wire is id. */
static fstream *
find_stream(world *wd, const uint8_t *id)
{
    for (int i = 0; i < wd->nstreams; i++)
        if (memcmp(wd->st[i].wid, id, 16) == 0)
            return &wd->st[i];
    return NULL;
}

/* A worker's view: its stream with request id id (k: the worker's index). */
static fstream *
find_wstream(world *wd, int k, const uint8_t *id)
{
    for (int i = 0; i < wd->nstreams; i++)
        if (wd->st[i].w[k].used && memcmp(wd->st[i].w[k].wid, id, 16) == 0)
            return &wd->st[i];
    return NULL;
}

static int
worker_index(world *wd, int node)
{
    for (int k = 0; k < NWORKERS; k++)
        if (wd->wnode[k] == node)
            return k;
    return -1;
}

static void
payload_of(const uint8_t *id, uint64_t seq, char *out, size_t cap)
{
    /* 24 to 151 bytes: byte credit sees items of many sizes */
    size_t want = 24 + (size_t)((seq * 37 + id[1]) % 128);
    int n = snprintf(out, cap, "%02x%02x-%llu", id[0], id[1], (unsigned long long)seq);
    if (want > cap - 1)
        want = cap - 1;
    if (n >= 0 && (size_t)n < want) {
        memset(out + n, (int)('a' + seq % 26), want - (size_t)n);
        out[want] = '\0';
    }
}

/* ---------------------------------------------------------------- worker */

static void
w_store(wstream *w, uint64_t seq, const uint8_t *buf, size_t len)
{
    if (seq >= w->ring_cap)
        return;
    free(w->ring[seq]);
    w->ring[seq] = malloc(len);
    if (w->ring[seq] == NULL)
        abort();
    memcpy(w->ring[seq], buf, len);
    w->ring_len[seq] = len;
}

/* ---------------------------------------------------------------- I14 */

/* The ring's chunks against its unacknowledged bytes (ingress/ring.h). */
static void
w_ring_check(world *wd, const wstream *w)
{
    size_t chunks = 0;
    for (const swn_chunk *c = w->rg.ch_head; c != NULL; c = c->next)
        chunks += c->cap;
    if (chunks > 2 * w->rg_unacked + 2 * SWN_CHUNK_MAX)
        FAIL(wd, "I14: the resend ring's chunks hold %zu bytes for %llu unacknowledged", chunks,
             (unsigned long long)w->rg_unacked);
    if (w->rg_unacked == 0 && chunks != 0)
        FAIL(wd, "I14: %zu bytes of chunks with nothing unacknowledged", chunks);
}

/* Item seq goes out (now, or in this event's batch): the ring keeps it as
 * a real worker does. An honest worker's items always fit: it sends within
 * acked + window, and its final needs one slot more. */
static void
w_ring_keep(world *wd, wstream *w, uint64_t seq, const uint8_t *buf, size_t len)
{
    if (!swn_ring_keeps(&w->rg) || seq >= w->ring_cap)
        return;
    if (seq >= w->rg.next_seq)
        w->rg.next_seq = seq + 1;
    if (swn_ring_keep(&w->rg, seq, buf, len, 0) == SW_OK) {
        w->rg_kept[seq] = 1;
        w->rg_unacked += len;
    } else if (!w->hostile_credit && !(w->final_seq && seq > w->final_seq)) {
        FAIL(wd, "I14: the ring refused item %llu of an honest worker (acked %llu, window %u)",
             (unsigned long long)seq, (unsigned long long)w->rg.acked, w->rg.window);
    }
    if (seq > w->rg.pub_seq)
        w->rg.pub_seq = seq;
    w_ring_check(wd, w);
}

/* An acknowledgement reaches the worker: the ring lets go up to it. */
static void
w_ring_ack(world *wd, wstream *w, uint64_t ack)
{
    uint64_t from = w->rg.acked;
    if (!swn_ring_keeps(&w->rg))
        return;
    ack = swn_ring_ack(&w->rg, ack);
    for (uint64_t q = from + 1; q <= ack && q < w->ring_cap; q++)
        if (w->rg_kept[q]) {
            w->rg_kept[q] = 0;
            w->rg_unacked -= w->ring_len[q];
        }
    w_ring_check(wd, w);
}

/* A RESEND of from..to: what the ring holds there is the item's own bytes,
 * and nothing it kept and still owes is missing. */
static void
w_ring_resend(world *wd, const wstream *w, uint64_t from, uint64_t to)
{
    if (!swn_ring_resend_range(&w->rg, &from, &to))
        return;
    for (uint64_t q = from; q <= to && q < w->ring_cap; q++) {
        size_t len = 0;
        const uint8_t *p = swn_ring_get(&w->rg, q, &len, NULL);
        if (p == NULL) {
            if (w->rg_kept[q])
                FAIL(wd, "I14: item %llu kept and unacknowledged is gone from the ring",
                     (unsigned long long)q);
            continue;
        }
        if (!w->rg_kept[q] || len != w->ring_len[q] || memcmp(p, w->ring[q], len) != 0)
            FAIL(wd, "I14: the ring's item %llu is not the one sent (%zu bytes, kept %d)",
                 (unsigned long long)q, len, w->rg_kept[q]);
        g_ring_resent++;
    }
}

/* Encodes m, keeps it for resends (keep_seq != 0) and, if send, sends it. */
static void
w_publish(world *wd, fstream *f, int k, const swp_item *m, uint64_t keep_seq, int send)
{
    uint8_t buf[512];
    size_t len;
    if (swp_encode(m, buf, sizeof(buf), &len) != SW_OK)
        abort();
    if (keep_seq) {
        w_store(&f->w[k], keep_seq, buf, len);
        w_ring_keep(wd, &f->w[k], keep_seq, buf, len);
    }
    if (!send)
        return;
    sim_send(wd->s, wd->wnode[k], wd->fnode, K_ITEM, buf, len, 0, 0);
    wd->messages++;
}

/* Worker k's item seq (its own numbering); a final with status, or with
 * error err (status 0: a final error, as a draining worker's handing back).
 * Kept for resends, and sent unless w_item_kept (a batch sends it). */
static void w_item_as(world *wd, fstream *f, int k, uint64_t seq, int final, int status, int send);

static void
w_item(world *wd, fstream *f, int k, uint64_t seq, int final, int status)
{
    w_item_as(wd, f, k, seq, final, status, 1);
}

static void
w_item_as(world *wd, fstream *f, int k, uint64_t seq, int final, int status, int send)
{
    swp_item m = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__INIT;
    swp_terminal t = STREAMWIRE__V1__TERMINAL__INIT;
    swp_error e = STREAMWIRE__V1__ERROR__INIT;
    char pl[PAYLOAD_MAX];
    m.version = SW_PROTOCOL_VERSION;
    m.request_id.data = f->w[k].wid;
    m.request_id.len = 16;
    m.seq = seq;
    if (final) {
        m.complete_final = 1;
        if (status == 0) {
            t.status = STREAMWIRE__V1__STATUS__STATUS_FAILED;
            e.sw_code = SW_INSTANCE_LOST;
            e.message = (char *)"the worker is draining";
            t.error = &e;
        } else {
            t.status = (Streamwire__V1__Status)status;
        }
        t.finish_reason =
            (char *)(status == STREAMWIRE__V1__STATUS__STATUS_COMPLETED ? "stop" : "");
        m.terminal = &t;
    } else {
        /* the consumer's seq: after what it had when this worker started */
        payload_of(f->id, f->w[k].base + seq, pl, sizeof(pl));
        m.body_case = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_DATA;
        m.data.data = (uint8_t *)pl;
        m.data.len = strlen(pl);
    }
    if (seq == 1 && f->w[k].grow)
        m.credit_window_max = f->w[k].wmax; /* as the real worker, with seq 1 */
    if (seq == 1)
        m.credit_bytes = f->w[k].credit_bytes;
    f->w[k].sent_bytes += m.data.len;
    w_publish(wd, f, k, &m, seq, send);
}

/* Sends worker k's kept items seq0 .. seq0 + n - 1 as one wrapper, the
 * first item's, with the rest as its batch: a coalescing worker's message
 * (ingress/sender.c). */
static void
w_send_batch(world *wd, fstream *f, int k, uint64_t seq0, int n)
{
    swp_item *items[8];
    swp_batched b[8], *bp[8];
    uint8_t buf[4096];
    size_t len;
    wstream *w = &f->w[k];
    if (n < 1 || n > 8)
        abort();
    for (int i = 0; i < n; i++)
        if (swp_decode_item(w->ring[seq0 + (uint64_t)i], w->ring_len[seq0 + (uint64_t)i], 1 << 20,
                            &items[i]) != SW_OK)
            abort();
    for (int i = 1; i < n; i++) {
        streamwire__v1__batched_item__init(&b[i - 1]);
        b[i - 1].seq = items[i]->seq;
        b[i - 1].data = items[i]->data;
        bp[i - 1] = &b[i - 1];
    }
    items[0]->n_batch = (size_t)n - 1;
    items[0]->batch = n > 1 ? bp : NULL;
    if (swp_encode(items[0], buf, sizeof(buf), &len) != SW_OK)
        abort();
    items[0]->n_batch = 0;
    items[0]->batch = NULL;
    for (int i = 0; i < n; i++)
        swp_free(items[i]);
    sim_send(wd->s, wd->wnode[k], wd->fnode, K_ITEM, buf, len, 0, 0);
    wd->messages++;
    if (n > 1)
        wd->batches++;
}

/* The handler on worker k (b): produces the next item when credit allows. */
static void
ev_produce(sim *s, void *arg, uint64_t idx, uint64_t b)
{
    world *wd = arg;
    fstream *f = &wd->st[idx];
    int k = (int)b;
    wstream *w = &f->w[k];
    if (!sim_alive(s, wd->wnode[k]) || w->cancelled || w->killed || w->final_seq)
        return;
    if (sim_frozen(s, wd->wnode[k])) {
        sim_at(s, 5, ev_produce, wd, idx, b);
        return;
    }
    if (w->produced < w->n) {
        if (wd->p->p_pause > 0 && w->produced > 0 && !w->stalled && f->pauses < 2 &&
            sim_rng_chance(sim_rand(s), wd->p->p_pause)) {
            /* idle for 1 to 4 s, twice a stream at most (so that every
             * stream can end within the run's last 20 s) */
            f->pauses++;
            sim_at(s, 1000 + (int64_t)sim_rng_below(sim_rand(s), 3000), ev_produce, wd, idx, b);
            return;
        }
        if ((w->next_seq > w->credit_limit ||
             (w->credit_bytes != 0 && w->sent_bytes >= w->byte_limit)) &&
            !w->hostile_credit) {
            if (w->next_seq <= w->credit_limit)
                wd->byte_stalls++;
            w->stalled = 1;
            sim_at(s, 2, ev_produce, wd, idx, b); /* blocked on credit */
            return;
        }
        w->stalled = 0;
        if (w->hostile_garbage && sim_rng_chance(sim_rand(s), 0.05)) {
            static const uint8_t junk[] = {0xff, 0x01, 0x02, 0x7f};
            sim_send(s, wd->wnode[k], wd->fnode, K_ITEM, junk, sizeof(junk), 0, 0);
        }
        {
            /* Now and then what credit allows goes out together, up to 8
             * items in one wrapper (each kept alone for resends). */
            uint64_t seq0 = w->next_seq;
            int want =
                sim_rng_chance(sim_rand(s), 0.3) ? 2 + (int)sim_rng_below(sim_rand(s), 7) : 1;
            int n = 0;
            while (n < want && w->produced < w->n &&
                   (n == 0 || w->hostile_credit ||
                    (w->next_seq <= w->credit_limit &&
                     (w->credit_bytes == 0 || w->sent_bytes < w->byte_limit)))) {
                w_item_as(wd, f, k, w->next_seq++, 0, 0, 0);
                w->produced++;
                n++;
            }
            w_send_batch(wd, f, k, seq0, n);
        }
        sim_at(s, (int64_t)sim_rng_below(sim_rand(s), 4), ev_produce, wd, idx, b);
        return;
    }
    w->final_seq = w->next_seq++;
    w_item(wd, f, k, w->final_seq, 1, STREAMWIRE__V1__STATUS__STATUS_COMPLETED);
    if (w->hostile_after_final)
        w_item(wd, f, k, w->next_seq++, 0, 0);
}

/* Heartbeats of worker k (b) until the final is acknowledged. */
static void
ev_heartbeat(sim *s, void *arg, uint64_t idx, uint64_t b)
{
    world *wd = arg;
    fstream *f = &wd->st[idx];
    int k = (int)b;
    wstream *w = &f->w[k];
    swp_item m = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__INIT;
    swp_heartbeat h = STREAMWIRE__V1__HEARTBEAT__INIT;
    int64_t every = wd->p->hb_ms;
    if (!sim_alive(s, wd->wnode[k]) || w->killed || w->final_acked)
        return;
    /* Nothing new since the last beat, not stalled, not finished: only every
     * idle spacing (ingress/heartbeat.c resp_beat_every). */
    if (w->idle_hb > every && !w->stalled && w->final_seq == 0 && w->beat_seq == w->next_seq - 1)
        every = w->idle_hb;
    if (!sim_frozen(s, wd->wnode[k]) && sim_now(s) - w->last_beat >= every) {
        w->last_beat = sim_now(s);
        w->beat_seq = w->next_seq - 1;
        if (wd->p->p_beat_lost > 0 && sim_rng_chance(sim_rand(s), wd->p->p_beat_lost)) {
            wd->beats_lost++; /* lost on the bus: the worker goes on as though it went out */
            sim_at(s, wd->p->hb_ms, ev_heartbeat, wd, idx, b);
            return;
        }
        m.version = SW_PROTOCOL_VERSION;
        m.request_id.data = w->wid;
        m.request_id.len = 16;
        m.body_case = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_HEARTBEAT;
        h.last_seq = w->next_seq - 1;
        h.stalled = w->stalled;
        m.heartbeat = &h;
        w_publish(wd, f, k, &m, 0, 1);
    }
    sim_at(s, wd->p->hb_ms, ev_heartbeat, wd, idx, b);
}

/* A draining worker hands stream f back: a final instance_lost after what
 * it sent (the frontend migrates the stream). */
static void
w_hand_back(world *wd, fstream *f, int k)
{
    wstream *w = &f->w[k];
    if (!w->used || w->final_seq || w->cancelled || w->killed)
        return;
    w->final_seq = w->next_seq++;
    w_item(wd, f, k, w->final_seq, 1, 0);
}

static void
worker_on_request(world *wd, int node, const uint8_t *data, size_t len)
{
    swp_request *req = NULL;
    fstream *f;
    wstream *w;
    int k = worker_index(wd, node);
    if (swp_decode_request(data, len, 1 << 20, &req) != SW_OK)
        FAIL(wd, "a request the frontend sent did not decode");
    if (k < 0 || (f = find_wstream(wd, k, req->request_id.data)) != NULL) {
        swp_free(req); /* a duplicate request: NATS may deliver twice */
        return;
    }
    f = find_stream(wd, req->request_id.data);
    if (f == NULL) {
        /* The stream moved on while this request was on its way (a frozen
         * worker): the frontend no longer knows the id. */
        swp_free(req);
        return;
    }
    if (f->worker != k)
        FAIL(wd, "a request for an unknown stream");
    w = &f->w[k];
    if (w->used)
        FAIL(wd, "a stream came back to worker %d", k);
    w->used = 1;
    memcpy(w->wid, req->request_id.data, 16);
    if (w->early_cancel) { /* never started, nothing sent */
        w->cancelled = 1;
        swp_free(req);
        return;
    }
    w->base = req->resume_from_seq ? req->resume_from_seq - 1 : 0;
    if (w->base > (uint64_t)f->n)
        FAIL(wd, "resume_from_seq %llu past the stream's %d items",
             (unsigned long long)req->resume_from_seq, f->n);
    w->next_seq = 1;
    w->credit_limit = req->credit_window;
    w->wmax = req->credit_window;
    if (req->credit_window_max > req->credit_window && wd->p->worker_max > req->credit_window) {
        w->wmax =
            req->credit_window_max < wd->p->worker_max ? req->credit_window_max : wd->p->worker_max;
        w->grow = 1;
    }
    w->credit_bytes = req->credit_window != 0 ? req->credit_bytes : 0;
    w->byte_limit = w->credit_bytes;
    w->idle_hb = req->idle_heartbeat_ms > req->heartbeat_ms ? req->idle_heartbeat_ms : 0;
    w->last_beat = sim_now(wd->s);
    w->beat_seq = UINT64_MAX;
    w->n = f->n - (int)w->base;
    w->ring_cap = (size_t)w->n + 3;
    w->ring = calloc(w->ring_cap, sizeof(*w->ring));
    w->ring_len = calloc(w->ring_cap, sizeof(*w->ring_len));
    w->rg_kept = calloc(w->ring_cap, 1);
    if (w->ring == NULL || w->ring_len == NULL || w->rg_kept == NULL ||
        swn_ring_init(&w->rg, w->wmax) != 0)
        abort();
    swp_free(req);
    if (wd->draining[k]) { /* it takes nothing new: handed back at once */
        w_hand_back(wd, f, k);
        return;
    }
    sim_at(wd->s, 0, ev_produce, wd, (uint64_t)(f - wd->st), (uint64_t)k);
    sim_at(wd->s, wd->p->hb_ms, ev_heartbeat, wd, (uint64_t)(f - wd->st), (uint64_t)k);
}

static void
worker_on_control(world *wd, int node, const uint8_t *data, size_t len)
{
    swp_control *c = NULL;
    fstream *f;
    wstream *w;
    int k = worker_index(wd, node);
    /* I6: what the frontend sends, the worker's decoder accepts. */
    if (swp_decode_control(data, len, 8192, &c) != SW_OK) {
        Streamwire__V1__Control *raw = streamwire__v1__control__unpack(NULL, len, data);
        FAIL(wd,
             "I6: the frontend sent a control the worker's decoder refuses (kind %d, %llu..%llu)",
             raw ? (int)raw->kind : -1, raw ? (unsigned long long)raw->resend_from : 0,
             raw ? (unsigned long long)raw->resend_to : 0);
    }
    if (k < 0) {
        swp_free(c);
        return;
    }
    if (c->kind == STREAMWIRE__V1__CONTROL_KIND__CONTROL_ACK_FINALS) {
        for (size_t i = 0; i < c->n_final_acks; i++)
            if ((f = find_wstream(wd, k, c->final_acks[i].data)) != NULL)
                f->w[k].final_acked = 1;
        swp_free(c);
        return;
    }
    f = find_wstream(wd, k, c->request_id.data);
    if (c->kind == STREAMWIRE__V1__CONTROL_KIND__CONTROL_PROBE) {
        /* ingress/control.c ing_probe_reply: known while not finished or
         * its final not acknowledged (a killed stream is let go) */
        swp_probe_reply p = STREAMWIRE__V1__PROBE_REPLY__INIT;
        uint8_t buf[128];
        size_t plen;
        char inst[16];
        snprintf(inst, sizeof(inst), "w%d", k);
        p.version = SW_PROTOCOL_VERSION;
        p.instance_id = inst;
        p.probe_id = c->probe_id;
        if (f != NULL) {
            w = &f->w[k];
            p.known = !w->killed && (w->final_seq == 0 || !w->final_acked);
            p.last_seq = w->next_seq - 1;
        }
        if (swp_encode(&p, buf, sizeof(buf), &plen) != SW_OK)
            abort();
        sim_send(wd->s, wd->wnode[k], wd->fnode, K_PRB, buf, plen, 0, 0);
        wd->messages++;
        swp_free(c);
        return;
    }
    if (f == NULL) {
        /* A cancel before its request (a frontend whose connection came
         * back sends both at once; they go to different subscriptions):
         * kept, as the worker's early cancels are, and the request is
         * never started. */
        if ((c->kind == STREAMWIRE__V1__CONTROL_KIND__CONTROL_CANCEL ||
             c->kind == STREAMWIRE__V1__CONTROL_KIND__CONTROL_KILL) &&
            (f = find_stream(wd, c->request_id.data)) != NULL)
            f->w[k].early_cancel = 1;
        swp_free(c);
        return;
    }
    w = &f->w[k];
    switch (c->kind) {
    case STREAMWIRE__V1__CONTROL_KIND__CONTROL_CREDIT:
        if (w->wmax != 0 && c->credit_limit > c->ack_seq + w->wmax)
            FAIL(wd, "I11: a grant to %llu with ack %llu: past the window %u the worker accepted",
                 (unsigned long long)c->credit_limit, (unsigned long long)c->ack_seq, w->wmax);
        if (c->credit_limit > w->credit_limit)
            w->credit_limit = c->credit_limit;
        if (w->credit_bytes != 0 && c->byte_limit > w->byte_limit)
            w->byte_limit = c->byte_limit;
        if (c->ack_seq > w->acked && c->ack_seq < w->next_seq)
            w->acked = c->ack_seq;
        w_ring_ack(wd, w, c->ack_seq);
        break;
    case STREAMWIRE__V1__CONTROL_KIND__CONTROL_RESEND:
        w_ring_resend(wd, w, c->resend_from, c->resend_to);
        for (uint64_t q = c->resend_from; q <= c->resend_to && q < w->next_seq; q++)
            if (q < w->ring_cap && w->ring[q] != NULL) {
                sim_send(wd->s, wd->wnode[k], wd->fnode, K_ITEM, w->ring[q], w->ring_len[q], 0, 0);
                wd->messages++;
            }
        break;
    case STREAMWIRE__V1__CONTROL_KIND__CONTROL_CANCEL:
        if (!w->cancelled && !w->final_seq) {
            w->cancelled = 1;
            w->final_seq = w->next_seq++;
            w_item(wd, f, k, w->final_seq, 1, STREAMWIRE__V1__STATUS__STATUS_CANCELLED);
        }
        break;
    case STREAMWIRE__V1__CONTROL_KIND__CONTROL_KILL:
        w->killed = 1;
        break;
    default:
        break;
    }
    swp_free(c);
}

static void
worker_recv(sim *s, void *node, int from, int kind, const uint8_t *data, size_t len)
{
    node_box *nb = node;
    (void)s;
    (void)from;
    if (kind == K_REQ)
        worker_on_request(nb->wd, nb->index, data, len);
    else if (kind == K_CTL)
        worker_on_control(nb->wd, nb->index, data, len);
}

/* ---------------------------------------------------------------- frontend */

static void fe_pop(sim *s, void *arg, uint64_t idx, uint64_t b);

/* Appends a copy of a message to a queue of them (fq or oq). */
static void
msgq_push(struct fe_msg **q, size_t *head, size_t *n, size_t *cap, int from, int kind,
          int64_t delay, const uint8_t *data, size_t len)
{
    struct fe_msg *m;
    if (*n == *cap) {
        size_t ncap = *cap ? 2 * *cap : 256;
        struct fe_msg *nq = malloc(ncap * sizeof(*nq));
        if (nq == NULL)
            abort();
        for (size_t i = 0; i < *n; i++)
            nq[i] = (*q)[(*head + i) % *cap];
        free(*q);
        *q = nq;
        *cap = ncap;
        *head = 0;
    }
    m = &(*q)[(*head + *n) % *cap];
    m->from = from;
    m->kind = kind;
    m->delay = delay;
    m->len = len;
    m->data = malloc(len ? len : 1);
    if (m->data == NULL)
        abort();
    memcpy(m->data, data, len);
    (*n)++;
}

/* What the frontend sends to node `to`: at once, or once its connection
 * is back (I18). delay >= 0: a request, sent reliably after delay ms. */
static void
fe_out(world *wd, int to, int kind, const uint8_t *data, size_t len, int64_t delay)
{
    size_t head = 0;
    if (sim_now(wd->s) < wd->down_until) {
        msgq_push(&wd->oq, &head, &wd->oq_n, &wd->oq_cap, to, kind, delay, data, len);
        return;
    }
    if (delay >= 0)
        sim_send_reliable(wd->s, wd->fnode, to, kind, data, len, delay);
    else
        sim_send(wd->s, wd->fnode, to, kind, data, len, 0, 0);
}
/* A control to worker k about request id. */
static void
fe_send_ctl_to(world *wd, int k, const uint8_t *id, int kind, uint64_t limit, uint64_t ack,
               uint64_t from, uint64_t to, uint64_t bytes)
{
    swp_control m = STREAMWIRE__V1__CONTROL__INIT;
    ProtobufCBinaryData one;
    uint8_t buf[256];
    size_t len;
    m.version = SW_PROTOCOL_VERSION;
    m.kind = (Streamwire__V1__ControlKind)kind;
    m.router_id = (char *)"simfe";
    if (kind == STREAMWIRE__V1__CONTROL_KIND__CONTROL_ACK_FINALS) {
        one.data = (uint8_t *)id;
        one.len = 16;
        m.final_acks = &one;
        m.n_final_acks = 1;
    } else {
        m.request_id.data = (uint8_t *)id;
        m.request_id.len = 16;
    }
    m.credit_limit = limit;
    m.ack_seq = ack;
    m.resend_from = from;
    m.resend_to = to;
    m.byte_limit = bytes;
    if (swp_encode(&m, buf, sizeof(buf), &len) != SW_OK)
        abort();
    fe_out(wd, wd->wnode[k], K_CTL, buf, len, -1);
    wd->messages++;
}

static void
fe_send_ctl(world *wd, fstream *f, int kind, uint64_t limit, uint64_t ack, uint64_t from,
            uint64_t to)
{
    fe_send_ctl_to(wd, f->worker, f->wid, kind, limit, ack, from, to, 0);
}

/* A cancel sent again until the worker answers (the cancels table keeps
 * the worker's index as its "subject"). */
static void
fe_cancel_wait(world *wd, fstream *f, int k, const uint8_t *id, int kill)
{
    char subj[8];
    snprintf(subj, sizeof(subj), "%d", k);
    (void)swe_cancels_add_to(&wd->fc, id, subj, f, kill, sim_now(wd->s));
}

static void
fe_check_bounds(world *wd, fstream *f)
{
    /* I5, and I10: twice the window while items of a worker left behind
     * are still queued */
    size_t bound;
    uint32_t accepted = f->rx.wmax > f->rx.window0 ? f->rx.wmax : f->rx.window0;
    if (f->rx.window > f->max_window)
        f->max_window = f->rx.window;
    /* I12: the byte window grows only within its maximum */
    if (f->rx.wbytes > f->max_wbytes)
        f->max_wbytes = f->rx.wbytes;
    if (f->rx.cfg.window_bytes != 0 &&
        (f->rx.wbytes < f->rx.cfg.window_bytes ||
         f->rx.wbytes > (f->rx.cfg.window_bytes_max > f->rx.cfg.window_bytes
                             ? f->rx.cfg.window_bytes_max
                             : f->rx.cfg.window_bytes)))
        FAIL(wd, "I12: byte window %llu, first %zu, most %zu", (unsigned long long)f->rx.wbytes,
             f->rx.cfg.window_bytes, f->rx.cfg.window_bytes_max);
    bound = (size_t)f->max_window * (f->rx.gen > 0 ? 2 : 1);
    if (f->rx.qlen > bound)
        FAIL(wd, "I5: %zu items queued, window %u", f->rx.qlen, f->max_window);
    /* I11: within what the worker accepted */
    if (f->rx.window > accepted)
        FAIL(wd, "I11: window %u, the worker accepted %u", f->rx.window, accepted);
    if (f->rx.held > f->rx.hold_cap)
        FAIL(wd, "I5: %zu items held, reorder window %zu", f->rx.held, f->rx.hold_cap);
    /* I12: byte credit bounds the data bytes queued and held from the
     * current worker: the budget plus one item (its largest) */
    if (f->rx.bytes_on) {
        size_t bytes = 0, largest = f->rx.max_cost - SW_ITEM_COST;
        for (const swe_q *q = f->rx.qh; q != NULL; q = q->next)
            if (q->gen == f->rx.gen)
                bytes += q->len;
        for (size_t i = 0; f->rx.hold != NULL && i < f->rx.hold_cap; i++)
            if (f->rx.hold[i] != NULL)
                bytes += f->rx.hold[i]->len;
        if (bytes > f->rx.wbytes + largest)
            FAIL(wd, "I12: %zu data bytes queued and held, byte window %llu + one item %zu", bytes,
                 (unsigned long long)f->rx.wbytes, largest);
        if (bytes > f->max_bytes)
            f->max_bytes = bytes;
    }
    /* I13: queue-node blocks (rx.h): a block's nodes are consecutive in the
     * queue (after the item last popped); until a move, a block between the
     * first and the last segment is exactly full; beyond its live nodes a
     * stream pins at most 2 x SWE_QBLOCK_MAX, plus one block for each run
     * cut short (a move, the terminal). */
    {
        const swe_qblock *segs[256];
        size_t nsegs = 0, waste = 0, live = 0, cuts = f->rx.gen + (f->rx.term_state != 0);
        const swe_qblock *cb = NULL;
        const swe_q *q = f->rx.cur != NULL ? f->rx.cur : f->rx.qh;
        while (q != NULL) {
            if (q->blk != cb) {
                if (cb != NULL && nsegs > 1 && f->rx.gen == 0 && live != cb->cap)
                    FAIL(wd,
                         "I13: a block between the first and the last has %zu of %zu bytes "
                         "live",
                         live, cb->cap);
                if (cb != NULL)
                    waste += cb->cap - live;
                cb = q->blk;
                live = 0;
                if (cb != NULL) {
                    for (size_t i = 0; i < nsegs; i++)
                        if (segs[i] == cb)
                            FAIL(wd, "I13: a block's nodes are not consecutive in the queue");
                    if (nsegs < sizeof(segs) / sizeof(segs[0]))
                        segs[nsegs++] = cb;
                    if (cb->cap > SWE_QBLOCK_MAX || cb->used > cb->cap)
                        FAIL(wd, "I13: a block of %zu bytes, %zu used", cb->cap, cb->used);
                }
            }
            if (cb != NULL) {
                live += swe_q_bytes(q->len, strlen(q->event));
                g_block_nodes++;
            }
            q = q == f->rx.cur ? f->rx.qh : q->next;
        }
        if (cb != NULL)
            waste += cb->cap - live;
        if (waste > (2 + cuts) * SWE_QBLOCK_MAX)
            FAIL(wd, "I13: blocks pin %zu bytes beyond their live nodes (%zu cuts)", waste, cuts);
    }
}

static void fe_apply(world *wd, fstream *f, const swe_rx_act *a);

/* The request of stream f, under its wire id, to its worker. It is not
 * lost here (a lost request is the no-responders/inactivity path, covered
 * by the integration tests). */
static void
fe_send_request(world *wd, fstream *f, uint64_t resume)
{
    swp_request m = STREAMWIRE__V1__REQUEST__INIT;
    uint8_t buf[256];
    size_t len;
    m.version = SW_PROTOCOL_VERSION;
    m.request_id.data = f->wid;
    m.request_id.len = 16;
    m.response_subject = (char *)"sw.rsp.simfe.x";
    m.router_id = (char *)"simfe";
    m.credit_window = f->rx.cfg.window;
    m.credit_window_max = f->rx.cfg.window_max > f->rx.cfg.window ? f->rx.cfg.window_max : 0;
    m.credit_bytes = f->rx.cfg.window_bytes;
    m.heartbeat_ms = (uint32_t)wd->p->hb_ms;
    m.idle_heartbeat_ms = f->rx.cfg.idle_hb_ms;
    m.resume_from_seq = resume;
    m.migratable = f->rx.mig_left > 0;
    if (swp_encode(&m, buf, sizeof(buf), &len) != SW_OK)
        abort();
    fe_out(wd, wd->wnode[f->worker], K_REQ, buf, len,
           1 + (int64_t)sim_rng_below(sim_rand(wd->s), 3));
    wd->messages++;
}

/* act->migrate, as egress/migrate.c does it: the old worker is cancelled
 * (unless it handed the stream back), another live worker the stream was
 * never on is picked, and the request goes out again under a new id with
 * resume_from_seq. */
static void
fe_migrate(world *wd, fstream *f)
{
    sim *s = wd->s;
    int cand[NWORKERS], nc = 0, k;
    uint64_t resume;
    if (!f->rx.migrating)
        return;
    if (!f->rx.mig_from_final) {
        fe_send_ctl(wd, f, STREAMWIRE__V1__CONTROL_KIND__CONTROL_CANCEL, 0, 0, 0, 0);
        fe_cancel_wait(wd, f, f->worker, f->wid, 0);
    }
    for (k = 0; k < NWORKERS; k++)
        if (sim_alive(s, wd->wnode[k]) && !wd->draining[k] && !(f->used_mask & (1u << k)))
            cand[nc++] = k;
    if (nc == 0) {
        swe_rx_act a;
        if (swe_rx_migration_failed(&f->rx, SW_NO_INSTANCES, NULL, sim_now(s), &a)) {
            wd->mig_failed++;
            fe_apply(wd, f, &a);
        }
        return;
    }
    k = cand[sim_rng_below(sim_rand(s), (uint64_t)nc)];
    resume = f->rx.seq_base + f->rx.gen_items + 1;
    for (int j = 0; j < 16; j++)
        f->wid[j] = (uint8_t)sim_rng_next(sim_rand(s));
    f->worker = k;
    f->used_mask |= 1u << k;
    f->ask_pid = 0; /* (asked under the old id: the router finds no stream by it) */
    f->moves++;
    wd->migrations++;
    swe_rx_migrated(&f->rx, sim_now(s));
    fe_send_request(wd, f, resume);
}

/* act->ask, as egress/probe.c swe_stream_ask does it: a PROBE naming the
 * stream with a fresh id, which replaces its probe out (one per stream). */
static void
fe_ask(world *wd, fstream *f)
{
    swp_control m = STREAMWIRE__V1__CONTROL__INIT;
    uint8_t buf[256];
    size_t len;
    if (f->rx.term_state != SWE_TERM_NONE || f->rx.migrating)
        FAIL(wd, "I16: an ask for a stream that has its terminal or moves");
    f->ask_pid = (UINT64_C(1) << 63) | ++wd->probe_seq;
    m.version = SW_PROTOCOL_VERSION;
    m.kind = STREAMWIRE__V1__CONTROL_KIND__CONTROL_PROBE;
    m.router_id = (char *)"simfe";
    m.request_id.data = f->wid;
    m.request_id.len = 16;
    m.probe_id = f->ask_pid;
    if (swp_encode(&m, buf, sizeof(buf), &len) != SW_OK)
        abort();
    fe_out(wd, wd->wnode[f->worker], K_CTL, buf, len, -1);
    wd->messages++;
    wd->asks++;
}

/* A ProbeReply from node `from`: it counts only for the stream whose probe
 * out it answers, from that stream's worker (egress/probe.c
 * stream_probe_answer); then no probe is out. Known, it is the stream's
 * heartbeat; not known, no more asks until a sign of life. */
static void
fe_on_answer(world *wd, int from, const uint8_t *data, size_t len)
{
    swp_probe_reply *p = NULL;
    fstream *f = NULL;
    swe_rx_act a;
    if (swp_decode_probe_reply(data, len, 1 << 16, &p) != SW_OK)
        FAIL(wd, "a worker's probe answer did not decode");
    for (int i = 0; p->probe_id != 0 && f == NULL && i < wd->nstreams; i++)
        if (wd->st[i].ask_pid == p->probe_id)
            f = &wd->st[i];
    if (f != NULL && wd->wnode[f->worker] == from && !f->terminal) {
        f->ask_pid = 0;
        if (p->known) {
            int64_t silent = sim_now(wd->s) - f->rx.last_rx_ms;
            swe_rx_in in;
            memset(&in, 0, sizeof(in));
            in.kind = SWE_IN_HEARTBEAT;
            in.last_seq = p->last_seq;
            swe_rx_on_item(&f->rx, &in, sim_now(wd->s), &a);
            wd->answers++;
            g_asks_answered++;
            /* after the silence that asks: a beat was lost (I16) */
            if (silent >= (int64_t)f->rx.cfg.idle_hb_ms + f->rx.cfg.hb_ms)
                f->answered_at = sim_now(wd->s);
            fe_apply(wd, f, &a);
        } else {
            swe_rx_not_known(&f->rx);
        }
    }
    swp_free(p);
}

static void
fe_apply(world *wd, fstream *f, const swe_rx_act *a)
{
    if (a->resend)
        fe_send_ctl(wd, f, STREAMWIRE__V1__CONTROL_KIND__CONTROL_RESEND, 0, 0, a->resend_from,
                    a->resend_to);
    if (a->credit) {
        fe_send_ctl_to(wd, f->worker, f->wid, STREAMWIRE__V1__CONTROL_KIND__CONTROL_CREDIT,
                       a->credit_limit, a->credit_ack, 0, 0, a->credit_bytes);
    }
    if (a->ack_final)
        fe_send_ctl(wd, f, STREAMWIRE__V1__CONTROL_KIND__CONTROL_ACK_FINALS, 0, 0, 0, 0);
    if (a->kill)
        fe_send_ctl(wd, f, STREAMWIRE__V1__CONTROL_KIND__CONTROL_KILL, 0, 0, 0, 0);
    if (a->after_final)
        wd->after_final_seen++;
    fe_check_bounds(wd, f);
    if (a->ask)
        fe_ask(wd, f);
    if (a->migrate)
        fe_migrate(wd, f);
}

/* The consumer pops what is ready, checking I1 and I2. */
static void
fe_pop(sim *s, void *arg, uint64_t idx, uint64_t b)
{
    world *wd = arg;
    fstream *f = &wd->st[idx];
    sw_item it;
    swe_rx_act a;
    int got;
    (void)b;
    while ((got = swe_rx_pop(&f->rx, sim_now(s), &it, &a)) != 0) {
        if (f->terminal)
            FAIL(wd, "I1: an item after the terminal");
        /* I11: after a grant the consumer made, within the byte bound (or
         * at the first size); a repeated grant does not tune */
        if (a.credit && f->rx.window > f->rx.window0 && f->rx.cfg.window_bytes != 0 &&
            f->rx.window > f->rx.wbytes / f->rx.max_cost)
            FAIL(wd, "I11: window %u after a grant, byte bound %llu / %zu", f->rx.window,
                 (unsigned long long)f->rx.wbytes, f->rx.max_cost);
        if (got == 2) {
            f->terminal = 1;
            f->term = it.terminal;
            if (it.terminal.status == SW_STATUS_COMPLETED)
                wd->completed++;
            else if (it.terminal.status == SW_STATUS_CANCELLED)
                wd->cancelled_terms++;
            else if (it.terminal.status == SW_STATUS_ERROR)
                wd->errors_by[it.terminal.error & 0xff]++;
            break;
        }
        if (f->cancel_called)
            FAIL(wd, "I15: item %llu after the consumer's cancel", (unsigned long long)it.seq);
        {
            char want[PAYLOAD_MAX];
            payload_of(f->id, it.seq, want, sizeof(want));
            if (it.seq != f->last + 1)
                FAIL(wd, "I2: item %llu after %llu", (unsigned long long)it.seq,
                     (unsigned long long)f->last);
            if (it.len != strlen(want) || memcmp(it.data, want, it.len) != 0)
                FAIL(wd, "I2: item %llu has the wrong content", (unsigned long long)it.seq);
            f->last = it.seq;
        }
        fe_apply(wd, f, &a);
    }
    if (!f->terminal)
        sim_at(s, 1 + (int64_t)sim_rng_below(sim_rand(s), 10), fe_pop, wd, idx, 0);
}

static void
fe_tick(sim *s, void *arg, uint64_t idx, uint64_t b)
{
    world *wd = arg;
    fstream *f = &wd->st[idx];
    swe_rx_act a;
    (void)b;
    if (f->terminal)
        return;
    {
        /* as egress/stream.c swe_stream_tick: while the frontend's own
         * connection is down silence proves nothing; once it is back,
         * silence (and a gap's time) counts from then (I18) */
        int64_t quiet = wd->p->p_hold > 0 ? wd->quiet : sim_now(s);
        if (sim_now(s) < wd->down_until)
            quiet = INT64_MIN / 4;
        else if (wd->up_ms > 0)
            swe_rx_silence_from(&f->rx, wd->up_ms);
        swe_rx_tick(&f->rx, sim_now(s), quiet, &a);
    }
    fe_apply(wd, f, &a);
    sim_at(s, TICK_MS, fe_tick, wd, idx, 0);
}

static void
fe_cancel(sim *s, void *arg, uint64_t idx, uint64_t b)
{
    world *wd = arg;
    fstream *f = &wd->st[idx];
    (void)s;
    int set = swe_rx_cancel(&f->rx, (int)b);
    f->cancel_called = 1;
    if (set == 2)
        g_cancel_behind_final++;
    if (set == 1) {
        fe_send_ctl(wd, f,
                    b ? STREAMWIRE__V1__CONTROL_KIND__CONTROL_KILL
                      : STREAMWIRE__V1__CONTROL_KIND__CONTROL_CANCEL,
                    0, 0, 0, 0);
        f->cancel_sent = 1;
        wd->cancels++;
        /* sent again until the worker's final arrives, as the router does */
        fe_cancel_wait(wd, f, f->worker, f->wid, (int)b);
    }
}

/* Every tick: the cancels due to be sent again. */
static void
fe_cancels_tick(sim *s, void *arg, uint64_t a, uint64_t b)
{
    world *wd = arg;
    swe_cancel due[64];
    size_t n;
    (void)a;
    (void)b;
    while ((n = swe_cancels_due(&wd->fc, sim_now(s), due, 64)) > 0)
        for (size_t i = 0; i < n; i++) {
            fe_send_ctl_to(wd, atoi(due[i].subj), due[i].id,
                           due[i].kill ? STREAMWIRE__V1__CONTROL_KIND__CONTROL_KILL
                                       : STREAMWIRE__V1__CONTROL_KIND__CONTROL_CANCEL,
                           0, 0, 0, 0, 0);
            wd->cancel_resends++;
        }
    sim_at(s, TICK_MS, fe_cancels_tick, wd, 0, 0);
}

static void
fe_handle(sim *s, world *wd, int from, int kind, const uint8_t *data, size_t len)
{
    uint8_t id[16];
    swp_item *w = NULL;
    fstream *f;
    swe_rx_act a;
    if (kind == K_PRB) {
        fe_on_answer(wd, from, data, len);
        return;
    }
    if (kind != K_ITEM)
        return;
    if (swp_decode_item(data, len, 1 << 20, &w) != SW_OK) {
        /* garbage: the real mux ends the stream it names; here the subject
         * would name it: take the sender's streams' first open one */
        for (int i = 0; i < wd->nstreams; i++) {
            f = &wd->st[i];
            if (!f->terminal && wd->wnode[f->worker] == from && f->w[f->worker].hostile_garbage) {
                swe_rx_fail(&f->rx, SW_DECODE_ERROR, NULL, 1, sim_now(s), &a);
                fe_apply(wd, f, &a);
                break;
            }
        }
        return;
    }
    memcpy(id, w->request_id.data, 16);
    if (w->complete_final)
        (void)swe_cancels_seen(&wd->fc, id); /* a cancel's answer */
    f = find_stream(wd, id);
    if (f != NULL) {
        swe_rx_in ins[1 + SWP_MAX_BATCH];
        swe_rx_in in;
        size_t n = 1;
        memset(&in, 0, sizeof(in));
        in.seq = w->seq;
        if (w->body_case == STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_HEARTBEAT) {
            in.kind = SWE_IN_HEARTBEAT;
            in.last_seq = w->heartbeat->last_seq;
            in.stalled = w->heartbeat->stalled;
        } else if (w->complete_final) {
            in.kind = SWE_IN_FINAL;
            in.status = w->terminal->status == STREAMWIRE__V1__STATUS__STATUS_COMPLETED
                            ? SW_STATUS_COMPLETED
                            : SW_STATUS_CANCELLED;
            in.reason = in.status == SW_STATUS_COMPLETED ? "stop" : "cancelled";
            in.message = "";
            if (w->terminal->error != NULL && w->terminal->error->sw_code != 0) {
                in.status = SW_STATUS_ERROR; /* a draining worker's hand-back */
                in.err = (sw_err)w->terminal->error->sw_code;
                in.reason = sw_err_name(in.err);
            }
        } else {
            in.kind = SWE_IN_DATA;
            in.credit_window_max = w->credit_window_max;
            in.credit_bytes = w->credit_bytes;
            in.data = w->data.data;
            in.len = w->data.len;
        }
        /* A batch (the sim's workers batch data items only): every item as
         * the mux feeds them, with their runs (egress/mux.c). */
        ins[0] = in;
        for (size_t i = 0; i < w->n_batch && w->batch[i]->complete_final == 0; i++, n++) {
            ins[n] = in;
            ins[n].seq = w->batch[i]->seq;
            ins[n].data = w->batch[i]->data.data;
            ins[n].len = w->batch[i]->data.len;
        }
        swe_rx_runs(ins, n);
        for (size_t i = 0; i < n; i++) {
            if (ins[i].kind == SWE_IN_DATA && f->w[f->worker].final_seq != 0 &&
                ins[i].seq > f->w[f->worker].final_seq && !f->terminal)
                f->after_final_rx = 1;
            swe_rx_on_item(&f->rx, &ins[i], sim_now(s), &a);
            fe_apply(wd, f, &a);
        }
    }
    swp_free(w);
}

/* I17: handles what waits, in order, unless the delivery is held. */
static void
fe_drain(sim *s, void *arg, uint64_t a, uint64_t b)
{
    world *wd = arg;
    (void)a;
    (void)b;
    while (wd->fq_n > 0 && sim_now(s) >= wd->held_until) {
        struct fe_msg *m = &wd->fq[wd->fq_head];
        wd->fq_head = (wd->fq_head + 1) % wd->fq_cap;
        wd->fq_n--;
        fe_handle(s, wd, m->from, m->kind, m->data, m->len);
        free(m->data);
        m->data = NULL;
        wd->done++;
    }
}

static void
fe_recv(sim *s, void *node, int from, int kind, const uint8_t *data, size_t len)
{
    world *wd = ((node_box *)node)->wd;
    if (sim_now(s) < wd->down_until) {
        /* I18: the server cannot deliver to a client that is not connected */
        swp_item *w = NULL;
        wd->lost_down++;
        if (kind == K_ITEM && swp_decode_item(data, len, 1 << 20, &w) == SW_OK) {
            fstream *f = find_stream(wd, w->request_id.data);
            if (f != NULL && w->body_case != STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_HEARTBEAT)
                f->lost_down = 1;
        }
        swp_free(w);
        return;
    }
    if (wd->p->p_hold == 0) {
        fe_handle(s, wd, from, kind, data, len);
        return;
    }
    /* I17: taken in; handled in order, once nothing holds the delivery */
    msgq_push(&wd->fq, &wd->fq_head, &wd->fq_n, &wd->fq_cap, from, kind, -1, data, len);
    wd->taken++;
    fe_drain(s, wd, 0, 0);
}

/* I17: the frontend's delivery is held for `ms` (a consumer's callback
 * holding the mux's thread); its timer runs on. */
static void
ev_hold(sim *s, void *arg, uint64_t ms, uint64_t b)
{
    world *wd = arg;
    (void)b;
    if (sim_now(s) + (int64_t)ms > wd->held_until)
        wd->held_until = sim_now(s) + (int64_t)ms;
    g_holds++;
    sim_at(s, (int64_t)ms, fe_drain, wd, 0, 0);
}

/* I18: the frontend's connection is back (unless a later drop extended
 * the outage): what it sent meanwhile goes out, in order. */
static void
ev_up(sim *s, void *arg, uint64_t a, uint64_t b)
{
    world *wd = arg;
    (void)a;
    (void)b;
    if (sim_now(s) < wd->down_until)
        return;
    wd->up_ms = sim_now(s);
    for (size_t i = 0; i < wd->oq_n; i++) {
        struct fe_msg *m = &wd->oq[i];
        fe_out(wd, m->from, m->kind, m->data, m->len, m->delay);
        free(m->data);
    }
    wd->oq_n = 0;
}

/* I18: the frontend's connection drops for `ms`. */
static void
ev_down(sim *s, void *arg, uint64_t ms, uint64_t b)
{
    world *wd = arg;
    (void)b;
    if (sim_now(s) + (int64_t)ms > wd->down_until)
        wd->down_until = sim_now(s) + (int64_t)ms;
    g_downs++;
    sim_at(s, (int64_t)ms, ev_up, wd, 0, 0);
}

/* I17: the router's scan looks at its backlog (egress/timer.c): the quiet
 * time by which the streams' ticks judge silence. Notes the open healthy
 * streams while the frontend is behind by more than their silence limit. */
static void
fe_scan(sim *s, void *arg, uint64_t a, uint64_t b)
{
    world *wd = arg;
    (void)a;
    (void)b;
    wd->quiet = swe_backlog_look(&wd->bl, sim_now(s), wd->done, wd->taken);
    if (wd->quiet > sim_now(s))
        FAIL(wd, "I17: the quiet time %lld is ahead of now", (long long)wd->quiet);
    for (int i = 0; i < wd->nstreams; i++) {
        fstream *f = &wd->st[i];
        if (f->used && !f->terminal && f->rx.cfg.inactivity_ms > 0 &&
            sim_now(s) - wd->quiet > (int64_t)f->rx.cfg.inactivity_ms)
            f->behind = 1;
    }
    sim_at(s, TICK_MS, fe_scan, wd, 0, 0);
}

/* ---------------------------------------------------------------- run */

static void
ev_kill(sim *s, void *arg, uint64_t node, uint64_t b)
{
    world *wd = arg;
    (void)b;
    sim_kill(s, (int)node);
    /* Every stream on it now, including those opened after this kill was
     * planned (the planning marks only the streams it saw: a stream placed
     * on the node in between was judged healthy, and I8 failed on it). */
    for (int i = 0; i < wd->nstreams; i++)
        if (wd->wnode[wd->st[i].worker] == (int)node)
            wd->st[i].faulty = wd->st[i].worker_killed = 1;
}

static void
ev_freeze(sim *s, void *arg, uint64_t node, uint64_t ms)
{
    (void)arg;
    sim_freeze(s, (int)node, (int64_t)ms);
}

/* Worker k drains: it hands back every stream it serves, and any it gets
 * from now on. */
static void
ev_drain(sim *s, void *arg, uint64_t k, uint64_t b)
{
    world *wd = arg;
    (void)b;
    if (!sim_alive(s, wd->wnode[k]) || wd->draining[k])
        return;
    wd->draining[k] = 1;
    for (int i = 0; i < wd->nstreams; i++)
        if (wd->st[i].used_mask & (1u << k))
            w_hand_back(wd, &wd->st[i], (int)k);
}

static void
ev_open(sim *s, void *arg, uint64_t idx, uint64_t b)
{
    world *wd = arg;
    fstream *f = &wd->st[idx];
    swe_rx_cfg cfg;
    (void)b;
    memset(&cfg, 0, sizeof(cfg));
    cfg.window = wd->p->window;
    cfg.window_max = wd->p->window_max > cfg.window ? wd->p->window_max : cfg.window;
    /* grow: half the streams without a byte bound (the workers' cap binds) */
    cfg.window_bytes = idx & 1 || wd->p->window_max == 0 ? wd->p->window_bytes : 0;
    /* and half of those may grow their byte window fourfold */
    cfg.window_bytes_max = idx & 2 ? 4 * cfg.window_bytes : cfg.window_bytes;
    cfg.inactivity_ms = 4 * wd->p->hb_ms + 500;
    cfg.gap_ms = 500;
    cfg.linger_ms = 0;
    cfg.deadline_ms = -1;
    cfg.migrations = wd->p->migrations;
    /* the spacing egress/open.c asks for (swe_idle_heartbeat): 500 ms
     * short of the silence limit, or a heartbeat + 250 when that is more */
    cfg.hb_ms = (uint16_t)wd->p->hb_ms;
    {
        int64_t room = wd->p->hb_ms + 250 > 500 ? wd->p->hb_ms + 250 : 500;
        if ((int64_t)cfg.inactivity_ms - room > wd->p->hb_ms)
            cfg.idle_hb_ms = (uint16_t)(cfg.inactivity_ms - room);
    }
    /* A cancel (or a hostile peer's garbage) may have reached this stream's
     * zeroed rx before it opened: let go of what that allocated. */
    swe_rx_fini(&f->rx);
    swe_rx_init(&f->rx, &cfg, sim_now(s));
    f->cancel_called = 0; /* (such a cancel had nothing to cancel) */
    fe_send_request(wd, f, 0);
    sim_at(s, TICK_MS, fe_tick, wd, idx, 0);
    sim_at(s, 1, fe_pop, wd, idx, 0);
}

static int
run_seed(const profile *p, uint64_t seed, uint64_t budget, int verbose, uint64_t *msgs,
         uint64_t *moved, uint64_t *grown, uint64_t *byte_stalls, uint64_t *bytes_grown)
{
    world *wd = calloc(1, sizeof(*wd));
    node_box boxes[NWORKERS + 1];
    sim_rng *r;
    int64_t t = 0;
    if (wd == NULL)
        abort();
    wd->p = p;
    wd->seed = seed;
    wd->verbose = verbose;
    wd->s = sim_new(seed, &p->f);
    r = sim_rand(wd->s);
    for (int i = 0; i < NWORKERS; i++) {
        boxes[i].wd = wd;
        wd->wnode[i] = sim_node_add(wd->s, &boxes[i], worker_recv);
        boxes[i].index = wd->wnode[i];
    }
    boxes[NWORKERS].wd = wd;
    boxes[NWORKERS].index = NWORKERS;
    wd->fnode = sim_node_add(wd->s, &boxes[NWORKERS], fe_recv);
    sim_at(wd->s, TICK_MS, fe_cancels_tick, wd, 0, 0);
    if (p->p_hold > 0) {
        swe_backlog_init(&wd->bl, 0);
        sim_at(wd->s, TICK_MS, fe_scan, wd, 0, 0);
    }
    /* The workload: streams open over the first seconds, each on a worker. */
    while (wd->nstreams < MAX_STREAMS && wd->messages < budget) {
        int batch = 1 + (int)sim_rng_below(r, 32);
        for (int k = 0; k < batch && wd->nstreams < MAX_STREAMS; k++) {
            fstream *f = &wd->st[wd->nstreams];
            wstream *w;
            for (int j = 0; j < 16; j++)
                f->id[j] = (uint8_t)sim_rng_next(r);
            f->used = 1;
            memcpy(f->wid, f->id, 16);
            f->worker = (int)sim_rng_below(r, NWORKERS);
            f->used_mask = 1u << f->worker;
            f->n = (int)sim_rng_below(r, 120);
            w = &f->w[f->worker];
            if (sim_rng_chance(r, p->p_hostile)) {
                int which = (int)sim_rng_below(r, 3);
                w->hostile_credit = which == 0;
                w->hostile_after_final = which == 1;
                w->hostile_garbage = which == 2;
                f->faulty = 1;
            }
            if (sim_rng_chance(r, p->p_cancel)) {
                /* One draw per statement: the order in which C evaluates a
                 * call's arguments is unspecified (two draws in one call
                 * made the ASan build run other schedules than the normal
                 * one from the same seed). */
                int64_t at = t + (int64_t)sim_rng_below(r, 200);
                uint64_t kill = sim_rng_below(r, 2);
                sim_at(wd->s, at, fe_cancel, wd, (uint64_t)wd->nstreams, kill);
                f->faulty = 1;
            }
            sim_at(wd->s, t, ev_open, wd, (uint64_t)wd->nstreams, 0);
            wd->nstreams++;
        }
        if (sim_rng_chance(r, p->p_kill / 8)) {
            int node = (int)sim_rng_below(r, NWORKERS);
            sim_at(wd->s, t + (int64_t)sim_rng_below(r, 100), ev_kill, wd,
                   (uint64_t)wd->wnode[node], 0);
            for (int i = 0; i < wd->nstreams; i++)
                if (wd->st[i].worker == node)
                    wd->st[i].faulty = wd->st[i].worker_killed = 1;
        }
        if (sim_rng_chance(r, p->p_freeze / 8)) {
            int node = (int)sim_rng_below(r, NWORKERS);
            int64_t at = t + (int64_t)sim_rng_below(r, 100);
            uint64_t ms = 100 + sim_rng_below(r, 1500);
            sim_at(wd->s, at, ev_freeze, wd, (uint64_t)wd->wnode[node], ms);
            for (int i = 0; i < wd->nstreams; i++)
                if (wd->st[i].worker == node)
                    wd->st[i].faulty = 1;
        }
        if (sim_rng_chance(r, p->p_drain / 8)) {
            int k = (int)sim_rng_below(r, NWORKERS);
            sim_at(wd->s, t + (int64_t)sim_rng_below(r, 100), ev_drain, wd, (uint64_t)k, 0);
            for (int i = 0; i < wd->nstreams; i++)
                if (wd->st[i].worker == k)
                    wd->st[i].faulty = 1;
        }
        if (sim_rng_chance(r, p->p_hold / 8)) {
            /* not a fault of any stream: I3 must hold through it */
            int64_t at = t + (int64_t)sim_rng_below(r, 100);
            uint64_t ms = 1000 + sim_rng_below(r, 7000);
            sim_at(wd->s, at, ev_hold, wd, ms, 0);
        }
        if (sim_rng_chance(r, p->p_down / 8)) {
            /* not a fault of any stream either: I3 must hold through it */
            int64_t at = t + (int64_t)sim_rng_below(r, 100);
            uint64_t ms = 200 + sim_rng_below(r, 2800);
            sim_at(wd->s, at, ev_down, wd, ms, 0);
        }
        t += 20 + (int64_t)sim_rng_below(r, 80);
        sim_run(wd->s, t);
    }
    /* Let everything finish: no stream may stay open (I4). */
    sim_run(wd->s, t + 20000);
    for (int i = 0; i < wd->nstreams; i++) {
        fstream *f = &wd->st[i];
        if (!f->terminal) {
            const wstream *w = &f->w[f->worker];
            fprintf(stderr,
                    "  rx: expected %llu granted %llu credit_sent %llu consumed %llu window %u "
                    "bytes_on %d in %llu consumed %llu byte_sent %llu qlen %zu held %zu "
                    "migrating %d; worker %d: next %llu limit %llu bytes %llu/%llu stalled %d "
                    "produced %d/%d final %llu killed %d\n",
                    (unsigned long long)f->rx.expected, (unsigned long long)f->rx.granted,
                    (unsigned long long)f->rx.credit_sent, (unsigned long long)f->rx.consumed,
                    f->rx.window, f->rx.bytes_on, (unsigned long long)f->rx.in_bytes,
                    (unsigned long long)f->rx.consumed_bytes, (unsigned long long)f->rx.byte_sent,
                    f->rx.qlen, f->rx.held, f->rx.migrating, f->worker,
                    (unsigned long long)w->next_seq, (unsigned long long)w->credit_limit,
                    (unsigned long long)w->sent_bytes, (unsigned long long)w->byte_limit,
                    w->stalled, w->produced, w->n, (unsigned long long)w->final_seq, w->killed);
            FAIL(wd, "I4: stream %d never ended (%llu items delivered)", i,
                 (unsigned long long)f->last);
        }
        if (f->after_final_rx && f->term.status == SW_STATUS_COMPLETED)
            FAIL(wd, "I7: stream %d completed although an item past its final arrived", i);
        /* I8: every cancel reaches its handler or prevents it: unless its
         * worker was killed, the worker saw the CANCEL/KILL, or had already
         * finished the stream (its handler was not running any more). */
        if (f->cancel_sent && !f->worker_killed) {
            const wstream *w = &f->w[f->worker];
            /* (!used: the request never reached a live worker: no handler) */
            if (w->used && !w->cancelled && !w->killed && w->final_seq == 0)
                FAIL(wd, "I8: stream %d was cancelled, and its handler never heard of it", i);
        }
        /* I9: completed means every item, however often it moved. */
        if (f->term.status == SW_STATUS_COMPLETED && f->last != (uint64_t)f->n)
            FAIL(wd, "I9: stream %d completed with %llu of %d items (%u moves)", i,
                 (unsigned long long)f->last, f->n, f->moves);
        /* I10: the terminal counts the moves, within the limit. */
        if (f->term.migrations != f->moves || f->moves > p->migrations)
            FAIL(wd, "I10: stream %d: terminal says %u migrations, %u made, limit %u", i,
                 f->term.migrations, f->moves, p->migrations);
        if (f->moves > 0 && f->term.status == SW_STATUS_COMPLETED)
            wd->moved_completed++;
        if (f->answered_at != 0 && f->term.status == SW_STATUS_COMPLETED)
            g_kept_by_answers++;
        if (f->behind && !f->faulty && f->term.status == SW_STATUS_COMPLETED)
            g_kept_behind++;
        if (f->lost_down && !f->faulty && f->term.status == SW_STATUS_COMPLETED)
            g_repaired_after_down++;
        if (f->max_window > p->window)
            wd->grown++;
        if (f->max_wbytes > f->rx.cfg.window_bytes)
            wd->bgrown++;
        /* I3: healthy worker, lossless bus: complete with every item. */
        if (!f->faulty && p->f.drop == 0 &&
            (f->term.status != SW_STATUS_COMPLETED || f->last != (uint64_t)f->n))
            FAIL(wd, "I3: healthy stream %d ended %s/%s with %llu of %d items", i,
                 sw_status_name(f->term.status), f->term.reason, (unsigned long long)f->last, f->n);
    }
    if (verbose)
        printf("  seed 0x%llx %-9s cancels %llu (sent again %llu); migrations %llu, failed %llu, "
               "moved and completed %llu\n",
               (unsigned long long)seed, p->name, (unsigned long long)wd->cancels,
               (unsigned long long)wd->cancel_resends, (unsigned long long)wd->migrations,
               (unsigned long long)wd->mig_failed, (unsigned long long)wd->moved_completed);
    *moved = wd->moved_completed;
    *grown = wd->grown;
    *bytes_grown = wd->bgrown;
    *byte_stalls = wd->byte_stalls;
    if (verbose)
        printf("  seed 0x%llx %-9s streams %d messages %llu: completed %llu cancelled %llu "
               "gap %llu incomplete %llu after_final %llu flow %llu decode %llu\n",
               (unsigned long long)seed, p->name, wd->nstreams, (unsigned long long)wd->messages,
               (unsigned long long)wd->completed, (unsigned long long)wd->cancelled_terms,
               (unsigned long long)wd->errors_by[SW_SEQUENCE_GAP],
               (unsigned long long)wd->errors_by[SW_STREAM_INCOMPLETE],
               (unsigned long long)wd->errors_by[SW_ITEM_AFTER_FINAL],
               (unsigned long long)wd->errors_by[SW_FLOW_VIOLATION & 0xff],
               (unsigned long long)wd->errors_by[SW_DECODE_ERROR]);
    *msgs = wd->messages;
    swe_cancels_clear(&wd->fc, NULL);
    for (size_t i = 0; i < wd->fq_n; i++)
        free(wd->fq[(wd->fq_head + i) % wd->fq_cap].data);
    free(wd->fq);
    for (size_t i = 0; i < wd->oq_n; i++)
        free(wd->oq[i].data);
    free(wd->oq);
    for (int i = 0; i < wd->nstreams; i++) {
        swe_rx_fini(&wd->st[i].rx);
        for (int k = 0; k < NWORKERS; k++) {
            wstream *w = &wd->st[i].w[k];
            for (size_t q = 0; q < w->ring_cap; q++)
                free(w->ring[q]);
            free(w->ring);
            free(w->ring_len);
            swn_ring_free(&w->rg);
            free(w->rg_kept);
        }
    }
    sim_free(wd->s);
    free(wd);
    return 0;
}

int
main(int argc, char **argv)
{
    uint64_t seed = 1, nseeds = 20, budget = 20000, total = 0;
    const char *pname = "all";
    int verbose = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--seeds") && i + 1 < argc)
            nseeds = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--messages") && i + 1 < argc)
            budget = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--profile") && i + 1 < argc)
            pname = argv[++i];
        else if (!strcmp(argv[i], "--verbose"))
            verbose = 1;
        else {
            fprintf(
                stderr,
                "usage: %s [--seed S] [--seeds N] [--messages M per seed] "
                "[--profile clean|lossy|chaos|hostile|bigwindow|migrate|grow|bytes|idle|idlelossy|"
                "backlog|reconnect|frontend|fechaos|all] "
                "[--verbose]\n",
                argv[0]);
            return 2;
        }
    }
    for (size_t k = 0; k < sizeof(profiles) / sizeof(profiles[0]); k++) {
        uint64_t pm = 0, moved = 0, grown = 0, bstalls = 0, bgrown = 0;
        if (strcmp(pname, "all") != 0 && strcmp(pname, profiles[k].name) != 0)
            continue;
        for (uint64_t n = 0; n < nseeds; n++) {
            uint64_t m = 0, mv = 0, gr = 0, bs = 0, bg = 0;
            run_seed(&profiles[k], seed + n, budget, verbose, &m, &mv, &gr, &bs, &bg);
            bgrown += bg;
            pm += m;
            bstalls += bs;
            moved += mv;
            grown += gr;
        }
        if (profiles[k].window_max > profiles[k].window && grown == 0) {
            fprintf(stderr, "sim_streams: profile %s: no window grew: tuning was not exercised\n",
                    profiles[k].name);
            return 1;
        }
        if (profiles[k].window_max > profiles[k].window && profiles[k].window_bytes != 0 &&
            bgrown == 0) {
            fprintf(stderr,
                    "sim_streams: profile %s: no byte window grew: its tuning was not exercised\n",
                    profiles[k].name);
            return 1;
        }
        if (profiles[k].window_max == 0 && profiles[k].window_bytes != 0 && bstalls == 0) {
            fprintf(stderr,
                    "sim_streams: profile %s: no worker waited for byte credit: it was not "
                    "exercised\n",
                    profiles[k].name);
            return 1;
        }
        if (profiles[k].migrations > 0 && moved == 0) {
            fprintf(stderr,
                    "sim_streams: profile %s: no stream moved and completed: the "
                    "migration paths were not exercised\n",
                    profiles[k].name);
            return 1;
        }
        printf("sim_streams: profile %-9s seeds 0x%llx..+%llu: %llu messages, every invariant "
               "held\n",
               profiles[k].name, (unsigned long long)seed, (unsigned long long)nseeds,
               (unsigned long long)pm);
        total += pm;
    }
    if (total > 0 && g_block_nodes == 0) {
        fprintf(stderr, "sim_streams: no queue node shared a block: I13 was not exercised\n");
        return 1;
    }
    if (total > 0 && g_ring_resent == 0) {
        fprintf(stderr, "sim_streams: no RESEND was answered from a resend ring: I14 was not "
                        "exercised\n");
        return 1;
    }
    if ((strcmp(pname, "all") == 0 || strcmp(pname, "idle") == 0) &&
        (g_asks_answered == 0 || g_kept_by_answers == 0)) {
        fprintf(stderr,
                "sim_streams: %llu asks answered, %llu streams completed on answers after "
                "a lost beat: I16 was not exercised\n",
                (unsigned long long)g_asks_answered, (unsigned long long)g_kept_by_answers);
        return 1;
    }
    if ((strcmp(pname, "all") == 0 || strcmp(pname, "backlog") == 0) &&
        (g_holds == 0 || g_kept_behind == 0)) {
        fprintf(stderr,
                "sim_streams: %llu holds of the frontend's delivery, %llu healthy streams "
                "completed behind them past their silence limit: I17 was not exercised\n",
                (unsigned long long)g_holds, (unsigned long long)g_kept_behind);
        return 1;
    }
    if ((strcmp(pname, "all") == 0 || strcmp(pname, "reconnect") == 0) &&
        (g_downs == 0 || g_repaired_after_down == 0)) {
        fprintf(stderr,
                "sim_streams: %llu drops of the frontend's connection, %llu healthy streams "
                "completed with items lost meanwhile: I18 was not exercised\n",
                (unsigned long long)g_downs, (unsigned long long)g_repaired_after_down);
        return 1;
    }
    if (total > 0 && g_cancel_behind_final == 0) {
        fprintf(stderr, "sim_streams: no cancel came behind a queued final: I15 was not "
                        "exercised\n");
        return 1;
    }
    printf("sim_streams: %llu simulated messages in all (queue nodes seen in blocks: %llu, items "
           "resent from rings: %llu, cancels behind a queued final: %llu, asks answered: %llu, "
           "streams completed on answers after a lost beat: %llu, holds of the frontend: %llu, "
           "streams completed behind one past their silence limit: %llu, drops of the frontend's "
           "connection: %llu, streams completed with items lost in one: %llu): ok\n",
           (unsigned long long)total, (unsigned long long)g_block_nodes,
           (unsigned long long)g_ring_resent, (unsigned long long)g_cancel_behind_final,
           (unsigned long long)g_asks_answered, (unsigned long long)g_kept_by_answers,
           (unsigned long long)g_holds, (unsigned long long)g_kept_behind,
           (unsigned long long)g_downs, (unsigned long long)g_repaired_after_down);
    return total > 0 ? 0 : 1;
}
