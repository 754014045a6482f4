/* transport/seal.c -- the sealing core: cluster key files, key ids, derived
 * stream / instance keys, and crypto_aead_xchacha20poly1305_ietf seal/open
 * with the associated data of docs/PROTOCOL.md "Security: sealing".
 *
 * Locks and threads: none. The nonce source is process-wide: a 16-byte
 * random salt, drawn once (pthread_once) and again in a fork child
 * (pthread_atfork), followed by a 64-bit counter taken with one atomic
 * fetch-add per seal. Every buffer that held key bytes is wiped with
 * sodium_memzero before return, on every path. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "common/sw_common.h"
#include "transport/seal.h"

#define SEAL_FILE_MAX 4096
#define SEAL_AD_FIXED 35 /* see seal_ad_build */
#define SEAL_AD_VERSION 1

/* ------------------------------------------------------------------------ */
/* Nonces: salt || big-endian counter.                                       */

static uint8_t seal_salt[16];
static atomic_uint_fast64_t seal_counter;
static pthread_once_t seal_once = PTHREAD_ONCE_INIT;

/* After fork the child shares the parent's salt and counter: a new salt
 * keeps the two processes' nonces apart. Only the child's one thread runs
 * here. */
static void
seal_after_fork_child(void)
{
    randombytes_buf(seal_salt, sizeof(seal_salt));
    atomic_store(&seal_counter, 0);
}

static void
seal_nonce_init(void)
{
    randombytes_buf(seal_salt, sizeof(seal_salt));
    (void)pthread_atfork(NULL, NULL, seal_after_fork_child);
}

static sw_err
seal_nonce_next(uint8_t nonce[SWT_SEAL_NONCE_BYTES])
{
    uint64_t n;

    pthread_once(&seal_once, seal_nonce_init);
    n = (uint64_t)atomic_fetch_add(&seal_counter, 1);
    if (n >= (UINT64_C(1) << 63)) /* never in practice; refuse long before a wrap */
        return SW_ECRYPTO;
    memcpy(nonce, seal_salt, sizeof(seal_salt));
    for (int i = 0; i < 8; i++)
        nonce[16 + i] = (uint8_t)(n >> (56 - 8 * i));
    return SW_OK;
}

uint64_t
swt_seal_nonces_used(void)
{
    return (uint64_t)atomic_load(&seal_counter);
}

/* ------------------------------------------------------------------------ */
/* Cluster keys                                                              */

static uint32_t
seal_key_id(const uint8_t k[SWT_SEAL_KEY_BYTES])
{
    static const uint8_t personal[16] = {'s', 't', 'r', 'e', 'a', 'm', 'w', 'i',
                                         'r', 'e', '/', 'k', 'e', 'y', 'i', 'd'};
    uint8_t h[32];
    uint32_t id;

    crypto_generichash_blake2b_salt_personal(h, sizeof(h), NULL, 0, k, SWT_SEAL_KEY_BYTES, NULL,
                                             personal);
    id = (uint32_t)h[0] << 24 | (uint32_t)h[1] << 16 | (uint32_t)h[2] << 8 | h[3];
    sodium_memzero(h, sizeof(h));
    return id == 0 ? 1 : id;
}

sw_err
swt_seal_key_from_bytes(const uint8_t raw[SWT_SEAL_KEY_BYTES], swt_seal_key *out)
{
    if (out == NULL)
        return SW_EINVAL;
    if (raw == NULL) {
        sodium_memzero(out, sizeof(*out));
        return SW_EINVAL;
    }
    if (swi_init() != SW_OK) {
        sodium_memzero(out, sizeof(*out));
        return SW_ECRYPTO;
    }
    memmove(out->k, raw, SWT_SEAL_KEY_BYTES);
    out->id = seal_key_id(out->k);
    return SW_OK;
}

sw_err
swt_seal_key_generate(swt_seal_key *out)
{
    if (out == NULL)
        return SW_EINVAL;
    if (swi_init() != SW_OK) {
        memset(out, 0, sizeof(*out));
        return SW_ECRYPTO;
    }
    randombytes_buf(out->k, sizeof(out->k));
    out->id = seal_key_id(out->k);
    return SW_OK;
}

