/* common/util.c -- clocks, ids, sync helpers, the request-id hash map. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "common/sw_common.h"

const char *
sw_version(void)
{
    return "0.1.0";
}

int64_t
swi_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t
swi_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t
swi_unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static pthread_once_t swi_once = PTHREAD_ONCE_INIT;
static int swi_sodium_ok;
/* The key of the request-id hash (per process, random): peers choose the
 * ids, so an unkeyed hash would let them build collision chains. */
static unsigned char swi_hash_key[crypto_shorthash_KEYBYTES];

/* swi_random's buffer of the kernel's random bytes, one per thread: a
 * getrandom call per SWI_RNG_BYTES instead of one per request id (1 % of
 * the frontend's CPU at concurrency 64, BENCHMARKS.md session 33). Bytes
 * handed out are zeroed. A fork's child starts from a copy of the forking
 * thread's buffer: the child handler moves swi_rng_epoch on, and a buffer
 * of an older epoch is refilled before use, so parent and child never hand
 * out the same bytes (test_util test_random_after_fork). */
#define SWI_RNG_BYTES 256
#define SWI_RNG_DIRECT 32 /* longer requests go to the kernel directly */
typedef struct swi_rng {
    uint8_t buf[SWI_RNG_BYTES];
    uint32_t pos; /* bytes of buf handed out */
    uint32_t epoch;
} swi_rng;
static _Thread_local swi_rng swi_rng_tl; /* epoch 0: never filled */
static uint32_t swi_rng_epoch = 1;       /* atomic */

static void
swi_rng_after_fork(void)
{
    __atomic_add_fetch(&swi_rng_epoch, 1, __ATOMIC_RELAXED);
}

static void
swi_init_once(void)
{
    swi_sodium_ok = sodium_init() >= 0;
    if (swi_sodium_ok)
        crypto_shorthash_keygen(swi_hash_key);
    (void)pthread_atfork(NULL, NULL, swi_rng_after_fork);
}

sw_err
swi_init(void)
{
    pthread_once(&swi_once, swi_init_once);
    return swi_sodium_ok ? SW_OK : SW_ECRYPTO;
}

void
swi_random(void *buf, size_t len)
{
    swi_rng *g = &swi_rng_tl;
    if (len > SWI_RNG_DIRECT) {
        randombytes_buf(buf, len);
        return;
    }
    if (g->epoch != __atomic_load_n(&swi_rng_epoch, __ATOMIC_RELAXED) ||
        SWI_RNG_BYTES - g->pos < len) {
        pthread_once(&swi_once, swi_init_once); /* (the fork handler) */
        randombytes_buf(g->buf, sizeof(g->buf));
        g->pos = 0;
        g->epoch = __atomic_load_n(&swi_rng_epoch, __ATOMIC_RELAXED);
    }
    memcpy(buf, g->buf + g->pos, len);
    sodium_memzero(g->buf + g->pos, len);
    g->pos += (uint32_t)len;
}

uint64_t
swi_random_id64(void)
{
    uint64_t v;
    do
        swi_random(&v, sizeof(v));
    while (v == 0);
    return v;
}

void
swi_hex(char *out, const uint8_t *in, size_t len)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < len; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 0xf];
    }
    out[2 * len] = '\0';
}

int
swi_unhex(uint8_t *out, const char *hex, size_t len)
{
    size_t got = 0;
    return sodium_hex2bin(out, len, hex, 2 * len, NULL, &got, NULL) == 0 && got == len ? 0 : -1;
}

void
swi_random_token(char out[17])
{
    uint8_t b[8];
    swi_random(b, sizeof(b));
    swi_hex(out, b, sizeof(b));
}

size_t
swi_strlcpy(char *dst, const char *src, size_t cap)
{
    size_t n = strlen(src);
    size_t k = n < cap ? n : cap - 1;
    memcpy(dst, src, k);
    dst[k] = '\0';
    return n;
}

size_t
swi_textlcpy(char *dst, const char *src, size_t cap)
{
    size_t n = strlen(src);
    size_t k = n < cap ? n : cap - 1;
    if (k < n) {
        /* Back to the first byte of the character at the cut (continuation
         * bytes are 10xxxxxx): that character is left out whole. */
        while (k > 0 && ((unsigned char)src[k] & 0xC0) == 0x80)
            k--;
    }
    memcpy(dst, src, k);
    dst[k] = '\0';
    return n;
}

