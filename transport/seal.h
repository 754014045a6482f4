/* transport/seal.h -- the sealing core (issue 13): cluster keys, derived
 * per-stream / per-direction keys, and AEAD seal/open with associated data
 * that binds a message to its stream, direction, position and kind.
 * docs/PROTOCOL.md "Security: sealing" is the design.
 *
 * Pure: no NATS, no I/O except reading a key file (swt_seal_key_load).
 * Locks and threads: none, except that the nonce counter is one process-wide
 * atomic (and a pthread_once for its salt); every function may be called
 * from any thread. Keys are read-only once made, so one key may be used by
 * many threads at once. Every key is wiped by its owner with
 * swt_seal_key_wipe / swt_seal_subkey_wipe. Not wired into ingress/egress
 * yet. */
#ifndef SW_TRANSPORT_SEAL_H
#define SW_TRANSPORT_SEAL_H

#include <stddef.h>
#include <stdint.h>

#include <streamwire/errors.h>

#define SWT_SEAL_KEY_BYTES 32
#define SWT_SEAL_KEY_HEX 64 /* characters of a key line in a key file */
#define SWT_SEAL_NONCE_BYTES 24
#define SWT_SEAL_TAG_BYTES 16
/* Sealed material per message: nonce + tag (the ciphertext is the plaintext
 * length + the tag). The protobuf framing of Sealed adds at most
 * SWT_SEAL_FRAMING more. */
#define SWT_SEAL_OVERHEAD (SWT_SEAL_NONCE_BYTES + SWT_SEAL_TAG_BYTES)
#define SWT_SEAL_FRAMING 12
#define SWT_SEAL_RID_BYTES 16
#define SWT_SEAL_CONTEXT_MAX 256
/* Largest plaintext swt_seal accepts (a sanity bound, far above the codec's). */
#define SWT_SEAL_MAX_PLAINTEXT (64u * 1024u * 1024u)
#define SWT_SEAL_WHY_MAX 256 /* a key-loading error message */

/* A cluster key and its public id (Sealed.key_id). */
typedef struct swt_seal_key {
    uint8_t k[SWT_SEAL_KEY_BYTES];
    uint32_t id;
} swt_seal_key;

/* Which key a message is sealed under: the direction, and whether it is
 * per stream (bound to a request id) or instance-wide. Values are part of
 * the key derivation and the associated data: never renumber. */
typedef enum swt_seal_scope {
    SWT_SEAL_STREAM_F2W = 1, /* request; controls for one stream */
    SWT_SEAL_STREAM_W2F = 2, /* items, finals, heartbeat wrappers, stream probe replies */
    SWT_SEAL_INST_F2W = 3,   /* ACK_FINALS, instance-wide probes, routers' probe answers */
    SWT_SEAL_INST_W2F = 4,   /* heartbeat batches, instance-wide probe replies */
    SWT_SEAL_REGISTRY = 5,   /* registry entries */
    SWT_SEAL_DEAD = 6        /* dead reports */
} swt_seal_scope;

/* Message types bound in the associated data (never renumber). */
typedef enum swt_seal_msg {
    SWT_SEAL_MSG_REQUEST = 1,
    SWT_SEAL_MSG_ITEM = 2,
    SWT_SEAL_MSG_HEARTBEAT = 3,
    SWT_SEAL_MSG_CONTROL = 4,
    SWT_SEAL_MSG_PROBE = 5,
    SWT_SEAL_MSG_PROBE_REPLY = 6,
    SWT_SEAL_MSG_HEARTBEAT_BATCH = 7,
    SWT_SEAL_MSG_INSTANCE_INFO = 8,
    SWT_SEAL_MSG_DEAD_REPORT = 9
} swt_seal_msg;

/* A derived key: one stream and direction, or one instance-wide scope.
 * Derive once, keep with the stream, wipe when it ends. */
typedef struct swt_seal_subkey {
    uint8_t k[SWT_SEAL_KEY_BYTES];
    uint8_t rid[SWT_SEAL_RID_BYTES]; /* zeros for instance-wide scopes */
    uint32_t key_id;                 /* the cluster key's id */
    uint8_t scope;                   /* swt_seal_scope */
} swt_seal_subkey;

