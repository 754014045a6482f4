/* tests/fuzz/fuzz_decode.c -- fuzz body for the six wire decoders.
 *
 * Input: data[0] % 6 selects the decoder (0 request, 1 item, 2 control,
 * 3 probe reply, 4 instance info, 5 heartbeat batch); the rest is the message, decoded with a
 * 64 KiB limit. Items and requests are also decoded with
 * swp_decode_item_arena and swp_decode_request_arena, which must agree with
 * swp_decode_item and swp_decode_request. Properties checked (abort() on violation, so both
 * libFuzzer and the replay driver see a crash):
 *   - the decoder returns SW_OK with a message, or an error without one;
 *   - the hand-written HeartbeatBatch decoder agrees with protobuf-c and the
 *     codec's checks, error for error and value for value;
 *   - what unpacking allocates (counted with malloc's overhead, through a
 *     counting allocator, with no length limit so large inputs count too)
 *   is at most the codec's estimate, which is at most SWP_ALLOC_FACTOR x
 *   the input + SWP_ALLOC_SLACK (the decoders' allocation bound);
 *   - the only errors are SW_EPROTO, SW_EVERSION and (over 64 KiB) SW_EMSGSIZE;
 *   - a decoded message re-encodes (swp_encode_alloc / swp_encode agree,
 *     and swp_encode refuses a buffer one byte short);
 *   - the re-encoding decodes again, and encoding that gives the same bytes
 *     (encoding is a fixed point after one round); no decoded message holds
 *     a field-0 tag (the protobuf-c quirk in pbc_quirks.h, refused by the
 *     codec).
 *
 * Built two ways: with -fsanitize=fuzzer (tests/fuzz/CMakeLists.txt,
 * SW_BUILD_FUZZ=ON) and with fuzz_replay_main.c as a plain program that the
 * normal test suite runs (tests/unit/CMakeLists.txt, test fuzz_replay). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/sw_codec.h"
#include "tests/fuzz/pbc_quirks.h"

#define FUZZ_MAX_LEN (64u * 1024u)
#define FUZZ_NDECODERS 6

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* Inputs so far that decoded / were rejected (for the replay driver). */
void fuzz_decode_stats(unsigned long *decoded, unsigned long *rejected);

static unsigned long n_decoded, n_rejected;

void
fuzz_decode_stats(unsigned long *decoded, unsigned long *rejected)
{
    *decoded = n_decoded;
    *rejected = n_rejected;
}

#define FUZZ_CHECK(cond)                                                                     \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "fuzz_decode: %s:%d: check failed: %s (decoder %d)\n", __FILE__, \
                    __LINE__, #cond, sel);                                                   \
            abort();                                                                         \
        }                                                                                    \
    } while (0)

static sw_err
fuzz_decode(int sel, const uint8_t *buf, size_t len, size_t max, void **out)
{
    sw_err rv = SW_EINTERNAL;
    *out = NULL;
    switch (sel) {
    case 0: {
        swp_request *m = NULL;
        rv = swp_decode_request(buf, len, max, &m);
        *out = m;
        break;
    }
    case 1: {
        swp_item *m = NULL;
        rv = swp_decode_item(buf, len, max, &m);
        *out = m;
        break;
    }
    case 2: {
        swp_control *m = NULL;
        rv = swp_decode_control(buf, len, max, &m);
        *out = m;
        break;
    }
    case 3: {
        swp_probe_reply *m = NULL;
        rv = swp_decode_probe_reply(buf, len, max, &m);
        *out = m;
        break;
    }
    case 4: {
        swp_instance *m = NULL;
        rv = swp_decode_instance(buf, len, max, &m);
        *out = m;
        break;
    }
    case 5: {
        swp_beats *m = NULL;
        rv = swp_decode_beats(buf, len, max, &m);
        *out = m;
        break;
    }
    default:
        abort();
    }
    return rv;
}

static const ProtobufCMessageDescriptor *const fuzz_desc[FUZZ_NDECODERS] = {
    &streamwire__v1__request__descriptor,       &streamwire__v1__stream_item_wrapper__descriptor,
    &streamwire__v1__control__descriptor,       &streamwire__v1__probe_reply__descriptor,
    &streamwire__v1__instance_info__descriptor, &streamwire__v1__heartbeat_batch__descriptor,
};

