/* tests/integration/harness.c -- see harness.h. The nats-server launcher and
 * process helpers are support/natsd.c (the sw_testsupport library, shared
 * with the CLI's demo and the bench); this file adds the CLI spawners. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nats/nats.h>

#include "harness.h"
#include "common/sw_common.h"
#include "proto/sw_codec.h"

#define SWH_MAX_ARGS 128

const char *
swh_cli_path(void)
{
    const char *env = getenv("SW_CLI_PATH");

    if (env != NULL && env[0] != '\0')
        return env;
#ifdef SW_CLI_PATH
    return SW_CLI_PATH;
#else
    return NULL;
#endif
}

pid_t
swh_spawn_err(const char *const argv[], int *stdout_fd, int stderr_fd)
{
    const char *full[SWH_MAX_ARGS + 2];
    const char *cli = swh_cli_path();
    size_t i = 0, n = 0;

    if (stdout_fd != NULL)
        *stdout_fd = -1;
    if (cli == NULL) {
        fprintf(stderr, "swh_spawn: no CLI path: set SW_CLI_PATH (environment or compile "
                        "definition)\n");
        return -1;
    }
    if (argv != NULL && argv[0] != NULL &&
        (strcmp(argv[0], "streamwire") == 0 || strchr(argv[0], '/') != NULL))
        i = 1; /* argv includes a program name: replace it */
    full[n++] = cli;
    for (; argv != NULL && argv[i] != NULL; i++) {
        if (n >= SWH_MAX_ARGS) {
            fprintf(stderr, "swh_spawn: more than %d arguments\n", SWH_MAX_ARGS);
            return -1;
        }
        full[n++] = argv[i];
    }
    full[n] = NULL;
    return swh_spawn_path(cli, full, stdout_fd, stderr_fd);
}

pid_t
swh_spawn(const char *const argv[], int *stdout_fd)
{
    return swh_spawn_err(argv, stdout_fd, -1);
}

int
swh_run(const char *const argv[], char *out, size_t cap, int timeout_ms)
{
    long long deadline = swh_now_ms() + timeout_ms;
    size_t used = 0;
    int fd = -1;
    int st = 0;
    pid_t pid = swh_spawn(argv, &fd);

    if (out != NULL && cap > 0)
        out[0] = '\0';
    if (pid < 0)
        return -1;
    for (;;) {
        struct pollfd pfd;
        char buf[4096];
        long long left = deadline - swh_now_ms();
        ssize_t r;
        int pr;

        if (left <= 0)
            break;
        pfd.fd = fd;
        pfd.events = POLLIN;
        pfd.revents = 0;
        pr = poll(&pfd, 1, (int)left);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            break;
        r = read(fd, buf, sizeof(buf));
        if (r < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (r <= 0)
            break;
        if (out != NULL && cap > 0 && used < cap - 1) {
            size_t k = (size_t)r < cap - 1 - used ? (size_t)r : cap - 1 - used;
            memcpy(out + used, buf, k);
            used += k;
            out[used] = '\0';
        }
    }
    close(fd);
    {
        long long left = deadline - swh_now_ms();

        if (swh_wait_exit(pid, left > 0 ? (int)left : 0, &st) != 0) {
            fprintf(stderr, "swh_run: %s %s did not exit within %d ms; killed\n", swh_cli_path(),
                    argv[0] != NULL ? argv[0] : "", timeout_ms);
            kill(pid, SIGKILL);
            swh_wait_exit(pid, 5000, NULL);
            return -1;
        }
    }
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    if (WIFSIGNALED(st))
        return 128 + WTERMSIG(st);
    return -1;
}

int
swh_raw_item(natsConnection *nc, const char *subj, const uint8_t *id, uint64_t seq,
             const char *data, int final)
{
    swp_item w = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__INIT;
    swp_terminal t = STREAMWIRE__V1__TERMINAL__INIT;
    uint8_t buf[512];
    size_t len;
    w.version = SW_PROTOCOL_VERSION;
    w.request_id.data = (uint8_t *)(uintptr_t)id;
    w.request_id.len = SW_REQUEST_ID_BYTES;
    w.seq = seq;
    if (final) {
        w.complete_final = 1;
        t.status = STREAMWIRE__V1__STATUS__STATUS_COMPLETED;
        t.finish_reason = (char *)"stop";
        w.terminal = &t;
    } else {
        w.body_case = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_DATA;
        w.data.data = (uint8_t *)(uintptr_t)data;
        w.data.len = strlen(data);
    }
    if (swp_encode(&w, buf, sizeof(buf), &len) != SW_OK)
        return -1;
    return (int)natsConnection_Publish(nc, subj, buf, (int)len);
}
