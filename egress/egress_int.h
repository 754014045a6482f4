/* egress/egress_int.h -- the frontend side's internals, shared by its files:
 *
 *   rx.c        a stream's receive logic, a pure state machine (rx.h)
 *   sprobe.c    the table of stream probes out (sprobe.h), pure
 *   stream.c    sw_stream: the state machine behind a mutex, delivery to
 *               the consumer (blocking or callbacks), cancel, close, stats
 *   control.c   control messages to workers: credit, resend, kill, cancel,
 *               and the batched acknowledgements of finals (ACK_FINALS)
 *   mux.c       the router's one wildcard subscription: dispatch of items
 *               and heartbeat batches to streams; answers to workers'
 *               liveness probes
 *   probe.c     instances with open streams are probed (common/sched.h's
 *               peer table); a lost instance ends its streams; a silent
 *               stream's worker is asked after it (stream probes, sprobe.h)
 *   timer.c     the router's ticker: stream deadlines, probes, ack flushes
 *   open.c      sw_router_open and the one-time re-route on no responders
 *   migrate.c   migration: a stream whose worker was lost moves to another
 *               instance under a new request id (docs/MIGRATION.md)
 *   frontend.c  sw_router: options, create, destroy, stats, the table
 *
 * Threads: nats.c's delivery thread runs the mux and probe callbacks; one
 * ticker thread runs timer.c; the consumer calls sw_stream_next or gets
 * callbacks from whichever of those threads made an item ready (serialised
 * by s->dispatching).
 *
 * Locks and their order (docs/RATIONALE.md has the table for the library):
 *   r->mu     the stream table, the peer table, the stream probes out (and
 *             each stream's tag of its own, rx.ask_tag), counters;
 *   s->mu     one stream (its swe_rx);
 *   r->ack_mu the queue of acknowledgements; r->flush_mu one flusher.
 * r->mu may be taken before s->mu (re-routing, instance loss read a
 * stream's instance under both; a re-route picks its instance under both);
 * never s->mu then r->mu. The pool's lock (router/pool.c) is a leaf, taken
 * under either. flush_mu is taken
 * before ack_mu; ack_mu before s->mu (queueing an ack copies the control
 * subject). No user callback and no log call runs with any of them held. */
#ifndef SW_EGRESS_INT_H
#define SW_EGRESS_INT_H

#include <limits.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "common/metrics.h"
#include "common/sched.h"
#include "common/sw_common.h"
#include "egress/backlog.h"
#include "egress/cancels.h"
#include "egress/rx.h"
#include "egress/sprobe.h"
#include "proto/sw_codec.h"
#include "router/sw_pool.h"
#include "transport/sw_transport.h"

#define SWE_TICK_MS 10 /* probe rounds, ack flushes */
#define SWE_SCAN_MS 25 /* stream scans: inactivity, deadline, gap, linger */
/* A router with nothing to tick for (no stream, cancel, final ack, probe or
 * deferred dispatch) rests its ticker this long; whatever brings work kicks
 * it (swi_ticker_wake). With streams open it waits for the next scan unless
 * something is due sooner. The ticker's rest level says which: */
#define SWE_REST_MS 1000
#define SWE_REST_SHORT 1 /* waiting for the next scan (or probe, or cancel resend) */
#define SWE_REST_IDLE 2  /* no stream: waiting up to SWE_REST_MS */
/* Acknowledgements of finals wait up to a tick and go out together, one
 * ACK_FINALS per worker, at most SWE_ACKS_MAX per flush. */
#define SWE_ACKS_MAX 64
/* Error terminals are counted by code below this (stream reasons are 100..199). */
#define SWE_ERR_SLOTS 256

/* Per-endpoint series (metrics): the first SWE_EP_MAX endpoints a router
 * opens streams to get their own; streams to any later one count under
 * SWE_EP_OTHER, so that the number of series stays bounded. */
