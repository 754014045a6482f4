/* common/sched.h -- the one deadline scheduler and the one peer-liveness
 * table, shared by ingress (workers probing their frontends, heartbeats,
 * deadlines), egress (routers probing their instances, stream timers) and
 * the registry (lease refresh and expiry).
 *
 * Deadline scheduling is in two parts:
 *   - swi_ticker: a thread that calls fn(arg, now) every period_ms, or at
 *     once when kicked, until stopped. fn runs with no ticker lock held.
 *   - due times: each object that the tick scans keeps the monotonic time
 *     its next check falls due in a cell of a due table (swi_duetab), read
 *     and written atomically (swi_due_*), so a scan reads the cells side by
 *     side, without locking or touching the objects with nothing due, and
 *     takes references on the rest.
 *
 * swi_peers is a pure state machine (no locks, no clock reads, no I/O): the
 * caller locks it, passes the time in, and sends the probes and acts on the
 * losses it returns. */
#ifndef SW_SCHED_H
#define SW_SCHED_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "common/sw_common.h"

/* ---------------------------------------------------------------- ticker */

typedef struct swi_ticker {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int started; /* the thread runs (atomic: a kick may look at any time) */
    int inited;  /* mu and cv are initialised (until swi_ticker_fini) */
    int stop;
    int kicked;
    unsigned period_ms;
    unsigned rest_ms; /* the next wait instead of period_ms, once (swi_ticker_rest) */
    int resting;      /* the owner's rest level, 0 = none (atomic; swi_ticker_resting) */
    void (*fn)(void *arg, int64_t now);
    void *arg;
} swi_ticker;

/* Starts the thread. 0, or -1 (no thread: nothing to stop). */
int swi_ticker_start(swi_ticker *t, unsigned period_ms, void (*fn)(void *arg, int64_t now),
                     void *arg);
/* Makes the next call come now rather than at the end of the period. */
void swi_ticker_kick(swi_ticker *t);
/* Resting, an owner's way of not waking for nothing. From inside fn:
 *
 *     swi_ticker_resting(t, level);     before looking for work (level > 0)
 *     ...look, under the locks that producers of work take...
 *     swi_ticker_rest(t, ms);           ms = how long nothing is due (0: none)
 *
 * and a producer, once its work is visible under such a lock, calls
 * swi_ticker_wake(t, level): a ticker resting at `level` or above is kicked
 * (the rest level taken back to 0). Either the look sees the work, or the
 * producer sees the level and kicks. A kick made while fn ran cuts the rest
 * short too. */
static inline void
swi_ticker_resting(swi_ticker *t, int level)
{
    __atomic_store_n(&t->resting, level, __ATOMIC_SEQ_CST);
}
/* The next call comes after ms rather than period_ms (once), or sooner if
 * kicked; 0 keeps the period and ends the rest level. */
