/* tests/integration/test_oom.c -- allocation failure on the paths that used
 * to loop or hang for as long as malloc failed (a review of session 28:
 * loops whose exit needs progress that a failed allocation prevents), and
 * on the worker's ends of a stream (a final that needed memory).
 *
 * The test binary interposes malloc and realloc (glibc's __libc_malloc and
 * __libc_realloc do the work): switches make them fail on the test's main
 * thread (realloc(NULL, n), or malloc alone), on every other thread, or on
 * the threads that marked themselves (a worker's handler thread, so that
 * nats.c's threads and the timer go on), and count the failures. Built
 * only without sanitizers (their runtimes own malloc). Threads: the
 * switches are atomics; the handler records what it saw in globals the
 * main thread reads after it has returned; everything else runs on the
 * test's thread.
 *
 * Run some tests: test_oom [<glob>]. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <nats/nats.h>
#include <streamwire/registry.h>
#include <streamwire/streamwire.h>

#include "harness.h"

extern void *__libc_malloc(size_t n);
extern void *__libc_realloc(void *p, size_t n);

static int g_fail_others;       /* malloc and realloc fail on threads other than main */
static int g_fail_main_realloc; /* realloc(NULL, n) fails on the main thread */
static int g_fail_main_malloc;  /* malloc (not realloc) fails on the main thread */
static int g_fail_marked;       /* malloc and realloc fail on the threads that marked themselves */
static unsigned long g_failed;  /* failures so far */
static __thread int t_main;
static __thread int t_marked; /* this thread fails while g_fail_marked (a handler's own) */

void *malloc(size_t n);
void *realloc(void *p, size_t n);

static int
should_fail(int is_realloc, int is_realloc_null)
{
    if (t_main)
        return (is_realloc_null && __atomic_load_n(&g_fail_main_realloc, __ATOMIC_RELAXED)) ||
               (!is_realloc && __atomic_load_n(&g_fail_main_malloc, __ATOMIC_RELAXED));
    return __atomic_load_n(&g_fail_others, __ATOMIC_RELAXED) ||
           (t_marked && __atomic_load_n(&g_fail_marked, __ATOMIC_RELAXED));
}

