/* tests/integration/streams_fixture.h -- the shared fixture of the
 * end-to-end stream tests (test_terminals, test_flow, test_loss,
 * test_coalescing, test_badinput, test_lifecycle; split from test_streams.c).
 *
 * Each test binary runs one cmocka group: sf_group_setup starts one
 * nats-server (JetStream on, free port, temp dir) through the harness, and
 * sf_group_teardown stops it. Each test builds its own world in-process: a
 * worker connection with an sw_ingress whose handler (test_handler) is
 * driven by a wctx (mode + knobs + observations), and a frontend connection
 * with an sw_router. The per-test teardown unblocks handlers, closes streams
 * and destroys everything, so a failing test does not leak into the next one.
 *
 * Every test asserts on content ("token-0".."token-N-1"), order (seq 1..N),
 * counts and the exact terminal. Timing is never asserted as a speed: every
 * wait is a generous bound multiplied by swh_slow() (3 under sanitizers).
 *
 * Threads and locks: cmocka assertions are only used on the test's main
 * thread; handler threads, library callbacks and helper threads record what
 * they see into mutex-protected structs (wctx.mu, cbgot.mu) that the main
 * thread checks.
 *
 * Run some tests: test_<theme> [<glob> [<skip-glob>]], e.g.
 * `test_flow 'cancel*'`, or `test_flow '' 'scale*'` for all but one. */
#ifndef SW_TEST_STREAMS_FIXTURE_H
#define SW_TEST_STREAMS_FIXTURE_H

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

/* The nats-server of the group, and the harness's slowness factor. */
extern swh_nats g_nats;
extern int g_slow;

#define EP "itest.llm.generate"

/* A generous bound, scaled for sanitizer runs. */
#define T(ms) ((int64_t)(ms)*g_slow)

/* ======================================================================== */
/* Worker side: one configurable handler                                     */

