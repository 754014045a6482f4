/* tests/integration/test_cli.c -- the streamwire CLI as a black box (issue 3,
 * "every row of the synthesized-terminal table plus every terminal type ...
 * through the CLI"; the library side is test_terminals.c and its siblings).
 *
 * One nats-server for the whole file (group setup, max_payload 64 KiB so
 * payload_too_large is cheap), JetStream on for the registry. Workers are
 * `streamwire worker ... --quiet` processes: two long-lived ones shared by
 * several tests ("plain": 16 tokens at once; "slow": 40 tokens 50 ms apart),
 * the others started by the test that needs them, each on its own endpoint
 * and instance id. Every child pid is recorded; the per-test teardown
 * SIGKILLs and reaps the test's children, the group teardown the shared
 * ones, so a failed assertion never leaks a process (and PR_SET_PDEATHSIG
 * covers a crashed test binary).
 *
 * What is checked:
 *   - every terminal kind through `generate --json`: each data line exactly
 *     {"seq":N,"data":"token-K"} with N = 1.. in order and K = N-1, the item
 *     count, the terminal line in its exact format (terminal, reason,
 *     instance, items, elapsed_ms, "message" when there is one), and the exit
 *     status (0 only for completed);
 *   - the readable output, --help of every command (and every flag it shows
 *     is in README.md), usage errors (exit 2 and a message on stderr), an
 *     unreachable server (exit 3);
 *   - `instances` (JSON and table), drain and deregistration on SIGTERM, the
 *     same mid-stream with the default and a short drain grace;
 *   - a slow consumer (flow control), and `streamwire demo` end to end.
 *
 * Under sanitizers the CLI processes are sanitized too: a leak or an error
 * report changes their exit status, which every test asserts.
 *
 * Timing: every wait is a generous bound times swh_slow(); no speed is
 * asserted. Run one test: test_cli '<glob>'. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include <streamwire/registry.h>
#include <streamwire/streamwire.h>

#include "harness.h"

/* ======================================================================== */
/* Fixture: one server, recorded children.                                   */

#define MAX_KIDS 32
#define MAX_ARGS 64
#define OUT_CAP (256 * 1024)

#define EP_PLAIN "cli.plain.gen"
#define ID_PLAIN "plain"
#define EP_SLOW "cli.slow.gen"
#define ID_SLOW "slow"

typedef struct kid {
    pid_t pid;  /* 0: free or reaped */
    int fd;     /* its stdout pipe, or -1 */
    int shared; /* 0: the running test's; 1: "plain", 2: "slow" (group-wide) */
} kid;

static swh_nats g_nats;
static int g_slow = 1;
static kid g_kids[MAX_KIDS];
static char *g_out; /* OUT_CAP bytes, reused by the tests */
static char *g_err;

#define T(ms) ((int)(ms)*g_slow)
/* A NULL-terminated argument list as a compound literal. */
#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

static void
kid_add(pid_t pid, int fd, int shared)
{
    for (int i = 0; i < MAX_KIDS; i++) {
        if (g_kids[i].pid == 0) {
            g_kids[i].pid = pid;
            g_kids[i].fd = fd;
            g_kids[i].shared = shared;
            return;
        }
    }
    /* No slot: kill it at once rather than leak it. */
    swh_kill(pid, SIGKILL);
    swh_wait_exit(pid, 5000, NULL);
    if (fd >= 0)
        close(fd);
    fail_msg("more than %d children", MAX_KIDS);
}

static kid *
kid_find(pid_t pid)
{
    for (int i = 0; i < MAX_KIDS; i++) {
        if (g_kids[i].pid == pid)
            return &g_kids[i];
    }
    return NULL;
}

/* Waits for a recorded child to exit (reaps it, closes its pipe, forgets
 * it). Returns the raw wait status, or -1 on timeout (it stays recorded, so
 * the teardown kills it). */
static int
kid_wait(pid_t pid, int timeout_ms)
{
    kid *k = kid_find(pid);
    int st = 0;

    if (swh_wait_exit(pid, timeout_ms, &st) != 0)
        return -1;
    if (k != NULL) {
        if (k->fd >= 0)
            close(k->fd);
        k->pid = 0;
        k->fd = -1;
    }
    return st;
}

/* SIGKILLs and reaps the test's children, and the shared workers too when
 * shared_too. */
static void
kids_kill(int shared_too)
{
    for (int i = 0; i < MAX_KIDS; i++) {
        kid *k = &g_kids[i];

        if (k->pid == 0 || (k->shared && !shared_too))
            continue;
        swh_kill(k->pid, SIGKILL);
        swh_kill(k->pid, SIGCONT);
        if (swh_wait_exit(k->pid, 10000, NULL) != 0)
            fprintf(stderr, "test_cli: child %d could not be reaped\n", (int)k->pid);
        if (k->fd >= 0)
            close(k->fd);
        k->pid = 0;
        k->fd = -1;
    }
}

/* Copies base + extra (both NULL-terminated; extra may be NULL) into full. */
static void
args_join(const char **full, const char *const *base, const char *const *extra)
{
    size_t n = 0;

    for (size_t i = 0; base[i] != NULL; i++) {
        assert_true(n < MAX_ARGS - 1);
        full[n++] = base[i];
    }
    for (size_t i = 0; extra != NULL && extra[i] != NULL; i++) {
        assert_true(n < MAX_ARGS - 1);
        full[n++] = extra[i];
    }
    full[n] = NULL;
}

/* Starts `streamwire worker --server URL --endpoint ep --instance-id id
 * --quiet <extra>` and waits for its ready line. Returns its pid. */
static pid_t
worker_start_ex(const char *ep, const char *id, const char *const *extra, int shared)
{
    const char *argv[MAX_ARGS];
    char line[512], want[256];
    int fd = -1;
    pid_t pid;
    int r;

    args_join(
        argv,
        ARGS("worker", "--server", g_nats.url, "--endpoint", ep, "--instance-id", id, "--quiet"),
        extra);
    pid = swh_spawn(argv, &fd);
    assert_true(pid > 0);
    kid_add(pid, fd, shared);
    r = swh_wait_line(fd, "worker ready", line, sizeof(line), T(15000));
    if (r != 0)
        fail_msg("worker %s on %s did not print its ready line (%s)", id, ep,
                 r == -1 ? "timeout" : "it exited");
    snprintf(want, sizeof(want), "worker ready instance=%s endpoint=%s subject=", id, ep);
    if (strncmp(line, want, strlen(want)) != 0 || line[strlen(want)] == '\0')
        fail_msg("unexpected ready line: '%s' (want '%s<subject>')", line, want);
    return pid;
}

static pid_t
worker_start(const char *ep, const char *id, const char *const *extra)
{
    return worker_start_ex(ep, id, extra, 0);
}

