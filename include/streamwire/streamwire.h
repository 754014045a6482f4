/*
 * streamwire/streamwire.h -- response streams between frontends and workers
 * over NATS, with exactly one typed terminal per stream.
 *
 * Layers (each a handle type, created and destroyed in pairs):
 *
 *   sw_conn      one NATS connection (transport). Shared by everything below.
 *   sw_ingress   the worker side: serves one endpoint, runs a handler per
 *                request on a bounded thread pool, hands it a sw_responder.
 *   sw_router    the frontend side: opens sw_streams to instances through one
 *                wildcard response subscription.
 *   sw_stream    one request's response stream: data items in order, then
 *                exactly one terminal item.
 *
 * Conventions (all functions):
 *   - Out-parameter first, sw_err returned; SW_OK is 0.
 *   - Options are plain structs: call the *_opts_init() function, then set
 *     fields. Zero means "default". Options are copied at create time; the
 *     caller may free or change them afterwards.
 *   - Destroy/close functions accept NULL.
 *   - Strings passed in are copied unless stated otherwise.
 *   - The library never prints. It reports through the sw_log_fn in the
 *     options (NULL = silent) and through the *_stats() counters.
 *   - A user callback is never called with a library lock held.
 *   - When a function that takes a callback returns an error, the callback is
 *     never called.
 */
#ifndef STREAMWIRE_H
#define STREAMWIRE_H

#include <stddef.h>
#include <stdint.h>

#include <streamwire/errors.h>
#include <streamwire/export.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SW_VERSION_MAJOR 0
#define SW_VERSION_MINOR 1
#define SW_VERSION_PATCH 0
#define SW_PROTOCOL_VERSION 1

/* Library version string, "0.1.0". */
SW_API const char *sw_version(void);

/* ------------------------------------------------------------------------ */
/* Logging                                                                   */

typedef enum sw_log_level {
    SW_LOG_ERROR = 0,
    SW_LOG_WARN = 1,
    SW_LOG_INFO = 2,
    SW_LOG_DEBUG = 3
} sw_log_level;

/* Log sink. Called from library threads, possibly concurrently; msg is valid
 * only during the call. Must not call back into the object that logs. */
typedef void (*sw_log_fn)(void *arg, sw_log_level level, const char *msg);

/* "error", "warn", "info", "debug". */
SW_API const char *sw_log_level_name(sw_log_level level);

/* ------------------------------------------------------------------------ */
/* Names                                                                     */

/* Maximum length of one name token (instance id, router id, endpoint part). */
#define SW_MAX_TOKEN 64
/* Maximum length of an endpoint "ns.component.endpoint". */
#define SW_MAX_ENDPOINT (3 * SW_MAX_TOKEN + 2)
/* Maximum length of an item's event name (sw_responder_send_event). */
#define SW_MAX_EVENT 64

/* Checks one subject token: 1..64 chars of [A-Za-z0-9_-]. No dots, no
 * wildcards, no spaces. Returns SW_OK or SW_EINVAL. NULL gives SW_EINVAL. */
SW_API sw_err sw_validate_token(const char *token);

/* Checks an endpoint: exactly three valid tokens joined by '.'.
 * Returns SW_OK or SW_EINVAL. */
SW_API sw_err sw_validate_endpoint(const char *endpoint);

/* ------------------------------------------------------------------------ */
/* Connection (transport)                                                    */

/* Every duration in an options struct has this one type, with its unit in
 * the field's name (_ms, or _us for coalesce_us). 0 selects the stated
 * default; a negative value is SW_EINVAL unless stated otherwise. */
typedef int64_t sw_duration;

typedef struct sw_conn sw_conn;

/* The state of a connection. */
typedef enum sw_conn_state {
    SW_CONN_CONNECTED = 1,    /* up */
    SW_CONN_RECONNECTING = 2, /* the server is lost; nats.c reconnects (max_reconnect) */
    SW_CONN_CLOSED = 3        /* for good: closed by sw_conn_close, or reconnects ran out */
} sw_conn_state;

/* "connected", "reconnecting", "closed"; "unknown" for anything else. */
SW_API const char *sw_conn_state_name(int state);

/* Called on every change of state, on a nats.c thread, with no library lock
 * held; it must not call sw_conn_close (of any connection). */
typedef void (*sw_conn_state_fn)(sw_conn *conn, sw_conn_state state, void *arg);

typedef struct sw_conn_opts {
    const char *url;                /* default "nats://127.0.0.1:4222"; comma list allowed */
    const char *name;               /* connection name shown by the server; default "streamwire" */
    sw_duration connect_timeout_ms; /* default 2000 */
    int max_reconnect;              /* default 60 (also what 0 means); -1 = forever;
                                       SW_RECONNECT_NONE: none, a lost server closes the
                                       connection at once (SW_CONN_CLOSED, no reconnecting) */
    sw_duration reconnect_wait_ms;  /* default 250 */
    int no_send_asap;               /* 0 (default): flush every publish at once (lowest latency).
                                       1: nats.c's flusher writes what was published up to 1 ms
                                       later, in fewer writes: more streams/s when many short
                                       streams run at once (BENCHMARKS.md), 1-2 ms more per
                                       stream when few do; a worker's streams then coalesce
                                       from their first item (docs/PROTOCOL.md) */
    const char *user;               /* optional credentials */
    const char *password;
    const char *token;
    sw_log_fn log; /* connection events (disconnect, reconnect) */
    void *log_arg;
    sw_conn_state_fn on_state; /* optional: every change of state (see above) */
    void *on_state_arg;
    /* Authentication beyond user/password/token (all optional; nats.c's own
     * mechanisms, docs/SECURITY.md). At most one of creds_file and
     * nkey_seed_file. */
    const char *creds_file;     /* user JWT + nkey seed (a .creds file), decentralised auth */
    const char *nkey_seed_file; /* a user nkey seed file ("SU..."); the public key is derived */
    const char *inbox_prefix;   /* reply subjects (JetStream API, registry) start with this
                                   instead of "_INBOX", so permissions can confine them
                                   (at most 295 bytes: SW_EINVAL) */
    /* TLS. Any of the files, or tls = 1, turns TLS on; a tls:// URL does too. */
    int tls;
    const char *tls_ca_file;   /* PEM CA(s) the server's certificate must chain to */
    const char *tls_cert_file; /* client certificate (PEM), with tls_key_file */
    const char *tls_key_file;
    int tls_skip_verify;            /* do not verify the server's certificate: tests only */
    const char *seal_key_file;      /* a cluster key (streamwire keygen): every message this
                                       connection publishes is sealed and every message it receives
                                       must open (docs/PROTOCOL.md "Security: sealing"); NULL = off.
                                       The file must be a regular file with no group or other
                                       permission bits (mode & 077 == 0: 0600, 0400, 0700),
                                       owned by this user (euid) or root, else sw_conn_open fails
                                       with not_permitted, not_found or invalid_argument, and logs
                                       why. */
    const char *seal_open_key_file; /* a second cluster key that opens what it sealed but never
                                       seals: for a key rotation (docs/PROTOCOL.md "Rotation").
                                       Needs seal_key_file, the same file rules, and a key id
                                       other than seal_key_file's (else invalid_argument). */
} sw_conn_opts;

