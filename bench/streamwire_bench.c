/* bench/streamwire_bench.c -- streamwire against raw nats.c, in one run.
 *
 * Every scenario is measured twice, back to back, against the same
 * nats-server: once with traffic done by hand on nats.c ("raw": publish on a
 * per-request subject, subscribe, count) and once through the full library
 * (ingress + egress in this process, each on its own sw_conn, default options
 * unless stated). The table shows both figures and streamwire/raw.
 *
 *   1  long stream: 1 stream x N items of 64 B and 1 KiB   items/s, MB/s
 *      (also: a blocking sw_stream_next consumer, and the credit protocol's
 *      cost: default credit window vs a 1<<20 window)
 *   2  many short streams of 10 items at concurrency 1, 64, 1024   streams/s
 *   3  per-item latency at a fixed rate, producer send -> consumer receive
 *   4  time to first item
 *   5  idle open streams at the frontend: RSS per stream (the worker side runs
 *      in a child process so the frontend's memory is measured alone)
 *   6  optional, --callgrind: instructions per item under callgrind
 *
 * and, with no raw counterpart (issues 4 and 5; workers and frontends that
 * get killed run in child processes: this binary in a hidden mode):
 *
 *   7  instance loss: SIGKILL / SIGSTOP of a worker mid-stream -> terminal
 *      at the consumer; dead report -> another router stops routing there
 *   8  cancellation: sw_stream_cancel -> the handler's cancel callback;
 *      SIGKILL of a frontend -> the worker cancels its stream
 *   9  slow consumers: 1,000 streams read at one item per 10 ms: peak
 *      frontend RSS against the credit-window bound, loss, nats.c drops
 *
 * Only the public API (streamwire.h, nats.h) is used. See BENCHMARKS.md.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <malloc.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nats/nats.h>
#include <streamwire/registry.h>
#include <streamwire/streamwire.h>

#include "natsd.h"

/* Scenario 6 (optional): under valgrind --tool=callgrind --instr-atstart=no,
 * --callgrind collects only during each long- and short-stream run and dumps
 * one profile per run (instructions per item = dump total / items). The
 * client requests are no-ops outside valgrind. */
#if defined(__has_include)
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define BENCH_HAVE_CALLGRIND 1
#endif
#endif
#ifndef BENCH_HAVE_CALLGRIND
#define CALLGRIND_START_INSTRUMENTATION
#define CALLGRIND_STOP_INSTRUMENTATION
#define CALLGRIND_ZERO_STATS
#define CALLGRIND_DUMP_STATS_AT(x) ((void)(x))
#endif

#ifndef SW_BENCH_SOURCE
#define SW_BENCH_SOURCE "unknown"
#endif

extern char **environ;

#define BREQ_MAGIC 0x53574231u /* "SWB1" */
#define K_SEND 1               /* send n items of size bytes at rate/s (0 = flat out) */
#define K_IDLE 2               /* hold the stream open, send nothing */

#define RAW_REQ_SUBJ "bench.raw.req"
#define IDLE_RAW_SUBJ "bench.idle.raw"
#define EP_MAIN "bench.sw.main"
#define INST_MAIN "benchmain"
#define EP_BIG "bench.sw.bigwin"
#define INST_BIG "benchbigwin"
#define EP_IDLE "bench.sw.idle"
#define INST_IDLE "benchidle"
#define EP_LOSS "bench.sw.loss"      /* workers in child processes, found via the registry */
#define LOSS_BUCKET "swbench_loss"   /* registry bucket of the loss scenario */
#define EP_CANCEL "bench.sw.cancel"
#define INST_CANCEL "benchcancel"
#define EP_SLOW "bench.sw.slow"
#define INST_SLOW "benchslow"

#define MAX_LIST 8
#define BIG_WINDOW (1u << 20)

typedef struct breq {
    uint32_t magic, kind, n, size, rate, pad;
} breq;

/* ------------------------------------------------------------------ config */

static struct {
    const char *server_url; /* NULL: start our own */
    const char *nats_server;
    const char *json_path;
    const char *only;
    int quick;
    int send_asap;
    unsigned reps;
    unsigned long items;
    size_t sizes[MAX_LIST];
    int nsizes;
    unsigned conc[MAX_LIST];
    int nconc;
    unsigned short_items;
    double short_secs;
    unsigned rate;
    double lat_secs;
    unsigned ttfi_n;
    unsigned idle_n;
    double idle_cpu_secs;
    int verbose;
    unsigned window; /* credit_window for the streamwire runs; 0 = router default */
    int side;        /* 0 both, 1 raw only, 2 streamwire only (for profiling) */
    int callgrind;   /* wrap each long-stream run in callgrind client requests */
    unsigned trials;        /* loss: trials per kind; cancel: frontend SIGKILL trials */
    unsigned cancel_trials; /* cancel -> handler trials */
    unsigned slow_streams, slow_items, slow_delay_ms, slow_threads;
    int frozen_fe; /* cancel: keep another frontend SIGSTOPped during the SIGKILL trials */
    unsigned live_fe; /* cancel: this many other live frontends (routers) stream meanwhile */
} cfg;

static const char *g_url;
static char g_cmdline[1024];
static char g_load_start[64], g_load_end[64];

static void
loadavg(char *out, size_t cap)
{
    FILE *f = fopen("/proc/loadavg", "r");
    snprintf(out, cap, "unknown");
    if (f != NULL) {
        if (fgets(out, (int)cap, f) != NULL)
            out[strcspn(out, "\n")] = '\0';
        fclose(f);
    }
}

/* ------------------------------------------------------------------ small utils */

static int64_t
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void
sleep_until_ns(int64_t t)
{
    struct timespec ts;
    ts.tv_sec = (time_t)(t / 1000000000LL);
    ts.tv_nsec = (long)(t % 1000000000LL);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

static void
sleep_ms(int ms)
{
    sleep_until_ns(now_ns() + (int64_t)ms * 1000000LL);
}

static void progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void
progress(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "[bench] ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

static void cleanup(void);

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void
die(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "streamwire-bench: error: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    cleanup();
    _exit(1);
}

static void
stamp(uint8_t *buf, size_t size)
{
    if (size >= 8) {
        int64_t t = now_ns();
        memcpy(buf, &t, 8);
    }
}

static int64_t
unstamp(const void *data, size_t len, int64_t now)
{
    int64_t t;
    if (len < 8)
        return -1;
    memcpy(&t, data, 8);
    return now - t;
}

static int
cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static int
cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Percentile of a sorted array (nearest rank). */
static double
pct(const int64_t *v, size_t n, double q)
{
    size_t i;
    if (n == 0)
        return NAN;
    i = (size_t)ceil(q * (double)n);
    if (i == 0)
        i = 1;
    if (i > n)
        i = n;
    return (double)v[i - 1];
}

static double
median(double *v, unsigned n)
{
    if (n == 0)
        return NAN;
    qsort(v, n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

static long
status_kb(const char *path, const char *key)
{
    char line[256];
    size_t kl = strlen(key);
    long v = -1;
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
            v = strtol(line + kl + 1, NULL, 10);
            break;
        }
    }
    fclose(f);
    return v;
}

static long
self_rss_kb(void)
{
    return status_kb("/proc/self/status", "VmRSS");
}

/* Context switches of this process, all threads (voluntary + involuntary). */
static int64_t
self_csw(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (int64_t)ru.ru_nvcsw + ru.ru_nivcsw;
}

static int64_t
self_cpu_us(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (int64_t)ru.ru_utime.tv_sec * 1000000 + ru.ru_utime.tv_usec +
           (int64_t)ru.ru_stime.tv_sec * 1000000 + ru.ru_stime.tv_usec;
}

/* Resets VmHWM to the current RSS (Linux >= 4.0). 0 ok. */
static int
reset_peak_rss(void)
{
    int fd = open("/proc/self/clear_refs", O_WRONLY);
    int ok;
    if (fd < 0)
        return -1;
    ok = write(fd, "5", 1) == 1;
    close(fd);
    return ok ? 0 : -1;
}

/* ------------------------------------------------------------------ latch */

typedef struct latch {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int set;
} latch;

static void
latch_init(latch *l)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&l->cv, &a);
    pthread_condattr_destroy(&a);
    pthread_mutex_init(&l->mu, NULL);
    l->set = 0;
}

static void
latch_fini(latch *l)
{
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
}

static void
latch_set(latch *l)
{
    pthread_mutex_lock(&l->mu);
    l->set = 1;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

/* Waits up to timeout_ns (< 0: forever). 1 if set. */
static int
latch_wait(latch *l, int64_t timeout_ns)
{
    int set;
    int64_t until = now_ns() + timeout_ns;
    struct timespec ts;
    ts.tv_sec = (time_t)(until / 1000000000LL);
    ts.tv_nsec = (long)(until % 1000000000LL);
    pthread_mutex_lock(&l->mu);
    while (!l->set) {
        if (timeout_ns < 0)
            pthread_cond_wait(&l->cv, &l->mu);
        else if (pthread_cond_timedwait(&l->cv, &l->mu, &ts) == ETIMEDOUT)
            break;
    }
    set = l->set;
    pthread_mutex_unlock(&l->mu);
    return set;
}

/* ------------------------------------------------------------------ nats-server */

/* Our own nats-server (not with --server), started and stopped by the shared
 * launcher in support/natsd.c (also used by the CLI demo and the integration
 * tests). Its pid gives the server CPU and RSS figures (/proc). */
static swh_nats g_nats;
static char g_server_version[64] = "external";
/* Child processes (workers, frontends) started by this process; killed on
 * exit. Only the main thread adds and removes; the signal handler reads. */
#define MAX_KIDS 32
static volatile pid_t g_kids[MAX_KIDS];

static void
kid_add(pid_t pid)
{
    for (int i = 0; i < MAX_KIDS; i++)
        if (g_kids[i] == 0) {
            g_kids[i] = pid;
            return;
        }
}

static void
kid_del(pid_t pid)
{
    for (int i = 0; i < MAX_KIDS; i++)
        if (g_kids[i] == pid)
            g_kids[i] = 0;
}

static void
cleanup(void)
{
    for (int i = 0; i < MAX_KIDS; i++) {
        pid_t k = g_kids[i];
        if (k > 0) {
            kill(k, SIGKILL);
            kill(k, SIGCONT);
            waitpid(k, NULL, 0);
            g_kids[i] = 0;
        }
    }
    swh_nats_stop(&g_nats);
}

/* Async-signal-safe version of cleanup for SIGINT/SIGTERM. */
static void
on_signal(int sig)
{
    for (int i = 0; i < MAX_KIDS; i++)
        if (g_kids[i] > 0) {
            kill(g_kids[i], SIGKILL);
            kill(g_kids[i], SIGCONT);
        }
    if (g_nats.pid > 0) {
        kill(g_nats.pid, SIGKILL);
        waitpid(g_nats.pid, NULL, 0);
    }
    if (g_nats.dir[0] != '\0') {
        pid_t p = fork();
        if (p == 0) {
            execlp("rm", "rm", "-rf", g_nats.dir, (char *)NULL);
            _exit(127);
        }
        if (p > 0)
            waitpid(p, NULL, 0);
    }
    _exit(128 + sig);
}

/* "nats-server: vX.Y.Z" of the running server's binary. */
static void
server_version(pid_t pid)
{
    char exe[64], bin[1024], cmd[1100];
    ssize_t n;
    FILE *p;
    snprintf(exe, sizeof(exe), "/proc/%d/exe", (int)pid);
    if ((n = readlink(exe, bin, sizeof(bin) - 1)) <= 0)
        return;
    bin[n] = '\0';
    snprintf(cmd, sizeof(cmd), "'%s' --version 2>&1", bin);
    if ((p = popen(cmd, "r")) == NULL)
        return;
    if (fgets(g_server_version, sizeof(g_server_version), p) != NULL)
        g_server_version[strcspn(g_server_version, "\r\n")] = '\0';
    pclose(p);
}

/* Starts nats-server -js on a free port with a fresh store dir (support/natsd.c).
 * bin (--nats-server) is handed to the launcher as SW_NATS_SERVER; a name
 * without a slash is looked up on PATH first, as execlp did. NULL: the
 * launcher's default (SW_NATS_SERVER, else nats-server on PATH). Called
 * before any thread exists (it forks). */
static void
start_server(const char *bin)
{
    if (bin != NULL && strchr(bin, '/') == NULL) {
        static char found[1024];
        const char *path = getenv("PATH");
        for (found[0] = '\0'; path != NULL && *path != '\0' && found[0] == '\0';) {
            size_t len = strcspn(path, ":");
            snprintf(found, sizeof(found), "%.*s/%s", (int)len, path, bin);
            if (len == 0 || access(found, X_OK) != 0)
                found[0] = '\0';
            path = path[len] == ':' ? path + len + 1 : NULL;
        }
        if (found[0] == '\0')
            die("%s not found on PATH (use --nats-server PATH or --server)", bin);
        bin = found;
    }
    if (bin != NULL)
        setenv("SW_NATS_SERVER", bin, 1);
    if (swh_nats_start(&g_nats, NULL) != 0)
        die("could not start %s (is it on PATH? use --nats-server or --server)",
            bin != NULL ? bin : "nats-server");
    server_version(g_nats.pid);
}

static long
server_rss_kb(void)
{
    char path[64];
    if (g_nats.pid <= 0)
        return -1;
    snprintf(path, sizeof(path), "/proc/%d/status", (int)g_nats.pid);
    return status_kb(path, "VmRSS");
}

/* Server CPU time in microseconds (utime + stime), -1 if unknown. */
static int64_t
server_cpu_us(void)
{
    char path[64], buf[1024];
    FILE *f;
    char *p;
    unsigned long ut = 0, st = 0;
    if (g_nats.pid <= 0)
        return -1;
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)g_nats.pid);
    if ((f = fopen(path, "r")) == NULL)
        return -1;
    p = fgets(buf, sizeof(buf), f);
    fclose(f);
    if (p == NULL || (p = strrchr(buf, ')')) == NULL)
        return -1;
    /* fields after ")": state(3) ... utime(14) stime(15) */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (int64_t)(ut + st) * 1000000 / sysconf(_SC_CLK_TCK);
}

/* ------------------------------------------------------------------ connections */

static natsConnection *
raw_connect(const char *url, const char *name)
{
    natsOptions *o = NULL;
    natsConnection *nc = NULL;
    natsStatus s = natsOptions_Create(&o);
    if (s == NATS_OK)
        s = natsOptions_SetURL(o, url);
    if (s == NATS_OK)
        s = natsOptions_SetName(o, name);
    if (s == NATS_OK)
        s = natsOptions_SetTimeout(o, 5000);
    if (s == NATS_OK)
        s = natsOptions_SetSendAsap(o, cfg.send_asap ? true : false);
    if (s == NATS_OK)
        s = natsConnection_Connect(&nc, o);
    natsOptions_Destroy(o);
    if (s != NATS_OK)
        die("nats connect %s: %s", url, natsStatus_GetText(s));
    return nc;
}

static sw_conn *
sw_connect(const char *url, const char *name)
{
    sw_conn_opts co;
    sw_conn *c = NULL;
    sw_err e;
    sw_conn_opts_init(&co);
    co.url = url;
    co.name = name;
    co.connect_timeout_ms = 5000;
    co.no_send_asap = !cfg.send_asap;
    if ((e = sw_conn_open(&c, &co)) != SW_OK)
        die("sw_conn_open %s: %s", url, sw_err_name(e));
    return c;
}

/* ------------------------------------------------------------------ worker side, raw */

static natsConnection *g_raw_front, *g_raw_work;
static natsSubscription *g_raw_resp_sub;

/* The hand-written responder: publishes n items to the request's reply
 * subject, on nats.c's delivery thread of its one subscription. */
static void
raw_responder_cb(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *arg)
{
    breq q;
    const char *reply = natsMsg_GetReply(m);
    (void)sub;
    (void)arg;
    if (reply != NULL && natsMsg_GetDataLength(m) >= (int)sizeof(q)) {
        memcpy(&q, natsMsg_GetData(m), sizeof(q));
        if (q.magic == BREQ_MAGIC && q.kind == K_SEND) {
            uint8_t *buf = calloc(1, q.size ? q.size : 1);
            int64_t t0 = now_ns(), iv = q.rate ? 1000000000LL / q.rate : 0;
            for (uint32_t i = 0; buf != NULL && i < q.n; i++) {
                if (iv)
                    sleep_until_ns(t0 + (int64_t)i * iv);
                stamp(buf, q.size);
                if (natsConnection_Publish(nc, reply, buf, (int)q.size) != NATS_OK)
                    break;
            }
            free(buf);
        }
    }
    natsMsg_Destroy(m);
}

/* ------------------------------------------------------------------ worker side, streamwire */

static sw_conn *g_sw_front, *g_sw_work;
static sw_router *g_router;
static sw_ingress *g_ing_main, *g_ing_big;
static unsigned g_default_window;

static void
sw_bench_handler(sw_responder *r, void *arg)
{
    size_t len = 0;
    const void *p = sw_responder_payload(r, &len);
    breq q;
    uint8_t *buf;
    int64_t t0, iv;
    sw_err e = SW_OK;
    (void)arg;
    if (p == NULL || len < sizeof(q)) {
        (void)sw_responder_fail(r, "bench_bad_request", "short payload");
        return;
    }
    memcpy(&q, p, sizeof(q));
    if (q.magic != BREQ_MAGIC || q.kind != K_SEND) {
        (void)sw_responder_fail(r, "bench_bad_request", "bad magic or kind");
        return;
    }
    if ((buf = calloc(1, q.size ? q.size : 1)) == NULL) {
        (void)sw_responder_fail(r, "bench_nomem", NULL);
        return;
    }
    t0 = now_ns();
    iv = q.rate ? 1000000000LL / q.rate : 0;
    for (uint32_t i = 0; i < q.n; i++) {
        if (iv)
            sleep_until_ns(t0 + (int64_t)i * iv);
        stamp(buf, q.size);
        if ((e = sw_responder_send(r, buf, q.size)) != SW_OK)
            break;
    }
    free(buf);
    if (e == SW_OK)
        (void)sw_responder_finish(r, SW_STATUS_COMPLETED, NULL);
    else if (e != SW_ECANCELLED && e != SW_ECLOSED)
        (void)sw_responder_fail(r, "bench_send_failed", sw_err_name(e));
}

static sw_ingress *
start_ingress(const char *ep, const char *inst, unsigned max_inflight, unsigned max_window)
{
    sw_ingress_opts io;
    sw_ingress *ing = NULL;
    sw_err e;
    sw_ingress_opts_init(&io);
    io.endpoint = ep;
    io.instance_id = inst;
    io.handler = sw_bench_handler;
    if (max_inflight)
        io.max_inflight = max_inflight;
    if (max_window)
        io.max_window = max_window;
    if ((e = sw_ingress_start(&ing, g_sw_work, &io)) != SW_OK)
        die("sw_ingress_start %s: %s", ep, sw_err_name(e));
    return ing;
}

/* ------------------------------------------------------------------ results */

typedef struct row {
    char scenario[40];
    char param[48];
    char metric[24];
    double raw, sw;
    int lower_better;
    int prec;
    char note[200];
} row;

static row g_rows[256];
static int g_nrows;

static row *
add_row(const char *scen, const char *param, const char *metric, double raw, double sw,
        int lower_better, int prec, const char *note)
{
    row *r;
    if (g_nrows >= (int)(sizeof(g_rows) / sizeof(g_rows[0])))
        return NULL;
    r = &g_rows[g_nrows++];
    snprintf(r->scenario, sizeof(r->scenario), "%s", scen);
    snprintf(r->param, sizeof(r->param), "%s", param);
    snprintf(r->metric, sizeof(r->metric), "%s", metric);
    r->raw = raw;
    r->sw = sw;
    r->lower_better = lower_better;
    r->prec = prec;
    snprintf(r->note, sizeof(r->note), "%s", note ? note : "");
    return r;
}

/* goal inputs */
static double g_goal_long64 = NAN;
static double g_goal_short64 = NAN;
static double g_goal_p99_raw = NAN, g_goal_p99_sw = NAN;
static double g_goal_idle_bps = NAN;
static unsigned g_goal_idle_window;
static double g_credit_cost[MAX_LIST];

