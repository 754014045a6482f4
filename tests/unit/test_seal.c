/* tests/unit/test_seal.c -- transport/seal.c, the sealing core: key files,
 * key ids, derived keys, seal/open and what binds a sealed message to its
 * stream, direction, position and kind (docs/PROTOCOL.md "Security:
 * sealing"). Ends with a micro-benchmark that prints, never asserts
 * (BENCHMARKS.md "Sealing"). Threads: the nonce test runs four sealers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <pthread.h>
#include <sodium.h>

#include "common/sw_common.h"
#include "transport/seal.h"

static const uint8_t RID_A[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
static const uint8_t RID_B[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 17};
static const char SUBJ[] = "sw.rsp.router1.0102030405060708090a0b0c0d0e0f10";

static char g_dir[64];

static int
setup_all(void **state)
{
    (void)state;
    if (swi_init() != SW_OK)
        return -1;
    snprintf(g_dir, sizeof(g_dir), "/tmp/test_seal.XXXXXX");
    return mkdtemp(g_dir) != NULL ? 0 : -1;
}

static int
teardown_all(void **state)
{
    (void)state;
    rmdir(g_dir);
    return 0;
}

static swt_seal_key
fixed_key(uint8_t fill)
{
    uint8_t raw[32];
    swt_seal_key k;
    memset(raw, fill, sizeof(raw));
    assert_int_equal(swt_seal_key_from_bytes(raw, &k), SW_OK);
    return k;
}

static swt_seal_ad
item_ad(uint64_t seq)
{
    swt_seal_ad ad = {SWT_SEAL_MSG_ITEM, 1, 0, seq, SUBJ, sizeof(SUBJ) - 1};
    return ad;
}

/* Seals msg under sub/ad into the caller's buffers. */
static void
seal_into(const swt_seal_subkey *sub, const swt_seal_ad *ad, const void *msg, size_t len,
          uint8_t nonce[24], uint8_t *ct, size_t cap, size_t *ct_len)
{
    assert_int_equal(swt_seal(sub, ad, msg, len, nonce, ct, cap, ct_len), SW_OK);
    assert_int_equal(*ct_len, len + SWT_SEAL_TAG_BYTES);
}

static sw_err
open_with(const swt_seal_subkey *sub, uint32_t key_id, const swt_seal_ad *ad, const uint8_t *nonce,
          const uint8_t *ct, size_t ct_len, uint8_t *pt, size_t cap, size_t *pt_len)
{
    return swt_open(sub, key_id, ad, nonce, SWT_SEAL_NONCE_BYTES, ct, ct_len, pt, cap, pt_len);
}

static void
test_round_trip(void **state)
{
    static const size_t sizes[] = {1, 2, 63, 64, 1000, 1024, 65536};
    swt_seal_key k = fixed_key(7);
    swt_seal_subkey sub;
    (void)state;
    assert_int_equal(swt_seal_derive(&k, SWT_SEAL_STREAM_W2F, RID_A, &sub), SW_OK);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        size_t n = sizes[i], ct_len, pt_len = 99;
        uint8_t *msg = malloc(n), *ct = malloc(n + 16), *pt = malloc(n);
        uint8_t nonce[24];
        swt_seal_ad ad = item_ad(i + 1);
        assert_non_null(msg);
        assert_non_null(ct);
        assert_non_null(pt);
        randombytes_buf(msg, n);
        seal_into(&sub, &ad, msg, n, nonce, ct, n + 16, &ct_len);
        assert_memory_not_equal(ct, msg, n < 16 ? n : 16); /* it is encrypted */
        assert_int_equal(open_with(&sub, k.id, &ad, nonce, ct, ct_len, pt, n, &pt_len), SW_OK);
        assert_int_equal(pt_len, n);
        assert_memory_equal(pt, msg, n);
        free(msg);
        free(ct);
        free(pt);
    }
    swt_seal_subkey_wipe(&sub);
    swt_seal_key_wipe(&k);
}

