/* proto/items.c -- the decoders of the two hot paths, by hand (issue 17,
 * "decode in place"): the StreamItemWrapper (the frontend's every message)
 * and the Request (the worker's every stream; swp_decode_request_arena,
 * at the end, on the same tables and passes).
 *
 * protobuf-c copies every `bytes` field: a batch of 1 KiB items cost a
 * malloc and a memcpy per item, plus the allocation-bound walk over the
 * bytes before it (codec.c). This decoder reads a message in the form our
 * encoders write, the canonical form:
 *
 *   - every field known, with its declared wire type, and not field 15
 *     (`sealed`: the transport opens seals before anything decodes);
 *   - every non-repeated field at most once, and not both members of the
 *     `body` oneof; `batch` at most SWP_MAX_BATCH entries;
 *   - the same for every sub-message (Heartbeat, Terminal, Error,
 *     BatchedItem),
 *
 * and builds the same swp_item protobuf-c would, in the caller's arena or
 * one malloc'd block, with the `bytes` fields (request_id, data) pointing
 * into the input. Strings are copied (protobuf-c's are NUL-terminated).
 * Anything else -- unknown fields, repeated copies, wrong wire types, bytes
 * that do not parse -- goes to the protobuf-c path (swp_decode_item_pbc),
 * which decides it as swp_decode_item does. So the result is
 * swp_decode_item's, error for error and value for value: the fuzz body
 * (tests/fuzz/fuzz_decode.c, check_item_arena) compares the two on every
 * input.
 *
 * The allocation bound: a canonical message has at most SWP_MAX_BATCH
 * entries, each field at most once, and the entries' scan records are
 * capped with them, so what protobuf-c would allocate for it beyond its own
 * bytes (the estimate in codec.c) is bounded by a constant: under 56 KiB,
 * within SWP_ALLOC_FACTOR x len + SWP_ALLOC_SLACK (test_codec_hand builds
 * the densest valid such message: 49 KB for 2.2 KB). When the checks fail,
 * the walk decides between its SW_EPROTO and the check's
 * answer, in swp_decode_item's order. */
#include <stdlib.h>
#include <string.h>

#include "proto/codec_int.h"
#include "proto/pb_read.h"
#include "proto/sw_codec.h"

/* What a field is, by message kind and field number. */
enum { F_NONE, F_VARINT, F_BYTES, F_STRING, F_MSG, F_REPEATED };
enum { K_ITEM, K_BATCHED, K_TERMINAL, K_ERROR, K_HEARTBEAT, K_REQUEST, K_HEADER, K_COUNT };

typedef struct it_field {
    uint8_t type;
    uint8_t sub; /* F_MSG, F_REPEATED: the kind */
} it_field;

