/* tests/integration/test_ready.c -- blocking mode with on_ready, the way an
 * event loop consumes streams (the HTTP gateway does): on_ready posts a
 * wake-up, the loop drains sw_stream_next(s, .., 0). Checks that every item
 * and the terminal become reachable through notifications alone, in order;
 * that a loop which stops taking items stops the worker at the credit
 * window; that a terminal decided inside sw_router_open is notified; and
 * that no call comes after sw_stream_close returns. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <streamwire/streamwire.h>

#include "harness.h"

#define EP "rdy.demo.gen"
#define N 300
#define WINDOW 16

static swh_nats g_nats;
static int g_sent; /* items the handler managed to send (atomic) */

static void
handler(sw_responder *r, void *arg)
{
    size_t plen = 0;
    const char *p = sw_responder_payload(r, &plen);
    int slow = plen == 4 && memcmp(p, "slow", 4) == 0; /* an item every 2 ms */
    (void)arg;
    for (int i = 0; i < N; i++) {
        char tok[16];
        int k = snprintf(tok, sizeof(tok), "t%d", i);
        if (slow)
            swh_sleep_ms(2);
        if (sw_responder_send(r, tok, (size_t)k) != SW_OK)
            return;
        __atomic_fetch_add(&g_sent, 1, __ATOMIC_RELAXED);
    }
    (void)sw_responder_finish(r, SW_STATUS_COMPLETED, NULL);
}

typedef struct waker {
    int fd[2];
    int calls; /* atomic */
} waker;

