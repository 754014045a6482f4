/* tests/integration/test_liveness.c -- a frontend that dies or freezes
 * mid-stream is noticed by the worker, which cancels the stream so the engine
 * stops (issue 5), after as many unanswered probes as frontend_probe_misses
 * says. The frontend is a real process: `streamwire generate`.
 *
 * Run some tests: test_liveness [<glob>]. */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include <streamwire/streamwire.h>

typedef struct live_engine {
    pthread_mutex_t mu;
    int started;        /* handler calls */
    int cancel_cb;      /* on_cancel fired */
    int send_cancelled; /* send returned SW_ECANCELLED */
    int64_t cancel_ms;  /* when the callback fired (swh_now_ms) */
    int items;
} live_engine;

typedef struct live_fixture {
    swh_nats nats;
    sw_conn *conn;
    sw_ingress *ing;
    live_engine eng;
} live_fixture;

static void
live_on_cancel(sw_responder *r, void *arg)
{
    live_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    e->cancel_cb++;
    e->cancel_ms = swh_now_ms();
    pthread_mutex_unlock(&e->mu);
}

/* Streams "token-i" every 20 ms for up to 60 s: long enough to be cut off. */
static void
live_handler(sw_responder *r, void *arg)
{
    live_engine *e = arg;
    char buf[32];
    pthread_mutex_lock(&e->mu);
    e->started++;
    pthread_mutex_unlock(&e->mu);
    sw_responder_on_cancel(r, live_on_cancel, e);
    for (int i = 0; i < 3000; i++) {
        int n = snprintf(buf, sizeof(buf), "token-%d", i);
        sw_err rv = sw_responder_send(r, buf, (size_t)n);
        if (rv == SW_ECANCELLED) {
            pthread_mutex_lock(&e->mu);
            e->send_cancelled++;
            pthread_mutex_unlock(&e->mu);
            return;
        }
        if (rv != SW_OK)
            return;
        pthread_mutex_lock(&e->mu);
        e->items++;
        pthread_mutex_unlock(&e->mu);
        swh_sleep_ms(20);
    }
    (void)sw_responder_finish(r, SW_STATUS_COMPLETED, NULL);
}

static int
live_setup(void **state)
{
    live_fixture *f = calloc(1, sizeof(*f));
    sw_conn_opts co;
    sw_ingress_opts io;
    if (f == NULL || swh_nats_start(&f->nats, NULL) != 0)
        return -1;
    pthread_mutex_init(&f->eng.mu, NULL);
    sw_conn_opts_init(&co);
    co.url = f->nats.url;
    if (sw_conn_open(&f->conn, &co) != SW_OK)
        return -1;
    sw_ingress_opts_init(&io);
    io.endpoint = "live.engine.gen";
    io.instance_id = "wlive";
    io.handler = live_handler;
    io.handler_arg = &f->eng;
    if (sw_ingress_start(&f->ing, f->conn, &io) != SW_OK)
        return -1;
    *state = f;
    return 0;
}

static int
live_teardown(void **state)
{
    live_fixture *f = *state;
    sw_ingress_destroy(f->ing);
    sw_conn_close(f->conn);
    swh_nats_stop(&f->nats);
    pthread_mutex_destroy(&f->eng.mu);
    free(f);
    return 0;
}

static void
live_reset(live_engine *e)
{
    pthread_mutex_lock(&e->mu);
    e->started = e->cancel_cb = e->send_cancelled = e->items = 0;
    e->cancel_ms = 0;
    pthread_mutex_unlock(&e->mu);
}

/* Starts `streamwire generate` against worker `inst` and waits for its
 * third data item. Returns the pid; *fd is its stdout. */
static pid_t
live_start_frontend_to(live_fixture *f, const char *inst, int *fd)
{
    const char *argv[] = {"generate",      "--server", f->nats.url, "--endpoint", "live.engine.gen",
                          "--instance-id", inst,       "--json",    NULL};
    pid_t pid = swh_spawn(argv, fd);
    assert_true(pid > 0);
    assert_int_equal(swh_wait_line(*fd, "{\"seq\":3,", NULL, 0, 10000 * swh_slow()), 0);
    return pid;
}

static pid_t
live_start_frontend(live_fixture *f, int *fd)
{
    return live_start_frontend_to(f, "wlive", fd);
}

