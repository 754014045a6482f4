/* bench/gateway_bench.c -- streamwire-gateway-bench: the HTTP gateway under
 * many concurrent SSE streams, against the library path, in one run
 * (issue 12). See BENCHMARKS.md "Gateway".
 *
 * It starts its own nats-server, one `streamwire worker` (TOKENS tokens per
 * request, as fast as credit allows) and `streamwire gateway`, then
 * alternates, REPS times:
 *
 *   lib   STREAMS concurrent streams opened with sw_router_open in this
 *         process (callback mode): time to first token per stream, and
 *         tokens/s over the whole batch;
 *   http  STREAMS concurrent HTTP/1.1 connections to the gateway, one
 *         streamed POST /v1/responses each, read by this process's own
 *         small client (epoll): time to the first response.output_text.delta
 *         per stream, tokens/s, and every token checked in order, once;
 *   h2load the same STREAMS requests through h2load (nghttp2-client), h2c
 *         with 100 streams per connection: its requests/s, and the
 *         gateway's CPU time over the run.
 *
 * Then LONE requests on each path, one at a time, the paths alternating
 * request by request: the first token when nothing is queued in front.
 *
 * Figures: tokens/s; TTFT p50 and p99 of lib and http, under the burst and
 * alone, and their difference (goal: the gateway adds <= 1 ms at p99; under
 * the burst both paths queue behind the whole burst's CPU work on the shared
 * cores, see BENCHMARKS.md "Gateway"); gateway CPU per token
 * (user + system from /proc, over the http and h2load runs); the gateway's
 * RSS while STREAMS streams are open, per stream; tokens lost. Only the
 * public API and the CLI are used.
 *
 *   streamwire-gateway-bench --cli PATH [--streams N] [--tokens N] [--reps N]
 *                            [--lone N] [--loops N] [--json FILE] [--quick]
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <streamwire/streamwire.h>

#include "natsd.h"

static unsigned g_streams = 1000, g_tokens = 100, g_reps = 3, g_lone = 300;
static const char *g_loops = "0"; /* the gateway's --loops */
static const char *g_cli, *g_json;
static char g_gw[64];
static pid_t g_gw_pid;
static swh_nats g_nats;

#define EP "gwb.demo.gen"

static int64_t
now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int
cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static double
pct(int64_t *v, size_t n, double q)
{
    size_t i;
    if (n == 0)
        return 0;
    qsort(v, n, sizeof(*v), cmp_i64);
    i = (size_t)(q * (double)(n - 1) + 0.5);
    return (double)v[i];
}

static double
median(double *v, size_t n)
{
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n ? v[n / 2] : 0;
}

/* user + system CPU time of pid in microseconds, from /proc. */
static int64_t
cpu_us(pid_t pid)
{
    char path[64], buf[1024], *p;
    unsigned long ut = 0, st = 0;
    FILE *f;
    size_t n;
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    if ((f = fopen(path, "r")) == NULL)
        return -1;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    if ((p = strrchr(buf, ')')) == NULL)
        return -1;
    /* fields after the name: state(3) ... utime(14) stime(15) */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (int64_t)(ut + st) * 1000000 / sysconf(_SC_CLK_TCK);
}

/* ---------------------------------------------------------------- lib path */

typedef struct lib_stream {
    int64_t t0, first;
    unsigned n;
    int bad, done;
} lib_stream;

static atomic_uint g_lib_done;

static void
lib_cb(sw_stream *s, const sw_item *it, void *arg)
{
    lib_stream *ls = arg;
    (void)s;
    if (it->kind == SW_ITEM_DATA) {
        char want[32];
        int n = snprintf(want, sizeof(want), "token-%u", ls->n);
        if (ls->n == 0)
            ls->first = now_us();
        if (it->len != (size_t)n || memcmp(it->data, want, it->len) != 0)
            ls->bad = 1;
        ls->n++;
        return;
    }
    ls->done = it->terminal.status == SW_STATUS_COMPLETED ? 1 : -1;
    atomic_fetch_add(&g_lib_done, 1);
}

typedef struct run_result {
    double tokens_per_s;
    double p50_us, p99_us;
    unsigned lost, failed;
    double cpu_us_per_token; /* gateway runs */
    long rss_kb_open;        /* gateway RSS while the streams are open */
} run_result;

