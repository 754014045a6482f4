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

#include "common/sw_common.h"
#include "proto/pb_read.h"
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
typedef Streamwire__V1__BatchedItem swp_batched;
typedef Streamwire__V1__HeartbeatBatch swp_beats;
typedef Streamwire__V1__StreamBeat swp_beat;

#define SWP_MAX_WINDOW (1u << 20)
#define SWP_MAX_HEARTBEAT_MS 3600000u
/* A worker beats a stream at least this often: it clamps a request's
 * heartbeat_ms and idle_heartbeat_ms to it (PROTOCOL.md, bounds). */
#define SWP_BEAT_MAX_MS 10000u
/* Most items one StreamItemWrapper may carry in `batch` (the worker sends at
 * most 128). Checked on the raw bytes before unpacking, so a hostile message
 * cannot make the decoder allocate a struct per 2 bytes of input. */
#define SWP_MAX_BATCH 256
/* Most beats one HeartbeatBatch may carry (also checked before unpacking). */
#define SWP_MAX_BEATS 4096
/* Most request ids one ACK_FINALS control may carry. */
#define SWP_MAX_FINAL_ACKS 256
/* Request.headers (and InstanceInfo.labels): at most this many entries,
 * keys and values at most these many bytes. */
#define SWP_MAX_HEADERS 64
#define SWP_MAX_HEADER_KEY 128
#define SWP_MAX_HEADER_VALUE 4096
/* Unknown fields one (sub-)message may carry. */
#define SWP_MAX_UNKNOWN 64
/* The decoders' allocation bound: before unpacking, every decoder estimates
 * from the raw bytes what protobuf-c would allocate and refuses (SW_EPROTO)
 * a message that would take more than SWP_ALLOC_FACTOR x its size +
 * SWP_ALLOC_SLACK bytes of heap. It also refuses a non-repeated field that
 * occurs more than 4 times, more than SWP_MAX_UNKNOWN unknown fields in one message, and
 * more entries in a repeated field than its cap. The factor is what the
 * densest legitimate message needs. Protobuf-c keeps a 32-byte scan record
 * per field and a struct per sub-message; where that is more than 4x, the
 * count is capped (the caps above) so that it fits in the slack. The one
 * message dense by design, the HeartbeatBatch of up to 4,096 22-byte beats
 * (7.6x through protobuf-c), is decoded by hand into one block of at most
 * 3.6x (proto/beats.c). */
#define SWP_ALLOC_FACTOR 4
#define SWP_ALLOC_SLACK (64 * 1024)
/* The estimate itself (SIZE_MAX if a cap refuses it), for tests. */
size_t swp_alloc_estimate(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len);
/* The unpack every decoder runs (length cap, allocation bound, field-0
 * check), with a caller's allocator (NULL: malloc); no validation. For
 * tests that measure what a decode allocates. */
sw_err swp_unpack(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len, size_t max,
                  ProtobufCAllocator *alloc, ProtobufCMessage **out);
/* The longest subject we build: sw.req.<endpoint>.<instance>. */
#define SWP_MAX_SUBJECT (7 + SW_MAX_ENDPOINT + 1 + SW_MAX_TOKEN)

sw_err swp_decode_request(const uint8_t *buf, size_t len, size_t max, swp_request **out);
sw_err swp_decode_item(const uint8_t *buf, size_t len, size_t max, swp_item **out);
sw_err swp_decode_control(const uint8_t *buf, size_t len, size_t max, swp_control **out);
sw_err swp_decode_probe_reply(const uint8_t *buf, size_t len, size_t max, swp_probe_reply **out);
sw_err swp_decode_instance(const uint8_t *buf, size_t len, size_t max, swp_instance **out);
/* By hand (proto/beats.c): the same rules and result as the others, in one
 * block of at most 3.6x len + a constant; a batch with field 15 (sealed:
 * not opened) is refused. swp_free frees it. */
