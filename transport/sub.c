/* transport/sub.c -- bounded publishing (sealed when the connection
 * seals) and subscriptions: each message is opened (or refused) before the
 * handler sees it, as an swt_msg view; closing waits for the handler's last
 * return. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "transport/conn_int.h"
#include "transport/envelope.h"

sw_err
swt_publish_plain(sw_conn *c, const char *subj, const char *reply, const void *data, size_t len)
{
    natsStatus s;
    int64_t max = __atomic_load_n(&c->max_payload, __ATOMIC_ACQUIRE);
    if ((max > 0 && len > (size_t)max) || len > (size_t)INT32_MAX)
        return SW_EMSGSIZE;
#ifdef SW_CHAOS
    if ((s = (natsStatus)swt_chaos_fail_publish(c, subj)) != NATS_OK)
        return sw_err_from_nats(s); /* swx_conn_fail_publishes */
#endif
    swt_conn_tap(c, SWT_TAP_PUB_BEGIN, data, len);
    if (reply != NULL)
        s = natsConnection_PublishRequest(c->nc, subj, reply, data, (int)len);
    else
        s = natsConnection_Publish(c->nc, subj, data, (int)len);
    swt_conn_tap(c, SWT_TAP_PUB_END, data, len);
    return sw_err_from_nats(s);
}

sw_err
swt_publish(sw_conn *c, const char *subj, const char *reply, const void *data, size_t len)
{
    uint8_t stackbuf[2048], *buf = stackbuf;
    size_t max = sw_conn_max_payload(c), cap = len + SWT_ENV_OVERHEAD, n = 0;
    sw_err e;
    if (max != 0 && len > max)
        return SW_EMSGSIZE;
    if (c->sealer == NULL)
        return swt_publish_plain(c, subj, reply, data, len);
    if (cap > sizeof(stackbuf) && (buf = malloc(cap)) == NULL)
        return SW_ENOMEM;
    e = swt_env_seal(c->sealer, subj, data, len, buf, cap, &n);
    if (e == SW_OK)
        e = swt_publish_plain(c, subj, reply, buf, n);
    if (buf != stackbuf)
        free(buf);
    return e;
}

#define SWT_DEFER_MSGS 32
#define SWT_DEFER_BYTES (256u * 1024u)
#define SWT_TRIM_MIN_MS 5

/* A subscription. nats.c may run the handler one last time after
 * Unsubscribe returns, on its own thread; its completion callback comes
 * after the handler's last return, so swt_sub_close waits for that before
 * it frees anything (mu/cv below guard `completed`). */
struct swt_sub {
    sw_conn *c;
    uint8_t *pt; /* opened plaintext (the callbacks of one subscription run one at a time) */
    size_t pt_cap;
    natsSubscription *ns;
    swt_msg_fn fn;
    void *arg;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int completed;                 /* nats.c's completion callback ran */
    int free_on_complete;          /* closed from inside its own handler: the completion frees it */
    int in_cb;                     /* the handler runs now, on cb_thread */
    int dead;                      /* swt_subscribe failed after subscribing: handlers do nothing */
    int drain_started;             /* swt_sub_drain_start drained it (its owner's thread only) */
    int unsubscribed;              /* swt_sub_drain_start could not drain: unsubscribed at once */
    int plain;                     /* swt_subscribe_plain: no sealing, no tap */
    struct swt_sub *next;          /* on g_orphans, when dead */
    struct swt_sub *cnext, *cprev; /* on c->subs while open (c->subs_mu) */
    pthread_t cb_thread;
    /* Handled messages not destroyed yet (under mu): nats.c hands every
     * destroyed message to its garbage-collector thread and wakes that
     * thread when it sleeps, so destroying them a batch at a time costs one
     * wake-up per batch instead of one per message. A batch is destroyed
     * when it holds SWT_DEFER_MSGS messages or SWT_DEFER_BYTES, and
     * otherwise by swt_conn_trim once no message came between two of its
     * calls (the owner's timer: a quiet subscription keeps them for two of
     * its ticks). */
    natsMsg *defer[SWT_DEFER_MSGS];
    unsigned ndefer;
    size_t defer_bytes;
    uint64_t nmsg;      /* messages handled */
    uint64_t trim_seen; /* nmsg at the last swt_conn_trim */
};

/* Subscriptions swt_subscribe gave up on (see there): kept, reachable. */
static pthread_mutex_t g_orphans_mu = PTHREAD_MUTEX_INITIALIZER;
static swt_sub *g_orphans;

