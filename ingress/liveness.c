/* ingress/liveness.c -- frontend liveness: probing every frontend that has
 * a live stream here, and cancelling the streams of one that is gone.
 *
 * Threads: the liveness thread (swn_ing_live_main) and the probe-answer
 * subscription's nats.c thread (swn_ing_on_live_reply). Locks: ing->live_mu
 * guards the frontend table, alone (probes are published and streams
 * cancelled after it is released); ing->mu only for snapshots and the tick
 * wait; r->mu per stream when cancelling. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sched.h"
#include "ingress/ingress_int.h"

/* Core NATS cannot tell a publisher that nobody listens any more, so the
 * worker asks: every probe_ms it sends a request to each frontend that has a
 * live stream here (sw.rtr.<router>). A dead process has no subscription,
 * and the server answers "no responders" at once; a frozen one times out. */

/* One frontend with streams here. The table is unbounded and guarded by
 * ing->live_mu; probes are asynchronous (replies on sw.lv.<instance>.*), so
 * a frozen frontend never delays the check of the others. */
typedef struct swn_frontend {
    char id[SW_MAX_TOKEN + 1];
    int seen;        /* still has a stream here this round */
    int outstanding; /* a probe is in flight */
    int64_t sent_ms;
    int misses;
} swn_frontend;

typedef char swn_fe_id[SW_MAX_TOKEN + 1];

static swn_frontend *
fe_find(sw_ingress *ing, const char *id)
{
    for (size_t i = 0; i < ing->nfe; i++)
        if (strcmp(ing->fe[i].id, id) == 0)
            return &ing->fe[i];
    return NULL;
}

static void
fe_remove(sw_ingress *ing, swn_frontend *e)
{
    *e = ing->fe[--ing->nfe];
}

static void
ing_cancel_frontend(sw_ingress *ing, const char *router_id, const char *why)
{
    swi_ptrvec vec = {NULL, 0, 0};
    unsigned n = 0;
    swn_ing_snapshot(ing, &vec, NULL);
    for (size_t i = 0; i < vec.n; i++) {
        sw_responder *r = SWN_RESP_AT(vec, i);
        if (strcmp(r->router_id, router_id) == 0) {
            int finished;
            pthread_mutex_lock(&r->mu);
            finished = r->terminated;
            pthread_mutex_unlock(&r->mu);
            if (!finished && !sw_responder_cancelled(r)) {
                swn_resp_cancel(r, 1);
                n++;
            } else if (finished) {
                /* A final waiting for an ack that will never come. */
                swn_unregister_stream(r);
            }
        }
        swn_resp_unref(r);
    }
    free(vec.v);
    if (n == 0) {
        swi_log(&ing->log, SW_LOG_DEBUG, "frontend %s %s; no stream of it was running", router_id,
                why);
        return;
    }
    pthread_mutex_lock(&ing->mu);
    ing->st.frontends_lost++;
    pthread_mutex_unlock(&ing->mu);
    swi_log(&ing->log, SW_LOG_WARN, "frontend %s %s: cancelled %u stream(s)", router_id, why, n);
}

/* A frontend answered a probe, or the server said nobody is there. */
void
swn_ing_on_live_reply(const swt_msg *msg, void *arg)
{
    sw_ingress *ing = arg;
    const char *id = swt_subject_last_token(msg->subject);
    swn_fe_id gone = "";
    swn_frontend *e;
    if (id == NULL)
        return;
    int64_t up_since = swt_conn_up_since_ms(ing->conn);
    pthread_mutex_lock(&ing->live_mu);
    if ((e = fe_find(ing, id)) != NULL) {
        if (msg->no_responders) {
            /* Proof only if our connection was up and settled when the
             * probe went out (the frontend may still be resubscribing). */
            if (up_since >= 0 && up_since + SWI_PEERS_SETTLE_MS <= e->sent_ms) {
                snprintf(gone, sizeof(gone), "%s", e->id);
                fe_remove(ing, e);
            } else {
                e->outstanding = 0;
            }
        } else {
            e->outstanding = 0;
            e->misses = 0;
        }
    }
    pthread_mutex_unlock(&ing->live_mu);
    if (gone[0] != '\0')
        ing_cancel_frontend(ing, gone, "is gone (no responders)");
}

