/* bench/main.c -- streamwire-bench: options, --help, the scenario table and
 * the loop that runs it. Main thread only (the scenarios start their own
 * threads).
 *
 * Threads and locks: Main thread only (the scenarios start their own threads). */
#include "bench.h"

const char *g_url;
char g_cmdline[1024];
char g_load_start[64], g_load_end[64];
bench_cfg cfg;

/* ------------------------------------------------------------------ scenarios */

/* The scenarios, in the order of the report. --only selects entries by name;
 * --help prints name and help. Entries marked early run before all others
 * (their baselines are cleanest before the throughput runs have grown the
 * heap: the idle RSS, the slow consumers' peak frontend RSS), in table order;
 * their rows still appear at their place in the report. */
typedef struct scenario {
    const char *name;
    void (*fn)(void);
    int early;
    const char *help; /* --help lines after the name, each ending in \n */
} scenario;

static const scenario scenarios[] = {
    {"long", scen_long, 0,
     "1 stream x N items of 64 B and 1 KiB: items/s, MB/s; also a blocking\n"
     "           consumer and the credit cost (default window vs window 1<<20)\n"},
    {"short", scen_short, 0,
     "many short streams of 10 items at concurrency 1, 64, 1024: streams/s\n"
     "           (the raw baseline subscribes to a fresh inbox per request; both\n"
     "           sides run with send-asap on and off, each row takes the better)\n"},
    {"latency", scen_latency, 0, "per-item latency at a fixed rate: p50, p99, p99.9\n"},
    {"ttfi", scen_ttfi, 0, "time to first item: p50, p99\n"},
    {"sealed", scen_sealed, 0,
     "issue 13: the same runs sealed (a cluster key) against unsealed, alternating:\n"
     "           long 64 B and 1 KiB, short streams at c=64, latency p99, CPU/item\n"},
    {"idle", scen_idle, 1, "idle open streams at the frontend: RSS per stream, idle CPU\n"},
    {"loss", scen_loss, 0,
     "issue 4: SIGKILL / SIGSTOP of a worker (child process) mid-stream ->\n"
     "           terminal at the consumer; dead report -> another router stops\n"
     "           routing there; requests routed to the dead instance after the report\n"},
    {"migration", scen_migration, 0,
     "issue 15: SIGKILL of the worker serving a stream that may migrate ->\n"
     "           the first item from the new instance (20 trials)\n"},
    {"cancel", scen_cancel, 0,
     "issue 5: sw_stream_cancel -> the handler's cancel callback; SIGKILL of\n"
     "           a frontend (child process) -> the worker cancels its stream\n"},
    {"cli", scen_cli, 0,
     "issue 17: the CLI end to end, `streamwire worker --tokens N` -> `streamwire\n"
     "           generate` (two processes), against raw nats.c of 8 B items: items/s\n"},
    {"slow", scen_slow, 1,
     "issue 5: many concurrent streams to slow consumers: peak frontend RSS\n"
     "           against the credit-window bound, peak pending, loss, nats.c drops\n"},
};
#define NSCEN (sizeof(scenarios) / sizeof(scenarios[0]))

/* ------------------------------------------------------------------ options */

