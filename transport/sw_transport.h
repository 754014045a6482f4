/* transport/sw_transport.h -- the NATS layer: the connection, subject naming,
 * subscriptions and bounded publishing. Ingress, egress and router talk to
 * NATS only through this header; it does not expose nats.c (sw_conn is
 * opaque here, defined in transport/conn.c). Only transport/ and the
 * JetStream KV registry backend include <nats/nats.h>. */
#ifndef SW_TRANSPORT_H
#define SW_TRANSPORT_H

#include "common/sw_common.h"

/* Subject buffers: prefix + endpoint + tokens always fit in this. */
#define SWT_SUBJECT_MAX 320
#define SWT_PING_MS 2000         /* NATS ping interval of every connection */
#define SWT_PINGS_OUT 2          /* unanswered pings that make it stale (reconnect) */
#define SWT_NKEY_CONNECT_TRIES 4 /* sw_conn_open with an nkey: see conn.c (nats.c 3.4.1) */

/* sw.req.<ns>.<component>.<endpoint>.<instance> */
sw_err swt_subject_request(char *out, size_t cap, const char *endpoint, const char *instance);
/* sw.ctl.<instance> */
sw_err swt_subject_control(char *out, size_t cap, const char *instance);
/* sw.rsp.<router>.<request id hex> */
sw_err swt_subject_response(char *out, size_t cap, const char *router, const char *reqhex);
/* sw.rsp.<router>.* : the router's one mux subscription */
sw_err swt_subject_response_wildcard(char *out, size_t cap, const char *router);
/* sw.rtr.<router>: the frontend's own control subject (liveness probes) */
sw_err swt_subject_router(char *out, size_t cap, const char *router);
/* sw.prb.<router>.<instance>: where an instance answers the router's probe;
 * instance NULL gives the router's wildcard sw.prb.<router>.* */
sw_err swt_subject_probe_reply(char *out, size_t cap, const char *router, const char *instance);
/* sw.lv.<instance>.<router>: where a frontend answers a worker's liveness
 * probe; router NULL gives the worker's wildcard sw.lv.<instance>.* */
sw_err swt_subject_live_reply(char *out, size_t cap, const char *instance, const char *router);
/* 1 if subject is sw.lv.<instance>.<router> for this router and a valid
 * instance name: the only reply subject a frontend answers a liveness
 * probe on (any other is the sender's choice: a reflection). */
int swt_is_live_reply_for(const char *subject, const char *router);
/* 1 if subject starts with the response prefix "sw.rsp." (and is a valid
 * subject to publish to): a request's reply must be one. */
int swt_is_response_subject(const char *subject);
/* The last token of a subject (after the last '.'), or NULL if none. */
const char *swt_subject_last_token(const char *subject);
/* Extracts the last token of a response subject (32 lowercase hex digits)
 * into a 16-byte id: 0, or -1 with id untouched. */
int swt_response_subject_id(const char *subject, uint8_t id[SW_REQUEST_ID_BYTES]);
/* sw.rsp.<router>.hb: where workers send a frontend the heartbeats of many
 * streams at once (HeartbeatBatch); the router's mux subscription gets it. */
sw_err swt_subject_beats(char *out, size_t cap, const char *router);
/* 1 if subject is a response subject's heartbeat-batch form (last token "hb"). */
int swt_is_beats_subject(const char *subject);
/* A subject on the router's mux, read once (one length, for every message
 * it receives): SWT_MUX_BEATS as swt_is_beats_subject, else SWT_MUX_ID with
 * *id as swt_response_subject_id, else SWT_MUX_OTHER (id untouched). */
typedef enum swt_mux_kind { SWT_MUX_OTHER = 0, SWT_MUX_ID = 1, SWT_MUX_BEATS = 2 } swt_mux_kind;
swt_mux_kind swt_mux_subject(const char *subject, uint8_t id[SW_REQUEST_ID_BYTES]);
/* What JetStream says of a message a push consumer delivers, in its reply
 * subject: $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer
 * seq>.<ns>.<pending> (9 tokens), or the form with a domain and an
 * account hash after ACK, and tokens after pending or not (11 to 16; those
 * after pending are not read).
 * 0 with *out filled, or -1 with *out untouched: not that form, a number
 * that is not 1-20 decimal digits or overflows 64 bits, an empty token, or
 * SWT_SUBJECT_MAX bytes or more. Reads up to the NUL and no further. */
