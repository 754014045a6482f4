/* bench/sc_latency.c -- streamwire-bench: scenario 3: per-item latency at a
 * fixed rate (raw and streamwire alternating in short segments).
 *
 * Threads and locks: Main thread plus nats.c and library threads; no locks of
 * its own. */
#include "bench.h"

/* ------------------------------------------------------------------ 3: latency */

/* Raw (in both publish modes) and streamwire alternate in short segments (a
 * new stream each), so a burst of load from elsewhere on a shared machine
 * hits all alike. Sides: 0 raw send-asap, 1 raw buffered, 2 streamwire. */
/* The p99 of one segment's samples (sorts that slice in place). */
static double
seg_p99(int64_t *v, unsigned long n)
{
    qsort(v, n, sizeof(int64_t), cmp_i64);
    return pct(v, n, 0.99);
}

/* The items with a breakdown (not STAGE_NONE) of v[0..n), packed to the
 * front and sorted; returns how many. */
static unsigned long
pack_sorted(int64_t *v, unsigned long n)
{
    unsigned long m = 0;
    for (unsigned long i = 0; i < n; i++)
        if (v[i] != STAGE_NONE)
            v[m++] = v[i];
    qsort(v, m, sizeof(int64_t), cmp_i64);
    return m;
}

/* The p99 gap streamwire's own time alone makes: raw send-asap's samples
 * (raw[0..nraw), sorted), each with one of streamwire's own times added
 * (own[0..m), in item order: the pairing is arbitrary), p99 of those less
 * raw's p99. Both sides' wire is raw's here, so the wire's run-to-run
 * noise (tens of us at p99, the same code on both sides) drops out of the
 * comparison. us; NAN without samples. */
static double
own_p99_gap(const int64_t *raw, unsigned long nraw, const int64_t *own, unsigned long m)
{
    int64_t *sum;
    double gap;
    if (nraw == 0 || m == 0)
        return NAN;
    if ((sum = malloc(nraw * sizeof(int64_t))) == NULL)
        die("out of memory");
    for (unsigned long j = 0; j < nraw; j++)
        sum[j] = raw[j] + own[j % m];
    qsort(sum, nraw, sizeof(int64_t), cmp_i64);
    gap = (pct(sum, nraw, 0.99) - pct(raw, nraw, 0.99)) / 1e3;
    free(sum);
    return gap;
}

/* The breakdown's rows (bench/stages.c): raw send-asap against
 * streamwire, p50 and p99 of each part, and the p99 gap streamwire's own
 * time makes on raw's samples (raw: raw send-asap's pooled samples,
 * sorted). Returns the p99 of streamwire's own time per item (send +
 * receive side, us) for the goal line; *gap: that gap (us). */
static double
stage_rows(const char *param, stage_times st[2], unsigned long n, const int64_t *raw,
           unsigned long nraw, double *gap)
{
    static const char *part[4] = {"send side", "publish call", "wire", "receive side"};
    static const char *what[4] = {
        "stamp -> nats.c publish: the library's time (raw: none)",
        "nats.c publish (a socket write)",
        "publish return -> nats.c callback: server, wake-ups; the same code on both sides",
        "nats.c callback -> consumer callback: the library's time (raw: none)"};
    double lib99 = NAN;
    int64_t *own = calloc(n, sizeof(int64_t)); /* streamwire's send + receive, per item */
    if (own == NULL)
        die("out of memory");
    unsigned long nown = 0;
    for (unsigned long i = 0; i < n; i++) /* packed, in item order */
        if (st[1].send[i] != STAGE_NONE)
            own[nown++] = st[1].send[i] + st[1].recv[i];
    *gap = own_p99_gap(raw, nraw, own, nown);
    lib99 = pct(own, pack_sorted(own, nown), 0.99) / 1e3;
    free(own);
    for (int p = 0; p < 4; p++) {
        unsigned long m[2];
        int64_t *v[2];
        for (int k = 0; k < 2; k++) {
            v[k] = p == 0 ? st[k].send : p == 1 ? st[k].pub : p == 2 ? st[k].wire : st[k].recv;
            m[k] = pack_sorted(v[k], n);
        }
        for (int q = 0; q < 2; q++) {
            char metric[48], note[200];
            double a = pct(v[0], m[0], q ? 0.99 : 0.50) / 1e3;
            double b = pct(v[1], m[1], q ? 0.99 : 0.50) / 1e3;
            snprintf(metric, sizeof(metric), "%s p%s us", part[p], q ? "99" : "50");
            if (q == 0)
                snprintf(note, sizeof(note), "%s; items with a breakdown: raw %lu, sw %lu of %lu",
                         what[p], m[0], m[1], n);
            else
                note[0] = '\0';
            add_row("3 item latency", param, metric, a, b, 1, 2, note);
        }
    }
    add_row("3 item latency", param, "own time p99 gap us", NAN, *gap, 1, 1,
            "p99 of raw send-asap's samples with streamwire's own time (send + receive side) "
            "added, less raw's p99: the wire's noise left out");
    return lib99;
}

