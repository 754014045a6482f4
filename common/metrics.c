/* common/metrics.c -- see metrics.h: histograms, the Prometheus text
 * builder, and the sw_metrics source list. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/metrics.h"

/* ---------------------------------------------------------------- histograms */

const double swi_hist_latency_bounds[] = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                          0.01,    0.025,  0.05,    0.1,    0.25,  0.5,    1,
                                          2.5,     5,      10,      30,     60};
const size_t swi_hist_latency_nb = sizeof(swi_hist_latency_bounds) / sizeof(double);

int64_t
swi_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void
swi_hist_init(swi_hist *h, const double *bounds, size_t nb)
{
    memset(h, 0, sizeof(*h));
    h->bounds = bounds;
    h->nb = nb < SWI_HIST_MAX_BUCKETS ? nb : SWI_HIST_MAX_BUCKETS;
}

void
swi_hist_observe_ns(swi_hist *h, int64_t ns)
{
    double s;
    size_t i = 0;
    if (ns < 0)
        ns = 0;
    s = (double)ns / 1e9;
    while (i < h->nb && s > h->bounds[i])
        i++;
    __atomic_fetch_add(&h->counts[i], 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&h->sum_ns, (uint64_t)ns, __ATOMIC_RELAXED);
}

/* ---------------------------------------------------------------- text builder */

typedef struct prom_family {
    char name[96];
    const char *type, *help;
    char *buf;
    size_t len, cap;
} prom_family;

struct swi_prom {
    prom_family *f;
    size_t n, cap;
    int oom;
};

static prom_family *
prom_family_get(swi_prom *p, const char *name, const char *type, const char *help)
{
    for (size_t i = 0; i < p->n; i++)
        if (strcmp(p->f[i].name, name) == 0)
            return &p->f[i];
    if (p->n == p->cap) {
        size_t ncap = p->cap ? p->cap * 2 : 32;
        prom_family *nf = realloc(p->f, ncap * sizeof(*nf));
        if (nf == NULL) {
            p->oom = 1;
            return NULL;
        }
        p->f = nf;
        p->cap = ncap;
    }
    memset(&p->f[p->n], 0, sizeof(p->f[p->n]));
    snprintf(p->f[p->n].name, sizeof(p->f[p->n].name), "%s", name);
    p->f[p->n].type = type;
    p->f[p->n].help = help;
    return &p->f[p->n++];
}

static void
prom_put(swi_prom *p, prom_family *f, const char *s, size_t n)
{
    if (f == NULL || p->oom)
        return;
    if (f->len + n + 1 > f->cap) {
        size_t ncap = f->cap ? f->cap : 256;
        char *nb;
        while (ncap < f->len + n + 1)
            ncap *= 2;
        if ((nb = realloc(f->buf, ncap)) == NULL) {
            p->oom = 1;
            return;
        }
        f->buf = nb;
        f->cap = ncap;
    }
    memcpy(f->buf + f->len, s, n);
    f->len += n;
    f->buf[f->len] = '\0';
}

static void
prom_puts(swi_prom *p, prom_family *f, const char *s)
{
    prom_put(p, f, s, strlen(s));
}

/* A label value, escaped as the text format wants: \\, \" and \n. */
static void
prom_escaped(swi_prom *p, prom_family *f, const char *v)
{
    for (; v != NULL && *v != '\0'; v++) {
        if (*v == '\\')
            prom_puts(p, f, "\\\\");
        else if (*v == '"')
            prom_puts(p, f, "\\\"");
        else if (*v == '\n')
            prom_puts(p, f, "\\n");
        else
            prom_put(p, f, v, 1);
    }
}

/* name{k="v",...,extra_k="extra_v"} value\n */
static void
prom_line(swi_prom *p, prom_family *f, const char *name, const swi_label *l, size_t nl,
          const char *extra_k, const char *extra_v, double v)
{
    char num[64];
    int first = 1;
    prom_puts(p, f, name);
    if (nl > 0 || extra_k != NULL) {
        prom_puts(p, f, "{");
        for (size_t i = 0; i < nl + (extra_k != NULL); i++) {
            const char *k = i < nl ? l[i].k : extra_k, *val = i < nl ? l[i].v : extra_v;
            if (!first)
                prom_puts(p, f, ",");
            first = 0;
            prom_puts(p, f, k);
            prom_puts(p, f, "=\"");
            prom_escaped(p, f, val);
            prom_puts(p, f, "\"");
        }
        prom_puts(p, f, "}");
    }
    if (isnan(v))
        snprintf(num, sizeof(num), " NaN\n");
    else if (v == floor(v) && fabs(v) < 9.007199254740992e15)
        snprintf(num, sizeof(num), " %.0f\n", v);
    else
        snprintf(num, sizeof(num), " %.17g\n", v);
    prom_puts(p, f, num);
}

