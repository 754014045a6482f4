/* tests/unit/test_ring.c -- the worker's per-stream resend ring
 * (ingress/ring.c), a pure state machine: driven directly, no server, no
 * threads. Cases marked "issue 11" pin today's behaviour where it is a known
 * defect; the comment says what should change. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ingress/ring.h"

/* A malloc'd body "b<seq>". */
static uint8_t *
body(uint64_t seq, size_t *len)
{
    char tmp[32];
    int n = snprintf(tmp, sizeof(tmp), "b%llu", (unsigned long long)seq);
    uint8_t *p = malloc((size_t)n);
    assert_non_null(p);
    memcpy(p, tmp, (size_t)n);
    *len = (size_t)n;
    return p;
}

/* Keeps seq (assigning it as the responder does) and asserts it worked. */
static void
keep(swn_ring *g, uint64_t seq)
{
    size_t len;
    uint8_t *b = body(seq, &len);
    assert_int_equal(swn_ring_keep(g, seq, b, len, 0), SW_OK);
    free(b); /* the ring keeps a copy */
    if (seq >= g->next_seq)
        g->next_seq = seq + 1;
}

/* Asserts seq is kept with its own body. */
static void
assert_kept(const swn_ring *g, uint64_t seq)
{
    char want[32];
    size_t len = 0;
    const uint8_t *p = swn_ring_get(g, seq, &len, NULL);
    int n = snprintf(want, sizeof(want), "b%llu", (unsigned long long)seq);
    assert_non_null(p);
    assert_int_equal(len, (size_t)n);
    assert_memory_equal(p, want, (size_t)n);
}

static unsigned
count_kept(const swn_ring *g, uint64_t from, uint64_t to)
{
    unsigned n = 0;
    for (uint64_t q = from; q <= to; q++)
        n += swn_ring_get(g, q, NULL, NULL) != NULL;
    return n;
}

/* Without flow control nothing is kept; counters still work. */
static void
test_no_window(void **state)
{
    swn_ring g;
    uint8_t b[1] = {0};
    (void)state;
    assert_int_equal(swn_ring_init(&g, 0), 0);
    assert_false(swn_ring_keeps(&g));
    assert_int_equal(g.next_seq, 1);
    assert_int_equal(g.pub_seq, 0);
    assert_int_equal(g.acked, 0);
    assert_int_equal(swn_ring_keep(&g, 1, b, 1, 0), SW_ENOMEM);
    assert_null(swn_ring_get(&g, 1, NULL, NULL));
    g.next_seq = 4;
    g.pub_seq = 3; /* without a window items go out at once */
    assert_int_equal(swn_ring_ack(&g, 2), 2);
    assert_int_equal(g.acked, 2);
    {
        uint64_t f = 1, t = 3;
        g.pub_seq = 3;
        assert_int_equal(swn_ring_resend_range(&g, &f, &t), 0);
    }
    swn_ring_free(&g);
}

/* The initial size: min(window + 1, SWN_RING_MIN). */
static void
test_initial_cap(void **state)
{
    swn_ring g;
    (void)state;
    assert_int_equal(swn_ring_init(&g, 4), 0);
    assert_true(swn_ring_keeps(&g));
    assert_int_equal(g.cap, 5);
    swn_ring_free(&g);
    assert_int_equal(swn_ring_init(&g, 1000), 0);
    assert_int_equal(g.cap, SWN_RING_MIN);
    swn_ring_free(&g);
    assert_null(g.slot);
}

/* Keep and read back, in order, with the lose flag. */
static void
test_keep_read_back(void **state)
{
    swn_ring g;
    size_t len;
    int lose = -1;
    uint8_t *b;
    (void)state;
    assert_int_equal(swn_ring_init(&g, 8), 0);
    for (uint64_t q = 1; q <= 5; q++)
        keep(&g, q);
    b = body(6, &len);
    assert_int_equal(swn_ring_keep(&g, 6, b, len, 1), SW_OK);
    free(b);
    g.next_seq = 7;
    for (uint64_t q = 1; q <= 6; q++)
        assert_kept(&g, q);
    assert_non_null(swn_ring_get(&g, 6, NULL, &lose));
    assert_int_equal(lose, 1);
    assert_non_null(swn_ring_get(&g, 5, NULL, &lose));
    assert_int_equal(lose, 0);
    assert_null(swn_ring_get(&g, 7, NULL, NULL));
    assert_null(swn_ring_get(&g, 0, NULL, NULL));
    assert_true(swn_ring_queued(&g));
    g.pub_seq = 6;
    assert_false(swn_ring_queued(&g));
    swn_ring_free(&g);
}

