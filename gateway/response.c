/* gateway/response.c -- one POST /v1/responses: the request body, the
 * stream on the embedded router, and its events.
 *
 * Flow: the stream is opened in blocking mode with on_ready. on_ready (a
 * library thread) puts the request on the gateway's ready list and wakes
 * the loop through a pipe; the loop schedules it on its run queue (see
 * swg_rq_schedule), and its turn takes what sw_stream_next(s, .., 0) has,
 * as events, and gives them to h2o in one h2o_send. While h2o has not
 * called proceed (the client has not taken the bytes), nothing more is
 * taken from the stream: credits stop the worker, so a slow client costs a
 * bounded amount of memory (the credit window's items, and a round of
 * events: taken while under SWG_ROUND_BYTES, the last item's event whole,
 * up to 6 times its bytes once JSON-escaped). A write the client takes nothing of for
 * stall_ms ends the response (rq_stalled), so a client that never reads
 * does not hold the stream, its worker's handler and our memory for ever;
 * the last write too, after q is gone (swg_fin).
 *
 * response.created waits for the first item, so a request that fails
 * before any response exists (no_instances, no_responders,
 * payload_too_large, overloaded) gets an `error` event instead. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <linux/tcp.h>
#include <sys/socket.h>

#include <sodium.h>

#include "common/sw_common.h"
#include "gateway/gw_int.h"

#define SWG_ROUND_BYTES (64 * 1024) /* a round takes items while its events are under it */
/* A client with this many items waiting for it is behind: metrics are shed. */
#define SWG_BEHIND_ITEMS 8

void
swg_send_whole(h2o_req_t *req, int status, const char *reason, const char *type, const char *body,
               size_t len)
{
    static h2o_generator_t gen = {NULL, NULL};
    h2o_iovec_t b;
    req->res.status = status;
    req->res.reason = reason;
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, type, strlen(type));
    if (body == NULL) { /* it could not be written: the response ends in an error */
        h2o_start_response(req, &gen);
        h2o_send(req, NULL, 0, H2O_SEND_STATE_ERROR);
        return;
    }
    /* A length, so HTTP/1.1 needs no chunks and keeps the connection. */
    req->res.content_length = len;
    h2o_start_response(req, &gen);
    if (h2o_memis(req->input.method.base, req->input.method.len, H2O_STRLIT("HEAD"))) {
        h2o_send(req, NULL, 0, H2O_SEND_STATE_FINAL); /* the headers alone */
        return;
    }
    b = h2o_strdup(&req->pool, body, len);
    h2o_send(req, &b, 1, H2O_SEND_STATE_FINAL);
}

/* A whole JSON answer (js NULL: it could not be written). */
static void
send_body(h2o_req_t *req, int status, const char *reason, const char *js, size_t len)
{
    swg_send_whole(req, status, reason, "application/json", js, len);
}

void
swg_send_json(h2o_req_t *req, int status, const char *reason, json_t *body)
{
    char *js = body ? json_dumps(body, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    if (body != NULL)
        json_decref(body);
    send_body(req, status, reason, js, js ? strlen(js) : 0);
    free(js);
}

static const char *
reason_of(int status)
{
    switch (status) {
    case 200:
        return "OK";
    case 400:
        return "Bad Request";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 413:
        return "Payload Too Large";
    case 429:
        return "Too Many Requests";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    default:
        return "Internal Server Error";
    }
}

/* A JSON answer written into b (freed here). */
static void
send_buf(h2o_req_t *req, int status, swg_buf *b)
{
    send_body(req, status, reason_of(status), b->oom ? NULL : b->p, b->len);
    swg_buf_free(b);
}

void
swg_send_error(h2o_req_t *req, const swg_error *e)
{
    swg_buf b = {NULL, 0, 0, 0};
    swg_error_write(&b, e);
    send_buf(req, e->http, &b);
}

void
swg_error_too_large(swg_error *e, size_t max_body)
{
    memset(e, 0, sizeof(*e));
    e->http = 413;
    e->type = "invalid_request_error";
    e->code = "request_too_large";
    snprintf(e->message, sizeof(e->message),
             "the request body is over the gateway's limit of %zu bytes (--max-body)", max_body);
}

/* ---------------------------------------------------------------- access log */

static int64_t
mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* At most 100 bytes of a model name, cut at a character's start (a name
 * the client gave is valid UTF-8, and may be as long as the body). */
static size_t
model_len(const char *m)
{
    size_t n = strlen(m);
    if (n > 100)
        for (n = 100; n > 0 && ((unsigned char)m[n] & 0xc0) == 0x80; n--)
            ;
    return n;
}

/* s as valid UTF-8: s itself, or fix's text (bad bytes as U+FFFD; "" if
 * it could not be written). NULL stays NULL. */
static const char *
utf8_or_fixed(const char *s, swg_buf *fix)
{
    if (s == NULL || swg_utf8_fix(s, strlen(s), fix))
        return s;
    return fix->oom || fix->p == NULL ? "" : fix->p;
}

/* One JSON line on stdout: trace id, response id, model, instance, the
 * HTTP status, terminal, reason, items, time to first item and duration,
 * in milliseconds. A string that is not UTF-8 -- a worker's reason is its
 * bytes, passed on -- has its bad bytes as U+FFFD: jansson refuses it, and
 * the line was lost. */
