/* tests/integration/test_flow.c -- end-to-end streams over a real
 * nats-server (issues 3 and 5), split from test_streams.c by theme:
 * flow control and consumers: credit, try_send/droppable, slow
 * consumers, cancel/kill/close mid-stream, 1000 concurrent streams, the
 * router's delivery backlog, a consumer that stops reading.
 * Fixture, threads and locks: streams_fixture.h. */
#include "streams_fixture.h"

#include "egress/chaos.h"

/* Consumer reads 3 items, cancels (mode 0), kills (1) or closes (2). */
static void
cancel_common(env *e, int how)
{
    got *g = new_got(e);
    sw_stream *s;
    sw_ingress_stats st;

    e->w.mode = M_STREAM;
    e->w.n = 100000;
    e->w.delay_ms = 2;
    env_start(e, NULL, NULL);
    s = env_open(e);
    assert_false(collect(s, g, 3, T(10000)));
    assert_int_equal(g->n, 3);
    if (how == 0)
        assert_int_equal(sw_stream_cancel(s), SW_OK);
    else if (how == 1)
        assert_int_equal(sw_stream_kill(s), SW_OK);
    else
        env_close(e, s);
    if (how != 2) {
        /* The very next item is the terminal: no data after the call. */
        assert_true(collect(s, g, 0, T(5000)));
        assert_tokens(g, 3);
        assert_terminal(g, SW_STATUS_CANCELLED, SW_OK, "cancelled");
        assert_done(g);
        assert_int_equal(sw_stream_cancel(s), SW_EEOF);
        assert_int_equal(sw_stream_kill(s), SW_EEOF);
    }
    /* The handler sees it: callback, flag, and send returning SW_ECANCELLED. */
    assert_true(wctx_wait(&e->w, &e->w.cancel_cb, 1, T(2000)));
    assert_true(wctx_wait(&e->w, &e->w.stopped, 1, T(2000)));
    assert_int_equal(e->w.stop_rv, SW_ECANCELLED);
    assert_int_equal(e->w.stop_saw_flag, 1);
    assert_true(wctx_wait(&e->w, &e->w.returned, 1, T(2000)));
    assert_true(wctx_wait(&e->w, &e->w.cancel_cb, 1, T(2000)));
    assert_int_equal(wctx_get(&e->w, &e->w.cancel_cb), 1);
    assert_int_equal(ist_wait(e, f_cancels, 1, T(2000)), 1);
    if (how == 1) {
        /* KILL: the worker drops the stream without any terminal. */
        sleep_ms(100);
        ingress_stats(e, &st);
        for (int i = 1; i <= 5; i++)
            assert_int_equal(st.finished[i], 0);
    } else {
        assert_int_equal(ist_wait(e, f_fin_cancelled, 1, T(2000)), 1);
        ingress_stats(e, &st);
        assert_int_equal(st.finished[SW_STATUS_FAILED], 0);
    }
    assert_int_equal(ist_wait(e, f_inflight_zero, 1, T(2000)), 1);
    got_free(g);
}

static void
cancel_mid_stream(void **state)
{
    cancel_common(*state, 0);
}

static void
kill_mid_stream(void **state)
{
    cancel_common(*state, 1);
}

static void
close_before_terminal_cancels(void **state)
{
    cancel_common(*state, 2);
}

/* An item the mux looked the stream up for under a request id the stream
 * has since left is dropped. That is a migration, on another thread,
 * moving the stream to a new request and worker between the lookup and
 * the feed: the item is the old worker's, and was taken for the new
 * worker's item of that seq (its bytes delivered in the new worker's
 * place, the new worker's dropped as a duplicate; an old final ended the
 * move as item_after_final). The same item under the current id is
 * delivered: the feed itself works. */
static void
item_under_a_left_id_is_dropped(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_stream *s;
    uint8_t id[16], left[16];
    e->w.mode = M_BLOCK; /* token-0, token-1, then waits */
    e->w.k = 2;
    e->w.n = 4;
    env_start(e, NULL, NULL);
    s = env_open(e);
    assert_false(collect(s, g, 2, T(5000)));
    assert_int_equal(g->n, 2);
    swx_stream_id(s, id);
    memcpy(left, id, sizeof(left));
    left[0] ^= 0xff;
    swx_stream_feed(s, left, 3, "the-old-worker-3");
    assert_false(collect(s, g, 3, T(300)));
    if (g->n != 2)
        fail_msg("an item looked up under an id the stream left was delivered: %s", g->data[2]);
    swx_stream_feed(s, id, 3, "current-3");
    assert_false(collect(s, g, 3, T(3000)));
    assert_int_equal(g->n, 3);
    assert_string_equal(g->data[2], "current-3");
    assert_int_equal(g->seq[2], 3);
    got_free(g);
}

/* Holds the feeder thread's swe_dispatch (a decision made, the stream's
 * lock released, nothing delivered yet) until released. */
typedef struct dispatch_hold {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t feeder;
    int armed, entered, released;
} dispatch_hold;

static void
hold_dispatch(sw_stream *s, void *arg)
{
    dispatch_hold *h = arg;
    (void)s;
    pthread_mutex_lock(&h->mu);
    if (h->armed && pthread_equal(h->feeder, pthread_self())) {
        int64_t until = now_ms() + T(5000);
        h->entered = 1;
        pthread_cond_broadcast(&h->cv);
        while (!h->released && now_ms() < until)
            cond_wait_until(&h->cv, &h->mu, until);
    }
    pthread_mutex_unlock(&h->mu);
}

typedef struct final_feed {
    sw_stream *s;
    uint8_t id[16];
    dispatch_hold *h;
} final_feed;

static void *
feed_final_main(void *arg)
{
    final_feed *f = arg;
    pthread_mutex_lock(&f->h->mu);
    f->h->feeder = pthread_self();
    f->h->armed = 1;
    pthread_mutex_unlock(&f->h->mu);
    swx_stream_feed_final(f->s, f->id, 3, SW_STATUS_COMPLETED, "stop");
    return NULL;
}

/* Once sw_stream_close returns, the item callback is never called again,
 * even when another thread had decided the stream's terminal and not yet
 * delivered it (the final arrived; its delivery waits for the lock the
 * closer holds, or is preempted): the callback's argument may be freed
 * right after close. That thread delivered the terminal after close
 * returned. Here the final is fed on a thread held between its decision
 * and its delivery while the stream is closed. */