/* sw_conn_opts.max_reconnect: no reconnect attempt at all. */
#define SW_RECONNECT_NONE (-2)

SW_API void sw_conn_opts_init(sw_conn_opts *opts);

/* Connects. On success *out owns a connection; destroy it with sw_conn_close.
 * Errors: SW_EINVAL (NULL out/opts, a URL list that names no server (empty,
 * or blanks and commas only; blanks around a URL are dropped) or is 2 KiB
 * or longer, both creds_file and nkey_seed_file, a TLS key file without a
 * certificate or the reverse, a
 * seal_open_key_file without a seal_key_file or with the same key id, a
 * cluster key file that does not parse), SW_EPERM / SW_ENOTFOUND (a cluster
 * key file's mode or absence), SW_ECONNECT (no server
 * reachable), SW_EAUTH (the server refused the credentials, or a creds or
 * nkey file could not be read or parsed; with a creds or nkey file a refused
 * connect is made up to 4 times, since nats.c 3.4.1 leaves the signature
 * out of 1 connect in 256), SW_ETLS (TLS required by the
 * server but not set here, TLS set here and the server has none, a
 * certificate file that does not load, or a failed handshake), SW_ENOMEM,
 * or a wrapped NATS status. Thread-safe. */
SW_API SW_NODISCARD sw_err sw_conn_open(sw_conn **out, const sw_conn_opts *opts);

/* Closes the NATS connection and gives up the handle; NULL is a no-op. Close
 * the objects created on it (sw_ingress, sw_router, sw_registry) first. One
 * still open keeps the memory they share until it is destroyed, so closing
 * in the other order is safe, not a use after free. From the close on
 * nothing more arrives and nothing published reaches anyone; within about
 * 35 ms (as when nats.c runs out of reconnects) a router ends its open
 * streams with SW_STATUS_ERROR / SW_ECLOSED and refuses new ones
 * (sw_router_open: SW_ECLOSED), and an ingress cancels its running streams
 * as if their frontends were gone (sw_responder_send: SW_ECANCELLED, and
 * the cancel callback runs). Before that a send may still return SW_OK or
 * a NATS error. A sw_metrics source must still be removed first
 * (metrics.h). Not from the callback of any connection (nats.c runs them
 * all on one thread). */
SW_API void sw_conn_close(sw_conn *conn);

/* The connection's state now. Thread-safe. An application that must not
 * run without NATS (a worker in a cluster) watches for SW_CONN_CLOSED here
 * or in on_state: no call reports it otherwise (a router's open streams
 * end with SW_ECLOSED), and nothing reconnects a closed connection. */
SW_API sw_conn_state sw_conn_status(sw_conn *conn);

/* Reconnections since sw_conn_open. Thread-safe. */
SW_API uint64_t sw_conn_reconnects(sw_conn *conn);

/* The largest message the library will publish, in bytes: the server's max
 * payload, less the sealed envelope (78 bytes) when the connection seals.
 * While the connection reconnects, and after it closed, the last server's
 * (a value, never 0, for a connection that was ever up); 0 for NULL.
 * Thread-safe. */
SW_API size_t sw_conn_max_payload(sw_conn *conn);

/* 1 if the connection seals (sw_conn_opts.seal_key_file). */
SW_API int sw_conn_sealed(const sw_conn *conn);

/* The underlying natsConnection* for advanced use (registry backends, custom
 * subscriptions). Owned by conn; valid until sw_conn_close. */
SW_API void *sw_conn_nats(sw_conn *conn);

/* ------------------------------------------------------------------------ */
/* Terminal status                                                           */

typedef enum sw_status {
    SW_STATUS_COMPLETED = 1,  /* the handler finished normally ("stop") */
    SW_STATUS_INCOMPLETE = 2, /* finished early for a reason ("max_tokens") */
    SW_STATUS_FAILED = 3,     /* the handler failed with an application code */
    SW_STATUS_CANCELLED = 4,  /* cancelled by the frontend */
    SW_STATUS_ERROR = 5       /* a streamwire error; see sw_terminal.error */
} sw_status;

/* "completed", "incomplete", "failed", "cancelled", "error"; "unknown" for
 * anything else. */
SW_API const char *sw_status_name(int status);

/* ------------------------------------------------------------------------ */
/* Ingress (worker side)                                                     */

typedef struct sw_ingress sw_ingress;
typedef struct sw_responder sw_responder;

/* Handler for one request. Runs on one of the ingress's handler threads
 * (or, with sw_ingress_opts.handler_inline, on the thread that received
 * the request).
 *
 * Ownership: the responder belongs to the library for the duration of the
 * call. If the handler returns without calling sw_responder_retain(), the
 * library releases it on return, and a responder released without a terminal
 * gets a FAILED terminal ("handler_returned") sent for it. To keep streaming
 * from another thread (an engine's scheduler), call sw_responder_retain()
 * inside the handler and sw_responder_release() when done. */
typedef void (*sw_handler_fn)(sw_responder *resp, void *arg);