static void
test_empty_plaintext(void **state)
{
    swt_seal_key k = fixed_key(7);
    swt_seal_subkey sub;
    uint8_t nonce[24], ct[16], pt[4];
    size_t ct_len, pt_len = 5;
    swt_seal_ad ad = item_ad(9);
    (void)state;
    ad.final = 1;
    assert_int_equal(swt_seal_derive(&k, SWT_SEAL_STREAM_W2F, RID_A, &sub), SW_OK);
    seal_into(&sub, &ad, NULL, 0, nonce, ct, sizeof(ct), &ct_len);
    assert_int_equal(open_with(&sub, k.id, &ad, nonce, ct, ct_len, NULL, 0, &pt_len), SW_OK);
    assert_int_equal(pt_len, 0);
    assert_int_equal(open_with(&sub, k.id, &ad, nonce, ct, ct_len, pt, sizeof(pt), &pt_len), SW_OK);
    /* an empty final is still bound: as a non-final it does not open */
    ad.final = 0;
    assert_int_equal(open_with(&sub, k.id, &ad, nonce, ct, ct_len, NULL, 0, &pt_len),
                     SW_AUTH_FAILED);
}

/* Changing any one field of the associated data makes the open fail. */
static void
test_every_ad_field_binds(void **state)
{
    swt_seal_key k = fixed_key(7);
    swt_seal_subkey sub;
    uint8_t nonce[24], ct[64 + 16], pt[64], msg[64];
    size_t ct_len, pt_len;
    const swt_seal_ad good = item_ad(42);
    static const char other_subj[] = "sw.rsp.router2.0102030405060708090a0b0c0d0e0f10";
    (void)state;
    memset(msg, 'x', sizeof(msg));
    assert_int_equal(swt_seal_derive(&k, SWT_SEAL_STREAM_W2F, RID_A, &sub), SW_OK);
    seal_into(&sub, &good, msg, sizeof(msg), nonce, ct, sizeof(ct), &ct_len);
    for (int field = 0; field < 8; field++) {
        swt_seal_ad ad = good;
        switch (field) {
        case 0:
            ad.msg_type = SWT_SEAL_MSG_HEARTBEAT;
            break;
        case 1:
            ad.kind = 2;
            break;
        case 2:
            ad.final = 1;
            break;
        case 3:
            ad.seq = 43;
            break;
        case 4:
            ad.seq = 42 + (UINT64_C(1) << 32);
            break;
        case 5:
            ad.context = other_subj;
            break;
        case 6:
            ad.context_len--;
            break;
        case 7:
            ad.context = NULL;
            ad.context_len = 0;
            break;
        }
        memset(pt, 0xee, sizeof(pt));
        assert_int_equal(open_with(&sub, k.id, &ad, nonce, ct, ct_len, pt, sizeof(pt), &pt_len),
                         SW_AUTH_FAILED);
        assert_int_equal(pt_len, 0);
        for (size_t i = 0; i < sizeof(pt); i++)
            assert_int_equal(pt[i], 0); /* no byte of the failed item is left */
    }
    assert_int_equal(open_with(&sub, k.id, &good, nonce, ct, ct_len, pt, sizeof(pt), &pt_len),
                     SW_OK);
}

/* Another direction, stream, scope, key id or cluster key: no open. */
static void
test_wrong_key(void **state)
{
    swt_seal_key k = fixed_key(7), k2 = fixed_key(8);
    swt_seal_subkey w2f, f2w, other_stream, other_cluster, wrong_id;
    uint8_t nonce[24], ct[32 + 16], pt[32], msg[32] = "a token";
    size_t ct_len, pt_len;
    swt_seal_ad ad = item_ad(1);
    (void)state;
    assert_int_not_equal(k.id, k2.id);
    assert_int_equal(swt_seal_derive(&k, SWT_SEAL_STREAM_W2F, RID_A, &w2f), SW_OK);
    assert_int_equal(swt_seal_derive(&k, SWT_SEAL_STREAM_F2W, RID_A, &f2w), SW_OK);
    assert_int_equal(swt_seal_derive(&k, SWT_SEAL_STREAM_W2F, RID_B, &other_stream), SW_OK);
    assert_int_equal(swt_seal_derive(&k2, SWT_SEAL_STREAM_W2F, RID_A, &other_cluster), SW_OK);
    seal_into(&w2f, &ad, msg, sizeof(msg), nonce, ct, sizeof(ct), &ct_len);
    assert_int_equal(open_with(&f2w, k.id, &ad, nonce, ct, ct_len, pt, sizeof(pt), &pt_len),
                     SW_AUTH_FAILED);
    assert_int_equal(
        open_with(&other_stream, k.id, &ad, nonce, ct, ct_len, pt, sizeof(pt), &pt_len),
        SW_AUTH_FAILED);
    assert_int_equal(
        open_with(&other_cluster, k2.id, &ad, nonce, ct, ct_len, pt, sizeof(pt), &pt_len),
        SW_AUTH_FAILED);
    /* the key id as received must be the key's */
    assert_int_equal(open_with(&w2f, k.id ^ 1, &ad, nonce, ct, ct_len, pt, sizeof(pt), &pt_len),
                     SW_AUTH_FAILED);
    /* the key id is in the AD too: a subkey claiming another id does not open */
    wrong_id = w2f;
    wrong_id.key_id ^= 1;
    assert_int_equal(
        open_with(&wrong_id, wrong_id.key_id, &ad, nonce, ct, ct_len, pt, sizeof(pt), &pt_len),
        SW_AUTH_FAILED);
    assert_int_equal(open_with(&w2f, k.id, &ad, nonce, ct, ct_len, pt, sizeof(pt), &pt_len), SW_OK);
    swt_seal_subkey_wipe(&w2f);
    swt_seal_subkey_wipe(&f2w);
    swt_seal_subkey_wipe(&other_stream);
    swt_seal_subkey_wipe(&other_cluster);
}

