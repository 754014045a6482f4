/* support/natsd.c -- a throwaway nats-server and child processes; see natsd.h.
 * Part of the sw_testsupport static library (the CLI's demo, the bench and
 * every integration test link it), so keep it free of library internals.
 * No threads of its own, no locks. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "natsd.h"

#define SWH_NATS_ATTEMPTS 5
#define SWH_NATS_READY_MS 10000

int
swh_slow(void)
{
    const char *v = getenv("SW_SLOW");

    if (v != NULL && v[0] != '\0' && strcmp(v, "0") != 0)
        return 3;
    return 1;
}

long
swh_rss_kb(pid_t pid)
{
    char path[64], line[256];
    long kb = -1;
    FILE *f;
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    if ((f = fopen(path, "r")) == NULL)
        return -1;
    while (fgets(line, sizeof(line), f) != NULL)
        if (sscanf(line, "VmRSS: %ld", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

long long
swh_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void
swh_sleep_ms(long ms)
{
    struct timespec ts;

    if (ms <= 0)
        return;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (ms % 1000) * 1000000L;
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

int
swh_rmtree(const char *path)
{
    struct stat st;
    DIR *d;
    struct dirent *de;
    char child[4096];
    int rc = 0;

    if (path == NULL || path[0] == '\0')
        return -1;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(st.st_mode))
        return unlink(path) == 0 ? 0 : -1;
    d = opendir(path);
    if (d == NULL)
        return -1;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        if ((size_t)snprintf(child, sizeof(child), "%s/%s", path, de->d_name) >= sizeof(child)) {
            rc = -1;
            continue;
        }
        if (swh_rmtree(child) != 0)
            rc = -1;
    }
    closedir(d);
    if (rmdir(path) != 0)
        rc = -1;
    return rc;
}

int
swh_mkdtemp(char *out, size_t cap, const char *prefix)
{
    const char *tmp = getenv("TMPDIR");

    if (tmp == NULL || tmp[0] == '\0')
        tmp = "/tmp";
    if ((size_t)snprintf(out, cap, "%s/%s-XXXXXX", tmp, prefix) >= cap)
        return -1;
    if (mkdtemp(out) == NULL) {
        fprintf(stderr, "cannot create a temp dir under %s: %s\n", tmp, strerror(errno));
        out[0] = '\0';
        return -1;
    }
    return 0;
}

/* swh_spawn_path, plus: out_fd >= 0 becomes the child's stdout (stdout_fd
 * must then be NULL). */
static pid_t
swh_spawn_fds(const char *path, const char *const argv[], int *stdout_fd, int out_fd, int stderr_fd)
{
    int p[2] = {-1, -1};
    pid_t parent = getpid();
    pid_t pid;

    if (stdout_fd != NULL) {
        *stdout_fd = -1;
        if (pipe(p) != 0) {
            fprintf(stderr, "pipe: %s\n", strerror(errno));
            return -1;
        }
        fcntl(p[0], F_SETFD, FD_CLOEXEC);
        fcntl(p[1], F_SETFD, FD_CLOEXEC);
    }
    pid = fork();
    if (pid < 0) {
        fprintf(stderr, "fork: %s\n", strerror(errno));
        if (p[0] >= 0) {
            close(p[0]);
            close(p[1]);
        }
        return -1;
    }
    if (pid == 0) {
        /* Child: async-signal-safe calls only until exec. */
        sigset_t none;
        struct sigaction dfl;

        if (p[1] >= 0 && dup2(p[1], STDOUT_FILENO) < 0)
            _exit(127);
        if (out_fd >= 0 && dup2(out_fd, STDOUT_FILENO) < 0)
            _exit(127);
        if (stderr_fd >= 0 && dup2(stderr_fd, STDERR_FILENO) < 0)
            _exit(127);
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        memset(&dfl, 0, sizeof(dfl));
        dfl.sa_handler = SIG_DFL;
        sigaction(SIGTERM, &dfl, NULL);
        sigaction(SIGINT, &dfl, NULL);
        sigaction(SIGPIPE, &dfl, NULL);
#ifdef __linux__
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
#else
        (void)parent;
#endif
        execv(path, (char *const *)argv);
        _exit(127);
    }
    if (p[1] >= 0)
        close(p[1]);
    if (stdout_fd != NULL)
        *stdout_fd = p[0];
    return pid;
}