typedef struct sw_ingress_opts {
    const char *endpoint;    /* required: "ns.component.endpoint" */
    const char *instance_id; /* default: 16 random hex characters */
    sw_handler_fn handler;   /* required */
    void *handler_arg;
    unsigned max_inflight;       /* live streams, retained responders included: a stream
                                    counts from its request's arrival until its final is on
                                    the wire (a finished responder not yet released no longer
                                    counts); default 64. A request beyond it gets an
                                    "overloaded" terminal. */
    unsigned handler_threads;    /* default 4 */
    size_t max_request_bytes;    /* default: the server's max payload */
    sw_duration send_timeout_ms; /* how long send() waits for credit; default 30000 */
    unsigned max_window;         /* cap on a request's credit window, the first and the one a
                                    frontend may grow it to (sw_router_opts.credit_window_max);
                                    a stream keeps up to this many sent items until the
                                    frontend acknowledges them. Default
                                    SW_INGRESS_MAX_WINDOW_DEFAULT */
    sw_duration
        frontend_probe_ms; /* how often the frontends of live streams are probed; default 250 */
    sw_duration frontend_timeout_ms; /* a probe unanswered this long is a miss;
                                     frontend_probe_misses in a row, or a no-responders answer,
                                     cancel that frontend's streams; default 1000 */
    sw_duration coalesce_us;         /* coalescing (docs/PROTOCOL.md): a stream that published less
                                        than this many microseconds ago hands its items to the
                                        sender thread, which puts what queues meanwhile in one
                                        message. 0 = default (200); SW_COALESCE_OFF = every item in
                                        a message of its own, published by the sending thread.
                                        With handler_inline, an item the handler sends within a
                                        hold window of its start or of its previous send waits
                                        for its next ones instead (no thread is woken). The
                                        window is this on a no_send_asap connection, and at most
                                        20 us with send-asap, where only a quiet stream's burst is
                                        held: an item sent later than that after the start or
                                        the previous send, or once the stream has published,
                                        goes as any stream's. What waits goes out together when
                                        the handler returns, ends the stream, sends again after a
                                        longer gap or once the first of them has waited the
                                        window, runs out of credit, or has a message's worth
                                        waiting (128 items or about 16 KiB of data, 32 KiB on a
                                        sealing connection), and at the latest at the ingress
                                        timer's next tick (25 ms: a handler that blocks right
                                        after a send) */
    sw_log_fn log;
    void *log_arg;
    unsigned frontend_probe_misses; /* unanswered probes in a row that mean a frontend is gone
                                       (its streams are cancelled); default 2, as the
                                       router's probe_misses */
    unsigned max_held_finals;       /* finished streams kept until the frontend acknowledges their
                                       final (so a lost final can be resent); beyond this many the
                                       oldest is let go (counted in finals_dropped). Default
                                       SW_INGRESS_MAX_HELD_DEFAULT */
    sw_duration max_request_age_ms; /* refuse a request issued longer ago than this by its
                                       sender's clock (Request.issued_unix_ms): a replay older
                                       than the worker's 10-minute memory of served requests.
                                       Needs clocks that agree within this; 0 = no limit (the
                                       default: a worker whose clock is off still serves).
                                       At most SW_MAX_REQUEST_AGE_MS, else invalid_argument */
    int handler_inline;             /* 1: no handler pool (handler_threads is ignored); the
                                       handler runs on the thread that received the request, as
                                       a nats.c subscription callback does, which saves a thread
                                       hand-off per request (BENCHMARKS.md, session 17). For a
                                       handler that returns at once: one that retains the
                                       responder and hands it to an engine's own thread, or
                                       sends a few items that fit the credit window (they
                                       then share one message: coalesce_us). Requests
                                       are then taken in one at a time: while a handler runs,
                                       the next ones wait in nats.c's queue (unbounded, in
                                       memory), not yet known to the worker and so neither
                                       heartbeaten nor counted in max_inflight. Once the
                                       handlers ahead of a request have run longer, in all,
                                       than its frontend's inactivity_ms (1.5 s by default), it
                                       ends with stream_incomplete (or migrates, and the
                                       frontend stops choosing this instance for a while). A
                                       drain hands the waiting ones back unrun (instance_lost).
                                       An inline handler must not wait for a stream it opens
                                       to its own ingress, nor call sw_ingress_drain or
                                       _destroy. Default 0: the pool. */
} sw_ingress_opts;

#define SW_COALESCE_OFF (-1)
#define SW_INGRESS_MAX_WINDOW_DEFAULT 16384
#define SW_INGRESS_MAX_HELD_DEFAULT 1024
#define SW_MAX_REQUEST_AGE_MS (10 * 60 * 1000) /* the memory of served requests */

SW_API void sw_ingress_opts_init(sw_ingress_opts *opts);

/* Subscribes to the instance's request and control subjects and starts the
 * handler threads and the heartbeat timer. On success *out owns the ingress.
 * Errors: SW_EINVAL (missing handler, invalid endpoint or instance id),
 * SW_EPERM (the server's permissions for this connection's user do not let
 * it subscribe to the instance's request, control or liveness subjects),
 * SW_ENOMEM, wrapped NATS status. conn must outlive the ingress.
 * The handler runs only for requests that arrive once start has succeeded
 * (the first may be called just before start returns SW_OK): one that
 * reaches the instance while start is under way (sent to the instance by
 * name: it is not registered yet) is handed back unrun with instance_lost
 * ("the worker is starting"), whether start then succeeds or fails; a
 * failed start never calls the handler. */
SW_API SW_NODISCARD sw_err sw_ingress_start(sw_ingress **out, sw_conn *conn,
                                            const sw_ingress_opts *opts);

/* Stops accepting requests (the request subscription is removed: a router
 * that picked this instance from the registry gets "no responders" and sends
 * the request to another instance; call sw_registry_set_draining first so
 * routers stop picking it at all; a request that reached the worker but had
 * not started, such as one queued behind an inline handler, is handed back
 * unrun with instance_lost "the worker is draining"). Streams whose frontend migrates them
 * (sw_responder_migratable) are handed back at once: their handlers see the
 * cancellation and their frontends move them to another instance. Then it
 * waits up to grace_ms for the other in-flight streams to finish. Streams still open after
 * that are cancelled: their handlers see the cancellation, and their
 * frontends get the terminal error instance_lost ("the worker is shutting
 * down"), which a migrating router may retry elsewhere. Returns SW_OK
 * when all finished in time, SW_ETIMEDOUT when some had to be cancelled. Idempotent. Must not be
 * called from a handler thread. */
SW_API sw_err sw_ingress_drain(sw_ingress *ing, int64_t grace_ms);

/* Drains with grace 0, stops all threads, frees. Retained responders stay
 * valid as objects (their calls return SW_ECLOSED) until released. NULL ok.
 * Must not be called from a handler thread. */
SW_API void sw_ingress_destroy(sw_ingress *ing);

