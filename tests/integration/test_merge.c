/* tests/integration/test_merge.c -- sw_merge (ordered fan-in by processed
 * index, issue 15) over real streams against a real nats-server: chunkers of
 * different sizes, a stream with empty results, a slow stream, a failing
 * stream (the merged result fails with it and the others are cancelled), a
 * stream that never answers (its deadline ends everything), overlapping
 * chunks, and bad headers. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <streamwire/merge.h>
#include <streamwire/streamwire.h>

#include "harness.h"

#define EP "merge.det.gen"
#define T(ms) ((int64_t)(ms)*swh_slow())

static swh_nats g_nats;
static sw_conn *g_wc, *g_fc;
static sw_ingress *g_ing;
static sw_router *g_r;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_cancelled;

/* Payload "chunk total ms fail hang incomplete": items "<i>:<text>" for
 * each chunk boundary i (chunk, 2 chunk, ... up to total), ms apart; fail
 * >= 0: fail after that many items; hang: send nothing until cancelled;
 * incomplete >= 0: finish INCOMPLETE ("max_tokens") after that many items.
 * "raw:<a>|<b>|" sends the listed items as they are. */
static void
handler(sw_responder *r, void *arg)
{
    size_t len;
    const char *p = sw_responder_payload(r, &len);
    char buf[256];
    int chunk = 1, total = 0, ms = 0, fail = -1, hang = 0, incomplete = -1, sent = 0;
    (void)arg;
    if (len >= sizeof(buf))
        len = sizeof(buf) - 1;
    memcpy(buf, p, len);
    buf[len] = '\0';
    if (strncmp(buf, "raw:", 4) == 0) {
        char *save = NULL;
        for (char *t = strtok_r(buf + 4, "|", &save); t != NULL; t = strtok_r(NULL, "|", &save))
            if (sw_responder_send(r, t, strlen(t)) != SW_OK)
                return;
        (void)sw_responder_finish(r, SW_STATUS_COMPLETED, NULL);
        return;
    }
    sscanf(buf, "%d %d %d %d %d %d", &chunk, &total, &ms, &fail, &hang, &incomplete);
    if (hang) {
        while (!sw_responder_cancelled(r))
            swh_sleep_ms(5);
        pthread_mutex_lock(&g_mu);
        g_cancelled++;
        pthread_mutex_unlock(&g_mu);
        return;
    }
    for (int at = chunk; at <= total; at += chunk) {
        char item[64];
        int n;
        if (fail >= 0 && sent == fail) {
            (void)sw_responder_fail(r, "detector_error", "the detector broke");
            return;
        }
        if (incomplete >= 0 && sent == incomplete) {
            (void)sw_responder_finish(r, SW_STATUS_INCOMPLETE, "max_tokens");
            return;
        }
        if (ms > 0 && sent > 0)
            swh_sleep_ms(ms);
        n = snprintf(item, sizeof(item), "%d:d%d", at, chunk);
        if (sw_responder_send(r, item, (size_t)n) != SW_OK) {
            pthread_mutex_lock(&g_mu);
            g_cancelled++;
            pthread_mutex_unlock(&g_mu);
            return;
        }
        sent++;
    }
    (void)sw_responder_finish(r, SW_STATUS_COMPLETED, NULL);
}

/* Waits (up to 3 s) until handlers saw at least n cancels; their count. */
static int
wait_cancelled(int n)
{
    int c = 0;
    for (int i = 0; i < 300; i++) {
        pthread_mutex_lock(&g_mu);
        c = g_cancelled;
        pthread_mutex_unlock(&g_mu);
        if (c >= n)
            break;
        swh_sleep_ms(10);
    }
    return c;
}

static void
reset_cancelled(void)
{
    pthread_mutex_lock(&g_mu);
    g_cancelled = 0;
    pthread_mutex_unlock(&g_mu);
}

