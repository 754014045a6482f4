/* tests/integration/test_loss.c -- end-to-end streams over a real
 * nats-server (issues 3 and 5), split from test_streams.c by theme:
 * loss and liveness: heartbeats (slow streams, batched, on
 * the frontend), gap repair (resend) with windows capped, acknowledged and
 * lost finals.
 * Fixture, threads and locks: streams_fixture.h. */
#include <limits.h>

#include "streams_fixture.h"

/* A worker that sends k tokens, pauses delay_ms, then sends the rest of n
 * and completes: the stream must end completed with all n tokens in order.
 * Returns the heartbeats the frontend counted. */
static uint64_t
paused_stream_heartbeats(env *e, sw_router_opts *ro, int k, int n, int delay_ms)
{
    got *g = new_got(e);
    sw_stream_stats ss;
    sw_stream *s;
    e->w.mode = M_PAUSE;
    e->w.k = k;
    e->w.n = n;
    e->w.delay_ms = delay_ms;
    env_start(e, NULL, ro);
    s = env_open(e);
    assert_true(collect(s, g, 0, T(15000)));
    assert_tokens(g, n);
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_done(g);
    sw_stream_stats_get(s, &ss);
    got_free(g);
    return ss.heartbeats;
}

/* Heartbeats keep a stream alive through a pause longer than the
 * inactivity timeout (4*50+500 = 700 ms). */
static void
heartbeats_keep_slow_stream_alive(void **state)
{
    sw_router_opts ro;
    sw_router_opts_init(&ro);
    ro.heartbeat_ms = 50;
    assert_true(paused_stream_heartbeats(*state, &ro, 2, 4, 1500) >= 3);
}

/* An idle stream (nothing new since its last heartbeat) is beaten every
 * Request.idle_heartbeat_ms: with the default silence limit (4 x 250 + 500
 * ms) that is every 1,000 ms (the limit less 500; a lost one is made up
 * for by a stream probe: idle_beats_lost_*), a quarter of the beats of
 * every 250 ms, and the stream lives through a 2.2 s pause. A frontend
 * whose silence limit allows no spacing (750 ms: 750 - 500 is not above
 * 250) asks for none and gets a beat every 250 ms. Counted at the
 * frontend. */
static void
idle_heartbeats_run(env *e, int tight)
{
    sw_router_opts ro;
    uint64_t beats;
    sw_router_opts_init(&ro);
    if (tight)
        ro.inactivity_ms = 750;
    beats = paused_stream_heartbeats(e, &ro, 0, 1, 2200);
    /* 2.2 s: the first beat at 250 ms, then about 2 at 1,000 ms; 8 at 250
     * ms (a loaded machine may beat late, never early) */
    if (!tight && (beats < 1 || beats > 3))
        fail_msg("idle stream: %llu heartbeats in 2.2 s (want 1-3: every 1,000 ms)",
                 (unsigned long long)beats);
    if (tight && (beats < 6 || beats > 10))
        fail_msg("tight silence limit: %llu heartbeats in 2.2 s (want 6-10: every 250 ms)",
                 (unsigned long long)beats);
}

static void
idle_heartbeats_spaced(void **state)
{
    idle_heartbeats_run(*state, 0);
}

static void
idle_heartbeats_tight_limit(void **state)
{
    idle_heartbeats_run(*state, 1);
}

/* Idle beats fall on a grid of heartbeat_ms (ingress/heartbeat.c,
 * resp_beat_due): streams opened at different moments, once idle, are
 * beaten together, in one HeartbeatBatch per grid point at most, where
 * they used to go in a small batch each at its own tick; and a stream's
 * beats are still never further apart than the idle spacing (1,000 ms
 * with the defaults). Watched on the frontend's connection, on the
 * batches' subject. */
#define GRID_K 8
#define GRID_MAX_BEATS 64
typedef struct grid_log {
    pthread_mutex_t mu;
    int64_t t0;
    int n;     /* batches after t0 */
    int beats; /* beats in them */
    int64_t at[GRID_MAX_BEATS * GRID_K];
    uint8_t id[GRID_MAX_BEATS * GRID_K][SW_REQUEST_ID_BYTES];
    int nb;
} grid_log;