typedef struct fuzz_count {
    size_t bytes;
} fuzz_count;

static void *
fuzz_count_alloc(void *data, size_t size)
{
    ((fuzz_count *)data)->bytes += size + 16; /* malloc's overhead, as the estimate counts it */
    return malloc(size);
}

static void
fuzz_count_free(void *data, void *p)
{
    free(p);
}

/* The allocation bound: unpack with a counting allocator and no length
 * limit; what it allocates stays within the estimate and the bound. */
static void
check_alloc_bound(int sel, const uint8_t *buf, size_t len)
{
    fuzz_count c = {0};
    ProtobufCAllocator a = {fuzz_count_alloc, fuzz_count_free, &c};
    ProtobufCMessage *m = NULL;
    size_t est = swp_alloc_estimate(fuzz_desc[sel], buf, len);
    sw_err rv = swp_unpack(fuzz_desc[sel], buf, len, SIZE_MAX, &a, &m);
    if (rv == SW_OK) {
        FUZZ_CHECK(est != SIZE_MAX);
        FUZZ_CHECK(c.bytes <= est);
        FUZZ_CHECK(est <= SWP_ALLOC_FACTOR * len + SWP_ALLOC_SLACK);
        protobuf_c_message_free_unpacked(m, &a);
    }
}

/* The hot-path decoders (the egress's items, the ingress's requests) must
 * agree with swp_decode_item and swp_decode_request: same result, and a
 * message that encodes to the same bytes. The arena is on the heap so ASan
 * sees reads past it; large messages spill into malloc. */
static void
check_arena(int sel, const uint8_t *buf, size_t len, sw_err want, const void *ref)
{
    swp_arena *arena = malloc(sizeof(*arena));
    void *m = (void *)(uintptr_t)1;
    sw_err rv;
    FUZZ_CHECK(arena != NULL);
    if (sel == 1)
        rv = swp_decode_item_arena(buf, len, FUZZ_MAX_LEN, arena, (swp_item **)&m);
    else
        rv = swp_decode_request_arena(buf, len, FUZZ_MAX_LEN, arena, (swp_request **)&m);
    FUZZ_CHECK(rv == want);
    if (rv != SW_OK) {
        FUZZ_CHECK(m == NULL);
    } else {
        size_t n = swp_encoded_size(m);
        uint8_t *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        FUZZ_CHECK(m != NULL);
        FUZZ_CHECK(n == swp_encoded_size(ref));
        FUZZ_CHECK(swp_encode_alloc(m, SIZE_MAX, &a, &na) == SW_OK);
        FUZZ_CHECK(swp_encode_alloc(ref, SIZE_MAX, &b, &nb) == SW_OK);
        FUZZ_CHECK(na == nb && (na == 0 || memcmp(a, b, na) == 0));
        free(a);
        free(b);
        swp_free_arena(m, arena);
    }
    free(arena);
}

/* The HeartbeatBatch decoder is written by hand (proto/beats.c): it must
 * give what protobuf-c with the codec's caps and checks gives, error for
 * error and value for value; the one documented difference is field 15
 * (an unopened seal), which it refuses. */