static void
no_callback_after_close(void **state)
{
    env *e = *state;
    cbgot *c = new_cbgot(e);
    sw_request_opts o;
    sw_stream *s;
    dispatch_hold h;
    final_feed f;
    pthread_t t;
    int64_t until;
    size_t n_at_close;
    int terms_at_close;
    memset(&h, 0, sizeof(h));
    pthread_mutex_init(&h.mu, NULL);
    cond_init_mono(&h.cv);
    e->w.mode = M_BLOCK; /* token-0, token-1, then waits */
    e->w.k = 2;
    e->w.n = 4;
    env_start(e, NULL, NULL);
    swx_router_on_dispatch(e->rt, hold_dispatch, &h);
    ropts(e, &o);
    o.on_item = cb_item;
    o.on_item_arg = c;
    s = env_open_with(e, &o, "p", 1);
    for (until = now_ms() + T(5000);;) {
        size_t n;
        pthread_mutex_lock(&c->mu);
        n = c->g.n;
        pthread_mutex_unlock(&c->mu);
        if (n >= 2)
            break;
        assert_true(now_ms() < until);
        sleep_ms(5);
    }
    f.s = s;
    f.h = &h;
    swx_stream_id(s, f.id);
    assert_int_equal(pthread_create(&t, NULL, feed_final_main, &f), 0);
    pthread_mutex_lock(&h.mu);
    until = now_ms() + T(5000);
    while (!h.entered && now_ms() < until)
        cond_wait_until(&h.cv, &h.mu, until);
    pthread_mutex_unlock(&h.mu);
    if (!h.entered) {
        pthread_join(t, NULL);
        fail_msg("the final's delivery did not go through swe_dispatch");
    }
    env_close(e, s);
    pthread_mutex_lock(&c->mu);
    n_at_close = c->g.n;
    terms_at_close = c->g.terminals;
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_lock(&h.mu);
    h.released = 1;
    pthread_cond_broadcast(&h.cv);
    pthread_mutex_unlock(&h.mu);
    pthread_join(t, NULL);
    sleep_ms(100);
    swx_router_on_dispatch(e->rt, NULL, NULL);
    pthread_mutex_lock(&c->mu);
    assert_int_equal(n_at_close, 2);
    assert_int_equal(terms_at_close, 0); /* the final was decided, not delivered */
    if (c->g.n != n_at_close || c->g.terminals != terms_at_close)
        fail_msg("the item callback ran after sw_stream_close returned (%d terminal(s))",
                 c->g.terminals);
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_destroy(&h.mu);
    pthread_cond_destroy(&h.cv);
}

/* Cancel after the worker's final arrived, with items still queued (a short
 * stream inside the window, read slowly): no data after the call, and the
 * stream ends CANCELLED, not COMPLETED with items missing (streamwire.h,
 * sw_stream_cancel). Before, cancel returned SW_EEOF and the other 49 items
 * and COMPLETED followed it. */
static void
cancel_after_final_arrived(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_stream *s;
    sw_stream_stats ss;

    e->w.mode = M_STREAM;
    e->w.n = 50;
    e->w.delay_ms = 0;
    env_start(e, NULL, NULL);
    s = env_open(e);
    assert_true(wctx_wait(&e->w, &e->w.finished, 1, T(5000)));
    sleep_ms(200); /* the final reaches the router */
    sw_stream_stats_get(s, &ss);
    assert_int_equal(ss.pending, 50);
    assert_false(collect(s, g, 1, T(5000)));
    assert_int_equal(g->n, 1);
    assert_int_equal(sw_stream_cancel(s), SW_OK);
    assert_true(collect(s, g, 0, T(5000)));
    assert_tokens(g, 1); /* the one read before the cancel, nothing after */
    assert_terminal(g, SW_STATUS_CANCELLED, SW_OK, "cancelled");
    assert_done(g);
    assert_int_equal(sw_stream_cancel(s), SW_EEOF);
    got_free(g);
}

/* Cancel while the worker is blocked on credit (window 4, nobody reading). */
static void
cancel_wakes_blocked_send(void **state)
{
    env *e = *state;
    sw_request_opts o;
    got *g = new_got(e);
    sw_stream *s;

    e->w.mode = M_STREAM;
    e->w.n = 1000;
    env_start(e, NULL, NULL);
    ropts(e, &o);
    o.credit_window = 4;
    s = env_open_with(e, &o, "p", 1);
    assert_true(wctx_wait(&e->w, &e->w.sent, 4, T(5000)));
    sleep_ms(100);
    assert_int_equal(wctx_get(&e->w, &e->w.sent), 4); /* blocked on credit */
    assert_int_equal(sw_stream_cancel(s), SW_OK);
    assert_true(collect(s, g, 0, T(5000)));
    assert_int_equal(g->n, 0); /* the 4 queued items are not shown after cancel */
    assert_terminal(g, SW_STATUS_CANCELLED, SW_OK, "cancelled");
    assert_done(g);
    assert_true(wctx_wait(&e->w, &e->w.stopped, 1, T(2000)));
    assert_int_equal(e->w.stop_rv, SW_ECANCELLED);
    assert_true(wctx_wait(&e->w, &e->w.cancel_cb, 1, T(2000)));
    assert_int_equal(wctx_get(&e->w, &e->w.cancel_cb), 1);
    got_free(g);
}

/* sw_responder_send "blocks while the stream has no credit, until credit
 * arrives, the stream is cancelled, or the ingress send timeout passes":
 * SW_ETIMEDOUT (no credit in time). Window 4, send_timeout_ms 300, nobody
 * reads: the fifth send returns SW_ETIMEDOUT after the timeout and long
 * before anything else would end it, the stream is not cancelled by it, and
 * the handler, returning after it without a terminal, gets the FAILED
 * "handler_returned" final sent for it (sw_handler_fn): the consumer then
 * finds the 4 items and that terminal, nothing else. */