void
swt_seal_key_hex(const swt_seal_key *key, char hex[SWT_SEAL_KEY_HEX + 1])
{
    sodium_bin2hex(hex, SWT_SEAL_KEY_HEX + 1, key->k, sizeof(key->k));
}

void
swt_seal_key_wipe(swt_seal_key *key)
{
    if (key != NULL)
        sodium_memzero(key, sizeof(*key));
}

#if defined(__GNUC__)
__attribute__((format(printf, 5, 6)))
#endif
static sw_err
seal_fail(sw_err err, char *why, size_t why_len, const char *path, const char *fmt, ...)
{
    if (why != NULL && why_len > 0) {
        char what[192];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(what, sizeof(what), fmt, ap);
        va_end(ap);
        snprintf(why, why_len, "key file %s: %s", path, what);
    }
    return err;
}

/* One line of buf[0..n): trims blanks, skips comments; returns 1 with the
 * token in *tok and *tok_len for a content line, 0 otherwise. */
static int
seal_line_token(char *line, size_t n, char **tok, size_t *tok_len)
{
    while (n > 0 && (line[0] == ' ' || line[0] == '\t')) {
        line++;
        n--;
    }
    while (n > 0 && (line[n - 1] == ' ' || line[n - 1] == '\t' || line[n - 1] == '\r'))
        n--;
    if (n == 0 || line[0] == '#')
        return 0;
    *tok = line;
    *tok_len = n;
    return 1;
}

sw_err
swt_seal_key_load(const char *path, swt_seal_key *out, char *why, size_t why_len)
{
    char buf[SEAL_FILE_MAX + 1];
    struct stat st;
    ssize_t got;
    size_t len = 0, pos, lineno = 0;
    int fd, have = 0, read_errno = 0;
    sw_err err = SW_OK;

    if (why != NULL && why_len > 0)
        why[0] = '\0';
    if (out == NULL)
        return SW_EINVAL;
    sodium_memzero(out, sizeof(*out));
    if (path == NULL || path[0] == '\0')
        return seal_fail(SW_EINVAL, why, why_len, "(none)", "no path given");
    if (swi_init() != SW_OK)
        return seal_fail(SW_ECRYPTO, why, why_len, path, "libsodium failed to initialise");
    /* O_NONBLOCK: a FIFO (or a device) at the path must not block start-up
     * before the regular-file check below refuses it. */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        return seal_fail(e == ENOENT   ? SW_ENOTFOUND
                         : e == EACCES ? SW_EPERM
                                       : SW_EINVAL,
                         why, why_len, path, "cannot open: %s", strerror(e));
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return seal_fail(SW_EINVAL, why, why_len, path, "not a regular file");
    }
    if (st.st_uid != geteuid() && st.st_uid != 0) {
        close(fd);
        return seal_fail(SW_EPERM, why, why_len, path,
                         "owned by uid %u, not by this user (uid %u) or root: a key another "
                         "user controls is refused (chown it)",
                         (unsigned)st.st_uid, (unsigned)geteuid());
    }
    if ((st.st_mode & 077) != 0) {
        close(fd);
        return seal_fail(SW_EPERM, why, why_len, path,
                         "is accessible by group or others (mode %04lo); the key must be "
                         "private: chmod 600 it",
                         (unsigned long)(st.st_mode & 07777));
    }
    if (st.st_size > SEAL_FILE_MAX) {
        close(fd);
        return seal_fail(SW_EINVAL, why, why_len, path, "larger than %d bytes", SEAL_FILE_MAX);
    }
    for (;;) {
        got = read(fd, buf + len, sizeof(buf) - len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            read_errno = errno;
        if (got <= 0)
            break;
        len += (size_t)got;
        if (len == sizeof(buf))
            break;
    }
    close(fd);
    if (got < 0) {
        sodium_memzero(buf, sizeof(buf));
        return seal_fail(SW_EINVAL, why, why_len, path, "cannot read: %s", strerror(read_errno));
    }
    if (len > SEAL_FILE_MAX) {
        sodium_memzero(buf, sizeof(buf));
        return seal_fail(SW_EINVAL, why, why_len, path, "larger than %d bytes", SEAL_FILE_MAX);
    }
    for (pos = 0; pos < len && err == SW_OK;) {
        char *nl = memchr(buf + pos, '\n', len - pos);
        size_t n = nl != NULL ? (size_t)(nl - (buf + pos)) : len - pos;
        char *tok;
        size_t tok_len, bin_len = 0;
        const char *end = NULL;

        lineno++;
        if (memchr(buf + pos, '\0', n) != NULL) {
            err = seal_fail(SW_EINVAL, why, why_len, path, "line %zu: a NUL byte", lineno);
        } else if (seal_line_token(buf + pos, n, &tok, &tok_len)) {
            if (have)
                err = seal_fail(SW_EINVAL, why, why_len, path,
                                "line %zu: a second key line (one key per file)", lineno);
            else if (tok_len != SWT_SEAL_KEY_HEX ||
                     sodium_hex2bin(out->k, sizeof(out->k), tok, tok_len, NULL, &bin_len, &end) !=
                         0 ||
                     bin_len != SWT_SEAL_KEY_BYTES || end != tok + tok_len)
                err = seal_fail(SW_EINVAL, why, why_len, path,
                                "line %zu: expected 64 hex digits (a key made by "
                                "`streamwire keygen`)",
                                lineno);
            else
                have = 1;
        }
        pos += n + 1;
    }
    sodium_memzero(buf, sizeof(buf));
    if (err == SW_OK && !have)
        err = seal_fail(SW_EINVAL, why, why_len, path, "no key line (64 hex digits)");
    if (err != SW_OK) {
        sodium_memzero(out, sizeof(*out));
        return err;
    }
    out->id = seal_key_id(out->k);
    return SW_OK;
}

