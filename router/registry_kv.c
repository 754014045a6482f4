/* router/registry_kv.c -- the NATS JetStream KV registry backend (default).
 * Needs nats-server -js. The bucket is created if missing, with history 1
 * and a max age that garbage-collects entries nobody refreshes any more
 * (liveness itself is judged by the registry core from refresh revisions,
 * since nats-server 2.9 has no per-key TTL). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/sw_common.h"
#include <nats/nats.h>

#include "transport/sw_transport.h"
#include <streamwire/registry.h>

#define KV_OPEN_RETRY_MS 20000

typedef struct kv_state {
    jsCtx *js;
    kvStore *kv;
    sw_conn *conn;
    swi_logger log;
} kv_state;

/* The watch and the list read the bucket through a consumer of our own: a
 * JetStream push consumer of the bucket's stream (deliver last per subject,
 * no acks, an idle heartbeat) made with js_AddConsumer, delivering to an
 * inbox that a plain core subscription of the transport (swt_subscribe_plain)
 * hands to kv_on_msg. We keep its order ourselves, as an ordered consumer
 * does: each delivery says its consumer sequence in its reply subject
 * (swt_js_ack_parse), and each idle heartbeat the last one sent; one out of
 * step means a message was lost, and the consumer is made again, from
 * every current value (the registry drops what it already has by
 * revision).
 *
 * Why not nats.c's own consumers (js_Subscribe, kvWatcher): in nats.c 3.4.1
 * the read loop looks a subscription up and then uses it without a
 * reference, so removing one that is receiving can free it under the read
 * loop (nats.c issue 637, fixed in 3.5). The loop then waits forever on a
 * freed lock, and closing the connection waits for the loop: test_registry
 * hung so under ASan in CI. Unsubscribing a JetStream subscription also
 * deletes its consumer, reading the consumer's name without a lock while
 * the ordered consumer's reset, which nats.c starts on every reconnect,
 * frees it (a use-after-free ASan caught in watch_survives_server_restart).
 * swt_sub_close drains instead: the server stops sending, and what it sent
 * runs through the callback, before the subscription is freed; and deleting
 * the consumer is a plain request of ours.
 *
 * The watch's consumer is made again when the connection comes back (it
 * may have died with the old node), after a gap, and after KV_HB_MISSED
 * idle heartbeats did not come. That is the watch thread's work: it sleeps
 * on a condition until the connection's listener, a gap, the heartbeat
 * deadline or kv_unwatch wakes it. The old consumer is closed (its
 * callbacks over) before the new one is made, so the two never deliver
 * side by side (a put of the old after the delete of the new).
 *
 * Lock: kv_reader.mu, over the fields marked so; taken under the
 * connection's listener lock (kv_watch_on_state); nothing of ours is taken
 * under it, and it is never held while the registry's callback runs or
 * across a call that waits on the server. */
#define KV_HB_MS 5000         /* the watch's consumer's idle heartbeat */
#define KV_LIST_HB_MS 1000    /* a list's: its in-step heartbeat may be what ends it */
#define KV_HB_MISSED 3        /* heartbeats not seen before the watch's consumer is made again */
#define KV_WATCH_RETRY_MS 100 /* a consumer that could not be made is tried again after this */
#define KV_LIST_WAIT_MS 5000  /* a list waits this long for the next value */
#define KV_LIST_MAX_MS 30000  /* ...and this long in all */
#define KV_LIST_TRIES 3       /* a list that meets a gap starts again, this many times at most */
#define KV_DELETE_WAIT_MS 500 /* a closed consumer's deletion waits this long for the server */

struct kv_reader;
typedef struct kv_cons {
    struct kv_reader *rd;
    swt_sub *sub;
    char inbox[SWT_SUBJECT_MAX];
    char name[64];      /* the consumer's, as the server named it ("" if unknown) */
    uint64_t next_dseq; /* rd->mu: the consumer sequence the next delivery must have */
    int retired;        /* rd->mu: its deliveries are dropped (replaced, or a gap) */
} kv_cons;