/* ------------------------------------------------------------------ 1 + 3: one stream */

typedef struct stream_run {
    unsigned long n;
    size_t size;
    unsigned rate;
    int64_t *lat; /* n entries, or NULL */
    /* out */
    double secs;
    double cpu_us, srv_cpu_us; /* this process / nats-server CPU during the run */
    double csw;                /* context switches of this process during the run */
    unsigned long received;
    int64_t dropped;
    int ok;
    char err[160];
} stream_run;

typedef struct sink {
    atomic_ulong received;
    unsigned long expect;
    _Atomic int64_t t_last;
    int64_t *lat;
    unsigned long seq_errors;
    int status;
    char reason[96];
    latch done;
} sink;

static sink *
sink_new(unsigned long expect, int64_t *lat)
{
    sink *k = calloc(1, sizeof(*k));
    if (k == NULL)
        die("out of memory");
    atomic_init(&k->received, 0);
    atomic_init(&k->t_last, 0);
    k->expect = expect;
    k->lat = lat;
    latch_init(&k->done);
    return k;
}

static void
sink_free(sink *k)
{
    latch_fini(&k->done);
    free(k);
}

static void
raw_sink_cb(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *arg)
{
    sink *k = arg;
    int64_t now = now_ns();
    unsigned long i = atomic_load(&k->received);
    (void)nc;
    (void)sub;
    if (k->lat != NULL && i < k->expect)
        k->lat[i] = unstamp(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), now);
    atomic_store(&k->t_last, now);
    if (atomic_fetch_add(&k->received, 1) + 1 == k->expect)
        latch_set(&k->done);
    natsMsg_Destroy(m);
}

typedef struct pub_args {
    natsConnection *nc;
    char subj[96];
    unsigned long n;
    size_t size;
    unsigned rate;
    int64_t t_start;
    natsStatus st;
} pub_args;

static void *
pub_main(void *arg)
{
    pub_args *a = arg;
    uint8_t *buf = calloc(1, a->size ? a->size : 1);
    int64_t iv = a->rate ? 1000000000LL / a->rate : 0;
    if (buf == NULL) {
        a->st = NATS_NO_MEMORY;
        return NULL;
    }
    a->t_start = now_ns();
    for (unsigned long i = 0; i < a->n; i++) {
        if (iv)
            sleep_until_ns(a->t_start + (int64_t)i * iv);
        stamp(buf, a->size);
        if ((a->st = natsConnection_Publish(a->nc, a->subj, buf, (int)a->size)) != NATS_OK)
            break;
    }
    (void)natsConnection_FlushTimeout(a->nc, 10000);
    free(buf);
    return NULL;
}

static unsigned long g_subj_seq;

/* Raw: a publisher thread on the worker connection publishes n messages on a
 * fresh subject; an async subscription on the frontend connection counts
 * them. nats.c's default pending limits apply (no flow control): drops are
 * reported. */
static void
run_raw_stream(stream_run *r)
{
    natsSubscription *sub = NULL;
    pthread_t th;
    pub_args a;
    sink *k = sink_new(r->n, r->lat);
    unsigned long last = 0;
    int64_t last_change = now_ns();
    int64_t cpu0, srv0, csw0;
    natsStatus s;

    memset(&a, 0, sizeof(a));
    a.nc = g_raw_work;
    snprintf(a.subj, sizeof(a.subj), "bench.raw.stream.%lu", ++g_subj_seq);
    a.n = r->n;
    a.size = r->size;
    a.rate = r->rate;
    s = natsConnection_Subscribe(&sub, g_raw_front, a.subj, raw_sink_cb, k);
    if (s == NATS_OK)
        s = natsConnection_Flush(g_raw_front);
    if (s != NATS_OK)
        die("raw subscribe: %s", natsStatus_GetText(s));
    cpu0 = self_cpu_us();
    srv0 = server_cpu_us();
    csw0 = self_csw();
    if (pthread_create(&th, NULL, pub_main, &a) != 0)
        die("pthread_create");
    for (;;) {
        int64_t dropped = 0;
        unsigned long got;
        if (latch_wait(&k->done, 100000000LL))
            break;
        natsSubscription_GetDropped(sub, &dropped);
        got = atomic_load(&k->received);
        if (got + (unsigned long)dropped >= r->n)
            break;
        if (got != last) {
            last = got;
            last_change = now_ns();
        } else if (now_ns() - last_change > 5000000000LL) {
            snprintf(r->err, sizeof(r->err), "raw: stalled at %lu of %lu", got, r->n);
            break;
        }
    }
    pthread_join(th, NULL);
    r->cpu_us = (double)(self_cpu_us() - cpu0);
    r->srv_cpu_us = srv0 >= 0 ? (double)(server_cpu_us() - srv0) : NAN;
    r->csw = (double)(self_csw() - csw0);
    if (natsSubscription_Drain(sub) == NATS_OK)
        natsSubscription_WaitForDrainCompletion(sub, 5000);
    natsSubscription_GetDropped(sub, &r->dropped);
    natsSubscription_Destroy(sub);
    r->received = atomic_load(&k->received);
    r->secs = (double)(atomic_load(&k->t_last) - a.t_start) / 1e9;
    r->ok = a.st == NATS_OK && r->received == r->n;
    if (a.st != NATS_OK)
        snprintf(r->err, sizeof(r->err), "raw publish: %s", natsStatus_GetText(a.st));
    sink_free(k);
}

static void
sw_sink_cb(sw_stream *s, const sw_item *it, void *arg)
{
    sink *k = arg;
    int64_t now = now_ns();
    (void)s;
    if (it->kind == SW_ITEM_DATA) {
        unsigned long i = atomic_load(&k->received);
        if (k->lat != NULL && i < k->expect)
            k->lat[i] = unstamp(it->data, it->len, now);
        if (it->seq != i + 1)
            k->seq_errors++;
        atomic_store(&k->t_last, now);
        atomic_store(&k->received, i + 1);
    } else {
        k->status = (int)it->terminal.status;
        snprintf(k->reason, sizeof(k->reason), "%s", it->terminal.reason);
        latch_set(&k->done);
    }
}

/* Streamwire: one sw_router_open; the worker's handler sends n items and
 * finishes. Callback consumer (blocking = 0) or sw_stream_next (1). */
static void
run_sw_stream(stream_run *r, const char *ep, const char *inst, unsigned window, int blocking)
{
    sw_request_opts ro;
    sw_stream *s = NULL;
    breq q = {BREQ_MAGIC, K_SEND, (uint32_t)r->n, (uint32_t)r->size, r->rate, 0};
    sink *k = sink_new(r->n, r->lat);
    int64_t t0, cpu0 = self_cpu_us(), srv0 = server_cpu_us(), csw0 = self_csw();
    sw_err e;
    int done = 0;

    sw_request_opts_init(&ro);
    ro.endpoint = ep;
    ro.instance_id = inst;
    ro.credit_window = window;
    if (!blocking) {
        ro.on_item = sw_sink_cb;
        ro.on_item_arg = k;
    }
    t0 = now_ns();
    if ((e = sw_router_open(&s, g_router, &ro, &q, sizeof(q))) != SW_OK)
        die("sw_router_open: %s", sw_err_name(e));
    if (blocking) {
        for (;;) {
            const sw_item *it = NULL;
            e = sw_stream_next(s, &it, 10000);
            if (e != SW_OK) {
                snprintf(r->err, sizeof(r->err), "sw_stream_next: %s", sw_err_name(e));
                break;
            }
            sw_sink_cb(s, it, k);
            if (it->kind == SW_ITEM_TERMINAL) {
                done = 1;
                break;
            }
        }
    } else {
        unsigned long last = 0;
        int64_t last_change = now_ns();
        for (;;) {
            unsigned long got;
            if (latch_wait(&k->done, 100000000LL)) {
                done = 1;
                break;
            }
            got = atomic_load(&k->received);
            if (got != last) {
                last = got;
                last_change = now_ns();
            } else if (now_ns() - last_change > 10000000000LL) {
                snprintf(r->err, sizeof(r->err), "sw: stalled at %lu of %lu", got, r->n);
                break;
            }
        }
    }
    sw_stream_close(s);
    r->cpu_us = (double)(self_cpu_us() - cpu0);
    r->srv_cpu_us = srv0 >= 0 ? (double)(server_cpu_us() - srv0) : NAN;
    r->csw = (double)(self_csw() - csw0);
    r->received = atomic_load(&k->received);
    r->secs = (double)(atomic_load(&k->t_last) - t0) / 1e9;
    r->dropped = 0;
    r->ok = done && k->status == SW_STATUS_COMPLETED && r->received == r->n && k->seq_errors == 0;
    if (done && !r->ok)
        snprintf(r->err, sizeof(r->err), "sw: terminal %s (%s), %lu/%lu items, %lu seq errors",
                 sw_status_name(k->status), k->reason, r->received, r->n, k->seq_errors);
    if (done)
        sink_free(k); /* else a late callback may still touch it: leak */
}

/* ------------------------------------------------------------------ 1: long streams */

enum { V_RAW, V_SW, V_SW_BLOCK, V_SW_BIG, V_N };

static void
scen_long(void)
{
    unsigned reps = cfg.reps;
    static const char *vname[V_N] = {"raw", "sw", "sw blocking", "sw big window"};
    sw_router_stats rs0, rs1;
    sw_ingress_stats is0, is1;

    sw_router_stats_get(g_router, &rs0);
    sw_ingress_stats_get(g_ing_main, &is0);
    for (int si = 0; si < cfg.nsizes; si++) {
        size_t size = cfg.sizes[si];
        double ips[V_N][32], cpu[V_N][32], scpu[V_N][32], csw[V_N][32];
        int64_t drops[V_N];
        char errs[V_N][160];
        char param[48], note[200];
        sw_ingress_stats sz0, sz1;
        memset(drops, 0, sizeof(drops));
        memset(errs, 0, sizeof(errs));
        sw_ingress_stats_get(g_ing_main, &sz0);
        for (unsigned rep = 0; rep < reps && rep < 32; rep++) {
            for (int v = 0; v < V_N; v++) {
                stream_run r;
                if ((cfg.side == 1 && v != V_RAW) || (cfg.side == 2 && v == V_RAW)) {
                    ips[v][rep] = cpu[v][rep] = scpu[v][rep] = csw[v][rep] = NAN;
                    continue;
                }
                memset(&r, 0, sizeof(r));
                r.n = cfg.items;
                r.size = size;
                progress("1 long stream %zu B x %lu: %s, rep %u/%u", size, cfg.items, vname[v],
                         rep + 1, reps);
                if (cfg.callgrind) {
                    CALLGRIND_ZERO_STATS;
                    CALLGRIND_START_INSTRUMENTATION;
                }
                if (v == V_RAW)
                    run_raw_stream(&r);
                else if (v == V_SW)
                    run_sw_stream(&r, EP_MAIN, INST_MAIN, cfg.window, 0);
                else if (v == V_SW_BLOCK)
                    run_sw_stream(&r, EP_MAIN, INST_MAIN, cfg.window, 1);
                else
                    run_sw_stream(&r, EP_BIG, INST_BIG, BIG_WINDOW, 0);
                if (cfg.callgrind) {
                    char label[96];
                    CALLGRIND_STOP_INSTRUMENTATION;
                    snprintf(label, sizeof(label), "long %zuB x%lu %s rep%u", size, cfg.items,
                             vname[v], rep + 1);
                    CALLGRIND_DUMP_STATS_AT(label);
                }
                ips[v][rep] = r.secs > 0 ? (double)r.received / r.secs : NAN;
                cpu[v][rep] = r.received ? r.cpu_us / (double)r.received : NAN;
                scpu[v][rep] = r.received ? r.srv_cpu_us / (double)r.received : NAN;
                csw[v][rep] = r.received ? r.csw / (double)r.received : NAN;
                drops[v] += r.dropped;
                if (r.err[0] && !errs[v][0])
                    snprintf(errs[v], sizeof(errs[v]), "%s", r.err);
                if (r.err[0])
                    progress("  %s", r.err);
                else if (cfg.verbose)
                    progress("  %.0f items/s", ips[v][rep]);
            }
        }
        sw_ingress_stats_get(g_ing_main, &sz1);
        {
            double m[V_N], mc[V_N], ms[V_N], mx[V_N];
            double mb = (double)size / 1e6;
            uint64_t d_items = sz1.items_sent - sz0.items_sent;
            uint64_t d_msgs = sz1.messages_sent - sz0.messages_sent;
            for (int v = 0; v < V_N; v++) {
                m[v] = median(ips[v], reps < 32 ? reps : 32);
                mc[v] = median(cpu[v], reps < 32 ? reps : 32);
                ms[v] = median(scpu[v], reps < 32 ? reps : 32);
                mx[v] = median(csw[v], reps < 32 ? reps : 32);
            }
            snprintf(param, sizeof(param), "%zu B x %lu, callback", size, cfg.items);
            snprintf(note, sizeof(note), "raw drops %" PRId64 " (nats.c pending limits)%s%.120s",
                     drops[V_RAW], errs[V_RAW][0] || errs[V_SW][0] ? "; " : "",
                     errs[V_RAW][0] ? errs[V_RAW] : errs[V_SW]);
            add_row("1 long stream", param, "items/s", m[V_RAW], m[V_SW], 0, 0, note);
            add_row("1 long stream", param, "MB/s", m[V_RAW] * mb, m[V_SW] * mb, 0, 1,
                    "payload bytes only");
            add_row("1 long stream", param, "CPU us/item", mc[V_RAW], mc[V_SW], 1, 2,
                    "this process (producer + consumer), all threads");
            add_row("1 long stream", param, "server CPU us/item", ms[V_RAW], ms[V_SW], 1, 2,
                    "nats-server process");
            add_row("1 long stream", param, "ctx switches/item", mx[V_RAW], mx[V_SW], 1, 2,
                    "this process, getrusage nvcsw + nivcsw");
            snprintf(note, sizeof(note),
                     "coalescing: %" PRIu64 " items in %" PRIu64
                     " NATS messages (callback and sw_stream_next runs, default window)",
                     d_items, d_msgs);
            add_row("1 long stream", param, "items/message", 1.0,
                    d_msgs ? (double)d_items / (double)d_msgs : NAN, 0, 1, note);
            snprintf(param, sizeof(param), "%zu B x %lu, sw_stream_next", size, cfg.items);
            add_row("1 long stream", param, "items/s", m[V_RAW], m[V_SW_BLOCK], 0, 0,
                    errs[V_SW_BLOCK][0] ? errs[V_SW_BLOCK] : "blocking consumer thread");
            add_row("1 long stream", param, "CPU us/item", mc[V_RAW], mc[V_SW_BLOCK], 1, 2, "");
            add_row("1 long stream", param, "ctx switches/item", mx[V_RAW], mx[V_SW_BLOCK], 1, 2,
                    "");
            snprintf(param, sizeof(param), "%zu B, window %u%s", size,
                     cfg.window ? cfg.window : g_default_window, cfg.window ? "" : " (default)");
            add_row("1 credit cost", param, "items/s", m[V_RAW], m[V_SW], 0, 0,
                    "same run as the callback row");
            snprintf(param, sizeof(param), "%zu B, window %u", size, BIG_WINDOW);
            snprintf(note, sizeof(note), "default/big = %.2f (ingress max_window raised)%s%.120s",
                     m[V_SW] / m[V_SW_BIG], errs[V_SW_BIG][0] ? "; " : "", errs[V_SW_BIG]);
            add_row("1 credit cost", param, "items/s", m[V_RAW], m[V_SW_BIG], 0, 0, note);
            add_row("1 credit cost", param, "CPU us/item", mc[V_RAW], mc[V_SW_BIG], 1, 2, "");
            add_row("1 credit cost", param, "server CPU us/item", ms[V_RAW], ms[V_SW_BIG], 1, 2,
                    "");
            add_row("1 credit cost", param, "ctx switches/item", mx[V_RAW], mx[V_SW_BIG], 1, 2,
                    "");
            if (si < MAX_LIST)
                g_credit_cost[si] = m[V_SW] / m[V_SW_BIG];
            if (size == 64)
                g_goal_long64 = m[V_SW] / m[V_RAW];
        }
    }
    sw_router_stats_get(g_router, &rs1);
    sw_ingress_stats_get(g_ing_main, &is1);
    if (rs1.nats_dropped != rs0.nats_dropped || is1.items_resent != is0.items_resent)
        progress("note: streamwire nats drops %" PRIu64 ", resends %" PRIu64,
                 rs1.nats_dropped - rs0.nats_dropped, is1.items_resent - is0.items_resent);
}

/* ------------------------------------------------------------------ 2 + 4: short streams */

typedef struct one_res {
    int64_t ttfi;
    char err[160];
} one_res;

/* Raw request-many as written by hand: subscribe to a fresh inbox, publish
 * the request with it as reply subject, take n messages, unsubscribe. */
static int
one_raw_stream(unsigned n, size_t size, one_res *o)
{
    natsInbox *inbox = NULL;
    natsSubscription *sub = NULL;
    breq q = {BREQ_MAGIC, K_SEND, n, (uint32_t)size, 0, 0};
    int64_t t0 = now_ns();
    unsigned got = 0;
    natsStatus s = natsInbox_Create(&inbox);
    if (s == NATS_OK)
        s = natsConnection_SubscribeSync(&sub, g_raw_front, inbox);
    if (s == NATS_OK)
        s = natsConnection_PublishRequest(g_raw_front, RAW_REQ_SUBJ, inbox, &q, (int)sizeof(q));
    while (s == NATS_OK && got < n) {
        natsMsg *m = NULL;
        s = natsSubscription_NextMsg(&m, sub, 10000);
        if (s != NATS_OK)
            break;
        if (got == 0)
            o->ttfi = now_ns() - t0;
        got++;
        natsMsg_Destroy(m);
    }
    if (s != NATS_OK)
        snprintf(o->err, sizeof(o->err), "raw: %s after %u items", natsStatus_GetText(s), got);
    if (sub != NULL) {
        natsSubscription_Unsubscribe(sub);
        natsSubscription_Destroy(sub);
    }
    natsInbox_Destroy(inbox);
    return s == NATS_OK ? 0 : -1;
}

static int
one_sw_stream(unsigned n, size_t size, one_res *o)
{
    sw_request_opts ro;
    sw_stream *s = NULL;
    breq q = {BREQ_MAGIC, K_SEND, n, (uint32_t)size, 0, 0};
    int64_t t0;
    unsigned got = 0;
    int ok = 0;
    sw_err e;
    sw_request_opts_init(&ro);
    ro.endpoint = EP_MAIN;
    ro.instance_id = INST_MAIN;
    ro.credit_window = cfg.window;
    t0 = now_ns();
    if ((e = sw_router_open(&s, g_router, &ro, &q, sizeof(q))) != SW_OK) {
        snprintf(o->err, sizeof(o->err), "sw_router_open: %s", sw_err_name(e));
        return -1;
    }
    for (;;) {
        const sw_item *it = NULL;
        if ((e = sw_stream_next(s, &it, 10000)) != SW_OK) {
            snprintf(o->err, sizeof(o->err), "sw_stream_next: %s after %u items", sw_err_name(e),
                     got);
            break;
        }
        if (it->kind == SW_ITEM_DATA) {
            if (got == 0)
                o->ttfi = now_ns() - t0;
            got++;
            continue;
        }
        ok = it->terminal.status == SW_STATUS_COMPLETED && got == n;
        if (!ok)
            snprintf(o->err, sizeof(o->err), "sw: terminal %s (%s) after %u items",
                     sw_status_name(it->terminal.status), it->terminal.reason, got);
        break;
    }
    sw_stream_close(s);
    return ok ? 0 : -1;
}

static unsigned long g_short_completed; /* of the last run_short, for --callgrind labels */

typedef struct short_ctx {
    int sw;
    unsigned n;
    size_t size;
    latch gate;
    int64_t deadline;
    atomic_ulong completed, errors;
    _Atomic int64_t t_end;
    pthread_mutex_t mu;
    char err[160];
} short_ctx;

