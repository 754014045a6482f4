/* tests/integration/test_gateway.c -- `streamwire gateway` end to end
 * (issue 12): a nats-server, CLI workers with fault flags (one endpoint per
 * behaviour), the gateway on a free port, and curl as the client, over
 * HTTP/1.1 and HTTP/2 (h2c prior knowledge).
 *
 * Every streaming case checks the exact event sequence: the types in
 * order, sequence numbers 0, 1, 2, ... without a hole, the deltas'
 * concatenation equal to the worker's tokens, and exactly one terminal
 * with the right status and reason. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>
#include <streamwire/registry.h>
#include <streamwire/streamwire.h>

#include "harness.h"

static swh_nats g_nats;
static char g_gw[128];       /* host:port of the gateway */
static char g_wmetrics[200]; /* the "long" worker's /metrics */
static pid_t g_gw_pid, g_workers[10];
static int g_nworkers, g_gw_fd = -1;

typedef struct worker_def {
    const char *ep, *id;
    const char *extra[8];
} worker_def;

static const worker_def WORKERS[] = {
    {"gw.ok.gen", "wok", {"--tokens", "5", NULL}},
    {"gw.long.gen", "wlong", {"--tokens", "400", "--token-interval-ms", "10", NULL}},
    {"gw.fail.gen", "wfail", {"--tokens", "10", "--fail-after", "2", NULL}},
    {"gw.hang.gen", "whang", {"--tokens", "10", "--hang-after", "2", NULL}},
    {"gw.busy.gen",
     "wbusy",
     {"--tokens", "400", "--token-interval-ms", "10", "--max-inflight", "1", NULL}},
    {"gw.refuse.gen", "wrefuse", {"--refuse", NULL}},
    {"gw.metrics.gen", "wmetrics", {"--tokens", "6", "--metrics-every", "2", NULL}},
    {"gw.flood.gen", "wflood", {"--tokens", "20000", "--metrics-every", "1", NULL}},
};

static pid_t
start_worker(const worker_def *w, const char *metrics, int *fd)
{
    const char *argv[32];
    int n = 0;
    pid_t pid;
    argv[n++] = "worker";
    argv[n++] = "--server";
    argv[n++] = g_nats.url;
    argv[n++] = "--endpoint";
    argv[n++] = w->ep;
    argv[n++] = "--instance-id";
    argv[n++] = w->id;
    argv[n++] = "--lease-ms";
    argv[n++] = "1000";
    argv[n++] = "--quiet";
    if (metrics != NULL) {
        argv[n++] = "--metrics-listen";
        argv[n++] = metrics;
    }
    for (int i = 0; w->extra[i] != NULL; i++)
        argv[n++] = w->extra[i];
    argv[n] = NULL;
    pid = swh_spawn(argv, fd);
    return pid;
}

static int
group_setup(void **state)
{
    char line[256];
    int fd;
    struct rlimit rl;
    (void)state;
    /* 10,000 idle connections need as many descriptors here */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (swh_nats_start(&g_nats, NULL) != 0)
        return -1;
    for (size_t i = 0; i < sizeof(WORKERS) / sizeof(WORKERS[0]); i++) {
        int is_long = strcmp(WORKERS[i].id, "wlong") == 0;
        pid_t p = start_worker(&WORKERS[i], is_long ? "127.0.0.1:0" : NULL, &fd);
        if (p <= 0)
            return -1;
        g_workers[g_nworkers++] = p;
        if (is_long) {
            if (swh_wait_line(fd, "worker metrics url=", line, sizeof(line), 10000 * swh_slow()) !=
                0)
                return -1;
            snprintf(g_wmetrics, sizeof(g_wmetrics), "%s", strchr(line, '=') + 1);
        }
        if (swh_wait_line(fd, "worker ready", NULL, 0, 10000 * swh_slow()) != 0)
            return -1;
        close(fd);
    }
    {
        const char *argv[] = {"gateway",
                              "--server",
                              g_nats.url,
                              "--listen",
                              "127.0.0.1:0",
                              "--model",
                              "ok=gw.ok.gen",
                              "--model",
                              "long=gw.long.gen",
                              "--model",
                              "fail=gw.fail.gen",
                              "--model",
                              "hang=gw.hang.gen",
                              "--model",
                              "busy=gw.busy.gen",
                              "--model",
                              "kill=gw.kill.gen",
                              "--model",
                              "none=gw.none.gen",
                              "--model",
                              "refuse=gw.refuse.gen",
                              "--model",
                              "metrics=gw.metrics.gen",
                              "--model",
                              "flood=gw.flood.gen",
                              "--keepalive-ms",
                              "300",
                              "--max-body",
                              "65536",
                              "--max-connections",
                              "12000",
                              "--loops", /* every test crosses loops: connections, cancels, stop */
                              "4",
                              "--quiet",
                              NULL};
        g_gw_pid = swh_spawn(argv, &g_gw_fd);
        if (g_gw_pid <= 0 || swh_wait_line(g_gw_fd, "gateway ready listen=", line, sizeof(line),
                                           10000 * swh_slow()) != 0)
            return -1;
        snprintf(g_gw, sizeof(g_gw), "%s", strchr(line, '=') + 1);
    }
    /* the registry entries reach the gateway's router */
    swh_sleep_ms(1500);
    return 0;
}

static int
group_teardown(void **state)
{
    int st;
    (void)state;
    if (g_gw_pid > 0) {
        swh_kill(g_gw_pid, SIGTERM);
        (void)swh_wait_exit(g_gw_pid, 20000, &st);
    }
    for (int i = 0; i < g_nworkers; i++)
        swh_terminate(g_workers[i], 3000);
    swh_nats_stop(&g_nats);
    return 0;
}

/* ---------------------------------------------------------------- client */

/* Runs a shell command; what it prints into out (NUL-terminated, cut at
 * cap-1 bytes). Returns 0, or -1 if it could not be started (out ""). */
static int
shell_read(const char *cmd, char *out, size_t cap)
{
    FILE *p = popen(cmd, "r");
    size_t n = 0;
    if (p != NULL) {
        n = fread(out, 1, cap - 1, p);
        pclose(p);
    }
    out[n] = '\0';
    return p != NULL ? 0 : -1;
}

/* Runs curl; the body into out (NUL-terminated). Returns the HTTP status
 * (from -w), or -1. extra: more curl arguments, space separated, quoted
 * by the caller where needed. */
static int
curl_at(const char *hp, const char *extra, const char *path, const char *body, char *out,
        size_t cap)
{
    char cmd[2048], tail[16];
    char *mark;
    snprintf(cmd, sizeof(cmd),
             "curl -s -N -m 60 %s -w '\\n@@%%{http_code}' %s%s%s%s 'http://%s%s' 2>/dev/null",
             extra ? extra : "", body ? "-X POST -H 'content-type: application/json' " : "",
             body ? "--data-binary '" : "", body ? body : "", body ? "'" : "", hp, path);
    /* a body "@FILE" is read from the file by curl */
    if (shell_read(cmd, out, cap) != 0)
        return -1;
    if ((mark = strstr(out, "\n@@")) == NULL)
        return -1;
    snprintf(tail, sizeof(tail), "%s", mark + 3);
    *mark = '\0';
    return atoi(tail);
}

/* curl_at the shared gateway. */
static int
curl(const char *extra, const char *path, const char *body, char *out, size_t cap)
{
    return curl_at(g_gw, extra, path, body, out, cap);
}

typedef struct sse {
    int n;
    char type[512][48];
    json_t *data[512];
    int keepalives;
} sse;

/* Parses "event: T\ndata: J\n\n" frames (and ": keep-alive" comments). */
static void
sse_parse(const char *text, sse *s)
{
    const char *p = text;
    memset(s, 0, sizeof(*s));
    while (*p != '\0') {
        const char *end = strstr(p, "\n\n");
        char frame[65536];
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len >= sizeof(frame))
            fail_msg("frame too long");
        memcpy(frame, p, len);
        frame[len] = '\0';
        if (strncmp(frame, ": keep-alive", 12) == 0) {
            s->keepalives++;
        } else if (strncmp(frame, "event: ", 7) == 0) {
            char *nl = strchr(frame, '\n');
            json_error_t je;
            assert_non_null(nl);
            *nl = '\0';
            assert_true(s->n < 512);
            snprintf(s->type[s->n], sizeof(s->type[0]), "%.47s", frame + 7);
            assert_memory_equal(nl + 1, "data: ", 6);
            s->data[s->n] = json_loads(nl + 7, 0, &je);
            if (s->data[s->n] == NULL)
                fail_msg("bad event data: %s (%s)", nl + 7, je.text);
            /* every event names its type and counts up from 0 */
            assert_string_equal(json_string_value(json_object_get(s->data[s->n], "type")),
                                s->type[s->n]);
            assert_int_equal(json_integer_value(json_object_get(s->data[s->n], "sequence_number")),
                             s->n);
            s->n++;
        } else if (len > 0) {
            fail_msg("unexpected frame: %s", frame);
        }
        p = end ? end + 2 : p + len;
    }
}

static void
sse_free(sse *s)
{
    for (int i = 0; i < s->n; i++)
        json_decref(s->data[i]);
}

static const char *str_at(json_t *o, const char *a, const char *b);

/* Checks the full sequence of a response that produced `ndelta` deltas and
 * ended with `terminal`; returns the terminal's response object. */
static json_t *
expect_events(sse *s, int ndelta, const char *terminal, char *text, size_t cap)
{
    int i = 0;
    size_t tl = 0;
    assert_true(s->n >= 3);
    assert_string_equal(s->type[i++], "response.created");
    assert_string_equal(s->type[i++], "response.in_progress");
    /* narration (on by default): one at the start, at most a cancel and an end
     * before the terminal, never one per token */
    assert_string_equal(s->type[i], "narration");
    assert_string_equal(str_at(s->data[i++], "phase", NULL), "start");
    if (ndelta > 0) {
        assert_string_equal(s->type[i++], "response.output_item.added");
        assert_string_equal(s->type[i++], "response.content_part.added");
    }
    text[0] = '\0';
    for (int d = 0; d < ndelta; d++, i++) {
        const char *delta;
        assert_true(i < s->n);
        assert_string_equal(s->type[i], "response.output_text.delta");
        delta = json_string_value(json_object_get(s->data[i], "delta"));
        assert_non_null(delta);
        tl += (size_t)snprintf(text + tl, cap - tl, "%s", delta);
    }
    if (ndelta > 0) {
        assert_true(i + 3 < s->n);
        assert_string_equal(s->type[i], "response.output_text.done");
        assert_string_equal(json_string_value(json_object_get(s->data[i++], "text")), text);
        assert_string_equal(s->type[i++], "response.content_part.done");
        assert_string_equal(s->type[i++], "response.output_item.done");
    }
    if (strcmp(terminal, "response.incomplete") == 0 && i < s->n &&
        strcmp(s->type[i], "narration") == 0 &&
        strcmp(str_at(s->data[i], "phase", NULL), "cancel") == 0)
        i++;
    assert_true(i < s->n);
    assert_string_equal(s->type[i], "narration");
    assert_string_equal(str_at(s->data[i++], "phase", NULL), "end");
    assert_int_equal(i + 1, s->n); /* exactly one terminal, last */
    assert_string_equal(s->type[i], terminal);
    return json_object_get(s->data[i], "response");
}

static const char *
str_at(json_t *o, const char *a, const char *b)
{
    json_t *v = json_object_get(o, a);
    if (b != NULL)
        v = json_object_get(v, b);
    return json_string_value(v);
}

static char g_out[1 << 20];

/* ---------------------------------------------------------------- cases */

static void
stream_completed(const char *proto)
{
    sse s;
    char text[256];
    json_t *r;
    assert_int_equal(curl(proto, "/v1/responses",
                          "{\"model\":\"ok\",\"input\":\"hello world\","
                          "\"stream\":true,\"metadata\":{\"k\":\"v\"}}",
                          g_out, sizeof(g_out)),
                     200);
    sse_parse(g_out, &s);
    r = expect_events(&s, 5, "response.completed", text, sizeof(text));
    assert_string_equal(text, "token-0token-1token-2token-3token-4");
    assert_string_equal(str_at(r, "status", NULL), "completed");
    assert_string_equal(str_at(r, "metadata", "k"), "v");
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(r, "usage"), "output_tokens")), 5);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(r, "usage"), "input_tokens")), 2);
    assert_string_equal(
        json_string_value(json_object_get(
            json_array_get(
                json_object_get(json_array_get(json_object_get(r, "output"), 0), "content"), 0),
            "text")),
        text);
    sse_free(&s);
}

static void
test_completed_http1(void **state)
{
    char line[1024];
    json_t *j;
    const char *tid;
    (void)state;
    stream_completed("--http1.1");
    /* the access log: one JSON line for that request */
    assert_int_equal(swh_wait_line(g_gw_fd, "{", line, sizeof(line), 5000 * swh_slow()), 0);
    j = json_loads(line, 0, NULL);
    assert_non_null(j);
    tid = str_at(j, "trace_id", NULL);
    assert_non_null(tid);
    assert_int_equal(strlen(tid), 32);
    assert_string_equal(str_at(j, "model", NULL), "ok");
    assert_string_equal(str_at(j, "instance", NULL), "wok");
    assert_string_equal(str_at(j, "terminal", NULL), "completed");
    assert_int_equal(json_integer_value(json_object_get(j, "items")), 5);
    assert_true(json_integer_value(json_object_get(j, "ttfi_ms")) >= 0);
    assert_true(json_integer_value(json_object_get(j, "duration_ms")) >=
                json_integer_value(json_object_get(j, "ttfi_ms")));
    json_decref(j);
}

/* The gateway's access-log line for response id rid (earlier lines are
 * skipped), parsed; NULL after 5 s. */
static json_t *
log_line_of(const char *rid)
{
    char line[1024];
    while (swh_wait_line(g_gw_fd, "{", line, sizeof(line), 5000 * swh_slow()) == 0) {
        json_t *j = json_loads(line, 0, NULL);
        const char *r = j != NULL ? str_at(j, "response_id", NULL) : NULL;
        if (r != NULL && strcmp(r, rid) == 0)
            return j;
        json_decref(j);
    }
    return NULL;
}

/* One streamed request with these extra curl arguments (headers); the
 * response id (from the events) into rid, the x-request-id answered into
 * xrid; returns its access-log line. */
static json_t *
traced(const char *extra, char *rid, size_t rcap, char *xrid, size_t xcap)
{
    char args[512];
    const char *p, *e;
    snprintf(args, sizeof(args), "-i %s", extra);
    assert_int_equal(curl(args, "/v1/responses",
                          "{\"model\":\"ok\",\"input\":\"x\",\"stream\":true}", g_out,
                          sizeof(g_out)),
                     200);
    assert_non_null(p = strstr(g_out, "x-request-id: "));
    p += 14;
    assert_non_null(e = strstr(p, "\r\n"));
    snprintf(xrid, xcap, "%.*s", (int)(e - p), p);
    assert_non_null(p = strstr(g_out, "\"id\":\"resp_"));
    p += 6;
    assert_non_null(e = strchr(p, '"'));
    snprintf(rid, rcap, "%.*s", (int)(e - p), p);
    return log_line_of(rid);
}

static int
hex32(const char *s)
{
    if (strlen(s) != 32)
        return 0;
    for (; *s; s++)
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f')))
            return 0;
    return 1;
}

/* traceparent and X-Request-Id: a well-formed W3C traceparent is kept (its
 * trace id is logged) and a printable request id is echoed; anything else
 * is replaced by the gateway's own. Before, "zz" was kept (trace id ""),
 * bytes that are not UTF-8 lost the access-log line, and a request id
 * with a space or a 0xff byte was echoed back. */