/* The same seq twice: the slot is taken, the first body stays. */
static void
test_keep_twice(void **state)
{
    swn_ring g;
    uint8_t other[3] = {'x', 'y', 'z'};
    (void)state;
    assert_int_equal(swn_ring_init(&g, 8), 0);
    keep(&g, 1);
    assert_int_equal(swn_ring_keep(&g, 1, other, sizeof(other), 0), SW_ENOMEM);
    assert_kept(&g, 1);
    swn_ring_free(&g);
}

/* Growth doubles up to window + 1 and keeps every item at its place. */
static void
test_growth_to_window_plus_one(void **state)
{
    swn_ring g;
    (void)state;
    assert_int_equal(swn_ring_init(&g, 40), 0);
    assert_int_equal(g.cap, 16);
    for (uint64_t q = 1; q <= 16; q++)
        keep(&g, q);
    assert_int_equal(g.cap, 16);
    keep(&g, 17);
    assert_int_equal(g.cap, 32);
    for (uint64_t q = 18; q <= 41; q++)
        keep(&g, q);
    assert_int_equal(g.cap, 41); /* 64 clamped to window + 1 */
    for (uint64_t q = 1; q <= 41; q++)
        assert_kept(&g, q);
    assert_int_equal(count_kept(&g, 1, 100), 41);
    swn_ring_free(&g);
}

/* The memory bound: never more than window + 1 unacked items. */
static void
test_memory_bound(void **state)
{
    swn_ring g;
    size_t len;
    uint8_t *b;
    (void)state;
    assert_int_equal(swn_ring_init(&g, 3), 0);
    for (uint64_t q = 1; q <= 4; q++)
        keep(&g, q);
    b = body(5, &len);
    assert_int_equal(swn_ring_keep(&g, 5, b, len, 0), SW_ENOMEM);
    assert_int_equal(g.cap, 4);
    assert_int_equal(count_kept(&g, 1, 5), 4);
    /* After an ack (of an item that went out) the freed slot takes the
     * next item. */
    g.pub_seq = 4;
    assert_int_equal(swn_ring_ack(&g, 1), 1);
    assert_int_equal(swn_ring_keep(&g, 5, b, len, 0), SW_OK);
    free(b);
    g.next_seq = 6;
    assert_int_equal(g.cap, 4);
    for (uint64_t q = 2; q <= 5; q++)
        assert_kept(&g, q);
    swn_ring_free(&g);
}

/* The ring holds at most window + 1 items past acked and refuses more.
 * (Issue 11 #12: a CREDIT with a huge limit used to get a sender this far,
 * and send failed with SW_ENOMEM; control.c now clamps every credit limit
 * to acked + window, tested end to end by test_hostile.) */
static void
test_keep_beyond_credit_window(void **state)
{
    swn_ring g;
    size_t len;
    uint8_t *b;
    (void)state;
    assert_int_equal(swn_ring_init(&g, 2), 0);
    keep(&g, 1);
    keep(&g, 2);
    keep(&g, 3);
    b = body(4, &len);
    assert_int_equal(swn_ring_keep(&g, 4, b, len, 0), SW_ENOMEM);
    free(b);
    b = body(100, &len);
    assert_int_equal(swn_ring_keep(&g, 100, b, len, 0), SW_ENOMEM);
    free(b);
    swn_ring_free(&g);
}

/* An ack frees up to it, in order, and nothing else. */
static void
test_ack_releases(void **state)
{
    swn_ring g;
    (void)state;
    assert_int_equal(swn_ring_init(&g, 8), 0);
    for (uint64_t q = 1; q <= 6; q++)
        keep(&g, q);
    g.pub_seq = 6;
    assert_int_equal(swn_ring_ack(&g, 3), 3);
    assert_int_equal(g.acked, 3);
    assert_int_equal(count_kept(&g, 1, 3), 0);
    for (uint64_t q = 4; q <= 6; q++)
        assert_kept(&g, q);
    assert_int_equal(swn_ring_ack(&g, 6), 6);
    assert_int_equal(count_kept(&g, 1, 6), 0);
    swn_ring_free(&g);
}

