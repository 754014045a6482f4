/* tests/unit/test_envelope.c -- sealed envelopes (transport/envelope.c):
 * round trips on every subject family, what the associated data binds
 * (subject, direction, key, request id), every tampered and truncated byte,
 * the clear fields allowed, the overhead bound, and detection of sealed
 * bytes. No server. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "proto/sw_codec.h"
#include "transport/envelope.h"
#include "transport/sw_transport.h"

static const uint8_t RID[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

static swt_sealer *
sealer(uint8_t fill)
{
    uint8_t raw[32];
    swt_seal_key k;
    swt_sealer *s = NULL;
    memset(raw, fill, sizeof(raw));
    assert_int_equal(swt_seal_key_from_bytes(raw, &k), SW_OK);
    assert_int_equal(swt_sealer_from_key(&s, &k), SW_OK);
    swt_seal_key_wipe(&k);
    return s;
}

/* An encoded StreamItemWrapper (data item) for RID. */
static size_t
item_bytes(uint8_t *out, size_t cap, uint64_t seq, const char *data)
{
    swp_item m = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__INIT;
    size_t n = 0;
    m.version = 1;
    m.request_id.data = (uint8_t *)RID;
    m.request_id.len = 16;
    m.seq = seq;
    m.body_case = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_DATA;
    m.data.data = (uint8_t *)data;
    m.data.len = strlen(data);
    assert_int_equal(swp_encode(&m, out, cap, &n), SW_OK);
    return n;
}

static size_t
beats_bytes(uint8_t *out, size_t cap)
{
    swp_beats b = STREAMWIRE__V1__HEARTBEAT_BATCH__INIT;
    swp_beat one = STREAMWIRE__V1__STREAM_BEAT__INIT, *v[1] = {&one};
    size_t n = 0;
    b.version = 1;
    b.instance_id = "0123456789abcdef"; /* 16 characters: not a request id */
    one.request_id.data = (uint8_t *)RID;
    one.request_id.len = 16;
    one.last_seq = 7;
    b.n_beats = 1;
    b.beats = v;
    assert_int_equal(swp_encode(&b, out, cap, &n), SW_OK);
    return n;
}

static void
round_trip(swt_sealer *s, const char *subject, const uint8_t *msg, size_t len)
{
    uint8_t env[4096], pt[4096];
    size_t elen = 0, plen = 0;
    assert_int_equal(swt_env_seal(s, subject, msg, len, env, sizeof(env), &elen), SW_OK);
    assert_true(elen <= len + SWT_ENV_OVERHEAD);
    assert_true(swt_env_is_sealed(env, elen));
    assert_false(swt_env_is_sealed(msg, len));
    assert_int_equal(swt_env_open(s, subject, env, elen, pt, sizeof(pt), &plen), SW_OK);
    assert_int_equal(plen, len);
    assert_memory_equal(pt, msg, len);
}

static void
test_round_trips(void **state)
{
    swt_sealer *s = sealer(7);
    uint8_t m[1024];
    size_t n;
    (void)state;
    n = item_bytes(m, sizeof(m), 3, "token-2");
    round_trip(s, "sw.rsp.router1.0102030405060708090a0b0c0d0e0f10", m, n);
    round_trip(s, "sw.req.ns.comp.gen.w1", m, n); /* any message type on any family */
    round_trip(s, "sw.ctl.w1", m, n);
    n = beats_bytes(m, sizeof(m));
    round_trip(s, "sw.rsp.router1.hb", m, n);
    round_trip(s, "sw.prb.router1.w1", m, n);
    round_trip(s, "sw.lv.w1.router1", m, n);
    round_trip(s, "sw.rtr.router1", NULL, 0); /* a worker's empty liveness probe */
    {
        /* a subject longer than the AD's 256-byte context: bound to its hash */
        char longsub[400];
        memset(longsub, 'a', sizeof(longsub) - 1);
        longsub[sizeof(longsub) - 1] = '\0';
        memcpy(longsub, "sw.req.", 7);
        n = item_bytes(m, sizeof(m), 1, "x");
        round_trip(s, longsub, m, n);
    }
    swt_sealer_free(s);
}