/* Opens one stream of the library path; ls->t0 is taken just before. */
static sw_err
lib_open(sw_router *r, lib_stream *ls, sw_stream **s)
{
    sw_request_opts q;
    sw_request_opts_init(&q);
    q.endpoint = EP;
    q.instance_id = "gwb1"; /* the gateway routes by the registry to this one instance */
    q.on_item = lib_cb;
    q.on_item_arg = ls;
    ls->t0 = now_us();
    return sw_router_open(s, r, &q, "hello", 5);
}

static int
run_lib(sw_router *r, run_result *res)
{
    lib_stream *ls = calloc(g_streams, sizeof(*ls));
    sw_stream **ss = calloc(g_streams, sizeof(*ss));
    int64_t *ttft = calloc(g_streams, sizeof(*ttft)), t0, t1;
    size_t nt = 0;
    memset(res, 0, sizeof(*res));
    atomic_store(&g_lib_done, 0);
    t0 = now_us();
    for (unsigned i = 0; i < g_streams; i++) {
        if (lib_open(r, &ls[i], &ss[i]) != SW_OK) {
            ls[i].done = -1;
            atomic_fetch_add(&g_lib_done, 1);
        }
    }
    while (atomic_load(&g_lib_done) < g_streams && now_us() - t0 < 120 * 1000000LL)
        swh_sleep_ms(2);
    t1 = now_us();
    for (unsigned i = 0; i < g_streams; i++) {
        if (ls[i].done != 1)
            res->failed++;
        if (ls[i].n < g_tokens || ls[i].bad)
            res->lost += g_tokens - (ls[i].n < g_tokens ? ls[i].n : 0) + (ls[i].bad ? 1 : 0);
        if (ls[i].first)
            ttft[nt++] = ls[i].first - ls[i].t0;
        if (ss[i] != NULL)
            sw_stream_close(ss[i]);
    }
    res->tokens_per_s = (double)g_streams * g_tokens / ((double)(t1 - t0) / 1e6);
    res->p50_us = pct(ttft, nt, 0.50);
    res->p99_us = pct(ttft, nt, 0.99);
    free(ls);
    free(ss);
    free(ttft);
    return 0;
}

/* ---------------------------------------------------------------- http path */

typedef struct hconn {
    int fd;
    int64_t t0, first;
    size_t sent, have;
    unsigned n;
    int bad, done, headers;
    char buf[8192];
} hconn;

static char g_req[512];
static size_t g_req_len;

static int
tcp_nb_connect(void)
{
    char host[64];
    const char *colon = strrchr(g_gw, ':');
    struct sockaddr_in a;
    int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -1;
    memset(&a, 0, sizeof(a));
    snprintf(host, sizeof(host), "%.*s", (int)(colon - g_gw), g_gw);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)atoi(colon + 1));
    inet_pton(AF_INET, host, &a.sin_addr);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0 && errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Consumes complete SSE frames in c->buf. HTTP/1.1 chunked encoding wraps
 * them; chunk-size lines are skipped (they never look like "event: "). */
static void
http_parse(hconn *c)
{
    char *p = c->buf, *end = c->buf + c->have;
    if (!c->headers) {
        char *h = memmem(p, c->have, "\r\n\r\n", 4);
        if (h == NULL)
            return;
        if (strncmp(p, "HTTP/1.1 200", 12) != 0) {
            c->bad = 1;
            c->done = -1;
        }
        c->headers = 1;
        p = h + 4;
    }
    for (;;) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        if (nl == NULL)
            break;
        if (nl - p > 7 && strncmp(p, "event: ", 7) == 0) {
            if (strncmp(p + 7, "response.output_text.delta", 26) == 0) {
                char want[40], *d;
                int n = snprintf(want, sizeof(want), "\"delta\":\"token-%u\"", c->n);
                char *nl2 = memchr(nl + 1, '\n', (size_t)(end - nl - 1));
                if (nl2 == NULL)
                    break; /* the data line is not all here yet */
                d = memmem(nl + 1, (size_t)(nl2 - nl - 1), want, (size_t)n);
                if (d == NULL)
                    c->bad = 1;
                if (c->n == 0)
                    c->first = now_us();
                c->n++;
                p = nl2 + 1;
                continue;
            }
            if (strncmp(p + 7, "response.completed", 18) == 0)
                c->done = 1;
            else if (strncmp(p + 7, "response.", 9) == 0 &&
                     (strncmp(p + 16, "failed", 6) == 0 || strncmp(p + 16, "incomplete", 10) == 0))
                c->done = -1;
            else if (strncmp(p + 7, "error", 5) == 0)
                c->done = -1;
        }
        p = nl + 1;
    }
    c->have = (size_t)(end - p);
    memmove(c->buf, p, c->have);
}

