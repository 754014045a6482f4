/* ingress/ingress_int.h -- what the C files of the worker side (ingress/)
 * share: the ingress and responder structures, the build limits, and the
 * cross-file internal functions (prefix swn_). Not installed; not for the
 * CLI or the tests (they use ingress/chaos.h and ingress/ring.h).
 *
 * Threads (each file's header says which of them run its code):
 *   - nats.c delivers requests (intake.c), controls (control.c) and probe
 *     answers (liveness.c) on its own threads; those callbacks never run
 *     user code except the cancel callback, called with no lock held, and
 *     the handler with `handler_inline` (the request's thread, no lock);
 *   - `handler_threads` pool threads run the user's handler (intake.c),
 *     none with `handler_inline`;
 *   - one timer thread: heartbeats, deadlines, retiring finished streams
 *     whose final was never acknowledged, publishing items a drain left
 *     for lack of memory or an inline handler held too long (heartbeat.c);
 *   - one liveness thread probing the frontends that have streams here
 *     (liveness.c);
 *   - one sender thread publishing the items of busy streams in coalesced
 *     messages (sender.c).
 *
 * Locks and their order (a lock may be taken while holding one to its
 * left, never the other way round):
 *     r->mu  ->  ing->smu
 *     r->mu  ->  ing->mu
 *   r->mu guards one responder (its ring, counters, flags). Publishing
 *   happens under r->mu (our lock; it keeps one stream's items in order on
 *   the wire), except the drain, which drops it around the publish.
 *   ing->mu guards the stream table, ing->all, the work queue, counters and
 *   the stop/drain flags; it is innermost: r->mu is never taken with it
 *   held (sweeps take references under it, atomically).
 *   ing->smu guards the sender queue; ing->smu and ing->mu are never held
 *   together.
 *   ing->live_mu guards the frontend table and the streams' live_state;
 *   nothing else is taken with it held; it is taken under r->mu (a stream
 *   unregistered as it sends its final), never under ing->mu.
 *   ing->req_mu guards the req_sub pointer for sw_ingress_stats_get (which
 *   reads nats.c's queue for it); the owner takes it only to set it NULL
 *   before closing; nothing else is taken with it held.
 * The log callback and every user callback are called with none of these
 * held.
 *
 * Lifetimes: the ingress and each responder are reference counted. A
 * responder holds a reference on its ingress, so a retained responder stays a
 * valid object after sw_ingress_destroy (its calls then return SW_ECLOSED). */
#ifndef SW_INGRESS_INT_H
#define SW_INGRESS_INT_H

#include <stdatomic.h>
#include <stdint.h>

#include "common/sched.h"
#include "common/sw_common.h"
#include "ingress/ring.h"
#include "proto/sw_codec.h"
#include "transport/sw_transport.h"

#define SWN_MAX_CONTROL_BYTES 8192 /* an ACK_FINALS of 256 ids is 4.7 KB */
#define SWN_TICK_MS 25             /* heartbeat and deadline precision */
#define SWN_REST_MS 1000           /* the tickers' wait with nothing to do (swi_ticker_rest) */
#define SWN_LINGER_MIN_MS 2000
/* Bounds on what a peer chooses (issue 11 #4), documented in PROTOCOL.md:
 * a request's heartbeat interval and deadline are clamped to these. */
#define SWN_MIN_HEARTBEAT_MS 10
#define SWN_MAX_HEARTBEAT_MS SWP_BEAT_MAX_MS
#define SWN_MAX_DEADLINE_MS (24 * 3600 * 1000)
/* Coalescing: a stream whose last publish ended less than SWN_HOT_US ago
 * hands its items to the ingress's sender thread, which puts every item
 * queued meanwhile into one message (at most SWN_BATCH_ITEMS items and
 * ing->batch_bytes bytes). A stream that was quiet publishes inline. An
 * inline handler's items instead wait for its next one while it sends them
 * less than the hold window apart (coalesce_us; at most SWN_ASAP_HOLD_US on
 * a send-asap connection, and there only while the stream is quiet: a
 * burst) (sender.c, swn_resp_kick), and go out together, a message's worth
 * at most, when it returns, ends the stream, pauses, runs out of credit,
 * sends once the first of them has waited the window (less than twice the
 * window in all while it keeps sending), or at the timer's next tick. */