sw_err swp_decode_beats(const uint8_t *buf, size_t len, size_t max, swp_beats **out);
/* The probe_id a ProbeReply echoes; 0 if the bytes are not a valid
 * ProbeReply of at most SWP_MAX_PROBE_REPLY bytes. */
#define SWP_MAX_PROBE_REPLY 4096
uint64_t swp_probe_reply_id(const uint8_t *buf, size_t len);

/* Frees any decoded message (a HeartbeatBatch from swp_decode_beats is
 * one block; only swp_free knows that). NULL ok. */
void swp_free(void *msg);

/* Hot-path decoding of a StreamItemWrapper (the frontend's every message),
 * into a caller's arena (typically on the stack) and at most one malloc'd
 * block for what does not fit. Same result as swp_decode_item (error for
 * error, value for value), with one difference: the `bytes` fields of a
 * message in the form our encoders write (proto/items.c) point into buf
 * instead of copies, so the message is valid only while both buf and the
 * arena are. Other messages go through protobuf-c. Free with
 * swp_free_arena; the arena serves one message at a time. */
#define SWP_ARENA_BYTES 24576 /* a full batch decoded in one pass fits (proto/items.c) */
typedef struct swp_arena {
    ProtobufCAllocator alloc;
    size_t used;
    void *block; /* decoded by hand: the block beyond the arena, or NULL */
    int hand;    /* decoded by hand (else protobuf-c, with alloc) */
    _Alignas(16) uint8_t buf[SWP_ARENA_BYTES];
} swp_arena;
sw_err swp_decode_item_arena(const uint8_t *buf, size_t len, size_t max, swp_arena *arena,
                             swp_item **out);
/* The same for a Request (the worker's every stream): swp_decode_request's
 * result, with request_id, payload and auth_token pointing into buf when
 * the message is in our encoder's form. Free with swp_free_arena. */
sw_err swp_decode_request_arena(const uint8_t *buf, size_t len, size_t max, swp_arena *arena,
                                swp_request **out);
void swp_free_arena(void *msg, swp_arena *arena);

/* Packs msg into buf[cap]; *len gets the size. SW_EMSGSIZE if it does not
 * fit (nothing useful in buf then). */
sw_err swp_encode(const void *msg, uint8_t *buf, size_t cap, size_t *len);
/* Packs into a fresh malloc'd buffer (*out, caller frees) if the packed size
 * is <= max; SW_EMSGSIZE otherwise, SW_ENOMEM. */
sw_err swp_encode_alloc(const void *msg, size_t max, uint8_t **out, size_t *len);
size_t swp_encoded_size(const void *msg);

/* ---- Hand-written pieces of a StreamItemWrapper (the worker's hot path).
 *
 * A wrapper on the wire is a header (version, request_id, and optionally
 * instance_id, credit_window, credit_window_max, credit_bytes, resent)
 * followed by the first item's body
 * (seq, data or the final's complete_final + terminal, droppable) and, for a
 * batch, one `batch` entry (swp_batch_prefix + body) per further item.
 * Protobuf fields may come in any order, so header ++ body is a valid
 * wrapper and the same body bytes serve in both places; the decoder above
 * reads all of it. Tests check these bytes against protobuf-c's. */
typedef struct swp_hdr {
    const uint8_t *request_id; /* SW_REQUEST_ID_BYTES */
    const char *instance_id;   /* NULL or "" = not sent */
    uint32_t credit_window;    /* 0 = not sent */
    int resent;
    uint32_t credit_window_max; /* 0 = not sent */
    uint64_t credit_bytes;      /* 0 = not sent */
} swp_hdr;

/* Upper bound of swp_hdr_write for any header. */
#define SWP_HDR_MAX (2 + 2 + SW_REQUEST_ID_BYTES + 2 + SW_MAX_TOKEN + 6 + 6 + 12 + 2)
/* Upper bound of swp_batch_prefix. */
#define SWP_PREFIX_MAX 11

