/* proto/sw_codec.h -- bounded, validating encode/decode of every wire message.
 *
 * Every decoder:
 *   - rejects input longer than `max` with SW_EMSGSIZE before unpacking
 *     (protobuf_c_message_unpack has no limit of its own);
 *   - returns SW_EPROTO for bytes that do not unpack or miss required fields,
 *     SW_EVERSION for a version other than SW_PROTOCOL_VERSION;
 *   - on failure leaves *out NULL and allocates nothing that escapes.
 * On success the caller owns *out and frees it with swp_free().
 * Unknown fields are accepted and ignored. */
#ifndef SW_CODEC_H
#define SW_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "proto/streamwire.pb-c.h"
#include <streamwire/streamwire.h>

typedef Streamwire__V1__Request swp_request;
typedef Streamwire__V1__StreamItemWrapper swp_item;
typedef Streamwire__V1__Control swp_control;
typedef Streamwire__V1__ProbeReply swp_probe_reply;
typedef Streamwire__V1__InstanceInfo swp_instance;
typedef Streamwire__V1__Terminal swp_terminal;
typedef Streamwire__V1__Error swp_error;
typedef Streamwire__V1__Heartbeat swp_heartbeat;

#define SWP_MAX_WINDOW (1u << 20)
#define SWP_MAX_HEARTBEAT_MS 3600000u
/* The longest subject we build: sw.req.<endpoint>.<instance>. */
#define SWP_MAX_SUBJECT (7 + SW_MAX_ENDPOINT + 1 + SW_MAX_TOKEN)

sw_err swp_decode_request(const uint8_t *buf, size_t len, size_t max, swp_request **out);
sw_err swp_decode_item(const uint8_t *buf, size_t len, size_t max, swp_item **out);
sw_err swp_decode_control(const uint8_t *buf, size_t len, size_t max, swp_control **out);
sw_err swp_decode_probe_reply(const uint8_t *buf, size_t len, size_t max, swp_probe_reply **out);
sw_err swp_decode_instance(const uint8_t *buf, size_t len, size_t max, swp_instance **out);

/* Frees any decoded message. NULL ok. */
void swp_free(void *msg);

/* Hot-path decoding without malloc: the message is unpacked into a caller's
 * arena (typically on the stack), falling back to malloc for what does not
 * fit. Same bounds and validation as swp_decode_item. The message lives
 * until swp_free_arena; the arena must outlive it and serves one message. */
#define SWP_ARENA_BYTES 2048
typedef struct swp_arena {
    ProtobufCAllocator alloc;
    size_t used;
    _Alignas(16) uint8_t buf[SWP_ARENA_BYTES];
} swp_arena;
sw_err swp_decode_item_arena(const uint8_t *buf, size_t len, size_t max, swp_arena *arena,
                             swp_item **out);
void swp_free_arena(void *msg, swp_arena *arena);

/* Packs msg into buf[cap]; *len gets the size. SW_EMSGSIZE if it does not
 * fit (nothing useful in buf then). */
sw_err swp_encode(const void *msg, uint8_t *buf, size_t cap, size_t *len);
/* Packs into a fresh malloc'd buffer (*out, caller frees) if the packed size
 * is <= max; SW_EMSGSIZE otherwise, SW_ENOMEM. */
sw_err swp_encode_alloc(const void *msg, size_t max, uint8_t **out, size_t *len);
size_t swp_encoded_size(const void *msg);

/* A NATS subject we publish to: 1..SWP_MAX_SUBJECT chars, non-empty tokens, no spaces
 * or control characters, no wildcards. 1 if valid. */
int swp_valid_subject(const char *s);

#endif
