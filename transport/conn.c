/* transport/conn.c -- sw_conn: one NATS connection and bounded publishing. */
#include <stdlib.h>
#include <string.h>

#include <nats/nats.h>

#include "transport/sw_transport.h"

struct sw_conn {
    natsConnection *nc;
    natsOptions *opts;
    swi_logger log;
    int closing; /* sw_conn_close started: the disconnect is expected */
    int64_t max_payload; /* cached; refreshed on (re)connect (atomic access) */
    /* nats.c calls the connection callbacks on its own thread, possibly after
     * natsConnection_Close returned; the closed callback is the last one, so
     * sw_conn_close waits for it before freeing. */
    pthread_mutex_t cb_mu;
    pthread_cond_t cb_cv;
    int cb_closed;
};

sw_err
sw_err_from_nats(int nats_status)
{
    if (nats_status == NATS_OK)
        return SW_OK;
    if (nats_status == NATS_NO_MEMORY)
        return SW_ENOMEM;
    if (nats_status == NATS_TIMEOUT)
        return SW_ETIMEDOUT;
    if (nats_status == NATS_MAX_PAYLOAD)
        return SW_EMSGSIZE;
    if (nats_status == NATS_NO_RESPONDERS)
        return SW_NO_RESPONDERS;
    if (nats_status < 0 || nats_status >= SWI_NATS_STATUS_MAX)
        return SW_ENATS;
    return (sw_err)(SW_ENATS_BASE + nats_status);
}

/* nats.c's text for a status (used by sw_strerror); NULL if out of range
 * (natsStatus_GetText does not bound its table index). */
const char *swt_nats_status_text(int status);
const char *
swt_nats_status_text(int status)
{
    return status >= 0 && status <= NATS_MISSED_HEARTBEAT ? natsStatus_GetText((natsStatus)status)
                                                          : NULL;
}

void
sw_conn_opts_init(sw_conn_opts *o)
{
    if (o == NULL)
        return;
    memset(o, 0, sizeof(*o));
    o->url = "nats://127.0.0.1:4222";
    o->name = "streamwire";
    o->connect_timeout_ms = 2000;
    o->max_reconnect = 60;
    o->reconnect_wait_ms = 250;
}

static void
swt_on_disconnect(natsConnection *nc, void *arg)
{
    sw_conn *c = arg;
    if (!__atomic_load_n(&c->closing, __ATOMIC_ACQUIRE))
        swi_log(&c->log, SW_LOG_WARN, "nats: disconnected");
}

static void
swt_on_reconnect(natsConnection *nc, void *arg)
{
    sw_conn *c = arg;
    /* The new server may have another max payload. */
    __atomic_store_n(&c->max_payload, natsConnection_GetMaxPayload(nc), __ATOMIC_RELEASE);
    swi_log(&c->log, SW_LOG_INFO, "nats: reconnected");
}

static void
swt_on_closed(natsConnection *nc, void *arg)
{
    sw_conn *c = arg;
    pthread_mutex_lock(&c->cb_mu);
    c->cb_closed = 1;
    pthread_cond_broadcast(&c->cb_cv);
    pthread_mutex_unlock(&c->cb_mu);
}

static void
swt_on_error(natsConnection *nc, natsSubscription *sub, natsStatus err, void *arg)
{
    sw_conn *c = arg;
    swi_log(&c->log, SW_LOG_ERROR, "nats: async error: %s", natsStatus_GetText(err));
}

sw_err
sw_conn_open(sw_conn **out, const sw_conn_opts *o)
{
    sw_conn *c;
    natsStatus s;
    sw_err rv;

    if (out == NULL || o == NULL)
        return SW_EINVAL;
    *out = NULL;
    if ((rv = swi_init()) != SW_OK)
        return rv;
    if ((c = calloc(1, sizeof(*c))) == NULL)
        return SW_ENOMEM;
    c->log.fn = o->log;
    c->log.arg = o->log_arg;
    pthread_mutex_init(&c->cb_mu, NULL);
    swi_cond_init(&c->cb_cv);

    s = natsOptions_Create(&c->opts);
    if (s == NATS_OK)
        s = natsOptions_SetServers(c->opts, NULL, 0);
    if (s == NATS_OK)
        s = natsOptions_SetURL(c->opts, o->url ? o->url : "nats://127.0.0.1:4222");
    if (s == NATS_OK)
        s = natsOptions_SetName(c->opts, o->name ? o->name : "streamwire");
    if (s == NATS_OK)
        s = natsOptions_SetTimeout(c->opts, o->connect_timeout_ms > 0 ? o->connect_timeout_ms : 2000);
    if (s == NATS_OK)
        s = natsOptions_SetMaxReconnect(c->opts, o->max_reconnect != 0 ? o->max_reconnect : 60);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectWait(c->opts,
                                         o->reconnect_wait_ms > 0 ? o->reconnect_wait_ms : 250);
    if (s == NATS_OK)
        s = natsOptions_SetSendAsap(c->opts, o->no_send_asap ? false : true);
    if (s == NATS_OK && o->user != NULL)
        s = natsOptions_SetUserInfo(c->opts, o->user, o->password ? o->password : "");
    if (s == NATS_OK && o->token != NULL)
        s = natsOptions_SetToken(c->opts, o->token);
    if (s == NATS_OK)
        s = natsOptions_SetDisconnectedCB(c->opts, swt_on_disconnect, c);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectedCB(c->opts, swt_on_reconnect, c);
    if (s == NATS_OK)
        s = natsOptions_SetErrorHandler(c->opts, swt_on_error, c);
    if (s == NATS_OK)
        s = natsOptions_SetClosedCB(c->opts, swt_on_closed, c);
    /* Big pending buffers during reconnect would hide a dead server. */
    if (s == NATS_OK)
        s = natsOptions_SetReconnectBufSize(c->opts, 8 * 1024 * 1024);
    if (s != NATS_OK) {
        rv = sw_err_from_nats(s);
        goto fail;
    }
    s = natsConnection_Connect(&c->nc, c->opts);
    if (s != NATS_OK) {
        rv = (s == NATS_NO_SERVER) ? SW_ECONNECT : sw_err_from_nats(s);
        goto fail;
    }
    __atomic_store_n(&c->max_payload, natsConnection_GetMaxPayload(c->nc), __ATOMIC_RELEASE);
    *out = c;
    return SW_OK;
fail:
    natsOptions_Destroy(c->opts);
    pthread_mutex_destroy(&c->cb_mu);
    pthread_cond_destroy(&c->cb_cv);
    free(c);
    return rv;
}