#define SWN_HOT_US 200 /* default of sw_ingress_opts.coalesce_us */
#define SWN_ASAP_HOLD_US 20
#define SWN_BATCH_ITEMS 128
/* A message's bytes at most: 16 KiB on an unsealed connection (measured
 * faster than 32 KiB, with less of nats-server's CPU per item); 32 KiB on
 * a sealing one, where each message is sealed and opened with a key
 * derivation of its own and 16 KiB cost more CPU per item (BENCHMARKS.md,
 * session 39). ing->batch_bytes holds the one that applies. */
#define SWN_BATCH_BYTES (16 * 1024)
#define SWN_BATCH_BYTES_SEALED (32 * 1024)
#define SWN_MSG_STACK 4096
/* A seq resent less than this long ago is not resent again (control.c): a
 * frontend asks again for what is still missing every gap_timeout/4 (125 ms
 * by default) and after a heartbeat at most every 20 ms, so a legitimate
 * repair loses nothing, while a flood of RESENDs for the whole window costs
 * one window's worth per stream per interval, not one per RESEND. */
#define SWN_RESEND_QUIET_MS 50
/* A final's body is encoded on the stack up to this size (terminal.c): any
 * terminal without its message fits, with room for most messages. */
#define SWN_FINAL_STACK 1024

struct sw_responder {
    sw_ingress *ing;
    atomic_int refs; /* memory */
    int holds;       /* user holds: 1 for the handler call + retains (under mu) */
    pthread_mutex_t mu;
    pthread_cond_t cv;

    uint8_t id[SW_REQUEST_ID_BYTES];
    char idhex[SW_REQUEST_ID_HEX];
    char resp_subj[SWP_MAX_SUBJECT + 1];
    char router_id[SW_MAX_TOKEN + 1];
    uint8_t *payload;
    size_t plen;
    char **hdr; /* the request headers: key, value, key, value, ... (one block, with the
                   strings); NULL when none */
    size_t nhdr;
    size_t hbytes;                       /* the size of that block */
    char trace_id[SWI_TRACE_ID_LEN + 1]; /* of a valid traceparent header, else "" */
    char logtag[SWI_LOGTAG_MAX];         /* idhex, and the trace id when there is one */
    uint32_t max_tokens;
    uint64_t resume_from; /* Request.resume_from_seq */
    int migratable;       /* Request.migratable: a drain hands the stream back */

    uint64_t credit_limit; /* may send seq <= credit_limit (UINT64_MAX: no flow control) */
    uint32_t window;       /* the frontend's first window (Request.credit_window, capped) */
    int capped;            /* window lowered to the ingress's max_window */
    /* The most credit may run past what was acknowledged: the window, or
     * when the request let the frontend grow its window
     * (Request.credit_window_max), that maximum capped to max_window; the
     * ring keeps that many. grow: say wmax in the header of seq 1. */
    uint32_t wmax;
    int grow;
    /* Byte credit (Request.credit_bytes, with a window): a data item may
     * start while sent_bytes, the data bytes of seq 1 .. next_seq-1, are
     * below byte_limit (UINT64_MAX: no byte credit); credit_bytes != 0 is
     * said in the header of seq 1 (the frontend then counts bytes too). */
    uint64_t byte_limit;
    uint64_t sent_bytes;
    uint64_t credit_bytes;
    int starved; /* the last send found no credit (heartbeats say `stalled`) */
    /* next_seq, pub_seq, acked and the kept bodies (ingress/ring.h). Items
     * acked+1 .. pub_seq went out; pub_seq+1 .. next_seq-1 wait in the ring
     * to be published, in order, by the one thread that has set `sending`
     * (it drops mu while it publishes). */
    swn_ring rg;
    int sending;
    int stranded;        /* a drain stopped without memory for a message: the timer drains again */
    int in_sendq;        /* on ing->sq (under ing->smu) */
    int held;            /* queued items wait for the inline handler's next one (sender.c) */
    uint64_t held_bytes; /* sent_bytes when the hold began */
    /* RESEND throttle (control.c resp_resend): seqs resent_lo..resent_hi
     * were resent since resent_ms (the end of the first resend of that
     * spell); none of them is resent again until SWN_RESEND_QUIET_MS after
     * it. resent_hi 0: nothing resent yet. */
    uint64_t resent_lo, resent_hi;
    int64_t resent_ms;
#ifdef SW_CHAOS
    int lose_next;       /* chaos: the next kept item misses its first publish */
    int fail_builds;     /* chaos: so many next first-publish builds fail as without memory */
    int fail_final_keep; /* chaos: the final finds no memory to be kept for resend */
#endif
    int fe_cancelled;  /* the frontend cancelled or killed it (or is gone): it wants nothing more */
    int beats_batched; /* resp_subj is sw.rsp.<router_id>.<id>: heartbeats go in batches */
    int64_t *next_tick;  /* its cell in ing->due: the timer looks at r only from then on (atomic;
                            0 = next tick); made with r, kept until r is freed */
    sw_err pub_err;      /* a failed publish of queued items, told to the next send or finish */
    int64_t last_end_us; /* when the last publish of items returned */