/* An ack that goes backwards (or repeats) changes nothing. */
static void
test_ack_backwards(void **state)
{
    swn_ring g;
    (void)state;
    assert_int_equal(swn_ring_init(&g, 8), 0);
    for (uint64_t q = 1; q <= 5; q++)
        keep(&g, q);
    g.pub_seq = 5;
    assert_int_equal(swn_ring_ack(&g, 3), 3);
    assert_int_equal(swn_ring_ack(&g, 1), 1);
    assert_int_equal(g.acked, 3);
    assert_int_equal(swn_ring_ack(&g, 3), 3);
    assert_int_equal(g.acked, 3);
    assert_int_equal(count_kept(&g, 4, 5), 2);
    swn_ring_free(&g);
}

/* An ack beyond next_seq - 1 is clamped to it. */
static void
test_ack_beyond_next_seq(void **state)
{
    swn_ring g;
    (void)state;
    assert_int_equal(swn_ring_init(&g, 8), 0);
    for (uint64_t q = 1; q <= 4; q++)
        keep(&g, q);
    g.pub_seq = 4;
    assert_int_equal(swn_ring_ack(&g, UINT64_MAX), 4);
    assert_int_equal(g.acked, 4);
    assert_int_equal(count_kept(&g, 1, 4), 0);
    /* The next item still fits: nothing beyond what exists was released. */
    keep(&g, 5);
    assert_kept(&g, 5);
    swn_ring_free(&g);
}

/* Issue 11 #12 (this test pinned the defect before its fix): an ack is
 * clamped to what went out, so it never frees an item that is queued and
 * was never published. Items copied into a message that is being
 * published (`built`) may be acked: their bodies are in the message. */
static void
test_ack_beyond_pub_seq(void **state)
{
    swn_ring g;
    uint64_t f = 1, t = 5;
    (void)state;
    assert_int_equal(swn_ring_init(&g, 8), 0);
    for (uint64_t q = 1; q <= 5; q++)
        keep(&g, q);
    g.pub_seq = 2;
    assert_int_equal(swn_ring_ack(&g, 5), 2);
    assert_int_equal(g.acked, 2);
    assert_int_equal(count_kept(&g, 1, 2), 0);
    for (uint64_t q = 3; q <= 5; q++)
        assert_kept(&g, q); /* queued items stay */
    assert_true(swn_ring_queued(&g));
    assert_int_equal(swn_ring_resend_range(&g, &f, &t), 0); /* nothing of them went out */
    g.built = 4;                                            /* 3..4 are in a message on its way */
    assert_int_equal(swn_ring_ack(&g, 5), 4);
    assert_int_equal(count_kept(&g, 3, 4), 0);
    assert_kept(&g, 5);
    swn_ring_free(&g);
}

/* Resend ranges: inside, partly outside, entirely outside what is kept. */
static void
test_resend_ranges(void **state)
{
    swn_ring g;
    uint64_t f, t;
    (void)state;
    assert_int_equal(swn_ring_init(&g, 16), 0);
    for (uint64_t q = 1; q <= 10; q++)
        keep(&g, q);
    g.pub_seq = 8;
    (void)swn_ring_ack(&g, 3);
    /* inside */
    f = 5, t = 7;
    assert_int_equal(swn_ring_resend_range(&g, &f, &t), 1);
    assert_int_equal(f, 5);
    assert_int_equal(t, 7);
    assert_int_equal(count_kept(&g, f, t), 3);
    /* partly below acked, partly beyond pub_seq */
    f = 1, t = 10;
    assert_int_equal(swn_ring_resend_range(&g, &f, &t), 1);
    assert_int_equal(f, 4);
    assert_int_equal(t, 8);
    for (uint64_t q = f; q <= t; q++)
        assert_kept(&g, q);
    /* entirely acked */
    f = 1, t = 3;
    assert_int_equal(swn_ring_resend_range(&g, &f, &t), 0);
    /* entirely queued (not published yet) */
    f = 9, t = 10;
    assert_int_equal(swn_ring_resend_range(&g, &f, &t), 0);
    /* entirely beyond anything assigned */
    f = 50, t = UINT64_MAX;
    assert_int_equal(swn_ring_resend_range(&g, &f, &t), 0);
    /* reversed */
    f = 7, t = 5;
    assert_int_equal(swn_ring_resend_range(&g, &f, &t), 0);
    swn_ring_free(&g);
}