static void
log_line(const char *trace_id, const char *response_id, const char *model, const char *instance,
         int status, const char *terminal, const char *reason, unsigned items, int64_t ttfi_ms,
         int64_t duration_ms)
{
    swg_buf fix[3] = {{NULL, 0, 0, 0}, {NULL, 0, 0, 0}, {NULL, 0, 0, 0}};
    json_t *j;
    char *s;
    model = utf8_or_fixed(model, &fix[0]);
    instance = utf8_or_fixed(instance, &fix[1]);
    reason = utf8_or_fixed(reason, &fix[2]);
    j = json_pack("{s:s, s:s, s:s%, s:s, s:i, s:s, s:s?, s:i, s:I, s:I}", "trace_id", trace_id,
                  "response_id", response_id, "model", model, model_len(model), "instance",
                  instance, "status", status, "terminal", terminal, "reason", reason, "items",
                  (int)items, "ttfi_ms", (json_int_t)ttfi_ms, "duration_ms",
                  (json_int_t)duration_ms);
    for (int i = 0; i < 3; i++)
        swg_buf_free(&fix[i]);
    if (j == NULL)
        return;
    if ((s = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER)) != NULL) {
        printf("%s\n", s);
        fflush(stdout);
        free(s);
    }
    json_decref(j);
}

/* The access-log line of a request whose stream opened (unless --access-log
 * off), once: when its last write is done or stalled (rq_last), or its
 * client left or stalled before.
 * status: the HTTP status it was (or is being) answered with -- 200 once a
 * stream's headers went out. */
static void
rq_log(swg_rq *q, int status, const char *terminal, const char *reason)
{
    if (q->logged || !q->lp->o->access_log)
        return;
    q->logged = 1;
    log_line(q->trace_id, q->r.id, q->r.model ? q->r.model : "",
             q->s != NULL ? sw_stream_instance_id(q->s) : "", status, terminal, reason, q->r.items,
             q->t_first_ms ? q->t_first_ms - q->t_start_ms : -1, mono_ms() - q->t_start_ms);
}

static const char *header(h2o_req_t *req, const char *name);

void
swg_log_refused(const swg_opts *o, h2o_req_t *req, int status, const char *code, const char *model,
                int64_t t_start_ms)
{
    char tid[SWI_TRACE_ID_LEN + 1];
    const char *tp;
    if (!o->access_log)
        return;
    if ((tp = header(req, "traceparent")) == NULL || !swi_trace_id(tp, tid))
        tid[0] = '\0';
    log_line(tid, "", model != NULL ? model : "", "", status, "error", code, 0, -1,
             t_start_ms > 0 ? mono_ms() - t_start_ms : 0);
}

/* ---------------------------------------------------------------- the last write */

/* A response's last write -- a stream's terminal round, or a whole answer
 * -- goes to h2o with H2O_SEND_STATE_FINAL, and its swg_rq is freed then.
 * What must outlive it lives in the HTTP request's pool, which h2o disposes
 * once it is done with the request: the last bytes written (HTTP/1: taken
 * by the socket; HTTP/2: the stream's last frame flushed) or the connection
 * closed. Until then:
 * - the stall clock. libh2o 2.2 has no write timeout on HTTP/1 and
 *   suspends HTTP/2's idle timeout while a response is pending: a client
 *   that stops reading would keep the connection, and the bytes h2o holds
 *   for it, for good. The last write can be megabytes (the terminal events
 *   carry the whole text, four times), so the clock runs from the client's
 *   last progress, not from the write's start: every stall_ms / 4 the
 *   bytes of the connection it acknowledged are looked at, and it is let
 *   go once they have not grown for stall_ms. A slow reader is not cut
 *   off;
 * - the loop's count of last writes, which its drain waits for;
 * - the access-log line, written when the write is done or stalled. */
typedef struct swg_fin {
    swg_loop *lp;
    h2o_req_t *req;
    h2o_timeout_entry_t stall; /* on lp->fin_timeout */
    uint64_t acked;            /* the connection's bytes the client acknowledged, last seen */
    int64_t since_ms;          /* when they last grew (monotonic) */
    int log;                   /* the access-log line is still to be written */
    char trace_id[40];
    const char *response_id, *model, *instance, *terminal, *reason; /* the pool's, or static */
    int status;
    unsigned items;
    int64_t ttfi_ms, t_start_ms;
} swg_fin;

/* The bytes of req's connection its client has acknowledged (TCP_INFO), or
 * 0 if not known. */
static uint64_t
sock_acked(h2o_req_t *req)
{
    h2o_socket_t *sock = swg_req_socket(req);
    struct tcp_info ti;
    socklen_t len = sizeof(ti);
    int fd;
    memset(&ti, 0, sizeof(ti));
    if (sock == NULL || (fd = h2o_socket_get_fd(sock)) < 0 ||
        getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
        len < offsetof(struct tcp_info, tcpi_bytes_acked) + sizeof(ti.tcpi_bytes_acked))
        return 0;
    return ti.tcpi_bytes_acked;
}

static void
fin_log(swg_fin *f)
{
    if (!f->log)
        return;
    f->log = 0;
    log_line(f->trace_id, f->response_id, f->model, f->instance, f->status, f->terminal, f->reason,
             f->items, f->ttfi_ms, mono_ms() - f->t_start_ms);
}

/* Every stall_ms / 4 of a last write: once the client has taken nothing
 * for stall_ms, the connection is shut down under h2o as rq_stalled does,
 * and h2o closes it and disposes the request. The stream has ended
 * already; the line says which end the client did not take. */
