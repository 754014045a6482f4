/* proto/pb_read.h -- reading protobuf wire bytes the way protobuf-c 1.4
 * reads them, for the decoders written by hand (proto/beats.c,
 * proto/items.c) and every walk over wire bytes (swp_read_varint in
 * sw_codec.h: the codec's allocation walk, the transport's envelope).
 *
 * protobuf-c's rules, followed here: a tag is at most 5 bytes (32 bits of
 * field number), a length prefix at most 5 bytes and at most INT_MAX, a
 * varint at most 10 bytes; groups (wire types 3, 4) and wire types 6, 7 do
 * not parse. */
#ifndef SW_PB_READ_H
#define SW_PB_READ_H

#include <stddef.h>
#include <stdint.h>

typedef struct pb_rd {
    uint32_t num; /* field number */
    int wt;       /* wire type */
    uint64_t v;   /* a varint's value (bits past 64 dropped) */
    const uint8_t *b;
    size_t blen; /* a length-delimited field's bytes; a varint's own bytes */
} pb_rd;

/* A tag: 0, or -1 if it does not parse. */
static inline int
pb_rd_tag(const uint8_t *p, size_t len, size_t *i, uint32_t *num, int *wt)
{
    uint32_t v;
    unsigned shift = 4;
    size_t at = *i, max = len - at < 5 ? len - at : 5;
    if (max == 0)
        return -1;
    *wt = p[at] & 7;
    v = (p[at] & 0x7f) >> 3;
    if ((p[at] & 0x80) == 0) {
        *num = v;
        *i = at + 1;
        return 0;
    }
    for (size_t k = 1; k < max; k++) {
        v |= (uint32_t)(p[at + k] & 0x7f) << shift;
        if ((p[at + k] & 0x80) == 0) {
            *num = v;
            *i = at + k + 1;
            return 0;
        }
        shift += 7;
    }
    return -1;
}

/* A varint of at most 10 bytes: 0, or -1. */
static inline int
pb_rd_varint(const uint8_t *p, size_t len, size_t *i, uint64_t *v)
{
    uint64_t r = 0;
    size_t at = *i;
    if (at < len && p[at] < 0x80) { /* one byte: nearly every tag and length */
        *v = p[at];
        *i = at + 1;
        return 0;
    }
    for (unsigned k = 0; k < 10 && at < len; k++, at++) {
        r |= (uint64_t)(p[at] & 0x7f) << (7 * k);
        if ((p[at] & 0x80) == 0) {
            *v = r;
            *i = at + 1;
            return 0;
        }
    }
    return -1;
}

/* One field: 0, or -1 if it does not parse (or is a group). Inlined
 * always: it is the inner loop of every hand-written decoder, and a call
 * took about half of its ~65 instructions (issue 17). */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline int
pb_rd_next(const uint8_t *p, size_t len, size_t *i, pb_rd *f)
{
    f->num = 0; /* all set on every path (the compiler sees the inlined callers) */
    f->wt = 0;
    f->v = 0;
    f->b = NULL;
    f->blen = 0;
    if (pb_rd_tag(p, len, i, &f->num, &f->wt) != 0)
        return -1;
    switch (f->wt) {
    case 0:
        f->b = p + *i;
        if (pb_rd_varint(p, len, i, &f->v) != 0)
            return -1;
        f->blen = (size_t)(p + *i - f->b);
        return 0;
    case 1:
        if (len - *i < 8)
            return -1;
        *i += 8;
        return 0;
    case 5:
        if (len - *i < 4)
            return -1;
        *i += 4;
        return 0;
    case 2: {
        size_t n = 0, at = *i, max = len - at < 5 ? len - at : 5, k;
        for (k = 0; k < max; k++) {
            n |= (size_t)(p[at + k] & 0x7f) << (7 * k);
            if ((p[at + k] & 0x80) == 0)
                break;
        }
        if (k == max || n > (size_t)0x7fffffff || n > len - (at + k + 1))
            return -1;
        f->b = p + at + k + 1;
        f->blen = n;
        *i = at + k + 1 + n;
        return 0;
    }
    default:
        return -1;
    }
}

/* A bool as protobuf-c reads one: true if any of the varint's bytes has a
 * value bit set (also bits past the 64th). */
static inline int
pb_rd_bool(const pb_rd *f)
{
    for (size_t k = 0; k < f->blen; k++)
        if (f->b[k] & 0x7f)
            return 1;
    return 0;
}

#endif