/* Moves the deferred messages to v (sub->mu held); the caller destroys
 * them with swt_msgs_destroy, after unlocking. Returns how many. */
static unsigned
swt_sub_take_deferred(swt_sub *sub, natsMsg *v[SWT_DEFER_MSGS])
{
    unsigned n = sub->ndefer;
    memcpy(v, sub->defer, n * sizeof(v[0]));
    sub->ndefer = 0;
    sub->defer_bytes = 0;
    return n;
}

static void
swt_msgs_destroy(natsMsg *v[], unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        natsMsg_Destroy(v[i]);
}

static void
swt_sub_destroy_deferred(swt_sub *sub)
{
    natsMsg *v[SWT_DEFER_MSGS];
    unsigned n;
    pthread_mutex_lock(&sub->mu);
    n = swt_sub_take_deferred(sub, v);
    pthread_mutex_unlock(&sub->mu);
    swt_msgs_destroy(v, n);
}

/* Takes sub off its connection's list, if it is on it (a failing
 * swt_subscribe closes one it never linked): swt_conn_trim no longer sees
 * it. */
static void
swt_sub_unlink(swt_sub *sub)
{
    sw_conn *c = sub->c;
    pthread_mutex_lock(&c->subs_mu);
    if (sub->cprev != NULL || c->subs == sub) {
        if (sub->cprev != NULL)
            sub->cprev->cnext = sub->cnext;
        else
            c->subs = sub->cnext;
        if (sub->cnext != NULL)
            sub->cnext->cprev = sub->cprev;
        sub->cnext = sub->cprev = NULL;
    }
    pthread_mutex_unlock(&c->subs_mu);
}