static void
grid_on_batch(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *arg)
{
    grid_log *l = arg;
    swp_beats *b = NULL;
    int64_t now = swh_now_ms();
    (void)nc;
    (void)sub;
    if (swp_decode_beats((const uint8_t *)natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg),
                         1 << 20, &b) == SW_OK) {
        pthread_mutex_lock(&l->mu);
        if (l->t0 != 0 && now >= l->t0) {
            l->n++;
            l->beats += (int)b->n_beats;
        }
        for (size_t i = 0; i < b->n_beats && l->nb < GRID_MAX_BEATS * GRID_K; i++) {
            l->at[l->nb] = now;
            memcpy(l->id[l->nb], b->beats[i]->request_id.data, SW_REQUEST_ID_BYTES);
            l->nb++;
        }
        pthread_mutex_unlock(&l->mu);
        swp_free(b);
    }
    natsMsg_Destroy(msg);
}

static void
idle_beats_on_a_grid(void **state)
{
    env *e = *state;
    sw_stream *s[GRID_K];
    uint8_t ids[GRID_K][SW_REQUEST_ID_BYTES];
    char subj[SWT_SUBJECT_MAX];
    natsSubscription *sub = NULL;
    grid_log *l = calloc(1, sizeof(*l));
    int64_t window, max_gap = 0;
    int batches, beats;
    sw_ingress_opts io;

    assert_non_null(l);
    pthread_mutex_init(&l->mu, NULL);
    sw_ingress_opts_init(&io);
    io.handler_threads = GRID_K; /* every stream's handler runs at once */
    e->w.mode = M_PAUSE;
    e->w.k = 0;
    e->w.n = 1;
    /* Each idle for 5 s or more, past the counting window (which ends
     * about 3.8 s after the first open); the defaults: beats every 250
     * ms, idle ones every 1,000. */
    e->w.delay_ms = (int)(4000 + T(1000));
    env_start(e, &io, NULL);
    assert_int_equal(swt_subject_beats(subj, sizeof(subj), sw_router_id(e->rt)), SW_OK);
    assert_int_equal(natsConnection_Subscribe(&sub, sw_conn_nats(e->fc), subj, grid_on_batch, l),
                     NATS_OK);
    assert_int_equal(natsConnection_Flush(sw_conn_nats(e->fc)), NATS_OK);
    for (int i = 0; i < GRID_K; i++) {
        char rs[SWT_SUBJECT_MAX];
        s[i] = env_open(e);
        assert_int_equal(swt_subject_response(rs, sizeof(rs), "x", sw_stream_request_id(s[i])),
                         SW_OK);
        assert_int_equal(swt_response_subject_id(rs, ids[i]), 0);
        swh_sleep_ms(60); /* each at its own phase of the grid */
    }
    /* From 1.4 s after the last open every stream is on the grid (its
     * first idle beat, at most 1,250 ms after its request). */
    swh_sleep_ms(1400);
    pthread_mutex_lock(&l->mu);
    l->t0 = swh_now_ms();
    pthread_mutex_unlock(&l->mu);
    swh_sleep_ms(2000);
    pthread_mutex_lock(&l->mu);
    window = swh_now_ms() - l->t0;
    batches = l->n;
    beats = l->beats;
    l->t0 = INT64_MAX; /* count no more */
    pthread_mutex_unlock(&l->mu);
    for (int i = 0; i < GRID_K; i++) {
        got *g = new_got(e);
        assert_true(collect(s[i], g, 0, T(15000)));
        assert_tokens(g, 1);
        assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
        got_free(g);
    }
    /* Drained: no callback runs once it completes (l is read, then freed). */
    assert_int_equal(natsSubscription_Drain(sub), NATS_OK);
    assert_int_equal(natsSubscription_WaitForDrainCompletion(sub, 5000), NATS_OK);
    natsSubscription_Destroy(sub);
    /* The beats of each stream, from its second on (its first comes
     * heartbeat_ms after its request, before it is idle). */
    for (int i = 0; i < GRID_K; i++) {
        int64_t prev = -1;
        int seen = 0;
        for (int j = 0; j < l->nb; j++) {
            if (memcmp(l->id[j], ids[i], SW_REQUEST_ID_BYTES) != 0)
                continue;
            if (prev >= 0 && seen >= 2 && l->at[j] - prev > max_gap)
                max_gap = l->at[j] - prev;
            prev = l->at[j];
            seen++;
        }
        assert_true(seen >= 3);
    }
    pthread_mutex_destroy(&l->mu);
    free(l);
    /* About K beats per 1,000 ms, in at most one batch per 250 ms grid
     * point (two phases of the grid at most). Without the grid: a batch
     * per stream per 1,000 ms, K times as many. */
    if (beats < GRID_K * (int)(window / 1000) - GRID_K || beats > GRID_K * (int)(window / 1000 + 2))
        fail_msg("%d beats of %d idle streams in %lld ms (want about one per stream per 1,000 "
                 "ms)",
                 beats, GRID_K, (long long)window);
    if (batches > (int)(window / 250) + 2)
        fail_msg("%d heartbeat batches in %lld ms for %d idle streams (want at most one per 250 ms "
                 "grid point: %d)",
                 batches, (long long)window, GRID_K, (int)(window / 250) + 2);
    if (max_gap > 1000 + T(250))
        fail_msg("an idle stream went %lld ms between beats (the idle spacing is 1,000 ms)",
                 (long long)max_gap);
}