/* Waits until the engine saw the cancellation; returns ms from t0. */
static int64_t
live_wait_cancel(live_engine *e, int64_t t0, int64_t limit_ms)
{
    for (;;) {
        int done;
        int64_t at;
        pthread_mutex_lock(&e->mu);
        done = e->cancel_cb > 0 && e->send_cancelled > 0;
        at = e->cancel_ms;
        pthread_mutex_unlock(&e->mu);
        if (done)
            return at - t0;
        if (swh_now_ms() - t0 > limit_ms)
            return -1;
        swh_sleep_ms(5);
    }
}

/* SIGKILL the frontend: its subscriptions vanish, the worker's next liveness
 * probe gets "no responders", and the stream is cancelled. */
static void
test_frontend_killed(void **state)
{
    live_fixture *f = *state;
    sw_ingress_stats before, after;
    int fd, st;
    int64_t t0, lat;
    pid_t pid;

    live_reset(&f->eng);
    sw_ingress_stats_get(f->ing, &before);
    pid = live_start_frontend(f, &fd);
    t0 = swh_now_ms();
    swh_kill(pid, SIGKILL);
    assert_int_equal(swh_wait_exit(pid, 5000, &st), 0);
    lat = live_wait_cancel(&f->eng, t0, 5000 * swh_slow());
    close(fd);
    assert_true(lat >= 0);
    print_message("frontend SIGKILL -> handler cancelled: %lld ms\n", (long long)lat);
    /* Documented (sw_ingress_opts): the next probe (every frontend_probe_ms,
     * 250) gets "no responders". Bound: one interval plus scheduling slack. */
    assert_true(lat <= (250 + 400) * swh_slow());
    sw_ingress_stats_get(f->ing, &after);
    assert_int_equal(f->eng.started, 1);
    assert_int_equal(f->eng.cancel_cb, 1);
    assert_int_equal(f->eng.send_cancelled, 1);
    assert_true(f->eng.items >= 3);
    assert_int_equal(after.frontends_lost - before.frontends_lost, 1);
    assert_true(after.cancels - before.cancels >= 1);
    /* The handler stopped: no more items after the cancel. */
    {
        int items = f->eng.items;
        swh_sleep_ms(200);
        assert_int_equal(f->eng.items, items);
    }
}

/* SIGSTOP the frontend: its connection stays up but nobody answers, so two
 * probe timeouts later the worker cancels. SIGCONT afterwards must not
 * resurrect the stream. */
static void
test_frontend_frozen(void **state)
{
    live_fixture *f = *state;
    int fd, st;
    int64_t t0, lat;
    pid_t pid;

    live_reset(&f->eng);
    pid = live_start_frontend(f, &fd);
    t0 = swh_now_ms();
    swh_kill(pid, SIGSTOP);
    lat = live_wait_cancel(&f->eng, t0, 10000 * swh_slow());
    swh_kill(pid, SIGKILL);
    swh_kill(pid, SIGCONT);
    assert_int_equal(swh_wait_exit(pid, 5000, &st), 0);
    close(fd);
    assert_true(lat >= 0);
    print_message("frontend SIGSTOP -> handler cancelled: %lld ms\n", (long long)lat);
    /* Documented: two unanswered probes in a row (frontend_timeout_ms, 1000,
     * each; probes every 250 ms). It cannot be sooner than one timeout, and
     * is at most two probe rounds later. */
    assert_true(lat >= 1000 - 50);
    assert_true(lat <= (2 * (250 + 1000) + 500) * swh_slow());
    assert_int_equal(f->eng.cancel_cb, 1);
    assert_int_equal(f->eng.send_cancelled, 1);
}

/* A live, slow consumer is not a dead frontend: the stream completes. */
static void
test_frontend_alive_not_cancelled(void **state)
{
    live_fixture *f = *state;
    sw_ingress_stats before, after;
    char out[16384];
    /* 40 items read slowly (30 ms each, slower than the engine), then a
     * cancel from the frontend itself. */
    const char *argv[] = {"generate",
                          "--server",
                          f->nats.url,
                          "--endpoint",
                          "live.engine.gen",
                          "--instance-id",
                          "wlive",
                          "--cancel-after",
                          "40",
                          "--read-delay-ms",
                          "30",
                          "--json",
                          NULL};
    int rc;
    live_reset(&f->eng);
    sw_ingress_stats_get(f->ing, &before);
    rc = swh_run(argv, out, sizeof(out), 30000 * swh_slow());
    assert_int_equal(rc, 1); /* cancelled, not completed */
    assert_non_null(strstr(out, "\"terminal\":\"cancelled\""));
    assert_non_null(strstr(out, "{\"seq\":40,"));
    sw_ingress_stats_get(f->ing, &after);
    assert_int_equal(after.frontends_lost - before.frontends_lost, 0);
}