static void *
short_thread(void *arg)
{
    short_ctx *c = arg;
    int64_t t, prev;
    latch_wait(&c->gate, -1);
    while (now_ns() < c->deadline) {
        one_res o;
        int rc;
        memset(&o, 0, sizeof(o));
        rc = c->sw ? one_sw_stream(c->n, c->size, &o) : one_raw_stream(c->n, c->size, &o);
        if (rc == 0) {
            atomic_fetch_add(&c->completed, 1);
        } else {
            atomic_fetch_add(&c->errors, 1);
            pthread_mutex_lock(&c->mu);
            if (c->err[0] == '\0')
                snprintf(c->err, sizeof(c->err), "%s", o.err);
            pthread_mutex_unlock(&c->mu);
        }
    }
    t = now_ns();
    prev = atomic_load(&c->t_end);
    while (t > prev && !atomic_compare_exchange_weak(&c->t_end, &prev, t)) {
    }
    return NULL;
}

/* Closed loop: conc threads, each runs streams back to back for short_secs. */
static double
run_short(int sw, unsigned conc, unsigned long *errors, char *err, size_t errcap, double *cpu,
          double *csw)
{
    int64_t cpu0, csw0;
    short_ctx c;
    pthread_t *th = calloc(conc, sizeof(*th));
    pthread_attr_t at;
    int64_t t0;
    double rate;
    memset(&c, 0, sizeof(c));
    c.sw = sw;
    c.n = cfg.short_items;
    c.size = 64;
    latch_init(&c.gate);
    pthread_mutex_init(&c.mu, NULL);
    atomic_init(&c.completed, 0);
    atomic_init(&c.errors, 0);
    atomic_init(&c.t_end, 0);
    c.deadline = INT64_MAX;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, 256 * 1024);
    if (th == NULL)
        die("out of memory");
    for (unsigned i = 0; i < conc; i++)
        if (pthread_create(&th[i], &at, short_thread, &c) != 0)
            die("pthread_create (thread %u of %u)", i, conc);
    pthread_attr_destroy(&at);
    sleep_ms(conc > 64 ? 200 : 20);
    t0 = now_ns();
    cpu0 = self_cpu_us();
    csw0 = self_csw();
    c.deadline = t0 + (int64_t)(cfg.short_secs * 1e9);
    latch_set(&c.gate);
    for (unsigned i = 0; i < conc; i++)
        pthread_join(th[i], NULL);
    free(th);
    *cpu = atomic_load(&c.completed) ? (double)(self_cpu_us() - cpu0) /
                                           (double)atomic_load(&c.completed)
                                     : NAN;
    *csw = atomic_load(&c.completed) ? (double)(self_csw() - csw0) /
                                           (double)atomic_load(&c.completed)
                                     : NAN;
    g_short_completed = atomic_load(&c.completed);
    rate = (double)atomic_load(&c.completed) / ((double)(atomic_load(&c.t_end) - t0) / 1e9);
    *errors = atomic_load(&c.errors);
    snprintf(err, errcap, "%s", c.err);
    latch_fini(&c.gate);
    pthread_mutex_destroy(&c.mu);
    return rate;
}

static void
scen_short(void)
{
    for (int ci = 0; ci < cfg.nconc; ci++) {
        unsigned conc = cfg.conc[ci];
        double v[2][32], cpu[2][32], csw[2][32];
        unsigned long errs[2] = {0, 0};
        char err[2][160];
        char param[48], note[200];
        memset(err, 0, sizeof(err));
        for (unsigned rep = 0; rep < cfg.reps && rep < 32; rep++) {
            for (int sw = 0; sw < 2; sw++) {
                unsigned long e = 0;
                char msg[160];
                if (cfg.side == (sw ? 1 : 2)) {
                    v[sw][rep] = cpu[sw][rep] = csw[sw][rep] = NAN;
                    continue;
                }
                progress("2 short streams (%u items) at concurrency %u: %s, rep %u/%u",
                         cfg.short_items, conc, sw ? "sw" : "raw", rep + 1, cfg.reps);
                if (cfg.callgrind) {
                    CALLGRIND_ZERO_STATS;
                    CALLGRIND_START_INSTRUMENTATION;
                }
                v[sw][rep] = run_short(sw, conc, &e, msg, sizeof(msg), &cpu[sw][rep],
                                       &csw[sw][rep]);
                if (cfg.callgrind) {
                    char label[96];
                    CALLGRIND_STOP_INSTRUMENTATION;
                    snprintf(label, sizeof(label), "short c%u %s rep%u streams=%lu", conc,
                             sw ? "sw" : "raw", rep + 1, g_short_completed);
                    CALLGRIND_DUMP_STATS_AT(label);
                }
                errs[sw] += e;
                if (e && !err[sw][0])
                    snprintf(err[sw], sizeof(err[sw]), "%s", msg);
                if (e)
                    progress("  %lu errors: %s", e, msg);
                else if (cfg.verbose)
                    progress("  %.0f streams/s", v[sw][rep]);
            }
        }
        {
            unsigned n = cfg.reps < 32 ? cfg.reps : 32;
            double raw = median(v[0], n), sw = median(v[1], n);
            snprintf(param, sizeof(param), "%u x 64 B, concurrency %u", cfg.short_items, conc);
            snprintf(note, sizeof(note),
                     "raw subscribes per request; errors raw %lu sw %lu%s%.100s", errs[0], errs[1],
                     err[0][0] || err[1][0] ? ": " : "", err[1][0] ? err[1] : err[0]);
            add_row("2 short streams", param, "streams/s", raw, sw, 0, 0, note);
            add_row("2 short streams", param, "CPU us/stream", median(cpu[0], n),
                    median(cpu[1], n), 1, 1, "this process, all threads");
            add_row("2 short streams", param, "ctx switches/stream", median(csw[0], n),
                    median(csw[1], n), 1, 1, "this process");
            if (conc == 64)
                g_goal_short64 = sw / raw;
        }
    }
}

/* ------------------------------------------------------------------ 3: latency */

/* Raw and streamwire alternate in short segments (a new stream each), so a
 * burst of load from elsewhere on a shared machine hits both alike. */
static void
scen_latency(void)
{
    unsigned long n = (unsigned long)(cfg.rate * cfg.lat_secs);
    unsigned segs = cfg.quick ? 2 : 10;
    unsigned long per, got[2] = {0, 0};
    int64_t *lat[2];
    char err[2][160];
    char param[64], note[200];
    if (n < 10 * segs)
        n = 10 * segs;
    per = n / segs;
    n = per * segs;
    lat[0] = calloc(n, sizeof(int64_t));
    lat[1] = calloc(n, sizeof(int64_t));
    if (lat[0] == NULL || lat[1] == NULL)
        die("out of memory");
    memset(err, 0, sizeof(err));
    progress("3 latency at %u items/s, %.1f s per side in %u alternating segments", cfg.rate,
             cfg.lat_secs, segs);
    for (unsigned seg = 0; seg < segs; seg++) {
        for (int sw = 0; sw < 2; sw++) {
            stream_run r;
            memset(&r, 0, sizeof(r));
            r.n = per;
            r.size = 64;
            r.rate = cfg.rate;
            r.lat = lat[sw] + got[sw];
            if (sw)
                run_sw_stream(&r, EP_MAIN, INST_MAIN, cfg.window, 0);
            else
                run_raw_stream(&r);
            got[sw] += r.received < per ? r.received : per;
            if (r.err[0] && !err[sw][0]) {
                snprintf(err[sw], sizeof(err[sw]), "%s", r.err);
                progress("  %s", r.err);
            }
        }
    }
    qsort(lat[0], got[0], sizeof(int64_t), cmp_i64);
    qsort(lat[1], got[1], sizeof(int64_t), cmp_i64);
    snprintf(param, sizeof(param), "64 B at %u/s, %lu items", cfg.rate, n);
    {
        static const double qs[4] = {0.50, 0.99, 0.999, 1.0};
        static const char *qn[4] = {"p50 us", "p99 us", "p99.9 us", "max us"};
        for (int i = 0; i < 4; i++) {
            double a = pct(lat[0], got[0], qs[i]) / 1e3;
            double b = pct(lat[1], got[1], qs[i]) / 1e3;
            if (i == 1) {
                g_goal_p99_raw = a;
                g_goal_p99_sw = b;
                snprintf(note, sizeof(note), "sw - raw = %+.1f us (goal <= +50)", b - a);
            } else if (i == 0) {
                snprintf(note, sizeof(note),
                         "send -> callback, monotonic stamp in payload; %u alternating segments",
                         segs);
            } else {
                note[0] = '\0';
            }
            if (i == 0 && (err[0][0] || err[1][0]))
                snprintf(note, sizeof(note), "%s", err[0][0] ? err[0] : err[1]);
            add_row("3 item latency", param, qn[i], a, b, 1, 1, note);
        }
    }
    free(lat[0]);
    free(lat[1]);
}

/* ------------------------------------------------------------------ 4: time to first item */

static void
scen_ttfi(void)
{
    unsigned n = cfg.ttfi_n;
    int64_t *v[2];
    size_t got[2] = {0, 0};
    unsigned long errs[2] = {0, 0};
    char err[160] = "", param[48], note[200];
    v[0] = calloc(n, sizeof(int64_t));
    v[1] = calloc(n, sizeof(int64_t));
    if (v[0] == NULL || v[1] == NULL)
        die("out of memory");
    progress("4 time to first item over %u streams (raw and sw interleaved)", n);
    for (unsigned i = 0; i < n + 20; i++) {
        for (int sw = 0; sw < 2; sw++) {
            one_res o;
            int rc;
            memset(&o, 0, sizeof(o));
            rc = sw ? one_sw_stream(1, 64, &o) : one_raw_stream(1, 64, &o);
            if (rc != 0) {
                errs[sw]++;
                if (!err[0])
                    snprintf(err, sizeof(err), "%s", o.err);
                continue;
            }
            if (i >= 20) /* warm-up */
                v[sw][got[sw]++] = o.ttfi;
        }
    }
    qsort(v[0], got[0], sizeof(int64_t), cmp_i64);
    qsort(v[1], got[1], sizeof(int64_t), cmp_i64);
    snprintf(param, sizeof(param), "%u sequential streams", n);
    snprintf(note, sizeof(note),
             "open -> first item; raw: subscribe + publish per request; errors raw %lu sw %lu%s%.80s",
             errs[0], errs[1], err[0] ? ": " : "", err);
    add_row("4 time to first item", param, "p50 us", pct(v[0], got[0], 0.5) / 1e3,
            pct(v[1], got[1], 0.5) / 1e3, 1, 1, note);
    add_row("4 time to first item", param, "p99 us", pct(v[0], got[0], 0.99) / 1e3,
            pct(v[1], got[1], 0.99) / 1e3, 1, 1, "");
    free(v[0]);
    free(v[1]);
}

/* ------------------------------------------------------------------ 5: idle streams */

/* The worker side runs in a child process (this binary with --idle-worker),
 * so this process's RSS is the frontend's alone. Line protocol on its
 * stdin/stdout: "stat" -> "stat <rss_kb> <raw_reqs> <sw_held> <cpu_us>",
 * "release" -> "released", "quit". */

typedef struct child {
    pid_t pid;
    int to, from;
    char buf[512];
    size_t blen;
} child;

static int
child_line(child *c, char *out, size_t cap, int timeout_ms)
{
    int64_t until = now_ns() + (int64_t)timeout_ms * 1000000LL;
    for (;;) {
        char *nl = memchr(c->buf, '\n', c->blen);
        struct pollfd p;
        ssize_t n;
        int left;
        if (nl != NULL) {
            size_t l = (size_t)(nl - c->buf);
            snprintf(out, cap, "%.*s", (int)l, c->buf);
            memmove(c->buf, nl + 1, c->blen - l - 1);
            c->blen -= l + 1;
            return 0;
        }
        left = (int)((until - now_ns()) / 1000000LL);
        if (left <= 0 || c->blen >= sizeof(c->buf) - 1)
            return -1;
        p.fd = c->from;
        p.events = POLLIN;
        if (poll(&p, 1, left) <= 0)
            continue;
        n = read(c->from, c->buf + c->blen, sizeof(c->buf) - 1 - c->blen);
        if (n <= 0)
            return -1;
        c->blen += (size_t)n;
    }
}

static int
child_cmd(child *c, const char *cmd, char *out, size_t cap)
{
    size_t l = strlen(cmd);
    if (write(c->to, cmd, l) != (ssize_t)l || write(c->to, "\n", 1) != 1)
        return -1;
    return child_line(c, out, cap, 30000);
}

typedef struct cstat {
    long rss_kb;
    unsigned long raw, sw;
    long long cpu_us;
} cstat;

static void
child_stat(child *c, cstat *st)
{
    char line[256];
    if (child_cmd(c, "stat", line, sizeof(line)) != 0 ||
        sscanf(line, "stat %ld %lu %lu %lld", &st->rss_kb, &st->raw, &st->sw, &st->cpu_us) != 4)
        die("idle worker: bad reply to stat");
}

/* Starts this binary in a hidden mode (argv[1] onwards) with its stdin and
 * stdout on pipes; does not wait for it. Main thread only (the child's
 * PR_SET_PDEATHSIG fires when the spawning thread exits). */
static void
child_start(child *c, char *const argv[])
{
    int in[2], out[2];
    posix_spawn_file_actions_t fa;
    memset(c, 0, sizeof(*c));
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0)
        die("pipe: %s", strerror(errno));
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    if (posix_spawn(&c->pid, "/proc/self/exe", &fa, NULL, argv, environ) != 0)
        die("posix_spawn %s: %s", argv[1], strerror(errno));
    posix_spawn_file_actions_destroy(&fa);
    kid_add(c->pid);
    close(in[0]);
    close(out[1]);
    c->to = in[1];
    c->from = out[0];
}

/* Closes the pipes, kills the child if it has not exited within wait_ms,
 * and reaps it. */
static void
child_reap(child *c, int wait_ms)
{
    if (c->pid <= 0)
        return;
    close(c->to);
    close(c->from);
    for (int i = 0; i < wait_ms / 10 && waitpid(c->pid, NULL, WNOHANG) == 0; i++)
        sleep_ms(10);
    if (waitpid(c->pid, NULL, WNOHANG) == 0) {
        kill(c->pid, SIGKILL);
        kill(c->pid, SIGCONT);
        waitpid(c->pid, NULL, 0);
    }
    kid_del(c->pid);
    c->pid = -1;
}

static void
child_spawn(child *c, unsigned n)
{
    char nbuf[32], line[64];
    char *argv[5];
    snprintf(nbuf, sizeof(nbuf), "%u", n);
    argv[0] = (char *)"streamwire-bench";
    argv[1] = (char *)"--idle-worker";
    argv[2] = (char *)g_url;
    argv[3] = nbuf;
    argv[4] = NULL;
    child_start(c, argv);
    if (child_line(c, line, sizeof(line), 20000) != 0 || strcmp(line, "ready") != 0)
        die("idle worker did not start");
}

static void
child_quit(child *c)
{
    char line[64];
    (void)child_cmd(c, "quit", line, sizeof(line));
    child_reap(c, 5000);
}

typedef struct idle_res {
    double bytes_per_stream, peak_bytes_per_stream, open_secs;
    double worker_bytes_per_stream, server_bytes_per_stream;
    double cpu_front, cpu_worker, cpu_server; /* % of one core while idle */
    char note[160];
} idle_res;

static void
idle_wait(child *c, int sw, unsigned long want, cstat *st)
{
    int64_t until = now_ns() + 60000000000LL;
    for (;;) {
        child_stat(c, st);
        if ((sw ? st->sw : st->raw) >= want)
            return;
        if (now_ns() > until)
            die("idle worker holds %lu of %lu %s streams after 60 s", sw ? st->sw : st->raw, want,
                sw ? "streamwire" : "raw");
        sleep_ms(20);
    }
}

static void
idle_cpu(child *c, idle_res *r)
{
    cstat a, b;
    int64_t f0, f1, s0, s1, t0, t1;
    double secs;
    child_stat(c, &a);
    f0 = self_cpu_us();
    s0 = server_cpu_us();
    t0 = now_ns();
    sleep_ms((int)(cfg.idle_cpu_secs * 1000));
    child_stat(c, &b);
    f1 = self_cpu_us();
    s1 = server_cpu_us();
    t1 = now_ns();
    secs = (double)(t1 - t0) / 1e9;
    r->cpu_front = (double)(f1 - f0) / 1e4 / secs;
    r->cpu_worker = (double)(b.cpu_us - a.cpu_us) / 1e4 / secs;
    r->cpu_server = s0 >= 0 && s1 >= 0 ? (double)(s1 - s0) / 1e4 / secs : NAN;
}

/* RSS bookkeeping around opening n idle streams, the same for raw and sw:
 * idle_open_begin before the first open, idle_open_tick after each,
 * idle_open_end once all are open (waits until the worker holds them, fills
 * the RSS and open-time figures of r, then measures idle CPU). */
typedef struct idle_open {
    cstat c0;
    long base, peak, srv0;
    int64_t t0;
    int have_peak;
} idle_open;

static void
idle_open_begin(child *c, idle_open *o)
{
    child_stat(c, &o->c0);
    malloc_trim(0);
    o->have_peak = reset_peak_rss() == 0;
    o->base = self_rss_kb();
    o->peak = o->base;
    o->srv0 = server_rss_kb();
    o->t0 = now_ns();
}

static void
idle_open_tick(idle_open *o, unsigned i)
{
    if (i % 1000 == 999) {
        long v = self_rss_kb();
        if (v > o->peak)
            o->peak = v;
    }
}

static void
idle_open_end(child *c, idle_open *o, int sw, unsigned n, idle_res *r)
{
    cstat c1;
    long after, srv1;
    idle_wait(c, sw, (sw ? o->c0.sw : o->c0.raw) + n, &c1);
    r->open_secs = (double)(now_ns() - o->t0) / 1e9;
    after = self_rss_kb();
    if (o->have_peak)
        o->peak = status_kb("/proc/self/status", "VmHWM");
    else if (after > o->peak)
        o->peak = after;
    srv1 = server_rss_kb();
    r->bytes_per_stream = (double)(after - o->base) * 1024.0 / n;
    r->peak_bytes_per_stream = (double)(o->peak - o->base) * 1024.0 / n;
    r->worker_bytes_per_stream = (double)(c1.rss_kb - o->c0.rss_kb) * 1024.0 / n;
    r->server_bytes_per_stream =
        o->srv0 > 0 && srv1 > 0 ? (double)(srv1 - o->srv0) * 1024.0 / n : NAN;
    progress("  %s: %u open, RSS %+ld KiB (peak %+ld KiB); measuring idle CPU", sw ? "sw" : "raw",
             n, after - o->base, o->peak - o->base);
    idle_cpu(c, r);
}

static void
idle_raw(child *c, unsigned n, idle_res *r)
{
    natsInbox **inbox = calloc(n, sizeof(*inbox));
    natsSubscription **sub = calloc(n, sizeof(*sub));
    breq q = {BREQ_MAGIC, K_IDLE, 0, 0, 0, 0};
    idle_open o;
    if (inbox == NULL || sub == NULL)
        die("out of memory");
    idle_open_begin(c, &o);
    for (unsigned i = 0; i < n; i++) {
        natsStatus s = natsInbox_Create(&inbox[i]);
        if (s == NATS_OK)
            s = natsConnection_SubscribeSync(&sub[i], g_raw_front, inbox[i]);
        if (s == NATS_OK)
            s = natsConnection_PublishRequest(g_raw_front, IDLE_RAW_SUBJ, inbox[i], &q,
                                              (int)sizeof(q));
        if (s != NATS_OK)
            die("raw idle stream %u: %s", i, natsStatus_GetText(s));
        idle_open_tick(&o, i);
    }
    (void)natsConnection_Flush(g_raw_front);
    idle_open_end(c, &o, 0, n, r);
    for (unsigned i = 0; i < n; i++) {
        natsSubscription_Unsubscribe(sub[i]);
        natsSubscription_Destroy(sub[i]);
        natsInbox_Destroy(inbox[i]);
    }
    free(inbox);
    free(sub);
    snprintf(r->note, sizeof(r->note), "%u SubscribeSync + PublishRequest", n);
}