/* SIGTERMs a worker and asserts it exits 0 within timeout_ms. */
static void
worker_stop_clean(pid_t pid, int timeout_ms)
{
    int st;

    swh_kill(pid, SIGTERM);
    st = kid_wait(pid, timeout_ms);
    if (st == -1)
        fail_msg("worker %d did not exit within %d ms of SIGTERM", (int)pid, timeout_ms);
    if (!WIFEXITED(st))
        fail_msg("worker %d died by signal %d after SIGTERM", (int)pid,
                 WIFSIGNALED(st) ? WTERMSIG(st) : -1);
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* Runs `streamwire <base...> <extra...>`, stdout into g_out. Returns the exit
 * status as swh_run does. */
static int
cli_run(const char *const *base, const char *const *extra, int timeout_ms)
{
    const char *argv[MAX_ARGS];

    args_join(argv, base, extra);
    return swh_run(argv, g_out, OUT_CAP, timeout_ms);
}

/* `streamwire generate --server URL --endpoint ep <extra>`. */
static int
gen_run(const char *ep, const char *const *extra)
{
    return cli_run(ARGS("generate", "--server", g_nats.url, "--endpoint", ep), extra, T(30000));
}

/* Runs the CLI capturing stdout into g_out and stderr into g_err. */
static int
cli_run2(const char *const *argv, int timeout_ms)
{
    long long deadline = swh_now_ms() + timeout_ms;
    int ep[2];
    int fds[2] = {-1, -1};
    size_t used[2] = {0, 0};
    char *bufs[2] = {g_out, g_err};
    int st = 0;
    pid_t pid;

    g_out[0] = g_err[0] = '\0';
    assert_int_equal(pipe(ep), 0);
    fcntl(ep[0], F_SETFD, FD_CLOEXEC);
    fcntl(ep[1], F_SETFD, FD_CLOEXEC);
    pid = swh_spawn_err(argv, &fds[0], ep[1]);
    close(ep[1]);
    fds[1] = ep[0];
    if (pid < 0) {
        close(ep[0]);
        fail_msg("cannot spawn the CLI");
    }
    kid_add(pid, -1, 0);
    while (fds[0] >= 0 || fds[1] >= 0) {
        struct pollfd p[2];
        long long left = deadline - swh_now_ms();
        int pr;

        if (left <= 0)
            break;
        for (int i = 0; i < 2; i++) {
            p[i].fd = fds[i];
            p[i].events = POLLIN;
            p[i].revents = 0;
        }
        pr = poll(p, 2, (int)left);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            break;
        for (int i = 0; i < 2; i++) {
            char tmp[4096];
            ssize_t r;

            if (fds[i] < 0 || p[i].revents == 0)
                continue;
            r = read(fds[i], tmp, sizeof(tmp));
            if (r < 0 && (errno == EINTR || errno == EAGAIN))
                continue;
            if (r <= 0) {
                close(fds[i]);
                fds[i] = -1;
                continue;
            }
            if (used[i] < OUT_CAP - 1) {
                size_t k = (size_t)r < OUT_CAP - 1 - used[i] ? (size_t)r : OUT_CAP - 1 - used[i];
                memcpy(bufs[i] + used[i], tmp, k);
                used[i] += k;
                bufs[i][used[i]] = '\0';
            }
        }
    }
    for (int i = 0; i < 2; i++) {
        if (fds[i] >= 0)
            close(fds[i]);
    }
    {
        long long left = deadline - swh_now_ms();
        st = kid_wait(pid, left > 0 ? (int)left : 0);
    }
    if (st == -1)
        fail_msg("streamwire %s did not exit within %d ms", argv[0], timeout_ms);
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : -1;
}

/* Reads fd, appending to buf (cap bytes, NUL-terminated; *used updated),
 * until needle appears in buf (needle NULL: until end of file) or timeout.
 * Returns 0 when found / at end of file, -1 on timeout, -2 on end of file
 * before the needle. */
static int
read_until(int fd, char *buf, size_t cap, size_t *used, const char *needle, int timeout_ms)
{
    long long deadline = swh_now_ms() + timeout_ms;

    for (;;) {
        struct pollfd p;
        char tmp[4096];
        long long left;
        ssize_t r;
        int pr;

        if (needle != NULL && strstr(buf, needle) != NULL)
            return 0;
        left = deadline - swh_now_ms();
        if (left <= 0)
            return -1;
        p.fd = fd;
        p.events = POLLIN;
        p.revents = 0;
        pr = poll(&p, 1, (int)left);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr < 0)
            return -2;
        if (pr == 0)
            continue;
        r = read(fd, tmp, sizeof(tmp));
        if (r < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (r <= 0)
            return needle == NULL ? 0 : -2;
        if (*used < cap - 1) {
            size_t k = (size_t)r < cap - 1 - *used ? (size_t)r : cap - 1 - *used;
            memcpy(buf + *used, tmp, k);
            *used += k;
            buf[*used] = '\0';
        }
    }
}

/* ======================================================================== */
/* `generate --json` output: parsed strictly.                                */

typedef struct gen_res {
    long data;        /* data lines, all exactly {"seq":i+1,"data":"token-i"} */
    int bad_line;     /* 1-based line number of the first bad line, 0 = none */
    char bad[512];    /* that line */
    int has_terminal; /* the last line is a terminal line in the exact format */
    char terminal[32];
    char reason[96];
    char instance[96];
    long long items;
    long long elapsed_ms;
    long long elapsed_us;
    long long first_item_us;
    int has_message;
    char message[1024];
} gen_res;

/* Reads a JSON string body at *p (after the opening quote) into out, up to
 * the closing quote; escapes are copied through undecoded. Returns 0 and
 * moves *p past the closing quote, or -1. */
static int
json_str_at(const char **p, char *out, size_t cap)
{
    const char *s = *p;
    size_t n = 0;

    while (*s != '\0' && *s != '"') {
        if (*s == '\\') {
            if (s[1] == '\0')
                return -1;
            if (n + 2 < cap) {
                out[n++] = s[0];
                out[n++] = s[1];
            }
            s += 2;
            continue;
        }
        if ((unsigned char)*s < 0x20)
            return -1;
        if (n + 1 < cap)
            out[n++] = *s;
        s++;
    }
    if (*s != '"')
        return -1;
    out[n] = '\0';
    *p = s + 1;
    return 0;
}

static int
lit(const char **p, const char *l)
{
    size_t n = strlen(l);

    if (strncmp(*p, l, n) != 0)
        return -1;
    *p += n;
    return 0;
}

static int
num_at(const char **p, long long *v)
{
    char *end;

    if (**p < '0' || **p > '9')
        return -1;
    errno = 0;
    *v = strtoll(*p, &end, 10);
    if (errno != 0)
        return -1;
    *p = end;
    return 0;
}

/* {"terminal":"T","reason":"R","instance":"I","items":N,"elapsed_ms":T,
 * "elapsed_us":U} with ,"first_item_us":F when items came, and an optional
 * ,"message":"M" before the closing brace. */
static int
parse_terminal(const char *line, gen_res *r)
{
    const char *p = line;

    if (lit(&p, "{\"terminal\":\"") || json_str_at(&p, r->terminal, sizeof(r->terminal)) ||
        lit(&p, ",\"reason\":\"") || json_str_at(&p, r->reason, sizeof(r->reason)) ||
        lit(&p, ",\"instance\":\"") || json_str_at(&p, r->instance, sizeof(r->instance)) ||
        lit(&p, ",\"items\":") || num_at(&p, &r->items) || lit(&p, ",\"elapsed_ms\":") ||
        num_at(&p, &r->elapsed_ms) || lit(&p, ",\"elapsed_us\":") || num_at(&p, &r->elapsed_us))
        return -1;
    /* the microseconds agree with the milliseconds */
    if (r->elapsed_us / 1000 < r->elapsed_ms - 1 || r->elapsed_us / 1000 > r->elapsed_ms + 1)
        return -1;
    r->first_item_us = -1;
    if (lit(&p, ",\"first_item_us\":") == 0) {
        if (num_at(&p, &r->first_item_us) || r->first_item_us > r->elapsed_us || r->items == 0)
            return -1;
    } else if (r->items != 0) {
        return -1; /* items came: the first one's time is there */
    }
    if (lit(&p, ",\"message\":\"") == 0) {
        if (json_str_at(&p, r->message, sizeof(r->message)))
            return -1;
        r->has_message = 1;
    }
    if (lit(&p, "}") || *p != '\0')
        return -1;
    return 0;
}

static void
parse_gen(const char *out, gen_res *r)
{
    const char *p = out;
    int lineno = 0;

    memset(r, 0, sizeof(*r));
    while (*p != '\0') {
        const char *nl = strchr(p, '\n');
        char line[2048];
        size_t len;

        lineno++;
        if (nl == NULL) { /* an unterminated last line */
            if (r->bad_line == 0) {
                r->bad_line = lineno;
                snprintf(r->bad, sizeof(r->bad), "(no newline) %.300s", p);
            }
            break;
        }
        len = (size_t)(nl - p);
        if (len >= sizeof(line))
            len = sizeof(line) - 1;
        memcpy(line, p, len);
        line[len] = '\0';
        p = nl + 1;
        if (r->has_terminal) { /* anything after the terminal */
            if (r->bad_line == 0) {
                r->bad_line = lineno;
                snprintf(r->bad, sizeof(r->bad), "(after the terminal) %.300s", line);
            }
            continue;
        }
        if (strncmp(line, "{\"terminal\":", 12) == 0) {
            if (parse_terminal(line, r) == 0) {
                r->has_terminal = 1;
            } else if (r->bad_line == 0) {
                r->bad_line = lineno;
                snprintf(r->bad, sizeof(r->bad), "(malformed terminal) %.300s", line);
            }
            continue;
        }
        {
            char want[64];

            snprintf(want, sizeof(want), "{\"seq\":%ld,\"data\":\"token-%ld\"}", r->data + 1,
                     r->data);
            if (strcmp(line, want) == 0 && r->bad_line == 0) {
                r->data++;
            } else if (r->bad_line == 0) {
                r->bad_line = lineno;
                snprintf(r->bad, sizeof(r->bad), "(want %s) %.300s", want, line);
            }
        }
    }
}

/* Checks a `generate --json` run: exit status rc, every data line in order,
 * the exact terminal. instance NULL: any; items < 0: any (returned). Returns
 * the item count. */
static long
check_gen(int rc, const char *terminal, const char *reason, const char *instance, long items,
          int want_message)
{
    gen_res r;

    parse_gen(g_out, &r);
    if (r.bad_line != 0 || !r.has_terminal) {
        print_message("generate output:\n%s\n", g_out);
        if (r.bad_line != 0)
            fail_msg("line %d: %s", r.bad_line, r.bad);
        fail_msg("no terminal line (exit status %d)", rc);
    }
    if (strcmp(r.terminal, terminal) != 0 || strcmp(r.reason, reason) != 0) {
        print_message("generate output:\n%s\n", g_out);
        fail_msg("terminal %s/%s, want %s/%s%s%s", r.terminal, r.reason, terminal, reason,
                 r.has_message ? "; message: " : "", r.has_message ? r.message : "");
    }
    if (instance != NULL && strcmp(r.instance, instance) != 0)
        fail_msg("instance '%s', want '%s'", r.instance, instance);
    if (r.items != r.data)
        fail_msg("terminal says items %lld but %ld data lines came", r.items, r.data);
    if (items >= 0 && r.data != items) {
        print_message("generate output:\n%s\n", g_out);
        fail_msg("%ld items, want %ld", r.data, items);
    }
    if (want_message && (!r.has_message || r.message[0] == '\0'))
        fail_msg("%s/%s without a \"message\"", terminal, reason);
    assert_true(r.elapsed_ms >= 0);
    assert_int_equal(rc, strcmp(terminal, "completed") == 0 ? 0 : 1);
    return r.data;
}

/* ======================================================================== */
/* Fixtures                                                                  */

static int
group_setup(void **state)
{
    (void)state;
    g_slow = swh_slow();
    g_out = malloc(OUT_CAP);
    g_err = malloc(OUT_CAP);
    if (g_out == NULL || g_err == NULL)
        return -1;
    if (swh_cli_path() == NULL) {
        fprintf(stderr, "test_cli: no CLI path (SW_CLI_PATH)\n");
        return -1;
    }
    if (swh_nats_start(&g_nats, "max_payload: 65536\n") != 0) {
        fprintf(stderr, "test_cli: could not start nats-server\n");
        return -1;
    }
    return 0;
}

static int
group_teardown(void **state)
{
    (void)state;
    kids_kill(1);
    swh_nats_stop(&g_nats);
    free(g_out);
    free(g_err);
    return 0;
}

static int
setup(void **state)
{
    (void)state;
    g_out[0] = g_err[0] = '\0';
    return 0;
}

static int
teardown(void **state)
{
    (void)state;
    kids_kill(0);
    return 0;
}

/* The shared workers, started on first use. */
static void
need_plain(void)
{
    for (int i = 0; i < MAX_KIDS; i++) {
        if (g_kids[i].pid != 0 && g_kids[i].shared == 1)
            return;
    }
    worker_start_ex(EP_PLAIN, ID_PLAIN, NULL, 1);
}

static void
need_slow(void)
{
    for (int i = 0; i < MAX_KIDS; i++) {
        if (g_kids[i].pid != 0 && g_kids[i].shared == 2)
            return;
    }
    worker_start_ex(EP_SLOW, ID_SLOW, ARGS("--tokens", "40", "--token-interval-ms", "50"), 2);
}

/* ======================================================================== */
/* 1. Every terminal kind through `generate --json`.                          */

static void
test_completed(void **state)
{
    (void)state;
    need_plain();
    check_gen(gen_run(EP_PLAIN, ARGS("--instance-id", ID_PLAIN, "--json")), "completed", "stop",
              ID_PLAIN, 16, 0);
}

static void
test_incomplete_max_tokens(void **state)
{
    (void)state;
    need_plain();
    check_gen(gen_run(EP_PLAIN, ARGS("--instance-id", ID_PLAIN, "--max-tokens", "5", "--json")),
              "incomplete", "max_tokens", ID_PLAIN, 5, 0);
}

static void
test_failed_engine_error(void **state)
{
    (void)state;
    worker_start("cli.fail.gen", "wfail", ARGS("--fail-after", "4"));
    check_gen(gen_run("cli.fail.gen", ARGS("--instance-id", "wfail", "--json")), "failed",
              "engine_error", "wfail", 4, 1);
}

static void
test_cancelled(void **state)
{
    (void)state;
    need_slow();
    /* No data item is delivered after the cancel: exactly 3. */
    check_gen(gen_run(EP_SLOW, ARGS("--instance-id", ID_SLOW, "--cancel-after", "3", "--json")),
              "cancelled", "cancelled", ID_SLOW, 3, 0);
}

/* generate writes its output in blocks (a fast stream costs a write per
 * block, not per item) but flushes whenever the stream has nothing more to
 * take: a slow stream's items show as they come. Token 0 must be readable
 * from generate's stdout long before the stream ends (tokens 1 s apart). */
static void
test_generate_shows_items_live(void **state)
{
    const char *argv[MAX_ARGS];
    char line[256];
    int fd = -1, st;
    long long t0;
    pid_t pid;
    (void)state;
    worker_start("cli.live.gen", "wlive", ARGS("--tokens", "3", "--token-interval-ms", "1000"));
    args_join(argv,
              ARGS("generate", "--server", g_nats.url, "--endpoint", "cli.live.gen",
                   "--instance-id", "wlive", "--json"),
              NULL);
    t0 = swh_now_ms();
    pid = swh_spawn(argv, &fd);
    assert_true(pid > 0);
    kid_add(pid, fd, 0);
    if (swh_wait_line(fd, "{\"seq\":1,", line, sizeof(line), T(1500)) != 0)
        fail_msg("token 0 did not show within 1.5 s: generate holds its output back");
    if (swh_now_ms() - t0 > 1800)
        fail_msg("token 0 showed after %lld ms (the stream ends after 2 s)",
                 (long long)(swh_now_ms() - t0));
    assert_non_null(strstr(line, "token-0"));
    assert_int_equal(swh_wait_line(fd, "{\"terminal\":\"completed\"", line, sizeof(line), T(10000)),
                     0);
    st = kid_wait(pid, T(10000));
    assert_true(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void
test_stream_incomplete_hang(void **state)
{
    (void)state;
    worker_start("cli.hang.gen", "whang", ARGS("--hang-after", "3"));
    check_gen(
        gen_run("cli.hang.gen", ARGS("--instance-id", "whang", "--heartbeat-ms", "100", "--json")),
        "error", "stream_incomplete", "whang", 3, 1);
}

static void
test_stream_incomplete_no_final(void **state)
{
    (void)state;
    worker_start("cli.nofinal.gen", "wnofinal", ARGS("--chaos", "no-final"));
    check_gen(gen_run("cli.nofinal.gen",
                      ARGS("--instance-id", "wnofinal", "--heartbeat-ms", "100", "--json")),
              "error", "stream_incomplete", "wnofinal", 16, 1);
}

static void
test_item_after_final(void **state)
{
    char linger[16];

    (void)state;
    /* The frontend holds the terminal --final-linger-ms after the final to
     * catch a late item; widen it so a busy machine cannot let it slip. */
    snprintf(linger, sizeof(linger), "%d", T(300));
    worker_start("cli.afterfinal.gen", "wafter", ARGS("--chaos", "after-final"));
    check_gen(gen_run("cli.afterfinal.gen",
                      ARGS("--instance-id", "wafter", "--final-linger-ms", linger, "--json")),
              "error", "item_after_final", "wafter", 16, 1);
}

static void
test_decode_error(void **state)
{
    (void)state;
    worker_start("cli.garbage.gen", "wgarbage", ARGS("--chaos", "garbage"));
    /* The garbage goes out after 8 of 16 items: those 8 arrive, in order,
     * none skipped (check_gen checks token-0..token-7), then the error. */
    check_gen(gen_run("cli.garbage.gen", ARGS("--instance-id", "wgarbage", "--json")), "error",
              "decode_error", "wgarbage", 8, 1);
}

static void
test_sequence_gap(void **state)
{
    (void)state;
    worker_start("cli.gap.gen", "wgap", ARGS("--chaos", "gap"));
    /* Sequence number 9 is skipped: items 1..8 are delivered, the ones held
     * behind the gap never are. */
    check_gen(gen_run("cli.gap.gen", ARGS("--instance-id", "wgap", "--json")), "error",
              "sequence_gap", "wgap", 8, 1);
}

static void
test_no_responders(void **state)
{
    (void)state;
    need_plain();
    check_gen(gen_run(EP_PLAIN, ARGS("--instance-id", "nobody-here", "--json")), "error",
              "no_responders", "nobody-here", 0, 1);
}

static void
test_payload_too_large(void **state)
{
    (void)state;
    need_plain();
    check_gen(
        gen_run(EP_PLAIN, ARGS("--instance-id", ID_PLAIN, "--payload-bytes", "100000", "--json")),
        "error", "payload_too_large", ID_PLAIN, 0, 1);
    /* The worker is unaffected. */
    check_gen(gen_run(EP_PLAIN, ARGS("--instance-id", ID_PLAIN, "--json")), "completed", "stop",
              ID_PLAIN, 16, 0);
}

static void
test_deadline_exceeded(void **state)
{
    char timeout[16];
    long n;

    (void)state;
    need_slow();
    snprintf(timeout, sizeof(timeout), "%d", T(300));
    n = check_gen(
        gen_run(EP_SLOW, ARGS("--instance-id", ID_SLOW, "--timeout-ms", timeout, "--json")),
        "error", "deadline_exceeded", ID_SLOW, -1, 1);
    assert_true(n < 40);
}

static void
test_instance_lost_crash(void **state)
{
    pid_t w;
    long n;
    int st;

    (void)state;
    w = worker_start("cli.crash.gen", "wcrash", ARGS("--crash-after", "3"));
    n = check_gen(gen_run("cli.crash.gen", ARGS("--instance-id", "wcrash", "--json")), "error",
                  "instance_lost", "wcrash", -1, 1);
    /* The worker aborts right after its third item: at most those 3 (in
     * order, none skipped). */
    assert_true(n <= 3);
    st = kid_wait(w, T(10000));
    assert_int_not_equal(st, -1);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGABRT);
}

static void
test_no_instances(void **state)
{
    (void)state;
    check_gen(gen_run("cli.nobody.gen", ARGS("--json")), "error", "no_instances", "", 0, 1);
}

static void
test_routed_by_registry(void **state)
{
    (void)state;
    worker_start("cli.routed.gen", "wrouted", NULL);
    check_gen(gen_run("cli.routed.gen", ARGS("--json")), "completed", "stop", "wrouted", 16, 0);
    check_gen(gen_run("cli.routed.gen",
                      ARGS("--max-tokens", "2", "--policy", "least_inflight", "--json")),
              "incomplete", "max_tokens", "wrouted", 2, 0);
}

static void
test_cancel_after_zero(void **state)
{
    (void)state;
    need_slow();
    check_gen(gen_run(EP_SLOW, ARGS("--instance-id", ID_SLOW, "--cancel-after", "0", "--json")),
              "cancelled", "cancelled", ID_SLOW, 0, 0);
}

/* --max-inflight 1: a second request while one streams gets the terminal
 * overloaded; SIGINT to `generate` cancels its stream (terminal cancelled,
 * exit 1); the slot is free again afterwards. */
static void
test_overloaded_and_sigint(void **state)
{
    const char *ep = "cli.overload.gen";
    size_t used = 0;
    pid_t g;
    int fd = -1, st, r;
    long n;

    (void)state;
    worker_start(ep, "woverload",
                 ARGS("--max-inflight", "1", "--tokens", "40", "--token-interval-ms", "50"));
    g = swh_spawn(ARGS("generate", "--server", g_nats.url, "--endpoint", ep, "--instance-id",
                       "woverload", "--json"),
                  &fd);
    assert_true(g > 0);
    kid_add(g, fd, 0);
    g_err[0] = '\0';
    r = read_until(fd, g_err, OUT_CAP, &used, "{\"seq\":2,", T(15000));
    if (r != 0)
        fail_msg("the first stream did not start (%s):\n%s", r == -1 ? "timeout" : "eof", g_err);

    check_gen(gen_run(ep, ARGS("--instance-id", "woverload", "--json")), "error", "overloaded",
              "woverload", 0, 1);

    swh_kill(g, SIGINT);
    r = read_until(fd, g_err, OUT_CAP, &used, NULL, T(15000));
    assert_int_equal(r, 0);
    st = kid_wait(g, T(10000));
    assert_int_not_equal(st, -1);
    assert_true(WIFEXITED(st));
    memcpy(g_out, g_err, used + 1);
    n = check_gen(WEXITSTATUS(st), "cancelled", "cancelled", "woverload", -1, 0);
    assert_true(n >= 2 && n < 40);

    /* The slot is freed once the worker's handler has seen the cancel. */
    {
        long long t0 = swh_now_ms();
        int rc;

        for (;;) {
            rc = gen_run(ep, ARGS("--instance-id", "woverload", "--max-tokens", "2", "--json"));
            if (strstr(g_out, "\"reason\":\"overloaded\"") == NULL || swh_now_ms() - t0 > T(3000))
                break;
            swh_sleep_ms(50);
        }
        check_gen(rc, "incomplete", "max_tokens", "woverload", 2, 0);
    }
}

/* ======================================================================== */
/* 2. Readable output.                                                        */

static void
test_readable_output(void **state)
{
    const char *summary;
    int rc;

    (void)state;
    need_plain();
    rc = gen_run(EP_PLAIN, ARGS("--instance-id", ID_PLAIN));
    if (rc != 0)
        print_message("generate output:\n%s\n", g_out);
    assert_int_equal(rc, 0);
    assert_null(strstr(g_out, "{\"seq\""));
    assert_null(strstr(g_out, "{\"terminal\""));
    for (int i = 0; i < 16; i++) {
        char tok[32];
        const char *p = g_out;
        int found = 0;

        snprintf(tok, sizeof(tok), "token-%d", i);
        /* "token-1" is a prefix of "token-10": look for it at a line end. */
        while ((p = strstr(p, tok)) != NULL) {
            p += strlen(tok);
            if (*p == '\n' || *p == ' ' || *p == '\0') {
                found = 1;
                break;
            }
        }
        if (!found)
            fail_msg("'%s' missing from the readable output:\n%s", tok, g_out);
    }
    /* The summary line is the last one and names the terminal and the
     * instance. */
    summary = strstr(g_out, "completed");
    if (summary == NULL || strstr(summary, ID_PLAIN) == NULL)
        fail_msg("no summary line naming 'completed' and the instance:\n%s", g_out);
    {
        const char *last = g_out + strlen(g_out);

        assert_true(last > g_out && last[-1] == '\n');
        last--;
        while (last > g_out && last[-1] != '\n')
            last--;
        if (strstr(last, "completed") == NULL || strstr(last, ID_PLAIN) == NULL ||
            strstr(last, "16") == NULL)
            fail_msg("last line is not the summary: '%s'", last);
    }

    /* A failed stream reads as such too, with its message, and exits 1. */
    worker_start("cli.readfail.gen", "wreadfail", ARGS("--fail-after", "2"));
    rc = gen_run("cli.readfail.gen", ARGS("--instance-id", "wreadfail"));
    assert_int_equal(rc, 1);
    if (strstr(g_out, "failed") == NULL || strstr(g_out, "engine_error") == NULL ||
        strstr(g_out, "wreadfail") == NULL || strstr(g_out, "token-1") == NULL)
        fail_msg("readable failed stream:\n%s", g_out);
}

/* ======================================================================== */
/* 3. --help, usage errors, unreachable server.                               */

static void
expect_help(const char *const *argv, const char *const *must)
{
    int rc = cli_run2(argv, T(10000));

    if (rc != 0)
        fail_msg("streamwire %s --help: exit %d; stderr: %s", argv[0], rc, g_err);
    for (size_t i = 0; must[i] != NULL; i++) {
        if (strstr(g_out, must[i]) == NULL)
            fail_msg("streamwire %s --help does not mention %s:\n%s", argv[0], must[i], g_out);
    }
}

static void
test_help(void **state)
{
    (void)state;
    expect_help(ARGS("--help"), ARGS("worker", "generate", "instances", "demo", "gateway", "keygen",
                                     "--help", "--version", "Usage"));
    expect_help(ARGS("help"), ARGS("worker", "generate", "instances", "demo"));
    expect_help(ARGS("worker", "--help"),
                ARGS("--server", "--endpoint", "--instance-id", "--tokens", "--token-interval-ms",
                     "--crash-after", "--hang-after", "--fail-after", "--chaos", "after-final",
                     "garbage", "gap", "no-final", "--max-inflight", "--threads",
                     "--send-timeout-ms", "--drain-grace-ms", "--registry", "nats-kv", "none",
                     "--bucket", "--lease-ms", "--quiet", "Exit status"));
    expect_help(ARGS("generate", "--help"),
                ARGS("--server", "--endpoint", "--prompt", "--max-tokens", "--instance-id",
                     "--policy", "round_robin", "random", "least_inflight", "--bucket",
                     "--cancel-after", "--read-delay-ms", "--timeout-ms", "--json",
                     "--final-linger-ms", "--heartbeat-ms", "--inactivity-ms", "--gap-timeout-ms",
                     "--window", "--payload-bytes", "--verbose", "Exit status"));
    expect_help(ARGS("instances", "--help"),
                ARGS("--server", "--endpoint", "--json", "--bucket", "Exit status"));
    expect_help(ARGS("demo", "--help"), ARGS("--server", "--keep", "--verbose", "Exit status"));
    expect_help(ARGS("gateway", "--help"),
                ARGS("--server", "--listen", "--model", "--bucket", "--policy", "--keepalive-ms",
                     "--stall-ms", "--max-body", "--max-connections", "--cancel-on-disconnect",
                     "--narration", "--grace-ms", "--access-log", "--migration-limit", "--loops",
                     "--quiet", "--creds", "--tls-ca", "Exit status"));
    /* -h and `help COMMAND` too. */
    expect_help(ARGS("generate", "-h"), ARGS("--json", "--cancel-after"));
    expect_help(ARGS("help", "worker"), ARGS("--chaos", "--drain-grace-ms"));
}

/* Whether flag ("--name") occurs in text[0..len) as a whole flag: --window
 * does not count as --window-max. */
static int
flag_in(const char *text, size_t len, const char *flag)
{
    size_t fl = strlen(flag);

    for (size_t i = 0; i + fl <= len; i++) {
        unsigned char after = i + fl < len ? (unsigned char)text[i + fl] : ' ';

        if (memcmp(text + i, flag, fl) == 0 && !islower(after) && !isdigit(after) && after != '-')
            return 1;
    }
    return 0;
}

/* Each command's --help against README.md ("The CLI"): every flag in its
 * own option list is in its synopsis (the lines from "streamwire CMD " to
 * the next unindented one), and every other flag the help names (the NATS
 * connection flags, flags named in descriptions) is somewhere in the README.
 * The gateway is left out: docs/GATEWAY.md is its manual. */
static void
test_help_flags_in_readme(void **state)
{
    static const char *const cmds[] = {"worker", "generate", "instances", "demo", "keygen"};
    char path[1024];
    char *readme;
    size_t n;
    long size;
    FILE *f;
    int missing = 0;

    (void)state;
    snprintf(path, sizeof(path), "%s/README.md", SW_SOURCE_DIR);
    f = fopen(path, "r");
    if (f == NULL)
        fail_msg("cannot read %s", path);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    size = ftell(f);
    assert_true(size > 0);
    rewind(f);
    readme = malloc((size_t)size + 1);
    assert_non_null(readme);
    n = fread(readme, 1, (size_t)size, f);
    fclose(f);
    readme[n] = '\0';
    for (size_t c = 0; c < sizeof(cmds) / sizeof(cmds[0]); c++) {
        char head[64];
        const char *syn, *syn_end, *own_end;
        int rc = cli_run2(ARGS(cmds[c], "--help"), T(10000));

        if (rc != 0) {
            free(readme);
            fail_msg("streamwire %s --help: exit %d", cmds[c], rc);
        }
        snprintf(head, sizeof(head), "\nstreamwire %s ", cmds[c]);
        syn = strstr(readme, head);
        if (syn == NULL) {
            free(readme);
            fail_msg("README.md has no synopsis line 'streamwire %s ...'", cmds[c]);
        }
        syn++;
        for (syn_end = strchr(syn, '\n'); syn_end != NULL && syn_end[1] == ' ';
             syn_end = strchr(syn_end + 1, '\n'))
            ;
        if (syn_end == NULL)
            syn_end = syn + strlen(syn);
        /* the command's own options end where the connection options start */
        own_end = strstr(g_out, "NATS connection options");
        if (own_end == NULL)
            own_end = g_out + strlen(g_out);
        for (const char *p = g_out; (p = strstr(p, "--")) != NULL;) {
            char flag[64];
            size_t len = 2;
            int own;

            if (p[2] < 'a' || p[2] > 'z' ||
                (p > g_out && (isalnum((unsigned char)p[-1]) || p[-1] == '-'))) {
                p += 2;
                continue; /* not a long flag: "--", "---", "a--b" */
            }
            while (len < sizeof(flag) - 1 && (islower((unsigned char)p[len]) ||
                                              isdigit((unsigned char)p[len]) || p[len] == '-'))
                len++;
            memcpy(flag, p, len);
            flag[len] = '\0';
            /* an option row: "  --name ..." at the start of a line */
            own = p < own_end && p - g_out >= 3 && memcmp(p - 3, "\n  ", 3) == 0 &&
                  strcmp(flag, "--help") != 0;
            p += len;
            if (own && !flag_in(syn, (size_t)(syn_end - syn), flag)) {
                print_message("streamwire %s --help lists %s, which its README.md synopsis "
                              "does not\n",
                              cmds[c], flag);
                missing++;
            } else if (!own && !flag_in(readme, n, flag)) {
                print_message("streamwire %s --help names %s, which README.md does not\n", cmds[c],
                              flag);
                missing++;
            }
        }
    }
    free(readme);
    assert_int_equal(missing, 0);
}

/* Every option `gateway --help` lists (its own, not the NATS connection
 * ones) is in docs/GATEWAY.md's synopsis, the block after "streamwire
 * gateway --server URL". Before, --replicas was not. */
static void
test_gateway_flags_documented(void **state)
{
    static char doc[1 << 17];
    char path[512], *block, *end, *line;
    size_t n, nflags = 0;
    FILE *f;
    (void)state;
    snprintf(path, sizeof(path), "%s/docs/GATEWAY.md", SW_SOURCE_DIR);
    assert_non_null(f = fopen(path, "r"));
    n = fread(doc, 1, sizeof(doc) - 1, f);
    fclose(f);
    doc[n] = '\0';
    assert_non_null(block = strstr(doc, "streamwire gateway --server URL"));
    assert_non_null(end = strstr(block, "```"));
    *end = '\0';
    assert_int_equal(cli_run2(ARGS("gateway", "--help"), T(10000)), 0);
    assert_non_null(line = strstr(g_out, "\nOptions:\n"));
    /* one option a line ("  --name ..."), up to the first blank line */
    for (line = strchr(line + 1, '\n') + 1; *line != '\0' && *line != '\n';
         line = strchr(line, '\n') + 1) {
        char flag[64];
        const char *at;
        int found = 0;
        if (strncmp(line, "  --", 4) == 0 && sscanf(line, " %63s", flag) == 1) {
            nflags++;
            for (at = strstr(block, flag); at != NULL && !found; at = strstr(at + 1, flag)) {
                char after = at[strlen(flag)];
                found = !(after == '-' || (after >= 'a' && after <= 'z'));
            }
            if (!found)
                fail_msg("gateway --help lists %s; docs/GATEWAY.md's synopsis does not", flag);
        }
        if (strchr(line, '\n') == NULL)
            break;
    }
    assert_true(nflags >= 18); /* the parse found them: --server ... --quiet */
}

/* Exit status 2, nothing on stdout, a message on stderr that names the
 * command and contains `what`. */
static void
expect_usage(const char *const *argv, const char *what)
{
    int rc = cli_run2(argv, T(10000));
    char prefix[64];

    if (rc != 2)
        fail_msg("streamwire %s ... (%s): exit %d, want 2; stderr: %s", argv[0], what, rc, g_err);
    if (g_out[0] != '\0')
        fail_msg("streamwire %s ... (%s): a usage error printed to stdout: %s", argv[0], what,
                 g_out);
    if (strcmp(argv[0], "bogus") == 0 || argv[0][0] == '-')
        snprintf(prefix, sizeof(prefix), "streamwire: ");
    else
        snprintf(prefix, sizeof(prefix), "streamwire %s: ", argv[0]);
    if (strncmp(g_err, prefix, strlen(prefix)) != 0 || strstr(g_err, what) == NULL)
        fail_msg("streamwire %s ...: stderr should start with '%s' and mention '%s': '%s'", argv[0],
                 prefix, what, g_err);
}

static void
test_usage_errors(void **state)
{
    const char *url = g_nats.url;

    (void)state;
    /* No command, an unknown command or option. */
    {
        int rc = cli_run2(ARGS("streamwire"), T(10000)); /* no arguments at all */
        assert_int_equal(rc, 2);
        assert_non_null(strstr(g_err, "Usage"));
    }
    expect_usage(ARGS("bogus"), "unknown command 'bogus'");
    expect_usage(ARGS("--bogus"), "unknown option '--bogus'");
    /* Unknown flag. */
    expect_usage(ARGS("generate", "--server", url, "--endpoint", "a.b.c", "--bogus"),
                 "unknown option '--bogus'");
    expect_usage(ARGS("worker", "--server", url, "--endpoint", "a.b.c", "--bogus", "1"),
                 "unknown option '--bogus'");
    expect_usage(ARGS("instances", "--server", url, "--bogus"), "unknown option '--bogus'");
    expect_usage(ARGS("demo", "--bogus"), "unknown option '--bogus'");
    expect_usage(ARGS("generate", "--server", url, "--endpoint", "a.b.c", "-j"), "-j");
    expect_usage(ARGS("generate", "--server", url, "--endpoint", "a.b.c", "stray"), "stray");
    expect_usage(ARGS("generate", "--server", url, "--endpoint", "a.b.c", "--json=1"), "--json");
    expect_usage(ARGS("generate", "--server", url, "--endpoint"), "--endpoint");
    /* Missing --server (and --endpoint). */
    expect_usage(ARGS("generate", "--endpoint", "a.b.c"), "--server");
    expect_usage(ARGS("worker", "--endpoint", "a.b.c"), "--server");
    expect_usage(ARGS("instances", "--endpoint", "a.b.c"), "--server");
    expect_usage(ARGS("generate", "--server", url), "--endpoint");
    expect_usage(ARGS("worker", "--server", url), "--endpoint");
    /* Bad endpoint. */
    expect_usage(ARGS("generate", "--server", url, "--endpoint", "a.b"), "a.b");
    expect_usage(ARGS("worker", "--server", url, "--endpoint", "a.b"), "a.b");
    expect_usage(ARGS("instances", "--server", url, "--endpoint", "a.b"), "a.b");
    expect_usage(ARGS("generate", "--server", url, "--endpoint", "a.b.c.d"), "a.b.c.d");
    expect_usage(ARGS("generate", "--server", url, "--endpoint", "a.b*.c"), "a.b*.c");
    /* Bad instance id. */
    expect_usage(ARGS("generate", "--server", url, "--endpoint", "a.b.c", "--instance-id", "x y"),
                 "x y");
    expect_usage(ARGS("worker", "--server", url, "--endpoint", "a.b.c", "--instance-id", "x y"),
                 "x y");
    expect_usage(ARGS("worker", "--server", url, "--endpoint", "a.b.c", "--instance-id", "a.b"),
                 "a.b");
    /* Bad choice values. */
    expect_usage(ARGS("worker", "--server", url, "--endpoint", "a.b.c", "--chaos", "bogus"),
                 "bogus");
    expect_usage(ARGS("worker", "--server", url, "--endpoint", "a.b.c", "--registry", "etcd"),
                 "etcd");
    expect_usage(ARGS("generate", "--server", url, "--endpoint", "a.b.c", "--policy", "fastest"),
                 "fastest");
    /* Out-of-range and non-integer values. */
    expect_usage(ARGS("worker", "--server", url, "--endpoint", "a.b.c", "--tokens", "-1"),
                 "out of range");
    expect_usage(ARGS("worker", "--server", url, "--endpoint", "a.b.c", "--lease-ms", "5"),
                 "out of range");
    expect_usage(
        ARGS("generate", "--server", url, "--endpoint", "a.b.c", "--max-tokens", "4294967296"),
        "out of range");
    expect_usage(ARGS("generate", "--server", url, "--endpoint", "a.b.c", "--max-tokens",
                      "99999999999999999999999"),
                 "out of range");
    expect_usage(ARGS("generate", "--server", url, "--endpoint", "a.b.c", "--timeout-ms", "-5"),
                 "out of range");
    expect_usage(ARGS("generate", "--server", url, "--endpoint", "a.b.c", "--cancel-after", "3x"),
                 "not an integer");
    expect_usage(ARGS("generate", "--server", url, "--endpoint", "a.b.c", "--window", ""),
                 "not an integer");
    expect_usage(ARGS("generate", "--server", url, "--endpoint", "a.b.c", "--credit-bytes", "255"),
                 "out of range");
    expect_usage(
        ARGS("generate", "--server", url, "--endpoint", "a.b.c", "--credit-bytes-max", "1048575"),
        "--credit-bytes-max is less than --credit-bytes");
    expect_usage(ARGS("generate", "--server", url, "--endpoint", "a.b.c", "--credit-bytes",
                      "9000000", "--credit-bytes-max", "8999999"),
                 "--credit-bytes-max is less than --credit-bytes");
    /* A malformed --metrics-listen address (found before connecting). */
    expect_usage(ARGS("worker", "--server", url, "--endpoint", "a.b.c", "--metrics-listen", "9100"),
                 "--metrics-listen");
    expect_usage(
        ARGS("worker", "--server", url, "--endpoint", "a.b.c", "--metrics-listen", "127.0.0.1:"),
        "--metrics-listen");
    expect_usage(ARGS("worker", "--server", url, "--endpoint", "a.b.c", "--metrics-listen",
                      "127.0.0.1:99999"),
                 "--metrics-listen");
    expect_usage(
        ARGS("worker", "--server", url, "--endpoint", "a.b.c", "--metrics-listen", ":9100"),
        "--metrics-listen");
    /* The gateway: no --model, or a malformed one. */
    expect_usage(ARGS("gateway", "--server", url), "--model");
    expect_usage(ARGS("gateway", "--server", url, "--model", "m"), "--model");
    expect_usage(ARGS("gateway", "--server", url, "--model", "m=a.b"), "--model");
    /* A credential file that cannot be read names its flag (docs/SECURITY.md). */
    expect_usage(
        ARGS("generate", "--server", url, "--endpoint", "a.b.c", "--creds", "/nonexistent/u.creds"),
        "--creds");
    expect_usage(
        ARGS("worker", "--server", url, "--endpoint", "a.b.c", "--nkey", "/nonexistent/u.nk"),
        "--nkey");
    expect_usage(ARGS("instances", "--server", url, "--tls-ca", "/nonexistent/ca.pem"), "--tls-ca");
    expect_usage(
        ARGS("gateway", "--server", url, "--model", "m=a.b.c", "--tls-ca", "/nonexistent/ca.pem"),
        "--tls-ca");
    expect_usage(ARGS("generate", "--server", url, "--endpoint", "a.b.c", "--tls-cert",
                      "/nonexistent/c.pem", "--tls-key", "/nonexistent/k.pem"),
                 "--tls-cert");
    /* A directory opens but cannot be read: --creds / was taken as no
     * credentials at all. */
    expect_usage(ARGS("generate", "--server", url, "--endpoint", "a.b.c", "--instance-id", "w",
                      "--creds", "/"),
                 "--creds");
    expect_usage(ARGS("worker", "--server", url, "--endpoint", "a.b.c", "--tls-ca", "/"),
                 "--tls-ca");
    /* Migration moves a stream to an instance the registry picks: not with a
     * fixed instance, nor with --fanout's detectors (addressed directly). */
    expect_usage(ARGS("generate", "--server", url, "--endpoint", "a.b.c", "--instance-id", "w",
                      "--migration-limit", "1"),
                 "--migration-limit needs the registry: not with --instance-id");
    expect_usage(ARGS("generate", "--server", url, "--endpoint", "a.b.c", "--fanout", "2",
                      "--migration-limit", "1"),
                 "--migration-limit needs the registry: not with --fanout");
    /* A second cluster key without the first (key rotation, --open-key-file). */
    expect_usage(
        ARGS("generate", "--server", url, "--endpoint", "a.b.c", "--open-key-file", "/nonexistent"),
        "--open-key-file needs --key-file");
    /* An empty server URL is a usage error for every command. */
    expect_usage(ARGS("generate", "--server", "", "--endpoint", "a.b.c"), "--server");
    expect_usage(ARGS("worker", "--server", "", "--endpoint", "a.b.c"), "--server");
    expect_usage(ARGS("demo", "--server", ""), "--server");
    expect_usage(ARGS("instances", "--server", ""), "--server");
    /* blanks and commas name no server either (" " aborted the process in
     * nats.c 3.4.1: exit 134) */
    expect_usage(ARGS("instances", "--server", " "), "--server");
    expect_usage(ARGS("generate", "--server", " ,\t", "--endpoint", "a.b.c"), "--server");
}

static void
test_unreachable_server(void **state)
{
    const char *bad = "nats://127.0.0.1:1";
    int rc;

    (void)state;
    rc = cli_run2(
        ARGS("generate", "--server", bad, "--endpoint", "a.b.c", "--instance-id", "w", "--json"),
        T(30000));
    assert_int_equal(rc, 3);
    assert_non_null(strstr(g_err, "cannot connect"));
    assert_string_equal(g_out, ""); /* no terminal line: no stream ever existed */
    rc = cli_run2(ARGS("generate", "--server", bad, "--endpoint", "a.b.c"), T(30000));
    assert_int_equal(rc, 3);
    rc = cli_run2(ARGS("instances", "--server", bad), T(30000));
    assert_int_equal(rc, 3);
    assert_non_null(strstr(g_err, "cannot connect"));
    rc = cli_run2(ARGS("instances", "--server", bad, "--json", "--endpoint", "a.b.c"), T(30000));
    assert_int_equal(rc, 3);
    assert_string_equal(g_out, "");
    rc = cli_run2(ARGS("worker", "--server", bad, "--endpoint", "a.b.c", "--quiet"), T(30000));
    assert_int_equal(rc, 3);
    assert_non_null(strstr(g_err, "cannot connect"));
    assert_null(strstr(g_out, "worker ready"));
    rc = cli_run2(ARGS("gateway", "--server", bad, "--model", "m=a.b.c", "--listen", "127.0.0.1:0"),
                  T(30000));
    assert_int_equal(rc, 3);
    assert_non_null(strstr(g_err, "cannot connect"));
    assert_null(strstr(g_out, "gateway ready"));
}

/* A server without JetStream: every command that needs the registry exits 1
 * (a runtime error, not "cannot connect") and says what to check, naming
 * the way around it where there is one; a worker with --registry none
 * serves there, and generate --instance-id reaches it. */
static void
test_no_jetstream(void **state)
{
    swh_nats n;
    const char *url;
    const char *argv[MAX_ARGS];
    char want[128];
    int rc, fd = -1;
    pid_t pid;

    (void)state;
    assert_int_equal(swh_nats_start_no_js(&n, NULL), 0);
    url = n.url;
    rc = cli_run2(ARGS("instances", "--server", url), T(30000));
    assert_int_equal(rc, 1);
    assert_non_null(strstr(g_err, "streamwire instances: cannot read the registry"));
    assert_non_null(strstr(g_err, "(no_responders)"));
    assert_non_null(strstr(g_err, "(does the server run JetStream, nats-server -js?)"));
    assert_string_equal(g_out, "");
    rc = cli_run2(ARGS("generate", "--server", url, "--endpoint", "cli.nojs.gen", "--json"),
                  T(30000));
    assert_int_equal(rc, 1);
    assert_non_null(strstr(g_err, "streamwire generate: cannot open the registry"));
    assert_non_null(strstr(g_err, "nats-server -js? or pass --instance-id)"));
    assert_string_equal(g_out, ""); /* no terminal line: no stream ever existed */
    rc = cli_run2(ARGS("worker", "--server", url, "--endpoint", "cli.nojs.gen", "--quiet"),
                  T(30000));
    assert_int_equal(rc, 1);
    assert_non_null(strstr(g_err, "streamwire worker: cannot register in the nats-kv registry"));
    assert_non_null(strstr(g_err, "nats-server -js? --registry none serves without it)"));
    rc = cli_run2(ARGS("gateway", "--server", url, "--model", "m=cli.nojs.gen", "--listen",
                       "127.0.0.1:0", "--quiet"),
                  T(30000));
    assert_int_equal(rc, 1);
    assert_non_null(strstr(g_err, "streamwire gateway: cannot open the registry"));
    assert_non_null(strstr(g_err, "(does the server run JetStream, nats-server -js?)"));
    assert_null(strstr(g_out, "gateway ready"));

    /* Without the registry: served, and reached by its instance id. */
    args_join(argv,
              ARGS("worker", "--server", url, "--endpoint", "cli.nojs.gen", "--instance-id", "nojs",
                   "--registry", "none", "--tokens", "5", "--quiet"),
              NULL);
    pid = swh_spawn(argv, &fd);
    assert_true(pid > 0);
    kid_add(pid, fd, 0);
    snprintf(want, sizeof(want), "worker ready instance=nojs endpoint=cli.nojs.gen subject=");
    assert_int_equal(swh_wait_line(fd, want, NULL, 0, T(15000)), 0);
    rc = cli_run(ARGS("generate", "--server", url, "--endpoint", "cli.nojs.gen", "--instance-id",
                      "nojs", "--json"),
                 NULL, T(30000));
    check_gen(rc, "completed", "stop", "nojs", 5, 0);
    worker_stop_clean(pid, T(15000));
    swh_nats_stop(&n);
}

/* ======================================================================== */
/* 4. `instances`; drain and deregistration on SIGTERM.                        */

typedef struct inst_row {
    char instance[96];
    char endpoint[128];
    long long age_ms, pid, lease_ms;
    int draining;
} inst_row;

/* Finds "key": in a JSON line; string values into s, numbers into *v,
 * true/false into *v. Returns 0 or -1. */
static int
json_field(const char *line, const char *key, char *s, size_t cap, long long *v)
{
    char k[64];
    const char *p;

    snprintf(k, sizeof(k), "\"%s\":", key);
    p = strstr(line, k);
    if (p == NULL)
        return -1;
    p += strlen(k);
    if (*p == '"') {
        p++;
        return s != NULL ? json_str_at(&p, s, cap) : -1;
    }
    if (v == NULL)
        return -1;
    if (strncmp(p, "true", 4) == 0) {
        *v = 1;
        return 0;
    }
    if (strncmp(p, "false", 5) == 0) {
        *v = 0;
        return 0;
    }
    if (*p == '-') {
        long long x;
        p++;
        if (num_at(&p, &x) != 0)
            return -1;
        *v = -x;
        return 0;
    }
    return num_at(&p, v);
}

/* Runs `instances --json --endpoint ep` and parses its lines into rows.
 * Returns the row count. */
static int
instances_json(const char *ep, inst_row *rows, int max)
{
    int rc = cli_run(ARGS("instances", "--server", g_nats.url, "--json", "--endpoint", ep), NULL,
                     T(20000));
    const char *p = g_out;
    int n = 0;

    if (rc != 0)
        fail_msg("instances --json: exit %d:\n%s", rc, g_out);
    while (*p != '\0') {
        const char *nl = strchr(p, '\n');
        char line[2048];
        size_t len;
        long long d = -1;
        inst_row *r;

        assert_non_null(nl);
        len = (size_t)(nl - p);
        assert_true(len < sizeof(line));
        memcpy(line, p, len);
        line[len] = '\0';
        p = nl + 1;
        assert_true(n < max);
        r = &rows[n++];
        memset(r, 0, sizeof(*r));
        r->age_ms = r->pid = r->lease_ms = -1;
        if (line[0] != '{' || line[len - 1] != '}' ||
            json_field(line, "instance", r->instance, sizeof(r->instance), NULL) ||
            json_field(line, "endpoint", r->endpoint, sizeof(r->endpoint), NULL) ||
            json_field(line, "age_ms", NULL, 0, &r->age_ms) ||
            json_field(line, "pid", NULL, 0, &r->pid) ||
            json_field(line, "lease_ms", NULL, 0, &r->lease_ms) ||
            json_field(line, "draining", NULL, 0, &d))
            fail_msg("instances --json: malformed line: %s", line);
        r->draining = (int)d;
        {
            char tmp[256];
            long long x;
            if (json_field(line, "host", tmp, sizeof(tmp), NULL) ||
                json_field(line, "subject", tmp, sizeof(tmp), NULL) ||
                json_field(line, "revision", NULL, 0, &x))
                fail_msg("instances --json: a field is missing: %s", line);
        }
    }
    return n;
}

static const inst_row *
row_find(const inst_row *rows, int n, const char *id)
{
    for (int i = 0; i < n; i++) {
        if (strcmp(rows[i].instance, id) == 0)
            return &rows[i];
    }
    return NULL;
}

/* The table form: a header, one line per instance starting with its id and
 * naming its endpoint and pid, then "N live instance(s)". */
static void
check_table(const char *ep, const char *const *ids, const pid_t *pids, int n)
{
    int rc = cli_run(ARGS("instances", "--server", g_nats.url, "--endpoint", ep), NULL, T(20000));
    char want[64];
    int lines = 0;

    if (rc != 0)
        fail_msg("instances: exit %d:\n%s", rc, g_out);
    assert_true(strncmp(g_out, "INSTANCE", 8) == 0);
    for (const char *p = g_out; (p = strchr(p, '\n')) != NULL; p++)
        lines++;
    if (lines != n + 2)
        fail_msg("instances table: %d lines, want %d:\n%s", lines, n + 2, g_out);
    for (int i = 0; i < n; i++) {
        char pid[32];
        const char *line = g_out;
        size_t idlen = strlen(ids[i]);

        while ((line = strchr(line, '\n')) != NULL) {
            line++;
            if (strncmp(line, ids[i], idlen) == 0 && line[idlen] == ' ')
                break;
        }
        if (line == NULL)
            fail_msg("instances table does not list %s:\n%s", ids[i], g_out);
        snprintf(pid, sizeof(pid), " %d ", (int)pids[i]);
        {
            const char *eol = strchr(line, '\n');
            char row[512];
            size_t len =
                (size_t)(eol - line) < sizeof(row) - 1 ? (size_t)(eol - line) : sizeof(row) - 1;
            memcpy(row, line, len);
            row[len] = '\0';
            if (strstr(row, ep) == NULL || strstr(row, pid) == NULL || strstr(row, "live") == NULL)
                fail_msg("instances table row for %s lacks its endpoint, pid %d or state: '%s'",
                         ids[i], (int)pids[i], row);
        }
    }
    snprintf(want, sizeof(want), "%d live instance%s\n", n, n == 1 ? "" : "s");
    if (strstr(g_out, want) == NULL)
        fail_msg("instances table lacks '%s':\n%s", want, g_out);
}

static void
test_instances_and_drain(void **state)
{
    const char *ep = "cli.inst.gen";
    const char *ids[2] = {"winst-a", "winst-b"};
    pid_t pids[2];
    inst_row rows[16];
    int n;

    (void)state;
    pids[0] = worker_start(ep, ids[0], NULL);
    pids[1] = worker_start(ep, ids[1], ARGS("--token-interval-ms", "1"));
    worker_start("cli.inst.other", "winst-other", NULL); /* another endpoint */

    n = instances_json(ep, rows, 16);
    if (n != 2)
        fail_msg("instances --json --endpoint %s: %d rows, want 2:\n%s", ep, n, g_out);
    for (int i = 0; i < 2; i++) {
        const inst_row *r = row_find(rows, n, ids[i]);

        if (r == NULL)
            fail_msg("%s not listed:\n%s", ids[i], g_out);
        assert_string_equal(r->endpoint, ep);
        assert_int_equal(r->pid, (long long)pids[i]);
        assert_int_equal(r->lease_ms, 3000);
        assert_true(r->age_ms >= 0);
        if (r->age_ms >= r->lease_ms)
            fail_msg("%s: age_ms %lld >= lease_ms %lld", ids[i], r->age_ms, r->lease_ms);
        assert_int_equal(r->draining, 0);
    }
    check_table(ep, ids, pids, 2);
    /* Without --endpoint every endpoint's workers are listed, ours among them. */
    n = cli_run(ARGS("instances", "--server", g_nats.url, "--json"), NULL, T(20000));
    assert_int_equal(n, 0);
    assert_non_null(strstr(g_out, "\"instance\":\"winst-a\""));
    assert_non_null(strstr(g_out, "\"instance\":\"winst-other\""));

    /* SIGTERM: drain, deregister, exit 0; gone from the listing soon. */
    {
        long long t0 = swh_now_ms();
        int gone = 0;

        worker_stop_clean(pids[0], T(10000));
        while (swh_now_ms() - t0 < T(2000)) {
            n = instances_json(ep, rows, 16);
            if (row_find(rows, n, ids[0]) == NULL) {
                gone = 1;
                break;
            }
            swh_sleep_ms(50);
        }
        if (!gone)
            fail_msg("%s still listed %lld ms after SIGTERM:\n%s", ids[0], swh_now_ms() - t0,
                     g_out);
        print_message("SIGTERM -> exited and deregistered: %lld ms\n", swh_now_ms() - t0);
        assert_int_equal(n, 1);
        assert_non_null(row_find(rows, n, ids[1]));
    }
    check_table(ep, ids + 1, pids + 1, 1);
    /* Routed requests go to the survivor. */
    for (int i = 0; i < 3; i++)
        check_gen(gen_run(ep, ARGS("--json")), "completed", "stop", ids[1], 16, 0);

    worker_stop_clean(pids[1], T(10000));
    n = instances_json(ep, rows, 16);
    assert_int_equal(n, 0);
    check_table(ep, NULL, NULL, 0);
    check_gen(gen_run(ep, ARGS("--json")), "error", "no_instances", "", 0, 1);
}

/* --bucket on worker, generate and instances; --registry none; --lease-ms;
 * SIGINT drains a worker like SIGTERM. */
static void
test_bucket_and_registry_none(void **state)
{
    inst_row rows[8];
    pid_t wb, wn;
    int n, rc;

    (void)state;
    wb = worker_start("cli.bucket.gen", "wbucket",
                      ARGS("--bucket", "cli_other_bucket", "--lease-ms", "2000"));
    wn = worker_start("cli.noreg.gen", "wnoreg", ARGS("--registry", "none"));

    /* Not in the default bucket... */
    n = instances_json("cli.bucket.gen", rows, 8);
    assert_int_equal(n, 0);
    check_gen(gen_run("cli.bucket.gen", ARGS("--json")), "error", "no_instances", "", 0, 1);
    /* ...but in its own. */
    rc =
        cli_run(ARGS("instances", "--server", g_nats.url, "--bucket", "cli_other_bucket", "--json"),
                NULL, T(20000));
    assert_int_equal(rc, 0);
    {
        char id[64];
        long long lease = 0, pid = 0;
        if (json_field(g_out, "instance", id, sizeof(id), NULL) ||
            json_field(g_out, "lease_ms", NULL, 0, &lease) ||
            json_field(g_out, "pid", NULL, 0, &pid))
            fail_msg("instances --bucket: %s", g_out);
        assert_string_equal(id, "wbucket");
        assert_int_equal(lease, 2000);
        assert_int_equal(pid, (long long)wb);
        assert_non_null(strchr(g_out, '\n'));
        assert_string_equal(strchr(g_out, '\n'), "\n"); /* exactly one line */
    }
    check_gen(gen_run("cli.bucket.gen", ARGS("--bucket", "cli_other_bucket", "--json")),
              "completed", "stop", "wbucket", 16, 0);

    /* --registry none: never listed, reachable directly only. */
    rc = cli_run(ARGS("instances", "--server", g_nats.url, "--json"), NULL, T(20000));
    assert_int_equal(rc, 0);
    assert_null(strstr(g_out, "wnoreg"));
    check_gen(gen_run("cli.noreg.gen", ARGS("--json")), "error", "no_instances", "", 0, 1);
    check_gen(gen_run("cli.noreg.gen", ARGS("--instance-id", "wnoreg", "--json")), "completed",
              "stop", "wnoreg", 16, 0);

    /* SIGINT: the same drain as SIGTERM, exit 0. */
    swh_kill(wn, SIGINT);
    {
        int st = kid_wait(wn, T(10000));
        assert_int_not_equal(st, -1);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
    }
    worker_stop_clean(wb, T(10000));
    rc =
        cli_run(ARGS("instances", "--server", g_nats.url, "--bucket", "cli_other_bucket", "--json"),
                NULL, T(20000));
    assert_int_equal(rc, 0);
    assert_string_equal(g_out, "");
}

/* A worker whose --metrics-listen address is taken exits 1 (a runtime
 * error) without leaving a registry entry behind: it binds before it
 * registers. */
static void
test_metrics_listen_fails_unregistered(void **state)
{
    const char *ep = "cli.mbusy.gen";
    struct sockaddr_in a;
    socklen_t alen = sizeof(a);
    char addr[64];
    inst_row rows[4];
    int fd, rc, n;

    (void)state;
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(fd, 1), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &alen), 0);
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", ntohs(a.sin_port));
    rc = cli_run2(ARGS("worker", "--server", g_nats.url, "--endpoint", ep, "--instance-id",
                       "wmbusy", "--lease-ms", "60000", "--metrics-listen", addr),
                  T(15000));
    close(fd);
    if (rc != 1 || strstr(g_err, "--metrics-listen") == NULL)
        fail_msg("worker --metrics-listen %s (in use): exit %d, want 1; stderr: %s", addr, rc,
                 g_err);
    assert_null(strstr(g_out, "worker ready"));
    n = instances_json(ep, rows, 4);
    if (n != 0)
        fail_msg("the worker that could not listen left %d registry entr%s behind: %s", n,
                 n == 1 ? "y" : "ies", rows[0].instance);
}

