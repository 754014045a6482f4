/*
 * streamwire/metrics.h -- Prometheus metrics of routers, ingresses and
 * connections, rendered as the Prometheus text exposition format (0.0.4).
 *
 * An sw_metrics is a list of sources. Add the objects a process runs, and
 * call sw_metrics_render from whatever serves /metrics (the gateway does;
 * `streamwire worker --metrics-listen` does). Rendering reads each object's
 * counters (the *_stats_get values and the library's latency histograms)
 * at that moment; nothing is pushed, and adding a source costs nothing on
 * the data path.
 *
 * Families (all prefixed streamwire_; docs/METRICS.md lists them with their
 * labels). Labels are bounded: router (id), instance_id, endpoint, conn (name), terminal
 * status and reason; never a request id.
 *
 * Ownership and threads: every function is thread-safe. A source must stay
 * valid until it is removed (sw_metrics_remove) or the sw_metrics is
 * destroyed: remove it before destroying the object.
 */
#ifndef STREAMWIRE_METRICS_H
#define STREAMWIRE_METRICS_H

#include <stddef.h>

#include <streamwire/streamwire.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sw_metrics sw_metrics;

/* Errors: SW_EINVAL, SW_ENOMEM. */
SW_API SW_NODISCARD sw_err sw_metrics_create(sw_metrics **out);
/* Frees the list (not the sources). NULL ok. */
SW_API void sw_metrics_destroy(sw_metrics *m);

/* Add a source. Adding one object twice is SW_EEXIST. */
SW_API sw_err sw_metrics_add_router(sw_metrics *m, sw_router *r);
SW_API sw_err sw_metrics_add_ingress(sw_metrics *m, sw_ingress *ing);
SW_API sw_err sw_metrics_add_conn(sw_metrics *m, sw_conn *c);
/* streamwire_registry_*: dead reports sent, refused and received, entries
 * ignored, live instances (label bucket). */
struct sw_registry;
SW_API sw_err sw_metrics_add_registry(sw_metrics *m, struct sw_registry *reg);
/* Removes a source added with any of the above; SW_ENOTFOUND if absent. */
SW_API sw_err sw_metrics_remove(sw_metrics *m, const void *source);

/* Renders every source into a new NUL-terminated buffer (*out, length
 * *len without the NUL), owned by the caller: free() it. Families are
 * grouped (one HELP and TYPE each) whatever the number of sources.
 * Errors: SW_EINVAL, SW_ENOMEM. */
SW_API SW_NODISCARD sw_err sw_metrics_render(sw_metrics *m, char **out, size_t *len);

#ifdef __cplusplus
}
#endif
#endif