static void
idle_sw(child *c, unsigned n, idle_res *r)
{
    sw_stream **ss = calloc(n, sizeof(*ss));
    breq q = {BREQ_MAGIC, K_IDLE, 0, 0, 0, 0};
    sw_request_opts ro;
    sw_router_stats rs0, rs1;
    idle_open o;
    char line[64];
    if (ss == NULL)
        die("out of memory");
    sw_request_opts_init(&ro);
    ro.endpoint = EP_IDLE;
    ro.instance_id = INST_IDLE;
    ro.credit_window = cfg.window;
    sw_router_stats_get(g_router, &rs0);
    idle_open_begin(c, &o);
    for (unsigned i = 0; i < n; i++) {
        sw_err e = sw_router_open(&ss[i], g_router, &ro, &q, sizeof(q));
        if (e != SW_OK)
            die("sw idle stream %u: %s", i, sw_err_name(e));
        idle_open_tick(&o, i);
    }
    idle_open_end(c, &o, 1, n, r);
    sw_router_stats_get(g_router, &rs1);
    {
        uint64_t ended = 0;
        for (int i = 1; i <= 5; i++)
            ended += rs1.terminals[i] - rs0.terminals[i];
        snprintf(r->note, sizeof(r->note),
                 "%u sw_router_open, window %u; %" PRIu64 " streams ended early (want 0), "
                 "open gauge %" PRIu64,
                 n, cfg.window ? cfg.window : g_default_window, ended, rs1.open_streams);
    }
    for (unsigned i = 0; i < n; i++)
        sw_stream_close(ss[i]);
    free(ss);
    if (child_cmd(c, "release", line, sizeof(line)) != 0)
        die("idle worker: release failed");
}

static void
scen_idle(void)
{
    unsigned n = cfg.idle_n;
    child c;
    idle_res r[2];
    char param[48];
    memset(r, 0, sizeof(r));
    progress("5 idle streams: %u open streams, raw then sw (worker in a child process)", n);
    child_spawn(&c, n);
    idle_raw(&c, n, &r[0]);
    idle_sw(&c, n, &r[1]);
    child_quit(&c);
    snprintf(param, sizeof(param), "%u open streams", n);
    add_row("5 idle streams", param, "frontend B/stream", r[0].bytes_per_stream,
            r[1].bytes_per_stream, 1, 0, r[1].note);
    add_row("5 idle streams", param, "peak B/stream", r[0].peak_bytes_per_stream,
            r[1].peak_bytes_per_stream, 1, 0, "VmHWM reset before opening");
    add_row("5 idle streams", param, "worker B/stream", r[0].worker_bytes_per_stream,
            r[1].worker_bytes_per_stream, 1, 0, "child process RSS delta");
    add_row("5 idle streams", param, "server B/stream", r[0].server_bytes_per_stream,
            r[1].server_bytes_per_stream, 1, 0,
            "nats-server RSS delta (raw: one SUB per stream)");
    add_row("5 idle streams", param, "open secs", r[0].open_secs, r[1].open_secs, 1, 2,
            "until the worker holds all");
    add_row("5 idle streams", param, "frontend CPU %", r[0].cpu_front, r[1].cpu_front, 1, 1,
            "while idle (% of one core)");
    add_row("5 idle streams", param, "worker CPU %", r[0].cpu_worker, r[1].cpu_worker, 1, 1,
            "while idle; sw: heartbeats + 25 ms scans");
    add_row("5 idle streams", param, "server CPU %", r[0].cpu_server, r[1].cpu_server, 1, 1,
            "while idle");
    g_goal_idle_bps = r[1].bytes_per_stream;
    g_goal_idle_window = cfg.window ? cfg.window : g_default_window;
}

/* --- the child */

static atomic_ulong g_idle_raw_count, g_idle_sw_count;
static pthread_mutex_t g_idle_mu = PTHREAD_MUTEX_INITIALIZER;
static sw_responder **g_idle_held;
static size_t g_idle_nheld, g_idle_cap;

static void
idle_raw_cb(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *arg)
{
    (void)nc;
    (void)sub;
    (void)arg;
    atomic_fetch_add(&g_idle_raw_count, 1);
    natsMsg_Destroy(m);
}

static void
idle_sw_handler(sw_responder *r, void *arg)
{
    (void)arg;
    sw_responder_retain(r);
    pthread_mutex_lock(&g_idle_mu);
    if (g_idle_nheld < g_idle_cap) {
        g_idle_held[g_idle_nheld++] = r;
        r = NULL;
    }
    pthread_mutex_unlock(&g_idle_mu);
    if (r != NULL) {
        (void)sw_responder_fail(r, "bench_full", NULL);
        sw_responder_release(r);
        return;
    }
    atomic_fetch_add(&g_idle_sw_count, 1);
}

static int
idle_worker_main(const char *url, unsigned n)
{
    natsConnection *nc;
    natsSubscription *sub = NULL;
    sw_ingress_opts io;
    sw_ingress *ing = NULL;
    sw_err e;
    char line[128];
    pid_t parent = getppid();

    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        return 1;
    setvbuf(stdout, NULL, _IOLBF, 0);
    g_idle_cap = (size_t)n + 64;
    if ((g_idle_held = calloc(g_idle_cap, sizeof(*g_idle_held))) == NULL)
        return 1;
    nc = raw_connect(url, "bench-idle-raw");
    if (natsConnection_Subscribe(&sub, nc, IDLE_RAW_SUBJ, idle_raw_cb, NULL) != NATS_OK ||
        natsSubscription_SetPendingLimits(sub, -1, -1) != NATS_OK ||
        natsConnection_Flush(nc) != NATS_OK)
        die("idle worker: raw subscribe failed");
    g_sw_work = sw_connect(url, "bench-idle-worker");
    sw_ingress_opts_init(&io);
    io.endpoint = EP_IDLE;
    io.instance_id = INST_IDLE;
    io.handler = idle_sw_handler;
    io.max_inflight = n + 64; /* counts retained responders */
    io.max_window = 1u << 20; /* only a cap: lets --window N reach this worker */
    if ((e = sw_ingress_start(&ing, g_sw_work, &io)) != SW_OK)
        die("idle worker: sw_ingress_start: %s", sw_err_name(e));
    printf("ready\n");
    while (fgets(line, sizeof(line), stdin) != NULL) {
        if (strncmp(line, "stat", 4) == 0) {
            printf("stat %ld %lu %lu %lld\n", self_rss_kb(), atomic_load(&g_idle_raw_count),
                   atomic_load(&g_idle_sw_count), (long long)self_cpu_us());
        } else if (strncmp(line, "release", 7) == 0) {
            pthread_mutex_lock(&g_idle_mu);
            for (size_t i = 0; i < g_idle_nheld; i++)
                sw_responder_release(g_idle_held[i]);
            g_idle_nheld = 0;
            pthread_mutex_unlock(&g_idle_mu);
            printf("released\n");
        } else if (strncmp(line, "quit", 4) == 0) {
            printf("bye\n");
            break;
        }
    }
    sw_ingress_destroy(ing);
    pthread_mutex_lock(&g_idle_mu);
    for (size_t i = 0; i < g_idle_nheld; i++)
        sw_responder_release(g_idle_held[i]);
    g_idle_nheld = 0;
    pthread_mutex_unlock(&g_idle_mu);
    sw_conn_close(g_sw_work);
    natsSubscription_Unsubscribe(sub);
    natsSubscription_Destroy(sub);
    natsConnection_Destroy(nc);
    free(g_idle_held);
    nats_Close();
    return 0;
}

/* ------------------------------------------------------------------ 7: instance loss (issue 4) */

/* Workers run in child processes (this binary with --worker-mode), each
 * registered in the registry bucket LOSS_BUCKET with default options.
 * Router A (this process; own sw_conn, sw_registry and sw_router, default
 * options) holds a stream to the victim and is the one that detects the loss
 * and reports it. Router B (own sw_conn, sw_registry and sw_router, probes
 * effectively off) sends a short request, routed by the registry, every
 * 2 ms, and logs which instance each one was routed to. */

static int
loss_worker_main(const char *url, const char *bucket, const char *inst)
{
    sw_ingress_opts io;
    sw_ingress *ing = NULL;
    sw_registry_opts ro;
    sw_registry *reg = NULL;
    sw_err e;
    char line[64];
    pid_t parent = getppid();

    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        return 1;
    setvbuf(stdout, NULL, _IOLBF, 0);
    g_sw_work = sw_connect(url, "bench-loss-worker");
    sw_ingress_opts_init(&io);
    io.endpoint = EP_LOSS;
    io.instance_id = inst;
    io.handler = sw_bench_handler;
    io.max_inflight = 256;
    if ((e = sw_ingress_start(&ing, g_sw_work, &io)) != SW_OK)
        die("loss worker: sw_ingress_start: %s", sw_err_name(e));
    sw_registry_opts_init(&ro);
    ro.bucket = bucket;
    if ((e = sw_registry_open(&reg, g_sw_work, &ro)) != SW_OK ||
        (e = sw_registry_register(reg, ing)) != SW_OK)
        die("loss worker: registry: %s", sw_err_name(e));
    printf("ready\n");
    while (fgets(line, sizeof(line), stdin) != NULL)
        if (strncmp(line, "quit", 4) == 0)
            break;
    (void)sw_registry_deregister(reg, inst);
    sw_registry_close(reg);
    sw_ingress_destroy(ing);
    sw_conn_close(g_sw_work);
    nats_Close();
    return 0;
}

static pthread_mutex_t g_loss_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_loss_victim[SW_MAX_TOKEN + 1]; /* "" between trials */
static int64_t g_loss_rep_t;  /* A's registry logged "reported <victim> dead" */
static int64_t g_loss_rm_a_t; /* REMOVED <victim> in A's registry handle */
static int64_t g_loss_rm_b_t; /* REMOVED <victim> in B's registry handle */

static int
loss_is_victim_locked(const char *id)
{
    return g_loss_victim[0] != '\0' && id != NULL && strcmp(id, g_loss_victim) == 0;
}

/* Router A's registry log: the line the registry writes once the tombstone
 * of a dead report is stored ("registry: reported <id> dead (...)") is the
 * report's completion time. */
static void
loss_reg_log(void *arg, sw_log_level lvl, const char *msg)
{
    static const char pre[] = "registry: reported ";
    int64_t t = now_ns();
    (void)arg;
    if (strncmp(msg, pre, sizeof(pre) - 1) == 0) {
        const char *id = msg + sizeof(pre) - 1;
        size_t l;
        pthread_mutex_lock(&g_loss_mu);
        l = strlen(g_loss_victim);
        if (l > 0 && strncmp(id, g_loss_victim, l) == 0 && id[l] == ' ' && g_loss_rep_t == 0)
            g_loss_rep_t = t;
        pthread_mutex_unlock(&g_loss_mu);
    }
    if (cfg.verbose)
        progress("  [A registry %s] %s", sw_log_level_name(lvl), msg);
}

static void
loss_rt_log(void *arg, sw_log_level lvl, const char *msg)
{
    progress("  [%s %s] %s", (const char *)arg, sw_log_level_name(lvl), msg);
}

/* Watcher on a registry handle: the first REMOVED of the victim. */
static void
loss_watch(void *arg, sw_registry_event ev, const sw_instance *inst)
{
    int64_t t = now_ns();
    int64_t *slot = arg;
    if (ev != SW_REGISTRY_REMOVED)
        return;
    pthread_mutex_lock(&g_loss_mu);
    if (loss_is_victim_locked(inst->instance_id) && *slot == 0)
        *slot = t;
    pthread_mutex_unlock(&g_loss_mu);
}

typedef struct bsub {
    struct bsub *next;
    sw_stream *s;
    int64_t t_open;
    size_t idx; /* in the pick log */
    atomic_int done;
    int status;
    sw_err err;
} bsub;

typedef struct bpick {
    int64_t t;  /* when sw_router_open returned (the pick is made inside it) */
    int victim; /* routed to the current victim */
    int result; /* -1 open, 0 failed, 1 completed */
} bpick;

static struct {
    sw_conn *conn;
    sw_registry *reg;
    sw_router *rt;
    int watch;
    pthread_t th;
    atomic_int stop;
    pthread_mutex_t mu;
    bpick *log;
    size_t n, cap;
    unsigned long opened, failed, open_errors;
    unsigned long f_incomplete, f_lost, f_noresp, f_other, f_stuck; /* failures by cause */
    bsub *grave; /* reaped, freed after the router is destroyed */
} g_b = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void
b_item(sw_stream *s, const sw_item *it, void *arg)
{
    bsub *x = arg;
    (void)s;
    if (it->kind == SW_ITEM_TERMINAL) {
        x->status = (int)it->terminal.status;
        x->err = it->terminal.error;
        atomic_store(&x->done, 1);
    }
}

/* Closes B's finished streams (all: every one; else those with a terminal
 * and those open for more than 3 s, which count as failed). */
static void
b_reap(bsub **head, int all)
{
    int64_t now = now_ns();
    bsub **pp = head;
    while (*pp != NULL) {
        bsub *x = *pp;
        int done = atomic_load(&x->done);
        if (done || all || now - x->t_open > 3000000000LL) {
            int ok = done && x->status == SW_STATUS_COMPLETED;
            sw_stream_close(x->s);
            pthread_mutex_lock(&g_b.mu);
            g_b.log[x->idx].result = ok;
            if (!ok) {
                g_b.failed++;
                if (!done)
                    g_b.f_stuck++;
                else if (x->err == SW_STREAM_INCOMPLETE)
                    g_b.f_incomplete++;
                else if (x->err == SW_INSTANCE_LOST)
                    g_b.f_lost++;
                else if (x->err == SW_NO_RESPONDERS)
                    g_b.f_noresp++;
                else
                    g_b.f_other++;
            }
            pthread_mutex_unlock(&g_b.mu);
            *pp = x->next;
            x->next = g_b.grave;
            g_b.grave = x;
        } else {
            pp = &x->next;
        }
    }
}

static void *
b_main(void *arg)
{
    bsub *live = NULL;
    breq q = {BREQ_MAGIC, K_SEND, 1, 64, 0, 0};
    (void)arg;
    while (!atomic_load(&g_b.stop)) {
        sw_request_opts ro;
        bsub *x = calloc(1, sizeof(*x));
        int64_t t;
        sw_err e;
        if (x == NULL)
            die("out of memory");
        atomic_init(&x->done, 0);
        sw_request_opts_init(&ro);
        ro.endpoint = EP_LOSS;
        ro.on_item = b_item;
        ro.on_item_arg = x;
        e = sw_router_open(&x->s, g_b.rt, &ro, &q, sizeof(q));
        t = now_ns();
        if (e != SW_OK) {
            g_b.open_errors++;
            free(x);
            sleep_ms(2);
            continue;
        }
        x->t_open = t;
        {
            int victim;
            pthread_mutex_lock(&g_loss_mu);
            victim = loss_is_victim_locked(sw_stream_instance_id(x->s));
            pthread_mutex_unlock(&g_loss_mu);
            pthread_mutex_lock(&g_b.mu);
            if (g_b.n == g_b.cap) {
                size_t ncap = g_b.cap ? g_b.cap * 2 : 4096;
                bpick *nv = realloc(g_b.log, ncap * sizeof(*nv));
                if (nv == NULL)
                    die("out of memory");
                g_b.log = nv;
                g_b.cap = ncap;
            }
            x->idx = g_b.n;
            g_b.log[g_b.n].t = t;
            g_b.log[g_b.n].victim = victim;
            g_b.log[g_b.n].result = -1;
            g_b.n++;
            g_b.opened++;
            pthread_mutex_unlock(&g_b.mu);
        }
        x->next = live;
        live = x;
        b_reap(&live, 0);
        sleep_until_ns(t + 2000000LL);
    }
    b_reap(&live, 1);
    return NULL;
}

typedef struct lkid {
    child c;
    char inst[SW_MAX_TOKEN + 1];
    int state; /* 0 free, 1 starting, 2 ready */
    unsigned seq;
} lkid;

static unsigned g_lkid_seq;

static void
lkid_start(lkid *k)
{
    char *argv[6];
    k->seq = ++g_lkid_seq;
    snprintf(k->inst, sizeof(k->inst), "lw%d-%u", (int)getpid(), k->seq);
    argv[0] = (char *)"streamwire-bench";
    argv[1] = (char *)"--worker-mode";
    argv[2] = (char *)g_url;
    argv[3] = (char *)LOSS_BUCKET;
    argv[4] = k->inst;
    argv[5] = NULL;
    child_start(&k->c, argv);
    k->state = 1;
}

/* 1 if the registry handle lists inst as live on EP_LOSS. */
static int
reg_has(sw_registry *reg, const char *inst)
{
    sw_instance *v = NULL;
    size_t n = 0;
    int found = 0;
    if (sw_registry_list(reg, EP_LOSS, &v, &n) != SW_OK)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (strcmp(v[i].instance_id, inst) == 0)
            found = 1;
    sw_instances_free(v, n);
    return found;
}

/* Waits for the worker's "ready" and for both routers' registry views to
 * list it. */
static void
lkid_wait(lkid *k, sw_registry *a, sw_registry *b)
{
    char line[64];
    int64_t until;
    if (k->state == 1) {
        if (child_line(&k->c, line, sizeof(line), 20000) != 0 || strcmp(line, "ready") != 0)
            die("loss worker %s did not start", k->inst);
        k->state = 2;
    }
    until = now_ns() + 10000000000LL;
    while (!reg_has(a, k->inst) || !reg_has(b, k->inst)) {
        if (now_ns() > until)
            die("loss worker %s registered but is not listed by both routers after 10 s",
                k->inst);
        sleep_ms(2);
    }
}

typedef struct asink {
    atomic_ulong items;
    int64_t t_term;
    int status;
    sw_err err;
    char reason[96];
    latch done;
} asink;

static void
a_item(sw_stream *s, const sw_item *it, void *arg)
{
    asink *k = arg;
    (void)s;
    if (it->kind == SW_ITEM_DATA) {
        atomic_fetch_add(&k->items, 1);
        return;
    }
    k->t_term = now_ns();
    k->status = (int)it->terminal.status;
    k->err = it->terminal.error;
    snprintf(k->reason, sizeof(k->reason), "%s", it->terminal.reason);
    latch_set(&k->done);
}

typedef struct ltrial {
    int stop; /* 0 SIGKILL, 1 SIGSTOP */
    int ok;   /* the trial ran to the end */
    int64_t start_t, kill_t, term_t, rep_t, rm_a_t, rm_b_t, end_t;
    int lost;     /* terminal was error instance_lost */
    char term[64];
    /* from B's pick log */
    int64_t b_last_dead_t; /* B's last pick of the victim in the trial */
    unsigned dead_picks, after_report, after_report_failed, after_view;
    int64_t after_report_lag; /* latest such pick - report */
} ltrial;

/* The rows of a streamwire-only latency set (raw column "-"): "p50 <unit>"
 * (note50), "p99 <unit>" (note99) and, when with_max, "max <unit>". v holds n
 * ns values, sorted in place; unit is "ms" or "us". Returns the p99. */
static double
lat_rows_sw(const char *scen, const char *param, int64_t *v, size_t n, const char *unit,
            int prec, int with_max, const char *note50, const char *note99)
{
    double div = strcmp(unit, "ms") == 0 ? 1e6 : 1e3;
    double p99;
    char metric[16];
    qsort(v, n, sizeof(*v), cmp_i64);
    p99 = pct(v, n, 0.99) / div;
    snprintf(metric, sizeof(metric), "p50 %s", unit);
    add_row(scen, param, metric, NAN, pct(v, n, 0.50) / div, 1, prec, note50);
    snprintf(metric, sizeof(metric), "p99 %s", unit);
    add_row(scen, param, metric, NAN, p99, 1, prec, note99);
    if (with_max) {
        snprintf(metric, sizeof(metric), "max %s", unit);
        add_row(scen, param, metric, NAN, n ? (double)v[n - 1] / div : NAN, 1, prec, "");
    }
    return p99;
}

