/* tests/integration/harness.h -- what integration tests need around the
 * library: a real nats-server on a port picked at run time, and the
 * streamwire CLI as a child process.
 *
 * Build: add harness.c to the test's sources and link sw_testsupport
 * (support/natsd.c: one implementation shared with `streamwire demo` and the
 * bench), and give the test the CLI's path as a compile definition, e.g.
 *   target_compile_definitions(t PRIVATE SW_CLI_PATH="$<TARGET_FILE:streamwire_cli>")
 *   add_dependencies(t streamwire_cli)
 * The environment variable SW_CLI_PATH overrides it at run time.
 *
 * Environment:
 *   SW_NATS_SERVER  nats-server binary (default: `nats-server` on PATH, then
 *                   /usr/sbin/nats-server, /usr/local/bin/nats-server)
 *   SW_CLI_PATH     the streamwire binary
 *   SW_SLOW         set (not "0") under sanitizers/valgrind: swh_slow() is 3
 *
 * Typical use:
 *   swh_nats n;
 *   assert_int_equal(swh_nats_start(&n, "max_payload: 65536\n"), 0);
 *   const char *w[] = {"worker", "--server", n.url, "--endpoint", "t.e.gen",
 *                      "--instance-id", "w1", NULL};
 *   int fd;
 *   pid_t pid = swh_spawn(w, &fd);
 *   assert_int_equal(swh_wait_line(fd, "worker ready", NULL, 0, 10000 * swh_slow()), 0);
 *   ...
 *   swh_kill(pid, SIGTERM);
 *   assert_int_equal(swh_wait_exit(pid, 10000 * swh_slow(), &st), 0);
 *   close(fd);
 *   swh_nats_stop(&n);
 *
 * Declared in support/natsd.h (included below): swh_nats, swh_nats_start,
 * swh_nats_stop, swh_nats_stop_keep, swh_spawn_path, swh_wait_line,
 * swh_kill, swh_wait_exit, swh_terminate, swh_sleep_ms, swh_now_ms,
 * swh_slow, swh_rmtree, swh_mkdtemp. */
#ifndef SW_TEST_HARNESS_H
#define SW_TEST_HARNESS_H

#include <stdint.h>
#include <sys/types.h>

#include "natsd.h"

/* The streamwire CLI binary: env SW_CLI_PATH, else the SW_CLI_PATH compile
 * definition, else NULL. */
const char *swh_cli_path(void);

/* Runs the streamwire CLI. argv holds its arguments WITHOUT the program name,
 * NULL-terminated: {"generate", "--server", url, ..., NULL}. (For
 * convenience an argv whose first element is "streamwire" or contains a '/'
 * is taken as including the program name, which is then replaced by the
 * CLI path.) stdout_fd as in swh_spawn_path (NULL: stdout inherited); stderr
 * is inherited. Returns the pid, or -1 (message on stderr, e.g. no CLI
 * path). */
pid_t swh_spawn(const char *const argv[], int *stdout_fd);

/* As swh_spawn, with the child's stderr sent to stderr_fd (-1: inherited). */
pid_t swh_spawn_err(const char *const argv[], int *stdout_fd, int stderr_fd);

/* Runs the CLI to completion, capturing stdout into out (NUL-terminated,
 * truncated to cap-1; out may be NULL). Waits up to timeout_ms, then
 * SIGKILLs it. Returns the exit status (0..255), 128+signal if killed by a
 * signal, or -1 on timeout or spawn failure. */
int swh_run(const char *const argv[], char *out, size_t cap, int timeout_ms);

/* A fake worker's publish of one StreamItemWrapper on subj with nats.c
 * directly (hostile and sealing tests): a data item, or the final
 * (completed "stop") when final. Asserts nothing; returns the NATS status
 * (0 = sent). */
struct __natsConnection;
int swh_raw_item(struct __natsConnection *nc, const char *subj, const uint8_t *id, uint64_t seq,
                 const char *data, int final);

#endif
