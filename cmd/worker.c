/* cmd/worker.c -- `streamwire worker`: serves an endpoint with the demo
 * engine (token-0, token-1, ...) and optional fault injection. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cli.h"
#include "ingress/chaos.h"
#include <streamwire/registry.h>

enum worker_chaos { CHAOS_NONE = 0, CHAOS_AFTER_FINAL, CHAOS_GARBAGE, CHAOS_GAP, CHAOS_NO_FINAL };

typedef struct worker_cfg {
    long tokens;
    long interval_ms;
    long crash_after; /* -1 = off */
    long hang_after;
    long fail_after;
    long metrics_every; /* 0 = off */
    int refuse;
    int chaos;
    int quiet;
} worker_cfg;

static void
worker_note(const worker_cfg *cfg, sw_responder *r, const char *what, long k)
{
    char msg[256];

    if (cfg->quiet)
        return;
    snprintf(msg, sizeof(msg), "request %s: %s after %ld items", sw_responder_request_id(r), what,
             k);
    cli_log_stderr("worker", SW_LOG_INFO, msg);
}

/* Sleeps ms in slices of at most 10 ms; returns 1 as soon as the stream is
 * cancelled (frontend cancel, frontend gone, deadline passed). */
static int
worker_sleep(sw_responder *r, long ms)
{
    int64_t end = cli_now_ms() + ms;

    for (;;) {
        int64_t left;

        if (sw_responder_cancelled(r))
            return 1;
        left = end - cli_now_ms();
        if (left <= 0)
            return 0;
        cli_sleep_ms(left < 10 ? left : 10);
    }
}

/* --refuse: the answer is a refusal, streamed as "refusal" items (one
 * per word, the spaces kept), and the stream completes. */
static void
worker_refuse(const worker_cfg *cfg, sw_responder *r)
{
    static const char *const words[] = {"I'm ",   "sorry, ", "but ",  "I ",
                                        "can't ", "help ",   "with ", "that."};
    sw_err err;
    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++) {
        if (i > 0 && cfg->interval_ms > 0 && worker_sleep(r, cfg->interval_ms))
            return;
        err = sw_responder_send_event(r, "refusal", words[i], strlen(words[i]), 0);
        if (err == SW_ECANCELLED || err == SW_ECLOSED)
            return;
        if (err != SW_OK) {
            sw_responder_fail(r, "send_failed", sw_strerror(err));
            return;
        }
    }
    err = sw_responder_finish(r, SW_STATUS_COMPLETED, "stop");
    if (err != SW_OK && err != SW_ECLOSED && !cfg->quiet)
        fprintf(stderr, "[worker] warn: finish: %s\n", sw_err_name(err));
}

/* Where a migrated request continues (docs/MIGRATION.md): after the items
 * the consumer has (resume_from), or, like an LLM given its own output as
 * prompt, after the tokens the prompt already holds ("token-K" words). */
static long
worker_start(sw_responder *r)
{
    uint64_t resume = sw_responder_resume_from(r);
    size_t len = 0;
    const char *p = sw_responder_payload(r, &len);
    long n = 0;
    if (resume > 0)
        return (long)(resume - 1);
    for (size_t i = 0; p != NULL && i + 6 <= len; i++)
        if (memcmp(p + i, "token-", 6) == 0)
            n++;
    return n;
}