/* goal inputs (issue 4) */
static double g_goal_kill_p99 = NAN, g_goal_stop_p99 = NAN, g_goal_report_p99 = NAN;
static double g_goal_after_report = NAN;
static unsigned g_goal_loss_n;

static void
loss_rows(ltrial *tr, unsigned ntr, const char *err)
{
    int64_t *v = calloc(ntr + 1, sizeof(int64_t));
    size_t n;
    double p99;
    char param[48], note[200];
    unsigned lost[2] = {0, 0}, ran[2] = {0, 0}, after[2] = {0, 0}, afterf[2] = {0, 0};
    unsigned reported = 0, dead_picks[2] = {0, 0}, after_view[2] = {0, 0};
    int64_t lag[2] = {0, 0};
    if (v == NULL)
        die("out of memory");
    for (unsigned i = 0; i < ntr; i++)
        if (tr[i].ok) {
            ran[tr[i].stop]++;
            lost[tr[i].stop] += tr[i].lost;
            after[tr[i].stop] += tr[i].after_report;
            afterf[tr[i].stop] += tr[i].after_report_failed;
            dead_picks[tr[i].stop] += tr[i].dead_picks;
            after_view[tr[i].stop] += tr[i].after_view;
            if (tr[i].after_report_lag > lag[tr[i].stop])
                lag[tr[i].stop] = tr[i].after_report_lag;
            reported += tr[i].rep_t != 0;
        }
    for (int stop = 0; stop < 2; stop++) {
        const char *sig = stop ? "SIGSTOP" : "SIGKILL";
        n = 0;
        for (unsigned i = 0; i < ntr; i++)
            if (tr[i].ok && tr[i].stop == stop && tr[i].term_t)
                v[n++] = tr[i].term_t - tr[i].kill_t;
        snprintf(param, sizeof(param), "%s mid-stream -> terminal, %zu trials", sig, n);
        snprintf(note, sizeof(note),
                 "terminal instance_lost in %u/%u; router A defaults (probe %s)%s%.100s",
                 lost[stop], ran[stop], stop ? "100 ms, timeout 300 ms x 2 misses" : "100 ms",
                 err[0] ? "; " : "", err);
        p99 = lat_rows_sw("7 instance loss", param, v, n, "ms", 1, 1, note,
                          stop ? "goal <= 1500 ms (issue 4)" : "goal <= 250 ms (issue 4)");
        if (stop)
            g_goal_stop_p99 = p99;
        else
            g_goal_kill_p99 = p99;
    }
    /* the report's write, after the consumer's terminal */
    n = 0;
    for (unsigned i = 0; i < ntr; i++)
        if (tr[i].ok && tr[i].rep_t && tr[i].term_t)
            v[n++] = tr[i].rep_t - tr[i].term_t;
    snprintf(param, sizeof(param), "A's terminal -> report stored, %zu trials", n);
    snprintf(note, sizeof(note),
             "report time = router A's registry logs the stored tombstone; %u/%u trials "
             "reported",
             reported, ran[0] + ran[1]);
    lat_rows_sw("7 instance loss", param, v, n, "ms", 2, 0, note, "");
    for (int stop = 1; stop >= 0; stop--) {
        const char *sig = stop ? "SIGSTOP" : "SIGKILL";
        n = 0;
        for (unsigned i = 0; i < ntr; i++)
            if (tr[i].ok && tr[i].stop == stop && tr[i].rep_t && tr[i].b_last_dead_t)
                v[n++] = tr[i].b_last_dead_t - tr[i].rep_t;
        snprintf(param, sizeof(param), "report -> B's last pick of it, %s", sig);
        snprintf(note, sizeof(note),
                 stop ? "signed; B: own conn+registry+router, probes off, a request every 2 ms "
                        "round robin over all live workers"
                      : "< 0: B had stopped before the report (its own no-responders re-route "
                        "quarantines locally)");
        lat_rows_sw("7 instance loss", param, v, n, "ms", 1, 1, note, "");
    }
    n = 0;
    for (unsigned i = 0; i < ntr; i++)
        if (tr[i].ok && tr[i].rep_t && tr[i].rm_b_t)
            v[n++] = tr[i].rm_b_t - tr[i].rep_t;
    snprintf(param, sizeof(param), "report -> REMOVED at router B, %zu trials", n);
    lat_rows_sw("7 instance loss", param, v, n, "ms", 2, 1,
                "watch event in B's registry handle; from then on B's pool can pick survivors "
                "only",
                "");
    /* goal: report -> all other routers = max(B stops picking, B's view) */
    n = 0;
    for (unsigned i = 0; i < ntr; i++)
        if (tr[i].ok && tr[i].rep_t && tr[i].rm_b_t) {
            int64_t a = tr[i].rm_b_t, b = tr[i].b_last_dead_t ? tr[i].b_last_dead_t : a;
            v[n++] = (a > b ? a : b) - tr[i].rep_t;
        }
    qsort(v, n, sizeof(*v), cmp_i64);
    g_goal_report_p99 = pct(v, n, 0.99) / 1e6;
    for (int stop = 1; stop >= 0; stop--) {
        snprintf(param, sizeof(param), "B requests to dead after report, %s",
                 stop ? "SIGSTOP" : "SIGKILL");
        snprintf(note, sizeof(note),
                 "%u trials; %u failed; latest %.1f ms after the report; %u after B's REMOVED "
                 "event; %u picks of it since the %s",
                 ran[stop], afterf[stop], (double)lag[stop] / 1e6, after_view[stop],
                 dead_picks[stop], stop ? "stop" : "kill");
        add_row("7 instance loss", param, "count", NAN, after[stop], 1, 0, note);
    }
    snprintf(note, sizeof(note),
             "one every 2 ms; %lu failed: stream_incomplete %lu, instance_lost %lu, "
             "no_responders %lu, other %lu, closed by the bench before a terminal %lu; "
             "open errors %lu",
             g_b.failed, g_b.f_incomplete, g_b.f_lost, g_b.f_noresp, g_b.f_other, g_b.f_stuck,
             g_b.open_errors);
    add_row("7 instance loss", "router B, whole scenario", "requests", NAN, (double)g_b.opened,
            0, 0, note);
    g_goal_after_report = after[0] + after[1];
    g_goal_loss_n = ran[0] + ran[1];
    free(v);
}

static void
scen_loss(void)
{
    unsigned T = cfg.trials, ntr = 2 * cfg.trials;
    ltrial *tr = calloc(ntr, sizeof(*tr));
    lkid kid[3];
    sw_conn *ca;
    sw_registry *rega = NULL;
    sw_router *rta = NULL;
    sw_registry_opts rgo;
    sw_router_opts rto;
    int wa = 0;
    sw_err e;
    char err[160] = "";

    if (tr == NULL)
        die("out of memory");
    progress("7 instance loss: %u SIGKILL + %u SIGSTOP trials, alternating (workers in child "
             "processes, registry bucket %s)",
             T, T, LOSS_BUCKET);
    memset(kid, 0, sizeof(kid));
    ca = sw_connect(g_url, "bench-loss-router-a");
    sw_registry_opts_init(&rgo);
    rgo.bucket = LOSS_BUCKET;
    rgo.log = loss_reg_log;
    if ((e = sw_registry_open(&rega, ca, &rgo)) != SW_OK) {
        snprintf(err, sizeof(err), "skipped: sw_registry_open: %s (needs nats-server -js)",
                 sw_err_name(e));
        progress("  %s", err);
        sw_conn_close(ca);
        loss_rows(tr, 0, err);
        free(tr);
        return;
    }
    if ((e = sw_registry_watch(rega, loss_watch, &g_loss_rm_a_t, &wa)) != SW_OK)
        die("sw_registry_watch: %s", sw_err_name(e));
    sw_router_opts_init(&rto);
    rto.registry = rega;
    rto.log = cfg.verbose ? loss_rt_log : NULL;
    rto.log_arg = (void *)"router A";
    if ((e = sw_router_create(&rta, ca, &rto)) != SW_OK)
        die("router A: %s", sw_err_name(e));

    g_b.conn = sw_connect(g_url, "bench-loss-router-b");
    sw_registry_opts_init(&rgo);
    rgo.bucket = LOSS_BUCKET;
    if ((e = sw_registry_open(&g_b.reg, g_b.conn, &rgo)) != SW_OK ||
        (e = sw_registry_watch(g_b.reg, loss_watch, &g_loss_rm_b_t, &g_b.watch)) != SW_OK)
        die("router B registry: %s", sw_err_name(e));
    sw_router_opts_init(&rto);
    rto.registry = g_b.reg;
    rto.probe_interval_ms = 3600000; /* effectively off: B learns only from the registry
                                        (and from no-responders on its own requests) */
    if ((e = sw_router_create(&g_b.rt, g_b.conn, &rto)) != SW_OK)
        die("router B: %s", sw_err_name(e));

    lkid_start(&kid[0]);
    lkid_start(&kid[1]);
    lkid_wait(&kid[0], rega, g_b.reg);
    lkid_wait(&kid[1], rega, g_b.reg);
    atomic_store(&g_b.stop, 0);
    if (pthread_create(&g_b.th, NULL, b_main, NULL) != 0)
        die("pthread_create");

    for (unsigned i = 0; i < ntr; i++) {
        ltrial *t = &tr[i];
        lkid *v = NULL, *fresh = NULL;
        asink *k;
        sw_stream *s = NULL;
        sw_request_opts ro;
        breq q = {BREQ_MAGIC, K_SEND, 1000000, 64, 500, 0};
        int64_t until;
        t->stop = (int)(i % 2);
        for (int j = 0; j < 3; j++)
            if (kid[j].state != 0)
                lkid_wait(&kid[j], rega, g_b.reg);
        for (int j = 0; j < 3; j++)
            if (kid[j].state == 2 && (v == NULL || kid[j].seq < v->seq))
                v = &kid[j];
        if ((k = calloc(1, sizeof(*k))) == NULL)
            die("out of memory");
        latch_init(&k->done);
        pthread_mutex_lock(&g_loss_mu);
        snprintf(g_loss_victim, sizeof(g_loss_victim), "%s", v->inst);
        g_loss_rep_t = g_loss_rm_a_t = g_loss_rm_b_t = 0;
        t->start_t = now_ns();
        pthread_mutex_unlock(&g_loss_mu);
        sw_request_opts_init(&ro);
        ro.endpoint = EP_LOSS;
        ro.instance_id = v->inst;
        ro.on_item = a_item;
        ro.on_item_arg = k;
        if ((e = sw_router_open(&s, rta, &ro, &q, sizeof(q))) != SW_OK)
            die("router A open: %s", sw_err_name(e));
        until = now_ns() + 5000000000LL;
        while (atomic_load(&k->items) < 10 && !latch_wait(&k->done, 0) && now_ns() < until)
            sleep_ms(1);
        if (atomic_load(&k->items) < 10) {
            snprintf(err, sizeof(err),
                     "trial %u: stream to %.24s got %lu items before the kill (%.40s)",
                     i, v->inst, atomic_load(&k->items), k->reason);
            progress("  %s", err);
        }
        /* decorrelate the kill from the probe timer */
        sleep_ms(rand() % 50);
        t->kill_t = now_ns();
        kill(v->c.pid, t->stop ? SIGSTOP : SIGKILL);
        for (int j = 0; j < 3; j++)
            if (kid[j].state == 0 && fresh == NULL)
                fresh = &kid[j];
        lkid_start(fresh);
        if (latch_wait(&k->done, 10000000000LL)) {
            t->term_t = k->t_term;
            t->lost = k->status == SW_STATUS_ERROR && k->err == SW_INSTANCE_LOST;
            snprintf(t->term, sizeof(t->term), "%s/%.40s", sw_status_name(k->status), k->reason);
        } else {
            snprintf(t->term, sizeof(t->term), "none in 10 s");
        }
        /* the report and both registry views */
        until = now_ns() + 5000000000LL;
        for (;;) {
            int have;
            pthread_mutex_lock(&g_loss_mu);
            have = g_loss_rep_t && g_loss_rm_a_t && g_loss_rm_b_t;
            pthread_mutex_unlock(&g_loss_mu);
            if (have || now_ns() > until)
                break;
            sleep_ms(2);
        }
        sleep_ms(40); /* B makes some more picks */
        pthread_mutex_lock(&g_loss_mu);
        t->rep_t = g_loss_rep_t;
        t->rm_a_t = g_loss_rm_a_t;
        t->rm_b_t = g_loss_rm_b_t;
        g_loss_victim[0] = '\0';
        pthread_mutex_unlock(&g_loss_mu);
        t->end_t = now_ns();
        t->ok = 1;
        sw_stream_close(s);
        latch_fini(&k->done);
        free(k);
        if (cfg.verbose || !t->lost || !t->rep_t)
            progress("  trial %u %s %s: terminal %s after %.1f ms; report %+.1f ms; "
                     "B view %+.1f ms",
                     i + 1, t->stop ? "SIGSTOP" : "SIGKILL", v->inst, t->term,
                     t->term_t ? (double)(t->term_t - t->kill_t) / 1e6 : NAN,
                     t->rep_t ? (double)(t->rep_t - t->kill_t) / 1e6 : NAN,
                     t->rm_b_t && t->rep_t ? (double)(t->rm_b_t - t->rep_t) / 1e6 : NAN);
        if (t->stop) {
            kill(v->c.pid, SIGKILL);
            kill(v->c.pid, SIGCONT);
        }
        child_reap(&v->c, 0);
        v->state = 0;
    }
    atomic_store(&g_b.stop, 1);
    pthread_join(g_b.th, NULL);

    /* B's picks per trial window */
    for (unsigned i = 0; i < ntr; i++) {
        ltrial *t = &tr[i];
        int64_t ref = t->rep_t;
        for (size_t j = 0; j < g_b.n; j++) {
            bpick *p = &g_b.log[j];
            if (p->t < t->start_t || p->t >= t->end_t || !p->victim)
                continue;
            t->b_last_dead_t = p->t; /* the log is in time order */
            if (p->t < t->kill_t)
                continue;
            t->dead_picks++;
            if (ref && p->t > ref) {
                t->after_report++;
                t->after_report_failed += p->result == 0;
                if (p->t - ref > t->after_report_lag)
                    t->after_report_lag = p->t - ref;
            }
            if (t->rm_b_t && p->t > t->rm_b_t)
                t->after_view++;
        }
    }
    loss_rows(tr, ntr, err);

    sw_router_destroy(g_b.rt);
    while (g_b.grave != NULL) {
        bsub *x = g_b.grave;
        g_b.grave = x->next;
        free(x);
    }
    sw_registry_unwatch(g_b.reg, g_b.watch);
    sw_registry_close(g_b.reg);
    sw_conn_close(g_b.conn);
    free(g_b.log);
    g_b.log = NULL;
    for (int j = 0; j < 3; j++)
        if (kid[j].state != 0) {
            ssize_t w = write(kid[j].c.to, "quit\n", 5);
            (void)w;
        }
    for (int j = 0; j < 3; j++)
        if (kid[j].state != 0)
            child_reap(&kid[j].c, 3000);
    sw_router_destroy(rta);
    sw_registry_unwatch(rega, wa);
    sw_registry_close(rega);
    sw_conn_close(ca);
    free(tr);
}

/* ------------------------------------------------------------------ 8: cancellation (issue 5) */

/* The worker side is an ingress in this process (EP_CANCEL, on the worker
 * connection); its handler registers sw_responder_on_cancel and sends an
 * item every ms (or every 10 ms for the frontend-kill trials) until send
 * fails. Each request's cancel callback time is kept by request id. */

typedef struct cslot {
    struct cslot *next;
    char reqid[40];
    int64_t t_cb, t_stop; /* under g_cs_mu */
    sw_err send_err;
} cslot;

static pthread_mutex_t g_cs_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cs_cv;
static cslot *g_cs_head;

static void
cancel_cb(sw_responder *r, void *arg)
{
    cslot *c = arg;
    int64_t t = now_ns();
    (void)r;
    pthread_mutex_lock(&g_cs_mu);
    if (c->t_cb == 0)
        c->t_cb = t;
    pthread_cond_broadcast(&g_cs_cv);
    pthread_mutex_unlock(&g_cs_mu);
}

static void
cancel_handler(sw_responder *r, void *arg)
{
    size_t len = 0;
    const void *p = sw_responder_payload(r, &len);
    breq q;
    cslot *c;
    uint8_t buf[64];
    sw_err e = SW_OK;
    int64_t t0, iv;
    (void)arg;
    if (p == NULL || len < sizeof(q) || (c = calloc(1, sizeof(*c))) == NULL) {
        (void)sw_responder_fail(r, "bench_bad_request", NULL);
        return;
    }
    memcpy(&q, p, sizeof(q));
    snprintf(c->reqid, sizeof(c->reqid), "%s", sw_responder_request_id(r));
    pthread_mutex_lock(&g_cs_mu);
    c->next = g_cs_head;
    g_cs_head = c;
    pthread_cond_broadcast(&g_cs_cv);
    pthread_mutex_unlock(&g_cs_mu);
    sw_responder_on_cancel(r, cancel_cb, c);
    memset(buf, 0, sizeof(buf));
    t0 = now_ns();
    iv = q.rate ? 1000000000LL / q.rate : 0;
    for (uint32_t i = 0; i < q.n; i++) {
        if (iv)
            sleep_until_ns(t0 + (int64_t)i * iv);
        stamp(buf, sizeof(buf));
        if ((e = sw_responder_send(r, buf, sizeof(buf))) != SW_OK)
            break;
    }
    if (e == SW_OK)
        (void)sw_responder_finish(r, SW_STATUS_COMPLETED, NULL);
    pthread_mutex_lock(&g_cs_mu);
    c->t_stop = now_ns();
    c->send_err = e;
    pthread_cond_broadcast(&g_cs_cv);
    pthread_mutex_unlock(&g_cs_mu);
}

/* The cancel callback time of request reqid (0 if none within timeout);
 * *t_stop gets the time its handler stopped sending (0 if not yet). */
static int64_t
cslot_wait(const char *reqid, int64_t timeout_ns, int64_t *t_stop)
{
    int64_t until = now_ns() + timeout_ns, t = 0;
    struct timespec ts;
    ts.tv_sec = (time_t)(until / 1000000000LL);
    ts.tv_nsec = (long)(until % 1000000000LL);
    pthread_mutex_lock(&g_cs_mu);
    for (;;) {
        cslot *c;
        for (c = g_cs_head; c != NULL && strcmp(c->reqid, reqid) != 0; c = c->next) {
        }
        if (c != NULL && c->t_cb != 0) {
            t = c->t_cb;
            if (t_stop != NULL)
                *t_stop = c->t_stop;
            break;
        }
        if (pthread_cond_timedwait(&g_cs_cv, &g_cs_mu, &ts) == ETIMEDOUT)
            break;
    }
    pthread_mutex_unlock(&g_cs_mu);
    return t;
}

/* Hidden mode --frontend-mode URL: a frontend process that, on "go", opens a
 * stream to INST_CANCEL, prints "streaming <request id>" after the first
 * item and reads until it is killed. */
static int
frontend_main(const char *url)
{
    sw_conn *c;
    sw_router *rt = NULL;
    sw_router_opts o;
    sw_request_opts ro;
    sw_stream *s = NULL;
    breq q = {BREQ_MAGIC, K_SEND, 1000000, 64, 100, 0};
    char line[64];
    const sw_item *it;
    sw_err e;
    pid_t parent = getppid();

    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        return 1;
    setvbuf(stdout, NULL, _IOLBF, 0);
    c = sw_connect(url, "bench-frontend-child");
    sw_router_opts_init(&o);
    if ((e = sw_router_create(&rt, c, &o)) != SW_OK)
        die("frontend child: sw_router_create: %s", sw_err_name(e));
    printf("ready\n");
    if (fgets(line, sizeof(line), stdin) == NULL || strncmp(line, "go", 2) != 0)
        goto out;
    sw_request_opts_init(&ro);
    ro.endpoint = EP_CANCEL;
    ro.instance_id = INST_CANCEL;
    if ((e = sw_router_open(&s, rt, &ro, &q, sizeof(q))) != SW_OK)
        die("frontend child: sw_router_open: %s", sw_err_name(e));
    for (;;) {
        if ((e = sw_stream_next(s, &it, 10000)) != SW_OK)
            die("frontend child: sw_stream_next: %s", sw_err_name(e));
        if (it->kind == SW_ITEM_DATA)
            break;
        die("frontend child: terminal before data: %s", it->terminal.reason);
    }
    printf("streaming %s\n", sw_stream_request_id(s));
    for (;;) {
        e = sw_stream_next(s, &it, 1000);
        if (e == SW_OK && it->kind == SW_ITEM_TERMINAL) {
            printf("ended %s\n", it->terminal.reason);
            break;
        }
        if (e != SW_OK && e != SW_ETIMEDOUT)
            break;
    }
    while (fgets(line, sizeof(line), stdin) != NULL)
        if (strncmp(line, "quit", 4) == 0)
            break;
out:
    sw_stream_close(s);
    sw_router_destroy(rt);
    sw_conn_close(c);
    nats_Close();
    return 0;
}