/* A reader of the bucket: the watch (its thread remakes the consumer) or
 * one list (on the caller's thread). */
typedef struct kv_reader {
    kv_state *st;
    sw_registry_entry_fn fn;
    void *arg;
    int puts_only;              /* a list: deletes are not handed over */
    char pre[SW_MAX_TOKEN + 8]; /* "$KV.<bucket>." */
    size_t npre;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int remake;         /* mu: a gap, or the heartbeats say one */
    int done;           /* mu: the last current value has come (a list's end) */
    uint64_t received;  /* mu: distinct values so far (a list; stream sequences that grew) */
    uint64_t last_sseq; /* mu: the highest stream sequence delivered */
    uint64_t initial;   /* mu: how many values were current when it was made (a list;
                           UINT64_MAX until known) */
    int64_t last_rx_ms; /* mu: the last delivery or heartbeat */
    /* the watch only */
    kv_cons *cur;        /* mu: its consumer (NULL while being made) */
    int stop;            /* mu */
    uint64_t reconnects; /* the connection's count when cur was made (its thread only) */
    pthread_t thread;
    swt_listener lis;
} kv_reader;

/* 1 if a JetStream API failure may pass by itself: a clustered JetStream
 * that is still electing its meta leader or the bucket's stream leader
 * answers late (timeout) or "temporarily unavailable". A server without
 * JetStream ("no responders") is not retried. */
static int
kv_transient(natsStatus s)
{
    const char *why;
    if (s == NATS_TIMEOUT)
        return 1;
    why = nats_GetLastError(NULL);
    return why != NULL && (strstr(why, "temporarily unavailable") != NULL ||
                           strstr(why, "no suitable peers") != NULL);
}

static natsStatus
kv_bind(kv_state *st, const char *bucket, uint32_t max_age_ms, unsigned replicas)
{
    natsStatus s = js_KeyValue(&st->kv, st->js, bucket);
    if (s == NATS_NOT_FOUND) {
        kvConfig cfg;
        kvConfig_Init(&cfg);
        cfg.Bucket = bucket;
        cfg.History = 1;
        cfg.TTL = (int64_t)max_age_ms * 1000000; /* nanoseconds */
        cfg.Description = "streamwire instance registry";
        cfg.Replicas = replicas > 0 ? (int)replicas : 1;
        s = js_CreateKeyValue(&st->kv, st->js, &cfg);
        if (s != NATS_OK) /* lost a creation race? bind again */
            s = js_KeyValue(&st->kv, st->js, bucket);
    }
    return s;
}

static sw_err
kv_open_replicas(void **state, sw_conn *conn, const char *bucket, uint32_t max_age_ms,
                 unsigned replicas)
{
    kv_state *st;
    natsStatus s;
    if (conn == NULL)
        return SW_EINVAL;
    if ((st = calloc(1, sizeof(*st))) == NULL)
        return SW_ENOMEM;
    st->conn = conn;
    st->log = *swt_conn_log(conn);
    s = natsConnection_JetStream(&st->js, (natsConnection *)sw_conn_nats(conn), NULL);
    if (s == NATS_OK) {
        /* A cluster that has just started, or lost a node, may need a few
         * seconds to elect leaders: transient failures are retried for up
         * to KV_OPEN_RETRY_MS. */
        int64_t give_up = swi_now_ms() + KV_OPEN_RETRY_MS;
        int64_t pause = 100;
        while ((s = kv_bind(st, bucket, max_age_ms, replicas)) != NATS_OK && kv_transient(s) &&
               swi_now_ms() + pause < give_up) {
            struct timespec ts = {0, (long)pause * 1000000L};
            kvStore_Destroy(st->kv);
            st->kv = NULL;
            nanosleep(&ts, NULL);
            pause = pause * 2 > 1000 ? 1000 : pause * 2;
        }
    }
    if (s != NATS_OK) {
        kvStore_Destroy(st->kv);
        jsCtx_Destroy(st->js);
        free(st);
        return sw_err_from_nats(s);
    }
    *state = st;
    return SW_OK;
}

