/* gateway/gw_int.h -- what http.c and response.c share.
 *
 * Threads: the gateway runs `loops` event-loop threads (swg_opts.loops),
 * each an h2o evloop with its own descriptor of the one listening socket (a
 * free loop accepts first). A connection and the requests on it live on
 * one loop. Everything in a swg_loop belongs to its
 * thread, except lp->mu, the ready list and wake_pending, which on_ready
 * touches on library threads. The swg_gw is shared: read-only after start,
 * except its atomics and the list of open requests under gw->mu (which the
 * cancel endpoint searches, from any loop).
 *
 * A request is freed on its loop's thread only: it leaves gw's list under
 * gw->mu, then sw_stream_close (so no on_ready can follow), then it leaves
 * the ready list under lp->mu. Lock order: gw->mu, then a stream's lock,
 * then lp->mu (a cancel under gw->mu may call on_ready); never the other
 * way. */
#ifndef SW_GATEWAY_INT_H
#define SW_GATEWAY_INT_H

#include <pthread.h>

#include <h2o.h>

#include "gateway/events.h"
#include "gateway/gateway.h"

typedef struct swg_rq swg_rq;
typedef struct swg_loop swg_loop;
typedef struct swg_tok {
    swg_rq *q; /* NULL once q is gone */
} swg_tok;

/* The gateway: shared by its loops. */
typedef struct swg_gw {
    const swg_opts *o;
    h2o_globalconf_t config;
    swg_loop *loops;
    unsigned nloops;
    pthread_mutex_t mu;     /* all; init, go */
    pthread_cond_t init_cv; /* a loop thread made its h2o state; go was set */
    int go;                 /* every loop is ready: 1 run, -1 tear down (mu) */
    h2o_linklist_t all;     /* every open POST /v1/responses, on any loop (mu) */
    unsigned nconns;        /* open HTTP connections, all loops (atomic) */
    int stopping;           /* stop was asked (atomic): each loop drains */
    uint64_t metrics_shed;  /* metrics items not sent: the client was behind (atomic) */
    uint64_t stalled;       /* streams ended: the client took nothing for stall_ms (atomic) */
    uint64_t reset_closed;  /* HTTP/2 connections closed for resetting responses (atomic) */
} swg_gw;

/* One event loop and its thread. */
struct swg_loop {
    swg_gw *gw;
    const swg_opts *o; /* gw->o */
    unsigned index;
    pthread_t thread; /* loops after the first */
    int init_fd;      /* its descriptor of the listening socket, until loop_init */
    int init;         /* loop_init: 1 done, -1 failed, 0 not yet (gw->mu) */
    h2o_context_t ctx;
    h2o_accept_ctx_t accept_ctx;
    h2o_socket_t *listener;              /* NULL once closed (draining) */
    h2o_socket_t *wake_sock, *stop_sock; /* stop_sock: the first loop only */
    int wake_fd[2];
    h2o_timeout_t ka_timeout;    /* keepalive_ms */
    h2o_timeout_t stall_timeout; /* stall_ms: a write the client has not taken */
    h2o_timeout_t fin_timeout;   /* stall_ms / 4: a last write's progress (swg_fin, response.c) */
    h2o_timeout_t tick_timeout;  /* 100 ms: drain checks */
    h2o_timeout_t watch_timeout; /* SWG_WATCH_MS: HTTP/1 clients waiting for a whole answer */
    h2o_timeout_entry_t tick;
    pthread_mutex_t mu;        /* ready list, wake_pending */
    swg_rq *ready;             /* requests with something to take (mu) */
    int wake_pending;          /* a byte is in the wake pipe (mu) */
    h2o_linklist_t active;     /* every open POST /v1/responses of this loop (swg_rq) */
    h2o_linklist_t conns;      /* every open connection of this loop (swg_conn, http.c) */
    h2o_linklist_t run[2];     /* the run queue, see swg_rq_schedule */
    h2o_timeout_t run_timeout; /* 0 ms: the queue runs in the loop round's timeouts */
    h2o_timeout_entry_t run_entry;
    int run_hold;    /* the queue ran this round: it is linked again by the next round only */
    unsigned finals; /* last writes h2o has not finished (swg_fin, response.c): the drain waits */
    int draining, quit;
    int64_t drain_deadline, cancel_deadline;
    int accept_paused;      /* out of descriptors: the listener is read again at the next tick */
    int64_t accept_warn_ms; /* when that was last said */
    int64_t reset_warn_ms;  /* when a connection closed for rapid reset was last said */
};

typedef struct swg_conn swg_conn; /* http.c */

