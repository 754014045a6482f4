/* egress/probe.c -- instance loss. Every instance this router has streams
 * open to is in r->peers (common/sched.h's peer table, under r->mu) and is
 * probed on its control subject; the answer comes on sw.prb.<router>.<id>.
 * "No responders" means its subscription is gone (killed): lost at once;
 * probe_misses unanswered probes (one if the registry removed it) mean
 * frozen or partitioned, unless one of its streams received something
 * meanwhile. Nothing is judged while this router's own connection is down
 * or came back after the probe went out. A lost instance ends its streams
 * with instance_lost (telling the worker to stop, in case it is alive but
 * cut off), is quarantined here and reported to the registry.
 *
 * Stream probes: a stream that asked for idle heartbeats and went silent
 * past its idle spacing and a heartbeat more (rx.h, act->ask) is asked
 * after with a PROBE naming it, on the same subjects; the answers share
 * sw.prb.<router>.<id> with the instance probes' and are told apart by
 * their probe ids (sprobe.h). Locks: r->mu, then s->mu. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "egress/egress_int.h"

#define SWE_PROBES_MAX 64 /* probes sent per round; the rest next round */
/* An encoded PROBE's room: version, kind, a request id (stream probes), a
 * router id of up to SW_MAX_TOKEN characters and a probe id take under 110
 * bytes. (Instance probes had 64: a router id over ~48 characters failed
 * the encode, and no probe was ever sent.) */
#define SWE_PROBE_MSG_MAX 192
#define SWE_LOST_MAX 8

void
swe_instance_lost(sw_router *r, const char *id, const char *why, int64_t silent_ms,
                  int64_t unanswered_ms)
{
    swi_ptrvec vec = {NULL, 0, 0};
    char msg[160];
    char inst[SW_MAX_TOKEN + 1];
    unsigned n = 0;
    int report;
    snprintf(inst, sizeof(inst), "%s", id);
    snprintf(msg, sizeof(msg), "instance %s was lost: %s", inst, why);
    /* Quarantine before any consumer hears of it: one that retries at once
     * must not be routed straight back. */
    report = swr_pool_quarantine(r->pool, inst);
    pthread_mutex_lock(&r->mu);
    r->st.instances_lost++;
    r->st.last_loss_detect_ms = (uint64_t)(silent_ms > 0 ? silent_ms : 0);
    pthread_mutex_unlock(&r->mu);
    swe_snapshot(r, &vec, NULL);
    for (size_t i = 0; i < vec.n; i++) {
        sw_stream *s = SWE_AT(vec, i);
        if (strcmp(swe_instance(s), inst) == 0) { /* (published: no lock needed) */
            /* The worker may be alive and cut off: ask it to stop. */
            swe_stream_fail(s, SW_INSTANCE_LOST, msg, 1);
            n++;
        }
        swe_stream_unref(s);
    }
    free(vec.v);
    swi_log(&r->log, SW_LOG_WARN, "%s (%u stream(s) ended)", msg, n);
    if (report) /* guarded by the unanswered time only: a registry refresh between the
                   last answer and the first unanswered probe proves nothing (a worker
                   frozen or killed right after its refresh) */
        swr_pool_report(r->pool, inst, why, unanswered_ms);
}

static void
count_auth(sw_router *r)
{
    pthread_mutex_lock(&r->mu);
    r->st.auth_failures++;
    pthread_mutex_unlock(&r->mu);
}

/* Publishes a PROBE with probe_id to instance inst, naming the stream
 * with request id `id` (a stream probe) or none (NULL: an instance probe),
 * with the reply subject sw.prb.<router>.<inst>: any worker answers it
 * there (ingress/control.c), with whether it knows the stream and its
 * last seq when one is named. 1 if it went out. */
static int
probe_publish(sw_router *r, const char *inst, const uint8_t *id, uint64_t probe_id)
{
    swp_control m = STREAMWIRE__V1__CONTROL__INIT;
    char ctl[SWT_SUBJECT_MAX], reply[SWT_SUBJECT_MAX];
    uint8_t buf[SWE_PROBE_MSG_MAX];
    size_t len;
    m.version = SW_PROTOCOL_VERSION;
    m.kind = STREAMWIRE__V1__CONTROL_KIND__CONTROL_PROBE;
    if (id != NULL) {
        m.request_id.data = (uint8_t *)id;
        m.request_id.len = SW_REQUEST_ID_BYTES;
    }
    m.router_id = r->id;
    m.probe_id = probe_id;
    return swt_subject_control(ctl, sizeof(ctl), inst) == SW_OK &&
           swt_subject_probe_reply(reply, sizeof(reply), r->id, inst) == SW_OK &&
           swp_encode(&m, buf, sizeof(buf), &len) == SW_OK &&
           swt_publish(r->conn, ctl, reply, buf, len) == SW_OK;
}

