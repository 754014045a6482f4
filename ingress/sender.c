/* ingress/sender.c -- getting items on the wire: keeping bodies in the
 * ring, publishing (with the ingress's counters), the drain of queued items,
 * and the coalescing sender thread.
 *
 * A stream whose last publish ended less than coalesce_us ago hands its
 * items to the sender thread, which puts every item queued meanwhile into
 * one message; a stream that was quiet publishes inline. With coalescing on
 * and a connection without send-asap, every stream hands its items over. A
 * producer that ends its stream publishes what is queued with the final
 * itself (swn_resp_send_final). A handler that runs inline keeps its items
 * back while it sends them fast (on a send-asap connection only while its
 * stream is quiet: a burst), and publishes them itself (swn_resp_kick,
 * swn_resp_inline_end).
 *
 * Threads: producers (handler threads, or whoever holds a retained
 * responder), the sender thread, the timer (deadlines, memory-stranded
 * and held items), the control subscription's thread (a cancel's final), a thread
 * in sw_ingress_drain/destroy (hand-backs).
 * Locks: r->mu held by the callers (the drain drops it around each publish);
 * ing->smu (the sender queue) taken under r->mu; ing->mu (counters) taken
 * under r->mu. See ingress_int.h. */
#include <stdlib.h>
#include <string.h>

#include "ingress/ingress_int.h"

#ifdef SW_CHAOS
/* Chaos build only: the test loss injection (swx_ingress_set_drop_rate)
 * drops this first publish. */
static int
resp_should_drop(sw_ingress *ing)
{
    uint32_t v;
    if (ing->drop_rate <= 0.0)
        return 0;
    swi_random(&v, sizeof(v));
    return (double)v / 4294967296.0 < ing->drop_rate;
}
#endif

/* Adds (sign 1) or takes back (sign -1) a publish's counts. */
static void
ing_count(sw_ingress *ing, const swn_sent *d, int sign)
{
    pthread_mutex_lock(&ing->mu);
    ing->st.items_sent += (uint64_t)(sign * d->items);
    ing->st.messages_sent += (uint64_t)(sign * d->msgs);
    ing->st.items_resent += (uint64_t)(sign * d->resent);
    ing->st.heartbeats += (uint64_t)(sign * d->beats);
    pthread_mutex_unlock(&ing->mu);
}

/* Publishes on subj. The counts go in before the bytes leave, so a peer
 * that has received them finds them counted, and come out again if the
 * publish fails. */
sw_err
swn_ing_publish_counted(sw_ingress *ing, const char *subj, const void *buf, size_t len,
                        const swn_sent *d)
{
    sw_err rv;
    ing_count(ing, d, 1);
    if ((rv = swt_publish(ing->conn, subj, NULL, buf, len)) != SW_OK)
        ing_count(ing, d, -1);
    return rv;
}

/* Publishes a packed wrapper on r's response subject (r->mu held). */
sw_err
swn_resp_publish(sw_responder *r, const uint8_t *buf, size_t len, const swn_sent *d)
{
    sw_err rv = swn_ing_publish_counted(r->ing, r->resp_subj, buf, len, d);
    if (rv == SW_OK)
        r->last_pub_ms = swi_now_ms();
    return rv;
}

/* The chaos build's loss injection: 1 if the item about to be kept is to
 * be left out of its first publish (r->mu held). Always 0 otherwise. */
static int
resp_lose_next(sw_responder *r)
{
#ifdef SW_CHAOS
    int lose = r->lose_next || resp_should_drop(r->ing);
    r->lose_next = 0;
    return lose;
#else
    (void)r;
    return 0;
#endif
}

void
swn_resp_commit(sw_responder *r, uint64_t seq, size_t len)
{
    swn_ring_commit(&r->rg, seq, len, resp_lose_next(r));
}

sw_err
swn_resp_keep(sw_responder *r, uint64_t seq, const uint8_t *buf, size_t len)
{
    uint8_t *p = swn_ring_room(&r->rg, seq, len);
    if (p == NULL)
        return SW_ENOMEM;
    memcpy(p, buf, len);
    swn_resp_commit(r, seq, len);
    return SW_OK;
}

/* Publishes header + one body at once, for a stream without flow control
 * (no ring: nothing is kept, nothing is queued) and the chaos hooks (r->mu
 * held). */
sw_err
swn_resp_publish_one(sw_responder *r, uint64_t seq, const uint8_t *body, size_t blen,
                     const swn_sent *d)
{
    swn_msgbuf m;
    swp_hdr h;
    size_t n;
    sw_err rv;
    swn_msgbuf_init(&m);
    if (swn_msgbuf_fit(&m, SWP_HDR_MAX + blen) != 0)
        return SW_ENOMEM;
    swn_resp_hdr(r, seq, seq, 0, &h);
    n = swp_hdr_write(&h, m.p);
    memcpy(m.p + n, body, blen);
#ifdef SW_CHAOS
    if (resp_should_drop(r->ing)) { /* test-only loss: counted as sent, never published */
        ing_count(r->ing, d, 1);
        rv = SW_OK;
    } else
#endif
        rv = swn_resp_publish(r, m.p, n + blen, d);
    swn_msgbuf_free(&m);
    return rv;
}

