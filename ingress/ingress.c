/* ingress/ingress.c -- the ingress's lifecycle: options, start (threads,
 * subscriptions), drain, stop, destroy, the getters and stats; and the
 * reference counts of the ingress and its responders.
 *
 * Threads: the caller's. sw_ingress_start starts the handler pool, the
 * timer, the liveness prober and the sender; ing_stop joins them (the
 * sender last: it publishes what the others queued).
 * Locks: ing->mu (flags, queue, ing->all), r->mu (closing each responder,
 * never with ing->mu held), ing->smu (stopping the sender); see
 * ingress_int.h for the order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ingress/ingress_int.h"
#ifdef SW_CHAOS
#include "ingress/chaos.h"
#endif

static void
ing_unref(sw_ingress *ing)
{
    if (atomic_fetch_sub(&ing->refs, 1) != 1)
        return;
    swi_idmap_fini(&ing->streams);
    swi_duetab_fini(&ing->due);
    swn_early_fini(ing);
    swi_peers_fini(&ing->peers);
    swi_ticker_fini(&ing->timer); /* (stopped by ing_stop) */
    swi_ticker_fini(&ing->live_ticker);
    pthread_mutex_destroy(&ing->live_mu);
    pthread_mutex_destroy(&ing->req_mu);
    pthread_mutex_destroy(&ing->smu);
    pthread_cond_destroy(&ing->scv);
    pthread_mutex_destroy(&ing->mu);
    pthread_cond_destroy(&ing->cv);
    pthread_cond_destroy(&ing->dcv);
    free(ing->threads);
    free(ing->req_arena);
    swt_conn_release(ing->conn);
    free(ing);
}

void
swn_resp_ref(sw_responder *r)
{
    atomic_fetch_add(&r->refs, 1);
}

/* A reference unless the responder is already being freed (its count hit
 * zero and it waits for ing->mu to leave ing->all). 1 if taken. */
static int
resp_tryref(sw_responder *r)
{
    int v = atomic_load(&r->refs);
    while (v > 0)
        if (atomic_compare_exchange_weak(&r->refs, &v, v + 1))
            return 1;
    return 0;
}

void
swn_resp_free_request(sw_responder *r)
{
    __atomic_fetch_sub(&r->ing->req_bytes, (uint64_t)(r->plen + r->hbytes), __ATOMIC_RELAXED);
    free(r->payload);
    free(r->hdr);
    r->payload = NULL;
    r->plen = 0;
    r->hdr = NULL;
    r->nhdr = 0;
    r->hbytes = 0;
}

void
swn_resp_unref(sw_responder *r)
{
    if (atomic_fetch_sub(&r->refs, 1) != 1)
        return;
    swn_ring_free(&r->rg);
    swn_resp_free_request(r);
    pthread_mutex_lock(&r->ing->mu);
    if (r->all_prev != NULL)
        r->all_prev->all_next = r->all_next;
    else if (r->ing->all == r)
        r->ing->all = r->all_next;
    if (r->all_next != NULL)
        r->all_next->all_prev = r->all_prev;
    pthread_mutex_unlock(&r->ing->mu);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    swi_duetab_release(&r->ing->due, r->next_tick);
    ing_unref(r->ing);
    free(r);
}

void
sw_ingress_opts_init(sw_ingress_opts *o)
{
    if (o == NULL)
        return;
    memset(o, 0, sizeof(*o));
    o->max_inflight = 64;
    o->handler_threads = 4;
    o->send_timeout_ms = 30000;
    o->max_window = SW_INGRESS_MAX_WINDOW_DEFAULT;
    o->frontend_probe_ms = 250;
    o->frontend_timeout_ms = 1000;
}

static sw_err
ing_subscribe(sw_ingress *ing, swt_sub **sub, const char *subj, swt_msg_fn cb)
{
    return swt_subscribe(ing->conn, sub, subj, cb, ing);
}

static void ing_stop(sw_ingress *ing);

