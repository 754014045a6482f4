/* tests/integration/test_terminals.c -- end-to-end streams over a real
 * nats-server (issues 3 and 5), split from test_streams.c by theme:
 * every terminal a stream can end with: completed, worker terminals
 * (max_tokens, engine error, handler returned or released without one),
 * synthesized terminals (no responders, payload too large, no instances,
 * deadline, inactivity, overloaded), callback mode, responder API edges.
 * Fixture, threads and locks: streams_fixture.h. */
#include "streams_fixture.h"
#include "transport/chaos.h"

/* ======================================================================== */
/* 1. Completed stream                                                       */

static void
completed_stream(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_stream *s;
    sw_ingress_stats st;
    sw_request_opts o;
    const int N = 50;

    e->w.mode = M_STREAM;
    e->w.n = N;
    env_start(e, NULL, NULL);
    ropts(e, &o);
    o.max_tokens = 77;
    s = env_open_with(e, &o, "hello worker", 12);
    assert_true(collect(s, g, 0, T(10000)));
    assert_tokens(g, (size_t)N);
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_string_equal(g->message, "");
    assert_int_equal(g->term_seq, (uint64_t)N + 1); /* the final's seq */
    assert_done(g);
    assert_string_equal(g->instance, sw_ingress_instance_id(e->ing));
    assert_string_equal(sw_stream_instance_id(s), sw_ingress_instance_id(e->ing));
    /* What the handler saw. */
    assert_string_equal(e->w.payload, "hello worker");
    assert_int_equal(e->w.max_tokens, 77);
    assert_string_equal(e->w.reqid, sw_stream_request_id(s));
    assert_int_equal(strlen(sw_stream_request_id(s)), 32);
    assert_int_equal(wctx_get(&e->w, &e->w.started), 1);
    assert_true(wctx_wait(&e->w, &e->w.finished, 1, T(2000)));
    assert_int_equal(e->w.finish_rv, SW_OK);
    /* EEOF is sticky. */
    {
        const sw_item *it;
        assert_int_equal(sw_stream_next(s, &it, 50), SW_EEOF);
        assert_int_equal(sw_stream_cancel(s), SW_EEOF);
    }
    ingress_stats(e, &st);
    assert_int_equal(st.requests, 1);
    assert_int_equal(st.items_sent, (uint64_t)N);
    assert_int_equal(st.finished[SW_STATUS_COMPLETED], 1);
    assert_int_equal(st.bad_requests, 0);
    {
        sw_router_stats rs;
        sw_stream_stats ss;
        sw_stream_stats_get(s, &ss);
        assert_int_equal(ss.items, (uint64_t)N);
        assert_int_equal(ss.duplicates, 0);
        sw_router_stats_get(e->rt, &rs);
        assert_int_equal(rs.streams_opened, 1);
        assert_int_equal(rs.terminals[SW_STATUS_COMPLETED], 1);
        assert_int_equal(rs.open_streams, 0);
        /* nothing lost and repaired, nothing stray (nats_dropped cannot be
         * non-zero: the mux's pending queue is unlimited) */
        assert_int_equal(ss.resend_requests, 0);
        assert_int_equal(rs.unknown_stream, 0);
    }
    got_free(g);
}

/* sw_router_stats.items: "data items delivered" across the router's
 * streams (egress/stream.c only counts the per-stream sw_stream_stats.items). */
static void
router_stats_count_items(void **state)
{
    env *e = *state;
    got *g = new_got(e), *g2 = new_got(e);
    sw_router_stats rs;
    sw_stream *s, *s2;
    sw_request_opts o;

    e->w.mode = M_STREAM;
    e->w.n = 12;
    env_start(e, NULL, NULL);
    s = env_open(e);
    ropts(e, &o);
    o.on_item = NULL;
    s2 = env_open_with(e, &o, "p", 1);
    assert_true(collect(s, g, 0, T(10000)));
    assert_true(collect(s2, g2, 0, T(10000)));
    assert_tokens(g, 12);
    assert_tokens(g2, 12);
    sw_router_stats_get(e->rt, &rs);
    assert_int_equal(rs.streams_opened, 2);
    assert_int_equal(rs.terminals[SW_STATUS_COMPLETED], 2);
    if (rs.items != 24)
        fail_msg("sw_router_stats.items = %llu, want 24 (data items delivered)",
                 (unsigned long long)rs.items);
}

/* Several sequential streams on one router/ingress; each its own content. */
static void
sequential_streams(void **state)
{
    env *e = *state;
    e->w.mode = M_STREAM;
    e->w.n = 7;
    env_start(e, NULL, NULL);
    for (int i = 0; i < 10; i++) {
        got *g = new_got(e);
        sw_stream *s = env_open(e);
        assert_true(collect(s, g, 0, T(10000)));
        assert_tokens(g, 7);
        assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
        assert_done(g);
        env_close(e, s);
        got_free(g);
    }
    assert_int_equal(wctx_get(&e->w, &e->w.started), 10);
}

