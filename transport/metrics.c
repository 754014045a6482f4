/* transport/metrics.c -- a connection's Prometheus families
 * (sw_metrics_add_conn): whether it is connected, and its reconnects. */
#include "common/metrics.h"
#include "transport/sw_transport.h"

static void
conn_render(swi_prom *p, void *obj)
{
    sw_conn *c = obj;
    swi_label l[1] = {{"conn", swt_conn_name(c)}};
    swi_prom_value(p, "streamwire_nats_connected", "gauge",
                   "1 while the NATS connection is up, else 0.", l, 1,
                   sw_conn_status(c) == SW_CONN_CONNECTED ? 1.0 : 0.0);
    swi_prom_value(p, "streamwire_nats_reconnects_total", "counter",
                   "Reconnections to NATS since the connection opened.", l, 1,
                   (double)sw_conn_reconnects(c));
}

sw_err
sw_metrics_add_conn(sw_metrics *m, sw_conn *c)
{
    return swi_metrics_add(m, c, conn_render);
}
