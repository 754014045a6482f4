/* router/sw_pool.h -- instance selection for the egress: the router layer's
 * interface. A pool knows the live instances (from a registry watch), their
 * local quarantine, and how many streams this frontend has open to each; it
 * picks one per request by policy and turns "this instance is dead" into a
 * local quarantine plus a registry report, so every router learns it. */
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
void swr_pool_destroy(swr_pool *p);

/* Picks an instance serving endpoint into out (SW_OK), or SW_NO_INSTANCES.
 * Counts one stream in flight on it (release with swr_pool_done). */
sw_err swr_pool_pick(swr_pool *p, const char *endpoint, char out[SW_MAX_TOKEN + 1]);
/* Counts a stream on a directly named instance. */
void swr_pool_begin(swr_pool *p, const char *instance);
void swr_pool_done(swr_pool *p, const char *instance);

/* Quarantines the instance here (with backoff). Returns 1 when this starts
 * a new quarantine of an instance the registry lists as live: then the
 * caller should swr_pool_report it. */
int swr_pool_quarantine(swr_pool *p, const char *instance);
/* Reports the instance dead in the registry, from the pool's reporter
 * thread (a registry write may block; the caller does not wait). silent_ms:
 * how long the instance has shown no sign of life; the registry refuses the
 * report if it saw the entry refreshed in that time. */
void swr_pool_report(swr_pool *p, const char *instance, const char *reason, int64_t silent_ms);
/* Both: the instance is dead. Safe to call repeatedly. */
void swr_pool_dead(swr_pool *p, const char *instance, const char *reason);

/* 1 if the instance is quarantined here right now. */
int swr_pool_quarantined(swr_pool *p, const char *instance);

#endif