/* Responder API edges: argument errors, an item too big for the bus (the
 * stream goes on), a custom finish reason, and SW_ECLOSED after the end. */
static void
responder_api_edges(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_stream *s;
    static const sw_err want[12] = {SW_EINVAL,  SW_EINVAL,   SW_EINVAL,  SW_EINVAL,
                                    SW_EINVAL,  SW_EMSGSIZE, SW_OK,      SW_OK,
                                    SW_ECLOSED, SW_ECLOSED,  SW_ECLOSED, SW_ECLOSED};

    e->w.mode = M_API;
    env_start(e, NULL, NULL);
    e->w.big_len = sw_conn_max_payload(e->wc) + 1;
    s = env_open(e);
    assert_true(collect(s, g, 0, T(10000)));
    assert_true(wctx_wait(&e->w, &e->w.try_done, 1, T(2000)));
    for (int i = 0; i < 12; i++)
        if (e->w.rv[i] != want[i])
            fail_msg("responder call %d returned %s, want %s", i, sw_err_name(e->w.rv[i]),
                     sw_err_name(want[i]));
    assert_tokens(g, 1); /* the oversized item consumed no sequence number */
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "eos");
    assert_int_equal(g->term_seq, 2);
    assert_done(g);
}

/* M_KEEP: waits for the handler to return and hands its responder over. */
static sw_responder *
kept_responder(env *e, int nth)
{
    sw_responder *r;
    assert_true(wctx_wait(&e->w, &e->w.returned, nth, T(5000)));
    pthread_mutex_lock(&e->w.mu);
    r = e->w.kept;
    pthread_mutex_unlock(&e->w.mu);
    assert_non_null(r);
    return r;
}

/* Gives the test's M_KEEP responder back (teardown no longer does). */
static void
kept_release(env *e, sw_responder *r)
{
    pthread_mutex_lock(&e->w.mu);
    if (e->w.kept == r)
        e->w.kept = NULL;
    pthread_mutex_unlock(&e->w.mu);
    sw_responder_release(r);
}

/* A cancel callback registered by the test thread: who called it, how often. */
typedef struct late_cancel {
    pthread_mutex_t mu;
    pthread_t caller;
    sw_responder *r;
    int calls;
    int on_caller; /* calls made on the registering thread */
    int other_r;   /* calls for another responder */
} late_cancel;

static void
late_on_cancel(sw_responder *r, void *arg)
{
    late_cancel *lc = arg;
    pthread_mutex_lock(&lc->mu);
    lc->calls++;
    lc->on_caller += pthread_equal(pthread_self(), lc->caller) != 0;
    lc->other_r += r != lc->r;
    pthread_mutex_unlock(&lc->mu);
}

static int
late_calls(late_cancel *lc, int *on_caller)
{
    int n;
    pthread_mutex_lock(&lc->mu);
    n = lc->calls;
    if (on_caller != NULL)
        *on_caller = lc->on_caller;
    pthread_mutex_unlock(&lc->mu);
    return n;
}

/* sw_responder_on_cancel: "Called once ... If the stream is already
 * cancelled, called at once on the calling thread." The handler registered
 * w_on_cancel; the stream is cancelled and it runs once, from a library
 * thread. A callback registered afterwards runs before on_cancel returns,
 * on the registering thread, once -- not again while the router's cancel
 * resends arrive -- and the one it replaced is not called again. Each call
 * registers anew: registering once more on the cancelled stream calls the
 * new registration at once too (once each); NULL registers none. */
static void
on_cancel_after_the_cancel(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    late_cancel lc;
    sw_ingress_stats st;
    sw_responder *r;
    sw_stream *s;
    int on_caller = 0;

    memset(&lc, 0, sizeof(lc));
    pthread_mutex_init(&lc.mu, NULL);
    lc.caller = pthread_self();
    e->w.mode = M_KEEP;
    env_start(e, NULL, NULL);
    s = env_open(e);
    lc.r = r = kept_responder(e, 1);
    assert_int_equal(sw_responder_cancelled(r), 0);
    assert_int_equal(sw_stream_cancel(s), SW_OK);
    assert_true(collect(s, g, 0, T(5000)));
    assert_int_equal(g->n, 0);
    assert_terminal(g, SW_STATUS_CANCELLED, SW_OK, "cancelled");
    for (int64_t until = now_ms() + T(2000); !sw_responder_cancelled(r) && now_ms() < until;)
        sleep_ms(2);
    assert_int_equal(sw_responder_cancelled(r), 1);
    assert_true(wctx_wait(&e->w, &e->w.cancel_cb, 1, T(2000)));

    sw_responder_on_cancel(r, late_on_cancel, &lc);
    assert_int_equal(late_calls(&lc, &on_caller), 1); /* before it returned */
    assert_int_equal(on_caller, 1);
    sleep_ms(400); /* cancel resends (100, 200 ms) and ticks come and go */
    assert_int_equal(late_calls(&lc, NULL), 1);
    assert_int_equal(wctx_get(&e->w, &e->w.cancel_cb), 1);

    sw_responder_on_cancel(r, late_on_cancel, &lc); /* a new registration */
    assert_int_equal(late_calls(&lc, &on_caller), 2);
    assert_int_equal(on_caller, 2);
    sw_responder_on_cancel(r, NULL, NULL); /* none: nothing to call */
    sleep_ms(100);
    assert_int_equal(late_calls(&lc, NULL), 2);
    assert_int_equal(wctx_get(&e->w, &e->w.cancel_cb), 1);
    pthread_mutex_lock(&lc.mu);
    assert_int_equal(lc.other_r, 0);
    pthread_mutex_unlock(&lc.mu);

    assert_int_equal(sw_responder_finish(r, SW_STATUS_COMPLETED, NULL), SW_ECANCELLED);
    kept_release(e, r);
    assert_int_equal(ist_wait(e, f_inflight_zero, 1, T(2000)), 1);
    ingress_stats(e, &st);
    assert_int_equal(st.cancels, 1);
    assert_int_equal(st.finished[SW_STATUS_CANCELLED], 1);
    assert_int_equal(st.finished[SW_STATUS_FAILED], 0); /* the release sent nothing more */
    assert_int_equal(late_calls(&lc, NULL), 2);
    pthread_mutex_destroy(&lc.mu);
    got_free(g);
}

