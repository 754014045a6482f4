/* tests/integration/test_hostile.c -- the audit's reproductions (issue 11):
 * peers that ignore credit, cancel at once, choose huge values, forge
 * controls and reply subjects. Each peer that misbehaves is written by hand
 * with nats.c; the side under test is the real library, over a real
 * nats-server.
 *
 * Every test here failed before its fix; the comment on each names the
 * defect. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <cmocka.h>

#include <nats/nats.h>
#include <streamwire/registry.h>
#include <streamwire/streamwire.h>

#include "common/sw_common.h"
#include "harness.h"
#include "ingress/chaos.h"
#include "proto/sw_codec.h"
#include "transport/sw_transport.h"

#define EP "hostile.llm.generate"

static swh_nats g_nats;

#define T(ms) ((int64_t)(ms)*swh_slow())

/* ---------------------------------------------------------------- helpers */

static sw_conn *
conn_open(void)
{
    sw_conn_opts o;
    sw_conn *c = NULL;
    sw_conn_opts_init(&o);
    o.url = g_nats.url;
    assert_int_equal(sw_conn_open(&c, &o), SW_OK);
    return c;
}

static sw_router *
router_new(sw_conn *c, unsigned window)
{
    sw_router_opts o;
    sw_router *r = NULL;
    sw_router_opts_init(&o);
    o.credit_window = window;
    assert_int_equal(sw_router_create(&r, c, &o), SW_OK);
    return r;
}

static void
hex_to_id(const char *hex, uint8_t id[SW_REQUEST_ID_BYTES])
{
    for (int i = 0; i < SW_REQUEST_ID_BYTES; i++) {
        unsigned v;
        assert_int_equal(sscanf(hex + 2 * i, "%2x", &v), 1);
        id[i] = (uint8_t)v;
    }
}

static void
raw_item(natsConnection *nc, const char *subj, const uint8_t *id, uint64_t seq, const char *data,
         int final)
{
    assert_int_equal(swh_raw_item(nc, subj, id, seq, data, final), NATS_OK);
}

/* A fake worker on instance `inst`: waits for one request, returns it. */
static swp_request *
fake_worker_take(natsSubscription *sub)
{
    natsMsg *m = NULL;
    swp_request *req = NULL;
    assert_int_equal(natsSubscription_NextMsg(&m, sub, (int64_t)T(5000)), NATS_OK);
    assert_int_equal(swp_decode_request((const uint8_t *)natsMsg_GetData(m),
                                        (size_t)natsMsg_GetDataLength(m), 1 << 20, &req),
                     SW_OK);
    natsMsg_Destroy(m);
    return req;
}

static natsSubscription *
fake_worker_sub(natsConnection *nc, const char *inst)
{
    char subj[SWT_SUBJECT_MAX];
    natsSubscription *sub = NULL;
    assert_int_equal(swt_subject_request(subj, sizeof(subj), EP, inst), SW_OK);
    assert_int_equal(natsConnection_SubscribeSync(&sub, nc, subj), NATS_OK);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    return sub;
}

/* Reads a stream to its terminal: the data seqs into seqs[] (count in *n),
 * the terminal into *term (its strings are not kept). */
static void
read_all(sw_stream *s, uint64_t *seqs, size_t cap, size_t *n, sw_terminal *term)
{
    const sw_item *it;
    *n = 0;
    for (;;) {
        sw_err rv = sw_stream_next(s, &it, T(10000));
        assert_int_equal(rv, SW_OK);
        if (it->kind == SW_ITEM_TERMINAL) {
            *term = it->terminal;
            return;
        }
        if (*n < cap)
            seqs[*n] = it->seq;
        (*n)++;
    }
}

/* A fake worker on instance inst (its own connection) and a router with
 * credit window `window` (another): the stream opened, with on_item (may
 * be NULL: blocking), and its request taken. */
typedef struct fake_env {
    sw_conn *fc, *wc;
    natsConnection *nc;
    natsSubscription *sub;
    sw_router *r;
    sw_stream *s;
    swp_request *req;
    uint8_t id[SW_REQUEST_ID_BYTES];
} fake_env;

static void
fake_open(fake_env *f, const char *inst, unsigned window, sw_item_fn on_item, void *arg)
{
    sw_request_opts q;
    f->fc = conn_open();
    f->wc = conn_open();
    f->nc = sw_conn_nats(f->wc);
    f->sub = fake_worker_sub(f->nc, inst);
    f->r = router_new(f->fc, window);
    f->s = NULL;
    sw_request_opts_init(&q);
    q.endpoint = EP;
    q.instance_id = inst;
    q.on_item = on_item;
    q.on_item_arg = arg;
    assert_int_equal(sw_router_open(&f->s, f->r, &q, "p", 1), SW_OK);
    f->req = fake_worker_take(f->sub);
    memcpy(f->id, f->req->request_id.data, sizeof(f->id));
}

static void
fake_close(fake_env *f)
{
    swp_free(f->req);
    sw_stream_close(f->s);
    sw_router_destroy(f->r);
    natsSubscription_Destroy(f->sub);
    sw_conn_close(f->wc);
    sw_conn_close(f->fc);
}

/* ------------------------------------------------ #1 credit is enforced */

/* A worker that ignores credit sends 50,000 items on a stream whose window
 * is 16 while the consumer reads nothing. Before: every one was queued
 * (+54 MB). Now: the items within the credit are delivered, the stream
 * ends with flow_violation, and no more than the window was ever queued. */
static void
credit_overrun_ends_with_flow_violation(void **state)
{
    fake_env f;
    sw_stream_stats st;
    uint64_t seqs[64];
    size_t n;
    sw_terminal term;
    (void)state;
    fake_open(&f, "fake-credit", 16, NULL, NULL);
    assert_int_equal(f.req->credit_window, 16);
    for (uint64_t seq = 1; seq <= 50000; seq++)
        raw_item(f.nc, f.req->response_subject, f.id, seq, "0123456789abcdef0123456789abcdef", 0);
    assert_int_equal(natsConnection_Flush(f.nc), NATS_OK);
    read_all(f.s, seqs, 64, &n, &term);
    assert_int_equal(term.status, SW_STATUS_ERROR);
    assert_int_equal(term.error, SW_FLOW_VIOLATION);
    assert_true(n <= 16);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(seqs[i], i + 1);
    sw_stream_stats_get(f.s, &st);
    assert_true(st.peak_pending <= 16);
    fake_close(&f);
}

/* ------------------------------------------------ #13 held beyond a final */

/* Item 3 arrives first (held: a gap), then the final at seq 2, then item 1.
 * Item 3 is past the final: the stream ends with item_after_final as soon
 * as the final shows it, not with a silent drop of the held item and
 * "completed". */
static void
held_item_beyond_final_is_item_after_final(void **state)
{
    fake_env f;
    uint64_t seqs[8];
    size_t n;
    sw_terminal term;
    (void)state;
    fake_open(&f, "fake-held", 16, NULL, NULL);
    raw_item(f.nc, f.req->response_subject, f.id, 3, "three", 0);
    raw_item(f.nc, f.req->response_subject, f.id, 2, NULL, 1);
    raw_item(f.nc, f.req->response_subject, f.id, 1, "one", 0);
    assert_int_equal(natsConnection_Flush(f.nc), NATS_OK);
    read_all(f.s, seqs, 8, &n, &term);
    /* The violation is known once the final arrives: item 1 may or may not
     * have been delivered before, and nothing after it. */
    assert_true(n <= 1);
    if (n == 1)
        assert_int_equal(seqs[0], 1);
    assert_int_equal(term.status, SW_STATUS_ERROR);
    assert_int_equal(term.error, SW_ITEM_AFTER_FINAL);
    fake_close(&f);
}

/* ------------------------------------------------ a final carries no data */

/* A worker sends item 1, then a final wrapper of its own (seq 2) whose body
 * is data. The decoder took it and the frontend made it the stream's final,
 * ignoring its data: the consumer got item 1 and "completed", the last
 * chunk lost without a word (a batched final with data was refused). Now
 * such a final is a decode_error, as in a batch: item 1, then decode_error,
 * and nothing else. */
static void
final_with_data_is_a_decode_error(void **state)
{
    fake_env f;
    swp_item w = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__INIT;
    swp_terminal t = STREAMWIRE__V1__TERMINAL__INIT;
    uint64_t seqs[8];
    uint8_t buf[256];
    size_t n, len;
    sw_terminal term;
    sw_stream_stats st;
    (void)state;
    fake_open(&f, "fake-final-data", 16, NULL, NULL);
    raw_item(f.nc, f.req->response_subject, f.id, 1, "one", 0);
    w.version = SW_PROTOCOL_VERSION;
    w.request_id = f.req->request_id;
    w.seq = 2;
    w.complete_final = 1;
    t.status = STREAMWIRE__V1__STATUS__STATUS_COMPLETED;
    t.finish_reason = (char *)"stop";
    w.terminal = &t;
    w.body_case = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_DATA;
    w.data.data = (uint8_t *)"the last chunk";
    w.data.len = strlen("the last chunk");
    assert_int_equal(swp_encode(&w, buf, sizeof(buf), &len), SW_OK);
    assert_int_equal(natsConnection_Publish(f.nc, f.req->response_subject, buf, (int)len), NATS_OK);
    assert_int_equal(natsConnection_Flush(f.nc), NATS_OK);
    read_all(f.s, seqs, 8, &n, &term);
    assert_int_equal(n, 1);
    assert_int_equal(seqs[0], 1);
    assert_int_equal(term.status, SW_STATUS_ERROR);
    assert_int_equal(term.error, SW_DECODE_ERROR);
    assert_string_equal(term.reason, "decode_error");
    sw_stream_stats_get(f.s, &st);
    assert_int_equal(st.items, 1);
    fake_close(&f);
}

/* ------------------------------------------------ several items a message */

/* What a callback consumer got: the data seqs in order, the terminal. */
typedef struct seq_cb {
    uint64_t seqs[16];
    size_t n;
    int terminals; /* (atomic: the test thread polls it) */
    sw_status status;
} seq_cb;

static void
collect_seqs(sw_stream *s, const sw_item *it, void *arg)
{
    seq_cb *c = arg;
    (void)s;
    if (it->kind == SW_ITEM_TERMINAL) {
        c->status = it->terminal.status;
        __atomic_add_fetch(&c->terminals, 1, __ATOMIC_RELEASE);
        return;
    }
    if (c->n < 16)
        c->seqs[c->n++] = it->seq;
}

/* As collect_seqs, and cancels the stream on its first data item. */
static void
cancel_on_first(sw_stream *s, const sw_item *it, void *arg)
{
    seq_cb *c = arg;
    collect_seqs(s, it, arg);
    if (it->kind == SW_ITEM_DATA && c->n == 1)
        assert_int_equal(sw_stream_cancel(s), SW_OK);
}

/* One message on f's response subject: a wrapper of seq `seq` with data,
 * and batched entries seqs[0..nb) (the last one a final if `final`). */
static void
publish_batch(const fake_env *f, uint64_t seq, const uint64_t *seqs, size_t nb, int final)
{
    swp_item w = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__INIT;
    swp_batched b[4], *bp[4];
    swp_terminal t = STREAMWIRE__V1__TERMINAL__INIT;
    uint8_t buf[512];
    size_t len;
    assert_true(nb <= 4);
    w.version = SW_PROTOCOL_VERSION;
    w.request_id = f->req->request_id;
    w.seq = seq;
    w.body_case = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_DATA;
    w.data.data = (uint8_t *)"d";
    w.data.len = 1;
    t.status = STREAMWIRE__V1__STATUS__STATUS_COMPLETED;
    t.finish_reason = (char *)"stop";
    for (size_t k = 0; k < nb; k++) {
        streamwire__v1__batched_item__init(&b[k]);
        b[k].seq = seqs[k];
        if (final && k + 1 == nb) {
            b[k].complete_final = 1;
            b[k].terminal = &t;
        } else {
            b[k].data.data = (uint8_t *)"d";
            b[k].data.len = 1;
        }
        bp[k] = &b[k];
    }
    w.n_batch = nb;
    w.batch = nb ? bp : NULL;
    assert_int_equal(swp_encode(&w, buf, sizeof(buf), &len), SW_OK);
    assert_int_equal(natsConnection_Publish(f->nc, f->req->response_subject, buf, (int)len),
                     NATS_OK);
    assert_int_equal(natsConnection_Flush(f->nc), NATS_OK);
}

/* One message carries items 1 and 2 and the final (3). The callback
 * cancels on item 1, while the rest of that message is still to be fed:
 * the stream drops item 2 and the final, yet the final answers the
 * cancel, so the router does not send CANCEL again (it would after 100,
 * 300 and 700 ms, to a worker that has finished). */
