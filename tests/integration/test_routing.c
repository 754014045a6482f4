/* tests/integration/test_routing.c -- routing through the registry, and
 * instance loss with real processes (issue 4).
 *
 * Workers are separate processes so that they can be SIGKILLed, SIGSTOPped
 * and SIGTERMed. The test binary re-executes itself (/proc/self/exe) in a
 * role given by argv[1]:
 *
 *   --worker URL ENDPOINT ID BUCKET LEASE_MS [FLAGS]
 *       its own sw_conn + sw_ingress + sw_registry (nats-kv, BUCKET);
 *       registers, prints "ready ID", then waits for signals. SIGTERM: the
 *       graceful path (set_draining, sw_ingress_drain 5 s, deregister),
 *       prints "drained <rv> <rv> <rv>" and exits 0 if all were SW_OK.
 *       FLAGS "usr1-drain": SIGUSR1 drains the ingress only (the registry
 *       is not told), prints "drained-only".
 *       The handler takes its script from the payload: "n=N,ms=M,hang=K":
 *       N items "token-0".."token-N-1", M ms apart, COMPLETED; with hang=K
 *       it sends K items, then swx_responder_abandon (no terminal, no more
 *       heartbeats for that stream) and sleeps 10 s, the process alive.
 *   --router2 URL ENDPOINT BUCKET GAP_MS PROBE_MS
 *       a second frontend: its own sw_conn + sw_registry + sw_router
 *       (round robin, probe_interval_ms PROBE_MS). Prints "ready", then
 *       opens a short request every GAP_MS (not waiting for earlier ones)
 *       and prints one line per request at its terminal: "req <t_open_ms>
 *       <instance|-> <status> <reason>", t on CLOCK_MONOTONIC (comparable
 *       across processes). On SIGTERM prints "stats lost=N" and exits 0.
 *
 * (Plain fork() without exec is not an option: the parent has nats.c's
 * library threads running, which a forked child would not have.)
 *
 * The parent is the frontend: one sw_registry + sw_router, plus an
 * independent "observer" sw_registry handle that plays every other router.
 * Every child pid is recorded globally; the per-test and the group teardown
 * SIGKILL and reap whatever is left, so a failed assertion never leaks a
 * process (and PR_SET_PDEATHSIG covers a crashed test binary).
 *
 * Every wait is a generous bound times swh_slow(). The only speed asserted
 * is the functional "no_instances immediately" (< 100 ms x slow);
 * the latencies the issue wants measured are printed:
 *   SIGKILL -> terminal, SIGSTOP -> terminal, report -> other router stops.
 *
 * Run one test: test_routing '<glob>'. SW_IT_VERBOSE=1 shows library logs. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include <nats/nats.h>
#include <streamwire/metrics.h>
#include <streamwire/registry.h>
#include <streamwire/streamwire.h>

#include "harness.h"
#include "ingress/chaos.h"

static swh_nats g_nats;
static int g_slow = 1;
static int g_verbose;

#define T(ms) ((int64_t)(ms)*g_slow)
#define EP "itroute.llm.generate"

static int64_t
now_ms(void)
{
    return (int64_t)swh_now_ms();
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

static int g_reroutes; /* "re-routed to" lines the routers logged (atomic) */

static void
log_stderr(void *arg, sw_log_level level, const char *msg)
{
    if (strstr(msg, "; re-routed to ") != NULL)
        __atomic_add_fetch(&g_reroutes, 1, __ATOMIC_RELAXED);
    if (g_verbose || level <= SW_LOG_ERROR)
        fprintf(stderr, "[%d %s] %s: %s\n", (int)getpid(), arg ? (const char *)arg : "",
                sw_log_level_name(level), msg);
}

static void
rand_suffix(char out[9])
{
    static unsigned counter;
    unsigned v = (unsigned)getpid() * 2654435761u ^ (unsigned)now_ms() ^ (++counter * 40503u);
    FILE *f = fopen("/dev/urandom", "rb");
    if (f != NULL) {
        unsigned r;
        if (fread(&r, sizeof(r), 1, f) == 1)
            v ^= r;
        fclose(f);
    }
    snprintf(out, 9, "%08x", v);
}

static sw_conn *
open_conn(const char *url, const char *name)
{
    sw_conn_opts o;
    sw_conn *c = NULL;
    sw_conn_opts_init(&o);
    o.url = url;
    o.name = name;
    o.log = log_stderr;
    o.log_arg = (void *)name;
    if (sw_conn_open(&c, &o) != SW_OK)
        return NULL;
    return c;
}

static sw_registry *
open_registry(sw_conn *c, const char *bucket, unsigned lease_ms, const char *who)
{
    sw_registry_opts o;
    sw_registry *r = NULL;
    sw_registry_opts_init(&o);
    o.backend = "nats-kv";
    o.bucket = bucket;
    o.lease_ms = lease_ms;
    o.log = log_stderr;
    o.log_arg = (void *)who;
    if (sw_registry_open(&r, c, &o) != SW_OK)
        return NULL;
    return r;
}

/* ======================================================================== */
/* Worker process                                                            */

typedef struct script {
    int n, ms, hang;
} script;

static void
parse_script(const char *p, size_t len, script *s)
{
    char buf[128];
    char *save = NULL, *tok;
    s->n = 5;
    s->ms = 0;
    s->hang = -1;
    if (len >= sizeof(buf))
        len = sizeof(buf) - 1;
    memcpy(buf, p, len);
    buf[len] = '\0';
    for (tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        if (strncmp(tok, "n=", 2) == 0)
            s->n = atoi(tok + 2);
        else if (strncmp(tok, "ms=", 3) == 0)
            s->ms = atoi(tok + 3);
        else if (strncmp(tok, "hang=", 5) == 0)
            s->hang = atoi(tok + 5);
    }
}

static void
worker_handler(sw_responder *r, void *arg)
{
    size_t len = 0;
    const void *p = sw_responder_payload(r, &len);
    script s;
    (void)arg;
    parse_script(p, len, &s);
    for (int i = 0; i < s.n; i++) {
        char tok[32];
        int n;
        if (i == s.hang) {
            /* Lost this one stream: nothing more goes out for it (no
             * terminal, no heartbeat), the process stays alive. */
            swx_responder_abandon(r);
            swh_sleep_ms(10000);
            return;
        }
        if (i > 0 && s.ms > 0)
            swh_sleep_ms(s.ms);
        n = snprintf(tok, sizeof(tok), "token-%d", i);
        if (sw_responder_send(r, tok, (size_t)n) != SW_OK)
            return;
    }
    (void)sw_responder_finish(r, SW_STATUS_COMPLETED, NULL);
}

static int
worker_main(int argc, char **argv)
{
    const char *url, *ep, *id, *bucket, *flags;
    unsigned lease;
    sigset_t set;
    sw_conn *c;
    sw_ingress *ing = NULL;
    sw_registration rg;
    sw_registry *reg;
    sw_ingress_opts io;
    sw_err r1, r2, r3;
    int usr1_drain;
    char who[96];

    if (argc < 7)
        return 2;
    url = argv[2];
    ep = argv[3];
    id = argv[4];
    bucket = argv[5];
    lease = (unsigned)atoi(argv[6]);
    flags = argc > 7 ? argv[7] : "";
    usr1_drain = strstr(flags, "usr1-drain") != NULL;
    snprintf(who, sizeof(who), "worker %s", id);
    g_verbose = getenv("SW_IT_VERBOSE") != NULL;

    /* Signals are taken with sigwait: block them before any thread exists. */
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &set, NULL);

    if ((c = open_conn(url, who)) == NULL) {
        fprintf(stderr, "%s: no connection\n", who);
        return 3;
    }
    sw_ingress_opts_init(&io);
    io.endpoint = ep;
    io.instance_id = id;
    io.handler = worker_handler;
    io.handler_threads = 8;
    io.log = log_stderr;
    io.log_arg = who;
    if (sw_ingress_start(&ing, c, &io) != SW_OK) {
        fprintf(stderr, "%s: ingress failed\n", who);
        return 4;
    }
    if ((reg = open_registry(c, bucket, lease, who)) == NULL ||
        sw_ingress_registration(ing, &rg) != SW_OK || sw_registry_register(reg, &rg) != SW_OK) {
        fprintf(stderr, "%s: registry failed\n", who);
        return 5;
    }
    printf("ready %s\n", id);
    fflush(stdout);

    for (;;) {
        int sig = 0;
        if (sigwait(&set, &sig) != 0)
            continue;
        if (sig == SIGTERM)
            break;
        if (sig == SIGUSR1 && usr1_drain) {
            (void)sw_ingress_drain(ing, 0);
            printf("drained-only\n");
            fflush(stdout);
        }
    }
    /* Graceful: stop being picked, let in-flight streams finish, leave. */
    r1 = sw_registry_set_draining(reg, id);
    r2 = sw_ingress_drain(ing, 5000);
    r3 = sw_registry_deregister(reg, id);
    printf("drained %s %s %s\n", sw_err_name(r1), sw_err_name(r2), sw_err_name(r3));
    fflush(stdout);
    sw_registry_close(reg);
    sw_ingress_destroy(ing);
    natsConnection_Close((natsConnection *)sw_conn_nats(c));
    swh_sleep_ms(200);
    sw_conn_close(c);
    return r1 == SW_OK && r2 == SW_OK && r3 == SW_OK ? 0 : 1;
}