/* The next item of s is data `want` at seq `seq`. */
static void
next_is(sw_stream *s, const char *want, uint64_t seq)
{
    const sw_item *it = NULL;
    assert_int_equal(sw_stream_next(s, &it, T(10000)), SW_OK);
    assert_int_equal(it->kind, SW_ITEM_DATA);
    assert_int_equal(it->seq, seq);
    assert_int_equal(it->len, strlen(want));
    assert_memory_equal(it->data, want, it->len);
}

/* Waits until the publishes swx_conn_fail_publishes armed have failed. */
static void
publishes_failed(sw_conn *c)
{
    for (int64_t until = now_ms() + T(5000); swx_conn_publishes_to_fail(c) > 0 && now_ms() < until;)
        sleep_ms(2);
    assert_int_equal(swx_conn_publishes_to_fail(c), 0);
}

/* sw_responder_send and _finish (streamwire.h): "A publish of queued items
 * that failed leaves them kept (the frontend asks for them again); its
 * error is returned by the next send (which then takes nothing), or by
 * finish or fail if it is a NATS error." Here publishes on the stream's
 * subject fail as nats.c would refuse them (NATS_IO_ERROR): item 2's
 * publish, told by the next send, which takes nothing; then the final's
 * own publish, made by finish itself, which returned SW_OK for it. The
 * consumer still gets every item in order and the completed terminal (the
 * items and the final resent when asked). */
static void
publish_failures_are_told(void **state)
{
    env *e = *state;
    char subj[SWT_SUBJECT_MAX];
    const sw_item *it = NULL;
    sw_stream_stats ss;
    sw_ingress_stats st;
    sw_responder *r;
    sw_stream *s;
    sw_err rv;

    e->w.mode = M_KEEP;
    env_start(e, NULL, NULL);
    s = env_open(e);
    r = kept_responder(e, 1);
    assert_int_equal(
        swt_subject_response(subj, sizeof(subj), sw_router_id(e->rt), sw_stream_request_id(s)),
        SW_OK);
    assert_int_equal(sw_responder_send(r, "a", 1), SW_OK);
    next_is(s, "a", 1); /* (it went out) */

    swx_conn_fail_publishes(e->wc, subj, 1, NATS_IO_ERROR);
    assert_int_equal(sw_responder_send(r, "b", 1), SW_OK); /* queued; its publish fails */
    publishes_failed(e->wc);
    rv = sw_responder_send(r, "c", 1);
    if (!sw_err_is_nats(rv) || sw_err_nats_status(rv) != NATS_IO_ERROR)
        fail_msg("the send after a failed publish returned %s (want the NATS error)",
                 sw_err_name(rv));
    assert_int_equal(sw_responder_send(r, "c", 1), SW_OK); /* the first took nothing */
    next_is(s, "b", 2);                                    /* resent when asked */
    next_is(s, "c", 3);

    swx_conn_fail_publishes(e->wc, subj, 1, NATS_IO_ERROR);
    rv = sw_responder_finish(r, SW_STATUS_COMPLETED, NULL);
    if (!sw_err_is_nats(rv) || sw_err_nats_status(rv) != NATS_IO_ERROR)
        fail_msg("finish, whose own publish of the final failed, returned %s (want the NATS "
                 "error)",
                 sw_err_name(rv));
    assert_int_equal(swx_conn_publishes_to_fail(e->wc), 0);
    assert_int_equal(sw_responder_finish(r, SW_STATUS_COMPLETED, NULL), SW_ECLOSED);
    assert_int_equal(sw_stream_next(s, &it, T(10000)), SW_OK); /* the final, resent */
    assert_int_equal(it->kind, SW_ITEM_TERMINAL);
    assert_int_equal(it->terminal.status, SW_STATUS_COMPLETED);
    assert_int_equal(it->seq, 4);
    sw_stream_stats_get(s, &ss);
    assert_int_equal(ss.items, 3);
    assert_true(ss.resend_requests >= 2);
    kept_release(e, r);
    ingress_stats(e, &st);
    assert_int_equal(st.items_sent, 2); /* a and c: b's first publish failed, */
    assert_true(st.items_resent >= 1);  /* it went out resent */
    assert_int_equal(st.finished[SW_STATUS_COMPLETED], 1);
}