void *
swn_ing_live_main(void *arg)
{
    sw_ingress *ing = arg;
    swi_ptrvec vec = {NULL, 0, 0};
    swn_fe_id *send = NULL, *lost = NULL;
    size_t cap = 0;
    for (;;) {
        size_t nsend = 0, nlost = 0;
        int64_t now, up_since;
        pthread_mutex_lock(&ing->mu);
        if (!ing->stopping)
            swi_cond_wait_until(&ing->tick_cv, &ing->mu, swi_now_ms() + ing->probe_ms);
        if (ing->stopping) {
            pthread_mutex_unlock(&ing->mu);
            break;
        }
        pthread_mutex_unlock(&ing->mu);
        /* Every registered stream names its frontend (router_id never
         * changes); finished ones lingering for an ack count too. */
        swn_ing_snapshot(ing, &vec, NULL);
        pthread_mutex_lock(&ing->live_mu);
        for (size_t i = 0; i < ing->nfe; i++)
            ing->fe[i].seen = 0;
        for (size_t i = 0; i < vec.n; i++) {
            const char *rid = SWN_RESP_AT(vec, i)->router_id;
            swn_frontend *e = fe_find(ing, rid);
            if (e == NULL) {
                if (ing->nfe == ing->capfe) {
                    size_t ncap = ing->capfe ? ing->capfe * 2 : 16;
                    swn_frontend *nv = realloc(ing->fe, ncap * sizeof(*nv));
                    if (nv == NULL)
                        continue;
                    ing->fe = nv;
                    ing->capfe = ncap;
                }
                e = &ing->fe[ing->nfe++];
                memset(e, 0, sizeof(*e));
                snprintf(e->id, sizeof(e->id), "%s", rid);
            }
            e->seen = 1;
        }
        if (cap < ing->nfe) {
            swn_fe_id *ns = realloc(send, ing->nfe * sizeof(*ns));
            swn_fe_id *nl = ns ? realloc(lost, ing->nfe * sizeof(*nl)) : NULL;
            if (ns != NULL)
                send = ns;
            if (nl != NULL) {
                lost = nl;
                cap = ing->nfe;
            }
        }
        now = swi_now_ms();
        up_since = swt_conn_up_since_ms(ing->conn);
        for (size_t i = 0; i < ing->nfe;) {
            swn_frontend *e = &ing->fe[i];
            if (!e->seen) {
                fe_remove(ing, e);
                continue;
            }
            if (e->outstanding && now - e->sent_ms >= (int64_t)ing->probe_timeout_ms) {
                e->outstanding = 0;
                /* Our own connection down, or back since the probe went
                 * out: the miss proves nothing about the frontend. */
                if (up_since >= 0 && up_since + SWI_PEERS_SETTLE_MS <= e->sent_ms &&
                    ++e->misses >= 2 && nlost < cap) {
                    memcpy(lost[nlost++], e->id, sizeof(swn_fe_id));
                    fe_remove(ing, e);
                    continue;
                }
            }
            if (!e->outstanding && up_since >= 0 && nsend < cap) {
                e->outstanding = 1;
                e->sent_ms = now;
                memcpy(send[nsend++], e->id, sizeof(swn_fe_id));
            }
            i++;
        }
        pthread_mutex_unlock(&ing->live_mu);
        for (size_t i = 0; i < vec.n; i++)
            swn_resp_unref(SWN_RESP_AT(vec, i));
        for (size_t i = 0; i < nsend; i++) {
            char subj[SWT_SUBJECT_MAX], reply[SWT_SUBJECT_MAX];
            if (swt_subject_router(subj, sizeof(subj), send[i]) != SW_OK ||
                swt_subject_live_reply(reply, sizeof(reply), ing->instance_id, send[i]) != SW_OK)
                continue;
            (void)swt_publish(ing->conn, subj, reply, NULL, 0);
        }
        for (size_t i = 0; i < nlost; i++)
            ing_cancel_frontend(ing, lost[i], "did not answer two probes");
    }
    free(vec.v);
    free(send);
    free(lost);
    return NULL;
}