static void
fin_stalled(h2o_timeout_entry_t *entry)
{
    swg_fin *f = H2O_STRUCT_FROM_MEMBER(swg_fin, stall, entry);
    uint64_t acked = sock_acked(f->req);
    int64_t now = mono_ms();
    if (acked != f->acked) { /* it took some */
        f->acked = acked;
        f->since_ms = now;
    }
    if (now - f->since_ms < f->lp->o->stall_ms) {
        h2o_timeout_link(f->lp->ctx.loop, &f->lp->fin_timeout, &f->stall);
        return;
    }
    __atomic_fetch_add(&f->lp->gw->stalled, 1, __ATOMIC_RELAXED);
    f->reason = f->terminal;
    f->terminal = "client_stalled";
    fin_log(f);
    swg_sock_abort(swg_req_socket(f->req));
}

/* h2o is done with the request: the last write went out (or the
 * connection closed). */
static void
fin_dispose(void *p)
{
    swg_fin *f = p;
    if (h2o_timeout_is_linked(&f->stall))
        h2o_timeout_unlink(&f->stall);
    fin_log(f);
    f->lp->finals--;
}

/* q's caller hands its last write to h2o next: the swg_fin that outlives q
 * takes the access-log line (status, terminal, reason) and runs the stall
 * clock. With no HTTP request left (its client went), just the line. */
static void
rq_last(swg_rq *q, int status, const char *terminal, const char *reason)
{
    h2o_req_t *req = q->req;
    swg_loop *lp = q->lp;
    swg_fin *f;
    if (req == NULL) {
        rq_log(q, status, terminal, reason);
        return;
    }
    f = h2o_mem_alloc_shared(&req->pool, sizeof(*f), fin_dispose); /* never NULL */
    memset(f, 0, sizeof(*f));
    f->lp = lp;
    f->req = req;
    f->stall.cb = fin_stalled;
    if (!q->logged && lp->o->access_log) {
        f->log = 1;
        snprintf(f->trace_id, sizeof(f->trace_id), "%s", q->trace_id);
        f->response_id = h2o_strdup(&req->pool, q->r.id, SIZE_MAX).base;
        f->model = q->r.model ? q->r.model : ""; /* the options' */
        f->instance =
            h2o_strdup(&req->pool, q->s != NULL ? sw_stream_instance_id(q->s) : "", SIZE_MAX).base;
        f->terminal = terminal; /* end_of's, static */
        f->reason = reason != NULL ? h2o_strdup(&req->pool, reason, SIZE_MAX).base : NULL;
        f->status = status;
        f->items = q->r.items;
        f->ttfi_ms = q->t_first_ms ? q->t_first_ms - q->t_start_ms : -1;
        f->t_start_ms = q->t_start_ms;
    }
    q->logged = 1;
    lp->finals++;
    if (lp->o->stall_ms > 0) {
        f->acked = sock_acked(req);
        f->since_ms = mono_ms();
        h2o_timeout_link(lp->ctx.loop, &lp->fin_timeout, &f->stall);
    }
}

/* ---------------------------------------------------------------- run queue */

#define SWG_RUN_BUDGET 1024 /* items pumped per loop round, at most (about) */

#define RQ_OF(link, member) H2O_STRUCT_FROM_MEMBER(swg_rq, member, link)

/* Takes what is ready, at most max items, into one write; returns the
 * items taken. May free q (its terminal). */
static unsigned rq_pump(swg_rq *q, unsigned max);

static void
run_unlink(swg_rq *q)
{
    if (h2o_linklist_is_linked(&q->run_link))
        h2o_linklist_unlink(&q->run_link);
}

/* The queue runs from a 0 ms h2o timeout, inside the loop round: h2o runs
 * the callbacks of the writes it starts (proceed) before it polls again.
 * Writing from outside a round leaves libh2o 2.2's epoll state stale: a
 * write that completes at once, whose callback then runs a round later
 * without a new write, keeps the socket polled for writing with no writer,
 * and h2o aborts (evloop.c.h write_pending's assertion) when it fires. */
static void
run_link(swg_loop *lp)
{
    if (!lp->run_hold && !h2o_timeout_is_linked(&lp->run_entry))
        h2o_timeout_link(lp->ctx.loop, &lp->run_timeout, &lp->run_entry);
}

void
swg_rq_schedule(swg_rq *q)
{
    swg_loop *lp = q->lp;
    int c = q->t_first_ms == 0 ? 0 : 1; /* no item out yet: first */
    if (!h2o_linklist_is_linked(&q->run_link) || q->run_class != c) {
        run_unlink(q);
        q->run_class = c;
        h2o_linklist_insert(&lp->run[c], &q->run_link); /* at the tail */
    }
    run_link(lp);
}

void
swg_run_queue(h2o_timeout_entry_t *entry)
{
    swg_loop *lp = (swg_loop *)((char *)entry - offsetof(swg_loop, run_entry));
    unsigned budget = SWG_RUN_BUDGET;
    /* Not linked again this round (h2o would run a 0 ms entry linked from
     * its own round again at once, without polling): requests scheduled
     * from now on wait for swg_run_next_round. */
    lp->run_hold = 1;
    while (budget > 0) {
        int first = !h2o_linklist_is_empty(&lp->run[0]);
        swg_rq *q;
        unsigned n;
        if (!first && h2o_linklist_is_empty(&lp->run[1]))
            return;
        q = RQ_OF(lp->run[first ? 0 : 1].next, run_link);
        run_unlink(q);
        /* a first item goes out alone: the rest of its stream waits its
         * turn. The rest of the budget bounds the others: a streamed round
         * also stops at SWG_ROUND_BYTES, but a non-streamed request writes
         * nothing, and took everything ready at once (up to the credit
         * window, 16,384 items); one stopped by max is scheduled again. */
        n = rq_pump(q, first ? 1 : budget) + 1; /* may free q */
        budget = n >= budget ? 0 : budget - n;
    }
}