#define SWE_EP_MAX 32
#define SWE_EP_OTHER "_other"
typedef struct swe_ep {
    char name[SW_MAX_ENDPOINT + 1]; /* written once, before eps_used counts it */
    uint64_t opened;                /* atomic */
    uint64_t terminals[6];          /* by sw_status (atomic) */
    swi_hist ttfi, duration;
} swe_ep;

typedef struct swe_ack {
    char subj[SWT_SUBJECT_MAX];
    uint8_t id[SW_REQUEST_ID_BYTES];
} swe_ack;

struct sw_router {
#ifdef SW_CHAOS
    void (*credit_hook)(sw_stream *s, void *arg); /* swx_router_on_credit */
    void *credit_hook_arg;
    void (*open_hook)(sw_stream *s, void *arg); /* swx_router_on_open_sent */
    void *open_hook_arg;
    void (*reroute_hook)(sw_stream *s, void *arg); /* swx_router_on_reroute */
    void *reroute_hook_arg;
    void (*dispatch_hook)(sw_stream *s, void *arg); /* swx_router_on_dispatch */
    void *dispatch_hook_arg;
    uint64_t ticks; /* calls of swe_on_tick (atomic) */
#endif
    sw_conn *conn;
    swi_logger log;
    atomic_int refs;
    char id[SW_MAX_TOKEN + 1];
    char wildcard[SWT_SUBJECT_MAX];
    unsigned window, hb_ms, inactivity_ms, gap_ms, linger_ms, max_streams;
    unsigned window_max; /* sw_router_opts.credit_window_max */
    size_t credit_bytes;
    size_t credit_bytes_max; /* sw_router_opts.credit_bytes_max (>= credit_bytes) */
    int migration_limit;     /* the default for requests */
    swt_sub *mux;
    swt_sub *live; /* sw.rtr.<id>: answers workers' liveness probes */
    swt_sub *prb;  /* sw.prb.<id>.*: answers to our instance probes */
    swr_pool *pool;
    swi_peers peers;     /* instances with open streams (r->mu) */
    swe_sprobes sprobes; /* stream probes out: silent streams asked after (r->mu) */
    pthread_mutex_t mu;
    swi_idmap streams;
    swi_duetab due; /* each stream's next check time (the scan reads only this) */
    swi_ticker ticker;
    int64_t next_scan;          /* ticker thread only */
    swi_ptrvec scan_vec;        /* ticker thread only: reused by every scan */
    swi_ptrvec deferred;        /* streams to dispatch from the ticker, a reference each (r->mu) */
    int no_defer;               /* the ticker is gone (destroy): dispatch at once (r->mu) */
    int closing;                /* no new streams */
    int closed;                 /* no more publishing (atomic) */
    swe_backlog backlog;        /* the mux's progress: the quiet time (ticker thread only) */
    int64_t behind_warned_ms;   /* the last "behind" warning (ticker thread only) */
    uint64_t items;             /* data items delivered (atomic) */
    uint64_t items_after_final; /* (atomic) */
    uint64_t err_counts[SWE_ERR_SLOTS]; /* error terminals by code (r->mu) */
    pthread_mutex_t ack_mu;             /* acks, nacks */
    pthread_mutex_t flush_mu;           /* one flusher at a time; owns flushing */
    swe_ack acks[SWE_ACKS_MAX];
    swe_ack flushing[SWE_ACKS_MAX];
    size_t nacks;
    sw_router_stats st;
    /* Latency histograms (lock-free; egress/metrics.c renders them): open
     * to first data item delivered, between data items delivered, open to
     * terminal delivered. */
    swi_hist h_ttfi, h_inter, h_duration;
    int timing_off;                                   /* STREAMWIRE_METRICS=off: no histograms */
    uint64_t duplicates, resend_requests, heartbeats; /* of finished streams (atomic) */
    uint64_t migrations, migration_failures;          /* (atomic) */
    swe_cancels cancels;        /* cancelled streams whose worker has not answered (r->mu) */
    swe_ep eps[SWE_EP_MAX + 1]; /* the last one is SWE_EP_OTHER */
    unsigned eps_used;          /* eps[0..eps_used) named (claimed under r->mu; atomic) */
    int cancels_waiting;        /* cancels.n, readable without r->mu (atomic) */
};