/* ======================================================================== */
/* 5. Slow consumer.                                                          */

static void
test_slow_consumer(void **state)
{
    const char *tokens = g_slow > 1 ? "600" : "2000";

    (void)state;
    worker_start("cli.slowreader.gen", "wslowreader", ARGS("--tokens", tokens));
    /* The worker can only run a credit window ahead of the reader; every item
     * arrives once, in order (check_gen checks each line). */
    check_gen(gen_run("cli.slowreader.gen",
                      ARGS("--instance-id", "wslowreader", "--read-delay-ms", "1", "--json")),
              "completed", "stop", "wslowreader", atol(tokens), 0);
    /* The same with a byte credit of 256 bytes (a few tokens in flight). */
    check_gen(gen_run("cli.slowreader.gen", ARGS("--instance-id", "wslowreader", "--read-delay-ms",
                                                 "1", "--credit-bytes", "256", "--json")),
              "completed", "stop", "wslowreader", atol(tokens), 0);
}

/* Starts a worker as worker_start does, with --metrics-listen 127.0.0.1:0;
 * its metrics URL into url. */
static pid_t
worker_start_metrics(const char *ep, const char *id, const char *const *extra, char *url,
                     size_t cap)
{
    const char *argv[MAX_ARGS];
    char line[512];
    int fd = -1;
    pid_t pid;

    args_join(argv,
              ARGS("worker", "--server", g_nats.url, "--endpoint", ep, "--instance-id", id,
                   "--quiet", "--metrics-listen", "127.0.0.1:0"),
              extra);
    pid = swh_spawn(argv, &fd);
    assert_true(pid > 0);
    kid_add(pid, fd, 0);
    if (swh_wait_line(fd, "worker metrics url=", line, sizeof(line), T(15000)) != 0)
        fail_msg("worker %s on %s did not print its metrics url", id, ep);
    snprintf(url, cap, "%s", strchr(line, '=') + 1);
    if (swh_wait_line(fd, "worker ready", NULL, 0, T(15000)) != 0)
        fail_msg("worker %s on %s did not print its ready line", id, ep);
    return pid;
}