/* frontend_probe_misses: a silent frontend's streams are cancelled after
 * that many unanswered probes in a row. Two workers of their own, misses 1
 * and 4 (probes every 100 ms, each a miss once unanswered for 500 ms), each
 * streaming to a frontend of its own; both frontends are stopped at once.
 * Expected: about one timeout for misses 1, about four for misses 4. The
 * bounds are loose (a noisy machine): misses 1 no sooner than a timeout
 * less a probe interval (a probe out just before the stop, unanswered), and
 * well within a few seconds; misses 4 no sooner than three timeouts, and at
 * least two timeouts after misses 1. */
static void
test_probe_misses_set_the_delay(void **state)
{
    enum { PROBE_MS = 100, TIMEOUT_MS = 500 };
    static const unsigned misses[2] = {1, 4};
    static const char *const inst[2] = {"wmiss1", "wmiss4"};
    live_fixture *f = *state;
    live_engine eng[2];
    sw_ingress *ing[2];
    sw_ingress_stats st[2];
    sw_conn_opts co;
    sw_conn *c = NULL;
    int fd[2], ws;
    pid_t pid[2];
    int64_t opened, t0, lat[2];

    memset(eng, 0, sizeof(eng));
    sw_conn_opts_init(&co);
    co.url = f->nats.url;
    assert_int_equal(sw_conn_open(&c, &co), SW_OK);
    opened = swh_now_ms();
    for (int i = 0; i < 2; i++) {
        sw_ingress_opts io;
        pthread_mutex_init(&eng[i].mu, NULL);
        sw_ingress_opts_init(&io);
        io.endpoint = "live.engine.gen";
        io.instance_id = inst[i];
        io.handler = live_handler;
        io.handler_arg = &eng[i];
        io.frontend_probe_ms = PROBE_MS;
        io.frontend_timeout_ms = TIMEOUT_MS;
        io.frontend_probe_misses = misses[i];
        assert_int_equal(sw_ingress_start(&ing[i], c, &io), SW_OK);
    }
    for (int i = 0; i < 2; i++)
        pid[i] = live_start_frontend_to(f, inst[i], &fd[i]);
    /* No probe proves anything in the worker connection's first 2 s
     * (common/sched.h SWI_PEERS_SETTLE_MS). */
    while (swh_now_ms() < opened + 2500)
        swh_sleep_ms(20);
    t0 = swh_now_ms();
    swh_kill(pid[0], SIGSTOP);
    swh_kill(pid[1], SIGSTOP);
    for (int i = 0; i < 2; i++)
        lat[i] = live_wait_cancel(&eng[i], t0, 10000 * swh_slow());
    for (int i = 0; i < 2; i++) {
        swh_kill(pid[i], SIGKILL);
        swh_kill(pid[i], SIGCONT);
        assert_int_equal(swh_wait_exit(pid[i], 5000, &ws), 0);
        close(fd[i]);
    }
    print_message("frontend SIGSTOP -> handler cancelled: misses 1 %lld ms, misses 4 %lld ms\n",
                  (long long)lat[0], (long long)lat[1]);
    assert_true(lat[0] >= 0);
    assert_true(lat[1] >= 0);
    assert_true(lat[0] >= TIMEOUT_MS - PROBE_MS);
    assert_true(lat[0] <= (PROBE_MS + TIMEOUT_MS + 1000) * swh_slow());
    assert_true(lat[1] >= 3 * TIMEOUT_MS);
    assert_true(lat[1] >= lat[0] + 2 * TIMEOUT_MS);
    for (int i = 0; i < 2; i++) {
        sw_ingress_stats_get(ing[i], &st[i]);
        assert_int_equal(st[i].frontends_lost, 1);
        assert_int_equal(eng[i].started, 1);
        assert_int_equal(eng[i].cancel_cb, 1);
        assert_int_equal(eng[i].send_cancelled, 1);
        sw_ingress_destroy(ing[i]);
        pthread_mutex_destroy(&eng[i].mu);
    }
    sw_conn_close(c);
}

/* test_liveness [<glob>]: only the tests whose names match. */
int
main(int argc, char **argv)
{
    if (argc > 1 && argv[1][0] != '\0')
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_frontend_killed),
        cmocka_unit_test(test_frontend_frozen),
        cmocka_unit_test(test_frontend_alive_not_cancelled),
        cmocka_unit_test(test_probe_misses_set_the_delay),
    };
    return cmocka_run_group_tests_name("liveness", tests, live_setup, live_teardown);
}