void
swi_prom_value(swi_prom *p, const char *family, const char *type, const char *help,
               const swi_label *labels, size_t nl, double v)
{
    prom_family *f = prom_family_get(p, family, type, help);
    if (f != NULL)
        prom_line(p, f, family, labels, nl, NULL, NULL, v);
}

void
swi_prom_hist(swi_prom *p, const char *family, const char *help, const swi_label *labels, size_t nl,
              const swi_hist *h)
{
    prom_family *f = prom_family_get(p, family, "histogram", help);
    char name[128], le[32];
    uint64_t cum = 0;
    if (f == NULL)
        return;
    snprintf(name, sizeof(name), "%s_bucket", family);
    for (size_t i = 0; i <= h->nb; i++) {
        cum += __atomic_load_n(&h->counts[i], __ATOMIC_RELAXED);
        if (i < h->nb)
            snprintf(le, sizeof(le), "%g", h->bounds[i]);
        else
            snprintf(le, sizeof(le), "+Inf");
        prom_line(p, f, name, labels, nl, "le", le, (double)cum);
    }
    snprintf(name, sizeof(name), "%s_sum", family);
    prom_line(p, f, name, labels, nl, NULL, NULL,
              (double)__atomic_load_n(&h->sum_ns, __ATOMIC_RELAXED) / 1e9);
    snprintf(name, sizeof(name), "%s_count", family);
    /* The +Inf bucket as read above: the two agree even while observations
     * go on. */
    prom_line(p, f, name, labels, nl, NULL, NULL, (double)cum);
}

/* ---------------------------------------------------------------- sources */

typedef struct metrics_src {
    void *obj;
    swi_metrics_fn fn;
} metrics_src;

struct sw_metrics {
    pthread_mutex_t mu;
    metrics_src *v;
    size_t n, cap;
};

sw_err
sw_metrics_create(sw_metrics **out)
{
    sw_metrics *m;
    if (out == NULL)
        return SW_EINVAL;
    *out = NULL;
    if ((m = calloc(1, sizeof(*m))) == NULL)
        return SW_ENOMEM;
    pthread_mutex_init(&m->mu, NULL);
    *out = m;
    return SW_OK;
}

void
sw_metrics_destroy(sw_metrics *m)
{
    if (m == NULL)
        return;
    pthread_mutex_destroy(&m->mu);
    free(m->v);
    free(m);
}

sw_err
swi_metrics_add(sw_metrics *m, void *obj, swi_metrics_fn fn)
{
    sw_err rv = SW_OK;
    if (m == NULL || obj == NULL)
        return SW_EINVAL;
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < m->n; i++)
        if (m->v[i].obj == obj)
            rv = SW_EEXIST;
    if (rv == SW_OK && m->n == m->cap) {
        size_t ncap = m->cap ? m->cap * 2 : 8;
        metrics_src *nv = realloc(m->v, ncap * sizeof(*nv));
        if (nv == NULL)
            rv = SW_ENOMEM;
        else {
            m->v = nv;
            m->cap = ncap;
        }
    }
    if (rv == SW_OK) {
        m->v[m->n].obj = obj;
        m->v[m->n].fn = fn;
        m->n++;
    }
    pthread_mutex_unlock(&m->mu);
    return rv;
}

sw_err
sw_metrics_remove(sw_metrics *m, const void *source)
{
    sw_err rv = SW_ENOTFOUND;
    if (m == NULL || source == NULL)
        return SW_EINVAL;
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < m->n; i++)
        if (m->v[i].obj == source) {
            m->v[i] = m->v[--m->n];
            rv = SW_OK;
            break;
        }
    pthread_mutex_unlock(&m->mu);
    return rv;
}

sw_err
sw_metrics_render(sw_metrics *m, char **out, size_t *len)
{
    swi_prom p;
    size_t total = 1, at = 0;
    char *buf;
    if (m == NULL || out == NULL || len == NULL)
        return SW_EINVAL;
    *out = NULL;
    *len = 0;
    memset(&p, 0, sizeof(p));
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < m->n; i++)
        m->v[i].fn(&p, m->v[i].obj);
    pthread_mutex_unlock(&m->mu);
    for (size_t i = 0; i < p.n; i++)
        total +=
            strlen(p.f[i].name) * 2 + strlen(p.f[i].help) + strlen(p.f[i].type) + 20 + p.f[i].len;
    buf = p.oom ? NULL : malloc(total);
    for (size_t i = 0; buf != NULL && i < p.n; i++) {
        at += (size_t)snprintf(buf + at, total - at, "# HELP %s %s\n# TYPE %s %s\n", p.f[i].name,
                               p.f[i].help, p.f[i].name, p.f[i].type);
        memcpy(buf + at, p.f[i].buf ? p.f[i].buf : "", p.f[i].len);
        at += p.f[i].len;
    }
    for (size_t i = 0; i < p.n; i++)
        free(p.f[i].buf);
    free(p.f);
    if (buf == NULL)
        return SW_ENOMEM;
    buf[at] = '\0';
    *out = buf;
    *len = at;
    return SW_OK;
}
