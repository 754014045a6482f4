/* ingress/terminal.c -- the end of a stream: finals (completed, failed,
 * cancelled), marking a stream terminated, the inflight count, firing the
 * cancel callback, and taking a stream out of the table.
 *
 * Threads: handler threads, control callbacks, the timer, drain/destroy.
 * Locks: the callers of swn_resp_uncount, _mark_terminated, _send_final and
 * _send_failed hold r->mu; ing->mu is taken under it (counters, and the
 * table when a stream without a window is unregistered at its final).
 * swn_unregister_stream takes ing->mu, with or without r->mu held;
 * swn_resp_fire_cancel takes r->mu itself and calls the cancel callback
 * with no lock held. */
#include <stdlib.h>

#include "ingress/ingress_int.h"

/* Takes registered r out of the stream table and the timer's (ing->mu
 * held). After ing->mu is released, resp_untabled finishes the job. */
static void
resp_untable(sw_ingress *ing, sw_responder *r)
{
    r->registered = 0;
    swi_idmap_del(&ing->streams, r->id);
    swi_duetab_detach(&ing->due, r->next_tick);
}

/* After resp_untable, no lock but maybe r->mu held: its frontend is probed
 * for one stream less, and the table's reference goes (the caller holds
 * one of its own, or the table's was the last use). */
static void
resp_untabled(sw_ingress *ing, sw_responder *r)
{
    swn_ing_live_forget(ing, r);
    swn_resp_unref(r);
}

/* Bookkeeping once nothing more will be sent (r->mu held). */
void
swn_resp_uncount(sw_responder *r)
{
    sw_ingress *ing = r->ing;
    sw_responder *evict = NULL;
    int counted = r->counted;
    r->counted = 0;
    if (counted) {
        pthread_mutex_lock(&ing->mu);
        ing->inflight--;
        ing->st.inflight = ing->inflight;
        /* Only sw_ingress_drain waits for this (set under ing->mu before it
         * waits); the idle handler threads wait on ing->cv and must not be
         * woken by every stream's end. */
        if (ing->draining)
            pthread_cond_broadcast(&ing->dcv);
        if (r->registered && !r->in_fin && r->final_seq != 0 && swn_ring_keeps(&r->rg)) {
            /* Finished, and held for its ack: at most max_held of those; the
             * oldest goes first (issue 11 #4: peers that never ack held
             * state without bound). Only a stream whose final went out
             * with flow control waits for an ack: a killed one (no final)
             * or one without flow control leaves the table right after
             * this, and must not push out another's held final meanwhile
             * (session 33). */
            r->in_fin = 1;
            r->fin_prev = ing->fin_tail;
            r->fin_next = NULL;
            if (ing->fin_tail)
                ing->fin_tail->fin_next = r;
            else
                ing->fin_head = r;
            ing->fin_tail = r;
            if (++ing->nfin > ing->max_held && ing->fin_head != r) {
                evict = ing->fin_head;
                swn_fin_unlink(ing, evict);
                resp_untable(ing, evict);
                ing->st.finals_dropped++;
            }
        }
        pthread_mutex_unlock(&ing->mu);
    }
    if (evict != NULL)
        resp_untabled(ing, evict);
}

/* Takes r off the list of finished streams held for an ack (ing->mu). */
void
swn_fin_unlink(sw_ingress *ing, sw_responder *r)
{
    if (!r->in_fin)
        return;
    r->in_fin = 0;
    if (r->fin_prev)
        r->fin_prev->fin_next = r->fin_next;
    else
        ing->fin_head = r->fin_next;
    if (r->fin_next)
        r->fin_next->fin_prev = r->fin_prev;
    else
        ing->fin_tail = r->fin_prev;
    r->fin_prev = r->fin_next = NULL;
    ing->nfin--;
}

/* Nothing more will be queued (r->mu held). The stream stops counting in
 * the ingress's inflight (which sw_ingress_drain waits for) once its final
 * is on the wire, or now if there is no final to publish. */
