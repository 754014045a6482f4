/* transport/nkey.c -- NATS user nkeys: the public key of a seed file, so
 * that `--nkey FILE` needs only the seed (nats.c's
 * natsOptions_SetNKeyFromSeed also wants the public key, and nats.c 3.4 has
 * no call that derives it).
 *
 * An nkey is base32 (RFC 4648, no padding) of: prefix byte(s), a 32-byte
 * Ed25519 key, and a CRC-16/XMODEM of everything before it, little endian.
 * A user seed starts with the two bytes
 *     (18 << 3) | (20 << 3) >> 5,  ((20 << 3) & 31) << 3
 * ("SU" in base32) followed by the Ed25519 seed; the user's public key is
 * the byte 20 << 3 ("U") followed by the Ed25519 public key.
 *
 * No locks, no threads. Every buffer that held the seed is wiped with
 * sodium_memzero before return, on every path. */
#include <stdio.h>
#include <string.h>

#include <sodium.h>

#include "transport/sw_transport.h"

#define NK_PREFIX_SEED (18u << 3)
#define NK_PREFIX_USER (20u << 3)
#define NK_SEED_RAW 36   /* 2 prefix + 32 + 2 crc */
#define NK_PUBLIC_RAW 35 /* 1 prefix + 32 + 2 crc */
#define NK_SEED_LEN 58
#define NK_FILE_MAX 8192

static const char nk_b32[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

static uint16_t
nk_crc16(const uint8_t *p, size_t n)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < n; i++) {
        crc ^= (uint16_t)(p[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

/* base32 of n bytes into out (cap >= ceil(n * 8 / 5) + 1). */
static void
nk_b32_encode(const uint8_t *in, size_t n, char *out)
{
    size_t o = 0;
    unsigned buf = 0, bits = 0;
    for (size_t i = 0; i < n; i++) {
        buf = (buf << 8) | in[i];
        bits += 8;
        while (bits >= 5) {
            out[o++] = nk_b32[(buf >> (bits - 5)) & 31];
            bits -= 5;
        }
    }
    if (bits > 0)
        out[o++] = nk_b32[(buf << (5 - bits)) & 31];
    out[o] = '\0';
}

/* Decodes exactly len base32 characters into out (cap bytes); returns the
 * number of bytes, or -1 on a bad character or overflow. */
static int
nk_b32_decode(const char *in, size_t len, uint8_t *out, size_t cap)
{
    size_t o = 0;
    unsigned buf = 0, bits = 0;
    for (size_t i = 0; i < len; i++) {
        const char *at = memchr(nk_b32, in[i], 32);
        if (in[i] == '\0' || at == NULL)
            return -1;
        buf = (buf << 5) | (unsigned)(at - nk_b32);
        bits += 5;
        if (bits >= 8) {
            if (o >= cap)
                return -1;
            out[o++] = (uint8_t)(buf >> (bits - 8));
            bits -= 8;
        }
    }
    return (int)o;
}

sw_err
swt_nkey_user_public(const char *seed, char out[SWT_NKEY_PUBLIC_LEN + 1])
{
    uint8_t raw[NK_SEED_RAW + 2], pk[crypto_sign_PUBLICKEYBYTES], sk[crypto_sign_SECRETKEYBYTES];
    uint8_t pub[NK_PUBLIC_RAW];
    sw_err rv = SW_EAUTH;
    uint16_t crc;
    int n;
    if (seed == NULL || out == NULL)
        return SW_EINVAL;
    out[0] = '\0';
    if (swi_init() != SW_OK)
        return SW_ECRYPTO;
    n = nk_b32_decode(seed, NK_SEED_LEN, raw, sizeof(raw));
    if (n != NK_SEED_RAW)
        goto out;
    crc = (uint16_t)(raw[NK_SEED_RAW - 2] | (raw[NK_SEED_RAW - 1] << 8));
    if (crc != nk_crc16(raw, NK_SEED_RAW - 2) || (raw[0] & 0xf8) != NK_PREFIX_SEED ||
        (uint8_t)(((raw[0] & 7) << 5) | (raw[1] >> 3)) != NK_PREFIX_USER)
        goto out;
    if (crypto_sign_seed_keypair(pk, sk, raw + 2) != 0)
        goto out;
    pub[0] = (uint8_t)NK_PREFIX_USER;
    memcpy(pub + 1, pk, sizeof(pk));
    crc = nk_crc16(pub, 33);
    pub[33] = (uint8_t)(crc & 0xff);
    pub[34] = (uint8_t)(crc >> 8);
    nk_b32_encode(pub, sizeof(pub), out);
    rv = SW_OK;
out:
    sodium_memzero(raw, sizeof(raw));
    sodium_memzero(sk, sizeof(sk));
    return rv;
}

sw_err
swt_nkey_user_seed_encode(const uint8_t raw_seed[32], char out[SWT_NKEY_SEED_LEN + 1])
{
    uint8_t raw[NK_SEED_RAW];
    uint16_t crc;
    raw[0] = (uint8_t)(NK_PREFIX_SEED | (NK_PREFIX_USER >> 5));
    raw[1] = (uint8_t)((NK_PREFIX_USER & 31) << 3);
    memcpy(raw + 2, raw_seed, 32);
    crc = nk_crc16(raw, NK_SEED_RAW - 2);
    raw[NK_SEED_RAW - 2] = (uint8_t)(crc & 0xff);
    raw[NK_SEED_RAW - 1] = (uint8_t)(crc >> 8);
    nk_b32_encode(raw, sizeof(raw), out);
    sodium_memzero(raw, sizeof(raw));
    return SW_OK;
}

sw_err
swt_nkey_public_from_file(const char *path, char out[SWT_NKEY_PUBLIC_LEN + 1])
{
    char buf[NK_FILE_MAX + 1];
    size_t n;
    sw_err rv = SW_EAUTH;
    FILE *f;
    if (path == NULL || out == NULL)
        return SW_EINVAL;
    out[0] = '\0';
    if ((f = fopen(path, "r")) == NULL)
        return SW_EAUTH;
    n = fread(buf, 1, NK_FILE_MAX, f);
    fclose(f);
    buf[n] = '\0';
    /* The first "SU" followed by 56 base32 characters: a bare seed file or
     * the seed block of a .creds file. */
    for (char *p = buf; (p = strstr(p, "SU")) != NULL; p++) {
        if (strspn(p, nk_b32) == NK_SEED_LEN && (p == buf || strchr(nk_b32, p[-1]) == NULL)) {
            char seed[NK_SEED_LEN + 1];
            memcpy(seed, p, NK_SEED_LEN);
            seed[NK_SEED_LEN] = '\0';
            rv = swt_nkey_user_public(seed, out);
            sodium_memzero(seed, sizeof(seed));
            break;
        }
    }
    sodium_memzero(buf, sizeof(buf));
    return rv;
}
