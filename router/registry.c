/* router/registry.c -- the registry core on top of a backend table: the
 * handle's life, registration of our own entries, listing and watchers.
 * The rest is in its own file: the view of the store fed by the backend
 * (registry_view.c), keep-alives, leases and event delivery on the ticker
 * (registry_lease.c), dead reports with a revision guard
 * (registry_report.c); what they share is in registry_int.h.
 *
 * Threads: the registry's ticker (common/sched.h; swr_reg_tick when the
 * next keep-alive, lease or forgetting falls due, every REG_TICK_MS while
 * the store or the connection is down, and at once when kicked) does the
 * keep-alive writes, expires entries whose lease ran out, and tells the
 * watchers of changes, in order: a change is marked on its view entry
 * (`dirty`) and told from there, with no allocation, so none is lost for
 * lack of memory; a new watcher's snapshot (sw_registry_watch, on its
 * caller's thread) is the one queue of allocated events.
 * The backend's watch callback (swr_reg_on_entry) runs on a backend thread (KV)
 * or on the writer's thread (memory backend: synchronously inside put/del,
 * possibly of another handle, which may hold that handle's wmu); it only
 * updates the view and marks what changed.
 *
 * Locks, in this order (a thread holding one never takes an earlier one):
 *   wmu  serialises every write of our own entries (register, keep-alive,
 *        draining, deregister); held across the backend put/del.
 *   mu   the view, our own entries, the watchers and the snapshot queue; never
 *        held across a backend call.
 * Then the backend's own lock (registry_mem.c: its bucket lock, taken
 * inside put/del/list, under wmu but never under mu).
 * No user callback runs with wmu or mu held: watch callbacks are called by
 * swr_reg_tick after dropping mu (sw_registry_unwatch waits on `dispatching`),
 * and every log line is written after the locks are released (what happened
 * under a lock is noted there and logged afterwards). The backend's callback
 * may itself run under a lock (the memory backend calls it inside another
 * handle's put/del, under that handle's wmu): its log lines are queued
 * (swr_reg_note) and written by the ticker. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "router/registry_int.h"

/* ---------------------------------------------------------------- helpers */

void
swr_reg_count(sw_registry *reg, uint64_t *field)
{
    pthread_mutex_lock(&reg->mu);
    (*field)++;
    pthread_mutex_unlock(&reg->mu);
}

void
sw_registry_stats_get(sw_registry *reg, sw_registry_stats *out)
{
    if (reg == NULL || out == NULL)
        return;
    pthread_mutex_lock(&reg->mu);
    *out = reg->st;
    out->live = 0;
    for (size_t i = 0; i < reg->nview; i++)
        if (reg->view[i].live)
            out->live++;
    out->store_down = (uint64_t)reg->store_down;
    pthread_mutex_unlock(&reg->mu);
}

const char *
swr_registry_bucket(const sw_registry *reg)
{
    return reg->bucket;
}

/* ---------------------------------------------------------------- API */

const sw_registry_backend *
sw_registry_backend_find(const char *name)
{
    if (name == NULL || strcmp(name, "nats-kv") == 0)
        return sw_registry_backend_nats_kv();
    if (strcmp(name, "memory") == 0)
        return sw_registry_backend_memory();
    return NULL;
}

void
sw_registry_opts_init(sw_registry_opts *o)
{
    if (o == NULL)
        return;
    memset(o, 0, sizeof(*o));
    o->backend = "nats-kv";
    o->bucket = "streamwire_instances";
    o->lease_ms = 3000;
}

static int
backend_ok(const sw_registry_backend *be)
{
    return be != NULL && be->version >= 1 && be->version <= SW_REGISTRY_BACKEND_VERSION &&
           be->name != NULL && be->open != NULL && be->close != NULL && be->put != NULL &&
           be->del != NULL && be->list != NULL && be->watch != NULL && be->unwatch != NULL;
}