static void
send_times_out_without_credit(void **state)
{
    env *e = *state;
    sw_ingress_opts io;
    sw_request_opts o;
    sw_ingress_stats st;
    got *g = new_got(e);
    sw_stream *s;
    int64_t waited;

    sw_ingress_opts_init(&io);
    io.send_timeout_ms = 300;
    e->w.mode = M_STREAM;
    e->w.n = 1000;
    env_start(e, &io, NULL);
    ropts(e, &o);
    o.credit_window = 4;
    s = env_open_with(e, &o, "p", 1);
    assert_true(wctx_wait(&e->w, &e->w.sent, 4, T(5000)));
    assert_true(wctx_wait(&e->w, &e->w.stopped, 1, T(2000)));
    pthread_mutex_lock(&e->w.mu);
    waited = e->w.stop_ms;
    pthread_mutex_unlock(&e->w.mu);
    if (e->w.stop_rv != SW_ETIMEDOUT)
        fail_msg("the send without credit returned %s, want timed_out", sw_err_name(e->w.stop_rv));
    if (waited < 290 || waited >= T(1000))
        fail_msg("the send without credit returned after %lld ms, want 300 (send_timeout_ms)",
                 (long long)waited);
    assert_int_equal(e->w.stop_saw_flag, 0); /* a timeout is not a cancel */
    assert_int_equal(wctx_get(&e->w, &e->w.sent), 4);
    assert_true(wctx_wait(&e->w, &e->w.returned, 1, T(2000)));
    assert_int_equal(wctx_get(&e->w, &e->w.finished), 0);
    /* Now read: the 4 items in order, then the one terminal. */
    assert_true(collect(s, g, 0, T(5000)));
    assert_tokens(g, 4);
    assert_terminal(g, SW_STATUS_FAILED, SW_OK, "handler_returned");
    assert_int_equal(g->term_seq, 5);
    assert_done(g);
    sleep_ms(100);
    assert_int_equal(wctx_get(&e->w, &e->w.cancel_cb), 0);
    assert_int_equal(wctx_get(&e->w, &e->w.stopped), 1);
    ingress_stats(e, &st);
    assert_int_equal(st.items_sent, 4);
    assert_int_equal(st.credit_stalls, 1);
    assert_int_equal(st.cancels, 0);
    assert_int_equal(st.finished[SW_STATUS_FAILED], 1);
    for (int i = 1; i <= 5; i++)
        if (i != SW_STATUS_FAILED)
            assert_int_equal(st.finished[i], 0);
    got_free(g);
}

/* ======================================================================== */
/* 5. Flow control                                                           */

static void
slow_consumer_flow_control(void **state)
{
    env *e = *state;
    sw_request_opts o;
    got *g = new_got(e);
    sw_stream_stats ss;
    sw_router_stats rs;
    sw_ingress_stats st;
    sw_stream *s;
    const int N = g_slow > 1 ? 600 : 2000;
    const unsigned W = 16;

    e->w.mode = M_STREAM;
    e->w.n = N;
    env_start(e, NULL, NULL);
    ropts(e, &o);
    o.credit_window = W;
    s = env_open_with(e, &o, "p", 1);
    g->read_delay_ms = 1;
    assert_true(collect(s, g, 0, T(60000)));
    assert_tokens(g, (size_t)N);
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_done(g);
    sw_stream_stats_get(s, &ss);
    assert_int_equal(ss.items, (uint64_t)N);
    assert_true(ss.peak_pending >= 1);
    if (ss.peak_pending > W)
        fail_msg("peak_pending %llu > window %u", (unsigned long long)ss.peak_pending, W);
    assert_int_equal(ss.duplicates, 0);
    sw_router_stats_get(e->rt, &rs);
    /* Nothing was lost and repaired (nats_dropped cannot be non-zero: the
     * mux's pending queue is unlimited, flow control bounds it). */
    assert_int_equal(ss.resend_requests, 0);
    assert_int_equal(rs.items_after_final, 0);
    ingress_stats(e, &st);
    assert_int_equal(st.items_sent, (uint64_t)N);
    assert_int_equal(st.items_shed, 0);
    /* the handler outran a 1 ms-per-item consumer with a window of 16: its
     * sends waited for credit, and say so (at most once per send) */
    assert_true(st.credit_stalls > 0);
    assert_true(st.credit_stalls <= (uint64_t)N);
    got_free(g);
}

/* Waits (up to a second) until the worker's items_sent stops moving, and
 * returns it: what a worker sends while nobody reads. */
static uint64_t
wait_worker_stops(env *e)
{
    sw_ingress_stats st;
    uint64_t sent = 0;
    for (int i = 0; i < 50; i++) {
        uint64_t now_sent;
        sleep_ms(20);
        ingress_stats(e, &st);
        now_sent = st.items_sent;
        if (i > 5 && now_sent == sent)
            break;
        sent = now_sent;
    }
    return sent;
}

/* Window tuning with the defaults: a consumer that keeps up with a fast
 * worker grows its window past the first 256; when it stops reading, the
 * worker stops within the window (what it sent and was not taken stays
 * within it), and nothing is lost or reordered when it reads on. Then the
 * same with a worker whose max_window caps the growth at 512. */
static void
window_common(env *e, int capped)
{
    const size_t N = 60000, FIRST = 20000;
    {
        sw_ingress_opts io;
        got *g = new_got(e);
        sw_stream_stats ss;
        sw_stream *s;
        uint64_t sent = 0;
        sw_ingress_opts_init(&io);
        if (capped)
            io.max_window = 512;
        e->w.mode = M_STREAM;
        e->w.n = (int)N;
        env_start(e, &io, NULL);
        s = env_open(e);
        assert_false(collect(s, g, FIRST, T(30000)));
        assert_int_equal(g->n, FIRST);
        sw_stream_stats_get(s, &ss);
        if (ss.window <= 256 || ss.window > (capped ? 512u : SW_CREDIT_WINDOW_MAX_DEFAULT))
            fail_msg("window %llu after %zu items (capped %d)", (unsigned long long)ss.window,
                     FIRST, capped);
        /* stop reading: the worker stops at the credit it has */
        sent = wait_worker_stops(e);
        sw_stream_stats_get(s, &ss);
        if (sent - FIRST > ss.window || ss.pending > ss.window)
            fail_msg("stalled consumer: %llu sent past what it took, %llu queued, window %llu",
                     (unsigned long long)(sent - FIRST), (unsigned long long)ss.pending,
                     (unsigned long long)ss.window);
        assert_true(sent < N);
        assert_true(collect(s, g, 0, T(60000)));
        assert_tokens(g, N);
        assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
        assert_done(g);
        sw_stream_stats_get(s, &ss);
        assert_int_equal(ss.items, N);
        assert_int_equal(ss.duplicates + ss.resend_requests, 0);
        if (!capped) {
            /* A window the request sets itself stays fixed, however fast. */
            sw_request_opts o;
            got *g2 = new_got(e);
            ropts(e, &o);
            o.credit_window = 64;
            s = env_open_with(e, &o, "p", 1);
            assert_true(collect(s, g2, 0, T(60000)));
            assert_tokens(g2, N);
            sw_stream_stats_get(s, &ss);
            assert_int_equal(ss.window, 64);
        }
    }
}