/* Writes what is left of the request. 1 once it is all sent, 0 if more
 * is left, -1 on an error (c->done = -1). */
static int
hconn_write(hconn *c)
{
    ssize_t w = write(c->fd, g_req + c->sent, g_req_len - c->sent);
    if (w > 0) {
        c->sent += (size_t)w;
        return c->sent == g_req_len;
    }
    if (w < 0 && errno != EAGAIN) {
        c->done = -1;
        return -1;
    }
    return 0;
}

/* Reads and parses what the socket has, until it would block or the
 * response ended (c->done). */
static void
hconn_read(hconn *c)
{
    for (;;) {
        ssize_t rd = read(c->fd, c->buf + c->have, sizeof(c->buf) - c->have - 1);
        if (rd > 0) {
            c->have += (size_t)rd;
            http_parse(c);
            if (c->have >= sizeof(c->buf) - 1)
                c->have = 0; /* a frame bigger than the buffer: not ours */
            if (c->done != 0)
                break;
            continue;
        }
        if ((rd == 0 || errno != EAGAIN) && c->done == 0)
            c->done = -1;
        break;
    }
}

static int
run_http(run_result *res)
{
    hconn *cs = calloc(g_streams, sizeof(*cs));
    struct epoll_event *evs = calloc(g_streams, sizeof(*evs));
    int64_t *ttft = calloc(g_streams, sizeof(*ttft)), t0, t1, c0, last_rss = 0;
    unsigned finished = 0;
    long rss_peak = 0;
    size_t nt = 0;
    int ep = epoll_create1(EPOLL_CLOEXEC);
    memset(res, 0, sizeof(*res));
    c0 = cpu_us(g_gw_pid);
    t0 = now_us();
    for (unsigned i = 0; i < g_streams; i++) {
        struct epoll_event e;
        cs[i].t0 = now_us();
        cs[i].fd = tcp_nb_connect();
        /* the request goes at once, as sw_router_open sends at once on the
         * library path (on loopback the connection is usually up already);
         * otherwise when the socket is writable */
        if (cs[i].fd >= 0) {
            ssize_t w = write(cs[i].fd, g_req, g_req_len);
            if (w > 0)
                cs[i].sent = (size_t)w;
        }
        e.events = cs[i].sent == g_req_len ? EPOLLIN : EPOLLOUT | EPOLLIN;
        e.data.u32 = i;
        if (cs[i].fd < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, cs[i].fd, &e) != 0) {
            cs[i].done = -1;
            finished++;
        }
    }
    while (finished < g_streams && now_us() - t0 < 120 * 1000000LL) {
        int n = epoll_wait(ep, evs, (int)g_streams, 100);
        for (int k = 0; k < n; k++) {
            hconn *c = &cs[evs[k].data.u32];
            if (c->done != 0)
                continue;
            if (c->sent < g_req_len) {
                if (hconn_write(c) == 1) {
                    struct epoll_event e;
                    e.events = EPOLLIN;
                    e.data.u32 = evs[k].data.u32;
                    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &e);
                }
            } else {
                hconn_read(c);
            }
            if (c->done != 0) {
                finished++;
                close(c->fd);
                c->fd = -1;
            }
        }
        if (finished < g_streams / 2 && now_us() - last_rss > 20000) {
            long r = swh_rss_kb(g_gw_pid);
            last_rss = now_us();
            if (r > rss_peak)
                rss_peak = r;
        }
    }
    t1 = now_us();
    close(ep);
    for (unsigned i = 0; i < g_streams; i++) {
        if (cs[i].done != 1)
            res->failed++;
        if (cs[i].n != g_tokens || cs[i].bad)
            res->lost += g_tokens > cs[i].n ? g_tokens - cs[i].n : 1;
        if (cs[i].first)
            ttft[nt++] = cs[i].first - cs[i].t0;
        if (cs[i].fd >= 0)
            close(cs[i].fd);
    }
    res->tokens_per_s = (double)g_streams * g_tokens / ((double)(t1 - t0) / 1e6);
    res->p50_us = pct(ttft, nt, 0.50);
    res->p99_us = pct(ttft, nt, 0.99);
    res->cpu_us_per_token = (double)(cpu_us(g_gw_pid) - c0) / ((double)g_streams * g_tokens);
    res->rss_kb_open = rss_peak;
    free(cs);
    free(evs);
    free(ttft);
    return 0;
}

