/* tests/unit/test_merge_core.c -- the pure state machine of sw_merge
 * (egress/merge_core.c), without a server: the design document's example,
 * different chunk sizes, empty and late streams, overlapping chunks, and a
 * randomized run, with indices that go back, that checks the invariants
 * (every item once, in order; references never decrease, and repeat only
 * once every lane ended; nothing past the reference; every frame takes an
 * item, and one at a new reference). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "egress/merge_core.h"

#define MAXL 8
#define MAXI 256

/* Scripted lanes: each gives its indices one at a time when needed. */
typedef struct script {
    uint64_t idx[MAXL][MAXI];
    size_t n[MAXL], next[MAXL];
    size_t lanes;
} script;

typedef struct frame_log {
    uint64_t ref[MAXI];
    size_t counts[MAXI][MAXL];
    uint64_t got[MAXL][MAXI]; /* indices taken per lane, in order */
    size_t ngot[MAXL];
    size_t nframes;
} frame_log;

static void
run(script *sc, frame_log *fl)
{
    swm_core c;
    memset(fl, 0, sizeof(*fl));
    swm_core_init(&c);
    for (size_t i = 0; i < sc->lanes; i++) {
        size_t lane;
        assert_int_equal(swm_core_add(&c, &lane), 0);
        assert_int_equal(lane, i);
    }
    for (int guard = 0; guard < 100000; guard++) {
        size_t need = 99;
        uint64_t ref = 0;
        int st = swm_core_step(&c, &need, &ref);
        if (st == SWM_DONE)
            break;
        if (st == SWM_NEED) {
            assert_true(need < sc->lanes);
            if (sc->next[need] < sc->n[need]) {
                uint64_t v = sc->idx[need][sc->next[need]++];
                char text[32];
                size_t before = c.bytes;
                swm_item *it;
                snprintf(text, sizeof(text), "L%zu@%llu", need, (unsigned long long)v);
                it = swm_item_new(0, v, text, strlen(text), NULL);
                assert_non_null(it);
                assert_int_equal(it->size, sizeof(swm_item) + strlen(text) + 1);
                swm_core_push(&c, need, it);
                assert_int_equal(c.bytes, before + it->size);
            } else {
                swm_core_end(&c, need);
            }
            continue;
        }
        assert_int_equal(st, SWM_FRAME);
        if (fl->nframes > 0) /* references never decrease */
            assert_true(ref >= fl->ref[fl->nframes - 1]);
        fl->ref[fl->nframes] = ref;
        {
            int took_ref = 0;
            size_t took = 0;
            for (size_t i = 0; i < sc->lanes; i++) {
                size_t cnt = 0, before = c.bytes, freed = 0;
                swm_item *it = swm_core_take(&c, i, ref, &cnt);
                fl->counts[fl->nframes][i] = cnt;
                took += cnt;
                for (swm_item *t = it; t != NULL; t = t->next)
                    freed += t->size;
                assert_int_equal(c.bytes, before - freed); /* what it holds, exactly */
                while (it != NULL) {
                    swm_item *nx = it->next;
                    assert_true(it->index <= ref); /* nothing past the reference */
                    if (it->index == ref)
                        took_ref = 1;
                    fl->got[i][fl->ngot[i]++] = it->index;
                    free(it);
                    it = nx;
                }
            }
            assert_true(took > 0); /* progress */
            if (fl->nframes == 0 || ref > fl->ref[fl->nframes - 1]) {
                assert_true(took_ref); /* a new reference is an item's index */
            } else {
                /* the same reference again: only for items that went back,
                 * left over once every lane ended */
                for (size_t i = 0; i < sc->lanes; i++)
                    assert_true(c.lanes[i].ended);
            }
        }
        fl->nframes++;
    }
    /* every item once, in order */
    for (size_t i = 0; i < sc->lanes; i++) {
        assert_int_equal(fl->ngot[i], sc->n[i]);
        for (size_t k = 0; k < sc->n[i]; k++)
            assert_int_equal(fl->got[i][k], sc->idx[i][k]);
    }
    assert_int_equal(c.bytes, 0); /* everything taken */
    swm_core_fini(&c);
}

/* ADR 002: "maximum processed_index is 42 and another queue has responses
 * at 5, 17 and 34": they wait for 42 or more; past 42 stays queued. */
