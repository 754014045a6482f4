/* gateway/http.c -- the HTTP server: libh2o's evloop (HTTP/1.1, and HTTP/2
 * with prior knowledge, h2c), one or more loop threads sharing the listening
 * socket; the routes; the wake-up pipe from library threads; the drain on
 * stop (the first loop sees the stop pipe and wakes the others).
 *
 * An upgrade to h2c from HTTP/1.1 is refused (h2c_upgraded).
 *
 * Routes: POST /v1/responses, POST /v1/responses/{id}/cancel,
 * GET /v1/models, GET /healthz, GET /readyz, GET /metrics, GET / (the
 * playground). Everything else is 404; a wrong method 405. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gateway/gw_int.h"

extern const char swg_playground_html[];

static int64_t
now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int
is(h2o_iovec_t v, const char *s)
{
    return h2o_memis(v.base, v.len, s, strlen(s));
}

static void
send_err(h2o_req_t *req, int http, const char *type, const char *code, const char *msg)
{
    swg_error e;
    memset(&e, 0, sizeof(e));
    e.http = http;
    e.type = type;
    e.code = code;
    snprintf(e.message, sizeof(e.message), "%s", msg);
    swg_send_error(req, &e);
}

/* ---------------------------------------------------------------- h2o's own errors */

/* h2o answers some requests itself before on_req sees them: a body over
 * its limit (413, plain text), broken chunked encoding (400), an Expect it
 * does not know (417), a bad header over h2c (400). This filter gives those
 * answers the shape of ours -- an OpenAI error object, application/json --
 * so that a client parses every error the same way. It sits on the host's
 * fallback path, where h2o's early answers go, and touches only those of
 * 400 and over whose type is text/plain. (A request line or headers h2o
 * cannot parse at all over HTTP/1.1 get a fixed answer written straight to
 * the socket, which no filter sees.) */
typedef struct errjson_os {
    h2o_ostream_t super;
    h2o_iovec_t body;
    int sent;
} errjson_os;

static void
errjson_send(h2o_ostream_t *self, h2o_req_t *req, h2o_iovec_t *bufs, size_t n, h2o_send_state_t st)
{
    errjson_os *os = (errjson_os *)self;
    (void)bufs;
    (void)n;
    if (!os->sent && os->body.len != 0) {
        os->sent = 1;
        h2o_ostream_send_next(self, req, &os->body, 1, st);
    } else {
        h2o_ostream_send_next(self, req, NULL, 0, st);
    }
}

/* 1 if req is to /v1/responses: its access-log line is written here for
 * an answer h2o gives itself (say, a 413 for a body far over --max-body),
 * since on_req never sees the request. h2o may not have normalized the
 * path yet: the request line's, without its query. */
static int
responses_path(h2o_req_t *req)
{
    h2o_iovec_t p = req->path_normalized.len != 0 ? req->path_normalized : req->input.path;
    const char *q = p.base != NULL ? memchr(p.base, '?', p.len) : NULL;
    if (q != NULL)
        p.len = (size_t)(q - p.base);
    return is(p, "/v1/responses");
}

typedef struct errjson_filter {
    h2o_filter_t super;
    const swg_opts *o;
} errjson_filter;

static void
errjson_setup(h2o_filter_t *self, h2o_req_t *req, h2o_ostream_t **slot)
{
    const swg_opts *o = ((errjson_filter *)self)->o;
    ssize_t i = h2o_find_header(&req->res.headers, H2O_TOKEN_CONTENT_TYPE, -1);
    int st = req->res.status;
    if (st >= 400 && i >= 0 &&
        h2o_memis(req->res.headers.entries[i].value.base,
                  req->res.headers.entries[i].value.len < 10 ? 0 : 10, "text/plain", 10)) {
        swg_error e;
        swg_buf b = {NULL, 0, 0, 0};
        errjson_os *os;
        memset(&e, 0, sizeof(e));
        e.http = st;
        e.type = st >= 500 ? "server_error" : "invalid_request_error";
        switch (st) {
        case 413:
            swg_error_too_large(&e, o->max_body);
            break;
        case 400:
            e.code = "bad_request";
            snprintf(e.message, sizeof(e.message), "the HTTP request could not be read (%s)",
                     req->res.reason != NULL ? req->res.reason : "invalid request");
            break;
        default:
            e.code = st >= 500 ? "server_error" : "http_error";
            snprintf(e.message, sizeof(e.message), "%s",
                     req->res.reason != NULL ? req->res.reason : "error");
            break;
        }
        if (responses_path(req))
            swg_log_refused(o, req, st, e.code, NULL, 0);
        swg_error_write(&b, &e);
        if (!b.oom) { /* h2o_add_ostream allocates from the pool: never NULL */
            os = (errjson_os *)h2o_add_ostream(req, sizeof(*os), slot);
            os->super.do_send = errjson_send;
            /* HEAD: the headers say what GET would get; no body */
            os->body = h2o_memis(req->input.method.base, req->input.method.len, H2O_STRLIT("HEAD"))
                           ? h2o_iovec_init(NULL, 0)
                           : h2o_strdup(&req->pool, b.p, b.len);
            os->sent = 0;
            req->res.content_length = b.len;
            req->res.headers.entries[i].value = h2o_iovec_init(H2O_STRLIT("application/json"));
            slot = &os->super.next;
        }
        swg_buf_free(&b);
    }
    h2o_setup_next_ostream(req, slot);
}

