/* tests/unit/test_metrics.c -- common/metrics.c: histogram buckets, the
 * Prometheus text builder (families grouped whatever the number of sources,
 * label escaping, value formatting), the source list. No server: sources
 * here are plain functions. The integration test test_metrics_e2e renders
 * real routers and ingresses and checks the output with promtool. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/metrics.h"

static size_t
count(const char *hay, const char *needle)
{
    size_t n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p++)
        n++;
    return n;
}

static void
test_hist_buckets(void **state)
{
    static const double b[3] = {0.001, 0.01, 0.1};
    swi_hist h;
    (void)state;
    swi_hist_init(&h, b, 3);
    swi_hist_observe_ns(&h, 500000);     /* 0.5 ms -> le 0.001 */
    swi_hist_observe_ns(&h, 1000000);    /* exactly 1 ms -> le 0.001 (upper bound inclusive) */
    swi_hist_observe_ns(&h, 5000000);    /* 5 ms -> le 0.01 */
    swi_hist_observe_ns(&h, 2000000000); /* 2 s -> +Inf */
    swi_hist_observe_ns(&h, -5);         /* clamped to 0 */
    assert_int_equal(h.counts[0], 3);
    assert_int_equal(h.counts[1], 1);
    assert_int_equal(h.counts[2], 0);
    assert_int_equal(h.counts[3], 1);
    assert_int_equal(h.sum_ns, 500000 + 1000000 + 5000000 + 2000000000ULL);
}

typedef struct fake {
    const char *name;
    double v;
    swi_hist h;
} fake;

static void
fake_render(swi_prom *p, void *obj)
{
    fake *f = obj;
    swi_label l[2] = {{"src", f->name}, {"kind", "a\"b\\c\nd"}};
    swi_prom_value(p, "t_total", "counter", "A counter.", l, 1, f->v);
    swi_prom_value(p, "t_gauge", "gauge", "A gauge.", l, 2, 0.25);
    swi_prom_hist(p, "t_seconds", "A histogram.", l, 1, &f->h);
}

static void
test_render_grouped_and_escaped(void **state)
{
    static const double b[2] = {0.001, 1};
    fake a = {"a", 7, {0}}, bb = {"b", 12345678901.0, {0}};
    sw_metrics *m;
    char *out = NULL;
    size_t len = 0;
    (void)state;
    swi_hist_init(&a.h, b, 2);
    swi_hist_init(&bb.h, b, 2);
    swi_hist_observe_ns(&a.h, 100);
    swi_hist_observe_ns(&a.h, 5000000000LL);
    assert_int_equal(sw_metrics_create(&m), SW_OK);
    assert_int_equal(swi_metrics_add(m, &a, fake_render), SW_OK);
    assert_int_equal(swi_metrics_add(m, &bb, fake_render), SW_OK);
    assert_int_equal(swi_metrics_add(m, &bb, fake_render), SW_EEXIST);
    assert_int_equal(sw_metrics_render(m, &out, &len), SW_OK);
    assert_int_equal(strlen(out), len);
    /* one HELP and one TYPE per family, two sources' samples under it */
    assert_int_equal(count(out, "# TYPE t_total counter\n"), 1);
    assert_int_equal(count(out, "# HELP t_total A counter.\n"), 1);
    assert_int_equal(count(out, "# TYPE t_seconds histogram\n"), 1);
    assert_non_null(strstr(out, "# TYPE t_total counter\nt_total{src=\"a\"} 7\nt_total{src=\"b\"} "
                                "12345678901\n"));
    /* escaping of \", \\ and newline in a label value; non-integers */
    assert_non_null(strstr(out, "t_gauge{src=\"a\",kind=\"a\\\"b\\\\c\\nd\"} 0.25\n"));
    /* histogram: cumulative buckets, +Inf equals _count, sum in seconds */
    assert_non_null(strstr(out, "t_seconds_bucket{src=\"a\",le=\"0.001\"} 1\n"
                                "t_seconds_bucket{src=\"a\",le=\"1\"} 1\n"
                                "t_seconds_bucket{src=\"a\",le=\"+Inf\"} 2\n"
                                "t_seconds_sum{src=\"a\"} 5.0000001000000003\n"
                                "t_seconds_count{src=\"a\"} 2\n"));
    assert_non_null(strstr(out, "t_seconds_count{src=\"b\"} 0\n"));
    /* families in first-seen order */
    assert_true(strstr(out, "# TYPE t_total") < strstr(out, "# TYPE t_gauge"));
    assert_true(strstr(out, "# TYPE t_gauge") < strstr(out, "# TYPE t_seconds"));
    free(out);
    /* removing a source removes its samples */
    assert_int_equal(sw_metrics_remove(m, &a), SW_OK);
    assert_int_equal(sw_metrics_remove(m, &a), SW_ENOTFOUND);
    assert_int_equal(sw_metrics_render(m, &out, &len), SW_OK);
    assert_null(strstr(out, "src=\"a\""));
    assert_non_null(strstr(out, "src=\"b\""));
    free(out);
    assert_int_equal(sw_metrics_remove(m, &bb), SW_OK);
    assert_int_equal(sw_metrics_render(m, &out, &len), SW_OK);
    assert_int_equal(len, 0);
    assert_string_equal(out, "");
    free(out);
    sw_metrics_destroy(m);
}

static void
test_bad_arguments(void **state)
{
    sw_metrics *m;
    char *out;
    size_t len;
    (void)state;
    assert_int_equal(sw_metrics_create(NULL), SW_EINVAL);
    assert_int_equal(sw_metrics_create(&m), SW_OK);
    assert_int_equal(sw_metrics_render(NULL, &out, &len), SW_EINVAL);
    assert_int_equal(sw_metrics_render(m, NULL, &len), SW_EINVAL);
    assert_int_equal(sw_metrics_add_router(m, NULL), SW_EINVAL);
    assert_int_equal(sw_metrics_add_ingress(NULL, NULL), SW_EINVAL);
    assert_int_equal(sw_metrics_remove(m, NULL), SW_EINVAL);
    sw_metrics_destroy(m);
    sw_metrics_destroy(NULL);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hist_buckets),
        cmocka_unit_test(test_render_grouped_and_escaped),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
