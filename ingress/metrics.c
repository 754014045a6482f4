/* ingress/metrics.c -- an ingress's Prometheus families
 * (sw_metrics_add_ingress): requests, refusals, items sent, resent and
 * shed, heartbeats, cancels, frontends lost, terminals by status, and the
 * gauges of streams in flight and held. Reads sw_ingress_stats_get only. */
#include "common/metrics.h"
#include "ingress/ingress_int.h"

#define F(name) "streamwire_worker_" name

static void
ingress_render(swi_prom *p, void *obj)
{
    sw_ingress *ing = obj;
    sw_ingress_stats st;
    swi_label l[3] = {{"instance_id", sw_ingress_instance_id(ing)},
                      {"endpoint", sw_ingress_endpoint(ing)},
                      {"status", ""}};
    sw_ingress_stats_get(ing, &st);
    swi_prom_value(p, F("requests_total"), "counter", "Requests accepted.", l, 2,
                   (double)st.requests);
    l[2].k = "reason";
    l[2].v = "overloaded";
    swi_prom_value(p, F("requests_refused_total"), "counter",
                   "Requests refused: overloaded (max_inflight), or bad (did not decode, invalid).",
                   l, 3, (double)st.rejected_overload);
    l[2].v = "bad_request";
    swi_prom_value(p, F("requests_refused_total"), "counter",
                   "Requests refused: overloaded (max_inflight), or bad (did not decode, invalid).",
                   l, 3, (double)st.bad_requests);
    swi_prom_value(p, F("items_sent_total"), "counter", "Data items published (first sends).", l, 2,
                   (double)st.items_sent);
    swi_prom_value(p, F("items_resent_total"), "counter", "Items sent again to answer RESEND.", l,
                   2, (double)st.items_resent);
    swi_prom_value(p, F("items_shed_total"), "counter", "Droppable items shed for lack of credit.",
                   l, 2, (double)st.items_shed);
    swi_prom_value(p, F("messages_sent_total"), "counter",
                   "NATS messages that carried items and finals.", l, 2, (double)st.messages_sent);
    swi_prom_value(p, F("heartbeats_total"), "counter", "Heartbeats sent.", l, 2,
                   (double)st.heartbeats);
    swi_prom_value(p, F("cancels_total"), "counter",
                   "Streams cancelled by their frontend (or its loss).", l, 2, (double)st.cancels);
    swi_prom_value(p, F("frontends_lost_total"), "counter",
                   "Frontends declared gone by the liveness probe.", l, 2,
                   (double)st.frontends_lost);
    swi_prom_value(p, F("bad_controls_total"), "counter",
                   "Control messages naming another frontend than the stream's.", l, 2,
                   (double)st.bad_controls);
    swi_prom_value(p, F("resends_throttled_total"), "counter",
                   "RESEND controls asking for items resent less than 50 ms before (not resent "
                   "again).",
                   l, 2, (double)st.resends_throttled);
    swi_prom_value(p, F("credit_stalls_total"), "counter",
                   "Blocking sends that waited for credit (the consumer was slower).", l, 2,
                   (double)st.credit_stalls);
    swi_prom_value(p, F("replays_total"), "counter",
                   "Requests already served here (a replay): dropped, never run twice.", l, 2,
                   (double)st.replays);
    swi_prom_value(p, F("auth_failures_total"), "counter",
                   "Requests, controls and probe answers refused by sealing; never acted on.", l, 2,
                   (double)st.auth_failures);
    swi_prom_value(p, F("finals_dropped_total"), "counter",
                   "Finished streams let go before their final was acknowledged.", l, 2,
                   (double)st.finals_dropped);
    l[2].k = "status";
    for (int s = SW_STATUS_COMPLETED; s <= SW_STATUS_ERROR; s++) {
        l[2].v = sw_status_name(s);
        swi_prom_value(p, F("streams_finished_total"), "counter", "Terminals sent, by status.", l,
                       3, (double)st.finished[s]);
    }
    swi_prom_value(p, F("inflight_streams"), "gauge",
                   "Streams in flight: from the request's arrival until its final is on the "
                   "wire, retained responders included (what max_inflight counts).",
                   l, 2, (double)st.inflight);
    swi_prom_value(p, F("requests_waiting"), "gauge",
                   "Requests received but not taken in yet (with handler_inline: behind a running "
                   "handler).",
                   l, 2, (double)st.requests_waiting);
    swi_prom_value(p, F("held_streams"), "gauge",
                   "Streams in the worker's table (live, or finished and not yet acknowledged).", l,
                   2, (double)st.streams_held);
}

sw_err
sw_metrics_add_ingress(sw_metrics *m, sw_ingress *ing)
{
    return swi_metrics_add(m, ing, ingress_render);
}