/* ---------------------------------------------------------------- request framing */

h2o_socket_t *
swg_req_socket(h2o_req_t *req)
{
    return req->conn->callbacks->get_socket != NULL ? req->conn->callbacks->get_socket(req->conn)
                                                    : NULL;
}

/* 1 if the header line at p (up to end) is the header `name` (lowercase):
 * h2o's parser took it, so its name is a token followed by ':' at once. */
static int
header_line_is(const char *p, const char *end, const char *name)
{
    size_t n = strlen(name);
    return (size_t)(end - p) > n && p[n] == ':' && strncasecmp(p, name, n) == 0;
}

/* HTTP/1.1 frames a request body by one Content-Length, or by
 * Transfer-Encoding. h2o 2.2 reads the body by the first Content-Length and
 * ignores any other (and a Content-Length next to Transfer-Encoding), and
 * keeps neither in req->headers; of two Transfer-Encodings it goes by the
 * last (400 unless it says "chunked"). A proxy in front that went by another one
 * sees the body end elsewhere: the bytes between the two ends are, to one
 * of them, the next request on the connection, which the other never saw
 * (request smuggling: RFC 9112 6.3 and 11.2 say to answer 400 and close).
 * A header line folded onto the previous one (obs-fold: it starts with a
 * space or a tab) is refused too, as RFC 9112 5.2 allows: h2o keeps the
 * first line's value ("Transfer-Encoding: chunked" folded with ", identity"
 * is read as chunked) and makes the rest a header without a name, where a
 * proxy that unfolds it reads another value.
 * So the header block is read again where h2o parsed it: in place, at the
 * start of the connection's input buffer, which keeps it until the response
 * is sent (h2o consumes a request before it parses the next). If the
 * buffer does not begin with this request's method (not HTTP/1, or an h2o
 * that keeps it elsewhere), nothing is said. Returns why the length is
 * ambiguous, or NULL. */
static const char *
length_ambiguous(h2o_req_t *req)
{
    h2o_socket_t *sock;
    const char *p, *end, *nl;
    unsigned ncl = 0, nte = 0;
    size_t mlen = req->input.method.len;
    if (req->version >= 0x200 || (sock = swg_req_socket(req)) == NULL || sock->input == NULL)
        return NULL;
    p = sock->input->bytes;
    end = p + sock->input->size;
    /* the parser skips one empty line before the request line */
    if (p < end && *p == '\r')
        p++;
    if (p < end && *p == '\n')
        p++;
    if ((size_t)(end - p) <= mlen || memcmp(p, req->input.method.base, mlen) != 0 || p[mlen] != ' ')
        return NULL;
    /* line by line (the parser ended each with LF or CRLF), up to the empty
     * line; the first is the request line */
    while ((nl = memchr(p, '\n', (size_t)(end - p))) != NULL) {
        p = nl + 1;
        if (p < end && (*p == '\n' || *p == '\r'))
            break; /* the empty line (a CR is only ever followed by LF) */
        if (p < end && (*p == ' ' || *p == '\t'))
            return "a header line of the request starts with a space or a tab (obs-fold, RFC 9112 "
                   "5.2): its headers, and its body's length, are ambiguous";
        if (header_line_is(p, end, "content-length"))
            ncl++;
        else if (header_line_is(p, end, "transfer-encoding"))
            nte++;
    }
    if (ncl > 1)
        return "the request has more than one Content-Length header: its body's length is "
               "ambiguous";
    if (nte > 1)
        return "the request has more than one Transfer-Encoding header: its body's length is "
               "ambiguous";
    if (ncl > 0 && nte > 0)
        return "the request has both Content-Length and Transfer-Encoding headers: its body's "
               "length is ambiguous";
    return NULL;
}

/* 1 if every model has a live instance in the registry. */
static int
models_ready(swg_loop *lp)
{
    if (lp->o->registry == NULL)
        return 1;
    for (size_t i = 0; i < lp->o->nmodels; i++) {
        sw_instance *v = NULL;
        size_t n = 0, live = 0;
        if (sw_registry_list(lp->o->registry, lp->o->models[i].endpoint, &v, &n) != SW_OK)
            return 0;
        for (size_t k = 0; k < n; k++)
            live += !v[k].draining;
        sw_instances_free(v, n);
        if (live == 0)
            return 0;
    }
    return 1;
}

/* 1 if req came through an h2c upgrade (RFC 7540 3.2: an HTTP/1.1 request
 * with Upgrade: h2c and HTTP2-Settings), or is a later request on such a
 * connection: the connection is marked and closed (below). libh2o 2.2
 * takes the upgrade itself -- its 101 has gone out before any handler runs
 * -- and hands the request on as HTTP/2 stream 1, past length_ambiguous,
 * with the bytes after the body h2o read (by the first Content-Length)
 * parsed as HTTP/2 frames: a request smuggled there was served. The
 * upgraded request is known by the HTTP2-Settings header it keeps, which a
 * client speaking HTTP/2 cannot send (a connection-specific header). Turning
 * h2o's upgrade off (http1.upgrade_to_http2) would turn prior knowledge
 * off with it in 2.2. */
