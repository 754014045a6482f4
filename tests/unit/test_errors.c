/* tests/unit/test_errors.c -- the error model: every code in SW_ERR_MAP has a
 * stable name and a sentence, names parse back, the string functions are
 * total, NATS statuses wrap and unwrap, stream reasons are recognised. */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <nats/nats.h>

#include <streamwire/streamwire.h>

typedef struct err_row {
    int val;
    const char *enum_name; /* "ETIMEDOUT" */
    const char *name;      /* "timeout" */
    const char *msg;       /* "operation timed out" */
} err_row;

/* The table is built from the X-macro itself, and every row also checks at
 * compile time that SW_<NAME> has the value the map gives it. */
#define ROW(n, v, s, m) {SW_##n, #n, s, m},
static const err_row rows[] = {SW_ERR_MAP(ROW)};
#undef ROW
#define NROWS (sizeof(rows) / sizeof(rows[0]))

#define CHECK_VAL(n, v, s, m) _Static_assert(SW_##n == (v), "SW_" #n " drifted from its map value");
SW_ERR_MAP(CHECK_VAL)
#undef CHECK_VAL

/* The stream error reasons. */
static const int stream_reasons[] = {
    SW_STREAM_INCOMPLETE, SW_INSTANCE_LOST,  SW_ITEM_AFTER_FINAL, SW_DECODE_ERROR,
    SW_SEQUENCE_GAP,      SW_NO_INSTANCES,   SW_NO_RESPONDERS,    SW_DEADLINE_EXCEEDED,
    SW_AUTH_FAILED,       SW_FLOW_VIOLATION,
};

static int
is_stable_name(const char *s)
{
    if (s == NULL || *s == '\0')
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || *s == '_'))
            return 0;
    return 1;
}

static void
test_map_is_complete(void **state)
{
    (void)state;
    /* 22 API codes (0..21) + 10 stream reasons (100..109). Update this when
     * codes are added; values never change. */
    assert_int_equal(NROWS, 32);
    assert_int_equal(rows[0].val, SW_OK);
    assert_string_equal(rows[0].name, "ok");
    assert_int_equal(SW_OK, 0);
    for (size_t i = 0; i < NROWS; i++) {
        /* Values fit far below the NATS wrapping range. */
        assert_true(rows[i].val >= 0);
        assert_true(rows[i].val < SW_ENATS_BASE);
    }
}

static void
test_every_code_has_name_and_message(void **state)
{
    (void)state;
    for (size_t i = 0; i < NROWS; i++) {
        const char *msg = sw_strerror(rows[i].val);
        const char *name = sw_err_name(rows[i].val);
        assert_non_null(msg);
        assert_non_null(name);
        assert_true(strlen(msg) > 0);
        assert_string_equal(msg, rows[i].msg);
        assert_string_equal(name, rows[i].name);
        if (!is_stable_name(name))
            fail_msg("code %d (%s): name \"%s\" is not [a-z_]+", rows[i].val, rows[i].enum_name,
                     name);
        /* Static strings: the same pointer every time. */
        assert_ptr_equal(sw_strerror(rows[i].val), msg);
        assert_ptr_equal(sw_err_name(rows[i].val), name);
        /* Never the fallback strings. */
        assert_string_not_equal(name, "unknown_error");
        assert_string_not_equal(msg, "unknown error");
    }
}

static void
test_names_and_values_unique(void **state)
{
    (void)state;
    for (size_t i = 0; i < NROWS; i++) {
        for (size_t j = i + 1; j < NROWS; j++) {
            if (strcmp(rows[i].name, rows[j].name) == 0)
                fail_msg("duplicate name \"%s\" (%s, %s)", rows[i].name, rows[i].enum_name,
                         rows[j].enum_name);
            if (rows[i].val == rows[j].val)
                fail_msg("duplicate value %d (%s, %s)", rows[i].val, rows[i].enum_name,
                         rows[j].enum_name);
            assert_string_not_equal(rows[i].msg, rows[j].msg);
        }
    }
}

