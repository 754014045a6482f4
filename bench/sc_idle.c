/* bench/sc_idle.c -- streamwire-bench: scenario 5: idle open streams at the
 * frontend (RSS per stream, idle CPU), and the hidden mode --idle-worker (the
 * worker side, a child process).
 *
 * Threads and locks: g_idle_mu guards the held responders of the idle worker
 * (handler threads). */
#include "bench.h"

typedef struct idle_res {
    double bytes_per_stream, peak_bytes_per_stream, open_secs;
    double worker_bytes_per_stream, server_bytes_per_stream;
    double cpu_front, cpu_worker, cpu_server; /* % of one core while idle */
    double se_front, se_worker;               /* their standard errors, from half-second slices */
    double msgs_in;                           /* messages/s the frontend's connection received */
    unsigned slices;
    char note[160];
} idle_res;

static void
idle_wait(child *c, int sw, unsigned long want, cstat *st)
{
    int64_t until = now_ns() + 60000000000LL;
    for (;;) {
        child_stat(c, st);
        if ((sw ? st->sw : st->raw) >= want)
            return;
        if (now_ns() > until)
            die("idle worker holds %lu of %lu %s streams after 60 s", sw ? st->sw : st->raw, want,
                sw ? "streamwire" : "raw");
        sleep_ms(20);
    }
}

/* The standard error of the mean of v[0..n) (NAN below two values). */
static double
std_err(const double *v, unsigned n)
{
    double mean = 0, ss = 0;
    if (n < 2)
        return NAN;
    for (unsigned i = 0; i < n; i++)
        mean += v[i] / n;
    for (unsigned i = 0; i < n; i++)
        ss += (v[i] - mean) * (v[i] - mean);
    return sqrt(ss / (n - 1) / n);
}

/* Idle CPU over cfg.idle_cpu_secs, read in half-second slices (at least
 * four): the figures are the whole window's, and each slice's own figure
 * gives their standard errors, so that the cost (the difference of two
 * such windows) comes with how far it could move by chance. */
#define IDLE_SLICES_MAX 600

/* CPU time as % of one core over a wall-clock span. */
static double
core_pct(int64_t cpu_us, int64_t wall_ns)
{
    return (double)cpu_us / 1e4 / ((double)wall_ns / 1e9);
}

/* Messages the connection has received so far (0 without one). */
static uint64_t
conn_msgs_in(natsConnection *nc)
{
    natsStatistics *st = NULL;
    uint64_t in = 0;
    if (nc != NULL && natsStatistics_Create(&st) == NATS_OK) {
        if (natsConnection_GetStats(nc, st) != NATS_OK ||
            natsStatistics_GetCounts(st, &in, NULL, NULL, NULL, NULL) != NATS_OK)
            in = 0;
        natsStatistics_Destroy(st);
    }
    return in;
}

/* nc: the frontend's connection, whose messages received are counted over
 * the window (NULL: not counted). */
static void
idle_cpu(child *c, idle_res *r, natsConnection *nc)
{
    cstat a, b, prev;
    uint64_t m0 = conn_msgs_in(nc);
    int64_t f0, fp, s0, s1, t0, tp;
    double front[IDLE_SLICES_MAX], worker[IDLE_SLICES_MAX];
    unsigned slices = (unsigned)(cfg.idle_cpu_secs * 2 + 0.5);
    if (slices < 4)
        slices = 4;
    if (slices > IDLE_SLICES_MAX)
        slices = IDLE_SLICES_MAX;
    child_stat(c, &a);
    f0 = self_cpu_us();
    s0 = server_cpu_us();
    t0 = now_ns();
    prev = a;
    fp = f0;
    tp = t0;
    for (unsigned i = 0; i < slices; i++) {
        int64_t f, t;
        sleep_until_ns(t0 + (int64_t)(cfg.idle_cpu_secs * 1e9 * (i + 1) / slices));
        child_stat(c, &b);
        f = self_cpu_us();
        t = now_ns();
        front[i] = core_pct(f - fp, t - tp);
        worker[i] = core_pct(b.cpu_us - prev.cpu_us, t - tp);
        prev = b;
        fp = f;
        tp = t;
    }
    s1 = server_cpu_us();
    /* the whole window: from the first reading to the last slice's */
    r->cpu_front = core_pct(fp - f0, tp - t0);
    r->cpu_worker = core_pct(b.cpu_us - a.cpu_us, tp - t0);
    r->cpu_server = s0 >= 0 && s1 >= 0 ? core_pct(s1 - s0, tp - t0) : NAN;
    r->msgs_in = (double)(conn_msgs_in(nc) - m0) / ((double)(tp - t0) / 1e9);
    r->slices = slices;
    r->se_front = std_err(front, slices);
    r->se_worker = std_err(worker, slices);
}

