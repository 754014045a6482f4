/* egress/stream.c -- sw_stream: the receive state machine (rx.c) behind the
 * stream's mutex, and delivery to the consumer: blocking (sw_stream_next)
 * or callbacks (swe_dispatch, serialised by s->dispatching, called with no
 * lock held; or straight from swe_stream_on_items_at, under the hold of
 * s->mu it took, item by item while they ask for nothing else). The
 * actions the state machine returns are carried out here after s->mu is
 * released (swe_apply). Locks: see egress_int.h. */
#include <stdlib.h>
#include <string.h>

#include "egress/egress_int.h"

void
swe_stream_ref(sw_stream *s)
{
    atomic_fetch_add(&s->refs, 1);
}

void
swe_stream_unref(sw_stream *s)
{
    if (atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    swe_rx_fini(&s->rx);
    swe_migrate_fini(s);
    swi_duetab_release(&s->r->due, s->next_tick);
    free(s->req_buf);
    if (s->endpoint_owned)
        free((char *)s->endpoint);
    free(s->inst_second);
    free(s->cur);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    swe_router_unref(s->r);
    free(s);
}

static int st_deliver_one(sw_stream *s);
static void st_deliver_held(sw_stream *s);

/* The scan looks at s at its next due time (s->mu held). */
static void
st_plan_tick(sw_stream *s)
{
    swi_due_set(s->next_tick, swe_rx_next_due(&s->rx));
}

void
swe_apply(sw_stream *s, const swe_rx_act *act)
{
    if (act->after_final)
        __atomic_fetch_add(&s->r->items_after_final, 1, __ATOMIC_RELAXED);
    if (act->resend)
        swe_send_control(s, act->gen, STREAMWIRE__V1__CONTROL_KIND__CONTROL_RESEND, 0, 0,
                         act->resend_from, act->resend_to);
    if (act->credit && !__atomic_load_n(&s->grant_held, __ATOMIC_ACQUIRE))
        swe_send_credit(s, act);
    if (act->ack_final)
        swe_queue_final_ack(s);
    if (act->ended) {
        swe_remove(s);
        if (act->kill)
            swe_send_control(s, act->gen, STREAMWIRE__V1__CONTROL_KIND__CONTROL_KILL, 0, 0, 0, 0);
    }
    if (act->wake || act->ended)
        swe_dispatch(s);
    if (act->migrate)
        swe_migrate(s);
    if (act->ask)
        swe_stream_ask(s, act->gen);
}

/* After a state machine call (s->mu held): plans the next tick, releases
 * the lock, logs an ended stream, and carries out the actions. */
static void
st_unlock_apply(sw_stream *s, const swe_rx_act *act)
{
    char tag[SWI_LOGTAG_MAX];
    sw_err err;
    st_plan_tick(s);
    err = s->rx.term.error;
    pthread_mutex_unlock(&s->mu);
    if (act->ended)
        swi_log(&s->r->log, SW_LOG_DEBUG, "stream %s: %s", swe_logtag(s, tag), sw_err_name(err));
    swe_apply(s, act);
}

/* Locks s->mu if s still has request id `id` (the one a message was looked
 * up by; a migration on another thread may have moved s to a new one
 * since, under s->mu): 1, locked; 0, not locked. */
static int
st_lock_as(sw_stream *s, const uint8_t *id)
{
    pthread_mutex_lock(&s->mu);
    if (memcmp(s->id, id, SW_REQUEST_ID_BYTES) == 0)
        return 1;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void
swe_stream_on_item(sw_stream *s, const uint8_t *id, const swe_rx_in *in)
{
    swe_stream_on_items(s, id, in, 1);
}

void
swe_stream_on_items(sw_stream *s, const uint8_t *id, const swe_rx_in *in, size_t n)
{
    swe_stream_on_items_at(s, id, in, n, swi_now_ms());
}

void
swe_stream_on_items_at(sw_stream *s, const uint8_t *id, const swe_rx_in *in, size_t n, int64_t now)
{
    swe_rx_act act;
    int wake = 0;
    if (n == 0 || !st_lock_as(s, id))
        return;
    if (s->req_buf != NULL) { /* the instance answered: no re-routing any more */
        free(s->req_buf);
        s->req_buf = NULL;
    }
    for (size_t i = 0;;) {
        swe_rx_on_item(&s->rx, &in[i], now, &act);
        wake |= act.wake;
        if (swe_rx_act_quiet(&act) && s->on_item != NULL && !s->dispatching && !s->opening) {
            /* The common case, items for a callback consumer that ask for
             * nothing to be sent: each is delivered as soon as it is fed,
             * under the hold of s->mu already taken (swe_dispatch's own
             * less one lock, one reference and one tick plan per item; a
             * pop plans the tick), and what is still ready after the last
             * in one loop. One at a time, so the malloc of an item meets
             * the free of the one before in glibc's per-thread cache (a
             * message of 64 items queued whole outran it). The caller's
             * lookup holds a reference. */
            __atomic_store_n(&s->last_rx_ms, s->rx.last_rx_ms, __ATOMIC_RELAXED); /* probes */
            s->dispatching = 1;
            if (++i < n) {
                if (act.wake)
                    (void)st_deliver_one(s);
                s->dispatching = 0;
                continue;
            }
            /* anything this message made ready and not taken yet (the
             * pops plan the tick) */
            if (wake)
                st_deliver_held(s);
            else
                st_plan_tick(s);
            s->dispatching = 0;
            pthread_mutex_unlock(&s->mu);
            return;
        }
        if (++i < n && swe_rx_act_quiet(&act))
            continue; /* the consumer is woken once, after the last */
        /* The last item, or something to send or end: carried out now, in
         * order. */
        act.wake = wake;
        wake = 0;
        __atomic_store_n(&s->last_rx_ms, s->rx.last_rx_ms, __ATOMIC_RELAXED); /* probe rounds */
        st_unlock_apply(s, &act);
        /* (what was applied may have moved the stream, a drain's final
         * handing it over: then the rest is the old worker's) */
        if (i == n || !st_lock_as(s, id))
            return;
    }
}

/* Applies what a failure decided (set: it decided the terminal). */
static void
st_failed(sw_stream *s, sw_err err, int set, swe_rx_act *act)
{
    char tag[SWI_LOGTAG_MAX];
    if (act->migrate) {
        swe_apply(s, act);
        return;
    }
    if (!set)
        return;
    swi_log(&s->r->log, SW_LOG_DEBUG, "stream %s: %s", swe_logtag(s, tag), sw_err_name(err));
    swe_apply(s, act);
}

int
swe_stream_no_responders(sw_stream *s, const uint8_t *id, int may_move, const char *msg)
{
    swe_rx_act act;
    int set = -1;
    memset(&act, 0, sizeof(act));
    pthread_mutex_lock(&s->mu);
    /* looked up under an id the stream has since left (a migration ran on
     * another thread meanwhile): not about its current request */
    if (memcmp(s->id, id, SW_REQUEST_ID_BYTES) == 0)
        set = swe_rx_no_responders(&s->rx, may_move, msg, swi_now_ms(), &act);
    st_plan_tick(s);
    pthread_mutex_unlock(&s->mu);
    if (set < 0)
        return -1;
    st_failed(s, SW_NO_RESPONDERS, set, &act);
    return 0;
}

int
swe_stream_unsealed(sw_stream *s, const uint8_t *id, const char *msg)
{
    swe_rx_act act;
    int set = -1;
    memset(&act, 0, sizeof(act));
    pthread_mutex_lock(&s->mu);
    if (memcmp(s->id, id, SW_REQUEST_ID_BYTES) == 0) /* (not the request it left) */
        set = swe_rx_unsealed(&s->rx, msg, swi_now_ms(), &act);
    st_plan_tick(s);
    pthread_mutex_unlock(&s->mu);
    if (set < 0)
        return -1;
    st_failed(s, SW_AUTH_FAILED, set, &act);
    return 0;
}

void
swe_stream_fail(sw_stream *s, sw_err err, const char *msg, int kill)
{
    swe_rx_act act;
    int set;
    memset(&act, 0, sizeof(act));
    pthread_mutex_lock(&s->mu);
    set = swe_rx_fail(&s->rx, err, msg, kill, swi_now_ms(), &act);
    st_plan_tick(s);
    pthread_mutex_unlock(&s->mu);
    st_failed(s, err, set, &act);
}

void
swe_stream_tick(sw_stream *s, int64_t now, int64_t quiet)
{
    swe_rx_act act;
    int64_t up = swt_conn_up_since_ms(s->r->conn);
    pthread_mutex_lock(&s->mu);
    if (up < 0) {
        /* Our own connection is down: silence proves nothing (only the
         * deadline is judged). */
        quiet = INT64_MIN / 4;
    } else {
        /* It came back: silence counts from then, for gaps too. */
        swe_rx_silence_from(&s->rx, up);
    }
    swe_rx_tick(&s->rx, now, quiet, &act);
    st_unlock_apply(s, &act);
}

int
swe_stream_answered(sw_stream *s, const uint8_t *id, int known, uint64_t last_seq)
{
    swe_rx_act act;
    swe_rx_in in;
    int took;
    if (!st_lock_as(s, id)) /* (a migration moved it to a new request since) */
        return 0;
    took = known && s->rx.term_state == SWE_TERM_NONE && !s->rx.migrating;
    if (!known) {
        swe_rx_not_known(&s->rx);
        st_plan_tick(s);
        pthread_mutex_unlock(&s->mu);
        return 0;
    }
    /* as a heartbeat (it was fresh: the probe's id, answered once), but a
     * sign of life only: its last_seq is at most what arrived. The answer
     * comes on another subscription than the items it counts, so it may
     * be handled before them; and a worker from before 2026-12-07 answered
     * with the last seq it had numbered, sent or not (heartbeats say what
     * went out): items it could not send yet (a send wedged without memory)
     * opened a gap no resend repairs, and ended the stream sequence_gap
     * instead of by its silence (test_loss probe_answer_ahead_is_no_gap).
     * A lost item shows at the next heartbeat or the final. */
    swe_rx_beat_in(&in, last_seq < s->rx.expected ? last_seq : s->rx.expected - 1, 0);
    swe_rx_on_item(&s->rx, &in, swi_now_ms(), &act);
    __atomic_store_n(&s->last_rx_ms, s->rx.last_rx_ms, __ATOMIC_RELAXED); /* probe rounds */
    st_unlock_apply(s, &act);
    return took;
}

/* ---------------------------------------------------------------- delivery */

static void
st_delivered_terminal(sw_stream *s)
{
    swe_count_terminal(s->r, &s->rx.term);
    if (s->ep != NULL && s->rx.term.status >= 1 && s->rx.term.status <= 5)
        __atomic_fetch_add(&s->ep->terminals[s->rx.term.status], 1, __ATOMIC_RELAXED);
    swe_remove(s);
}

/* Pops into *out (s->mu held): 1 data, 2 terminal, 0 nothing. */
static int
st_pop(sw_stream *s, sw_item *out, swe_rx_act *act)
{
    /* one clock read per item: the pop's milliseconds and the timings' ns */
    int64_t now_ns = swi_now_ns();
    int got = swe_rx_pop(&s->rx, now_ns / 1000000, out, act);
    if (got != 0) {
        if (got == 1) {
            out->instance_id = swe_gen_instance(s, s->rx.cur->gen);
        } else {
            out->instance_id = swe_instance(s);
            out->terminal.instances = swe_instances(s);
        }
        if (got == 1)
            __atomic_fetch_add(&s->r->items, 1, __ATOMIC_RELAXED);
        if (!s->r->timing_off) {
            if (got == 1) {
                if (s->t_last_ns == 0 && s->ep != NULL)
                    swi_hist_observe_ns(&s->ep->ttfi, now_ns - s->t_open_ns);
                swi_hist_observe_ns(s->t_last_ns ? &s->r->h_inter : &s->r->h_ttfi,
                                    now_ns - (s->t_last_ns ? s->t_last_ns : s->t_open_ns));
                s->t_last_ns = now_ns;
            } else {
                swi_hist_observe_ns(&s->r->h_duration, now_ns - s->t_open_ns);
                if (s->ep != NULL)
                    swi_hist_observe_ns(&s->ep->duration, now_ns - s->t_open_ns);
            }
        }
    }
    st_plan_tick(s);
    return got;
}

void
swe_dispatch(sw_stream *s)
{
    if (s->on_item == NULL) {
        /* Blocking mode: wake a consumer only if one waits, and without the
         * lock (the waker would otherwise hand it a lock it still holds).
         * No wake-up is lost: the change that prompted this call was made
         * under s->mu, and a consumer counts itself in `waiters` under
         * s->mu before it waits, so either it saw the change or we see it. */
        if (__atomic_load_n(&s->waiters, __ATOMIC_ACQUIRE) > 0)
            pthread_cond_broadcast(&s->cv);
        if (s->has_ready) {
            void (*fn)(sw_stream *, void *);
            pthread_mutex_lock(&s->mu);
            if ((fn = s->on_ready) != NULL)
                s->in_ready++;
            pthread_mutex_unlock(&s->mu);
            if (fn != NULL) {
                fn(s, s->on_ready_arg);
                pthread_mutex_lock(&s->mu);
                if (--s->in_ready == 0)
                    pthread_cond_broadcast(&s->cv);
                pthread_mutex_unlock(&s->mu);
            }
        }
        return;
    }
#ifdef SW_CHAOS
    if (s->r->dispatch_hook != NULL) /* swx_router_on_dispatch */
        s->r->dispatch_hook(s, s->r->dispatch_hook_arg);
#endif
    swe_stream_ref(s);
    pthread_mutex_lock(&s->mu);
    if (s->dispatching || s->opening) {
        pthread_mutex_unlock(&s->mu);
        swe_stream_unref(s);
        return;
    }
    s->dispatching = 1;
    st_deliver_held(s);
    pthread_mutex_unlock(&s->mu);
    swe_stream_unref(s);
}

/* The callback consumer's next item, if one is ready: popped, handed to
 * the callback with s->mu released around it, and its grant sent after it.
 * Called with s->mu held and s->dispatching set; returns with s->mu held
 * again: 1 data, 2 the terminal, 0 nothing was ready. */
static int
st_deliver_one(sw_stream *s)
{
    swe_rx_act credit;
    sw_item item;
    int got;
    if (s->closed) /* sw_stream_close returned, or is about to */
        return 0;
    got = st_pop(s, &item, &credit);
    if (got == 0)
        return 0;
    s->in_cb = 1;
    s->cb_thread = pthread_self();
    if (credit.credit)
        __atomic_store_n(&s->grant_held, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&s->mu);
    if (got == 2)
        st_delivered_terminal(s);
    s->on_item(s, &item, s->on_item_arg);
    pthread_mutex_lock(&s->mu);
    if (credit.credit && s->rx.term_state == SWE_TERM_NONE) {
        /* The grant a data item earned goes out after its callback, not
         * before: the publish would delay that item by a socket write (at
         * 2,000 items/s, 14 of the 100 slowest items were those).
         * Meanwhile a repeat of it is held back too (swe_apply), and in_cb
         * stays set, so a close waits for it. None if the stream ended
         * meanwhile (the callback may have cancelled it). */
        pthread_mutex_unlock(&s->mu);
        swe_send_credit(s, &credit);
        pthread_mutex_lock(&s->mu);
    }
    __atomic_store_n(&s->grant_held, 0, __ATOMIC_RELEASE);
    s->in_cb = 0;
    pthread_cond_broadcast(&s->cv);
    return got;
}

/* The callback consumer's loop: everything ready, in order. Called with
 * s->mu held and s->dispatching just set by the caller, who holds a
 * reference; returns with s->mu held again and s->dispatching cleared. */
static void
st_deliver_held(sw_stream *s)
{
    while (st_deliver_one(s) != 0)
        ;
    s->dispatching = 0;
}

sw_err
sw_stream_next(sw_stream *s, const sw_item **item, int64_t timeout_ms)
{
    int64_t until = INT64_MIN; /* read the clock only if nothing is there */
    swe_rx_act credit;
    int got = 0;

    if (s == NULL || item == NULL)
        return SW_EINVAL;
    *item = NULL;
    if (s->on_item != NULL)
        return SW_EBUSY;
    pthread_mutex_lock(&s->mu);
    if (s->cur == NULL && (s->cur = calloc(1, sizeof(*s->cur))) == NULL) {
        pthread_mutex_unlock(&s->mu);
        return SW_ENOMEM; /* the stream is unchanged: a later call may succeed */
    }
    for (;;) {
        int64_t wake = until;
        if (swe_rx_done(&s->rx) && s->rx.qh == NULL) {
            pthread_mutex_unlock(&s->mu);
            return SW_EEOF;
        }
        if ((got = st_pop(s, s->cur, &credit)) != 0)
            break;
        if (timeout_ms == 0) { /* a poll */
            pthread_mutex_unlock(&s->mu);
            return SW_ETIMEDOUT;
        }
        if (until == INT64_MIN)
            until = wake = timeout_ms < 0 ? -1 : swi_now_ms() + timeout_ms;
        if (s->rx.term_state == SWE_TERM_QUEUED && s->rx.term_ready_ms != SWE_TERM_WOKEN &&
            (wake < 0 || s->rx.term_ready_ms < wake))
            wake = s->rx.term_ready_ms;
        if (until >= 0 && swi_now_ms() >= until) {
            pthread_mutex_unlock(&s->mu);
            return SW_ETIMEDOUT;
        }
        __atomic_add_fetch(&s->waiters, 1, __ATOMIC_RELEASE);
        swi_cond_wait_until(&s->cv, &s->mu, wake);
        __atomic_sub_fetch(&s->waiters, 1, __ATOMIC_RELEASE);
    }
    *item = s->cur;
    pthread_mutex_unlock(&s->mu);
    if (credit.credit)
        swe_send_credit(s, &credit);
    if (got == 2)
        st_delivered_terminal(s);
    return SW_OK;
}

/* ---------------------------------------------------------------- cancel, close */

/* Waits for an item callback of s running on another thread to return (s->mu
 * held; one on this thread, which called us from it, is not waited for). */
static void
st_wait_callback(sw_stream *s)
{
    while (s->in_cb && !pthread_equal(s->cb_thread, pthread_self()))
        pthread_cond_wait(&s->cv, &s->mu);
}

static sw_err
st_cancel(sw_stream *s, int kill)
{
    int set;
    if (s == NULL)
        return SW_EINVAL;
    pthread_mutex_lock(&s->mu);
    set = swe_rx_cancel(&s->rx, kill);
    st_plan_tick(s);
    /* A data callback already under way on another thread finishes before
     * we return: after this call, no data item reaches the consumer. */
    st_wait_callback(s);
    pthread_mutex_unlock(&s->mu);
    if (!set)
        return SW_EEOF;
    if (set == 2) {
        swe_dispatch(s); /* (CANCELLED replaced a terminal queued behind data) */
        return SW_OK;
    }
    swe_remove(s);
    swe_send_control(s, SWE_GEN_ANY,
                     kill ? STREAMWIRE__V1__CONTROL_KIND__CONTROL_KILL
                          : STREAMWIRE__V1__CONTROL_KIND__CONTROL_CANCEL,
                     0, 0, 0, 0);
    swe_cancel_wait(s, kill); /* sent again if the worker does not answer */
    swe_dispatch(s);
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
    if (s->has_ready) {
        /* No on_ready call after close returns (its argument may be freed). */
        pthread_mutex_lock(&s->mu);
        s->on_ready = NULL;
        while (s->in_ready > 0)
            pthread_cond_wait(&s->cv, &s->mu);
        pthread_mutex_unlock(&s->mu);
    }
    (void)st_cancel(s, 0);
    if (s->on_item != NULL) {
        /* No item callback after close returns (its argument may be
         * freed): another thread may have decided the terminal (or an
         * item) before the cancel and not delivered it yet; it delivers
         * nothing now. One under way on another thread finishes first. */
        pthread_mutex_lock(&s->mu);
        s->closed = 1;
        st_wait_callback(s);
        pthread_mutex_unlock(&s->mu);
    }
    swe_remove(s);
    swe_stream_unref(s);
}

const char *
sw_stream_request_id(const sw_stream *s)
{
    return s ? s->idhex : "";
}

const char *
sw_stream_instance_id(const sw_stream *s)
{
    return s ? swe_instance(s) : "";
}

int
swe_stream_queued_failure(sw_stream *s, sw_terminal *t, char *reason, size_t reason_cap,
                          char *message, size_t message_cap)
{
    int r = 0;
    pthread_mutex_lock(&s->mu);
    /* decided, not delivered, past final_linger_ms (what sw_stream_next would hand out,
     * once the items before it are taken) */
    if (s->rx.term_state == SWE_TERM_QUEUED && swi_now_ms() >= s->rx.term_ready_ms &&
        s->rx.term.status != SW_STATUS_COMPLETED && s->rx.term.status != SW_STATUS_INCOMPLETE) {
        *t = s->rx.term;
        t->migrations = (unsigned)s->rx.st.migrations;
        t->instances = swe_instances(s);
        swi_textlcpy(reason, s->rx.term.reason ? s->rx.term.reason : "", reason_cap);
        swi_textlcpy(message, s->rx.term.message ? s->rx.term.message : "", message_cap);
        t->reason = reason;
        t->message = message;
        r = s->rx.qh == NULL ? 1 : 2;
    }
    pthread_mutex_unlock(&s->mu);
    return r;
}

void
sw_stream_stats_get(sw_stream *s, sw_stream_stats *out)
{
    if (s == NULL || out == NULL)
        return;
    pthread_mutex_lock(&s->mu);
    memset(out, 0, sizeof(*out));
    out->items = s->rx.st.items;
    out->duplicates = s->rx.st.duplicates;
    out->reordered = s->rx.st.reordered;
    out->resend_requests = s->rx.st.resend_requests;
    out->heartbeats = s->rx.st.heartbeats;
    out->peak_pending = s->rx.st.peak_pending;
    out->migrations = s->rx.st.migrations;
    out->pending = s->rx.qlen;
    out->window = s->rx.window;
    out->window_bytes = s->rx.bytes_on ? s->rx.wbytes : 0;
    pthread_mutex_unlock(&s->mu);
}
