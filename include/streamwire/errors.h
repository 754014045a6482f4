/*
 * streamwire/errors.h -- the one error enum.
 *
 * Every fallible function returns an sw_err. SW_OK is 0. Each code has a stable
 * lowercase name (sw_err_name) that the CLI, logs and any gateway print, and a
 * human sentence (sw_strerror). Both are total: any int, including unknown
 * values and wrapped NATS statuses, yields a static string.
 *
 * Two groups share the enum:
 *   - API errors a call returns (invalid_argument, no_memory, ...);
 *   - stream error reasons a consumer sees in a terminal item
 *     (stream_incomplete, instance_lost, ...).
 * A NATS failure keeps its natsStatus: SW_ENATS_BASE | status. Use
 * sw_err_is_nats() and sw_err_nats_status() to take it apart.
 *
 * Rule (after libuv): when a function that takes a callback returns an error,
 * the callback is never called.
 */
#ifndef STREAMWIRE_ERRORS_H
#define STREAMWIRE_ERRORS_H

#include <streamwire/export.h>

#ifdef __cplusplus
extern "C" {
#endif

/* X(ENUM_SUFFIX, value, "stable_name", "human sentence")
 * Values are part of the wire format (Error.sw_code): never renumber. */
#define SW_ERR_MAP(X)                                                                            \
    X(OK, 0, "ok", "success")                                                                    \
    X(EINVAL, 1, "invalid_argument", "invalid argument")                                         \
    X(ENOMEM, 2, "no_memory", "out of memory")                                                   \
    X(ETIMEDOUT, 3, "timeout", "operation timed out")                                            \
    X(ECLOSED, 4, "closed", "object is closed")                                                  \
    X(ECANCELLED, 5, "cancelled", "operation cancelled")                                         \
    X(EMSGSIZE, 6, "payload_too_large", "payload exceeds the maximum size")                      \
    X(EPROTO, 7, "protocol_error", "protocol violation")                                         \
    X(ECRYPTO, 8, "crypto_error", "cryptographic operation failed")                              \
    X(ENATS, 9, "nats_error", "NATS client error")                                               \
    X(EAGAIN, 10, "would_block", "operation would block; try again")                             \
    X(EVERSION, 11, "unsupported_version", "unsupported protocol version")                       \
    X(ENOTFOUND, 12, "not_found", "no such object")                                              \
    X(EBUSY, 13, "busy", "resource busy or in the wrong state")                                  \
    X(EOVERLOADED, 14, "overloaded", "the instance is at its concurrency limit")                 \
    X(EEOF, 15, "end_of_stream", "end of stream: the terminal was delivered")                    \
    X(EINTERNAL, 16, "internal", "internal error")                                               \
    X(EEXIST, 17, "already_exists", "object already exists")                                     \
    X(ECONNECT, 18, "connection_failed", "could not connect to the NATS server")                 \
    X(EAUTH, 19, "not_authorized", "the NATS server refused the credentials")                    \
    X(ETLS, 20, "tls_error", "TLS set-up or handshake with the NATS server failed")              \
    X(EPERM, 21, "not_permitted", "the NATS server does not permit this for these credentials")  \
    X(STREAM_INCOMPLETE, 100, "stream_incomplete", "stream went silent before its final marker") \
    X(INSTANCE_LOST, 101, "instance_lost", "the serving instance was lost")                      \
    X(ITEM_AFTER_FINAL, 102, "item_after_final", "an item arrived after the final marker")       \
    X(DECODE_ERROR, 103, "decode_error", "a stream item did not decode")                         \
    X(SEQUENCE_GAP, 104, "sequence_gap", "a sequence gap could not be repaired")                 \
    X(NO_INSTANCES, 105, "no_instances", "no live instance serves the endpoint")                 \
    X(NO_RESPONDERS, 106, "no_responders", "nobody is subscribed to the request subject")        \
    X(DEADLINE_EXCEEDED, 107, "deadline_exceeded", "the request deadline passed")                \
    X(AUTH_FAILED, 108, "auth_failed", "authentication failed")                                  \
    X(FLOW_VIOLATION, 109, "flow_violation", "the worker sent beyond the credit it was granted")

typedef enum sw_err {
#define SW__ERR_ENUM(name, val, str, msg) SW_##name = val,
    SW_ERR_MAP(SW__ERR_ENUM)
#undef SW__ERR_ENUM
    /* A wrapped NATS status: SW_ENATS_BASE | natsStatus (natsStatus < 0x1000). */
    SW_ENATS_BASE = 0x10000
} sw_err;

/* Static human sentence for any value. Never NULL. Thread-safe. */
SW_API const char *sw_strerror(int err);

/* Static stable lowercase name ("instance_lost"). Unknown values give
 * "unknown_error"; wrapped NATS statuses give "nats_error". Never NULL. */
SW_API const char *sw_err_name(int err);

/* Parses a stable name back into its code. Returns SW_EINVAL for an unknown
 * name (and leaves *out untouched). */
SW_API sw_err sw_err_from_name(const char *name, sw_err *out);

/* 1 if err wraps a natsStatus, else 0. */
SW_API int sw_err_is_nats(int err);
/* The natsStatus wrapped in err (0 when not a NATS error). */
SW_API int sw_err_nats_status(int err);
/* Wraps a natsStatus (NATS_OK gives SW_OK). */
SW_API sw_err sw_err_from_nats(int nats_status);

/* 1 if err is one of the stream error reasons (the defined values of
 * 100..199; an undefined value in that range is not). */
SW_API int sw_err_is_stream_reason(int err);

#ifdef __cplusplus
}
#endif
#endif