/* ---------------------------------------------------------------- lone requests */

/* One request at a time, the two paths alternating request by request (so
 * that both see the same machine): what the gateway adds to a request's
 * first token when nothing else is queued in front of it. The HTTP request
 * opens a new connection (t0 is taken before connect, as a client without a
 * kept-alive connection pays it). */
static int
lone_http(int64_t *ttft)
{
    hconn c;
    int64_t until;
    memset(&c, 0, sizeof(c));
    c.t0 = now_us();
    if ((c.fd = tcp_nb_connect()) < 0)
        return -1;
    until = c.t0 + 10 * 1000000LL;
    while (c.done == 0 && now_us() < until) {
        struct pollfd pf = {c.fd, c.sent < g_req_len ? POLLOUT : POLLIN, 0};
        if (poll(&pf, 1, 100) <= 0)
            continue;
        if (c.sent < g_req_len)
            (void)hconn_write(&c);
        else
            hconn_read(&c);
    }
    close(c.fd);
    if (c.done != 1 || c.n != g_tokens || c.bad || c.first == 0)
        return -1;
    *ttft = c.first - c.t0;
    return 0;
}

static int
lone_lib(sw_router *r, int64_t *ttft)
{
    lib_stream ls;
    sw_stream *s = NULL;
    int64_t until;
    memset(&ls, 0, sizeof(ls));
    atomic_store(&g_lib_done, 0);
    if (lib_open(r, &ls, &s) != SW_OK)
        return -1;
    until = ls.t0 + 10 * 1000000LL;
    /* a short sleep between looks: the callback's thread is not held up by
     * this one spinning on the 2 cores */
    while (atomic_load(&g_lib_done) == 0 && now_us() < until)
        swh_sleep_ms(1);
    sw_stream_close(s);
    if (ls.done != 1 || ls.n != g_tokens || ls.bad || ls.first == 0)
        return -1;
    *ttft = ls.first - ls.t0;
    return 0;
}

typedef struct lone_result {
    double lib_p50_us, lib_p99_us, gw_p50_us, gw_p99_us;
    unsigned failed;
} lone_result;

static void
run_lone(sw_router *r, unsigned n, lone_result *res)
{
    int64_t *lt = calloc(n, sizeof(*lt)), *gt = calloc(n, sizeof(*gt));
    size_t nl = 0, ng = 0;
    memset(res, 0, sizeof(*res));
    for (unsigned i = 0; i < n; i++) {
        int64_t t;
        if (lone_lib(r, &t) == 0)
            lt[nl++] = t;
        else
            res->failed++;
        if (lone_http(&t) == 0)
            gt[ng++] = t;
        else
            res->failed++;
    }
    res->lib_p50_us = pct(lt, nl, 0.50);
    res->lib_p99_us = pct(lt, nl, 0.99);
    res->gw_p50_us = pct(gt, ng, 0.50);
    res->gw_p99_us = pct(gt, ng, 0.99);
    free(lt);
    free(gt);
}

/* ---------------------------------------------------------------- h2load */

static int
run_h2load(const char *body_path, run_result *res)
{
    char cmd[1024], line[512];
    FILE *p;
    double secs = 0;
    unsigned ok = 0;
    int64_t c0 = cpu_us(g_gw_pid);
    unsigned conns = g_streams >= 100 ? g_streams / 100 : 1;
    memset(res, 0, sizeof(*res));
    snprintf(cmd, sizeof(cmd),
             "h2load -n %u -c %u -m 100 -H 'content-type: application/json' -d %s "
             "'http://%s/v1/responses' 2>&1",
             g_streams, conns, body_path, g_gw);
    if ((p = popen(cmd, "r")) == NULL)
        return -1;
    while (fgets(line, sizeof(line), p) != NULL) {
        /* "finished in 1.23s, 812.3 req/s, 9.8MB/s" and
         * "requests: 1000 total, 1000 started, 1000 done, 1000 succeeded, ..." */
        if (strncmp(line, "finished in ", 12) == 0) {
            secs = atof(line + 12);
            if (strstr(line, "ms,") != NULL && strstr(line, "ms,") < strchr(line, ','))
                secs /= 1000;
        }
        sscanf(line, "requests: %*u total, %*u started, %*u done, %u succeeded", &ok);
    }
    if (pclose(p) != 0 || secs <= 0)
        return -1;
    res->tokens_per_s = (double)ok * g_tokens / secs;
    res->failed = g_streams - ok;
    res->cpu_us_per_token = (double)(cpu_us(g_gw_pid) - c0) / ((double)g_streams * g_tokens);
    return 0;
}

