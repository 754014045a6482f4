/* tests/integration/test_badinput.c -- end-to-end streams over a real
 * nats-server (issues 3 and 5), split from test_streams.c by theme:
 * bad input: items after a final, undecodable items, sequence
 * gaps from the worker, and hostile or malformed requests on the request
 * subject (raw NATS messages, custom response subjects).
 * Fixture, threads and locks: streams_fixture.h. */
#include "streams_fixture.h"

static void
item_after_final(void **state)
{
    env *e = *state;
    sw_router_opts ro;
    got *g = new_got(e);
    sw_stream *s;

    sw_router_opts_init(&ro);
    ro.final_linger_ms = (unsigned)T(200);
    e->w.mode = M_AFTER_FINAL;
    e->w.n = 3;
    env_start(e, NULL, &ro);
    s = env_open(e);
    assert_true(collect(s, g, 0, T(10000)));
    assert_tokens(g, 3); /* token-late is never shown */
    assert_terminal(g, SW_STATUS_ERROR, SW_ITEM_AFTER_FINAL, "item_after_final");
    assert_done(g);
    assert_true(wctx_wait(&e->w, &e->w.returned, 1, T(3000)));
    assert_true(wctx_wait(&e->w, &e->w.finished, 1, T(2000)));
    assert_int_equal(e->w.finish_rv, SW_OK);
    got_free(g);
}

static void
item_after_final_callback(void **state)
{
    env *e = *state;
    sw_router_opts ro;
    sw_request_opts o;
    sw_stream *s;
    cbgot *c = new_cbgot(e);

    sw_router_opts_init(&ro);
    ro.final_linger_ms = (unsigned)T(200);
    e->w.mode = M_AFTER_FINAL;
    e->w.n = 3;
    env_start(e, NULL, &ro);
    ropts(e, &o);
    o.on_item = cb_item;
    o.on_item_arg = c;
    s = env_open_with(e, &o, "p", 1);
    assert_true(cb_wait(c, T(10000)));
    cb_assert_clean(c);
    assert_tokens(&c->g, 3);
    assert_terminal(&c->g, SW_STATUS_ERROR, SW_ITEM_AFTER_FINAL, "item_after_final");
    env_close(e, s);
}

static void
decode_error(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_stream *s;

    e->w.mode = M_GARBAGE;
    e->w.k = 2;
    e->w.n = 100000;
    e->w.delay_ms = 5;
    env_start(e, NULL, NULL);
    s = env_open(e);
    assert_true(collect(s, g, 0, T(10000)));
    assert_tokens(g, 2); /* never an item skipped over the garbage */
    assert_terminal(g, SW_STATUS_ERROR, SW_DECODE_ERROR, "decode_error");
    assert_int_equal(g->term_seq, 0);
    assert_done(g);
    assert_true(wctx_wait(&e->w, &e->w.finished, 1, T(2000)));
    assert_int_equal(e->w.finish_rv, SW_OK);
    /* The frontend told the worker to stop. */
    assert_true(wctx_wait(&e->w, &e->w.stopped, 1, T(3000)));
    assert_int_equal(e->w.stop_rv, SW_ECANCELLED);
    got_free(g);
}

static void
decode_error_callback(void **state)
{
    env *e = *state;
    sw_request_opts o;
    sw_stream *s;
    cbgot *c = new_cbgot(e);

    e->w.mode = M_GARBAGE;
    e->w.k = 2;
    e->w.n = 100000;
    e->w.delay_ms = 5;
    env_start(e, NULL, NULL);
    ropts(e, &o);
    o.on_item = cb_item;
    o.on_item_arg = c;
    s = env_open_with(e, &o, "p", 1);
    assert_true(cb_wait(c, T(10000)));
    cb_assert_clean(c);
    assert_tokens(&c->g, 2);
    assert_terminal(&c->g, SW_STATUS_ERROR, SW_DECODE_ERROR, "decode_error");
    env_close(e, s);
}