static sw_merge *
merge_of(const char *const *payloads, size_t n, int64_t deadline_ms)
{
    sw_merge *m = NULL;
    assert_int_equal(sw_merge_create(&m, NULL), SW_OK);
    for (size_t i = 0; i < n; i++) {
        sw_request_opts q;
        sw_stream *s = NULL;
        sw_request_opts_init(&q);
        q.endpoint = EP;
        q.instance_id = "mw1";
        q.deadline_ms = deadline_ms;
        sw_merge_request_opts(m, &q);
        assert_int_equal(sw_router_open(&s, g_r, &q, payloads[i], strlen(payloads[i])), SW_OK);
        assert_int_equal(sw_merge_add(m, s), SW_OK);
    }
    return m;
}

/* Reads every frame; returns the terminal frame (copied) and the frames'
 * references and per-stream counts. */
typedef struct result {
    uint64_t refs[64];
    size_t counts[64][4];
    size_t nframes;
    sw_merge_frame term;
    char reason[64];
} result;

static void
read_all(sw_merge *m, result *res)
{
    const sw_merge_frame *f;
    memset(res, 0, sizeof(*res));
    for (;;) {
        assert_int_equal(sw_merge_next(m, &f, T(15000)), SW_OK);
        if (f->kind == SW_MERGE_TERMINAL)
            break;
        assert_true(res->nframes < 64);
        res->refs[res->nframes] = f->reference;
        for (size_t i = 0; i < f->nparts && i < 4; i++) {
            res->counts[res->nframes][i] = f->parts[i].nitems;
            for (size_t k = 0; k < f->parts[i].nitems; k++) {
                const sw_merge_item *it = &f->parts[i].items[k];
                assert_true(it->processed_index <= f->reference);
                /* the header is gone: the data is the detector's text */
                assert_true(it->len >= 2 && ((const char *)it->data)[0] == 'd');
            }
        }
        res->nframes++;
    }
    res->term = *f;
    snprintf(res->reason, sizeof(res->reason), "%s", f->terminal.reason);
    assert_int_equal(sw_merge_next(m, &f, 0), SW_EEOF);
}

static void
test_chunk_sizes(void **state)
{
    const char *p[3] = {"1 40 0 -1 0", "5 40 0 -1 0", "20 40 0 -1 0"};
    sw_merge *m = merge_of(p, 3, 0);
    result r;
    (void)state;
    read_all(m, &r);
    assert_int_equal(r.nframes, 2);
    assert_int_equal(r.refs[0], 20);
    assert_int_equal(r.counts[0][0], 20);
    assert_int_equal(r.counts[0][1], 4);
    assert_int_equal(r.counts[0][2], 1);
    assert_int_equal(r.refs[1], 40);
    assert_int_equal(r.counts[1][0], 20);
    assert_int_equal(r.term.terminal.status, SW_STATUS_COMPLETED);
    assert_int_equal(r.term.frames, 2);
    assert_int_equal(r.term.failed_stream, -1);
    sw_merge_destroy(m);
}

static void
test_empty_and_slow(void **state)
{
    /* an empty detector, a slow one (30 ms per chunk), a fast one */
    const char *p[3] = {"10 0 0 -1 0", "10 50 30 -1 0", "5 50 0 -1 0"};
    sw_merge *m = merge_of(p, 3, 0);
    result r;
    int64_t t0 = swh_now_ms();
    (void)state;
    read_all(m, &r);
    assert_int_equal(r.nframes, 5); /* bounded by the slow stream: 10, 20, ... 50 */
    for (size_t i = 0; i < 5; i++) {
        assert_int_equal(r.refs[i], 10 * (i + 1));
        assert_int_equal(r.counts[i][0], 0);
        assert_int_equal(r.counts[i][1], 1);
        assert_int_equal(r.counts[i][2], 2);
    }
    assert_true(swh_now_ms() - t0 >= 4 * 30); /* it waited for the slow one */
    assert_int_equal(r.term.terminal.status, SW_STATUS_COMPLETED);
    sw_merge_destroy(m);
}