static sw_err
kv_open(void **state, sw_conn *conn, const char *bucket, uint32_t max_age_ms)
{
    return kv_open_replicas(state, conn, bucket, max_age_ms, 1);
}

static void
kv_close(void *state)
{
    kv_state *st = state;
    kvStore_Destroy(st->kv);
    jsCtx_Destroy(st->js);
    free(st);
}

/* 1 if a JetStream API error's text is the server's answer to a guarded
 * write whose guard failed ("wrong last sequence: N", JetStream error
 * 10071; nats.c 3.4.1 returns NATS_ERR with the text and keeps the code to
 * itself). */
static int
kv_wrong_last(const char *text)
{
    return text != NULL && strstr(text, "wrong last sequence") != NULL;
}

static sw_err
kv_put(void *state, const char *key, const uint8_t *val, size_t len, uint64_t expect_rev,
       uint64_t *rev)
{
    kv_state *st = state;
    natsStatus s;
    uint64_t r = 0;
    if (len > (size_t)INT32_MAX)
        return SW_EMSGSIZE;
    if (expect_rev == 0) {
        s = kvStore_Put(&r, st->kv, key, val, (int)len);
    } else {
        s = kvStore_Update(&r, st->kv, key, val, (int)len, expect_rev);
        if (s == NATS_ERR && kv_wrong_last(nats_GetLastError(NULL))) {
            /* The guard failed: tell "someone else wrote" from "gone". Any
             * other failure (a timeout, no JetStream, the connection
             * down, another API error) is the store's, and said as such:
             * it is no word on the entry. */
            kvEntry *e = NULL;
            natsStatus g = kvStore_Get(&e, st->kv, key);
            kvEntry_Destroy(e);
            if (g == NATS_NOT_FOUND)
                return SW_ENOTFOUND;
            return g == NATS_OK ? SW_EBUSY : sw_err_from_nats(g);
        }
    }
    if (s != NATS_OK)
        return sw_err_from_nats(s);
    if (rev != NULL)
        *rev = r;
    return SW_OK;
}

static sw_err
kv_del(void *state, const char *key)
{
    kv_state *st = state;
    natsStatus s = kvStore_Delete(st->kv, key);
    return sw_err_from_nats(s);
}

/* The bucket's stream and its subjects' filter. */
static void
kv_names(const kv_reader *rd, char *stream, size_t scap, char *filter, size_t fcap)
{
    snprintf(stream, scap, "KV_%s", kvStore_Bucket(rd->st->kv));
    snprintf(filter, fcap, "%s>", rd->pre);
}

/* A delivery of the consumer, or its heartbeat (nats.c's delivery thread of
 * c's subscription, one at a time). */