void
sw_conn_close(sw_conn *c)
{
    if (c == NULL)
        return;
    __atomic_store_n(&c->closing, 1, __ATOMIC_RELEASE);
    if (c->nc != NULL) {
        if (natsConnection_Status(c->nc) == NATS_CONN_STATUS_CONNECTED)
            natsConnection_FlushTimeout(c->nc, 1000);
        natsConnection_Close(c->nc);
        /* Wait for the last callback (bounded: a lost callback must not
         * hang the caller forever). */
        pthread_mutex_lock(&c->cb_mu);
        {
            int64_t until = swi_now_ms() + 5000;
            while (!c->cb_closed && swi_now_ms() < until)
                swi_cond_wait_until(&c->cb_cv, &c->cb_mu, until);
        }
        pthread_mutex_unlock(&c->cb_mu);
        natsConnection_Destroy(c->nc);
    }
    natsOptions_Destroy(c->opts);
    pthread_mutex_destroy(&c->cb_mu);
    pthread_cond_destroy(&c->cb_cv);
    free(c);
}

size_t
sw_conn_max_payload(sw_conn *c)
{
    int64_t m;
    if (c == NULL || c->nc == NULL)
        return 0;
    m = __atomic_load_n(&c->max_payload, __ATOMIC_ACQUIRE);
    return m > 0 ? (size_t)m : 0;
}

void *
sw_conn_nats(sw_conn *c)
{
    return c ? c->nc : NULL;
}

sw_err
swt_publish(sw_conn *c, const char *subj, const char *reply, const void *data, size_t len)
{
    natsStatus s;
    size_t max = sw_conn_max_payload(c);
    if (max != 0 && len > max)
        return SW_EMSGSIZE;
    if (len > (size_t)INT32_MAX)
        return SW_EMSGSIZE;
    if (reply != NULL)
        s = natsConnection_PublishRequest(c->nc, subj, reply, data, (int)len);
    else
        s = natsConnection_Publish(c->nc, subj, data, (int)len);
    return sw_err_from_nats(s);
}

struct swt_sub {
    natsSubscription *ns;
    swt_msg_fn fn;
    void *arg;
};

static void
swt_on_msg(natsConnection *nc, natsSubscription *ns, natsMsg *msg, void *arg)
{
    swt_sub *sub = arg;
    swt_msg m;
    m.subject = natsMsg_GetSubject(msg);
    m.reply = natsMsg_GetReply(msg);
    m.data = (const uint8_t *)natsMsg_GetData(msg);
    m.len = (size_t)natsMsg_GetDataLength(msg);
    m.no_responders = natsMsg_IsNoResponders(msg) ? 1 : 0;
    sub->fn(&m, sub->arg);
    natsMsg_Destroy(msg);
}

sw_err
swt_subscribe(sw_conn *c, swt_sub **out, const char *subj, swt_msg_fn fn, void *arg)
{
    swt_sub *sub;
    natsStatus s;
    *out = NULL;
    if ((sub = calloc(1, sizeof(*sub))) == NULL)
        return SW_ENOMEM;
    sub->fn = fn;
    sub->arg = arg;
    s = natsConnection_Subscribe(&sub->ns, c->nc, subj, swt_on_msg, sub);
    if (s == NATS_OK)
        s = natsSubscription_SetPendingLimits(sub->ns, -1, -1);
    if (s != NATS_OK) {
        if (sub->ns != NULL) {
            natsSubscription_Unsubscribe(sub->ns);
            natsSubscription_Destroy(sub->ns);
        }
        free(sub);
        return sw_err_from_nats(s);
    }
    *out = sub;
    return SW_OK;
}

int
swt_sub_pending(swt_sub *s)
{
    int pending = 0;
    if (s == NULL || natsSubscription_GetPending(s->ns, &pending, NULL) != NATS_OK)
        return 0;
    return pending;
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

void
swt_sub_close(sw_conn *c, swt_sub **subp)
{
    swt_sub *sub = *subp;
    if (sub == NULL)
        return;
    if (swt_connected(c) && natsSubscription_Drain(sub->ns) == NATS_OK)
        natsSubscription_WaitForDrainCompletion(sub->ns, 2000);
    else
        natsSubscription_Unsubscribe(sub->ns);
    natsSubscription_Destroy(sub->ns);
    free(sub);
    *subp = NULL;
}