static void
worker_handler(sw_responder *r, void *arg)
{
    static const unsigned char garbage[] = {0xff, 0xff, 0xff, 0xff, 0x0f, 0xde,
                                            0xad, 0xbe, 0xef, 0x00, 0x01};
    const worker_cfg *cfg = arg;
    uint32_t max_tokens = sw_responder_max_tokens(r);
    long total = cfg->tokens;
    int limited = 0;
    long sent = worker_start(r);
    sw_err err;

    if (sent > total)
        sent = total;
    if (max_tokens != 0 && (long)max_tokens < total - sent) {
        total = sent + (long)max_tokens;
        limited = 1;
    }
    if (cfg->refuse) {
        worker_refuse(cfg, r);
        return;
    }
    for (;;) {
        char buf[32];
        int len;

        /* Faults fire once exactly `sent` items have gone out. */
        if (cfg->crash_after == sent) {
            worker_note(cfg, r, "crashing (abort) as asked by --crash-after", sent);
            fflush(stderr);
            abort();
        }
        if (cfg->hang_after == sent) {
            worker_note(cfg, r, "hanging (abandoned: no items, heartbeats or final)", sent);
            swx_responder_abandon(r);
            return;
        }
        if (cfg->fail_after == sent) {
            char msg[96];

            snprintf(msg, sizeof(msg), "injected failure after %ld items", sent);
            err = sw_responder_fail(r, "engine_error", msg);
            if (err != SW_OK && err != SW_ECLOSED && !cfg->quiet)
                fprintf(stderr, "[worker] warn: fail: %s\n", sw_err_name(err));
            return;
        }
        if (sent == total)
            break;
        if (sent == total / 2 && cfg->chaos == CHAOS_GARBAGE) {
            worker_note(cfg, r, "publishing garbage bytes (--chaos garbage)", sent);
            err = swx_responder_publish_raw(r, garbage, sizeof(garbage));
            if (err != SW_OK && !cfg->quiet)
                fprintf(stderr, "[worker] warn: publish_raw: %s\n", sw_err_name(err));
        }
        if (sent == total / 2 && cfg->chaos == CHAOS_GAP) {
            worker_note(cfg, r, "skipping a sequence number (--chaos gap)", sent);
            err = swx_responder_skip_seq(r);
            if (err != SW_OK && !cfg->quiet)
                fprintf(stderr, "[worker] warn: skip_seq: %s\n", sw_err_name(err));
        }
        if (sent > 0 && cfg->interval_ms > 0 && worker_sleep(r, cfg->interval_ms))
            return; /* cancelled: the library sends the CANCELLED terminal */
        len = snprintf(buf, sizeof(buf), "token-%ld", sent);
        err = sw_responder_send(r, buf, (size_t)len);
        if (err == SW_ECANCELLED || err == SW_ECLOSED)
            return;
        if (err != SW_OK) {
            if (!cfg->quiet)
                fprintf(stderr, "[worker] warn: request %s: send: %s\n", sw_responder_request_id(r),
                        sw_err_name(err));
            sw_responder_fail(r, "send_failed", sw_strerror(err));
            return;
        }
        sent++;
        if (cfg->metrics_every > 0 && sent % cfg->metrics_every == 0) {
            /* droppable: shed when the frontend is out of credit */
            len = snprintf(buf, sizeof(buf), "{\"tokens\":%ld}", sent);
            err = sw_responder_send_event(r, "metrics", buf, (size_t)len, SW_SEND_DROPPABLE);
            if (err == SW_ECANCELLED || err == SW_ECLOSED)
                return;
        }
    }
    if (cfg->chaos == CHAOS_NO_FINAL) {
        worker_note(cfg, r, "ending without a final marker (--chaos no-final)", sent);
        swx_responder_abandon(r);
        return;
    }
    if (limited)
        err = sw_responder_finish(r, SW_STATUS_INCOMPLETE, "max_tokens");
    else
        err = sw_responder_finish(r, SW_STATUS_COMPLETED, "stop");
    if (err != SW_OK) {
        if (err != SW_ECLOSED && !cfg->quiet)
            fprintf(stderr, "[worker] warn: finish: %s\n", sw_err_name(err));
        return;
    }
    if (cfg->chaos == CHAOS_AFTER_FINAL) {
        worker_note(cfg, r, "sending an item after the final (--chaos after-final)", sent);
        err = swx_responder_send_after_final(r, "token-extra", 11);
        if (err != SW_OK && !cfg->quiet)
            fprintf(stderr, "[worker] warn: send_after_final: %s\n", sw_err_name(err));
    }
}

