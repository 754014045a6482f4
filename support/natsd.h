/* support/natsd.h -- a throwaway nats-server and child processes, for the CLI's
 * demo, the bench and the integration test harness: one implementation, built
 * once as the sw_testsupport static library (support/CMakeLists.txt).
 *
 * Nothing here uses a fixed port: the server's port is picked at run time.
 * Everything here prints its own diagnostics to stderr (it is tooling, not
 * the library). Not thread-safe with respect to concurrent spawns only in
 * the usual fork/exec way: descriptors are created close-on-exec, so a child
 * never inherits another child's pipes. */
#ifndef SW_SUPPORT_NATSD_H
#define SW_SUPPORT_NATSD_H

#include <stddef.h>
#include <sys/types.h>

/* A nats-server started by swh_nats_start. */
typedef struct swh_nats {
    char url[64]; /* "nats://127.0.0.1:PORT" */
    int port;
    pid_t pid;     /* 0 when not running */
    char dir[256]; /* temp dir: js/ (JetStream store), nats.conf, nats.log */
    int lock_fd;   /* > 0: holds an flock on dir/owner.lock while this process owns dir, so
                      that another process's sweep of stale dirs never removes it (even while
                      the server is down for a restart) */
    int no_js;     /* started by swh_nats_start_no_js: no JetStream */
} swh_nats;

/* Starts nats-server (binary: env SW_NATS_SERVER, else `nats-server` on PATH,
 * else /usr/sbin/nats-server or /usr/local/bin/nats-server) with JetStream
 * (-js -sd <dir>/js), bound to 127.0.0.1 on a free port picked at run time.
 * extra_conf (may be NULL) is written to <dir>/nats.conf and passed with -c,
 * e.g. "max_payload: 65536\n". Server output goes to <dir>/nats.log. Waits
 * until the server says it is ready and accepts TCP connections; retries
 * with a new port if the server dies first (port taken in between).
 * Returns 0 and fills *n, or -1 (reason printed to stderr, nothing left
 * running, temp dir removed). */
int swh_nats_start(swh_nats *n, const char *extra_conf);
/* The same without JetStream (no -js): what a registry must refuse. */
int swh_nats_start_no_js(swh_nats *n, const char *extra_conf);

/* SIGTERM, SIGKILL after 2 s, reaps it, removes the temp dir. Idempotent;
 * safe on a zeroed swh_nats. */
void swh_nats_stop(swh_nats *n);

/* Like swh_nats_stop but keeps the temp dir (for inspection). */
void swh_nats_stop_keep(swh_nats *n);

/* Stops the server, waits down_ms, and starts it again on the same port
 * with the same store and config (a NATS restart as clients see it).
 * Returns 0 once it accepts connections again, -1 on failure. */
int swh_nats_restart(swh_nats *n, long down_ms);

/* Runs the program at path with argv (argv[0] is the program name as the
 * child sees it; NULL-terminated). If stdout_fd is not NULL the child's stdout
 * is a pipe whose read end (close-on-exec) is stored there; else stdout is
 * inherited. stderr_fd >= 0 becomes the child's stderr; -1 inherits. The
 * child gets SIGKILL if the calling thread exits (PR_SET_PDEATHSIG), so a
 * crashed test never leaves servers behind. Returns the pid, or -1. */
pid_t swh_spawn_path(const char *path, const char *const argv[], int *stdout_fd, int stderr_fd);

/* Reads fd line by line until a line starting with prefix ("" or NULL: any
 * line) arrives; copies it, without the newline, into buf (truncated to
 * cap-1 bytes; buf may be NULL). Lines that do not match are discarded.
 * Reads one byte at a time, so nothing after the line is consumed.
 * Returns 0 when found, -1 on timeout (timeout_ms < 0 waits forever),
 * -2 on end of file or a read error. */
int swh_wait_line(int fd, const char *prefix, char *buf, size_t cap, int timeout_ms);

/* kill(pid, sig) when pid > 0; errors ignored. */
void swh_kill(pid_t pid, int sig);

/* SIGSTOPs pid, a child of ours, and waits up to timeout_ms for the stop
 * to take hold: kill() returns once the signal is queued, and the child's
 * threads run on until one of them takes it (a nats-server answered
 * requests sent a few ms after kill returned). 0 once it is stopped, -1 on
 * timeout or error. */
int swh_freeze(pid_t pid, int timeout_ms);

/* Waits up to timeout_ms (< 0: forever) for pid to exit and reaps it.
 * *status (may be NULL) gets the raw waitpid status (use WIFEXITED etc.).
 * Returns 0 when it exited, -1 on timeout or error. */
int swh_wait_exit(pid_t pid, int timeout_ms, int *status);

/* SIGTERM, wait up to grace_ms, then SIGKILL and reap. Returns the raw wait
 * status, or -1 if pid <= 0 or it could not be reaped. */
int swh_terminate(pid_t pid, int grace_ms);

/* Sleeps ms milliseconds (nanosleep, restarted on EINTR). */
void swh_sleep_ms(long ms);

/* Timing-margin multiplier: 3 when the environment variable SW_SLOW is set
 * (to anything but "" or "0"; sanitizer and valgrind runs), else 1. */
int swh_slow(void);

/* Monotonic clock in milliseconds. */
long long swh_now_ms(void);

/* VmRSS of process pid in KiB (from /proc), or -1. */
long swh_rss_kb(pid_t pid);

/* rm -rf path (no symlinks followed). Returns 0 or -1. */
int swh_rmtree(const char *path);

/* Creates a temp dir from a prefix ("swdemo"): $TMPDIR/prefix-XXXXXX (or
 * /tmp). Writes the path into out. Returns 0 or -1. */
int swh_mkdtemp(char *out, size_t cap, const char *prefix);

/* A TCP port that was free a moment ago on 127.0.0.1 (bind to port 0). */
int swh_free_port(void);

/* Writes text to path (created or truncated). 0, or -1. */
int swh_write_file(const char *path, const char *text);

#endif