/* ======================================================================== */
/* Second router process                                                     */

/* Requests are opened every GAP_MS without waiting for earlier ones (a hung
 * request must not stop the routing decisions being made and logged).
 * Each terminal prints "req <t_open> <instance|-> <status> <reason>" from
 * the stream's callback, which then closes the stream. At exit it prints
 * "stats lost=<instances this router declared dead itself>". */
static pthread_mutex_t r2_out_mu = PTHREAD_MUTEX_INITIALIZER;

typedef struct r2_stream {
    int64_t t_open;
} r2_stream;

static void
r2_on_item(sw_stream *s, const sw_item *it, void *arg)
{
    r2_stream *rs = arg;
    if (it->kind != SW_ITEM_TERMINAL)
        return;
    pthread_mutex_lock(&r2_out_mu);
    printf("req %lld %s %s %s\n", (long long)rs->t_open,
           sw_stream_instance_id(s)[0] ? sw_stream_instance_id(s) : "-",
           sw_status_name((int)it->terminal.status),
           it->terminal.reason && it->terminal.reason[0] ? it->terminal.reason : "-");
    fflush(stdout);
    pthread_mutex_unlock(&r2_out_mu);
    sw_stream_close(s);
    free(rs);
}

static int
router2_main(int argc, char **argv)
{
    const char *url, *ep, *bucket;
    int gap;
    unsigned probe_ms;
    sigset_t set;
    struct timespec zero = {0, 0};
    sw_conn *c;
    sw_registry *reg;
    sw_router *rt = NULL;
    sw_router_opts ro;
    sw_router_stats st;

    if (argc < 7)
        return 2;
    url = argv[2];
    ep = argv[3];
    bucket = argv[4];
    gap = atoi(argv[5]);
    probe_ms = (unsigned)atoi(argv[6]);
    g_verbose = getenv("SW_IT_VERBOSE") != NULL;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);

    if ((c = open_conn(url, "router2")) == NULL ||
        (reg = open_registry(c, bucket, 3000, "router2")) == NULL)
        return 3;
    sw_router_opts_init(&ro);
    ro.registry = reg;
    ro.policy = SW_POLICY_ROUND_ROBIN;
    ro.probe_interval_ms = probe_ms;
    ro.log = log_stderr;
    ro.log_arg = "router2";
    if (sw_router_create(&rt, c, &ro) != SW_OK)
        return 4;
    printf("ready\n");
    fflush(stdout);
    while (sigtimedwait(&set, NULL, &zero) < 0) {
        sw_request_opts q;
        sw_stream *s = NULL;
        r2_stream *rs = calloc(1, sizeof(*rs));
        if (rs == NULL)
            return 5;
        sw_request_opts_init(&q);
        q.endpoint = ep;
        q.on_item = r2_on_item;
        q.on_item_arg = rs;
        rs->t_open = now_ms();
        /* The callback closes s at the terminal, possibly before open
         * returns: s is not touched here. */
        if (sw_router_open(&s, rt, &q, "n=1,ms=0", 8) != SW_OK) {
            pthread_mutex_lock(&r2_out_mu);
            printf("req %lld - open_failed -\n", (long long)rs->t_open);
            fflush(stdout);
            pthread_mutex_unlock(&r2_out_mu);
            free(rs);
        }
        if (gap > 0)
            swh_sleep_ms(gap);
    }
    sw_router_stats_get(rt, &st);
    sw_router_destroy(rt);
    printf("stats lost=%llu\n", (unsigned long long)st.instances_lost);
    fflush(stdout);
    sw_registry_close(reg);
    natsConnection_Close((natsConnection *)sw_conn_nats(c));
    swh_sleep_ms(200);
    sw_conn_close(c);
    return 0;
}

/* ======================================================================== */
/* Child bookkeeping (parent)                                                */

#define MAXCHILD 128
static pid_t g_children[MAXCHILD];
static int g_nchildren;

static void
child_track(pid_t pid)
{
    for (int i = 0; i < MAXCHILD; i++)
        if (g_children[i] == 0) {
            g_children[i] = pid;
            if (i >= g_nchildren)
                g_nchildren = i + 1;
            return;
        }
}

/* Reaped (by whoever): forget it. */
static void
child_forget(pid_t pid)
{
    for (int i = 0; i < g_nchildren; i++)
        if (g_children[i] == pid)
            g_children[i] = 0;
}

static void
children_kill_all(void)
{
    for (int i = 0; i < g_nchildren; i++)
        if (g_children[i] > 0) {
            swh_kill(g_children[i], SIGKILL);
            (void)swh_wait_exit(g_children[i], 5000, NULL);
            g_children[i] = 0;
        }
    g_nchildren = 0;
}

/* ======================================================================== */
/* Stream collector (callback mode)                                          */

typedef struct coll {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n;   /* data items */
    int bad; /* an item out of order or with unexpected content */
    int done;
    int terminals; /* must end up exactly 1 */
    sw_status status;
    sw_err err;
    char reason[96];
    char inst[SW_MAX_TOKEN + 1];
    char instances[3 * (SW_MAX_TOKEN + 1)]; /* the terminal's */
    int64_t t_open, t_first, t_last, t_term;
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
        if (c->done || it->seq != (uint64_t)c->n + 1 || it->len != (size_t)n ||
            memcmp(it->data, want, (size_t)n) != 0)
            c->bad++;
        if (c->n == 0)
            c->t_first = now_ms();
        c->t_last = now_ms();
        c->n++;
    } else {
        c->terminals++;
        c->done = 1;
        c->status = it->terminal.status;
        c->err = it->terminal.error;
        snprintf(c->reason, sizeof(c->reason), "%s",
                 it->terminal.reason ? it->terminal.reason : "");
        snprintf(c->instances, sizeof(c->instances), "%s", it->terminal.instances);
        c->t_term = now_ms();
    }
    if (it->instance_id != NULL && it->instance_id[0] != '\0')
        snprintf(c->inst, sizeof(c->inst), "%s", it->instance_id);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* Waits until the collector has >= n items (n < 0: the terminal). */
static int
coll_wait(coll *c, int n, int64_t timeout_ms)
{
    int64_t until = now_ms() + timeout_ms;
    int ok;
    pthread_mutex_lock(&c->mu);
    while (!(n < 0 ? c->done : (c->n >= n || c->done)) && now_ms() < until)
        cond_wait_until(&c->cv, &c->mu, until);
    ok = n < 0 ? c->done : c->n >= n;
    pthread_mutex_unlock(&c->mu);
    return ok;
}

static coll
coll_get(coll *c)
{
    coll v;
    pthread_mutex_lock(&c->mu);
    v = *c;
    pthread_mutex_unlock(&c->mu);
    return v;
}

/* ======================================================================== */
/* Registry event log (watch callbacks)                                      */

#define EVMAX 512

typedef struct ev_rec {
    int ev;
    char id[SW_MAX_TOKEN + 1];
    int draining;
    int64_t t;
} ev_rec;

typedef struct evlog {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ev_rec v[EVMAX];
    int n;
} evlog;

