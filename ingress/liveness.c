/* ingress/liveness.c -- frontend liveness: probing every frontend that has
 * a live stream here, and cancelling the streams of one that is gone.
 *
 * The frontends are a peer table (common/sched.h, the same as the router's
 * table of instances), probed from the shared ticker.
 *
 * Threads: the liveness ticker (swn_ing_live_tick), the probe-answer
 * subscription's nats.c thread (swn_ing_on_live_reply) and the timer
 * (swn_ing_cancel_frontend for every stream once the connection is closed
 * for good). Locks: ing->live_mu
 * guards the peer table, alone (probes are published and streams cancelled
 * after it is released); ing->mu only for snapshots; r->mu per stream when
 * cancelling. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sched.h"
#include "ingress/ingress_int.h"

/* Core NATS cannot tell a publisher that nobody listens any more, so the
 * worker asks: every probe_ms it sends a request to each frontend that has a
 * live stream here (sw.rtr.<router>). A dead process has no subscription,
 * and the server answers "no responders" at once; a frozen one times out. */

void
swn_ing_cancel_frontend(sw_ingress *ing, const char *router_id, const char *why)
{
    swi_ptrvec vec = {NULL, 0, 0};
    unsigned n = 0;
    swn_ing_snapshot(ing, &vec, NULL);
    for (size_t i = 0; i < vec.n; i++) {
        sw_responder *r = SWN_RESP_AT(vec, i);
        if (router_id == NULL || strcmp(r->router_id, router_id) == 0) {
            int finished;
            pthread_mutex_lock(&r->mu);
            finished = r->terminated;
            pthread_mutex_unlock(&r->mu);
            if (!finished && !sw_responder_cancelled(r)) {
                swn_resp_cancel(r, 1);
                n++;
            } else if (finished) {
                /* A final waiting for an ack that will never come. */
                swn_unregister_stream(r);
            }
        }
        swn_resp_unref(r);
    }
    free(vec.v);
    if (router_id == NULL) {
        if (n > 0)
            swi_log(&ing->log, SW_LOG_WARN, "%s: cancelled %u stream(s)", why, n);
        return;
    }
    if (n == 0) {
        swi_log(&ing->log, SW_LOG_DEBUG, "frontend %s %s; no stream of it was running", router_id,
                why);
        return;
    }
    pthread_mutex_lock(&ing->mu);
    ing->st.frontends_lost++;
    pthread_mutex_unlock(&ing->mu);
    swi_log(&ing->log, SW_LOG_WARN, "frontend %s %s: cancelled %u stream(s)", router_id, why, n);
}

/* A frontend answered a probe, or the server said nobody is there (which
 * proves it gone only if our own connection was up and settled when the
 * probe went out: common/sched.h's peer table decides). */
void
swn_ing_on_live_reply(const swt_msg *msg, void *arg)
{
    sw_ingress *ing = arg;
    const char *id = swt_subject_last_token(msg->subject);
    swi_peer_id gone = "";
    int64_t silent = 0;
    uint64_t pid;
    if (id == NULL)
        return;
    if (msg->auth_failed) { /* not the frontend's answer: no sign of life */
        pthread_mutex_lock(&ing->mu);
        ing->st.auth_failures++;
        pthread_mutex_unlock(&ing->mu);
        return;
    }
    if (msg->no_responders && sw_conn_sealed(ing->conn))
        return; /* unsealed, forgeable: a sealed cluster judges by probe timeouts alone */
    /* an answer counts only if it echoes the last probe's id */
    pid = msg->no_responders ? 0 : swp_probe_reply_id(msg->data, msg->len);
    pthread_mutex_lock(&ing->live_mu);
    if ((msg->no_responders || swi_peers_is_current(&ing->peers, id, pid)) &&
        swi_peers_answer(&ing->peers, id, msg->no_responders, swi_now_ms(),
                         swt_conn_up_since_ms(ing->conn), &silent, NULL)) {
        snprintf(gone, sizeof(gone), "%s", id);
        swi_peers_release_all(&ing->peers, id);
    }
    pthread_mutex_unlock(&ing->live_mu);
    if (gone[0] != '\0')
        swn_ing_cancel_frontend(ing, gone, "is gone (no responders)");
}

#define SWN_PROBES_MAX 256 /* probes per round; the rest next round */

/* Each registered stream counts once in its frontend's entry (users), from
 * swn_ing_live_note to swn_ing_live_forget, so that a frontend leaves the
 * table (is no longer probed) as its last stream here is unregistered,
 * with no walk over the streams (issue 17: a recount every 2 s cost 0.12 %
 * of a core at 10,000 idle streams). The entry's generation is kept with
 * the count: a frontend lost (its entry removed whatever its count) and
 * then noted again by a new stream has a new entry, which the old streams,
 * unregistered later, do not count down. Either call may come first (a
 * stream may finish before the intake notes it): the state goes 0 -> 1 ->
 * 2, or 0 -> 2, under live_mu. */