static int h2c_upgraded(h2o_req_t *req);

static int
on_req(h2o_handler_t *self, h2o_req_t *req)
{
    /* the loop whose context serves this connection */
    swg_loop *lp = (swg_loop *)((char *)req->conn->ctx - offsetof(swg_loop, ctx));
    h2o_iovec_t p = req->path_normalized;
    int get = is(req->method, "GET") || is(req->method, "HEAD"), post = is(req->method, "POST");
    static const char pre[] = "/v1/responses/";
    const char *ambiguous;

    if ((ambiguous = length_ambiguous(req)) != NULL) {
        /* the bytes after the body h2o read must not be taken as a request */
        req->http1_is_persistent = 0;
        if (is(p, "/v1/responses"))
            swg_log_refused(lp->o, req, 400, "bad_request", NULL, 0);
        send_err(req, 400, "invalid_request_error", "bad_request", ambiguous);
        return 0;
    }
    if (h2c_upgraded(req)) {
        if (is(p, "/v1/responses"))
            swg_log_refused(lp->o, req, 400, "bad_request", NULL, 0);
        send_err(req, 400, "invalid_request_error", "bad_request",
                 "the gateway does not take an upgrade to h2c (Upgrade: h2c): use HTTP/1.1, or "
                 "HTTP/2 with prior knowledge; nothing more is served on this connection");
        return 0;
    }
    if (is(p, "/v1/responses")) {
        /* every request here has its access-log line: these two, and
         * swg_rq_start's */
        if (!post) {
            swg_log_refused(lp->o, req, 405, "method_not_allowed", NULL, 0);
            send_err(req, 405, "invalid_request_error", "method_not_allowed", "use POST");
        } else if (lp->draining) {
            swg_log_refused(lp->o, req, 503, "shutting_down", NULL, 0);
            send_err(req, 503, "server_error", "shutting_down", "the gateway is shutting down");
        } else {
            swg_rq_start(lp, req);
        }
        return 0;
    }
    if (p.len > sizeof(pre) - 1 && memcmp(p.base, pre, sizeof(pre) - 1) == 0 &&
        p.len > sizeof(pre) - 1 + 7 && memcmp(p.base + p.len - 7, "/cancel", 7) == 0) {
        char id[96];
        size_t n = p.len - (sizeof(pre) - 1) - 7;
        if (!post) {
            send_err(req, 405, "invalid_request_error", "method_not_allowed", "use POST");
            return 0;
        }
        if (n == 0 || n >= sizeof(id)) {
            send_err(req, 404, "not_found_error", "response_not_found", "no such response");
            return 0;
        }
        memcpy(id, p.base + sizeof(pre) - 1, n);
        id[n] = '\0';
        if (swg_rq_cancel(lp->gw, id) != 0)
            send_err(req, 404, "not_found_error", "response_not_found",
                     "no such response in progress");
        else
            swg_send_json(req, 200, "OK",
                          json_pack("{s:s, s:s, s:s}", "id", id, "object", "response", "status",
                                    "cancelled"));
        return 0;
    }
    if (!get) {
        /* 405 for a path that exists (GET only), 404 for any other */
        if (is(p, "/v1/models") || is(p, "/healthz") || is(p, "/readyz") || is(p, "/") ||
            (is(p, "/metrics") && lp->o->metrics != NULL))
            send_err(req, 405, "invalid_request_error", "method_not_allowed", "use GET");
        else
            send_err(req, 404, "not_found_error", "not_found", "no such path");
        return 0;
    }
    if (is(p, "/v1/models")) {
        json_t *data = json_array();
        for (size_t i = 0; i < lp->o->nmodels; i++)
            json_array_append_new(data,
                                  json_pack("{s:s, s:s, s:s, s:s}", "id", lp->o->models[i].name,
                                            "object", "model", "owned_by", "streamwire", "endpoint",
                                            lp->o->models[i].endpoint));
        swg_send_json(req, 200, "OK", json_pack("{s:s, s:o}", "object", "list", "data", data));
    } else if (is(p, "/healthz")) {
        swg_send_whole(req, 200, "OK", "text/plain", "ok\n", 3);
    } else if (is(p, "/readyz")) {
        int conn = sw_conn_status(lp->o->conn) == SW_CONN_CONNECTED;
        int ready = conn && !lp->draining && models_ready(lp);
        const char *why = !conn          ? "not ready: NATS is not connected\n"
                          : lp->draining ? "not ready: shutting down\n"
                          : !ready       ? "not ready: a model has no live instance\n"
                                         : "ready\n";
        swg_send_whole(req, ready ? 200 : 503, ready ? "OK" : "Service Unavailable", "text/plain",
                       why, strlen(why));
    } else if (is(p, "/metrics") && lp->o->metrics != NULL) {
        char *out = NULL;
        size_t len = 0;
        char *all = NULL;
        int n = -1;
        if (sw_metrics_render(lp->o->metrics, &out, &len) == SW_OK)
            n = asprintf(
                &all,
                "%.*s# HELP streamwire_gateway_sse_dropped_total SSE events this gateway "
                "shed because the client was behind (metrics items are shed first; "
                "tokens never).\n"
                "# TYPE streamwire_gateway_sse_dropped_total counter\n"
                "streamwire_gateway_sse_dropped_total{event=\"metrics\"} %llu\n"
                "# HELP streamwire_gateway_stalled_total Responses this gateway ended because "
                "the client took nothing of a write (the last one too) for --stall-ms.\n"
                "# TYPE streamwire_gateway_stalled_total counter\n"
                "streamwire_gateway_stalled_total %llu\n"
                "# HELP streamwire_gateway_rapid_reset_closed_total HTTP/2 connections this "
                "gateway closed because more than 200 of their responses' streams ran at once, "
                "most reset by the client (rapid reset).\n"
                "# TYPE streamwire_gateway_rapid_reset_closed_total counter\n"
                "streamwire_gateway_rapid_reset_closed_total %llu\n",
                (int)len, out,
                (unsigned long long)__atomic_load_n(&lp->gw->metrics_shed, __ATOMIC_RELAXED),
                (unsigned long long)__atomic_load_n(&lp->gw->stalled, __ATOMIC_RELAXED),
                (unsigned long long)__atomic_load_n(&lp->gw->reset_closed, __ATOMIC_RELAXED));
        if (n < 0)
            swg_send_whole(req, 500, "Internal Server Error", "text/plain", "out of memory\n", 14);
        else
            swg_send_whole(req, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", all,
                           (size_t)n);
        free(all);
        free(out);
    } else if (is(p, "/")) {
        swg_send_whole(req, 200, "OK", "text/html; charset=utf-8", swg_playground_html,
                       strlen(swg_playground_html));
    } else {
        send_err(req, 404, "not_found_error", "not_found", "no such path");
    }
    return 0;
}

