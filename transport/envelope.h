/* transport/envelope.h -- sealed envelopes of whole messages (issue 13): the
 * wiring of the sealing core (transport/seal.h) into the transport. A
 * connection with a cluster key seals every message it publishes on a
 * streamwire subject and opens every message it receives, before anything
 * above the transport sees it; docs/PROTOCOL.md "Security: sealing".
 *
 * On the wire a sealed message is a protobuf message of the same type with
 * only the clear fields
 *     1: version (1)   2: request_id (16 bytes, when the message has one)
 *    15: Sealed { 1: key_id, 3: nonce (24 bytes), 4: ciphertext }
 * and the ciphertext is the complete encoded message (request id, seq,
 * final flag, kinds and all), so the receiver acts only on authenticated
 * bytes. The associated data binds the direction and message type (from the
 * subject's family), the key id, the request id (also in the key), and the
 * subject itself: a sealed message opens only on the subject it was sealed
 * for (a request only at the instance it was sent to).
 *
 * Pure (no NATS); thread-safe: a sealer is read-only once made. */
#ifndef SW_TRANSPORT_ENVELOPE_H
#define SW_TRANSPORT_ENVELOPE_H

#include <stddef.h>
#include <stdint.h>

#include "transport/seal.h"

/* Bytes a sealed envelope adds to a message of up to 2^28 bytes: version
 * (2), request id (18), the Sealed field's tag and length (1 + 4), key id
 * (6), nonce (2 + 24), ciphertext tag and length (1 + 4) and the AEAD tag
 * (16). */
#define SWT_ENV_OVERHEAD 78

/* A connection's keys: the cluster key (seals and opens) and the derived
 * instance-wide keys; during a key rotation also a second key that only
 * opens (docs/PROTOCOL.md "Rotation"). */
typedef struct swt_sealer swt_sealer;

/* Loads the key file (swt_seal_key_load's rules and errors; *why explains)
 * and, when open_key_file is not NULL, the second key, which opens but never
 * seals. Two keys with one key id (the same key twice, or a 32-bit id
 * collision) are SW_EINVAL: a receiver picks the key by its id. */
sw_err swt_sealer_load(swt_sealer **out, const char *key_file, const char *open_key_file, char *why,
                       size_t why_len);
/* From a key (tests). */
sw_err swt_sealer_from_key(swt_sealer **out, const swt_seal_key *key);
/* From a sealing key and a second key that only opens (NULL: none).
 * SW_EINVAL if their ids are equal. */
sw_err swt_sealer_from_keys(swt_sealer **out, const swt_seal_key *key,
                            const swt_seal_key *open_key);
/* Wipes every key and frees. NULL ok. */
void swt_sealer_free(swt_sealer *s);
uint32_t swt_sealer_key_id(const swt_sealer *s);

/* What a subject's family says of the messages on it. */
typedef struct swt_env_class {
    int to_worker;    /* frontend -> worker (else worker -> frontend) */
    uint8_t msg_type; /* swt_seal_msg */
} swt_env_class;
void swt_env_classify(const char *subject, swt_env_class *out);

/* 1 if buf is a sealed envelope, 0 if not: a top-level field 15 of length
 * type among its first three fields (a sealer writes version, the request
 * id if any, then field 15), so every message is looked at in at most three
 * fields, whatever its length. Never reads past len. Malformed bytes are 0
 * (the message's own decoder then refuses them); so is a field 15 further
 * on, which no sealer writes (an unsealed decoder skips it as protobuf-c
 * does, and swt_env_open refuses anything but the envelope's own fields). */
int swt_env_is_sealed(const uint8_t *buf, size_t len);

/* Seals msg (a complete encoded message) for subject into out (out_cap >= len
 * + SWT_ENV_OVERHEAD). SW_OK, SW_EMSGSIZE, SW_EINVAL (also: a request, item
 * or control that is not a well-formed protobuf message), SW_ECRYPTO. */
sw_err swt_env_seal(const swt_sealer *s, const char *subject, const uint8_t *msg, size_t len,
                    uint8_t *out, size_t out_cap, size_t *out_len);

/* Opens a sealed envelope received on subject into pt (pt_cap >= len is
 * always enough). Every failure -- not an envelope, malformed, unknown key,
 * a tag that does not verify, a plaintext whose request id is not the
 * envelope's -- is SW_AUTH_FAILED with *pt_len 0. */
sw_err swt_env_open(const swt_sealer *s, const char *subject, const uint8_t *buf, size_t len,
                    uint8_t *pt, size_t pt_cap, size_t *pt_len);

/* The same for registry values (instance entries and tombstones) under
 * their registry key: sealed with the registry key, bound to the key, so an
 * entry opens only under its own key, and only a key holder can write one
 * that opens. */
sw_err swt_env_seal_kv(const swt_sealer *s, const char *key, const uint8_t *msg, size_t len,
                       uint8_t *out, size_t out_cap, size_t *out_len);
sw_err swt_env_open_kv(const swt_sealer *s, const char *key, const uint8_t *buf, size_t len,
                       uint8_t *pt, size_t pt_cap, size_t *pt_len);

#endif
