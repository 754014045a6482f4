/* egress/frontend.c -- sw_router, the frontend: options, create, destroy,
 * stats, and the table of open streams (r->mu). See egress_int.h for the
 * files of the frontend side, its threads and its lock order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "egress/egress_int.h"

void
swe_router_unref(sw_router *r)
{
    if (atomic_fetch_sub(&r->refs, 1) != 1)
        return;
    swi_ticker_fini(&r->ticker); /* (stopped by sw_router_destroy) */
    swi_idmap_fini(&r->streams);
    swi_duetab_fini(&r->due);
    swr_pool_destroy(r->pool);
    swi_peers_fini(&r->peers);
    swe_sprobes_fini(&r->sprobes);
    free(r->scan_vec.v);
    free(r->deferred.v);
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->ack_mu);
    pthread_mutex_destroy(&r->flush_mu);
    swt_conn_release(r->conn);
    free(r);
}

sw_stream *
swe_lookup(sw_router *r, const uint8_t *id)
{
    sw_stream *s;
    pthread_mutex_lock(&r->mu);
    s = swi_idmap_get(&r->streams, id);
    if (s != NULL)
        swe_stream_ref(s);
    pthread_mutex_unlock(&r->mu);
    return s;
}

void
swe_lookup_n(sw_router *r, const uint8_t *const *ids, size_t n, sw_stream **out)
{
    void *v[SWI_IDMAP_GET_N_MAX];
    pthread_mutex_lock(&r->mu);
    for (size_t at = 0; at < n; at += SWI_IDMAP_GET_N_MAX) {
        size_t k = n - at < SWI_IDMAP_GET_N_MAX ? n - at : SWI_IDMAP_GET_N_MAX;
        swi_idmap_get_n(&r->streams, ids + at, k, v);
        for (size_t i = 0; i < k; i++)
            if ((out[at + i] = v[i]) != NULL)
                __builtin_prefetch(&out[at + i]->refs, 1); /* cold streams: overlap the misses */
    }
    for (size_t i = 0; i < n; i++)
        if (out[i] != NULL)
            swe_stream_ref(out[i]);
    pthread_mutex_unlock(&r->mu);
}

/* Takes s out of the table (r->mu held, s->in_table set): the table's
 * reference becomes the caller's. */
static void
stream_unlink(sw_router *r, sw_stream *s)
{
    s->in_table = 0;
    swi_idmap_del(&r->streams, s->id);
    swe_sprobes_drop(&r->sprobes, s->rx.ask_tag, s->id); /* its newest stream probe, if out */
    s->rx.ask_tag = 0;
    swi_duetab_detach(&r->due, s->next_tick);
    r->st.open_streams--;
    if (s->pooled) {
        s->pooled = 0;
        swi_peers_release(&r->peers, swe_instance(s));
    }
}

void
swe_remove(sw_stream *s)
{
    sw_router *r = s->r;
    int drop = 0;
    pthread_mutex_lock(&r->mu);
    if (s->in_table) {
        stream_unlink(r, s);
        drop = 1;
    }
    pthread_mutex_unlock(&r->mu);
    if (drop) {
        /* The stream's repair counters join the router's (metrics). */
        sw_stream_stats st;
        sw_stream_stats_get(s, &st);
        __atomic_fetch_add(&r->duplicates, st.duplicates, __ATOMIC_RELAXED);
        __atomic_fetch_add(&r->resend_requests, st.resend_requests, __ATOMIC_RELAXED);
        __atomic_fetch_add(&r->heartbeats, st.heartbeats, __ATOMIC_RELAXED);
    }
    if (drop)
        swe_stream_unref(s);
}

/* Which of the first n series is named name: its index, or n. */
static unsigned
ep_find(const sw_router *r, unsigned n, const char *name)
{
    unsigned i = 0;
    while (i < n && strcmp(r->eps[i].name, name) != 0)
        i++;
    return i;
}

swe_ep *
swe_ep_get(sw_router *r, const char *name)
{
    unsigned n = r->eps_used, i = ep_find(r, n, name);
    if (i < n)
        return &r->eps[i];
    if (n == SWE_EP_MAX)
        return &r->eps[SWE_EP_MAX];
    snprintf(r->eps[n].name, sizeof(r->eps[n].name), "%s", name);
    __atomic_store_n(&r->eps_used, n + 1, __ATOMIC_RELEASE);
    return &r->eps[n];
}

