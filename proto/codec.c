/* proto/codec.c -- see sw_codec.h. */
#include <stdlib.h>
#include <string.h>

#include "common/sw_common.h"
#include "proto/codec_int.h"
#include "proto/sw_codec.h"

/* What a byte is in a subject: 0 never (space, control, DEL, '*', '>'), 2
 * the token separator '.', 1 any other (UTF-8 bytes too). A table: every
 * request's response subject is checked. */
static const unsigned char swp_subject_byte[256] = {
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
};

int
swp_valid_subject(const char *s)
{
    size_t n = 0, tok = 0;
    if (s == NULL || *s == '\0')
        return 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++, n++) {
        unsigned char k = swp_subject_byte[*p];
        if (n >= SWP_MAX_SUBJECT || k == 0)
            return 0;
        if (k == 2) {
            if (tok == 0)
                return 0;
            tok = 0;
        } else {
            tok++;
        }
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

/* ---- The allocation bound, checked on the raw bytes before unpacking.
 *
 * protobuf-c allocates a struct per unknown field, per repeated entry and
 * per sub-message, so a hostile message of 2-byte fields would cost 16-27x
 * its size in heap. swp_walk reads the bytes with the message's descriptor
 * (no allocation) and estimates what protobuf_c_message_unpack will
 * allocate, counting each allocation with malloc's overhead; it refuses
 * (SW_EPROTO) a message that:
 *   - has more than SWP_MAX_UNKNOWN unknown fields in one (sub-)message;
 *   - has more entries in a repeated field than its cap (swp_repeated_cap);
 *   - nests deeper than SWP_MAX_DEPTH;
 *   - would allocate more than SWP_ALLOC_FACTOR x its size + SWP_ALLOC_SLACK.
 * Bytes the walk cannot parse are left to protobuf-c to reject. */
#define SWP_MALLOC_OVERHEAD 16
#define SWP_MAX_DEPTH 8
#define SWP_MAX_COPIES 4   /* occurrences of one non-repeated field */
#define SWP_SCAN_RECORD 32 /* sizeof protobuf-c's ScannedMember */

typedef struct swp_walk_st {
    size_t cost;
    int refuse;
} swp_walk_st;

/* Most entries a repeated field may have (SW_PROTOCOL_VERSION 1). */
static size_t
swp_repeated_cap(const ProtobufCMessageDescriptor *d, const ProtobufCFieldDescriptor *f)
{
    if (d == &streamwire__v1__stream_item_wrapper__descriptor)
        return SWP_MAX_BATCH;
    if (d == &streamwire__v1__heartbeat_batch__descriptor)
        return SWP_MAX_BEATS;
    if (d == &streamwire__v1__control__descriptor)
        return SWP_MAX_FINAL_ACKS;
    return SWP_MAX_HEADERS; /* Request.headers, InstanceInfo.labels */
}

static size_t
swp_repeated_elem(const ProtobufCFieldDescriptor *f)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(void *);
    default:
        return 8;
    }
}

/* protobuf_c_message_descriptor_get_field without the library call and its
 * binary search: our messages have one or two ranges of field numbers, and
 * this runs for every field of every message received. */
static inline const ProtobufCFieldDescriptor *
swp_field(const ProtobufCMessageDescriptor *d, uint64_t id)
{
    const ProtobufCIntRange *r = d->field_ranges;
    for (unsigned k = 0; k < d->n_field_ranges; k++) {
        uint64_t start = (uint64_t)(int64_t)r[k].start_value;
        uint64_t n = r[k + 1].orig_index - r[k].orig_index;
        if (id >= start && id - start < n)
            return &d->fields[r[k].orig_index + (id - start)];
    }
    return NULL;
}

