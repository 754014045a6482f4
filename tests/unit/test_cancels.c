/* tests/unit/test_cancels.c -- the router's pure tables of what waits for
 * a worker's answer: egress/cancels.c, the cancels (schedule: 100 ms, then
 * doubling; the last send, answers, the cap, duplicates, clearing), and
 * egress/sprobe.c, the stream probes out (one answer counts, stale and
 * replayed ones do not, one out per stream, expiry, the bound). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "egress/cancels.h"
#include "egress/sprobe.h"

static void
id_of(uint8_t id[SW_REQUEST_ID_BYTES], int k)
{
    memset(id, 0, SW_REQUEST_ID_BYTES);
    memcpy(id, &k, sizeof(k));
}

static int freed;
static void
count_free(void *s)
{
    (void)s;
    freed++;
}

static void
test_schedule_and_last_send(void **state)
{
    swe_cancels c = {0};
    swe_cancel due[8];
    uint8_t id[SW_REQUEST_ID_BYTES];
    int stream;
    int64_t when[SWE_CANCEL_TRIES], t = 1000;
    int sends = 1; /* the first went out with the cancel */
    (void)state;
    id_of(id, 1);
    assert_int_equal(swe_cancels_add(&c, id, &stream, 0, t), 0);
    assert_int_equal(swe_cancels_next_due(&c), t + 100);
    assert_int_equal(swe_cancels_due(&c, t + 99, due, 8), 0);
    /* walk the clock: repeats at +100, +200, +400, +800 after each other */
    for (int64_t now = t; now < t + 5000; now++) {
        size_t n = swe_cancels_due(&c, now, due, 8);
        if (n == 0)
            continue;
        assert_int_equal(n, 1);
        assert_ptr_equal(due[0].s, &stream);
        assert_int_equal(due[0].kill, 0);
        when[sends] = now;
        sends++;
        assert_int_equal(due[0].sent, sends);
    }
    assert_int_equal(sends, SWE_CANCEL_TRIES);
    assert_int_equal(when[1], t + 100);
    assert_int_equal(when[2], t + 300);
    assert_int_equal(when[3], t + 700);
    assert_int_equal(when[4], t + 1500);
    assert_int_equal(c.n, 0); /* the last send took it out */
    assert_int_equal(swe_cancels_next_due(&c), INT64_MAX);
    swe_cancels_clear(&c, NULL);
}

static void
test_answer_stops_repeats(void **state)
{
    swe_cancels c = {0};
    swe_cancel due[8];
    uint8_t a[SW_REQUEST_ID_BYTES], b[SW_REQUEST_ID_BYTES], x[SW_REQUEST_ID_BYTES];
    int sa, sb;
    (void)state;
    id_of(a, 1);
    id_of(b, 2);
    id_of(x, 3);
    assert_int_equal(swe_cancels_add(&c, a, &sa, 0, 0), 0);
    assert_int_equal(swe_cancels_add(&c, b, &sb, 1, 50), 0);
    assert_null(swe_cancels_seen(&c, x)); /* not waiting */
    assert_ptr_equal(swe_cancels_seen(&c, a), &sa);
    assert_null(swe_cancels_seen(&c, a)); /* once */
    assert_int_equal(swe_cancels_due(&c, 149, due, 8), 0);
    assert_int_equal(swe_cancels_due(&c, 150, due, 8), 1);
    assert_ptr_equal(due[0].s, &sb);
    assert_int_equal(due[0].kill, 1);
    swe_cancels_clear(&c, NULL);
}

static void
test_duplicate_and_cap(void **state)
{
    swe_cancels c = {0};
    uint8_t id[SW_REQUEST_ID_BYTES];
    int s;
    (void)state;
    id_of(id, 7);
    assert_int_equal(swe_cancels_add(&c, id, &s, 0, 0), 0);
    assert_int_equal(swe_cancels_add(&c, id, &s, 1, 0), -1); /* a kill after a cancel */
    assert_int_equal(c.n, 1);
    for (int k = 100; c.n < SWE_CANCELS_MAX; k++) {
        id_of(id, k);
        assert_int_equal(swe_cancels_add(&c, id, &s, 0, 0), 0);
    }
    id_of(id, 999999);
    assert_int_equal(swe_cancels_add(&c, id, &s, 0, 0), -1); /* full: sent once only */
    freed = 0;
    swe_cancels_clear(&c, count_free);
    assert_int_equal(freed, SWE_CANCELS_MAX);
    assert_int_equal(c.n, 0);
    assert_null(c.v);
}

static void
test_due_is_bounded_per_call(void **state)
{
    swe_cancels c = {0};
    swe_cancel due[4];
    uint8_t id[SW_REQUEST_ID_BYTES];
    int s;
    size_t total = 0, n;
    (void)state;
    for (int k = 0; k < 10; k++) {
        id_of(id, k);
        assert_int_equal(swe_cancels_add(&c, id, &s, 0, 0), 0);
    }
    while ((n = swe_cancels_due(&c, 100, due, 4)) > 0) {
        assert_true(n <= 4);
        total += n;
    }
    assert_int_equal(total, 10); /* each once at this instant */
    assert_int_equal(swe_cancels_next_due(&c), 300);
    swe_cancels_clear(&c, NULL);
}