/* issue 11: the peer-chosen resend range is only clamped to acked+1 ..
 * pub_seq: a range of the whole window is accepted as is (the caller then
 * walks every number in it). It should also be bounded by the window. */
static void
test_resend_range_unbounded(void **state)
{
    swn_ring g;
    uint64_t f = 0, t = UINT64_MAX;
    (void)state;
    assert_int_equal(swn_ring_init(&g, 4), 0);
    g.next_seq = 1001; /* skipped numbers: nothing kept */
    g.pub_seq = 1000;
    assert_int_equal(swn_ring_resend_range(&g, &f, &t), 1);
    assert_int_equal(f, 1);
    assert_int_equal(t, 1000);
    assert_int_equal(count_kept(&g, f, t), 0);
    swn_ring_free(&g);
}

/* Skipped numbers: nothing kept for them, neighbours intact, acks pass. */
static void
test_skipped_seqs(void **state)
{
    swn_ring g;
    (void)state;
    assert_int_equal(swn_ring_init(&g, 8), 0);
    keep(&g, 1);
    g.next_seq = 3; /* 2 skipped */
    keep(&g, 3);
    g.next_seq = 6; /* 4, 5 skipped */
    keep(&g, 6);
    g.pub_seq = 6;
    assert_kept(&g, 1);
    assert_null(swn_ring_get(&g, 2, NULL, NULL));
    assert_kept(&g, 3);
    assert_null(swn_ring_get(&g, 4, NULL, NULL));
    assert_null(swn_ring_get(&g, 5, NULL, NULL));
    assert_kept(&g, 6);
    assert_int_equal(swn_ring_ack(&g, 4), 4);
    assert_int_equal(count_kept(&g, 1, 6), 1);
    assert_kept(&g, 6);
    swn_ring_free(&g);
}

/* Wraparound of seq % cap: a full ring acked and refilled many times over. */
static void
test_wraparound(void **state)
{
    swn_ring g;
    (void)state;
    assert_int_equal(swn_ring_init(&g, 4), 0); /* cap 5 */
    for (uint64_t q = 1; q <= 103; q++) {
        keep(&g, q);
        g.pub_seq = q;
        if (q >= 5)
            assert_int_equal(swn_ring_ack(&g, q - 4), q - 4);
    }
    assert_int_equal(g.cap, 5);
    assert_int_equal(g.acked, 99);
    for (uint64_t q = 100; q <= 103; q++)
        assert_kept(&g, q);
    assert_int_equal(count_kept(&g, 1, 99), 0);
    /* 98 maps to the same slot as 103: the old number does not read back */
    assert_null(swn_ring_get(&g, 98, NULL, NULL));
    swn_ring_free(&g);
}

/* An ack that jumps over more than cap numbers frees every body up to it
 * (reachable with skipped numbers). This test pinned the defect found by
 * a reviewer (the bodies below the last cap numbers stayed, stale, and a
 * later keep onto one of their slots failed) and now checks the fix. */
static void
test_ack_jump_over_cap(void **state)
{
    swn_ring g;
    size_t len;
    uint8_t *b;
    (void)state;
    assert_int_equal(swn_ring_init(&g, 4), 0); /* cap 5 */
    g.next_seq = 16;                           /* 1..15 skipped */
    g.pub_seq = 15;
    assert_int_equal(swn_ring_ack(&g, 15), 15);
    for (uint64_t q = 16; q <= 18; q++)
        keep(&g, q);
    g.next_seq = 30; /* 19..29 skipped */
    g.pub_seq = 29;
    assert_int_equal(swn_ring_ack(&g, 29), 29);
    assert_int_equal(g.acked, 29);
    assert_int_equal(count_kept(&g, 16, 18), 0); /* freed */
    b = body(31, &len);                          /* 31 % 5 == 16 % 5 */
    assert_int_equal(swn_ring_keep(&g, 31, b, len, 0), SW_OK);
    free(b);
    keep(&g, 30); /* 30 % 5 == 0 */
    assert_kept(&g, 30);
    assert_kept(&g, 31);
    swn_ring_free(&g);
}

