/* tests/integration/test_trace.c -- request headers and W3C trace context
 * (issue 16) against a real nats-server: headers reach the handler
 * unchanged (sw_responder_header), a valid traceparent gives the trace id
 * (sw_responder_trace_id) and tags the library's log lines about the
 * stream on both sides ("trace=<id>"), a malformed one gives none, and
 * headers beyond the bounds are refused at open (SW_EINVAL). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <nats/nats.h>
#include <streamwire/streamwire.h>

#include "common/sw_common.h"
#include "harness.h"
#include "proto/sw_codec.h"
#include "transport/sw_transport.h"

#define EP "trc.demo.gen"
#define TRACE "4bf92f3577b34da6a3ce929d0e0e4736"
#define TRACEPARENT "00-" TRACE "-00f067aa0ba902b7-01"

static swh_nats g_nats;

typedef struct seen {
    pthread_mutex_t mu;
    char traceparent[128], tracestate[128], custom[128], trace_id[64];
    int missing_is_null;
    char logs[8192];
} seen;

static seen g_seen = {PTHREAD_MUTEX_INITIALIZER, "", "", "", "", 0, ""};

static void
copy(char *dst, size_t cap, const char *v)
{
    snprintf(dst, cap, "%s", v ? v : "(null)");
}

/* Records what it sees; "noterm" returns without a terminal (the library
 * then logs a line about the stream and sends FAILED). */
static void
handler(sw_responder *r, void *arg)
{
    size_t len = 0;
    const char *p = sw_responder_payload(r, &len);
    (void)arg;
    pthread_mutex_lock(&g_seen.mu);
    copy(g_seen.traceparent, sizeof(g_seen.traceparent), sw_responder_header(r, "traceparent"));
    copy(g_seen.tracestate, sizeof(g_seen.tracestate), sw_responder_header(r, "tracestate"));
    copy(g_seen.custom, sizeof(g_seen.custom), sw_responder_header(r, "x-custom"));
    copy(g_seen.trace_id, sizeof(g_seen.trace_id), sw_responder_trace_id(r));
    g_seen.missing_is_null = sw_responder_header(r, "nope") == NULL;
    pthread_mutex_unlock(&g_seen.mu);
    if (len == 6 && memcmp(p, "noterm", 6) == 0)
        return;
    if (len == 4 && memcmp(p, "slow", 4) == 0)
        swh_sleep_ms(300); /* past the deadline of the stream that asks so */
    (void)sw_responder_send(r, "x", 1);
    (void)sw_responder_finish(r, SW_STATUS_COMPLETED, NULL);
}

static void
log_cb(void *arg, sw_log_level level, const char *msg)
{
    size_t n;
    (void)arg;
    (void)level;
    pthread_mutex_lock(&g_seen.mu);
    n = strlen(g_seen.logs);
    snprintf(g_seen.logs + n, sizeof(g_seen.logs) - n, "%s\n", msg);
    pthread_mutex_unlock(&g_seen.mu);
}

static sw_conn *
conn(void)
{
    sw_conn_opts o;
    sw_conn *c = NULL;
    sw_conn_opts_init(&o);
    o.url = g_nats.url;
    assert_int_equal(sw_conn_open(&c, &o), SW_OK);
    return c;
}

static int
run(sw_router *r, const sw_header *h, size_t n, const char *payload)
{
    sw_request_opts q;
    sw_stream *s;
    const sw_item *it;
    int status;
    sw_request_opts_init(&q);
    q.endpoint = EP;
    q.instance_id = "tw1";
    q.headers = h;
    q.nheaders = n;
    assert_int_equal(sw_router_open(&s, r, &q, payload, strlen(payload)), SW_OK);
    do
        assert_int_equal(sw_stream_next(s, &it, 10000 * swh_slow()), SW_OK);
    while (it->kind == SW_ITEM_DATA);
    status = it->terminal.status;
    sw_stream_close(s);
    return status;
}

/* A worker "inst" on wc (requests older than max_age_ms refused; 0: no
 * limit) and a router on fc, both logging to log_cb. */
static void
pair_start(sw_conn *wc, sw_conn *fc, const char *inst, int64_t max_age_ms, sw_ingress **ing,
           sw_router **r)
{
    sw_ingress_opts io;
    sw_router_opts ro;
    sw_ingress_opts_init(&io);
    io.endpoint = EP;
    io.instance_id = inst;
    io.handler = handler;
    io.log = log_cb;
    io.max_request_age_ms = max_age_ms;
    assert_int_equal(sw_ingress_start(ing, wc, &io), SW_OK);
    sw_router_opts_init(&ro);
    ro.log = log_cb;
    assert_int_equal(sw_router_create(r, fc, &ro), SW_OK);
}