void
swt_conn_trim(sw_conn *c)
{
    int64_t now = swi_now_ms(), last;
    if (c == NULL)
        return;
    /* Several owners (routers, ingresses) may share the connection: a pass
     * at most every SWT_TRIM_MIN_MS, so that 'no message between two
     * passes' still means some milliseconds of silence. */
    last = __atomic_load_n(&c->trim_ms, __ATOMIC_ACQUIRE);
    if (now - last < SWT_TRIM_MIN_MS ||
        !__atomic_compare_exchange_n(&c->trim_ms, &last, now, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&c->subs_mu);
    for (swt_sub *sub = c->subs; sub != NULL; sub = sub->cnext) {
        natsMsg *v[SWT_DEFER_MSGS];
        unsigned n = 0;
        pthread_mutex_lock(&sub->mu);
        if (sub->ndefer > 0 && sub->nmsg == sub->trim_seen)
            n = swt_sub_take_deferred(sub, v);
        sub->trim_seen = sub->nmsg;
        pthread_mutex_unlock(&sub->mu);
        swt_msgs_destroy(v, n);
    }
    pthread_mutex_unlock(&c->subs_mu);
}

static void
swt_sub_free(swt_sub *sub)
{
    swt_sub_destroy_deferred(sub);
    natsSubscription_Destroy(sub->ns);
    pthread_mutex_destroy(&sub->mu);
    pthread_cond_destroy(&sub->cv);
    if (sub->pt != NULL)
        sodium_memzero(sub->pt, sub->pt_cap);
    free(sub->pt);
    free(sub);
}

/* 1 if a "no responders" status may come on subject: a reply subject,
 * where the server answers a request of ours (a stream's response
 * subject, the reply subject of a probe or of a liveness probe, an inbox).
 * A subject that carries requests, controls, workers' probes of a frontend
 * or heartbeat batches is never one: a status there is forged (it cannot be
 * sealed, and anyone may publish an empty message with "Status: 503"). */
static int
swt_no_responders_fit(const char *subject)
{
    switch (swt_subject_kind_of(subject)) {
    case SWT_SUBJ_REQUEST:
    case SWT_SUBJ_CONTROL:
    case SWT_SUBJ_ROUTER:
    case SWT_SUBJ_BEATS:
        return 0;
    default:
        return 1;
    }
}

static void
swt_on_msg(natsConnection *nc, natsSubscription *ns, natsMsg *msg, void *arg)
{
    swt_sub *sub = arg;
    swt_msg m;
    natsMsg *full[SWT_DEFER_MSGS];
    unsigned nfull = 0;
    m.subject = natsMsg_GetSubject(msg);
    m.reply = natsMsg_GetReply(msg);
    m.data = (const uint8_t *)natsMsg_GetData(msg);
    m.len = (size_t)natsMsg_GetDataLength(msg);
    m.no_responders = natsMsg_IsNoResponders(msg) ? 1 : 0;
    m.auth_failed = 0;
    m.unsealed = 0;
    m.impl = msg;
    /* Dead first: an orphan (a subscribe that failed after subscribing)
     * may outlive its connection, whose keys the opening below reads; in_cb
     * from here keeps a close waiting until the callback is done. */
    pthread_mutex_lock(&sub->mu);
    if (sub->dead) {
        pthread_mutex_unlock(&sub->mu);
        natsMsg_Destroy(msg);
        return;
    }
    sub->in_cb = 1;
    sub->cb_thread = pthread_self();
    pthread_mutex_unlock(&sub->mu);
    if (!sub->plain)
        swt_conn_tap(sub->c, SWT_TAP_RX, m.data, m.len); /* (not dead: c is there) */
    if (m.no_responders && !sub->plain) {
        /* Not sealed, by nature: a sealing connection takes it only where
         * the server can send one, and refuses it elsewhere as anything
         * unsealed (no_responders stays set: it is no request, no control
         * and no probe, whatever the handler). */
        if (sub->c->sealer != NULL && !swt_no_responders_fit(m.subject))
            m.auth_failed = 1;
    } else if (!sub->plain) {
        /* Sealed cluster: open before anyone looks; refuse what is not
         * sealed. Unsealed: refuse what is (a sealed peer we cannot read). */
        int sealed = swt_env_is_sealed(m.data, m.len);
        if (sub->c->sealer != NULL && sealed) {
            size_t n = 0;
            if (sub->pt_cap < m.len) {
                uint8_t *np = realloc(sub->pt, m.len);
                if (np != NULL) {
                    sub->pt = np;
                    sub->pt_cap = m.len;
                }
            }
            if (sub->pt_cap >= m.len && swt_env_open(sub->c->sealer, m.subject, m.data, m.len,
                                                     sub->pt, sub->pt_cap, &n) == SW_OK) {
                m.data = sub->pt;
                m.len = n;
            } else {
                m.auth_failed = 1;
            }
        } else if (sub->c->sealer != NULL || sealed) {
            m.auth_failed = 1;
            m.unsealed = !sealed;
        }
    }
    if (m.auth_failed) {
        m.data = NULL;
        m.len = 0;
        swt_conn_count_auth_failure(sub->c);
    }
    sub->fn(&m, sub->arg);
    /* Last: a failing swt_subscribe waits for in_cb to clear before it
     * touches ns and the deferred messages. */
    pthread_mutex_lock(&sub->mu);
    sub->defer[sub->ndefer++] = msg;
    sub->defer_bytes += (size_t)natsMsg_GetDataLength(msg); /* as received (m.len may be 0) */
    sub->nmsg++;
    if (sub->ndefer == SWT_DEFER_MSGS || sub->defer_bytes >= SWT_DEFER_BYTES)
        nfull = swt_sub_take_deferred(sub, full);
    sub->in_cb = 0;
    if (sub->dead)
        pthread_cond_broadcast(&sub->cv);
    pthread_mutex_unlock(&sub->mu);
    swt_msgs_destroy(full, nfull); /* (a message needs nothing of its subscription) */
}

static void
swt_on_complete(void *arg)
{
    swt_sub *sub = arg;
    int free_it;
    swt_sub_destroy_deferred(sub); /* the handler has returned for the last time */
    pthread_mutex_lock(&sub->mu);
    sub->completed = 1;
    free_it = sub->free_on_complete;
    pthread_cond_broadcast(&sub->cv);
    pthread_mutex_unlock(&sub->mu);
    if (free_it)
        swt_sub_free(sub);
}

const char *
swt_msg_header(const swt_msg *m, const char *key)
{
    const char *v = NULL;
    if (m->impl == NULL || natsMsgHeader_Get((natsMsg *)(uintptr_t)m->impl, key, &v) != NATS_OK)
        return NULL;
    return v;
}

static sw_err
swt_subscribe_as(sw_conn *c, swt_sub **out, const char *subj, swt_msg_fn fn, void *arg, int plain)
{
    swt_sub *sub;
    natsStatus s;
    *out = NULL;
    if ((sub = calloc(1, sizeof(*sub))) == NULL)
        return SW_ENOMEM;
    sub->c = c;
    sub->fn = fn;
    sub->arg = arg;
    sub->plain = plain;
    pthread_mutex_init(&sub->mu, NULL);
    swi_cond_init(&sub->cv);
    s = natsConnection_Subscribe(&sub->ns, c->nc, subj, swt_on_msg, sub);
    if (s == NATS_OK) {
#ifdef SW_CHAOS
        if (__atomic_load_n(&c->chaos_no_complete, __ATOMIC_ACQUIRE) > 0 &&
            __atomic_sub_fetch(&c->chaos_no_complete, 1, __ATOMIC_ACQ_REL) >= 0) {
            /* swx_conn_fail_sub_complete: fails as a closed subscription
             * would, once a handler runs (the race it stands for) */
            for (int64_t until = swi_now_ms() + 2000; swi_now_ms() < until;) {
                int busy;
                pthread_mutex_lock(&sub->mu);
                busy = sub->in_cb;
                pthread_mutex_unlock(&sub->mu);
                if (busy)
                    break;
                nats_Sleep(1);
            }
            s = NATS_INVALID_SUBSCRIPTION;
        } else
#endif
            s = natsSubscription_SetOnCompleteCB(sub->ns, swt_on_complete, sub);
        if (s != NATS_OK) {
            /* The subscription closed under us (the connection closed):
             * no completion will come to say when a handler nats.c has
             * already started returns. From now on handlers do nothing;
             * one running now is waited for, so the caller's arg is not
             * used after the error returns. The struct itself is kept
             * for the life of the process, on a list (a few hundred bytes
             * each time this happens): nats.c may still be about to call
             * swt_on_msg with it -- its delivery thread takes a message,
             * unlocks, then calls -- and nothing tells when it no longer
             * can, not even the connection's close. */
            pthread_mutex_lock(&sub->mu);
            sub->dead = 1;
            while (sub->in_cb && !pthread_equal(sub->cb_thread, pthread_self()))
                pthread_cond_wait(&sub->cv, &sub->mu);
            pthread_mutex_unlock(&sub->mu);
            natsSubscription_Unsubscribe(sub->ns);
            natsSubscription_Destroy(sub->ns);
            sub->ns = NULL;
            swt_sub_destroy_deferred(sub);
            pthread_mutex_lock(&g_orphans_mu);
            sub->next = g_orphans;
            g_orphans = sub;
            pthread_mutex_unlock(&g_orphans_mu);
            return sw_err_from_nats(s);
        }
    }
    if (s == NATS_OK)
        s = natsSubscription_SetPendingLimits(sub->ns, -1, -1);
    if (s != NATS_OK) {
        if (sub->ns != NULL) {
            swt_sub_close(c, &sub); /* waits for the completion */
        } else {                    /* never subscribed */
            pthread_mutex_destroy(&sub->mu);
            pthread_cond_destroy(&sub->cv);
            free(sub);
        }
        return sw_err_from_nats(s);
    }
    pthread_mutex_lock(&c->subs_mu);
    sub->cnext = c->subs;
    if (c->subs != NULL)
        c->subs->cprev = sub;
    c->subs = sub;
    pthread_mutex_unlock(&c->subs_mu);
    *out = sub;
    return SW_OK;
}

sw_err
swt_subscribe(sw_conn *c, swt_sub **out, const char *subj, swt_msg_fn fn, void *arg)
{
    return swt_subscribe_as(c, out, subj, fn, arg, 0);
}

sw_err
swt_subscribe_plain(sw_conn *c, swt_sub **out, const char *subj, swt_msg_fn fn, void *arg)
{
    return swt_subscribe_as(c, out, subj, fn, arg, 1);
}

int
swt_sub_pending(swt_sub *s)
{
    int pending = 0;
    if (s == NULL || natsSubscription_GetPending(s->ns, &pending, NULL) != NATS_OK)
        return 0;
    return pending;
}

void
swt_sub_progress(swt_sub *s, uint64_t *done, uint64_t *taken)
{
    uint64_t queued = (uint64_t)swt_sub_pending(s);
    *done = *taken = 0;
    if (s == NULL)
        return;
    pthread_mutex_lock(&s->mu);
    *done = s->nmsg;
    *taken = s->nmsg + (s->in_cb ? 1 : 0) + queued;
    pthread_mutex_unlock(&s->mu);
}

unsigned
swt_conn_kept(sw_conn *c)
{
    unsigned n = 0;
    pthread_mutex_lock(&c->subs_mu);
    for (swt_sub *sub = c->subs; sub != NULL; sub = sub->cnext)
        n += swt_sub_kept(sub);
    pthread_mutex_unlock(&c->subs_mu);
    return n;
}

unsigned
swt_sub_kept(swt_sub *s)
{
    unsigned n;
    pthread_mutex_lock(&s->mu);
    n = s->ndefer;
    pthread_mutex_unlock(&s->mu);
    return n;
}

uint64_t
swt_sub_dropped(swt_sub *s)
{
    int64_t dropped = 0;
    if (s == NULL || natsSubscription_GetDropped(s->ns, &dropped) != NATS_OK || dropped < 0)
        return 0;
    return (uint64_t)dropped;
}

int
swt_connected(sw_conn *c)
{
    return c != NULL && c->nc != NULL && natsConnection_Status(c->nc) == NATS_CONN_STATUS_CONNECTED;
}

sw_err
swt_flush(sw_conn *c, int64_t timeout_ms)
{
    if (!swt_connected(c))
        return SW_ECONNECT;
    return sw_err_from_nats(natsConnection_FlushTimeout(c->nc, timeout_ms));
}

int
swt_denied(sw_conn *c, const char *subj)
{
    const char *txt = NULL;
    /* The server answers a refused SUB with -ERR 'Permissions Violation for
     * Subscription to "<subj>"' before the PONG of a later flush, and nats.c
     * keeps it as the connection's last error. */
    if (natsConnection_GetLastError(c->nc, &txt) != NATS_NOT_PERMITTED || txt == NULL)
        return 0;
    return strstr(txt, "Subscription") != NULL && strstr(txt, subj) != NULL;
}

void
swt_sub_drain_start(sw_conn *c, swt_sub *sub)
{
    if (sub == NULL || sub->drain_started || sub->unsubscribed)
        return;
    if (swt_connected(c) && natsSubscription_Drain(sub->ns) == NATS_OK) {
        sub->drain_started = 1;
    } else {
        /* Down (or the drain refused): unsubscribe now, or nats.c would
         * subscribe it again when the connection comes back. */
        (void)natsSubscription_Unsubscribe(sub->ns);
        sub->unsubscribed = 1;
    }
}

/* Keeps ns until c is destroyed (c->graves); destroys it now if there is
 * no memory to keep it. */
static void
swt_conn_grave(sw_conn *c, natsSubscription *ns)
{
    pthread_mutex_lock(&c->subs_mu);
    if (c->ngraves == c->capgraves) {
        size_t nc = c->capgraves ? 2 * c->capgraves : 4;
        natsSubscription **ng = realloc(c->graves, nc * sizeof(*ng));
        if (ng != NULL) {
            c->graves = ng;
            c->capgraves = nc;
        }
    }
    if (c->ngraves < c->capgraves) {
        c->graves[c->ngraves++] = ns;
        ns = NULL;
    }
    pthread_mutex_unlock(&c->subs_mu);
    natsSubscription_Destroy(ns); /* (NULL: kept) */
}

int
swt_sub_close(sw_conn *c, swt_sub **subp)
{
    swt_sub *sub = *subp;
    int self, drained = 0;
    int64_t until;
    if (sub == NULL)
        return 1;
    *subp = NULL;
    swt_sub_unlink(sub);
    swt_sub_drain_start(c, sub); /* (a no-op if the owner started it) */
    if (sub->drain_started)
        drained = natsSubscription_WaitForDrainCompletion(sub->ns, 2000) == NATS_OK;
    /* Unsubscribe in any case: a drain that timed out leaves it open. */
    natsSubscription_Unsubscribe(sub->ns);
    pthread_mutex_lock(&sub->mu);
    self = sub->in_cb && pthread_equal(sub->cb_thread, pthread_self());
    if (self && !sub->completed) {
        /* Closed from its own handler: the completion comes after we
         * return, and frees it then. */
        sub->free_on_complete = 1;
        pthread_mutex_unlock(&sub->mu);
        return 0;
    }
    /* The completion comes after the handler's last return: however long a
     * user callback takes, it has returned when this does. The bound only
     * guards against a completion that never comes (then the object is
     * left allocated rather than freed under a running handler). */
    until = swi_now_ms() + 60000;
    while (!sub->completed && swi_now_ms() < until)
        swi_cond_wait_until(&sub->cv, &sub->mu, until);
    if (!sub->completed) {
        sub->free_on_complete = 1;
        pthread_mutex_unlock(&sub->mu);
        swi_log(&c->log, SW_LOG_ERROR, "nats: a subscription did not complete in 60 s; left open");
        return 0;
    }
    pthread_mutex_unlock(&sub->mu);
    if (!drained) { /* unsubscribed while down, or a drain that timed out */
        swt_conn_grave(c, sub->ns);
        sub->ns = NULL;
    }
    swt_sub_free(sub);
    return 1;
}