pid_t
swh_spawn_path(const char *path, const char *const argv[], int *stdout_fd, int stderr_fd)
{
    return swh_spawn_fds(path, argv, stdout_fd, -1, stderr_fd);
}

int
swh_wait_line(int fd, const char *prefix, char *buf, size_t cap, int timeout_ms)
{
    char line[4096];
    size_t n = 0;
    size_t plen = prefix != NULL ? strlen(prefix) : 0;
    long long deadline = timeout_ms >= 0 ? swh_now_ms() + timeout_ms : -1;

    for (;;) {
        struct pollfd pfd;
        int wait_ms = -1;
        int pr;
        ssize_t r;
        char c;

        if (deadline >= 0) {
            long long left = deadline - swh_now_ms();
            if (left <= 0)
                return -1;
            wait_ms = (int)left;
        }
        pfd.fd = fd;
        pfd.events = POLLIN;
        pfd.revents = 0;
        pr = poll(&pfd, 1, wait_ms);
        if (pr < 0) {
            if (errno == EINTR)
                continue;
            return -2;
        }
        if (pr == 0)
            continue; /* deadline check at the top */
        r = read(fd, &c, 1);
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return -2;
        }
        if (r == 0 || c == '\n') {
            int match;

            line[n] = '\0';
            match = (r == 1 || n > 0) && strncmp(line, prefix != NULL ? prefix : "", plen) == 0;
            if (match) {
                if (buf != NULL && cap > 0) {
                    size_t k = n < cap - 1 ? n : cap - 1;
                    memcpy(buf, line, k);
                    buf[k] = '\0';
                }
                return 0;
            }
            if (r == 0)
                return -2;
            n = 0;
            continue;
        }
        if (n < sizeof(line) - 1)
            line[n++] = c;
    }
}

void
swh_kill(pid_t pid, int sig)
{
    if (pid > 0)
        kill(pid, sig);
}

int
swh_wait_exit(pid_t pid, int timeout_ms, int *status)
{
    long long deadline = timeout_ms >= 0 ? swh_now_ms() + timeout_ms : -1;
    int st = 0;

    if (pid <= 0)
        return -1;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);

        if (r == pid) {
            if (status != NULL)
                *status = st;
            return 0;
        }
        if (r < 0 && errno != EINTR)
            return -1;
        if (deadline >= 0 && swh_now_ms() >= deadline)
            return -1;
        swh_sleep_ms(5);
    }
}

int
swh_freeze(pid_t pid, int timeout_ms)
{
    long long deadline = swh_now_ms() + timeout_ms;
    int st = 0;

    if (pid <= 0 || kill(pid, SIGSTOP) != 0)
        return -1;
    for (;;) {
        /* the stop is reported once every thread of pid has stopped */
        pid_t r = waitpid(pid, &st, WUNTRACED | WNOHANG);

        if (r == pid && WIFSTOPPED(st))
            return 0;
        if ((r < 0 && errno != EINTR) || r == pid || swh_now_ms() >= deadline)
            return -1;
        swh_sleep_ms(1);
    }
}

int
swh_terminate(pid_t pid, int grace_ms)
{
    int st = 0;

    if (pid <= 0)
        return -1;
    kill(pid, SIGTERM);
    if (swh_wait_exit(pid, grace_ms, &st) == 0)
        return st;
    kill(pid, SIGKILL);
    if (swh_wait_exit(pid, 5000, &st) == 0)
        return st;
    return -1;
}

/* ------------------------------------------------------------------------ */
/* nats-server                                                               */