static void
test_from_name_round_trip(void **state)
{
    (void)state;
    for (size_t i = 0; i < NROWS; i++) {
        sw_err out = (sw_err)-12345;
        assert_int_equal(sw_err_from_name(rows[i].name, &out), SW_OK);
        assert_int_equal(out, rows[i].val);
        assert_string_equal(sw_err_name(out), rows[i].name);
    }
}

static void
test_from_name_rejects_unknown(void **state)
{
    static const char *bad[] = {
        "",         "OK",        "Timeout",       "timeout ",         " timeout",
        "time_out", "ETIMEDOUT", "unknown_error", "stream_incomplet", "stream_incomplete_",
        "3",        "no-memory", "ok\n",
    };
    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        sw_err out = (sw_err)-777;
        assert_int_equal(sw_err_from_name(bad[i], &out), SW_EINVAL);
        assert_int_equal((int)out, -777); /* untouched */
    }
    {
        sw_err out = (sw_err)-777;
        assert_int_equal(sw_err_from_name(NULL, &out), SW_EINVAL);
        assert_int_equal((int)out, -777);
        assert_int_equal(sw_err_from_name("timeout", NULL), SW_EINVAL);
    }
}

static void
test_strings_are_total(void **state)
{
    static const int unknown[] = {
        -1,
        -2,
        22,
        50,
        99,
        110,
        150,
        199,
        200,
        1000,
        99999,
        INT_MIN,
        INT_MIN + 1,
        INT_MAX,
        SW_ENATS_BASE,          /* base itself wraps nothing */
        SW_ENATS_BASE + 0x1000, /* past the wrapped range */
        SW_ENATS_BASE - 1,
        2 * SW_ENATS_BASE,
        -SW_ENATS_BASE,
    };
    (void)state;
    for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
        int e = unknown[i];
        /* 110..199 are reserved for stream reasons but not assigned yet. */
        assert_non_null(sw_strerror(e));
        assert_non_null(sw_err_name(e));
        assert_string_equal(sw_strerror(e), "unknown error");
        assert_string_equal(sw_err_name(e), "unknown_error");
        assert_int_equal(sw_err_is_nats(e), 0);
        assert_int_equal(sw_err_nats_status(e), 0);
    }
}

static void
test_nats_special_statuses(void **state)
{
    (void)state;
    assert_int_equal(sw_err_from_nats(NATS_OK), SW_OK);
    assert_int_equal(sw_err_from_nats(NATS_TIMEOUT), SW_ETIMEDOUT);
    assert_int_equal(sw_err_from_nats(NATS_NO_RESPONDERS), SW_NO_RESPONDERS);
    assert_int_equal(sw_err_from_nats(NATS_NO_MEMORY), SW_ENOMEM);
    assert_int_equal(sw_err_from_nats(NATS_MAX_PAYLOAD), SW_EMSGSIZE);
    /* Security refusals get their own codes, so the CLI can name the flag. */
    assert_int_equal(sw_err_from_nats(NATS_CONNECTION_AUTH_FAILED), SW_EAUTH);
    assert_int_equal(sw_err_from_nats(NATS_NOT_PERMITTED), SW_EPERM);
    assert_int_equal(sw_err_from_nats(NATS_SECURE_CONNECTION_REQUIRED), SW_ETLS);
    assert_int_equal(sw_err_from_nats(NATS_SECURE_CONNECTION_WANTED), SW_ETLS);
    assert_int_equal(sw_err_from_nats(NATS_SSL_ERROR), SW_ETLS);
    assert_string_equal(sw_err_name(SW_EAUTH), "not_authorized");
    assert_string_equal(sw_err_name(SW_ETLS), "tls_error");
    assert_string_equal(sw_err_name(SW_EPERM), "not_permitted");
    /* Out of the wrappable range: the generic code, never a bogus wrap. */
    assert_int_equal(sw_err_from_nats(-1), SW_ENATS);
    assert_int_equal(sw_err_from_nats(INT_MIN), SW_ENATS);
    assert_int_equal(sw_err_from_nats(0x1000), SW_ENATS);
    assert_int_equal(sw_err_from_nats(JSBadRequestErr), SW_ENATS); /* 10003 */
    assert_int_equal(sw_err_from_nats(INT_MAX), SW_ENATS);
    /* The mapped results are plain codes, not wrapped statuses. */
    assert_int_equal(sw_err_is_nats(SW_ETIMEDOUT), 0);
    assert_int_equal(sw_err_is_nats(SW_NO_RESPONDERS), 0);
    assert_int_equal(sw_err_is_nats(SW_ENATS), 0);
    assert_string_equal(sw_err_name(SW_ENATS), "nats_error");
}