/* ======================================================================== */
/* 2. Worker terminals                                                       */

static void
incomplete_max_tokens(void **state)
{
    env *e = *state;
    sw_request_opts o;
    got *g = new_got(e);
    sw_stream *s;

    e->w.mode = M_MAXTOK;
    e->w.n = 16;
    env_start(e, NULL, NULL);
    ropts(e, &o);
    o.max_tokens = 5;
    s = env_open_with(e, &o, "p", 1);
    assert_true(collect(s, g, 0, T(10000)));
    assert_tokens(g, 5);
    assert_terminal(g, SW_STATUS_INCOMPLETE, SW_OK, "max_tokens");
    assert_int_equal(g->term_seq, 6);
    assert_done(g);
    got_free(g);
}

static void
failed_engine_error(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_ingress_stats st;
    sw_stream *s;

    e->w.mode = M_FAIL;
    e->w.n = 3;
    env_start(e, NULL, NULL);
    s = env_open(e);
    assert_true(collect(s, g, 0, T(10000)));
    assert_tokens(g, 3);
    assert_terminal(g, SW_STATUS_FAILED, SW_OK, "engine_error");
    assert_string_equal(g->message, FAIL_MSG);
    assert_done(g);
    /* fail() returns after the terminal is counted; the consumer may see the
     * terminal before that. */
    assert_true(wctx_wait(&e->w, &e->w.finished, 1, T(2000)));
    assert_int_equal(e->w.finish_rv, SW_OK);
    ingress_stats(e, &st);
    assert_int_equal(st.finished[SW_STATUS_FAILED], 1);
    got_free(g);
}

static void
handler_returned_without_terminal(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_stream *s;

    e->w.mode = M_RETURN;
    e->w.n = 4;
    env_start(e, NULL, NULL);
    s = env_open(e);
    assert_true(collect(s, g, 0, T(10000)));
    assert_tokens(g, 4);
    assert_terminal(g, SW_STATUS_FAILED, SW_OK, "handler_returned");
    assert_int_equal(g->term_seq, 5);
    assert_done(g);
    got_free(g);
}

static void
retained_released_without_terminal(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_stream *s;

    e->w.mode = M_RETAIN_RELEASE;
    e->w.n = 6;
    e->w.delay_ms = 5;
    env_start(e, NULL, NULL);
    s = env_open(e);
    assert_true(collect(s, g, 0, T(10000)));
    assert_tokens(g, 6);
    assert_terminal(g, SW_STATUS_FAILED, SW_OK, "responder_released");
    assert_done(g);
    assert_true(wctx_wait(&e->w, &e->w.thr_done, 1, T(5000)));
    got_free(g);
}

static void
retained_finishes_after_handler_returned(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_stream *s;

    e->w.mode = M_RETAIN_FINISH;
    e->w.n = 8;
    e->w.delay_ms = 5;
    env_start(e, NULL, NULL);
    s = env_open(e);
    assert_true(collect(s, g, 0, T(10000)));
    assert_tokens(g, 8);
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_done(g);
    assert_true(wctx_wait(&e->w, &e->w.thr_done, 1, T(5000)));
    assert_true(wctx_wait(&e->w, &e->w.finished, 1, T(2000)));
    assert_int_equal(e->w.finish_rv, SW_OK);
    /* The handler had returned before the first item went out. */
    assert_int_equal(wctx_get(&e->w, &e->w.returned), 1);
    got_free(g);
}

/* ======================================================================== */
/* 3. Synthesized terminals                                                  */

static void
no_responders(void **state)
{
    env *e = *state;
    sw_request_opts o;
    got *g = new_got(e);
    sw_stream *s;

    env_start(e, NULL, NULL);
    ropts(e, &o);
    o.instance_id = "nobody-serves-this";
    s = env_open_with(e, &o, "p", 1);
    assert_true(collect(s, g, 0, T(10000)));
    assert_int_equal(g->n, 0);
    assert_terminal(g, SW_STATUS_ERROR, SW_NO_RESPONDERS, "no_responders");
    assert_int_equal(g->term_seq, 0); /* synthesized */
    assert_done(g);
    assert_int_equal(wctx_get(&e->w, &e->w.started), 0);
    got_free(g);
}

