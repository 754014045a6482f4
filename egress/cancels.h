/* egress/cancels.h -- cancels waiting for the worker's word: a pure table
 * (no locks, no clock, no I/O; the router holds r->mu around it and the
 * time is an argument).
 *
 * A CANCEL or KILL is one NATS message; if the bus loses it, the worker's
 * handler runs on until credit runs out. So the router keeps each cancelled
 * stream here and sends the control again, SWE_CANCEL_FIRST_MS after the
 * first, then doubling, until the worker's final for that stream arrives
 * (it answers a CANCEL with its CANCELLED final) or SWE_CANCEL_TRIES sends
 * in all. A worker takes a repeated CANCEL as a no-op. At most
 * SWE_CANCELS_MAX wait at once; past that, a cancel is sent once. */
#ifndef SW_EGRESS_CANCELS_H
#define SW_EGRESS_CANCELS_H

#include <stddef.h>
#include <stdint.h>

#include "common/sw_common.h"

#define SWE_CANCELS_MAX 4096
#define SWE_CANCEL_TRIES 5 /* sends in all, the first included */
#define SWE_CANCEL_FIRST_MS 100

#define SWE_CANCEL_SUBJ_MAX 320 /* SWT_SUBJECT_MAX */

typedef struct swe_cancel {
    uint8_t id[SW_REQUEST_ID_BYTES];
    char subj[SWE_CANCEL_SUBJ_MAX]; /* where to send it ("" = the stream's current subject) */
    void *s;                        /* the stream (the caller holds a reference while it is here) */
    int kill;                       /* KILL rather than CANCEL */
    int sent;                       /* sends so far */
    int64_t next_ms;
} swe_cancel;

typedef struct swe_cancels {
    swe_cancel *v;
    size_t n, cap;
} swe_cancels;

/* After the first send at now. 0, or -1 (full, or no memory: no retries). */
int swe_cancels_add(swe_cancels *c, const uint8_t id[SW_REQUEST_ID_BYTES], void *s, int kill,
                    int64_t now);
/* As swe_cancels_add, to the control subject subj (copied; a stream that
 * migrated stops its old worker there). */
int swe_cancels_add_to(swe_cancels *c, const uint8_t id[SW_REQUEST_ID_BYTES], const char *subj,
                       void *s, int kill, int64_t now);
/* The entries due at now: copied to due[] (at most max) with their next
 * send scheduled; those that have now been sent SWE_CANCEL_TRIES times are
 * removed (their copy in due[] has sent == SWE_CANCEL_TRIES: the caller
 * sends once more and releases s). Returns the count in due[]. */
size_t swe_cancels_due(swe_cancels *c, int64_t now, swe_cancel *due, size_t max);
/* The worker's final for id arrived: removes the entry and returns its s,
 * or NULL if id waits for nothing. */
void *swe_cancels_seen(swe_cancels *c, const uint8_t id[SW_REQUEST_ID_BYTES]);
/* The earliest next send, or INT64_MAX if none waits. */
int64_t swe_cancels_next_due(const swe_cancels *c);
/* Empties the table, calling fn(s) for each entry (releases). */
void swe_cancels_clear(swe_cancels *c, void (*fn)(void *s));

#endif