static void
test_failing_stream_cancels_the_others(void **state)
{
    const char *p[3] = {"1 100000 2 -1 0", "10 100 0 3 0", "5 100000 2 -1 0"};
    sw_merge *m;
    result r;
    sw_ingress_stats st;
    uint64_t before;
    (void)state;
    reset_cancelled();
    sw_ingress_stats_get(g_ing, &st);
    before = st.cancels;
    m = merge_of(p, 3, 0);
    read_all(m, &r);
    assert_int_equal(r.term.terminal.status, SW_STATUS_FAILED);
    assert_string_equal(r.reason, "detector_error");
    assert_int_equal(r.term.failed_stream, 1);
    sw_merge_destroy(m);
    /* the two long-running detectors were cancelled: seen by their
     * handlers, or (the failing one ends at once; on a loaded machine a
     * cancel may overtake its request) before they started */
    for (int i = 0; i < 300; i++) {
        sw_ingress_stats_get(g_ing, &st);
        if (st.cancels - before >= 2)
            break;
        swh_sleep_ms(10);
    }
    assert_int_equal(st.cancels - before, 2);
    assert_true(wait_cancelled(2) <= 2);
}

/* A stream fails before its first item while the merge waits for another
 * one, silent (a detector still thinking): the failure ends the merged
 * result at once, and the silent stream is cancelled. Before, the merge
 * only read the stream it needed, and the failure waited for that one's
 * first item (here, for ever: no terminal within 5 s). */
static void
test_failure_seen_while_waiting_for_another(void **state)
{
    const char *p[2] = {"1 10 0 -1 1", "10 100 0 0 0"}; /* hangs; fails at once */
    const sw_merge_frame *f = NULL;
    sw_merge *m;
    int64_t t0;
    (void)state;
    reset_cancelled();
    m = merge_of(p, 2, 0);
    t0 = swh_now_ms();
    assert_int_equal(sw_merge_next(m, &f, T(5000)), SW_OK);
    print_message("    merged terminal after %lld ms\n", (long long)(swh_now_ms() - t0));
    assert_int_equal(f->kind, SW_MERGE_TERMINAL);
    assert_int_equal(f->terminal.status, SW_STATUS_FAILED);
    assert_string_equal(f->terminal.reason, "detector_error");
    assert_int_equal(f->failed_stream, 1);
    assert_int_equal(sw_merge_next(m, &f, 0), SW_EEOF);
    assert_int_equal(wait_cancelled(1), 1); /* the silent one */
    sw_merge_destroy(m);
}

/* The same, for a stream that fails after it sent an item: the merge has
 * not read that item (it waits for the silent stream's first), so the
 * failure is queued behind unread data. It still ends the merged result at
 * once, with that stream's own terminal, and the silent stream is
 * cancelled. Before, the merge noticed a failure only with nothing queued
 * before it, and waited for the silent stream (no terminal within 1 s; with
 * a deadline, the silent stream's deadline_exceeded and the wrong
 * failed_stream). */
static void
test_failure_behind_items_seen_while_waiting(void **state)
{
    const char *p[2] = {"1 10 0 -1 1", "10 100 0 1 0"}; /* hangs; 10:d10, then fails */
    const sw_merge_frame *f = NULL;
    sw_merge *m;
    int64_t t0;
    (void)state;
    reset_cancelled();
    m = merge_of(p, 2, 0);
    t0 = swh_now_ms();
    assert_int_equal(sw_merge_next(m, &f, T(1000)), SW_OK);
    print_message("    merged terminal after %lld ms\n", (long long)(swh_now_ms() - t0));
    assert_int_equal(f->kind, SW_MERGE_TERMINAL);
    assert_int_equal(f->terminal.status, SW_STATUS_FAILED);
    assert_string_equal(f->terminal.reason, "detector_error");
    assert_string_equal(f->terminal.message, "the detector broke");
    assert_int_equal(f->failed_stream, 1);
    assert_int_equal(f->frames, 0);
    assert_int_equal(sw_merge_next(m, &f, 0), SW_EEOF);
    assert_int_equal(wait_cancelled(1), 1); /* the silent one */
    sw_merge_destroy(m);
}

