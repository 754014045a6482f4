/* bench/sc_short.c -- streamwire-bench: scenario 2: many short streams at
 * several concurrencies (closed loop, one thread per concurrent stream).
 *
 * Threads and locks: One thread per concurrent stream; results gathered after
 * joining them. */
#include "bench.h"

/* Raw request-many as written by hand: subscribe to a fresh inbox, publish
 * the request with it as reply subject, take n messages, unsubscribe. */
int
one_raw_stream(unsigned n, size_t size, one_res *o)
{
    natsInbox *inbox = NULL;
    natsSubscription *sub = NULL;
    breq q = {BREQ_MAGIC, K_SEND, n, (uint32_t)size, 0, 0};
    int64_t t0 = now_ns();
    unsigned got = 0;
    natsStatus s = natsInbox_Create(&inbox);
    if (s == NATS_OK)
        s = natsConnection_SubscribeSync(&sub, raw_front(), inbox);
    if (s == NATS_OK)
        s = natsConnection_PublishRequest(raw_front(), raw_req_subj(), inbox, &q, (int)sizeof(q));
    while (s == NATS_OK && got < n) {
        natsMsg *m = NULL;
        s = natsSubscription_NextMsg(&m, sub, 10000);
        if (s != NATS_OK)
            break;
        if (got == 0)
            o->ttfi = now_ns() - t0;
        got++;
        natsMsg_Destroy(m);
    }
    if (s != NATS_OK)
        snprintf(o->err, sizeof(o->err), "raw: %s after %u items", natsStatus_GetText(s), got);
    if (sub != NULL) {
        natsSubscription_Unsubscribe(sub);
        natsSubscription_Destroy(sub);
    }
    natsInbox_Destroy(inbox);
    return s == NATS_OK ? 0 : -1;
}

int
one_sw_stream(unsigned n, size_t size, one_res *o)
{
    sw_request_opts ro;
    sw_stream *s = NULL;
    breq q = {BREQ_MAGIC, K_SEND, n, (uint32_t)size, 0, 0};
    int64_t t0;
    unsigned got = 0;
    int ok = 0;
    sw_err e;
    sw_request_opts_init(&ro);
    ro.endpoint = EP_MAIN;
    ro.instance_id = g_sw_inst;
    ro.credit_window = cfg.window;
    t0 = now_ns();
    if ((e = sw_router_open(&s, g_router, &ro, &q, sizeof(q))) != SW_OK) {
        snprintf(o->err, sizeof(o->err), "sw_router_open: %s", sw_err_name(e));
        return -1;
    }
    for (;;) {
        const sw_item *it = NULL;
        if ((e = sw_stream_next(s, &it, 10000)) != SW_OK) {
            snprintf(o->err, sizeof(o->err), "sw_stream_next: %s after %u items", sw_err_name(e),
                     got);
            break;
        }
        if (it->kind == SW_ITEM_DATA) {
            if (got == 0)
                o->ttfi = now_ns() - t0;
            got++;
            continue;
        }
        ok = it->terminal.status == SW_STATUS_COMPLETED && got == n;
        if (!ok)
            snprintf(o->err, sizeof(o->err), "sw: terminal %s (%s) after %u items",
                     sw_status_name(it->terminal.status), it->terminal.reason, got);
        break;
    }
    sw_stream_close(s);
    return ok ? 0 : -1;
}

static unsigned long g_short_completed; /* of the last run_short, for --callgrind labels */

typedef struct short_ctx {
    int sw;
    unsigned n;
    size_t size;
    latch gate;
    int64_t deadline;
    atomic_ulong completed, errors;
    _Atomic int64_t t_end;
    pthread_mutex_t mu;
    char err[160];
} short_ctx;

