/* proto/codec.c -- see sw_codec.h. */
#include <stdlib.h>
#include <string.h>

#include "common/sw_common.h"
#include "proto/sw_codec.h"

int
swp_valid_subject(const char *s)
{
    size_t n = 0, tok = 0;
    if (s == NULL || *s == '\0')
        return 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++, n++) {
        if (n >= SWP_MAX_SUBJECT)
            return 0;
        if (*p == '.') {
            if (tok == 0)
                return 0;
            tok = 0;
            continue;
        }
        if (*p <= ' ' || *p == 0x7f || *p == '*' || *p == '>')
            return 0;
        tok++;
    }
    return tok > 0;
}

/* 1 if m or a sub-message holds an unknown field numbered 0. protobuf-c 1.4
 * rejects field 0 in a one-byte tag but keeps it when the tag varint is
 * padded (0x82 0x00); such a message would not survive re-encoding. */
static int
swp_has_field0(const ProtobufCMessage *m)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    const char *base = (const char *)m;
    for (unsigned i = 0; i < m->n_unknown_fields; i++)
        if (m->unknown_fields[i].tag == 0)
            return 1;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(const void *)(base + f->quantifier_offset);
            ProtobufCMessage *const *v =
                *(ProtobufCMessage *const *const *)(const void *)(base + f->offset);
            for (size_t j = 0; j < n; j++)
                if (v[j] != NULL && swp_has_field0(v[j]))
                    return 1;
        } else {
            const ProtobufCMessage *sub;
            if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
                *(const uint32_t *)(const void *)(base + f->quantifier_offset) != f->id)
                continue;
            sub = *(ProtobufCMessage *const *)(const void *)(base + f->offset);
            if (sub != NULL && swp_has_field0(sub))
                return 1;
        }
    }
    return 0;
}

/* Reads a varint at p[*i] (advancing *i). 0 ok, -1 truncated or longer
 * than 64 bits. */
static int
swp_read_varint(const uint8_t *p, size_t len, size_t *i, uint64_t *v)
{
    unsigned sh = 0;
    *v = 0;
    do {
        if (*i >= len || sh > 63)
            return -1;
        *v |= (uint64_t)(p[*i] & 0x7f) << sh;
        sh += 7;
    } while (p[(*i)++] & 0x80);
    return 0;
}

/* Counts the top-level length-delimited entries of `field` in a message's
 * bytes without unpacking; stops early past `cap`. Bytes that do not walk
 * are left to protobuf-c to reject. Returns 1 if over the cap. */
static int
swp_field_over_cap(const uint8_t *p, size_t len, uint64_t field, size_t cap)
{
    size_t i = 0, n = 0;
    while (i < len) {
        uint64_t tag, v;
        if (swp_read_varint(p, len, &i, &tag) != 0)
            return 0;
        switch (tag & 7) {
        case 0:
            if (swp_read_varint(p, len, &i, &v) != 0)
                return 0;
            break;
        case 1:
            i += 8;
            break;
        case 5:
            i += 4;
            break;
        case 2:
            if (swp_read_varint(p, len, &i, &v) != 0 || v > len - i)
                return 0;
            i += (size_t)v;
            if ((tag >> 3) == field && ++n > cap)
                return 1;
            break;
        default:
            return 0;
        }
    }
    return 0;
}

/* A wrapper's `batch` (field 12) beyond SWP_MAX_BATCH. */
static int
swp_batch_over_cap(const uint8_t *p, size_t len)
{
    return swp_field_over_cap(p, len, 12, SWP_MAX_BATCH);
}

/* A HeartbeatBatch's `beats` (field 3) beyond SWP_MAX_BEATS. */
static int
swp_beats_over_cap(const uint8_t *p, size_t len)
{
    return swp_field_over_cap(p, len, 3, SWP_MAX_BEATS);
}

/* Unpacks with the length cap and the message's precheck (NULL: none; 1
 * refuses the raw bytes) applied first. */
