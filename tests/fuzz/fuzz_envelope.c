/* tests/fuzz/fuzz_envelope.c -- fuzz body for sealed envelopes
 * (transport/envelope.c): what a sealing connection does with every message
 * it receives, under a fixed cluster key.
 *
 * data[0] selects a subject (one of each family, a long one, and one taken
 * from the input) and a mode:
 *   mode 0, received as is: the rest of the input is opened as an envelope.
 *     Properties: the result is ok or auth_failed; on auth_failed the length
 *     is 0; swt_env_is_sealed never reads past the input; whatever opens is
 *     then fed to the message's own bounded decoder (as the receivers do),
 *     which must return, ok or an error, without crashing.
 *   mode 1, sealed then changed: the rest is a message, sealed for the
 *     subject (a malformed request, item or control is refused, and only
 *     those); it must open to the same bytes on that subject, and fail
 *     (auth_failed, nothing out) on another subject, after any one bit
 *     flip, or cut short.
 * abort() on a violated property. Built as the libFuzzer target
 * fuzz_envelope (-DSW_BUILD_FUZZ=ON) and as fuzz_envelope_replay, which the
 * normal suite runs over tests/fuzz/corpus-envelope. Single-threaded. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/sw_codec.h"
#include "transport/envelope.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
void fuzz_decode_stats(unsigned long *decoded, unsigned long *rejected);

static unsigned long n_opened, n_refused;
static swt_sealer *g_s;

void
fuzz_decode_stats(unsigned long *decoded, unsigned long *rejected)
{
    *decoded = n_opened;
    *rejected = n_refused;
}

#define CHECK(c)                                                                             \
    do {                                                                                     \
        if (!(c)) {                                                                          \
            fprintf(stderr, "fuzz_envelope: property failed: %s (line %d)\n", #c, __LINE__); \
            abort();                                                                         \
        }                                                                                    \
    } while (0)

static const char *const SUBJECTS[] = {
    "sw.req.ns.comp.gen.w1",
    "sw.ctl.w1",
    "sw.rsp.r1.0102030405060708090a0b0c0d0e0f10",
    "sw.rsp.r1.hb",
    "sw.prb.r1.w1",
    "sw.rtr.r1",
    "sw.lv.w1.r1",
    "custom.reply.subject",
};
#define NSUBJ (sizeof(SUBJECTS) / sizeof(SUBJECTS[0]))

static void
decode_as_receiver(const char *subject, const uint8_t *p, size_t n)
{
    void *m = NULL;
    swt_env_class cl;
    swt_env_classify(subject, &cl);
    switch (cl.msg_type) {
    case SWT_SEAL_MSG_REQUEST:
        (void)swp_decode_request(p, n, 1 << 20, (swp_request **)&m);
        break;
    case SWT_SEAL_MSG_CONTROL:
        (void)swp_decode_control(p, n, 1 << 20, (swp_control **)&m);
        break;
    case SWT_SEAL_MSG_HEARTBEAT_BATCH:
        (void)swp_decode_beats(p, n, 1 << 20, (swp_beats **)&m);
        break;
    case SWT_SEAL_MSG_PROBE_REPLY:
        (void)swp_decode_probe_reply(p, n, 1 << 20, (swp_probe_reply **)&m);
        break;
    default:
        (void)swp_decode_item(p, n, 1 << 20, (swp_item **)&m);
        break;
    }
    swp_free(m);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t pt[70000], env[70100], out[70100];
    const char *subject;
    char own[64];
    size_t plen = 0, elen = 0;
    int mode;
    if (g_s == NULL) {
        uint8_t raw[32];
        swt_seal_key k;
        memset(raw, 0x5a, sizeof(raw));
        if (swt_seal_key_from_bytes(raw, &k) != SW_OK || swt_sealer_from_key(&g_s, &k) != SW_OK)
            abort();
        swt_seal_key_wipe(&k);
    }
    if (size < 2 || size > 66000)
        return 0;
    mode = data[0] & 1;
    if ((data[0] >> 1) % (NSUBJ + 1) == NSUBJ) { /* a subject from the input */
        size_t n = data[1] % 40;
        if (size < 2 + n)
            return 0;
        memcpy(own, "sw.", 3);
        for (size_t i = 0; i < n; i++)
            own[3 + i] = (char)(data[2 + i] % 26 + 'a');
        own[3 + n] = '\0';
        subject = own;
        data += 2 + n;
        size -= 2 + n;
    } else {
        subject = SUBJECTS[(data[0] >> 1) % (NSUBJ + 1)];
        data += 2;
        size -= 2;
    }
    if (mode == 0) {
        /* mode 0: received as is */
        sw_err e;
        (void)swt_env_is_sealed(data, size);
        e = swt_env_open(g_s, subject, data, size, pt, sizeof(pt), &plen);
        CHECK(e == SW_OK || e == SW_AUTH_FAILED);
        if (e == SW_OK) {
            n_opened++;
            decode_as_receiver(subject, pt, plen);
        } else {
            CHECK(plen == 0);
            n_refused++;
        }
        return 0;
    }
    /* mode 1: seal, open, then change */
    if (swt_env_seal(g_s, subject, data, size, env, sizeof(env), &elen) != SW_OK) {
        /* only a malformed request, item or control is refused */
        swt_env_class cl;
        swt_env_classify(subject, &cl);
        CHECK(cl.msg_type == SWT_SEAL_MSG_REQUEST || cl.msg_type == SWT_SEAL_MSG_ITEM ||
              cl.msg_type == SWT_SEAL_MSG_CONTROL);
        n_refused++;
        return 0;
    }
    CHECK(elen <= size + SWT_ENV_OVERHEAD);
    CHECK(swt_env_is_sealed(env, elen));
    CHECK(swt_env_open(g_s, subject, env, elen, out, sizeof(out), &plen) == SW_OK);
    CHECK(plen == size && memcmp(out, data, size) == 0);
    n_opened++;
    {
        const char *other = strcmp(subject, SUBJECTS[0]) == 0 ? SUBJECTS[1] : SUBJECTS[0];
        size_t bit = size ? (size_t)data[size / 2] * 131u : 7u;
        CHECK(swt_env_open(g_s, other, env, elen, out, sizeof(out), &plen) == SW_AUTH_FAILED &&
              plen == 0);
        env[(bit / 8) % elen] ^= (uint8_t)(1u << (bit % 8));
        CHECK(swt_env_open(g_s, subject, env, elen, out, sizeof(out), &plen) == SW_AUTH_FAILED &&
              plen == 0);
        env[(bit / 8) % elen] ^= (uint8_t)(1u << (bit % 8));
        CHECK(swt_env_open(g_s, subject, env, elen - 1 - bit % elen, out, sizeof(out), &plen) ==
                  SW_AUTH_FAILED &&
              plen == 0);
    }
    n_refused += 3;
    return 0;
}