/* ---------------------------------------------------------------- sockets */

#define SWG_ACCEPT_BATCH 256 /* connections accepted per readiness of the listener */

/* One open connection, on its loop's list (for the shutdown). Freed when
 * its socket closes, or, if responses it started are still running then
 * (their streams not ended), when the last of them is freed. */
struct swg_conn {
    h2o_socket_t *sock; /* NULL once closed */
    swg_loop *lp;
    h2o_linklist_t link; /* on lp->conns while open */
    unsigned unfinished; /* responses started whose stream has not ended (HTTP/2) */
    int reset_closed;    /* past SWG_UNFINISHED_MAX: shut down */
    int h2c_refused;     /* came through an h2c upgrade: nothing on it is served (on_req) */
};

static void
on_conn_close(void *data)
{
    swg_conn *c = data;
    swg_loop *lp = c->lp;
    __atomic_fetch_sub(&lp->gw->nconns, 1, __ATOMIC_RELAXED);
    h2o_linklist_unlink(&c->link);
    c->sock = NULL;
    if (c->unfinished == 0)
        free(c);
}

/* req's connection, found through its socket (whose on_close is ours:
 * h2o's server side leaves it to the application); NULL if none. */
static swg_conn *
conn_of(h2o_req_t *req)
{
    h2o_socket_t *sock = swg_req_socket(req);
    return sock != NULL && sock->on_close.cb == on_conn_close ? sock->on_close.data : NULL;
}