/* Growth rehashes items by seq % new cap after an ack moved the base. */
static void
test_growth_after_ack(void **state)
{
    swn_ring g;
    (void)state;
    assert_int_equal(swn_ring_init(&g, 100), 0); /* cap 16 */
    for (uint64_t q = 1; q <= 16; q++)
        keep(&g, q);
    g.pub_seq = 16;
    (void)swn_ring_ack(&g, 10);
    for (uint64_t q = 17; q <= 40; q++)
        keep(&g, q); /* 30 unacked: grows to 32 */
    assert_int_equal(g.cap, 32);
    for (uint64_t q = 11; q <= 40; q++)
        assert_kept(&g, q);
    assert_int_equal(count_kept(&g, 1, 10), 0);
    swn_ring_free(&g);
}

/* Free with items kept releases them all (the leak checker tells). */
static void
test_free_with_items(void **state)
{
    swn_ring g;
    (void)state;
    assert_int_equal(swn_ring_init(&g, 64), 0);
    for (uint64_t q = 1; q <= 40; q++)
        keep(&g, q);
    g.pub_seq = 20;
    (void)swn_ring_ack(&g, 5);
    swn_ring_free(&g);
    assert_null(g.slot);
    assert_int_equal(g.cap, 0);
    swn_ring_free(&g); /* twice is harmless */
}

/* Chunks (ring.h "Memory"): the chunks' total size and their count. */
static size_t
chunk_bytes(const swn_ring *g, unsigned *n)
{
    size_t t = 0;
    unsigned k = 0;
    for (const swn_chunk *c = g->ch_head; c != NULL; c = c->next) {
        t += c->cap;
        k++;
        if (c->next == NULL)
            assert_ptr_equal(c, g->ch_tail);
    }
    if (g->ch_head == NULL)
        assert_null(g->ch_tail);
    if (n != NULL)
        *n = k;
    return t;
}

/* A body of len bytes that says which seq it is. */
static void
pattern(uint8_t *p, uint64_t seq, size_t len)
{
    for (size_t i = 0; i < len; i++)
        p[i] = (uint8_t)(seq * 131u + i * 7u);
}

/* Keeps seq with a pattern body written in place (room + commit, as the
 * responder does). */
static void
keep_in_place(swn_ring *g, uint64_t seq, size_t len)
{
    uint8_t *p = swn_ring_room(g, seq, len);
    assert_non_null(p);
    pattern(p, seq, len);
    swn_ring_commit(g, seq, len, 0);
    g->next_seq = seq + 1;
}

static void
assert_pattern(const swn_ring *g, uint64_t seq, size_t want)
{
    size_t len = 0;
    const uint8_t *p = swn_ring_get(g, seq, &len, NULL);
    assert_non_null(p);
    assert_int_equal(len, want);
    for (size_t i = 0; i < len; i++)
        if (p[i] != (uint8_t)(seq * 131u + i * 7u))
            fail_msg("seq %llu byte %zu changed", (unsigned long long)seq, i);
}

/* Small bodies share chunks: 100 of 70 bytes take 4 chunks (512, 1 KiB,
 * 2 KiB, 4 KiB), not 100 mallocs, and every one reads back; acking them
 * all lets every chunk go. */
static void
test_chunks_shared(void **state)
{
    swn_ring g;
    unsigned n = 0;
    (void)state;
    assert_int_equal(swn_ring_init(&g, 1000), 0);
    for (uint64_t q = 1; q <= 100; q++)
        keep_in_place(&g, q, 70);
    assert_int_equal(chunk_bytes(&g, &n), 512 + 1024 + 2048 + 4096);
    assert_int_equal(n, 4);
    for (uint64_t q = 1; q <= 100; q++)
        assert_pattern(&g, q, 70);
    g.pub_seq = 100;
    assert_int_equal(swn_ring_ack(&g, 100), 100);
    assert_int_equal(chunk_bytes(&g, &n), 0);
    assert_int_equal(n, 0);
    assert_null(g.ch_head);
    swn_ring_free(&g);
}