/* The value of the first sample of the metric name (no labels given) that
 * url serves (fetched with curl), or fails the test. */
static long long
scrape(const char *url, const char *name)
{
    char cmd[512], *body = g_err; /* OUT_CAP bytes, free between cli_run2 calls */
    const char *p;
    size_t n;
    FILE *f;

    snprintf(cmd, sizeof(cmd), "curl -s -f -m 5 '%s'", url);
    f = popen(cmd, "r");
    assert_non_null(f);
    n = fread(body, 1, OUT_CAP - 1, f);
    body[n] = '\0';
    if (pclose(f) != 0)
        fail_msg("GET %s failed", url);
    for (p = body; p != NULL && *p != '\0'; p = strchr(p, '\n'), p = p != NULL ? p + 1 : NULL) {
        if (strncmp(p, name, strlen(name)) == 0 &&
            (p[strlen(name)] == '{' || p[strlen(name)] == ' '))
            return atoll(strchr(p, ' ') + 1);
    }
    fail_msg("%s does not serve %s:\n%s", url, name, body);
    return -1;
}

/* --window is only the first window: with --window-max above it the
 * window grows for a fast reader (the worker waits for credit far less
 * often than with a window fixed at --window-max = --window). */
static void
test_window_grows_to_window_max(void **state)
{
    static const char stalls[] = "streamwire_worker_credit_stalls_total";
    const char *tokens = g_slow > 1 ? "2000" : "5000";
    char url[256];
    long long s0, fixed, grown;

    (void)state;
    worker_start_metrics("cli.window.gen", "wwindow",
                         ARGS("--registry", "none", "--tokens", tokens), url, sizeof(url));
    s0 = scrape(url, stalls);
    check_gen(gen_run("cli.window.gen", ARGS("--instance-id", "wwindow", "--window", "16",
                                             "--window-max", "16", "--json")),
              "completed", "stop", "wwindow", atol(tokens), 0);
    fixed = scrape(url, stalls) - s0;
    s0 += fixed;
    check_gen(gen_run("cli.window.gen", ARGS("--instance-id", "wwindow", "--window", "16",
                                             "--window-max", "4096", "--json")),
              "completed", "stop", "wwindow", atol(tokens), 0);
    grown = scrape(url, stalls) - s0;
    print_message("%s items: %lld credit stalls with a fixed window of 16, %lld growing from 16\n",
                  tokens, fixed, grown);
    if (grown * 4 > fixed)
        fail_msg("--window 16 --window-max 4096: %lld credit stalls, not far fewer than the %lld "
                 "of a fixed window of 16: the window did not grow",
                 grown, fixed);
}