static void
check_beats_reference(const uint8_t *buf, size_t len, sw_err got, const swp_beats *m)
{
    const int sel = 5;
    sw_err want = SW_OK;
    swp_beats *r = NULL;
    if (len > FUZZ_MAX_LEN)
        return;
    if (swp_alloc_estimate(&streamwire__v1__heartbeat_batch__descriptor, buf, len) == SIZE_MAX)
        want = SW_EPROTO; /* a cap: unknown fields, copies, beats */
    else if ((r = streamwire__v1__heartbeat_batch__unpack(NULL, len, buf)) == NULL ||
             pbcq_has_tag0((const ProtobufCMessage *)r) || r->sealed != NULL)
        want = SW_EPROTO;
    else if (r->version != SW_PROTOCOL_VERSION)
        want = SW_EVERSION;
    else if (sw_validate_token(r->instance_id) != SW_OK || r->n_beats == 0 ||
             r->n_beats > SWP_MAX_BEATS)
        want = SW_EPROTO;
    else
        for (size_t i = 0; i < r->n_beats; i++)
            if (r->beats[i]->request_id.len != 16)
                want = SW_EPROTO;
    if (got != want)
        fprintf(stderr, "fuzz_decode: beats by hand gave %s, protobuf-c %s\n", sw_err_name(got),
                sw_err_name(want));
    FUZZ_CHECK(got == want);
    if (want == SW_OK) {
        FUZZ_CHECK(m->version == r->version);
        FUZZ_CHECK(m->incarnation == r->incarnation && m->counter == r->counter);
        FUZZ_CHECK(strcmp(m->instance_id, r->instance_id) == 0);
        FUZZ_CHECK(m->n_beats == r->n_beats);
        for (size_t i = 0; i < r->n_beats; i++) {
            FUZZ_CHECK(m->beats[i]->last_seq == r->beats[i]->last_seq);
            FUZZ_CHECK(memcmp(m->beats[i]->request_id.data, r->beats[i]->request_id.data, 16) == 0);
        }
    }
    if (r != NULL)
        streamwire__v1__heartbeat_batch__free_unpacked(r, NULL);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int sel;
    const uint8_t *msg;
    size_t len, n1, n2, n3 = 0, size1;
    void *m1 = NULL, *m2 = NULL;
    uint8_t *e1 = NULL, *e2 = NULL, *e3;
    sw_err rv;

    if (size == 0)
        return 0;
    sel = data[0] % FUZZ_NDECODERS;
    msg = data + 1;
    len = size - 1;

    check_alloc_bound(sel, len ? msg : NULL, len);
    rv = fuzz_decode(sel, len ? msg : NULL, len, FUZZ_MAX_LEN, &m1);
    if (sel == 0 || sel == 1)
        check_arena(sel, len ? msg : NULL, len, rv, m1);
    if (sel == 5)
        check_beats_reference(len ? msg : NULL, len, rv, m1);
    if (rv != SW_OK) {
        n_rejected++;
        FUZZ_CHECK(m1 == NULL);
        FUZZ_CHECK(rv == SW_EPROTO || rv == SW_EVERSION ||
                   (rv == SW_EMSGSIZE && len > FUZZ_MAX_LEN));
        return 0;
    }
    n_decoded++;
    FUZZ_CHECK(m1 != NULL);
    FUZZ_CHECK(len <= FUZZ_MAX_LEN);

    /* re-encode */
    size1 = swp_encoded_size(m1);
    FUZZ_CHECK(swp_encode_alloc(m1, SIZE_MAX, &e1, &n1) == SW_OK);
    FUZZ_CHECK(e1 != NULL && n1 == size1);
    e3 = malloc(n1 ? n1 : 1);
    FUZZ_CHECK(e3 != NULL);
    FUZZ_CHECK(swp_encode(m1, e3, n1, &n3) == SW_OK);
    FUZZ_CHECK(n3 == n1 && (n1 == 0 || memcmp(e1, e3, n1) == 0));
    if (n1 > 0)
        FUZZ_CHECK(swp_encode(m1, e3, n1 - 1, &n3) == SW_EMSGSIZE);
    free(e3);

    /* The codec refuses field-0 tags (pbc_quirks.h): a decoded message
     * never holds one. */
    FUZZ_CHECK(!pbcq_has_tag0((const ProtobufCMessage *)m1));

    /* the re-encoding must decode (with no tighter limit than its size) */
    rv = fuzz_decode(sel, n1 ? e1 : NULL, n1, n1, &m2);
    FUZZ_CHECK(rv == SW_OK);
    FUZZ_CHECK(m2 != NULL);

    /* and encode to the same bytes */
    FUZZ_CHECK(swp_encode_alloc(m2, SIZE_MAX, &e2, &n2) == SW_OK);
    FUZZ_CHECK(n2 == n1);
    FUZZ_CHECK(n1 == 0 || memcmp(e1, e2, n1) == 0);

    free(e1);
    free(e2);
    swp_free(m1);
    swp_free(m2);
    return 0;
}