/* Opens only on its own subject, direction, request id and key. */
static void
test_binding(void **state)
{
    swt_sealer *s = sealer(7), *other = sealer(8);
    uint8_t m[256], env[512], pt[512];
    size_t n, elen = 0, plen = 99;
    (void)state;
    n = item_bytes(m, sizeof(m), 1, "hello");
    assert_int_equal(swt_env_seal(s, "sw.req.a.b.c.w1", m, n, env, sizeof(env), &elen), SW_OK);
    /* another instance's request subject (a replay elsewhere) */
    assert_int_equal(swt_env_open(s, "sw.req.a.b.c.w2", env, elen, pt, sizeof(pt), &plen),
                     SW_AUTH_FAILED);
    assert_int_equal(plen, 0);
    /* the same bytes on a worker -> frontend subject (another direction) */
    assert_int_equal(swt_env_open(s, "sw.rsp.r.0102030405060708090a0b0c0d0e0f10", env, elen, pt,
                                  sizeof(pt), &plen),
                     SW_AUTH_FAILED);
    /* another cluster key */
    assert_int_equal(swt_env_open(other, "sw.req.a.b.c.w1", env, elen, pt, sizeof(pt), &plen),
                     SW_AUTH_FAILED);
    /* another stream: the clear request id changed (the key with it) */
    env[4] ^= 1; /* version (2 bytes), tag and length of field 2, then the id */
    assert_int_equal(swt_env_open(s, "sw.req.a.b.c.w1", env, elen, pt, sizeof(pt), &plen),
                     SW_AUTH_FAILED);
    env[4] ^= 1;
    assert_int_equal(swt_env_open(s, "sw.req.a.b.c.w1", env, elen, pt, sizeof(pt), &plen), SW_OK);
    /* a too-small output buffer is auth_failed too (the bytes are not
     * authenticated yet), never a size error a forger could choose */
    assert_int_equal(swt_env_open(s, "sw.req.a.b.c.w1", env, elen, pt, 3, &plen), SW_AUTH_FAILED);
    swt_sealer_free(s);
    swt_sealer_free(other);
}

/* Every single-byte change and every truncation fails, with nothing out. */
static void
test_tamper_and_truncate(void **state)
{
    swt_sealer *s = sealer(9);
    uint8_t m[256], env[512], pt[512];
    size_t n, elen = 0, plen;
    const char *subj = "sw.rsp.r.0102030405060708090a0b0c0d0e0f10";
    (void)state;
    n = item_bytes(m, sizeof(m), 5, "some tokens here");
    assert_int_equal(swt_env_seal(s, subj, m, n, env, sizeof(env), &elen), SW_OK);
    for (size_t i = 0; i < elen; i++) {
        for (int bit = 0; bit < 8; bit++) {
            env[i] ^= (uint8_t)(1u << bit);
            plen = 77;
            if (swt_env_open(s, subj, env, elen, pt, sizeof(pt), &plen) == SW_OK)
                fail_msg("byte %zu bit %d changed and it still opened", i, bit);
            assert_int_equal(plen, 0);
            env[i] ^= (uint8_t)(1u << bit);
        }
    }
    for (size_t cut = 0; cut < elen; cut++)
        assert_int_equal(swt_env_open(s, subj, env, cut, pt, sizeof(pt), &plen), SW_AUTH_FAILED);
    /* a clear field beyond version, request id and Sealed is refused */
    {
        uint8_t more[600];
        memcpy(more, env, elen);
        more[elen] = (3 << 3) | 0; /* seq = 9 in the clear */
        more[elen + 1] = 9;
        assert_int_equal(swt_env_open(s, subj, more, elen + 2, pt, sizeof(pt), &plen),
                         SW_AUTH_FAILED);
    }
    /* unsealed bytes: not an envelope */
    assert_int_equal(swt_env_open(s, subj, m, n, pt, sizeof(pt), &plen), SW_AUTH_FAILED);
    swt_sealer_free(s);
}

/* Instance-wide messages (no request id) use the instance keys; a message
 * whose field 2 is not a request id (a heartbeat batch's instance id) is
 * sealed without one. */
static void
test_instance_wide(void **state)
{
    swt_sealer *s = sealer(3);
    uint8_t m[256], env[512];
    size_t n, elen = 0;
    (void)state;
    n = beats_bytes(m, sizeof(m));
    assert_int_equal(swt_env_seal(s, "sw.rsp.r.hb", m, n, env, sizeof(env), &elen), SW_OK);
    /* no clear request id: version, then field 15 */
    assert_int_equal(env[2], (15 << 3) | 2);
    swt_sealer_free(s);
}