static void
sequence_gap(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_stream *s;
    sw_stream_stats ss;

    e->w.mode = M_GAP;
    e->w.k = 3;
    e->w.n = 6;
    env_start(e, NULL, NULL);
    s = env_open(e);
    assert_true(collect(s, g, 0, T(10000)));
    assert_tokens(g, 3); /* nothing after the gap */
    assert_terminal(g, SW_STATUS_ERROR, SW_SEQUENCE_GAP, "sequence_gap");
    assert_int_equal(g->term_seq, 0);
    assert_done(g);
    assert_true(wctx_wait(&e->w, &e->w.finished, 1, T(2000)));
    assert_int_equal(e->w.finish_rv, SW_OK);
    sw_stream_stats_get(s, &ss);
    assert_true(ss.resend_requests >= 1); /* repair was tried first */
    assert_int_equal(ss.items, 3);
    got_free(g);
}

/* ======================================================================== */
/* 8. Bad input on the request subject                                       */

#define RAW_ROUTER "rawrouter"

/* Publishes bytes on the request subject with NATS reply subject
 * sw.rsp.RAW_ROUTER.<hex> and returns the one answer, decoded. */
static swp_item *
raw_request(env *e, natsSubscription *sub, const void *bytes, size_t len, const char *hex)
{
    natsConnection *nc = sw_conn_nats(e->fc);
    char reply[SWT_SUBJECT_MAX];
    natsMsg *m = NULL;
    swp_item *w = NULL;
    natsStatus ns;

    assert_int_equal(swt_subject_response(reply, sizeof(reply), RAW_ROUTER, hex), SW_OK);
    assert_int_equal(natsConnection_PublishRequest(nc, sw_ingress_request_subject(e->ing), reply,
                                                   bytes, (int)len),
                     NATS_OK);
    ns = natsSubscription_NextMsg(&m, sub, (int64_t)T(5000));
    if (ns != NATS_OK)
        fail_msg("no answer to a bad request: %s", natsStatus_GetText(ns));
    assert_string_equal(natsMsg_GetSubject(m), reply);
    assert_int_equal(swp_decode_item((const uint8_t *)natsMsg_GetData(m),
                                     (size_t)natsMsg_GetDataLength(m), 1 << 20, &w),
                     SW_OK);
    natsMsg_Destroy(m);
    return w;
}

/* The worker's answer: a one-item stream, seq 1, final, FAILED with code. */
static void
assert_reject(const swp_item *w, const uint8_t id[16], sw_err code, const char *instance)
{
    assert_non_null(w);
    assert_int_equal(w->request_id.len, 16);
    assert_memory_equal(w->request_id.data, id, 16);
    assert_int_equal(w->seq, 1);
    assert_true(w->complete_final);
    assert_non_null(w->terminal);
    assert_int_equal(w->terminal->status, STREAMWIRE__V1__STATUS__STATUS_FAILED);
    assert_non_null(w->terminal->error);
    if (w->terminal->error->sw_code != (uint32_t)code)
        fail_msg("reject code %u (%s), want %s", w->terminal->error->sw_code,
                 sw_err_name((int)w->terminal->error->sw_code), sw_err_name(code));
    assert_string_equal(w->instance_id, instance);
}

/* A Request with the given version/endpoint/payload size whose embedded
 * response subject is sw.rsp.RAW_ROUTER.<hex>. */
static void
encode_request(uint32_t version, const char *endpoint, size_t payload_len, const uint8_t id[16],
               const char *hex, uint8_t **out, size_t *outlen)
{
    swp_request m = STREAMWIRE__V1__REQUEST__INIT;
    char resp[SWT_SUBJECT_MAX];
    uint8_t *payload = calloc(1, payload_len + 1);
    assert_non_null(payload);
    assert_int_equal(swt_subject_response(resp, sizeof(resp), RAW_ROUTER, hex), SW_OK);
    m.version = version;
    m.request_id.data = (uint8_t *)id;
    m.request_id.len = 16;
    m.response_subject = resp;
    m.router_id = (char *)RAW_ROUTER;
    m.payload.data = payload;
    m.payload.len = payload_len;
    m.credit_window = 16;
    m.heartbeat_ms = 250;
    m.endpoint = (char *)endpoint;
    assert_int_equal(swp_encode_alloc(&m, SIZE_MAX, out, outlen), SW_OK);
    free(payload);
}