static sw_err
swp_unpack(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len, size_t max,
           int (*precheck)(const uint8_t *, size_t), ProtobufCAllocator *alloc,
           ProtobufCMessage **out)
{
    *out = NULL;
    if (buf == NULL && len != 0)
        return SW_EINVAL;
    if (len > max)
        return SW_EMSGSIZE;
    if (precheck != NULL && precheck(buf, len))
        return SW_EPROTO;
    *out = protobuf_c_message_unpack(d, alloc, len, buf);
    if (*out != NULL && swp_has_field0(*out)) {
        protobuf_c_message_free_unpacked(*out, alloc);
        *out = NULL;
    }
    return *out ? SW_OK : SW_EPROTO;
}

#define SWP_DECODE(fn, type, desc, precheck, validate)                                  \
    sw_err fn(const uint8_t *buf, size_t len, size_t max, type **out)                   \
    {                                                                                   \
        ProtobufCMessage *m;                                                            \
        sw_err rv;                                                                      \
        if (out == NULL)                                                                \
            return SW_EINVAL;                                                           \
        *out = NULL;                                                                    \
        if ((rv = swp_unpack(&desc, buf, len, max, precheck, NULL, &m)) != SW_OK)       \
            return rv;                                                                  \
        if ((rv = validate((type *)m)) != SW_OK) {                                      \
            protobuf_c_message_free_unpacked(m, NULL);                                  \
            return rv;                                                                  \
        }                                                                               \
        *out = (type *)m;                                                               \
        return SW_OK;                                                                   \
    }

static int
swp_id_ok(ProtobufCBinaryData id)
{
    return id.len == SW_REQUEST_ID_BYTES;
}

static sw_err
swp_check_request(swp_request *m)
{
    if (m->version != SW_PROTOCOL_VERSION)
        return SW_EVERSION;
    if (!swp_id_ok(m->request_id) || !swp_valid_subject(m->response_subject) ||
        sw_validate_token(m->router_id) != SW_OK)
        return SW_EPROTO;
    if (m->endpoint[0] != '\0' && sw_validate_endpoint(m->endpoint) != SW_OK)
        return SW_EPROTO;
    if (m->credit_window > SWP_MAX_WINDOW || m->heartbeat_ms > SWP_MAX_HEARTBEAT_MS)
        return SW_EPROTO;
    return SW_OK;
}

static sw_err
swp_check_terminal(const swp_terminal *t)
{
    if (t == NULL)
        return SW_EPROTO;
    switch (t->status) {
    case STREAMWIRE__V1__STATUS__STATUS_COMPLETED:
    case STREAMWIRE__V1__STATUS__STATUS_INCOMPLETE:
    case STREAMWIRE__V1__STATUS__STATUS_CANCELLED:
        return SW_OK;
    case STREAMWIRE__V1__STATUS__STATUS_FAILED:
        if (t->error == NULL)
            return SW_EPROTO;
        if (t->error->sw_code == 0 && !swi_valid_code(t->error->app_code))
            return SW_EPROTO;
        return SW_OK;
    default:
        return SW_EPROTO;
    }
}

/* A batch: the wrapper is a data item, the batched items follow it in
 * strictly increasing seq, and a final may only come last. */
static sw_err
swp_check_batch(const swp_item *m)
{
    uint64_t prev = m->seq;
    if (m->complete_final || m->body_case != STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_DATA)
        return SW_EPROTO;
    for (size_t i = 0; i < m->n_batch; i++) {
        const swp_batched *b = m->batch[i];
        if (b->seq <= prev)
            return SW_EPROTO;
        prev = b->seq;
        if (b->complete_final) {
            if (i + 1 != m->n_batch || b->data.len != 0)
                return SW_EPROTO;
            if (swp_check_terminal(b->terminal) != SW_OK)
                return SW_EPROTO;
        } else if (b->terminal != NULL) {
            return SW_EPROTO;
        }
    }
    return SW_OK;
}