static void
usage(FILE *f)
{
    fprintf(f, "usage: streamwire-bench [options]\n"
               "\n"
               "Measures streamwire against hand-written nats.c on the same nats-server, in\n"
               "one run, and prints a table (raw, streamwire, streamwire/raw).\n"
               "\n"
               "Scenarios (--only takes a comma list of these names):\n");
    for (size_t i = 0; i < NSCEN; i++)
        fprintf(f, "  %-8s %s", scenarios[i].name, scenarios[i].help);
    fprintf(
        f, "\n"
           "Options:\n"
           "  --server URL        use this nats-server instead of starting one\n"
           "  --server-pid PID    with --server: that server's process, whose CPU and memory\n"
           "                      are measured (without it the server rows show -)\n"
           "  --nats-server PATH  nats-server binary to start (default: $SW_NATS_SERVER, else\n"
           "                      nats-server on PATH); it runs with -js -a 127.0.0.1\n"
           "                      -p <free port> -sd <tmp dir>/js (support/natsd.c)\n"
           "  --json FILE         also write the results as JSON\n"
           "  --quick             small sizes, a few seconds (CI smoke; never assert figures)\n"
           "  --only LIST         run only these scenarios (default: all)\n"
           "  --reps N            repetitions of long/short, median reported (default 3; quick 1)\n"
           "  --items N           items in the long stream (default 100000)\n"
           "  --sizes LIST        item sizes for the long stream (default 64,1024)\n"
           "  --concurrency LIST  short-stream concurrencies (default 1,64,1024)\n"
           "  --short-items N     items per short stream (default 10)\n"
           "  --short-secs S      duration of one short-stream run (default 2)\n"
           "  --rate R            latency scenario rate, items/s (default 2000)\n"
           "  --latency-secs S    latency scenario duration per side (default 5)\n"
           "  --latency-segments N  raw and streamwire alternate N times (default 10)\n"
           "  --latency-idle N    latency: N idle streams open at the frontend meanwhile (their\n"
           "                      heartbeats share its receive thread; default 0)\n"
           "  --latency-dump FILE write every latency sample (segment, index, raw send-asap,\n"
           "                      raw buffered, streamwire ns) to FILE\n"
           "  --ttfi-streams N    streams for time to first item (default 2000)\n"
           "  --idle-streams N    idle open streams (default 10000)\n"
           "  --idle-cpu-secs S   idle CPU sampling window (default 6)\n"
           "  --cli PATH          cli: the streamwire CLI binary (default: streamwire in the\n"
           "                      directory above this binary's, e.g. build/streamwire)\n"
           "  --cli-items N       cli: items of the one stream (default 1000000; quick 100000)\n"
           "  --trials N          loss: trials of each kind (SIGKILL, SIGSTOP); cancel:\n"
           "                      frontend SIGKILL trials (default 20; quick 2)\n"
           "  --cancel-trials N   cancel -> handler trials (default 200; quick 20)\n"
           "  --slow-streams N    concurrent slow streams (default 1000; quick 100)\n"
           "  --slow-items N      items per slow stream (default 600; quick 300)\n"
           "  --slow-delay-ms N   a slow consumer reads one item per N ms (default 10; quick 2)\n"
           "  --slow-threads N    consumer threads polling the slow streams (default 4)\n"
           "  --frozen-frontend   cancel: keep another frontend with a stream SIGSTOPped\n"
           "                      during the frontend SIGKILL trials (not in the default run)\n"
           "  --live-frontends N  cancel: N other routers in this process keep a stream open\n"
           "                      to the worker during the frontend SIGKILL trials (default 0)\n"
           "  --window N          credit window of the streamwire runs (default: the router's\n"
           "                      default); the ingress max_window is raised to match\n"
           "  --no-send-asap      streamwire's connections without send-asap (its default is\n"
           "                      on); raw, and streamwire's long-stream callback rows and\n"
           "                      short streams, always run both ways and each row uses the\n"
           "                      better mode\n"
           "  --handler-pool      the main workers run their handler on the ingress's\n"
           "                      handler pool (the library's default) instead of inline\n"
           "                      (sw_ingress_opts.handler_inline, as raw's responder runs\n"
           "                      in its subscription callback)\n"
           "  --side raw|sw|both  run only one side of long and short (for profiling)\n"
           "  --callgrind         scenario 6: under valgrind --tool=callgrind\n"
           "                      --instr-atstart=no, profile each long- and short-stream run\n"
           "                      into its own dump (Ir per item = dump total / items)\n"
           "  -v, --verbose       print each repetition's figure\n"
           "  -h, --help          this text\n");
}

static int
parse_list_size(const char *s, size_t *out, int max)
{
    int n = 0;
    char *end;
    while (*s && n < max) {
        unsigned long v = strtoul(s, &end, 10);
        if (end == s || v == 0)
            return -1;
        out[n++] = v;
        s = *end == ',' ? end + 1 : end;
        if (*end != ',' && *end != '\0')
            return -1;
    }
    return n;
}

