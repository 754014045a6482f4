/* tests/integration/test_typed.c -- typed items (issue 12) against a real
 * nats-server: sw_responder_send_event's name reaches the consumer in
 * sw_item.event, in order with plain items, alone and coalesced into
 * batches, with every flag; bad names and flags are SW_EINVAL and send
 * nothing (the stream goes on). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <streamwire/streamwire.h>

#include "harness.h"

#define EP "typ.demo.gen"
#define BURST 300

static swh_nats g_nats;

typedef struct seen {
    pthread_mutex_t mu;
    sw_err bad[8]; /* what the refused sends returned */
} seen;

static seen g_seen = {PTHREAD_MUTEX_INITIALIZER, {0}};

/* Expected item k of the stream: its event name and text. */
static void
expected(int k, const char **event, char *text, size_t cap)
{
    static const char *const names[] = {"", "refusal", "metrics", "app.v2:tool-call_1"};
    *event = names[k % 4];
    snprintf(text, cap, "item-%d", k);
}

static void
handler(sw_responder *r, void *arg)
{
    char big[SW_MAX_EVENT + 2];
    int k = 0;
    (void)arg;
    memset(big, 'e', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    pthread_mutex_lock(&g_seen.mu);
    g_seen.bad[0] = sw_responder_send_event(r, "has space", "x", 1, 0);
    g_seen.bad[1] = sw_responder_send_event(r, big, "x", 1, 0); /* 65 characters */
    g_seen.bad[2] = sw_responder_send_event(r, "sw.>", "x", 1, 0);
    g_seen.bad[3] = sw_responder_send_event(r, "refusal", "x", 1, 4); /* unknown flag */
    g_seen.bad[4] = sw_responder_send_event(NULL, "refusal", "x", 1, 0);
    g_seen.bad[5] = sw_responder_send_event(r, "refusal", NULL, 1, 0);
    pthread_mutex_unlock(&g_seen.mu);
    /* one of each kind of send, then a burst the worker coalesces */
    for (; k < BURST; k++) {
        const char *ev;
        char text[32];
        unsigned flags = k == 2 ? SW_SEND_NOWAIT : k == 3 ? SW_SEND_DROPPABLE : 0;
        sw_err rv;
        expected(k, &ev, text, sizeof(text));
        if (k == 0)
            rv = sw_responder_send(r, text, strlen(text)); /* plain, the old call */
        else
            rv = sw_responder_send_event(r, k == 4 ? NULL : ev, text, strlen(text), flags);
        if (rv == SW_EAGAIN) { /* no credit yet for the non-blocking one: retry blocking */
            rv = sw_responder_send_event(r, ev, text, strlen(text), 0);
        }
        if (rv != SW_OK) {
            sw_responder_fail(r, "send_failed", sw_err_name(rv));
            return;
        }
    }
    (void)sw_responder_finish(r, SW_STATUS_COMPLETED, NULL);
}

static sw_conn *
conn(void)
{
    sw_conn_opts o;
    sw_conn *c = NULL;
    sw_conn_opts_init(&o);
    o.url = g_nats.url;
    assert_int_equal(sw_conn_open(&c, &o), SW_OK);
    return c;
}

static void
test_typed_items(void **state)
{
    sw_conn *wc = conn(), *fc = conn();
    sw_ingress *ing;
    sw_router *r;
    sw_ingress_opts io;
    sw_router_opts ro;
    sw_request_opts q;
    sw_stream *s = NULL;
    const sw_item *it;
    int k = 0;
    (void)state;
    sw_ingress_opts_init(&io);
    io.endpoint = EP;
    io.instance_id = "tt1";
    io.handler = handler;
    assert_int_equal(sw_ingress_start(&ing, wc, &io), SW_OK);
    sw_router_opts_init(&ro);
    assert_int_equal(sw_router_create(&r, fc, &ro), SW_OK);

    for (int round = 0; round < 2; round++) {
        sw_request_opts_init(&q);
        q.endpoint = EP;
        q.instance_id = "tt1";
        assert_int_equal(sw_router_open(&s, r, &q, "go", 2), SW_OK);
        if (round == 1)
            swh_sleep_ms(300); /* the worker runs ahead: items come coalesced */
        for (k = 0;; k++) {
            const char *ev;
            char text[32];
            assert_int_equal(sw_stream_next(s, &it, 10000 * swh_slow()), SW_OK);
            if (it->kind != SW_ITEM_DATA)
                break;
            expected(k, &ev, text, sizeof(text));
            if (k == 4)
                ev = ""; /* sent with a NULL name: a plain item */
            assert_non_null(it->event);
            assert_string_equal(it->event, ev);
            assert_int_equal(it->len, strlen(text));
            assert_memory_equal(it->data, text, it->len);
            assert_int_equal(it->droppable, k == 3);
        }
        assert_int_equal(it->kind, SW_ITEM_TERMINAL);
        assert_int_equal(it->terminal.status, SW_STATUS_COMPLETED);
        assert_string_equal(it->event, "");
        assert_int_equal(k, BURST); /* every item, in order, once; nothing of the refused */
        sw_stream_close(s);
    }
    pthread_mutex_lock(&g_seen.mu);
    for (int i = 0; i < 6; i++)
        if (g_seen.bad[i] != SW_EINVAL)
            fail_msg("refused send %d returned %s, want invalid_argument", i,
                     sw_err_name(g_seen.bad[i]));
    pthread_mutex_unlock(&g_seen.mu);

    sw_router_destroy(r);
    sw_ingress_destroy(ing);
    sw_conn_close(fc);
    sw_conn_close(wc);
}

static int
group_setup(void **state)
{
    (void)state;
    return swh_nats_start(&g_nats, NULL);
}

static int
group_teardown(void **state)
{
    (void)state;
    swh_nats_stop(&g_nats);
    return 0;
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_typed_items),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
