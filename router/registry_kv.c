/* router/registry_kv.c -- the NATS JetStream KV registry backend (default).
 * Needs nats-server -js. The bucket is created if missing, with history 1
 * and a max age that garbage-collects entries nobody refreshes any more
 * (liveness itself is judged by the registry core from refresh revisions,
 * since nats-server 2.9 has no per-key TTL). */
#include <stdatomic.h>
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

typedef struct kv_watch {
    kv_state *st;
    kvWatcher *w;
    sw_registry_entry_fn fn;
    void *arg;
    pthread_t thread;
    int started;
    atomic_int stop;
    uint64_t reconnects; /* the connection's count when the watcher was made */
    int broken;          /* the watcher failed for good: make another (watch thread) */
} kv_watch;

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
        if (s != NATS_OK) {
            /* Wrong last sequence: tell "someone else wrote" from "gone". */
            kvEntry *e = NULL;
            if (kvStore_Get(&e, st->kv, key) == NATS_NOT_FOUND)
                return SW_ENOTFOUND;
            kvEntry_Destroy(e);
            return SW_EBUSY;
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

static int64_t
kv_created_ms(kvEntry *e)
{
    int64_t c = kvEntry_Created(e);
    return c > 100000000000000LL ? c / 1000000 : c; /* nanoseconds in this nats.c */
}

/* Hands one kvEntry to fn. */
static void
kv_emit(kvEntry *e, sw_registry_entry_fn fn, void *arg)
{
    sw_registry_entry re;
    kvOperation op = kvEntry_Operation(e);
    re.key = kvEntry_Key(e);
    re.value = (const uint8_t *)kvEntry_Value(e);
    re.len = (size_t)kvEntry_ValueLen(e);
    re.revision = kvEntry_Revision(e);
    re.created_unix_ms = kv_created_ms(e);
    fn(arg, &re, op == kvOp_Delete || op == kvOp_Purge);
}

static sw_err
kv_list(void *state, sw_registry_entry_fn fn, void *arg)
{
    kv_state *st = state;
    kvWatcher *w = NULL;
    kvWatchOptions o;
    natsStatus s;
    kvWatchOptions_Init(&o);
    o.IgnoreDeletes = true;
    s = kvStore_WatchAll(&w, st->kv, &o);
    while (s == NATS_OK) {
        kvEntry *e = NULL;
        s = kvWatcher_Next(&e, w, 5000);
        if (s != NATS_OK || e == NULL)
            break; /* NULL entry: initial values done */
        if (kvEntry_Operation(e) == kvOp_Put)
            kv_emit(e, fn, arg);
        kvEntry_Destroy(e);
    }
    kvWatcher_Destroy(w);
    return sw_err_from_nats(s);
}

/* How often the watch thread looks at its stop flag. We never call
 * kvWatcher_Stop while it waits in kvWatcher_Next: nats.c 3.4 leaks the
 * message that Next received if the watcher was stopped meanwhile. */
#define KV_WATCH_POLL_MS 50

static void *
kv_watch_main(void *arg)
{
    kv_watch *kw = arg;
    while (!kw->stop) {
        kvEntry *e = NULL;
        natsStatus s;
        uint64_t rc = sw_conn_reconnects(kw->st->conn);
        if (rc != kw->reconnects || kw->broken) {
            /* Reconnected (maybe to another node): the watcher's consumer
             * may have died with the old one, and nats.c would notice only
             * after missed heartbeats (about 10 s, during which the view
             * gets no keep-alives and live entries lapse). A new watcher at
             * once replays the current values; the core drops what it knows. */
            kvWatcher *nw = NULL;
            kvWatchOptions o;
            kvWatchOptions_Init(&o);
            if (kvStore_WatchAll(&nw, kw->st->kv, &o) == NATS_OK) {
                kvWatcher_Destroy(kw->w);
                kw->w = nw;
                kw->reconnects = rc;
                kw->broken = 0;
            } else if (kw->broken) {
                struct timespec ts = {0, KV_WATCH_POLL_MS * 1000000L};
                nanosleep(&ts, NULL);
                continue;
            }
        }
        s = kvWatcher_Next(&e, kw->w, KV_WATCH_POLL_MS);
        if (s == NATS_OK && e != NULL) {
            kv_emit(e, kw->fn, kw->arg);
            kvEntry_Destroy(e);
        } else if (s != NATS_OK && s != NATS_TIMEOUT) {
            /* Closed for good: nothing will ever come (issue 11 #6: this
             * loop spun at 100% of a core). A watcher that broke (nats.c
             * gave up on its consumer, e.g. after a partition) is made
             * again; any other error (a reconnect in progress): wait a poll
             * interval rather than spin. */
            if (kw->stop || s == NATS_CONNECTION_CLOSED ||
                sw_conn_status(kw->st->conn) == SW_CONN_CLOSED)
                break;
            if (s == NATS_ILLEGAL_STATE || s == NATS_INVALID_SUBSCRIPTION)
                kw->broken = 1;
            {
                struct timespec ts = {0, KV_WATCH_POLL_MS * 1000000L};
                nanosleep(&ts, NULL);
            }
        }
    }
    return NULL;
}

static sw_err
kv_watch_add(void *state, sw_registry_entry_fn fn, void *arg, void **handle)
{
    kv_state *st = state;
    kv_watch *kw = calloc(1, sizeof(*kw));
    kvWatchOptions o;
    natsStatus s;
    if (kw == NULL)
        return SW_ENOMEM;
    kw->st = st;
    kw->fn = fn;
    kw->arg = arg;
    kvWatchOptions_Init(&o);
    kw->reconnects = sw_conn_reconnects(st->conn);
    s = kvStore_WatchAll(&kw->w, st->kv, &o);
    if (s != NATS_OK) {
        free(kw);
        return sw_err_from_nats(s);
    }
    if (pthread_create(&kw->thread, NULL, kv_watch_main, kw) != 0) {
        kvWatcher_Destroy(kw->w);
        free(kw);
        return SW_ENOMEM;
    }
    kw->started = 1;
    *handle = kw;
    return SW_OK;
}

static void
kv_unwatch(void *state, void *handle)
{
    kv_watch *kw = handle;
    (void)state;
    kw->stop = 1;
    if (kw->started)
        pthread_join(kw->thread, NULL); /* within KV_WATCH_POLL_MS */
    kvWatcher_Destroy(kw->w);
    free(kw);
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
