/* egress/timer.c -- the router's ticker (common/sched.h's swi_ticker, every
 * SWE_TICK_MS): every SWE_SCAN_MS the streams with a check due (deadline,
 * inactivity, gap repair and timeout, a lingering terminal; each keeps its
 * next due time), then a probing round and the flush of acknowledgements.
 * It waits longer when nothing is due sooner: until the next scan while
 * streams are open, SWE_REST_MS with none (router_rest_ms, swi_ticker_wake).
 * Runs on the ticker thread with no lock held on entry. */
#include <stdlib.h>

#include "egress/egress_int.h"

void
swe_defer_dispatch(sw_stream *s)
{
    sw_router *r = s->r;
    int queued = 0;
    swe_stream_ref(s);
    pthread_mutex_lock(&r->mu);
    if (!r->no_defer && r->deferred.n == r->deferred.cap) {
        size_t ncap = r->deferred.cap ? r->deferred.cap * 2 : 16;
        void **nv = realloc(r->deferred.v, ncap * sizeof(*nv));
        if (nv != NULL) {
            r->deferred.v = nv;
            r->deferred.cap = ncap;
        }
    }
    if (!r->no_defer && r->deferred.n < r->deferred.cap) {
        r->deferred.v[r->deferred.n++] = s;
        queued = 1;
    }
    pthread_mutex_unlock(&r->mu);
    if (queued) {
        swi_ticker_kick(&r->ticker);
        return;
    }
    /* No memory to defer it, or no ticker any more (sw_router_destroy has
     * run its last deferred dispatches: an open that raced it): dispatch
     * here, inside sw_router_open (the one case in which an item callback
     * runs before open returns). */
    swe_dispatch(s);
    swe_stream_unref(s);
}

void
swe_run_deferred(sw_router *r)
{
    for (;;) {
        sw_stream *s = NULL;
        pthread_mutex_lock(&r->mu);
        if (r->deferred.n > 0)
            s = r->deferred.v[--r->deferred.n];
        pthread_mutex_unlock(&r->mu);
        if (s == NULL)
            return;
        swe_dispatch(s);
        swe_stream_unref(s);
    }
}

/* The connection is closed for good (sw_conn_close, or nats.c ran out of
 * reconnects): nothing more will arrive, and silence is not judged while
 * the connection is down (swe_stream_tick), so without this a stream with
 * no deadline would wait forever. Every open stream ends with SW_ECLOSED;
 * one that has its terminal already keeps it. */
static void
swe_end_all_closed(sw_router *r)
{
    swe_snapshot(r, &r->scan_vec, NULL);
    for (size_t i = 0; i < r->scan_vec.n; i++) {
        sw_stream *s = SWE_AT(r->scan_vec, i);
        swe_stream_fail(s, SW_ECLOSED, "the router's NATS connection is closed", 0);
        swe_stream_unref(s);
    }
}

/* How long the ticker may wait before the next tick: until the next thing
 * a tick would act on (the next scan while streams are open, a probe to
 * send or judge, a cancel to send again), SWE_TICK_MS if a final's ack or
 * a dispatch waits, SWE_REST_MS at most (nothing at all: an idle router).
 * Returns 0 for the usual period.
 *
 * The ticker's rest level is set (SWE_REST_SHORT, or SWE_REST_IDLE with no
 * stream) before the look, and whatever brings work sooner makes it
 * visible under the lock looked under before it calls swi_ticker_wake:
 * either the look sees the work, or the producer sees the level. A new
 * stream and a queued final's ack (the first of a batch) wake only an idle
 * router: with streams open the ack waits for the tick that is due anyway
 * (within SWE_SCAN_MS; a kick for each short stream's ack cost one
 * wake-up of this thread per stream, 10 % of the short streams' rate at
 * concurrency 1). So does a cancel kept for resends (the first is
 * SWE_CANCEL_FIRST_MS away; closing many streams woke the ticker for each
 * one). A probe answer that makes an instance suspect wakes either. */
static int64_t
router_rest_ms(sw_router *r, int64_t now)
{
    int64_t next = INT64_MAX, rest;
    int streams;
    swi_ticker_resting(&r->ticker, SWE_REST_IDLE);
    pthread_mutex_lock(&r->mu);
    streams = r->st.open_streams > 0;
    if (streams)
        swi_ticker_resting(&r->ticker, SWE_REST_SHORT);
    if (r->deferred.n > 0)
        next = now;
    if (streams && r->next_scan < next)
        next = r->next_scan;
    rest = swi_peers_next_due(&r->peers, now);
    if (rest < next)
        next = rest;
    rest = swe_cancels_next_due(&r->cancels);
    if (rest < next)
        next = rest;
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_lock(&r->ack_mu);
    if (r->nacks > 0)
        next = now;
    pthread_mutex_unlock(&r->ack_mu);
    rest = next == INT64_MAX ? SWE_REST_MS : next - now;
    if (rest <= SWE_TICK_MS)
        return 0;
    return rest < SWE_REST_MS ? rest : SWE_REST_MS;
}

void
swe_on_tick(void *arg, int64_t now)
{
    sw_router *r = arg;
#ifdef SW_CHAOS
    __atomic_fetch_add(&r->ticks, 1, __ATOMIC_RELAXED);
#endif
    swe_run_deferred(r);
    if (now >= r->next_scan) {
        int64_t quiet;
        uint64_t done, taken;
        r->next_scan = now + SWE_SCAN_MS;
        if (sw_conn_status(r->conn) == SW_CONN_CLOSED)
            swe_end_all_closed(r);
        /* Silence is judged up to the time this router had handled all it
         * had received (egress/backlog.h): never for its own delay. */
        swt_sub_progress(r->mux, &done, &taken);
        quiet = swe_backlog_look(&r->backlog, now, done, taken);
        if (now - quiet >= SWE_BEHIND_WARN_MS && now - r->behind_warned_ms >= SWE_BEHIND_WARN_MS) {
            r->behind_warned_ms = now;
            swi_log(&r->log, SW_LOG_WARN,
                    "router %s: %lld ms behind on what it received (%llu messages waiting; a "
                    "callback that blocks its delivery thread?): its streams' silence is not "
                    "judged meanwhile",
                    r->id, (long long)(now - quiet), (unsigned long long)(taken - done));
        }
        swe_snapshot(r, &r->scan_vec, &now); /* only streams with something due */
        for (size_t i = 0; i < r->scan_vec.n; i++) {
            swe_stream_tick(SWE_AT(r->scan_vec, i), now, quiet);
            swe_stream_unref(SWE_AT(r->scan_vec, i));
        }
    }
    swe_probe_round(r, now);
    swe_cancels_tick(r, now);
    swe_flush_acks(r);
    swt_conn_trim(r->conn);
    /* No wake-up every SWE_TICK_MS when nothing is due sooner (issue 17:
     * an idle router cost ~0.3 % of a core in wake-ups alone; with idle
     * streams the ticker wakes for the scans, every SWE_SCAN_MS). */
    swi_ticker_rest(&r->ticker, (unsigned)router_rest_ms(r, now));
}