/* What a stream that may migrate keeps (allocated at open, with the
 * request as first encoded, which a migration sends again). */
typedef struct swe_mig {
    sw_migrate_fn fn;
    void *arg;
    char (*insts)[SW_MAX_TOKEN + 1]; /* the instance of each worker generation (s->mu;
                                        allocated at the first migration, never moved) */
    char *inst_list;                 /* "a,b" for the terminal (s->mu) */
    size_t req_len;
    uint8_t req[]; /* (set once at open, before the stream is shared) */
} swe_mig;

/* A re-route's allocation: its instance, and the list of both. */
#define SWE_SECOND_BYTES (3 * (SW_MAX_TOKEN + 1))

struct sw_stream {
    sw_router *r;
    atomic_int refs;
    int waiters; /* blocking consumers in sw_stream_next's wait (atomic; changed under mu) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint8_t id[SW_REQUEST_ID_BYTES];
    /* The request's trace id (binary; all zero: none, which W3C forbids as
     * an id), written as hex only by swe_logtag. */
    uint8_t trace[SWI_TRACE_ID_LEN / 2];
    char idhex[SW_REQUEST_ID_HEX];
    /* Flags, one byte each (never bit-fields: they change under different
     * locks), packed where the strings leave room. */
    uint8_t has_ready;      /* opened with on_ready (set once, before the stream is shared) */
    uint8_t in_table;       /* (r->mu) */
    uint8_t pooled;         /* counted in the pool and the peer table (r->mu) */
    uint8_t routed;         /* the instance was picked by the pool (no instance_id given) */
    uint8_t rerouted;       /* already sent elsewhere once after no_responders (s->mu) */
    uint8_t opening;        /* sw_router_open runs: item callbacks wait for the ticker (s->mu) */
    uint8_t endpoint_owned; /* endpoint is the stream's own copy (set once at open) */
    sw_item_fn on_item;
    void *on_item_arg;
    void (*on_ready)(sw_stream *s, void *arg); /* blocking mode: something to take (s->mu;
                                                  NULL after sw_stream_close) */
    void *on_ready_arg;
    swe_rx rx;          /* s->mu */
    sw_item *cur;       /* the item last handed to a blocking consumer (allocated by the
                           first sw_stream_next: an idle stream needs none) */
    int64_t last_rx_ms; /* mirror of rx.last_rx_ms for probe rounds (atomic) */
    int64_t t_open_ns;  /* sw_router_open's start, for the histograms */
    int64_t t_last_ns;  /* last data item delivered (s->mu); 0 = none yet */
    int64_t *next_tick; /* its cell in r->due: the scan looks at s only from then on (atomic;
                           0 = next scan); set before the stream is shared, kept until freed */

