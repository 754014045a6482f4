/* tests/unit/test_codec.c -- proto/codec.c and the name rules it relies on:
 * round trips of every wire message, truncated / garbage / oversized input,
 * version and required-field validation, unknown fields, encode limits,
 * subject and token validation, the transport subject builders, and the
 * hand-encoded wrappers and batches (swp_hdr_write & co., swp_check_batch). */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/sw_common.h"
#include "proto/sw_codec.h"
#include "tests/fuzz/pbc_quirks.h"
#include "transport/sw_transport.h"

#define MAXLEN (1u << 20)

/* ------------------------------------------------------------ helpers */

typedef enum msg_kind { K_REQUEST = 0, K_ITEM, K_CONTROL, K_PROBE, K_INSTANCE, K_COUNT } msg_kind;

static const char *const kind_names[K_COUNT] = {"request", "item", "control", "probe_reply",
                                                "instance"};

static const uint8_t RID[SW_REQUEST_ID_BYTES] = {0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77,
                                                 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff};
#define RID_HEX "00112233445566778899aabbccddeeff"
#define RSP_SUBJECT "sw.rsp.rtr-1." RID_HEX

/* Decodes with the decoder for kind; *out is the typed message or NULL. */
static sw_err
decode_any(msg_kind kind, const uint8_t *buf, size_t len, size_t max, void **out)
{
    sw_err rv = SW_EINTERNAL;
    switch (kind) {
    case K_REQUEST: {
        swp_request *m = (swp_request *)(uintptr_t)1;
        rv = swp_decode_request(buf, len, max, &m);
        *out = m;
        break;
    }
    case K_ITEM: {
        swp_item *m = (swp_item *)(uintptr_t)1;
        rv = swp_decode_item(buf, len, max, &m);
        *out = m;
        break;
    }
    case K_CONTROL: {
        swp_control *m = (swp_control *)(uintptr_t)1;
        rv = swp_decode_control(buf, len, max, &m);
        *out = m;
        break;
    }
    case K_PROBE: {
        swp_probe_reply *m = (swp_probe_reply *)(uintptr_t)1;
        rv = swp_decode_probe_reply(buf, len, max, &m);
        *out = m;
        break;
    }
    case K_INSTANCE: {
        swp_instance *m = (swp_instance *)(uintptr_t)1;
        rv = swp_decode_instance(buf, len, max, &m);
        *out = m;
        break;
    }
    default:
        fail_msg("bad kind %d", (int)kind);
    }
    return rv;
}

/* Encodes msg both ways, checks they agree, returns the malloc'd bytes. */
static uint8_t *
encode_msg(const void *msg, size_t *len)
{
    uint8_t *a = NULL, *b;
    size_t alen = 0, blen = 0, size = swp_encoded_size(msg);
    assert_int_equal(swp_encode_alloc(msg, MAXLEN, &a, &alen), SW_OK);
    assert_non_null(a);
    assert_int_equal(alen, size);
    b = malloc(size + 16);
    assert_non_null(b);
    memset(b, 0xee, size + 16);
    assert_int_equal(swp_encode(msg, b, size + 16, &blen), SW_OK);
    assert_int_equal(blen, size);
    assert_memory_equal(a, b, size);
    assert_int_equal(b[size], 0xee); /* nothing written past the end */
    free(b);
    *len = alen;
    return a;
}

static ProtobufCBinaryData
bin(const void *p, size_t n)
{
    ProtobufCBinaryData d;
    d.data = (uint8_t *)(uintptr_t)p;
    d.len = n;
    return d;
}

static void
assert_bin(ProtobufCBinaryData d, const void *p, size_t n)
{
    assert_int_equal(d.len, n);
    if (n > 0)
        assert_memory_equal(d.data, p, n);
}

static uint64_t
rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* ------------------------------------------------------------ sample messages */

static uint8_t sealed_pk[32], sealed_nonce[24], sealed_ct[48];
static const uint8_t PAYLOAD[] = {'h', 'i', 0x00, 0x01, 0xff, 'x'};

static Streamwire__V1__Request__HeadersEntry req_h1 = STREAMWIRE__V1__REQUEST__HEADERS_ENTRY__INIT;
static Streamwire__V1__Request__HeadersEntry req_h2 = STREAMWIRE__V1__REQUEST__HEADERS_ENTRY__INIT;
static Streamwire__V1__Request__HeadersEntry req_h3 = STREAMWIRE__V1__REQUEST__HEADERS_ENTRY__INIT;
static Streamwire__V1__Request__HeadersEntry *req_headers[3] = {&req_h1, &req_h2, &req_h3};
static Streamwire__V1__Sealed req_sealed = STREAMWIRE__V1__SEALED__INIT;

static void
fill_sealed(Streamwire__V1__Sealed *s)
{
    for (size_t i = 0; i < sizeof(sealed_pk); i++)
        sealed_pk[i] = (uint8_t)(0x40 + i);
    for (size_t i = 0; i < sizeof(sealed_nonce); i++)
        sealed_nonce[i] = (uint8_t)(0x80 + i);
    for (size_t i = 0; i < sizeof(sealed_ct); i++)
        sealed_ct[i] = (uint8_t)(0xc0 + i);
    *s = (Streamwire__V1__Sealed)STREAMWIRE__V1__SEALED__INIT;
    s->key_id = 7;
    s->sender_pk = bin(sealed_pk, sizeof(sealed_pk));
    s->nonce = bin(sealed_nonce, sizeof(sealed_nonce));
    s->ciphertext = bin(sealed_ct, sizeof(sealed_ct));
}

static void
check_sealed(const Streamwire__V1__Sealed *s)
{
    assert_non_null(s);
    assert_int_equal(s->key_id, 7);
    assert_bin(s->sender_pk, sealed_pk, sizeof(sealed_pk));
    assert_bin(s->nonce, sealed_nonce, sizeof(sealed_nonce));
    assert_bin(s->ciphertext, sealed_ct, sizeof(sealed_ct));
}

/* A minimal valid request: only what the decoder requires. */
static void
fill_request_min(swp_request *r)
{
    *r = (swp_request)STREAMWIRE__V1__REQUEST__INIT;
    r->version = SW_PROTOCOL_VERSION;
    r->request_id = bin(RID, sizeof(RID));
    r->response_subject = (char *)RSP_SUBJECT;
    r->router_id = (char *)"rtr-1";
}

/* A request with every field set. */
static void
fill_request_full(swp_request *r)
{
    fill_request_min(r);
    r->payload = bin(PAYLOAD, sizeof(PAYLOAD));
    r->credit_window = 64;
    r->heartbeat_ms = 250;
    r->deadline_ms = 30000;
    r->endpoint = (char *)"ns.component.generate";
    r->max_tokens = 4096;
    req_h1.key = (char *)"traceparent";
    req_h1.value = (char *)"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    req_h2.key = (char *)"x-empty";
    req_h2.value = (char *)"";
    req_h3.key = (char *)"tenant";
    req_h3.value = (char *)"acme";
    r->n_headers = 3;
    r->headers = req_headers;
    r->resume_from_seq = 42;
    fill_sealed(&req_sealed);
    r->sealed = &req_sealed;
    r->auth_token = bin("tok\0en", 6);
}

static Streamwire__V1__Heartbeat item_hb = STREAMWIRE__V1__HEARTBEAT__INIT;
static Streamwire__V1__Terminal item_term = STREAMWIRE__V1__TERMINAL__INIT;
static Streamwire__V1__Error item_err = STREAMWIRE__V1__ERROR__INIT;
static Streamwire__V1__Sealed item_sealed = STREAMWIRE__V1__SEALED__INIT;

static void
fill_item_base(swp_item *m)
{
    /* the generated INIT macro trips -Wmissing-braces (union {0}) */
    streamwire__v1__stream_item_wrapper__init(m);
    m->version = SW_PROTOCOL_VERSION;
    m->request_id = bin(RID, sizeof(RID));
    m->instance_id = (char *)"inst-a";
}

static void
fill_item_data(swp_item *m)
{
    fill_item_base(m);
    m->seq = 3;
    m->body_case = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_DATA;
    m->data = bin(PAYLOAD, sizeof(PAYLOAD));
    m->droppable = 1;
    m->resent = 1;
}

static void
fill_item_heartbeat(swp_item *m)
{
    fill_item_base(m);
    m->seq = 0;
    m->body_case = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_HEARTBEAT;
    item_hb = (Streamwire__V1__Heartbeat)STREAMWIRE__V1__HEARTBEAT__INIT;
    item_hb.last_seq = 17;
    item_hb.inflight = 5;
    m->heartbeat = &item_hb;
}

/* A final item. status FAILED uses app_code unless sw_code != 0. */
static void
fill_item_final(swp_item *m, Streamwire__V1__Status status, const char *reason, uint32_t sw_code,
                const char *app_code)
{
    fill_item_base(m);
    m->seq = 9;
    m->complete_final = 1;
    item_term = (Streamwire__V1__Terminal)STREAMWIRE__V1__TERMINAL__INIT;
    item_term.status = status;
    item_term.finish_reason = (char *)(reason ? reason : "");
    if (status == STREAMWIRE__V1__STATUS__STATUS_FAILED) {
        item_err = (Streamwire__V1__Error)STREAMWIRE__V1__ERROR__INIT;
        item_err.sw_code = sw_code;
        item_err.app_code = (char *)(app_code ? app_code : "");
        item_err.message = (char *)"the engine fell over";
        item_term.error = &item_err;
    }
    m->terminal = &item_term;
}

static void
fill_control(swp_control *c, Streamwire__V1__ControlKind kind)
{
    *c = (swp_control)STREAMWIRE__V1__CONTROL__INIT;
    c->version = SW_PROTOCOL_VERSION;
    c->request_id = bin(RID, sizeof(RID));
    c->kind = kind;
    c->router_id = (char *)"rtr-1";
    if (kind == STREAMWIRE__V1__CONTROL_KIND__CONTROL_CREDIT) {
        c->credit_limit = 128;
        c->ack_seq = 64;
    } else if (kind == STREAMWIRE__V1__CONTROL_KIND__CONTROL_RESEND) {
        c->resend_from = 5;
        c->resend_to = 9;
    }
}

static void
fill_probe(swp_probe_reply *p)
{
    *p = (swp_probe_reply)STREAMWIRE__V1__PROBE_REPLY__INIT;
    p->version = SW_PROTOCOL_VERSION;
    p->instance_id = (char *)"inst-a";
    p->known = 1;
    p->last_seq = UINT64_C(0x1234567890);
    p->inflight = 12;
    p->draining = 1;
}

static Streamwire__V1__InstanceInfo__LabelsEntry inst_l1 =
    STREAMWIRE__V1__INSTANCE_INFO__LABELS_ENTRY__INIT;
static Streamwire__V1__InstanceInfo__LabelsEntry inst_l2 =
    STREAMWIRE__V1__INSTANCE_INFO__LABELS_ENTRY__INIT;
static Streamwire__V1__InstanceInfo__LabelsEntry *inst_labels[2] = {&inst_l1, &inst_l2};

static void
fill_instance(swp_instance *m)
{
    *m = (swp_instance)STREAMWIRE__V1__INSTANCE_INFO__INIT;
    m->version = SW_PROTOCOL_VERSION;
    m->instance_id = (char *)"inst-a";
    m->endpoint = (char *)"ns.component.generate";
    m->request_subject = (char *)"sw.req.ns.component.generate.inst-a";
    m->control_subject = (char *)"sw.ctl.inst-a";
    m->started_unix_ms = UINT64_C(1700000000000);
    m->host = (char *)"gpu-node-7";
    m->pid = 4242;
    inst_l1.key = (char *)"zone";
    inst_l1.value = (char *)"eu-west-1a";
    inst_l2.key = (char *)"gpu";
    inst_l2.value = (char *)"h100";
    m->n_labels = 2;
    m->labels = inst_labels;
    m->public_key = bin(sealed_pk, sizeof(sealed_pk));
    m->refreshed_unix_ms = UINT64_C(1700000005000);
    m->lease_ms = 3000;
    m->draining = 0;
}

/* One encoded valid sample per message shape (used by the truncation,
 * unknown-field and mutation tests). */
typedef struct sample {
    msg_kind kind;
    const char *name;
    uint8_t *buf;
    size_t len;
} sample;

#define NSAMPLES 16

static void
build_samples(sample *s)
{
    swp_request r;
    swp_item it;
    swp_control c;
    swp_probe_reply p;
    swp_instance in;
    int n = 0;

#define ADD(k, nm, msg)                          \
    do {                                         \
        s[n].kind = (k);                         \
        s[n].name = (nm);                        \
        s[n].buf = encode_msg((msg), &s[n].len); \
        n++;                                     \
    } while (0)

    fill_request_full(&r);
    ADD(K_REQUEST, "request_full", &r);
    fill_request_min(&r);
    ADD(K_REQUEST, "request_min", &r);
    fill_item_data(&it);
    ADD(K_ITEM, "item_data", &it);
    fill_item_heartbeat(&it);
    ADD(K_ITEM, "item_heartbeat", &it);
    fill_item_final(&it, STREAMWIRE__V1__STATUS__STATUS_COMPLETED, "stop", 0, NULL);
    ADD(K_ITEM, "final_completed", &it);
    fill_item_final(&it, STREAMWIRE__V1__STATUS__STATUS_INCOMPLETE, "max_tokens", 0, NULL);
    ADD(K_ITEM, "final_incomplete", &it);
    fill_item_final(&it, STREAMWIRE__V1__STATUS__STATUS_CANCELLED, "cancelled", 0, NULL);
    ADD(K_ITEM, "final_cancelled", &it);
    fill_item_final(&it, STREAMWIRE__V1__STATUS__STATUS_FAILED, NULL, 0, "engine_error");
    ADD(K_ITEM, "final_failed_app", &it);
    fill_item_final(&it, STREAMWIRE__V1__STATUS__STATUS_FAILED, NULL, SW_EOVERLOADED, NULL);
    ADD(K_ITEM, "final_failed_sw", &it);
    fill_control(&c, STREAMWIRE__V1__CONTROL_KIND__CONTROL_CANCEL);
    ADD(K_CONTROL, "control_cancel", &c);
    fill_control(&c, STREAMWIRE__V1__CONTROL_KIND__CONTROL_CREDIT);
    ADD(K_CONTROL, "control_credit", &c);
    fill_control(&c, STREAMWIRE__V1__CONTROL_KIND__CONTROL_RESEND);
    ADD(K_CONTROL, "control_resend", &c);
    fill_control(&c, STREAMWIRE__V1__CONTROL_KIND__CONTROL_PROBE);
    c.request_id = bin(NULL, 0);
    ADD(K_CONTROL, "control_probe_instance", &c);
    fill_probe(&p);
    ADD(K_PROBE, "probe_reply", &p);
    fill_instance(&in);
    ADD(K_INSTANCE, "instance", &in);
    fill_control(&c, STREAMWIRE__V1__CONTROL_KIND__CONTROL_KILL);
    ADD(K_CONTROL, "control_kill", &c);
#undef ADD
    assert_int_equal(n, NSAMPLES);
}

static void
free_samples(sample *s)
{
    for (int i = 0; i < NSAMPLES; i++)
        free(s[i].buf);
}

/* Encodes msg and decodes it as kind; asserts the result is want. */
static void
expect_decode_rv(msg_kind kind, const void *msg, sw_err want, const char *what)
{
    size_t len;
    uint8_t *b = encode_msg(msg, &len);
    void *out = NULL;
    sw_err rv = decode_any(kind, b, len, MAXLEN, &out);
    if (rv != want)
        fail_msg("%s (%s): got %s, want %s", what, kind_names[kind], sw_err_name(rv),
                 sw_err_name(want));
    if (want == SW_OK) {
        assert_non_null(out);
        swp_free(out);
    } else {
        assert_null(out);
    }
    free(b);
}

/* ------------------------------------------------------------ round trips */