/* Instance-wide scopes: one key per scope; the subject binds. */
static void
test_instance_scopes(void **state)
{
    static const char hb1[] = "sw.rsp.router1.hb", hb2[] = "sw.rsp.router2.hb";
    swt_seal_key k = fixed_key(7);
    swt_seal_subkey subs[4];
    const swt_seal_scope scopes[4] = {SWT_SEAL_INST_F2W, SWT_SEAL_INST_W2F, SWT_SEAL_REGISTRY,
                                      SWT_SEAL_DEAD};
    uint8_t nonce[24], ct[8 + 16], pt[8], msg[8] = "beats";
    size_t ct_len, pt_len;
    swt_seal_ad ad = {SWT_SEAL_MSG_HEARTBEAT_BATCH, 0, 0, 0, hb1, sizeof(hb1) - 1};
    (void)state;
    for (int i = 0; i < 4; i++)
        assert_int_equal(swt_seal_derive(&k, scopes[i], NULL, &subs[i]), SW_OK);
    for (int i = 0; i < 4; i++)
        for (int j = i + 1; j < 4; j++)
            assert_memory_not_equal(subs[i].k, subs[j].k, 32);
    seal_into(&subs[1], &ad, msg, sizeof(msg), nonce, ct, sizeof(ct), &ct_len);
    assert_int_equal(open_with(&subs[1], k.id, &ad, nonce, ct, ct_len, pt, sizeof(pt), &pt_len),
                     SW_OK);
    for (int i = 0; i < 4; i++) {
        if (i != 1)
            assert_int_equal(
                open_with(&subs[i], k.id, &ad, nonce, ct, ct_len, pt, sizeof(pt), &pt_len),
                SW_AUTH_FAILED);
    }
    ad.context = hb2; /* replayed on another router's heartbeat subject */
    assert_int_equal(open_with(&subs[1], k.id, &ad, nonce, ct, ct_len, pt, sizeof(pt), &pt_len),
                     SW_AUTH_FAILED);
    for (int i = 0; i < 4; i++)
        swt_seal_subkey_wipe(&subs[i]);
}

/* Every single-bit flip of nonce or ciphertext (tag included) fails. */
static void
test_tampered_byte_anywhere(void **state)
{
    swt_seal_key k = fixed_key(7);
    swt_seal_subkey sub;
    uint8_t nonce[24], ct[100 + 16], pt[100], msg[100];
    size_t ct_len, pt_len;
    swt_seal_ad ad = item_ad(5);
    (void)state;
    randombytes_buf(msg, sizeof(msg));
    assert_int_equal(swt_seal_derive(&k, SWT_SEAL_STREAM_W2F, RID_A, &sub), SW_OK);
    seal_into(&sub, &ad, msg, sizeof(msg), nonce, ct, sizeof(ct), &ct_len);
    for (size_t i = 0; i < ct_len + sizeof(nonce); i++) {
        for (int bit = 0; bit < 8; bit += 7) {
            uint8_t *p = i < ct_len ? &ct[i] : &nonce[i - ct_len];
            *p ^= (uint8_t)(1u << bit);
            assert_int_equal(open_with(&sub, k.id, &ad, nonce, ct, ct_len, pt, sizeof(pt), &pt_len),
                             SW_AUTH_FAILED);
            *p ^= (uint8_t)(1u << bit);
        }
    }
    assert_int_equal(open_with(&sub, k.id, &ad, nonce, ct, ct_len, pt, sizeof(pt), &pt_len), SW_OK);
    assert_memory_equal(pt, msg, sizeof(msg));
}

