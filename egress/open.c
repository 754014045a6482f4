/* egress/open.c -- sw_router_open: picks the instance (or takes the one
 * named), registers the stream in the table, sends the request; and the
 * one-time re-route of a registry-routed request that meets "no
 * responders". Locks: r->mu, then s->mu (the instance switch). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "egress/egress_int.h"

/* The heartbeat interval a stream with nothing new may have (Request.
 * idle_heartbeat_ms): 500 ms short of the silence that ends the stream,
 * or heartbeat_ms + SWE_ASK_ROOM_MS short of it when that is more. A lost
 * idle beat is made up for by asking the worker: a stream PROBE once the
 * stream has been silent this interval and a heartbeat more (rx.h
 * act->ask, probe.c), which leaves at least SWE_ASK_ROOM_MS for the answer
 * before the silence limit; so one lost beat still costs nothing. The
 * default silence, 4 x heartbeat_ms + 500, gives 4 x heartbeat_ms (3 x
 * heartbeat_ms + 250 above a heartbeat of 250 ms): 1,000 ms with the
 * default 250, half the idle beats of the 500 ms asked before the stream
 * probes ((silence - 500) / 2: two beats in the limit). 0 (every
 * heartbeat_ms) when the silence allows no more. */
#define SWE_ASK_ROOM_MS 250
static uint32_t
swe_idle_heartbeat(uint32_t hb_ms, int64_t inactivity_ms)
{
    int64_t room = (int64_t)hb_ms + SWE_ASK_ROOM_MS > 500 ? (int64_t)hb_ms + SWE_ASK_ROOM_MS : 500;
    int64_t idle = inactivity_ms - room;
    if (hb_ms == 0 || idle <= (int64_t)hb_ms)
        return 0;
    return idle < (int64_t)SWP_MAX_HEARTBEAT_MS ? (uint32_t)idle : SWP_MAX_HEARTBEAT_MS;
}

/* A request routed by the registry found nobody on the instance's request
 * subject (it drains, or died since the last probe): quarantine that
 * instance here and send the same request, once, to another. Returns 1 if
 * the request went out again. The instance switch holds r->mu, then s->mu
 * (readers of the instance take swe_instance). */
int
swe_reroute(sw_stream *s)
{
    char tag[SWI_LOGTAG_MAX];
    sw_router *r = s->r;
    char old[SW_MAX_TOKEN + 1], next[SW_MAX_TOKEN + 1];
    char req_subj[SWT_SUBJECT_MAX], resp_subj[SWT_SUBJECT_MAX];
    uint8_t *buf = NULL;
    size_t len = 0;
    char *second = NULL;
    int moved = 0;

    pthread_mutex_lock(&s->mu);
    /* not while a migration moves it (the probe thread may have declared
     * the instance lost meanwhile): that move owns the stream's instance */
    if (!s->routed || s->rerouted || s->req_buf == NULL || s->rx.term_state != SWE_TERM_NONE ||
        s->rx.migrating || (buf = malloc(s->req_len)) == NULL ||
        (second = malloc(SWE_SECOND_BYTES)) == NULL) {
        pthread_mutex_unlock(&s->mu);
        free(buf);
        return 0;
    }
    s->rerouted = 1;
    memcpy(buf, s->req_buf, s->req_len);
    len = s->req_len;
    swi_strlcpy(old, swe_instance(s), sizeof(old));
    pthread_mutex_unlock(&s->mu);

    (void)swr_pool_quarantine(r->pool, old); /* local only: it may be alive and draining */
#ifdef SW_CHAOS
    if (r->reroute_hook != NULL) /* swx_router_on_reroute */
        r->reroute_hook(s, r->reroute_hook_arg);
#endif
    /* Checked again, with s->mu held from the check to the switch: a
     * migration (the probe thread, the ticker) may have begun or even moved
     * the stream to another request and instance since the check above; it
     * owns the stream's instance then. (Switching anyway released the old
     * instance twice, and pointed the stream's controls at an instance its
     * request never went to.) Lock order: r->mu, s->mu, the pool's. */
    pthread_mutex_lock(&r->mu);
    pthread_mutex_lock(&s->mu);
    if (s->in_table && s->pooled && !s->rx.migrating && s->rx.gen == 0 &&
        s->rx.term_state == SWE_TERM_NONE && strcmp(swe_instance(s), old) == 0 &&
        swr_pool_pick(r->pool, s->endpoint, swe_instance_load, r, next) == SW_OK &&
        swi_peers_use(&r->peers, next, swi_now_ms()) == 0) {
        swi_peers_release(&r->peers, old);
        memcpy(second, next, sizeof(next));
        /* the terminal's instances: both (swe_instances) */
        snprintf(second + SW_MAX_TOKEN + 1, SWE_SECOND_BYTES - (SW_MAX_TOKEN + 1), "%s,%s", old,
                 next);
        s->inst_second = second;
        second = NULL;
        __atomic_store_n(&s->inst_pub, s->inst_second, __ATOMIC_RELEASE);
        moved = 1;
    }
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_unlock(&r->mu);
    free(second);
    if (!moved) {
        free(buf);
        return 0;
    }
    (void)swt_subject_request(req_subj, sizeof(req_subj), s->endpoint, next);
    (void)swt_subject_response(resp_subj, sizeof(resp_subj), r->id, s->idhex);
    swi_log(&r->log, SW_LOG_INFO, "stream %s: no responder on %s; re-routed to %s",
            swe_logtag(s, tag), old, next);
    moved = swt_publish(r->conn, req_subj, resp_subj, buf, len) == SW_OK;
    free(buf);
    return moved;
}