void
swg_run_next_round(swg_loop *lp)
{
    lp->run_hold = 0;
    if (!h2o_linklist_is_empty(&lp->run[0]) || !h2o_linklist_is_empty(&lp->run[1]))
        run_link(lp);
}

/* ---------------------------------------------------------------- lifetime */

void
swg_rq_free(swg_rq *q)
{
    swg_loop *lp = q->lp;
    swg_gw *gw = lp->gw;
    if (q->tok != NULL)
        q->tok->q = NULL;
    /* Out of the cancel endpoint's reach first (its sw_stream_cancel runs
     * under gw->mu), then no on_ready after the close; then off the ready
     * list for good. */
    pthread_mutex_lock(&gw->mu);
    if (h2o_linklist_is_linked(&q->all_link))
        h2o_linklist_unlink(&q->all_link);
    pthread_mutex_unlock(&gw->mu);
    sw_stream_close(q->s);
    q->s = NULL;
    swg_conn_finished(q->conn); /* its stream ended: it no longer counts */
    q->conn = NULL;
    pthread_mutex_lock(&lp->mu);
    for (swg_rq **pp = &lp->ready; *pp != NULL; pp = &(*pp)->next_ready)
        if (*pp == q) {
            *pp = q->next_ready;
            break;
        }
    pthread_mutex_unlock(&lp->mu);
    run_unlink(q);
    if (h2o_timeout_is_linked(&q->ka))
        h2o_timeout_unlink(&q->ka);
    if (h2o_timeout_is_linked(&q->stall))
        h2o_timeout_unlink(&q->stall);
    if (h2o_timeout_is_linked(&q->watch))
        h2o_timeout_unlink(&q->watch);
    if (h2o_linklist_is_linked(&q->active_link))
        h2o_linklist_unlink(&q->active_link);
    swg_buf_free(&q->out);
    swg_resp_free(&q->r);
    swg_input_free(&q->in);
    free(q);
}

/* Under lp->mu: 1 if the caller must write the wake-up byte. */
static int
wake_locked(swg_loop *lp)
{
    if (lp->wake_pending)
        return 0;
    lp->wake_pending = 1;
    return 1;
}

void
swg_wake(swg_loop *lp)
{
    int wake;
    pthread_mutex_lock(&lp->mu);
    wake = wake_locked(lp);
    pthread_mutex_unlock(&lp->mu);
    if (wake)
        (void)!write(lp->wake_fd[1], "w", 1);
}

void
swg_rq_on_ready(sw_stream *s, void *arg)
{
    swg_rq *q = arg;
    swg_loop *lp = q->lp;
    int wake;
    (void)s;
    pthread_mutex_lock(&lp->mu);
    if (!q->queued) {
        q->queued = 1;
        q->next_ready = lp->ready;
        lp->ready = q;
    }
    wake = wake_locked(lp);
    pthread_mutex_unlock(&lp->mu);
    if (wake)
        (void)!write(lp->wake_fd[1], "w", 1);
}

/* ---------------------------------------------------------------- events */

/* A terminal item as the response's end. pre: an error before any
 * response existed, which becomes an `error` event / an HTTP error. */
static void
end_of(const sw_item *it, swg_end *end, int *pre, int *http)
{
    const sw_terminal *t = &it->terminal;
    memset(end, 0, sizeof(*end));
    *pre = 0;
    *http = 200;
    switch (t->status) {
    case SW_STATUS_COMPLETED:
        end->status = "completed";
        break;
    case SW_STATUS_INCOMPLETE:
        end->status = "incomplete";
        end->inc_reason = t->reason != NULL && strcmp(t->reason, "max_tokens") == 0
                              ? "max_output_tokens"
                              : t->reason;
        break;
    case SW_STATUS_CANCELLED:
        end->status = "cancelled";
        end->inc_reason = "cancelled";
        break;
    case SW_STATUS_FAILED:
        end->status = "failed";
        end->err_code = t->reason != NULL && t->reason[0] ? t->reason : "failed";
        end->err_message = t->message;
        break;
    default:
        end->status = "failed";
        end->err_code = sw_err_name(t->error);
        end->err_message = t->message != NULL && t->message[0] ? t->message : sw_strerror(t->error);
        switch (t->error) {
        case SW_NO_INSTANCES:
        case SW_NO_RESPONDERS:
            *pre = 1;
            *http = 503;
            break;
        case SW_EMSGSIZE:
            *pre = 1;
            *http = 413;
            break;
        case SW_EOVERLOADED:
            *pre = 1;
            *http = 429;
            break;
        case SW_DEADLINE_EXCEEDED:
            *http = 504;
            break;
        default:
            break;
        }
        break;
    }
}

