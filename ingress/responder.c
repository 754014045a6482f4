/* ingress/responder.c -- the public sw_responder_* API: accessors, send
 * (blocking, non-blocking, droppable, typed), finish, fail, retain/release.
 *
 * Threads: the user's (handler threads or any thread holding a retained
 * responder). Locks: r->mu; ing->mu under it for counters. The log
 * callback is called after r->mu is released. */
#include <stdlib.h>
#include <string.h>

#include "ingress/ingress_int.h"

const void *
sw_responder_payload(const sw_responder *r, size_t *len)
{
    if (r == NULL) {
        if (len)
            *len = 0;
        return NULL;
    }
    if (len)
        *len = r->plen;
    return r->payload;
}

uint32_t
sw_responder_max_tokens(const sw_responder *r)
{
    return r ? r->max_tokens : 0;
}

uint64_t
sw_responder_resume_from(const sw_responder *r)
{
    return r ? r->resume_from : 0;
}

int
sw_responder_migratable(const sw_responder *r)
{
    return r ? r->migratable : 0;
}

const char *
sw_responder_request_id(const sw_responder *r)
{
    return r ? r->idhex : "";
}

const char *
sw_responder_header(const sw_responder *r, const char *key)
{
    if (r == NULL || key == NULL)
        return NULL;
    for (size_t i = 0; i < r->nhdr; i++)
        if (strcmp(r->hdr[2 * i], key) == 0)
            return r->hdr[2 * i + 1];
    return NULL;
}

const char *
sw_responder_trace_id(const sw_responder *r)
{
    return r ? r->trace_id : "";
}

int64_t
sw_responder_deadline_left_ms(const sw_responder *r)
{
    int64_t left;
    if (r == NULL || r->deadline_ms < 0)
        return -1;
    left = r->deadline_ms - swi_now_ms();
    return left > 0 ? left : 0;
}

int
sw_responder_cancelled(const sw_responder *r)
{
    int c;
    if (r == NULL)
        return 1;
    pthread_mutex_lock((pthread_mutex_t *)&r->mu);
    c = r->cancelled || r->closed;
    pthread_mutex_unlock((pthread_mutex_t *)&r->mu);
    return c;
}

void
sw_responder_on_cancel(sw_responder *r, sw_cancel_fn fn, void *arg)
{
    if (r == NULL)
        return;
    pthread_mutex_lock(&r->mu);
    r->cancel_fn = fn;
    r->cancel_arg = arg;
    r->cancel_fired = 0;
    pthread_mutex_unlock(&r->mu);
    swn_resp_fire_cancel(r);
}

/* mode: 0 blocking, 1 non-blocking, 2 droppable */
static sw_err
resp_send(sw_responder *r, const void *data, size_t len, int mode, const char *event)
{
    sw_ingress *ing;
    int64_t wait_until = INT64_MIN; /* the clock is read only if the send waits */
    uint8_t *buf = NULL;
    size_t blen = 0;
    uint64_t seq;
    size_t elen = 0;
    int stalled = 0;
    sw_err rv;

    if (r == NULL || (data == NULL && len != 0))
        return SW_EINVAL;
    if (event != NULL && event[0] != '\0') {
        elen = strnlen(event, SW_MAX_EVENT + 1);
        if (!swp_valid_event(event, elen))
            return SW_EINVAL;
    }
    ing = r->ing;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        if (r->closed) { /* the ingress is gone: that outranks a cancel */
            rv = SW_ECLOSED;
            goto out;
        }
        if (r->cancelled) {
            rv = SW_ECANCELLED;
            goto out;
        }
        if (r->terminated) {
            rv = SW_ECLOSED;
            goto out;
        }
        if (r->rg.next_seq <= r->credit_limit && r->sent_bytes < r->byte_limit)
            break;
        if (swn_resp_release_held(r)) /* the credit comes for items that went out */
            continue;                 /* it dropped mu: look again */
        if (!r->starved) {
            r->starved = 1;
            swn_resp_beat_sooner(r); /* a stalled stream beats every hb_ms */
        }
        if (mode == 2) {
            pthread_mutex_lock(&ing->mu);
            ing->st.items_shed++;
            pthread_mutex_unlock(&ing->mu);
            rv = SW_OK;
            goto out;
        }
        if (mode == 1) {
            rv = SW_EAGAIN;
            goto out;
        }
        if (!stalled) { /* a send that waits for credit: the consumer is slower */
            stalled = 1;
            pthread_mutex_lock(&ing->mu);
            ing->st.credit_stalls++;
            pthread_mutex_unlock(&ing->mu);
        }
        if (wait_until == INT64_MIN)
            wait_until = swi_now_ms() + ing->send_timeout_ms;
        if (swi_cond_wait_until(&r->cv, &r->mu, wait_until) != 0 && swi_now_ms() >= wait_until) {
            rv = SW_ETIMEDOUT;
            goto out;
        }
    }
    if (r->pub_err != SW_OK) { /* an earlier publish failed: say so once */
        rv = swn_resp_take_pub_err(r);
        goto out;
    }
    seq = r->rg.next_seq;
    if (len > swn_resp_max_body(r) ||
        (blen = swp_data_body_size(seq, len, mode == 2, elen)) > swn_resp_max_body(r)) {
        rv = SW_EMSGSIZE; /* nothing consumed, the stream goes on */
        goto out;
    }
    if (!swn_ring_keeps(&r->rg)) { /* no flow control: published at once, not kept */
        swn_sent d = {1, 1, 0, 0};
        if ((buf = malloc(blen)) == NULL) {
            rv = SW_ENOMEM;
            goto out;
        }
        (void)swp_data_body_write(buf, seq, data, len, mode == 2, event, elen);
        rv = swn_resp_publish_one(r, seq, buf, blen, &d);
        free(buf);
        if (rv == SW_OK) {
            r->rg.next_seq++;
            r->starved = 0;
            r->rg.pub_seq = seq;
            swn_resp_beat_sooner(r);
        }
        goto out;
    }
    /* Written straight into the resend ring's chunk (ring.h). */
    if ((buf = swn_ring_room(&r->rg, seq, blen)) == NULL) {
        rv = SW_ENOMEM;
        goto out;
    }
    (void)swp_data_body_write(buf, seq, data, len, mode == 2, event, elen);
    swn_resp_commit(r, seq, blen);
    rv = SW_OK;
    r->rg.next_seq++;
    r->sent_bytes += len;
    r->starved = 0;
    swn_resp_kick(r); /* may drop mu while publishing */