static void
test_is_sealed_bounded(void **state)
{
    static const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0x0f, 0x7a};
    static const uint8_t long_len[] = {0x7a, 0xff, 0xff, 0xff, 0x7f};
    static const uint8_t f15_short[] = {0x7a, 0x00};
    (void)state;
    assert_false(swt_env_is_sealed(NULL, 0));
    assert_false(swt_env_is_sealed(garbage, sizeof(garbage)));
    assert_false(swt_env_is_sealed(long_len, sizeof(long_len)));
    assert_true(swt_env_is_sealed(f15_short, sizeof(f15_short)));
    {
        /* Where a sealer puts it: after version and the request id. */
        static const uint8_t third[] = {0x08, 0x01, 0x12, 0x01, 0xaa, 0x7a, 0x00};
        /* Past the first three fields: no sealer writes that, so not an
         * envelope (and the walk stops after three fields). */
        static const uint8_t fourth[] = {0x08, 0x01, 0x10, 0x02, 0x18, 0x03, 0x7a, 0x00};
        /* Field 15 of varint type is not the Sealed message. */
        static const uint8_t f15_varint[] = {0x78, 0x01};
        assert_true(swt_env_is_sealed(third, sizeof(third)));
        assert_false(swt_env_is_sealed(fourth, sizeof(fourth)));
        assert_false(swt_env_is_sealed(f15_varint, sizeof(f15_varint)));
    }
}

static void
test_classify(void **state)
{
    swt_env_class c;
    (void)state;
    swt_env_classify("sw.req.a.b.c.w", &c);
    assert_true(c.to_worker);
    assert_int_equal(c.msg_type, SWT_SEAL_MSG_REQUEST);
    swt_env_classify("sw.ctl.w", &c);
    assert_true(c.to_worker);
    assert_int_equal(c.msg_type, SWT_SEAL_MSG_CONTROL);
    swt_env_classify("sw.lv.w.r", &c);
    assert_true(c.to_worker);
    assert_int_equal(c.msg_type, SWT_SEAL_MSG_PROBE_REPLY);
    swt_env_classify("sw.rsp.r.hb", &c);
    assert_false(c.to_worker);
    assert_int_equal(c.msg_type, SWT_SEAL_MSG_HEARTBEAT_BATCH);
    swt_env_classify("sw.rsp.r.0102030405060708090a0b0c0d0e0f10", &c);
    assert_false(c.to_worker);
    assert_int_equal(c.msg_type, SWT_SEAL_MSG_ITEM);
    swt_env_classify("sw.prb.r.w", &c);
    assert_int_equal(c.msg_type, SWT_SEAL_MSG_PROBE_REPLY);
    swt_env_classify("sw.rtr.r", &c);
    assert_int_equal(c.msg_type, SWT_SEAL_MSG_PROBE);
    /* the subject kinds it reads (transport/subjects.c) */
    assert_int_equal(swt_subject_kind_of(NULL), SWT_SUBJ_OTHER);
    assert_int_equal(swt_subject_kind_of("inbox.x"), SWT_SUBJ_OTHER);
    assert_int_equal(swt_subject_kind_of("sw.rsp.hb"), SWT_SUBJ_OTHER); /* no router token */
    assert_int_equal(swt_subject_kind_of("sw.rsp.r.hb"), SWT_SUBJ_BEATS);
    assert_int_equal(swt_subject_kind_of("sw.rsp.r.hbx"), SWT_SUBJ_OTHER);
    assert_int_equal(swt_subject_kind_of("sw.req.e.w"), SWT_SUBJ_REQUEST);
    assert_int_equal(swt_subject_kind_of("sw.ctl.w"), SWT_SUBJ_CONTROL);
    assert_int_equal(swt_subject_kind_of("sw.lv.w.r"), SWT_SUBJ_LIVE_REPLY);
    assert_int_equal(swt_subject_kind_of("sw.prb.r.w"), SWT_SUBJ_PROBE_REPLY);
    assert_int_equal(swt_subject_kind_of("sw.rtr.r"), SWT_SUBJ_ROUTER);
    swt_env_classify(NULL, &c);
    assert_false(c.to_worker);
    assert_int_equal(c.msg_type, SWT_SEAL_MSG_ITEM);
}

/* A sealer with a sealing key (fill a) and a second key that only opens
 * (fill b). */
static swt_sealer *
sealer2(uint8_t a, uint8_t b)
{
    uint8_t raw[32];
    swt_seal_key ka, kb;
    swt_sealer *s = NULL;
    memset(raw, a, sizeof(raw));
    assert_int_equal(swt_seal_key_from_bytes(raw, &ka), SW_OK);
    memset(raw, b, sizeof(raw));
    assert_int_equal(swt_seal_key_from_bytes(raw, &kb), SW_OK);
    assert_int_equal(swt_sealer_from_keys(&s, &ka, &kb), SW_OK);
    swt_seal_key_wipe(&ka);
    swt_seal_key_wipe(&kb);
    return s;
}

/* seal with `from`, open with `to`: SW_OK or SW_AUTH_FAILED; on SW_OK the
 * plaintext is the message. */