static void
swp_walk(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t len, int depth,
         swp_walk_st *w)
{
    size_t i = 0, unknown = 0, fields = 0;
    uint16_t counts[32] = {0}; /* occurrences per field, by field index (caps < 65535) */
    if (depth > SWP_MAX_DEPTH) {
        w->refuse = 1;
        return;
    }
    w->cost += d->sizeof_message + SWP_MALLOC_OVERHEAD;
    while (i < len && !w->refuse) {
        uint64_t tag, v = 0;
        size_t start, after_tag, flen = 0;
        const ProtobufCFieldDescriptor *f;
        if (swp_read_varint(p, len, &i, &tag) != 0)
            return;
        start = after_tag = i;
        switch (tag & 7) {
        case 0:
            if (swp_read_varint(p, len, &i, &v) != 0)
                return;
            break;
        case 1:
            i += 8;
            break;
        case 5:
            i += 4;
            break;
        case 2:
            if (swp_read_varint(p, len, &i, &v) != 0 || v > len - i)
                return;
            start = i;
            flen = (size_t)v;
            i += flen;
            break;
        default:
            return; /* groups: protobuf-c rejects them */
        }
        if (i > len)
            return;
        fields++;
        f = swp_field(d, tag >> 3);
        if (f == NULL) {
            if (++unknown > SWP_MAX_UNKNOWN) {
                w->refuse = 1;
                return;
            }
            /* one array of them, and a copy of each one's bytes after its tag */
            w->cost += sizeof(ProtobufCMessageUnknownField) + (i - after_tag) + SWP_MALLOC_OVERHEAD;
            if (unknown == 1)
                w->cost += SWP_MALLOC_OVERHEAD;
            continue;
        }
        {
            size_t k = (size_t)(f - d->fields);
            if (k >= 32) {
                w->refuse = 1;
                return;
            }
            counts[k]++;
            if (f->label != PROTOBUF_C_LABEL_REPEATED) {
                /* Our encoders write a field once (protobuf lets a later
                 * copy win); a hostile message repeating one costs a scan
                 * record per copy. */
                if (counts[k] > SWP_MAX_COPIES) {
                    w->refuse = 1;
                    return;
                }
            } else {
                if (counts[k] > swp_repeated_cap(d, f)) {
                    w->refuse = 1;
                    return;
                }
                w->cost += swp_repeated_elem(f);
                if (counts[k] == 1)
                    w->cost += SWP_MALLOC_OVERHEAD; /* the array */
            }
        }
        if ((tag & 7) != 2)
            continue;
        switch (f->type) {
        case PROTOBUF_C_TYPE_STRING:
            w->cost += flen + 1 + SWP_MALLOC_OVERHEAD;
            break;
        case PROTOBUF_C_TYPE_BYTES:
            w->cost += flen + SWP_MALLOC_OVERHEAD;
            break;
        case PROTOBUF_C_TYPE_MESSAGE:
            swp_walk((const ProtobufCMessageDescriptor *)f->descriptor, p + start, flen, depth + 1,
                     w);
            break;
        default: /* packed repeated scalars: at most 8 bytes each per byte of input */
            w->cost += 8 * flen;
            break;
        }
    }
    /* protobuf-c scans fields into a 16-entry record array on the stack,
     * then into heap slabs of 32, 64, 128... records of 32 bytes each. */
    for (size_t have = 16, slab = 32; have < fields; have += slab, slab *= 2)
        w->cost += slab * SWP_SCAN_RECORD + SWP_MALLOC_OVERHEAD;
}

/* SW_OK, or SW_EPROTO if unpacking buf could allocate beyond the bound. */
sw_err
swp_precheck(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len)
{
    swp_walk_st w = {0, 0};
    swp_walk(d, buf, len, 0, &w);
    if (w.refuse || w.cost > SWP_ALLOC_FACTOR * len + SWP_ALLOC_SLACK)
        return SW_EPROTO;
    return SW_OK;
}

size_t
swp_alloc_estimate(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len)
{
    swp_walk_st w = {0, 0};
    swp_walk(d, buf, len, 0, &w);
    return w.refuse ? SIZE_MAX : w.cost;
}

