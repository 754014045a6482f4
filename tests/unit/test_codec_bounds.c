/* tests/unit/test_codec_bounds.c -- the decoders' allocation bound (issue
 * 11 #5; split from test_codec.c): unknown fields, headers and repeated
 * fields are refused before unpacking, the densest legitimate messages are
 * measured within SWP_ALLOC_FACTOR x the input + SWP_ALLOC_SLACK, and the
 * hand-written HeartbeatBatch decoder (proto/beats.c) that keeps the densest
 * batch in one block follows protobuf-c's reading rules. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "codec_fixture.h"

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
         * the hand decoder builds one block of at most 3.6x + a constant. */
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
        assert_true(want * 10 <= len * 36 + 10 * 1024); /* 3.6x + 1 KiB */
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

/* ---- the hand-written HeartbeatBatch decoder (proto/beats.c) */

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

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_bound_unknown_fields),
        cmocka_unit_test(test_alloc_bound_headers),
        cmocka_unit_test(test_alloc_bound_repeats),
        cmocka_unit_test(test_alloc_bound_dense_legit),
        cmocka_unit_test(test_beats_by_hand),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
