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
 * window's items plus the final. The bodies are written one after another
 * into chunks (issue 17: a malloc an item, freed on another thread by the
 * ack, cost the worker ~200 instructions an item at 64 B and ~550 at 1 KiB):
 * a chunk takes 512 bytes at first, twice the last one's size after that,
 * at most SWN_CHUNK_MAX, or exactly one body larger than that; a body that
 * does not fit the last chunk's room starts a new one. A chunk goes when
 * every body in it is acknowledged (acks are cumulative, so chunks go in
 * order), and a stream with nothing unacknowledged holds no chunk. Once the
 * last chunk goes, sizes start again from what the freed chunks held (at
 * least 512, a power of two): a stream acknowledged item by item keeps
 * taking small chunks, and one acknowledged a window at a time one chunk
 * about its window's bytes. Bound:
 * the chunks hold at most 2 x the unacknowledged bodies' bytes +
 * 2 x SWN_CHUNK_MAX (the acknowledged start of the oldest chunk, the unused
 * end of the newest, and each chunk's unused end is smaller than the body
 * that began the next; test_ring `chunk_bound_random`). */
#ifndef SW_INGRESS_RING_H
#define SW_INGRESS_RING_H

#include <stddef.h>
#include <stdint.h>

#include <streamwire/streamwire.h>

#define SWN_RING_MIN 16     /* slots at first: most streams never have many unacked */
#define SWN_CHUNK_MIN 512   /* a stream's first chunk of bodies */
#define SWN_CHUNK_MAX 16384 /* chunks grow (doubling) up to this */

/* Bodies written one after another; see "Memory" above. */
typedef struct swn_chunk {
    struct swn_chunk *next; /* the next newer chunk */
    uint64_t last;          /* the highest seq with a body here; 0: none yet */
    size_t used, cap;
    uint8_t mem[];
} swn_chunk;

typedef struct swn_slot {
    uint64_t seq;
    uint8_t *buf; /* the item's body, in a chunk; NULL: free (or a skipped number) */
    size_t len;
    int lose; /* chaos loss injection: left out of its first publish */
} swn_slot;

typedef struct swn_ring {
    swn_slot *slot; /* NULL without flow control */
    size_t cap;
    uint32_t window;              /* the ring holds at most window + 1 slots */
    uint64_t next_seq;            /* next sequence number to assign */
    uint64_t pub_seq;             /* every seq <= pub_seq went out (or was given up) */
    uint64_t built;               /* every seq <= built was copied into a message that goes out */
    uint64_t acked;               /* every seq <= acked was received by the frontend */
    swn_chunk *ch_head, *ch_tail; /* oldest and newest chunk of bodies, or NULL */
    size_t ch_next;               /* the size of the next chunk (before a larger body) */
} swn_ring;

/* Sets up an empty ring for a stream with this credit window (0: no flow
 * control, nothing is ever kept). next_seq 1, nothing published or acked.
 * 0 ok, -1 no memory. */
int swn_ring_init(swn_ring *g, uint32_t window);

/* Frees every kept body (the chunks) and the slots. */
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

/* Room for the body of item seq, len bytes, at the end of the newest
 * chunk (a new chunk if it has too little): the caller writes the body
 * there and keeps it with swn_ring_commit(g, seq, len, lose) before any
 * other call on g. NULL if the ring cannot keep seq (no flow control,
 * beyond window + 1 unacked slots, the slot taken) or no memory: nothing
 * kept. Room asked for and not committed is handed out again. */
uint8_t *swn_ring_room(swn_ring *g, uint64_t seq, size_t len);

/* Keeps the body just written into swn_ring_room(g, seq, len) as item
 * seq's (the slot set). Does not assign seq: the caller moves next_seq. */
void swn_ring_commit(swn_ring *g, uint64_t seq, size_t len, int lose);

/* swn_ring_room, a copy of buf, swn_ring_commit: buf stays the caller's.
 * SW_ENOMEM if the ring cannot keep seq (as swn_ring_room): nothing
 * changed. */
sw_err swn_ring_keep(swn_ring *g, uint64_t seq, const uint8_t *buf, size_t len, int lose);

/* The kept body of seq, or NULL (not kept: acked, skipped, never kept, or
 * overwritten). *len and *lose (if not NULL) describe it. */
const uint8_t *swn_ring_get(const swn_ring *g, uint64_t seq, size_t *len, int *lose);

/* An acknowledgement: every seq <= ack was received. ack is clamped to
 * the larger of pub_seq and built (nobody can have received what has not
 * gone out; see ring.c). Lets go of the bodies up to it and frees every
 * chunk that holds no other; an ack that goes backwards changes nothing.
 * Returns the clamped ack. */
uint64_t swn_ring_ack(swn_ring *g, uint64_t ack);

/* Clamps a resend range to what went out and is not acknowledged:
 * to <= pub_seq, from >= acked + 1. 1 if something is left (and the ring
 * keeps items), 0 if not. */
int swn_ring_resend_range(const swn_ring *g, uint64_t *from, uint64_t *to);

#endif
