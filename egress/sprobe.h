/* egress/sprobe.h -- the router's stream probes that wait for an answer
 * (issue 17, the idle cost).
 *
 * A stream that asked for idle heartbeats and went silent past its idle
 * spacing and a heartbeat more is asked after (egress/rx.h, act->ask): a
 * Control PROBE naming its request id, with a fresh probe id, on its
 * worker's control subject; the worker answers on the router's
 * sw.prb.<router>.<instance> subject, as it answers instance probes, with
 * whether it knows the stream and its last seq. This table maps a probe id
 * back to the stream it asked for: an answer counts (as a heartbeat) only
 * if its probe id is one out now, once, so an answer recorded on the bus
 * and replayed counts for nothing (the rule of instance probes).
 *
 * Bounded: at most SWE_SPROBES_MAX positions, each probe dropped when
 * answered, when its stream leaves the table, or SWE_SPROBE_TTL_MS after
 * it was sent (an answer later than that could not save its stream: the
 * ask leaves at most that much of the silence limit). Every entry has the
 * same time to live, so they expire in the order sent and the ring frees
 * its oldest positions first: at most the asks of the last
 * SWE_SPROBE_TTL_MS are in it (a long-lived entry cannot pin it). A stream
 * that asks again keeps its earlier probe out too (an answer slower than
 * the re-ask still counts); its tag (rx.ask_tag) names the newest. Full,
 * no probe is sent (the caller counts it) and the stream is judged by its
 * silence alone, as without the asks (its limit later by as much as the
 * ask was late: rx.h). The ring starts at 64 slots when
 * the first is asked and grows to the bound; it is freed once nothing is
 * out. Probe ids of streams have the top bit set
 * (SWE_SPROBE_BIT), which instance probe ids never have (common/sched.c
 * gives those out from below 2^62), so neither kind of answer is ever
 * taken for the other. Pure: no lock (the router's r->mu), no clock. */
#ifndef SW_EGRESS_SPROBE_H
#define SW_EGRESS_SPROBE_H

#include <stddef.h>
#include <stdint.h>

#include "common/sw_common.h"

#define SWE_SPROBES_MAX 16384
#define SWE_SPROBE_TTL_MS 1000
#define SWE_SPROBE_BIT (UINT64_C(1) << 63)

typedef struct swe_sprobe {
    uint64_t probe_id; /* 0: free (answered, dropped) */
    int64_t expires_ms;
    uint8_t id[SW_REQUEST_ID_BYTES]; /* the stream's request id, as asked */
} swe_sprobe;

typedef struct swe_sprobes {
    swe_sprobe *v;       /* cap slots (a power of two), NULL while nothing is out */
    size_t cap;          /* 0 while v is NULL */
    size_t live;         /* entries out */
    uint64_t head, tail; /* positions: [head, tail) holds every entry out (and dropped
                            ones); position p is in slot p & (cap - 1) */
    uint64_t base;       /* probe id of position p: SWE_SPROBE_BIT | (base + p) (63 bits) */
} swe_sprobes;

/* 1 if probe_id is a stream probe's (not an instance probe's). */
static inline int
swe_sprobe_is(uint64_t probe_id)
{
    return (probe_id & SWE_SPROBE_BIT) != 0;
}

/* An empty table; base: any value (the router's is random). */
void swe_sprobes_init(swe_sprobes *t, uint64_t base);
void swe_sprobes_fini(swe_sprobes *t);

/* A probe for the stream with request id `id`, sent at now, out for
 * SWE_SPROBE_TTL_MS; *tag names it (an earlier probe of the stream stays
 * out). Returns its probe id, or 0 when the table is full or out of memory
 * (*tag is then unchanged). */
uint64_t swe_sprobes_add(swe_sprobes *t, const uint8_t id[SW_REQUEST_ID_BYTES], uint32_t *tag,
                         int64_t now);

/* An answer with probe_id at now: 1 if it is a probe out and not expired,
 * whose request id is then copied to id; 0 otherwise. Peeking takes
 * nothing: the caller checks the answer against the stream first. */
int swe_sprobes_peek(const swe_sprobes *t, uint64_t probe_id, int64_t now,
                     uint8_t id[SW_REQUEST_ID_BYTES]);

/* As peek, and the entry is dropped (one answer counts). */
int swe_sprobes_take(swe_sprobes *t, uint64_t probe_id, int64_t now,
                     uint8_t id[SW_REQUEST_ID_BYTES]);

/* Drops the entry tag names, if it is still out and asked for request id
 * `id` (a stale tag of a stream whose probe was answered or expired long
 * ago names another stream's position after 2^31 more). 0 is no entry. */
void swe_sprobes_drop(swe_sprobes *t, uint32_t tag, const uint8_t id[SW_REQUEST_ID_BYTES]);

#endif