static void
cancel_in_callback_mid_message_is_answered_by_its_final(void **state)
{
    fake_env f;
    natsSubscription *ctl = NULL;
    seq_cb cb;
    char subj[SWT_SUBJECT_MAX];
    static const uint64_t two_final3[2] = {2, 3};
    int cancels = 0;
    int64_t t0;
    (void)state;
    memset(&cb, 0, sizeof(cb));
    fake_open(&f, "fake-midcancel", 16, cancel_on_first, &cb);
    assert_int_equal(swt_subject_control(subj, sizeof(subj), "fake-midcancel"), SW_OK);
    assert_int_equal(natsConnection_SubscribeSync(&ctl, f.nc, subj), NATS_OK);
    assert_int_equal(natsConnection_Flush(f.nc), NATS_OK);
    t0 = swh_now_ms();
    publish_batch(&f, 1, two_final3, 2, 1);
    /* The controls for 500 ms after the message: the one CANCEL, nothing
     * again (a repeat would come 100 ms after it). */
    for (;;) {
        natsMsg *m = NULL;
        swp_control *c = NULL;
        int64_t left = t0 + T(500) - swh_now_ms();
        if (left <= 0 || natsSubscription_NextMsg(&m, ctl, left) != NATS_OK)
            break;
        if (swp_decode_control((const uint8_t *)natsMsg_GetData(m),
                               (size_t)natsMsg_GetDataLength(m), 1 << 20, &c) == SW_OK) {
            if (c->kind == STREAMWIRE__V1__CONTROL_KIND__CONTROL_CANCEL &&
                c->request_id.len == SW_REQUEST_ID_BYTES &&
                memcmp(c->request_id.data, f.id, SW_REQUEST_ID_BYTES) == 0)
                cancels++;
            swp_free(c);
        }
        natsMsg_Destroy(m);
    }
    assert_int_equal(cb.n, 1); /* nothing after the cancel */
    assert_int_equal(cb.seqs[0], 1);
    assert_int_equal(__atomic_load_n(&cb.terminals, __ATOMIC_ACQUIRE), 1);
    assert_int_equal(cb.status, SW_STATUS_CANCELLED);
    assert_int_equal(cancels, 1);
    natsSubscription_Destroy(ctl);
    fake_close(&f);
}

/* Messages that fill a gap and carry a duplicate and new items at once,
 * to a callback consumer (which is handed items as they are fed): every
 * item once, in order, then the terminal. After 1 and 2, seq 4 comes
 * first (held), then one message of 3 (which readies 3 and the held 4),
 * 4 again and 5, then 6 with the final. */
static void
items_in_order_across_gap_fill_and_duplicate(void **state)
{
    fake_env f;
    sw_stream_stats st;
    seq_cb cb;
    static const uint64_t two[1] = {2}, four_five[2] = {4, 5}, final7[1] = {7};
    int64_t t0;
    (void)state;
    memset(&cb, 0, sizeof(cb));
    fake_open(&f, "fake-order", 16, collect_seqs, &cb);
    publish_batch(&f, 1, two, 1, 0);  /* 1, 2 */
    publish_batch(&f, 4, NULL, 0, 0); /* 4: held */
    publish_batch(&f, 3, four_five, 2, 0);
    publish_batch(&f, 6, final7, 1, 1); /* 6, final */
    t0 = swh_now_ms();
    while (__atomic_load_n(&cb.terminals, __ATOMIC_ACQUIRE) == 0 && swh_now_ms() - t0 < T(5000))
        swh_sleep_ms(5);
    assert_int_equal(__atomic_load_n(&cb.terminals, __ATOMIC_ACQUIRE), 1);
    assert_int_equal(cb.status, SW_STATUS_COMPLETED);
    assert_int_equal(cb.n, 6);
    for (size_t k = 0; k < cb.n; k++)
        assert_int_equal(cb.seqs[k], k + 1);
    sw_stream_stats_get(f.s, &st);
    assert_int_equal(st.duplicates, 1);
    assert_int_equal(st.reordered, 1);
    fake_close(&f);
}

/* ------------------------------------------------ worker side */

typedef struct engine {
    pthread_mutex_t mu;
    int started, cancelled, ended, send_errors;
    sw_err last_err;
    int tokens; /* per stream */
    int delay_ms;
    int cancel_cbs; /* cancel callbacks fired (each handler registers one) */
    int item_bytes; /* > 0: each item is this long ("token-<i>" padded with x) */
} engine;

static void
engine_on_cancel(sw_responder *r, void *arg)
{
    engine *e = arg;
    (void)r;
    pthread_mutex_lock(&e->mu);
    e->cancel_cbs++;
    pthread_mutex_unlock(&e->mu);
}

static void
engine_handler(sw_responder *r, void *arg)
{
    engine *e = arg;
    int cancelled = 0;
    sw_err rv = SW_OK;
    pthread_mutex_lock(&e->mu);
    e->started++;
    pthread_mutex_unlock(&e->mu);
    sw_responder_on_cancel(r, engine_on_cancel, e);
    for (int i = 0; i < e->tokens; i++) {
        char tok[1024];
        int len = snprintf(tok, sizeof(tok), "token-%d", i);
        if (e->item_bytes > len && e->item_bytes <= (int)sizeof(tok)) {
            memset(tok + len, 'x', (size_t)(e->item_bytes - len));
            len = e->item_bytes;
        }
        rv = sw_responder_send(r, tok, (size_t)len);
        if (rv != SW_OK)
            break;
        if (e->delay_ms)
            swh_sleep_ms(e->delay_ms);
    }
    cancelled = rv == SW_ECANCELLED || sw_responder_cancelled(r);
    if (rv == SW_OK)
        rv = sw_responder_finish(r, SW_STATUS_COMPLETED, "stop");
    pthread_mutex_lock(&e->mu);
    e->ended++;
    e->cancelled += cancelled;
    if (rv != SW_OK && !cancelled) {
        e->send_errors++;
        e->last_err = rv;
    }
    pthread_mutex_unlock(&e->mu);
}

/* Starts a worker on engine e; its sw_ingress_start result. */
static sw_err
ingress_try(sw_conn *c, const char *inst, engine *e, unsigned send_timeout_ms,
            sw_duration max_request_age_ms, sw_ingress **out)
{
    sw_ingress_opts o;
    sw_ingress_opts_init(&o);
    o.endpoint = EP;
    o.instance_id = inst;
    o.handler = engine_handler;
    o.handler_arg = e;
    o.send_timeout_ms = send_timeout_ms;
    o.max_inflight = 4096;
    o.max_request_age_ms = max_request_age_ms;
    return sw_ingress_start(out, c, &o);
}

static sw_ingress *
ingress_new(sw_conn *c, const char *inst, engine *e, unsigned send_timeout_ms)
{
    sw_ingress *ing = NULL;
    assert_int_equal(ingress_try(c, inst, e, send_timeout_ms, 0, &ing), SW_OK);
    return ing;
}

static void
engine_snapshot(engine *e, engine *out)
{
    pthread_mutex_lock(&e->mu);
    *out = *e;
    pthread_mutex_unlock(&e->mu);
}

/* ------------------------------------------------ #2 no cancel is lost */

/* A cancel sent right after open used to be dropped about half the time
 * (the CANCEL reached the worker before its request): those handlers ran
 * until credit ran out and then held a slot for send_timeout. Now every
 * handler that starts sees the cancel, or none starts: after the trials,
 * every started handler has ended, cancelled. Some trials run while the
 * worker is busy with other streams. */
typedef struct load_arg {
    sw_stream *s;
    size_t items;
} load_arg;

static void *
load_reader(void *arg)
{
    load_arg *a = arg;
    const sw_item *it;
    while (sw_stream_next(a->s, &it, 30000) == SW_OK && it->kind == SW_ITEM_DATA)
        a->items++;
    return NULL;
}

static void
immediate_cancel_reaches_or_prevents(void **state)
{
    sw_conn *fc = conn_open(), *wc = conn_open();
    engine e;
    sw_ingress *ing;
    sw_router *r = router_new(fc, 16);
    sw_request_opts q;
    engine snap;
    int64_t until;
    const int trials = 10000;
    engine le;
    sw_ingress *ling;
    sw_conn *lc = conn_open();
    sw_router *lr = router_new(lc, 256);
    load_arg la = {NULL, 0};
    pthread_t lt;
    (void)state;
    memset(&e, 0, sizeof(e));
    pthread_mutex_init(&e.mu, NULL);
    e.tokens = 100000;
    e.delay_ms = 1;
    ing = ingress_new(wc, "w-cancel", &e, 60000);
    /* The load: a fast stream on the same worker connection, read by a
     * thread, during the second half of the trials. */
    memset(&le, 0, sizeof(le));
    pthread_mutex_init(&le.mu, NULL);
    le.tokens = 200000;
    ling = ingress_new(wc, "w-load", &le, 60000);
    sw_request_opts_init(&q);
    q.endpoint = EP;
    q.instance_id = "w-cancel";
    for (int i = 0; i < trials; i++) {
        sw_stream *s = NULL;
        if (i == trials / 2) {
            sw_request_opts lq;
            sw_request_opts_init(&lq);
            lq.endpoint = EP;
            lq.instance_id = "w-load";
            assert_int_equal(sw_router_open(&la.s, lr, &lq, "p", 1), SW_OK);
            assert_int_equal(pthread_create(&lt, NULL, load_reader, &la), 0);
        }
        assert_int_equal(sw_router_open(&s, r, &q, "p", 1), SW_OK);
        assert_int_equal(sw_stream_cancel(s), SW_OK);
        sw_stream_close(s);
    }
    print_message("load stream: %zu items read during the trials\n", la.items);
    sw_stream_cancel(la.s);
    pthread_join(lt, NULL);
    sw_stream_close(la.s);
    sw_router_destroy(lr);
    sw_ingress_destroy(ling);
    sw_conn_close(lc);
    pthread_mutex_destroy(&le.mu);
    until = swh_now_ms() + T(15000);
    do {
        swh_sleep_ms(20);
        engine_snapshot(&e, &snap);
    } while ((snap.ended < snap.started) && swh_now_ms() < until);
    print_message("%d trials: %d handlers started, %d ended (%d of them cancelled)\n", trials,
                  snap.started, snap.ended, snap.cancelled);
    assert_int_equal(snap.ended, snap.started);
    assert_int_equal(snap.cancelled, snap.started);
    sw_router_destroy(r);
    sw_ingress_destroy(ing);
    sw_conn_close(wc);
    sw_conn_close(fc);
    pthread_mutex_destroy(&e.mu);
}

/* ------------------------------------------------ raw frontends */

/* Publishes a request to `inst` as a hand-written frontend would, issued
 * at `issued` (Request.issued_unix_ms; 0: not set). */
static void
raw_request_at(natsConnection *nc, const char *inst, const uint8_t *id, const char *resp,
               const char *router, uint32_t window, uint32_t hb_ms, uint64_t issued)
{
    swp_request m = STREAMWIRE__V1__REQUEST__INIT;
    char subj[SWT_SUBJECT_MAX];
    uint8_t *buf = NULL;
    size_t len = 0;
    m.version = SW_PROTOCOL_VERSION;
    m.request_id.data = (uint8_t *)(uintptr_t)id;
    m.request_id.len = SW_REQUEST_ID_BYTES;
    m.response_subject = (char *)resp;
    m.router_id = (char *)router;
    m.credit_window = window;
    m.heartbeat_ms = hb_ms;
    m.endpoint = (char *)EP;
    m.issued_unix_ms = issued;
    assert_int_equal(swt_subject_request(subj, sizeof(subj), EP, inst), SW_OK);
    assert_int_equal(swp_encode_alloc(&m, SIZE_MAX, &buf, &len), SW_OK);
    assert_int_equal(natsConnection_PublishRequest(nc, subj, resp, buf, (int)len), NATS_OK);
    free(buf);
}

static void
raw_request(natsConnection *nc, const char *inst, const uint8_t *id, const char *resp,
            const char *router, uint32_t window, uint32_t hb_ms)
{
    raw_request_at(nc, inst, id, resp, router, window, hb_ms, 0);
}

static void
raw_control(natsConnection *nc, const char *inst, const uint8_t *id, const char *router, int kind,
            uint64_t limit, uint64_t ack)
{
    swp_control c = STREAMWIRE__V1__CONTROL__INIT;
    char subj[SWT_SUBJECT_MAX];
    uint8_t buf[256];
    size_t len;
    c.version = SW_PROTOCOL_VERSION;
    c.request_id.data = (uint8_t *)(uintptr_t)id;
    c.request_id.len = SW_REQUEST_ID_BYTES;
    c.kind = (Streamwire__V1__ControlKind)kind;
    c.router_id = (char *)router;
    c.credit_limit = limit;
    c.ack_seq = ack;
    assert_int_equal(swt_subject_control(subj, sizeof(subj), inst), SW_OK);
    assert_int_equal(swp_encode(&c, buf, sizeof(buf), &len), SW_OK);
    assert_int_equal(natsConnection_Publish(nc, subj, buf, (int)len), NATS_OK);
}

static void
new_id(uint8_t id[SW_REQUEST_ID_BYTES], char hex[SW_REQUEST_ID_HEX])
{
    for (int i = 0; i < SW_REQUEST_ID_BYTES; i++)
        id[i] = (uint8_t)(rand() & 0xff);
    swi_hex(hex, id, SW_REQUEST_ID_BYTES);
}

/* n requests of new ids from router fe (window 16), each answered on
 * fe's response subject, flushed. */
static void
raw_requests(natsConnection *nc, const char *inst, const char *fe, int n, uint32_t hb_ms)
{
    for (int i = 0; i < n; i++) {
        uint8_t id[SW_REQUEST_ID_BYTES];
        char hex[SW_REQUEST_ID_HEX], resp[SWT_SUBJECT_MAX];
        new_id(id, hex);
        assert_int_equal(swt_subject_response(resp, sizeof(resp), fe, hex), SW_OK);
        raw_request(nc, inst, id, resp, fe, 16, hb_ms);
    }
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
}

/* Waits (a few seconds) until n handlers have started; the count. */
static int
wait_started(engine *e, int n)
{
    int started = 0;
    for (int i = 0; i < 5 * 200 * swh_slow(); i++) {
        pthread_mutex_lock(&e->mu);
        started = e->started;
        pthread_mutex_unlock(&e->mu);
        if (started >= n)
            break;
        swh_sleep_ms(10);
    }
    return started;
}

/* Answers the worker's probes of frontend `router` as a router does (the
 * answer echoes the probe's id), so that its streams outlive its first
 * probe: a raw frontend that answers none is gone at once (no responders),
 * and its held finals with it. */