    uint32_t hb_ms;
    uint32_t idle_hb_ms; /* heartbeats with nothing new: this far apart (>= hb_ms) */
    uint64_t beat_seq;   /* the last seq the last heartbeat reported */
    int64_t last_pub_ms;
    int64_t deadline_ms; /* absolute monotonic, -1 = none */
    int64_t done_ms;     /* when the terminal went out */
    uint64_t final_seq;

    int terminated; /* terminal sent, abandoned or killed: nothing more goes out */
    int cancelled;
    int closed; /* ingress destroyed */
    int registered;
    int counted; /* counts in ing->inflight */
    /* Its frontend's use count in ing->peers (liveness.c; ing->live_mu):
     * 0 not yet, 1 counted in the entry of generation live_gen since
     * live_ms, 2 over (or not counted: no memory for an entry). */
    int live_state;
    uint64_t live_gen;
    int64_t live_ms;
    sw_cancel_fn cancel_fn;
    void *cancel_arg;
    int cancel_fired;

    sw_responder *qnext;
    sw_responder *snext;               /* ing->sq, under ing->smu */
    sw_responder *all_prev, *all_next; /* every live responder (ing->all), under ing->mu */
    sw_responder *fin_prev, *fin_next; /* finished and held for an ack (ing->fin), under ing->mu */
    int in_fin;
};

struct sw_ingress {
    sw_conn *conn;
    swi_logger log;
    atomic_int refs;
    char endpoint[SW_MAX_ENDPOINT + 1];
    char instance_id[SW_MAX_TOKEN + 1];
    /* Heartbeats' replay defence (docs/PROTOCOL.md "Replays"): this
     * process's random incarnation, and the counter of the last batch or
     * heartbeat wrapper sent (atomic); probe answers carry both. */
    uint64_t incarnation;
    uint64_t beats_counter;
    /* Bytes of request payloads and headers its responders keep (atomic):
     * from the request's intake until the last hold on its responder goes
     * (swn_resp_free_request). */
    uint64_t req_bytes;
    int64_t max_age_ms; /* sw_ingress_opts.max_request_age_ms; 0 = no limit */
    char req_subj[SWT_SUBJECT_MAX];
    char ctl_subj[SWT_SUBJECT_MAX];
    sw_handler_fn handler;
    void *handler_arg;
    unsigned max_inflight;
    unsigned max_held;                 /* finished streams held for an ack, at most */
    sw_responder *fin_head, *fin_tail; /* those, oldest first (ing->mu) */
    unsigned nfin;
    unsigned nthreads;   /* handler pool threads; 0 with inline_handlers */
    int inline_handlers; /* sw_ingress_opts.handler_inline */
    unsigned send_timeout_ms;
    unsigned max_window;
    int64_t hot_us;     /* coalesce_us; 0 = off */
    int64_t hold_us;    /* an inline handler's hold window (sender.c resp_hold): hot_us, at most
                           SWN_ASAP_HOLD_US on a send-asap connection; 0 = no hold */
    int buffered;       /* the connection is not send-asap: with hot_us > 0, every stream coalesces
                           (sender.c) */
    size_t batch_bytes; /* SWN_BATCH_BYTES, or SWN_BATCH_BYTES_SEALED if the connection seals */
    size_t max_req;
    swp_arena *req_arena; /* each request decodes here (intake.c): only the request
                             subscription's callback uses it, one message at a time */

    swt_sub *req_sub; /* set at start; NULL under req_mu before it closes */
    swt_sub *ctl_sub;
    pthread_mutex_t req_mu;