/* A chunk goes only when every body in it is acknowledged: an ack inside
 * the first chunk frees nothing and leaves the rest readable; an ack past
 * it frees it alone. A body larger than SWN_CHUNK_MAX gets a chunk of its
 * own size. */
static void
test_chunk_freed_when_all_acked(void **state)
{
    swn_ring g;
    unsigned n = 0;
    (void)state;
    assert_int_equal(swn_ring_init(&g, 100), 0);
    for (uint64_t q = 1; q <= 7; q++) /* 7 x 70 = 490: the 512-byte chunk */
        keep_in_place(&g, q, 70);
    keep_in_place(&g, 8, 70);                /* the 1 KiB chunk */
    keep_in_place(&g, 9, SWN_CHUNK_MAX + 5); /* does not fit: a chunk of its own */
    keep_in_place(&g, 10, 10);               /* a 4 KiB chunk: sizes double on */
    assert_int_equal(chunk_bytes(&g, &n), 512 + 1024 + SWN_CHUNK_MAX + 5 + 4096);
    assert_int_equal(n, 4);
    g.pub_seq = 10;
    assert_int_equal(swn_ring_ack(&g, 6), 6);
    assert_int_equal(chunk_bytes(&g, &n), 512 + 1024 + SWN_CHUNK_MAX + 5 + 4096);
    assert_pattern(&g, 7, 70);
    assert_null(swn_ring_get(&g, 6, NULL, NULL));
    assert_int_equal(swn_ring_ack(&g, 7), 7);
    assert_int_equal(chunk_bytes(&g, &n), 1024 + SWN_CHUNK_MAX + 5 + 4096);
    assert_int_equal(swn_ring_ack(&g, 9), 9);
    assert_int_equal(chunk_bytes(&g, &n), 4096);
    assert_pattern(&g, 10, 10);
    /* the next small body goes on into the 4 KiB chunk's room */
    keep_in_place(&g, 11, 100);
    assert_int_equal(chunk_bytes(&g, &n), 4096);
    assert_int_equal(n, 1);
    swn_ring_free(&g); /* frees the chunk (the leak checker tells) */
    assert_null(g.ch_head);
}

/* Once every chunk is freed the next one is sized to what the freed ones
 * held, not to the largest size the growth reached (review of session 27:
 * a stream acked item by item took a 16 KiB chunk per 64-byte item from
 * its sixth item on, and held it while the item was unacknowledged). */
static void
test_chunk_size_after_empty(void **state)
{
    swn_ring g;
    unsigned n = 0;
    uint64_t q = 0;
    (void)state;
    assert_int_equal(swn_ring_init(&g, 256), 0);
    /* item by item: keep one, ack it; every chunk stays at 512 */
    for (int i = 0; i < 200; i++) {
        q++;
        keep_in_place(&g, q, 64);
        assert_int_equal(chunk_bytes(&g, &n), SWN_CHUNK_MIN);
        assert_int_equal(n, 1);
        assert_pattern(&g, q, 64);
        g.pub_seq = q;
        assert_int_equal(swn_ring_ack(&g, q), q);
        assert_int_equal(chunk_bytes(&g, &n), 0);
    }
    /* a window at a time: 100 x 70 = 7,000 bytes take 512 + ... + 4 KiB;
     * acked, the next 100 take one chunk of 8 KiB, again and again (not
     * 16 KiB) */
    for (int round = 0; round < 5; round++) {
        uint64_t first = q + 1;
        for (int i = 0; i < 100; i++)
            keep_in_place(&g, ++q, 70);
        if (round == 0) {
            assert_int_equal(chunk_bytes(&g, &n), 512 + 1024 + 2048 + 4096);
            assert_int_equal(n, 4);
        } else {
            assert_int_equal(chunk_bytes(&g, &n), 8192);
            assert_int_equal(n, 1);
        }
        for (uint64_t k = first; k <= q; k++)
            assert_pattern(&g, k, 70);
        g.pub_seq = q;
        assert_int_equal(swn_ring_ack(&g, q), q);
        assert_int_equal(chunk_bytes(&g, &n), 0);
    }
    /* a body larger than the largest chunk: its own size, then back down */
    keep_in_place(&g, ++q, SWN_CHUNK_MAX * 3);
    assert_int_equal(chunk_bytes(&g, &n), SWN_CHUNK_MAX * 3);
    g.pub_seq = q;
    assert_int_equal(swn_ring_ack(&g, q), q);
    keep_in_place(&g, ++q, 10);
    assert_int_equal(chunk_bytes(&g, &n), SWN_CHUNK_MAX);
    g.pub_seq = q;
    assert_int_equal(swn_ring_ack(&g, q), q);
    keep_in_place(&g, ++q, 10);
    assert_int_equal(chunk_bytes(&g, &n), SWN_CHUNK_MIN);
    swn_ring_free(&g);
}