/* The router's error terminals by code (sw_router_error_count): exactly
 * one, `err`, and the wrapped-NATS rule and NULL (streamwire.h). */
static void
assert_one_error_counted(env *e, sw_err err)
{
    sw_router_stats st;
    uint64_t sum = 0;
    sw_router_stats_get(e->rt, &st);
    assert_int_equal(sw_router_error_count(e->rt, err), 1);
    for (int c = 1; c < 256; c++)
        sum += sw_router_error_count(e->rt, c);
    assert_int_equal(sum, 1);
    assert_int_equal(st.terminals[SW_STATUS_ERROR], 1);
    assert_int_equal(sw_router_error_count(NULL, err), 0);
    assert_int_equal(sw_router_error_count(e->rt, SW_ENATS_BASE | 5),
                     sw_router_error_count(e->rt, SW_ENATS));
}

static void
payload_too_large(void **state)
{
    env *e = *state;
    sw_request_opts o;
    got *g = new_got(e);
    sw_ingress_stats st;
    sw_stream *s;
    size_t max;
    char *big;

    env_start(e, NULL, NULL);
    max = sw_conn_max_payload(e->fc);
    assert_true(max > 0);
    big = calloc(1, max + 1);
    assert_non_null(big);
    memset(big, 'x', max + 1);
    ropts(e, &o);
    s = env_open_with(e, &o, big, max + 1);
    free(big);
    assert_true(collect(s, g, 0, T(10000)));
    assert_int_equal(g->n, 0);
    assert_terminal(g, SW_STATUS_ERROR, SW_EMSGSIZE, "payload_too_large");
    assert_int_equal(g->term_seq, 0);
    assert_done(g);
    assert_one_error_counted(e, SW_EMSGSIZE);
    /* Checked before publishing: the worker never saw it. */
    natsConnection_Flush((natsConnection *)sw_conn_nats(e->fc));
    sleep_ms(100);
    ingress_stats(e, &st);
    assert_int_equal(st.requests, 0);
    assert_int_equal(st.bad_requests, 0);
    got_free(g);
}

/* Callback mode: the terminal is decided inside sw_router_open, on the
 * calling thread; closing from that callback must be safe. */
static void
payload_too_large_callback_close(void **state)
{
    env *e = *state;
    sw_request_opts o;
    cbgot *c = new_cbgot(e);
    sw_stream *s = NULL;
    size_t max;
    char *big;

    env_start(e, NULL, NULL);
    c->close_on_terminal = 1;
    max = sw_conn_max_payload(e->fc);
    big = calloc(1, max + 1);
    assert_non_null(big);
    ropts(e, &o);
    o.on_item = cb_item;
    o.on_item_arg = c;
    assert_int_equal(sw_router_open(&s, e->rt, &o, big, max + 1), SW_OK);
    free(big);
    /* s may already be closed (by the callback): not touched again. */
    assert_true(cb_wait(c, T(5000)));
    assert_int_equal(c->g.n, 0);
    assert_terminal(&c->g, SW_STATUS_ERROR, SW_EMSGSIZE, "payload_too_large");
    cb_assert_clean(c);
}

static void
no_instances_without_registry(void **state)
{
    env *e = *state;
    sw_request_opts o;
    got *g = new_got(e);
    sw_stream *s;

    env_start(e, NULL, NULL);
    ropts(e, &o);
    o.instance_id = NULL; /* route by endpoint: this router has no registry */
    s = env_open_with(e, &o, "p", 1);
    assert_true(collect(s, g, 0, T(10000)));
    assert_int_equal(g->n, 0);
    assert_terminal(g, SW_STATUS_ERROR, SW_NO_INSTANCES, "no_instances");
    assert_int_equal(g->term_seq, 0);
    assert_done(g);
    assert_int_equal(wctx_get(&e->w, &e->w.started), 0);
}

/* Opens a request with deadline_ms d (0: none) to an M_KEEP worker, reads
 * the kept responder's sw_responder_deadline_left_ms at once, then finishes
 * it (one token) and checks its consumer got that. */
static int64_t
deadline_left_of(env *e, int nth, sw_duration d)
{
    sw_request_opts o;
    got *g = new_got(e);
    sw_responder *r;
    sw_stream *s;
    int64_t left;

    ropts(e, &o);
    o.deadline_ms = d;
    s = env_open_with(e, &o, "p", 1);
    r = kept_responder(e, nth);
    left = sw_responder_deadline_left_ms(r);
    assert_int_equal(sw_responder_send(r, "token-0", 7), SW_OK);
    assert_int_equal(sw_responder_finish(r, SW_STATUS_COMPLETED, NULL), SW_OK);
    kept_release(e, r);
    assert_true(collect(s, g, 0, T(5000)));
    assert_tokens(g, 1);
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    env_close(e, s);
    got_free(g);
    return left;
}