static void
test_design_doc_example(void **state)
{
    script sc = {{{42, 90}, {5, 17, 34, 50, 90}}, {2, 5}, {0, 0}, 2};
    frame_log fl;
    (void)state;
    run(&sc, &fl);
    assert_int_equal(fl.nframes, 2);
    assert_int_equal(fl.ref[0], 42);
    assert_int_equal(fl.counts[0][0], 1);
    assert_int_equal(fl.counts[0][1], 3); /* 5, 17, 34; 50 stays */
    assert_int_equal(fl.ref[1], 90);
    assert_int_equal(fl.counts[1][0], 1);
    assert_int_equal(fl.counts[1][1], 2); /* 50, 90 */
}

/* A head far ahead (index 10^9) makes every item of the other lane wait in
 * the queue: the core keeps asking for that lane, and c.bytes counts what
 * it holds -- the figure sw_merge bounds with max_queued_bytes. */
static void
test_far_reference_queues(void **state)
{
    swm_core c;
    size_t lane, need = 9, total = 0;
    uint64_t ref = 0;
    (void)state;
    swm_core_init(&c);
    assert_int_equal(swm_core_add(&c, &lane), 0);
    assert_int_equal(swm_core_add(&c, &lane), 0);
    swm_core_push(&c, 0, swm_item_new(0, 1000000000, "far", 3, NULL));
    total += sizeof(swm_item) + 4;
    for (uint64_t v = 1; v <= 1000; v++) {
        assert_int_equal(swm_core_step(&c, &need, &ref), SWM_NEED);
        assert_int_equal(need, 1);
        swm_core_push(&c, 1, swm_item_new(0, v, "tok", 3, "ev"));
        total += sizeof(swm_item) + 3 + 2 + 1;
        assert_int_equal(c.bytes, total);
    }
    assert_int_equal(c.lanes[1].n, 1000);
    swm_core_end(&c, 1);
    assert_int_equal(swm_core_step(&c, &need, &ref), SWM_FRAME);
    assert_int_equal(ref, 1000000000);
    swm_core_fini(&c);
}

/* Chunks of 1, 5 and 20 characters over the same 40-character text. */
static void
test_chunk_sizes(void **state)
{
    script sc;
    frame_log fl;
    size_t sizes[3] = {1, 5, 20};
    (void)state;
    memset(&sc, 0, sizeof(sc));
    sc.lanes = 3;
    for (size_t l = 0; l < 3; l++)
        for (uint64_t at = sizes[l]; at <= 40; at += sizes[l])
            sc.idx[l][sc.n[l]++] = at;
    run(&sc, &fl);
    /* bounded by the coarsest chunker: frames at 20 and 40 */
    assert_int_equal(fl.nframes, 2);
    assert_int_equal(fl.ref[0], 20);
    assert_int_equal(fl.counts[0][0], 20);
    assert_int_equal(fl.counts[0][1], 4);
    assert_int_equal(fl.counts[0][2], 1);
    assert_int_equal(fl.ref[1], 40);
}

/* A stream with no results at all ends at once and blocks nobody; a
 * stream that ends early lets the others go on. */
static void
test_empty_and_short_streams(void **state)
{
    script sc = {{{10, 20, 30}, {0}, {10}}, {3, 0, 1}, {0, 0, 0}, 3};
    frame_log fl;
    (void)state;
    run(&sc, &fl);
    assert_int_equal(fl.nframes, 3);
    assert_int_equal(fl.ref[0], 10);
    assert_int_equal(fl.counts[0][2], 1);
    assert_int_equal(fl.ref[2], 30);
    assert_int_equal(fl.counts[2][1], 0);
    assert_int_equal(fl.counts[2][2], 0);
}

/* Overlapping chunks: a later chunk ending before an earlier one's end
 * is taken in stream order. Here the other lane's 20 makes the core read
 * 8 and 20 before the first frame, so 8 travels with 10. */
static void
test_overlapping_chunks(void **state)
{
    script sc = {{{10, 8, 20}, {20}}, {3, 1}, {0, 0}, 2};
    frame_log fl;
    (void)state;
    run(&sc, &fl);
    assert_int_equal(fl.nframes, 1);
    assert_int_equal(fl.ref[0], 20);
    assert_int_equal(fl.counts[0][0], 3);
}

/* Here nothing makes the core read past 10 before the first frame: 8 is
 * read after it, already covered by that frame's reference, and comes with
 * the next frame -- here, once both lanes ended, one at the same reference
 * 10 (references never decrease). Before, that frame's reference was 8,
 * below the first one's. */
