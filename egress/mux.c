/* egress/mux.c -- the router's one wildcard subscription (sw.rsp.<router>.*)
 * receives every response of every stream it opened: the last subject
 * token is the request id, so a message reaches its stream without
 * decoding; heartbeat batches come on sw.rsp.<router>.hb. Each decoded item
 * becomes a swe_rx_in for the stream's state machine. Also here: the
 * answer to a worker's liveness probe (sw.rtr.<router>). Runs on nats.c's
 * delivery threads; takes r->mu for counters and to check a heartbeat
 * batch against the peer table. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "egress/egress_int.h"

static void
count_bad(sw_router *r, uint64_t *field, uint64_t n)
{
    pthread_mutex_lock(&r->mu);
    *field += n;
    pthread_mutex_unlock(&r->mu);
}

/* The terminal a worker's final carries, as the state machine takes it. */
static void
final_to_in(const swp_terminal *t, swe_rx_in *in)
{
    in->err = SW_OK;
    in->message = "";
    switch (t->status) {
    case STREAMWIRE__V1__STATUS__STATUS_COMPLETED:
        in->status = SW_STATUS_COMPLETED;
        in->reason = t->finish_reason[0] ? t->finish_reason : "stop";
        break;
    case STREAMWIRE__V1__STATUS__STATUS_INCOMPLETE:
        in->status = SW_STATUS_INCOMPLETE;
        in->reason = t->finish_reason[0] ? t->finish_reason : "incomplete";
        break;
    case STREAMWIRE__V1__STATUS__STATUS_CANCELLED:
        in->status = SW_STATUS_CANCELLED;
        in->reason = "cancelled";
        break;
    default: /* FAILED (validated by the codec) */
        in->message = t->error->message;
        if (t->error->sw_code != 0) {
            const char *name = sw_err_name((int)t->error->sw_code);
            in->status = SW_STATUS_ERROR;
            in->err = strcmp(name, "unknown_error") == 0 ? SW_EPROTO : (sw_err)t->error->sw_code;
            in->reason = sw_err_name(in->err);
        } else {
            in->status = SW_STATUS_FAILED;
            in->reason = t->error->app_code;
        }
        break;
    }
}

/* One item of message w into *in (its bytes borrowed from w). */
static void
item_to_in(const swp_item *w, uint64_t seq, int final, const swp_terminal *t,
           ProtobufCBinaryData data, int droppable, const char *event, swe_rx_in *in)
{
    memset(in, 0, sizeof(*in));
    in->seq = seq;
    in->credit_window = w->credit_window; /* the header's, for every item of the message */
    in->credit_window_max = w->credit_window_max;
    in->credit_bytes = w->credit_bytes;
    if (final) {
        in->kind = SWE_IN_FINAL;
        final_to_in(t, in);
    } else {
        in->kind = SWE_IN_DATA;
        in->data = data.data;
        in->len = data.len;
        in->droppable = droppable;
        in->event = event; /* the decoder checked it: "" or a valid name */
    }
}

/* Every item of message w, in order, each as if it had come in a message
 * of its own, fed under one lock of the stream per FEED_CHUNK items, with
 * their runs (rx.h, swe_rx_runs: a run's queue nodes share one block).
 * Returns 1 if the message carried a final. */
#define FEED_CHUNK 64
static int
feed_message(sw_stream *s, const uint8_t *id, const swp_item *w)
{
    swe_rx_in in[FEED_CHUNK];
    size_t n = 0;
    item_to_in(w, w->seq, w->complete_final, w->terminal, w->data, w->droppable, w->event,
               &in[n++]);
    for (size_t i = 0; i < w->n_batch; i++) {
        const swp_batched *b = w->batch[i];
        if (n == FEED_CHUNK) {
            swe_rx_runs(in, n);
            swe_stream_on_items(s, id, in, n);
            n = 0;
        }
        item_to_in(w, b->seq, b->complete_final, b->terminal, b->data, b->droppable, b->event,
                   &in[n++]);
    }
    swe_rx_runs(in, n);
    swe_stream_on_items(s, id, in, n);
    return in[n - 1].kind == SWE_IN_FINAL; /* (a final is only ever the last item) */
}

/* 1 if a worker's heartbeats with this incarnation and counter count: only
 * from the incarnation a fresh probe answer named, with a counter above
 * every one taken. A recorded batch or heartbeat wrapper replayed later
 * (or one from a worker not answered yet) keeps no stream alive. */
