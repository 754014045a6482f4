/* tests/integration/test_streams.c -- end-to-end streams over a real
 * nats-server (issues 3 and 5).
 *
 * One nats-server (JetStream on, free port, temp dir) is started for the
 * whole group by the harness. Each test builds its own world in-process: a
 * worker connection with an sw_ingress whose handler is driven by a wctx
 * (mode + knobs + observations), and a frontend connection with an
 * sw_router. The per-test teardown unblocks handlers, closes streams and
 * destroys everything, so a failing test does not leak into the next one.
 *
 * Every test asserts on content ("token-0".."token-N-1"), order (seq 1..N),
 * counts and the exact terminal. Timing is never asserted as a speed: every
 * wait is a generous bound multiplied by swh_slow() (3 under sanitizers).
 *
 * cmocka assertions are only used on the test's main thread; handler
 * threads, library callbacks and helper threads record what they see into
 * mutex-protected structs that the main thread checks.
 *
 * Tests that pin library bugs (failing until fixed; see each comment):
 *   router_stats_count_items                sw_router_stats.items never counted
 *   router_backlog_no_spurious_incomplete   inactivity measured on the router's
 *                                           own delivery backlog
 *   instance_not_lost_while_streaming       instance probes declare a streaming
 *                                           instance lost
 *   router_destroy_during_final_linger      lingering terminal never delivered
 *                                           in callback mode after destroy
 *   ingress_destroy_with_retained_responder calls return cancelled, not closed
 * scale_1000_streams also fails under CPU load from the first two.
 *
 * Run some tests: test_streams [<glob> [<skip-glob>]], e.g.
 * `test_streams 'cancel*'`, or `test_streams '' 'scale*'` for all but one. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include <nats/nats.h>
#include <streamwire/streamwire.h>

#include "harness.h"
#include "ingress/chaos.h"
#include "proto/sw_codec.h"
#include "transport/sw_transport.h"

#define EP "itest.llm.generate"

static swh_nats g_nats;
static int g_slow = 1;

/* A generous bound, scaled for sanitizer runs. */
#define T(ms) ((int64_t)(ms) * g_slow)

static int64_t
now_ms(void)
{
    return (int64_t)swh_now_ms();
}

static void
sleep_ms(long ms)
{
    swh_sleep_ms(ms);
}

static void
cond_init_mono(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

/* Waits on cv (mu held) until the absolute monotonic deadline. */
static void
cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t until_ms)
{
    struct timespec ts;
    ts.tv_sec = (time_t)(until_ms / 1000);
    ts.tv_nsec = (long)(until_ms % 1000) * 1000000L;
    (void)pthread_cond_timedwait(cv, mu, &ts);
}

/* ======================================================================== */
/* Worker side: one configurable handler                                     */

enum {
    M_STREAM = 1,    /* n tokens (delay_ms apart), finish COMPLETED */
    M_MAXTOK,        /* n tokens, or max_tokens of them and INCOMPLETE "max_tokens" */
    M_FAIL,          /* n tokens, fail("engine_error", FAIL_MSG) */
    M_RETURN,        /* n tokens, return without a terminal */
    M_RETAIN_RELEASE,/* retain; a thread sends n tokens after the handler returned, releases */
    M_RETAIN_FINISH, /* retain; a thread sends n tokens, finishes, releases */
    M_ABANDON,       /* k tokens, swx_responder_abandon */
    M_AFTER_FINAL,   /* n tokens, finish, swx_responder_send_after_final */
    M_GARBAGE,       /* k tokens, raw garbage, then keeps sending until stopped */
    M_GAP,           /* k tokens, skip a seq, tokens k..n-1, finish */
    M_BLOCK,         /* k tokens, block until the gate opens (then n-k more, finish) or cancel */
    M_TRY,           /* try_send / droppable probe against a small window */
    M_KEEP,          /* retain and return; the test owns the responder */
    M_PAUSE,         /* k tokens, sleep delay_ms, the rest, finish */
    M_API,           /* responder API misuse and edge cases (results in rv[]) */
    M_LOSE_FINAL     /* n tokens, swx_responder_lose_next, finish COMPLETED */
};

#define FAIL_MSG "the engine fell over: CUDA error 700"

typedef struct wctx {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* knobs (set before requests arrive) */
    int mode;
    int n;
    int k;
    int delay_ms;
    int gate;
    /* observations */
    int started;       /* handler calls entered */
    int returned;      /* handler calls returned */
    int sent;          /* successful data sends, all streams */
    int stopped;       /* sends that failed and ended a stream's loop */
    sw_err stop_rv;    /* the last such failure */
    int stop_saw_flag; /* sw_responder_cancelled() was 1 at that point */
    int cancel_cb;     /* sw_responder_on_cancel callbacks */
    int finished;      /* finish/fail calls that returned SW_OK */
    sw_err finish_rv;  /* the last finish/fail/after-final result */
    sw_err rv[16];     /* M_TRY / M_API results */
    size_t big_len;    /* M_API: a data item this long exceeds the max payload */
    int nrv;
    int try_done;
    int thr_done;
    char payload[64];
    uint32_t max_tokens;
    char reqid[SW_REQUEST_ID_HEX];
    sw_responder *kept;
    pthread_t thr;
    int thr_started;
} wctx;

static void
wctx_init(wctx *w)
{
    memset(w, 0, sizeof(*w));
    pthread_mutex_init(&w->mu, NULL);
    cond_init_mono(&w->cv);
    w->mode = M_STREAM;
    w->n = 5;
}

static void
wctx_fini(wctx *w)
{
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
}