char *
swi_strdup(const char *s)
{
    size_t n;
    char *d;
    if (s == NULL)
        return NULL;
    n = strlen(s) + 1;
    d = malloc(n);
    if (d != NULL)
        memcpy(d, s, n);
    return d;
}

int
swi_cond_init(pthread_cond_t *c)
{
    pthread_condattr_t a;
    int rv;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    rv = pthread_cond_init(c, &a);
    pthread_condattr_destroy(&a);
    return rv;
}

int
swi_cond_wait_until(pthread_cond_t *c, pthread_mutex_t *m, int64_t deadline_ms)
{
    struct timespec ts;
    if (deadline_ms < 0)
        return pthread_cond_wait(c, m);
    ts.tv_sec = (time_t)(deadline_ms / 1000);
    ts.tv_nsec = (long)(deadline_ms % 1000) * 1000000L;
    return pthread_cond_timedwait(c, m, &ts);
}

int
swi_valid_code(const char *code)
{
    size_t n = 0;
    if (code == NULL || *code == '\0')
        return 0;
    for (const char *p = code; *p; p++, n++) {
        char ch = *p;
        if (n >= 64)
            return 0;
        if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '.' ||
              ch == '-'))
            return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------- idmap */

static char swi_tomb_marker;
#define SWI_IDMAP_TOMB ((void *)&swi_tomb_marker)

size_t
swi_idmap_hash(const uint8_t *key)
{
    /* SipHash-2-4 with a per-process random key: ids come from peers. */
    unsigned char out[crypto_shorthash_BYTES];
    uint64_t h;
    crypto_shorthash(out, key, SW_REQUEST_ID_BYTES, swi_hash_key);
    memcpy(&h, out, sizeof(h));
    return (size_t)h;
}

/* The hash of a map whose keys this process drew itself (swi_idmap_init_own):
 * they are uniformly random already, and nobody else chooses them. */
static inline size_t
swi_idmap_hash_of(const swi_idmap *m, const uint8_t *key)
{
    uint64_t h;
    if (m->keyed)
        return swi_idmap_hash(key);
    memcpy(&h, key, sizeof(h));
    return (size_t)h;
}

int
swi_idmap_init_own(swi_idmap *m, size_t initial)
{
    int rv = swi_idmap_init(m, initial);
    m->keyed = 0;
    return rv;
}

int
swi_idmap_init(swi_idmap *m, size_t initial)
{
    size_t cap = 16;
    (void)swi_init(); /* the hash key */
    while (cap < initial * 2)
        cap <<= 1;
    m->slots = calloc(cap, sizeof(*m->slots));
    m->cap = m->slots ? cap : 0;
    m->used = m->live = 0;
    m->keyed = 1;
    return m->slots ? 0 : -1;
}

void
swi_idmap_fini(swi_idmap *m)
{
    free(m->slots);
    m->slots = NULL;
    m->cap = m->used = m->live = 0;
}

/* key's slot, the search starting where hash h points. */
static swi_idmap_slot *
swi_idmap_find_at(const swi_idmap *m, const uint8_t *key, size_t h)
{
    size_t mask = m->cap - 1;
    size_t i = h & mask;
    if (m->cap == 0)
        return NULL;
    for (size_t n = 0; n < m->cap; n++, i = (i + 1) & mask) {
        swi_idmap_slot *s = &m->slots[i];
        if (s->val == NULL)
            return NULL;
        if (s->val != SWI_IDMAP_TOMB && memcmp(s->key, key, SW_REQUEST_ID_BYTES) == 0)
            return s;
    }
    return NULL;
}

static swi_idmap_slot *
swi_idmap_find(const swi_idmap *m, const uint8_t *key)
{
    return swi_idmap_find_at(m, key, swi_idmap_hash_of(m, key));
}

void *
swi_idmap_get(const swi_idmap *m, const uint8_t *key)
{
    swi_idmap_slot *s = swi_idmap_find(m, key);
    return s ? s->val : NULL;
}