static void
test_trace_headers(void **state)
{
    static const char *bad_tp[] = {
        "zz",
        "00-0af7651916cd43dd8448eb211c80319\xff-b7ad6b7169203331-01", /* not UTF-8 */
        "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",    /* upper case */
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",    /* zero trace id */
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",    /* zero parent id */
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",    /* version ff */
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x",  /* 00 with more */
        "00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    };
    char extra[256], rid[96], xrid[128];
    json_t *j;
    (void)state;
    j = traced("-H 'traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01' "
               "-H 'x-request-id: req-42_A.b'",
               rid, sizeof(rid), xrid, sizeof(xrid));
    assert_non_null(j);
    assert_string_equal(str_at(j, "trace_id", NULL), "0af7651916cd43dd8448eb211c80319c");
    assert_string_equal(xrid, "req-42_A.b");
    json_decref(j);
    /* a later version may carry more fields */
    j = traced("-H 'traceparent: 01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-xyz'", rid,
               sizeof(rid), xrid, sizeof(xrid));
    assert_non_null(j);
    assert_string_equal(str_at(j, "trace_id", NULL), "0af7651916cd43dd8448eb211c80319c");
    assert_string_equal(xrid, rid); /* none given: the response id */
    json_decref(j);
    /* ... however long (the gateway kept 63 bytes at most) */
    j = traced("-H 'traceparent: "
               "02-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-0123456789abcdef-more'",
               rid, sizeof(rid), xrid, sizeof(xrid));
    assert_non_null(j);
    assert_string_equal(str_at(j, "trace_id", NULL), "0af7651916cd43dd8448eb211c80319c");
    json_decref(j);
    for (size_t i = 0; i < sizeof(bad_tp) / sizeof(bad_tp[0]); i++) {
        snprintf(extra, sizeof(extra), "-H 'traceparent: %s'", bad_tp[i]);
        j = traced(extra, rid, sizeof(rid), xrid, sizeof(xrid));
        assert_non_null(j); /* the line is there */
        assert_true(hex32(str_at(j, "trace_id", NULL)));
        assert_string_not_equal(str_at(j, "trace_id", NULL), "0af7651916cd43dd8448eb211c80319c");
        json_decref(j);
    }
    /* request ids that are not echoed */
    {
        static const char *bad_rid[] = {"a b", "caf\xc3\xa9", "x\xff"};
        for (size_t i = 0; i < sizeof(bad_rid) / sizeof(bad_rid[0]); i++) {
            snprintf(extra, sizeof(extra), "-H 'x-request-id: %s'", bad_rid[i]);
            j = traced(extra, rid, sizeof(rid), xrid, sizeof(xrid));
            assert_non_null(j);
            assert_string_equal(xrid, rid);
            json_decref(j);
        }
    }
}

static pid_t own_gateway(const char *const *extra, char *hp, size_t cap, int *fd);
static void wait_readyz(const char *hp);
static void body_of_size(size_t n, char *arg, size_t cap);

/* The access log has one line for every request to /v1/responses, in the
 * order they were answered, with its HTTP status and, for an error, the
 * code its body carries (reason); other endpoints have none. Before, only
 * requests whose stream opened were logged: a 404 model_not_found, a 400,
 * a 405 and a 413 (and a 429 or 503 from the handler) left no line, and no
 * line said its HTTP status. */
static void
test_access_log_every_request(void **state)
{
    static const struct {
        int status;
        const char *terminal, *reason, *model;
    } want[] = {
        {404, "error", "model_not_found", "nope"},
        {400, "error", "invalid_json", ""},
        {200, "completed", NULL, "ok"},                   /* streamed */
        {200, "completed", NULL, "ok"},                   /* one JSON answer */
        {413, "error", "request_too_large", ""},          /* one byte over: the handler's */
        {413, "error", "request_too_large", ""},          /* far over: h2o's own answer */
        {405, "error", "method_not_allowed", ""},         /* GET */
        {400, "error", "missing_required_parameter", ""}, /* no model */
    };
    const char *extra[] = {"--model", "ok=gw.ok.gen", "--max-body", "1024", NULL};
    char hp[128], over[96], far[96], line[4096];
    int fd, st;
    pid_t pid;
    (void)state;
    body_of_size(1025, over, sizeof(over));
    body_of_size(5000, far, sizeof(far));
    pid = own_gateway(extra, hp, sizeof(hp), &fd);
    wait_readyz(hp); /* (not logged: /readyz is not /v1/responses) */
    assert_int_equal(
        curl_at(hp, "-H 'traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'",
                "/v1/responses", "{\"model\":\"nope\",\"input\":\"x\"}", g_out, sizeof(g_out)),
        404);
    assert_int_equal(curl_at(hp, NULL, "/healthz", NULL, g_out, sizeof(g_out)), 200);
    assert_int_equal(curl_at(hp, NULL, "/v1/responses", "{not json", g_out, sizeof(g_out)), 400);
    assert_int_equal(curl_at(hp, NULL, "/v1/responses",
                             "{\"model\":\"ok\",\"input\":\"x\",\"stream\":true}", g_out,
                             sizeof(g_out)),
                     200);
    assert_int_equal(curl_at(hp, NULL, "/v1/responses", "{\"model\":\"ok\",\"input\":\"x\"}", g_out,
                             sizeof(g_out)),
                     200);
    assert_int_equal(curl_at(hp, NULL, "/v1/responses", over, g_out, sizeof(g_out)), 413);
    assert_int_equal(curl_at(hp, NULL, "/v1/responses", far, g_out, sizeof(g_out)), 413);
    assert_int_equal(curl_at(hp, NULL, "/v1/responses", NULL, g_out, sizeof(g_out)), 405);
    assert_int_equal(curl_at(hp, NULL, "/v1/models", NULL, g_out, sizeof(g_out)), 200);
    assert_int_equal(curl_at(hp, NULL, "/v1/responses", "{\"input\":\"x\"}", g_out, sizeof(g_out)),
                     400);
    unlink(strchr(over, '@') + 1);
    unlink(strchr(far, '@') + 1);
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        json_t *j;
        const char *reason;
        if (swh_wait_line(fd, "{", line, sizeof(line), 5000 * swh_slow()) != 0)
            fail_msg("no access-log line for request %zu (HTTP %d)", i, want[i].status);
        assert_non_null(j = json_loads(line, 0, NULL));
        print_message("    %s\n", line);
        assert_int_equal(json_integer_value(json_object_get(j, "status")), want[i].status);
        assert_string_equal(str_at(j, "terminal", NULL), want[i].terminal);
        assert_string_equal(str_at(j, "model", NULL), want[i].model);
        if (want[i].status == 200) {
            assert_true(hex32(str_at(j, "trace_id", NULL)));
            assert_memory_equal(str_at(j, "response_id", NULL), "resp_", 5);
        } else { /* refused: its traceparent's trace id, if it had one */
            assert_string_equal(str_at(j, "trace_id", NULL),
                                i == 0 ? "0af7651916cd43dd8448eb211c80319c" : "");
            assert_string_equal(str_at(j, "response_id", NULL), "");
        }
        reason = str_at(j, "reason", NULL);
        if (want[i].reason == NULL)
            assert_null(reason);
        else
            assert_string_equal(reason, want[i].reason);
        json_decref(j);
    }
    /* and no more: the rest of its stdout, to its end, has no line */
    swh_kill(pid, SIGTERM);
    assert_int_equal(swh_wait_exit(pid, 20000 * swh_slow(), &st), 0);
    assert_int_equal(st, 0);
    assert_int_not_equal(swh_wait_line(fd, "{", line, sizeof(line), 5000 * swh_slow()), 0);
    close(fd);
}

/* An in-process worker that sends one token and ends incomplete with a
 * reason that is not UTF-8 (the library passes a worker's reason on as
 * bytes). */
static void
bad_reason_handler(sw_responder *r, void *arg)
{
    (void)arg;
    (void)sw_responder_send(r, "ok", 2);
    (void)sw_responder_finish(r, SW_STATUS_INCOMPLETE, "length\xff\xfe");
}

/* A worker's reason that is not valid UTF-8 ("length\xff\xfe"): every
 * request still has its one access-log line, the reason's bad bytes as
 * U+FFFD, as the client's events and object have it. Before, jansson
 * refused to pack the line and it was lost without a word. */
static void
test_log_reason_not_utf8(void **state)
{
    static const char fixed[] = "length\xef\xbf\xbd\xef\xbf\xbd";
    const char *extra[] = {"--model", "badreason=gw.badreason.gen", NULL};
    sw_conn_opts co;
    sw_ingress_opts io;
    sw_registry_opts ro;
    sw_registration reg_entry;
    sw_conn *c = NULL;
    sw_ingress *ing = NULL;
    sw_registry *reg = NULL;
    char hp[128], line[4096];
    int fd, st;
    pid_t pid;
    json_t *j;
    (void)state;
    sw_conn_opts_init(&co);
    co.url = g_nats.url;
    assert_int_equal(sw_conn_open(&c, &co), SW_OK);
    sw_ingress_opts_init(&io);
    io.endpoint = "gw.badreason.gen";
    io.instance_id = "wbadreason";
    io.handler = bad_reason_handler;
    assert_int_equal(sw_ingress_start(&ing, c, &io), SW_OK);
    sw_registry_opts_init(&ro);
    assert_int_equal(sw_registry_open(&reg, c, &ro), SW_OK);
    assert_int_equal(sw_ingress_registration(ing, &reg_entry), SW_OK);
    assert_int_equal(sw_registry_register(reg, &reg_entry), SW_OK);
    pid = own_gateway(extra, hp, sizeof(hp), &fd);
    wait_readyz(hp);
    /* streamed: the terminal event has the reason, fixed */
    assert_int_equal(curl_at(hp, NULL, "/v1/responses",
                             "{\"model\":\"badreason\",\"input\":\"x\",\"stream\":true}", g_out,
                             sizeof(g_out)),
                     200);
    assert_non_null(strstr(g_out, "event: response.incomplete\n"));
    assert_non_null(strstr(g_out, fixed));
    /* not streamed: the response object */
    assert_int_equal(curl_at(hp, NULL, "/v1/responses", "{\"model\":\"badreason\",\"input\":\"x\"}",
                             g_out, sizeof(g_out)),
                     200);
    assert_non_null(j = json_loads(g_out, 0, NULL));
    assert_string_equal(str_at(j, "incomplete_details", "reason"), fixed);
    json_decref(j);
    /* one line each */
    for (int k = 0; k < 2; k++) {
        if (swh_wait_line(fd, "{", line, sizeof(line), 5000 * swh_slow()) != 0)
            fail_msg("no access-log line for request %d", k);
        print_message("    %s\n", line);
        assert_non_null(j = json_loads(line, 0, NULL));
        assert_string_equal(str_at(j, "model", NULL), "badreason");
        assert_string_equal(str_at(j, "terminal", NULL), "incomplete");
        assert_string_equal(str_at(j, "reason", NULL), fixed);
        assert_int_equal(json_integer_value(json_object_get(j, "items")), 1);
        json_decref(j);
    }
    swh_kill(pid, SIGTERM);
    assert_int_equal(swh_wait_exit(pid, 20000 * swh_slow(), &st), 0);
    assert_int_equal(st, 0);
    assert_int_not_equal(swh_wait_line(fd, "{", line, sizeof(line), 2000 * swh_slow()), 0);
    close(fd);
    assert_int_equal(sw_registry_deregister(reg, "wbadreason"), SW_OK);
    sw_registry_close(reg);
    sw_ingress_destroy(ing);
    sw_conn_close(c);
}

static void
test_completed_http2(void **state)
{
    (void)state;
    stream_completed("--http2-prior-knowledge");
}

static void
test_incomplete_max_tokens(void **state)
{
    sse s;
    char text[256];
    json_t *r;
    (void)state;
    assert_int_equal(
        curl(NULL, "/v1/responses",
             "{\"model\":\"ok\",\"input\":\"x\",\"stream\":true,\"max_output_tokens\":2}", g_out,
             sizeof(g_out)),
        200);
    sse_parse(g_out, &s);
    r = expect_events(&s, 2, "response.incomplete", text, sizeof(text));
    assert_string_equal(text, "token-0token-1");
    assert_string_equal(str_at(r, "status", NULL), "incomplete");
    assert_string_equal(str_at(r, "incomplete_details", "reason"), "max_output_tokens");
    sse_free(&s);
}

static void
test_failed(void **state)
{
    sse s;
    char text[256];
    json_t *r;
    (void)state;
    assert_int_equal(curl(NULL, "/v1/responses",
                          "{\"model\":\"fail\",\"input\":\"x\",\"stream\":true}", g_out,
                          sizeof(g_out)),
                     200);
    sse_parse(g_out, &s);
    r = expect_events(&s, 2, "response.failed", text, sizeof(text));
    assert_string_equal(str_at(r, "status", NULL), "failed");
    assert_string_equal(str_at(r, "error", "code"), "engine_error");
    sse_free(&s);
}

static void
test_stream_incomplete_hang(void **state)
{
    sse s;
    char text[256];
    json_t *r;
    (void)state;
    assert_int_equal(curl(NULL, "/v1/responses",
                          "{\"model\":\"hang\",\"input\":\"x\",\"stream\":true}", g_out,
                          sizeof(g_out)),
                     200);
    sse_parse(g_out, &s);
    r = expect_events(&s, 2, "response.failed", text, sizeof(text));
    assert_string_equal(str_at(r, "error", "code"), "stream_incomplete");
    /* the silence was filled with keep-alive comments (--keepalive-ms 300) */
    assert_true(s.keepalives >= 1);
    sse_free(&s);
}

/* Non-stream answers and their HTTP status codes. */
static void
test_non_stream(void **state)
{
    json_t *j;
    (void)state;
    assert_int_equal(
        curl(NULL, "/v1/responses", "{\"model\":\"ok\",\"input\":\"x\"}", g_out, sizeof(g_out)),
        200);
    j = json_loads(g_out, 0, NULL);
    assert_non_null(j);
    assert_string_equal(str_at(j, "status", NULL), "completed");
    json_decref(j);
    assert_int_equal(curl(NULL, "/v1/responses",
                          "{\"model\":\"ok\",\"input\":\"x\",\"max_output_tokens\":3}", g_out,
                          sizeof(g_out)),
                     200);
    j = json_loads(g_out, 0, NULL);
    assert_string_equal(str_at(j, "status", NULL), "incomplete");
    assert_string_equal(str_at(j, "incomplete_details", "reason"), "max_output_tokens");
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(j, "usage"), "output_tokens")), 3);
    json_decref(j);
    assert_int_equal(
        curl(NULL, "/v1/responses", "{\"model\":\"fail\",\"input\":\"x\"}", g_out, sizeof(g_out)),
        200);
    j = json_loads(g_out, 0, NULL);
    assert_string_equal(str_at(j, "status", NULL), "failed");
    json_decref(j);
    assert_int_equal(
        curl(NULL, "/v1/responses", "{\"model\":\"none\",\"input\":\"x\"}", g_out, sizeof(g_out)),
        503);
    j = json_loads(g_out, 0, NULL);
    assert_string_equal(str_at(j, "error", "code"), "no_instances");
    json_decref(j);
}

/* Errors before any response exists: an `error` event (stream) or an HTTP
 * error with an OpenAI-style body. */
/* Typed items: a refusal streams as response.refusal.* in a refusal
 * content part, never as output_text; the same without stream. */
static void
test_refusal(void **state)
{
    static const char *const words[] = {"I'm ",   "sorry, ", "but ",  "I ",
                                        "can't ", "help ",   "with ", "that."};
    static const char full[] = "I'm sorry, but I can't help with that.";
    sse s;
    int i = 0;
    json_t *r, *part, *j;
    (void)state;
    assert_int_equal(curl(NULL, "/v1/responses",
                          "{\"model\":\"refuse\",\"input\":\"how do I pick a lock\","
                          "\"stream\":true}",
                          g_out, sizeof(g_out)),
                     200);
    sse_parse(g_out, &s);
    assert_int_equal(s.n, 3 + 2 + 8 + 3 + 1 + 1);
    assert_string_equal(s.type[i++], "response.created");
    assert_string_equal(s.type[i++], "response.in_progress");
    assert_string_equal(s.type[i++], "narration");
    assert_string_equal(s.type[i++], "response.output_item.added");
    assert_string_equal(s.type[i], "response.content_part.added");
    assert_string_equal(str_at(json_object_get(s.data[i++], "part"), "type", NULL), "refusal");
    for (int k = 0; k < 8; k++, i++) {
        assert_string_equal(s.type[i], "response.refusal.delta");
        assert_string_equal(str_at(s.data[i], "delta", NULL), words[k]);
        assert_int_equal(json_integer_value(json_object_get(s.data[i], "content_index")), 0);
    }
    assert_string_equal(s.type[i], "response.refusal.done");
    assert_string_equal(str_at(s.data[i++], "refusal", NULL), full);
    assert_string_equal(s.type[i], "response.content_part.done");
    assert_string_equal(str_at(json_object_get(s.data[i++], "part"), "refusal", NULL), full);
    assert_string_equal(s.type[i++], "response.output_item.done");
    assert_string_equal(s.type[i++], "narration");
    assert_string_equal(s.type[i], "response.completed");
    r = json_object_get(s.data[i], "response");
    part = json_array_get(
        json_object_get(json_array_get(json_object_get(r, "output"), 0), "content"), 0);
    assert_string_equal(str_at(part, "type", NULL), "refusal");
    assert_string_equal(str_at(part, "refusal", NULL), full);
    assert_int_equal(json_array_size(json_object_get(
                         json_array_get(json_object_get(r, "output"), 0), "content")),
                     1);
    for (int k = 0; k < s.n; k++)
        assert_null(strstr(s.type[k], "output_text"));
    sse_free(&s);

    assert_int_equal(
        curl(NULL, "/v1/responses", "{\"model\":\"refuse\",\"input\":\"x\"}", g_out, sizeof(g_out)),
        200);
    j = json_loads(g_out, 0, NULL);
    assert_non_null(j);
    assert_string_equal(str_at(j, "status", NULL), "completed");
    part = json_array_get(
        json_object_get(json_array_get(json_object_get(j, "output"), 0), "content"), 0);
    assert_string_equal(str_at(part, "type", NULL), "refusal");
    assert_string_equal(str_at(part, "refusal", NULL), full);
    json_decref(j);
}