static void
on_event(void *arg, sw_registry_event ev, const sw_instance *inst)
{
    evlog *l = arg;
    pthread_mutex_lock(&l->mu);
    if (l->n < EVMAX) {
        ev_rec *r = &l->v[l->n++];
        r->ev = (int)ev;
        snprintf(r->id, sizeof(r->id), "%s", inst->instance_id);
        r->draining = inst->draining;
        r->t = now_ms();
    }
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

/* First event ev (0 any) for id at or after index from, with draining ==
 * drain (-1 any); its index, or -1 after timeout_ms. */
static int
ev_wait(evlog *l, int ev, const char *id, int drain, int from, int64_t timeout_ms)
{
    int64_t until = now_ms() + timeout_ms;
    int found = -1;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        for (int i = from; i < l->n && found < 0; i++)
            if ((ev == 0 || l->v[i].ev == ev) && strcmp(l->v[i].id, id) == 0 &&
                (drain < 0 || l->v[i].draining == drain))
                found = i;
        if (found >= 0 || now_ms() >= until)
            break;
        cond_wait_until(&l->cv, &l->mu, until);
    }
    pthread_mutex_unlock(&l->mu);
    return found;
}

static int64_t
ev_time(evlog *l, int i)
{
    int64_t t;
    pthread_mutex_lock(&l->mu);
    t = l->v[i].t;
    pthread_mutex_unlock(&l->mu);
    return t;
}

static int
ev_count(evlog *l, int ev, const char *id)
{
    int c = 0;
    pthread_mutex_lock(&l->mu);
    for (int i = 0; i < l->n; i++)
        if (l->v[i].ev == ev && strcmp(l->v[i].id, id) == 0)
            c++;
    pthread_mutex_unlock(&l->mu);
    return c;
}

/* ======================================================================== */
/* Second router's output (reader thread)                                    */

typedef struct r2out {
    pthread_mutex_t mu;
    char *buf;
    size_t len, cap;
    int fd;
    int eof;
    pthread_t thr;
    int started;
} r2out;

