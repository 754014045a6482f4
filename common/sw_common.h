/* common/sw_common.h -- internal helpers shared by every layer: clocks,
 * random ids, hex, logging, small sync wrappers. Internal symbols use the
 * swi_ prefix and are hidden from the shared library. */
#ifndef SW_COMMON_H
#define SW_COMMON_H

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <streamwire/streamwire.h>

#define SW_REQUEST_ID_BYTES 16
#define SW_REQUEST_ID_HEX (2 * SW_REQUEST_ID_BYTES + 1)
/* nats.c statuses wrapped as SW_ENATS_BASE + status are below this. */
#define SWI_NATS_STATUS_MAX 0x1000

#if defined(__GNUC__)
#define SWI_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define SWI_PRINTF(a, b)
#endif

/* Monotonic milliseconds / microseconds (CLOCK_MONOTONIC). */
int64_t swi_now_ms(void);
int64_t swi_now_us(void);
/* Wall clock, milliseconds since the Unix epoch. */
int64_t swi_unix_ms(void);

/* Initialises libsodium once (thread-safe). Returns SW_OK or SW_ECRYPTO. */
sw_err swi_init(void);

/* Fills buf with random bytes (libsodium). swi_init() must have succeeded. */
void swi_random(void *buf, size_t len);
/* A random 64-bit id that is never 0 (0 stands for "none" on the wire):
 * incarnations of workers and of registrations. */
uint64_t swi_random_id64(void);
/* Writes 2*len lowercase hex chars plus NUL into out (size >= 2*len+1). */
void swi_hex(char *out, const uint8_t *in, size_t len);
/* The len bytes that 2 * len hex digits at hex stand for, into out: 0, or
 * -1 if hex does not start with that many hex digits (out is then
 * unspecified). */
int swi_unhex(uint8_t *out, const char *hex, size_t len);
/* A random id of 16 lowercase hex characters into out[17]. */
void swi_random_token(char out[17]);

/* strdup that returns NULL for NULL. */
char *swi_strdup(const char *s);
/* Copies src (not NULL) into dst of cap > 0 bytes, cut short to fit and
 * always terminated, as snprintf(dst, cap, "%s", src) does without the
 * format walk. Returns strlen(src) (>= cap: it was cut). */
size_t swi_strlcpy(char *dst, const char *src, size_t cap);
/* As swi_strlcpy, but a text cut short is cut before the UTF-8 character
 * the cut would split (a character never arrives in part). */
size_t swi_textlcpy(char *dst, const char *src, size_t cap);
/* The length of t if it is a valid subject token (sw_validate_token), else
 * 0. */
size_t swi_token_len(const char *t);

/* Condition variable on CLOCK_MONOTONIC, and a wait with an absolute
 * monotonic deadline in ms (deadline < 0 waits forever). Returns 0 or
 * ETIMEDOUT. */
int swi_cond_init(pthread_cond_t *c);
int swi_cond_wait_until(pthread_cond_t *c, pthread_mutex_t *m, int64_t deadline_ms);

/* Logging into a user sink; formats only when a sink is set. */
typedef struct swi_logger {
    sw_log_fn fn;
    void *arg;
} swi_logger;
void swi_log(const swi_logger *lg, sw_log_level lvl, const char *fmt, ...) SWI_PRINTF(3, 4);

/* 1 if a duration option fits the unsigned milliseconds it is kept in:
 * 0..INT32_MAX (negative is SW_EINVAL, streamwire.h; past INT32_MAX it
 * would wrap). */
static inline int
swi_ms_ok(sw_duration ms)
{
    return ms >= 0 && ms <= INT32_MAX;
}

/* Validates an application error code token: 1..64 chars of [a-z0-9_.-]. */
int swi_valid_code(const char *code);

/* W3C trace context: the trace id (32 lowercase hex) of a traceparent
 * value "VV-<trace id>-<parent id>-FF" (version not ff, ids not all zero).
 * Returns 1 and fills out, or 0 and sets out to "". */
