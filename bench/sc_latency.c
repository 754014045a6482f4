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
void
scen_latency(void)
{
    unsigned long n = (unsigned long)(cfg.rate * cfg.lat_secs);
    unsigned segs = cfg.quick ? 2 : 10;
    unsigned long per, got[3] = {0, 0, 0};
    int64_t *lat[3];
    char err[3][160];
    char param[64], note[200];
    if (n < 10 * segs)
        n = 10 * segs;
    per = n / segs;
    n = per * segs;
    for (int k = 0; k < 3; k++)
        if ((lat[k] = calloc(n, sizeof(int64_t))) == NULL)
            die("out of memory");
    memset(err, 0, sizeof(err));
    progress("3 latency at %u items/s, %.1f s per side in %u alternating segments", cfg.rate,
             cfg.lat_secs, segs);
    for (unsigned seg = 0; seg < segs; seg++) {
        for (int k = 0; k < 3; k++) {
            stream_run r;
            memset(&r, 0, sizeof(r));
            r.n = per;
            r.size = 64;
            r.rate = cfg.rate;
            r.lat = lat[k] + got[k];
            if (k == 2) {
                run_sw_stream(&r, EP_MAIN, INST_MAIN, cfg.window, 0);
            } else {
                g_raw_mode = k == 1 ? RAW_BUFFERED : RAW_ASAP;
                run_raw_stream(&r);
                g_raw_mode = RAW_ASAP;
            }
            got[k] += r.received < per ? r.received : per;
            if (r.err[0] && !err[k][0]) {
                snprintf(err[k], sizeof(err[k]), "%s", r.err);
                progress("  %s", r.err);
            }
        }
    }
    for (int k = 0; k < 3; k++)
        qsort(lat[k], got[k], sizeof(int64_t), cmp_i64);
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
                snprintf(note, sizeof(note), "sw - raw = %+.1f us (goal <= +20)", b - a);
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
    for (int k = 0; k < 3; k++)
        free(lat[k]);
}
