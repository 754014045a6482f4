/* bench/sc_long.c -- streamwire-bench: scenarios 1 (long stream: items/s,
 * MB/s, blocking consumer, credit cost) and the one-stream runs also used by
 * the warm-up.
 *
 * Threads and locks: A publisher thread per raw run; sinks count on nats.c /
 * router threads, the main thread waits on a latch. */
#include "bench.h"

typedef struct sink {
    atomic_ulong received;
    unsigned long expect;
    _Atomic int64_t t_last;
    int64_t *lat;
    unsigned long seq_errors;
    int status;
    char reason[96];
    latch done;
} sink;

static sink *
sink_new(unsigned long expect, int64_t *lat)
{
    sink *k = calloc(1, sizeof(*k));
    if (k == NULL)
        die("out of memory");
    atomic_init(&k->received, 0);
    atomic_init(&k->t_last, 0);
    k->expect = expect;
    k->lat = lat;
    latch_init(&k->done);
    return k;
}

static void
sink_free(sink *k)
{
    latch_fini(&k->done);
    free(k);
}

static void
raw_sink_cb(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *arg)
{
    sink *k = arg;
    int64_t now = now_ns();
    unsigned long i = atomic_load(&k->received);
    (void)nc;
    (void)sub;
    if (k->lat != NULL && i < k->expect) {
        k->lat[i] = unstamp(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), now);
        stages_received(i, natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), now, 0);
    }
    atomic_store(&k->t_last, now);
    if (atomic_fetch_add(&k->received, 1) + 1 == k->expect)
        latch_set(&k->done);
    natsMsg_Destroy(m);
}

typedef struct pub_args {
    natsConnection *nc;
    char subj[96];
    unsigned long n;
    size_t size;
    unsigned rate;
    int64_t t_start;
    natsStatus st;
} pub_args;

static void *
pub_main(void *arg)
{
    pub_args *a = arg;
    uint8_t *buf = calloc(1, a->size ? a->size : 1);
    int64_t iv = a->rate ? 1000000000LL / a->rate : 0;
    if (buf == NULL) {
        a->st = NATS_NO_MEMORY;
        return NULL;
    }
    a->t_start = now_ns();
    for (unsigned long i = 0; i < a->n; i++) {
        if (iv)
            sleep_until_ns(a->t_start + (int64_t)i * iv);
        int64_t t;
        stamp(buf, a->size);
        t = now_ns();
        if ((a->st = natsConnection_Publish(a->nc, a->subj, buf, (int)a->size)) != NATS_OK)
            break;
        stages_raw_published(i, buf, t, now_ns());
    }
    (void)natsConnection_FlushTimeout(a->nc, 10000);
    free(buf);
    return NULL;
}

static unsigned long g_subj_seq;

/* Raw: a publisher thread on the worker connection publishes n messages on a
 * fresh subject; an async subscription on the frontend connection counts
 * them. nats.c's default pending limits apply (no flow control): drops are
 * reported; with r->hold_all the limits hold every message instead. */
