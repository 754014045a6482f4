/* egress/rx.h -- a stream's receive side as a pure state machine.
 *
 * swe_rx is fed decoded items (data, the worker's final, heartbeats) with
 * the time, ticked by a timer with the time, and popped by the consumer; it
 * answers with actions for its caller to carry out (swe_rx_act): ask a
 * resend of a range, grant credit, acknowledge the final, tell the worker
 * to stop. It decides the stream's one terminal and holds the in-order
 * queue of data items for the consumer.
 *
 * It takes no locks, reads no clock, does no I/O, logs nothing and uses no
 * atomics: egress/stream.c wraps it with the stream's mutex and publishes
 * what it asks for; tests/unit/test_rx.c and the simulator (tests/sim/)
 * drive it directly with chosen times. It allocates only the items it
 * queues or holds: at most hold_cap held, and no more queued than the
 * credit granted allows.
 *
 * The rules, in one place:
 *   - items are delivered in sequence order, each once (duplicates are
 *     counted and dropped; out-of-order items wait in a reorder window of
 *     hold_cap slots, and a gap asks for a resend of the missing range);
 *   - credit is granted as the consumer takes items; a grant can be lost
 *     (NATS is at most once), so a heartbeat with nothing missing that
 *     says the worker is stalled (it waits for credit) while the latest
 *     grant allows it more, or that shows it stopped exactly at an earlier
 *     item limit (a worker that does not say `stalled`), repeats the grant,
 *     at most once per SWE_BEAT_ASK_MS (as a heartbeat's resend);
 *   - the window grows: when the worker accepted a larger one (it answers
 *     with credit_window_max in seq 1's header), a grant that comes within
 *     SW_WINDOW_GROW_MS of the previous one, with at most a quarter of the
 *     window queued, doubles it, up to cfg.window_max, the worker's answer,
 *     and the byte window (wbytes) of items of the largest cost seen
 *     (length + SW_ITEM_COST); a grant shrinks it to that byte bound (never
 *     below the first window) when larger items came;
 *   - byte credit: when the worker answers credit_bytes (it keeps to byte
 *     limits), every grant also says a byte limit, consumed bytes + the
 *     byte window, and a grant is due when half of either window was
 *     consumed; the window grows only then (cfg.window_bytes != 0). The
 *     byte window starts at cfg.window_bytes; at a grant where the
 *     consumer keeps up (as for the window, and with at most a quarter of
 *     the byte window queued), the byte window is what caps the window
 *     (fewer items at the largest cost than the window's most) and the
 *     window has come within a factor of 2 of it, it doubles, up to
 *     cfg.window_bytes_max (large items: the bandwidth-delay product); it
 *     never shrinks for one worker and starts over for the next;
 *   - a data item beyond the credit granted so far ends the stream with
 *     flow_violation (the worker ignores flow control: nothing of it is
 *     queued), and so does one that takes the data bytes received past the
 *     highest byte limit granted plus the largest item seen (the worker
 *     may start an item below the limit and finish it past it); so what is
 *     queued and held never exceeds the byte window + one item of data;
 *     finals and heartbeats need no credit;
 *   - the worker's final decides the terminal once every item before it has
 *     arrived; an item (or a held item) past the final ends the stream with
 *     item_after_final instead, even after the final if the terminal has not
 *     been delivered yet; two different finals are item_after_final too,
 *     at two seqs or at one (a final at the recorded final's seq that says
 *     something else: status, error or texts; the same final again is a
 *     duplicate, and never replaces what the first said), and so is a data
 *     item at the final's seq, before the final or after it;
 *   - a gap not repaired within gap_ms ends it with sequence_gap, silence
 *     (no new item or heartbeat: a duplicate, which a replay on the bus
 *     can be, is no sign of life) for inactivity_ms with stream_incomplete, the
 *     deadline with deadline_exceeded; silence is judged up to `quiet`, the
 *     time up to which the caller has processed what it received;
 *   - a stream that asked for idle heartbeats (cfg.idle_hb_ms above
 *     cfg.hb_ms: while nothing is new the worker beats it only that often)
 *     and has been silent (as above) for idle_hb_ms + hb_ms is asked after
 *     (act->ask: the caller sends a stream PROBE and feeds a fresh answer
 *     that knows the stream as a heartbeat, a sign of life only); again every
 *     hb_ms while the silence lasts, until its silence limit ends it. So one lost
 *     idle beat costs nothing, although the next comes idle_hb_ms later.
 *     Silence ends such a stream only once it was asked, and the first ask
 *     has had the time to be answered that it has on time (inactivity_ms -
 *     idle_hb_ms - hb_ms): a caller behind on what it received asks late
 *     (quiet lagged, then caught up), and the stream's limit moves by as
 *     much;
 *   - the first terminal decided wins (except item_after_final over an
 *     undelivered final); a wire terminal is held back linger_ms to catch a
 *     late item after it; a cancel drops queued data;
 *   - migration (cfg.migrations > 0): instance_lost and stream_incomplete
 *     decided here or by the caller, and a worker's final instance_lost
 *     (it drains) once every item before it arrived, do not end the
 *     stream: the state machine enters `migrating` (act->migrate), drops
 *     what it holds past the last in-order item, ignores items and judges
 *     only the deadline until the caller calls swe_rx_migrated (the new
 *     request is out) or ends it (swe_rx_fail). The new worker numbers
 *     from 1 again; its items continue the consumer's sequence after the
 *     last one received (seq_base). Credit restarts at the window for the
 *     new worker; items still queued from the old one do not grant it, so
 *     for one migration at most the old worker's (grown) window plus the
 *     first window is queued. */
