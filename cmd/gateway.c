/* cmd/gateway.c -- `streamwire gateway`: the HTTP front door (gateway/). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cli.h"
#include "gateway/gateway.h"

#define GW_MAX_MODELS 64

static void
gw_ready(const char *listen, void *arg)
{
    (void)arg;
    printf("gateway ready listen=%s\n", listen);
    fflush(stdout);
}

/* --model NAME=NS.COMPONENT.ENDPOINT, repeatable: collected by hand, since
 * the option table keeps one value per flag. Removes them from argv. */
static int
gw_take_models(int *argc, char **argv, swg_model *m, size_t *n)
{
    int w = 1;
    *n = 0;
    for (int i = 1; i < *argc; i++) {
        const char *v = NULL;
        if (strcmp(argv[i], "--model") == 0 && i + 1 < *argc)
            v = argv[++i];
        else if (strncmp(argv[i], "--model=", 8) == 0)
            v = argv[i] + 8;
        if (v == NULL) {
            argv[w++] = argv[i];
            continue;
        }
        {
            char *eq = strchr(v, '=');
            if (eq == NULL || eq == v || *n >= GW_MAX_MODELS ||
                sw_validate_endpoint(eq + 1) != SW_OK) {
                fprintf(stderr,
                        "streamwire gateway: --model: expected NAME=NS.COMPONENT.ENDPOINT, got "
                        "'%s'\n",
                        v);
                return -1;
            }
            *eq = '\0';
            m[*n].name = v;
            m[*n].endpoint = eq + 1;
            (*n)++;
        }
    }
    *argc = w;
    return 0;
}

