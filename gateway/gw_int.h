/* gateway/gw_int.h -- what http.c and response.c share.
 *
 * Threads: everything here belongs to the loop thread (one h2o evloop),
 * except gw->mu, the ready list and wake_pending, which on_ready touches on
 * library threads. A request is freed on the loop thread only, after
 * sw_stream_close (so no on_ready can follow) and after leaving the ready
 * list under gw->mu. */
#ifndef SW_GATEWAY_INT_H
#define SW_GATEWAY_INT_H

#include <pthread.h>

#include <h2o.h>

#include "gateway/events.h"
#include "gateway/gateway.h"

typedef struct swg_rq swg_rq;
typedef struct swg_tok {
    swg_rq *q; /* NULL once q is gone */
} swg_tok;

typedef struct swg_gw {
    const swg_opts *o;
    h2o_globalconf_t config;
    h2o_context_t ctx;
    h2o_accept_ctx_t accept_ctx;
    h2o_socket_t *listener; /* NULL once closed (draining) */
    h2o_socket_t *wake_sock, *stop_sock;
    int wake_fd[2];
    h2o_timeout_t ka_timeout;   /* keepalive_ms */
    h2o_timeout_t tick_timeout; /* 100 ms: drain checks */
    h2o_timeout_entry_t tick;
    pthread_mutex_t mu; /* ready list, wake_pending */
    swg_rq *ready;      /* requests with something to take (mu) */
    int wake_pending;   /* a byte is in the wake pipe (mu) */
    swg_rq *active;     /* every open POST /v1/responses (loop thread) */
    swg_rq *taken;      /* taken from `ready`, not pumped yet (loop thread; a request
                           freed meanwhile leaves it) */
    unsigned nactive;
    unsigned nconns; /* open HTTP connections */
    int draining, quit;
    int64_t drain_deadline, cancel_deadline;
    uint64_t metrics_shed; /* metrics items not sent: the client was behind (atomic) */
} swg_gw;

struct swg_rq {
    h2o_generator_t gen; /* first: h2o calls back with a pointer to it */
    swg_gw *gw;
    h2o_req_t *req; /* NULL once the response is final or the client left */
    sw_stream *s;
    swg_input in;
    swg_resp r;
    const char *endpoint;
    swg_buf out;        /* in h2o's hands until proceed */
    int writing;        /* an h2o_send awaits proceed */
    int ended;          /* the terminal was taken */
    int created;        /* response.created went out */
    int queued;         /* on gw->ready (gw->mu) */
    swg_rq *next_ready; /* gw->mu */
    swg_rq *next_taken; /* on gw->taken (loop thread): next_ready may be rewritten by
                           on_ready as soon as queued is cleared */
    int in_taken;
    swg_rq *prev, *next; /* gw->active */
    h2o_timeout_entry_t ka;
    struct swg_tok *tok;            /* in the request's pool: tells us when h2o disposes it */
    char trace_id[40];              /* of the traceparent sent to the worker */
    int64_t t_start_ms, t_first_ms; /* monotonic: the request, its first item (0: none) */
    int logged;                     /* its access-log line went out */
    char request_id[80];            /* X-Request-Id */
};

/* response.c */
void swg_rq_start(swg_gw *gw, h2o_req_t *req); /* POST /v1/responses */
void swg_rq_pump(swg_rq *q);                   /* loop thread: take what is ready */
int swg_rq_cancel(swg_gw *gw, const char *id); /* POST /v1/responses/{id}/cancel: 0 found */
void swg_rq_on_ready(sw_stream *s, void *arg); /* library thread */
void swg_send_json(h2o_req_t *req, int status, const char *reason, json_t *body /* stolen */);
void swg_send_error(h2o_req_t *req, const swg_error *e);

#endif