/* The response's first event(s), once: created and in_progress. */
static void
rq_created(swg_rq *q)
{
    if (!q->created) {
        q->created = 1;
        if (q->in.stream) {
            swg_sse_created(&q->out, &q->r);
            if (q->lp->o->narration) {
                char msg[160];
                snprintf(msg, sizeof(msg), "routed to instance %s",
                         q->s != NULL ? sw_stream_instance_id(q->s) : "");
                swg_sse_narration(&q->out, &q->r, "start", msg);
            }
        }
    }
}

static void
rq_ka_relink(swg_rq *q)
{
    if (q->lp->o->keepalive_ms <= 0 || !q->in.stream)
        return;
    if (h2o_timeout_is_linked(&q->ka))
        h2o_timeout_unlink(&q->ka);
    h2o_timeout_link(q->lp->ctx.loop, &q->lp->ka_timeout, &q->ka);
}

/* An h2o_send goes out: nothing more is taken from the stream until h2o
 * calls proceed (rq_write_done), and the stall clock runs. */
static void
rq_write_start(swg_rq *q)
{
    q->writing = 1;
    rq_ka_relink(q);
    if (q->lp->o->stall_ms > 0 && !h2o_timeout_is_linked(&q->stall))
        h2o_timeout_link(q->lp->ctx.loop, &q->lp->stall_timeout, &q->stall);
}

static void
rq_write_done(swg_rq *q)
{
    q->writing = 0;
    q->out.len = 0;
    if (h2o_timeout_is_linked(&q->stall))
        h2o_timeout_unlink(&q->stall);
}

/* Takes the HTTP request from q for its last h2o_send, which q's caller
 * follows with swg_rq_free. The pool's token lets go of q first: a send
 * with nothing to write completes (and disposes the request) inside
 * h2o_send, and the dispose must not free q a second time. */
static h2o_req_t *
rq_take_req(swg_rq *q)
{
    h2o_req_t *req = q->req;
    q->req = NULL;
    if (q->tok != NULL) {
        q->tok->q = NULL;
        q->tok = NULL;
    }
    return req;
}

/* Hands q->out to h2o: the last bytes of the response (final), or more. */
static void
rq_flush(swg_rq *q, int final)
{
    h2o_req_t *req = q->req;
    h2o_iovec_t b;
    if (req == NULL)
        return;
    if (final) {
        /* h2o may write after we are gone: the bytes live in the request's pool. */
        b = h2o_strdup(&req->pool, q->out.p ? q->out.p : "", q->out.len);
        q->out.len = 0;
        (void)rq_take_req(q);
        h2o_send(req, &b, 1, H2O_SEND_STATE_FINAL);
        return;
    }
    if (q->out.len == 0)
        return;
    b = h2o_iovec_init(q->out.p, q->out.len);
    rq_write_start(q);
    h2o_send(req, &b, 1, H2O_SEND_STATE_IN_PROGRESS);
}

/* Non-stream: the one JSON answer. */
static void
rq_answer(swg_rq *q, const swg_end *end, int pre, int http)
{
    h2o_req_t *req = rq_take_req(q);
    if (pre) {
        swg_error e;
        memset(&e, 0, sizeof(e));
        e.http = http;
        e.type = http == 429 ? "rate_limit_error" : "server_error";
        e.code = end->err_code;
        snprintf(e.message, sizeof(e.message), "%s", end->err_message ? end->err_message : "");
        swg_send_error(req, &e);
        return;
    }
    {
        swg_buf b = {NULL, 0, 0, 0};
        swg_response_write(&b, &q->r, end);
        send_buf(req, http, &b);
    }
}