/* Typed items: metrics items become `metrics` events in their place
 * among the deltas; they are not output text and not output tokens. */
static void
test_metrics_events(void **state)
{
    sse s;
    int deltas = 0, metrics = 0, narr = 0;
    json_t *r;
    (void)state;
    assert_int_equal(curl(NULL, "/v1/responses",
                          "{\"model\":\"metrics\",\"input\":\"x\",\"stream\":true}", g_out,
                          sizeof(g_out)),
                     200);
    sse_parse(g_out, &s);
    for (int i = 0; i < s.n; i++) {
        if (strcmp(s.type[i], "response.output_text.delta") == 0) {
            char want[32];
            snprintf(want, sizeof(want), "token-%d", deltas++);
            assert_string_equal(str_at(s.data[i], "delta", NULL), want);
        } else if (strcmp(s.type[i], "metrics") == 0) {
            /* after every second token: {"tokens": 2, 4, 6} */
            metrics++;
            assert_int_equal(deltas, 2 * metrics);
            assert_int_equal(
                json_integer_value(json_object_get(json_object_get(s.data[i], "data"), "tokens")),
                2 * metrics);
        } else if (strcmp(s.type[i], "narration") == 0) {
            narr++;
        }
    }
    assert_int_equal(deltas, 6);
    assert_int_equal(metrics, 3);
    assert_int_equal(narr, 2); /* start and end: never one per token */
    assert_string_equal(s.type[s.n - 1], "response.completed");
    r = json_object_get(s.data[s.n - 1], "response");
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(r, "usage"), "output_tokens")), 6);
    assert_string_equal(
        str_at(json_array_get(
                   json_object_get(json_array_get(json_object_get(r, "output"), 0), "content"), 0),
               "text", NULL),
        "token-0token-1token-2token-3token-4token-5");
    sse_free(&s);
}

static long
gw_metric(const char *name)
{
    char buf[256];
    const char *p;
    char *page = malloc(1 << 20);
    long v = -1;
    assert_non_null(page);
    assert_int_equal(curl(NULL, "/metrics", NULL, page, 1 << 20), 200);
    snprintf(buf, sizeof(buf), "\n%s ", name);
    if ((p = strstr(page, buf)) != NULL)
        v = atol(p + strlen(buf));
    free(page);
    return v;
}

/* A slow client: metrics are shed first, tokens never. 20,000 tokens, each
 * followed by a metrics item, read at 1 MB/s (several times what the
 * socket buffers hold), so the gateway falls behind. */
static void
test_slow_client_sheds_metrics(void **state)
{
    char cmd[512], line[512], path[] = "/tmp/sw-gw-slow-XXXXXX";
    FILE *f;
    int fd, next = 0, metrics = 0, in_order = 1, completed = 0;
    long shed0, shed1;
    const char *ev = "";
    (void)state;
    shed0 = gw_metric("streamwire_gateway_sse_dropped_total{event=\"metrics\"}");
    assert_true(shed0 >= 0);
    fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    snprintf(cmd, sizeof(cmd),
             "curl -s -N -m 120 --limit-rate 1M -X POST -H 'content-type: application/json' "
             "--data-binary '{\"model\":\"flood\",\"input\":\"x\",\"stream\":true}' "
             "'http://%s/v1/responses' -o %s",
             g_gw, path);
    assert_int_equal(system(cmd), 0);
    f = fopen(path, "r");
    assert_non_null(f);
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, "event: ", 7) == 0) {
            ev = strcmp(line, "event: response.output_text.delta\n") == 0 ? "delta"
                 : strcmp(line, "event: metrics\n") == 0                  ? "metrics"
                 : strcmp(line, "event: response.completed\n") == 0       ? "completed"
                                                                          : "";
        } else if (strncmp(line, "data: ", 6) == 0) {
            if (strcmp(ev, "delta") == 0) {
                char want[48];
                snprintf(want, sizeof(want), "\"delta\":\"token-%d\"", next++);
                if (strstr(line, want) == NULL)
                    in_order = 0;
            } else if (strcmp(ev, "metrics") == 0) {
                metrics++;
            } else if (strcmp(ev, "completed") == 0) {
                completed++;
            }
        }
    }
    fclose(f);
    unlink(path);
    shed1 = gw_metric("streamwire_gateway_sse_dropped_total{event=\"metrics\"}");
    print_message("    slow client: %d tokens, %d of 20000 metrics events, %ld shed\n", next,
                  metrics, shed1 - shed0);
    assert_int_equal(next, 20000); /* every token, in order, once */
    assert_true(in_order);
    assert_int_equal(completed, 1);
    assert_true(shed1 - shed0 > 0);
    /* what was not sent was counted (the worker may shed some itself) */
    assert_true(metrics + (shed1 - shed0) <= 20000);
    assert_true(metrics < 20000);
}

static void
test_pre_response_errors(void **state)
{
    sse s;
    json_t *j;
    static char big[70000];
    (void)state;
    assert_int_equal(curl(NULL, "/v1/responses",
                          "{\"model\":\"none\",\"input\":\"x\",\"stream\":true}", g_out,
                          sizeof(g_out)),
                     200);
    sse_parse(g_out, &s);
    assert_int_equal(s.n, 1);
    assert_string_equal(s.type[0], "error");
    assert_string_equal(str_at(s.data[0], "code", NULL), "no_instances");
    sse_free(&s);
    assert_int_equal(
        curl(NULL, "/v1/responses", "{\"model\":\"nope\",\"input\":\"x\"}", g_out, sizeof(g_out)),
        404);
    j = json_loads(g_out, 0, NULL);
    assert_string_equal(str_at(j, "error", "code"), "model_not_found");
    assert_string_equal(str_at(j, "error", "param"), "model");
    assert_string_equal(str_at(j, "error", "type"), "not_found_error");
    json_decref(j);
    /* a model name whose message is cut inside a character (at 100 bytes):
     * still a whole JSON error (jansson refused it and the body was cut) */
    {
        char body[256];
        snprintf(body, sizeof(body), "{\"model\":\"%099d\xc3\xa9\",\"input\":\"x\"}", 0);
        assert_int_equal(curl(NULL, "/v1/responses", body, g_out, sizeof(g_out)), 404);
        j = json_loads(g_out, 0, NULL);
        assert_non_null(j);
        assert_string_equal(str_at(j, "error", "code"), "model_not_found");
        assert_non_null(strstr(str_at(j, "error", "message"), "\xef\xbf\xbd"));
        json_decref(j);
    }
    assert_int_equal(curl(NULL, "/v1/responses", "{not json", g_out, sizeof(g_out)), 400);
    j = json_loads(g_out, 0, NULL);
    assert_string_equal(str_at(j, "error", "code"), "invalid_json");
    json_decref(j);
    assert_int_equal(curl(NULL, "/v1/responses", "{\"input\":\"x\"}", g_out, sizeof(g_out)), 400);
    assert_int_equal(curl(NULL, "/v1/responses",
                          "{\"model\":\"ok\",\"input\":\"x\",\"stream\":\"yes\"}", g_out,
                          sizeof(g_out)),
                     400);
    assert_int_equal(curl(NULL, "/v1/responses",
                          "{\"model\":\"ok\",\"input\":\"x\",\"max_output_tokens\":0}", g_out,
                          sizeof(g_out)),
                     400);
    /* not UTF-8 */
    assert_int_equal(curl(NULL, "/v1/responses", "{\"model\":\"ok\",\"input\":\"\xff\xfe\"}", g_out,
                          sizeof(g_out)),
                     400);
    /* a body over --max-body */
    memset(big, 'a', sizeof(big) - 1);
    memcpy(big, "{\"model\":\"ok\",\"input\":\"", 23);
    {
        char path[64], arg[80];
        snprintf(path, sizeof(path), "/tmp/sw-gw-big-%d", (int)getpid());
        assert_int_equal(swh_write_file(path, big), 0);
        snprintf(arg, sizeof(arg), "@%s", path);
        assert_int_equal(curl(NULL, "/v1/responses", arg, g_out, sizeof(g_out)), 413);
        unlink(path);
    }
    /* wrong method, unknown path */
    assert_int_equal(curl(NULL, "/v1/responses", NULL, g_out, sizeof(g_out)), 405);
    assert_int_equal(curl(NULL, "/nope", NULL, g_out, sizeof(g_out)), 404);
}

/* A request body of exactly n bytes, valid JSON for the "ok" model, in a
 * file; its "@path" for curl into arg. */
static void
body_of_size(size_t n, char *arg, size_t cap)
{
    static char b[70000];
    char path[64];
    assert_true(n < sizeof(b) && n > 40);
    memset(b, 'a', n);
    memcpy(b, "{\"model\":\"ok\",\"input\":\"", 23);
    memcpy(b + n - 2, "\"}", 2);
    b[n] = '\0';
    snprintf(path, sizeof(path), "/tmp/sw-gw-body-%d-%zu", (int)getpid(), n);
    assert_int_equal(swh_write_file(path, b), 0);
    snprintf(arg, cap, "@%s", path);
}

static void
expect_too_large(const char *extra, const char *arg)
{
    json_t *j;
    assert_int_equal(curl(extra, "/v1/responses", arg, g_out, sizeof(g_out)), 413);
    j = json_loads(g_out, 0, NULL);
    assert_non_null(j);
    assert_string_equal(str_at(j, "error", "code"), "request_too_large");
    assert_string_equal(str_at(j, "error", "type"), "invalid_request_error");
    assert_non_null(strstr(str_at(j, "error", "message"), "65536"));
    json_decref(j);
}

/* Sends a raw HTTP/1.1 request (printf-escaped) to the gateway; the answer
 * into g_out. */
static void
raw_exchange(const char *req)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "printf '%s' | curl -s -m 10 telnet://%s 2>/dev/null", req, g_gw);
    assert_int_equal(shell_read(cmd, g_out, sizeof(g_out)), 0);
}

/* --max-body 65536: a body of exactly that many bytes is served however it
 * is sent (a chunked one was refused); one byte more, or far more, gets a
 * 413 with an OpenAI error object (h2o's plain-text page before), over
 * HTTP/1.1 with Content-Length or chunked and over h2c. A broken chunked
 * body gets a JSON 400; HEAD gets the headers only. */
static void
test_body_limit(void **state)
{
    char at[96], over[96], far[96], cmd[512], *body;
    json_t *j;
    (void)state;
    body_of_size(65536, at, sizeof(at));
    body_of_size(65537, over, sizeof(over));
    body_of_size(69999, far, sizeof(far));
    assert_int_equal(curl(NULL, "/v1/responses", at, g_out, sizeof(g_out)), 200);
    assert_int_equal(
        curl("-H 'transfer-encoding: chunked'", "/v1/responses", at, g_out, sizeof(g_out)), 200);
    j = json_loads(g_out, 0, NULL);
    assert_non_null(j);
    assert_string_equal(str_at(j, "status", NULL), "completed");
    json_decref(j);
    assert_int_equal(curl("--http2-prior-knowledge", "/v1/responses", at, g_out, sizeof(g_out)),
                     200);
    expect_too_large(NULL, over);
    expect_too_large("-H 'transfer-encoding: chunked'", over);
    expect_too_large("--http2-prior-knowledge", over);
    expect_too_large(NULL, far);
    expect_too_large("-H 'transfer-encoding: chunked'", far);
    for (const char *a = at; a != NULL; a = a == at ? over : a == over ? far : NULL)
        unlink(strchr(a, '@') + 1);
    /* broken chunked encoding */
    raw_exchange("POST /v1/responses HTTP/1.1\\r\\nHost: x\\r\\nTransfer-Encoding: "
                 "chunked\\r\\n\\r\\nzz\\r\\n");
    assert_non_null(strstr(g_out, "HTTP/1.1 400"));
    assert_non_null(strstr(g_out, "application/json"));
    assert_non_null(body = strstr(g_out, "\r\n\r\n"));
    j = json_loads(body + 4, 0, NULL);
    assert_non_null(j);
    assert_string_equal(str_at(j, "error", "code"), "bad_request");
    json_decref(j);
    /* HEAD refused for its body: the headers, no body after them */
    raw_exchange("HEAD /v1/responses HTTP/1.1\\r\\nHost: x\\r\\nContent-Length: "
                 "70000\\r\\n\\r\\n");
    assert_non_null(strstr(g_out, "HTTP/1.1 413"));
    assert_non_null(strstr(g_out, "application/json"));
    assert_non_null(body = strstr(g_out, "\r\n\r\n"));
    assert_string_equal(body + 4, "");
    /* h2c HEAD with a header h2o refuses: a clean 400, headers only (the
     * JSON body after HEAD's headers was a PROTOCOL_ERROR) */
    snprintf(cmd, sizeof(cmd),
             "curl -s -m 10 --http2-prior-knowledge -I -H 'x\"y: 1' 'http://%s/v1/models' "
             ">/dev/null 2>&1; echo rc=$?",
             g_gw);
    assert_int_equal(shell_read(cmd, g_out, sizeof(g_out)), 0);
    assert_non_null(strstr(g_out, "rc=0"));
}

/* The cancel endpoint: the stream ends response.incomplete, status
 * cancelled, reason cancelled, after the deltas so far. */
static void
test_cancel_endpoint(void **state)
{
    char cmd[512], id[128] = "", out2[4096], text[8192];
    FILE *p;
    sse s;
    json_t *r;
    int ndelta = 0;
    (void)state;
    snprintf(cmd, sizeof(cmd),
             "curl -s -N -m 60 -X POST --data-binary "
             "'{\"model\":\"long\",\"input\":\"x\",\"stream\":true}' 'http://%s/v1/responses'",
             g_gw);
    p = popen(cmd, "r");
    assert_non_null(p);
    {
        size_t n = 0;
        char line[8192];
        g_out[0] = '\0';
        while (fgets(line, sizeof(line), p) != NULL) {
            size_t l = strlen(line);
            memcpy(g_out + n, line, l + 1);
            n += l;
            if (id[0] == '\0' && strncmp(line, "data: ", 6) == 0) {
                char *at = strstr(line, "\"id\":\"resp_");
                if (at != NULL) {
                    snprintf(id, sizeof(id), "%.37s", at + 6);
                    /* cancel after the first few tokens */
                }
            }
            if (id[0] != '\0' && strstr(g_out, "output_text.delta") != NULL &&
                strstr(g_out, "\"delta\":\"token-3\"") != NULL && out2[0] != 'x') {
                char path[200];
                snprintf(path, sizeof(path), "/v1/responses/%s/cancel", id);
                assert_int_equal(curl(NULL, path, "{}", out2, sizeof(out2)), 200);
                assert_non_null(strstr(out2, "\"status\":\"cancelled\""));
                out2[0] = 'x';
            }
        }
    }
    pclose(p);
    assert_int_equal(out2[0], 'x');
    sse_parse(g_out, &s);
    for (int i = 0; i < s.n; i++)
        ndelta += strcmp(s.type[i], "response.output_text.delta") == 0;
    assert_true(ndelta >= 4 && ndelta < 400);
    r = expect_events(&s, ndelta, "response.incomplete", text, sizeof(text));
    assert_string_equal(str_at(r, "status", NULL), "cancelled");
    assert_string_equal(str_at(r, "incomplete_details", "reason"), "cancelled");
    /* narration: start, cancel, end, in that order, and nothing else */
    {
        const char *phases[3];
        int nn = 0;
        for (int i = 0; i < s.n; i++)
            if (strcmp(s.type[i], "narration") == 0) {
                assert_true(nn < 3);
                phases[nn++] = str_at(s.data[i], "phase", NULL);
            }
        assert_int_equal(nn, 3);
        assert_string_equal(phases[0], "start");
        assert_string_equal(phases[1], "cancel");
        assert_string_equal(phases[2], "end");
    }
    sse_free(&s);
    /* an unknown or finished id */
    snprintf(cmd, sizeof(cmd), "/v1/responses/%s/cancel", id);
    assert_int_equal(curl(NULL, cmd, "{}", out2, sizeof(out2)), 404);
}

