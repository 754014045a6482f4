/* transport/conn.c -- sw_conn: one NATS connection, its options (URLs,
 * credentials, TLS, the sealing key), its state and reconnects. Publishing
 * and subscriptions are in sub.c. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nats/nats.h>

#include "transport/conn_int.h"
#include "transport/envelope.h"

const char *
swt_conn_name(const sw_conn *c)
{
    return c->name;
}

int
swt_conn_send_asap(const sw_conn *c)
{
    return c->send_asap;
}

void
swt_conn_set_tap(sw_conn *c, swt_tap_fn fn, void *arg)
{
    if (fn != NULL)
        c->tap_arg = arg;
    __atomic_store_n(&c->tap, fn, __ATOMIC_RELEASE);
}

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
    if (nats_status == NATS_CONNECTION_AUTH_FAILED)
        return SW_EAUTH;
    if (nats_status == NATS_NOT_PERMITTED)
        return SW_EPERM;
    if (nats_status == NATS_SECURE_CONNECTION_REQUIRED ||
        nats_status == NATS_SECURE_CONNECTION_WANTED || nats_status == NATS_SSL_ERROR)
        return SW_ETLS;
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

const char *
sw_conn_state_name(int state)
{
    switch (state) {
    case SW_CONN_CONNECTED:
        return "connected";
    case SW_CONN_RECONNECTING:
        return "reconnecting";
    case SW_CONN_CLOSED:
        return "closed";
    default:
        return "unknown";
    }
}

/* Records a new state and tells the application (nats.c thread, no lock). */
static void
swt_set_state(sw_conn *c, sw_conn_state st)
{
    int old = __atomic_exchange_n(&c->state, (int)st, __ATOMIC_ACQ_REL);
    __atomic_store_n(&c->up_since_ms, st == SW_CONN_CONNECTED ? swi_now_ms() : -1,
                     __ATOMIC_RELEASE);
    if (old != (int)st && c->on_state != NULL)
        c->on_state(c, st, c->on_state_arg);
    if (old != (int)st) {
        pthread_mutex_lock(&c->lis_mu);
        for (swt_listener *l = c->lis; l != NULL; l = l->next)
            l->fn(l->arg, st);
        pthread_mutex_unlock(&c->lis_mu);
    }
}

void
swt_conn_listen(sw_conn *c, swt_listener *l)
{
    pthread_mutex_lock(&c->lis_mu);
    l->next = c->lis;
    c->lis = l;
    pthread_mutex_unlock(&c->lis_mu);
}

void
swt_conn_unlisten(sw_conn *c, swt_listener *l)
{
    pthread_mutex_lock(&c->lis_mu);
    for (swt_listener **p = &c->lis; *p != NULL; p = &(*p)->next)
        if (*p == l) {
            *p = l->next;
            break;
        }
    pthread_mutex_unlock(&c->lis_mu);
}

static void
swt_on_disconnect(natsConnection *nc, void *arg)
{
    sw_conn *c = arg;
    /* A close's own disconnect (nats.c reports one when the socket was up)
     * is no lost server: not RECONNECTING (streamwire.h), closed comes
     * next. */
    if (__atomic_load_n(&c->closing, __ATOMIC_ACQUIRE))
        return;
    swi_log(&c->log, SW_LOG_WARN, "nats: disconnected");
    if (__atomic_load_n(&c->state, __ATOMIC_ACQUIRE) != SW_CONN_CLOSED && !c->no_reconnect)
        swt_set_state(c, SW_CONN_RECONNECTING); /* (without reconnects: closed comes next) */
}

static void
swt_on_reconnect(natsConnection *nc, void *arg)
{
    sw_conn *c = arg;
    if (__atomic_load_n(&c->closing, __ATOMIC_ACQUIRE))
        return;
    /* The new server may have another max payload. */
    __atomic_store_n(&c->max_payload, natsConnection_GetMaxPayload(nc), __ATOMIC_RELEASE);
    __atomic_fetch_add(&c->reconnects, 1, __ATOMIC_RELAXED);
    swi_log(&c->log, SW_LOG_INFO, "nats: reconnected");
    swt_set_state(c, SW_CONN_CONNECTED);
}

