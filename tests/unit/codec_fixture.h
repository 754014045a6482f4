/* tests/unit/codec_fixture.h -- what the codec test binaries share
 * (test_codec, test_names, test_codec_hand, test_codec_bounds; split from
 * test_codec.c): the sample request id and response subject, the decoder of
 * every message kind behind one call (decode_any), encoding both ways with a
 * check that they agree (encode_msg), the sample messages more than one
 * binary builds, and expect_decode_rv.
 *
 * Functions are static inline and variables static: each binary has its own
 * copy and builds warning-free using only part of it. */
#ifndef SW_TEST_CODEC_FIXTURE_H
#define SW_TEST_CODEC_FIXTURE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/sw_common.h"
#include "proto/sw_codec.h"

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
static inline sw_err
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
static inline uint8_t *
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

static inline ProtobufCBinaryData
bin(const void *p, size_t n)
{
    ProtobufCBinaryData d;
    d.data = (uint8_t *)(uintptr_t)p;
    d.len = n;
    return d;
}

static inline void
assert_bin(ProtobufCBinaryData d, const void *p, size_t n)
{
    assert_int_equal(d.len, n);
    if (n > 0)
        assert_memory_equal(d.data, p, n);
}

static inline uint64_t
rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline char *
repeat(char *buf, char c, size_t n)
{
    memset(buf, c, n);
    buf[n] = '\0';
    return buf;
}

/* ------------------------------------------------------------ sample messages */

/* The sealed sample's sender key, fill_instance's public key: fill_sealed (in
 * test_codec.c) writes it; all zero in the binaries that do not call it. */
static uint8_t sealed_pk[32];
static const uint8_t PAYLOAD[] = {'h', 'i', 0x00, 0x01, 0xff, 'x'};

/* A minimal valid request: only what the decoder requires. */
static inline void
fill_request_min(swp_request *r)
{
    *r = (swp_request)STREAMWIRE__V1__REQUEST__INIT;
    r->version = SW_PROTOCOL_VERSION;
    r->request_id = bin(RID, sizeof(RID));
    r->response_subject = (char *)RSP_SUBJECT;
    r->router_id = (char *)"rtr-1";
}

static inline void
fill_item_base(swp_item *m)
{
    /* the generated INIT macro trips -Wmissing-braces (union {0}) */
    streamwire__v1__stream_item_wrapper__init(m);
    m->version = SW_PROTOCOL_VERSION;
    m->request_id = bin(RID, sizeof(RID));
    m->instance_id = (char *)"inst-a";
}

static inline void
fill_item_data(swp_item *m)
{
    fill_item_base(m);
    m->seq = 3;
    m->body_case = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_DATA;
    m->data = bin(PAYLOAD, sizeof(PAYLOAD));
    m->droppable = 1;
    m->resent = 1;
}

static Streamwire__V1__InstanceInfo__LabelsEntry inst_l1 =
    STREAMWIRE__V1__INSTANCE_INFO__LABELS_ENTRY__INIT;
static Streamwire__V1__InstanceInfo__LabelsEntry inst_l2 =
    STREAMWIRE__V1__INSTANCE_INFO__LABELS_ENTRY__INIT;
static Streamwire__V1__InstanceInfo__LabelsEntry *inst_labels[2] = {&inst_l1, &inst_l2};

static inline void
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

/* Encodes msg and decodes it as kind; asserts the result is want. */
static inline void
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

#endif