static void
on_ready(sw_stream *s, void *arg)
{
    waker *w = arg;
    (void)s;
    __atomic_fetch_add(&w->calls, 1, __ATOMIC_RELAXED);
    (void)!write(w->fd[1], "x", 1);
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

/* Waits for a notification (drains the pipe). 1 if one came in time. */
static int
wait_wake(waker *w, int ms)
{
    struct pollfd p = {w->fd[0], POLLIN, 0};
    char buf[256];
    if (poll(&p, 1, ms) <= 0)
        return 0;
    while (read(w->fd[0], buf, sizeof(buf)) == (ssize_t)sizeof(buf)) {
    }
    return 1;
}

/* A worker "inst" on wc running handler, a router on fc, and the request
 * options of a stream to it that notifies on_ready(arg). */
static void
pair_start(sw_conn *wc, sw_conn *fc, const char *inst, sw_ingress **ing, sw_router **r,
           sw_request_opts *q, unsigned window, void (*ready)(sw_stream *, void *), void *arg)
{
    sw_ingress_opts io;
    sw_router_opts ro;
    sw_ingress_opts_init(&io);
    io.endpoint = EP;
    io.instance_id = inst;
    io.handler = handler;
    assert_int_equal(sw_ingress_start(ing, wc, &io), SW_OK);
    sw_router_opts_init(&ro);
    assert_int_equal(sw_router_create(r, fc, &ro), SW_OK);
    sw_request_opts_init(q);
    q->endpoint = EP;
    q->instance_id = inst;
    q->credit_window = window;
    q->on_ready = ready;
    q->on_ready_arg = arg;
}

static void
test_on_ready(void **state)
{
    sw_conn *wc = conn(), *fc = conn();
    sw_ingress *ing;
    sw_router *r;
    sw_request_opts q;
    sw_stream *s;
    waker w = {{-1, -1}, 0};
    const sw_item *it;
    int got = 0, done = 0, calls;
    (void)state;
    assert_int_equal(pipe(w.fd), 0);
    pair_start(wc, fc, "rw1", &ing, &r, &q, WINDOW, on_ready, &w);
    assert_int_equal(sw_router_open(&s, r, &q, "go", 2), SW_OK);

    /* Take nothing for a while: the worker stops at the window. */
    swh_sleep_ms(500);
    assert_true(__atomic_load_n(&g_sent, __ATOMIC_RELAXED) <= WINDOW);
    assert_true(__atomic_load_n(&w.calls, __ATOMIC_RELAXED) > 0);

    /* The loop: take what is there on each wake-up, never block. */
    while (!done) {
        sw_err e;
        while ((e = sw_stream_next(s, &it, 0)) == SW_OK) {
            if (it->kind == SW_ITEM_DATA) {
                char want[16];
                int k = snprintf(want, sizeof(want), "t%d", got);
                assert_int_equal(it->len, (size_t)k);
                assert_memory_equal(it->data, want, (size_t)k);
                assert_int_equal(it->seq, (uint64_t)got + 1);
                got++;
            } else {
                assert_int_equal(it->terminal.status, SW_STATUS_COMPLETED);
                done = 1;
                break;
            }
        }
        if (!done) {
            assert_int_equal(e, SW_ETIMEDOUT);
            if (!wait_wake(&w, 10000 * swh_slow()))
                fail_msg("no notification: %d items so far", got);
        }
    }
    assert_int_equal(got, N);
    assert_int_equal(sw_stream_next(s, &it, 0), SW_EEOF);
    sw_stream_close(s);
    calls = __atomic_load_n(&w.calls, __ATOMIC_RELAXED);
    swh_sleep_ms(200);
    assert_int_equal(__atomic_load_n(&w.calls, __ATOMIC_RELAXED), calls);

    /* A terminal decided inside open (no responder on that instance) is
     * notified too. */
    w.calls = 0;
    q.instance_id = "nobody";
    assert_int_equal(sw_router_open(&s, r, &q, "go", 2), SW_OK);
    for (int i = 0; i < 100 && sw_stream_next(s, &it, 0) != SW_OK; i++)
        assert_true(wait_wake(&w, 10000 * swh_slow()));
    assert_int_equal(it->kind, SW_ITEM_TERMINAL);
    assert_int_equal(it->terminal.error, SW_NO_RESPONDERS);
    /* The ticker delivers a terminal decided inside open, and its
     * notification may come after sw_stream_next already took it. */
    for (int64_t until = swh_now_ms() + 10000 * swh_slow();
         __atomic_load_n(&w.calls, __ATOMIC_RELAXED) == 0 && swh_now_ms() < until;)
        swh_sleep_ms(1);
    assert_true(__atomic_load_n(&w.calls, __ATOMIC_RELAXED) > 0);
    sw_stream_close(s);

    close(w.fd[0]);
    close(w.fd[1]);
    sw_router_destroy(r);
    sw_ingress_destroy(ing);
    sw_conn_close(fc);
    sw_conn_close(wc);
}

/* An on_ready that takes its time: in_call while it runs. */
typedef struct slow_ready {
    int in_call, calls; /* atomic */
} slow_ready;

static void
on_ready_slow(sw_stream *s, void *arg)
{
    slow_ready *x = arg;
    (void)s;
    __atomic_store_n(&x->in_call, 1, __ATOMIC_RELEASE);
    __atomic_fetch_add(&x->calls, 1, __ATOMIC_RELAXED);
    swh_sleep_ms(20);
    __atomic_store_n(&x->in_call, 0, __ATOMIC_RELEASE);
}

/* "After sw_stream_close returns it is never called again (close waits for
 * a call in progress)": close is called while on_ready runs (items keep
 * arriving, nothing takes them), and when it returns no call is under way,
 * none comes later, and the argument can be freed (ASan would see a call
 * that touched it). */
static void
test_close_waits_for_on_ready(void **state)
{
    sw_conn *wc = conn(), *fc = conn();
    sw_ingress *ing;
    sw_router *r;
    sw_request_opts q;
    sw_stream *s;
    slow_ready *x = calloc(1, sizeof(*x));
    int calls, in_call;
    (void)state;
    assert_non_null(x);
    pair_start(wc, fc, "rw2", &ing, &r, &q, 1024, on_ready_slow, x);
    assert_int_equal(sw_router_open(&s, r, &q, "slow", 4), SW_OK);
    for (int64_t until = swh_now_ms() + 10000 * swh_slow();
         !(__atomic_load_n(&x->calls, __ATOMIC_ACQUIRE) >= 2 &&
           __atomic_load_n(&x->in_call, __ATOMIC_ACQUIRE)) &&
         swh_now_ms() < until;)
        swh_sleep_ms(1);
    assert_int_equal(__atomic_load_n(&x->in_call, __ATOMIC_ACQUIRE), 1);
    sw_stream_close(s);
    in_call = __atomic_load_n(&x->in_call, __ATOMIC_ACQUIRE);
    calls = __atomic_load_n(&x->calls, __ATOMIC_ACQUIRE);
    if (in_call)
        fail_msg("sw_stream_close returned while on_ready ran");
    swh_sleep_ms(300);
    assert_int_equal(__atomic_load_n(&x->calls, __ATOMIC_ACQUIRE), calls);
    free(x);
    swh_sleep_ms(100); /* (a call now would touch freed memory) */
    sw_router_destroy(r);
    sw_ingress_destroy(ing);
    sw_conn_close(fc);
    sw_conn_close(wc);
}

/* A comma-separated server list (a cluster's URLs): the first that answers
 * is used; none answering is SW_ECONNECT. */
static void
test_url_list(void **state)
{
    char url[256];
    sw_conn_opts o;
    sw_conn *c = NULL;
    (void)state;
    sw_conn_opts_init(&o);
    o.max_reconnect = 1;
    o.connect_timeout_ms = 1000;
    snprintf(url, sizeof(url), "nats://127.0.0.1:1, %s", g_nats.url);
    o.url = url;
    assert_int_equal(sw_conn_open(&c, &o), SW_OK);
    assert_int_equal(sw_conn_status(c), SW_CONN_CONNECTED);
    sw_conn_close(c);
    c = NULL;
    o.url = "nats://127.0.0.1:1,nats://127.0.0.1:2";
    assert_int_equal(sw_conn_open(&c, &o), SW_ECONNECT);
    assert_null(c);
    /* a list that names no server: SW_EINVAL, and no connection (" " made
     * nats.c 3.4.1 free a pointer it had not allocated: the process
     * aborted; "" failed the connect with a NATS status) */
    {
        const char *blank[] = {",", "", " ", "\t", " , \t ,"};
        for (size_t i = 0; i < sizeof(blank) / sizeof(blank[0]); i++) {
            o.url = blank[i];
            c = NULL;
            assert_int_equal(sw_conn_open(&c, &o), SW_EINVAL);
            assert_null(c);
        }
    }
    /* blanks around a URL are not part of it */
    snprintf(url, sizeof(url), " %s\t", g_nats.url);
    o.url = url;
    assert_int_equal(sw_conn_open(&c, &o), SW_OK);
    sw_conn_close(c);
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
        cmocka_unit_test(test_on_ready),
        cmocka_unit_test(test_close_waits_for_on_ready),
        cmocka_unit_test(test_url_list),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