static int
parse_list_uint(const char *s, unsigned *out, int max)
{
    size_t tmp[MAX_LIST];
    int n = parse_list_size(s, tmp, max < MAX_LIST ? max : MAX_LIST);
    for (int i = 0; i < n; i++)
        out[i] = (unsigned)tmp[i];
    return n;
}

static int
want(const char *name)
{
    const char *p;
    size_t l = strlen(name);
    if (cfg.only == NULL)
        return 1;
    for (p = cfg.only; (p = strstr(p, name)) != NULL; p += l)
        if ((p == cfg.only || p[-1] == ',') && (p[l] == ',' || p[l] == '\0'))
            return 1;
    return 0;
}

static const char *
need_arg(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "streamwire-bench: %s needs a value\n", argv[*i]);
        exit(2);
    }
    return argv[++*i];
}

static void
parse_args(int argc, char **argv)
{
    int set_items = 0, set_reps = 0, set_short = 0, set_lat = 0, set_ttfi = 0, set_idle = 0,
        set_cpu = 0, set_trials = 0, set_ctrials = 0, set_sstreams = 0, set_sitems = 0,
        set_sdelay = 0;
    size_t off = 0;
    for (int i = 0; i < argc && off < sizeof(g_cmdline) - 1; i++)
        off += (size_t)snprintf(g_cmdline + off, sizeof(g_cmdline) - off, "%s%s", i ? " " : "",
                                i ? argv[i] : "streamwire-bench");
    cfg.send_asap = 1;
    cfg.sizes[0] = 64;
    cfg.sizes[1] = 1024;
    cfg.nsizes = 2;
    cfg.conc[0] = 1;
    cfg.conc[1] = 64;
    cfg.conc[2] = 1024;
    cfg.nconc = 3;
    cfg.short_items = 10;
    cfg.rate = 2000;
    cfg.slow_threads = 4;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--server")) {
            cfg.server_url = need_arg(argc, argv, &i);
        } else if (!strcmp(a, "--server-pid")) {
            cfg.server_pid = (pid_t)atol(need_arg(argc, argv, &i));
            if (cfg.server_pid <= 0)
                die("--server-pid: a process id is needed");
        } else if (!strcmp(a, "--nats-server")) {
            cfg.nats_server = need_arg(argc, argv, &i);
        } else if (!strcmp(a, "--json")) {
            cfg.json_path = need_arg(argc, argv, &i);
        } else if (!strcmp(a, "--quick")) {
            cfg.quick = 1;
        } else if (!strcmp(a, "--only")) {
            cfg.only = need_arg(argc, argv, &i);
        } else if (!strcmp(a, "--reps")) {
            cfg.reps = (unsigned)atoi(need_arg(argc, argv, &i));
            set_reps = 1;
        } else if (!strcmp(a, "--items")) {
            cfg.items = strtoul(need_arg(argc, argv, &i), NULL, 10);
            set_items = 1;
        } else if (!strcmp(a, "--sizes")) {
            if ((cfg.nsizes = parse_list_size(need_arg(argc, argv, &i), cfg.sizes, MAX_LIST)) <= 0)
                goto bad;
        } else if (!strcmp(a, "--concurrency")) {
            if ((cfg.nconc = parse_list_uint(need_arg(argc, argv, &i), cfg.conc, MAX_LIST)) <= 0)
                goto bad;
        } else if (!strcmp(a, "--short-items")) {
            cfg.short_items = (unsigned)atoi(need_arg(argc, argv, &i));
        } else if (!strcmp(a, "--short-secs")) {
            cfg.short_secs = atof(need_arg(argc, argv, &i));
            set_short = 1;
        } else if (!strcmp(a, "--rate")) {
            cfg.rate = (unsigned)atoi(need_arg(argc, argv, &i));
        } else if (!strcmp(a, "--latency-secs")) {
            cfg.lat_secs = atof(need_arg(argc, argv, &i));
            set_lat = 1;
        } else if (!strcmp(a, "--latency-segments")) {
            cfg.lat_segs = (unsigned)atoi(need_arg(argc, argv, &i));
            if (cfg.lat_segs == 0)
                goto bad;
        } else if (!strcmp(a, "--latency-idle")) {
            cfg.lat_idle = (unsigned)atoi(need_arg(argc, argv, &i));
        } else if (!strcmp(a, "--latency-dump")) {
            cfg.lat_dump = need_arg(argc, argv, &i);
        } else if (!strcmp(a, "--ttfi-streams")) {
            cfg.ttfi_n = (unsigned)atoi(need_arg(argc, argv, &i));
            set_ttfi = 1;
        } else if (!strcmp(a, "--idle-streams")) {
            cfg.idle_n = (unsigned)atoi(need_arg(argc, argv, &i));
            set_idle = 1;
        } else if (!strcmp(a, "--cli")) {
            cfg.cli = need_arg(argc, argv, &i);
        } else if (!strcmp(a, "--cli-items")) {
            cfg.cli_items = strtoul(need_arg(argc, argv, &i), NULL, 10);
        } else if (!strcmp(a, "--idle-cpu-secs")) {
            cfg.idle_cpu_secs = atof(need_arg(argc, argv, &i));
            set_cpu = 1;
        } else if (!strcmp(a, "--trials")) {
            cfg.trials = (unsigned)atoi(need_arg(argc, argv, &i));
            set_trials = 1;
        } else if (!strcmp(a, "--cancel-trials")) {
            cfg.cancel_trials = (unsigned)atoi(need_arg(argc, argv, &i));
            set_ctrials = 1;
        } else if (!strcmp(a, "--slow-streams")) {
            cfg.slow_streams = (unsigned)atoi(need_arg(argc, argv, &i));
            set_sstreams = 1;
        } else if (!strcmp(a, "--slow-items")) {
            cfg.slow_items = (unsigned)atoi(need_arg(argc, argv, &i));
            set_sitems = 1;
        } else if (!strcmp(a, "--slow-delay-ms")) {
            cfg.slow_delay_ms = (unsigned)atoi(need_arg(argc, argv, &i));
            set_sdelay = 1;
        } else if (!strcmp(a, "--live-frontends")) {
            cfg.live_fe = (unsigned)atoi(need_arg(argc, argv, &i));
        } else if (!strcmp(a, "--frozen-frontend")) {
            cfg.frozen_fe = 1;
        } else if (!strcmp(a, "--slow-threads")) {
            cfg.slow_threads = (unsigned)atoi(need_arg(argc, argv, &i));
        } else if (!strcmp(a, "--window")) {
            cfg.window = (unsigned)atoi(need_arg(argc, argv, &i));
        } else if (!strcmp(a, "--side")) {
            const char *v = need_arg(argc, argv, &i);
            cfg.side = !strcmp(v, "raw") ? 1 : !strcmp(v, "sw") ? 2 : !strcmp(v, "both") ? 0 : -1;
            if (cfg.side < 0)
                goto bad;
        } else if (!strcmp(a, "--callgrind")) {
            cfg.callgrind = 1;
        } else if (!strcmp(a, "--handler-pool")) {
            cfg.handler_pool = 1;
        } else if (!strcmp(a, "--no-send-asap")) {
            cfg.send_asap = 0;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            cfg.verbose = 1;
        } else {
            fprintf(stderr, "streamwire-bench: unknown option %s\n", a);
            usage(stderr);
            exit(2);
        }
    }
    if (!set_reps)
        cfg.reps = cfg.quick ? 1 : 3;
    if (!set_items)
        cfg.items = cfg.quick ? 5000 : 100000;
    if (!set_short)
        cfg.short_secs = cfg.quick ? 0.3 : 2.0;
    if (!set_lat)
        cfg.lat_secs = cfg.quick ? 0.5 : 5.0;
    if (!set_ttfi)
        cfg.ttfi_n = cfg.quick ? 100 : 2000;
    if (!set_idle)
        cfg.idle_n = cfg.quick ? 1000 : 10000;
    if (!set_cpu)
        cfg.idle_cpu_secs = cfg.quick ? 0.3 : 6.0;
    if (cfg.cli_items == 0)
        cfg.cli_items = cfg.quick ? 100000 : 1000000;
    if (!set_trials)
        cfg.trials = cfg.quick ? 2 : 20;
    if (!set_ctrials)
        cfg.cancel_trials = cfg.quick ? 20 : 200;
    if (!set_sstreams)
        cfg.slow_streams = cfg.quick ? 100 : 1000;
    if (!set_sitems)
        cfg.slow_items = cfg.quick ? 300 : 600;
    if (!set_sdelay)
        cfg.slow_delay_ms = cfg.quick ? 2 : 10;
    if (cfg.trials == 0 || cfg.cancel_trials == 0 || cfg.slow_streams == 0 || cfg.slow_items == 0 ||
        cfg.slow_threads == 0 || cfg.slow_threads > 256)
        goto bad;
    if (cfg.reps == 0 || cfg.reps > 32 || cfg.items == 0 || cfg.short_items == 0 || cfg.rate == 0 ||
        cfg.ttfi_n == 0 || cfg.idle_n == 0 || cfg.short_secs <= 0 || cfg.lat_secs <= 0 ||
        cfg.idle_cpu_secs <= 0)
        goto bad;
    for (int i = 0; i < cfg.nsizes; i++)
        if (cfg.sizes[i] > 1024 * 512)
            goto bad;
    return;