static void
test_headers_and_trace(void **state)
{
    sw_conn *wc = conn(), *fc = conn();
    sw_ingress *ing;
    sw_router *r;
    sw_request_opts q;
    sw_stream *s = NULL;
    const sw_header h[3] = {
        {"traceparent", TRACEPARENT}, {"tracestate", "congo=t61rcWkgMzE"}, {"x-custom", ""}};
    const sw_header bad_tp[1] = {{"traceparent", "00-" TRACE "-0000000000000000-01"}};
    sw_header many[SW_MAX_HEADERS + 1];
    char keys[SW_MAX_HEADERS + 1][8];
    static char big[4098];
    (void)state;
    pair_start(wc, fc, "tw1", 0, &ing, &r);

    /* headers arrive as sent; the trace id is the traceparent's */
    assert_int_equal(run(r, h, 3, "ok"), SW_STATUS_COMPLETED);
    pthread_mutex_lock(&g_seen.mu);
    assert_string_equal(g_seen.traceparent, TRACEPARENT);
    assert_string_equal(g_seen.tracestate, "congo=t61rcWkgMzE");
    assert_string_equal(g_seen.custom, "");
    assert_string_equal(g_seen.trace_id, TRACE);
    assert_true(g_seen.missing_is_null);
    pthread_mutex_unlock(&g_seen.mu);

    /* a log line about the stream carries the trace id: the worker's
     * "released without a terminal" (written as the FAILED goes out, so
     * the frontend may see the terminal first: wait for the line) */
    assert_int_equal(run(r, h, 1, "noterm"), SW_STATUS_FAILED);
    for (int i = 0; i < 500; i++) {
        int found;
        pthread_mutex_lock(&g_seen.mu);
        found = strstr(g_seen.logs, "released without a terminal") != NULL;
        pthread_mutex_unlock(&g_seen.mu);
        if (found)
            break;
        swh_sleep_ms(10);
    }
    pthread_mutex_lock(&g_seen.mu);
    assert_non_null(strstr(g_seen.logs, "released without a terminal"));
    assert_non_null(strstr(g_seen.logs, "trace=" TRACE " released without"));
    pthread_mutex_unlock(&g_seen.mu);

    /* a malformed traceparent (zero parent id) travels, but gives no trace id */
    assert_int_equal(run(r, bad_tp, 1, "ok"), SW_STATUS_COMPLETED);
    pthread_mutex_lock(&g_seen.mu);
    assert_string_equal(g_seen.trace_id, "");
    assert_string_equal(g_seen.traceparent, bad_tp[0].value);
    pthread_mutex_unlock(&g_seen.mu);
    /* no headers at all */
    assert_int_equal(run(r, NULL, 0, "ok"), SW_STATUS_COMPLETED);
    pthread_mutex_lock(&g_seen.mu);
    assert_string_equal(g_seen.traceparent, "(null)");
    assert_string_equal(g_seen.trace_id, "");
    pthread_mutex_unlock(&g_seen.mu);

    /* bounds: refused at open, nothing sent */
    sw_request_opts_init(&q);
    q.endpoint = EP;
    q.instance_id = "tw1";
    for (int i = 0; i <= SW_MAX_HEADERS; i++) {
        snprintf(keys[i], sizeof(keys[i]), "k%d", i);
        many[i].key = keys[i];
        many[i].value = "v";
    }
    q.headers = many;
    q.nheaders = SW_MAX_HEADERS + 1;
    assert_int_equal(sw_router_open(&s, r, &q, "ok", 2), SW_EINVAL);
    assert_null(s);
    q.nheaders = SW_MAX_HEADERS; /* the bound itself is fine */
    assert_int_equal(sw_router_open(&s, r, &q, "ok", 2), SW_OK);
    sw_stream_close(s);
    many[1].key = "k0"; /* duplicate key */
    q.nheaders = 2;
    assert_int_equal(sw_router_open(&s, r, &q, "ok", 2), SW_EINVAL);
    many[1].key = ""; /* empty key */
    assert_int_equal(sw_router_open(&s, r, &q, "ok", 2), SW_EINVAL);
    many[1].key = "k1";
    memset(big, 'a', 4097);
    many[1].value = big; /* a value over 4096 bytes */
    assert_int_equal(sw_router_open(&s, r, &q, "ok", 2), SW_EINVAL);
    many[1].value = NULL;
    assert_int_equal(sw_router_open(&s, r, &q, "ok", 2), SW_EINVAL);
    q.headers = NULL; /* nheaders without headers */
    assert_int_equal(sw_router_open(&s, r, &q, "ok", 2), SW_EINVAL);

    sw_router_destroy(r);
    sw_ingress_destroy(ing);
    sw_conn_close(fc);
    sw_conn_close(wc);
}

/* Waits up to 5 s for `what` in the log lines; 1 if it came. */
static int
logged(const char *what)
{
    for (int i = 0; i < 500; i++) {
        int found;
        pthread_mutex_lock(&g_seen.mu);
        found = strstr(g_seen.logs, what) != NULL;
        pthread_mutex_unlock(&g_seen.mu);
        if (found)
            return 1;
        swh_sleep_ms(10);
    }
    return 0;
}

