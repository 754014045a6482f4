/* ingress/heartbeat.c -- the timer thread: the due-time scan over the
 * streams, deadlines, stranded queued items, heartbeats (batched per
 * frontend in HeartbeatBatch messages, or a wrapper of their own), and
 * retiring finished streams whose final was never acknowledged.
 *
 * Threads: the timer (the shared ticker, swn_ing_timer_tick);
 * swn_resp_tick_soon and swn_resp_beat_sooner are called from others too.
 * Locks: the due table's own for the snapshot (released before any r->mu),
 * r->mu per stream.
 * Heartbeat batches are published and logged with no lock held. */
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "ingress/ingress_int.h"

/* Takes a reference on r for the due-time snapshot (common/sched.h). */
static void
resp_take_ref(void *v)
{
    swn_resp_ref(v);
}

/* Makes the timer look at r at its next tick (a state change may have made
 * a check due earlier than computed). */
void
swn_resp_tick_soon(sw_responder *r)
{
    swi_due_soon(r->next_tick);
}

/* How long a finished stream whose final was not acknowledged is kept. */
static int64_t
resp_linger_ms(const sw_responder *r)
{
    return 4 * (int64_t)r->hb_ms + SWN_LINGER_MIN_MS;
}

/* A finished stream whose frontend still wants its final: heartbeats go on
 * so that a lost final is asked for (r->mu held). */
static int
resp_final_unacked(const sw_responder *r)
{
    return !r->closed && !r->fe_cancelled && r->final_seq != 0 && r->rg.acked < r->final_seq;
}

/* How long r may be quiet before its next heartbeat (r->mu held): the
 * frontend's idle interval while the last heartbeat already reported
 * everything sent and the stream neither waits for credit (a stalled
 * stream's beat may repeat a lost grant) nor has finished (its final may
 * need asking for); hb_ms otherwise, and until the first heartbeat (beat_seq
 * starts at UINT64_MAX: the frontend counts silence from before the request
 * reached us). swn_resp_beat_sooner brings a planned beat forward when the
 * interval shrinks. */
static int64_t
resp_beat_every(const sw_responder *r)
{
    if (!r->terminated && !r->starved && r->rg.pub_seq == r->beat_seq)
        return (int64_t)r->idle_hb_ms;
    return (int64_t)r->hb_ms;
}

/* When r's next heartbeat is due (r->mu held): resp_beat_every after the
 * last message, except that a beat at the idle spacing (at least twice
 * hb_ms) is brought back to the latest multiple of hb_ms on the monotonic
 * clock, so that it is never later and never closer than hb_ms to the
 * last. The idle streams of a worker then beat together, at most one
 * tick in each hb_ms, in a few full HeartbeatBatches instead of a small
 * one every tick (issue 17: the frontend's wake-ups); a stream stays on
 * the grid from its second idle beat on. */
static int64_t
resp_beat_due(const sw_responder *r)
{
    int64_t every = resp_beat_every(r), due = r->last_pub_ms + every, g = (int64_t)r->hb_ms;
    if (g > 0 && every >= 2 * g && due > 0)
        due -= due % g;
    return due;
}

void
swn_resp_beat_sooner(sw_responder *r)
{
    if (r->hb_ms == 0 || r->idle_hb_ms == r->hb_ms)
        return; /* the spacing never changes */
    swi_due_sooner(r->next_tick, resp_beat_due(r));
}

/* A drain stopped without memory for a message and left items queued, or
 * items wait for an inline handler's next one (r->held, sender.c) (r->mu
 * held): the timer publishes them on its next tick (resp_redrain), before
 * or after the final was queued. */
static int
resp_stranded(const sw_responder *r)
{
    return (r->stranded || r->held) && r->rg.pub_seq + 1 < r->rg.next_seq;
}

/* Publishes what a drain left for lack of memory, or what still waits for
 * an inline handler's next item (r->mu held). Only those items: others
 * wait for the thread they were handed to (the sender thread coalesces). A
 * stream abandoned without a final publishes nothing more (resp_drain's
 * own rule). */
static void
resp_redrain(sw_responder *r)
{
    if (resp_stranded(r) && !r->sending && swn_ring_keeps(&r->rg)) {
#ifdef SW_CHAOS
        if (r->held)
            __atomic_fetch_add(&r->ing->timer_releases, 1, __ATOMIC_RELAXED);
#endif
        swn_resp_run_drain(r);
    }
}