/* Four streams at once (the long worker's four handler threads), each
 * cancelled through a connection of its own: with four loops, a cancel
 * mostly arrives on a loop other than its stream's (the cancel endpoint
 * searches every loop's requests). Each ends response.incomplete /
 * cancelled. */
static void
test_cancel_across_loops(void **state)
{
    enum { N = 4 };
    FILE *p[N];
    char id[N][64], line[8192], cmd[512], out[4096], path[200];
    int cancelled = 0;
    (void)state;
    for (int i = 0; i < N; i++) {
        snprintf(cmd, sizeof(cmd),
                 "curl -s -N -m 60 -X POST --data-binary "
                 "'{\"model\":\"long\",\"input\":\"x\",\"stream\":true}' 'http://%s/v1/responses'",
                 g_gw);
        p[i] = popen(cmd, "r");
        assert_non_null(p[i]);
    }
    for (int i = 0; i < N; i++) { /* each stream's id, from its first events */
        id[i][0] = '\0';
        while (id[i][0] == '\0' && fgets(line, sizeof(line), p[i]) != NULL) {
            char *at = strstr(line, "\"id\":\"resp_");
            if (strncmp(line, "data: ", 6) == 0 && at != NULL)
                snprintf(id[i], sizeof(id[i]), "%.37s", at + 6);
        }
        assert_true(id[i][0] != '\0');
    }
    for (int i = 0; i < N; i++) {
        snprintf(path, sizeof(path), "/v1/responses/%.64s/cancel", id[i]);
        assert_int_equal(curl(NULL, path, "{}", out, sizeof(out)), 200);
        assert_non_null(strstr(out, "\"status\":\"cancelled\""));
    }
    for (int i = 0; i < N; i++) {
        int ended = 0;
        while (fgets(line, sizeof(line), p[i]) != NULL) {
            if (strncmp(line, "event: response.", 16) == 0 &&
                (strstr(line, "completed") != NULL || strstr(line, "failed") != NULL))
                fail_msg("stream %d ended other than cancelled: %s", i, line);
            if (strncmp(line, "data: ", 6) == 0 &&
                strstr(line, "\"type\":\"response.incomplete\"") != NULL) {
                assert_non_null(strstr(line, "\"status\":\"cancelled\""));
                assert_non_null(strstr(line, "\"reason\":\"cancelled\""));
                assert_non_null(strstr(line, id[i]));
                ended = 1;
            }
        }
        pclose(p[i]);
        cancelled += ended;
    }
    assert_int_equal(cancelled, N);
}

/* Worker's cancels_total from its /metrics. */
/* The value of the first series of family `name` on the Prometheus page at
 * url (any labels), or -1. */
static double
metric_at(const char *url, const char *name)
{
    char cmd[300], *page = malloc(1 << 20), want[160];
    const char *p;
    double v = -1;
    assert_non_null(page);
    snprintf(cmd, sizeof(cmd), "curl -s -m 5 '%s'", url);
    (void)shell_read(cmd, page, 1 << 20);
    snprintf(want, sizeof(want), "\n%s", name);
    for (p = page; (p = strstr(p, want)) != NULL; p++) {
        p += strlen(want);
        if (*p == '{' && (p = strchr(p, '}')) != NULL)
            p++;
        if (p != NULL && *p == ' ') {
            v = strtod(p + 1, NULL);
            break;
        }
        if (p == NULL)
            break;
    }
    free(page);
    return v;
}

static double
worker_cancels(void)
{
    return metric_at(g_wmetrics, "streamwire_worker_cancels_total");
}

/* A client that leaves mid-stream cancels it: the worker sees the cancel
 * (its cancels_total goes up) within a second. Over HTTP/1.1 and HTTP/2. */
static void
disconnect(const char *proto)
{
    char cmd[512];
    double before = worker_cancels(), after = before;
    int64_t t0, t1 = -1;
    assert_true(before >= 0);
    snprintf(cmd, sizeof(cmd),
             "curl -s -N %s -m 0.6 -X POST --data-binary "
             "'{\"model\":\"long\",\"input\":\"x\",\"stream\":true}' 'http://%s/v1/responses' "
             ">/dev/null 2>&1",
             proto, g_gw);
    (void)!system(cmd);
    t0 = swh_now_ms();
    while (swh_now_ms() - t0 < 5000 * swh_slow()) {
        after = worker_cancels();
        if (after > before) {
            t1 = swh_now_ms();
            break;
        }
        swh_sleep_ms(20);
    }
    assert_true(after == before + 1);
    printf("    client disconnect (%s) -> worker saw the cancel: %lld ms\n", proto,
           (long long)(t1 - t0));
    assert_true(t1 - t0 <= 1000 * swh_slow());
}

static void
test_disconnect_cancels_http1(void **state)
{
    (void)state;
    disconnect("--http1.1");
}

static void
test_disconnect_cancels_http2(void **state)
{
    (void)state;
    disconnect("--http2-prior-knowledge");
}

/* The worker dies mid-stream: response.failed, error instance_lost. */
static void
test_instance_lost(void **state)
{
    const worker_def w = {
        "gw.kill.gen", "wkill", {"--tokens", "1000", "--token-interval-ms", "10", NULL}};
    int fd, st;
    pid_t pid = start_worker(&w, NULL, &fd);
    char cmd[512], line[8192], text[16384];
    FILE *p;
    size_t n = 0;
    int killed = 0, ndelta = 0;
    sse s;
    json_t *r;
    (void)state;
    assert_true(pid > 0);
    assert_int_equal(swh_wait_line(fd, "worker ready", NULL, 0, 10000 * swh_slow()), 0);
    swh_sleep_ms(1500); /* registered, and seen by the gateway */
    snprintf(cmd, sizeof(cmd),
             "curl -s -N -m 60 -X POST --data-binary "
             "'{\"model\":\"kill\",\"input\":\"x\",\"stream\":true}' 'http://%s/v1/responses'",
             g_gw);
    p = popen(cmd, "r");
    g_out[0] = '\0';
    while (fgets(line, sizeof(line), p) != NULL) {
        size_t l = strlen(line);
        memcpy(g_out + n, line, l + 1);
        n += l;
        if (!killed && strstr(line, "\"delta\":\"token-5\"") != NULL) {
            swh_kill(pid, SIGKILL);
            killed = 1;
        }
    }
    pclose(p);
    (void)swh_wait_exit(pid, 5000, &st);
    close(fd);
    assert_true(killed);
    sse_parse(g_out, &s);
    for (int i = 0; i < s.n; i++)
        ndelta += strcmp(s.type[i], "response.output_text.delta") == 0;
    r = expect_events(&s, ndelta, "response.failed", text, sizeof(text));
    assert_string_equal(str_at(r, "error", "code"), "instance_lost");
    sse_free(&s);
}

/* A worker at its concurrency limit: the second request is refused,
 * overloaded (429 without stream). */
static void
test_overloaded(void **state)
{
    char cmd[512];
    json_t *j;
    FILE *p;
    char line[512];
    (void)state;
    snprintf(cmd, sizeof(cmd),
             "curl -s -N -m 8 -X POST --data-binary "
             "'{\"model\":\"busy\",\"input\":\"x\",\"stream\":true}' 'http://%s/v1/responses'",
             g_gw);
    p = popen(cmd, "r");
    /* the first stream is running once its first delta arrives */
    while (fgets(line, sizeof(line), p) != NULL && strstr(line, "output_text.delta") == NULL) {
    }
    assert_int_equal(
        curl(NULL, "/v1/responses", "{\"model\":\"busy\",\"input\":\"x\"}", g_out, sizeof(g_out)),
        429);
    j = json_loads(g_out, 0, NULL);
    assert_string_equal(str_at(j, "error", "code"), "overloaded");
    json_decref(j);
    pclose(p); /* leaves: cancels the first */
}

static void
test_models_health_ready_metrics(void **state)
{
    json_t *j;
    (void)state;
    assert_int_equal(curl(NULL, "/v1/models", NULL, g_out, sizeof(g_out)), 200);
    j = json_loads(g_out, 0, NULL);
    assert_int_equal(json_array_size(json_object_get(j, "data")), 10);
    assert_string_equal(str_at(json_array_get(json_object_get(j, "data"), 0), "id", NULL), "ok");
    json_decref(j);
    assert_int_equal(curl(NULL, "/healthz", NULL, g_out, sizeof(g_out)), 200);
    /* "none" (and "kill", once gone) have no instance: not ready */
    assert_int_equal(curl(NULL, "/readyz", NULL, g_out, sizeof(g_out)), 503);
    assert_non_null(strstr(g_out, "no live instance"));
    assert_int_equal(curl(NULL, "/metrics", NULL, g_out, sizeof(g_out)), 200);
    assert_non_null(strstr(g_out, "streamwire_frontend_streams_total{"));
    assert_non_null(strstr(g_out, "streamwire_frontend_time_to_first_item_seconds_bucket{"));
    assert_int_equal(curl(NULL, "/", NULL, g_out, sizeof(g_out)), 200);
    assert_non_null(strstr(g_out, "<title>streamwire playground</title>"));
}

/* Polls the gateway at hp's /readyz until it answers want (10 s at most);
 * its last answer into g_out. Returns its last status. */
static int
readyz_becomes(const char *hp, int want)
{
    int code = -1;
    for (int64_t until = swh_now_ms() + 10000 * swh_slow(); swh_now_ms() < until;) {
        if ((code = curl_at(hp, NULL, "/readyz", NULL, g_out, sizeof(g_out))) == want)
            break;
        swh_sleep_ms(50);
    }
    return code;
}

/* /readyz is 503 while a model's only instance is draining, though its
 * entry is still in the registry and its lease alive; 200 with a live one
 * beside it, and again once the drained one is registered anew (a restarted
 * worker: the API has no way back from draining). The instances are this
 * test's own registrations (sw_registry_set_draining acts on the handle
 * that registered), never picked: nothing asks for their model. */
static void
test_readyz_draining(void **state)
{
    const char *extra[] = {"--model", "drain=gw.drain.gen", NULL};
    sw_registration r[2] = {
        {"wdrain", "gw.drain.gen", "gw.drain.req.wdrain", "gw.drain.ctl.wdrain"},
        {"wdrain2", "gw.drain.gen", "gw.drain.req.wdrain2", "gw.drain.ctl.wdrain2"}};
    sw_conn_opts co;
    sw_registry_opts ro;
    sw_conn *c = NULL;
    sw_registry *reg = NULL;
    char hp[128];
    int fd, st;
    pid_t pid;
    (void)state;
    sw_conn_opts_init(&co);
    co.url = g_nats.url;
    assert_int_equal(sw_conn_open(&c, &co), SW_OK);
    sw_registry_opts_init(&ro);
    assert_int_equal(sw_registry_open(&reg, c, &ro), SW_OK);
    assert_int_equal(sw_registry_register(reg, &r[0]), SW_OK);
    pid = own_gateway(extra, hp, sizeof(hp), &fd);
    wait_readyz(hp);
    /* its only instance drains */
    assert_int_equal(sw_registry_set_draining(reg, "wdrain"), SW_OK);
    assert_int_equal(readyz_becomes(hp, 503), 503);
    assert_non_null(strstr(g_out, "no live instance"));
    /* a live one beside it */
    assert_int_equal(sw_registry_register(reg, &r[1]), SW_OK);
    assert_int_equal(readyz_becomes(hp, 200), 200);
    assert_int_equal(sw_registry_deregister(reg, "wdrain2"), SW_OK);
    assert_int_equal(readyz_becomes(hp, 503), 503);
    assert_non_null(strstr(g_out, "no live instance"));
    /* the drained one stays draining until it leaves and comes back */
    swh_sleep_ms(500);
    assert_int_equal(curl_at(hp, NULL, "/readyz", NULL, g_out, sizeof(g_out)), 503);
    assert_int_equal(sw_registry_deregister(reg, "wdrain"), SW_OK);
    assert_int_equal(sw_registry_register(reg, &r[0]), SW_OK);
    assert_int_equal(readyz_becomes(hp, 200), 200);
    assert_int_equal(sw_registry_deregister(reg, "wdrain"), SW_OK);
    swh_kill(pid, SIGTERM);
    assert_int_equal(swh_wait_exit(pid, 20000 * swh_slow(), &st), 0);
    assert_int_equal(st, 0);
    close(fd);
    sw_registry_close(reg);
    sw_conn_close(c);
}

/* ---------------------------------------------------------------- hostile HTTP */

/* With rcvbuf > 0: that receive buffer (set before the connect, so that
 * the window the server sees is small). */
static int
tcp_connect_rcvbuf(const char *hostport, int rcvbuf)
{
    char host[64];
    const char *colon = strrchr(hostport, ':');
    struct sockaddr_in a;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    memset(&a, 0, sizeof(a));
    snprintf(host, sizeof(host), "%.*s", (int)(colon - hostport), hostport);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)atoi(colon + 1));
    inet_pton(AF_INET, host, &a.sin_addr);
    if (fd >= 0 && rcvbuf > 0 &&
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf)) != 0) {
        close(fd);
        return -1;
    }
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

static int
tcp_connect(const char *hostport)
{
    return tcp_connect_rcvbuf(hostport, 0);
}

/* Reads what the server answers within ms; returns the bytes (0: it closed
 * the connection, -1: nothing in time). */
static ssize_t
read_some(int fd, char *buf, size_t cap, int ms)
{
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, ms) <= 0)
        return -1;
    return read(fd, buf, cap - 1);
}

/* 1,500 idle connections and 50 slowloris clients (a header byte every
 * 100 ms) are open while a normal stream runs: it completes, exactly as
 * without them; the gateway is still healthy afterwards. */
static void
test_idle_and_slowloris(void **state)
{
    enum { NIDLE = 10000 };
    static int idle[NIDLE], slow[50];
    int nidle = 0;
    long rss0, rss1;
    (void)state;
    rss0 = swh_rss_kb(g_gw_pid);
    for (int i = 0; i < NIDLE; i++)
        if ((idle[i] = tcp_connect(g_gw)) >= 0)
            nidle++;
    if (nidle < NIDLE)
        fail_msg("%d of %d idle connections opened (open files: see ulimit -n)", nidle, NIDLE);
    for (int i = 0; i < 50; i++) {
        slow[i] = tcp_connect(g_gw);
        assert_true(slow[i] >= 0);
        {
            static const char head[] = "POST /v1/responses HTTP/1.1\r\nHost: x\r\nX-Slow: ";
            (void)!write(slow[i], head, sizeof(head) - 1);
        }
    }
    for (int round = 0; round < 5; round++) {
        for (int i = 0; i < 50; i++)
            (void)!write(slow[i], "a", 1);
        swh_sleep_ms(100);
    }
    /* while they are all open, streams still work over both protocols */
    stream_completed("--http1.1");
    stream_completed("--http2-prior-knowledge");
    rss1 = swh_rss_kb(g_gw_pid);
    print_message("    %d idle + 50 slowloris connections: gateway RSS %ld -> %ld KiB "
                  "(%.1f KiB per connection)\n",
                  nidle, rss0, rss1, (double)(rss1 - rss0) / (nidle + 50));
    for (int i = 0; i < NIDLE; i++)
        if (idle[i] >= 0)
            close(idle[i]);
    for (int i = 0; i < 50; i++)
        close(slow[i]);
    assert_int_equal(curl(NULL, "/healthz", NULL, g_out, sizeof(g_out)), 200);
}

/* Reads from fd until `want` occurrences of "HTTP/1.1 " have arrived and the
 * last header block ended, or 5 s pass; the bytes, NUL-terminated. */
static size_t
read_responses(int fd, char *buf, size_t cap, int want)
{
    size_t got = 0;
    int64_t until = swh_now_ms() + 5000 * swh_slow();
    for (;;) {
        ssize_t n;
        int seen = 0;
        const char *at = buf, *last = NULL;
        buf[got] = '\0';
        while ((at = strstr(at, "HTTP/1.1 ")) != NULL) {
            seen++;
            last = at++;
        }
        if (seen >= want && strstr(last, "\r\n\r\n") != NULL)
            break;
        if (swh_now_ms() > until || got + 1 >= cap)
            break;
        if ((n = read_some(fd, buf + got, cap - got, 200)) == 0)
            break;
        if (n > 0)
            got += (size_t)n;
    }
    buf[got] = '\0';
    return got;
}

