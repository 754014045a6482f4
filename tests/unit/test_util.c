/* tests/unit/test_util.c -- common/: the request-id hash map, hex, code
 * tokens, clocks, the monotonic condition wait, ids, logging. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/sw_common.h"

/* ------------------------------------------------------------ helpers */

static uint64_t
rng_next(uint64_t *s)
{
    /* splitmix64: deterministic, good enough to fill request ids. */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void
rng_key(uint64_t *s, uint8_t key[SW_REQUEST_ID_BYTES])
{
    uint64_t a = rng_next(s), b = rng_next(s);
    memcpy(key, &a, 8);
    memcpy(key + 8, &b, 8);
}

static int
is_pow2(size_t x)
{
    return x != 0 && (x & (x - 1)) == 0;
}

static void
check_invariants(const swi_idmap *m)
{
    assert_true(is_pow2(m->cap));
    assert_true(m->live <= m->used);
    assert_true(m->used * 4 <= m->cap * 3);
}

/* ------------------------------------------------------------ idmap */

static void
test_idmap_basic(void **state)
{
    swi_idmap m;
    uint8_t k1[SW_REQUEST_ID_BYTES] = {1}, k2[SW_REQUEST_ID_BYTES] = {2};
    int a = 1, b = 2, c = 3;
    (void)state;

    assert_int_equal(swi_idmap_init(&m, 0), 0);
    assert_int_equal(m.cap, 16);
    assert_int_equal(m.live, 0);
    assert_null(swi_idmap_get(&m, k1));
    assert_null(swi_idmap_del(&m, k1));

    assert_int_equal(swi_idmap_put(&m, k1, &a), 0);
    assert_ptr_equal(swi_idmap_get(&m, k1), &a);
    assert_null(swi_idmap_get(&m, k2));
    assert_int_equal(m.live, 1);

    /* put on an existing key replaces, it does not add */
    assert_int_equal(swi_idmap_put(&m, k1, &b), 0);
    assert_ptr_equal(swi_idmap_get(&m, k1), &b);
    assert_int_equal(m.live, 1);

    assert_int_equal(swi_idmap_put(&m, k2, &c), 0);
    assert_int_equal(m.live, 2);
    assert_ptr_equal(swi_idmap_del(&m, k1), &b);
    assert_null(swi_idmap_get(&m, k1));
    assert_null(swi_idmap_del(&m, k1));
    assert_ptr_equal(swi_idmap_get(&m, k2), &c);
    assert_int_equal(m.live, 1);
    check_invariants(&m);

    swi_idmap_fini(&m);
    assert_null(m.slots);
    assert_int_equal(m.cap, 0);
    assert_int_equal(m.live, 0);
    /* a finished map answers lookups without touching memory */
    assert_null(swi_idmap_get(&m, k2));
    assert_null(swi_idmap_del(&m, k2));
}

static void
test_idmap_initial_capacity(void **state)
{
    swi_idmap m;
    (void)state;
    assert_int_equal(swi_idmap_init(&m, 100), 0);
    assert_true(m.cap >= 200);
    assert_true(is_pow2(m.cap));
    swi_idmap_fini(&m);
}

static void
count_cb(void *val, void *arg)
{
    size_t *sum = arg;
    sum[0]++;
    sum[1] += *(const size_t *)val;
}

#define NKEYS 10000

static void
test_idmap_many_keys(void **state)
{
    swi_idmap m;
    uint64_t seed = 0x5eed1234;
    uint8_t(*keys)[SW_REQUEST_ID_BYTES] = calloc(NKEYS, SW_REQUEST_ID_BYTES);
    size_t *vals = calloc(NKEYS, sizeof(size_t));
    size_t *vals2 = calloc(NKEYS, sizeof(size_t));
    size_t sums[2] = {0, 0}, expect = 0;
    (void)state;
    assert_non_null(keys);
    assert_non_null(vals);
    assert_non_null(vals2);

    assert_int_equal(swi_idmap_init(&m, 0), 0);
    for (size_t i = 0; i < NKEYS; i++) {
        rng_key(&seed, keys[i]);
        vals[i] = i;
        vals2[i] = i;
        assert_int_equal(swi_idmap_put(&m, keys[i], &vals[i]), 0);
    }
    assert_int_equal(m.live, NKEYS);
    check_invariants(&m);
    for (size_t i = 0; i < NKEYS; i++)
        assert_ptr_equal(swi_idmap_get(&m, keys[i]), &vals[i]);

    /* every entry is visited exactly once */
    swi_idmap_each(&m, count_cb, sums);
    for (size_t i = 0; i < NKEYS; i++)
        expect += i;
    assert_int_equal(sums[0], NKEYS);
    assert_int_equal(sums[1], expect);

    /* delete the even half */
    for (size_t i = 0; i < NKEYS; i += 2)
        assert_ptr_equal(swi_idmap_del(&m, keys[i]), &vals[i]);
    assert_int_equal(m.live, NKEYS / 2);
    for (size_t i = 0; i < NKEYS; i++) {
        if (i % 2 == 0)
            assert_null(swi_idmap_get(&m, keys[i]));
        else
            assert_ptr_equal(swi_idmap_get(&m, keys[i]), &vals[i]);
    }
    sums[0] = sums[1] = 0;
    swi_idmap_each(&m, count_cb, sums);
    assert_int_equal(sums[0], NKEYS / 2);

    /* reinsert them with new values */
    for (size_t i = 0; i < NKEYS; i += 2)
        assert_int_equal(swi_idmap_put(&m, keys[i], &vals2[i]), 0);
    assert_int_equal(m.live, NKEYS);
    check_invariants(&m);
    for (size_t i = 0; i < NKEYS; i++)
        assert_ptr_equal(swi_idmap_get(&m, keys[i]), i % 2 == 0 ? &vals2[i] : &vals[i]);

    /* a key never inserted is not found */
    {
        uint8_t k[SW_REQUEST_ID_BYTES];
        for (int i = 0; i < 1000; i++) {
            rng_key(&seed, k);
            assert_null(swi_idmap_get(&m, k));
        }
    }

    /* delete everything */
    for (size_t i = 0; i < NKEYS; i++)
        assert_non_null(swi_idmap_del(&m, keys[i]));
    assert_int_equal(m.live, 0);
    sums[0] = 0;
    swi_idmap_each(&m, count_cb, sums);
    assert_int_equal(sums[0], 0);

    swi_idmap_fini(&m);
    free(keys);
    free(vals);
    free(vals2);
}

/* Keys whose first 8 bytes (the hash) are equal all land on one probe chain. */
static void
test_idmap_colliding_keys(void **state)
{
    swi_idmap m;
    enum { N = 300 };
    uint8_t keys[N][SW_REQUEST_ID_BYTES];
    int vals[N];
    (void)state;
    assert_int_equal(swi_idmap_init(&m, 0), 0);
    for (int i = 0; i < N; i++) {
        memset(keys[i], 0xab, 8);
        memset(keys[i] + 8, 0, 8);
        memcpy(keys[i] + 8, &i, sizeof(i));
        vals[i] = i;
        assert_int_equal(swi_idmap_put(&m, keys[i], &vals[i]), 0);
    }
    for (int i = 0; i < N; i++)
        assert_ptr_equal(swi_idmap_get(&m, keys[i]), &vals[i]);
    /* delete every third: later keys of the chain stay reachable across the
     * tombstones */
    for (int i = 0; i < N; i += 3)
        assert_ptr_equal(swi_idmap_del(&m, keys[i]), &vals[i]);
    for (int i = 0; i < N; i++) {
        if (i % 3 == 0)
            assert_null(swi_idmap_get(&m, keys[i]));
        else
            assert_ptr_equal(swi_idmap_get(&m, keys[i]), &vals[i]);
    }
    check_invariants(&m);
    swi_idmap_fini(&m);
}

/* Streams come and go: each request id is new, live entries stay few. The
 * tombstones left behind must be reclaimed, not make the table grow. */
static void
test_idmap_tombstone_churn_fresh_keys(void **state)
{
    swi_idmap m;
    enum { LIVE = 4, CYCLES = 100000 };
    uint8_t ring[LIVE][SW_REQUEST_ID_BYTES];
    int vals[LIVE];
    uint64_t seed = 42;
    size_t max_cap = 0;
    (void)state;
    assert_int_equal(swi_idmap_init(&m, 0), 0);
    for (int i = 0; i < LIVE; i++) {
        rng_key(&seed, ring[i]);
        vals[i] = i;
        assert_int_equal(swi_idmap_put(&m, ring[i], &vals[i]), 0);
    }
    for (int c = 0; c < CYCLES; c++) {
        int slot = c % LIVE;
        assert_ptr_equal(swi_idmap_del(&m, ring[slot]), &vals[slot]);
        rng_key(&seed, ring[slot]);
        assert_int_equal(swi_idmap_put(&m, ring[slot], &vals[slot]), 0);
        if (m.cap > max_cap)
            max_cap = m.cap;
    }
    assert_int_equal(m.live, LIVE);
    for (int i = 0; i < LIVE; i++)
        assert_ptr_equal(swi_idmap_get(&m, ring[i]), &vals[i]);
    check_invariants(&m);
    /* 4 live entries: 16 slots suffice; allow one doubling */
    assert_true(max_cap <= 32);
    swi_idmap_fini(&m);
}

static void
test_idmap_tombstone_churn_same_keys(void **state)
{
    swi_idmap m;
    enum { SET = 8, CYCLES = 100000 };
    uint8_t keys[SET][SW_REQUEST_ID_BYTES];
    int vals[SET];
    uint64_t seed = 7;
    size_t max_cap = 0;
    (void)state;
    assert_int_equal(swi_idmap_init(&m, 0), 0);
    for (int i = 0; i < SET; i++) {
        rng_key(&seed, keys[i]);
        vals[i] = i;
    }
    for (int c = 0; c < CYCLES; c++) {
        int i = (int)(rng_next(&seed) % SET);
        if (swi_idmap_get(&m, keys[i]) == NULL) {
            assert_int_equal(swi_idmap_put(&m, keys[i], &vals[i]), 0);
            assert_ptr_equal(swi_idmap_get(&m, keys[i]), &vals[i]);
        } else {
            assert_ptr_equal(swi_idmap_del(&m, keys[i]), &vals[i]);
            assert_null(swi_idmap_get(&m, keys[i]));
        }
        if (m.cap > max_cap)
            max_cap = m.cap;
    }
    check_invariants(&m);
    assert_true(m.live <= SET);
    assert_true(max_cap <= 64);
    swi_idmap_fini(&m);
}

/* ------------------------------------------------------------ hex, codes */

static void
test_hex(void **state)
{
    char out[2 * 256 + 1];
    uint8_t all[256];
    (void)state;

    swi_hex(out, (const uint8_t *)"\x00\x01\xab\xff\x10", 5);
    assert_string_equal(out, "0001abff10");

    memset(out, 'x', sizeof(out));
    swi_hex(out, all, 0);
    assert_string_equal(out, "");

    for (int i = 0; i < 256; i++)
        all[i] = (uint8_t)i;
    swi_hex(out, all, sizeof(all));
    assert_int_equal(strlen(out), 512);
    assert_memory_equal(out, "000102", 6);
    assert_memory_equal(out + 2 * 0x7f, "7f80", 4);
    assert_string_equal(out + 2 * 0xfd, "fdfeff");
    for (size_t i = 0; i < 512; i++)
        assert_true((out[i] >= '0' && out[i] <= '9') || (out[i] >= 'a' && out[i] <= 'f'));

    /* request ids: 16 bytes -> 32 chars + NUL fits SW_REQUEST_ID_HEX */
    {
        char id[SW_REQUEST_ID_HEX];
        uint8_t raw[SW_REQUEST_ID_BYTES];
        memset(raw, 0xa5, sizeof(raw));
        swi_hex(id, raw, sizeof(raw));
        assert_int_equal(strlen(id), 32);
        assert_string_equal(id, "a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5");
    }
}

/* swi_unhex reads back what swi_hex wrote, takes upper case too, and
 * refuses anything short of 2 * len hex digits. */
static void
test_unhex(void **state)
{
    uint8_t all[256], back[256];
    char hex[513];
    (void)state;
    for (int i = 0; i < 256; i++)
        all[i] = (uint8_t)(255 - i);
    swi_hex(hex, all, sizeof(all));
    memset(back, 0, sizeof(back));
    assert_int_equal(swi_unhex(back, hex, sizeof(back)), 0);
    assert_memory_equal(back, all, sizeof(all));

    assert_int_equal(swi_unhex(back, "00AbfF7e", 4), 0);
    assert_memory_equal(back, "\x00\xab\xff\x7e", 4);
    /* only the first 2 * len characters are read */
    assert_int_equal(swi_unhex(back, "0102zz", 2), 0);
    assert_memory_equal(back, "\x01\x02", 2);
    assert_int_equal(swi_unhex(back, "", 0), 0);

    assert_int_equal(swi_unhex(back, "010", 2), -1);  /* too short */
    assert_int_equal(swi_unhex(back, "", 1), -1);     /* empty */
    assert_int_equal(swi_unhex(back, "0g", 1), -1);   /* not hex */
    assert_int_equal(swi_unhex(back, "01 2", 2), -1); /* a space inside */
    assert_int_equal(swi_unhex(back, "-1", 1), -1);   /* a sign */
    assert_int_equal(swi_unhex(back, "0x", 1), -1);   /* a prefix */
}

static void
test_valid_code(void **state)
{
    char buf[80];
    static const char *good[] = {"engine_error",       "a",  "0", "x.y-z_9",  "handler_returned",
                                 "responder_released", "..", "-", "oom.gpu-0"};
    static const char *bad[] = {"",   "Engine", "engine error", "engine\terror", "a/b", "a*",
                                "a>", "a:b",    "\xc3\xa9",     "tab\t",         "A",   "a\n"};
    (void)state;
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        assert_int_equal(swi_valid_code(good[i]), 1);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(swi_valid_code(bad[i]), 0);
    assert_int_equal(swi_valid_code(NULL), 0);

    memset(buf, 'a', 64);
    buf[64] = '\0';
    assert_int_equal(swi_valid_code(buf), 1); /* 64 chars: the maximum */
    buf[64] = 'a';
    buf[65] = '\0';
    assert_int_equal(swi_valid_code(buf), 0); /* 65 */
}

/* ------------------------------------------------------------ clocks, cond */

static void
test_clocks(void **state)
{
    int64_t a = swi_now_ms(), au = swi_now_us();
    struct timespec ts = {0, 5 * 1000000L};
    int64_t b, bu;
    (void)state;
    nanosleep(&ts, NULL);
    b = swi_now_ms();
    bu = swi_now_us();
    assert_true(b >= a + 4);
    assert_true(bu >= au + 5000);
    assert_true(bu / 1000 - b <= 1 && b - bu / 1000 <= 1);
    /* wall clock: after 2020-01-01, before 2200-01-01 */
    assert_true(swi_unix_ms() > INT64_C(1577836800000));
    assert_true(swi_unix_ms() < INT64_C(7258118400000));
}

typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int flag;
    int delay_ms;
} waiter;

