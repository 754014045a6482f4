/* bench/spawn.c -- streamwire-bench: processes: our own nats-server
 * (support/natsd.c), the registry of child processes killed on exit or
 * SIGINT/SIGTERM, and the helpers that run this binary in a hidden mode as a
 * child (pipes, line commands, reaping). The kids table is written by the main
 * thread and read by the signal handler.
 *
 * Threads and locks: The kids table is written by the main thread and read by
 * the signal handler (async-signal-safe cleanup). */
#include "bench.h"

/* ------------------------------------------------------------------ nats-server */

/* Our own nats-server (not with --server), started and stopped by the shared
 * launcher in support/natsd.c (also used by the CLI demo and the integration
 * tests). Its pid gives the server CPU and RSS figures (/proc). */
swh_nats g_nats;
char g_server_version[64] = "external";
/* Child processes (workers, frontends) started by this process; killed on
 * exit. Only the main thread adds and removes; the signal handler reads. */
#define MAX_KIDS 32
static volatile pid_t g_kids[MAX_KIDS];

static void
kid_add(pid_t pid)
{
    for (int i = 0; i < MAX_KIDS; i++)
        if (g_kids[i] == 0) {
            g_kids[i] = pid;
            return;
        }
}

static void
kid_del(pid_t pid)
{
    for (int i = 0; i < MAX_KIDS; i++)
        if (g_kids[i] == pid)
            g_kids[i] = 0;
}

void
cleanup(void)
{
    for (int i = 0; i < MAX_KIDS; i++) {
        pid_t k = g_kids[i];
        if (k > 0) {
            kill(k, SIGKILL);
            kill(k, SIGCONT);
            waitpid(k, NULL, 0);
            g_kids[i] = 0;
        }
    }
    swh_nats_stop(&g_nats);
}

/* Async-signal-safe version of cleanup for SIGINT/SIGTERM. */
void
on_signal(int sig)
{
    for (int i = 0; i < MAX_KIDS; i++)
        if (g_kids[i] > 0) {
            kill(g_kids[i], SIGKILL);
            kill(g_kids[i], SIGCONT);
        }
    if (g_nats.pid > 0) {
        kill(g_nats.pid, SIGKILL);
        waitpid(g_nats.pid, NULL, 0);
    }
    if (g_nats.dir[0] != '\0') {
        pid_t p = fork();
        if (p == 0) {
            execlp("rm", "rm", "-rf", g_nats.dir, (char *)NULL);
            _exit(127);
        }
        if (p > 0)
            waitpid(p, NULL, 0);
    }
    _exit(128 + sig);
}

/* "nats-server: vX.Y.Z" of the running server's binary. */
void
server_version(pid_t pid)
{
    char exe[64], bin[1024], cmd[1100];
    ssize_t n;
    FILE *p;
    snprintf(exe, sizeof(exe), "/proc/%d/exe", (int)pid);
    if ((n = readlink(exe, bin, sizeof(bin) - 1)) <= 0)
        return;
    bin[n] = '\0';
    snprintf(cmd, sizeof(cmd), "'%s' --version 2>&1", bin);
    if ((p = popen(cmd, "r")) == NULL)
        return;
    if (fgets(g_server_version, sizeof(g_server_version), p) != NULL)
        g_server_version[strcspn(g_server_version, "\r\n")] = '\0';
    pclose(p);
}

/* Starts nats-server -js on a free port with a fresh store dir (support/natsd.c).
 * bin (--nats-server) is handed to the launcher as SW_NATS_SERVER; a name
 * without a slash is looked up on PATH first, as execlp did. NULL: the
 * launcher's default (SW_NATS_SERVER, else nats-server on PATH). Called
 * before any thread exists (it forks). */
void
start_server(const char *bin)
{
    if (bin != NULL && strchr(bin, '/') == NULL) {
        static char found[1024];
        const char *path = getenv("PATH");
        for (found[0] = '\0'; path != NULL && *path != '\0' && found[0] == '\0';) {
            size_t len = strcspn(path, ":");
            snprintf(found, sizeof(found), "%.*s/%s", (int)len, path, bin);
            if (len == 0 || access(found, X_OK) != 0)
                found[0] = '\0';
            path = path[len] == ':' ? path + len + 1 : NULL;
        }
        if (found[0] == '\0')
            die("%s not found on PATH (use --nats-server PATH or --server)", bin);
        bin = found;
    }
    if (bin != NULL)
        setenv("SW_NATS_SERVER", bin, 1);
    if (swh_nats_start(&g_nats, NULL) != 0)
        die("could not start %s (is it on PATH? use --nats-server or --server)",
            bin != NULL ? bin : "nats-server");
    server_version(g_nats.pid);
}

/* The server whose CPU and memory are measured: ours, or --server-pid's
 * (never signalled: it is not ours). */
static pid_t
watched_server(void)
{
    return g_nats.pid > 0 ? g_nats.pid : cfg.server_pid;
}

long
server_rss_kb(void)
{
    char path[64];
    if (watched_server() <= 0)
        return -1;
    snprintf(path, sizeof(path), "/proc/%d/status", (int)watched_server());
    return status_kb(path, "VmRSS");
}

/* Server CPU time in microseconds (utime + stime), -1 if unknown. */
int64_t
server_cpu_us(void)
{
    return pid_cpu_us(watched_server());
}

