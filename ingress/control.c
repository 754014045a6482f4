/* ingress/control.c -- control messages from frontends: CANCEL, KILL,
 * CREDIT (with acks), ACK_FINALS, RESEND, PROBE.
 *
 * Threads: the control subscription's nats.c thread. Locks: ing->mu to
 * find a stream (released before r->mu is taken), r->mu per stream (a
 * resend publishes under it). The cancel callback fires with no lock
 * held. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ingress/ingress_int.h"

void
swn_resp_cancel(sw_responder *r, int kill)
{
    sw_ingress *ing = r->ing;
    int newly = 0;
    pthread_mutex_lock(&r->mu);
    r->fe_cancelled = 1;
    /* A stream whose terminal was sent is not cancelled by a CANCEL that
     * crossed its final (its handler may have freed the callback's
     * argument after finish); a KILL, or its frontend's loss, still lets
     * its final go. */
    if (!r->terminated) {
        if (!r->cancelled) {
            r->cancelled = 1;
            newly = 1;
        }
        if (kill) {
            r->rg.pub_seq = r->rg.next_seq - 1; /* nothing queued goes out any more */
            swn_resp_mark_terminated(r);
        } else {
            swp_terminal t = STREAMWIRE__V1__TERMINAL__INIT;
            t.status = STREAMWIRE__V1__STATUS__STATUS_CANCELLED;
            t.finish_reason = (char *)"cancelled";
            (void)swn_resp_send_final(r, &t, SW_STATUS_CANCELLED, SWN_BY_OTHER);
        }
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (newly) {
        pthread_mutex_lock(&ing->mu);
        ing->st.cancels++;
        pthread_mutex_unlock(&ing->mu);
        swn_resp_fire_cancel(r);
    }
    if (kill)
        swn_unregister_stream(r);
}

/* Republishes kept items from..to (r->mu held; clamped already). */
static void
resp_resend_span(sw_responder *r, uint64_t from, uint64_t to, swn_msgbuf *m)
{
    while (from <= to) {
        uint64_t last;
        unsigned k;
        size_t len = swn_resp_build(r, from, to, 1, m, &last, &k, NULL);
        if (last < from)
            break; /* no memory */
        if (k > 0) {
            swn_sent d = {0, 0, k, 0};
            (void)swn_resp_publish(r, m->p, len, &d);
        }
        from = last + 1;
    }
}

/* A RESEND: what went out in from..to and was not acknowledged is
 * published again, except the seqs resent less than SWN_RESEND_QUIET_MS
 * ago. The control thread is the stream's and every other stream's on
 * this instance: a flood of RESENDs for a whole window used to republish
 * it for each one (2,000 RESENDs of 16,384 items: 32.8 M items, while a
 * PROBE waited 4.5 s and another router's stream was declared lost). */
static void
resp_resend(sw_responder *r, uint64_t from, uint64_t to)
{
    swn_msgbuf m;
    int throttled = 0;
    swn_msgbuf_init(&m);
    pthread_mutex_lock(&r->mu);
    if (!r->closed && swn_ring_resend_range(&r->rg, &from, &to)) {
        int64_t now = swi_now_ms();
        if (r->resent_hi != 0 && now - r->resent_ms < SWN_RESEND_QUIET_MS) {
            /* Within the spell: only the seqs outside resent_lo..hi (below
             * and above it), and the spell covers them too from now on. */
            uint64_t lo = r->resent_lo, hi = r->resent_hi;
            throttled = from <= hi && to >= lo;
            if (from < lo)
                resp_resend_span(r, from, to < lo ? to : lo - 1, &m);
            if (to > hi)
                resp_resend_span(r, from > hi ? from : hi + 1, to, &m);
            if (from < r->resent_lo)
                r->resent_lo = from;
            if (to > r->resent_hi)
                r->resent_hi = to;
        } else {
            resp_resend_span(r, from, to, &m);
            r->resent_lo = from;
            r->resent_hi = to;
            r->resent_ms = swi_now_ms(); /* from its end: a long resend is not followed at once */
        }
    }
    pthread_mutex_unlock(&r->mu);
    swn_msgbuf_free(&m);
    if (throttled) {
        pthread_mutex_lock(&r->ing->mu);
        r->ing->st.resends_throttled++;
        pthread_mutex_unlock(&r->ing->mu);
    }
}

/* Answers a PROBE, on the subject where its router takes probe answers,
 * sw.prb.<router_id>.<this instance>, and nowhere else. 0 if answered or
 * without a reply subject; -1 if the reply subject was another (not
 * answered). A probe's reply subject is not in the sealed plaintext: a
 * recorded PROBE published again with another router's stream subject
 * sw.rsp.<R>.<id> as its reply used to have this worker publish a
 * ProbeReply sealed by it there, which ended that stream (decode_error). */
