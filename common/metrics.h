/* common/metrics.h -- what every layer needs to export metrics: latency
 * histograms (lock-free, fixed buckets), the Prometheus text builder that
 * groups samples by family, and the source list behind the public
 * sw_metrics (include/streamwire/metrics.h). egress/metrics.c,
 * ingress/metrics.c and transport/metrics.c render their objects' families
 * through this.
 *
 * Threads: swi_hist_observe_ns is lock-free (atomic adds) and may run on any
 * thread; a swi_prom builder belongs to one rendering call; sw_metrics has
 * one mutex, held while its sources render (they take their objects' own
 * locks through the *_stats_get calls; never the other way round). */
#ifndef SW_COMMON_METRICS_H
#define SW_COMMON_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "common/sw_common.h"
#include <streamwire/metrics.h>

#define SWI_HIST_MAX_BUCKETS 20

typedef struct swi_hist {
    const double *bounds; /* upper bounds in seconds, increasing; +Inf implied */
    size_t nb;
    uint64_t counts[SWI_HIST_MAX_BUCKETS + 1]; /* atomic; the last is +Inf only */
    uint64_t sum_ns;                           /* atomic */
} swi_hist;

/* Latency buckets: 50 us .. 60 s. */
extern const double swi_hist_latency_bounds[];
extern const size_t swi_hist_latency_nb;

void swi_hist_init(swi_hist *h, const double *bounds, size_t nb);
void swi_hist_observe_ns(swi_hist *h, int64_t ns);

/* Monotonic nanoseconds (for latencies). */
int64_t swi_now_ns(void);

typedef struct swi_prom swi_prom;
typedef struct swi_label {
    const char *k, *v;
} swi_label;

/* One sample of a counter or gauge family ("counter" / "gauge"). The first
 * call for a family fixes its type and help. */
void swi_prom_value(swi_prom *p, const char *family, const char *type, const char *help,
                    const swi_label *labels, size_t nl, double v);
/* A histogram's _bucket, _sum and _count samples. */
void swi_prom_hist(swi_prom *p, const char *family, const char *help, const swi_label *labels,
                   size_t nl, const swi_hist *h);

/* A source renders its object's families into p. */
typedef void (*swi_metrics_fn)(swi_prom *p, void *obj);
sw_err swi_metrics_add(sw_metrics *m, void *obj, swi_metrics_fn fn);

#endif