/* ---------------------------------------------------------------- setup */

static pid_t
spawn_cli(const char *const argv[], const char *ready, char *line, size_t cap)
{
    int fd;
    pid_t pid = swh_spawn_path(g_cli, argv, &fd, -1);
    if (pid <= 0)
        return -1;
    if (swh_wait_line(fd, ready, line, cap, 20000) != 0) {
        fprintf(stderr, "gateway-bench: no '%s' from %s\n", ready, argv[1]);
        swh_terminate(pid, 1000);
        return -1;
    }
    /* keep reading its stdout (access log lines) away so it never blocks */
    if (fork() == 0) {
        char b[4096];
        while (read(fd, b, sizeof(b)) > 0)
            ;
        _exit(0);
    }
    close(fd);
    return pid;
}

static void
usage(FILE *f)
{
    fprintf(f, "Usage: streamwire-gateway-bench --cli PATH [--streams N] [--tokens N] [--reps N]\n"
               "                                [--lone N] [--loops N] [--json FILE] [--quick]\n"
               "  --cli PATH     the streamwire CLI (worker and gateway are run from it)\n"
               "  --streams N    concurrent streams per run (default 1000)\n"
               "  --tokens N     tokens per stream (default 100)\n"
               "  --reps N       alternating runs of each path (default 3; medians shown)\n"
               "  --lone N       then N requests one at a time on each path, alternating\n"
               "                 (default 300; 0 skips): the first token with nothing queued\n"
               "  --loops N      the gateway's --loops (default 0: one per online CPU)\n"
               "  --json FILE    also write the figures as JSON\n"
               "  --quick        100 streams, 1 rep (a smoke run)\n"
               "Starts its own nats-server, worker and gateway; needs h2load (nghttp2-client).\n");
}