void
swn_ing_live_note(sw_ingress *ing, sw_responder *r)
{
    pthread_mutex_lock(&ing->live_mu);
    if (r->live_state == 0) {
        swi_peer *e;
        /* No memory for a new frontend's entry: this stream is not counted
         * and its frontend not probed for it (its own heartbeats and the
         * frontend's silence limit still end it); a later stream's note
         * tries again. */
        r->live_state = 2;
        if (swi_peers_use(&ing->peers, r->router_id,
                          swi_now_ms() - (int64_t)ing->peers.interval_ms) == 0 &&
            (e = swi_peers_find(&ing->peers, r->router_id)) != NULL) {
            r->live_state = 1;
            r->live_gen = e->gen;
        }
    }
    pthread_mutex_unlock(&ing->live_mu);
    /* A frontend to probe: a resting ticker (below) is kicked. */
    swi_ticker_wake(&ing->live_ticker, 1);
}

void
swn_ing_live_forget(sw_ingress *ing, sw_responder *r)
{
    pthread_mutex_lock(&ing->live_mu);
    if (r->live_state == 1) {
        swi_peer *e = swi_peers_find(&ing->peers, r->router_id);
        if (e != NULL && e->gen == r->live_gen)
            swi_peers_release(&ing->peers, r->router_id);
    }
    r->live_state = 2;
    pthread_mutex_unlock(&ing->live_mu);
}

/* One probing round (the liveness ticker, every frontend_probe_ms). */
void
swn_ing_live_tick(void *arg, int64_t now)
{
    sw_ingress *ing = arg;
    swi_peer_id send[SWN_PROBES_MAX];
    uint64_t ids[SWN_PROBES_MAX];
    swi_peer_lost lost[SWN_PROBES_MAX];
    size_t nsend, nlost;
    int idle;
    /* A frontend is probed while it has a registered stream here (counted
     * by swn_ing_live_note and swn_ing_live_forget; finished ones lingering
     * for an ack count too). */
#ifdef SW_CHAOS
    __atomic_fetch_add(&ing->live_ticks, 1, __ATOMIC_RELAXED);
#endif
    pthread_mutex_lock(&ing->live_mu);
    nsend = swi_peers_round(&ing->peers, now, swt_conn_up_since_ms(ing->conn), NULL, NULL, send,
                            SWN_PROBES_MAX, lost, SWN_PROBES_MAX, &nlost);
    for (size_t i = 0; i < nsend; i++)
        ids[i] = swi_peers_probe_id(&ing->peers, send[i]);
    for (size_t i = 0; i < nlost; i++)
        swi_peers_release_all(&ing->peers, lost[i].id);
    pthread_mutex_unlock(&ing->live_mu);
    for (size_t i = 0; i < nsend; i++) {
        char subj[SWT_SUBJECT_MAX], reply[SWT_SUBJECT_MAX];
        if (swt_subject_router(subj, sizeof(subj), send[i]) != SW_OK ||
            swt_subject_live_reply(reply, sizeof(reply), ing->instance_id, send[i]) != SW_OK)
            continue;
        {
            /* a PROBE carrying a fresh id that the frontend's answer echoes */
            swp_control m = STREAMWIRE__V1__CONTROL__INIT;
            uint8_t buf[64];
            size_t len;
            m.version = SW_PROTOCOL_VERSION;
            m.kind = STREAMWIRE__V1__CONTROL_KIND__CONTROL_PROBE;
            m.probe_id = ids[i];
            if (swp_encode(&m, buf, sizeof(buf), &len) == SW_OK)
                (void)swt_publish(ing->conn, subj, reply, buf, len);
        }
    }
    for (size_t i = 0; i < nlost; i++)
        swn_ing_cancel_frontend(ing, lost[i].id, "did not answer its probes");
    /* No frontend to probe: no wake-up every probe_ms in an idle worker
     * (issue 17). The rest level is set before the look under live_mu, and
     * swn_ing_live_note adds its frontend under live_mu before it wakes the
     * ticker: the look sees the frontend, or the note sees the level. */
    swi_ticker_resting(&ing->live_ticker, 1);
    pthread_mutex_lock(&ing->live_mu);
    idle = ing->peers.n == 0;
    pthread_mutex_unlock(&ing->live_mu);
    swi_ticker_rest(&ing->live_ticker, idle ? SWN_REST_MS : 0);
}