/* Owned by ing; valid until destroy. */
SW_API const char *sw_ingress_instance_id(const sw_ingress *ing);
SW_API const char *sw_ingress_endpoint(const sw_ingress *ing);
SW_API const char *sw_ingress_request_subject(const sw_ingress *ing);
SW_API const char *sw_ingress_control_subject(const sw_ingress *ing);

typedef struct sw_ingress_stats {
    uint64_t requests;          /* requests accepted */
    uint64_t rejected_overload; /* answered "overloaded" */
    uint64_t bad_requests;      /* did not decode / invalid */
    uint64_t items_sent;        /* data items published (first sends) */
    uint64_t items_resent;      /* retransmissions answering RESEND */
    uint64_t items_shed;        /* droppable items shed for lack of credit */
    uint64_t heartbeats;
    uint64_t cancels;          /* streams cancelled by the frontend (or its loss, or the
                                  connection's closing for good) */
    uint64_t frontends_lost;   /* frontends declared gone by the liveness probe */
    uint64_t finished[6];      /* terminals sent, indexed by sw_status (1..5) */
    uint64_t inflight;         /* gauge: what max_inflight counts */
    uint64_t messages_sent;    /* NATS messages that carried first sends of items and finals:
                                  items queued while the previous message went out share one */
    uint64_t streams_held;     /* gauge: streams in the worker's table, live ones and finished
                                  ones whose final the frontend has not acknowledged yet */
    uint64_t bad_controls;     /* control messages for a stream naming another frontend
                                  (router_id) than the stream's: ignored (an ACK_FINALS
                                  counts once however many such streams it names, and its
                                  acks for the sender's own streams are taken); PROBEs whose
                                  reply subject is not sw.prb.<router_id>.<instance>, where
                                  the router they name takes probe answers: not answered */
    uint64_t finals_dropped;   /* finished streams let go before their final was
                                  acknowledged, to keep at most max_held_finals */
    uint64_t auth_failures;    /* requests, controls and probes refused by sealing: they did not
                                  open, or their sealing did not match this connection's; never
                                  acted on */
    uint64_t credit_stalls;    /* blocking sends that had to wait for credit (the frontend's
                                  consumer was slower than the handler) */
    uint64_t replays;          /* requests this worker had already served (within the last 10
                                  minutes, the last 65,536) or refused unrun (overloaded,
                                  draining, cancelled first: the last 16,384): dropped,
                                  never run twice, nor later */
    uint64_t requests_waiting; /* gauge: requests this process received but has not taken in
                                  yet (nats.c's queue for the request subscription; unbounded).
                                  With handler_inline, those waiting behind a running handler:
                                  neither heartbeaten nor counted in inflight */
    /* RESEND controls asking for items this worker had resent less than
     * 50 ms before: those were not resent again (the rest of the range
     * was); a frontend asks again later if it still misses them. */
    uint64_t resends_throttled;
} sw_ingress_stats;

SW_API void sw_ingress_stats_get(sw_ingress *ing, sw_ingress_stats *out);

/* --- responder. All functions are thread-safe. --------------------------- */

/* The request payload; owned by the responder, valid until it is released
 * (its last release, or the handler's return without a retain: the
 * library frees it then, while the stream may wait on for its final's
 * acknowledgement). */
SW_API const void *sw_responder_payload(const sw_responder *r, size_t *len);
/* max_tokens hint from the request (0 = unset). */
SW_API uint32_t sw_responder_max_tokens(const sw_responder *r);
/* Request id as 32 hex characters; owned by r. */
SW_API const char *sw_responder_request_id(const sw_responder *r);
/* The value of a request header (see sw_header), or NULL if the request
 * has none with that key. Owned by r, valid until it is released. */
SW_API const char *sw_responder_header(const sw_responder *r, const char *key);
/* The trace id (32 lowercase hex characters) of the request's W3C
 * traceparent header, or "" if it has none or it is malformed. Owned by r. */
SW_API const char *sw_responder_trace_id(const sw_responder *r);
/* Milliseconds left before the request deadline; -1 = no deadline. */
SW_API int64_t sw_responder_deadline_left_ms(const sw_responder *r);
/* Migration (sw_request_opts.migration_limit): 0 for a new stream; N when
 * the frontend re-issued this request after losing the worker that served
 * it, and its consumer already has items 1..N-1. A handler that can resume
 * sends what comes after them (its first item continues the consumer's
 * stream at seq N; it numbers nothing itself). A handler that cannot may
 * ignore it and the consumer sees the output again from the start. */
SW_API uint64_t sw_responder_resume_from(const sw_responder *r);
/* 1 if the frontend migrates this stream when this worker goes away: a
 * draining ingress (sw_ingress_drain) hands such streams back at once (the
 * handler sees a cancellation) rather than letting them finish. */
SW_API int sw_responder_migratable(const sw_responder *r);

/* Sends one data item (copied). Blocks while the stream has no credit, until
 * credit arrives, the stream is cancelled, or the ingress send timeout passes.
 * With flow control the item may be queued and published an instant later
 * by the ingress's sender thread, together with the items queued after it
 * (see docs/PROTOCOL.md "Coalescing"). A publish of queued items that
 * failed leaves them kept (the frontend asks for them again); its error is
 * returned by the next send (which then takes nothing), or by finish or
 * fail if it is a NATS error.
 * Errors: SW_ECANCELLED (frontend cancelled or gone, deadline passed, or the
 * connection closed for good),
 * SW_ECLOSED (a terminal was already sent, or the ingress is gone),
 * SW_ETIMEDOUT (no credit in time), SW_EMSGSIZE (the item and its framing
 * exceed sw_conn_max_payload: an item of up to that less 128 bytes always
 * fits (less 130 if droppable, and less the event name's length + 2 more
 * with sw_responder_send_event); one of that less 112 bytes or more never
 * does; nothing sent, the stream stays usable), SW_ENOMEM, a NATS error
 * (SW_ENATS_BASE | status), SW_EINVAL. */
SW_API sw_err sw_responder_send(sw_responder *r, const void *data, size_t len);

/* As send, but returns SW_EAGAIN at once instead of blocking for credit. */
SW_API sw_err sw_responder_try_send(sw_responder *r, const void *data, size_t len);

/* Sends a droppable item (metrics): when no credit is left it is shed
 * (counted in items_shed) and SW_OK is returned. Never blocks. */
