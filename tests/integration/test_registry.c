/* tests/integration/test_registry.c -- the registry conformance suite
 * (issue 4): every test is written once and runs against both backends,
 * "memory" and "nats-kv", like nng's NUTS_DECLARE_TRAN_TESTS. The backend's
 * name is the cmocka prestate; the per-test setup builds a fixture for it.
 *
 * This one source builds two binaries:
 *   tests/integration/test_registry  the suite on "nats-kv"; the harness
 *       starts one nats-server (JetStream on) for the whole file, and each
 *       worker is a real sw_ingress registered via sw_ingress_registration.
 *   tests/unit/test_registry_mem     compiled with SW_REGISTRY_MEMORY_ONLY:
 *       the suite on "memory", with no nats-server and no connection at all
 *       (a worker is a bare sw_registration), plus the lock-contract tests
 *       (no log or watch callback runs with a registry or pool lock held).
 *
 * Each test uses its own bucket ("itreg_<test>_<random>"): the memory
 * backend's buckets are process-global by name, and KV buckets outlive a
 * test in the server.
 *
 * Watch callbacks run on registry (or backend) threads: they only record
 * into a mutex-protected event log that the test thread checks. Every wait
 * is a generous bound multiplied by swh_slow(); nothing asserts a speed.
 *
 * Run one test: test_registry '<glob>', e.g. test_registry '*lease*'. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include <nats/nats.h>
#include <streamwire/registry.h>
#include <streamwire/streamwire.h>

#include "harness.h"
#include "proto/sw_codec.h"
#include "router/chaos.h"
#ifdef SW_REGISTRY_MEMORY_ONLY
#include "router/registry_int.h" /* remembered_deletes_bounded reads the view */
#endif
#include "router/sw_pool.h"
#include "transport/sw_transport.h"

#ifdef SW_REGISTRY_MEMORY_ONLY
#define SUITE_BACKEND "memory"
#else
#define SUITE_BACKEND "nats-kv"
#endif

#ifndef SW_REGISTRY_MEMORY_ONLY
static swh_nats g_nats;
#endif
static int g_slow = 1;
static int g_verbose;

#define T(ms) ((int64_t)(ms)*g_slow)

static int64_t
now_ms(void)
{
    return (int64_t)swh_now_ms();
}

static int64_t
unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
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

static void
cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t until_ms)
{
    struct timespec ts;
    ts.tv_sec = (time_t)(until_ms / 1000);
    ts.tv_nsec = (long)(until_ms % 1000) * 1000000L;
    (void)pthread_cond_timedwait(cv, mu, &ts);
}

static void
test_log(void *arg, sw_log_level level, const char *msg)
{
    if (g_verbose || level <= SW_LOG_ERROR)
        fprintf(stderr, "[%s] %s: %s\n", arg ? (const char *)arg : "reg", sw_log_level_name(level),
                msg);
}

/* A random 8-hex suffix, different in every call. */
static void
rand_suffix(char out[9])
{
    static unsigned counter;
    unsigned v = (unsigned)getpid() * 2654435761u ^ (unsigned)unix_ms() ^ (++counter * 40503u);
    FILE *f = fopen("/dev/urandom", "rb");
    if (f != NULL) {
        unsigned r;
        if (fread(&r, sizeof(r), 1, f) == 1)
            v ^= r;
        fclose(f);
    }
    snprintf(out, 9, "%08x", v);
}

/* ======================================================================== */
/* Event log: what a watcher saw                                             */

#define EVMAX 1024

typedef struct ev_rec {
    int ev;
    char id[SW_MAX_TOKEN + 1];
    char endpoint[SW_MAX_ENDPOINT + 1];
    int draining;
    uint64_t rev;
    uint32_t pid;
    int64_t t;
} ev_rec;

typedef struct evlog {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ev_rec v[EVMAX];
    int n;
    int calls;       /* callbacks entered */
    int in_cb;       /* callbacks running now */
    int cb_sleep_ms; /* each callback sleeps this long (unwatch test) */
    int bad;         /* a callback saw inconsistent data */
} evlog;

static void
evlog_init(evlog *l)
{
    memset(l, 0, sizeof(*l));
    pthread_mutex_init(&l->mu, NULL);
    cond_init_mono(&l->cv);
}

static void
evlog_fini(evlog *l)
{
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
}

static void
on_event(void *arg, sw_registry_event ev, const sw_instance *inst)
{
    evlog *l = arg;
    int sleep_ms;
    pthread_mutex_lock(&l->mu);
    l->calls++;
    l->in_cb++;
    if (l->in_cb != 1)
        l->bad++; /* callbacks must never run concurrently */
    if (inst == NULL || inst->instance_id == NULL || inst->endpoint == NULL ||
        inst->request_subject == NULL || inst->control_subject == NULL || inst->host == NULL)
        l->bad++;
    if (l->n < EVMAX && inst != NULL && inst->instance_id != NULL) {
        ev_rec *r = &l->v[l->n++];
        r->ev = (int)ev;
        snprintf(r->id, sizeof(r->id), "%s", inst->instance_id);
        snprintf(r->endpoint, sizeof(r->endpoint), "%s", inst->endpoint ? inst->endpoint : "");
        r->draining = inst->draining;
        r->rev = inst->revision;
        r->pid = inst->pid;
        r->t = now_ms();
    }
    sleep_ms = l->cb_sleep_ms;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    if (sleep_ms > 0)
        swh_sleep_ms(sleep_ms);
    pthread_mutex_lock(&l->mu);
    l->in_cb--;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

/* Index of the first event `ev` (0 = any) for id (NULL = any) at or after
 * index `from`, waiting up to timeout_ms; -1 if none came. */
static int
evlog_wait(evlog *l, int ev, const char *id, int from, int64_t timeout_ms)
{
    int64_t until = now_ms() + timeout_ms;
    int found = -1;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        for (int i = from; i < l->n && found < 0; i++)
            if ((ev == 0 || l->v[i].ev == ev) && (id == NULL || strcmp(l->v[i].id, id) == 0))
                found = i;
        if (found >= 0 || now_ms() >= until)
            break;
        cond_wait_until(&l->cv, &l->mu, until);
    }
    pthread_mutex_unlock(&l->mu);
    return found;
}

static int
evlog_count(evlog *l, int ev, const char *id, int from)
{
    int c = 0;
    pthread_mutex_lock(&l->mu);
    for (int i = from; i < l->n; i++)
        if ((ev == 0 || l->v[i].ev == ev) && (id == NULL || strcmp(l->v[i].id, id) == 0))
            c++;
    pthread_mutex_unlock(&l->mu);
    return c;
}

static int
evlog_n(evlog *l)
{
    int n;
    pthread_mutex_lock(&l->mu);
    n = l->n;
    pthread_mutex_unlock(&l->mu);
    return n;
}

static ev_rec
evlog_get(evlog *l, int i)
{
    ev_rec r;
    pthread_mutex_lock(&l->mu);
    r = l->v[i];
    pthread_mutex_unlock(&l->mu);
    return r;
}

/* ======================================================================== */
/* Fixture                                                                   */

#define MAXREG 6
#define MAXING 6
#define NLOG 3

typedef struct fx {
    const char *be;                 /* backend name: "memory" or "nats-kv" */
    const sw_registry_backend *ops; /* if set, opened with this table instead */
    char bucket[SW_MAX_TOKEN + 1];
    char sfx[9];
    sw_conn *conn;
    sw_registry *reg[MAXREG];
    sw_ingress *ing[MAXING];    /* nats-kv only: the workers' ingresses */
    sw_registration rg[MAXING]; /* what slot i registers */
    char subj[MAXING][2][SWP_MAX_SUBJECT + 1];
    char ids[MAXING][SW_MAX_TOKEN + 1];
    evlog log[NLOG];
    void *raw_state[2];
    const sw_registry_backend *raw_be[2];
    void *raw_watch[2];
} fx;

/* Connections: the NATS connection is closed at teardown, the sw_conn freed
 * at group teardown (see test_lifecycle.c: nats.c may still run the
 * connection's callbacks on its own thread right after close). */
#define MAX_GRAVE 256
static sw_conn *g_grave[MAX_GRAVE];
static int g_ngrave;

static void
conn_retire(sw_conn *c)
{
    if (c == NULL)
        return;
#ifndef SW_REGISTRY_MEMORY_ONLY
    natsConnection_Close((natsConnection *)sw_conn_nats(c));
#endif
    if (g_ngrave < MAX_GRAVE)
        g_grave[g_ngrave++] = c;
    else
        sw_conn_close(c);
}

static int
setup(void **state)
{
    fx *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return -1;
    f->be = *state; /* the prestate: the backend's name */
    rand_suffix(f->sfx);
    snprintf(f->bucket, sizeof(f->bucket), "itreg_%s", f->sfx);
    for (int i = 0; i < NLOG; i++)
        evlog_init(&f->log[i]);
#ifdef SW_REGISTRY_MEMORY_ONLY
    /* No server, no connection: the memory backend needs neither. */
    f->conn = NULL;
#else
    {
        sw_conn_opts o;
        sw_conn_opts_init(&o);
        o.url = g_nats.url;
        o.name = "itest-registry";
        if (sw_conn_open(&f->conn, &o) != SW_OK) {
            free(f);
            return -1;
        }
    }
#endif
    *state = f;
    return 0;
}

static void watchdog_stop(void);

static int
teardown(void **state)
{
    fx *f = *state;
    for (int i = 0; i < 2; i++) {
        if (f->raw_watch[i] != NULL)
            f->raw_be[i]->unwatch(f->raw_state[i], f->raw_watch[i]);
        if (f->raw_state[i] != NULL)
            f->raw_be[i]->close(f->raw_state[i]);
    }
    for (int i = 0; i < MAXREG; i++)
        sw_registry_close(f->reg[i]);
    for (int i = 0; i < MAXING; i++)
        sw_ingress_destroy(f->ing[i]);
    conn_retire(f->conn);
    for (int i = 0; i < NLOG; i++)
        evlog_fini(&f->log[i]);
    free(f);
    watchdog_stop(); /* a test that failed by an assertion left it running */
    return 0;
}

/* A unique instance id for slot i. */
static const char *
fx_id(fx *f, int i)
{
    if (f->ids[i][0] == '\0')
        snprintf(f->ids[i], sizeof(f->ids[i]), "w%d-%s", i, f->sfx);
    return f->ids[i];
}

static void
noop_handler(sw_responder *r, void *arg)
{
    (void)arg;
    (void)sw_responder_finish(r, SW_STATUS_COMPLETED, NULL);
}

/* A registration of instance id serving endpoint, its subjects formatted
 * into subj[2] (as an ingress would). */
static void
rg_fill(sw_registration *rg, char subj[2][SWP_MAX_SUBJECT + 1], const char *id,
        const char *endpoint)
{
    assert_int_equal(swt_subject_request(subj[0], SWP_MAX_SUBJECT + 1, endpoint, id), SW_OK);
    assert_int_equal(swt_subject_control(subj[1], SWP_MAX_SUBJECT + 1, id), SW_OK);
    rg->instance_id = id;
    rg->endpoint = endpoint;
    rg->request_subject = subj[0];
    rg->control_subject = subj[1];
}

/* Worker slot i serving endpoint: what it registers. On nats-kv a real
 * ingress runs and the registration comes from sw_ingress_registration; on
 * the memory-only build there is no connection, so it is a bare
 * description with the same subjects. */
static const sw_registration *
fx_worker(fx *f, int i, const char *endpoint)
{
#ifdef SW_REGISTRY_MEMORY_ONLY
    rg_fill(&f->rg[i], f->subj[i], fx_id(f, i), endpoint);
    (void)noop_handler;
#else
    sw_ingress_opts o;
    sw_ingress_opts_init(&o);
    o.endpoint = endpoint;
    o.instance_id = fx_id(f, i);
    o.handler = noop_handler;
    o.handler_threads = 1;
    assert_null(f->ing[i]);
    assert_int_equal(sw_ingress_start(&f->ing[i], f->conn, &o), SW_OK);
    assert_int_equal(sw_ingress_registration(f->ing[i], &f->rg[i]), SW_OK);
    assert_string_equal(f->rg[i].instance_id, sw_ingress_instance_id(f->ing[i]));
    assert_string_equal(f->rg[i].endpoint, sw_ingress_endpoint(f->ing[i]));
    assert_string_equal(f->rg[i].request_subject, sw_ingress_request_subject(f->ing[i]));
    assert_string_equal(f->rg[i].control_subject, sw_ingress_control_subject(f->ing[i]));
    assert_int_equal(sw_ingress_registration(NULL, &f->rg[i]), SW_EINVAL);
    assert_int_equal(sw_ingress_registration(f->ing[i], NULL), SW_EINVAL);
#endif
    return &f->rg[i];
}

/* Opens registry slot i on the fixture's backend and bucket. */
static sw_registry *
fx_reg(fx *f, int i, unsigned lease_ms, unsigned refresh_ms)
{
    sw_registry_opts o;
    sw_registry_opts_init(&o);
    o.backend = f->be;
    o.backend_ops = f->ops;
    o.bucket = f->bucket;
    o.lease_ms = lease_ms;
    o.refresh_ms = refresh_ms;
    o.log = test_log;
    o.log_arg = (void *)f->be;
    assert_null(f->reg[i]);
    /* The memory backend needs no connection: prove it by passing none. */
    assert_int_equal(
        sw_registry_open(&f->reg[i], strcmp(f->be, "memory") == 0 ? NULL : f->conn, &o), SW_OK);
    assert_non_null(f->reg[i]);
    return f->reg[i];
}

static void
fx_reg_close(fx *f, int i)
{
    sw_registry_close(f->reg[i]);
    f->reg[i] = NULL;
}

/* 1 and a copy of the listed entry in *out (if not NULL; free the strings
 * with inst_free) when reg lists id; 0 if not. */
static int
listed(sw_registry *reg, const char *endpoint, const char *id, sw_instance *out)
{
    sw_instance *v = NULL;
    size_t n = 0;
    int found = 0;
    assert_int_equal(sw_registry_list(reg, endpoint, &v, &n), SW_OK);
    for (size_t i = 0; i < n; i++)
        if (strcmp(v[i].instance_id, id) == 0) {
            found = 1;
            if (out != NULL) {
                *out = v[i];
                out->instance_id = strdup(v[i].instance_id);
                out->endpoint = strdup(v[i].endpoint);
                out->request_subject = strdup(v[i].request_subject);
                out->control_subject = strdup(v[i].control_subject);
                out->host = strdup(v[i].host);
            }
        }
    sw_instances_free(v, n);
    return found;
}

static void
inst_free(sw_instance *i)
{
    free((void *)i->instance_id);
    free((void *)i->endpoint);
    free((void *)i->request_subject);
    free((void *)i->control_subject);
    free((void *)i->host);
    memset(i, 0, sizeof(*i));
}

static size_t
list_count(sw_registry *reg, const char *endpoint)
{
    sw_instance *v = NULL;
    size_t n = 0;
    assert_int_equal(sw_registry_list(reg, endpoint, &v, &n), SW_OK);
    sw_instances_free(v, n);
    return n;
}

/* Waits until reg lists id (want = 1) or does not (want = 0). */
static int
wait_listed(sw_registry *reg, const char *id, int want, int64_t timeout_ms)
{
    int64_t until = now_ms() + timeout_ms;
    for (;;) {
        if (listed(reg, NULL, id, NULL) == want)
            return 1;
        if (now_ms() >= until)
            return 0;
        swh_sleep_ms(5);
    }
}

/* Waits until reg lists id with a revision > rev; returns that revision or 0. */
static uint64_t
wait_revision_above(sw_registry *reg, const char *id, uint64_t rev, int64_t timeout_ms)
{
    int64_t until = now_ms() + timeout_ms;
    for (;;) {
        sw_instance in;
        if (listed(reg, NULL, id, &in)) {
            uint64_t r = in.revision;
            inst_free(&in);
            if (r > rev)
                return r;
        }
        if (now_ms() >= until)
            return 0;
        swh_sleep_ms(5);
    }
}

#define EP1 "itreg.llm.generate"
#define EP2 "itreg.llm.embed"

/* ======================================================================== */
/* Registry API                                                              */

/* register -> list shows it, with the fields the ingress reports. */
static void
register_then_list(void **state)
{
    fx *f = *state;
    const sw_registration *ing = fx_worker(f, 0, EP1);
    sw_registry *reg = fx_reg(f, 0, 0, 0);
    sw_instance in;
    int64_t before = unix_ms();

    assert_int_equal(sw_registry_lease_ms(reg), 3000); /* the default */
    {
        /* The registration is copied: a caller's temporary copy of it,
         * scribbled over after the call, changes nothing. */
        char id[SW_MAX_TOKEN + 1], ep[SW_MAX_ENDPOINT + 1];
        char subj[2][SWP_MAX_SUBJECT + 1];
        sw_registration tmp;
        snprintf(id, sizeof(id), "%s", ing->instance_id);
        snprintf(ep, sizeof(ep), "%s", ing->endpoint);
        snprintf(subj[0], sizeof(subj[0]), "%s", ing->request_subject);
        snprintf(subj[1], sizeof(subj[1]), "%s", ing->control_subject);
        tmp.instance_id = id;
        tmp.endpoint = ep;
        tmp.request_subject = subj[0];
        tmp.control_subject = subj[1];
        assert_int_equal(sw_registry_register(reg, &tmp), SW_OK);
        memset(id, 'x', sizeof(id) - 1);
        memset(ep, 'x', sizeof(ep) - 1);
        memset(subj, 'x', sizeof(subj) - 1);
    }
    assert_true(wait_listed(reg, fx_id(f, 0), 1, T(2000)));
    assert_true(listed(reg, EP1, fx_id(f, 0), &in));
    assert_string_equal(in.instance_id, ing->instance_id);
    assert_string_equal(in.endpoint, EP1);
    assert_string_equal(in.endpoint, ing->endpoint);
    assert_string_equal(in.request_subject, ing->request_subject);
    assert_string_equal(in.control_subject, ing->control_subject);
    assert_true(strlen(in.host) > 0);
    assert_int_equal(in.pid, (uint32_t)getpid());
    assert_int_equal(in.lease_ms, 3000);
    assert_true(in.revision > 0);
    assert_int_equal(in.draining, 0);
    assert_true(in.age_ms >= 0 && in.age_ms < 3000);
    assert_true(in.started_unix_ms >= before - 5000 && in.started_unix_ms <= unix_ms() + 5000);
    inst_free(&in);

    /* A second, independent handle on the same bucket sees it too. */
    {
        sw_registry *r2 = fx_reg(f, 1, 0, 0);
        assert_true(wait_listed(r2, fx_id(f, 0), 1, T(2000)));
        assert_true(listed(r2, NULL, fx_id(f, 0), &in));
        assert_string_equal(in.request_subject, ing->request_subject);
        assert_int_equal(in.pid, (uint32_t)getpid());
        inst_free(&in);
    }

    /* Clean exit: deregister removes it everywhere. */
    assert_int_equal(sw_registry_deregister(reg, fx_id(f, 0)), SW_OK);
    assert_true(wait_listed(reg, fx_id(f, 0), 0, T(2000)));
    assert_true(wait_listed(f->reg[1], fx_id(f, 0), 0, T(2000)));
}

/* Watch: ADDED for instances present at watch time and for new ones,
 * UPDATED on set_draining, REMOVED on deregister. */