static void *
r2_reader(void *arg)
{
    r2out *o = arg;
    char tmp[4096];
    for (;;) {
        ssize_t k = read(o->fd, tmp, sizeof(tmp));
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        pthread_mutex_lock(&o->mu);
        if (o->len + (size_t)k + 1 > o->cap) {
            size_t ncap = (o->cap ? o->cap * 2 : 65536) + (size_t)k;
            char *nb = realloc(o->buf, ncap);
            if (nb != NULL) {
                o->buf = nb;
                o->cap = ncap;
            }
        }
        if (o->len + (size_t)k + 1 <= o->cap) {
            memcpy(o->buf + o->len, tmp, (size_t)k);
            o->len += (size_t)k;
            o->buf[o->len] = '\0';
        }
        pthread_mutex_unlock(&o->mu);
    }
    pthread_mutex_lock(&o->mu);
    o->eof = 1;
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

typedef struct r2req {
    int64_t t;
    char inst[SW_MAX_TOKEN + 1];
    char status[32];
    char reason[64];
} r2req;

/* Parses every complete "req" line so far into v (up to cap); returns the
 * count. */
static int
r2_parse(r2out *o, r2req *v, int cap)
{
    int n = 0;
    char *copy, *save = NULL, *line;
    pthread_mutex_lock(&o->mu);
    copy = strndup(o->buf ? o->buf : "", o->len);
    pthread_mutex_unlock(&o->mu);
    if (copy == NULL)
        return 0;
    /* Only complete lines. */
    {
        char *last = strrchr(copy, '\n');
        if (last == NULL)
            copy[0] = '\0';
        else
            last[1] = '\0';
    }
    for (line = strtok_r(copy, "\n", &save); line != NULL && n < cap;
         line = strtok_r(NULL, "\n", &save)) {
        long long t;
        if (sscanf(line, "req %lld %64s %31s %63s", &t, v[n].inst, v[n].status, v[n].reason) == 4) {
            v[n].t = t;
            n++;
        }
    }
    free(copy);
    return n;
}

/* ======================================================================== */
/* Per-test world                                                            */

#define MAXW 6
#define MAXS 128

typedef struct world {
    char sfx[9];
    char bucket[SW_MAX_TOKEN + 1];
    pid_t wpid[MAXW];
    int wfd[MAXW];
    char wid[MAXW][SW_MAX_TOKEN + 1];
    int nw;
    pid_t r2pid;
    r2out r2;
    sw_conn *rc, *oc;
    sw_registry *rreg, *oreg;
    sw_router *rt, *rt2;
    evlog rlog, olog;
    sw_stream *s[MAXS];
    coll c[MAXS];
    const char *inst_open[MAXS]; /* sw_stream_instance_id as sw_router_open returned */
    char inst_open_copy[MAXS][SW_MAX_TOKEN + 1];
    int ns;
} world;

#define MAX_GRAVE 256
static sw_conn *g_grave[MAX_GRAVE];
static int g_ngrave;

static void
conn_retire(sw_conn *c)
{
    if (c == NULL)
        return;
    natsConnection_Close((natsConnection *)sw_conn_nats(c));
    if (g_ngrave < MAX_GRAVE)
        g_grave[g_ngrave++] = c;
    else
        sw_conn_close(c);
}

static int
setup(void **state)
{
    world *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return -1;
    rand_suffix(w->sfx);
    snprintf(w->bucket, sizeof(w->bucket), "itroute_%s", w->sfx);
    pthread_mutex_init(&w->rlog.mu, NULL);
    cond_init_mono(&w->rlog.cv);
    pthread_mutex_init(&w->olog.mu, NULL);
    cond_init_mono(&w->olog.cv);
    pthread_mutex_init(&w->r2.mu, NULL);
    w->r2.fd = -1;
    for (int i = 0; i < MAXW; i++)
        w->wfd[i] = -1;
    for (int i = 0; i < MAXS; i++) {
        pthread_mutex_init(&w->c[i].mu, NULL);
        cond_init_mono(&w->c[i].cv);
    }
    *state = w;
    return 0;
}

static int
teardown(void **state)
{
    world *w = *state;
    /* Children first: nothing of theirs may outlive the test. */
    children_kill_all();
    for (int i = 0; i < w->nw; i++)
        if (w->wfd[i] >= 0)
            close(w->wfd[i]);
    if (w->r2.started)
        pthread_join(w->r2.thr, NULL);
    if (w->r2.fd >= 0)
        close(w->r2.fd);
    free(w->r2.buf);
    for (int i = 0; i < w->ns; i++)
        sw_stream_close(w->s[i]);
    sw_router_destroy(w->rt2);
    sw_router_destroy(w->rt);
    sw_registry_close(w->rreg);
    sw_registry_close(w->oreg);
    conn_retire(w->rc);
    conn_retire(w->oc);
    for (int i = 0; i < MAXS; i++) {
        pthread_mutex_destroy(&w->c[i].mu);
        pthread_cond_destroy(&w->c[i].cv);
    }
    pthread_mutex_destroy(&w->rlog.mu);
    pthread_cond_destroy(&w->rlog.cv);
    pthread_mutex_destroy(&w->olog.mu);
    pthread_cond_destroy(&w->olog.cv);
    pthread_mutex_destroy(&w->r2.mu);
    free(w);
    return 0;
}

/* The frontend: registry + router (policy), a watcher on the router's own
 * registry (added after the router, so when it sees an event the router's
 * pool has already seen it), and the observer handle with its watcher. */
static void
world_frontend(world *w, sw_policy policy)
{
    sw_router_opts ro;
    w->rc = open_conn(g_nats.url, "router");
    assert_non_null(w->rc);
    w->oc = open_conn(g_nats.url, "observer");
    assert_non_null(w->oc);
    w->rreg = open_registry(w->rc, w->bucket, 3000, "router");
    assert_non_null(w->rreg);
    w->oreg = open_registry(w->oc, w->bucket, 3000, "observer");
    assert_non_null(w->oreg);
    sw_router_opts_init(&ro);
    ro.registry = w->rreg;
    ro.policy = policy;
    ro.log = log_stderr;
    ro.log_arg = "router";
    assert_int_equal(sw_router_create(&w->rt, w->rc, &ro), SW_OK);
    assert_int_equal(sw_registry_watch(w->rreg, on_event, &w->rlog, NULL), SW_OK);
    assert_int_equal(sw_registry_watch(w->oreg, on_event, &w->olog, NULL), SW_OK);
}

/* Starts worker process i and waits until it is registered and both the
 * router's pool and the observer know it. */
static void
world_worker(world *w, int i, const char *flags)
{
    char lease[16];
    const char *argv[10];
    int k = 0;
    char line[128];
    char sfx[9];
    assert_true(i < MAXW);
    memcpy(sfx, w->sfx, sizeof(sfx));
    snprintf(w->wid[i], sizeof(w->wid[i]), "w%d-%s", i, sfx);
    snprintf(lease, sizeof(lease), "%d", 3000);
    argv[k++] = "test_routing";
    argv[k++] = "--worker";
    argv[k++] = g_nats.url;
    argv[k++] = EP;
    argv[k++] = w->wid[i];
    argv[k++] = w->bucket;
    argv[k++] = lease;
    if (flags != NULL)
        argv[k++] = flags;
    argv[k] = NULL;
    w->wpid[i] = swh_spawn_path("/proc/self/exe", argv, &w->wfd[i], -1);
    assert_true(w->wpid[i] > 0);
    child_track(w->wpid[i]);
    if (i >= w->nw)
        w->nw = i + 1;
    if (swh_wait_line(w->wfd[i], "ready", line, sizeof(line), (int)T(10000)) != 0)
        fail_msg("worker %d did not get ready", i);
    assert_true(ev_wait(&w->rlog, SW_REGISTRY_ADDED, w->wid[i], -1, 0, T(3000)) >= 0);
    assert_true(ev_wait(&w->olog, SW_REGISTRY_ADDED, w->wid[i], -1, 0, T(3000)) >= 0);
}

/* Index of the worker serving instance id, or -1. */
static int
world_widx(world *w, const char *id)
{
    for (int i = 0; i < w->nw; i++)
        if (strcmp(w->wid[i], id) == 0)
            return i;
    return -1;
}

/* Opens a stream (callback mode) on router rt; returns its index. */
static int
world_open(world *w, sw_router *rt, const char *payload, const char *instance)
{
    sw_request_opts q;
    int i = w->ns;
    assert_true(i < MAXS);
    sw_request_opts_init(&q);
    q.endpoint = EP;
    q.instance_id = instance;
    q.on_item = coll_cb;
    q.on_item_arg = &w->c[i];
    w->c[i].t_open = now_ms();
    assert_int_equal(sw_router_open(&w->s[i], rt, &q, payload, strlen(payload)), SW_OK);
    w->inst_open[i] = sw_stream_instance_id(w->s[i]);
    snprintf(w->inst_open_copy[i], sizeof(w->inst_open_copy[i]), "%s", w->inst_open[i]);
    w->ns++;
    return i;
}

static const char *
stream_inst(world *w, int i)
{
    return sw_stream_instance_id(w->s[i]);
}

/* Opens n short streams at once (policy routing) and waits for all; every
 * one must complete with its k items. Counts completions per worker into
 * per[] (may be NULL). */
static void
world_short_batch(world *w, sw_router *rt, int n, int per[MAXW])
{
    int first = w->ns;
    for (int i = 0; i < n; i++)
        world_open(w, rt, "n=3,ms=0", NULL);
    for (int i = first; i < first + n; i++) {
        coll c;
        int wi;
        if (!coll_wait(&w->c[i], -1, T(5000)))
            fail_msg("short stream %d did not end", i - first);
        c = coll_get(&w->c[i]);
        if (c.status != SW_STATUS_COMPLETED || c.n != 3 || c.bad != 0)
            fail_msg("short stream %d on %s: %s/%s, %d items, %d bad", i - first, stream_inst(w, i),
                     sw_status_name((int)c.status), c.reason, c.n, c.bad);
        wi = world_widx(w, stream_inst(w, i));
        assert_true(wi >= 0);
        if (per != NULL)
            per[wi]++;
    }
}

static int
listed(sw_registry *reg, const char *id)
{
    sw_instance *v = NULL;
    size_t n = 0;
    int found = 0;
    assert_int_equal(sw_registry_list(reg, EP, &v, &n), SW_OK);
    for (size_t i = 0; i < n; i++)
        found |= strcmp(v[i].instance_id, id) == 0;
    sw_instances_free(v, n);
    return found;
}

static void
expect_terminal(world *w, int i, sw_status st, sw_err err, int64_t timeout_ms)
{
    coll c;
    if (!coll_wait(&w->c[i], -1, timeout_ms))
        fail_msg("stream %d (%s) has no terminal after %lld ms", i, stream_inst(w, i),
                 (long long)timeout_ms);
    c = coll_get(&w->c[i]);
    if (c.status != st || c.err != err)
        fail_msg("stream %d (%s): terminal %s/%s (%s), wanted %s/%s", i, stream_inst(w, i),
                 sw_status_name((int)c.status), sw_err_name(c.err), c.reason,
                 sw_status_name((int)st), sw_err_name(err));
    assert_int_equal(c.terminals, 1);
    assert_int_equal(c.bad, 0);
}

/* ======================================================================== */
/* Tests                                                                     */

/* Two workers, a stream to each; SIGKILL one mid-stream. */
static void
kill_mid_stream(void **state)
{
    world *w = *state;
    int a, b, victim, survivor, i_rm, per[MAXW] = {0};
    int64_t t_kill;
    coll ca;
    sw_router_stats st;

    world_frontend(w, SW_POLICY_ROUND_ROBIN);
    world_worker(w, 0, NULL);
    world_worker(w, 1, NULL);
    a = world_open(w, w->rt, "n=150,ms=20", NULL);
    b = world_open(w, w->rt, "n=150,ms=20", NULL);
    /* Round robin: one each. */
    assert_true(world_widx(w, stream_inst(w, a)) >= 0);
    assert_true(world_widx(w, stream_inst(w, b)) >= 0);
    assert_string_not_equal(stream_inst(w, a), stream_inst(w, b));
    assert_true(coll_wait(&w->c[a], 5, T(5000)));
    assert_true(coll_wait(&w->c[b], 5, T(5000)));

    victim = world_widx(w, stream_inst(w, a));
    survivor = 1 - victim;
    t_kill = now_ms();
    swh_kill(w->wpid[victim], SIGKILL);

    expect_terminal(w, a, SW_STATUS_ERROR, SW_INSTANCE_LOST, T(5000));
    ca = coll_get(&w->c[a]);
    assert_string_equal(ca.reason, "instance_lost");
    assert_true(ca.n >= 5 && ca.n < 150);
    print_message("    SIGKILL -> instance_lost terminal: %lld ms (%d items before)\n",
                  (long long)(ca.t_term - t_kill), ca.n);

    /* The other one completes, every item in order. */
    expect_terminal(w, b, SW_STATUS_COMPLETED, SW_OK, T(15000));
    assert_int_equal(coll_get(&w->c[b]).n, 150);

    /* Every other router (the observer) drops it, within 1 s. */
    i_rm = ev_wait(&w->olog, SW_REGISTRY_REMOVED, w->wid[victim], -1, 0, T(1000));
    if (i_rm < 0 || ev_time(&w->olog, i_rm) - t_kill > T(1000))
        fail_msg("the observer still had %s 1 s after the SIGKILL", w->wid[victim]);
    print_message("    SIGKILL -> removed in a second registry handle: %lld ms\n",
                  (long long)(ev_time(&w->olog, i_rm) - t_kill));
    assert_false(listed(w->oreg, w->wid[victim]));
    assert_true(listed(w->oreg, w->wid[survivor]));

    /* The next 50 requests all complete, all on the survivor. */
    for (int k = 0; k < 5; k++)
        world_short_batch(w, w->rt, 10, per);
    assert_int_equal(per[survivor], 50);
    assert_int_equal(per[victim], 0);

    sw_router_stats_get(w->rt, &st);
    assert_int_equal(st.instances_lost, 1);
    print_message("    router: instances_lost %llu, detection %llu ms after the last sign of "
                  "life\n",
                  (unsigned long long)st.instances_lost,
                  (unsigned long long)st.last_loss_detect_ms);
    {
        int status = 0;
        assert_int_equal(swh_wait_exit(w->wpid[victim], (int)T(5000), &status), 0);
        child_forget(w->wpid[victim]);
        assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    }
}

/* SIGSTOP a worker mid-stream; SIGCONT: it registers again and is used. */
static void
stop_mid_stream_then_cont(void **state)
{
    world *w = *state;
    int a, b, victim, survivor, i_rm, i_add, per[MAXW] = {0}, back = 0;
    int64_t t_stop, t_cont, until;
    coll ca;
    sw_router_stats st;

    world_frontend(w, SW_POLICY_ROUND_ROBIN);
    world_worker(w, 0, NULL);
    world_worker(w, 1, NULL);
    a = world_open(w, w->rt, "n=150,ms=20", NULL);
    b = world_open(w, w->rt, "n=150,ms=20", NULL);
    assert_string_not_equal(stream_inst(w, a), stream_inst(w, b));
    assert_true(coll_wait(&w->c[a], 5, T(5000)));
    assert_true(coll_wait(&w->c[b], 5, T(5000)));
    victim = world_widx(w, stream_inst(w, a));
    assert_true(victim >= 0);
    survivor = 1 - victim;

    t_stop = now_ms();
    swh_kill(w->wpid[victim], SIGSTOP);
    expect_terminal(w, a, SW_STATUS_ERROR, SW_INSTANCE_LOST, T(5000));
    ca = coll_get(&w->c[a]);
    print_message("    SIGSTOP -> instance_lost terminal: %lld ms (%d items before)\n",
                  (long long)(ca.t_term - t_stop), ca.n);
    expect_terminal(w, b, SW_STATUS_COMPLETED, SW_OK, T(15000));
    assert_int_equal(coll_get(&w->c[b]).n, 150);

    i_rm = ev_wait(&w->olog, SW_REGISTRY_REMOVED, w->wid[victim], -1, 0, T(2000));
    assert_true(i_rm >= 0);
    print_message("    SIGSTOP -> removed in a second registry handle: %lld ms\n",
                  (long long)(ev_time(&w->olog, i_rm) - t_stop));

    /* While it is frozen, traffic goes to the other one. */
    world_short_batch(w, w->rt, 10, per);
    assert_int_equal(per[survivor], 10);

    /* Resumed: it finds itself reported dead and registers again; the
     * router lifts its quarantine and routes to it again. */
    t_cont = now_ms();
    swh_kill(w->wpid[victim], SIGCONT);
    i_add = ev_wait(&w->rlog, SW_REGISTRY_ADDED, w->wid[victim], -1,
                    ev_wait(&w->rlog, SW_REGISTRY_REMOVED, w->wid[victim], -1, 0, 0) + 1, T(5000));
    if (i_add < 0)
        fail_msg("%s did not register again within 5 s of SIGCONT", w->wid[victim]);
    print_message("    SIGCONT -> registered again: %lld ms\n",
                  (long long)(ev_time(&w->rlog, i_add) - t_cont));
    assert_true(ev_wait(&w->olog, SW_REGISTRY_ADDED, w->wid[victim], -1, i_rm + 1, T(3000)) > i_rm);
    until = now_ms() + T(5000);
    memset(per, 0, sizeof(per));
    while (!back && now_ms() < until) {
        world_short_batch(w, w->rt, 2, per);
        back = per[victim] > 0;
    }
    if (!back)
        fail_msg("%s was not routed to again within 5 s of SIGCONT", w->wid[victim]);
    print_message("    SIGCONT -> routed to again: %lld ms\n", (long long)(now_ms() - t_cont));
    /* And it serves for real: round robin alternates from here. */
    memset(per, 0, sizeof(per));
    world_short_batch(w, w->rt, 10, per);
    assert_true(per[victim] >= 3 && per[survivor] >= 3);
    sw_router_stats_get(w->rt, &st);
    assert_int_equal(st.instances_lost, 1);
}

/* Two routers in separate processes: this one detects the dead instance and
 * reports it; the other stops routing there. sig: SIGKILL or SIGSTOP. */
static void
two_routers(world *w, int sig)
{
    const char *argv[8];
    char line[64];
    r2req *v = calloc(20000, sizeof(*v));
    int n, a, i_rm, seen[2] = {0, 0}, after = 0, after_bad = 0, late_victim = 0, nr_victim = 0;
    int64_t t_sig, t_lost, t_seen, t_r2term, last_victim = -1, until;
    int printed = 0;
    unsigned long long r2_lost = 99;
    coll ca;
    sw_router_stats st;
    const int victim = 0, survivor = 1;

    assert_non_null(v);
    world_frontend(w, SW_POLICY_ROUND_ROBIN);
    world_worker(w, 0, NULL);
    world_worker(w, 1, NULL);
    argv[0] = "test_routing";
    argv[1] = "--router2";
    argv[2] = g_nats.url;
    argv[3] = EP;
    argv[4] = w->bucket;
    argv[5] = "5";
    /* The other router does not probe within the test (first probe after
     * 60 s): whatever makes it stop routing to the victim can only be the
     * report in the registry (or, 3 s later, the lease). */
    argv[6] = "60000";
    argv[7] = NULL;
    w->r2pid = swh_spawn_path("/proc/self/exe", argv, &w->r2.fd, -1);
    assert_true(w->r2pid > 0);
    child_track(w->r2pid);
    if (swh_wait_line(w->r2.fd, "ready", line, sizeof(line), (int)T(10000)) != 0)
        fail_msg("router2 did not get ready");
    assert_int_equal(pthread_create(&w->r2.thr, NULL, r2_reader, &w->r2), 0);
    w->r2.started = 1;

    /* The other router uses both. */
    until = now_ms() + T(5000);
    while ((!seen[0] || !seen[1]) && now_ms() < until) {
        swh_sleep_ms(20);
        n = r2_parse(&w->r2, v, 20000);
        for (int i = 0; i < n; i++) {
            int wi = world_widx(w, v[i].inst);
            if (wi >= 0 && strcmp(v[i].status, "completed") == 0)
                seen[wi] = 1;
        }
    }
    assert_true(seen[0] && seen[1]);

    /* This router streams from the victim (direct routing) and notices. */
    a = world_open(w, w->rt, "n=500,ms=20", w->wid[victim]);
    assert_string_equal(stream_inst(w, a), w->wid[victim]);
    assert_true(coll_wait(&w->c[a], 3, T(5000)));
    t_sig = now_ms();
    swh_kill(w->wpid[victim], sig);
    expect_terminal(w, a, SW_STATUS_ERROR, SW_INSTANCE_LOST, T(5000));
    ca = coll_get(&w->c[a]);
    t_lost = ca.t_term;
    i_rm = ev_wait(&w->olog, SW_REGISTRY_REMOVED, w->wid[victim], -1, 0, T(2000));
    assert_true(i_rm >= 0);
    t_seen = ev_time(&w->olog, i_rm);
    sw_router_stats_get(w->rt, &st);
    assert_int_equal(st.instances_lost, 1);

    /* Let the other router go on for a while, then stop it. */
    swh_sleep_ms((long)T(1000) + 1500);
    t_r2term = now_ms();
    swh_kill(w->r2pid, SIGTERM);
    {
        int status = 0;
        assert_int_equal(swh_wait_exit(w->r2pid, (int)T(10000), &status), 0);
        child_forget(w->r2pid);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    pthread_join(w->r2.thr, NULL);
    w->r2.started = 0;
    n = r2_parse(&w->r2, v, 20000);
    pthread_mutex_lock(&w->r2.mu);
    {
        const char *p = w->r2.buf ? strstr(w->r2.buf, "stats lost=") : NULL;
        if (p != NULL)
            r2_lost = strtoull(p + 11, NULL, 10);
    }
    pthread_mutex_unlock(&w->r2.mu);
    /* Its own probing is off: it learned of the death from the registry.
     * The REMOVED event makes a router confirm with one probe, so that
     * streams it still had open to the victim end at once; that
     * confirmation may count one loss (never more: one victim). */
    assert_true(r2_lost <= 1);
    for (int i = 0; i < n; i++) {
        int wi = world_widx(w, v[i].inst);
        if (wi == victim) {
            if (v[i].t > last_victim)
                last_victim = v[i].t;
            if (v[i].t >= t_sig) {
                nr_victim++;
                if (printed++ < 8)
                    print_message("    other router -> victim at %+lld ms from the signal: "
                                  "%s/%s\n",
                                  (long long)(v[i].t - t_sig), v[i].status, v[i].reason);
            }
            if (v[i].t > t_seen + T(1000))
                late_victim++;
        }
        if (v[i].t > t_seen + T(1000) && v[i].t < t_r2term - 300) {
            after++;
            if (wi != survivor || strcmp(v[i].status, "completed") != 0)
                after_bad++;
        }
    }
    print_message("    %s -> instance_lost here: %lld ms; report seen by a third handle: +%lld "
                  "ms\n",
                  sig == SIGKILL ? "SIGKILL" : "SIGSTOP", (long long)(t_lost - t_sig),
                  (long long)(t_seen - t_lost));
    print_message("    other router: %d requests, %d to the victim after the signal; its last "
                  "pick of the victim: %+lld ms vs the report seen in the registry, %+lld ms vs "
                  "the terminal here\n",
                  n, nr_victim, (long long)(last_victim - t_seen),
                  (long long)(last_victim - t_lost));
    if (late_victim > 0)
        fail_msg("the other router routed %d requests to the reported instance more than 1 s "
                 "after the report was in the registry",
                 late_victim);
    assert_true(after > 0);
    if (after_bad > 0)
        fail_msg("%d of the other router's %d requests after the report did not complete on "
                 "the survivor",
                 after_bad, after);
    free(v);
}

static void
two_routers_kill(void **state)
{
    two_routers(*state, SIGKILL);
}

static void
two_routers_stop(void **state)
{
    two_routers(*state, SIGSTOP);
}

/* A slow worker (800 ms between items, heartbeats every 250 ms) is never
 * declared dead. */
static void
slow_worker_not_dead(void **state)
{
    world *w = *state;
    int a;
    sw_router_stats st;

    world_frontend(w, SW_POLICY_ROUND_ROBIN);
    world_worker(w, 0, NULL);
    a = world_open(w, w->rt, "n=6,ms=800", NULL);
    expect_terminal(w, a, SW_STATUS_COMPLETED, SW_OK, T(15000));
    assert_int_equal(coll_get(&w->c[a]).n, 6);
    sw_router_stats_get(w->rt, &st);
    assert_int_equal(st.instances_lost, 0);
    assert_true(st.probes_sent > 0); /* it was probed all along */
    assert_int_equal(ev_count(&w->olog, SW_REGISTRY_REMOVED, w->wid[0]), 0);
    assert_int_equal(ev_count(&w->rlog, SW_REGISTRY_REMOVED, w->wid[0]), 0);
    assert_true(listed(w->oreg, w->wid[0]));
}

/* least_inflight picks the instance with fewer open streams. */
static void
policy_least_inflight(void **state)
{
    world *w = *state;
    int l1, l2, p1, p2;

    world_frontend(w, SW_POLICY_LEAST_INFLIGHT);
    world_worker(w, 0, NULL);
    world_worker(w, 1, NULL);
    l1 = world_open(w, w->rt, "n=300,ms=20", w->wid[0]);
    l2 = world_open(w, w->rt, "n=300,ms=20", w->wid[0]);
    assert_true(coll_wait(&w->c[l1], 1, T(5000)));
    assert_true(coll_wait(&w->c[l2], 1, T(5000)));
    p1 = world_open(w, w->rt, "n=300,ms=20", NULL);
    assert_string_equal(stream_inst(w, p1), w->wid[1]); /* 0 < 2 */
    p2 = world_open(w, w->rt, "n=300,ms=20", NULL);
    assert_string_equal(stream_inst(w, p2), w->wid[1]); /* 1 < 2 */
    /* 2 : 2 now; close both on w0 -> the next two go to w0. */
    sw_stream_close(w->s[l1]);
    sw_stream_close(w->s[l2]);
    w->s[l1] = w->s[l2] = NULL;
    {
        int p3 = world_open(w, w->rt, "n=300,ms=20", NULL);
        int p4 = world_open(w, w->rt, "n=300,ms=20", NULL);
        assert_string_equal(stream_inst(w, p3), w->wid[0]);
        assert_string_equal(stream_inst(w, p4), w->wid[0]);
    }
    for (int i = 0; i < w->ns; i++)
        if (w->s[i] != NULL)
            (void)sw_stream_cancel(w->s[i]);
    for (int i = 0; i < w->ns; i++)
        if (w->s[i] != NULL)
            assert_true(coll_wait(&w->c[i], -1, T(5000)));
}

/* random eventually uses both. */
static void
policy_random(void **state)
{
    world *w = *state;
    int per[MAXW] = {0};
    world_frontend(w, SW_POLICY_RANDOM);
    world_worker(w, 0, NULL);
    world_worker(w, 1, NULL);
    for (int k = 0; k < 4; k++)
        world_short_batch(w, w->rt, 10, per);
    /* P(all 40 on one) = 2^-39. */
    assert_true(per[0] > 0 && per[1] > 0);
    assert_int_equal(per[0] + per[1], 40);
}

/* direct (instance_id set) always goes there, whatever the policy. */
static void
policy_direct(void **state)
{
    world *w = *state;
    int first;
    world_frontend(w, SW_POLICY_ROUND_ROBIN);
    world_worker(w, 0, NULL);
    world_worker(w, 1, NULL);
    first = w->ns;
    for (int k = 0; k < 10; k++)
        world_open(w, w->rt, "n=3,ms=0", w->wid[1]);
    for (int i = first; i < w->ns; i++) {
        expect_terminal(w, i, SW_STATUS_COMPLETED, SW_OK, T(5000));
        assert_string_equal(stream_inst(w, i), w->wid[1]);
        assert_string_equal(w->inst_open[i], w->inst_open_copy[i]);
        assert_string_equal(coll_get(&w->c[i]).inst, w->wid[1]);
    }
    /* Direct to an instance nobody serves: nobody answers the request
     * subject (the registry is not consulted). */
    first = world_open(w, w->rt, "n=3,ms=0", "nosuchinstance");
    expect_terminal(w, first, SW_STATUS_ERROR, SW_NO_RESPONDERS, T(3000));
}

/* No live instance for the endpoint: the stream's only item is the terminal
 * error no_instances, immediately. */
static void
no_instances_immediately(void **state)
{
    world *w = *state;
    sw_request_opts q;
    sw_stream *s = NULL;
    const sw_item *it = NULL;
    int64_t t0;
    int a;

    world_frontend(w, SW_POLICY_ROUND_ROBIN);
    /* Blocking mode. */
    sw_request_opts_init(&q);
    q.endpoint = EP;
    t0 = now_ms();
    assert_int_equal(sw_router_open(&s, w->rt, &q, "n=3", 3), SW_OK);
    assert_int_equal(sw_stream_next(s, &it, T(100)), SW_OK);
    assert_true(now_ms() - t0 < T(100));
    assert_int_equal(it->kind, SW_ITEM_TERMINAL);
    assert_int_equal(it->terminal.status, SW_STATUS_ERROR);
    assert_int_equal(it->terminal.error, SW_NO_INSTANCES);
    assert_string_equal(it->terminal.reason, "no_instances");
    assert_string_equal(sw_stream_instance_id(s), "");
    assert_int_equal(sw_stream_next(s, &it, 0), SW_EEOF);
    sw_stream_close(s);

    /* Callback mode. */
    a = world_open(w, w->rt, "n=3", NULL);
    expect_terminal(w, a, SW_STATUS_ERROR, SW_NO_INSTANCES, T(100));
    assert_true(coll_get(&w->c[a]).t_term - coll_get(&w->c[a]).t_open < T(100));
    assert_int_equal(coll_get(&w->c[a]).n, 0);

    /* The only worker is killed: after the loss, no_instances again. */
    world_worker(w, 0, NULL);
    a = world_open(w, w->rt, "n=500,ms=20", NULL);
    assert_true(coll_wait(&w->c[a], 2, T(5000)));
    swh_kill(w->wpid[0], SIGKILL);
    expect_terminal(w, a, SW_STATUS_ERROR, SW_INSTANCE_LOST, T(5000));
    /* (Once the router has acted on it: see retry_on_instance_lost for
     * what happens to a request made the moment the terminal arrives.) */
    assert_true(ev_wait(&w->rlog, SW_REGISTRY_REMOVED, w->wid[0], -1, 0, T(2000)) >= 0);
    a = world_open(w, w->rt, "n=3", NULL);
    expect_terminal(w, a, SW_STATUS_ERROR, SW_NO_INSTANCES, T(100));
    assert_true(coll_get(&w->c[a]).t_term - coll_get(&w->c[a]).t_open < T(100));

    /* A router without a registry can only route directly. */
    {
        sw_router_opts ro;
        sw_router_opts_init(&ro);
        assert_int_equal(sw_router_create(&w->rt2, w->rc, &ro), SW_OK);
        a = world_open(w, w->rt2, "n=3", NULL);
        expect_terminal(w, a, SW_STATUS_ERROR, SW_NO_INSTANCES, T(100));
    }
}

/* A consumer that retries the moment it gets instance_lost must not be
 * routed to the instance that was just lost. rt_instance_lost
 * (egress/probe.c) fails the streams -- delivering their terminals, in
 * callback mode synchronously -- before swr_pool_dead quarantines the
 * instance, so a retry made from the terminal (callback here; a blocking
 * consumer woken by it races the same way) is picked onto the dead
 * instance: no_responders instead of no_instances (one worker) or the
 * survivor (several). */
typedef struct retry_ctx {
    coll *c;
    sw_router *rt;
    sw_stream *retry;
    sw_err open_rv;
    int opened;
} retry_ctx;

static void
retry_cb(sw_stream *s, const sw_item *it, void *arg)
{
    retry_ctx *x = arg;
    coll_cb(s, it, x->c);
    if (it->kind == SW_ITEM_TERMINAL && it->terminal.error == SW_INSTANCE_LOST) {
        sw_request_opts q;
        sw_request_opts_init(&q);
        q.endpoint = EP;
        sw_stream *r = NULL;
        sw_err rv = sw_router_open(&r, x->rt, &q, "n=3,ms=0", 8);
        pthread_mutex_lock(&x->c->mu);
        x->retry = r;
        x->open_rv = rv;
        x->opened = 1;
        pthread_cond_broadcast(&x->c->cv);
        pthread_mutex_unlock(&x->c->mu);
    }
}

static void
retry_on_instance_lost(void **state)
{
    world *w = *state;
    sw_request_opts q;
    retry_ctx x;
    const sw_item *it = NULL;
    int i = w->ns;

    world_frontend(w, SW_POLICY_ROUND_ROBIN);
    world_worker(w, 0, NULL);
    memset(&x, 0, sizeof(x));
    x.c = &w->c[i];
    x.rt = w->rt;
    sw_request_opts_init(&q);
    q.endpoint = EP;
    q.on_item = retry_cb;
    q.on_item_arg = &x;
    w->c[i].t_open = now_ms();
    assert_int_equal(sw_router_open(&w->s[i], w->rt, &q, "n=500,ms=20", 11), SW_OK);
    w->ns++;
    assert_true(coll_wait(&w->c[i], 3, T(5000)));
    swh_kill(w->wpid[0], SIGKILL);
    expect_terminal(w, i, SW_STATUS_ERROR, SW_INSTANCE_LOST, T(5000));
    {
        int64_t until = now_ms() + T(2000);
        pthread_mutex_lock(&w->c[i].mu);
        while (!x.opened && now_ms() < until)
            cond_wait_until(&w->c[i].cv, &w->c[i].mu, until);
        pthread_mutex_unlock(&w->c[i].mu);
    }
    assert_true(x.opened);
    assert_int_equal(x.open_rv, SW_OK);
    assert_non_null(x.retry);
    w->s[w->ns++] = x.retry; /* closed by teardown */
    assert_int_equal(sw_stream_next(x.retry, &it, T(3000)), SW_OK);
    assert_int_equal(it->kind, SW_ITEM_TERMINAL);
    if (it->terminal.error != SW_NO_INSTANCES)
        fail_msg("a request made on the instance_lost terminal went to %s and ended %s/%s; "
                 "wanted no_instances (the only instance had just been lost)",
                 sw_stream_instance_id(x.retry)[0] ? sw_stream_instance_id(x.retry) : "(none)",
                 sw_status_name((int)it->terminal.status), it->terminal.reason);
}

/* A worker that hangs one stream (no items, no heartbeats for it, process
 * alive) ends that stream with stream_incomplete and is not declared dead. */
static void
hung_stream_not_dead(void **state)
{
    world *w = *state;
    int a, b;
    sw_router_stats st;
    coll ca;

    world_frontend(w, SW_POLICY_ROUND_ROBIN);
    world_worker(w, 0, NULL);
    a = world_open(w, w->rt, "n=100,ms=20,hang=5", NULL);
    expect_terminal(w, a, SW_STATUS_ERROR, SW_STREAM_INCOMPLETE, T(10000));
    ca = coll_get(&w->c[a]);
    assert_int_equal(ca.n, 5);
    assert_string_equal(ca.reason, "stream_incomplete");
    print_message("    hang -> stream_incomplete: %lld ms after the last item\n",
                  (long long)(ca.t_term - ca.t_last));
    sw_router_stats_get(w->rt, &st);
    assert_int_equal(st.instances_lost, 0);
    assert_true(listed(w->oreg, w->wid[0]));
    assert_true(listed(w->rreg, w->wid[0]));
    assert_int_equal(ev_count(&w->olog, SW_REGISTRY_REMOVED, w->wid[0]), 0);
    /* It still serves. */
    b = world_open(w, w->rt, "n=3,ms=0", NULL);
    expect_terminal(w, b, SW_STATUS_COMPLETED, SW_OK, T(5000));
    assert_string_equal(stream_inst(w, b), w->wid[0]);
    sw_router_stats_get(w->rt, &st);
    assert_int_equal(st.instances_lost, 0);
}

/* Graceful SIGTERM: draining in the registry, in-flight stream completes,
 * new requests go elsewhere, deregistered, exit 0. */
static void
graceful_drain(void **state)
{
    world *w = *state;
    int a, i_up, per[MAXW] = {0}, status = 0;
    char line[128];
    int64_t t_term;

    world_frontend(w, SW_POLICY_ROUND_ROBIN);
    world_worker(w, 0, NULL);
    world_worker(w, 1, NULL);
    a = world_open(w, w->rt, "n=75,ms=20", w->wid[0]);
    assert_true(coll_wait(&w->c[a], 5, T(5000)));
    t_term = now_ms();
    swh_kill(w->wpid[0], SIGTERM);

    /* The router's pool learns it is draining. */
    i_up = ev_wait(&w->rlog, SW_REGISTRY_UPDATED, w->wid[0], 1, 0, T(3000));
    assert_true(i_up >= 0);
    print_message("    SIGTERM -> draining seen by the router: %lld ms\n",
                  (long long)(ev_time(&w->rlog, i_up) - t_term));
    /* New requests go to the other one while the stream is still going. */
    world_short_batch(w, w->rt, 10, per);
    assert_int_equal(per[1], 10);
    assert_false(coll_get(&w->c[a]).done);

    /* The in-flight stream completes, every item. */
    expect_terminal(w, a, SW_STATUS_COMPLETED, SW_OK, T(10000));
    assert_int_equal(coll_get(&w->c[a]).n, 75);

    /* The worker deregisters and exits 0. */
    assert_int_equal(swh_wait_line(w->wfd[0], "drained", line, sizeof(line), (int)T(10000)), 0);
    assert_string_equal(line, "drained ok ok ok");
    assert_int_equal(swh_wait_exit(w->wpid[0], (int)T(10000), &status), 0);
    child_forget(w->wpid[0]);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_true(ev_wait(&w->olog, SW_REGISTRY_REMOVED, w->wid[0], -1, 0, T(2000)) >= 0);
    assert_false(listed(w->oreg, w->wid[0]));
    assert_false(listed(w->rreg, w->wid[0]));
    {
        sw_router_stats st;
        sw_router_stats_get(w->rt, &st);
        assert_int_equal(st.instances_lost, 0);
    }
    /* And everything keeps working on the other one. */
    memset(per, 0, sizeof(per));
    world_short_batch(w, w->rt, 10, per);
    assert_int_equal(per[1], 10);
}

/* A worker whose request subscription is gone (sw_ingress_drain) while its
 * registry entry still says available -- the window between drain and the
 * draining update reaching a router, or a worker that drains without a
 * registry. sw_ingress_drain's contract: "the request subscription is
 * removed, so routers see no_responders and pick another instance". A
 * request routed through the registry (no instance_id) was never delivered,
 * so the router can retry it on another live instance. */
static void fill_endpoint_series(sw_router *rt);

static void
drained_requests_run(world *w, int fill)
{
    int first, bad = 0, rerouted = 0;
    char line[64], both[2 * (SW_MAX_TOKEN + 1)];

    world_frontend(w, SW_POLICY_ROUND_ROBIN);
    if (fill)
        fill_endpoint_series(w->rt);
    world_worker(w, 0, "usr1-drain");
    world_worker(w, 1, NULL);
    swh_kill(w->wpid[0], SIGUSR1);
    assert_int_equal(swh_wait_line(w->wfd[0], "drained-only", line, sizeof(line), (int)T(5000)), 0);
    first = w->ns;
    for (int k = 0; k < 10; k++)
        world_open(w, w->rt, "n=3,ms=0", NULL);
    for (int i = first; i < w->ns; i++) {
        coll c;
        assert_true(coll_wait(&w->c[i], -1, T(5000)));
        c = coll_get(&w->c[i]);
        if (c.status != SW_STATUS_COMPLETED) {
            bad++;
            print_message("    request %d on %s: %s/%s\n", i - first, stream_inst(w, i),
                          sw_status_name((int)c.status), c.reason);
        }
        /* The terminal names every instance the request was sent to: a
         * re-routed one, the drained instance first. The id string
         * returned at open (the drained instance's, if the re-route had not
         * run yet) is unchanged. */
        assert_string_equal(c.inst, w->wid[1]);
        assert_string_equal(stream_inst(w, i), w->wid[1]);
        assert_string_equal(w->inst_open[i], w->inst_open_copy[i]);
        if (strcmp(c.instances, w->wid[1]) != 0) {
            snprintf(both, sizeof(both), "%s,%s", w->wid[0], w->wid[1]);
            assert_string_equal(c.instances, both);
            rerouted++;
        }
    }
    /* Round robin sent about half of them to the drained instance first. */
    if (rerouted == 0)
        fail_msg("no terminal named the drained instance a request was sent to first");
    if (bad > 0)
        fail_msg("%d of 10 requests routed by the registry ended no_responders on a drained "
                 "instance instead of going to the live one",
                 bad);
    if (fill) { /* (the path this run is for was taken) */
        sw_metrics *m = NULL;
        char *text = NULL, want[256];
        size_t len = 0;
        snprintf(want, sizeof(want),
                 "streamwire_frontend_endpoint_streams_opened_total{router=\"%s\","
                 "endpoint=\"_other\"} 10\n",
                 sw_router_id(w->rt));
        assert_int_equal(sw_metrics_create(&m), SW_OK);
        assert_int_equal(sw_metrics_add_router(m, w->rt), SW_OK);
        assert_int_equal(sw_metrics_render(m, &text, &len), SW_OK);
        if (strstr(text, want) == NULL)
            fail_msg("no line %s in the router's metrics", want);
        free(text);
        sw_metrics_destroy(m);
    }
}

static void
drained_instance_requests_go_elsewhere(void **state)
{
    drained_requests_run(*state, 0);
}

/* A request meets "no responders" on every instance it is sent to (three
 * workers, all drained while still listed): it is re-routed once
 * (streamwire.h: "sent once to another instance"), not a second time, and
 * ends no_responders; its terminal names the two instances it was sent
 * to, two different ones. */
static void
rerouted_once_only(void **state)
{
    world *w = *state;
    char line[64];
    coll c;
    int i, named = 0;
    world_frontend(w, SW_POLICY_ROUND_ROBIN);
    __atomic_store_n(&g_reroutes, 0, __ATOMIC_RELAXED);
    for (int k = 0; k < 3; k++) {
        world_worker(w, k, "usr1-drain");
        swh_kill(w->wpid[k], SIGUSR1);
        assert_int_equal(swh_wait_line(w->wfd[k], "drained-only", line, sizeof(line), (int)T(5000)),
                         0);
    }
    i = world_open(w, w->rt, "n=3,ms=0", NULL);
    assert_true(coll_wait(&w->c[i], -1, T(5000)));
    c = coll_get(&w->c[i]);
    assert_int_equal(c.status, SW_STATUS_ERROR);
    assert_int_equal(c.err, SW_NO_RESPONDERS);
    assert_int_equal(c.n, 0);
    assert_int_equal(c.terminals, 1);
    {
        const char *comma = strchr(c.instances, ',');
        assert_non_null(comma);
        assert_null(strchr(comma + 1, ',')); /* two, not three */
        assert_true(strncmp(c.instances, comma + 1, (size_t)(comma - c.instances)) != 0 ||
                    strlen(comma + 1) != (size_t)(comma - c.instances));
        for (int k = 0; k < 3; k++)
            named += strstr(c.instances, w->wid[k]) != NULL;
        assert_int_equal(named, 2);
    }
    /* one re-route: the second "no responders" ended the stream (the
     * terminal's list names only the last move's two instances, so the
     * router's log is what counts the moves) */
    swh_sleep_ms(100);
    assert_int_equal(__atomic_load_n(&g_reroutes, __ATOMIC_RELAXED), 1);
}

/* A router keeps a series of metrics for its first 32 endpoints
 * (SWE_EP_MAX) and shares their names with their streams; a stream to any
 * later endpoint keeps its own copy of the name, which the re-route after
 * no_responders reads to pick again. The same requests as above, after
 * streams to 32 other endpoints (no instances: they end at once). */
static void
fill_endpoint_series(sw_router *rt)
{
    for (int k = 0; k < 32; k++) { /* (SWE_EP_MAX in egress/egress_int.h) */
        char ep[64];
        sw_request_opts q;
        sw_stream *s = NULL;
        const sw_item *it = NULL;
        snprintf(ep, sizeof(ep), "fill.series.e%d", k);
        sw_request_opts_init(&q);
        q.endpoint = ep;
        assert_int_equal(sw_router_open(&s, rt, &q, "x", 1), SW_OK);
        assert_int_equal(sw_stream_next(s, &it, T(3000)), SW_OK);
        assert_int_equal(it->kind, SW_ITEM_TERMINAL);
        assert_int_equal(it->terminal.error, SW_NO_INSTANCES);
        sw_stream_close(s);
    }
}

static void
drained_requests_go_elsewhere_past_32_endpoints(void **state)
{
    drained_requests_run(*state, 1);
}

/* ======================================================================== */

static int
group_setup(void **state)
{
    (void)state;
    g_slow = swh_slow();
    g_verbose = getenv("SW_IT_VERBOSE") != NULL;
    if (swh_nats_start(&g_nats, NULL) != 0) {
        fprintf(stderr, "test_routing: could not start nats-server\n");
        return -1;
    }
    return 0;
}

static int
group_teardown(void **state)
{
    (void)state;
    children_kill_all();
    if (g_ngrave > 0) {
        swh_sleep_ms(T(300));
        for (int i = 0; i < g_ngrave; i++)
            sw_conn_close(g_grave[i]);
        g_ngrave = 0;
    }
    swh_nats_stop(&g_nats);
    return 0;
}

#define T_(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int
main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        T_(kill_mid_stream),
        T_(stop_mid_stream_then_cont),
        T_(two_routers_kill),
        T_(two_routers_stop),
        T_(slow_worker_not_dead),
        T_(policy_least_inflight),
        T_(policy_random),
        T_(policy_direct),
        T_(no_instances_immediately),
        T_(retry_on_instance_lost),
        T_(hung_stream_not_dead),
        T_(graceful_drain),
        T_(drained_instance_requests_go_elsewhere),
        T_(drained_requests_go_elsewhere_past_32_endpoints),
        T_(rerouted_once_only),
    };
    if (argc > 1 && strcmp(argv[1], "--worker") == 0)
        return worker_main(argc, argv);
    if (argc > 1 && strcmp(argv[1], "--router2") == 0)
        return router2_main(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests_name("routing", tests, group_setup, group_teardown);
}