/* Every truncation, an extension, and a nonce of the wrong length fail. */
static void
test_truncated(void **state)
{
    swt_seal_key k = fixed_key(7);
    swt_seal_subkey sub;
    uint8_t nonce[25], ct[40 + 16 + 1], pt[41], msg[40];
    size_t ct_len, pt_len;
    swt_seal_ad ad = item_ad(5);
    (void)state;
    memset(msg, 'q', sizeof(msg));
    assert_int_equal(swt_seal_derive(&k, SWT_SEAL_STREAM_W2F, RID_A, &sub), SW_OK);
    seal_into(&sub, &ad, msg, sizeof(msg), nonce, ct, sizeof(ct), &ct_len);
    for (size_t n = 0; n < ct_len; n++)
        assert_int_equal(open_with(&sub, k.id, &ad, nonce, ct, n, pt, sizeof(pt), &pt_len),
                         SW_AUTH_FAILED);
    ct[ct_len] = 0;
    assert_int_equal(open_with(&sub, k.id, &ad, nonce, ct, ct_len + 1, pt, sizeof(pt), &pt_len),
                     SW_AUTH_FAILED);
    for (size_t nl = 0; nl <= sizeof(nonce); nl++) {
        if (nl != 24)
            assert_int_equal(
                swt_open(&sub, k.id, &ad, nonce, nl, ct, ct_len, pt, sizeof(pt), &pt_len),
                SW_AUTH_FAILED);
    }
    assert_int_equal(swt_open(&sub, k.id, &ad, NULL, 24, ct, ct_len, pt, sizeof(pt), &pt_len),
                     SW_AUTH_FAILED);
    assert_int_equal(open_with(&sub, k.id, &ad, nonce, ct, ct_len, pt, sizeof(pt), &pt_len), SW_OK);
}

/* Output bounds: a buffer one byte short is refused before anything is
 * written, on both sides; invalid arguments are invalid_argument. */
static void
test_bounds_and_arguments(void **state)
{
    swt_seal_key k = fixed_key(7);
    swt_seal_subkey sub;
    uint8_t nonce[24], ct[64 + 16], pt[64], msg[64];
    size_t ct_len = 7, pt_len = 7;
    swt_seal_ad ad = item_ad(1);
    char big[SWT_SEAL_CONTEXT_MAX + 1];
    (void)state;
    memset(msg, 1, sizeof(msg));
    assert_int_equal(swt_seal_derive(&k, SWT_SEAL_STREAM_W2F, RID_A, &sub), SW_OK);
    memset(ct, 0xaa, sizeof(ct));
    assert_int_equal(swt_seal(&sub, &ad, msg, sizeof(msg), nonce, ct, sizeof(ct) - 1, &ct_len),
                     SW_EMSGSIZE);
    assert_int_equal(ct_len, 0);
    assert_int_equal(ct[0], 0xaa);
    seal_into(&sub, &ad, msg, sizeof(msg), nonce, ct, sizeof(ct), &ct_len);
    memset(pt, 0xaa, sizeof(pt));
    assert_int_equal(open_with(&sub, k.id, &ad, nonce, ct, ct_len, pt, sizeof(pt) - 1, &pt_len),
                     SW_EMSGSIZE);
    assert_int_equal(pt[0], 0xaa);
    /* bad associated data: invalid on seal, auth_failed on open */
    ad.final = 2;
    assert_int_equal(swt_seal(&sub, &ad, msg, sizeof(msg), nonce, ct, sizeof(ct), &ct_len),
                     SW_EINVAL);
    assert_int_equal(open_with(&sub, k.id, &ad, nonce, ct, ct_len, pt, sizeof(pt), &pt_len),
                     SW_AUTH_FAILED);
    ad = item_ad(1);
    memset(big, 'a', sizeof(big));
    ad.context = big;
    ad.context_len = sizeof(big);
    assert_int_equal(swt_seal(&sub, &ad, msg, sizeof(msg), nonce, ct, sizeof(ct), &ct_len),
                     SW_EINVAL);
    ad.context_len = SWT_SEAL_CONTEXT_MAX; /* the largest context works */
    assert_int_equal(swt_seal(&sub, &ad, msg, sizeof(msg), nonce, ct, sizeof(ct), &ct_len), SW_OK);
    assert_int_equal(open_with(&sub, k.id, &ad, nonce, ct, ct_len, pt, sizeof(pt), &pt_len), SW_OK);
    assert_int_equal(swt_seal(&sub, NULL, msg, sizeof(msg), nonce, ct, sizeof(ct), &ct_len),
                     SW_EINVAL);
    assert_int_equal(swt_seal(&sub, &ad, NULL, 3, nonce, ct, sizeof(ct), &ct_len), SW_EINVAL);
    assert_int_equal(swt_seal(NULL, &ad, msg, 3, nonce, ct, sizeof(ct), &ct_len), SW_EINVAL);
    /* derivation: a stream scope needs a request id, an instance scope takes none */
    assert_int_equal(swt_seal_derive(&k, SWT_SEAL_STREAM_F2W, NULL, &sub), SW_EINVAL);
    assert_int_equal(swt_seal_derive(&k, SWT_SEAL_REGISTRY, RID_A, &sub), SW_EINVAL);
    assert_int_equal(swt_seal_derive(&k, (swt_seal_scope)0, NULL, &sub), SW_EINVAL);
    assert_int_equal(swt_seal_derive(&k, (swt_seal_scope)7, NULL, &sub), SW_EINVAL);
    assert_int_equal(swt_seal_derive(NULL, SWT_SEAL_REGISTRY, NULL, &sub), SW_EINVAL);
}

