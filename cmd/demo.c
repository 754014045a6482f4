/* cmd/demo.c -- `streamwire demo`: a live tour. Starts a nats-server (unless
 * --server), spawns worker processes with fault flags, and runs one stream
 * per terminal kind through the library, in-process. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "natsd.h"
#include <streamwire/registry.h>

#define DEMO_ENDPOINT "demo.engine.generate"
#define DEMO_POOL_ENDPOINT "demo.engine.pool"
/* The demo's own registry bucket: its chaos workers never show up in the
 * bucket real routers use, even with --server. */
#define DEMO_BUCKET "streamwire_demo"
#define DEMO_MAX_PAYLOAD 65536
#define DEMO_WORKER_FLAGS 6

enum {
    DW_OK,
    DW_SLOW,
    DW_FAIL,
    DW_HANG,
    DW_AFTER_FINAL,
    DW_GARBAGE,
    DW_GAP,
    DW_COUNT,
    DW_NOBODY = -1
};

typedef struct demo_worker {
    const char *endpoint;                     /* NULL = DEMO_ENDPOINT */
    const char *name;                         /* id prefix */
    const char *flags[DEMO_WORKER_FLAGS + 1]; /* extra worker flags, NULL-terminated */
    const char *desc;
    char id[SW_MAX_TOKEN + 1];
    char log[512];
    pid_t pid;
    int out_fd;
    int ready;
} demo_worker;

typedef struct demo_scenario {
    const char *title;
    int worker; /* W_*, or DW_NOBODY */
    uint32_t max_tokens;
    uint32_t deadline_ms; /* multiplied by swh_slow() */
    long cancel_after;
    int big_payload;
    sw_status want_status;
    const char *want_reason;
} demo_scenario;

typedef struct demo_outcome {
    int ok;
    char got[160];
    uint64_t items;
    int64_t ms;
} demo_outcome;

static void
demo_make_workers(demo_worker *w)
{
    static const demo_worker init[DW_COUNT] = {
        {NULL, "ok", {NULL}, "plain demo engine (16 tokens)", "", "", 0, -1, 0},
        {NULL,
         "slow",
         {"--tokens", "40", "--token-interval-ms", "50", NULL},
         "40 tokens, 50 ms apart",
         "",
         "",
         0,
         -1,
         0},
        {NULL, "fail", {"--fail-after", "4", NULL}, "--fail-after 4", "", "", 0, -1, 0},
        {NULL, "hang", {"--hang-after", "3", NULL}, "--hang-after 3", "", "", 0, -1, 0},
        {NULL,
         "after-final",
         {"--chaos", "after-final", NULL},
         "--chaos after-final",
         "",
         "",
         0,
         -1,
         0},
        {NULL, "garbage", {"--chaos", "garbage", NULL}, "--chaos garbage", "", "", 0, -1, 0},
        {NULL, "gap", {"--chaos", "gap", NULL}, "--chaos gap", "", "", 0, -1, 0},
    };
    static const demo_worker pool[2] = {
        {DEMO_POOL_ENDPOINT,
         "pool-a",
         {"--tokens", "60", "--token-interval-ms", "50", NULL},
         "60 tokens, 50 ms apart",
         "",
         "",
         0,
         -1,
         0},
        {DEMO_POOL_ENDPOINT,
         "pool-b",
         {"--tokens", "60", "--token-interval-ms", "50", NULL},
         "60 tokens, 50 ms apart",
         "",
         "",
         0,
         -1,
         0},
    };
    int i;

    for (i = 0; i < DW_COUNT + 2; i++) {
        w[i] = i < DW_COUNT ? init[i] : pool[i - DW_COUNT];
        snprintf(w[i].id, sizeof(w[i].id), "%s-%lx", w[i].name, (unsigned long)getpid());
    }
}