static void
kv_on_msg(const swt_msg *m, void *arg)
{
    kv_cons *c = arg;
    kv_reader *rd = c->rd;
    swt_js_ack a;
    sw_registry_entry re;
    const char *op;
    int deleted;
    pthread_mutex_lock(&rd->mu);
    if (c->retired) {
        pthread_mutex_unlock(&rd->mu);
        return;
    }
    rd->last_rx_ms = swi_now_ms();
    if (swt_js_ack_parse(m->reply, &a) != 0) {
        /* A status: an idle heartbeat names the last delivery it follows. */
        const char *last = swt_msg_header(m, "Nats-Last-Consumer");
        uint64_t n;
        if (last != NULL && swt_u64_parse(last, &n) == 0) {
            if (n + 1 != c->next_dseq) {
                c->retired = 1;
                rd->remake = 1;
                pthread_cond_broadcast(&rd->cv);
            } else if (!rd->done) {
                /* in step, and the server had nothing left to send: a
                 * list whose last current value went (max age) ends */
                rd->done = 1;
                pthread_cond_broadcast(&rd->cv);
            }
        }
        pthread_mutex_unlock(&rd->mu);
        return;
    }
    if (a.consumer_seq != c->next_dseq) { /* one was lost: start again */
        c->retired = 1;
        rd->remake = 1;
        pthread_cond_broadcast(&rd->cv);
        pthread_mutex_unlock(&rd->mu);
        return;
    }
    c->next_dseq++;
    /* A value replaced between the consumer's making and its delivery
     * makes the server send the next subject's twice: count values. */
    if (a.stream_seq > rd->last_sseq) {
        rd->last_sseq = a.stream_seq;
        rd->received++;
    }
    /* The current values are in: the server says none is left, or as many
     * came as were current when the consumer was made (while values are
     * written, "left" counts the new ones too and may not reach 0). */
    if ((a.pending == 0 || rd->received >= rd->initial) && !rd->done) {
        rd->done = 1;
        pthread_cond_broadcast(&rd->cv);
    }
    pthread_mutex_unlock(&rd->mu);
    if (m->subject == NULL || strncmp(m->subject, rd->pre, rd->npre) != 0 ||
        m->subject[rd->npre] == '\0')
        return;
    op = swt_msg_header(m, "KV-Operation");
    deleted = op != NULL && (strcmp(op, "DEL") == 0 || strcmp(op, "PURGE") == 0);
    if (deleted && rd->puts_only)
        return;
    re.key = m->subject + rd->npre;
    re.value = m->data;
    re.len = m->len;
    re.revision = a.stream_seq;
    re.created_unix_ms = (int64_t)(a.timestamp_ns / 1000000);
    rd->fn(rd->arg, &re, deleted);
}

/* Makes a consumer of every current value and what follows (rd->mu not
 * held); *pending, if asked, is how many current values it has to send. */
static sw_err
kv_cons_make(kv_reader *rd, kv_cons **out, uint64_t *pending)
{
    kv_cons *c = calloc(1, sizeof(*c));
    char stream[SW_MAX_TOKEN + 8], filter[sizeof(rd->pre) + 1];
    jsConsumerConfig cc;
    jsConsumerInfo *ci = NULL;
    jsOptions jo;
    natsStatus s;
    sw_err e;
    if (c == NULL)
        return SW_ENOMEM;
    c->rd = rd;
    c->next_dseq = 1;
    if ((e = swt_conn_new_inbox(rd->st->conn, c->inbox, sizeof(c->inbox))) != SW_OK ||
        (e = swt_subscribe_plain(rd->st->conn, &c->sub, c->inbox, kv_on_msg, c)) != SW_OK) {
        free(c);
        return e;
    }
    kv_names(rd, stream, sizeof(stream), filter, sizeof(filter));
    jsConsumerConfig_Init(&cc);
    cc.Description = "streamwire registry watch";
    cc.DeliverSubject = c->inbox;
    cc.DeliverPolicy = js_DeliverLastPerSubject;
    cc.AckPolicy = js_AckNone;
    cc.FilterSubject = filter;
    cc.ReplayPolicy = js_ReplayInstant;
    /* A list that cannot count its way to the end (a value went, max age,
     * between the consumer's making and its delivery) ends on an in-step
     * heartbeat: sent every KV_LIST_HB_MS, well inside the list's
     * KV_LIST_WAIT_MS of silence. (At KV_HB_MS, equal to that wait, the
     * two raced, and such a list could time out.) */
    cc.Heartbeat = (int64_t)(rd->puts_only ? KV_LIST_HB_MS : KV_HB_MS) * 1000000;
    cc.MemoryStorage = true;
    jsOptions_Init(&jo);
    jo.Wait = 5000;
    s = js_AddConsumer(&ci, rd->st->js, stream, &cc, &jo, NULL);
    if (s != NATS_OK) {
        swt_sub_close(rd->st->conn, &c->sub);
        free(c);
        return sw_err_from_nats(s);
    }
    snprintf(c->name, sizeof(c->name), "%s", ci->Name != NULL ? ci->Name : "");
    if (pending != NULL)
        *pending = ci->NumPending;
    jsConsumerInfo_Destroy(ci);
    *out = c;
    return SW_OK;
}

