/* egress/router.c -- the frontend side: sw_router and sw_stream.
 *
 * One wildcard subscription (sw.rsp.<router>.*) receives every response of
 * every stream this router opened; the last subject token is the request id,
 * so a message is routed to its stream without decoding. Opening a stream
 * costs one publish and no SUB round trip.
 *
 * Each stream reassembles by sequence number into a FIFO of data items for
 * the consumer, then exactly one terminal. The terminal is decided once
 * (term_state 0 -> 1) and delivered once (1 -> 2); every path that ends a
 * stream goes through st_set_terminal, so "exactly one" is structural.
 *
 * Threads: nats.c's delivery thread runs rt_on_msg; one timer thread
 * enforces inactivity, deadlines, gap timeouts and lingering terminals; the
 * consumer calls sw_stream_next, or gets callbacks from whichever of those
 * threads made an item ready (serialised by the `dispatching` flag).
 *
 * Locks: r->mu (table, counters) and s->mu (one stream) are never held
 * together; user callbacks run with neither held. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sw_common.h"
#include "proto/sw_codec.h"
#include "router/sw_pool.h"
#include "transport/sw_transport.h"

#define SWE_TICK_MS 10       /* probe rounds */
#define SWE_SCAN_MS 25       /* stream scans: inactivity, deadline, gap, linger */
#define SWE_REASON_MAX 96
#define SWE_MSG_MAX 256
/* Acknowledgements of finals wait up to a tick and go out together, one
 * ACK_FINALS per worker, at most SWE_ACKS_MAX per flush. */
#define SWE_ACKS_MAX 64
#define SWE_CTL_ACK_FINAL (-1) /* swe_ctl kind: queue an ACK_FINALS entry */

typedef struct swe_ack {
    char subj[SWT_SUBJECT_MAX];
    uint8_t id[SW_REQUEST_ID_BYTES];
} swe_ack;

typedef struct swe_q {
    struct swe_q *next;
    uint64_t seq;
    int final; /* a held final marker (no data) */
    int droppable;
    size_t len;
    uint8_t data[];
} swe_q;

/* An instance this router has streams open to, probed while it has any. */
typedef struct rt_inst {
    char id[SW_MAX_TOKEN + 1];
    char ctl_subj[SWT_SUBJECT_MAX];
    unsigned nstreams;
    int outstanding;    /* a probe is in flight */
    int64_t sent_ms;    /* when the last probe went out */
    int64_t last_ok_ms; /* last sign of life (probe answer) */
    unsigned misses;
    int suspect; /* the registry removed it: one unanswered probe is enough */
} rt_inst;

struct sw_router {
    sw_conn *conn;
    swi_logger log;
    atomic_int refs;
    char id[SW_MAX_TOKEN + 1];
    char wildcard[SWT_SUBJECT_MAX];
    unsigned window, hb_ms, inactivity_ms, gap_ms, linger_ms, max_streams;
    swt_sub *mux;
    swt_sub *live; /* sw.rtr.<id>: answers workers' liveness probes */
    swt_sub *prb;  /* sw.prb.<id>.*: answers to our instance probes */
    swr_pool *pool;
    unsigned probe_ms, probe_timeout_ms, probe_misses;
    rt_inst *inst;
    size_t ninst, capinst;
    pthread_mutex_t mu;
    pthread_cond_t tick_cv;
    swi_idmap streams;
    pthread_t timer;
    int timer_started;
    int closing; /* no new streams */
    int closed;  /* no more publishing */
    int64_t mux_idle_ms; /* last time the mux had nothing queued (timer thread only) */
    uint64_t items;      /* data items delivered (atomic) */
    uint64_t items_after_final; /* (atomic) */
    pthread_mutex_t ack_mu;       /* acks, nacks */
    pthread_mutex_t flush_mu;     /* one flusher at a time; owns flushing */
    swe_ack acks[SWE_ACKS_MAX];
    swe_ack flushing[SWE_ACKS_MAX];
    size_t nacks;
    sw_router_stats st;
};

enum { TERM_NONE = 0, TERM_QUEUED = 1, TERM_DELIVERED = 2 };

struct sw_stream {
    sw_router *r;
    atomic_int refs;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint8_t id[SW_REQUEST_ID_BYTES];
    char idhex[SW_REQUEST_ID_HEX];
    char instance[SW_MAX_TOKEN + 1];
    char ctl_subj[SWT_SUBJECT_MAX];
    sw_item_fn on_item;
    void *on_item_arg;
    unsigned window;
    unsigned inactivity_ms;

    /* reassembly */
    uint64_t expected; /* next seq to hand to the queue */
    swe_q **hold;      /* out-of-order items, seq % hold_cap */
    size_t hold_cap;
    size_t held;
    uint64_t final_seq; /* seq of the received final, 0 = none yet */
    sw_status w_status; /* the final's terminal, decoded at receipt */
    sw_err w_err;
    char w_reason[SWE_REASON_MAX];
    char w_msg[SWE_MSG_MAX];

    /* consumer queue and terminal */
    swe_q *qh, *qt;
    size_t qlen;
    int term_state;
    int term_from_wire;
    int64_t term_ready_ms;
    sw_terminal term;
    uint64_t term_seq;
    char term_reason[SWE_REASON_MAX];
    char term_msg[SWE_MSG_MAX];
    sw_item cur;
    swe_q *cur_q;

    /* timers, ms monotonic */
    int64_t last_rx_ms;
    int64_t gap_since_ms;
    int64_t last_resend_ms;
    int64_t deadline_ms; /* -1 = none */

    /* credit */
    uint64_t consumed;
    uint64_t credit_sent; /* highest credit_limit granted */

    int in_table;
    int pooled; /* counted in the pool and the probe table */
    int routed;     /* the instance was picked by the pool (no instance_id given) */
    int rerouted;   /* already sent elsewhere once after no_responders */
    /* What sw_stream_instance_id and items show: each buffer is written once
     * (a re-route happens at most once) and then published through inst_pub,
     * so a reader never sees a string being rewritten. */
    char inst_first[SW_MAX_TOKEN + 1];
    char inst_second[SW_MAX_TOKEN + 1];
    const char *inst_pub;
    char endpoint[SW_MAX_ENDPOINT + 1];
    uint8_t *req_buf; /* the encoded request, kept until the first answer (re-routing) */
    size_t req_len;
    int dispatching;
    int in_cb;          /* an item callback runs now, on cb_thread */
    pthread_t cb_thread;
    int closed_by_user;
    int64_t next_tick_ms; /* the timer looks at s only from then on (atomic; 0 = next scan) */
    sw_stream_stats st;
};

/* ---------------------------------------------------------------- refs */

static void
rt_unref(sw_router *r)
{
    if (atomic_fetch_sub(&r->refs, 1) != 1)
        return;
    swi_idmap_fini(&r->streams);
    swr_pool_destroy(r->pool);
    free(r->inst);
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->ack_mu);
    pthread_mutex_destroy(&r->flush_mu);
    pthread_cond_destroy(&r->tick_cv);
    free(r);
}

static void
st_ref(sw_stream *s)
{
    atomic_fetch_add(&s->refs, 1);
}

static void
st_free_q(swe_q *q)
{
    while (q != NULL) {
        swe_q *n = q->next;
        free(q);
        q = n;
    }
}

static void
st_clear_hold(sw_stream *s)
{
    if (s->hold == NULL || s->held == 0)
        return;
    for (size_t i = 0; i < s->hold_cap; i++) {
        free(s->hold[i]);
        s->hold[i] = NULL;
    }
    s->held = 0;
}