#define SWI_TRACE_ID_LEN 32
int swi_trace_id(const char *traceparent, char out[SWI_TRACE_ID_LEN + 1]);
/* What log lines call a stream: "<request id hex>", plus " trace=<trace
 * id>" when there is one. */
#define SWI_LOGTAG_MAX (SW_REQUEST_ID_HEX + SWI_TRACE_ID_LEN + 8)
void swi_logtag(char out[SWI_LOGTAG_MAX], const char *idhex, const char *trace_id);

/* Hash map from 16-byte request id to pointer; open addressing, grows.
 * Not thread-safe: callers lock. */
typedef struct swi_idmap_slot {
    uint8_t key[SW_REQUEST_ID_BYTES];
    void *val; /* NULL = empty; SWI_IDMAP_TOMB = deleted */
} swi_idmap_slot;
typedef struct swi_idmap {
    swi_idmap_slot *slots;
    size_t cap;  /* power of two */
    size_t used; /* live + tombstones */
    size_t live;
    int keyed; /* 1: SipHash with the process key (swi_idmap_init); 0: own ids */
} swi_idmap;
/* A map whose keys peers may choose (a worker's streams, keyed by the
 * router's request ids): hashed with SipHash under a random per-process key,
 * so no peer can build collision chains. */
int swi_idmap_init(swi_idmap *m, size_t initial);
/* A map whose keys only this process creates, from swi_random (a router's
 * own request ids): the key's first 8 bytes are the hash. Lookups of
 * foreign keys are still safe: they cannot lengthen a chain. */
int swi_idmap_init_own(swi_idmap *m, size_t initial);
/* The map's hash: SipHash with a random per-process key (libsodium's
 * crypto_shorthash), because peers choose request ids. */
size_t swi_idmap_hash(const uint8_t *key);
void swi_idmap_fini(swi_idmap *m);
void *swi_idmap_get(const swi_idmap *m, const uint8_t *key);
/* swi_idmap_get of n keys: out[i] for keys[i]. The slots of up to
 * SWI_IDMAP_GET_N_MAX keys at a time are asked of the cache before the
 * first is read, so that the misses of a large, cold map overlap (a batch
 * of heartbeats). */
#define SWI_IDMAP_GET_N_MAX 64
void swi_idmap_get_n(const swi_idmap *m, const uint8_t *const *keys, size_t n, void **out);
int swi_idmap_put(swi_idmap *m, const uint8_t *key, void *val); /* 0 ok, -1 nomem */
void *swi_idmap_del(swi_idmap *m, const uint8_t *key);
/* Calls fn for each live entry; fn must not modify the map. */
void swi_idmap_each(const swi_idmap *m, void (*fn)(void *val, void *arg), void *arg);
/* Up to max of the values in the map (in slot order) into out, without
 * allocating; how many. */
size_t swi_idmap_some(const swi_idmap *m, void **out, size_t max);

/* Asks the cache for the n bytes at p, for writing: a hint (p need not be
 * valid), for loops that visit many cold objects, fetching the next ones
 * while one is handled so that their misses overlap. */
static inline void
swi_prefetch(const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)63, end = (uintptr_t)p + n;
    for (; a < end; a += 64) /* each line the bytes touch */
        __builtin_prefetch((const void *)a, 1);
}

/* A growable array of pointers, reused across snapshots. */
typedef struct swi_ptrvec {
    void **v;
    size_t n, cap;
} swi_ptrvec;
/* Empties vec and makes room for n values (twice that, so that a snapshot
 * that grows a little does not reallocate). If memory is short the
 * capacity stays as it was: a snapshot then takes as many as fit. */
void swi_ptrvec_reserve(swi_ptrvec *vec, size_t n);
/* Fills vec with the map's live values for which take(val, arg) returns 1
 * (take references the value it takes; the caller holds the map's lock and
 * later drops each reference). If memory is short, takes as many as fit. */
void swi_idmap_snapshot(const swi_idmap *m, swi_ptrvec *vec, int (*take)(void *val, void *arg),
                        void *arg);

#endif