static int
cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* How far the pooled p99 gap (streamwire's p99 less raw's better mode's)
 * would move if the run were repeated: the segments are drawn again with
 * replacement, the same draw for every side (a segment of each side ran
 * next to the others in time, so a burst stays paired), SWB_BOOT times,
 * and *lo / *hi get the 5th and 95th percentiles of the gaps (us). The
 * draws come from a fixed seed, so a dump gives the same interval twice.
 * A percentile bootstrap over ten-odd clusters is approximate (it tends to
 * come out narrow), so it reads "about 90 %". NAN below SWB_BOOT_MIN_SEGS
 * segments. lat[k] + seg * per holds recv[k][seg] samples. */
#define SWB_BOOT 200
#define SWB_BOOT_MIN_SEGS 8 /* fewer: a handful of possible draws, no interval */
static void
p99_gap_ci(int64_t *const lat[3], unsigned long *const recv[3], unsigned segs, unsigned long per,
           double *lo, double *hi)
{
    double gaps[SWB_BOOT];
    int64_t *pool[3];
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    unsigned ok = 0;
    *lo = *hi = NAN;
    if (segs < SWB_BOOT_MIN_SEGS)
        return;
    for (int k = 0; k < 3; k++)
        if ((pool[k] = malloc((size_t)segs * per * sizeof(int64_t))) == NULL)
            die("out of memory");
    for (unsigned b = 0; b < SWB_BOOT; b++) {
        unsigned long m[3] = {0, 0, 0};
        double p[3], raw;
        for (unsigned i = 0; i < segs; i++) {
            unsigned seg;
            x ^= x << 13; /* xorshift64 */
            x ^= x >> 7;
            x ^= x << 17;
            seg = (unsigned)(x % segs);
            for (int k = 0; k < 3; k++) {
                memcpy(pool[k] + m[k], lat[k] + seg * per, recv[k][seg] * sizeof(int64_t));
                m[k] += recv[k][seg];
            }
        }
        for (int k = 0; k < 3; k++) {
            qsort(pool[k], m[k], sizeof(int64_t), cmp_i64);
            p[k] = pct(pool[k], m[k], 0.99) / 1e3;
        }
        raw = raw_best(p[0], p[1], 1, NULL);
        if (!isnan(p[2]) && !isnan(raw))
            gaps[ok++] = p[2] - raw;
    }
    for (int k = 0; k < 3; k++)
        free(pool[k]);
    if (ok < 20)
        return;
    qsort(gaps, ok, sizeof(double), cmp_dbl);
    *lo = gaps[(size_t)(0.05 * ok)];
    *hi = gaps[(size_t)(0.95 * ok) - 1];
}

void
scen_latency(void)
{
    unsigned long n = (unsigned long)(cfg.rate * cfg.lat_secs);
    unsigned segs = cfg.lat_segs ? cfg.lat_segs : cfg.quick ? 2 : 10;
    unsigned long per, got[3] = {0, 0, 0}, *recv[3];
    double csw[3] = {0, 0, 0}, cpu[3] = {0, 0, 0}, *diff[2];
    int64_t *lat[3];
    stage_times st[2]; /* the breakdown: raw send-asap, streamwire */
    char err[3][160];
    char param[64], note[200];
    int w99 = 0;
    double ci_lo, ci_hi;        /* the pooled p99 gap's 90 % interval, segments drawn again */
    unsigned ndiff[2] = {0, 0}; /* segments compared, against each raw mode */
    if (n < 10 * segs)
        n = 10 * segs;
    per = n / segs;
    n = per * segs;
    for (int k = 0; k < 3; k++)
        if ((lat[k] = calloc(n, sizeof(int64_t))) == NULL ||
            (recv[k] = calloc(segs, sizeof(unsigned long))) == NULL)
            die("out of memory");
    for (int k = 0; k < 2; k++)
        if ((diff[k] = calloc(segs, sizeof(double))) == NULL ||
            (st[k].send = calloc(n, sizeof(int64_t))) == NULL ||
            (st[k].recv = calloc(n, sizeof(int64_t))) == NULL ||
            (st[k].pub = calloc(n, sizeof(int64_t))) == NULL ||
            (st[k].wire = calloc(n, sizeof(int64_t))) == NULL)
            die("out of memory");
    memset(err, 0, sizeof(err));
    idle_bg bg;
    progress("3 latency at %u items/s, %.1f s per side in %u alternating segments%s", cfg.rate,
             cfg.lat_secs, segs, cfg.lat_idle ? ", with idle streams at the frontend" : "");
    idle_background_open(&bg, cfg.lat_idle);
    /* Each segment's samples have their own slots (per of them): a lost
     * item leaves a 0 at the end of its segment's. */
    for (unsigned seg = 0; seg < segs; seg++) {
        for (int k = 0; k < 3; k++) {
            stage_times seg_st;
            stream_run r;
            memset(&r, 0, sizeof(r));
            r.n = per;
            r.size = 64;
            r.rate = cfg.rate;
            r.lat = lat[k] + seg * per;
            if (k != 1) { /* raw buffered: no breakdown (its publish only queues) */
                stage_times *t = &st[k == 2];
                r.stage = &seg_st;
                seg_st.send = t->send + seg * per;
                seg_st.recv = t->recv + seg * per;
                seg_st.pub = t->pub + seg * per;
                seg_st.wire = t->wire + seg * per;
            }
            if (k == 2) {
                run_sw_stream(&r, EP_MAIN, INST_MAIN, cfg.window, 0);
            } else {
                g_raw_mode = k == 1 ? RAW_BUFFERED : RAW_ASAP;
                run_raw_stream(&r);
                g_raw_mode = RAW_ASAP;
            }
            recv[k][seg] = r.received < per ? r.received : per;
            got[k] += recv[k][seg];
            csw[k] += r.csw;
            cpu[k] += r.cpu_us;
            if (r.err[0] && !err[k][0]) {
                snprintf(err[k], sizeof(err[k]), "%s", r.err);
                progress("  %s", r.err);
            }
        }
    }
    idle_background_close(&bg);
    for (int k = 0; k < 3; k++)
        progress("  %s: %.2f context switches and %.1f us of this process's CPU per item",
                 k == 0   ? "raw send-asap"
                 : k == 1 ? "raw buffered"
                          : "streamwire",
                 csw[k] / (double)(got[k] ? got[k] : 1), cpu[k] / (double)(got[k] ? got[k] : 1));
    if (cfg.lat_dump != NULL) {
        /* every sample, in the order received: segment, index in it, then
         * the three sides' ns (a segment's lost items: 0s at its end) */
        FILE *f = fopen(cfg.lat_dump, "w");
        if (f == NULL)
            die("--latency-dump %s: %s", cfg.lat_dump, strerror(errno));
        fprintf(f, "segment index raw_asap_ns raw_buffered_ns streamwire_ns\n");
        for (unsigned long i = 0; i < n; i++)
            fprintf(f, "%lu %lu %lld %lld %lld\n", i / per, i % per, (long long)lat[0][i],
                    (long long)lat[1][i], (long long)lat[2][i]);
        if (fclose(f) != 0)
            die("--latency-dump %s: %s", cfg.lat_dump, strerror(errno));
    }
    p99_gap_ci(lat, recv, segs, per, &ci_lo, &ci_hi);
    /* Segment by segment, streamwire's p99 less each raw mode's: a burst
     * of load from elsewhere lands in a segment or two, and the median of
     * the differences does not move with it as the pooled p99 does. */
    for (unsigned seg = 0; seg < segs; seg++) {
        double p[3];
        for (int k = 0; k < 3; k++)
            p[k] = seg_p99(lat[k] + seg * per, recv[k][seg]) / 1e3;
        for (int k = 0; k < 2; k++) /* not where a side received nothing */
            if (!isnan(p[k]) && !isnan(p[2]))
                diff[k][ndiff[k]++] = p[2] - p[k];
    }
    for (int k = 0; k < 2; k++)
        qsort(diff[k], ndiff[k], sizeof(double), cmp_dbl);
    /* the samples of each side, together (the segments' slots packed) */
    for (int k = 0; k < 3; k++) {
        unsigned long m = 0;
        for (unsigned seg = 0; seg < segs; seg++) {
            memmove(lat[k] + m, lat[k] + seg * per, recv[k][seg] * sizeof(int64_t));
            m += recv[k][seg];
        }
        qsort(lat[k], got[k], sizeof(int64_t), cmp_i64);
    }
    if (cfg.lat_idle)
        snprintf(param, sizeof(param), "64 B at %u/s, %lu items, %u idle", cfg.rate, n,
                 cfg.lat_idle);
    else
        snprintf(param, sizeof(param), "64 B at %u/s, %lu items", cfg.rate, n);
    {
        static const double qs[4] = {0.50, 0.99, 0.999, 1.0};
        static const char *qn[4] = {"p50 us", "p99 us", "p99.9 us", "max us"};
        for (int i = 0; i < 4; i++) {
            double ra = pct(lat[0], got[0], qs[i]) / 1e3, rb = pct(lat[1], got[1], qs[i]) / 1e3;
            double b = pct(lat[2], got[2], qs[i]) / 1e3;
            int w;
            double a = raw_best(ra, rb, 1, &w);
            if (i == 1) {
                g_goal_p99_raw = a;
                g_goal_p99_sw = b;
                w99 = w;
                g_goal_p99_ci_lo = ci_lo;
                g_goal_p99_ci_hi = ci_hi;
                if (isnan(ci_lo))
                    snprintf(note, sizeof(note),
                             "sw - raw = %+.1f us (goal <= +20); no interval (fewer than %d "
                             "segments)",
                             b - a, SWB_BOOT_MIN_SEGS);
                else
                    snprintf(note, sizeof(note),
                             "sw - raw = %+.1f us (goal <= +20); ~90%% interval %+.1f..%+.1f us "
                             "(segments drawn again)",
                             b - a, ci_lo, ci_hi);
            } else if (i == 0) {
                snprintf(note, sizeof(note),
                         "send -> callback, monotonic stamp in payload; %u alternating segments",
                         segs);
            } else {
                note[0] = '\0';
            }
            if (i == 0 && (err[0][0] || err[1][0] || err[2][0]))
                snprintf(note, sizeof(note), "%s",
                         err[0][0]   ? err[0]
                         : err[1][0] ? err[1]
                                     : err[2]);
            raw_best_note(note, sizeof(note), ra, rb, w, 1);
            add_row("3 item latency", param, qn[i], a, b, 1, 1, note);
        }
    }
    {
        /* against the raw mode whose pooled p99 was the better */
        int k = w99 == RAW_BUFFERED ? 1 : 0;
        const double *d = diff[k];
        unsigned m = ndiff[k];
        double med = m == 0 ? NAN : m % 2 == 1 ? d[m / 2] : (d[m / 2 - 1] + d[m / 2]) / 2;
        snprintf(note, sizeof(note),
                 "median over %u segments of sw p99 - raw p99 (raw %s); range %+.1f..%+.1f us", m,
                 k == 1 ? "buffered" : "send-asap", m ? d[0] : NAN, m ? d[m - 1] : NAN);
        g_goal_p99_seg = med;
        add_row("3 item latency", param, "p99 sw-raw seg. med us", NAN, med, 1, 1, note);
    }
    /* (lat[0]: raw send-asap's samples, pooled and sorted above) */
    g_goal_p99_lib = stage_rows(param, st, n, lat[0], got[0], &g_goal_p99_own_gap);
    for (int k = 0; k < 3; k++) {
        free(lat[k]);
        free(recv[k]);
    }
    for (int k = 0; k < 2; k++) {
        free(diff[k]);
        free(st[k].send);
        free(st[k].recv);
        free(st[k].pub);
        free(st[k].wire);
    }
}