static int
beats_take(sw_router *r, const char *instance, uint64_t incarnation, uint64_t counter)
{
    int take;
    pthread_mutex_lock(&r->mu);
    take = swi_peers_beats_take(&r->peers, instance, incarnation, counter);
    pthread_mutex_unlock(&r->mu);
    if (!take)
        swi_ticker_wake(&r->ticker, SWE_REST_SHORT); /* (a new incarnation is asked at once) */
    return take;
}

/* A worker's heartbeats for many of our streams: each beat is handled as
 * the heartbeat wrapper it stands for. */
#define SWE_BEATS_RUN 64
#define SWE_BEATS_AHEAD 4 /* streams fetched ahead of the one handled */
static void
on_beats(sw_router *r, const swt_msg *msg)
{
    swp_beats *b = NULL;
    uint64_t unknown = 0;
    sw_err rv = swp_decode_beats(msg->data, msg->len, sw_conn_max_payload(r->conn) + 1024, &b);
    if (rv != SW_OK) {
        count_bad(r, &r->st.bad_messages, 1);
        swi_log(&r->log, SW_LOG_WARN, "a heartbeat batch did not decode: %s", sw_err_name(rv));
        return;
    }
    if (!beats_take(r, b->instance_id, b->incarnation, b->counter)) {
        count_bad(r, &r->st.unknown_stream, b->n_beats);
        swp_free(b);
        return;
    }
    /* In runs: the streams of a run are looked up under one hold of r->mu,
     * and take the run's one clock read. */
    for (size_t at = 0; at < b->n_beats; at += SWE_BEATS_RUN) {
        const uint8_t *ids[SWE_BEATS_RUN];
        sw_stream *ss[SWE_BEATS_RUN];
        size_t k = b->n_beats - at < SWE_BEATS_RUN ? b->n_beats - at : SWE_BEATS_RUN;
        int64_t now;
        for (size_t j = 0; j < k; j++)
            ids[j] = b->beats[at + j]->request_id.data;
        swe_lookup_n(r, ids, k, ss);
        now = swi_now_ms();
        for (size_t j = 0; j < k && j < SWE_BEATS_AHEAD; j++)
            if (ss[j] != NULL)
                swe_stream_prefetch(ss[j]);
        for (size_t j = 0; j < k; j++) {
            swe_rx_in in;
            sw_stream *s = ss[j];
            if (j + SWE_BEATS_AHEAD < k && ss[j + SWE_BEATS_AHEAD] != NULL)
                swe_stream_prefetch(ss[j + SWE_BEATS_AHEAD]);
            if (s == NULL) {
                unknown++;
                continue;
            }
            if (strcmp(swe_instance(s), b->instance_id) != 0) {
                unknown++; /* not the instance this stream is on (stale or forged) */
                swe_stream_unref(s);
                continue;
            }
            /* (a stalled stream's beat comes alone, not in a batch) */
            swe_rx_beat_in(&in, b->beats[at + j]->last_seq, 0);
            swe_stream_on_items_at(s, ids[j], &in, 1, now);
            swe_stream_unref(s);
        }
    }
    if (unknown)
        count_bad(r, &r->st.unknown_stream, unknown);
    swp_free(b);
}

