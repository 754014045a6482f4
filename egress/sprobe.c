/* egress/sprobe.c -- see sprobe.h. Pure: no locks, no clock, no I/O. */
#include <stdlib.h>
#include <string.h>

#include "egress/sprobe.h"

#define SPROBE_MASK (SWE_SPROBE_BIT - 1)
#define SPROBE_FIRST_CAP 64
#define TAG_BIT UINT32_C(0x80000000)
#define TAG_POS UINT32_C(0x7fffffff)

static swe_sprobe *
slot(const swe_sprobes *t, uint64_t pos)
{
    return &t->v[pos & (t->cap - 1)];
}

static uint64_t
pid_of(const swe_sprobes *t, uint64_t pos)
{
    return SWE_SPROBE_BIT | ((t->base + pos) & SPROBE_MASK);
}

/* A tag names a position by its low 31 bits (never 0: the top bit is
 * set): the positions in the ring span at most SWE_SPROBES_MAX. */
static uint32_t
tag_of(uint64_t pos)
{
    return TAG_BIT | (uint32_t)(pos & TAG_POS);
}

/* The position that tag names among those in the ring, or UINT64_MAX. */
static uint64_t
pos_of_tag(const swe_sprobes *t, uint32_t tag)
{
    uint32_t dist;
    if ((tag & TAG_BIT) == 0 || t->v == NULL)
        return UINT64_MAX;
    dist = ((uint32_t)t->tail - (tag & TAG_POS)) & TAG_POS; /* tail - pos, mod 2^31 */
    if (dist == 0 || dist > t->tail - t->head)
        return UINT64_MAX;
    return t->tail - dist;
}

static void
release(swe_sprobes *t, swe_sprobe *e)
{
    e->probe_id = 0;
    t->live--;
}

/* Moves head past the entries dropped or expired at now (INT64_MIN: none
 * expires), and frees the ring once nothing is out. */
static void
trim(swe_sprobes *t, int64_t now)
{
    while (t->head < t->tail) {
        swe_sprobe *e = slot(t, t->head);
        if (e->probe_id != 0) {
            if (now < e->expires_ms)
                break;
            release(t, e);
        }
        t->head++;
    }
    if (t->live == 0 && t->v != NULL) {
        free(t->v);
        t->v = NULL;
        t->cap = 0;
        t->head = t->tail;
    }
}

/* Room for one more: the ring doubles (the first: SPROBE_FIRST_CAP) up to
 * SWE_SPROBES_MAX. 0, or -1 full or out of memory. */
static int
grow(swe_sprobes *t)
{
    size_t ncap = t->cap != 0 ? 2 * t->cap : SPROBE_FIRST_CAP;
    swe_sprobe *nv;
    if (t->v != NULL && t->tail - t->head < t->cap)
        return 0;
    if (ncap > SWE_SPROBES_MAX || (nv = calloc(ncap, sizeof(*nv))) == NULL)
        return -1;
    /* the positions span less than the old size: distinct slots in the new */
    for (uint64_t p = t->head; p < t->tail; p++)
        nv[p & (ncap - 1)] = *slot(t, p);
    free(t->v);
    t->v = nv;
    t->cap = ncap;
    return 0;
}

void
swe_sprobes_init(swe_sprobes *t, uint64_t base)
{
    memset(t, 0, sizeof(*t));
    t->base = base;
}

void
swe_sprobes_fini(swe_sprobes *t)
{
    free(t->v);
    memset(t, 0, sizeof(*t));
}

void
swe_sprobes_drop(swe_sprobes *t, uint32_t tag, const uint8_t id[SW_REQUEST_ID_BYTES])
{
    uint64_t pos = pos_of_tag(t, tag);
    swe_sprobe *e;
    if (pos == UINT64_MAX)
        return;
    e = slot(t, pos);
    if (e->probe_id == pid_of(t, pos) && memcmp(e->id, id, SW_REQUEST_ID_BYTES) == 0) {
        release(t, e);
        trim(t, INT64_MIN);
    }
}

uint64_t
swe_sprobes_add(swe_sprobes *t, const uint8_t id[SW_REQUEST_ID_BYTES], uint32_t *tag, int64_t now)
{
    uint64_t pos;
    swe_sprobe *e;
    trim(t, now);
    if (grow(t) != 0)
        return 0;
    pos = t->tail++;
    e = slot(t, pos);
    e->probe_id = pid_of(t, pos);
    e->expires_ms = now + SWE_SPROBE_TTL_MS; /* (the same for all: they expire in order) */
    memcpy(e->id, id, SW_REQUEST_ID_BYTES);
    t->live++;
    *tag = tag_of(pos);
    return e->probe_id;
}

/* The position of an answer's probe id if it is out and not expired at
 * now, or UINT64_MAX. */
static uint64_t
find(const swe_sprobes *t, uint64_t probe_id, int64_t now)
{
    uint64_t pos;
    if (!swe_sprobe_is(probe_id) || t->v == NULL)
        return UINT64_MAX;
    pos = ((probe_id & SPROBE_MASK) - t->base) & SPROBE_MASK;
    if (pos < t->head || pos >= t->tail)
        return UINT64_MAX;
    if (slot(t, pos)->probe_id != probe_id || now >= slot(t, pos)->expires_ms)
        return UINT64_MAX; /* answered, dropped or too late */
    return pos;
}

int
swe_sprobes_peek(const swe_sprobes *t, uint64_t probe_id, int64_t now,
                 uint8_t id[SW_REQUEST_ID_BYTES])
{
    uint64_t pos = find(t, probe_id, now);
    if (pos == UINT64_MAX)
        return 0;
    memcpy(id, slot(t, pos)->id, SW_REQUEST_ID_BYTES);
    return 1;
}

int
swe_sprobes_take(swe_sprobes *t, uint64_t probe_id, int64_t now, uint8_t id[SW_REQUEST_ID_BYTES])
{
    uint64_t pos = find(t, probe_id, now);
    if (pos == UINT64_MAX) {
        trim(t, now);
        return 0;
    }
    memcpy(id, slot(t, pos)->id, SW_REQUEST_ID_BYTES);
    release(t, slot(t, pos)); /* one answer counts */
    trim(t, now);
    return 1;
}