int
main(int argc, char **argv)
{
    char line[256], tokens[16], body_path[] = "/tmp/sw-gwb-XXXXXX";
    sw_conn *conn = NULL;
    sw_router *router = NULL;
    sw_conn_opts co;
    sw_router_opts ro;
    pid_t worker;
    struct rlimit rl;
    double lt[16], lp50[16], lp99[16], ht[16], hp50[16], hp99[16], hcpu[16], h2t[16], h2cpu[16];
    unsigned lost = 0, failed = 0, h2failed = 0;
    long rss_idle, rss_open = 0;
    lone_result lone;
    int fd, rc = 1;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--quick")) {
            g_streams = 100;
            g_reps = 1;
            g_lone = 20;
        } else if (v != NULL && !strcmp(a, "--cli")) {
            g_cli = v, i++;
        } else if (v != NULL && !strcmp(a, "--streams")) {
            g_streams = (unsigned)atoi(v), i++;
        } else if (v != NULL && !strcmp(a, "--tokens")) {
            g_tokens = (unsigned)atoi(v), i++;
        } else if (v != NULL && !strcmp(a, "--reps")) {
            g_reps = (unsigned)atoi(v), i++;
        } else if (v != NULL && !strcmp(a, "--lone")) {
            g_lone = (unsigned)atoi(v), i++;
        } else if (v != NULL && !strcmp(a, "--loops")) {
            g_loops = v, i++;
        } else if (v != NULL && !strcmp(a, "--json")) {
            g_json = v, i++;
        } else {
            fprintf(stderr, "streamwire-gateway-bench: unknown or incomplete option %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (g_cli == NULL || g_streams == 0 || g_streams > 20000 || g_tokens == 0 || g_reps == 0 ||
        g_reps > 16) {
        usage(stderr);
        return 2;
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
    snprintf(tokens, sizeof(tokens), "%u", g_tokens);
    g_req_len = (size_t)snprintf(g_req, sizeof(g_req),
                                 "POST /v1/responses HTTP/1.1\r\nHost: bench\r\n"
                                 "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                                 strlen("{\"model\":\"demo\",\"input\":\"hello\",\"stream\":true}"),
                                 "{\"model\":\"demo\",\"input\":\"hello\",\"stream\":true}");
    if ((fd = mkstemp(body_path)) < 0 ||
        write(fd, "{\"model\":\"demo\",\"input\":\"hello\",\"stream\":true}", 46) != 46) {
        perror("gateway-bench: body file");
        return 1;
    }
    close(fd);

    if (swh_nats_start(&g_nats, NULL) != 0)
        return 1;
    {
        char maxin[16];
        const char *wargv[] = {"streamwire", "worker", "--server",       g_nats.url,
                               "--endpoint", EP,       "--instance-id",  "gwb1",
                               "--tokens",   tokens,   "--max-inflight", maxin,
                               "--threads",  "8",      "--quiet",        NULL};
        snprintf(maxin, sizeof(maxin), "%u", g_streams * 2);
        worker = spawn_cli(wargv, "worker ready", NULL, 0);
    }
    {
        char maxc[16];
        const char *gargv[] = {"streamwire",        "gateway",     "--server",     g_nats.url,
                               "--listen",          "127.0.0.1:0", "--model",      "demo=" EP,
                               "--max-connections", maxc,          "--access-log", "off",
                               "--narration",       "off",         "--loops",      g_loops,
                               "--quiet",           NULL};
        snprintf(maxc, sizeof(maxc), "%u", g_streams * 2 + 100);
        g_gw_pid = spawn_cli(gargv, "gateway ready listen=", line, sizeof(line));
        if (g_gw_pid > 0)
            snprintf(g_gw, sizeof(g_gw), "%s", strchr(line, '=') + 1);
    }
    if (worker <= 0 || g_gw_pid <= 0)
        goto out;
    sw_conn_opts_init(&co);
    co.url = g_nats.url;
    sw_router_opts_init(&ro);
    if (sw_conn_open(&conn, &co) != SW_OK || sw_router_create(&router, conn, &ro) != SW_OK)
        goto out;
    swh_sleep_ms(1500); /* the gateway's registry view fills */
    {
        run_result w;
        unsigned s = g_streams;
        g_streams = s < 50 ? s : 50; /* warm-up, both paths */
        run_lib(router, &w);
        run_http(&w);
        g_streams = s;
    }
    rss_idle = swh_rss_kb(g_gw_pid);
    memset(&lone, 0, sizeof(lone));
    printf("gateway bench: %u concurrent streams x %u tokens, %u rep(s) of each path, "
           "alternating; then %u lone requests on each path\n",
           g_streams, g_tokens, g_reps, g_lone);
    for (unsigned k = 0; k < g_reps; k++) {
        run_result a, b, c;
        fprintf(stderr, "  rep %u/%u: library path...\n", k + 1, g_reps);
        run_lib(router, &a);
        fprintf(stderr, "  rep %u/%u: gateway, own HTTP/1.1 client...\n", k + 1, g_reps);
        run_http(&b);
        fprintf(stderr, "  rep %u/%u: gateway, h2load (h2c)...\n", k + 1, g_reps);
        if (run_h2load(body_path, &c) != 0) {
            fprintf(stderr, "gateway-bench: h2load failed (is nghttp2-client installed?)\n");
            goto out;
        }
        lt[k] = a.tokens_per_s, lp50[k] = a.p50_us, lp99[k] = a.p99_us;
        ht[k] = b.tokens_per_s, hp50[k] = b.p50_us, hp99[k] = b.p99_us;
        hcpu[k] = b.cpu_us_per_token;
        h2t[k] = c.tokens_per_s, h2cpu[k] = c.cpu_us_per_token;
        lost += a.lost + b.lost;
        failed += a.failed + b.failed;
        h2failed += c.failed;
        if (b.rss_kb_open > rss_open)
            rss_open = b.rss_kb_open;
    }
    if (g_lone > 0) {
        fprintf(stderr, "  lone requests: %u on each path, one at a time, alternating...\n",
                g_lone);
        run_lone(router, g_lone, &lone);
        failed += lone.failed;
    }
    {
        double mlt = median(lt, g_reps), mlp50 = median(lp50, g_reps), mlp99 = median(lp99, g_reps),
               mht = median(ht, g_reps), mhp50 = median(hp50, g_reps), mhp99 = median(hp99, g_reps),
               mhcpu = median(hcpu, g_reps), mh2t = median(h2t, g_reps),
               mh2cpu = median(h2cpu, g_reps);
        double per_stream = rss_open > rss_idle ? (double)(rss_open - rss_idle) / g_streams : 0;
        printf("%-44s %14s %14s %10s\n", "figure (median of the reps)", "library", "gateway",
               "gw - lib");
        printf("%-44s %14.0f %14.0f %10s\n", "tokens/s (own client, HTTP/1.1)", mlt, mht, "");
        printf("%-44s %14s %14.0f %10s\n", "tokens/s (h2load, h2c, 100 streams/conn)", "", mh2t,
               "");
        printf("%-44s %14.2f %14.2f %+10.2f\n", "time to first token p50, burst (ms)", mlp50 / 1e3,
               mhp50 / 1e3, (mhp50 - mlp50) / 1e3);
        printf("%-44s %14.2f %14.2f %+10.2f  goal <= +1 ms\n",
               "time to first token p99, burst (ms)", mlp99 / 1e3, mhp99 / 1e3,
               (mhp99 - mlp99) / 1e3);
        if (g_lone > 0) {
            printf("%-44s %14.2f %14.2f %+10.2f\n", "time to first token p50, lone (ms)",
                   lone.lib_p50_us / 1e3, lone.gw_p50_us / 1e3,
                   (lone.gw_p50_us - lone.lib_p50_us) / 1e3);
            printf("%-44s %14.2f %14.2f %+10.2f  goal <= +1 ms\n",
                   "time to first token p99, lone (ms)", lone.lib_p99_us / 1e3,
                   lone.gw_p99_us / 1e3, (lone.gw_p99_us - lone.lib_p99_us) / 1e3);
        }
        printf("%-44s %14s %14.2f %10s\n", "gateway CPU per token, HTTP/1.1 (us)", "", mhcpu, "");
        printf("%-44s %14s %14.2f %10s\n", "gateway CPU per token, h2load h2c (us)", "", mh2cpu,
               "");
        printf("%-44s %14s %14.1f %10s\n", "gateway RSS per open stream (KiB)", "", per_stream, "");
        printf("tokens lost or out of order: %u; streams not completed: %u (h2load: %u)\n", lost,
               failed, h2failed);
        if (g_json != NULL) {
            FILE *f = fopen(g_json, "w");
            if (f != NULL) {
                fprintf(f,
                        "{\"streams\":%u,\"tokens\":%u,\"reps\":%u,\"lib_tokens_per_s\":%.0f,"
                        "\"gw_tokens_per_s\":%.0f,\"h2load_tokens_per_s\":%.0f,"
                        "\"lib_ttft_p50_ms\":%.3f,\"lib_ttft_p99_ms\":%.3f,"
                        "\"gw_ttft_p50_ms\":%.3f,\"gw_ttft_p99_ms\":%.3f,"
                        "\"gw_cpu_us_per_token\":%.3f,\"h2load_cpu_us_per_token\":%.3f,"
                        "\"gw_rss_kib_per_stream\":%.2f,\"lost\":%u,\"failed\":%u,"
                        "\"h2load_failed\":%u,\"lone\":%u,\"lone_lib_ttft_p50_ms\":%.3f,"
                        "\"lone_lib_ttft_p99_ms\":%.3f,\"lone_gw_ttft_p50_ms\":%.3f,"
                        "\"lone_gw_ttft_p99_ms\":%.3f}\n",
                        g_streams, g_tokens, g_reps, mlt, mht, mh2t, mlp50 / 1e3, mlp99 / 1e3,
                        mhp50 / 1e3, mhp99 / 1e3, mhcpu, mh2cpu, per_stream, lost, failed, h2failed,
                        g_lone, lone.lib_p50_us / 1e3, lone.lib_p99_us / 1e3, lone.gw_p50_us / 1e3,
                        lone.gw_p99_us / 1e3);
                fclose(f);
            }
        }
    }
    rc = lost == 0 && failed == 0 && h2failed == 0 ? 0 : 1;
out:
    sw_router_destroy(router);
    sw_conn_close(conn);
    if (g_gw_pid > 0)
        swh_terminate(g_gw_pid, 15000);
    if (worker > 0)
        swh_terminate(worker, 5000);
    swh_nats_stop(&g_nats);
    unlink(body_path);
    while (waitpid(-1, NULL, WNOHANG) > 0)
        ;
    return rc;
}
