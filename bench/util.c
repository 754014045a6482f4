/* bench/util.c -- streamwire-bench: small helpers shared by every scenario:
 * clocks, sleeping, progress and fatal errors, item timestamps, percentiles
 * and medians, this process's RSS, CPU and context switches, and a one-shot
 * latch (mutex + condvar).
 *
 * Threads and locks: The latch is a mutex + condvar; the rest is lock-free. */
#include "bench.h"

void
loadavg(char *out, size_t cap)
{
    FILE *f = fopen("/proc/loadavg", "r");
    snprintf(out, cap, "unknown");
    if (f != NULL) {
        if (fgets(out, (int)cap, f) != NULL)
            out[strcspn(out, "\n")] = '\0';
        fclose(f);
    }
}

/* ------------------------------------------------------------------ small utils */

int64_t
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void
sleep_until_ns(int64_t t)
{
    struct timespec ts;
    ts.tv_sec = (time_t)(t / 1000000000LL);
    ts.tv_nsec = (long)(t % 1000000000LL);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

void
sleep_ms(int ms)
{
    sleep_until_ns(now_ns() + (int64_t)ms * 1000000LL);
}
void
progress(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "[bench] ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}
void
die(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "streamwire-bench: error: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    cleanup();
    _exit(1);
}

void
stamp(uint8_t *buf, size_t size)
{
    if (size >= 8) {
        int64_t t = now_ns();
        memcpy(buf, &t, 8);
    }
}

int64_t
unstamp(const void *data, size_t len, int64_t now)
{
    int64_t t;
    if (len < 8)
        return -1;
    memcpy(&t, data, 8);
    return now - t;
}

int
cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static int
cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Percentile of a sorted array (nearest rank). */
double
pct(const int64_t *v, size_t n, double q)
{
    size_t i;
    if (n == 0)
        return NAN;
    i = (size_t)ceil(q * (double)n);
    if (i == 0)
        i = 1;
    if (i > n)
        i = n;
    return (double)v[i - 1];
}

double
median(double *v, unsigned n)
{
    if (n == 0)
        return NAN;
    qsort(v, n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

long
status_kb(const char *path, const char *key)
{
    char line[256];
    size_t kl = strlen(key);
    long v = -1;
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
            v = strtol(line + kl + 1, NULL, 10);
            break;
        }
    }
    fclose(f);
    return v;
}

long
self_rss_kb(void)
{
    return status_kb("/proc/self/status", "VmRSS");
}

/* Context switches of this process, all threads (voluntary + involuntary). */
int64_t
self_csw(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (int64_t)ru.ru_nvcsw + ru.ru_nivcsw;
}

int64_t
self_cpu_us(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (int64_t)ru.ru_utime.tv_sec * 1000000 + ru.ru_utime.tv_usec +
           (int64_t)ru.ru_stime.tv_sec * 1000000 + ru.ru_stime.tv_usec;
}

/* Resets VmHWM to the current RSS (Linux >= 4.0). 0 ok. */
int
reset_peak_rss(void)
{
    int fd = open("/proc/self/clear_refs", O_WRONLY);
    int ok;
    if (fd < 0)
        return -1;
    ok = write(fd, "5", 1) == 1;
    close(fd);
    return ok ? 0 : -1;
}

void
latch_init(latch *l)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&l->cv, &a);
    pthread_condattr_destroy(&a);
    pthread_mutex_init(&l->mu, NULL);
    l->set = 0;
}

void
latch_fini(latch *l)
{
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
}

void
latch_set(latch *l)
{
    pthread_mutex_lock(&l->mu);
    l->set = 1;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

/* Waits up to timeout_ns (< 0: forever). 1 if set. */
int
latch_wait(latch *l, int64_t timeout_ns)
{
    int set;
    int64_t until = now_ns() + timeout_ns;
    struct timespec ts;
    ts.tv_sec = (time_t)(until / 1000000000LL);
    ts.tv_nsec = (long)(until % 1000000000LL);
    pthread_mutex_lock(&l->mu);
    while (!l->set) {
        if (timeout_ns < 0)
            pthread_cond_wait(&l->cv, &l->mu);
        else if (pthread_cond_timedwait(&l->cv, &l->mu, &ts) == ETIMEDOUT)
            break;
    }
    set = l->set;
    pthread_mutex_unlock(&l->mu);
    return set;
}