static void
watch_events(void **state)
{
    fx *f = *state;
    sw_registry *wreg = fx_reg(f, 0, 0, 0);
    sw_registry *rreg = fx_reg(f, 1, 0, 0);
    evlog *l = &f->log[0];
    int id = 0, i;
    sw_instance in;

    fx_worker(f, 0, EP1);
    fx_worker(f, 1, EP1);
    assert_int_equal(sw_registry_register(wreg, &f->rg[0]), SW_OK);
    assert_true(wait_listed(rreg, fx_id(f, 0), 1, T(2000)));

    assert_int_equal(sw_registry_watch(rreg, on_event, l, &id), SW_OK);
    assert_true(id > 0);
    /* Present at watch time. */
    i = evlog_wait(l, SW_REGISTRY_ADDED, fx_id(f, 0), 0, T(2000));
    assert_true(i >= 0);
    assert_string_equal(evlog_get(l, i).endpoint, EP1);
    assert_int_equal(evlog_get(l, i).pid, (uint32_t)getpid());
    /* New. */
    assert_int_equal(sw_registry_register(wreg, &f->rg[1]), SW_OK);
    assert_true(evlog_wait(l, SW_REGISTRY_ADDED, fx_id(f, 1), 0, T(2000)) >= 0);

    /* Draining: UPDATED with draining = 1, still listed, flagged. */
    assert_int_equal(sw_registry_set_draining(wreg, fx_id(f, 1)), SW_OK);
    i = evlog_wait(l, SW_REGISTRY_UPDATED, fx_id(f, 1), 0, T(2000));
    assert_true(i >= 0);
    assert_int_equal(evlog_get(l, i).draining, 1);
    {
        int64_t until = now_ms() + T(2000);
        int d = 0;
        while (!d && now_ms() < until) {
            if (listed(rreg, NULL, fx_id(f, 1), &in)) {
                d = in.draining;
                inst_free(&in);
            }
            if (!d)
                swh_sleep_ms(5);
        }
        assert_int_equal(d, 1);
    }
    assert_int_equal(evlog_count(l, SW_REGISTRY_REMOVED, fx_id(f, 1), 0), 0);

    /* Deregister: REMOVED. */
    assert_int_equal(sw_registry_deregister(wreg, fx_id(f, 0)), SW_OK);
    assert_true(evlog_wait(l, SW_REGISTRY_REMOVED, fx_id(f, 0), 0, T(2000)) >= 0);
    assert_false(listed(rreg, NULL, fx_id(f, 0), NULL));
    assert_true(listed(rreg, NULL, fx_id(f, 1), NULL));
    assert_int_equal(sw_registry_deregister(wreg, fx_id(f, 1)), SW_OK);
    assert_true(evlog_wait(l, SW_REGISTRY_REMOVED, fx_id(f, 1), 0, T(2000)) >= 0);

    /* A second watcher on the same handle gets its own ADDED replay only:
     * nothing is live now, so it gets nothing. */
    {
        int id2 = 0;
        assert_int_equal(sw_registry_watch(rreg, on_event, &f->log[1], &id2), SW_OK);
        assert_true(id2 > 0 && id2 != id);
        swh_sleep_ms(T(200));
        assert_int_equal(evlog_n(&f->log[1]), 0);
    }
    /* Events only ever come in this order per instance: ADDED first. */
    for (int k = 0; k < 2; k++) {
        int a = evlog_wait(l, 0, fx_id(f, k), 0, 0);
        assert_true(a >= 0);
        assert_int_equal(evlog_get(l, a).ev, SW_REGISTRY_ADDED);
    }
    assert_int_equal(l->bad, 0);
    assert_int_equal(sw_registry_watch(rreg, NULL, NULL, NULL), SW_EINVAL);
}

/* Lease: a handle closed without deregistering stops refreshing; every
 * other handle removes the entry once its lease runs out, and a handle
 * opened later does not list it either (nothing deletes it from the
 * store: liveness comes from refresh timestamps). */
static void
lease_expiry(void **state)
{
    fx *f = *state;
    sw_registry *wreg = fx_reg(f, 0, 600, 0); /* refresh 200 */
    sw_registry *rreg = fx_reg(f, 1, 600, 0);
    evlog *l = &f->log[0];
    int64_t t_close, t_removed;
    int i;

    assert_int_equal(sw_registry_lease_ms(wreg), 600);
    fx_worker(f, 0, EP1);
    assert_int_equal(sw_registry_register(wreg, &f->rg[0]), SW_OK);
    assert_int_equal(sw_registry_watch(rreg, on_event, l, NULL), SW_OK);
    assert_true(evlog_wait(l, SW_REGISTRY_ADDED, fx_id(f, 0), 0, T(2000)) >= 0);

    /* While refreshed, it stays: three leases long, no REMOVED. */
    swh_sleep_ms(1800);
    assert_int_equal(evlog_count(l, SW_REGISTRY_REMOVED, fx_id(f, 0), 0), 0);
    assert_true(listed(rreg, NULL, fx_id(f, 0), NULL));

    /* Close without deregistering: no more refreshes. */
    fx_reg_close(f, 0);
    t_close = now_ms();
    i = evlog_wait(l, SW_REGISTRY_REMOVED, fx_id(f, 0), 0, T(600 + 1500));
    assert_true(i >= 0);
    t_removed = evlog_get(l, i).t;
    print_message("    lease 600 ms: removed %lld ms after the writer closed\n",
                  (long long)(t_removed - t_close));
    /* Not at once: the entry is judged by its last refresh (<= 200 ms
     * before close, give or take a late keep-alive), not deleted. */
    assert_true(t_removed - t_close >= 200);
    assert_false(listed(rreg, NULL, fx_id(f, 0), NULL));
    /* And it stays removed. */
    swh_sleep_ms(T(300));
    assert_false(listed(rreg, NULL, fx_id(f, 0), NULL));
    assert_int_equal(evlog_count(l, SW_REGISTRY_ADDED, fx_id(f, 0), 0), 1);

    /* A handle opened now finds the stale entry in the store. It judges it
     * by its own clock only (issue 11 #3: no clock agreement with the store
     * or the worker), so the first sight counts as a refresh seen now: live
     * for at most one lease after the handle opened, then REMOVED for good.
     * (Before, it compared the store's timestamp with its own clock and did
     * not count the entry live at all.) */
    {
        int64_t t_open = now_ms();
        sw_registry *late = fx_reg(f, 2, 600, 0);
        int a, r;
        assert_int_equal(sw_registry_watch(late, on_event, &f->log[1], NULL), SW_OK);
        assert_true(wait_listed(late, fx_id(f, 0), 0, T(600 + 1500)));
        assert_true(now_ms() - t_open >= 400);
        a = evlog_wait(&f->log[1], SW_REGISTRY_ADDED, fx_id(f, 0), 0, 0);
        r = evlog_wait(&f->log[1], SW_REGISTRY_REMOVED, fx_id(f, 0), 0, T(1000));
        assert_true(a < 0 || r > a); /* if reported live, then removed */
        swh_sleep_ms(T(300));
        assert_false(listed(late, NULL, fx_id(f, 0), NULL));
        assert_true(evlog_count(&f->log[1], SW_REGISTRY_ADDED, fx_id(f, 0), 0) <= 1);
    }
}

/* The lease a router applies is the entry's own (InstanceInfo.lease_ms, the
 * worker's), not the router handle's: a router whose handle has a shorter
 * lease must not see a healthy worker flap between REMOVED and ADDED. */
static void
lease_is_the_entrys_own(void **state)
{
    fx *f = *state;
    sw_registry *wreg = fx_reg(f, 0, 1500, 500);
    sw_registry *rreg = fx_reg(f, 1, 300, 0);
    evlog *l = &f->log[0];
    sw_instance in;

    fx_worker(f, 0, EP1);
    assert_int_equal(sw_registry_register(wreg, &f->rg[0]), SW_OK);
    assert_int_equal(sw_registry_watch(rreg, on_event, l, NULL), SW_OK);
    assert_true(evlog_wait(l, SW_REGISTRY_ADDED, fx_id(f, 0), 0, T(2000)) >= 0);
    assert_true(listed(rreg, NULL, fx_id(f, 0), &in));
    assert_int_equal(in.lease_ms, 1500);
    inst_free(&in);
    /* Refreshed every 500 ms, well within its 1500 ms lease, for 2 s. */
    for (int k = 0; k < 40; k++) {
        swh_sleep_ms(50);
        if (!listed(rreg, NULL, fx_id(f, 0), NULL))
            fail_msg("a worker refreshing every 500 ms within its 1500 ms lease vanished from a "
                     "router whose own lease is 300 ms (after %d ms)",
                     (k + 1) * 50);
    }
    assert_int_equal(evlog_count(l, SW_REGISTRY_REMOVED, fx_id(f, 0), 0), 0);
}

/* report_dead: the revision guard, the tombstone, and the live worker
 * registering again by itself. */
static void
report_dead_guard_and_reregister(void **state)
{
    fx *f = *state;
    sw_registry *wreg = fx_reg(f, 0, 1500, 150);
    sw_registry *rreg = fx_reg(f, 1, 1500, 0);
    evlog *l = &f->log[0];
    uint64_t rev0, rev1, tomb_rev;
    int i_rm, i_add;
    int64_t t_report;

    fx_worker(f, 0, EP1);
    assert_int_equal(sw_registry_register(wreg, &f->rg[0]), SW_OK);
    assert_int_equal(sw_registry_watch(rreg, on_event, l, NULL), SW_OK);
    assert_true(evlog_wait(l, SW_REGISTRY_ADDED, fx_id(f, 0), 0, T(2000)) >= 0);

    /* Unknown id. */
    assert_int_equal(sw_registry_report_dead(rreg, "nosuch", 0, "test"), SW_ENOTFOUND);
    assert_int_equal(sw_registry_report_dead(rreg, "a.b", 0, "test"), SW_EINVAL);

    /* A stale revision: the worker refreshed since; the report is refused. */
    rev0 = wait_revision_above(rreg, fx_id(f, 0), 0, T(2000));
    assert_true(rev0 > 0);
    rev1 = wait_revision_above(rreg, fx_id(f, 0), rev0, T(3000));
    assert_true(rev1 > rev0);
    assert_int_equal(sw_registry_report_dead(rreg, fx_id(f, 0), rev0, "stale view"), SW_EBUSY);
    swh_sleep_ms(T(200));
    assert_true(listed(rreg, NULL, fx_id(f, 0), NULL));
    assert_true(listed(wreg, NULL, fx_id(f, 0), NULL));
    assert_int_equal(evlog_count(l, SW_REGISTRY_REMOVED, fx_id(f, 0), 0), 0);

    /* Revision 0 (the current one): the tombstone is written; REMOVED; then
     * the live worker finds itself removed and registers again: ADDED with a
     * newer revision, listed again. */
    /* (registry.h calls revision 0 "unguarded", but the core guards it
     * with the newest revision its view has seen: a keep-alive landing in
     * between makes it SW_EBUSY. That is the safe reading -- the worker
     * refreshed, it is alive -- so retry like a reporter would.) */
    {
        sw_err rv = SW_EBUSY;
        int busy = 0;
        /* Pausing between tries: the view catches up with the store when
         * the refresh's watch event has been applied, which on a loaded
         * machine (ASan, CI) can take several milliseconds. */
        for (int tries = 0; tries < 50 && rv == SW_EBUSY; tries++) {
            if (tries > 0)
                swh_sleep_ms(10);
            t_report = now_ms();
            rv = sw_registry_report_dead(rreg, fx_id(f, 0), 0, "test says dead");
            busy += rv == SW_EBUSY;
        }
        assert_int_equal(rv, SW_OK);
        if (busy > 0)
            print_message("    report_dead(revision 0) was SW_EBUSY %d time(s) first\n", busy);
    }
    i_rm = evlog_wait(l, SW_REGISTRY_REMOVED, fx_id(f, 0), 0, T(2000));
    assert_true(i_rm >= 0);
    tomb_rev = evlog_get(l, i_rm).rev;
    i_add = evlog_wait(l, SW_REGISTRY_ADDED, fx_id(f, 0), i_rm + 1, T(150 + 2000));
    assert_true(i_add > i_rm);
    assert_true(evlog_get(l, i_add).rev > rev1);
    print_message("    re-registered %lld ms after the report\n",
                  (long long)(evlog_get(l, i_add).t - t_report));
    assert_true(wait_listed(rreg, fx_id(f, 0), 1, T(2000)));
    (void)tomb_rev;

    /* And it keeps refreshing from there on (its guard revision was reset):
     * no further flapping. */
    {
        int n_rm = evlog_count(l, SW_REGISTRY_REMOVED, fx_id(f, 0), 0);
        uint64_t r = wait_revision_above(rreg, fx_id(f, 0), evlog_get(l, i_add).rev, T(2000));
        assert_true(r > 0);
        swh_sleep_ms(T(500));
        assert_int_equal(evlog_count(l, SW_REGISTRY_REMOVED, fx_id(f, 0), 0), n_rm);
        assert_true(listed(rreg, NULL, fx_id(f, 0), NULL));
    }

    /* With the current revision, explicitly: also accepted; again it comes
     * back. */
    {
        sw_instance in;
        int from = evlog_n(l);
        uint64_t cur;
        int rv = SW_EBUSY;
        /* The worker refreshes every 150 ms: retry on the (legitimate)
         * SW_EBUSY race with a refresh. */
        for (int tries = 0; tries < 50 && rv == SW_EBUSY; tries++) {
            if (tries > 0)
                swh_sleep_ms(10); /* let the view apply the refresh (above) */
            assert_true(listed(rreg, NULL, fx_id(f, 0), &in));
            cur = in.revision;
            inst_free(&in);
            rv = sw_registry_report_dead(rreg, fx_id(f, 0), cur, "current revision");
        }
        assert_int_equal(rv, SW_OK);
        i_rm = evlog_wait(l, SW_REGISTRY_REMOVED, fx_id(f, 0), from, T(2000));
        assert_true(i_rm >= 0);
        assert_true(evlog_wait(l, SW_REGISTRY_ADDED, fx_id(f, 0), i_rm + 1, T(2000)) > i_rm);
    }
}

/* report_dead of an instance whose worker is really gone (its handle closed,
 * no refresh): REMOVED, not listed, and it does not come back. Both with
 * revision 0 and with the current revision. */
static void
report_dead_of_gone_worker(void **state)
{
    fx *f = *state;
    sw_registry *rreg = fx_reg(f, 1, 3000, 0);
    evlog *l = &f->log[0];
    assert_int_equal(sw_registry_watch(rreg, on_event, l, NULL), SW_OK);

    for (int k = 0; k < 2; k++) {
        sw_registry *wreg = fx_reg(f, 0, 3000, 0);
        sw_instance in;
        int i;
        uint64_t rev;
        fx_worker(f, k, EP1);
        assert_int_equal(sw_registry_register(wreg, &f->rg[k]), SW_OK);
        assert_true(evlog_wait(l, SW_REGISTRY_ADDED, fx_id(f, k), 0, T(2000)) >= 0);
        assert_true(wait_listed(rreg, fx_id(f, k), 1, T(2000)));
        assert_true(listed(rreg, NULL, fx_id(f, k), &in));
        rev = in.revision;
        inst_free(&in);
        fx_reg_close(f, 0); /* the "process" is gone, without deregistering */
        assert_int_equal(sw_registry_report_dead(rreg, fx_id(f, k), k == 0 ? 0 : rev, "gone"),
                         SW_OK);
        i = evlog_wait(l, SW_REGISTRY_REMOVED, fx_id(f, k), 0, T(2000));
        assert_true(i >= 0);
        assert_true(wait_listed(rreg, fx_id(f, k), 0, T(1000)));
        /* Reporting again is harmless: SW_OK, nothing written (the view
         * holds the tombstone), nothing counted as sent. */
        {
            sw_registry_stats st0, st1;
            sw_registry_stats_get(rreg, &st0);
            assert_int_equal(sw_registry_report_dead(rreg, fx_id(f, k), 0, "again"), SW_OK);
            sw_registry_stats_get(rreg, &st1);
            assert_int_equal(st1.dead_reports_sent, st0.dead_reports_sent);
            assert_int_equal(st1.dead_reports_refused, st0.dead_reports_refused);
        }
        swh_sleep_ms(T(300));
        assert_false(listed(rreg, NULL, fx_id(f, k), NULL));
        assert_int_equal(evlog_count(l, SW_REGISTRY_ADDED, fx_id(f, k), 0), 1);
        /* A handle opened later does not list a tombstone either. */
        {
            sw_registry *late = fx_reg(f, 2, 3000, 0);
            swh_sleep_ms(T(100));
            assert_false(listed(late, NULL, fx_id(f, k), NULL));
            fx_reg_close(f, 2);
        }
    }
}

/* A live worker whose entry someone deletes outright registers again. */
static void
deleted_entry_reregisters(void **state)
{
    fx *f = *state;
    sw_registry *wreg = fx_reg(f, 0, 1500, 0);
    sw_registry *rreg = fx_reg(f, 1, 1500, 0);
    const sw_registry_backend *be = sw_registry_backend_find(f->be);
    evlog *l = &f->log[0];
    char key[256];
    int i;

    fx_worker(f, 0, EP1);
    assert_int_equal(sw_registry_register(wreg, &f->rg[0]), SW_OK);
    assert_int_equal(sw_registry_watch(rreg, on_event, l, NULL), SW_OK);
    assert_true(evlog_wait(l, SW_REGISTRY_ADDED, fx_id(f, 0), 0, T(2000)) >= 0);
    assert_non_null(be);
    f->raw_be[0] = be;
    assert_int_equal(be->open(&f->raw_state[0], f->conn, f->bucket, 60000), SW_OK);
    snprintf(key, sizeof(key), "%s.%s", EP1, fx_id(f, 0));
    assert_int_equal(be->del(f->raw_state[0], key), SW_OK);
    i = evlog_wait(l, SW_REGISTRY_REMOVED, fx_id(f, 0), 0, T(2000));
    assert_true(i >= 0);
    assert_true(evlog_wait(l, SW_REGISTRY_ADDED, fx_id(f, 0), i + 1, T(2000)) > i);
    assert_true(wait_listed(rreg, fx_id(f, 0), 1, T(2000)));
}

/* Error codes of the registry API. */
static void
api_errors(void **state)
{
    fx *f = *state;
    sw_registry *reg = fx_reg(f, 0, 0, 0);
    sw_instance *v = NULL;
    size_t n = 0;

    fx_worker(f, 0, EP1);
    assert_int_equal(sw_registry_register(reg, &f->rg[0]), SW_OK);
    assert_int_equal(sw_registry_register(reg, &f->rg[0]), SW_EEXIST);
    {
        /* the same instance id on another endpoint: deregister,
         * set_draining and report_dead name the id alone, and reached one
         * of the two (the other stayed listed after a deregister that
         * returned SW_OK) */
        sw_registration other = f->rg[0];
        other.endpoint = EP2;
        assert_int_equal(sw_registry_register(reg, &other), SW_EEXIST);
    }
    assert_int_equal(sw_registry_deregister(reg, "nosuch"), SW_ENOTFOUND);
    assert_int_equal(sw_registry_set_draining(reg, "nosuch"), SW_ENOTFOUND);
    assert_int_equal(sw_registry_report_dead(reg, "nosuch", 0, NULL), SW_ENOTFOUND);
    assert_int_equal(sw_registry_register(NULL, &f->rg[0]), SW_EINVAL);
    assert_int_equal(sw_registry_register(reg, NULL), SW_EINVAL);
    /* Every field of the registration is validated. */
    {
        char long_subj[SWP_MAX_SUBJECT + 16];
        static const char *const bad_ids[] = {NULL, "", "a.b", "a b", "a*", ">"};
        static const char *const bad_eps[] = {NULL, "", "a.b", "a.b.c.d", "a..c", "a.*.c", "a.b.>"};
        const char *const bad_subjs[] = {NULL,  "",    "a..b", ".a",     "a.",
                                         "a.*", "a.>", "a b",  long_subj};
        const sw_registration good = f->rg[0];
        sw_registration b;
        memset(long_subj, 'x', sizeof(long_subj) - 1); /* one token, too long */
        long_subj[sizeof(long_subj) - 1] = '\0';
        assert_true(strlen(long_subj) >= SWP_MAX_SUBJECT);
        for (size_t k = 0; k < sizeof(bad_ids) / sizeof(bad_ids[0]); k++) {
            b = good;
            b.instance_id = bad_ids[k];
            if (sw_registry_register(reg, &b) != SW_EINVAL)
                fail_msg("instance id \"%s\" was accepted", bad_ids[k] ? bad_ids[k] : "(null)");
        }
        for (size_t k = 0; k < sizeof(bad_eps) / sizeof(bad_eps[0]); k++) {
            b = good;
            b.endpoint = bad_eps[k];
            if (sw_registry_register(reg, &b) != SW_EINVAL)
                fail_msg("endpoint \"%s\" was accepted", bad_eps[k] ? bad_eps[k] : "(null)");
        }
        for (size_t k = 0; k < sizeof(bad_subjs) / sizeof(bad_subjs[0]); k++) {
            b = good;
            b.request_subject = bad_subjs[k];
            if (sw_registry_register(reg, &b) != SW_EINVAL)
                fail_msg("request subject \"%s\" was accepted",
                         bad_subjs[k] ? bad_subjs[k] : "(null)");
            b = good;
            b.control_subject = bad_subjs[k];
            if (sw_registry_register(reg, &b) != SW_EINVAL)
                fail_msg("control subject \"%s\" was accepted",
                         bad_subjs[k] ? bad_subjs[k] : "(null)");
        }
        /* None of them reached the store. */
        assert_true(wait_listed(reg, fx_id(f, 0), 1, T(2000)));
        assert_int_equal(list_count(reg, NULL), 1);
    }
    assert_int_equal(sw_registry_deregister(reg, NULL), SW_EINVAL);
    assert_int_equal(sw_registry_list(NULL, NULL, &v, &n), SW_EINVAL);
    assert_int_equal(sw_registry_list(reg, NULL, NULL, &n), SW_EINVAL);
    assert_int_equal(sw_registry_deregister(reg, fx_id(f, 0)), SW_OK);
    assert_int_equal(sw_registry_deregister(reg, fx_id(f, 0)), SW_ENOTFOUND);
    /* After deregistering, registering again is allowed. */
    assert_int_equal(sw_registry_register(reg, &f->rg[0]), SW_OK);
    assert_true(wait_listed(reg, fx_id(f, 0), 1, T(2000)));
    assert_int_equal(sw_registry_deregister(reg, fx_id(f, 0)), SW_OK);
    /* NULL-tolerant calls. */
    sw_registry_close(NULL);
    sw_instances_free(NULL, 0);
    sw_registry_unwatch(NULL, 1);
    sw_registry_unwatch(reg, 12345); /* unknown id: no-op */
    assert_int_equal(sw_registry_lease_ms(NULL), 0);
}

