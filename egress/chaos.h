/* egress/chaos.h -- test hooks of the frontend side, for the chaos build
 * only (see ingress/chaos.h): they exist in the internal archive
 * sw_internal, which the tests link, and not in the shipped libstreamwire. */
#ifndef SW_EGRESS_CHAOS_H
#define SW_EGRESS_CHAOS_H

#ifndef SW_CHAOS
#error "egress/chaos.h is for the chaos build only (link sw_internal, which defines SW_CHAOS)"
#endif

#include <streamwire/streamwire.h>

/* Test-only: fn(s, arg) runs on the thread about to send a CREDIT for a
 * stream of r, after the credit was decided (and the stream's lock
 * released) and before it is addressed to the stream's worker: a test can
 * hold that thread there, as a preemption would, while the stream
 * migrates. NULL removes it. Set it before any stream is open. */
void swx_router_on_credit(sw_router *r, void (*fn)(sw_stream *s, void *arg), void *arg);

/* Test-only: fn(s, arg) runs on the thread in sw_router_open once the
 * request is published, before the call returns: what arrives meanwhile
 * is delivered from the router's ticker thread, not the thread that
 * received it. A test can hold the opener there. NULL removes it. Set it
 * before any stream is open. */
void swx_router_on_open_sent(sw_router *r, void (*fn)(sw_stream *s, void *arg), void *arg);

/* Test-only: fn(s, arg) runs on the thread re-routing a stream of r whose
 * request met "no responders" (the mux's delivery thread), after the
 * stream was checked and the instance quarantined, before the stream is
 * checked again and switched: a test can hold that thread there while the
 * stream migrates. NULL removes it. Set it before any stream is open. */
void swx_router_on_reroute(sw_router *r, void (*fn)(sw_stream *s, void *arg), void *arg);

/* Test-only: how many times r's ticker has run (a resting router's stays
 * put: egress/timer.c). */
uint64_t swx_router_ticks(sw_router *r);

/* Test-only: s's current request id (16 bytes; a migration changes it). */
void swx_stream_id(sw_stream *s, uint8_t out[16]);
/* Test-only: hands s one data item (seq, the string data) as the mux does
 * an item of a message received under request id `id`, with the
 * reference its lookup would hold. */
void swx_stream_feed(sw_stream *s, const uint8_t id[16], uint64_t seq, const char *data);
/* Test-only: the same with the worker's final (seq, status, reason). */
void swx_stream_feed_final(sw_stream *s, const uint8_t id[16], uint64_t seq, sw_status status,
                           const char *reason);

/* Test-only: fn(s, arg) runs on every thread about to deliver what is ready
 * for a callback-mode stream of r through swe_dispatch (a decision made and
 * its lock released: a terminal decided on the probe thread, a final
 * whose acknowledgement is queued), before it takes the stream's lock: a
 * test can hold that thread there, as a preemption would, while the
 * stream is closed. NULL removes it. Set it before any stream is open. */
void swx_router_on_dispatch(sw_router *r, void (*fn)(sw_stream *s, void *arg), void *arg);

#endif