/* The answer p to a stream probe, on the probe-answer subject of instance
 * inst. It counts, as a sign of its stream's life, only if its probe id
 * is one out now (then it is taken: one answer counts; a recorded answer
 * replayed later counts for nothing), the stream is still on the request
 * asked about and on inst (a re-route may have moved it: an answer from
 * elsewhere takes nothing, and the right one still counts), and the
 * worker knows the stream. */
static void
stream_probe_answer(sw_router *r, const char *inst, const swp_probe_reply *p)
{
    uint8_t id[SW_REQUEST_ID_BYTES];
    sw_stream *s = NULL;
    int counted;
    int64_t now = swi_now_ms();
    pthread_mutex_lock(&r->mu);
    if (swe_sprobes_peek(&r->sprobes, p->probe_id, now, id) &&
        (s = swi_idmap_get(&r->streams, id)) != NULL &&
        strcmp(swe_instance(s), inst) == 0) { /* (published: r->mu is enough) */
        swe_stream_ref(s);
        (void)swe_sprobes_take(&r->sprobes, p->probe_id, now, id);
    } else {
        s = NULL;
    }
    pthread_mutex_unlock(&r->mu);
    if (s == NULL)
        return;
    counted = swe_stream_answered(s, id, p->known != 0, p->last_seq);
    swe_stream_unref(s);
    if (counted) {
        pthread_mutex_lock(&r->mu);
        r->st.stream_probes_answered++;
        pthread_mutex_unlock(&r->mu);
    }
}

void
swe_stream_ask(sw_stream *s, unsigned gen)
{
    sw_router *r = s->r;
    char inst[SW_MAX_TOKEN + 1];
    uint8_t id[SW_REQUEST_ID_BYTES];
    uint64_t pid = 0;
    uint32_t tag = 0;
    int sent;
    pthread_mutex_lock(&r->mu);
    pthread_mutex_lock(&s->mu);
    swi_strlcpy(inst, swe_instance(s), sizeof(inst));
    /* Not for a worker the stream has left, nor for one whose loss the
     * instance probes are deciding (a bounce of this probe would be
     * taken for theirs). */
    if (s->in_table && s->rx.gen == gen && s->rx.term_state == SWE_TERM_NONE && !s->rx.migrating &&
        inst[0] != '\0' && !swi_peers_deciding(&r->peers, inst)) {
        memcpy(id, s->id, sizeof(id));
        pid = swe_sprobes_add(&r->sprobes, id, &tag, swi_now_ms());
        if (pid != 0)
            s->rx.ask_tag = tag;
        else
            r->st.stream_probes_full++; /* the stream is judged by its silence alone */
    }
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_unlock(&r->mu);
    if (pid == 0)
        return;
    sent = probe_publish(r, inst, id, pid);
    pthread_mutex_lock(&r->mu);
    if (sent)
        r->st.stream_probes_sent++;
    else
        swe_sprobes_drop(&r->sprobes, tag, id); /* no answer can come */
    pthread_mutex_unlock(&r->mu);
}