static void
test_request_round_trip_full(void **state)
{
    swp_request r, *d = NULL;
    uint8_t *b;
    size_t len;
    (void)state;
    fill_request_full(&r);
    b = encode_msg(&r, &len);
    assert_int_equal(swp_decode_request(b, len, MAXLEN, &d), SW_OK);
    assert_non_null(d);
    assert_int_equal(d->version, 1);
    assert_bin(d->request_id, RID, sizeof(RID));
    assert_string_equal(d->response_subject, RSP_SUBJECT);
    assert_string_equal(d->router_id, "rtr-1");
    assert_bin(d->payload, PAYLOAD, sizeof(PAYLOAD));
    assert_int_equal(d->credit_window, 64);
    assert_int_equal(d->heartbeat_ms, 250);
    assert_int_equal(d->deadline_ms, 30000);
    assert_string_equal(d->endpoint, "ns.component.generate");
    assert_int_equal(d->max_tokens, 4096);
    assert_int_equal(d->n_headers, 3);
    assert_string_equal(d->headers[0]->key, "traceparent");
    assert_string_equal(d->headers[0]->value,
                        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    assert_string_equal(d->headers[1]->key, "x-empty");
    assert_string_equal(d->headers[1]->value, "");
    assert_string_equal(d->headers[2]->key, "tenant");
    assert_string_equal(d->headers[2]->value, "acme");
    assert_int_equal(d->resume_from_seq, 42);
    check_sealed(d->sealed);
    assert_bin(d->auth_token, "tok\0en", 6);
    swp_free(d);
    free(b);
}

static void
test_request_round_trip_min(void **state)
{
    swp_request r, *d = NULL;
    uint8_t *b;
    size_t len;
    (void)state;
    fill_request_min(&r);
    b = encode_msg(&r, &len);
    assert_int_equal(swp_decode_request(b, len, MAXLEN, &d), SW_OK);
    assert_non_null(d);
    assert_int_equal(d->version, 1);
    assert_bin(d->request_id, RID, sizeof(RID));
    assert_string_equal(d->response_subject, RSP_SUBJECT);
    assert_string_equal(d->router_id, "rtr-1");
    assert_int_equal(d->payload.len, 0);
    assert_int_equal(d->credit_window, 0);
    assert_int_equal(d->heartbeat_ms, 0);
    assert_int_equal(d->deadline_ms, 0);
    assert_string_equal(d->endpoint, "");
    assert_int_equal(d->max_tokens, 0);
    assert_int_equal(d->n_headers, 0);
    assert_int_equal(d->resume_from_seq, 0);
    assert_null(d->sealed);
    assert_int_equal(d->auth_token.len, 0);
    swp_free(d);
    free(b);
}

static swp_item *
item_round_trip(const swp_item *m)
{
    swp_item *d = NULL;
    size_t len;
    uint8_t *b = encode_msg(m, &len);
    assert_int_equal(swp_decode_item(b, len, MAXLEN, &d), SW_OK);
    assert_non_null(d);
    free(b);
    assert_int_equal(d->version, 1);
    assert_bin(d->request_id, RID, sizeof(RID));
    assert_string_equal(d->instance_id, "inst-a");
    return d;
}

static void
test_item_round_trip_data(void **state)
{
    swp_item m, *d;
    (void)state;
    fill_item_data(&m);
    fill_sealed(&item_sealed);
    m.sealed = &item_sealed;
    d = item_round_trip(&m);
    assert_int_equal(d->seq, 3);
    assert_int_equal(d->body_case, STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_DATA);
    assert_bin(d->data, PAYLOAD, sizeof(PAYLOAD));
    assert_true(d->droppable);
    assert_true(d->resent);
    assert_false(d->complete_final);
    assert_null(d->terminal);
    check_sealed(d->sealed);
    swp_free(d);

    /* an empty data item is still a data item */
    fill_item_data(&m);
    m.data = bin(NULL, 0);
    m.droppable = 0;
    m.resent = 0;
    d = item_round_trip(&m);
    assert_int_equal(d->body_case, STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_DATA);
    assert_int_equal(d->data.len, 0);
    assert_false(d->droppable);
    assert_false(d->resent);
    swp_free(d);

    /* seq near the top of the range */
    fill_item_data(&m);
    m.seq = UINT64_MAX;
    d = item_round_trip(&m);
    assert_true(d->seq == UINT64_MAX);
    swp_free(d);
}

static void
test_item_round_trip_heartbeat(void **state)
{
    swp_item m, *d;
    (void)state;
    fill_item_heartbeat(&m);
    d = item_round_trip(&m);
    assert_int_equal(d->seq, 0);
    assert_int_equal(d->body_case, STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_HEARTBEAT);
    assert_non_null(d->heartbeat);
    assert_int_equal(d->heartbeat->last_seq, 17);
    assert_int_equal(d->heartbeat->inflight, 5);
    assert_false(d->complete_final);
    swp_free(d);

    /* a heartbeat with all-default fields is still a heartbeat */
    fill_item_heartbeat(&m);
    item_hb.last_seq = 0;
    item_hb.inflight = 0;
    d = item_round_trip(&m);
    assert_int_equal(d->body_case, STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_HEARTBEAT);
    assert_non_null(d->heartbeat);
    assert_int_equal(d->heartbeat->last_seq, 0);
    swp_free(d);
}

static void
test_item_round_trip_finals(void **state)
{
    static const struct {
        Streamwire__V1__Status status;
        const char *reason;
    } plain[] = {
        {STREAMWIRE__V1__STATUS__STATUS_COMPLETED, "stop"},
        {STREAMWIRE__V1__STATUS__STATUS_COMPLETED, ""},
        {STREAMWIRE__V1__STATUS__STATUS_INCOMPLETE, "max_tokens"},
        {STREAMWIRE__V1__STATUS__STATUS_CANCELLED, "cancelled"},
    };
    swp_item m, *d;
    (void)state;
    for (size_t i = 0; i < sizeof(plain) / sizeof(plain[0]); i++) {
        fill_item_final(&m, plain[i].status, plain[i].reason, 0, NULL);
        d = item_round_trip(&m);
        assert_int_equal(d->seq, 9);
        assert_true(d->complete_final);
        assert_non_null(d->terminal);
        assert_int_equal(d->terminal->status, plain[i].status);
        assert_string_equal(d->terminal->finish_reason, plain[i].reason);
        assert_null(d->terminal->error);
        assert_int_equal(d->body_case, STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY__NOT_SET);
        swp_free(d);
    }

    /* FAILED with an application code */
    fill_item_final(&m, STREAMWIRE__V1__STATUS__STATUS_FAILED, NULL, 0, "engine_error");
    d = item_round_trip(&m);
    assert_true(d->complete_final);
    assert_int_equal(d->terminal->status, STREAMWIRE__V1__STATUS__STATUS_FAILED);
    assert_non_null(d->terminal->error);
    assert_int_equal(d->terminal->error->sw_code, 0);
    assert_string_equal(d->terminal->error->app_code, "engine_error");
    assert_string_equal(d->terminal->error->message, "the engine fell over");
    swp_free(d);

    /* FAILED with a streamwire code (no app code needed) */
    fill_item_final(&m, STREAMWIRE__V1__STATUS__STATUS_FAILED, NULL, SW_EOVERLOADED, NULL);
    d = item_round_trip(&m);
    assert_int_equal(d->terminal->status, STREAMWIRE__V1__STATUS__STATUS_FAILED);
    assert_int_equal(d->terminal->error->sw_code, SW_EOVERLOADED);
    assert_string_equal(d->terminal->error->app_code, "");
    assert_string_equal(sw_err_name((int)d->terminal->error->sw_code), "overloaded");
    swp_free(d);

    fill_item_final(&m, STREAMWIRE__V1__STATUS__STATUS_FAILED, NULL, SW_DEADLINE_EXCEEDED, NULL);
    d = item_round_trip(&m);
    assert_int_equal(d->terminal->error->sw_code, SW_DEADLINE_EXCEEDED);
    swp_free(d);

    /* a final may carry the last data chunk */
    fill_item_final(&m, STREAMWIRE__V1__STATUS__STATUS_COMPLETED, "stop", 0, NULL);
    m.body_case = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_DATA;
    m.data = bin(PAYLOAD, sizeof(PAYLOAD));
    d = item_round_trip(&m);
    assert_true(d->complete_final);
    assert_bin(d->data, PAYLOAD, sizeof(PAYLOAD));
    assert_int_equal(d->terminal->status, STREAMWIRE__V1__STATUS__STATUS_COMPLETED);
    swp_free(d);
}

static void
test_control_round_trip(void **state)
{
    static const Streamwire__V1__ControlKind kinds[] = {
        STREAMWIRE__V1__CONTROL_KIND__CONTROL_CANCEL, STREAMWIRE__V1__CONTROL_KIND__CONTROL_KILL,
        STREAMWIRE__V1__CONTROL_KIND__CONTROL_CREDIT, STREAMWIRE__V1__CONTROL_KIND__CONTROL_PROBE,
        STREAMWIRE__V1__CONTROL_KIND__CONTROL_RESEND,
    };
    (void)state;
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        swp_control c, *d = NULL;
        size_t len;
        uint8_t *b;
        fill_control(&c, kinds[i]);
        b = encode_msg(&c, &len);
        assert_int_equal(swp_decode_control(b, len, MAXLEN, &d), SW_OK);
        assert_non_null(d);
        assert_int_equal(d->version, 1);
        assert_int_equal(d->kind, kinds[i]);
        assert_bin(d->request_id, RID, sizeof(RID));
        assert_string_equal(d->router_id, "rtr-1");
        assert_int_equal(d->credit_limit, c.credit_limit);
        assert_int_equal(d->ack_seq, c.ack_seq);
        assert_int_equal(d->resend_from, c.resend_from);
        assert_int_equal(d->resend_to, c.resend_to);
        assert_null(d->sealed);
        if (kinds[i] == STREAMWIRE__V1__CONTROL_KIND__CONTROL_CREDIT) {
            assert_int_equal(d->credit_limit, 128);
            assert_int_equal(d->ack_seq, 64);
        }
        if (kinds[i] == STREAMWIRE__V1__CONTROL_KIND__CONTROL_RESEND) {
            assert_int_equal(d->resend_from, 5);
            assert_int_equal(d->resend_to, 9);
        }
        swp_free(d);
        free(b);
    }

    /* instance-wide PROBE: no request id */
    {
        swp_control c, *d = NULL;
        size_t len;
        uint8_t *b;
        fill_control(&c, STREAMWIRE__V1__CONTROL_KIND__CONTROL_PROBE);
        c.request_id = bin(NULL, 0);
        b = encode_msg(&c, &len);
        assert_int_equal(swp_decode_control(b, len, MAXLEN, &d), SW_OK);
        assert_int_equal(d->kind, STREAMWIRE__V1__CONTROL_KIND__CONTROL_PROBE);
        assert_int_equal(d->request_id.len, 0);
        swp_free(d);
        free(b);
    }
    /* RESEND of a single item (from == to) */
    {
        swp_control c;
        fill_control(&c, STREAMWIRE__V1__CONTROL_KIND__CONTROL_RESEND);
        c.resend_from = c.resend_to = 77;
        expect_decode_rv(K_CONTROL, &c, SW_OK, "resend one item");
        c.resend_from = 1;
        c.resend_to = SWP_MAX_WINDOW; /* width SWP_MAX_WINDOW - 1: the widest allowed */
        expect_decode_rv(K_CONTROL, &c, SW_OK, "resend widest range");
    }
}

static void
test_probe_reply_round_trip(void **state)
{
    swp_probe_reply p, *d = NULL;
    size_t len;
    uint8_t *b;
    (void)state;
    fill_probe(&p);
    b = encode_msg(&p, &len);
    assert_int_equal(swp_decode_probe_reply(b, len, MAXLEN, &d), SW_OK);
    assert_non_null(d);
    assert_int_equal(d->version, 1);
    assert_string_equal(d->instance_id, "inst-a");
    assert_true(d->known);
    assert_true(d->last_seq == UINT64_C(0x1234567890));
    assert_int_equal(d->inflight, 12);
    assert_true(d->draining);
    swp_free(d);
    free(b);
}

static void
test_instance_round_trip(void **state)
{
    swp_instance m, *d = NULL;
    size_t len;
    uint8_t *b;
    (void)state;
    fill_instance(&m);
    b = encode_msg(&m, &len);
    assert_int_equal(swp_decode_instance(b, len, MAXLEN, &d), SW_OK);
    assert_non_null(d);
    assert_int_equal(d->version, 1);
    assert_string_equal(d->instance_id, "inst-a");
    assert_string_equal(d->endpoint, "ns.component.generate");
    assert_string_equal(d->request_subject, "sw.req.ns.component.generate.inst-a");
    assert_string_equal(d->control_subject, "sw.ctl.inst-a");
    assert_true(d->started_unix_ms == UINT64_C(1700000000000));
    assert_string_equal(d->host, "gpu-node-7");
    assert_int_equal(d->pid, 4242);
    assert_int_equal(d->n_labels, 2);
    assert_string_equal(d->labels[0]->key, "zone");
    assert_string_equal(d->labels[0]->value, "eu-west-1a");
    assert_string_equal(d->labels[1]->key, "gpu");
    assert_string_equal(d->labels[1]->value, "h100");
    assert_bin(d->public_key, sealed_pk, sizeof(sealed_pk));
    assert_true(d->refreshed_unix_ms == UINT64_C(1700000005000));
    assert_int_equal(d->lease_ms, 3000);
    assert_false(d->draining);
    swp_free(d);
    free(b);
}

/* swp_decode_item_arena (the egress's hot path) agrees with swp_decode_item,
 * also for items that do not fit the arena, and fails the same way. */
static void
test_item_arena_decode(void **state)
{
    sample s[NSAMPLES];
    swp_arena *arena = malloc(sizeof(*arena)); /* heap: ASan sees overruns */
    uint8_t *big = malloc(3 * SWP_ARENA_BYTES);
    int items = 0;
    (void)state;
    assert_non_null(arena);
    assert_non_null(big);
    build_samples(s);
    for (int i = 0; i < NSAMPLES; i++) {
        if (s[i].kind != K_ITEM)
            continue;
        items++;
        for (size_t cut = 0; cut <= s[i].len; cut++) {
            swp_item *a = (swp_item *)(uintptr_t)1, *r = NULL;
            sw_err ra = swp_decode_item_arena(s[i].buf, cut, MAXLEN, arena, &a);
            sw_err rr = swp_decode_item(s[i].buf, cut, MAXLEN, &r);
            assert_int_equal(ra, rr);
            if (ra == SW_OK) {
                uint8_t *ea, *er;
                size_t la, lr;
                assert_non_null(a);
                ea = encode_msg(a, &la);
                er = encode_msg(r, &lr);
                assert_int_equal(la, lr);
                assert_memory_equal(ea, er, la);
                free(ea);
                free(er);
                swp_free_arena(a, arena);
                swp_free(r);
            } else {
                assert_null(a);
                assert_null(r);
            }
        }
    }
    assert_int_equal(items, 7);

    /* an item three times the arena: spills into malloc, frees cleanly */
    {
        swp_item m, *a = NULL;
        uint8_t *b;
        size_t len;
        for (size_t i = 0; i < 3 * SWP_ARENA_BYTES; i++)
            big[i] = (uint8_t)(i * 13);
        fill_item_data(&m);
        m.data = bin(big, 3 * SWP_ARENA_BYTES);
        b = encode_msg(&m, &len);
        assert_int_equal(swp_decode_item_arena(b, len, MAXLEN, arena, &a), SW_OK);
        assert_non_null(a);
        assert_bin(a->data, big, 3 * SWP_ARENA_BYTES);
        assert_string_equal(a->instance_id, "inst-a");
        swp_free_arena(a, arena);
        /* the arena is reusable: one message at a time */
        assert_int_equal(swp_decode_item_arena(s[2].buf, s[2].len, MAXLEN, arena, &a), SW_OK);
        assert_int_equal(a->seq, 3);
        swp_free_arena(a, arena);
        /* limits and arguments */
        a = (swp_item *)(uintptr_t)1;
        assert_int_equal(swp_decode_item_arena(b, len, len - 1, arena, &a), SW_EMSGSIZE);
        assert_null(a);
        assert_int_equal(swp_decode_item_arena(b, len, MAXLEN, NULL, &a), SW_EINVAL);
        assert_int_equal(swp_decode_item_arena(b, len, MAXLEN, arena, NULL), SW_EINVAL);
        swp_free_arena(NULL, arena);
        free(b);
    }
    free_samples(s);
    free(big);
    free(arena);
}

/* ------------------------------------------------------------ hostile input */

static void
test_truncated_every_length(void **state)
{
    sample s[NSAMPLES];
    (void)state;
    build_samples(s);
    for (int i = 0; i < NSAMPLES; i++) {
        size_t accepted = 0;
        for (size_t cut = 0; cut < s[i].len; cut++) {
            void *out = NULL;
            /* a fresh copy of exactly cut bytes: any read past it is caught by ASan */
            uint8_t *copy = malloc(cut ? cut : 1);
            sw_err rv;
            assert_non_null(copy);
            memcpy(copy, s[i].buf, cut);
            rv = decode_any(s[i].kind, copy, cut, MAXLEN, &out);
            if (rv == SW_OK) {
                /* the prefix ends on a field boundary and is itself valid */
                assert_non_null(out);
                accepted++;
                swp_free(out);
            } else {
                assert_null(out);
                if (rv != SW_EPROTO && rv != SW_EVERSION)
                    fail_msg("%s cut at %zu: unexpected %s", s[i].name, cut, sw_err_name(rv));
            }
            /* len - 1 always cuts the last field short: never accepted */
            if (cut == s[i].len - 1)
                assert_int_equal(rv, SW_EPROTO);
            /* the empty prefix is all defaults: version 0 */
            if (cut == 0)
                assert_int_equal(rv, SW_EVERSION);
            free(copy);
        }
        /* most prefixes must be rejected */
        assert_true(accepted < s[i].len / 2 + 1);
    }
    free_samples(s);
}

static void
test_random_garbage(void **state)
{
    uint64_t seed = 0xdecafbad;
    uint8_t *buf = malloc(512);
    size_t ok = 0, total = 0;
    (void)state;
    assert_non_null(buf);
    for (int round = 0; round < 2000; round++) {
        size_t len = (size_t)(rng_next(&seed) % 513);
        for (size_t j = 0; j < len; j++)
            buf[j] = (uint8_t)rng_next(&seed);
        for (int k = 0; k < K_COUNT; k++) {
            void *out = NULL;
            sw_err rv = decode_any((msg_kind)k, buf, len, 512, &out);
            total++;
            if (rv == SW_OK) {
                assert_non_null(out);
                ok++;
                swp_free(out);
            } else {
                assert_null(out);
                if (rv != SW_EPROTO && rv != SW_EVERSION)
                    fail_msg("garbage as %s: unexpected %s", kind_names[k], sw_err_name(rv));
            }
        }
    }
    assert_int_equal(total, 2000 * K_COUNT);
    /* random bytes essentially never form a valid message */
    assert_true(ok < total / 100);
    free(buf);
}

/* Mutations of valid messages get deeper into the validators than pure noise.
 * Whatever decodes must re-encode and decode again. */
static void
test_mutated_samples(void **state)
{
    sample s[NSAMPLES];
    uint64_t seed = 99;
    uint8_t buf[1024];
    (void)state;
    build_samples(s);
    for (int round = 0; round < 4000; round++) {
        const sample *sm = &s[rng_next(&seed) % NSAMPLES];
        size_t len = sm->len;
        int nmut = 1 + (int)(rng_next(&seed) % 4);
        void *out = NULL;
        sw_err rv;
        assert_true(len <= sizeof(buf));
        memcpy(buf, sm->buf, len);
        for (int m = 0; m < nmut && len > 0; m++) {
            size_t at = (size_t)(rng_next(&seed) % len);
            switch (rng_next(&seed) % 3) {
            case 0:
                buf[at] ^= (uint8_t)(1u << (rng_next(&seed) % 8));
                break;
            case 1:
                buf[at] = (uint8_t)rng_next(&seed);
                break;
            default:
                len = at; /* truncate */
                break;
            }
        }
        rv = decode_any(sm->kind, buf, len, sizeof(buf), &out);
        if (rv == SW_OK) {
            uint8_t *re;
            size_t relen;
            void *again = NULL;
            assert_non_null(out);
            re = encode_msg(out, &relen);
            /* protobuf-c tag-0 quirk: see test_overlong_field_zero */
            if (!pbcq_has_tag0((const ProtobufCMessage *)out)) {
                assert_int_equal(decode_any(sm->kind, re, relen, MAXLEN, &again), SW_OK);
                assert_non_null(again);
                swp_free(again);
            }
            free(re);
            swp_free(out);
        } else {
            assert_null(out);
            assert_true(rv == SW_EPROTO || rv == SW_EVERSION);
        }
    }
    free_samples(s);
}