#ifndef SW_EGRESS_RX_H
#define SW_EGRESS_RX_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <streamwire/streamwire.h>

/* The texts a terminal carries: a worker's finish reason whole (at most
 * 256 bytes, sw_responder_finish's limit), the first SWE_WMSG_MAX - 1 bytes
 * of a worker's message, and a message the router makes up (library text)
 * in SWE_MSG_MAX. A text cut short is cut at a UTF-8 character boundary. */
#define SWE_REASON_MAX 257
#define SWE_WMSG_MAX 1025
#define SWE_MSG_MAX 256

/* The queue nodes of a run of a message's items, allocated together: one
 * malloc for up to SWE_QBLOCK_MAX bytes of nodes instead of one an item (a
 * blocking consumer frees on another thread than the one that allocated,
 * glibc's slow path; issue 17). The state machine allocates one when an
 * in-order item comes with a run (swe_rx_in.run_bytes: it and the items
 * after it in its message that continue its sequence), with nothing held,
 * and no room in the block of the queue's last node; it is sized to the
 * run exactly, so the run's items fill it. Each node carved from it holds
 * a reference; it goes with the last. Nodes of a block are consecutive in
 * the queue, so a stream pins at most the consumed part of one block (the
 * one being consumed) and the unused room of one (the one being filled)
 * beyond its queued nodes: 2 x SWE_QBLOCK_MAX; a run cut short (the stream
 * ended or moved) may leave one more, once. Held items (past a gap) are
 * malloc'd alone. Under the owner's lock like the rest (no atomics). */
#define SWE_QBLOCK_MAX 16384
typedef struct swe_qblock {
    size_t refs, used, cap;
    _Alignas(16) uint8_t mem[];
} swe_qblock;

/* A queued or held item. */
typedef struct swe_q {
    struct swe_q *next;
    swe_qblock *blk; /* the block it was carved from, or NULL: malloc'd alone */
    uint64_t seq;
    int final; /* a held final marker (no data) */
    int droppable;
    unsigned gen;      /* the worker (0, then 1 after a migration, ...) */
    const char *event; /* "" or the item's event name, stored after data */
    size_t len;
    uint8_t data[];
} swe_q;