void
swe_on_msg(const swt_msg *msg, void *arg)
{
    sw_router *r = arg;
    uint8_t id[SW_REQUEST_ID_BYTES];
    sw_stream *s = NULL;
    swp_item *w = NULL;
    swp_arena arena;
    sw_err rv;

    switch (swt_mux_subject(msg->subject, id)) {
    case SWT_MUX_BEATS:
        if (msg->auth_failed)
            count_bad(r, &r->st.auth_failures, 1);
        else
            on_beats(r, msg);
        return;
    case SWT_MUX_ID:
        break;
    default:
        count_bad(r, &r->st.unknown_stream, 1);
        return;
    }
    if ((s = swe_lookup(r, id)) == NULL) {
        if (msg->auth_failed) {
            count_bad(r, &r->st.auth_failures, 1);
            return;
        }
        count_bad(r, &r->st.unknown_stream, 1);
        swe_cancels_answer(r, id, msg); /* the final of a stream we cancelled? */
        return;
    }
    if (msg->auth_failed && msg->unsealed) {
        /* Plain, on a sealing connection: a worker whose sealing differs,
         * or a sealed worker's plain auth_failed answer to a request that
         * did not open, sent on the reply subject the request named: by
         * anyone, for any stream. After the stream's worker has answered
         * sealed it cannot be that worker's: dropped (counted), not the
         * stream's end (SECURITY.md). */
        count_bad(r, &r->st.auth_failures, 1);
        (void)swe_stream_unsealed(s, id,
                                  "a stream item was not sealed (from a worker that does not "
                                  "seal, or one that could not open the request)");
        swe_stream_unref(s);
        return;
    }
    if (msg->auth_failed) {
        /* Forged, tampered, of another key, or from a worker whose sealing
         * differs: nothing of it reaches the consumer. */
        count_bad(r, &r->st.auth_failures, 1);
        swe_stream_fail(s, SW_AUTH_FAILED,
                        sw_conn_sealed(r->conn)
                            ? "a stream item did not open with the cluster key (forged, tampered, "
                              "or sealed with another key)"
                            : "a stream item is sealed and this frontend has no key",
                        1);
        swe_stream_unref(s);
        return;
    }
    if (msg->no_responders) {
        /* A sealed cluster does not re-send on "no responders" alone: that
         * status is not sealed (anyone may forge it), and a second instance
         * must never run a request the first may still be running.
         * Unsealed: a first request is re-routed once; a migrated one
         * migrates again while it may. */
        static const char nobody[] = "no worker is subscribed to the request subject";
        int sealed = sw_conn_sealed(r->conn);
        if ((sealed || !swe_reroute(s)) && swe_stream_no_responders(s, id, !sealed, nobody) < 0)
            count_bad(r, &r->st.unknown_stream, 1); /* not the server's, or stale */
        swe_stream_unref(s);
        return;
    }
    rv =
        swp_decode_item_arena(msg->data, msg->len, sw_conn_max_payload(r->conn) + 1024, &arena, &w);
    if (rv == SW_OK && memcmp(w->request_id.data, id, SW_REQUEST_ID_BYTES) != 0)
        rv = SW_EPROTO;
    if (rv != SW_OK) {
        char m[128];
        snprintf(m, sizeof(m), "a stream item did not decode (%s)", sw_err_name(rv));
        swe_stream_fail(s, SW_DECODE_ERROR, m, 1);
    } else if (w->body_case == STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_HEARTBEAT) {
        /* (a stalled stream's): sealed under the stream's key, but a copy
         * recorded on the bus opens as well as the original; it counts as a
         * batch would, by its worker's incarnation and counter. One without
         * them comes from a worker built before them (in a sealed cluster
         * only a key holder can make one), and is taken as it comes. */
        const swp_heartbeat *h = w->heartbeat;
        if (h->incarnation == 0 || beats_take(r, swe_instance(s), h->incarnation, h->counter)) {
            swe_rx_in in;
            swe_rx_beat_in(&in, h->last_seq, h->stalled);
            swe_stream_on_item(s, id, &in);
        } else {
            count_bad(r, &r->st.unknown_stream, 1);
        }
    } else {
        /* With a batch: the items the worker had queued behind the first.
         * A final answers a cancel that waits for it, even if the stream
         * dropped it (cancelled meanwhile). */
        if (feed_message(s, id, w))
            swe_cancels_settle(r, id);
    }
    swp_free_arena(w, &arena);
    swe_stream_unref(s);
}

/* A worker asks whether this frontend still exists: the answer echoes the
 * probe's id, on the probe's reply subject if it is the protocol's,
 * sw.lv.<instance>.<this router>, and nowhere else: the reply subject is
 * the sender's choice, and a worker's sealed probe recorded on the bus
 * and published again with a live stream's response subject as its reply
 * made the router send that stream a sealed answer (it opened there, did
 * not decode as an item, and ended the stream with decode_error). */
void
swe_on_live_probe(const swt_msg *msg, void *arg)
{
    sw_router *r = arg;
    swp_probe_reply p = STREAMWIRE__V1__PROBE_REPLY__INIT;
    uint8_t buf[128];
    size_t len;
    if (msg->auth_failed) { /* not a worker of this cluster: no answer */
        count_bad(r, &r->st.auth_failures, 1);
        return;
    }
    if (msg->no_responders) { /* no probe, but a forged status: nothing to answer */
        count_bad(r, &r->st.bad_messages, 1);
        return;
    }
    if (!swt_is_live_reply_for(msg->reply, r->id)) { /* no reply, or not where one goes */
        count_bad(r, &r->st.bad_messages, 1);
        return;
    }
    p.version = SW_PROTOCOL_VERSION;
    p.instance_id = r->id;
    if (msg->len > 0) { /* echo the probe's id (a worker judges answers by it) */
        swp_control *c = NULL;
        if (swp_decode_control(msg->data, msg->len, 4096, &c) == SW_OK)
            p.probe_id = c->probe_id;
        swp_free(c);
    }
    if (swp_encode(&p, buf, sizeof(buf), &len) == SW_OK)
        (void)swt_publish(r->conn, msg->reply, NULL, buf, len);
}