    /* What sw_stream_instance_id and items show: each buffer is written once
     * (a re-route happens at most once) and then published through inst_pub,
     * so a reader never sees a string being rewritten. */
    char inst_first[SW_MAX_TOKEN + 1];
    uint8_t dispatching; /* (s->mu) */
    uint8_t in_cb;       /* an item callback runs now, on cb_thread (s->mu) */
    uint8_t grant_held;  /* the callback's item earned a grant, sent when it returns: a
                            repeat of the grant meanwhile is not sent (written under s->mu,
                            atomic) */
    uint8_t closed;      /* sw_stream_close: no item callback starts any more (s->mu) */
    uint16_t in_ready;   /* on_ready calls running now, one a library thread at most (s->mu) */
    char *inst_second;   /* allocated by the re-route (NULL before): the second instance,
                            then at SW_MAX_TOKEN + 1 "first,second" (SWE_SECOND_BYTES) */
    const char *inst_pub;
    /* ns.component.endpoint, set once at open: the router's copy in its
     * endpoint series (swe_ep_name) when it has one, else the stream's own
     * (endpoint_owned) */
    const char *endpoint;
    swe_ep *ep;       /* its endpoint's series (set at open, under r->mu) */
    uint8_t *req_buf; /* the encoded request, kept until the first answer (re-routing) */
    size_t req_len;
    pthread_t cb_thread;
    /* Migration (migrate.c). s->id and the instance change under
     * r->mu and s->mu; idhex and trace stay the first request's. */
    swe_mig *mig; /* a stream that may migrate (NULL: it may not) */
};
#if defined(__x86_64__) && defined(__GLIBC__)
/* Issue 17's budget: an idle stream costs the frontend at most 1 KiB (this
 * struct in an 848-byte malloc chunk and its table slots: 910 bytes
 * measured, BENCHMARKS.md session 33; 1,004 before, in a 912-byte chunk
 * with its own copy of the endpoint). A field added here must be paid for
 * by one taken out (session 17: the byte window's 16 bytes by
 * swe_rx_stats); session 33 made the room: the trace id in binary, the
 * migration history behind a pointer, swe_rx's small state in bytes, the
 * endpoint's name shared with the router's series. */
_Static_assert(sizeof(struct sw_stream) <= 840, "sw_stream outgrew the idle-stream budget");
#endif

/* frontend.c */
void swe_router_unref(sw_router *r);
sw_stream *swe_lookup(sw_router *r, const uint8_t *id);
/* swe_lookup of n ids under one hold of r->mu: out[i] is the stream with a
 * reference, or NULL. */
void swe_lookup_n(sw_router *r, const uint8_t *const *ids, size_t n, sw_stream **out);
void swe_remove(sw_stream *s);
void swe_count_terminal(sw_router *r, const sw_terminal *t);
/* The series of endpoint `name` (r->mu held): its own, or SWE_EP_OTHER. */
swe_ep *swe_ep_get(sw_router *r, const char *name);
/* The router's copy of endpoint `name` if one of its own series has it
 * (they are never removed: the copy lives as long as the router), else
 * NULL. No lock: a series' name is written before eps_used counts it. */
const char *swe_ep_name(const sw_router *r, const char *name);
/* The open streams with a reference each: all (by NULL), or those with a
 * timer check due by *by. */
void swe_snapshot(sw_router *r, swi_ptrvec *vec, const int64_t *by);
#define SWE_AT(vec, i) ((sw_stream *)(vec).v[i])

/* How a log line names the stream: its request id, and its trace id when
 * the request has one ("" without a logger: nothing will be written). */
static inline const char *
swe_logtag(const sw_stream *s, char buf[SWI_LOGTAG_MAX])
{
    static const uint8_t none[sizeof(s->trace)];
    buf[0] = '\0';
    if (s->r->log.fn != NULL) {
        char trace[SWI_TRACE_ID_LEN + 1] = "";
        if (memcmp(s->trace, none, sizeof(none)) != 0)
            swi_hex(trace, s->trace, sizeof(s->trace));
        swi_logtag(buf, s->idhex, trace);
    }
    return buf;
}

/* The instance the stream is on now ("" before one was picked): a string
 * written once and then published (inst_pub), so it may be read without a
 * lock and stays valid for the stream's life. */
static inline const char *
swe_instance(const sw_stream *s)
{
    return __atomic_load_n(&s->inst_pub, __ATOMIC_ACQUIRE);
}

/* Every instance the stream's request was sent to, comma-separated, for
 * its terminal (s->mu held): a migration's list, else a re-route's pair
 * (kept after the second instance's name, SWE_SECOND_BYTES), else the one
 * instance. */