void
swi_idmap_get_n(const swi_idmap *m, const uint8_t *const *keys, size_t n, void **out)
{
    size_t h[SWI_IDMAP_GET_N_MAX];
    for (size_t at = 0; at < n; at += SWI_IDMAP_GET_N_MAX) {
        size_t k = n - at < SWI_IDMAP_GET_N_MAX ? n - at : SWI_IDMAP_GET_N_MAX;
        for (size_t j = 0; j < k; j++) {
            h[j] = swi_idmap_hash_of(m, keys[at + j]);
            if (m->cap != 0)
                __builtin_prefetch(&m->slots[h[j] & (m->cap - 1)]);
        }
        for (size_t j = 0; j < k; j++) {
            swi_idmap_slot *s = swi_idmap_find_at(m, keys[at + j], h[j]);
            out[at + j] = s ? s->val : NULL;
        }
    }
}

static int
swi_idmap_grow(swi_idmap *m)
{
    size_t ncap = m->live * 4 > m->cap ? m->cap * 2 : m->cap; /* rehash drops tombstones */
    swi_idmap_slot *old = m->slots;
    size_t ocap = m->cap;
    swi_idmap_slot *ns = calloc(ncap, sizeof(*ns));
    if (ns == NULL)
        return -1;
    m->slots = ns;
    m->cap = ncap;
    m->used = m->live = 0;
    for (size_t i = 0; i < ocap; i++) {
        if (old[i].val != NULL && old[i].val != SWI_IDMAP_TOMB) {
            size_t mask = ncap - 1, j = swi_idmap_hash_of(m, old[i].key) & mask;
            while (ns[j].val != NULL)
                j = (j + 1) & mask;
            ns[j] = old[i];
            m->used++;
            m->live++;
        }
    }
    free(old);
    return 0;
}

int
swi_idmap_put(swi_idmap *m, const uint8_t *key, void *val)
{
    size_t h = swi_idmap_hash_of(m, key), mask, i; /* (one SipHash for the search and the slot) */
    swi_idmap_slot *s = swi_idmap_find_at(m, key, h);
    if (s != NULL) {
        s->val = val;
        return 0;
    }
    if ((m->used + 1) * 4 > m->cap * 3 && swi_idmap_grow(m) != 0)
        return -1;
    mask = m->cap - 1;
    i = h & mask;
    while (m->slots[i].val != NULL && m->slots[i].val != SWI_IDMAP_TOMB)
        i = (i + 1) & mask;
    if (m->slots[i].val == NULL)
        m->used++;
    memcpy(m->slots[i].key, key, SW_REQUEST_ID_BYTES);
    m->slots[i].val = val;
    m->live++;
    return 0;
}

void *
swi_idmap_del(swi_idmap *m, const uint8_t *key)
{
    swi_idmap_slot *s = swi_idmap_find(m, key);
    void *v;
    if (s == NULL)
        return NULL;
    v = s->val;
    s->val = SWI_IDMAP_TOMB;
    m->live--;
    return v;
}

void
swi_idmap_each(const swi_idmap *m, void (*fn)(void *val, void *arg), void *arg)
{
    for (size_t i = 0; i < m->cap; i++) {
        void *v = m->slots[i].val;
        if (v != NULL && v != SWI_IDMAP_TOMB)
            fn(v, arg);
    }
}

size_t
swi_idmap_some(const swi_idmap *m, void **out, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < m->cap && n < max; i++) {
        void *v = m->slots[i].val;
        if (v != NULL && v != SWI_IDMAP_TOMB)
            out[n++] = v;
    }
    return n;
}

void
swi_ptrvec_reserve(swi_ptrvec *vec, size_t n)
{
    vec->n = 0;
    if (vec->cap < n) {
        size_t ncap = n * 2;
        void **nv = realloc(vec->v, ncap * sizeof(*nv));
        if (nv != NULL) {
            vec->v = nv;
            vec->cap = ncap;
        }
    }
}

void
swi_idmap_snapshot(const swi_idmap *m, swi_ptrvec *vec, int (*take)(void *val, void *arg),
                   void *arg)
{
    swi_ptrvec_reserve(vec, m->live);
    for (size_t i = 0; i < m->cap && vec->n < vec->cap; i++) {
        void *v = m->slots[i].val;
        if (v != NULL && v != SWI_IDMAP_TOMB && take(v, arg))
            vec->v[vec->n++] = v;
    }
}