/* ------------------------------------------------------------------------ */
/* Derived keys                                                              */

static int
seal_scope_valid(int scope)
{
    return scope >= SWT_SEAL_STREAM_F2W && scope <= SWT_SEAL_DEAD;
}

static int
seal_scope_per_stream(int scope)
{
    return scope == SWT_SEAL_STREAM_F2W || scope == SWT_SEAL_STREAM_W2F;
}

sw_err
swt_seal_derive(const swt_seal_key *key, swt_seal_scope scope,
                const uint8_t rid[SWT_SEAL_RID_BYTES], swt_seal_subkey *out)
{
    uint8_t personal[16] = {'s', 't', 'r', 'e', 'a', 'm', 'w', 'i', 'r', 'e', '/', 's', '1'};

    if (out == NULL)
        return SW_EINVAL;
    sodium_memzero(out, sizeof(*out));
    if (key == NULL || !seal_scope_valid((int)scope) ||
        (seal_scope_per_stream((int)scope) ? rid == NULL : rid != NULL))
        return SW_EINVAL;
    personal[13] = (uint8_t)scope;
    if (rid != NULL)
        memcpy(out->rid, rid, SWT_SEAL_RID_BYTES);
    if (crypto_generichash_blake2b_salt_personal(out->k, sizeof(out->k), NULL, 0, key->k,
                                                 sizeof(key->k), out->rid, personal) != 0) {
        sodium_memzero(out, sizeof(*out));
        return SW_ECRYPTO;
    }
    out->key_id = key->id;
    out->scope = (uint8_t)scope;
    return SW_OK;
}

void
swt_seal_subkey_wipe(swt_seal_subkey *sub)
{
    if (sub != NULL)
        sodium_memzero(sub, sizeof(*sub));
}

/* ------------------------------------------------------------------------ */
/* Seal and open                                                             */

static void
seal_be(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * (n - 1 - i)));
}

/* The associated data (docs/PROTOCOL.md): version, scope, type, kind,
 * final, key id (4), request id (16), seq (8), context length (2), context.
 * Returns its length, or 0 for an invalid ad. */