/* A request whose response subject is not its own (sw.rsp.<router>.<id>)
 * is refused without a word (issue 11 #12). */
static void
custom_response_subject_refused(void **state)
{
    env *e = *state;
    natsConnection *nc;
    natsSubscription *sub = NULL, *hbsub = NULL;
    swp_request m = STREAMWIRE__V1__REQUEST__INIT;
    uint8_t id[16], *buf = NULL;
    char hex[SW_REQUEST_ID_HEX], resp[64], hbsubj[SWT_SUBJECT_MAX];
    size_t blen = 0;
    int beats = 0, items = 0;
    int64_t until;

    e->w.mode = M_PAUSE;
    e->w.k = 1;
    e->w.n = 2;
    e->w.delay_ms = 600;
    env_start(e, NULL, NULL);
    nc = sw_conn_nats(e->fc);
    random_id(id, hex);
    snprintf(resp, sizeof(resp), "custom.%s", hex);
    assert_int_equal(natsConnection_SubscribeSync(&sub, nc, resp), NATS_OK);
    assert_int_equal(swt_subject_beats(hbsubj, sizeof(hbsubj), RAW_ROUTER), SW_OK);
    assert_int_equal(natsConnection_SubscribeSync(&hbsub, nc, hbsubj), NATS_OK);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    m.version = 1;
    m.request_id.data = id;
    m.request_id.len = 16;
    m.response_subject = resp;
    m.router_id = (char *)RAW_ROUTER;
    m.credit_window = 16;
    m.heartbeat_ms = 50;
    m.endpoint = (char *)EP;
    assert_int_equal(swp_encode_alloc(&m, SIZE_MAX, &buf, &blen), SW_OK);
    assert_int_equal(
        natsConnection_PublishRequest(nc, sw_ingress_request_subject(e->ing), resp, buf, (int)blen),
        NATS_OK);
    free(buf);
    /* Issue 11 #12: the worker is no reflector. A response subject that is
     * not sw.rsp.<router_id>.<request id> gets nothing at all: no item, no
     * heartbeat, no error terminal; the request counts as bad and no
     * handler runs. (Before the fix this test checked that such a
     * subject got heartbeat wrappers.) */
    until = now_ms() + T(600);
    while (now_ms() < until) {
        natsMsg *msg = NULL;
        if (natsSubscription_NextMsg(&msg, sub, 50) == NATS_OK) {
            natsMsg_Destroy(msg);
            items++;
        }
        if (natsSubscription_NextMsg(&msg, hbsub, 1) == NATS_OK) {
            natsMsg_Destroy(msg);
            beats++;
        }
    }
    assert_int_equal(items, 0);
    assert_int_equal(beats, 0);
    {
        sw_ingress_stats st;
        sw_ingress_stats_get(e->ing, &st);
        assert_int_equal(st.bad_requests, 1);
        assert_int_equal(st.requests, 0);
    }
    (void)until;
    natsSubscription_Destroy(sub);
    natsSubscription_Destroy(hbsub);
}