    pthread_mutex_t mu;
    pthread_cond_t cv;       /* work queue (the idle handler threads wait on it) */
    pthread_cond_t dcv;      /* drain progress: inflight fell (signalled only while draining) */
    swi_ticker timer;        /* heartbeats, deadlines, retiring (heartbeat.c) */
    swi_ptrvec timer_vec;    /* the timer's snapshot buffer */
    struct swn_beats *beats; /* the timer's heartbeat batches */
    swi_idmap streams;
    swi_duetab due; /* each stream's next timer check (the tick's scan reads only this) */
    /* Cancels that came before their request (a CANCEL and its request
     * travel on different subscriptions): the request is then not started.
     * At most SWN_EARLY_MAX (about 1.6 MB), oldest forgotten first, each for
     * SWN_EARLY_TTL_MS (ing->mu). */
    swi_idq early;     /* CANCEL/KILL for requests not seen yet (SWN_EARLY_MAX, 30 s) */
    swi_idq seen;      /* requests served recently: a replay is never run twice (SWN_SEEN_MAX) */
    swi_idq refused;   /* requests refused recently (overloaded, draining, starting, cancelled
                          first): a replay never runs later (SWN_REFUSED_MAX) */
    sw_responder *all; /* every responder not yet freed, registered or not */
    sw_responder *q_head, *q_tail;
    pthread_t *threads;
    unsigned started_threads;
    /* the sender thread and the streams waiting for it */
    pthread_mutex_t smu;
    pthread_cond_t scv;
    sw_responder *sq_head, *sq_tail;
    pthread_t sender;
    int sender_on;   /* running and taking work (under smu) */
    int sender_idle; /* waiting on scv */
    int sender_stop;
#ifdef SW_CHAOS
    int sender_hold;         /* swx_ingress_hold_sender (under smu) */
    uint64_t handoffs;       /* streams handed to the sender thread (atomic) */
    uint64_t timer_releases; /* held items the timer published (atomic) */
    uint64_t timer_ticks;    /* calls of swn_ing_timer_tick (atomic) */
    uint64_t live_ticks;     /* calls of swn_ing_live_tick (atomic) */
#endif
    pthread_mutex_t live_mu;
    swi_peers peers;        /* frontends being probed (common/sched.h), under live_mu */
    swi_ticker live_ticker; /* probing rounds (liveness.c) */
    swt_sub *live_sub;      /* sw.lv.<instance>.*: probe answers */
    unsigned probe_ms, probe_timeout_ms;
    /* sw_ingress_start has succeeded: requests run from then on. One that
     * comes before (start may yet fail, and its caller free what the
     * handler uses) is handed back unrun (intake.c). */
    int started;
    int stopping;
    int draining;
    int destroyed;
    unsigned inflight;
#ifdef SW_CHAOS
    double drop_rate;         /* chaos: loss injection of first publishes */
    int drop_cancels;         /* chaos: CANCEL/KILL controls still to drop (atomic) */
    int drop_beats;           /* chaos: heartbeats are lost (swx_ingress_drop_beats; atomic) */
    int drop_stream_probes;   /* chaos: PROBEs naming a stream are lost (atomic) */
    uint64_t probe_seq_ahead; /* chaos: added to a stream probe answer's last_seq (atomic) */
    void (*gone_fn)(const char *router_id, void *arg); /* swx_ingress_on_frontend_gone (live_mu) */
    void *gone_arg;
#endif
    sw_ingress_stats st;
};

/* What a publish adds to the ingress's counters. */
typedef struct swn_sent {
    int64_t items, msgs, resent, beats;
} swn_sent;

/* The scratch a message is built in: on the stack when it fits. */
typedef struct swn_msgbuf {
    uint8_t *p;
    size_t cap;
    uint8_t stack[SWN_MSG_STACK];
} swn_msgbuf;

void swn_fin_unlink(sw_ingress *ing, sw_responder *r);

#define SWN_EARLY_MAX 16384
#define SWN_EARLY_TTL_MS 30000
/* Request ids this worker accepted recently: at most this many, for this
 * long (a request replayed to the same instance after its stream ended is
 * not run again; sealing review finding A3). */
#define SWN_SEEN_MAX 65536
#define SWN_SEEN_TTL_MS (10 * 60 * 1000)
/* Request ids this worker refused without running them, for as long: a
 * table of their own, so that a flood of refusals (cheap to cause) cannot
 * push the served ones out of `seen`. */
#define SWN_REFUSED_MAX 16384