static void *
signal_later(void *arg)
{
    waiter *w = arg;
    struct timespec ts = {0, (long)w->delay_ms * 1000000L};
    nanosleep(&ts, NULL);
    pthread_mutex_lock(&w->mu);
    w->flag = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static void
test_cond_wait_timeout(void **state)
{
    waiter w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    int64_t start_us, deadline, elapsed_us;
    int rv;
    (void)state;
    assert_int_equal(swi_cond_init(&w.cv), 0);

    /* nobody signals: ETIMEDOUT no earlier than the deadline */
    pthread_mutex_lock(&w.mu);
    start_us = swi_now_us();
    deadline = swi_now_ms() + 60;
    do {
        rv = swi_cond_wait_until(&w.cv, &w.mu, deadline);
    } while (rv == 0); /* spurious wake-ups */
    elapsed_us = swi_now_us() - start_us;
    pthread_mutex_unlock(&w.mu);
    assert_int_equal(rv, ETIMEDOUT);
    assert_true(swi_now_ms() >= deadline);
    assert_true(elapsed_us >= 59000);
    assert_true(elapsed_us < 5000000);

    /* a deadline in the past times out at once */
    pthread_mutex_lock(&w.mu);
    start_us = swi_now_us();
    rv = swi_cond_wait_until(&w.cv, &w.mu, swi_now_ms() - 1000);
    elapsed_us = swi_now_us() - start_us;
    pthread_mutex_unlock(&w.mu);
    assert_int_equal(rv, ETIMEDOUT);
    assert_true(elapsed_us < 1000000);

    pthread_cond_destroy(&w.cv);
}

static void
test_cond_wait_signalled(void **state)
{
    waiter w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 20};
    pthread_t th;
    int64_t start_us, elapsed_us;
    int rv = 0;
    (void)state;
    assert_int_equal(swi_cond_init(&w.cv), 0);

    /* bounded wait, woken long before the deadline */
    pthread_mutex_lock(&w.mu);
    start_us = swi_now_us();
    assert_int_equal(pthread_create(&th, NULL, signal_later, &w), 0);
    while (!w.flag && rv == 0)
        rv = swi_cond_wait_until(&w.cv, &w.mu, swi_now_ms() + 10000);
    elapsed_us = swi_now_us() - start_us;
    pthread_mutex_unlock(&w.mu);
    pthread_join(th, NULL);
    assert_int_equal(rv, 0);
    assert_int_equal(w.flag, 1);
    assert_true(elapsed_us < 5000000);

    /* deadline < 0: waits without limit until signalled */
    w.flag = 0;
    rv = 0;
    pthread_mutex_lock(&w.mu);
    assert_int_equal(pthread_create(&th, NULL, signal_later, &w), 0);
    while (!w.flag && rv == 0)
        rv = swi_cond_wait_until(&w.cv, &w.mu, -1);
    pthread_mutex_unlock(&w.mu);
    pthread_join(th, NULL);
    assert_int_equal(rv, 0);
    assert_int_equal(w.flag, 1);

    pthread_cond_destroy(&w.cv);
}