bad:
    fprintf(stderr, "streamwire-bench: bad option value (see --help)\n");
    exit(2);
}

/* ------------------------------------------------------------------ main */

int
main(int argc, char **argv)
{
    unsigned max_conc = 64;
    sw_router_opts rto;
    sw_err e;
    natsStatus s;
    int64_t t_start;

    if (argc == 4 && strcmp(argv[1], "--idle-worker") == 0) {
        cfg.send_asap = 1;
        return idle_worker_main(argv[2], (unsigned)strtoul(argv[3], NULL, 10));
    }
    if (argc == 5 && strcmp(argv[1], "--worker-mode") == 0) {
        cfg.send_asap = 1;
        return loss_worker_main(argv[2], argv[3], argv[4]);
    }
    if (argc == 3 && strcmp(argv[1], "--frontend-mode") == 0) {
        cfg.send_asap = 1;
        return frontend_main(argv[2]);
    }
    if (argc == 4 && strcmp(argv[1], "--slow-worker") == 0) {
        cfg.send_asap = 1;
        return slow_worker_main(argv[2], (unsigned)strtoul(argv[3], NULL, 10));
    }
    parse_args(argc, argv);
#ifndef BENCH_HAVE_CALLGRIND
    if (cfg.callgrind) {
        fprintf(stderr, "streamwire-bench: built without <valgrind/callgrind.h>; --callgrind "
                        "is not available\n");
        return 2;
    }
#endif
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    t_start = now_ns();
    loadavg(g_load_start, sizeof(g_load_start));

    if (cfg.server_url != NULL) {
        g_url = cfg.server_url;
        if (cfg.server_pid > 0)
            server_version(cfg.server_pid);
    } else {
        start_server(cfg.nats_server);
        g_url = g_nats.url;
        progress("started %s at %s (store %s/js)", g_server_version, g_url, g_nats.dir);
    }

    /* raw side */
    for (g_raw_mode = 0; g_raw_mode < RAW_MODES; g_raw_mode++) {
        char fname[64], wname[64];
        snprintf(fname, sizeof(fname), "bench-raw-frontend-%s", g_raw_mode_name[g_raw_mode]);
        snprintf(wname, sizeof(wname), "bench-raw-worker-%s", g_raw_mode_name[g_raw_mode]);
        g_raw_fronts[g_raw_mode] = raw_connect(g_url, fname, g_raw_mode == RAW_ASAP);
        g_raw_works[g_raw_mode] = raw_connect(g_url, wname, g_raw_mode == RAW_ASAP);
        s = natsConnection_Subscribe(&g_raw_resp_subs[g_raw_mode], raw_work(), raw_req_subj(),
                                     raw_responder_cb, NULL);
        if (s == NATS_OK)
            s = natsConnection_Flush(raw_work());
        if (s != NATS_OK)
            die("raw responder subscribe: %s", natsStatus_GetText(s));
    }
    g_raw_mode = RAW_ASAP;

    /* streamwire side */
    for (int i = 0; i < cfg.nconc; i++)
        if (cfg.conc[i] > max_conc)
            max_conc = cfg.conc[i];
    g_sw_front = sw_connect(g_url, "bench-sw-frontend");
    g_sw_work = sw_connect(g_url, "bench-sw-worker");
    sw_router_opts_init(&rto);
    g_default_window = rto.credit_window;
    if ((e = sw_router_create(&g_router, g_sw_front, &rto)) != SW_OK)
        die("sw_router_create: %s", sw_err_name(e));
    /* max_inflight raised (default 64) so concurrency 1024 is not answered
     * "overloaded"; everything else default. */
    g_ing_main = start_ingress(EP_MAIN, INST_MAIN, 2 * max_conc,
                               cfg.window > SW_INGRESS_MAX_WINDOW_DEFAULT ? cfg.window : 0);
    /* The credit-cost run asks for a 1<<20 window: the ingress caps windows
     * at max_window (default 16384), so raise it there. */
    g_ing_big = start_ingress(EP_BIG, INST_BIG, 0, BIG_WINDOW);

    /* warm-up: fault in code and buffers on both paths */
    {
        stream_run w;
        memset(&w, 0, sizeof(w));
        w.n = 2000;
        w.size = 64;
        run_raw_stream(&w);
        memset(&w, 0, sizeof(w));
        w.n = 2000;
        w.size = 64;
        run_sw_stream(&w, EP_MAIN, INST_MAIN, 0, 0);
        if (w.err[0])
            die("warm-up failed: %s", w.err);
    }

    /* Early entries run first and keep their rows aside; then the table is
     * walked in report order, running the others and putting each early
     * entry's rows back at its place. */
    {
        static row early_rows[NSCEN][16];
        int nearly[NSCEN] = {0};
        for (size_t i = 0; i < NSCEN; i++) {
            if (!scenarios[i].early || !want(scenarios[i].name))
                continue;
            scenarios[i].fn();
            nearly[i] = g_nrows;
            memcpy(early_rows[i], g_rows, sizeof(row) * (size_t)nearly[i]);
            g_nrows = 0;
        }
        for (size_t i = 0; i < NSCEN; i++) {
            if (scenarios[i].early) {
                memcpy(&g_rows[g_nrows], early_rows[i], sizeof(row) * (size_t)nearly[i]);
                g_nrows += nearly[i];
            } else if (want(scenarios[i].name)) {
                scenarios[i].fn();
            }
        }
    }

    loadavg(g_load_end, sizeof(g_load_end));
    print_table();
    print_goals();
    printf("\ntotal %.1f s\n", (double)(now_ns() - t_start) / 1e9);
    fflush(stdout);
    if (cfg.json_path != NULL) {
        write_json(cfg.json_path);
        progress("wrote %s", cfg.json_path);
    }

    scen_long_fini();
    scen_sealed_fini();
    scen_short_fini();
    sw_ingress_destroy(g_ing_big);
    sw_ingress_destroy(g_ing_main);
    sw_router_destroy(g_router);
    sw_conn_close(g_sw_work);
    sw_conn_close(g_sw_front);
    for (int m = 0; m < RAW_MODES; m++) {
        natsSubscription_Unsubscribe(g_raw_resp_subs[m]);
        natsSubscription_Destroy(g_raw_resp_subs[m]);
        natsConnection_Destroy(g_raw_works[m]);
        natsConnection_Destroy(g_raw_fronts[m]);
    }
    nats_Close();
    cleanup();
    return 0;
}