/* A CANCEL/KILL for a request not seen yet (ing->mu held). */
void swn_early_add(sw_ingress *ing, const uint8_t *id, const char *router_id, int64_t now);
/* 1 if a cancel for this request came first; forgets it (ing->mu held). */
int swn_early_take(sw_ingress *ing, const uint8_t *id, const char *router_id);
void swn_early_fini(sw_ingress *ing);
/* 1 if request id came here already and is over: served (seen) or refused
 * without running (ing->mu held). */
int swn_ing_was_here(sw_ingress *ing, const uint8_t *id, int64_t now);
#define SWN_RESP_AT(vec, i) ((sw_responder *)(vec).v[i])

/* ingress/ingress.c */
void swn_resp_ref(sw_responder *r);
void swn_resp_unref(sw_responder *r);
/* Frees the request's payload and headers (r->mu held, or r not shared):
 * the API lets the user read them only until the last release, and a
 * finished stream may be held long after it for its final's ack. */
void swn_resp_free_request(sw_responder *r);

/* ingress/frame.c */
sw_err swn_resp_pack_final(const uint8_t id[SW_REQUEST_ID_BYTES], const char *instance,
                           uint64_t seq, const swp_terminal *term, size_t max, uint8_t **out,
                           size_t *outlen);
size_t swn_resp_max_body(const sw_responder *r);
void swn_resp_hdr(const sw_responder *r, uint64_t first, uint64_t last, int resent, swp_hdr *h);
int swn_msgbuf_fit(swn_msgbuf *m, size_t need);
void swn_msgbuf_init(swn_msgbuf *m);
void swn_msgbuf_free(swn_msgbuf *m);
size_t swn_resp_build(sw_responder *r, uint64_t from, uint64_t to, int resent, swn_msgbuf *m,
                      uint64_t *last, unsigned *nitems, unsigned *data_items);

/* ingress/sender.c */
sw_err swn_ing_publish_counted(sw_ingress *ing, const char *subj, const void *buf, size_t len,
                               const swn_sent *d);
sw_err swn_resp_publish(sw_responder *r, const uint8_t *buf, size_t len, const swn_sent *d);
/* Keeps item seq's body, written into swn_ring_room(&r->rg, seq, len), in
 * the resend ring (r->mu held; the chaos build may mark it to be left out
 * of its first publish). */
void swn_resp_commit(sw_responder *r, uint64_t seq, size_t len);
/* The same for a body written elsewhere: copied, buf stays the caller's.
 * SW_ENOMEM if the ring cannot keep seq (nothing changed). */
sw_err swn_resp_keep(sw_responder *r, uint64_t seq, const uint8_t *buf, size_t len);
sw_err swn_resp_publish_one(sw_responder *r, uint64_t seq, const uint8_t *body, size_t blen,
                            const swn_sent *d);
sw_err swn_resp_take_pub_err(sw_responder *r);
void swn_resp_run_drain(sw_responder *r);
void swn_resp_kick(sw_responder *r);
/* Brackets an inline handler's call on its thread (no lock held): items it
 * sends may wait for its next ones (swn_resp_kick); the end publishes any
 * that still wait. */
void swn_resp_inline_begin(sw_responder *r);
void swn_resp_inline_end(sw_responder *r);
/* Publishes items held for the inline handler's next one now (r->mu held):
 * the handler returned or its stream needs credit. 1 if it did (mu was
 * dropped meanwhile), 0 if nothing was held or another thread is
 * publishing the stream's items. */
int swn_resp_release_held(sw_responder *r);
void swn_resp_flush_now(sw_responder *r);
void *swn_ing_sender_main(void *arg);

/* ingress/terminal.c */
void swn_resp_uncount(sw_responder *r);
void swn_resp_mark_terminated(sw_responder *r);
/* by: SWN_BY_PRODUCER when the stream's own producer ends it (sw_responder_
 * finish/fail, a handler returning without a terminal): that thread then
 * publishes what is queued with the final, unless another thread is
 * publishing r's items (it takes the final too). SWN_BY_OTHER
 * from a control, the timer or a drain: the queued items and the final go the
 * usual way (swn_resp_kick), so that thread is not held up by a window of
 * another stream's items. */
#define SWN_BY_OTHER 0
#define SWN_BY_PRODUCER 1
/* Or'd into by: the caller may try again (sw_responder_finish/fail, which
 * then return SW_ENOMEM), so a final too long for the stack whose memory
 * cannot be had is not sent; without it, the final goes without its
 * message instead. Every other caller ends the stream for good: its final
 * never fails for lack of memory. */