size_t swp_hdr_write(const swp_hdr *h, uint8_t *out);
/* Size of a data item's body; event_len 0 = an untyped item. */
size_t swp_data_body_size(uint64_t seq, size_t len, int droppable, size_t event_len);
/* Writes a data body (swp_data_body_size bytes) and returns its size. The
 * data field is always present, even when empty (it selects the oneof).
 * event[0..event_len) must satisfy swp_valid_event (or event_len be 0). */
size_t swp_data_body_write(uint8_t *out, uint64_t seq, const void *data, size_t len, int droppable,
                           const char *event, size_t event_len);
/* 1 if s[0..n) is a valid item event name: 1..SW_MAX_EVENT characters of
 * [A-Za-z0-9._:-]. Every decoder refuses (SW_EPROTO) an item whose event
 * is not, or that is typed but is not a data item. */
int swp_valid_event(const char *s, size_t n);
/* Packs a final's body (seq, complete_final, terminal) if it is <= max
 * bytes: into buf (cap bytes; *out = buf) when it fits there, else into a
 * fresh malloc'd *out: SW_OK, SW_EMSGSIZE, SW_ENOMEM (*out NULL). */
sw_err swp_final_body(uint64_t seq, const swp_terminal *t, size_t max, uint8_t *buf, size_t cap,
                      uint8_t **out, size_t *len);
/* The same, always into a fresh malloc'd buffer. */
sw_err swp_final_body_alloc(uint64_t seq, const swp_terminal *t, size_t max, uint8_t **out,
                            size_t *len);
/* Packs a Request, as the frontend builds one (no `sealed`, no unknown
 * fields: SW_EINVAL otherwise), byte for byte as swp_encode_alloc would,
 * without protobuf-c's descriptor walk: SW_OK, SW_EMSGSIZE (over max),
 * SW_ENOMEM. The caller frees *out. */
sw_err swp_request_encode_alloc(const swp_request *m, size_t max, uint8_t **out, size_t *len);
/* Protobuf base-128 varints: the bytes v takes (1..10), writing them, and
 * reading one at p[*i] (advancing *i; 0 ok, -1 truncated or longer than
 * 64 bits). */
size_t swp_varint_size(uint64_t v);
size_t swp_varint_write(uint8_t *out, uint64_t v);
static inline int
swp_read_varint(const uint8_t *p, size_t len, size_t *i, uint64_t *v)
{
    return pb_rd_varint(p, len, i, v);
}
/* Writes the tag and length that put a body of body_len bytes into `batch`. */
size_t swp_batch_prefix(uint8_t *out, size_t body_len);

/* A worker's HeartbeatBatch, written by hand (a timer tick writes one beat
 * per idle stream: 20,000 a second at 10,000 streams): version,
 * instance_id (a token of at most SW_MAX_TOKEN characters, "" or NULL = not
 * sent; a longer string is cut there), n beats (ids[i], last[i]),
 * incarnation and counter (0 = not sent), byte for byte what protobuf-c
 * packs from the same values (test_codec_hand compares them).
 * swp_beats_write writes at most SWP_BEATS_MAX(n) bytes and returns how
 * many. */
#define SWP_BEAT_MAX (2 + 2 + SW_REQUEST_ID_BYTES + 1 + 10)
#define SWP_BEATS_MAX(n) (2 + 2 + SW_MAX_TOKEN + 2 * 11 + (size_t)(n)*SWP_BEAT_MAX)
size_t swp_beats_write(uint8_t *out, const char *instance_id, uint64_t incarnation,
                       uint64_t counter, const uint8_t (*ids)[SW_REQUEST_ID_BYTES],
                       const uint64_t *last, size_t n);

/* A NATS subject we publish to: 1..SWP_MAX_SUBJECT chars, non-empty tokens, no spaces
 * or control characters, no wildcards. 1 if valid. */
int swp_valid_subject(const char *s);

#endif