static void
st_unref(sw_stream *s)
{
    if (atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    st_clear_hold(s);
    free(s->hold);
    st_free_q(s->qh);
    free(s->cur_q);
    free(s->req_buf);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    rt_unref(s->r);
    free(s);
}

/* ---------------------------------------------------------------- table */

static sw_stream *
rt_lookup(sw_router *r, const uint8_t *id)
{
    sw_stream *s;
    pthread_mutex_lock(&r->mu);
    s = swi_idmap_get(&r->streams, id);
    if (s != NULL)
        st_ref(s);
    pthread_mutex_unlock(&r->mu);
    return s;
}

static rt_inst *
rt_inst_find(sw_router *r, const char *id)
{
    for (size_t i = 0; i < r->ninst; i++)
        if (strcmp(r->inst[i].id, id) == 0)
            return &r->inst[i];
    return NULL;
}

/* Counts a stream on its instance (r->mu held). 0 ok, -1 no memory. */
static int
rt_inst_add(sw_router *r, const char *id)
{
    rt_inst *e = rt_inst_find(r, id);
    if (e == NULL) {
        if (r->ninst == r->capinst) {
            size_t ncap = r->capinst ? r->capinst * 2 : 8;
            rt_inst *nv = realloc(r->inst, ncap * sizeof(*nv));
            if (nv == NULL)
                return -1;
            r->inst = nv;
            r->capinst = ncap;
        }
        e = &r->inst[r->ninst++];
        memset(e, 0, sizeof(*e));
        snprintf(e->id, sizeof(e->id), "%s", id);
        (void)swt_subject_control(e->ctl_subj, sizeof(e->ctl_subj), id);
        e->last_ok_ms = swi_now_ms();
        e->sent_ms = e->last_ok_ms; /* first probe after one interval */
    }
    e->nstreams++;
    return 0;
}

static void
rt_inst_del(sw_router *r, const char *id)
{
    rt_inst *e = rt_inst_find(r, id);
    if (e != NULL && --e->nstreams == 0)
        *e = r->inst[--r->ninst];
}

static void
rt_remove(sw_stream *s)
{
    sw_router *r = s->r;
    int drop = 0, pooled = 0;
    char inst[SW_MAX_TOKEN + 1];
    pthread_mutex_lock(&r->mu);
    if (s->in_table) {
        s->in_table = 0;
        swi_idmap_del(&r->streams, s->id);
        r->st.open_streams--;
        drop = 1;
        if (s->pooled) {
            s->pooled = 0;
            pooled = 1;
            rt_inst_del(r, s->instance);
            memcpy(inst, s->instance, sizeof(inst)); /* changes only under r->mu */
        }
    }
    pthread_mutex_unlock(&r->mu);
    if (pooled)
        swr_pool_done(r->pool, inst);
    if (drop)
        st_unref(s);
}

/* ---------------------------------------------------------------- control out */

typedef struct swe_ctl {
    int kind; /* 0 = none */
    uint64_t limit, ack, from, to;
} swe_ctl;

/* Makes the scan look at s next time (a state change may have made a
 * check due earlier than st_plan_tick computed). */
static void
st_tick_soon(sw_stream *s)
{
    __atomic_store_n(&s->next_tick_ms, 0, __ATOMIC_RELAXED);
}

/* Sends the queued acknowledgements of finals: one ACK_FINALS per worker. */
static void
rt_flush_acks(sw_router *r)
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
static void
st_queue_final_ack(sw_stream *s)
{
    sw_router *r = s->r;
    int full;
    pthread_mutex_lock(&r->ack_mu);
    while (r->nacks == SWE_ACKS_MAX) {
        pthread_mutex_unlock(&r->ack_mu);
        rt_flush_acks(r);
        pthread_mutex_lock(&r->ack_mu);
    }
    pthread_mutex_lock(&s->mu);
    memcpy(r->acks[r->nacks].subj, s->ctl_subj, sizeof(s->ctl_subj));
    pthread_mutex_unlock(&s->mu);
    memcpy(r->acks[r->nacks].id, s->id, SW_REQUEST_ID_BYTES);
    full = ++r->nacks == SWE_ACKS_MAX;
    pthread_mutex_unlock(&r->ack_mu);
    if (full)
        rt_flush_acks(r);
}

static void
st_send_control(sw_stream *s, const swe_ctl *c)
{
    swp_control m = STREAMWIRE__V1__CONTROL__INIT;
    uint8_t buf[128];
    size_t len;
    char subj[SWT_SUBJECT_MAX];
    if (c->kind == 0 || __atomic_load_n(&s->r->closed, __ATOMIC_ACQUIRE))
        return;
    if (c->kind == SWE_CTL_ACK_FINAL) {
        st_queue_final_ack(s);
        return;
    }
    /* The control subject changes if the request is re-routed. */
    pthread_mutex_lock(&s->mu);
    memcpy(subj, s->ctl_subj, sizeof(subj));
    pthread_mutex_unlock(&s->mu);
    m.version = SW_PROTOCOL_VERSION;
    m.request_id.data = s->id;
    m.request_id.len = SW_REQUEST_ID_BYTES;
    m.kind = (Streamwire__V1__ControlKind)c->kind;
    m.credit_limit = c->limit;
    m.ack_seq = c->ack;
    m.resend_from = c->from;
    m.resend_to = c->to;
    m.router_id = s->r->id;
    if (swp_encode(&m, buf, sizeof(buf), &len) == SW_OK)
        (void)swt_publish(s->r->conn, subj, NULL, buf, len);
}

/* Credit bookkeeping after the consumer took one data item (s->mu held). */
static void
st_consumed(sw_stream *s, swe_ctl *out)
{
    s->consumed++;
    s->st.items++;
    __atomic_fetch_add(&s->r->items, 1, __ATOMIC_RELAXED);
    if (s->window == 0)
        return;
    if (s->consumed + s->window / 2 >= s->credit_sent) {
        s->credit_sent = s->consumed + s->window;
        out->kind = STREAMWIRE__V1__CONTROL_KIND__CONTROL_CREDIT;
        out->limit = s->credit_sent;
        out->ack = s->expected - 1;
    }
}

/* ---------------------------------------------------------------- terminal */

/* Decides the terminal (s->mu held). First decision wins; the one exception
 * is a worker's final not yet delivered, which item_after_final replaces.
 * Returns 1 if this call decided it. */
static int
st_set_terminal(sw_stream *s, sw_status status, sw_err err, const char *reason, const char *msg,
                uint64_t seq, int from_wire)
{
    if (s->term_state == TERM_DELIVERED)
        return 0;
    if (s->term_state == TERM_QUEUED && !(s->term_from_wire && err == SW_ITEM_AFTER_FINAL))
        return 0;
    s->term_state = TERM_QUEUED;
    st_tick_soon(s); /* the linger, see st_plan_tick */
    s->term_from_wire = from_wire;
    s->term_ready_ms = from_wire ? swi_now_ms() + s->r->linger_ms : 0;
    s->term.status = status;
    s->term.error = err;
    snprintf(s->term_reason, sizeof(s->term_reason), "%s",
             reason ? reason : (status == SW_STATUS_ERROR ? sw_err_name(err) : ""));
    snprintf(s->term_msg, sizeof(s->term_msg), "%s",
             msg ? msg : (status == SW_STATUS_ERROR ? sw_strerror(err) : ""));
    s->term.reason = s->term_reason;
    s->term.message = s->term_msg;
    s->term_seq = seq;
    s->gap_since_ms = 0;
    st_clear_hold(s);
    if (status == SW_STATUS_CANCELLED) {
        /* No data after a cancel. */
        st_free_q(s->qh);
        s->qh = s->qt = NULL;
        s->qlen = 0;
    }
    pthread_cond_broadcast(&s->cv);
    return 1;
}

static void
rt_count_terminal(sw_router *r, const sw_terminal *t)
{
    pthread_mutex_lock(&r->mu);
    if (t->status >= 1 && t->status <= 5)
        r->st.terminals[t->status]++;
    if (t->status == SW_STATUS_ERROR) {
        if (t->error >= 100 && t->error < 109)
            r->st.errors[t->error - 100]++;
        else
            r->st.errors_other++;
    }
    pthread_mutex_unlock(&r->mu);
}

static void st_dispatch(sw_stream *s);

/* Ends a stream with a synthesized error and tells the worker to drop it. */
static void
st_fail(sw_stream *s, sw_err err, const char *msg, int tell_worker)
{
    int set;
    swe_ctl c = {0, 0, 0, 0, 0};
    pthread_mutex_lock(&s->mu);
    set = st_set_terminal(s, SW_STATUS_ERROR, err, NULL, msg, 0, 0);
    pthread_mutex_unlock(&s->mu);
    if (!set)
        return;
    swi_log(&s->r->log, SW_LOG_DEBUG, "stream %s: %s", s->idhex, sw_err_name(err));
    rt_remove(s);
    if (tell_worker) {
        c.kind = STREAMWIRE__V1__CONTROL_KIND__CONTROL_KILL;
        st_send_control(s, &c);
    }
    st_dispatch(s);
}

/* ---------------------------------------------------------------- reassembly */

/* Hands one in-order item to the queue or, for the final, decides the
 * terminal (s->mu held). Takes ownership of q. */
static void
st_accept(sw_stream *s, swe_q *q, swe_ctl *ack)
{
    s->expected = q->seq + 1;
    if (q->final) {
        st_set_terminal(s, s->w_status, s->w_err, s->w_reason, s->w_msg, q->seq, 1);
        ack->kind = SWE_CTL_ACK_FINAL;
        free(q);
        return;
    }
    q->next = NULL;
    if (s->qt)
        s->qt->next = q;
    else
        s->qh = q;
    s->qt = q;
    s->qlen++;
    if (s->qlen > s->st.peak_pending)
        s->st.peak_pending = s->qlen;
}

static swe_q *
st_make_q(const swp_item *w)
{
    size_t len = w->body_case == STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_DATA ? w->data.len : 0;
    swe_q *q = malloc(sizeof(*q) + len);
    if (q == NULL)
        return NULL;
    q->next = NULL;
    q->seq = w->seq;
    q->final = w->complete_final;
    q->droppable = w->droppable;
    q->len = len;
    if (len)
        memcpy(q->data, w->data.data, len);
    return q;
}

/* Records the terminal a worker's final carries (s->mu held). */
static void
st_note_final(sw_stream *s, const swp_item *w)
{
    const swp_terminal *t = w->terminal;
    s->final_seq = w->seq;
    s->w_err = SW_OK;
    s->w_msg[0] = '\0';
    switch (t->status) {
    case STREAMWIRE__V1__STATUS__STATUS_COMPLETED:
        s->w_status = SW_STATUS_COMPLETED;
        snprintf(s->w_reason, sizeof(s->w_reason), "%s",
                 t->finish_reason[0] ? t->finish_reason : "stop");
        break;
    case STREAMWIRE__V1__STATUS__STATUS_INCOMPLETE:
        s->w_status = SW_STATUS_INCOMPLETE;
        snprintf(s->w_reason, sizeof(s->w_reason), "%s",
                 t->finish_reason[0] ? t->finish_reason : "incomplete");
        break;
    case STREAMWIRE__V1__STATUS__STATUS_CANCELLED:
        s->w_status = SW_STATUS_CANCELLED;
        snprintf(s->w_reason, sizeof(s->w_reason), "cancelled");
        break;
    default: /* FAILED (validated by the codec) */
        snprintf(s->w_msg, sizeof(s->w_msg), "%s", t->error->message);
        if (t->error->sw_code != 0) {
            const char *name = sw_err_name((int)t->error->sw_code);
            s->w_status = SW_STATUS_ERROR;
            s->w_err = strcmp(name, "unknown_error") == 0 ? SW_EPROTO : (sw_err)t->error->sw_code;
            snprintf(s->w_reason, sizeof(s->w_reason), "%s", sw_err_name(s->w_err));
        } else {
            s->w_status = SW_STATUS_FAILED;
            snprintf(s->w_reason, sizeof(s->w_reason), "%s", t->error->app_code);
        }
        break;
    }
}

static void
st_on_item(sw_stream *s, const swp_item *w)
{
    swe_ctl ctl = {0, 0, 0, 0, 0};
    int64_t now = swi_now_ms();
    int fail = 0;
    sw_err fail_err = SW_OK;
    const char *fail_msg = NULL;
    int after_final_wins = 0;
    int is_hb = w->body_case == STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_HEARTBEAT;

    pthread_mutex_lock(&s->mu);
    if (s->req_buf != NULL) { /* the instance answered: no re-routing any more */
        free(s->req_buf);
        s->req_buf = NULL;
    }
    if (s->term_state != TERM_NONE) {
        /* Something arrived after the terminal was decided. */
        if (!is_hb && s->final_seq != 0 && w->seq > s->final_seq) {
            if (s->term_state == TERM_QUEUED && s->term_from_wire)
                after_final_wins = st_set_terminal(
                    s, SW_STATUS_ERROR, SW_ITEM_AFTER_FINAL, NULL,
                    "the worker sent an item after its final marker", 0, 0);
            else
                __atomic_fetch_add(&s->r->items_after_final, 1, __ATOMIC_RELAXED);
        }
        pthread_mutex_unlock(&s->mu);
        if (after_final_wins) {
            rt_remove(s);
            st_dispatch(s);
        }
        return;
    }
    __atomic_store_n(&s->last_rx_ms, now, __ATOMIC_RELAXED); /* read by probe rounds */
    if (is_hb) {
        s->st.heartbeats++;
        /* Heartbeats follow the items they count on the wire: anything
         * missing up to last_seq was lost. */
        if (w->heartbeat->last_seq >= s->expected && s->window != 0 &&
            now - s->last_resend_ms >= 20) {
            if (s->gap_since_ms == 0) {
                s->gap_since_ms = now;
                st_tick_soon(s); /* the gap timers */
            }
            ctl.kind = STREAMWIRE__V1__CONTROL_KIND__CONTROL_RESEND;
            ctl.from = s->expected;
            ctl.to = w->heartbeat->last_seq;
            s->last_resend_ms = now;
            s->st.resend_requests++;
        }
        goto out;
    }
    if (s->final_seq != 0 && w->seq > s->final_seq) {
        fail = 1;
        fail_err = SW_ITEM_AFTER_FINAL;
        fail_msg = "the worker sent an item after its final marker";
        goto out;
    }
    if (w->credit_window != 0 && w->credit_window < s->window) {
        /* The worker grants less than we asked (its max_window): adopt its
         * window, or we would wait for credit it never needs. */
        s->window = w->credit_window;
        if (s->credit_sent > s->consumed + s->window)
            s->credit_sent = s->window > s->consumed ? s->window : s->consumed;
    }
    if (w->seq < s->expected) {
        s->st.duplicates++;
        goto out;
    }
    if (w->complete_final) {
        if (s->final_seq != 0 && s->final_seq != w->seq) {
            fail = 1;
            fail_err = SW_ITEM_AFTER_FINAL;
            fail_msg = "the worker sent two final markers";
            goto out;
        }
        st_note_final(s, w);
    }
    if (w->seq == s->expected) {
        swe_q *q = st_make_q(w);
        if (q == NULL) {
            fail = 1;
            fail_err = SW_ENOMEM;
            goto out;
        }
        st_accept(s, q, &ctl);
        while (s->term_state == TERM_NONE && s->held > 0) {
            swe_q **slot = &s->hold[s->expected % s->hold_cap];
            if (*slot == NULL || (*slot)->seq != s->expected)
                break;
            q = *slot;
            *slot = NULL;
            s->held--;
            s->st.reordered++;
            st_accept(s, q, &ctl);
        }
        if (s->held == 0)
            s->gap_since_ms = 0;
        goto out;
    }
    /* A gap: hold the item and ask for the missing range. */
    if (w->seq - s->expected >= s->hold_cap) {
        fail = 1;
        fail_err = SW_SEQUENCE_GAP;
        fail_msg = "an item arrived beyond the reorder window";
        goto out;
    }
    if (s->hold == NULL && (s->hold = calloc(s->hold_cap, sizeof(*s->hold))) == NULL) {
        fail = 1;
        fail_err = SW_ENOMEM;
        goto out;
    }
    {
        swe_q **slot = &s->hold[w->seq % s->hold_cap];
        if (*slot != NULL) {
            s->st.duplicates++;
            goto out;
        }
        if ((*slot = st_make_q(w)) == NULL) {
            fail = 1;
            fail_err = SW_ENOMEM;
            goto out;
        }
        s->held++;
        if (s->gap_since_ms == 0) {
            s->gap_since_ms = now;
            st_tick_soon(s); /* the gap timers */
            if (s->window != 0) {
                ctl.kind = STREAMWIRE__V1__CONTROL_KIND__CONTROL_RESEND;
                ctl.from = s->expected;
                ctl.to = w->seq - 1;
                s->last_resend_ms = now;
                s->st.resend_requests++;
            }
        }
    }
out:
    pthread_mutex_unlock(&s->mu);
    if (fail) {
        st_fail(s, fail_err, fail_msg, 1);
        return;
    }
    st_send_control(s, &ctl);
    if (s->on_item != NULL)
        st_dispatch(s);
    else
        pthread_cond_broadcast(&s->cv);
}

/* ---------------------------------------------------------------- delivery */

static void
st_fill_terminal(sw_stream *s)
{
    memset(&s->cur, 0, sizeof(s->cur));
    s->cur.kind = SW_ITEM_TERMINAL;
    s->cur.seq = s->term_seq;
    s->cur.terminal = s->term;
    s->cur.instance_id = __atomic_load_n(&s->inst_pub, __ATOMIC_ACQUIRE);
}

static void
st_fill_data(sw_stream *s, swe_q *q)
{
    memset(&s->cur, 0, sizeof(s->cur));
    s->cur.kind = SW_ITEM_DATA;
    s->cur.seq = q->seq;
    s->cur.data = q->data;
    s->cur.len = q->len;
    s->cur.droppable = q->droppable;
    s->cur.instance_id = __atomic_load_n(&s->inst_pub, __ATOMIC_ACQUIRE);
}

/* Pops the next ready item into s->cur (s->mu held). Returns 1 data,
 * 2 terminal, 0 nothing ready. */
static int
st_pop(sw_stream *s, swe_ctl *credit)
{
    free(s->cur_q);
    s->cur_q = NULL;
    if (s->qh != NULL) {
        swe_q *q = s->qh;
        s->qh = q->next;
        if (s->qh == NULL)
            s->qt = NULL;
        s->qlen--;
        s->cur_q = q;
        st_fill_data(s, q);
        st_consumed(s, credit);
        return 1;
    }
    if (s->term_state == TERM_QUEUED && swi_now_ms() >= s->term_ready_ms) {
        s->term_state = TERM_DELIVERED;
        st_fill_terminal(s);
        return 2;
    }
    return 0;
}

static void
st_delivered_terminal(sw_stream *s)
{
    rt_count_terminal(s->r, &s->term);
    rt_remove(s);
}

static void
st_dispatch(sw_stream *s)
{
    if (s->on_item == NULL) {
        pthread_cond_broadcast(&s->cv);
        return;
    }
    st_ref(s);
    pthread_mutex_lock(&s->mu);
    if (s->dispatching) {
        pthread_mutex_unlock(&s->mu);
        st_unref(s);
        return;
    }
    s->dispatching = 1;
    for (;;) {
        swe_ctl credit = {0, 0, 0, 0, 0};
        int got = st_pop(s, &credit);
        sw_item item;
        if (got == 0)
            break;
        item = s->cur;
        s->in_cb = 1;
        s->cb_thread = pthread_self();
        pthread_mutex_unlock(&s->mu);
        st_send_control(s, &credit);
        if (got == 2)
            st_delivered_terminal(s);
        s->on_item(s, &item, s->on_item_arg);
        pthread_mutex_lock(&s->mu);
        s->in_cb = 0;
        pthread_cond_broadcast(&s->cv);
    }
    free(s->cur_q);
    s->cur_q = NULL;
    s->dispatching = 0;
    pthread_mutex_unlock(&s->mu);
    st_unref(s);
}

sw_err
sw_stream_next(sw_stream *s, const sw_item **item, int64_t timeout_ms)
{
    int64_t until;
    swe_ctl credit = {0, 0, 0, 0, 0};
    int got = 0;

    if (s == NULL || item == NULL)
        return SW_EINVAL;
    *item = NULL;
    if (s->on_item != NULL)
        return SW_EBUSY;
    until = timeout_ms < 0 ? -1 : swi_now_ms() + timeout_ms;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        int64_t wake = until;
        if (s->term_state == TERM_DELIVERED && s->qh == NULL) {
            free(s->cur_q);
            s->cur_q = NULL;
            pthread_mutex_unlock(&s->mu);
            return SW_EEOF;
        }
        if ((got = st_pop(s, &credit)) != 0)
            break;
        if (s->term_state == TERM_QUEUED && (wake < 0 || s->term_ready_ms < wake))
            wake = s->term_ready_ms;
        if (until >= 0 && swi_now_ms() >= until) {
            pthread_mutex_unlock(&s->mu);
            return SW_ETIMEDOUT;
        }
        swi_cond_wait_until(&s->cv, &s->mu, wake);
    }
    *item = &s->cur;
    pthread_mutex_unlock(&s->mu);
    st_send_control(s, &credit);
    if (got == 2)
        st_delivered_terminal(s);
    return SW_OK;
}