static void
answer_probe(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *arg)
{
    swp_control *c = NULL;
    swp_probe_reply p = STREAMWIRE__V1__PROBE_REPLY__INIT;
    uint8_t buf[128];
    size_t len;
    (void)sub;
    p.version = SW_PROTOCOL_VERSION;
    p.instance_id = (char *)arg;
    if (swp_decode_control((const uint8_t *)natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m),
                           4096, &c) == SW_OK)
        p.probe_id = c->probe_id;
    swp_free(c);
    if (natsMsg_GetReply(m) != NULL && swp_encode(&p, buf, sizeof(buf), &len) == SW_OK)
        (void)natsConnection_Publish(nc, natsMsg_GetReply(m), buf, (int)len);
    natsMsg_Destroy(m);
}

static natsSubscription *
probe_answerer(natsConnection *nc, const char *router)
{
    natsSubscription *sub = NULL;
    char subj[SWT_SUBJECT_MAX];
    assert_int_equal(swt_subject_router(subj, sizeof(subj), router), SW_OK);
    assert_int_equal(natsConnection_Subscribe(&sub, nc, subj, answer_probe, (void *)router),
                     NATS_OK);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    return sub;
}

/* An ACK_FINALS from `router` for the stream with this id. */
static void
raw_ack_finals(natsConnection *nc, const char *inst, const uint8_t *id, const char *router)
{
    swp_control c = STREAMWIRE__V1__CONTROL__INIT;
    ProtobufCBinaryData ids[1];
    char subj[SWT_SUBJECT_MAX];
    uint8_t buf[256];
    size_t len;
    ids[0].data = (uint8_t *)(uintptr_t)id;
    ids[0].len = SW_REQUEST_ID_BYTES;
    c.version = SW_PROTOCOL_VERSION;
    c.kind = STREAMWIRE__V1__CONTROL_KIND__CONTROL_ACK_FINALS;
    c.router_id = (char *)router;
    c.n_final_acks = 1;
    c.final_acks = ids;
    assert_int_equal(swt_subject_control(subj, sizeof(subj), inst), SW_OK);
    assert_int_equal(swp_encode(&c, buf, sizeof(buf), &len), SW_OK);
    assert_int_equal(natsConnection_Publish(nc, subj, buf, (int)len), NATS_OK);
}

/* Returns once `inst` has handled the controls published on nc before: a
 * PROBE naming no stream, answered by the control subscription, which
 * takes its messages one at a time, in order. Its answer comes on the
 * probe-answer subject of the router it names, "sync" (a worker answers a
 * probe nowhere else). */
static void
controls_handled(natsConnection *nc, const char *inst)
{
    swp_control c = STREAMWIRE__V1__CONTROL__INIT;
    char subj[SWT_SUBJECT_MAX], reply[SWT_SUBJECT_MAX];
    uint8_t buf[128];
    size_t len;
    natsSubscription *sub = NULL;
    natsMsg *m = NULL;
    c.version = SW_PROTOCOL_VERSION;
    c.kind = STREAMWIRE__V1__CONTROL_KIND__CONTROL_PROBE;
    c.router_id = (char *)"sync";
    c.probe_id = 7;
    assert_int_equal(swt_subject_control(subj, sizeof(subj), inst), SW_OK);
    assert_int_equal(swt_subject_probe_reply(reply, sizeof(reply), "sync", inst), SW_OK);
    assert_int_equal(swp_encode(&c, buf, sizeof(buf), &len), SW_OK);
    assert_int_equal(natsConnection_SubscribeSync(&sub, nc, reply), NATS_OK);
    assert_int_equal(natsConnection_PublishRequest(nc, subj, reply, buf, (int)len), NATS_OK);
    assert_int_equal(natsSubscription_NextMsg(&m, sub, (int64_t)T(5000)), NATS_OK);
    natsMsg_Destroy(m);
    natsSubscription_Destroy(sub);
}

/* ------------------------------------------------ #4 held streams bounded */

/* 3,000 requests ask for a 1-hour heartbeat and never acknowledge their
 * finals. Before: each finished stream was held for 4 hours, +102 MB, and
 * nothing capped their number. Now the heartbeat is clamped and the number
 * of finished streams held for an acknowledgement is capped. */
static void
unacked_finals_are_bounded(void **state)
{
    sw_conn *wc = conn_open(), *fc = conn_open();
    natsConnection *nc = sw_conn_nats(fc);
    engine e;
    sw_ingress *ing;
    sw_ingress_stats st;
    int64_t until;
    (void)state;
    memset(&e, 0, sizeof(e));
    pthread_mutex_init(&e.mu, NULL);
    e.tokens = 1;
    ing = ingress_new(wc, "w-held", &e, 1000);
    raw_requests(nc, "w-held", "rawfe", 3000, SWP_MAX_HEARTBEAT_MS);
    until = swh_now_ms() + T(20000);
    do {
        swh_sleep_ms(50);
        sw_ingress_stats_get(ing, &st);
    } while (st.finished[SW_STATUS_COMPLETED] < 3000 && swh_now_ms() < until);
    assert_int_equal(st.finished[SW_STATUS_COMPLETED], 3000);
    /* Once every final is on the wire (none in flight), all the streams the
     * worker still holds are finished ones waiting for an ack: capped. */
    do {
        sw_ingress_stats_get(ing, &st);
        if (st.inflight == 0)
            break;
        swh_sleep_ms(20);
    } while (swh_now_ms() < until);
    assert_int_equal(st.inflight, 0);
    print_message("finished streams held for an ack: %llu\n", (unsigned long long)st.streams_held);
    assert_true(st.streams_held <= SW_INGRESS_MAX_HELD_DEFAULT);
    assert_int_equal(st.finals_dropped + st.streams_held, 3000); /* each let go is counted */
    {
        /* The frontend's use count in the liveness table follows: a final
         * let go for room counts down like any stream unregistered (or the
         * frontend, which answers no probe, was dropped whole: 0). */
        unsigned users = 0;
        (void)swx_ingress_frontends(ing, "rawfe", &users);
        print_message("streams counted for the frontend: %u\n", users);
        assert_true(users <= st.streams_held);
    }
    sw_ingress_destroy(ing);
    sw_conn_close(fc);
    sw_conn_close(wc);
    pthread_mutex_destroy(&e.mu);
}

/* The same with max_held_finals set (10): at most that many finished
 * streams are held for an ack, and every one let go is counted, exactly.
 * The frontend answers the worker's probes, so none is let go with it:
 * once the last final is out, 10 are held and 2,990 were dropped. */
static void
held_finals_follow_max_held_finals(void **state)
{
    enum { N = 3000, MAX_HELD = 10 };
    sw_conn *wc = conn_open(), *fc = conn_open();
    natsConnection *nc = sw_conn_nats(fc);
    natsSubscription *ans = probe_answerer(nc, "rawhf");
    engine e;
    sw_ingress_opts o;
    sw_ingress *ing = NULL;
    sw_ingress_stats st;
    unsigned users = 0;
    int64_t until;
    (void)state;
    memset(&e, 0, sizeof(e));
    pthread_mutex_init(&e.mu, NULL);
    e.tokens = 1;
    sw_ingress_opts_init(&o);
    o.endpoint = EP;
    o.instance_id = "w-held10";
    o.handler = engine_handler;
    o.handler_arg = &e;
    o.send_timeout_ms = 1000;
    o.max_inflight = 4096;
    o.max_held_finals = MAX_HELD;
    assert_int_equal(sw_ingress_start(&ing, wc, &o), SW_OK);
    raw_requests(nc, "w-held10", "rawhf", N, SWP_MAX_HEARTBEAT_MS);
    until = swh_now_ms() + T(20000);
    do {
        swh_sleep_ms(50);
        sw_ingress_stats_get(ing, &st);
        assert_true(st.streams_held <= st.inflight + MAX_HELD); /* never more finished ones */
    } while ((st.finished[SW_STATUS_COMPLETED] < N || st.inflight > 0) && swh_now_ms() < until);
    assert_int_equal(st.finished[SW_STATUS_COMPLETED], N);
    assert_int_equal(st.inflight, 0);
    print_message("held for an ack: %llu, let go for room: %llu\n",
                  (unsigned long long)st.streams_held, (unsigned long long)st.finals_dropped);
    assert_int_equal(st.streams_held, MAX_HELD);
    assert_int_equal(st.finals_dropped, N - MAX_HELD);
    assert_int_equal(st.frontends_lost, 0);
    (void)swx_ingress_frontends(ing, "rawhf", &users);
    assert_int_equal(users, MAX_HELD); /* probed for the held ones alone */
    sw_ingress_destroy(ing);
    natsSubscription_Destroy(ans);
    sw_conn_close(fc);
    sw_conn_close(wc);
    pthread_mutex_destroy(&e.mu);
}

/* A stream killed while the held list is full (a frontend that never
 * acknowledges, or a lost frontend's streams killed all at once) must not
 * push out another stream's held final: a killed stream has no final to
 * resend and leaves the table at once. It used to join the list for that
 * moment, and each kill let go of the oldest held final (finals_dropped:
 * one per kill), whose frontend could then not have it sent again. */
static void
kills_do_not_push_out_held_finals(void **state)
{
    /* KILLED: the handler pool's 4 threads (the default), each held by a
     * stream waiting for credit */
    enum { HELD = SW_INGRESS_MAX_HELD_DEFAULT, KILLED = 4 };
    sw_conn *wc = conn_open(), *fc = conn_open();
    natsConnection *nc = sw_conn_nats(fc);
    engine e, snap;
    sw_ingress *ing;
    sw_ingress_stats st;
    uint8_t ids[KILLED][SW_REQUEST_ID_BYTES];
    int64_t until;
    (void)state;
    memset(&e, 0, sizeof(e));
    pthread_mutex_init(&e.mu, NULL);
    e.tokens = 2;
    ing = ingress_new(wc, "w-kills", &e, (unsigned)T(10000));
    /* The held list filled: finished streams whose finals nobody acks. */
    raw_requests(nc, "w-kills", "rawfe", HELD, 1000);
    until = swh_now_ms() + T(20000);
    do {
        swh_sleep_ms(20);
        sw_ingress_stats_get(ing, &st);
    } while ((st.streams_held < HELD || st.inflight > 0) && swh_now_ms() < until);
    assert_int_equal(st.streams_held, HELD);
    assert_int_equal(st.finals_dropped, 0);
    /* Streams waiting for credit (a window of 1, two items), then killed. */
    for (int i = 0; i < KILLED; i++) {
        char hex[SW_REQUEST_ID_HEX], resp[SWT_SUBJECT_MAX];
        new_id(ids[i], hex);
        assert_int_equal(swt_subject_response(resp, sizeof(resp), "rawfe", hex), SW_OK);
        raw_request(nc, "w-kills", ids[i], resp, "rawfe", 1, 1000);
    }
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    until = swh_now_ms() + T(5000);
    do {
        swh_sleep_ms(20);
        engine_snapshot(&e, &snap);
    } while (snap.started < HELD + KILLED && swh_now_ms() < until);
    assert_int_equal(snap.started, HELD + KILLED);
    for (int i = 0; i < KILLED; i++)
        raw_control(nc, "w-kills", ids[i], "rawfe", STREAMWIRE__V1__CONTROL_KIND__CONTROL_KILL, 0,
                    0);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    do {
        swh_sleep_ms(20);
        engine_snapshot(&e, &snap);
    } while (snap.ended < HELD + KILLED && swh_now_ms() < until);
    assert_int_equal(snap.ended, HELD + KILLED);
    assert_int_equal(snap.cancelled, KILLED);
    sw_ingress_stats_get(ing, &st);
    print_message("after %d kills: held finals %llu, let go for room %llu\n", KILLED,
                  (unsigned long long)st.streams_held, (unsigned long long)st.finals_dropped);
    assert_int_equal(st.finals_dropped, 0);
    assert_int_equal(st.streams_held, HELD);
    sw_ingress_destroy(ing);
    sw_conn_close(fc);
    sw_conn_close(wc);
    pthread_mutex_destroy(&e.mu);
}

/* ------------------------------------------------ held finals keep no request */

/* A request of `plen` bytes of payload (all 'p') and one header, from
 * router fe, window `window`, heartbeat 1 s. */
static void
raw_request_payload(natsConnection *nc, const char *inst, const uint8_t *id, const char *fe,
                    uint32_t window, size_t plen)
{
    swp_request m = STREAMWIRE__V1__REQUEST__INIT;
    Streamwire__V1__Request__HeadersEntry h = STREAMWIRE__V1__REQUEST__HEADERS_ENTRY__INIT;
    Streamwire__V1__Request__HeadersEntry *hs[1] = {&h};
    char subj[SWT_SUBJECT_MAX], resp[SWT_SUBJECT_MAX], hex[SW_REQUEST_ID_HEX];
    uint8_t *buf = NULL, *pl = malloc(plen);
    size_t len = 0;
    assert_non_null(pl);
    memset(pl, 'p', plen);
    swi_hex(hex, id, SW_REQUEST_ID_BYTES);
    assert_int_equal(swt_subject_response(resp, sizeof(resp), fe, hex), SW_OK);
    h.key = (char *)"x-tenant";
    h.value = (char *)"acme";
    m.version = SW_PROTOCOL_VERSION;
    m.request_id.data = (uint8_t *)(uintptr_t)id;
    m.request_id.len = SW_REQUEST_ID_BYTES;
    m.response_subject = resp;
    m.router_id = (char *)fe;
    m.credit_window = window;
    m.heartbeat_ms = 1000;
    m.endpoint = (char *)EP;
    m.payload.data = pl;
    m.payload.len = plen;
    m.n_headers = 1;
    m.headers = hs;
    assert_int_equal(swt_subject_request(subj, sizeof(subj), EP, inst), SW_OK);
    assert_int_equal(swp_encode_alloc(&m, SIZE_MAX, &buf, &len), SW_OK);
    assert_int_equal(natsConnection_PublishRequest(nc, subj, resp, buf, (int)len), NATS_OK);
    free(buf);
    free(pl);
}