static size_t
seal_ad_build(const swt_seal_subkey *sub, const swt_seal_ad *ad,
              uint8_t out[SEAL_AD_FIXED + SWT_SEAL_CONTEXT_MAX])
{
    if (ad == NULL || ad->final > 1 || ad->context_len > SWT_SEAL_CONTEXT_MAX ||
        (ad->context == NULL && ad->context_len > 0) || !seal_scope_valid(sub->scope))
        return 0;
    out[0] = SEAL_AD_VERSION;
    out[1] = sub->scope;
    out[2] = ad->msg_type;
    out[3] = ad->kind;
    out[4] = ad->final;
    seal_be(out + 5, sub->key_id, 4);
    memcpy(out + 9, sub->rid, SWT_SEAL_RID_BYTES);
    seal_be(out + 25, ad->seq, 8);
    seal_be(out + 33, ad->context_len, 2);
    if (ad->context_len > 0)
        memcpy(out + SEAL_AD_FIXED, ad->context, ad->context_len);
    return SEAL_AD_FIXED + ad->context_len;
}

sw_err
swt_seal(const swt_seal_subkey *sub, const swt_seal_ad *ad, const void *pt, size_t pt_len,
         uint8_t nonce[SWT_SEAL_NONCE_BYTES], uint8_t *ct, size_t ct_cap, size_t *ct_len)
{
    uint8_t adb[SEAL_AD_FIXED + SWT_SEAL_CONTEXT_MAX];
    unsigned long long clen = 0;
    size_t adlen;
    sw_err err;

    if (ct_len != NULL)
        *ct_len = 0;
    if (sub == NULL || nonce == NULL || ct == NULL || ct_len == NULL || (pt == NULL && pt_len > 0))
        return SW_EINVAL;
    if ((adlen = seal_ad_build(sub, ad, adb)) == 0)
        return SW_EINVAL;
    if (pt_len > SWT_SEAL_MAX_PLAINTEXT || ct_cap < pt_len + SWT_SEAL_TAG_BYTES)
        return SW_EMSGSIZE;
    if ((err = seal_nonce_next(nonce)) != SW_OK)
        return err;
    if (crypto_aead_xchacha20poly1305_ietf_encrypt(ct, &clen, pt, pt_len, adb, adlen, NULL, nonce,
                                                   sub->k) != 0) {
        sodium_memzero(ct, pt_len + SWT_SEAL_TAG_BYTES);
        return SW_ECRYPTO;
    }
    *ct_len = (size_t)clen;
    return SW_OK;
}

sw_err
swt_open(const swt_seal_subkey *sub, uint32_t key_id, const swt_seal_ad *ad, const uint8_t *nonce,
         size_t nonce_len, const uint8_t *ct, size_t ct_len, uint8_t *pt, size_t pt_cap,
         size_t *pt_len)
{
    uint8_t adb[SEAL_AD_FIXED + SWT_SEAL_CONTEXT_MAX];
    uint8_t dummy[1];
    unsigned long long mlen = 0;
    size_t adlen, want;

    if (pt_len != NULL)
        *pt_len = 0;
    if (sub == NULL || pt_len == NULL || (pt == NULL && pt_cap > 0))
        return SW_EINVAL;
    if (key_id != sub->key_id || nonce == NULL || nonce_len != SWT_SEAL_NONCE_BYTES || ct == NULL ||
        ct_len < SWT_SEAL_TAG_BYTES)
        return SW_AUTH_FAILED;
    want = ct_len - SWT_SEAL_TAG_BYTES;
    if (want > SWT_SEAL_MAX_PLAINTEXT || want > pt_cap)
        return SW_EMSGSIZE;
    if ((adlen = seal_ad_build(sub, ad, adb)) == 0)
        return SW_AUTH_FAILED;
    if (crypto_aead_xchacha20poly1305_ietf_decrypt(want > 0 ? pt : dummy, &mlen, NULL, ct, ct_len,
                                                   adb, adlen, nonce, sub->k) != 0 ||
        mlen != want) {
        if (want > 0)
            sodium_memzero(pt, want);
        return SW_AUTH_FAILED;
    }
    *pt_len = want;
    return SW_OK;
}