/* The trace id tags the lines on both sides (streamwire.h, sw_header):
 * the router's line about a stream it ended (deadline_exceeded), and the
 * worker's lines about requests it refused before serving them (issued too
 * long ago; for another endpoint; a reply subject not its router's), which
 * named neither the request nor its trace (the second wrote no line at
 * all). */
static void
test_trace_on_both_sides(void **state)
{
    sw_conn *wc = conn(), *fc = conn(), *ac = conn();
    natsConnection *nc = sw_conn_nats(ac);
    sw_ingress *ing;
    sw_router *r;
    sw_request_opts q;
    sw_stream *s = NULL;
    const sw_item *it;
    const sw_header h[1] = {{"traceparent", TRACEPARENT}};
    /* issued too long ago; for another endpoint; a reply subject of
     * another router's */
    const char *endpoints[3] = {EP, "trc.other.gen", EP};
    const uint64_t issued[3] = {(uint64_t)swi_unix_ms() - 10 * 60 * 1000, 0, 0};
    const char *routers[3] = {"trcr", "trcr", "elsewhere"};
    (void)state;
    pthread_mutex_lock(&g_seen.mu);
    g_seen.logs[0] = '\0';
    pthread_mutex_unlock(&g_seen.mu);
    pair_start(wc, fc, "tw2", 5 * 60 * 1000, &ing, &r);

    /* the router: a stream it ends on its deadline */
    sw_request_opts_init(&q);
    q.endpoint = EP;
    q.instance_id = "tw2";
    q.headers = h;
    q.nheaders = 1;
    q.deadline_ms = 100;
    assert_int_equal(sw_router_open(&s, r, &q, "slow", 4), SW_OK);
    do
        assert_int_equal(sw_stream_next(s, &it, 10000 * swh_slow()), SW_OK);
    while (it->kind == SW_ITEM_DATA);
    assert_int_equal(it->terminal.error, SW_DEADLINE_EXCEEDED);
    sw_stream_close(s);
    if (!logged("trace=" TRACE ": deadline_exceeded"))
        fail_msg("no router line with the trace id; lines:\n%s", g_seen.logs);

    /* the worker: requests refused before they are served, written by hand
     * (a router sends neither) */
    for (int k = 0; k < 3; k++) {
        swp_request m = STREAMWIRE__V1__REQUEST__INIT;
        Streamwire__V1__Request__HeadersEntry tp = STREAMWIRE__V1__REQUEST__HEADERS_ENTRY__INIT;
        Streamwire__V1__Request__HeadersEntry *hv[1] = {&tp};
        uint8_t id[SW_REQUEST_ID_BYTES], *buf = NULL;
        char hex[SW_REQUEST_ID_HEX], resp[SWT_SUBJECT_MAX], subj[SWT_SUBJECT_MAX], line[160];
        size_t len = 0;
        for (int i = 0; i < SW_REQUEST_ID_BYTES; i++)
            id[i] = (uint8_t)(0x40 + 16 * k + i);
        swi_hex(hex, id, SW_REQUEST_ID_BYTES);
        snprintf(resp, sizeof(resp), "sw.rsp.%s.%s", routers[k], hex);
        tp.key = (char *)"traceparent";
        tp.value = (char *)TRACEPARENT;
        m.version = SW_PROTOCOL_VERSION;
        m.request_id.data = id;
        m.request_id.len = SW_REQUEST_ID_BYTES;
        m.response_subject = resp;
        m.router_id = (char *)"trcr"; /* (its own subject: sw.rsp.trcr.<id>) */
        m.credit_window = 16;
        m.heartbeat_ms = 250;
        m.endpoint = (char *)endpoints[k];
        m.issued_unix_ms = issued[k];
        m.n_headers = 1;
        m.headers = hv;
        assert_int_equal(swt_subject_request(subj, sizeof(subj), EP, "tw2"), SW_OK);
        assert_int_equal(swp_encode_alloc(&m, SIZE_MAX, &buf, &len), SW_OK);
        assert_int_equal(natsConnection_PublishRequest(nc, subj, resp, buf, (int)len), NATS_OK);
        free(buf);
        assert_int_equal(natsConnection_Flush(nc), NATS_OK);
        snprintf(line, sizeof(line), "request %s trace=" TRACE " on ", hex);
        if (!logged(line))
            fail_msg("no worker line \"%s...\" for refusal %d; lines:\n%s", line, k, g_seen.logs);
    }
    sw_router_destroy(r);
    sw_ingress_destroy(ing);
    sw_conn_close(ac);
    sw_conn_close(fc);
    sw_conn_close(wc);
}

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

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_headers_and_trace),
        cmocka_unit_test(test_trace_on_both_sides),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
