/* egress/migrate.c -- migration (docs/MIGRATION.md): a stream whose worker
 * was lost (instance_lost, stream_incomplete) or handed it back while
 * draining moves to another live instance.
 *
 * The stream is re-keyed to a new request id: the old id leaves the router's
 * table first, so nothing the old worker sends later (a frozen one may wake
 * up) can reach the consumer, and the old worker is told to stop (a CANCEL,
 * sent again until it answers). The request goes out again, as first
 * encoded but with the new id, the deadline left, and either resume_from_seq
 * (the worker continues where the consumer is) or what the user's migrate
 * callback rebuilt. The receive state machine (rx.c) continues the
 * consumer's sequence after the last item received.
 *
 * Runs on the thread that noticed the loss (nats.c's delivery thread, or
 * the ticker), with no lock held around the callback or I/O. Locks: r->mu,
 * then s->mu for the re-keying (s->id and the instance are written
 * under both). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "egress/egress_int.h"

const char *
swe_gen_instance(sw_stream *s, unsigned gen)
{
    if (s->mig != NULL && s->mig->insts != NULL)
        return s->mig->insts[gen];
    return swe_instance(s);
}

void
swe_migrate_fini(sw_stream *s)
{
    if (s->mig == NULL)
        return;
    free(s->mig->insts);
    free(s->mig->inst_list);
    free(s->mig);
}

/* Ends a stream whose migration did not happen (no lock held). */
static void
mig_give_up(sw_stream *s, sw_err err, const char *msg)
{
    char tag[SWI_LOGTAG_MAX];
    swe_rx_act act;
    int set;
    pthread_mutex_lock(&s->mu);
    set = swe_rx_migration_failed(&s->rx, err, msg, swi_now_ms(), &act);
    swi_due_set(s->next_tick, swe_rx_next_due(&s->rx));
    pthread_mutex_unlock(&s->mu);
    if (!set)
        return;
    __atomic_fetch_add(&s->r->migration_failures, 1, __ATOMIC_RELAXED);
    swi_log(&s->r->log, SW_LOG_INFO, "stream %s: not migrated: %s", swe_logtag(s, tag), msg);
    swe_apply(s, &act);
}

/* The data items received so far, for the callback (s->mu held). NULL
 * with *n 0 if there are none; NULL with *n 1 if out of memory. */
static sw_item *
mig_items(sw_stream *s, size_t *n)
{
    sw_item *v;
    *n = swe_rx_nhist(&s->rx);
    if (*n == 0)
        return NULL;
    if ((v = calloc(*n, sizeof(*v))) == NULL)
        return NULL;
    for (size_t i = 0; i < *n; i++) {
        const swe_q *q = s->rx.hist->v[i];
        v[i].kind = SW_ITEM_DATA;
        v[i].seq = q->seq;
        v[i].data = q->data;
        v[i].len = q->len;
        v[i].droppable = q->droppable;
        v[i].event = q->event;
        v[i].instance_id = swe_gen_instance(s, q->gen);
    }
    return v;
}

/* Re-keys s to new_id on instance next (r->mu and s->mu held). Returns 0,
 * or -1 if out of memory. */
static int
mig_commit(sw_stream *s, const uint8_t *new_id, const char *next, int64_t now)
{
    unsigned gen = s->rx.gen, cap = s->rx.cfg.migrations + 1;
    /* the instance a re-route left comes first in the list (it was sent
     * the request too), though it is no generation of the stream */
    const char *bounced = s->inst_second != NULL ? s->inst_first : NULL;
    size_t need = bounced != NULL ? strlen(bounced) + 1 : 0;
    char *list;
    if (s->mig->insts == NULL) {
        if ((s->mig->insts = calloc(cap, sizeof(*s->mig->insts))) == NULL)
            return -1;
        snprintf(s->mig->insts[0], sizeof(s->mig->insts[0]), "%s", swe_instance(s));
    }
    if (gen + 1 >= cap)
        return -1; /* cannot happen: rx counts the migrations left */
    for (unsigned i = 0; i <= gen + 1; i++)
        need += strlen(i <= gen ? s->mig->insts[i] : next) + 1;
    if ((list = malloc(need)) == NULL)
        return -1;
    list[0] = '\0';
    if (bounced != NULL) {
        strcat(list, bounced);
        strcat(list, ",");
    }
    for (unsigned i = 0; i <= gen + 1; i++) {
        if (i > 0)
            strcat(list, ",");
        strcat(list, i <= gen ? s->mig->insts[i] : next);
    }
    free(s->mig->inst_list);
    s->mig->inst_list = list;
    snprintf(s->mig->insts[gen + 1], sizeof(s->mig->insts[0]), "%s", next);
    __atomic_store_n(&s->inst_pub, s->mig->insts[gen + 1], __ATOMIC_RELEASE);
    free(s->req_buf); /* no re-route of the first request any more */
    s->req_buf = NULL;
    memcpy(s->id, new_id, SW_REQUEST_ID_BYTES);
    swe_rx_migrated(&s->rx, now);
    return 0;
}