void
swn_resp_mark_terminated(sw_responder *r)
{
    swn_resp_tick_soon(r);
    r->terminated = 1;
    r->done_ms = swi_now_ms();
    pthread_cond_broadcast(&r->cv);
    if (r->final_seq == 0 || r->rg.pub_seq >= r->final_seq)
        swn_resp_uncount(r);
}

/* Encodes a final's body (seq, complete_final, terminal) of at most max
 * bytes: into stack (SWN_FINAL_STACK bytes) when it fits, else into a
 * malloc'd *buf. Every final the library makes itself (cancelled,
 * deadline, hand-back, handler_returned) fits the stack, and so do most of
 * the application's: ending a stream needs no memory, or a stream that
 * could not get its final for lack of it would stay open and counted, its
 * heartbeats keeping its frontend waiting (test_oom). A terminal whose
 * message is too long for the bus, or for the memory left unless the
 * caller may try again (may_retry), goes without its message. */
static sw_err
resp_final_body(uint64_t seq, const swp_terminal *t, size_t max, int may_retry, uint8_t *stack,
                uint8_t **buf, size_t *len)
{
    swp_terminal t2;
    swp_error e2;
    sw_err rv = swp_final_body(seq, t, max, stack, SWN_FINAL_STACK, buf, len);
    if (rv == SW_OK)
        return SW_OK;
    *buf = stack;
    if ((rv == SW_ENOMEM && may_retry) || t->error == NULL || t->error->message == NULL ||
        t->error->message[0] == '\0')
        return rv;
    t2 = *t;
    e2 = *t->error;
    e2.message = (char *)"";
    t2.error = &e2;
    /* (fits the stack: a reason of at most 256 bytes, sw_responder_finish;
     * a code of at most 64, swi_valid_code) */
    return swp_final_body(seq, &t2, max, stack, SWN_FINAL_STACK, buf, len);
}

/* Sends the final wrapper (r->mu held, not terminated). */
sw_err
swn_resp_send_final(sw_responder *r, const swp_terminal *t, sw_status counted_as, int by)
{
    sw_ingress *ing = r->ing;
    uint8_t stack[SWN_FINAL_STACK], *buf = stack;
    size_t len = 0;
    uint64_t seq = r->rg.next_seq;
    size_t max = swn_resp_max_body(r);
    int kept, nokeep = 0;
    sw_err rv;

    if (r->closed)
        return SW_ECLOSED;
    rv = resp_final_body(seq, t, max, (by & SWN_MAY_RETRY) != 0, stack, &buf, &len);
    if (rv != SW_OK)
        return rv;
#ifdef SW_CHAOS
    nokeep = r->fail_final_keep; /* swx_responder_fail_final_keep: as if no memory */
    r->fail_final_keep = 0;
#endif
    kept = swn_ring_keeps(&r->rg) && !nokeep && swn_resp_keep(r, seq, buf, len) == SW_OK;
    r->final_seq = seq;
    if (swn_ring_keeps(&r->rg) && !kept) {
        /* No room to keep it: the stream still ends, after what was
         * queued before it. The flush may drop mu (while it publishes):
         * the stream counts as ended from now, so that no send takes the
         * final's number and no cancel, deadline or hand-back sends a
         * final of its own meanwhile (final_seq set: the flush goes on). */
        r->terminated = 1;
        swn_resp_flush_now(r);
    }
    r->rg.next_seq++;
    if (!kept) { /* published now, not kept (without flow control nothing is) */
        swn_sent d = {0, 1, 0, 0};
        rv = r->closed ? SW_ECLOSED : swn_resp_publish_one(r, seq, buf, len, &d);
        if (rv == SW_ENOMEM && (by & SWN_MAY_RETRY)) {
            /* A final too long for the stack, with no memory to keep it
             * or to build or seal its message: nothing went out, and the
             * caller may try again (sw_responder_fail). Every final of
             * the library's own fits the stack, and its publish needs no
             * memory. */
            r->rg.next_seq--;
            r->final_seq = 0;
            r->terminated = 0; /* (nothing could start meanwhile: see above) */
            if (buf != stack)
                free(buf);
            return rv;
        }
        r->rg.pub_seq = seq;
    }
    if (buf != stack)
        free(buf); /* kept: the ring has its copy */
    swn_resp_mark_terminated(r);
    /* Last: it may drop mu while publishing. With nothing more to come the
     * producer has nothing to coalesce with: it publishes now rather than
     * hand the stream to the sender thread. */
    if (kept && (by & SWN_BY_PRODUCER) && !r->sending)
        swn_resp_run_drain(r);
    else if (kept)
        swn_resp_kick(r);
    if (kept && r->pub_err != SW_OK) {
        /* The final is kept, and resent if asked for; so are the items
         * whose publish failed. A failed publish, an earlier send's or
         * this call's own (of the final and the items queued before it),
         * is told now, and only if it was NATS's: one for lack of memory
         * (sealing a message of more than about 2 KB, transport/sub.c)
         * would read as "nothing sent, try again" (sw_responder_fail) from
         * a call that ended the stream, and finish promises no SW_ENOMEM
         * at all. Nothing else would tell it: the stream is over. */
        rv = swn_resp_take_pub_err(r);
        if (!sw_err_is_nats(rv))
            rv = SW_OK;
    }
    pthread_mutex_lock(&ing->mu);
    ing->st.finished[counted_as]++;
    pthread_mutex_unlock(&ing->mu);
    if (r->window == 0)
        swn_unregister_stream(r); /* nothing to resend, no ack will come */
    return rv;
}