/* A stream that ends INCOMPLETE (max_tokens) early does not end the
 * merge (merge.h: only a terminal other than completed or incomplete
 * does, and cancels the others): the frames go on with the other stream
 * up to its end, nobody is cancelled, and the merged terminal is that
 * stream's INCOMPLETE (the first terminal that was not completed). */
static void
test_incomplete_stream_does_not_end_the_merge(void **state)
{
    const char *p[2] = {"1 40 0 -1 0 -1", "5 40 0 -1 0 2"};
    sw_merge *m;
    result r;
    (void)state;
    reset_cancelled();
    m = merge_of(p, 2, 0);
    read_all(m, &r);
    assert_true(r.nframes >= 2);
    assert_int_equal(r.refs[r.nframes - 1], 40); /* the other stream to its end */
    {
        size_t got0 = 0, got1 = 0;
        for (size_t i = 0; i < r.nframes; i++) {
            got0 += r.counts[i][0];
            got1 += r.counts[i][1];
        }
        assert_int_equal(got0, 40);
        assert_int_equal(got1, 2); /* 5:, 10: then INCOMPLETE */
    }
    assert_int_equal(r.term.terminal.status, SW_STATUS_INCOMPLETE);
    assert_string_equal(r.reason, "max_tokens");
    assert_int_equal(r.term.failed_stream, 1);
    assert_int_equal(r.term.frames, r.nframes);
    sw_merge_destroy(m);
    swh_sleep_ms(200);
    pthread_mutex_lock(&g_mu);
    assert_int_equal(g_cancelled, 0);
    pthread_mutex_unlock(&g_mu);
}

/* A stream whose first index is 10^9 while another counts up from 1: the
 * merge must hold every item of the second until it reaches 10^9, which
 * max_queued_bytes does not allow -- the merged result ends with
 * payload_too_large (failed_stream: the stream whose item went over) and
 * the stream still running is cancelled. Before, the merge kept reading
 * and queueing without a bound. */
static void
test_far_index_is_bounded(void **state)
{
    const char *p[2] = {"raw:1000000000:dfar|", "1 100000 0 -1 0"};
    sw_merge_opts mo;
    sw_merge *m = NULL;
    const sw_merge_frame *f;
    (void)state;
    reset_cancelled();
    sw_merge_opts_init(&mo);
    assert_int_equal(mo.max_queued_bytes, SW_MERGE_MAX_QUEUED_DEFAULT);
    mo.max_queued_bytes = 64 * 1024;
    assert_int_equal(sw_merge_create(&m, &mo), SW_OK);
    for (size_t i = 0; i < 2; i++) {
        sw_request_opts q;
        sw_stream *s = NULL;
        sw_request_opts_init(&q);
        q.endpoint = EP;
        q.instance_id = "mw1";
        sw_merge_request_opts(m, &q);
        assert_int_equal(sw_router_open(&s, g_r, &q, p[i], strlen(p[i])), SW_OK);
        assert_int_equal(sw_merge_add(m, s), SW_OK);
    }
    assert_int_equal(sw_merge_next(m, &f, T(15000)), SW_OK);
    assert_int_equal(f->kind, SW_MERGE_TERMINAL); /* no frame could be made */
    assert_int_equal(f->terminal.status, SW_STATUS_ERROR);
    assert_int_equal(f->terminal.error, SW_EMSGSIZE);
    assert_string_equal(f->terminal.reason, "payload_too_large");
    assert_int_equal(f->failed_stream, 1);
    assert_int_equal(f->frames, 0);
    assert_int_equal(sw_merge_next(m, &f, 0), SW_EEOF);
    sw_merge_destroy(m);
    /* the counting detector was cancelled (>=: a hanging detector of the test
     * before may notice its own cancel late) */
    assert_true(wait_cancelled(1) >= 1);
}