/* A stream probe's answer counts once, with its stream's id; a replay of
 * it, an answer to a probe whose stream left, one after SWE_SPROBE_TTL_MS,
 * and an instance probe's id (no top bit) count for nothing. A stream
 * that asks again keeps its earlier probe out: a slow answer to it still
 * counts. Peeking takes nothing. A stale tag drops nothing of another
 * stream's. */
static void
test_sprobes_answers(void **state)
{
    swe_sprobes t;
    uint8_t id[SW_REQUEST_ID_BYTES], a[SW_REQUEST_ID_BYTES], b[SW_REQUEST_ID_BYTES];
    uint32_t ta = 0, ta2 = 0, tb = 0;
    uint64_t pa, pa2, pb;
    (void)state;
    id_of(a, 1);
    id_of(b, 2);
    swe_sprobes_init(&t, UINT64_C(0x7ffffffffffffff0)); /* ids wrap past 2^63 */
    pa = swe_sprobes_add(&t, a, &ta, 1000);
    pb = swe_sprobes_add(&t, b, &tb, 1000);
    assert_true(swe_sprobe_is(pa) && swe_sprobe_is(pb) && pa != pb);
    assert_true(ta != 0 && tb != 0 && ta != tb);
    assert_int_equal(t.live, 2);
    assert_false(swe_sprobes_take(&t, pa & ~SWE_SPROBE_BIT, 1001, id)); /* an instance id */
    assert_false(swe_sprobes_take(&t, pa + 2, 1001, id));               /* never given */
    /* a asks again: both of its probes are out, each answered once */
    pa2 = swe_sprobes_add(&t, a, &ta2, 1250);
    assert_true(pa2 != pa && ta2 != ta);
    assert_int_equal(t.live, 3);
    assert_true(swe_sprobes_peek(&t, pa2, 1260, id));
    assert_memory_equal(id, a, sizeof(id));
    assert_int_equal(t.live, 3); /* (a peek takes nothing) */
    assert_true(swe_sprobes_take(&t, pa2, 1260, id));
    assert_memory_equal(id, a, sizeof(id));
    assert_false(swe_sprobes_take(&t, pa2, 1261, id)); /* replayed */
    assert_false(swe_sprobes_peek(&t, pa2, 1261, id));
    assert_true(swe_sprobes_take(&t, pa, 1300, id)); /* the slower answer to the first */
    assert_memory_equal(id, a, sizeof(id));
    assert_int_equal(t.live, 1);
    /* a's stale tag names b's position only if b asked at it; it drops
     * nothing of b's (the ids differ) */
    swe_sprobes_drop(&t, tb, a);
    assert_int_equal(t.live, 1);
    /* b's stream leaves: its answer counts for nothing */
    swe_sprobes_drop(&t, tb, b);
    assert_false(swe_sprobes_take(&t, pb, 1300, id));
    assert_int_equal(t.live, 0);
    assert_null(t.v);            /* nothing out: the ring is freed */
    swe_sprobes_drop(&t, tb, b); /* (again: nothing) */
    swe_sprobes_drop(&t, 0, b);
    /* too late: SWE_SPROBE_TTL_MS after it was sent */
    pb = swe_sprobes_add(&t, b, &tb, 2000);
    assert_false(swe_sprobes_peek(&t, pb, 2000 + SWE_SPROBE_TTL_MS, id));
    assert_false(swe_sprobes_take(&t, pb, 2000 + SWE_SPROBE_TTL_MS, id));
    pb = swe_sprobes_add(&t, b, &tb, 4000);
    assert_true(swe_sprobes_take(&t, pb, 4000 + SWE_SPROBE_TTL_MS - 1, id));
    assert_memory_equal(id, b, sizeof(id));
    swe_sprobes_fini(&t);
}

/* At most SWE_SPROBES_MAX positions: then no probe (0, the tag as it
 * was); positions come back as the oldest are answered or expire, every
 * entry after the same SWE_SPROBE_TTL_MS, so an entry answered in the
 * middle frees its position once those before it went, and none can pin
 * the ring for longer than that. The ring grows by doubling without losing
 * any. */