/* Fills a FAILED terminal: a streamwire code (sw_code != SW_OK) or an
 * application code token. */
void
swn_term_failed(swp_terminal *t, swp_error *e, sw_err sw_code, const char *app_code,
                const char *message)
{
    t->status = STREAMWIRE__V1__STATUS__STATUS_FAILED;
    e->sw_code = (uint32_t)sw_code;
    if (app_code != NULL)
        e->app_code = (char *)app_code;
    e->message = (char *)(message ? message : sw_code != SW_OK ? sw_strerror(sw_code) : "");
    t->error = e;
}

/* Sends a FAILED final (r->mu held, not terminated). */
sw_err
swn_resp_send_failed(sw_responder *r, sw_err sw_code, const char *app_code, const char *message,
                     int by)
{
    swp_terminal t = STREAMWIRE__V1__TERMINAL__INIT;
    swp_error e = STREAMWIRE__V1__ERROR__INIT;
    swn_term_failed(&t, &e, sw_code, app_code, message);
    return swn_resp_send_final(r, &t, sw_code != SW_OK ? SW_STATUS_ERROR : SW_STATUS_FAILED, by);
}

/* Fires the cancel callback once, with no lock held. */
void
swn_resp_fire_cancel(sw_responder *r)
{
    sw_cancel_fn fn = NULL;
    void *arg = NULL;
    pthread_mutex_lock(&r->mu);
    if (r->cancelled && !r->cancel_fired && r->cancel_fn != NULL) {
        r->cancel_fired = 1;
        fn = r->cancel_fn;
        arg = r->cancel_arg;
    }
    pthread_mutex_unlock(&r->mu);
    if (fn != NULL)
        fn(r, arg);
}

void
swn_unregister_stream(sw_responder *r)
{
    sw_ingress *ing = r->ing;
    int drop = 0;
    pthread_mutex_lock(&ing->mu);
    if (r->registered) {
        resp_untable(ing, r);
        drop = 1;
    }
    swn_fin_unlink(ing, r);
    pthread_mutex_unlock(&ing->mu);
    /* Every caller holds a reference of its own (user hold, control or timer
     * transient), so dropping the table's cannot free r under its lock. */
    if (drop)
        resp_untabled(ing, r);
}
