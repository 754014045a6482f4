/* egress/control.c -- control messages from a router to its streams'
 * workers: CREDIT, RESEND, CANCEL, KILL on the instance's control subject,
 * and the acknowledgements of finals, which wait up to a tick and go out
 * together (one ACK_FINALS per worker). Locks: flush_mu, then ack_mu, then
 * s->mu (only to copy the control subject, which a re-route changes). */
#include <string.h>

#include "egress/egress_int.h"

_Static_assert(SWT_SUBJECT_MAX <= SWE_CANCEL_SUBJ_MAX, "a cancel keeps a control subject");

void
swe_control_subject(char subj[SWT_SUBJECT_MAX], const char *instance)
{
    if (swt_subject_control(subj, SWT_SUBJECT_MAX, instance) != SW_OK)
        subj[0] = '\0';
}

/* The stream's control subject and request id: both change together,
 * under s->mu, when it re-routes or migrates. 0 (and subj "") if the stream
 * has moved on from worker `gen` (SWE_GEN_ANY: whichever it is on now). */
static int
ctl_target(sw_stream *s, unsigned gen, char subj[SWT_SUBJECT_MAX], uint8_t id[SW_REQUEST_ID_BYTES])
{
    int ok;
    pthread_mutex_lock(&s->mu);
    ok = gen == SWE_GEN_ANY || gen == s->rx.gen;
    if (ok)
        swe_control_subject(subj, swe_instance(s));
    else
        subj[0] = '\0';
    memcpy(id, s->id, SW_REQUEST_ID_BYTES);
    pthread_mutex_unlock(&s->mu);
    return ok;
}

/* Publishes one control; m has its kind and fields set. */
static void
ctl_publish(sw_router *r, const char *subj, const uint8_t id[SW_REQUEST_ID_BYTES], swp_control *m)
{
    uint8_t buf[160];
    size_t len;
    if (__atomic_load_n(&r->closed, __ATOMIC_ACQUIRE) || subj[0] == '\0')
        return; /* closed, or never sent anywhere (no instance) */
    m->version = SW_PROTOCOL_VERSION;
    m->request_id.data = (uint8_t *)id;
    m->request_id.len = SW_REQUEST_ID_BYTES;
    m->router_id = r->id;
    if (swp_encode(m, buf, sizeof(buf), &len) == SW_OK)
        (void)swt_publish(r->conn, subj, NULL, buf, len);
}

/* m to the stream's current worker, if that is still worker `gen`: a
 * control decided for a worker the stream has since migrated away from
 * would carry the old worker's seqs and credit to the new one (which would
 * then send past the window its frontend granted: flow_violation). */
static void
ctl_send(sw_stream *s, unsigned gen, swp_control *m)
{
    char subj[SWT_SUBJECT_MAX];
    uint8_t id[SW_REQUEST_ID_BYTES];
    if (__atomic_load_n(&s->r->closed, __ATOMIC_ACQUIRE))
        return;
    if (ctl_target(s, gen, subj, id))
        ctl_publish(s->r, subj, id, m);
}

/* A control of kind with these fields (the rest unset). */
static swp_control
ctl_make(int kind, uint64_t limit, uint64_t ack, uint64_t from, uint64_t to)
{
    swp_control m = STREAMWIRE__V1__CONTROL__INIT;
    m.kind = (Streamwire__V1__ControlKind)kind;
    m.credit_limit = limit;
    m.ack_seq = ack;
    m.resend_from = from;
    m.resend_to = to;
    return m;
}

void
swe_send_control(sw_stream *s, unsigned gen, int kind, uint64_t limit, uint64_t ack, uint64_t from,
                 uint64_t to)
{
    swp_control m = ctl_make(kind, limit, ack, from, to);
    ctl_send(s, gen, &m);
}

void
swe_send_credit(sw_stream *s, const swe_rx_act *act)
{
    swp_control m = ctl_make(STREAMWIRE__V1__CONTROL_KIND__CONTROL_CREDIT, act->credit_limit,
                             act->credit_ack, 0, 0);
    m.byte_limit = act->credit_bytes;
#ifdef SW_CHAOS
    if (s->r->credit_hook != NULL) /* swx_router_on_credit */
        s->r->credit_hook(s, s->r->credit_hook_arg);
#endif
    ctl_send(s, act->gen, &m);
}

void
swe_send_control_to(sw_router *r, const char *subj, const uint8_t id[SW_REQUEST_ID_BYTES], int kind,
                    uint64_t limit, uint64_t ack, uint64_t from, uint64_t to)
{
    swp_control m = ctl_make(kind, limit, ack, from, to);
    ctl_publish(r, subj, id, &m);
}

/* Sends the queued acknowledgements of finals: one ACK_FINALS per worker. */
void
swe_flush_acks(sw_router *r)
{
    size_t n;
    pthread_mutex_lock(&r->flush_mu);
    pthread_mutex_lock(&r->ack_mu);
    n = r->nacks;
    memcpy(r->flushing, r->acks, n * sizeof(r->acks[0]));
    r->nacks = 0;
    pthread_mutex_unlock(&r->ack_mu);
    for (size_t i = 0; i < n; i++) {
        swp_control m = STREAMWIRE__V1__CONTROL__INIT;
        ProtobufCBinaryData ids[SWE_ACKS_MAX];
        uint8_t buf[SWE_ACKS_MAX * (SW_REQUEST_ID_BYTES + 2) + 128];
        size_t len, k = 0;
        if (r->flushing[i].subj[0] == '\0')
            continue; /* sent with an earlier group */
        for (size_t j = i; j < n; j++) {
            if (strcmp(r->flushing[j].subj, r->flushing[i].subj) != 0)
                continue;
            ids[k].data = r->flushing[j].id;
            ids[k].len = SW_REQUEST_ID_BYTES;
            k++;
            if (j != i)
                r->flushing[j].subj[0] = '\0';
        }
        m.version = SW_PROTOCOL_VERSION;
        m.kind = STREAMWIRE__V1__CONTROL_KIND__CONTROL_ACK_FINALS;
        m.router_id = r->id;
        m.n_final_acks = k;
        m.final_acks = ids;
        if (!__atomic_load_n(&r->closed, __ATOMIC_ACQUIRE) &&
            swp_encode(&m, buf, sizeof(buf), &len) == SW_OK)
            (void)swt_publish(r->conn, r->flushing[i].subj, NULL, buf, len);
    }
    pthread_mutex_unlock(&r->flush_mu);
}