/* ======================================================================== */
/* 6. SIGTERM to a worker mid-stream.                                         */

/* Starts a 40-item worker (20 ms apart) with the extra flags, streams from
 * it, SIGTERMs it after the 5th item, and collects everything. The worker
 * must exit 0. Returns generate's exit status; its stdout is in g_out. */
static int
drain_mid_stream(const char *ep, const char *id, const char *const *extra)
{
    const char *argv[MAX_ARGS];
    pid_t w, g;
    int fd = -1, st;
    size_t used = 0;
    int r;

    args_join(argv, ARGS("--tokens", "40", "--token-interval-ms", "20"), extra);
    w = worker_start(ep, id, argv);
    g = swh_spawn(
        ARGS("generate", "--server", g_nats.url, "--endpoint", ep, "--instance-id", id, "--json"),
        &fd);
    assert_true(g > 0);
    kid_add(g, fd, 0);
    g_out[0] = '\0';
    r = read_until(fd, g_out, OUT_CAP, &used, "{\"seq\":5,", T(15000));
    if (r != 0)
        fail_msg("no 5th item (%s):\n%s", r == -1 ? "timeout" : "end of output", g_out);
    swh_kill(w, SIGTERM);
    r = read_until(fd, g_out, OUT_CAP, &used, NULL, T(30000));
    if (r != 0)
        fail_msg("generate did not finish after the worker's SIGTERM:\n%s", g_out);
    st = kid_wait(g, T(10000));
    assert_int_not_equal(st, -1);
    assert_true(WIFEXITED(st));
    {
        int ws = kid_wait(w, T(15000));

        if (ws == -1)
            fail_msg("worker %s did not exit after SIGTERM", id);
        if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
            fail_msg("worker %s: %s %d after SIGTERM, want exit 0", id,
                     WIFEXITED(ws) ? "exit" : "signal",
                     WIFEXITED(ws) ? WEXITSTATUS(ws) : WTERMSIG(ws));
    }
    return WEXITSTATUS(st);
}