static int
worker_chaos_kind(const char *s)
{
    if (s == NULL)
        return CHAOS_NONE;
    if (strcmp(s, "after-final") == 0)
        return CHAOS_AFTER_FINAL;
    if (strcmp(s, "garbage") == 0)
        return CHAOS_GARBAGE;
    if (strcmp(s, "gap") == 0)
        return CHAOS_GAP;
    return CHAOS_NO_FINAL;
}

/* The connection closed for good: wake the main loop (nats.c thread). */
static void
worker_on_conn_state(sw_conn *conn, sw_conn_state state, void *arg)
{
    (void)conn;
    if (state == SW_CONN_CLOSED) {
        char c = 'c';
        ssize_t w = write(*(int *)arg, &c, 1);
        (void)w;
    }
}

int
cli_worker_main(int argc, char **argv)
{
    const char *server = NULL, *endpoint = NULL, *instance = NULL, *chaos = NULL;
    long tokens = 16, interval = 0, crash = -1, hang = -1, fail = -1;
    long max_inflight = 0, threads = 0, grace = 5000, send_timeout = 0, lease = 0, max_age = 0;
    long max_reconnect = -1, replicas = 1, metrics_every = 0;
    int refuse = 0;
    const char *registry = "nats-kv", *bucket = NULL, *metrics_listen = NULL;
    sw_metrics *metrics = NULL;
    char conn_name[96];
    cli_metrics_http *mhttp = NULL;
    int quiet = 0;
    const cli_opt opts[] = {
        {"server", CLI_STRING, "URL", "NATS server URL, e.g. nats://127.0.0.1:4222", &server, 0, 0,
         NULL, 1},
        {"endpoint", CLI_STRING, "NS.COMPONENT.ENDPOINT",
         "endpoint to serve: three tokens of [A-Za-z0-9_-]", &endpoint, 0, 0, NULL, 1},
        {"instance-id", CLI_STRING, "ID",
         "this instance's id (1..64 chars of [A-Za-z0-9_-]);\ndefault: 16 random hex chars",
         &instance, 0, 0, NULL, 0},
        {"tokens", CLI_INT, "N", "items per request: token-0 .. token-<N-1> (default 16)", &tokens,
         0, 100000000, NULL, 0},
        {"token-interval-ms", CLI_INT, "MS", "pause between items (default 0)", &interval, 0,
         3600000, NULL, 0},
        {"crash-after", CLI_INT, "K", "fault: abort() the process after sending K items", &crash, 0,
         100000000, NULL, 0},
        {"hang-after", CLI_INT, "K",
         "fault: after K items send nothing more for that stream\n(no items, heartbeats or "
         "final); the worker stays alive",
         &hang, 0, 100000000, NULL, 0},
        {"fail-after", CLI_INT, "K",
         "fault: after K items fail the stream with app code\nengine_error", &fail, 0, 100000000,
         NULL, 0},
        {"refuse", CLI_FLAG, NULL,
         "answer every request with a refusal: \"refusal\" items\n(\"I'm sorry, but I can't help "
         "with that.\",\none per word), then completed",
         &refuse, 0, 0, NULL, 0},
        {"metrics-every", CLI_INT, "N",
         "after every N tokens send a droppable \"metrics\" item\n{\"tokens\":K} (shed when the "
         "frontend is out of\ncredit; default 0 = none)",
         &metrics_every, 0, 100000000, NULL, 0},
        {"chaos", CLI_CHOICE, "after-final|garbage|gap|no-final",
         "protocol fault: after-final = an item after the final;\ngarbage = undecodable bytes "
         "mid-stream; gap = skip a\nsequence number mid-stream; no-final = all items but no\n"
         "final marker",
         &chaos, 0, 0, "after-final|garbage|gap|no-final", 0},
        {"max-inflight", CLI_INT, "N",
         "live streams before requests get an overloaded\nterminal (default: library's, 64)",
         &max_inflight, 0, 1000000, NULL, 0},
        {"threads", CLI_INT, "N", "handler threads (default: library's, 4)", &threads, 0, 1024,
         NULL, 0},
        {"send-timeout-ms", CLI_INT, "MS",
         "how long a send waits for credit (default: library's,\n30000)", &send_timeout, 0, 3600000,
         NULL, 0},
        {"max-request-age-ms", CLI_INT, "MS",
         "refuse a request issued longer ago than this by its\nsender's clock (a replay; needs "
         "clocks that agree;\nat most 600000; default 0 = no limit)",
         &max_age, 0, 600000, NULL, 0},
        {"drain-grace-ms", CLI_INT, "MS",
         "on SIGTERM/SIGINT, how long in-flight streams may\nfinish before they are cancelled "
         "(default 5000)",
         &grace, 0, 3600000, NULL, 0},
        {"registry", CLI_CHOICE, "nats-kv|none",
         "register in the discovery registry (JetStream KV,\nneeds nats-server -js) so routers "
         "find this\ninstance; none = direct requests only (default nats-kv)",
         &registry, 0, 0, "nats-kv|none", 0},
        {"bucket", CLI_STRING, "NAME", "registry bucket (default streamwire_instances)", &bucket, 0,
         0, NULL, 0},
        {"replicas", CLI_INT, "N",
         "copies of the registry bucket if this worker creates it\n(3 in a JetStream cluster; "
         "default 1)",
         &replicas, 1, 5, NULL, 0},
        {"lease-ms", CLI_INT, "MS",
         "registry lease: routers count the instance dead when it\nis not refreshed for this "
         "long (default 3000)",
         &lease, 100, 3600000, NULL, 0},
        {"max-reconnect", CLI_INT, "N",
         "reconnect attempts after the server is lost; -1 = no\nlimit (default: a worker in a "
         "cluster outlives a NATS\nrestart); 0 = none. When they run out the worker exits 3",
         &max_reconnect, -1, 1000000000, NULL, 0},
        {"metrics-listen", CLI_STRING, "HOST:PORT",
         "serve Prometheus metrics at http://HOST:PORT/metrics\n(port 0 picks one; the line "
         "'worker metrics url=...'\nsays which)",
         &metrics_listen, 0, 0, NULL, 0},
        {"quiet", CLI_FLAG, NULL, "no log lines on stderr", &quiet, 0, 0, NULL, 0},
    };
    cli_conn_flags conn_flags = {0};
    cli_opt conn_rows[CLI_CONN_NOPTS];
    const cli_cmd cmd = {
        "worker",
        "Serve an endpoint with the demo engine: every request gets --tokens items\n"
        "(token-0, token-1, ...), then a COMPLETED terminal (reason stop), or INCOMPLETE\n"
        "(reason max_tokens) when the request's max_tokens is smaller. A migrated\n"
        "request continues where its consumer is: after resume_from_seq - 1 items, or\n"
        "after the token-K words its prompt holds (a rebuilt prompt); max_tokens then\n"
        "counts from there.",
        "Once serving, prints one line to stdout:\n"
        "  worker ready instance=<id> endpoint=<endpoint> subject=<request subject>\n"
        "Logs go to stderr as \"[worker] level: message\" unless --quiet. SIGTERM or\n"
        "SIGINT drains (the registry entry is marked draining, no new requests,\n"
        "in-flight streams get --drain-grace-ms to finish), deregisters and exits 0.",
        "Exit status: 0 after a drain, 1 runtime error, 2 usage error, 3 cannot connect\n"
        "(at start, or the connection closed for good: --max-reconnect ran out).",
        opts,
        sizeof(opts) / sizeof(opts[0]),
        conn_rows,
        CLI_CONN_NOPTS,
    };
    worker_cfg cfg;
    sw_conn_opts copts;
    sw_ingress_opts iopts;
    sw_conn *conn = NULL;
    sw_ingress *ing = NULL;
    sw_registry *reg = NULL;
    sw_err err;
    int wake[2];
    int rc;

    cli_conn_rows(&conn_flags, conn_rows);
    rc = cli_parse(&cmd, argc, argv);
    if (rc != CLI_PARSE_OK)
        return rc == CLI_PARSE_HELP ? CLI_EXIT_OK : CLI_EXIT_USAGE;
    if ((rc = cli_conn_check(&cmd, &conn_flags)) != CLI_EXIT_OK)
        return rc;
    if ((rc = cli_check_names(&cmd, server, endpoint, 1, instance)) != CLI_EXIT_OK)
        return rc;
    if (metrics_listen != NULL && !cli_metrics_addr_ok(metrics_listen))
        return cli_usage_error(
            &cmd, "--metrics-listen: expected HOST:PORT (port 0..65535), got '%s'", metrics_listen);

    memset(&cfg, 0, sizeof(cfg));
    cfg.tokens = tokens;
    cfg.interval_ms = interval;
    cfg.crash_after = crash;
    cfg.hang_after = hang;
    cfg.fail_after = fail;
    cfg.metrics_every = metrics_every;
    cfg.refuse = refuse;
    cfg.chaos = worker_chaos_kind(chaos);
    cfg.quiet = quiet;
    if (crash >= 0) {
        /* An injected crash should not leave a core file behind. */
        struct rlimit rl = {0, 0};
        setrlimit(RLIMIT_CORE, &rl);
    }

    if (pipe(wake) != 0) {
        fprintf(stderr, "streamwire worker: pipe: %s\n", strerror(errno));
        return CLI_EXIT_FAIL;
    }
    fcntl(wake[0], F_SETFD, FD_CLOEXEC);
    fcntl(wake[1], F_SETFD, FD_CLOEXEC);
    fcntl(wake[1], F_SETFL, O_NONBLOCK);
    cli_catch_signals(wake[1]);

    sw_conn_opts_init(&copts);
    copts.url = server;
    /* The server's connz names the instance (the cluster tests look it up). */
    snprintf(conn_name, sizeof(conn_name), "streamwire-worker%s%s", instance ? "-" : "",
             instance ? instance : "");
    copts.name = conn_name;
    cli_conn_apply(&conn_flags, &copts);
    copts.log = quiet ? NULL : cli_log_stderr;
    copts.log_arg = (void *)"worker";
    copts.max_reconnect = max_reconnect == 0 ? SW_RECONNECT_NONE : (int)max_reconnect;
    copts.on_state = worker_on_conn_state;
    copts.on_state_arg = &wake[1];
    err = sw_conn_open(&conn, &copts);
    if (err != SW_OK) {
        cli_conn_error("worker", server, &conn_flags, err);
        rc = CLI_EXIT_CONNECT;
        goto out;
    }

    sw_ingress_opts_init(&iopts);
    iopts.endpoint = endpoint;
    iopts.instance_id = instance;
    iopts.handler = worker_handler;
    iopts.handler_arg = &cfg;
    iopts.max_inflight = (unsigned)max_inflight;
    iopts.handler_threads = (unsigned)threads;
    iopts.send_timeout_ms = (unsigned)send_timeout;
    iopts.max_request_age_ms = max_age;
    iopts.log = quiet ? NULL : cli_log_stderr;
    iopts.log_arg = (void *)"worker";
    err = sw_ingress_start(&ing, conn, &iopts);
    if (err != SW_OK) {
        fprintf(stderr, "streamwire worker: cannot serve %s: %s (%s)\n", endpoint, sw_strerror(err),
                sw_err_name(err));
        rc = CLI_EXIT_FAIL;
        goto out;
    }
    /* Listening first: a worker that cannot serve its metrics exits
     * before it registers (an entry left behind would outlive it). */
    if (metrics_listen != NULL &&
        (sw_metrics_create(&metrics) != SW_OK || sw_metrics_add_conn(metrics, conn) != SW_OK ||
         sw_metrics_add_ingress(metrics, ing) != SW_OK ||
         cli_metrics_http_start(&mhttp, metrics_listen, metrics) != 0)) {
        rc = CLI_EXIT_FAIL;
        goto out;
    }
    if (strcmp(registry, "none") != 0) {
        sw_registry_opts ropts;
        sw_registry_opts_init(&ropts);
        ropts.backend = registry;
        if (bucket != NULL)
            ropts.bucket = bucket;
        ropts.lease_ms = lease;
        ropts.replicas = (unsigned)replicas;
        ropts.log = quiet ? NULL : cli_log_stderr;
        ropts.log_arg = (void *)"worker";
        err = sw_registry_open(&reg, conn, &ropts);
        if (err == SW_OK) {
            sw_registration rg;
            err = sw_ingress_registration(ing, &rg);
            if (err == SW_OK)
                err = sw_registry_register(reg, &rg);
        }
        if (err != SW_OK) {
            char what[64];
            snprintf(what, sizeof(what), "register in the %s registry", registry);
            cli_registry_error("worker", what, err, " --registry none serves without it");
            rc = CLI_EXIT_FAIL;
            goto out;
        }
    }
    if (metrics != NULL) {
        if (reg != NULL && sw_metrics_add_registry(metrics, reg) != SW_OK) {
            (void)sw_registry_deregister(reg, sw_ingress_instance_id(ing));
            rc = CLI_EXIT_FAIL;
            goto out;
        }
        printf("worker metrics url=http://%.*s:%d/metrics\n",
               (int)(strrchr(metrics_listen, ':') - metrics_listen), metrics_listen,
               cli_metrics_http_port(mhttp));
    }
    printf("worker ready instance=%s endpoint=%s subject=%s\n", sw_ingress_instance_id(ing),
           sw_ingress_endpoint(ing), sw_ingress_request_subject(ing));
    fflush(stdout);

    while (!cli_signalled && sw_conn_status(conn) != SW_CONN_CLOSED) {
        char c;
        ssize_t r = read(wake[0], &c, 1);

        if (r < 0 && errno != EINTR)
            break;
    }
    if (!cli_signalled && sw_conn_status(conn) == SW_CONN_CLOSED) {
        if (max_reconnect == 0)
            fprintf(stderr, "streamwire worker: the NATS server is lost (--max-reconnect 0: no "
                            "reconnect); exiting\n");
        else
            fprintf(stderr,
                    "streamwire worker: the connection to the NATS server closed for good "
                    "(%llu reconnect(s), --max-reconnect %ld ran out); exiting\n",
                    (unsigned long long)sw_conn_reconnects(conn), max_reconnect);
        rc = CLI_EXIT_CONNECT;
        goto out;
    }

    if (!quiet)
        fprintf(stderr, "[worker] info: signal received: draining (grace %ld ms)\n", grace);
    if (reg != NULL)
        (void)sw_registry_set_draining(reg, sw_ingress_instance_id(ing));
    err = sw_ingress_drain(ing, grace);
    if (reg != NULL) {
        sw_err derr = sw_registry_deregister(reg, sw_ingress_instance_id(ing));
        if (!quiet)
            fprintf(stderr, "[worker] info: deregistered from the registry: %s\n",
                    sw_err_name(derr));
    }
    if (!quiet) {
        sw_ingress_stats st;

        sw_ingress_stats_get(ing, &st);
        fprintf(stderr,
                "[worker] info: drained (%s): %llu requests, %llu items in %llu messages, "
                "%llu resent, %llu heartbeats, %llu cancels; "
                "terminals: completed %llu, incomplete %llu, failed %llu, cancelled %llu, "
                "error %llu\n",
                err == SW_OK ? "all streams finished" : "some streams were cancelled",
                (unsigned long long)st.requests, (unsigned long long)st.items_sent,
                (unsigned long long)st.messages_sent, (unsigned long long)st.items_resent,
                (unsigned long long)st.heartbeats, (unsigned long long)st.cancels,
                (unsigned long long)st.finished[1], (unsigned long long)st.finished[2],
                (unsigned long long)st.finished[3], (unsigned long long)st.finished[4],
                (unsigned long long)st.finished[5]);
    }
    rc = CLI_EXIT_OK;

out:
    cli_metrics_http_stop(mhttp); /* before the objects it renders */
    sw_metrics_destroy(metrics);
    sw_registry_close(reg);
    sw_ingress_destroy(ing);
    sw_conn_close(conn);
    cli_catch_signals(-1);
    close(wake[0]);
    close(wake[1]);
    return rc;
}
