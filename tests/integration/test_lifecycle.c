/* tests/integration/test_lifecycle.c -- end-to-end streams over a real
 * nats-server (issues 3 and 5), split from test_streams.c by theme:
 * drain, destroy, close and teardown paths: drain within and
 * past grace, a worker vanishing, routers/ingress destroyed under open
 * streams, two routers on one instance, max streams, conn close.
 * Fixture, threads and locks: streams_fixture.h. */
#include "streams_fixture.h"
#include <streamwire/registry.h>
#include "egress/chaos.h"
#include "transport/chaos.h"
#include "transport/sw_transport.h"

/* ======================================================================== */
/* 9. Drain, and a consumer that stops reading                               */

static void
drain_within_grace(void **state)
{
    env *e = *state;
    got *g = new_got(e), *g2 = new_got(e);
    sw_stream *s, *s2;

    e->w.mode = M_STREAM;
    e->w.n = 10;
    e->w.delay_ms = 20;
    env_start(e, NULL, NULL);
    s = env_open(e);
    assert_true(wctx_wait(&e->w, &e->w.started, 1, T(5000)));
    assert_int_equal(sw_ingress_drain(e->ing, T(10000)), SW_OK);
    /* (finish() may not have returned to the handler yet when drain sees the
     * stream end, hence a wait rather than a read.) */
    assert_true(wctx_wait(&e->w, &e->w.finished, 1, T(2000)));
    assert_true(collect(s, g, 0, T(10000)));
    assert_tokens(g, 10);
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_done(g);
    /* A drained instance takes no new requests. */
    s2 = env_open(e);
    assert_true(collect(s2, g2, 0, T(10000)));
    assert_terminal(g2, SW_STATUS_ERROR, SW_NO_RESPONDERS, "no_responders");
    /* Idempotent. */
    assert_int_equal(sw_ingress_drain(e->ing, 0), SW_OK);
    got_free(g);
    got_free(g2);
}

static void
drain_past_grace_instance_lost(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_stream *s;
    sw_ingress_stats st;

    e->w.mode = M_BLOCK;
    e->w.k = 2;
    e->w.n = 4;
    env_start(e, NULL, NULL);
    s = env_open(e);
    assert_true(wctx_wait(&e->w, &e->w.sent, 2, T(5000)));
    assert_int_equal(sw_ingress_drain(e->ing, 300), SW_ETIMEDOUT);
    assert_true(collect(s, g, 0, T(10000)));
    assert_tokens(g, 2);
    assert_terminal(g, SW_STATUS_ERROR, SW_INSTANCE_LOST, "instance_lost");
    assert_done(g);
    /* The handler saw the cancellation. */
    assert_true(wctx_wait(&e->w, &e->w.stopped, 1, T(3000)));
    assert_int_equal(e->w.stop_saw_flag, 1);
    assert_int_equal(e->w.stop_rv, SW_ECANCELLED);
    /* finish and fail after it: SW_ECANCELLED (the header's), nothing sent */
    assert_int_equal(e->w.cancelled_finish_rv, SW_ECANCELLED);
    assert_int_equal(e->w.cancelled_fail_rv, SW_ECANCELLED);
    assert_true(wctx_wait(&e->w, &e->w.cancel_cb, 1, T(2000)));
    assert_int_equal(wctx_get(&e->w, &e->w.cancel_cb), 1);
    assert_true(wctx_wait(&e->w, &e->w.returned, 1, T(3000)));
    ingress_stats(e, &st);
    assert_int_equal(st.finished[SW_STATUS_FAILED], 0); /* no extra handler_returned */
    assert_int_equal(st.inflight, 0);
    got_free(g);
}

/* The worker vanishes mid-stream without a word (its NATS connection drops,
 * as when the process is SIGKILLed): the router's instance probes get "no
 * responders" and the consumer gets instance_lost after the items it had. */
static void
worker_vanishes_instance_lost(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_stream *s;
    sw_router_stats rs;

    e->w.mode = M_STREAM;
    e->w.n = 100000;
    e->w.delay_ms = 10;
    env_start(e, NULL, NULL);
    s = env_open(e);
    assert_false(collect(s, g, 3, T(10000)));
    natsConnection_Close((natsConnection *)sw_conn_nats(e->wc));
    assert_true(collect(s, g, 0, T(10000)));
    assert_terminal(g, SW_STATUS_ERROR, SW_INSTANCE_LOST, "instance_lost");
    assert_true(g->n >= 3);
    assert_token_prefix(g);
    assert_done(g);
    sw_router_stats_get(e->rt, &rs);
    assert_int_equal(rs.instances_lost, 1);
    assert_int_equal(rs.open_streams, 0);
}

/* ======================================================================== */
/* 10. Destroying things under open streams                                  */

/* sw_router_open racing sw_router_destroy: the open has published (the
 * chaos hook holds it there) when destroy ends every stream and returns;
 * the stream's terminal, decided by the destroy, is delivered once the
 * open returns. Before, the open left it for the router's ticker, stopped
 * by then: the item callback never got it, and the stream, the router and
 * the connection leaked. */
typedef struct openhold {
    env *e;
    sw_request_opts o;
    sw_stream *s;
    sw_err rv;
    atomic_int entered, release;
} openhold;

static void
hold_in_open(sw_stream *s, void *arg)
{
    openhold *h = arg;
    (void)s;
    atomic_store(&h->entered, 1);
    for (int64_t until = now_ms() + T(10000); !atomic_load(&h->release) && now_ms() < until;)
        sleep_ms(1);
}

static void *
open_thread(void *arg)
{
    openhold *h = arg;
    h->rv = sw_router_open(&h->s, h->e->rt, &h->o, "p", 1);
    return NULL;
}

static void
router_destroy_during_open(void **state)
{
    env *e = *state;
    cbgot *c = new_cbgot(e);
    openhold h;
    pthread_t th;

    memset(&h, 0, sizeof(h));
    e->w.mode = M_STREAM;
    e->w.n = 1000;
    e->w.delay_ms = 10;
    env_start(e, NULL, NULL);
    h.e = e;
    ropts(e, &h.o);
    h.o.on_item = cb_item;
    h.o.on_item_arg = c;
    swx_router_on_open_sent(e->rt, hold_in_open, &h);
    assert_int_equal(pthread_create(&th, NULL, open_thread, &h), 0);
    for (int64_t until = now_ms() + T(5000); !atomic_load(&h.entered) && now_ms() < until;)
        sleep_ms(1);
    assert_true(atomic_load(&h.entered));
    sw_router_destroy(e->rt); /* the stream ends "closed"; the open still runs */
    e->rt = NULL;
    atomic_store(&h.release, 1);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(h.rv, SW_OK);
    assert_true(cb_wait(c, T(5000)));
    assert_terminal(&c->g, SW_STATUS_ERROR, SW_ECLOSED, "closed");
    cb_assert_clean(c);
    sw_stream_close(h.s);
}

static void
router_destroy_with_open_streams(void **state)
{
    env *e = *state;
    sw_request_opts o;
    got *g1 = new_got(e), *g2 = new_got(e);
    sw_stream *s1, *s2, *s3;
    cbgot *c = new_cbgot(e);

    e->w.mode = M_BLOCK;
    e->w.k = 1;
    e->w.n = 2;
    env_start(e, NULL, NULL); /* 4 handler threads */
    s1 = env_open(e);
    s2 = env_open(e);
    ropts(e, &o);
    o.on_item = cb_item;
    o.on_item_arg = c;
    s3 = env_open_with(e, &o, "p", 1);
    assert_false(collect(s1, g1, 1, T(5000)));
    assert_false(collect(s2, g2, 1, T(5000)));
    assert_true(wctx_wait(&e->w, &e->w.sent, 3, T(5000)));
    {
        int64_t until = now_ms() + T(5000);
        for (;;) {
            size_t n;
            pthread_mutex_lock(&c->mu);
            n = c->g.n;
            pthread_mutex_unlock(&c->mu);
            if (n >= 1 || now_ms() > until)
                break;
            sleep_ms(5);
        }
    }
    sw_router_destroy(e->rt);
    e->rt = NULL;
    assert_true(collect(s1, g1, 0, T(5000)));
    assert_true(collect(s2, g2, 0, T(5000)));
    assert_true(cb_wait(c, T(5000)));
    assert_tokens(g1, 1);
    assert_tokens(g2, 1);
    assert_tokens(&c->g, 1);
    assert_terminal(g1, SW_STATUS_ERROR, SW_ECLOSED, "closed");
    assert_terminal(g2, SW_STATUS_ERROR, SW_ECLOSED, "closed");
    assert_terminal(&c->g, SW_STATUS_ERROR, SW_ECLOSED, "closed");
    assert_done(g1);
    assert_done(g2);
    cb_assert_clean(c);
    /* Streams stay valid objects until closed. */
    assert_int_equal(sw_stream_cancel(s1), SW_EEOF);
    assert_int_equal(strlen(sw_stream_request_id(s1)), 32);
    /* The workers were told. */
    assert_true(wctx_wait(&e->w, &e->w.stopped, 3, T(3000)));
    assert_int_equal(e->w.stop_rv, SW_ECANCELLED);
    env_close(e, s1);
    env_close(e, s2);
    env_close(e, s3);
    got_free(g1);
    got_free(g2);
}