/* Derivation and key ids are deterministic, and differ where they must. */
static void
test_derivation_and_ids(void **state)
{
    swt_seal_key k = fixed_key(7), again = fixed_key(7), g1, g2;
    swt_seal_subkey a, b;
    (void)state;
    assert_int_equal(k.id, again.id);
    assert_int_not_equal(k.id, 0);
    assert_int_equal(swt_seal_key_generate(&g1), SW_OK);
    assert_int_equal(swt_seal_key_generate(&g2), SW_OK);
    assert_memory_not_equal(g1.k, g2.k, 32);
    assert_int_not_equal(g1.id, g2.id);
    assert_int_equal(swt_seal_derive(&k, SWT_SEAL_STREAM_W2F, RID_A, &a), SW_OK);
    assert_int_equal(swt_seal_derive(&again, SWT_SEAL_STREAM_W2F, RID_A, &b), SW_OK);
    assert_memory_equal(a.k, b.k, 32);
    assert_int_equal(a.key_id, k.id);
    assert_memory_equal(a.rid, RID_A, 16);
    assert_int_equal(a.scope, SWT_SEAL_STREAM_W2F);
    /* the subkey is not the cluster key */
    assert_memory_not_equal(a.k, k.k, 32);
    assert_int_equal(swt_seal_derive(&g1, SWT_SEAL_STREAM_W2F, RID_A, &b), SW_OK);
    assert_memory_not_equal(a.k, b.k, 32);
    swt_seal_key_wipe(&g1);
    swt_seal_key_wipe(&g2);
}

static int
all_zero(const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != 0)
            return 0;
    return 1;
}

static void
test_wipe_leaves_zeros(void **state)
{
    swt_seal_key k;
    swt_seal_subkey sub;
    (void)state;
    assert_int_equal(swt_seal_key_generate(&k), SW_OK);
    assert_int_equal(swt_seal_derive(&k, SWT_SEAL_STREAM_F2W, RID_A, &sub), SW_OK);
    assert_false(all_zero(k.k, sizeof(k.k)));
    assert_false(all_zero(&sub, sizeof(sub)));
    swt_seal_key_wipe(&k);
    swt_seal_subkey_wipe(&sub);
    assert_true(all_zero(&k, sizeof(k)));
    assert_true(all_zero(&sub, sizeof(sub)));
    swt_seal_key_wipe(NULL);
    swt_seal_subkey_wipe(NULL);
}

/* ------------------------------------------------------------------------ */
/* Nonces                                                                    */

#define NONCE_THREADS 4
#define NONCE_PER_THREAD 250000

typedef struct nonce_job {
    const swt_seal_subkey *sub;
    uint8_t *out; /* NONCE_PER_THREAD * 24 */
} nonce_job;

static void *
nonce_thread(void *arg)
{
    nonce_job *j = arg;
    swt_seal_ad ad = item_ad(1);
    uint8_t ct[16];
    size_t ct_len;
    for (size_t i = 0; i < NONCE_PER_THREAD; i++) {
        if (swt_seal(j->sub, &ad, NULL, 0, j->out + 24 * i, ct, sizeof(ct), &ct_len) != SW_OK)
            return (void *)1;
    }
    return NULL;
}

static int
cmp_nonce(const void *a, const void *b)
{
    return memcmp(a, b, 24);
}