SW_API sw_err sw_responder_send_droppable(sw_responder *r, const void *data, size_t len);

/* Typed items. An item may carry an event name that tells the frontend
 * what it is, as Dynamo's Annotated does: "refusal" (text the model
 * declined with), "metrics" (progress figures), or any name of the
 * application's. The name is 1..SW_MAX_EVENT characters of
 * [A-Za-z0-9._:-]; NULL or "" sends a plain item. It reaches the consumer
 * in sw_item.event; items keep their order whatever their names.
 * flags: SW_SEND_DROPPABLE sheds the item when no credit is left (as
 * sw_responder_send_droppable; never blocks), SW_SEND_NOWAIT returns
 * SW_EAGAIN instead of blocking (as sw_responder_try_send); 0 blocks as
 * sw_responder_send. Errors: those of sw_responder_send, and SW_EINVAL for
 * a bad name or flag. The gateway (docs/GATEWAY.md) turns "refusal" items
 * into response.refusal.* events and "metrics" items into `metrics` events. */
#define SW_SEND_DROPPABLE 1u
#define SW_SEND_NOWAIT 2u
SW_API sw_err sw_responder_send_event(sw_responder *r, const char *event, const void *data,
                                      size_t len, unsigned flags);

/* Ends the stream with COMPLETED or INCOMPLETE and a finish reason
 * (NULL = "stop" for completed; required for incomplete, e.g. "max_tokens";
 * at most 256 bytes).
 * Errors: SW_EINVAL (other status, or the reason); SW_ECANCELLED (the stream
 * was cancelled or killed: by its frontend, its deadline or a drain's
 * hand-back, which decided how it ends; nothing is sent now); SW_ECLOSED (already
 * terminated, or the ingress closed). Ending a stream needs no memory (the
 * final is built on the stack), so SW_ENOMEM never comes from here (nor
 * from an earlier send's publish that found no memory: its items are kept
 * and resent). A NATS error (sw_err_is_nats), of this call's own publish
 * of the final or one an earlier send's publish left: the final was
 * queued, and is resent if the frontend asks, but a publish failed; the
 * stream is terminated all the same (a second call is SW_ECLOSED). */
SW_API sw_err sw_responder_finish(sw_responder *r, sw_status status, const char *reason);

/* Ends the stream with FAILED, an application error code token (1..64 chars
 * of [a-z0-9_.-], e.g. "engine_error") and a human message (may be NULL).
 * Errors: SW_EINVAL (bad code), the others of sw_responder_finish, and
 * SW_ENOMEM: the final with its message takes more than the 1 KiB built on
 * the stack (a message of more than about 900 bytes) and there is no memory
 * for it (to build it, or to both keep and publish it); nothing was sent,
 * and the call may be made again (with a shorter
 * message, or none, it needs no memory). A responder released without a
 * terminal gets its FAILED "handler_returned" final without memory too. */
SW_API sw_err sw_responder_fail(sw_responder *r, const char *code, const char *message);

/* 1 once the frontend cancelled (or vanished, or the deadline passed, or
 * the worker's connection closed for good) before the stream's terminal was
 * sent; a cancel that comes after it (finish or fail returned SW_OK) does
 * not cancel the stream, and fires no callback. */
SW_API int sw_responder_cancelled(const sw_responder *r);

/* Called once, from a library thread, when the stream is cancelled. If the
 * stream is already cancelled, called at once on the calling thread. Each
 * call registers fn in place of the callback before it (NULL: none), and
 * each registration is called at most once: one made on a cancelled stream
 * runs at once even if the one it replaced has run. It runs
 * on a thread that serves the whole instance (the one that handles control
 * messages; the liveness prober; the timer, for a deadline or a connection
 * closed for good), or on the thread that calls sw_ingress_drain or
 * sw_ingress_destroy (the streams they hand back or end): keep it short
 * (set a flag, signal the engine), or credits and probe answers for every
 * stream wait behind it; never destroy the ingress from it, and do not
 * call drain or destroy holding a lock the callback takes. */
typedef void (*sw_cancel_fn)(sw_responder *r, void *arg);
SW_API void sw_responder_on_cancel(sw_responder *r, sw_cancel_fn fn, void *arg);

/* Reference counting; see sw_handler_fn. Release without a terminal sends a
 * FAILED terminal (app code "responder_released"). */
SW_API void sw_responder_retain(sw_responder *r);
SW_API void sw_responder_release(sw_responder *r);

/* ------------------------------------------------------------------------ */
/* Egress (frontend side)                                                    */

typedef struct sw_router sw_router;
typedef struct sw_stream sw_stream;
typedef struct sw_registry sw_registry; /* see streamwire/registry.h */

/* How a router picks an instance when the request names none. */
typedef enum sw_policy {
    SW_POLICY_ROUND_ROBIN = 0,
    SW_POLICY_RANDOM = 1,
    SW_POLICY_LEAST_INFLIGHT = 2 /* fewest streams open from this router */
} sw_policy;

/* "round_robin", "random", "least_inflight"; parse with sw_policy_from_name
 * (SW_EINVAL for an unknown name). */
SW_API const char *sw_policy_name(sw_policy p);
SW_API sw_err sw_policy_from_name(const char *name, sw_policy *out);

typedef enum sw_item_kind { SW_ITEM_DATA = 1, SW_ITEM_TERMINAL = 2 } sw_item_kind;

typedef struct sw_terminal {
    sw_status status;
    sw_err error;          /* SW_OK unless status == SW_STATUS_ERROR */
    const char *reason;    /* "stop", "max_tokens", app code, "cancelled", or sw_err_name(error);
                              a worker's finish reason arrives whole (at most 256 bytes) */
    const char *message;   /* human text; "" when none. A worker's message arrives up to its
                              first 1,024 bytes (cut before a UTF-8 character it would split) */
    unsigned migrations;   /* times the stream moved to another instance (migration_limit) */
    const char *instances; /* the instances it was sent to, in order, comma-separated ("" if
                              none), including one that had gone (no responders) when a
                              re-route or a migration picked it; valid as long as the item */
} sw_terminal;

typedef struct sw_item {
    sw_item_kind kind;
    uint64_t seq;     /* DATA: 1, 2, ...; TERMINAL: the final's seq, or 0 if synthesized */
    const void *data; /* DATA only */
    size_t len;
    int droppable;
    sw_terminal terminal;    /* TERMINAL only */
    const char *instance_id; /* the instance that served the stream ("" if none) */
    const char *event;       /* DATA: the item's event name (sw_responder_send_event), "" for a
                                plain item; never NULL. Valid as long as data. */
} sw_item;

