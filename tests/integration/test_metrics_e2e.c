/* tests/integration/test_metrics_e2e.c -- Prometheus metrics end to end
 * (issue 16), against a real nats-server:
 *
 *   values      a router, an ingress and their connections in one sw_metrics;
 *               3 completed streams of 5 items, 1 failed after 2 and 1
 *               cancelled after 1; the rendered counters and histogram counts
 *               are exactly what those streams imply, and `promtool check
 *               metrics` accepts the text;
 *   worker_metrics_http  `worker --metrics-listen`'s HTTP server: GET and
 *               HEAD /metrics (the same head, no body), 404 and 405;
 *   prometheus  `streamwire worker --metrics-listen 127.0.0.1:0` scraped by a
 *               real prometheus server (Debian's package) every second; its
 *               HTTP API returns the worker's series with the values the
 *               requests sent imply.
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include <streamwire/metrics.h>
#include <streamwire/streamwire.h>

#include "harness.h"

#define EP "met.demo.gen"

static swh_nats g_nats;

static int
group_setup(void **state)
{
    (void)state;
    return swh_nats_start(&g_nats, NULL);
}

static int
group_teardown(void **state)
{
    (void)state;
    swh_nats_stop(&g_nats);
    return 0;
}

/* ---------------------------------------------------------------- in process */

/* "ok": 5 items, completed. "fail": 2 items, then failed (engine_error).
 * "hold": 1 item, then waits for the cancel. */
static void
handler(sw_responder *r, void *arg)
{
    size_t len = 0;
    const char *p = sw_responder_payload(r, &len);
    int n = len == 2 && memcmp(p, "ok", 2) == 0 ? 5 : len == 4 && memcmp(p, "fail", 4) == 0 ? 2 : 1;
    (void)arg;
    for (int i = 0; i < n; i++) {
        char tok[16];
        int k = snprintf(tok, sizeof(tok), "t%d", i);
        if (sw_responder_send(r, tok, (size_t)k) != SW_OK)
            return;
    }
    if (len == 2)
        (void)sw_responder_finish(r, SW_STATUS_COMPLETED, NULL);
    else if (len == 4 && memcmp(p, "fail", 4) == 0)
        (void)sw_responder_fail(r, "engine_error", "told to fail");
    else
        while (!sw_responder_cancelled(r))
            swh_sleep_ms(5);
}

static sw_conn *
conn(const char *name)
{
    sw_conn_opts o;
    sw_conn *c = NULL;
    sw_conn_opts_init(&o);
    o.url = g_nats.url;
    o.name = name;
    assert_int_equal(sw_conn_open(&c, &o), SW_OK);
    return c;
}

/* Reads a stream to its terminal; returns its status; counts data items. */
static int
drain(sw_stream *s, int cancel_after, int *items)
{
    const sw_item *it;
    *items = 0;
    for (;;) {
        assert_int_equal(sw_stream_next(s, &it, 10000 * swh_slow()), SW_OK);
        if (it->kind == SW_ITEM_TERMINAL)
            return it->terminal.status;
        if (++*items == cancel_after)
            assert_int_equal(sw_stream_cancel(s), SW_OK);
    }
}

/* Fails if two sample lines of text name the same series (the name and
 * labels: all before the value). */
static void
assert_no_duplicate_series(const char *text)
{
    const char *lines[4096];
    size_t len[4096], n = 0;
    for (const char *p = text; *p != '\0';) {
        const char *eol = strchr(p, '\n'), *sp;
        size_t l = eol ? (size_t)(eol - p) : strlen(p);
        if (l > 0 && p[0] != '#') {
            for (sp = p + l; sp > p && sp[-1] != ' '; sp--)
                ;
            assert_true(n < sizeof(lines) / sizeof(lines[0]));
            lines[n] = p;
            len[n] = sp > p ? (size_t)(sp - p) : l;
            for (size_t i = 0; i < n; i++)
                if (len[i] == len[n] && memcmp(lines[i], p, len[n]) == 0)
                    fail_msg("the series %.*s is written twice", (int)len[n], p);
            n++;
        }
        p += l + (eol != NULL);
    }
    assert_true(n > 100);
}