void
swe_on_probe_reply(const swt_msg *msg, void *arg)
{
    sw_router *r = arg;
    const char *id = swt_subject_last_token(msg->subject);
    int lost;
    int64_t silent = 0, unanswered = 0;
    uint64_t pid = 0;
    swp_probe_reply *p = NULL;
    if (id == NULL)
        return;
    if (msg->auth_failed) { /* not the instance's answer: no sign of life */
        count_auth(r);
        return;
    }
    if (msg->no_responders && sw_conn_sealed(r->conn))
        return; /* unsealed, forgeable: a sealed cluster judges by probe timeouts alone */
    /* An answer counts only if it echoes the last probe's id: a recorded
     * answer replayed later is not one. */
    if (!msg->no_responders &&
        swp_decode_probe_reply(msg->data, msg->len, SWP_MAX_PROBE_REPLY, &p) == SW_OK)
        pid = p->probe_id;
    if (p != NULL && swe_sprobe_is(pid)) {
        /* A stream probe's answer (its id has the top bit, an instance
         * probe's never): it counts for its stream, if at all, and takes
         * no part in the instance's probing. */
        stream_probe_answer(r, id, p);
        swp_free(p);
        return;
    }
    pthread_mutex_lock(&r->mu);
    if (msg->no_responders && !swi_peers_probe_out(&r->peers, id)) {
        /* A bounce names no probe. With no instance probe out it can only
         * be a stream probe's (or forged): not taken as an instance
         * probe's (it would be judged by that probe's time), but the
         * instance is probed at the next round, whose own bounce or answer
         * decides. A bounce while an instance probe is out is taken as
         * that probe's, as always (stream probes are not sent to an
         * instance whose loss is being decided: swe_stream_ask). */
        swi_peers_probe_soon(&r->peers, id);
        pthread_mutex_unlock(&r->mu);
        swi_ticker_wake(&r->ticker, SWE_REST_SHORT);
        return;
    }
    if (p != NULL && swi_peers_is_current(&r->peers, id, pid))
        /* A fresh answer names the worker's incarnation and its batches'
         * counter: heartbeat batches recorded before it never count. */
        swi_peers_beats_learn(&r->peers, id, p->incarnation, p->beats_counter);
    lost = (msg->no_responders || swi_peers_is_current(&r->peers, id, pid)) &&
           swi_peers_answer(&r->peers, id, msg->no_responders, swi_now_ms(),
                            swt_conn_up_since_ms(r->conn), &silent, &unanswered);
    pthread_mutex_unlock(&r->mu);
    swp_free(p);
    if (lost)
        swe_instance_lost(r, id, "its subscription is gone (no responders)", silent, unanswered);
    else if (msg->no_responders)
        swi_ticker_wake(&r->ticker, SWE_REST_SHORT); /* suspect: probed again at the next round */
}

typedef struct swe_activity {
    const char *id;
    int64_t since;
    int active;
} swe_activity;

static void
activity_cb(void *val, void *arg)
{
    sw_stream *s = val;
    swe_activity *a = arg;
    if (!a->active && strcmp(swe_instance(s), a->id) == 0 &&
        __atomic_load_n(&s->last_rx_ms, __ATOMIC_RELAXED) >= a->since)
        a->active = 1;
}

/* 1 if a stream to instance id received anything since `since` (r->mu
 * held): a worker that streams is alive, answered probe or not (its control
 * thread may be busy in a user's cancel callback). */
static int
inst_active_since(void *arg, const char *id, int64_t since)
{
    sw_router *r = arg;
    swe_activity a = {id, since, 0};
    swi_idmap_each(&r->streams, activity_cb, &a);
    return a.active;
}

unsigned
swe_instance_load(void *arg, const char *instance)
{
    sw_router *r = arg;
    const swi_peer *pe = swi_peers_find(&r->peers, instance);
    return pe != NULL ? pe->users : 0;
}

/* The registry removed an instance (another router reported it dead, or
 * its lease ran out). If we have streams to it, probe it now and let a
 * single miss decide. */
void
swe_on_removed(void *arg, const char *instance)
{
    sw_router *r = arg;
    pthread_mutex_lock(&r->mu);
    swi_peers_suspect(&r->peers, instance);
    pthread_mutex_unlock(&r->mu);
    swi_ticker_kick(&r->ticker);
}

void
swe_probe_round(sw_router *r, int64_t now)
{
    swi_peer_id send[SWE_PROBES_MAX];
    swi_peer_lost lost[SWE_LOST_MAX];
    size_t nsend, nlost;
    uint64_t ids[SWE_PROBES_MAX];
    pthread_mutex_lock(&r->mu);
    nsend = swi_peers_round(&r->peers, now, swt_conn_up_since_ms(r->conn), inst_active_since, r,
                            send, SWE_PROBES_MAX, lost, SWE_LOST_MAX, &nlost);
    for (size_t i = 0; i < nsend; i++)
        ids[i] = swi_peers_probe_id(&r->peers, send[i]);
    r->st.probes_sent += nsend;
    pthread_mutex_unlock(&r->mu);
    for (size_t i = 0; i < nsend; i++)
        (void)probe_publish(r, send[i], NULL, ids[i]);
    for (size_t i = 0; i < nlost; i++)
        swe_instance_lost(r, lost[i].id, "it did not answer probes (frozen or partitioned)",
                          lost[i].silent_ms, lost[i].unanswered_ms);
}