static void
test_nats_wrap_round_trip(void **state)
{
    int wrapped = 0;
    (void)state;
    for (int s = NATS_ERR; s <= NATS_MISSED_HEARTBEAT; s++) {
        sw_err e = sw_err_from_nats(s);
        if (s == NATS_TIMEOUT || s == NATS_NO_RESPONDERS || s == NATS_NO_MEMORY ||
            s == NATS_MAX_PAYLOAD || s == NATS_CONNECTION_AUTH_FAILED || s == NATS_NOT_PERMITTED ||
            s == NATS_SECURE_CONNECTION_REQUIRED || s == NATS_SECURE_CONNECTION_WANTED ||
            s == NATS_SSL_ERROR) {
            assert_int_equal(sw_err_is_nats(e), 0);
            continue;
        }
        wrapped++;
        assert_int_equal((int)e, SW_ENATS_BASE | s);
        assert_int_equal(sw_err_is_nats(e), 1);
        assert_int_equal(sw_err_nats_status(e), s);
        assert_int_equal(sw_err_is_stream_reason(e), 0);
        assert_string_equal(sw_err_name(e), "nats_error");
        assert_non_null(sw_strerror(e));
        assert_string_equal(sw_strerror(e), natsStatus_GetText((natsStatus)s));
        assert_true(strlen(sw_strerror(e)) > 0);
    }
    assert_true(wrapped >= 25);
    /* Spot checks with real statuses. */
    assert_int_equal(sw_err_nats_status(sw_err_from_nats(NATS_CONNECTION_CLOSED)),
                     NATS_CONNECTION_CLOSED);
    assert_int_equal(sw_err_nats_status(sw_err_from_nats(NATS_NO_SERVER)), NATS_NO_SERVER);
    /* No code of the map is a wrapped status. */
    for (size_t i = 0; i < NROWS; i++) {
        assert_int_equal(sw_err_is_nats(rows[i].val), 0);
        assert_int_equal(sw_err_nats_status(rows[i].val), 0);
    }
}

/* Regression: sw_strerror must stay total for a wrapped status nats.c does
 * not know (NATS_MISSED_HEARTBEAT < s < 0x1000): natsStatus_GetText indexes
 * its table without a bounds check, so common/errors.c bounds it. */
static void
test_nats_unknown_wrapped_status_text(void **state)
{
    (void)state;
    for (int s = NATS_MISSED_HEARTBEAT + 1; s < 0x1000; s++) {
        int e = SW_ENATS_BASE + s;
        assert_int_equal(sw_err_is_nats(e), 1);
        assert_string_equal(sw_err_name(e), "nats_error");
        assert_non_null(sw_strerror(e));
    }
}