static sw_err
swp_check_item(swp_item *m)
{
    if (m->version != SW_PROTOCOL_VERSION)
        return SW_EVERSION;
    if (!swp_id_ok(m->request_id))
        return SW_EPROTO;
    if (m->n_batch != 0 && swp_check_batch(m) != SW_OK)
        return SW_EPROTO;
    if (m->complete_final) {
        if (m->seq == 0 || m->body_case == STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_HEARTBEAT)
            return SW_EPROTO;
        return swp_check_terminal(m->terminal);
    }
    switch (m->body_case) {
    case STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_DATA:
        return m->seq != 0 ? SW_OK : SW_EPROTO;
    case STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_HEARTBEAT:
        return m->seq == 0 ? SW_OK : SW_EPROTO;
    default:
        return SW_EPROTO;
    }
}

static sw_err
swp_check_control(swp_control *m)
{
    if (m->version != SW_PROTOCOL_VERSION)
        return SW_EVERSION;
    switch (m->kind) {
    case STREAMWIRE__V1__CONTROL_KIND__CONTROL_PROBE:
        if (m->request_id.len != 0 && !swp_id_ok(m->request_id))
            return SW_EPROTO;
        return SW_OK;
    case STREAMWIRE__V1__CONTROL_KIND__CONTROL_RESEND:
        if (!swp_id_ok(m->request_id) || m->resend_from == 0 || m->resend_to < m->resend_from ||
            m->resend_to - m->resend_from >= SWP_MAX_WINDOW)
            return SW_EPROTO;
        return SW_OK;
    case STREAMWIRE__V1__CONTROL_KIND__CONTROL_ACK_FINALS:
        if (m->request_id.len != 0 || m->n_final_acks == 0 ||
            m->n_final_acks > SWP_MAX_FINAL_ACKS)
            return SW_EPROTO;
        for (size_t i = 0; i < m->n_final_acks; i++)
            if (!swp_id_ok(m->final_acks[i]))
                return SW_EPROTO;
        return SW_OK;
    case STREAMWIRE__V1__CONTROL_KIND__CONTROL_CANCEL:
    case STREAMWIRE__V1__CONTROL_KIND__CONTROL_KILL:
    case STREAMWIRE__V1__CONTROL_KIND__CONTROL_CREDIT:
        return swp_id_ok(m->request_id) ? SW_OK : SW_EPROTO;
    default:
        return SW_EPROTO;
    }
}

static sw_err
swp_check_probe_reply(swp_probe_reply *m)
{
    if (m->version != SW_PROTOCOL_VERSION)
        return SW_EVERSION;
    return sw_validate_token(m->instance_id) == SW_OK ? SW_OK : SW_EPROTO;
}

static sw_err
swp_check_instance(swp_instance *m)
{
    if (m->version != SW_PROTOCOL_VERSION)
        return SW_EVERSION;
    if (sw_validate_token(m->instance_id) != SW_OK || sw_validate_endpoint(m->endpoint) != SW_OK ||
        !swp_valid_subject(m->request_subject) || !swp_valid_subject(m->control_subject))
        return SW_EPROTO;
    return SW_OK;
}

static sw_err
swp_check_beats(swp_beats *m)
{
    if (m->version != SW_PROTOCOL_VERSION)
        return SW_EVERSION;
    if (sw_validate_token(m->instance_id) != SW_OK || m->n_beats == 0 ||
        m->n_beats > SWP_MAX_BEATS)
        return SW_EPROTO;
    for (size_t i = 0; i < m->n_beats; i++)
        if (!swp_id_ok(m->beats[i]->request_id))
            return SW_EPROTO;
    return SW_OK;
}

SWP_DECODE(swp_decode_request, swp_request, streamwire__v1__request__descriptor, NULL,
           swp_check_request)
SWP_DECODE(swp_decode_item, swp_item, streamwire__v1__stream_item_wrapper__descriptor,
           swp_batch_over_cap, swp_check_item)
SWP_DECODE(swp_decode_control, swp_control, streamwire__v1__control__descriptor, NULL,
           swp_check_control)
SWP_DECODE(swp_decode_probe_reply, swp_probe_reply, streamwire__v1__probe_reply__descriptor,
           NULL, swp_check_probe_reply)
