/* router/registry_int.h -- what the registry's files share: the handle,
 * its view of the store, our own entries, the event queue, and the
 * functions one file calls in another. Internal to router/; the public
 * interface is <streamwire/registry.h>. Threads and locks: registry.c. */
#ifndef SW_ROUTER_REGISTRY_INT_H
#define SW_ROUTER_REGISTRY_INT_H

#include "common/sched.h"
#include "common/sw_common.h"
#include "proto/sw_codec.h"
#include "transport/envelope.h"
#include "transport/sw_transport.h"
#include <streamwire/registry.h>

#define REG_MAX_VALUE (64 * 1024)
#define REG_TICK_MS 50
#define REG_FORGET_LEASES 20 /* a dead entry is forgotten after this many leases */
#define REG_PING_MS 250      /* the store is asked at most this often while leases lapse */
#define REG_REST_MAX_MS 1000 /* the ticker, with nothing due sooner, rests this long at most */
#define REG_KEY_MAX (SW_MAX_ENDPOINT + SW_MAX_TOKEN + 2)

typedef struct reg_view {
    char key[REG_KEY_MAX];
    swp_instance *info;
    uint64_t rev;
    int64_t seen_ms;  /* monotonic time this revision counts from */
    int64_t grace_ms; /* its lease does not lapse before this (the store came back) */
    int live;
    /* What the watchers were told (mu): `told` is the info they last heard
     * of as live (NULL: absent), with its revision; it may be `info` or an
     * older one kept for them. A change sets `dirty` and the ticker tells
     * it (swr_reg_tick): telling needs no memory, so no change is lost
     * for lack of it. `lapsed`: the entry stopped being live since it was
     * told (REMOVED is owed even if it is live again). `gone`: deleted
     * from the store, kept only until its REMOVED is told. Every watcher
     * knows the same: a new one is given the changes not yet told along
     * with the others, then the view (sw_registry_watch). */
    swp_instance *told;
    uint64_t told_rev;
    uint64_t dirty; /* 0: clean; else when it changed (reg->dirty_seq) */
    int lapsed, gone;
    /* A dead report of ours was refused (the entry looked refreshed, or
     * our view was behind the store): written when its lease lapses here. */
    int report_pending;
    char report_reason[96];
} reg_view;

/* A key deleted from the store: its revision is remembered for a while, so
 * that a value of the key from before the delete, delivered late (the
 * list and the watch run on different threads), does not bring the entry
 * back. */
#define REG_TOMBS_MAX 1024 /* remembered at most; the oldest is dropped first */
typedef struct reg_tomb {
    char key[REG_KEY_MAX];
    uint64_t rev;  /* the delete's revision */
    int64_t at_ms; /* when it was seen (monotonic) */
} reg_tomb;

typedef struct reg_own {
    char key[REG_KEY_MAX];
    char instance[SW_MAX_TOKEN + 1];
    char endpoint[SW_MAX_ENDPOINT + 1];
    char req_subj[SWP_MAX_SUBJECT + 1];
    char ctl_subj[SWP_MAX_SUBJECT + 1];
    int64_t started_unix_ms;
    int draining;
    uint64_t rev;
    int64_t next_refresh_ms;
    uint64_t incarnation; /* random per registration, never 0 */
    uint64_t generation;  /* +1 each time it registers again after a removal */
} reg_own;

/* What sw_registry_watch queues, all or nothing, on its caller's thread:
 * the changes not yet told, for the watchers there were, then the new
 * watcher's ADDED snapshot of the view. Changes after it are told to every
 * watcher from the view (reg_view's `told`). */
typedef struct reg_event {
    struct reg_event *next;
    int lo, hi; /* for the watchers with an id in [lo, hi) */
    sw_registry_event ev;
    swp_instance *info; /* owned copy */
    uint64_t rev;
    int64_t age_ms;
} reg_event;

/* A log line from the backend's callback, written later by the ticker:
 * the memory backend calls swr_reg_on_entry inside another handle's put or
 * del, under that handle's wmu, where no user callback may run. */
typedef struct reg_note {
    struct reg_note *next;
    sw_log_level level;
    char msg[];
} reg_note;
#define REG_NOTES_MAX 256 /* queued at most; more are counted and dropped */

typedef struct reg_watcher {
    int id;
    sw_registry_watch_fn fn;
    void *arg;
} reg_watcher;