/* ---------------------------------------------------------------- cancel, close */

static sw_err
st_cancel(sw_stream *s, int kill)
{
    int set;
    swe_ctl c = {0, 0, 0, 0, 0};
    if (s == NULL)
        return SW_EINVAL;
    pthread_mutex_lock(&s->mu);
    if (s->term_state != TERM_NONE) {
        pthread_mutex_unlock(&s->mu);
        return SW_EEOF;
    }
    set = st_set_terminal(s, SW_STATUS_CANCELLED, SW_OK, "cancelled",
                          kill ? "killed by the frontend" : "cancelled by the frontend", 0, 0);
    /* A data callback already under way on another thread finishes before
     * we return: after this call, no data item reaches the consumer. */
    while (s->in_cb && !pthread_equal(s->cb_thread, pthread_self()))
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    if (!set)
        return SW_EEOF;
    rt_remove(s);
    c.kind = kill ? STREAMWIRE__V1__CONTROL_KIND__CONTROL_KILL
                  : STREAMWIRE__V1__CONTROL_KIND__CONTROL_CANCEL;
    st_send_control(s, &c);
    st_dispatch(s);
    return SW_OK;
}

sw_err
sw_stream_cancel(sw_stream *s)
{
    return st_cancel(s, 0);
}

sw_err
sw_stream_kill(sw_stream *s)
{
    return st_cancel(s, 1);
}