void swi_ticker_rest(swi_ticker *t, unsigned ms);
/* One atomic load when the ticker is not resting at `level` or above. */
static inline void
swi_ticker_wake(swi_ticker *t, int level)
{
    int cur = __atomic_load_n(&t->resting, __ATOMIC_SEQ_CST);
    if (cur >= level &&
        __atomic_compare_exchange_n(&t->resting, &cur, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
        swi_ticker_kick(t);
}
/* Stops and joins the thread; after it returns fn is not running. Safe on a
 * ticker that never started (zeroed). Not from inside fn. A kick from
 * another thread from then on (a message handler still running while its
 * owner closes) does nothing: the lock it takes stays valid until
 * swi_ticker_fini. */
void swi_ticker_stop(swi_ticker *t);
/* Stops the ticker if need be and releases its lock; for its owner's free,
 * once nothing can kick it any more. Safe on a zeroed ticker. */
void swi_ticker_fini(swi_ticker *t);

/* ---------------------------------------------------------------- due times */

/* Cells per chunk of a due table (below); cell 0 of each chunk is its
 * low-water mark, given to no object. */
#define SWI_DUETAB_CHUNK 256

/* The low-water mark of the chunk a cell is in: chunks' cells are aligned
 * to their size (swi_duetab's chunks are allocated so). */
static inline int64_t *
swi_due_mark(int64_t *due)
{
    return (int64_t *)((uintptr_t)due & ~(uintptr_t)(SWI_DUETAB_CHUNK * sizeof(int64_t) - 1));
}

/* Lowers *p (a chunk's mark, or a cell) to `at` if it is later, never
 * raising it: 1 if it lowered it. */
static inline int
swi_due_lower(int64_t *p, int64_t at)
{
    int64_t cur = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (at < cur &&
           !__atomic_compare_exchange_n(p, &cur, at, 1, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
    return at < cur;
}

/* Sets a cell's due time, and lowers its chunk's mark to it if it is below
 * (a scan then looks at the chunk by that time). The calls for one cell
 * must be serialised (its object's lock). swi_due_sooner and swi_due_soon,
 * which only bring a time forward, keep the mark right from any thread;
 * but a set running at the same time may replace the time they wrote (the
 * library calls them under the object's lock too).
 *
 * An earlier time is sequentially consistent against the scan, which
 * resets the mark before it reads the cells: either the scan reads this
 * time, or this call sees the reset mark and lowers it. A later time needs
 * neither: the mark is at or below the time it replaces (the last set, read
 * here since the calls are serialised, or a time brought forward since,
 * which lowered the mark itself), and a scan that reads either time leaves
 * the mark at or below it. Two unserialised calls could store a time below
 * the one another call's scan saw, without lowering the mark. */
static inline void
swi_due_set(int64_t *due, int64_t at)
{
    int64_t cur = __atomic_load_n(due, __ATOMIC_RELAXED);
    /* Already so (a stream plans each item: mostly the same millisecond):
     * the mark is at or below it already, or the write that brought it
     * forward is lowering the mark now. */
    if (cur == at)
        return;
    if (at > cur) { /* an idle stream's beat, an item's next plan: no fence */
        __atomic_store_n(due, at, __ATOMIC_RELAXED);
        return;
    }
    __atomic_store_n(due, at, __ATOMIC_SEQ_CST);
    (void)swi_due_lower(swi_due_mark(due), at);
}

/* Brings a cell's due time forward to `at` if it is later (never later),
 * and its chunk's mark with it. From any thread. */
static inline void
swi_due_sooner(int64_t *due, int64_t at)
{
    if (swi_due_lower(due, at))
        (void)swi_due_lower(swi_due_mark(due), at);
}

/* The object needs a look at the next scan. From any thread. */
static inline void
swi_due_soon(int64_t *due)
{
    swi_due_sooner(due, 0);
}

/* 1 if the object has something due by t. */
static inline int
swi_due_by(const int64_t *due, int64_t t)
{
    return __atomic_load_n(due, __ATOMIC_SEQ_CST) <= t;
}

/* Fills vec with all of the map's values, calling ref(val) on each one
 * taken. The caller holds the map's lock, and later drops the references. */
void swi_idmap_snapshot_all(const swi_idmap *m, swi_ptrvec *vec, void (*ref)(void *val));

/* A due table: the due times of many objects side by side, so that a scan
 * reads 8 contiguous bytes per object instead of one cache line of each
 * (10,000 idle streams scanned every 25 ms cost a few % of a core when the
 * scan walked the objects themselves).
 *
 * Each object gets a cell (swi_duetab_add) whose address never changes: the
 * object keeps it and writes its due time there without a lock: with
 * swi_due_set under its own lock (one writer at a time), with
 * swi_due_soon / swi_due_sooner from any thread. swi_duetab_detach makes a
 * scan skip the object from then on (it left its owner's table) while the
 * object may still write to the cell; swi_duetab_release returns the cell
 * when the object is freed and can no longer write to it. A cell is never
 * given to another object before its release, so a late write cannot land
 * in another object's due time.
 *
 * The cells come in chunks of SWI_DUETAB_CHUNK - 1, each chunk with a
 * low-water mark (its cell 0): no attached cell of the chunk is due
 * before it. A write that lowers a cell below the mark lowers the mark
 * (swi_due_set, swi_due_sooner), and so does attaching a cell; a scan
 * skips a chunk whose mark is later than its time, and otherwise reads the
 * cells and sets the mark to the earliest attached one. Idle objects, whose
 * due times only move later, then cost a scan one read per chunk until the
 * earliest of them falls due (10,000 idle streams: every ~1 s rather than
 * every 25 ms).
 *
 * Locks: the table's own mutex, a leaf (held for add, detach, release and
 * a scan, never while calling out except ref, which must only count). */
typedef struct swi_duechunk {
    int64_t due[SWI_DUETAB_CHUNK]; /* atomic; INT64_MAX while free; [0]: the mark. First in the
                                      chunk, which is aligned to this array's size */
    void *val[SWI_DUETAB_CHUNK];   /* the object; NULL while free or detached ([0]: never) */
} swi_duechunk;
_Static_assert(sizeof(swi_duechunk) % sizeof(((swi_duechunk *)0)->due) == 0,
               "a chunk's size is a multiple of its alignment (aligned_alloc)");
typedef struct swi_duetab {
    pthread_mutex_t mu;
    swi_duechunk **chunks;
    size_t nchunks, chunks_cap;
    uint32_t *free; /* released cells, reused last-in first-out */
    size_t nfree, free_cap;
    size_t attached; /* cells with an object a scan may take */
} swi_duetab;

void swi_duetab_init(swi_duetab *t);
/* Frees the table. Every cell must have been released. */
void swi_duetab_fini(swi_duetab *t);
/* A cell with the due time `due`, for val (NULL: detached until
 * swi_duetab_attach). NULL: no memory. */
int64_t *swi_duetab_add(swi_duetab *t, void *val, int64_t due);
/* Scans take val from now on. */
void swi_duetab_attach(swi_duetab *t, int64_t *cell, void *val);
/* How many cells have an object attached (under t->mu: a look that finds 0
 * is ordered before any later attach). */
size_t swi_duetab_attached(swi_duetab *t);
/* Scans skip the cell's object from now on (the cell stays the object's). */
void swi_duetab_detach(swi_duetab *t, int64_t *cell);
/* The object is gone: the cell may be given out again. NULL is a no-op. */
void swi_duetab_release(swi_duetab *t, int64_t *cell);
/* Fills vec with the attached objects with something due by `by`, calling
 * ref(val) on each one taken (as many as vec can hold if memory is short). */
void swi_duetab_snapshot(swi_duetab *t, swi_ptrvec *vec, int64_t by, void (*ref)(void *val));

/* ---------------------------------------------------------------- peers */

typedef char swi_peer_id[SW_MAX_TOKEN + 1];

typedef struct swi_peer {
    swi_peer_id id;
    unsigned users;       /* streams that need this peer: probed while > 0 */
    int outstanding;      /* a probe is out */
    int64_t sent_ms;      /* when the last probe went out */
    int64_t last_ok_ms;   /* the last sign of life */
    unsigned misses;      /* unanswered probes in a row */
    int64_t miss_from_ms; /* when the first of them went out (misses > 0) */
    int suspect;          /* told it may be gone: the next probe is due now, one miss decides */
    uint64_t probe_id;    /* the id of the last probe sent: an answer must echo it */
    int nr_pending;       /* a probe met "no responders"; not yet confirmed */
    int64_t nr_first_ms;  /* when that first bounced probe went out */
    uint64_t beat_inc;    /* the incarnation a current probe answer named (0: none yet) */
    uint64_t beat_last;   /* heartbeat batches need a counter above this */
    int beat_legacy;      /* its current answer named no incarnation: a worker from before
                             the counters, whose batches (incarnation 0) are taken as they come */
    int probe_soon;       /* probe at the next round (a batch named an incarnation not learned
                             yet); not a suspicion: misses count as usual */
    uint64_t gen;         /* this entry's: a peer removed and added again gets a new one */
} swi_peer;

typedef struct swi_peers {
    swi_peer *v;
    size_t n, cap;
    unsigned interval_ms; /* probe each peer this often */
    unsigned timeout_ms;  /* an unanswered probe is a miss after this long */
    unsigned misses;      /* this many misses in a row: lost */
    int64_t settle_ms;    /* after this side's connection comes back, probes sent within
                             this long prove nothing (peers are still reconnecting and
                             resubscribing); SWI_PEERS_SETTLE_MS by default */
    uint64_t probe_seq;   /* the last probe id given out (starts at a random value) */
    uint64_t gen_seq;     /* the last entry generation given out */
    int64_t nr_grace_ms;  /* "no responders" proves a peer gone only when a probe sent this
                             long after the first bounced one bounces too: a live peer whose
                             NATS node died is briefly without subscriptions while it
                             reconnects elsewhere; SWI_PEERS_NR_GRACE_MS by default */
} swi_peers;

#define SWI_PEERS_SETTLE_MS 2000
#define SWI_PEERS_NR_GRACE_MS 100

/* A lost peer and how long it had been silent: since its last sign of
 * life, and since the first probe it left unanswered went out (or bounced;
 * never before the last sign of life). A sign of life between the two (a
 * registry refresh) may come from a peer that froze or died right after
 * it; one after the second most likely from a peer that is alive and
 * cannot be reached (or from a registry watch that lagged). */
typedef struct swi_peer_lost {
    swi_peer_id id;
    int64_t silent_ms;
    int64_t unanswered_ms;
} swi_peer_lost;

void swi_peers_init(swi_peers *p, unsigned interval_ms, unsigned timeout_ms, unsigned misses);
void swi_peers_fini(swi_peers *p);
swi_peer *swi_peers_find(swi_peers *p, const char *id);
/* One more stream needs the peer (it is added, first probe one interval
 * from now). 0, or -1 out of memory. */
int swi_peers_use(swi_peers *p, const char *id, int64_t now);
/* One stream less; the peer leaves the table when none needs it. */
void swi_peers_release(swi_peers *p, const char *id);
/* Removes the peer whatever its use count (it is lost). */
void swi_peers_release_all(swi_peers *p, const char *id);
/* Someone says the peer may be gone (the registry removed it): probe it at
 * the next round, and let one miss decide. */
void swi_peers_suspect(swi_peers *p, const char *id);
/* 1 if a probe to the peer is out (sent, neither answered nor timed out). */
int swi_peers_probe_out(swi_peers *p, const char *id);
/* 1 if the peer's loss is being decided: it is suspect, or a "no
 * responders" waits to be confirmed (swi_peers_answer). */
int swi_peers_deciding(swi_peers *p, const char *id);
/* Probe the peer at the next round, whatever the interval; not a
 * suspicion: its answer, bounce or misses decide as usual. */
void swi_peers_probe_soon(swi_peers *p, const char *id);

/* One round at `now`.
 *   - A probe out longer than timeout_ms is a miss, unless alive(arg, id,
 *     sent_ms) reports a sign of life since it was sent (a peer that
 *     streams is alive, answered or not), or this side's own connection was
 *     not up for the whole time the probe was out (up_since_ms < 0: down;
 *     up_since_ms > sent_ms: it came back since): then it is forgotten, not
 *     counted. `misses` misses in a row (one if suspect) make the peer lost:
 *     it goes into lost[] (at most max_lost; the rest are judged next round)
 *     with its misses reset; the caller ends its streams and releases it.
 *   - While the connection is down no probe is sent. Otherwise every peer
 *     with no probe out whose interval has passed (or that is suspect) gets
 *     one: it goes into send[] (at most max_send) and is marked out.
 * alive may be NULL. Returns the number of probes to send; *nlost gets the
 * number of lost peers. */
size_t swi_peers_round(swi_peers *p, int64_t now, int64_t up_since_ms,
                       int (*alive)(void *arg, const char *id, int64_t since), void *arg,
                       swi_peer_id *send, size_t max_send, swi_peer_lost *lost, size_t max_lost,
                       size_t *nlost);

/* A probe's answer. An answer means alive (misses reset, suspicion
 * lifted). "No responders" makes the peer suspect (probed again at the next
 * round); it is lost (returns 1, *silent_ms and, if not NULL,
 * *unanswered_ms as in swi_peer_lost) when "no responders" also
 * answers a probe sent nr_grace_ms or more after the first bounced one, with
 * no answer in between. A probe sent before this side's connection last
 * came back and settled (up_since_ms + settle_ms > sent_ms) proves nothing.
 * Returns 0 otherwise, and for a peer not in the table. */
/* When swi_peers_round next has something to do for some peer, given what
 * is known at now: a probe out times out at sent_ms + timeout_ms; a suspect
 * peer, or one to ask soon, is due now; any other is probed at sent_ms +
 * interval_ms. INT64_MAX with no peer. */
int64_t swi_peers_next_due(const swi_peers *p, int64_t now);

/* The probe id of the last probe swi_peers_round sent to id (0 if none):
 * the caller puts it in the probe. */
uint64_t swi_peers_probe_id(swi_peers *p, const char *id);
/* 1 if probe_id answers the last probe sent to id: a recorded answer
 * replayed later (another id) is not an answer and must be ignored. */
int swi_peers_is_current(swi_peers *p, const char *id, uint64_t probe_id);
int swi_peers_answer(swi_peers *p, const char *id, int no_responders, int64_t now,
                     int64_t up_since_ms, int64_t *silent_ms, int64_t *unanswered_ms);

/* Heartbeat batches' replay defence. A current probe answer (one that
 * swi_peers_is_current accepted) names the peer's incarnation and the
 * counter of the last batch it sent: learn it. A batch is then taken only
 * if it names that incarnation and a counter above every one taken (and
 * above the answer's, less one); swi_peers_beats_take says 1 (and records
 * the counter) or 0. A peer not in the table, or not answered yet, takes
 * nothing: a batch recorded earlier, or sent by a process that has since
 * restarted, never counts. */
void swi_peers_beats_learn(swi_peers *p, const char *id, uint64_t incarnation, uint64_t counter);
/* (An answer with incarnation 0 comes from a worker built before the
 * counters: its batches, which carry none either, are then taken without
 * the check, until an answer names an incarnation.) A batch refused because
 * it names an incarnation not learned yet (a new peer, or one that
 * restarted) has the peer probed at the next round, whatever the interval,
 * so its batches count from the answer on. */
int swi_peers_beats_take(swi_peers *p, const char *id, uint64_t incarnation, uint64_t counter);

/* ---------------------------------------------------------------- idq */

/* A bounded, expiring set of request ids, each with a short tag (a router
 * id): at most `max` entries, each forgotten `ttl_ms` after it was added
 * (or when it is taken, or pushed out by a newer one when full). Lookups by
 * a keyed hash; memory max x (one entry + one table slot). Not thread-safe:
 * the owner locks. */
typedef struct swi_idq_entry {
    uint8_t id[16];
    char tag[65];
    int64_t at;
    int live; /* still in the map */
} swi_idq_entry;

typedef struct swi_idq {
    swi_idmap map;
    swi_idq_entry **q; /* ring of max, allocated on the first add */
    size_t head, n, max;
    int64_t ttl_ms;
} swi_idq;

/* 0, or -1 without memory. */
int swi_idq_init(swi_idq *q, size_t max, int64_t ttl_ms);
/* Adds id (no-op if present); drops expired and taken entries, and the
 * oldest when full. */
void swi_idq_add(swi_idq *q, const uint8_t *id, const char *tag, int64_t now);
/* The live entry for id, or NULL (also when it expired). */
swi_idq_entry *swi_idq_find(swi_idq *q, const uint8_t *id, int64_t now);
/* 1 and forgets it if id is there with this tag (tag NULL: any), else 0. */
int swi_idq_take(swi_idq *q, const uint8_t *id, const char *tag);
/* The 16-byte key of the pair (id, tag) (a BLAKE2b digest of both), for a
 * set that keeps one entry per pair rather than per id: added and taken
 * by it (with the tag, as usual), an entry of one tag does not stand in
 * the way of another's for the same id. tag NULL is "". */
void swi_idq_pair_key(uint8_t key[16], const uint8_t *id, const char *tag);
void swi_idq_fini(swi_idq *q);

#endif