/* Unpacks with the length cap and the allocation bound applied first. */
sw_err
swp_unpack(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len, size_t max,
           ProtobufCAllocator *alloc, ProtobufCMessage **out)
{
    *out = NULL;
    if (buf == NULL && len != 0)
        return SW_EINVAL;
    if (len > max)
        return SW_EMSGSIZE;
    if (swp_precheck(d, buf, len) != SW_OK)
        return SW_EPROTO;
    *out = protobuf_c_message_unpack(d, alloc, len, buf);
    if (*out != NULL && swp_has_field0(*out)) {
        protobuf_c_message_free_unpacked(*out, alloc);
        *out = NULL;
    }
    return *out ? SW_OK : SW_EPROTO;
}

#define SWP_DECODE(fn, type, desc, validate)                            \
    sw_err fn(const uint8_t *buf, size_t len, size_t max, type **out)   \
    {                                                                   \
        ProtobufCMessage *m;                                            \
        sw_err rv;                                                      \
        if (out == NULL)                                                \
            return SW_EINVAL;                                           \
        *out = NULL;                                                    \
        if ((rv = swp_unpack(&desc, buf, len, max, NULL, &m)) != SW_OK) \
            return rv;                                                  \
        if ((rv = validate((type *)m)) != SW_OK) {                      \
            protobuf_c_message_free_unpacked(m, NULL);                  \
            return rv;                                                  \
        }                                                               \
        *out = (type *)m;                                               \
        return SW_OK;                                                   \
    }

static int
swp_id_ok(ProtobufCBinaryData id)
{
    return id.len == SW_REQUEST_ID_BYTES;
}

sw_err
swp_check_request(swp_request *m)
{
    if (m->version != SW_PROTOCOL_VERSION)
        return SW_EVERSION;
    if (!swp_id_ok(m->request_id) || !swp_valid_subject(m->response_subject) ||
        sw_validate_token(m->router_id) != SW_OK)
        return SW_EPROTO;
    if (m->endpoint[0] != '\0' && sw_validate_endpoint(m->endpoint) != SW_OK)
        return SW_EPROTO;
    if (m->credit_window > SWP_MAX_WINDOW || m->credit_window_max > SWP_MAX_WINDOW ||
        m->heartbeat_ms > SWP_MAX_HEARTBEAT_MS || m->idle_heartbeat_ms > SWP_MAX_HEARTBEAT_MS)
        return SW_EPROTO;
    if (m->n_headers > SWP_MAX_HEADERS)
        return SW_EPROTO;
    for (size_t i = 0; i < m->n_headers; i++)
        if (m->headers[i]->key == NULL || strlen(m->headers[i]->key) > SWP_MAX_HEADER_KEY ||
            m->headers[i]->value == NULL || strlen(m->headers[i]->value) > SWP_MAX_HEADER_VALUE)
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

int
swp_valid_event(const char *s, size_t n)
{
    if (n == 0 || n > SW_MAX_EVENT)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == ':' || c == '-'))
            return 0;
    }
    return 1;
}

/* A decoded event field: protobuf-c gives "" when absent. */
static int
swp_event_ok(const char *e)
{
    size_t n;
    if (e == NULL || e[0] == '\0')
        return 1;
    n = strnlen(e, SW_MAX_EVENT + 1);
    return swp_valid_event(e, n);
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
        if (!swp_event_ok(b->event))
            return SW_EPROTO;
        if (b->complete_final) {
            if (i + 1 != m->n_batch || b->data.len != 0 || b->event[0] != '\0')
                return SW_EPROTO;
            if (swp_check_terminal(b->terminal) != SW_OK)
                return SW_EPROTO;
        } else if (b->terminal != NULL) {
            return SW_EPROTO;
        }
    }
    return SW_OK;
}

