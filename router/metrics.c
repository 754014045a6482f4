/* router/metrics.c -- a registry handle's Prometheus families
 * (sw_metrics_add_registry): dead reports sent, refused and received,
 * entries ignored, live instances in its view. Reads sw_registry_stats_get. */
#include "common/metrics.h"
#include "router/registry_int.h"
#include <streamwire/metrics.h>

#define F(name) "streamwire_registry_" name

static void
registry_render(swi_prom *p, void *obj)
{
    sw_registry *reg = obj;
    sw_registry_stats st;
    swi_label l[1] = {{"bucket", swr_registry_bucket(reg)}};
    sw_registry_stats_get(reg, &st);
    swi_prom_value(p, F("dead_reports_sent_total"), "counter",
                   "Tombstones this handle wrote for instances it judged dead.", l, 1,
                   (double)st.dead_reports_sent);
    swi_prom_value(p, F("dead_reports_refused_total"), "counter",
                   "Dead reports refused: the entry was newer (the instance is alive) or gone.", l,
                   1, (double)st.dead_reports_refused);
    swi_prom_value(p, F("dead_reports_received_total"), "counter",
                   "Tombstones seen in the store (any router's).", l, 1,
                   (double)st.dead_reports_received);
    swi_prom_value(p, F("entries_ignored_total"), "counter",
                   "Values that did not decode, sat under another key, or did not open (sealing).",
                   l, 1, (double)st.entries_ignored);
    swi_prom_value(p, F("live_instances"), "gauge", "Live instances in this handle's view.", l, 1,
                   (double)st.live);
    swi_prom_value(p, F("store_pings_failed_total"), "counter",
                   "Pings the store did not answer when every lease had lapsed (lapsed entries "
                   "were held, not removed).",
                   l, 1, (double)st.store_pings_failed);
    swi_prom_value(p, F("store_down"), "gauge",
                   "1 while the store does not answer and lapsed entries are held.", l, 1,
                   (double)st.store_down);
}

sw_err
sw_metrics_add_registry(sw_metrics *m, struct sw_registry *reg)
{
    return swi_metrics_add(m, reg, registry_render);
}