int64_t
pid_cpu_us(pid_t pid)
{
    char path[64], buf[1024];
    FILE *f;
    char *p;
    unsigned long ut = 0, st = 0;
    if (pid <= 0)
        return -1;
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    if ((f = fopen(path, "r")) == NULL)
        return -1;
    p = fgets(buf, sizeof(buf), f);
    fclose(f);
    if (p == NULL || (p = strrchr(buf, ')')) == NULL)
        return -1;
    /* fields after ")": state(3) ... utime(14) stime(15) */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (int64_t)(ut + st) * 1000000 / sysconf(_SC_CLK_TCK);
}

int
child_line(child *c, char *out, size_t cap, int timeout_ms)
{
    int64_t until = now_ns() + (int64_t)timeout_ms * 1000000LL;
    for (;;) {
        char *nl = memchr(c->buf, '\n', c->blen);
        struct pollfd p;
        ssize_t n;
        int left;
        if (nl != NULL) {
            size_t l = (size_t)(nl - c->buf);
            snprintf(out, cap, "%.*s", (int)l, c->buf);
            memmove(c->buf, nl + 1, c->blen - l - 1);
            c->blen -= l + 1;
            return 0;
        }
        left = (int)((until - now_ns()) / 1000000LL);
        if (left <= 0 || c->blen >= sizeof(c->buf) - 1)
            return -1;
        p.fd = c->from;
        p.events = POLLIN;
        if (poll(&p, 1, left) <= 0)
            continue;
        n = read(c->from, c->buf + c->blen, sizeof(c->buf) - 1 - c->blen);
        if (n <= 0)
            return -1;
        c->blen += (size_t)n;
    }
}

int
child_cmd(child *c, const char *cmd, char *out, size_t cap)
{
    size_t l = strlen(cmd);
    if (write(c->to, cmd, l) != (ssize_t)l || write(c->to, "\n", 1) != 1)
        return -1;
    return child_line(c, out, cap, 30000);
}

void
child_stat(child *c, cstat *st)
{
    char line[256];
    if (child_cmd(c, "stat", line, sizeof(line)) != 0 ||
        sscanf(line, "stat %ld %lu %lu %lld %lu", &st->rss_kb, &st->raw, &st->sw, &st->cpu_us,
               &st->held) != 5)
        die("idle worker: bad reply to stat");
}

pid_t
spawn_prog(const char *path, char *const argv[], int out_fd, int *pipe_rd)
{
    posix_spawn_file_actions_t fa;
    int p[2] = {-1, -1};
    pid_t pid;
    if (out_fd < 0 && pipe2(p, O_CLOEXEC) != 0)
        die("pipe: %s", strerror(errno));
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out_fd >= 0 ? out_fd : p[1], 1);
    if (!cfg.verbose)
        posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    if (posix_spawn(&pid, path, &fa, NULL, argv, environ) != 0)
        die("posix_spawn %s: %s", path, strerror(errno));
    posix_spawn_file_actions_destroy(&fa);
    kid_add(pid);
    if (out_fd < 0) {
        close(p[1]);
        *pipe_rd = p[0];
    }
    return pid;
}

int
reap_prog(pid_t pid, int wait_ms, struct rusage *ru)
{
    int status = -1;
    struct rusage dummy;
    if (ru == NULL)
        ru = &dummy;
    memset(ru, 0, sizeof(*ru));
    for (int i = 0; wait_ms >= 0 && i < wait_ms / 10; i++) {
        if (wait4(pid, &status, WNOHANG, ru) == pid)
            goto done;
        sleep_ms(10);
    }
    if (wait_ms >= 0) {
        kill(pid, SIGKILL);
        kill(pid, SIGCONT);
    }
    if (wait4(pid, &status, 0, ru) != pid)
        status = -1;
done:
    kid_del(pid);
    return status;
}

/* Starts this binary in a hidden mode (argv[1] onwards) with its stdin and
 * stdout on pipes; does not wait for it. Main thread only (the child's
 * PR_SET_PDEATHSIG fires when the spawning thread exits). */
void
child_start(child *c, char *const argv[])
{
    int in[2], out[2];
    posix_spawn_file_actions_t fa;
    memset(c, 0, sizeof(*c));
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0)
        die("pipe: %s", strerror(errno));
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    if (posix_spawn(&c->pid, "/proc/self/exe", &fa, NULL, argv, environ) != 0)
        die("posix_spawn %s: %s", argv[1], strerror(errno));
    posix_spawn_file_actions_destroy(&fa);
    kid_add(c->pid);
    close(in[0]);
    close(out[1]);
    c->to = in[1];
    c->from = out[0];
}

/* Closes the pipes, kills the child if it has not exited within wait_ms,
 * and reaps it. */
void
child_reap(child *c, int wait_ms)
{
    if (c->pid <= 0)
        return;
    close(c->to);
    close(c->from);
    (void)reap_prog(c->pid, wait_ms, NULL);
    c->pid = -1;
}

void
child_spawn(child *c, unsigned n)
{
    char nbuf[32], line[64];
    char *argv[5];
    snprintf(nbuf, sizeof(nbuf), "%u", n);
    argv[0] = (char *)"streamwire-bench";
    argv[1] = (char *)"--idle-worker";
    argv[2] = (char *)g_url;
    argv[3] = nbuf;
    argv[4] = NULL;
    child_start(c, argv);
    if (child_line(c, line, sizeof(line), 20000) != 0 || strcmp(line, "ready") != 0)
        die("idle worker did not start");
}

void
child_quit(child *c)
{
    char line[64];
    (void)child_cmd(c, "quit", line, sizeof(line));
    child_reap(c, 5000);
}