static void
wctx_add(wctx *w, int *field, int delta)
{
    pthread_mutex_lock(&w->mu);
    *field += delta;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static int
wctx_get(wctx *w, const int *field)
{
    int v;
    pthread_mutex_lock(&w->mu);
    v = *field;
    pthread_mutex_unlock(&w->mu);
    return v;
}

/* Waits until *field >= atleast. Returns 1 if reached. */
static int
wctx_wait(wctx *w, const int *field, int atleast, int64_t timeout_ms)
{
    int64_t until = now_ms() + timeout_ms;
    int ok;
    pthread_mutex_lock(&w->mu);
    while (*field < atleast && now_ms() < until)
        cond_wait_until(&w->cv, &w->mu, until);
    ok = *field >= atleast;
    pthread_mutex_unlock(&w->mu);
    return ok;
}

static void
wctx_open_gate(wctx *w)
{
    wctx_add(w, &w->gate, 1);
}

static void
w_on_cancel(sw_responder *r, void *arg)
{
    wctx *w = arg;
    (void)r;
    wctx_add(w, &w->cancel_cb, 1);
}

/* A cancel callback that takes its time (an engine tearing a batch down
 * synchronously). */
static void
w_on_cancel_slow(sw_responder *r, void *arg)
{
    wctx *w = arg;
    (void)r;
    sleep_ms(1500);
    wctx_add(w, &w->cancel_cb, 1);
}

static void
w_stop(wctx *w, sw_responder *r, sw_err rv)
{
    int flag = sw_responder_cancelled(r);
    pthread_mutex_lock(&w->mu);
    w->stopped++;
    w->stop_rv = rv;
    w->stop_saw_flag = flag;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void
w_finished(wctx *w, sw_err rv)
{
    pthread_mutex_lock(&w->mu);
    w->finish_rv = rv;
    if (rv == SW_OK)
        w->finished++;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Sends "token-i" for i in [from, to). Returns 1 if all went out, 0 if a
 * send failed (recorded with w_stop). */
static int
w_send_tokens(wctx *w, sw_responder *r, int from, int to, int delay_ms)
{
    char buf[32];
    for (int i = from; i < to; i++) {
        int len;
        sw_err rv;
        if (delay_ms > 0)
            sleep_ms(delay_ms);
        len = snprintf(buf, sizeof(buf), "token-%d", i);
        rv = sw_responder_send(r, buf, (size_t)len);
        if (rv != SW_OK) {
            w_stop(w, r, rv);
            return 0;
        }
        wctx_add(w, &w->sent, 1);
    }
    return 1;
}

static void *
w_retained_main(void *arg)
{
    wctx *w = arg;
    sw_responder *r;
    pthread_mutex_lock(&w->mu);
    r = w->kept;
    pthread_mutex_unlock(&w->mu);
    /* Stream only once the handler has returned: the responder is ours now. */
    (void)wctx_wait(w, &w->returned, 1, T(10000));
    if (w_send_tokens(w, r, 0, w->n, w->delay_ms) && w->mode == M_RETAIN_FINISH)
        w_finished(w, sw_responder_finish(r, SW_STATUS_COMPLETED, NULL));
    sw_responder_release(r);
    wctx_add(w, &w->thr_done, 1);
    return NULL;
}

static void
w_try(wctx *w, sw_responder *r)
{
    /* The request's window is 4 and nobody reads: a droppable that fits,
     * three data items, then no credit. */
    sw_err rv[6];
    rv[0] = sw_responder_send_droppable(r, "metrics-a", 9);
    rv[1] = sw_responder_try_send(r, "token-0", 7);
    rv[2] = sw_responder_try_send(r, "token-1", 7);
    rv[3] = sw_responder_try_send(r, "token-2", 7);
    rv[4] = sw_responder_try_send(r, "token-3", 7); /* no credit: SW_EAGAIN */
    rv[5] = sw_responder_send_droppable(r, "metrics-b", 9); /* shed */
    pthread_mutex_lock(&w->mu);
    memcpy(w->rv, rv, sizeof(rv));
    w->nrv = 6;
    w->try_done = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    /* Blocking sends wait for the consumer's credit. */
    if (w_send_tokens(w, r, 3, w->n, 0))
        w_finished(w, sw_responder_finish(r, SW_STATUS_COMPLETED, NULL));
}

static void
w_api(wctx *w, sw_responder *r)
{
    sw_err rv[12];
    char *big = calloc(1, w->big_len);
    rv[0] = sw_responder_finish(r, SW_STATUS_FAILED, "x");      /* not for finish */
    rv[1] = sw_responder_finish(r, SW_STATUS_INCOMPLETE, NULL); /* reason required */
    rv[2] = sw_responder_fail(r, "Bad Code", "m");              /* not a code token */
    rv[3] = sw_responder_fail(r, "", "m");
    rv[4] = sw_responder_send(r, NULL, 5);
    rv[5] = big ? sw_responder_send(r, big, w->big_len) : SW_ENOMEM; /* too big: nothing sent */
    rv[6] = sw_responder_send(r, "token-0", 7);
    rv[7] = sw_responder_finish(r, SW_STATUS_COMPLETED, "eos");
    rv[8] = sw_responder_finish(r, SW_STATUS_COMPLETED, NULL);
    rv[9] = sw_responder_send(r, "token-1", 7);
    rv[10] = sw_responder_fail(r, "engine_error", "late");
    rv[11] = sw_responder_try_send(r, "token-1", 7);
    free(big);
    pthread_mutex_lock(&w->mu);
    memcpy(w->rv, rv, sizeof(rv));
    w->nrv = 12;
    w->try_done = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void
test_handler(sw_responder *r, void *arg)
{
    wctx *w = arg;
    size_t plen = 0;
    const void *p = sw_responder_payload(r, &plen);
    static const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                      0xff, 0xff, 0xff, 0xff, 0xff, 0x01};

    pthread_mutex_lock(&w->mu);
    w->started++;
    if (plen < sizeof(w->payload)) {
        if (plen > 0) /* an empty payload may come as NULL */
            memcpy(w->payload, p, plen);
        w->payload[plen] = '\0';
    }
    w->max_tokens = sw_responder_max_tokens(r);
    snprintf(w->reqid, sizeof(w->reqid), "%s", sw_responder_request_id(r));
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    if (plen == 10 && memcmp(p, "slowcancel", 10) == 0) {
        /* Per-request override: stream until cancelled, slow cancel callback. */
        sw_responder_on_cancel(r, w_on_cancel_slow, w);
        (void)w_send_tokens(w, r, 0, 100000, 20);
        wctx_add(w, &w->returned, 1);
        return;
    }
    sw_responder_on_cancel(r, w_on_cancel, w);

    switch (w->mode) {
    case M_STREAM:
        if (w_send_tokens(w, r, 0, w->n, w->delay_ms))
            w_finished(w, sw_responder_finish(r, SW_STATUS_COMPLETED, NULL));
        break;
    case M_MAXTOK: {
        uint32_t mt = sw_responder_max_tokens(r);
        if (mt != 0 && mt < (uint32_t)w->n) {
            if (w_send_tokens(w, r, 0, (int)mt, w->delay_ms))
                w_finished(w, sw_responder_finish(r, SW_STATUS_INCOMPLETE, "max_tokens"));
        } else if (w_send_tokens(w, r, 0, w->n, w->delay_ms)) {
            w_finished(w, sw_responder_finish(r, SW_STATUS_COMPLETED, NULL));
        }
        break;
    }
    case M_FAIL:
        if (w_send_tokens(w, r, 0, w->n, w->delay_ms))
            w_finished(w, sw_responder_fail(r, "engine_error", FAIL_MSG));
        break;
    case M_RETURN:
        (void)w_send_tokens(w, r, 0, w->n, w->delay_ms);
        break;
    case M_RETAIN_RELEASE:
    case M_RETAIN_FINISH:
        sw_responder_retain(r);
        pthread_mutex_lock(&w->mu);
        w->kept = r;
        if (pthread_create(&w->thr, NULL, w_retained_main, w) == 0)
            w->thr_started = 1;
        pthread_mutex_unlock(&w->mu);
        if (!w->thr_started)
            sw_responder_release(r);
        break;
    case M_ABANDON:
        if (w_send_tokens(w, r, 0, w->k, w->delay_ms))
            swx_responder_abandon(r);
        break;
    case M_AFTER_FINAL:
        if (w_send_tokens(w, r, 0, w->n, w->delay_ms)) {
            sw_err rv = sw_responder_finish(r, SW_STATUS_COMPLETED, NULL);
            if (rv == SW_OK)
                rv = swx_responder_send_after_final(r, "token-late", 10);
            w_finished(w, rv);
        }
        break;
    case M_GARBAGE:
        if (w_send_tokens(w, r, 0, w->k, 0)) {
            sw_err rv = swx_responder_publish_raw(r, garbage, sizeof(garbage));
            w_finished(w, rv);
            /* Keep going: the frontend must not show any of these. */
            if (w_send_tokens(w, r, w->k, w->n, w->delay_ms))
                (void)sw_responder_finish(r, SW_STATUS_COMPLETED, NULL);
        }
        break;
    case M_GAP:
        if (w_send_tokens(w, r, 0, w->k, 0)) {
            w_finished(w, swx_responder_skip_seq(r));
            if (w_send_tokens(w, r, w->k, w->n, w->delay_ms))
                (void)sw_responder_finish(r, SW_STATUS_COMPLETED, NULL);
        }
        break;
    case M_BLOCK:
        if (!w_send_tokens(w, r, 0, w->k, 0))
            break;
        pthread_mutex_lock(&w->mu);
        while (!w->gate && !sw_responder_cancelled(r))
            cond_wait_until(&w->cv, &w->mu, now_ms() + 5);
        pthread_mutex_unlock(&w->mu);
        if (sw_responder_cancelled(r)) {
            sw_err rv = sw_responder_send(r, "token-x", 7);
            w_stop(w, r, rv);
        } else if (w_send_tokens(w, r, w->k, w->n, w->delay_ms)) {
            w_finished(w, sw_responder_finish(r, SW_STATUS_COMPLETED, NULL));
        }
        break;
    case M_TRY:
        w_try(w, r);
        break;
    case M_API:
        w_api(w, r);
        break;
    case M_LOSE_FINAL:
        if (w_send_tokens(w, r, 0, w->n, w->delay_ms)) {
            swx_responder_lose_next(r);
            w_finished(w, sw_responder_finish(r, SW_STATUS_COMPLETED, NULL));
        }
        break;
    case M_KEEP:
        sw_responder_retain(r);
        pthread_mutex_lock(&w->mu);
        w->kept = r;
        pthread_mutex_unlock(&w->mu);
        break;
    case M_PAUSE:
        if (w_send_tokens(w, r, 0, w->k, 0)) {
            sleep_ms(w->delay_ms);
            if (w_send_tokens(w, r, w->k, w->n, 0))
                w_finished(w, sw_responder_finish(r, SW_STATUS_COMPLETED, NULL));
        }
        break;
    default:
        break;
    }
    wctx_add(w, &w->returned, 1);
}

/* ======================================================================== */
/* Fixture                                                                   */

#define MAX_TRACKED 16

struct got;
struct cbgot;

typedef struct env {
    sw_conn *wc; /* worker connection */
    sw_conn *fc; /* frontend connection */
    sw_ingress *ing;
    sw_router *rt;
    wctx w;
    sw_stream *streams[MAX_TRACKED];
    /* Collectors live on the heap and are freed by teardown after the
     * router is gone: a failing test longjmps out of its frame while library
     * threads may still call back into them. */
    struct got **gots;
    size_t ngots;
    struct cbgot **cbs;
    size_t ncbs;
    /* scale_1000_streams: its streams (closed by teardown if it failed) */
    void *scale_v;
    /* a second frontend (two_routers_one_instance) */
    sw_conn *fc2;
    sw_router *rt2;
} env;

static int
setup(void **state)
{
    env *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return -1;
    wctx_init(&e->w);
    *state = e;
    return 0;
}

static void
env_untrack(env *e, sw_stream *s)
{
    for (int i = 0; i < MAX_TRACKED; i++)
        if (e->streams[i] == s)
            e->streams[i] = NULL;
}

static void env_free_collectors(env *e);
static void env_scale_cleanup(env *e);

static int
teardown(void **state)
{
    env *e = *state;
    wctx_open_gate(&e->w);
    for (int i = 0; i < MAX_TRACKED; i++) {
        sw_stream_close(e->streams[i]);
        e->streams[i] = NULL;
    }
    env_scale_cleanup(e);
    sw_router_destroy(e->rt2);
    sw_router_destroy(e->rt);
    sw_ingress_destroy(e->ing);
    if (e->w.thr_started)
        pthread_join(e->w.thr, NULL);
    env_free_collectors(e);
    sw_conn_close(e->fc2);
    sw_conn_close(e->fc);
    sw_conn_close(e->wc);
    wctx_fini(&e->w);
    free(e);
    return 0;
}

static sw_conn *
conn_open(const char *name)
{
    sw_conn_opts o;
    sw_conn *c = NULL;
    sw_conn_opts_init(&o);
    o.url = g_nats.url;
    o.name = name;
    assert_int_equal(sw_conn_open(&c, &o), SW_OK);
    assert_non_null(c);
    return c;
}

/* Starts worker and frontend. io/ro may be NULL (defaults); endpoint,
 * handler and handler_arg are filled in here. */
static void
env_start(env *e, sw_ingress_opts *io, sw_router_opts *ro)
{
    sw_ingress_opts iod;
    sw_router_opts rod;
    if (io == NULL) {
        sw_ingress_opts_init(&iod);
        io = &iod;
    }
    if (ro == NULL) {
        sw_router_opts_init(&rod);
        ro = &rod;
    }
    io->endpoint = EP;
    io->handler = test_handler;
    io->handler_arg = &e->w;
    e->wc = conn_open("itest-worker");
    e->fc = conn_open("itest-frontend");
    assert_int_equal(sw_ingress_start(&e->ing, e->wc, io), SW_OK);
    assert_int_equal(sw_router_create(&e->rt, e->fc, ro), SW_OK);
}

static void
ropts(env *e, sw_request_opts *o)
{
    sw_request_opts_init(o);
    o->endpoint = EP;
    o->instance_id = sw_ingress_instance_id(e->ing);
}

/* Opens a stream (tracked for teardown). */
static sw_stream *
env_open_with(env *e, const sw_request_opts *o, const void *payload, size_t len)
{
    sw_stream *s = NULL;
    assert_int_equal(sw_router_open(&s, e->rt, o, payload, len), SW_OK);
    assert_non_null(s);
    for (int i = 0; i < MAX_TRACKED; i++) {
        if (e->streams[i] == NULL) {
            e->streams[i] = s;
            return s;
        }
    }
    fail_msg("too many tracked streams");
    return NULL;
}

static sw_stream *
env_open(env *e)
{
    sw_request_opts o;
    ropts(e, &o);
    return env_open_with(e, &o, "prompt", 6);
}

static void
env_close(env *e, sw_stream *s)
{
    env_untrack(e, s);
    sw_stream_close(s);
}

static void
ingress_stats(env *e, sw_ingress_stats *st)
{
    sw_ingress_stats_get(e->ing, st);
}

/* Polls an ingress counter (read by fn) until >= want. Returns its value. */
typedef uint64_t (*ist_field_fn)(const sw_ingress_stats *);
static uint64_t
ist_wait(env *e, ist_field_fn fn, uint64_t want, int64_t timeout_ms)
{
    int64_t until = now_ms() + timeout_ms;
    sw_ingress_stats st;
    for (;;) {
        ingress_stats(e, &st);
        if (fn(&st) >= want || now_ms() >= until)
            return fn(&st);
        sleep_ms(5);
    }
}
static uint64_t f_cancels(const sw_ingress_stats *s) { return s->cancels; }
static uint64_t f_bad(const sw_ingress_stats *s) { return s->bad_requests; }
static uint64_t f_fin_cancelled(const sw_ingress_stats *s) { return s->finished[SW_STATUS_CANCELLED]; }
static uint64_t f_fin_completed(const sw_ingress_stats *s) { return s->finished[SW_STATUS_COMPLETED]; }
static uint64_t f_inflight_zero(const sw_ingress_stats *s) { return s->inflight == 0; }
static uint64_t f_held_zero(const sw_ingress_stats *s) { return s->streams_held == 0; }

/* ======================================================================== */
/* Consumer side: collecting a stream                                        */

typedef struct got {
    size_t n, cap;
    char **data;
    uint64_t *seq;
    int *droppable;
    int terminals;
    sw_status status;
    sw_err error;
    char reason[128];
    char message[256];
    uint64_t term_seq;
    char instance[SW_MAX_TOKEN + 1]; /* from the first item */
    int instance_changed;            /* a later item named another instance */
    int eof;                         /* SW_EEOF results after the terminal */
    sw_err bad_rv;                   /* an unexpected sw_stream_next result */
    int timed_out;
    int read_delay_ms;
} got;

static void
got_free(got *g)
{
    for (size_t i = 0; i < g->n; i++)
        free(g->data[i]);
    free(g->data);
    free(g->seq);
    free(g->droppable);
    memset(g, 0, sizeof(*g));
}

static void
got_add(got *g, const sw_item *it)
{
    const char *inst = it->instance_id ? it->instance_id : "(null)";
    if (g->n == 0 && g->terminals == 0)
        snprintf(g->instance, sizeof(g->instance), "%s", inst);
    else if (strcmp(g->instance, inst) != 0)
        g->instance_changed++;
    if (it->kind == SW_ITEM_TERMINAL) {
        g->terminals++;
        if (g->terminals == 1) {
            g->status = it->terminal.status;
            g->error = it->terminal.error;
            snprintf(g->reason, sizeof(g->reason), "%s",
                     it->terminal.reason ? it->terminal.reason : "(null)");
            snprintf(g->message, sizeof(g->message), "%s",
                     it->terminal.message ? it->terminal.message : "(null)");
            g->term_seq = it->seq;
        }
        return;
    }
    if (g->n == g->cap) {
        size_t nc = g->cap ? g->cap * 2 : 64;
        g->data = realloc(g->data, nc * sizeof(*g->data));
        g->seq = realloc(g->seq, nc * sizeof(*g->seq));
        g->droppable = realloc(g->droppable, nc * sizeof(*g->droppable));
        if (g->data == NULL || g->seq == NULL || g->droppable == NULL)
            abort();
        g->cap = nc;
    }
    g->data[g->n] = malloc(it->len + 1);
    if (g->data[g->n] == NULL)
        abort();
    if (it->len)
        memcpy(g->data[g->n], it->data, it->len);
    g->data[g->n][it->len] = '\0';
    g->seq[g->n] = it->seq;
    g->droppable[g->n] = it->droppable;
    g->n++;
}

/* Blocking mode: reads items until the terminal, until max_data data items
 * were collected in total (0 = no limit), or until timeout_ms. After the
 * terminal, calls next twice more and counts SW_EEOF results. Returns 1 if
 * the terminal was seen. */
static int
collect(sw_stream *s, got *g, size_t max_data, int64_t timeout_ms)
{
    int64_t until = now_ms() + timeout_ms;
    const sw_item *it;
    while (g->terminals == 0) {
        int64_t left;
        sw_err rv;
        if (max_data != 0 && g->n >= max_data)
            return 0;
        left = until - now_ms();
        if (left <= 0) {
            g->timed_out = 1;
            return 0;
        }
        rv = sw_stream_next(s, &it, left);
        if (rv == SW_ETIMEDOUT) {
            g->timed_out = 1;
            return 0;
        }
        if (rv != SW_OK || it == NULL) {
            g->bad_rv = rv != SW_OK ? rv : SW_EINTERNAL;
            return 0;
        }
        got_add(g, it);
        if (g->read_delay_ms > 0 && it->kind == SW_ITEM_DATA)
            sleep_ms(g->read_delay_ms);
    }
    for (int i = 0; i < 2; i++) {
        it = (const sw_item *)(uintptr_t)1;
        if (sw_stream_next(s, &it, 0) == SW_EEOF && it == NULL)
            g->eof++;
    }
    return 1;
}

/* Data items are exactly "token-<first>".."token-<first+count-1>" with seqs
 * first_seq.. in order. */
static void
assert_tokens_from(const got *g, size_t count, size_t first, uint64_t first_seq)
{
    char exp[32];
    assert_int_equal(g->n, count);
    for (size_t i = 0; i < count; i++) {
        snprintf(exp, sizeof(exp), "token-%zu", first + i);
        assert_string_equal(g->data[i], exp);
        assert_int_equal(g->seq[i], first_seq + i);
        assert_int_equal(g->droppable[i], 0);
    }
}

static void
assert_tokens(const got *g, size_t count)
{
    assert_tokens_from(g, count, 0, 1);
}

/* Whatever arrived is a gap-free prefix token-0.. with seqs 1.. */
static void
assert_token_prefix(const got *g)
{
    assert_tokens(g, g->n);
}

static void
assert_terminal(const got *g, sw_status status, sw_err err, const char *reason)
{
    if (g->terminals != 1)
        fail_msg("terminals=%d (timed_out=%d bad_rv=%s items=%zu)", g->terminals, g->timed_out,
                 sw_err_name(g->bad_rv), g->n);
    assert_int_equal(g->terminals, 1);
    if ((int)g->status != (int)status || g->error != err || strcmp(g->reason, reason) != 0)
        fail_msg("terminal %s/%s/%s (message \"%s\"), want %s/%s/%s", sw_status_name(g->status),
                 sw_err_name(g->error), g->reason, g->message, sw_status_name(status),
                 sw_err_name(err), reason);
    assert_int_equal(g->instance_changed, 0);
}

/* A synthesized or wire terminal delivered, then end-of-stream twice. */
static void
assert_done(const got *g)
{
    assert_int_equal(g->terminals, 1);
    assert_int_equal(g->eof, 2);
}

/* ======================================================================== */
/* Callback-mode collector                                                   */

typedef struct cbgot {
    got g;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int in_cb;
    int concurrent;     /* two callbacks for the stream overlapped */
    int after_terminal; /* callbacks after the terminal */
    size_t cancel_after;/* cancel from the callback after this many data items (0 = never) */
    int cancel_called;
    sw_err cancel_rv;
    int close_on_terminal;
    int closed;
    int busy_ok;        /* sw_stream_next from inside the callback returned SW_EBUSY */
    int busy_checks;
} cbgot;

static void
cbgot_init(cbgot *c)
{
    memset(c, 0, sizeof(*c));
    pthread_mutex_init(&c->mu, NULL);
    cond_init_mono(&c->cv);
    atomic_init(&c->in_cb, 0);
}

static void
cbgot_fini(cbgot *c)
{
    got_free(&c->g);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
}

static void *
env_push(void ***v, size_t *n, void *p)
{
    void **nv = realloc(*v, (*n + 1) * sizeof(*nv));
    if (nv == NULL || p == NULL)
        abort();
    nv[(*n)++] = p;
    *v = nv;
    return p;
}

static got *
new_got(env *e)
{
    return env_push((void ***)&e->gots, &e->ngots, calloc(1, sizeof(got)));
}

/* A zeroed object of `size` bytes that starts with a cbgot (initialised). */
static cbgot *
new_cbgot_sized(env *e, size_t size)
{
    cbgot *c = calloc(1, size);
    if (c == NULL)
        abort();
    cbgot_init(c);
    return env_push((void ***)&e->cbs, &e->ncbs, c);
}

static cbgot *
new_cbgot(env *e)
{
    return new_cbgot_sized(e, sizeof(cbgot));
}

static void
env_free_collectors(env *e)
{
    for (size_t i = 0; i < e->ngots; i++) {
        got_free(e->gots[i]);
        free(e->gots[i]);
    }
    free(e->gots);
    for (size_t i = 0; i < e->ncbs; i++) {
        cbgot_fini(e->cbs[i]);
        free(e->cbs[i]);
    }
    free(e->cbs);
    e->gots = NULL;
    e->cbs = NULL;
    e->ngots = e->ncbs = 0;
}

static void
cb_item(sw_stream *s, const sw_item *it, void *arg)
{
    cbgot *c = arg;
    int do_cancel = 0, do_close = 0;
    const sw_item *dummy = NULL;
    sw_err nrv;

    if (atomic_fetch_add(&c->in_cb, 1) != 0)
        c->concurrent = 1;
    nrv = sw_stream_next(s, &dummy, 0);
    pthread_mutex_lock(&c->mu);
    c->busy_checks++;
    if (nrv == SW_EBUSY && dummy == NULL)
        c->busy_ok++;
    if (c->g.terminals > 0)
        c->after_terminal++;
    got_add(&c->g, it);
    if (it->kind == SW_ITEM_DATA && c->cancel_after != 0 && c->g.n == c->cancel_after &&
        !c->cancel_called) {
        c->cancel_called = 1;
        do_cancel = 1;
    }
    if (it->kind == SW_ITEM_TERMINAL && c->close_on_terminal)
        do_close = 1;
    pthread_mutex_unlock(&c->mu);
    if (do_cancel) {
        sw_err rv = sw_stream_cancel(s);
        pthread_mutex_lock(&c->mu);
        c->cancel_rv = rv;
        pthread_mutex_unlock(&c->mu);
    }
    atomic_fetch_sub(&c->in_cb, 1);
    if (do_close)
        sw_stream_close(s); /* s is gone after this */
    pthread_mutex_lock(&c->mu);
    if (do_close)
        c->closed = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* Waits for the terminal callback (and the close, if asked). */
static int
cb_wait(cbgot *c, int64_t timeout_ms)
{
    int64_t until = now_ms() + timeout_ms;
    int ok;
    pthread_mutex_lock(&c->mu);
    while ((c->g.terminals == 0 || (c->close_on_terminal && !c->closed)) && now_ms() < until)
        cond_wait_until(&c->cv, &c->mu, until);
    ok = c->g.terminals > 0 && (!c->close_on_terminal || c->closed);
    pthread_mutex_unlock(&c->mu);
    return ok;
}

static void
cb_assert_clean(cbgot *c)
{
    /* Nothing after the terminal, never two callbacks at once. */
    sleep_ms(100);
    pthread_mutex_lock(&c->mu);
    assert_int_equal(c->after_terminal, 0);
    assert_int_equal(c->concurrent, 0);
    assert_int_equal(c->g.terminals, 1);
    assert_int_equal(c->busy_ok, c->busy_checks);
    pthread_mutex_unlock(&c->mu);
}

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
        assert_int_equal(rs.nats_dropped, 0);
    }
    got_free(g);
}

/* sw_router_stats.items: "data items delivered" across the router's
 * streams (egress/router.c only counts the per-stream sw_stream_stats.items). */
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

/* Heartbeats keep a stream alive through a pause longer than the
 * inactivity timeout (4*50+500 = 700 ms). */
static void
heartbeats_keep_slow_stream_alive(void **state)
{
    env *e = *state;
    sw_router_opts ro;
    got *g = new_got(e);
    sw_stream_stats ss;
    sw_stream *s;

    sw_router_opts_init(&ro);
    ro.heartbeat_ms = 50;
    e->w.mode = M_PAUSE;
    e->w.k = 2;
    e->w.n = 4;
    e->w.delay_ms = 1500;
    env_start(e, NULL, &ro);
    s = env_open(e);
    assert_true(collect(s, g, 0, T(15000)));
    assert_tokens(g, 4);
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_done(g);
    sw_stream_stats_get(s, &ss);
    assert_true(ss.heartbeats >= 3);
    got_free(g);
}

static void random_id(uint8_t id[16], char hex[SW_REQUEST_ID_HEX]);

/* Heartbeats travel batched per frontend (HeartbeatBatch on
 * sw.rsp.<router>.hb). Many idle streams at once are all kept alive by
 * them, with far fewer messages than beats; a batch that does not decode
 * is counted and harms no stream; beats for unknown streams are counted. */
static void
heartbeat_batches(void **state)
{
    env *e = *state;
    sw_router_opts ro;
    sw_router_stats rs;
    sw_ingress_stats st;
    sw_stream *s[8];
    const int K = 8;
    char subj[SWT_SUBJECT_MAX];
    natsConnection *nc;
    static const uint8_t garbage[] = {0xff, 0xff, 0xff, 0x01};

    sw_router_opts_init(&ro);
    ro.heartbeat_ms = 50;
    e->w.mode = M_PAUSE;
    e->w.k = 1;
    e->w.n = 2;
    e->w.delay_ms = 1200; /* silent for 1.2 s; inactivity is 4 * 50 + 500 = 700 ms */
    env_start(e, NULL, &ro);
    for (int i = 0; i < K; i++)
        s[i] = env_open(e);
    /* Garbage and a forged batch for unknown streams on the beats subject. */
    nc = sw_conn_nats(e->fc);
    assert_int_equal(swt_subject_beats(subj, sizeof(subj), sw_router_id(e->rt)), SW_OK);
    assert_int_equal(natsConnection_Publish(nc, subj, garbage, (int)sizeof(garbage)), NATS_OK);
    {
        /* Two unknown ids, and a real stream's id from the wrong instance. */
        swp_beats m = STREAMWIRE__V1__HEARTBEAT_BATCH__INIT;
        swp_beat b1 = STREAMWIRE__V1__STREAM_BEAT__INIT, b2 = STREAMWIRE__V1__STREAM_BEAT__INIT,
                 b3 = STREAMWIRE__V1__STREAM_BEAT__INIT;
        swp_beat *bp[3] = {&b1, &b2, &b3};
        uint8_t id1[16], id2[16], id3[16], buf[256];
        char hex[SW_REQUEST_ID_HEX];
        size_t len;
        random_id(id1, hex);
        random_id(id2, hex);
        assert_int_equal(swt_response_subject_id(sw_stream_request_id(s[0]), id3), -1);
        {
            char subj3[SWT_SUBJECT_MAX];
            assert_int_equal(swt_subject_response(subj3, sizeof(subj3), "x",
                                                  sw_stream_request_id(s[0])),
                             SW_OK);
            assert_int_equal(swt_response_subject_id(subj3, id3), 0);
        }
        b1.request_id.data = id1;
        b1.request_id.len = 16;
        b2.request_id.data = id2;
        b2.request_id.len = 16;
        b3.request_id.data = id3;
        b3.request_id.len = 16;
        b3.last_seq = 1000; /* would ask for a resend if it were believed */
        m.version = 1;
        m.instance_id = (char *)"forger";
        m.n_beats = 3;
        m.beats = bp;
        assert_int_equal(swp_encode(&m, buf, sizeof(buf), &len), SW_OK);
        assert_int_equal(natsConnection_Publish(nc, subj, buf, (int)len), NATS_OK);
    }
    for (int i = 0; i < K; i++) {
        got *g = new_got(e);
        sw_stream_stats ss;
        assert_true(collect(s[i], g, 0, T(15000)));
        assert_tokens(g, 2);
        assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
        sw_stream_stats_get(s[i], &ss);
        if (ss.heartbeats < 5)
            fail_msg("stream %d: %llu heartbeats in a 1.2 s pause at 50 ms", i,
                     (unsigned long long)ss.heartbeats);
        got_free(g);
    }
    sw_router_stats_get(e->rt, &rs);
    assert_int_equal(rs.bad_messages, 1);
    assert_true(rs.unknown_stream >= 3);
    {
        sw_stream_stats ss0;
        sw_stream_stats_get(s[0], &ss0);
        assert_int_equal(ss0.resend_requests, 0); /* the forged beat was not believed */
    }
    assert_int_equal(rs.terminals[SW_STATUS_COMPLETED], (uint64_t)K);
    ingress_stats(e, &st);
    assert_true(st.heartbeats >= (uint64_t)K * 5);
}

/* Responder API edges: argument errors, an item too big for the bus (the
 * stream goes on), a custom finish reason, and SW_ECLOSED after the end. */
static void
responder_api_edges(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_stream *s;
    static const sw_err want[12] = {SW_EINVAL, SW_EINVAL, SW_EINVAL, SW_EINVAL,
                                    SW_EINVAL, SW_EMSGSIZE, SW_OK, SW_OK,
                                    SW_ECLOSED, SW_ECLOSED, SW_ECLOSED, SW_ECLOSED};

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
item_after_final(void **state)
{
    env *e = *state;
    sw_router_opts ro;
    got *g = new_got(e);
    sw_stream *s;

    sw_router_opts_init(&ro);
    ro.final_linger_ms = (unsigned)T(200);
    e->w.mode = M_AFTER_FINAL;
    e->w.n = 3;
    env_start(e, NULL, &ro);
    s = env_open(e);
    assert_true(collect(s, g, 0, T(10000)));
    assert_tokens(g, 3); /* token-late is never shown */
    assert_terminal(g, SW_STATUS_ERROR, SW_ITEM_AFTER_FINAL, "item_after_final");
    assert_done(g);
    assert_true(wctx_wait(&e->w, &e->w.returned, 1, T(3000)));
    assert_true(wctx_wait(&e->w, &e->w.finished, 1, T(2000)));
    assert_int_equal(e->w.finish_rv, SW_OK);
    got_free(g);
}

static void
item_after_final_callback(void **state)
{
    env *e = *state;
    sw_router_opts ro;
    sw_request_opts o;
    sw_stream *s;
    cbgot *c = new_cbgot(e);

    sw_router_opts_init(&ro);
    ro.final_linger_ms = (unsigned)T(200);
    e->w.mode = M_AFTER_FINAL;
    e->w.n = 3;
    env_start(e, NULL, &ro);
    ropts(e, &o);
    o.on_item = cb_item;
    o.on_item_arg = c;
    s = env_open_with(e, &o, "p", 1);
    assert_true(cb_wait(c, T(10000)));
    cb_assert_clean(c);
    assert_tokens(&c->g, 3);
    assert_terminal(&c->g, SW_STATUS_ERROR, SW_ITEM_AFTER_FINAL, "item_after_final");
    env_close(e, s);
}

static void
decode_error(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_stream *s;

    e->w.mode = M_GARBAGE;
    e->w.k = 2;
    e->w.n = 100000;
    e->w.delay_ms = 5;
    env_start(e, NULL, NULL);
    s = env_open(e);
    assert_true(collect(s, g, 0, T(10000)));
    assert_tokens(g, 2); /* never an item skipped over the garbage */
    assert_terminal(g, SW_STATUS_ERROR, SW_DECODE_ERROR, "decode_error");
    assert_int_equal(g->term_seq, 0);
    assert_done(g);
    assert_true(wctx_wait(&e->w, &e->w.finished, 1, T(2000)));
    assert_int_equal(e->w.finish_rv, SW_OK);
    /* The frontend told the worker to stop. */
    assert_true(wctx_wait(&e->w, &e->w.stopped, 1, T(3000)));
    assert_int_equal(e->w.stop_rv, SW_ECANCELLED);
    got_free(g);
}

static void
decode_error_callback(void **state)
{
    env *e = *state;
    sw_request_opts o;
    sw_stream *s;
    cbgot *c = new_cbgot(e);

    e->w.mode = M_GARBAGE;
    e->w.k = 2;
    e->w.n = 100000;
    e->w.delay_ms = 5;
    env_start(e, NULL, NULL);
    ropts(e, &o);
    o.on_item = cb_item;
    o.on_item_arg = c;
    s = env_open_with(e, &o, "p", 1);
    assert_true(cb_wait(c, T(10000)));
    cb_assert_clean(c);
    assert_tokens(&c->g, 2);
    assert_terminal(&c->g, SW_STATUS_ERROR, SW_DECODE_ERROR, "decode_error");
    env_close(e, s);
}

static void
sequence_gap(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_stream *s;
    sw_stream_stats ss;

    e->w.mode = M_GAP;
    e->w.k = 3;
    e->w.n = 6;
    env_start(e, NULL, NULL);
    s = env_open(e);
    assert_true(collect(s, g, 0, T(10000)));
    assert_tokens(g, 3); /* nothing after the gap */
    assert_terminal(g, SW_STATUS_ERROR, SW_SEQUENCE_GAP, "sequence_gap");
    assert_int_equal(g->term_seq, 0);
    assert_done(g);
    assert_true(wctx_wait(&e->w, &e->w.finished, 1, T(2000)));
    assert_int_equal(e->w.finish_rv, SW_OK);
    sw_stream_stats_get(s, &ss);
    assert_true(ss.resend_requests >= 1); /* repair was tried first */
    assert_int_equal(ss.items, 3);
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
    assert_int_equal(rs.nats_dropped, 0);
    ingress_stats(e, &st);
    assert_int_equal(st.items_sent, (uint64_t)N);
    assert_int_equal(st.items_shed, 0);
    got_free(g);
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
    assert_int_equal(e->w.rv[0], SW_OK);     /* droppable with credit: sent */
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
/* 6. Loss repair                                                            */

static void
loss_repair(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_stream_stats ss;
    sw_ingress_stats st;
    sw_stream *s;
    const int N = 2000;

    e->w.mode = M_STREAM;
    e->w.n = N;
    env_start(e, NULL, NULL);
    swx_ingress_set_drop_rate(e->ing, 0.05);
    s = env_open(e);
    assert_true(collect(s, g, 0, T(60000)));
    assert_tokens(g, (size_t)N); /* each exactly once, in order */
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_done(g);
    sw_stream_stats_get(s, &ss);
    ingress_stats(e, &st);
    if (ss.resend_requests == 0 || st.items_resent == 0)
        fail_msg("no repair happened: resend_requests=%llu items_resent=%llu",
                 (unsigned long long)ss.resend_requests, (unsigned long long)st.items_resent);
    assert_int_equal(ss.items, (uint64_t)N);
    got_free(g);
}

/* The ingress caps a request's window at max_window (8 here; the router
 * asks for its default, 128). The stream must still flow: today the router
 * grants more credit only once consumed + window/2 >= credit granted
 * (8 + 64 < 128), the worker waits for credit after 8 items, and the send
 * times out (send_timeout_ms, shortened here) -- handler_returned after 8.
 * With loss on top, the worker must also keep every unacknowledged item for
 * resend, however much credit the frontend grants. */
static void
window_capped_common(env *e, double drop, int N)
{
    sw_ingress_opts io;
    got *g = new_got(e);
    sw_stream_stats ss;
    sw_ingress_stats st;
    sw_stream *s;

    sw_ingress_opts_init(&io);
    io.max_window = 8;
    io.send_timeout_ms = (unsigned)T(5000);
    e->w.mode = M_STREAM;
    e->w.n = N;
    env_start(e, &io, NULL);
    if (drop > 0)
        swx_ingress_set_drop_rate(e->ing, drop);
    s = env_open(e);
    assert_true(collect(s, g, 0, T(60000)));
    sw_stream_stats_get(s, &ss);
    ingress_stats(e, &st);
    if (g->status != SW_STATUS_COMPLETED)
        fail_msg("ended %s/%s after %zu of %d items (\"%s\"); resend_requests=%llu "
                 "items_resent=%llu; the handler's send failed with %s (%d sent)",
                 sw_status_name(g->status), g->reason, g->n, N, g->message,
                 (unsigned long long)ss.resend_requests, (unsigned long long)st.items_resent,
                 sw_err_name(e->w.stop_rv), wctx_get(&e->w, &e->w.sent));
    assert_tokens(g, (size_t)N);
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
}

static void
window_capped_by_ingress(void **state)
{
    window_capped_common(*state, 0.0, 200);
}

static void
loss_repair_window_capped(void **state)
{
    window_capped_common(*state, 0.05, 1000);
}

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

/* Finished streams leave the worker's table when the frontend acknowledges
 * their finals (ACK_FINALS, one message per worker for many streams), well
 * before the 2 s linger that would otherwise retire them. */
static void
acked_finals_release_worker_state(void **state)
{
    env *e = *state;
    sw_ingress_stats st;
    const int K = 12;
    int64_t t0;

    e->w.mode = M_STREAM;
    e->w.n = 5;
    env_start(e, NULL, NULL);
    for (int i = 0; i < K; i++) {
        got *g = new_got(e);
        sw_stream *s = env_open(e);
        assert_true(collect(s, g, 0, T(10000)));
        assert_tokens(g, 5);
        assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
        env_close(e, s);
        got_free(g);
    }
    t0 = now_ms();
    assert_int_equal(ist_wait(e, f_held_zero, 1, T(1500)), 1);
    if (now_ms() - t0 >= 1900)
        fail_msg("the worker let go of the streams only after %lld ms (linger, not acks)",
                 (long long)(now_ms() - t0));
    ingress_stats(e, &st);
    assert_int_equal(st.finished[SW_STATUS_COMPLETED], (uint64_t)K);
    assert_int_equal(st.items_resent, 0);
    assert_int_equal(st.streams_held, 0);
}

/* A final lost on the way: the worker keeps heartbeating while its final is
 * unacknowledged, the frontend sees last_seq beyond what it has, asks for
 * the rest, and the stream still ends COMPLETED with every item. */
static void
lost_final_is_resent(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_stream *s;
    sw_ingress_stats st;
    sw_stream_stats ss;
    sw_request_opts o;
    const int N = 7;

    e->w.mode = M_LOSE_FINAL;
    e->w.n = N;
    env_start(e, NULL, NULL);
    ropts(e, &o);
    o.heartbeat_ms = 50;
    s = env_open_with(e, &o, "prompt", 6);
    assert_true(collect(s, g, 0, T(10000)));
    assert_tokens(g, (size_t)N);
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_int_equal(g->term_seq, (uint64_t)N + 1);
    assert_done(g);
    sw_stream_stats_get(s, &ss);
    assert_true(ss.resend_requests >= 1);
    assert_true(ss.heartbeats >= 1);
    ingress_stats(e, &st);
    assert_int_equal(st.items_sent, (uint64_t)N);
    assert_true(st.items_resent >= 1); /* the final */
    assert_int_equal(st.finished[SW_STATUS_COMPLETED], 1);
    assert_int_equal(ist_wait(e, f_held_zero, 1, T(1500)), 1);
    got_free(g);
}

/* ======================================================================== */
/* 7. Scale                                                                  */

#define SC_NS 1000

typedef struct sc_stream {
    sw_stream *s;
    uint64_t next;  /* next expected seq */
    int bad;        /* out-of-order, wrong content */
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
        for (int i = 0; i < 9; i++)
            print_message(" %s=%llu", sw_err_name(100 + i), (unsigned long long)rs.errors[i]);
        print_message(" other=%llu\n", (unsigned long long)rs.errors_other);
        fail_msg("scale: done=%d bad=%d wrong_count=%d wrong_terminals=%d after_terminal=%d "
                 "not_completed=%d (errors: incomplete=%llu gap=%llu other=%llu; "
                 "nats_dropped=%llu; ingress sent=%llu resent=%llu overload=%llu)",
                 sc_done, bad, wrong_count, wrong_term, after, not_completed,
                 (unsigned long long)rs.errors[SW_STREAM_INCOMPLETE - 100],
                 (unsigned long long)rs.errors[SW_SEQUENCE_GAP - 100],
                 (unsigned long long)rs.errors_other, (unsigned long long)rs.nats_dropped,
                 (unsigned long long)st.items_sent, (unsigned long long)st.items_resent,
                 (unsigned long long)st.rejected_overload);
    }
    assert_int_equal(rs.terminals[SW_STATUS_COMPLETED], NS);
    assert_int_equal(rs.open_streams, 0);
    assert_int_equal(rs.nats_dropped, 0);
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
 * all of whose items had been sent, ended stream_incomplete with 0 items). */
typedef struct slowcb {
    cbgot c; /* first: allocated and finalised as a cbgot by the fixture */
    int slept;
} slowcb;

static void
slow_cb_item(sw_stream *s, const sw_item *it, void *arg)
{
    slowcb *x = arg;
    if (it->kind == SW_ITEM_DATA && !x->slept) {
        x->slept = 1;
        sleep_ms(2000);
    }
    cb_item(s, it, &x->c);
}

static void
router_backlog_no_spurious_incomplete(void **state)
{
    env *e = *state;
    sw_request_opts o;
    got *gb = new_got(e);
    sw_stream *a, *b;
    slowcb *x = (slowcb *)new_cbgot_sized(e, sizeof(slowcb));

    e->w.mode = M_STREAM;
    e->w.n = 40;
    e->w.delay_ms = 50; /* a live, steady worker: ~2 s per stream */
    env_start(e, NULL, NULL); /* heartbeat 250 ms: inactivity 1500 ms */
    ropts(e, &o);
    o.on_item = slow_cb_item;
    o.on_item_arg = x;
    a = env_open_with(e, &o, "a", 1);
    b = env_open(e);
    assert_true(collect(b, gb, 0, T(20000)));
    assert_true(cb_wait(&x->c, T(20000)));
    assert_terminal(gb, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_tokens(gb, 40);
    assert_terminal(&x->c.g, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_tokens(&x->c.g, 40);
    env_close(e, a);
    env_close(e, b);
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

/* ======================================================================== */
/* 8. Bad input on the request subject                                       */

#define RAW_ROUTER "rawrouter"

static void
random_id(uint8_t id[16], char hex[SW_REQUEST_ID_HEX])
{
    for (int i = 0; i < 16; i++)
        id[i] = (uint8_t)(rand() & 0xff);
    for (int i = 0; i < 16; i++)
        snprintf(hex + 2 * i, 3, "%02x", id[i]);
}

/* Publishes bytes on the request subject with NATS reply subject
 * sw.rsp.RAW_ROUTER.<hex> and returns the one answer, decoded. */
static swp_item *
raw_request(env *e, natsSubscription *sub, const void *bytes, size_t len, const char *hex)
{
    natsConnection *nc = sw_conn_nats(e->fc);
    char reply[SWT_SUBJECT_MAX];
    natsMsg *m = NULL;
    swp_item *w = NULL;
    natsStatus ns;

    assert_int_equal(swt_subject_response(reply, sizeof(reply), RAW_ROUTER, hex), SW_OK);
    assert_int_equal(natsConnection_PublishRequest(nc, sw_ingress_request_subject(e->ing), reply,
                                                   bytes, (int)len),
                     NATS_OK);
    ns = natsSubscription_NextMsg(&m, sub, (int64_t)T(5000));
    if (ns != NATS_OK)
        fail_msg("no answer to a bad request: %s", natsStatus_GetText(ns));
    assert_string_equal(natsMsg_GetSubject(m), reply);
    assert_int_equal(swp_decode_item((const uint8_t *)natsMsg_GetData(m),
                                     (size_t)natsMsg_GetDataLength(m), 1 << 20, &w),
                     SW_OK);
    natsMsg_Destroy(m);
    return w;
}

/* The worker's answer: a one-item stream, seq 1, final, FAILED with code. */
static void
assert_reject(const swp_item *w, const uint8_t id[16], sw_err code, const char *instance)
{
    assert_non_null(w);
    assert_int_equal(w->request_id.len, 16);
    assert_memory_equal(w->request_id.data, id, 16);
    assert_int_equal(w->seq, 1);
    assert_true(w->complete_final);
    assert_non_null(w->terminal);
    assert_int_equal(w->terminal->status, STREAMWIRE__V1__STATUS__STATUS_FAILED);
    assert_non_null(w->terminal->error);
    if (w->terminal->error->sw_code != (uint32_t)code)
        fail_msg("reject code %u (%s), want %s", w->terminal->error->sw_code,
                 sw_err_name((int)w->terminal->error->sw_code), sw_err_name(code));
    assert_string_equal(w->instance_id, instance);
}

/* A Request with the given version/endpoint/payload size whose embedded
 * response subject is sw.rsp.RAW_ROUTER.<hex>. */
static void
encode_request(uint32_t version, const char *endpoint, size_t payload_len, const uint8_t id[16],
               const char *hex, uint8_t **out, size_t *outlen)
{
    swp_request m = STREAMWIRE__V1__REQUEST__INIT;
    char resp[SWT_SUBJECT_MAX];
    uint8_t *payload = calloc(1, payload_len + 1);
    assert_non_null(payload);
    assert_int_equal(swt_subject_response(resp, sizeof(resp), RAW_ROUTER, hex), SW_OK);
    m.version = version;
    m.request_id.data = (uint8_t *)id;
    m.request_id.len = 16;
    m.response_subject = resp;
    m.router_id = (char *)RAW_ROUTER;
    m.payload.data = payload;
    m.payload.len = payload_len;
    m.credit_window = 16;
    m.heartbeat_ms = 250;
    m.endpoint = (char *)endpoint;
    assert_int_equal(swp_encode_alloc(&m, SIZE_MAX, out, outlen), SW_OK);
    free(payload);
}

/* A request whose response subject is not a streamwire router's own
 * (sw.rsp.<router>.<id>) gets heartbeat wrappers on that very subject, not
 * batches: a client listening on its exact reply subject sees them. */
static void
heartbeats_on_custom_response_subject(void **state)
{
    env *e = *state;
    natsConnection *nc;
    natsSubscription *sub = NULL, *hbsub = NULL;
    swp_request m = STREAMWIRE__V1__REQUEST__INIT;
    uint8_t id[16], *buf = NULL;
    char hex[SW_REQUEST_ID_HEX], resp[64], hbsubj[SWT_SUBJECT_MAX];
    size_t blen = 0;
    int beats = 0, items = 0;
    int64_t until;

    e->w.mode = M_PAUSE;
    e->w.k = 1;
    e->w.n = 2;
    e->w.delay_ms = 600;
    env_start(e, NULL, NULL);
    nc = sw_conn_nats(e->fc);
    random_id(id, hex);
    snprintf(resp, sizeof(resp), "custom.%s", hex);
    assert_int_equal(natsConnection_SubscribeSync(&sub, nc, resp), NATS_OK);
    assert_int_equal(swt_subject_beats(hbsubj, sizeof(hbsubj), RAW_ROUTER), SW_OK);
    assert_int_equal(natsConnection_SubscribeSync(&hbsub, nc, hbsubj), NATS_OK);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    m.version = 1;
    m.request_id.data = id;
    m.request_id.len = 16;
    m.response_subject = resp;
    m.router_id = (char *)RAW_ROUTER;
    m.credit_window = 16;
    m.heartbeat_ms = 50;
    m.endpoint = (char *)EP;
    assert_int_equal(swp_encode_alloc(&m, SIZE_MAX, &buf, &blen), SW_OK);
    assert_int_equal(natsConnection_PublishRequest(nc, sw_ingress_request_subject(e->ing), resp,
                                                   buf, (int)blen),
                     NATS_OK);
    free(buf);
    until = now_ms() + T(5000);
    while (now_ms() < until) {
        natsMsg *msg = NULL;
        swp_item *w = NULL;
        if (natsSubscription_NextMsg(&msg, sub, 100) != NATS_OK)
            continue;
        assert_int_equal(swp_decode_item((const uint8_t *)natsMsg_GetData(msg),
                                         (size_t)natsMsg_GetDataLength(msg), 1 << 20, &w),
                         SW_OK);
        assert_memory_equal(w->request_id.data, id, 16);
        if (w->body_case == STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_HEARTBEAT) {
            beats++;
            assert_int_equal(w->heartbeat->last_seq, 1); /* one item went out before the pause */
        } else if (!w->complete_final) {
            items++;
        }
        swp_free(w);
        natsMsg_Destroy(msg);
        if (beats >= 3)
            break;
    }
    assert_int_equal(items, 1);
    if (beats < 3)
        fail_msg("%d heartbeat wrappers on the custom reply subject in the pause", beats);
    {
        natsMsg *msg = NULL;
        assert_int_equal(natsSubscription_NextMsg(&msg, hbsub, 50), NATS_TIMEOUT);
    }
    natsSubscription_Destroy(sub);
    natsSubscription_Destroy(hbsub);
}

static void
bad_input_on_request_subject(void **state)
{
    env *e = *state;
    sw_ingress_opts io;
    natsConnection *nc;
    natsSubscription *sub = NULL;
    static const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                      0xff, 0xff, 0xff, 0xff, 0xff, 0x02};
    uint8_t id[16], *buf = NULL;
    char hex[SW_REQUEST_ID_HEX];
    size_t blen = 0;
    swp_item *w;
    sw_ingress_stats st;
    got *g = new_got(e);
    sw_stream *s;

    sw_ingress_opts_init(&io);
    io.max_request_bytes = 1024;
    e->w.mode = M_STREAM;
    e->w.n = 5;
    env_start(e, &io, NULL);
    nc = sw_conn_nats(e->fc);
    assert_int_equal(natsConnection_SubscribeSync(&sub, nc, "sw.rsp." RAW_ROUTER ".*"), NATS_OK);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    srand((unsigned)now_ms());

    /* 1. garbage -> protocol_error */
    random_id(id, hex);
    w = raw_request(e, sub, garbage, sizeof(garbage), hex);
    assert_reject(w, id, SW_EPROTO, sw_ingress_instance_id(e->ing));
    swp_free(w);

    /* 2. version 2 -> unsupported_version */
    random_id(id, hex);
    encode_request(2, EP, 10, id, hex, &buf, &blen);
    w = raw_request(e, sub, buf, blen, hex);
    assert_reject(w, id, SW_EVERSION, sw_ingress_instance_id(e->ing));
    swp_free(w);
    free(buf);

    /* 3. larger than max_request_bytes -> payload_too_large */
    random_id(id, hex);
    encode_request(1, EP, 2000, id, hex, &buf, &blen);
    assert_true(blen > 1024);
    w = raw_request(e, sub, buf, blen, hex);
    assert_reject(w, id, SW_EMSGSIZE, sw_ingress_instance_id(e->ing));
    swp_free(w);
    free(buf);

    /* 4. an empty message: version 0 -> unsupported_version */
    random_id(id, hex);
    w = raw_request(e, sub, "", 0, hex);
    assert_reject(w, id, SW_EVERSION, sw_ingress_instance_id(e->ing));
    swp_free(w);

    /* 5. a valid request for another endpoint -> invalid_argument */
    random_id(id, hex);
    encode_request(1, "itest.other.generate", 10, id, hex, &buf, &blen);
    w = raw_request(e, sub, buf, blen, hex);
    assert_reject(w, id, SW_EINVAL, sw_ingress_instance_id(e->ing));
    swp_free(w);
    free(buf);

    /* 6. garbage without a reply subject, and with a reply subject that is
     * not a response subject: counted, no answer. */
    assert_int_equal(natsConnection_Publish(nc, sw_ingress_request_subject(e->ing), garbage,
                                            (int)sizeof(garbage)),
                     NATS_OK);
    assert_int_equal(natsConnection_PublishRequest(nc, sw_ingress_request_subject(e->ing),
                                                   "sw.rsp." RAW_ROUTER, garbage,
                                                   (int)sizeof(garbage)),
                     NATS_OK);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    assert_int_equal(ist_wait(e, f_bad, 7, T(5000)), 7);
    {
        natsMsg *m = NULL;
        assert_int_equal(natsSubscription_NextMsg(&m, sub, 200), NATS_TIMEOUT);
    }
    ingress_stats(e, &st);
    assert_int_equal(st.requests, 0);
    assert_int_equal(wctx_get(&e->w, &e->w.started), 0);
    natsSubscription_Unsubscribe(sub);
    natsSubscription_Destroy(sub);

    /* The worker still serves a normal stream. */
    s = env_open(e);
    assert_true(collect(s, g, 0, T(10000)));
    assert_tokens(g, 5);
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_done(g);
    ingress_stats(e, &st);
    assert_int_equal(st.requests, 1);
    assert_int_equal(st.bad_requests, 7);
    got_free(g);
}

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
/* 10. Destroying things under open streams                                  */

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
    (void)arg;
    sleep_ms(300);
}

static void
conn_close_no_callback_after_free(void **state)
{
    natsOptions *no = NULL;
    natsConnection *blocker = NULL;
    sw_conn *c;
    (void)state;

    assert_int_equal(natsOptions_Create(&no), NATS_OK);
    assert_int_equal(natsOptions_SetURL(no, g_nats.url), NATS_OK);
    assert_int_equal(natsOptions_SetDisconnectedCB(no, sleepy_disconnected, NULL), NATS_OK);
    assert_int_equal(natsConnection_Connect(&blocker, no), NATS_OK);
    c = conn_open("itest-close");
    natsConnection_Close(blocker); /* the async-callback thread sleeps 300 ms */
    sw_conn_close(c);              /* its callbacks queue behind; c is freed */
    sleep_ms((long)T(600));        /* ...and run now */
    natsConnection_Destroy(blocker);
    natsOptions_Destroy(no);
}

/* ======================================================================== */

static int
group_setup(void **state)
{
    (void)state;
    g_slow = swh_slow();
    if (swh_nats_start(&g_nats, NULL) != 0) {
        fprintf(stderr, "test_streams: could not start nats-server\n");
        return -1;
    }
    return 0;
}

static int
group_teardown(void **state)
{
    (void)state;
    swh_nats_stop(&g_nats);
    return 0;
}

#define T_(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int
main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        /* 1 */
        T_(completed_stream),
        T_(sequential_streams),
        T_(router_stats_count_items),
        T_(responder_api_edges),
        T_(heartbeats_keep_slow_stream_alive),
        T_(heartbeat_batches),
        T_(heartbeats_on_custom_response_subject),
        /* 2 */
        T_(incomplete_max_tokens),
        T_(failed_engine_error),
        T_(handler_returned_without_terminal),
        T_(retained_released_without_terminal),
        T_(retained_finishes_after_handler_returned),
        /* 3 */
        T_(no_responders),
        T_(payload_too_large),
        T_(payload_too_large_callback_close),
        T_(no_instances_without_registry),
        T_(deadline_exceeded),
        T_(stream_incomplete),
        T_(item_after_final),
        T_(item_after_final_callback),
        T_(decode_error),
        T_(decode_error_callback),
        T_(sequence_gap),
        T_(overloaded),
        T_(cancel_mid_stream),
        T_(kill_mid_stream),
        T_(close_before_terminal_cancels),
        T_(cancel_wakes_blocked_send),
        /* 4 */
        T_(callback_completed),
        T_(callback_failed),
        T_(callback_close_from_terminal),
        T_(callback_close_from_synth_terminal),
        T_(callback_cancel_from_callback),
        /* 5 */
        T_(slow_consumer_flow_control),
        T_(try_send_and_droppable),
        /* 6 */
        T_(loss_repair),
        T_(window_capped_by_ingress),
        T_(loss_repair_window_capped),
        T_(batched_items_in_order),
        T_(coalescing_off),
        T_(acked_finals_release_worker_state),
        T_(lost_final_is_resent),
        /* 7 */
        T_(scale_1000_streams),
        T_(router_backlog_no_spurious_incomplete),
        T_(instance_not_lost_while_streaming),
        /* 8 */
        T_(bad_input_on_request_subject),
        /* 9 */
        T_(drain_within_grace),
        T_(drain_past_grace_instance_lost),
        T_(consumer_stops_reading_then_closes),
        T_(worker_vanishes_instance_lost),
        /* 10 */
        T_(router_destroy_with_open_streams),
        T_(two_routers_one_instance),
        T_(router_destroy_during_final_linger),
        T_(router_max_streams_busy),
        T_(ingress_destroy_with_retained_responder),
        /* transport */
        T_(conn_close_no_callback_after_free),
    };
    if (argc > 1 && argv[1][0] != '\0')
        cmocka_set_test_filter(argv[1]);
    if (argc > 2)
        cmocka_set_skip_filter(argv[2]);
    return cmocka_run_group_tests_name("streams", tests, group_setup, group_teardown);
}
