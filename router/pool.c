/* router/pool.c -- see sw_pool.h. The table is small (instances of a
 * cluster), so it is a flat array searched linearly under one lock.
 *
 * Threads: pool_on_event runs on the registry thread (a registry watch
 * callback, no registry lock held); every other function on the caller's.
 * Lock: one, p->mu, a leaf: nothing else is locked and no registry call is
 * made while it is held (so registry locks are never taken under it, and it
 * is taken under none of them), except once, in swr_pool_create, before
 * the pool is shared: it holds p->mu across its watch and its first list
 * (which take and release the registry's lock, and call nothing), so that
 * the registry's thread, delivering the watch's events, waits for the
 * table to be seeded. No user callback (the log callback, or on_removed)
 * runs with it held: what happened under it is noted and logged or
 * reported after the unlock. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sched.h"
#include "router/sw_pool.h"

#ifdef SW_CHAOS
extern void (*swx_pool_seed_fn)(void *arg); /* router/chaos.c */
extern void *swx_pool_seed_arg;
#endif

typedef struct pool_inst {
    char id[SW_MAX_TOKEN + 1];
    char endpoint[SW_MAX_ENDPOINT + 1];
    uint64_t revision;
    int live; /* the registry says it is there */
    int draining;
    int64_t quarantine_until; /* monotonic ms; 0 = none */
    unsigned backoff_ms;
} pool_inst;

struct swr_pool {
    pthread_mutex_t mu;
    sw_registry *reg;
    int watch_id;
    int detached; /* swr_pool_detach ran: no more registry events */
    sw_policy policy;
    unsigned quarantine_ms;
    swi_logger log;
    void (*on_removed)(void *arg, const char *instance);
    void *on_removed_arg;
    pool_inst *v;
    size_t n, cap;
    size_t rr; /* round-robin cursor */
    /* Dead reports wait here for the reporter thread: a registry write can
     * block for the JetStream timeout, and must not stall the caller (a
     * router's timer or probe-reply thread). p->rmu is a leaf lock. */
    pthread_mutex_t rmu;
    struct pool_report *rq;
    size_t nrq, caprq;
    swi_ticker reporter;
    int stopping; /* swr_pool_stop began: the reporter thread leaves the rest (atomic) */
    int stopped;  /* swr_pool_stop ran */
};

typedef struct pool_report {
    char id[SW_MAX_TOKEN + 1];
    char reason[96];
    int64_t silent_since; /* monotonic ms: no sign of life from then on */
} pool_report;

static void pool_report_tick(void *arg, int64_t now);
static void pool_report_run(swr_pool *p, int last);

const char *
sw_policy_name(sw_policy p)
{
    switch (p) {
    case SW_POLICY_ROUND_ROBIN:
        return "round_robin";
    case SW_POLICY_RANDOM:
        return "random";
    case SW_POLICY_LEAST_INFLIGHT:
        return "least_inflight";
    }
    return "unknown";
}

sw_err
sw_policy_from_name(const char *name, sw_policy *out)
{
    static const sw_policy all[] = {SW_POLICY_ROUND_ROBIN, SW_POLICY_RANDOM,
                                    SW_POLICY_LEAST_INFLIGHT};
    if (name == NULL || out == NULL)
        return SW_EINVAL;
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        if (strcmp(name, sw_policy_name(all[i])) == 0) {
            *out = all[i];
            return SW_OK;
        }
    return SW_EINVAL;
}

static pool_inst *
pool_find(swr_pool *p, const char *id)
{
    for (size_t i = 0; i < p->n; i++)
        if (strcmp(p->v[i].id, id) == 0)
            return &p->v[i];
    return NULL;
}

/* Forgets instances that are gone (or were never in the registry),
 * unused and out of quarantine for as long as their last quarantine lasted
 * (p->mu held), so that the table does not grow with every worker that
 * ever lived: on each registry event, and on each quarantine (a router
 * without a registry quarantines the instances it loses, and has no
 * events). The wait keeps the backoff of an instance lost again soon
 * after its quarantine (a direct route's, which no registry lists): it was
 * forgotten the moment its quarantine ended, and its next one started
 * again from quarantine_ms, never doubling (test_registry_mem
 * pool_quarantine_doubles). */