/* Issue 11 #6: a worker outlives a NATS restart by default (it reconnects
 * without limit) and serves again; with --max-reconnect it exits 3 once the
 * attempts run out, and with --max-reconnect 0 (no attempt) at once.
 * (Last of the file's cases that need the server: it stops and restarts
 * the shared one.) */
static void
test_worker_reconnects_or_exits(void **state)
{
    pid_t keep, quit, quit0;
    long long t0;
    int st;

    (void)state;
    keep = worker_start("cli.reconnect.gen", "wkeep", ARGS("--registry", "none"));
    quit = worker_start("cli.reconnect.gen", "wquit",
                        ARGS("--registry", "none", "--max-reconnect", "1"));
    quit0 = worker_start("cli.reconnect.gen", "wquit0",
                         ARGS("--registry", "none", "--max-reconnect", "0"));
    swh_nats_stop_keep(&g_nats);
    t0 = swh_now_ms();
    st = kid_wait(quit0, T(2000));
    if (st == -1)
        fail_msg("the worker with --max-reconnect 0 did not exit within %d ms of the server "
                 "going away",
                 T(2000));
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 3);
    print_message("--max-reconnect 0: exit 3 %lld ms after the server stopped\n",
                  swh_now_ms() - t0);
    st = kid_wait(quit, T(15000));
    if (st == -1)
        fail_msg("the worker with --max-reconnect 1 did not exit after the server went away");
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 3);
    assert_int_equal(swh_nats_restart(&g_nats, 500), 0);
    swh_sleep_ms(T(1500)); /* the other worker reconnects and resubscribes */
    check_gen(gen_run("cli.reconnect.gen", ARGS("--instance-id", "wkeep", "--json")), "completed",
              "stop", "wkeep", 16, 0);
    worker_stop_clean(keep, T(10000));
}