/* Spaced idle beats never delay a repair: after a long idle spell (beats
 * every 10,000 - 500 = 9,500 ms) the worker sends token 0, which the
 * bus loses; the next beat comes heartbeat_ms (100) after it, not at the
 * idle spacing, so the frontend asks for it again and has it long before
 * the final (1.5 s later) would have shown the gap. */
static void
idle_heartbeat_then_loss_repaired_soon(void **state)
{
    env *e = *state;
    sw_router_opts ro;
    got *g = new_got(e);
    const sw_item *it = NULL;
    sw_stream_stats ss;
    sw_stream *s;
    int64_t t0;
    sw_err rv;
    sw_router_opts_init(&ro);
    ro.heartbeat_ms = 100;
    ro.inactivity_ms = 10000;
    e->w.mode = M_LOSE_LATE;
    e->w.n = 2;
    e->w.delay_ms = 1500;
    env_start(e, NULL, &ro);
    t0 = swh_now_ms();
    s = env_open(e);
    rv = sw_stream_next(s, &it, 2700); /* lost at ~1.5 s, the final at ~3 s */
    if (rv != SW_OK)
        fail_msg("no item within 2.7 s (%s): the loss waited for the idle spacing",
                 sw_err_name(rv));
    assert_int_equal(it->kind, SW_ITEM_DATA);
    assert_int_equal(it->seq, 1);
    assert_true(swh_now_ms() - t0 >= 1400);
    got_add(g, it);
    assert_true(collect(s, g, 0, T(15000)));
    assert_tokens(g, 2);
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    sw_stream_stats_get(s, &ss);
    assert_true(ss.resend_requests >= 1);
    got_free(g);
}

/* Lost idle beats (issue 17: an idle stream is beaten only every
 * Request.idle_heartbeat_ms, so one lost beat would leave it silent past
 * its limit): a stream silent for its idle spacing and a heartbeat more is
 * asked after with a stream PROBE, and the worker's answer counts as its
 * heartbeat. Here every heartbeat the worker sends is lost
 * (swx_ingress_drop_beats): the stream lives through a pause of three
 * silence limits (4.5 s; the default limit is 1.5 s) on the answers alone,
 * then completes. With its probes lost too, or answered "not known" (a
 * stream the worker abandoned), it ends stream_incomplete at the silence
 * limit, as without the asks. */
static sw_stream *
lost_beats_open(env *e, int mode, int drop_probes, int64_t *t0)
{
    e->w.mode = mode;
    e->w.k = 1;
    e->w.n = 2;
    e->w.delay_ms = mode == M_PAUSE ? 4500 : 0; /* (M_ABANDON: at once after its token) */
    env_start(e, NULL, NULL);
    swx_ingress_drop_beats(e->ing, 1);
    swx_ingress_drop_stream_probes(e->ing, drop_probes);
    *t0 = swh_now_ms();
    return env_open(e);
}