typedef struct swt_js_ack {
    uint64_t delivered, stream_seq, consumer_seq, pending;
    uint64_t timestamp_ns;
} swt_js_ack;
int swt_js_ack_parse(const char *reply, swt_js_ack *out);
/* A whole string of 1-20 decimal digits that fits 64 bits (a header's
 * number): 0 with *v set, or -1 with *v untouched. */
int swt_u64_parse(const char *s, uint64_t *v);
/* What a subject carries, by its form (the sealed envelope binds it). */
typedef enum swt_subject_kind {
    SWT_SUBJ_OTHER,       /* not one of ours: e.g. a response subject of the frontend's choosing */
    SWT_SUBJ_REQUEST,     /* sw.req.<endpoint>.<instance> */
    SWT_SUBJ_CONTROL,     /* sw.ctl.<instance> */
    SWT_SUBJ_LIVE_REPLY,  /* sw.lv.<instance>.<router>: a frontend answers a worker's probe */
    SWT_SUBJ_BEATS,       /* sw.rsp.<router>.hb */
    SWT_SUBJ_PROBE_REPLY, /* sw.prb.<router>.<instance>: a worker answers a frontend's probe */
    SWT_SUBJ_ROUTER,      /* sw.rtr.<router>: a worker's probe of a frontend */
} swt_subject_kind;
swt_subject_kind swt_subject_kind_of(const char *subject);

/* NATS user nkeys (transport/nkey.c). */
#define SWT_NKEY_PUBLIC_LEN 56 /* "U..." */
#define SWT_NKEY_SEED_LEN 58   /* "SU..." */
/* The public key of a user seed string. SW_EAUTH if it is not one (bad
 * characters, length, prefix or checksum). The seed's bytes are wiped. */
sw_err swt_nkey_user_public(const char *seed, char out[SWT_NKEY_PUBLIC_LEN + 1]);
/* The same for the first user seed in a file (a seed file or a .creds
 * file); SW_EAUTH if the file cannot be read or holds none. */
sw_err swt_nkey_public_from_file(const char *path, char out[SWT_NKEY_PUBLIC_LEN + 1]);
/* Encodes a raw 32-byte Ed25519 seed as a user seed string (tests, keygen). */
sw_err swt_nkey_user_seed_encode(const uint8_t raw_seed[32], char out[SWT_NKEY_SEED_LEN + 1]);

/* After a successful swt_flush that followed swt_subscribe(subj): 1 if the
 * server refused that subscription (its permissions for these credentials
 * do not allow subj), else 0. */
int swt_denied(sw_conn *c, const char *subj);

/* Every object that keeps c (a router, an ingress, a registry) holds it
 * from its creation and releases it when its memory goes, so that
 * sw_conn_close while one is still open closes the NATS connection (their
 * sends fail from then on, nothing more arrives) but frees nothing they
 * use: the last release frees the connection. Any thread; never from a
 * nats.c callback of c itself (the last release destroys nats.c's
 * connection). */
void swt_conn_hold(sw_conn *c);
void swt_conn_release(sw_conn *c);

/* The connection's name (sw_conn_opts.name), for metrics labels. */
const char *swt_conn_name(const sw_conn *c);
/* 1 when publishes leave at once (send-asap, the default), 0 when nats.c
 * buffers them and its flusher thread writes them up to 1 ms later
 * (sw_conn_opts.no_send_asap). */
int swt_conn_send_asap(const sw_conn *c);

/* Publishes data on subj (reply may be NULL). Checks len against the
 * server's max payload first (less the envelope when the connection seals):
 * SW_EMSGSIZE, nothing sent. A sealing connection seals data for subj
 * (transport/envelope.h) before it goes out. */