void
run_raw_stream(stream_run *r)
{
    natsSubscription *sub = NULL;
    pthread_t th;
    pub_args a;
    sink *k = sink_new(r->n, r->lat);
    unsigned long last = 0;
    int64_t last_change = now_ns();
    int64_t cpu0, srv0, csw0;
    natsStatus s;

    memset(&a, 0, sizeof(a));
    a.nc = raw_work();
    snprintf(a.subj, sizeof(a.subj), "bench.raw.stream.%lu", ++g_subj_seq);
    a.n = r->n;
    a.size = r->size;
    a.rate = r->rate;
    s = natsConnection_Subscribe(&sub, raw_front(), a.subj, raw_sink_cb, k);
    if (s == NATS_OK && r->hold_all) {
        /* n messages of size bytes, nats.c's per-message overhead aside */
        double bytes = (double)r->n * (double)(r->size + 256);
        s = natsSubscription_SetPendingLimits(sub,
                                              r->n < (unsigned long)INT_MAX ? (int)r->n : INT_MAX,
                                              bytes < INT_MAX ? (int)bytes : INT_MAX);
    }
    if (s == NATS_OK)
        s = natsConnection_Flush(raw_front());
    if (s != NATS_OK)
        die("raw subscribe: %s", natsStatus_GetText(s));
    if (r->stage != NULL)
        stages_arm(r->stage, r->n, r->size, NULL, NULL);
    cpu0 = self_cpu_us();
    srv0 = server_cpu_us();
    csw0 = self_csw();
    if (pthread_create(&th, NULL, pub_main, &a) != 0)
        die("pthread_create");
    for (;;) {
        int64_t dropped = 0;
        unsigned long got;
        if (latch_wait(&k->done, 100000000LL))
            break;
        natsSubscription_GetDropped(sub, &dropped);
        got = atomic_load(&k->received);
        if (got + (unsigned long)dropped >= r->n)
            break;
        if (got != last) {
            last = got;
            last_change = now_ns();
        } else if (now_ns() - last_change > 5000000000LL) {
            snprintf(r->err, sizeof(r->err), "raw: stalled at %lu of %lu", got, r->n);
            break;
        }
    }
    pthread_join(th, NULL);
    if (r->stage != NULL)
        stages_disarm();
    r->cpu_us = (double)(self_cpu_us() - cpu0);
    r->srv_cpu_us = srv0 >= 0 ? (double)(server_cpu_us() - srv0) : NAN;
    r->csw = (double)(self_csw() - csw0);
    if (natsSubscription_Drain(sub) == NATS_OK)
        natsSubscription_WaitForDrainCompletion(sub, 5000);
    natsSubscription_GetDropped(sub, &r->dropped);
    natsSubscription_Destroy(sub);
    r->received = atomic_load(&k->received);
    r->secs = (double)(atomic_load(&k->t_last) - a.t_start) / 1e9;
    r->ok = a.st == NATS_OK && r->received == r->n;
    if (a.st != NATS_OK)
        snprintf(r->err, sizeof(r->err), "raw publish: %s", natsStatus_GetText(a.st));
    sink_free(k);
}

static void
sw_sink_cb(sw_stream *s, const sw_item *it, void *arg)
{
    sink *k = arg;
    int64_t now = now_ns();
    (void)s;
    if (it->kind == SW_ITEM_DATA) {
        unsigned long i = atomic_load(&k->received);
        if (k->lat != NULL && i < k->expect) {
            k->lat[i] = unstamp(it->data, it->len, now);
            stages_received(i, it->data, it->len, now, 1);
        }
        if (it->seq != i + 1)
            k->seq_errors++;
        atomic_store(&k->t_last, now);
        atomic_store(&k->received, i + 1);
    } else {
        k->status = (int)it->terminal.status;
        snprintf(k->reason, sizeof(k->reason), "%s", it->terminal.reason);
        latch_set(&k->done);
    }
}

/* Streamwire: one sw_router_open; the worker's handler sends n items and
 * finishes. Callback consumer (blocking = 0) or sw_stream_next (1). */