sw_err
sw_registry_open(sw_registry **out, sw_conn *conn, const sw_registry_opts *o)
{
    sw_registry *reg;
    const sw_registry_backend *be;
    const char *bucket;
    sw_err rv;

    if (out == NULL || o == NULL)
        return SW_EINVAL;
    *out = NULL;
    be = o->backend_ops ? o->backend_ops : sw_registry_backend_find(o->backend);
    bucket = o->bucket ? o->bucket : "streamwire_instances";
    if (!backend_ok(be) || sw_validate_token(bucket) != SW_OK)
        return SW_EINVAL;
    if (o->lease_ms < 0 || o->lease_ms > UINT32_MAX || o->refresh_ms < 0 ||
        o->refresh_ms > UINT32_MAX)
        return SW_EINVAL;
    if ((rv = swi_init()) != SW_OK)
        return rv;
    if ((reg = calloc(1, sizeof(*reg))) == NULL)
        return SW_ENOMEM;
    reg->be = be;
    snprintf(reg->bucket, sizeof(reg->bucket), "%s", bucket);
    reg->sealer = conn != NULL ? swt_conn_sealer(conn) : NULL;
    reg->conn = conn;
    if (conn != NULL)
        swt_conn_hold(conn); /* until sw_registry_close: sw_conn_close may come first */
    reg->log.fn = o->log;
    reg->log.arg = o->log_arg;
    reg->lease_ms = o->lease_ms ? (unsigned)o->lease_ms : 3000;
    reg->refresh_ms = o->refresh_ms ? (unsigned)o->refresh_ms : reg->lease_ms / 3;
    if (reg->refresh_ms == 0 || reg->refresh_ms >= reg->lease_ms)
        reg->refresh_ms = reg->lease_ms / 3 ? reg->lease_ms / 3 : 1;
    if (gethostname(reg->host, sizeof(reg->host) - 1) != 0)
        snprintf(reg->host, sizeof(reg->host), "unknown");
    pthread_mutex_init(&reg->wmu, NULL);
    pthread_mutex_init(&reg->mu, NULL);
    swi_cond_init(&reg->cv);
    reg->next_id = 1;
    /* The ticker first: the backend's callbacks below kick it. */
    if (swi_ticker_start(&reg->ticker, REG_TICK_MS, swr_reg_tick, reg) != 0) {
        rv = SW_ENOMEM;
        goto fail;
    }
    /* Garbage collection of abandoned entries: well past any lease. */
    {
        uint32_t age = 20 * reg->lease_ms < 60000 ? 60000 : 20 * reg->lease_ms;
        rv = be->open_opts != NULL ? be->open_opts(&reg->bs, conn, bucket, age, o->replicas)
                                   : be->open(&reg->bs, conn, bucket, age);
    }
    if (rv != SW_OK)
        goto fail;
    pthread_mutex_lock(&reg->mu);
    reg->activity_ms = swi_now_ms(); /* it answered */
    pthread_mutex_unlock(&reg->mu);
    /* Watch before listing, so nothing falls between the two; the
     * revision check drops whatever both report. */
    if ((rv = be->watch(reg->bs, swr_reg_on_entry, reg, &reg->bw)) != SW_OK)
        goto fail;
    if ((rv = be->list(reg->bs, swr_reg_on_entry, reg)) != SW_OK)
        goto fail;
    *out = reg;
    return SW_OK;
fail:
    sw_registry_close(reg);
    return rv;
}

void
sw_registry_close(sw_registry *reg)
{
    if (reg == NULL)
        return;
    if (reg->bw != NULL)
        reg->be->unwatch(reg->bs, reg->bw);
    pthread_mutex_lock(&reg->mu);
    reg->stopping = 1;
    pthread_mutex_unlock(&reg->mu);
    swi_ticker_fini(&reg->ticker); /* no-op if it never started */
    if (reg->bs != NULL)
        reg->be->close(reg->bs);
    while (reg->eh != NULL) {
        reg_event *e = reg->eh;
        reg->eh = e->next;
        swp_free(e->info);
        free(e);
    }
    while (reg->nh != NULL) {
        reg_note *n = reg->nh;
        reg->nh = n->next;
        free(n);
    }
    for (size_t i = 0; i < reg->nview; i++) {
        if (reg->view[i].told != reg->view[i].info)
            swp_free(reg->view[i].told);
        swp_free(reg->view[i].info);
    }
    free(reg->view);
    free(reg->tomb);
    free(reg->own);
    free(reg->w);
    pthread_mutex_destroy(&reg->wmu);
    pthread_mutex_destroy(&reg->mu);
    pthread_cond_destroy(&reg->cv);
    swt_conn_release(reg->conn); /* NULL ok */
    free(reg);
}

