/* proto/beats.c -- the HeartbeatBatch decoder, by hand (issue 11 #5).
 *
 * A batch is the densest message on the bus: a beat is 22 bytes on the
 * wire, and protobuf-c spends a struct, a pointer, a copy of the id and a
 * 32-byte scan record on each, 7.6 times the input. This decoder reads the
 * bytes once to check and count, then builds the same swp_beats in ONE
 * block of exactly
 *
 *   sizeof(swp_beats) + n * (sizeof(swp_beat *) + sizeof(swp_beat) + 16)
 *     + strlen(instance_id) + 1
 *
 * bytes: at most 3.6 times the input plus a constant (72 bytes a beat; a beat with
 * last_seq 0 is 20 bytes on the wire), within the codec's
 * bound (SWP_ALLOC_FACTOR). swp_free knows such a block by its descriptor.
 *
 * It accepts exactly what protobuf_c_message_unpack followed by the
 * codec's caps and checks accepts, and decodes it to the same values (the
 * fuzzer compares the two on every input, tests/fuzz/fuzz_decode.c), with
 * one exception: a batch carrying field 15 (`sealed`) is refused, since the
 * transport opens sealed messages before anything decodes them and an
 * opened batch never carries one. protobuf-c's reading rules are followed:
 * a tag is at most 5 bytes, a length prefix at most 5, a varint at most 10;
 * field 0, groups and a known field with the wrong wire type are refused;
 * a later copy of a non-repeated field wins; a string ends at its first NUL
 * (C's view of what protobuf-c copies). */
#include <stdlib.h>
#include <string.h>

#include "common/sw_common.h"
#include "proto/pb_read.h"
#include "proto/sw_codec.h"

/* HeartbeatBatch and StreamBeat field numbers. */
enum {
    HB_VERSION = 1,
    HB_INSTANCE = 2,
    HB_BEATS = 3,
    HB_INCARNATION = 4,
    HB_COUNTER = 5,
    HB_SEALED = 15
};
enum { SB_REQUEST_ID = 1, SB_LAST_SEQ = 2 };

/* One StreamBeat: its id (the last copy) and last_seq. 0, or -1 if it does
 * not parse or passes a cap. */
static int
rd_beat(const uint8_t *p, size_t len, const uint8_t **id, size_t *idlen, uint64_t *seq)
{
    size_t i = 0;
    unsigned unknown = 0, nid = 0, nseq = 0;
    /* The beat as every streamwire worker writes it, read at once: the id
     * (tag 0x0a, length 16), then last_seq (tag 0x10) unless it is 0. The
     * loop below reads it to the same values. */
    if (len >= 2 + SW_REQUEST_ID_BYTES && p[0] == 0x0a && p[1] == SW_REQUEST_ID_BYTES) {
        size_t at = 3 + SW_REQUEST_ID_BYTES;
        uint64_t v = 0;
        if (len == 2 + SW_REQUEST_ID_BYTES || (p[2 + SW_REQUEST_ID_BYTES] == 0x10 &&
                                               pb_rd_varint(p, len, &at, &v) == 0 && at == len)) {
            *id = p + 2;
            *idlen = SW_REQUEST_ID_BYTES;
            *seq = v;
            return 0;
        }
    }
    *id = NULL;
    *idlen = 0;
    *seq = 0;
    while (i < len) {
        pb_rd f;
        if (pb_rd_next(p, len, &i, &f) != 0 || f.num == 0)
            return -1;
        if (f.num == SB_REQUEST_ID) {
            if (f.wt != 2 || ++nid > 4)
                return -1;
            *id = f.b;
            *idlen = f.blen;
        } else if (f.num == SB_LAST_SEQ) {
            if (f.wt != 0 || ++nseq > 4)
                return -1;
            *seq = f.v;
        } else if (++unknown > SWP_MAX_UNKNOWN) {
            return -1;
        }
    }
    return 0;
}