/* sw_responder_deadline_left_ms: "-1 = no deadline"; the milliseconds left
 * of a request's deadline; and (README, docs/PROTOCOL.md "Request.deadline_ms
 * clamped to 24 h") a peer's deadline is clamped to 24 h: 10 days, and the
 * most the wire carries (UINT32_MAX ms, 49.7 days), leave at most
 * 86,400,000 ms. The router sends deadline_ms as given. */
static void
deadline_left(void **state)
{
    env *e = *state;
    const int64_t day = 24 * 3600 * 1000;
    int64_t left;

    e->w.mode = M_KEEP;
    env_start(e, NULL, NULL);
    assert_int_equal(deadline_left_of(e, 1, 0), -1);
    left = deadline_left_of(e, 2, 5000);
    if (left <= 5000 - T(1000) || left > 5000)
        fail_msg("deadline 5000 ms: %lld ms left, want (%lld, 5000]", (long long)left,
                 (long long)(5000 - T(1000)));
    left = deadline_left_of(e, 3, (sw_duration)10 * day);
    if (left <= day - T(1000) || left > day)
        fail_msg("deadline 10 days: %lld ms left, want (%lld, %lld] (clamped to 24 h)",
                 (long long)left, (long long)(day - T(1000)), (long long)day);
    left = deadline_left_of(e, 4, (sw_duration)UINT32_MAX);
    if (left <= day - T(1000) || left > day)
        fail_msg("deadline UINT32_MAX ms: %lld ms left, want (%lld, %lld] (clamped to 24 h)",
                 (long long)left, (long long)(day - T(1000)), (long long)day);
}

static void
deadline_exceeded(void **state)
{
    env *e = *state;
    sw_request_opts o;
    got *g = new_got(e);
    sw_stream *s;
    int64_t t0;

    e->w.mode = M_STREAM;
    e->w.n = 100000;
    e->w.delay_ms = 20;
    env_start(e, NULL, NULL);
    ropts(e, &o);
    o.deadline_ms = 200;
    t0 = now_ms();
    s = env_open_with(e, &o, "p", 1);
    assert_true(collect(s, g, 0, T(10000)));
    assert_terminal(g, SW_STATUS_ERROR, SW_DEADLINE_EXCEEDED, "deadline_exceeded");
    assert_done(g);
    assert_token_prefix(g);
    assert_one_error_counted(e, SW_DEADLINE_EXCEEDED);
    assert_true(now_ms() - t0 >= 190); /* not before the deadline */
    /* The worker stops: send returns SW_ECANCELLED, the flag is set. */
    assert_true(wctx_wait(&e->w, &e->w.stopped, 1, T(3000)));
    assert_int_equal(e->w.stop_rv, SW_ECANCELLED);
    assert_int_equal(e->w.stop_saw_flag, 1);
    assert_true(wctx_wait(&e->w, &e->w.cancel_cb, 1, T(3000)));
    assert_true(wctx_wait(&e->w, &e->w.returned, 1, T(3000)));
    assert_true(wctx_wait(&e->w, &e->w.cancel_cb, 1, T(2000)));
    assert_int_equal(wctx_get(&e->w, &e->w.cancel_cb), 1);
    got_free(g);
}

static void
stream_incomplete(void **state)
{
    env *e = *state;
    sw_router_opts ro;
    got *g = new_got(e);
    sw_stream *s;
    int64_t t0;

    sw_router_opts_init(&ro);
    ro.heartbeat_ms = 50; /* inactivity = 4 * 50 + 500 = 700 ms */
    e->w.mode = M_ABANDON;
    e->w.k = 3;
    env_start(e, NULL, &ro);
    t0 = now_ms();
    s = env_open(e);
    assert_true(collect(s, g, 0, T(10000)));
    assert_tokens(g, 3);
    assert_terminal(g, SW_STATUS_ERROR, SW_STREAM_INCOMPLETE, "stream_incomplete");
    assert_int_equal(g->term_seq, 0);
    assert_done(g);
    assert_true(now_ms() - t0 >= 650);
    got_free(g);
}