/* Callback mode: called on a library thread for each item in order, never
 * concurrently for one stream, the terminal last and exactly once. The item
 * is valid only during the call. The callback may call sw_stream_cancel and,
 * after (or on) the terminal, sw_stream_close. It usually runs on the
 * router's one delivery thread, shared by all its streams: a slow callback
 * delays every stream of the router (never ends them: their silence is
 * judged only up to the time the router had handled all it received; their
 * deadlines still apply, and a callback that never returns leaves the
 * router's streams without a deadline open for good: the router logs a
 * warning every 10 s it is that far behind). Hand heavy work to another
 * thread.
 * That thread is nats.c's (its default stack: 8 MiB with glibc), and the
 * callback runs with about 25 KiB of the library's frames below it (the
 * message's decode arena, proto/sw_codec.h SWP_ARENA_BYTES); mind it on a
 * platform whose threads get small stacks (musl: 128 KiB).
 * The credit an item frees goes to the worker when its callback returns: a
 * grant comes due with half the window still outstanding, so the worker
 * goes on meanwhile (with credit_window 1 it waits through each callback). */
typedef void (*sw_item_fn)(sw_stream *s, const sw_item *item, void *arg);

/* Migration: what the router knows when it re-issues a request, and what
 * the rebuild callback may change. */
#define SW_MAX_MIGRATIONS 16
/* Beyond this many bytes kept (the items' data and about 70 bytes of
 * bookkeeping each), a stream with a migrate callback no longer keeps its
 * items for it, and is no longer migrated. */
#define SW_MIGRATION_HISTORY_MAX (4u << 20)
typedef struct sw_migration {
    /* in */
    const void *payload; /* the request payload as first sent */
    size_t len;
    uint32_t max_tokens;  /* as first sent */
    const sw_item *items; /* the data items received so far, in order (seq 1..nitems): those
                             delivered and those still queued for the consumer, never again */
    size_t nitems;
    unsigned attempt;          /* 1 for the first migration of the stream */
    sw_err why;                /* SW_INSTANCE_LOST (also: the worker drained),
                                  SW_STREAM_INCOMPLETE, or SW_NO_RESPONDERS (the instance
                                  the last migration picked had gone: unsealed only) */
    const char *lost_instance; /* the instance the stream leaves */
    /* out, preset to the default (the same request, resumed) */
    void *new_payload; /* NULL = the original payload; else malloc()ed by the callback,
                          freed by the library */
    size_t new_len;
    uint32_t new_max_tokens;  /* preset: max_tokens */
    uint64_t resume_from_seq; /* preset: nitems + 1 (sw_responder_resume_from); set 0 when the
                                 new payload already carries what was delivered */
} sw_migration;

/* Called on a library thread with no library lock held, once per migration,
 * before the new instance is picked; m->items are valid during the call
 * only. Return SW_OK to go on, anything else to end the stream with the
 * terminal it would have had without migration. It should not block long:
 * it holds up the thread that noticed the loss (a cancel during the call
 * is honoured: no new request is sent). */
typedef sw_err (*sw_migrate_fn)(sw_migration *m, void *arg);

/* The shortest gap timeout: a worker resends one seq at most every 50 ms
 * (docs/PROTOCOL.md, RESEND bounds), and a frontend asks again every
 * gap_timeout_ms / 4; below 200 ms a resent copy that is lost could not be
 * asked for again in time. */
#define SW_GAP_TIMEOUT_MIN_MS 200

typedef struct sw_router_opts {
    const char *router_id;         /* default: 16 random hex characters */
    unsigned credit_window;        /* a stream's first credit window, in items; default 256. A
                                      worker may grant less (its max_window); the router then
                                      adopts that. */
    sw_duration heartbeat_ms;      /* asked of workers; default 250. A stream with nothing
                                      new since its last heartbeat is beaten every
                                      inactivity_ms - 500 ms (- heartbeat_ms - 250 when that
                                      is less) when that is longer (Request.
                                      idle_heartbeat_ms; 1,000 ms by default). A stream
                                      silent that long + heartbeat_ms is asked after (a
                                      stream probe, whose answer counts as a heartbeat), so
                                      one lost beat is harmless */
    sw_duration inactivity_ms;     /* silence (incl. heartbeats and answers to stream
                                      probes) that ends a stream with stream_incomplete;
                                      default 4 * heartbeat_ms + 500. A stream that is
                                      asked after ends only once its first ask has had
                                      as long to be answered as one made on time (a
                                      router behind on its queue asks late: the limit
                                      moves by as much) */
    sw_duration gap_timeout_ms;    /* how long a sequence gap may stay open; default 500, at
                                      least SW_GAP_TIMEOUT_MIN_MS (a smaller value is raised to
                                      it) */
    sw_duration final_linger_ms;   /* hold the terminal this long after the final to catch
                                      items sent after it (item_after_final); default 0 */
    unsigned max_streams;          /* open streams; default 65536 */
    sw_registry *registry;         /* optional. Enables routing by endpoint (requests with no
                                      instance_id) and shares dead-instance reports with every
                                      other router. Must outlive the router: it may be
                                      closed once sw_router_destroy returns, streams of
                                      the router still held or not. */
    sw_policy policy;              /* default round robin */
    sw_duration probe_interval_ms; /* instances with open streams are probed this often; a dead
                                     one answers "no responders" at once; default 100 */
    sw_duration probe_timeout_ms;  /* an unanswered probe is a miss; default 300 */
    unsigned probe_misses;         /* misses in a row that make a frozen instance dead; default 2 */
    sw_duration quarantine_ms;     /* local quarantine of a dead instance, doubling on repeats
                                      (a loss within as long after the last quarantine ended) up
                                      to 30 s (a longer value is cut to 30 s), lifted early when it
                                      registers again; default 1000 */
    sw_log_fn log;
    void *log_arg;
    int migration_limit; /* default for sw_request_opts.migration_limit; 0 (the default) = no
                            migration; at most SW_MAX_MIGRATIONS */
    /* Window tuning (docs/PROTOCOL.md, "Flow control"). A stream on the
     * router's default window whose consumer took half a window within
     * SW_WINDOW_GROW_MS of the previous grant, with at most a quarter of it
     * queued, doubles its window at that grant, up to credit_window_max
     * items (and the worker's max_window), and no further than its byte
     * window of items of the largest size seen so far (each counted as its
     * length + SW_ITEM_COST); a grant shrinks it back (never below
     * credit_window) when larger items came. A slow consumer keeps the
     * first window. Byte credit: every stream with a window also asks the
     * worker to keep the data bytes it sends past what the consumer took
     * below its byte window (it may finish past the limit the one item it
     * started below it); a worker that answers is held to it
     * (flow_violation), and only then does the window grow. The byte window
     * starts at credit_bytes; where it is what caps the window (large
     * items) and the consumer keeps up in bytes too, it doubles with the
     * window up to credit_bytes_max. Memory: a stream queues and holds at
     * most its byte window + one item of data (credit_bytes_max + one item;
     * credit_bytes + one item for a consumer that never kept up), plus
     * about SW_ITEM_COST per item within the window and at most 32 KiB of
     * queue-node blocks (a message's items share blocks of at most 16 KiB),
     * whatever the worker sends; during a migration, the old worker's and
     * the new one's
     * (docs/MIGRATION.md); from a worker that does not keep to byte credit
     * (an older one), the first window x the largest item. */
    unsigned credit_window_max; /* 0 = SW_CREDIT_WINDOW_MAX_DEFAULT (16384); set it to
                                   credit_window for a fixed window; at most 1<<20 */
    size_t credit_bytes;        /* 0 = SW_CREDIT_BYTES_DEFAULT (1 MiB) */
    size_t credit_bytes_max;    /* the most a stream's byte window grows to (above); never
                                   shrinks for one worker. 0 (what sw_router_opts_init sets) =
                                   SW_CREDIT_BYTES_MAX_DEFAULT (4 MiB), or credit_bytes if that
                                   is larger; = credit_bytes: a fixed byte window; less:
                                   SW_EINVAL */
} sw_router_opts;