/* The request headers: at most SWP_MAX_HEADERS, keys 1..128 bytes and
 * unique, values up to 4096 bytes (the bounds a worker's decoder enforces).
 * Returns 0 if they are acceptable. */
static int
open_headers_ok(const sw_request_opts *o)
{
    if (o->nheaders == 0)
        return 1;
    if (o->headers == NULL || o->nheaders > SWP_MAX_HEADERS)
        return 0;
    for (size_t i = 0; i < o->nheaders; i++) {
        const sw_header *h = &o->headers[i];
        size_t kl = h->key ? strlen(h->key) : 0;
        if (kl == 0 || kl > SWP_MAX_HEADER_KEY || h->value == NULL ||
            strlen(h->value) > SWP_MAX_HEADER_VALUE)
            return 0;
        for (size_t j = 0; j < i; j++)
            if (strcmp(o->headers[j].key, h->key) == 0)
                return 0;
    }
    return 1;
}

sw_err
sw_router_open(sw_stream **out, sw_router *r, const sw_request_opts *o, const void *payload,
               size_t len)
{
    Streamwire__V1__Request__HeadersEntry hent[SWP_MAX_HEADERS];
    Streamwire__V1__Request__HeadersEntry *hptr[SWP_MAX_HEADERS];
    char trace[SWI_TRACE_ID_LEN + 1] = "";
    sw_stream *s;
    char req_subj[SWT_SUBJECT_MAX];
    char resp_subj[SWT_SUBJECT_MAX];
    swp_request m = STREAMWIRE__V1__REQUEST__INIT;
    swe_rx_cfg cfg;
    uint8_t *buf = NULL;
    size_t blen = 0;
    sw_err rv;
    int full = 0, closing = 0, no_instances = 0, pending;
    char picked[SW_MAX_TOKEN + 1];
    int64_t now;
    uint32_t hb, idle_hb;
    unsigned migrations;

    if (out == NULL || r == NULL || o == NULL || (payload == NULL && len != 0))
        return SW_EINVAL;
    *out = NULL;
    if (sw_validate_endpoint(o->endpoint) != SW_OK ||
        (o->instance_id != NULL && sw_validate_token(o->instance_id) != SW_OK) ||
        o->credit_window > SWP_MAX_WINDOW || o->heartbeat_ms > SWP_MAX_HEARTBEAT_MS ||
        o->heartbeat_ms < 0 || o->deadline_ms < 0 || o->deadline_ms > UINT32_MAX ||
        o->migration_limit < -1 || o->migration_limit > SW_MAX_MIGRATIONS || !open_headers_ok(o))
        return SW_EINVAL;
    /* Migration needs the registry's choice of instance. */
    migrations = o->instance_id != NULL || o->migration_limit < 0 ? 0
                 : o->migration_limit > 0                         ? (unsigned)o->migration_limit
                                                                  : (unsigned)r->migration_limit;
    if ((s = calloc(1, sizeof(*s))) == NULL)
        return SW_ENOMEM;
    atomic_init(&s->refs, 1);
    s->t_open_ns = swi_now_ns();
    atomic_fetch_add(&r->refs, 1);
    s->r = r;
    pthread_mutex_init(&s->mu, NULL);
    swi_cond_init(&s->cv);
    swi_random(s->id, sizeof(s->id));
    swi_hex(s->idhex, s->id, sizeof(s->id));
    for (size_t i = 0; i < o->nheaders; i++)
        if (strcmp(o->headers[i].key, "traceparent") == 0 &&
            swi_trace_id(o->headers[i].value, trace))
            if (swi_unhex(s->trace, trace, sizeof(s->trace)) != 0) /* (32 hex digits: never) */
                memset(s->trace, 0, sizeof(s->trace));
    /* A named instance is taken as is; otherwise the pool picks one below,
     * under r->mu, together with counting the stream on it. */
    if (o->instance_id != NULL)
        swi_strlcpy(s->inst_first, o->instance_id, sizeof(s->inst_first));
    /* The router's copy of the endpoint once a stream to it has been
     * counted in a series of its own; a stream that opens before that (the
     * endpoint's first, or one racing it) or past SWE_EP_MAX endpoints
     * takes a copy of its own. */
    if ((s->endpoint = swe_ep_name(r, o->endpoint)) == NULL) {
        char *own = strdup(o->endpoint);
        if (own == NULL) {
            swe_stream_unref(s);
            return SW_ENOMEM;
        }
        s->endpoint = own;
        s->endpoint_owned = 1;
    }
    s->inst_pub = s->inst_first;
    s->on_item = o->on_item;
    s->on_item_arg = o->on_item_arg;
    s->on_ready = o->on_item == NULL ? o->on_ready : NULL;
    s->on_ready_arg = o->on_ready_arg;
    s->has_ready = s->on_ready != NULL;
    s->opening = 1;
    now = swi_now_ms();
    cfg.window = o->credit_window ? o->credit_window : r->window;
    /* A window the request chose itself stays fixed (to bound a stream's
     * memory or latency); the router's default window is tuned. */
    cfg.window_max =
        o->credit_window == 0 && r->window_max > cfg.window ? r->window_max : cfg.window;
    cfg.window_bytes = r->credit_bytes;
    cfg.window_bytes_max = cfg.window_max > cfg.window ? r->credit_bytes_max : r->credit_bytes;
    cfg.inactivity_ms = r->inactivity_ms;
    if (o->heartbeat_ms != 0 && o->heartbeat_ms != r->hb_ms)
        cfg.inactivity_ms = 4 * (int64_t)o->heartbeat_ms + 500;
    cfg.gap_ms = r->gap_ms;
    cfg.linger_ms = r->linger_ms;
    cfg.deadline_ms = o->deadline_ms ? now + o->deadline_ms : -1;
    cfg.migrations = migrations;
    cfg.keep_history = migrations > 0 && o->migrate != NULL;
    hb = o->heartbeat_ms ? (uint32_t)o->heartbeat_ms : r->hb_ms;
    idle_hb = swe_idle_heartbeat(hb, cfg.inactivity_ms);
    /* The asks are timed by what the worker does: it beats at least every
     * SWP_BEAT_MAX_MS whatever was asked (both clamped; 16 bits hold it) */
    cfg.hb_ms = (uint16_t)(hb < SWP_BEAT_MAX_MS ? hb : SWP_BEAT_MAX_MS);
    cfg.idle_hb_ms = (uint16_t)(idle_hb < SWP_BEAT_MAX_MS ? idle_hb : SWP_BEAT_MAX_MS);
    swe_rx_init(&s->rx, &cfg, now);
    s->last_rx_ms = now;
    /* Its due-time cell, detached until the stream is in the table. */
    if ((s->next_tick = swi_duetab_add(&r->due, NULL, swe_rx_next_due(&s->rx))) == NULL) {
        swe_stream_unref(s);
        return SW_ENOMEM;
    }
    (void)swt_subject_response(resp_subj, sizeof(resp_subj), r->id, s->idhex);

    m.version = SW_PROTOCOL_VERSION;
    m.request_id.data = s->id;
    m.request_id.len = sizeof(s->id);
    m.issued_unix_ms = (uint64_t)swi_unix_ms();
    m.response_subject = resp_subj;
    m.router_id = r->id;
    m.payload.data = (uint8_t *)payload;
    m.payload.len = len;
    m.credit_window = cfg.window;
    m.credit_window_max = cfg.window_max > cfg.window ? cfg.window_max : 0;
    m.credit_bytes = cfg.window_bytes;
    m.heartbeat_ms = hb; /* (as asked: the worker clamps) */
    m.idle_heartbeat_ms = idle_hb;
    m.deadline_ms = (uint32_t)o->deadline_ms;
    m.endpoint = (char *)o->endpoint;
    m.max_tokens = o->max_tokens;
    for (size_t i = 0; i < o->nheaders; i++) {
        Streamwire__V1__Request__HeadersEntry e = STREAMWIRE__V1__REQUEST__HEADERS_ENTRY__INIT;
        e.key = (char *)o->headers[i].key;
        e.value = (char *)o->headers[i].value;
        hent[i] = e;
        hptr[i] = &hent[i];
    }
    m.n_headers = o->nheaders;
    m.headers = o->nheaders ? hptr : NULL;
    m.migratable = migrations > 0;
    rv = swp_request_encode_alloc(&m, sw_conn_max_payload(r->conn), &buf, &blen);
    if (rv == SW_OK && migrations > 0) {
        /* Kept for the life of the stream: a migration sends it again. */
        if ((s->mig = calloc(1, sizeof(*s->mig) + blen)) == NULL) {
            free(buf);
            swe_stream_unref(s);
            return SW_ENOMEM;
        }
        s->mig->fn = o->migrate;
        s->mig->arg = o->migrate_arg;
        memcpy(s->mig->req, buf, blen);
        s->mig->req_len = blen;
    }

    pthread_mutex_lock(&r->mu);
    if (r->closing || sw_conn_status(r->conn) == SW_CONN_CLOSED)
        closing = 1; /* (a close after this check: the stream gets a terminal) */
    else if (r->st.open_streams >= r->max_streams)
        full = 1;
    else if (swi_idmap_put(&r->streams, s->id, s) != 0)
        full = 2;
    else {
        if (o->instance_id != NULL)
            s->pooled = 1;
        else if (swr_pool_pick(r->pool, o->endpoint, swe_instance_load, r, picked) == SW_OK) {
            /* Set before anyone can find the stream (through r->mu). */
            memcpy(s->inst_first, picked, sizeof(s->inst_first));
            s->pooled = s->routed = 1;
        } else {
            no_instances = 1;
        }
    }
    if (!closing && !full && s->pooled && swi_peers_use(&r->peers, s->inst_first, now) != 0) {
        swi_idmap_del(&r->streams, s->id);
        s->pooled = 0;
        full = 2;
    } else if (!closing && !full) {
        swe_stream_ref(s); /* the table's */
        s->in_table = 1;
        r->st.open_streams++;
        r->st.streams_opened++;
        s->ep = swe_ep_get(r, o->endpoint);
        __atomic_fetch_add(&s->ep->opened, 1, __ATOMIC_RELAXED);
        swi_duetab_attach(&r->due, s->next_tick, s); /* last: the scan may look from now on */
    }
    pthread_mutex_unlock(&r->mu);
    swi_ticker_wake(&r->ticker,
                    SWE_REST_IDLE); /* (an idle router: a stream to scan and probe now) */
    if (closing || full) {
        free(buf);
        swe_stream_unref(s);
        return closing ? SW_ECLOSED : full == 2 ? SW_ENOMEM : SW_EBUSY;
    }
    /* No item callback runs inside this call (a terminal decided here is
     * delivered by the ticker, see `opening`), and the reference taken
     * here keeps the stream valid for the rest of this call whatever other
     * threads do. */
    swe_stream_ref(s);
    *out = s;
    if (no_instances) {
        free(buf);
        swe_stream_fail(s, SW_NO_INSTANCES, "no live instance serves the endpoint", 0);
        goto done;
    }

    /* From here on, every failure is the stream's terminal. */
    (void)swt_subject_request(req_subj, sizeof(req_subj), o->endpoint, s->inst_first);
    if (rv == SW_OK && s->routed) {
        /* Kept until the instance answers, to re-route on no responders. */
        pthread_mutex_lock(&s->mu);
        if ((s->req_buf = malloc(blen)) != NULL) {
            memcpy(s->req_buf, buf, blen);
            s->req_len = blen;
        }
        pthread_mutex_unlock(&s->mu);
    }
    if (rv == SW_OK)
        rv = swt_publish(r->conn, req_subj, resp_subj, buf, blen);
#ifdef SW_CHAOS
    if (rv == SW_OK && r->open_hook != NULL) /* swx_router_on_open_sent */
        r->open_hook(s, r->open_hook_arg);
#endif
    free(buf);
    if (rv == SW_EMSGSIZE)
        swe_stream_fail(s, SW_EMSGSIZE, "the request exceeds the server's max payload", 0);
    else if (rv != SW_OK)
        swe_stream_fail(s, rv, "the request could not be published", 0);
done:
    pthread_mutex_lock(&s->mu);
    s->opening = 0;
    /* Something arrived or ended while dispatch waited: deliver it from the
     * ticker (usually nothing has: no wake-up then). */
    pending = s->rx.qh != NULL || s->rx.term_state == SWE_TERM_QUEUED;
    pthread_mutex_unlock(&s->mu);
    if (s->on_item != NULL && pending)
        swe_defer_dispatch(s);
    swe_stream_unref(s);
    return SW_OK;
}
