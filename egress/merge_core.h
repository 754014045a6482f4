/* egress/merge_core.h -- the pure state machine of sw_merge (ordered fan-in
 * by processed index): per-stream queues, the reference, frames. No I/O,
 * no threads, no locks: the driver (egress/merge.c) feeds it items and
 * stream ends and asks what to do next; tests/unit/test_merge_core.c runs
 * it without a server. */
#ifndef SW_EGRESS_MERGE_CORE_H
#define SW_EGRESS_MERGE_CORE_H

#include <stddef.h>
#include <stdint.h>

/* A queued item (one allocation: the struct, its data, its event name). */
typedef struct swm_item {
    struct swm_item *next;
    uint64_t start, index;
    size_t len;
    size_t size; /* the allocation, counted in swm_core.bytes while queued */
    const char *event;
    uint8_t data[];
} swm_item;

typedef struct swm_lane {
    swm_item *head, *tail;
    size_t n;
    int ended; /* its terminal arrived: no more items */
} swm_lane;

typedef struct swm_core {
    swm_lane *lanes;
    size_t n, cap;
    size_t bytes;       /* the queued items' allocations, all lanes */
    uint64_t reference; /* the last frame's (the largest swm_core_take was given) */
    int framed;         /* swm_core_take was called: reference is set */
} swm_core;

/* A new queued item: data copied, event copied ("" for NULL). NULL without memory. */
swm_item *swm_item_new(uint64_t start, uint64_t index, const void *data, size_t len,
                       const char *event);

void swm_core_init(swm_core *c);
/* One more lane (stream); its number is returned in *lane. 0, or -1 without memory. */
int swm_core_add(swm_core *c, size_t *lane);
/* Appends an item to a lane (takes it); c->bytes grows by it->size. */
void swm_core_push(swm_core *c, size_t lane, swm_item *it);
/* The lane's stream ended (completed or incomplete): it adds nothing more. */
void swm_core_end(swm_core *c, size_t lane);

enum { SWM_NEED = 1, SWM_FRAME = 2, SWM_DONE = 3 };
/* What comes next: SWM_NEED (lane *need must get an item, or end),
 * SWM_FRAME (a frame up to *reference can be taken), SWM_DONE (every lane
 * ended and nothing is queued). An item at or below the last frame's
 * reference (an overlapping chunk that went back, read after the frame that
 * took the item before it) is already covered: it sets no reference and
 * goes with the next frame. References never decrease: once every lane
 * ended, such items left over go in a frame at the last reference. */
int swm_core_step(const swm_core *c, size_t *need, uint64_t *reference);
/* Takes lane's items at the front whose index is <= reference: returns the
 * first (a list by next; the caller frees each) and their count in *n;
 * c->bytes no longer counts them; reference is the last frame's from now. */
swm_item *swm_core_take(swm_core *c, size_t lane, uint64_t reference, size_t *n);
/* Frees every queued item and the lanes. */
void swm_core_fini(swm_core *c);

#endif
