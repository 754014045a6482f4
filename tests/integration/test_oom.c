/* tests/integration/test_oom.c -- allocation failure on the paths that used
 * to loop or hang for as long as malloc failed (a review of session 28:
 * loops whose exit needs progress that a failed allocation prevents), and
 * on the worker's ends of a stream (a final that needed memory; what finish
 * and fail return after a sealed publish found no memory).
 *
 * The test binary interposes malloc and realloc (glibc's __libc_malloc and
 * __libc_realloc do the work): switches make them fail on the test's main
 * thread (realloc(NULL, n), or malloc alone), on every other thread, or on
 * the threads that marked themselves (a worker's handler thread, so that
 * nats.c's threads and the timer go on; optionally only allocations of some
 * size, after letting the first few through), and count the failures. Built
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
#include <sys/stat.h>

#include <cmocka.h>

#include <nats/nats.h>
#include <streamwire/registry.h>
#include <streamwire/streamwire.h>

#include "harness.h"
#include "transport/seal.h"

extern void *__libc_malloc(size_t n);
extern void *__libc_realloc(void *p, size_t n);

static int g_fail_others;       /* malloc and realloc fail on threads other than main */
static int g_fail_main_realloc; /* realloc(NULL, n) fails on the main thread */
static int g_fail_main_malloc;  /* malloc (not realloc) fails on the main thread */
static int g_fail_marked;       /* malloc and realloc fail on the threads that marked themselves */
static size_t g_marked_min;     /* nonzero: g_fail_marked fails only allocations of this many bytes
                                   or more */
static int g_marked_pass;       /* the first this many that g_fail_marked would fail go through */
static unsigned long g_failed;  /* failures so far */
static __thread int t_main;
static __thread int t_marked; /* this thread fails while g_fail_marked (a handler's own) */

void *malloc(size_t n);
void *realloc(void *p, size_t n);

static int
should_fail(int is_realloc, int is_realloc_null, size_t n)
{
    if (t_main)
        return (is_realloc_null && __atomic_load_n(&g_fail_main_realloc, __ATOMIC_RELAXED)) ||
               (!is_realloc && __atomic_load_n(&g_fail_main_malloc, __ATOMIC_RELAXED));
    if (__atomic_load_n(&g_fail_others, __ATOMIC_RELAXED))
        return 1;
    if (!t_marked || !__atomic_load_n(&g_fail_marked, __ATOMIC_RELAXED) ||
        n < __atomic_load_n(&g_marked_min, __ATOMIC_RELAXED))
        return 0;
    /* (the marked thread alone reaches here: no race on the count) */
    if (__atomic_load_n(&g_marked_pass, __ATOMIC_RELAXED) > 0) {
        __atomic_fetch_sub(&g_marked_pass, 1, __ATOMIC_RELAXED);
        return 0;
    }
    return 1;
}