static void
test_stream_reasons(void **state)
{
    size_t nreasons = 0;
    (void)state;
    for (size_t i = 0; i < sizeof(stream_reasons) / sizeof(stream_reasons[0]); i++) {
        int e = stream_reasons[i];
        assert_int_equal(sw_err_is_stream_reason(e), 1);
        /* index = sw_err - 100, as sw_router_stats.errors[] uses it */
        assert_int_equal(e - 100, (int)i);
        assert_true(is_stable_name(sw_err_name(e)));
    }
    assert_string_equal(sw_err_name(SW_STREAM_INCOMPLETE), "stream_incomplete");
    assert_string_equal(sw_err_name(SW_INSTANCE_LOST), "instance_lost");
    assert_string_equal(sw_err_name(SW_ITEM_AFTER_FINAL), "item_after_final");
    assert_string_equal(sw_err_name(SW_DECODE_ERROR), "decode_error");
    assert_string_equal(sw_err_name(SW_SEQUENCE_GAP), "sequence_gap");
    assert_string_equal(sw_err_name(SW_NO_INSTANCES), "no_instances");
    assert_string_equal(sw_err_name(SW_NO_RESPONDERS), "no_responders");
    assert_string_equal(sw_err_name(SW_DEADLINE_EXCEEDED), "deadline_exceeded");
    assert_string_equal(sw_err_name(SW_AUTH_FAILED), "auth_failed");
    assert_string_equal(sw_err_name(SW_FLOW_VIOLATION), "flow_violation");
    /* Exactly those ten codes of the map are stream reasons. */
    for (size_t i = 0; i < NROWS; i++)
        if (sw_err_is_stream_reason(rows[i].val))
            nreasons++;
    assert_int_equal(nreasons, 10);
    /* API errors and out-of-range values are not. */
    assert_int_equal(sw_err_is_stream_reason(SW_OK), 0);
    assert_int_equal(sw_err_is_stream_reason(SW_EOVERLOADED), 0);
    assert_int_equal(sw_err_is_stream_reason(SW_ECLOSED), 0);
    assert_int_equal(sw_err_is_stream_reason(SW_ETIMEDOUT), 0);
    assert_int_equal(sw_err_is_stream_reason(99), 0);
    assert_int_equal(sw_err_is_stream_reason(200), 0);
    assert_int_equal(sw_err_is_stream_reason(110), 0); /* undefined, in the range */
    assert_int_equal(sw_err_is_stream_reason(199), 0);
    assert_int_equal(sw_err_is_stream_reason(-100), 0);
    assert_int_equal(sw_err_is_stream_reason(INT_MIN), 0);
    assert_int_equal(sw_err_is_stream_reason(SW_ENATS_BASE + 100), 0);
}

static void
test_status_name(void **state)
{
    static const int unknown[] = {0, 6, -1, 100, INT_MIN, INT_MAX};
    (void)state;
    assert_string_equal(sw_status_name(SW_STATUS_COMPLETED), "completed");
    assert_string_equal(sw_status_name(SW_STATUS_INCOMPLETE), "incomplete");
    assert_string_equal(sw_status_name(SW_STATUS_FAILED), "failed");
    assert_string_equal(sw_status_name(SW_STATUS_CANCELLED), "cancelled");
    assert_string_equal(sw_status_name(SW_STATUS_ERROR), "error");
    for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
        assert_non_null(sw_status_name(unknown[i]));
        assert_string_equal(sw_status_name(unknown[i]), "unknown");
    }
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_map_is_complete),
        cmocka_unit_test(test_every_code_has_name_and_message),
        cmocka_unit_test(test_names_and_values_unique),
        cmocka_unit_test(test_from_name_round_trip),
        cmocka_unit_test(test_from_name_rejects_unknown),
        cmocka_unit_test(test_strings_are_total),
        cmocka_unit_test(test_nats_special_statuses),
        cmocka_unit_test(test_nats_wrap_round_trip),
        cmocka_unit_test(test_nats_unknown_wrapped_status_text),
        cmocka_unit_test(test_stream_reasons),
        cmocka_unit_test(test_status_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