/* generate --fanout: N in-process detectors, merged frames (sw_merge). */
static void
test_fanout_demo(void **state)
{
    int rc;
    (void)state;
    rc = gen_run("cli.fanout.gen",
                 ARGS("--fanout", "3", "--chunks", "1,5,20", "--prompt",
                      "The quick brown fox jumps over the lazy dog, twice.", "--json"));
    assert_int_equal(rc, 0);
    assert_string_equal(g_out,
                        "{\"frame\":20,\"text\":\"The quick brown fox \",\"results\":[20,4,1]}\n"
                        "{\"frame\":40,\"text\":\"jumps over the lazy \",\"results\":[20,4,1]}\n"
                        "{\"frame\":51,\"text\":\"dog, twice.\",\"results\":[11,3,1]}\n"
                        "{\"terminal\":\"completed\",\"reason\":\"stop\",\"frames\":3,"
                        "\"failed_stream\":-1}\n");
    /* bad lists are usage errors */
    assert_int_equal(gen_run("cli.fanout.gen", ARGS("--fanout", "2", "--chunks", "0,5")), 2);
    assert_int_equal(gen_run("cli.fanout.gen", ARGS("--fanout", "2", "--chunks", "5,x")), 2);
}

static void
test_sigterm_mid_stream_completes(void **state)
{
    int rc;

    (void)state;
    rc = drain_mid_stream("cli.drain.gen", "wdrain", NULL);
    check_gen(rc, "completed", "stop", "wdrain", 40, 0);
}