static void
test_oversized_input(void **state)
{
    sample s[NSAMPLES];
    (void)state;
    build_samples(s);
    for (int i = 0; i < NSAMPLES; i++) {
        void *out = NULL;
        /* exactly max: fine */
        assert_int_equal(decode_any(s[i].kind, s[i].buf, s[i].len, s[i].len, &out), SW_OK);
        assert_non_null(out);
        swp_free(out);
        /* one byte over: rejected before unpacking, nothing returned */
        out = NULL;
        assert_int_equal(decode_any(s[i].kind, s[i].buf, s[i].len, s[i].len - 1, &out),
                         SW_EMSGSIZE);
        assert_null(out);
        assert_int_equal(decode_any(s[i].kind, s[i].buf, s[i].len, 0, &out), SW_EMSGSIZE);
        assert_null(out);
    }
    /* a huge buffer of garbage is refused by its length alone */
    {
        size_t big = 200000;
        uint8_t *b = malloc(big);
        assert_non_null(b);
        memset(b, 0xff, big);
        for (int k = 0; k < K_COUNT; k++) {
            void *out = NULL;
            assert_int_equal(decode_any((msg_kind)k, b, big, 65536, &out), SW_EMSGSIZE);
            assert_null(out);
        }
        free(b);
    }
    free_samples(s);
}

static void
test_bad_arguments(void **state)
{
    sample s[NSAMPLES];
    (void)state;
    build_samples(s);
    /* NULL out */
    assert_int_equal(swp_decode_request(s[0].buf, s[0].len, MAXLEN, NULL), SW_EINVAL);
    assert_int_equal(swp_decode_item(s[2].buf, s[2].len, MAXLEN, NULL), SW_EINVAL);
    assert_int_equal(swp_decode_control(s[9].buf, s[9].len, MAXLEN, NULL), SW_EINVAL);
    assert_int_equal(swp_decode_probe_reply(s[13].buf, s[13].len, MAXLEN, NULL), SW_EINVAL);
    assert_int_equal(swp_decode_instance(s[14].buf, s[14].len, MAXLEN, NULL), SW_EINVAL);
    /* NULL buffer with a length */
    for (int k = 0; k < K_COUNT; k++) {
        void *out = NULL;
        assert_int_equal(decode_any((msg_kind)k, NULL, 10, MAXLEN, &out), SW_EINVAL);
        assert_null(out);
        /* NULL, 0: an empty message, i.e. version 0 */
        assert_int_equal(decode_any((msg_kind)k, NULL, 0, MAXLEN, &out), SW_EVERSION);
        assert_null(out);
    }
    swp_free(NULL);
    free_samples(s);
}

static void
test_wrong_version(void **state)
{
    static const uint32_t bad[] = {0, 2, 3, UINT32_MAX};
    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        swp_request r;
        swp_item it;
        swp_control c;
        swp_probe_reply p;
        swp_instance in;
        fill_request_full(&r);
        r.version = bad[i];
        expect_decode_rv(K_REQUEST, &r, SW_EVERSION, "request version");
        fill_item_data(&it);
        it.version = bad[i];
        expect_decode_rv(K_ITEM, &it, SW_EVERSION, "item version");
        fill_item_final(&it, STREAMWIRE__V1__STATUS__STATUS_COMPLETED, "stop", 0, NULL);
        it.version = bad[i];
        expect_decode_rv(K_ITEM, &it, SW_EVERSION, "final version");
        fill_control(&c, STREAMWIRE__V1__CONTROL_KIND__CONTROL_CANCEL);
        c.version = bad[i];
        expect_decode_rv(K_CONTROL, &c, SW_EVERSION, "control version");
        fill_probe(&p);
        p.version = bad[i];
        expect_decode_rv(K_PROBE, &p, SW_EVERSION, "probe version");
        fill_instance(&in);
        in.version = bad[i];
        expect_decode_rv(K_INSTANCE, &in, SW_EVERSION, "instance version");
    }
    /* the version is checked before anything else: a v2 message with no
     * valid field at all is still "unsupported version", not "protocol" */
    {
        swp_request r = STREAMWIRE__V1__REQUEST__INIT;
        r.version = 2;
        expect_decode_rv(K_REQUEST, &r, SW_EVERSION, "bare v2 request");
    }
}

static void
test_request_validation(void **state)
{
    static const uint8_t long_id[17] = {0};
    static const char *bad_subjects[] = {
        "",           "sw.rsp.*",   "sw.rsp.>",    "sw.rsp a.b", "sw..rsp",
        ".sw.rsp",    "sw.rsp.",    "sw.rsp.r1.*", "*",          ">",
        "sw.rsp.\tx", "sw.rsp.x\n", "sw.rsp.a*b",  "sw.\x7f",
    };
    static const char *bad_routers[] = {
        "",
        "rtr.1",
        "rtr 1",
        "r*",
        ">",
        "r/1",
        "rtr-1-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"};
    static const char *bad_endpoints[] = {"a.b",   "a.b.c.d", "a..c", ".b.c",     "a.b.",
                                          "a.*.c", "a.b.c ",  "ns",   "ns.comp.>"};
    swp_request r;
    (void)state;

    fill_request_full(&r);
    expect_decode_rv(K_REQUEST, &r, SW_OK, "full request");

    /* request id must be exactly 16 bytes */
    fill_request_full(&r);
    r.request_id = bin(RID, 15);
    expect_decode_rv(K_REQUEST, &r, SW_EPROTO, "request_id 15 bytes");
    r.request_id = bin(long_id, 17);
    expect_decode_rv(K_REQUEST, &r, SW_EPROTO, "request_id 17 bytes");
    r.request_id = bin(NULL, 0);
    expect_decode_rv(K_REQUEST, &r, SW_EPROTO, "request_id missing");

    for (size_t i = 0; i < sizeof(bad_subjects) / sizeof(bad_subjects[0]); i++) {
        fill_request_full(&r);
        r.response_subject = (char *)bad_subjects[i];
        expect_decode_rv(K_REQUEST, &r, SW_EPROTO, bad_subjects[i]);
    }
    for (size_t i = 0; i < sizeof(bad_routers) / sizeof(bad_routers[0]); i++) {
        fill_request_full(&r);
        r.router_id = (char *)bad_routers[i];
        expect_decode_rv(K_REQUEST, &r, SW_EPROTO, bad_routers[i]);
    }
    /* endpoint is optional, but when present it must be valid */
    fill_request_full(&r);
    r.endpoint = (char *)"";
    expect_decode_rv(K_REQUEST, &r, SW_OK, "no endpoint");
    for (size_t i = 0; i < sizeof(bad_endpoints) / sizeof(bad_endpoints[0]); i++) {
        fill_request_full(&r);
        r.endpoint = (char *)bad_endpoints[i];
        expect_decode_rv(K_REQUEST, &r, SW_EPROTO, bad_endpoints[i]);
    }
    /* limits */
    fill_request_full(&r);
    r.credit_window = SWP_MAX_WINDOW;
    expect_decode_rv(K_REQUEST, &r, SW_OK, "credit_window at max");
    r.credit_window = SWP_MAX_WINDOW + 1;
    expect_decode_rv(K_REQUEST, &r, SW_EPROTO, "credit_window over max");
    fill_request_full(&r);
    r.heartbeat_ms = SWP_MAX_HEARTBEAT_MS;
    expect_decode_rv(K_REQUEST, &r, SW_OK, "heartbeat at max");
    r.heartbeat_ms = SWP_MAX_HEARTBEAT_MS + 1;
    expect_decode_rv(K_REQUEST, &r, SW_EPROTO, "heartbeat over max");
}

static void
test_item_validation(void **state)
{
    swp_item m;
    (void)state;

    /* request id */
    fill_item_data(&m);
    m.request_id = bin(RID, 8);
    expect_decode_rv(K_ITEM, &m, SW_EPROTO, "item short request id");
    fill_item_heartbeat(&m);
    m.request_id = bin(NULL, 0);
    expect_decode_rv(K_ITEM, &m, SW_EPROTO, "heartbeat without request id");

    /* data needs seq >= 1, heartbeat seq 0 */
    fill_item_data(&m);
    m.seq = 0;
    expect_decode_rv(K_ITEM, &m, SW_EPROTO, "data seq 0");
    fill_item_data(&m);
    m.seq = 1;
    expect_decode_rv(K_ITEM, &m, SW_OK, "data seq 1");
    fill_item_heartbeat(&m);
    m.seq = 1;
    expect_decode_rv(K_ITEM, &m, SW_EPROTO, "heartbeat seq 1");

    /* neither data nor heartbeat nor final */
    fill_item_base(&m);
    m.seq = 4;
    expect_decode_rv(K_ITEM, &m, SW_EPROTO, "item without body");

    /* finals */
    fill_item_final(&m, STREAMWIRE__V1__STATUS__STATUS_COMPLETED, "stop", 0, NULL);
    m.terminal = NULL;
    expect_decode_rv(K_ITEM, &m, SW_EPROTO, "final without terminal");
    fill_item_final(&m, STREAMWIRE__V1__STATUS__STATUS_COMPLETED, "stop", 0, NULL);
    m.seq = 0;
    expect_decode_rv(K_ITEM, &m, SW_EPROTO, "final with seq 0");
    fill_item_final(&m, STREAMWIRE__V1__STATUS__STATUS_COMPLETED, "stop", 0, NULL);
    m.body_case = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_HEARTBEAT;
    item_hb = (Streamwire__V1__Heartbeat)STREAMWIRE__V1__HEARTBEAT__INIT;
    m.heartbeat = &item_hb;
    expect_decode_rv(K_ITEM, &m, SW_EPROTO, "final with heartbeat body");
    fill_item_final(&m, STREAMWIRE__V1__STATUS__STATUS_UNSPECIFIED, "stop", 0, NULL);
    expect_decode_rv(K_ITEM, &m, SW_EPROTO, "final with status unspecified");
    fill_item_final(&m, (Streamwire__V1__Status)5, "stop", 0, NULL);
    expect_decode_rv(K_ITEM, &m, SW_EPROTO, "final with status 5");
    fill_item_final(&m, (Streamwire__V1__Status)-1, "stop", 0, NULL);
    expect_decode_rv(K_ITEM, &m, SW_EPROTO, "final with status -1");

    /* FAILED needs an error, and an app code when sw_code is 0 */
    fill_item_final(&m, STREAMWIRE__V1__STATUS__STATUS_FAILED, NULL, 0, "engine_error");
    item_term.error = NULL;
    expect_decode_rv(K_ITEM, &m, SW_EPROTO, "FAILED without error");
    fill_item_final(&m, STREAMWIRE__V1__STATUS__STATUS_FAILED, NULL, 0, "");
    expect_decode_rv(K_ITEM, &m, SW_EPROTO, "FAILED with empty app code");
    fill_item_final(&m, STREAMWIRE__V1__STATUS__STATUS_FAILED, NULL, 0, "Engine Error");
    expect_decode_rv(K_ITEM, &m, SW_EPROTO, "FAILED with invalid app code");
    fill_item_final(&m, STREAMWIRE__V1__STATUS__STATUS_FAILED, NULL, 0,
                    "a2345678901234567890123456789012345678901234567890123456789012345");
    expect_decode_rv(K_ITEM, &m, SW_EPROTO, "FAILED with 65-char app code");
    fill_item_final(&m, STREAMWIRE__V1__STATUS__STATUS_FAILED, NULL, SW_EINTERNAL, "");
    expect_decode_rv(K_ITEM, &m, SW_OK, "FAILED with sw_code only");

    /* typed items: an event name on a data item only, 1..64 of [A-Za-z0-9._:-] */
    fill_item_data(&m);
    m.event = "refusal";
    expect_decode_rv(K_ITEM, &m, SW_OK, "typed data item");
    m.event = "app.v2:tool-call_1";
    expect_decode_rv(K_ITEM, &m, SW_OK, "typed data item, every allowed character");
    m.event = "a234567890123456789012345678901234567890123456789012345678901234";
    expect_decode_rv(K_ITEM, &m, SW_OK, "64-char event");
    m.event = "a2345678901234567890123456789012345678901234567890123456789012345";
    expect_decode_rv(K_ITEM, &m, SW_EPROTO, "65-char event");
    m.event = "has space";
    expect_decode_rv(K_ITEM, &m, SW_EPROTO, "event with a space");
    m.event = "sw.rsp.>";
    expect_decode_rv(K_ITEM, &m, SW_EPROTO, "event with a wildcard");
    m.event = "caf\xc3\xa9";
    expect_decode_rv(K_ITEM, &m, SW_EPROTO, "event with non-ASCII");
    fill_item_heartbeat(&m);
    m.event = "metrics";
    expect_decode_rv(K_ITEM, &m, SW_EPROTO, "typed heartbeat");
    fill_item_final(&m, STREAMWIRE__V1__STATUS__STATUS_COMPLETED, "stop", 0, NULL);
    m.event = "refusal";
    expect_decode_rv(K_ITEM, &m, SW_EPROTO, "typed final");
}

static void
test_control_validation(void **state)
{
    swp_control c;
    (void)state;

    fill_control(&c, STREAMWIRE__V1__CONTROL_KIND__CONTROL_RESEND);
    c.resend_from = 10;
    c.resend_to = 9;
    expect_decode_rv(K_CONTROL, &c, SW_EPROTO, "RESEND from > to");
    c.resend_from = 0;
    c.resend_to = 3;
    expect_decode_rv(K_CONTROL, &c, SW_EPROTO, "RESEND from 0");
    c.resend_from = 1;
    c.resend_to = 1 + SWP_MAX_WINDOW;
    expect_decode_rv(K_CONTROL, &c, SW_EPROTO, "RESEND range too wide");
    c.resend_from = 1;
    c.resend_to = UINT64_MAX;
    expect_decode_rv(K_CONTROL, &c, SW_EPROTO, "RESEND to UINT64_MAX");
    fill_control(&c, STREAMWIRE__V1__CONTROL_KIND__CONTROL_RESEND);
    c.request_id = bin(NULL, 0);
    expect_decode_rv(K_CONTROL, &c, SW_EPROTO, "RESEND without request id");

    fill_control(&c, STREAMWIRE__V1__CONTROL_KIND__CONTROL_UNSPECIFIED);
    expect_decode_rv(K_CONTROL, &c, SW_EPROTO, "control kind 0");
    fill_control(&c, (Streamwire__V1__ControlKind)7);
    expect_decode_rv(K_CONTROL, &c, SW_EPROTO, "control kind 7");
    fill_control(&c, (Streamwire__V1__ControlKind)99);
    expect_decode_rv(K_CONTROL, &c, SW_EPROTO, "control kind 99");

    fill_control(&c, STREAMWIRE__V1__CONTROL_KIND__CONTROL_CANCEL);
    c.request_id = bin(NULL, 0);
    expect_decode_rv(K_CONTROL, &c, SW_EPROTO, "CANCEL without request id");
    fill_control(&c, STREAMWIRE__V1__CONTROL_KIND__CONTROL_KILL);
    c.request_id = bin(RID, 15);
    expect_decode_rv(K_CONTROL, &c, SW_EPROTO, "KILL with short id");
    fill_control(&c, STREAMWIRE__V1__CONTROL_KIND__CONTROL_CREDIT);
    c.request_id = bin(NULL, 0);
    expect_decode_rv(K_CONTROL, &c, SW_EPROTO, "CREDIT without request id");
    fill_control(&c, STREAMWIRE__V1__CONTROL_KIND__CONTROL_PROBE);
    c.request_id = bin(RID, 5);
    expect_decode_rv(K_CONTROL, &c, SW_EPROTO, "PROBE with 5-byte id");

    /* ACK_FINALS: 1..SWP_MAX_FINAL_ACKS ids of 16 bytes, no request_id. */
    {
        static ProtobufCBinaryData ids[SWP_MAX_FINAL_ACKS + 1];
        static uint8_t raw[SWP_MAX_FINAL_ACKS + 1][SW_REQUEST_ID_BYTES];
        swp_control *d = NULL;
        uint8_t *b;
        size_t len;
        for (size_t i = 0; i <= SWP_MAX_FINAL_ACKS; i++) {
            memset(raw[i], (int)(i & 0xff), sizeof(raw[i]));
            raw[i][0] = (uint8_t)(i >> 8);
            ids[i] = bin(raw[i], SW_REQUEST_ID_BYTES);
        }
        fill_control(&c, STREAMWIRE__V1__CONTROL_KIND__CONTROL_ACK_FINALS);
        c.request_id = bin(NULL, 0);
        c.n_final_acks = SWP_MAX_FINAL_ACKS;
        c.final_acks = ids;
        b = encode_msg(&c, &len);
        assert_int_equal(swp_decode_control(b, len, 8192, &d), SW_OK);
        assert_int_equal(d->kind, STREAMWIRE__V1__CONTROL_KIND__CONTROL_ACK_FINALS);
        assert_int_equal(d->n_final_acks, SWP_MAX_FINAL_ACKS);
        for (size_t i = 0; i < SWP_MAX_FINAL_ACKS; i++)
            assert_memory_equal(d->final_acks[i].data, raw[i], SW_REQUEST_ID_BYTES);
        swp_free(d);
        free(b);

        c.n_final_acks = SWP_MAX_FINAL_ACKS + 1;
        expect_decode_rv(K_CONTROL, &c, SW_EPROTO, "ACK_FINALS with 257 ids");
        c.n_final_acks = 0;
        expect_decode_rv(K_CONTROL, &c, SW_EPROTO, "ACK_FINALS with no ids");
        c.n_final_acks = 3;
        c.request_id = bin(RID, sizeof(RID));
        expect_decode_rv(K_CONTROL, &c, SW_EPROTO, "ACK_FINALS with a request_id");
        c.request_id = bin(NULL, 0);
        ids[1] = bin(raw[1], 15);
        expect_decode_rv(K_CONTROL, &c, SW_EPROTO, "ACK_FINALS with a 15-byte id");
        ids[1] = bin(raw[1], 17);
        expect_decode_rv(K_CONTROL, &c, SW_EPROTO, "ACK_FINALS with a 17-byte id");
    }
}