sw_err
swp_decode_beats(const uint8_t *buf, size_t len, size_t max, swp_beats **out)
{
    size_t i = 0, n = 0, slen, size;
    unsigned unknown = 0, nver = 0, ninst = 0, ninc = 0, ncnt = 0;
    uint32_t version = 0;
    uint64_t incarnation = 0, counter = 0;
    const uint8_t *inst = NULL;
    size_t inst_len = 0;
    int bad_id = 0;
    char name[SW_MAX_TOKEN + 1];
    swp_beats *m;
    swp_beat **ptrs;
    swp_beat *beats;
    uint8_t *ids;

    if (out == NULL)
        return SW_EINVAL;
    *out = NULL;
    if (buf == NULL && len != 0)
        return SW_EINVAL;
    if (len > max)
        return SW_EMSGSIZE;

    /* Pass 1: check the structure and the caps, count the beats. */
    while (i < len) {
        pb_rd f;
        if (pb_rd_next(buf, len, &i, &f) != 0 || f.num == 0)
            return SW_EPROTO;
        switch (f.num) {
        case HB_VERSION:
            if (f.wt != 0 || ++nver > 4)
                return SW_EPROTO;
            version = (uint32_t)f.v;
            break;
        case HB_INSTANCE:
            if (f.wt != 2 || ++ninst > 4)
                return SW_EPROTO;
            inst = f.b;
            inst_len = f.blen;
            break;
        case HB_BEATS: {
            const uint8_t *id;
            size_t idlen;
            uint64_t seq;
            if (f.wt != 2 || ++n > SWP_MAX_BEATS || rd_beat(f.b, f.blen, &id, &idlen, &seq) != 0)
                return SW_EPROTO;
            bad_id |= idlen != SW_REQUEST_ID_BYTES;
            break;
        }
        case HB_INCARNATION:
            if (f.wt != 0 || ++ninc > 4)
                return SW_EPROTO;
            incarnation = f.v;
            break;
        case HB_COUNTER:
            if (f.wt != 0 || ++ncnt > 4)
                return SW_EPROTO;
            counter = f.v;
            break;
        case HB_SEALED:
            return SW_EPROTO; /* opened by the transport before any decode */
        default:
            if (++unknown > SWP_MAX_UNKNOWN)
                return SW_EPROTO;
            break;
        }
    }
    /* The checks, in the order the other decoders make them. */
    if (version != SW_PROTOCOL_VERSION)
        return SW_EVERSION;
    slen = inst != NULL ? strnlen((const char *)inst, inst_len) : 0;
    if (slen > SW_MAX_TOKEN)
        return SW_EPROTO;
    memcpy(name, inst != NULL ? inst : (const uint8_t *)"", slen);
    name[slen] = '\0';
    if (sw_validate_token(name) != SW_OK || n == 0 || bad_id)
        return SW_EPROTO;

    /* Pass 2: one block. */
    size = sizeof(*m) + n * (sizeof(*ptrs) + sizeof(*beats) + SW_REQUEST_ID_BYTES) + slen + 1;
    if ((m = malloc(size)) == NULL)
        return SW_ENOMEM;
    streamwire__v1__heartbeat_batch__init(m);
    /* The structs first, then the pointers, then the bytes: every part is
     * aligned for what it holds on 32-bit targets too. */
    beats = (swp_beat *)(void *)(m + 1);
    ptrs = (swp_beat **)(void *)(beats + n);
    ids = (uint8_t *)(ptrs + n);
    m->version = version;
    m->incarnation = incarnation;
    m->counter = counter;
    m->n_beats = n;
    m->beats = ptrs;
    m->instance_id = (char *)(ids + n * SW_REQUEST_ID_BYTES);
    memcpy(m->instance_id, name, slen + 1);
    n = 0;
    for (i = 0; i < len;) {
        pb_rd f;
        const uint8_t *id;
        size_t idlen;
        uint64_t seq;
        (void)pb_rd_next(buf, len, &i, &f); /* pass 1 read it all */
        if (f.num != HB_BEATS)
            continue;
        (void)rd_beat(f.b, f.blen, &id, &idlen, &seq);
        streamwire__v1__stream_beat__init(&beats[n]);
        memcpy(ids + n * SW_REQUEST_ID_BYTES, id, SW_REQUEST_ID_BYTES);
        beats[n].request_id.data = ids + n * SW_REQUEST_ID_BYTES;
        beats[n].request_id.len = SW_REQUEST_ID_BYTES;
        beats[n].last_seq = seq;
        ptrs[n] = &beats[n];
        n++;
    }
    *out = m;
    return SW_OK;
}