enum { SWE_TERM_NONE = 0, SWE_TERM_QUEUED = 1, SWE_TERM_DELIVERED = 2 };
/* term_ready_ms once the timer woke the consumer for the queued terminal
 * (ready, and nothing more for the timer to do; a time, not a flag: the
 * stream has no room for one, egress_int.h). */
#define SWE_TERM_WOKEN INT64_MIN

/* The texts of a worker's final and of the terminal: allocated when the
 * first of them is needed, so that an open stream does not carry 1.5 KiB
 * it uses once, at its end. A terminal from the worker's final points at
 * w_reason and w_msg; term_msg holds a message the router made up (its
 * reasons are static). */
typedef struct swe_rx_text {
    char w_reason[SWE_REASON_MAX];
    char w_msg[SWE_WMSG_MAX];
    char term_msg[SWE_MSG_MAX];
} swe_rx_text;

/* (56 bytes: it is part of sw_stream, whose size is budgeted, egress_int.h) */
typedef struct swe_rx_cfg {
    uint32_t window;         /* credit window asked of the worker (> 0) */
    uint32_t window_max;     /* the window may grow to this (>= window; = window: fixed) */
    size_t window_bytes;     /* byte credit asked of the worker (Request.credit_bytes), and the
                                window grows to no more bytes than this (0: neither) */
    size_t window_bytes_max; /* with a window that may grow, the byte window may grow to
                                this (<= window_bytes: it stays window_bytes) */
    int64_t deadline_ms;     /* absolute time, or -1 = none */
    uint32_t inactivity_ms;  /* silence that ends the stream */
    uint32_t gap_ms;         /* how long a gap may stay open */
    uint32_t linger_ms;      /* hold a wire terminal this long */
    unsigned migrations;     /* migrations allowed (0 = none) */
    uint16_t hb_ms;          /* the request's heartbeat_ms (0: none) */
    uint16_t idle_hb_ms;     /* the request's idle_heartbeat_ms: above hb_ms, a silent stream
                                is asked after (act->ask, below); 0: never */
    uint8_t keep_history;    /* keep the data items received (a migrate callback reads them) */
} swe_rx_cfg;

/* What the caller must do after a call. Zeroed by each call that fills it. */
typedef struct swe_rx_act {
    int resend; /* send RESEND from..to */
    uint64_t resend_from, resend_to;
    int credit; /* send CREDIT limit, ack, byte limit (0: none) */
    uint64_t credit_limit, credit_ack, credit_bytes;
    int ack_final;   /* acknowledge the worker's final (ACK_FINALS) */
    int ended;       /* this call decided a terminal that ends the stream at once (not the
                        worker's final, which stays until delivered): remove the stream from
                        its router's table, wake the consumer */
    int kill;        /* ... and tell the worker to stop (KILL) */
    int wake;        /* something new for the consumer */
    int after_final; /* an item came after a delivered terminal (a counter) */
    int migrate;     /* the stream must move to another instance (rx.migrating) */
    int ask;         /* ask the worker whether it still has the stream (a stream PROBE; its
                        answer is fed as a heartbeat, a sign of life only): it asked for idle
                        heartbeats and was silent idle_hb_ms + hb_ms */
    unsigned gen;    /* the worker (rx.gen) it was decided for: its CREDIT, RESEND and KILL
                        go to that worker only, never to the one a migration put in its
                        place meanwhile (their seqs and credit start anew) */
} swe_rx_act;

/* 1 if act asks for nothing but (maybe) a wake-up, so that a caller may
 * feed further items before carrying it out. A new field of swe_rx_act that
 * asks for something belongs here too. */
static inline int
swe_rx_act_quiet(const swe_rx_act *a)
{
    return !(a->resend || a->credit || a->ack_final || a->ended || a->kill || a->after_final ||
             a->migrate || a->ask);
}