void
sw_stream_close(sw_stream *s)
{
    if (s == NULL)
        return;
    (void)st_cancel(s, 0);
    rt_remove(s);
    st_unref(s);
}

const char *
sw_stream_request_id(const sw_stream *s)
{
    return s ? s->idhex : "";
}

const char *
sw_stream_instance_id(const sw_stream *s)
{
    return s ? __atomic_load_n(&s->inst_pub, __ATOMIC_ACQUIRE) : "";
}

void
sw_stream_stats_get(sw_stream *s, sw_stream_stats *out)
{
    if (s == NULL || out == NULL)
        return;
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    pthread_mutex_unlock(&s->mu);
}

/* ---------------------------------------------------------------- re-routing */

/* A request routed by the registry found nobody on the instance's request
 * subject (it drains, or died since the last probe): quarantine that
 * instance here and send the same request, once, to another. Returns 1 if
 * the request went out again. The instance switch holds r->mu, then s->mu:
 * readers of s->instance hold either. */
static int
st_reroute(sw_stream *s)
{
    sw_router *r = s->r;
    char old[SW_MAX_TOKEN + 1], next[SW_MAX_TOKEN + 1];
    char req_subj[SWT_SUBJECT_MAX], resp_subj[SWT_SUBJECT_MAX];
    uint8_t *buf = NULL;
    size_t len = 0;
    int moved = 0;

    pthread_mutex_lock(&s->mu);
    if (!s->routed || s->rerouted || s->req_buf == NULL || s->term_state != TERM_NONE ||
        (buf = malloc(s->req_len)) == NULL) {
        pthread_mutex_unlock(&s->mu);
        return 0;
    }
    s->rerouted = 1;
    memcpy(buf, s->req_buf, s->req_len);
    len = s->req_len;
    memcpy(old, s->instance, sizeof(old));
    pthread_mutex_unlock(&s->mu);

    (void)swr_pool_quarantine(r->pool, old); /* local only: it may be alive and draining */
    if (swr_pool_pick(r->pool, s->endpoint, next) != SW_OK) {
        free(buf);
        return 0;
    }
    pthread_mutex_lock(&r->mu);
    if (s->in_table && s->pooled && rt_inst_add(r, next) == 0) {
        rt_inst_del(r, old);
        pthread_mutex_lock(&s->mu);
        memcpy(s->instance, next, sizeof(next));
        memcpy(s->inst_second, next, sizeof(next));
        __atomic_store_n(&s->inst_pub, s->inst_second, __ATOMIC_RELEASE);
        (void)swt_subject_control(s->ctl_subj, sizeof(s->ctl_subj), next);
        pthread_mutex_unlock(&s->mu);
        moved = 1;
    }
    pthread_mutex_unlock(&r->mu);
    if (!moved) {
        swr_pool_done(r->pool, next);
        free(buf);
        return 0;
    }
    swr_pool_done(r->pool, old);
    (void)swt_subject_request(req_subj, sizeof(req_subj), s->endpoint, next);
    (void)swt_subject_response(resp_subj, sizeof(resp_subj), r->id, s->idhex);
    swi_log(&r->log, SW_LOG_INFO, "stream %s: no responder on %s; re-routed to %s", s->idhex, old,
            next);
    moved = swt_publish(r->conn, req_subj, resp_subj, buf, len) == SW_OK;
    free(buf);
    return moved;
}