#define IT_MAX_FIELD 19
static const it_field it_fields[K_COUNT][IT_MAX_FIELD + 1] =
    {
        [K_ITEM] =
            {
                [1] = {F_VARINT, 0},            /* version */
                [2] = {F_BYTES, 0},             /* request_id */
                [3] = {F_VARINT, 0},            /* seq */
                [4] = {F_BYTES, 0},             /* data (oneof body) */
                [5] = {F_MSG, K_HEARTBEAT},     /* heartbeat (oneof body) */
                [6] = {F_VARINT, 0},            /* droppable */
                [7] = {F_VARINT, 0},            /* complete_final */
                [8] = {F_MSG, K_TERMINAL},      /* terminal */
                [9] = {F_STRING, 0},            /* instance_id */
                [10] = {F_VARINT, 0},           /* resent */
                [11] = {F_VARINT, 0},           /* credit_window */
                [12] = {F_REPEATED, K_BATCHED}, /* batch */
                [13] = {F_STRING, 0},           /* event */
                [14] = {F_VARINT, 0},           /* credit_window_max */
                [16] = {F_VARINT, 0},           /* credit_bytes (15, sealed: never canonical) */
            },
        [K_BATCHED] =
            {
                [3] = {F_VARINT, 0},       /* seq */
                [4] = {F_BYTES, 0},        /* data */
                [6] = {F_VARINT, 0},       /* droppable */
                [7] = {F_VARINT, 0},       /* complete_final */
                [8] = {F_MSG, K_TERMINAL}, /* terminal */
                [13] = {F_STRING, 0},      /* event */
            },
        [K_TERMINAL] =
            {
                [1] = {F_VARINT, 0},    /* status */
                [2] = {F_STRING, 0},    /* finish_reason */
                [3] = {F_MSG, K_ERROR}, /* error */
            },
        [K_ERROR] =
            {
                [1] = {F_VARINT, 0}, /* sw_code */
                [2] = {F_STRING, 0}, /* app_code */
                [3] = {F_STRING, 0}, /* message */
            },
        [K_HEARTBEAT] =
            {
                [1] = {F_VARINT, 0}, /* last_seq */
                [2] = {F_VARINT, 0}, /* inflight */
                [3] = {F_VARINT, 0}, /* stalled */
                [4] = {F_VARINT, 0}, /* incarnation */
                [5] = {F_VARINT, 0}, /* counter */
            },
        [K_REQUEST] =
            {
                [1] = {F_VARINT, 0},           /* version */
                [2] = {F_BYTES, 0},            /* request_id */
                [3] = {F_STRING, 0},           /* response_subject */
                [4] = {F_STRING, 0},           /* router_id */
                [5] = {F_BYTES, 0},            /* payload */
                [6] = {F_VARINT, 0},           /* credit_window */
                [7] = {F_VARINT, 0},           /* heartbeat_ms */
                [8] = {F_VARINT, 0},           /* deadline_ms */
                [9] = {F_STRING, 0},           /* endpoint */
                [10] = {F_VARINT, 0},          /* max_tokens */
                [11] = {F_REPEATED, K_HEADER}, /* headers (a map: repeated entries) */
                [12] = {F_VARINT, 0},          /* resume_from_seq */
                [13] = {F_VARINT, 0},          /* migratable */
                [14] = {F_VARINT, 0},          /* issued_unix_ms */
                [16] = {F_BYTES, 0},           /* auth_token (15, sealed: never canonical) */
                [17] = {F_VARINT, 0},          /* credit_window_max */
                [18] = {F_VARINT, 0},          /* credit_bytes */
                [19] = {F_VARINT, 0},          /* idle_heartbeat_ms */
            },
        [K_HEADER] =
            {
                [1] = {F_STRING, 0}, /* key */
                [2] = {F_STRING, 0}, /* value */
            },
};

/* The most entries of a kind's one repeated field that stay canonical
 * (more go to protobuf-c, whose checks refuse them). */
static const size_t it_max_rep[K_COUNT] = {
    [K_ITEM] = SWP_MAX_BATCH,
    [K_REQUEST] = SWP_MAX_HEADERS,
};

static const size_t it_sizeof[K_COUNT] = {
    [K_ITEM] = sizeof(swp_item),
    [K_BATCHED] = sizeof(swp_batched),
    [K_TERMINAL] = sizeof(swp_terminal),
    [K_ERROR] = sizeof(swp_error),
    [K_HEARTBEAT] = sizeof(swp_heartbeat),
    [K_REQUEST] = sizeof(swp_request),
    [K_HEADER] = sizeof(Streamwire__V1__Request__HeadersEntry),
};