/* ------------------------------------------------------------ ids, strings */

static void
test_random_token(void **state)
{
    char a[17], b[17];
    uint8_t r1[32], r2[32];
    (void)state;
    assert_int_equal(swi_init(), SW_OK);
    assert_int_equal(swi_init(), SW_OK); /* idempotent */
    memset(a, 'X', sizeof(a));
    swi_random_token(a);
    swi_random_token(b);
    assert_int_equal(strlen(a), 16);
    assert_int_equal(sw_validate_token(a), SW_OK);
    for (int i = 0; i < 16; i++)
        assert_true((a[i] >= '0' && a[i] <= '9') || (a[i] >= 'a' && a[i] <= 'f'));
    assert_string_not_equal(a, b);
    swi_random(r1, sizeof(r1));
    swi_random(r2, sizeof(r2));
    assert_memory_not_equal(r1, r2, sizeof(r1));
}

/* swi_random hands out a thread's buffer of the kernel's bytes: a fork's
 * child starts from a copy of it, and must not hand out what the parent
 * hands out next (two processes would make the same request ids). The
 * draws cross the buffer's end (256 bytes) and take the direct path (> 32
 * bytes) too; none repeats. */
static void
test_random_after_fork(void **state)
{
    uint8_t ids[64][16], parent[16], child[16], big[64];
    int fd[2], st = -1;
    pid_t pid;
    (void)state;
    assert_int_equal(swi_init(), SW_OK);
    for (int i = 0; i < 64; i++) {
        swi_random(ids[i], sizeof(ids[i]));
        for (int j = 0; j < i; j++)
            assert_memory_not_equal(ids[i], ids[j], sizeof(ids[i]));
    }
    swi_random(big, sizeof(big));
    assert_int_equal(pipe(fd), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        swi_random(child, sizeof(child));
        _exit(write(fd[1], child, sizeof(child)) == (ssize_t)sizeof(child) ? 0 : 1);
    }
    swi_random(parent, sizeof(parent));
    assert_int_equal(read(fd[0], child, sizeof(child)), (ssize_t)sizeof(child));
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(fd[0]);
    close(fd[1]);
    assert_memory_not_equal(parent, child, sizeof(parent));
}