/* ---------------------------------------------------------------- mux */

/* A worker's heartbeats for many of our streams (sw.rsp.<router>.hb): each
 * beat is handled as the heartbeat wrapper it stands for. */
static void
rt_on_beats(sw_router *r, const swt_msg *msg)
{
    swp_beats *b = NULL;
    uint64_t unknown = 0;
    sw_err rv = swp_decode_beats(msg->data, msg->len, sw_conn_max_payload(r->conn) + 1024, &b);
    if (rv != SW_OK) {
        pthread_mutex_lock(&r->mu);
        r->st.bad_messages++;
        pthread_mutex_unlock(&r->mu);
        swi_log(&r->log, SW_LOG_WARN, "a heartbeat batch did not decode: %s", sw_err_name(rv));
        return;
    }
    for (size_t i = 0; i < b->n_beats; i++) {
        swp_item w = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__INIT;
        swp_heartbeat h = STREAMWIRE__V1__HEARTBEAT__INIT;
        sw_stream *s = rt_lookup(r, b->beats[i]->request_id.data);
        if (s == NULL) {
            unknown++;
            continue;
        }
        if (strcmp(__atomic_load_n(&s->inst_pub, __ATOMIC_ACQUIRE), b->instance_id) != 0) {
            unknown++; /* not the instance this stream is on (stale or forged) */
            st_unref(s);
            continue;
        }
        h.last_seq = b->beats[i]->last_seq;
        w.version = SW_PROTOCOL_VERSION;
        w.request_id = b->beats[i]->request_id;
        w.body_case = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_HEARTBEAT;
        w.heartbeat = &h;
        st_on_item(s, &w);
        st_unref(s);
    }
    if (unknown) {
        pthread_mutex_lock(&r->mu);
        r->st.unknown_stream += unknown;
        pthread_mutex_unlock(&r->mu);
    }
    swp_free(b);
}

static void
rt_on_msg(const swt_msg *msg, void *arg)
{
    sw_router *r = arg;
    uint8_t id[SW_REQUEST_ID_BYTES];
    sw_stream *s = NULL;
    swp_item *w = NULL;
    swp_arena arena;
    sw_err rv;

    if (swt_is_beats_subject(msg->subject)) {
        rt_on_beats(r, msg);
        goto done;
    }
    if (swt_response_subject_id(msg->subject, id) != 0 ||
        (s = rt_lookup(r, id)) == NULL) {
        pthread_mutex_lock(&r->mu);
        r->st.unknown_stream++;
        pthread_mutex_unlock(&r->mu);
        goto done;
    }
    if (msg->no_responders) {
        if (!st_reroute(s))
            st_fail(s, SW_NO_RESPONDERS, "no worker is subscribed to the request subject", 0);
        goto done;
    }
    rv = swp_decode_item_arena(msg->data, msg->len, sw_conn_max_payload(r->conn) + 1024, &arena,
                               &w);
    if (rv == SW_OK && memcmp(w->request_id.data, id, SW_REQUEST_ID_BYTES) != 0)
        rv = SW_EPROTO;
    if (rv != SW_OK) {
        char m[128];
        snprintf(m, sizeof(m), "a stream item did not decode (%s)", sw_err_name(rv));
        st_fail(s, SW_DECODE_ERROR, m, 1);
        goto done;
    }
    st_on_item(s, w);
    /* A batch: the items the worker had queued behind the first, in order,
     * each handled as if it had come in a message of its own. */
    for (size_t i = 0; i < w->n_batch; i++) {
        const swp_batched *b = w->batch[i];
        swp_item one = *w;
        one.n_batch = 0;
        one.batch = NULL;
        one.seq = b->seq;
        one.data = b->data;
        one.droppable = b->droppable;
        one.complete_final = b->complete_final;
        one.terminal = b->terminal;
        one.body_case = b->complete_final ? STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY__NOT_SET
                                          : STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_DATA;
        st_on_item(s, &one);
    }
done:
    swp_free_arena(w, &arena);
    if (s != NULL)
        st_unref(s);
}

