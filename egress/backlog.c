/* egress/backlog.c -- the router's quiet time from its mux queue's
 * progress (egress/backlog.h). */
#include <string.h>

#include "egress/backlog.h"

void
swe_backlog_init(swe_backlog *b, int64_t now)
{
    b->caught_ms = now;
    b->n = 0;
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
        b->n--; /* full: this look stands for the newest too */
    b->m[b->n].at = now;
    b->m[b->n].target = target;
    b->n++;
    return b->caught_ms;
}