int
cli_gateway_main(int argc, char **argv)
{
    const char *server = NULL, *listen_addr = "127.0.0.1:8080", *bucket = NULL;
    const char *policy = "round_robin", *cod = "on", *router_id = NULL, *access_log = "on";
    const char *narration = "on";
    long keepalive = 15000, stall = 30000, max_body = 1 << 20, max_conns = 10000, grace = 10000,
         replicas = 1, req_timeout = 10000;
    long migration_limit = 0, loops = 0;
    int quiet = 0, rc, wake[2];
    swg_model models[GW_MAX_MODELS];
    size_t nmodels = 0;
    const cli_opt opts[] = {
        {"server", CLI_STRING, "URL", "NATS server URL, e.g. nats://127.0.0.1:4222", &server, 0, 0,
         NULL, 1},
        {"listen", CLI_STRING, "HOST:PORT",
         "HTTP address (default 127.0.0.1:8080; port 0 picks one)", &listen_addr, 0, 0, NULL, 0},
        {"model", CLI_STRING, "NAME=NS.COMPONENT.ENDPOINT",
         "a model clients may ask for, served by that endpoint\n(repeat for more; at least one)",
         NULL, 0, 0, NULL, 0},
        {"bucket", CLI_STRING, "NAME", "registry bucket (default streamwire_instances)", &bucket, 0,
         0, NULL, 0},
        {"replicas", CLI_INT, "N", "copies of the registry bucket if the gateway creates it",
         &replicas, 1, 5, NULL, 0},
        {"policy", CLI_CHOICE, "round_robin|random|least_inflight", "instance selection", &policy,
         0, 0, "round_robin|random|least_inflight", 0},
        {"router-id", CLI_STRING, "ID", "this frontend's router id (default random)", &router_id, 0,
         0, NULL, 0},
        {"keepalive-ms", CLI_INT, "MS",
         "': keep-alive' comment after this much silence on an\nSSE stream (default 15000; 0 = "
         "never)",
         &keepalive, 0, 3600000, NULL, 0},
        {"stall-ms", CLI_INT, "MS",
         "a response whose client takes nothing of a write for\nthis long is ended: its stream "
         "cancelled, or its last\nwrite dropped (client_stalled; default 30000; 0 = never)",
         &stall, 0, 3600000, NULL, 0},
        {"max-body", CLI_INT, "BYTES", "largest request body (default 1048576): 413 beyond",
         &max_body, 1024, 64 * 1024 * 1024, NULL, 0},
        {"request-timeout-ms", CLI_INT, "MS",
         "HTTP/1.1: a request's headers and body must arrive within\nthis, from the connection's "
         "start or the previous\nanswer's end (also the idle keep-alive limit); the\nconnection "
         "is closed otherwise, unanswered (default\n10000; raise it with --max-body for slow "
         "uploads)",
         &req_timeout, 100, 3600000, NULL, 0},
        {"max-connections", CLI_INT, "N",
         "open HTTP connections at most (default 10000); more are\nclosed at once", &max_conns, 1,
         1000000, NULL, 0},
        {"cancel-on-disconnect", CLI_CHOICE, "on|off",
         "a client that leaves cancels its stream (default on)", &cod, 0, 0, "on|off", 0},
        {"narration", CLI_CHOICE, "on|off",
         "`narration` SSE events at the start, cancel and end of\neach stream, never one per "
         "token (default on)",
         &narration, 0, 0, "on|off", 0},
        {"grace-ms", CLI_INT, "MS",
         "on SIGTERM/SIGINT: stop accepting, let open streams\nfinish this long, then cancel "
         "them (default 10000)",
         &grace, 0, 3600000, NULL, 0},
        {"access-log", CLI_CHOICE, "on|off",
         "one JSON line per request to /v1/responses on stdout,\nrefused ones too: trace_id, "
         "response_id, model,\ninstance, status, terminal, reason, items, ttfi_ms,\n"
         "duration_ms (default on)",
         &access_log, 0, 0, "on|off", 0},
        {"migration-limit", CLI_INT, "N",
         "a stream whose worker dies, freezes or drains moves to\nanother instance, up to N "
         "times; the client sees one\ncontinuous response (default 0 = off; "
         "docs/MIGRATION.md)",
         &migration_limit, 0, SW_MAX_MIGRATIONS, NULL, 0},
        {"loops", CLI_INT, "N",
         "event-loop threads sharing the listening socket (a free\nloop accepts first); "
         "0 = one per online CPU, at most 16\n(default 0)",
         &loops, 0, 64, NULL, 0},
        {"quiet", CLI_FLAG, NULL, "no log lines on stderr", &quiet, 0, 0, NULL, 0},
    };
    cli_conn_flags conn_flags = {0};
    cli_opt conn_rows[CLI_CONN_NOPTS];
    const cli_cmd cmd = {
        "gateway",
        "HTTP front door: the OpenAI Responses API with server-sent events\n"
        "(POST /v1/responses, stream true or false), routed through the discovery\n"
        "registry to a live instance of each model's endpoint.",
        "Also: POST /v1/responses/{id}/cancel, GET /v1/models, /healthz, /readyz,\n"
        "/metrics (Prometheus) and / (a playground page). HTTP/1.1 and HTTP/2 (h2c with\n"
        "prior knowledge). Prints 'gateway ready listen=HOST:PORT' once accepting.\n"
        "docs/GATEWAY.md describes the events and status codes.",
        "Exit status: 0 after SIGTERM/SIGINT and the drain; 1 runtime error;\n"
        "2 usage error; 3 cannot connect to the NATS server.",
        opts,
        sizeof(opts) / sizeof(opts[0]),
        conn_rows,
        CLI_CONN_NOPTS,
    };
    sw_conn_opts copts;
    sw_registry_opts gopts;
    sw_router_opts ropts;
    sw_conn *conn = NULL;
    sw_registry *reg = NULL;
    sw_router *router = NULL;
    sw_metrics *metrics = NULL;
    swg_opts go;
    sw_err err;

    if (gw_take_models(&argc, argv, models, &nmodels) != 0)
        return CLI_EXIT_USAGE;
    cli_conn_rows(&conn_flags, conn_rows);
    rc = cli_parse(&cmd, argc, argv);
    if (rc != CLI_PARSE_OK)
        return rc == CLI_PARSE_HELP ? CLI_EXIT_OK : CLI_EXIT_USAGE;
    if ((rc = cli_conn_check(&cmd, &conn_flags)) != CLI_EXIT_OK)
        return rc;
    if ((rc = cli_check_names(&cmd, server, NULL, 0, NULL)) != CLI_EXIT_OK)
        return rc;
    if (nmodels == 0)
        return cli_usage_error(&cmd, "at least one --model NAME=NS.COMPONENT.ENDPOINT is needed");
    if (pipe(wake) != 0)
        return CLI_EXIT_FAIL;
    cli_catch_signals(wake[1]);

    sw_conn_opts_init(&copts);
    copts.url = server;
    copts.name = "streamwire-gateway";
    cli_conn_apply(&conn_flags, &copts);
    copts.log = quiet ? NULL : cli_log_stderr;
    copts.log_arg = (void *)"gateway";
    copts.max_reconnect = -1;
    if ((err = sw_conn_open(&conn, &copts)) != SW_OK) {
        cli_conn_error("gateway", server, &conn_flags, err);
        rc = CLI_EXIT_CONNECT;
        goto out;
    }
    sw_registry_opts_init(&gopts);
    if (bucket != NULL)
        gopts.bucket = bucket;
    gopts.replicas = (unsigned)replicas;
    gopts.log = quiet ? NULL : cli_log_stderr;
    gopts.log_arg = (void *)"gateway";
    if ((err = sw_registry_open(&reg, conn, &gopts)) != SW_OK) {
        cli_registry_error("gateway", "open the registry", err, "");
        rc = CLI_EXIT_FAIL;
        goto out;
    }
    sw_router_opts_init(&ropts);
    ropts.registry = reg;
    ropts.router_id = router_id;
    ropts.migration_limit = (int)migration_limit;
    (void)sw_policy_from_name(policy, &ropts.policy);
    ropts.log = quiet ? NULL : cli_log_stderr;
    ropts.log_arg = (void *)"gateway";
    if ((err = sw_router_create(&router, conn, &ropts)) != SW_OK ||
        (err = sw_metrics_create(&metrics)) != SW_OK ||
        (err = sw_metrics_add_router(metrics, router)) != SW_OK ||
        (err = sw_metrics_add_conn(metrics, conn)) != SW_OK ||
        (reg != NULL && (err = sw_metrics_add_registry(metrics, reg)) != SW_OK)) {
        fprintf(stderr, "streamwire gateway: %s (%s)\n", sw_strerror(err), sw_err_name(err));
        rc = CLI_EXIT_FAIL;
        goto out;
    }
    memset(&go, 0, sizeof(go));
    go.listen = listen_addr;
    go.models = models;
    go.nmodels = nmodels;
    go.conn = conn;
    go.router = router;
    go.registry = reg;
    go.metrics = metrics;
    go.keepalive_ms = keepalive;
    go.stall_ms = stall;
    go.max_body = (size_t)max_body;
    go.request_timeout_ms = req_timeout;
    go.max_connections = (unsigned)max_conns;
    {
        /* Each connection is a descriptor: raise the soft limit as far as
         * the hard one allows, and say so when it is still too low. */
        struct rlimit rl;
        rlim_t want = (rlim_t)max_conns + 256;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < want) {
            rl.rlim_cur = rl.rlim_max < want ? rl.rlim_max : want;
            (void)setrlimit(RLIMIT_NOFILE, &rl);
            if (rl.rlim_cur < want && !quiet)
                fprintf(stderr,
                        "streamwire gateway: warning: open files limited to %llu, below "
                        "--max-connections %ld + 256; connections beyond it wait in the listen "
                        "backlog until a descriptor frees up (raise ulimit -n)\n",
                        (unsigned long long)rl.rlim_cur, max_conns);
        }
    }
    go.cancel_on_disconnect = strcmp(cod, "on") == 0;
    go.narration = strcmp(narration, "on") == 0;
    go.grace_ms = grace;
    go.quiet = quiet;
    go.access_log = strcmp(access_log, "on") == 0;
    go.stop_fd = wake[0];
    go.loops = (unsigned)loops;
    go.on_ready = gw_ready;
    rc = swg_run(&go) == 0 ? CLI_EXIT_OK : CLI_EXIT_FAIL;
out:
    sw_metrics_destroy(metrics);
    sw_router_destroy(router);
    sw_registry_close(reg);
    sw_conn_close(conn);
    cli_catch_signals(-1);
    close(wake[0]);
    close(wake[1]);
    return rc;
}