static unsigned
rq_pump(swg_rq *q, unsigned max)
{
    const sw_item *it;
    int final = 0;
    unsigned taken = 0;
    const char *lterm = NULL, *lreason = NULL; /* the terminal's, for its log line */
    if (q->writing || q->ended || q->s == NULL)
        return 0;
    while (q->out.len < SWG_ROUND_BYTES && taken < max && sw_stream_next(q->s, &it, 0) == SW_OK) {
        taken++;
        swg_buf *b = q->in.stream ? &q->out : NULL;
        if (it->kind == SW_ITEM_DATA) {
            size_t off, n;
            int refusal;
            if (q->t_first_ms == 0)
                q->t_first_ms = mono_ms();
            rq_created(q);
            if (strcmp(it->event, "metrics") == 0) {
                /* Droppable: shed first when this client is behind (items
                 * wait behind this one, or this round is already large). */
                sw_stream_stats st;
                if (b == NULL)
                    continue;
                sw_stream_stats_get(q->s, &st);
                if (st.pending < SWG_BEHIND_ITEMS && q->out.len < SWG_ROUND_BYTES / 2)
                    swg_sse_metrics(b, &q->r, it->data, it->len);
                else
                    __atomic_fetch_add(&q->lp->gw->metrics_shed, 1, __ATOMIC_RELAXED);
                continue;
            }
            refusal = strcmp(it->event, "refusal") == 0;
            if (!q->r.started) {
                q->r.refusal = refusal;
                swg_sse_started(b, &q->r);
            } else if (refusal != q->r.refusal) {
                swg_sse_switch(b, &q->r, refusal);
            }
            swg_resp_add(&q->r, it->data, it->len, &off, &n);
            if (n > 0)
                swg_sse_delta(b, &q->r, q->r.text.p + off, n);
            continue;
        }
        {
            swg_end end;
            int pre, http;
            end_of(it, &end, &pre, &http);
            if (pre && q->created) {
                /* after a response exists, errors are failures: 200 with
                 * the failed response object (e.g. no_instances when a
                 * migration finds no other instance) */
                pre = 0;
                http = 200;
            }
            q->ended = 1;
            /* the access-log line: written once the last write is done
             * (rq_last), from `it`'s strings, which hold until the next
             * sw_stream_next */
            lterm = pre ? "error" : end.status;
            lreason = end.err_code ? end.err_code : end.inc_reason;
            if (!q->in.stream) {
                rq_last(q, http, lterm, lreason);
                if (q->req != NULL)
                    rq_answer(q, &end, pre, http);
                swg_rq_free(q);
                return taken;
            }
            if (pre) {
                swg_sse_error(&q->out, &q->r, end.err_code, end.err_message);
            } else {
                rq_created(q);
                swg_sse_done(&q->out, &q->r, &end);
                if (q->lp->o->narration) {
                    char msg[160];
                    if (strcmp(end.status, "cancelled") == 0)
                        swg_sse_narration(&q->out, &q->r, "cancel",
                                          it->terminal.message && it->terminal.message[0]
                                              ? it->terminal.message
                                              : "cancelled");
                    snprintf(msg, sizeof(msg), "%s%s%s: %u items in %lld ms", end.status,
                             end.err_code || end.inc_reason ? " " : "",
                             end.err_code     ? end.err_code
                             : end.inc_reason ? end.inc_reason
                                              : "",
                             q->r.items, (long long)(mono_ms() - q->t_start_ms));
                    swg_sse_narration(&q->out, &q->r, "end", msg);
                }
                swg_sse_terminal(&q->out, &q->r, &end);
            }
            final = 1;
            break;
        }
    }
    if (q->in.stream) {
        if (q->out.oom) {
            /* cannot say more: end the HTTP response */
            q->ended = 1;
            rq_log(q, 200, "error", "out_of_memory");
            if (q->req != NULL) {
                h2o_req_t *req = rq_take_req(q);
                h2o_send(req, NULL, 0, H2O_SEND_STATE_ERROR);
            }
            swg_rq_free(q);
            return taken;
        }
        if (final)
            rq_last(q, 200, lterm, lreason);
        rq_flush(q, final);
        if (final) {
            swg_rq_free(q);
            return taken;
        }
    }
    if (taken >= max && !q->writing)
        swg_rq_schedule(q); /* stopped at max with nothing to write: more to take */
    return taken;
}

/* ---------------------------------------------------------------- h2o callbacks */

static void
rq_proceed(h2o_generator_t *gen, h2o_req_t *req)
{
    swg_rq *q = (swg_rq *)gen;
    (void)req;
    rq_write_done(q);
    swg_rq_schedule(q);
}

/* The client left (or h2o ends the request): the stream is cancelled
 * (unless --cancel-on-disconnect off: then it is read to its end and
 * dropped, which also keeps the worker's credit flowing). */
static void
rq_gone(swg_rq *q)
{
    q->req = NULL;
    if (!q->ended)
        rq_log(q, q->in.stream ? 200 : 499, "client_gone",
               q->lp->o->cancel_on_disconnect ? "cancelled" : NULL);
    if (!q->ended && q->lp->o->cancel_on_disconnect) {
        (void)sw_stream_cancel(q->s);
        q->ended = 1;
    }
    if (q->ended) {
        swg_rq_free(q);
        return;
    }
    /* cancel-on-disconnect off: keep taking items until the terminal (the
     * round h2o held is dropped: a full one would stop the pump for good) */
    q->in.stream = 0;
    rq_write_done(q);
    swg_rq_schedule(q);
}

static void
rq_stop(h2o_generator_t *gen, h2o_req_t *req)
{
    (void)req;
    rq_gone((swg_rq *)gen);
}

/* h2o disposes the request (its pool): the last word on a client that left
 * a non-stream request (no generator, so no stop). */
static void
rq_on_dispose(void *p)
{
    swg_tok *t = p;
    if (t->q != NULL) {
        swg_rq *q = t->q;
        q->tok = NULL;
        rq_gone(q);
    }
}

static void
rq_keepalive(h2o_timeout_entry_t *entry)
{
    swg_rq *q = (swg_rq *)((char *)entry - offsetof(swg_rq, ka));
    if (q->ended || q->req == NULL)
        return;
    if (q->writing) {
        /* a write still under way (a slow reader): look again after
         * another interval rather than never */
        rq_ka_relink(q);
        return;
    }
    swg_sse_keepalive(&q->out);
    rq_flush(q, 0);
}

/* A write has waited stall_ms for the client to take it (it stopped
 * reading, or gave the stream no HTTP/2 window): the stream is cancelled
 * (unless --cancel-on-disconnect off, as for a client that left) and the
 * response ends as an error. h2o_send cannot end it: it asserts while a
 * write is in flight, on both protocols. So the connection is shut down
 * under h2o, which then ends it the way it ends one whose client left
 * (the write fails, or the read sees the end), and calls stop: rq_gone
 * frees q in the next loop round. Over HTTP/2 that ends the connection's
 * other streams too: libh2o 2.2 resets a single stream only through
 * http2_internal.h, which needs the khash.h its packages do not ship. */