static void
swt_on_closed(natsConnection *nc, void *arg)
{
    sw_conn *c = arg;
    int abandoned;
    pthread_mutex_lock(&c->cb_mu);
    abandoned = c->abandoned;
    pthread_mutex_unlock(&c->cb_mu);
    if (abandoned) {
        /* sw_conn_close returned long ago, keeping its reference for this
         * last callback: nothing to tell, the reference goes now. */
        swt_conn_release(c);
        return;
    }
    if (!__atomic_load_n(&c->closing, __ATOMIC_ACQUIRE))
        swi_log(&c->log, SW_LOG_ERROR, "nats: connection closed for good (%s)",
                c->no_reconnect ? "the server is lost and reconnects are off"
                                : "reconnects ran out");
    swt_set_state(c, SW_CONN_CLOSED);
    pthread_mutex_lock(&c->cb_mu);
    c->cb_closed = 1;
    abandoned = c->abandoned; /* the close gave up while this ran */
    pthread_cond_broadcast(&c->cb_cv);
    pthread_mutex_unlock(&c->cb_mu);
    if (abandoned)
        swt_conn_release(c);
}

static void
swt_on_error(natsConnection *nc, natsSubscription *sub, natsStatus err, void *arg)
{
    sw_conn *c = arg;
    if (__atomic_load_n(&c->abandoned, __ATOMIC_ACQUIRE))
        return;
    swi_log(&c->log, SW_LOG_ERROR, "nats: async error: %s", natsStatus_GetText(err));
}

/* One URL, or a comma-separated list of servers of one cluster (nats.c
 * 3.4's SetURL takes one; SetServers takes the list), each trimmed of
 * blanks. None that is not blank is NATS_INVALID_ARG (SW_EINVAL): nats.c
 * 3.4.1 took "" and failed the connect with a status of its own, and took
 * " " and then freed a pointer it had not allocated when the options were
 * destroyed (the process aborted). */
static natsStatus
swt_set_urls(natsOptions *no, const char *url)
{
    const char *list[16];
    char buf[2048], *save = NULL, *tok;
    int n = 0;
    natsStatus s;
    if (strlen(url) >= sizeof(buf))
        return NATS_INVALID_ARG;
    strcpy(buf, url);
    for (tok = strtok_r(buf, ",", &save); tok != NULL && n < 16; tok = strtok_r(NULL, ",", &save)) {
        char *end;
        while (isspace((unsigned char)*tok))
            tok++;
        end = tok + strlen(tok);
        while (end > tok && isspace((unsigned char)end[-1]))
            *--end = '\0';
        if (*tok != '\0')
            list[n++] = tok;
    }
    if (n == 0)
        return NATS_INVALID_ARG;
    if (n == 1) {
        s = natsOptions_SetServers(no, NULL, 0);
        return s == NATS_OK ? natsOptions_SetURL(no, list[0]) : s;
    }
    (void)natsOptions_SetURL(no, NULL);
    return natsOptions_SetServers(no, list, n);
}

/* Credentials files, the inbox prefix and TLS (sw_conn_opts). A file that
 * does not load is the error of its kind (SW_EAUTH, SW_ETLS), not a generic
 * NATS status, so the CLI can say which flag is wrong. */