void
swg_sock_abort(h2o_socket_t *sock)
{
    struct linger lg = {1, 0};
    int fd;
    if (sock == NULL || (fd = h2o_socket_get_fd(sock)) < 0)
        return;
    (void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    (void)shutdown(fd, SHUT_RDWR);
}

static int
h2c_upgraded(h2o_req_t *req)
{
    swg_conn *c;
    int upgrade;
    if (req->version < 0x200)
        return 0;
    c = conn_of(req);
    upgrade = h2o_find_header(&req->headers, H2O_TOKEN_HTTP2_SETTINGS, -1) >= 0;
    if (!upgrade && (c == NULL || !c->h2c_refused))
        return 0;
    if (c != NULL && !c->h2c_refused) {
        c->h2c_refused = 1;
        /* h2o reads the end, and closes the connection once it has written
         * what it holds (the 400s) */
        if (c->sock != NULL)
            (void)shutdown(h2o_socket_get_fd(c->sock), SHUT_RD);
    }
    return 1;
}

int
swg_conn_start(h2o_req_t *req, swg_conn **out)
{
    swg_conn *c;
    swg_loop *lp;
    *out = NULL;
    if (req->version < 0x200 || (c = conn_of(req)) == NULL)
        return 0;
    if (c->reset_closed)
        return -1;
    if (c->unfinished < SWG_UNFINISHED_MAX) {
        c->unfinished++;
        *out = c;
        return 0;
    }
    lp = c->lp;
    c->reset_closed = 1;
    __atomic_fetch_add(&lp->gw->reset_closed, 1, __ATOMIC_RELAXED);
    if (!lp->o->quiet && now_ms() - lp->reset_warn_ms >= 10000) {
        lp->reset_warn_ms = now_ms();
        fprintf(stderr,
                "[gateway] warning: closing an HTTP/2 connection with %d responses started and "
                "not finished (reset by the client: rapid reset)\n",
                SWG_UNFINISHED_MAX);
    }
    /* h2o reads the end and closes the connection, stopping its other
     * responses (reset: what is unsent is dropped) */
    swg_sock_abort(c->sock);
    return -1;
}

void
swg_conn_finished(swg_conn *c)
{
    if (c == NULL)
        return;
    if (c->unfinished > 0)
        c->unfinished--;
    if (c->sock == NULL && c->unfinished == 0)
        free(c); /* closed before its last response ended */
}

/* No descriptor (or kernel memory) for the next connection: it stays in
 * the listen backlog, so the listener stays readable, and reading it again
 * at once would spin the loop at a full core until a descriptor frees up.
 * The listener rests until the next tick (100 ms, on_tick). */
static void
accept_pause(swg_loop *lp, int err)
{
    int64_t now = now_ms();
    h2o_socket_read_stop(lp->listener);
    lp->accept_paused = 1;
    if (!lp->o->quiet && now - lp->accept_warn_ms >= 10000) {
        lp->accept_warn_ms = now;
        fprintf(stderr,
                "[gateway] warning: cannot accept a connection: %s; new connections wait in the "
                "backlog (raise ulimit -n, or lower --max-connections)\n",
                strerror(err));
    }
}

static void
on_accept(h2o_socket_t *listener, const char *err)
{
    swg_loop *lp = listener->data;
    h2o_socket_t *sock;
    if (err != NULL)
        return;
    /* Everything waiting, up to SWG_ACCEPT_BATCH: one accept per loop round
     * put a burst's last connections behind many rounds of other streams'
     * tokens (the time to first token of a burst of 1,000 grew by ~100 ms). */
    for (int i = 0; i < SWG_ACCEPT_BATCH; i++) {
        errno = 0;
        if ((sock = h2o_evloop_socket_accept(listener)) == NULL) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                accept_pause(lp, errno);
            break;
        }
        unsigned n = __atomic_add_fetch(&lp->gw->nconns, 1, __ATOMIC_RELAXED);
        swg_conn *c = NULL;
        if ((lp->o->max_connections > 0 && n > lp->o->max_connections) ||
            (c = calloc(1, sizeof(*c))) == NULL) {
            __atomic_fetch_sub(&lp->gw->nconns, 1, __ATOMIC_RELAXED);
            h2o_socket_close(sock); /* over the limit (all loops): refused at once */
            continue;
        }
        c->sock = sock;
        c->lp = lp;
        h2o_linklist_insert(&lp->conns, &c->link);
        sock->on_close.cb = on_conn_close;
        sock->on_close.data = c;
        h2o_accept(&lp->accept_ctx, sock);
    }
}

/* Stop accepting; open streams get the grace period (on_tick). */
static void
drain_start(swg_loop *lp)
{
    lp->draining = 1;
    lp->drain_deadline = now_ms() + lp->o->grace_ms;
    lp->cancel_deadline = 0;
    if (lp->listener != NULL) {
        h2o_socket_read_stop(lp->listener);
        h2o_socket_close(lp->listener);
        lp->listener = NULL;
    }
}

/* Library threads (or the first loop, on stop) wrote to the wake pipe:
 * schedule every ready request. */
static void
on_wake(h2o_socket_t *sock, const char *err)
{
    swg_loop *lp = sock->data;
    swg_rq *list;
    char buf[256];
    (void)err;
    while (read(lp->wake_fd[0], buf, sizeof(buf)) > 0) {
    }
    pthread_mutex_lock(&lp->mu);
    list = lp->ready;
    lp->ready = NULL;
    lp->wake_pending = 0;
    /* on_ready pushes in front: reverse, and schedule in arrival order. Under
     * lp->mu: once queued is clear, on_ready may rewrite next_ready. */
    {
        swg_rq *rev = NULL;
        while (list != NULL) {
            swg_rq *n = list->next_ready;
            list->next_ready = rev;
            rev = list;
            list = n;
        }
        for (swg_rq *q = rev; q != NULL; q = q->next_ready) {
            q->queued = 0;
            swg_rq_schedule(q); /* pumped by swg_run_queue after this round's events */
        }
    }
    pthread_mutex_unlock(&lp->mu);
    /* h2o's own buffer of the socket holds nothing for us */
    h2o_buffer_consume(&sock->input, sock->input->size);
    if (!lp->draining && __atomic_load_n(&lp->gw->stopping, __ATOMIC_ACQUIRE))
        drain_start(lp);
}