static void
test_strdup(void **state)
{
    const char *src = "instance-1";
    char *d;
    (void)state;
    assert_null(swi_strdup(NULL));
    d = swi_strdup(src);
    assert_non_null(d);
    assert_ptr_not_equal(d, src);
    assert_string_equal(d, src);
    free(d);
    d = swi_strdup("");
    assert_non_null(d);
    assert_string_equal(d, "");
    free(d);
}

static void
test_version(void **state)
{
    char expect[32];
    (void)state;
    snprintf(expect, sizeof(expect), "%d.%d.%d", SW_VERSION_MAJOR, SW_VERSION_MINOR,
             SW_VERSION_PATCH);
    assert_string_equal(sw_version(), expect);
    assert_int_equal(SW_PROTOCOL_VERSION, 1);
}

/* ------------------------------------------------------------ logging */

typedef struct log_capture {
    int calls;
    sw_log_level level;
    char msg[1024];
} log_capture;

static void
capture_log(void *arg, sw_log_level level, const char *msg)
{
    log_capture *c = arg;
    c->calls++;
    c->level = level;
    snprintf(c->msg, sizeof(c->msg), "%s", msg);
}

static void
test_log(void **state)
{
    log_capture cap = {0, SW_LOG_ERROR, ""};
    swi_logger lg = {capture_log, &cap};
    swi_logger silent = {NULL, NULL};
    char big[2000];
    (void)state;

    assert_string_equal(sw_log_level_name(SW_LOG_ERROR), "error");
    assert_string_equal(sw_log_level_name(SW_LOG_WARN), "warn");
    assert_string_equal(sw_log_level_name(SW_LOG_INFO), "info");
    assert_string_equal(sw_log_level_name(SW_LOG_DEBUG), "debug");
    assert_string_equal(sw_log_level_name((sw_log_level)42), "unknown");

    swi_log(&lg, SW_LOG_WARN, "stream %s: %d items", "abc", 17);
    assert_int_equal(cap.calls, 1);
    assert_int_equal(cap.level, SW_LOG_WARN);
    assert_string_equal(cap.msg, "stream abc: 17 items");

    /* no sink: nothing happens */
    swi_log(&silent, SW_LOG_ERROR, "x %d", 1);
    swi_log(NULL, SW_LOG_ERROR, "x %d", 1);
    assert_int_equal(cap.calls, 1);

    /* long messages are truncated, still NUL-terminated */
    memset(big, 'q', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    swi_log(&lg, SW_LOG_DEBUG, "%s", big);
    assert_int_equal(cap.calls, 2);
    assert_int_equal(cap.level, SW_LOG_DEBUG);
    assert_int_equal(strlen(cap.msg), 511);
    assert_int_equal(cap.msg[0], 'q');
}

/* Issue 11 #11: peers choose request ids, so the map's hash is keyed: ids
 * that share their first 8 bytes (which all collided in the old hash, built
 * from those bytes) spread over the table, and a map full of them works. */
static void
test_idmap_hash_is_keyed(void **state)
{
    static uint8_t ids[1000][SW_REQUEST_ID_BYTES];
    static int seen[1024];
    swi_idmap m;
    int distinct = 0;
    (void)state;
    assert_int_equal(swi_idmap_init(&m, 16), 0);
    for (int i = 0; i < 1000; i++) {
        memset(ids[i], 0xab, 8);
        memset(ids[i] + 8, 0, 8);
        memcpy(ids[i] + 8, &i, sizeof(i));
        seen[swi_idmap_hash(ids[i]) & 1023]++;
        assert_int_equal(swi_idmap_put(&m, ids[i], &ids[i]), 0);
    }
    for (int i = 0; i < 1024; i++)
        distinct += seen[i] > 0;
    assert_true(distinct > 500); /* uniform: ~630 of 1024 buckets */
    for (int i = 0; i < 1000; i++)
        assert_ptr_equal(swi_idmap_get(&m, ids[i]), &ids[i]);
    swi_idmap_fini(&m);
}

/* A router's own map (swi_idmap_init_own): its keys are its own random ids,
 * so the hash is their first 8 bytes. Put, get, delete and re-put work over
 * many keys; foreign keys (a peer's guesses, sharing first bytes with live
 * ones) are not found and do not disturb the entries. */
static void
test_idmap_own_keys(void **state)
{
    static uint8_t ids[4000][SW_REQUEST_ID_BYTES];
    uint8_t foreign[SW_REQUEST_ID_BYTES];
    swi_idmap m;
    (void)state;
    assert_int_equal(swi_idmap_init_own(&m, 0), 0);
    assert_int_equal(m.keyed, 0);
    for (int i = 0; i < 4000; i++) {
        swi_random(ids[i], sizeof(ids[i]));
        assert_int_equal(swi_idmap_put(&m, ids[i], &ids[i]), 0);
    }
    assert_int_equal(m.live, 4000);
    for (int i = 0; i < 4000; i++) {
        memcpy(foreign, ids[i], 8); /* same hash as a live entry, another id */
        memset(foreign + 8, 0x5a, 8);
        assert_null(swi_idmap_get(&m, foreign));
        assert_ptr_equal(swi_idmap_get(&m, ids[i]), &ids[i]);
    }
    for (int i = 0; i < 4000; i += 2)
        assert_ptr_equal(swi_idmap_del(&m, ids[i]), &ids[i]);
    for (int i = 0; i < 4000; i++)
        assert_ptr_equal(swi_idmap_get(&m, ids[i]), i % 2 ? (void *)&ids[i] : NULL);
    for (int i = 0; i < 4000; i += 2)
        assert_int_equal(swi_idmap_put(&m, ids[i], &ids[i]), 0);
    assert_int_equal(m.live, 4000);
    for (int i = 0; i < 4000; i++)
        assert_ptr_equal(swi_idmap_get(&m, ids[i]), &ids[i]);
    swi_idmap_fini(&m);
}

/* swi_idmap_get_n answers as swi_idmap_get would for each key, in order:
 * more keys than one prefetch round (SWI_IDMAP_GET_N_MAX), hits, misses,
 * keys behind tombstones and colliding chains, in a keyed map and an own
 * one, and on a finished map (no slots: every answer NULL). */
static void
test_idmap_get_n(void **state)
{
    enum { N = 3 * SWI_IDMAP_GET_N_MAX + 7 };
    static uint8_t ids[N][SW_REQUEST_ID_BYTES];
    const uint8_t *keys[N];
    void *out[N];
    (void)state;
    for (int own = 0; own < 2; own++) {
        swi_idmap m;
        size_t hits = 0;
        assert_int_equal(own ? swi_idmap_init_own(&m, 0) : swi_idmap_init(&m, 0), 0);
        for (int i = 0; i < N; i++) {
            swi_random(ids[i], sizeof(ids[i]));
            if (i % 5 == 4) /* a chain: the own map's hash is the first 8 bytes */
                memcpy(ids[i], ids[i - 1], 8);
            keys[i] = ids[N - 1 - i]; /* asked in another order than put */
            if (i % 4 != 3)
                assert_int_equal(swi_idmap_put(&m, ids[i], &ids[i]), 0); /* every 4th: absent */
        }
        for (int i = 0; i < N; i += 7) /* tombstones in the chains */
            (void)swi_idmap_del(&m, ids[i]);
        memset(out, 0xee, sizeof(out));
        swi_idmap_get_n(&m, keys, N, out);
        for (int i = 0; i < N; i++) {
            int k = N - 1 - i;
            void *want = (k % 4 != 3 && k % 7 != 0) ? (void *)ids[k] : NULL;
            assert_ptr_equal(out[i], want);
            assert_ptr_equal(out[i], swi_idmap_get(&m, keys[i]));
            hits += want != NULL;
        }
        assert_true(hits > N / 2);
        swi_idmap_get_n(&m, keys, 0, out); /* none: nothing read or written */
        swi_idmap_fini(&m);
        memset(out, 0xee, sizeof(out));
        swi_idmap_get_n(&m, keys, N, out);
        for (int i = 0; i < N; i++)
            assert_null(out[i]);
    }
}

/* Every byte value: a token holds exactly [A-Za-z0-9_-], 1..SW_MAX_TOKEN
 * of them. */
static void
test_validate_token_charset(void **state)
{
    char t[SW_MAX_TOKEN + 2];
    (void)state;
    for (int c = 1; c < 256; c++) {
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '_' || c == '-';
        t[0] = 'a';
        t[1] = (char)c;
        t[2] = '\0';
        assert_int_equal(sw_validate_token(t), ok ? SW_OK : SW_EINVAL);
    }
    memset(t, 'x', SW_MAX_TOKEN);
    t[SW_MAX_TOKEN] = '\0';
    assert_int_equal(sw_validate_token(t), SW_OK);
    t[SW_MAX_TOKEN] = 'x';
    t[SW_MAX_TOKEN + 1] = '\0';
    assert_int_equal(sw_validate_token(t), SW_EINVAL);
    assert_int_equal(sw_validate_token(""), SW_EINVAL);
    assert_int_equal(sw_validate_token(NULL), SW_EINVAL);
}

/* W3C traceparent: version-traceid-parentid-flags, lowercase hex. */
static void
test_trace_id(void **state)
{
    char t[SWI_TRACE_ID_LEN + 1];
    char lt[SWI_LOGTAG_MAX];
    (void)state;
    assert_int_equal(swi_trace_id("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", t), 1);
    assert_string_equal(t, "4bf92f3577b34da6a3ce929d0e0e4736");
    /* a later version may append fields */
    assert_int_equal(swi_trace_id("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xyz", t),
                     1);
    /* refused: version ff, 00 with extra fields, upper case, zero ids, short,
     * wrong separators, NULL */
    const char *bad[] = {
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xyz",
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x", /* not '-' after the flags */
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
        "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
        "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        "",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(swi_trace_id(bad[i], t), 0);
        assert_string_equal(t, "");
    }
    assert_int_equal(swi_trace_id(NULL, t), 0);
    swi_logtag(lt, "abcd", "");
    assert_string_equal(lt, "abcd");
    swi_logtag(lt, "abcd", "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_string_equal(lt, "abcd trace=4bf92f3577b34da6a3ce929d0e0e4736");
    swi_logtag(lt, "0123456789abcdef0123456789abcdef", "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_string_equal(lt,
                        "0123456789abcdef0123456789abcdef trace=4bf92f3577b34da6a3ce929d0e0e4736");
}

/* swi_strlcpy: snprintf(dst, cap, "%s", src) without the format walk. */
static void
test_strlcpy(void **state)
{
    char b[6];
    (void)state;
    memset(b, '#', sizeof(b));
    assert_int_equal(swi_strlcpy(b, "abc", sizeof(b)), 3);
    assert_string_equal(b, "abc");
    assert_int_equal(swi_strlcpy(b, "abcde", sizeof(b)), 5); /* exactly fits */
    assert_string_equal(b, "abcde");
    assert_int_equal(swi_strlcpy(b, "abcdefgh", sizeof(b)), 8); /* cut: the return says so */
    assert_string_equal(b, "abcde");
    assert_int_equal(swi_strlcpy(b, "", sizeof(b)), 0);
    assert_string_equal(b, "");
    b[1] = '#';
    assert_int_equal(swi_strlcpy(b, "xyz", 1), 3);
    assert_int_equal(b[0], '\0');
    assert_int_equal(b[1], '#'); /* nothing past cap */
}

/* swi_textlcpy: as swi_strlcpy, but a cut never splits a UTF-8
 * character (2-, 3- and 4-byte ones; one that fits exactly stays). */
static void
test_textlcpy(void **state)
{
    char b[6];
    (void)state;
    assert_int_equal(swi_textlcpy(b, "abcde", sizeof(b)), 5);
    assert_string_equal(b, "abcde");
    assert_int_equal(swi_textlcpy(b, "abcdefgh", sizeof(b)), 8);
    assert_string_equal(b, "abcde");
    assert_int_equal(swi_textlcpy(b, "abcd\xc3\xa9", sizeof(b)), 6); /* 2 bytes at 4: out */
    assert_string_equal(b, "abcd");
    assert_int_equal(swi_textlcpy(b, "abc\xc3\xa9x", sizeof(b)), 6); /* fits exactly */
    assert_string_equal(b, "abc\xc3\xa9");
    assert_int_equal(swi_textlcpy(b, "ab\xe2\x82\xac", sizeof(b)), 5); /* 3 bytes fit */
    assert_string_equal(b, "ab\xe2\x82\xac");
    assert_int_equal(swi_textlcpy(b, "abc\xe2\x82\xac", sizeof(b)), 6);
    assert_string_equal(b, "abc");
    assert_int_equal(swi_textlcpy(b, "a\360\237\230\200b", sizeof(b)), 6); /* 4 bytes fit */
    assert_string_equal(b, "a\xf0\x9f\x98\x80");
    assert_int_equal(swi_textlcpy(b, "ab\xf0\x9f\x98\x80", sizeof(b)), 6);
    assert_string_equal(b, "ab");
    assert_int_equal(swi_textlcpy(b, "\x80\x80\x80\x80\x80\x80", sizeof(b)), 6);
    assert_string_equal(b, ""); /* not text at all: nothing of it */
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idmap_hash_is_keyed),
        cmocka_unit_test(test_idmap_own_keys),
        cmocka_unit_test(test_idmap_get_n),
        cmocka_unit_test(test_validate_token_charset),
        cmocka_unit_test(test_trace_id),
        cmocka_unit_test(test_strlcpy),
        cmocka_unit_test(test_textlcpy),
        cmocka_unit_test(test_idmap_basic),
        cmocka_unit_test(test_idmap_initial_capacity),
        cmocka_unit_test(test_idmap_many_keys),
        cmocka_unit_test(test_idmap_colliding_keys),
        cmocka_unit_test(test_idmap_tombstone_churn_fresh_keys),
        cmocka_unit_test(test_idmap_tombstone_churn_same_keys),
        cmocka_unit_test(test_hex),
        cmocka_unit_test(test_unhex),
        cmocka_unit_test(test_valid_code),
        cmocka_unit_test(test_clocks),
        cmocka_unit_test(test_cond_wait_timeout),
        cmocka_unit_test(test_cond_wait_signalled),
        cmocka_unit_test(test_random_token),
        cmocka_unit_test(test_random_after_fork),
        cmocka_unit_test(test_strdup),
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_log),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