unsigned
sw_registry_lease_ms(const sw_registry *reg)
{
    return reg ? reg->lease_ms : 0;
}

/* Copies src into dst[cap]; 0 if it does not fit. */
static int
copy_str(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    if (n >= cap)
        return 0;
    memcpy(dst, src, n + 1);
    return 1;
}

/* This handle's registration of `instance` (mu held): an instance id is
 * registered once per handle, whatever its endpoint, since deregister,
 * set_draining and report_dead name it alone. */
static reg_own *
own_find_instance(sw_registry *reg, const char *instance)
{
    for (size_t i = 0; i < reg->nown; i++)
        if (strcmp(reg->own[i].instance, instance) == 0)
            return &reg->own[i];
    return NULL;
}

sw_err
sw_registry_register(sw_registry *reg, const sw_registration *r)
{
    reg_own o;
    uint8_t *buf = NULL;
    size_t len = 0;
    uint64_t rev = 0;
    sw_err rv;
    int n;

    if (reg == NULL || r == NULL || sw_validate_token(r->instance_id) != SW_OK ||
        sw_validate_endpoint(r->endpoint) != SW_OK || !swp_valid_subject(r->request_subject) ||
        !swp_valid_subject(r->control_subject))
        return SW_EINVAL;
    /* Copied: the caller may free *r when this returns. */
    memset(&o, 0, sizeof(o));
    if (!copy_str(o.instance, sizeof(o.instance), r->instance_id) ||
        !copy_str(o.endpoint, sizeof(o.endpoint), r->endpoint) ||
        !copy_str(o.req_subj, sizeof(o.req_subj), r->request_subject) ||
        !copy_str(o.ctl_subj, sizeof(o.ctl_subj), r->control_subject))
        return SW_EINVAL;
    n = snprintf(o.key, sizeof(o.key), "%s.%s", o.endpoint, o.instance);
    if (n < 0 || (size_t)n >= sizeof(o.key))
        return SW_EINVAL;
    o.started_unix_ms = swi_unix_ms();
    o.incarnation = swi_random_id64();
    o.generation = 1;

    pthread_mutex_lock(&reg->wmu);
    pthread_mutex_lock(&reg->mu);
    if (swr_reg_own_find(reg, o.key) != NULL || own_find_instance(reg, o.instance) != NULL) {
        pthread_mutex_unlock(&reg->mu);
        pthread_mutex_unlock(&reg->wmu);
        return SW_EEXIST;
    }
    pthread_mutex_unlock(&reg->mu);
    if ((rv = swr_reg_own_encode(reg, &o, &buf, &len)) == SW_OK)
        rv = reg->be->put(reg->bs, o.key, buf, len, 0, &rev);
    free(buf);
    if (rv != SW_OK) {
        pthread_mutex_unlock(&reg->wmu);
        return rv;
    }
    o.rev = rev;
    o.next_refresh_ms = swi_now_ms() + reg->refresh_ms;
    pthread_mutex_lock(&reg->mu);
    if (reg->nown == reg->capown) {
        size_t ncap = reg->capown ? reg->capown * 2 : 4;
        reg_own *nv = realloc(reg->own, ncap * sizeof(*nv));
        if (nv == NULL) {
            pthread_mutex_unlock(&reg->mu);
            (void)reg->be->del(reg->bs, o.key);
            pthread_mutex_unlock(&reg->wmu);
            return SW_ENOMEM;
        }
        reg->own = nv;
        reg->capown = ncap;
    }
    reg->own[reg->nown++] = o;
    swi_ticker_kick(&reg->ticker);
    pthread_mutex_unlock(&reg->mu);
    pthread_mutex_unlock(&reg->wmu);
    swi_log(&reg->log, SW_LOG_INFO, "registry: registered %s (revision %llu)", o.instance,
            (unsigned long long)rev);
    return SW_OK;
}