/* Publishes the queued items pub_seq+1 .. next_seq-1 in order, as few
 * messages as they fit in (r->mu held, r->sending set by the caller; mu is
 * dropped while publishing, so the producer can queue more meanwhile, and
 * they are taken too). A failed publish leaves the items kept: the
 * frontend's gap repair asks for them again. */
static void
resp_drain(sw_responder *r)
{
    swn_msgbuf m;
    if (!swn_ring_keeps(&r->rg))
        return; /* without flow control nothing is ever queued */
    swn_msgbuf_init(&m);
    while (!r->closed && r->rg.pub_seq + 1 < r->rg.next_seq &&
           !(r->terminated && r->final_seq == 0)) {
        uint64_t last;
        unsigned k, kd;
        size_t len =
            swn_resp_build(r, r->rg.pub_seq + 1, r->rg.next_seq - 1, 0, &m, &last, &k, &kd);
        if (last < r->rg.pub_seq + 1) {
            r->stranded = 1;
            swn_resp_tick_soon(r); /* no memory for the message: the timer tries again */
            break;
        }
        if (k > 0) {
            swn_sent d = {kd, 1, 0, 0};
            sw_err rv;
            if (last > r->rg.built)
                r->rg.built = last; /* copied: an ack for them may free the bodies */
            pthread_mutex_unlock(&r->mu);
            rv = swn_ing_publish_counted(r->ing, r->resp_subj, m.p, len, &d);
            pthread_mutex_lock(&r->mu);
            if (rv == SW_OK)
                r->last_pub_ms = swi_now_ms();
            else
                r->pub_err = rv;
        }
        r->rg.pub_seq = last;
        swn_resp_beat_sooner(r); /* the next beat reports them after hb_ms, not idle_hb_ms */
        r->last_end_us = swi_now_us();
        if (r->final_seq != 0 && r->rg.pub_seq >= r->final_seq)
            swn_resp_uncount(r);
    }
    swn_msgbuf_free(&m);
}

/* The error of a failed publish of queued items, reported once (r->mu
 * held). */
sw_err
swn_resp_take_pub_err(sw_responder *r)
{
    sw_err rv = r->pub_err;
    r->pub_err = SW_OK;
    return rv;
}

/* Publishes r's queued items as the one thread doing so (r->mu held, r->sending
 * clear); waiters on r->cv (sw_ingress_destroy, swn_resp_flush_now) learn when
 * it is done. */
void
swn_resp_run_drain(sw_responder *r)
{
    r->sending = 1;
    r->stranded = 0;
    r->held = 0;
    resp_drain(r);
    r->sending = 0;
    pthread_cond_broadcast(&r->cv);
}

/* Hands stream r to the sender thread. 0 if the sender is not running. */
static int
ing_defer(sw_ingress *ing, sw_responder *r)
{
    int ok;
    pthread_mutex_lock(&ing->smu);
    ok = ing->sender_on;
    if (ok && !r->in_sendq) {
#ifdef SW_CHAOS
        __atomic_fetch_add(&ing->handoffs, 1, __ATOMIC_RELAXED);
#endif
        r->in_sendq = 1;
        swn_resp_ref(r);
        r->snext = NULL;
        if (ing->sq_tail != NULL)
            ing->sq_tail->snext = r;
        else
            ing->sq_head = r;
        ing->sq_tail = r;
        if (ing->sender_idle)
            pthread_cond_signal(&ing->scv);
    }
    pthread_mutex_unlock(&ing->smu);
    return ok;
}

/* The responder whose handler runs inline on this thread, when that
 * handler last sent (or began), and when the items it holds began to wait:
 * see swn_resp_kick. */
static _Thread_local sw_responder *tl_inline_r;
static _Thread_local int64_t tl_inline_last_us;
static _Thread_local int64_t tl_hold_since_us;
static _Thread_local int64_t tl_hold_us; /* ing->hold_us (a chaos hook may set it) */

void
swn_resp_inline_begin(sw_responder *r)
{
    if ((tl_hold_us = __atomic_load_n(&r->ing->hold_us, __ATOMIC_RELAXED)) > 0) {
        tl_inline_r = r;
        tl_inline_last_us = swi_now_us();
    }
}

void
swn_resp_inline_end(sw_responder *r)
{
    if (tl_inline_r != r)
        return;
    tl_inline_r = NULL;
    pthread_mutex_lock(&r->mu);
    swn_resp_release_held(r);
    pthread_mutex_unlock(&r->mu);
}

int
swn_resp_release_held(sw_responder *r)
{
    if (!r->held || r->sending)
        return 0;
    swn_resp_run_drain(r); /* clears held; it may drop mu while publishing */
    return 1;
}