static void
bad_input_on_request_subject(void **state)
{
    env *e = *state;
    sw_ingress_opts io;
    natsConnection *nc;
    natsSubscription *sub = NULL;
    static const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                      0xff, 0xff, 0xff, 0xff, 0xff, 0x02};
    uint8_t id[16], *buf = NULL;
    char hex[SW_REQUEST_ID_HEX];
    size_t blen = 0;
    swp_item *w;
    sw_ingress_stats st;
    got *g = new_got(e);
    sw_stream *s;

    sw_ingress_opts_init(&io);
    io.max_request_bytes = 1024;
    e->w.mode = M_STREAM;
    e->w.n = 5;
    env_start(e, &io, NULL);
    nc = sw_conn_nats(e->fc);
    assert_int_equal(natsConnection_SubscribeSync(&sub, nc, "sw.rsp." RAW_ROUTER ".*"), NATS_OK);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    srand((unsigned)now_ms());

    /* 1. garbage -> protocol_error */
    random_id(id, hex);
    w = raw_request(e, sub, garbage, sizeof(garbage), hex);
    assert_reject(w, id, SW_EPROTO, sw_ingress_instance_id(e->ing));
    swp_free(w);

    /* 2. version 2 -> unsupported_version */
    random_id(id, hex);
    encode_request(2, EP, 10, id, hex, &buf, &blen);
    w = raw_request(e, sub, buf, blen, hex);
    assert_reject(w, id, SW_EVERSION, sw_ingress_instance_id(e->ing));
    swp_free(w);
    free(buf);

    /* 3. larger than max_request_bytes -> payload_too_large */
    random_id(id, hex);
    encode_request(1, EP, 2000, id, hex, &buf, &blen);
    assert_true(blen > 1024);
    w = raw_request(e, sub, buf, blen, hex);
    assert_reject(w, id, SW_EMSGSIZE, sw_ingress_instance_id(e->ing));
    swp_free(w);
    free(buf);

    /* 4. an empty message: version 0 -> unsupported_version */
    random_id(id, hex);
    w = raw_request(e, sub, "", 0, hex);
    assert_reject(w, id, SW_EVERSION, sw_ingress_instance_id(e->ing));
    swp_free(w);

    /* 5. a valid request for another endpoint -> invalid_argument */
    random_id(id, hex);
    encode_request(1, "itest.other.generate", 10, id, hex, &buf, &blen);
    w = raw_request(e, sub, buf, blen, hex);
    assert_reject(w, id, SW_EINVAL, sw_ingress_instance_id(e->ing));
    swp_free(w);
    free(buf);

    /* 6. garbage without a reply subject, and with a reply subject that is
     * not a response subject: counted, no answer. */
    assert_int_equal(natsConnection_Publish(nc, sw_ingress_request_subject(e->ing), garbage,
                                            (int)sizeof(garbage)),
                     NATS_OK);
    assert_int_equal(natsConnection_PublishRequest(nc, sw_ingress_request_subject(e->ing),
                                                   "sw.rsp." RAW_ROUTER, garbage,
                                                   (int)sizeof(garbage)),
                     NATS_OK);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    assert_int_equal(ist_wait(e, f_bad, 7, T(5000)), 7);
    {
        natsMsg *m = NULL;
        assert_int_equal(natsSubscription_NextMsg(&m, sub, 200), NATS_TIMEOUT);
    }
    ingress_stats(e, &st);
    assert_int_equal(st.requests, 0);
    assert_int_equal(wctx_get(&e->w, &e->w.started), 0);
    natsSubscription_Unsubscribe(sub);
    natsSubscription_Destroy(sub);

    /* The worker still serves a normal stream. */
    s = env_open(e);
    assert_true(collect(s, g, 0, T(10000)));
    assert_tokens(g, 5);
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_done(g);
    ingress_stats(e, &st);
    assert_int_equal(st.requests, 1);
    assert_int_equal(st.bad_requests, 7);
    got_free(g);
}

/* ======================================================================== */

int
main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        T_(custom_response_subject_refused), T_(item_after_final),
        T_(item_after_final_callback),       T_(decode_error),
        T_(decode_error_callback),           T_(sequence_gap),
        T_(bad_input_on_request_subject),
    };
    sf_filters(argc, argv);
    return cmocka_run_group_tests_name("streams.badinput", tests, sf_group_setup,
                                       sf_group_teardown);
}
