/* ingress/ring.c -- the resend ring (see ring.h): a pure state machine, no
 * locks, threads, clock, I/O or logging. Its caller serialises access. */
#include <stdlib.h>
#include <string.h>

#include "ingress/ring.h"

int
swn_ring_init(swn_ring *g, uint32_t window)
{
    g->slot = NULL;
    g->cap = 0;
    g->window = window;
    g->next_seq = 1;
    g->pub_seq = 0;
    g->built = 0;
    g->acked = 0;
    g->ch_head = g->ch_tail = NULL;
    g->ch_next = SWN_CHUNK_MIN;
    if (window == 0)
        return 0;
    g->cap = (size_t)window + 1 < SWN_RING_MIN ? (size_t)window + 1 : SWN_RING_MIN;
    if ((g->slot = calloc(g->cap, sizeof(*g->slot))) == NULL) {
        g->cap = 0;
        return -1;
    }
    return 0;
}

/* Frees the chunks from the oldest while every body in them is at or
 * below upto (all of them: UINT64_MAX). A chunk with no body yet (room
 * never committed) has last 0 and goes too. Once none is left, the next
 * chunk is sized to the bytes the chunks freed here held (at least
 * SWN_CHUNK_MIN, rounded up to a power of two, at most SWN_CHUNK_MAX): a
 * stream acknowledged item by item takes small chunks, not the largest
 * size its growth once reached. */
static void
ring_release(swn_ring *g, uint64_t upto)
{
    swn_chunk *c;
    size_t freed = 0;
    while ((c = g->ch_head) != NULL && c->last <= upto) {
        g->ch_head = c->next;
        freed += c->used;
        free(c);
    }
    if (g->ch_head == NULL) {
        g->ch_tail = NULL;
        g->ch_next = SWN_CHUNK_MIN;
        while (g->ch_next < freed && g->ch_next < SWN_CHUNK_MAX)
            g->ch_next *= 2;
    }
}

void
swn_ring_free(swn_ring *g)
{
    ring_release(g, UINT64_MAX);
    free(g->slot);
    g->slot = NULL;
    g->cap = 0;
}

/* Grows the ring so that seqs acked+1 .. seq fit: at most window + 1 slots
 * (the window's items plus the final). 0 ok, -1 no room or no memory. */
static int
ring_fit(swn_ring *g, uint64_t seq)
{
    size_t need = (size_t)(seq - g->acked), ncap = g->cap;
    size_t limit = (size_t)g->window + 1;
    swn_slot *nr;
    if (need <= g->cap)
        return 0;
    /* issue 11: reached when the frontend grants credit beyond acked +
     * window (a CREDIT with a huge limit): send then fails with SW_ENOMEM
     * instead of the credit being clamped to the window. */
    if (g->cap >= limit)
        return -1;
    while (ncap < need && ncap < limit)
        ncap *= 2;
    if (ncap > limit)
        ncap = limit;
    if ((nr = calloc(ncap, sizeof(*nr))) == NULL)
        return -1;
    for (size_t i = 0; i < g->cap; i++)
        if (g->slot[i].buf != NULL)
            nr[g->slot[i].seq % ncap] = g->slot[i];
    free(g->slot);
    g->slot = nr;
    g->cap = ncap;
    return 0;
}

uint8_t *
swn_ring_room(swn_ring *g, uint64_t seq, size_t len)
{
    swn_chunk *c = g->ch_tail;
    size_t cap;
    if (g->slot == NULL || seq <= g->acked || ring_fit(g, seq) != 0 ||
        g->slot[seq % g->cap].buf != NULL)
        return NULL;
    if (c != NULL && c->cap - c->used >= len)
        return c->mem + c->used;
    cap = g->ch_next > len ? g->ch_next : len;
    if (cap > SIZE_MAX - sizeof(*c) || (c = malloc(sizeof(*c) + cap)) == NULL)
        return NULL;
    c->next = NULL;
    c->last = 0;
    c->used = 0;
    c->cap = cap;
    if (g->ch_tail != NULL)
        g->ch_tail->next = c;
    else
        g->ch_head = c;
    g->ch_tail = c;
    if (g->ch_next < SWN_CHUNK_MAX)
        g->ch_next = 2 * g->ch_next < SWN_CHUNK_MAX ? 2 * g->ch_next : SWN_CHUNK_MAX;
    return c->mem;
}

void
swn_ring_commit(swn_ring *g, uint64_t seq, size_t len, int lose)
{
    swn_chunk *c = g->ch_tail;
    swn_slot *sl = &g->slot[seq % g->cap];
    sl->seq = seq;
    sl->buf = c->mem + c->used;
    sl->len = len;
    sl->lose = lose;
    c->used += len;
    if (seq > c->last)
        c->last = seq;
}

sw_err
swn_ring_keep(swn_ring *g, uint64_t seq, const uint8_t *buf, size_t len, int lose)
{
    uint8_t *p = swn_ring_room(g, seq, len);
    if (p == NULL)
        return SW_ENOMEM;
    if (len)
        memcpy(p, buf, len);
    swn_ring_commit(g, seq, len, lose);
    return SW_OK;
}

const uint8_t *
swn_ring_get(const swn_ring *g, uint64_t seq, size_t *len, int *lose)
{
    const swn_slot *sl;
    if (g->slot == NULL)
        return NULL;
    sl = &g->slot[seq % g->cap];
    if (sl->seq != seq || sl->buf == NULL)
        return NULL;
    if (len != NULL)
        *len = sl->len;
    if (lose != NULL)
        *lose = sl->lose;
    return sl->buf;
}

uint64_t
swn_ring_ack(swn_ring *g, uint64_t ack)
{
    /* Nobody can have received what has not gone out (issue 11 #12: an ACK
     * used to free items still queued). Not pub_seq alone: a frontend can
     * ack items of a message whose publisher, mu dropped, has not moved
     * pub_seq past them yet; `built` covers those, and their bodies were
     * copied into the message already. */
    uint64_t out = g->pub_seq > g->built ? g->pub_seq : g->built;
    if (ack > out)
        ack = out;
    if (ack <= g->acked)
        return ack;
    if (g->slot != NULL) {
        if (ack - g->acked >= g->cap) {
            /* A jump past the whole ring: free every body up to ack (a
             * skipped number or an unkept final can leave older ones). */
            for (size_t i = 0; i < g->cap; i++) {
                swn_slot *s = &g->slot[i];
                if (s->buf != NULL && s->seq <= ack) {
                    s->buf = NULL;
                    s->seq = 0;
                }
            }
        } else {
            for (uint64_t q = g->acked + 1; q <= ack; q++) {
                swn_slot *s = &g->slot[q % g->cap];
                if (s->seq == q) {
                    s->buf = NULL;
                    s->seq = 0;
                }
            }
        }
    }
    g->acked = ack;
    ring_release(g, ack);
    return ack;
}

int
swn_ring_resend_range(const swn_ring *g, uint64_t *from, uint64_t *to)
{
    /* Only what went out: queued items are on their way anyway. */
    if (*to > g->pub_seq)
        *to = g->pub_seq;
    if (*from <= g->acked)
        *from = g->acked + 1;
    return g->slot != NULL && *from <= *to;
}