static void
idle_beats_lost_probes_keep_alive(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_router_stats rs;
    sw_stream_stats ss;
    int64_t t0;
    sw_stream *s = lost_beats_open(e, M_PAUSE, 0, &t0);
    assert_true(collect(s, g, 0, T(15000)));
    assert_tokens(g, 2);
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_true(swh_now_ms() - t0 >= 4500);
    sw_stream_stats_get(s, &ss);
    sw_router_stats_get(e->rt, &rs);
    /* about one ask per 1.25 s of the 4.5 s, each answered and counted as
     * a heartbeat (no beat of the worker's arrived) */
    if (rs.stream_probes_answered < 3 || rs.stream_probes_answered > rs.stream_probes_sent ||
        ss.heartbeats < 3 || ss.heartbeats > rs.stream_probes_answered)
        fail_msg("%llu stream probes sent, %llu answered, %llu heartbeats (want 3 or more "
                 "answered, each a heartbeat)",
                 (unsigned long long)rs.stream_probes_sent,
                 (unsigned long long)rs.stream_probes_answered, (unsigned long long)ss.heartbeats);
    assert_int_equal(rs.stream_probes_full, 0);
    got_free(g);
}

static void
lost_beats_end_at_the_limit(env *e, int mode, int drop_probes, const char *what)
{
    got *g = new_got(e);
    sw_router_stats rs;
    int64_t t0, took;
    sw_stream *s = lost_beats_open(e, mode, drop_probes, &t0);
    assert_true(collect(s, g, 0, T(15000)));
    took = swh_now_ms() - t0;
    assert_tokens(g, 1);
    assert_terminal(g, SW_STATUS_ERROR, SW_STREAM_INCOMPLETE, "stream_incomplete");
    if (took < 1450 || took > 1500 + T(500))
        fail_msg("%s: ended after %lld ms (want the silence limit, 1,500 ms)", what,
                 (long long)took);
    sw_router_stats_get(e->rt, &rs);
    if (rs.stream_probes_sent < 1 || rs.stream_probes_answered != 0)
        fail_msg("%s: %llu stream probes sent, %llu answered (want 1 or more, none)", what,
                 (unsigned long long)rs.stream_probes_sent,
                 (unsigned long long)rs.stream_probes_answered);
    got_free(g);
}

static void
idle_beats_lost_probes_unanswered(void **state)
{
    lost_beats_end_at_the_limit(*state, M_PAUSE, 1, "probes lost");
}

/* (the worker abandoned the stream after its first token: it sends
 * nothing more, and answers that it does not know it) */
static void
idle_beats_lost_stream_not_known(void **state)
{
    lost_beats_end_at_the_limit(*state, M_ABANDON, 0, "not known");
}

/* A stream probe's answer is a sign of life only: what it says went out
 * (last_seq) is taken up to what arrived, never as news of a gap. A worker
 * from before 2026-12-07 answered with the last seq it had numbered, sent
 * or not (and a wedged send numbers items it cannot send): taken as a
 * heartbeat, that opened a gap no RESEND repairs. Here every answer claims
 * five items more than went out while the worker pauses 4.5 s between its
 * two tokens, its heartbeats lost: the stream lives on the answers, asks
 * for no resend, and completes with both tokens. (With the router's clamp
 * in egress/stream.c swe_stream_answered taken out, it asked for items 2-6
 * and ended sequence_gap, "a sequence gap was not repaired in time".) */