void *
malloc(size_t n)
{
    if (should_fail(0, 0)) {
        __atomic_fetch_add(&g_failed, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    return __libc_malloc(n);
}

void *
realloc(void *p, size_t n)
{
    if (should_fail(1, p == NULL)) {
        __atomic_fetch_add(&g_failed, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    return __libc_realloc(p, n);
}

static swh_nats g_nats;

/* The registry's keep-alive write of an entry cannot encode it (no memory
 * on the registry's ticker thread for a second): the write is tried again
 * after REG_TICK_MS * 4, a few times in all. It used to be tried again at
 * once, for as long as malloc failed: about a million failed allocations
 * a second on a busy ticker. Once memory is back the entry is kept alive
 * (still listed after more than a lease). */
static void
registry_refresh_without_memory(void **state)
{
    sw_registry *reg = NULL;
    sw_registry_opts o;
    sw_registration r = {"oom-1", "ns.oom.gen", "sw.req.ns.oom.gen.oom-1", "sw.ctl.oom-1"};
    sw_instance *v = NULL;
    size_t n = 0;
    unsigned long failed;
    (void)state;
    sw_registry_opts_init(&o);
    o.backend = "memory";
    o.lease_ms = 1500;
    o.refresh_ms = 100;
    o.log = NULL;
    assert_int_equal(sw_registry_open(&reg, NULL, &o), SW_OK);
    assert_int_equal(sw_registry_register(reg, &r), SW_OK);
    swh_sleep_ms(300);
    __atomic_store_n(&g_failed, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&g_fail_others, 1, __ATOMIC_RELAXED);
    swh_sleep_ms(1000);
    __atomic_store_n(&g_fail_others, 0, __ATOMIC_RELAXED);
    failed = __atomic_load_n(&g_failed, __ATOMIC_RELAXED);
    print_message("failed allocations in 1 s: %lu\n", failed);
    assert_true(failed >= 1);  /* the ticker did try */
    assert_true(failed < 200); /* ~5 tries (one per 200 ms), not a busy loop */
    swh_sleep_ms(2000);        /* past a lease since the outage began */
    assert_int_equal(sw_registry_list(reg, "ns.oom.gen", &v, &n), SW_OK);
    assert_int_equal(n, 1);
    assert_string_equal(v[0].instance_id, "oom-1");
    sw_instances_free(v, n);
    sw_registry_close(reg);
}

typedef struct consumer {
    sw_stream *s;
    int done;
    sw_err rv;
    sw_err error;
    int terminal;
} consumer;

static void *
consumer_main(void *arg)
{
    consumer *c = arg;
    const sw_item *it = NULL;
    c->rv = sw_stream_next(c->s, &it, -1); /* no timeout: only a terminal wakes it */
    if (c->rv == SW_OK && it->kind == SW_ITEM_TERMINAL) {
        c->terminal = 1;
        c->error = it->terminal.error;
    }
    __atomic_store_n(&c->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* sw_router_destroy with no memory for a list of the open streams: every
 * stream still ends with "closed", and a consumer blocked in
 * sw_stream_next with no timeout wakes. It used to take a malloc'd
 * snapshot of them, and ended none when that failed. */
static void
router_destroy_without_memory(void **state)
{
    sw_conn_opts co;
    sw_conn *c = NULL;
    sw_router_opts ro;
    sw_router *r = NULL;
    sw_request_opts q;
    natsSubscription *worker = NULL;
    consumer cs[3];
    pthread_t th[3];
    (void)state;
    sw_conn_opts_init(&co);
    co.url = g_nats.url;
    assert_int_equal(sw_conn_open(&c, &co), SW_OK);
    /* a "worker" that takes the requests and never answers */
    assert_int_equal(natsConnection_SubscribeSync(&worker, (natsConnection *)sw_conn_nats(c),
                                                  "sw.req.ns.oom.gen.silent-1"),
                     NATS_OK);
    sw_router_opts_init(&ro);
    ro.probe_interval_ms = 600000; /* (no probe may end the streams first) */
    ro.inactivity_ms = 600000;
    assert_int_equal(sw_router_create(&r, c, &ro), SW_OK);
    sw_request_opts_init(&q);
    q.endpoint = "ns.oom.gen";
    q.instance_id = "silent-1";
    memset(cs, 0, sizeof(cs));
    for (int i = 0; i < 3; i++) {
        assert_int_equal(sw_router_open(&cs[i].s, r, &q, "hi", 2), SW_OK);
        assert_int_equal(pthread_create(&th[i], NULL, consumer_main, &cs[i]), 0);
    }
    swh_sleep_ms(200);
    for (int i = 0; i < 3; i++)
        assert_false(__atomic_load_n(&cs[i].done, __ATOMIC_ACQUIRE)); /* all waiting */
    __atomic_store_n(&g_failed, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&g_fail_main_realloc, 1, __ATOMIC_RELAXED);
    sw_router_destroy(r);
    __atomic_store_n(&g_fail_main_realloc, 0, __ATOMIC_RELAXED);
    for (int i = 0; i < 3; i++) {
        for (int k = 0; k < 500 && !__atomic_load_n(&cs[i].done, __ATOMIC_ACQUIRE); k++)
            swh_sleep_ms(10);
        assert_true(__atomic_load_n(&cs[i].done, __ATOMIC_ACQUIRE));
        pthread_join(th[i], NULL);
        assert_int_equal(cs[i].rv, SW_OK);
        assert_int_equal(cs[i].terminal, 1);
        assert_int_equal(cs[i].error, SW_ECLOSED);
        sw_stream_close(cs[i].s);
    }
    natsSubscription_Destroy(worker);
    sw_conn_close(c);
}

/* ---------------------------------------------------------------- worker finals */

#define WEP "ns.oom.work"
#define WID "oom-w1"

enum { H_RETURN = 1, H_RETAIN };
static int g_hmode;
static sw_err g_hrv;         /* what the handler's sw_responder_fail returned */
static int g_hdone;          /* the handler returned (atomic) */
static sw_responder *g_kept; /* H_RETAIN's responder, released by its cancel callback */

static void
oom_on_cancel(sw_responder *r, void *arg)
{
    (void)arg;
    /* on whichever thread cancels it: with the drain below, the test's own */
    sw_responder_release(r);
}

/* Three items, then: H_RETURN fails the stream with a message too long
 * for any scratch on the stack while this thread finds no memory, and
 * returns (the library then ends the stream itself, still without
 * memory); H_RETAIN keeps the responder until it is cancelled. */
static void
oom_handler(sw_responder *r, void *arg)
{
    static char msg[3000];
    (void)arg;
    for (int i = 0; i < 3; i++)
        (void)sw_responder_send(r, "tok", 3);
    if (g_hmode == H_RETAIN) {
        g_kept = r;
        sw_responder_retain(r);
        sw_responder_on_cancel(r, oom_on_cancel, NULL);
    } else {
        memset(msg, 'x', sizeof(msg) - 1);
        t_marked = 1;
        g_hrv = sw_responder_fail(r, "engine_error", msg);
    }
    __atomic_store_n(&g_hdone, 1, __ATOMIC_RELEASE);
}

typedef struct world {
    sw_conn *wc, *fc;
    sw_ingress *ing;
    sw_router *rt;
    sw_stream *s;
} world;

static void
world_open(world *w, int mode)
{
    sw_conn_opts co;
    sw_ingress_opts io;
    sw_router_opts ro;
    sw_request_opts q;
    const sw_item *it = NULL;
    memset(w, 0, sizeof(*w));
    g_hmode = mode;
    g_hrv = SW_OK;
    g_hdone = 0;
    sw_conn_opts_init(&co);
    co.url = g_nats.url;
    assert_int_equal(sw_conn_open(&w->wc, &co), SW_OK);
    assert_int_equal(sw_conn_open(&w->fc, &co), SW_OK);
    sw_ingress_opts_init(&io);
    io.endpoint = WEP;
    io.instance_id = WID;
    io.handler = oom_handler;
    io.handler_threads = 1;
    assert_int_equal(sw_ingress_start(&w->ing, w->wc, &io), SW_OK);
    sw_router_opts_init(&ro);
    assert_int_equal(sw_router_create(&w->rt, w->fc, &ro), SW_OK);
    sw_request_opts_init(&q);
    q.endpoint = WEP;
    q.instance_id = WID;
    assert_int_equal(sw_router_open(&w->s, w->rt, &q, "hi", 2), SW_OK);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(sw_stream_next(w->s, &it, 5000), SW_OK);
        assert_int_equal(it->kind, SW_ITEM_DATA);
    }
    for (int k = 0; k < 500 && !__atomic_load_n(&g_hdone, __ATOMIC_ACQUIRE); k++)
        swh_sleep_ms(10);
    assert_true(__atomic_load_n(&g_hdone, __ATOMIC_ACQUIRE));
}

/* The worker's books come back to zero: nothing in flight, nothing held. */
static void
world_settles(world *w)
{
    sw_ingress_stats st;
    for (int k = 0; k < 300; k++) {
        sw_ingress_stats_get(w->ing, &st);
        if (st.inflight == 0 && st.streams_held == 0)
            break;
        swh_sleep_ms(10);
    }
    sw_ingress_stats_get(w->ing, &st);
    assert_int_equal(st.inflight, 0);
    assert_int_equal(st.streams_held, 0);
}

static void
world_close(world *w)
{
    sw_stream_close(w->s);
    sw_router_destroy(w->rt);
    sw_ingress_destroy(w->ing);
    sw_conn_close(w->fc);
    sw_conn_close(w->wc);
}

/* A handler out of memory: its sw_responder_fail says SW_ENOMEM (nothing
 * sent, it may try again), it returns, and the library's own FAILED
 * "handler_returned" final must still go out without memory. It used to
 * need an allocation too: when that failed, the stream stayed open and
 * counted for ever, its heartbeats keeping the frontend waiting with no
 * terminal. */
static void
handler_return_without_memory(void **state)
{
    world w;
    const sw_item *it = NULL;
    (void)state;
    __atomic_store_n(&g_fail_marked, 1, __ATOMIC_RELAXED);
    world_open(&w, H_RETURN);
    assert_int_equal(g_hrv, SW_ENOMEM);
    /* well past the frontend's silence limit (1.5 s): only a terminal ends the wait */
    assert_int_equal(sw_stream_next(w.s, &it, 4000), SW_OK);
    assert_int_equal(it->kind, SW_ITEM_TERMINAL);
    assert_int_equal(it->terminal.status, SW_STATUS_FAILED);
    assert_string_equal(it->terminal.reason, "handler_returned");
    __atomic_store_n(&g_fail_marked, 0, __ATOMIC_RELAXED);
    world_settles(&w);
    world_close(&w);
}

/* Drains w's worker at once with *fail set (allocations failing on this,
 * the draining thread, as the switch says): the stream's handler retained
 * its responder and releases it when cancelled (here, on this thread), and
 * the stream must still end with instance_lost. */
static void
drain_failing(int *fail)
{
    world w;
    const sw_item *it = NULL;
    sw_err rv;
    world_open(&w, H_RETAIN);
    __atomic_store_n(fail, 1, __ATOMIC_RELAXED);
    rv = sw_ingress_drain(w.ing, 0);
    __atomic_store_n(fail, 0, __ATOMIC_RELAXED);
    assert_int_equal(rv, SW_ETIMEDOUT);
    assert_int_equal(sw_stream_next(w.s, &it, 4000), SW_OK);
    assert_int_equal(it->kind, SW_ITEM_TERMINAL);
    assert_int_equal(it->terminal.status, SW_STATUS_ERROR);
    assert_int_equal(it->terminal.error, SW_INSTANCE_LOST);
    world_settles(&w);
    world_close(&w);
}

/* A drain out of memory (malloc fails; realloc, of the drain's list of
 * streams, did not): the stream it cancels still gets its instance_lost
 * final. It used to be left cancelled but not terminated: counted for
 * ever, heartbeats going on, no terminal. */
static void
drain_without_memory(void **state)
{
    (void)state;
    drain_failing(&g_fail_main_malloc);
}

/* A drain that cannot allocate a list of the streams to hand back (realloc
 * from nothing fails), then a destroy: the stream still gets its
 * instance_lost final. The drain took a snapshot of the streams, and one
 * that found no memory handed nothing back: the stream stayed open, its
 * handler waiting for a cancel, its heartbeats keeping the frontend
 * waiting with no terminal. Streams are now swept in batches on the stack
 * (swn_ing_sweep_take). */
static void
drain_without_list(void **state)
{
    (void)state;
    drain_failing(&g_fail_main_realloc);
}

static int
group_setup(void **state)
{
    (void)state;
    t_main = 1;
    return swh_nats_start(&g_nats, NULL);
}

static int
group_teardown(void **state)
{
    (void)state;
    swh_nats_stop(&g_nats);
    return 0;
}

/* test_oom [<glob>]: only the tests whose names match. */
int
main(int argc, char **argv)
{
    if (argc > 1 && argv[1][0] != '\0')
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(registry_refresh_without_memory),
        cmocka_unit_test(router_destroy_without_memory),
        cmocka_unit_test(handler_return_without_memory),
        cmocka_unit_test(drain_without_memory),
        cmocka_unit_test(drain_without_list),
    };
    return cmocka_run_group_tests_name("oom", tests, group_setup, group_teardown);
}