/* Two frontends on one instance: each gets its own streams; destroying one
 * router cancels only its streams on the worker. */
static void
two_routers_one_instance(void **state)
{
    env *e = *state;
    sw_router_opts ro;
    sw_request_opts o;
    got *ga = new_got(e), *gb = new_got(e), *ga2 = new_got(e), *gb2 = new_got(e);
    sw_stream *a, *b, *a2, *b2 = NULL;
    sw_ingress_stats st;

    e->w.mode = M_STREAM;
    e->w.n = 30;
    e->w.delay_ms = 2;
    env_start(e, NULL, NULL);
    e->fc2 = conn_open("itest-frontend-2");
    sw_router_opts_init(&ro);
    assert_int_equal(sw_router_create(&e->rt2, e->fc2, &ro), SW_OK);
    assert_string_not_equal(sw_router_id(e->rt), sw_router_id(e->rt2));
    ropts(e, &o);
    a = env_open(e);
    assert_int_equal(sw_router_open(&b, e->rt2, &o, "p", 1), SW_OK);
    assert_true(collect(a, ga, 0, T(10000)));
    assert_true(collect(b, gb, 0, T(10000)));
    assert_tokens(ga, 30);
    assert_tokens(gb, 30);
    assert_terminal(ga, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_terminal(gb, SW_STATUS_COMPLETED, SW_OK, "stop");
    sw_stream_close(b);

    /* Now two long streams; router 1 goes away mid-stream. */
    e->w.n = 150;
    e->w.delay_ms = 10;
    a2 = env_open(e);
    assert_int_equal(sw_router_open(&b2, e->rt2, &o, "p", 1), SW_OK);
    assert_false(collect(a2, ga2, 5, T(10000)));
    sw_router_destroy(e->rt);
    e->rt = NULL;
    assert_true(collect(a2, ga2, 0, T(5000)));
    assert_terminal(ga2, SW_STATUS_ERROR, SW_ECLOSED, "closed");
    assert_token_prefix(ga2);
    assert_true(collect(b2, gb2, 0, T(20000)));
    sw_stream_close(b2);
    if (gb2->status != SW_STATUS_COMPLETED)
        fail_msg("router 2's stream ended %s/%s after %zu items (\"%s\")",
                 sw_status_name(gb2->status), gb2->reason, gb2->n, gb2->message);
    assert_tokens(gb2, 150);
    assert_int_equal(ist_wait(e, f_cancels, 1, T(2000)), 1);
    sleep_ms(100);
    ingress_stats(e, &st);
    assert_int_equal(st.cancels, 1);
    assert_int_equal(st.finished[SW_STATUS_COMPLETED], 3);
}

/* A terminal held by final_linger_ms when the router is destroyed: the
 * callback consumer must still get exactly one terminal (the header:
 * sw_router_destroy "ends every open stream (its consumer gets a
 * terminal)"), and nothing may leak. */
static void
router_destroy_during_final_linger(void **state)
{
    env *e = *state;
    sw_router_opts ro;
    sw_request_opts o;
    sw_stream *s;
    cbgot *c = new_cbgot(e);

    sw_router_opts_init(&ro);
    ro.final_linger_ms = 3000;
    e->w.mode = M_STREAM;
    e->w.n = 3;
    env_start(e, NULL, &ro);
    ropts(e, &o);
    o.on_item = cb_item;
    o.on_item_arg = c;
    s = env_open_with(e, &o, "p", 1);
    /* Items delivered, the final received and lingering. */
    assert_true(wctx_wait(&e->w, &e->w.finished, 1, T(5000)));
    {
        int64_t until = now_ms() + T(5000);
        size_t n = 0;
        while (now_ms() < until) {
            pthread_mutex_lock(&c->mu);
            n = c->g.n;
            pthread_mutex_unlock(&c->mu);
            if (n >= 3)
                break;
            sleep_ms(5);
        }
        assert_int_equal(n, 3);
    }
    sleep_ms(200);
    pthread_mutex_lock(&c->mu);
    assert_int_equal(c->g.terminals, 0); /* still lingering */
    pthread_mutex_unlock(&c->mu);
    sw_router_destroy(e->rt);
    e->rt = NULL;
    if (!cb_wait(c, T(5000)))
        fail_msg("sw_router_destroy during the final linger: the callback consumer never got "
                 "its terminal");
    cb_assert_clean(c);
    assert_tokens(&c->g, 3);
    env_close(e, s);
}

/* A failed sw_router_open never calls its callbacks (streamwire.h: "When
 * a function that takes a callback returns an error, the callback is never
 * called"). Opens in callback mode and in blocking mode with on_ready,
 * each with a heap argument freed right after the refusal, and checks that
 * nothing ran (under ASan a late call is a use after free). */
static int g_refused_calls; /* (atomic) */

static void
refused_item(sw_stream *s, const sw_item *it, void *arg)
{
    (void)s;
    (void)it;
    (void)arg;
    __atomic_add_fetch(&g_refused_calls, 1, __ATOMIC_RELAXED);
}

static void
refused_ready(sw_stream *s, void *arg)
{
    (void)s;
    (void)arg;
    __atomic_add_fetch(&g_refused_calls, 1, __ATOMIC_RELAXED);
}

static void
assert_open_refused(env *e, const sw_request_opts *base, sw_err want)
{
    for (int mode = 0; mode < 2; mode++) {
        sw_request_opts o = *base;
        sw_stream *s = NULL;
        int *arg = calloc(1, sizeof(*arg));
        assert_non_null(arg);
        if (mode == 0) {
            o.on_item = refused_item;
            o.on_item_arg = arg;
        } else {
            o.on_ready = refused_ready;
            o.on_ready_arg = arg;
        }
        assert_int_equal(sw_router_open(&s, e->rt, &o, "p", 1), want);
        assert_null(s);
        free(arg);
    }
    sleep_ms(200);
    assert_int_equal(__atomic_load_n(&g_refused_calls, __ATOMIC_RELAXED), 0);
}

/* max_streams: the next open is SW_EBUSY; a slot frees when a stream ends. */
static void
router_max_streams_busy(void **state)
{
    env *e = *state;
    sw_router_opts ro;
    sw_request_opts o;
    sw_stream *s1, *s2, *s3 = NULL;
    got *g = new_got(e);

    sw_router_opts_init(&ro);
    ro.max_streams = 2;
    e->w.mode = M_BLOCK;
    e->w.k = 0;
    e->w.n = 2;
    env_start(e, NULL, &ro);
    s1 = env_open(e);
    s2 = env_open(e);
    ropts(e, &o);
    assert_int_equal(sw_router_open(&s3, e->rt, &o, "p", 1), SW_EBUSY);
    assert_null(s3);
    assert_open_refused(e, &o, SW_EBUSY);
    o.migration_limit = -2; /* and an invalid option */
    assert_open_refused(e, &o, SW_EINVAL);
    o.migration_limit = 0;
    env_close(e, s1); /* cancel: frees the slot */
    s3 = env_open(e);
    wctx_open_gate(&e->w);
    assert_true(collect(s3, g, 0, T(10000)));
    assert_tokens(g, 2);
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    (void)s2; /* closed by teardown */
    got_free(g);
}

static void
ingress_destroy_with_retained_responder(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_stream *s;
    sw_responder *r;

    e->w.mode = M_KEEP;
    env_start(e, NULL, NULL);
    s = env_open(e);
    assert_true(wctx_wait(&e->w, &e->w.returned, 1, T(5000)));
    r = e->w.kept;
    assert_non_null(r);
    assert_int_equal(sw_responder_send(r, "token-0", 7), SW_OK);
    sw_ingress_destroy(e->ing);
    e->ing = NULL;
    assert_true(collect(s, g, 0, T(10000)));
    assert_tokens(g, 1);
    assert_terminal(g, SW_STATUS_ERROR, SW_INSTANCE_LOST, "instance_lost");
    assert_done(g);
    /* The retained responder is still a valid object; calls say closed. */
    assert_int_equal(sw_responder_cancelled(r), 1);
    assert_int_equal(strlen(sw_responder_request_id(r)), 32);
    {
        size_t plen = 0;
        const void *p = sw_responder_payload(r, &plen);
        assert_int_equal(plen, 6);
        assert_memory_equal(p, "prompt", 6);
    }
    {
        sw_err a = sw_responder_send(r, "x", 1);
        sw_err b = sw_responder_try_send(r, "x", 1);
        sw_err c = sw_responder_finish(r, SW_STATUS_COMPLETED, NULL);
        sw_err d = sw_responder_fail(r, "engine_error", "late");
        e->w.kept = NULL;
        sw_responder_release(r); /* frees it (ASan checks) */
        if (a != SW_ECLOSED || b != SW_ECLOSED || c != SW_ECLOSED || d != SW_ECLOSED)
            fail_msg("after sw_ingress_destroy: send=%s try_send=%s finish=%s fail=%s, "
                     "want closed for all (header: \"their calls return SW_ECLOSED\")",
                     sw_err_name(a), sw_err_name(b), sw_err_name(c), sw_err_name(d));
    }
    got_free(g);
}

/* sw_conn_close must not leave callbacks behind that use the freed sw_conn.
 * nats.c runs connection callbacks (disconnected, closed, async errors) on
 * one global async-callback thread, after natsConnection_Close has returned.
 * To make the window deterministic, another connection's disconnected
 * callback holds that thread for 300 ms while the sw_conn is closed; the
 * sw_conn's callbacks queue behind it. Before the fix in ebc6169 ASan
 * reported a heap-use-after-free in swt_on_disconnect here (and at random in
 * teardowns); without ASan it passes silently. Kept last: under ASan such a
 * report aborts the process. */
static void
sleepy_disconnected(natsConnection *nc, void *arg)
{
    (void)nc;
    sleep_ms(*(const int *)arg);
}

/* Every call the application gets from the connection (state changes and
 * log lines): none may come once sw_conn_close has returned. This makes the
 * test able to fail without ASan too (it used to assert nothing). A close
 * reports no RECONNECTING either (streamwire.h: "the server is lost"). */
static atomic_int close_cb_calls, close_saw_reconnecting;

static void
close_on_state(sw_conn *conn, sw_conn_state st, void *arg)
{
    (void)conn;
    (void)arg;
    if (st == SW_CONN_RECONNECTING)
        atomic_fetch_add(&close_saw_reconnecting, 1);
    atomic_fetch_add(&close_cb_calls, 1);
}

static void
close_on_log(void *arg, sw_log_level lvl, const char *msg)
{
    (void)lvl;
    (void)msg;
    (void)arg;
    atomic_fetch_add(&close_cb_calls, 1);
}

/* Closes a connection of its own while another connection's disconnected
 * callback holds nats.c's shared callback thread for *hold_ms, then waits
 * late_ms for callbacks that come after the close returned. Returns the
 * application's calls in all; *at_close: those made before the return. */
static int
close_behind_a_slow_callback(const int *hold_ms, long late_ms, int *at_close)
{
    natsOptions *no = NULL;
    natsConnection *blocker = NULL;
    sw_conn_opts co;
    sw_conn *c = NULL;
    int64_t t0;
    int total;

    atomic_store(&close_cb_calls, 0);
    atomic_store(&close_saw_reconnecting, 0);
    assert_int_equal(natsOptions_Create(&no), NATS_OK);
    assert_int_equal(natsOptions_SetURL(no, g_nats.url), NATS_OK);
    assert_int_equal(natsOptions_SetDisconnectedCB(no, sleepy_disconnected, (void *)hold_ms),
                     NATS_OK);
    assert_int_equal(natsConnection_Connect(&blocker, no), NATS_OK);
    sw_conn_opts_init(&co);
    co.url = g_nats.url;
    co.name = "itest-close";
    co.on_state = close_on_state;
    co.log = close_on_log;
    assert_int_equal(sw_conn_open(&c, &co), SW_OK);
    natsConnection_Close(blocker); /* the shared callback thread sleeps */
    t0 = now_ms();
    sw_conn_close(c); /* its callbacks queue behind */
    print_message("    sw_conn_close returned after %lld ms\n", (long long)(now_ms() - t0));
    *at_close = atomic_load(&close_cb_calls);
    sleep_ms(late_ms); /* ...anything late would run now */
    total = atomic_load(&close_cb_calls);
    natsConnection_Destroy(blocker);
    natsOptions_Destroy(no);
    return total;
}

static void
conn_close_no_callback_after_free(void **state)
{
    static const int hold_ms = 300;
    int at_close, total;
    (void)state;
    total = close_behind_a_slow_callback(&hold_ms, (long)T(600), &at_close);
    assert_int_equal(total, at_close);
    assert_true(at_close >= 1); /* the CLOSED state, at least, came before the return */
    assert_int_equal(atomic_load(&close_saw_reconnecting), 0);
}

/* The same with the shared callback thread held past sw_conn_close's 5 s
 * wait for its closed callback: the close returns without it (reporting
 * CLOSED itself), and the callbacks that run later find the connection's
 * memory (kept until the closed one) and tell the application nothing.
 * Before, the connection was freed under them (ASan: use after free), and
 * a deliberate close reported RECONNECTING first. */
static void
conn_close_outwaited_by_a_slow_callback(void **state)
{
    static const int hold_ms = 6000;
    int at_close, total;
    (void)state;
    total = close_behind_a_slow_callback(&hold_ms, 1500, &at_close);
    assert_int_equal(total, at_close);
    assert_int_equal(atomic_load(&close_saw_reconnecting), 0);
}

/* Waits until n items are queued for s's consumer (they reached the
 * frontend); 1, or 0 on timeout. */
static int
wait_pending(sw_stream *s, uint64_t n, int64_t timeout_ms)
{
    for (int64_t until = now_ms() + timeout_ms;; sleep_ms(2)) {
        sw_stream_stats st;
        sw_stream_stats_get(s, &st);
        if (st.pending >= n)
            return 1;
        if (now_ms() > until)
            return 0;
    }
}

/* sw_conn_close before the objects created on the connection (the order
 * the header asks for, the other way round): each keeps the memory it
 * uses until it is destroyed, so this is no use after free (the ASan
 * build stops here on the old code) and no hang. The frontend's
 * connection: its stream ends with SW_ECLOSED at once (it waited for ever:
 * silence is not judged while the router's own connection is down), a
 * new request is refused with SW_ECLOSED, and teardown destroys the
 * router after its connection. */
static void
conn_closed_before_its_router(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_stream *s, *s2 = NULL;
    sw_request_opts o;

    e->w.mode = M_STREAM;
    e->w.n = 100000;
    e->w.delay_ms = 10;
    env_start(e, NULL, NULL);
    s = env_open(e);
    assert_false(collect(s, g, 3, T(10000)));
    sw_conn_close(e->fc);
    e->fc = NULL;
    assert_true(collect(s, g, 0, T(10000)));
    assert_terminal(g, SW_STATUS_ERROR, SW_ECLOSED, "closed");
    assert_non_null(strstr(g->message, "connection is closed"));
    assert_true(g->n >= 3);
    assert_token_prefix(g);
    assert_done(g);
    ropts(e, &o);
    assert_int_equal(sw_router_open(&s2, e->rt, &o, "p", 1), SW_ECLOSED);
    assert_null(s2);
    assert_open_refused(e, &o, SW_ECLOSED);
}

/* The worker's connection closed under an ingress whose handler waits for
 * credit (a window of 4 that nobody reads): the wait ends within
 * moments with SW_ECANCELLED and the cancel callback, as for a frontend
 * that is gone (it waited out send_timeout_ms, 30 s, and a send after the
 * close could even return SW_OK); the frontend's stream ends with
 * instance_lost. Teardown destroys the ingress after its connection; a
 * registry on a third connection is closed after it too. */
static void
conn_closed_before_its_ingress(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_stream *s;
    sw_request_opts o;
    sw_conn *rc;
    sw_registry *reg = NULL;
    sw_registry_opts go;
    int64_t t0;

    e->w.mode = M_STREAM;
    e->w.n = 100000;
    env_start(e, NULL, NULL);
    ropts(e, &o);
    o.credit_window = 4;
    s = env_open_with(e, &o, "prompt", 6);
    assert_int_equal(ist_wait(e, f_credit_stalls, 1, T(5000)), 1);
    assert_true(wait_pending(s, 4, T(5000))); /* all four left before the close */
    assert_int_equal(wctx_get(&e->w, &e->w.stopped), 0);
    t0 = now_ms();
    sw_conn_close(e->wc);
    e->wc = NULL;
    assert_true(wctx_wait(&e->w, &e->w.stopped, 1, T(5000)));
    assert_true(now_ms() - t0 < T(5000));
    assert_int_equal(e->w.stop_rv, SW_ECANCELLED);
    /* the callback may come just after the send returned; once */
    assert_true(wctx_wait(&e->w, &e->w.cancel_cb, 1, T(5000)));
    sleep_ms(T(100));
    assert_int_equal(wctx_get(&e->w, &e->w.cancel_cb), 1);
    assert_true(wctx_wait(&e->w, &e->w.returned, 1, T(5000)));
    assert_true(collect(s, g, 0, T(10000)));
    assert_tokens(g, 4);
    assert_terminal(g, SW_STATUS_ERROR, SW_INSTANCE_LOST, "instance_lost");
    assert_done(g);

    rc = conn_open("itest-reg-close");
    sw_registry_opts_init(&go);
    go.bucket = "lifecycle_conn_close";
    assert_int_equal(sw_registry_open(&reg, rc, &go), SW_OK);
    sw_conn_close(rc);
    sw_registry_close(reg); /* its watch and ticker stop; nothing is left */
}

/* The other way a connection closes for good: its server is gone and
 * nats.c runs out of reconnects (max_reconnect 2 on both sides). The
 * worker's handler waits for credit (a window of 4, nobody reads); the
 * frontend's stream has no deadline. Once the connections are closed the
 * worker's wait ends with SW_ECANCELLED (it waited out send_timeout_ms,
 * 30 s) and the stream ends with SW_ECLOSED after its 4 items (it waited
 * for ever: silence is not judged on a connection that is down). Its own
 * nats-server, so that stopping it disturbs no other test. */
static void
reconnects_run_out_streams_end(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_stream *s;
    swh_nats n;
    sw_conn_opts co;
    sw_ingress_opts io;
    sw_router_opts ro;
    sw_request_opts o;
    int64_t t0;
    size_t maxp;

    assert_int_equal(swh_nats_start(&n, NULL), 0);
    sw_conn_opts_init(&co);
    co.url = n.url;
    co.max_reconnect = 2;
    co.reconnect_wait_ms = 100;
    co.name = "itest-worker-own";
    assert_int_equal(sw_conn_open(&e->wc, &co), SW_OK);
    co.name = "itest-frontend-own";
    assert_int_equal(sw_conn_open(&e->fc, &co), SW_OK);
    sw_ingress_opts_init(&io);
    io.endpoint = EP;
    io.handler = test_handler;
    io.handler_arg = &e->w;
    assert_int_equal(sw_ingress_start(&e->ing, e->wc, &io), SW_OK);
    sw_router_opts_init(&ro);
    assert_int_equal(sw_router_create(&e->rt, e->fc, &ro), SW_OK);
    e->w.mode = M_STREAM;
    e->w.n = 100000;
    ropts(e, &o);
    o.credit_window = 4;
    s = env_open_with(e, &o, "prompt", 6);
    assert_int_equal(ist_wait(e, f_credit_stalls, 1, T(5000)), 1);
    assert_true(wait_pending(s, 4, T(5000)));
    maxp = sw_conn_max_payload(e->wc);
    assert_int_equal(maxp, 1024 * 1024); /* nats-server's default */
    t0 = now_ms();
    swh_nats_stop(&n);
    assert_true(wctx_wait(&e->w, &e->w.stopped, 1, T(10000)));
    assert_int_equal(e->w.stop_rv, SW_ECANCELLED);
    assert_int_equal(sw_conn_status(e->wc), SW_CONN_CLOSED);
    assert_true(collect(s, g, 0, T(10000)));
    assert_tokens(g, 4);
    assert_terminal(g, SW_STATUS_ERROR, SW_ECLOSED, "closed");
    assert_int_equal(sw_conn_status(e->fc), SW_CONN_CLOSED);
    assert_true(now_ms() - t0 < T(10000));
    assert_done(g);
    /* closed for good: the last server's limit, not 0 (streamwire.h) */
    assert_int_equal(sw_conn_max_payload(e->wc), maxp);
    assert_int_equal(sw_conn_max_payload(NULL), 0);
}

/* A subscription whose completion callback cannot be set (the connection
 * closed between nats.c's subscribe and that call) while its handler is
 * already running on a first message: swt_subscribe fails, but only once
 * that handler has returned, and no handler runs after (its arg is the
 * caller's, gone once the error is back). Before, the subscription was
 * freed at once, under the running handler. */
typedef struct subrace {
    atomic_int calls, stop;
    sw_conn *pub;
} subrace;

static void
subrace_cb(const swt_msg *m, void *arg)
{
    subrace *r = arg;
    (void)m;
    sleep_ms(100);
    atomic_fetch_add(&r->calls, 1);
}

static void *
subrace_pub(void *arg)
{
    subrace *r = arg;
    while (!atomic_load(&r->stop)) {
        (void)swt_publish_plain(r->pub, "itest.subrace", NULL, "x", 1);
        sleep_ms(2);
    }
    return NULL;
}

static void
subscribe_fails_under_a_handler(void **state)
{
    sw_conn_opts co;
    sw_conn *c = NULL;
    swt_sub *sub = NULL;
    subrace r;
    pthread_t th;
    int n;
    (void)state;
    memset(&r, 0, sizeof(r));
    sw_conn_opts_init(&co);
    co.url = g_nats.url;
    assert_int_equal(sw_conn_open(&c, &co), SW_OK);
    assert_int_equal(sw_conn_open(&r.pub, &co), SW_OK);
    assert_int_equal(pthread_create(&th, NULL, subrace_pub, &r), 0);
    swx_conn_fail_sub_complete(c, 1);
    assert_int_not_equal(swt_subscribe(c, &sub, "itest.subrace", subrace_cb, &r), SW_OK);
    assert_null(sub);
    n = atomic_load(&r.calls);
    assert_int_equal(n, 1); /* the running handler returned first */
    sleep_ms((long)T(400));
    assert_int_equal(atomic_load(&r.calls), n); /* and none ran after */
    /* the connection subscribes as before */
    assert_int_equal(swt_subscribe(c, &sub, "itest.subrace", subrace_cb, &r), SW_OK);
    for (int64_t until = swh_now_ms() + T(5000); atomic_load(&r.calls) == n;) {
        assert_true(swh_now_ms() < until);
        sleep_ms(5);
    }
    atomic_store(&r.stop, 1);
    pthread_join(th, NULL);
    swt_sub_close(c, &sub);
    sw_conn_close(c);
    sw_conn_close(r.pub);
}

/* A subscription keeps the messages it handled and destroys them a batch
 * at a time (one wake-up of nats.c's garbage collector per batch, not per
 * message): at 32 messages, at 256 KiB, or once swt_conn_trim finds that
 * none came since its previous call. Nothing is kept past that, and what
 * is kept at close is freed (the sanitizer builds check the leak). */
typedef struct keepcount {
    atomic_int calls;
} keepcount;

static void
keep_cb(const swt_msg *m, void *arg)
{
    keepcount *k = arg;
    (void)m;
    atomic_fetch_add(&k->calls, 1);
}

/* Publishes n messages of size bytes and waits until the callback has seen
 * them and the subscription keeps `kept` (it keeps a message after its
 * callback returns). */
static void
keep_publish(sw_conn *pub, swt_sub *sub, keepcount *k, int n, size_t size, unsigned kept)
{
    static uint8_t buf[300 * 1024];
    int want = atomic_load(&k->calls) + n;
    int64_t until = swh_now_ms() + T(5000);
    for (int i = 0; i < n; i++)
        assert_int_equal(swt_publish_plain(pub, "itest.keep", NULL, buf, size), SW_OK);
    assert_int_equal(swt_flush(pub, T(2000)), SW_OK);
    while (atomic_load(&k->calls) < want || swt_sub_kept(sub) != kept) {
        if (swh_now_ms() > until)
            fail_msg("after %d of %d messages the subscription keeps %u, not %u",
                     atomic_load(&k->calls), want, swt_sub_kept(sub), kept);
        sleep_ms(2);
    }
}

static void
handled_messages_kept_in_batches(void **state)
{
    sw_conn_opts co;
    sw_conn *c = NULL, *pub = NULL;
    swt_sub *sub = NULL;
    keepcount k;
    int64_t t1;
    (void)state;
    atomic_init(&k.calls, 0);
    sw_conn_opts_init(&co);
    co.url = g_nats.url;
    assert_int_equal(sw_conn_open(&c, &co), SW_OK);
    assert_int_equal(sw_conn_open(&pub, &co), SW_OK);
    assert_int_equal(swt_subscribe(c, &sub, "itest.keep", keep_cb, &k), SW_OK);
    assert_int_equal(swt_flush(c, T(2000)), SW_OK);

    keep_publish(pub, sub, &k, 5, 10, 5);
    sleep_ms(6);
    t1 = now_ms();
    swt_conn_trim(c); /* messages came since the last pass: kept */
    assert_int_equal(swt_sub_kept(sub), 5);
    swt_conn_trim(c); /* within 5 ms of that pass: no pass */
    /* (unless this thread lost the CPU for 5 ms in between: then it was a
     * pass, rightly, and there is nothing to check) */
    if (now_ms() - t1 < 4)
        assert_int_equal(swt_sub_kept(sub), 5);
    sleep_ms(6);
    swt_conn_trim(c); /* none since: destroyed */
    assert_int_equal(swt_sub_kept(sub), 0);
    assert_int_equal(swt_conn_kept(c), 0);

    keep_publish(pub, sub, &k, 40, 10, 8);        /* a batch of 32 goes, 8 stay */
    keep_publish(pub, sub, &k, 1, 300 * 1024, 0); /* over 256 KiB: all go at once */
    keep_publish(pub, sub, &k, 3, 10, 3);
    sleep_ms(50); /* and stay */
    assert_int_equal(swt_sub_kept(sub), 3);
    assert_int_equal(atomic_load(&k.calls), 49);
    swt_sub_close(c, &sub); /* frees the 3 */
    sw_conn_close(c);
    sw_conn_close(pub);
}

/* The timing taps (swt_conn_set_tap, the bench's latency breakdown): a
 * publishing connection's tap sees each publish begin and end, in order,
 * with the bytes that go out; a receiving connection's tap sees each
 * message, with its bytes, on the thread that then runs the
 * subscription's callback, before it. Once cleared, a tap sees nothing
 * more. */
#define TAP_MAX 16
typedef struct taplog {
    pthread_mutex_t mu;
    int n;
    swt_tap_point at[TAP_MAX];
    size_t len[TAP_MAX];
    char first[TAP_MAX];
    int calls_then[TAP_MAX]; /* callbacks run when the tap ran */
    pthread_t thread[TAP_MAX];
    atomic_int *calls;
} taplog;

static void
tap_rec(void *arg, swt_tap_point at, const uint8_t *data, size_t len)
{
    taplog *t = arg;
    pthread_mutex_lock(&t->mu);
    if (t->n < TAP_MAX) {
        t->at[t->n] = at;
        t->len[t->n] = len;
        t->first[t->n] = len > 0 ? (char)data[0] : 0;
        t->calls_then[t->n] = atomic_load(t->calls);
        t->thread[t->n] = pthread_self();
    }
    t->n++;
    pthread_mutex_unlock(&t->mu);
}

typedef struct tapsub {
    atomic_int calls;
    pthread_t thread[TAP_MAX];
} tapsub;

static void
tap_sub_cb(const swt_msg *m, void *arg)
{
    tapsub *k = arg;
    int i = atomic_load(&k->calls);
    (void)m;
    if (i < TAP_MAX)
        k->thread[i] = pthread_self();
    atomic_fetch_add(&k->calls, 1);
}

static void
timing_taps_see_each_message(void **state)
{
    static const char *msgs[3] = {"a", "bb", "ccc"};
    sw_conn_opts co;
    sw_conn *rx = NULL, *pub = NULL;
    swt_sub *sub = NULL;
    tapsub k;
    taplog tp, tr;
    (void)state;
    memset(&k, 0, sizeof(k));
    memset(&tp, 0, sizeof(tp));
    memset(&tr, 0, sizeof(tr));
    pthread_mutex_init(&tp.mu, NULL);
    pthread_mutex_init(&tr.mu, NULL);
    tp.calls = tr.calls = &k.calls;
    sw_conn_opts_init(&co);
    co.url = g_nats.url;
    assert_int_equal(sw_conn_open(&rx, &co), SW_OK);
    assert_int_equal(sw_conn_open(&pub, &co), SW_OK);
    assert_int_equal(swt_subscribe(rx, &sub, "itest.tap", tap_sub_cb, &k), SW_OK);
    assert_int_equal(swt_flush(rx, T(2000)), SW_OK);
    swt_conn_set_tap(pub, tap_rec, &tp);
    swt_conn_set_tap(rx, tap_rec, &tr);
    for (int i = 0; i < 3; i++)
        assert_int_equal(swt_publish(pub, "itest.tap", NULL, msgs[i], strlen(msgs[i])), SW_OK);
    assert_int_equal(swt_flush(pub, T(2000)), SW_OK);
    for (int64_t until = swh_now_ms() + T(5000); atomic_load(&k.calls) < 3;) {
        assert_true(swh_now_ms() < until);
        sleep_ms(2);
    }
    pthread_mutex_lock(&tp.mu);
    assert_int_equal(tp.n, 6); /* the flush's PING is not a publish */
    for (int i = 0; i < 6; i++) {
        assert_int_equal(tp.at[i], i % 2 == 0 ? SWT_TAP_PUB_BEGIN : SWT_TAP_PUB_END);
        assert_int_equal(tp.len[i], strlen(msgs[i / 2]));
        assert_int_equal(tp.first[i], msgs[i / 2][0]);
        assert_true(pthread_equal(tp.thread[i], pthread_self()));
    }
    pthread_mutex_unlock(&tp.mu);
    pthread_mutex_lock(&tr.mu);
    assert_int_equal(tr.n, 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(tr.at[i], SWT_TAP_RX);
        assert_int_equal(tr.len[i], strlen(msgs[i]));
        assert_int_equal(tr.first[i], msgs[i][0]);
        assert_int_equal(tr.calls_then[i], i); /* before its callback, after the one before */
        assert_true(pthread_equal(tr.thread[i], k.thread[i]));
    }
    pthread_mutex_unlock(&tr.mu);
    /* cleared: the taps see nothing of a fourth message */
    swt_conn_set_tap(pub, NULL, NULL);
    swt_conn_set_tap(rx, NULL, NULL);
    assert_int_equal(swt_publish(pub, "itest.tap", NULL, "dddd", 4), SW_OK);
    assert_int_equal(swt_flush(pub, T(2000)), SW_OK);
    for (int64_t until = swh_now_ms() + T(5000); atomic_load(&k.calls) < 4;) {
        assert_true(swh_now_ms() < until);
        sleep_ms(2);
    }
    assert_int_equal(tp.n, 6);
    assert_int_equal(tr.n, 3);
    swt_sub_close(rx, &sub);
    sw_conn_close(rx);
    sw_conn_close(pub);
    pthread_mutex_destroy(&tp.mu);
    pthread_mutex_destroy(&tr.mu);
}

/* The same end to end: the router's and the ingress's timers trim their
 * connections, so once a stream is over and quiet, neither side keeps any
 * message of it. */
static void
quiet_connections_keep_nothing(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_stream *s;
    e->w.mode = M_STREAM;
    e->w.n = 5;
    env_start(e, NULL, NULL);
    s = env_open(e);
    assert_true(collect(s, g, 0, T(10000)));
    assert_tokens(g, 5);
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    for (int64_t until = swh_now_ms() + T(2000);
         swt_conn_kept(e->fc) != 0 || swt_conn_kept(e->wc) != 0;) {
        if (swh_now_ms() > until)
            fail_msg("after the stream and 2 s, the frontend keeps %u messages, the worker %u",
                     swt_conn_kept(e->fc), swt_conn_kept(e->wc));
        sleep_ms(5);
    }
    got_free(g);
}

/* ======================================================================== */
/* Inline handlers (sw_ingress_opts.handler_inline)                          */

/* env_start with an inline ingress (the rest of its options the defaults). */
static void
env_start_inline(env *e, sw_router_opts *ro)
{
    sw_ingress_opts io;
    sw_ingress_opts_init(&io);
    io.handler_inline = 1;
    env_start(e, &io, ro);
}

/* Starts an inline ingress (handler_threads asks for a pool it ignores)
 * whose handler sends 5 tokens 30 ms apart, and opens three streams to it
 * at once. The frontend's inactivity_ms is raised: requests waiting behind
 * a handler are not heartbeaten yet. */
static void
start_inline_three(env *e, got *g[3], sw_stream *s[3])
{
    sw_ingress_opts io;
    sw_router_opts ro;
    sw_ingress_opts_init(&io);
    io.handler_inline = 1;
    io.handler_threads = 8;
    sw_router_opts_init(&ro);
    ro.inactivity_ms = T(5000);
    e->w.mode = M_STREAM;
    e->w.n = 5;
    e->w.delay_ms = 30;
    env_start(e, &io, &ro);
    for (int i = 0; i < 3; i++) {
        g[i] = new_got(e);
        s[i] = env_open(e);
    }
}

/* The handler runs on the thread that received the request: requests are
 * taken in one at a time, every stream whole. With the pool the three
 * would run side by side. */
static void
inline_handlers_one_at_a_time(void **state)
{
    env *e = *state;
    got *g[3];
    sw_stream *s[3];
    int most = 0;
    start_inline_three(e, g, s);
    for (int64_t until = now_ms() + T(10000); now_ms() < until;) {
        int started = wctx_get(&e->w, &e->w.started);
        int returned = wctx_get(&e->w, &e->w.returned);
        if (started - returned > most)
            most = started - returned;
        if (returned == 3)
            break;
        sleep_ms(2);
    }
    assert_int_equal(wctx_get(&e->w, &e->w.returned), 3);
    if (most != 1)
        fail_msg("%d handlers ran at once, want 1", most);
    for (int i = 0; i < 3; i++) {
        assert_true(collect(s[i], g[i], 0, T(10000)));
        assert_tokens(g[i], 5);
        assert_terminal(g[i], SW_STATUS_COMPLETED, SW_OK, "stop");
        assert_done(g[i]);
        got_free(g[i]);
    }
}

/* An inline handler blocked in send for credit holds the request's
 * thread, not the control subscription's: the credit still arrives, and
 * 60 items go through a window of 4. */
static void
inline_handler_waits_for_credit(void **state)
{
    env *e = *state;
    sw_router_opts ro;
    sw_ingress_stats st;
    got *g = new_got(e);
    sw_stream *s;
    sw_router_opts_init(&ro);
    ro.credit_window = 4;
    e->w.mode = M_STREAM;
    e->w.n = 60;
    env_start_inline(e, &ro);
    s = env_open(e);
    assert_true(collect(s, g, 0, T(10000)));
    assert_tokens(g, 60);
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_done(g);
    ingress_stats(e, &st);
    if (st.credit_stalls == 0)
        fail_msg("no send waited for credit: the test did not test it");
    got_free(g);
}

/* The intended use: the handler retains the responder, hands it to
 * another thread and returns at once; that thread streams and finishes. */
static void
inline_handler_hands_off(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_stream *s;
    e->w.mode = M_RETAIN_FINISH;
    e->w.n = 7;
    env_start_inline(e, NULL);
    s = env_open(e);
    assert_true(collect(s, g, 0, T(10000)));
    assert_tokens(g, 7);
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_done(g);
    got_free(g);
}

/* Destroy while an inline handler waits (for a gate that never opens):
 * the drain cancels its stream, the handler returns, the request
 * subscription closes, destroy returns; the consumer gets instance_lost
 * after the items it had. */
static void
inline_handler_blocked_destroy(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_stream *s;
    int64_t t0;
    e->w.mode = M_BLOCK;
    e->w.k = 2;
    e->w.n = 4;
    env_start_inline(e, NULL);
    s = env_open(e);
    assert_true(wctx_wait(&e->w, &e->w.sent, 2, T(5000)));
    t0 = now_ms();
    sw_ingress_destroy(e->ing);
    e->ing = NULL;
    if (now_ms() - t0 > T(5000))
        fail_msg("sw_ingress_destroy took %lld ms", (long long)(now_ms() - t0));
    assert_int_equal(wctx_get(&e->w, &e->w.returned), 1);
    assert_int_equal(e->w.stop_rv, SW_ECANCELLED);
    assert_true(collect(s, g, 0, T(10000)));
    assert_tokens(g, 2);
    assert_terminal(g, SW_STATUS_ERROR, SW_INSTANCE_LOST, "instance_lost");
    assert_done(g);
    got_free(g);
}

/* A drain while requests wait behind a running inline handler: the running
 * one finishes, the waiting ones never ran and are handed back as a drain
 * hands back a stream (instance_lost: a migrating frontend moves them),
 * not refused as "overloaded". */
static void
inline_drain_hands_back_the_queued(void **state)
{
    env *e = *state;
    got *g[3];
    sw_stream *s[3];
    start_inline_three(e, g, s);
    assert_true(wctx_wait(&e->w, &e->w.started, 1, T(5000)));
    /* the two others reached the worker (under load they may still be on
     * their way, and a drain begun before would answer no_responders) */
    assert_int_equal(ist_wait(e, f_requests_waiting, 2, T(5000)), 2);
    assert_int_equal(sw_ingress_drain(e->ing, T(10000)), SW_OK);
    assert_int_equal(wctx_get(&e->w, &e->w.started), 1);
    assert_true(collect(s[0], g[0], 0, T(10000)));
    assert_tokens(g[0], 5);
    assert_terminal(g[0], SW_STATUS_COMPLETED, SW_OK, "stop");
    for (int i = 1; i < 3; i++) {
        assert_true(collect(s[i], g[i], 0, T(10000)));
        assert_tokens(g[i], 0);
        assert_terminal(g[i], SW_STATUS_ERROR, SW_INSTANCE_LOST, "instance_lost");
        assert_non_null(strstr(g[i]->message, "draining"));
    }
    for (int i = 0; i < 3; i++) {
        assert_done(g[i]);
        got_free(g[i]);
    }
}

/* What waits behind a running inline handler is counted: requests_waiting
 * shows the two requests queued behind a blocked handler, and 0 once it
 * returned and they ran. */
static void
inline_requests_waiting_counted(void **state)
{
    env *e = *state;
    sw_router_opts ro;
    sw_ingress_stats st;
    got *g[3];
    sw_stream *s[3];
    sw_router_opts_init(&ro);
    ro.inactivity_ms = T(10000);
    e->w.mode = M_BLOCK;
    e->w.k = 1;
    e->w.n = 2;
    env_start_inline(e, &ro);
    for (int i = 0; i < 3; i++) {
        g[i] = new_got(e);
        s[i] = env_open(e);
    }
    assert_true(wctx_wait(&e->w, &e->w.sent, 1, T(5000)));
    assert_int_equal(ist_wait(e, f_requests_waiting, 2, T(5000)), 2);
    ingress_stats(e, &st);
    assert_int_equal(st.inflight, 1);
    wctx_open_gate(&e->w);
    for (int i = 0; i < 3; i++) {
        assert_true(collect(s[i], g[i], 0, T(10000)));
        assert_tokens(g[i], 2);
        assert_terminal(g[i], SW_STATUS_COMPLETED, SW_OK, "stop");
        got_free(g[i]);
    }
    ingress_stats(e, &st);
    assert_int_equal(st.requests_waiting, 0);
}

/* handler_inline: "Once the handlers ahead of a request have run longer,
 * in all, than its frontend's inactivity_ms ..., it ends with
 * stream_incomplete". The first handler sends one item and blocks (the
 * gate) for 2.5 s; a request behind it, from a router with inactivity_ms
 * 1000, ends with stream_incomplete (no item) about 1 s after it was
 * opened, while the first handler still runs -- not once that one returns.
 * The first stream, heartbeaten meanwhile, completes when the gate opens. */
static void
inline_queued_request_ends_incomplete(void **state)
{
    env *e = *state;
    sw_router_opts ro;
    got *g1 = new_got(e), *g2 = new_got(e);
    sw_stream *s1, *s2;
    int64_t t0, t1, took;

    sw_router_opts_init(&ro);
    ro.inactivity_ms = 1000;
    e->w.mode = M_BLOCK;
    e->w.k = 1;
    e->w.n = 2;
    env_start_inline(e, &ro);
    t1 = now_ms();
    s1 = env_open(e);
    assert_true(wctx_wait(&e->w, &e->w.sent, 1, T(5000)));
    t0 = now_ms();
    s2 = env_open(e);
    assert_int_equal(ist_wait(e, f_requests_waiting, 1, T(1000)), 1);
    assert_true(collect(s2, g2, 0, T(2400)));
    took = now_ms() - t0;
    assert_int_equal(g2->n, 0);
    assert_terminal(g2, SW_STATUS_ERROR, SW_STREAM_INCOMPLETE, "stream_incomplete");
    assert_done(g2);
    if (took < 950 || took > T(1800))
        fail_msg("the queued request ended %lld ms after its open, want 1000..1800 "
                 "(inactivity_ms 1000)",
                 (long long)took);
    assert_int_equal(wctx_get(&e->w, &e->w.started), 1); /* it never ran */
    assert_int_equal(wctx_get(&e->w, &e->w.returned), 0);
    /* The first handler ran for 2.5 s in all; its stream is unharmed. */
    sleep_ms((long)(t1 + T(2500) - now_ms()));
    wctx_open_gate(&e->w);
    assert_true(collect(s1, g1, 0, T(5000)));
    assert_tokens(g1, 2);
    assert_terminal(g1, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_done(g1);
    got_free(g1);
    got_free(g2);
}

typedef struct drain_bg {
    env *e;
    sw_err rv;
    int began_down; /* the worker's connection was down when the drain began */
} drain_bg;

static void *
drain_when_down(void *arg)
{
    drain_bg *d = arg;
    for (int64_t until = now_ms() + T(5000); swt_connected(d->e->wc) && now_ms() < until;)
        sleep_ms(1);
    d->began_down = !swt_connected(d->e->wc);
    d->rv = sw_ingress_drain(d->e->ing, T(10000));
    return NULL;
}

/* A drain that begins while the worker's connection is down (a NATS
 * restart): the request subscription is not subscribed again when the
 * connection comes back, so a new request during the grace period gets
 * "no responders" (a router sends it elsewhere) instead of reaching a
 * draining worker. */
static void
drain_while_disconnected(void **state)
{
    env *e = *state;
    got *g = new_got(e), *g2 = new_got(e);
    sw_stream *s, *s2;
    pthread_t t;
    drain_bg d = {e, SW_OK, 0};
    e->w.mode = M_BLOCK;
    e->w.k = 1;
    e->w.n = 3;
    env_start(e, NULL, NULL);
    s = env_open(e);
    assert_true(wctx_wait(&e->w, &e->w.sent, 1, T(5000)));
    assert_int_equal(pthread_create(&t, NULL, drain_when_down, &d), 0);
    assert_int_equal(swh_nats_restart(&g_nats, 600), 0);
    for (int64_t until = now_ms() + T(15000); !swt_connected(e->wc) || !swt_connected(e->fc);) {
        if (now_ms() > until) {
            wctx_open_gate(&e->w);
            pthread_join(t, NULL);
            fail_msg("the connections did not come back");
        }
        sleep_ms(5);
    }
    sleep_ms(200);
    s2 = env_open(e);
    assert_true(collect(s2, g2, 0, T(10000)));
    wctx_open_gate(&e->w);
    pthread_join(t, NULL);
    assert_int_equal(d.began_down, 1);
    assert_terminal(g2, SW_STATUS_ERROR, SW_NO_RESPONDERS, "no_responders");
    assert_int_equal(d.rv, SW_OK);
    assert_true(collect(s, g, 0, T(10000)));
    assert_tokens(g, 3);
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    got_free(g);
    got_free(g2);
}

/* Ticks of the router's ticker and of the worker's timer and liveness
 * ticker over a window of ms. */
typedef struct ticks {
    uint64_t router, timer, live;
} ticks;

static void
ticks_get(env *e, ticks *t)
{
    t->router = swx_router_ticks(e->rt);
    swx_ingress_tick_counts(e->ing, &t->timer, &t->live);
}

static void
ticks_over(env *e, long ms, ticks *d)
{
    ticks a, b;
    ticks_get(e, &a);
    sleep_ms(ms);
    ticks_get(e, &b);
    d->router = b.router - a.router;
    d->timer = b.timer - a.timer;
    d->live = b.live - a.live;
}

/* Issue 17: "no sleep or poll loops in any idle path". With no stream the
 * router's ticker (every 10 ms while streams are open), the worker's timer
 * (25 ms) and its liveness ticker (250 ms) rest (1 s) instead of waking:
 * at most 2 ticks each in 1.5 s, where they took about 150, 60 and 6. A
 * stream opened on the resting pair wakes both (it completes, and the
 * router ticks every 10 ms while it is open), and once it is over and its
 * frontend no longer probed (as its last stream leaves the worker) they
 * rest again. */
static void
idle_tickers_rest(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_stream *s;
    ticks d, a, b;

    e->w.mode = M_STREAM;
    e->w.n = 20;
    e->w.delay_ms = 20;
    env_start(e, NULL, NULL);
    sleep_ms(200); /* (the first ticks, which find nothing to do) */
    ticks_over(e, 1500, &d);
    assert_in_range(d.router, 0, 2);
    assert_in_range(d.timer, 0, 2);
    assert_in_range(d.live, 0, 2);

    ticks_get(e, &a);
    s = env_open(e);
    assert_true(collect(s, g, 0, T(10000)));
    assert_tokens(g, 20);
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_done(g);
    ticks_get(e, &b);
    /* 20 tokens 20 ms apart: 400 ms, 40 router ticks at 10 ms (and the
     * timer's at 25 ms) if nothing held them back */
    assert_true(b.router - a.router >= 10);
    assert_true(b.timer - a.timer >= 4);
    env_close(e, s);

    sleep_ms(T(3000)); /* the final acknowledged, the stream unregistered */
    ticks_over(e, 1500, &d);
    assert_in_range(d.router, 0, 2);
    assert_in_range(d.timer, 0, 2);
    assert_in_range(d.live, 0, 2);
    got_free(g);
}

/* Closing many open streams at once (a gateway shutting down, a client
 * dropping its requests) sends each one's cancel and keeps it for resends
 * on the router's ticker, the first SWE_CANCEL_FIRST_MS (100 ms) later.
 * With streams open the ticker comes within SWE_SCAN_MS (25 ms) anyway,
 * so adding a cancel wakes only a ticker resting longer (no stream open).
 * It used to wake it for each cancel: closing 200 streams a millisecond
 * apart made a tick each. Ticks are counted, with the loop's own time
 * allowed for at a tick each SWE_TICK_MS (10 ms). */
static void
mass_close_ticks_on_schedule(void **state)
{
    env *e = *state;
    enum { N = 200 };
    sw_stream *s[N];
    sw_ingress_opts io;
    sw_request_opts o;
    ticks a, b;
    int64_t t0, took;

    e->w.mode = M_BLOCK;
    e->w.k = 0;
    e->w.n = 1;
    sw_ingress_opts_init(&io);
    io.max_inflight = 2 * N;
    env_start(e, &io, NULL);
    ropts(e, &o);
    for (int i = 0; i < N; i++)
        assert_int_equal(sw_router_open(&s[i], e->rt, &o, "prompt", 6), SW_OK);
    assert_true(wctx_wait(&e->w, &e->w.started, 1, T(5000)));
    sleep_ms(T(300)); /* every request in at the worker */
    ticks_get(e, &a);
    t0 = now_ms();
    for (int i = 0; i < N; i++) {
        sw_stream_close(s[i]);
        sleep_ms(1); /* (one at a time: each finds the ticker at rest) */
    }
    took = now_ms() - t0;
    ticks_get(e, &b);
    print_message("    %d closes in %lld ms: %llu router ticks\n", N, (long long)took,
                  (unsigned long long)(b.router - a.router));
    assert_true(b.router - a.router <= (uint64_t)(took / 10 + 3));
    wctx_open_gate(&e->w);
}

/* A frontend is probed while it has a stream here, and no longer as soon
 * as its last one is unregistered (counted per stream at registration and
 * unregistration; it was a recount of every stream each 2 s, which cost
 * 0.12 % of a core at 10,000 idle streams and kept a frontend probed up to
 * 2 s after its last stream). */
static void
frontend_unprobed_when_its_last_stream_ends(void **state)
{
    env *e = *state;
    sw_stream *s[2];
    sw_ingress_stats st;
    unsigned users = 0;
    int64_t until;
    const char *rid;

    e->w.mode = M_PAUSE;
    e->w.k = 1;
    e->w.n = 2;
    e->w.delay_ms = (int)T(1500); /* both registered at once, on a slow machine too */
    env_start(e, NULL, NULL);
    rid = sw_router_id(e->rt);
    assert_int_equal(swx_ingress_frontends(e->ing, rid, &users), 0);
    s[0] = env_open(e);
    s[1] = env_open(e);
    until = swh_now_ms() + T(3000);
    while ((swx_ingress_frontends(e->ing, rid, &users) != 1 || users != 2) && swh_now_ms() < until)
        sleep_ms(5);
    assert_int_equal(swx_ingress_frontends(e->ing, rid, &users), 1);
    assert_int_equal(users, 2);
    for (int i = 0; i < 2; i++) {
        got *g = new_got(e);
        assert_true(collect(s[i], g, 0, T(10000)));
        assert_tokens(g, 2);
        assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
        got_free(g);
        env_close(e, s[i]);
    }
    /* Both finals acknowledged: the streams leave the worker's table, and
     * their frontend the probe's at the same moment. */
    until = swh_now_ms() + T(5000);
    do {
        ingress_stats(e, &st);
        if (st.streams_held == 0)
            break;
        sleep_ms(2);
    } while (swh_now_ms() < until);
    assert_int_equal(st.streams_held, 0);
    until = swh_now_ms() + T(100);
    while (swx_ingress_frontends(e->ing, rid, NULL) != 0 && swh_now_ms() < until)
        sleep_ms(2);
    if (swx_ingress_frontends(e->ing, rid, NULL) != 0)
        fail_msg("the frontend is still probed after its last stream left the worker");
}

/* A frontend judged gone has its streams cancelled, and only those: a
 * router that comes back under the same id (a restarted gateway) and sends
 * a request while the worker is cancelling the streams of the one gone
 * keeps its new stream. The chaos hook holds the thread that judged the
 * frontend gone between the judgment (its entry out of the table of
 * frontends) and the cancels, while the new router's request registers.
 * The new stream used to be killed with the old ones (they were found by
 * router id alone): its handler saw a cancel, its frontend no more items
 * and no terminal until its silence limit. */
typedef struct gonerace {
    env *e;
    atomic_int fired, done;
    sw_err create_rv, open_rv;
    int noted; /* the new stream counted for its frontend before the cancels */
    sw_stream *s2;
} gonerace;

#define GONE_RID "fe-gone"

static void
gonerace_hook(const char *router_id, void *arg)
{
    gonerace *g = arg;
    env *e = g->e;
    sw_router_opts ro;
    sw_request_opts q;
    unsigned users = 0;
    if (strcmp(router_id, GONE_RID) != 0 || atomic_exchange(&g->fired, 1))
        return;
    sw_router_opts_init(&ro);
    ro.router_id = GONE_RID;
    g->create_rv = sw_router_create(&e->rt2, e->fc2, &ro);
    if (g->create_rv == SW_OK) {
        ropts(e, &q);
        g->open_rv = sw_router_open(&g->s2, e->rt2, &q, "hi", 2);
        /* its handler runs, and the stream is counted for its frontend */
        (void)wctx_wait(&e->w, &e->w.started, 2, T(5000));
        for (int64_t until = now_ms() + T(2000); now_ms() < until; sleep_ms(2))
            if (swx_ingress_frontends(e->ing, GONE_RID, &users) == 1 && users == 1)
                break;
        g->noted = users == 1;
    }
    atomic_store(&g->done, 1);
}

static void
frontend_back_under_its_id_keeps_its_stream(void **state)
{
    env *e = *state;
    static gonerace g; /* (the hook may outlive a failed test's frame) */
    sw_ingress_opts io;
    sw_router_opts ro;
    sw_stream *s1;
    got *g1, *g2;
    memset(&g, 0, sizeof(g));
    g.e = e;
    e->w.mode = M_BLOCK;
    e->w.k = 1;
    e->w.n = 3;
    sw_ingress_opts_init(&io);
    io.frontend_probe_ms = 50;
    io.frontend_timeout_ms = 300;
    sw_router_opts_init(&ro);
    ro.router_id = GONE_RID;
    env_start(e, &io, &ro);
    e->fc2 = conn_open("itest-frontend2");
    s1 = env_open(e);
    g1 = new_got(e);
    assert_false(collect(s1, g1, 1, T(5000)));
    assert_tokens(g1, 1);
    /* No probe proves anything in the worker connection's first 2 s
     * (SWI_PEERS_SETTLE_MS). */
    sleep_ms(2200);
    swx_ingress_on_frontend_gone(e->ing, gonerace_hook, &g);
    /* The frontend vanishes without a word: its cancels are lost. */
    swx_ingress_drop_cancels(e->ing, 1000);
    sw_router_destroy(e->rt);
    e->rt = NULL;
    for (int64_t until = now_ms() + T(5000); !atomic_load(&g.done) && now_ms() < until;)
        sleep_ms(5);
    swx_ingress_drop_cancels(e->ing, 0);
    assert_true(atomic_load(&g.done));
    assert_int_equal(g.create_rv, SW_OK);
    assert_int_equal(g.open_rv, SW_OK);
    assert_true(g.noted);
    /* The stream of the frontend gone is cancelled ... */
    assert_true(wctx_wait(&e->w, &e->w.stopped, 1, T(3000)));
    /* ... and the new one is not. */
    sleep_ms((long)T(300));
    assert_int_equal(wctx_get(&e->w, &e->w.stopped), 1);
    wctx_open_gate(&e->w);
    g2 = new_got(e);
    assert_true(collect(g.s2, g2, 0, T(10000)));
    assert_tokens(g2, 3);
    assert_terminal(g2, SW_STATUS_COMPLETED, SW_OK, "stop");
    sw_stream_close(g.s2);
    g.s2 = NULL;
    swx_ingress_on_frontend_gone(e->ing, NULL, NULL);
}

/* ======================================================================== */
/* sw_ingress_start's own window                                             */

/* A request that reaches an instance while sw_ingress_start is under way
 * (its request subscription made, the server's answer to its
 * subscriptions not checked yet) never runs: start may still fail (here:
 * the server refuses the liveness subscription, SW_EPERM), and the caller
 * of a failed start frees what the handler would use. It is handed back
 * unrun (instance_lost), whether start fails or not; a request after a
 * successful start runs as usual. The handler used to run on it, start's
 * failure notwithstanding. */
typedef struct startrace {
    sw_router *rt;
    sw_stream *s;
    sw_err open_rv;
    atomic_int calls; /* handler calls */
    int hooked;       /* the hook ran (main thread only) */
} startrace;

static void
startrace_handler(sw_responder *r, void *arg)
{
    startrace *sr = arg;
    atomic_fetch_add(&sr->calls, 1);
    (void)sw_responder_send(r, "x", 1);
    (void)sw_responder_finish(r, SW_STATUS_COMPLETED, NULL);
}

static sw_stream *
startrace_open(startrace *sr, sw_err *rv)
{
    sw_request_opts q;
    sw_stream *s = NULL;
    sw_request_opts_init(&q);
    q.endpoint = EP;
    q.instance_id = "startrace-1";
    *rv = sw_router_open(&s, sr->rt, &q, "hi", 2);
    return s;
}

/* In sw_ingress_start, on its thread: a request to the instance, given
 * time to reach a handler. */
static void
startrace_hook(sw_conn *conn, const char *req_subj, void *arg)
{
    startrace *sr = arg;
    (void)req_subj;
    sr->hooked = 1;
    (void)swt_flush(conn, 5000); /* the server has the subscription */
    sr->s = startrace_open(sr, &sr->open_rv);
    for (int64_t until = now_ms() + T(500); atomic_load(&sr->calls) == 0 && now_ms() < until;)
        sleep_ms(5);
}

static void
startrace_conn(const swh_nats *n, const char *user, sw_conn **c)
{
    sw_conn_opts co;
    sw_conn_opts_init(&co);
    co.url = n->url;
    co.user = user;
    co.password = user;
    assert_int_equal(sw_conn_open(c, &co), SW_OK);
}

static void
startrace_expect_handed_back(startrace *sr)
{
    const sw_item *it = NULL;
    assert_true(sr->hooked);
    assert_int_equal(sr->open_rv, SW_OK);
    assert_int_equal(atomic_load(&sr->calls), 0);
    sleep_ms((long)T(200)); /* (nor later) */
    assert_int_equal(atomic_load(&sr->calls), 0);
    assert_int_equal(sw_stream_next(sr->s, &it, T(5000)), SW_OK);
    assert_int_equal(it->kind, SW_ITEM_TERMINAL);
    assert_int_equal(it->terminal.status, SW_STATUS_ERROR);
    assert_int_equal(it->terminal.error, SW_INSTANCE_LOST);
    sw_stream_close(sr->s);
    sr->s = NULL;
}

static void
request_in_start_window_never_runs(void **state)
{
    swh_nats n;
    sw_conn *wc = NULL, *fc = NULL;
    sw_ingress *ing = NULL;
    sw_ingress_opts io;
    sw_router_opts ro;
    startrace sr;
    sw_stream *s;
    sw_err rv;
    const sw_item *it = NULL;
    (void)state;
    memset(&sr, 0, sizeof(sr));
    assert_int_equal(swh_nats_start(&n, "authorization {\n"
                                        "  users = [\n"
                                        "    { user: nolive, password: nolive, permissions: {\n"
                                        "        subscribe: { deny: [\"sw.lv.>\"] } } }\n"
                                        "    { user: any, password: any }\n"
                                        "  ]\n"
                                        "}\n"),
                     0);
    startrace_conn(&n, "any", &fc);
    sw_router_opts_init(&ro);
    assert_int_equal(sw_router_create(&sr.rt, fc, &ro), SW_OK);
    sw_ingress_opts_init(&io);
    io.endpoint = EP;
    io.instance_id = "startrace-1";
    io.handler = startrace_handler;
    io.handler_arg = &sr;
    swx_ingress_on_subscribed(startrace_hook, &sr);

    /* start fails */
    startrace_conn(&n, "nolive", &wc);
    rv = sw_ingress_start(&ing, wc, &io);
    assert_int_equal(rv, SW_EPERM);
    assert_null(ing);
    startrace_expect_handed_back(&sr);
    sw_conn_close(wc);

    /* start succeeds: the request of the window is handed back all the same */
    sr.hooked = 0;
    startrace_conn(&n, "any", &wc);
    rv = sw_ingress_start(&ing, wc, &io);
    swx_ingress_on_subscribed(NULL, NULL);
    assert_int_equal(rv, SW_OK);
    startrace_expect_handed_back(&sr);
    /* and the next one is served */
    s = startrace_open(&sr, &rv);
    assert_int_equal(rv, SW_OK);
    assert_int_equal(sw_stream_next(s, &it, T(5000)), SW_OK);
    assert_int_equal(it->kind, SW_ITEM_DATA);
    assert_int_equal(sw_stream_next(s, &it, T(5000)), SW_OK);
    assert_int_equal(it->kind, SW_ITEM_TERMINAL);
    assert_int_equal(it->terminal.status, SW_STATUS_COMPLETED);
    assert_int_equal(atomic_load(&sr.calls), 1);
    sw_stream_close(s);
    sw_ingress_destroy(ing);
    sw_router_destroy(sr.rt);
    sw_conn_close(wc);
    sw_conn_close(fc);
    swh_nats_stop(&n);
}

/* ======================================================================== */

int
main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        T_(idle_tickers_rest),
        T_(mass_close_ticks_on_schedule),
        T_(frontend_unprobed_when_its_last_stream_ends),
        T_(drain_within_grace),
        T_(drain_past_grace_instance_lost),
        T_(worker_vanishes_instance_lost),
        T_(router_destroy_with_open_streams),
        T_(router_destroy_during_open),
        T_(two_routers_one_instance),
        T_(router_destroy_during_final_linger),
        T_(router_max_streams_busy),
        T_(ingress_destroy_with_retained_responder),
        T_(conn_close_no_callback_after_free),
        T_(conn_close_outwaited_by_a_slow_callback),
        T_(conn_closed_before_its_router),
        T_(conn_closed_before_its_ingress),
        T_(reconnects_run_out_streams_end),
        T_(subscribe_fails_under_a_handler),
        T_(handled_messages_kept_in_batches),
        T_(timing_taps_see_each_message),
        T_(quiet_connections_keep_nothing),
        T_(inline_handlers_one_at_a_time),
        T_(inline_handler_waits_for_credit),
        T_(inline_handler_hands_off),
        T_(inline_handler_blocked_destroy),
        T_(inline_drain_hands_back_the_queued),
        T_(inline_requests_waiting_counted),
        T_(inline_queued_request_ends_incomplete),
        T_(drain_while_disconnected),
        T_(request_in_start_window_never_runs),
        T_(frontend_back_under_its_id_keeps_its_stream),
    };
    sf_filters(argc, argv);
    return cmocka_run_group_tests_name("streams.lifecycle", tests, sf_group_setup,
                                       sf_group_teardown);
}