static void
rq_stalled(h2o_timeout_entry_t *entry)
{
    swg_rq *q = (swg_rq *)((char *)entry - offsetof(swg_rq, stall));
    h2o_req_t *req = q->req;
    if (q->ended || req == NULL || !q->writing)
        return;
    __atomic_fetch_add(&q->lp->gw->stalled, 1, __ATOMIC_RELAXED);
    rq_log(q, 200, "client_stalled", q->lp->o->cancel_on_disconnect ? "cancelled" : NULL);
    if (q->lp->o->cancel_on_disconnect) {
        (void)sw_stream_cancel(q->s); /* the worker's handler sees it now */
        q->ended = 1;
    }
    swg_sock_abort(swg_req_socket(req));
}

/* A non-stream request over HTTP/1: h2o reads nothing more from the
 * connection until the answer is written, so a client that left would go
 * unnoticed until then and its stream would run to its end. Every
 * SWG_WATCH_MS the socket is peeked: end of file (or an error) is a client
 * that left. Bytes waiting (a pipelined request) say nothing: look again. */
static void
rq_watch(h2o_timeout_entry_t *entry)
{
    swg_rq *q = (swg_rq *)((char *)entry - offsetof(swg_rq, watch));
    h2o_socket_t *sock;
    char c;
    ssize_t n;
    if (q->ended || q->req == NULL)
        return;
    if ((sock = swg_req_socket(q->req)) == NULL)
        return;
    n = recv(h2o_socket_get_fd(sock), &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        /* The stream is cancelled (or, cancel-on-disconnect off, taken to
         * its end unanswered); the request gets a last answer, so that h2o
         * closes the connection and frees the request -- it would wait for
         * one for ever. */
        h2o_req_t *req = rq_take_req(q);
        rq_gone(q);
        h2o_send_error_generic(req, 499, "Client Closed Request", "client closed request\n",
                               H2O_SEND_ERROR_HTTP1_CLOSE_CONNECTION);
        return;
    }
    h2o_timeout_link(q->lp->ctx.loop, &q->lp->watch_timeout, &q->watch);
}

/* ---------------------------------------------------------------- start */

static const swg_model *
model_of(const swg_opts *o, const char *name)
{
    for (size_t i = 0; i < o->nmodels; i++)
        if (strcmp(o->models[i].name, name) == 0)
            return &o->models[i];
    return NULL;
}

/* A header's value, NUL-terminated in the request's pool, or NULL. */
static const char *
header(h2o_req_t *req, const char *name)
{
    ssize_t i = h2o_find_header_by_str(&req->headers, name, strlen(name), -1);
    if (i < 0)
        return NULL;
    return h2o_strdup(&req->pool, req->headers.entries[i].value.base,
                      req->headers.entries[i].value.len)
        .base;
}

/* 1 if rid is a request id we pass on and echo: 1 to cap-1 bytes of
 * printable ASCII, no space (it goes into a header, a log and a NATS
 * header). */
static int
request_id_ok(const char *rid, size_t cap)
{
    size_t n = strlen(rid);
    if (n == 0 || n >= cap)
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)rid[i] <= 0x20 || (unsigned char)rid[i] >= 0x7f)
            return 0;
    return 1;
}