static int
ing_probe_reply(sw_ingress *ing, const swt_msg *msg, const char *router_id, sw_responder *r,
                uint64_t probe_id)
{
    swp_probe_reply p = STREAMWIRE__V1__PROBE_REPLY__INIT;
    uint8_t buf[256];
    char own[SWT_SUBJECT_MAX];
    size_t len;
    const char *reply = msg->reply;
    if (reply == NULL)
        return 0;
    if (swt_subject_probe_reply(own, sizeof(own), router_id, ing->instance_id) != SW_OK ||
        strcmp(own, reply) != 0)
        return -1;
    p.version = SW_PROTOCOL_VERSION;
    p.instance_id = ing->instance_id;
    p.probe_id = probe_id;
    p.incarnation = ing->incarnation;
    p.beats_counter = __atomic_load_n(&ing->beats_counter, __ATOMIC_RELAXED);
    pthread_mutex_lock(&ing->mu);
    p.inflight = ing->inflight;
    p.draining = ing->draining != 0;
    pthread_mutex_unlock(&ing->mu);
    if (r != NULL) {
        pthread_mutex_lock(&r->mu);
        p.known = !r->terminated || r->final_seq != 0;
        p.last_seq = r->rg.pub_seq; /* what went out, as a heartbeat says (not what waits) */
        pthread_mutex_unlock(&r->mu);
#ifdef SW_CHAOS
        p.last_seq += __atomic_load_n(&ing->probe_seq_ahead, __ATOMIC_RELAXED);
#endif
    }
    if (swp_encode(&p, buf, sizeof(buf), &len) == SW_OK)
        (void)swt_publish(ing->conn, reply, NULL, buf, len);
    return 0;
}

/* 1 if a CANCEL or KILL is to be lost on the bus (the chaos build's test
 * hook, swx_ingress_drop_cancels); 0 otherwise. */
static int
ing_cancel_lost(sw_ingress *ing)
{
#ifdef SW_CHAOS
    return swn_chaos_drop_cancel(ing);
#else
    (void)ing;
    return 0;
#endif
}

/* The registered stream with this request id, with a reference; NULL if
 * none. With early_for (a CANCEL or KILL from that router), one for no
 * stream is remembered under the same lock: its request may still be on
 * its way (another subscription), and is then never started (issue 11 #2).
 * One lookup, so a stream that registers meanwhile is found here and its
 * router checked as any other's. Not for a request that came here already
 * (served, or refused): its stream is over, and a frontend repeats its
 * CANCEL and KILL until it hears so (a KILL, 5 times): each repeat used to
 * take an entry for 30 s, and above ~546 kills a second they pushed out
 * the cancels of requests still on their way. */
static sw_responder *
ing_find(sw_ingress *ing, const uint8_t *id, const char *early_for)
{
    sw_responder *r;
    pthread_mutex_lock(&ing->mu);
    if ((r = swi_idmap_get(&ing->streams, id)) != NULL) {
        swn_resp_ref(r);
    } else if (early_for != NULL && !ing_cancel_lost(ing)) {
        int64_t now = swi_now_ms();
        if (!swn_ing_was_here(ing, id, now))
            swn_early_add(ing, id, early_for, now);
    }
    pthread_mutex_unlock(&ing->mu);
    return r;
}

/* Counts a control that names another frontend than its stream's, or a
 * PROBE whose reply subject is not its router's probe-answer subject. */
static void
ing_bad_control(sw_ingress *ing)
{
    pthread_mutex_lock(&ing->mu);
    ing->st.bad_controls++;
    pthread_mutex_unlock(&ing->mu);
}

/* A CREDIT (limit, ack, byte limit), or with `final` the frontend's word
 * that the final arrived: releases what was acknowledged, and retires a
 * stream whose final was. */
static void
resp_credit(sw_responder *r, uint64_t limit, uint64_t ack, uint64_t bytes, int final)
{
    int retire;
    pthread_mutex_lock(&r->mu);
    if (final && r->final_seq != 0)
        ack = r->final_seq;
    ack = swn_ring_ack(&r->rg, ack); /* clamped to what went out */
    /* Credit never runs more than the largest window past what the
     * frontend has acknowledged: the ring holds that much (a huge limit
     * used to make send fail with SW_ENOMEM, issue 11 #12). */
    if (r->window != 0 && limit > r->rg.acked + r->wmax)
        limit = r->rg.acked + r->wmax;
    if (r->credit_bytes != 0 && bytes > r->byte_limit) {
        /* (no clamp needed: the ring's slots are bounded by the window) */
        r->byte_limit = bytes;
        pthread_cond_broadcast(&r->cv);
    }
    if (r->window != 0 && limit > r->credit_limit) {
        r->credit_limit = limit;
        pthread_cond_broadcast(&r->cv);
    }
    retire = r->terminated && r->final_seq != 0 && ack >= r->final_seq;
    pthread_mutex_unlock(&r->mu);
    if (retire)
        swn_unregister_stream(r);
}