static void
probe_answer_ahead_is_no_gap(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_router_stats rs;
    sw_stream_stats ss;
    sw_ingress_stats is;
    int64_t t0;
    sw_stream *s = lost_beats_open(e, M_PAUSE, 0, &t0);
    swx_ingress_probe_seq_ahead(e->ing, 5);
    assert_true(collect(s, g, 0, T(15000)));
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_tokens(g, 2);
    assert_true(swh_now_ms() - t0 >= 4500);
    sw_stream_stats_get(s, &ss);
    sw_router_stats_get(e->rt, &rs);
    ingress_stats(e, &is);
    if (rs.stream_probes_answered < 3 || ss.resend_requests != 0 || is.items_resent != 0)
        fail_msg("%llu stream probes answered (want 3 or more), %llu resend requests, %llu items "
                 "resent (want none: the answers claimed items that never went out)",
                 (unsigned long long)rs.stream_probes_answered,
                 (unsigned long long)ss.resend_requests, (unsigned long long)is.items_resent);
    got_free(g);
}

/* A heartbeat_ms above 65,535 (up to SWP_MAX_HEARTBEAT_MS is valid; the
 * worker beats at least every SWP_BEAT_MAX_MS, 10 s, whatever was asked):
 * the asks are timed by what the worker does. The router's copy of the
 * intervals was cut to 16 bits: 65,537 ms became 1 ms (and the idle
 * spacing 4 ms), so the stream, silent in its pause, was asked after some
 * 40 times a second. Now no ask in a 1.2 s pause, and it completes. */
static void
huge_heartbeat_asks_nothing(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_request_opts o;
    sw_router_stats rs;
    sw_stream *s;
    e->w.mode = M_PAUSE;
    e->w.k = 1;
    e->w.n = 2;
    e->w.delay_ms = 1200;
    env_start(e, NULL, NULL);
    ropts(e, &o);
    o.heartbeat_ms = 65537;
    s = env_open_with(e, &o, "prompt", 6);
    assert_true(collect(s, g, 0, T(15000)));
    assert_tokens(g, 2);
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    sw_router_stats_get(e->rt, &rs);
    if (rs.stream_probes_sent != 0)
        fail_msg("%llu stream probes in a 1.2 s pause (want none: the worker beats every 10 s "
                 "at most, the silence limit is 262 s)",
                 (unsigned long long)rs.stream_probes_sent);
    got_free(g);
}

/* Heartbeats travel batched per frontend (HeartbeatBatch on
 * sw.rsp.<router>.hb). Many idle streams at once are all kept alive by
 * them, with far fewer messages than beats; a batch that does not decode
 * is counted and harms no stream; beats for unknown streams are counted. */
