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

/* The watch: an ordered consumer of the whole bucket (what nats.c's own
 * kvWatcher makes, but asynchronous), whose messages nats.c's delivery
 * thread hands to kv_watch_on_msg. nats.c 3.4's kvWatcher is synchronous
 * only: a thread of ours waited in kvWatcher_Next 50 ms at a time to look
 * at its stop flag (it cannot be stopped while it waits without leaking
 * the message Next took), 20 wake-ups a second for an idle registry.
 *
 * A consumer is made again when the connection comes back (it may have
 * died with the old node, and nats.c would notice only after missed
 * heartbeats, ~10 s, while live entries lapse) and when it ends by itself.
 * That is the watch thread's work: it sleeps on a condition until the
 * connection's listener, a consumer's end or kv_unwatch wakes it.
 *
 * nats.c is given an id, not a pointer, as each consumer's closure: its
 * delivery thread may call back after any step we take (a message taken
 * just before an unsubscribe, or pushed before js_Subscribe failed and
 * destroyed the subscription itself). A callback finds its consumer by id
 * in g_kv_subs; once it is taken out of there (and the callbacks that found
 * it have returned, in_cb), later ones do nothing, and it can be freed.
 *
 * Lock: g_kv_mu, over every field of kv_sub and kv_watch's subs, stop,
 * remake and reconnects; taken under the connection's listener lock
 * (kv_watch_on_state); nothing of ours is taken under it, and it is never
 * held while the registry's callback runs or across a nats.c call that
 * waits on the server. */
typedef struct kv_sub {
    struct kv_watch *kw;
    natsSubscription *ns;
    uintptr_t id;         /* the callbacks' closure */
    int in_cb;            /* callbacks running our code now */
    int retired;          /* replaced or closing: its messages are not delivered */
    int unsubbed;         /* closed (natsSubscription_Destroy) */
    int completed;        /* nats.c's completion ran */
    struct kv_sub *next;  /* the watch's consumers */
    struct kv_sub *gnext; /* g_kv_subs */
} kv_sub;