static const demo_scenario demo_scenarios[] = {
    {"completed stream", DW_OK, 0, 0, -1, 0, SW_STATUS_COMPLETED, "stop"},
    {"incomplete stream (max_tokens 5)", DW_OK, 5, 0, -1, 0, SW_STATUS_INCOMPLETE, "max_tokens"},
    {"failed stream (--fail-after 4)", DW_FAIL, 0, 0, -1, 0, SW_STATUS_FAILED, "engine_error"},
    {"cancelled stream (cancel after 3)", DW_SLOW, 0, 0, 3, 0, SW_STATUS_CANCELLED, "cancelled"},
    {"worker hangs (--hang-after 3)", DW_HANG, 0, 0, -1, 0, SW_STATUS_ERROR, "stream_incomplete"},
    {"item after final (--chaos)", DW_AFTER_FINAL, 0, 0, -1, 0, SW_STATUS_ERROR,
     "item_after_final"},
    {"garbage bytes (--chaos)", DW_GARBAGE, 0, 0, -1, 0, SW_STATUS_ERROR, "decode_error"},
    {"sequence gap (--chaos)", DW_GAP, 0, 0, -1, 0, SW_STATUS_ERROR, "sequence_gap"},
    {"unknown instance", DW_NOBODY, 0, 0, -1, 0, SW_STATUS_ERROR, "no_responders"},
    {"request over max payload", DW_OK, 0, 0, -1, 1, SW_STATUS_ERROR, "payload_too_large"},
    {"deadline 300 ms, slow worker", DW_SLOW, 0, 300, -1, 0, SW_STATUS_ERROR, "deadline_exceeded"},
};
#define DEMO_N (sizeof(demo_scenarios) / sizeof(demo_scenarios[0]))

static int
demo_self_exe(char *out, size_t cap)
{
    ssize_t n = readlink("/proc/self/exe", out, cap - 1);

    if (n <= 0)
        return -1;
    out[n] = '\0';
    return 0;
}

