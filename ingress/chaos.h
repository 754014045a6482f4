/* ingress/chaos.h -- fault-injection hooks for tests and the CLI's demo
 * worker (--chaos, --hang-after). Not part of the public API: they let a
 * worker break the protocol on purpose so the egress's synthesized terminals
 * can be exercised for real. All are thread-safe.
 *
 * Chaos build only: they exist in the internal archive sw_internal (objects
 * compiled with -DSW_CHAOS=1, plus ingress/chaos.c), which the CLI, the tests
 * and the bench link; the shipped libstreamwire (.so and .a) has none of
 * them, nor the hot-path checks they drive. */
#ifndef SW_INGRESS_CHAOS_H
#define SW_INGRESS_CHAOS_H

#ifndef SW_CHAOS
#error "ingress/chaos.h is for the chaos build only (link sw_internal, which defines SW_CHAOS)"
#endif

#include <streamwire/streamwire.h>

/* Publishes raw bytes on the stream's response subject (garbage). */
sw_err swx_responder_publish_raw(sw_responder *r, const void *bytes, size_t len);

/* Consumes one sequence number without sending it (a gap that can never be
 * repaired: the skipped number is not kept for resend). */
sw_err swx_responder_skip_seq(sw_responder *r);

/* The next data item or final this stream queues is kept for resend but left
 * out of its first publish, as if NATS had lost it (a lost final: the
 * frontend learns of it from the heartbeats that go on until the final is
 * acknowledged). Needs flow control (a credit window). */
void swx_responder_lose_next(sw_responder *r);

/* The next n messages this stream builds for a first publish fail as if
 * there were no memory for them: the drain stops and leaves the items queued
 * ("stranded") for the timer to publish on its next tick, as a real
 * allocation failure would. Needs flow control (a credit window). */
void swx_responder_fail_builds(sw_responder *r, int n);

/* The final this stream queues next finds no memory to be kept for
 * resend, as a failed allocation of its chunk would: it is published at
 * once, unkept, after whatever can be published before it. Needs flow
 * control (a credit window). */
void swx_responder_fail_final_keep(sw_responder *r);

/* Marks the stream finished without publishing anything more: no heartbeats,
 * no final marker (--hang-after, --chaos no-final). */
void swx_responder_abandon(sw_responder *r);

/* After a terminal was sent, publishes one more data item with the next
 * sequence number (--chaos after-final). SW_EBUSY if no terminal was sent. */
sw_err swx_responder_send_after_final(sw_responder *r, const void *data, size_t len);

/* Test-only loss injection: drop this fraction (0..1) of first-time data
 * publishes on this ingress (resends are never dropped). Also settable with
 * the environment variable SW_TEST_DROP_RATE at sw_ingress_start (chaos build
 * only). */
void swx_ingress_set_drop_rate(sw_ingress *ing, double rate);

/* Test-only: the next n CANCEL/KILL controls this ingress receives are
 * dropped as if the bus had lost them (chaos build only). */
void swx_ingress_drop_cancels(sw_ingress *ing, int n);

/* Test-only: while on is 1, every heartbeat this ingress sends (a beat in
 * a HeartbeatBatch, or a stalled stream's heartbeat wrapper) is lost as if
 * the bus had dropped it: the worker goes on as though it went out (chaos
 * build only). */
void swx_ingress_drop_beats(sw_ingress *ing, int on);

/* Test-only: while on is 1, every PROBE naming a stream (a frontend's
 * stream probe) that reaches this ingress is lost as if the bus had
 * dropped it: not answered. Instance probes are answered as usual (chaos
 * build only). */
void swx_ingress_drop_stream_probes(sw_ingress *ing, int on);

/* Test-only: every answer to a stream probe claims n items more than went
 * out (ProbeReply.last_seq = pub_seq + n), as a worker from before
 * 2026-12-07 did when items it had numbered were still waiting to be sent.
 * 0 answers truly again (chaos build only). */
void swx_ingress_probe_seq_ahead(sw_ingress *ing, uint64_t n);

/* Test-only: while hold is 1, the sender thread takes no stream off its
 * queue (streams handed to it wait; see ingress/sender.c), so a test can
 * see which thread publishes what. 0 lets it go on (chaos build only). */
void swx_ingress_hold_sender(sw_ingress *ing, int hold);

/* Test-only counts since the ingress started: calls of its timer's tick
 * and of its liveness ticker's (each rests while it has nothing to do:
 * ingress/heartbeat.c, liveness.c). Either pointer may be NULL. */
void swx_ingress_tick_counts(sw_ingress *ing, uint64_t *timer, uint64_t *live);

/* Test-only counts since the ingress started: streams handed to the sender
 * thread, and runs of an inline handler's held items that the timer
 * published (ingress/sender.c). Either pointer may be NULL. */
void swx_ingress_send_counts(sw_ingress *ing, uint64_t *handoffs, uint64_t *timer_releases);

/* The frontends the liveness probe covers now (liveness.c's table), and in
 * *users (if not NULL) the streams counted for router_id (0 if it is not
 * in the table). */
size_t swx_ingress_frontends(sw_ingress *ing, const char *router_id, unsigned *users);

/* Test-only: the CANCELs and KILLs the ingress remembers for requests not
 * seen yet (early cancels, ingress/control.c), expired ones included. */
size_t swx_ingress_early_cancels(sw_ingress *ing);

/* Test-only: the bytes of request payloads and headers the ingress keeps
 * (each from the request's arrival until its responder's last release). */
uint64_t swx_ingress_request_bytes(sw_ingress *ing);

/* Test-only: the most bytes the ingress puts in one message of items
 * (ing->batch_bytes: SWN_BATCH_BYTES, or SWN_BATCH_BYTES_SEALED on a
 * sealing connection; the max payload may cap it further). */
size_t swx_ingress_batch_bytes(sw_ingress *ing);

/* Test-only: an inline handler's hold window (ingress/sender.c resp_hold)
 * becomes us microseconds (0: no hold), whatever the connection's mode; set
 * before the first request (chaos build only). */
void swx_ingress_set_hold_us(sw_ingress *ing, int64_t us);

/* Test-only: fn(router_id, arg) is called on the thread that judged a
 * frontend gone (ingress/liveness.c: a probe answered "no responders", or
 * probes unanswered), once its entry has left the table of frontends and
 * before its streams are cancelled. NULL: none (chaos build only). */
typedef void (*swx_ingress_gone_fn)(const char *router_id, void *arg);
void swx_ingress_on_frontend_gone(sw_ingress *ing, swx_ingress_gone_fn fn, void *arg);

/* Test-only: every sw_ingress_start of this process calls fn(conn,
 * request subject, arg) once its request subscription is made, before it
 * has the server's answer to its subscriptions (a request may arrive in
 * between, and start may still fail). NULL: none (chaos build only). */
typedef void (*swx_ingress_subscribed_fn)(sw_conn *conn, const char *req_subj, void *arg);
void swx_ingress_on_subscribed(swx_ingress_subscribed_fn fn, void *arg);

#endif