void
swe_migrate(sw_stream *s)
{
    char tag[SWI_LOGTAG_MAX];
    sw_router *r = s->r;
    char old_inst[SW_MAX_TOKEN + 1], next[SW_MAX_TOKEN + 1];
    char old_subj[SWT_SUBJECT_MAX], req_subj[SWT_SUBJECT_MAX], resp_subj[SWT_SUBJECT_MAX];
    char new_hex[SW_REQUEST_ID_HEX], msg[256];
    uint8_t old_id[SW_REQUEST_ID_BYTES], new_id[SW_REQUEST_ID_BYTES];
    swp_request *orig = NULL;
    swp_request m = STREAMWIRE__V1__REQUEST__INIT;
    sw_migration mg;
    sw_item *items = NULL;
    uint8_t *buf = NULL;
    size_t blen = 0;
    int from_final, gone = 0, none = 0, nomem = 0, migratable = 0, closing = 0;
    int64_t now, deadline = -1;
    unsigned attempt, limit;
    sw_err why, rv;

    memset(&mg, 0, sizeof(mg));
    swe_stream_ref(s);
    pthread_mutex_lock(&s->mu);
    if (!s->rx.migrating) {
        pthread_mutex_unlock(&s->mu);
        swe_stream_unref(s);
        return;
    }
    why = s->rx.mig_why;
    if (s->mig == NULL) { /* cannot happen: rx migrates only a stream opened to */
        pthread_mutex_unlock(&s->mu);
        mig_give_up(s, why, "the request was not kept");
        swe_stream_unref(s);
        return;
    }
    from_final = s->rx.mig_from_final;
    attempt = s->rx.gen + 1;
    limit = s->rx.cfg.migrations;
    snprintf(old_inst, sizeof(old_inst), "%s", swe_instance(s));
    swe_control_subject(old_subj, old_inst);
    memcpy(old_id, s->id, sizeof(old_id));
    pthread_mutex_unlock(&s->mu);

    /* The old request id leaves the table: whatever the old worker still
     * sends finds no stream. */
    pthread_mutex_lock(&r->mu);
    if (s->in_table) {
        (void)swi_idmap_del(&r->streams, old_id);
        if (s->pooled) {
            s->pooled = 0;
            swi_peers_release(&r->peers, old_inst);
        }
    }
    pthread_mutex_unlock(&r->mu);
    if (!from_final) {
        /* It may be alive (frozen, cut off): it stops, now or when it wakes. */
        swe_send_control_to(r, old_subj, old_id, STREAMWIRE__V1__CONTROL_KIND__CONTROL_CANCEL, 0, 0,
                            0, 0);
        swe_cancel_wait_to(s, old_subj, old_id, 0);
    }
    (void)swr_pool_quarantine(r->pool, old_inst); /* local: not picked again at once */

    /* The request for the next instance. */
    if (swp_decode_request(s->mig->req, s->mig->req_len, 8 * s->mig->req_len + 65536, &orig) !=
        SW_OK) {
        mig_give_up(s, why, "the request could not be rebuilt");
        goto out;
    }
    mg.payload = orig->payload.data;
    mg.len = orig->payload.len;
    mg.max_tokens = orig->max_tokens;
    mg.attempt = attempt;
    mg.why = why;
    mg.lost_instance = old_inst;
    mg.new_max_tokens = orig->max_tokens;
    pthread_mutex_lock(&s->mu);
    mg.resume_from_seq = s->rx.seq_base + s->rx.gen_items + 1;
    if (s->mig->fn != NULL) {
        items = mig_items(s, &mg.nitems);
        mg.items = items;
    }
    pthread_mutex_unlock(&s->mu);
    if (s->mig->fn != NULL) {
        if (items == NULL && mg.nitems != 0) {
            mig_give_up(s, why, "out of memory for the items received so far");
            goto out;
        }
        rv = s->mig->fn(&mg, s->mig->arg);
        free(items);
        items = NULL;
        if (rv != SW_OK) {
            free(mg.new_payload);
            mg.new_payload = NULL;
            snprintf(msg, sizeof(msg), "the migrate callback declined (%s) after %s of %s",
                     sw_err_name(rv), sw_err_name(why), old_inst);
            mig_give_up(s, why, msg);
            goto out;
        }
    }

    /* The next instance, and the stream re-keyed to a new request id. */
    swi_random(new_id, sizeof(new_id));
    swi_hex(new_hex, new_id, sizeof(new_id));
    now = swi_now_ms();
    pthread_mutex_lock(&r->mu);
    if (!s->in_table || r->closing) {
        gone = 1;
        closing = r->closing && s->in_table;
    } else if (swr_pool_pick(r->pool, s->endpoint, swe_instance_load, r, next) != SW_OK)
        none = 1;
    else if (swi_idmap_put(&r->streams, new_id, s) != 0)
        nomem = 1;
    else if (swi_peers_use(&r->peers, next, now) != 0) {
        (void)swi_idmap_del(&r->streams, new_id);
        nomem = 1;
    } else {
        pthread_mutex_lock(&s->mu);
        if (!s->rx.migrating || mig_commit(s, new_id, next, now) != 0) {
            /* Ended meanwhile (a cancel, the deadline), or no memory. */
            gone = !s->rx.migrating;
            nomem = !gone;
            (void)swi_idmap_del(&r->streams, new_id);
            swi_peers_release(&r->peers, next);
        } else {
            s->pooled = 1;
            migratable = s->rx.mig_left > 0;
            /* Silence counts again (only the deadline did while it moved):
             * planned from the move, or a request that the new instance
             * never answers would wait for ever without a deadline. */
            swi_due_set(s->next_tick, swe_rx_next_due(&s->rx));
        }
        deadline = s->rx.cfg.deadline_ms;
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_unlock(&r->mu);
    if (closing) {
        /* sw_router_destroy: its sweep of the table no longer finds this
         * stream (the old id left it above), so it ends here as the sweep
         * would have ended it, once the move is given up. */
        mig_give_up(s, SW_ECLOSED, "the router was destroyed");
        swe_end_destroyed(s);
    }
    if (gone)
        goto out;
    if (none || nomem) {
        snprintf(msg, sizeof(msg), "%s after %s of instance %s",
                 none ? "no live instance to migrate the stream to" : "out of memory",
                 sw_err_name(why), old_inst);
        mig_give_up(s, none ? SW_NO_INSTANCES : SW_ENOMEM, msg);
        goto out;
    }

    /* Out it goes: the first request's fields, with what changed. */
    (void)swt_subject_response(resp_subj, sizeof(resp_subj), r->id, new_hex);
    (void)swt_subject_request(req_subj, sizeof(req_subj), s->endpoint, next);
    m.version = orig->version;
    m.request_id.data = new_id;
    m.request_id.len = sizeof(new_id);
    m.issued_unix_ms = (uint64_t)swi_unix_ms(); /* a new request */
    m.response_subject = resp_subj;
    m.router_id = orig->router_id;
    m.payload.data = mg.new_payload != NULL ? mg.new_payload : orig->payload.data;
    m.payload.len = mg.new_payload != NULL ? mg.new_len : orig->payload.len;
    m.credit_window = orig->credit_window;
    m.credit_window_max = orig->credit_window_max;
    m.credit_bytes = orig->credit_bytes;
    m.heartbeat_ms = orig->heartbeat_ms;
    m.idle_heartbeat_ms = orig->idle_heartbeat_ms;
    if (deadline >= 0) {
        int64_t left = deadline - now;
        m.deadline_ms = left < 1 ? 1 : (uint32_t)left;
    }
    m.endpoint = orig->endpoint;
    m.max_tokens = mg.new_max_tokens;
    m.n_headers = orig->n_headers;
    m.headers = orig->headers;
    m.resume_from_seq = mg.resume_from_seq;
    m.migratable = migratable;
    rv = swp_encode_alloc(&m, sw_conn_max_payload(r->conn), &buf, &blen);
    if (rv == SW_OK)
        rv = swt_publish(r->conn, req_subj, resp_subj, buf, blen);
    free(buf);
    if (rv != SW_OK) {
        /* a move that did not happen: counted with the others that failed */
        __atomic_fetch_add(&r->migration_failures, 1, __ATOMIC_RELAXED);
        swe_stream_fail(s, rv,
                        rv == SW_EMSGSIZE ? "the migrated request exceeds the server's max payload"
                                          : "the migrated request could not be published",
                        1);
    } else {
        __atomic_fetch_add(&r->migrations, 1, __ATOMIC_RELAXED);
        swi_log(&r->log, SW_LOG_INFO, "stream %s: %s on %s; migrated to %s as %s (%u of %u)",
                swe_logtag(s, tag), sw_err_name(why), old_inst, next, new_hex, attempt, limit);
    }
out:
    free(items);
    free(mg.new_payload);
    swp_free(orig);
    swe_stream_unref(s);
}