static void
fe_start(child *c)
{
    char *argv[4];
    argv[0] = (char *)"streamwire-bench";
    argv[1] = (char *)"--frontend-mode";
    argv[2] = (char *)g_url;
    argv[3] = NULL;
    child_start(c, argv);
}

static atomic_ulong g_live_ended;

static void
discard_item(sw_stream *s, const sw_item *it, void *arg)
{
    (void)s;
    (void)arg;
    if (it->kind == SW_ITEM_TERMINAL) {
        atomic_fetch_add(&g_live_ended, 1);
        if (cfg.verbose)
            progress("  live frontend stream ended: %s/%s", sw_status_name(it->terminal.status),
                     it->terminal.reason);
    }
}

/* goal inputs (issue 5) */
static double g_goal_cancel_p99 = NAN, g_goal_fekill_p99 = NAN;

static void
scen_cancel(void)
{
    unsigned n = cfg.cancel_trials, nk = cfg.trials;
    int64_t *lat = calloc(n + 1, sizeof(int64_t)), *stop = calloc(n + 1, sizeof(int64_t));
    int64_t *klat = calloc(nk + 1, sizeof(int64_t));
    size_t got = 0, ngot_stop = 0, kgot = 0;
    unsigned long data_after = 0, bad_term = 0, errors = 0, kerrors = 0;
    sw_ingress *ing = NULL;
    sw_ingress_opts io;
    sw_ingress_stats is0, is1;
    pthread_condattr_t ca;
    breq q = {BREQ_MAGIC, K_SEND, 1000000, 64, 1000, 0};
    char err[160] = "", kerr[160] = "", param[48], note[200];
    sw_router **live_rt = NULL;
    sw_stream **live_st = NULL;
    sw_err e;

    if (lat == NULL || stop == NULL || klat == NULL)
        die("out of memory");
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g_cs_cv, &ca);
    pthread_condattr_destroy(&ca);
    sw_ingress_opts_init(&io);
    io.endpoint = EP_CANCEL;
    io.instance_id = INST_CANCEL;
    io.handler = cancel_handler;
    io.max_inflight = 64 + cfg.live_fe; /* 64 is the default */
    io.log = cfg.verbose ? loss_rt_log : NULL;
    io.log_arg = (void *)"cancel worker";
    io.handler_threads = 4 + cfg.live_fe; /* each live stream holds a handler thread */
    if ((e = sw_ingress_start(&ing, g_sw_work, &io)) != SW_OK)
        die("sw_ingress_start %s: %s", EP_CANCEL, sw_err_name(e));
    sw_ingress_stats_get(ing, &is0);
    progress("8 cancel: %u sw_stream_cancel -> on_cancel trials, then %u frontend SIGKILL trials",
             n, nk);
    for (unsigned i = 0; i < n; i++) {
        sw_request_opts ro;
        sw_stream *s = NULL;
        const sw_item *it;
        unsigned items = 0;
        int64_t t0, tcb, tstop = 0;
        sw_request_opts_init(&ro);
        ro.endpoint = EP_CANCEL;
        ro.instance_id = INST_CANCEL;
        ro.credit_window = cfg.window;
        if ((e = sw_router_open(&s, g_router, &ro, &q, sizeof(q))) != SW_OK)
            die("sw_router_open: %s", sw_err_name(e));
        while (items < 3) {
            if ((e = sw_stream_next(s, &it, 5000)) != SW_OK || it->kind != SW_ITEM_DATA)
                break;
            items++;
        }
        if (items < 3) {
            errors++;
            if (!err[0])
                snprintf(err, sizeof(err), "trial %u: %u items before the cancel (%s)", i, items,
                         e != SW_OK ? sw_err_name(e) : it->terminal.reason);
            sw_stream_close(s);
            continue;
        }
        t0 = now_ns();
        (void)sw_stream_cancel(s);
        for (;;) {
            if ((e = sw_stream_next(s, &it, 5000)) != SW_OK) {
                bad_term++;
                break;
            }
            if (it->kind == SW_ITEM_DATA) {
                data_after++;
                continue;
            }
            if (it->terminal.status != SW_STATUS_CANCELLED)
                bad_term++;
            break;
        }
        tcb = cslot_wait(sw_stream_request_id(s), 5000000000LL, &tstop);
        if (tcb != 0) {
            lat[got++] = tcb - t0;
        } else {
            errors++;
            if (!err[0])
                snprintf(err, sizeof(err), "trial %u: no cancel callback within 5 s", i);
        }
        {
            /* the handler's send returns SW_ECANCELLED at its next item (<= 1 ms) */
            char rid[40];
            snprintf(rid, sizeof(rid), "%s", sw_stream_request_id(s));
            sw_stream_close(s);
            for (int w = 0; w < 200 && tcb != 0 && tstop == 0; w++) {
                pthread_mutex_lock(&g_cs_mu);
                for (cslot *c = g_cs_head; c != NULL; c = c->next)
                    if (strcmp(c->reqid, rid) == 0)
                        tstop = c->t_stop;
                pthread_mutex_unlock(&g_cs_mu);
                if (tstop == 0)
                    sleep_ms(1);
            }
        }
        if (tstop != 0)
            stop[ngot_stop++] = tstop - t0;
    }

    /* frontend SIGKILL: a child frontend per trial, the next one started
     * while the current one streams */
    if (nk > 0 && cfg.live_fe > 0) {
        /* other live frontends: one router each, a slow stream each */
        sw_router_opts o;
        sw_request_opts ro;
        breq lq = {BREQ_MAGIC, K_SEND, 1000000, 64, 20, 0};
        if ((live_rt = calloc(cfg.live_fe, sizeof(*live_rt))) == NULL ||
            (live_st = calloc(cfg.live_fe, sizeof(*live_st))) == NULL)
            die("out of memory");
        sw_router_opts_init(&o);
        sw_request_opts_init(&ro);
        ro.endpoint = EP_CANCEL;
        ro.instance_id = INST_CANCEL;
        ro.on_item = discard_item;
        for (unsigned i = 0; i < cfg.live_fe; i++)
            if (sw_router_create(&live_rt[i], g_sw_front, &o) != SW_OK ||
                sw_router_open(&live_st[i], live_rt[i], &ro, &lq, sizeof(lq)) != SW_OK)
                die("live frontend %u", i);
        progress("  %u other live frontends stream meanwhile", cfg.live_fe);
        sleep_ms(500);
    }
    if (nk > 0) {
        child cur, nxt, fz;
        char line[128], fz_req[64] = "";
        fz.pid = -1;
        fe_start(&cur);
        if (child_line(&cur, line, sizeof(line), 20000) != 0 || strcmp(line, "ready") != 0)
            die("frontend child did not start");
        for (unsigned i = 0; i < nk; i++) {
            int have_next = i + 1 < nk;
            size_t kgot_before = kgot;
            int64_t t0, tcb;
            char reqid[64];
            ssize_t w;
            /* --frozen-frontend: another frontend with a stream here is
             * SIGSTOPped throughout (replaced once the worker cancels it) */
            if (cfg.frozen_fe && (fz.pid <= 0 || cslot_wait(fz_req, 0, NULL) != 0)) {
                if (fz.pid > 0)
                    child_reap(&fz, 0);
                fe_start(&fz);
                w = write(fz.to, "go\n", 3);
                (void)w;
                if (child_line(&fz, line, sizeof(line), 20000) != 0 || strcmp(line, "ready") != 0 ||
                    child_line(&fz, line, sizeof(line), 20000) != 0 ||
                    sscanf(line, "streaming %63s", fz_req) != 1)
                    die("frozen frontend child did not start");
                kill(fz.pid, SIGSTOP);
                progress("  trial %u: froze frontend %d (stream %s)", i + 1, (int)fz.pid, fz_req);
            }
            if (have_next)
                fe_start(&nxt);
            w = write(cur.to, "go\n", 3);
            (void)w;
            if (child_line(&cur, line, sizeof(line), 10000) != 0 ||
                sscanf(line, "streaming %63s", reqid) != 1) {
                kerrors++;
                if (!kerr[0])
                    snprintf(kerr, sizeof(kerr), "trial %u: frontend child said \"%.80s\"", i,
                             line);
                child_reap(&cur, 0);
            } else {
                sleep_ms(10 + rand() % 100); /* decorrelate from the worker's probe timer */
                t0 = now_ns();
                kill(cur.pid, SIGKILL);
                tcb = cslot_wait(reqid, 5000000000LL, NULL);
                if (tcb != 0) {
                    klat[kgot++] = tcb - t0;
                } else {
                    kerrors++;
                    if (!kerr[0])
                        snprintf(kerr, sizeof(kerr), "trial %u: no cancel within 5 s", i);
                }
                child_reap(&cur, 0);
            }
            if (have_next) {
                cur = nxt;
                if (child_line(&cur, line, sizeof(line), 20000) != 0 || strcmp(line, "ready") != 0)
                    die("frontend child did not start");
            }
            if (cfg.verbose || cfg.frozen_fe || cfg.live_fe)
                progress("  trial %u: frontend SIGKILL -> cancel %.1f ms", i + 1,
                         kgot > kgot_before ? (double)klat[kgot - 1] / 1e6 : NAN);
        }
        if (fz.pid > 0)
            child_reap(&fz, 0);
    }
    if (live_rt != NULL)
        progress("  %lu of %u other live frontends' streams ended during the trials (want 0)",
                 atomic_load(&g_live_ended), cfg.live_fe);
    for (unsigned i = 0; live_rt != NULL && i < cfg.live_fe; i++) {
        sw_stream_close(live_st[i]);
        sw_router_destroy(live_rt[i]);
    }
    free(live_rt);
    free(live_st);
    sw_ingress_stats_get(ing, &is1);
    sw_ingress_destroy(ing);
    pthread_mutex_lock(&g_cs_mu);
    while (g_cs_head != NULL) {
        cslot *c = g_cs_head;
        g_cs_head = c->next;
        free(c);
    }
    pthread_mutex_unlock(&g_cs_mu);

    snprintf(param, sizeof(param), "sw_stream_cancel -> on_cancel, %zu trials", got);
    snprintf(note, sizeof(note),
             "same process, separate sw_conn; data items after cancel %lu; non-cancelled "
             "terminals %lu; errors %lu%s%.60s",
             data_after, bad_term, errors, err[0] ? ": " : "", err);
    lat_rows_sw("8 cancel", param, lat, got, "us", 1, 1, note, "goal <= 20 ms (issue 5)");
    g_goal_cancel_p99 = pct(lat, got, 0.99) / 1e6;
    snprintf(param, sizeof(param), "sw_stream_cancel -> send fails, %zu trials", ngot_stop);
    lat_rows_sw("8 cancel", param, stop, ngot_stop, "us", 1, 0,
                "handler sends every 1 ms: its next send returns SW_ECANCELLED", "");
    snprintf(param, sizeof(param), "frontend SIGKILL -> on_cancel, %zu trials", kgot);
    snprintf(note, sizeof(note),
             "frontend is a child process; worker frontend_probe_ms 250 (default); "
             "frontends_lost +%" PRIu64 "; errors %lu%s%.60s",
             is1.frontends_lost - is0.frontends_lost, kerrors, kerr[0] ? ": " : "", kerr);
    g_goal_fekill_p99 =
        lat_rows_sw("8 cancel", param, klat, kgot, "ms", 1, 1, note, "goal <= 1000 ms (issue 5)");
    free(lat);
    free(stop);
    free(klat);
}

/* ------------------------------------------------------------------ 9: slow consumers (issue 5) */

/* Hidden mode --slow-worker URL N: an ingress whose handler retains each
 * responder and hands it to one of two producer threads, which send with
 * sw_responder_try_send as fast as credit allows (an engine's scheduler). */

typedef struct sjob {
    struct sjob *next;
    sw_responder *r;
    uint32_t n, size, sent;
} sjob;

typedef struct sprod {
    pthread_mutex_t mu;
    sjob *incoming;
    pthread_t th;
} sprod;

#define SLOW_PRODUCERS 2
static sprod g_sp[SLOW_PRODUCERS];
static atomic_uint g_sp_rr;
static atomic_int g_sp_stop;
static atomic_ulong g_sp_sent, g_sp_done, g_sp_failed;

static void
slow_handler(sw_responder *r, void *arg)
{
    size_t len = 0;
    const void *p = sw_responder_payload(r, &len);
    breq q;
    sjob *j;
    sprod *pr;
    (void)arg;
    if (p == NULL || len < sizeof(q) || (j = calloc(1, sizeof(*j))) == NULL) {
        (void)sw_responder_fail(r, "bench_bad_request", NULL);
        return;
    }
    memcpy(&q, p, sizeof(q));
    j->r = r;
    j->n = q.n;
    j->size = q.size < 8 ? 8 : q.size > 1024 ? 1024 : q.size;
    sw_responder_retain(r);
    pr = &g_sp[atomic_fetch_add(&g_sp_rr, 1) % SLOW_PRODUCERS];
    pthread_mutex_lock(&pr->mu);
    j->next = pr->incoming;
    pr->incoming = j;
    pthread_mutex_unlock(&pr->mu);
}

static void *
slow_producer(void *arg)
{
    sprod *pr = arg;
    sjob *mine = NULL;
    uint8_t buf[1024];
    memset(buf, 0x5a, sizeof(buf));
    while (!atomic_load(&g_sp_stop)) {
        unsigned long progress = 0;
        pthread_mutex_lock(&pr->mu);
        while (pr->incoming != NULL) {
            sjob *j = pr->incoming;
            pr->incoming = j->next;
            j->next = mine;
            mine = j;
        }
        pthread_mutex_unlock(&pr->mu);
        for (sjob **pp = &mine; *pp != NULL;) {
            sjob *j = *pp;
            sw_err e = SW_OK;
            while (j->sent < j->n) {
                uint64_t idx = j->sent;
                memcpy(buf, &idx, 8);
                if ((e = sw_responder_try_send(j->r, buf, j->size)) != SW_OK)
                    break;
                j->sent++;
                progress++;
            }
            if (j->sent == j->n || e != SW_EAGAIN) {
                if (j->sent == j->n) {
                    (void)sw_responder_finish(j->r, SW_STATUS_COMPLETED, NULL);
                    atomic_fetch_add(&g_sp_done, 1);
                } else {
                    atomic_fetch_add(&g_sp_failed, 1);
                }
                sw_responder_release(j->r);
                *pp = j->next;
                free(j);
            } else {
                pp = &j->next;
            }
        }
        atomic_fetch_add(&g_sp_sent, progress);
        if (progress == 0)
            sleep_until_ns(now_ns() + 200000LL);
    }
    while (mine != NULL) {
        sjob *j = mine;
        mine = j->next;
        sw_responder_release(j->r);
        free(j);
    }
    return NULL;
}

static int
slow_worker_main(const char *url, unsigned n)
{
    sw_ingress_opts io;
    sw_ingress *ing = NULL;
    sw_err e;
    char line[64];
    pid_t parent = getppid();

    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        return 1;
    setvbuf(stdout, NULL, _IOLBF, 0);
    g_sw_work = sw_connect(url, "bench-slow-worker");
    for (int i = 0; i < SLOW_PRODUCERS; i++) {
        pthread_mutex_init(&g_sp[i].mu, NULL);
        if (pthread_create(&g_sp[i].th, NULL, slow_producer, &g_sp[i]) != 0)
            die("pthread_create");
    }
    sw_ingress_opts_init(&io);
    io.endpoint = EP_SLOW;
    io.instance_id = INST_SLOW;
    io.handler = slow_handler;
    io.max_inflight = n + 64; /* counts retained responders */
    io.max_window = 1u << 20; /* only a cap: lets the calibration stream ask for more */
    if ((e = sw_ingress_start(&ing, g_sw_work, &io)) != SW_OK)
        die("slow worker: sw_ingress_start: %s", sw_err_name(e));
    printf("ready\n");
    while (fgets(line, sizeof(line), stdin) != NULL) {
        if (strncmp(line, "stat", 4) == 0) {
            printf("stat %ld %lu %lu %lu %lld\n", self_rss_kb(), atomic_load(&g_sp_sent),
                   atomic_load(&g_sp_done), atomic_load(&g_sp_failed),
                   (long long)self_cpu_us());
        } else if (strncmp(line, "quit", 4) == 0) {
            printf("bye\n");
            break;
        }
    }
    sw_ingress_destroy(ing);
    atomic_store(&g_sp_stop, 1);
    for (int i = 0; i < SLOW_PRODUCERS; i++)
        pthread_join(g_sp[i].th, NULL);
    sw_conn_close(g_sw_work);
    nats_Close();
    return 0;
}

typedef struct sstream {
    sw_stream *s;
    uint64_t next;
    int done, ok;
} sstream;

typedef struct sctx {
    sstream *v;
    unsigned n, nthreads, items;
    int64_t delay_ns;
    atomic_ulong received, order_errors, bad_terms;
    atomic_uint finished_threads;
    latch gate;
    pthread_mutex_t mu;
    char err[160];
} sctx;

typedef struct sthr {
    sctx *c;
    unsigned idx;
    pthread_t th;
} sthr;

/* One consumer thread: every delay, one sw_stream_next(0) on each of its
 * streams, so no stream is read faster than one item per delay. */
static void *
slow_consumer(void *arg)
{
    sthr *t = arg;
    sctx *c = t->c;
    int64_t tick;
    latch_wait(&c->gate, -1);
    tick = now_ns();
    for (;;) {
        unsigned active = 0;
        int64_t now;
        for (unsigned i = t->idx; i < c->n; i += c->nthreads) {
            sstream *x = &c->v[i];
            const sw_item *it;
            sw_err e;
            if (x->done)
                continue;
            active++;
            e = sw_stream_next(x->s, &it, 0);
            if (e == SW_OK && it->kind == SW_ITEM_DATA) {
                uint64_t idx = UINT64_MAX;
                if (it->len >= 8)
                    memcpy(&idx, it->data, 8);
                if (it->seq != x->next + 1 || idx != x->next)
                    atomic_fetch_add(&c->order_errors, 1);
                x->next++;
                atomic_fetch_add(&c->received, 1);
            } else if (e == SW_OK) {
                x->done = 1;
                x->ok = it->terminal.status == SW_STATUS_COMPLETED && x->next == c->items;
                if (!x->ok) {
                    atomic_fetch_add(&c->bad_terms, 1);
                    pthread_mutex_lock(&c->mu);
                    if (!c->err[0])
                        snprintf(c->err, sizeof(c->err), "stream %u: %s/%s after %" PRIu64
                                 " items", i, sw_status_name(it->terminal.status),
                                 it->terminal.reason, x->next);
                    pthread_mutex_unlock(&c->mu);
                }
            } else if (e != SW_ETIMEDOUT) {
                x->done = 1;
                atomic_fetch_add(&c->bad_terms, 1);
            }
        }
        if (active == 0)
            break;
        tick += c->delay_ns;
        now = now_ns();
        if (tick < now)
            tick = now; /* behind: no catching up, never faster than one item per delay */
        sleep_until_ns(tick);
    }
    atomic_fetch_add(&c->finished_threads, 1);
    return NULL;
}