/* When the timer next has to look at r (r->mu held): its deadline, its next
 * heartbeat, the end of a final's linger; now if a drain left items for lack
 * of memory or items wait for an inline handler's next one (others wait
 * for the thread they were handed to). Only
 * ever later than the truth if a state change forgets swn_resp_tick_soon. */
static void
resp_plan_tick(sw_responder *r)
{
    int64_t due = INT64_MAX;
    if (r->closed) {
        /* nothing more to do */
    } else if (!r->terminated) {
        if (r->deadline_ms >= 0 && r->deadline_ms < due)
            due = r->deadline_ms;
        if (r->hb_ms != 0) {
            int64_t beat = resp_beat_due(r);
            if (beat < due)
                due = beat;
        }
    } else {
        due = r->done_ms + resp_linger_ms(r);
        if (resp_final_unacked(r) && r->hb_ms != 0 && r->last_pub_ms + (int64_t)r->hb_ms < due)
            due = r->last_pub_ms + (int64_t)r->hb_ms;
    }
    if (!r->closed && resp_stranded(r))
        due = 0;
    swi_due_set(r->next_tick, due);
}

/* The heartbeats one timer tick sends, by frontend: one HeartbeatBatch per
 * frontend (sw.rsp.<router>.hb) instead of a message per stream. Owned by
 * the timer thread; the groups live for one tick (a frontend that is gone
 * leaves nothing behind), the encode scratch is reused. */
#define SWN_BEATS_PER_MSG 4096 /* idle beats come together (resp_beat_due): few, full batches */
_Static_assert(SWN_BEATS_PER_MSG <= SWP_MAX_BEATS, "a batch a frontend's decoder takes");
typedef struct swn_beatgrp {
    char router[SW_MAX_TOKEN + 1]; /* the router's id */
    char subj[SWT_SUBJECT_MAX];    /* sw.rsp.<router>.hb */
    uint8_t (*ids)[SW_REQUEST_ID_BYTES];
    uint64_t *last;
    size_t n, cap;
} swn_beatgrp;
typedef struct swn_beats {
    swn_beatgrp *g;
    size_t n, cap;
    uint8_t *buf; /* SWP_BEATS_MAX(SWN_BEATS_PER_MSG), for encoding */
} swn_beats;

/* Queues one beat for router (its batch subject is formatted once per
 * tick, when its group is made). 0 ok, -1 no memory or a router id that
 * makes no subject (the beat is not queued). */
static int
beats_add(swn_beats *b, const char *router, const uint8_t *id, uint64_t last_seq)
{
    swn_beatgrp *g = NULL;
    if (b->n > 0 && strcmp(b->g[b->n - 1].router, router) == 0)
        g = &b->g[b->n - 1]; /* most beats of a tick go to one router */
    for (size_t i = 0; g == NULL && i < b->n; i++)
        if (strcmp(b->g[i].router, router) == 0)
            g = &b->g[i];
    if (g == NULL) {
        char subj[SWT_SUBJECT_MAX];
        if (swt_subject_beats(subj, sizeof(subj), router) != SW_OK)
            return -1;
        if (b->n == b->cap) {
            size_t nc = b->cap ? 2 * b->cap : 4;
            swn_beatgrp *ng = realloc(b->g, nc * sizeof(*ng));
            if (ng == NULL)
                return -1;
            b->g = ng;
            b->cap = nc;
        }
        g = &b->g[b->n++];
        memset(g, 0, sizeof(*g));
        memcpy(g->subj, subj, sizeof(g->subj));
        snprintf(g->router, sizeof(g->router), "%s", router);
    }
    if (g->n == g->cap) {
        size_t nc = g->cap ? 2 * g->cap : 64;
        uint8_t(*ni)[SW_REQUEST_ID_BYTES] = realloc(g->ids, nc * sizeof(*ni));
        uint64_t *nl;
        if (ni == NULL)
            return -1;
        g->ids = ni;
        if ((nl = realloc(g->last, nc * sizeof(*nl))) == NULL)
            return -1;
        g->last = nl;
        g->cap = nc;
    }
    memcpy(g->ids[g->n], id, SW_REQUEST_ID_BYTES);
    g->last[g->n] = last_seq;
    g->n++;
    return 0;
}