/* Closes c (rd->mu not held): when this returns 1 its callback has run for
 * the last time. The consumer itself is deleted if the server answers soon
 * (else it goes by itself once nobody listens). 0: nats.c never completed
 * the subscription, whose callback may still run: c and its reader are
 * left allocated (logged by the transport). NULL ok. */
static int
kv_cons_free(kv_cons *c)
{
    kv_reader *rd;
    if (c == NULL)
        return 1;
    rd = c->rd;
    if (!swt_sub_close(rd->st->conn, &c->sub))
        return 0;
    if (c->name[0] != '\0' && sw_conn_status(rd->st->conn) == SW_CONN_CONNECTED) {
        char stream[SW_MAX_TOKEN + 8], filter[sizeof(rd->pre) + 1];
        jsOptions jo;
        kv_names(rd, stream, sizeof(stream), filter, sizeof(filter));
        jsOptions_Init(&jo);
        jo.Wait = KV_DELETE_WAIT_MS;
        (void)js_DeleteConsumer(rd->st->js, stream, c->name, &jo, NULL);
    }
    free(c);
    return 1;
}

static void
kv_reader_init(kv_reader *rd, kv_state *st, sw_registry_entry_fn fn, void *arg)
{
    rd->st = st;
    rd->fn = fn;
    rd->arg = arg;
    snprintf(rd->pre, sizeof(rd->pre), "$KV.%s.", kvStore_Bucket(st->kv));
    rd->npre = strlen(rd->pre);
    rd->initial = UINT64_MAX;
    pthread_mutex_init(&rd->mu, NULL);
    swi_cond_init(&rd->cv);
}

static void
kv_reader_fini(kv_reader *rd)
{
    pthread_mutex_destroy(&rd->mu);
    pthread_cond_destroy(&rd->cv);
}

/* Every current put, then returns: a consumer of its own, read until it has
 * sent as many values as were current when it was made, or says none is
 * left; SW_ETIMEDOUT if it goes KV_LIST_WAIT_MS without a message or takes
 * KV_LIST_MAX_MS in all. A gap starts it again (SW_EPROTO after
 * KV_LIST_TRIES). */
static sw_err
kv_list(void *state, sw_registry_entry_fn fn, void *arg)
{
    kv_reader *rd = calloc(1, sizeof(*rd)); /* (left allocated if a callback may still run) */
    int64_t give_up = swi_now_ms() + KV_LIST_MAX_MS;
    sw_err rv = SW_OK;
    if (rd == NULL)
        return SW_ENOMEM;
    kv_reader_init(rd, state, fn, arg);
    rd->puts_only = 1;
    for (int tries = 0; tries < KV_LIST_TRIES; tries++) {
        kv_cons *c = NULL;
        uint64_t pending = 0;
        int done, gap;
        if ((rv = kv_cons_make(rd, &c, &pending)) != SW_OK)
            break;
        pthread_mutex_lock(&rd->mu);
        rd->last_rx_ms = swi_now_ms();
        rd->initial = pending;
        if (rd->received >= rd->initial)
            rd->done = 1; /* all came already, or an empty bucket: nothing will come */
        for (;;) {
            int64_t until = rd->last_rx_ms + KV_LIST_WAIT_MS;
            if (until > give_up)
                until = give_up;
            if (rd->done || rd->remake || swi_now_ms() >= until)
                break;
            swi_cond_wait_until(&rd->cv, &rd->mu, until);
        }
        done = rd->done && !rd->remake;
        gap = rd->remake;
        /* Retired even when done: whatever it delivers after the value
         * that ended the list (new writes, which the watch carries) is not
         * the list's, and should its subscription not complete below (c
         * and rd then stay allocated), a late delivery must not reach fn,
         * whose argument is the caller's and gone. The value that ended it
         * is past this check already (kv_on_msg tests it first). */
        c->retired = 1;
        rd->remake = 0;
        rd->done = 0;
        rd->received = 0;
        rd->last_sseq = 0;
        rd->initial = UINT64_MAX;
        pthread_mutex_unlock(&rd->mu);
        /* (what it had delivered runs through kv_on_msg first) */
        if (!kv_cons_free(c))
            return SW_EINTERNAL; /* rd stays: the callback may still run */
        if (done)
            break;
        rv = gap && swi_now_ms() < give_up ? SW_EPROTO : SW_ETIMEDOUT;
        if (rv == SW_ETIMEDOUT)
            break;
    }
    kv_reader_fini(rd);
    free(rd);
    return rv;
}