out:
    pthread_mutex_unlock(&r->mu);
    return rv;
}

sw_err
sw_responder_send(sw_responder *r, const void *data, size_t len)
{
    return resp_send(r, data, len, 0, NULL);
}

sw_err
sw_responder_try_send(sw_responder *r, const void *data, size_t len)
{
    return resp_send(r, data, len, 1, NULL);
}

sw_err
sw_responder_send_droppable(sw_responder *r, const void *data, size_t len)
{
    return resp_send(r, data, len, 2, NULL);
}

sw_err
sw_responder_send_event(sw_responder *r, const char *event, const void *data, size_t len,
                        unsigned flags)
{
    if ((flags & ~(SW_SEND_DROPPABLE | SW_SEND_NOWAIT)) != 0)
        return SW_EINVAL;
    return resp_send(r, data, len,
                     (flags & SW_SEND_DROPPABLE) ? 2
                     : (flags & SW_SEND_NOWAIT)  ? 1
                                                 : 0,
                     event);
}

static sw_err
resp_check_open(sw_responder *r)
{
    if (r->closed)
        return SW_ECLOSED;
    if (r->cancelled)
        return SW_ECANCELLED;
    if (r->terminated)
        return SW_ECLOSED;
    return SW_OK;
}

sw_err
sw_responder_finish(sw_responder *r, sw_status status, const char *reason)
{
    swp_terminal t = STREAMWIRE__V1__TERMINAL__INIT;
    sw_err rv;
    if (r == NULL)
        return SW_EINVAL;
    if (status == SW_STATUS_COMPLETED) {
        t.status = STREAMWIRE__V1__STATUS__STATUS_COMPLETED;
        t.finish_reason = (char *)(reason ? reason : "stop");
    } else if (status == SW_STATUS_INCOMPLETE && reason != NULL && *reason != '\0') {
        t.status = STREAMWIRE__V1__STATUS__STATUS_INCOMPLETE;
        t.finish_reason = (char *)reason;
    } else {
        return SW_EINVAL;
    }
    if (strlen(t.finish_reason) > 256)
        return SW_EINVAL;
    pthread_mutex_lock(&r->mu);
    rv = resp_check_open(r);
    if (rv == SW_OK)
        rv = swn_resp_send_final(r, &t, status, SWN_BY_PRODUCER | SWN_MAY_RETRY);
    pthread_mutex_unlock(&r->mu);
    return rv;
}

sw_err
sw_responder_fail(sw_responder *r, const char *code, const char *message)
{
    sw_err rv;
    if (r == NULL || !swi_valid_code(code))
        return SW_EINVAL;
    pthread_mutex_lock(&r->mu);
    rv = resp_check_open(r);
    if (rv == SW_OK)
        rv = swn_resp_send_failed(r, SW_OK, code, message, SWN_BY_PRODUCER | SWN_MAY_RETRY);
    pthread_mutex_unlock(&r->mu);
    return rv;
}

void
sw_responder_retain(sw_responder *r)
{
    if (r == NULL)
        return;
    pthread_mutex_lock(&r->mu);
    r->holds++;
    pthread_mutex_unlock(&r->mu);
}

void
swn_resp_drop_hold(sw_responder *r, const char *code, const char *message)
{
    int last, failed = 0;
    pthread_mutex_lock(&r->mu);
    last = --r->holds == 0;
    if (last && !r->terminated && !r->closed) {
        failed = 1;
        (void)swn_resp_send_failed(r, SW_OK, code, message, SWN_BY_PRODUCER);
    }
    /* Nobody may read the request any more (sw_responder_payload and
     * _header: until released), while the stream may stay in the table
     * for a while yet, its final held for an ack: 600 finished streams
     * of 900 KiB requests used to keep 537 MB. */
    if (last)
        swn_resp_free_request(r);
    pthread_mutex_unlock(&r->mu);
    /* Logged with no lock held (r->idhex never changes; r is still ours). */
    if (failed)
        swi_log(&r->ing->log, SW_LOG_WARN, "stream %s released without a terminal: sent FAILED",
                r->logtag);
    if (last)
        swn_resp_unref(r);
}

void
sw_responder_release(sw_responder *r)
{
    if (r == NULL)
        return;
    swn_resp_drop_hold(r, "responder_released", "the responder was released without a terminal");
}