static void
beats_clear(swn_beats *b)
{
    for (size_t i = 0; i < b->n; i++) {
        free(b->g[i].ids);
        free(b->g[i].last);
    }
    b->n = 0;
}

/* Publishes the collected heartbeats, in messages that fit the max payload
 * (about 31 bytes a beat), and drops the groups. */
static void
beats_flush(sw_ingress *ing, swn_beats *b)
{
    uint64_t failed = 0;
    size_t max = sw_conn_max_payload(ing->conn), per = SWN_BEATS_PER_MSG;
    if (b->n == 0)
        return;
    if (max != 0 && (max < 256 || (max - 128) / 32 < per))
        per = max < 256 ? 1 : (max - 128) / 32;
    if (b->buf == NULL)
        b->buf = malloc(SWP_BEATS_MAX(SWN_BEATS_PER_MSG));
    for (size_t i = 0; i < b->n; i++) {
        swn_beatgrp *g = &b->g[i];
        for (size_t at = 0; at < g->n; at += per) {
            size_t k = g->n - at < per ? g->n - at : per, len;
            swn_sent d = {0, 0, 0, (int64_t)k};
            if (b->buf == NULL) {
                failed += g->n - at;
                break;
            }
            len = swp_beats_write(b->buf, ing->instance_id, ing->incarnation,
                                  __atomic_add_fetch(&ing->beats_counter, 1, __ATOMIC_RELAXED),
                                  g->ids + at, g->last + at, k);
            if (swn_ing_publish_counted(ing, g->subj, b->buf, len, &d) != SW_OK)
                failed += k;
        }
    }
    beats_clear(b);
    if (failed)
        swi_log(&ing->log, SW_LOG_WARN, "%llu heartbeat(s) could not be published",
                (unsigned long long)failed);
}

static void
beats_free(swn_beats *b)
{
    beats_clear(b);
    free(b->g);
    free(b->buf);
}

/* Heartbeats r if it has been quiet for resp_beat_every and nothing is
 * queued (r->mu held). The beat counts only what went out (pub_seq), so the frontend asks
 * for anything missing up to there. Every stream answers on its router's
 * own subject (sw.rsp.<router>.<id>: intake refuses another) and gets its
 * beat in the tick's batch for that router, but a stream waiting for
 * credit (it says `stalled`, which a batch's beats do not carry): that one
 * gets a heartbeat wrapper of its own on its subject. The wrapper carries the batches'
 * replay defence: the incarnation, and the next value of their counter
 * (the timer thread publishes both kinds, wrappers first, so the counter
 * grows in the order a router receives them). */
static void
resp_heartbeat(sw_responder *r, int64_t now, swn_beats *beats)
{
    if (r->hb_ms == 0 || now < resp_beat_due(r) || r->sending || r->rg.pub_seq + 1 < r->rg.next_seq)
        return;
#ifdef SW_CHAOS
    if (__atomic_load_n(&r->ing->drop_beats, __ATOMIC_RELAXED)) {
        /* lost on the bus (swx_ingress_drop_beats): as if it went out */
        r->last_pub_ms = now;
        r->beat_seq = r->rg.pub_seq;
        return;
    }
#endif
    if (r->beats_batched && !r->starved) {
        if (beats_add(beats, r->router_id, r->id, r->rg.pub_seq) == 0) {
            r->last_pub_ms = now;
            r->beat_seq = r->rg.pub_seq;
        }
        return;
    }
    {
        swp_item w = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__INIT;
        swp_heartbeat h = STREAMWIRE__V1__HEARTBEAT__INIT;
        uint8_t buf[SWP_HDR_MAX + 64];
        size_t len;
        w.version = SW_PROTOCOL_VERSION;
        w.request_id.data = r->id;
        w.request_id.len = SW_REQUEST_ID_BYTES;
        w.instance_id = r->ing->instance_id;
        w.body_case = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_HEARTBEAT;
        h.last_seq = r->rg.pub_seq;
        h.stalled = r->starved;
        h.incarnation = r->ing->incarnation;
        h.counter = __atomic_add_fetch(&r->ing->beats_counter, 1, __ATOMIC_RELAXED);
        w.heartbeat = &h;
        if (swp_encode(&w, buf, sizeof(buf), &len) == SW_OK) {
            swn_sent d = {0, 0, 0, 1};
            if (swn_resp_publish(r, buf, len, &d) == SW_OK)
                r->beat_seq = h.last_seq;
        }
    }
}