/* The first loop's stop pipe: every loop drains. */
static void
on_stop(h2o_socket_t *sock, const char *err)
{
    swg_loop *lp = sock->data;
    swg_gw *gw = lp->gw;
    unsigned open = 0;
    (void)err;
    h2o_buffer_consume(&sock->input, sock->input->size);
    if (__atomic_exchange_n(&gw->stopping, 1, __ATOMIC_ACQ_REL))
        return;
    pthread_mutex_lock(&gw->mu);
    for (h2o_linklist_t *l = gw->all.next; l != &gw->all; l = l->next)
        open++;
    pthread_mutex_unlock(&gw->mu);
    if (!lp->o->quiet)
        fprintf(stderr, "[gateway] info: stopping: %u stream(s) open, grace %lld ms\n", open,
                (long long)lp->o->grace_ms);
    drain_start(lp);
    for (unsigned i = 1; i < gw->nloops; i++)
        swg_wake(&gw->loops[i]); /* they see gw->stopping in on_wake */
}

/* Every 100 ms: a listener paused for want of descriptors (accept_pause)
 * reads again; the drain's progress: it ends once nothing is open and no
 * last write is under way, or when its grace and the 2 s after the cancel
 * are over (a last write to a client that stopped reading ends sooner, by
 * --stall-ms). */
static void
on_tick(h2o_timeout_entry_t *entry)
{
    swg_loop *lp = (swg_loop *)((char *)entry - offsetof(swg_loop, tick));
    if (lp->accept_paused && lp->listener != NULL && !lp->draining) {
        lp->accept_paused = 0;
        h2o_socket_read_start(lp->listener, on_accept);
    }
    if (lp->draining) {
        int64_t now = now_ms();
        /* done when no request is open and every last write is out (the
         * terminal round of a stream that ended is still in h2o's hands) */
        if (h2o_linklist_is_empty(&lp->active) && lp->finals == 0)
            lp->quit = 1;
        else if (lp->cancel_deadline == 0 && now >= lp->drain_deadline) {
            /* grace over: cancel what is left; their terminals still go out */
            lp->cancel_deadline = now + 2000;
            for (h2o_linklist_t *l = lp->active.next; l != &lp->active; l = l->next) {
                swg_rq *q = H2O_STRUCT_FROM_MEMBER(swg_rq, active_link, l);
                if (q->s != NULL)
                    (void)sw_stream_cancel(q->s);
            }
        } else if (lp->cancel_deadline != 0 && now >= lp->cancel_deadline) {
            lp->quit = 1;
        }
    }
    h2o_timeout_link(lp->ctx.loop, &lp->tick_timeout, &lp->tick);
}

/* Resolves addr, binds and listens (port 0 picks one); the fd, or -1. */
static int
listen_on(const char *addr, char *actual, size_t cap)
{
    char host[128];
    const char *colon = strrchr(addr, ':');
    struct addrinfo hints, *ai = NULL;
    struct sockaddr_storage sa;
    socklen_t salen = sizeof(sa);
    int fd, one = 1;
    if (colon == NULL || colon == addr || (size_t)(colon - addr) >= sizeof(host)) {
        fprintf(stderr, "streamwire gateway: --listen: expected HOST:PORT, got '%s'\n", addr);
        return -1;
    }
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    if (getaddrinfo(host, colon + 1, &hints, &ai) != 0 || ai == NULL) {
        fprintf(stderr, "streamwire gateway: --listen: cannot resolve '%s'\n", addr);
        return -1;
    }
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &salen) != 0) {
        fprintf(stderr, "streamwire gateway: --listen %s: %s\n", addr, strerror(errno));
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        return -1;
    }
    freeaddrinfo(ai);
    snprintf(actual, cap, "%s:%d", host,
             ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                            : ((struct sockaddr_in *)&sa)->sin_port));
    return fd;
}

/* One loop's context, timers, wake pipe and listener (fd). */
static int
loop_init(swg_loop *lp, int fd)
{
    swg_gw *gw = lp->gw;
    const swg_opts *o = gw->o;
    int rfd;
    lp->o = o;
    if (pipe2(lp->wake_fd, O_CLOEXEC | O_NONBLOCK) != 0) {
        close(fd);
        return -1;
    }
    /* h2o gets its own descriptor of the read end: the pipe itself stays
     * open until every loop is joined (another loop may still wake this
     * one while it tears down) */
    if ((rfd = fcntl(lp->wake_fd[0], F_DUPFD_CLOEXEC, 0)) < 0) {
        close(lp->wake_fd[0]);
        close(lp->wake_fd[1]);
        close(fd);
        return -1;
    }
    h2o_context_init(&lp->ctx, h2o_evloop_create(), &gw->config);
    lp->accept_ctx.ctx = &lp->ctx;
    lp->accept_ctx.hosts = gw->config.hosts;
    h2o_timeout_init(lp->ctx.loop, &lp->ka_timeout,
                     (uint64_t)(o->keepalive_ms > 0 ? o->keepalive_ms : 1000));
    h2o_timeout_init(lp->ctx.loop, &lp->stall_timeout,
                     (uint64_t)(o->stall_ms > 0 ? o->stall_ms : 1000));
    h2o_timeout_init(lp->ctx.loop, &lp->fin_timeout,
                     (uint64_t)(o->stall_ms >= 4 ? o->stall_ms / 4 : 1));
    h2o_timeout_init(lp->ctx.loop, &lp->tick_timeout, 100);
    h2o_timeout_init(lp->ctx.loop, &lp->watch_timeout, SWG_WATCH_MS);
    h2o_timeout_init(lp->ctx.loop, &lp->run_timeout, 0);
    lp->run_entry.cb = swg_run_queue;
    lp->tick.cb = on_tick;
    h2o_timeout_link(lp->ctx.loop, &lp->tick_timeout, &lp->tick);
    lp->wake_sock = h2o_evloop_socket_create(lp->ctx.loop, rfd, 0);
    lp->wake_sock->data = lp;
    h2o_socket_read_start(lp->wake_sock, on_wake);
    if (lp->index == 0) {
        lp->stop_sock = h2o_evloop_socket_create(lp->ctx.loop, dup(o->stop_fd), 0);
        lp->stop_sock->data = lp;
        h2o_socket_read_start(lp->stop_sock, on_stop);
    }
    lp->listener = h2o_evloop_socket_create(lp->ctx.loop, fd, H2O_SOCKET_FLAG_DONT_READ);
    lp->listener->data = lp;
    h2o_socket_read_start(lp->listener, on_accept);
    return 0;
}

