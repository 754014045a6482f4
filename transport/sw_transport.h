/* transport/sw_transport.h -- the NATS layer: the connection, subject naming
 * and validation, bounded publishing. Ingress, egress and router talk to NATS
 * only through this header. */
#ifndef SW_TRANSPORT_H
#define SW_TRANSPORT_H

#include <nats/nats.h>

#include "common/sw_common.h"

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

/* Subject buffers: prefix + endpoint + tokens always fit in this. */
#define SWT_SUBJECT_MAX 320

/* sw.req.<ns>.<component>.<endpoint>.<instance> */
sw_err swt_subject_request(char *out, size_t cap, const char *endpoint, const char *instance);
/* sw.ctl.<instance> */
sw_err swt_subject_control(char *out, size_t cap, const char *instance);
/* sw.rsp.<router>.<request id hex> */
sw_err swt_subject_response(char *out, size_t cap, const char *router, const char *reqhex);
/* sw.rsp.<router>.* : the router's one mux subscription */
sw_err swt_subject_response_wildcard(char *out, size_t cap, const char *router);
/* sw.rtr.<router>: the frontend's own control subject (liveness probes) */
sw_err swt_subject_router(char *out, size_t cap, const char *router);
/* Extracts the last token of a response subject into a 16-byte id. 0 ok. */
int swt_response_subject_id(const char *subject, uint8_t id[SW_REQUEST_ID_BYTES]);
/* sw.rsp.<router>.hb: where workers send a frontend the heartbeats of many
 * streams at once (HeartbeatBatch); the router's mux subscription gets it. */
sw_err swt_subject_beats(char *out, size_t cap, const char *router);
/* 1 if subject is a response subject's heartbeat-batch form (last token "hb"). */
int swt_is_beats_subject(const char *subject);

/* Publishes data on subj (reply may be NULL). Checks len against the
 * server's max payload first: SW_EMSGSIZE, nothing sent. */
sw_err swt_publish(sw_conn *c, const char *subj, const char *reply, const void *data, size_t len);

/* Removes a subscription: lets the messages it already has run through its
 * callback (drain, up to 2 s) when connected, unsubscribes at once when
 * not, then destroys it and sets *sub to NULL. When it returns, the
 * callback is not running. NULL *sub is a no-op. */
void swt_sub_close(sw_conn *c, natsSubscription **sub);

#endif