static void
test_sigterm_mid_stream_short_grace(void **state)
{
    int rc;
    long n;

    (void)state;
    rc = drain_mid_stream("cli.drainshort.gen", "wdrainshort", ARGS("--drain-grace-ms", "100"));
    n = check_gen(rc, "error", "instance_lost", "wdrainshort", -1, 1);
    assert_true(n >= 5 && n < 40);
}

/* ======================================================================== */
/* 7. `streamwire demo`.                                                      */

static void
test_demo(void **state)
{
    long long t0 = swh_now_ms();
    const char *loss;
    int rc;

    (void)state;
    rc = cli_run(ARGS("demo"), NULL, T(90000));
    print_message("streamwire demo: exit %d in %lld ms\n", rc, swh_now_ms() - t0);
    if (rc != 0 || strstr(g_out, "11/11 scenarios ended in their expected terminal") == NULL)
        fail_msg("demo: exit %d:\n%s", rc, g_out);
    /* The instance-loss act: its closing line ends in "ok". */
    loss = strstr(g_out, "\nInstance loss:");
    assert_non_null(loss);
    {
        const char *last = NULL, *p = loss;
        while ((p = strstr(p + 1, "\nInstance loss:")) != NULL)
            last = p;
        if (last == NULL)
            fail_msg("demo: no instance-loss verdict line:\n%s", g_out);
        {
            const char *eol = strchr(last + 1, '\n');
            assert_non_null(eol);
            if (eol - last < 3 || strncmp(eol - 2, "ok", 2) != 0)
                fail_msg("demo: instance-loss verdict is not ok:\n%s", g_out);
        }
    }
    assert_null(strstr(g_out, "UNEXPECTED"));
    assert_null(strstr(g_out, "FAIL"));
    assert_non_null(strstr(g_out, "cleaned up"));
}

/* ======================================================================== */

#define T_(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

/* Issue 11 #3: liveness never depends on clock agreement. A worker whose
 * wall clock is an hour ahead (and, second round, an hour behind) of this
 * process (Debian's faketime) registers, stays live in this process's
 * registry view for well over its lease, is routed to, and once killed
 * lapses after about one lease, judged by this process's own monotonic
 * clock. (With wall-clock judgement it would never lapse, or at once.) */
static int64_t g_listed_started; /* the entry's started_unix_ms (the worker's clock) */

static int
listed(sw_registry *reg, const char *ep, const char *id)
{
    sw_instance *v = NULL;
    size_t n = 0;
    int found = 0;
    if (sw_registry_list(reg, ep, &v, &n) != SW_OK)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (strcmp(v[i].instance_id, id) == 0) {
            found = 1;
            g_listed_started = v[i].started_unix_ms;
        }
    sw_instances_free(v, n);
    return found;
}

static void
test_clocks_an_hour_apart(void **state)
{
    static const char *offsets[2] = {"+1h", "-1h"};
    sw_conn *c = NULL;
    sw_conn_opts co;
    sw_registry *reg = NULL;
    sw_registry_opts ro;
    (void)state;
    /* libfaketime preloaded into the worker alone (the faketime wrapper
     * would stand between us and the worker's pid). Multithreaded build:
     * the worker has threads. */
    static const char lib[] = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";
#ifdef SW_SANITIZED
    /* A sanitizer runtime must come first in a process: libfaketime cannot
     * be preloaded into the sanitized CLI. The normal build runs this. */
    print_message("skipped under sanitizers (libfaketime cannot be preloaded)\n");
    skip();
#endif
    if (access(lib, R_OK) != 0)
        fail_msg("libfaketime is not installed (scripts/deps installs faketime)");
    sw_conn_opts_init(&co);
    co.url = g_nats.url;
    assert_int_equal(sw_conn_open(&c, &co), SW_OK);
    sw_registry_opts_init(&ro);
    assert_int_equal(sw_registry_open(&reg, c, &ro), SW_OK);
    for (int k = 0; k < 2; k++) {
        char ep[64], id[32];
        const char *argv[24];
        int fd = -1, st, n = 0;
        pid_t pid;
        int64_t t0, gone_ms = -1;
        snprintf(ep, sizeof(ep), "cli.clock%d.gen", k);
        snprintf(id, sizeof(id), "wclock%d", k);
        argv[n++] = "streamwire";
        argv[n++] = "worker";
        argv[n++] = "--server";
        argv[n++] = g_nats.url;
        argv[n++] = "--endpoint";
        argv[n++] = ep;
        argv[n++] = "--instance-id";
        argv[n++] = id;
        argv[n++] = "--lease-ms";
        argv[n++] = "1000";
        argv[n++] = "--tokens";
        argv[n++] = "3";
        argv[n++] = "--quiet";
        argv[n] = NULL;
        setenv("LD_PRELOAD", lib, 1);
        setenv("FAKETIME", offsets[k], 1);
        pid = swh_spawn_path(swh_cli_path(), argv, &fd, -1);
        unsetenv("LD_PRELOAD");
        unsetenv("FAKETIME");
        assert_true(pid > 0);
        assert_int_equal(swh_wait_line(fd, "worker ready", NULL, 0, T(10000)), 0);
        t0 = swh_now_ms();
        while (!listed(reg, ep, id) && swh_now_ms() - t0 < T(5000))
            swh_sleep_ms(20);
        assert_true(listed(reg, ep, id));
        {
            /* the skew is real: the worker stamped its entry an hour off */
            int64_t now_unix = (int64_t)time(NULL) * 1000;
            int64_t skew = g_listed_started - now_unix;
            int64_t want = k == 0 ? 3600000 : -3600000;
            if (skew < want - 300000 || skew > want + 300000)
                fail_msg("clock %s: the worker's entry is %lld ms off, not about an hour",
                         offsets[k], (long long)skew);
        }
        /* three leases and more: still live here, and served when routed */
        t0 = swh_now_ms();
        while (swh_now_ms() - t0 < 3500) {
            if (!listed(reg, ep, id))
                fail_msg("clock %s: the entry lapsed after %lld ms although the worker lives",
                         offsets[k], (long long)(swh_now_ms() - t0));
            check_gen(gen_run(ep, ARGS("--json")), "completed", "stop", id, 3, 0);
        }
        /* killed: it lapses after about a lease, by this process's clock */
        swh_kill(pid, SIGKILL);
        (void)swh_wait_exit(pid, T(5000), &st);
        close(fd);
        t0 = swh_now_ms();
        while (swh_now_ms() - t0 < T(6000)) {
            if (!listed(reg, ep, id)) {
                gone_ms = swh_now_ms() - t0;
                break;
            }
            swh_sleep_ms(20);
        }
        print_message("clock %s: lived past 3 leases; killed -> lapsed after %lld ms (lease "
                      "1000)\n",
                      offsets[k], (long long)gone_ms);
        assert_true(gone_ms >= 0 && gone_ms <= T(2500));
    }
    sw_registry_close(reg);
    sw_conn_close(c);
}

int
main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        T_(test_completed),
        T_(test_incomplete_max_tokens),
        T_(test_failed_engine_error),
        T_(test_cancelled),
        T_(test_generate_shows_items_live),
        T_(test_stream_incomplete_hang),
        T_(test_stream_incomplete_no_final),
        T_(test_item_after_final),
        T_(test_decode_error),
        T_(test_sequence_gap),
        T_(test_no_responders),
        T_(test_payload_too_large),
        T_(test_deadline_exceeded),
        T_(test_instance_lost_crash),
        T_(test_no_instances),
        T_(test_routed_by_registry),
        T_(test_cancel_after_zero),
        T_(test_overloaded_and_sigint),
        T_(test_readable_output),
        T_(test_help),
        T_(test_help_flags_in_readme),
        T_(test_gateway_flags_documented),
        T_(test_usage_errors),
        T_(test_unreachable_server),
        T_(test_no_jetstream),
        T_(test_instances_and_drain),
        T_(test_bucket_and_registry_none),
        T_(test_metrics_listen_fails_unregistered),
        T_(test_slow_consumer),
        T_(test_window_grows_to_window_max),
        T_(test_fanout_demo),
        T_(test_sigterm_mid_stream_completes),
        T_(test_worker_reconnects_or_exits),
        T_(test_clocks_an_hour_apart),
        T_(test_sigterm_mid_stream_short_grace),
        T_(test_demo),
    };
    signal(SIGPIPE, SIG_IGN);
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests_name("cli", tests, group_setup, group_teardown);
}