static void
heartbeat_batches(void **state)
{
    env *e = *state;
    sw_router_opts ro;
    sw_router_stats rs;
    sw_ingress_stats st;
    sw_stream *s[8];
    const int K = 8;
    char subj[SWT_SUBJECT_MAX];
    natsConnection *nc;
    static const uint8_t garbage[] = {0xff, 0xff, 0xff, 0x01};

    sw_router_opts_init(&ro);
    ro.heartbeat_ms = 50;
    e->w.mode = M_PAUSE;
    e->w.k = 1;
    e->w.n = 2;
    e->w.delay_ms = 1200; /* silent for 1.2 s; inactivity is 4 * 50 + 500 = 700 ms */
    env_start(e, NULL, &ro);
    for (int i = 0; i < K; i++)
        s[i] = env_open(e);
    /* Garbage and a forged batch for unknown streams on the beats subject. */
    nc = sw_conn_nats(e->fc);
    assert_int_equal(swt_subject_beats(subj, sizeof(subj), sw_router_id(e->rt)), SW_OK);
    assert_int_equal(natsConnection_Publish(nc, subj, garbage, (int)sizeof(garbage)), NATS_OK);
    {
        /* Two unknown ids, and a real stream's id from the wrong instance. */
        swp_beats m = STREAMWIRE__V1__HEARTBEAT_BATCH__INIT;
        swp_beat b1 = STREAMWIRE__V1__STREAM_BEAT__INIT, b2 = STREAMWIRE__V1__STREAM_BEAT__INIT,
                 b3 = STREAMWIRE__V1__STREAM_BEAT__INIT;
        swp_beat *bp[3] = {&b1, &b2, &b3};
        uint8_t id1[16], id2[16], id3[16], buf[256];
        char hex[SW_REQUEST_ID_HEX];
        size_t len;
        random_id(id1, hex);
        random_id(id2, hex);
        assert_int_equal(swt_response_subject_id(sw_stream_request_id(s[0]), id3), -1);
        {
            char subj3[SWT_SUBJECT_MAX];
            assert_int_equal(
                swt_subject_response(subj3, sizeof(subj3), "x", sw_stream_request_id(s[0])), SW_OK);
            assert_int_equal(swt_response_subject_id(subj3, id3), 0);
        }
        b1.request_id.data = id1;
        b1.request_id.len = 16;
        b2.request_id.data = id2;
        b2.request_id.len = 16;
        b3.request_id.data = id3;
        b3.request_id.len = 16;
        b3.last_seq = 1000; /* would ask for a resend if it were believed */
        m.version = 1;
        m.instance_id = (char *)"forger";
        m.n_beats = 3;
        m.beats = bp;
        assert_int_equal(swp_encode(&m, buf, sizeof(buf), &len), SW_OK);
        assert_int_equal(natsConnection_Publish(nc, subj, buf, (int)len), NATS_OK);
    }
    for (int i = 0; i < K; i++) {
        got *g = new_got(e);
        sw_stream_stats ss;
        assert_true(collect(s[i], g, 0, T(15000)));
        assert_tokens(g, 2);
        assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
        sw_stream_stats_get(s[i], &ss);
        if (ss.heartbeats < 4) /* the first 50 ms in, then every 200 (700 - 500) */
            fail_msg("stream %d: %llu heartbeats in a 1.2 s pause at 50 ms, idle ones 200 apart", i,
                     (unsigned long long)ss.heartbeats);
        got_free(g);
    }
    sw_router_stats_get(e->rt, &rs);
    assert_int_equal(rs.bad_messages, 1);
    assert_true(rs.unknown_stream >= 3);
    {
        sw_stream_stats ss0;
        sw_stream_stats_get(s[0], &ss0);
        assert_int_equal(ss0.resend_requests, 0); /* the forged beat was not believed */
    }
    assert_int_equal(rs.terminals[SW_STATUS_COMPLETED], (uint64_t)K);
    ingress_stats(e, &st);
    assert_true(st.heartbeats >= (uint64_t)K * 5);
}

/* ======================================================================== */
/* 6. Loss repair                                                            */

static void
loss_repair(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_stream_stats ss;
    sw_ingress_stats st;
    sw_stream *s;
    const int N = 2000;

    e->w.mode = M_STREAM;
    e->w.n = N;
    env_start(e, NULL, NULL);
    swx_ingress_set_drop_rate(e->ing, 0.05);
    s = env_open(e);
    assert_true(collect(s, g, 0, T(60000)));
    assert_tokens(g, (size_t)N); /* each exactly once, in order */
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_done(g);
    sw_stream_stats_get(s, &ss);
    ingress_stats(e, &st);
    if (ss.resend_requests == 0 || st.items_resent == 0)
        fail_msg("no repair happened: resend_requests=%llu items_resent=%llu",
                 (unsigned long long)ss.resend_requests, (unsigned long long)st.items_resent);
    assert_int_equal(ss.items, (uint64_t)N);
    got_free(g);
}

/* The ingress caps a request's window at max_window (8 here; the router
 * asks for its default, 128). The stream must still flow: today the router
 * grants more credit only once consumed + window/2 >= credit granted
 * (8 + 64 < 128), the worker waits for credit after 8 items, and the send
 * times out (send_timeout_ms, shortened here) -- handler_returned after 8.
 * With loss on top, the worker must also keep every unacknowledged item for
 * resend, however much credit the frontend grants. */