/* A finished stream whose final waits for its frontend's ack (up to
 * 4 x heartbeat + 2 s, up to max_held_finals of them) kept its request's
 * payload and headers until it left the table, although nobody may read
 * them after the responder's release: 600 such streams of 900 KiB
 * requests held 537 MB. They are freed at the release now. 20 finished
 * streams of 900 KiB requests, never acknowledged, and one still running
 * (waiting for credit): before, the ingress kept 21 requests' bytes; now
 * only the running one's, and nothing once it finishes too. */
static void
held_finals_keep_no_request(void **state)
{
    enum { HELD = 20, PLEN = 900 * 1024 };
    sw_conn *wc = conn_open(), *fc = conn_open();
    natsConnection *nc = sw_conn_nats(fc);
    natsSubscription *ans = probe_answerer(nc, "plfe");
    engine e, snap;
    sw_ingress *ing;
    sw_ingress_stats st;
    uint8_t live[SW_REQUEST_ID_BYTES];
    char hex[SW_REQUEST_ID_HEX];
    uint64_t running, held, done;
    int64_t until;
    (void)state;
    memset(&e, 0, sizeof(e));
    pthread_mutex_init(&e.mu, NULL);
    e.tokens = 2;
    ing = ingress_new(wc, "w-plen", &e, (unsigned)T(10000));
    /* a window of 1: the handler waits for credit after its first item */
    new_id(live, hex);
    raw_request_payload(nc, "w-plen", live, "plfe", 1, PLEN);
    for (int i = 0; i < HELD; i++) {
        uint8_t id[SW_REQUEST_ID_BYTES];
        new_id(id, hex);
        raw_request_payload(nc, "w-plen", id, "plfe", 16, PLEN);
    }
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    until = swh_now_ms() + T(10000);
    do {
        swh_sleep_ms(10);
        engine_snapshot(&e, &snap);
    } while ((snap.started < HELD + 1 || snap.ended < HELD) && swh_now_ms() < until);
    swh_sleep_ms(50); /* (the last handler's return releases its responder) */
    sw_ingress_stats_get(ing, &st);
    running = swx_ingress_request_bytes(ing);
    assert_int_equal(snap.started, HELD + 1);
    assert_int_equal(snap.ended, HELD);
    assert_int_equal(st.finished[SW_STATUS_COMPLETED], HELD);
    assert_int_equal(st.streams_held, HELD + 1); /* the finished ones wait for their acks */
    /* Its own frontend's credit: the last one finishes, held too. */
    raw_control(nc, "w-plen", live, "plfe", STREAMWIRE__V1__CONTROL_KIND__CONTROL_CREDIT, 10, 1);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    do {
        swh_sleep_ms(10);
        engine_snapshot(&e, &snap);
    } while (snap.ended < HELD + 1 && swh_now_ms() < until);
    swh_sleep_ms(50);
    sw_ingress_stats_get(ing, &st);
    held = st.streams_held;
    done = swx_ingress_request_bytes(ing);
    print_message("%d finished streams held for their acks and 1 running, requests of %d bytes: "
                  "the ingress keeps %llu bytes of requests (%.1f requests); all %llu finished: "
                  "%llu bytes\n",
                  HELD, PLEN, (unsigned long long)running, (double)running / PLEN,
                  (unsigned long long)held, (unsigned long long)done);
    assert_int_equal(held, HELD + 1);
    /* the running one's payload, and its header block (two pointers and
     * "x-tenant", "acme") */
    assert_int_equal(running, PLEN + 2 * sizeof(char *) + sizeof("x-tenant") + sizeof("acme"));
    assert_int_equal(done, 0);
    sw_ingress_destroy(ing);
    natsSubscription_Destroy(ans);
    sw_conn_close(fc);
    sw_conn_close(wc);
    pthread_mutex_destroy(&e.mu);
}

/* ------------------------------------------------ refused requests replayed */

/* A request the worker refused without running it was not remembered (only
 * accepted ones were): the same request replayed once the worker had room
 * ran. Now a refused id is remembered as a served one is: a request
 * answered "overloaded" (max_inflight 1, taken by a stream waiting for
 * credit) and one whose CANCEL came first are each sent again, the same
 * bytes, after the worker has room: neither runs, both count as replays. */
static void
refused_request_replayed_does_not_run(void **state)
{
    sw_conn *wc = conn_open(), *fc = conn_open();
    natsConnection *nc = sw_conn_nats(fc);
    natsSubscription *ans = probe_answerer(nc, "rffe");
    sw_ingress_opts o;
    engine e, snap;
    sw_ingress *ing = NULL;
    sw_ingress_stats st;
    uint8_t busy[SW_REQUEST_ID_BYTES], over[SW_REQUEST_ID_BYTES], early[SW_REQUEST_ID_BYTES];
    char hex[SW_REQUEST_ID_HEX];
    int64_t until;
    (void)state;
    memset(&e, 0, sizeof(e));
    pthread_mutex_init(&e.mu, NULL);
    e.tokens = 2;
    sw_ingress_opts_init(&o);
    o.endpoint = EP;
    o.instance_id = "w-refused";
    o.handler = engine_handler;
    o.handler_arg = &e;
    o.send_timeout_ms = (sw_duration)T(10000);
    o.max_inflight = 1;
    assert_int_equal(sw_ingress_start(&ing, wc, &o), SW_OK);
    /* window 1: it waits for credit after its first item, in flight */
    new_id(busy, hex);
    raw_request_payload(nc, "w-refused", busy, "rffe", 1, 16);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    assert_int_equal(wait_started(&e, 1), 1);
    new_id(over, hex);
    raw_request_payload(nc, "w-refused", over, "rffe", 16, 16);
    /* a CANCEL from its router, then its request */
    new_id(early, hex);
    raw_control(nc, "w-refused", early, "rffe", STREAMWIRE__V1__CONTROL_KIND__CONTROL_CANCEL, 0, 0);
    controls_handled(nc, "w-refused");
    raw_request_payload(nc, "w-refused", early, "rffe", 16, 16);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    until = swh_now_ms() + T(5000);
    do {
        swh_sleep_ms(10);
        sw_ingress_stats_get(ing, &st);
    } while ((st.rejected_overload < 1 || st.cancels < 1) && swh_now_ms() < until);
    assert_int_equal(st.rejected_overload, 1);
    assert_int_equal(st.cancels, 1);
    /* room again: the busy one gets its credit and finishes */
    raw_control(nc, "w-refused", busy, "rffe", STREAMWIRE__V1__CONTROL_KIND__CONTROL_CREDIT, 10, 1);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    do {
        swh_sleep_ms(10);
        sw_ingress_stats_get(ing, &st);
    } while (st.inflight > 0 && swh_now_ms() < until);
    assert_int_equal(st.inflight, 0);
    /* the two refused requests again, as recorded */
    raw_request_payload(nc, "w-refused", over, "rffe", 16, 16);
    raw_request_payload(nc, "w-refused", early, "rffe", 16, 16);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    do {
        swh_sleep_ms(10);
        sw_ingress_stats_get(ing, &st);
        engine_snapshot(&e, &snap);
    } while (st.replays + st.requests < 3 && swh_now_ms() < until);
    swh_sleep_ms(100); /* (a handler would have started by now) */
    sw_ingress_stats_get(ing, &st);
    engine_snapshot(&e, &snap);
    print_message("replayed after the worker had room: an overloaded and an early-cancelled "
                  "request: handlers started %d (1 = only the first request), requests %llu, "
                  "replays %llu, overloaded %llu\n",
                  snap.started, (unsigned long long)st.requests, (unsigned long long)st.replays,
                  (unsigned long long)st.rejected_overload);
    assert_int_equal(snap.started, 1);
    assert_int_equal(st.requests, 1);
    assert_int_equal(st.replays, 2);
    assert_int_equal(st.rejected_overload, 1);
    assert_int_equal(st.cancels, 1);
    sw_ingress_destroy(ing);
    natsSubscription_Destroy(ans);
    sw_conn_close(fc);
    sw_conn_close(wc);
    pthread_mutex_destroy(&e.mu);
}

/* ------------------------------------------------ #12 checked controls */

/* A CANCEL that names another router than the stream's is ignored: the
 * stream completes with every item. Before: it was cancelled. */
static void
forged_cancel_from_other_router_is_ignored(void **state)
{
    sw_conn *fc = conn_open(), *wc = conn_open(), *ac = conn_open();
    engine e;
    sw_ingress *ing;
    sw_router *r = router_new(fc, 64);
    sw_request_opts q;
    sw_stream *s = NULL;
    uint8_t id[SW_REQUEST_ID_BYTES];
    uint64_t seqs[64];
    size_t n;
    sw_terminal term;
    sw_ingress_stats st;
    (void)state;
    memset(&e, 0, sizeof(e));
    pthread_mutex_init(&e.mu, NULL);
    e.tokens = 40;
    e.delay_ms = 5;
    ing = ingress_new(wc, "w-forge", &e, 5000);
    sw_request_opts_init(&q);
    q.endpoint = EP;
    q.instance_id = "w-forge";
    assert_int_equal(sw_router_open(&s, r, &q, "p", 1), SW_OK);
    hex_to_id(sw_stream_request_id(s), id);
    assert_int_equal(wait_started(&e, 1), 1); /* (registered: the forgeries find it) */
    raw_control(sw_conn_nats(ac), "w-forge", id, "evil",
                STREAMWIRE__V1__CONTROL_KIND__CONTROL_CANCEL, 0, 0);
    raw_control(sw_conn_nats(ac), "w-forge", id, "evil", STREAMWIRE__V1__CONTROL_KIND__CONTROL_KILL,
                0, 0);
    natsConnection_Flush(sw_conn_nats(ac));
    read_all(s, seqs, 64, &n, &term);
    assert_int_equal(term.status, SW_STATUS_COMPLETED);
    assert_int_equal(n, 40);
    sw_ingress_stats_get(ing, &st);
    assert_int_equal(st.bad_controls, 2);
    assert_int_equal(st.cancels, 0);
    sw_stream_close(s);
    sw_router_destroy(r);
    sw_ingress_destroy(ing);
    sw_conn_close(ac);
    sw_conn_close(wc);
    sw_conn_close(fc);
    pthread_mutex_destroy(&e.mu);
}

/* A CANCEL for a request not seen yet is remembered so that the request,
 * arriving after it, never starts; the memory was keyed by the request id
 * alone, and its take checks the router. A forged CANCEL naming another
 * router ("evil") first took the id's place: the genuine CANCEL's entry
 * was then a no-op, the take found evil's, and the request ran. Now the
 * entries are keyed by (id, router): the request is cancelled before it
 * starts, counted once in cancels. */
static void
forged_early_cancel_does_not_take_the_place(void **state)
{
    sw_conn *wc = conn_open(), *fc = conn_open();
    natsConnection *nc = sw_conn_nats(fc);
    natsSubscription *ans = probe_answerer(nc, "efe");
    engine e, snap;
    sw_ingress *ing;
    sw_ingress_stats st;
    uint8_t id[SW_REQUEST_ID_BYTES];
    char hex[SW_REQUEST_ID_HEX];
    int64_t until;
    (void)state;
    memset(&e, 0, sizeof(e));
    pthread_mutex_init(&e.mu, NULL);
    e.tokens = 1;
    ing = ingress_new(wc, "w-early", &e, 5000);
    new_id(id, hex);
    raw_control(nc, "w-early", id, "evil", STREAMWIRE__V1__CONTROL_KIND__CONTROL_CANCEL, 0, 0);
    raw_control(nc, "w-early", id, "efe", STREAMWIRE__V1__CONTROL_KIND__CONTROL_CANCEL, 0, 0);
    controls_handled(nc, "w-early");
    raw_request_payload(nc, "w-early", id, "efe", 16, 16);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    until = swh_now_ms() + T(3000);
    do {
        swh_sleep_ms(10);
        sw_ingress_stats_get(ing, &st);
        engine_snapshot(&e, &snap);
    } while (st.cancels + st.requests < 1 && swh_now_ms() < until);
    swh_sleep_ms(100); /* (a handler would have started by now) */
    sw_ingress_stats_get(ing, &st);
    engine_snapshot(&e, &snap);
    print_message("CANCEL from evil, then from the request's router, then the request: "
                  "handler started %d, cancels %llu, requests %llu\n",
                  snap.started, (unsigned long long)st.cancels, (unsigned long long)st.requests);
    assert_int_equal(snap.started, 0);
    assert_int_equal(st.cancels, 1);
    assert_int_equal(st.requests, 0);
    sw_ingress_destroy(ing);
    natsSubscription_Destroy(ans);
    sw_conn_close(fc);
    sw_conn_close(wc);
    pthread_mutex_destroy(&e.mu);
}

/* A frontend repeats a KILL (5 sends in all) and a CANCEL until it hears
 * the stream is over; after a KILL nothing more comes. Each repeat found
 * no stream and was remembered as an early cancel for 30 s (16,384 at
 * most): above ~546 kills a second they pushed out the cancels of requests
 * still on their way. A cancel for a request the worker has served (or
 * refused) is no longer remembered: after a stream's KILL and 4 repeats,
 * and a CANCEL of a finished stream, the memory is empty; a cancel for a
 * request not seen yet is still remembered. */