struct sw_registry {
    const sw_registry_backend *be;
    sw_registry_stats st; /* counters (mu) */
    char bucket[SW_MAX_TOKEN + 1];
    const swt_sealer *sealer; /* the connection's: values sealed under their key (or NULL) */
    sw_conn *conn;            /* NULL for a backend that needs none */
    void *bs;
    void *bw;
    swi_logger log;
    unsigned lease_ms, refresh_ms;
    char host[64];
    /* Serialises every write of our own entries (register, keep-alive,
     * draining, deregister), so a refresh in flight can neither resurrect a
     * deregistered entry nor undo a draining flag. Order: wmu, then mu
     * (see the file's header). */
    pthread_mutex_t wmu;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    reg_view *view;
    size_t nview, capview;
    reg_tomb *tomb; /* deletes (mu) */
    size_t ntomb, captomb;
    reg_own *own;
    size_t nown, capown;
    reg_watcher *w;
    size_t nw, capw;
    int next_id;
    int dispatching;    /* watcher id whose callback runs now */
    unsigned ndirty;    /* view entries with a change not yet told (mu) */
    uint64_t dirty_seq; /* the last change's number (reg_view.dirty) */
    /* The info a callback is being given right now (mu): not freed while
     * it runs, whatever the view does meanwhile (swr_reg_info_drop). */
    swp_instance *delivering;
    reg_event *eh, *et;     /* snapshots for new watchers */
    reg_note *nh, *nt;      /* log lines for the ticker to write (mu) */
    unsigned nnotes;        /* queued */
    unsigned notes_dropped; /* not queued (REG_NOTES_MAX, or no memory), not yet logged */
    swi_ticker ticker;      /* runs swr_reg_tick */
    /* The ticker rests until then, nothing being due sooner (mu; 0: it
     * looks again within REG_TICK_MS). A change that brings a deadline
     * before it kicks the ticker (swr_reg_due). */
    int64_t rest_until;
    uint64_t ticks; /* calls of swr_reg_tick (atomic; router/chaos.h) */
    int stopping;
    /* The store's health, for leases (mu): the last time anything was seen
     * written to it (a newer revision, or one of our writes), the last
     * ping, and whether it failed. */
    int64_t activity_ms, ping_ms;
    int store_down;
    unsigned held; /* lapsed entries held in the last look (logged once) */
    int log_back;  /* the store answers again: to be logged */
};

/* registry.c */
void swr_reg_count(sw_registry *reg, uint64_t *field);   /* takes mu */
const char *swr_registry_bucket(const sw_registry *reg); /* for router/metrics.c */

/* registry_view.c: the view of the store, fed by the backend's list and
 * watch */
swp_instance *swr_reg_info_copy(const swp_instance *in);
/* Marks v changed, for the ticker to tell the watchers (mu held). */
void swr_reg_dirty(sw_registry *reg, reg_view *v);
/* Frees p unless v (NULL: none) or a running callback still holds it (mu
 * held). */
void swr_reg_info_drop(sw_registry *reg, const reg_view *v, swp_instance *p);
/* The next step that brings watchers told `told` (NULL: absent; lapsed:
 * it stopped being live since) towards v as it is: SW_REGISTRY_REMOVED
 * (first, even if live again), _ADDED, _UPDATED (only the draining flag
 * differs), or 0 when nothing is owed. Pure; the one rule for the ticker's
 * steps (reg_tell) and a new watcher's pending ones (sw_registry_watch). */
int swr_reg_step(const reg_view *v, const swp_instance *told, int lapsed);
/* Takes v's state as told (mu held): sw_registry_watch has queued the
 * steps for the watchers. A deleted entry (gone) is then dropped. */
void swr_reg_settle(sw_registry *reg, reg_view *v);
/* v stops being live (lease, delete, dead report): REMOVED is owed if it
 * was told (mu held). */
void swr_reg_view_lapse(sw_registry *reg, reg_view *v);
reg_view *swr_reg_view_find_key(sw_registry *reg, const char *key);           /* mu held */
reg_view *swr_reg_view_find_instance(sw_registry *reg, const char *instance); /* mu held */
/* Drops v from the view; one whose REMOVED is still owed is kept, as
 * `gone`, until the ticker has told it (mu held). */
void swr_reg_view_remove(sw_registry *reg, reg_view *v); /* mu held */
/* Drops a dead entry the store may still hold (its worker died unreported:
 * no delete, the value stays until the bucket's max age), remembering its
 * revision as a delete's, so the value delivered again (a watch made again
 * replays every key's last value) is not taken for a new sighting. */
void swr_reg_view_forget(sw_registry *reg, reg_view *v, int64_t now);      /* mu held */
reg_own *swr_reg_own_find(sw_registry *reg, const char *key);              /* mu held */
void swr_reg_store_back(sw_registry *reg, int64_t now);                    /* mu held */
void swr_reg_on_entry(void *arg, const sw_registry_entry *e, int deleted); /* backend callback */
/* Queues a log line for the ticker (takes mu; not with mu held). */
void swr_reg_note(sw_registry *reg, sw_log_level level, const char *fmt, ...) SWI_PRINTF(3, 4);

/* registry_lease.c: keep-alives, lease expiry, the store's health and
 * event delivery, on the registry's ticker */
sw_err swr_reg_seal(const sw_registry *reg, const char *key, uint8_t **buf, size_t *len);
sw_err swr_reg_own_encode(sw_registry *reg, const reg_own *o, uint8_t **buf, size_t *len);
void swr_reg_refresh(sw_registry *reg, const char *key); /* takes wmu, then mu */
void swr_reg_tick(void *arg, int64_t now);
/* Something falls due at `at` (monotonic ms): kicks the ticker if it rests
 * past it (mu held). */
void swr_reg_due(sw_registry *reg, int64_t at);
/* How long a lapsed entry may be held while the store does not answer
 * (registry.h: SW_REGISTRY_HOLD_MAX_LEASES leases, 30 s at least). Pure. */
int64_t swr_reg_hold_max(int64_t lease);
/* The lease an entry is judged by: its worker's, else this handle's. */
int64_t swr_reg_view_lease(const sw_registry *reg, const reg_view *v);

/* registry_report.c: dead reports (no lock held on entry) */
sw_err swr_reg_report(sw_registry *reg, const char *instance_id, uint64_t revision,
                      int64_t silent_ms, const char *reason);
void swr_reg_report_later(sw_registry *reg, const char *instance_id, const char *reason);

#endif
