/* ingress/intake.c -- requests: decoding, admission (draining, duplicate,
 * concurrency limit), rejections, and the handler pool.
 *
 * Threads: the request subscription's nats.c thread (swn_ing_on_request)
 * and the `handler_threads` pool threads (swn_ing_worker_main, which call
 * the user's handler with no lock held); with `handler_inline` there is no
 * pool and the request's own thread calls the handler, after the unlock.
 * Locks: ing->mu (table, queue, counters); never r->mu (a new responder is
 * not shared yet). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ingress/ingress_int.h"

/* Answers a request that cannot be served with a one-item stream: a final
 * wrapper (seq 1) carrying a streamwire error code. */
static void
ing_reject_as(sw_ingress *ing, const char *subject, const uint8_t id[SW_REQUEST_ID_BYTES],
              sw_err code, const char *message, int plain)
{
    swp_terminal t = STREAMWIRE__V1__TERMINAL__INIT;
    swp_error e = STREAMWIRE__V1__ERROR__INIT;
    uint8_t *buf = NULL;
    size_t len = 0;
    swn_term_failed(&t, &e, code, NULL, message);
    if (swn_resp_pack_final(id, ing->instance_id, 1, &t, sw_conn_max_payload(ing->conn), &buf,
                            &len) == SW_OK)
        (void)(plain ? swt_publish_plain : swt_publish)(ing->conn, subject, NULL, buf, len);
    free(buf);
}

static void
ing_reject(sw_ingress *ing, const char *subject, const uint8_t id[SW_REQUEST_ID_BYTES], sw_err code,
           const char *message)
{
    ing_reject_as(ing, subject, id, code, message, 0);
}

/* The trace id of the request's last valid traceparent header into out
 * ("" if none), as the router takes it (egress/open.c). */
static void
intake_trace_id(const swp_request *req, char out[SWI_TRACE_ID_LEN + 1])
{
    char t[SWI_TRACE_ID_LEN + 1];
    out[0] = '\0';
    for (size_t i = 0; i < req->n_headers; i++)
        if (strcmp(req->headers[i]->key, "traceparent") == 0 &&
            swi_trace_id(req->headers[i]->value, t))
            memcpy(out, t, sizeof(t));
}

/* The tag a log line about a request refused before it has a responder
 * names it by: its id, and its trace id (streamwire.h, sw_header). */
static void
intake_logtag(const swp_request *req, char out[SWI_LOGTAG_MAX])
{
    char hex[SW_REQUEST_ID_HEX], trace[SWI_TRACE_ID_LEN + 1];
    swi_hex(hex, req->request_id.data, SW_REQUEST_ID_BYTES);
    intake_trace_id(req, trace);
    swi_logtag(out, hex, trace);
}

/* Copies the request's headers into r (one block: the pointer pairs, then
 * the strings; the decoder has bounded their count and sizes) and finds
 * the trace id. 0, or -1 without memory. */
static int
intake_headers(sw_responder *r, const swp_request *req)
{
    size_t bytes = 0;
    char *at;
    r->trace_id[0] = '\0';
    if (req->n_headers > 0) {
        for (size_t i = 0; i < req->n_headers; i++)
            bytes += strlen(req->headers[i]->key) + strlen(req->headers[i]->value) + 2;
        bytes += 2 * req->n_headers * sizeof(char *);
        if ((r->hdr = malloc(bytes)) == NULL)
            return -1;
        r->hbytes = bytes;
        __atomic_fetch_add(&r->ing->req_bytes, (uint64_t)bytes, __ATOMIC_RELAXED);
        at = (char *)(r->hdr + 2 * req->n_headers);
        for (size_t i = 0; i < req->n_headers; i++) {
            for (int k = 0; k < 2; k++) {
                const char *v = k ? req->headers[i]->value : req->headers[i]->key;
                size_t n = strlen(v) + 1;
                memcpy(at, v, n);
                r->hdr[2 * i + (size_t)k] = at;
                at += n;
            }
        }
        r->nhdr = req->n_headers;
        intake_trace_id(req, r->trace_id);
    }
    swi_logtag(r->logtag, r->idhex, r->trace_id);
    return 0;
}