static inline const char *
swe_instances(const sw_stream *s)
{
    if (s->mig != NULL && s->mig->inst_list != NULL)
        return s->mig->inst_list;
    if (s->inst_second != NULL)
        return s->inst_second + SW_MAX_TOKEN + 1;
    return swe_instance(s);
}

/* Asks the cache for the lines of s that a received heartbeat or item
 * touches (its receive state, instance and timer fields): a batch of beats
 * visits thousands of cold streams, and fetching the next ones while one is
 * handled overlaps their misses. Only a hint: s must be referenced. */
static inline void
swe_stream_prefetch(const sw_stream *s)
{
    swi_prefetch(&s->rx, sizeof(*s) - offsetof(sw_stream, rx));
}

/* stream.c */
void swe_stream_ref(sw_stream *s);
void swe_stream_unref(sw_stream *s);
/* Feeds one decoded item to the stream and carries out what it asks. The
 * caller holds a reference to s (its lookup's) for the whole call: a
 * callback consumer's items may be delivered inside it, and the callback
 * may close the stream. Also for the two below. */
void swe_stream_on_item(sw_stream *s, const uint8_t *id, const swe_rx_in *in);
/* n items of one message, in order, under one lock where nothing must be
 * sent between them. id: the request id the stream was looked up by; the
 * items are dropped if it is no longer the stream's (a migration, on
 * another thread, moved it to a new request and worker meanwhile: they
 * are the old worker's, and would be taken for the new one's). */
void swe_stream_on_items(sw_stream *s, const uint8_t *id, const swe_rx_in *in, size_t n);
/* As swe_stream_on_items, received at `now` (one clock read for a batch). */
void swe_stream_on_items_at(sw_stream *s, const uint8_t *id, const swe_rx_in *in, size_t n,
                            int64_t now);
/* Ends a stream with a synthesized error; kill: tell the worker to stop. */
void swe_stream_fail(sw_stream *s, sw_err err, const char *msg, int kill);
/* "No responders" for request id of s: a migrated stream moves on
 * (may_move: unsealed), else it ends (swe_rx_no_responders). Returns -1 if
 * it was ignored: id is no longer s's, or s's worker has answered. */
int swe_stream_no_responders(sw_stream *s, const uint8_t *id, int may_move, const char *msg);
/* A plain message on s's subject, refused by a sealing connection
 * (swe_rx_unsealed): the stream ends auth_failed unless its worker has
 * answered sealed. Returns -1 if it was ignored: id is no longer s's, or
 * s's worker has answered. */
int swe_stream_unsealed(sw_stream *s, const uint8_t *id, const char *msg);
/* The timer's look at one stream. */
void swe_stream_tick(sw_stream *s, int64_t now, int64_t quiet);
/* The worker answered a stream probe of s (sent for request id `id`; the
 * caller checked that it is fresh and from the stream's instance): known,
 * it counts as a heartbeat, a sign of life only (last_seq at most what
 * arrived); not known, no more asks until a
 * sign of life (inactivity decides). Returns 1 if it counted (the stream
 * was open on that request, not moving). */
int swe_stream_answered(sw_stream *s, const uint8_t *id, int known, uint64_t last_seq);
/* A terminal other than completed or incomplete that s decided and has not
 * handed its consumer yet (ready: past final_linger_ms): sw_merge looks, so
 * that a stream that failed ends the merged result without the merge
 * reading any stream's data ahead of need. 0: none; 1: it is the next item
 * (nothing queued before it); 2: data is queued before it. On 1 and 2, *t
 * is a copy whose reason and message are copied into reason and message
 * (the stream's own change if it is cancelled: a terminal queued behind
 * data becomes CANCELLED, swe_rx_cancel); its instances stay valid while s
 * is open. Takes s->mu. */
int swe_stream_queued_failure(sw_stream *s, sw_terminal *t, char *reason, size_t reason_cap,
                              char *message, size_t message_cap);
void swe_dispatch(sw_stream *s);
/* Ends s as sw_router_destroy ends every open stream: error "closed", a
 * terminal held back by final_linger_ms released, delivered now (no lock
 * held; frontend.c). */
