/* tests/fuzz/fuzz_seal.c -- fuzz body for the seal-open path
 * (transport/seal.c), under a fixed cluster key.
 *
 * Input: data[0] % 2 selects the mode; then the associated data and the
 * stream are read from the input (scope, message type, kind, final, seq,
 * a context of up to 79 bytes, a request id), then:
 *   mode 0, forged: a key id (the key's own, or one from the input), a
 *     nonce of 0..31 bytes and the rest as ciphertext, opened as received.
 *     Properties: the result is ok, auth_failed or (ciphertext past the
 *     output buffer) payload_too_large, nothing else; on ok the plaintext is
 *     the ciphertext's length - 16; on auth_failed the output is all zeros
 *     and its length 0.
 *   mode 1, sealed then tampered: a mutation (what to change and how) and
 *     the rest as plaintext (up to 64 KiB), sealed; it must open to the same
 *     bytes; then one change -- a bit of the nonce or ciphertext, a
 *     truncation, or one field of the associated data, the scope, the
 *     request id or the key id -- must make it fail with auth_failed, with
 *     nothing left in the output.
 * abort() on a violated property, so libFuzzer and the replay driver both
 * see a crash.
 *
 * Built two ways, like fuzz_decode.c: with -fsanitize=fuzzer
 * (tests/fuzz/CMakeLists.txt, target fuzz_seal) and with fuzz_replay_main.c
 * as the plain program fuzz_seal_replay that the normal suite runs over
 * tests/fuzz/corpus-seal. Single-threaded. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sw_common.h"
#include "transport/seal.h"

#define FUZZ_PT_MAX (64u * 1024u)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* The replay driver's statistics hook: inputs so far that opened (mode 0
 * forged inputs that opened, mode 1 round trips) / that were refused. */
void fuzz_decode_stats(unsigned long *decoded, unsigned long *rejected);

static unsigned long n_opened, n_refused;

void
fuzz_decode_stats(unsigned long *decoded, unsigned long *rejected)
{
    *decoded = n_opened;
    *rejected = n_refused;
}

typedef struct rd {
    const uint8_t *p;
    size_t n;
} rd;

static uint8_t
rd_u8(rd *r)
{
    uint8_t v = 0;
    if (r->n > 0) {
        v = r->p[0];
        r->p++;
        r->n--;
    }
    return v;
}

static uint64_t
rd_u64(rd *r, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v = v << 8 | rd_u8(r);
    return v;
}

static void
rd_bytes(rd *r, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = rd_u8(r);
}

static _Noreturn void
fuzz_fail(const char *what)
{
    fprintf(stderr, "fuzz_seal: property violated: %s\n", what);
    abort();
}

static const swt_seal_key *
fuzz_key(void)
{
    static swt_seal_key key;
    static int ready;
    if (!ready) {
        uint8_t raw[SWT_SEAL_KEY_BYTES];
        for (int i = 0; i < SWT_SEAL_KEY_BYTES; i++)
            raw[i] = (uint8_t)(0x42 + 7 * i);
        if (swi_init() != SW_OK || swt_seal_key_from_bytes(raw, &key) != SW_OK)
            fuzz_fail("key set-up");
        ready = 1;
    }
    return &key;
}

static uint8_t g_ct[FUZZ_PT_MAX + SWT_SEAL_TAG_BYTES + 64];
static uint8_t g_pt[FUZZ_PT_MAX + 64];
static char g_ctx[80], g_ctx2[80];