void
run_sw_stream(stream_run *r, const char *ep, const char *inst, unsigned window, int blocking)
{
    sw_request_opts ro;
    sw_stream *s = NULL;
    breq q = {BREQ_MAGIC, K_SEND, (uint32_t)r->n, (uint32_t)r->size, r->rate, 0};
    sink *k = sink_new(r->n, r->lat);
    int64_t t0, cpu0 = self_cpu_us(), srv0 = server_cpu_us(), csw0 = self_csw();
    sw_err e;
    int done = 0;

    sw_request_opts_init(&ro);
    ro.endpoint = ep;
    ro.instance_id = inst;
    ro.credit_window = window;
    if (!blocking) {
        ro.on_item = sw_sink_cb;
        ro.on_item_arg = k;
    }
    if (r->stage != NULL) /* the worker's and the frontend's connections */
        stages_arm(r->stage, r->n, r->size, g_sw_work, g_sw_front);
    t0 = now_ns();
    if ((e = sw_router_open(&s, g_router, &ro, &q, sizeof(q))) != SW_OK)
        die("sw_router_open: %s", sw_err_name(e));
    if (blocking) {
        for (;;) {
            const sw_item *it = NULL;
            e = sw_stream_next(s, &it, 10000);
            if (e != SW_OK) {
                snprintf(r->err, sizeof(r->err), "sw_stream_next: %s", sw_err_name(e));
                break;
            }
            sw_sink_cb(s, it, k);
            if (it->kind == SW_ITEM_TERMINAL) {
                done = 1;
                break;
            }
        }
    } else {
        unsigned long last = 0;
        int64_t last_change = now_ns();
        for (;;) {
            unsigned long got;
            if (latch_wait(&k->done, 100000000LL)) {
                done = 1;
                break;
            }
            got = atomic_load(&k->received);
            if (got != last) {
                last = got;
                last_change = now_ns();
            } else if (now_ns() - last_change > 10000000000LL) {
                snprintf(r->err, sizeof(r->err), "sw: stalled at %lu of %lu", got, r->n);
                break;
            }
        }
    }
    sw_stream_close(s);
    if (r->stage != NULL)
        stages_disarm();
    r->cpu_us = (double)(self_cpu_us() - cpu0);
    r->srv_cpu_us = srv0 >= 0 ? (double)(server_cpu_us() - srv0) : NAN;
    r->csw = (double)(self_csw() - csw0);
    r->received = atomic_load(&k->received);
    r->secs = (double)(atomic_load(&k->t_last) - t0) / 1e9;
    r->dropped = 0;
    r->ok = done && k->status == SW_STATUS_COMPLETED && r->received == r->n && k->seq_errors == 0;
    if (done && !r->ok)
        snprintf(r->err, sizeof(r->err), "sw: terminal %s (%s), %lu/%lu items, %lu seq errors",
                 sw_status_name(k->status), k->reason, r->received, r->n, k->seq_errors);
    if (done)
        sink_free(k); /* else a late callback may still touch it: leak */
}

/* ------------------------------------------------------------------ 1: long streams */

/* V_SW is the main world (send-asap unless --no-send-asap), V_SW_ALT the
 * other publish mode (bench_alt_world): the callback rows and the goals
 * take the better of the two; the other streamwire rows are the main
 * world's. */
enum { V_RAW, V_RAW_BUF, V_SW, V_SW_ALT, V_SW_BLOCK, V_SW_BIG, V_SW_NOMET, V_N };

/* The metrics' cost (issue 16): the same callback run through a router made
 * with STREAMWIRE_METRICS=off (no histograms). */
static sw_router *g_nomet_router;

void
scen_long_fini(void)
{
    sw_router_destroy(g_nomet_router);
    g_nomet_router = NULL;
    bench_alt_world_close();
}

/* The better of streamwire's two publish modes for a metric: the median of
 * the main world (m) and of the other mode's (alt), in send-asap/buffered
 * order for the note. */
static double
sw_best(double m, double alt, int lower_better, double *asap, double *buffered, int *which)
{
    *asap = cfg.send_asap ? m : alt;
    *buffered = cfg.send_asap ? alt : m;
    return raw_best(*asap, *buffered, lower_better, which);
}

/* A callback row of the long stream that compares the better raw mode with
 * streamwire's better mode for it (v: the medians by variant), each named
 * after what note holds already. Returns streamwire's figure, raw's in
 * *raw. */
static double
long_best_row(const char *param, const char *metric, const double *v, int lower_better, int prec,
              char *note, size_t cap, double *raw)
{
    int wr, ws;
    double asap, buffered, sw;
    *raw = raw_best(v[V_RAW], v[V_RAW_BUF], lower_better, &wr);
    sw = sw_best(v[V_SW], v[V_SW_ALT], lower_better, &asap, &buffered, &ws);
    raw_best_note(note, cap, v[V_RAW], v[V_RAW_BUF], wr, prec);
    best_note(note, cap, "sw", asap, buffered, ws, prec);
    add_row("1 long stream", param, metric, *raw, sw, lower_better, prec, note);
    return sw;
}