/* 1e6 seals from four threads at once: no nonce twice; one salt, and
 * counters that each thread sees increasing. */
static void
test_nonce_unique(void **state)
{
    swt_seal_key k = fixed_key(7);
    swt_seal_subkey sub;
    nonce_job jobs[NONCE_THREADS];
    pthread_t th[NONCE_THREADS];
    size_t total = (size_t)NONCE_THREADS * NONCE_PER_THREAD;
    uint8_t *all = malloc(total * 24);
    uint64_t before = swt_seal_nonces_used();
    (void)state;
    assert_non_null(all);
    assert_int_equal(swt_seal_derive(&k, SWT_SEAL_STREAM_W2F, RID_A, &sub), SW_OK);
    for (int t = 0; t < NONCE_THREADS; t++) {
        jobs[t].sub = &sub;
        jobs[t].out = all + (size_t)t * NONCE_PER_THREAD * 24;
        assert_int_equal(pthread_create(&th[t], NULL, nonce_thread, &jobs[t]), 0);
    }
    for (int t = 0; t < NONCE_THREADS; t++) {
        void *rv;
        assert_int_equal(pthread_join(th[t], &rv), 0);
        assert_null(rv);
    }
    assert_true(swt_seal_nonces_used() - before >= total);
    for (int t = 0; t < NONCE_THREADS; t++) {
        const uint8_t *v = jobs[t].out;
        for (size_t i = 1; i < NONCE_PER_THREAD; i++) {
            assert_memory_equal(v, v + 24 * i, 16); /* one salt per process */
            assert_true(memcmp(v + 24 * (i - 1) + 16, v + 24 * i + 16, 8) < 0);
        }
    }
    qsort(all, total, 24, cmp_nonce);
    for (size_t i = 1; i < total; i++)
        assert_int_not_equal(memcmp(all + 24 * (i - 1), all + 24 * i, 24), 0);
    free(all);
}

/* A fork child draws its own salt: its nonces never repeat the parent's. */
static void
test_nonce_after_fork(void **state)
{
    swt_seal_key k = fixed_key(7);
    swt_seal_subkey sub;
    swt_seal_ad ad = item_ad(1);
    uint8_t parent[24], child[24], ct[16];
    size_t ct_len;
    int fds[2], status;
    pid_t pid;
    (void)state;
    assert_int_equal(swt_seal_derive(&k, SWT_SEAL_STREAM_W2F, RID_A, &sub), SW_OK);
    assert_int_equal(swt_seal(&sub, &ad, NULL, 0, parent, ct, sizeof(ct), &ct_len), SW_OK);
    assert_int_equal(pipe(fds), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        uint8_t n[24];
        int ok = swt_seal(&sub, &ad, NULL, 0, n, ct, sizeof(ct), &ct_len) == SW_OK &&
                 write(fds[1], n, sizeof(n)) == (ssize_t)sizeof(n);
        _exit(ok ? 0 : 1);
    }
    close(fds[1]);
    assert_int_equal(read(fds[0], child, sizeof(child)), (ssize_t)sizeof(child));
    close(fds[0]);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_memory_not_equal(parent, child, 16);
    /* and the parent goes on with its own salt */
    assert_int_equal(swt_seal(&sub, &ad, NULL, 0, child, ct, sizeof(ct), &ct_len), SW_OK);
    assert_memory_equal(parent, child, 16);
}

/* ------------------------------------------------------------------------ */
/* Key files                                                                 */

static char g_path[128];

static void
write_key_file(const char *content, mode_t mode)
{
    FILE *f;
    snprintf(g_path, sizeof(g_path), "%s/key", g_dir);
    unlink(g_path);
    f = fopen(g_path, "w");
    assert_non_null(f);
    fputs(content, f);
    fclose(f);
    assert_int_equal(chmod(g_path, mode), 0);
}

#define HEX64 "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"