/* RSS bookkeeping around opening n idle streams, the same for raw and sw:
 * idle_open_begin before the first open, idle_open_tick after each,
 * idle_open_end once all are open (waits until the worker holds them, fills
 * the RSS and open-time figures of r, then measures idle CPU). */
typedef struct idle_open {
    cstat c0;
    long base, peak, srv0;
    int64_t t0;
    int have_peak;
} idle_open;

static void
idle_open_begin(child *c, idle_open *o)
{
    child_stat(c, &o->c0);
    malloc_trim(0);
    o->have_peak = reset_peak_rss() == 0;
    o->base = self_rss_kb();
    o->peak = o->base;
    o->srv0 = server_rss_kb();
    o->t0 = now_ns();
}

static void
idle_open_tick(idle_open *o, unsigned i)
{
    if (i % 1000 == 999) {
        long v = self_rss_kb();
        if (v > o->peak)
            o->peak = v;
    }
}

static void
idle_open_end(child *c, idle_open *o, int sw, unsigned n, idle_res *r)
{
    cstat c1;
    long after, srv1;
    idle_wait(c, sw, (sw ? o->c0.sw : o->c0.raw) + n, &c1);
    r->open_secs = (double)(now_ns() - o->t0) / 1e9;
    after = self_rss_kb();
    if (o->have_peak)
        o->peak = status_kb("/proc/self/status", "VmHWM");
    else if (after > o->peak)
        o->peak = after;
    srv1 = server_rss_kb();
    r->bytes_per_stream = (double)(after - o->base) * 1024.0 / n;
    r->peak_bytes_per_stream = (double)(o->peak - o->base) * 1024.0 / n;
    r->worker_bytes_per_stream = (double)(c1.rss_kb - o->c0.rss_kb) * 1024.0 / n;
    r->server_bytes_per_stream =
        o->srv0 > 0 && srv1 > 0 ? (double)(srv1 - o->srv0) * 1024.0 / n : NAN;
    progress("  %s: %u open, RSS %+ld KiB (peak %+ld KiB); measuring idle CPU", sw ? "sw" : "raw",
             n, after - o->base, o->peak - o->base);
    idle_cpu(c, r, sw ? sw_conn_nats(g_sw_front) : raw_front());
}

static void
idle_raw(child *c, unsigned n, idle_res *r)
{
    natsInbox **inbox = calloc(n, sizeof(*inbox));
    natsSubscription **sub = calloc(n, sizeof(*sub));
    breq q = {BREQ_MAGIC, K_IDLE, 0, 0, 0, 0};
    idle_open o;
    if (inbox == NULL || sub == NULL)
        die("out of memory");
    idle_open_begin(c, &o);
    for (unsigned i = 0; i < n; i++) {
        natsStatus s = natsInbox_Create(&inbox[i]);
        if (s == NATS_OK)
            s = natsConnection_SubscribeSync(&sub[i], raw_front(), inbox[i]);
        if (s == NATS_OK)
            s = natsConnection_PublishRequest(raw_front(), IDLE_RAW_SUBJ, inbox[i], &q,
                                              (int)sizeof(q));
        if (s != NATS_OK)
            die("raw idle stream %u: %s", i, natsStatus_GetText(s));
        idle_open_tick(&o, i);
    }
    (void)natsConnection_Flush(raw_front());
    idle_open_end(c, &o, 0, n, r);
    for (unsigned i = 0; i < n; i++) {
        natsSubscription_Unsubscribe(sub[i]);
        natsSubscription_Destroy(sub[i]);
        natsInbox_Destroy(inbox[i]);
    }
    free(inbox);
    free(sub);
    snprintf(r->note, sizeof(r->note), "%u SubscribeSync + PublishRequest", n);
}