static void
window_capped_common(env *e, double drop, int N)
{
    sw_ingress_opts io;
    got *g = new_got(e);
    sw_stream_stats ss;
    sw_ingress_stats st;
    sw_stream *s;

    sw_ingress_opts_init(&io);
    io.max_window = 8;
    io.send_timeout_ms = (unsigned)T(5000);
    e->w.mode = M_STREAM;
    e->w.n = N;
    env_start(e, &io, NULL);
    if (drop > 0)
        swx_ingress_set_drop_rate(e->ing, drop);
    s = env_open(e);
    assert_true(collect(s, g, 0, T(60000)));
    sw_stream_stats_get(s, &ss);
    ingress_stats(e, &st);
    if (g->status != SW_STATUS_COMPLETED)
        fail_msg("ended %s/%s after %zu of %d items (\"%s\"); resend_requests=%llu "
                 "items_resent=%llu; the handler's send failed with %s (%d sent)",
                 sw_status_name(g->status), g->reason, g->n, N, g->message,
                 (unsigned long long)ss.resend_requests, (unsigned long long)st.items_resent,
                 sw_err_name(e->w.stop_rv), wctx_get(&e->w, &e->w.sent));
    assert_tokens(g, (size_t)N);
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
}

static void
window_capped_by_ingress(void **state)
{
    window_capped_common(*state, 0.0, 200);
}

static void
loss_repair_window_capped(void **state)
{
    window_capped_common(*state, 0.05, 1000);
}

/* Finished streams leave the worker's table when the frontend acknowledges
 * their finals (ACK_FINALS, one message per worker for many streams), well
 * before the 2 s linger that would otherwise retire them. */
static void
acked_finals_release_worker_state(void **state)
{
    env *e = *state;
    sw_ingress_stats st;
    const int K = 12;
    int64_t t0;

    e->w.mode = M_STREAM;
    e->w.n = 5;
    env_start(e, NULL, NULL);
    for (int i = 0; i < K; i++) {
        got *g = new_got(e);
        sw_stream *s = env_open(e);
        assert_true(collect(s, g, 0, T(10000)));
        assert_tokens(g, 5);
        assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
        env_close(e, s);
        got_free(g);
    }
    t0 = now_ms();
    assert_int_equal(ist_wait(e, f_held_zero, 1, T(1500)), 1);
    if (now_ms() - t0 >= 1900)
        fail_msg("the worker let go of the streams only after %lld ms (linger, not acks)",
                 (long long)(now_ms() - t0));
    ingress_stats(e, &st);
    assert_int_equal(st.finished[SW_STATUS_COMPLETED], (uint64_t)K);
    assert_int_equal(st.items_resent, 0);
    assert_int_equal(st.streams_held, 0);
}

/* Opens a stream that heartbeats every hb_ms and reads it whole: n tokens
 * in order, then COMPLETED "stop" right after them, nothing more. */
static sw_stream *
read_completed(env *e, got *g, sw_duration hb_ms, int n)
{
    sw_request_opts o;
    sw_stream *s;
    ropts(e, &o);
    o.heartbeat_ms = hb_ms;
    s = env_open_with(e, &o, "prompt", 6);
    assert_true(collect(s, g, 0, T(10000)));
    assert_tokens(g, (size_t)n);
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_int_equal(g->term_seq, (uint64_t)n + 1);
    assert_done(g);
    return s;
}

/* A final lost on the way: the worker keeps heartbeating while its final is
 * unacknowledged, the frontend sees last_seq beyond what it has, asks for
 * the rest, and the stream still ends COMPLETED with every item. */
static void
lost_final_is_resent(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_stream *s;
    sw_ingress_stats st;
    sw_stream_stats ss;
    const int N = 7;

    e->w.mode = M_LOSE_FINAL;
    e->w.n = N;
    env_start(e, NULL, NULL);
    s = read_completed(e, g, 50, N);
    sw_stream_stats_get(s, &ss);
    assert_true(ss.resend_requests >= 1);
    assert_true(ss.heartbeats >= 1);
    ingress_stats(e, &st);
    assert_int_equal(st.items_sent, (uint64_t)N);
    assert_true(st.items_resent >= 1); /* the final */
    assert_int_equal(st.finished[SW_STATUS_COMPLETED], 1);
    assert_int_equal(ist_wait(e, f_held_zero, 1, T(1500)), 1);
    got_free(g);
}

