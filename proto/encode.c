/* proto/encode.c -- encoding: protobuf-c's packing behind a size cap
 * (swp_encode, swp_encode_alloc), and the hot path's hand encoding of
 * StreamItemWrapper headers, data and final bodies and batch prefixes, and
 * of HeartbeatBatches (byte for byte what protobuf-c writes;
 * test_codec_hand compares them). The
 * decoders are in codec.c and beats.c. */
#include <stdlib.h>
#include <string.h>

#include "common/sw_common.h"
#include "proto/sw_codec.h"

size_t
swp_encoded_size(const void *msg)
{
    return protobuf_c_message_get_packed_size((const ProtobufCMessage *)msg);
}

sw_err
swp_encode(const void *msg, uint8_t *buf, size_t cap, size_t *len)
{
    size_t n;
    if (msg == NULL || len == NULL || (buf == NULL && cap != 0))
        return SW_EINVAL;
    n = swp_encoded_size(msg);
    if (n > cap)
        return SW_EMSGSIZE;
    *len = protobuf_c_message_pack((const ProtobufCMessage *)msg, buf);
    return SW_OK;
}

sw_err
swp_encode_alloc(const void *msg, size_t max, uint8_t **out, size_t *len)
{
    size_t n;
    uint8_t *b;
    if (msg == NULL || out == NULL || len == NULL)
        return SW_EINVAL;
    *out = NULL;
    n = swp_encoded_size(msg);
    if (n > max)
        return SW_EMSGSIZE;
    b = malloc(n ? n : 1);
    if (b == NULL)
        return SW_ENOMEM;
    *len = protobuf_c_message_pack((const ProtobufCMessage *)msg, b);
    *out = b;
    return SW_OK;
}

/* ---------------------------------------------------------------- hand encoding */

/* Protobuf wire tags: (field << 3) | wire type (0 varint, 2 length). */
enum {
    TAG_VERSION = (1 << 3) | 0,
    TAG_REQUEST_ID = (2 << 3) | 2,
    TAG_SEQ = (3 << 3) | 0,
    TAG_DATA = (4 << 3) | 2,
    TAG_DROPPABLE = (6 << 3) | 0,
    TAG_INSTANCE_ID = (9 << 3) | 2,
    TAG_RESENT = (10 << 3) | 0,
    TAG_CREDIT_WINDOW = (11 << 3) | 0,
    TAG_CREDIT_WINDOW_MAX = (14 << 3) | 0,
    TAG_CREDIT_BYTES = (16 << 3) | 0,
    TAG_BATCH = (12 << 3) | 2,
    TAG_EVENT = (13 << 3) | 2,
};

