/* router/sw_pool.h -- instance selection for the egress: the router layer's
 * interface. A pool knows the live instances (from a registry watch) and
 * their local quarantine; it picks one per request by policy and turns "this instance is dead" into
 * a local quarantine plus a registry report, so every router learns it. */
#ifndef SW_POOL_H
#define SW_POOL_H

#include "common/sw_common.h"
#include <streamwire/registry.h>

typedef struct swr_pool swr_pool;

typedef struct swr_pool_opts {
    sw_registry *registry; /* may be NULL: only direct routing then */
    sw_policy policy;
    unsigned quarantine_ms; /* first quarantine; doubles on repeats up to 30 s */
    swi_logger log;
    /* Called (on the registry thread, no pool lock held) when the registry
     * removes an instance: reported dead elsewhere, deregistered, or lease
     * expired. The egress probes it at once. May be NULL. */
    void (*on_removed)(void *arg, const char *instance);
    void *on_removed_arg;
} swr_pool_opts;

sw_err swr_pool_create(swr_pool **out, const swr_pool_opts *o);
/* Stop registry events (and so on_removed calls) for good; returns once a
 * callback in progress has finished. Owner's thread only; idempotent.
 * swr_pool_destroy calls it too. */
void swr_pool_detach(swr_pool *p);
/* Detaches, stops the reporter thread, and sends the dead reports still
 * queued from this thread, giving up on the rest at the store's first
 * failure (so it blocks for one JetStream timeout at most beyond the
 * report the reporter was writing). After it returns the pool uses its
 * registry no more: the registry may be closed. Reports made later are
 * dropped. Owner's thread only; idempotent; swr_pool_destroy calls it. */
void swr_pool_stop(swr_pool *p);
void swr_pool_destroy(swr_pool *p);

/* The number of streams the caller has open to an instance. The pool keeps
 * no such count: the egress owns it (its peer table, which probes every
 * instance in use), and lends it to least_inflight through this. */
typedef unsigned (*swr_load_fn)(void *arg, const char *instance);

/* Picks an instance serving endpoint into out (SW_OK), or SW_NO_INSTANCES.
 * load (may be NULL: then least_inflight sees equal loads) is called with
 * the pool's lock held, so it must not call into the pool; the egress calls
 * this with its own lock held, so that the pick and its count are one step
 * (lock order: the egress's r->mu, then the pool's). */
sw_err swr_pool_pick(swr_pool *p, const char *endpoint, swr_load_fn load, void *load_arg,
                     char out[SW_MAX_TOKEN + 1]);

/* The longest local quarantine: sw_router_opts.quarantine_ms doubles on
 * repeats up to this (and a longer quarantine_ms is cut to it). */
#define SWR_QUARANTINE_MAX_MS 30000
/* The length of a quarantine that follows one of prev_ms (0: the first):
 * base_ms, then twice the last, never above SWR_QUARANTINE_MAX_MS. Pure. */
unsigned swr_pool_backoff(unsigned prev_ms, unsigned base_ms);

/* Quarantines the instance here (with backoff). Returns 1 when this starts
 * a new quarantine of an instance the registry lists as live: then the
 * caller should swr_pool_report it. */
int swr_pool_quarantine(swr_pool *p, const char *instance);
/* Reports the instance dead in the registry, from the pool's reporter
 * thread (a registry write may block; the caller does not wait). silent_ms:
 * how long the instance has left this router's questions unanswered (since
 * the first probe it did not answer went out); the registry refuses the
 * report if it saw the entry refreshed in that time (the instance is most
 * likely alive and cut off from this router), and writes it should the
 * entry then go a whole lease without a refresh. */
void swr_pool_report(swr_pool *p, const char *instance, const char *reason, int64_t silent_ms);
/* Both: the instance is dead. Safe to call repeatedly. */
void swr_pool_dead(swr_pool *p, const char *instance, const char *reason);

/* 1 if the instance is quarantined here right now. */
int swr_pool_quarantined(swr_pool *p, const char *instance);

/* The instances the table holds now (live, or quarantined): for tests. */
size_t swr_pool_size(swr_pool *p);

#endif
