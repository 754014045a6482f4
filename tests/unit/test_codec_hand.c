/* tests/unit/test_codec_hand.c -- the hot path's hand encoding of
 * StreamItemWrappers (proto/encode.c; split from test_codec.c): headers, data
 * and final bodies and batch prefixes byte for byte against protobuf-c and
 * within their bounds, and what both item decoders (swp_decode_item,
 * swp_decode_item_arena) make of them: single items, batches, the batch
 * count cap, every batch rule, the arena's fall back to malloc; and the
 * HeartbeatBatch round trip and checks (swp_decode_beats). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "codec_fixture.h"

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
    h.credit_window_max = 0;
    h.credit_bytes = 0;
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

/* Appends a data body (after a batch prefix when batched), with an event
 * name unless event is NULL. */
static void
wb_data_ev(wbuf *w, int batched, uint64_t seq, const void *data, size_t len, int droppable,
           const char *event)
{
    size_t elen = event != NULL ? strlen(event) : 0;
    size_t size = swp_data_body_size(seq, len, droppable, elen), n;
    if (batched)
        wb_prefix(w, size);
    n = swp_data_body_write(wb_room(w, size), seq, data, len, droppable, event, elen);
    assert_int_equal(n, size);
    w->len += n;
}

static void
wb_data(wbuf *w, int batched, uint64_t seq, const void *data, size_t len, int droppable)
{
    wb_data_ev(w, batched, seq, data, len, droppable, NULL);
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
 * [1] swp_decode_item_arena (arena on the heap, so ASan sees overruns).
 * The arena decoder's bytes fields point into the input (input, an
 * exact-size copy, kept until item_pair_free); swp_decode_item's own
 * their bytes. */
typedef struct item_pair {
    swp_item *m[2];
    swp_arena *arena;
    uint8_t *input;
} item_pair;

static void
item_pair_free(item_pair *p)
{
    swp_free(p->m[0]);
    if (p->m[1] != NULL)
        swp_free_arena(p->m[1], p->arena);
    free(p->arena);
    free(p->input);
    p->m[0] = p->m[1] = NULL;
    p->arena = NULL;
    p->input = NULL;
}