static void
test_key_file_ok(void **state)
{
    swt_seal_key k, expect, g;
    uint8_t raw[32];
    char why[SWT_SEAL_WHY_MAX], hex[65];
    size_t bin_len;
    (void)state;
    assert_int_equal(sodium_hex2bin(raw, 32, HEX64, 64, NULL, &bin_len, NULL), 0);
    assert_int_equal(swt_seal_key_from_bytes(raw, &expect), SW_OK);
    write_key_file(HEX64 "\n", 0600);
    assert_int_equal(swt_seal_key_load(g_path, &k, why, sizeof(why)), SW_OK);
    assert_memory_equal(k.k, expect.k, 32);
    assert_int_equal(k.id, expect.id);
    assert_string_equal(why, "");
    /* comments, blank lines, upper case, CRLF, blanks around, no final newline; mode 0400 */
    write_key_file("# streamwire cluster key\r\n\n  "
                   "00112233445566778899AABBCCDDEEFF00112233445566778899AABBCCDDEEFF \r\n# end",
                   0400);
    assert_int_equal(swt_seal_key_load(g_path, &k, why, sizeof(why)), SW_OK);
    assert_memory_equal(k.k, expect.k, 32);
    /* any owner-only mode passes (docs/SECURITY.md): 0700 too */
    write_key_file(HEX64 "\n", 0700);
    assert_int_equal(swt_seal_key_load(g_path, &k, why, sizeof(why)), SW_OK);
    assert_memory_equal(k.k, expect.k, 32);
    /* hex round trip through a generated key */
    assert_int_equal(swt_seal_key_generate(&g), SW_OK);
    swt_seal_key_hex(&g, hex);
    assert_int_equal(strlen(hex), 64);
    write_key_file(hex, 0600);
    assert_int_equal(swt_seal_key_load(g_path, &k, NULL, 0), SW_OK);
    assert_memory_equal(k.k, g.k, 32);
    assert_int_equal(k.id, g.id);
    unlink(g_path);
    /* a symlink to a good key file: judged by the file it names
     * (docs/SECURITY.md), as a Kubernetes secret volume's links are */
    {
        char link[160];
        write_key_file(HEX64 "\n", 0400);
        snprintf(link, sizeof(link), "%s/key-link", g_dir);
        unlink(link);
        assert_int_equal(symlink(g_path, link), 0);
        assert_int_equal(swt_seal_key_load(link, &k, why, sizeof(why)), SW_OK);
        assert_memory_equal(k.k, expect.k, 32);
        /* ... and refused by that file's mode, named in the message */
        assert_int_equal(chmod(g_path, 0644), 0);
        assert_int_equal(swt_seal_key_load(link, &k, why, sizeof(why)), SW_EPERM);
        assert_non_null(strstr(why, "chmod 600"));
        unlink(link);
        unlink(g_path);
    }
    swt_seal_key_wipe(&k);
    swt_seal_key_wipe(&g);
}

static void
expect_load_fails(const char *content, mode_t mode, sw_err want, const char *why_has)
{
    swt_seal_key k;
    char why[SWT_SEAL_WHY_MAX];
    memset(&k, 0x55, sizeof(k));
    if (content != NULL)
        write_key_file(content, mode);
    assert_int_equal(swt_seal_key_load(g_path, &k, why, sizeof(why)), want);
    assert_true(all_zero(&k, sizeof(k)));
    assert_non_null(strstr(why, g_path));
    if (strstr(why, why_has) == NULL)
        fail_msg("message '%s' lacks '%s'", why, why_has);
    /* never the key bytes */
    assert_null(strstr(why, "00112233445566778899"));
}

