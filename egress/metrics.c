/* egress/metrics.c -- a router's Prometheus families (sw_metrics_add_router):
 * streams and their terminals by status and reason, items, the latency
 * histograms (time to first item, between items, stream duration), repairs,
 * instance loss. Reads the router through its thread-safe getters and the
 * lock-free histograms; takes no lock of its own. */
#include <stdio.h>

#include "common/metrics.h"
#include "egress/egress_int.h"

#define F(name) "streamwire_frontend_" name

/* The per-endpoint series: the first SWE_EP_MAX endpoints by name, the
 * rest under SWE_EP_OTHER (shown once it counts anything). */
static void
endpoint_render(swi_prom *p, sw_router *r)
{
    unsigned n = __atomic_load_n(&r->eps_used, __ATOMIC_ACQUIRE);
    for (unsigned i = 0; i <= SWE_EP_MAX; i++) {
        swe_ep *e = &r->eps[i];
        swi_label l[3] = {{"router", sw_router_id(r)}, {"endpoint", e->name}, {"status", ""}};
        uint64_t opened = __atomic_load_n(&e->opened, __ATOMIC_RELAXED);
        if (i < SWE_EP_MAX ? i >= n : opened == 0)
            continue;
        swi_prom_value(p, F("endpoint_streams_opened_total"), "counter",
                       "Streams opened, by endpoint (the first 32 a router uses; later ones "
                       "counted as endpoint _other).",
                       l, 2, (double)opened);
        for (int s = SW_STATUS_COMPLETED; s <= SW_STATUS_ERROR; s++) {
            l[2].v = sw_status_name(s);
            swi_prom_value(p, F("endpoint_streams_total"), "counter",
                           "Streams ended, by endpoint and terminal status.", l, 3,
                           (double)__atomic_load_n(&e->terminals[s], __ATOMIC_RELAXED));
        }
        swi_prom_hist(p, F("endpoint_time_to_first_item_seconds"),
                      "From sw_router_open to the first data item delivered, by endpoint.", l, 2,
                      &e->ttfi);
        swi_prom_hist(p, F("endpoint_stream_duration_seconds"),
                      "From sw_router_open to the terminal delivered, by endpoint.", l, 2,
                      &e->duration);
    }
}

static void
router_render(swi_prom *p, void *obj)
{
    sw_router *r = obj;
    sw_router_stats st;
    swi_label l[3] = {{"router", sw_router_id(r)}, {"status", ""}, {"reason", ""}};
    sw_router_stats_get(r, &st);
    swi_prom_value(p, F("streams_opened_total"), "counter", "Streams opened by sw_router_open.", l,
                   1, (double)st.streams_opened);
    /* Terminals delivered: by status; errors by their reason. */
    for (int s = SW_STATUS_COMPLETED; s <= SW_STATUS_CANCELLED; s++) {
        l[1].v = sw_status_name(s);
        l[2].v = "";
        swi_prom_value(p, F("streams_total"), "counter",
                       "Streams ended, by terminal status (and reason for errors).", l, 3,
                       (double)st.terminals[s]);
    }
    l[1].v = "error";
    for (int e = 0; e < SWE_ERR_SLOTS; e++) {
        uint64_t n = sw_router_error_count(r, e);
        if (n == 0 && !sw_err_is_stream_reason(e))
            continue;
        if (e == 0)
            continue;
        l[2].v = sw_err_name(e);
        swi_prom_value(p, F("streams_total"), "counter",
                       "Streams ended, by terminal status (and reason for errors).", l, 3,
                       (double)n);
    }
    swi_prom_value(p, F("open_streams"), "gauge", "Streams open now.", l, 1,
                   (double)st.open_streams);
    swi_prom_value(p, F("items_total"), "counter", "Data items delivered to consumers.", l, 1,
                   (double)st.items);
    swi_prom_value(p, F("items_after_final_total"), "counter",
                   "Items that arrived after a stream's final.", l, 1,
                   (double)st.items_after_final);
    swi_prom_value(p, F("duplicates_total"), "counter",
                   "Duplicate items dropped (streams that ended).", l, 1,
                   (double)__atomic_load_n(&r->duplicates, __ATOMIC_RELAXED));
    swi_prom_value(p, F("resend_requests_total"), "counter",
                   "RESEND controls sent to repair gaps (streams that ended).", l, 1,
                   (double)__atomic_load_n(&r->resend_requests, __ATOMIC_RELAXED));
    swi_prom_value(p, F("heartbeats_total"), "counter", "Heartbeats received (streams that ended).",
                   l, 1, (double)__atomic_load_n(&r->heartbeats, __ATOMIC_RELAXED));
    swi_prom_value(p, F("unknown_stream_total"), "counter",
                   "Messages for no open stream of this router.", l, 1, (double)st.unknown_stream);
    swi_prom_value(p, F("bad_messages_total"), "counter", "Heartbeat batches that did not decode.",
                   l, 1, (double)st.bad_messages);
    swi_prom_value(p, F("auth_failures_total"), "counter",
                   "Messages refused by sealing: they did not open, or their sealing did not "
                   "match this connection's (a stream's own ends it with auth_failed).",
                   l, 1, (double)st.auth_failures);
    swi_prom_value(p, F("instances_lost_total"), "counter", "Instances this router declared dead.",
                   l, 1, (double)st.instances_lost);
    swi_prom_value(p, F("migrations_total"), "counter",
                   "Streams moved to another instance after a loss or a drain (each move).", l, 1,
                   (double)st.migrations);
    swi_prom_value(p, F("migration_failures_total"), "counter",
                   "Moves that did not happen (no instance, the callback declined): the stream "
                   "ended instead.",
                   l, 1, (double)st.migration_failures);
    swi_prom_value(p, F("probes_sent_total"), "counter", "Liveness probes sent to instances.", l, 1,
                   (double)st.probes_sent);
    swi_prom_value(p, F("stream_probes_sent_total"), "counter",
                   "Silent streams asked after (an idle heartbeat may have been lost).", l, 1,
                   (double)st.stream_probes_sent);
    swi_prom_value(p, F("stream_probes_answered_total"), "counter",
                   "Stream probe answers that counted as the stream's heartbeat.", l, 1,
                   (double)st.stream_probes_answered);
    swi_prom_value(p, F("stream_probes_full_total"), "counter",
                   "Stream probes not sent: too many were out.", l, 1,
                   (double)st.stream_probes_full);
    swi_prom_value(p, F("loss_detection_seconds"), "gauge",
                   "Detection latency of the last instance loss: last sign of life to the "
                   "declaration.",
                   l, 1, (double)st.last_loss_detect_ms / 1e3);
    swi_prom_value(p, F("nats_dropped_total"), "counter",
                   "Messages nats.c dropped on the router's subscription (slow consumer).", l, 1,
                   (double)st.nats_dropped);
    swi_prom_hist(p, F("time_to_first_item_seconds"),
                  "From sw_router_open to the first data item delivered.", l, 1, &r->h_ttfi);
    swi_prom_hist(p, F("inter_item_seconds"), "Between two data items of a stream, as delivered.",
                  l, 1, &r->h_inter);
    swi_prom_hist(p, F("stream_duration_seconds"), "From sw_router_open to the terminal delivered.",
                  l, 1, &r->h_duration);
    endpoint_render(p, r);
}

sw_err
sw_metrics_add_router(sw_metrics *m, sw_router *r)
{
    return swi_metrics_add(m, r, router_render);
}