static void
kill_repeats_are_not_early_cancels(void **state)
{
    sw_conn *wc = conn_open(), *fc = conn_open();
    natsConnection *nc = sw_conn_nats(fc);
    natsSubscription *ans = probe_answerer(nc, "kfe");
    engine e, snap;
    sw_ingress *ing;
    sw_ingress_stats st;
    uint8_t killed[SW_REQUEST_ID_BYTES], done[SW_REQUEST_ID_BYTES], early[SW_REQUEST_ID_BYTES];
    char hex[SW_REQUEST_ID_HEX];
    size_t after_repeats, after_early;
    int64_t until;
    (void)state;
    memset(&e, 0, sizeof(e));
    pthread_mutex_init(&e.mu, NULL);
    e.tokens = 2;
    ing = ingress_new(wc, "w-kills2", &e, (unsigned)T(10000));
    /* one waits for credit (window 1), one finishes */
    new_id(killed, hex);
    raw_request_payload(nc, "w-kills2", killed, "kfe", 1, 16);
    new_id(done, hex);
    raw_request_payload(nc, "w-kills2", done, "kfe", 16, 16);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    until = swh_now_ms() + T(5000);
    do {
        swh_sleep_ms(10);
        engine_snapshot(&e, &snap);
    } while ((snap.started < 2 || snap.ended < 1) && swh_now_ms() < until);
    assert_int_equal(snap.started, 2);
    assert_int_equal(snap.ended, 1);
    for (int i = 0; i < 5; i++)
        raw_control(nc, "w-kills2", killed, "kfe", STREAMWIRE__V1__CONTROL_KIND__CONTROL_KILL, 0,
                    0);
    raw_ack_finals(nc, "w-kills2", done, "kfe");
    controls_handled(nc, "w-kills2");
    raw_control(nc, "w-kills2", done, "kfe", STREAMWIRE__V1__CONTROL_KIND__CONTROL_CANCEL, 0, 0);
    controls_handled(nc, "w-kills2");
    after_repeats = swx_ingress_early_cancels(ing);
    new_id(early, hex);
    raw_control(nc, "w-kills2", early, "kfe", STREAMWIRE__V1__CONTROL_KIND__CONTROL_CANCEL, 0, 0);
    controls_handled(nc, "w-kills2");
    after_early = swx_ingress_early_cancels(ing);
    sw_ingress_stats_get(ing, &st);
    print_message("a KILL sent 5 times and a CANCEL of a finished stream: %zu early cancels "
                  "remembered; with one for a request not seen yet: %zu\n",
                  after_repeats, after_early);
    assert_int_equal(st.cancels, 1);
    assert_int_equal(st.streams_held, 0);
    assert_int_equal(after_repeats, 0);
    assert_int_equal(after_early, 1);
    do {
        swh_sleep_ms(10);
        engine_snapshot(&e, &snap);
    } while (snap.ended < 2 && swh_now_ms() < until);
    assert_int_equal(snap.cancelled, 1);
    sw_ingress_destroy(ing);
    natsSubscription_Destroy(ans);
    sw_conn_close(fc);
    sw_conn_close(wc);
    pthread_mutex_destroy(&e.mu);
}

/* Every control that names another frontend than its stream's is ignored
 * and counted in bad_controls, once: a CANCEL, a KILL, a CREDIT and a PROBE
 * naming a live stream, and an ACK_FINALS naming it once its final waits
 * for an ack (the stream stays held until its own frontend's ACK_FINALS).
 * The foreign ACK_FINALS used to go uncounted. */
static void
forged_controls_are_counted(void **state)
{
    sw_conn *wc = conn_open(), *fc = conn_open();
    natsConnection *nc = sw_conn_nats(fc);
    natsSubscription *ans = probe_answerer(nc, "rawfc");
    engine e, snap;
    sw_ingress *ing;
    sw_ingress_stats st;
    uint8_t id[SW_REQUEST_ID_BYTES];
    char hex[SW_REQUEST_ID_HEX], resp[SWT_SUBJECT_MAX];
    int64_t until;
    (void)state;
    memset(&e, 0, sizeof(e));
    pthread_mutex_init(&e.mu, NULL);
    e.tokens = 2;
    ing = ingress_new(wc, "w-count", &e, (unsigned)T(10000));
    new_id(id, hex);
    assert_int_equal(swt_subject_response(resp, sizeof(resp), "rawfc", hex), SW_OK);
    /* a window of 1: the handler waits for credit after its first item */
    raw_request(nc, "w-count", id, resp, "rawfc", 1, 1000);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    assert_int_equal(wait_started(&e, 1), 1);
    raw_control(nc, "w-count", id, "evil", STREAMWIRE__V1__CONTROL_KIND__CONTROL_CANCEL, 0, 0);
    raw_control(nc, "w-count", id, "evil", STREAMWIRE__V1__CONTROL_KIND__CONTROL_KILL, 0, 0);
    raw_control(nc, "w-count", id, "evil", STREAMWIRE__V1__CONTROL_KIND__CONTROL_CREDIT, 100, 1);
    raw_control(nc, "w-count", id, "evil", STREAMWIRE__V1__CONTROL_KIND__CONTROL_PROBE, 0, 0);
    controls_handled(nc, "w-count");
    sw_ingress_stats_get(ing, &st);
    assert_int_equal(st.bad_controls, 4);
    assert_int_equal(st.cancels, 0);
    engine_snapshot(&e, &snap);
    assert_int_equal(snap.ended, 0); /* still waiting: the forged credit was not taken */
    /* Its own frontend's credit: it finishes, its final held for an ack. */
    raw_control(nc, "w-count", id, "rawfc", STREAMWIRE__V1__CONTROL_KIND__CONTROL_CREDIT, 10, 1);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    until = swh_now_ms() + T(5000);
    do {
        swh_sleep_ms(10);
        sw_ingress_stats_get(ing, &st);
    } while ((st.finished[SW_STATUS_COMPLETED] < 1 || st.inflight > 0) && swh_now_ms() < until);
    assert_int_equal(st.finished[SW_STATUS_COMPLETED], 1);
    assert_int_equal(st.inflight, 0);
    assert_int_equal(st.streams_held, 1);
    /* Its own frontend's CANCEL, crossing the final on the wire: the
     * stream has finished, so nothing is cancelled, counted or called
     * back (the handler may have freed its callback's argument). Before,
     * the callback fired after finish and cancels counted 1. */
    raw_control(nc, "w-count", id, "rawfc", STREAMWIRE__V1__CONTROL_KIND__CONTROL_CANCEL, 0, 0);
    controls_handled(nc, "w-count");
    sw_ingress_stats_get(ing, &st);
    assert_int_equal(st.cancels, 0);
    engine_snapshot(&e, &snap);
    assert_int_equal(snap.cancel_cbs, 0);
    assert_int_equal(snap.cancelled, 0);
    raw_ack_finals(nc, "w-count", id, "evil");
    controls_handled(nc, "w-count");
    sw_ingress_stats_get(ing, &st);
    assert_int_equal(st.bad_controls, 5);
    assert_int_equal(st.streams_held, 1); /* not released by another's ack */
    raw_ack_finals(nc, "w-count", id, "rawfc");
    controls_handled(nc, "w-count");
    sw_ingress_stats_get(ing, &st);
    assert_int_equal(st.bad_controls, 5);
    assert_int_equal(st.streams_held, 0);
    assert_int_equal(st.finals_dropped, 0);
    sw_ingress_destroy(ing);
    natsSubscription_Destroy(ans);
    sw_conn_close(fc);
    sw_conn_close(wc);
    pthread_mutex_destroy(&e.mu);
}

/* ------------------------------------------------ RESEND floods */

/* A RESEND from `router` for from..to of the stream with this id. */
static void
raw_resend(natsConnection *nc, const char *inst, const uint8_t *id, const char *router,
           uint64_t from, uint64_t to)
{
    swp_control c = STREAMWIRE__V1__CONTROL__INIT;
    char subj[SWT_SUBJECT_MAX];
    uint8_t buf[256];
    size_t len;
    c.version = SW_PROTOCOL_VERSION;
    c.request_id.data = (uint8_t *)(uintptr_t)id;
    c.request_id.len = SW_REQUEST_ID_BYTES;
    c.kind = STREAMWIRE__V1__CONTROL_KIND__CONTROL_RESEND;
    c.router_id = (char *)router;
    c.resend_from = from;
    c.resend_to = to;
    assert_int_equal(swt_subject_control(subj, sizeof(subj), inst), SW_OK);
    assert_int_equal(swp_encode(&c, buf, sizeof(buf), &len), SW_OK);
    assert_int_equal(natsConnection_Publish(nc, subj, buf, (int)len), NATS_OK);
}

/* Reads a stream to its end on a thread of its own, a little at a time
 * (a millisecond's pause every 8 items). */
typedef struct slow_reader {
    sw_stream *s;
    int items;
    sw_status status;
    sw_err rv;
} slow_reader;

static void *
slow_reader_main(void *arg)
{
    slow_reader *a = arg;
    const sw_item *it;
    for (;;) {
        a->rv = sw_stream_next(a->s, &it, 30000 * swh_slow());
        if (a->rv != SW_OK)
            return NULL;
        if (it->kind == SW_ITEM_TERMINAL) {
            a->status = it->terminal.status;
            return NULL;
        }
        if (++a->items % 8 == 0)
            swh_sleep_ms(1);
    }
}

/* A frontend floods RESENDs for the whole window of its stream (a full
 * window of 16,384 items it never acknowledges): 6 bursts of 500, 500 ms
 * apart, 1,000 a second, items of 256 bytes, while another router's
 * stream runs on the same worker. Each RESEND used to republish the window on the worker's one
 * control thread (3,000 x 16,384 items): the other stream's credits and
 * the router's probes queued behind them, and its stream ended
 * instance_lost. Now a seq resent less than 50 ms ago is not resent again:
 * about one window per burst goes out, the rest are counted as
 * throttled, and the other stream completes. */
static void
resend_flood_is_throttled(void **state)
{
    enum { W = 16384, BURSTS = 6, PER_BURST = 500 };
    sw_conn *wc = conn_open(), *fc = conn_open(), *lc = conn_open();
    natsConnection *nc = sw_conn_nats(fc);
    natsSubscription *ans = probe_answerer(nc, "floodfe");
    sw_router *lr = router_new(lc, 64);
    sw_router_stats rs;
    sw_request_opts q;
    engine e;
    sw_ingress *ing;
    sw_ingress_stats before, after;
    uint8_t id[SW_REQUEST_ID_BYTES];
    char hex[SW_REQUEST_ID_HEX], resp[SWT_SUBJECT_MAX];
    slow_reader sr;
    pthread_t t;
    int64_t until, t0, probe_ms;
    (void)state;
    memset(&e, 0, sizeof(e));
    pthread_mutex_init(&e.mu, NULL);
    e.tokens = W + 1; /* the flooder's stream fills its window and waits for credit */
    e.item_bytes = 256;
    ing = ingress_new(wc, "w-flood", &e, (unsigned)T(60000));
    new_id(id, hex);
    assert_int_equal(swt_subject_response(resp, sizeof(resp), "floodfe", hex), SW_OK);
    raw_request(nc, "w-flood", id, resp, "floodfe", W, 250);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    until = swh_now_ms() + T(20000);
    do {
        swh_sleep_ms(20);
        sw_ingress_stats_get(ing, &before);
    } while (before.items_sent < W && swh_now_ms() < until);
    assert_int_equal(before.items_sent, W);
    /* The other router's stream, read on a thread during the flood. */
    sw_request_opts_init(&q);
    q.endpoint = EP;
    q.instance_id = "w-flood";
    memset(&sr, 0, sizeof(sr));
    assert_int_equal(sw_router_open(&sr.s, lr, &q, "p", 1), SW_OK);
    assert_int_equal(pthread_create(&t, NULL, slow_reader_main, &sr), 0);
    for (int b = 0; b < BURSTS; b++) {
        if (b > 0)
            swh_sleep_ms(500);
        for (int i = 0; i < PER_BURST; i++)
            raw_resend(nc, "w-flood", id, "floodfe", 1, W);
        assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    }
    t0 = swh_now_ms();
    controls_handled(nc, "w-flood"); /* behind the last burst */
    probe_ms = swh_now_ms() - t0;
    pthread_join(t, NULL);
    sw_ingress_stats_get(ing, &after);
    sw_router_stats_get(lr, &rs);
    print_message("%d RESENDs of 1..%d: %llu items resent (%.1f windows), %llu throttled; a "
                  "PROBE behind the last burst answered in %lld ms; the other stream: %d items, "
                  "%s, instances_lost %llu\n",
                  BURSTS * PER_BURST, W,
                  (unsigned long long)(after.items_resent - before.items_resent),
                  (double)(after.items_resent - before.items_resent) / W,
                  (unsigned long long)(after.resends_throttled - before.resends_throttled),
                  (long long)probe_ms, sr.items, sw_status_name(sr.status),
                  (unsigned long long)rs.instances_lost);
    assert_int_equal(sr.rv, SW_OK);
    assert_int_equal(sr.status, SW_STATUS_COMPLETED);
    assert_int_equal(sr.items, W + 1);
    assert_int_equal(rs.instances_lost, 0);
    /* about a window per burst (3 at most, for a slow machine) */
    assert_true(after.items_resent - before.items_resent >= W);
    assert_true(after.items_resent - before.items_resent <= (uint64_t)3 * BURSTS * W);
    assert_true(after.resends_throttled - before.resends_throttled >=
                (uint64_t)BURSTS * (PER_BURST - 3));
    assert_true(probe_ms < T(1000));
    sw_stream_close(sr.s);
    sw_router_destroy(lr);
    sw_ingress_destroy(ing);
    natsSubscription_Destroy(ans);
    sw_conn_close(lc);
    sw_conn_close(fc);
    sw_conn_close(wc);
    pthread_mutex_destroy(&e.mu);
}

/* ------------------------------------------------ probes answered where they belong */