void
swg_rq_start(swg_loop *lp, h2o_req_t *req)
{
    const swg_opts *o = lp->o;
    swg_rq *q = calloc(1, sizeof(*q));
    swg_error e;
    const swg_model *m;
    sw_request_opts ro;
    sw_header hdr[2];
    char traceparent[64];
    const char *tp, *rid;
    size_t nh = 0;
    sw_err rv;
    int64_t t0 = mono_ms();
    /* Every refusal below has its access-log line, written before the
     * answer goes out (as a stream's is before its last bytes). */
    if (q == NULL) {
        swg_log_refused(o, req, 503, "out_of_memory", NULL, t0);
        h2o_send_error_503(req, "Service Unavailable", "out of memory\n", 0);
        return;
    }
    if (req->entity.len > o->max_body) {
        /* h2o lets one byte more through (see swg_run) */
        swg_error_too_large(&e, o->max_body);
        swg_log_refused(o, req, e.http, e.code, NULL, t0);
        swg_send_error(req, &e);
        free(q);
        return;
    }
    if (swg_parse_request(req->entity.base ? req->entity.base : "", req->entity.len, &q->in, &e) !=
        0) {
        swg_log_refused(o, req, e.http, e.code, NULL, t0);
        swg_send_error(req, &e);
        free(q);
        return;
    }
    if ((m = model_of(o, q->in.model)) == NULL) {
        memset(&e, 0, sizeof(e));
        e.http = 404;
        e.type = "not_found_error";
        e.code = "model_not_found";
        e.param = "model";
        snprintf(e.message, sizeof(e.message), "the model '%.100s' does not exist (GET /v1/models)",
                 q->in.model);
        swg_log_refused(o, req, e.http, e.code, q->in.model, t0);
        swg_send_error(req, &e);
        swg_input_free(&q->in);
        free(q);
        return;
    }
    if (swg_conn_start(req, &q->conn) != 0) {
        memset(&e, 0, sizeof(e));
        e.http = 429;
        e.type = "rate_limit_error";
        e.code = "too_many_resets";
        snprintf(e.message, sizeof(e.message),
                 "this connection reset too many responses before their end; it is being closed");
        swg_log_refused(o, req, e.http, e.code, m->name, t0);
        swg_send_error(req, &e);
        swg_input_free(&q->in);
        free(q);
        return;
    }
    q->lp = lp;
    q->req = req;
    q->tok = h2o_mem_alloc_shared(&req->pool, sizeof(*q->tok), rq_on_dispose);
    q->tok->q = q;
    q->endpoint = m->endpoint;
    q->gen.proceed = rq_proceed;
    q->gen.stop = rq_stop;
    q->ka.cb = rq_keepalive;
    q->stall.cb = rq_stalled;
    q->watch.cb = rq_watch;
    q->r.model = m->name;
    q->r.created_at = (int64_t)time(NULL);
    q->r.input_tokens = q->in.input_tokens;
    q->r.metadata = q->in.metadata;
    q->t_start_ms = t0;
    /* W3C trace context: the client's if well formed (swi_trace_id: the
     * specification's parsing), else a new one, as the specification says
     * for a traceparent that does not parse. A later version is passed on
     * as version 00 of the same trace (its first 55 characters are 00's
     * fields; what follows is not ours to forward). */
    if ((tp = header(req, "traceparent")) == NULL || !swi_trace_id(tp, q->trace_id)) {
        uint8_t rnd[24];
        char hex[2 * sizeof(rnd) + 1];
        do {
            randombytes_buf(rnd, sizeof(rnd));
            swi_hex(hex, rnd, sizeof(rnd));
            snprintf(traceparent, sizeof(traceparent), "00-%.32s-%.16s-01", hex, hex + 32);
        } while (!swi_trace_id(traceparent, q->trace_id)); /* all zero: 2^-64 */
        tp = traceparent;
    } else if (tp[0] != '0' || tp[1] != '0') {
        snprintf(traceparent, sizeof(traceparent), "00-%.52s", tp + 3);
        tp = traceparent;
    }
    hdr[nh].key = "traceparent";
    hdr[nh++].value = tp;
    /* the client's request id if it is printable ASCII, else ours */
    if ((rid = header(req, "x-request-id")) != NULL && !request_id_ok(rid, sizeof(q->request_id)))
        rid = NULL;
    if (rid != NULL) {
        hdr[nh].key = "x-request-id";
        hdr[nh++].value = rid;
    }
    sw_request_opts_init(&ro);
    ro.endpoint = m->endpoint;
    ro.max_tokens = q->in.max_output_tokens;
    ro.headers = hdr;
    ro.nheaders = nh;
    ro.on_ready = swg_rq_on_ready;
    ro.on_ready_arg = q;
    h2o_linklist_insert(&lp->active, &q->active_link);
    rv = sw_router_open(&q->s, o->router, &ro, q->in.text, q->in.text_len);
    if (rv != SW_OK) {
        memset(&e, 0, sizeof(e));
        e.http = rv == SW_EBUSY ? 429 : 503;
        e.type = rv == SW_EBUSY ? "rate_limit_error" : "server_error";
        e.code = rv == SW_EBUSY ? "overloaded" : sw_err_name(rv);
        snprintf(e.message, sizeof(e.message), "%s", sw_strerror(rv));
        (void)rq_take_req(q);
        swg_log_refused(o, req, e.http, e.code, m->name, t0);
        swg_send_error(req, &e);
        swg_rq_free(q);
        return;
    }
    snprintf(q->r.id, sizeof(q->r.id), "resp_%s", sw_stream_request_id(q->s));
    snprintf(q->r.msg_id, sizeof(q->r.msg_id), "msg_%s", sw_stream_request_id(q->s));
    snprintf(q->request_id, sizeof(q->request_id), "%s", rid ? rid : q->r.id);
    pthread_mutex_lock(&lp->gw->mu); /* the cancel endpoint finds it from any loop */
    h2o_linklist_insert(&lp->gw->all, &q->all_link);
    pthread_mutex_unlock(&lp->gw->mu);
    if (q->in.stream) {
        req->res.status = 200;
        req->res.reason = "OK";
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL,
                       H2O_STRLIT("text/event-stream"));
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CACHE_CONTROL, NULL,
                       H2O_STRLIT("no-cache"));
        h2o_add_header_by_str(&req->pool, &req->res.headers, H2O_STRLIT("x-accel-buffering"), 0,
                              NULL, H2O_STRLIT("no"));
        h2o_add_header_by_str(&req->pool, &req->res.headers, H2O_STRLIT("x-request-id"), 0, NULL,
                              q->request_id, strlen(q->request_id));
        h2o_start_response(req, &q->gen);
        /* the headers go out now; proceed then pumps what is ready */
        rq_write_start(q);
        h2o_send(req, NULL, 0, H2O_SEND_STATE_IN_PROGRESS);
        return;
    }
    /* non-stream: the answer goes at the end. A client that leaves before is
     * noticed when h2o disposes the request (h2: stop is not called without
     * a started response), or, over HTTP/1, by rq_watch. */
    if (req->version < 0x200)
        h2o_timeout_link(lp->ctx.loop, &lp->watch_timeout, &q->watch);
    rq_pump(q, SWG_RUN_BUDGET);
}

int
swg_rq_cancel(swg_gw *gw, const char *id)
{
    int rc = -1;
    pthread_mutex_lock(&gw->mu);
    for (h2o_linklist_t *l = gw->all.next; l != &gw->all; l = l->next) {
        swg_rq *q = RQ_OF(l, all_link);
        if (strcmp(q->r.id, id) == 0) {
            /* its terminal comes through on_ready, on q's own loop */
            (void)sw_stream_cancel(q->s);
            rc = 0;
            break;
        }
    }
    pthread_mutex_unlock(&gw->mu);
    return rc;
}