const char *
swe_ep_name(const sw_router *r, const char *name)
{
    unsigned n = __atomic_load_n(&r->eps_used, __ATOMIC_ACQUIRE), i = ep_find(r, n, name);
    return i < n ? r->eps[i].name : NULL;
}

void
swe_count_terminal(sw_router *r, const sw_terminal *t)
{
    pthread_mutex_lock(&r->mu);
    if (t->status >= 1 && t->status <= 5)
        r->st.terminals[t->status]++;
    if (t->status == SW_STATUS_ERROR) {
        int e = sw_err_is_nats(t->error) ? SW_ENATS : (int)t->error;
        if (e >= 0 && e < SWE_ERR_SLOTS)
            r->err_counts[e]++;
    }
    pthread_mutex_unlock(&r->mu);
}

static void
take_ref(void *v)
{
    swe_stream_ref(v);
}

void
swe_snapshot(sw_router *r, swi_ptrvec *vec, const int64_t *by)
{
    if (by != NULL) {
        swi_duetab_snapshot(&r->due, vec, *by, take_ref);
        return;
    }
    pthread_mutex_lock(&r->mu);
    swi_idmap_snapshot_all(&r->streams, vec, take_ref);
    pthread_mutex_unlock(&r->mu);
}

/* ---------------------------------------------------------------- API */

void
sw_router_opts_init(sw_router_opts *o)
{
    if (o == NULL)
        return;
    memset(o, 0, sizeof(*o));
    o->credit_window = 256;
    o->credit_window_max = SW_CREDIT_WINDOW_MAX_DEFAULT;
    o->credit_bytes = SW_CREDIT_BYTES_DEFAULT;
    o->heartbeat_ms = 250;
    o->gap_timeout_ms = 500;
    o->max_streams = 65536;
    o->probe_interval_ms = 100;
    o->probe_timeout_ms = 300;
    o->probe_misses = 2;
    o->quarantine_ms = 1000;
}

void
sw_request_opts_init(sw_request_opts *o)
{
    if (o != NULL)
        memset(o, 0, sizeof(*o));
}