#define SW_CREDIT_WINDOW_MAX_DEFAULT 16384
#define SW_CREDIT_BYTES_DEFAULT ((size_t)1 << 20)
#define SW_CREDIT_BYTES_MAX_DEFAULT ((size_t)4 << 20)
#define SW_WINDOW_GROW_MS 20
#define SW_ITEM_COST 64

SW_API void sw_router_opts_init(sw_router_opts *opts);

/* Creates a router: one wildcard subscription on its response subjects.
 * Errors: SW_EINVAL, SW_EPERM (the server's permissions for this
 * connection's user do not let it subscribe to the router's own subjects:
 * sw.rsp.<router_id>.*, sw.rtr.<router_id>, sw.prb.<router_id>.*),
 * SW_ENOMEM, wrapped NATS status. conn must outlive it. */
SW_API SW_NODISCARD sw_err sw_router_create(sw_router **out, sw_conn *conn,
                                            const sw_router_opts *opts);

/* Ends every open stream (its consumer gets a terminal: error "closed"),
 * waits for callbacks in flight, frees. Streams not yet closed by the user
 * stay valid objects until sw_stream_close. NULL ok. Must not be called from
 * an item callback. */
SW_API void sw_router_destroy(sw_router *r);

SW_API const char *sw_router_id(const sw_router *r);

/* A request header: a key and a value that travel with the request to the
 * worker (Request.headers). W3C trace context goes here: "traceparent"
 * (and "tracestate"); when a valid traceparent is present, every log line
 * the library writes about the stream, on both sides, carries its trace
 * id. */
typedef struct sw_header {
    const char *key;   /* 1..128 bytes */
    const char *value; /* 0..4096 bytes */
} sw_header;

#define SW_MAX_HEADERS 64

typedef struct sw_request_opts {
    const char *endpoint;     /* required: "ns.component.endpoint" */
    const char *instance_id;  /* direct routing to this instance; NULL = pick one through the
                                 router's registry by policy (no live instance: the stream's
                                 only item is the terminal error no_instances) */
    sw_duration deadline_ms;  /* 0 = none */
    uint32_t max_tokens;      /* hint passed to the engine; 0 = unset */
    unsigned credit_window;   /* 0 = router default (tuned: sw_router_opts.credit_window_max);
                                 set = a fixed window of this many items */
    sw_duration heartbeat_ms; /* 0 = router default */
    sw_item_fn on_item;       /* NULL = blocking mode (sw_stream_next) */
    void *on_item_arg;
    const sw_header *headers; /* nheaders of them (copied); at most SW_MAX_HEADERS, keys
                                 unique; SW_EINVAL otherwise */
    size_t nheaders;
    /* Blocking mode only (on_item NULL): called on a library thread, with no
     * library lock held, when sw_stream_next(s, .., 0) may now return an
     * item or the terminal; for an event loop that must not block in
     * sw_stream_next. It must not block or call sw_stream_next itself (post
     * a wake-up to the loop instead), nor sw_stream_close. It may be called
     * when nothing is new, and may run before sw_router_open returns; after
     * sw_stream_close returns it is never called again (close waits for a
     * call in progress). Credit is granted as
     * sw_stream_next takes items, so a loop that stops taking them (its
     * client is slow) stops the worker. NULL = none. */
    void (*on_ready)(sw_stream *s, void *arg);
    void *on_ready_arg;
    /* Migration (docs/MIGRATION.md). When the stream would end with
     * instance_lost or stream_incomplete, or its worker drains before
     * finishing it, the router re-issues the request to another live
     * instance, at most migration_limit times, and the consumer sees one
     * continuous stream. 0 = the router's default (sw_router_opts), -1 =
     * never, 1..SW_MAX_MIGRATIONS. Only for requests routed by the registry
     * (instance_id NULL); SW_EINVAL above the maximum. */
    int migration_limit;
    /* Rebuilds the request for the next instance; NULL = the same payload,
     * with resume_from (sw_responder_resume_from) telling the worker where
     * the consumer is. See sw_migrate_fn. */
    sw_migrate_fn migrate;
    void *migrate_arg;
} sw_request_opts;

SW_API void sw_request_opts_init(sw_request_opts *opts);

/* Sends a request and returns its stream in *out (owned by the caller; free
 * with sw_stream_close). payload is copied.
 *
 * Stream-level failures do NOT make this return an error: the stream is
 * returned and its only item is a terminal (payload_too_large,
 * no_responders, no_instances, ...). Errors returned here are API errors:
 * SW_EINVAL (bad options or endpoint), SW_ENOMEM, SW_ECLOSED (router
 * destroyed, or its connection closed for good), SW_EBUSY (max_streams
 * reached). Thread-safe. */