/* The value of the sample line that starts with `head` (name and labels). */
static double
sample(const char *text, const char *head)
{
    char key[512];
    const char *at;
    snprintf(key, sizeof(key), "\n%s ", head);
    at = strstr(text, key);
    if (at == NULL)
        fail_msg("no sample %s in:\n%s", head, text);
    return strtod(at + strlen(key), NULL);
}

static void
test_values(void **state)
{
    sw_conn *wc = conn("met-worker"), *fc = conn("met-frontend");
    sw_ingress *ing;
    sw_router *r;
    sw_ingress_opts io;
    sw_router_opts ro;
    sw_request_opts q;
    sw_metrics *m;
    sw_stream *s;
    char *text = NULL, path[300], cmd[600], head[256];
    size_t len;
    int items, total = 0;
    (void)state;
    sw_ingress_opts_init(&io);
    io.endpoint = EP;
    io.instance_id = "mw1";
    io.handler = handler;
    assert_int_equal(sw_ingress_start(&ing, wc, &io), SW_OK);
    sw_router_opts_init(&ro);
    ro.router_id = "mfe";
    assert_int_equal(sw_router_create(&r, fc, &ro), SW_OK);
    assert_int_equal(sw_metrics_create(&m), SW_OK);
    assert_int_equal(sw_metrics_add_router(m, r), SW_OK);
    assert_int_equal(sw_metrics_add_ingress(m, ing), SW_OK);
    assert_int_equal(sw_metrics_add_conn(m, wc), SW_OK);
    assert_int_equal(sw_metrics_add_conn(m, fc), SW_OK);
    assert_int_equal(sw_metrics_add_conn(m, fc), SW_EEXIST);

    sw_request_opts_init(&q);
    q.endpoint = EP;
    q.instance_id = "mw1";
    for (int i = 0; i < 3; i++) {
        assert_int_equal(sw_router_open(&s, r, &q, "ok", 2), SW_OK);
        assert_int_equal(drain(s, -1, &items), SW_STATUS_COMPLETED);
        assert_int_equal(items, 5);
        total += items;
        sw_stream_close(s);
    }
    assert_int_equal(sw_router_open(&s, r, &q, "fail", 4), SW_OK);
    assert_int_equal(drain(s, -1, &items), SW_STATUS_FAILED);
    assert_int_equal(items, 2);
    total += items;
    sw_stream_close(s);
    assert_int_equal(sw_router_open(&s, r, &q, "hold", 4), SW_OK);
    assert_int_equal(drain(s, 1, &items), SW_STATUS_CANCELLED);
    assert_int_equal(items, 1);
    total += items;
    sw_stream_close(s);
    /* the worker hears of the cancel asynchronously */
    for (int i = 0; i < 200; i++) {
        sw_ingress_stats st;
        sw_ingress_stats_get(ing, &st);
        if (st.cancels == 1 && st.inflight == 0)
            break;
        swh_sleep_ms(10);
    }

    assert_int_equal(sw_metrics_render(m, &text, &len), SW_OK);
#define R "{router=\"mfe\""
    assert_true(sample(text, "streamwire_frontend_streams_opened_total" R "}") == 5);
    assert_true(sample(text, "streamwire_frontend_streams_total" R
                             ",status=\"completed\",reason=\"\"}") == 3);
    assert_true(
        sample(text, "streamwire_frontend_streams_total" R ",status=\"failed\",reason=\"\"}") == 1);
    assert_true(sample(text, "streamwire_frontend_streams_total" R
                             ",status=\"cancelled\",reason=\"\"}") == 1);
    assert_true(sample(text, "streamwire_frontend_streams_total" R
                             ",status=\"error\",reason=\"instance_lost\"}") == 0);
    assert_true(sample(text, "streamwire_frontend_items_total" R "}") == total);
    assert_true(sample(text, "streamwire_frontend_open_streams" R "}") == 0);
    /* every stream had a first item and a terminal; between items: 3x4 + 1 */
    assert_true(sample(text, "streamwire_frontend_time_to_first_item_seconds_count" R "}") == 5);
    assert_true(sample(text, "streamwire_frontend_stream_duration_seconds_count" R "}") == 5);
    assert_true(sample(text, "streamwire_frontend_inter_item_seconds_count" R "}") == 13);
    assert_true(sample(text, "streamwire_frontend_time_to_first_item_seconds_bucket" R
                             ",le=\"+Inf\"}") == 5);
    assert_true(sample(text, "streamwire_frontend_stream_duration_seconds_sum" R "}") > 0);
    /* and by endpoint */
#define E R ",endpoint=\"" EP "\""
    assert_true(sample(text, "streamwire_frontend_endpoint_streams_opened_total" E "}") == 5);
    assert_true(
        sample(text, "streamwire_frontend_endpoint_streams_total" E ",status=\"completed\"}") == 3);
    assert_true(
        sample(text, "streamwire_frontend_endpoint_streams_total" E ",status=\"failed\"}") == 1);
    assert_true(
        sample(text, "streamwire_frontend_endpoint_streams_total" E ",status=\"cancelled\"}") == 1);
    assert_true(
        sample(text, "streamwire_frontend_endpoint_time_to_first_item_seconds_count" E "}") == 5);
    assert_true(sample(text, "streamwire_frontend_endpoint_stream_duration_seconds_count" E "}") ==
                5);
    assert_null(strstr(text, "endpoint=\"_other\""));
#undef E
#undef R
#define W "{instance_id=\"mw1\",endpoint=\"" EP "\""
    assert_true(sample(text, "streamwire_worker_requests_total" W "}") == 5);
    assert_true(sample(text, "streamwire_worker_items_sent_total" W "}") == total);
    assert_true(sample(text, "streamwire_worker_cancels_total" W "}") == 1);
    assert_true(
        sample(text, "streamwire_worker_streams_finished_total" W ",status=\"completed\"}") == 3);
    assert_true(sample(text, "streamwire_worker_streams_finished_total" W ",status=\"failed\"}") ==
                1);
    assert_true(sample(text, "streamwire_worker_inflight_streams" W "}") == 0);
#undef W
    snprintf(head, sizeof(head), "streamwire_nats_connected{conn=\"met-frontend\"}");
    assert_true(sample(text, head) == 1);
    assert_true(sample(text, "streamwire_nats_reconnects_total{conn=\"met-worker\"}") == 0);

    /* Each series once (promtool does not check it; a scrape with one
     * twice is refused by Prometheus): the router wrote
     * streams_total{status="error",reason="unknown_error"} 90 times, once
     * for each undefined code in the range of the stream reasons. */
    assert_no_duplicate_series(text);

    /* promtool accepts the exposition (format and naming lint) */
    snprintf(path, sizeof(path), "/tmp/sw-metrics-%d.txt", (int)getpid());
    assert_int_equal(swh_write_file(path, text), 0);
    snprintf(cmd, sizeof(cmd), "promtool check metrics < %s", path);
    if (system(cmd) != 0) {
        unlink(path);
        fail_msg("promtool check metrics failed (is Debian's prometheus installed? scripts/deps)");
    }
    unlink(path);
    free(text);

    /* Bounded: 40 more endpoints (requests to nobody: no_responders); the
     * first 31 get their own series (32 with EP), the other 9 share
     * endpoint="_other". */
    for (int i = 0; i < 40; i++) {
        char ep[64];
        sw_request_opts o;
        snprintf(ep, sizeof(ep), "ovf.ep.e%d", i);
        sw_request_opts_init(&o);
        o.endpoint = ep;
        o.instance_id = "nobody";
        assert_int_equal(sw_router_open(&s, r, &o, "x", 1), SW_OK);
        assert_int_equal(drain(s, -1, &items), SW_STATUS_ERROR);
        sw_stream_close(s);
    }
    assert_int_equal(sw_metrics_render(m, &text, &len), SW_OK);
    {
        int series = 0;
        for (const char *at = text;
             (at = strstr(at, "streamwire_frontend_endpoint_streams_opened_total{")) != NULL; at++)
            series++;
        assert_int_equal(series, 33);
    }
    assert_true(sample(text, "streamwire_frontend_endpoint_streams_opened_total{router=\"mfe\","
                             "endpoint=\"_other\"}") == 9);
    assert_true(sample(text, "streamwire_frontend_endpoint_streams_total{router=\"mfe\","
                             "endpoint=\"ovf.ep.e0\",status=\"error\"}") == 1);
    free(text);

    /* a removed source is gone; the rest still render */
    assert_int_equal(sw_metrics_remove(m, r), SW_OK);
    assert_int_equal(sw_metrics_render(m, &text, &len), SW_OK);
    assert_null(strstr(text, "streamwire_frontend_"));
    assert_non_null(strstr(text, "streamwire_worker_requests_total"));
    free(text);
    sw_metrics_destroy(m);
    sw_router_destroy(r);
    sw_ingress_destroy(ing);
    sw_conn_close(fc);
    sw_conn_close(wc);
}