/* A decoded item. */
enum { SWE_IN_DATA = 1, SWE_IN_FINAL = 2, SWE_IN_HEARTBEAT = 3 };
typedef struct swe_rx_in {
    int kind;
    uint64_t seq;        /* data and final; 0 for a heartbeat */
    const uint8_t *data; /* data: borrowed for the call */
    size_t len;
    int droppable;
    const char *event;          /* data: NULL, "" or a valid name (<= SW_MAX_EVENT) */
    uint32_t credit_window;     /* the worker's window, 0 = not sent */
    uint32_t credit_window_max; /* the largest window the worker accepts, 0 = not sent */
    uint64_t credit_bytes;      /* the worker keeps to byte credit, 0 = not sent */
    uint64_t last_seq;          /* heartbeat: the last seq published */
    int stalled;                /* heartbeat: the worker waits for credit */
    /* final: the terminal it carries */
    sw_status status;
    sw_err err;
    const char *reason; /* finish reason, app code or sw reason */
    const char *message;
    size_t run_bytes; /* data, final: the node bytes (swe_q_bytes) of this item and the items
                         after it in its message that continue its sequence (seq + 1, ...) and
                         fit SWE_QBLOCK_MAX with it; 0: none (a node of its own). The feeder
                         sets it with swe_rx_runs; the items must then be fed in order. */
} swe_rx_in;

/* A heartbeat saying last_seq (and whether the worker waits for credit),
 * as the caller feeds it. */
static inline void
swe_rx_beat_in(swe_rx_in *in, uint64_t last_seq, int stalled)
{
    memset(in, 0, sizeof(*in));
    in->kind = SWE_IN_HEARTBEAT;
    in->last_seq = last_seq;
    in->stalled = stalled;
}

/* The bytes of a node for len data bytes and an event name of elen (a
 * final: 0, 0), rounded to 16. */
size_t swe_q_bytes(size_t len, size_t elen);

/* Sets run_bytes for the n items of one message, in[0..n) in the
 * message's order (a caller that feeds a message in parts calls it for
 * each part). Pure. */
void swe_rx_runs(swe_rx_in *in, size_t n);

/* The counters of sw_stream_stats the state machine keeps (the rest,
 * pending and the windows, are read off its state when asked): an idle
 * stream carries 56 bytes of them, not the public struct's 80. */
typedef struct swe_rx_stats {
    uint64_t items, duplicates, reordered, resend_requests, heartbeats, peak_pending, migrations;
} swe_rx_stats;

/* The migration history: n copies of data items (v[0..n); `bytes`: their
 * nodes and slots, held to SW_MIGRATION_HISTORY_MAX), room for cap. */
typedef struct swe_rx_hist {
    size_t n, cap, bytes;
    swe_q *v[];
} swe_rx_hist;