SW_API SW_NODISCARD sw_err sw_router_open(sw_stream **out, sw_router *r,
                                          const sw_request_opts *opts, const void *payload,
                                          size_t len);

/* Blocking mode: waits up to timeout_ms (-1 = forever, 0 = poll) for the next
 * item. *item stays valid until the next call on this stream or close.
 * Returns SW_OK with an item, SW_ETIMEDOUT if none arrived in time,
 * SW_EEOF after the terminal was delivered, SW_EBUSY in callback mode,
 * SW_ENOMEM if the first call found no memory for the item it hands out
 * (nothing was taken: a later call may succeed). Call from one thread at a
 * time. */
SW_API sw_err sw_stream_next(sw_stream *s, const sw_item **item, int64_t timeout_ms);

/* Cancels: no data item is delivered after this call returns; the next item
 * is the terminal CANCELLED (also when the worker's final had arrived while
 * items still waited for the consumer: those items are dropped), unless a
 * terminal with nothing before it was already queued (that one comes next). The
 * worker is told (CANCEL) and its handler sees the cancellation: if the bus
 * loses the CANCEL, the router sends it again after 100 ms, then doubling,
 * until the worker's final for the stream arrives, 5 sends in all (at most
 * 4,096 cancels wait for an answer at once; past that, one send). In callback
 * mode, called from another thread while an item callback of this stream
 * runs, it waits for that callback to return. Returns SW_OK, or SW_EEOF if
 * the stream already has its terminal (delivered, or queued with nothing
 * before it). Thread-safe. */
SW_API sw_err sw_stream_cancel(sw_stream *s);

/* As cancel, but the worker drops the stream without a terminal (KILL). */
SW_API sw_err sw_stream_kill(sw_stream *s);

/* Closes and frees. A stream closed before its terminal is cancelled first.
 * In callback mode it may be called from the stream's own callback; the
 * callback may see the CANCELLED terminal during this call; called from
 * another thread, it waits for a callback in progress. Once it returns, the
 * item callback is never called again (its argument may be freed): a
 * terminal another thread had decided but not yet delivered is then not
 * delivered. NULL ok. */
SW_API void sw_stream_close(sw_stream *s);

/* Owned by s; valid until close. Safe to call from any thread at any time.
 * The request id is the first request's for the stream's whole life (a
 * migration's new requests do not change it). The instance id changes when
 * the stream moves: before its first item, a request routed by the
 * registry that finds no responder on its instance (draining, or just
 * died) is sent once to another instance; at any time, a migration
 * (migration_limit) moves it. A later call returns the new id; a string
 * returned earlier stays valid and unchanged until close. */
SW_API const char *sw_stream_request_id(const sw_stream *s);
SW_API const char *sw_stream_instance_id(const sw_stream *s);

typedef struct sw_stream_stats {
    uint64_t items;           /* data items delivered */
    uint64_t duplicates;      /* dropped as duplicates */
    uint64_t reordered;       /* held and delivered after a gap filled */
    uint64_t resend_requests; /* RESEND controls sent */
    uint64_t heartbeats;
    uint64_t peak_pending; /* most items queued for the consumer at once */
    uint64_t pending;      /* items queued for the consumer now (a consumer that is behind
                              may shed what it can spare, as the gateway does with metrics) */
    uint64_t migrations;   /* times the stream moved to another instance */
    uint64_t window;       /* the credit window now, in items (it grows for a fast stream:
                              sw_router_opts.credit_window_max) */
    uint64_t window_bytes; /* the byte window now (it grows for a fast stream of large items:
                              sw_router_opts.credit_bytes_max); 0 until the worker keeps to
                              byte credit, or without it */
} sw_stream_stats;

SW_API void sw_stream_stats_get(sw_stream *s, sw_stream_stats *out);

typedef struct sw_router_stats {
    uint64_t streams_opened;
    uint64_t terminals[6];      /* by sw_status (1..5) */
    uint64_t items;             /* data items delivered */
    uint64_t unknown_stream;    /* messages (or batched heartbeats) for no open stream, or
                                   heartbeats from an instance the stream is not on */
    uint64_t items_after_final; /* seen after a delivered terminal */
    uint64_t nats_dropped;      /* nats.c slow-consumer drops on the mux subscription */
    uint64_t open_streams;      /* gauge */
    uint64_t instances_lost;    /* instances this router declared dead */
    uint64_t probes_sent;
    uint64_t last_loss_detect_ms;    /* detection latency of the last loss: from the last sign of
                                        life of the instance to its declaration */
    uint64_t bad_messages;           /* heartbeat batches that did not decode (a stream's own
                                        undecodable item ends it with decode_error instead) */
    uint64_t auth_failures;          /* messages refused by sealing (they did not open, or their
                                        sealing did not match the connection's): a stream's own
                                        ends it with auth_failed; others are dropped */
    uint64_t migrations;             /* streams moved to another instance (each move whose request
                                        went out counts) */
    uint64_t migration_failures;     /* moves that did not happen: no instance, the migrate callback
                                        declined, no memory, the moved request could not be
                                        published (the stream ended instead) */
    uint64_t stream_probes_sent;     /* silent streams asked after (an idle heartbeat may have been
                                        lost): a PROBE naming the stream to its worker */
    uint64_t stream_probes_answered; /* answers to them that counted as a sign of the stream's
                                        life (fresh, from its instance, the stream known there) */
    uint64_t stream_probes_full;     /* asks not sent: the 16,384 positions of the last second's
                                        stream probes were taken; the stream is judged by its
                                        silence alone */
} sw_router_stats;

/* SW_STATUS_ERROR terminals this router delivered with the code `err` (a
 * stream reason such as SW_INSTANCE_LOST, or an API code such as
 * SW_EOVERLOADED; a wrapped NATS status counts as SW_ENATS). A function
 * rather than an array in sw_router_stats, so new reasons do not change the
 * struct. Thread-safe; 0 for NULL. */
SW_API uint64_t sw_router_error_count(sw_router *r, int err);

SW_API void sw_router_stats_get(sw_router *r, sw_router_stats *out);

#ifdef __cplusplus
}
#endif
#endif
