/* tests/integration/test_migration.c -- request migration (issue 15,
 * docs/MIGRATION.md) with real worker processes.
 *
 * Workers are `streamwire worker` processes (the demo engine: token-0,
 * token-1, ... every 20 ms, which resumes where its consumer is) registered
 * in a registry bucket of the test's own; the frontend is an in-process
 * sw_router routing through that registry. The worker serving a stream is
 * SIGKILLed, SIGSTOPped or SIGTERMed (drained) mid-stream, and the consumer
 * must see one continuous stream: every token once, in order, seqs 1..N,
 * then exactly one terminal that counts the migrations and names the
 * instances. Also: the limit, no other instance, a cancel during the
 * migration (no second request runs), sealing, and a migrate callback that
 * rebuilds the prompt.
 *
 * Run one test: test_migration '<glob>'. SW_IT_VERBOSE=1 shows library logs. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <streamwire/metrics.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include <nats/nats.h>
#include <streamwire/registry.h>
#include <streamwire/streamwire.h>

#include "egress/chaos.h"
#include "harness.h"
#include "transport/seal.h"
#include "transport/sw_transport.h"

#define EP "mig.llm.generate"
#define TOKENS 60
#define MAXW 3

static swh_nats g_nats;
static int g_slow = 1;
static int g_verbose;
static char g_key[320];

#define T(ms) ((int64_t)(ms)*g_slow)

/* The new request id of the last migration, from the router's log line
 * "... migrated to <instance> as <hex> (...)". */
static pthread_mutex_t g_mig_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_mig_hex[64];

static void
log_cb(void *arg, sw_log_level level, const char *msg)
{
    const char *as = strstr(msg, " migrated to ");
    if (as != NULL && (as = strstr(as, " as ")) != NULL) {
        pthread_mutex_lock(&g_mig_mu);
        snprintf(g_mig_hex, sizeof(g_mig_hex), "%.32s", as + 4);
        pthread_mutex_unlock(&g_mig_mu);
    }
    if (g_verbose || level <= SW_LOG_ERROR)
        fprintf(stderr, "[%s] %s: %s\n", arg ? (const char *)arg : "", sw_log_level_name(level),
                msg);
}

/* ------------------------------------------------------------ the world */

typedef struct world {
    char bucket[64];
    const char *key; /* sealed: the key file */
    pid_t pid[MAXW];
    int out[MAXW];
    char id[MAXW][16];
    int err_fd[MAXW]; /* the worker's stderr, kept in a file */
    char err_path[MAXW][512];
    int nw;
    const char *interval; /* the workers' --token-interval-ms (NULL: 20) */
    int least;            /* the router picks least_inflight (else round_robin) */
    sw_duration probe_ms; /* the router's probe_interval_ms (0: its default) */
    const char *extra[3]; /* the next worker's extra arguments (NULL-ended; then cleared) */
    sw_conn *conn;
    sw_registry *reg;
    sw_router *rt;
} world;

static int
world_setup(void **state)
{
    static unsigned n;
    world *w = calloc(1, sizeof(*w));
    assert_non_null(w);
    snprintf(w->bucket, sizeof(w->bucket), "mig_%d_%u", (int)getpid(), ++n);
    *state = w;
    return 0;
}