static void
window_grows_and_still_bounds(void **state)
{
    window_common(*state, 0);
}

static void
window_growth_capped_by_the_worker(void **state)
{
    window_common(*state, 1);
}

/* Byte credit makes the memory bound hard (issue 17): a stream with a
 * window of 2,048 items (as large as a grown one; fixed here, so that the
 * case does not depend on timing) that gets 16 KiB items after small ones,
 * while its consumer has stopped, queues no more than credit_bytes (256 KiB
 * here) + one item: 17 items, not the window's worth. Without byte credit
 * the worker sent all 200 (3.2 MiB). Then everything arrives, in order,
 * intact. */
static void
byte_credit_bounds_large_items(void **state)
{
    env *e = *state;
    const size_t K = 1000, BIG = 200, LEN = 16384, BUDGET = 256 * 1024;
    sw_router_opts ro;
    sw_request_opts o;
    got *g = new_got(e);
    sw_stream_stats ss;
    sw_stream *s;
    uint64_t sent = 0;
    sw_router_opts_init(&ro);
    ro.credit_bytes = BUDGET;
    e->w.mode = M_BIG;
    e->w.k = (int)K;
    e->w.n = (int)(K + BIG);
    e->w.big_len = LEN;
    env_start(e, NULL, &ro);
    ropts(e, &o);
    o.credit_window = 2048;
    s = env_open_with(e, &o, "p", 1);
    assert_false(collect(s, g, K, T(30000)));
    assert_int_equal(g->n, K);
    /* stop reading: the worker stops at its byte credit */
    sent = wait_worker_stops(e);
    sw_stream_stats_get(s, &ss);
    if (sent - K > BUDGET / LEN + 1 || ss.pending > BUDGET / LEN + 1)
        fail_msg("stalled consumer, window %llu: %llu items of %zu B sent past what it took, "
                 "%llu queued; byte credit %zu",
                 (unsigned long long)ss.window, (unsigned long long)(sent - K), LEN,
                 (unsigned long long)ss.pending, BUDGET);
    assert_true(sent - K >= BUDGET / LEN); /* it did use the credit */
    assert_true(collect(s, g, 0, T(60000)));
    assert_int_equal(g->n, K + BIG);
    for (size_t i = 0; i < K + BIG; i++) {
        char want[32];
        int n = snprintf(want, sizeof(want), "token-%zu", i);
        assert_int_equal(g->seq[i], i + 1);
        if (i < K) {
            assert_string_equal(g->data[i], want);
        } else {
            assert_int_equal(strlen(g->data[i]), LEN);
            assert_memory_equal(g->data[i], want, (size_t)n);
            assert_int_equal(strspn(g->data[i] + n, "."), LEN - (size_t)n);
        }
    }
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_done(g);
}

/* Byte window tuning: a consumer that keeps up with a fast worker of 2 KiB
 * items grows the byte window from credit_bytes (64 KiB here) to
 * credit_bytes_max (256 KiB: 124 items, so the item window stays at its
 * first 256, its floor, and the bytes are what bind); when it stops
 * reading, the worker stops within the grown byte window (+ one item), and
 * everything arrives, in order, intact, when it reads on. */
static void
byte_window_grows_and_still_bounds(void **state)
{
    env *e = *state;
    const size_t K = 2000, N = 3000, LEN = 2048, BUDGET = 64 * 1024, MAX = 256 * 1024;
    sw_router_opts ro;
    got *g = new_got(e);
    sw_stream_stats ss;
    sw_stream *s;
    uint64_t sent;
    sw_router_opts_init(&ro);
    ro.credit_bytes = BUDGET;
    ro.credit_bytes_max = MAX;
    e->w.mode = M_BIG;
    e->w.k = 1;
    e->w.n = (int)N;
    e->w.big_len = LEN;
    env_start(e, NULL, &ro);
    s = env_open(e);
    assert_false(collect(s, g, K, T(30000)));
    assert_int_equal(g->n, K);
    sw_stream_stats_get(s, &ss);
    if (ss.window_bytes != MAX)
        fail_msg("after %zu items of %zu B taken as they came, the byte window is %llu, want %zu",
                 K, LEN, (unsigned long long)ss.window_bytes, MAX);
    assert_int_equal(ss.window, 256);
    sent = wait_worker_stops(e);
    sw_stream_stats_get(s, &ss);
    if (sent - K > MAX / LEN + 1 || ss.pending > MAX / LEN + 1)
        fail_msg("stalled consumer: %llu items of %zu B sent past what it took, %llu queued; "
                 "byte window %zu",
                 (unsigned long long)(sent - K), LEN, (unsigned long long)ss.pending, MAX);
    assert_true(sent - K > BUDGET / LEN + 1); /* it did use the grown window */
    assert_true(collect(s, g, 0, T(60000)));
    assert_int_equal(g->n, N);
    for (size_t i = 0; i < N; i++) {
        char want[32];
        int n = snprintf(want, sizeof(want), "token-%zu", i);
        assert_int_equal(g->seq[i], i + 1);
        if (i == 0) {
            assert_string_equal(g->data[i], want);
        } else {
            assert_int_equal(strlen(g->data[i]), LEN);
            assert_memory_equal(g->data[i], want, (size_t)n);
        }
    }
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_done(g);
}

/* credit_bytes_max below credit_bytes is a mistake, not a silent clamp. */
static void
byte_window_max_below_credit_bytes(void **state)
{
    env *e = *state;
    sw_router_opts ro;
    sw_router *r = NULL;
    e->fc = conn_open("itest-frontend");
    sw_router_opts_init(&ro);
    ro.credit_bytes = 1 << 20;
    ro.credit_bytes_max = (1 << 20) - 1;
    assert_int_equal(sw_router_create(&r, e->fc, &ro), SW_EINVAL);
    assert_null(r);
    ro.credit_bytes_max = 1 << 20; /* equal: a fixed byte window */
    assert_int_equal(sw_router_create(&r, e->fc, &ro), SW_OK);
    sw_router_destroy(r);
    /* above the default most, the rest as sw_router_opts_init leaves it:
     * the most is credit_bytes (a fixed byte window) */
    sw_router_opts_init(&ro);
    ro.credit_bytes = 8 << 20;
    assert_int_equal(sw_router_create(&r, e->fc, &ro), SW_OK);
    sw_router_destroy(r);
}