/* 1 if r's queued items are to wait for the inline handler's next one
 * (r->mu held, called on the handler's thread at time now): it sent again
 * within the hold window (ing->hold_us) of its previous send or its start,
 * what waits began to wait less than that window ago, and it is less than
 * a message's worth. The first held item asks the timer to look at r at its
 * next tick, which publishes them if they still wait (a handler that blocks
 * after a send). */
static int
resp_hold(sw_responder *r, int64_t now)
{
    int64_t w = tl_hold_us;
    int hot = now - tl_inline_last_us < w;
    tl_inline_last_us = now;
    if (!hot || r->terminated || r->rg.next_seq - r->rg.pub_seq > SWN_BATCH_ITEMS ||
        (r->held &&
         (now - tl_hold_since_us >= w || r->sent_bytes - r->held_bytes >= r->ing->batch_bytes)))
        return 0;
    if (!r->held) {
        r->held = 1;
        r->held_bytes = r->sent_bytes;
        tl_hold_since_us = now;
        swn_resp_tick_soon(r);
    }
    return 1;
}

/* Gets queued items of r on their way (r->mu held). If another thread is
 * publishing r's items it takes these too. If r published a moment ago
 * (a fast producer), the sender thread publishes them, so that this thread
 * goes on producing and what it queues meanwhile shares messages. Otherwise
 * (a quiet stream: lowest latency) this thread publishes them now. On a
 * connection without send-asap every stream hands its items over: nats.c
 * holds the bytes for its flusher (up to 1 ms) anyway, so publishing at
 * once gains nothing and a stream's first item would travel alone.
 *
 * An inline handler's items instead wait for its next ones while it sends
 * them fast (resp_hold), and it publishes them itself when the run ends: a
 * short stream is then one message, and no thread is woken for it. On a
 * send-asap connection only a quiet stream's items are held (a burst); once
 * the stream has published, its items go the usual way, the sender thread
 * while it publishes less than coalesce_us apart. A stream that publishes
 * never holds items then, so held implies quiet. */
void
swn_resp_kick(sw_responder *r)
{
    sw_ingress *ing = r->ing;
    int inl = tl_inline_r == r, hot;
    int64_t now = 0;
    if (r->sending || r->rg.pub_seq + 1 >= r->rg.next_seq) {
        if (inl)
            tl_inline_last_us = swi_now_us(); /* a send all the same: the run goes on */
        return;
    }
    if (inl || (ing->hot_us > 0 && !ing->buffered))
        now = swi_now_us(); /* read once, only where it is needed */
    /* To the sender thread: every stream on a buffered connection, one that
     * published a moment ago with send-asap. */
    hot = ing->hot_us > 0 && (ing->buffered || now - r->last_end_us < ing->hot_us);
    if (inl) {
        if (ing->buffered || !hot) {
            if (!resp_hold(r, now))
                swn_resp_run_drain(r);
            return;
        }
        tl_inline_last_us = now; /* send-asap and hot: the usual way */
    }
    if (hot && ing_defer(ing, r))
        return;
    swn_resp_run_drain(r);
}

/* Publishes every queued item of r before returning (r->mu held; waits
 * for another thread that is publishing them). For the chaos hooks, whose
 * bytes must follow what was sent before them, and a final that cannot be
 * kept. Returns early, with items still queued (stranded: the timer tries
 * again), when a drain of its own publishes nothing: no memory for the
 * message. It used to try again at once, for as long as malloc failed,
 * holding r->mu. */
void
swn_resp_flush_now(sw_responder *r)
{
    while (swn_ring_keeps(&r->rg) && !r->closed && r->rg.pub_seq + 1 < r->rg.next_seq) {
        if (!r->sending) {
            uint64_t before = r->rg.pub_seq;
            swn_resp_run_drain(r);
            if (r->rg.pub_seq == before)
                return;
        } else {
            (void)swi_cond_wait_until(&r->cv, &r->mu, swi_now_ms() + 100);
        }
    }
}

#ifdef SW_CHAOS
#define SENDER_HELD(ing) ((ing)->sender_hold)
#else
#define SENDER_HELD(ing) 0
#endif

void *
swn_ing_sender_main(void *arg)
{
    sw_ingress *ing = arg;
    pthread_mutex_lock(&ing->smu);
    for (;;) {
        sw_responder *r;
        while ((ing->sq_head == NULL || SENDER_HELD(ing)) && !ing->sender_stop) {
            ing->sender_idle = 1;
            pthread_cond_wait(&ing->scv, &ing->smu);
            ing->sender_idle = 0;
        }
        if ((r = ing->sq_head) == NULL)
            break; /* stopping, and nothing left */
        ing->sq_head = r->snext;
        if (ing->sq_head == NULL)
            ing->sq_tail = NULL;
        r->in_sendq = 0;
        pthread_mutex_unlock(&ing->smu);
        pthread_mutex_lock(&r->mu);
        if (!r->sending)
            swn_resp_run_drain(r);
        pthread_mutex_unlock(&r->mu);
        swn_resp_unref(r);
        pthread_mutex_lock(&ing->smu);
    }
    ing->sender_on = 0;
    pthread_mutex_unlock(&ing->smu);
    return NULL;
}