enum {
    M_STREAM = 1,     /* n tokens (delay_ms apart), finish COMPLETED */
    M_MAXTOK,         /* n tokens, or max_tokens of them and INCOMPLETE "max_tokens" */
    M_FAIL,           /* n tokens, fail("engine_error", FAIL_MSG) */
    M_RETURN,         /* n tokens, return without a terminal */
    M_RETAIN_RELEASE, /* retain; a thread sends n tokens after the handler returned, releases */
    M_RETAIN_FINISH,  /* retain; a thread sends n tokens, finishes, releases */
    M_ABANDON,        /* k tokens, swx_responder_abandon */
    M_AFTER_FINAL,    /* n tokens, finish, swx_responder_send_after_final */
    M_GARBAGE,        /* k tokens, raw garbage, then keeps sending until stopped */
    M_GAP,            /* k tokens, skip a seq, tokens k..n-1, finish */
    M_BLOCK,          /* k tokens, block until the gate opens (then n-k more, finish) or cancel */
    M_TRY,            /* try_send / droppable probe against a small window */
    M_KEEP,           /* retain and return; the test owns the responder (w.kept: teardown
                         releases one still there; a test that releases it sets it NULL) */
    M_PAUSE,          /* k tokens, sleep delay_ms, the rest, finish */
    M_API,            /* responder API misuse and edge cases (results in rv[]) */
    M_LOSE_FINAL,     /* n tokens, swx_responder_lose_next, finish COMPLETED */
    M_BIG,            /* k tokens, then tokens k..n-1 padded with '.' to big_len bytes, finish */
    M_LOSE_LATE,      /* sleep delay_ms, token 0 lost on the wire, sleep delay_ms, the rest,
                         finish */
    M_STRAND_FINAL,   /* n-1 tokens delay_ms apart, then the next k message builds fail as
                         without memory (swx_responder_fail_builds), token n-1, finish */
    M_STRAND_UNKEPT   /* as M_STRAND_FINAL, and the final finds no memory to be kept
                         (swx_responder_fail_final_keep) */
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
    int64_t stop_ms;   /* how long it took (w_send_tokens) */
    int stop_saw_flag; /* sw_responder_cancelled() was 1 at that point */
    int cancel_cb;     /* sw_responder_on_cancel callbacks */
    int finished;      /* finish/fail calls that returned SW_OK */
    sw_err finish_rv;  /* the last finish/fail/after-final result */
    sw_err cancelled_finish_rv, cancelled_fail_rv; /* M_BLOCK: finish and fail called after the
                                                      cancel (set before `stopped` counts) */
    sw_err rv[16];                                 /* M_TRY / M_API results */
    size_t big_len; /* M_API: a data item this long exceeds the max payload; M_BIG: the
                       padded items' length */
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

/* ======================================================================== */
/* Fixture                                                                   */

#define MAX_TRACKED 16

struct got;

struct cbgot;

typedef struct env {
    sw_conn *wc;             /* worker connection */
    int worker_no_send_asap; /* set before env_start: the worker connection buffers */
    sw_conn *fc;             /* frontend connection */
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
    void (*scale_cleanup)(struct env *e); /* set with scale_v; called by teardown */
    /* a second frontend (two_routers_one_instance) */
    sw_conn *fc2;
    sw_router *rt2;
} env;

/* Polls an ingress counter (read by fn) until >= want. Returns its value. */
typedef uint64_t (*ist_field_fn)(const sw_ingress_stats *);

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

/* ======================================================================== */
/* Callback-mode collector                                                   */

typedef struct cbgot {
    got g;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int in_cb;
    int concurrent;      /* two callbacks for the stream overlapped */
    int after_terminal;  /* callbacks after the terminal */
    size_t cancel_after; /* cancel from the callback after this many data items (0 = never) */
    int cancel_called;
    sw_err cancel_rv;
    int close_on_terminal;
    int closed;
    int busy_ok; /* sw_stream_next from inside the callback returned SW_EBUSY */
    int busy_checks;
} cbgot;

/* ======================================================================== */
/* Functions (streams_fixture.c)                                             */

int64_t now_ms(void);
void sleep_ms(long ms);
void cond_init_mono(pthread_cond_t *cv);
void cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t until_ms);
void wctx_init(wctx *w);
void wctx_fini(wctx *w);
void wctx_add(wctx *w, int *field, int delta);
int wctx_get(wctx *w, const int *field);
int wctx_wait(wctx *w, const int *field, int atleast, int64_t timeout_ms);
void wctx_open_gate(wctx *w);
void w_on_cancel(sw_responder *r, void *arg);
void w_on_cancel_slow(sw_responder *r, void *arg);
void w_stop(wctx *w, sw_responder *r, sw_err rv);
void w_finished(wctx *w, sw_err rv);
int w_send_tokens(wctx *w, sw_responder *r, int from, int to, int delay_ms);
void *w_retained_main(void *arg);
void w_try(wctx *w, sw_responder *r);
void w_api(wctx *w, sw_responder *r);
void test_handler(sw_responder *r, void *arg);
int setup(void **state);
void env_untrack(env *e, sw_stream *s);
int teardown(void **state);
sw_conn *conn_open(const char *name);
/* As conn_open, with sw_conn_opts.no_send_asap. */
sw_conn *conn_open_mode(const char *name, int no_send_asap);
void env_start(env *e, sw_ingress_opts *io, sw_router_opts *ro);
void ropts(env *e, sw_request_opts *o);
sw_stream *env_open_with(env *e, const sw_request_opts *o, const void *payload, size_t len);
sw_stream *env_open(env *e);
void env_close(env *e, sw_stream *s);
void ingress_stats(env *e, sw_ingress_stats *st);
uint64_t ist_wait(env *e, ist_field_fn fn, uint64_t want, int64_t timeout_ms);
uint64_t f_cancels(const sw_ingress_stats *s);
uint64_t f_bad(const sw_ingress_stats *s);
uint64_t f_fin_cancelled(const sw_ingress_stats *s);
uint64_t f_fin_completed(const sw_ingress_stats *s);
uint64_t f_inflight_zero(const sw_ingress_stats *s);
uint64_t f_held_zero(const sw_ingress_stats *s);
uint64_t f_items_sent(const sw_ingress_stats *s);
uint64_t f_credit_stalls(const sw_ingress_stats *s);
uint64_t f_requests_waiting(const sw_ingress_stats *s);
void got_free(got *g);
void got_add(got *g, const sw_item *it);
int collect(sw_stream *s, got *g, size_t max_data, int64_t timeout_ms);
void assert_tokens_from(const got *g, size_t count, size_t first, uint64_t first_seq);
void assert_tokens(const got *g, size_t count);
void assert_token_prefix(const got *g);
void assert_terminal(const got *g, sw_status status, sw_err err, const char *reason);
void assert_done(const got *g);
void cbgot_init(cbgot *c);
void cbgot_fini(cbgot *c);
void *env_push(void ***v, size_t *n, void *p);
got *new_got(env *e);
cbgot *new_cbgot_sized(env *e, size_t size);
cbgot *new_cbgot(env *e);
void env_free_collectors(env *e);
void cb_item(sw_stream *s, const sw_item *it, void *arg);
int cb_wait(cbgot *c, int64_t timeout_ms);
void cb_assert_clean(cbgot *c);
/* A random request id, binary and hex. */
void random_id(uint8_t id[16], char hex[SW_REQUEST_ID_HEX]);

/* cmocka group setup/teardown: start/stop the group's nats-server. */
int sf_group_setup(void **state);
int sf_group_teardown(void **state);

/* Applies the command line's test filter ([<glob> [<skip-glob>]]). */
void sf_filters(int argc, char **argv);

#define T_(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

#endif