/* A PROBE naming `router` and no stream, with reply subject `reply`. */
static void
raw_probe(natsConnection *nc, const char *inst, const char *router, uint64_t probe_id,
          const char *reply)
{
    swp_control c = STREAMWIRE__V1__CONTROL__INIT;
    char subj[SWT_SUBJECT_MAX];
    uint8_t buf[128];
    size_t len;
    c.version = SW_PROTOCOL_VERSION;
    c.kind = STREAMWIRE__V1__CONTROL_KIND__CONTROL_PROBE;
    c.router_id = (char *)router;
    c.probe_id = probe_id;
    assert_int_equal(swt_subject_control(subj, sizeof(subj), inst), SW_OK);
    assert_int_equal(swp_encode(&c, buf, sizeof(buf), &len), SW_OK);
    assert_int_equal(natsConnection_PublishRequest(nc, subj, reply, buf, (int)len), NATS_OK);
}

/* A router id may have SW_MAX_TOKEN (64) characters: such a router
 * probes its instances as any other. Its instance PROBE used to be encoded
 * into 64 bytes, too few for the id, so the encode failed and no probe was
 * ever sent (a frozen worker was then never found lost by probes). The
 * fake worker's control subscription sees the PROBE: the whole router id,
 * no request id, a probe id, the reply on sw.prb.<router>.<instance>. */
static void
long_router_id_probes_its_instances(void **state)
{
    char rid[SW_MAX_TOKEN + 1], subj[SWT_SUBJECT_MAX], want_reply[SWT_SUBJECT_MAX];
    sw_conn *fc = conn_open(), *wc = conn_open();
    natsConnection *nc = sw_conn_nats(wc);
    natsSubscription *reqs, *ctls = NULL;
    natsMsg *m = NULL;
    swp_control *c = NULL;
    swp_request *req;
    sw_router_opts o;
    sw_router *r = NULL;
    sw_request_opts q;
    sw_stream *s = NULL;
    int64_t until;
    int probed = 0;
    (void)state;
    memset(rid, 'r', SW_MAX_TOKEN);
    rid[SW_MAX_TOKEN] = '\0';
    reqs = fake_worker_sub(nc, "w-long");
    assert_int_equal(swt_subject_control(subj, sizeof(subj), "w-long"), SW_OK);
    assert_int_equal(natsConnection_SubscribeSync(&ctls, nc, subj), NATS_OK);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    assert_int_equal(swt_subject_probe_reply(want_reply, sizeof(want_reply), rid, "w-long"), SW_OK);
    sw_router_opts_init(&o);
    o.router_id = rid;
    assert_int_equal(sw_router_create(&r, fc, &o), SW_OK);
    sw_request_opts_init(&q);
    q.endpoint = EP;
    q.instance_id = "w-long";
    assert_int_equal(sw_router_open(&s, r, &q, "p", 1), SW_OK);
    req = fake_worker_take(reqs);
    assert_string_equal(req->router_id, rid);
    swp_free(req);
    /* probes every 100 ms by default: within 2 s, a few */
    until = swh_now_ms() + T(2000);
    while (!probed && swh_now_ms() < until) {
        if (natsSubscription_NextMsg(&m, ctls, 100) != NATS_OK)
            continue;
        if (swp_decode_control((const uint8_t *)natsMsg_GetData(m),
                               (size_t)natsMsg_GetDataLength(m), 1 << 16, &c) == SW_OK &&
            c->kind == STREAMWIRE__V1__CONTROL_KIND__CONTROL_PROBE && c->request_id.len == 0) {
            assert_string_equal(c->router_id, rid);
            assert_true(c->probe_id != 0);
            assert_non_null(natsMsg_GetReply(m));
            assert_string_equal(natsMsg_GetReply(m), want_reply);
            probed = 1;
        }
        swp_free(c);
        c = NULL;
        natsMsg_Destroy(m);
        m = NULL;
    }
    if (!probed)
        fail_msg("no instance PROBE from a router whose id has %d characters in 2 s", SW_MAX_TOKEN);
    sw_stream_close(s);
    sw_router_destroy(r);
    natsSubscription_Destroy(ctls);
    natsSubscription_Destroy(reqs);
    sw_conn_close(wc);
    sw_conn_close(fc);
}

/* A worker answers a PROBE only on the subject where the router it names
 * takes probe answers, sw.prb.<router_id>.<instance>. It used to answer on
 * any reply subject: a PROBE with a live stream's response subject as its
 * reply had it publish a ProbeReply into that stream, which ended
 * decode_error (sealed, a recorded probe replayed does the same:
 * test_sealed replayed_probe_not_answered_on_a_stream). Now that stream
 * completes, a PROBE whose reply is another router's probe subject gets no
 * answer either, both count in bad_controls, and a probe on its own
 * router's subject is still answered. */
static void
probe_answered_only_on_its_routers_subject(void **state)
{
    sw_conn *wc = conn_open(), *fc = conn_open(), *ac = conn_open();
    natsConnection *nc = sw_conn_nats(ac);
    natsSubscription *spy = NULL;
    sw_router *r = router_new(fc, 64);
    sw_request_opts q;
    sw_stream *s = NULL;
    const sw_item *it;
    engine e;
    sw_ingress *ing;
    sw_ingress_stats before, after;
    char victim[SWT_SUBJECT_MAX], other[SWT_SUBJECT_MAX];
    uint64_t seqs[64];
    size_t n;
    sw_terminal term;
    int spied = 0;
    (void)state;
    memset(&e, 0, sizeof(e));
    pthread_mutex_init(&e.mu, NULL);
    e.tokens = 40;
    e.delay_ms = 10;
    ing = ingress_new(wc, "w-prb", &e, 5000);
    sw_request_opts_init(&q);
    q.endpoint = EP;
    q.instance_id = "w-prb";
    assert_int_equal(sw_router_open(&s, r, &q, "p", 1), SW_OK);
    assert_int_equal(sw_stream_next(s, &it, T(5000)), SW_OK);
    assert_int_equal(it->kind, SW_ITEM_DATA);
    assert_int_equal(it->seq, 1);
    sw_ingress_stats_get(ing, &before);
    assert_int_equal(
        swt_subject_response(victim, sizeof(victim), sw_router_id(r), sw_stream_request_id(s)),
        SW_OK);
    assert_int_equal(swt_subject_probe_reply(other, sizeof(other), "victimfe", "w-prb"), SW_OK);
    assert_int_equal(natsConnection_SubscribeSync(&spy, nc, other), NATS_OK);
    raw_probe(nc, "w-prb", "anyone", 4242, victim);
    raw_probe(nc, "w-prb", "anyone", 4243, other);
    controls_handled(nc, "w-prb"); /* (answered: its own router's subject) */
    read_all(s, seqs, 64, &n, &term);
    for (;;) {
        natsMsg *m = NULL;
        if (natsSubscription_NextMsg(&m, spy, 100) != NATS_OK)
            break;
        spied++;
        natsMsg_Destroy(m);
    }
    sw_ingress_stats_get(ing, &after);
    print_message("victim: %zu more items, %s; answers on another router's probe subject: %d; "
                  "bad_controls +%llu\n",
                  n, sw_status_name(term.status), spied,
                  (unsigned long long)(after.bad_controls - before.bad_controls));
    assert_int_equal(term.status, SW_STATUS_COMPLETED);
    assert_int_equal(n, 39);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(seqs[i], i + 2);
    assert_int_equal(spied, 0);
    assert_int_equal(after.bad_controls - before.bad_controls, 2);
    natsSubscription_Destroy(spy);
    sw_stream_close(s);
    sw_router_destroy(r);
    sw_ingress_destroy(ing);
    sw_conn_close(ac);
    sw_conn_close(fc);
    sw_conn_close(wc);
    pthread_mutex_destroy(&e.mu);
}

/* A request whose response subject is not its own (sw.rsp.<router_id>.<id
 * hex>) is refused: the worker is no reflector. Before: it streamed to any
 * subject the request named. */
static void
foreign_response_subject_is_refused(void **state)
{
    sw_conn *wc = conn_open(), *ac = conn_open();
    natsConnection *nc = sw_conn_nats(ac);
    natsSubscription *victim = NULL;
    engine e;
    sw_ingress *ing;
    sw_ingress_stats before, after;
    uint8_t id[SW_REQUEST_ID_BYTES];
    char hex[SW_REQUEST_ID_HEX];
    int got = 0;
    (void)state;
    memset(&e, 0, sizeof(e));
    pthread_mutex_init(&e.mu, NULL);
    e.tokens = 5;
    ing = ingress_new(wc, "w-refl", &e, 1000);
    assert_int_equal(natsConnection_SubscribeSync(&victim, nc, "sw.rsp.victim.>"), NATS_OK);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    sw_ingress_stats_get(ing, &before);
    new_id(id, hex);
    {
        char resp[SWT_SUBJECT_MAX];
        snprintf(resp, sizeof(resp), "sw.rsp.victim.%s", hex);
        raw_request(nc, "w-refl", id, resp, "attacker", 16, 250);
    }
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    for (;;) {
        natsMsg *m = NULL;
        if (natsSubscription_NextMsg(&m, victim, (int64_t)T(500)) != NATS_OK)
            break;
        got++;
        natsMsg_Destroy(m);
    }
    sw_ingress_stats_get(ing, &after);
    assert_int_equal(got, 0);
    assert_int_equal(after.bad_requests - before.bad_requests, 1);
    assert_int_equal(e.started, 0);
    natsSubscription_Destroy(victim);
    sw_ingress_destroy(ing);
    sw_conn_close(ac);
    sw_conn_close(wc);
    pthread_mutex_destroy(&e.mu);
}

/* With max_request_age_ms (5 minutes here), a request issued longer ago
 * (Request.issued_unix_ms, by the sender's clock) is a replay the worker's
 * 10-minute memory of served ids may have forgotten: it is never run, it is
 * counted as a replay, and its response subject gets one failed final
 * (protocol_error, saying why). 4 minutes old, or from a clock ahead of
 * ours, it runs. Without the option (the default) the old one runs too
 * (clocks may be off), and the option's bounds are checked. */
static void
stale_request_is_refused(void **state)
{
    sw_conn *wc = conn_open(), *ac = conn_open();
    natsConnection *nc = sw_conn_nats(ac);
    natsSubscription *sub = NULL;
    engine e;
    sw_ingress *ing;
    sw_ingress_stats before, after;
    uint8_t id[SW_REQUEST_ID_BYTES];
    char hex[SW_REQUEST_ID_HEX], resp[SWT_SUBJECT_MAX];
    const uint64_t now = (uint64_t)swi_unix_ms();
    const uint64_t stale[2] = {now - 6 * 60 * 1000, UINT64_MAX};
    const uint64_t fresh[2] = {now - 4 * 60 * 1000, now + 3600 * 1000};
    (void)state;
    memset(&e, 0, sizeof(e));
    pthread_mutex_init(&e.mu, NULL);
    e.tokens = 2;
    assert_int_equal(ingress_try(wc, "w-old", &e, 1000, -1, &ing), SW_EINVAL);
    assert_int_equal(ingress_try(wc, "w-old", &e, 1000, SW_MAX_REQUEST_AGE_MS + 1, &ing),
                     SW_EINVAL);
    assert_int_equal(ingress_try(wc, "w-old", &e, 1000, 5 * 60 * 1000, &ing), SW_OK);
    assert_int_equal(natsConnection_SubscribeSync(&sub, nc, "sw.rsp.oldr.>"), NATS_OK);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    sw_ingress_stats_get(ing, &before);
    for (int k = 0; k < 2; k++) {
        natsMsg *m = NULL;
        swp_item *it = NULL;
        new_id(id, hex);
        snprintf(resp, sizeof(resp), "sw.rsp.oldr.%s", hex);
        raw_request_at(nc, "w-old", id, resp, "oldr", 16, 250, stale[k]);
        assert_int_equal(natsSubscription_NextMsg(&m, sub, (int64_t)T(5000)), NATS_OK);
        assert_int_equal(swp_decode_item((const uint8_t *)natsMsg_GetData(m),
                                         (size_t)natsMsg_GetDataLength(m), 1 << 20, &it),
                         SW_OK);
        assert_true(it->complete_final);
        assert_int_equal(it->terminal->status, STREAMWIRE__V1__STATUS__STATUS_FAILED);
        assert_int_equal(it->terminal->error->sw_code, SW_EPROTO);
        assert_non_null(strstr(it->terminal->error->message, "issued"));
        swp_free(it);
        natsMsg_Destroy(m);
    }
    sw_ingress_stats_get(ing, &after);
    assert_int_equal(after.replays - before.replays, 2);
    assert_int_equal(e.started, 0);
    for (int k = 0; k < 2; k++) {
        new_id(id, hex);
        snprintf(resp, sizeof(resp), "sw.rsp.oldr.%s", hex);
        raw_request_at(nc, "w-old", id, resp, "oldr", 16, 250, fresh[k]);
    }
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    assert_int_equal(wait_started(&e, 2), 2);
    sw_ingress_stats_get(ing, &after);
    assert_int_equal(after.replays - before.replays, 2);
    sw_ingress_destroy(ing);
    /* The default: no limit. */
    ing = ingress_new(wc, "w-old2", &e, 1000);
    new_id(id, hex);
    snprintf(resp, sizeof(resp), "sw.rsp.oldr.%s", hex);
    raw_request_at(nc, "w-old2", id, resp, "oldr", 16, 250, stale[0]);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    assert_int_equal(wait_started(&e, 3), 3);
    sw_ingress_destroy(ing);
    /* A copy of a request that still runs, arriving after the age limit:
     * dropped in silence (no error final on the live stream's subject). */
    {
        const uint64_t issued = (uint64_t)swi_unix_ms();
        int items = 0, finals = 0;
        e.tokens = 8;
        e.delay_ms = 250; /* a 2-second stream */
        assert_int_equal(ingress_try(wc, "w-old3", &e, 1000, 1000, &ing), SW_OK);
        sw_ingress_stats_get(ing, &before);
        new_id(id, hex);
        snprintf(resp, sizeof(resp), "sw.rsp.oldr.%s", hex);
        raw_request_at(nc, "w-old3", id, resp, "oldr", 16, 250, issued);
        assert_int_equal(wait_started(&e, 4), 4);
        swh_sleep_ms(1300); /* older than the limit now, and still running */
        raw_request_at(nc, "w-old3", id, resp, "oldr", 16, 250, issued);
        /* (Nobody answers the worker's probes of "oldr", so the stream is
         * cancelled as its frontend's loss after a while: no final is
         * awaited, only the absence of an error final for the copy.) */
        for (;;) {
            natsMsg *m = NULL;
            swp_item *it = NULL;
            if (natsSubscription_NextMsg(&m, sub, (int64_t)T(1500)) != NATS_OK)
                break;
            if (swp_decode_item((const uint8_t *)natsMsg_GetData(m),
                                (size_t)natsMsg_GetDataLength(m), 1 << 20, &it) == SW_OK) {
                if (memcmp(it->request_id.data, id, SW_REQUEST_ID_BYTES) == 0) {
                    items++;
                    finals += it->complete_final && it->terminal != NULL &&
                              it->terminal->status == STREAMWIRE__V1__STATUS__STATUS_FAILED;
                }
                swp_free(it);
            }
            natsMsg_Destroy(m);
        }
        assert_true(items >= 1);        /* the live stream's own items came */
        assert_int_equal(finals, 0);    /* and no error final for the copy */
        assert_int_equal(e.started, 4); /* never run twice */
        sw_ingress_stats_get(ing, &after);
        assert_int_equal(after.replays - before.replays, 1);
        sw_ingress_destroy(ing);
    }
    /* A copy of a request the worker refused (here: cancelled before it
     * came), arriving after the age limit: dropped in silence too. It used
     * to get a protocol_error final on the subject (review of 06fa3c7). */
    {
        const uint64_t issued = (uint64_t)swi_unix_ms();
        natsSubscription *sub2 = NULL;
        natsMsg *m = NULL;
        assert_int_equal(ingress_try(wc, "w-old4", &e, 1000, 1000, &ing), SW_OK);
        assert_int_equal(natsConnection_SubscribeSync(&sub2, nc, "sw.rsp.oldq.>"), NATS_OK);
        new_id(id, hex);
        snprintf(resp, sizeof(resp), "sw.rsp.oldq.%s", hex);
        raw_control(nc, "w-old4", id, "oldq", STREAMWIRE__V1__CONTROL_KIND__CONTROL_CANCEL, 0, 0);
        assert_int_equal(natsConnection_Flush(nc), NATS_OK);
        swh_sleep_ms(100); /* (the cancel first: another subscription) */
        raw_request_at(nc, "w-old4", id, resp, "oldq", 16, 250, issued);
        assert_int_equal(natsConnection_Flush(nc), NATS_OK);
        sw_ingress_stats_get(ing, &before);
        for (int i = 0; i < 100 && before.cancels == 0; i++) {
            swh_sleep_ms(10);
            sw_ingress_stats_get(ing, &before);
        }
        assert_int_equal(before.cancels, 1); /* refused: never started */
        swh_sleep_ms(1300);                  /* older than the limit now */
        raw_request_at(nc, "w-old4", id, resp, "oldq", 16, 250, issued);
        assert_int_equal(natsConnection_Flush(nc), NATS_OK);
        assert_int_equal(natsSubscription_NextMsg(&m, sub2, (int64_t)T(1000)), NATS_TIMEOUT);
        sw_ingress_stats_get(ing, &after);
        assert_int_equal(after.replays - before.replays, 1);
        assert_int_equal(e.started, 4);
        natsSubscription_Destroy(sub2);
        sw_ingress_destroy(ing);
    }
    natsSubscription_Destroy(sub);
    sw_conn_close(ac);
    sw_conn_close(wc);
    pthread_mutex_destroy(&e.mu);
}