/* Runs one loop until its drain ends, then tears it down (on its thread). */
static void
loop_run(swg_loop *lp)
{
    while (!lp->quit) {
        h2o_evloop_run(lp->ctx.loop, 100);
        swg_run_next_round(lp);
    }
    /* Every connection still open (an idle keep-alive one, a client that
     * stopped reading) is shut down under h2o, which then closes it its own
     * way within a few rounds: its requests stop (rq_stop frees them) and
     * its timeouts are unlinked. h2o 2.2 has no call to close them, and
     * disposing a context with connections left asserts. */
    if (lp->listener != NULL) {
        h2o_socket_close(lp->listener);
        lp->listener = NULL;
    }
    for (h2o_linklist_t *l = lp->conns.next; l != &lp->conns; l = l->next)
        (void)shutdown(h2o_socket_get_fd(H2O_STRUCT_FROM_MEMBER(swg_conn, link, l)->sock),
                       SHUT_RDWR);
    for (int i = 0;
         i < 200 && !(h2o_linklist_is_empty(&lp->conns) && h2o_linklist_is_empty(&lp->active));
         i++) {
        h2o_evloop_run(lp->ctx.loop, 10);
        swg_run_next_round(lp);
    }
    /* what is still open has had its grace and its cancel: drop it */
    while (!h2o_linklist_is_empty(&lp->active)) {
        swg_rq *q = H2O_STRUCT_FROM_MEMBER(swg_rq, active_link, lp->active.next);
        if (q->s != NULL)
            (void)sw_stream_cancel(q->s);
        swg_rq_free(q);
    }
    if (h2o_timeout_is_linked(&lp->run_entry))
        h2o_timeout_unlink(&lp->run_entry);
    h2o_socket_close(lp->wake_sock);
    if (lp->stop_sock != NULL)
        h2o_socket_close(lp->stop_sock);
    if (h2o_timeout_is_linked(&lp->tick))
        h2o_timeout_unlink(&lp->tick);
    /* let closing sockets finish, then tear h2o down */
    for (int i = 0; i < 10; i++)
        h2o_evloop_run(lp->ctx.loop, 0);
    h2o_timeout_dispose(lp->ctx.loop, &lp->ka_timeout);
    h2o_timeout_dispose(lp->ctx.loop, &lp->stall_timeout);
    h2o_timeout_dispose(lp->ctx.loop, &lp->fin_timeout);
    h2o_timeout_dispose(lp->ctx.loop, &lp->tick_timeout);
    h2o_timeout_dispose(lp->ctx.loop, &lp->watch_timeout);
    h2o_timeout_dispose(lp->ctx.loop, &lp->run_timeout);
    {
        h2o_evloop_t *loop = lp->ctx.loop;
        /* h2o 2.2's dispose leaves the context's message queue (88 bytes)
         * behind, and destroying it afterwards crashes: tests/lsan.supp
         * names that one allocation. */
        h2o_context_dispose(&lp->ctx);
        h2o_evloop_destroy(loop);
    }
}

/* A loop thread. Its h2o state is made on the thread that runs it: h2o 2.2
 * recycles socket buffers through per-thread allocators, and a socket made
 * on one thread and read on another corrupts them. */
static void *
loop_main(void *arg)
{
    swg_loop *lp = arg;
    swg_gw *gw = lp->gw;
    int ok = loop_init(lp, lp->init_fd) == 0;
    pthread_mutex_lock(&gw->mu);
    lp->init = ok ? 1 : -1;
    pthread_cond_broadcast(&gw->init_cv);
    while (ok && gw->go == 0)
        pthread_cond_wait(&gw->init_cv, &gw->mu);
    if (ok && gw->go < 0)
        lp->quit = 1; /* another loop failed: tear down without running */
    pthread_mutex_unlock(&gw->mu);
    if (ok)
        loop_run(lp);
    return NULL;
}

/* How many loops: the option, else one per online CPU (at most 16). */
static unsigned
loops_wanted(const swg_opts *o)
{
    long n;
    if (o->loops > 0)
        return o->loops;
    n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 16 ? 16 : (unsigned)n;
}