/* Queues the acknowledgement of stream s's final; flushes when full. */
void
swe_queue_final_ack(sw_stream *s)
{
    sw_router *r = s->r;
    int full, first;
    if (__atomic_load_n(&r->closed, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&r->ack_mu);
    while (r->nacks == SWE_ACKS_MAX) {
        pthread_mutex_unlock(&r->ack_mu);
        swe_flush_acks(r);
        pthread_mutex_lock(&r->ack_mu);
    }
    (void)ctl_target(s, SWE_GEN_ANY, r->acks[r->nacks].subj, r->acks[r->nacks].id);
    first = ++r->nacks == 1;
    full = r->nacks == SWE_ACKS_MAX;
    pthread_mutex_unlock(&r->ack_mu);
    if (full)
        swe_flush_acks(r);
    else if (first)
        swi_ticker_wake(&r->ticker,
                        SWE_REST_IDLE); /* flushed at the next tick: within SWE_SCAN_MS */
}

/* ---------------------------------------------------------------- cancels */

void
swe_cancel_wait(sw_stream *s, int kill)
{
    char subj[SWT_SUBJECT_MAX];
    uint8_t id[SW_REQUEST_ID_BYTES];
    (void)ctl_target(s, SWE_GEN_ANY, subj, id);
    swe_cancel_wait_to(s, subj, id, kill);
}

void
swe_cancel_wait_to(sw_stream *s, const char *subj, const uint8_t id[SW_REQUEST_ID_BYTES], int kill)
{
    sw_router *r = s->r;
    int added;
    if (subj[0] == '\0') /* never sent anywhere */
        return;
    pthread_mutex_lock(&r->mu);
    added = !r->closing && swe_cancels_add_to(&r->cancels, id, subj, s, kill, swi_now_ms()) == 0;
    if (added) {
        swe_stream_ref(s); /* the table's */
        __atomic_store_n(&r->cancels_waiting, (int)r->cancels.n, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&r->mu);
    /* Its resends ride on the ticker, the first SWE_CANCEL_FIRST_MS from
     * now: only a ticker resting longer than that (no stream open, so not
     * waiting for the next scan) needs waking. Closing many streams used
     * to wake it for each one. */
    if (added)
        swi_ticker_wake(&r->ticker, SWE_REST_IDLE);
}

void
swe_cancels_tick(sw_router *r, int64_t now)
{
    swe_cancel due[64];
    size_t n;
    if (__atomic_load_n(&r->cancels_waiting, __ATOMIC_ACQUIRE) == 0)
        return;
    pthread_mutex_lock(&r->mu);
    n = swe_cancels_due(&r->cancels, now, due, sizeof(due) / sizeof(due[0]));
    __atomic_store_n(&r->cancels_waiting, (int)r->cancels.n, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&r->mu);
    for (size_t i = 0; i < n; i++) {
        sw_stream *s = due[i].s;
        swe_send_control_to(r, due[i].subj, due[i].id,
                            due[i].kill ? STREAMWIRE__V1__CONTROL_KIND__CONTROL_KILL
                                        : STREAMWIRE__V1__CONTROL_KIND__CONTROL_CANCEL,
                            0, 0, 0, 0);
        if (due[i].sent >= SWE_CANCEL_TRIES)
            swe_stream_unref(s); /* out of the table */
    }
}

void
swe_cancels_answer(sw_router *r, const uint8_t id[SW_REQUEST_ID_BYTES], const swt_msg *msg)
{
    swp_item *w = NULL;
    swp_arena arena;
    int final = 0;
    if (__atomic_load_n(&r->cancels_waiting, __ATOMIC_ACQUIRE) == 0 || msg->no_responders)
        return;
    /* Bounded like every decode; only while cancels wait. */
    if (swp_decode_item_arena(msg->data, msg->len, sw_conn_max_payload(r->conn) + 1024, &arena,
                              &w) != SW_OK)
        return;
    final = w->complete_final;
    for (size_t i = 0; i < w->n_batch; i++)
        final |= w->batch[i]->complete_final;
    if (memcmp(w->request_id.data, id, SW_REQUEST_ID_BYTES) != 0)
        final = 0;
    swp_free_arena(w, &arena);
    if (final)
        swe_cancels_settle(r, id);
}

void
swe_cancels_settle(sw_router *r, const uint8_t id[SW_REQUEST_ID_BYTES])
{
    sw_stream *s;
    if (__atomic_load_n(&r->cancels_waiting, __ATOMIC_ACQUIRE) == 0)
        return;
    pthread_mutex_lock(&r->mu);
    s = swe_cancels_seen(&r->cancels, id);
    __atomic_store_n(&r->cancels_waiting, (int)r->cancels.n, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&r->mu);
    if (s != NULL)
        swe_stream_unref(s);
}
