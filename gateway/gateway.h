/* gateway/gateway.h -- `streamwire gateway`: an HTTP front door (OpenAI
 * Responses API with server-sent events) on an embedded sw_router. Built on
 * egress only through the public API (blocking mode with on_ready
 * notifications), into the CLI; the library does not link it.
 *
 * Files: http.c (the h2o server, routes, the loops, drain), response.c (one
 * HTTP request's stream: notifications, events, backpressure, cancel),
 * events.c (the JSON of events and response objects, pure), request.c (the
 * request body: parse and validate, pure). Internal prefix swg_. */
#ifndef SW_GATEWAY_H
#define SW_GATEWAY_H

#include <stddef.h>
#include <stdint.h>

#include <streamwire/metrics.h>
#include <streamwire/registry.h>
#include <streamwire/streamwire.h>

typedef struct swg_model {
    const char *name;     /* what clients send as "model" */
    const char *endpoint; /* ns.component.endpoint */
} swg_model;

typedef struct swg_opts {
    const char *listen; /* HOST:PORT (port 0 picks one) */
    const swg_model *models;
    size_t nmodels;
    sw_conn *conn;
    sw_router *router;
    sw_registry *registry;      /* for /readyz; may be NULL */
    sw_metrics *metrics;        /* for /metrics; may be NULL */
    int64_t keepalive_ms;       /* ": keep-alive" after this much silence; 0 = never */
    int64_t stall_ms;           /* a stream's write the client has not taken for this long ends it
                                   (client_stalled); 0 = never */
    size_t max_body;            /* request body bytes */
    int64_t request_timeout_ms; /* HTTP/1: a request's headers and body arrive within this
                                   (h2o's http1 req_timeout); 0 = h2o's default, 10 s */
    unsigned max_connections;
    int cancel_on_disconnect;
    int narration;    /* `narration` events at start, cancel and end of a stream */
    int64_t grace_ms; /* on stop: how long open streams may finish */
    int quiet;
    int access_log; /* one JSON line per request to /v1/responses on stdout */
    int stop_fd;    /* readable: stop (the CLI's signal pipe) */
    unsigned loops; /* event-loop threads; 0 = one per online CPU (at most 16) */
    void (*on_ready)(const char *listen, void *arg); /* listening; may be NULL */
    void *on_ready_arg;
} swg_opts;

/* Runs the gateway until stop_fd becomes readable and the drain ends.
 * 0, or -1 (the reason printed to stderr). */
int swg_run(const swg_opts *o);

#endif
