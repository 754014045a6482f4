/* transport/chaos.h -- fault-injection hooks of the transport, for tests.
 * Chaos build only (sw_internal, -DSW_CHAOS=1): never in the shipped
 * libraries. Thread-safe. */
#ifndef SW_TRANSPORT_CHAOS_H
#define SW_TRANSPORT_CHAOS_H

#ifndef SW_CHAOS
#error "transport/chaos.h is for the chaos build only (link sw_internal, which defines SW_CHAOS)"
#endif

#include <streamwire/streamwire.h>

/* The next n subscriptions made on c fail as if the connection had closed
 * between nats.c's subscribe and the completion callback being set: each
 * waits (up to 2 s) until its handler is running on a first message, then
 * fails with the status nats.c gives a closed subscription. */
void swx_conn_fail_sub_complete(sw_conn *c, int n);

/* The next n publishes on c to a subject that starts with prefix fail
 * with nats_status (a natsStatus) and send nothing, as a publish nats.c
 * refused would (a connection closed or broken meanwhile). Set once, before
 * the publishes it is for. */
void swx_conn_fail_publishes(sw_conn *c, const char *prefix, int n, int nats_status);

/* How many of those are still to fail. */
int swx_conn_publishes_to_fail(sw_conn *c);

#endif