sw_err swt_publish(sw_conn *c, const char *subj, const char *reply, const void *data, size_t len);
/* Publishes data as it is, never sealed: only for the plain auth_failed
 * answer to a peer whose sealing does not match ours. */
sw_err swt_publish_plain(sw_conn *c, const char *subj, const char *reply, const void *data,
                         size_t len);
/* Messages this connection refused: sealed when it does not seal, not
 * sealed or not opening when it does. */
uint64_t swt_conn_auth_failures(sw_conn *c);
/* The connection's keys, or NULL when it does not seal (the registry seals
 * its values with them). Valid while c is held (swt_conn_hold). */
struct swt_sealer;
const struct swt_sealer *swt_conn_sealer(sw_conn *c);
void swt_conn_count_auth_failure(sw_conn *c);

/* Timing taps, for the bench's breakdown of an item's latency (nothing
 * else sets one): fn runs just before and just after each publish through
 * swt_publish or swt_publish_plain on c (SWT_TAP_PUB_BEGIN,
 * SWT_TAP_PUB_END, with the bytes as they go out, sealed if c seals), and
 * as each message reaches a live subscription made with swt_subscribe on c
 * (SWT_TAP_RX, before it is opened or looked at, on the thread that then
 * runs the subscription's callback with it). The registry's KV calls on c
 * bypass it. It runs on the publishing thread or nats.c's delivery
 * thread, possibly with library locks held: it must be quick and must not
 * call the library. Set a tap only while none is set, before the traffic
 * it is to see; clear it (fn NULL) after. A call that loaded fn just
 * before the clear may still run, or start, after it: arg must stay valid
 * as long as c is open (a static, say). Unset, each point costs one load. */
typedef enum swt_tap_point { SWT_TAP_PUB_BEGIN, SWT_TAP_PUB_END, SWT_TAP_RX } swt_tap_point;
typedef void (*swt_tap_fn)(void *arg, swt_tap_point at, const uint8_t *data, size_t len);
void swt_conn_set_tap(sw_conn *c, swt_tap_fn fn, void *arg);

/* A received message: a view valid only for the duration of the callback. */
typedef struct swt_msg {
    const char *subject;
    const char *reply; /* NULL if the sender set none */
    const uint8_t *data;
    size_t len;
    int no_responders; /* the server's answer to a request of ours: nobody listens (or a
                          message forged to look like one: never sealed, so only as trusted as
                          the subject it came on) */
    int auth_failed;   /* refused by sealing (data NULL, len 0): it did not open, it was not
                          sealed on a sealing connection, or it was sealed on one that is not;
                          also a "no responders" (no_responders still set) that came on a
                          sealing connection where the server never sends one: a request,
                          control, router probe or heartbeat batch subject.
                          Already counted in swt_conn_auth_failures. */
    int unsealed;      /* with auth_failed: a sealing connection refused it because it was not
                          sealed at all (a plain message; not one that failed to open) */
    const void *impl;  /* internal (swt_msg_header); NULL in a message made by hand */
} swt_msg;
typedef void (*swt_msg_fn)(const swt_msg *m, void *arg);
/* The value of the message's header key (the first, if repeated), or NULL:
 * none, no headers, or a message made by hand. Valid as m is. */
const char *swt_msg_header(const swt_msg *m, const char *key);

/* One subscription. Messages reach fn on a nats.c delivery thread, one at a
 * time and in order; the pending queue is unlimited (flow control bounds it). */
typedef struct swt_sub swt_sub;
sw_err swt_subscribe(sw_conn *c, swt_sub **out, const char *subj, swt_msg_fn fn, void *arg);
/* A new unique inbox subject under c's inbox prefix (sw_conn_opts.
 * inbox_prefix, "_INBOX" by default), as nats.c makes its own: a role that
 * may subscribe only under its prefix can listen on it. SW_EINVAL if it
 * does not fit cap (SWT_SUBJECT_MAX always does). */
sw_err swt_conn_new_inbox(sw_conn *c, char *out, size_t cap);
/* The same as swt_subscribe, for traffic that is never sealed (JetStream's
 * deliveries to the registry): nothing is opened or refused by sealing,
 * and no tap runs. */