/* a and b (decoded messages) encode to the same bytes. */
static void
assert_same_encoding(const void *a, const void *b)
{
    size_t la, lb;
    uint8_t *ea = encode_msg(a, &la), *eb = encode_msg(b, &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(ea, eb, la);
    free(ea);
    free(eb);
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
    p->input = copy;
    r0 = swp_decode_item(copy, len, MAXLEN, &p->m[0]);
    if (r0 == SW_OK) {
        /* swp_decode_item's message owns its bytes: nothing points into the
         * input (checked with a poisoned copy, decoded again) */
        uint8_t *again = malloc(len ? len : 1);
        swp_item *m = NULL;
        assert_non_null(again);
        memcpy(again, copy, len);
        assert_int_equal(swp_decode_item(again, len, MAXLEN, &m), SW_OK);
        memset(again, 0xa5, len);
        free(again);
        assert_same_encoding(p->m[0], m);
        swp_free(m);
    }
    r1 = swp_decode_item_arena(copy, len, MAXLEN, p->arena, &p->m[1]);
    if (r0 != want || r1 != want)
        fail_msg("%s: swp_decode_item %s, swp_decode_item_arena %s, want %s", what, sw_err_name(r0),
                 sw_err_name(r1), sw_err_name(want));
    if (want != SW_OK) {
        assert_null(p->m[0]);
        assert_null(p->m[1]);
        free(p->arena);
        free(p->input);
        p->arena = NULL;
        p->input = NULL;
        return;
    }
    assert_non_null(p->m[0]);
    assert_non_null(p->m[1]);
    assert_same_encoding(p->m[0], p->m[1]);
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
        swp_hdr h = {RID, ID64, UINT32_MAX, 1, UINT32_MAX, UINT64_MAX};
        assert_non_null(out);
        assert_int_equal(swp_hdr_write(&h, out), SWP_HDR_MAX);
        free(out);
    }
    /* a longer instance id does not push it past the bound */
    {
        char longid[3 * SW_MAX_TOKEN + 1];
        uint8_t *out = malloc(SWP_HDR_MAX);
        swp_hdr h = {RID, NULL, UINT32_MAX, 1, UINT32_MAX, UINT64_MAX};
        assert_non_null(out);
        h.instance_id = repeat(longid, 'x', sizeof(longid) - 1);
        assert_true(swp_hdr_write(&h, out) <= SWP_HDR_MAX);
        free(out);
    }

    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        for (size_t c = 0; c < sizeof(windows) / sizeof(windows[0]); c++) {
            for (int resent = 0; resent <= 3; resent++) {
                /* resent 2 and 3: credit_window_max and credit_bytes too (a
                 * window's answer) */
                swp_hdr h = {
                    RID,
                    ids[i],
                    windows[c],
                    resent & 1,
                    resent >= 2 ? windows[sizeof(windows) / sizeof(windows[0]) - 1 - c] : 0,
                    resent >= 2 ? bodies[(i * 7 + c) % (sizeof(bodies) / sizeof(bodies[0]))] : 0};
                swp_item m;
                uint8_t out[SWP_HDR_MAX + 8], *packed;
                size_t n, plen;
                memset(out, 0xee, sizeof(out));
                n = swp_hdr_write(&h, out);
                assert_true(n <= SWP_HDR_MAX);
                for (size_t g = n; g < sizeof(out); g++)
                    assert_int_equal(out[g], 0xee);
                /* protobuf-c packs fields 1, 2, 9, 10, 11, 14, 16 in that order too */
                fill_item_base(&m);
                m.instance_id = (char *)(ids[i] ? ids[i] : "");
                m.credit_window = windows[c];
                m.resent = resent & 1;
                m.credit_window_max = h.credit_window_max;
                m.credit_bytes = h.credit_bytes;
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

/* swp_beats_write writes what protobuf-c packs from the same values, byte
 * for byte, within SWP_BEATS_MAX(n), for: no beats and SWP_MAX_BEATS;
 * last_seq 0 (not sent), one byte, two and ten; instance "" (not sent) and
 * the longest token; incarnation and counter 0 (not sent) or large. What
 * it writes decodes back to the same values. */
static void
test_beats_write(void **state)
{
    static uint8_t ids[SWP_MAX_BEATS][SW_REQUEST_ID_BYTES];
    static uint64_t last[SWP_MAX_BEATS];
    static swp_beat one[SWP_MAX_BEATS];
    static swp_beat *ptr[SWP_MAX_BEATS];
    static const uint64_t seqs[] = {0, 1, 127, 128, 16383, 16384, UINT64_MAX};
    static const size_t counts[] = {0, 1, 2, 7, SWP_MAX_BEATS};
    static const char *const insts[] = {"", "w1", ID64};
    (void)state;
    for (size_t i = 0; i < SWP_MAX_BEATS; i++) {
        swi_random(ids[i], SW_REQUEST_ID_BYTES);
        last[i] = seqs[i % (sizeof(seqs) / sizeof(seqs[0]))];
        streamwire__v1__stream_beat__init(&one[i]);
        one[i].request_id = bin(ids[i], SW_REQUEST_ID_BYTES);
        one[i].last_seq = last[i];
        ptr[i] = &one[i];
    }
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
        for (size_t s = 0; s < sizeof(insts) / sizeof(insts[0]); s++)
            for (int big = 0; big < 2; big++) {
                swp_beats m = STREAMWIRE__V1__HEARTBEAT_BATCH__INIT;
                size_t n = counts[c], want_len, len, bound = SWP_BEATS_MAX(n);
                uint8_t *want, *got = malloc(bound + 16);
                swp_beats *d = NULL;
                assert_non_null(got);
                memset(got, 0xee, bound + 16);
                m.version = SW_PROTOCOL_VERSION;
                m.instance_id = (char *)insts[s];
                m.incarnation = big ? UINT64_MAX - 5 : 0;
                m.counter = big ? (uint64_t)1 << 40 : 0;
                m.n_beats = n;
                m.beats = ptr;
                want = encode_msg(&m, &want_len);
                len = swp_beats_write(got, insts[s], m.incarnation, m.counter,
                                      (const uint8_t(*)[SW_REQUEST_ID_BYTES])ids, last, n);
                assert_int_equal(len, want_len);
                assert_memory_equal(got, want, len);
                assert_true(len <= bound);
                assert_int_equal(got[bound], 0xee); /* nothing past the bound */
                if (n != 0 && insts[s][0] != '\0') {
                    assert_int_equal(swp_decode_beats(got, len, 1 << 20, &d), SW_OK);
                    assert_int_equal(d->n_beats, n);
                    assert_string_equal(d->instance_id, insts[s]);
                    assert_int_equal(d->incarnation, m.incarnation);
                    assert_int_equal(d->counter, m.counter);
                    for (size_t i = 0; i < n; i++) {
                        assert_memory_equal(d->beats[i]->request_id.data, ids[i],
                                            SW_REQUEST_ID_BYTES);
                        assert_int_equal(d->beats[i]->last_seq, last[i]);
                    }
                    swp_free(d);
                }
                free(want);
                free(got);
            }
    {
        /* the bound, reached: the longest instance, every number at its
         * longest */
        static uint64_t top[SWP_MAX_BEATS];
        uint8_t *got = malloc(SWP_BEATS_MAX(SWP_MAX_BEATS));
        assert_non_null(got);
        for (size_t i = 0; i < SWP_MAX_BEATS; i++)
            top[i] = UINT64_MAX;
        assert_int_equal(swp_beats_write(got, ID64, UINT64_MAX, UINT64_MAX,
                                         (const uint8_t(*)[SW_REQUEST_ID_BYTES])ids, top,
                                         SWP_MAX_BEATS),
                         SWP_BEATS_MAX(SWP_MAX_BEATS));
        free(got);
    }
}

/* A StreamBeat as the worker writes it is read at once (proto/beats.c);
 * every other shape by the field loop. Each shape below, alone in a batch,
 * decodes to what protobuf-c makes of it: ok says whether it decodes, id
 * (0 or 1) which of two ids is the beat's, seq its last_seq. */
typedef struct beat_shape {
    const char *what;
    uint8_t b[48];
    size_t len;
    int ok, id;
    uint64_t seq;
} beat_shape;

#define ID_A 0x0a, 0x10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16
#define ID_B 0x0a, 0x10, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9

static void
test_beat_shapes(void **state)
{
    static const beat_shape shapes[] = {
        {"id only: last_seq 0", {ID_A}, 18, 1, 0, 0},
        {"id, last_seq", {ID_A, 0x10, 0x05}, 20, 1, 0, 5},
        {"id, last_seq of 10 bytes",
         {ID_A, 0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
         29,
         1,
         0,
         UINT64_MAX},
        {"id, last_seq 0 in two bytes", {ID_A, 0x10, 0x80, 0x00}, 21, 1, 0, 0},
        {"last_seq twice: the later wins", {ID_A, 0x10, 0x05, 0x10, 0x07}, 22, 1, 0, 7},
        {"id after last_seq: the later id wins", {ID_A, 0x10, 0x05, ID_B}, 38, 1, 1, 5},
        {"last_seq first", {0x10, 0x06, ID_A}, 20, 1, 0, 6},
        {"an unknown field after the id", {ID_A, 0x18, 0x09}, 20, 1, 0, 0},
        {"an unknown field after last_seq", {ID_A, 0x10, 0x05, 0x18, 0x09}, 22, 1, 0, 5},
        {"last_seq's tag alone", {ID_A, 0x10}, 19, 0, 0, 0},
        {"last_seq cut short", {ID_A, 0x10, 0x85}, 20, 0, 0, 0},
        {"last_seq of 11 bytes",
         {ID_A, 0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
         30,
         0,
         0,
         0},
        {"last_seq as fixed64", {ID_A, 0x11, 1, 2, 3, 4, 5, 6, 7, 8}, 27, 0, 0, 0},
        {"an id of 15 bytes",
         {0x0a, 0x0f, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0x10, 1},
         19,
         0,
         0,
         0},
        {"an id of 17 bytes",
         {0x0a, 0x11, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17},
         19,
         0,
         0,
         0},
    };
    static const uint8_t ids[2][SW_REQUEST_ID_BYTES] = {
        {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
        {9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9}};
    (void)state;
    for (size_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]); k++) {
        const beat_shape *sh = &shapes[k];
        /* version 1, instance "w1", the beat twice (both read the same
         * way), the last one at the end of a block of exactly the message's
         * size (ASan sees a read past it) */
        uint8_t m[128] = {0x08, 0x01, 0x12, 0x02, 'w', '1'}, *msg;
        size_t len = 6;
        swp_beats *d = NULL;
        Streamwire__V1__HeartbeatBatch *pb;
        for (int twice = 0; twice < 2; twice++) {
            m[len++] = 0x1a;
            m[len++] = (uint8_t)sh->len;
            memcpy(m + len, sh->b, sh->len);
            len += sh->len;
        }
        assert_non_null(msg = malloc(len));
        memcpy(msg, m, len);
        print_message("%s\n", sh->what);
        pb = streamwire__v1__heartbeat_batch__unpack(NULL, len, msg);
        if (!sh->ok) {
            assert_int_equal(swp_decode_beats(msg, len, MAXLEN, &d), SW_EPROTO);
            assert_null(d);
            if (pb != NULL) /* decodes, but the id is not 16 bytes */
                assert_int_not_equal(pb->beats[0]->request_id.len, SW_REQUEST_ID_BYTES);
            streamwire__v1__heartbeat_batch__free_unpacked(pb, NULL);
            free(msg);
            continue;
        }
        assert_non_null(pb);
        assert_int_equal(swp_decode_beats(msg, len, MAXLEN, &d), SW_OK);
        assert_string_equal(d->instance_id, "w1");
        assert_int_equal(d->n_beats, 2);
        for (size_t i = 0; i < 2; i++) {
            assert_memory_equal(d->beats[i]->request_id.data, ids[sh->id], SW_REQUEST_ID_BYTES);
            assert_int_equal(d->beats[i]->last_seq, sh->seq);
            assert_bin(pb->beats[i]->request_id, ids[sh->id], SW_REQUEST_ID_BYTES);
            assert_int_equal(pb->beats[i]->last_seq, sh->seq);
        }
        swp_free(d);
        streamwire__v1__heartbeat_batch__free_unpacked(pb, NULL);
        free(msg);
    }
}

/* More than SWP_MAX_BATCH batched items is refused before unpacking (a
 * hostile frontend-bound message cannot make the decoder allocate a struct
 * per two bytes); exactly SWP_MAX_BATCH decodes. */
static void
test_batch_count_cap(void **state)
{
    static const uint8_t id[SW_REQUEST_ID_BYTES] = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 1, 2, 3, 4, 5, 6};
    swp_hdr h = {id, NULL, 0, 0, 0, 0};
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

/* 4b. 250 items of 64 bytes, each with a 31-byte event name (strings: the
 * two passes): more than the arena holds, so the arena decoder puts the
 * message in one malloc'd block (freed by swp_free_arena: the ASan build
 * checks); the data fields still point into the input. */
#define EV_NAME "ev-padding-padding-padding-%03d"
static void
test_batch_large_arena_fallback(void **state)
{
    enum { NITEMS = 250, ITEM = 64 };
    char ev[40];
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
        snprintf(ev, sizeof(ev), EV_NAME, i);
        wb_data_ev(&w, i > 0, 1000 + 2 * (uint64_t)i, chunk, sizeof(chunk), i % 3 == 0, ev);
    }

    for (int round = 0; round < 2; round++) { /* the arena serves one message at a time */
        assert_int_equal(swp_decode_item_arena(w.b, w.len, MAXLEN, arena, &a), SW_OK);
        assert_non_null(a);
        /* 250 entries do not fit in the arena: the whole message is in one
         * block of its own, and every data field points into the input */
        assert_true(arena->hand);
        assert_true((uint8_t *)a < arena->buf || (uint8_t *)a >= arena->buf + SWP_ARENA_BYTES);
        outside = 0;
        assert_true(a->seq == 1000);
        fill_pattern(chunk, sizeof(chunk), 7, 0);
        assert_bin(a->data, chunk, sizeof(chunk));
        assert_true(a->data.data > w.b && a->data.data < w.b + w.len);
        assert_true(a->droppable);
        assert_int_equal(a->n_batch, NITEMS - 1);
        for (int i = 1; i < NITEMS; i++) {
            const swp_batched *b = a->batch[i - 1];
            if (b->data.data > w.b && b->data.data + b->data.len <= w.b + w.len)
                outside++; /* borrowed from the input */
            fill_pattern(chunk, sizeof(chunk), 7, (unsigned)i * 3);
            assert_true(b->seq == 1000 + 2 * (uint64_t)i);
            assert_bin(b->data, chunk, sizeof(chunk));
            assert_int_equal(!!b->droppable, i % 3 == 0);
            assert_false(b->complete_final);
            assert_null(b->terminal);
            snprintf(ev, sizeof(ev), EV_NAME, i);
            assert_string_equal(b->event, ev);
        }
        assert_int_equal(outside, NITEMS - 1);
        if (round == 0) {
            assert_int_equal(swp_decode_item(w.b, w.len, MAXLEN, &r), SW_OK);
            assert_same_encoding(a, r);
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
        /* what a final / batched data item may carry: a final no data, alone
         * as in a batch (the frontend would drop it) */
        {"final with data, no batch", "X", {5}, SW_EPROTO},
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
    assert_int_equal(rejected, 29);

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

/* 4c. The arena decoder by hand: a message in our encoders' form is built
 * in the arena with its data pointing into the input (no copy); one with
 * anything else (here an unknown field) goes through protobuf-c, which
 * copies. Both give what swp_decode_item gives. */
static void
test_item_in_place_or_protobuf_c(void **state)
{
    uint8_t chunk[100];
    (void)state;
    fill_pattern(chunk, sizeof(chunk), 3, 1);
    for (int unknown = 0; unknown < 2; unknown++) {
        wbuf w = {NULL, 0, 0};
        item_pair p;
        wb_hdr(&w, "inst-a", 0, 0);
        wb_data(&w, 0, 5, chunk, sizeof(chunk), 0);
        wb_data(&w, 1, 6, chunk, 10, 1);
        if (unknown)
            wb_raw(&w, "\xa0\x01\x05", 3); /* field 20, a varint */
        item_pair_decode(&p, w.b, w.len, SW_OK, unknown ? "unknown field" : "canonical");
        assert_int_equal(p.arena->hand, !unknown);
        assert_int_equal(p.m[1]->n_batch, 1);
        assert_bin(p.m[1]->data, chunk, sizeof(chunk));
        assert_bin(p.m[1]->batch[0]->data, chunk, 10);
        if (!unknown) {
            assert_true((uint8_t *)p.m[1] >= p.arena->buf &&
                        (uint8_t *)p.m[1] < p.arena->buf + SWP_ARENA_BYTES);
            assert_true(p.m[1]->data.data > p.input && p.m[1]->data.data < p.input + w.len);
            assert_true(p.m[1]->batch[0]->data.data > p.m[1]->data.data);
            assert_true(p.m[1]->batch[0]->data.data < p.input + w.len);
            assert_null(p.arena->block);
        } else {
            assert_true(p.m[1]->data.data < p.input || p.m[1]->data.data >= p.input + w.len);
            assert_int_equal(p.m[1]->base.n_unknown_fields, 1);
        }
        item_pair_free(&p);
        free(w.b);
    }
}

/* 4c''. A stalled stream's heartbeat wrapper as the worker's timer writes
 * it (through protobuf-c), with its replay defence (incarnation, counter):
 * canonical, so built by hand in the arena, and the same as what
 * swp_decode_item makes of it. */
static void
test_heartbeat_wrapper_in_place(void **state)
{
    swp_item m = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__INIT;
    swp_heartbeat h = STREAMWIRE__V1__HEARTBEAT__INIT;
    uint8_t rid[SW_REQUEST_ID_BYTES];
    item_pair p;
    uint8_t *b;
    size_t len;
    (void)state;
    fill_pattern(rid, sizeof(rid), 5, 3);
    m.version = SW_PROTOCOL_VERSION;
    m.request_id.data = rid;
    m.request_id.len = sizeof(rid);
    m.instance_id = (char *)"inst-a";
    m.body_case = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_HEARTBEAT;
    h.last_seq = 300;
    h.stalled = 1;
    h.incarnation = UINT64_MAX - 5;
    h.counter = 1234567;
    m.heartbeat = &h;
    b = encode_msg(&m, &len);
    item_pair_decode(&p, b, len, SW_OK, "stalled heartbeat");
    assert_int_equal(p.arena->hand, 1);
    for (int k = 0; k < 2; k++) {
        const swp_heartbeat *d = p.m[k]->heartbeat;
        assert_int_equal(p.m[k]->body_case, STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_HEARTBEAT);
        assert_int_equal(d->last_seq, 300);
        assert_true(d->stalled);
        assert_true(d->incarnation == UINT64_MAX - 5);
        assert_int_equal(d->counter, 1234567);
    }
    item_pair_free(&p);
    free(b);
}

/* 4c'. The one-pass path (proto/items.c, it_fast) takes a wrapper of
 * varint and bytes fields only, each once with its declared wire type;
 * anything else goes to the two passes (or protobuf-c), which decide it as
 * before. Each case: the result both decoders give, and whether the
 * message was built by hand in the arena. */
static void
test_item_one_pass_edges(void **state)
{
#define RID    \
    "\x12\x10" \
    "0123456789abcdef" /* request_id, 16 bytes */
#define CASE(what, lit, want, hand, seq)            \
    {                                               \
        what, lit, sizeof(lit) - 1, want, hand, seq \
    }
#define DATA   \
    "\x22\x03" \
    "abc" /* data */
    static const struct {
        const char *what;
        const char *b;
        size_t len;
        sw_err want;
        int hand;
        uint64_t seq;
    } cases[] = {
        CASE("plain item", "\x08\x01" RID "\x18\x07" DATA, SW_OK, 1, 7),
        CASE("every one-pass field",
             "\x08\x01" RID "\x18\x87\x01" DATA "\x30\x01\x50\x01\x58\x20\x70\x40\x80\x01\x80\x02",
             SW_OK, 1, 135),
        CASE("seq twice (protobuf-c: the last wins)", "\x08\x01" RID "\x18\x07" DATA "\x18\x09",
             SW_OK, 0, 9),
        CASE("data as a varint", "\x08\x01" RID "\x18\x07\x20\x03", SW_EPROTO, 0, 0),
        CASE("seq as bytes", "\x08\x01" RID "\x1a\x01\x07" DATA, SW_EPROTO, 0, 0),
        CASE("field 0", "\x08\x01" RID "\x18\x07" DATA "\x00\x01", SW_EPROTO, 0, 0),
        CASE("a final without its terminal", "\x08\x01" RID "\x18\x07\x38\x01", SW_EPROTO, 0, 0),
        CASE("data cut short",
             "\x08\x01" RID "\x18\x07\x22\x09"
             "abc",
             SW_EPROTO, 0, 0),
        CASE("no version", RID "\x18\x07" DATA, SW_EVERSION, 0, 0),
        CASE("an instance id (a string: two passes)",
             "\x08\x01" RID "\x18\x01" DATA "\x4a\x01"
             "i",
             SW_OK, 1, 1),
    };
#undef RID
#undef DATA
#undef CASE
    (void)state;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        item_pair p;
        item_pair_decode(&p, (const uint8_t *)cases[c].b, cases[c].len, cases[c].want,
                         cases[c].what);
        if (cases[c].want != SW_OK)
            continue;
        if (p.arena->hand != cases[c].hand)
            fail_msg("%s: built by hand %d, want %d", cases[c].what, p.arena->hand, cases[c].hand);
        assert_int_equal(p.m[1]->seq, cases[c].seq);
        assert_int_equal(p.m[1]->body_case, STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_DATA);
        assert_bin(p.m[1]->data, "abc", 3);
        assert_bin(p.m[1]->request_id, "0123456789abcdef", 16);
        if (c == 1) {
            assert_true(p.m[1]->droppable && p.m[1]->resent);
            assert_int_equal(p.m[1]->credit_window, 32);
            assert_int_equal(p.m[1]->credit_window_max, 64);
            assert_int_equal(p.m[1]->credit_bytes, 256);
        }
        if (p.arena->hand)
            assert_true(p.m[1]->data.data > p.input && p.m[1]->data.data < p.input + cases[c].len);
        item_pair_free(&p);
    }
}

/* 4e. The worker's request decoder (swp_decode_request_arena, by hand in
 * proto/items.c): a request as the frontend encodes it (every field, three
 * headers) is built in the arena with payload, request id and auth token
 * pointing into the input; anything else goes to protobuf-c; both give
 * what swp_decode_request gives (the same error, the same bytes again). */
typedef struct req_variant {
    const char *what;
    const char *tail; /* bytes appended to the canonical request */
    size_t tail_len;
    sw_err want;
    int hand;
} req_variant;

static void
test_request_in_place_or_protobuf_c(void **state)
{
    static const req_variant v[] = {
        {"canonical", "", 0, SW_OK, 1},
        {"an unknown field 20", "\xa0\x01\x05", 3, SW_OK, 0},
        {"router_id twice (protobuf-c: the last wins)", "\x22\x02r2", 4, SW_OK, 0},
        {"a header with an unknown field", "\x5a\x05\x0a\x01k\x18\x01", 7, SW_OK, 0},
        {"an empty header entry", "\x5a\x00", 2, SW_OK, 1},
        {"version 2 at the end (the last wins)", "\x08\x02", 2, SW_EVERSION, 0},
        {"credit_window as bytes", "\x32\x01\x01", 3, SW_EPROTO, 0},
        {"field 15 (an unopened seal)", "\x7a\x00", 2, SW_OK, 0},
        {"field 0", "\x00\x01", 2, SW_EPROTO, 0},
        {"cut short",
         "\x2a\x09"
         "ab",
         4, SW_EPROTO, 0},
    };
    static const char rid[16] = "0123456789abcdef";
    static const char *hk[3] = {"traceparent", "x-user", "x-empty"};
    static const char *hv[3] = {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "u1",
                                ""};
    uint8_t payload[300], token[5] = {1, 2, 3, 4, 5};
    swp_request m = STREAMWIRE__V1__REQUEST__INIT;
    Streamwire__V1__Request__HeadersEntry he[3], *hp[3];
    uint8_t *enc = NULL;
    size_t elen = 0;
    (void)state;
    fill_pattern(payload, sizeof(payload), 7, 3);
    m.version = SW_PROTOCOL_VERSION;
    m.request_id.data = (uint8_t *)rid;
    m.request_id.len = 16;
    m.response_subject = "sw.rsp.rtr-1.30313233343536373839616263646566";
    m.router_id = "rtr-1";
    m.payload.data = payload;
    m.payload.len = sizeof(payload);
    m.credit_window = 256;
    m.heartbeat_ms = 1000;
    m.deadline_ms = 30000;
    m.endpoint = "ns.comp.ep";
    m.max_tokens = 77;
    for (int i = 0; i < 3; i++) {
        streamwire__v1__request__headers_entry__init(&he[i]);
        he[i].key = (char *)hk[i];
        he[i].value = (char *)hv[i];
        hp[i] = &he[i];
    }
    m.n_headers = 3;
    m.headers = hp;
    m.resume_from_seq = 1ull << 40;
    m.migratable = 1;
    m.issued_unix_ms = 1790000000000ull;
    m.auth_token.data = token;
    m.auth_token.len = sizeof(token);
    m.credit_window_max = 4096;
    m.credit_bytes = 1u << 20;
    m.idle_heartbeat_ms = 5000;
    assert_int_equal(swp_encode_alloc(&m, MAXLEN, &enc, &elen), SW_OK);
    for (size_t c = 0; c < sizeof(v) / sizeof(v[0]); c++) {
        size_t len = elen + v[c].tail_len;
        uint8_t *in = malloc(len);
        swp_arena *a = malloc(sizeof(*a));
        swp_request *r0 = NULL, *r1 = (swp_request *)(uintptr_t)1;
        sw_err e0, e1;
        assert_non_null(in);
        assert_non_null(a);
        memcpy(in, enc, elen);
        memcpy(in + elen, v[c].tail, v[c].tail_len);
        e0 = swp_decode_request(in, len, MAXLEN, &r0);
        e1 = swp_decode_request_arena(in, len, MAXLEN, a, &r1);
        if (e0 != v[c].want || e1 != v[c].want)
            fail_msg("%s: swp_decode_request %s, swp_decode_request_arena %s, want %s", v[c].what,
                     sw_err_name(e0), sw_err_name(e1), sw_err_name(v[c].want));
        if (v[c].want != SW_OK) {
            assert_null(r0);
            assert_null(r1);
        } else {
            if (a->hand != v[c].hand)
                fail_msg("%s: built by hand %d, want %d", v[c].what, a->hand, v[c].hand);
            assert_same_encoding(r0, r1);
            assert_int_equal(r1->n_headers, c == 3 || c == 4 ? 4 : 3);
            for (int i = 0; i < 3; i++) {
                assert_string_equal(r1->headers[i]->key, hk[i]);
                assert_string_equal(r1->headers[i]->value, i == 2 ? "" : hv[i]);
            }
            assert_string_equal(r1->router_id, c == 2 ? "r2" : "rtr-1");
            assert_string_equal(r1->endpoint, "ns.comp.ep");
            assert_bin(r1->payload, payload, sizeof(payload));
            assert_bin(r1->auth_token, token, sizeof(token));
            assert_int_equal(r1->resume_from_seq, 1ull << 40);
            assert_int_equal(r1->issued_unix_ms, 1790000000000ull);
            assert_true(r1->migratable);
            assert_int_equal(r1->credit_window_max, 4096);
            assert_int_equal(r1->idle_heartbeat_ms, 5000);
            if (a->hand) {
                /* in place: the bytes fields point into the input */
                assert_true(r1->payload.data > in && r1->payload.data < in + len);
                assert_true(r1->request_id.data > in && r1->request_id.data < in + len);
                assert_true(r1->auth_token.data > in && r1->auth_token.data < in + len);
                assert_true((uint8_t *)r1 >= a->buf && (uint8_t *)r1 < a->buf + SWP_ARENA_BYTES);
                assert_null(a->block);
            }
            swp_free_arena(r1, a);
        }
        swp_free(r0);
        free(a);
        free(in);
    }
    free(enc);
}

/* A canonical request larger than the arena (seven 4 KiB header values)
 * takes one malloc'd block, and is still built by hand. */
static void
test_request_large_block(void **state)
{
    char big[7][SWP_MAX_HEADER_VALUE + 1];
    swp_request m = STREAMWIRE__V1__REQUEST__INIT;
    Streamwire__V1__Request__HeadersEntry he[7], *hp[7];
    uint8_t *enc = NULL;
    size_t elen = 0;
    swp_arena *a = malloc(sizeof(*a));
    swp_request *r = NULL;
    static const char rid[16] = "0123456789abcdef";
    (void)state;
    assert_non_null(a);
    m.version = SW_PROTOCOL_VERSION;
    m.request_id.data = (uint8_t *)rid;
    m.request_id.len = 16;
    m.response_subject = "sw.rsp.r.30313233343536373839616263646566";
    m.router_id = "r";
    for (int i = 0; i < 7; i++) {
        memset(big[i], 'a' + i, SWP_MAX_HEADER_VALUE);
        big[i][SWP_MAX_HEADER_VALUE] = '\0';
        streamwire__v1__request__headers_entry__init(&he[i]);
        he[i].key = "k";
        he[i].value = big[i];
        hp[i] = &he[i];
    }
    m.n_headers = 7;
    m.headers = hp;
    assert_int_equal(swp_encode_alloc(&m, MAXLEN, &enc, &elen), SW_OK);
    assert_int_equal(swp_decode_request_arena(enc, elen, MAXLEN, a, &r), SW_OK);
    assert_true(a->hand);
    assert_non_null(a->block);
    assert_true((uint8_t *)r == (uint8_t *)a->block);
    assert_true(elen > SWP_ARENA_BYTES);
    for (int i = 0; i < 7; i++)
        assert_string_equal(r->headers[i]->value, big[i]);
    swp_free_arena(r, a);
    /* one byte over the header value limit: refused by the checks, freed */
    big[1][SWP_MAX_HEADER_VALUE - 1] = 'z';
    free(enc);
    enc = NULL;
    {
        char over[SWP_MAX_HEADER_VALUE + 2];
        memset(over, 'o', SWP_MAX_HEADER_VALUE + 1);
        over[SWP_MAX_HEADER_VALUE + 1] = '\0';
        he[1].value = over;
        assert_int_equal(swp_encode_alloc(&m, MAXLEN, &enc, &elen), SW_OK);
        r = (swp_request *)(uintptr_t)1;
        assert_int_equal(swp_decode_request_arena(enc, elen, MAXLEN, a, &r), SW_EPROTO);
        assert_null(r);
        assert_null(a->block);
    }
    free(enc);
    free(a);
}

/* 4f. The frontend's request encoder (swp_request_encode_alloc) writes
 * byte for byte what protobuf-c packs, for requests with every field 0 or
 * set, empty and set strings, bytes and header entries (a fixed
 * pseudo-random walk over 3,000 of them); it refuses a sealed one and
 * keeps to max. */
static uint32_t
lcg(uint32_t *x)
{
    *x = *x * 1103515245u + 12345u;
    return *x >> 8;
}

static void
test_request_encoder_matches_protobuf_c(void **state)
{
    static const char *strs[] = {"", "a", "rtr-1", "ns.comp.ep",
                                 "sw.rsp.rtr-1.30313233343536373839616263646566"};
    static const uint64_t nums[] = {0, 1, 127, 128, 300, 0xffffffffu, 1ull << 40, UINT64_MAX};
    uint8_t bytes[200];
    uint32_t x = 12345;
    (void)state;
    fill_pattern(bytes, sizeof(bytes), 5, 9);
    for (int round = 0; round < 3000; round++) {
        swp_request m = STREAMWIRE__V1__REQUEST__INIT;
        Streamwire__V1__Request__HeadersEntry he[4], *hp[4];
        uint8_t *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
#define PICK_S() strs[lcg(&x) % (sizeof(strs) / sizeof(strs[0]))]
#define PICK_N() nums[lcg(&x) % (sizeof(nums) / sizeof(nums[0]))]
#define PICK_B(f)                                                   \
    do {                                                            \
        size_t l_ = lcg(&x) % 3 == 0 ? 0 : lcg(&x) % sizeof(bytes); \
        m.f.data = l_ ? bytes : NULL;                               \
        m.f.len = l_;                                               \
    } while (0)
        m.version = (uint32_t)PICK_N();
        PICK_B(request_id);
        m.response_subject = (char *)PICK_S();
        m.router_id = (char *)PICK_S();
        PICK_B(payload);
        m.credit_window = (uint32_t)PICK_N();
        m.heartbeat_ms = (uint32_t)PICK_N();
        m.deadline_ms = (uint32_t)PICK_N();
        m.endpoint = (char *)PICK_S();
        m.max_tokens = (uint32_t)PICK_N();
        m.n_headers = lcg(&x) % 5;
        for (size_t i = 0; i < m.n_headers; i++) {
            streamwire__v1__request__headers_entry__init(&he[i]);
            he[i].key = (char *)PICK_S();
            he[i].value = (char *)PICK_S();
            hp[i] = &he[i];
        }
        m.headers = m.n_headers ? hp : NULL;
        m.resume_from_seq = PICK_N();
        m.migratable = lcg(&x) % 2;
        m.issued_unix_ms = PICK_N();
        PICK_B(auth_token);
        m.credit_window_max = (uint32_t)PICK_N();
        m.credit_bytes = PICK_N();
        m.idle_heartbeat_ms = (uint32_t)PICK_N();
#undef PICK_S
#undef PICK_N
#undef PICK_B
        assert_int_equal(swp_encode_alloc(&m, SIZE_MAX, &b, &nb), SW_OK);
        assert_int_equal(swp_request_encode_alloc(&m, SIZE_MAX, &a, &na), SW_OK);
        if (na != nb || memcmp(a, b, na) != 0)
            fail_msg("round %d: the hand encoder wrote %zu bytes, protobuf-c %zu", round, na, nb);
        free(a);
        a = NULL;
        if (nb > 0)
            assert_int_equal(swp_request_encode_alloc(&m, nb - 1, &a, &na), SW_EMSGSIZE);
        assert_null(a);
        free(b);
    }
    {
        swp_request m = STREAMWIRE__V1__REQUEST__INIT;
        Streamwire__V1__Sealed sealed = STREAMWIRE__V1__SEALED__INIT;
        uint8_t *a = NULL;
        size_t na = 0;
        m.sealed = &sealed;
        assert_int_equal(swp_request_encode_alloc(&m, SIZE_MAX, &a, &na), SW_EINVAL);
        assert_null(a);
        assert_int_equal(swp_request_encode_alloc(NULL, SIZE_MAX, &a, &na), SW_EINVAL);
    }
}

/* 4e'. A batch in one pass (proto/items.c it_fast): a full batch of 64 B
 * entries without strings or terminals is built in the arena (the
 * wrapper, its entries right after it, then their pointers), every data
 * field pointing into the input, the same as protobuf-c decodes it. An
 * entry the one pass does not take leaves the message to the two passes
 * (an event, a final and its terminal) or to protobuf-c (a field twice, an
 * unknown field), with the same result either way; one entry too many is
 * refused by both. */
static void
test_batch_one_pass(void **state)
{
#define TAIL(lit) lit, sizeof(lit) - 1
    static const struct {
        const char *what;
        const char *tail; /* one more batch entry: its body */
        size_t tail_len;
        sw_err want;
        int hand, one_pass;
    } v[] = {
        {"no more", NULL, 0, SW_OK, 1, 1},
        {"an entry with an event (a string: two passes)",
         TAIL("\x18\xd0\x0f\x22\x01x\x6a\x02"
              "ev"),
         SW_OK, 1, 0},
        {"a final entry and its terminal (two passes)",
         TAIL("\x18\xd0\x0f\x38\x01\x42\x02\x08\x01"), SW_OK, 1, 0},
        {"an entry with its seq twice (protobuf-c)", TAIL("\x18\xcf\x0f\x22\x01x\x18\xd0\x0f"),
         SW_OK, 0, 0},
        {"an entry with an unknown field (protobuf-c)", TAIL("\x18\xd0\x0f\x22\x01x\x28\x01"),
         SW_OK, 0, 0},
        {"data as a varint", TAIL("\x18\xd0\x0f\x20\x01"), SW_EPROTO, 0, 0},
        {"an entry whose seq goes back", TAIL("\x18\x01\x22\x01x"), SW_EPROTO, 0, 0},
    };
#undef TAIL
    enum { ITEM = 64 };
    uint8_t chunk[ITEM];
    (void)state;
    for (size_t c = 0; c < sizeof(v) / sizeof(v[0]); c++) {
        for (int full = 0; full < 2; full++) {
            /* the wrapper's own item, 255 entries and the case's (256
             * entries in all; seqs from 1000, the case's 2000), or one
             * more entry than a batch may hold */
            size_t nb = full ? SWP_MAX_BATCH + 1 : SWP_MAX_BATCH;
            wbuf w = {NULL, 0, 0};
            item_pair p;
            sw_err want = full ? SW_EPROTO : v[c].want;
            if (v[c].tail == NULL)
                nb++; /* the case adds none: fill the batch with data */
            wb_hdr(&w, "", 0, 0);
            for (size_t i = 0; i < nb; i++) {
                fill_pattern(chunk, sizeof(chunk), 5, (unsigned)i);
                wb_data(&w, i > 0, 1000 + i, chunk, sizeof(chunk), i % 5 == 0);
            }
            if (v[c].tail != NULL) {
                wb_prefix(&w, v[c].tail_len);
                wb_raw(&w, v[c].tail, v[c].tail_len);
            }
            item_pair_decode(&p, w.b, w.len, want, v[c].what);
            free(w.b);
            if (want != SW_OK) {
                item_pair_free(&p);
                continue;
            }
            if (p.arena->hand != v[c].hand)
                fail_msg("%s: built by hand %d, want %d", v[c].what, p.arena->hand, v[c].hand);
            assert_int_equal(p.m[1]->n_batch, SWP_MAX_BATCH);
            assert_int_equal(p.m[1]->seq, 1000);
            if (p.arena->hand) {
                /* in the arena, every data field in place */
                const uint8_t *first = (const uint8_t *)p.m[1]->batch[0];
                size_t wb = (sizeof(swp_item) + 15) & ~(size_t)15;
                assert_null(p.arena->block);
                assert_ptr_equal(p.m[1], p.arena->buf);
                if ((first == p.arena->buf + wb) != v[c].one_pass)
                    fail_msg("%s: one pass %d, want %d", v[c].what, first == p.arena->buf + wb,
                             v[c].one_pass);
                for (size_t i = 0; i + 1 < nb; i++) {
                    const swp_batched *b = p.m[1]->batch[i];
                    fill_pattern(chunk, sizeof(chunk), 5, (unsigned)i + 1);
                    assert_int_equal(b->seq, 1001 + i);
                    assert_bin(b->data, chunk, sizeof(chunk));
                    assert_true(b->data.data > p.input && b->data.data < p.input + w.len);
                    assert_int_equal(!!b->droppable, (i + 1) % 5 == 0);
                    assert_string_equal(b->event, "");
                }
            }
            item_pair_free(&p);
        }
    }
}

/* 4d. The allocation bound holds for what the decoder by hand accepts
 * without asking codec.c's walk (proto/items.c): the densest valid message
 * in our form (found by an independent review) is a non-final wrapper with
 * a terminal and an Error (not checked on a data item), 255 batched entries
 * of an explicit seq, empty data and empty event, and a failed final with
 * an Error: protobuf-c (estimated) would take under len + 56 KiB, within
 * SWP_ALLOC_FACTOR x len + SWP_ALLOC_SLACK. */
static void
test_item_densest_valid_within_bound(void **state)
{
    static const uint8_t term[] = {0x42, 0x06, 0x08, 0x03, 0x1a, 0x02, 0x08, 0x01};
    wbuf w = {NULL, 0, 0};
    item_pair p;
    size_t est;
    (void)state;
    wb_hdr(&w, "inst-a", 0, 0);
    wb_raw(&w, "\x18\x01\x22\x00\x6a\x00", 6); /* seq 1, empty data, empty event */
    wb_raw(&w, term, sizeof(term));
    for (uint64_t q = 2; q <= SWP_MAX_BATCH; q++) {
        uint8_t e[16];
        size_t n = 0;
        e[n++] = 0x18;
        n += swp_varint_write(e + n, q);
        memcpy(e + n, "\x22\x00\x6a\x00", 4);
        n += 4;
        wb_prefix(&w, n);
        wb_raw(&w, e, n);
    }
    {
        uint8_t e[32];
        size_t n = 0;
        e[n++] = 0x18;
        n += swp_varint_write(e + n, SWP_MAX_BATCH + 1);
        e[n++] = 0x38; /* complete_final */
        e[n++] = 0x01;
        memcpy(e + n, term, sizeof(term));
        n += sizeof(term);
        wb_prefix(&w, n);
        wb_raw(&w, e, n);
    }
    item_pair_decode(&p, w.b, w.len, SW_OK, "densest");
    assert_int_equal(p.m[1]->n_batch, SWP_MAX_BATCH);
    assert_true(p.arena->hand);
    assert_non_null(p.m[1]->terminal);
    assert_true(p.m[1]->batch[SWP_MAX_BATCH - 1]->complete_final);
    est = swp_alloc_estimate(&streamwire__v1__stream_item_wrapper__descriptor, w.b, w.len);
    assert_true(est <= SWP_ALLOC_FACTOR * w.len + SWP_ALLOC_SLACK);
    assert_true(est < w.len + 56 * 1024);
    item_pair_free(&p);
    /* one more entry is past the cap: refused by both */
    wb_data(&w, 1, SWP_MAX_BATCH + 2, "", 0, 0);
    item_pair_decode(&p, w.b, w.len, SW_EPROTO, "past the cap");
    free(w.b);
}

/* Tests from a mutation-testing pass (session 41): each fails with a
 * mutant of the module that every test before it let live. */

/* A batch entry whose first field is a bytes field with a length past the
 * entry (22 18: field 4, 24 bytes, with 1 byte left) is malformed: both
 * decoders refuse it. The one-pass decoder must stop at the failed read,
 * not go on at the length byte, which here reads as a valid `seq` (18 02)
 * (kills items.c:442 `pb_rd_next(...) != 0 || f.num > IT_MAX_FIELD` ->
 * `&&`: the entry was taken as {data: empty, seq: 2}). */
static void
test_hand_batched_truncated_bytes_refused(void **state)
{
    static const uint8_t msg[] = {
        0x08, 0x01,                                                                 /* version 1 */
        0x12, 0x10, 1,    2,    3,    4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, /* request_id */
        0x18, 0x01,                                                                 /* seq 1 */
        0x22, 0x00,                   /* data: empty */
        0x62, 0x03, 0x22, 0x18, 0x02, /* batch: [22 18 02] */
    };
    item_pair p;
    (void)state;
    item_pair_decode(&p, msg, sizeof(msg), SW_EPROTO,
                     "batch entry with a bytes length past its end");
}

/* A message of exactly max bytes is within the limit, for the arena
 * decoders as for swp_decode_item (kills items.c:502 `len > max` -> `>=`). */
static void
test_hand_exactly_max_accepted(void **state)
{
    static const uint8_t msg[] = {
        0x08, 0x01, 0x12, 0x10, 1,  2,  3,  4,    5,    6,    7,    8,   9,
        10,   11,   12,   13,   14, 15, 16, 0x18, 0x01, 0x22, 0x02, 'h', 'i',
    };
    swp_arena *a = malloc(sizeof(*a));
    swp_item *w = NULL;
    swp_item *m = NULL;
    (void)state;
    assert_non_null(a);
    assert_int_equal(swp_decode_item(msg, sizeof(msg), sizeof(msg), &m), SW_OK);
    swp_free(m);
    assert_int_equal(swp_decode_item_arena(msg, sizeof(msg), sizeof(msg), a, &w), SW_OK);
    assert_int_equal(w->seq, 1);
    swp_free_arena(w, a);
    assert_int_equal(swp_decode_item_arena(msg, sizeof(msg), sizeof(msg) - 1, a, &w), SW_EMSGSIZE);
    free(a);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hand_header_data_body),
        cmocka_unit_test(test_data_body_matches_protobuf_c),
        cmocka_unit_test(test_hand_header_and_prefix_bounds),
        cmocka_unit_test(test_batch_decode),
        cmocka_unit_test(test_batch_large_arena_fallback),
        cmocka_unit_test(test_item_in_place_or_protobuf_c),
        cmocka_unit_test(test_heartbeat_wrapper_in_place),
        cmocka_unit_test(test_item_densest_valid_within_bound),
        cmocka_unit_test(test_batch_count_cap),
        cmocka_unit_test(test_beats),
        cmocka_unit_test(test_beat_shapes),
        cmocka_unit_test(test_beats_write),
        cmocka_unit_test(test_batch_rules_rejected),
        cmocka_unit_test(test_final_body_round_trip),
        cmocka_unit_test(test_item_one_pass_edges),
        cmocka_unit_test(test_batch_one_pass),
        cmocka_unit_test(test_request_in_place_or_protobuf_c),
        cmocka_unit_test(test_request_large_block),
        cmocka_unit_test(test_request_encoder_matches_protobuf_c),
        cmocka_unit_test(test_hand_batched_truncated_bytes_refused),
        cmocka_unit_test(test_hand_exactly_max_accepted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
