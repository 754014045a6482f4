/* bench/sc_first_item.c -- streamwire-bench: scenario 4: time to first item.
 *
 * Threads and locks: Main thread plus nats.c and library threads; no locks of
 * its own. */
#include "bench.h"

/* ------------------------------------------------------------------ 4: time to first item */

/* Sides: 0 raw send-asap, 1 raw buffered, 2 streamwire, interleaved. */
void
scen_ttfi(void)
{
    unsigned n = cfg.ttfi_n;
    int64_t *v[3];
    size_t got[3] = {0, 0, 0};
    unsigned long errs[3] = {0, 0, 0};
    char err[160] = "", param[48], note[200];
    static const double qs[2] = {0.5, 0.99};
    static const char *qn[2] = {"p50 us", "p99 us"};
    for (int k = 0; k < 3; k++)
        if ((v[k] = calloc(n, sizeof(int64_t))) == NULL)
            die("out of memory");
    progress("4 time to first item over %u streams (raw and sw interleaved)", n);
    for (unsigned i = 0; i < n + 20; i++) {
        for (int k = 0; k < 3; k++) {
            one_res o;
            int rc;
            memset(&o, 0, sizeof(o));
            g_raw_mode = k == 1 ? RAW_BUFFERED : RAW_ASAP;
            rc = k == 2 ? one_sw_stream(1, 64, &o) : one_raw_stream(1, 64, &o);
            g_raw_mode = RAW_ASAP;
            if (rc != 0) {
                errs[k]++;
                if (!err[0])
                    snprintf(err, sizeof(err), "%s", o.err);
                continue;
            }
            if (i >= 20) /* warm-up */
                v[k][got[k]++] = o.ttfi;
        }
    }
    for (int k = 0; k < 3; k++)
        qsort(v[k], got[k], sizeof(int64_t), cmp_i64);
    snprintf(param, sizeof(param), "%u sequential streams", n);
    for (int i = 0; i < 2; i++) {
        double ra = pct(v[0], got[0], qs[i]) / 1e3, rb = pct(v[1], got[1], qs[i]) / 1e3;
        int w;
        double a = raw_best(ra, rb, 1, &w);
        if (i == 0)
            snprintf(note, sizeof(note),
                     "open -> first item; raw: subscribe + publish per request; errors raw %lu "
                     "sw %lu%s%.60s",
                     errs[0] + errs[1], errs[2], err[0] ? ": " : "", err);
        else
            note[0] = '\0';
        raw_best_note(note, sizeof(note), ra, rb, w, 1);
        add_row("4 time to first item", param, qn[i], a, pct(v[2], got[2], qs[i]) / 1e3, 1, 1,
                note);
    }
    for (int k = 0; k < 3; k++)
        free(v[k]);
}
