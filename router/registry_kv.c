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

/* The watch: an ordered consumer of the whole bucket (nats.c's own
 * kvWatcher, but asynchronous), whose messages nats.c's delivery thread
 * hands to kv_watch_on_msg. nats.c 3.4's kvWatcher is synchronous only: a
 * thread of ours waited in kvWatcher_Next 50 ms at a time to look at its
 * stop flag (it cannot be stopped while it waits without leaking the
 * message Next took), 20 wake-ups a second for an idle registry.
 *
 * A consumer is made again when the connection comes back (it may have
 * died with the old node, and nats.c would notice only after missed
 * heartbeats, ~10 s, while live entries lapse) and when it ends by itself
 * (nats.c gave up on it). That is the watch thread's work: it sleeps on a
 * condition until the connection's listener, a consumer's end or
 * kv_unwatch wakes it.
 *
 * Lock: kw->mu (a leaf but for the registry's own callback, which
 * kv_watch_on_msg calls without it), over every field below and each
 * kv_sub's. */
typedef struct kv_sub {
    struct kv_watch *kw;
    natsSubscription *ns;
    int in_cb;     /* callbacks running now */
    int retired;   /* unsubscribed by us: its messages are not delivered */
    int completed; /* nats.c's completion ran: no callback will come */
    int dead;      /* closed before its completion could be set: none will */
    struct kv_sub *next;
} kv_sub;