static int
swh_executable(const char *path)
{
    struct stat st;

    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* Finds the nats-server binary; 0 and the path in out, or -1. */
static int
swh_find_nats_server(char *out, size_t cap)
{
    static const char *const fallbacks[] = {"/usr/sbin/nats-server", "/usr/local/bin/nats-server",
                                            "/usr/bin/nats-server"};
    const char *env = getenv("SW_NATS_SERVER");
    const char *path = getenv("PATH");
    size_t i;

    if (env != NULL && env[0] != '\0') {
        if (!swh_executable(env)) {
            fprintf(stderr, "SW_NATS_SERVER=%s is not an executable file\n", env);
            return -1;
        }
        snprintf(out, cap, "%s", env);
        return 0;
    }
    while (path != NULL && *path != '\0') {
        const char *end = strchr(path, ':');
        size_t len = end != NULL ? (size_t)(end - path) : strlen(path);

        if (len > 0 && (size_t)snprintf(out, cap, "%.*s/nats-server", (int)len, path) < cap &&
            swh_executable(out))
            return 0;
        path = end != NULL ? end + 1 : NULL;
    }
    for (i = 0; i < sizeof(fallbacks) / sizeof(fallbacks[0]); i++) {
        if (swh_executable(fallbacks[i])) {
            snprintf(out, cap, "%s", fallbacks[i]);
            return 0;
        }
    }
    fprintf(stderr, "nats-server not found: install it (scripts/deps) or set SW_NATS_SERVER "
                    "to its path\n");
    return -1;
}

/* A port that was free a moment ago on 127.0.0.1 (bind port 0). */
int
swh_free_port(void)
{
    struct sockaddr_in a;
    socklen_t alen = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int port = -1;

    if (fd < 0)
        return -1;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &alen) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static int
swh_tcp_accepts(int port)
{
    struct sockaddr_in a;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int ok;

    if (fd < 0)
        return 0;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    ok = connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(fd);
    return ok;
}

/* 1 if the file contains needle within its first 64 KiB. */
static int
swh_file_contains(const char *path, const char *needle)
{
    char buf[65536];
    size_t n;
    FILE *f = fopen(path, "r");

    if (f == NULL)
        return 0;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, needle) != NULL;
}

static void
swh_print_log_tail(const char *path)
{
    char buf[2048];
    FILE *f = fopen(path, "r");
    long size;
    size_t n;

    if (f == NULL)
        return;
    if (fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) > (long)sizeof(buf) - 1)
        fseek(f, size - (long)sizeof(buf) + 1, SEEK_SET);
    else
        fseek(f, 0, SEEK_SET);
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    fprintf(stderr, "--- %s (tail) ---\n%s--- end ---\n", path, buf);
}

int
swh_write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    int rc;

    if (f == NULL)
        return -1;
    rc = fputs(text, f) < 0 ? -1 : 0;
    if (fclose(f) != 0)
        rc = -1;
    return rc;
}

/* One attempt: 0 ready, 1 died early (retry), -1 hard failure. */
/* Starts nats-server on n->port with JetStream in js, the config file conf
 * (NULL: none), output to log. Sets n->pid. 0, or -1 (reason printed). */
static int
swh_nats_spawn(swh_nats *n, const char *bin, const char *js, const char *conf, const char *log)
{
    char portstr[16];
    const char *argv[16];
    int argc = 0, logfd;
    snprintf(portstr, sizeof(portstr), "%d", n->port);
    logfd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (logfd < 0) {
        fprintf(stderr, "cannot open %s: %s\n", log, strerror(errno));
        return -1;
    }
    fcntl(logfd, F_SETFD, FD_CLOEXEC);
    argv[argc++] = bin;
    argv[argc++] = "-a";
    argv[argc++] = "127.0.0.1";
    argv[argc++] = "-p";
    argv[argc++] = portstr;
    if (!n->no_js) {
        argv[argc++] = "-js";
        argv[argc++] = "-sd";
        argv[argc++] = js;
    }
    if (conf != NULL) {
        argv[argc++] = "-c";
        argv[argc++] = conf;
    }
    argv[argc] = NULL;
    n->pid = swh_spawn_fds(bin, argv, NULL, logfd, logfd);
    close(logfd);
    if (n->pid < 0) {
        n->pid = 0;
        return -1;
    }
    return 0;
}