/* A worker asks whether this frontend still exists; any answer will do. */
static void
rt_on_probe(const swt_msg *msg, void *arg)
{
    sw_router *r = arg;
    swp_probe_reply p = STREAMWIRE__V1__PROBE_REPLY__INIT;
    uint8_t buf[128];
    size_t len;
    const char *reply = msg->reply;
    p.version = SW_PROTOCOL_VERSION;
    p.instance_id = r->id;
    if (reply != NULL && swp_encode(&p, buf, sizeof(buf), &len) == SW_OK)
        (void)swt_publish(r->conn, reply, NULL, buf, len);
}

/* ---------------------------------------------------------------- instance loss */

/* Takes a reference on s for a snapshot: always (arg NULL), or only if the
 * timer has something to check on it by *(int64_t *)arg. */
static int
st_take(void *v, void *arg)
{
    sw_stream *s = v;
    if (arg != NULL && __atomic_load_n(&s->next_tick_ms, __ATOMIC_RELAXED) > *(const int64_t *)arg)
        return 0;
    st_ref(s);
    return 1;
}

/* The open streams, each with a reference (drop with st_unref): all
 * (due_by NULL), or those with a timer check due by *due_by. */
static void
rt_snapshot(sw_router *r, swi_ptrvec *vec, const int64_t *due_by)
{
    pthread_mutex_lock(&r->mu);
    swi_idmap_snapshot(&r->streams, vec, st_take, (void *)(uintptr_t)due_by);
    pthread_mutex_unlock(&r->mu);
}

#define ST_AT(vec, i) ((sw_stream *)(vec).v[i])

/* The instance is gone: end every stream to it with instance_lost, then
 * quarantine it and report it so that every router stops routing there. */
static void
rt_instance_lost(sw_router *r, const char *id, const char *why, int64_t silent_ms)
{
    swi_ptrvec vec = {NULL, 0, 0};
    char msg[160];
    char inst[SW_MAX_TOKEN + 1];
    unsigned n = 0;
    int report;
    snprintf(inst, sizeof(inst), "%s", id); /* id may live in r->inst */
    snprintf(msg, sizeof(msg), "instance %s was lost: %s", inst, why);
    /* Quarantine before any consumer hears of it: one that retries at once
     * must not be routed straight back. */
    report = swr_pool_quarantine(r->pool, inst);
    pthread_mutex_lock(&r->mu);
    r->st.instances_lost++;
    r->st.last_loss_detect_ms = (uint64_t)(silent_ms > 0 ? silent_ms : 0);
    pthread_mutex_unlock(&r->mu);
    rt_snapshot(r, &vec, NULL);
    for (size_t i = 0; i < vec.n; i++) {
        sw_stream *s = ST_AT(vec, i);
        int match;
        pthread_mutex_lock(&s->mu);
        match = strcmp(s->instance, inst) == 0;
        pthread_mutex_unlock(&s->mu);
        if (match) {
            st_fail(s, SW_INSTANCE_LOST, msg, 0);
            n++;
        }
        st_unref(s);
    }
    free(vec.v);
    swi_log(&r->log, SW_LOG_WARN, "%s (%u stream(s) ended)", msg, n);
    if (report)
        swr_pool_report(r->pool, inst, why);
}

static void
rt_on_probe_reply(const swt_msg *msg, void *arg)
{
    sw_router *r = arg;
    const char *id = swt_subject_last_token(msg->subject);
    int lost = 0;
    int64_t now = swi_now_ms(), silent = 0;
    rt_inst *e;
    if (id == NULL)
        return;
    pthread_mutex_lock(&r->mu);
    if ((e = rt_inst_find(r, id)) != NULL) {
        e->outstanding = 0;
        if (msg->no_responders) {
            lost = 1;
            silent = now - e->last_ok_ms;
            e->misses = 0;
        } else {
            e->last_ok_ms = now;
            e->misses = 0;
            e->suspect = 0; /* it answered: alive, whatever the registry said */
        }
    }
    pthread_mutex_unlock(&r->mu);
    if (lost)
        rt_instance_lost(r, id, "its subscription is gone (no responders)", silent);
}

typedef struct {
    const char *id;
    int64_t since;
    int active;
} rt_activity;

static void
rt_activity_cb(void *val, void *arg)
{
    sw_stream *s = val;
    rt_activity *a = arg;
    if (!a->active && strcmp(s->instance, a->id) == 0 &&
        __atomic_load_n(&s->last_rx_ms, __ATOMIC_RELAXED) >= a->since)
        a->active = 1;
}

/* 1 if a stream to instance id received anything since `since` (r->mu
 * held): a worker that streams is alive, answered probe or not (its control
 * thread may be busy in a user's cancel callback). */
static int
rt_inst_active_since(sw_router *r, const char *id, int64_t since)
{
    rt_activity a = {id, since, 0};
    swi_idmap_each(&r->streams, rt_activity_cb, &a);
    return a.active;
}

/* The registry removed an instance (another router reported it dead, or
 * its lease ran out). If we have streams to it, probe it now instead of
 * waiting for the next round, and let a single miss decide. */
static void
rt_on_removed(void *arg, const char *instance)
{
    sw_router *r = arg;
    rt_inst *e;
    pthread_mutex_lock(&r->mu);
    if ((e = rt_inst_find(r, instance)) != NULL) {
        e->suspect = 1;
        if (!e->outstanding)
            e->sent_ms = 0; /* due at the next round, within SWE_TICK_MS */
    }
    pthread_mutex_unlock(&r->mu);
}

/* One probing round (timer thread). */
static void
rt_probe_round(sw_router *r, int64_t now)
{
    char lost[SW_MAX_TOKEN + 1] = "";
    int64_t silent = 0;
    size_t nsend = 0;
    struct {
        char ctl[SWT_SUBJECT_MAX];
        char reply[SWT_SUBJECT_MAX];
    } send[8];
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < r->ninst; i++) {
        rt_inst *e = &r->inst[i];
        if (e->outstanding && now - e->sent_ms >= (int64_t)r->probe_timeout_ms) {
            e->outstanding = 0;
            if (rt_inst_active_since(r, e->id, e->sent_ms)) {
                e->misses = 0;
                e->suspect = 0;
                e->last_ok_ms = now;
            } else if ((++e->misses >= r->probe_misses || e->suspect) && lost[0] == '\0') {
                snprintf(lost, sizeof(lost), "%s", e->id);
                silent = now - e->last_ok_ms;
                e->misses = 0;
                continue;
            }
        }
        if (!e->outstanding && now - e->sent_ms >= (int64_t)r->probe_ms && nsend < 8) {
            e->outstanding = 1;
            e->sent_ms = now;
            snprintf(send[nsend].ctl, sizeof(send[nsend].ctl), "%s", e->ctl_subj);
            (void)swt_subject_probe_reply(send[nsend].reply, sizeof(send[nsend].reply), r->id,
                                          e->id);
            nsend++;
        }
    }
    r->st.probes_sent += nsend;
    pthread_mutex_unlock(&r->mu);
    for (size_t i = 0; i < nsend; i++) {
        swp_control m = STREAMWIRE__V1__CONTROL__INIT;
        uint8_t buf[64];
        size_t len;
        m.version = SW_PROTOCOL_VERSION;
        m.kind = STREAMWIRE__V1__CONTROL_KIND__CONTROL_PROBE;
        m.router_id = r->id;
        if (swp_encode(&m, buf, sizeof(buf), &len) == SW_OK)
            (void)swt_publish(r->conn, send[i].ctl, send[i].reply, buf, len);
    }
    if (lost[0] != '\0')
        rt_instance_lost(r, lost, "it did not answer probes (frozen or partitioned)", silent);
}