sw_err
sw_ingress_start(sw_ingress **out, sw_conn *conn, const sw_ingress_opts *o)
{
    sw_ingress *ing;
    sw_err rv;
#ifdef SW_CHAOS
    const char *drop;
#endif

    if (out == NULL || conn == NULL || o == NULL || o->handler == NULL)
        return SW_EINVAL;
    *out = NULL;
    if (sw_validate_endpoint(o->endpoint) != SW_OK)
        return SW_EINVAL;
    if (o->instance_id != NULL && sw_validate_token(o->instance_id) != SW_OK)
        return SW_EINVAL;
    if (o->max_request_age_ms < 0 || o->max_request_age_ms > SW_MAX_REQUEST_AGE_MS)
        return SW_EINVAL;
    /* Kept in unsigned milliseconds (2^32 would wrap to a zero timeout), as
     * the router's are. */
    if (!swi_ms_ok(o->send_timeout_ms) || !swi_ms_ok(o->frontend_probe_ms) ||
        !swi_ms_ok(o->frontend_timeout_ms))
        return SW_EINVAL;
    if ((rv = swi_init()) != SW_OK)
        return rv;
    if (o->coalesce_us < 0 && o->coalesce_us != SW_COALESCE_OFF)
        return SW_EINVAL;
    if ((ing = calloc(1, sizeof(*ing))) == NULL)
        return SW_ENOMEM;
    if ((ing->req_arena = malloc(sizeof(*ing->req_arena))) == NULL) {
        free(ing);
        return SW_ENOMEM;
    }
    atomic_init(&ing->refs, 1);
    ing->conn = conn;
    swt_conn_hold(conn); /* until the ingress's memory goes: sw_conn_close may come first */
    ing->log.fn = o->log;
    ing->log.arg = o->log_arg;
    snprintf(ing->endpoint, sizeof(ing->endpoint), "%s", o->endpoint);
    if (o->instance_id != NULL)
        snprintf(ing->instance_id, sizeof(ing->instance_id), "%s", o->instance_id);
    else
        swi_random_token(ing->instance_id);
    ing->incarnation = swi_random_id64();
    ing->max_age_ms = o->max_request_age_ms;
    ing->handler = o->handler;
    ing->handler_arg = o->handler_arg;
    ing->max_inflight = o->max_inflight ? o->max_inflight : 64;
    ing->max_held = o->max_held_finals ? o->max_held_finals : SW_INGRESS_MAX_HELD_DEFAULT;
    ing->inline_handlers = o->handler_inline != 0;
    ing->nthreads = ing->inline_handlers ? 0 : o->handler_threads ? o->handler_threads : 4;
    ing->send_timeout_ms = o->send_timeout_ms ? o->send_timeout_ms : 30000;
    ing->max_window = o->max_window ? o->max_window : SW_INGRESS_MAX_WINDOW_DEFAULT;
    ing->hot_us = o->coalesce_us == SW_COALESCE_OFF ? 0
                  : o->coalesce_us                  ? o->coalesce_us
                                                    : SWN_HOT_US;
    ing->buffered = !swt_conn_send_asap(conn);
    ing->batch_bytes = swt_conn_sealer(conn) != NULL ? SWN_BATCH_BYTES_SEALED : SWN_BATCH_BYTES;
    ing->hold_us = ing->buffered || ing->hot_us < SWN_ASAP_HOLD_US ? ing->hot_us : SWN_ASAP_HOLD_US;
    ing->probe_ms = o->frontend_probe_ms ? o->frontend_probe_ms : 250;
    ing->probe_timeout_ms = o->frontend_timeout_ms ? o->frontend_timeout_ms : 1000;
    swi_peers_init(&ing->peers, ing->probe_ms, ing->probe_timeout_ms,
                   o->frontend_probe_misses ? o->frontend_probe_misses : 2);
    ing->max_req = o->max_request_bytes ? o->max_request_bytes : sw_conn_max_payload(conn);
    if (ing->max_req == 0)
        ing->max_req = 1024 * 1024;
#ifdef SW_CHAOS
    if ((drop = getenv("SW_TEST_DROP_RATE")) != NULL)
        swx_ingress_set_drop_rate(ing, atof(drop));
#endif
    pthread_mutex_init(&ing->mu, NULL);
    pthread_mutex_init(&ing->live_mu, NULL);
    pthread_mutex_init(&ing->req_mu, NULL);
    pthread_mutex_init(&ing->smu, NULL);
    pthread_cond_init(&ing->scv, NULL);
    swi_cond_init(&ing->cv);
    swi_cond_init(&ing->dcv);
    swi_duetab_init(&ing->due);
    if (swi_idmap_init(&ing->streams, 64) != 0 ||
        swi_idq_init(&ing->early, SWN_EARLY_MAX, SWN_EARLY_TTL_MS) != 0 ||
        swi_idq_init(&ing->seen, SWN_SEEN_MAX, SWN_SEEN_TTL_MS) != 0 ||
        swi_idq_init(&ing->refused, SWN_REFUSED_MAX, SWN_SEEN_TTL_MS) != 0 ||
        (ing->threads = calloc(ing->nthreads ? ing->nthreads : 1, sizeof(pthread_t))) == NULL) {
        rv = SW_ENOMEM;
        goto fail;
    }
    if (swt_subject_request(ing->req_subj, sizeof(ing->req_subj), ing->endpoint,
                            ing->instance_id) != SW_OK ||
        swt_subject_control(ing->ctl_subj, sizeof(ing->ctl_subj), ing->instance_id) != SW_OK) {
        rv = SW_EINVAL;
        goto fail;
    }
    for (unsigned i = 0; i < ing->nthreads; i++) {
        if (pthread_create(&ing->threads[i], NULL, swn_ing_worker_main, ing) != 0) {
            rv = SW_ENOMEM;
            goto fail;
        }
        ing->started_threads++;
    }
    if (swi_ticker_start(&ing->timer, SWN_TICK_MS, swn_ing_timer_tick, ing) != 0) {
        rv = SW_ENOMEM;
        goto fail;
    }
    if (swi_ticker_start(&ing->live_ticker, ing->probe_ms, swn_ing_live_tick, ing) != 0) {
        rv = SW_ENOMEM;
        goto fail;
    }
    ing->sender_on = 1;
    if (pthread_create(&ing->sender, NULL, swn_ing_sender_main, ing) != 0) {
        ing->sender_on = 0;
        rv = SW_ENOMEM;
        goto fail;
    }
    {
        char lv[SWT_SUBJECT_MAX];
        (void)swt_subject_live_reply(lv, sizeof(lv), ing->instance_id, NULL);
        if ((rv = ing_subscribe(ing, &ing->live_sub, lv, swn_ing_on_live_reply)) != SW_OK)
            goto fail;
    }
    if ((rv = ing_subscribe(ing, &ing->ctl_sub, ing->ctl_subj, swn_ing_on_control)) != SW_OK ||
        (rv = ing_subscribe(ing, &ing->req_sub, ing->req_subj, swn_ing_on_request)) != SW_OK)
        goto fail;
#ifdef SW_CHAOS
    swn_chaos_subscribed(ing);
#endif
    /* Make sure the server has the interest before anyone is told we exist. */
    (void)swt_flush(conn, 5000);
    {
        char lv[SWT_SUBJECT_MAX];
        (void)swt_subject_live_reply(lv, sizeof(lv), ing->instance_id, NULL);
        if (swt_denied(conn, ing->req_subj) || swt_denied(conn, ing->ctl_subj) ||
            swt_denied(conn, lv)) {
            swi_log(&ing->log, SW_LOG_ERROR,
                    "instance %s: the NATS server does not permit its subscriptions (%s, %s, %s)",
                    ing->instance_id, ing->req_subj, ing->ctl_subj, lv);
            rv = SW_EPERM;
            goto fail;
        }
    }
    /* Only now may a handler run: a request that came before was handed
     * back unrun (intake.c), for a start that fails after subscribing must
     * run none. */
    pthread_mutex_lock(&ing->mu);
    ing->started = 1;
    pthread_mutex_unlock(&ing->mu);
    swi_log(&ing->log, SW_LOG_INFO, "serving %s as instance %s on %s", ing->endpoint,
            ing->instance_id, ing->req_subj);
    *out = ing;
    return SW_OK;
fail:
    ing_stop(ing);
    ing_unref(ing);
    return rv;
}

