/* tests/unit/test_cancels.c -- egress/cancels.c, the pure table of
 * cancels that wait for the worker's answer: schedule (100 ms, then
 * doubling), the last send, answers, the cap, duplicates, clearing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "egress/cancels.h"

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

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schedule_and_last_send),
        cmocka_unit_test(test_answer_stops_repeats),
        cmocka_unit_test(test_duplicate_and_cap),
        cmocka_unit_test(test_due_is_bounded_per_call),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