static void
test_probe_and_instance_validation(void **state)
{
    static const char *bad_tokens[] = {
        "",
        "a.b",
        "a b",
        "*",
        ">",
        "inst/1",
        "i2345678901234567890123456789012345678901234567890123456789012345"};
    static const char *bad_endpoints[] = {"",      "a.b",    "a.b.c.d",     "a..c",
                                          "a.*.c", "a.b.c.", "ns.comp.ep x"};
    static const char *bad_subjects[] = {"",       "sw.req.*", "sw.ctl.>",
                                         "sw ctl", "sw..ctl",  "sw.ctl."};
    swp_probe_reply p;
    swp_instance in;
    (void)state;

    for (size_t i = 0; i < sizeof(bad_tokens) / sizeof(bad_tokens[0]); i++) {
        fill_probe(&p);
        p.instance_id = (char *)bad_tokens[i];
        expect_decode_rv(K_PROBE, &p, SW_EPROTO, bad_tokens[i]);
        fill_instance(&in);
        in.instance_id = (char *)bad_tokens[i];
        expect_decode_rv(K_INSTANCE, &in, SW_EPROTO, bad_tokens[i]);
    }
    /* 64 chars is the longest valid token */
    fill_probe(&p);
    p.instance_id = (char *)"i2345678901234567890123456789012345678901234567890123456789012345" + 1;
    assert_int_equal(strlen(p.instance_id), 64);
    expect_decode_rv(K_PROBE, &p, SW_OK, "64-char instance id");

    for (size_t i = 0; i < sizeof(bad_endpoints) / sizeof(bad_endpoints[0]); i++) {
        fill_instance(&in);
        in.endpoint = (char *)bad_endpoints[i];
        expect_decode_rv(K_INSTANCE, &in, SW_EPROTO, bad_endpoints[i]);
    }
    for (size_t i = 0; i < sizeof(bad_subjects) / sizeof(bad_subjects[0]); i++) {
        fill_instance(&in);
        in.request_subject = (char *)bad_subjects[i];
        expect_decode_rv(K_INSTANCE, &in, SW_EPROTO, bad_subjects[i]);
        fill_instance(&in);
        in.control_subject = (char *)bad_subjects[i];
        expect_decode_rv(K_INSTANCE, &in, SW_EPROTO, bad_subjects[i]);
    }
}

/* ------------------------------------------------------------ extensibility */

static uint8_t *
concat(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
    uint8_t *r = malloc(alen + blen + 1);
    assert_non_null(r);
    if (alen)
        memcpy(r, a, alen);
    if (blen)
        memcpy(r + alen, b, blen);
    return r;
}

/* The decoded message matches the sample it came from: re-encoding it (which
 * keeps unknown fields last) starts with the sample's bytes. */
static void
check_same_as_sample(const sample *s, void *out)
{
    size_t len;
    uint8_t *re = encode_msg(out, &len);
    assert_true(len >= s->len);
    assert_memory_equal(re, s->buf, s->len);
    free(re);
}

static void
test_unknown_fields_accepted(void **state)
{
    /* tag 99 varint 1; tag 100 length-delimited "abc"; tag 101 fixed32;
     * tag 102 fixed64 */
    static const uint8_t unk_varint[] = {0x98, 0x06, 0x01};
    static const uint8_t unk_many[] = {0x98, 0x06, 0x01, 0xa2, 0x06, 0x03, 'a',  'b',  'c',
                                       0xad, 0x06, 1,    2,    3,    4,    0xb1, 0x06, 1,
                                       2,    3,    4,    5,    6,    7,    8};
    sample s[NSAMPLES];
    (void)state;
    build_samples(s);
    for (int i = 0; i < NSAMPLES; i++) {
        const struct {
            const uint8_t *b;
            size_t n;
            int prepend;
        } add[] = {
            {unk_varint, sizeof(unk_varint), 0},
            {unk_many, sizeof(unk_many), 0},
            {unk_varint, sizeof(unk_varint), 1},
        };
        for (size_t a = 0; a < sizeof(add) / sizeof(add[0]); a++) {
            uint8_t *b = add[a].prepend ? concat(add[a].b, add[a].n, s[i].buf, s[i].len)
                                        : concat(s[i].buf, s[i].len, add[a].b, add[a].n);
            void *out = NULL;
            sw_err rv = decode_any(s[i].kind, b, s[i].len + add[a].n, MAXLEN, &out);
            if (rv != SW_OK)
                fail_msg("%s + unknown field set %zu: %s", s[i].name, a, sw_err_name(rv));
            assert_non_null(out);
            check_same_as_sample(&s[i], out);
            swp_free(out);
            free(b);
        }
    }
    free_samples(s);
}

static void
test_field_encoding_edge_cases(void **state)
{
    sample s[NSAMPLES];
    (void)state;
    build_samples(s);
    for (int i = 0; i < NSAMPLES; i++) {
        void *out = NULL;
        uint8_t *b;
        /* a repeated scalar: the last one wins, so appending version 2 makes
         * the message unsupported */
        static const uint8_t v2[] = {0x08, 0x02};
        /* the version field with the wrong wire type (length-delimited) */
        static const uint8_t v_wrong_type[] = {0x0a, 0x01, 0x01};
        /* an unknown field whose length runs past the end */
        static const uint8_t unk_overrun[] = {0xa2, 0x06, 0x7f, 'x'};
        /* a varint that never ends */
        static const uint8_t unk_bad_varint[] = {0x98, 0x06, 0xff, 0xff, 0xff, 0xff, 0xff,
                                                 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
        /* field number 0 is invalid */
        static const uint8_t field_zero[] = {0x00, 0x01};

        b = concat(s[i].buf, s[i].len, v2, sizeof(v2));
        assert_int_equal(decode_any(s[i].kind, b, s[i].len + sizeof(v2), MAXLEN, &out),
                         SW_EVERSION);
        assert_null(out);
        free(b);

        b = concat(s[i].buf, s[i].len, v_wrong_type, sizeof(v_wrong_type));
        assert_int_equal(decode_any(s[i].kind, b, s[i].len + sizeof(v_wrong_type), MAXLEN, &out),
                         SW_EPROTO);
        assert_null(out);
        free(b);

        b = concat(s[i].buf, s[i].len, unk_overrun, sizeof(unk_overrun));
        assert_int_equal(decode_any(s[i].kind, b, s[i].len + sizeof(unk_overrun), MAXLEN, &out),
                         SW_EPROTO);
        assert_null(out);
        free(b);

        b = concat(s[i].buf, s[i].len, unk_bad_varint, sizeof(unk_bad_varint));
        assert_int_equal(decode_any(s[i].kind, b, s[i].len + sizeof(unk_bad_varint), MAXLEN, &out),
                         SW_EPROTO);
        assert_null(out);
        free(b);

        b = concat(s[i].buf, s[i].len, field_zero, sizeof(field_zero));
        assert_int_equal(decode_any(s[i].kind, b, s[i].len + sizeof(field_zero), MAXLEN, &out),
                         SW_EPROTO);
        assert_null(out);
        free(b);
    }
    free_samples(s);
}

/* protobuf-c 1.4 rejects field number 0 in a one-byte tag (0x02) but accepts
 * it in an over-long one (0x82 0x00) and keeps it as an unknown field; the
 * message then re-encodes to bytes the decoder rejects. Known bug (see the
 * test report: proto/codec.c should refuse unknown fields with tag 0). */
static void
test_overlong_field_zero(void **state)
{
    static const uint8_t tag0_short[] = {0x02, 0x00};
    static const uint8_t tag0_long[] = {0x82, 0x00, 0x00};
    sample s[NSAMPLES];
    (void)state;
    build_samples(s);
    for (int i = 0; i < NSAMPLES; i++) {
        void *out = NULL;
        uint8_t *b = concat(s[i].buf, s[i].len, tag0_short, sizeof(tag0_short));
        assert_int_equal(decode_any(s[i].kind, b, s[i].len + sizeof(tag0_short), MAXLEN, &out),
                         SW_EPROTO);
        assert_null(out);
        free(b);
    }
    for (int i = 0; i < NSAMPLES; i++) {
        void *out = NULL;
        uint8_t *b = concat(s[i].buf, s[i].len, tag0_long, sizeof(tag0_long));
        sw_err rv = decode_any(s[i].kind, b, s[i].len + sizeof(tag0_long), MAXLEN, &out);
        swp_free(out);
        free(b);
        if (rv != SW_EPROTO) {
            free_samples(s);
            fail_msg("%s + over-long field-0 tag: got %s, want protocol_error", s[i].name,
                     sw_err_name(rv));
        }
    }
    free_samples(s);
}

/* ------------------------------------------------------------ encoding limits */

static void
test_encode_limits(void **state)
{
    swp_request r;
    uint8_t *exact, *out = (uint8_t *)(uintptr_t)1;
    size_t size, len = 12345;
    (void)state;
    fill_request_full(&r);
    size = swp_encoded_size(&r);
    assert_true(size > 100);
    exact = malloc(size);
    assert_non_null(exact);

    /* exactly the right size works */
    assert_int_equal(swp_encode(&r, exact, size, &len), SW_OK);
    assert_int_equal(len, size);
    /* one byte short, or nothing at all: SW_EMSGSIZE */
    assert_int_equal(swp_encode(&r, exact, size - 1, &len), SW_EMSGSIZE);
    assert_int_equal(swp_encode(&r, exact, 1, &len), SW_EMSGSIZE);
    assert_int_equal(swp_encode(&r, NULL, 0, &len), SW_EMSGSIZE);
    /* bad arguments */
    assert_int_equal(swp_encode(NULL, exact, size, &len), SW_EINVAL);
    assert_int_equal(swp_encode(&r, exact, size, NULL), SW_EINVAL);
    assert_int_equal(swp_encode(&r, NULL, size, &len), SW_EINVAL);

    /* alloc variant: max is inclusive */
    assert_int_equal(swp_encode_alloc(&r, size - 1, &out, &len), SW_EMSGSIZE);
    assert_null(out);
    assert_int_equal(swp_encode_alloc(&r, size, &out, &len), SW_OK);
    assert_non_null(out);
    assert_int_equal(len, size);
    assert_memory_equal(out, exact, size);
    free(out);
    assert_int_equal(swp_encode_alloc(NULL, size, &out, &len), SW_EINVAL);
    assert_int_equal(swp_encode_alloc(&r, size, NULL, &len), SW_EINVAL);
    assert_int_equal(swp_encode_alloc(&r, size, &out, NULL), SW_EINVAL);

    /* an empty message packs to zero bytes */
    {
        Streamwire__V1__Heartbeat hb = STREAMWIRE__V1__HEARTBEAT__INIT;
        assert_int_equal(swp_encoded_size(&hb), 0);
        assert_int_equal(swp_encode(&hb, NULL, 0, &len), SW_OK);
        assert_int_equal(len, 0);
        assert_int_equal(swp_encode_alloc(&hb, 0, &out, &len), SW_OK);
        assert_non_null(out);
        assert_int_equal(len, 0);
        free(out);
    }
    free(exact);
}

/* ------------------------------------------------------------ names */

static char *
repeat(char *buf, char c, size_t n)
{
    memset(buf, c, n);
    buf[n] = '\0';
    return buf;
}

static void
test_valid_subject(void **state)
{
    static const char *good[] = {"a",   "sw.req.ns.c.e.i", ("sw.rsp.r." RID_HEX), "A-b_c.d~e",
                                 "x.y", "sw.ctl.\xc3\xa9"};
    static const char *bad[] = {"",     ".",     "a.",    ".a",  "a..b",     "a b",
                                "a\tb", "a*",    "a.>",   "*",   ">",        "a.*.b",
                                "a*b",  "a\x7f", "a\x01", "a\n", "sw.rsp.>", "sw.\r"};
    char buf[300];
    (void)state;
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        if (!swp_valid_subject(good[i]))
            fail_msg("subject \"%s\" should be valid", good[i]);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (swp_valid_subject(bad[i]))
            fail_msg("subject \"%s\" should be invalid", bad[i]);
    assert_int_equal(swp_valid_subject(NULL), 0);
    /* 255 chars is the maximum */
    assert_int_equal(swp_valid_subject(repeat(buf, 'a', SWP_MAX_SUBJECT)), 1);
    assert_int_equal(swp_valid_subject(repeat(buf, 'a', SWP_MAX_SUBJECT + 1)), 0);
    repeat(buf, 'a', SWP_MAX_SUBJECT);
    buf[100] = '.';
    assert_int_equal(swp_valid_subject(buf), 1);
}

static void
test_validate_token(void **state)
{
    static const char *good[] = {"a", "Z", "0", "inst-1", "rtr_2", "A-z_0-9", RID_HEX};
    static const char *bad[] = {"",    "a.b", "a*", ">",   "a b", " a",  "a ",
                                "a/b", "a:b", "é",  "a\t", "a\n", "a>b", "a\x7f"};
    char buf[80];
    (void)state;
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        if (sw_validate_token(good[i]) != SW_OK)
            fail_msg("token \"%s\" should be valid", good[i]);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (sw_validate_token(bad[i]) != SW_EINVAL)
            fail_msg("token \"%s\" should be invalid", bad[i]);
    assert_int_equal(sw_validate_token(NULL), SW_EINVAL);
    assert_int_equal(sw_validate_token(repeat(buf, 'x', SW_MAX_TOKEN)), SW_OK);
    assert_int_equal(sw_validate_token(repeat(buf, 'x', SW_MAX_TOKEN + 1)), SW_EINVAL);
}

static void
test_validate_endpoint(void **state)
{
    static const char *good[] = {"ns.comp.ep", "a.b.c", "dynamo.vllm-worker.generate",
                                 "A_1.b-2.C3"};
    static const char *bad[] = {"",       "a",       "a.b",     "a.b.c.d", "a..c",
                                ".b.c",   "a.b.",    "a.*.c",   "a.b.>",   "a.b.c ",
                                " a.b.c", "a.b c.d", "a.b.c\n", "...",     "a.b.c."};
    char buf[SW_MAX_ENDPOINT + 16];
    (void)state;
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        if (sw_validate_endpoint(good[i]) != SW_OK)
            fail_msg("endpoint \"%s\" should be valid", good[i]);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (sw_validate_endpoint(bad[i]) != SW_EINVAL)
            fail_msg("endpoint \"%s\" should be invalid", bad[i]);
    assert_int_equal(sw_validate_endpoint(NULL), SW_EINVAL);

    /* three 64-char tokens: the longest endpoint */
    repeat(buf, 'e', SW_MAX_ENDPOINT);
    buf[SW_MAX_TOKEN] = '.';
    buf[2 * SW_MAX_TOKEN + 1] = '.';
    assert_int_equal(strlen(buf), SW_MAX_ENDPOINT);
    assert_int_equal(sw_validate_endpoint(buf), SW_OK);
    /* a 65-char token anywhere is rejected */
    repeat(buf, 'e', 65 + 1 + 3 + 1 + 3);
    buf[65] = '.';
    buf[69] = '.';
    assert_int_equal(sw_validate_endpoint(buf), SW_EINVAL);
    repeat(buf, 'e', 3 + 1 + 65 + 1 + 3);
    buf[3] = '.';
    buf[69] = '.';
    assert_int_equal(sw_validate_endpoint(buf), SW_EINVAL);
    repeat(buf, 'e', 3 + 1 + 3 + 1 + 65);
    buf[3] = '.';
    buf[7] = '.';
    assert_int_equal(sw_validate_endpoint(buf), SW_EINVAL);
    buf[strlen(buf) - 1] = '\0'; /* 64 now */
    assert_int_equal(sw_validate_endpoint(buf), SW_OK);
}

/* ------------------------------------------------------------ transport subjects */

static void
test_transport_subjects(void **state)
{
    char out[SWT_SUBJECT_MAX];
    char tok[SW_MAX_TOKEN + 1], ep[SW_MAX_ENDPOINT + 1];
    (void)state;

    assert_int_equal(swt_subject_request(out, sizeof(out), "ns.comp.ep", "inst-1"), SW_OK);
    assert_string_equal(out, "sw.req.ns.comp.ep.inst-1");
    assert_int_equal(swt_subject_control(out, sizeof(out), "inst-1"), SW_OK);
    assert_string_equal(out, "sw.ctl.inst-1");
    assert_int_equal(swt_subject_response(out, sizeof(out), "rtr-1", RID_HEX), SW_OK);
    assert_string_equal(out, RSP_SUBJECT);
    assert_int_equal(swp_valid_subject(out), 1);
    assert_int_equal(swt_subject_response_wildcard(out, sizeof(out), "rtr-1"), SW_OK);
    assert_string_equal(out, "sw.rsp.rtr-1.*");
    assert_int_equal(swp_valid_subject(out), 0); /* a subscription, never a publish target */
    assert_int_equal(swt_subject_router(out, sizeof(out), "rtr-1"), SW_OK);
    assert_string_equal(out, "sw.rtr.rtr-1");

    /* bad names never reach a subject */
    assert_int_equal(swt_subject_request(out, sizeof(out), "ns.comp", "inst-1"), SW_EINVAL);
    assert_int_equal(swt_subject_request(out, sizeof(out), "ns.comp.ep.x", "inst-1"), SW_EINVAL);
    assert_int_equal(swt_subject_request(out, sizeof(out), "ns.*.ep", "inst-1"), SW_EINVAL);
    assert_int_equal(swt_subject_request(out, sizeof(out), "ns.comp.ep", "inst.1"), SW_EINVAL);
    assert_int_equal(swt_subject_request(out, sizeof(out), "ns.comp.ep", ""), SW_EINVAL);
    assert_int_equal(swt_subject_request(out, sizeof(out), NULL, "i"), SW_EINVAL);
    assert_int_equal(swt_subject_request(out, sizeof(out), "ns.comp.ep", NULL), SW_EINVAL);
    assert_int_equal(swt_subject_control(out, sizeof(out), ">"), SW_EINVAL);
    assert_int_equal(swt_subject_control(out, sizeof(out), NULL), SW_EINVAL);
    assert_int_equal(swt_subject_response(out, sizeof(out), "r", "*"), SW_EINVAL);
    assert_int_equal(swt_subject_response(out, sizeof(out), "r r", RID_HEX), SW_EINVAL);
    assert_int_equal(swt_subject_response(out, sizeof(out), "r", "ab.cd"), SW_EINVAL);
    assert_int_equal(swt_subject_response_wildcard(out, sizeof(out), ""), SW_EINVAL);
    assert_int_equal(swt_subject_router(out, sizeof(out), "a b"), SW_EINVAL);

    /* a buffer too small is an error, not a truncated subject */
    assert_int_equal(swt_subject_control(out, 8, "inst-1"), SW_EINVAL);
    assert_int_equal(swt_subject_control(out, 14, "inst-1"), SW_OK); /* 13 chars + NUL */
    assert_string_equal(out, "sw.ctl.inst-1");
    assert_int_equal(swt_subject_control(out, 13, "inst-1"), SW_EINVAL);
    assert_int_equal(swt_subject_router(out, 5, "rtr-1"), SW_EINVAL);
    assert_int_equal(swt_subject_response(out, 20, "rtr-1", RID_HEX), SW_EINVAL);
    assert_int_equal(swt_subject_request(out, 10, "ns.comp.ep", "inst-1"), SW_EINVAL);
    assert_int_equal(swt_subject_response_wildcard(out, 3, "rtr-1"), SW_EINVAL);

    /* the longest names fit SWT_SUBJECT_MAX and make valid subjects */
    repeat(tok, 'i', SW_MAX_TOKEN);
    repeat(ep, 'e', SW_MAX_ENDPOINT);
    ep[SW_MAX_TOKEN] = '.';
    ep[2 * SW_MAX_TOKEN + 1] = '.';
    assert_int_equal(swt_subject_request(out, sizeof(out), ep, tok), SW_OK);
    assert_int_equal(strlen(out), 7 + SW_MAX_ENDPOINT + 1 + SW_MAX_TOKEN);
    /* NOTE: 266 chars, over SWP_MAX_SUBJECT (255), so swp_valid_subject()
     * rejects it and an InstanceInfo carrying it does not decode. Reported;
     * not asserted either way until the limits are reconciled. */
    assert_int_equal(swt_subject_response(out, sizeof(out), tok, tok), SW_OK);
    assert_int_equal(swp_valid_subject(out), 1);
    assert_int_equal(swt_subject_control(out, sizeof(out), tok), SW_OK);
    assert_int_equal(swp_valid_subject(out), 1);
}

/* The heartbeat-batch subject of a router, and its recognition on the mux. */
static void
test_beats_subject(void **state)
{
    char out[SWT_SUBJECT_MAX], small[12];
    (void)state;
    assert_int_equal(swt_subject_beats(small, sizeof(small), "rtr-1"), SW_EINVAL); /* too long */
    assert_int_equal(swt_subject_beats(out, sizeof(out), "rtr-1"), SW_OK);
    assert_string_equal(out, "sw.rsp.rtr-1.hb");
    assert_int_equal(swt_subject_beats(out, sizeof(out), "bad.router"), SW_EINVAL);
    assert_true(swt_is_beats_subject("sw.rsp.rtr-1.hb"));
    assert_false(swt_is_beats_subject("sw.rsp.rtr-1.hbx"));
    assert_false(swt_is_beats_subject("sw.rsp.rtr-1.0123456789abcdef0123456789abcdef"));
    assert_false(swt_is_beats_subject("hb"));
    assert_false(swt_is_beats_subject(NULL));
}

/* The longest names the API accepts (SW_MAX_TOKEN, SW_MAX_ENDPOINT) make a
 * 266-char request subject, but swp_valid_subject() stops at SWP_MAX_SUBJECT
 * (255): such an instance's InstanceInfo does not decode, and buffers sized
 * SWP_MAX_SUBJECT + 1 truncate its subject. Known bug (see the report). */
static void
test_longest_request_subject_is_valid(void **state)
{
    char out[SWT_SUBJECT_MAX], tok[SW_MAX_TOKEN + 1], ep[SW_MAX_ENDPOINT + 1];
    swp_instance in;
    (void)state;
    repeat(tok, 'i', SW_MAX_TOKEN);
    repeat(ep, 'e', SW_MAX_ENDPOINT);
    ep[SW_MAX_TOKEN] = '.';
    ep[2 * SW_MAX_TOKEN + 1] = '.';
    assert_int_equal(swt_subject_request(out, sizeof(out), ep, tok), SW_OK);
    assert_int_equal(swp_valid_subject(out), 1);
    fill_instance(&in);
    in.instance_id = tok;
    in.endpoint = ep;
    in.request_subject = out;
    expect_decode_rv(K_INSTANCE, &in, SW_OK, "instance with the longest names");
}

static void
test_response_subject_id(void **state)
{
    uint8_t id[SW_REQUEST_ID_BYTES];
    char subj[SWT_SUBJECT_MAX], hex[SW_REQUEST_ID_HEX];
    uint64_t seed = 5;
    (void)state;

    assert_int_equal(swt_response_subject_id(RSP_SUBJECT, id), 0);
    assert_memory_equal(id, RID, sizeof(RID));

    /* builder and parser agree for random ids */
    for (int i = 0; i < 200; i++) {
        uint8_t raw[SW_REQUEST_ID_BYTES], back[SW_REQUEST_ID_BYTES];
        for (int j = 0; j < SW_REQUEST_ID_BYTES; j++)
            raw[j] = (uint8_t)rng_next(&seed);
        swi_hex(hex, raw, sizeof(raw));
        assert_int_equal(swt_subject_response(subj, sizeof(subj), "rtr-9", hex), SW_OK);
        assert_int_equal(swt_response_subject_id(subj, back), 0);
        assert_memory_equal(raw, back, sizeof(raw));
    }

    memset(id, 0x5a, sizeof(id));
    assert_int_equal(swt_response_subject_id(NULL, id), -1);
    assert_int_equal(swt_response_subject_id("", id), -1);
    assert_int_equal(swt_response_subject_id(RID_HEX, id), -1); /* no dot */
    assert_int_equal(swt_response_subject_id("sw.rsp.r.", id), -1);
    assert_int_equal(swt_response_subject_id("sw.rsp.r.00112233445566778899aabbccddeef", id),
                     -1); /* 31 */
    assert_int_equal(swt_response_subject_id("sw.rsp.r.00112233445566778899aabbccddeeff0", id),
                     -1); /* 33 */
    assert_int_equal(swt_response_subject_id("sw.rsp.r.00112233445566778899AABBCCDDEEFF", id),
                     -1); /* upper case */
    assert_int_equal(swt_response_subject_id("sw.rsp.r.0011223344556677889gaabbccddeeff", id), -1);
    assert_int_equal(swt_response_subject_id("sw.rsp.r.00112233445566778899aabbccddee f", id), -1);
    assert_int_equal(swt_response_subject_id("sw.rsp.r.*", id), -1);
    /* failures may have written part of id, but the caller ignores it; a
     * later success overwrites all of it */
    assert_int_equal(swt_response_subject_id(RSP_SUBJECT, id), 0);
    assert_memory_equal(id, RID, sizeof(RID));
}

/* ------------------------------------------------------------ hand-encoded wrappers */

/* The worker writes StreamItemWrappers by hand (swp_hdr_write, swp_data_body_*,
 * swp_final_body_alloc, swp_batch_prefix). These tests build messages with
 * those functions and check what both item decoders make of them. */

/* A 64-char instance id: the longest token. */
#define ID64 "inst-0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVW"

static size_t
vsize(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* A growing buffer for a hand-built message. */
typedef struct wbuf {
    uint8_t *b;
    size_t len, cap;
} wbuf;

static uint8_t *
wb_room(wbuf *w, size_t n)
{
    if (w->cap - w->len < n) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap - w->len < n)
            cap *= 2;
        w->b = realloc(w->b, cap);
        assert_non_null(w->b);
        w->cap = cap;
    }
    return w->b + w->len;
}