size_t
swn_ing_sweep_take(sw_ingress *ing, swn_sweep *w, sw_responder **out, size_t max)
{
    sw_responder *prev = w->at, *r;
    size_t n = 0;
    if (w->done)
        return 0;
    pthread_mutex_lock(&ing->mu);
    for (r = prev != NULL ? prev->all_next : ing->all; r != NULL; r = r->all_next) {
        if ((w->all || r->registered) && resp_tryref(r)) {
            out[n++] = r;
            if (n == max)
                break;
        }
    }
    if (r != NULL) {
        swn_resp_ref(r); /* the sweep's place: r stays in the list until it is let go */
        w->at = r;
    } else {
        w->at = NULL;
        w->done = 1;
    }
    pthread_mutex_unlock(&ing->mu);
    if (prev != NULL)
        swn_resp_unref(prev); /* (may free it, taking ing->mu) */
    return n;
}

/* Ends the streams still open (all, or the migratable ones) with a final
 * instance_lost: their frontends migrate them, or report the loss. */
static void
ing_hand_back(sw_ingress *ing, int only_migratable, const char *msg)
{
    sw_responder *batch[SWN_SWEEP_BATCH];
    swn_sweep w = {.all = 0}; /* the registered ones */
    size_t n;
    while ((n = swn_ing_sweep_take(ing, &w, batch, SWN_SWEEP_BATCH)) > 0) {
        for (size_t i = 0; i < n; i++) {
            sw_responder *r = batch[i];
            int newly = 0;
            pthread_mutex_lock(&r->mu);
            if (!r->terminated && (r->migratable || !only_migratable)) {
                newly = !r->cancelled;
                r->cancelled = 1;
                (void)swn_resp_send_failed(r, SW_INSTANCE_LOST, NULL, msg, SWN_BY_OTHER);
            }
            pthread_mutex_unlock(&r->mu);
            if (newly)
                swn_resp_fire_cancel(r);
            swn_resp_unref(r);
        }
    }
}

