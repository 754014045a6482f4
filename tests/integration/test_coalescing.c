/* tests/integration/test_coalescing.c -- end-to-end streams over a real
 * nats-server (issues 3 and 5), split from test_streams.c by theme:
 * coalescing: items a fast producer queues travel batched and
 * in order; coalescing off.
 * Fixture, threads and locks: streams_fixture.h. */
#include "streams_fixture.h"

/* ======================================================================== */
/* 6b. Coalescing and acknowledged finals                                    */

/* A producer that sends as fast as it can: the items it queues while a
 * message goes out share the next one (StreamItemWrapper.batch). The
 * consumer still sees every item once, in order, then the terminal. */
static void
batched_items_in_order(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_stream *s;
    sw_ingress_stats st;
    sw_stream_stats ss;
    const int N = 2000;

    e->w.mode = M_STREAM;
    e->w.n = N;
    env_start(e, NULL, NULL);
    s = env_open(e);
    assert_true(collect(s, g, 0, T(20000)));
    assert_tokens(g, (size_t)N);
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_int_equal(g->term_seq, (uint64_t)N + 1);
    assert_done(g);
    ingress_stats(e, &st);
    assert_int_equal(st.items_sent, (uint64_t)N);
    /* Some messages carried several items; none carried none. */
    assert_true(st.messages_sent >= 1);
    if (st.messages_sent >= (uint64_t)N + 1)
        fail_msg("%llu messages for %d items and a final: nothing was coalesced",
                 (unsigned long long)st.messages_sent, N);
    assert_int_equal(st.items_resent, 0);
    sw_stream_stats_get(s, &ss);
    assert_int_equal(ss.items, (uint64_t)N);
    assert_int_equal(ss.duplicates, 0);
    assert_int_equal(ss.reordered, 0);
    got_free(g);
}

/* coalesce_us = SW_COALESCE_OFF: every item and the final in a message of
 * its own; a negative value other than SW_COALESCE_OFF is refused. */
static void
coalescing_off(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_ingress_opts io;
    sw_ingress_stats st;
    sw_stream *s;
    const int N = 300;

    sw_ingress_opts_init(&io);
    io.coalesce_us = SW_COALESCE_OFF;
    e->w.mode = M_STREAM;
    e->w.n = N;
    env_start(e, &io, NULL);
    {
        sw_ingress *bad = NULL;
        sw_ingress_opts b;
        sw_ingress_opts_init(&b);
        b.endpoint = EP;
        b.handler = test_handler;
        b.handler_arg = &e->w;
        b.coalesce_us = -5;
        assert_int_equal(sw_ingress_start(&bad, e->wc, &b), SW_EINVAL);
        assert_null(bad);
    }
    s = env_open(e);
    assert_true(collect(s, g, 0, T(20000)));
    assert_tokens(g, (size_t)N);
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_done(g);
    ingress_stats(e, &st);
    assert_int_equal(st.items_sent, (uint64_t)N);
    assert_int_equal(st.messages_sent, (uint64_t)N + 1);
    got_free(g);
}

/* Which messages a burst travels in (issue 17). With the sender thread held,
 * a stream that sends 10 items and its final at once is published by its
 * handler's own thread. On a send-asap connection the first item of a quiet
 * stream leaves alone at once (lowest latency), the rest with the final: at
 * least 2 messages. On a buffered connection (no_send_asap) nats.c holds
 * the bytes for its flusher anyway, so the first item waits for the rest
 * and the final takes all 11 entries in one message. Each stream is whole
 * and in order either way. */
static void
burst_messages(env *e, int buffered)
{
    uint64_t before;
    sw_ingress_stats st;
    e->worker_no_send_asap = buffered;
    e->w.mode = M_STREAM;
    e->w.n = 10;
    env_start(e, NULL, NULL);
    swx_ingress_hold_sender(e->ing, 1);
    ingress_stats(e, &st);
    before = st.messages_sent;
    for (int k = 0; k < 3; k++) {
        got *g = new_got(e);
        sw_stream *s = env_open(e);
        uint64_t msgs;
        assert_true(collect(s, g, 0, T(10000)));
        assert_tokens(g, 10);
        assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
        assert_done(g);
        ingress_stats(e, &st);
        msgs = st.messages_sent - before;
        before = st.messages_sent;
        if (buffered && msgs != 1)
            fail_msg("buffered stream %d: %llu messages, expected the burst in 1", k,
                     (unsigned long long)msgs);
        if (!buffered && msgs < 2)
            fail_msg("send-asap stream %d: %llu message(s), expected the first item alone", k,
                     (unsigned long long)msgs);
    }
    swx_ingress_hold_sender(e->ing, 0);
}

static void
burst_send_asap_first_item_alone(void **state)
{
    burst_messages(*state, 0);
}

static void
burst_buffered_one_message(void **state)
{
    burst_messages(*state, 1);
}

/* ======================================================================== */

int
main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        T_(batched_items_in_order),
        T_(coalescing_off),
        T_(burst_send_asap_first_item_alone),
        T_(burst_buffered_one_message),
    };
    sf_filters(argc, argv);
    return cmocka_run_group_tests_name("streams.coalescing", tests, sf_group_setup,
                                       sf_group_teardown);
}