static void
wb_raw(wbuf *w, const void *p, size_t n)
{
    uint8_t *at = wb_room(w, n);
    if (n)
        memcpy(at, p, n);
    w->len += n;
}

/* Appends swp_hdr_write's header; returns its length. */
static size_t
wb_hdr(wbuf *w, const char *instance_id, int resent, uint32_t credit_window)
{
    swp_hdr h;
    size_t n;
    h.request_id = RID;
    h.instance_id = instance_id;
    h.credit_window = credit_window;
    h.resent = resent;
    n = swp_hdr_write(&h, wb_room(w, SWP_HDR_MAX));
    assert_true(n <= SWP_HDR_MAX);
    w->len += n;
    return n;
}

static void
wb_prefix(wbuf *w, size_t body_len)
{
    size_t n = swp_batch_prefix(wb_room(w, SWP_PREFIX_MAX), body_len);
    assert_int_equal(n, 1 + vsize(body_len));
    w->len += n;
}

/* Appends a data body (after a batch prefix when batched). */
static void
wb_data(wbuf *w, int batched, uint64_t seq, const void *data, size_t len, int droppable)
{
    size_t size = swp_data_body_size(seq, len, droppable, 0), n;
    if (batched)
        wb_prefix(w, size);
    n = swp_data_body_write(wb_room(w, size), seq, data, len, droppable, NULL, 0);
    assert_int_equal(n, size);
    w->len += n;
}

/* Appends a final's body from swp_final_body_alloc (t may be NULL). */
static void
wb_final(wbuf *w, int batched, uint64_t seq, const swp_terminal *t)
{
    uint8_t *body = NULL;
    size_t n = 0;
    assert_int_equal(swp_final_body_alloc(seq, t, MAXLEN, &body, &n), SW_OK);
    assert_non_null(body);
    if (batched)
        wb_prefix(w, n);
    wb_raw(w, body, n);
    free(body);
}

/* Appends protobuf-c's packing of msg (after a batch prefix when batched). */
static void
wb_msg(wbuf *w, int batched, const void *msg)
{
    size_t n;
    uint8_t *b = encode_msg(msg, &n);
    if (batched)
        wb_prefix(w, n);
    wb_raw(w, b, n);
    free(b);
}

static void
make_terminal(swp_terminal *t, swp_error *e, Streamwire__V1__Status status, const char *reason,
              uint32_t sw_code, const char *app_code, const char *message)
{
    *t = (swp_terminal)STREAMWIRE__V1__TERMINAL__INIT;
    t->status = status;
    t->finish_reason = (char *)reason;
    if (e != NULL) {
        *e = (swp_error)STREAMWIRE__V1__ERROR__INIT;
        e->sw_code = sw_code;
        e->app_code = (char *)app_code;
        e->message = (char *)message;
        t->error = e;
    }
}

/* Both item decoders' results for one input: [0] swp_decode_item,
 * [1] swp_decode_item_arena (arena on the heap, so ASan sees overruns). */
typedef struct item_pair {
    swp_item *m[2];
    swp_arena *arena;
} item_pair;

static void
item_pair_free(item_pair *p)
{
    swp_free(p->m[0]);
    if (p->m[1] != NULL)
        swp_free_arena(p->m[1], p->arena);
    free(p->arena);
    p->m[0] = p->m[1] = NULL;
    p->arena = NULL;
}

/* Decodes an exact-size copy of b[len] with both decoders; both must return
 * want. On SW_OK both messages must re-encode to the same bytes (the caller
 * then checks the fields and calls item_pair_free); on an error nothing is
 * returned and nothing is left to free. */
static void
item_pair_decode(item_pair *p, const uint8_t *b, size_t len, sw_err want, const char *what)
{
    uint8_t *copy = malloc(len ? len : 1);
    sw_err r0, r1;
    assert_non_null(copy);
    if (len)
        memcpy(copy, b, len);
    p->arena = malloc(sizeof(*p->arena));
    assert_non_null(p->arena);
    p->m[0] = p->m[1] = (swp_item *)(uintptr_t)1;
    r0 = swp_decode_item(copy, len, MAXLEN, &p->m[0]);
    r1 = swp_decode_item_arena(copy, len, MAXLEN, p->arena, &p->m[1]);
    /* decoded messages own their bytes: nothing may point into the input */
    memset(copy, 0xa5, len);
    free(copy);
    if (r0 != want || r1 != want)
        fail_msg("%s: swp_decode_item %s, swp_decode_item_arena %s, want %s", what, sw_err_name(r0),
                 sw_err_name(r1), sw_err_name(want));
    if (want != SW_OK) {
        assert_null(p->m[0]);
        assert_null(p->m[1]);
        free(p->arena);
        p->arena = NULL;
        return;
    }
    assert_non_null(p->m[0]);
    assert_non_null(p->m[1]);
    {
        size_t l0, l1;
        uint8_t *e0 = encode_msg(p->m[0], &l0), *e1 = encode_msg(p->m[1], &l1);
        assert_int_equal(l0, l1);
        assert_memory_equal(e0, e1, l0);
        free(e0);
        free(e1);
    }
}

static void
expect_bytes_rv(const wbuf *w, sw_err want, const char *what)
{
    item_pair p;
    item_pair_decode(&p, w->b, w->len, want, what);
    if (want == SW_OK)
        item_pair_free(&p);
}

static void
fill_pattern(uint8_t *b, size_t n, unsigned mul, unsigned add)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)(i * mul + add);
}

/* 1. header + one data body decodes to exactly the fields written. */
static void
test_hand_header_data_body(void **state)
{
    static uint8_t data[70000];
    static const struct {
        const char *instance_id; /* NULL or "": not sent */
        int resent;
        uint32_t credit_window;
        uint64_t seq;
        size_t len;
        int droppable;
    } cases[] = {
        {NULL, 0, 0, 1, 6, 0},
        {"inst-a", 0, 0, 3, 6, 1},
        {"", 1, 0, 127, 1, 0},
        {"inst-b", 1, 64, 128, 0, 0},                    /* empty data */
        {NULL, 0, 0, 9, 0, 1},                           /* empty data, droppable */
        {NULL, 0, 65536, UINT64_C(1) << 40, 200, 1},     /* 2-byte length */
        {ID64, 1, SWP_MAX_WINDOW, UINT64_MAX, 70000, 1}, /* 3-byte length */
        {"w", 0, 127, 16384, 128, 0},
        {"inst-c", 0, 128, (UINT64_C(1) << 40) + 3, 16383, 0},
    };
    (void)state;
    fill_pattern(data, sizeof(data), 31, 7);
    assert_int_equal(strlen(ID64), SW_MAX_TOKEN);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        wbuf w = {NULL, 0, 0};
        item_pair p;
        size_t hlen, want_hlen;
        int has_id = cases[i].instance_id != NULL && cases[i].instance_id[0] != '\0';
        char what[64];
        snprintf(what, sizeof(what), "hand data case %zu", i);

        hlen = wb_hdr(&w, cases[i].instance_id, cases[i].resent, cases[i].credit_window);
        want_hlen = 2 + 2 + SW_REQUEST_ID_BYTES;
        if (has_id)
            want_hlen += 1 + vsize(strlen(cases[i].instance_id)) + strlen(cases[i].instance_id);
        if (cases[i].resent)
            want_hlen += 2;
        if (cases[i].credit_window)
            want_hlen += 1 + vsize(cases[i].credit_window);
        assert_int_equal(hlen, want_hlen);
        wb_data(&w, 0, cases[i].seq, data, cases[i].len, cases[i].droppable);
        assert_int_equal(w.len, hlen + 1 + vsize(cases[i].seq) + 1 + vsize(cases[i].len) +
                                    cases[i].len + (cases[i].droppable ? 2 : 0));

        item_pair_decode(&p, w.b, w.len, SW_OK, what);
        for (int k = 0; k < 2; k++) {
            const swp_item *d = p.m[k];
            assert_int_equal(d->version, 1);
            assert_bin(d->request_id, RID, sizeof(RID));
            assert_string_equal(d->instance_id, has_id ? cases[i].instance_id : "");
            assert_int_equal(!!d->resent, cases[i].resent);
            assert_true(d->credit_window == cases[i].credit_window);
            assert_true(d->seq == cases[i].seq);
            assert_int_equal(d->body_case, STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_DATA);
            assert_bin(d->data, data, cases[i].len);
            assert_int_equal(!!d->droppable, cases[i].droppable);
            assert_false(d->complete_final);
            assert_null(d->terminal);
            assert_int_equal(d->n_batch, 0);
            assert_null(d->sealed);
            assert_int_equal(d->base.n_unknown_fields, 0);
        }
        item_pair_free(&p);
        free(w.b);
    }
}

/* 2. swp_data_body_write is byte for byte protobuf-c's BatchedItem packing,
 * swp_data_body_size is what it writes, and it writes nothing past it. */
static void
test_data_body_matches_protobuf_c(void **state)
{
    static const uint64_t seqs[] = {
        1, 127, 128, 16383, 16384, UINT64_C(1) << 40, (UINT64_C(1) << 63) - 1, UINT64_MAX};
    static const size_t lens[] = {1, 6, 127, 128, 200, 16383, 16384, 70000};
    static uint8_t data[70000];
    size_t checked = 0;
    (void)state;
    fill_pattern(data, sizeof(data), 13, 1);
    for (size_t s = 0; s < sizeof(seqs) / sizeof(seqs[0]); s++) {
        for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++) {
            for (int dr = 0; dr <= 3; dr++) {
                /* dr bit 0: droppable; bit 1: typed (an event name, the longest one
                 * when the data is long) */
                static const char *evs[] = {"refusal", "x",
                                            ("0123456789abcdefghijABCDEFGHIJ._:-0123456789abcdefg"
                                             "hijABCDEFGH")};
                const char *ev = (dr & 2) ? evs[(s + l) % 3] : NULL;
                size_t elen = ev ? strlen(ev) : 0;
                swp_batched b = STREAMWIRE__V1__BATCHED_ITEM__INIT;
                size_t plen, size = swp_data_body_size(seqs[s], lens[l], dr & 1, elen), n;
                uint8_t *packed, *mine = malloc(size + 8);
                assert_non_null(mine);
                assert_true(elen <= SW_MAX_EVENT);
                memset(mine, 0xee, size + 8);
                b.seq = seqs[s];
                b.data = bin(data, lens[l]);
                b.droppable = dr & 1;
                if (ev)
                    b.event = (char *)ev;
                packed = encode_msg(&b, &plen);
                n = swp_data_body_write(mine, seqs[s], data, lens[l], dr & 1, ev, elen);
                assert_int_equal(n, size);
                assert_int_equal(n, plen);
                assert_memory_equal(mine, packed, n);
                for (size_t g = 0; g < 8; g++)
                    assert_int_equal(mine[size + g], 0xee);
                free(packed);
                free(mine);
                checked++;
            }
        }
    }
    assert_int_equal(checked, 8 * 8 * 4);

    /* sizes spelled out: tag, varint seq, tag, varint length, data, droppable */
    assert_int_equal(swp_data_body_size(1, 0, 0, 0), 4);
    assert_int_equal(swp_data_body_size(1, 0, 1, 0), 6);
    assert_int_equal(swp_data_body_size(UINT64_C(1) << 40, 200, 1, 0), 1 + 6 + 1 + 2 + 200 + 2);
    assert_int_equal(swp_data_body_size(1, 70000, 0, 0), 1 + 1 + 1 + 3 + 70000);
    assert_int_equal(swp_data_body_size(UINT64_MAX, 1, 0, 0), 1 + 10 + 1 + 1 + 1);

    /* empty data: the field is still written (protobuf-c would omit it), so
     * the wrapper's oneof says DATA */
    {
        static const uint8_t want[] = {0x18, 0x07, 0x22, 0x00};
        uint8_t out[sizeof(want) + 1];
        out[sizeof(want)] = 0xee;
        assert_int_equal(swp_data_body_write(out, 7, NULL, 0, 0, NULL, 0), sizeof(want));
        assert_memory_equal(out, want, sizeof(want));
        assert_int_equal(out[sizeof(want)], 0xee);
    }
}