typedef struct kv_watch {
    kv_state *st;
    sw_registry_entry_fn fn;
    void *arg;
    char pre[SW_MAX_TOKEN + 8]; /* "$KV.<bucket>." */
    size_t npre;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    kv_sub *subs; /* the current consumer first, then retired ones until completed */
    int stop;
    int remake;          /* the current consumer ended by itself */
    uint64_t reconnects; /* the connection's count when the current one was made */
    pthread_t thread;
    int started;
    int orphaned; /* a consumer may still call back: kw is never freed */
    swt_listener lis;
    struct kv_watch *next_orphan; /* on g_kv_orphans */
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

/* Watches that a consumer may still call back (kv_sub_make, kv_unwatch):
 * kept for the life of the process, reachable. */
static pthread_mutex_t g_kv_orphans_mu = PTHREAD_MUTEX_INITIALIZER;
static kv_watch *g_kv_orphans;

static void
kv_watch_orphan(kv_watch *kw)
{
    pthread_mutex_lock(&g_kv_orphans_mu);
    kw->next_orphan = g_kv_orphans;
    g_kv_orphans = kw;
    pthread_mutex_unlock(&g_kv_orphans_mu);
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
    kv_sub *ks = closure;
    kv_watch *kw = ks->kw;
    int live;
    (void)nc;
    (void)ns;
    pthread_mutex_lock(&kw->mu);
    live = !ks->retired && !ks->dead;
    ks->in_cb += live;
    pthread_mutex_unlock(&kw->mu);
    if (live) {
        kv_emit_msg(kw, msg);
        pthread_mutex_lock(&kw->mu);
        if (--ks->in_cb == 0)
            pthread_cond_broadcast(&kw->cv);
        pthread_mutex_unlock(&kw->mu);
    }
    natsMsg_Destroy(msg);
}

/* nats.c's last word on a consumer: its callback has returned for the last
 * time. One we did not retire ended by itself: made again. */
static void
kv_watch_on_complete(void *closure)
{
    kv_sub *ks = closure;
    kv_watch *kw = ks->kw;
    pthread_mutex_lock(&kw->mu);
    ks->completed = 1;
    if (!ks->retired)
        kw->remake = 1;
    pthread_cond_broadcast(&kw->cv);
    pthread_mutex_unlock(&kw->mu);
}

/* The connection's state changed (nats.c's callback thread, its listener
 * lock held): the watch thread looks. */
static void
kv_watch_on_state(void *arg, sw_conn_state st)
{
    kv_watch *kw = arg;
    (void)st;
    pthread_mutex_lock(&kw->mu);
    pthread_cond_broadcast(&kw->cv);
    pthread_mutex_unlock(&kw->mu);
}

/* A new consumer from the bucket's current values on, at the head of
 * kw->subs (kw->mu not held). */
static sw_err
kv_sub_make(kv_watch *kw)
{
    kv_sub *ks = calloc(1, sizeof(*ks));
    jsSubOptions so;
    char subj[sizeof(kw->pre) + 1], stream[SW_MAX_TOKEN + 8];
    natsStatus s;
    if (ks == NULL)
        return SW_ENOMEM;
    ks->kw = kw;
    snprintf(subj, sizeof(subj), "%s>", kw->pre);
    snprintf(stream, sizeof(stream), "KV_%s", kvStore_Bucket(kw->st->kv));
    jsSubOptions_Init(&so);
    so.Stream = stream;
    so.Ordered = true;
    so.Config.DeliverPolicy = js_DeliverLastPerSubject;
    s = js_Subscribe(&ks->ns, kw->st->js, subj, kv_watch_on_msg, ks, NULL, &so, NULL);
    if (s == NATS_OK)
        s = natsSubscription_SetPendingLimits(ks->ns, -1, -1);
    if (s == NATS_OK)
        s = natsSubscription_SetOnCompleteCB(ks->ns, kv_watch_on_complete, ks);
    if (s != NATS_OK && ks->ns != NULL) {
        /* Closed under us (the connection closed): no completion will say
         * when a callback nats.c already started returns. Callbacks from
         * now on do nothing, a running one is waited for, and the consumer
         * is kept (so is kw: kv_unwatch leaves it) for the life of the
         * process, as transport/sub.c keeps such subscriptions. */
        pthread_mutex_lock(&kw->mu);
        ks->dead = 1;
        kw->orphaned = 1;
        while (ks->in_cb > 0)
            pthread_cond_wait(&kw->cv, &kw->mu);
        ks->next = kw->subs;
        kw->subs = ks;
        pthread_mutex_unlock(&kw->mu);
        natsSubscription_Unsubscribe(ks->ns);
        return sw_err_from_nats(s);
    }
    if (s != NATS_OK) {
        free(ks);
        return sw_err_from_nats(s);
    }
    pthread_mutex_lock(&kw->mu);
    ks->next = kw->subs;
    kw->subs = ks;
    pthread_mutex_unlock(&kw->mu);
    return SW_OK;
}

/* Retires every consumer but the first (kw->mu held); returns the ones to
 * unsubscribe, which the caller does without the lock. */
static size_t
kv_subs_retire(kv_watch *kw, kv_sub *from, natsSubscription **out, size_t cap)
{
    size_t n = 0;
    for (kv_sub *ks = from; ks != NULL; ks = ks->next)
        if (!ks->retired) {
            ks->retired = 1;
            if (!ks->completed && n < cap)
                out[n++] = ks->ns;
        }
    return n;
}

/* Frees the consumers that completed, but the current one (kw->mu held). */
static void
kv_subs_reap(kv_watch *kw)
{
    kv_sub **p = &kw->subs;
    while (*p != NULL) {
        kv_sub *ks = *p;
        if (ks->completed && ks->retired && !ks->dead) {
            *p = ks->next;
            natsSubscription_Destroy(ks->ns);
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
    pthread_mutex_lock(&kw->mu);
    while (!kw->stop) {
        uint64_t rc = sw_conn_reconnects(kw->st->conn);
        int want = kw->remake || rc != kw->reconnects;
        kv_subs_reap(kw);
        if (want && sw_conn_status(kw->st->conn) == SW_CONN_CLOSED) {
            kw->remake = 0; /* closed for good: nothing will ever come */
            kw->reconnects = rc;
            want = 0;
        }
        if (want && sw_conn_status(kw->st->conn) == SW_CONN_CONNECTED) {
            kv_sub *old = kw->subs;
            natsSubscription *gone[8];
            size_t n;
            if (swi_now_ms() < retry_at) { /* the last try failed */
                swi_cond_wait_until(&kw->cv, &kw->mu, retry_at);
                continue;
            }
            kw->remake = 0;
            pthread_mutex_unlock(&kw->mu);
            if (kv_sub_make(kw) != SW_OK) {
                pthread_mutex_lock(&kw->mu);
                kw->remake = 1;
                retry_at = swi_now_ms() + KV_WATCH_RETRY_MS;
                continue;
            }
            pthread_mutex_lock(&kw->mu);
            kw->reconnects = rc;
            n = kv_subs_retire(kw, old, gone, 8);
            pthread_mutex_unlock(&kw->mu);
            for (size_t i = 0; i < n; i++)
                natsSubscription_Unsubscribe(gone[i]);
            pthread_mutex_lock(&kw->mu);
            continue;
        }
        /* Nothing to do, or down: the listener wakes us when it is back. */
        pthread_cond_wait(&kw->cv, &kw->mu);
    }
    pthread_mutex_unlock(&kw->mu);
    return NULL;
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
    pthread_mutex_init(&kw->mu, NULL);
    swi_cond_init(&kw->cv);
    kw->reconnects = sw_conn_reconnects(st->conn);
    if ((rv = kv_sub_make(kw)) != SW_OK) {
        if (kw->orphaned) {
            kv_watch_orphan(kw);
        } else {
            pthread_mutex_destroy(&kw->mu);
            pthread_cond_destroy(&kw->cv);
            free(kw);
        }
        return rv;
    }
    kw->lis.fn = kv_watch_on_state;
    kw->lis.arg = kw;
    swt_conn_listen(st->conn, &kw->lis);
    if (pthread_create(&kw->thread, NULL, kv_watch_main, kw) != 0) {
        /* No thread: nothing makes the consumer again after a reconnect. */
        kw->started = 0;
    } else {
        kw->started = 1;
    }
    *handle = kw;
    return SW_OK;
}

static void
kv_unwatch(void *state, void *handle)
{
    kv_watch *kw = handle;
    natsSubscription *gone[16];
    size_t n;
    int64_t until;
    (void)state;
    swt_conn_unlisten(kw->st->conn, &kw->lis);
    pthread_mutex_lock(&kw->mu);
    kw->stop = 1;
    pthread_cond_broadcast(&kw->cv);
    pthread_mutex_unlock(&kw->mu);
    if (kw->started)
        pthread_join(kw->thread, NULL);
    pthread_mutex_lock(&kw->mu);
    n = kv_subs_retire(kw, kw->subs, gone, 16);
    pthread_mutex_unlock(&kw->mu);
    for (size_t i = 0; i < n; i++)
        natsSubscription_Unsubscribe(gone[i]);
    /* The completion comes after a callback's last return. The bound only
     * guards against one that never comes: then kw is left allocated
     * rather than freed under a running callback. */
    pthread_mutex_lock(&kw->mu);
    until = swi_now_ms() + 10000;
    for (;;) {
        int pending = 0;
        for (kv_sub *ks = kw->subs; ks != NULL; ks = ks->next)
            pending |= !ks->completed && !ks->dead;
        if (!pending || swi_now_ms() >= until) {
            if (pending)
                kw->orphaned = 1;
            break;
        }
        swi_cond_wait_until(&kw->cv, &kw->mu, until);
    }
    if (kw->orphaned) {
        pthread_mutex_unlock(&kw->mu);
        swi_log(&kw->st->log, SW_LOG_ERROR,
                "registry: a watch consumer did not complete; its watch is left allocated");
        kv_watch_orphan(kw);
        return;
    }
    kv_subs_reap(kw);
    pthread_mutex_unlock(&kw->mu);
    pthread_mutex_destroy(&kw->mu);
    pthread_cond_destroy(&kw->cv);
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