static void
pool_prune(swr_pool *p, int64_t now)
{
    for (size_t i = 0; i < p->n;) {
        pool_inst *g = &p->v[i];
        if (!g->live &&
            (g->quarantine_until == 0 || now >= g->quarantine_until + (int64_t)g->backoff_ms))
            *g = p->v[--p->n];
        else
            i++;
    }
}

static pool_inst *
pool_get(swr_pool *p, const char *id)
{
    pool_inst *e = pool_find(p, id);
    if (e != NULL)
        return e;
    if (p->n == p->cap) {
        size_t ncap = p->cap ? p->cap * 2 : 16;
        pool_inst *nv = realloc(p->v, ncap * sizeof(*nv));
        if (nv == NULL)
            return NULL;
        p->v = nv;
        p->cap = ncap;
    }
    e = &p->v[p->n++];
    memset(e, 0, sizeof(*e));
    snprintf(e->id, sizeof(e->id), "%s", id);
    return e;
}

/* An event's change to the table (p->mu held); *removed: it took a live
 * instance away, *lifted: it ended a quarantine. The caller prunes. */
static void
pool_apply(swr_pool *p, sw_registry_event ev, const sw_instance *inst, int *removed, int *lifted)
{
    pool_inst *e = pool_get(p, inst->instance_id);
    if (e != NULL) {
        snprintf(e->endpoint, sizeof(e->endpoint), "%s", inst->endpoint);
        e->revision = inst->revision;
        e->draining = inst->draining;
        if (ev == SW_REGISTRY_REMOVED) {
            *removed = e->live;
            e->live = 0;
        } else {
            if (ev == SW_REGISTRY_ADDED && e->quarantine_until != 0) {
                /* It registered again: proof of life beats our quarantine. */
                *lifted = 1;
                e->quarantine_until = 0;
            }
            e->live = 1;
        }
    }
}

static void
pool_on_event(void *arg, sw_registry_event ev, const sw_instance *inst)
{
    swr_pool *p = arg;
    int removed = 0, lifted = 0;
    pthread_mutex_lock(&p->mu);
    pool_apply(p, ev, inst, &removed, &lifted);
    pool_prune(p, swi_now_ms());
    pthread_mutex_unlock(&p->mu);
    if (lifted)
        swi_log(&p->log, SW_LOG_INFO, "instance %s is back; lifting its quarantine",
                inst->instance_id);
    if (removed && p->on_removed != NULL)
        p->on_removed(p->on_removed_arg, inst->instance_id);
}

sw_err
swr_pool_create(swr_pool **out, const swr_pool_opts *o)
{
    swr_pool *p = calloc(1, sizeof(*p));
    sw_err rv;
    if (p == NULL)
        return SW_ENOMEM;
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->rmu, NULL);
    p->reg = o->registry;
    p->policy = o->policy;
    p->quarantine_ms = o->quarantine_ms ? o->quarantine_ms : 1000;
    p->log = o->log;
    p->on_removed = o->on_removed;
    p->on_removed_arg = o->on_removed_arg;
    /* Start round robin at a random place, so that many short-lived routers
     * (one request each) still spread their load. */
    swi_random(&p->rr, sizeof(p->rr));
    if (p->reg != NULL && swi_ticker_start(&p->reporter, 1000, pool_report_tick, p) != 0) {
        rv = SW_ENOMEM;
        goto fail;
    }
    if (p->reg != NULL) {
        /* Watch events arrive on the registry thread; the table is seeded
         * now, so that the first request after creation can be routed. The
         * seed is the view after the watch began, and p->mu is held from
         * before the watch to after the seed, so the watch's events (its
         * ADDED snapshot, then every change since) all come after the seed,
         * in their order: the table ends as the last of them says. (Seeded
         * after the unlock, a list older than an event delivered meanwhile,
         * a REMOVED, put the instance back for good.) */
        sw_instance *v = NULL;
        size_t n = 0;
        int removed = 0, lifted = 0; /* (ADDED to a new table: nothing to take away, lift or
                                        prune) */
        pthread_mutex_lock(&p->mu);
        rv = sw_registry_watch(p->reg, pool_on_event, p, &p->watch_id);
        if (rv == SW_OK && sw_registry_list(p->reg, NULL, &v, &n) == SW_OK) {
#ifdef SW_CHAOS
            if (swx_pool_seed_fn != NULL)
                swx_pool_seed_fn(swx_pool_seed_arg);
#endif
            for (size_t i = 0; i < n; i++)
                pool_apply(p, SW_REGISTRY_ADDED, &v[i], &removed, &lifted);
            sw_instances_free(v, n);
        }
        pthread_mutex_unlock(&p->mu);
        if (rv != SW_OK) {
            swi_ticker_fini(&p->reporter);
            goto fail;
        }
    }
    *out = p;
    return SW_OK;