static void
overloaded(void **state)
{
    env *e = *state;
    sw_ingress_opts io;
    got *g1 = new_got(e), *g2 = new_got(e), *g3 = new_got(e);
    sw_ingress_stats st;
    sw_stream *s1, *s2, *s3;
    const sw_item *it;

    sw_ingress_opts_init(&io);
    io.max_inflight = 1;
    e->w.mode = M_BLOCK;
    e->w.k = 0;
    e->w.n = 3;
    env_start(e, &io, NULL);
    s1 = env_open(e);
    assert_true(wctx_wait(&e->w, &e->w.started, 1, T(5000)));
    assert_int_equal(sw_stream_next(s1, &it, 0), SW_ETIMEDOUT);
    s2 = env_open(e);
    assert_true(collect(s2, g2, 0, T(10000)));
    assert_int_equal(g2->n, 0);
    assert_terminal(g2, SW_STATUS_ERROR, SW_EOVERLOADED, "overloaded");
    assert_done(g2);
    assert_one_error_counted(e, SW_EOVERLOADED);
    assert_string_equal(g2->instance, sw_ingress_instance_id(e->ing));
    ingress_stats(e, &st);
    assert_int_equal(st.rejected_overload, 1);
    assert_int_equal(st.requests, 1);
    assert_int_equal(st.inflight, 1);
    assert_int_equal(wctx_get(&e->w, &e->w.started), 1);
    /* Let the first one finish; the slot frees up. */
    wctx_open_gate(&e->w);
    assert_true(collect(s1, g1, 0, T(10000)));
    assert_tokens(g1, 3);
    assert_terminal(g1, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_int_equal(ist_wait(e, f_inflight_zero, 1, T(5000)), 1);
    s3 = env_open(e);
    assert_true(collect(s3, g3, 0, T(10000)));
    assert_tokens(g3, 3);
    assert_terminal(g3, SW_STATUS_COMPLETED, SW_OK, "stop");
    got_free(g1);
    got_free(g2);
    got_free(g3);
}

/* max_inflight counts live streams, retained responders included: with
 * max_inflight 1, a responder retained by a handler that has returned
 * (M_KEEP) keeps the slot, and a second request gets the overloaded
 * terminal. Once the first is finished (its final on the wire) the slot is
 * free, though the test has not released it yet (streamwire.h: "a
 * finished responder not yet released no longer counts"): a third request
 * (kept and finished by the test too) completes, and the first is
 * released last. */
static void
overloaded_by_a_retained_responder(void **state)
{
    env *e = *state;
    sw_ingress_opts io;
    got *g1 = new_got(e), *g2 = new_got(e), *g3 = new_got(e);
    sw_ingress_stats st;
    sw_responder *r1, *r3;
    sw_stream *s1, *s2, *s3;
    const sw_item *it;

    sw_ingress_opts_init(&io);
    io.max_inflight = 1;
    e->w.mode = M_KEEP;
    env_start(e, &io, NULL);
    s1 = env_open(e);
    r1 = kept_responder(e, 1); /* its handler has returned; r1 is the test's */
    assert_int_equal(sw_responder_send(r1, "token-0", 7), SW_OK);
    s2 = env_open(e);
    assert_true(collect(s2, g2, 0, T(10000)));
    assert_int_equal(g2->n, 0);
    assert_terminal(g2, SW_STATUS_ERROR, SW_EOVERLOADED, "overloaded");
    assert_done(g2);
    ingress_stats(e, &st);
    assert_int_equal(st.rejected_overload, 1);
    assert_int_equal(st.requests, 1);
    assert_int_equal(st.inflight, 1);
    assert_int_equal(wctx_get(&e->w, &e->w.started), 1);
    assert_int_equal(sw_stream_next(s1, &it, 0), SW_OK); /* the first stream lives on */
    assert_int_equal(it->kind, SW_ITEM_DATA);
    /* The first finishes and is released: the slot frees up. */
    assert_int_equal(sw_responder_send(r1, "token-1", 7), SW_OK);
    assert_int_equal(sw_responder_finish(r1, SW_STATUS_COMPLETED, NULL), SW_OK);
    got_add(g1, it);
    assert_true(collect(s1, g1, 0, T(10000)));
    assert_tokens(g1, 2);
    assert_terminal(g1, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_done(g1);
    assert_int_equal(ist_wait(e, f_inflight_zero, 1, T(5000)), 1);
    s3 = env_open(e);
    r3 = kept_responder(e, 2);
    assert_int_equal(sw_responder_send(r3, "token-0", 7), SW_OK);
    assert_int_equal(sw_responder_finish(r3, SW_STATUS_COMPLETED, NULL), SW_OK);
    kept_release(e, r3);
    assert_true(collect(s3, g3, 0, T(10000)));
    assert_tokens(g3, 1);
    assert_terminal(g3, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_done(g3);
    kept_release(e, r1); /* (finished, and held until now) */
    ingress_stats(e, &st);
    assert_int_equal(st.rejected_overload, 1);
    assert_int_equal(st.requests, 2);
    assert_int_equal(st.finished[SW_STATUS_COMPLETED], 2);
    got_free(g1);
    got_free(g2);
    got_free(g3);
}
/* ======================================================================== */
/* 4. Callback mode                                                          */

static void
callback_completed(void **state)
{
    env *e = *state;
    sw_request_opts o;
    sw_stream *s;
    const sw_item *it = NULL;
    cbgot *c = new_cbgot(e);

    e->w.mode = M_STREAM;
    e->w.n = 40;
    env_start(e, NULL, NULL);
    ropts(e, &o);
    o.on_item = cb_item;
    o.on_item_arg = c;
    s = env_open_with(e, &o, "p", 1);
    assert_int_equal(sw_stream_next(s, &it, 0), SW_EBUSY);
    assert_null(it);
    assert_true(cb_wait(c, T(10000)));
    cb_assert_clean(c);
    assert_tokens(&c->g, 40);
    assert_terminal(&c->g, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_int_equal(c->g.term_seq, 41);
    assert_string_equal(c->g.instance, sw_ingress_instance_id(e->ing));
    assert_int_equal(sw_stream_next(s, &it, 0), SW_EBUSY);
    env_close(e, s);
}

static void
callback_failed(void **state)
{
    env *e = *state;
    sw_request_opts o;
    sw_stream *s;
    cbgot *c = new_cbgot(e);

    e->w.mode = M_FAIL;
    e->w.n = 2;
    env_start(e, NULL, NULL);
    ropts(e, &o);
    o.on_item = cb_item;
    o.on_item_arg = c;
    s = env_open_with(e, &o, "p", 1);
    assert_true(cb_wait(c, T(10000)));
    cb_assert_clean(c);
    assert_tokens(&c->g, 2);
    assert_terminal(&c->g, SW_STATUS_FAILED, SW_OK, "engine_error");
    assert_string_equal(c->g.message, FAIL_MSG);
    env_close(e, s);
}

static void
callback_close_from_terminal(void **state)
{
    env *e = *state;
    sw_request_opts o;
    sw_stream *s = NULL;
    cbgot *c = new_cbgot(e);

    e->w.mode = M_STREAM;
    e->w.n = 25;
    e->w.delay_ms = 1;
    env_start(e, NULL, NULL);
    c->close_on_terminal = 1;
    ropts(e, &o);
    o.on_item = cb_item;
    o.on_item_arg = c;
    assert_int_equal(sw_router_open(&s, e->rt, &o, "p", 1), SW_OK); /* not tracked */
    assert_true(cb_wait(c, T(10000)));
    assert_int_equal(c->closed, 1);
    cb_assert_clean(c);
    assert_tokens(&c->g, 25);
    assert_terminal(&c->g, SW_STATUS_COMPLETED, SW_OK, "stop");
    {
        sw_router_stats rs;
        sw_router_stats_get(e->rt, &rs);
        assert_int_equal(rs.open_streams, 0);
    }
}

static void
callback_close_from_synth_terminal(void **state)
{
    env *e = *state;
    sw_request_opts o;
    sw_stream *s = NULL;
    cbgot *c = new_cbgot(e);

    env_start(e, NULL, NULL);
    c->close_on_terminal = 1;
    ropts(e, &o);
    o.instance_id = "nobody-here";
    o.on_item = cb_item;
    o.on_item_arg = c;
    assert_int_equal(sw_router_open(&s, e->rt, &o, "p", 1), SW_OK); /* not tracked */
    assert_true(cb_wait(c, T(10000)));
    cb_assert_clean(c);
    assert_int_equal(c->g.n, 0);
    assert_terminal(&c->g, SW_STATUS_ERROR, SW_NO_RESPONDERS, "no_responders");
}

static void
callback_cancel_from_callback(void **state)
{
    env *e = *state;
    sw_request_opts o;
    sw_stream *s;
    cbgot *c = new_cbgot(e);

    e->w.mode = M_STREAM;
    e->w.n = 100000;
    e->w.delay_ms = 2;
    env_start(e, NULL, NULL);
    c->cancel_after = 3;
    ropts(e, &o);
    o.on_item = cb_item;
    o.on_item_arg = c;
    s = env_open_with(e, &o, "p", 1);
    assert_true(cb_wait(c, T(10000)));
    cb_assert_clean(c);
    assert_int_equal(c->cancel_rv, SW_OK);
    assert_tokens(&c->g, 3); /* no data after the cancel */
    assert_terminal(&c->g, SW_STATUS_CANCELLED, SW_OK, "cancelled");
    assert_true(wctx_wait(&e->w, &e->w.stopped, 1, T(2000)));
    assert_int_equal(e->w.stop_rv, SW_ECANCELLED);
    assert_true(wctx_wait(&e->w, &e->w.cancel_cb, 1, T(2000)));
    env_close(e, s);
}

/* ======================================================================== */

int
main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        T_(completed_stream),
        T_(sequential_streams),
        T_(router_stats_count_items),
        T_(responder_api_edges),
        T_(on_cancel_after_the_cancel),
        T_(publish_failures_are_told),
        T_(incomplete_max_tokens),
        T_(failed_engine_error),
        T_(handler_returned_without_terminal),
        T_(retained_released_without_terminal),
        T_(retained_finishes_after_handler_returned),
        T_(no_responders),
        T_(payload_too_large),
        T_(payload_too_large_callback_close),
        T_(no_instances_without_registry),
        T_(deadline_exceeded),
        T_(deadline_left),
        T_(stream_incomplete),
        T_(overloaded),
        T_(overloaded_by_a_retained_responder),
        T_(callback_completed),
        T_(callback_failed),
        T_(callback_close_from_terminal),
        T_(callback_close_from_synth_terminal),
        T_(callback_cancel_from_callback),
    };
    sf_filters(argc, argv);
    return cmocka_run_group_tests_name("streams.terminals", tests, sf_group_setup,
                                       sf_group_teardown);
}