/* goal inputs (issue 5, slow) */
static double g_goal_slow_peak_mib = NAN, g_goal_slow_bound_mib = NAN;
static double g_goal_slow_pending = NAN;
static unsigned g_goal_slow_window, g_goal_slow_n;
static int g_goal_slow_lossless = -1;

static void
scen_slow(void)
{
    unsigned n = cfg.slow_streams, m = cfg.slow_items;
    unsigned window = cfg.window ? cfg.window : g_default_window;
    const unsigned cal_n = 8192;
    child wk;
    sw_conn *conn;
    sw_router *rt = NULL;
    sw_router_opts rto;
    sw_router_stats rs0, rs1;
    sctx c;
    sthr *th;
    breq q = {BREQ_MAGIC, K_SEND, m, 64, 0, 0};
    long base, peak, cal0, cal1, wrss = -1;
    int have_peak;
    double item_cost = NAN, secs, fixed;
    uint64_t max_pending = 0, resends = 0, dups = 0, sum_pending = 0;
    unsigned full_windows = 0;
    int64_t t0, last_change;
    unsigned long last_rx = 0, wsent = 0, wdone = 0, wfailed = 0;
    long long wcpu = 0;
    char line[160], param[48], note[200];
    sw_err e;

    progress("9 slow consumers: %u streams x %u items of 64 B, each read at one item per %u ms "
             "(worker in a child process)",
             n, m, cfg.slow_delay_ms);
    {
        char nbuf[32];
        char *argv[5];
        snprintf(nbuf, sizeof(nbuf), "%u", n);
        argv[0] = (char *)"streamwire-bench";
        argv[1] = (char *)"--slow-worker";
        argv[2] = (char *)g_url;
        argv[3] = nbuf;
        argv[4] = NULL;
        child_start(&wk, argv);
        if (child_line(&wk, line, sizeof(line), 20000) != 0 || strcmp(line, "ready") != 0)
            die("slow worker did not start");
    }
    conn = sw_connect(g_url, "bench-slow-frontend");
    sw_router_opts_init(&rto);
    if ((e = sw_router_create(&rt, conn, &rto)) != SW_OK)
        die("sw_router_create: %s", sw_err_name(e));

    /* Per-item cost at the frontend: one stream whose consumer does not
     * read until its window (cal_n items) is all queued. */
    {
        sw_request_opts ro;
        sw_stream *s = NULL;
        sw_stream_stats st;
        breq cq = {BREQ_MAGIC, K_SEND, cal_n, 64, 0, 0};
        const sw_item *it;
        int64_t until = now_ns() + 20000000000LL;
        malloc_trim(0);
        cal0 = self_rss_kb();
        sw_request_opts_init(&ro);
        ro.endpoint = EP_SLOW;
        ro.instance_id = INST_SLOW;
        ro.credit_window = cal_n;
        if ((e = sw_router_open(&s, rt, &ro, &cq, sizeof(cq))) != SW_OK)
            die("sw_router_open: %s", sw_err_name(e));
        do {
            sleep_ms(5);
            sw_stream_stats_get(s, &st);
        } while (st.peak_pending < cal_n && now_ns() < until);
        cal1 = self_rss_kb();
        if (st.peak_pending >= cal_n)
            item_cost = (double)(cal1 - cal0) * 1024.0 / cal_n;
        while (sw_stream_next(s, &it, 10000) == SW_OK && it->kind == SW_ITEM_DATA) {
        }
        sw_stream_close(s);
    }

    memset(&c, 0, sizeof(c));
    c.n = n;
    c.items = m;
    c.nthreads = cfg.slow_threads;
    c.delay_ns = (int64_t)cfg.slow_delay_ms * 1000000LL;
    latch_init(&c.gate);
    pthread_mutex_init(&c.mu, NULL);
    if ((c.v = calloc(n, sizeof(*c.v))) == NULL || (th = calloc(c.nthreads, sizeof(*th))) == NULL)
        die("out of memory");
    sw_router_stats_get(rt, &rs0);
    malloc_trim(0);
    have_peak = reset_peak_rss() == 0;
    base = self_rss_kb();
    peak = base;
    t0 = now_ns();
    for (unsigned i = 0; i < n; i++) {
        sw_request_opts ro;
        sw_request_opts_init(&ro);
        ro.endpoint = EP_SLOW;
        ro.instance_id = INST_SLOW;
        ro.credit_window = cfg.window;
        if ((e = sw_router_open(&c.v[i].s, rt, &ro, &q, sizeof(q))) != SW_OK)
            die("slow stream %u: %s", i, sw_err_name(e));
    }
    for (unsigned i = 0; i < c.nthreads; i++) {
        th[i].c = &c;
        th[i].idx = i;
        if (pthread_create(&th[i].th, NULL, slow_consumer, &th[i]) != 0)
            die("pthread_create");
    }
    latch_set(&c.gate);
    last_change = now_ns();
    while (atomic_load(&c.finished_threads) < c.nthreads) {
        long v = self_rss_kb();
        unsigned long rx = atomic_load(&c.received);
        if (v > peak)
            peak = v;
        if (rx != last_rx) {
            last_rx = rx;
            last_change = now_ns();
        } else if (now_ns() - last_change > 30000000000LL) {
            die("slow consumers: no progress for 30 s at %lu of %llu items", rx,
                (unsigned long long)n * m);
        }
        sleep_ms(20);
    }
    secs = (double)(now_ns() - t0) / 1e9;
    for (unsigned i = 0; i < c.nthreads; i++)
        pthread_join(th[i].th, NULL);
    if (have_peak)
        peak = status_kb("/proc/self/status", "VmHWM");
    for (unsigned i = 0; i < n; i++) {
        sw_stream_stats st;
        sw_stream_stats_get(c.v[i].s, &st);
        if (st.peak_pending > max_pending)
            max_pending = st.peak_pending;
        sum_pending += st.peak_pending;
        full_windows += st.peak_pending >= window;
        resends += st.resend_requests;
        dups += st.duplicates;
    }
    sw_router_stats_get(rt, &rs1);
    for (unsigned i = 0; i < n; i++)
        sw_stream_close(c.v[i].s);
    if (child_cmd(&wk, "stat", line, sizeof(line)) == 0)
        (void)sscanf(line, "stat %ld %lu %lu %lu %lld", &wrss, &wsent, &wdone, &wfailed, &wcpu);
    sw_router_destroy(rt);
    sw_conn_close(conn);
    child_quit(&wk);

    fixed = !isnan(g_goal_idle_bps) ? g_goal_idle_bps : 4096.0;
    g_goal_slow_peak_mib = (double)(peak - base) / 1024.0;
    g_goal_slow_bound_mib = isnan(item_cost)
                                ? NAN
                                : ((double)n * window * item_cost + (double)n * fixed) / 1048576.0;
    g_goal_slow_pending = (double)max_pending;
    g_goal_slow_window = window;
    g_goal_slow_n = n;
    g_goal_slow_lossless = atomic_load(&c.received) == (unsigned long)n * m &&
                           atomic_load(&c.order_errors) == 0 && atomic_load(&c.bad_terms) == 0 &&
                           rs1.nats_dropped == rs0.nats_dropped;

    snprintf(param, sizeof(param), "%u streams x %u x 64 B, 1 item/%u ms", n, m,
             cfg.slow_delay_ms);
    snprintf(note, sizeof(note),
             "frontend VmHWM - RSS before opening (worker in a child); bound below; %.1f s, "
             "%.0f items/s consumed",
             secs, (double)atomic_load(&c.received) / secs);
    add_row("9 slow consumers", param, "peak RSS MiB", NAN, g_goal_slow_peak_mib, 1, 1, note);
    snprintf(note, sizeof(note),
             "streams x (window %u x %.0f B/item + %.0f B/stream fixed, scenario 5%s)", window,
             item_cost, fixed, isnan(g_goal_idle_bps) ? " not run: 4096 assumed" : "");
    add_row("9 slow consumers", param, "bound MiB", NAN, g_goal_slow_bound_mib, 1, 1, note);
    snprintf(note, sizeof(note),
             "RSS per queued 64 B item: 1 stream, window %u, all queued before reading", cal_n);
    add_row("9 slow consumers", param, "B/queued item", NAN, item_cost, 1, 0, note);
    snprintf(note, sizeof(note),
             "max over streams of sw_stream_stats peak_pending (<= window %u); mean %.0f; %u "
             "streams reached a full window",
             window, (double)sum_pending / n, full_windows);
    add_row("9 slow consumers", param, "peak pending max", NAN, (double)max_pending, 1, 0, note);
    snprintf(note, sizeof(note),
             "received %lu of %llu; order errors %lu; bad terminals %lu%s%.60s; resend requests "
             "%" PRIu64 ", duplicates %" PRIu64,
             atomic_load(&c.received), (unsigned long long)n * m, atomic_load(&c.order_errors),
             atomic_load(&c.bad_terms), c.err[0] ? ": " : "", c.err, resends, dups);
    add_row("9 slow consumers", param, "items lost", NAN,
            (double)((unsigned long long)n * m - atomic_load(&c.received)), 1, 0, note);
    snprintf(note, sizeof(note), "sw_router_stats nats_dropped; worker sent %lu items, %lu "
             "streams done, %lu failed, worker RSS %ld KiB",
             wsent, wdone, wfailed, wrss);
    add_row("9 slow consumers", param, "nats dropped", NAN,
            (double)(rs1.nats_dropped - rs0.nats_dropped), 1, 0, note);
    latch_fini(&c.gate);
    pthread_mutex_destroy(&c.mu);
    free(c.v);
    free(th);
}

/* ------------------------------------------------------------------ output */

static void
cpu_model(char *out, size_t cap)
{
    char line[256];
    FILE *f = fopen("/proc/cpuinfo", "r");
    snprintf(out, cap, "unknown");
    if (f == NULL)
        return;
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *p = strchr(line, ':');
            if (p != NULL) {
                p++;
                while (*p == ' ' || *p == '\t')
                    p++;
                p[strcspn(p, "\n")] = '\0';
                snprintf(out, cap, "%s", p);
            }
            break;
        }
    }
    fclose(f);
}

static void
fmt_num(char *out, size_t cap, double v, int prec)
{
    if (isnan(v))
        snprintf(out, cap, "-");
    else
        snprintf(out, cap, "%.*f", prec, v);
}

static void
print_table(void)
{
    char cpu[128];
    cpu_model(cpu, sizeof(cpu));
    printf("\nstreamwire-bench: streamwire %s (source %s), nats.c %s, %s\n", sw_version(),
           SW_BENCH_SOURCE, nats_GetVersion(), g_server_version);
    printf("machine: %ld cores, %s\n", sysconf(_SC_NPROCESSORS_ONLN), cpu);
    printf("load average (/proc/loadavg): start %s, end %s\n", g_load_start, g_load_end);
    printf("send_asap: %s on every connection (raw and streamwire); streamwire credit window %u\n",
           cfg.send_asap ? "on" : "off", cfg.window ? cfg.window : g_default_window);
    printf("raw: hand-written nats.c; short streams and time to first item SUBSCRIBE a fresh\n"
           "inbox per request (what a hand-written client does); streamwire uses its one\n"
           "mux subscription. sw/raw: > 1 is better for rates, < 1 for latency and memory.\n\n");
    printf("%-21s %-32s %-17s %12s %12s %7s  %s\n", "scenario", "parameters", "metric", "raw",
           "streamwire", "sw/raw", "notes");
    for (int i = 0; i < g_nrows; i++) {
        row *r = &g_rows[i];
        char a[32], b[32], q[32];
        fmt_num(a, sizeof(a), r->raw, r->prec);
        fmt_num(b, sizeof(b), r->sw, r->prec);
        fmt_num(q, sizeof(q), r->raw > 0 ? r->sw / r->raw : NAN, 2);
        printf("%-21s %-32s %-17s %12s %12s %7s  %s\n", r->scenario, r->param, r->metric, a, b, q,
               r->note);
    }
}

typedef struct goal {
    int issue;
    const char *name, *target;
    char measured[160];
    int known, met;
} goal;

#define MAX_GOALS 16

static int
eval_goals(goal *g)
{
    int n = 0;
    g[n].name = "long-stream throughput at 64 B";
    g[n].target = ">= 0.85 x raw";
    g[n].known = !isnan(g_goal_long64);
    g[n].met = g[n].known && g_goal_long64 >= 0.85;
    snprintf(g[n].measured, sizeof(g[n].measured), "%.2f x raw", g_goal_long64);
    n++;
    g[n].name = "short-stream rate at concurrency 64";
    g[n].target = ">= 1.0 x raw";
    g[n].known = !isnan(g_goal_short64);
    g[n].met = g[n].known && g_goal_short64 >= 1.0;
    snprintf(g[n].measured, sizeof(g[n].measured), "%.2f x raw", g_goal_short64);
    n++;
    g[n].name = "p99 item latency";
    g[n].target = "<= raw p99 + 50 us";
    g[n].known = !isnan(g_goal_p99_raw) && !isnan(g_goal_p99_sw);
    g[n].met = g[n].known && g_goal_p99_sw <= g_goal_p99_raw + 50.0;
    snprintf(g[n].measured, sizeof(g[n].measured), "raw %.1f us, sw %.1f us (%+.1f us)",
             g_goal_p99_raw, g_goal_p99_sw, g_goal_p99_sw - g_goal_p99_raw);
    n++;
    g[n].name = "memory per idle stream (frontend)";
    g[n].target = "<= 4096 B + credit window";
    g[n].known = !isnan(g_goal_idle_bps);
    g[n].met = g[n].known && g_goal_idle_bps <= 4096.0;
    snprintf(g[n].measured, sizeof(g[n].measured),
             "%.0f B/stream (window %u, no items buffered)", g_goal_idle_bps, g_goal_idle_window);
    n++;
    for (int i = 0; i < 4; i++)
        g[i].issue = 6;

    g[n].issue = 4;
    g[n].name = "SIGKILL -> terminal, p99";
    g[n].target = "<= 250 ms";
    g[n].known = !isnan(g_goal_kill_p99);
    g[n].met = g[n].known && g_goal_kill_p99 <= 250.0;
    snprintf(g[n].measured, sizeof(g[n].measured), "%.1f ms (%u trials per kind)", g_goal_kill_p99,
             cfg.trials);
    n++;
    g[n].issue = 4;
    g[n].name = "SIGSTOP -> terminal, p99";
    g[n].target = "<= 1500 ms";
    g[n].known = !isnan(g_goal_stop_p99);
    g[n].met = g[n].known && g_goal_stop_p99 <= 1500.0;
    snprintf(g[n].measured, sizeof(g[n].measured), "%.1f ms", g_goal_stop_p99);
    n++;
    g[n].issue = 4;
    g[n].name = "report -> all other routers, p99";
    g[n].target = "<= 1000 ms";
    g[n].known = !isnan(g_goal_report_p99);
    g[n].met = g[n].known && g_goal_report_p99 <= 1000.0;
    snprintf(g[n].measured, sizeof(g[n].measured),
             "%.1f ms (router B: REMOVED event or last pick, later)", g_goal_report_p99);
    n++;
    g[n].issue = 4;
    g[n].name = "requests to the dead after report";
    g[n].target = "0";
    g[n].known = !isnan(g_goal_after_report);
    g[n].met = g[n].known && g_goal_after_report == 0;
    snprintf(g[n].measured, sizeof(g[n].measured), "%.0f over %u trials (router B)",
             g_goal_after_report, g_goal_loss_n);
    n++;
    g[n].issue = 5;
    g[n].name = "cancel -> handler observes, p99";
    g[n].target = "<= 20 ms";
    g[n].known = !isnan(g_goal_cancel_p99);
    g[n].met = g[n].known && g_goal_cancel_p99 <= 20.0;
    snprintf(g[n].measured, sizeof(g[n].measured), "%.3f ms (%u trials)", g_goal_cancel_p99,
             cfg.cancel_trials);
    n++;
    g[n].issue = 5;
    g[n].name = "frontend SIGKILL -> worker cancel, p99";
    g[n].target = "<= 1000 ms";
    g[n].known = !isnan(g_goal_fekill_p99);
    g[n].met = g[n].known && g_goal_fekill_p99 <= 1000.0;
    snprintf(g[n].measured, sizeof(g[n].measured), "%.1f ms (%u trials)", g_goal_fekill_p99,
             cfg.trials);
    n++;
    g[n].issue = 5;
    g[n].name = "peak frontend memory, slow streams";
    g[n].target = "bounded by the window";
    g[n].known = !isnan(g_goal_slow_peak_mib) && !isnan(g_goal_slow_bound_mib);
    g[n].met = g[n].known && g_goal_slow_peak_mib <= g_goal_slow_bound_mib &&
               g_goal_slow_pending <= g_goal_slow_window && g_goal_slow_lossless == 1;
    snprintf(g[n].measured, sizeof(g[n].measured),
             "%.1f MiB for %u streams (bound %.1f); peak pending %.0f <= %u; %s",
             g_goal_slow_peak_mib, g_goal_slow_n, g_goal_slow_bound_mib, g_goal_slow_pending,
             g_goal_slow_window, g_goal_slow_lossless == 1 ? "lossless" : "LOSS OR DROPS");
    n++;
    g[n].issue = 5;
    g[n].name = "credit protocol cost at 64 B";
    g[n].target = "state the ratio";
    g[n].known = cfg.nsizes > 0 && g_credit_cost[0] > 0;
    g[n].met = g[n].known;
    snprintf(g[n].measured, sizeof(g[n].measured), "default window / window %u = %.2f",
             BIG_WINDOW, g_credit_cost[0]);
    n++;
    return n;
}

static void
print_goals(void)
{
    goal g[MAX_GOALS];
    int n = eval_goals(g);
    printf("\ngoals (issues 4, 5, 6; reported, never asserted):\n");
    for (int i = 0; i < n; i++) {
        if (i == 0 || g[i].issue != g[i - 1].issue)
            printf(" issue %d\n", g[i].issue);
        printf("  %-38s %-22s %-48s %s\n", g[i].name, g[i].target,
               g[i].known ? g[i].measured : "not run",
               !g[i].known ? "-" : g[i].met ? "MET" : "MISSED");
    }
    for (int i = 0; i < cfg.nsizes && i < MAX_LIST; i++)
        if (g_credit_cost[i] > 0)
            printf("  credit protocol cost at %zu B: default window / window %u = %.2f\n",
                   cfg.sizes[i], BIG_WINDOW, g_credit_cost[i]);
}

static void
json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\u%04x", *s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

static void
json_num(FILE *f, double v)
{
    if (isnan(v) || isinf(v))
        fprintf(f, "null");
    else
        fprintf(f, "%.6g", v);
}