/* HEAD gets the headers of GET and no body: over a kept-alive connection
 * the next response follows the first one's headers at once (before, the
 * page or the JSON body came after HEAD's headers, and a client read it as
 * the next response). A method a path does not take is 405 with its own
 * status line; an unknown path is 404 whatever the method. */
static void
test_head_and_methods(void **state)
{
    static char buf[1 << 16];
    const char *p;
    int fd;
    (void)state;
    fd = tcp_connect(g_gw);
    assert_true(fd >= 0);
    {
        static const char two[] = "HEAD / HTTP/1.1\r\nHost: x\r\n\r\n"
                                  "HEAD /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
                                  "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_int_equal(write(fd, two, sizeof(two) - 1), (ssize_t)(sizeof(two) - 1));
    }
    read_responses(fd, buf, sizeof(buf), 3);
    close(fd);
    /* 1: the playground's headers, its length, and nothing after them */
    assert_memory_equal(buf, "HTTP/1.1 200 OK\r\n", 17);
    assert_true(strstr(buf, "content-length: ") != NULL || strstr(buf, "Content-Length: ") != NULL);
    p = strstr(buf, "\r\n\r\n");
    assert_non_null(p);
    assert_memory_equal(p + 4, "HTTP/1.1 200 OK\r\n", 17); /* 2 follows at once */
    assert_null(strstr(buf, "<html"));
    assert_null(strstr(buf, "<!doctype"));
    p = strstr(p + 4, "\r\n\r\n");
    assert_non_null(p);
    assert_memory_equal(p + 4, "HTTP/1.1 200 OK\r\n", 17); /* 3 follows at once */
    assert_null(strstr(buf, "\"object\":\"list\""));       /* no body of /v1/models */
    p = strstr(p + 4, "\r\n\r\n");
    assert_non_null(p);
    assert_string_equal(p + 4, "ok\n"); /* GET still gets its body */

    /* 405 for a path that exists, with its reason phrase; 404 otherwise */
    fd = tcp_connect(g_gw);
    assert_true(fd >= 0);
    {
        static const char req[] = "HEAD /v1/responses HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_int_equal(write(fd, req, sizeof(req) - 1), (ssize_t)(sizeof(req) - 1));
    }
    read_responses(fd, buf, sizeof(buf), 1);
    close(fd);
    assert_memory_equal(buf, "HTTP/1.1 405 Method Not Allowed\r\n", 33);
    assert_null(strstr(buf, "method_not_allowed")); /* HEAD: no JSON body */
    assert_int_equal(curl(NULL, "/healthz", "{}", g_out, sizeof(g_out)), 405);
    assert_non_null(strstr(g_out, "method_not_allowed"));
    assert_int_equal(curl(NULL, "/nope", "{}", g_out, sizeof(g_out)), 404);
    assert_non_null(strstr(g_out, "\"not_found\""));
    assert_int_equal(curl("-X DELETE", "/v1/models/x", NULL, g_out, sizeof(g_out)), 404);
}

/* A non-stream request whose HTTP/1.1 client hangs up is cancelled: h2o
 * reads nothing from the connection while the answer is pending, so the
 * gateway peeks at it. The "busy" worker serves one request at a time
 * (400 tokens, 4 s): once the first client has left, a second request is
 * served -- before, the first ran its 4 s to the end for nobody and the
 * second got 429 overloaded. */
static void
test_non_stream_client_leaves(void **state)
{
    static const char req[] = "POST /v1/responses HTTP/1.1\r\nHost: x\r\n"
                              "Content-Type: application/json\r\nContent-Length: 28\r\n\r\n"
                              "{\"model\":\"busy\",\"input\":\"x\"}";
    json_t *j;
    int fd, code = 0;
    (void)state;
    fd = tcp_connect(g_gw);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, req, sizeof(req) - 1), (ssize_t)(sizeof(req) - 1));
    swh_sleep_ms(300); /* it is running */
    close(fd);
    /* the watch (every 250 ms) notices, the worker hears the cancel */
    for (int64_t until = swh_now_ms() + 3000 * swh_slow(); swh_now_ms() < until;) {
        swh_sleep_ms(250);
        code = curl(NULL, "/v1/responses", "{\"model\":\"busy\",\"input\":\"x\"}", g_out,
                    sizeof(g_out));
        if (code != 429)
            break;
    }
    assert_int_equal(code, 200);
    j = json_loads(g_out, 0, NULL);
    assert_non_null(j);
    assert_string_equal(str_at(j, "status", NULL), "completed");
    json_decref(j);
}

/* A flood of headers, a giant header line, and garbage bytes: each gets a
 * 4xx or a closed connection, never a crash; the gateway stays healthy. */
static void
test_header_floods(void **state)
{
    static char big[2 * 1024 * 1024];
    char buf[4096];
    int fd;
    size_t n = 0;
    ssize_t r;
    (void)state;
    /* 20,000 headers */
    fd = tcp_connect(g_gw);
    assert_true(fd >= 0);
    n = (size_t)snprintf(big, sizeof(big), "GET /healthz HTTP/1.1\r\nHost: x\r\n");
    for (int i = 0; i < 20000 && n + 40 < sizeof(big); i++)
        n += (size_t)snprintf(big + n, sizeof(big) - n, "X-H%d: v\r\n", i);
    n += (size_t)snprintf(big + n, sizeof(big) - n, "\r\n");
    (void)!send(fd, big, n, MSG_NOSIGNAL);
    r = read_some(fd, buf, sizeof(buf), 5000 * swh_slow());
    buf[r > 0 ? r : 0] = '\0';
    assert_true(r == 0 || (r > 0 && (strncmp(buf, "HTTP/1.1 4", 10) == 0 ||
                                     strncmp(buf, "HTTP/1.1 200", 12) == 0)));
    close(fd);
    /* one header line of 1 MiB */
    fd = tcp_connect(g_gw);
    assert_true(fd >= 0);
    n = (size_t)snprintf(big, sizeof(big), "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ");
    memset(big + n, 'a', 1024 * 1024);
    n += 1024 * 1024;
    n += (size_t)snprintf(big + n, sizeof(big) - n, "\r\n\r\n");
    (void)!send(fd, big, n, MSG_NOSIGNAL);
    r = read_some(fd, buf, sizeof(buf), 5000 * swh_slow());
    buf[r > 0 ? r : 0] = '\0';
    assert_true(r <= 0 || strncmp(buf, "HTTP/1.1 4", 10) == 0);
    close(fd);
    /* garbage */
    fd = tcp_connect(g_gw);
    assert_true(fd >= 0);
    {
        static const char junk[] = "\x16\x03\x01\x00\xff garbage\r\n\r\n";
        (void)!send(fd, junk, sizeof(junk) - 1, MSG_NOSIGNAL);
    }
    r = read_some(fd, buf, sizeof(buf), 5000 * swh_slow());
    buf[r > 0 ? r : 0] = '\0';
    assert_true(r <= 0 || strncmp(buf, "HTTP/1.1 4", 10) == 0);
    close(fd);
    /* and the gateway still serves */
    assert_int_equal(curl(NULL, "/healthz", NULL, g_out, sizeof(g_out)), 200);
    stream_completed("--http1.1");
}

/* Sends the raw bytes req on a new connection and reads until the server
 * closes it or 3 s pass; what came back, NUL-terminated, into buf. *closed:
 * 1 if the server closed the connection. */
static size_t
raw_until_close(const char *req, size_t len, char *buf, size_t cap, int *closed)
{
    size_t got = 0;
    int fd = tcp_connect(g_gw);
    int64_t until = swh_now_ms() + 3000 * swh_slow();
    assert_true(fd >= 0);
    assert_int_equal(write(fd, req, len), (ssize_t)len);
    *closed = 0;
    while (got + 1 < cap && swh_now_ms() < until) {
        ssize_t n = read_some(fd, buf + got, cap - got, 200);
        if (n == 0 || (n < 0 && errno == ECONNRESET)) {
            *closed = 1;
            break;
        }
        if (n > 0)
            got += (size_t)n;
    }
    buf[got] = '\0';
    close(fd);
    return got;
}

static size_t h2_frame(uint8_t *b, size_t len, uint8_t type, uint8_t flags, uint32_t id);

/* The same smuggling through an h2c upgrade (Upgrade: h2c, HTTP2-Settings),
 * which libh2o 2.2 takes from HTTP/1.1: the upgraded request reaches the
 * handler as HTTP/2 stream 1, where the ambiguous-length check did not look,
 * and the bytes after the first Content-Length's body -- an HTTP/2 preface
 * and a HEADERS frame for GET /v1/models on stream 3, which a proxy that
 * went by the second Content-Length took for the body -- were served as a
 * request of their own. Now the upgraded request gets 400 bad_request (the
 * 101 has gone out: h2o answers it before the handler sees the request),
 * nothing else on the connection is served, and the connection is closed. */
static void
h2c_upgrade_smuggled(void)
{
    static const char body[] = "{\"model\":\"ok\",\"input\":\"xyz\"}"; /* 28 bytes */
    static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    static const uint8_t hdr[] = {
        0x82,                                                       /* :method GET */
        0x86,                                                       /* :scheme http */
        0x04, 10, '/', 'v', '1', '/', 'm', 'o', 'd', 'e', 'l', 's', /* :path */
        0x01, 1,  'x',                                              /* :authority */
    };
    static char buf[1 << 16];
    uint8_t smuggled[128];
    char req[1024], data1[4096] = "", data3[4096] = "";
    size_t ns = sizeof(preface) - 1, got, at, n1 = 0, n3 = 0;
    int n, closed, status1 = -1, status3 = -1;
    const char *p;
    memcpy(smuggled, preface, ns);
    ns += h2_frame(smuggled + ns, 0, 4 /* SETTINGS */, 0, 0);
    ns +=
        h2_frame(smuggled + ns, sizeof(hdr), 1 /* HEADERS */, 0x5 /* END_STREAM|END_HEADERS */, 3);
    memcpy(smuggled + ns, hdr, sizeof(hdr));
    ns += sizeof(hdr);
    n = snprintf(req, sizeof(req),
                 "POST /v1/responses HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
                 "Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n"
                 "Content-Type: application/json\r\nContent-Length: %zu\r\n"
                 "Content-Length: %zu\r\n\r\n%s",
                 sizeof(body) - 1, sizeof(body) - 1 + ns, body);
    assert_true(n > 0 && (size_t)n + ns < sizeof(req));
    memcpy(req + n, smuggled, ns);
    got = raw_until_close(req, (size_t)n + ns, buf, sizeof(buf), &closed);
    print_message("    h2c upgrade with two Content-Lengths: %.*s, closed %d\n",
                  (int)strcspn(buf, "\r\n"), buf, closed);
    /* h2o switched protocols before the handler saw the request */
    assert_memory_equal(buf, "HTTP/1.1 101 ", 13);
    assert_non_null(p = strstr(buf, "\r\n\r\n"));
    /* the HTTP/2 frames after it: each stream's status and body */
    for (at = (size_t)(p + 4 - buf); at + 9 <= got;) {
        const uint8_t *f = (const uint8_t *)buf + at;
        size_t len = ((size_t)f[0] << 16) | ((size_t)f[1] << 8) | f[2];
        uint32_t id =
            ((uint32_t)(f[5] & 0x7f) << 24) | ((uint32_t)f[6] << 16) | ((uint32_t)f[7] << 8) | f[8];
        if (at + 9 + len > got)
            break;
        if (f[3] == 1 && len > 0 && id == 1) /* HEADERS: :status, indexed (0x8c: 400) */
            status1 = f[9];
        else if (f[3] == 1 && len > 0 && id == 3)
            status3 = f[9];
        else if (f[3] == 0 && id == 1 && n1 + len < sizeof(data1)) {
            memcpy(data1 + n1, f + 9, len);
            data1[n1 += len] = '\0';
        } else if (f[3] == 0 && id == 3 && n3 + len < sizeof(data3)) {
            memcpy(data3 + n3, f + 9, len);
            data3[n3 += len] = '\0';
        }
        at += 9 + len;
    }
    print_message("    stream 1: status 0x%x %.120s; stream 3: status 0x%x %.120s\n", status1,
                  data1, status3, data3);
    assert_int_equal(status1, 0x8c); /* 400 */
    assert_non_null(strstr(data1, "\"code\":\"bad_request\""));
    assert_non_null(strstr(data1, "h2c"));
    /* the smuggled GET /v1/models went unserved */
    assert_int_not_equal(status3, 0x88); /* not 200 */
    assert_null(strstr(data3, "\"object\":\"list\""));
    assert_true(closed);
}

/* A request whose body length is ambiguous -- two Content-Length headers
 * (equal or not), Content-Length next to Transfer-Encoding, two
 * Transfer-Encoding headers, or a folded header line (obs-fold, which was
 * taken as is: "Transfer-Encoding: chunked" folded with ", identity"
 * read as chunked) -- gets 400
 * bad_request in the JSON error shape, and the connection is closed: the
 * bytes after the body h2o read are not taken as another request. h2o 2.2
 * reads a body by the first Content-Length and ignores the rest, so a
 * proxy in front that went by the last one forwarded a request ("smuggled"
 * in the body) that the gateway then served as the next one on the
 * connection. One Content-Length is served as before. */
static void
test_ambiguous_length(void **state)
{
    static char buf[1 << 16];
    static const char smuggled[] = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";
    static const char body[] = "{\"model\":\"ok\",\"input\":\"x\",\"stream\":true}";
    char req[1024];
    const char *p;
    int n, closed;
    json_t *j;
    (void)state;
    for (int k = 0; k < 6; k++) {
        switch (k) {
        case 0: /* the first says no body; the second covers the smuggled request */
            n = snprintf(req, sizeof(req),
                         "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
                         "Content-Length: %zu\r\n\r\n%s",
                         sizeof(smuggled) - 1, smuggled);
            break;
        case 1: /* conflicting, on the streaming route: the body, then the smuggled one */
            n = snprintf(
                req, sizeof(req),
                "POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: "
                "application/json\r\ncontent-length: %zu\r\nContent-Length: %zu\r\n\r\n%s%s",
                sizeof(body) - 1, sizeof(body) - 1 + sizeof(smuggled) - 1, body, smuggled);
            break;
        case 2: /* equal values: refused too (there is no reason to send two) */
            n = snprintf(req, sizeof(req),
                         "POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n"
                         "Content-Length: %zu\r\n\r\n%s",
                         sizeof(body) - 1, sizeof(body) - 1, body);
            break;
        case 3: /* Transfer-Encoding wins in h2o; a proxy may go by the length */
            n = snprintf(req, sizeof(req),
                         "POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n"
                         "Transfer-Encoding: chunked\r\n\r\n%zx\r\n%s\r\n0\r\n\r\n%s",
                         sizeof(body) - 1, sizeof(body) - 1, body, smuggled);
            break;
        case 4: /* two Transfer-Encodings: h2o goes by the last (chunked), a proxy
                   that went by the first saw no body, and the chunks as the next
                   request (whose own end it then took for a third) */
            n = snprintf(req, sizeof(req),
                         "POST /v1/responses HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\n"
                         "Transfer-Encoding: chunked\r\n\r\n%zx\r\n%s\r\n0\r\n\r\n%s",
                         sizeof(body) - 1, body, smuggled);
            break;
        default: /* a folded header line (obs-fold): h2o takes "chunked" and makes the
                    continuation a header of no name; a proxy that unfolds it reads
                    "chunked , identity", whose last coding is not chunked */
            n = snprintf(req, sizeof(req),
                         "POST /v1/responses HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                         " , identity\r\n\r\n%zx\r\n%s\r\n0\r\n\r\n%s",
                         sizeof(body) - 1, body, smuggled);
            break;
        }
        raw_until_close(req, (size_t)n, buf, sizeof(buf), &closed);
        print_message("    ambiguous length %d: %.*s, closed %d\n", k, (int)strcspn(buf, "\r\n"),
                      buf, closed);
        assert_memory_equal(buf, "HTTP/1.1 400 Bad Request\r\n", 26);
        assert_non_null(strstr(buf, "\r\nConnection: close\r\n"));
        assert_non_null(p = strstr(buf, "\r\n\r\n"));
        j = json_loads(p + 4, 0, NULL);
        assert_non_null(j);
        assert_string_equal(str_at(j, "error", "type"), "invalid_request_error");
        assert_string_equal(str_at(j, "error", "code"), "bad_request");
        assert_non_null(strstr(str_at(j, "error", "message"), k < 3   ? "Content-Length"
                                                              : k < 5 ? "Transfer-Encoding"
                                                                      : "obs-fold"));
        if (k == 4)
            assert_non_null(strstr(str_at(j, "error", "message"), "more than one"));
        json_decref(j);
        /* nothing after it: the smuggled request went unserved */
        assert_null(strstr(p, "HTTP/1.1 "));
        assert_true(closed);
    }
    /* one Content-Length: served, and the connection kept */
    n = snprintf(req, sizeof(req),
                 "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n%s", smuggled);
    {
        int fd = tcp_connect(g_gw);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, req, (size_t)n), n);
        read_responses(fd, buf, sizeof(buf), 2);
        close(fd);
    }
    assert_memory_equal(buf, "HTTP/1.1 200 OK\r\n", 17);
    assert_non_null(p = strstr(buf + 17, "HTTP/1.1 200 OK\r\n"));
    h2c_upgrade_smuggled();
}