static void
test_key_file_errors(void **state)
{
    char big[5000];
    swt_seal_key k;
    (void)state;
    expect_load_fails(HEX64 "\n", 0644, SW_EPERM, "chmod 600");
    expect_load_fails(HEX64 "\n", 0640, SW_EPERM, "0640");
    expect_load_fails(HEX64 "\n", 0602, SW_EPERM, "group or others");
    expect_load_fails("0011223344\n", 0600, SW_EINVAL, "line 1: expected 64 hex digits");
    expect_load_fails(HEX64 "00\n", 0600, SW_EINVAL, "expected 64 hex digits");
    expect_load_fails("# c\n0g112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n",
                      0600, SW_EINVAL, "line 2");
    expect_load_fails("0011223344556677 8899aabbccddeeff00112233445566778899aabbccddeeff\n", 0600,
                      SW_EINVAL, "expected 64 hex");
    expect_load_fails(HEX64 "\n" HEX64 "\n", 0600, SW_EINVAL, "second key line");
    expect_load_fails("", 0600, SW_EINVAL, "no key line");
    expect_load_fails("# only a comment\n\n", 0600, SW_EINVAL, "no key line");
    memset(big, '#', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    expect_load_fails(big, 0600, SW_EINVAL, "larger than");
    unlink(g_path);
    expect_load_fails(NULL, 0, SW_ENOTFOUND, "cannot open");
    /* a directory */
    snprintf(g_path, sizeof(g_path), "%s", g_dir);
    expect_load_fails(NULL, 0, SW_EINVAL, "not a regular file");
    /* a FIFO: refused at once, never blocking in open() (review Q9) */
    snprintf(g_path, sizeof(g_path), "%s/fifo", g_dir);
    unlink(g_path);
    assert_int_equal(mkfifo(g_path, 0600), 0);
    expect_load_fails(NULL, 0, SW_EINVAL, "not a regular file");
    unlink(g_path);
    /* owned by another user (only root can make one here) */
    if (geteuid() == 0) {
        write_key_file(HEX64 "\n", 0600);
        assert_int_equal(chown(g_path, 12345, 12345), 0);
        expect_load_fails(NULL, 0, SW_EPERM, "owned by uid 12345");
        unlink(g_path);
    }
    assert_int_equal(swt_seal_key_load(NULL, &k, NULL, 0), SW_EINVAL);
    assert_int_equal(swt_seal_key_load("", &k, NULL, 0), SW_EINVAL);
    assert_int_equal(swt_seal_key_load(g_dir, NULL, NULL, 0), SW_EINVAL);
}

/* ------------------------------------------------------------------------ */
/* Micro-benchmark: printed, never asserted (BENCHMARKS.md "Sealing").       */

static double
now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void
test_bench(void **state)
{
    static const size_t sizes[] = {64, 1024};
    swt_seal_key k = fixed_key(7);
    swt_seal_subkey sub;
    uint8_t nonce[24], ct[1024 + 16], pt[1024], msg[1024];
    size_t ct_len, pt_len;
    int iters = getenv("SW_SLOW") != NULL ? 20000 : 200000;
    double t0, t1;
    (void)state;
    memset(msg, 'x', sizeof(msg));
    assert_int_equal(swt_seal_derive(&k, SWT_SEAL_STREAM_W2F, RID_A, &sub), SW_OK);
    for (size_t s = 0; s < 2; s++) {
        swt_seal_ad ad = item_ad(1);
        double seal_ns, open_ns;
        t0 = now_s();
        for (int i = 0; i < iters; i++) {
            ad.seq = (uint64_t)i;
            swt_seal(&sub, &ad, msg, sizeof(msg) < sizes[s] ? sizeof(msg) : sizes[s], nonce, ct,
                     sizeof(ct), &ct_len);
        }
        t1 = now_s();
        seal_ns = (t1 - t0) * 1e9 / iters;
        t0 = now_s();
        for (int i = 0; i < iters; i++)
            (void)open_with(&sub, k.id, &ad, nonce, ct, ct_len, pt, sizeof(pt), &pt_len);
        t1 = now_s();
        open_ns = (t1 - t0) * 1e9 / iters;
        assert_int_equal(open_with(&sub, k.id, &ad, nonce, ct, ct_len, pt, sizeof(pt), &pt_len),
                         SW_OK);
        printf("seal bench: %4zu B: seal %.0f ns, open %.0f ns, seal+open %.0f ns per item "
               "(%d iterations)\n",
               sizes[s], seal_ns, open_ns, seal_ns + open_ns, iters);
    }
    t0 = now_s();
    for (int i = 0; i < iters; i++) {
        uint8_t rid[16] = {(uint8_t)i, (uint8_t)(i >> 8)};
        swt_seal_subkey d;
        swt_seal_derive(&k, SWT_SEAL_STREAM_W2F, rid, &d);
    }
    t1 = now_s();
    printf("seal bench: derive one stream key %.0f ns\n", (t1 - t0) * 1e9 / iters);
    t0 = now_s();
    for (int i = 0; i < iters; i++)
        randombytes_buf(nonce, sizeof(nonce));
    t1 = now_s();
    printf("seal bench: randombytes_buf(24) (the alternative nonce) %.0f ns\n",
           (t1 - t0) * 1e9 / iters);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_empty_plaintext),
        cmocka_unit_test(test_every_ad_field_binds),
        cmocka_unit_test(test_wrong_key),
        cmocka_unit_test(test_instance_scopes),
        cmocka_unit_test(test_tampered_byte_anywhere),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_bounds_and_arguments),
        cmocka_unit_test(test_derivation_and_ids),
        cmocka_unit_test(test_wipe_leaves_zeros),
        cmocka_unit_test(test_nonce_unique),
        cmocka_unit_test(test_nonce_after_fork),
        cmocka_unit_test(test_key_file_ok),
        cmocka_unit_test(test_key_file_errors),
        cmocka_unit_test(test_bench),
    };
    return cmocka_run_group_tests(tests, setup_all, teardown_all);
}