/* Closes the request subscription (once sw_ingress_stats_get cannot be
 * reading its queue). */
static void
ing_close_requests(sw_ingress *ing)
{
    swt_sub *sub;
    pthread_mutex_lock(&ing->req_mu);
    sub = ing->req_sub;
    ing->req_sub = NULL;
    pthread_mutex_unlock(&ing->req_mu);
    swt_sub_close(ing->conn, &sub);
}

sw_err
sw_ingress_drain(sw_ingress *ing, int64_t grace_ms)
{
    int64_t until;
    sw_err rv = SW_OK;

    if (ing == NULL)
        return SW_EINVAL;
    pthread_mutex_lock(&ing->mu);
    ing->draining = 1; /* from now on every request is refused */
    pthread_mutex_unlock(&ing->mu);
    /* No new requests; those already delivered are refused. Not waited
     * for here: an inline handler may be running on the subscription's
     * thread, and only the hand-backs below end its stream. */
    swt_sub_drain_start(ing->conn, ing->req_sub);
    /* Streams whose frontend migrates them move on at once, rather than
     * keep this worker for the grace period. */
    ing_hand_back(ing, 1, "the worker is draining; the frontend migrates the stream");
    until = swi_now_ms() + (grace_ms > 0 ? grace_ms : 0);
    pthread_mutex_lock(&ing->mu);
    while (ing->inflight > 0 && swi_now_ms() < until)
        swi_cond_wait_until(&ing->dcv, &ing->mu, until);
    if (ing->inflight > 0)
        rv = SW_ETIMEDOUT;
    pthread_mutex_unlock(&ing->mu);
    /* Out of time: end what is left. The frontend sees instance_lost. */
    if (rv != SW_OK)
        ing_hand_back(ing, 0, "the worker is shutting down");
    ing_close_requests(ing);
    return rv;
}