int
swg_run(const swg_opts *o)
{
    swg_gw *gw = calloc(1, sizeof(*gw));
    h2o_hostconf_t *host;
    h2o_pathconf_t *path;
    h2o_handler_t *h;
    char actual[160];
    unsigned threads = 0, nloops;
    int rc = 0, lfd;
    if (gw == NULL)
        return -1;
    gw->o = o;
    gw->nloops = loops_wanted(o);
    if ((gw->loops = calloc(gw->nloops, sizeof(*gw->loops))) == NULL) {
        free(gw);
        return -1;
    }
    nloops = gw->nloops;
    pthread_mutex_init(&gw->mu, NULL);
    pthread_cond_init(&gw->init_cv, NULL);
    h2o_config_init(&gw->config);
    /* one byte over --max-body reaches swg_rq_start, which answers it; h2o
     * refuses bodies further over itself (a chunked body's limit there is
     * exclusive: max_body itself must pass) */
    gw->config.max_request_entity_size = o->max_body < SIZE_MAX ? o->max_body + 1 : SIZE_MAX;
    /* HTTP/1: from a connection's start (or its previous answer's end) to
     * the last byte of the next request's body. h2o closes a connection
     * over it with no answer (libh2o 2.2 tells no one). */
    if (o->request_timeout_ms > 0)
        gw->config.http1.req_timeout = (uint64_t)o->request_timeout_ms;
    host = h2o_config_register_host(&gw->config, h2o_iovec_init(H2O_STRLIT("default")), 65535);
    path = h2o_config_register_path(host, "/", 0);
    h = h2o_create_handler(path, sizeof(*h));
    h->on_req = on_req;
    /* h2o's own error answers: those to requests refused before they are
     * routed go through the host's fallback path (ours, on "/", are JSON
     * already, and /readyz's plain text stays so) */
    {
        errjson_filter *f = (errjson_filter *)h2o_create_filter(&host->fallback_path, sizeof(*f));
        f->super.on_setup_ostream = errjson_setup;
        f->o = o;
    }
    h2o_linklist_init_anchor(&gw->all);
    for (unsigned i = 0; i < gw->nloops; i++) {
        swg_loop *lp = &gw->loops[i];
        lp->gw = gw;
        lp->index = i;
        pthread_mutex_init(&lp->mu, NULL);
        h2o_linklist_init_anchor(&lp->active);
        h2o_linklist_init_anchor(&lp->conns);
        h2o_linklist_init_anchor(&lp->run[0]);
        h2o_linklist_init_anchor(&lp->run[1]);
    }
    /* The loops share one listening socket, each through its own
     * descriptor: a loop accepts when it is free to (an idle loop takes a
     * new connection first). Not SO_REUSEPORT: a second gateway on the
     * same port must fail, not take half the connections. */
    if ((lfd = listen_on(o->listen, actual, sizeof(actual))) < 0) {
        rc = -1;
        goto out;
    }
    for (unsigned i = 1; i < gw->nloops; i++) {
        swg_loop *lp = &gw->loops[i];
        if ((lp->init_fd = fcntl(lfd, F_DUPFD_CLOEXEC, 0)) < 0)
            break;
        if (pthread_create(&lp->thread, NULL, loop_main, lp) != 0) {
            close(lp->init_fd);
            break;
        }
        threads++; /* fewer loops than asked if a thread cannot start */
    }
    rc = loop_init(&gw->loops[0], lfd);
    pthread_mutex_lock(&gw->mu);
    for (unsigned i = 1; i <= threads; i++) {
        while (gw->loops[i].init == 0)
            pthread_cond_wait(&gw->init_cv, &gw->mu);
        if (gw->loops[i].init < 0)
            rc = -1;
    }
    gw->nloops = 1 + threads;
    gw->go = rc == 0 ? 1 : -1;
    pthread_cond_broadcast(&gw->init_cv);
    pthread_mutex_unlock(&gw->mu);
    if (rc == 0) {
        if (!o->quiet && gw->nloops > 1)
            fprintf(stderr, "[gateway] info: %u event loops\n", gw->nloops);
        if (o->on_ready != NULL)
            o->on_ready(actual, o->on_ready_arg);
        loop_run(&gw->loops[0]);
    } else if (gw->loops[0].wake_sock != NULL) {
        gw->loops[0].quit = 1; /* initialized: torn down without running */
        loop_run(&gw->loops[0]);
    }
    for (unsigned i = 1; i <= threads; i++)
        pthread_join(gw->loops[i].thread, NULL);
out:
    h2o_config_dispose(&gw->config);
    if (!o->quiet)
        fprintf(stderr, "[gateway] info: stopped\n");
    pthread_mutex_destroy(&gw->mu);
    pthread_cond_destroy(&gw->init_cv);
    for (unsigned i = 0; i < nloops; i++) {
        pthread_mutex_destroy(&gw->loops[i].mu);
        if (gw->loops[i].wake_sock != NULL) { /* loop_init made the pipe */
            close(gw->loops[i].wake_fd[0]);
            close(gw->loops[i].wake_fd[1]);
        }
    }
    free(gw->loops);
    free(gw);
    return rc;
}