static void
test_overlapping_chunk_after_its_frame(void **state)
{
    script sc = {{{10, 8}, {10}}, {2, 1}, {0, 0}, 2};
    frame_log fl;
    (void)state;
    run(&sc, &fl); /* (checks that references never decrease) */
    assert_int_equal(fl.nframes, 2);
    assert_int_equal(fl.ref[0], 10);
    assert_int_equal(fl.counts[0][0], 1);
    assert_int_equal(fl.counts[0][1], 1);
    assert_int_equal(fl.ref[1], 10);
    assert_int_equal(fl.counts[1][0], 1); /* 8 */
    assert_int_equal(fl.counts[1][1], 0);
}

/* An item that went back sets no reference of its own: 8, read after the
 * frame at 10, waits for its lane's next item (20) and goes with that
 * frame. Before, it made a frame at 8 between those at 10 and 20. */
static void
test_overlapping_chunk_goes_with_the_next_frame(void **state)
{
    script sc = {{{10, 8, 20}, {10}}, {3, 1}, {0, 0}, 2};
    frame_log fl;
    (void)state;
    run(&sc, &fl);
    assert_int_equal(fl.nframes, 2);
    assert_int_equal(fl.ref[0], 10);
    assert_int_equal(fl.counts[0][0], 1);
    assert_int_equal(fl.counts[0][1], 1);
    assert_int_equal(fl.ref[1], 20);
    assert_int_equal(fl.counts[1][0], 2); /* 8, 20 */
    assert_int_equal(fl.counts[1][1], 0);
}

/* Random lanes, some of whose indices go back or repeat (overlapping
 * chunks): the invariants hold (checked in run). */
static void
test_random(void **state)
{
    (void)state;
    srand(7);
    for (int trial = 0; trial < 2000; trial++) {
        script sc;
        frame_log fl;
        memset(&sc, 0, sizeof(sc));
        sc.lanes = 1 + (size_t)(rand() % MAXL);
        for (size_t l = 0; l < sc.lanes; l++) {
            uint64_t at = 0;
            size_t n = (size_t)(rand() % 40);
            for (size_t k = 0; k < n; k++) {
                if (rand() % 4 == 0) {
                    /* an overlapping chunk that ends before the last one's end
                     * (or at it): the index goes back, or repeats */
                    sc.idx[l][sc.n[l]++] = at - (uint64_t)rand() % (at + 1);
                    continue;
                }
                at += (uint64_t)(rand() % 7); /* steps of 0 (repeats) allowed */
                sc.idx[l][sc.n[l]++] = at;
            }
        }
        run(&sc, &fl);
    }
}

/* Tests from a mutation-testing pass (session 41): each fails with a
 * mutant of the module that every test before it let live. */

/* An item holds what it was made of: its stream's start, its index, its
 * bytes and its event name ("" for none). test_merge_core checks only the
 * indexes and the framing (kills merge_core.c:18 `it->start = start;`,
 * :20 `it->len = len;`, :23 the event's memcpy, :24 its NUL and :25
 * `it->event = ...`, each deleted). */
static void
test_item_holds_its_fields(void **state)
{
    swm_item *a = swm_item_new(7, 42, "abc", 3, "ev-name");
    swm_item *b = swm_item_new(8, 43, "", 0, NULL);
    (void)state;
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(a->start, 7);
    assert_int_equal(a->index, 42);
    assert_int_equal(a->len, 3);
    assert_memory_equal(a->data, "abc", 3);
    assert_ptr_equal(a->event, (const char *)a->data + 3);
    assert_string_equal(a->event, "ev-name");
    assert_null(a->next);
    assert_int_equal(b->start, 8);
    assert_int_equal(b->len, 0);
    assert_string_equal(b->event, "");
    free(a);
    free(b);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_design_doc_example),
        cmocka_unit_test(test_chunk_sizes),
        cmocka_unit_test(test_far_reference_queues),
        cmocka_unit_test(test_empty_and_short_streams),
        cmocka_unit_test(test_overlapping_chunks),
        cmocka_unit_test(test_overlapping_chunk_after_its_frame),
        cmocka_unit_test(test_overlapping_chunk_goes_with_the_next_frame),
        cmocka_unit_test(test_item_holds_its_fields),
        cmocka_unit_test(test_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