static void
idle_sw(child *c, unsigned n, idle_res *r)
{
    sw_stream **ss = calloc(n, sizeof(*ss));
    breq q = {BREQ_MAGIC, K_IDLE, 0, 0, 0, 0};
    sw_request_opts ro;
    sw_router_stats rs0, rs1;
    idle_open o;
    char line[64];
    if (ss == NULL)
        die("out of memory");
    sw_request_opts_init(&ro);
    ro.endpoint = EP_IDLE;
    ro.instance_id = INST_IDLE;
    ro.credit_window = cfg.window;
    sw_router_stats_get(g_router, &rs0);
    idle_open_begin(c, &o);
    for (unsigned i = 0; i < n; i++) {
        sw_err e = sw_router_open(&ss[i], g_router, &ro, &q, sizeof(q));
        if (e != SW_OK)
            die("sw idle stream %u: %s", i, sw_err_name(e));
        idle_open_tick(&o, i);
    }
    idle_open_end(c, &o, 1, n, r);
    sw_router_stats_get(g_router, &rs1);
    {
        uint64_t ended = 0;
        for (int i = 1; i <= 5; i++)
            ended += rs1.terminals[i] - rs0.terminals[i];
        snprintf(r->note, sizeof(r->note),
                 "%u sw_router_open, window %u; %" PRIu64 " streams ended early (want 0), "
                 "open gauge %" PRIu64 "; stream probes %" PRIu64 " (a lost or late idle beat)",
                 n, cfg.window ? cfg.window : g_default_window, ended, rs1.open_streams,
                 rs1.stream_probes_sent - rs0.stream_probes_sent);
    }
    for (unsigned i = 0; i < n; i++)
        sw_stream_close(ss[i]);
    free(ss);
    if (child_cmd(c, "release", line, sizeof(line)) != 0)
        die("idle worker: release failed");
}

void
idle_background_open(idle_bg *b, unsigned n)
{
    breq q = {BREQ_MAGIC, K_IDLE, 0, 0, 0, 0};
    sw_request_opts ro;
    cstat st0, st;
    memset(b, 0, sizeof(*b));
    if (n == 0)
        return;
    if ((b->ss = calloc(n, sizeof(*b->ss))) == NULL)
        die("out of memory");
    child_spawn(&b->c, n);
    child_stat(&b->c, &st0);
    sw_request_opts_init(&ro);
    ro.endpoint = EP_IDLE;
    ro.instance_id = INST_IDLE;
    ro.credit_window = cfg.window;
    for (unsigned i = 0; i < n; i++) {
        sw_err e = sw_router_open(&b->ss[i], g_router, &ro, &q, sizeof(q));
        if (e != SW_OK)
            die("sw idle stream %u: %s", i, sw_err_name(e));
    }
    b->n = n;
    idle_wait(&b->c, 1, st0.sw + n, &st);
    sleep_ms(1500); /* past their first beats: on the idle spacing */
}

void
idle_background_close(idle_bg *b)
{
    char line[64];
    if (b->n == 0)
        return;
    for (unsigned i = 0; i < b->n; i++)
        sw_stream_close(b->ss[i]);
    free(b->ss);
    if (child_cmd(&b->c, "release", line, sizeof(line)) != 0)
        die("idle worker: release failed");
    child_quit(&b->c);
    b->n = 0;
}

/* Until the worker holds none of the streams just closed and released (a
 * cancelled stream's final waits 4 heartbeat intervals + 2 s for an
 * acknowledgement that a closed stream's router never sends), then 2.5 s
 * more (before session 32 the worker probed a frontend until it counted its
 * frontends again, every 2 s; it now stops with the last stream): the
 * window after measures the processes with no stream open, as before the
 * first. Gives up (and says so) after 30 s. */
static void
idle_settle(child *c)
{
    int64_t until = now_ns() + 30000000000LL;
    cstat st;
    for (;;) {
        child_stat(c, &st);
        if (st.held == 0)
            break;
        if (now_ns() > until) {
            progress("  the idle worker still holds %lu streams after 30 s", st.held);
            break;
        }
        sleep_ms(100);
    }
    sleep_ms(2500);
}

/* Student's t, two-sided 90 % (its 0.95 quantile), for df degrees of
 * freedom. */
static double
t90(unsigned df)
{
    static const double t[] = {0,     6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895,
                               1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761, 1.753,
                               1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714,
                               1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697};
    if (df == 0)
        return NAN;
    return df < sizeof(t) / sizeof(t[0]) ? t[df] : 1.645 + 2.0 / df;
}

/* The ~90 % half-width of the streams' cost, sw - (base0 + base1) / 2,
 * from the three windows' standard errors (their slices taken as
 * independent, which they are only roughly). How far the two no-stream
 * windows differ is shown beside it, not folded in. */