SWP_DECODE(swp_decode_instance, swp_instance, streamwire__v1__instance_info__descriptor,
           NULL, swp_check_instance)
SWP_DECODE(swp_decode_beats, swp_beats, streamwire__v1__heartbeat_batch__descriptor,
           swp_beats_over_cap, swp_check_beats)

static void *
swp_arena_alloc(void *data, size_t size)
{
    swp_arena *a = data;
    size_t at = (a->used + 15) & ~(size_t)15;
    if (size <= SWP_ARENA_BYTES && at <= SWP_ARENA_BYTES - size) {
        a->used = at + size;
        return a->buf + at;
    }
    return malloc(size);
}

static void
swp_arena_free(void *data, void *p)
{
    swp_arena *a = data;
    if ((uint8_t *)p >= a->buf && (uint8_t *)p < a->buf + SWP_ARENA_BYTES)
        return; /* the whole arena goes at once */
    free(p);
}

sw_err
swp_decode_item_arena(const uint8_t *buf, size_t len, size_t max, swp_arena *a, swp_item **out)
{
    ProtobufCMessage *m;
    sw_err rv;
    if (out == NULL || a == NULL)
        return SW_EINVAL;
    *out = NULL;
    a->used = 0;
    a->alloc.alloc = swp_arena_alloc;
    a->alloc.free = swp_arena_free;
    a->alloc.allocator_data = a;
    if ((rv = swp_unpack(&streamwire__v1__stream_item_wrapper__descriptor, buf, len, max,
                         swp_batch_over_cap, &a->alloc, &m)) != SW_OK)
        return rv;
    if ((rv = swp_check_item((swp_item *)m)) != SW_OK) {
        protobuf_c_message_free_unpacked(m, &a->alloc);
        return rv;
    }
    *out = (swp_item *)m;
    return SW_OK;
}

void
swp_free_arena(void *msg, swp_arena *a)
{
    if (msg != NULL)
        protobuf_c_message_free_unpacked((ProtobufCMessage *)msg, &a->alloc);
}

void
swp_free(void *msg)
{
    if (msg != NULL)
        protobuf_c_message_free_unpacked((ProtobufCMessage *)msg, NULL);
}

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
    TAG_BATCH = (12 << 3) | 2,
};

static size_t
varint_size(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static size_t
varint_write(uint8_t *out, uint64_t v)
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
        n += varint_write(out + n, l);
        memcpy(out + n, h->instance_id, l);
        n += l;
    }
    if (h->resent) {
        out[n++] = TAG_RESENT;
        out[n++] = 1;
    }
    if (h->credit_window != 0) {
        out[n++] = TAG_CREDIT_WINDOW;
        n += varint_write(out + n, h->credit_window);
    }
    return n;
}

size_t
swp_data_body_size(uint64_t seq, size_t len, int droppable)
{
    return 1 + varint_size(seq) + 1 + varint_size(len) + len + (droppable ? 2 : 0);
}

size_t
swp_data_body_write(uint8_t *out, uint64_t seq, const void *data, size_t len, int droppable)
{
    size_t n = 0;
    out[n++] = TAG_SEQ;
    n += varint_write(out + n, seq);
    out[n++] = TAG_DATA;
    n += varint_write(out + n, len);
    if (len != 0)
        memcpy(out + n, data, len);
    n += len;
    if (droppable) {
        out[n++] = TAG_DROPPABLE;
        out[n++] = 1;
    }
    return n;
}

sw_err
swp_final_body_alloc(uint64_t seq, const swp_terminal *t, size_t max, uint8_t **out, size_t *len)
{
    swp_batched b = STREAMWIRE__V1__BATCHED_ITEM__INIT;
    b.seq = seq;
    b.complete_final = 1;
    b.terminal = (swp_terminal *)t;
    return swp_encode_alloc(&b, max, out, len);
}

size_t
swp_batch_prefix(uint8_t *out, size_t body_len)
{
    out[0] = TAG_BATCH;
    return 1 + varint_write(out + 1, body_len);
}