/* The connection's state changed (nats.c's callback thread, its listener
 * lock held): the watch thread looks. */
static void
kv_watch_on_state(void *arg, sw_conn_state st)
{
    kv_reader *rd = arg;
    (void)st;
    pthread_mutex_lock(&rd->mu);
    pthread_cond_broadcast(&rd->cv);
    pthread_mutex_unlock(&rd->mu);
}

static void *
kv_watch_main(void *arg)
{
    kv_reader *rd = arg;
    sw_conn *conn = rd->st->conn;
    int64_t retry_at = 0;
    int failing = 0;
    pthread_mutex_lock(&rd->mu);
    while (!rd->stop) {
        uint64_t rc = sw_conn_reconnects(conn);
        sw_conn_state cs = sw_conn_status(conn);
        int64_t now = swi_now_ms(), hb_due = rd->last_rx_ms + (int64_t)KV_HB_MS * KV_HB_MISSED;
        int want = rd->remake || rc != rd->reconnects || rd->cur == NULL;
        if (cs == SW_CONN_CONNECTED && rd->cur != NULL && now >= hb_due)
            want = 1; /* its heartbeats stopped: it is gone */
        if (want && cs == SW_CONN_CLOSED) {
            rd->remake = 0; /* closed for good: nothing will ever come */
            rd->reconnects = rc;
            want = 0;
        }
        if (want && cs == SW_CONN_CONNECTED) {
            kv_cons *old = rd->cur, *c = NULL;
            sw_err e;
            if (now < retry_at) { /* the last try failed */
                swi_cond_wait_until(&rd->cv, &rd->mu, retry_at);
                continue;
            }
            if (old != NULL)
                old->retired = 1;
            rd->cur = NULL;
            rd->remake = 0;
            pthread_mutex_unlock(&rd->mu);
            kv_cons_free(old); /* its callback is over before the new one starts */
            e = kv_cons_make(rd, &c, NULL);
            pthread_mutex_lock(&rd->mu);
            if (e != SW_OK) {
                retry_at = swi_now_ms() + KV_WATCH_RETRY_MS;
                if (!failing++) {
                    pthread_mutex_unlock(&rd->mu);
                    swi_log(&rd->st->log, SW_LOG_WARN,
                            "registry: the store's watch could not be made again (%s); trying "
                            "every %d ms",
                            sw_err_name(e), KV_WATCH_RETRY_MS);
                    pthread_mutex_lock(&rd->mu);
                }
                continue;
            }
            rd->cur = c;
            rd->reconnects = rc;
            rd->last_rx_ms = swi_now_ms();
            if (failing) {
                failing = 0;
                pthread_mutex_unlock(&rd->mu);
                swi_log(&rd->st->log, SW_LOG_INFO, "registry: the store's watch is made again");
                pthread_mutex_lock(&rd->mu);
            }
            continue;
        }
        /* Nothing to do, or down: the listener wakes us when it is back,
         * a gap at once, and the heartbeats' deadline at the latest. */
        if (cs == SW_CONN_CONNECTED && rd->cur != NULL)
            swi_cond_wait_until(&rd->cv, &rd->mu, hb_due);
        else
            pthread_cond_wait(&rd->cv, &rd->mu);
    }
    pthread_mutex_unlock(&rd->mu);
    return NULL;
}