void *
malloc(size_t n)
{
    if (should_fail(0, 0, n)) {
        __atomic_fetch_add(&g_failed, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    return __libc_malloc(n);
}

void *
realloc(void *p, size_t n)
{
    if (should_fail(1, p == NULL, n)) {
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

/* Watch events, recorded without allocating (the callback runs on the
 * registry's ticker, which may be failing its allocations). */
typedef struct evrec {
    pthread_mutex_t mu;
    int n;
    sw_registry_event ev[16];
    char id[16][SW_MAX_TOKEN + 1];
} evrec;
static void
evrec_on(void *arg, sw_registry_event ev, const sw_instance *inst)
{
    evrec *r = arg;
    pthread_mutex_lock(&r->mu);
    if (r->n < 16) {
        r->ev[r->n] = ev;
        snprintf(r->id[r->n], sizeof(r->id[0]), "%s", inst->instance_id);
        r->n++;
    }
    pthread_mutex_unlock(&r->mu);
}
static int
evrec_n(evrec *r)
{
    int n;
    pthread_mutex_lock(&r->mu);
    n = r->n;
    pthread_mutex_unlock(&r->mu);
    return n;
}
static sw_registry *
memory_registry(void)
{
    sw_registry *reg = NULL;
    sw_registry_opts o;
    sw_registry_opts_init(&o);
    o.backend = "memory";
    o.lease_ms = 1500;
    o.refresh_ms = 100;
    o.log = NULL;
    assert_int_equal(sw_registry_open(&reg, NULL, &o), SW_OK);
    return reg;
}

/* A watcher is told of every change even while the registry's ticker,
 * which delivers the news, can allocate nothing: an instance that comes
 * and one that goes. The ticker used to copy its watcher list for each
 * event (a malloc) and drop the event when that failed, and the change
 * was then never told: a router's pool never routed to the instance, or
 * routed to a dead one for good. */
static void
registry_watch_news_without_memory(void **state)
{
    sw_registry *reg = memory_registry();
    sw_registration r = {"oom-2", "ns.oom.gen", "sw.req.ns.oom.gen.oom-2", "sw.ctl.oom-2"};
    evrec rec;
    int id = 0;
    (void)state;
    memset(&rec, 0, sizeof(rec));
    pthread_mutex_init(&rec.mu, NULL);
    assert_int_equal(sw_registry_watch(reg, evrec_on, &rec, &id), SW_OK);
    __atomic_store_n(&g_failed, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&g_fail_others, 1, __ATOMIC_RELAXED);
    assert_int_equal(sw_registry_register(reg, &r), SW_OK); /* (on this thread: memory backend) */
    for (int i = 0; i < 200 && evrec_n(&rec) < 1; i++)
        swh_sleep_ms(10);
    __atomic_store_n(&g_fail_others, 0, __ATOMIC_RELAXED);
    swh_sleep_ms(200);
    assert_int_equal(evrec_n(&rec), 1);
    assert_int_equal(rec.ev[0], SW_REGISTRY_ADDED);
    assert_string_equal(rec.id[0], "oom-2");
    __atomic_store_n(&g_fail_others, 1, __ATOMIC_RELAXED);
    assert_int_equal(sw_registry_deregister(reg, "oom-2"), SW_OK);
    for (int i = 0; i < 200 && evrec_n(&rec) < 2; i++)
        swh_sleep_ms(10);
    __atomic_store_n(&g_fail_others, 0, __ATOMIC_RELAXED);
    print_message("failed allocations on other threads: %lu\n",
                  __atomic_load_n(&g_failed, __ATOMIC_RELAXED));
    swh_sleep_ms(200);
    assert_int_equal(evrec_n(&rec), 2);
    assert_int_equal(rec.ev[1], SW_REGISTRY_REMOVED);
    assert_string_equal(rec.id[1], "oom-2");
    sw_registry_unwatch(reg, id);
    sw_registry_close(reg);
    pthread_mutex_destroy(&rec.mu);
}

/* sw_registry_watch without memory for its snapshot says so (SW_ENOMEM)
 * and adds no watcher; it used to add one that was never told of the
 * live instances. With memory back, a watch gets its snapshot. */
static void
registry_watch_snapshot_without_memory(void **state)
{
    sw_registry *reg = memory_registry();
    sw_registration r = {"oom-3", "ns.oom.gen", "sw.req.ns.oom.gen.oom-3", "sw.ctl.oom-3"};
    evrec lost, got;
    int id = 0;
    (void)state;
    memset(&lost, 0, sizeof(lost));
    memset(&got, 0, sizeof(got));
    pthread_mutex_init(&lost.mu, NULL);
    pthread_mutex_init(&got.mu, NULL);
    assert_int_equal(sw_registry_register(reg, &r), SW_OK);
    __atomic_store_n(&g_fail_main_malloc, 1, __ATOMIC_RELAXED);
    assert_int_equal(sw_registry_watch(reg, evrec_on, &lost, &id), SW_ENOMEM);
    __atomic_store_n(&g_fail_main_malloc, 0, __ATOMIC_RELAXED);
    assert_int_equal(sw_registry_watch(reg, evrec_on, &got, &id), SW_OK);
    for (int i = 0; i < 200 && evrec_n(&got) < 1; i++)
        swh_sleep_ms(10);
    assert_int_equal(sw_registry_deregister(reg, "oom-3"), SW_OK);
    for (int i = 0; i < 200 && evrec_n(&got) < 2; i++)
        swh_sleep_ms(10);
    swh_sleep_ms(100);
    assert_int_equal(evrec_n(&got), 2);
    assert_int_equal(got.ev[0], SW_REGISTRY_ADDED);
    assert_int_equal(got.ev[1], SW_REGISTRY_REMOVED);
    assert_string_equal(got.id[0], "oom-3");
    assert_int_equal(evrec_n(&lost), 0); /* no watcher was added */
    sw_registry_unwatch(reg, id);
    sw_registry_close(reg);
    pthread_mutex_destroy(&lost.mu);
    pthread_mutex_destroy(&got.mu);
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

/* ---------------------------------------------------- a sealed publish without memory */

#define BIG 3000
enum { H_FINISH = 1, H_FAIL };
static sw_err g_bsend;         /* what the handler's send of BIG bytes returned */
static unsigned long g_bfail;  /* the allocations that failed during that send */
static sw_err g_bend, g_bend2; /* what its finish (or fail) returned, and a second one */
static char g_key[320];

/* Sends BIG bytes while the publish cannot seal them (the allocation for a
 * sealed message of more than about 1.97 KB fails: the second of at least
 * 2048 bytes on this thread, after the ring's chunk for the body), then,
 * with memory back, ends the stream (H_FINISH: finish; H_FAIL: fail) and
 * tries to end it again. */
static void
big_handler(sw_responder *r, void *arg)
{
    static char big[BIG];
    (void)arg;
    memset(big, 'b', sizeof(big));
    __atomic_store_n(&g_failed, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&g_marked_min, 2048, __ATOMIC_RELAXED);
    __atomic_store_n(&g_marked_pass, 1, __ATOMIC_RELAXED);
    t_marked = 1;
    __atomic_store_n(&g_fail_marked, 1, __ATOMIC_RELAXED);
    g_bsend = sw_responder_send(r, big, sizeof(big));
    __atomic_store_n(&g_fail_marked, 0, __ATOMIC_RELAXED);
    t_marked = 0;
    __atomic_store_n(&g_marked_min, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&g_marked_pass, 0, __ATOMIC_RELAXED);
    g_bfail = __atomic_load_n(&g_failed, __ATOMIC_RELAXED);
    if (g_hmode == H_FINISH) {
        g_bend = sw_responder_finish(r, SW_STATUS_COMPLETED, NULL);
        g_bend2 = sw_responder_finish(r, SW_STATUS_COMPLETED, NULL);
    } else {
        g_bend = sw_responder_fail(r, "engine_error", "gave up");
        g_bend2 = sw_responder_fail(r, "engine_error", "gave up");
    }
    __atomic_store_n(&g_hdone, 1, __ATOMIC_RELEASE);
}

/* A sealed worker, coalescing off (its handler's thread publishes each
 * item itself), runs big_handler in `mode`; its frontend, sealed too,
 * must get the BIG bytes and then the terminal. Returns the terminal's
 * item in *term. */
static void
sealed_big(int mode, world *w, const sw_item **term)
{
    sw_conn_opts co;
    sw_ingress_opts io;
    sw_router_opts ro;
    sw_request_opts q;
    const sw_item *it = NULL;
    memset(w, 0, sizeof(*w));
    g_hmode = mode;
    g_bsend = g_bend = g_bend2 = SW_EINVAL;
    g_bfail = 0;
    g_hdone = 0;
    sw_conn_opts_init(&co);
    co.url = g_nats.url;
    co.seal_key_file = g_key;
    assert_int_equal(sw_conn_open(&w->wc, &co), SW_OK);
    assert_int_equal(sw_conn_open(&w->fc, &co), SW_OK);
    assert_true(sw_conn_sealed(w->wc));
    sw_ingress_opts_init(&io);
    io.endpoint = WEP;
    io.instance_id = WID;
    io.handler = big_handler;
    io.handler_threads = 1;
    io.coalesce_us = SW_COALESCE_OFF;
    assert_int_equal(sw_ingress_start(&w->ing, w->wc, &io), SW_OK);
    sw_router_opts_init(&ro);
    assert_int_equal(sw_router_create(&w->rt, w->fc, &ro), SW_OK);
    sw_request_opts_init(&q);
    q.endpoint = WEP;
    q.instance_id = WID;
    assert_int_equal(sw_router_open(&w->s, w->rt, &q, "hi", 2), SW_OK);
    for (int k = 0; k < 500 && !__atomic_load_n(&g_hdone, __ATOMIC_ACQUIRE); k++)
        swh_sleep_ms(10);
    assert_true(__atomic_load_n(&g_hdone, __ATOMIC_ACQUIRE));
    assert_int_equal(g_bsend, SW_OK); /* kept: its publish is what failed */
    assert_int_equal(g_bfail, 1);     /* the sealed message's allocation, and nothing else */
    /* the item comes all the same (the frontend asks for it again), then the terminal */
    assert_int_equal(sw_stream_next(w->s, &it, 4000), SW_OK);
    assert_int_equal(it->kind, SW_ITEM_DATA);
    assert_int_equal(it->len, BIG);
    assert_int_equal(((const char *)it->data)[BIG - 1], 'b');
    assert_int_equal(sw_stream_next(w->s, term, 4000), SW_OK);
    assert_int_equal((*term)->kind, SW_ITEM_TERMINAL);
}

/* finish after a send whose sealed publish found no memory: the final is
 * accepted and the stream ends, so finish says SW_OK (the header: SW_ENOMEM
 * never comes from finish; an earlier publish's failure is told only if it
 * is a NATS error), and a second finish SW_ECLOSED. finish used to return
 * the send's SW_ENOMEM after the stream had ended, as if it might be tried
 * again. */
static void
finish_after_sealed_publish_without_memory(void **state)
{
    world w;
    const sw_item *it = NULL;
    (void)state;
    sealed_big(H_FINISH, &w, &it);
    assert_int_equal(it->terminal.status, SW_STATUS_COMPLETED);
    assert_string_equal(it->terminal.reason, "stop");
    assert_int_equal(g_bend, SW_OK);
    assert_int_equal(g_bend2, SW_ECLOSED);
    world_settles(&w);
    world_close(&w);
}

/* The same with fail: it used to return SW_ENOMEM, which for fail means
 * "nothing was sent, try again", after its final had gone; the retry was
 * SW_ECLOSED. */
static void
fail_after_sealed_publish_without_memory(void **state)
{
    world w;
    const sw_item *it = NULL;
    (void)state;
    sealed_big(H_FAIL, &w, &it);
    assert_int_equal(it->terminal.status, SW_STATUS_FAILED);
    assert_string_equal(it->terminal.reason, "engine_error");
    assert_int_equal(g_bend, SW_OK);
    assert_int_equal(g_bend2, SW_ECLOSED);
    world_settles(&w);
    world_close(&w);
}

/* A fail whose message is too long for the stack (BIG bytes), while this
 * thread finds memory for the final's body (the first allocation of at
 * least 2048 bytes) but none to keep it (the ring's chunk) nor to seal it
 * for its publish: SW_ENOMEM, and the header's promise for it holds:
 * nothing was sent and the call may be made again. The second call, with
 * memory back, ends the stream with the whole message. The first used to
 * end the stream all the same, its final neither kept nor published: the
 * second said SW_ECLOSED. */
static void
long_fail_handler(sw_responder *r, void *arg)
{
    static char msg[BIG];
    (void)arg;
    memset(msg, 'm', sizeof(msg) - 1);
    __atomic_store_n(&g_failed, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&g_marked_min, 2048, __ATOMIC_RELAXED);
    __atomic_store_n(&g_marked_pass, 1, __ATOMIC_RELAXED);
    t_marked = 1;
    __atomic_store_n(&g_fail_marked, 1, __ATOMIC_RELAXED);
    g_bend = sw_responder_fail(r, "engine_error", msg);
    __atomic_store_n(&g_fail_marked, 0, __ATOMIC_RELAXED);
    t_marked = 0;
    __atomic_store_n(&g_marked_min, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&g_marked_pass, 0, __ATOMIC_RELAXED);
    g_bfail = __atomic_load_n(&g_failed, __ATOMIC_RELAXED);
    g_bend2 = sw_responder_fail(r, "engine_error", msg);
    __atomic_store_n(&g_hdone, 1, __ATOMIC_RELEASE);
}

static void
long_fail_without_memory_to_send_it(void **state)
{
    world w;
    sw_conn_opts co;
    sw_ingress_opts io;
    sw_router_opts ro;
    sw_request_opts q;
    const sw_item *it = NULL;
    (void)state;
    memset(&w, 0, sizeof(w));
    g_bend = g_bend2 = SW_EINVAL;
    g_bfail = 0;
    g_hdone = 0;
    sw_conn_opts_init(&co);
    co.url = g_nats.url;
    co.seal_key_file = g_key;
    assert_int_equal(sw_conn_open(&w.wc, &co), SW_OK);
    assert_int_equal(sw_conn_open(&w.fc, &co), SW_OK);
    sw_ingress_opts_init(&io);
    io.endpoint = WEP;
    io.instance_id = WID;
    io.handler = long_fail_handler;
    io.handler_threads = 1;
    assert_int_equal(sw_ingress_start(&w.ing, w.wc, &io), SW_OK);
    sw_router_opts_init(&ro);
    assert_int_equal(sw_router_create(&w.rt, w.fc, &ro), SW_OK);
    sw_request_opts_init(&q);
    q.endpoint = WEP;
    q.instance_id = WID;
    assert_int_equal(sw_router_open(&w.s, w.rt, &q, "hi", 2), SW_OK);
    for (int k = 0; k < 500 && !__atomic_load_n(&g_hdone, __ATOMIC_ACQUIRE); k++)
        swh_sleep_ms(10);
    assert_true(__atomic_load_n(&g_hdone, __ATOMIC_ACQUIRE));
    assert_int_equal(g_bfail, 2); /* the ring's chunk, then the sealed message */
    assert_int_equal(g_bend, SW_ENOMEM);
    assert_int_equal(g_bend2, SW_OK);
    assert_int_equal(sw_stream_next(w.s, &it, 4000), SW_OK);
    assert_int_equal(it->kind, SW_ITEM_TERMINAL);
    assert_int_equal(it->terminal.status, SW_STATUS_FAILED);
    assert_string_equal(it->terminal.reason, "engine_error");
    assert_int_equal(it->terminal.message[0], 'm'); /* with its message (the frontend cuts it) */
    world_settles(&w);
    world_close(&w);
}

static int
group_setup(void **state)
{
    swt_seal_key k;
    char hex[SWT_SEAL_KEY_HEX + 1];
    FILE *f;
    (void)state;
    t_main = 1;
    if (swh_nats_start(&g_nats, NULL) != 0)
        return -1;
    snprintf(g_key, sizeof(g_key), "%s/oom.key", g_nats.dir);
    if (swt_seal_key_generate(&k) != SW_OK || (f = fopen(g_key, "w")) == NULL)
        return -1;
    swt_seal_key_hex(&k, hex);
    fprintf(f, "%s\n", hex);
    fclose(f);
    swt_seal_key_wipe(&k);
    return chmod(g_key, 0600);
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
        cmocka_unit_test(registry_watch_news_without_memory),
        cmocka_unit_test(registry_watch_snapshot_without_memory),
        cmocka_unit_test(router_destroy_without_memory),
        cmocka_unit_test(handler_return_without_memory),
        cmocka_unit_test(drain_without_memory),
        cmocka_unit_test(drain_without_list),
        cmocka_unit_test(finish_after_sealed_publish_without_memory),
        cmocka_unit_test(fail_after_sealed_publish_without_memory),
        cmocka_unit_test(long_fail_without_memory_to_send_it),
    };
    return cmocka_run_group_tests_name("oom", tests, group_setup, group_teardown);
}