/* Room asked for and not committed is handed out again; a chunk with no
 * body goes at the next ack; a seq the ring cannot keep gets no room. */
static void
test_room_not_committed(void **state)
{
    swn_ring g;
    uint8_t *p, *p2;
    (void)state;
    assert_int_equal(swn_ring_init(&g, 2), 0);
    p = swn_ring_room(&g, 1, 40);
    assert_non_null(p);
    p2 = swn_ring_room(&g, 1, 40);
    assert_ptr_equal(p, p2);
    assert_null(swn_ring_get(&g, 1, NULL, NULL));
    assert_int_equal(swn_ring_ack(&g, 0), 0);
    keep_in_place(&g, 1, 40);
    assert_ptr_equal(swn_ring_get(&g, 1, NULL, NULL), p);
    assert_null(swn_ring_room(&g, 1, 40)); /* the slot is taken */
    keep_in_place(&g, 2, 40);
    keep_in_place(&g, 3, 40);
    assert_null(swn_ring_room(&g, 4, 40)); /* beyond window + 1 */
    g.pub_seq = 3;
    assert_int_equal(swn_ring_ack(&g, 3), 3);
    assert_null(g.ch_head);
    assert_null(swn_ring_room(&g, 2, 40)); /* at or below acked */
    p = swn_ring_room(&g, 4, 40);          /* a new chunk, not committed */
    assert_non_null(p);
    assert_non_null(g.ch_head);
    assert_int_equal(swn_ring_ack(&g, 3), 3); /* backwards: changes nothing */
    assert_non_null(g.ch_head);
    g.next_seq = 5;
    g.pub_seq = 4;
    assert_int_equal(swn_ring_ack(&g, 4), 4); /* 4 was never kept: the empty chunk goes */
    assert_null(g.ch_head);
    swn_ring_free(&g);
}

/* The bound of ring.h, tried with pseudo-random sizes (mostly small, some
 * past SWN_CHUNK_MAX) and acks: after every step the chunks hold at most
 * 2 x the unacknowledged bytes + 2 x SWN_CHUNK_MAX, every unacknowledged
 * body reads back unchanged, and nothing is left once all is acked. */
static void
test_chunk_bound_random(void **state)
{
    enum { W = 64, STEPS = 20000 };
    swn_ring g;
    size_t lens[W + 2];
    uint64_t x = 0x9e3779b97f4a7c15ull;
    size_t peak = 0;
    (void)state;
    assert_int_equal(swn_ring_init(&g, W), 0);
    for (unsigned step = 0; step < STEPS; step++) {
        size_t unacked = 0, total;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if ((x & 3) != 0 && g.next_seq - g.acked <= W + 1) {
            unsigned r = (unsigned)(x >> 20);
            size_t len = (r & 63) == 0  ? SWN_CHUNK_MAX + (r >> 8) % 9000
                         : (r & 7) == 0 ? 1 + (r >> 8) % 6000
                                        : 1 + (r >> 8) % 200;
            uint64_t q = g.next_seq;
            keep_in_place(&g, q, len);
            lens[q % (W + 2)] = len;
            g.pub_seq = q;
        } else if (g.acked + 1 < g.next_seq) {
            uint64_t to = g.acked + 1 + (x >> 33) % (g.next_seq - g.acked - 1);
            assert_int_equal(swn_ring_ack(&g, to), to);
        }
        for (uint64_t q = g.acked + 1; q < g.next_seq; q++) {
            assert_pattern(&g, q, lens[q % (W + 2)]);
            unacked += lens[q % (W + 2)];
        }
        total = chunk_bytes(&g, NULL);
        if (total > 2 * unacked + 2 * SWN_CHUNK_MAX)
            fail_msg("step %u: chunks %zu bytes for %zu unacked", step, total, unacked);
        if (unacked == 0)
            assert_int_equal(total, 0);
        if (total > peak)
            peak = total;
    }
    assert_true(peak > SWN_CHUNK_MAX); /* the big bodies came */
    g.pub_seq = g.next_seq - 1;
    (void)swn_ring_ack(&g, g.pub_seq);
    assert_int_equal(chunk_bytes(&g, NULL), 0);
    swn_ring_free(&g);
}