#define SWN_MAY_RETRY 2
sw_err swn_resp_send_final(sw_responder *r, const swp_terminal *t, sw_status counted_as, int by);
void swn_term_failed(swp_terminal *t, swp_error *e, sw_err sw_code, const char *app_code,
                     const char *message);
sw_err swn_resp_send_failed(sw_responder *r, sw_err sw_code, const char *app_code,
                            const char *message, int by);
void swn_resp_fire_cancel(sw_responder *r);
void swn_unregister_stream(sw_responder *r);

/* ingress/responder.c */
void swn_resp_drop_hold(sw_responder *r, const char *code, const char *message);

/* ingress/intake.c */
void swn_ing_on_request(const swt_msg *msg, void *arg);
void *swn_ing_worker_main(void *arg);
/* Calls the handler for r unless it is cancelled already, then drops the
 * hold the intake gave r (a terminal-less return fails the stream). */
void swn_ing_run_handler(sw_ingress *ing, sw_responder *r);

/* ingress/control.c */
void swn_resp_cancel(sw_responder *r, int kill);
#ifdef SW_CHAOS
/* ingress/chaos.c: 1 if this CANCEL/KILL is to be dropped (test hook). */
int swn_chaos_drop_cancel(sw_ingress *ing);
/* ingress/chaos.c: sw_ingress_start made its request subscription (calls
 * the swx_ingress_on_subscribed hook, if any). */
void swn_chaos_subscribed(sw_ingress *ing);
#endif
void swn_ing_on_control(const swt_msg *msg, void *arg);

/* ingress/ingress.c: sweeps, a pass over the responders that needs no
 * memory (a drain, a destroy or a frontend's loss must not skip streams
 * when malloc fails: a snapshot that found no memory used to hand back or
 * cancel nothing). Each swn_ing_sweep_take returns up to max responders,
 * each with a reference, in the order of ing->all from where the last
 * call stopped (the sweep keeps a reference on that one, so it stays in
 * the list), and 0 once the list is done, having let its place go: call
 * it until then. all: every responder alive (registered or not), else the
 * registered ones. Responders that arrive meanwhile (at the list's head)
 * are not visited; sweeps running at once do not disturb each other.
 * SWN_SWEEP_BATCH at a time on the caller's stack. Takes ing->mu. */
#define SWN_SWEEP_BATCH 64
typedef struct swn_sweep {
    sw_responder *at; /* where the last call stopped (a reference of the sweep's), or NULL */
    int all, done;
} swn_sweep;
size_t swn_ing_sweep_take(sw_ingress *ing, swn_sweep *w, sw_responder **out, size_t max);

/* ingress/heartbeat.c */
void swn_resp_tick_soon(sw_responder *r);
/* A heartbeat may be due sooner than planned (new items went out after an
 * idle spell, or the stream now waits for credit): brings r's due time
 * forward to it (r->mu held; never later). */
void swn_resp_beat_sooner(sw_responder *r);
void swn_ing_timer_tick(void *arg, int64_t now);
void swn_ing_timer_fini(sw_ingress *ing);

/* ingress/liveness.c */
void swn_ing_on_live_reply(const swt_msg *msg, void *arg);
void swn_ing_live_tick(void *arg, int64_t now);
/* A stream registered (its frontend is probed while it has one here), and
 * unregistered (every path that takes a stream out of ing->streams calls
 * forget after releasing ing->mu); each takes live_mu, the caller holds a
 * reference and may hold r->mu. */
void swn_ing_live_note(sw_ingress *ing, sw_responder *r);
void swn_ing_live_forget(sw_ingress *ing, sw_responder *r);
/* Cancels the running streams of router_id, judged gone, as a frontend
 * gone would (sw_responder_send: SW_ECANCELLED; the cancel callback runs)
 * and lets go of finished ones waiting for an ack that cannot come; logged
 * with why. Only the streams the verdict covers: those counted in its
 * entry of generation gen (taken out of the table) and noted before the
 * deciding probe went out at probe_ms (liveness.c live_judged). Every
 * stream if router_id is NULL (gen and probe_ms unused). Counted in
 * frontends_lost unless NULL. No lock held. */
void swn_ing_cancel_frontend(sw_ingress *ing, const char *router_id, uint64_t gen, int64_t probe_ms,
                             const char *why);

#endif