/* ---------------------------------------------------------------- prometheus */

/* GET via curl; the body into out. 0 on HTTP 200. */
static int
http_get(const char *url, char *out, size_t cap)
{
    char cmd[1024];
    FILE *p;
    size_t n;
    snprintf(cmd, sizeof(cmd), "curl -s -f -m 5 '%s'", url);
    if ((p = popen(cmd, "r")) == NULL)
        return -1;
    n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    return pclose(p) == 0 ? 0 : -1;
}

/* Sends req to 127.0.0.1:port and reads the answer until the server closes
 * the connection. Returns the bytes read, or -1. */
static long
http_raw(int port, const char *req, char *out, size_t cap)
{
    struct sockaddr_in a;
    size_t got = 0;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        send(fd, req, strlen(req), MSG_NOSIGNAL) != (ssize_t)strlen(req)) {
        close(fd);
        return -1;
    }
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        ssize_t r;
        if (poll(&p, 1, 5000 * swh_slow()) <= 0)
            break;
        r = recv(fd, out + got, cap - 1 - got, 0);
        if (r <= 0)
            break;
        got += (size_t)r;
        if (got == cap - 1)
            break;
    }
    out[got] = '\0';
    close(fd);
    return (long)got;
}

/* The answer's head (up to and with the blank line) into head; returns the
 * body's length after it, or -1 without a head. */