void swe_end_destroyed(sw_stream *s);
/* Carries out an action set (no lock held). */
void swe_apply(sw_stream *s, const swe_rx_act *act);

/* control.c */
/* sw.ctl.<instance>, or "" when there is no instance yet (ctl_publish then
 * sends nothing). */
void swe_control_subject(char subj[SWT_SUBJECT_MAX], const char *instance);
/* A control to the stream's worker, if it is still worker gen (rx.gen; an
 * action's act->gen), or to whichever it is on now (SWE_GEN_ANY). */
#define SWE_GEN_ANY UINT_MAX
void swe_send_control(sw_stream *s, unsigned gen, int kind, uint64_t limit, uint64_t ack,
                      uint64_t from, uint64_t to);
/* A CREDIT with act's limits (act->credit). */
void swe_send_credit(sw_stream *s, const swe_rx_act *act);
/* To a given control subject and request id (a stream's earlier worker). */
void swe_send_control_to(sw_router *r, const char *subj, const uint8_t id[SW_REQUEST_ID_BYTES],
                         int kind, uint64_t limit, uint64_t ack, uint64_t from, uint64_t to);
void swe_queue_final_ack(sw_stream *s);
void swe_flush_acks(sw_router *r);

/* mux.c */
void swe_on_msg(const swt_msg *msg, void *arg);
void swe_on_live_probe(const swt_msg *msg, void *arg);

/* probe.c */
void swe_on_probe_reply(const swt_msg *msg, void *arg);
void swe_on_removed(void *arg, const char *instance);
/* Cancels sent again until the worker answers (egress/cancels.h). */
void swe_cancel_wait(sw_stream *s, int kill);
/* As swe_cancel_wait, for the request id at subj (a migrated stream's
 * earlier worker). */
void swe_cancel_wait_to(sw_stream *s, const char *subj, const uint8_t id[SW_REQUEST_ID_BYTES],
                        int kill);
void swe_cancels_tick(sw_router *r, int64_t now);
/* A message for a stream no longer in the table: if it is the final of a
 * cancelled one, its cancel is answered. */
void swe_cancels_answer(sw_router *r, const uint8_t id[SW_REQUEST_ID_BYTES], const swt_msg *msg);
/* The worker's final for request id has come: a cancel waiting for it is
 * answered (nothing if none waits). Also for a stream still in the table:
 * a consumer may cancel between the lookup and the final's feeding (from
 * its own callback, mid-message), and the stream then drops the final. */
void swe_cancels_settle(sw_router *r, const uint8_t id[SW_REQUEST_ID_BYTES]);

/* swr_load_fn for the pool: streams open to an instance, from r->peers (the
 * one count of them). Caller holds r->mu. */
unsigned swe_instance_load(void *arg, const char *instance);
void swe_probe_round(sw_router *r, int64_t now);
/* Carries out act->ask for s (decided for worker gen): a stream PROBE
 * (no lock held). */
void swe_stream_ask(sw_stream *s, unsigned gen);
void swe_instance_lost(sw_router *r, const char *id, const char *why, int64_t silent_ms,
                       int64_t unanswered_ms);

/* open.c */
int swe_reroute(sw_stream *s);

/* migrate.c: carries out act->migrate (no lock held). */
void swe_migrate(sw_stream *s);
/* Frees the stream's migration state (at its last reference). */
void swe_migrate_fini(sw_stream *s);
/* The instance that served an item of worker generation gen. s->mu held. */
const char *swe_gen_instance(sw_stream *s, unsigned gen);

/* timer.c */
void swe_on_tick(void *arg, int64_t now);
/* Dispatches s from the ticker thread soon (callback mode, after open). */
void swe_defer_dispatch(sw_stream *s);
/* Runs the deferred dispatches now (the ticker, and destroy). */
void swe_run_deferred(sw_router *r);

#endif