static void *
short_thread(void *arg)
{
    short_ctx *c = arg;
    int64_t t, prev;
    latch_wait(&c->gate, -1);
    while (now_ns() < c->deadline) {
        one_res o;
        int rc;
        memset(&o, 0, sizeof(o));
        rc = c->sw ? one_sw_stream(c->n, c->size, &o) : one_raw_stream(c->n, c->size, &o);
        if (rc == 0) {
            atomic_fetch_add(&c->completed, 1);
        } else {
            atomic_fetch_add(&c->errors, 1);
            pthread_mutex_lock(&c->mu);
            if (c->err[0] == '\0')
                snprintf(c->err, sizeof(c->err), "%s", o.err);
            pthread_mutex_unlock(&c->mu);
        }
    }
    t = now_ns();
    prev = atomic_load(&c->t_end);
    while (t > prev && !atomic_compare_exchange_weak(&c->t_end, &prev, t)) {
    }
    return NULL;
}

void
scen_short_fini(void)
{
    bench_alt_world_close();
}

/* Closed loop: conc threads, each runs streams back to back for short_secs. */
double
run_short(int sw, unsigned conc, unsigned long *errors, char *err, size_t errcap, double *cpu,
          double *csw)
{
    int64_t cpu0, csw0;
    short_ctx c;
    pthread_t *th = calloc(conc, sizeof(*th));
    pthread_attr_t at;
    int64_t t0;
    double rate;
    memset(&c, 0, sizeof(c));
    c.sw = sw;
    c.n = cfg.short_items;
    c.size = 64;
    latch_init(&c.gate);
    pthread_mutex_init(&c.mu, NULL);
    atomic_init(&c.completed, 0);
    atomic_init(&c.errors, 0);
    atomic_init(&c.t_end, 0);
    c.deadline = INT64_MAX;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, 256 * 1024);
    if (th == NULL)
        die("out of memory");
    for (unsigned i = 0; i < conc; i++)
        if (pthread_create(&th[i], &at, short_thread, &c) != 0)
            die("pthread_create (thread %u of %u)", i, conc);
    pthread_attr_destroy(&at);
    sleep_ms(conc > 64 ? 200 : 20);
    t0 = now_ns();
    cpu0 = self_cpu_us();
    csw0 = self_csw();
    c.deadline = t0 + (int64_t)(cfg.short_secs * 1e9);
    latch_set(&c.gate);
    for (unsigned i = 0; i < conc; i++)
        pthread_join(th[i], NULL);
    free(th);
    *cpu = atomic_load(&c.completed)
               ? (double)(self_cpu_us() - cpu0) / (double)atomic_load(&c.completed)
               : NAN;
    *csw = atomic_load(&c.completed)
               ? (double)(self_csw() - csw0) / (double)atomic_load(&c.completed)
               : NAN;
    g_short_completed = atomic_load(&c.completed);
    rate = (double)atomic_load(&c.completed) / ((double)(atomic_load(&c.t_end) - t0) / 1e9);
    *errors = atomic_load(&c.errors);
    snprintf(err, errcap, "%s", c.err);
    latch_fini(&c.gate);
    pthread_mutex_destroy(&c.mu);
    return rate;
}

