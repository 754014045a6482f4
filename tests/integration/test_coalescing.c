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

/* ======================================================================== */

int
main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        T_(batched_items_in_order),
        T_(coalescing_off),
    };
    sf_filters(argc, argv);
    return cmocka_run_group_tests_name("streams.coalescing", tests, sf_group_setup,
                                       sf_group_teardown);
}