typedef struct swe_rx {
    swe_rx_cfg cfg;
    uint32_t window;       /* may shrink to the worker's, and grows (tuning) */
    uint32_t window0;      /* the first window (the worker may have lowered it): the floor */
    uint32_t wmax;         /* the most the window may grow to: 0 until the worker answers */
    union {                /* (sw_stream has no room for another field: egress_int.h's budget) */
        sw_err mig_why;    /* migrating: SW_INSTANCE_LOST, SW_STREAM_INCOMPLETE or
                              SW_NO_RESPONDERS */
        uint32_t ask_late; /* not migrating, ask_wait set: how late (ms of silence past
                              idle_hb_ms + hb_ms) the first ask since the last sign of life
                              was made */
    };
    uint32_t ask_wait; /* the silence (ms since last_rx_ms) at which the next ask is due; 0:
                          none asked since the last sign of life, the first is due at
                          cfg.idle_hb_ms + cfg.hb_ms */
    uint32_t ask_tag;  /* the caller's, not the state machine's: its newest stream probe for
                          this stream (0: none; egress/sprobe.h, under r->mu) */
    size_t max_cost;   /* the largest item seen, + SW_ITEM_COST */
    int64_t last_grant_ms;
    /* reassembly */
    uint64_t expected; /* next seq to hand to the queue */
    swe_q **hold;      /* out-of-order items, seq % hold_cap (allocated on the first) */
    size_t hold_cap;
    size_t held;
    uint64_t hold_top;  /* the highest seq held since the hold was last empty: it is still
                           held (held items leave only as expected passes them), so a final
                           below it has an item past it */
    uint64_t final_seq; /* the received final's seq, 0 = none yet */
    sw_status w_status;
    sw_err w_err;
    swe_rx_text *txt; /* the final's and the terminal's texts (NULL until needed; without
                         memory for them a terminal has the error's own name and text) */
    /* credit */
    uint64_t consumed;
    uint64_t credit_sent; /* the credit limit the frontend works towards */
    uint64_t granted;     /* the highest limit ever granted: the worker may send up to it */
    uint64_t grants[4];   /* the last limits granted (the worker stops at one of them) */
    /* Small state, a byte each, together (an idle stream's bytes count:
     * see sw_stream's budget in egress_int.h). */
    unsigned char ngrants;        /* grants[0..ngrants) are set (<= 4) */
    unsigned char gnext;          /* where the next grant goes (0..3) */
    unsigned char bytes_on;       /* byte credit: the worker answered (below) */
    unsigned char term_state;     /* SWE_TERM_* */
    unsigned char term_from_wire; /* the queued terminal is the worker's final */
    unsigned char answered;       /* the current worker sent something (an item or a heartbeat) */
    unsigned char migrating;      /* between act->migrate and swe_rx_migrated or the terminal */
    unsigned char mig_from_final; /* the worker handed the stream back with its final (no stop
                                     needed) */
    /* byte credit, once the worker answered (bytes_on): the data bytes
     * received (distinct seqs) and consumed from the current worker, the
     * byte limit granted (consumed + window_bytes; it only grows) */
    uint64_t in_bytes;
    uint64_t consumed_bytes;
    uint64_t byte_sent;
    uint64_t wbytes; /* the byte window: cfg.window_bytes, grown (tuning) up to
                        cfg.window_bytes_max; never shrinks for one worker */
    /* consumer queue and terminal */
    swe_q *qh, *qt;
    size_t qlen;
    swe_q *cur; /* the item last popped (its bytes stay valid until the next pop) */
    /* One time for two states (sw_stream has no room for another field:
     * egress_int.h's budget): */
    union {
        int64_t term_ready_ms; /* term_state != SWE_TERM_NONE: when the terminal may be
                                  taken (or SWE_TERM_WOKEN) */
        int64_t regrant_ms;    /* term_state == SWE_TERM_NONE: when a heartbeat last repeated
                                  a grant (SWE_BEAT_ASK_MS; INT64_MIN: never) */
    };
    sw_terminal term;
    uint64_t term_seq;
    /* timers */
    int64_t last_rx_ms; /* the last heartbeat or item with a new seq (never a duplicate) */
    int64_t gap_since_ms;
    int64_t last_resend_ms;
    /* migration */
    unsigned gen;       /* workers before the current one */
    unsigned mig_left;  /* migrations still allowed */
    uint64_t seq_base;  /* consumer seq = seq_base + the current worker's seq */
    uint64_t gen_items; /* data items accepted from the current worker */
    swe_rx_hist *hist;  /* cfg.keep_history: copies of the data items received, in order
                           (NULL until the first: a stream that may not migrate, or has
                           received nothing yet, carries a pointer, not the counts) */
    swe_rx_stats st;
} swe_rx;

/* What a heartbeat asks of the worker (a RESEND of what it shows missing,
 * a grant it shows lost, repeated) is asked at most once per this many ms
 * per stream: one HeartbeatBatch may name a stream 4,096 times. */
#define SWE_BEAT_ASK_MS 20

/* Most seqs one RESEND may span (what the worker's decoder accepts). */
#define SWE_RESEND_SPAN_MAX ((uint64_t)(1u << 20) - 1)

/* How many data items the migration history holds (0 without one). */
static inline size_t
swe_rx_nhist(const swe_rx *rx)
{
    return rx->hist != NULL ? rx->hist->n : 0;
}

void swe_rx_init(swe_rx *rx, const swe_rx_cfg *cfg, int64_t now);
/* Frees everything queued, held and popped. */
void swe_rx_fini(swe_rx *rx);