/* ---------------------------------------------------------------- timer */

/* When the scan next has to look at s (s->mu held): its deadline, its
 * inactivity limit, gap repair and the gap timeout, a lingering final. A
 * state change that makes a check due earlier calls st_tick_soon. */
static void
st_plan_tick(sw_stream *s)
{
    int64_t due = INT64_MAX, gap = (int64_t)s->r->gap_ms;
    if (s->term_state == TERM_NONE) {
        if (s->deadline_ms >= 0)
            due = s->deadline_ms;
        if (s->last_rx_ms + (int64_t)s->inactivity_ms < due)
            due = s->last_rx_ms + (int64_t)s->inactivity_ms;
        if (s->gap_since_ms != 0) {
            if (s->gap_since_ms + gap < due)
                due = s->gap_since_ms + gap;
            if (s->window != 0 && s->last_resend_ms + gap / 4 < due)
                due = s->last_resend_ms + gap / 4;
        }
    } else if (s->term_state == TERM_QUEUED) {
        due = s->term_ready_ms;
    }
    __atomic_store_n(&s->next_tick_ms, due, __ATOMIC_RELAXED);
}

/* now: the time; quiet: the time up to which this router has processed
 * everything it received (now when the mux queue is empty). Silence is
 * judged up to `quiet`, so a router behind on its own queue never blames
 * the worker. */
static void
st_tick(sw_stream *s, int64_t now, int64_t quiet)
{
    sw_err fail = SW_OK;
    const char *msg = NULL;
    int linger_ready = 0, queued;
    swe_ctl ctl = {0, 0, 0, 0, 0};
    sw_router *r = s->r;

    pthread_mutex_lock(&s->mu);
    if (s->term_state == TERM_NONE) {
        if (s->deadline_ms >= 0 && now >= s->deadline_ms) {
            fail = SW_DEADLINE_EXCEEDED;
            msg = "the request deadline passed";
        } else if (s->gap_since_ms != 0 && quiet - s->gap_since_ms >= (int64_t)r->gap_ms) {
            fail = SW_SEQUENCE_GAP;
            msg = "a sequence gap was not repaired in time";
        } else if (quiet - s->last_rx_ms >= (int64_t)s->inactivity_ms) {
            fail = SW_STREAM_INCOMPLETE;
            msg = "no item or heartbeat within the inactivity timeout";
        } else if (s->gap_since_ms != 0 && s->window != 0 &&
                   now - s->last_resend_ms >= (int64_t)r->gap_ms / 4) {
            ctl.kind = STREAMWIRE__V1__CONTROL_KIND__CONTROL_RESEND;
            ctl.from = s->expected;
            ctl.to = s->expected + s->hold_cap - 1;
            s->last_resend_ms = now;
            s->st.resend_requests++;
        }
    } else if (s->term_state == TERM_QUEUED && s->on_item != NULL && now >= s->term_ready_ms) {
        linger_ready = 1;
    }
    queued = s->term_state == TERM_QUEUED;
    st_plan_tick(s);
    pthread_mutex_unlock(&s->mu);
    if (fail != SW_OK)
        st_fail(s, fail, msg, 1);
    st_send_control(s, &ctl);
    if (linger_ready)
        st_dispatch(s);
    else if (queued)
        pthread_cond_broadcast(&s->cv);
}

static void *
rt_timer_main(void *arg)
{
    sw_router *r = arg;
    swi_ptrvec vec = {NULL, 0, 0};
    int64_t next_scan = 0;
    pthread_mutex_lock(&r->mu);
    while (!r->closing) {
        int64_t now;
        swi_cond_wait_until(&r->tick_cv, &r->mu, swi_now_ms() + SWE_TICK_MS);
        if (r->closing)
            break;
        pthread_mutex_unlock(&r->mu);
        now = swi_now_ms();
        if (now >= next_scan) {
            /* Every open stream: cheap each, but 10k streams add up. */
            next_scan = now + SWE_SCAN_MS;
            if (swt_sub_pending(r->mux) == 0)
                r->mux_idle_ms = now;
            rt_snapshot(r, &vec, &now); /* only streams with something due */
            for (size_t i = 0; i < vec.n; i++) {
                st_tick(ST_AT(vec, i), now, r->mux_idle_ms < now ? r->mux_idle_ms : now);
                st_unref(ST_AT(vec, i));
            }
        }
        rt_probe_round(r, now);
        rt_flush_acks(r);
        pthread_mutex_lock(&r->mu);
    }
    pthread_mutex_unlock(&r->mu);
    free(vec.v);
    return NULL;
}

/* ---------------------------------------------------------------- router */

void
sw_router_opts_init(sw_router_opts *o)
{
    if (o == NULL)
        return;
    memset(o, 0, sizeof(*o));
    o->credit_window = 256;
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
    if (o->credit_window > SWP_MAX_WINDOW || o->heartbeat_ms > SWP_MAX_HEARTBEAT_MS)
        return SW_EINVAL;
    if ((rv = swi_init()) != SW_OK)
        return rv;
    if ((r = calloc(1, sizeof(*r))) == NULL)
        return SW_ENOMEM;
    atomic_init(&r->refs, 1);
    r->conn = conn;
    r->log.fn = o->log;
    r->log.arg = o->log_arg;
    if (o->router_id != NULL)
        snprintf(r->id, sizeof(r->id), "%s", o->router_id);
    else
        swi_random_token(r->id);
    r->window = o->credit_window ? o->credit_window : 256;
    r->hb_ms = o->heartbeat_ms ? o->heartbeat_ms : 250;
    r->inactivity_ms = o->inactivity_ms ? o->inactivity_ms : 4 * r->hb_ms + 500;
    r->gap_ms = o->gap_timeout_ms ? o->gap_timeout_ms : 500;
    r->linger_ms = o->final_linger_ms;
    r->max_streams = o->max_streams ? o->max_streams : 65536;
    r->probe_ms = o->probe_interval_ms ? o->probe_interval_ms : 100;
    r->probe_timeout_ms = o->probe_timeout_ms ? o->probe_timeout_ms : 300;
    r->probe_misses = o->probe_misses ? o->probe_misses : 2;
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->ack_mu, NULL);
    pthread_mutex_init(&r->flush_mu, NULL);
    swi_cond_init(&r->tick_cv);
    if (swi_idmap_init(&r->streams, 256) != 0) {
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
        po.on_removed = rt_on_removed;
        po.on_removed_arg = r;
        if ((rv = swr_pool_create(&r->pool, &po)) != SW_OK)
            goto fail;
    }
    (void)swt_subject_response_wildcard(r->wildcard, sizeof(r->wildcard), r->id);
    (void)swt_subject_router(live_subj, sizeof(live_subj), r->id);
    (void)swt_subject_probe_reply(prb, sizeof(prb), r->id, NULL);
    if ((rv = swt_subscribe(conn, &r->mux, r->wildcard, rt_on_msg, r)) != SW_OK ||
        (rv = swt_subscribe(conn, &r->live, live_subj, rt_on_probe, r)) != SW_OK ||
        (rv = swt_subscribe(conn, &r->prb, prb, rt_on_probe_reply, r)) != SW_OK ||
        (rv = swt_flush(conn, 5000)) != SW_OK)
        goto fail;
    if (pthread_create(&r->timer, NULL, rt_timer_main, r) != 0) {
        rv = SW_ENOMEM;
        goto fail;
    }
    r->timer_started = 1;
    *out = r;
    return SW_OK;
