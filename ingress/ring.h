/* ingress/ring.h -- one stream's resend ring and sequence bookkeeping, as a
 * pure state machine: no locks, no clock, no I/O, no logging, no atomics.
 * The responder (ingress/responder.c and friends) wraps it with r->mu and
 * does the publishing.
 *
 * Sequence numbers: next_seq is the next one to assign; acked+1 .. pub_seq
 * went out; pub_seq+1 .. next_seq-1 are queued, kept in the ring until they
 * are published (and then kept for resend until acknowledged). A stream
 * without flow control (window 0) keeps nothing: slot == NULL, and only the
 * counters are used.
 *
 * Memory: the ring grows (doubling, seq % cap) up to window + 1 slots: the
 * window's items plus the final. */
#ifndef SW_INGRESS_RING_H
#define SW_INGRESS_RING_H

#include <stddef.h>
#include <stdint.h>

#include <streamwire/streamwire.h>

#define SWN_RING_MIN 16 /* slots at first: most streams never have many unacked */

typedef struct swn_slot {
    uint64_t seq;
    uint8_t *buf; /* the item's body; NULL: free (or a skipped number) */
    size_t len;
    int lose; /* chaos loss injection: left out of its first publish */
} swn_slot;

typedef struct swn_ring {
    swn_slot *slot; /* NULL without flow control */
    size_t cap;
    uint32_t window;   /* the ring holds at most window + 1 slots */
    uint64_t next_seq; /* next sequence number to assign */
    uint64_t pub_seq;  /* every seq <= pub_seq went out (or was given up) */
    uint64_t built;    /* every seq <= built was copied into a message that goes out */
    uint64_t acked;    /* every seq <= acked was received by the frontend */
} swn_ring;

/* Sets up an empty ring for a stream with this credit window (0: no flow
 * control, nothing is ever kept). next_seq 1, nothing published or acked.
 * 0 ok, -1 no memory. */
int swn_ring_init(swn_ring *g, uint32_t window);

/* Frees every kept body and the slots. */
void swn_ring_free(swn_ring *g);

/* 1 if the ring keeps items (flow control), 0 otherwise. */
static inline int
swn_ring_keeps(const swn_ring *g)
{
    return g->slot != NULL;
}

/* 1 if items wait to be published for the first time
 * (pub_seq+1 .. next_seq-1). */
static inline int
swn_ring_queued(const swn_ring *g)
{
    return g->pub_seq + 1 < g->next_seq;
}

/* Keeps the body of item seq (slots set). Takes ownership of buf on
 * success; SW_ENOMEM if the ring cannot hold it (beyond window + 1 unacked
 * slots, the slot taken, or no memory): nothing changed, buf still the
 * caller's. Does not assign seq: the caller moves next_seq. */
sw_err swn_ring_keep(swn_ring *g, uint64_t seq, uint8_t *buf, size_t len, int lose);

/* The kept body of seq, or NULL (not kept: acked, skipped, never kept, or
 * overwritten). *len and *lose (if not NULL) describe it. */
const uint8_t *swn_ring_get(const swn_ring *g, uint64_t seq, size_t *len, int *lose);

/* An acknowledgement: every seq <= ack was received. ack is clamped to
 * next_seq - 1 (nobody can have received what does not exist; not to
 * pub_seq: see ring.c). Frees the bodies up to it; an ack that goes
 * backwards changes nothing. Returns the clamped ack. */
uint64_t swn_ring_ack(swn_ring *g, uint64_t ack);

/* Clamps a resend range to what went out and is not acknowledged:
 * to <= pub_seq, from >= acked + 1. 1 if something is left (and the ring
 * keeps items), 0 if not. */
int swn_ring_resend_range(const swn_ring *g, uint64_t *from, uint64_t *to);

#endif