void swe_rx_on_item(swe_rx *rx, const swe_rx_in *in, int64_t now, swe_rx_act *act);

/* Ends the stream with a synthesized error (err's name is the reason; msg
 * may be NULL); fills act. Returns 1 if this decided the terminal. kill: the worker
 * should be told to stop. */
int swe_rx_fail(swe_rx *rx, sw_err err, const char *msg, int kill, int64_t now, swe_rx_act *act);

/* "No responders" came back for the current request (the caller has
 * already tried its one re-route of a first request). After the current
 * worker has answered it cannot be the server's, and while the stream
 * migrates it is about the request being left: it is ignored, and -1
 * returned. Else, with may_move (unsealed: the status is not
 * authenticated), a migrated request (gen > 0) migrates again while
 * migrations are left, mig_why SW_NO_RESPONDERS, nothing to cancel (the
 * instance the migration picked went away before the publish); otherwise
 * the stream ends with no_responders. Returns 1 if this decided the
 * terminal, 0 if not. */
int swe_rx_no_responders(swe_rx *rx, int may_move, const char *msg, int64_t now, swe_rx_act *act);

/* A message on the stream's subject that the sealing connection refused
 * because it was not sealed at all. Once the current worker has answered
 * (something of it opened: its sealing works), it is not that worker's: a
 * sealed worker answers a request that does not open with a plain
 * auth_failed final on the reply subject the request named, whoever sent
 * it, so anyone who may publish a request could end any stream with one.
 * It is ignored, and -1 returned (the caller counts it). Before that (and
 * after a migration, before the new worker's first item) it is the sign
 * of a worker whose sealing differs: the stream ends with auth_failed
 * (kill), 1 if this decided the terminal, 0 if not. */
int swe_rx_unsealed(swe_rx *rx, const char *msg, int64_t now, swe_rx_act *act);

/* The consumer cancels (kill: and asks the worker to drop everything).
 * Queued data is dropped. Returns 1 if this decided the terminal, 2 if it
 * replaced one already queued behind data (the data is dropped, the
 * terminal is CANCELLED; the worker is not to be told), 0 if the stream
 * already had its terminal (delivered, or queued with nothing before it:
 * it comes next). */
int swe_rx_cancel(swe_rx *rx, int kill);

/* The new request is out (the caller re-keyed the stream): reassembly,
 * credit and timers restart for the new worker. */
void swe_rx_migrated(swe_rx *rx, int64_t now);

/* The migration did not happen (no instance, the callback declined): the
 * stream ends with err. Returns 1 if this decided the terminal. */
int swe_rx_migration_failed(swe_rx *rx, sw_err err, const char *msg, int64_t now, swe_rx_act *act);

/* The timer at `now`; quiet as above. */
void swe_rx_tick(swe_rx *rx, int64_t now, int64_t quiet, swe_rx_act *act);

/* When the timer next has anything to do (INT64_MAX: never). */
int64_t swe_rx_next_due(const swe_rx *rx);

/* The worker answered an ask (act->ask) that it does not know the stream
 * (it lost or never had it): no more asks until a sign of life; the
 * silence decides, as without the asks. */
void swe_rx_not_known(swe_rx *rx);

/* Silence, and a gap's time, are counted from `since` (not before): the
 * caller's own connection came back then, and nothing could arrive while
 * it was down. */
void swe_rx_silence_from(swe_rx *rx, int64_t since);

/* The consumer takes the next item into *out: 1 data, 2 the terminal (once;
 * from then on the stream is done), 0 nothing ready. A data item's bytes
 * stay valid until the next pop or fini. Consuming data may grant credit
 * (act->credit). */
int swe_rx_pop(swe_rx *rx, int64_t now, sw_item *out, swe_rx_act *act);

/* 1 once the terminal was popped. */
static inline int
swe_rx_done(const swe_rx *rx)
{
    return rx->term_state == SWE_TERM_DELIVERED;
}

#endif