sw_err swt_subscribe_plain(sw_conn *c, swt_sub **out, const char *subj, swt_msg_fn fn, void *arg);
/* Messages received and not yet handed to the callback (0 if unknown). */
int swt_sub_pending(swt_sub *s);
/* The subscription's progress (egress/backlog.h): *done messages handled
 * so far, *taken those plus the one in the callback and those queued (the
 * queue read first: a message handed on meanwhile counts twice). */
void swt_sub_progress(swt_sub *s, uint64_t *done, uint64_t *taken);
/* Messages the client library dropped for this subscription. */
uint64_t swt_sub_dropped(swt_sub *s);
/* A subscription keeps the messages its callback has handled and destroys
 * them a batch at a time (32 messages or 256 KiB), which wakes nats.c's
 * garbage collector once a batch rather than once a message. Called from
 * the timer of each owner of subscriptions on c (the router's ticker, the
 * ingress timer): destroys the ones a subscription keeps if no message
 * came since the previous pass, so a quiet subscription holds nothing
 * after two passes. A call within 5 ms of the last pass does nothing (the
 * timers of several owners may share c). Any thread. */
void swt_conn_trim(sw_conn *c);
/* Handled messages one subscription, or all of c's, keep now (tests). */
unsigned swt_sub_kept(swt_sub *s);
unsigned swt_conn_kept(sw_conn *c);
/* Removes a subscription: lets the messages it already has run through its
 * callback (drain, up to 2 s) when connected, unsubscribes at once when
 * not, then destroys it and sets *sub to NULL. Returns 1 when the callback
 * has run for the last time (its arg may be freed); 0 if it may still run:
 * closed from inside its own callback, or nats.c never completed it in
 * 60 s (logged), and then the caller must keep arg. NULL *sub: 1. One not
 * drained (the connection was down, or the drain timed out) keeps nats.c's
 * subscription object until c is destroyed: nats.c 3.4.1's read loop may
 * still hold it (nats.c issue 637). */
int swt_sub_close(sw_conn *c, swt_sub **sub);
/* The first half of swt_sub_close, which does not wait: the server is told
 * at once that the subscription wants no more messages (they go to no one,
 * or to other subscribers), and the ones it already has still run through
 * its callback (drain). While the connection is down it unsubscribes at
 * once instead (nothing is subscribed again on reconnect). The callback may
 * be running when this returns; swt_sub_close later waits for the rest.
 * The caller owns the subscription (no concurrent close). */
void swt_sub_drain_start(sw_conn *c, swt_sub *sub);

/* The monotonic time (ms) of the connection's last reconnect (0 if it never
 * reconnected since it was opened), -1 while it is down: a component that
 * judges peers by silence does not while its own connection is down or has
 * only just come back. */
int64_t swt_conn_up_since_ms(sw_conn *c);

/* An internal listener of the connection's state, for a component that
 * must act at once when the connection comes back (the KV registry's
 * watch) rather than look every few milliseconds. The caller owns the node
 * and keeps it until swt_conn_unlisten. fn(arg, state) runs on nats.c's
 * callback thread at each change, after the application's
 * sw_conn_state_fn, with c's listener lock held: it must only record and
 * signal (take its own leaf lock at most), never call into c or block. */
typedef struct swt_listener {
    void (*fn)(void *arg, sw_conn_state st);
    void *arg;
    struct swt_listener *next;
} swt_listener;
void swt_conn_listen(sw_conn *c, swt_listener *l);
/* Removes l; when it returns, l->fn is not running and is not called
 * again. Not from inside fn. */
void swt_conn_unlisten(sw_conn *c, swt_listener *l);

/* The connection's logger (sw_conn_opts.log), for components on it that
 * are given no logger of their own (the registry's backends). */
const swi_logger *swt_conn_log(sw_conn *c);

/* 1 while the connection is up (not reconnecting, not closed). */
int swt_connected(sw_conn *c);
/* Flushes what was published and waits for the server's answer, if
 * connected; SW_OK, or the error. */
sw_err swt_flush(sw_conn *c, int64_t timeout_ms);

#endif