static sw_err
swt_conn_security(natsOptions *no, const sw_conn_opts *o)
{
    natsStatus s = NATS_OK;
    if (o->creds_file != NULL && o->nkey_seed_file != NULL)
        return SW_EINVAL;
    if ((o->tls_cert_file == NULL) != (o->tls_key_file == NULL))
        return SW_EINVAL;
    if (o->creds_file != NULL) {
        FILE *f = fopen(o->creds_file, "r");
        if (f == NULL)
            return SW_EAUTH;
        fclose(f);
        if (natsOptions_SetUserCredentialsFromFiles(no, o->creds_file, NULL) != NATS_OK)
            return SW_EAUTH;
    }
    if (o->nkey_seed_file != NULL) {
        char pub[SWT_NKEY_PUBLIC_LEN + 1];
        sw_err rv = swt_nkey_public_from_file(o->nkey_seed_file, pub);
        if (rv != SW_OK)
            return rv;
        if (natsOptions_SetNKeyFromSeed(no, pub, o->nkey_seed_file) != NATS_OK)
            return SW_EAUTH;
    }
    if (o->inbox_prefix != NULL &&
        (s = natsOptions_SetCustomInboxPrefix(no, o->inbox_prefix)) != NATS_OK)
        return s == NATS_INVALID_ARG ? SW_EINVAL : sw_err_from_nats(s);
    if (o->tls || o->tls_ca_file != NULL || o->tls_cert_file != NULL || o->tls_skip_verify) {
        if (natsOptions_SetSecure(no, true) != NATS_OK)
            return SW_ETLS;
        if (o->tls_ca_file != NULL &&
            natsOptions_LoadCATrustedCertificates(no, o->tls_ca_file) != NATS_OK)
            return SW_ETLS;
        if (o->tls_cert_file != NULL &&
            natsOptions_LoadCertificatesChain(no, o->tls_cert_file, o->tls_key_file) != NATS_OK)
            return SW_ETLS;
        if (o->tls_skip_verify && natsOptions_SkipServerVerification(no, true) != NATS_OK)
            return SW_ETLS;
    }
    return SW_OK;
}