static void
test_sprobes_bound(void **state)
{
    swe_sprobes *t = malloc(sizeof(*t));
    uint64_t *pid = calloc(SWE_SPROBES_MAX + 1, sizeof(*pid));
    uint32_t *tag = calloc(SWE_SPROBES_MAX + 1, sizeof(*tag));
    uint8_t id[SW_REQUEST_ID_BYTES], want[SW_REQUEST_ID_BYTES];
    (void)state;
    assert_non_null(t);
    assert_non_null(pid);
    assert_non_null(tag);
    swe_sprobes_init(t, 12345);
    for (int k = 0; k < SWE_SPROBES_MAX; k++) {
        id_of(want, k);
        pid[k] = swe_sprobes_add(t, want, &tag[k], 1000 + k / 64);
        assert_true(pid[k] != 0);
    }
    assert_int_equal(t->cap, SWE_SPROBES_MAX);
    id_of(want, SWE_SPROBES_MAX);
    tag[SWE_SPROBES_MAX] = 77;
    assert_int_equal(swe_sprobes_add(t, want, &tag[SWE_SPROBES_MAX], 1300), 0);
    assert_int_equal(tag[SWE_SPROBES_MAX], 77);
    /* an answer in the middle makes no room yet; the oldest's does */
    assert_true(swe_sprobes_take(t, pid[100], 1300, id));
    assert_int_equal(swe_sprobes_add(t, want, &tag[SWE_SPROBES_MAX], 1300), 0);
    assert_true(swe_sprobes_take(t, pid[0], 1300, id));
    pid[SWE_SPROBES_MAX] = swe_sprobes_add(t, want, &tag[SWE_SPROBES_MAX], 1300);
    assert_true(pid[SWE_SPROBES_MAX] != 0);
    /* each is still there with its own id (the ring grew 8 times) */
    for (int k = 1; k <= SWE_SPROBES_MAX; k++) {
        if (k == 100)
            continue;
        id_of(want, k);
        assert_true(swe_sprobes_take(t, pid[k], 1400, id));
        assert_memory_equal(id, want, sizeof(id));
    }
    assert_int_equal(t->live, 0);
    /* the full table again, none answered: all expired by an add
     * SWE_SPROBE_TTL_MS later, and one left out then finds room */
    for (int k = 0; k < SWE_SPROBES_MAX; k++)
        assert_true(swe_sprobes_add(t, want, &tag[k], 2000) != 0);
    assert_int_equal(swe_sprobes_add(t, want, &tag[0], 2000 + SWE_SPROBE_TTL_MS - 1), 0);
    assert_true(swe_sprobes_add(t, want, &tag[0], 2000 + SWE_SPROBE_TTL_MS) != 0);
    assert_int_equal(t->live, 1);
    swe_sprobes_fini(t);
    free(t);
    free(pid);
    free(tag);
}

/* Tests from a mutation-testing pass (session 41): each fails with a
 * mutant of the module that every test before it let live. */

/* A waiting cancel keeps the subject it goes to (control.c sends each due
 * one to due[i].subj); without one, "" (kills cancels.c:34, the subject's
 * snprintf deleted: the subject was whatever the table's memory held). */
static void
test_cancel_keeps_its_subject(void **state)
{
    swe_cancels c;
    swe_cancel due[4];
    uint8_t a[SW_REQUEST_ID_BYTES], b[SW_REQUEST_ID_BYTES];
    int sa, sb;
    (void)state;
    memset(&c, 0, sizeof(c));
    memset(a, 1, sizeof(a));
    memset(b, 2, sizeof(b));
    assert_int_equal(swe_cancels_add_to(&c, a, "sw.w.inst1.ctl", &sa, 0, 0), 0);
    assert_int_equal(swe_cancels_add(&c, b, &sb, 1, 0), 0);
    assert_int_equal(swe_cancels_due(&c, SWE_CANCEL_FIRST_MS, due, 4), 2);
    for (int i = 0; i < 2; i++) {
        if (due[i].s == &sa)
            assert_string_equal(due[i].subj, "sw.w.inst1.ctl");
        else
            assert_string_equal(due[i].subj, "");
    }
    swe_cancels_clear(&c, NULL);
}

/* An answer for a cancel already answered finds nothing, even when that
 * cancel was the table's last entry, whose bytes stay in the slot past the
 * end (kills cancels.c:67 `i < c->n` -> `<=`: the second answer found the
 * stale copy, handed its stream out twice, and dropped A by counting n down). */
static void
test_seen_twice_finds_nothing(void **state)
{
    swe_cancels c;
    uint8_t a[SW_REQUEST_ID_BYTES], b[SW_REQUEST_ID_BYTES];
    int sa, sb;
    (void)state;
    memset(&c, 0, sizeof(c));
    memset(a, 1, sizeof(a));
    memset(b, 2, sizeof(b));
    assert_int_equal(swe_cancels_add(&c, a, &sa, 0, 0), 0);
    assert_int_equal(swe_cancels_add(&c, b, &sb, 0, 0), 0);
    assert_ptr_equal(swe_cancels_seen(&c, b), &sb);
    assert_null(swe_cancels_seen(&c, b));
    assert_int_equal(c.n, 1);
    assert_ptr_equal(swe_cancels_seen(&c, a), &sa);
    swe_cancels_clear(&c, NULL);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schedule_and_last_send),
        cmocka_unit_test(test_answer_stops_repeats),
        cmocka_unit_test(test_duplicate_and_cap),
        cmocka_unit_test(test_due_is_bounded_per_call),
        cmocka_unit_test(test_sprobes_answers),
        cmocka_unit_test(test_cancel_keeps_its_subject),
        cmocka_unit_test(test_seen_twice_finds_nothing),
        cmocka_unit_test(test_sprobes_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