static size_t
it_round(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

/* What pass 1 found: the bytes the decoded message takes, and the
 * entries of the top-level message's one repeated field (a wrapper's
 * batch, a request's headers; no sub-message has one). */
typedef struct it_need {
    size_t bytes;
    size_t nbatch;
} it_need;

/* Pass 1: 0 if p[len] is canonical for kind (adding to *need), -1 if not. */
static int
it_scan(int kind, const uint8_t *p, size_t len, it_need *need)
{
    size_t i = 0;
    uint32_t seen = 0;
    need->bytes += it_round(it_sizeof[kind]);
    while (i < len) {
        pb_rd f;
        const it_field *d;
        if (pb_rd_next(p, len, &i, &f) != 0 || f.num == 0 || f.num > IT_MAX_FIELD)
            return -1;
        d = &it_fields[kind][f.num];
        if (d->type == F_NONE)
            return -1; /* unknown (or sealed) */
        if (d->type == F_REPEATED) {
            if (f.wt != 2 || ++need->nbatch > it_max_rep[kind])
                return -1;
            if (it_scan(d->sub, f.b, f.blen, need) != 0)
                return -1;
            continue;
        }
        if (seen & (1u << f.num))
            return -1; /* a second copy: protobuf-c's last-wins and merges */
        seen |= 1u << f.num;
        if ((d->type == F_VARINT) != (f.wt == 0) || (d->type != F_VARINT && f.wt != 2))
            return -1;
        if (d->type == F_STRING)
            need->bytes += it_round(f.blen + 1);
        else if (d->type == F_MSG && it_scan(d->sub, f.b, f.blen, need) != 0)
            return -1;
    }
    if (kind == K_ITEM && (seen & (1u << 4)) && (seen & (1u << 5)))
        return -1; /* both members of the oneof */
    return 0;
}

typedef struct it_mem {
    uint8_t *at;
} it_mem;

static void *
it_take(it_mem *m, size_t n)
{
    void *p = m->at;
    m->at += it_round(n);
    return p;
}

static char *
it_string(it_mem *m, const pb_rd *f)
{
    char *s = it_take(m, f->blen + 1);
    memcpy(s, f->b, f->blen);
    s[f->blen] = '\0';
    return s;
}

static ProtobufCBinaryData
it_bytes(const pb_rd *f)
{
    ProtobufCBinaryData b;
    b.data = f->blen ? (uint8_t *)(uintptr_t)f->b : NULL;
    b.len = f->blen;
    return b;
}

/* Pass 2: builds each kind of message from bytes pass 1 accepted (every
 * pb_rd_next below succeeds: pass 1 read the same bytes). */
static swp_error *
it_error(const uint8_t *p, size_t len, it_mem *m)
{
    swp_error *e = it_take(m, sizeof(*e));
    streamwire__v1__error__init(e);
    for (size_t i = 0; i < len;) {
        pb_rd f;
        (void)pb_rd_next(p, len, &i, &f);
        if (f.num == 1)
            e->sw_code = (uint32_t)f.v;
        else if (f.num == 2)
            e->app_code = it_string(m, &f);
        else
            e->message = it_string(m, &f); /* 3 */
    }
    return e;
}

static swp_terminal *
it_terminal(const uint8_t *p, size_t len, it_mem *m)
{
    swp_terminal *t = it_take(m, sizeof(*t));
    streamwire__v1__terminal__init(t);
    for (size_t i = 0; i < len;) {
        pb_rd f;
        (void)pb_rd_next(p, len, &i, &f);
        if (f.num == 1)
            t->status = (Streamwire__V1__Status)(int32_t)(uint32_t)f.v;
        else if (f.num == 2)
            t->finish_reason = it_string(m, &f);
        else
            t->error = it_error(f.b, f.blen, m); /* 3 */
    }
    return t;
}

static swp_heartbeat *
it_heartbeat(const uint8_t *p, size_t len, it_mem *m)
{
    swp_heartbeat *h = it_take(m, sizeof(*h));
    streamwire__v1__heartbeat__init(h);
    for (size_t i = 0; i < len;) {
        pb_rd f;
        (void)pb_rd_next(p, len, &i, &f);
        if (f.num == 1)
            h->last_seq = f.v;
        else if (f.num == 2)
            h->inflight = (uint32_t)f.v;
        else if (f.num == 3)
            h->stalled = pb_rd_bool(&f);
        else if (f.num == 4)
            h->incarnation = f.v;
        else
            h->counter = f.v; /* 5 */
    }
    return h;
}

/* One field of a batch entry into b (a string or terminal taken from m),
 * for both decoders, as it_item_set is for the wrapper. */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline void
it_batched_set(swp_batched *b, const pb_rd *f, it_mem *m)
{
    switch (f->num) {
    case 3:
        b->seq = f->v;
        break;
    case 4:
        b->data = it_bytes(f);
        break;
    case 6:
        b->droppable = pb_rd_bool(f);
        break;
    case 7:
        b->complete_final = pb_rd_bool(f);
        break;
    case 8:
        b->terminal = it_terminal(f->b, f->blen, m);
        break;
    default:
        b->event = it_string(m, f); /* 13 */
        break;
    }
}

static swp_batched *
it_batched(const uint8_t *p, size_t len, it_mem *m)
{
    swp_batched *b = it_take(m, sizeof(*b));
    streamwire__v1__batched_item__init(b);
    for (size_t i = 0; i < len;) {
        pb_rd f;
        (void)pb_rd_next(p, len, &i, &f);
        it_batched_set(b, &f, m);
    }
    return b;
}

/* One field of the wrapper into w (strings and sub-messages taken from m;
 * batch entries into the room it_item made). Inlined always: in it_fast,
 * the once-per-message path, a call cost a quarter of its time. */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline void
it_item_set(swp_item *w, const pb_rd *f, it_mem *m)
{
    switch (f->num) {
    case 1:
        w->version = (uint32_t)f->v;
        break;
    case 2:
        w->request_id = it_bytes(f);
        break;
    case 3:
        w->seq = f->v;
        break;
    case 4:
        w->body_case = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_DATA;
        w->data = it_bytes(f);
        break;
    case 5:
        w->body_case = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_HEARTBEAT;
        w->heartbeat = it_heartbeat(f->b, f->blen, m);
        break;
    case 6:
        w->droppable = pb_rd_bool(f);
        break;
    case 7:
        w->complete_final = pb_rd_bool(f);
        break;
    case 8:
        w->terminal = it_terminal(f->b, f->blen, m);
        break;
    case 9:
        w->instance_id = it_string(m, f);
        break;
    case 10:
        w->resent = pb_rd_bool(f);
        break;
    case 11:
        w->credit_window = (uint32_t)f->v;
        break;
    case 12:
        w->batch[w->n_batch++] = it_batched(f->b, f->blen, m);
        break;
    case 13:
        w->event = it_string(m, f);
        break;
    case 14:
        w->credit_window_max = (uint32_t)f->v;
        break;
    default:
        w->credit_bytes = f->v; /* 16 */
        break;
    }
}

/* The wrapper, with room for the nbatch entries pass 1 counted. */
static swp_item *
it_item(const uint8_t *p, size_t len, size_t nbatch, it_mem *m)
{
    swp_item *w = it_take(m, sizeof(*w));
    streamwire__v1__stream_item_wrapper__init(w);
    if (nbatch > 0)
        w->batch = it_take(m, nbatch * sizeof(*w->batch));
    for (size_t i = 0; i < len;) {
        pb_rd f;
        (void)pb_rd_next(p, len, &i, &f);
        it_item_set(w, &f, m);
    }
    return w;
}

/* The common message in one pass: a wrapper whose fields are all varints
 * and bytes (no string or sub-message: a data item as a worker sends it
 * after seq 1), each known, at most once, with its declared wire type,
 * and batch entries of the same kind (seq, data, droppable,
 * complete_final; no terminal or event), at most SWP_MAX_BATCH. That is
 * canonical, so it builds what the two passes would: the wrapper at the
 * arena's start, the entries after it, then their pointers, the bytes
 * fields pointing into p. NULL for anything else; the two passes then
 * decide it from the start (they read nothing this pass left behind).
 * Once per received message (issue 17: two passes of out-of-line field
 * reads took ~950 instructions for an item of four fields, and ~400 for
 * each batched 64 B item). */
_Static_assert(sizeof(swp_item) <= SWP_ARENA_BYTES, "the wrapper fits the arena");
#define IT_BIT(n) (1u << (n))
#define IT_FAST_FIELDS                                                                    \
    (IT_BIT(1) | IT_BIT(2) | IT_BIT(3) | IT_BIT(4) | IT_BIT(6) | IT_BIT(7) | IT_BIT(10) | \
     IT_BIT(11) | IT_BIT(14) | IT_BIT(16))
#define IT_FAST_BYTES (IT_BIT(2) | IT_BIT(4)) /* the rest of IT_FAST_FIELDS: varints */
#define IT_FAST_BATCHED (IT_BIT(3) | IT_BIT(4) | IT_BIT(6) | IT_BIT(7))
#define IT_W_BYTES it_round(sizeof(swp_item))
#define IT_B_BYTES it_round(sizeof(swp_batched))
_Static_assert((sizeof(swp_item) + 15) / 16 * 16 +
                       SWP_MAX_BATCH * ((sizeof(swp_batched) + 15) / 16 * 16 + sizeof(void *)) <=
                   SWP_ARENA_BYTES,
               "a full batch of entries without strings fits the arena");

/* A batch entry of the one-pass kind into b: 0, or -1 if it is not. */
static int
it_fast_batched(const uint8_t *p, size_t len, swp_batched *b)
{
    uint32_t seen = 0;
    streamwire__v1__batched_item__init(b);
    for (size_t i = 0; i < len;) {
        pb_rd f;
        uint32_t bit;
        if (pb_rd_next(p, len, &i, &f) != 0 || f.num > IT_MAX_FIELD)
            return -1;
        bit = IT_BIT(f.num);
        if ((IT_FAST_BATCHED & bit) == 0 || (seen & bit) != 0 || f.wt != (bit == IT_BIT(4) ? 2 : 0))
            return -1;
        seen |= bit;
        it_batched_set(b, &f, NULL); /* (no string or terminal here: nothing to take) */
    }
    return 0;
}

static swp_item *
it_fast(const uint8_t *p, size_t len, swp_arena *a)
{
    swp_item *w = (swp_item *)(void *)a->buf;
    uint32_t seen = 0;
    size_t nb = 0;
    streamwire__v1__stream_item_wrapper__init(w);
    for (size_t i = 0; i < len;) {
        pb_rd f;
        uint32_t bit;
        if (pb_rd_next(p, len, &i, &f) != 0 || f.num > IT_MAX_FIELD)
            return NULL;
        if (f.num == 12) {
            /* a batch entry: after the wrapper and the ones before it */
            if (f.wt != 2 || nb == SWP_MAX_BATCH ||
                it_fast_batched(f.b, f.blen,
                                (swp_batched *)(void *)(a->buf + IT_W_BYTES + nb * IT_B_BYTES)) !=
                    0)
                return NULL;
            nb++;
            continue;
        }
        bit = IT_BIT(f.num);
        if ((IT_FAST_FIELDS & bit) == 0 || (seen & bit) != 0 ||
            f.wt != ((IT_FAST_BYTES & bit) ? 2 : 0))
            return NULL;
        seen |= bit;
        it_item_set(w, &f, NULL); /* (no string or sub-message here: nothing to take) */
    }
    if (nb > 0) {
        uint8_t *at = a->buf + IT_W_BYTES;
        w->batch = (swp_batched **)(void *)(at + nb * IT_B_BYTES);
        for (size_t k = 0; k < nb; k++)
            w->batch[k] = (swp_batched *)(void *)(at + k * IT_B_BYTES);
        w->n_batch = nb;
    }
    return w;
}

/* The checks both arena decoders make first: SW_OK (the arena reset for a
 * message built by hand), or the error. */
static sw_err
it_begin(const uint8_t *buf, size_t len, size_t max, swp_arena *a, void *out)
{
    if (out == NULL || a == NULL)
        return SW_EINVAL;
    *(void **)out = NULL;
    if (buf == NULL && len != 0)
        return SW_EINVAL;
    if (len > max)
        return SW_EMSGSIZE;
    a->used = 0;
    a->hand = 1;
    a->block = NULL;
    return SW_OK;
}

/* Room for what pass 1 counted: the arena, or one malloc'd block (NULL:
 * no memory; protobuf-c's path would say SW_EPROTO). */
static uint8_t *
it_room(swp_arena *a, const it_need *need)
{
    size_t bytes = need->bytes + it_round(need->nbatch * sizeof(void *));
    if (bytes <= SWP_ARENA_BYTES)
        return a->buf;
    return a->block = malloc(bytes);
}

sw_err
swp_decode_item_arena(const uint8_t *buf, size_t len, size_t max, swp_arena *a, swp_item **out)
{
    it_need need = {0, 0};
    it_mem m;
    swp_item *w;
    sw_err rv;
    if ((rv = it_begin(buf, len, max, a, out)) != SW_OK)
        return rv;
    if ((w = it_fast(buf, len, a)) != NULL && swp_check_item(w) == SW_OK) {
        *out = w;
        return SW_OK;
    }
    if (it_scan(K_ITEM, buf, len, &need) != 0)
        return swp_decode_item_pbc(buf, len, max, a, out);
    if ((m.at = it_room(a, &need)) == NULL)
        return SW_ENOMEM;
    w = it_item(buf, len, need.nbatch, &m);
    if ((rv = swp_check_item(w)) != SW_OK) {
        /* swp_decode_item's order: the allocation bound first. */
        if (swp_precheck(&streamwire__v1__stream_item_wrapper__descriptor, buf, len) != SW_OK)
            rv = SW_EPROTO;
        free(a->block);
        a->block = NULL;
        return rv;
    }
    *out = w;
    return SW_OK;
}

/* ---------------------------------------------------------------- Request */

static Streamwire__V1__Request__HeadersEntry *
it_header(const uint8_t *p, size_t len, it_mem *m)
{
    Streamwire__V1__Request__HeadersEntry *e = it_take(m, sizeof(*e));
    streamwire__v1__request__headers_entry__init(e);
    for (size_t i = 0; i < len;) {
        pb_rd f;
        (void)pb_rd_next(p, len, &i, &f);
        if (f.num == 1)
            e->key = it_string(m, &f);
        else
            e->value = it_string(m, &f); /* 2 */
    }
    return e;
}

/* Pass 2 of a request, with room for the nhdr headers pass 1 counted. */
static swp_request *
it_request(const uint8_t *p, size_t len, size_t nhdr, it_mem *m)
{
    swp_request *r = it_take(m, sizeof(*r));
    streamwire__v1__request__init(r);
    if (nhdr > 0)
        r->headers = it_take(m, nhdr * sizeof(*r->headers));
    for (size_t i = 0; i < len;) {
        pb_rd f;
        (void)pb_rd_next(p, len, &i, &f);
        switch (f.num) {
        case 1:
            r->version = (uint32_t)f.v;
            break;
        case 2:
            r->request_id = it_bytes(&f);
            break;
        case 3:
            r->response_subject = it_string(m, &f);
            break;
        case 4:
            r->router_id = it_string(m, &f);
            break;
        case 5:
            r->payload = it_bytes(&f);
            break;
        case 6:
            r->credit_window = (uint32_t)f.v;
            break;
        case 7:
            r->heartbeat_ms = (uint32_t)f.v;
            break;
        case 8:
            r->deadline_ms = (uint32_t)f.v;
            break;
        case 9:
            r->endpoint = it_string(m, &f);
            break;
        case 10:
            r->max_tokens = (uint32_t)f.v;
            break;
        case 11:
            r->headers[r->n_headers++] = it_header(f.b, f.blen, m);
            break;
        case 12:
            r->resume_from_seq = f.v;
            break;
        case 13:
            r->migratable = pb_rd_bool(&f);
            break;
        case 14:
            r->issued_unix_ms = f.v;
            break;
        case 16:
            r->auth_token = it_bytes(&f);
            break;
        case 17:
            r->credit_window_max = (uint32_t)f.v;
            break;
        case 18:
            r->credit_bytes = f.v;
            break;
        default:
            r->idle_heartbeat_ms = (uint32_t)f.v; /* 19 */
            break;
        }
    }
    return r;
}

/* A canonical request (at most SWP_MAX_HEADERS headers, each field once)
 * allocates in protobuf-c at most its own bytes plus a constant (the
 * struct, 64 entries and their pointers, the strings' NULs): far within
 * SWP_ALLOC_FACTOR x len + SWP_ALLOC_SLACK, so the hand path never accepts
 * what the allocation bound refuses (the fuzz body compares the two). */
sw_err
swp_decode_request_arena(const uint8_t *buf, size_t len, size_t max, swp_arena *a,
                         swp_request **out)
{
    it_need need = {0, 0};
    it_mem m;
    swp_request *r;
    sw_err rv;
    if ((rv = it_begin(buf, len, max, a, out)) != SW_OK)
        return rv;
    if (it_scan(K_REQUEST, buf, len, &need) != 0)
        return swp_decode_request_pbc(buf, len, max, a, out);
    if ((m.at = it_room(a, &need)) == NULL)
        return SW_ENOMEM;
    r = it_request(buf, len, need.nbatch, &m);
    if ((rv = swp_check_request(r)) != SW_OK) {
        free(a->block);
        a->block = NULL;
        return rv;
    }
    *out = r;
    return SW_OK;
}