/* 3. The header and prefix writers stay within SWP_HDR_MAX / SWP_PREFIX_MAX,
 * and the header is protobuf-c's packing of the same fields. */
static void
test_hand_header_and_prefix_bounds(void **state)
{
    static const uint32_t windows[] = {0, 1, 127, 128, 16384, SWP_MAX_WINDOW, UINT32_MAX};
    static const char *const ids[] = {NULL, "", "i", "inst-a", ID64};
    static const uint64_t bodies[] = {0,
                                      1,
                                      127,
                                      128,
                                      16383,
                                      16384,
                                      UINT64_C(1) << 21,
                                      UINT64_C(1) << 28,
                                      UINT32_MAX,
                                      UINT64_C(1) << 35,
                                      UINT64_C(1) << 42,
                                      UINT64_C(1) << 49,
                                      UINT64_C(1) << 56,
                                      UINT64_C(1) << 63};
    (void)state;

    /* the longest header: exactly SWP_HDR_MAX, into a buffer of exactly that */
    {
        uint8_t *out = malloc(SWP_HDR_MAX);
        swp_hdr h = {RID, ID64, UINT32_MAX, 1};
        assert_non_null(out);
        assert_int_equal(swp_hdr_write(&h, out), SWP_HDR_MAX);
        free(out);
    }
    /* a longer instance id does not push it past the bound */
    {
        char longid[3 * SW_MAX_TOKEN + 1];
        uint8_t *out = malloc(SWP_HDR_MAX);
        swp_hdr h = {RID, NULL, UINT32_MAX, 1};
        assert_non_null(out);
        h.instance_id = repeat(longid, 'x', sizeof(longid) - 1);
        assert_true(swp_hdr_write(&h, out) <= SWP_HDR_MAX);
        free(out);
    }

    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        for (size_t c = 0; c < sizeof(windows) / sizeof(windows[0]); c++) {
            for (int resent = 0; resent <= 1; resent++) {
                swp_hdr h = {RID, ids[i], windows[c], resent};
                swp_item m;
                uint8_t out[SWP_HDR_MAX + 8], *packed;
                size_t n, plen;
                memset(out, 0xee, sizeof(out));
                n = swp_hdr_write(&h, out);
                assert_true(n <= SWP_HDR_MAX);
                for (size_t g = n; g < sizeof(out); g++)
                    assert_int_equal(out[g], 0xee);
                /* protobuf-c packs fields 1, 2, 9, 10, 11 in that order too */
                fill_item_base(&m);
                m.instance_id = (char *)(ids[i] ? ids[i] : "");
                m.credit_window = windows[c];
                m.resent = resent;
                packed = encode_msg(&m, &plen);
                assert_int_equal(n, plen);
                assert_memory_equal(out, packed, n);
                free(packed);
            }
        }
    }

    /* the prefix: tag of field 12 (length-delimited), then the length */
    {
        uint8_t *out = malloc(SWP_PREFIX_MAX);
        assert_non_null(out);
        assert_int_equal(swp_batch_prefix(out, SIZE_MAX), SWP_PREFIX_MAX);
        assert_int_equal(out[0], (12 << 3) | 2);
        for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
            size_t n;
            uint64_t v = 0;
            memset(out, 0xee, SWP_PREFIX_MAX);
            n = swp_batch_prefix(out, (size_t)bodies[i]);
            assert_true(n <= SWP_PREFIX_MAX);
            assert_int_equal(n, 1 + vsize(bodies[i]));
            assert_int_equal(out[0], 0x62);
            for (size_t j = n; j-- > 1;)
                v = (v << 7) | (out[j] & 0x7f);
            assert_true(v == bodies[i]);
            for (size_t j = 1; j + 1 < n; j++)
                assert_true(out[j] & 0x80);
            assert_false(out[n - 1] & 0x80);
        }
        free(out);
    }
}

/* 4. A batch: wrapper seq 5, batched 6, 9 and a final at 10. */
static void
check_batch_5_6_9_10(const swp_item *d, const char *instance_id, int failed)
{
    assert_int_equal(d->version, 1);
    assert_bin(d->request_id, RID, sizeof(RID));
    assert_string_equal(d->instance_id, instance_id);
    assert_true(d->seq == 5);
    assert_int_equal(d->body_case, STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_DATA);
    assert_bin(d->data, "tok-5", 5);
    assert_true(d->droppable);
    assert_false(d->complete_final);
    assert_null(d->terminal);
    assert_int_equal(d->n_batch, 3);

    assert_true(d->batch[0]->seq == 6);
    assert_bin(d->batch[0]->data, "token six", 9);
    assert_false(d->batch[0]->droppable);
    assert_false(d->batch[0]->complete_final);
    assert_null(d->batch[0]->terminal);

    assert_true(d->batch[1]->seq == 9);
    assert_bin(d->batch[1]->data, PAYLOAD, sizeof(PAYLOAD));
    assert_true(d->batch[1]->droppable);
    assert_false(d->batch[1]->complete_final);
    assert_null(d->batch[1]->terminal);

    assert_true(d->batch[2]->seq == 10);
    assert_int_equal(d->batch[2]->data.len, 0);
    assert_false(d->batch[2]->droppable);
    assert_true(d->batch[2]->complete_final);
    assert_non_null(d->batch[2]->terminal);
    if (failed) {
        const swp_terminal *t = d->batch[2]->terminal;
        assert_int_equal(t->status, STREAMWIRE__V1__STATUS__STATUS_FAILED);
        assert_string_equal(t->finish_reason, "");
        assert_non_null(t->error);
        assert_int_equal(t->error->sw_code, 0);
        assert_string_equal(t->error->app_code, "engine_error");
        assert_string_equal(t->error->message, "CUDA out of memory");
    } else {
        assert_int_equal(d->batch[2]->terminal->status, STREAMWIRE__V1__STATUS__STATUS_COMPLETED);
        assert_string_equal(d->batch[2]->terminal->finish_reason, "stop");
        assert_null(d->batch[2]->terminal->error);
    }
}

static void
build_batch_5_6_9_10(wbuf *w, const char *instance_id, int resent, uint32_t cw,
                     const swp_terminal *t)
{
    wb_hdr(w, instance_id, resent, cw);
    wb_data(w, 0, 5, "tok-5", 5, 1);
    wb_data(w, 1, 6, "token six", 9, 0);
    wb_data(w, 1, 9, PAYLOAD, sizeof(PAYLOAD), 1);
    wb_final(w, 1, 10, t);
}

static void
test_batch_decode(void **state)
{
    swp_terminal t;
    swp_error e;
    (void)state;
    for (int failed = 1; failed >= 0; failed--) {
        if (failed)
            make_terminal(&t, &e, STREAMWIRE__V1__STATUS__STATUS_FAILED, "", 0, "engine_error",
                          "CUDA out of memory");
        else
            make_terminal(&t, NULL, STREAMWIRE__V1__STATUS__STATUS_COMPLETED, "stop", 0, NULL,
                          NULL);

        /* with a full header */
        {
            wbuf w = {NULL, 0, 0};
            item_pair p;
            build_batch_5_6_9_10(&w, "inst-a", 1, 96, &t);
            item_pair_decode(&p, w.b, w.len, SW_OK, "batch 5 6 9 final 10");
            for (int k = 0; k < 2; k++) {
                check_batch_5_6_9_10(p.m[k], "inst-a", failed);
                assert_true(p.m[k]->resent);
                assert_int_equal(p.m[k]->credit_window, 96);
            }
            item_pair_free(&p);
            free(w.b);
        }
        /* with a bare header the bytes are protobuf-c's for the same wrapper */
        {
            wbuf w = {NULL, 0, 0};
            item_pair p;
            swp_item m;
            swp_batched b6 = STREAMWIRE__V1__BATCHED_ITEM__INIT;
            swp_batched b9 = STREAMWIRE__V1__BATCHED_ITEM__INIT;
            swp_batched b10 = STREAMWIRE__V1__BATCHED_ITEM__INIT;
            swp_batched *bs[3] = {&b6, &b9, &b10};
            uint8_t *packed;
            size_t plen;
            build_batch_5_6_9_10(&w, NULL, 0, 0, &t);
            fill_item_base(&m);
            m.instance_id = (char *)"";
            m.seq = 5;
            m.body_case = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_DATA;
            m.data = bin("tok-5", 5);
            m.droppable = 1;
            b6.seq = 6;
            b6.data = bin("token six", 9);
            b9.seq = 9;
            b9.data = bin(PAYLOAD, sizeof(PAYLOAD));
            b9.droppable = 1;
            b10.seq = 10;
            b10.complete_final = 1;
            b10.terminal = &t;
            m.n_batch = 3;
            m.batch = bs;
            packed = encode_msg(&m, &plen);
            assert_int_equal(w.len, plen);
            assert_memory_equal(w.b, packed, plen);
            free(packed);
            item_pair_decode(&p, w.b, w.len, SW_OK, "batch 5 6 9 final 10, bare header");
            for (int k = 0; k < 2; k++) {
                check_batch_5_6_9_10(p.m[k], "", failed);
                assert_false(p.m[k]->resent);
                assert_int_equal(p.m[k]->credit_window, 0);
            }
            item_pair_free(&p);
            free(w.b);
        }
    }

    /* an empty data item inside a batch, and an empty wrapper data item */
    {
        wbuf w = {NULL, 0, 0};
        item_pair p;
        wb_hdr(&w, "inst-a", 0, 0);
        wb_data(&w, 0, 1, NULL, 0, 0);
        wb_data(&w, 1, 2, NULL, 0, 1);
        wb_data(&w, 1, 3, "c", 1, 0);
        item_pair_decode(&p, w.b, w.len, SW_OK, "batch with empty data items");
        for (int k = 0; k < 2; k++) {
            const swp_item *d = p.m[k];
            assert_true(d->seq == 1);
            assert_int_equal(d->body_case, STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_DATA);
            assert_int_equal(d->data.len, 0);
            assert_int_equal(d->n_batch, 2);
            assert_true(d->batch[0]->seq == 2);
            assert_int_equal(d->batch[0]->data.len, 0);
            assert_true(d->batch[0]->droppable);
            assert_false(d->batch[0]->complete_final);
            assert_true(d->batch[1]->seq == 3);
            assert_bin(d->batch[1]->data, "c", 1);
            assert_false(d->batch[1]->droppable);
        }
        item_pair_free(&p);
        free(w.b);
    }
}

/* HeartbeatBatch: round trip; version, instance token, id length and an
 * empty batch are checked; more than SWP_MAX_BEATS beats is refused before
 * unpacking. */
static void
test_beats(void **state)
{
    static uint8_t ids[SWP_MAX_BEATS + 1][SW_REQUEST_ID_BYTES];
    static swp_beat one[SWP_MAX_BEATS + 1];
    static swp_beat *ptr[SWP_MAX_BEATS + 1];
    swp_beats m = STREAMWIRE__V1__HEARTBEAT_BATCH__INIT, *d = NULL;
    uint8_t *b;
    size_t len;
    (void)state;
    for (size_t i = 0; i <= SWP_MAX_BEATS; i++) {
        memset(ids[i], (int)(i & 0xff), SW_REQUEST_ID_BYTES);
        ids[i][0] = (uint8_t)(i >> 8);
        streamwire__v1__stream_beat__init(&one[i]);
        one[i].request_id = bin(ids[i], SW_REQUEST_ID_BYTES);
        one[i].last_seq = (uint64_t)i * 1000003u;
        ptr[i] = &one[i];
    }
    m.version = 1;
    m.instance_id = (char *)"inst-1";
    m.beats = ptr;
    m.n_beats = 3;
    b = encode_msg(&m, &len);
    assert_int_equal(swp_decode_beats(b, len, MAXLEN, &d), SW_OK);
    assert_string_equal(d->instance_id, "inst-1");
    assert_int_equal(d->n_beats, 3);
    for (size_t i = 0; i < 3; i++) {
        assert_memory_equal(d->beats[i]->request_id.data, ids[i], SW_REQUEST_ID_BYTES);
        assert_int_equal(d->beats[i]->last_seq, (uint64_t)i * 1000003u);
    }
    swp_free(d);
    free(b);
    assert_int_equal(swp_decode_beats(b = encode_msg(&m, &len), len - 1, MAXLEN, &d), SW_EPROTO);
    assert_null(d);
    free(b);

    m.n_beats = SWP_MAX_BEATS;
    b = encode_msg(&m, &len);
    assert_int_equal(swp_decode_beats(b, len, 1 << 20, &d), SW_OK);
    assert_int_equal(d->n_beats, SWP_MAX_BEATS);
    swp_free(d);
    free(b);
    m.n_beats = SWP_MAX_BEATS + 1;
    b = encode_msg(&m, &len);
    assert_int_equal(swp_decode_beats(b, len, 1 << 20, &d), SW_EPROTO);
    assert_null(d);
    free(b);

    m.n_beats = 2;
    m.version = 2;
    b = encode_msg(&m, &len);
    assert_int_equal(swp_decode_beats(b, len, MAXLEN, &d), SW_EVERSION);
    free(b);
    m.version = 1;
    m.instance_id = (char *)"bad.instance";
    b = encode_msg(&m, &len);
    assert_int_equal(swp_decode_beats(b, len, MAXLEN, &d), SW_EPROTO);
    free(b);
    m.instance_id = (char *)"inst-1";
    m.n_beats = 0;
    b = encode_msg(&m, &len);
    assert_int_equal(swp_decode_beats(b, len, MAXLEN, &d), SW_EPROTO);
    free(b);
    m.n_beats = 2;
    one[1].request_id = bin(ids[1], 15);
    b = encode_msg(&m, &len);
    assert_int_equal(swp_decode_beats(b, len, MAXLEN, &d), SW_EPROTO);
    assert_null(d);
    free(b);
    one[1].request_id = bin(ids[1], SW_REQUEST_ID_BYTES);
    b = encode_msg(&m, &len);
    assert_int_equal(swp_decode_beats(b, len, 4, &d), SW_EMSGSIZE);
    free(b);
}

/* Raw HeartbeatBatch bytes for the hand decoder's rules: a header
 * (version 1, instance "w1"), then whatever the case appends. */
static size_t
hb_raw(uint8_t *out, const uint8_t *tail, size_t tlen)
{
    static const uint8_t head[] = {0x08, 0x01, 0x12, 0x02, 'w', '1'};
    memcpy(out, head, sizeof(head));
    memcpy(out + sizeof(head), tail, tlen);
    return sizeof(head) + tlen;
}

/* One beat field (field 3) holding the given StreamBeat body. */
static size_t
hb_beat(uint8_t *out, const uint8_t *body, size_t blen)
{
    out[0] = 0x1a;
    out[1] = (uint8_t)blen;
    memcpy(out + 2, body, blen);
    return blen + 2;
}

static sw_err
hb_decode(const uint8_t *tail, size_t tlen, swp_beats **d)
{
    uint8_t buf[1024];
    size_t n = hb_raw(buf, tail, tlen);
    return swp_decode_beats(buf, n, sizeof(buf), d);
}

/* The hand-written HeartbeatBatch decoder (proto/beats.c) follows
 * protobuf-c's rules: a later copy wins (at most 4), unknown fields are
 * skipped (at most SWP_MAX_UNKNOWN per message), a known field with the
 * wrong wire type, a group, field 0, an overlong tag or length prefix is
 * refused; a string ends at its first NUL; and field 15 (an unopened seal)
 * is refused. */