static double
idle_cost_ci(double se, double se0, double se1, unsigned slices)
{
    return t90(slices - 1) * sqrt(se * se + (se0 * se0 + se1 * se1) / 4);
}

void
scen_idle(void)
{
    unsigned n = cfg.idle_n;
    child c;
    idle_res r[2], base[2];
    char param[48], note[160];
    memset(r, 0, sizeof(r));
    memset(base, 0, sizeof(base));
    progress("5 idle streams: %u open streams, raw then sw (worker in a child process)", n);
    child_spawn(&c, n);
    /* What both processes cost with no stream open (their connections,
     * tickers and the bench's other idle objects), before the streams and
     * after: the streams' own cost is what a row adds to the mean. */
    sleep_ms(1000); /* (the worker's start settles) */
    idle_cpu(&c, &base[0], NULL);
    idle_raw(&c, n, &r[0]);
    idle_sw(&c, n, &r[1]);
    idle_settle(&c);
    progress("  no stream open again: measuring idle CPU");
    idle_cpu(&c, &base[1], NULL);
    child_quit(&c);
    snprintf(param, sizeof(param), "%u open streams", n);
    add_row("5 idle streams", param, "frontend B/stream", r[0].bytes_per_stream,
            r[1].bytes_per_stream, 1, 0, r[1].note);
    add_row("5 idle streams", param, "peak B/stream", r[0].peak_bytes_per_stream,
            r[1].peak_bytes_per_stream, 1, 0, "VmHWM reset before opening");
    add_row("5 idle streams", param, "worker B/stream", r[0].worker_bytes_per_stream,
            r[1].worker_bytes_per_stream, 1, 0, "child process RSS delta");
    add_row("5 idle streams", param, "server B/stream", r[0].server_bytes_per_stream,
            r[1].server_bytes_per_stream, 1, 0, "nats-server RSS delta (raw: one SUB per stream)");
    add_row("5 idle streams", param, "open secs", r[0].open_secs, r[1].open_secs, 1, 2,
            "until the worker holds all");
    snprintf(note, sizeof(note),
             "while idle (%% of one core); standard error raw %.2f, sw %.2f (half-second slices)",
             r[0].se_front, r[1].se_front);
    add_row("5 idle streams", param, "frontend CPU %", r[0].cpu_front, r[1].cpu_front, 1, 1, note);
    snprintf(note, sizeof(note),
             "while idle; sw: heartbeats + 25 ms scans; standard error raw %.2f, sw %.2f",
             r[0].se_worker, r[1].se_worker);
    add_row("5 idle streams", param, "worker CPU %", r[0].cpu_worker, r[1].cpu_worker, 1, 1, note);
    add_row("5 idle streams", param, "server CPU %", r[0].cpu_server, r[1].cpu_server, 1, 1,
            "while idle");
    add_row("5 idle streams", param, "frontend msgs in/s", r[0].msgs_in, r[1].msgs_in, 1, 1,
            "while idle, the frontend's connection (nats.c's count); sw: heartbeat batches, "
            "probe answers, the worker's liveness probes");
    for (int k = 0; k < 2; k++) {
        char p2[48];
        snprintf(p2, sizeof(p2), "no stream open, %s", k ? "after" : "before");
        snprintf(note, sizeof(note), "the same processes %s (both columns); standard error %.2f",
                 k ? "after every stream closed" : "before any stream opened", base[k].se_front);
        add_row("5 idle streams", p2, "frontend CPU %", base[k].cpu_front, base[k].cpu_front, 1, 1,
                note);
        snprintf(note, sizeof(note), "the same processes %s (both columns); standard error %.2f",
                 k ? "after every stream closed" : "before any stream opened", base[k].se_worker);
        add_row("5 idle streams", p2, "worker CPU %", base[k].cpu_worker, base[k].cpu_worker, 1, 1,
                note);
    }
    g_goal_idle_bps = r[1].bytes_per_stream;
    g_goal_idle_cpu_front = r[1].cpu_front;
    g_goal_idle_cpu_worker = r[1].cpu_worker;
    g_goal_idle_cpu_front0 = (base[0].cpu_front + base[1].cpu_front) / 2;
    g_goal_idle_cpu_worker0 = (base[0].cpu_worker + base[1].cpu_worker) / 2;
    g_goal_idle_ci_front =
        idle_cost_ci(r[1].se_front, base[0].se_front, base[1].se_front, r[1].slices);
    g_goal_idle_ci_worker =
        idle_cost_ci(r[1].se_worker, base[0].se_worker, base[1].se_worker, r[1].slices);
    g_goal_idle_drift_front = base[1].cpu_front - base[0].cpu_front;
    g_goal_idle_drift_worker = base[1].cpu_worker - base[0].cpu_worker;
    g_goal_idle_window = cfg.window ? cfg.window : g_default_window;
}