sw_err
swp_check_item(swp_item *m)
{
    if (m->version != SW_PROTOCOL_VERSION)
        return SW_EVERSION;
    if (!swp_id_ok(m->request_id))
        return SW_EPROTO;
    if (m->n_batch != 0 && swp_check_batch(m) != SW_OK)
        return SW_EPROTO;
    if (!swp_event_ok(m->event))
        return SW_EPROTO;
    if (m->event[0] != '\0' &&
        (m->complete_final || m->body_case != STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_DATA))
        return SW_EPROTO; /* only a data item is typed */
    if (m->complete_final) {
        if (m->seq == 0 || m->body_case == STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_HEARTBEAT)
            return SW_EPROTO;
        /* A final carries no data, alone as in a batch (swp_check_batch):
         * the frontend takes only its terminal, and would drop the data. */
        if (m->body_case == STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_DATA && m->data.len != 0)
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
        if (m->request_id.len != 0 || m->n_final_acks == 0 || m->n_final_acks > SWP_MAX_FINAL_ACKS)
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

SWP_DECODE(swp_decode_request, swp_request, streamwire__v1__request__descriptor, swp_check_request)
SWP_DECODE(swp_decode_item, swp_item, streamwire__v1__stream_item_wrapper__descriptor,
           swp_check_item)
SWP_DECODE(swp_decode_control, swp_control, streamwire__v1__control__descriptor, swp_check_control)
SWP_DECODE(swp_decode_probe_reply, swp_probe_reply, streamwire__v1__probe_reply__descriptor,
           swp_check_probe_reply)
SWP_DECODE(swp_decode_instance, swp_instance, streamwire__v1__instance_info__descriptor,
           swp_check_instance)
/* swp_decode_beats: proto/beats.c, by hand. */

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

/* Through protobuf-c into the arena a (its allocator), then check. */
static sw_err
swp_decode_pbc_arena(const ProtobufCMessageDescriptor *d, sw_err (*check)(void *),
                     const uint8_t *buf, size_t len, size_t max, swp_arena *a, void **out)
{
    ProtobufCMessage *m;
    sw_err rv;
    a->used = 0;
    a->block = NULL;
    a->hand = 0;
    a->alloc.alloc = swp_arena_alloc;
    a->alloc.free = swp_arena_free;
    a->alloc.allocator_data = a;
    if ((rv = swp_unpack(d, buf, len, max, &a->alloc, &m)) != SW_OK)
        return rv;
    if ((rv = check(m)) != SW_OK) {
        protobuf_c_message_free_unpacked(m, &a->alloc);
        return rv;
    }
    *out = m;
    return SW_OK;
}

static sw_err
swp_check_item_v(void *m)
{
    return swp_check_item(m);
}

static sw_err
swp_check_request_v(void *m)
{
    return swp_check_request(m);
}

sw_err
swp_decode_item_pbc(const uint8_t *buf, size_t len, size_t max, swp_arena *a, swp_item **out)
{
    return swp_decode_pbc_arena(&streamwire__v1__stream_item_wrapper__descriptor, swp_check_item_v,
                                buf, len, max, a, (void **)out);
}

sw_err
swp_decode_request_pbc(const uint8_t *buf, size_t len, size_t max, swp_arena *a, swp_request **out)
{
    return swp_decode_pbc_arena(&streamwire__v1__request__descriptor, swp_check_request_v, buf, len,
                                max, a, (void **)out);
}

void
swp_free_arena(void *msg, swp_arena *a)
{
    if (msg == NULL)
        return;
    if (a->hand) /* proto/items.c: the arena, or one block */
        free(a->block);
    else
        protobuf_c_message_free_unpacked((ProtobufCMessage *)msg, &a->alloc);
}

void
swp_free(void *msg)
{
    if (msg == NULL)
        return;
    if (((ProtobufCMessage *)msg)->descriptor == &streamwire__v1__heartbeat_batch__descriptor)
        free(msg); /* swp_decode_beats: one block */
    else
        protobuf_c_message_free_unpacked((ProtobufCMessage *)msg, NULL);
}

uint64_t
swp_probe_reply_id(const uint8_t *buf, size_t len)
{
    swp_probe_reply *p = NULL;
    uint64_t id = 0;
    if (swp_decode_probe_reply(buf, len, SWP_MAX_PROBE_REPLY, &p) == SW_OK)
        id = p->probe_id;
    swp_free(p);
    return id;
}