static void
try_send_and_droppable(void **state)
{
    env *e = *state;
    sw_request_opts o;
    got *g = new_got(e);
    sw_ingress_stats st;
    sw_stream *s;
    char exp[32];

    e->w.mode = M_TRY;
    e->w.n = 10;
    env_start(e, NULL, NULL);
    ropts(e, &o);
    o.credit_window = 4;
    s = env_open_with(e, &o, "p", 1);
    assert_true(wctx_wait(&e->w, &e->w.try_done, 1, T(5000)));
    assert_int_equal(e->w.nrv, 6);
    assert_int_equal(e->w.rv[0], SW_OK); /* droppable with credit: sent */
    assert_int_equal(e->w.rv[1], SW_OK);
    assert_int_equal(e->w.rv[2], SW_OK);
    assert_int_equal(e->w.rv[3], SW_OK);
    assert_int_equal(e->w.rv[4], SW_EAGAIN); /* window exhausted */
    assert_int_equal(e->w.rv[5], SW_OK);     /* droppable without credit: shed */
    ingress_stats(e, &st);
    assert_int_equal(st.items_shed, 1);
    /* Still no credit while nobody reads: the blocking send waits. */
    sleep_ms(100);
    assert_int_equal(wctx_get(&e->w, &e->w.sent), 0);
    assert_true(collect(s, g, 0, T(10000)));
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_done(g);
    /* metrics-a (droppable, seq 1), then every data item: token-0..token-9. */
    assert_int_equal(g->n, 11);
    assert_string_equal(g->data[0], "metrics-a");
    assert_int_equal(g->seq[0], 1);
    assert_int_equal(g->droppable[0], 1);
    for (size_t i = 1; i < 11; i++) {
        snprintf(exp, sizeof(exp), "token-%zu", i - 1);
        assert_string_equal(g->data[i], exp);
        assert_int_equal(g->seq[i], i + 1);
        assert_int_equal(g->droppable[i], 0);
    }
    ingress_stats(e, &st);
    assert_int_equal(st.items_shed, 1);
    got_free(g);
}

/* ======================================================================== */
/* 7. Scale                                                                  */

#define SC_NS 1000

typedef struct sc_stream {
    sw_stream *s;
    uint64_t next; /* next expected seq */
    int bad;       /* out-of-order, wrong content */
    int terminals;
    int status;
    int after_term;
    int64_t t_open, t_first, t_term; /* ms, for diagnostics */
} sc_stream;

typedef struct sc_ctx {
    env *e;
    sc_stream *v;
    int from, to;
    int open_failed;
} sc_ctx;

static pthread_mutex_t sc_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sc_cv;
static int sc_done;

static void
sc_cb(sw_stream *s, const sw_item *it, void *arg)
{
    sc_stream *x = arg;
    (void)s;
    if (x->terminals > 0) {
        x->after_term++;
        return;
    }
    if (it->kind == SW_ITEM_DATA) {
        char exp[32];
        if (x->next == 1)
            x->t_first = now_ms();
        int n = snprintf(exp, sizeof(exp), "token-%llu", (unsigned long long)(x->next - 1));
        if (it->seq != x->next || it->len != (size_t)n || memcmp(it->data, exp, (size_t)n) != 0)
            x->bad++;
        x->next++;
        return;
    }
    x->terminals++;
    x->status = it->terminal.status;
    x->t_term = now_ms();
    pthread_mutex_lock(&sc_mu);
    sc_done++;
    pthread_cond_broadcast(&sc_cv);
    pthread_mutex_unlock(&sc_mu);
}

static void *
sc_opener(void *arg)
{
    sc_ctx *c = arg;
    sw_request_opts o;
    sw_request_opts_init(&o);
    o.endpoint = EP;
    o.instance_id = sw_ingress_instance_id(c->e->ing);
    o.on_item = sc_cb;
    for (int i = c->from; i < c->to; i++) {
        o.on_item_arg = &c->v[i];
        c->v[i].t_open = now_ms();
        if (sw_router_open(&c->v[i].s, c->e->rt, &o, "p", 1) != SW_OK)
            c->open_failed++;
    }
    return NULL;
}

static void
env_scale_cleanup(env *e)
{
    sc_stream *v = e->scale_v;
    if (v == NULL)
        return;
    for (int i = 0; i < SC_NS; i++)
        sw_stream_close(v[i].s);
    free(v);
    e->scale_v = NULL;
    pthread_cond_destroy(&sc_cv);
}

