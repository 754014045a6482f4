/* egress/backlog.c -- the router's quiet time from its mux queue's
 * progress (egress/backlog.h). */
#include <stdint.h>
#include <string.h>

#include "egress/backlog.h"

void
swe_backlog_init(swe_backlog *b, int64_t now)
{
    b->caught_ms = now;
    b->n = 0;
}

/* Full: drops the inner look whose neighbours are closest in time (the
 * oldest and the newest stay), so the looks kept stay spread over the
 * queue's delay and the quiet time lags it by about one gap between them.
 * (Overwriting the newest instead let the newest chase the queue's tail:
 * with a delay of 8 s the quiet time lagged 14 s.) */
static void
backlog_thin(swe_backlog *b)
{
    unsigned drop = 1;
    int64_t best = INT64_MAX;
    for (unsigned i = 1; i + 1 < b->n; i++) {
        int64_t span = b->m[i + 1].at - b->m[i - 1].at;
        if (span < best) {
            best = span;
            drop = i;
        }
    }
    memmove(b->m + drop, b->m + drop + 1, (b->n - drop - 1) * sizeof(b->m[0]));
    b->n--;
}

int64_t
swe_backlog_look(swe_backlog *b, int64_t now, uint64_t done, uint64_t target)
{
    unsigned reached = 0;
    if (now < b->caught_ms)
        now = b->caught_ms; /* (never back) */
    if (target <= done) {
        /* nothing queued, nothing in a callback: all handled */
        b->n = 0;
        b->caught_ms = now;
        return now;
    }
    while (reached < b->n && b->m[reached].target <= done)
        b->caught_ms = b->m[reached++].at;
    if (reached > 0) {
        b->n -= reached;
        memmove(b->m, b->m + reached, b->n * sizeof(b->m[0]));
    }
    if (b->n > 0 && target <= b->m[b->n - 1].target) {
        /* nothing new taken in since the last look: once that one is
         * reached, all that arrived before this one was handled */
        b->m[b->n - 1].at = now;
        return b->caught_ms;
    }
    if (b->n == SWE_BACKLOG_MARKS)
        backlog_thin(b);
    b->m[b->n].at = now;
    b->m[b->n].target = target;
    b->n++;
    return b->caught_ms;
}