static long
http_split(const char *resp, long n, char *head, size_t cap)
{
    const char *end = strstr(resp, "\r\n\r\n");
    size_t hl;
    if (end == NULL)
        return -1;
    hl = (size_t)(end + 4 - resp);
    assert_true(hl < cap);
    memcpy(head, resp, hl);
    head[hl] = '\0';
    return n - (long)hl;
}

/* `worker --metrics-listen`'s own HTTP server: GET /metrics is 200 with the
 * text format; HEAD /metrics the same head (Content-Length the GET body's
 * length) and no body; a HEAD elsewhere 404 with no body; a GET elsewhere
 * 404; another method 405. */
static void
test_worker_metrics_http(void **state)
{
    static char get[65536], head_resp[65536];
    char line[256], ghead[1024], hhead[1024];
    int fd = -1, st = 0, port, same = 0;
    long n;
    pid_t worker;
    const char *wargv[] = {
        "worker",      "--server", g_nats.url, "--endpoint", EP,     "--instance-id",
        "mh1",         "--tokens", "4",        "--registry", "none", "--metrics-listen",
        "127.0.0.1:0", "--quiet",  NULL};
    (void)state;
    worker = swh_spawn(wargv, &fd);
    assert_true(worker > 0);
    assert_int_equal(
        swh_wait_line(fd, "worker metrics url=", line, sizeof(line), 10000 * swh_slow()), 0);
    {
        const char *colon = strrchr(strstr(line, "//") + 2, ':');
        assert_non_null(colon);
        port = atoi(colon + 1);
        assert_true(port > 0);
    }
    assert_int_equal(swh_wait_line(fd, "worker ready", NULL, 0, 10000 * swh_slow()), 0);
    /* GET then HEAD, until nothing changed the text between them (a counter
     * that moved would change the length) */
    for (int i = 0; i < 5 && !same; i++) {
        long glen, hlen;
        char want[64];
        n = http_raw(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", get, sizeof(get));
        glen = http_split(get, n, ghead, sizeof(ghead));
        assert_true(glen > 0);
        assert_non_null(strstr(ghead, "HTTP/1.1 200 OK\r\n"));
        assert_non_null(strstr(get, "streamwire_worker_requests_total"));
        snprintf(want, sizeof(want), "\r\nContent-Length: %ld\r\n", glen);
        assert_non_null(strstr(ghead, want));
        n = http_raw(port, "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n", head_resp,
                     sizeof(head_resp));
        hlen = http_split(head_resp, n, hhead, sizeof(hhead));
        if (hlen != 0)
            fail_msg("HEAD /metrics: %ld bytes after the head, or no head: %s", hlen, head_resp);
        same = strcmp(ghead, hhead) == 0;
        if (!same && strncmp(hhead, "HTTP/1.1 200 OK\r\n", 17) != 0)
            fail_msg("HEAD /metrics answered\n%s\nwhere GET answered\n%s", hhead, ghead);
    }
    if (!same)
        fail_msg("HEAD /metrics never had GET's head:\n%s\nGET:\n%s", hhead, ghead);
    /* elsewhere: 404 (no body for HEAD), and 405 for another method */
    n = http_raw(port, "HEAD /nope HTTP/1.1\r\nHost: x\r\n\r\n", head_resp, sizeof(head_resp));
    assert_int_equal(http_split(head_resp, n, hhead, sizeof(hhead)), 0);
    assert_non_null(strstr(hhead, "HTTP/1.1 404 "));
    assert_non_null(strstr(hhead, "\r\nContent-Length: 24\r\n"));
    n = http_raw(port, "GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", get, sizeof(get));
    assert_int_equal(http_split(get, n, ghead, sizeof(ghead)), 24);
    assert_non_null(strstr(ghead, "HTTP/1.1 404 "));
    n = http_raw(port, "POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n", get, sizeof(get));
    assert_true(http_split(get, n, ghead, sizeof(ghead)) > 0);
    assert_non_null(strstr(ghead, "HTTP/1.1 405 "));
    swh_kill(worker, SIGTERM);
    assert_int_equal(swh_wait_exit(worker, 10000 * swh_slow(), &st), 0);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(fd);
}

static void
test_prometheus_scrapes_worker(void **state)
{
    char line[256], dir[256], conf[1024], url[256], body[8192], metrics_url[200];
    int fd = -1, st = 0, port, ok = 0;
    pid_t worker, prom;
    const char *wargv[] = {
        "worker",      "--server", g_nats.url, "--endpoint", EP,     "--instance-id",
        "pw1",         "--tokens", "4",        "--registry", "none", "--metrics-listen",
        "127.0.0.1:0", "--quiet",  NULL};
    const char *gargv[] = {"generate", "--server",      g_nats.url, "--endpoint",
                           EP,         "--instance-id", "pw1",      NULL};
    (void)state;
    worker = swh_spawn(wargv, &fd);
    assert_true(worker > 0);
    assert_int_equal(
        swh_wait_line(fd, "worker metrics url=", line, sizeof(line), 10000 * swh_slow()), 0);
    snprintf(metrics_url, sizeof(metrics_url), "%s", strchr(line, '=') + 1);
    assert_int_equal(swh_wait_line(fd, "worker ready", NULL, 0, 10000 * swh_slow()), 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(swh_run(gargv, NULL, 0, 20000 * swh_slow()), 0);
    /* the endpoint itself: 200 with the series, 404 elsewhere */
    assert_int_equal(http_get(metrics_url, body, sizeof(body)), 0);
    assert_non_null(strstr(body, "streamwire_worker_requests_total{instance_id=\"pw1\""));

    /* a real prometheus scraping it every second */
    assert_int_equal(swh_mkdtemp(dir, sizeof(dir), "sw-prom"), 0);
    port = swh_free_port();
    {
        const char *hostport = strstr(metrics_url, "//") + 2;
        const char *slash = strchr(hostport, '/');
        char cfg[300];
        snprintf(conf, sizeof(conf),
                 "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n"
                 "scrape_configs:\n  - job_name: streamwire-worker\n"
                 "    static_configs:\n      - targets: ['%.*s']\n",
                 (int)(slash - hostport), hostport);
        snprintf(cfg, sizeof(cfg), "%s/prometheus.yml", dir);
        assert_int_equal(swh_write_file(cfg, conf), 0);
        {
            char tsdb[300], hostport_l[64], cfgarg[320], tsdbarg[330], listenarg[96];
            snprintf(tsdb, sizeof(tsdb), "%s/data", dir);
            snprintf(hostport_l, sizeof(hostport_l), "127.0.0.1:%d", port);
            snprintf(cfgarg, sizeof(cfgarg), "--config.file=%s", cfg);
            snprintf(tsdbarg, sizeof(tsdbarg), "--storage.tsdb.path=%s", tsdb);
            snprintf(listenarg, sizeof(listenarg), "--web.listen-address=%s", hostport_l);
            {
                const char *pargv[] = {"prometheus", cfgarg, tsdbarg, listenarg, NULL};
                char logp[320];
                int logfd;
                snprintf(logp, sizeof(logp), "%s/prometheus.log", dir);
                logfd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
                prom = swh_spawn_path("/usr/bin/prometheus", pargv, NULL, logfd);
                if (logfd >= 0)
                    close(logfd);
            }
        }
    }
    assert_true(prom > 0);
    snprintf(url, sizeof(url),
             "http://127.0.0.1:%d/api/v1/query?query=streamwire_worker_requests_total", port);
    for (int64_t until = swh_now_ms() + 60000 * swh_slow(); swh_now_ms() < until;) {
        if (http_get(url, body, sizeof(body)) == 0 && strstr(body, "\"instance_id\":\"pw1\"") &&
            strstr(body, "\"3\"]")) {
            ok = 1;
            break;
        }
        swh_sleep_ms(500);
    }
    if (!ok)
        fail_msg("prometheus never returned streamwire_worker_requests_total = 3: %s", body);
    /* the target is up, and a histogram-free worker family is there too */
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/api/v1/query?query=up", port);
    assert_int_equal(http_get(url, body, sizeof(body)), 0);
    assert_non_null(strstr(body, "\"job\":\"streamwire-worker\""));
    assert_non_null(strstr(body, "\"1\"]"));
    snprintf(url, sizeof(url),
             "http://127.0.0.1:%d/api/v1/query?query=streamwire_worker_items_sent_total", port);
    assert_int_equal(http_get(url, body, sizeof(body)), 0);
    assert_non_null(strstr(body, "\"12\"]"));
    swh_terminate(prom, 5000);
    swh_kill(worker, SIGTERM);
    assert_int_equal(swh_wait_exit(worker, 10000 * swh_slow(), &st), 0);
    close(fd);
    swh_rmtree(dir);
}

int
main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_worker_metrics_http),
        cmocka_unit_test(test_prometheus_scrapes_worker),
    };
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