static void
scale_1000_streams(void **state)
{
    env *e = *state;
    sw_ingress_opts io;
    sw_router_opts ro;
    sw_ingress_stats st;
    sw_router_stats rs;
    enum { NS = SC_NS, ITEMS = 100, OPENERS = 4 };
    sc_stream *v = calloc(NS, sizeof(*v));
    e->scale_v = v; /* teardown closes and frees */
    e->scale_cleanup = env_scale_cleanup;
    sc_ctx ctx[OPENERS];
    pthread_t th[OPENERS];
    int bad = 0, wrong_count = 0, wrong_term = 0, after = 0, not_completed = 0;
    int64_t until, t0 = now_ms();

    assert_non_null(v);
    cond_init_mono(&sc_cv);
    sc_done = 0;
    sw_ingress_opts_init(&io);
    io.handler_threads = 8;
    io.max_inflight = 2000;
    /* Default router options: the requirement is for the defaults. (Known
     * library bugs make this fail under load: false instance_lost from the
     * instance probes, and, under ASan, stream_incomplete from the router's
     * own delivery backlog; see instance_not_lost_while_streaming and
     * router_backlog_no_spurious_incomplete.) */
    sw_router_opts_init(&ro);
    e->w.mode = M_STREAM;
    e->w.n = ITEMS;
    env_start(e, &io, &ro);
    for (int i = 0; i < NS; i++)
        v[i].next = 1;
    for (int t = 0; t < OPENERS; t++) {
        ctx[t].e = e;
        ctx[t].v = v;
        ctx[t].from = t * NS / OPENERS;
        ctx[t].to = (t + 1) * NS / OPENERS;
        ctx[t].open_failed = 0;
        assert_int_equal(pthread_create(&th[t], NULL, sc_opener, &ctx[t]), 0);
    }
    for (int t = 0; t < OPENERS; t++) {
        pthread_join(th[t], NULL);
        assert_int_equal(ctx[t].open_failed, 0);
    }
    until = now_ms() + T(60000);
    pthread_mutex_lock(&sc_mu);
    while (sc_done < NS && now_ms() < until)
        cond_wait_until(&sc_cv, &sc_mu, until);
    pthread_mutex_unlock(&sc_mu);
    sleep_ms(50);
    for (int i = 0; i < NS; i++) {
        bad += v[i].bad;
        after += v[i].after_term;
        if (v[i].terminals != 1)
            wrong_term++;
        else if (v[i].status != SW_STATUS_COMPLETED)
            not_completed++;
        if (v[i].next != ITEMS + 1)
            wrong_count++;
    }
    print_message("scale: %d streams x %d items in %lld ms\n", NS, ITEMS,
                  (long long)(now_ms() - t0));
    sw_router_stats_get(e->rt, &rs);
    ingress_stats(e, &st);
    if (bad || wrong_count || wrong_term || after || not_completed) {
        int hist[8] = {0};
        for (int i = 0; i < NS; i++)
            if (v[i].terminals == 1 && v[i].status != SW_STATUS_COMPLETED) {
                hist[v[i].status & 7]++;
                if (hist[v[i].status & 7] <= 3)
                    print_message("stream %d: %s after %llu items (opened +%lld ms, "
                                  "first item +%lld, terminal +%lld)\n",
                                  i, sw_status_name(v[i].status),
                                  (unsigned long long)(v[i].next - 1),
                                  (long long)(v[i].t_open - t0),
                                  (long long)(v[i].t_first ? v[i].t_first - t0 : -1),
                                  (long long)(v[i].t_term - t0));
            }
        print_message("router terminals: completed=%llu incomplete=%llu failed=%llu "
                      "cancelled=%llu error=%llu; errors:",
                      (unsigned long long)rs.terminals[1], (unsigned long long)rs.terminals[2],
                      (unsigned long long)rs.terminals[3], (unsigned long long)rs.terminals[4],
                      (unsigned long long)rs.terminals[5]);
        for (int i = 100; i < 110; i++)
            print_message(" %s=%llu", sw_err_name(i),
                          (unsigned long long)sw_router_error_count(e->rt, i));
        print_message("\n");
        fail_msg("scale: done=%d bad=%d wrong_count=%d wrong_terminals=%d after_terminal=%d "
                 "not_completed=%d (errors: incomplete=%llu gap=%llu overloaded=%llu; "
                 "nats_dropped=%llu; ingress sent=%llu resent=%llu overload=%llu)",
                 sc_done, bad, wrong_count, wrong_term, after, not_completed,
                 (unsigned long long)sw_router_error_count(e->rt, SW_STREAM_INCOMPLETE),
                 (unsigned long long)sw_router_error_count(e->rt, SW_SEQUENCE_GAP),
                 (unsigned long long)sw_router_error_count(e->rt, SW_EOVERLOADED),
                 (unsigned long long)rs.nats_dropped, (unsigned long long)st.items_sent,
                 (unsigned long long)st.items_resent, (unsigned long long)st.rejected_overload);
    }
    assert_int_equal(rs.terminals[SW_STATUS_COMPLETED], NS);
    assert_int_equal(rs.open_streams, 0);
    assert_int_equal(rs.items_after_final, 0); /* (nats_dropped cannot fail: unlimited pending) */
    assert_int_equal(st.requests, NS);
    assert_int_equal(st.items_sent, (uint64_t)NS * ITEMS);
    assert_int_equal(ist_wait(e, f_fin_completed, NS, T(5000)), NS);
    env_scale_cleanup(e);
}

/* The router's inactivity timeout must measure the stream's silence, not
 * the router's own delivery backlog. A callback that takes 2 s on one item
 * (a frontend writing to a slow client) holds up the one delivery thread of
 * the router's mux subscription; stream B's items and heartbeats -- sent on
 * time by a live worker -- wait in the queue, and the timer thread ends B
 * (and A) with stream_incomplete after 4 * 250 + 500 ms. The same happens
 * without any slow callback when the mux backlog exceeds the timeout (the
 * 1000-stream test under ASan with default options: 20-60% of the streams,
 * all of whose items had been sent, ended stream_incomplete with 0 items).
 * router_backlog_never_ends_streams: then the backlog was excused for at
 * most 2 s, so a callback that held the thread for 8 s (10.5 s now) ended stream B
 * stream_incomplete after 1 of its 40 items, all of which and its final
 * waited in the router's queue. Silence is now judged up to the time the
 * router had handled all it received (egress/backlog.h). */
typedef struct slowcb {
    cbgot c; /* first: allocated and finalised as a cbgot by the fixture */
    int slept;
    int sleep_for; /* ms */
} slowcb;

static void
slow_cb_item(sw_stream *s, const sw_item *it, void *arg)
{
    slowcb *x = arg;
    if (it->kind == SW_ITEM_DATA && !x->slept) {
        x->slept = 1;
        sleep_ms(x->sleep_for);
    }
    cb_item(s, it, &x->c);
}

/* A callback that holds item 8 until the test releases it. */
typedef struct gatecb {
    cbgot c;              /* first: allocated and finalised as a cbgot by the fixture */
    int entered, release; /* (atomic) */
} gatecb;

static void
gate_cb_item(sw_stream *s, const sw_item *it, void *arg)
{
    gatecb *x = arg;
    if (it->kind == SW_ITEM_DATA && it->seq == 8) {
        __atomic_store_n(&x->entered, 1, __ATOMIC_RELEASE);
        for (int64_t until = now_ms() + T(10000);
             !__atomic_load_n(&x->release, __ATOMIC_ACQUIRE) && now_ms() < until;)
            sleep_ms(1);
    }
    cb_item(s, it, &x->c);
}

/* The swx_router_on_open_sent hook: holds sw_router_open until the worker
 * has sent the 16 items of its first credit. */
static void
hold_open_until_sent(sw_stream *s, void *arg)
{
    (void)s;
    (void)ist_wait(arg, f_items_sent, 16, T(5000));
}