/* list(endpoint) filters. */
static void
list_filters_by_endpoint(void **state)
{
    fx *f = *state;
    sw_registry *reg = fx_reg(f, 0, 0, 0);

    fx_worker(f, 0, EP1);
    fx_worker(f, 1, EP2);
    fx_worker(f, 2, EP1);
    for (int i = 0; i < 3; i++)
        assert_int_equal(sw_registry_register(reg, &f->rg[i]), SW_OK);
    for (int i = 0; i < 3; i++)
        assert_true(wait_listed(reg, fx_id(f, i), 1, T(2000)));
    assert_int_equal(list_count(reg, NULL), 3);
    assert_int_equal(list_count(reg, EP1), 2);
    assert_int_equal(list_count(reg, EP2), 1);
    assert_int_equal(list_count(reg, "itreg.llm.nothing"), 0);
    assert_true(listed(reg, EP1, fx_id(f, 0), NULL));
    assert_true(listed(reg, EP1, fx_id(f, 2), NULL));
    assert_false(listed(reg, EP1, fx_id(f, 1), NULL));
    assert_true(listed(reg, EP2, fx_id(f, 1), NULL));
    assert_false(listed(reg, EP2, fx_id(f, 0), NULL));
}

/* sw_registry_open's argument checks. */
static void
open_invalid(void **state)
{
    fx *f = *state;
    static const char *const bad_buckets[] = {"a.b", "", "x y", "a*", "a>", "a/b"};
    sw_registry_opts o;
    sw_registry *reg = (sw_registry *)0x1;
    sw_conn *conn = strcmp(f->be, "memory") == 0 ? NULL : f->conn;

    sw_registry_opts_init(&o);
    assert_string_equal(o.backend, "nats-kv");
    assert_string_equal(o.bucket, "streamwire_instances");
    assert_int_equal(o.lease_ms, 3000);

    o.backend = "no-such-backend";
    o.bucket = f->bucket;
    assert_int_equal(sw_registry_open(&reg, f->conn, &o), SW_EINVAL);
    assert_null(reg);
    assert_null(sw_registry_backend_find("no-such-backend"));
    assert_true(sw_registry_backend_find("memory") == sw_registry_backend_memory());
    assert_true(sw_registry_backend_find("nats-kv") == sw_registry_backend_nats_kv());
    assert_string_equal(sw_registry_backend_find(f->be)->name, f->be);
    assert_int_equal(sw_registry_backend_find(f->be)->version, SW_REGISTRY_BACKEND_VERSION);

    o.backend = f->be;
    for (size_t i = 0; i < sizeof(bad_buckets) / sizeof(bad_buckets[0]); i++) {
        reg = (sw_registry *)0x1;
        o.bucket = bad_buckets[i];
        if (sw_registry_open(&reg, conn, &o) != SW_EINVAL)
            fail_msg("bucket \"%s\" was accepted", bad_buckets[i]);
        assert_null(reg);
    }
    o.bucket = f->bucket;
    assert_int_equal(sw_registry_open(NULL, conn, &o), SW_EINVAL);
    assert_int_equal(sw_registry_open(&reg, conn, NULL), SW_EINVAL);

    /* A backend table of the wrong version, or with a missing entry. */
    {
        sw_registry_backend t = *sw_registry_backend_find(f->be);
        o.backend = "no-such-backend"; /* backend_ops overrides the name */
        o.backend_ops = &t;
        t.version = SW_REGISTRY_BACKEND_VERSION + 1;
        assert_int_equal(sw_registry_open(&reg, conn, &o), SW_EINVAL);
        t.version = 0;
        assert_int_equal(sw_registry_open(&reg, conn, &o), SW_EINVAL);
        for (int k = 0; k < 8; k++) {
            t = *sw_registry_backend_find(f->be);
            switch (k) {
            case 0:
                t.open = NULL;
                break;
            case 1:
                t.close = NULL;
                break;
            case 2:
                t.put = NULL;
                break;
            case 3:
                t.del = NULL;
                break;
            case 4:
                t.list = NULL;
                break;
            case 5:
                t.watch = NULL;
                break;
            case 6:
                t.unwatch = NULL;
                break;
            default:
                t.name = NULL;
                break;
            }
            reg = (sw_registry *)0x1;
            if (sw_registry_open(&reg, conn, &o) != SW_EINVAL)
                fail_msg("a backend table missing entry %d was accepted", k);
            assert_null(reg);
        }
        /* The same table, complete: accepted, via backend_ops (closed
         * here: the table must outlive the handle). */
        t = *sw_registry_backend_find(f->be);
        assert_int_equal(sw_registry_open(&reg, conn, &o), SW_OK);
        assert_non_null(reg);
        sw_registry_close(reg);
    }
    if (strcmp(f->be, "nats-kv") == 0) {
        /* The KV backend needs a connection. */
        o.backend_ops = NULL;
        o.backend = f->be;
        reg = (sw_registry *)0x1;
        assert_int_not_equal(sw_registry_open(&reg, NULL, &o), SW_OK);
        assert_null(reg);
    }
}

/* Two handles opening the same, not yet existing bucket at once (the KV
 * backend creates it: one of them loses the creation race). */
typedef struct open_arg {
    fx *f;
    sw_registry *reg;
    sw_err rv;
} open_arg;

static void *
open_thread(void *p)
{
    open_arg *a = p;
    sw_registry_opts o;
    sw_registry_opts_init(&o);
    o.backend = a->f->be;
    o.bucket = a->f->bucket;
    a->rv = sw_registry_open(&a->reg, a->f->conn, &o);
    return NULL;
}

