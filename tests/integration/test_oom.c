/* tests/integration/test_oom.c -- allocation failure on the paths that used
 * to loop or hang for as long as malloc failed (a review of session 28:
 * loops whose exit needs progress that a failed allocation prevents).
 *
 * The test binary interposes malloc and realloc (glibc's __libc_malloc and
 * __libc_realloc do the work): a switch makes them fail on the test's main
 * thread, or on every other thread, and counts the failures. Built only
 * without sanitizers (their runtimes own malloc). Threads: the switches are
 * atomics; everything else runs on the test's thread. */
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
static unsigned long g_failed;  /* failures so far */
static __thread int t_main;

void *malloc(size_t n);
void *realloc(void *p, size_t n);

static int
should_fail(int is_realloc_null)
{
    if (t_main)
        return is_realloc_null && __atomic_load_n(&g_fail_main_realloc, __ATOMIC_RELAXED);
    return __atomic_load_n(&g_fail_others, __ATOMIC_RELAXED);
}

void *
malloc(size_t n)
{
    if (should_fail(0)) {
        __atomic_fetch_add(&g_failed, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    return __libc_malloc(n);
}

void *
realloc(void *p, size_t n)
{
    if (should_fail(p == NULL)) {
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

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(registry_refresh_without_memory),
        cmocka_unit_test(router_destroy_without_memory),
    };
    return cmocka_run_group_tests_name("oom", tests, group_setup, group_teardown);
}
