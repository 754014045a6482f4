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
 * guards the peer table and the streams' counts in it, alone (probes are
 * published and streams cancelled after it is released; the cancels take
 * it per stream to judge whether the verdict covers it); ing->mu only for
 * the sweep's batches (swn_ing_sweep_take); r->mu per stream when
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

static void live_count(sw_ingress *ing, sw_responder *r, int64_t now);

/* Whether stream r of a frontend judged gone is cancelled (live_mu held):
 * gen is the generation of the frontend's entry, taken out of the table,
 * and probe_ms when the probe that decided went out. The probe spoke for
 * the streams counted in that entry and noted before it went out: those
 * are cancelled. A stream noted since (or counted in a newer entry, made
 * after the old one went) came from a frontend that was there to send it
 * -- a router back under the same id, or a late request of the old one:
 * it stays, counted in an entry of its own, and its frontend is probed
 * afresh (a dead one is found again within a round or two). One not
 * noted yet is left to its note. One counted nowhere (no memory for an
 * entry) goes with its frontend's verdict, as it always did. */
static int
live_judged(sw_ingress *ing, sw_responder *r, uint64_t gen, int64_t probe_ms, int64_t now)
{
    if (r->live_state == 2)
        return 1;
    if (r->live_state == 0 || r->live_gen != gen)
        return 0;
    if (r->live_ms < probe_ms)
        return 1;
    r->live_state = 0;
    live_count(ing, r, now);
    return 0;
}

void
swn_ing_cancel_frontend(sw_ingress *ing, const char *router_id, uint64_t gen, int64_t probe_ms,
                        const char *why)
{
    sw_responder *batch[SWN_SWEEP_BATCH];
    swn_sweep w = {.all = 0};
    unsigned n = 0, kept = 0;
    int64_t now = swi_now_ms();
    size_t nb;
    /* A sweep, not a snapshot: without memory for one, the streams of a
     * frontend judged gone (no longer probed) were never cancelled. */
    while ((nb = swn_ing_sweep_take(ing, &w, batch, SWN_SWEEP_BATCH)) > 0) {
        for (size_t i = 0; i < nb; i++) {
            sw_responder *r = batch[i];
            int judged = router_id == NULL;
            if (!judged && strcmp(r->router_id, router_id) == 0) {
                pthread_mutex_lock(&ing->live_mu);
                judged = live_judged(ing, r, gen, probe_ms, now);
                pthread_mutex_unlock(&ing->live_mu);
                kept += !judged;
            }
            if (judged) {
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
    }
    if (kept > 0) {
        swi_ticker_wake(&ing->live_ticker, 1); /* (a new entry to probe) */
        swi_log(&ing->log, SW_LOG_INFO,
                "frontend %s %s; %u newer stream(s) of the same id kept, probed afresh", router_id,
                why, kept);
    }
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

#ifdef SW_CHAOS
/* swx_ingress_on_frontend_gone's hook, if any, for router_id (no lock held). */
static void
live_chaos_gone(sw_ingress *ing, const char *router_id)
{
    void (*fn)(const char *, void *);
    void *arg;
    pthread_mutex_lock(&ing->live_mu);
    fn = ing->gone_fn;
    arg = ing->gone_arg;
    pthread_mutex_unlock(&ing->live_mu);
    if (fn != NULL)
        fn(router_id, arg);
}
#endif

/* A frontend answered a probe, or the server said nobody is there (which
 * proves it gone only if our own connection was up and settled when the
 * probe went out: common/sched.h's peer table decides). */
void
swn_ing_on_live_reply(const swt_msg *msg, void *arg)
{
    sw_ingress *ing = arg;
    const char *id = swt_subject_last_token(msg->subject);
    swi_peer_id gone = "";
    int64_t silent = 0, probe_ms = 0;
    uint64_t pid, gen = 0;
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
        const swi_peer *e = swi_peers_find(&ing->peers, id);
        snprintf(gone, sizeof(gone), "%s", id);
        gen = e->gen;
        probe_ms = e->sent_ms; /* (the probe just answered) */
        swi_peers_release_all(&ing->peers, id);
    }
    pthread_mutex_unlock(&ing->live_mu);
    if (gone[0] == '\0')
        return;
#ifdef SW_CHAOS
    live_chaos_gone(ing, gone);
#endif
    swn_ing_cancel_frontend(ing, gone, gen, probe_ms, "is gone (no responders)");
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
 * 2, or 0 -> 2, under live_mu; a stream its frontend's verdict does not
 * cover goes 1 -> 0 -> 1, into a new entry (live_judged).
 *
 * live_count counts r (live_state 0) in its frontend's entry, made if need
 * be, its first probe one interval from now (live_mu held). No memory for a new
 * frontend's entry: r is not counted and its frontend not probed for it
 * (its own heartbeats and the frontend's silence limit still end it); a
 * later stream's note tries again. */
static void
live_count(sw_ingress *ing, sw_responder *r, int64_t now)
{
    swi_peer *e;
    r->live_state = 2;
    if (swi_peers_use(&ing->peers, r->router_id, now - (int64_t)ing->peers.interval_ms) == 0 &&
        (e = swi_peers_find(&ing->peers, r->router_id)) != NULL) {
        r->live_state = 1;
        r->live_gen = e->gen;
        r->live_ms = now;
    }
}

void
swn_ing_live_note(sw_ingress *ing, sw_responder *r)
{
    pthread_mutex_lock(&ing->live_mu);
    if (r->live_state == 0)
        live_count(ing, r, swi_now_ms());
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
    uint64_t lost_gen[SWN_PROBES_MAX];
    int64_t lost_probe[SWN_PROBES_MAX];
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
    for (size_t i = 0; i < nlost; i++) {
        const swi_peer *e = swi_peers_find(&ing->peers, lost[i].id);
        lost_gen[i] = e->gen;
        lost_probe[i] = e->sent_ms; /* (the last probe, unanswered) */
        swi_peers_release_all(&ing->peers, lost[i].id);
    }
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
    for (size_t i = 0; i < nlost; i++) {
#ifdef SW_CHAOS
        live_chaos_gone(ing, lost[i].id);
#endif
        swn_ing_cancel_frontend(ing, lost[i].id, lost_gen[i], lost_probe[i],
                                "did not answer its probes");
    }
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
