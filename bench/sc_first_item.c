/* bench/sc_first_item.c -- streamwire-bench: scenario 4: time to first item.
 *
 * Threads and locks: Main thread plus nats.c and library threads; no locks of
 * its own. */
#include "bench.h"

/* ------------------------------------------------------------------ 4: time to first item */

void
scen_ttfi(void)
{
    unsigned n = cfg.ttfi_n;
    int64_t *v[2];
    size_t got[2] = {0, 0};
    unsigned long errs[2] = {0, 0};
    char err[160] = "", param[48], note[200];
    v[0] = calloc(n, sizeof(int64_t));
    v[1] = calloc(n, sizeof(int64_t));
    if (v[0] == NULL || v[1] == NULL)
        die("out of memory");
    progress("4 time to first item over %u streams (raw and sw interleaved)", n);
    for (unsigned i = 0; i < n + 20; i++) {
        for (int sw = 0; sw < 2; sw++) {
            one_res o;
            int rc;
            memset(&o, 0, sizeof(o));
            rc = sw ? one_sw_stream(1, 64, &o) : one_raw_stream(1, 64, &o);
            if (rc != 0) {
                errs[sw]++;
                if (!err[0])
                    snprintf(err, sizeof(err), "%s", o.err);
                continue;
            }
            if (i >= 20) /* warm-up */
                v[sw][got[sw]++] = o.ttfi;
        }
    }
    qsort(v[0], got[0], sizeof(int64_t), cmp_i64);
    qsort(v[1], got[1], sizeof(int64_t), cmp_i64);
    snprintf(param, sizeof(param), "%u sequential streams", n);
    snprintf(
        note, sizeof(note),
        "open -> first item; raw: subscribe + publish per request; errors raw %lu sw %lu%s%.80s",
        errs[0], errs[1], err[0] ? ": " : "", err);
    add_row("4 time to first item", param, "p50 us", pct(v[0], got[0], 0.5) / 1e3,
            pct(v[1], got[1], 0.5) / 1e3, 1, 1, note);
    add_row("4 time to first item", param, "p99 us", pct(v[0], got[0], 0.99) / 1e3,
            pct(v[1], got[1], 0.99) / 1e3, 1, 1, "");
    free(v[0]);
    free(v[1]);
}