fail:
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->rmu);
    free(p);
    return rv;
}

void
swr_pool_detach(swr_pool *p)
{
    if (p == NULL || p->reg == NULL || p->detached)
        return;
    sw_registry_unwatch(p->reg, p->watch_id); /* waits out a callback in progress */
    p->detached = 1;
}

void
swr_pool_stop(swr_pool *p)
{
    if (p == NULL || p->stopped)
        return;
    swr_pool_detach(p);
    /* The reporter thread leaves after the report it is writing (a store
     * that does not answer holds it for JetStream's timeout, once); what
     * is still queued goes out now, unless the store fails. */
    __atomic_store_n(&p->stopping, 1, __ATOMIC_RELEASE);
    swi_ticker_stop(&p->reporter);
    pool_report_run(p, 1);
    p->stopped = 1;
}

void
swr_pool_destroy(swr_pool *p)
{
    if (p == NULL)
        return;
    swr_pool_stop(p);
    swi_ticker_fini(&p->reporter);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->rmu);
    free(p->rq);
    free(p->v);
    free(p);
}

static int
pool_eligible(const pool_inst *e, const char *endpoint, int64_t now)
{
    return e->live && !e->draining && strcmp(e->endpoint, endpoint) == 0 &&
           (e->quarantine_until == 0 || now >= e->quarantine_until);
}

sw_err
swr_pool_pick(swr_pool *p, const char *endpoint, swr_load_fn load, void *load_arg,
              char out[SW_MAX_TOKEN + 1])
{
    unsigned best = 0;
    int64_t now = swi_now_ms();
    size_t k = 0, pick = 0, count = 0;
    pool_inst *chosen = NULL;
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < p->n; i++)
        if (pool_eligible(&p->v[i], endpoint, now))
            count++;
    if (count == 0) {
        pthread_mutex_unlock(&p->mu);
        return SW_NO_INSTANCES;
    }
    switch (p->policy) {
    case SW_POLICY_RANDOM: {
        uint32_t r;
        swi_random(&r, sizeof(r));
        pick = r % count;
        break;
    }
    case SW_POLICY_LEAST_INFLIGHT:
        /* Ties go to the first in table order, which the registry's event
         * order makes the same in every router: rotate the start so equal
         * loads still spread. */
        for (size_t j = 0, base = p->rr++; load != NULL && j < p->n; j++) {
            pool_inst *e = &p->v[(base + j) % p->n];
            unsigned l;
            if (!pool_eligible(e, endpoint, now))
                continue;
            l = load(load_arg, e->id);
            if (chosen == NULL || l < best) {
                chosen = e;
                best = l;
            }
        }
        break;
    default:
        pick = p->rr++ % count;
        break;
    }
    for (size_t i = 0; chosen == NULL && i < p->n; i++)
        if (pool_eligible(&p->v[i], endpoint, now) && k++ == pick)
            chosen = &p->v[i];
    snprintf(out, SW_MAX_TOKEN + 1, "%s", chosen->id);
    pthread_mutex_unlock(&p->mu);
    return SW_OK;
}

size_t
swr_pool_size(swr_pool *p)
{
    size_t n;
    pthread_mutex_lock(&p->mu);
    n = p->n;
    pthread_mutex_unlock(&p->mu);
    return n;
}

int
swr_pool_quarantined(swr_pool *p, const char *instance)
{
    pool_inst *e;
    int q;
    pthread_mutex_lock(&p->mu);
    e = pool_find(p, instance);
    q = e != NULL && e->quarantine_until != 0 && swi_now_ms() < e->quarantine_until;
    pthread_mutex_unlock(&p->mu);
    return q;
}

unsigned
swr_pool_backoff(unsigned prev_ms, unsigned base_ms)
{
    unsigned next = prev_ms == 0                          ? base_ms
                    : prev_ms > SWR_QUARANTINE_MAX_MS / 2 ? SWR_QUARANTINE_MAX_MS
                                                          : 2 * prev_ms;
    return next < SWR_QUARANTINE_MAX_MS ? next : SWR_QUARANTINE_MAX_MS;
}