static void
test_beats_by_hand(void **state)
{
    uint8_t id_a[18] = {0x0a, 0x10}, id_b[18] = {0x0a, 0x10};
    uint8_t body[128], tail[1024];
    swp_beats *d = NULL;
    size_t n, t;
    (void)state;
    memset(id_a + 2, 0xaa, 16);
    memset(id_b + 2, 0xbb, 16);

    /* Two copies of each beat field: the later wins. */
    n = 0;
    memcpy(body + n, id_a, 18), n += 18;
    body[n++] = 0x10, body[n++] = 0x05; /* last_seq 5 */
    memcpy(body + n, id_b, 18), n += 18;
    body[n++] = 0x10, body[n++] = 0x07;                   /* last_seq 7 */
    body[n++] = 0xf8, body[n++] = 0x07, body[n++] = 0x01; /* unknown field 127 */
    t = hb_beat(tail, body, n);
    assert_int_equal(hb_decode(tail, t, &d), SW_OK);
    assert_int_equal(d->version, 1);
    assert_string_equal(d->instance_id, "w1");
    assert_int_equal(d->n_beats, 1);
    assert_int_equal(d->beats[0]->last_seq, 7);
    assert_int_equal(d->beats[0]->request_id.data[0], 0xbb);
    assert_int_equal(d->beats[0]->base.n_unknown_fields, 0); /* skipped */
    {
        /* it re-encodes to a batch protobuf-c reads the same way */
        uint8_t *e = NULL;
        size_t elen = 0;
        swp_beats *r;
        assert_int_equal(swp_encode_alloc(d, 1 << 20, &e, &elen), SW_OK);
        r = streamwire__v1__heartbeat_batch__unpack(NULL, elen, e);
        assert_non_null(r);
        assert_int_equal(r->n_beats, 1);
        assert_int_equal(r->beats[0]->last_seq, 7);
        assert_memory_equal(r->beats[0]->request_id.data, id_b + 2, 16);
        assert_string_equal(r->instance_id, "w1");
        streamwire__v1__heartbeat_batch__free_unpacked(r, NULL);
        free(e);
    }
    swp_free(d);

    /* A fifth copy of last_seq is refused; four are not. */
    n = 0;
    memcpy(body + n, id_a, 18), n += 18;
    for (int k = 0; k < 4; k++)
        body[n++] = 0x10, body[n++] = (uint8_t)(k + 1);
    t = hb_beat(tail, body, n);
    assert_int_equal(hb_decode(tail, t, &d), SW_OK);
    assert_int_equal(d->beats[0]->last_seq, 4);
    swp_free(d);
    body[n++] = 0x10, body[n++] = 0x09;
    t = hb_beat(tail, body, n);
    assert_int_equal(hb_decode(tail, t, &d), SW_EPROTO);
    assert_null(d);

    /* Unknown fields: SWP_MAX_UNKNOWN at the top level pass, one more not. */
    t = hb_beat(tail, id_a, 18);
    for (int k = 0; k < SWP_MAX_UNKNOWN; k++)
        tail[t++] = 0xa0, tail[t++] = 0x01, tail[t++] = 0x00; /* field 20, varint 0 */
    assert_int_equal(hb_decode(tail, t, &d), SW_OK);
    assert_int_equal(d->n_beats, 1);
    swp_free(d);
    tail[t++] = 0xa0, tail[t++] = 0x01, tail[t++] = 0x00;
    assert_int_equal(hb_decode(tail, t, &d), SW_EPROTO);

    /* Wrong wire types, a group, field 0, field 15. */
    {
        static const uint8_t bad[][3] = {
            {0x1b, 0x00, 0x00}, /* field 3 as a group start */
            {0x18, 0x01, 0x00}, /* field 3 as a varint */
            {0x0a, 0x01, 0x01}, /* field 1 as bytes */
            {0x10, 0x01, 0x00}, /* field 2 as a varint */
            {0x80, 0x00, 0x00}, /* field 0 (overlong tag), varint 0 */
            {0x7a, 0x00, 0x00}, /* field 15, sealed: not opened */
        };
        for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
            t = hb_beat(tail, id_a, 18);
            memcpy(tail + t, bad[k], 3);
            /* the third byte pads a 2-byte field with a varint field 1 */
            t += (bad[k][0] == 0x18 || bad[k][0] == 0x10 || bad[k][0] == 0x7a) ? 2 : 3;
            assert_int_equal(hb_decode(tail, t, &d), SW_EPROTO);
            assert_null(d);
        }
    }
    /* A tag of 6 bytes, a length prefix of 6 bytes: protobuf-c refuses both. */
    {
        static const uint8_t tag6[] = {0xa0, 0x80, 0x80, 0x80, 0x80, 0x00, 0x00};
        static const uint8_t len6[] = {0x1a, 0x92, 0x80, 0x80, 0x80, 0x80, 0x00};
        t = hb_beat(tail, id_a, 18);
        memcpy(tail + t, tag6, sizeof(tag6));
        assert_int_equal(hb_decode(tail, t + sizeof(tag6), &d), SW_EPROTO);
        memcpy(tail, len6, sizeof(len6));
        memcpy(tail + sizeof(len6), id_a, 18);
        assert_int_equal(hb_decode(tail, sizeof(len6) + 18, &d), SW_EPROTO);
        /* the same beat with a 5-byte length prefix is fine */
        memcpy(tail, len6, 5);
        tail[4] = 0x00;
        memcpy(tail + 5, id_a, 18);
        assert_int_equal(hb_decode(tail, 5 + 18, &d), SW_OK);
        swp_free(d);
    }
    /* A later instance_id wins, and ends at its first NUL. */
    {
        static const uint8_t inst[] = {0x12, 0x05, 'w', '2', 0x00, 'x', 'y'};
        t = hb_beat(tail, id_a, 18);
        memcpy(tail + t, inst, sizeof(inst));
        assert_int_equal(hb_decode(tail, t + sizeof(inst), &d), SW_OK);
        assert_string_equal(d->instance_id, "w2");
        swp_free(d);
    }
}

/* More than SWP_MAX_BATCH batched items is refused before unpacking (a
 * hostile frontend-bound message cannot make the decoder allocate a struct
 * per two bytes); exactly SWP_MAX_BATCH decodes. */
static void
test_batch_count_cap(void **state)
{
    static const uint8_t id[SW_REQUEST_ID_BYTES] = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 1, 2, 3, 4, 5, 6};
    swp_hdr h = {id, NULL, 0, 0};
    size_t cap = SWP_HDR_MAX + (SWP_MAX_BATCH + 2) * (SWP_PREFIX_MAX + 16), n;
    uint8_t *b = malloc(cap), body[32];
    (void)state;
    assert_non_null(b);
    for (int extra = 0; extra <= 1; extra++) {
        swp_item *d = NULL;
        swp_arena a;
        n = swp_hdr_write(&h, b);
        n += swp_data_body_write(b + n, 1, "x", 1, 0, NULL, 0);
        for (uint64_t q = 2; q <= 1 + (uint64_t)SWP_MAX_BATCH + (uint64_t)extra; q++) {
            size_t bl = swp_data_body_write(body, q, "y", 1, 0, NULL, 0);
            n += swp_batch_prefix(b + n, bl);
            memcpy(b + n, body, bl);
            n += bl;
        }
        assert_true(n <= cap);
        if (extra) {
            assert_int_equal(swp_decode_item(b, n, 1 << 20, &d), SW_EPROTO);
            assert_null(d);
            assert_int_equal(swp_decode_item_arena(b, n, 1 << 20, &a, &d), SW_EPROTO);
            assert_null(d);
        } else {
            assert_int_equal(swp_decode_item(b, n, 1 << 20, &d), SW_OK);
            assert_int_equal(d->n_batch, SWP_MAX_BATCH);
            assert_int_equal(d->batch[SWP_MAX_BATCH - 1]->seq, 1 + SWP_MAX_BATCH);
            swp_free(d);
            assert_int_equal(swp_decode_item_arena(b, n, 1 << 20, &a, &d), SW_OK);
            assert_int_equal(d->n_batch, SWP_MAX_BATCH);
            swp_free_arena(d, &a);
        }
    }
    /* 1 MB of empty batch entries: refused without unpacking. */
    {
        size_t big = 1 << 20;
        uint8_t *e = malloc(big);
        swp_item *d = NULL;
        assert_non_null(e);
        n = swp_hdr_write(&h, e);
        n += swp_data_body_write(e + n, 1, "x", 1, 0, NULL, 0);
        while (n + 2 <= big) {
            e[n++] = 0x62;
            e[n++] = 0x00;
        }
        assert_int_equal(swp_decode_item(e, n, big, &d), SW_EPROTO);
        assert_null(d);
        free(e);
    }
    free(b);
}

/* 4b. 200 items of 64 bytes: more than the arena holds, so the arena decoder
 * falls back to malloc for the rest (and frees it: the ASan build checks). */
static void
test_batch_large_arena_fallback(void **state)
{
    enum { NITEMS = 200, ITEM = 64 };
    wbuf w = {NULL, 0, 0};
    uint8_t chunk[ITEM];
    swp_arena *arena = malloc(sizeof(*arena));
    swp_item *a = NULL, *r = NULL;
    size_t outside = 0;
    (void)state;
    assert_non_null(arena);
    wb_hdr(&w, "inst-a", 0, 0);
    for (int i = 0; i < NITEMS; i++) {
        fill_pattern(chunk, sizeof(chunk), 7, (unsigned)i * 3);
        wb_data(&w, i > 0, 1000 + 2 * (uint64_t)i, chunk, sizeof(chunk), i % 3 == 0);
    }
    assert_true(w.len > SWP_ARENA_BYTES);

    for (int round = 0; round < 2; round++) { /* the arena serves one message at a time */
        assert_int_equal(swp_decode_item_arena(w.b, w.len, MAXLEN, arena, &a), SW_OK);
        assert_non_null(a);
        assert_true(arena->used <= SWP_ARENA_BYTES);
        /* the wrapper itself is in the arena; the batch did not all fit */
        assert_true((uint8_t *)a >= arena->buf && (uint8_t *)a < arena->buf + SWP_ARENA_BYTES);
        outside = 0;
        assert_true(a->seq == 1000);
        fill_pattern(chunk, sizeof(chunk), 7, 0);
        assert_bin(a->data, chunk, sizeof(chunk));
        assert_true(a->droppable);
        assert_int_equal(a->n_batch, NITEMS - 1);
        for (int i = 1; i < NITEMS; i++) {
            const swp_batched *b = a->batch[i - 1];
            if ((const uint8_t *)b->data.data < arena->buf ||
                (const uint8_t *)b->data.data >= arena->buf + SWP_ARENA_BYTES)
                outside++;
            fill_pattern(chunk, sizeof(chunk), 7, (unsigned)i * 3);
            assert_true(b->seq == 1000 + 2 * (uint64_t)i);
            assert_bin(b->data, chunk, sizeof(chunk));
            assert_int_equal(!!b->droppable, i % 3 == 0);
            assert_false(b->complete_final);
            assert_null(b->terminal);
        }
        assert_true(outside > 0);
        if (round == 0) {
            size_t la, lr;
            uint8_t *ea, *er;
            assert_int_equal(swp_decode_item(w.b, w.len, MAXLEN, &r), SW_OK);
            ea = encode_msg(a, &la);
            er = encode_msg(r, &lr);
            assert_int_equal(la, lr);
            assert_memory_equal(ea, er, la);
            free(ea);
            free(er);
            swp_free(r);
        }
        swp_free_arena(a, arena);
    }

    /* rejected after the arena overflowed: the malloc'd part is freed too */
    {
        wbuf bad = {NULL, 0, 0};
        wb_raw(&bad, w.b, w.len);
        wb_data(&bad, 1, 1000, "x", 1, 0); /* seq goes backwards at the very end */
        a = (swp_item *)(uintptr_t)1;
        assert_int_equal(swp_decode_item_arena(bad.b, bad.len, MAXLEN, arena, &a), SW_EPROTO);
        assert_null(a);
        r = (swp_item *)(uintptr_t)1;
        assert_int_equal(swp_decode_item(bad.b, bad.len, MAXLEN, &r), SW_EPROTO);
        assert_null(r);
        free(bad.b);
    }
    free(arena);
    free(w.b);
}

/* 5. Every batch rule, both decoders. Each letter of a shape is one item,
 * the first the wrapper's body:
 *   d data        e empty data   f final COMPLETED   g final FAILED (app code)
 *   F final FAILED without error   A final FAILED, sw_code 0 and no app code
 *   U final with status UNSPECIFIED   N final without a terminal
 *   X final that carries data      t data item carrying a terminal
 *   h heartbeat (wrapper only)     n no body at all (wrapper only) */
static void
wb_item(wbuf *w, int batched, char kind, uint64_t seq)
{
    swp_terminal t;
    swp_error e;
    switch (kind) {
    case 'd':
        wb_data(w, batched, seq, PAYLOAD, sizeof(PAYLOAD), 0);
        break;
    case 'e':
        wb_data(w, batched, seq, NULL, 0, 1);
        break;
    case 'f':
        make_terminal(&t, NULL, STREAMWIRE__V1__STATUS__STATUS_COMPLETED, "stop", 0, NULL, NULL);
        wb_final(w, batched, seq, &t);
        break;
    case 'g':
        make_terminal(&t, &e, STREAMWIRE__V1__STATUS__STATUS_FAILED, "", 0, "engine_error", "x");
        wb_final(w, batched, seq, &t);
        break;
    case 'F':
        make_terminal(&t, NULL, STREAMWIRE__V1__STATUS__STATUS_FAILED, "", 0, NULL, NULL);
        wb_final(w, batched, seq, &t);
        break;
    case 'A':
        make_terminal(&t, &e, STREAMWIRE__V1__STATUS__STATUS_FAILED, "", 0, "", "no code");
        wb_final(w, batched, seq, &t);
        break;
    case 'U':
        make_terminal(&t, NULL, STREAMWIRE__V1__STATUS__STATUS_UNSPECIFIED, "stop", 0, NULL, NULL);
        wb_final(w, batched, seq, &t);
        break;
    case 'N':
        wb_final(w, batched, seq, NULL);
        break;
    case 'X':
    case 't': {
        swp_batched b = STREAMWIRE__V1__BATCHED_ITEM__INIT;
        make_terminal(&t, NULL, STREAMWIRE__V1__STATUS__STATUS_COMPLETED, "stop", 0, NULL, NULL);
        b.seq = seq;
        b.data = bin(PAYLOAD, sizeof(PAYLOAD));
        b.complete_final = kind == 'X';
        b.terminal = &t;
        wb_msg(w, batched, &b);
        break;
    }
    case 'h':
    case 'n': {
        swp_item frag;
        Streamwire__V1__Heartbeat hb = STREAMWIRE__V1__HEARTBEAT__INIT;
        assert_false(batched);
        streamwire__v1__stream_item_wrapper__init(&frag);
        frag.seq = seq;
        if (kind == 'h') {
            hb.last_seq = 4;
            frag.body_case = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_HEARTBEAT;
            frag.heartbeat = &hb;
        }
        wb_msg(w, 0, &frag);
        break;
    }
    default:
        fail_msg("bad item kind %c", kind);
    }
}

static void
test_batch_rules_rejected(void **state)
{
    static const struct {
        const char *what;
        const char *shape;
        uint64_t seq[4];
        sw_err want;
    } cases[] = {
        /* accepted: the same shapes done right */
        {"data batch", "ddd", {5, 6, 9}, SW_OK},
        {"batch ending in a final", "dddf", {5, 6, 9, 10}, SW_OK},
        {"batch ending in a FAILED final", "dedg", {5, 6, 7, 8}, SW_OK},
        {"wrapper empty data + final", "ef", {1, 2}, SW_OK},
        {"final with data, no batch", "X", {5}, SW_OK},
        {"final, no batch", "f", {5}, SW_OK},
        {"heartbeat, no batch", "h", {0}, SW_OK},
        {"batch at the top of the seq range", "dd", {UINT64_MAX - 1, UINT64_MAX}, SW_OK},
        /* seq order */
        {"seq equal to the previous one", "ddd", {5, 6, 6}, SW_EPROTO},
        {"seq below the previous one", "ddd", {5, 7, 6}, SW_EPROTO},
        {"seq equal to the wrapper's", "dd", {5, 5}, SW_EPROTO},
        {"seq below the wrapper's", "dd", {5, 3}, SW_EPROTO},
        {"seq 0 after the wrapper", "dd", {5, 0}, SW_EPROTO},
        {"empty item seq equal to the previous one", "de", {5, 5}, SW_EPROTO},
        {"final seq equal to the previous one", "ddf", {5, 6, 6}, SW_EPROTO},
        {"final seq below the wrapper's", "df", {5, 4}, SW_EPROTO},
        {"seq wraps after UINT64_MAX", "dd", {UINT64_MAX, 0}, SW_EPROTO},
        {"wrapper data seq 0", "dd", {0, 1}, SW_EPROTO},
        /* a final only last */
        {"final in the middle", "dfd", {5, 6, 7}, SW_EPROTO},
        {"FAILED final in the middle", "dge", {5, 6, 7}, SW_EPROTO},
        {"two finals", "dff", {5, 6, 7}, SW_EPROTO},
        /* what a batched final / data item may carry */
        {"batched final with data", "dX", {5, 6}, SW_EPROTO},
        {"batched final with data after data", "ddX", {5, 6, 7}, SW_EPROTO},
        {"batched data item with a terminal", "dt", {5, 6}, SW_EPROTO},
        {"batched data item with a terminal before a final", "dtf", {5, 6, 7}, SW_EPROTO},
        /* the wrapper must be a data item */
        {"wrapper is a final", "fd", {5, 6}, SW_EPROTO},
        {"wrapper is a final, batch holds a final", "ff", {5, 6}, SW_EPROTO},
        {"wrapper is a final with data", "Xd", {5, 6}, SW_EPROTO},
        {"wrapper is a heartbeat", "hd", {0, 1}, SW_EPROTO},
        {"wrapper is a heartbeat, batch holds a final", "hf", {0, 1}, SW_EPROTO},
        {"wrapper has no body", "nd", {5, 6}, SW_EPROTO},
        /* a batched final's terminal is validated like the wrapper's */
        {"batched FAILED without error", "dF", {5, 6}, SW_EPROTO},
        {"batched FAILED with neither sw_code nor app_code", "dA", {5, 6}, SW_EPROTO},
        {"batched final with status UNSPECIFIED", "dU", {5, 6}, SW_EPROTO},
        {"batched final without terminal", "dN", {5, 6}, SW_EPROTO},
        {"invalid final after data items", "ddeF", {5, 6, 7, 8}, SW_EPROTO},
    };
    size_t rejected = 0;
    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        wbuf w = {NULL, 0, 0};
        size_t n = strlen(cases[i].shape);
        assert_true(n >= 1 && n <= 4);
        wb_hdr(&w, "inst-a", 0, 0);
        for (size_t j = 0; j < n; j++)
            wb_item(&w, j > 0, cases[i].shape[j], cases[i].seq[j]);
        expect_bytes_rv(&w, cases[i].want, cases[i].what);
        if (cases[i].want != SW_OK)
            rejected++;
        free(w.b);
    }
    assert_int_equal(rejected, 28);

    /* the same rules through protobuf-c's encoding of a whole wrapper */
    {
        swp_item m;
        swp_batched b1 = STREAMWIRE__V1__BATCHED_ITEM__INIT;
        swp_batched b2 = STREAMWIRE__V1__BATCHED_ITEM__INIT;
        swp_batched *bs[2] = {&b1, &b2};
        swp_terminal t;
        make_terminal(&t, NULL, STREAMWIRE__V1__STATUS__STATUS_COMPLETED, "stop", 0, NULL, NULL);
        fill_item_data(&m);
        m.seq = 10;
        b1.seq = 11;
        b1.data = bin("a", 1);
        b2.seq = 12;
        b2.complete_final = 1;
        b2.terminal = &t;
        m.n_batch = 2;
        m.batch = bs;
        expect_decode_rv(K_ITEM, &m, SW_OK, "encoded batch");
        b2.seq = 11;
        expect_decode_rv(K_ITEM, &m, SW_EPROTO, "encoded batch, repeated seq");
        b2.seq = 12;
        m.complete_final = 1;
        m.terminal = &t;
        expect_decode_rv(K_ITEM, &m, SW_EPROTO, "encoded batch, final wrapper");
        m.complete_final = 0;
        m.terminal = NULL;
        b1.complete_final = 1;
        b1.terminal = &t;
        b1.data = bin(NULL, 0);
        expect_decode_rv(K_ITEM, &m, SW_EPROTO, "encoded batch, final first");
        /* typed batched items: data may be typed, the final may not */
        b1.complete_final = 0;
        b1.terminal = NULL;
        b1.data = bin("a", 1);
        b1.event = "metrics";
        m.event = "refusal";
        expect_decode_rv(K_ITEM, &m, SW_OK, "encoded batch, typed data items");
        b1.event = "bad event";
        expect_decode_rv(K_ITEM, &m, SW_EPROTO, "encoded batch, bad batched event");
        b1.event = "metrics";
        b2.event = "refusal";
        expect_decode_rv(K_ITEM, &m, SW_EPROTO, "encoded batch, typed final");
    }
}