static void
ing_tick_one(sw_responder *r, int64_t now, swn_beats *beats)
{
    int deadline = 0, retire = 0;
    pthread_mutex_lock(&r->mu);
    if (!r->terminated && !r->closed) {
        if (r->deadline_ms >= 0 && now >= r->deadline_ms) {
            deadline = !r->cancelled;
            r->cancelled = 1;
            (void)swn_resp_send_failed(r, SW_DEADLINE_EXCEEDED, NULL, "the request deadline passed",
                                       SWN_BY_OTHER);
        } else {
            resp_redrain(r);
            resp_heartbeat(r, now, beats);
        }
    } else if (r->terminated) {
        /* Items and the final a drain left for lack of memory go out first
         * (a silent stream would end in a lost-instance error). A final
         * never acknowledged: keep it for resend for a while, then let go.
         * Heartbeats go on meanwhile, so a lost final is asked for. */
        resp_redrain(r);
        retire = now - r->done_ms >= resp_linger_ms(r);
        if (!retire && resp_final_unacked(r))
            resp_heartbeat(r, now, beats);
    }
    resp_plan_tick(r);
    pthread_mutex_unlock(&r->mu);
    if (deadline)
        swn_resp_fire_cancel(r);
    if (retire)
        swn_unregister_stream(r);
}

#define SWN_TICK_AHEAD 4 /* streams fetched ahead of the one looked at */
void
swn_ing_timer_tick(void *arg, int64_t now)
{
    sw_ingress *ing = arg;
#ifdef SW_CHAOS
    __atomic_fetch_add(&ing->timer_ticks, 1, __ATOMIC_RELAXED);
#endif
    if (ing->beats == NULL && (ing->beats = calloc(1, sizeof(*ing->beats))) == NULL)
        return; /* no memory this tick: the next one tries again */
    /* only streams with something due */
    swi_duetab_snapshot(&ing->due, &ing->timer_vec, now, resp_take_ref);
    for (size_t i = 0; i < ing->timer_vec.n && i < SWN_TICK_AHEAD; i++)
        swi_prefetch(SWN_RESP_AT(ing->timer_vec, i), sizeof(sw_responder));
    for (size_t i = 0; i < ing->timer_vec.n; i++) {
        if (i + SWN_TICK_AHEAD < ing->timer_vec.n) /* idle streams are cold */
            swi_prefetch(SWN_RESP_AT(ing->timer_vec, i + SWN_TICK_AHEAD), sizeof(sw_responder));
        ing_tick_one(SWN_RESP_AT(ing->timer_vec, i), now, ing->beats);
        swn_resp_unref(SWN_RESP_AT(ing->timer_vec, i));
    }
    beats_flush(ing, ing->beats);
    swt_conn_trim(ing->conn);
    /* Closed for good (sw_conn_close, or out of reconnects): no frontend
     * can hear these streams again, and silence is not judged while the
     * connection is down, so a send waiting for credit would wait out its
     * send_timeout_ms: they are cancelled as if their frontends were gone. */
    if (sw_conn_status(ing->conn) == SW_CONN_CLOSED)
        swn_ing_cancel_frontend(ing, NULL, 0, 0, "the NATS connection is closed");
    /* No stream registered: nothing to beat, time or retire, so no wake-up
     * every SWN_TICK_MS in an idle worker (issue 17). The rest level is set
     * before the look at the due table, under its lock; a registration
     * attaches under that lock before it wakes the timer (intake.c). */
    swi_ticker_resting(&ing->timer, 1);
    swi_ticker_rest(&ing->timer, swi_duetab_attached(&ing->due) == 0 ? SWN_REST_MS : 0);
}

void
swn_ing_timer_fini(sw_ingress *ing)
{
    if (ing->beats != NULL) {
        beats_free(ing->beats);
        free(ing->beats);
        ing->beats = NULL;
    }
    free(ing->timer_vec.v);
    ing->timer_vec.v = NULL;
}