static sw_router *
router_without_metrics(void)
{
    sw_router *r = g_nomet_router;
    if (r == NULL) {
        sw_router_opts o;
        sw_err e;
        sw_router_opts_init(&o);
        setenv("STREAMWIRE_METRICS", "off", 1);
        e = sw_router_create(&r, g_sw_front, &o);
        unsetenv("STREAMWIRE_METRICS");
        if (e != SW_OK)
            die("sw_router_create (metrics off): %s", sw_err_name(e));
        g_nomet_router = r;
    }
    return r;
}

void
scen_long(void)
{
    unsigned reps = cfg.reps;
    const char *vname[V_N] = {"raw send-asap", "raw buffered", "sw",
                              "sw other mode", "sw blocking",  "sw big window",
                              "sw metrics off"};
    sw_router_stats rs0, rs1;
    sw_ingress_stats is0, is1;
    bench_world *alt_w = cfg.side != 1 ? bench_alt_world() : NULL; /* not --side raw */

    vname[V_SW] = cfg.send_asap ? "sw send-asap" : "sw buffered";
    vname[V_SW_ALT] = cfg.send_asap ? "sw buffered" : "sw send-asap";

    sw_router_stats_get(g_router, &rs0);
    sw_ingress_stats_get(g_ing_main, &is0);
    for (int si = 0; si < cfg.nsizes; si++) {
        size_t size = cfg.sizes[si];
        double ips[V_N][32], cpu[V_N][32], scpu[V_N][32], csw[V_N][32];
        int64_t drops[V_N];
        char errs[V_N][160];
        char param[48], note[200];
        sw_ingress_stats sz0, sz1;
        memset(drops, 0, sizeof(drops));
        memset(errs, 0, sizeof(errs));
        sw_ingress_stats_get(g_ing_main, &sz0);
        for (unsigned rep = 0; rep < reps && rep < 32; rep++) {
            for (int v = 0; v < V_N; v++) {
                stream_run r;
                int raw = v == V_RAW || v == V_RAW_BUF;
                if ((cfg.side == 1 && !raw) || (cfg.side == 2 && raw)) {
                    ips[v][rep] = cpu[v][rep] = scpu[v][rep] = csw[v][rep] = NAN;
                    continue;
                }
                memset(&r, 0, sizeof(r));
                r.n = cfg.items;
                r.size = size;
                progress("1 long stream %zu B x %lu: %s, rep %u/%u", size, cfg.items, vname[v],
                         rep + 1, reps);
                if (cfg.callgrind) {
                    CALLGRIND_ZERO_STATS;
                    CALLGRIND_START_INSTRUMENTATION;
                }
                if (raw) {
                    g_raw_mode = v == V_RAW_BUF ? RAW_BUFFERED : RAW_ASAP;
                    run_raw_stream(&r);
                    g_raw_mode = RAW_ASAP;
                } else if (v == V_SW)
                    run_sw_stream(&r, EP_MAIN, INST_MAIN, cfg.window, 0);
                else if (v == V_SW_ALT) {
                    sw_router *keep = g_router;
                    g_router = alt_w->router;
                    run_sw_stream(&r, EP_MAIN, INST_ALT, cfg.window, 0);
                    g_router = keep;
                } else if (v == V_SW_BLOCK)
                    run_sw_stream(&r, EP_MAIN, INST_MAIN, cfg.window, 1);
                else if (v == V_SW_NOMET) {
                    sw_router *keep = g_router;
                    g_router = router_without_metrics();
                    run_sw_stream(&r, EP_MAIN, INST_MAIN, cfg.window, 0);
                    g_router = keep;
                } else
                    run_sw_stream(&r, EP_BIG, INST_BIG, BIG_WINDOW, 0);
                if (cfg.callgrind) {
                    char label[96];
                    CALLGRIND_STOP_INSTRUMENTATION;
                    snprintf(label, sizeof(label), "long %zuB x%lu %s rep%u", size, cfg.items,
                             vname[v], rep + 1);
                    CALLGRIND_DUMP_STATS_AT(label);
                }
                ips[v][rep] = r.secs > 0 ? (double)r.received / r.secs : NAN;
                cpu[v][rep] = r.received ? r.cpu_us / (double)r.received : NAN;
                scpu[v][rep] = r.received ? r.srv_cpu_us / (double)r.received : NAN;
                csw[v][rep] = r.received ? r.csw / (double)r.received : NAN;
                drops[v] += r.dropped;
                if (r.err[0] && !errs[v][0])
                    snprintf(errs[v], sizeof(errs[v]), "%s", r.err);
                if (r.err[0])
                    progress("  %s", r.err);
                else if (cfg.verbose)
                    progress("  %.0f items/s", ips[v][rep]);
            }
        }
        sw_ingress_stats_get(g_ing_main, &sz1);
        {
            double m[V_N], mc[V_N], ms[V_N], mx[V_N], rng[2];
            double mb = (double)size / 1e6;
            uint64_t d_items = sz1.items_sent - sz0.items_sent;
            uint64_t d_msgs = sz1.messages_sent - sz0.messages_sent;
            /* (before the medians, which sort each side's reps in place) */
            rep_ratio_range(ips[V_RAW], ips[V_RAW_BUF], ips[V_SW], ips[V_SW_ALT],
                            reps < 32 ? reps : 32, &rng[0], &rng[1]);
            for (int v = 0; v < V_N; v++) {
                m[v] = median(ips[v], reps < 32 ? reps : 32);
                mc[v] = median(cpu[v], reps < 32 ? reps : 32);
                ms[v] = median(scpu[v], reps < 32 ? reps : 32);
                mx[v] = median(csw[v], reps < 32 ? reps : 32);
            }
            /* Raw at its best for each metric: the better of its two
             * modes; streamwire's callback rows likewise. */
            double ri, rc, rs, rx, a, b, si_;
            snprintf(param, sizeof(param), "%zu B x %lu, callback", size, cfg.items);
            snprintf(note, sizeof(note), "raw drops %" PRId64 " (nats.c pending limits)%s%.100s",
                     drops[V_RAW] + drops[V_RAW_BUF],
                     errs[V_RAW][0] || errs[V_RAW_BUF][0] || errs[V_SW][0] || errs[V_SW_ALT][0]
                         ? "; "
                         : "",
                     errs[V_RAW][0]       ? errs[V_RAW]
                     : errs[V_RAW_BUF][0] ? errs[V_RAW_BUF]
                     : errs[V_SW][0]      ? errs[V_SW]
                                          : errs[V_SW_ALT]);
            si_ = long_best_row(param, "items/s", m, 0, 0, note, sizeof(note), &ri);
            add_row("1 long stream", param, "MB/s", ri * mb, si_ * mb, 0, 1,
                    "payload bytes only; raw and sw as in items/s");
            note[0] = '\0';
            (void)long_best_row(param, "CPU us/item", mc, 1, 2, note, sizeof(note), &rc);
            note[0] = '\0';
            (void)long_best_row(param, "server CPU us/item", ms, 1, 2, note, sizeof(note), &rs);
            note[0] = '\0';
            (void)long_best_row(param, "ctx switches/item", mx, 1, 2, note, sizeof(note), &rx);
            snprintf(note, sizeof(note),
                     "coalescing: %" PRIu64 " items in %" PRIu64
                     " NATS messages (callback and sw_stream_next runs, default window)",
                     d_items, d_msgs);
            add_row("1 long stream", param, "items/message", 1.0,
                    d_msgs ? (double)d_items / (double)d_msgs : NAN, 0, 1, note);
            snprintf(param, sizeof(param), "%zu B x %lu, sw_stream_next", size, cfg.items);
            add_row("1 long stream", param, "items/s", ri, m[V_SW_BLOCK], 0, 0,
                    errs[V_SW_BLOCK][0] ? errs[V_SW_BLOCK] : "blocking consumer thread");
            add_row("1 long stream", param, "CPU us/item", rc, mc[V_SW_BLOCK], 1, 2, "");
            add_row("1 long stream", param, "ctx switches/item", rx, mx[V_SW_BLOCK], 1, 2, "");
            snprintf(param, sizeof(param), "%zu B, window %u%s", size,
                     cfg.window ? cfg.window : g_default_window,
                     cfg.window ? ", tuned" : " tuned (default)");
            add_row("1 credit cost", param, "items/s", ri, m[V_SW], 0, 0,
                    cfg.send_asap ? "the callback row's send-asap run"
                                  : "the callback row's buffered run");
            snprintf(param, sizeof(param), "%zu B, window %u", size, BIG_WINDOW);
            snprintf(note, sizeof(note), "default/big = %.2f (ingress max_window raised)%s%.120s",
                     m[V_SW] / m[V_SW_BIG], errs[V_SW_BIG][0] ? "; " : "", errs[V_SW_BIG]);
            add_row("1 credit cost", param, "items/s", ri, m[V_SW_BIG], 0, 0, note);
            add_row("1 credit cost", param, "CPU us/item", rc, mc[V_SW_BIG], 1, 2, "");
            add_row("1 credit cost", param, "server CPU us/item", rs, ms[V_SW_BIG], 1, 2, "");
            add_row("1 credit cost", param, "ctx switches/item", rx, mx[V_SW_BIG], 1, 2, "");
            snprintf(param, sizeof(param), "%zu B x %lu, metrics off", size, cfg.items);
            snprintf(note, sizeof(note),
                     "STREAMWIRE_METRICS=off; on vs off: %.1f%% of items/s, %.3f us/item of "
                     "CPU (noise-bound; goal < 2%% judged by callgrind: docs/METRICS.md)",
                     100.0 * (1.0 - m[V_SW] / m[V_SW_NOMET]), mc[V_SW] - mc[V_SW_NOMET]);
            add_row("1 metrics cost", param, "items/s", ri, m[V_SW_NOMET], 0, 0, note);
            add_row("1 metrics cost", param, "CPU us/item", rc, mc[V_SW_NOMET], 1, 2, "");
            if (si < MAX_LIST)
                g_credit_cost[si] = m[V_SW] / m[V_SW_BIG];
            if (size == 64) {
                double ra = mc[V_RAW] + ms[V_RAW], rb = mc[V_RAW_BUF] + ms[V_RAW_BUF];
                g_goal_long64 = si_ / ri;
                g_goal_long64_rng[0] = rng[0];
                g_goal_long64_rng[1] = rng[1];
                g_goal_cpu64_sw =
                    sw_best(mc[V_SW] + ms[V_SW], mc[V_SW_ALT] + ms[V_SW_ALT], 1, &a, &b, NULL);
                g_goal_cpu64_raw = raw_best(ra, rb, 1, NULL);
            }
            if (size == 1024) {
                g_goal_long1k = si_ / ri;
                g_goal_long1k_rng[0] = rng[0];
                g_goal_long1k_rng[1] = rng[1];
            }
        }
    }
    sw_router_stats_get(g_router, &rs1);
    sw_ingress_stats_get(g_ing_main, &is1);
    if (rs1.nats_dropped != rs0.nats_dropped || is1.items_resent != is0.items_resent)
        progress("note: streamwire nats drops %" PRIu64 ", resends %" PRIu64,
                 rs1.nats_dropped - rs0.nats_dropped, is1.items_resent - is0.items_resent);
    bench_alt_world_close();
}