static void
open_same_new_bucket_concurrently(void **state)
{
    fx *f = *state;
    open_arg a[4];
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
        a[i].f = f;
        a[i].reg = NULL;
        a[i].rv = SW_EINTERNAL;
        assert_int_equal(pthread_create(&t[i], NULL, open_thread, &a[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        f->reg[i] = a[i].reg;
    }
    for (int i = 0; i < 4; i++)
        if (a[i].rv != SW_OK)
            fail_msg("concurrent open %d of a new bucket failed: %s", i, sw_err_name(a[i].rv));
    /* They share it. */
    fx_worker(f, 0, EP1);
    assert_int_equal(sw_registry_register(f->reg[0], &f->rg[0]), SW_OK);
    for (int i = 0; i < 4; i++)
        assert_true(wait_listed(f->reg[i], fx_id(f, 0), 1, T(2000)));
}

/* Garbage written straight into the bucket is ignored, before and after a
 * handle opens, and does not disturb real entries. */
static void
garbage_entries_ignored(void **state)
{
    fx *f = *state;
    const sw_registry_backend *be = sw_registry_backend_find(f->be);
    void *st = NULL;
    static const uint8_t junk[] = {0xff, 0x00, 0x13, 0x37, 0xde, 0xad, 0xbe, 0xef, 0x0a, 0x81};
    uint64_t rev = 0;
    sw_registry *reg;
    evlog *l = &f->log[0];
    uint8_t *enc = NULL;
    size_t enc_len = 0;

    assert_non_null(be);
    f->raw_be[0] = be;
    assert_int_equal(be->open(&f->raw_state[0], f->conn, f->bucket, 60000), SW_OK);
    st = f->raw_state[0];
    /* Before the handle opens (seen by its initial list). */
    assert_int_equal(be->put(st, EP1 ".junk1", junk, sizeof(junk), 0, &rev), SW_OK);
    assert_int_equal(be->put(st, EP1 ".empty", (const uint8_t *)"", 0, 0, &rev), SW_OK);
    reg = fx_reg(f, 0, 0, 0);
    assert_int_equal(sw_registry_watch(reg, on_event, l, NULL), SW_OK);

    /* After (seen through its watch): junk, text, and a well-formed
     * InstanceInfo of another protocol version and one with an invalid id. */
    assert_int_equal(be->put(st, EP1 ".junk2", junk, sizeof(junk), 0, &rev), SW_OK);
    assert_int_equal(be->put(st, EP1 ".text", (const uint8_t *)"{\"instance\":\"x\"}", 16, 0, &rev),
                     SW_OK);
    {
        swp_instance m = STREAMWIRE__V1__INSTANCE_INFO__INIT;
        m.version = SW_PROTOCOL_VERSION + 1;
        m.instance_id = "future";
        m.endpoint = EP1;
        m.request_subject = "sw.req.x";
        m.control_subject = "sw.ctl.x";
        m.lease_ms = 3000;
        assert_int_equal(swp_encode_alloc(&m, 65536, &enc, &enc_len), SW_OK);
        assert_int_equal(be->put(st, EP1 ".future", enc, enc_len, 0, &rev), SW_OK);
        free(enc);
        m.version = SW_PROTOCOL_VERSION;
        m.instance_id = "bad id with spaces";
        assert_int_equal(swp_encode_alloc(&m, 65536, &enc, &enc_len), SW_OK);
        assert_int_equal(be->put(st, EP1 ".badid", enc, enc_len, 0, &rev), SW_OK);
        free(enc);
    }

    /* A real one still works. */
    fx_worker(f, 0, EP1);
    assert_int_equal(sw_registry_register(reg, &f->rg[0]), SW_OK);
    assert_true(evlog_wait(l, SW_REGISTRY_ADDED, fx_id(f, 0), 0, T(2000)) >= 0);
    assert_true(wait_listed(reg, fx_id(f, 0), 1, T(2000)));
    swh_sleep_ms(T(100));
    assert_int_equal(list_count(reg, NULL), 1);
    assert_int_equal(evlog_count(l, 0, NULL, 0), 1); /* only that ADDED */
    /* A later handle (initial list path) agrees. */
    {
        sw_registry *r2 = fx_reg(f, 1, 0, 0);
        assert_true(wait_listed(r2, fx_id(f, 0), 1, T(2000)));
        assert_int_equal(list_count(r2, NULL), 1);
    }
    /* Garbage over the real entry's key: ignored by the readers, and the
     * live worker's next refresh puts it right. */
    {
        char key[256];
        int from = evlog_n(l);
        snprintf(key, sizeof(key), "%s.%s", EP1, fx_id(f, 0));
        assert_int_equal(be->put(st, key, junk, sizeof(junk), 0, &rev), SW_OK);
        assert_true(wait_revision_above(f->reg[1], fx_id(f, 0), rev, T(3000 + 2000)) > rev);
        assert_int_equal(evlog_count(l, SW_REGISTRY_REMOVED, fx_id(f, 0), from), 0);
    }
    assert_int_equal(sw_registry_deregister(reg, fx_id(f, 0)), SW_OK);
    assert_true(wait_listed(reg, fx_id(f, 0), 0, T(2000)));
    assert_int_equal(l->bad, 0);
}

/* unwatch: when it returns, the callback is not running and is never called
 * again -- also when it is called while a callback runs. */
static void
unwatch_stops_callbacks(void **state)
{
    fx *f = *state;
    sw_registry *wreg = fx_reg(f, 0, 0, 0);
    sw_registry *rreg = fx_reg(f, 1, 0, 0);
    evlog *l0 = &f->log[0], *l1 = &f->log[1];
    int id0 = 0, id1 = 0, calls;

    fx_worker(f, 0, EP1);
    fx_worker(f, 1, EP1);
    fx_worker(f, 2, EP1);
    assert_int_equal(sw_registry_watch(rreg, on_event, l0, &id0), SW_OK);
    assert_int_equal(sw_registry_watch(rreg, on_event, l1, &id1), SW_OK);
    assert_int_equal(sw_registry_register(wreg, &f->rg[0]), SW_OK);
    assert_true(evlog_wait(l0, SW_REGISTRY_ADDED, fx_id(f, 0), 0, T(2000)) >= 0);
    assert_true(evlog_wait(l1, SW_REGISTRY_ADDED, fx_id(f, 0), 0, T(2000)) >= 0);

    /* Quiet unwatch. */
    sw_registry_unwatch(rreg, id0);
    calls = l0->calls;
    assert_int_equal(sw_registry_register(wreg, &f->rg[1]), SW_OK);
    assert_true(evlog_wait(l1, SW_REGISTRY_ADDED, fx_id(f, 1), 0, T(2000)) >= 0);
    assert_int_equal(sw_registry_deregister(wreg, fx_id(f, 1)), SW_OK);
    assert_true(evlog_wait(l1, SW_REGISTRY_REMOVED, fx_id(f, 1), 0, T(2000)) >= 0);
    swh_sleep_ms(T(200));
    pthread_mutex_lock(&l0->mu);
    assert_int_equal(l0->calls, calls);
    pthread_mutex_unlock(&l0->mu);

    /* Unwatch while its callback is running (it sleeps 300 ms). */
    pthread_mutex_lock(&l1->mu);
    l1->cb_sleep_ms = 300;
    calls = l1->calls;
    pthread_mutex_unlock(&l1->mu);
    assert_int_equal(sw_registry_register(wreg, &f->rg[2]), SW_OK);
    {
        int64_t until = now_ms() + T(2000);
        pthread_mutex_lock(&l1->mu);
        while (l1->in_cb == 0 && l1->calls == calls && now_ms() < until)
            cond_wait_until(&l1->cv, &l1->mu, until);
        assert_true(l1->calls > calls);
        pthread_mutex_unlock(&l1->mu);
    }
    sw_registry_unwatch(rreg, id1);
    pthread_mutex_lock(&l1->mu);
    assert_int_equal(l1->in_cb, 0); /* it returned before unwatch did */
    calls = l1->calls;
    pthread_mutex_unlock(&l1->mu);
    assert_int_equal(sw_registry_deregister(wreg, fx_id(f, 2)), SW_OK);
    assert_int_equal(sw_registry_deregister(wreg, fx_id(f, 0)), SW_OK);
    assert_true(wait_listed(rreg, fx_id(f, 0), 0, T(2000)));
    swh_sleep_ms(T(200));
    pthread_mutex_lock(&l1->mu);
    assert_int_equal(l1->calls, calls);
    assert_int_equal(l1->bad, 0);
    pthread_mutex_unlock(&l1->mu);
}

/* ======================================================================== */
/* Raw backend conformance                                                   */

typedef struct raw_ev {
    char key[128];
    char val[64];
    size_t len;
    uint64_t rev;
    int deleted;
} raw_ev;

typedef struct raw_log {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    raw_ev v[256];
    int n;
} raw_log;

static void
raw_on_entry(void *arg, const sw_registry_entry *e, int deleted)
{
    raw_log *l = arg;
    pthread_mutex_lock(&l->mu);
    if (l->n < 256) {
        raw_ev *r = &l->v[l->n++];
        snprintf(r->key, sizeof(r->key), "%s", e->key);
        r->len = e->len;
        if (!deleted && e->value != NULL)
            memcpy(r->val, e->value, e->len < sizeof(r->val) - 1 ? e->len : sizeof(r->val) - 1);
        r->rev = e->revision;
        r->deleted = deleted;
    }
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

/* Waits for the first event on key (with deleted == del, -1 any) at or
 * after index from whose revision is > min_rev; its index or -1. */
static int
raw_wait(raw_log *l, const char *key, int del, uint64_t min_rev, int from, int64_t timeout_ms)
{
    int64_t until = now_ms() + timeout_ms;
    int found = -1;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        for (int i = from; i < l->n && found < 0; i++)
            if (strcmp(l->v[i].key, key) == 0 && (del < 0 || l->v[i].deleted == del) &&
                l->v[i].rev > min_rev)
                found = i;
        if (found >= 0 || now_ms() >= until)
            break;
        cond_wait_until(&l->cv, &l->mu, until);
    }
    pthread_mutex_unlock(&l->mu);
    return found;
}

typedef struct list_acc {
    int n;
    char keys[16][128];
    char vals[16][64];
    uint64_t revs[16];
    int64_t created[16];
    int deleted_seen;
} list_acc;

static void
list_cb(void *arg, const sw_registry_entry *e, int deleted)
{
    list_acc *a = arg;
    if (deleted) {
        a->deleted_seen++;
        return;
    }
    if (a->n < 16) {
        snprintf(a->keys[a->n], sizeof(a->keys[0]), "%s", e->key);
        memset(a->vals[a->n], 0, sizeof(a->vals[0]));
        memcpy(a->vals[a->n], e->value, e->len < 63 ? e->len : 63);
        a->revs[a->n] = e->revision;
        a->created[a->n] = e->created_unix_ms;
    }
    a->n++;
}

static int
acc_find(const list_acc *a, const char *key)
{
    for (int i = 0; i < a->n && i < 16; i++)
        if (strcmp(a->keys[i], key) == 0)
            return i;
    return -1;
}

static void
raw_backend_ops(void **state)
{
    fx *f = *state;
    const sw_registry_backend *be = sw_registry_backend_find(f->be);
    void *st, *st2;
    uint64_t r1 = 0, r2 = 0, r3 = 0, r = 0;
    list_acc a;
    raw_log lg;
    int i, j;

    assert_non_null(be);
    f->raw_be[0] = f->raw_be[1] = be;
    assert_int_equal(be->open(&f->raw_state[0], f->conn, f->bucket, 60000), SW_OK);
    assert_int_equal(be->open(&f->raw_state[1], f->conn, f->bucket, 60000), SW_OK);
    st = f->raw_state[0];
    st2 = f->raw_state[1];

    /* put: create, overwrite; revisions grow. */
    assert_int_equal(be->put(st, "k.one", (const uint8_t *)"v1", 2, 0, &r1), SW_OK);
    assert_true(r1 > 0);
    assert_int_equal(be->put(st, "k.one", (const uint8_t *)"v2", 2, 0, &r2), SW_OK);
    assert_true(r2 > r1);
    /* put with expect_rev: mismatch -> EBUSY and nothing written. */
    r = 777;
    assert_int_equal(be->put(st, "k.one", (const uint8_t *)"vX", 2, r1, &r), SW_EBUSY);
    /* ... match -> written. */
    assert_int_equal(be->put(st, "k.one", (const uint8_t *)"v3", 2, r2, &r3), SW_OK);
    assert_true(r3 > r2);
    /* ... on a missing key -> ENOTFOUND. */
    assert_int_equal(be->put(st, "k.missing", (const uint8_t *)"v", 1, r3, &r), SW_ENOTFOUND);
    /* rev may be NULL. */
    assert_int_equal(be->put(st, "k.two", (const uint8_t *)"w1", 2, 0, NULL), SW_OK);

    /* list: the current entries, with their latest values and revisions,
     * seen from the other state (same bucket) too. */
    for (int k = 0; k < 2; k++) {
        memset(&a, 0, sizeof(a));
        assert_int_equal(be->list(k == 0 ? st : st2, list_cb, &a), SW_OK);
        assert_int_equal(a.n, 2);
        i = acc_find(&a, "k.one");
        assert_true(i >= 0);
        assert_string_equal(a.vals[i], "v3");
        assert_int_equal(a.revs[i], r3);
        assert_true(a.created[i] == 0 ||
                    (a.created[i] > unix_ms() - 60000 && a.created[i] < unix_ms() + 60000));
        j = acc_find(&a, "k.two");
        assert_true(j >= 0);
        assert_string_equal(a.vals[j], "w1");
        assert_true(a.revs[j] > r3);
        assert_int_equal(acc_find(&a, "k.missing"), -1);
    }

    /* watch: later puts and deletes, from either state, in revision order. */
    memset(&lg, 0, sizeof(lg));
    pthread_mutex_init(&lg.mu, NULL);
    cond_init_mono(&lg.cv);
    assert_int_equal(be->watch(st2, raw_on_entry, &lg, &f->raw_watch[1]), SW_OK);
    assert_non_null(f->raw_watch[1]);
    {
        uint64_t p1 = 0, p2 = 0;
        int a1, a2, d1, a3;
        assert_int_equal(be->put(st, "k.w", (const uint8_t *)"x1", 2, 0, &p1), SW_OK);
        assert_int_equal(be->put(st, "k.w", (const uint8_t *)"x2", 2, p1, &p2), SW_OK);
        assert_int_equal(be->del(st, "k.w"), SW_OK);
        assert_int_equal(be->put(st, "k.w2", (const uint8_t *)"y1", 2, 0, NULL), SW_OK);
        assert_int_equal(be->del(st, "k.one"), SW_OK);
        /* The backend may first replay what existed when the watch began
         * (revision <= r3 and k.two); everything later must come, in order. */
        a1 = raw_wait(&lg, "k.w", 0, r3, 0, T(3000));
        /* A KV bucket keeps one revision per key: a watcher that falls
         * behind may see only the newer of two quick puts -- or, when it
         * falls further behind (a loaded machine), only the delete that
         * replaced both. What it sees comes in order and never twice, and
         * the newest state always comes. */
        if (a1 < 0) {
            d1 = raw_wait(&lg, "k.w", 1, r3, 0, T(3000));
            assert_true(d1 >= 0);
            a1 = a2 = d1; /* no put seen: the checks below start at the delete */
            print_message("    %s: the watcher fell behind both puts of k.w (history 1)\n", f->be);
        } else {
            if (lg.v[a1].rev < p2) {
                a2 = raw_wait(&lg, "k.w", 0, lg.v[a1].rev, a1 + 1, T(3000));
                assert_true(a2 > a1);
            } else {
                a2 = a1;
            }
            assert_int_equal(lg.v[a2].rev, p2);
            d1 = raw_wait(&lg, "k.w", 1, lg.v[a2].rev, a2 + 1, T(3000));
            assert_true(d1 > a2);
        }
        a3 = raw_wait(&lg, "k.w2", 0, lg.v[d1].rev, d1 + 1, T(3000));
        assert_true(a3 > d1);
        assert_true(raw_wait(&lg, "k.one", 1, r3, a3 + 1, T(3000)) > a3);
        pthread_mutex_lock(&lg.mu);
        if (a1 != d1) { /* the puts were seen */
            assert_int_equal(lg.v[a2].rev, p2);
            assert_string_equal(lg.v[a2].val, "x2");
            if (a1 != a2) {
                assert_int_equal(lg.v[a1].rev, p1);
                assert_string_equal(lg.v[a1].val, "x1");
            }
        }
        assert_string_equal(lg.v[a3].val, "y1");
        /* Strictly increasing revisions over everything delivered after
         * the first new event. */
        for (int k = a1 + 1; k < lg.n; k++)
            assert_true(lg.v[k].rev > lg.v[k - 1].rev);
        /* Nothing from before the watch began shows up among them. */
        for (int k = a1; k < lg.n; k++)
            assert_true(lg.v[k].rev > r3);
        /* (The header says watch reports "every later change"; a backend
         * that first replays the current entries -- JetStream KV's
         * WatchAll does -- is tolerated: the registry core drops what it
         * already knows by revision.) */
        if (a1 > 0)
            print_message("    %s: watch replayed %d existing entr%s first\n", f->be, a1,
                          a1 == 1 ? "y" : "ies");
        pthread_mutex_unlock(&lg.mu);
    }

    /* del: gone from list; deleting a missing key is not an error; a
     * guarded put on a deleted key is ENOTFOUND; an unguarded one recreates. */
    memset(&a, 0, sizeof(a));
    assert_int_equal(be->list(st, list_cb, &a), SW_OK);
    assert_int_equal(acc_find(&a, "k.one"), -1);
    assert_int_equal(acc_find(&a, "k.w"), -1);
    assert_true(acc_find(&a, "k.two") >= 0);
    assert_true(acc_find(&a, "k.w2") >= 0);
    assert_int_equal(a.n, 2);
    assert_int_equal(a.deleted_seen, 0);
    assert_int_equal(be->del(st, "k.never"), SW_OK);
    assert_int_equal(be->put(st, "k.one", (const uint8_t *)"v4", 2, r3, &r), SW_ENOTFOUND);
    assert_int_equal(be->put(st, "k.one", (const uint8_t *)"v5", 2, 0, &r), SW_OK);
    assert_true(r > r3);

    /* unwatch: no more callbacks after it returns. */
    be->unwatch(st2, f->raw_watch[1]);
    f->raw_watch[1] = NULL;
    {
        int n;
        pthread_mutex_lock(&lg.mu);
        n = lg.n;
        pthread_mutex_unlock(&lg.mu);
        assert_int_equal(be->put(st, "k.after", (const uint8_t *)"z", 1, 0, NULL), SW_OK);
        assert_int_equal(be->del(st, "k.two"), SW_OK);
        swh_sleep_ms(T(300));
        pthread_mutex_lock(&lg.mu);
        assert_int_equal(lg.n, n);
        pthread_mutex_unlock(&lg.mu);
    }
    pthread_mutex_destroy(&lg.mu);
    pthread_cond_destroy(&lg.cv);
}

/* ======================================================================== */
/* The keep-alive thread racing the API                                      */

typedef struct key_chk {
    const char *key;
    int present;
    int draining; /* decoded from the value; -1 if it did not decode */
    uint64_t rev;
    uint8_t val[4096]; /* the value's bytes (len 0 if larger) */
    size_t len;
} key_chk;

static void
key_chk_cb(void *arg, const sw_registry_entry *e, int deleted)
{
    key_chk *c = arg;
    swp_instance *m = NULL;
    if (deleted || strcmp(e->key, c->key) != 0)
        return;
    c->present = 1;
    c->rev = e->revision;
    c->len = e->len <= sizeof(c->val) ? e->len : 0;
    memcpy(c->val, e->value, c->len);
    c->draining = swp_decode_instance(e->value, e->len, 65536, &m) == SW_OK ? m->draining : -1;
    swp_free(m);
}

static key_chk
raw_get(fx *f, const char *key)
{
    key_chk c;
    memset(&c, 0, sizeof(c));
    c.key = key;
    assert_int_equal(f->raw_be[0]->list(f->raw_state[0], key_chk_cb, &c), SW_OK);
    return c;
}

/* A backend with latency: the backend under test, whose put is delayed by
 * g_lag_ms when called from any thread but the test's own (i.e. from the
 * registry's keep-alive thread), the way a loaded server or a slow network
 * delays one writer relative to another. The registry core must stay
 * correct under that: the races below are in the core, not the backend. */
static const sw_registry_backend *g_inner;
static pthread_t g_main_thread;
static int g_lag_ms;

static sw_err
lag_open(void **st, sw_conn *c, const char *b, uint32_t age)
{
    return g_inner->open(st, c, b, age);
}
static void
lag_close(void *st)
{
    g_inner->close(st);
}
static sw_err
lag_put(void *st, const char *k, const uint8_t *v, size_t n, uint64_t expect, uint64_t *rev)
{
    sw_err rv;
    int lag = !pthread_equal(pthread_self(), g_main_thread) && g_lag_ms > 0;
    if (lag)
        swh_sleep_ms(g_lag_ms);
    rv = g_inner->put(st, k, v, n, expect, rev);
    return rv;
}
static sw_err
lag_del(void *st, const char *k)
{
    return g_inner->del(st, k);
}
static sw_err
lag_list(void *st, sw_registry_entry_fn fn, void *arg)
{
    return g_inner->list(st, fn, arg);
}
static sw_err
lag_watch(void *st, sw_registry_entry_fn fn, void *arg, void **w)
{
    return g_inner->watch(st, fn, arg, w);
}
static void
lag_unwatch(void *st, void *w)
{
    g_inner->unwatch(st, w);
}

static const sw_registry_backend lag_backend = {
    .name = "lagging",
    .version = SW_REGISTRY_BACKEND_VERSION,
    .open = lag_open,
    .close = lag_close,
    .put = lag_put,
    .del = lag_del,
    .list = lag_list,
    .watch = lag_watch,
    .unwatch = lag_unwatch,
};

static void
lag_setup(fx *f, int lag_ms)
{
    g_inner = sw_registry_backend_find(f->be);
    g_main_thread = pthread_self();
    g_lag_ms = lag_ms;
    f->ops = &lag_backend;
    f->raw_be[0] = g_inner;
    assert_int_equal(g_inner->open(&f->raw_state[0], f->conn, f->bucket, 60000), SW_OK);
}

/* Writes, straight to the store (lag_setup's raw handle), the entry a
 * worker `id` on EP1 announcing lease_ms would write; its revision into
 * *rev, and with enc != NULL its encoded value (the caller frees it). */
static void
raw_put_entry(fx *f, const char *id, unsigned lease_ms, uint64_t *rev, uint8_t **enc,
              size_t *enc_len)
{
    swp_instance m = STREAMWIRE__V1__INSTANCE_INFO__INIT;
    char key[256], req[128], ctl[128];
    uint8_t *buf = NULL;
    size_t len = 0;
    snprintf(req, sizeof(req), "sw.req.%s", id);
    snprintf(ctl, sizeof(ctl), "sw.ctl.%s", id);
    snprintf(key, sizeof(key), "%s.%s", EP1, id);
    m.version = SW_PROTOCOL_VERSION;
    m.instance_id = (char *)id;
    m.endpoint = EP1;
    m.request_subject = req;
    m.control_subject = ctl;
    m.lease_ms = lease_ms;
    assert_int_equal(swp_encode_alloc(&m, 65536, &buf, &len), SW_OK);
    assert_int_equal(g_inner->put(f->raw_state[0], key, buf, len, 0, rev), SW_OK);
    if (enc != NULL) {
        *enc = buf;
        *enc_len = len;
    } else {
        free(buf);
    }
}

/* Deregister racing the keep-alive: once deregister returns, the entry must
 * stay gone. A refresh in flight (it copied the entry before deregister
 * deleted it) fails its guarded put with "not found", and reg_refresh then
 * re-puts unguarded as if the worker had been wrongly removed: a zombie
 * entry, live for every router for a lease (and kept in a KV bucket until
 * max_age). */
static void
deregister_races_refresh(void **state)
{
    fx *f = *state;
    sw_registry *wreg;
    char key[256];
    int zombies = 0, rounds = 10;

    lag_setup(f, 40);
    wreg = fx_reg(f, 0, 3000, 1); /* keep-alive as often as it can */
    fx_worker(f, 0, EP1);
    snprintf(key, sizeof(key), "%s.%s", EP1, fx_id(f, 0));
    for (int k = 0; k < rounds; k++) {
        key_chk c;
        assert_int_equal(sw_registry_register(wreg, &f->rg[0]), SW_OK);
        swh_sleep_ms(10 + 7 * k % 30);
        assert_int_equal(sw_registry_deregister(wreg, fx_id(f, 0)), SW_OK);
        swh_sleep_ms(T(100)); /* > the lag: any refresh in flight has landed */
        c = raw_get(f, key);
        if (c.present) {
            zombies++;
            (void)g_inner->del(f->raw_state[0], key);
        }
    }
    g_lag_ms = 0;
    if (zombies > 0)
        fail_msg("%d of %d deregistered entries came back (a keep-alive in flight re-put them "
                 "unguarded after deregister deleted them)",
                 zombies, rounds);
}

/* set_draining racing the keep-alive: once the entry says draining, it must
 * keep saying it. A periodic refresh that copied the entry before the flag
 * was set loses its guarded put to set_draining's write (SW_EBUSY), then
 * overwrites it unguarded with draining = 0: until the next refresh, every
 * router sees the draining worker as available again (UPDATED, draining 0)
 * and routes to it, and its drained request subscription answers
 * no_responders. Watched on the raw store. */
typedef struct drain_watch {
    pthread_mutex_t mu;
    char key[256];
    int seen_draining; /* a put of key with draining = 1 was seen */
    int undone;        /* ... and then one with draining = 0 */
} drain_watch;

static void
drain_watch_cb(void *arg, const sw_registry_entry *e, int deleted)
{
    drain_watch *d = arg;
    swp_instance *m = NULL;
    if (deleted || swp_decode_instance(e->value, e->len, 65536, &m) != SW_OK)
        return;
    pthread_mutex_lock(&d->mu);
    if (strcmp(e->key, d->key) == 0) {
        if (m->draining)
            d->seen_draining = 1;
        else if (d->seen_draining)
            d->undone = 1;
    }
    pthread_mutex_unlock(&d->mu);
    swp_free(m);
}

static void
set_draining_races_refresh(void **state)
{
    fx *f = *state;
    sw_registry *wreg;
    int undone = 0, rounds = 6;
    drain_watch d;

    memset(&d, 0, sizeof(d));
    pthread_mutex_init(&d.mu, NULL);
    lag_setup(f, 40);
    assert_int_equal(g_inner->watch(f->raw_state[0], drain_watch_cb, &d, &f->raw_watch[0]), SW_OK);
    for (int k = 0; k < rounds; k++) {
        char id[SW_MAX_TOKEN + 1];
        char subj[2][SWP_MAX_SUBJECT + 1];
        sw_registration rg;
        snprintf(id, sizeof(id), "d%d-%s", k, f->sfx);
        rg_fill(&rg, subj, id, EP1);
        pthread_mutex_lock(&d.mu);
        snprintf(d.key, sizeof(d.key), "%s.%s", EP1, id);
        d.seen_draining = d.undone = 0;
        pthread_mutex_unlock(&d.mu);
        /* A fresh handle each round, so that its keep-alive thread works
         * on this entry only. */
        wreg = fx_reg(f, 0, 3000, 1);
        assert_int_equal(sw_registry_register(wreg, &rg), SW_OK);
        /* The first keep-alive copies the entry about 1 ms after register
         * and lands 40 ms later: set the flag in between. */
        swh_sleep_ms(10 + 5 * (k % 5));
        assert_int_equal(sw_registry_set_draining(wreg, id), SW_OK);
        swh_sleep_ms(T(150)); /* a few keep-alives */
        fx_reg_close(f, 0);
        pthread_mutex_lock(&d.mu);
        undone += d.undone;
        d.key[0] = '\0';
        pthread_mutex_unlock(&d.mu);
    }
    g_lag_ms = 0;
    g_inner->unwatch(f->raw_state[0], f->raw_watch[0]);
    f->raw_watch[0] = NULL;
    pthread_mutex_destroy(&d.mu);
    if (undone > 0)
        fail_msg("%d of %d set_draining writes were undone (draining 1 -> 0) by a concurrent "
                 "keep-alive",
                 undone, rounds);
}

/* ======================================================================== */
/* Liveness never depends on clock agreement (issue 11 #3)                   */

/* A backend whose clock disagrees with ours: the backend under test, with
 * every entry's created_unix_ms (the store's timestamp of the revision)
 * shifted by g_skew_ms as list and watch report it. */
static int64_t g_skew_ms;

typedef struct skew_fwd {
    sw_registry_entry_fn fn;
    void *arg;
} skew_fwd;

static void
skew_entry(void *arg, const sw_registry_entry *e, int deleted)
{
    skew_fwd *fw = arg;
    sw_registry_entry c = *e;
    if (c.created_unix_ms != 0)
        c.created_unix_ms += g_skew_ms;
    fw->fn(fw->arg, &c, deleted);
}

static sw_err
skew_list(void *st, sw_registry_entry_fn fn, void *arg)
{
    skew_fwd fw = {fn, arg};
    return g_inner->list(st, skew_entry, &fw);
}

/* One watch at a time is enough here (one skewed handle per test). */
static skew_fwd g_skew_watch;

static sw_err
skew_watch(void *st, sw_registry_entry_fn fn, void *arg, void **w)
{
    g_skew_watch.fn = fn;
    g_skew_watch.arg = arg;
    return g_inner->watch(st, skew_entry, &g_skew_watch, w);
}

static const sw_registry_backend skew_backend = {
    .name = "skewed",
    .version = SW_REGISTRY_BACKEND_VERSION,
    .open = lag_open,
    .close = lag_close,
    .put = lag_put,
    .del = lag_del,
    .list = skew_list,
    .watch = skew_watch,
    .unwatch = lag_unwatch,
};

/* Writes, straight into the store, a well-formed entry for id whose own
 * timestamps are `skew` ms off ours. */
static void
raw_put_instance(fx *f, const char *id, int64_t skew, unsigned lease_ms)
{
    swp_instance m = STREAMWIRE__V1__INSTANCE_INFO__INIT;
    char subj[2][SWP_MAX_SUBJECT + 1];
    char key[256];
    uint8_t *enc = NULL;
    size_t len = 0;
    assert_int_equal(swt_subject_request(subj[0], sizeof(subj[0]), EP1, id), SW_OK);
    assert_int_equal(swt_subject_control(subj[1], sizeof(subj[1]), id), SW_OK);
    m.version = SW_PROTOCOL_VERSION;
    m.instance_id = (char *)id;
    m.endpoint = EP1;
    m.request_subject = subj[0];
    m.control_subject = subj[1];
    m.host = "elsewhere";
    m.pid = 1;
    m.started_unix_ms = (uint64_t)(unix_ms() + skew);
    m.refreshed_unix_ms = (uint64_t)(unix_ms() + skew);
    m.lease_ms = lease_ms;
    assert_int_equal(swp_encode_alloc(&m, 65536, &enc, &len), SW_OK);
    snprintf(key, sizeof(key), "%s.%s", EP1, id);
    assert_int_equal(g_inner->put(f->raw_state[0], key, enc, len, 0, NULL), SW_OK);
    free(enc);
}

/* A router whose clock is an hour off the store's (either way) sees a
 * refreshed worker live, and removes it one lease after it last saw it
 * refreshed -- no sooner, no later -- both for a worker it watches being
 * refreshed and for an entry it first finds when it opens. */
static void
lease_ignores_clock_skew(void **state)
{
    fx *f = *state;
    static const int64_t skews[] = {-3600000, 3600000};

    lag_setup(f, 0);
    f->ops = NULL; /* the writer uses the plain backend */
    for (size_t k = 0; k < sizeof(skews) / sizeof(skews[0]); k++) {
        evlog *l = &f->log[k];
        sw_registry *wreg, *rreg;
        int64_t t_close, t_open, t_rm;
        int i;
        char id[SW_MAX_TOKEN + 1];

        g_skew_ms = skews[k];
        wreg = fx_reg(f, 0, 600, 200);
        f->ops = &skew_backend;
        rreg = fx_reg(f, 1, 600, 0);
        f->ops = NULL;
        assert_int_equal(sw_registry_watch(rreg, on_event, l, NULL), SW_OK);
        fx_worker(f, (int)k, EP1);
        assert_int_equal(sw_registry_register(wreg, &f->rg[k]), SW_OK);
        if (evlog_wait(l, SW_REGISTRY_ADDED, fx_id(f, (int)k), 0, T(2000)) < 0)
            fail_msg("store clock %+lld ms off: a refreshed worker was never seen live",
                     (long long)skews[k]);
        /* Refreshed every 200 ms: live for three leases, no REMOVED. */
        for (int n = 0; n < 36; n++) {
            swh_sleep_ms(50);
            if (!listed(rreg, NULL, fx_id(f, (int)k), NULL))
                fail_msg("store clock %+lld ms off: a refreshed worker vanished after %d ms",
                         (long long)skews[k], (n + 1) * 50);
        }
        assert_int_equal(evlog_count(l, SW_REGISTRY_REMOVED, fx_id(f, (int)k), 0), 0);
        /* Its refreshes stop: removed one lease after the last one seen. */
        fx_reg_close(f, 0);
        t_close = now_ms();
        i = evlog_wait(l, SW_REGISTRY_REMOVED, fx_id(f, (int)k), 0, T(600 + 1500));
        assert_true(i >= 0);
        t_rm = evlog_get(l, i).t;
        assert_true(t_rm - t_close >= 200);
        assert_false(listed(rreg, NULL, fx_id(f, (int)k), NULL));

        /* An entry found at open whose timestamps are an hour off: a first
         * sight counts as seen now; never refreshed, it expires one lease
         * later. */
        snprintf(id, sizeof(id), "skew%zu-%s", k, f->sfx);
        raw_put_instance(f, id, skews[k], 600);
        fx_reg_close(f, 1);
        f->ops = &skew_backend;
        t_open = now_ms();
        rreg = fx_reg(f, 1, 600, 0);
        f->ops = NULL;
        if (!listed(rreg, NULL, id, NULL))
            fail_msg("store clock %+lld ms off: an entry found at open was not live",
                     (long long)skews[k]);
        assert_true(wait_listed(rreg, id, 0, T(600 + 1500)));
        assert_true(now_ms() - t_open >= 500);
        fx_reg_close(f, 1);
    }
    g_skew_ms = 0;
}

/* ======================================================================== */
/* No user callback with a registry or pool lock held                        */

/* A log callback that calls back into the API of the registry handle (or
 * pool) it logs for, through calls that take every lock that object has:
 * sw_registry_deregister of an unknown id takes wmu then mu,
 * sw_registry_list takes mu, swr_pool_quarantined takes the pool's lock.
 * The locks are plain (non-recursive) mutexes: a log line written with one
 * of them held by the logging thread deadlocks here. A watchdog turns that
 * deadlock into a failure (the process exits with a message) instead of a
 * hang. The callback also records which log lines it saw, so the test can
 * check that the paths it means to cover did run. */
typedef struct reentry {
    sw_registry *reg; /* set once open returned (atomic: read on other threads) */
    swr_pool *pool;
    pthread_mutex_t mu; /* guards the fields below; a leaf, test-only */
    int lines, expired, wronged, overwritten, back;
    int bad;            /* a re-entrant call returned something unexpected */
    char last[16][200]; /* the last lines, printed when a wait times out */
} reentry;

static void
reentry_init(reentry *r)
{
    memset(r, 0, sizeof(*r));
    pthread_mutex_init(&r->mu, NULL);
}

static void
reentry_log(void *arg, sw_log_level level, const char *msg)
{
    reentry *r = arg;
    sw_registry *reg = __atomic_load_n(&r->reg, __ATOMIC_ACQUIRE);
    swr_pool *pool = __atomic_load_n(&r->pool, __ATOMIC_ACQUIRE);
    int bad = 0;
    if (g_verbose)
        fprintf(stderr, "[reentry] %s: %s\n", sw_log_level_name(level), msg);
    /* (No cmocka assertion here: this may run on a registry thread.) */
    if (reg != NULL) {
        sw_instance *v = NULL;
        size_t n = 0;
        bad += sw_registry_deregister(reg, "no-such-instance") != SW_ENOTFOUND;
        if (sw_registry_list(reg, NULL, &v, &n) == SW_OK)
            sw_instances_free(v, n);
        else
            bad++;
    }
    if (pool != NULL)
        bad += swr_pool_quarantined(pool, "no-such-instance") != 0;
    pthread_mutex_lock(&r->mu);
    r->bad += bad;
    r->lines++;
    r->expired += strstr(msg, "lease of") != NULL;
    r->wronged += strstr(msg, "while alive") != NULL;
    r->overwritten += strstr(msg, "changed by someone else") != NULL;
    r->back += strstr(msg, "lifting its quarantine") != NULL;
    snprintf(r->last[(r->lines - 1) % 16], sizeof(r->last[0]), "%s: %s", sw_log_level_name(level),
             msg);
    pthread_mutex_unlock(&r->mu);
}

static int
reentry_get(reentry *r, const int *field)
{
    int v;
    pthread_mutex_lock(&r->mu);
    v = *field;
    pthread_mutex_unlock(&r->mu);
    return v;
}

/* Waits until *field (of r) is at least want; on a timeout, prints the
 * last lines the registry logged (what it did instead). */
static int
reentry_wait(reentry *r, const int *field, int want, int64_t timeout_ms)
{
    int64_t until = now_ms() + timeout_ms;
    while (reentry_get(r, field) < want) {
        if (now_ms() >= until) {
            pthread_mutex_lock(&r->mu);
            fprintf(stderr, "    timed out waiting for %d (have %d); last %d of %d lines:\n", want,
                    *field, r->lines < 16 ? r->lines : 16, r->lines);
            for (int i = r->lines > 16 ? r->lines - 16 : 0; i < r->lines; i++)
                fprintf(stderr, "      %s\n", r->last[i % 16]);
            pthread_mutex_unlock(&r->mu);
            return 0;
        }
        swh_sleep_ms(5);
    }
    return 1;
}

/* One watchdog at a time, global: when a test fails by an assertion (a
 * longjmp out of it), teardown still runs, and it may hang closing a
 * registry whose thread is deadlocked; the watchdog covers that too, and
 * teardown stops it after closing everything. */
typedef struct watchdog {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t t;
    int active;
    int done;
    int64_t until;
    const char *what, *why;
} watchdog;

static watchdog g_wd;

static void *
watchdog_main(void *p)
{
    watchdog *w = p;
    pthread_mutex_lock(&w->mu);
    while (!w->done && now_ms() < w->until)
        cond_wait_until(&w->cv, &w->mu, w->until);
    if (!w->done) {
        fprintf(stderr, "FAILED: %s: still running after its deadline: %s\n", w->what, w->why);
        fflush(NULL);
        _exit(1);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* A log callback that re-enters the API deadlocked: it was called with a
 * registry or pool lock held. */
#define WD_REENTRY                                                                             \
    "a log callback that re-enters the API deadlocked, i.e. it was called with a registry or " \
    "pool lock held"

static void
watchdog_start(const char *what, const char *why, int64_t timeout_ms)
{
    watchdog *w = &g_wd;
    assert_false(w->active);
    w->why = why;
    pthread_mutex_init(&w->mu, NULL);
    cond_init_mono(&w->cv);
    w->done = 0;
    w->until = now_ms() + timeout_ms;
    w->what = what;
    assert_int_equal(pthread_create(&w->t, NULL, watchdog_main, w), 0);
    w->active = 1;
}

static void
watchdog_stop(void)
{
    watchdog *w = &g_wd;
    if (!w->active)
        return;
    pthread_mutex_lock(&w->mu);
    w->done = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->t, NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    w->active = 0;
}

/* Opens registry slot i with log callback reentry_log(r). */
static sw_registry *
fx_reg_reentry(fx *f, int i, unsigned lease_ms, unsigned refresh_ms, reentry *r)
{
    sw_registry_opts o;
    sw_registry_opts_init(&o);
    o.backend = f->be;
    o.bucket = f->bucket;
    o.lease_ms = lease_ms;
    o.refresh_ms = refresh_ms;
    o.log = reentry_log;
    o.log_arg = r;
    assert_null(f->reg[i]);
    assert_int_equal(
        sw_registry_open(&f->reg[i], strcmp(f->be, "memory") == 0 ? NULL : f->conn, &o), SW_OK);
    __atomic_store_n(&r->reg, f->reg[i], __ATOMIC_RELEASE);
    return f->reg[i];
}

/* Every log line the registry writes where one used to run under a lock:
 * "registered", "changed by someone else" (under wmu before), "was reported
 * dead / deleted while alive" (under mu), "lease of ... expired" (under mu,
 * on the registry thread), "reported dead". */
static void
registry_logs_without_locks(void **state)
{
    fx *f = *state;
    reentry rw, rr;
    sw_registry *wreg, *rreg;
    const sw_registry_backend *be = sw_registry_backend_find(f->be);
    static const uint8_t junk[] = {0xff, 0x00, 0x13, 0x37};
    char key[256];
    uint64_t rev = 0;

    reentry_init(&rw);
    reentry_init(&rr);
    watchdog_start("registry_logs_without_locks", WD_REENTRY, T(60000));
    wreg = fx_reg_reentry(f, 0, 900, 100, &rw);
    rreg = fx_reg_reentry(f, 1, 900, 0, &rr);
    fx_worker(f, 0, EP1);
    snprintf(key, sizeof(key), "%s.%s", EP1, fx_id(f, 0));
    assert_int_equal(sw_registry_register(wreg, &f->rg[0]), SW_OK);
    assert_true(reentry_get(&rw, &rw.lines) >= 1); /* "registered" */
    assert_true(wait_listed(rreg, fx_id(f, 0), 1, T(2000)));

    /* Garbage over the entry: the keep-alive's guarded put fails, it
     * re-puts unguarded and says so. */
    f->raw_be[0] = be;
    assert_int_equal(be->open(&f->raw_state[0], f->conn, f->bucket, 60000), SW_OK);
    assert_int_equal(be->put(f->raw_state[0], key, junk, sizeof(junk), 0, &rev), SW_OK);
    assert_true(reentry_wait(&rw, &rw.overwritten, 1, T(3000)));

    /* Reported dead while alive: the worker's handle notices and says so;
     * the reporter logs its report. */
    {
        sw_err rv = SW_EBUSY;
        for (int tries = 0; tries < 50 && rv == SW_EBUSY; tries++)
            rv = sw_registry_report_dead(rreg, fx_id(f, 0), 0, "reentry test");
        assert_int_equal(rv, SW_OK);
    }
    assert_true(reentry_wait(&rw, &rw.wronged, 1, T(3000)));
    /* Its registration again is in the store once the worker's own view
     * lists it (the tombstone took it out of that view). The reader's view
     * may still hold the entry from before the report: waiting on the
     * reader let the delete below land before the worker's new put, which
     * then replaced the delete marker before either watch was sent it (a
     * bucket keeps one value a key). */
    assert_true(wait_listed(wreg, fx_id(f, 0), 1, T(3000)));

    /* Deleted while alive: the same, through the delete path. Should the
     * worker's keep-alive meet the delete before its watch does, it says
     * "changed by someone else" and puts over the marker, which its watch
     * may then never be sent: delete again (the wait prints what the
     * registry logged if neither line comes). */
    {
        int seen = 0;
        for (int tries = 0; tries < 5 && !seen; tries++) {
            int over = reentry_get(&rw, &rw.overwritten);
            assert_int_equal(be->del(f->raw_state[0], key), SW_OK);
            for (int64_t until = now_ms() + T(3000); !seen && now_ms() < until;) {
                seen = reentry_get(&rw, &rw.wronged) >= 2;
                if (!seen && reentry_get(&rw, &rw.overwritten) > over)
                    break; /* the keep-alive's: delete again once listed */
                swh_sleep_ms(5);
            }
            if (!seen)
                assert_true(wait_listed(wreg, fx_id(f, 0), 1, T(3000)));
        }
        if (!seen)
            assert_true(reentry_wait(&rw, &rw.wronged, 2, 0));
    }
    assert_true(wait_listed(rreg, fx_id(f, 0), 1, T(3000)));

    /* The writer goes away without deregistering: the reader's registry
     * thread expires the lease and says so. */
    __atomic_store_n(&rw.reg, NULL, __ATOMIC_RELEASE);
    fx_reg_close(f, 0);
    assert_true(reentry_wait(&rr, &rr.expired, 1, T(900 + 3000)));
    assert_true(wait_listed(rreg, fx_id(f, 0), 0, T(1000)));

    __atomic_store_n(&rr.reg, NULL, __ATOMIC_RELEASE);
    watchdog_stop();
    assert_int_equal(rw.bad, 0);
    assert_int_equal(rr.bad, 0);
    pthread_mutex_destroy(&rw.mu);
    pthread_mutex_destroy(&rr.mu);
}

/* A tombstone recorded and put back later (review question 5). An entry
 * names its registration (a random incarnation and a generation); a
 * tombstone copies them. Put once while it names the live registration, it
 * removes the worker, which registers again as a new generation; put back
 * after that, it names an earlier registration: no router drops the worker
 * for it (entries_ignored), and the worker writes over it. */
static void
recorded_tombstone_put_back_is_ignored(void **state)
{
    fx *f = *state;
    sw_registry *wreg = fx_reg(f, 0, 1500, 150);
    sw_registry *rreg = fx_reg(f, 1, 1500, 0);
    evlog *l = &f->log[0];
    const sw_registry_backend *be = sw_registry_backend_find(f->be);
    char key[256];
    key_chk cur;
    swp_instance *info = NULL;
    uint8_t *tomb = NULL;
    size_t tlen = 0;
    sw_registry_stats st0, st1;
    int i_rm, i_add, n_rm;

    fx_worker(f, 0, EP1);
    snprintf(key, sizeof(key), "%s.%s", EP1, fx_id(f, 0));
    assert_int_equal(sw_registry_register(wreg, &f->rg[0]), SW_OK);
    assert_int_equal(sw_registry_watch(rreg, on_event, l, NULL), SW_OK);
    assert_true(evlog_wait(l, SW_REGISTRY_ADDED, fx_id(f, 0), 0, T(2000)) >= 0);
    f->raw_be[0] = be;
    assert_int_equal(be->open(&f->raw_state[0], f->conn, f->bucket, 60000), SW_OK);

    /* The entry as an eavesdropper records it, made a tombstone. */
    cur = raw_get(f, key);
    assert_true(cur.present);
    assert_int_equal(swp_decode_instance(cur.val, cur.len, sizeof(cur.val), &info), SW_OK);
    assert_true(info->incarnation != 0);
    assert_int_equal(info->generation, 1);
    info->dead = 1;
    info->dead_reason = (char *)"recorded";
    assert_int_equal(swp_encode_alloc(info, SIZE_MAX, &tomb, &tlen), SW_OK);
    info->dead_reason = NULL; /* not ours to free */
    swp_free(info);

    /* Written while it names the live registration: the worker is removed
     * and registers again (generation 2). */
    assert_int_equal(be->put(f->raw_state[0], key, tomb, tlen, 0, NULL), SW_OK);
    i_rm = evlog_wait(l, SW_REGISTRY_REMOVED, fx_id(f, 0), 0, T(2000));
    assert_true(i_rm >= 0);
    i_add = evlog_wait(l, SW_REGISTRY_ADDED, fx_id(f, 0), i_rm + 1, T(3000));
    assert_true(i_add > i_rm);
    assert_true(wait_listed(rreg, fx_id(f, 0), 1, T(2000)));
    {
        /* the store holds generation 2 */
        swp_instance *now = NULL;
        int gen2 = 0;
        for (int i = 0; i < 200 && !gen2; i++) {
            cur = raw_get(f, key);
            if (cur.present &&
                swp_decode_instance(cur.val, cur.len, sizeof(cur.val), &now) == SW_OK) {
                gen2 = !now->dead && now->generation >= 2;
                swp_free(now);
                now = NULL;
            }
            if (!gen2)
                swh_sleep_ms(10);
        }
        assert_true(gen2);
    }

    /* Put back: an earlier registration's tombstone. Nobody drops it. */
    n_rm = evlog_count(l, SW_REGISTRY_REMOVED, fx_id(f, 0), 0);
    sw_registry_stats_get(rreg, &st0);
    assert_int_equal(be->put(f->raw_state[0], key, tomb, tlen, 0, NULL), SW_OK);
    swh_sleep_ms(T(800));
    assert_int_equal(evlog_count(l, SW_REGISTRY_REMOVED, fx_id(f, 0), 0), n_rm);
    assert_true(listed(rreg, NULL, fx_id(f, 0), NULL));
    assert_true(listed(wreg, NULL, fx_id(f, 0), NULL));
    sw_registry_stats_get(rreg, &st1);
    assert_true(st1.entries_ignored >= st0.entries_ignored + 1);
    {
        /* and the worker wrote over it */
        cur = raw_get(f, key);
        assert_true(cur.present);
        assert_int_equal(swp_decode_instance(cur.val, cur.len, sizeof(cur.val), &info), SW_OK);
        assert_false(info->dead);
        assert_true(info->generation >= 3);
        /* A tombstone of a later generation than a view holds (one the view
         * missed) counts: it removes the worker. */
        info->dead = 1;
        info->generation += 5;
        free(tomb);
        tomb = NULL;
        assert_int_equal(swp_encode_alloc(info, SIZE_MAX, &tomb, &tlen), SW_OK);
        swp_free(info);
    }
    n_rm = evlog_count(l, SW_REGISTRY_REMOVED, fx_id(f, 0), 0);
    assert_int_equal(be->put(f->raw_state[0], key, tomb, tlen, 0, NULL), SW_OK);
    /* (5 s: a loaded JetStream was seen to take more than 2 s, once) */
    for (int i = 0;
         i < 500 * swh_slow() && evlog_count(l, SW_REGISTRY_REMOVED, fx_id(f, 0), 0) == n_rm; i++)
        swh_sleep_ms(10);
    assert_int_equal(evlog_count(l, SW_REGISTRY_REMOVED, fx_id(f, 0), 0), n_rm + 1);
    free(tomb);
}

/* A log line one handle's backend callback writes while ANOTHER handle
 * holds its lock: the memory backend calls a watcher inside the writer's
 * put/del, under the writer's wmu. Two handles claim one instance (a
 * misconfiguration); A deregisters it (A's wmu held across the delete), and
 * B, whose own entry was deleted while alive, logs; B's log callback
 * re-enters A. Written under A's wmu, that deadlocked (the watchdog fails
 * the test); B's line is now queued and written by B's ticker. */
static void
log_under_another_handles_lock(void **state)
{
    fx *f = *state;
    reentry ra, rb;
    sw_registry *a, *b;
    reentry_init(&ra);
    reentry_init(&rb);
    watchdog_start("log_under_another_handles_lock", WD_REENTRY, T(30000));
    a = fx_reg_reentry(f, 0, 3000, 1000, &ra);
    b = fx_reg_reentry(f, 1, 3000, 1000, &rb);
    __atomic_store_n(&rb.reg, a, __ATOMIC_RELEASE); /* B's log re-enters A */
    fx_worker(f, 0, EP1);
    assert_int_equal(sw_registry_register(a, &f->rg[0]), SW_OK);
    assert_int_equal(sw_registry_register(b, &f->rg[0]), SW_OK); /* the same instance */
    assert_true(wait_listed(a, fx_id(f, 0), 1, T(2000)));
    assert_int_equal(sw_registry_deregister(a, fx_id(f, 0)), SW_OK);
    assert_true(reentry_wait(&rb, &rb.wronged, 1, T(3000)));
    /* and B registers it again */
    assert_true(wait_listed(a, fx_id(f, 0), 1, T(3000)));
    __atomic_store_n(&ra.reg, NULL, __ATOMIC_RELEASE);
    __atomic_store_n(&rb.reg, NULL, __ATOMIC_RELEASE);
    fx_reg_close(f, 1);
    fx_reg_close(f, 0);
    watchdog_stop();
    assert_int_equal(ra.bad, 0);
    assert_int_equal(rb.bad, 0);
    pthread_mutex_destroy(&ra.mu);
    pthread_mutex_destroy(&rb.mu);
}

/* The pool's log line "is back; lifting its quarantine" (written under the
 * pool lock before) and its on_removed callback, with a log callback and an
 * on_removed that re-enter the pool. */
typedef struct removed_chk {
    swr_pool *pool;
    pthread_mutex_t mu;
    int n;
} removed_chk;

static void
pool_removed_cb(void *arg, const char *instance)
{
    removed_chk *c = arg;
    swr_pool *p = __atomic_load_n(&c->pool, __ATOMIC_ACQUIRE);
    if (p != NULL)
        (void)swr_pool_quarantined(p, instance);
    pthread_mutex_lock(&c->mu);
    c->n++;
    pthread_mutex_unlock(&c->mu);
}

static void
pool_logs_without_lock(void **state)
{
    fx *f = *state;
    reentry rp, rrl;
    removed_chk rc;
    swr_pool *pool = NULL;
    swr_pool_opts po;
    sw_registry *wreg, *rreg;
    char out[SW_MAX_TOKEN + 1];
    int64_t until;

    reentry_init(&rp);
    reentry_init(&rrl);
    memset(&rc, 0, sizeof(rc));
    pthread_mutex_init(&rc.mu, NULL);
    watchdog_start("pool_logs_without_lock", WD_REENTRY, T(30000));
    wreg = fx_reg(f, 0, 0, 0);
    rreg = fx_reg_reentry(f, 1, 0, 0, &rrl);
    fx_worker(f, 0, EP1);
    memset(&po, 0, sizeof(po));
    po.registry = rreg;
    po.policy = SW_POLICY_ROUND_ROBIN;
    po.quarantine_ms = 30000;
    po.log.fn = reentry_log;
    po.log.arg = &rp;
    po.on_removed = pool_removed_cb;
    po.on_removed_arg = &rc;
    assert_int_equal(swr_pool_create(&pool, &po), SW_OK);
    __atomic_store_n(&rp.pool, pool, __ATOMIC_RELEASE);
    __atomic_store_n(&rc.pool, pool, __ATOMIC_RELEASE);

    assert_int_equal(sw_registry_register(wreg, &f->rg[0]), SW_OK);
    until = now_ms() + T(3000);
    while (swr_pool_pick(pool, EP1, NULL, NULL, out) != SW_OK && now_ms() < until)
        swh_sleep_ms(5);
    assert_int_equal(swr_pool_pick(pool, EP1, NULL, NULL, out), SW_OK);
    assert_string_equal(out, fx_id(f, 0));
    /* Quarantined here; then it deregisters (REMOVED: on_removed) and
     * registers again (ADDED: the quarantine is lifted, and logged). */
    assert_int_equal(swr_pool_quarantine(pool, fx_id(f, 0)), 1);
    assert_true(swr_pool_quarantined(pool, fx_id(f, 0)));
    assert_int_equal(sw_registry_deregister(wreg, fx_id(f, 0)), SW_OK);
    until = now_ms() + T(3000);
    for (;;) {
        int n;
        pthread_mutex_lock(&rc.mu);
        n = rc.n;
        pthread_mutex_unlock(&rc.mu);
        if (n >= 1 || now_ms() >= until)
            break;
        swh_sleep_ms(5);
    }
    pthread_mutex_lock(&rc.mu);
    assert_true(rc.n >= 1);
    pthread_mutex_unlock(&rc.mu);
    assert_int_equal(sw_registry_register(wreg, &f->rg[0]), SW_OK);
    assert_true(reentry_wait(&rp, &rp.back, 1, T(3000)));
    assert_false(swr_pool_quarantined(pool, fx_id(f, 0)));
    /* And a report through the pool logs (after its registry call, on the
     * pool's reporter thread). */
    swr_pool_report(pool, fx_id(f, 0), "reentry test", 0);
    {
        int64_t until2 = now_ms() + T(5000);
        while (reentry_get(&rp, &rp.lines) < 2 && now_ms() < until2)
            swh_sleep_ms(5);
    }
    assert_true(reentry_get(&rp, &rp.lines) >= 2);

    __atomic_store_n(&rp.pool, NULL, __ATOMIC_RELEASE);
    __atomic_store_n(&rc.pool, NULL, __ATOMIC_RELEASE);
    __atomic_store_n(&rrl.reg, NULL, __ATOMIC_RELEASE);
    swr_pool_destroy(pool);
    watchdog_stop();
    assert_int_equal(rp.bad, 0);
    assert_int_equal(rrl.bad, 0);
    pthread_mutex_destroy(&rp.mu);
    pthread_mutex_destroy(&rrl.mu);
    pthread_mutex_destroy(&rc.mu);
}

/* ======================================================================== */

static int
group_setup(void **state)
{
    (void)state;
    g_slow = swh_slow();
    g_verbose = getenv("SW_IT_VERBOSE") != NULL;
#ifndef SW_REGISTRY_MEMORY_ONLY
    if (swh_nats_start(&g_nats, NULL) != 0) {
        fprintf(stderr, "test_registry: could not start nats-server\n");
        return -1;
    }
#endif
    return 0;
}

static int
group_teardown(void **state)
{
    (void)state;
    if (g_ngrave > 0) {
        swh_sleep_ms(T(300));
        for (int i = 0; i < g_ngrave; i++)
            sw_conn_close(g_grave[i]);
        g_ngrave = 0;
    }
#ifndef SW_REGISTRY_MEMORY_ONLY
    swh_nats_stop(&g_nats);
#endif
    return 0;
}

/* Issue 11 #11: an entry under a key that is not <endpoint>.<instance> (a
 * stale or forged copy naming a live instance) is ignored: its REMOVED or
 * tombstone can never evict the live instance. */
static void
foreign_key_entry_ignored(void **state)
{
    fx *f = *state;
    const sw_registry_backend *be = sw_registry_backend_find(f->be);
    sw_registry *wreg = fx_reg(f, 0, 1500, 150);
    sw_registry *rreg = fx_reg(f, 1, 1500, 0);
    evlog *l = &f->log[0];
    uint8_t *enc = NULL;
    size_t enc_len = 0;
    uint64_t rev = 0;
    swp_instance m = STREAMWIRE__V1__INSTANCE_INFO__INIT;

    fx_worker(f, 0, EP1);
    assert_int_equal(sw_registry_register(wreg, &f->rg[0]), SW_OK);
    assert_int_equal(sw_registry_watch(rreg, on_event, l, NULL), SW_OK);
    assert_true(evlog_wait(l, SW_REGISTRY_ADDED, fx_id(f, 0), 0, T(2000)) >= 0);
    f->raw_be[0] = be;
    assert_int_equal(be->open(&f->raw_state[0], f->conn, f->bucket, 60000), SW_OK);
    m.version = SW_PROTOCOL_VERSION;
    m.instance_id = (char *)fx_id(f, 0);
    m.endpoint = (char *)EP1;
    m.request_subject = (char *)"sw.req.x";
    m.control_subject = (char *)"sw.ctl.x";
    m.lease_ms = 3000;
    /* A copy of the live instance under another key, then its tombstone. */
    for (int dead = 0; dead <= 1; dead++) {
        m.dead = dead;
        assert_int_equal(swp_encode_alloc(&m, 65536, &enc, &enc_len), SW_OK);
        assert_int_equal(be->put(f->raw_state[0], EP1 ".forged", enc, enc_len, rev, &rev), SW_OK);
        free(enc);
        swh_sleep_ms(T(100));
    }
    swh_sleep_ms(T(300));
    assert_int_equal(evlog_count(l, SW_REGISTRY_REMOVED, fx_id(f, 0), 0), 0);
    assert_true(listed(rreg, NULL, fx_id(f, 0), NULL));
}

/* Issue 11 #7: a dead report is accepted only if the entry was not
 * refreshed while the reporter heard nothing from the instance: a router
 * whose own connection dropped for a second cannot evict a healthy worker
 * that kept its lease. */
static void
report_silent_refused_when_refreshed(void **state)
{
    fx *f = *state;
    sw_registry *wreg = fx_reg(f, 0, 1500, 150);
    sw_registry *rreg = fx_reg(f, 1, 1500, 0);
    evlog *l = &f->log[0];
    uint64_t rev0;
    sw_err rv = SW_EBUSY;

    fx_worker(f, 0, EP1);
    assert_int_equal(sw_registry_register(wreg, &f->rg[0]), SW_OK);
    assert_int_equal(sw_registry_watch(rreg, on_event, l, NULL), SW_OK);
    assert_true(evlog_wait(l, SW_REGISTRY_ADDED, fx_id(f, 0), 0, T(2000)) >= 0);
    rev0 = wait_revision_above(rreg, fx_id(f, 0), 0, T(2000));
    assert_true(wait_revision_above(rreg, fx_id(f, 0), rev0, T(3000)) > rev0);
    /* Silent for 5 s, but refreshed within the last ~150 ms: refused. */
    assert_int_equal(sw_registry_report_silent(rreg, fx_id(f, 0), 5000, "said silent"), SW_EBUSY);
    assert_int_equal(sw_registry_report_silent(rreg, fx_id(f, 0), -1, "x"), SW_EINVAL);
    assert_int_equal(sw_registry_report_silent(rreg, "nosuch", 0, "x"), SW_ENOTFOUND);
    swh_sleep_ms(T(200));
    assert_int_equal(evlog_count(l, SW_REGISTRY_REMOVED, fx_id(f, 0), 0), 0);
    assert_true(listed(rreg, NULL, fx_id(f, 0), NULL));
    /* Silent for 0 ms: nothing contradicts it; accepted (a keep-alive landing
     * in between makes it SW_EBUSY: retry as a reporter would). */
    for (int tries = 0; tries < 50 && rv == SW_EBUSY; tries++) {
        if (tries > 0)
            swh_sleep_ms(10); /* let the view apply the refresh */
        rv = sw_registry_report_silent(rreg, fx_id(f, 0), 0, "silent now");
    }
    assert_int_equal(rv, SW_OK);
    assert_true(evlog_wait(l, SW_REGISTRY_REMOVED, fx_id(f, 0), 0, T(2000)) >= 0);
}

/* A refused report is not forgotten: it is written when the entry then goes
 * a whole lease without a refresh in the reporter's view (a watch that
 * lagged behind the store made a dead worker look refreshed, and the
 * entry stayed in the store for every router started later: issue 14's
 * "worker killed: it leaves the registry"). While the worker refreshes,
 * nothing is written. */
static void
refused_report_written_when_lease_lapses(void **state)
{
    fx *f = *state;
    sw_registry *wreg = fx_reg(f, 0, 600, 0);
    sw_registry *rreg = fx_reg(f, 1, 600, 0);
    sw_registry *late;
    sw_registry_stats st;
    evlog *l = &f->log[0];
    uint64_t rev0;

    fx_worker(f, 0, EP1);
    assert_int_equal(sw_registry_register(wreg, &f->rg[0]), SW_OK);
    assert_int_equal(sw_registry_watch(rreg, on_event, l, NULL), SW_OK);
    assert_true(evlog_wait(l, SW_REGISTRY_ADDED, fx_id(f, 0), 0, T(2000)) >= 0);
    rev0 = wait_revision_above(rreg, fx_id(f, 0), 0, T(2000));
    assert_true(wait_revision_above(rreg, fx_id(f, 0), rev0, T(3000)) > rev0);
    assert_int_equal(sw_registry_report_silent(rreg, fx_id(f, 0), 5000, "said silent"), SW_EBUSY);
    /* Alive: two leases, nothing written. */
    swh_sleep_ms(1200);
    sw_registry_stats_get(rreg, &st);
    assert_int_equal(st.dead_reports_sent, 0);
    assert_int_equal(st.dead_reports_refused, 1);
    assert_int_equal(evlog_count(l, SW_REGISTRY_REMOVED, fx_id(f, 0), 0), 0);
    /* Refused again, then the worker stops: its lease lapses here and the
     * report is written. */
    assert_int_equal(sw_registry_report_silent(rreg, fx_id(f, 0), 5000, "said silent"), SW_EBUSY);
    fx_reg_close(f, 0);
    assert_true(evlog_wait(l, SW_REGISTRY_REMOVED, fx_id(f, 0), 0, T(600 + 2000)) >= 0);
    for (int i = 0; i < 100; i++) {
        sw_registry_stats_get(rreg, &st);
        if (st.dead_reports_sent == 1)
            break;
        swh_sleep_ms(20);
    }
    assert_int_equal(st.dead_reports_sent, 1);
    /* A router started now finds the tombstone, not a live entry. */
    late = fx_reg(f, 2, 600, 0);
    assert_false(listed(late, NULL, fx_id(f, 0), NULL));
}

typedef struct report_call {
    swr_pool *pool;
    const char *id;
    int64_t took_ms;
} report_call;

static void *
report_thread(void *arg)
{
    report_call *rc = arg;
    int64_t t0 = now_ms();
    swr_pool_report(rc->pool, rc->id, "slow store test", 0);
    rc->took_ms = now_ms() - t0;
    return NULL;
}

/* Issue 11 #8: a dead report is written from the pool's own thread. With a
 * store whose writes take 2 s, the caller (a router's timer or probe-reply
 * thread) returns at once; before, it waited for the write. */
static void
pool_report_does_not_block(void **state)
{
    fx *f = *state;
    sw_registry *wreg, *rreg;
    swr_pool *pool = NULL;
    swr_pool_opts po;
    report_call rc;
    pthread_t th;
    lag_setup(f, 2000); /* writes from any thread but this one take 2 s */
    wreg = fx_reg(f, 0, 0, 0);
    rreg = fx_reg(f, 1, 0, 0);
    fx_worker(f, 0, EP1);
    assert_int_equal(sw_registry_register(wreg, &f->rg[0]), SW_OK);
    memset(&po, 0, sizeof(po));
    po.registry = rreg;
    po.quarantine_ms = 1000;
    assert_int_equal(swr_pool_create(&pool, &po), SW_OK);
    rc.pool = pool;
    rc.id = fx_id(f, 0);
    rc.took_ms = -1;
    assert_int_equal(pthread_create(&th, NULL, report_thread, &rc), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    print_message("swr_pool_report returned after %lld ms (store writes take 2000 ms)\n",
                  (long long)rc.took_ms);
    assert_true(rc.took_ms >= 0 && rc.took_ms < 500);
    swr_pool_destroy(pool); /* waits for the write in flight */
}

/* Worker 0 registered through a writer handle with `wops` (NULL: plain),
 * refreshing every refresh_ms (0: a third of the lease), and watched by a
 * reader handle with `rops`, both with lease_ms; waits until the reader
 * sees it. *wreg, *rreg: the handles. */
static void
watched_worker(fx *f, const sw_registry_backend *wops, const sw_registry_backend *rops,
               unsigned lease_ms, unsigned refresh_ms, sw_registry **wreg, sw_registry **rreg,
               evlog *l)
{
    f->ops = wops;
    *wreg = fx_reg(f, 0, lease_ms, refresh_ms);
    f->ops = rops;
    *rreg = fx_reg(f, 1, lease_ms, 0);
    f->ops = NULL;
    fx_worker(f, 0, EP1);
    assert_int_equal(sw_registry_register(*wreg, &f->rg[0]), SW_OK);
    assert_int_equal(sw_registry_watch(*rreg, on_event, l, NULL), SW_OK);
    assert_true(evlog_wait(l, SW_REGISTRY_ADDED, fx_id(f, 0), 0, T(2000)) >= 0);
}

/* Five leases of a fault, after which the entry is still live. */
static void
five_leases_still_live(fx *f, sw_registry *rreg, evlog *l)
{
    swh_sleep_ms(3000);
    assert_int_equal(evlog_count(l, SW_REGISTRY_REMOVED, fx_id(f, 0), 0), 0);
    assert_true(listed(rreg, NULL, fx_id(f, 0), NULL));
}

/* The store itself goes down (a JetStream cluster electing the bucket's
 * leader: every keep-alive write fails). Lapsed entries are held while it
 * does not answer, instead of every router dropping every instance at once
 * (issue 14: new requests got no_instances for 13-15 s); once it answers,
 * a worker that really stopped is removed by its lease as usual. The
 * wrapper fails writes and pings while g_store_down. */
static const sw_registry_backend *g_flaky_inner;
static atomic_int g_store_down;
static atomic_int g_down_put_ms; /* how long a write takes to fail while down */

static sw_err
flaky_put(void *st, const char *key, const uint8_t *val, size_t len, uint64_t exp, uint64_t *rev)
{
    if (atomic_load(&g_store_down)) {
        if (atomic_load(&g_down_put_ms) > 0)
            swh_sleep_ms(atomic_load(&g_down_put_ms));
        return SW_ETIMEDOUT;
    }
    return g_flaky_inner->put(st, key, val, len, exp, rev);
}

static sw_err
flaky_ping(void *st)
{
    if (atomic_load(&g_store_down))
        return SW_ETIMEDOUT;
    return g_flaky_inner->version >= 2 && g_flaky_inner->ping ? g_flaky_inner->ping(st) : SW_OK;
}

static void
store_outage_holds_leases(void **state)
{
    fx *f = *state;
    static sw_registry_backend flaky;
    sw_registry *wreg, *rreg;
    sw_registry_stats st;
    evlog *l = &f->log[0];
    int64_t t_close;
    int i;

    g_flaky_inner = sw_registry_backend_find(f->be);
    flaky = *g_flaky_inner;
    flaky.name = "flaky";
    flaky.put = flaky_put;
    flaky.ping = flaky_ping;
    atomic_store(&g_store_down, 0);
    watched_worker(f, &flaky, &flaky, 600, 0, &wreg, &rreg, l);

    /* Down for five leases: the entry is held, not removed. */
    atomic_store(&g_store_down, 1);
    five_leases_still_live(f, rreg, l);
    sw_registry_stats_get(rreg, &st);
    assert_true(st.store_pings_failed >= 1);
    assert_int_equal(st.store_down, 1);

    /* Back: the keep-alives go through again, the entry stays. */
    atomic_store(&g_store_down, 0);
    swh_sleep_ms(T(1200));
    assert_int_equal(evlog_count(l, SW_REGISTRY_REMOVED, fx_id(f, 0), 0), 0);
    sw_registry_stats_get(rreg, &st);
    assert_int_equal(st.store_down, 0);

    /* A worker that really stops, with the store up: removed by its lease
     * as usual (the store answers the ping). */
    fx_reg_close(f, 0);
    t_close = now_ms();
    i = evlog_wait(l, SW_REGISTRY_REMOVED, fx_id(f, 0), 0, T(600 + 2000));
    assert_true(i >= 0);
    print_message("    store up: removed %lld ms after the writer closed\n",
                  (long long)(evlog_get(l, i).t - t_close));
    assert_false(listed(rreg, NULL, fx_id(f, 0), NULL));
}

/* A pool stopped (its router destroyed) while dead reports wait and the
 * store fails, each write after 1.5 s: the stop waits for the write in
 * flight and tries one more, then gives up on the rest (logged), and the
 * registry is not used after it returns. Before, the destroy waited for
 * every queued report to fail in turn: 8 x 1.5 s here (minutes for a
 * router that lost 20 instances in a JetStream outage). */
static void
pool_stop_gives_up_on_a_failing_store(void **state)
{
    fx *f = *state;
    static sw_registry_backend flaky;
    sw_registry *wreg, *rreg;
    swr_pool *pool = NULL;
    swr_pool_opts po;
    evlog *l = &f->log[0];
    int64_t t0, took;

    g_flaky_inner = sw_registry_backend_find(f->be);
    flaky = *g_flaky_inner;
    flaky.name = "flaky";
    flaky.put = flaky_put;
    flaky.ping = flaky_ping;
    atomic_store(&g_store_down, 0);
    atomic_store(&g_down_put_ms, 1500);
    watched_worker(f, &flaky, &flaky, 3000, 0, &wreg, &rreg, l);
    memset(&po, 0, sizeof(po));
    po.registry = rreg;
    po.quarantine_ms = 1000;
    assert_int_equal(swr_pool_create(&pool, &po), SW_OK);
    atomic_store(&g_store_down, 1);
    for (int i = 0; i < 8; i++)
        swr_pool_report(pool, fx_id(f, 0), "failing store test", 0);
    swh_sleep_ms(100); /* the reporter thread is writing the first */
    t0 = now_ms();
    swr_pool_destroy(pool);
    took = now_ms() - t0;
    atomic_store(&g_store_down, 0);
    atomic_store(&g_down_put_ms, 0);
    print_message("    pool destroyed after %lld ms (8 reports queued, writes fail after 1500 "
                  "ms)\n",
                  (long long)took);
    assert_true(took < 6000); /* (two writes: ~3 s; all eight: 12 s) */
}

/* Our own watch goes blind (after a reconnect, a new KV watcher can take
 * seconds to deliver) while the store and the workers are fine: before an
 * entry is expired on that silence, the store is read again, and a worker
 * that kept refreshing stays live (issue 14: no_instances for 4-12 s after
 * the gateway's node came back). One that stopped is still removed. */
static atomic_int g_watch_muted;
typedef struct muted_watch {
    sw_registry_entry_fn fn;
    void *arg;
    void *inner;
} muted_watch;

static void
muted_fn(void *arg, const sw_registry_entry *e, int deleted)
{
    muted_watch *m = arg;
    if (!atomic_load(&g_watch_muted))
        m->fn(m->arg, e, deleted);
}

static sw_err
muted_watch_add(void *st, sw_registry_entry_fn fn, void *arg, void **w)
{
    muted_watch *m = calloc(1, sizeof(*m));
    sw_err rv;
    if (m == NULL)
        return SW_ENOMEM;
    m->fn = fn;
    m->arg = arg;
    if ((rv = g_flaky_inner->watch(st, muted_fn, m, &m->inner)) != SW_OK) {
        free(m);
        return rv;
    }
    *w = m;
    return SW_OK;
}

static void
muted_unwatch(void *st, void *w)
{
    muted_watch *m = w;
    g_flaky_inner->unwatch(st, m->inner);
    free(m);
}

static void
blind_watch_reads_the_store(void **state)
{
    fx *f = *state;
    static sw_registry_backend muted;
    sw_registry *wreg, *rreg;
    evlog *l = &f->log[0];

    g_flaky_inner = sw_registry_backend_find(f->be);
    muted = *g_flaky_inner;
    muted.name = "muted";
    muted.watch = muted_watch_add;
    muted.unwatch = muted_unwatch;
    if (muted.version < 2 || muted.ping == NULL)
        muted.ping = flaky_ping;
    muted.version = SW_REGISTRY_BACKEND_VERSION;
    atomic_store(&g_store_down, 0);
    atomic_store(&g_watch_muted, 0);
    watched_worker(f, NULL, &muted, 600, 0, &wreg, &rreg, l);

    /* Blind for five leases; the worker keeps refreshing: still live. */
    atomic_store(&g_watch_muted, 1);
    five_leases_still_live(f, rreg, l);

    /* Still blind, and the worker stops: removed by its lease. */
    fx_reg_close(f, 0);
    assert_true(evlog_wait(l, SW_REGISTRY_REMOVED, fx_id(f, 0), 0, T(600 + 2000)) >= 0);
    atomic_store(&g_watch_muted, 0);
}

/* TSan's runtime has a thread of its own that wakes every ~100 ms once the
 * process has a second thread: wake-ups are not counted under it. */
#if defined(__SANITIZE_THREAD__)
#define WAKEUPS_COUNTED 0
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define WAKEUPS_COUNTED 0
#endif
#endif
#ifndef WAKEUPS_COUNTED
#define WAKEUPS_COUNTED 1
#endif

/* Wake-ups of this process's threads so far: the sum of their voluntary
 * context switches (/proc/self/task/<tid>/status), or -1. A count, not a
 * time: it does not depend on how busy the machine is. */
static long long
wakeups(void)
{
    DIR *d = opendir("/proc/self/task");
    struct dirent *de;
    long long sum = 0;
    if (d == NULL)
        return -1;
    while ((de = readdir(d)) != NULL) {
        char path[300], line[128];
        FILE *f;
        if (de->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "/proc/self/task/%s/status", de->d_name);
        if ((f = fopen(path, "r")) == NULL)
            continue; /* (the thread ended) */
        while (fgets(line, sizeof(line), f) != NULL) {
            long long v;
            if (sscanf(line, "voluntary_ctxt_switches: %lld", &v) == 1)
                sum += v;
        }
        fclose(f);
    }
    closedir(d);
    return sum;
}

/* An idle handle's ticker rests until something falls due (issue 17: no
 * poll loops in an idle path; it used to look 20 times a second, 0.275 %
 * of a core for an empty registry), and a sighting that brings a deadline
 * before the rest's end cuts it short: a short-leased entry that appears
 * while a handle with no watcher rests still lapses on time. */
static void
idle_registry_rests(void **state)
{
    fx *f = *state;
    long long base0 = wakeups(), base;
    sw_registry *rreg, *wreg, *sreg;
    uint64_t a, b;
    int64_t t0, t_gone;

    /* Nothing in the store: at most a look a second, and the process (the
     * connection, the registry's ticker and, on nats-kv, its watch) wakes
     * a few times in all. The KV watch waited 50 ms at a time in nats.c's
     * synchronous kvWatcher_Next, to look at its stop flag: 40 wake-ups in
     * 2 s, and 40 more for the ticker. */
    swh_sleep_ms(2000); /* the process without it */
    base = wakeups() - base0;
    rreg = fx_reg(f, 1, 3000, 0);
    swh_sleep_ms(200);
    {
        long long w0 = wakeups(), w1;
        a = swx_registry_ticks(rreg);
        swh_sleep_ms(2000);
        b = swx_registry_ticks(rreg);
        w1 = wakeups();
        print_message("    empty registry: %llu looks, %lld wake-ups of the process in 2 s "
                      "(%lld without it)\n",
                      (unsigned long long)(b - a), w1 - w0, base);
        assert_in_range(b - a, 1, 4);
        if (WAKEUPS_COUNTED)
            assert_true(base0 >= 0 && w1 - w0 <= base + 12);
    }

    /* A worker refreshing every 1000 ms in a 3000 ms lease: its own handle
     * looks for the refreshes, the router's for nothing much. */
    wreg = fx_reg(f, 0, 3000, 1000);
    fx_worker(f, 0, EP1);
    assert_int_equal(sw_registry_register(wreg, &f->rg[0]), SW_OK);
    assert_true(wait_listed(rreg, fx_id(f, 0), 1, T(2000)));
    swh_sleep_ms(200);
    a = swx_registry_ticks(rreg);
    {
        uint64_t wa = swx_registry_ticks(wreg), wb;
        swh_sleep_ms(3000);
        wb = swx_registry_ticks(wreg);
        b = swx_registry_ticks(rreg);
        print_message("    one entry: %llu looks (worker), %llu (router) in 3 s\n",
                      (unsigned long long)(wb - wa), (unsigned long long)(b - a));
        assert_in_range(wb - wa, 2, 8);
        assert_in_range(b - a, 2, 6);
    }
    assert_true(listed(rreg, NULL, fx_id(f, 0), NULL));

    /* Just after a look, the router's handle rests ~1 s. A worker with a
     * 300 ms lease registers and stops at once: its entry lapses ~300 ms
     * after its one sighting, not at the end of that rest. */
    a = swx_registry_ticks(rreg);
    while ((b = swx_registry_ticks(rreg)) == a)
        swh_sleep_ms(1);
    t0 = now_ms();
    sreg = fx_reg(f, 2, 300, 100);
    fx_worker(f, 1, EP1);
    assert_int_equal(sw_registry_register(sreg, &f->rg[1]), SW_OK);
    fx_reg_close(f, 2);
    assert_true(wait_listed(rreg, fx_id(f, 1), 1, T(2000)));
    assert_true(wait_listed(rreg, fx_id(f, 1), 0, T(3000)));
    t_gone = now_ms() - t0;
    print_message("    lease 300 ms, seen in a rest: gone %lld ms after it registered\n",
                  (long long)t_gone);
    assert_true(t_gone >= 250);
    assert_true(t_gone < 800);
}

#ifndef SW_REGISTRY_MEMORY_ONLY
/* nats-kv: the watch's consumer, deleted on the server (an operator, a
 * JetStream that lost it) while the connection stays up, sends no more
 * heartbeats: the watch makes a new one after three missed (5 s apart),
 * and an entry written meanwhile is seen then. */
static void
watch_remade_when_consumer_deleted(void **state)
{
    fx *f = *state;
    sw_registry *wreg = fx_reg(f, 0, 60000, 0);
    sw_registry *rreg = fx_reg(f, 1, 60000, 0);
    evlog *l = &f->log[0];
    jsCtx *js = NULL;
    jsConsumerNamesList *names = NULL;
    char stream[SW_MAX_TOKEN + 8];
    int64_t t0, took;
    assert_int_equal(sw_registry_watch(rreg, on_event, l, NULL), SW_OK);
    fx_worker(f, 0, EP1);
    fx_worker(f, 1, EP1);
    assert_int_equal(sw_registry_register(wreg, &f->rg[0]), SW_OK);
    assert_true(evlog_wait(l, SW_REGISTRY_ADDED, fx_id(f, 0), 0, T(2000)) >= 0);
    /* Both registries' watches are the bucket's only consumers now. */
    snprintf(stream, sizeof(stream), "KV_%s", f->bucket);
    assert_int_equal(natsConnection_JetStream(&js, (natsConnection *)sw_conn_nats(f->conn), NULL),
                     NATS_OK);
    assert_int_equal(js_ConsumerNames(&names, js, stream, NULL, NULL), NATS_OK);
    assert_int_equal(names->Count, 2);
    for (int i = 0; i < names->Count; i++)
        assert_int_equal(js_DeleteConsumer(js, stream, names->List[i], NULL, NULL), NATS_OK);
    jsConsumerNamesList_Destroy(names);
    t0 = now_ms();
    assert_int_equal(sw_registry_register(wreg, &f->rg[1]), SW_OK);
    /* Cut off: not seen at once... */
    swh_sleep_ms(1000);
    assert_int_equal(evlog_count(l, SW_REGISTRY_ADDED, fx_id(f, 1), 0), 0);
    /* ...but once the heartbeats are missed (10-15 s after the last one). */
    assert_true(evlog_wait(l, SW_REGISTRY_ADDED, fx_id(f, 1), 0, T(25000)) >= 0);
    took = now_ms() - t0;
    print_message("    seen %lld ms after its consumer was deleted\n", (long long)took);
    assert_true(took >= 5000);
    jsCtx_Destroy(js);
}

/* The writer of watch_closes_while_receiving: puts as fast as the store
 * answers until told to stop. */
typedef struct stress_writer {
    const sw_registry_backend *be;
    void *st;
    atomic_int stop;
    atomic_int puts;
} stress_writer;

static void *
stress_writer_main(void *p)
{
    stress_writer *w = p;
    char key[32];
    for (unsigned i = 0; !atomic_load(&w->stop); i++) {
        snprintf(key, sizeof(key), "zz.stress%u", i % 16);
        if (w->be->put(w->st, key, (const uint8_t *)"x", 1, 0, NULL) == SW_OK)
            atomic_fetch_add(&w->puts, 1);
    }
    return NULL;
}

/* nats-kv: watches and lists are opened and closed on a connection while
 * their consumers receive, and lists end while the bucket is written. nats.c 3.4.1's read loop used
 * a subscription it had looked up without a reference, so removing one that was receiving could
 * free it under the loop, which then waited forever on a freed lock (the connection's close waits
 * for the loop: test_registry hung so in CI, under ASan, with the watch on nats.c's own JetStream
 * consumer). The watchdog covers the closes, the connection's in teardown too. */
static void
watch_closes_while_receiving(void **state)
{
    fx *f = *state;
    stress_writer w;
    pthread_t t;
    int rounds = 0, puts0;
    int64_t until;
    memset(&w, 0, sizeof(w));
    w.be = sw_registry_backend_find(f->be);
    assert_non_null(w.be);
    f->raw_be[0] = w.be;
    assert_int_equal(w.be->open(&f->raw_state[0], f->conn, f->bucket, 60000), SW_OK);
    w.st = f->raw_state[0];
    watchdog_start("watch_closes_while_receiving",
                   "a watch or list closed while receiving hung the connection's read loop",
                   T(60000));
    assert_int_equal(pthread_create(&t, NULL, stress_writer_main, &w), 0);
    while (atomic_load(&w.puts) < 16)
        swh_sleep_ms(1);
    until = now_ms() + 3000;
    while (now_ms() < until || rounds < 20) {
        sw_registry *reg = fx_reg(f, 1, 0, 0);
        puts0 = atomic_load(&w.puts);
        /* opened: it listed, and its watch receives the writer's puts */
        while (atomic_load(&w.puts) < puts0 + 1 + rounds % 8)
            swh_sleep_ms(1);
        (void)reg;
        fx_reg_close(f, 1);
        rounds++;
    }
    /* A list ends while the values it reads are being written (each
     * delivery's count of values left then includes the new ones, and
     * need not fall to 0 while they come), with every key in it. */
    for (int k = 0; k < 5; k++) {
        key_chk c;
        int64_t t0 = now_ms();
        memset(&c, 0, sizeof(c));
        c.key = "zz.stress15";
        assert_int_equal(w.be->list(w.st, key_chk_cb, &c), SW_OK);
        assert_true(c.present);
        assert_true(now_ms() - t0 < T(3000));
    }
    atomic_store(&w.stop, 1);
    pthread_join(t, NULL);
    print_message("    %d watches opened and closed under %d puts\n", rounds, atomic_load(&w.puts));
    assert_true(atomic_load(&w.puts) > rounds);
    /* the store still answers, on the same connection */
    {
        sw_registry *reg = fx_reg(f, 1, 0, 0);
        fx_worker(f, 0, EP1);
        assert_int_equal(sw_registry_register(reg, &f->rg[0]), SW_OK);
        assert_true(wait_listed(reg, fx_id(f, 0), 1, T(2000)));
    }
    /* teardown closes the connection; the watchdog stops after it */
}
#endif

#ifndef SW_REGISTRY_MEMORY_ONLY
/* nats-kv: the watch, an asynchronous ordered consumer, follows the store
 * across a restart of the server: a live worker is not lost meanwhile, and
 * an entry written after it comes back is seen. (Last: it restarts the
 * suite's server.) */
static void
watch_survives_server_restart(void **state)
{
    fx *f = *state;
    sw_registry *wreg, *rreg;
    evlog *l = &f->log[0];
    int i;

    watched_worker(f, NULL, NULL, 4000, 500, &wreg, &rreg, l);
    assert_int_equal(swh_nats_restart(&g_nats, 500), 0);
    /* A second worker registers once the connection is back. */
    for (i = 0; i < 100 && sw_conn_status(f->conn) != SW_CONN_CONNECTED; i++)
        swh_sleep_ms(50);
    assert_int_equal(sw_conn_status(f->conn), SW_CONN_CONNECTED);
    fx_worker(f, 1, EP1);
    {
        int64_t t0 = now_ms();
        sw_err rv;
        while ((rv = sw_registry_register(wreg, &f->rg[1])) != SW_OK && now_ms() - t0 < T(5000))
            swh_sleep_ms(100); /* JetStream may need a moment after the restart */
        assert_int_equal(rv, SW_OK);
    }
    i = evlog_wait(l, SW_REGISTRY_ADDED, fx_id(f, 1), 0, T(5000));
    assert_true(i >= 0);
    assert_true(listed(rreg, NULL, fx_id(f, 0), NULL));
    assert_true(listed(rreg, NULL, fx_id(f, 1), NULL));
    assert_int_equal(evlog_count(l, SW_REGISTRY_REMOVED, fx_id(f, 0), 0), 0);
    /* And it goes on: a deregistration is seen too. */
    assert_int_equal(sw_registry_deregister(wreg, fx_id(f, 1)), SW_OK);
    assert_true(evlog_wait(l, SW_REGISTRY_REMOVED, fx_id(f, 1), 0, T(3000)) >= 0);
    assert_true(listed(rreg, NULL, fx_id(f, 0), NULL));
}
#endif

/* One entry per (test, backend): "name [backend]". */
/* A backend whose list hands its values over late: only after the key it
 * was told of has been deleted and the registry's watch has delivered that
 * delete (a list's thread slower than the watch's, as when a list meets a
 * slow server). */
#define STALE_MAX 16
typedef struct stale_watch {
    sw_registry_entry_fn fn;
    void *arg;
    void *inner;
} stale_watch;
typedef struct stale_entry {
    char key[256];
    uint8_t val[2048];
    size_t len;
    uint64_t rev;
    int64_t created;
} stale_entry;
typedef struct stale_list_acc {
    stale_entry e[STALE_MAX];
    int n;
} stale_list_acc;
static char g_stale_key[256];
static atomic_int g_stale_del_seen, g_stale_replayed, g_stale_lists;

static void
stale_on_entry(void *arg, const sw_registry_entry *e, int deleted)
{
    stale_watch *w = arg;
    w->fn(w->arg, e, deleted);
    if (deleted && strcmp(e->key, g_stale_key) == 0)
        atomic_store(&g_stale_del_seen, 1);
}
static sw_err
stale_watch_fn(void *st, sw_registry_entry_fn fn, void *arg, void **out)
{
    stale_watch *w = calloc(1, sizeof(*w));
    sw_err rv;
    if (w == NULL)
        return SW_ENOMEM;
    w->fn = fn;
    w->arg = arg;
    if ((rv = g_inner->watch(st, stale_on_entry, w, &w->inner)) != SW_OK) {
        free(w);
        return rv;
    }
    *out = w;
    return SW_OK;
}
static void
stale_unwatch(void *st, void *wv)
{
    stale_watch *w = wv;
    g_inner->unwatch(st, w->inner);
    free(w);
}
static void
stale_collect(void *arg, const sw_registry_entry *e, int deleted)
{
    stale_list_acc *a = arg;
    stale_entry *x;
    if (deleted || a->n == STALE_MAX || e->len > sizeof(x->val))
        return;
    x = &a->e[a->n++];
    snprintf(x->key, sizeof(x->key), "%s", e->key);
    memcpy(x->val, e->value, e->len);
    x->len = e->len;
    x->rev = e->revision;
    x->created = e->created_unix_ms;
}
static sw_err
stale_list(void *st, sw_registry_entry_fn fn, void *arg)
{
    stale_list_acc *a = calloc(1, sizeof(*a));
    int64_t until = now_ms() + T(5000);
    sw_err rv;
    if (atomic_fetch_add(&g_stale_lists, 1) > 0) {
        free(a); /* a later list (the store's health check): as it is */
        return g_inner->list(st, fn, arg);
    }
    if (a == NULL)
        return SW_ENOMEM;
    if ((rv = g_inner->list(st, stale_collect, a)) != SW_OK) {
        free(a);
        return rv;
    }
    /* The key goes; its delete reaches the registry through the watch. */
    (void)g_inner->del(st, g_stale_key);
    while (!atomic_load(&g_stale_del_seen) && now_ms() < until)
        swh_sleep_ms(5);
    for (int i = 0; i < a->n; i++) {
        sw_registry_entry e = {a->e[i].key, a->e[i].val, a->e[i].len, a->e[i].rev, a->e[i].created};
        fn(arg, &e, 0);
        if (strcmp(a->e[i].key, g_stale_key) == 0)
            atomic_fetch_add(&g_stale_replayed, 1);
    }
    free(a);
    return SW_OK;
}

static const sw_registry_backend stale_backend = {
    .name = "stale-list",
    .version = SW_REGISTRY_BACKEND_VERSION,
    .open = lag_open,
    .close = lag_close,
    .put = lag_put,
    .del = lag_del,
    .list = stale_list,
    .watch = stale_watch_fn,
    .unwatch = stale_unwatch,
};

/* A value a list read before its key was deleted, delivered after the
 * watch delivered the delete: the entry must stay gone. The registry used
 * to forget a deleted key with its revision, and took the late value as a
 * new entry: live for a lease, every router routing to it (session 30's
 * note). */
static void
stale_list_after_delete(void **state)
{
    fx *f = *state;
    uint64_t rev = 0;
    sw_registry *reg;
    evlog *l = &f->log[0];

    lag_setup(f, 0);
    f->ops = &stale_backend;
    snprintf(g_stale_key, sizeof(g_stale_key), "%s.stale1", EP1);
    raw_put_entry(f, "stale1", 60000, &rev, NULL, NULL); /* (only the delete ends it in time) */
    atomic_store(&g_stale_del_seen, 0);
    atomic_store(&g_stale_replayed, 0);
    atomic_store(&g_stale_lists, 0);

    reg = fx_reg(f, 0, 3000, 0); /* its list: read, delete, delete delivered, values handed over */
    assert_int_equal(atomic_load(&g_stale_del_seen), 1);
    assert_int_equal(atomic_load(&g_stale_replayed), 1);
    assert_int_equal(sw_registry_watch(reg, on_event, l, NULL), SW_OK);
    swh_sleep_ms(T(200));
    if (listed(reg, NULL, "stale1", NULL))
        fail_msg("a value listed before its key was deleted, delivered after the delete, "
                 "brought the entry back");
    assert_int_equal(evlog_count(l, SW_REGISTRY_ADDED, "stale1", 0), 0);
    /* A later registration under the key (a newer revision) still counts. */
    raw_put_entry(f, "stale1", 60000, &rev, NULL, NULL);
    assert_true(evlog_wait(l, SW_REGISTRY_ADDED, "stale1", 0, T(2000)) >= 0);
    assert_true(wait_listed(reg, "stale1", 1, T(2000)));
    assert_int_equal(l->bad, 0);
}

/* A router's pool seeds its table from a list taken after its watch began.
 * An instance that goes after that list (its REMOVED queued for the pool)
 * must stay gone: the pool used to seed after letting go of its lock, so
 * the registry's thread could deliver the REMOVED first and the seed then
 * put the instance back for good (routed to until a quarantine). The hook
 * runs between the list and the seed: the instance is deregistered there,
 * and the registry's thread is given time to deliver. */
typedef struct seed_race {
    fx *f;
    sw_registry *wreg, *rreg;
    int ran;
} seed_race;
static void
seed_race_hook(void *arg)
{
    seed_race *x = arg;
    x->ran = 1;
    assert_int_equal(sw_registry_deregister(x->wreg, fx_id(x->f, 0)), SW_OK);
    (void)wait_listed(x->rreg, fx_id(x->f, 0), 0, T(2000));
    swh_sleep_ms(T(300)); /* (the old code: the REMOVED reaches the table now) */
}
static void
pool_seed_not_undone_by_events(void **state)
{
    fx *f = *state;
    seed_race x = {f, fx_reg(f, 0, 0, 0), fx_reg(f, 1, 0, 0), 0};
    swr_pool_opts o;
    swr_pool *p = NULL;
    char out[SW_MAX_TOKEN + 1];

    fx_worker(f, 0, EP1);
    assert_int_equal(sw_registry_register(x.wreg, &f->rg[0]), SW_OK);
    assert_true(wait_listed(x.rreg, fx_id(f, 0), 1, T(2000)));
    memset(&o, 0, sizeof(o));
    o.registry = x.rreg;
    swx_pool_on_seed(seed_race_hook, &x);
    assert_int_equal(swr_pool_create(&p, &o), SW_OK);
    swx_pool_on_seed(NULL, NULL);
    assert_true(x.ran);
    swh_sleep_ms(T(300)); /* every queued event delivered */
    if (swr_pool_pick(p, EP1, NULL, NULL, out) == SW_OK)
        fail_msg("the pool routes to %s, deregistered before the pool was seeded", out);
    swr_pool_destroy(p);
}

/* sw_registry_watch: "current live instances are reported as ADDED first".
 * A watcher added while an event for the others is queued (the ticker is
 * busy in a slow callback) must not get that event: its ADDED snapshot is
 * taken after the change. It used to: a REMOVED for an instance it was
 * never told of. */
static void
new_watcher_skips_queued_events(void **state)
{
    fx *f = *state;
    sw_registry *wreg = fx_reg(f, 0, 0, 0);
    sw_registry *rreg = fx_reg(f, 1, 0, 0);
    evlog *a = &f->log[0], *b = &f->log[1];

    fx_worker(f, 0, EP1);
    fx_worker(f, 1, EP1);
    assert_int_equal(sw_registry_register(wreg, &f->rg[0]), SW_OK);
    assert_int_equal(sw_registry_register(wreg, &f->rg[1]), SW_OK);
    assert_true(wait_listed(rreg, fx_id(f, 0), 1, T(2000)));
    assert_true(wait_listed(rreg, fx_id(f, 1), 1, T(2000)));
    /* A's callbacks are slow: the ticker is inside the first of them. */
    pthread_mutex_lock(&a->mu);
    a->cb_sleep_ms = (int)T(600);
    pthread_mutex_unlock(&a->mu);
    assert_int_equal(sw_registry_watch(rreg, on_event, a, NULL), SW_OK);
    assert_true(evlog_wait(a, SW_REGISTRY_ADDED, NULL, 0, T(2000)) >= 0);
    /* Meanwhile instance 0 goes: its REMOVED waits behind A's callbacks. */
    assert_int_equal(sw_registry_deregister(wreg, fx_id(f, 0)), SW_OK);
    assert_true(wait_listed(rreg, fx_id(f, 0), 0, T(2000)));
    /* B comes after the change: it is told of instance 1 only. */
    assert_int_equal(sw_registry_watch(rreg, on_event, b, NULL), SW_OK);
    assert_true(evlog_wait(b, SW_REGISTRY_ADDED, fx_id(f, 1), 0, T(5000)) >= 0);
    assert_true(evlog_wait(a, SW_REGISTRY_REMOVED, fx_id(f, 0), 0, T(5000)) >= 0);
    pthread_mutex_lock(&a->mu);
    a->cb_sleep_ms = 0;
    pthread_mutex_unlock(&a->mu);
    swh_sleep_ms(T(200));
    if (evlog_count(b, 0, fx_id(f, 0), 0) != 0)
        fail_msg("a watcher added after instance 0 went got an event for it (a REMOVED "
                 "queued before it watched)");
    assert_int_equal(evlog_count(b, SW_REGISTRY_ADDED, fx_id(f, 1), 0), 1);
    assert_int_equal(evlog_n(b), 1);
    assert_int_equal(a->bad, 0);
    assert_int_equal(b->bad, 0);
}

/* An instance reported dead and registered again before the watchers
 * were told of it at all is one ADDED, not ADDED, REMOVED, ADDED: the
 * REMOVED of a live instance made the router's pool take it out and
 * probe it (review of 49cbb73, which marked such an entry as owing a
 * REMOVED it was never told the ADDED of). The watcher's first callback is
 * slow, so the changes wait behind it. */
static void
lapse_before_told_is_not_removed(void **state)
{
    fx *f = *state;
    sw_registry *wreg = fx_reg(f, 0, 0, 0);
    sw_registry *rreg = fx_reg(f, 1, 0, 0);
    evlog *a = &f->log[0];

    fx_worker(f, 0, EP1);
    fx_worker(f, 1, EP1);
    assert_int_equal(sw_registry_register(wreg, &f->rg[0]), SW_OK);
    assert_true(wait_listed(rreg, fx_id(f, 0), 1, T(2000)));
    pthread_mutex_lock(&a->mu);
    a->cb_sleep_ms = (int)T(800);
    pthread_mutex_unlock(&a->mu);
    assert_int_equal(sw_registry_watch(rreg, on_event, a, NULL), SW_OK);
    assert_true(evlog_wait(a, SW_REGISTRY_ADDED, fx_id(f, 0), 0, T(2000)) >= 0);
    /* The ticker is inside that callback: instance 1 comes, is reported
     * dead, and registers again (its worker sees the tombstone). */
    assert_int_equal(sw_registry_register(wreg, &f->rg[1]), SW_OK);
    assert_true(wait_listed(rreg, fx_id(f, 1), 1, T(2000)));
    assert_int_equal(sw_registry_report_dead(rreg, fx_id(f, 1), 0, "test"), SW_OK);
    assert_true(wait_listed(rreg, fx_id(f, 1), 1, T(2000)));
    pthread_mutex_lock(&a->mu);
    a->cb_sleep_ms = 0;
    pthread_mutex_unlock(&a->mu);
    assert_true(evlog_wait(a, SW_REGISTRY_ADDED, fx_id(f, 1), 0, T(3000)) >= 0);
    swh_sleep_ms(T(300));
    assert_int_equal(evlog_count(a, SW_REGISTRY_REMOVED, fx_id(f, 1), 0), 0);
    assert_int_equal(evlog_count(a, SW_REGISTRY_ADDED, fx_id(f, 1), 0), 1);
    assert_int_equal(a->bad, 0);
}

/* A watch that keeps the registry's callback where the test can call it:
 * to deliver an old value again, as a KV watch made again after a gap or a
 * reconnect does (deliver last per subject). */
static sw_registry_entry_fn g_replay_fn;
static void *g_replay_arg;
static sw_err
replay_watch(void *st, sw_registry_entry_fn fn, void *arg, void **out)
{
    g_replay_fn = fn;
    g_replay_arg = arg;
    return g_inner->watch(st, fn, arg, out);
}
static const sw_registry_backend replay_backend = {
    .name = "replay",
    .version = SW_REGISTRY_BACKEND_VERSION,
    .open = lag_open,
    .close = lag_close,
    .put = lag_put,
    .del = lag_del,
    .list = lag_list,
    .watch = replay_watch,
    .unwatch = lag_unwatch,
};

/* A worker that died unreported: its entry lapses (REMOVED) and, 20 of its
 * leases later, the view forgets it, while its last value stays in the
 * store until the bucket's max age (60 s here). That value delivered again
 * (a watch made again replays the last value of every key) must not bring
 * the dead worker back: the registry used to take it as a first sighting,
 * live for a lease, ADDED to every watcher, routed to. */
static void
forgotten_entry_replayed_stays_dead(void **state)
{
    fx *f = *state;
    uint8_t *enc = NULL;
    size_t enc_len = 0;
    uint64_t rev = 0;
    char key[256];
    sw_registry *reg;
    evlog *l = &f->log[0];

    lag_setup(f, 0);
    g_replay_fn = NULL;
    f->ops = &replay_backend;
    snprintf(key, sizeof(key), "%s.gone1", EP1);
    /* forgotten 20 leases (2 s) after its last refresh */
    raw_put_entry(f, "gone1", 100, &rev, &enc, &enc_len);

    reg = fx_reg(f, 0, 3000, 0);
    assert_non_null(g_replay_fn);
    assert_int_equal(sw_registry_watch(reg, on_event, l, NULL), SW_OK);
    assert_true(evlog_wait(l, SW_REGISTRY_REMOVED, "gone1", 0, T(3000)) >= 0);
    swh_sleep_ms(2000 + T(1000)); /* forgotten (the ticker's pass after 2 s) */
    {
        sw_registry_entry e = {key, enc, enc_len, rev, 0};
        g_replay_fn(g_replay_arg, &e, 0); /* the same value, the same revision */
    }
    free(enc);
    if (listed(reg, NULL, "gone1", NULL)) /* (at once: it would lapse again in 100 ms) */
        fail_msg("a dead worker's last value, delivered again after the view forgot the "
                 "entry, brought it back live");
    swh_sleep_ms(T(200)); /* (events are delivered by the ticker) */
    assert_int_equal(evlog_count(l, SW_REGISTRY_ADDED, "gone1", 0), 1); /* the first sighting */
    assert_int_equal(l->bad, 0);
}

#ifdef SW_REGISTRY_MEMORY_ONLY
/* A router without a registry (direct routing) quarantines each instance
 * it loses; its table forgets one whose quarantine is over, as a router
 * with a registry forgets a gone instance on the next event. It used to
 * keep every instance it ever lost (instance ids are new at every worker
 * start). */
static void
pool_without_registry_bounded(void **state)
{
    swr_pool_opts o;
    swr_pool *p = NULL;
    char id[64];
    (void)state;
    memset(&o, 0, sizeof(o));
    o.quarantine_ms = (unsigned)T(300);
    assert_int_equal(swr_pool_create(&p, &o), SW_OK);
    for (int i = 0; i < 1000; i++) {
        snprintf(id, sizeof(id), "lost-%d", i);
        (void)swr_pool_quarantine(p, id);
    }
    assert_int_equal(swr_pool_size(p), 1000); /* (all still quarantined) */
    swh_sleep_ms(2 * T(300) + 50);
    /* The next loss: everything out of quarantine as long as it lasted
     * goes (until then an entry keeps its backoff, for a repeat). */
    assert_int_equal(swr_pool_quarantine(p, "lost-next"), 0); /* (no registry: no report) */
    assert_int_equal(swr_pool_size(p), 1);
    assert_true(swr_pool_quarantined(p, "lost-next"));
    assert_false(swr_pool_quarantined(p, "lost-0"));
    /* A quarantine still running is kept, with its backoff. */
    assert_int_equal(swr_pool_quarantine(p, "lost-next"), 0);
    assert_true(swr_pool_quarantined(p, "lost-next"));
    swr_pool_destroy(p);
}

/* A repeated quarantine doubles (streamwire.h quarantine_ms: "doubling on
 * repeats"): the first lasts quarantine_ms, the next, begun after it
 * lapsed, twice that. A second quarantine while one runs changes nothing. */
static void
pool_quarantine_doubles(void **state)
{
    swr_pool_opts o;
    swr_pool *p = NULL;
    int64_t q = T(200), t0;
    (void)state;
    memset(&o, 0, sizeof(o));
    o.quarantine_ms = (unsigned)q;
    assert_int_equal(swr_pool_create(&p, &o), SW_OK);
    t0 = now_ms();
    (void)swr_pool_quarantine(p, "twice");
    (void)swr_pool_quarantine(p, "twice"); /* while it runs: no change */
    assert_true(swr_pool_quarantined(p, "twice"));
    swh_sleep_ms(q + q / 4 - (now_ms() - t0));
    assert_false(swr_pool_quarantined(p, "twice")); /* the first: q */
    t0 = now_ms();
    (void)swr_pool_quarantine(p, "twice");
    swh_sleep_ms(q + q / 2 - (now_ms() - t0));
    assert_true(swr_pool_quarantined(p, "twice")); /* the second: 2 q */
    swh_sleep_ms(2 * q + q / 4 - (now_ms() - t0));
    assert_false(swr_pool_quarantined(p, "twice"));
    swr_pool_destroy(p);
}

/* The doubling stops at 30 s (streamwire.h quarantine_ms: "up to 30 s"):
 * the rule itself, since the cap takes a dozen lapsed quarantines to reach
 * (pool_quarantine_doubles shows the pool applies it). */
static void
pool_quarantine_capped(void **state)
{
    unsigned b = 0, n = 0;
    (void)state;
    assert_int_equal(SWR_QUARANTINE_MAX_MS, 30000);
    assert_int_equal(swr_pool_backoff(0, 1000), 1000);
    assert_int_equal(swr_pool_backoff(1000, 1000), 2000);
    assert_int_equal(swr_pool_backoff(16000, 1000), 30000); /* not 32 s */
    assert_int_equal(swr_pool_backoff(30000, 1000), 30000);
    assert_int_equal(swr_pool_backoff(0, 45000), 30000);       /* a longer option is cut */
    assert_int_equal(swr_pool_backoff(0xffffffffu, 1), 30000); /* no overflow */
    /* from the default: 1, 2, 4, 8, 16, then 30 s for good */
    for (int i = 0; i < 40; i++) {
        unsigned nb = swr_pool_backoff(b, 1000);
        assert_true(nb >= b && nb <= 30000);
        n += nb != b;
        b = nb;
    }
    assert_int_equal(b, 30000);
    assert_int_equal(n, 6);
}

/* A lapsed entry is held while the store does not answer for at most
 * SW_REGISTRY_HOLD_MAX_LEASES leases and 30 s at least (registry.h): the
 * rule the ticker applies, since its floor takes 30 s to watch
 * (store_outage_holds_leases shows the hold itself, for five leases). */
static void
hold_bounded(void **state)
{
    (void)state;
    assert_int_equal(SW_REGISTRY_HOLD_MAX_LEASES, 10);
    assert_int_equal(swr_reg_hold_max(600), 30000); /* 6 s: the floor */
    assert_int_equal(swr_reg_hold_max(3000), 30000);
    assert_int_equal(swr_reg_hold_max(3001), 30010);
    assert_int_equal(swr_reg_hold_max(10000), 100000);
    for (int64_t lease = 1; lease <= 1000000; lease *= 3) {
        int64_t h = swr_reg_hold_max(lease);
        assert_true(h >= 30000 && h >= lease && h <= (lease * 10 > 30000 ? lease * 10 : 30000));
    }
}

/* The deletes the view remembers are bounded (REG_TOMBS_MAX, the oldest
 * forgotten first), however many keys an operator or an attacker with
 * write access deletes. White box: the memory backend delivers each delete
 * inside del, so the count is read right after. */
static void
remembered_deletes_bounded(void **state)
{
    fx *f = *state;
    const sw_registry_backend *be = sw_registry_backend_find(f->be);
    sw_registry *reg = fx_reg(f, 0, 3000, 0);
    swp_instance m = STREAMWIRE__V1__INSTANCE_INFO__INIT;
    int total = REG_TOMBS_MAX + 100;
    size_t n;
    uint64_t last_rev = 0, put_rev[REG_TOMBS_MAX + 100];
    char key[256], id[32];

    f->raw_be[0] = be;
    assert_int_equal(be->open(&f->raw_state[0], f->conn, f->bucket, 60000), SW_OK);
    m.version = SW_PROTOCOL_VERSION;
    m.endpoint = EP1;
    m.request_subject = "sw.req.x";
    m.control_subject = "sw.ctl.x";
    m.lease_ms = 60000;
    for (int i = 0; i < total; i++) {
        uint8_t *enc = NULL;
        size_t len = 0;
        uint64_t rev = 0;
        snprintf(id, sizeof(id), "t%d", i);
        snprintf(key, sizeof(key), "%s.%s", EP1, id);
        m.instance_id = id;
        assert_int_equal(swp_encode_alloc(&m, 65536, &enc, &len), SW_OK);
        assert_int_equal(be->put(f->raw_state[0], key, enc, len, 0, &rev), SW_OK);
        free(enc);
        assert_int_equal(be->del(f->raw_state[0], key), SW_OK);
        put_rev[i] = rev;
        last_rev = rev;
    }
    /* The first 1,024 deletes again, as a watch made again replays the
     * markers still in the store: older than every one kept, they push
     * none of them out. */
    for (int i = 0; i < REG_TOMBS_MAX; i++) {
        sw_registry_entry e;
        snprintf(key, sizeof(key), "%s.t%d", EP1, i);
        e.key = key;
        e.value = NULL;
        e.len = 0;
        e.revision = put_rev[i] + 1; /* its delete's (nothing else writes the bucket) */
        e.created_unix_ms = 0;
        swr_reg_on_entry(reg, &e, 1);
    }
    snprintf(key, sizeof(key), "%s.%s", EP1, id);
    pthread_mutex_lock(&reg->mu);
    n = reg->ntomb;
    pthread_mutex_unlock(&reg->mu);
    assert_int_equal(n, REG_TOMBS_MAX);
    assert_int_equal(list_count(reg, NULL), 0);
    /* The newest delete is among those kept: the last key's value, handed
     * over again as a list would, stays gone. */
    {
        uint8_t *enc = NULL;
        size_t len = 0;
        sw_registry_entry e;
        m.instance_id = id;
        assert_int_equal(swp_encode_alloc(&m, 65536, &enc, &len), SW_OK);
        e.key = key;
        e.value = enc;
        e.len = len;
        e.revision = last_rev;
        e.created_unix_ms = 0;
        swr_reg_on_entry(reg, &e, 0);
        free(enc);
    }
    assert_int_equal(list_count(reg, NULL), 0);
}
#endif

#ifndef SW_REGISTRY_MEMORY_ONLY
/* A server without JetStream: sw_registry_open (nats-kv) fails at once
 * with SW_NO_RESPONDERS (registry.h: "a server without JetStream fails at
 * once", where failures that pass by themselves are retried for up to 20
 * s; the header said a wrapped NATS status, which it never was). */
static void
open_without_jetstream_fails_at_once(void **state)
{
    swh_nats n;
    sw_conn_opts co;
    sw_conn *c = NULL;
    sw_registry_opts go;
    sw_registry *reg = NULL;
    int64_t t0, took;
    sw_err rv;
    (void)state;
    assert_int_equal(swh_nats_start_no_js(&n, NULL), 0);
    sw_conn_opts_init(&co);
    co.url = n.url;
    assert_int_equal(sw_conn_open(&c, &co), SW_OK);
    sw_registry_opts_init(&go);
    go.backend = "nats-kv";
    go.bucket = "nojs";
    t0 = now_ms();
    rv = sw_registry_open(&reg, c, &go);
    took = now_ms() - t0;
    print_message("    without JetStream: %s after %lld ms\n", sw_err_name(rv), (long long)took);
    assert_int_equal(rv, SW_NO_RESPONDERS);
    assert_null(reg);
    assert_true(took < T(3000));
    sw_conn_close(c);
    swh_nats_stop(&n);
}

/* A store that does not answer (its server frozen) is no word on an entry:
 * a dead report then fails with the store's error (SW_ETIMEDOUT after
 * JetStream's 5 s), and is not counted as refused. The KV backend used to
 * take any failed guarded write for "someone else wrote" and said SW_EBUSY
 * ("the instance refreshed: it is alive") after 10 s (the write's timeout,
 * then the read's), counting a refusal and keeping the report for later. */
static void
report_dead_while_the_store_is_down(void **state)
{
    swh_nats n;
    sw_conn_opts co;
    sw_conn *c = NULL;
    sw_registry_opts go;
    sw_registry *wreg = NULL, *rreg = NULL;
    sw_registration rg = {"w-out", "ns.comp.ep", "sw.req.ns.comp.ep.w-out", "sw.ctl.w-out"};
    sw_registry_stats st;
    int64_t t0, took;
    sw_err rv;
    (void)state;
    assert_int_equal(swh_nats_start(&n, NULL), 0);
    sw_conn_opts_init(&co);
    co.url = n.url;
    assert_int_equal(sw_conn_open(&c, &co), SW_OK);
    sw_registry_opts_init(&go);
    go.backend = "nats-kv";
    go.bucket = "outage";
    assert_int_equal(sw_registry_open(&wreg, c, &go), SW_OK);
    assert_int_equal(sw_registry_open(&rreg, c, &go), SW_OK);
    assert_int_equal(sw_registry_register(wreg, &rg), SW_OK);
    assert_true(wait_listed(rreg, "w-out", 1, T(5000)));
    /* stopped for sure: a request sent right after kill() returned was
     * still answered now and then (SW_OK in 2 ms) */
    assert_int_equal(swh_freeze(n.pid, T(5000)), 0);
    t0 = now_ms();
    rv = sw_registry_report_dead(rreg, "w-out", 0, "test");
    took = now_ms() - t0;
    assert_int_equal(kill(n.pid, SIGCONT), 0);
    print_message("    report with the store frozen: %s after %lld ms\n", sw_err_name(rv),
                  (long long)took);
    assert_int_equal(rv, SW_ETIMEDOUT);
    sw_registry_stats_get(rreg, &st);
    assert_int_equal(st.dead_reports_refused, 0);
    assert_int_equal(st.dead_reports_sent, 0);
    /* (what the frozen server does with the write once it runs again is
     * its own: a timeout says nothing either way) */
    sw_registry_close(rreg);
    sw_registry_close(wreg);
    sw_conn_close(c);
    swh_nats_stop(&n);
}
#endif

#define RT(f, be)                                      \
    {                                                  \
#f " [" be "]", f, setup, teardown, (void *)be \
    }
#define REG_TESTS(be)                                                                              \
    RT(register_then_list, be), RT(watch_events, be), RT(lease_expiry, be),                        \
        RT(lease_is_the_entrys_own, be), RT(report_dead_guard_and_reregister, be),                 \
        RT(report_dead_of_gone_worker, be), RT(deleted_entry_reregisters, be), RT(api_errors, be), \
        RT(list_filters_by_endpoint, be), RT(open_invalid, be),                                    \
        RT(open_same_new_bucket_concurrently, be), RT(garbage_entries_ignored, be),                \
        RT(unwatch_stops_callbacks, be), RT(raw_backend_ops, be),                                  \
        RT(deregister_races_refresh, be), RT(set_draining_races_refresh, be),                      \
        RT(registry_logs_without_locks, be), RT(log_under_another_handles_lock, be),               \
        RT(pool_logs_without_lock, be), RT(lease_ignores_clock_skew, be),                          \
        RT(foreign_key_entry_ignored, be), RT(report_silent_refused_when_refreshed, be),           \
        RT(pool_report_does_not_block, be), RT(store_outage_holds_leases, be),                     \
        RT(pool_stop_gives_up_on_a_failing_store, be),                                             \
        RT(refused_report_written_when_lease_lapses, be), RT(blind_watch_reads_the_store, be),     \
        RT(recorded_tombstone_put_back_is_ignored, be), RT(idle_registry_rests, be),               \
        RT(stale_list_after_delete, be), RT(forgotten_entry_replayed_stays_dead, be),              \
        RT(new_watcher_skips_queued_events, be), RT(lapse_before_told_is_not_removed, be),         \
        RT(pool_seed_not_undone_by_events, be)

int
main(int argc, char **argv)
{
    /* The memory backend in the unit build, JetStream KV in the
     * integration build: the same cases each (REG_TESTS). */
    const struct CMUnitTest tests[] = {
        REG_TESTS(SUITE_BACKEND),
#ifdef SW_REGISTRY_MEMORY_ONLY
        RT(remembered_deletes_bounded, SUITE_BACKEND),
        RT(pool_without_registry_bounded, SUITE_BACKEND),
        RT(pool_quarantine_doubles, SUITE_BACKEND),
        RT(pool_quarantine_capped, SUITE_BACKEND),
        RT(hold_bounded, SUITE_BACKEND),
#else
        RT(watch_closes_while_receiving, SUITE_BACKEND),
        RT(watch_remade_when_consumer_deleted, SUITE_BACKEND),
        RT(watch_survives_server_restart, SUITE_BACKEND),
        cmocka_unit_test(open_without_jetstream_fails_at_once),
        cmocka_unit_test(report_dead_while_the_store_is_down),
#endif
    };
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
#ifdef SW_REGISTRY_MEMORY_ONLY
    return cmocka_run_group_tests_name("registry_mem", tests, group_setup, group_teardown);
#else
    return cmocka_run_group_tests_name("registry", tests, group_setup, group_teardown);
#endif
}