/* Tests from a mutation-testing pass (session 41): each fails with a
 * mutant of the module that every test before it let live. */

/* The bound is acked + window + 1 whatever is kept: a seq past it is
 * refused even when its slot (seq % cap) happens to be free. test_ring's
 * cases fill the ring first, so the slot collision refused it anyway
 * (kills ring.c:77 `g->cap >= limit` -> `>` and ring.c:78 `return -1` ->
 * `return 0`: the ring was rebuilt at the same size and took seq 7 into
 * slot 2, where it later stands for seq 2). */
static void
test_keep_beyond_window_with_free_slot(void **state)
{
    swn_ring g;
    size_t len;
    uint8_t *b;
    (void)state;
    assert_int_equal(swn_ring_init(&g, 4), 0); /* limit: 5 slots, all there from the start */
    keep(&g, 1);
    b = body(7, &len);
    assert_int_equal(swn_ring_keep(&g, 7, b, len, 0), SW_ENOMEM);
    free(b);
    assert_null(swn_ring_get(&g, 7, NULL, NULL));
    b = body(5, &len); /* acked + window + 1: still kept */
    assert_int_equal(swn_ring_keep(&g, 5, b, len, 0), SW_OK);
    free(b);
    swn_ring_free(&g);
}

/* A resend of one item (from == to) is something to resend (kills
 * ring.c:210 `*from <= *to` -> `<`: a single lost item was never resent,
 * the frontend's gap then timed out). */
static void
test_resend_range_single_item(void **state)
{
    swn_ring g;
    uint64_t from, to;
    (void)state;
    assert_int_equal(swn_ring_init(&g, 8), 0);
    for (uint64_t q = 1; q <= 3; q++)
        keep(&g, q);
    g.pub_seq = 3;
    from = 2;
    to = 2;
    assert_true(swn_ring_resend_range(&g, &from, &to));
    assert_int_equal(from, 2);
    assert_int_equal(to, 2);
    from = 3;
    to = 9; /* clamped to what went out: 3 .. 3 */
    assert_true(swn_ring_resend_range(&g, &from, &to));
    assert_int_equal(to, 3);
    swn_ring_free(&g);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_window),
        cmocka_unit_test(test_initial_cap),
        cmocka_unit_test(test_keep_read_back),
        cmocka_unit_test(test_keep_twice),
        cmocka_unit_test(test_growth_to_window_plus_one),
        cmocka_unit_test(test_memory_bound),
        cmocka_unit_test(test_keep_beyond_credit_window),
        cmocka_unit_test(test_ack_releases),
        cmocka_unit_test(test_ack_backwards),
        cmocka_unit_test(test_ack_beyond_next_seq),
        cmocka_unit_test(test_ack_beyond_pub_seq),
        cmocka_unit_test(test_resend_ranges),
        cmocka_unit_test(test_resend_range_unbounded),
        cmocka_unit_test(test_skipped_seqs),
        cmocka_unit_test(test_wraparound),
        cmocka_unit_test(test_ack_jump_over_cap),
        cmocka_unit_test(test_chunks_shared),
        cmocka_unit_test(test_chunk_freed_when_all_acked),
        cmocka_unit_test(test_chunk_size_after_empty),
        cmocka_unit_test(test_room_not_committed),
        cmocka_unit_test(test_chunk_bound_random),
        cmocka_unit_test(test_growth_after_ack),
        cmocka_unit_test(test_free_with_items),
        cmocka_unit_test(test_keep_beyond_window_with_free_slot),
        cmocka_unit_test(test_resend_range_single_item),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