/* nc is NULL when the connect failed (natsConnection_Destroy: a no-op). */
static void
conn_free(sw_conn *c)
{
    natsConnection_Destroy(c->nc); /* (closed: its read loop has ended) */
    for (size_t i = 0; i < c->ngraves; i++)
        natsSubscription_Destroy(c->graves[i]);
    free(c->graves);
    natsOptions_Destroy(c->opts);
    swt_sealer_free(c->sealer);
    pthread_mutex_destroy(&c->cb_mu);
    pthread_cond_destroy(&c->cb_cv);
    pthread_mutex_destroy(&c->subs_mu);
    pthread_mutex_destroy(&c->lis_mu);
    free(c);
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
    if (o->connect_timeout_ms < 0 || o->connect_timeout_ms > INT32_MAX ||
        o->reconnect_wait_ms < 0 || o->reconnect_wait_ms > INT32_MAX ||
        o->max_reconnect < SW_RECONNECT_NONE)
        return SW_EINVAL;
    if ((rv = swi_init()) != SW_OK)
        return rv;
    if ((c = calloc(1, sizeof(*c))) == NULL)
        return SW_ENOMEM;
    c->log.fn = o->log;
    c->log.arg = o->log_arg;
    c->on_state = o->on_state;
    c->on_state_arg = o->on_state_arg;
    c->up_since_ms = -1;
    c->refs = 1;
    snprintf(c->name, sizeof(c->name), "%s", o->name ? o->name : "streamwire");
    if (o->inbox_prefix != NULL && strlen(o->inbox_prefix) + 24 >= sizeof(c->inbox_prefix)) {
        free(c); /* (nothing else made yet) */
        return SW_EINVAL;
    }
    snprintf(c->inbox_prefix, sizeof(c->inbox_prefix), "%s",
             o->inbox_prefix ? o->inbox_prefix : "_INBOX");
    pthread_mutex_init(&c->cb_mu, NULL);
    swi_cond_init(&c->cb_cv);
    pthread_mutex_init(&c->subs_mu, NULL);
    pthread_mutex_init(&c->lis_mu, NULL);

    s = natsOptions_Create(&c->opts);
    if (s == NATS_OK)
        s = swt_set_urls(c->opts, o->url ? o->url : "nats://127.0.0.1:4222");
    if (s == NATS_OK)
        s = natsOptions_SetName(c->opts, o->name ? o->name : "streamwire");
    if (s == NATS_OK)
        s = natsOptions_SetTimeout(c->opts,
                                   o->connect_timeout_ms > 0 ? o->connect_timeout_ms : 2000);
    c->no_reconnect = o->max_reconnect == SW_RECONNECT_NONE;
    if (s == NATS_OK && c->no_reconnect)
        s = natsOptions_SetAllowReconnect(c->opts, false);
    else if (s == NATS_OK)
        s = natsOptions_SetMaxReconnect(c->opts, o->max_reconnect != 0 ? o->max_reconnect : 60);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectWait(c->opts,
                                         o->reconnect_wait_ms > 0 ? o->reconnect_wait_ms : 250);
    if (s == NATS_OK)
        s = natsOptions_SetSendAsap(c->opts, o->no_send_asap ? false : true);
    c->send_asap = !o->no_send_asap;
    if (s == NATS_OK && o->user != NULL)
        s = natsOptions_SetUserInfo(c->opts, o->user, o->password ? o->password : "");
    if (s == NATS_OK && o->token != NULL)
        s = natsOptions_SetToken(c->opts, o->token);
    if (s != NATS_OK) {
        rv = s == NATS_INVALID_ARG ? SW_EINVAL : sw_err_from_nats(s); /* e.g. a bad URL list */
        goto fail;
    }
    if ((rv = swt_conn_security(c->opts, o)) != SW_OK)
        goto fail;
    if (o->seal_open_key_file != NULL && o->seal_key_file == NULL) {
        rv = SW_EINVAL; /* a key that only opens, and none that seals */
        goto fail;
    }
    if (o->seal_key_file != NULL) {
        char why[SWT_SEAL_WHY_MAX] = "";
        if ((rv = swt_sealer_load(&c->sealer, o->seal_key_file, o->seal_open_key_file, why,
                                  sizeof(why))) != SW_OK) {
            swi_log(&c->log, SW_LOG_ERROR, "cannot use the cluster key: %s", why);
            goto fail;
        }
    }
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
    /* A path cut without a reset (a partition, a container taken off its
     * network) leaves TCP "up": with nats.c's default two-minute ping it
     * took minutes to notice and reconnect (a worker could not register
     * again meanwhile). A ping every SWT_PING_MS, stale after
     * SWT_PINGS_OUT unanswered: noticed within about 6 s. */
    if (s == NATS_OK)
        s = natsOptions_SetPingInterval(c->opts, SWT_PING_MS);
    if (s == NATS_OK)
        s = natsOptions_SetMaxPingsOut(c->opts, SWT_PINGS_OUT);
    if (s != NATS_OK) {
        rv = sw_err_from_nats(s);
        goto fail;
    }
    /* nats.c 3.4.1 leaves the nonce's signature (an nkey's or a creds
     * file's) out of CONNECT when its first byte is 0 (its base64 encoder
     * takes the raw bytes for a C string), and the server refuses that
     * connect ("Signature missing"): 1 in 256, whatever the key (fixed
     * upstream in nats.c 3.8, #705). Each attempt signs a fresh nonce, so a
     * refused signed connect is made again, up to SWT_NKEY_CONNECT_TRIES
     * times: a correct key is then refused once in 256^4 opens; a wrong
     * one at every try. */
    for (int t = 1;; t++) {
        s = natsConnection_Connect(&c->nc, c->opts);
        if (s != NATS_CONNECTION_AUTH_FAILED ||
            (o->nkey_seed_file == NULL && o->creds_file == NULL) || t >= SWT_NKEY_CONNECT_TRIES)
            break;
    }
    if (s != NATS_OK) {
        rv = (s == NATS_NO_SERVER) ? SW_ECONNECT : sw_err_from_nats(s);
        goto fail;
    }
    __atomic_store_n(&c->max_payload, natsConnection_GetMaxPayload(c->nc), __ATOMIC_RELEASE);
    /* Up "since the beginning": only a reconnect starts a settle time. */
    __atomic_store_n(&c->up_since_ms, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&c->state, SW_CONN_CONNECTED, __ATOMIC_RELEASE);
    *out = c;
    return SW_OK;
fail:
    conn_free(c);
    return rv;
}