/* Removes n->dir and lets go of its owner lock. */
static void
swh_dir_release(swh_nats *n)
{
    if (n->dir[0] != '\0')
        swh_rmtree(n->dir);
    n->dir[0] = '\0';
    if (n->lock_fd > 0)
        close(n->lock_fd);
    n->lock_fd = 0;
}

static int
swh_nats_try(swh_nats *n, const char *bin, const char *extra_conf, int last_attempt)
{
    char js[320], conf[320], log[320];
    long long deadline;
    int st;

    if (swh_mkdtemp(n->dir, sizeof(n->dir), "swnats") != 0)
        return -1;
    snprintf(js, sizeof(js), "%s/owner.lock", n->dir);
    n->lock_fd = open(js, O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    if (n->lock_fd > 0 && flock(n->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        close(n->lock_fd);
        n->lock_fd = 0;
    }
    snprintf(js, sizeof(js), "%s/js", n->dir);
    snprintf(conf, sizeof(conf), "%s/nats.conf", n->dir);
    snprintf(log, sizeof(log), "%s/nats.log", n->dir);
    if (mkdir(js, 0700) != 0) {
        fprintf(stderr, "mkdir %s: %s\n", js, strerror(errno));
        goto hard;
    }
    if (extra_conf != NULL && swh_write_file(conf, extra_conf) != 0) {
        fprintf(stderr, "cannot write %s: %s\n", conf, strerror(errno));
        goto hard;
    }
    n->port = swh_free_port();
    if (n->port <= 0) {
        fprintf(stderr, "cannot find a free TCP port on 127.0.0.1: %s\n", strerror(errno));
        goto hard;
    }
    if (swh_nats_spawn(n, bin, js, extra_conf != NULL ? conf : NULL, log) != 0)
        goto hard;

    deadline = swh_now_ms() + (long long)SWH_NATS_READY_MS * swh_slow();
    while (swh_now_ms() < deadline) {
        if (waitpid(n->pid, &st, WNOHANG) == n->pid) {
            /* Only a lost race for the port is worth another attempt. */
            int port_taken = swh_file_contains(log, "address already in use");

            n->pid = 0;
            if (last_attempt || !port_taken) {
                fprintf(stderr, "nats-server exited at start (status %d)\n",
                        WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
                swh_print_log_tail(log);
            } else {
                fprintf(stderr,
                        "nats-server: port %d was taken meanwhile; retrying on another "
                        "port\n",
                        n->port);
            }
            swh_dir_release(n);
            return port_taken ? 1 : -1;
        }
        if (swh_file_contains(log, "Server is ready") && swh_tcp_accepts(n->port)) {
            snprintf(n->url, sizeof(n->url), "nats://127.0.0.1:%d", n->port);
            return 0;
        }
        swh_sleep_ms(10);
    }
    fprintf(stderr, "nats-server (pid %d, port %d) not ready after %d ms\n", (int)n->pid, n->port,
            SWH_NATS_READY_MS * swh_slow());
    swh_print_log_tail(log);
    swh_nats_stop(n);
    return 1;

hard:
    swh_dir_release(n);
    return -1;
}

/* Removes swnats-XXXXXX dirs left by runs that were killed (SIGKILL skips
 * swh_nats_stop): only when the dir was untouched for a minute and its
 * owner process is gone (nobody holds the flock on its owner.lock; for a
 * dir without one, the server pid in its nats.log is gone). CI caught the
 * pid test alone removing the dir of a live test whose server was down for
 * a restart. */
static void
swh_sweep_stale(void)
{
    const char *tmp = getenv("TMPDIR");
    DIR *d;
    struct dirent *de;
    time_t now = time(NULL);

    if (tmp == NULL || tmp[0] == '\0')
        tmp = "/tmp";
    d = opendir(tmp);
    if (d == NULL)
        return;
    while ((de = readdir(d)) != NULL) {
        char path[512], log[600];
        struct stat st;
        FILE *f;
        int pid = 0;

        if (strncmp(de->d_name, "swnats-", 7) != 0 || strlen(de->d_name) != 13)
            continue;
        snprintf(path, sizeof(path), "%s/%s", tmp, de->d_name);
        if (lstat(path, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid() ||
            now - st.st_mtime < 60)
            continue;
        /* Its owner holds an flock on owner.lock for as long as it lives
         * (its server may be down for a restart): locked means in use. */
        snprintf(log, sizeof(log), "%s/owner.lock", path);
        {
            int lf = open(log, O_RDWR | O_CLOEXEC);
            if (lf >= 0) {
                int owned = flock(lf, LOCK_EX | LOCK_NB) != 0;
                close(lf);
                if (!owned)
                    swh_rmtree(path);
                continue;
            }
        }
        snprintf(log, sizeof(log), "%s/nats.log", path);
        f = fopen(log, "r");
        if (f == NULL)
            continue;
        if (fscanf(f, "[%d]", &pid) != 1)
            pid = 0;
        fclose(f);
        if (pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH)
            swh_rmtree(path);
    }
    closedir(d);
}

static int
swh_nats_start_mode(swh_nats *n, const char *extra_conf, int jetstream)
{
    char bin[1024];
    int i;

    memset(n, 0, sizeof(*n));
    n->no_js = !jetstream;
    swh_sweep_stale();
    if (swh_find_nats_server(bin, sizeof(bin)) != 0)
        return -1;
    for (i = 0; i < SWH_NATS_ATTEMPTS; i++) {
        int rc = swh_nats_try(n, bin, extra_conf, i == SWH_NATS_ATTEMPTS - 1);

        if (rc == 0)
            return 0;
        if (rc < 0)
            break;
    }
    fprintf(stderr, "could not start nats-server (%s)\n", bin);
    memset(n, 0, sizeof(*n));
    return -1;
}

int
swh_nats_start(swh_nats *n, const char *extra_conf)
{
    return swh_nats_start_mode(n, extra_conf, 1);
}

int
swh_nats_start_no_js(swh_nats *n, const char *extra_conf)
{
    return swh_nats_start_mode(n, extra_conf, 0);
}

void
swh_nats_stop_keep(swh_nats *n)
{
    if (n == NULL)
        return;
    if (n->pid > 0)
        swh_terminate(n->pid, 2000);
    n->pid = 0;
}

void
swh_nats_stop(swh_nats *n)
{
    if (n == NULL)
        return;
    swh_nats_stop_keep(n);
    swh_dir_release(n);
}

int
swh_nats_restart(swh_nats *n, long down_ms)
{
    char bin[1024], js[320], conf[320], log[320];
    long long deadline;
    struct stat sb;

    if (n == NULL || n->dir[0] == '\0' || swh_find_nats_server(bin, sizeof(bin)) != 0)
        return -1;
    swh_nats_stop_keep(n);
    swh_sleep_ms(down_ms);
    snprintf(js, sizeof(js), "%s/js", n->dir);
    snprintf(conf, sizeof(conf), "%s/nats.conf", n->dir);
    snprintf(log, sizeof(log), "%s/nats.log", n->dir);
    if (swh_nats_spawn(n, bin, js, stat(conf, &sb) == 0 ? conf : NULL, log) != 0)
        return -1;
    deadline = swh_now_ms() + (long long)SWH_NATS_READY_MS * swh_slow();
    while (swh_now_ms() < deadline) {
        if (swh_file_contains(log, "Server is ready") && swh_tcp_accepts(n->port))
            return 0;
        swh_sleep_ms(10);
    }
    fprintf(stderr, "nats-server did not come back on port %d\n", n->port);
    swh_print_log_tail(log);
    return -1;
}