/* --request-timeout-ms: how long an HTTP/1.1 connection may take for a
 * request's headers and body (from its start, or the previous answer's
 * end). It was libh2o's fixed 10 s, whatever --max-body allowed (64 MiB:
 * 6.7 MB/s to get one in), with no way to raise it. With 1,500 ms a
 * request whose body trickles in over about 600 ms is served, and one that
 * stops halfway is closed about 1.5 s after the connection opened. */
static void
test_request_timeout(void **state)
{
    static const char body[] = "{\"model\":\"ok\",\"input\":\"slow upload\"}";
    const char *extra[] = {"--model", "ok=gw.ok.gen", "--request-timeout-ms", "1500", NULL};
    char hp[128], head[256], buf[4096];
    int gfd, st, fd, hn, closed = 0;
    size_t half = (sizeof(body) - 1) / 2, got = 0;
    int64_t t0;
    pid_t gp;
    (void)state;
    gp = own_gateway(extra, hp, sizeof(hp), &gfd);
    wait_readyz(hp);
    hn = snprintf(head, sizeof(head),
                  "POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  "Content-Length: %zu\r\n\r\n",
                  sizeof(body) - 1);
    /* a body in 6 pieces, 100 ms apart: served */
    fd = tcp_connect(hp);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, head, (size_t)hn), hn);
    for (size_t off = 0, step = (sizeof(body) - 1 + 5) / 6; off < sizeof(body) - 1; off += step) {
        size_t n = sizeof(body) - 1 - off < step ? sizeof(body) - 1 - off : step;
        swh_sleep_ms(100);
        assert_int_equal(write(fd, body + off, n), (ssize_t)n);
    }
    got = read_responses(fd, buf, sizeof(buf), 1);
    close(fd);
    assert_true(got > 0);
    assert_memory_equal(buf, "HTTP/1.1 200 OK\r\n", 17);
    /* half a body, then nothing: closed when the request's time is up */
    t0 = swh_now_ms();
    fd = tcp_connect(hp);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, head, (size_t)hn), hn);
    assert_int_equal(write(fd, body, half), (ssize_t)half);
    for (int64_t end = t0 + 6000 * swh_slow(); swh_now_ms() < end;) {
        ssize_t n;
        errno = 0;
        n = read_some(fd, buf, sizeof(buf), 100);
        if (n == 0 || (n < 0 && errno == ECONNRESET)) {
            closed = 1;
            break;
        }
        assert_true(n < 0); /* no answer */
    }
    close(fd);
    print_message("    half a body: closed %d after %lld ms (--request-timeout-ms 1500)\n", closed,
                  (long long)(swh_now_ms() - t0));
    assert_true(closed);
    assert_true(swh_now_ms() - t0 >= 1400);
    assert_true(swh_now_ms() - t0 <= 1500 + 1000 * swh_slow());
    swh_kill(gp, SIGTERM);
    assert_int_equal(swh_wait_exit(gp, 20000 * swh_slow(), &st), 0);
    assert_int_equal(st, 0);
    close(gfd);
}

/* Waits until the gateway whose stdout is fd listens: its host:port into
 * hp. spawn_gateway: runs the gateway of argv (the CLI's arguments,
 * NULL-terminated) and waits so, its stdout (the access log) into *fd. */
static void
gateway_ready(int fd, char *hp, size_t cap)
{
    char line[256];
    assert_int_equal(
        swh_wait_line(fd, "gateway ready listen=", line, sizeof(line), 10000 * swh_slow()), 0);
    snprintf(hp, cap, "%s", strchr(line, '=') + 1);
}

static pid_t
spawn_gateway(const char *const *argv, char *hp, size_t cap, int *fd)
{
    pid_t pid = swh_spawn(argv, fd);
    assert_true(pid > 0);
    gateway_ready(*fd, hp, cap);
    return pid;
}

/* --max-connections: a gateway allowed 5 connections closes the 6th at
 * once, and takes new ones when others leave. */
static void
test_max_connections(void **state)
{
    const char *argv[] = {"gateway",     "--server", g_nats.url,     "--listen",
                          "127.0.0.1:0", "--model",  "ok=gw.ok.gen", "--max-connections",
                          "5",           "--quiet",  "--access-log", "off",
                          NULL};
    char hp[128], buf[256];
    int fd, c[6], st;
    pid_t pid;
    (void)state;
    pid = spawn_gateway(argv, hp, sizeof(hp), &fd);
    for (int i = 0; i < 5; i++) {
        c[i] = tcp_connect(hp);
        assert_true(c[i] >= 0);
    }
    swh_sleep_ms(200);
    c[5] = tcp_connect(hp);
    assert_true(c[5] >= 0);
    assert_int_equal(read_some(c[5], buf, sizeof(buf), 3000 * swh_slow()), 0); /* closed */
    close(c[5]);
    close(c[0]);
    swh_sleep_ms(300);
    c[5] = tcp_connect(hp);
    {
        static const char get[] = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
        (void)!write(c[5], get, sizeof(get) - 1);
    }
    assert_true(read_some(c[5], buf, sizeof(buf), 3000 * swh_slow()) > 0);
    assert_int_equal(strncmp(buf, "HTTP/1.1 200", 12), 0);
    for (int i = 1; i < 6; i++)
        close(c[i]);
    swh_kill(pid, SIGTERM);
    assert_int_equal(swh_wait_exit(pid, 20000 * swh_slow(), &st), 0);
    assert_int_equal(st, 0);
    close(fd);
}