sw_err
sw_router_create(sw_router **out, sw_conn *conn, const sw_router_opts *o)
{
    sw_router *r;
    sw_err rv;
    char live_subj[SWT_SUBJECT_MAX], prb[SWT_SUBJECT_MAX];

    if (out == NULL || conn == NULL || o == NULL)
        return SW_EINVAL;
    *out = NULL;
    if (o->router_id != NULL && sw_validate_token(o->router_id) != SW_OK)
        return SW_EINVAL;
    if (o->credit_window > SWP_MAX_WINDOW || o->credit_window_max > SWP_MAX_WINDOW ||
        o->heartbeat_ms > SWP_MAX_HEARTBEAT_MS || o->heartbeat_ms < 0 ||
        !swi_ms_ok(o->inactivity_ms) || !swi_ms_ok(o->gap_timeout_ms) ||
        !swi_ms_ok(o->final_linger_ms) || !swi_ms_ok(o->probe_interval_ms) ||
        !swi_ms_ok(o->probe_timeout_ms) || !swi_ms_ok(o->quarantine_ms) || o->migration_limit < 0 ||
        o->migration_limit > SW_MAX_MIGRATIONS ||
        (o->credit_bytes_max != 0 &&
         o->credit_bytes_max < (o->credit_bytes ? o->credit_bytes : SW_CREDIT_BYTES_DEFAULT)))
        return SW_EINVAL;
    if ((rv = swi_init()) != SW_OK)
        return rv;
    if ((r = calloc(1, sizeof(*r))) == NULL)
        return SW_ENOMEM;
    atomic_init(&r->refs, 1);
    r->conn = conn;
    swt_conn_hold(conn); /* until the router's memory goes: sw_conn_close may come first */
    r->log.fn = o->log;
    r->log.arg = o->log_arg;
    if (o->router_id != NULL)
        snprintf(r->id, sizeof(r->id), "%s", o->router_id);
    else
        swi_random_token(r->id);
    r->window = o->credit_window ? o->credit_window : 256;
    r->window_max = o->credit_window_max ? o->credit_window_max : SW_CREDIT_WINDOW_MAX_DEFAULT;
    r->credit_bytes = o->credit_bytes ? o->credit_bytes : SW_CREDIT_BYTES_DEFAULT;
    r->credit_bytes_max = o->credit_bytes_max ? o->credit_bytes_max
                          : r->credit_bytes > SW_CREDIT_BYTES_MAX_DEFAULT
                              ? r->credit_bytes
                              : SW_CREDIT_BYTES_MAX_DEFAULT;
    r->hb_ms = o->heartbeat_ms ? o->heartbeat_ms : 250;
    r->inactivity_ms = o->inactivity_ms ? o->inactivity_ms : 4 * r->hb_ms + 500;
    r->gap_ms = o->gap_timeout_ms ? o->gap_timeout_ms : 500;
    r->linger_ms = o->final_linger_ms;
    r->max_streams = o->max_streams ? o->max_streams : 65536;
    r->migration_limit = o->migration_limit;
    swi_peers_init(&r->peers, o->probe_interval_ms ? o->probe_interval_ms : 100,
                   o->probe_timeout_ms ? o->probe_timeout_ms : 300,
                   o->probe_misses ? o->probe_misses : 2);
    {
        uint64_t base;
        swi_random(&base, sizeof(base));
        swe_sprobes_init(&r->sprobes, base);
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->ack_mu, NULL);
    pthread_mutex_init(&r->flush_mu, NULL);
    {
        /* A diagnostic switch (docs/METRICS.md): the per-item timing that
         * feeds the latency histograms, off, to measure what it costs. */
        const char *m = getenv("STREAMWIRE_METRICS");
        r->timing_off = m != NULL && strcmp(m, "off") == 0;
    }
    swi_hist_init(&r->h_ttfi, swi_hist_latency_bounds, swi_hist_latency_nb);
    swi_hist_init(&r->h_inter, swi_hist_latency_bounds, swi_hist_latency_nb);
    swi_hist_init(&r->h_duration, swi_hist_latency_bounds, swi_hist_latency_nb);
    for (unsigned i = 0; i <= SWE_EP_MAX; i++) {
        swi_hist_init(&r->eps[i].ttfi, swi_hist_latency_bounds, swi_hist_latency_nb);
        swi_hist_init(&r->eps[i].duration, swi_hist_latency_bounds, swi_hist_latency_nb);
    }
    snprintf(r->eps[SWE_EP_MAX].name, sizeof(r->eps[SWE_EP_MAX].name), "%s", SWE_EP_OTHER);
    swi_duetab_init(&r->due);
    if (swi_idmap_init_own(&r->streams, 256) != 0) {
        rv = SW_ENOMEM;
        goto fail;
    }
    {
        swr_pool_opts po;
        memset(&po, 0, sizeof(po));
        po.registry = o->registry;
        po.policy = o->policy;
        po.quarantine_ms = o->quarantine_ms;
        po.log = r->log;
        po.on_removed = swe_on_removed;
        po.on_removed_arg = r;
        if ((rv = swr_pool_create(&r->pool, &po)) != SW_OK)
            goto fail;
    }
    (void)swt_subject_response_wildcard(r->wildcard, sizeof(r->wildcard), r->id);
    (void)swt_subject_router(live_subj, sizeof(live_subj), r->id);
    (void)swt_subject_probe_reply(prb, sizeof(prb), r->id, NULL);
    if ((rv = swt_subscribe(conn, &r->mux, r->wildcard, swe_on_msg, r)) != SW_OK ||
        (rv = swt_subscribe(conn, &r->live, live_subj, swe_on_live_probe, r)) != SW_OK ||
        (rv = swt_subscribe(conn, &r->prb, prb, swe_on_probe_reply, r)) != SW_OK ||
        (rv = swt_flush(conn, 5000)) != SW_OK)
        goto fail;
    if (swt_denied(conn, r->wildcard) || swt_denied(conn, live_subj) || swt_denied(conn, prb)) {
        rv = SW_EPERM; /* this user may not read this router's subjects */
        swi_log(&r->log, SW_LOG_ERROR,
                "router %s: the NATS server does not permit its subscriptions (%s, %s, %s)", r->id,
                r->wildcard, live_subj, prb);
        goto fail;
    }
    swe_backlog_init(&r->backlog, swi_now_ms());
    r->behind_warned_ms = INT64_MIN / 2;
    if (swi_ticker_start(&r->ticker, SWE_TICK_MS, swe_on_tick, r) != 0) {
        rv = SW_ENOMEM;
        goto fail;
    }
    *out = r;
    return SW_OK;
fail:
    swt_sub_close(r->conn, &r->prb);
    swt_sub_close(r->conn, &r->live);
    swt_sub_close(r->conn, &r->mux);
    swe_router_unref(r);
    return rv;
}