/* The last item and the final queued, but no memory to build their message
 * (three tries fail: the producer's drain, for the item and then for the
 * final, and the timer's first): the stream is finished and silent, with
 * nothing published and heartbeats held back while items are queued. The
 * timer publishes them as soon as there is memory again -- before, a
 * finished stream's timer only sent heartbeats, so they waited out the
 * linger and the frontend ended the stream with a transport error instead
 * of COMPLETED. */
static void
stranded_final_is_published(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_stream *s;
    sw_ingress_stats st;
    sw_stream_stats ss;
    const int N = 6;

    e->w.mode = M_STRAND_FINAL;
    e->w.n = N;
    e->w.k = 3;
    e->w.delay_ms = 5;
    env_start(e, NULL, NULL);
    s = read_completed(e, g, 100, N);
    assert_true(wctx_wait(&e->w, &e->w.finished, 1, T(3000))); /* (recorded after finish returns) */
    assert_int_equal(wctx_get(&e->w, &e->w.finished), 1);
    assert_int_equal(e->w.finish_rv, SW_OK);
    sw_stream_stats_get(s, &ss);
    assert_int_equal(ss.resend_requests, 0); /* published by the timer, not repaired */
    ingress_stats(e, &st);
    assert_int_equal(st.items_sent, (uint64_t)N);
    assert_int_equal(st.items_resent, 0);
    assert_int_equal(st.finished[SW_STATUS_COMPLETED], 1);
    assert_int_equal(ist_wait(e, f_held_zero, 1, T(1500)), 1);
    got_free(g);
}

/* As above, and the final finds no memory to be kept for resend either,
 * while building a message keeps failing: the final is published at once,
 * unkept, ahead of the stranded last token, which the frontend's gap repair
 * then fetches from the resend ring. Before, the producer's finish tried to
 * publish the stranded token first and tried again at once for as long as
 * the builds failed, holding the stream's lock (here: 2^31 - 1 tries, a
 * hang). */
static void
unkept_final_does_not_spin(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_stream *s;
    sw_ingress_stats st;
    sw_stream_stats ss;
    const int N = 6;

    e->w.mode = M_STRAND_UNKEPT;
    e->w.n = N;
    e->w.k = INT_MAX; /* every first-publish build fails from the last token on */
    e->w.delay_ms = 5;
    env_start(e, NULL, NULL);
    s = read_completed(e, g, 100, N);
    /* (the handler's thread records finish's result after the call
     * returns: on a slow run the consumer can be done first) */
    assert_true(wctx_wait(&e->w, &e->w.finished, 1, T(3000)));
    assert_int_equal(wctx_get(&e->w, &e->w.finished), 1);
    assert_int_equal(e->w.finish_rv, SW_OK);
    sw_stream_stats_get(s, &ss);
    assert_true(ss.resend_requests >= 1); /* the last token, repaired */
    ingress_stats(e, &st);
    assert_int_equal(st.items_sent, (uint64_t)N - 1); /* the last token: never a first send, */
    assert_true(st.items_resent >= 1);                /* only the resend */
    assert_int_equal(st.finished[SW_STATUS_COMPLETED], 1);
    assert_int_equal(ist_wait(e, f_held_zero, 1, T(1500)), 1);
    got_free(g);
}

/* ======================================================================== */

int
main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        T_(heartbeats_keep_slow_stream_alive),
        T_(idle_heartbeats_spaced),
        T_(idle_heartbeats_tight_limit),
        T_(idle_beats_on_a_grid),
        T_(idle_heartbeat_then_loss_repaired_soon),
        T_(idle_beats_lost_probes_keep_alive),
        T_(idle_beats_lost_probes_unanswered),
        T_(idle_beats_lost_stream_not_known),
        T_(probe_answer_ahead_is_no_gap),
        T_(huge_heartbeat_asks_nothing),
        T_(heartbeat_batches),
        T_(loss_repair),
        T_(window_capped_by_ingress),
        T_(loss_repair_window_capped),
        T_(acked_finals_release_worker_state),
        T_(lost_final_is_resent),
        T_(stranded_final_is_published),
        T_(unkept_final_does_not_spin),
    };
    sf_filters(argc, argv);
    return cmocka_run_group_tests_name("streams.loss", tests, sf_group_setup, sf_group_teardown);
}