void
swt_conn_hold(sw_conn *c)
{
    __atomic_add_fetch(&c->refs, 1, __ATOMIC_RELAXED);
}

void
swt_conn_release(sw_conn *c)
{
    if (c != NULL && __atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) == 0)
        conn_free(c);
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
        if (!c->cb_closed) {
            /* nats.c runs every connection's callbacks on one thread, and
             * one of them (ours or another connection's) is slow: ours are
             * still queued behind it. They would run on freed memory, and
             * tell the application after this call returned: they do
             * nothing, and this call's reference goes with the last of
             * them (the closed callback) instead of now. */
            swt_conn_hold(c); /* for the lines below: the callback may come now */
            __atomic_store_n(&c->abandoned, 1, __ATOMIC_RELEASE);
            pthread_mutex_unlock(&c->cb_mu);
            swi_log(&c->log, SW_LOG_WARN,
                    "nats: the connection's closed callback did not come within 5 s (a slow "
                    "callback ahead of it): its memory is kept until it comes");
            swt_set_state(c, SW_CONN_CLOSED); /* (what that callback would have said) */
            swt_conn_release(c);
            return;
        }
        pthread_mutex_unlock(&c->cb_mu);
    }
    /* Freed now, or by the last router, ingress or registry still open on
     * it (swt_conn_hold). */
    swt_conn_release(c);
}

sw_conn_state
sw_conn_status(sw_conn *c)
{
    if (c == NULL)
        return SW_CONN_CLOSED;
    return (sw_conn_state)__atomic_load_n(&c->state, __ATOMIC_ACQUIRE);
}

uint64_t
sw_conn_reconnects(sw_conn *c)
{
    return c ? __atomic_load_n(&c->reconnects, __ATOMIC_RELAXED) : 0;
}

const swi_logger *
swt_conn_log(sw_conn *c)
{
    return &c->log;
}

int64_t
swt_conn_up_since_ms(sw_conn *c)
{
    return c ? __atomic_load_n(&c->up_since_ms, __ATOMIC_ACQUIRE) : -1;
}

size_t
sw_conn_max_payload(sw_conn *c)
{
    int64_t m;
    if (c == NULL || c->nc == NULL)
        return 0;
    m = __atomic_load_n(&c->max_payload, __ATOMIC_ACQUIRE);
    if (c->sealer != NULL) /* what a message may hold before its envelope */
        m = m > SWT_ENV_OVERHEAD ? m - SWT_ENV_OVERHEAD : 0;
    return m > 0 ? (size_t)m : 0;
}

int
sw_conn_sealed(const sw_conn *c)
{
    return c != NULL && c->sealer != NULL;
}

const swt_sealer *
swt_conn_sealer(sw_conn *c)
{
    return c ? c->sealer : NULL;
}

uint64_t
swt_conn_auth_failures(sw_conn *c)
{
    return c ? __atomic_load_n(&c->auth_failures, __ATOMIC_RELAXED) : 0;
}

void
swt_conn_count_auth_failure(sw_conn *c)
{
    if (c != NULL)
        __atomic_fetch_add(&c->auth_failures, 1, __ATOMIC_RELAXED);
}

void *
sw_conn_nats(sw_conn *c)
{
    return c ? c->nc : NULL;
}

sw_err
swt_conn_new_inbox(sw_conn *c, char *out, size_t cap)
{
    natsInbox *ib = NULL;
    const char *tok;
    int n;
    if (natsInbox_Create(&ib) != NATS_OK)
        return SW_ENOMEM;
    tok = strchr(ib, '.'); /* "_INBOX.<unique>": the unique part */
    n = snprintf(out, cap, "%s.%s", c->inbox_prefix, tok != NULL ? tok + 1 : ib);
    natsInbox_Destroy(ib);
    return n > 0 && (size_t)n < cap ? SW_OK : SW_EINVAL;
}