size_t
swp_varint_size(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

size_t
swp_varint_write(uint8_t *out, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        out[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    out[n++] = (uint8_t)v;
    return n;
}

size_t
swp_hdr_write(const swp_hdr *h, uint8_t *out)
{
    size_t n = 0;
    out[n++] = TAG_VERSION;
    out[n++] = SW_PROTOCOL_VERSION;
    out[n++] = TAG_REQUEST_ID;
    out[n++] = SW_REQUEST_ID_BYTES;
    memcpy(out + n, h->request_id, SW_REQUEST_ID_BYTES);
    n += SW_REQUEST_ID_BYTES;
    if (h->instance_id != NULL && h->instance_id[0] != '\0') {
        size_t l = strnlen(h->instance_id, SW_MAX_TOKEN);
        out[n++] = TAG_INSTANCE_ID;
        n += swp_varint_write(out + n, l);
        memcpy(out + n, h->instance_id, l);
        n += l;
    }
    if (h->resent) {
        out[n++] = TAG_RESENT;
        out[n++] = 1;
    }
    if (h->credit_window != 0) {
        out[n++] = TAG_CREDIT_WINDOW;
        n += swp_varint_write(out + n, h->credit_window);
    }
    if (h->credit_window_max != 0) {
        out[n++] = TAG_CREDIT_WINDOW_MAX;
        n += swp_varint_write(out + n, h->credit_window_max);
    }
    if (h->credit_bytes != 0) { /* field 16: a two-byte tag */
        n += swp_varint_write(out + n, TAG_CREDIT_BYTES);
        n += swp_varint_write(out + n, h->credit_bytes);
    }
    return n;
}

size_t
swp_data_body_size(uint64_t seq, size_t len, int droppable, size_t event_len)
{
    return 1 + swp_varint_size(seq) + 1 + swp_varint_size(len) + len + (droppable ? 2 : 0) +
           (event_len ? 2 + event_len : 0);
}

size_t
swp_data_body_write(uint8_t *out, uint64_t seq, const void *data, size_t len, int droppable,
                    const char *event, size_t event_len)
{
    size_t n = 0;
    out[n++] = TAG_SEQ;
    n += swp_varint_write(out + n, seq);
    out[n++] = TAG_DATA;
    n += swp_varint_write(out + n, len);
    if (len != 0)
        memcpy(out + n, data, len);
    n += len;
    if (droppable) {
        out[n++] = TAG_DROPPABLE;
        out[n++] = 1;
    }
    if (event_len != 0) { /* <= SW_MAX_EVENT: a one-byte length */
        out[n++] = TAG_EVENT;
        out[n++] = (uint8_t)event_len;
        memcpy(out + n, event, event_len);
        n += event_len;
    }
    return n;
}

sw_err
swp_final_body(uint64_t seq, const swp_terminal *t, size_t max, uint8_t *buf, size_t cap,
               uint8_t **out, size_t *len)
{
    swp_batched b = STREAMWIRE__V1__BATCHED_ITEM__INIT;
    size_t n;
    b.seq = seq;
    b.complete_final = 1;
    b.terminal = (swp_terminal *)t;
    *out = NULL;
    if ((n = swp_encoded_size(&b)) > max)
        return SW_EMSGSIZE;
    if (n <= cap) {
        *out = buf;
        return swp_encode(&b, buf, cap, len);
    }
    return swp_encode_alloc(&b, max, out, len);
}

sw_err
swp_final_body_alloc(uint64_t seq, const swp_terminal *t, size_t max, uint8_t **out, size_t *len)
{
    return swp_final_body(seq, t, max, NULL, 0, out, len);
}

size_t
swp_batch_prefix(uint8_t *out, size_t body_len)
{
    out[0] = TAG_BATCH;
    return 1 + swp_varint_write(out + 1, body_len);
}

/* HeartbeatBatch and StreamBeat tags, in protobuf-c's packing order (by
 * field number). */
enum {
    TAG_HB_VERSION = (1 << 3) | 0,
    TAG_HB_INSTANCE = (2 << 3) | 2,
    TAG_HB_BEAT = (3 << 3) | 2,
    TAG_HB_INCARNATION = (4 << 3) | 0,
    TAG_HB_COUNTER = (5 << 3) | 0,
    TAG_SB_REQUEST_ID = (1 << 3) | 2,
    TAG_SB_LAST_SEQ = (2 << 3) | 0,
};

_Static_assert(SW_MAX_TOKEN < 128 && SW_PROTOCOL_VERSION >= 1 && SW_PROTOCOL_VERSION < 128,
               "swp_beats_write writes the version and the instance's length in one byte");

size_t
swp_beats_write(uint8_t *out, const char *instance_id, uint64_t incarnation, uint64_t counter,
                const uint8_t (*ids)[SW_REQUEST_ID_BYTES], const uint64_t *last, size_t n)
{
    size_t k = 0, l = instance_id != NULL ? strnlen(instance_id, SW_MAX_TOKEN) : 0;
    out[k++] = TAG_HB_VERSION;
    out[k++] = SW_PROTOCOL_VERSION;
    if (l != 0) { /* a token: a one-byte length */
        out[k++] = TAG_HB_INSTANCE;
        out[k++] = (uint8_t)l;
        memcpy(out + k, instance_id, l);
        k += l;
    }
    for (size_t i = 0; i < n; i++) {
        uint8_t *beat = out + k;
        size_t b = 2;
        beat[b++] = TAG_SB_REQUEST_ID;
        beat[b++] = SW_REQUEST_ID_BYTES;
        memcpy(beat + b, ids[i], SW_REQUEST_ID_BYTES);
        b += SW_REQUEST_ID_BYTES;
        if (last[i] != 0) {
            beat[b++] = TAG_SB_LAST_SEQ;
            b += swp_varint_write(beat + b, last[i]);
        }
        beat[0] = TAG_HB_BEAT;
        beat[1] = (uint8_t)(b - 2); /* at most 29: one byte */
        k += b;
    }
    if (incarnation != 0) {
        out[k++] = TAG_HB_INCARNATION;
        k += swp_varint_write(out + k, incarnation);
    }
    if (counter != 0) {
        out[k++] = TAG_HB_COUNTER;
        k += swp_varint_write(out + k, counter);
    }
    return k;
}

/* ---------------------------------------------------------------- Request */

/* One walk serves both the size (out NULL: counting) and the writing, so
 * the two cannot disagree. protobuf-c's proto3 rules: fields in number
 * order, a scalar or bool only when not 0, a string only when not empty, a
 * bytes field only when not empty; a map entry is a sub-message with its
 * own such key and value. */
typedef struct pb_wr {
    uint8_t *out;
    size_t n;
} pb_wr;

static void
wr_varint(pb_wr *w, uint64_t v)
{
    w->n += w->out != NULL ? swp_varint_write(w->out + w->n, v) : swp_varint_size(v);
}

static void
wr_uint(pb_wr *w, uint32_t num, uint64_t v)
{
    if (v != 0) {
        wr_varint(w, (uint64_t)num << 3);
        wr_varint(w, v);
    }
}

static void
wr_bytes(pb_wr *w, uint32_t num, const void *p, size_t len)
{
    if (len != 0) {
        wr_varint(w, ((uint64_t)num << 3) | 2);
        wr_varint(w, len);
        if (w->out != NULL)
            memcpy(w->out + w->n, p, len);
        w->n += len;
    }
}

static void
wr_string(pb_wr *w, uint32_t num, const char *s)
{
    if (s != NULL)
        wr_bytes(w, num, s, strlen(s));
}

static void
wr_request(pb_wr *w, const swp_request *m)
{
    wr_uint(w, 1, m->version);
    wr_bytes(w, 2, m->request_id.data, m->request_id.len);
    wr_string(w, 3, m->response_subject);
    wr_string(w, 4, m->router_id);
    wr_bytes(w, 5, m->payload.data, m->payload.len);
    wr_uint(w, 6, m->credit_window);
    wr_uint(w, 7, m->heartbeat_ms);
    wr_uint(w, 8, m->deadline_ms);
    wr_string(w, 9, m->endpoint);
    wr_uint(w, 10, m->max_tokens);
    for (size_t i = 0; i < m->n_headers; i++) {
        pb_wr e = {NULL, 0};
        wr_string(&e, 1, m->headers[i]->key);
        wr_string(&e, 2, m->headers[i]->value);
        wr_varint(w, (11 << 3) | 2); /* (an empty entry is still written) */
        wr_varint(w, e.n);
        wr_string(w, 1, m->headers[i]->key);
        wr_string(w, 2, m->headers[i]->value);
    }
    wr_uint(w, 12, m->resume_from_seq);
    wr_uint(w, 13, m->migratable ? 1 : 0);
    wr_uint(w, 14, m->issued_unix_ms);
    wr_bytes(w, 16, m->auth_token.data, m->auth_token.len);
    wr_uint(w, 17, m->credit_window_max);
    wr_uint(w, 18, m->credit_bytes);
    wr_uint(w, 19, m->idle_heartbeat_ms);
}

sw_err
swp_request_encode_alloc(const swp_request *m, size_t max, uint8_t **out, size_t *len)
{
    pb_wr w = {NULL, 0};
    if (m == NULL || out == NULL || len == NULL || m->sealed != NULL ||
        m->base.n_unknown_fields != 0)
        return SW_EINVAL;
    *out = NULL;
    wr_request(&w, m);
    if (w.n > max)
        return SW_EMSGSIZE;
    if ((w.out = malloc(w.n ? w.n : 1)) == NULL)
        return SW_ENOMEM;
    *len = w.n;
    w.n = 0;
    wr_request(&w, m);
    *out = w.out;
    return SW_OK;
}