typedef struct kv_watch {
    kv_state *st;
    sw_registry_entry_fn fn;
    void *arg;
    char pre[SW_MAX_TOKEN + 8]; /* "$KV.<bucket>." */
    size_t npre;
    pthread_cond_t cv; /* with g_kv_mu: the watch thread sleeps on it */
    kv_sub *subs;      /* the current consumer first, then retired ones */
    int stop;
    int remake;          /* the current consumer ended by itself */
    uint64_t reconnects; /* the connection's count when the current one was made */
    pthread_t thread;
    swt_listener lis;
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

static pthread_mutex_t g_kv_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_kv_cv = PTHREAD_COND_INITIALIZER; /* an in_cb fell to 0 */
static kv_sub *g_kv_subs;
static uintptr_t g_kv_next_id;

/* The consumer with this id, if it is still known (g_kv_mu held). */
static kv_sub *
kv_sub_find(uintptr_t id)
{
    for (kv_sub *ks = g_kv_subs; ks != NULL; ks = ks->gnext)
        if (ks->id == id)
            return ks;
    return NULL;
}

/* Waits until no callback runs ks's code (g_kv_mu held; released while
 * waiting). */
static void
kv_sub_wait_idle(const kv_sub *ks)
{
    while (ks->in_cb > 0)
        pthread_cond_wait(&g_kv_cv, &g_kv_mu);
}

/* Takes ks out of g_kv_subs and waits for the callbacks that found it:
 * then nothing of nats.c's reaches it (g_kv_mu held). */
static void
kv_sub_forget(kv_sub *ks)
{
    for (kv_sub **p = &g_kv_subs; *p != NULL; p = &(*p)->gnext)
        if (*p == ks) {
            *p = ks->gnext;
            break;
        }
    kv_sub_wait_idle(ks);
}

/* A message of the bucket's stream, handed to the registry as an entry. */
static void
kv_emit_msg(kv_watch *kw, natsMsg *msg)
{
    const char *subj = natsMsg_GetSubject(msg), *op = NULL;
    jsMsgMetaData *meta = NULL;
    sw_registry_entry re;
    int deleted;
    if (subj == NULL || strncmp(subj, kw->pre, kw->npre) != 0 || subj[kw->npre] == '\0' ||
        natsMsg_GetMetaData(&meta, msg) != NATS_OK)
        return;
    deleted = natsMsgHeader_Get(msg, "KV-Operation", &op) == NATS_OK && op != NULL &&
              (strcmp(op, "DEL") == 0 || strcmp(op, "PURGE") == 0);
    re.key = subj + kw->npre;
    re.value = (const uint8_t *)natsMsg_GetData(msg);
    re.len = (size_t)natsMsg_GetDataLength(msg);
    re.revision = meta->Sequence.Stream;
    re.created_unix_ms = meta->Timestamp / 1000000; /* nanoseconds */
    kw->fn(kw->arg, &re, deleted);
    jsMsgMetaData_Destroy(meta);
}

static void
kv_watch_on_msg(natsConnection *nc, natsSubscription *ns, natsMsg *msg, void *closure)
{
    kv_sub *ks;
    (void)nc;
    (void)ns;
    pthread_mutex_lock(&g_kv_mu);
    ks = kv_sub_find((uintptr_t)closure);
    if (ks != NULL && ks->retired)
        ks = NULL;
    if (ks != NULL)
        ks->in_cb++;
    pthread_mutex_unlock(&g_kv_mu);
    if (ks != NULL) {
        kv_emit_msg(ks->kw, msg);
        pthread_mutex_lock(&g_kv_mu);
        if (--ks->in_cb == 0) {
            pthread_cond_broadcast(&g_kv_cv);
            if (ks->retired) /* it can be freed now */
                pthread_cond_broadcast(&ks->kw->cv);
        }
        pthread_mutex_unlock(&g_kv_mu);
    }
    natsMsg_Destroy(msg);
}

/* nats.c's last word on a consumer. One we did not retire ended by itself
 * (in nats.c 3.4, only with the connection): made again if it can be. */
static void
kv_watch_on_complete(void *closure)
{
    kv_sub *ks;
    pthread_mutex_lock(&g_kv_mu);
    ks = kv_sub_find((uintptr_t)closure);
    if (ks != NULL) {
        ks->completed = 1;
        if (!ks->retired) {
            ks->kw->remake = 1;
            pthread_cond_broadcast(&ks->kw->cv);
        }
    }
    pthread_mutex_unlock(&g_kv_mu);
}

/* The connection's state changed (nats.c's callback thread, its listener
 * lock held): the watch thread looks. */
static void
kv_watch_on_state(void *arg, sw_conn_state st)
{
    kv_watch *kw = arg;
    (void)st;
    pthread_mutex_lock(&g_kv_mu);
    pthread_cond_broadcast(&kw->cv);
    pthread_mutex_unlock(&g_kv_mu);
}

/* A new consumer from the bucket's current values on, at the head of
 * kw->subs (g_kv_mu not held). */
static sw_err
kv_sub_make(kv_watch *kw)
{
    kv_sub *ks = calloc(1, sizeof(*ks));
    natsSubscription *ns = NULL;
    jsSubOptions so;
    char subj[sizeof(kw->pre) + 1], stream[SW_MAX_TOKEN + 8];
    void *closure;
    natsStatus s;
    if (ks == NULL)
        return SW_ENOMEM;
    ks->kw = kw;
    pthread_mutex_lock(&g_kv_mu);
    ks->id = ++g_kv_next_id;
    ks->gnext = g_kv_subs;
    g_kv_subs = ks;
    pthread_mutex_unlock(&g_kv_mu);
    closure = (void *)(uintptr_t)ks->id;
    snprintf(subj, sizeof(subj), "%s>", kw->pre);
    snprintf(stream, sizeof(stream), "KV_%s", kvStore_Bucket(kw->st->kv));
    jsSubOptions_Init(&so);
    so.Stream = stream;
    so.Ordered = true;
    so.Config.DeliverPolicy = js_DeliverLastPerSubject;
    s = js_Subscribe(&ns, kw->st->js, subj, kv_watch_on_msg, closure, NULL, &so, NULL);
    if (s == NATS_OK)
        s = natsSubscription_SetPendingLimits(ns, -1, -1);
    if (s == NATS_OK)
        s = natsSubscription_SetOnCompleteCB(ns, kv_watch_on_complete, closure);
    if (s != NATS_OK) {
        /* (Closed under us, or never made: callbacks may still come, and
         * find nothing.) */
        natsSubscription_Destroy(ns); /* (NULL ok; see kv_subs_close_retired) */
        pthread_mutex_lock(&g_kv_mu);
        kv_sub_forget(ks);
        pthread_mutex_unlock(&g_kv_mu);
        free(ks);
        return sw_err_from_nats(s);
    }
    pthread_mutex_lock(&g_kv_mu);
    ks->ns = ns;
    ks->next = kw->subs;
    kw->subs = ks;
    pthread_mutex_unlock(&g_kv_mu);
    return SW_OK;
}

/* Closes the watch's retired consumers, one at a time without the lock,
 * and frees those whose callbacks have returned; with `wait`, all of them,
 * waiting for their callbacks (g_kv_mu held).
 *
 * natsSubscription_Destroy, not Unsubscribe: Unsubscribe also deletes the
 * consumer on the server, and nats.c 3.4.1 reads the consumer's name for
 * that without its lock while the ordered consumer's reset, which nats.c
 * starts on every reconnect, frees it (a use-after-free that ASan caught in
 * test_registry watch_survives_server_restart; nats.c's own kvWatcher_Destroy
 * unsubscribes the same way). Destroy unsubscribes without deleting: the
 * server drops an ephemeral consumer that has no interest by itself. */
static void
kv_subs_close_retired(kv_watch *kw, int wait)
{
    kv_sub **p;
    for (;;) {
        kv_sub *ks = NULL;
        natsSubscription *ns;
        for (kv_sub *k = kw->subs; k != NULL && ks == NULL; k = k->next)
            if (k->retired && !k->unsubbed)
                ks = k;
        if (ks == NULL)
            break;
        ks->unsubbed = 1;
        ns = ks->ns;
        ks->ns = NULL;
        pthread_mutex_unlock(&g_kv_mu);
        natsSubscription_Destroy(ns); /* (nats.c's delivery thread holds its own reference) */
        pthread_mutex_lock(&g_kv_mu);
    }
    p = &kw->subs;
    while (*p != NULL) {
        kv_sub *ks = *p;
        if (ks->unsubbed && (wait || ks->in_cb == 0)) {
            *p = ks->next;
            kv_sub_forget(ks);
            free(ks);
        } else {
            p = &ks->next;
        }
    }
}

/* How long to wait before trying again to make a consumer that failed. */
#define KV_WATCH_RETRY_MS 100

static void *
kv_watch_main(void *arg)
{
    kv_watch *kw = arg;
    int64_t retry_at = 0;
    int failing = 0;
    pthread_mutex_lock(&g_kv_mu);
    while (!kw->stop) {
        uint64_t rc = sw_conn_reconnects(kw->st->conn);
        int want = kw->remake || rc != kw->reconnects;
        kv_subs_close_retired(kw, 0);
        if (kw->stop)
            break;
        if (want && sw_conn_status(kw->st->conn) == SW_CONN_CLOSED) {
            kw->remake = 0; /* closed for good: nothing will ever come */
            kw->reconnects = rc;
            want = 0;
        }
        if (want && sw_conn_status(kw->st->conn) == SW_CONN_CONNECTED) {
            sw_err e;
            if (swi_now_ms() < retry_at) { /* the last try failed */
                swi_cond_wait_until(&kw->cv, &g_kv_mu, retry_at);
                continue;
            }
            /* The old consumer's messages stop here: the new one replays
             * every current value, and the two delivering side by side
             * could hand the registry a put after the delete that
             * follows it. */
            for (kv_sub *k = kw->subs; k != NULL; k = k->next)
                k->retired = 1;
            /* ...and so do the ones already in the registry's callback
             * (one stalled there could hand over its put after the new
             * consumer's delete). Only this thread changes kw->subs. */
            for (kv_sub *k = kw->subs; k != NULL; k = k->next)
                kv_sub_wait_idle(k);
            kw->remake = 0;
            pthread_mutex_unlock(&g_kv_mu);
            e = kv_sub_make(kw);
            pthread_mutex_lock(&g_kv_mu);
            if (e != SW_OK) {
                /* The old one, if it still works, goes on meanwhile. */
                for (kv_sub *k = kw->subs; k != NULL; k = k->next)
                    if (!k->unsubbed && !k->completed)
                        k->retired = 0;
                kw->remake = 1;
                retry_at = swi_now_ms() + KV_WATCH_RETRY_MS;
                if (!failing++) {
                    pthread_mutex_unlock(&g_kv_mu);
                    swi_log(&kw->st->log, SW_LOG_WARN,
                            "registry: the store's watch could not be made again (%s); trying "
                            "every %d ms",
                            sw_err_name(e), KV_WATCH_RETRY_MS);
                    pthread_mutex_lock(&g_kv_mu);
                }
                continue;
            }
            kw->reconnects = rc;
            if (failing) {
                failing = 0;
                pthread_mutex_unlock(&g_kv_mu);
                swi_log(&kw->st->log, SW_LOG_INFO, "registry: the store's watch is made again");
                pthread_mutex_lock(&g_kv_mu);
            }
            continue; /* (closes the old one) */
        }
        /* Nothing to do, or down: the listener wakes us when it is back. */
        pthread_cond_wait(&kw->cv, &g_kv_mu);
    }
    pthread_mutex_unlock(&g_kv_mu);
    return NULL;
}

/* Ends the watch: its thread, then every consumer (kw->subs empty after). */
static void
kv_watch_end(kv_watch *kw, int thread)
{
    swt_conn_unlisten(kw->st->conn, &kw->lis);
    pthread_mutex_lock(&g_kv_mu);
    kw->stop = 1;
    pthread_cond_broadcast(&kw->cv);
    pthread_mutex_unlock(&g_kv_mu);
    if (thread)
        pthread_join(kw->thread, NULL);
    pthread_mutex_lock(&g_kv_mu);
    for (kv_sub *k = kw->subs; k != NULL; k = k->next)
        k->retired = 1;
    /* Once retired, no callback starts our code; the running ones are
     * waited for (kv_sub_forget), however long the registry's takes. */
    kv_subs_close_retired(kw, 1);
    pthread_mutex_unlock(&g_kv_mu);
    pthread_cond_destroy(&kw->cv);
    free(kw);
}

static sw_err
kv_watch_add(void *state, sw_registry_entry_fn fn, void *arg, void **handle)
{
    kv_state *st = state;
    kv_watch *kw = calloc(1, sizeof(*kw));
    sw_err rv;
    if (kw == NULL)
        return SW_ENOMEM;
    kw->st = st;
    kw->fn = fn;
    kw->arg = arg;
    snprintf(kw->pre, sizeof(kw->pre), "$KV.%s.", kvStore_Bucket(st->kv));
    kw->npre = strlen(kw->pre);
    swi_cond_init(&kw->cv);
    kw->reconnects = sw_conn_reconnects(st->conn);
    kw->lis.fn = kv_watch_on_state;
    kw->lis.arg = kw;
    swt_conn_listen(st->conn, &kw->lis);
    if ((rv = kv_sub_make(kw)) != SW_OK) {
        kv_watch_end(kw, 0);
        return rv;
    }
    if (pthread_create(&kw->thread, NULL, kv_watch_main, kw) != 0) {
        kv_watch_end(kw, 0);
        return SW_ENOMEM;
    }
    *handle = kw;
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