static sw_err
cross(swt_sealer *from, swt_sealer *to, const char *subject, const uint8_t *msg, size_t len)
{
    uint8_t env[4096], pt[4096];
    size_t elen = 0, plen = 0;
    sw_err e;
    assert_int_equal(swt_env_seal(from, subject, msg, len, env, sizeof(env), &elen), SW_OK);
    e = swt_env_open(to, subject, env, elen, pt, sizeof(pt), &plen);
    if (e == SW_OK) {
        assert_int_equal(plen, len);
        assert_memory_equal(pt, msg, len);
    }
    return e;
}

/* Key rotation: a second key opens what it sealed (streams, instance-wide
 * messages, registry values) but never seals; the sealing key is the only
 * one used to seal; a key id both keys share is refused. The three steps
 * of docs/PROTOCOL.md "Rotation", between processes at different steps. */
static void
test_rotation_two_keys(void **state)
{
    const char *subj[] = {"sw.rsp.r1.0102030405060708090a0b0c0d0e0f10",
                          "sw.req.ns.c.g.w1",
                          "sw.ctl.w1",
                          "sw.rsp.r1.hb",
                          "sw.prb.r1.w1",
                          "sw.lv.w1.r1"};
    swt_sealer *old_only = sealer(1), *new_only = sealer(2);
    swt_sealer *step1 = sealer2(1, 2); /* old seals, new opens too */
    swt_sealer *step2 = sealer2(2, 1); /* new seals, old opens too */
    uint8_t m[1024], env[2048], pt[2048];
    size_t n, elen, plen;
    (void)state;
    for (size_t i = 0; i < sizeof(subj) / sizeof(subj[0]); i++) {
        n = i == 3 || i == 4 ? beats_bytes(m, sizeof(m)) : item_bytes(m, sizeof(m), 1, "tok");
        /* step 1 and step 2 processes understand each other both ways */
        assert_int_equal(cross(step1, step2, subj[i], m, n), SW_OK);
        assert_int_equal(cross(step2, step1, subj[i], m, n), SW_OK);
        /* a step-1 process still talks to one that has only the old key */
        assert_int_equal(cross(step1, old_only, subj[i], m, n), SW_OK);
        assert_int_equal(cross(old_only, step1, subj[i], m, n), SW_OK);
        /* step 2 seals with the new key only: an old-only process cannot
         * open it, and a new-only one can */
        assert_int_equal(cross(step2, old_only, subj[i], m, n), SW_AUTH_FAILED);
        assert_int_equal(cross(step2, new_only, subj[i], m, n), SW_OK);
        assert_int_equal(cross(old_only, step2, subj[i], m, n), SW_OK);
        /* and step 1 seals with the old key only */
        assert_int_equal(cross(step1, new_only, subj[i], m, n), SW_AUTH_FAILED);
    }
    assert_int_equal(swt_sealer_key_id(step1), swt_sealer_key_id(old_only));
    assert_int_equal(swt_sealer_key_id(step2), swt_sealer_key_id(new_only));
    /* registry values too */
    n = item_bytes(m, sizeof(m), 1, "entry");
    assert_int_equal(swt_env_seal_kv(old_only, "ep.w1", m, n, env, sizeof(env), &elen), SW_OK);
    assert_int_equal(swt_env_open_kv(step2, "ep.w1", env, elen, pt, sizeof(pt), &plen), SW_OK);
    assert_int_equal(swt_env_open_kv(new_only, "ep.w1", env, elen, pt, sizeof(pt), &plen),
                     SW_AUTH_FAILED);
    swt_sealer_free(old_only);
    swt_sealer_free(new_only);
    swt_sealer_free(step1);
    swt_sealer_free(step2);

    /* Two keys with one id: refused (the same key, or an id collision). */
    {
        uint8_t raw[32];
        swt_seal_key a, b;
        swt_sealer *s = (swt_sealer *)(uintptr_t)1;
        memset(raw, 5, sizeof(raw));
        assert_int_equal(swt_seal_key_from_bytes(raw, &a), SW_OK);
        assert_int_equal(swt_sealer_from_keys(&s, &a, &a), SW_EINVAL);
        assert_null(s);
        memset(raw, 6, sizeof(raw));
        assert_int_equal(swt_seal_key_from_bytes(raw, &b), SW_OK);
        b.id = a.id; /* a collision of the 32-bit ids */
        assert_int_equal(swt_sealer_from_keys(&s, &a, &b), SW_EINVAL);
        assert_null(s);
        assert_int_equal(swt_sealer_from_keys(&s, &a, NULL), SW_OK);
        swt_sealer_free(s);
        swt_seal_key_wipe(&a);
        swt_seal_key_wipe(&b);
    }
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trips),         cmocka_unit_test(test_binding),
        cmocka_unit_test(test_tamper_and_truncate), cmocka_unit_test(test_instance_wide),
        cmocka_unit_test(test_is_sealed_bounded),   cmocka_unit_test(test_classify),
        cmocka_unit_test(test_rotation_two_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