int
swr_pool_quarantine(swr_pool *p, const char *instance)
{
    pool_inst *e;
    int64_t now = swi_now_ms();
    int report = 0;
    pthread_mutex_lock(&p->mu);
    pool_prune(p, now);
    if ((e = pool_get(p, instance)) != NULL &&
        (e->quarantine_until == 0 || now >= e->quarantine_until)) {
        e->backoff_ms = swr_pool_backoff(e->backoff_ms, p->quarantine_ms);
        e->quarantine_until = now + e->backoff_ms;
        report = e->live;
    }
    pthread_mutex_unlock(&p->mu);
    return report && p->reg != NULL;
}

/* Sends the queued dead reports: on the reporter thread until the pool
 * stops, then (last) once more from swr_pool_stop, which gives up on the
 * rest at the store's first failure: each would wait out JetStream's
 * timeout, and a router's destroy waited for them all (20 reports in a
 * store outage: minutes). */
static void
pool_report_run(swr_pool *p, int last)
{
    for (;;) {
        pool_report r;
        sw_err rv;
        int64_t now;
        pthread_mutex_lock(&p->rmu);
        if (p->nrq == 0 || (!last && __atomic_load_n(&p->stopping, __ATOMIC_ACQUIRE))) {
            pthread_mutex_unlock(&p->rmu);
            return;
        }
        r = p->rq[0];
        memmove(p->rq, p->rq + 1, (p->nrq - 1) * sizeof(*p->rq));
        p->nrq--;
        pthread_mutex_unlock(&p->rmu);
        /* Guarded by the silence: refused if the registry saw the instance
         * refresh its entry since (issue 11 #7). The clock is read after the
         * report was taken: one queued after the ticker's own read (a "no
         * responders", silent from now) would have a silence below 0, which
         * the registry refuses (SW_EINVAL) and the report was lost. */
        now = swi_now_ms();
        rv = sw_registry_report_silent(p->reg, r.id,
                                       now > r.silent_since ? now - r.silent_since : 0, r.reason);
        swi_log(&p->log, rv == SW_OK ? SW_LOG_INFO : SW_LOG_WARN,
                "reported instance %s dead (%s): %s", r.id, r.reason, sw_err_name(rv));
        if (last && rv != SW_OK && rv != SW_EBUSY && rv != SW_ENOTFOUND && rv != SW_EINVAL) {
            size_t dropped;
            pthread_mutex_lock(&p->rmu);
            dropped = p->nrq;
            p->nrq = 0;
            pthread_mutex_unlock(&p->rmu);
            if (dropped > 0)
                swi_log(&p->log, SW_LOG_WARN,
                        "the registry fails (%s): %zu dead reports not sent at close",
                        sw_err_name(rv), dropped);
            return;
        }
    }
}

/* The reporter thread's tick. */
static void
pool_report_tick(void *arg, int64_t now)
{
    (void)now;
    pool_report_run(arg, 0);
}

void
swr_pool_report(swr_pool *p, const char *instance, const char *reason, int64_t silent_ms)
{
    int queued = 0;
    if (p->reg == NULL || !__atomic_load_n(&p->reporter.started, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&p->rmu);
    if (p->nrq == p->caprq && p->caprq < 1024) {
        size_t ncap = p->caprq ? p->caprq * 2 : 8;
        pool_report *nv = realloc(p->rq, ncap * sizeof(*nv));
        if (nv != NULL) {
            p->rq = nv;
            p->caprq = ncap;
        }
    }
    if (p->nrq < p->caprq) {
        pool_report *r = &p->rq[p->nrq++];
        snprintf(r->id, sizeof(r->id), "%s", instance);
        snprintf(r->reason, sizeof(r->reason), "%s", reason ? reason : "reported dead");
        r->silent_since = swi_now_ms() - (silent_ms > 0 ? silent_ms : 0);
        queued = 1;
    }
    pthread_mutex_unlock(&p->rmu);
    if (queued)
        swi_ticker_kick(&p->reporter);
    else
        swi_log(&p->log, SW_LOG_WARN, "dead report of %s dropped: too many queued", instance);
}

void
swr_pool_dead(swr_pool *p, const char *instance, const char *reason)
{
    if (swr_pool_quarantine(p, instance))
        swr_pool_report(p, instance, reason, 0);
}