/* A CREDIT with a huge limit does not make send fail (before: SW_ENOMEM
 * from a ring sized to the limit). */
static void
huge_credit_does_not_break_send(void **state)
{
    sw_conn *wc = conn_open(), *fc = conn_open();
    natsConnection *nc = sw_conn_nats(fc);
    natsSubscription *rsp = NULL;
    engine e, snap;
    sw_ingress *ing;
    uint8_t id[SW_REQUEST_ID_BYTES];
    char hex[SW_REQUEST_ID_HEX], resp[SWT_SUBJECT_MAX];
    int64_t until;
    (void)state;
    memset(&e, 0, sizeof(e));
    pthread_mutex_init(&e.mu, NULL);
    e.tokens = 200;
    ing = ingress_new(wc, "w-credit", &e, 3000);
    new_id(id, hex);
    assert_int_equal(swt_subject_response(resp, sizeof(resp), "rawfe2", hex), SW_OK);
    assert_int_equal(natsConnection_SubscribeSync(&rsp, nc, resp), NATS_OK);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    raw_request(nc, "w-credit", id, resp, "rawfe2", 16, 250);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    swh_sleep_ms(100);
    raw_control(nc, "w-credit", id, "rawfe2", STREAMWIRE__V1__CONTROL_KIND__CONTROL_CREDIT,
                UINT64_MAX / 2, 0);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    until = swh_now_ms() + T(10000);
    do {
        swh_sleep_ms(20);
        engine_snapshot(&e, &snap);
    } while (snap.ended == 0 && swh_now_ms() < until);
    assert_int_equal(snap.ended, 1);
    assert_int_equal(snap.send_errors, 0);
    natsSubscription_Destroy(rsp);
    sw_ingress_destroy(ing);
    sw_conn_close(fc);
    sw_conn_close(wc);
    pthread_mutex_destroy(&e.mu);
}

/* ------------------------------------------------ durations (issue 10) */

/* Every duration is an sw_duration; a negative one is SW_EINVAL, and so is
 * one the wire cannot carry. */
static void
negative_durations_are_invalid(void **state)
{
    sw_conn_opts co;
    sw_router_opts ro;
    sw_request_opts q;
    sw_conn *c = NULL;
    sw_router *r = NULL;
    sw_stream *s = NULL;
    (void)state;
    sw_conn_opts_init(&co);
    co.url = g_nats.url;
    co.connect_timeout_ms = -1;
    assert_int_equal(sw_conn_open(&c, &co), SW_EINVAL);
    assert_null(c);
    co.connect_timeout_ms = 0;
    co.reconnect_wait_ms = -5;
    assert_int_equal(sw_conn_open(&c, &co), SW_EINVAL);
    co.reconnect_wait_ms = 0;
    co.max_reconnect = SW_RECONNECT_NONE - 1;
    assert_int_equal(sw_conn_open(&c, &co), SW_EINVAL);
    {
        /* An inbox prefix leaves room for the unique part (295 bytes). */
        char pfx[300];
        memset(pfx, 'p', sizeof(pfx) - 1);
        pfx[sizeof(pfx) - 1] = '\0';
        sw_conn_opts_init(&co);
        co.url = g_nats.url;
        co.inbox_prefix = pfx;
        assert_int_equal(sw_conn_open(&c, &co), SW_EINVAL);
        assert_null(c);
        pfx[296] = '\0';
        assert_int_equal(sw_conn_open(&c, &co), SW_EINVAL);
        pfx[295] = '\0';
        assert_int_equal(sw_conn_open(&c, &co), SW_OK);
        sw_conn_close(c);
        c = NULL;
    }
    c = conn_open();
    {
        /* every duration of sw_router_opts: -1 and INT32_MAX + 1 refused,
         * INT32_MAX taken (a default kept for 0 is no test of the bound) */
        static const size_t off[] = {
            offsetof(sw_router_opts, heartbeat_ms),      offsetof(sw_router_opts, inactivity_ms),
            offsetof(sw_router_opts, gap_timeout_ms),    offsetof(sw_router_opts, final_linger_ms),
            offsetof(sw_router_opts, probe_interval_ms), offsetof(sw_router_opts, probe_timeout_ms),
            offsetof(sw_router_opts, quarantine_ms),
        };
        static const sw_duration bad[] = {-1, (sw_duration)INT32_MAX + 1, INT64_MIN};
        for (size_t i = 0; i < sizeof(off) / sizeof(off[0]); i++)
            for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
                sw_router_opts_init(&ro);
                *(sw_duration *)((char *)&ro + off[i]) = bad[k];
                if (sw_router_create(&r, c, &ro) != SW_EINVAL)
                    fail_msg("sw_router_opts field at offset %zu = %lld: not SW_EINVAL", off[i],
                             (long long)bad[k]);
                assert_null(r);
            }
        sw_router_opts_init(&ro);
        ro.credit_window_max = (1u << 20) + 1; /* "at most 1<<20" */
        assert_int_equal(sw_router_create(&r, c, &ro), SW_EINVAL);
        assert_null(r);
    }
    r = router_new(c, 16);
    sw_request_opts_init(&q);
    q.endpoint = EP;
    q.deadline_ms = -1;
    assert_int_equal(sw_router_open(&s, r, &q, "p", 1), SW_EINVAL);
    q.deadline_ms = (sw_duration)UINT32_MAX + 1;
    assert_int_equal(sw_router_open(&s, r, &q, "p", 1), SW_EINVAL);
    q.deadline_ms = 0;
    q.heartbeat_ms = -250;
    assert_int_equal(sw_router_open(&s, r, &q, "p", 1), SW_EINVAL);
    assert_null(s);
    sw_router_destroy(r);
    sw_conn_close(c);
    {
        sw_registry_opts go;
        sw_registry *reg = NULL;
        sw_registry_opts_init(&go);
        go.backend = "memory";
        go.lease_ms = -1;
        assert_int_equal(sw_registry_open(&reg, NULL, &go), SW_EINVAL);
        go.lease_ms = 0;
        go.refresh_ms = -3;
        assert_int_equal(sw_registry_open(&reg, NULL, &go), SW_EINVAL);
        assert_null(reg);
    }
    {
        /* The ingress's: negative, or past INT32_MAX (2^32 wrapped to a
         * zero timeout). Before: taken, -1 as 49.7 days. */
        engine e;
        sw_ingress *ing = NULL;
        sw_ingress_opts io;
        sw_duration bad[] = {-1, (sw_duration)INT32_MAX + 1, (sw_duration)1 << 32};
        memset(&e, 0, sizeof(e));
        c = conn_open();
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
            for (int field = 0; field < 3; field++) {
                sw_ingress_opts_init(&io);
                io.endpoint = EP;
                io.handler = engine_handler;
                io.handler_arg = &e;
                if (field == 0)
                    io.send_timeout_ms = bad[i];
                else if (field == 1)
                    io.frontend_probe_ms = bad[i];
                else
                    io.frontend_timeout_ms = bad[i];
                assert_int_equal(sw_ingress_start(&ing, c, &io), SW_EINVAL);
                assert_null(ing);
            }
        sw_ingress_opts_init(&io); /* the bounds themselves are taken */
        io.endpoint = EP;
        io.handler = engine_handler;
        io.handler_arg = &e;
        io.send_timeout_ms = INT32_MAX;
        io.frontend_probe_ms = INT32_MAX;
        io.frontend_timeout_ms = INT32_MAX;
        assert_int_equal(sw_ingress_start(&ing, c, &io), SW_OK);
        sw_ingress_destroy(ing);
        sw_conn_close(c);
    }
}

/* ------------------------------------------------ #13 open and callbacks */

static atomic_int in_open, cb_in_open, cb_terms;
static pthread_t opener;

static void
close_in_callback(sw_stream *s, const sw_item *it, void *arg)
{
    (void)arg;
    /* Inside open means: on the opening thread, while it is in open (the
     * terminals of earlier opens may run on the ticker meanwhile). */
    if (atomic_load(&in_open) && pthread_equal(pthread_self(), opener))
        atomic_fetch_add(&cb_in_open, 1);
    if (it->kind == SW_ITEM_TERMINAL) {
        assert_int_equal(it->terminal.error, SW_NO_INSTANCES);
        atomic_fetch_add(&cb_terms, 1);
        sw_stream_close(s); /* the consumer lets go from its callback */
    }
}

/* Issue 11 #13: a terminal decided inside sw_router_open (no_instances) used
 * to be delivered, in callback mode, before open returned: a callback that
 * closed the stream left *out freed while open returned SW_OK. Now no item
 * callback runs inside open; the terminal comes right after, once. */
static void
no_callback_inside_open(void **state)
{
    sw_conn *c = conn_open();
    sw_router *r = router_new(c, 16);
    sw_request_opts q;
    int64_t until;
    (void)state;
    sw_request_opts_init(&q);
    q.endpoint = "nobody.serves.this";
    q.on_item = close_in_callback;
    opener = pthread_self();
    for (int i = 0; i < 50; i++) {
        sw_stream *s = NULL;
        atomic_store(&in_open, 1);
        assert_int_equal(sw_router_open(&s, r, &q, "p", 1), SW_OK);
        atomic_store(&in_open, 0);
        assert_non_null(s);
    }
    until = swh_now_ms() + T(5000);
    while (atomic_load(&cb_terms) < 50 && swh_now_ms() < until)
        swh_sleep_ms(5);
    assert_int_equal(atomic_load(&cb_terms), 50);
    assert_int_equal(atomic_load(&cb_in_open), 0);
    sw_router_destroy(r);
    sw_conn_close(c);
}

/* ------------------------------------------------ NATS restarts (#6, #7, #9) */

/* Issue 11 #7 / issue 14: a lone NATS server restarted within the reconnect
 * bounds (down 1.5 s): the stream in flight completes with every item, in
 * order, and the healthy worker is not declared lost. Before: the router's
 * probes failed while its own connection reconnected and the stream ended
 * instance_lost (or stream_incomplete). */