static int
demo_spawn_worker(demo_worker *w, const char *exe, const char *url, const char *dir, int verbose,
                  const cli_conn_flags *conn)
{
    const char *argv[20 + DEMO_WORKER_FLAGS + 2 * CLI_CONN_NOPTS];
    int argc = 0;
    int errfd = -1;
    int i;

    argv[argc++] = exe;
    argv[argc++] = "worker";
    argv[argc++] = "--server";
    argv[argc++] = url;
    argv[argc++] = "--endpoint";
    argv[argc++] = w->endpoint ? w->endpoint : DEMO_ENDPOINT;
    argv[argc++] = "--instance-id";
    argv[argc++] = w->id;
    argv[argc++] = "--drain-grace-ms";
    argv[argc++] = "1000";
    argv[argc++] = "--bucket";
    argv[argc++] = DEMO_BUCKET;
    for (i = 0; i < DEMO_WORKER_FLAGS && w->flags[i] != NULL; i++)
        argv[argc++] = w->flags[i];
    /* The same NATS credentials and TLS as the demo itself. */
    argc += (int)cli_conn_argv(conn, argv + argc, 2 * CLI_CONN_NOPTS);
    argv[argc] = NULL;

    if (!verbose) {
        snprintf(w->log, sizeof(w->log), "%s/worker-%s.log", dir, w->name);
        errfd = open(w->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (errfd < 0) {
            fprintf(stderr, "streamwire demo: cannot open %s: %s\n", w->log, strerror(errno));
            return -1;
        }
        fcntl(errfd, F_SETFD, FD_CLOEXEC);
    }
    w->pid = swh_spawn_path(exe, argv, &w->out_fd, errfd);
    if (errfd >= 0)
        close(errfd);
    if (w->pid < 0) {
        w->pid = 0;
        return -1;
    }
    return 0;
}

static void
demo_outcome_set(demo_outcome *o, const demo_scenario *sc, const cli_stream_result *res)
{
    o->items = res->items;
    o->ms = res->elapsed_ms;
    if (!res->got_terminal) {
        snprintf(o->got, sizeof(o->got), "%s",
                 res->reason[0] != '\0' ? res->reason : "no terminal");
        o->ok = 0;
        return;
    }
    snprintf(o->got, sizeof(o->got), "%s/%s", sw_status_name(res->status), res->reason);
    o->ok = res->status == sc->want_status && strcmp(res->reason, sc->want_reason) == 0;
}

static void
demo_run(sw_router *router, const demo_worker *workers, size_t max_payload, demo_outcome *out,
         int verbose)
{
    size_t big = 100 * 1024;
    char *payload;
    char nobody[SW_MAX_TOKEN + 1];
    size_t i;

    if (max_payload + 1024 > big)
        big = max_payload + 1024;
    payload = malloc(big);
    if (payload == NULL) {
        fprintf(stderr, "streamwire demo: out of memory\n");
        return;
    }
    memset(payload, 'x', big);
    snprintf(nobody, sizeof(nobody), "nobody-%lx", (unsigned long)getpid());

    for (i = 0; i < DEMO_N && !cli_signalled; i++) {
        const demo_scenario *sc = &demo_scenarios[i];
        cli_stream_req req;
        cli_stream_result res;
        sw_err err;

        printf("[%2zu/%zu] %-36s ... ", i + 1, DEMO_N, sc->title);
        fflush(stdout);
        memset(&req, 0, sizeof(req));
        req.endpoint = DEMO_ENDPOINT;
        req.instance_id = sc->worker == DW_NOBODY ? nobody : workers[sc->worker].id;
        req.max_tokens = sc->max_tokens;
        req.deadline_ms = sc->deadline_ms * (uint32_t)swh_slow();
        req.cancel_after = sc->cancel_after;
        req.give_up_ms = 20000LL * swh_slow();
        if (sc->big_payload) {
            req.payload = payload;
            req.len = big;
        } else {
            req.payload = "hello";
            req.len = 5;
        }
        err = cli_run_stream(router, &req, &res);
        if (err != SW_OK) {
            out[i].ok = 0;
            snprintf(out[i].got, sizeof(out[i].got), "open failed: %s", sw_err_name(err));
        } else {
            demo_outcome_set(&out[i], sc, &res);
            if (res.interrupted) {
                out[i].ok = 0;
                snprintf(out[i].got, sizeof(out[i].got), "interrupted");
            }
        }
        printf("%s  %s, %llu items, %lld ms\n", out[i].ok ? "ok  " : "FAIL", out[i].got,
               (unsigned long long)out[i].items, (long long)out[i].ms);
        if (!out[i].ok && !cli_signalled) {
            printf("        expected %s/%s", sw_status_name(sc->want_status), sc->want_reason);
            if (err == SW_OK && res.message[0] != '\0')
                printf("; message: %s", res.message);
            if (sc->worker != DW_NOBODY && !verbose)
                printf("; worker log: %s", workers[sc->worker].log);
            printf("\n");
        }
    }
    free(payload);
}

static void
demo_summary(const demo_outcome *out, size_t ran)
{
    size_t i, ok = 0;

    printf("\nSummary\n");
    printf("  %2s  %-36s %-30s %-30s %5s %6s\n", "#", "scenario", "expected terminal", "got",
           "items", "ms");
    for (i = 0; i < DEMO_N; i++) {
        const demo_scenario *sc = &demo_scenarios[i];
        char want[96];

        snprintf(want, sizeof(want), "%s/%s", sw_status_name(sc->want_status), sc->want_reason);
        if (i < ran)
            printf("  %2zu  %-36s %-30s %-30s %5llu %6lld  %s\n", i + 1, sc->title, want,
                   out[i].got, (unsigned long long)out[i].items, (long long)out[i].ms,
                   out[i].ok ? "ok" : "FAIL");
        else
            printf("  %2zu  %-36s %-30s %-30s %5s %6s  %s\n", i + 1, sc->title, want, "-", "-", "-",
                   "skipped");
        if (i < ran && out[i].ok)
            ok++;
    }
    printf("\n%zu/%zu scenarios ended in their expected terminal.\n", ok, DEMO_N);
}

/* Act 2: instance loss. Two registered workers, a stream to each routed
 * through the registry; one is SIGKILLed mid-stream. Shows its stream ending
 * with instance_lost, the registry dropping it, and traffic moving to the
 * survivor. Returns the number of failed checks. */
static int
demo_instance_loss(sw_conn *conn, const char *exe, const char *url, const char *dir, int verbose,
                   demo_worker pool[2], const cli_conn_flags *cf)
{
    sw_registry_opts gopts;
    sw_router_opts ropts;
    sw_registry *reg = NULL;
    sw_router *router = NULL;
    sw_stream *s[2] = {NULL, NULL};
    const sw_item *it;
    char line[512];
    int failed = 0, victim = -1, survivor, on_survivor = 0, listed = -1;
    int64_t t_kill = 0, t_term = 0, t_gone = -1;
    char lost_reason[64] = "none";
    sw_err err;

    printf("\nInstance loss: two workers registered in the discovery registry\n");
    for (int i = 0; i < 2; i++) {
        if (demo_spawn_worker(&pool[i], exe, url, dir, verbose, cf) != 0 ||
            swh_wait_line(pool[i].out_fd, "worker ready", line, sizeof(line), 10000 * swh_slow()) !=
                0) {
            printf("  worker %s did not start\n", pool[i].id);
            return 1;
        }
        pool[i].ready = 1;
    }
    sw_registry_opts_init(&gopts);
    gopts.bucket = DEMO_BUCKET;
    gopts.log = verbose ? cli_log_stderr : NULL;
    gopts.log_arg = (void *)"demo";
    if ((err = sw_registry_open(&reg, conn, &gopts)) != SW_OK) {
        printf("  cannot open the registry: %s\n", sw_err_name(err));
        return 1;
    }
    sw_router_opts_init(&ropts);
    ropts.registry = reg;
    ropts.log = verbose ? cli_log_stderr : NULL;
    ropts.log_arg = (void *)"demo";
    if ((err = sw_router_create(&router, conn, &ropts)) != SW_OK) {
        printf("  cannot create a router: %s\n", sw_err_name(err));
        sw_registry_close(reg);
        return 1;
    }
    for (int i = 0; i < 2; i++) {
        sw_request_opts q;
        sw_request_opts_init(&q);
        q.endpoint = DEMO_POOL_ENDPOINT; /* no instance id: the router picks */
        if (sw_router_open(&s[i], router, &q, "hello", 5) != SW_OK)
            failed++;
    }
    if (failed == 0) {
        printf("  [a] two streams, routed by the registry: %s and %s\n",
               sw_stream_instance_id(s[0]), sw_stream_instance_id(s[1]));
        for (int k = 0; k < 5; k++)
            (void)sw_stream_next(s[0], &it, 5000 * swh_slow());
        victim = strcmp(sw_stream_instance_id(s[0]), pool[0].id) == 0 ? 0 : 1;
        survivor = 1 - victim;
        t_kill = cli_now_ms();
        kill(pool[victim].pid, SIGKILL);
        printf("  [b] SIGKILL %s (pid %d) after 5 items of its stream\n", pool[victim].id,
               (int)pool[victim].pid);
        while (sw_stream_next(s[0], &it, 10000 * swh_slow()) == SW_OK) {
            if (it->kind == SW_ITEM_TERMINAL) {
                t_term = cli_now_ms();
                snprintf(lost_reason, sizeof(lost_reason), "%s/%s",
                         sw_status_name(it->terminal.status), it->terminal.reason);
                break;
            }
        }
        printf("  [c] its stream ended: %s, %lld ms after the kill %s\n", lost_reason,
               (long long)(t_term - t_kill),
               strcmp(lost_reason, "error/instance_lost") == 0 ? "ok" : "UNEXPECTED");
        failed += strcmp(lost_reason, "error/instance_lost") != 0;
        for (int64_t until = cli_now_ms() + 3000 * swh_slow(); cli_now_ms() < until;) {
            sw_instance *v = NULL;
            size_t n = 0, k;
            if (sw_registry_list(reg, DEMO_POOL_ENDPOINT, &v, &n) == SW_OK) {
                for (k = 0; k < n && strcmp(v[k].instance_id, pool[victim].id) != 0; k++)
                    ;
                listed = (int)n;
                sw_instances_free(v, n);
                if (k == n) {
                    t_gone = cli_now_ms() - t_kill;
                    break;
                }
            }
            cli_sleep_ms(20);
        }
        printf("  [d] registry: %s %s (%d live instance%s left) %s\n", pool[victim].id,
               t_gone >= 0 ? "reported dead and dropped" : "still listed", listed,
               listed == 1 ? "" : "s", t_gone >= 0 ? "ok" : "UNEXPECTED");
        failed += t_gone < 0;
        for (int k = 0; k < 10; k++) {
            sw_request_opts q;
            sw_stream *t = NULL;
            sw_request_opts_init(&q);
            q.endpoint = DEMO_POOL_ENDPOINT;
            q.max_tokens = 2;
            if (sw_router_open(&t, router, &q, "hi", 2) == SW_OK) {
                while (sw_stream_next(t, &it, 10000 * swh_slow()) == SW_OK) {
                    if (it->kind == SW_ITEM_TERMINAL) {
                        on_survivor += it->terminal.status == SW_STATUS_INCOMPLETE &&
                                       strcmp(it->instance_id, pool[survivor].id) == 0;
                        break;
                    }
                }
            }
            sw_stream_close(t);
        }
        printf("  [e] next 10 requests: %d/10 served by the survivor %s %s\n", on_survivor,
               pool[survivor].id, on_survivor == 10 ? "ok" : "UNEXPECTED");
        failed += on_survivor != 10;
        {
            int items = 0, completed = 0;
            while (sw_stream_next(s[1], &it, 10000 * swh_slow()) == SW_OK) {
                if (it->kind == SW_ITEM_TERMINAL) {
                    completed = it->terminal.status == SW_STATUS_COMPLETED;
                    break;
                }
                items++;
            }
            printf("  [f] the other stream went on: %s after %d more items %s\n",
                   completed ? "completed" : "not completed", items,
                   completed ? "ok" : "UNEXPECTED");
            failed += !completed;
        }
    }
    sw_stream_close(s[0]);
    sw_stream_close(s[1]);
    sw_router_destroy(router);
    sw_registry_close(reg);
    if (victim >= 0) {
        int st;
        (void)swh_wait_exit(pool[victim].pid, 5000, &st);
        pool[victim].pid = 0; /* reaped: not a worker to stop cleanly */
    }
    return failed;
}

int
cli_demo_main(int argc, char **argv)
{
    const char *server = NULL;
    int keep = 0, verbose = 0;
    const cli_opt opts[] = {
        {"server", CLI_STRING, "URL",
         "use this NATS server instead of starting one\n(the payload scenario then sends "
         "max_payload + 1 KiB)",
         &server, 0, 0, NULL, 0},
        {"keep", CLI_FLAG, NULL, "keep the temp dirs (server store and log, worker logs)", &keep, 0,
         0, NULL, 0},
        {"verbose", CLI_FLAG, NULL, "worker and library logs on stderr instead of log files",
         &verbose, 0, 0, NULL, 0},
    };
    cli_conn_flags conn_flags = {0};
    cli_opt conn_rows[CLI_CONN_NOPTS];
    const cli_cmd cmd = {
        "demo",
        "Live demo: starts a nats-server (JetStream on, free port, temp dir, max_payload\n"
        "64 KiB) unless --server, starts worker processes with fault flags, and runs one\n"
        "stream per terminal kind: completed, incomplete, failed, cancelled, and the\n"
        "synthesized errors stream_incomplete, item_after_final, decode_error,\n"
        "sequence_gap, no_responders, payload_too_large, deadline_exceeded.",
        "Everything it starts is stopped at the end and its temp dirs are removed\n"
        "(unless --keep). nats-server is found as in the tests: $SW_NATS_SERVER, else\n"
        "nats-server on PATH, else /usr/sbin/nats-server. SW_SLOW=1 widens timings.",
        "Exit status: 0 when every scenario ended in its expected terminal and every\n"
        "worker exited cleanly; 1 otherwise; 2 usage error; 3 cannot start or reach\n"
        "the NATS server.",
        opts,
        sizeof(opts) / sizeof(opts[0]),
        conn_rows,
        CLI_CONN_NOPTS,
    };
    demo_worker workers[DW_COUNT + 2];
    demo_outcome out[DEMO_N];
    int loss_failed = -1;
    swh_nats nats;
    char exe[1024], dir[256] = "", line[512];
    const char *url;
    sw_conn_opts copts;
    sw_router_opts ropts;
    sw_conn *conn = NULL;
    sw_router *router = NULL;
    sw_err err;
    size_t ran = 0, i;
    int rc, all_ok = 1, nready = 0;
    int64_t t0 = cli_now_ms();

    cli_conn_rows(&conn_flags, conn_rows);
    rc = cli_parse(&cmd, argc, argv);
    if (rc != CLI_PARSE_OK)
        return rc == CLI_PARSE_HELP ? CLI_EXIT_OK : CLI_EXIT_USAGE;
    if ((rc = cli_conn_check(&cmd, &conn_flags)) != CLI_EXIT_OK)
        return rc;
    if (server != NULL && server[0] == '\0')
        return cli_usage_error(&cmd, "--server: empty URL");

    memset(&nats, 0, sizeof(nats));
    memset(out, 0, sizeof(out));
    demo_make_workers(workers);
    cli_catch_signals(-1);

    printf("streamwire %s demo: one stream per terminal kind over a real NATS server\n\n",
           sw_version());
    if (demo_self_exe(exe, sizeof(exe)) != 0) {
        fprintf(stderr, "streamwire demo: cannot find my own executable: %s\n", strerror(errno));
        return CLI_EXIT_FAIL;
    }
    if (swh_mkdtemp(dir, sizeof(dir), "swdemo") != 0)
        return CLI_EXIT_FAIL;

    if (server == NULL) {
        char conf[64];

        snprintf(conf, sizeof(conf), "max_payload: %d\n", DEMO_MAX_PAYLOAD);
        if (swh_nats_start(&nats, conf) != 0) {
            fprintf(stderr, "streamwire demo: could not start a nats-server (use --server URL "
                            "to use an existing one)\n");
            rc = CLI_EXIT_CONNECT;
            goto cleanup;
        }
        url = nats.url;
        printf("nats-server  %s (pid %d, JetStream on, max_payload 64 KiB)\n", url, (int)nats.pid);
    } else {
        url = server;
        printf("nats-server  %s (given with --server)\n", url);
    }

    sw_conn_opts_init(&copts);
    copts.url = url;
    copts.name = "streamwire-demo";
    cli_conn_apply(&conn_flags, &copts);
    copts.log = verbose ? cli_log_stderr : NULL;
    copts.log_arg = (void *)"demo";
    err = sw_conn_open(&conn, &copts);
    if (err != SW_OK) {
        cli_conn_error("demo", url, &conn_flags, err);
        rc = CLI_EXIT_CONNECT;
        goto cleanup;
    }

    for (i = 0; i < DW_COUNT; i++) {
        if (demo_spawn_worker(&workers[i], exe, url, dir, verbose, &conn_flags) != 0) {
            rc = CLI_EXIT_FAIL;
            goto cleanup;
        }
    }
    for (i = 0; i < DW_COUNT; i++) {
        int r = swh_wait_line(workers[i].out_fd, "worker ready", line, sizeof(line),
                              10000 * swh_slow());

        if (r != 0) {
            fprintf(stderr, "streamwire demo: worker %s did not become ready (%s)%s%s\n",
                    workers[i].id, r == -1 ? "timeout" : "it exited",
                    verbose ? "" : "; its log: ", verbose ? "" : workers[i].log);
            rc = CLI_EXIT_FAIL;
            goto cleanup;
        }
        workers[i].ready = 1;
        nready++;
    }
    printf("workers      %d on endpoint %s:\n", nready, DEMO_ENDPOINT);
    for (i = 0; i < DW_COUNT; i++)
        printf("             %-22s %s\n", workers[i].id, workers[i].desc);
    printf("\n");

    sw_router_opts_init(&ropts);
    ropts.heartbeat_ms = 100;
    ropts.inactivity_ms = 1000 * (unsigned)swh_slow();
    ropts.final_linger_ms = 50 * (unsigned)swh_slow();
    ropts.log = verbose ? cli_log_stderr : NULL;
    ropts.log_arg = (void *)"demo";
    err = sw_router_create(&router, conn, &ropts);
    if (err != SW_OK) {
        fprintf(stderr, "streamwire demo: cannot create a router: %s (%s)\n", sw_strerror(err),
                sw_err_name(err));
        rc = CLI_EXIT_FAIL;
        goto cleanup;
    }

    demo_run(router, workers, sw_conn_max_payload(conn), out, verbose);
    if (!cli_signalled)
        loss_failed =
            demo_instance_loss(conn, exe, url, dir, verbose, &workers[DW_COUNT], &conn_flags);
    for (ran = 0; ran < DEMO_N && (out[ran].got[0] != '\0'); ran++)
        ;
    for (i = 0; i < DEMO_N; i++) {
        if (i >= ran || !out[i].ok)
            all_ok = 0;
    }
    demo_summary(out, ran);
    if (loss_failed == 0)
        printf("Instance loss: instance_lost at once, registry updated, traffic moved. ok\n");
    else
        all_ok = 0;
    rc = all_ok ? CLI_EXIT_OK : CLI_EXIT_FAIL;
    if (cli_signalled) {
        printf("interrupted\n");
        rc = CLI_EXIT_FAIL;
    }

cleanup:
    sw_router_destroy(router);
    sw_conn_close(conn);
    {
        int clean = 1;

        for (i = 0; i < DW_COUNT + 2; i++) {
            int st;

            if (workers[i].pid <= 0) {
                if (workers[i].out_fd >= 0)
                    close(workers[i].out_fd);
                continue;
            }
            st = swh_terminate(workers[i].pid, 5000 * swh_slow());
            if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                clean = 0;
                if (st != -1 && WIFSIGNALED(st))
                    fprintf(stderr, "streamwire demo: worker %s died by signal %d\n", workers[i].id,
                            WTERMSIG(st));
                else if (st != -1)
                    fprintf(stderr, "streamwire demo: worker %s exited with status %d\n",
                            workers[i].id, WEXITSTATUS(st));
                else
                    fprintf(stderr, "streamwire demo: worker %s could not be reaped\n",
                            workers[i].id);
            }
            if (workers[i].out_fd >= 0)
                close(workers[i].out_fd);
        }
        if (!clean && rc == CLI_EXIT_OK)
            rc = CLI_EXIT_FAIL;
        if (keep) {
            swh_nats_stop_keep(&nats);
            printf("kept: %s (worker logs)%s%s\n", dir, nats.dir[0] != '\0' ? ", " : "", nats.dir);
        } else {
            swh_nats_stop(&nats);
            swh_rmtree(dir);
        }
        printf("cleaned up: %d workers %s, %s; %lld ms in all\n", nready,
               clean ? "stopped cleanly" : "stopped (see above)",
               server == NULL ? "nats-server stopped" : "server left as it was",
               (long long)(cli_now_ms() - t0));
    }
    return rc;
}