/* The clear fields a sealed message is bound to (besides the subkey's
 * scope, request id and key id, which the core adds itself). */
typedef struct swt_seal_ad {
    uint8_t msg_type;    /* swt_seal_msg */
    uint8_t kind;        /* item kind or control kind; 0 if none */
    uint8_t final;       /* 0 or 1 */
    uint64_t seq;        /* sequence number; 0 if none */
    const char *context; /* the subject (or registry key); may be NULL with context_len 0 */
    size_t context_len;  /* <= SWT_SEAL_CONTEXT_MAX */
} swt_seal_ad;

/* Loads a cluster key file: '#' lines and blank lines ignored, exactly one
 * line of 64 hex digits, at most 4 KiB, a regular file not accessible by
 * group or others. Returns SW_OK, SW_ENOTFOUND (missing), SW_EPERM (mode),
 * SW_EINVAL (anything else). On failure *out is zeroed and why (when not
 * NULL) holds a one-line explanation naming the path (never key bytes).
 * The read buffer is wiped. Needs swi_init() (libsodium). */
sw_err swt_seal_key_load(const char *path, swt_seal_key *out, char *why, size_t why_len);

/* A new random cluster key. SW_OK or SW_ECRYPTO (libsodium unavailable). */
sw_err swt_seal_key_generate(swt_seal_key *out);

/* A cluster key from 32 raw bytes (computes its id). */
sw_err swt_seal_key_from_bytes(const uint8_t raw[SWT_SEAL_KEY_BYTES], swt_seal_key *out);

/* The key as the key file's key line: 64 lowercase hex digits + NUL. The
 * caller wipes hex after writing it. */
void swt_seal_key_hex(const swt_seal_key *key, char hex[SWT_SEAL_KEY_HEX + 1]);

/* sodium_memzero of the whole key. NULL is a no-op. */
void swt_seal_key_wipe(swt_seal_key *key);

/* Derives the key for scope and request id (rid: 16 bytes, required for
 * the two STREAM scopes, must be NULL for the others). SW_OK or SW_EINVAL. */
sw_err swt_seal_derive(const swt_seal_key *key, swt_seal_scope scope,
                       const uint8_t rid[SWT_SEAL_RID_BYTES], swt_seal_subkey *out);

void swt_seal_subkey_wipe(swt_seal_subkey *sub);

/* Seals pt (pt_len may be 0; pt may be NULL then) under sub, bound to ad.
 * Writes the 24-byte nonce to nonce and pt_len + 16 bytes to ct (ct_cap
 * at least that, else SW_EMSGSIZE and nothing written). SW_OK, SW_EINVAL
 * (bad ad), SW_EMSGSIZE, SW_ECRYPTO (nonce counter exhausted). */
sw_err swt_seal(const swt_seal_subkey *sub, const swt_seal_ad *ad, const void *pt, size_t pt_len,
                uint8_t nonce[SWT_SEAL_NONCE_BYTES], uint8_t *ct, size_t ct_cap, size_t *ct_len);

/* Opens what swt_seal made. key_id is Sealed.key_id as received. Writes
 * ct_len - 16 bytes to pt (pt_cap at least that; a smaller buffer, or a
 * ciphertext over SWT_SEAL_MAX_PLAINTEXT + 16, is SW_EMSGSIZE before
 * anything is decrypted). Every authentication failure -- key id, nonce
 * length, short ciphertext, bad tag, bad ad -- is the one SW_AUTH_FAILED,
 * and then pt is zeroed and *pt_len is 0. */
sw_err swt_open(const swt_seal_subkey *sub, uint32_t key_id, const swt_seal_ad *ad,
                const uint8_t *nonce, size_t nonce_len, const uint8_t *ct, size_t ct_len,
                uint8_t *pt, size_t pt_cap, size_t *pt_len);

/* Test hook: how many nonces this process has used (the counter). */
uint64_t swt_seal_nonces_used(void);

#endif