/* --- the child */

static atomic_ulong g_idle_raw_count, g_idle_sw_count;
static pthread_mutex_t g_idle_mu = PTHREAD_MUTEX_INITIALIZER;
static sw_responder **g_idle_held;
static size_t g_idle_nheld, g_idle_cap;

static void
idle_raw_cb(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *arg)
{
    (void)nc;
    (void)sub;
    (void)arg;
    atomic_fetch_add(&g_idle_raw_count, 1);
    natsMsg_Destroy(m);
}

static void
idle_sw_handler(sw_responder *r, void *arg)
{
    (void)arg;
    sw_responder_retain(r);
    pthread_mutex_lock(&g_idle_mu);
    if (g_idle_nheld < g_idle_cap) {
        g_idle_held[g_idle_nheld++] = r;
        r = NULL;
    }
    pthread_mutex_unlock(&g_idle_mu);
    if (r != NULL) {
        (void)sw_responder_fail(r, "bench_full", NULL);
        sw_responder_release(r);
        return;
    }
    atomic_fetch_add(&g_idle_sw_count, 1);
}

int
idle_worker_main(const char *url, unsigned n)
{
    natsConnection *nc;
    natsSubscription *sub = NULL;
    sw_ingress_opts io;
    sw_ingress *ing = NULL;
    sw_err e;
    char line[128];
    pid_t parent = getppid();

    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        return 1;
    setvbuf(stdout, NULL, _IOLBF, 0);
    g_idle_cap = (size_t)n + 64;
    if ((g_idle_held = calloc(g_idle_cap, sizeof(*g_idle_held))) == NULL)
        return 1;
    nc = raw_connect(url, "bench-idle-raw", 1); /* idle: the mode does not matter */
    if (natsConnection_Subscribe(&sub, nc, IDLE_RAW_SUBJ, idle_raw_cb, NULL) != NATS_OK ||
        natsSubscription_SetPendingLimits(sub, -1, -1) != NATS_OK ||
        natsConnection_Flush(nc) != NATS_OK)
        die("idle worker: raw subscribe failed");
    g_sw_work = sw_connect(url, "bench-idle-worker");
    sw_ingress_opts_init(&io);
    io.endpoint = EP_IDLE;
    io.instance_id = INST_IDLE;
    io.handler = idle_sw_handler;
    io.max_inflight = n + 64; /* counts retained responders */
    io.max_window = 1u << 20; /* only a cap: lets --window N reach this worker */
    if ((e = sw_ingress_start(&ing, g_sw_work, &io)) != SW_OK)
        die("idle worker: sw_ingress_start: %s", sw_err_name(e));
    printf("ready\n");
    while (fgets(line, sizeof(line), stdin) != NULL) {
        if (strncmp(line, "stat", 4) == 0) {
            sw_ingress_stats is;
            sw_ingress_stats_get(ing, &is);
            printf("stat %ld %lu %lu %lld %lu\n", self_rss_kb(), atomic_load(&g_idle_raw_count),
                   atomic_load(&g_idle_sw_count), (long long)self_cpu_us(),
                   (unsigned long)is.streams_held);
        } else if (strncmp(line, "release", 7) == 0) {
            pthread_mutex_lock(&g_idle_mu);
            for (size_t i = 0; i < g_idle_nheld; i++)
                sw_responder_release(g_idle_held[i]);
            g_idle_nheld = 0;
            pthread_mutex_unlock(&g_idle_mu);
            printf("released\n");
        } else if (strncmp(line, "quit", 4) == 0) {
            printf("bye\n");
            break;
        }
    }
    sw_ingress_destroy(ing);
    pthread_mutex_lock(&g_idle_mu);
    for (size_t i = 0; i < g_idle_nheld; i++)
        sw_responder_release(g_idle_held[i]);
    g_idle_nheld = 0;
    pthread_mutex_unlock(&g_idle_mu);
    sw_conn_close(g_sw_work);
    natsSubscription_Unsubscribe(sub);
    natsSubscription_Destroy(sub);
    natsConnection_Destroy(nc);
    free(g_idle_held);
    nats_Close();
    return 0;
}