static void
write_json(const char *path)
{
    char cpu[128];
    goal g[MAX_GOALS];
    int ng = eval_goals(g);
    FILE *f = fopen(path, "w");
    if (f == NULL)
        die("cannot write %s: %s", path, strerror(errno));
    cpu_model(cpu, sizeof(cpu));
    fprintf(f, "{\n  \"bench\": \"streamwire-bench\",\n  \"streamwire\": ");
    json_str(f, sw_version());
    fprintf(f, ",\n  \"source\": ");
    json_str(f, SW_BENCH_SOURCE);
    fprintf(f, ",\n  \"nats_c\": ");
    json_str(f, nats_GetVersion());
    fprintf(f, ",\n  \"nats_server\": ");
    json_str(f, g_server_version);
    fprintf(f, ",\n  \"machine\": {\"nproc\": %ld, \"cpu\": ", sysconf(_SC_NPROCESSORS_ONLN));
    json_str(f, cpu);
    fprintf(f, "},\n  \"loadavg_start\": ");
    json_str(f, g_load_start);
    fprintf(f, ",\n  \"loadavg_end\": ");
    json_str(f, g_load_end);
    fprintf(f, ",\n  \"command\": ");
    json_str(f, g_cmdline);
    fprintf(f, ",\n  \"quick\": %s,\n  \"send_asap\": %s,\n  \"reps\": %u,\n",
            cfg.quick ? "true" : "false", cfg.send_asap ? "true" : "false", cfg.reps);
    fprintf(f, "  \"default_credit_window\": %u,\n  \"results\": [\n", g_default_window);
    for (int i = 0; i < g_nrows; i++) {
        row *r = &g_rows[i];
        fprintf(f, "    {\"scenario\": ");
        json_str(f, r->scenario);
        fprintf(f, ", \"params\": ");
        json_str(f, r->param);
        fprintf(f, ", \"metric\": ");
        json_str(f, r->metric);
        fprintf(f, ", \"raw\": ");
        json_num(f, r->raw);
        fprintf(f, ", \"streamwire\": ");
        json_num(f, r->sw);
        fprintf(f, ", \"ratio\": ");
        json_num(f, r->raw > 0 ? r->sw / r->raw : NAN);
        fprintf(f, ", \"lower_is_better\": %s, \"note\": ", r->lower_better ? "true" : "false");
        json_str(f, r->note);
        fprintf(f, "}%s\n", i + 1 < g_nrows ? "," : "");
    }
    fprintf(f, "  ],\n  \"goals\": [\n");
    for (int i = 0; i < ng; i++) {
        fprintf(f, "    {\"issue\": %d, \"goal\": ", g[i].issue);
        json_str(f, g[i].name);
        fprintf(f, ", \"target\": ");
        json_str(f, g[i].target);
        fprintf(f, ", \"measured\": ");
        json_str(f, g[i].known ? g[i].measured : "not run");
        fprintf(f, ", \"met\": %s}%s\n", !g[i].known ? "null" : g[i].met ? "true" : "false",
                i + 1 < ng ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    if (fclose(f) != 0)
        die("cannot write %s", path);
}

/* ------------------------------------------------------------------ options */

static void
usage(FILE *f)
{
    fprintf(f,
            "usage: streamwire-bench [options]\n"
            "\n"
            "Measures streamwire against hand-written nats.c on the same nats-server, in\n"
            "one run, and prints a table (raw, streamwire, streamwire/raw).\n"
            "\n"
            "Scenarios (--only takes a comma list of these names):\n"
            "  long     1 stream x N items of 64 B and 1 KiB: items/s, MB/s; also a blocking\n"
            "           consumer and the credit cost (default window vs window 1<<20)\n"
            "  short    many short streams of 10 items at concurrency 1, 64, 1024: streams/s\n"
            "           (the raw baseline subscribes to a fresh inbox per request)\n"
            "  latency  per-item latency at a fixed rate: p50, p99, p99.9\n"
            "  ttfi     time to first item: p50, p99\n"
            "  idle     idle open streams at the frontend: RSS per stream, idle CPU\n"
            "  loss     issue 4: SIGKILL / SIGSTOP of a worker (child process) mid-stream ->\n"
            "           terminal at the consumer; dead report -> another router stops\n"
            "           routing there; requests routed to the dead instance after the report\n"
            "  cancel   issue 5: sw_stream_cancel -> the handler's cancel callback; SIGKILL of\n"
            "           a frontend (child process) -> the worker cancels its stream\n"
            "  slow     issue 5: many concurrent streams to slow consumers: peak frontend RSS\n"
            "           against the credit-window bound, peak pending, loss, nats.c drops\n"
            "\n"
            "Options:\n"
            "  --server URL        use this nats-server instead of starting one\n"
            "  --nats-server PATH  nats-server binary to start (default: $SW_NATS_SERVER, else\n"
            "                      nats-server on PATH); it runs with -js -a 127.0.0.1\n"
            "                      -p <free port> -sd <tmp dir>/js (support/natsd.c)\n"
            "  --json FILE         also write the results as JSON\n"
            "  --quick             small sizes, a few seconds (CI smoke; never assert figures)\n"
            "  --only LIST         run only these scenarios (default: all)\n"
            "  --reps N            repetitions of long/short, median reported (default 3; quick 1)\n"
            "  --items N           items in the long stream (default 100000)\n"
            "  --sizes LIST        item sizes for the long stream (default 64,1024)\n"
            "  --concurrency LIST  short-stream concurrencies (default 1,64,1024)\n"
            "  --short-items N     items per short stream (default 10)\n"
            "  --short-secs S      duration of one short-stream run (default 2)\n"
            "  --rate R            latency scenario rate, items/s (default 2000)\n"
            "  --latency-secs S    latency scenario duration per side (default 5)\n"
            "  --ttfi-streams N    streams for time to first item (default 2000)\n"
            "  --idle-streams N    idle open streams (default 10000)\n"
            "  --idle-cpu-secs S   idle CPU sampling window (default 2)\n"
            "  --trials N          loss: trials of each kind (SIGKILL, SIGSTOP); cancel:\n"
            "                      frontend SIGKILL trials (default 20; quick 2)\n"
            "  --cancel-trials N   cancel -> handler trials (default 200; quick 20)\n"
            "  --slow-streams N    concurrent slow streams (default 1000; quick 100)\n"
            "  --slow-items N      items per slow stream (default 600; quick 300)\n"
            "  --slow-delay-ms N   a slow consumer reads one item per N ms (default 10; quick 2)\n"
            "  --slow-threads N    consumer threads polling the slow streams (default 4)\n"
            "  --frozen-frontend   cancel: keep another frontend with a stream SIGSTOPped\n"
            "                      during the frontend SIGKILL trials (not in the default run)\n"
            "  --live-frontends N  cancel: N other routers in this process keep a stream open\n"
            "                      to the worker during the frontend SIGKILL trials (default 0)\n"
            "  --window N          credit window of the streamwire runs (default: the router's\n"
            "                      default); the ingress max_window is raised to match\n"
            "  --no-send-asap      natsOptions_SetSendAsap(false) on every connection, raw and\n"
            "                      streamwire (default: send asap on all, streamwire's default)\n"
            "  --side raw|sw|both  run only one side of long and short (for profiling)\n"
            "  --callgrind         scenario 6: under valgrind --tool=callgrind\n"
            "                      --instr-atstart=no, profile each long- and short-stream run\n"
            "                      into its own dump (Ir per item = dump total / items)\n"
            "  -v, --verbose       print each repetition's figure\n"
            "  -h, --help          this text\n");
}

static int
parse_list_size(const char *s, size_t *out, int max)
{
    int n = 0;
    char *end;
    while (*s && n < max) {
        unsigned long v = strtoul(s, &end, 10);
        if (end == s || v == 0)
            return -1;
        out[n++] = v;
        s = *end == ',' ? end + 1 : end;
        if (*end != ',' && *end != '\0')
            return -1;
    }
    return n;
}

static int
parse_list_uint(const char *s, unsigned *out, int max)
{
    size_t tmp[MAX_LIST];
    int n = parse_list_size(s, tmp, max < MAX_LIST ? max : MAX_LIST);
    for (int i = 0; i < n; i++)
        out[i] = (unsigned)tmp[i];
    return n;
}

static int
want(const char *name)
{
    const char *p;
    size_t l = strlen(name);
    if (cfg.only == NULL)
        return 1;
    for (p = cfg.only; (p = strstr(p, name)) != NULL; p += l)
        if ((p == cfg.only || p[-1] == ',') && (p[l] == ',' || p[l] == '\0'))
            return 1;
    return 0;
}

static const char *
need_arg(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "streamwire-bench: %s needs a value\n", argv[*i]);
        exit(2);
    }
    return argv[++*i];
}

static void
parse_args(int argc, char **argv)
{
    int set_items = 0, set_reps = 0, set_short = 0, set_lat = 0, set_ttfi = 0, set_idle = 0,
        set_cpu = 0, set_trials = 0, set_ctrials = 0, set_sstreams = 0, set_sitems = 0,
        set_sdelay = 0;
    size_t off = 0;
    for (int i = 0; i < argc && off < sizeof(g_cmdline) - 1; i++)
        off += (size_t)snprintf(g_cmdline + off, sizeof(g_cmdline) - off, "%s%s", i ? " " : "",
                                i ? argv[i] : "streamwire-bench");
    cfg.send_asap = 1;
    cfg.sizes[0] = 64;
    cfg.sizes[1] = 1024;
    cfg.nsizes = 2;
    cfg.conc[0] = 1;
    cfg.conc[1] = 64;
    cfg.conc[2] = 1024;
    cfg.nconc = 3;
    cfg.short_items = 10;
    cfg.rate = 2000;
    cfg.slow_threads = 4;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--server")) {
            cfg.server_url = need_arg(argc, argv, &i);
        } else if (!strcmp(a, "--nats-server")) {
            cfg.nats_server = need_arg(argc, argv, &i);
        } else if (!strcmp(a, "--json")) {
            cfg.json_path = need_arg(argc, argv, &i);
        } else if (!strcmp(a, "--quick")) {
            cfg.quick = 1;
        } else if (!strcmp(a, "--only")) {
            cfg.only = need_arg(argc, argv, &i);
        } else if (!strcmp(a, "--reps")) {
            cfg.reps = (unsigned)atoi(need_arg(argc, argv, &i));
            set_reps = 1;
        } else if (!strcmp(a, "--items")) {
            cfg.items = strtoul(need_arg(argc, argv, &i), NULL, 10);
            set_items = 1;
        } else if (!strcmp(a, "--sizes")) {
            if ((cfg.nsizes = parse_list_size(need_arg(argc, argv, &i), cfg.sizes, MAX_LIST)) <= 0)
                goto bad;
        } else if (!strcmp(a, "--concurrency")) {
            if ((cfg.nconc = parse_list_uint(need_arg(argc, argv, &i), cfg.conc, MAX_LIST)) <= 0)
                goto bad;
        } else if (!strcmp(a, "--short-items")) {
            cfg.short_items = (unsigned)atoi(need_arg(argc, argv, &i));
        } else if (!strcmp(a, "--short-secs")) {
            cfg.short_secs = atof(need_arg(argc, argv, &i));
            set_short = 1;
        } else if (!strcmp(a, "--rate")) {
            cfg.rate = (unsigned)atoi(need_arg(argc, argv, &i));
        } else if (!strcmp(a, "--latency-secs")) {
            cfg.lat_secs = atof(need_arg(argc, argv, &i));
            set_lat = 1;
        } else if (!strcmp(a, "--ttfi-streams")) {
            cfg.ttfi_n = (unsigned)atoi(need_arg(argc, argv, &i));
            set_ttfi = 1;
        } else if (!strcmp(a, "--idle-streams")) {
            cfg.idle_n = (unsigned)atoi(need_arg(argc, argv, &i));
            set_idle = 1;
        } else if (!strcmp(a, "--idle-cpu-secs")) {
            cfg.idle_cpu_secs = atof(need_arg(argc, argv, &i));
            set_cpu = 1;
        } else if (!strcmp(a, "--trials")) {
            cfg.trials = (unsigned)atoi(need_arg(argc, argv, &i));
            set_trials = 1;
        } else if (!strcmp(a, "--cancel-trials")) {
            cfg.cancel_trials = (unsigned)atoi(need_arg(argc, argv, &i));
            set_ctrials = 1;
        } else if (!strcmp(a, "--slow-streams")) {
            cfg.slow_streams = (unsigned)atoi(need_arg(argc, argv, &i));
            set_sstreams = 1;
        } else if (!strcmp(a, "--slow-items")) {
            cfg.slow_items = (unsigned)atoi(need_arg(argc, argv, &i));
            set_sitems = 1;
        } else if (!strcmp(a, "--slow-delay-ms")) {
            cfg.slow_delay_ms = (unsigned)atoi(need_arg(argc, argv, &i));
            set_sdelay = 1;
        } else if (!strcmp(a, "--live-frontends")) {
            cfg.live_fe = (unsigned)atoi(need_arg(argc, argv, &i));
        } else if (!strcmp(a, "--frozen-frontend")) {
            cfg.frozen_fe = 1;
        } else if (!strcmp(a, "--slow-threads")) {
            cfg.slow_threads = (unsigned)atoi(need_arg(argc, argv, &i));
        } else if (!strcmp(a, "--window")) {
            cfg.window = (unsigned)atoi(need_arg(argc, argv, &i));
        } else if (!strcmp(a, "--side")) {
            const char *v = need_arg(argc, argv, &i);
            cfg.side = !strcmp(v, "raw") ? 1 : !strcmp(v, "sw") ? 2 : !strcmp(v, "both") ? 0 : -1;
            if (cfg.side < 0)
                goto bad;
        } else if (!strcmp(a, "--callgrind")) {
            cfg.callgrind = 1;
        } else if (!strcmp(a, "--no-send-asap")) {
            cfg.send_asap = 0;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            cfg.verbose = 1;
        } else {
            fprintf(stderr, "streamwire-bench: unknown option %s\n", a);
            usage(stderr);
            exit(2);
        }
    }
    if (!set_reps)
        cfg.reps = cfg.quick ? 1 : 3;
    if (!set_items)
        cfg.items = cfg.quick ? 5000 : 100000;
    if (!set_short)
        cfg.short_secs = cfg.quick ? 0.3 : 2.0;
    if (!set_lat)
        cfg.lat_secs = cfg.quick ? 0.5 : 5.0;
    if (!set_ttfi)
        cfg.ttfi_n = cfg.quick ? 100 : 2000;
    if (!set_idle)
        cfg.idle_n = cfg.quick ? 1000 : 10000;
    if (!set_cpu)
        cfg.idle_cpu_secs = cfg.quick ? 0.3 : 2.0;
    if (!set_trials)
        cfg.trials = cfg.quick ? 2 : 20;
    if (!set_ctrials)
        cfg.cancel_trials = cfg.quick ? 20 : 200;
    if (!set_sstreams)
        cfg.slow_streams = cfg.quick ? 100 : 1000;
    if (!set_sitems)
        cfg.slow_items = cfg.quick ? 300 : 600;
    if (!set_sdelay)
        cfg.slow_delay_ms = cfg.quick ? 2 : 10;
    if (cfg.trials == 0 || cfg.cancel_trials == 0 || cfg.slow_streams == 0 ||
        cfg.slow_items == 0 || cfg.slow_threads == 0 || cfg.slow_threads > 256)
        goto bad;
    if (cfg.reps == 0 || cfg.reps > 32 || cfg.items == 0 || cfg.short_items == 0 ||
        cfg.rate == 0 || cfg.ttfi_n == 0 || cfg.idle_n == 0 || cfg.short_secs <= 0 ||
        cfg.lat_secs <= 0 || cfg.idle_cpu_secs <= 0)
        goto bad;
    for (int i = 0; i < cfg.nsizes; i++)
        if (cfg.sizes[i] > 1024 * 512)
            goto bad;
    return;
bad:
    fprintf(stderr, "streamwire-bench: bad option value (see --help)\n");
    exit(2);
}

/* ------------------------------------------------------------------ main */

int
main(int argc, char **argv)
{
    unsigned max_conc = 64;
    sw_router_opts rto;
    sw_err e;
    natsStatus s;
    int64_t t_start;

    if (argc == 4 && strcmp(argv[1], "--idle-worker") == 0) {
        cfg.send_asap = 1;
        return idle_worker_main(argv[2], (unsigned)strtoul(argv[3], NULL, 10));
    }
    if (argc == 5 && strcmp(argv[1], "--worker-mode") == 0) {
        cfg.send_asap = 1;
        return loss_worker_main(argv[2], argv[3], argv[4]);
    }
    if (argc == 3 && strcmp(argv[1], "--frontend-mode") == 0) {
        cfg.send_asap = 1;
        return frontend_main(argv[2]);
    }
    if (argc == 4 && strcmp(argv[1], "--slow-worker") == 0) {
        cfg.send_asap = 1;
        return slow_worker_main(argv[2], (unsigned)strtoul(argv[3], NULL, 10));
    }
    parse_args(argc, argv);
#ifndef BENCH_HAVE_CALLGRIND
    if (cfg.callgrind) {
        fprintf(stderr, "streamwire-bench: built without <valgrind/callgrind.h>; --callgrind "
                        "is not available\n");
        return 2;
    }
#endif
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    t_start = now_ns();
    loadavg(g_load_start, sizeof(g_load_start));

    if (cfg.server_url != NULL) {
        g_url = cfg.server_url;
    } else {
        start_server(cfg.nats_server);
        g_url = g_nats.url;
        progress("started %s at %s (store %s/js)", g_server_version, g_url, g_nats.dir);
    }

    /* raw side */
    g_raw_front = raw_connect(g_url, "bench-raw-frontend");
    g_raw_work = raw_connect(g_url, "bench-raw-worker");
    s = natsConnection_Subscribe(&g_raw_resp_sub, g_raw_work, RAW_REQ_SUBJ, raw_responder_cb,
                                 NULL);
    if (s == NATS_OK)
        s = natsConnection_Flush(g_raw_work);
    if (s != NATS_OK)
        die("raw responder subscribe: %s", natsStatus_GetText(s));

    /* streamwire side */
    for (int i = 0; i < cfg.nconc; i++)
        if (cfg.conc[i] > max_conc)
            max_conc = cfg.conc[i];
    g_sw_front = sw_connect(g_url, "bench-sw-frontend");
    g_sw_work = sw_connect(g_url, "bench-sw-worker");
    sw_router_opts_init(&rto);
    g_default_window = rto.credit_window;
    if ((e = sw_router_create(&g_router, g_sw_front, &rto)) != SW_OK)
        die("sw_router_create: %s", sw_err_name(e));
    /* max_inflight raised (default 64) so concurrency 1024 is not answered
     * "overloaded"; everything else default. */
    g_ing_main = start_ingress(EP_MAIN, INST_MAIN, 2 * max_conc, cfg.window > 1024 ? cfg.window : 0);
    /* The credit-cost run asks for a 1<<20 window: the ingress caps windows
     * at max_window (default 1024), so raise it there. */
    g_ing_big = start_ingress(EP_BIG, INST_BIG, 0, BIG_WINDOW);

    /* warm-up: fault in code and buffers on both paths */
    {
        stream_run w;
        memset(&w, 0, sizeof(w));
        w.n = 2000;
        w.size = 64;
        run_raw_stream(&w);
        memset(&w, 0, sizeof(w));
        w.n = 2000;
        w.size = 64;
        run_sw_stream(&w, EP_MAIN, INST_MAIN, 0, 0);
        if (w.err[0])
            die("warm-up failed: %s", w.err);
    }

    /* The idle scenario runs first: its RSS baseline is cleanest before the
     * throughput runs have grown the heap. */
    if (want("idle"))
        scen_idle();
    {
        int nidle, nslow;
        row idle_rows[16], slow_rows[16];
        nidle = g_nrows;
        memcpy(idle_rows, g_rows, sizeof(row) * (size_t)nidle);
        g_nrows = 0;
        /* Slow consumers next, for the same reason (frontend peak RSS). */
        if (want("slow"))
            scen_slow();
        nslow = g_nrows;
        memcpy(slow_rows, g_rows, sizeof(row) * (size_t)nslow);
        g_nrows = 0;
        if (want("long"))
            scen_long();
        if (want("short"))
            scen_short();
        if (want("latency"))
            scen_latency();
        if (want("ttfi"))
            scen_ttfi();
        memcpy(&g_rows[g_nrows], idle_rows, sizeof(row) * (size_t)nidle);
        g_nrows += nidle;
        if (want("loss"))
            scen_loss();
        if (want("cancel"))
            scen_cancel();
        memcpy(&g_rows[g_nrows], slow_rows, sizeof(row) * (size_t)nslow);
        g_nrows += nslow;
    }

    loadavg(g_load_end, sizeof(g_load_end));
    print_table();
    print_goals();
    printf("\ntotal %.1f s\n", (double)(now_ns() - t_start) / 1e9);
    fflush(stdout);
    if (cfg.json_path != NULL) {
        write_json(cfg.json_path);
        progress("wrote %s", cfg.json_path);
    }

    sw_ingress_destroy(g_ing_big);
    sw_ingress_destroy(g_ing_main);
    sw_router_destroy(g_router);
    sw_conn_close(g_sw_work);
    sw_conn_close(g_sw_front);
    natsSubscription_Unsubscribe(g_raw_resp_sub);
    natsSubscription_Destroy(g_raw_resp_sub);
    natsConnection_Destroy(g_raw_work);
    natsConnection_Destroy(g_raw_front);
    nats_Close();
    cleanup();
    return 0;
}