static void
stream_survives_nats_restart(void **state)
{
    sw_conn *fc = conn_open(), *wc = conn_open();
    engine e;
    sw_ingress *ing;
    sw_router *r = router_new(fc, 64);
    sw_router_stats rs;
    sw_request_opts q;
    sw_stream *s = NULL;
    uint64_t seqs[128];
    size_t n;
    sw_terminal term;
    (void)state;
    memset(&e, 0, sizeof(e));
    pthread_mutex_init(&e.mu, NULL);
    e.tokens = 80;
    e.delay_ms = 25;
    ing = ingress_new(wc, "w-restart", &e, 30000);
    sw_request_opts_init(&q);
    q.endpoint = EP;
    q.instance_id = "w-restart";
    assert_int_equal(sw_router_open(&s, r, &q, "p", 1), SW_OK);
    swh_sleep_ms(300);
    assert_int_equal(swh_nats_restart(&g_nats, 1500), 0);
    read_all(s, seqs, 128, &n, &term);
    print_message("after a 1.5 s restart: %s/%s, %zu items\n", sw_status_name(term.status),
                  term.reason, n);
    assert_int_equal(term.status, SW_STATUS_COMPLETED);
    assert_int_equal(n, 80);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(seqs[i], i + 1);
    sw_router_stats_get(r, &rs);
    assert_int_equal(rs.instances_lost, 0);
    assert_true(sw_conn_reconnects(fc) >= 1);
    sw_stream_close(s);
    sw_router_destroy(r);
    sw_ingress_destroy(ing);
    sw_conn_close(wc);
    sw_conn_close(fc);
    pthread_mutex_destroy(&e.mu);
}

typedef struct state_rec {
    pthread_mutex_t mu;
    int seen[4];
} state_rec;

static void
on_state(sw_conn *c, sw_conn_state st, void *arg)
{
    state_rec *sr = arg;
    (void)c;
    pthread_mutex_lock(&sr->mu);
    if (st >= 1 && st <= 3)
        sr->seen[st]++;
    pthread_mutex_unlock(&sr->mu);
}

/* A connection to the test server that tells sr (set up here) of its
 * states, with max_reconnect and reconnect_wait_ms (0: the defaults). */
static sw_conn *
state_conn(state_rec *sr, int max_reconnect, sw_duration reconnect_wait_ms)
{
    sw_conn_opts o;
    sw_conn *c = NULL;
    memset(sr, 0, sizeof(*sr));
    pthread_mutex_init(&sr->mu, NULL);
    sw_conn_opts_init(&o);
    o.url = g_nats.url;
    o.max_reconnect = max_reconnect;
    o.reconnect_wait_ms = reconnect_wait_ms;
    o.on_state = on_state;
    o.on_state_arg = sr;
    assert_int_equal(sw_conn_open(&c, &o), SW_OK);
    assert_int_equal(sw_conn_status(c), SW_CONN_CONNECTED);
    return c;
}

/* Waits up to ms for c's status to be want; returns the status then. */
static sw_conn_state
wait_status(sw_conn *c, sw_conn_state want, int64_t ms)
{
    int64_t until = swh_now_ms() + ms;
    while (sw_conn_status(c) != want && swh_now_ms() < until)
        swh_sleep_ms(10);
    return sw_conn_status(c);
}

/* Issue 11 #6 and #9: the application hears of every connection state, a
 * connection whose reconnects run out says CLOSED (nothing spins), and a
 * router and an ingress destroyed while disconnected, with a stream open,
 * free nothing under a running callback (ASan). */
static void
connection_states_and_destroy_while_down(void **state)
{
    sw_conn *c, *wc = conn_open();
    state_rec sr;
    engine e;
    sw_ingress *ing;
    sw_router *r;
    sw_request_opts q;
    sw_stream *s = NULL;
    sw_registry *reg = NULL;
    (void)state;
    memset(&e, 0, sizeof(e));
    pthread_mutex_init(&e.mu, NULL);
    e.tokens = 100000;
    e.delay_ms = 5;
    c = state_conn(&sr, 2, 100);
    ing = ingress_new(wc, "w-down", &e, 30000);
    r = router_new(c, 64);
    sw_request_opts_init(&q);
    q.endpoint = EP;
    q.instance_id = "w-down";
    assert_int_equal(sw_router_open(&s, r, &q, "p", 1), SW_OK);
    {
        sw_registry_opts go;
        sw_registry_opts_init(&go);
        go.bucket = "hostile_states";
        assert_int_equal(sw_registry_open(&reg, c, &go), SW_OK);
    }
    swh_sleep_ms(100);
    swh_nats_stop_keep(&g_nats);
    assert_int_equal(wait_status(c, SW_CONN_CLOSED, T(10000)), SW_CONN_CLOSED);
    {
        /* Nothing spins once the connection is closed for good (the KV
         * watch thread used to take a whole core): this process uses well
         * under half a core over the next 600 ms. */
        struct rusage a, b;
        long used_ms;
        getrusage(RUSAGE_SELF, &a);
        swh_sleep_ms(600);
        getrusage(RUSAGE_SELF, &b);
        used_ms = (b.ru_utime.tv_sec - a.ru_utime.tv_sec) * 1000 +
                  (b.ru_utime.tv_usec - a.ru_utime.tv_usec) / 1000 +
                  (b.ru_stime.tv_sec - a.ru_stime.tv_sec) * 1000 +
                  (b.ru_stime.tv_usec - a.ru_stime.tv_usec) / 1000;
        print_message("CPU over 600 ms with the connection closed: %ld ms\n", used_ms);
        assert_true(used_ms < 300);
    }
    pthread_mutex_lock(&sr.mu);
    assert_true(sr.seen[SW_CONN_RECONNECTING] >= 1);
    assert_int_equal(sr.seen[SW_CONN_CLOSED], 1);
    pthread_mutex_unlock(&sr.mu);
    assert_string_equal(sw_conn_state_name(SW_CONN_CLOSED), "closed");
    /* Destroy everything while the server is gone. */
    sw_registry_close(reg);
    sw_stream_close(s);
    sw_router_destroy(r);
    sw_ingress_destroy(ing);
    sw_conn_close(c);
    sw_conn_close(wc);
    assert_int_equal(swh_nats_restart(&g_nats, 0), 0);
    pthread_mutex_destroy(&e.mu);
    pthread_mutex_destroy(&sr.mu);
}

/* on_state "is told of every change" (README, sw_conn_opts.on_state): a
 * server that goes away and comes back is told as reconnecting, then
 * connected, once each (only closing was asserted before). */
static void
reconnect_is_told_both_ways(void **state)
{
    state_rec sr;
    sw_conn *c = state_conn(&sr, 0, 100);
    int64_t until;
    (void)state;
    swh_nats_stop_keep(&g_nats);
    assert_int_equal(wait_status(c, SW_CONN_RECONNECTING, T(5000)), SW_CONN_RECONNECTING);
    assert_int_equal(swh_nats_restart(&g_nats, 0), 0);
    until = swh_now_ms() + T(10000);
    assert_int_equal(wait_status(c, SW_CONN_CONNECTED, T(10000)), SW_CONN_CONNECTED);
    assert_int_equal(sw_conn_reconnects(c), 1);
    /* (the status changes before the callback is told: under ASan the
     * test saw CONNECTED before on_state had been called with it) */
    for (int told = 0; !told && swh_now_ms() < until;) {
        pthread_mutex_lock(&sr.mu);
        told = sr.seen[SW_CONN_CONNECTED] > 0;
        pthread_mutex_unlock(&sr.mu);
        if (!told)
            swh_sleep_ms(10);
    }
    swh_sleep_ms(100); /* (a second call would come now) */
    pthread_mutex_lock(&sr.mu);
    assert_int_equal(sr.seen[SW_CONN_RECONNECTING], 1);
    assert_int_equal(sr.seen[SW_CONN_CONNECTED], 1);
    assert_int_equal(sr.seen[SW_CONN_CLOSED], 0);
    pthread_mutex_unlock(&sr.mu);
    sw_conn_close(c);
    pthread_mutex_destroy(&sr.mu);
}

/* max_reconnect SW_RECONNECT_NONE: a lost server closes the connection at
 * once, with no reconnect attempt and no reconnecting state in between. */
static void
no_reconnect_closes_at_once(void **state)
{
    state_rec sr;
    sw_conn *c = state_conn(&sr, SW_RECONNECT_NONE, 0);
    int64_t t0;
    (void)state;
    swh_nats_stop_keep(&g_nats);
    t0 = swh_now_ms();
    assert_int_equal(wait_status(c, SW_CONN_CLOSED, T(2000)), SW_CONN_CLOSED);
    printf("    closed %lld ms after the server stopped\n", (long long)(swh_now_ms() - t0));
    assert_int_equal(swh_nats_restart(&g_nats, 0), 0);
    swh_sleep_ms(300); /* nothing reconnects a closed connection */
    assert_int_equal(sw_conn_status(c), SW_CONN_CLOSED);
    assert_int_equal(sw_conn_reconnects(c), 0);
    pthread_mutex_lock(&sr.mu);
    assert_int_equal(sr.seen[SW_CONN_RECONNECTING], 0);
    assert_int_equal(sr.seen[SW_CONN_CLOSED], 1);
    pthread_mutex_unlock(&sr.mu);
    sw_conn_close(c);
    pthread_mutex_destroy(&sr.mu);
}

/* ---------------------------------------------------------------- main */

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

/* ------------------------------------------------ a lost CANCEL is sent again */

/* The bus loses the first CANCEL (and, in a second round, the first three,
 * and a KILL): the router sends it again (after 100 ms, then doubling) until
 * the worker answers with its final, so the handler still sees the cancel
 * and ends. Without the repeats it would run on until credit runs out. */
static void
lost_cancel_is_sent_again(void **state)
{
    sw_conn *fc = conn_open(), *wc = conn_open();
    engine e;
    sw_ingress *ing;
    sw_router *r = router_new(fc, 0);
    static const struct {
        int drop, kill;
    } rounds[3] = {{1, 0}, {3, 0}, {2, 1}};
    (void)state;
    memset(&e, 0, sizeof(e));
    pthread_mutex_init(&e.mu, NULL);
    e.tokens = 100000;
    e.delay_ms = 5;
    ing = ingress_new(wc, "lc1", &e, 60000);
    for (int k = 0; k < 3; k++) {
        sw_request_opts q;
        sw_stream *s;
        const sw_item *it;
        engine snap;
        int64_t t0;
        int ended_before;
        engine_snapshot(&e, &snap);
        ended_before = snap.ended;
        sw_request_opts_init(&q);
        q.endpoint = EP;
        q.instance_id = "lc1";
        assert_int_equal(sw_router_open(&s, r, &q, "x", 1), SW_OK);
        assert_int_equal(sw_stream_next(s, &it, 10000 * swh_slow()), SW_OK);
        assert_int_equal(it->kind, SW_ITEM_DATA);
        swx_ingress_drop_cancels(ing, rounds[k].drop);
        t0 = swh_now_ms();
        assert_int_equal(rounds[k].kill ? sw_stream_kill(s) : sw_stream_cancel(s), SW_OK);
        for (;;) {
            engine_snapshot(&e, &snap);
            if (snap.ended > ended_before || swh_now_ms() - t0 > 10000 * swh_slow())
                break;
            swh_sleep_ms(10);
        }
        assert_int_equal(snap.ended, ended_before + 1); /* the handler saw it and ended */
        /* it took the repeats: no sooner than the first repeat (100 ms) */
        assert_true(swh_now_ms() - t0 >= 90);
        printf("    %d %s(s) lost: the handler saw the cancel after %lld ms\n", rounds[k].drop,
               rounds[k].kill ? "KILL" : "CANCEL", (long long)(swh_now_ms() - t0));
        sw_stream_close(s);
    }
    engine_snapshot(&e, &e);
    assert_int_equal(e.cancelled, 3);
    sw_router_destroy(r);
    sw_ingress_destroy(ing);
    sw_conn_close(fc);
    sw_conn_close(wc);
    pthread_mutex_destroy(&e.mu);
}

/* test_hostile [<glob>]: only the tests whose names match. */
int
main(int argc, char **argv)
{
    if (argc > 1 && argv[1][0] != '\0')
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(credit_overrun_ends_with_flow_violation),
        cmocka_unit_test(held_item_beyond_final_is_item_after_final),
        cmocka_unit_test(final_with_data_is_a_decode_error),
        cmocka_unit_test(cancel_in_callback_mid_message_is_answered_by_its_final),
        cmocka_unit_test(items_in_order_across_gap_fill_and_duplicate),
        cmocka_unit_test(immediate_cancel_reaches_or_prevents),
        cmocka_unit_test(unacked_finals_are_bounded),
        cmocka_unit_test(held_finals_follow_max_held_finals),
        cmocka_unit_test(kills_do_not_push_out_held_finals),
        cmocka_unit_test(held_finals_keep_no_request),
        cmocka_unit_test(refused_request_replayed_does_not_run),
        cmocka_unit_test(forged_cancel_from_other_router_is_ignored),
        cmocka_unit_test(forged_early_cancel_does_not_take_the_place),
        cmocka_unit_test(kill_repeats_are_not_early_cancels),
        cmocka_unit_test(forged_controls_are_counted),
        cmocka_unit_test(resend_flood_is_throttled),
        cmocka_unit_test(probe_answered_only_on_its_routers_subject),
        cmocka_unit_test(long_router_id_probes_its_instances),
        cmocka_unit_test(foreign_response_subject_is_refused),
        cmocka_unit_test(stale_request_is_refused),
        cmocka_unit_test(huge_credit_does_not_break_send),
        cmocka_unit_test(negative_durations_are_invalid),
        cmocka_unit_test(no_callback_inside_open),
        cmocka_unit_test(stream_survives_nats_restart),
        cmocka_unit_test(connection_states_and_destroy_while_down),
        cmocka_unit_test(no_reconnect_closes_at_once),
        cmocka_unit_test(reconnect_is_told_both_ways),
        cmocka_unit_test(lost_cancel_is_sent_again),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