void
swn_ing_on_request(const swt_msg *msg, void *arg)
{
    sw_ingress *ing = arg;
    const char *reply = msg->reply;
    const uint8_t *data = msg->data;
    size_t len = msg->len;
    swp_request *req = NULL;
    sw_responder *r = NULL;
    uint8_t rid[SW_REQUEST_ID_BYTES];
    sw_err rv;
    int overloaded = 0, dup = 0, refused = 0;
    int64_t now;

    if (msg->no_responders) {
        /* Never a request: the server sends this status only to a reply
         * subject, so this one is forged (an empty message with "Status:
         * 503"). Not answered at all: its reply subject is the sender's
         * choice, another router's stream say, and an error final there
         * (sealed by this worker, or a plain auth_failed) would end that
         * stream. A sealing connection refused it (auth_failed): counted. */
        if (msg->auth_failed) {
            pthread_mutex_lock(&ing->mu);
            ing->st.auth_failures++;
            pthread_mutex_unlock(&ing->mu);
        }
        swi_log(&ing->log, SW_LOG_WARN,
                "a \"no responders\" status on %s, where none can come: forged, ignored",
                ing->req_subj);
        goto done;
    }
    if (msg->auth_failed) {
        /* Sealing does not match (a sealed request here without a key, an
         * unsealed one on a sealed worker, or one that did not open): never
         * served. A plain auth_failed final tells a frontend whose sealing
         * differs at once, instead of leaving it to time out; a sealed
         * frontend refuses it as unsealed, which ends the same way. */
        pthread_mutex_lock(&ing->mu);
        ing->st.auth_failures++;
        pthread_mutex_unlock(&ing->mu);
        if (swt_is_response_subject(reply) && swt_response_subject_id(reply, rid) == 0)
            ing_reject_as(ing, reply, rid, SW_AUTH_FAILED,
                          sw_conn_sealed(ing->conn)
                              ? "the worker seals, and the request was not sealed with its key"
                              : "the request is sealed and the worker has no key",
                          1);
        swi_log(&ing->log, SW_LOG_WARN, "request on %s refused: it does not open (auth_failed)",
                ing->req_subj);
        goto done;
    }
    rv = swp_decode_request_arena(data, len, ing->max_req, ing->req_arena, &req);
    if (rv != SW_OK) {
        pthread_mutex_lock(&ing->mu);
        ing->st.bad_requests++;
        pthread_mutex_unlock(&ing->mu);
        if (swt_is_response_subject(reply) && swt_response_subject_id(reply, rid) == 0) {
            swi_log(&ing->log, SW_LOG_WARN,
                    "bad request on %s: %s; answered with an error terminal", ing->req_subj,
                    sw_err_name(rv));
            ing_reject(ing, reply, rid, rv, sw_strerror(rv));
        } else {
            swi_log(&ing->log, SW_LOG_WARN,
                    "bad request on %s: %s; no usable reply subject, dropped", ing->req_subj,
                    sw_err_name(rv));
        }
        goto done;
    }
    {
        /* A request names its own response subject,
         * sw.rsp.<router_id>.<request id>, and no other: the worker is no
         * reflector to subjects of someone else's choosing (issue 11 #12).
         * Such a request gets nothing back. */
        char own[SWT_SUBJECT_MAX], hex[SW_REQUEST_ID_HEX];
        swi_hex(hex, req->request_id.data, SW_REQUEST_ID_BYTES);
        if (swt_subject_response(own, sizeof(own), req->router_id, hex) != SW_OK ||
            strcmp(own, req->response_subject) != 0) {
            pthread_mutex_lock(&ing->mu);
            ing->st.bad_requests++;
            pthread_mutex_unlock(&ing->mu);
            char tag[SWI_LOGTAG_MAX];
            intake_logtag(req, tag);
            swi_log(&ing->log, SW_LOG_WARN,
                    "request %s on %s names a response subject that is not its own; dropped", tag,
                    ing->req_subj);
            goto done;
        }
    }
    if (ing->max_age_ms > 0 && req->issued_unix_ms != 0) {
        /* Issued longer ago than allowed (sw_ingress_opts.max_request_age_ms,
         * at most the memory of served ids): a replay that memory may have
         * forgotten, or clocks apart. Never run; answered with an error the
         * sender's stream ends on. */
        int64_t issued = req->issued_unix_ms > INT64_MAX ? 0 : (int64_t)req->issued_unix_ms;
        int64_t age_ms = swi_unix_ms() - issued;
        if (age_ms > ing->max_age_ms) {
            char why[160], tag[SWI_LOGTAG_MAX];
            int known;
            pthread_mutex_lock(&ing->mu);
            ing->st.replays++;
            /* A copy of a request that runs here, ran recently, or was
             * refused here: dropped in silence, as any duplicate (an error
             * final on its subject could end the live stream, or the one
             * it moved to). */
            known = swi_idmap_get(&ing->streams, req->request_id.data) != NULL ||
                    swn_ing_was_here(ing, req->request_id.data, swi_now_ms());
            pthread_mutex_unlock(&ing->mu);
            if (known)
                goto done;
            snprintf(why, sizeof(why),
                     "the request was issued %lld s ago by its sender's clock (at most %lld s): "
                     "a replay, or clocks apart",
                     (long long)(age_ms / 1000), (long long)(ing->max_age_ms / 1000));
            intake_logtag(req, tag);
            swi_log(&ing->log, SW_LOG_WARN, "request %s on %s refused: %s", tag, ing->req_subj,
                    why);
            ing_reject(ing, req->response_subject, req->request_id.data, SW_EPROTO, why);
            goto done;
        }
    }
    if (req->endpoint[0] != '\0' && strcmp(req->endpoint, ing->endpoint) != 0) {
        char tag[SWI_LOGTAG_MAX];
        pthread_mutex_lock(&ing->mu);
        ing->st.bad_requests++;
        pthread_mutex_unlock(&ing->mu);
        intake_logtag(req, tag);
        swi_log(&ing->log, SW_LOG_WARN, "request %s on %s refused: it is for endpoint %.128s", tag,
                ing->req_subj, req->endpoint);
        ing_reject(ing, req->response_subject, req->request_id.data, SW_EINVAL,
                   "request for another endpoint");
        goto done;
    }

    if ((r = calloc(1, sizeof(*r))) == NULL)
        goto nomem;
    r->ing = ing;
    /* Its due-time cell (due at the first tick), detached until registered. */
    if ((r->next_tick = swi_duetab_add(&ing->due, NULL, 0)) == NULL) {
        free(r);
        r = NULL;
        goto nomem;
    }
    atomic_init(&r->refs, 2); /* table + user hold */
    r->holds = 1;
    pthread_mutex_init(&r->mu, NULL);
    swi_cond_init(&r->cv);
    memcpy(r->id, req->request_id.data, SW_REQUEST_ID_BYTES);
    swi_hex(r->idhex, r->id, SW_REQUEST_ID_BYTES);
    swi_strlcpy(r->resp_subj, req->response_subject, sizeof(r->resp_subj));
    swi_strlcpy(r->router_id, req->router_id, sizeof(r->router_id));
    /* The reply subject is the standard one (checked above), so the
     * router's heartbeat batches cover this stream. */
    r->beats_batched = 1;
    r->max_tokens = req->max_tokens;
    r->resume_from = req->resume_from_seq;
    r->migratable = req->migratable;
    r->window = req->credit_window;
    if (r->window > ing->max_window) {
        r->window = ing->max_window;
        r->capped = 1;
    }
    r->wmax = r->window;
    if (r->window != 0 && req->credit_window_max > r->window) {
        /* The frontend may grow its window up to credit_window_max (tuned
         * to how fast its consumer takes items): accept up to our cap. */
        r->wmax =
            req->credit_window_max < ing->max_window ? req->credit_window_max : ing->max_window;
        r->grow = r->wmax > r->window;
    }
    r->credit_limit = r->window ? r->window : UINT64_MAX;
    r->credit_bytes = r->window != 0 ? req->credit_bytes : 0;
    r->byte_limit = r->credit_bytes != 0 ? r->credit_bytes : UINT64_MAX;
    r->hb_ms = req->heartbeat_ms;
    if (r->hb_ms != 0 && r->hb_ms < SWN_MIN_HEARTBEAT_MS)
        r->hb_ms = SWN_MIN_HEARTBEAT_MS;
    if (r->hb_ms > SWN_MAX_HEARTBEAT_MS)
        r->hb_ms = SWN_MAX_HEARTBEAT_MS; /* also bounds how long a final waits for its ack */
    r->idle_hb_ms = r->hb_ms;
    r->beat_seq = UINT64_MAX; /* no beat yet: the first one comes after hb_ms */
    if (r->hb_ms != 0 && req->idle_heartbeat_ms > r->hb_ms)
        r->idle_hb_ms = req->idle_heartbeat_ms < SWN_MAX_HEARTBEAT_MS ? req->idle_heartbeat_ms
                                                                      : SWN_MAX_HEARTBEAT_MS;
    r->last_pub_ms = swi_now_ms();
    r->deadline_ms = req->deadline_ms ? r->last_pub_ms + (req->deadline_ms < SWN_MAX_DEADLINE_MS
                                                              ? (int64_t)req->deadline_ms
                                                              : SWN_MAX_DEADLINE_MS)
                                      : -1;
    if (req->payload.len > 0) {
        if ((r->payload = malloc(req->payload.len)) == NULL)
            goto nomem;
        memcpy(r->payload, req->payload.data, req->payload.len);
        r->plen = req->payload.len;
        __atomic_fetch_add(&ing->req_bytes, (uint64_t)r->plen, __ATOMIC_RELAXED);
    }
    if (intake_headers(r, req) != 0 || swn_ring_init(&r->rg, r->wmax) != 0)
        goto nomem;

    pthread_mutex_lock(&ing->mu);
    now = swi_now_ms();
    if (!ing->started) {
        /* Delivered while sw_ingress_start is under way, which may still
         * fail (and its caller free what the handler uses): never run. */
        refused = 2;
    } else if (ing->draining || ing->stopping) {
        refused = 1; /* delivered before the drain told the server (inline: queued behind a
                        handler); never run */
    } else if (swi_idmap_get(&ing->streams, r->id) != NULL) {
        dup = 1;
    } else if (swn_early_take(ing, r->id, r->router_id)) {
        /* Its cancel came first: never started, nothing sent (the frontend
         * has already ended the stream). */
        dup = 1;
        ing->st.cancels++;
        swi_idq_add(&ing->refused, r->id, r->router_id, now);
    } else if (swn_ing_was_here(ing, r->id, now)) {
        /* Served here already and over, or refused here: a replay (a
         * frontend never sends a request again once its stream ended;
         * another instance gets it after "no responders"). Never run
         * twice, nor later: a refused request replayed once the worker
         * had room used to run. */
        dup = 1;
        ing->st.replays++;
    } else if (ing->inflight >= ing->max_inflight) {
        overloaded = 1;
        ing->st.rejected_overload++;
        swi_idq_add(&ing->refused, r->id, r->router_id, now);
    } else if (swi_idmap_put(&ing->streams, r->id, r) != 0) {
        pthread_mutex_unlock(&ing->mu);
        goto nomem;
    } else {
        atomic_fetch_add(&ing->refs, 1);
        r->all_next = ing->all;
        if (ing->all != NULL)
            ing->all->all_prev = r;
        ing->all = r;
        r->registered = 1;
        r->counted = 1;
        swn_resp_ref(r); /* for swn_ing_live_note below (it may be unregistered by then) */
        ing->inflight++;
        ing->st.inflight = ing->inflight;
        ing->st.requests++;
        swi_idq_add(&ing->seen, r->id, r->router_id, now);
        if (!ing->inline_handlers) {
            if (ing->q_tail)
                ing->q_tail->qnext = r;
            else
                ing->q_head = r;
            ing->q_tail = r;
        }
        /* Last: the timer may look at r from now on (it takes no ing->mu),
         * and must find it registered and counted. */
        swi_duetab_attach(&ing->due, r->next_tick, r);
    }
    if (refused)
        swi_idq_add(&ing->refused, r->id, r->router_id, now);
    pthread_mutex_unlock(&ing->mu);
    swi_ticker_wake(&ing->timer, 1); /* (a resting timer: a stream to time now) */
    if (refused) {
        /* As a drain hands back a stream it ran: the frontend migrates it,
         * or its consumer sees instance_lost. */
        const char *why = refused == 2 ? "is starting" : "is draining";
        char text[80];
        swi_log(&ing->log, SW_LOG_INFO, "request %s handed back: the worker %s", r->logtag, why);
        snprintf(text, sizeof(text), "the worker %s; the request did not run", why);
        ing_reject(ing, req->response_subject, r->id, SW_INSTANCE_LOST, text);
        goto free_r;
    }
    if (overloaded) {
        swi_log(&ing->log, SW_LOG_WARN, "request %s rejected: overloaded (%u in flight)", r->logtag,
                ing->max_inflight);
        ing_reject(ing, req->response_subject, r->id, SW_EOVERLOADED,
                   "the instance is at its concurrency limit");
        goto free_r;
    }
    if (dup)
        goto free_r;
    /* Accepted. After the unlock: a handler thread woken under ing->mu
     * would only block on it again. */
    if (!ing->inline_handlers)
        pthread_cond_signal(&ing->cv);
    swn_ing_live_note(ing, r); /* (r may be unregistered already: it is not counted then) */
    if (ing->inline_handlers)
        swn_ing_run_handler(ing, r); /* on this thread: r is held until it returns */
    swn_resp_unref(r);
    goto done;

nomem:
    swi_log(&ing->log, SW_LOG_ERROR, "out of memory accepting a request");
    ing_reject(ing, req->response_subject, req->request_id.data, SW_ENOMEM, "worker out of memory");
free_r:
    if (r != NULL) {
        swn_ring_free(&r->rg);
        swn_resp_free_request(r);
        pthread_mutex_destroy(&r->mu);
        pthread_cond_destroy(&r->cv);
        swi_duetab_release(&ing->due, r->next_tick);
        free(r);
    }
done:
    swp_free_arena(req, ing->req_arena);
}

void *
swn_ing_worker_main(void *arg)
{
    sw_ingress *ing = arg;
    for (;;) {
        sw_responder *r;
        pthread_mutex_lock(&ing->mu);
        while (ing->q_head == NULL && !ing->stopping)
            pthread_cond_wait(&ing->cv, &ing->mu);
        if (ing->q_head == NULL) {
            pthread_mutex_unlock(&ing->mu);
            return NULL;
        }
        r = ing->q_head;
        ing->q_head = r->qnext;
        if (ing->q_head == NULL)
            ing->q_tail = NULL;
        r->qnext = NULL;
        pthread_mutex_unlock(&ing->mu);
        swn_ing_run_handler(ing, r);
    }
}

void
swn_ing_run_handler(sw_ingress *ing, sw_responder *r)
{
    if (!sw_responder_cancelled(r)) {
        if (ing->inline_handlers)
            swn_resp_inline_begin(r);
        ing->handler(r, ing->handler_arg);
        if (ing->inline_handlers)
            swn_resp_inline_end(r);
    }
    swn_resp_drop_hold(r, "handler_returned", "the handler returned without a terminal");
}
