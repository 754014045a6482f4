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
 * Bounded: at most SWE_SPROBES_MAX probes out per router, each dropped
 * when answered, when its stream asks again (one out per stream: the
 * stream keeps the entry's tag, rx.ask_tag), when its stream leaves the
 * table, or ttl_ms after it was sent; full, no probe is sent (the caller
 * counts it) and the stream is judged by its silence alone, as without
 * the asks. Entries are kept in the order they were sent, in a ring that
 * starts at 64 slots when the first is asked and grows to the bound; it is
 * freed once nothing is out. Probe ids of streams have the top bit set
 * (SWE_SPROBE_BIT), which instance probe ids never have (common/sched.c
 * gives those out from below 2^62), so neither kind of answer is ever
 * taken for the other. Pure: no lock (the router's r->mu), no clock. */
#ifndef SW_EGRESS_SPROBE_H
#define SW_EGRESS_SPROBE_H

#include <stddef.h>
#include <stdint.h>

#include "common/sw_common.h"

#define SWE_SPROBES_MAX 16384
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

/* A probe for the stream with request id `id`, sent at now: its entry
 * replaces the one *tag names (the stream's previous probe, if still out),
 * and *tag names the new one. Returns its probe id, or 0 when the table is
 * full or out of memory (*tag is then 0: nothing out). */
uint64_t swe_sprobes_add(swe_sprobes *t, const uint8_t id[SW_REQUEST_ID_BYTES], uint32_t *tag,
                         int64_t now, int64_t ttl_ms);

/* An answer with probe_id at now: 1 if it is a probe out and not expired,
 * whose entry is then dropped (one answer counts) and its request id copied
 * to id; 0 otherwise. */
int swe_sprobes_take(swe_sprobes *t, uint64_t probe_id, int64_t now,
                     uint8_t id[SW_REQUEST_ID_BYTES]);

/* Drops the entry tag names, if it is still out (the stream left the
 * table). 0 is no entry. */
void swe_sprobes_drop(swe_sprobes *t, uint32_t tag);

#endif