/* A worker of 100 items, a stream of window 16 whose callback holds item
 * 8 until x->release; returns once item 8's callback runs. hook, if not
 * NULL, holds sw_router_open (swx_router_on_open_sent). */
static sw_stream *
gate_open(env *e, gatecb *x, void (*hook)(sw_stream *, void *))
{
    sw_request_opts o;
    sw_stream *s;
    e->w.mode = M_STREAM;
    e->w.n = 100;
    env_start(e, NULL, NULL);
    if (hook != NULL)
        swx_router_on_open_sent(e->rt, hook, e);
    ropts(e, &o);
    o.credit_window = 16;
    o.on_item = gate_cb_item;
    o.on_item_arg = x;
    s = env_open_with(e, &o, "p", 1);
    for (int64_t until = now_ms() + T(5000);
         !__atomic_load_n(&x->entered, __ATOMIC_ACQUIRE) && now_ms() < until;)
        sleep_ms(1);
    assert_true(__atomic_load_n(&x->entered, __ATOMIC_ACQUIRE));
    return s;
}

/* The credit an item frees reaches the worker when its callback returns
 * (streamwire.h, sw_item_fn). With a fixed window of 16, the first grant
 * comes due at item 8; while item 8's callback runs, the worker has the 16
 * items of its first credit and no more. Every item then arrives, in
 * order, once. */