const char *
sw_router_id(const sw_router *r)
{
    return r ? r->id : "";
}

uint64_t
sw_router_error_count(sw_router *r, int err)
{
    uint64_t n = 0;
    if (r == NULL)
        return 0;
    if (sw_err_is_nats(err))
        err = SW_ENATS;
    if (err < 0 || err >= SWE_ERR_SLOTS)
        return 0;
    pthread_mutex_lock(&r->mu);
    n = r->err_counts[err];
    pthread_mutex_unlock(&r->mu);
    return n;
}

void
sw_router_stats_get(sw_router *r, sw_router_stats *out)
{
    uint64_t dropped;
    if (r == NULL || out == NULL)
        return;
    dropped = swt_sub_dropped(r->mux);
    pthread_mutex_lock(&r->mu);
    *out = r->st;
    pthread_mutex_unlock(&r->mu);
    out->items = __atomic_load_n(&r->items, __ATOMIC_RELAXED);
    out->items_after_final = __atomic_load_n(&r->items_after_final, __ATOMIC_RELAXED);
    out->nats_dropped = dropped;
    out->migrations = __atomic_load_n(&r->migrations, __ATOMIC_RELAXED);
    out->migration_failures = __atomic_load_n(&r->migration_failures, __ATOMIC_RELAXED);
}

static void
release_stream(void *s)
{
    swe_stream_unref(s);
}

void
swe_end_destroyed(sw_stream *s)
{
    /* A terminal held back by final_linger_ms goes out now: the timer
     * that would have released it is gone. */
    pthread_mutex_lock(&s->mu);
    if (s->rx.term_state == SWE_TERM_QUEUED)
        s->rx.term_ready_ms = 0;
    pthread_mutex_unlock(&s->mu);
    swe_stream_fail(s, SW_ECLOSED, "the router was destroyed", 1);
    swe_dispatch(s);
}

void
sw_router_destroy(sw_router *r)
{
    if (r == NULL)
        return;
    pthread_mutex_lock(&r->mu);
    r->closing = 1;
    pthread_mutex_unlock(&r->mu);
    /* No registry event may kick the ticker once it is stopped, and the
     * registry is not used once this returns (it may be closed while the
     * application still holds streams, which keep the router's memory). */
    swr_pool_stop(r->pool);
    swi_ticker_stop(&r->ticker);
    swt_sub_close(r->conn, &r->live);
    swt_sub_close(r->conn, &r->prb);
    swt_sub_close(r->conn, &r->mux);
    swe_flush_acks(r); /* after the mux drained: finals it delivered are acked too */
    {
        /* cancels still waiting for an answer: no more sends */
        swe_cancels drop;
        pthread_mutex_lock(&r->mu);
        drop = r->cancels;
        memset(&r->cancels, 0, sizeof(r->cancels));
        __atomic_store_n(&r->cancels_waiting, 0, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&r->mu);
        swe_cancels_clear(&drop, release_stream);
    }
    swe_run_deferred(r);
    /* Every open stream ends, a batch at a time out of the table, with no
     * allocation: it used to take a malloc'd snapshot of them all, and
     * when that failed no stream got its terminal (a consumer blocked in
     * sw_stream_next with no timeout never woke). */
    for (;;) {
        void *batch[64];
        size_t n;
        pthread_mutex_lock(&r->mu);
        n = swi_idmap_some(&r->streams, batch, sizeof(batch) / sizeof(batch[0]));
        for (size_t i = 0; i < n; i++)
            stream_unlink(r, batch[i]);
        pthread_mutex_unlock(&r->mu);
        if (n == 0)
            break;
        for (size_t i = 0; i < n; i++) {
            swe_end_destroyed(batch[i]);
            swe_stream_unref(batch[i]); /* the table's */
        }
    }
    /* An sw_router_open that raced this has its stream ended by the sweep
     * and leaves its dispatch to the ticker, stopped above: from now on it
     * dispatches itself, and what it left already goes now. */
    pthread_mutex_lock(&r->mu);
    r->no_defer = 1;
    pthread_mutex_unlock(&r->mu);
    swe_run_deferred(r);
    (void)swt_flush(r->conn, 1000);
    __atomic_store_n(&r->closed, 1, __ATOMIC_RELEASE);
    swe_router_unref(r);
}