/* utime + stime of process pid so far, in ms (/proc/<pid>/stat). */
static long
proc_cpu_ms(pid_t pid)
{
    char path[64], buf[1024], *p;
    unsigned long ut = 0, st = 0;
    FILE *f;
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    if ((f = fopen(path, "r")) == NULL)
        return -1;
    p = fgets(buf, sizeof(buf), f);
    fclose(f);
    if (p == NULL || (p = strrchr(buf, ')')) == NULL ||
        sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (long)((ut + st) * 1000 / (unsigned long)sysconf(_SC_CLK_TCK));
}

/* Out of descriptors (ulimit -n 40, more clients than that): the
 * connections that cannot be accepted wait in the listen backlog, the
 * gateway warns once, and its loops rest instead of retrying the accept at
 * once (they spun at a full core each: about 1,000 ms of CPU a second).
 * Once the clients leave it accepts again. */
static void
test_out_of_descriptors(void **state)
{
    enum { NC = 80 };
    const char *argv[] = {"sh",
                          "-c",
                          "ulimit -n 40 && exec \"$0\" \"$@\"",
                          swh_cli_path(),
                          "gateway",
                          "--server",
                          g_nats.url,
                          "--listen",
                          "127.0.0.1:0",
                          "--model",
                          "ok=gw.ok.gen",
                          "--access-log",
                          "off",
                          NULL};
    char line[256], hp[128], buf[512];
    int fd, ep[2], c[NC], st, n = 0;
    long cpu0, cpu1;
    pid_t pid;
    (void)state;
    assert_non_null(swh_cli_path());
    assert_int_equal(pipe(ep), 0);
    pid = swh_spawn_path("/bin/sh", argv, &fd, ep[1]);
    close(ep[1]);
    assert_true(pid > 0);
    gateway_ready(fd, hp, sizeof(hp));
    for (int i = 0; i < NC; i++) {
        c[i] = tcp_connect(hp); /* the handshake completes in the backlog */
        assert_true(c[i] >= 0);
    }
    assert_int_equal(swh_wait_line(ep[0], "[gateway] warning: cannot accept a connection: ", line,
                                   sizeof(line), 5000 * swh_slow()),
                     0);
    assert_non_null(strstr(line, "Too many open files"));
    swh_sleep_ms(300);
    cpu0 = proc_cpu_ms(pid);
    swh_sleep_ms(1000);
    cpu1 = proc_cpu_ms(pid);
    assert_true(cpu0 >= 0 && cpu1 >= cpu0);
    assert_true(cpu1 - cpu0 < 300); /* resting: a few ms; spinning: ~1,000 per loop */
    for (int i = 0; i < NC; i++)
        close(c[i]);
    /* the backlog's connections are accepted (and found closed) as
     * descriptors free up; then a new one is served */
    for (int tries = 0; tries < 50 && n <= 0; tries++) {
        static const char get[] = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
        int k;
        swh_sleep_ms(100);
        if ((k = tcp_connect(hp)) < 0)
            continue;
        (void)!write(k, get, sizeof(get) - 1);
        n = read_some(k, buf, sizeof(buf), 2000 * swh_slow());
        close(k);
    }
    assert_true(n > 0);
    assert_int_equal(strncmp(buf, "HTTP/1.1 200", 12), 0);
    swh_kill(pid, SIGTERM);
    assert_int_equal(swh_wait_exit(pid, 20000 * swh_slow(), &st), 0);
    assert_int_equal(st, 0);
    close(fd);
    close(ep[0]);
}

/* ---------------------------------------------------------------- gateways of their own */

/* Waits until the gateway at hp answers /readyz with 200: every model it
 * serves has a live instance in its router's view (the registry entry
 * reached it; a fixed 1.5 s was not always enough on a loaded machine). */
static void
wait_readyz(const char *hp)
{
    char cmd[300], code[16];
    snprintf(cmd, sizeof(cmd), "curl -s -m 2 -o /dev/null -w '%%{http_code}' 'http://%s/readyz'",
             hp);
    for (int64_t until = swh_now_ms() + 15000 * swh_slow();;) {
        if (shell_read(cmd, code, sizeof(code)) == 0 && strcmp(code, "200") == 0)
            return;
        if (swh_now_ms() >= until)
            fail_msg("the gateway at %s never became ready (/readyz %s)", hp, code);
        swh_sleep_ms(50);
    }
}

/* A gateway of its own (for options the shared one has not) with these
 * extra arguments (NULL-terminated); its host:port into hp, its stdout (the
 * access log) into *fd. */
static pid_t
own_gateway(const char *const *extra, char *hp, size_t cap, int *fd)
{
    const char *argv[32];
    int n = 0;
    argv[n++] = "gateway";
    argv[n++] = "--server";
    argv[n++] = g_nats.url;
    argv[n++] = "--listen";
    argv[n++] = "127.0.0.1:0";
    argv[n++] = "--loops";
    argv[n++] = "2";
    argv[n++] = "--quiet";
    for (int i = 0; extra[i] != NULL && n < 31; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    return spawn_gateway(argv, hp, cap, fd);
}

/* A worker of its own with a /metrics listener; its url into murl. */
static pid_t
own_worker(const worker_def *w, char *murl, size_t cap)
{
    char line[256];
    int fd;
    pid_t pid = start_worker(w, "127.0.0.1:0", &fd);
    assert_true(pid > 0);
    assert_int_equal(
        swh_wait_line(fd, "worker metrics url=", line, sizeof(line), 10000 * swh_slow()), 0);
    snprintf(murl, cap, "%s", strchr(line, '=') + 1);
    assert_int_equal(swh_wait_line(fd, "worker ready", NULL, 0, 10000 * swh_slow()), 0);
    close(fd);
    return pid;
}

/* The client of stalled_client: HTTP/1.1 on a socket with a small receive
 * buffer that is never read (returns the socket), or h2c by nghttp with a
 * stream window of 0 (SETTINGS_INITIAL_WINDOW_SIZE 0, never raised: not
 * one DATA byte may be sent; returns -1 and *pid). */
static int
stall_client(const char *hp, int http2, pid_t *pid, char *path, size_t cap)
{
    static const char body[] =
        "{\"model\":\"stall\",\"input\":\"x\",\"stream\":true,\"max_output_tokens\":1000000}";
    int fd;
    *pid = -1;
    if (http2) {
        char url[200];
        FILE *f;
        snprintf(path, cap, "/tmp/swgw-stall-%d.json", (int)getpid());
        assert_non_null(f = fopen(path, "w"));
        assert_int_equal(fwrite(body, 1, sizeof(body) - 1, f), sizeof(body) - 1);
        assert_int_equal(fclose(f), 0);
        snprintf(url, sizeof(url), "http://%s/v1/responses", hp);
        *pid = fork();
        assert_true(*pid >= 0);
        if (*pid == 0) {
            int devnull = open("/dev/null", O_WRONLY);
            if (devnull >= 0) {
                dup2(devnull, 1);
                dup2(devnull, 2);
            }
            execlp("nghttp", "nghttp", "-n", "-w", "0", "-d", path, "-H",
                   "content-type: application/json", url, (char *)NULL);
            _exit(127);
        }
        return -1;
    }
    path[0] = '\0';
    fd = tcp_connect_rcvbuf(hp, 4096);
    assert_true(fd >= 0);
    {
        char req[512];
        int n = snprintf(req, sizeof(req),
                         "POST /v1/responses HTTP/1.1\r\nHost: x\r\n"
                         "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                         sizeof(body) - 1, body);
        assert_int_equal(write(fd, req, (size_t)n), n);
    }
    return fd;
}

/* A client that never reads (a small receive buffer, a stream of a million
 * tokens): once the gateway's write has waited --stall-ms, the stream is
 * cancelled (the worker's handler sees the cancel), the request is freed
 * (the router's open streams go back to 0), the connection is closed, the
 * access log says client_stalled and streamwire_gateway_stalled_total
 * counts it. Before, nothing ended it: the worker's send waited for credit
 * for its 30 s and the gateway held the request and its stream for ever. */
static void
stalled_client(int http2)
{
    static const worker_def w = {"gw.stall.gen", "wstall", {"--tokens", "1000000", NULL}};
    char stall[16], hp[128], murl[200], gurl[200], buf[65536], path[64];
    const char *extra[] = {"--model", "stall=gw.stall.gen", "--stall-ms", stall, NULL};
    int gfd, fd, closed = 0, st;
    double cancels = -1, stalled = -1, open = -1;
    int64_t t0, until;
    pid_t wp, gp, cp;
    json_t *j = NULL;
    snprintf(stall, sizeof(stall), "%d", 800 * swh_slow());
    wp = own_worker(&w, murl, sizeof(murl));
    gp = own_gateway(extra, hp, sizeof(hp), &gfd);
    snprintf(gurl, sizeof(gurl), "http://%s/metrics", hp);
    wait_readyz(hp); /* the registry entry reached the gateway's router */
    assert_true(metric_at(murl, "streamwire_worker_cancels_total") <= 0);

    fd = stall_client(hp, http2, &cp, path, sizeof(path));
    /* never read: the buffers fill (or no window), the gateway's write waits */
    t0 = swh_now_ms();
    until = t0 + (800 + 5000) * swh_slow();
    while (swh_now_ms() < until) {
        swh_sleep_ms(100);
        cancels = metric_at(murl, "streamwire_worker_cancels_total");
        stalled = metric_at(gurl, "streamwire_gateway_stalled_total");
        open = metric_at(gurl, "streamwire_frontend_open_streams");
        if (cancels >= 1 && stalled >= 1 && open == 0)
            break;
    }
    print_message("    stalled %s client: worker cancels %.0f, gateway stalled %.0f, open "
                  "streams %.0f after %lld ms (--stall-ms %s)\n",
                  http2 ? "h2c" : "HTTP/1.1", cancels, stalled, open,
                  (long long)(swh_now_ms() - t0), stall);
    assert_true(cancels == 1);
    assert_true(stalled == 1);
    assert_true(open == 0);
    /* the connection is closed: what was buffered, then the end (or a reset) */
    if (http2) {
        closed = swh_wait_exit(cp, 5000 * swh_slow(), &st) == 0; /* nghttp sees the end */
        if (!closed)
            swh_terminate(cp, 1000);
        unlink(path);
    } else {
        for (int64_t end = swh_now_ms() + 5000 * swh_slow(); swh_now_ms() < end;) {
            ssize_t n = read_some(fd, buf, sizeof(buf), 500);
            if (n == 0 || (n < 0 && errno == ECONNRESET)) {
                closed = 1;
                break;
            }
        }
        close(fd);
    }
    assert_true(closed);
    /* its access-log line */
    {
        char line[1024];
        while (j == NULL && swh_wait_line(gfd, "{", line, sizeof(line), 5000 * swh_slow()) == 0) {
            j = json_loads(line, 0, NULL);
            if (j != NULL && strcmp(str_at(j, "model", NULL), "stall") != 0) {
                json_decref(j);
                j = NULL;
            }
        }
    }
    assert_non_null(j);
    assert_string_equal(str_at(j, "terminal", NULL), "client_stalled");
    assert_string_equal(str_at(j, "reason", NULL), "cancelled");
    if (!http2) /* (over h2c with no window not one item was written) */
        assert_true(json_integer_value(json_object_get(j, "items")) > 0);
    json_decref(j);
    /* the gateway still serves */
    {
        char hz[512];
        int k = tcp_connect(hp);
        static const char get[] = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_true(k >= 0);
        assert_int_equal(write(k, get, sizeof(get) - 1), (ssize_t)(sizeof(get) - 1));
        assert_true(read_some(k, hz, sizeof(hz), 3000 * swh_slow()) > 0);
        assert_int_equal(strncmp(hz, "HTTP/1.1 200", 12), 0);
        close(k);
    }
    swh_kill(gp, SIGTERM);
    assert_int_equal(swh_wait_exit(gp, 20000 * swh_slow(), &st), 0);
    assert_int_equal(st, 0);
    close(gfd);
    swh_terminate(wp, 3000);
}

static void
test_stalled_client_http1(void **state)
{
    (void)state;
    stalled_client(0);
}

/* Workers whose responses end in a large last write, more than the socket
 * buffers hold (4 MiB at most here, /proc/sys/net/ipv4/tcp_wmem): a
 * stream's terminal events carry the whole text four times (200,000
 * tokens, about 2.3 MB: some 9 MB handed to h2o at once); a non-streamed
 * answer has it once (500,000 tokens, about 6 MB). */
static const worker_def BIG_WORKER = {"gw.big.gen", "wbig", {"--tokens", "200000", NULL}};
static const worker_def HUGE_WORKER = {"gw.huge.gen", "whuge", {"--tokens", "500000", NULL}};

/* A request to model on a new connection with a 64 KiB receive buffer;
 * the socket. */
static int
big_request(const char *hp, const char *model, int stream)
{
    char req[512], body[128];
    int n, fd = tcp_connect_rcvbuf(hp, 65536);
    assert_true(fd >= 0);
    snprintf(body, sizeof(body), "{\"model\":\"%s\",\"input\":\"x\"%s}", model,
             stream ? ",\"stream\":true" : "");
    n = snprintf(req, sizeof(req),
                 "POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 "Content-Length: %zu\r\n\r\n%s",
                 strlen(body), body);
    assert_int_equal(write(fd, req, (size_t)n), n);
    return fd;
}

/* Reads fd until marker has come (0), or the connection ends or ms pass
 * (-1). *total: the bytes read. */
static int
read_past(int fd, const char *marker, int ms, size_t *total)
{
    static char buf[1 << 16];
    size_t keep = 0, mlen = strlen(marker);
    int64_t until = swh_now_ms() + ms;
    while (swh_now_ms() < until) {
        ssize_t n = read_some(fd, buf + keep, sizeof(buf) - keep, 200);
        if (n == 0 || (n < 0 && errno != 0 && errno != EAGAIN && errno != EINTR))
            return -1;
        if (n < 0)
            continue;
        *total += (size_t)n;
        keep += (size_t)n;
        buf[keep] = '\0';
        if (strstr(buf, marker) != NULL)
            return 0;
        /* the marker may straddle two reads: keep its length of the tail */
        if (keep > mlen) {
            memmove(buf, buf + keep - mlen, mlen);
            keep = mlen;
        }
    }
    return -1;
}

/* A client that stops reading once its response's last write has begun:
 * the stream's terminal round (streamed), or the answer's first bytes (not
 * streamed). Before, --stall-ms did not cover that write: the request was
 * freed when the last bytes were handed to h2o, its stall timer with it,
 * and libh2o 2.2 has no write timeout on HTTP/1, so the connection and the
 * megabytes h2o held for it stayed for good, streamwire_gateway_stalled_total
 * stayed 0 and the access log said completed. Now the clock runs until h2o
 * is done with the request: the connection is closed about --stall-ms after
 * the client's last read, counted, and logged client_stalled (reason: the
 * end the client did not take). A client that reads that write slowly --
 * its 9 MB at about 2.5 MB/s, several times --stall-ms -- is not cut off:
 * the clock runs from its last progress. */
static void
test_stalled_last_write(void **state)
{
    char stall[16], hp[128], murl[200], gurl[200];
    const char *extra[] = {
        "--model", "big=gw.big.gen", "--model", "huge=gw.huge.gen", "--stall-ms", stall, NULL};
    int gfd, st;
    pid_t wp, wp2, gp;
    (void)state;
    snprintf(stall, sizeof(stall), "%d", 800 * swh_slow());
    wp = own_worker(&BIG_WORKER, murl, sizeof(murl));
    wp2 = own_worker(&HUGE_WORKER, murl, sizeof(murl));
    gp = own_gateway(extra, hp, sizeof(hp), &gfd);
    snprintf(gurl, sizeof(gurl), "http://%s/metrics", hp);
    wait_readyz(hp); /* the registry entry reached the gateway's router */
    for (int stream = 1; stream >= 0; stream--) {
        char buf[4096], line[4096];
        size_t total = 0;
        double stalled = -1;
        int64_t t0, waited;
        int closed = 0, fd = big_request(hp, stream ? "big" : "huge", stream);
        json_t *j = NULL;
        /* streamed: read every event up to the terminal round; not streamed:
         * the answer's headers */
        assert_int_equal(read_past(fd, stream ? "event: response.output_text.done" : "\r\n\r\n",
                                   60000 * swh_slow(), &total),
                         0);
        t0 = swh_now_ms(); /* and read no more */
        while (swh_now_ms() < t0 + (800 + 5000) * swh_slow()) {
            swh_sleep_ms(100);
            if ((stalled = metric_at(gurl, "streamwire_gateway_stalled_total")) >= 2 - stream)
                break;
        }
        waited = swh_now_ms() - t0;
        print_message("    %s: stopped reading after %zu bytes; stalled_total %.0f after %lld ms "
                      "(--stall-ms %s)\n",
                      stream ? "streamed, in its terminal round" : "not streamed, in its answer",
                      total, stalled, (long long)waited, stall);
        assert_true(stalled == 2 - stream);
        assert_true(waited <= (800 + 1000) * swh_slow());
        /* the connection is closed: what was buffered, then the end (or a reset) */
        for (int64_t end = swh_now_ms() + 5000 * swh_slow(); swh_now_ms() < end;) {
            ssize_t n = read_some(fd, buf, sizeof(buf), 500);
            if (n == 0 || (n < 0 && errno == ECONNRESET)) {
                closed = 1;
                break;
            }
        }
        close(fd);
        assert_true(closed);
        /* its access-log line, one */
        while (j == NULL && swh_wait_line(gfd, "{", line, sizeof(line), 5000 * swh_slow()) == 0)
            j = json_loads(line, 0, NULL);
        assert_non_null(j);
        print_message("    %s\n", line);
        assert_string_equal(str_at(j, "terminal", NULL), "client_stalled");
        assert_string_equal(str_at(j, "reason", NULL), "completed");
        assert_int_equal(json_integer_value(json_object_get(j, "status")), 200);
        assert_int_equal(json_integer_value(json_object_get(j, "items")), stream ? 200000 : 500000);
        json_decref(j);
    }
    /* a slow reader: 256 KiB every 100 ms (times the sanitizers' slowness,
     * as the stall is) through the terminal round */
    {
        static char buf[1 << 18];
        char line[4096];
        size_t total = 0, got = 0;
        int64_t t0;
        int fd = big_request(hp, "big", 1), completed = 0;
        json_t *j = NULL;
        assert_int_equal(
            read_past(fd, "event: response.output_text.done", 60000 * swh_slow(), &total), 0);
        t0 = swh_now_ms();
        for (size_t keep = 0;;) { /* keep: the last bytes before, where a marker may start */
            ssize_t n = 0;
            swh_sleep_ms(100 * swh_slow());
            got = keep;
            while (got + 1 < sizeof(buf) &&
                   (n = read_some(fd, buf + got, sizeof(buf) - got, 0)) > 0)
                got += (size_t)n;
            total += got - keep;
            buf[got] = '\0';
            if (strstr(buf, "event: response.completed\n") != NULL)
                completed = 1;
            if (got >= 5 && memcmp(buf + got - 5, "0\r\n\r\n", 5) == 0)
                break; /* the chunked end */
            if (got == keep && swh_now_ms() - t0 > 10000 * swh_slow())
                break;
            keep = got < 32 ? got : 32;
            memmove(buf, buf + got - keep, keep);
        }
        close(fd);
        print_message("    a slow reader: the terminal round in %lld ms, %zu bytes in all, "
                      "terminal %d\n",
                      (long long)(swh_now_ms() - t0), total, completed);
        assert_true(completed);
        assert_true(swh_now_ms() - t0 > 2 * 800 * swh_slow()); /* it was slow */
        assert_true(metric_at(gurl, "streamwire_gateway_stalled_total") == 2);
        while (j == NULL && swh_wait_line(gfd, "{", line, sizeof(line), 5000 * swh_slow()) == 0)
            j = json_loads(line, 0, NULL);
        assert_non_null(j);
        assert_string_equal(str_at(j, "terminal", NULL), "completed");
        json_decref(j);
    }
    assert_true(metric_at(gurl, "streamwire_frontend_open_streams") == 0);
    swh_kill(gp, SIGTERM);
    assert_int_equal(swh_wait_exit(gp, 20000 * swh_slow(), &st), 0);
    assert_int_equal(st, 0);
    /* no other line: one per request */
    {
        char line[4096];
        assert_int_not_equal(swh_wait_line(gfd, "{", line, sizeof(line), 2000 * swh_slow()), 0);
    }
    close(gfd);
    swh_terminate(wp, 3000);
    swh_terminate(wp2, 3000);
}

/* SIGTERM while a response's last write is under way, to a client that
 * reads it slowly: the drain waits for that write (within --grace-ms), and
 * the client gets the terminal event and the chunked end. Before, a loop
 * ended its drain once its list of open requests was empty -- the last
 * round handed to h2o, not sent -- and shut its connections down: the
 * client lost the rest of the terminal round. */
static void
test_sigterm_last_write(void **state)
{
    const char *extra[] = {"--model", "big=gw.big.gen", "--grace-ms", "20000", NULL};
    static char tail[1 << 16];
    char hp[128], murl[200];
    size_t total = 0, keep = 0;
    int gfd, st, fd, completed = 0;
    int64_t t0;
    pid_t wp, gp;
    (void)state;
    wp = own_worker(&BIG_WORKER, murl, sizeof(murl));
    gp = own_gateway(extra, hp, sizeof(hp), &gfd);
    wait_readyz(hp);
    fd = big_request(hp, "big", 1);
    assert_int_equal(read_past(fd, "event: response.output_text.done", 60000 * swh_slow(), &total),
                     0);
    /* the terminal round is in h2o's hands and not read: stop, and wait
     * past a few of the drain's checks (every 100 ms) */
    t0 = swh_now_ms();
    swh_kill(gp, SIGTERM);
    swh_sleep_ms(1000);
    for (;;) {
        ssize_t n = read_some(fd, tail + keep, sizeof(tail) - keep, 5000 * swh_slow());
        if (n <= 0)
            break;
        total += (size_t)n;
        keep += (size_t)n;
        tail[keep] = '\0';
        if (strstr(tail, "event: response.completed\n") != NULL)
            completed = 1;
        if (keep > 4096) { /* the last 64 bytes carry on */
            memmove(tail, tail + keep - 64, 64);
            keep = 64;
        }
    }
    close(fd);
    print_message("    SIGTERM in the last write: %zu bytes read, terminal %d, ends %s after %lld "
                  "ms\n",
                  total, completed,
                  keep >= 5 && memcmp(tail + keep - 5, "0\r\n\r\n", 5) == 0 ? "with 0 CRLF CRLF"
                                                                            : "cut off",
                  (long long)(swh_now_ms() - t0));
    assert_true(completed);
    assert_true(keep >= 5);
    assert_memory_equal(tail + keep - 5, "0\r\n\r\n", 5);
    assert_int_equal(swh_wait_exit(gp, 20000 * swh_slow(), &st), 0);
    assert_int_equal(st, 0);
    close(gfd);
    swh_terminate(wp, 3000);
}

/* The same over h2c, the audit's case: a client that gives the stream no
 * HTTP/2 window. h2o suspends its idle timeout while a response is pending,
 * so only the stall limit ends it (and, with libh2o 2.2, the connection with
 * it: GATEWAY.md). */
static void
test_stalled_client_http2(void **state)
{
    (void)state;
    stalled_client(1);
}

/* An HTTP/2 frame header into b: length, type, flags, stream id. */
static size_t
h2_frame(uint8_t *b, size_t len, uint8_t type, uint8_t flags, uint32_t id)
{
    b[0] = (uint8_t)(len >> 16);
    b[1] = (uint8_t)(len >> 8);
    b[2] = (uint8_t)len;
    b[3] = type;
    b[4] = flags;
    b[5] = (uint8_t)(id >> 24);
    b[6] = (uint8_t)(id >> 16);
    b[7] = (uint8_t)(id >> 8);
    b[8] = (uint8_t)id;
    return 9;
}

/* One stream of a rapid reset into b: HEADERS (POST /v1/responses, HPACK
 * by hand: static-table names, literal values, no Huffman), the body in
 * one DATA frame that ends the stream, then RST_STREAM (CANCEL) at once. */
static size_t
h2_rapid_reset(uint8_t *b, uint32_t id, const char *body)
{
    static const uint8_t hdr[] = {
        0x83, /* :method POST */
        0x86, /* :scheme http */
        0x04, 13, '/', 'v', '1', '/', 'r', 'e', 's', 'p', 'o', 'n', 's', 'e', 's', /* :path */
        0x01, 1,  'x',                                                             /* :authority */
    };
    size_t n = 0, blen = strlen(body);
    n += h2_frame(b + n, sizeof(hdr), 1 /* HEADERS */, 0x4 /* END_HEADERS */, id);
    memcpy(b + n, hdr, sizeof(hdr));
    n += sizeof(hdr);
    n += h2_frame(b + n, blen, 0 /* DATA */, 0x1 /* END_STREAM */, id);
    memcpy(b + n, body, blen);
    n += blen;
    n += h2_frame(b + n, 4, 3 /* RST_STREAM */, 0, id);
    b[n++] = 0;
    b[n++] = 0;
    b[n++] = 0;
    b[n++] = 8; /* CANCEL */
    return n;
}

/* An h2c connection to hp with its preface and empty SETTINGS sent. */
static int
h2c_connect(const char *hp)
{
    static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    uint8_t b[64];
    size_t n = sizeof(preface) - 1;
    int fd = tcp_connect(hp);
    assert_true(fd >= 0);
    memcpy(b, preface, n);
    n += h2_frame(b + n, 0, 4 /* SETTINGS */, 0, 0);
    assert_int_equal(send(fd, b, n, MSG_NOSIGNAL), (ssize_t)n);
    return fd;
}

/* HTTP/2 rapid reset (CVE-2023-44487): one h2c connection opens 1,000
 * streaming responses, each reset at once in the same packet, 250 to a
 * write. libh2o 2.2 has no limit on that: every one of them reached the
 * handler, which opened a stream to a worker (its handler started, then was
 * cancelled) -- a client made the workers start requests as fast as it
 * could write frames, from one connection, which stayed open. Now a
 * connection may have 200 responses whose streams run at once (100 open,
 * 100 more reset and not yet ended): at most 200 reach the workers, the
 * rest are refused, and the connection is closed. A client that lets its
 * responses finish is not touched: 300 streamed responses over one h2c
 * connection (nghttp, up to 100 at a time) all complete; nor is one that resets
 * 300 in batches of 50, each batch's streams ended before the next. */
static void
test_rapid_reset(void **state)
{
    enum { NSTREAMS = 1000, BATCH = 250, NFAIR = 300 };
    static const char body[] = "{\"model\":\"ok\",\"input\":\"x\",\"stream\":true}";
    static uint8_t out[BATCH * 128];
    static char in[1 << 16];
    /* (no access log: nobody reads this gateway's stdout, whose pipe
     * would fill and stop the gateway) */
    const char *extra[] = {"--model", "ok=gw.rr.gen", "--access-log", "off", NULL};
    /* a worker of its own, which takes all the streams the gateway may
     * run (nghttp's -M is only its guess until h2o's SETTINGS allow 100 at
     * once: the shared worker, which takes 64, refused up to 31 of the fair
     * client's 300 as overloaded on a busy machine), and which the rapid
     * reset does not leave busy for the tests after */
    static const worker_def w = {
        "gw.rr.gen", "wrr", {"--tokens", "5", "--max-inflight", "1024", NULL}};
    char hp[128], gurl[200], murl[200], path[64], cmd[1024];
    int gfd, fd, st, closed = 0, sent = 0;
    double opened0, opened, closes;
    pid_t gp, wp;
    FILE *f;
    (void)state;
    wp = own_worker(&w, murl, sizeof(murl));
    gp = own_gateway(extra, hp, sizeof(hp), &gfd);
    snprintf(gurl, sizeof(gurl), "http://%s/metrics", hp);
    wait_readyz(hp); /* the registry entry reached the gateway's router */

    /* a fair client: 300 responses on one connection, each to its end */
    snprintf(path, sizeof(path), "/tmp/swgw-rr-%d.json", (int)getpid());
    assert_non_null(f = fopen(path, "w"));
    assert_int_equal(fwrite(body, 1, sizeof(body) - 1, f), sizeof(body) - 1);
    assert_int_equal(fclose(f), 0);
    snprintf(cmd, sizeof(cmd),
             "nghttp -n -d %s -m %d -H 'content-type: application/json' "
             "'http://%s/v1/responses' >/dev/null 2>&1; curl -s -m 5 '%s' | grep -c "
             "'^streamwire_frontend_streams_total{.*status=\"completed\".*} %d$'",
             path, NFAIR, hp, gurl, NFAIR);
    assert_int_equal(shell_read(cmd, in, sizeof(in)), 0);
    unlink(path);
    if (atoi(in) != 1) { /* all 300 completed */
        snprintf(cmd, sizeof(cmd), "curl -s -m 5 '%s' | grep '^streamwire_frontend_streams_'",
                 gurl);
        (void)shell_read(cmd, in, sizeof(in));
        fail_msg("not all %d responses of the fair client completed:\n%s", NFAIR, in);
    }
    assert_true(metric_at(gurl, "streamwire_gateway_rapid_reset_closed_total") <= 0);
    opened0 = metric_at(gurl, "streamwire_frontend_streams_opened_total");
    assert_true(opened0 == NFAIR);

    /* a client that resets now and then: 300 responses reset on one
     * connection, 50 at a time, each batch's streams ended before the next
     * (the bound is on what runs at once, not on resets ever made: a count
     * of resets closed this connection at its 200th) */
    fd = h2c_connect(hp);
    for (int b = 0; b < NFAIR / 50 && !closed; b++) {
        size_t n = 0;
        ssize_t r = -1;
        for (int i = 0; i < 50; i++, sent++)
            n += h2_rapid_reset(out + n, 2 * (uint32_t)sent + 1, body);
        if (send(fd, out, n, MSG_NOSIGNAL) != (ssize_t)n)
            closed = 1;
        for (int64_t until = swh_now_ms() + 10000 * swh_slow(); !closed;) {
            while ((r = recv(fd, in, sizeof(in), MSG_DONTWAIT)) > 0) {
            }
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
                closed = 1;
            if (metric_at(gurl, "streamwire_frontend_streams_opened_total") ==
                    opened0 + 50.0 * (b + 1) &&
                metric_at(gurl, "streamwire_frontend_open_streams") == 0)
                break;
            assert_true(swh_now_ms() < until);
            swh_sleep_ms(50);
        }
    }
    close(fd);
    print_message("    patient resets: %d sent, connection closed %d\n", sent, closed);
    assert_false(closed);
    assert_true(metric_at(gurl, "streamwire_gateway_rapid_reset_closed_total") <= 0);
    opened0 = metric_at(gurl, "streamwire_frontend_streams_opened_total");
    assert_true(opened0 == 2 * NFAIR);
    sent = 0;

    /* the rapid reset */
    fd = h2c_connect(hp);
    while (sent < NSTREAMS && !closed) {
        size_t n = 0;
        ssize_t r;
        for (int i = 0; i < BATCH && sent < NSTREAMS; i++, sent++)
            n += h2_rapid_reset(out + n, 2 * (uint32_t)sent + 1, body);
        if (send(fd, out, n, MSG_NOSIGNAL) != (ssize_t)n)
            closed = 1;
        /* take what the gateway wrote (so that it never waits for us) */
        while ((r = recv(fd, in, sizeof(in), MSG_DONTWAIT)) > 0) {
        }
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
            closed = 1;
        swh_sleep_ms(10);
    }
    for (int64_t until = swh_now_ms() + 3000 * swh_slow(); !closed && swh_now_ms() < until;) {
        ssize_t r = read_some(fd, in, sizeof(in), 200);
        if (r == 0 || (r < 0 && errno == ECONNRESET))
            closed = 1;
    }
    close(fd);
    swh_sleep_ms(300);
    opened = metric_at(gurl, "streamwire_frontend_streams_opened_total") - opened0;
    closes = metric_at(gurl, "streamwire_gateway_rapid_reset_closed_total");
    print_message("    rapid reset: %d streams sent, %.0f reached the workers, connection "
                  "closed %d, gateway closes %.0f\n",
                  sent, opened, closed, closes);
    assert_true(closed);
    assert_true(opened >= 1 && opened <= 200);
    assert_true(closes == 1);
    /* the gateway still serves, over h2c too */
    snprintf(cmd, sizeof(cmd),
             "curl -s -m 10 --http2-prior-knowledge -o /dev/null -w '%%{http_code}' "
             "'http://%s/healthz'",
             hp);
    assert_int_equal(shell_read(cmd, in, sizeof(in)), 0);
    assert_string_equal(in, "200");
    swh_kill(gp, SIGTERM);
    assert_int_equal(swh_wait_exit(gp, 20000 * swh_slow(), &st), 0);
    assert_int_equal(st, 0);
    close(gfd);
    swh_terminate(wp, 3000);
}

/* A non-streamed response that fails after items with an error that,
 * before any response, is an HTTP error: the worker dies mid-response, the
 * gateway (--migration-limit 1) finds no other instance to move it to, and
 * the stream ends no_instances. The answer is 200 with the failed response
 * object, as for every failed response (it was 503 with that object). */
static void
test_non_stream_fails_after_items(void **state)
{
    static const worker_def w = {
        "gw.mig.gen", "wmig", {"--tokens", "1000", "--token-interval-ms", "10", NULL}};
    const char *extra[] = {"--model", "mig=gw.mig.gen", "--migration-limit", "1", NULL};
    char hp[128], murl[200], cmd[512], *mark;
    int gfd, st, code;
    size_t n;
    pid_t wp, gp;
    FILE *p;
    json_t *j;
    (void)state;
    wp = own_worker(&w, murl, sizeof(murl));
    gp = own_gateway(extra, hp, sizeof(hp), &gfd);
    wait_readyz(hp); /* the registry entry reached the gateway's router */
    snprintf(cmd, sizeof(cmd),
             "curl -s -m 30 -w '\\n@@%%{http_code}' -X POST -H 'content-type: application/json' "
             "--data-binary '{\"model\":\"mig\",\"input\":\"x\"}' 'http://%s/v1/responses'",
             hp);
    p = popen(cmd, "r");
    assert_non_null(p);
    /* the worker has sent some of its 1,000 tokens (10 ms apart) */
    for (int64_t until = swh_now_ms() + 5000 * swh_slow();
         metric_at(murl, "streamwire_worker_items_sent_total") < 20 && swh_now_ms() < until;)
        swh_sleep_ms(50);
    swh_kill(wp, SIGKILL);
    n = fread(g_out, 1, sizeof(g_out) - 1, p);
    g_out[n] = '\0';
    pclose(p);
    (void)swh_wait_exit(wp, 5000, &st);
    assert_non_null(mark = strstr(g_out, "\n@@"));
    code = atoi(mark + 3);
    *mark = '\0';
    print_message("    non-stream, no_instances after items: HTTP %d %.200s\n", code, g_out);
    j = json_loads(g_out, 0, NULL);
    assert_non_null(j);
    assert_string_equal(str_at(j, "status", NULL), "failed");
    assert_string_equal(str_at(j, "error", "code"), "no_instances");
    assert_true(json_integer_value(json_object_get(json_object_get(j, "usage"), "output_tokens")) >
                0);
    json_decref(j);
    assert_int_equal(code, 200);
    swh_kill(gp, SIGTERM);
    assert_int_equal(swh_wait_exit(gp, 20000 * swh_slow(), &st), 0);
    close(gfd);
}

/* SIGTERM while streams whose worker hangs are open (the audit's "no
 * terminal ever came"): --grace-ms passes, the gateway cancels them, and
 * each gets its terminal -- a streamed HTTP/1.1 client reading the events
 * gets response.incomplete with status cancelled, a non-streamed one the
 * cancelled response object -- while an h2c client that gave its stream no
 * window (nothing can be written to it; --stall-ms 0) is closed when the
 * drain ends; a client that had left is dropped. The gateway exits 0 (under
 * ASan: no request freed while h2o could still call it back). With
 * --cancel-on-disconnect on and off. */
static void
sigterm_hung(const char *cod)
{
    /* (stall_client's h2c request asks for the model "stall") */
    const char *extra[] = {"--model",
                           "hang=gw.hang.gen",
                           "--model",
                           "stall=gw.hang.gen",
                           "--grace-ms",
                           "300",
                           "--keepalive-ms",
                           "0",
                           "--stall-ms",
                           "0",
                           "--access-log",
                           "off",
                           "--cancel-on-disconnect",
                           cod,
                           NULL};
    static const char sbody[] = "{\"model\":\"hang\",\"input\":\"x\",\"stream\":true}";
    static const char nbody[] = "{\"model\":\"hang\",\"input\":\"x\"}";
    static char buf[1 << 16];
    char hp[128], req[512], path[64];
    int gfd, st, fd[3], h2closed;
    int64_t t0;
    pid_t gp, cp;
    gp = own_gateway(extra, hp, sizeof(hp), &gfd);
    wait_readyz(hp); /* the registry entry reached the gateway's router */
    for (int k = 0; k < 3; k++) {
        const char *b = k == 1 ? nbody : sbody;
        int n = snprintf(req, sizeof(req),
                         "POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s",
                         strlen(b), b);
        fd[k] = tcp_connect(hp);
        assert_true(fd[k] >= 0);
        assert_int_equal(write(fd[k], req, (size_t)n), n);
    }
    (void)stall_client(hp, 1, &cp, path, sizeof(path));
    swh_sleep_ms(500); /* the worker sent its 2 tokens and hangs */
    close(fd[2]);      /* a client that leaves */
    swh_sleep_ms(100);
    t0 = swh_now_ms();
    swh_kill(gp, SIGTERM);
    assert_int_equal(swh_wait_exit(gp, 20000 * swh_slow(), &st), 0);
    print_message("    SIGTERM with hung streams (--cancel-on-disconnect %s): exit status %d "
                  "after %lld ms\n",
                  cod, st, (long long)(swh_now_ms() - t0));
    assert_int_equal(st, 0);
    h2closed = swh_wait_exit(cp, 5000 * swh_slow(), &st) == 0; /* nghttp saw the end */
    if (!h2closed)
        swh_terminate(cp, 1000);
    unlink(path);
    assert_true(h2closed);
    for (int k = 0; k < 2; k++) {
        size_t got = 0;
        ssize_t n;
        while (got + 1 < sizeof(buf) &&
               (n = read_some(fd[k], buf + got, sizeof(buf) - got, 2000 * swh_slow())) > 0)
            got += (size_t)n;
        buf[got] = '\0';
        close(fd[k]);
        assert_memory_equal(buf, "HTTP/1.1 200 OK\r\n", 17);
        if (k == 0)
            assert_non_null(strstr(buf, "event: response.incomplete\n"));
        assert_non_null(strstr(buf, "\"status\":\"cancelled\""));
    }
    close(gfd);
}

static void
test_sigterm_cancels_hung_streams(void **state)
{
    (void)state;
    sigterm_hung("on");
    sigterm_hung("off");
}

/* SIGTERM: the gateway stops accepting, lets a running stream finish, and
 * exits 0. Last: it ends the gateway. */
static void
test_sigterm_drains(void **state)
{
    char cmd[512];
    FILE *p;
    char line[8192];
    int st = -1, done = 0, idle;
    (void)state;
    snprintf(cmd, sizeof(cmd),
             "curl -s -N -m 30 -X POST --data-binary "
             "'{\"model\":\"long\",\"input\":\"x\",\"stream\":true,\"max_output_tokens\":150}' "
             "'http://%s/v1/responses'",
             g_gw);
    p = popen(cmd, "r");
    while (fgets(line, sizeof(line), p) != NULL && strstr(line, "output_text.delta") == NULL) {
    }
    /* an idle keep-alive connection (a health checker's) stays open across
     * the stop: the gateway closes it and still exits 0 (h2o aborted when
     * its context was disposed with the connection's timeout linked) */
    idle = tcp_connect(g_gw);
    assert_true(idle >= 0);
    {
        static const char hz[] = "GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n";
        char buf[1024] = "";
        size_t have = 0;
        assert_int_equal(write(idle, hz, sizeof(hz) - 1), (ssize_t)(sizeof(hz) - 1));
        while (strstr(buf, "\r\n\r\n") == NULL || strstr(strstr(buf, "\r\n\r\n"), "ok\n") == NULL) {
            ssize_t n = read_some(idle, buf + have, sizeof(buf) - have, 5000);
            assert_true(n > 0);
            have += (size_t)n;
            buf[have] = '\0';
        }
    }
    swh_kill(g_gw_pid, SIGTERM);
    while (fgets(line, sizeof(line), p) != NULL)
        if (strstr(line, "event: response.incomplete") != NULL)
            done = 1; /* max_output_tokens reached: the stream finished normally */
    pclose(p);
    assert_true(done);
    assert_int_equal(swh_wait_exit(g_gw_pid, 20000 * swh_slow(), &st), 0);
    assert_int_equal(st, 0);
    g_gw_pid = 0;
    close(idle);
}

int
main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_completed_http1),
        cmocka_unit_test(test_completed_http2),
        cmocka_unit_test(test_access_log_every_request),
        cmocka_unit_test(test_log_reason_not_utf8),
        cmocka_unit_test(test_trace_headers),
        cmocka_unit_test(test_incomplete_max_tokens),
        cmocka_unit_test(test_failed),
        cmocka_unit_test(test_stream_incomplete_hang),
        cmocka_unit_test(test_non_stream),
        cmocka_unit_test(test_pre_response_errors),
        cmocka_unit_test(test_body_limit),
        cmocka_unit_test(test_refusal),
        cmocka_unit_test(test_metrics_events),
        cmocka_unit_test(test_slow_client_sheds_metrics),
        cmocka_unit_test(test_cancel_endpoint),
        cmocka_unit_test(test_cancel_across_loops),
        cmocka_unit_test(test_disconnect_cancels_http1),
        cmocka_unit_test(test_disconnect_cancels_http2),
        cmocka_unit_test(test_instance_lost),
        cmocka_unit_test(test_overloaded),
        cmocka_unit_test(test_models_health_ready_metrics),
        cmocka_unit_test(test_readyz_draining),
        cmocka_unit_test(test_idle_and_slowloris),
        cmocka_unit_test(test_header_floods),
        cmocka_unit_test(test_ambiguous_length),
        cmocka_unit_test(test_request_timeout),
        cmocka_unit_test(test_head_and_methods),
        cmocka_unit_test(test_non_stream_client_leaves),
        cmocka_unit_test(test_max_connections),
        cmocka_unit_test(test_out_of_descriptors),
        cmocka_unit_test(test_stalled_client_http1),
        cmocka_unit_test(test_stalled_client_http2),
        cmocka_unit_test(test_stalled_last_write),
        cmocka_unit_test(test_non_stream_fails_after_items),
        cmocka_unit_test(test_rapid_reset),
        cmocka_unit_test(test_sigterm_cancels_hung_streams),
        cmocka_unit_test(test_sigterm_last_write),
        cmocka_unit_test(test_sigterm_drains),
    };
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