/* Stops threads and subscriptions; safe on a half-built ingress. */
static void
ing_stop(sw_ingress *ing)
{
    ing_close_requests(ing);
    swt_sub_close(ing->conn, &ing->ctl_sub);
    swt_sub_close(ing->conn, &ing->live_sub);
    pthread_mutex_lock(&ing->mu);
    ing->stopping = 1;
    pthread_cond_broadcast(&ing->cv);
    pthread_mutex_unlock(&ing->mu);
    for (unsigned i = 0; i < ing->started_threads; i++)
        pthread_join(ing->threads[i], NULL);
    ing->started_threads = 0;
    swi_ticker_stop(&ing->timer);
    swn_ing_timer_fini(ing);
    swi_ticker_stop(&ing->live_ticker);
    /* Last: it publishes what the others queued (finals included), then
     * quits; from then on every stream publishes inline. */
    pthread_mutex_lock(&ing->smu);
    if (ing->sender_on) {
        ing->sender_stop = 1;
        pthread_cond_signal(&ing->scv);
        pthread_mutex_unlock(&ing->smu);
        pthread_join(ing->sender, NULL);
    } else {
        pthread_mutex_unlock(&ing->smu);
    }
}

void
sw_ingress_destroy(sw_ingress *ing)
{
    sw_responder *batch[SWN_SWEEP_BATCH];
    swn_sweep w = {.all = 1}; /* every responder alive */
    size_t n;
    if (ing == NULL)
        return;
    (void)sw_ingress_drain(ing, 0);
    ing_stop(ing);
    /* Requests still queued never reached a handler: drop their hold. */
    for (;;) {
        sw_responder *r;
        pthread_mutex_lock(&ing->mu);
        r = ing->q_head;
        if (r != NULL) {
            ing->q_head = r->qnext;
            if (ing->q_head == NULL)
                ing->q_tail = NULL;
        }
        pthread_mutex_unlock(&ing->mu);
        if (r == NULL)
            break;
        swn_resp_drop_hold(r, "handler_returned", "shutting down");
    }
    /* Every responder still alive, registered or not (a retained one whose
     * final was acknowledged is no longer registered): closed from now on.
     * A sweep, which needs no memory: a user's handler thread may still
     * hold one, and must find it closed. */
    while ((n = swn_ing_sweep_take(ing, &w, batch, SWN_SWEEP_BATCH)) > 0) {
        for (size_t i = 0; i < n; i++) {
            sw_responder *r = batch[i];
            pthread_mutex_lock(&r->mu);
            r->closed = 1;
            pthread_cond_broadcast(&r->cv);
            /* A thread publishing r's items (mu dropped) finishes before the
             * caller may close the connection. */
            while (r->sending)
                (void)swi_cond_wait_until(&r->cv, &r->mu, swi_now_ms() + 100);
            pthread_mutex_unlock(&r->mu);
            swn_unregister_stream(r);
            swn_resp_unref(r);
        }
    }
    swi_log(&ing->log, SW_LOG_INFO, "instance %s stopped", ing->instance_id);
    ing_unref(ing);
}

const char *
sw_ingress_instance_id(const sw_ingress *ing)
{
    return ing ? ing->instance_id : "";
}

const char *
sw_ingress_endpoint(const sw_ingress *ing)
{
    return ing ? ing->endpoint : "";
}

const char *
sw_ingress_request_subject(const sw_ingress *ing)
{
    return ing ? ing->req_subj : "";
}

const char *
sw_ingress_control_subject(const sw_ingress *ing)
{
    return ing ? ing->ctl_subj : "";
}

void
sw_ingress_stats_get(sw_ingress *ing, sw_ingress_stats *out)
{
    if (ing == NULL || out == NULL)
        return;
    pthread_mutex_lock(&ing->mu);
    *out = ing->st;
    out->streams_held = ing->streams.live;
    pthread_mutex_unlock(&ing->mu);
    pthread_mutex_lock(&ing->req_mu);
    out->requests_waiting = (uint64_t)swt_sub_pending(ing->req_sub);
    pthread_mutex_unlock(&ing->req_mu);
}
