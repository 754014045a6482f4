/* transport/conn_int.h -- the connection's fields, shared by conn.c (the
 * connection) and sub.c (publish and subscriptions). Internal to
 * transport/. */
#ifndef SW_TRANSPORT_CONN_INT_H
#define SW_TRANSPORT_CONN_INT_H

#include <nats/nats.h>

#include "transport/envelope.h"
#include "transport/sw_transport.h"

struct sw_conn {
    natsConnection *nc;
    natsOptions *opts;
    swi_logger log;
    int closing;         /* sw_conn_close started: the disconnect is expected */
    int abandoned;       /* sw_conn_close gave up waiting for nats.c's closed callback (cb_mu):
                            late callbacks do nothing, and the closed one drops the close's
                            reference */
    int64_t max_payload; /* cached; refreshed on (re)connect (atomic access) */
    /* nats.c calls the connection callbacks on its own thread, possibly after
     * natsConnection_Close returned; the closed callback is the last one, so
     * sw_conn_close waits for it before freeing. */
    pthread_mutex_t cb_mu;
    pthread_cond_t cb_cv;
    int cb_closed;
    sw_conn_state_fn on_state;
    void *on_state_arg;
    int state;           /* sw_conn_state (atomic access) */
    int64_t up_since_ms; /* monotonic time of the last (re)connect; -1 while down (atomic) */
    uint64_t reconnects; /* (atomic) */
    char name[64];       /* the connection name (metrics label) */
    char inbox_prefix[SWT_SUBJECT_MAX]; /* sw_conn_opts.inbox_prefix, or "_INBOX" */
    int send_asap;                      /* !sw_conn_opts.no_send_asap */
    int no_reconnect;                   /* max_reconnect SW_RECONNECT_NONE */
    swt_sealer *sealer;     /* sw_conn_opts.seal_key_file: seals and opens every message */
    uint64_t auth_failures; /* messages refused: did not open, or unsealed (atomic) */
    int chaos_no_complete;  /* swx_conn_fail_sub_complete (chaos build; atomic) */
#ifdef SW_CHAOS
    /* swx_conn_fail_publishes: publishes still to fail (atomic), on
     * subjects that start with the prefix, with this natsStatus */
    int chaos_fail_pubs;
    int chaos_fail_status;
    char chaos_fail_prefix[SWT_SUBJECT_MAX];
#endif
    /* The open subscriptions, for swt_conn_trim (sub.c). subs_mu is taken
     * before a subscription's own mu, never after it. */
    pthread_mutex_t subs_mu;
    struct swt_sub *subs;
    /* Subscriptions closed without a drain (the connection was down), kept
     * until the connection is destroyed (subs_mu): nats.c 3.4.1's read
     * loop uses a subscription it looked up without a reference (nats.c
     * issue 637), and one freed after a reconnect it raced could be freed
     * under the loop. A drained one cannot be: the server stopped sending
     * before the drain ended. */
    natsSubscription **graves;
    size_t ngraves, capgraves;
    int64_t trim_ms; /* swt_conn_trim's last pass (atomic): several owners' timers share one */
    /* The application's handle (1 until sw_conn_close) plus one per object
     * created on the connection (swt_conn_hold); the last release frees it. */
    int refs;       /* atomic */
    swt_tap_fn tap; /* swt_conn_set_tap (atomic: stored after tap_arg) */
    void *tap_arg;
    /* Internal listeners of the state (swt_conn_listen), called under
     * lis_mu, a leaf but for what the listeners take. */
    pthread_mutex_t lis_mu;
    swt_listener *lis;
};

/* Calls c's timing tap, if one is set (swt_conn_set_tap). */
static inline void
swt_conn_tap(sw_conn *c, swt_tap_point at, const void *data, size_t len)
{
    swt_tap_fn fn = __atomic_load_n(&c->tap, __ATOMIC_ACQUIRE);
    if (fn != NULL)
        fn(c->tap_arg, at, (const uint8_t *)data, len);
}

#ifdef SW_CHAOS
/* The natsStatus a publish on subj is to fail with (swx_conn_fail_publishes;
 * one of them counted), or 0 (NATS_OK) to publish it. */
int swt_chaos_fail_publish(sw_conn *c, const char *subj);
#endif

#endif