static void
world_worker(world *w, const char *key)
{
    int i = w->nw++;
    char tokens[16];
    const char *argv[32];
    int a = 0;
    snprintf(w->id[i], sizeof(w->id[i]), "w%d", i + 1);
    snprintf(tokens, sizeof(tokens), "%d", TOKENS);
    {
        char bucket[64];
        memcpy(bucket, w->bucket, sizeof(bucket));
        snprintf(w->err_path[i], sizeof(w->err_path[i]), "%s/%s-w%d.err", g_nats.dir, bucket,
                 i + 1);
    }
    w->err_fd[i] = open(w->err_path[i], O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
    assert_true(w->err_fd[i] >= 0);
    argv[a++] = "worker";
    argv[a++] = "--server";
    argv[a++] = g_nats.url;
    argv[a++] = "--endpoint";
    argv[a++] = EP;
    argv[a++] = "--instance-id";
    argv[a++] = w->id[i];
    argv[a++] = "--bucket";
    argv[a++] = w->bucket;
    argv[a++] = "--tokens";
    argv[a++] = tokens;
    argv[a++] = "--token-interval-ms";
    argv[a++] = w->interval != NULL ? w->interval : "20";
    argv[a++] = "--drain-grace-ms";
    argv[a++] = "20000";
    if (key != NULL) {
        argv[a++] = "--key-file";
        argv[a++] = key;
    }
    for (int k = 0; k < 2 && w->extra[k] != NULL; k++)
        argv[a++] = w->extra[k];
    w->extra[0] = w->extra[1] = NULL;
    argv[a] = NULL;
    w->pid[i] = swh_spawn_err(argv, &w->out[i], w->err_fd[i]);
    assert_true(w->pid[i] > 0);
    assert_int_equal(swh_wait_line(w->out[i], "worker ready", NULL, 0, (int)T(15000)), 0);
}

static void
world_frontend(world *w, const char *key)
{
    sw_conn_opts co;
    sw_registry_opts go;
    sw_router_opts ro;
    sw_conn_opts_init(&co);
    co.url = g_nats.url;
    co.seal_key_file = key;
    co.log = log_cb;
    co.log_arg = (void *)"frontend";
    assert_int_equal(sw_conn_open(&w->conn, &co), SW_OK);
    sw_registry_opts_init(&go);
    go.bucket = w->bucket;
    go.log = log_cb;
    go.log_arg = (void *)"registry";
    assert_int_equal(sw_registry_open(&w->reg, w->conn, &go), SW_OK);
    sw_router_opts_init(&ro);
    ro.registry = w->reg;
    ro.policy = w->least ? SW_POLICY_LEAST_INFLIGHT : SW_POLICY_ROUND_ROBIN;
    ro.migration_limit = 2;
    if (w->probe_ms)
        ro.probe_interval_ms = w->probe_ms;
    ro.log = log_cb;
    ro.log_arg = (void *)"router";
    assert_int_equal(sw_router_create(&w->rt, w->conn, &ro), SW_OK);
    /* Every worker listed before a request is routed. */
    for (int64_t until = swh_now_ms() + T(10000);;) {
        sw_instance *v = NULL;
        size_t n = 0;
        assert_int_equal(sw_registry_list(w->reg, EP, &v, &n), SW_OK);
        sw_instances_free(v, n);
        if (n == (size_t)w->nw)
            break;
        assert_true(swh_now_ms() < until);
        swh_sleep_ms(20);
    }
    swh_sleep_ms(100); /* the router's pool watches the same registry */
}

static int
world_teardown(void **state)
{
    world *w = *state;
    sw_router_destroy(w->rt);
    sw_registry_close(w->reg);
    sw_conn_close(w->conn);
    for (int i = 0; i < w->nw; i++) {
        if (w->pid[i] > 0) {
            swh_kill(w->pid[i], SIGCONT);
            swh_kill(w->pid[i], SIGKILL);
            (void)swh_wait_exit(w->pid[i], 5000, NULL);
        }
        close(w->out[i]);
        close(w->err_fd[i]);
    }
    free(w);
    return 0;
}

static int
world_index(world *w, const char *id)
{
    for (int i = 0; i < w->nw; i++)
        if (strcmp(w->id[i], id) == 0)
            return i;
    return -1;
}

/* ------------------------------------------------------------ a consumer */

typedef struct coll {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n, bad, terminals;
    char first_inst[16], last_inst[16];
    sw_status status;
    sw_err err;
    unsigned migrations;
    char reason[64], instances[256];
} coll;

static void
coll_cb(sw_stream *s, const sw_item *it, void *arg)
{
    coll *c = arg;
    (void)s;
    pthread_mutex_lock(&c->mu);
    if (it->kind == SW_ITEM_DATA) {
        char want[32];
        int n = snprintf(want, sizeof(want), "token-%d", c->n);
        if (c->terminals || it->seq != (uint64_t)c->n + 1 || it->len != (size_t)n ||
            memcmp(it->data, want, (size_t)n) != 0) {
            if (c->bad++ == 0)
                fprintf(stderr, "unexpected item: seq %llu %.*s (wanted %s)\n",
                        (unsigned long long)it->seq, (int)it->len, (const char *)it->data, want);
        }
        if (c->n == 0)
            snprintf(c->first_inst, sizeof(c->first_inst), "%s", it->instance_id);
        snprintf(c->last_inst, sizeof(c->last_inst), "%s", it->instance_id);
        c->n++;
    } else {
        c->terminals++;
        c->status = it->terminal.status;
        c->err = it->terminal.error;
        c->migrations = it->terminal.migrations;
        snprintf(c->reason, sizeof(c->reason), "%s", it->terminal.reason);
        snprintf(c->instances, sizeof(c->instances), "%s", it->terminal.instances);
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void
coll_init(coll *c)
{
    memset(c, 0, sizeof(*c));
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
}

/* Waits until n items (or the terminal when n < 0). */
static void
coll_wait(coll *c, int n, int64_t ms)
{
    int64_t until = swh_now_ms() + ms;
    pthread_mutex_lock(&c->mu);
    while ((n >= 0 ? c->n < n : c->terminals == 0) && swh_now_ms() < until) {
        pthread_mutex_unlock(&c->mu);
        swh_sleep_ms(5);
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    if (n >= 0)
        assert_true(c->n >= n);
    else
        assert_int_equal(c->terminals, 1);
}

static sw_stream *
open_stream(world *w, coll *c, int limit, uint32_t max_tokens, sw_migrate_fn fn, void *arg)
{
    sw_request_opts o;
    sw_stream *s = NULL;
    sw_request_opts_init(&o);
    o.endpoint = EP;
    o.on_item = coll_cb;
    o.on_item_arg = c;
    o.migration_limit = limit;
    o.max_tokens = max_tokens;
    o.migrate = fn;
    o.migrate_arg = arg;
    assert_int_equal(sw_router_open(&s, w->rt, &o, "hello", 5), SW_OK);
    return s;
}

/* The worker serving c's stream (from its first item). */
static int
serving(world *w, coll *c)
{
    int i;
    pthread_mutex_lock(&c->mu);
    i = world_index(w, c->first_inst);
    pthread_mutex_unlock(&c->mu);
    assert_true(i >= 0);
    return i;
}

/* nworkers workers and the frontend; a stream (limit, max_tokens, fn) that
 * has delivered 10 items; *from: the worker serving it. */
static sw_stream *
begin(world *w, coll *c, int nworkers, const char *key, int limit, uint32_t max_tokens,
      sw_migrate_fn fn, void *arg, int *from)
{
    sw_stream *s;
    for (int i = 0; i < nworkers; i++)
        world_worker(w, key);
    world_frontend(w, key);
    coll_init(c);
    s = open_stream(w, c, limit, max_tokens, fn, arg);
    coll_wait(c, 10, T(10000));
    *from = serving(w, c);
    return s;
}

/* The whole stream, in order, once, then `completed` after one migration
 * from worker `from` to the other one of two. */
static void
assert_migrated_once(world *w, coll *c, int from)
{
    char want[64];
    int to = from == 0 ? 1 : 0;
    coll_wait(c, -1, T(20000));
    swh_sleep_ms(100); /* nothing more may come */
    pthread_mutex_lock(&c->mu);
    assert_int_equal(c->bad, 0);
    assert_int_equal(c->n, TOKENS);
    assert_int_equal(c->terminals, 1);
    assert_int_equal(c->status, SW_STATUS_COMPLETED);
    assert_string_equal(c->reason, "stop");
    assert_int_equal(c->migrations, 1);
    snprintf(want, sizeof(want), "%s,%s", w->id[from], w->id[to]);
    assert_string_equal(c->instances, want);
    assert_string_equal(c->last_inst, w->id[to]);
    pthread_mutex_unlock(&c->mu);
}

/* ------------------------------------------------------------ tests */

static void
sigkill_migrates(void **state)
{
    world *w = *state;
    coll c;
    sw_stream *s;
    sw_stream_stats st;
    sw_router_stats rst;
    int from;
    const char *inst0, *req0;
    char inst0_copy[64], req0_copy[64];
    s = begin(w, &c, 2, NULL, 0 /* the router's: 2 */, 0, NULL, NULL, &from);
    inst0 = sw_stream_instance_id(s);
    req0 = sw_stream_request_id(s);
    snprintf(inst0_copy, sizeof(inst0_copy), "%s", inst0);
    snprintf(req0_copy, sizeof(req0_copy), "%s", req0);
    swh_kill(w->pid[from], SIGKILL);
    assert_migrated_once(w, &c, from);
    /* The instance id moved with the stream; the string returned before is
     * unchanged (and valid: ASan), the request id is the first request's. */
    assert_string_equal(inst0, inst0_copy);
    assert_string_equal(inst0, w->id[from]);
    assert_string_equal(sw_stream_instance_id(s), w->id[from == 0 ? 1 : 0]);
    assert_string_equal(req0, req0_copy);
    assert_string_equal(sw_stream_request_id(s), req0_copy);
    sw_stream_stats_get(s, &st);
    assert_int_equal(st.migrations, 1);
    sw_router_stats_get(w->rt, &rst);
    assert_int_equal(rst.migrations, 1);
    assert_int_equal(rst.migration_failures, 0);
    /* and the router's metrics say so (docs/METRICS.md) */
    {
        sw_metrics *m = NULL;
        char *text = NULL, want[256];
        size_t len = 0;
        assert_int_equal(sw_metrics_create(&m), SW_OK);
        assert_int_equal(sw_metrics_add_router(m, w->rt), SW_OK);
        assert_int_equal(sw_metrics_render(m, &text, &len), SW_OK);
        snprintf(want, sizeof(want), "\nstreamwire_frontend_migrations_total{router=\"%s\"} 1\n",
                 sw_router_id(w->rt));
        if (strstr(text, want) == NULL)
            fail_msg("no%s in:\n%s", want, text);
        snprintf(want, sizeof(want),
                 "\nstreamwire_frontend_migration_failures_total{router=\"%s\"} 0\n",
                 sw_router_id(w->rt));
        if (strstr(text, want) == NULL)
            fail_msg("no%s in:\n%s", want, text);
        free(text);
        sw_metrics_destroy(m);
    }
    sw_stream_close(s);
}

/* The stream moves to a worker that never says anything for it (it takes
 * the request and abandons it: no item, heartbeat or final; as a request
 * lost on its way, or a handler that went astray): silence ends it, as it
 * ends a first request. Before, the move left the stream's timer unplanned
 * (only the deadline counts while a stream moves, and nothing planned it
 * again after the move): with no deadline it waited for ever. */
static sw_err
from_the_start(sw_migration *m, void *arg)
{
    (void)arg;
    m->resume_from_seq = 0; /* (the payload says where: none of it here) */
    return SW_OK;
}

static void
silence_after_a_move_ends_the_stream(void **state)
{
    world *w = *state;
    coll c;
    sw_stream *s;
    int64_t t0;
    world_worker(w, NULL); /* w1 serves the stream */
    world_frontend(w, NULL);
    coll_init(&c);
    /* (from the start: the new worker's --hang-after 0 counts from 0) */
    s = open_stream(w, &c, 1, 0, from_the_start, NULL);
    coll_wait(&c, 10, T(10000));
    assert_int_equal(serving(w, &c), 0);
    w->extra[0] = "--hang-after";
    w->extra[1] = "0";
    world_worker(w, NULL); /* w2 abandons every stream at once */
    for (int64_t until = swh_now_ms() + T(10000);;) {
        sw_instance *v = NULL;
        size_t n = 0;
        assert_int_equal(sw_registry_list(w->reg, EP, &v, &n), SW_OK);
        sw_instances_free(v, n);
        if (n == 2)
            break;
        assert_true(swh_now_ms() < until);
        swh_sleep_ms(20);
    }
    swh_sleep_ms(100); /* the router's pool watches the same registry */
    t0 = swh_now_ms();
    swh_kill(w->pid[0], SIGKILL);
    coll_wait(&c, -1, T(10000)); /* lost (~0.2 s), moved, then 1.5 s of silence */
    print_message("    terminal %lld ms after the kill\n", (long long)(swh_now_ms() - t0));
    pthread_mutex_lock(&c.mu);
    assert_int_equal(c.terminals, 1);
    assert_int_equal(c.status, SW_STATUS_ERROR);
    assert_string_equal(c.reason, "stream_incomplete");
    assert_int_equal(c.migrations, 1);
    pthread_mutex_unlock(&c.mu);
    sw_stream_close(s);
}

static void
sigstop_migrates(void **state)
{
    world *w = *state;
    coll c;
    sw_stream *s;
    int from;
    s = begin(w, &c, 2, NULL, 2, 0, NULL, NULL, &from);
    swh_kill(w->pid[from], SIGSTOP);
    assert_migrated_once(w, &c, from);
    /* The frozen worker wakes up: what it still sends reaches nobody. */
    swh_kill(w->pid[from], SIGCONT);
    swh_sleep_ms(500);
    pthread_mutex_lock(&c.mu);
    assert_int_equal(c.n, TOKENS);
    assert_int_equal(c.terminals, 1);
    assert_int_equal(c.bad, 0);
    pthread_mutex_unlock(&c.mu);
    sw_stream_close(s);
}

/* The age of instance id's entry in w's registry view (-1: not listed). */
static int64_t
entry_age(world *w, const char *id)
{
    sw_instance *v = NULL;
    size_t n = 0;
    int64_t age = -1;
    assert_int_equal(sw_registry_list(w->reg, EP, &v, &n), SW_OK);
    for (size_t i = 0; i < n; i++)
        if (strcmp(v[i].instance_id, id) == 0)
            age = v[i].age_ms;
    sw_instances_free(v, n);
    return age;
}

static uint64_t
probes_sent(world *w)
{
    sw_router_stats st;
    sw_router_stats_get(w->rt, &st);
    return st.probes_sent;
}

/* A worker frozen right after it refreshed its entry, between two of the
 * router's probes: the refresh came after the router's last answer, but
 * before the first probe it left unanswered, so it proves nothing (a
 * partitioned worker would refresh after that probe). The router's report
 * is written at once, not refused and written when the lease lapses (3 s
 * after the refresh: 1 SIGSTOP trial in 20 of streamwire-bench's loss
 * scenario before). Probes go out every 500 ms here, and a trial counts
 * only if none went out from the poll before the refresh was seen until
 * after the freeze: the last probe was answered before the refresh, the
 * first unanswered one goes out after the freeze. */
static void
frozen_after_refresh_reported_at_once(void **state)
{
    world *w = *state;
    coll c;
    sw_stream *s;
    sw_registry_stats rs;
    int from, frozen = 0;
    int64_t t_freeze = 0;
    w->interval = "100"; /* a 6 s stream: the freeze comes while it runs */
    w->probe_ms = 500;
    s = begin(w, &c, 2, NULL, 2, 0, NULL, NULL, &from);
    for (int attempt = 0; attempt < 10 && !frozen; attempt++) {
        int64_t last = entry_age(w, w->id[from]), until = swh_now_ms() + T(3000);
        uint64_t probes = probes_sent(w);
        /* the moment this view sees a refresh (its age starts again) */
        for (;;) {
            int64_t age;
            probes = probes_sent(w);
            age = entry_age(w, w->id[from]);
            assert_true(age >= 0);
            if (age < last)
                break;
            last = age;
            assert_true(swh_now_ms() < until);
            swh_sleep_ms(1);
        }
        swh_kill(w->pid[from], SIGSTOP);
        t_freeze = swh_now_ms();
        if (probes_sent(w) == probes) {
            frozen = 1;
        } else {
            swh_kill(w->pid[from], SIGCONT);
            swh_sleep_ms(1200); /* a probe answered: a new run */
        }
    }
    assert_true(frozen);
    /* the stream moves on; the entry goes from the registry */
    assert_migrated_once(w, &c, from);
    for (int64_t until = swh_now_ms() + T(10000); entry_age(w, w->id[from]) >= 0;) {
        assert_true(swh_now_ms() < until);
        swh_sleep_ms(5);
    }
    sw_registry_stats_get(w->reg, &rs);
    if (rs.dead_reports_refused != 0 || rs.dead_reports_sent != 1)
        fail_msg("dead reports: %llu written, %llu refused (want 1 and 0); the entry went "
                 "%lld ms after the freeze",
                 (unsigned long long)rs.dead_reports_sent,
                 (unsigned long long)rs.dead_reports_refused, (long long)(swh_now_ms() - t_freeze));
    sw_stream_close(s);
}

/* SIGTERM: the worker drains; it hands the migratable stream back at once
 * (it does not wait out its 20 s grace) and the stream moves on. */
static void
drain_migrates(void **state)
{
    world *w = *state;
    coll c;
    sw_stream *s;
    int from, st = -1;
    int64_t t0;
    s = begin(w, &c, 2, NULL, 2, 0, NULL, NULL, &from);
    t0 = swh_now_ms();
    swh_kill(w->pid[from], SIGTERM);
    assert_migrated_once(w, &c, from);
    assert_int_equal(swh_wait_exit(w->pid[from], (int)T(10000), &st), 0);
    assert_int_equal(st, 0);
    assert_true(swh_now_ms() - t0 < T(10000));
    w->pid[from] = 0;
    sw_stream_close(s);
}

/* Limit 1: the second loss ends the stream with instance_lost, after every
 * item received so far, in order. */
static void
limit_reached(void **state)
{
    world *w = *state;
    coll c;
    sw_stream *s;
    int from, n;
    s = begin(w, &c, 2, NULL, 1, 0, NULL, NULL, &from);
    swh_kill(w->pid[from], SIGKILL);
    coll_wait(&c, 20, T(10000));
    swh_kill(w->pid[from == 0 ? 1 : 0], SIGKILL);
    coll_wait(&c, -1, T(20000));
    pthread_mutex_lock(&c.mu);
    n = c.n;
    assert_int_equal(c.bad, 0);
    assert_true(n >= 20 && n < TOKENS);
    assert_int_equal(c.status, SW_STATUS_ERROR);
    assert_int_equal(c.err, SW_INSTANCE_LOST);
    assert_int_equal(c.migrations, 1);
    pthread_mutex_unlock(&c.mu);
    sw_stream_close(s);
}

/* No other live instance: no_instances, after the items so far. */
static void
no_other_instance(void **state)
{
    world *w = *state;
    coll c;
    sw_stream *s;
    int from;
    s = begin(w, &c, 1, NULL, 2, 0, NULL, NULL, &from);
    swh_kill(w->pid[from], SIGKILL);
    coll_wait(&c, -1, T(20000));
    pthread_mutex_lock(&c.mu);
    assert_int_equal(c.bad, 0);
    assert_true(c.n >= 10 && c.n < TOKENS);
    assert_int_equal(c.status, SW_STATUS_ERROR);
    assert_int_equal(c.err, SW_NO_INSTANCES);
    assert_int_equal(c.migrations, 0);
    pthread_mutex_unlock(&c.mu);
    {
        sw_router_stats rst;
        sw_router_stats_get(w->rt, &rst);
        assert_int_equal(rst.migrations, 0);
        assert_int_equal(rst.migration_failures, 1);
    }
    sw_stream_close(s);
}

/* A cancel while the migrate callback runs: the stream ends cancelled, and
 * the other worker never gets a request. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int entered, release, calls;
    sw_err why[4]; /* of each call */
} gate;

static sw_err
gate_migrate(sw_migration *m, void *arg)
{
    gate *g = arg;
    pthread_mutex_lock(&g->mu);
    g->entered = 1;
    if (g->calls < 4)
        g->why[g->calls] = m->why;
    g->calls++;
    pthread_cond_broadcast(&g->cv);
    while (!g->release)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
    return SW_OK;
}

static void
gate_init(gate *g)
{
    memset(g, 0, sizeof(*g));
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
}

/* Waits until the migrate callback is in the gate. */
static void
gate_wait_entered(gate *g)
{
    pthread_mutex_lock(&g->mu);
    for (int64_t until = swh_now_ms() + T(10000); !g->entered && swh_now_ms() < until;) {
        pthread_mutex_unlock(&g->mu);
        swh_sleep_ms(5);
        pthread_mutex_lock(&g->mu);
    }
    assert_true(g->entered);
    pthread_mutex_unlock(&g->mu);
}

static void
gate_release(gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->release = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* How many requests worker i served, from its drain summary (SIGTERM;
 * it has wait_ms to exit). */
static long
served(world *w, int i, int64_t wait_ms)
{
    char log[16384], *p;
    FILE *f;
    size_t n;
    int st = -1;
    swh_kill(w->pid[i], SIGTERM);
    assert_int_equal(swh_wait_exit(w->pid[i], (int)wait_ms, &st), 0);
    w->pid[i] = 0;
    f = fopen(w->err_path[i], "r");
    assert_non_null(f);
    n = fread(log, 1, sizeof(log) - 1, f);
    fclose(f);
    log[n] = '\0';
    p = strstr(log, "drained (");
    assert_non_null(p);
    p = strstr(p, "): ");
    assert_non_null(p);
    return strtol(p + 3, NULL, 10);
}

static void
cancel_during_migration(void **state)
{
    world *w = *state;
    coll c;
    gate g;
    sw_stream *s;
    int from, other;
    gate_init(&g);
    s = begin(w, &c, 2, NULL, 2, 0, gate_migrate, &g, &from);
    other = from == 0 ? 1 : 0;
    swh_kill(w->pid[from], SIGKILL);
    gate_wait_entered(&g);
    assert_int_equal(sw_stream_cancel(s), SW_OK);
    gate_release(&g);
    coll_wait(&c, -1, T(10000));
    swh_sleep_ms(300);
    pthread_mutex_lock(&c.mu);
    assert_int_equal(c.status, SW_STATUS_CANCELLED);
    assert_int_equal(c.terminals, 1);
    assert_int_equal(c.migrations, 0);
    pthread_mutex_unlock(&c.mu);
    assert_int_equal(g.calls, 1);
    /* The other worker served nothing: its drain summary says so. */
    assert_int_equal(served(w, other, T(10000)), 0);
    sw_stream_close(s);
}

/* The instance a migration picks has just died (killed while the migrate
 * callback runs, before the pick; still listed): its request meets "no
 * responders", and the stream migrates again, to the third, instead of
 * ending with no_responders as it did. The router picks the least loaded:
 * the stream runs on a, a second one (never read) holds b, so the
 * migration picks c -- killed -- and then b. */
static void
dead_pick_migrates_again(void **state)
{
    world *w = *state;
    coll c;
    gate g;
    sw_request_opts o;
    sw_stream *s, *s2 = NULL;
    int a, b, k;
    char want[64];
    gate_init(&g);
    w->least = 1;
    for (int i = 0; i < 3; i++)
        world_worker(w, NULL);
    world_frontend(w, NULL);
    coll_init(&c);
    s = open_stream(w, &c, 2, 0, gate_migrate, &g);
    coll_wait(&c, 10, T(10000));
    a = serving(w, &c);
    sw_request_opts_init(&o);
    o.endpoint = EP;
    assert_int_equal(sw_router_open(&s2, w->rt, &o, "hello", 5), SW_OK);
    b = world_index(w, sw_stream_instance_id(s2));
    if (b < 0 || b == a)
        sw_stream_close(s); /* before the assertion: c is on this stack */
    assert_true(b >= 0 && b != a);
    k = 3 - a - b;
    swh_kill(w->pid[a], SIGKILL);
    gate_wait_entered(&g);
    swh_kill(w->pid[k], SIGKILL);
    assert_int_equal(swh_wait_exit(w->pid[k], (int)T(5000), NULL), 0);
    w->pid[k] = 0;
    swh_sleep_ms(300); /* the server has dropped its subscriptions */
    gate_release(&g);
    coll_wait(&c, -1, T(20000));
    swh_sleep_ms(100);
    sw_stream_close(s);
    sw_stream_close(s2);
    assert_int_equal(c.bad, 0);
    assert_int_equal(c.n, TOKENS);
    assert_int_equal(c.terminals, 1);
    assert_int_equal(c.status, SW_STATUS_COMPLETED);
    assert_int_equal(c.migrations, 2);
    snprintf(want, sizeof(want), "%s,%s,%s", w->id[a], w->id[k], w->id[b]);
    assert_string_equal(c.instances, want);
    assert_string_equal(c.last_inst, w->id[b]);
    assert_int_equal(g.calls, 2);
    assert_int_equal(g.why[0], SW_INSTANCE_LOST);
    assert_int_equal(g.why[1], SW_NO_RESPONDERS);
}

/* Holds the re-route of a stream whose request met "no responders" until
 * the stream has migrated (its request id changed), as a preemption of
 * the mux thread between swe_reroute's check and its switch would. */
typedef struct reroute_hold {
    pthread_mutex_t mu;
    int entered, migrated;
} reroute_hold;

static void
hold_reroute(sw_stream *s, void *arg)
{
    reroute_hold *h = arg;
    uint8_t id0[16], id[16];
    int moved = 0;
    swx_stream_id(s, id0);
    for (int64_t until = swh_now_ms() + T(5000); !moved && swh_now_ms() < until;) {
        swh_sleep_ms(5);
        swx_stream_id(s, id);
        moved = memcmp(id, id0, sizeof(id)) != 0;
    }
    if (moved)
        swh_sleep_ms(50); /* the new request is out and answered meanwhile */
    pthread_mutex_lock(&h->mu);
    h->entered++;
    h->migrated += moved;
    pthread_mutex_unlock(&h->mu);
}

/* A request routed to a killed worker (still listed) meets "no
 * responders", and its one re-route begins; meanwhile the probe thread
 * finds the same worker lost and migrates the stream. The migration owns
 * the stream then: the re-route, resumed, must not switch it again. It
 * did (swe_reroute checked only before quarantining): the stream's
 * instance was overwritten, the dead one released twice, and a second
 * worker was sent the old request, whose answers no stream took. The
 * stream runs on a, a second (unread) one on b, so the router (least
 * loaded) picks k, killed. */
static void
reroute_yields_to_migration(void **state)
{
    world *w = *state;
    coll c;
    reroute_hold h;
    sw_request_opts o;
    sw_stream *s, *s2 = NULL, *s3 = NULL;
    int a, b, k, to;
    char want[64];
    memset(&h, 0, sizeof(h));
    pthread_mutex_init(&h.mu, NULL);
    w->least = 1;
    w->interval = "50"; /* the two held streams stay in flight for 3 s */
    w->probe_ms = 200;
    for (int i = 0; i < 3; i++)
        world_worker(w, NULL);
    world_frontend(w, NULL);
    swx_router_on_reroute(w->rt, hold_reroute, &h);
    sw_request_opts_init(&o);
    o.endpoint = EP;
    assert_int_equal(sw_router_open(&s2, w->rt, &o, "hello", 5), SW_OK);
    assert_int_equal(sw_router_open(&s3, w->rt, &o, "hello", 5), SW_OK);
    a = world_index(w, sw_stream_instance_id(s2));
    b = world_index(w, sw_stream_instance_id(s3));
    assert_true(a >= 0 && b >= 0 && a != b);
    k = 3 - a - b;
    swh_kill(w->pid[k], SIGKILL);
    assert_int_equal(swh_wait_exit(w->pid[k], (int)T(5000), NULL), 0);
    w->pid[k] = 0;
    swh_sleep_ms(100); /* the server has dropped its subscriptions */
    coll_init(&c);
    s = open_stream(w, &c, 2, 0, NULL, NULL);
    assert_string_equal(sw_stream_instance_id(s), w->id[k]);
    coll_wait(&c, -1, T(20000));
    swh_sleep_ms(100);
    pthread_mutex_lock(&h.mu);
    assert_int_equal(h.entered, 1);
    assert_int_equal(h.migrated, 1); /* the race did happen */
    pthread_mutex_unlock(&h.mu);
    pthread_mutex_lock(&c.mu);
    assert_int_equal(c.bad, 0);
    assert_int_equal(c.n, TOKENS);
    assert_int_equal(c.terminals, 1);
    assert_int_equal(c.status, SW_STATUS_COMPLETED);
    assert_int_equal(c.migrations, 1);
    to = world_index(w, c.last_inst);
    assert_true(to == a || to == b);
    snprintf(want, sizeof(want), "%s,%s", w->id[k], w->id[to]);
    assert_string_equal(c.instances, want);
    pthread_mutex_unlock(&c.mu);
    sw_stream_close(s);
    sw_stream_close(s2);
    sw_stream_close(s3);
    /* s2, s3 and the migrated request: no fourth went out. */
    assert_int_equal(served(w, a, T(30000)) + served(w, b, T(30000)), 3);
    swx_router_on_reroute(w->rt, NULL, NULL);
    pthread_mutex_destroy(&h.mu);
}

/* A "no responders" status published by anyone to a migrated stream's
 * response subject after its new worker answered: the server sends that
 * status only at once, for a request nobody took, so it is ignored (and
 * counted). Before, the stream migrated again without stopping the live
 * worker, which ran the request on for nobody. */
static void
forged_no_responders_ignored(void **state)
{
    world *w = *state;
    coll c;
    sw_stream *s;
    int from;
    char subj[256], hex[64];
    natsConnection *nc = NULL;
    natsMsg *m = NULL;
    sw_router_stats st0, st1;
    s = begin(w, &c, 2, NULL, 2, 0, NULL, NULL, &from);
    pthread_mutex_lock(&g_mig_mu);
    g_mig_hex[0] = '\0';
    pthread_mutex_unlock(&g_mig_mu);
    swh_kill(w->pid[from], SIGKILL);
    coll_wait(&c, 20, T(10000)); /* the new worker answered */
    pthread_mutex_lock(&g_mig_mu);
    snprintf(hex, sizeof(hex), "%s", g_mig_hex);
    pthread_mutex_unlock(&g_mig_mu);
    assert_int_equal(strlen(hex), 32);
    assert_int_equal(swt_subject_response(subj, sizeof(subj), sw_router_id(w->rt), hex), SW_OK);
    sw_router_stats_get(w->rt, &st0);
    assert_int_equal(natsConnection_ConnectTo(&nc, g_nats.url), NATS_OK);
    assert_int_equal(natsMsg_Create(&m, subj, NULL, NULL, 0), NATS_OK);
    assert_int_equal(natsMsgHeader_Set(m, "Status", "503"), NATS_OK);
    assert_int_equal(natsConnection_PublishMsg(nc, m), NATS_OK);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    natsMsg_Destroy(m);
    natsConnection_Destroy(nc);
    assert_migrated_once(w, &c, from);
    sw_router_stats_get(w->rt, &st1);
    assert_true(st1.unknown_stream >= st0.unknown_stream + 1);
    assert_int_equal(st1.migrations, 1);
    sw_stream_close(s);
}

static void *
destroy_main(void *arg)
{
    sw_router_destroy(arg);
    return NULL;
}

/* sw_router_destroy while a migration is in its callback: the stream's old
 * request id has already left the router's table, so destroy's sweep of the
 * table does not find it; the migration, seeing the router closing, must
 * end it itself. Before, it just stopped: no terminal ever came (a blocking
 * consumer would have waited for ever). */
static void
destroy_during_migration(void **state)
{
    world *w = *state;
    coll c;
    gate g;
    sw_stream *s;
    pthread_t th;
    int from;
    gate_init(&g);
    s = begin(w, &c, 2, NULL, 2, 0, gate_migrate, &g, &from);
    swh_kill(w->pid[from], SIGKILL);
    gate_wait_entered(&g);
    /* destroy waits for the thread running the migration; it is closing
     * the router before the callback returns */
    assert_int_equal(pthread_create(&th, NULL, destroy_main, w->rt), 0);
    swh_sleep_ms(200);
    gate_release(&g);
    assert_int_equal(pthread_join(th, NULL), 0);
    w->rt = NULL;
    /* The terminal came before destroy returned. */
    pthread_mutex_lock(&c.mu);
    assert_int_equal(c.bad, 0);
    assert_true(c.n >= 10);
    assert_int_equal(c.terminals, 1);
    assert_int_equal(c.status, SW_STATUS_ERROR);
    assert_int_equal(c.err, SW_ECLOSED);
    assert_int_equal(c.migrations, 0);
    pthread_mutex_unlock(&c.mu);
    assert_int_equal(g.calls, 1);
    sw_stream_close(s);
    swh_sleep_ms(100);
    pthread_mutex_lock(&c.mu);
    assert_int_equal(c.terminals, 1); /* and no second one on close */
    pthread_mutex_unlock(&c.mu);
}

/* A blocking consumer whose credit is held, once, between being decided
 * and being sent, while the worker it was for is killed and the stream
 * migrates (egress/chaos.h's hook stands in for a preemption there). */
typedef struct held {
    world *w;
    sw_stream *s;
    coll c; /* what the consumer took, checked as coll_cb checks a callback's */
    int armed, held, moved;
    char old_inst[16];
} held;

static _Thread_local int tl_consumer; /* the thread of held_main */

static void
held_credit(sw_stream *s, void *arg)
{
    held *h = arg;
    int i;
    if (!tl_consumer || !h->armed || h->c.n < 10) /* c.n: written on this thread */
        return;
    h->armed = 0;
    h->held = 1;
    snprintf(h->old_inst, sizeof(h->old_inst), "%s", sw_stream_instance_id(s));
    i = world_index(h->w, h->old_inst);
    if (i < 0)
        return;
    swh_kill(h->w->pid[i], SIGKILL);
    for (int64_t until = swh_now_ms() + T(10000); swh_now_ms() < until; swh_sleep_ms(5))
        if (strcmp(sw_stream_instance_id(s), h->old_inst) != 0) {
            h->moved = 1;
            break;
        }
}

static void *
held_main(void *arg)
{
    held *h = arg;
    const sw_item *it;
    tl_consumer = 1;
    while (sw_stream_next(h->s, &it, T(30000)) == SW_OK) {
        coll_cb(h->s, it, &h->c);
        /* slower than the worker: the window stays at its first size, so
         * the frontend never grants ahead of what a stale credit lets go */
        swh_sleep_ms(2);
    }
    return NULL;
}

/* The credit the consumer decided for the worker that was lost reaches
 * nobody: before, it went to the new worker, in the old worker's seqs, and
 * let it send past the window the frontend had granted it -- the stream
 * ended with flow_violation after a migration that had worked. */
static void
stale_credit_after_migration(void **state)
{
    world *w = *state;
    held h;
    sw_request_opts o;
    pthread_t th;
    memset(&h, 0, sizeof(h));
    h.w = w;
    coll_init(&h.c);
    w->interval = "0"; /* as fast as the credit lets it */
    for (int i = 0; i < 2; i++)
        world_worker(w, NULL);
    world_frontend(w, NULL);
    swx_router_on_credit(w->rt, held_credit, &h);
    sw_request_opts_init(&o);
    o.endpoint = EP;
    o.migration_limit = 2;
    o.credit_window = 8;
    assert_int_equal(sw_router_open(&h.s, w->rt, &o, "hello", 5), SW_OK);
    h.armed = 1;
    assert_int_equal(pthread_create(&th, NULL, held_main, &h), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(h.held, 1);
    assert_int_equal(h.moved, 1);
    assert_int_equal(h.c.bad, 0);
    assert_int_equal(h.c.n, TOKENS);
    assert_int_equal(h.c.terminals, 1);
    assert_string_equal(h.c.reason, "stop");
    assert_int_equal(h.c.status, SW_STATUS_COMPLETED);
    assert_int_equal(h.c.migrations, 1);
    sw_stream_close(h.s);
}

static void
sealed_migrates(void **state)
{
    world *w = *state;
    coll c;
    sw_stream *s;
    int from;
    s = begin(w, &c, 2, g_key, 2, 0, NULL, NULL, &from);
    swh_kill(w->pid[from], SIGKILL);
    assert_migrated_once(w, &c, from);
    sw_stream_close(s);
}

/* The migrate callback rebuilds the prompt as an LLM frontend would: the
 * tokens so far appended, max_tokens lowered, no resume_from_seq (the demo
 * engine continues after the tokens its prompt holds). */
typedef struct rebuild {
    int calls, bad;
    size_t nitems;
} rebuild;

static sw_err
rebuild_migrate(sw_migration *m, void *arg)
{
    rebuild *rb = arg;
    size_t cap = m->len + 16 * m->nitems + 1, off;
    char *p = malloc(cap);
    rb->calls++;
    rb->nitems = m->nitems;
    if (p == NULL)
        return SW_ENOMEM;
    if (m->len != 5 || memcmp(m->payload, "hello", 5) != 0 || m->max_tokens != 50 ||
        m->attempt != 1 || m->why != SW_INSTANCE_LOST || m->resume_from_seq != m->nitems + 1)
        rb->bad++;
    memcpy(p, m->payload, m->len);
    off = m->len;
    for (size_t i = 0; i < m->nitems; i++) {
        char want[32];
        int n = snprintf(want, sizeof(want), "token-%zu", i);
        if (m->items[i].seq != i + 1 || m->items[i].len != (size_t)n ||
            memcmp(m->items[i].data, want, (size_t)n) != 0)
            rb->bad++;
        p[off++] = ' ';
        memcpy(p + off, m->items[i].data, m->items[i].len);
        off += m->items[i].len;
    }
    m->new_payload = p;
    m->new_len = off;
    m->new_max_tokens = m->max_tokens - (uint32_t)m->nitems;
    m->resume_from_seq = 0;
    return SW_OK;
}

static void
callback_rebuilds_prompt(void **state)
{
    world *w = *state;
    coll c;
    rebuild rb = {0, 0, 0};
    sw_stream *s;
    int from;
    s = begin(w, &c, 2, NULL, 2, 50, rebuild_migrate, &rb, &from);
    swh_kill(w->pid[from], SIGKILL);
    coll_wait(&c, -1, T(20000));
    pthread_mutex_lock(&c.mu);
    assert_int_equal(c.bad, 0);
    assert_int_equal(c.n, 50);
    assert_int_equal(c.status, SW_STATUS_INCOMPLETE);
    assert_string_equal(c.reason, "max_tokens");
    assert_int_equal(c.migrations, 1);
    pthread_mutex_unlock(&c.mu);
    assert_int_equal(rb.calls, 1);
    assert_int_equal(rb.bad, 0);
    assert_true(rb.nitems >= 10 && rb.nitems < 50);
    sw_stream_close(s);
}

/* The migrate callback declines (returns an error): the stream ends with
 * the terminal it would have had without migration (instance_lost, after
 * the items so far), no move is made, and the router counts a failed one
 * (streamwire.h: sw_migrate_fn, migration_failures). */
static sw_err
decline_migrate(sw_migration *m, void *arg)
{
    int *calls = arg;
    (*calls)++;
    if (m->attempt != 1 || m->why != SW_INSTANCE_LOST || m->nitems < 10)
        (*calls) += 100;
    return SW_EINVAL;
}

static void
callback_declines(void **state)
{
    world *w = *state;
    coll c;
    sw_stream *s;
    sw_router_stats rst;
    int from, calls = 0;
    s = begin(w, &c, 2, NULL, 2, 0, decline_migrate, &calls, &from);
    swh_kill(w->pid[from], SIGKILL);
    coll_wait(&c, -1, T(20000));
    swh_sleep_ms(100); /* nothing more may come */
    pthread_mutex_lock(&c.mu);
    assert_int_equal(c.bad, 0);
    assert_true(c.n >= 10 && c.n < TOKENS);
    assert_int_equal(c.terminals, 1);
    assert_int_equal(c.status, SW_STATUS_ERROR);
    assert_int_equal(c.err, SW_INSTANCE_LOST);
    assert_int_equal(c.migrations, 0);
    assert_string_equal(c.last_inst, w->id[from]);
    pthread_mutex_unlock(&c.mu);
    assert_int_equal(calls, 1);
    sw_router_stats_get(w->rt, &rst);
    assert_int_equal(rst.migrations, 0);
    assert_int_equal(rst.migration_failures, 1);
    sw_stream_close(s);
}

/* The migrate callback makes a request larger than the server takes: the
 * move cannot be published, the stream ends with SW_EMSGSIZE after the
 * items so far, and the router counts it as a failed move, not a move. */
static sw_err
huge_migrate(sw_migration *m, void *arg)
{
    size_t n = 2u << 20; /* the test server's max payload is 1 MiB */
    (void)arg;
    if ((m->new_payload = malloc(n)) == NULL)
        return SW_ENOMEM;
    memset(m->new_payload, 'p', n);
    m->new_len = n;
    return SW_OK;
}

static void
callback_request_too_big(void **state)
{
    world *w = *state;
    coll c;
    sw_stream *s;
    sw_router_stats rst;
    int from;
    s = begin(w, &c, 2, NULL, 2, 0, huge_migrate, NULL, &from);
    swh_kill(w->pid[from], SIGKILL);
    coll_wait(&c, -1, T(20000));
    swh_sleep_ms(100);
    pthread_mutex_lock(&c.mu);
    assert_int_equal(c.bad, 0);
    assert_true(c.n >= 10 && c.n < TOKENS);
    assert_int_equal(c.terminals, 1);
    assert_int_equal(c.status, SW_STATUS_ERROR);
    assert_int_equal(c.err, SW_EMSGSIZE);
    pthread_mutex_unlock(&c.mu);
    sw_router_stats_get(w->rt, &rst);
    assert_int_equal(rst.migrations, 0);
    assert_int_equal(rst.migration_failures, 1);
    sw_stream_close(s);
}

/* The front door: `streamwire gateway --migration-limit 2`. The worker
 * serving an SSE response is SIGKILLed mid-stream; the client's response
 * carries every token once, in order, and completes. */
static void
gateway_migrates(void **state)
{
    world *w = *state;
    const char *argv[] = {"gateway",  "--server", g_nats.url, "--listen", "127.0.0.1:0",
                          "--bucket", w->bucket,  "--model",  "m=" EP,    "--migration-limit",
                          "2",        "--quiet",  NULL};
    char line[4096], gw[128], cmd[1024], victim[16] = "", *text, *p;
    size_t len = 0, cap = 1 << 20;
    int fd, deltas = 0, st, vi;
    pid_t pid;
    FILE *f;
    world_worker(w, NULL);
    world_worker(w, NULL);
    pid = swh_spawn(argv, &fd);
    assert_true(pid > 0);
    assert_int_equal(swh_wait_line(fd, "gateway ready", line, sizeof(line), (int)T(15000)), 0);
    snprintf(gw, sizeof(gw), "%s", strchr(line, '=') + 1);
    swh_sleep_ms((int)T(1000)); /* the registry entries reach the gateway's router */
    snprintf(cmd, sizeof(cmd),
             "curl -s -N -m 60 -X POST -H 'content-type: application/json' --data-binary "
             "'{\"model\":\"m\",\"input\":\"hello\",\"stream\":true}' 'http://%s/v1/responses'",
             gw);
    f = popen(cmd, "r");
    assert_non_null(f);
    text = malloc(cap);
    assert_non_null(text);
    text[0] = '\0';
    while (fgets(line, sizeof(line), f) != NULL) {
        size_t l = strlen(line);
        assert_true(len + l < cap);
        memcpy(text + len, line, l + 1);
        len += l;
        if (victim[0] == '\0' && (p = strstr(line, "routed to instance ")) != NULL)
            sscanf(p + strlen("routed to instance "), "%15[A-Za-z0-9_-]", victim);
        if (strncmp(line, "event: response.output_text.delta", 33) == 0 && ++deltas == 10) {
            vi = world_index(w, victim);
            assert_true(vi >= 0);
            swh_kill(w->pid[vi], SIGKILL);
        }
    }
    pclose(f);
    /* every token once, in order, then completed */
    {
        char want[16 * TOKENS], got[16 * TOKENS];
        size_t wl = 0, gl = 0;
        for (int i = 0; i < TOKENS; i++)
            wl += (size_t)snprintf(want + wl, sizeof(want) - wl, "token-%d", i);
        for (p = text; (p = strstr(p, "\"delta\":\"")) != NULL;) {
            char *e;
            p += 9;
            e = strchr(p, '"');
            assert_non_null(e);
            assert_true(gl + (size_t)(e - p) < sizeof(got));
            memcpy(got + gl, p, (size_t)(e - p));
            gl += (size_t)(e - p);
            p = e;
        }
        got[gl] = '\0';
        assert_string_equal(got, want);
    }
    assert_true(deltas >= 10);
    assert_non_null(strstr(text, "event: response.completed"));
    assert_null(strstr(text, "event: response.failed"));
    free(text);
    swh_kill(pid, SIGTERM);
    assert_int_equal(swh_wait_exit(pid, (int)T(20000), &st), 0);
    close(fd);
}

/* The options are checked. */
static void
bad_options(void **state)
{
    world *w = *state;
    sw_request_opts o;
    sw_router_opts ro;
    sw_router *rt = NULL;
    sw_stream *s = NULL;
    world_worker(w, NULL);
    world_frontend(w, NULL);
    sw_request_opts_init(&o);
    o.endpoint = EP;
    o.migration_limit = SW_MAX_MIGRATIONS + 1;
    assert_int_equal(sw_router_open(&s, w->rt, &o, "x", 1), SW_EINVAL);
    o.migration_limit = -2;
    assert_int_equal(sw_router_open(&s, w->rt, &o, "x", 1), SW_EINVAL);
    sw_router_opts_init(&ro);
    ro.migration_limit = -1;
    assert_int_equal(sw_router_create(&rt, w->conn, &ro), SW_EINVAL);
    ro.migration_limit = SW_MAX_MIGRATIONS + 1;
    assert_int_equal(sw_router_create(&rt, w->conn, &ro), SW_EINVAL);
    assert_null(rt);
}

static int
group_setup(void **state)
{
    swt_seal_key k;
    char hex[SWT_SEAL_KEY_HEX + 1];
    FILE *f;
    (void)state;
    if (getenv("SW_SLOW") != NULL && strcmp(getenv("SW_SLOW"), "0") != 0)
        g_slow = 3;
    g_verbose = getenv("SW_IT_VERBOSE") != NULL;
    if (swh_nats_start(&g_nats, NULL) != 0)
        return -1;
    snprintf(g_key, sizeof(g_key), "%s/cluster.key", g_nats.dir);
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

int
main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(sigkill_migrates, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(silence_after_a_move_ends_the_stream, world_setup,
                                        world_teardown),
        cmocka_unit_test_setup_teardown(sigstop_migrates, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(frozen_after_refresh_reported_at_once, world_setup,
                                        world_teardown),
        cmocka_unit_test_setup_teardown(drain_migrates, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(limit_reached, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(no_other_instance, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(cancel_during_migration, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(destroy_during_migration, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(dead_pick_migrates_again, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(reroute_yields_to_migration, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(forged_no_responders_ignored, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(stale_credit_after_migration, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(sealed_migrates, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(callback_rebuilds_prompt, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(callback_declines, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(callback_request_too_big, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(gateway_migrates, world_setup, world_teardown),
        cmocka_unit_test_setup_teardown(bad_options, world_setup, world_teardown),
    };
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