/* 6. A final's body from swp_final_body_alloc after a header. */
static void
test_final_body_round_trip(void **state)
{
    static const struct {
        Streamwire__V1__Status status;
        const char *reason;
        uint32_t sw_code;
        const char *app_code;
    } finals[] = {
        {STREAMWIRE__V1__STATUS__STATUS_COMPLETED, "stop", 0, NULL},
        {STREAMWIRE__V1__STATUS__STATUS_COMPLETED, "", 0, NULL},
        {STREAMWIRE__V1__STATUS__STATUS_INCOMPLETE, "max_tokens", 0, NULL},
        {STREAMWIRE__V1__STATUS__STATUS_CANCELLED, "cancelled", 0, NULL},
        {STREAMWIRE__V1__STATUS__STATUS_FAILED, "", 0, "engine_error"},
        {STREAMWIRE__V1__STATUS__STATUS_FAILED, "", SW_EOVERLOADED, ""},
    };
    static const uint64_t seqs[] = {1, 42, UINT64_C(1) << 40};
    (void)state;
    for (size_t i = 0; i < sizeof(finals) / sizeof(finals[0]); i++) {
        for (size_t s = 0; s < sizeof(seqs) / sizeof(seqs[0]); s++) {
            swp_terminal t;
            swp_error e;
            swp_batched ref = STREAMWIRE__V1__BATCHED_ITEM__INIT;
            wbuf w = {NULL, 0, 0};
            item_pair p;
            uint8_t *body = NULL, *packed;
            size_t n = 0, plen;
            int failed = finals[i].status == STREAMWIRE__V1__STATUS__STATUS_FAILED;
            make_terminal(&t, failed ? &e : NULL, finals[i].status, finals[i].reason,
                          finals[i].sw_code, finals[i].app_code, "it broke");

            assert_int_equal(swp_final_body_alloc(seqs[s], &t, MAXLEN, &body, &n), SW_OK);
            ref.seq = seqs[s];
            ref.complete_final = 1;
            ref.terminal = &t;
            packed = encode_msg(&ref, &plen);
            assert_int_equal(n, plen);
            assert_memory_equal(body, packed, n);
            free(packed);

            wb_hdr(&w, "inst-a", s == 1, s == 2 ? 512 : 0);
            wb_raw(&w, body, n);
            item_pair_decode(&p, w.b, w.len, SW_OK, "header + final body");
            for (int k = 0; k < 2; k++) {
                const swp_item *d = p.m[k];
                assert_int_equal(d->version, 1);
                assert_bin(d->request_id, RID, sizeof(RID));
                assert_string_equal(d->instance_id, "inst-a");
                assert_int_equal(!!d->resent, s == 1);
                assert_int_equal(d->credit_window, s == 2 ? 512 : 0);
                assert_true(d->seq == seqs[s]);
                assert_true(d->complete_final);
                assert_int_equal(d->body_case, STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY__NOT_SET);
                assert_false(d->droppable);
                assert_int_equal(d->n_batch, 0);
                assert_non_null(d->terminal);
                assert_int_equal(d->terminal->status, finals[i].status);
                assert_string_equal(d->terminal->finish_reason, finals[i].reason);
                if (failed) {
                    assert_non_null(d->terminal->error);
                    assert_int_equal(d->terminal->error->sw_code, finals[i].sw_code);
                    assert_string_equal(d->terminal->error->app_code, finals[i].app_code);
                    assert_string_equal(d->terminal->error->message, "it broke");
                } else {
                    assert_null(d->terminal->error);
                }
            }
            item_pair_free(&p);

            /* max is inclusive; one byte less is SW_EMSGSIZE with nothing returned */
            {
                uint8_t *o = (uint8_t *)(uintptr_t)1;
                size_t l = 0;
                assert_int_equal(swp_final_body_alloc(seqs[s], &t, n, &o, &l), SW_OK);
                assert_int_equal(l, n);
                assert_memory_equal(o, body, n);
                free(o);
                o = (uint8_t *)(uintptr_t)1;
                assert_int_equal(swp_final_body_alloc(seqs[s], &t, n - 1, &o, &l), SW_EMSGSIZE);
                assert_null(o);
                o = (uint8_t *)(uintptr_t)1;
                assert_int_equal(swp_final_body_alloc(seqs[s], &t, 0, &o, &l), SW_EMSGSIZE);
                assert_null(o);
            }
            free(body);
            free(w.b);
        }
    }
}

/* ---- the decoders' allocation bound (issue 11 #5) */

typedef struct count_alloc {
    size_t bytes;
} count_alloc;

static void *
count_alloc_fn(void *data, size_t size)
{
    ((count_alloc *)data)->bytes += size + 16;
    return malloc(size);
}

static void
count_free_fn(void *data, void *p)
{
    (void)data;
    free(p);
}

/* What unpacking buf actually allocates (with malloc's overhead), checked
 * against the estimate and the bound; returns the unpack result. */
static sw_err
unpack_counted(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len)
{
    count_alloc c = {0};
    ProtobufCAllocator a = {count_alloc_fn, count_free_fn, &c};
    ProtobufCMessage *m = NULL;
    size_t est = swp_alloc_estimate(d, buf, len);
    sw_err rv = swp_unpack(d, buf, len, SIZE_MAX, &a, &m);
    if (rv == SW_OK) {
        assert_true(c.bytes <= est);
        assert_true(est <= SWP_ALLOC_FACTOR * len + SWP_ALLOC_SLACK);
        protobuf_c_message_free_unpacked(m, &a);
    }
    return rv;
}

/* A valid request followed by n copies of unit. */
static uint8_t *
request_plus(const uint8_t *unit, size_t ulen, size_t n, size_t *len)
{
    swp_request r;
    size_t blen;
    uint8_t *b, *out;
    fill_request_min(&r);
    b = encode_msg(&r, &blen);
    out = malloc(blen + ulen * n);
    assert_non_null(out);
    memcpy(out, b, blen);
    for (size_t i = 0; i < n; i++)
        memcpy(out + blen + i * ulen, unit, ulen);
    *len = blen + ulen * n;
    free(b);
    return out;
}

/* 1 MiB of 3-byte unknown fields used to decode (16 MB of heap); now more
 * than SWP_MAX_UNKNOWN is refused before unpacking, SWP_MAX_UNKNOWN is not. */
static void
test_alloc_bound_unknown_fields(void **state)
{
    static const uint8_t unk[] = {0x98, 0x06, 0x01}; /* field 99, varint 1 */
    swp_request *d = NULL;
    size_t len;
    uint8_t *b;
    (void)state;
    b = request_plus(unk, sizeof(unk), (1u << 20) / sizeof(unk), &len);
    assert_int_equal(swp_decode_request(b, len, SIZE_MAX, &d), SW_EPROTO);
    assert_null(d);
    assert_int_equal(swp_alloc_estimate(&streamwire__v1__request__descriptor, b, len), SIZE_MAX);
    free(b);
    b = request_plus(unk, sizeof(unk), SWP_MAX_UNKNOWN + 1, &len);
    assert_int_equal(swp_decode_request(b, len, SIZE_MAX, &d), SW_EPROTO);
    free(b);
    b = request_plus(unk, sizeof(unk), SWP_MAX_UNKNOWN, &len);
    assert_int_equal(swp_decode_request(b, len, SIZE_MAX, &d), SW_OK);
    assert_int_equal(d->base.n_unknown_fields, SWP_MAX_UNKNOWN);
    swp_free(d);
    assert_int_equal(unpack_counted(&streamwire__v1__request__descriptor, b, len), SW_OK);
    free(b);
}

/* Request.headers: at most SWP_MAX_HEADERS entries, keys of at most
 * SWP_MAX_HEADER_KEY bytes, values of at most SWP_MAX_HEADER_VALUE. */
static void
test_alloc_bound_headers(void **state)
{
    static const uint8_t hdr[] = {0x5a, 0x06, 0x0a, 0x01, 'k', 0x12, 0x01, 'v'};
    swp_request r, *d = NULL;
    Streamwire__V1__Request__HeadersEntry e = STREAMWIRE__V1__REQUEST__HEADERS_ENTRY__INIT;
    Streamwire__V1__Request__HeadersEntry *ep = &e;
    char key[SWP_MAX_HEADER_KEY + 2], val[SWP_MAX_HEADER_VALUE + 2];
    size_t len;
    uint8_t *b;
    (void)state;
    b = request_plus(hdr, sizeof(hdr), SWP_MAX_HEADERS, &len);
    assert_int_equal(swp_decode_request(b, len, SIZE_MAX, &d), SW_OK);
    assert_int_equal(d->n_headers, SWP_MAX_HEADERS);
    swp_free(d);
    assert_int_equal(unpack_counted(&streamwire__v1__request__descriptor, b, len), SW_OK);
    free(b);
    b = request_plus(hdr, sizeof(hdr), SWP_MAX_HEADERS + 1, &len);
    assert_int_equal(swp_decode_request(b, len, SIZE_MAX, &d), SW_EPROTO);
    assert_null(d);
    free(b);
    b = request_plus(hdr, sizeof(hdr), (1u << 20) / sizeof(hdr), &len);
    assert_int_equal(swp_decode_request(b, len, SIZE_MAX, &d), SW_EPROTO);
    free(b);

    fill_request_min(&r);
    r.n_headers = 1;
    r.headers = &ep;
    memset(key, 'k', sizeof(key));
    memset(val, 'v', sizeof(val));
    e.key = key;
    e.value = val;
    key[SWP_MAX_HEADER_KEY] = '\0';
    val[SWP_MAX_HEADER_VALUE] = '\0';
    b = encode_msg(&r, &len);
    assert_int_equal(swp_decode_request(b, len, SIZE_MAX, &d), SW_OK);
    swp_free(d);
    free(b);
    key[SWP_MAX_HEADER_KEY] = 'k';
    key[SWP_MAX_HEADER_KEY + 1] = '\0';
    b = encode_msg(&r, &len);
    assert_int_equal(swp_decode_request(b, len, SIZE_MAX, &d), SW_EPROTO);
    free(b);
    key[SWP_MAX_HEADER_KEY] = '\0';
    val[SWP_MAX_HEADER_VALUE] = 'v';
    val[SWP_MAX_HEADER_VALUE + 1] = '\0';
    b = encode_msg(&r, &len);
    assert_int_equal(swp_decode_request(b, len, SIZE_MAX, &d), SW_EPROTO);
    free(b);
}

/* final_acks beyond SWP_MAX_FINAL_ACKS is refused before unpacking; a
 * non-repeated field written more than 4 times too; 4 copies decode (the
 * last one wins, as protobuf says). */
static void
test_alloc_bound_repeats(void **state)
{
    static const uint8_t ack[] = {0x4a, 0x00};
    static const uint8_t ver[] = {0x08, 0x01};
    swp_control c = STREAMWIRE__V1__CONTROL__INIT;
    swp_control *dc = NULL;
    swp_request *d = NULL;
    uint8_t *b, *big;
    size_t len, n = 100000;
    (void)state;
    c.version = 1;
    c.kind = STREAMWIRE__V1__CONTROL_KIND__CONTROL_ACK_FINALS;
    b = encode_msg(&c, &len);
    big = malloc(len + n * sizeof(ack));
    assert_non_null(big);
    memcpy(big, b, len);
    for (size_t i = 0; i < n; i++)
        memcpy(big + len + i * sizeof(ack), ack, sizeof(ack));
    assert_int_equal(
        swp_alloc_estimate(&streamwire__v1__control__descriptor, big, len + n * sizeof(ack)),
        SIZE_MAX);
    assert_int_equal(swp_decode_control(big, len + n * sizeof(ack), SIZE_MAX, &dc), SW_EPROTO);
    assert_null(dc);
    free(big);
    free(b);

    b = request_plus(ver, sizeof(ver), 3, &len); /* 4 copies in all */
    assert_int_equal(swp_decode_request(b, len, SIZE_MAX, &d), SW_OK);
    swp_free(d);
    free(b);
    b = request_plus(ver, sizeof(ver), 4, &len); /* 5 */
    assert_int_equal(swp_decode_request(b, len, SIZE_MAX, &d), SW_EPROTO);
    assert_null(d);
    free(b);
    b = request_plus(ver, sizeof(ver), (1u << 20) / 2, &len);
    assert_int_equal(swp_decode_request(b, len, SIZE_MAX, &d), SW_EPROTO);
    free(b);
}

/* The densest legitimate messages stay within the bound, measured. */
static void
test_alloc_bound_dense_legit(void **state)
{
    static uint8_t ids[SWP_MAX_BEATS][SW_REQUEST_ID_BYTES];
    static swp_beat one[SWP_MAX_BEATS];
    static swp_beat *ptr[SWP_MAX_BEATS];
    static ProtobufCBinaryData acks[SWP_MAX_FINAL_ACKS];
    swp_beats m = STREAMWIRE__V1__HEARTBEAT_BATCH__INIT;
    swp_control c = STREAMWIRE__V1__CONTROL__INIT;
    uint8_t *b;
    size_t len;
    (void)state;
    for (size_t i = 0; i < SWP_MAX_BEATS; i++) {
        memset(ids[i], (int)(i & 0xff), SW_REQUEST_ID_BYTES);
        streamwire__v1__stream_beat__init(&one[i]);
        one[i].request_id = bin(ids[i], SW_REQUEST_ID_BYTES);
        one[i].last_seq = 1;
        ptr[i] = &one[i];
    }
    m.version = 1;
    m.instance_id = (char *)"inst-1";
    m.beats = ptr;
    m.n_beats = SWP_MAX_BEATS;
    b = encode_msg(&m, &len);
    {
        /* Through protobuf-c it would cost 7.6x (refused under the bound);
         * the hand decoder builds one block of at most 3.3x + a constant. */
        swp_beats *d = NULL;
        size_t want =
            sizeof(swp_beats) +
            SWP_MAX_BEATS * (sizeof(swp_beat *) + sizeof(swp_beat) + SW_REQUEST_ID_BYTES) +
            strlen("inst-1") + 1;
        assert_true(swp_alloc_estimate(&streamwire__v1__heartbeat_batch__descriptor, b, len) >
                    SWP_ALLOC_FACTOR * len + SWP_ALLOC_SLACK);
        assert_int_equal(unpack_counted(&streamwire__v1__heartbeat_batch__descriptor, b, len),
                         SW_EPROTO);
        assert_int_equal(swp_decode_beats(b, len, SIZE_MAX, &d), SW_OK);
        assert_int_equal(d->n_beats, SWP_MAX_BEATS);
        assert_true(malloc_usable_size(d) >= want);
        assert_true(malloc_usable_size(d) + 16 <= SWP_ALLOC_FACTOR * len + SWP_ALLOC_SLACK);
        assert_true(want * 10 <= len * 33 + 10 * 1024); /* 3.3x + 1 KiB */
        for (size_t i = 0; i < SWP_MAX_BEATS; i++) {
            /* every part inside the one block */
            assert_true((uint8_t *)d->beats[i] > (uint8_t *)d &&
                        (uint8_t *)d->beats[i] < (uint8_t *)d + want);
            assert_true(d->beats[i]->request_id.data > (uint8_t *)d &&
                        d->beats[i]->request_id.data < (uint8_t *)d + want);
            assert_memory_equal(d->beats[i]->request_id.data, ids[i], SW_REQUEST_ID_BYTES);
            assert_int_equal(d->beats[i]->last_seq, 1);
        }
        swp_free(d);
    }
    free(b);
    for (size_t i = 0; i < SWP_MAX_FINAL_ACKS; i++)
        acks[i] = bin(ids[i], SW_REQUEST_ID_BYTES);
    c.version = 1;
    c.kind = STREAMWIRE__V1__CONTROL_KIND__CONTROL_ACK_FINALS;
    c.final_acks = acks;
    c.n_final_acks = SWP_MAX_FINAL_ACKS;
    b = encode_msg(&c, &len);
    assert_int_equal(unpack_counted(&streamwire__v1__control__descriptor, b, len), SW_OK);
    free(b);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request_round_trip_full),
        cmocka_unit_test(test_request_round_trip_min),
        cmocka_unit_test(test_item_round_trip_data),
        cmocka_unit_test(test_item_round_trip_heartbeat),
        cmocka_unit_test(test_item_round_trip_finals),
        cmocka_unit_test(test_control_round_trip),
        cmocka_unit_test(test_probe_reply_round_trip),
        cmocka_unit_test(test_instance_round_trip),
        cmocka_unit_test(test_item_arena_decode),
        cmocka_unit_test(test_truncated_every_length),
        cmocka_unit_test(test_random_garbage),
        cmocka_unit_test(test_mutated_samples),
        cmocka_unit_test(test_oversized_input),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_wrong_version),
        cmocka_unit_test(test_request_validation),
        cmocka_unit_test(test_item_validation),
        cmocka_unit_test(test_control_validation),
        cmocka_unit_test(test_probe_and_instance_validation),
        cmocka_unit_test(test_unknown_fields_accepted),
        cmocka_unit_test(test_field_encoding_edge_cases),
        cmocka_unit_test(test_overlong_field_zero),
        cmocka_unit_test(test_encode_limits),
        cmocka_unit_test(test_valid_subject),
        cmocka_unit_test(test_validate_token),
        cmocka_unit_test(test_validate_endpoint),
        cmocka_unit_test(test_transport_subjects),
        cmocka_unit_test(test_longest_request_subject_is_valid),
        cmocka_unit_test(test_response_subject_id),
        cmocka_unit_test(test_hand_header_data_body),
        cmocka_unit_test(test_data_body_matches_protobuf_c),
        cmocka_unit_test(test_hand_header_and_prefix_bounds),
        cmocka_unit_test(test_batch_decode),
        cmocka_unit_test(test_batch_large_arena_fallback),
        cmocka_unit_test(test_batch_count_cap),
        cmocka_unit_test(test_alloc_bound_unknown_fields),
        cmocka_unit_test(test_alloc_bound_headers),
        cmocka_unit_test(test_alloc_bound_repeats),
        cmocka_unit_test(test_alloc_bound_dense_legit),
        cmocka_unit_test(test_beats),
        cmocka_unit_test(test_beats_by_hand),
        cmocka_unit_test(test_beats_subject),
        cmocka_unit_test(test_batch_rules_rejected),
        cmocka_unit_test(test_final_body_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
