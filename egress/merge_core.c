/* egress/merge_core.c -- the pure state machine of sw_merge (see
 * merge_core.h and include/streamwire/merge.h for the strategy). */
#include <stdlib.h>
#include <string.h>

#include "egress/merge_core.h"

swm_item *
swm_item_new(uint64_t start, uint64_t index, const void *data, size_t len, const char *event)
{
    size_t el = event ? strlen(event) : 0;
    size_t size = sizeof(swm_item) + len + el + 1;
    swm_item *it = malloc(size);
    if (it == NULL)
        return NULL;
    it->next = NULL;
    it->size = size;
    it->start = start;
    it->index = index;
    it->len = len;
    if (len)
        memcpy(it->data, data, len);
    memcpy(it->data + len, el ? event : "", el);
    it->data[len + el] = '\0';
    it->event = (const char *)it->data + len;
    return it;
}

void
swm_core_init(swm_core *c)
{
    memset(c, 0, sizeof(*c));
}

int
swm_core_add(swm_core *c, size_t *lane)
{
    if (c->n == c->cap) {
        size_t ncap = c->cap ? 2 * c->cap : 4;
        swm_lane *nl = realloc(c->lanes, ncap * sizeof(*nl));
        if (nl == NULL)
            return -1;
        c->lanes = nl;
        c->cap = ncap;
    }
    memset(&c->lanes[c->n], 0, sizeof(c->lanes[0]));
    *lane = c->n++;
    return 0;
}

void
swm_core_push(swm_core *c, size_t lane, swm_item *it)
{
    swm_lane *l = &c->lanes[lane];
    it->next = NULL;
    if (l->tail)
        l->tail->next = it;
    else
        l->head = it;
    l->tail = it;
    l->n++;
    c->bytes += it->size;
}

void
swm_core_end(swm_core *c, size_t lane)
{
    c->lanes[lane].ended = 1;
}

/* The lane's first item past the last frame's reference (the first of all
 * before the first frame), or NULL: the items before it went back. */
static const swm_item *
lane_lead(const swm_core *c, const swm_lane *l)
{
    const swm_item *it = l->head;
    if (c->framed)
        while (it != NULL && it->index <= c->reference)
            it = it->next;
    return it;
}

int
swm_core_step(const swm_core *c, size_t *need, uint64_t *reference)
{
    uint64_t ref = 0;
    int any = 0, queued = 0;
    /* 1. every lane that goes on has an item past the last reference (its
     * lead); the reference is the largest lead */
    for (size_t i = 0; i < c->n; i++) {
        const swm_lane *l = &c->lanes[i];
        const swm_item *lead = lane_lead(c, l);
        if (lead == NULL && !l->ended) {
            *need = i;
            return SWM_NEED;
        }
        if (lead != NULL && (!any || lead->index > ref)) {
            ref = lead->index;
            any = 1;
        }
        if (l->head != NULL)
            queued = 1;
    }
    if (!any) {
        if (!queued)
            return SWM_DONE; /* every lane ended, nothing queued */
        /* every lane ended with items that went back: the last of them */
        *reference = c->reference;
        return SWM_FRAME;
    }
    /* 2. every lane that goes on has reached the reference */
    for (size_t i = 0; i < c->n; i++) {
        const swm_lane *l = &c->lanes[i];
        int reached = 0;
        if (l->ended)
            continue;
        for (const swm_item *it = l->head; it != NULL; it = it->next)
            if (it->index >= ref) {
                reached = 1;
                break;
            }
        if (!reached) {
            *need = i;
            return SWM_NEED;
        }
    }
    *reference = ref;
    return SWM_FRAME;
}

swm_item *
swm_core_take(swm_core *c, size_t lane, uint64_t reference, size_t *n)
{
    swm_lane *l = &c->lanes[lane];
    swm_item *first = l->head, *last = NULL, *it = l->head;
    *n = 0;
    if (!c->framed || reference > c->reference)
        c->reference = reference;
    c->framed = 1;
    while (it != NULL && it->index <= reference) {
        c->bytes -= it->size;
        last = it;
        it = it->next;
        (*n)++;
    }
    if (last == NULL)
        return NULL;
    l->head = it;
    if (it == NULL)
        l->tail = NULL;
    last->next = NULL;
    l->n -= *n;
    return first;
}

void
swm_core_fini(swm_core *c)
{
    for (size_t i = 0; i < c->n; i++) {
        swm_item *it = c->lanes[i].head;
        while (it != NULL) {
            swm_item *nx = it->next;
            free(it);
            it = nx;
        }
    }
    free(c->lanes);
    memset(c, 0, sizeof(*c));
}