void
swn_ing_on_control(const swt_msg *msg, void *arg)
{
    sw_ingress *ing = arg;
    swp_control *c = NULL;
    sw_responder *r = NULL;
    int cancel, other_router = 0;
    sw_err rv;
    if (msg->auth_failed) { /* forged, replayed elsewhere, or of another cluster: never acted on */
        pthread_mutex_lock(&ing->mu);
        ing->st.auth_failures++;
        pthread_mutex_unlock(&ing->mu);
        return;
    }
    rv = swp_decode_control(msg->data, msg->len, SWN_MAX_CONTROL_BYTES, &c);
    if (rv != SW_OK) {
        swi_log(&ing->log, SW_LOG_WARN, "bad control message: %s", sw_err_name(rv));
        goto done;
    }
    cancel = c->kind == STREAMWIRE__V1__CONTROL_KIND__CONTROL_CANCEL ||
             c->kind == STREAMWIRE__V1__CONTROL_KIND__CONTROL_KILL;
    if (c->request_id.len == SW_REQUEST_ID_BYTES)
        r = ing_find(ing, c->request_id.data, cancel ? c->router_id : NULL);
    if (r != NULL && strcmp(c->router_id, r->router_id) != 0) {
        /* Not from the stream's own frontend (issue 11 #12): ignored. */
        ing_bad_control(ing);
        other_router = 1;
        if (c->kind != STREAMWIRE__V1__CONTROL_KIND__CONTROL_PROBE)
            goto done;
        swn_resp_unref(r);
        r = NULL;
    }
    switch (c->kind) {
    case STREAMWIRE__V1__CONTROL_KIND__CONTROL_PROBE:
#ifdef SW_CHAOS
        if (c->request_id.len != 0 && __atomic_load_n(&ing->drop_stream_probes, __ATOMIC_RELAXED))
            break; /* lost on the bus (swx_ingress_drop_stream_probes) */
#endif
        /* (one count for a probe that is foreign on both counts) */
        if (ing_probe_reply(ing, msg, c->router_id, r, c->probe_id) != 0 && !other_router)
            ing_bad_control(ing);
        break;
    case STREAMWIRE__V1__CONTROL_KIND__CONTROL_CANCEL:
    case STREAMWIRE__V1__CONTROL_KIND__CONTROL_KILL:
        /* (for no stream: remembered by ing_find, or lost) */
        if (r != NULL && !ing_cancel_lost(ing))
            swn_resp_cancel(r, c->kind == STREAMWIRE__V1__CONTROL_KIND__CONTROL_KILL);
        break;
    case STREAMWIRE__V1__CONTROL_KIND__CONTROL_CREDIT:
        if (r != NULL)
            resp_credit(r, c->credit_limit, c->ack_seq, c->byte_limit, 0);
        break;
    case STREAMWIRE__V1__CONTROL_KIND__CONTROL_ACK_FINALS: {
        int foreign = 0; /* the acks for another frontend's streams are ignored */
        for (size_t i = 0; i < c->n_final_acks; i++) {
            sw_responder *a = ing_find(ing, c->final_acks[i].data, NULL);
            if (a != NULL) {
                if (strcmp(c->router_id, a->router_id) == 0)
                    resp_credit(a, 0, 0, 0, 1);
                else
                    foreign = 1;
                swn_resp_unref(a);
            }
        }
        if (foreign)
            ing_bad_control(ing); /* one message, however many it named */
        break;
    }
    case STREAMWIRE__V1__CONTROL_KIND__CONTROL_RESEND:
        if (r != NULL)
            resp_resend(r, c->resend_from, c->resend_to);
        break;
    default:
        break;
    }
done:
    if (r != NULL)
        swn_resp_unref(r);
    swp_free(c);
}

/* ---------------------------------------------------------------- early cancels */

/* Keyed by the pair (id, router): a CANCEL naming another router used to
 * take the id's place first (an add of an id present is a no-op), and the
 * take, which checks the router, then found no entry of the request's own
 * router: the request ran. */
void
swn_early_add(sw_ingress *ing, const uint8_t *id, const char *router_id, int64_t now)
{
    uint8_t key[SW_REQUEST_ID_BYTES];
    swi_idq_pair_key(key, id, router_id);
    swi_idq_add(&ing->early, key, router_id, now);
}

int
swn_early_take(sw_ingress *ing, const uint8_t *id, const char *router_id)
{
    uint8_t key[SW_REQUEST_ID_BYTES];
    swi_idq_pair_key(key, id, router_id);
    return swi_idq_take(&ing->early, key, router_id);
}

int
swn_ing_was_here(sw_ingress *ing, const uint8_t *id, int64_t now)
{
    return swi_idq_find(&ing->seen, id, now) != NULL ||
           swi_idq_find(&ing->refused, id, now) != NULL;
}

void
swn_early_fini(sw_ingress *ing)
{
    swi_idq_fini(&ing->early);
    swi_idq_fini(&ing->seen);
    swi_idq_fini(&ing->refused);
}
