/* egress/backlog.h -- how far behind the router is on its own queue (issue
 * 11 #10): the time up to which it has handled everything it received on
 * its mux subscription, by which a stream's silence and gaps are judged
 * (egress/timer.c), so that a router behind on its queue never blames a
 * worker for its own delay.
 *
 * At each look the ticker notes how many messages the mux had handled
 * (done) and how many it had taken in by then (target: handled, the one in
 * its callback, and those queued). Once done reaches a look's target,
 * everything that arrived before that look was handled: the look's time is
 * the quiet time. A queue that never empties (sustained load, junk on the
 * wildcard) moves it on as fast as the queue does, so silence is still
 * judged, late by the queue's own delay (and a look's spacing); a callback
 * that holds the mux's thread keeps it where it was until the callback
 * returns (the streams behind it are delayed, never ended for the silence
 * it caused; their deadlines still end them, and one that never returns
 * leaves the router's streams without deadlines open for good: the
 * router logs a warning every SWE_BEHIND_WARN_MS it is that far behind).
 * With nothing queued or in a callback, the quiet time is now.
 *
 * Bounded: SWE_BACKLOG_MARKS looks wait at most; when full, the inner look
 * whose neighbours are closest in time is dropped (a later quiet time,
 * never a wrong one: with a queue's delay of 8 s, about 8.2 s behind).
 * Pure: no lock (the ticker thread only), no clock. */
#ifndef SW_EGRESS_BACKLOG_H
#define SW_EGRESS_BACKLOG_H

#include <stdint.h>

#define SWE_BACKLOG_MARKS 64
#define SWE_BEHIND_WARN_MS 10000 /* the router warns this far behind, this often */

typedef struct swe_backlog_mark {
    int64_t at;      /* when the look was made */
    uint64_t target; /* messages taken in by then */
} swe_backlog_mark;

typedef struct swe_backlog {
    int64_t caught_ms; /* everything received before it was handled */
    unsigned n;        /* looks still waiting, oldest first */
    swe_backlog_mark m[SWE_BACKLOG_MARKS];
} swe_backlog;

/* Nothing received yet: caught up at `now`. */
void swe_backlog_init(swe_backlog *b, int64_t now);

/* One look at `now`: `done` messages handled so far, `target` taken in
 * (the queued count read before done, so it may count one twice: that only
 * makes the look wait for a message more, or for the queue to empty).
 * Returns the quiet time (<= now, never going back). */
int64_t swe_backlog_look(swe_backlog *b, int64_t now, uint64_t done, uint64_t target);

#endif