/* Opens and checks that it fails with nothing left in the output. */
static void
expect_refused(const swt_seal_subkey *sub, uint32_t key_id, const swt_seal_ad *ad,
               const uint8_t *nonce, size_t nonce_len, const uint8_t *ct, size_t ct_len,
               const char *what)
{
    size_t pt_len = 7;
    sw_err err;
    memset(g_pt, 0x5a, FUZZ_PT_MAX);
    err = swt_open(sub, key_id, ad, nonce, nonce_len, ct, ct_len, g_pt, FUZZ_PT_MAX, &pt_len);
    if (err != SW_AUTH_FAILED)
        fuzz_fail(what);
    if (pt_len != 0)
        fuzz_fail("a refused open reports a length");
    if (ct_len >= SWT_SEAL_TAG_BYTES && ct_len - SWT_SEAL_TAG_BYTES <= FUZZ_PT_MAX) {
        /* the part an open would have written is zeros or untouched */
        for (size_t i = 0; i < ct_len - SWT_SEAL_TAG_BYTES; i++)
            if (g_pt[i] != 0 && g_pt[i] != 0x5a)
                fuzz_fail("a refused open left plaintext in the output");
    }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const swt_seal_key *key = fuzz_key();
    rd r = {data, size};
    uint8_t mode = rd_u8(&r) % 2;
    swt_seal_scope scope = (swt_seal_scope)(1 + rd_u8(&r) % 6);
    swt_seal_ad ad;
    uint8_t rid[SWT_SEAL_RID_BYTES];
    swt_seal_subkey sub;
    size_t ctx_len;

    memset(&ad, 0, sizeof(ad));
    ad.msg_type = rd_u8(&r);
    ad.kind = rd_u8(&r);
    ad.final = rd_u8(&r) & 1;
    ad.seq = rd_u64(&r, 8);
    ctx_len = rd_u8(&r) % sizeof(g_ctx);
    rd_bytes(&r, (uint8_t *)g_ctx, ctx_len);
    ad.context = g_ctx;
    ad.context_len = ctx_len;
    rd_bytes(&r, rid, sizeof(rid));
    if (swt_seal_derive(key, scope, scope <= SWT_SEAL_STREAM_W2F ? rid : NULL, &sub) != SW_OK)
        fuzz_fail("derive");

    if (mode == 0) {
        uint8_t id_sel = rd_u8(&r);
        uint32_t key_id = (uint32_t)rd_u64(&r, 4);
        uint8_t nonce[32];
        size_t nonce_len = rd_u8(&r) % sizeof(nonce), pt_len = 7;
        sw_err err;
        if (id_sel & 1)
            key_id = key->id;
        rd_bytes(&r, nonce, nonce_len);
        memset(g_pt, 0x5a, FUZZ_PT_MAX);
        err = swt_open(&sub, key_id, &ad, nonce, nonce_len, r.p, r.n, g_pt, FUZZ_PT_MAX, &pt_len);
        if (err == SW_OK) {
            if (r.n < SWT_SEAL_TAG_BYTES || pt_len != r.n - SWT_SEAL_TAG_BYTES)
                fuzz_fail("opened with a wrong length");
            n_opened++;
        } else if (err == SW_AUTH_FAILED) {
            if (pt_len != 0)
                fuzz_fail("refused with a length");
            if (r.n >= SWT_SEAL_TAG_BYTES && r.n - SWT_SEAL_TAG_BYTES <= FUZZ_PT_MAX) {
                for (size_t i = 0; i < r.n - SWT_SEAL_TAG_BYTES; i++)
                    if (g_pt[i] != 0 && g_pt[i] != 0x5a)
                        fuzz_fail("refused open left plaintext");
            }
            n_refused++;
        } else if (err == SW_EMSGSIZE) {
            if (r.n < SWT_SEAL_TAG_BYTES || r.n - SWT_SEAL_TAG_BYTES <= FUZZ_PT_MAX)
                fuzz_fail("payload_too_large for a ciphertext that fits");
            n_refused++;
        } else {
            fuzz_fail("open returned an unexpected error");
        }
    } else {
        uint8_t what = rd_u8(&r);
        uint32_t where = (uint32_t)rd_u64(&r, 4);
        uint8_t flip = (uint8_t)(rd_u8(&r) | 1);
        uint8_t nonce[SWT_SEAL_NONCE_BYTES];
        size_t pt_len = r.n > FUZZ_PT_MAX ? FUZZ_PT_MAX : r.n, ct_len = 0, out_len = 0;
        swt_seal_ad bad = ad;
        swt_seal_subkey other = {0};

        if (swt_seal(&sub, &ad, pt_len ? r.p : NULL, pt_len, nonce, g_ct, sizeof(g_ct), &ct_len) !=
                SW_OK ||
            ct_len != pt_len + SWT_SEAL_TAG_BYTES)
            fuzz_fail("seal");
        if (swt_open(&sub, key->id, &ad, nonce, sizeof(nonce), g_ct, ct_len, g_pt, FUZZ_PT_MAX,
                     &out_len) != SW_OK ||
            out_len != pt_len || (pt_len > 0 && memcmp(g_pt, r.p, pt_len) != 0))
            fuzz_fail("round trip");
        n_opened++;
        switch (what % 12) {
        case 0: /* a bit of the nonce or the ciphertext */
        {
            size_t pos = where % (sizeof(nonce) + ct_len);
            uint8_t *p = pos < sizeof(nonce) ? &nonce[pos] : &g_ct[pos - sizeof(nonce)];
            *p ^= flip;
            expect_refused(&sub, key->id, &ad, nonce, sizeof(nonce), g_ct, ct_len, "tampered byte");
            *p ^= flip;
            break;
        }
        case 1: /* truncated */
            expect_refused(&sub, key->id, &ad, nonce, sizeof(nonce), g_ct, where % ct_len,
                           "truncated");
            break;
        case 2:
            bad.msg_type ^= flip;
            break;
        case 3:
            bad.kind ^= flip;
            break;
        case 4:
            bad.final ^= 1;
            break;
        case 5:
            bad.seq ^= (uint64_t)flip << (where % 57);
            break;
        case 6: /* another context of any length */
            memcpy(g_ctx2, g_ctx, sizeof(g_ctx2));
            if (ctx_len > 0 && (where & 1)) {
                g_ctx2[where % ctx_len] ^= (char)flip;
                bad.context = g_ctx2;
            } else {
                bad.context_len = (ctx_len + 1 + where % 10) % sizeof(g_ctx2);
                if (bad.context_len == ctx_len)
                    bad.context_len = (ctx_len + 1) % sizeof(g_ctx2);
                bad.context = g_ctx2;
            }
            break;
        case 7: /* another scope */
        {
            swt_seal_scope s2 = (swt_seal_scope)(1 + (scope + flip % 5) % 6);
            if (s2 == scope)
                fuzz_fail("scope arithmetic");
            if (swt_seal_derive(key, s2, s2 <= SWT_SEAL_STREAM_W2F ? rid : NULL, &other) != SW_OK)
                fuzz_fail("derive other scope");
            expect_refused(&other, key->id, &ad, nonce, sizeof(nonce), g_ct, ct_len,
                           "opened under another scope");
            break;
        }
        case 8: /* another stream (or, instance-wide, the same key: nothing to change) */
            if (scope <= SWT_SEAL_STREAM_W2F) {
                rid[where % sizeof(rid)] ^= flip;
                if (swt_seal_derive(key, scope, rid, &other) != SW_OK)
                    fuzz_fail("derive other stream");
                expect_refused(&other, key->id, &ad, nonce, sizeof(nonce), g_ct, ct_len,
                               "opened for another stream");
            }
            break;
        case 9: /* another key id as received */
            expect_refused(&sub, key->id ^ ((uint32_t)flip << (where % 25)), &ad, nonce,
                           sizeof(nonce), g_ct, ct_len, "opened with another key id");
            break;
        case 10: /* a nonce of another length */
            expect_refused(&sub, key->id, &ad, nonce, where % sizeof(nonce), g_ct, ct_len,
                           "short nonce");
            break;
        default: /* an extra byte (that still fits the output buffer) */
            if (pt_len == FUZZ_PT_MAX) {
                expect_refused(&sub, key->id, &ad, nonce, sizeof(nonce), g_ct, ct_len - 1,
                               "truncated by one");
                break;
            }
            g_ct[ct_len] = flip;
            expect_refused(&sub, key->id, &ad, nonce, sizeof(nonce), g_ct, ct_len + 1,
                           "extended ciphertext");
            break;
        }
        if (what % 12 >= 2 && what % 12 <= 6)
            expect_refused(&sub, key->id, &bad, nonce, sizeof(nonce), g_ct, ct_len,
                           "opened with other associated data");
        swt_seal_subkey_wipe(&other);
        n_refused++;
    }
    swt_seal_subkey_wipe(&sub);
    return 0;
}