sw_err
sw_registry_set_draining(sw_registry *reg, const char *instance_id)
{
    reg_own *o;
    char key[REG_KEY_MAX];
    if (reg == NULL || instance_id == NULL)
        return SW_EINVAL;
    pthread_mutex_lock(&reg->mu);
    o = own_find_instance(reg, instance_id);
    if (o == NULL) {
        pthread_mutex_unlock(&reg->mu);
        return SW_ENOTFOUND;
    }
    o->draining = 1;
    snprintf(key, sizeof(key), "%s", o->key);
    pthread_mutex_unlock(&reg->mu);
    swr_reg_refresh(reg, key);
    return SW_OK;
}

sw_err
sw_registry_deregister(sw_registry *reg, const char *instance_id)
{
    reg_own *o;
    char key[REG_KEY_MAX];
    sw_err rv;
    if (reg == NULL || instance_id == NULL)
        return SW_EINVAL;
    pthread_mutex_lock(&reg->wmu);
    pthread_mutex_lock(&reg->mu);
    o = own_find_instance(reg, instance_id);
    if (o == NULL) {
        pthread_mutex_unlock(&reg->mu);
        pthread_mutex_unlock(&reg->wmu);
        return SW_ENOTFOUND;
    }
    snprintf(key, sizeof(key), "%s", o->key);
    *o = reg->own[--reg->nown];
    pthread_mutex_unlock(&reg->mu);
    rv = reg->be->del(reg->bs, key);
    pthread_mutex_unlock(&reg->wmu);
    return rv;
}

void
sw_instances_free(sw_instance *v, size_t n)
{
    if (v == NULL)
        return;
    for (size_t i = 0; i < n; i++) {
        free((void *)v[i].instance_id);
        free((void *)v[i].endpoint);
        free((void *)v[i].request_subject);
        free((void *)v[i].control_subject);
        free((void *)v[i].host);
    }
    free(v);
}

sw_err
sw_registry_list(sw_registry *reg, const char *endpoint, sw_instance **out, size_t *n)
{
    sw_instance *v;
    size_t k = 0;
    int64_t now = swi_now_ms();
    if (reg == NULL || out == NULL || n == NULL)
        return SW_EINVAL;
    *out = NULL;
    *n = 0;
    pthread_mutex_lock(&reg->mu);
    v = calloc(reg->nview ? reg->nview : 1, sizeof(*v));
    if (v == NULL) {
        pthread_mutex_unlock(&reg->mu);
        return SW_ENOMEM;
    }
    for (size_t i = 0; i < reg->nview; i++) {
        reg_view *e = &reg->view[i];
        sw_instance *d = &v[k];
        if (!e->live || (endpoint != NULL && strcmp(e->info->endpoint, endpoint) != 0))
            continue;
        d->instance_id = swi_strdup(e->info->instance_id);
        d->endpoint = swi_strdup(e->info->endpoint);
        d->request_subject = swi_strdup(e->info->request_subject);
        d->control_subject = swi_strdup(e->info->control_subject);
        d->host = swi_strdup(e->info->host);
        d->pid = e->info->pid;
        d->started_unix_ms = (int64_t)e->info->started_unix_ms;
        d->lease_ms = e->info->lease_ms;
        d->revision = e->rev;
        d->age_ms = now - e->seen_ms;
        d->draining = e->info->draining;
        k++;
        if (!d->instance_id || !d->endpoint || !d->request_subject || !d->control_subject ||
            !d->host) {
            pthread_mutex_unlock(&reg->mu);
            sw_instances_free(v, k);
            return SW_ENOMEM;
        }
    }
    pthread_mutex_unlock(&reg->mu);
    *out = v;
    *n = k;
    return SW_OK;
}

/* Appends an event for the watchers in [lo, hi) with a copy of info;
 * 0 on no memory. */
static int
watch_queue(reg_event **head, reg_event **tail, sw_registry_event ev, const swp_instance *info,
            uint64_t rev, int64_t age_ms, int lo, int hi)
{
    reg_event *e = malloc(sizeof(*e));
    if (e == NULL || (e->info = swr_reg_info_copy(info)) == NULL) {
        free(e);
        return 0;
    }
    e->next = NULL;
    e->lo = lo;
    e->hi = hi;
    e->ev = ev;
    e->rev = rev;
    e->age_ms = age_ms;
    if (*tail != NULL)
        (*tail)->next = e;
    else
        *head = e;
    *tail = e;
    return 1;
}