static void
grant_after_callback(void **state)
{
    env *e = *state;
    sw_stream_stats ss;
    sw_stream *s;
    gatecb *x = (gatecb *)new_cbgot_sized(e, sizeof(gatecb));
    uint64_t sent;

    s = gate_open(e, x, NULL);
    (void)ist_wait(e, f_items_sent, 16, T(5000)); /* a worker slowed by load */
    sent = wait_worker_stops(e);
    __atomic_store_n(&x->release, 1, __ATOMIC_RELEASE);
    if (sent != 16)
        fail_msg("the worker sent %llu items while item 8's callback ran, want 16 (the first "
                 "credit: the grant item 8 earned waits for its callback)",
                 (unsigned long long)sent);
    assert_true(cb_wait(&x->c, T(20000)));
    assert_terminal(&x->c.g, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_tokens(&x->c.g, 100);
    sw_stream_stats_get(s, &ss);
    assert_int_equal(ss.items, 100);
    assert_int_equal(ss.window, 16);
    env_close(e, s);
}

/* The same grant, held back from a repeat: sw_router_open is held (the
 * chaos hook) until the worker has sent its 16 items, so they are
 * delivered from the router's ticker thread, and item 8's callback runs
 * there for a second while the receiving thread goes on. The stalled
 * worker's heartbeats (every 250 ms) report item 16 as its last, below the
 * credit item 8 earned: a repeat of that grant is due, and must wait for
 * the callback as the grant does. */
static void
grant_held_from_repeats(void **state)
{
    env *e = *state;
    sw_ingress_stats st;
    sw_stream *s;
    gatecb *x = (gatecb *)new_cbgot_sized(e, sizeof(gatecb));

    s = gate_open(e, x, hold_open_until_sent);
    sleep_ms(1000); /* four heartbeats of the stalled worker */
    ingress_stats(e, &st);
    __atomic_store_n(&x->release, 1, __ATOMIC_RELEASE);
    if (st.items_sent != 16)
        fail_msg("the worker sent %llu items while item 8's callback ran on the ticker, want 16 "
                 "(a repeat of the held grant went out)",
                 (unsigned long long)st.items_sent);
    assert_true(cb_wait(&x->c, T(20000)));
    assert_terminal(&x->c.g, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_tokens(&x->c.g, 100);
    env_close(e, s);
}

typedef struct cancel_call {
    sw_stream *s;
    cbgot *c;
    sw_err rv;
    size_t n_at_return; /* data items the consumer had when cancel returned */
    int returned;       /* (atomic) */
} cancel_call;

static void *
cancel_main(void *arg)
{
    cancel_call *k = arg;
    k->rv = sw_stream_cancel(k->s);
    pthread_mutex_lock(&k->c->mu);
    k->n_at_return = k->c->g.n;
    pthread_mutex_unlock(&k->c->mu);
    __atomic_store_n(&k->returned, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* sw_stream_cancel from another thread while an item callback of the
 * stream runs (streamwire.h): it waits for that callback to return, and no
 * data item is delivered after it returns; the next is the terminal
 * CANCELLED. Item 8's callback is held; 16 items are in (the first
 * credit), so 9..16 are queued when the cancel comes. */
static void
cancel_from_another_thread_waits_for_callback(void **state)
{
    env *e = *state;
    gatecb *x = (gatecb *)new_cbgot_sized(e, sizeof(gatecb));
    cancel_call k;
    pthread_t t;
    sw_stream *s = gate_open(e, x, NULL);
    (void)ist_wait(e, f_items_sent, 16, T(5000));
    memset(&k, 0, sizeof(k));
    k.s = s;
    k.c = &x->c;
    assert_int_equal(pthread_create(&t, NULL, cancel_main, &k), 0);
    sleep_ms(300);
    if (__atomic_load_n(&k.returned, __ATOMIC_ACQUIRE)) {
        __atomic_store_n(&x->release, 1, __ATOMIC_RELEASE);
        pthread_join(t, NULL);
        fail_msg("sw_stream_cancel returned while item 8's callback still ran");
    }
    __atomic_store_n(&x->release, 1, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
    assert_int_equal(k.rv, SW_OK);
    assert_int_equal(k.n_at_return, 8); /* item 8's callback had returned */
    assert_true(cb_wait(&x->c, T(5000)));
    cb_assert_clean(&x->c);
    pthread_mutex_lock(&x->c.mu);
    assert_int_equal(x->c.g.n, 8); /* nothing after the cancel returned */
    pthread_mutex_unlock(&x->c.mu);
    assert_tokens(&x->c.g, 8);
    assert_terminal(&x->c.g, SW_STATUS_CANCELLED, SW_OK, "cancelled");
    env_close(e, s);
}

/* Stream A, whose callback sleeps `sleep_ms` on its first item, and B, a
 * blocking consumer, from a live, steady worker (40 items 50 ms apart:
 * ~2 s a stream; heartbeat 250 ms: inactivity 1,500 ms), on a router made
 * with ro (NULL: the defaults): both complete with all 40 items. */
static void
backlog_both_complete(env *e, int sleep_ms, sw_router_opts *ro)
{
    sw_request_opts o;
    got *gb = new_got(e);
    sw_stream *a, *b;
    slowcb *x = (slowcb *)new_cbgot_sized(e, sizeof(slowcb));

    x->sleep_for = sleep_ms;
    e->w.mode = M_STREAM;
    e->w.n = 40;
    e->w.delay_ms = 50;
    env_start(e, NULL, ro);
    ropts(e, &o);
    o.on_item = slow_cb_item;
    o.on_item_arg = x;
    a = env_open_with(e, &o, "a", 1);
    b = env_open(e);
    assert_true(collect(b, gb, 0, T(30000)));
    assert_true(cb_wait(&x->c, T(30000)));
    assert_terminal(gb, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_tokens(gb, 40);
    assert_terminal(&x->c.g, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_tokens(&x->c.g, 40);
    env_close(e, a);
    env_close(e, b);
}

static void
router_backlog_no_spurious_incomplete(void **state)
{
    backlog_both_complete(*state, 2000, NULL);
}

/* The router's warnings: how many said it was behind. */
static int g_behind_warnings; /* (atomic) */

static void
behind_log(void *arg, sw_log_level level, const char *msg)
{
    (void)arg;
    if (level == SW_LOG_WARN && strstr(msg, "behind on what it received") != NULL)
        __atomic_add_fetch(&g_behind_warnings, 1, __ATOMIC_RELAXED);
}

/* (and a router that far behind says so, every 10 s) */
static void
router_backlog_never_ends_streams(void **state)
{
    sw_router_opts ro;
    __atomic_store_n(&g_behind_warnings, 0, __ATOMIC_RELAXED);
    sw_router_opts_init(&ro);
    ro.log = behind_log;
    backlog_both_complete(*state, 10500, &ro);
    assert_int_equal(__atomic_load_n(&g_behind_warnings, __ATOMIC_RELAXED), 1);
}

/* An instance that streams steadily is alive, whatever its control thread
 * is doing. Stream A's cancel callback takes 1.5 s; it runs on the ingress's
 * control-subscription thread, which is also the thread that answers the
 * router's instance probes. Stream B, on the same instance, keeps sending
 * items and heartbeats from its handler thread the whole time. B must
 * complete; the router must not declare the instance lost (probes time out
 * after 2 x 300 ms while B's items keep arriving). The same false positive
 * ends most of the 1000 streams of scale_1000_streams with instance_lost:
 * under load, probe answers queue behind data on the router's connection. */
static void
instance_not_lost_while_streaming(void **state)
{
    env *e = *state;
    sw_request_opts o;
    got *ga = new_got(e), *gb = new_got(e);
    sw_stream *a, *b;
    sw_router_stats rs;

    e->w.mode = M_STREAM;
    e->w.n = 100;
    e->w.delay_ms = 20; /* ~2 s */
    env_start(e, NULL, NULL);
    ropts(e, &o);
    a = env_open_with(e, &o, "slowcancel", 10);
    b = env_open(e);
    assert_false(collect(a, ga, 2, T(5000)));
    assert_int_equal(sw_stream_cancel(a), SW_OK);
    assert_true(collect(a, ga, 0, T(5000)));
    assert_terminal(ga, SW_STATUS_CANCELLED, SW_OK, "cancelled");
    assert_true(collect(b, gb, 0, T(20000)));
    sw_router_stats_get(e->rt, &rs);
    if (gb->status != SW_STATUS_COMPLETED)
        fail_msg("stream B ended %s/%s after %zu items (\"%s\"); router instances_lost=%llu",
                 sw_status_name(gb->status), gb->reason, gb->n, gb->message,
                 (unsigned long long)rs.instances_lost);
    assert_tokens(gb, 100);
    assert_int_equal(rs.instances_lost, 0);
    got_free(ga);
    got_free(gb);
}

static void
consumer_stops_reading_then_closes(void **state)
{
    env *e = *state;
    sw_request_opts o;
    sw_stream *s;

    e->w.mode = M_STREAM;
    e->w.n = 100000;
    env_start(e, NULL, NULL);
    ropts(e, &o);
    o.credit_window = 16;
    s = env_open_with(e, &o, "p", 1);
    assert_true(wctx_wait(&e->w, &e->w.sent, 16, T(5000)));
    sleep_ms(300); /* several heartbeat periods: still no credit */
    assert_int_equal(wctx_get(&e->w, &e->w.sent), 16);
    assert_int_equal(wctx_get(&e->w, &e->w.stopped), 0);
    env_close(e, s);
    assert_true(wctx_wait(&e->w, &e->w.stopped, 1, T(2000)));
    assert_int_equal(e->w.stop_rv, SW_ECANCELLED);
    assert_true(wctx_wait(&e->w, &e->w.cancel_cb, 1, T(2000)));
    assert_int_equal(wctx_get(&e->w, &e->w.cancel_cb), 1);
    assert_true(wctx_wait(&e->w, &e->w.returned, 1, T(2000)));
    assert_int_equal(ist_wait(e, f_inflight_zero, 1, T(2000)), 1);
}

/* ======================================================================== */

int
main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        T_(cancel_mid_stream),
        T_(kill_mid_stream),
        T_(close_before_terminal_cancels),
        T_(cancel_wakes_blocked_send),
        T_(cancel_after_final_arrived),
        T_(send_times_out_without_credit),
        T_(item_under_a_left_id_is_dropped),
        T_(no_callback_after_close),
        T_(cancel_from_another_thread_waits_for_callback),
        T_(slow_consumer_flow_control),
        T_(try_send_and_droppable),
        T_(window_grows_and_still_bounds),
        T_(window_growth_capped_by_the_worker),
        T_(byte_credit_bounds_large_items),
        T_(byte_window_grows_and_still_bounds),
        T_(byte_window_max_below_credit_bytes),
        T_(scale_1000_streams),
        T_(grant_after_callback),
        T_(grant_held_from_repeats),
        T_(router_backlog_no_spurious_incomplete),
        T_(router_backlog_never_ends_streams),
        T_(instance_not_lost_while_streaming),
        T_(consumer_stops_reading_then_closes),
    };
    sf_filters(argc, argv);
    return cmocka_run_group_tests_name("streams.flow", tests, sf_group_setup, sf_group_teardown);
}