struct swg_rq {
    h2o_generator_t gen; /* first: h2o calls back with a pointer to it */
    swg_loop *lp;
    swg_conn *conn; /* its HTTP/2 connection's count (swg_conn_start), NULL if none */
    h2o_req_t *req; /* NULL once the response is final or the client left */
    sw_stream *s;
    swg_input in;
    swg_resp r;
    const char *endpoint;
    swg_buf out;                /* in h2o's hands until proceed */
    int writing;                /* an h2o_send awaits proceed */
    int ended;                  /* the terminal was taken */
    int created;                /* response.created went out */
    int queued;                 /* on lp->ready (lp->mu) */
    swg_rq *next_ready;         /* lp->mu */
    h2o_linklist_t run_link;    /* on lp->run[run_class] (loop thread) */
    int run_class;              /* which queue, while run_link is linked */
    h2o_linklist_t active_link; /* on lp->active */
    h2o_linklist_t all_link;    /* on gw->all (gw->mu) */
    h2o_timeout_entry_t ka;
    h2o_timeout_entry_t stall;      /* linked while writing (stall_ms > 0): see rq_stalled; the
                                       last write has its own (swg_fin) */
    h2o_timeout_entry_t watch;      /* non-stream over HTTP/1: is the client still there? */
    struct swg_tok *tok;            /* in the request's pool: tells us when h2o disposes it */
    char trace_id[40];              /* of the traceparent sent to the worker */
    int64_t t_start_ms, t_first_ms; /* monotonic: the request, its first item (0: none) */
    int logged;                     /* its access-log line went out */
    char request_id[80];            /* X-Request-Id */
};

/* How often a non-stream request over HTTP/1 looks whether its client
 * closed the connection (h2o reads nothing more from it meanwhile). */
#define SWG_WATCH_MS 250

/* http.c: HTTP/2 rapid reset (CVE-2023-44487), which libh2o 2.2 does not
 * limit: a client may open a stream and reset it at once, over and over,
 * and each POST /v1/responses among them costs a worker a request. So a
 * connection may have at most SWG_UNFINISHED_MAX responses whose streams
 * run at once, the client's or not (reset: the stream runs on until the
 * worker has stopped): 100 open (h2o runs at most that many requests of a
 * connection), and 100 more reset and not yet ended. Past that the
 * response is refused and the connection closed (h2o 2.2 sends no GOAWAY
 * on our behalf: the socket is shut down under it, as for a stalled
 * client). Counted when a response starts, not when h2o reports the reset:
 * h2o runs every request of what it read at once, and reports the resets
 * of those it had answered only after its next write. A response counts
 * until it is freed (swg_rq_free), whether its client is still there or
 * not: a client that resets now and then, over a long-lived connection,
 * is never closed (a count of resets would close it at its 200th); the
 * bound is on the work a connection has the workers do at once. HTTP/1 has
 * nothing to count: a client that leaves closes its connection. */
#define SWG_UNFINISHED_MAX 200
/* A response of req starts: 0 (*conn: its connection to hand to
 * swg_conn_finished, NULL if not counted), or -1: refuse it. */
int swg_conn_start(h2o_req_t *req, swg_conn **conn);
void swg_conn_finished(swg_conn *conn); /* its stream ended; NULL ok */
/* Shuts a connection down under h2o: its write in flight fails, and h2o
 * closes it and stops its requests. The close resets it: the client reads
 * nothing, and the kernel would otherwise hold the unsent bytes for
 * minutes. NULL ok. */
void swg_sock_abort(h2o_socket_t *sock);
/* req's connection's socket (HTTP/1 and HTTP/2 over TCP), or NULL. */
h2o_socket_t *swg_req_socket(h2o_req_t *req);

/* response.c */
void swg_rq_start(swg_loop *lp, h2o_req_t *req); /* POST /v1/responses */
/* The loop's run queue. A request with something to do (items ready, or
 * the client took the last bytes) is scheduled; swg_run_queue pumps from the
 * queue, requests whose first item has not gone out first (time to first
 * token), then the rest in order, at most SWG_RUN_BUDGET items per loop
 * round: a burst of other streams' tokens never keeps the loop from
 * accepting and reading new requests for long. */
void swg_rq_schedule(swg_rq *q);
void swg_run_queue(h2o_timeout_entry_t *entry); /* lp->run_entry's callback */
void swg_run_next_round(swg_loop *lp);          /* between loop rounds */
int swg_rq_cancel(swg_gw *gw, const char *id);  /* POST /v1/responses/{id}/cancel: 0 found */
void swg_rq_free(swg_rq *q);                    /* closes its stream, leaves every list, frees it */
void swg_wake(swg_loop *lp);                    /* any thread: the loop runs on_wake soon */
void swg_rq_on_ready(sw_stream *s, void *arg);  /* library thread */
void swg_send_json(h2o_req_t *req, int status, const char *reason, json_t *body /* stolen */);
/* Sends a whole answer: status, reason, Content-Type, and the body (copied)
 * with its Content-Length; for HEAD, the headers alone. body NULL: it
 * could not be made, the response ends in an error. */
void swg_send_whole(h2o_req_t *req, int status, const char *reason, const char *type,
                    const char *body, size_t len);
void swg_send_error(h2o_req_t *req, const swg_error *e);
/* e: 413 request_too_large, for a body over max_body bytes */
void swg_error_too_large(swg_error *e, size_t max_body);
/* The access-log line (unless --access-log off) of a request to
 * /v1/responses answered with an error before any stream opened: its HTTP
 * status, the error code its body carries, the model it asked for (NULL:
 * none known) and the trace id of its traceparent (if well formed).
 * t_start_ms: monotonic, when handling began (0: just now). A request
 * whose stream opened has its line from response.c (rq_log) instead. */
void swg_log_refused(const swg_opts *o, h2o_req_t *req, int status, const char *code,
                     const char *model, int64_t t_start_ms);

#endif