sw_err
sw_registry_watch(sw_registry *reg, sw_registry_watch_fn fn, void *arg, int *id)
{
    int64_t now = swi_now_ms();
    reg_event *head = NULL, *tail = NULL;
    int me, ok = 1;
    if (reg == NULL || fn == NULL)
        return SW_EINVAL;
    pthread_mutex_lock(&reg->mu);
    if (reg->nw == reg->capw) {
        size_t ncap = reg->capw ? reg->capw * 2 : 4;
        reg_watcher *nv = realloc(reg->w, ncap * sizeof(*nv));
        if (nv == NULL) {
            pthread_mutex_unlock(&reg->mu);
            return SW_ENOMEM;
        }
        reg->w = nv;
        reg->capw = ncap;
    }
    me = reg->next_id;
    /* First the changes not yet told, for the watchers there are (the
     * ticker's steps, registry_lease.c), so that every watcher then knows
     * the view as it is; then the new one's snapshot of it: the live
     * instances, as sw_registry_list has them. All or nothing. */
    for (uint64_t last = 0; ok && reg->nw > 0;) { /* (in the order they changed) */
        const reg_view *v = NULL;
        int ev;
        for (size_t i = 0; i < reg->nview; i++)
            if (reg->view[i].dirty > last && (v == NULL || reg->view[i].dirty < v->dirty))
                v = &reg->view[i];
        if (v == NULL)
            break;
        last = v->dirty;
        ev = swr_reg_step(v, v->told, v->lapsed);
        if (ev == SW_REGISTRY_REMOVED) {
            ok = watch_queue(&head, &tail, SW_REGISTRY_REMOVED, v->told, v->told_rev,
                             now - v->seen_ms, 1, me);
            ev = swr_reg_step(v, NULL, 0); /* then ADDED, if live again */
        }
        if (ok && ev != 0) /* ADDED, UPDATED: of the entry as it is */
            ok = watch_queue(&head, &tail, (sw_registry_event)ev, v->info, v->rev, 0, 1, me);
    }
    for (size_t i = 0; ok && i < reg->nview; i++)
        if (reg->view[i].live)
            ok = watch_queue(&head, &tail, SW_REGISTRY_ADDED, reg->view[i].info, reg->view[i].rev,
                             now - reg->view[i].seen_ms, me, me + 1);
    if (!ok) {
        while (head != NULL) {
            reg_event *e = head;
            head = e->next;
            swp_free(e->info);
            free(e);
        }
        pthread_mutex_unlock(&reg->mu);
        return SW_ENOMEM;
    }
    for (size_t i = reg->nview; i-- > 0;) /* (backwards: a settled entry may be dropped) */
        if (reg->view[i].dirty)
            swr_reg_settle(reg, &reg->view[i]);
    reg->w[reg->nw].id = reg->next_id++;
    reg->w[reg->nw].fn = fn;
    reg->w[reg->nw].arg = arg;
    if (id != NULL)
        *id = me;
    reg->nw++;
    if (head != NULL) {
        if (reg->et != NULL)
            reg->et->next = head;
        else
            reg->eh = head;
        reg->et = tail;
        swi_ticker_kick(&reg->ticker);
    }
    pthread_mutex_unlock(&reg->mu);
    return SW_OK;
}

void
sw_registry_unwatch(sw_registry *reg, int id)
{
    if (reg == NULL)
        return;
    pthread_mutex_lock(&reg->mu);
    for (size_t i = 0; i < reg->nw; i++)
        if (reg->w[i].id == id) {
            memmove(&reg->w[i], &reg->w[i + 1], (reg->nw - i - 1) * sizeof(reg->w[0]));
            reg->nw--;
            break;
        }
    while (reg->dispatching == id)
        pthread_cond_wait(&reg->cv, &reg->mu);
    pthread_mutex_unlock(&reg->mu);
}