void
scen_short(void)
{
    /* Sides: raw send-asap, raw buffered, streamwire send-asap, streamwire
     * buffered (one of the two streamwire sides is the main world, the
     * other bench_alt_world). */
    static const char *side[4] = {"raw send-asap", "raw buffered", "sw send-asap", "sw buffered"};
    bench_world *alt_w = cfg.side != 1 ? bench_alt_world() : NULL; /* not --side raw */
    for (int ci = 0; ci < cfg.nconc; ci++) {
        unsigned conc = cfg.conc[ci];
        double v[4][32], cpu[4][32], csw[4][32];
        unsigned long errs[4] = {0, 0, 0, 0};
        char err[4][160];
        char param[48], note[300];
        memset(err, 0, sizeof(err));
        for (unsigned rep = 0; rep < cfg.reps && rep < 32; rep++) {
            for (int k = 0; k < 4; k++) {
                int sw = k >= 2, alt = sw && (k == 2) != (cfg.send_asap != 0);
                sw_router *keep_r = g_router;
                const char *keep_i = g_sw_inst;
                unsigned long e = 0;
                char msg[160];
                if (cfg.side == (sw ? 1 : 2)) {
                    v[k][rep] = cpu[k][rep] = csw[k][rep] = NAN;
                    continue;
                }
                progress("2 short streams (%u items) at concurrency %u: %s, rep %u/%u",
                         cfg.short_items, conc, side[k], rep + 1, cfg.reps);
                g_raw_mode = k == 1 ? RAW_BUFFERED : RAW_ASAP;
                if (alt) {
                    g_router = alt_w->router;
                    g_sw_inst = INST_ALT;
                }
                if (cfg.callgrind) {
                    CALLGRIND_ZERO_STATS;
                    CALLGRIND_START_INSTRUMENTATION;
                }
                v[k][rep] = run_short(sw, conc, &e, msg, sizeof(msg), &cpu[k][rep], &csw[k][rep]);
                g_router = keep_r;
                g_sw_inst = keep_i;
                if (cfg.callgrind) {
                    char label[96];
                    CALLGRIND_STOP_INSTRUMENTATION;
                    snprintf(label, sizeof(label), "short c%u %s rep%u streams=%lu", conc, side[k],
                             rep + 1, g_short_completed);
                    CALLGRIND_DUMP_STATS_AT(label);
                }
                g_raw_mode = RAW_ASAP;
                errs[k] += e;
                if (e && !err[k][0])
                    snprintf(err[k], sizeof(err[k]), "%s", msg);
                if (e)
                    progress("  %lu errors: %s", e, msg);
                else if (cfg.verbose)
                    progress("  %.0f streams/s", v[k][rep]);
            }
        }
        {
            unsigned n = cfg.reps < 32 ? cfg.reps : 32;
            double rng[2]; /* (before the medians, which sort each side's reps in place) */
            rep_ratio_range(v[0], v[1], v[2], v[3], n, &rng[0], &rng[1]);
            double ra = median(v[0], n), rb = median(v[1], n);
            double sa = median(v[2], n), sb = median(v[3], n);
            double ca = median(cpu[0], n), cb = median(cpu[1], n);
            double da = median(cpu[2], n), db = median(cpu[3], n);
            double xa = median(csw[0], n), xb = median(csw[1], n);
            double ya = median(csw[2], n), yb = median(csw[3], n);
            int wr, wc, wx, vr, vc, vx;
            double raw = raw_best(ra, rb, 0, &wr), rc = raw_best(ca, cb, 1, &wc),
                   rx = raw_best(xa, xb, 1, &wx);
            double sw = raw_best(sa, sb, 0, &vr), sc = raw_best(da, db, 1, &vc),
                   sx = raw_best(ya, yb, 1, &vx);
            const char *e1 = err[2][0] ? err[2] : err[3][0] ? err[3] : err[0][0] ? err[0] : err[1];
            snprintf(param, sizeof(param), "%u x 64 B, concurrency %u", cfg.short_items, conc);
            snprintf(note, sizeof(note),
                     "raw subscribes per request; errors raw %lu sw %lu%s%.100s", errs[0] + errs[1],
                     errs[2] + errs[3], e1[0] ? ": " : "", e1);
            raw_best_note(note, sizeof(note), ra, rb, wr, 0);
            best_note(note, sizeof(note), "sw", sa, sb, vr, 0);
            add_row("2 short streams", param, "streams/s", raw, sw, 0, 0, note);
            note[0] = '\0';
            raw_best_note(note, sizeof(note), ca, cb, wc, 1);
            best_note(note, sizeof(note), "sw", da, db, vc, 1);
            add_row("2 short streams", param, "CPU us/stream", rc, sc, 1, 1, note);
            note[0] = '\0';
            raw_best_note(note, sizeof(note), xa, xb, wx, 1);
            best_note(note, sizeof(note), "sw", ya, yb, vx, 1);
            add_row("2 short streams", param, "ctx switches/stream", rx, sx, 1, 1, note);
            if (conc == 64) {
                g_goal_short64 = sw / raw;
                g_goal_short64_rng[0] = rng[0];
                g_goal_short64_rng[1] = rng[1];
            }
            if (conc == 1) {
                g_goal_short1 = sw / raw;
                g_goal_short1_rng[0] = rng[0];
                g_goal_short1_rng[1] = rng[1];
            }
        }
    }
    /* Its threads would only add noise to the scenarios that follow. */
    scen_short_fini();
}