fail:
    swt_sub_close(r->conn, &r->prb);
    swt_sub_close(r->conn, &r->live);
    swt_sub_close(r->conn, &r->mux);
    rt_unref(r);
    return rv;
}

const char *
sw_router_id(const sw_router *r)
{
    return r ? r->id : "";
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
}

void
sw_router_destroy(sw_router *r)
{
    swi_ptrvec vec = {NULL, 0, 0};
    if (r == NULL)
        return;
    pthread_mutex_lock(&r->mu);
    r->closing = 1;
    pthread_cond_broadcast(&r->tick_cv);
    pthread_mutex_unlock(&r->mu);
    if (r->timer_started)
        pthread_join(r->timer, NULL);
    swt_sub_close(r->conn, &r->live);
    swt_sub_close(r->conn, &r->prb);
    swt_sub_close(r->conn, &r->mux);
    rt_flush_acks(r); /* after the mux drained: finals it delivered are acked too */
    rt_snapshot(r, &vec, NULL);
    for (size_t i = 0; i < vec.n; i++) {
        sw_stream *s = ST_AT(vec, i);
        /* A terminal held back by final_linger_ms goes out now: the timer
         * that would have released it is gone. */
        pthread_mutex_lock(&s->mu);
        if (s->term_state == TERM_QUEUED)
            s->term_ready_ms = 0;
        pthread_mutex_unlock(&s->mu);
        st_fail(s, SW_ECLOSED, "the router was destroyed", 1);
        st_dispatch(s);
        st_unref(s);
    }
    free(vec.v);
    (void)swt_flush(r->conn, 1000);
    __atomic_store_n(&r->closed, 1, __ATOMIC_RELEASE);
    rt_unref(r);
}

/* ---------------------------------------------------------------- open */

sw_err
sw_router_open(sw_stream **out, sw_router *r, const sw_request_opts *o, const void *payload,
               size_t len)
{
    sw_stream *s;
    char req_subj[SWT_SUBJECT_MAX];
    char resp_subj[SWT_SUBJECT_MAX];
    swp_request m = STREAMWIRE__V1__REQUEST__INIT;
    uint8_t *buf = NULL;
    size_t blen = 0;
    sw_err rv;
    int full = 0, closing = 0, no_instances = 0;

    if (out == NULL || r == NULL || o == NULL || (payload == NULL && len != 0))
        return SW_EINVAL;
    *out = NULL;
    if (sw_validate_endpoint(o->endpoint) != SW_OK ||
        (o->instance_id != NULL && sw_validate_token(o->instance_id) != SW_OK) ||
        o->credit_window > SWP_MAX_WINDOW || o->heartbeat_ms > SWP_MAX_HEARTBEAT_MS)
        return SW_EINVAL;
    if ((s = calloc(1, sizeof(*s))) == NULL)
        return SW_ENOMEM;
    atomic_init(&s->refs, 1);
    atomic_fetch_add(&r->refs, 1);
    s->r = r;
    pthread_mutex_init(&s->mu, NULL);
    swi_cond_init(&s->cv);
    swi_random(s->id, sizeof(s->id));
    swi_hex(s->idhex, s->id, sizeof(s->id));
    if (o->instance_id != NULL) {
        snprintf(s->instance, sizeof(s->instance), "%s", o->instance_id);
        swr_pool_begin(r->pool, s->instance);
        s->pooled = 1;
    } else if (swr_pool_pick(r->pool, o->endpoint, s->instance) == SW_OK) {
        s->pooled = 1;
        s->routed = 1;
    } else {
        no_instances = 1;
    }
    snprintf(s->endpoint, sizeof(s->endpoint), "%s", o->endpoint);
    memcpy(s->inst_first, s->instance, sizeof(s->inst_first));
    s->inst_pub = s->inst_first;
    s->on_item = o->on_item;
    s->on_item_arg = o->on_item_arg;
    s->window = o->credit_window ? o->credit_window : r->window;
    s->credit_sent = s->window;
    s->inactivity_ms = r->inactivity_ms;
    if (o->heartbeat_ms != 0 && o->heartbeat_ms != r->hb_ms)
        s->inactivity_ms = 4 * o->heartbeat_ms + 500;
    s->expected = 1;
    /* The reorder array is allocated on the first out-of-order item. */
    s->hold_cap = (size_t)s->window + 2;
    if (s->window == 0)
        s->hold_cap = 256;
    if (!no_instances) {
        (void)swt_subject_control(s->ctl_subj, sizeof(s->ctl_subj), s->instance);
        (void)swt_subject_request(req_subj, sizeof(req_subj), o->endpoint, s->instance);
    }
    (void)swt_subject_response(resp_subj, sizeof(resp_subj), r->id, s->idhex);
    s->last_rx_ms = swi_now_ms();
    s->deadline_ms = o->deadline_ms ? s->last_rx_ms + o->deadline_ms : -1;

    m.version = SW_PROTOCOL_VERSION;
    m.request_id.data = s->id;
    m.request_id.len = sizeof(s->id);
    m.response_subject = resp_subj;
    m.router_id = r->id;
    m.payload.data = (uint8_t *)payload;
    m.payload.len = len;
    m.credit_window = s->window;
    m.heartbeat_ms = o->heartbeat_ms ? o->heartbeat_ms : r->hb_ms;
    m.deadline_ms = o->deadline_ms;
    m.endpoint = (char *)o->endpoint;
    m.max_tokens = o->max_tokens;

    pthread_mutex_lock(&r->mu);
    if (r->closing)
        closing = 1;
    else if (r->st.open_streams >= r->max_streams)
        full = 1;
    else if (swi_idmap_put(&r->streams, s->id, s) != 0)
        full = 2;
    else if (s->pooled && rt_inst_add(r, s->instance) != 0) {
        swi_idmap_del(&r->streams, s->id);
        full = 2;
    } else {
        st_ref(s); /* the table's */
        s->in_table = 1;
        r->st.open_streams++;
        r->st.streams_opened++;
    }
    pthread_mutex_unlock(&r->mu);
    if (closing || full) {
        if (s->pooled)
            swr_pool_done(r->pool, s->instance);
        st_unref(s);
        return closing ? SW_ECLOSED : full == 2 ? SW_ENOMEM : SW_EBUSY;
    }
    *out = s;
    if (no_instances) {
        st_fail(s, SW_NO_INSTANCES, "no live instance serves the endpoint", 0);
        return SW_OK;
    }

    /* From here on, every failure is the stream's terminal. */
    rv = swp_encode_alloc(&m, sw_conn_max_payload(r->conn), &buf, &blen);
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
    free(buf);
    if (rv == SW_EMSGSIZE)
        st_fail(s, SW_EMSGSIZE, "the request exceeds the server's max payload", 0);
    else if (rv != SW_OK)
        st_fail(s, rv, "the request could not be published", 0);
    return SW_OK;
}