static void
test_silent_stream_ends_at_its_deadline(void **state)
{
    const char *p[2] = {"5 20 0 -1 0", "5 20 0 -1 1"};
    sw_merge *m = merge_of(p, 2, 400);
    result r;
    int64_t t0 = swh_now_ms();
    (void)state;
    read_all(m, &r);
    assert_int_equal(r.nframes, 0); /* nothing complete without the silent one */
    assert_int_equal(r.term.terminal.status, SW_STATUS_ERROR);
    assert_int_equal(r.term.terminal.error, SW_DEADLINE_EXCEEDED);
    assert_int_equal(r.term.failed_stream, 1);
    assert_true(swh_now_ms() - t0 < T(3000));
    sw_merge_destroy(m);
}

static void
test_overlapping_and_ranges(void **state)
{
    /* start-processed headers; stream 0 overlaps itself (0-10, 5-8, 8-20) */
    const char *p[2] = {"raw:0-10:da|5-8:db|8-20:dc|", "raw:0-20:dz|"};
    sw_merge *m = merge_of(p, 2, 0);
    const sw_merge_frame *f;
    (void)state;
    assert_int_equal(sw_merge_next(m, &f, T(10000)), SW_OK);
    assert_int_equal(f->kind, SW_MERGE_FRAME);
    assert_int_equal(f->reference, 20);
    assert_int_equal(f->parts[0].nitems, 3);
    assert_int_equal(f->parts[0].items[1].start_index, 5);
    assert_int_equal(f->parts[0].items[1].processed_index, 8);
    assert_memory_equal(f->parts[0].items[2].data, "dc", 2);
    assert_int_equal(f->parts[1].nitems, 1);
    assert_int_equal(sw_merge_next(m, &f, T(10000)), SW_OK);
    assert_int_equal(f->kind, SW_MERGE_TERMINAL);
    assert_int_equal(f->terminal.status, SW_STATUS_COMPLETED);
    sw_merge_destroy(m);
}

/* Overlapping chunks where nothing makes the merge read stream 0 past 0-10
 * before the first frame (the other stream is at 10 too): 5-8 comes with the
 * next frame, whose reference stays 10. Before, that frame's reference was
 * 8, below the first one's (a consumer that cuts its text at the reference,
 * as cmd/fanout.c does, went back). */
static void
test_overlapping_item_after_its_frame(void **state)
{
    const char *p[2] = {"raw:0-10:da|5-8:db|", "raw:0-10:dz|"};
    sw_merge *m = merge_of(p, 2, 0);
    result r;
    (void)state;
    read_all(m, &r);
    for (size_t i = 1; i < r.nframes; i++)
        assert_true(r.refs[i] >= r.refs[i - 1]); /* references never decrease */
    assert_int_equal(r.nframes, 2);
    assert_int_equal(r.refs[0], 10);
    assert_int_equal(r.counts[0][0], 1); /* 0-10 */
    assert_int_equal(r.counts[0][1], 1);
    assert_int_equal(r.refs[1], 10);
    assert_int_equal(r.counts[1][0], 1); /* 5-8 */
    assert_int_equal(r.counts[1][1], 0);
    assert_int_equal(r.term.terminal.status, SW_STATUS_COMPLETED);
    assert_int_equal(r.term.frames, 2);
    sw_merge_destroy(m);
}

static void
test_bad_header_is_decode_error(void **state)
{
    const char *p[2] = {"raw:12:dok|no header here|", "raw:30:dz|"};
    sw_merge *m = merge_of(p, 2, 0);
    result r;
    uint64_t s0, pi;
    size_t skip;
    sw_item it;
    (void)state;
    read_all(m, &r);
    assert_int_equal(r.term.terminal.status, SW_STATUS_ERROR);
    assert_int_equal(r.term.terminal.error, SW_DECODE_ERROR);
    assert_int_equal(r.term.failed_stream, 0);
    sw_merge_destroy(m);
    /* the default header reader itself */
    memset(&it, 0, sizeof(it));
    it.data = "99999999999999999999999:x";
    it.len = strlen(it.data);
    assert_int_equal(sw_merge_index_header(&it, &s0, &pi, &skip, NULL), -1); /* > 20 digits */
    it.data = "7-12:abc";
    it.len = 8;
    assert_int_equal(sw_merge_index_header(&it, &s0, &pi, &skip, NULL), 0);
    assert_int_equal(s0, 7);
    assert_int_equal(pi, 12);
    assert_int_equal(skip, 5);
    it.data = "12";
    it.len = 2;
    assert_int_equal(sw_merge_index_header(&it, &s0, &pi, &skip, NULL), -1); /* no colon */
}