/* Ends the watch: its thread, then its consumer. */
static void
kv_watch_end(kv_reader *rd, int thread)
{
    kv_cons *c;
    swt_conn_unlisten(rd->st->conn, &rd->lis);
    pthread_mutex_lock(&rd->mu);
    rd->stop = 1;
    pthread_cond_broadcast(&rd->cv);
    pthread_mutex_unlock(&rd->mu);
    if (thread)
        pthread_join(rd->thread, NULL);
    pthread_mutex_lock(&rd->mu);
    c = rd->cur;
    rd->cur = NULL;
    if (c != NULL)
        c->retired = 1; /* nothing more reaches the registry */
    pthread_mutex_unlock(&rd->mu);
    if (!kv_cons_free(c))
        return; /* rd stays: c's callback may still run */
    kv_reader_fini(rd);
    free(rd);
}

static sw_err
kv_watch_add(void *state, sw_registry_entry_fn fn, void *arg, void **handle)
{
    kv_state *st = state;
    kv_reader *rd = calloc(1, sizeof(*rd));
    kv_cons *c = NULL;
    sw_err rv;
    if (rd == NULL)
        return SW_ENOMEM;
    kv_reader_init(rd, st, fn, arg);
    rd->reconnects = sw_conn_reconnects(st->conn);
    rd->lis.fn = kv_watch_on_state;
    rd->lis.arg = rd;
    swt_conn_listen(st->conn, &rd->lis);
    if ((rv = kv_cons_make(rd, &c, NULL)) != SW_OK) {
        kv_watch_end(rd, 0);
        return rv;
    }
    pthread_mutex_lock(&rd->mu);
    rd->cur = c;
    rd->last_rx_ms = swi_now_ms();
    pthread_mutex_unlock(&rd->mu);
    if (pthread_create(&rd->thread, NULL, kv_watch_main, rd) != 0) {
        kv_watch_end(rd, 0);
        return SW_ENOMEM;
    }
    *handle = rd;
    return SW_OK;
}

static void
kv_unwatch(void *state, void *handle)
{
    (void)state;
    kv_watch_end(handle, 1);
}
/* The store answers when the bucket's stream answers a STREAM.INFO: that
 * needs its leader, as every write does. Half a second at most. */
static sw_err
kv_ping(void *state)
{
    kv_state *st = state;
    char subj[SW_MAX_TOKEN + 64];
    natsMsg *reply = NULL;
    natsStatus s;
    sw_err rv = SW_OK;
    snprintf(subj, sizeof(subj), "$JS.API.STREAM.INFO.KV_%s", kvStore_Bucket(st->kv));
    s = natsConnection_Request(&reply, (natsConnection *)sw_conn_nats(st->conn), subj, NULL, 0,
                               500);
    if (s != NATS_OK)
        return sw_err_from_nats(s);
    if (natsMsg_IsNoResponders(reply))
        rv = SW_NO_RESPONDERS;
    else {
        /* a JSON answer; one with "error" (e.g. 503, no leader) is no */
        const char *d = natsMsg_GetData(reply);
        int n = natsMsg_GetDataLength(reply);
        for (int i = 0; d != NULL && i + 7 <= n; i++)
            if (memcmp(d + i, "\"error\"", 7) == 0) {
                rv = SW_EBUSY;
                break;
            }
    }
    natsMsg_Destroy(reply);
    return rv;
}

static const sw_registry_backend kv_backend = {
    .name = "nats-kv",
    .version = SW_REGISTRY_BACKEND_VERSION,
    .open = kv_open,
    .open_opts = kv_open_replicas,
    .close = kv_close,
    .put = kv_put,
    .del = kv_del,
    .list = kv_list,
    .watch = kv_watch_add,
    .unwatch = kv_unwatch,
    .ping = kv_ping,
};

const sw_registry_backend *
sw_registry_backend_nats_kv(void)
{
    return &kv_backend;
}
