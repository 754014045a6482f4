/* egress/cancels.c -- see cancels.h. Linear scans: the table is small and
 * only looked at while cancels wait. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "egress/cancels.h"

int
swe_cancels_add(swe_cancels *c, const uint8_t id[SW_REQUEST_ID_BYTES], void *s, int kill,
                int64_t now)
{
    return swe_cancels_add_to(c, id, NULL, s, kill, now);
}

int
swe_cancels_add_to(swe_cancels *c, const uint8_t id[SW_REQUEST_ID_BYTES], const char *subj, void *s,
                   int kill, int64_t now)
{
    if (c->n >= SWE_CANCELS_MAX)
        return -1;
    for (size_t i = 0; i < c->n; i++)
        if (memcmp(c->v[i].id, id, SW_REQUEST_ID_BYTES) == 0)
            return -1; /* already waiting (a cancel, then a kill): keep the first */
    if (c->n == c->cap) {
        size_t ncap = c->cap ? c->cap * 2 : 16;
        swe_cancel *nv = realloc(c->v, ncap * sizeof(*nv));
        if (nv == NULL)
            return -1;
        c->v = nv;
        c->cap = ncap;
    }
    memcpy(c->v[c->n].id, id, SW_REQUEST_ID_BYTES);
    snprintf(c->v[c->n].subj, sizeof(c->v[c->n].subj), "%s", subj ? subj : "");
    c->v[c->n].s = s;
    c->v[c->n].kill = kill;
    c->v[c->n].sent = 1;
    c->v[c->n].next_ms = now + SWE_CANCEL_FIRST_MS;
    c->n++;
    return 0;
}

size_t
swe_cancels_due(swe_cancels *c, int64_t now, swe_cancel *due, size_t max)
{
    size_t k = 0;
    for (size_t i = 0; i < c->n && k < max;) {
        swe_cancel *e = &c->v[i];
        if (now < e->next_ms) {
            i++;
            continue;
        }
        e->sent++;
        e->next_ms = now + ((int64_t)SWE_CANCEL_FIRST_MS << (e->sent - 1));
        due[k++] = *e;
        if (e->sent >= SWE_CANCEL_TRIES)
            *e = c->v[--c->n]; /* the last send: it leaves the table */
        else
            i++;
    }
    return k;
}

void *
swe_cancels_seen(swe_cancels *c, const uint8_t id[SW_REQUEST_ID_BYTES])
{
    for (size_t i = 0; i < c->n; i++)
        if (memcmp(c->v[i].id, id, SW_REQUEST_ID_BYTES) == 0) {
            void *s = c->v[i].s;
            c->v[i] = c->v[--c->n];
            return s;
        }
    return NULL;
}

int64_t
swe_cancels_next_due(const swe_cancels *c)
{
    int64_t t = INT64_MAX;
    for (size_t i = 0; i < c->n; i++)
        if (c->v[i].next_ms < t)
            t = c->v[i].next_ms;
    return t;
}

void
swe_cancels_clear(swe_cancels *c, void (*fn)(void *s))
{
    for (size_t i = 0; i < c->n; i++)
        if (fn != NULL)
            fn(c->v[i].s);
    free(c->v);
    memset(c, 0, sizeof(*c));
}