static void
test_api_errors(void **state)
{
    sw_merge *m = NULL;
    const sw_merge_frame *f;
    (void)state;
    assert_int_equal(sw_merge_create(NULL, NULL), SW_EINVAL);
    assert_int_equal(sw_merge_create(&m, NULL), SW_OK);
    assert_int_equal(sw_merge_next(m, &f, 0), SW_EINVAL); /* no stream */
    assert_int_equal(sw_merge_add(m, NULL), SW_EINVAL);
    sw_merge_destroy(m);
    sw_merge_destroy(NULL);

    /* max_streams reached: SW_EBUSY; an add after the first sw_merge_next:
     * SW_EINVAL. A refused stream stays the caller's (closed here). */
    {
        sw_merge_opts mo;
        sw_request_opts q;
        sw_stream *s[3] = {NULL, NULL, NULL};
        sw_merge_opts_init(&mo);
        mo.max_streams = 1;
        assert_int_equal(sw_merge_create(&m, &mo), SW_OK);
        for (int i = 0; i < 3; i++) {
            sw_request_opts_init(&q);
            q.endpoint = EP;
            q.instance_id = "mw1";
            sw_merge_request_opts(m, &q);
            assert_int_equal(sw_router_open(&s[i], g_r, &q, "1 3 0 -1 0", 10), SW_OK);
        }
        assert_int_equal(sw_merge_add(m, s[0]), SW_OK);
        assert_int_equal(sw_merge_add(m, s[1]), SW_EBUSY);
        sw_stream_close(s[1]);
        assert_int_equal(sw_merge_next(m, &f, T(5000)), SW_OK);
        assert_int_equal(sw_merge_add(m, s[2]), SW_EINVAL);
        sw_stream_close(s[2]);
        sw_merge_destroy(m);
    }
}

static int
group_setup(void **state)
{
    sw_conn_opts co;
    sw_ingress_opts io;
    sw_router_opts ro;
    (void)state;
    if (swh_nats_start(&g_nats, NULL) != 0)
        return -1;
    sw_conn_opts_init(&co);
    co.url = g_nats.url;
    if (sw_conn_open(&g_wc, &co) != SW_OK || sw_conn_open(&g_fc, &co) != SW_OK)
        return -1;
    sw_ingress_opts_init(&io);
    io.endpoint = EP;
    io.instance_id = "mw1";
    io.handler = handler;
    io.handler_threads = 8;
    if (sw_ingress_start(&g_ing, g_wc, &io) != SW_OK)
        return -1;
    sw_router_opts_init(&ro);
    return sw_router_create(&g_r, g_fc, &ro) == SW_OK ? 0 : -1;
}

static int
group_teardown(void **state)
{
    (void)state;
    sw_router_destroy(g_r);
    sw_ingress_destroy(g_ing);
    sw_conn_close(g_fc);
    sw_conn_close(g_wc);
    swh_nats_stop(&g_nats);
    return 0;
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunk_sizes),
        cmocka_unit_test(test_empty_and_slow),
        cmocka_unit_test(test_failing_stream_cancels_the_others),
        cmocka_unit_test(test_failure_seen_while_waiting_for_another),
        cmocka_unit_test(test_failure_behind_items_seen_while_waiting),
        cmocka_unit_test(test_incomplete_stream_does_not_end_the_merge),
        cmocka_unit_test(test_silent_stream_ends_at_its_deadline),
        cmocka_unit_test(test_far_index_is_bounded),
        cmocka_unit_test(test_overlapping_and_ranges),
        cmocka_unit_test(test_overlapping_item_after_its_frame),
        cmocka_unit_test(test_bad_header_is_decode_error),
        cmocka_unit_test(test_api_errors),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
