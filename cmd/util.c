/* cmd/util.c -- signals, logging, output helpers and the stream runner. */
#include <errno.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

atomic_int cli_signalled = 0;
static int cli_wake_fd = -1;

static void
cli_on_signal(int sig)
{
    int saved = errno;

    (void)sig;
    cli_signalled = 1;
    if (cli_wake_fd >= 0) {
        char c = 'x';
        ssize_t w = write(cli_wake_fd, &c, 1);
        (void)w;
    }
    errno = saved;
}

void
cli_catch_signals(int wake_fd)
{
    struct sigaction sa;

    cli_wake_fd = wake_fd;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = cli_on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sa.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &sa, NULL);
}

void
cli_log_stderr(void *arg, sw_log_level level, const char *msg)
{
    fprintf(stderr, "[%s] %s: %s\n", arg != NULL ? (const char *)arg : "streamwire",
            sw_log_level_name(level), msg);
}

int64_t
cli_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void
cli_sleep_ms(int64_t ms)
{
    struct timespec ts;

    if (ms <= 0)
        return;
    ts.tv_sec = (time_t)(ms / 1000);
    ts.tv_nsec = (long)(ms % 1000) * 1000000L;
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR && !cli_signalled)
        ;
}

void
cli_json_escape(FILE *f, const void *data, size_t len)
{
    const unsigned char *p = data;
    size_t i;

    for (i = 0; i < len; i++) {
        unsigned char c = p[i];

        switch (c) {
        case '"':
            fputs("\\\"", f);
            break;
        case '\\':
            fputs("\\\\", f);
            break;
        case '\n':
            fputs("\\n", f);
            break;
        case '\r':
            fputs("\\r", f);
            break;
        case '\t':
            fputs("\\t", f);
            break;
        default:
            if (c < 0x20 || c > 0x7e)
                fprintf(f, "\\u%04x", (unsigned)c);
            else
                fputc(c, f);
        }
    }
}

void
cli_print_readable(FILE *f, const void *data, size_t len)
{
    const unsigned char *p = data;
    size_t i;

    for (i = 0; i < len;) {
        size_t run = 0;
        while (i + run < len && p[i + run] >= 0x20 && p[i + run] <= 0x7e)
            run++;
        if (run > 0) { /* printable bytes: one write, not one call per byte */
            fwrite(p + i, 1, run, f);
            i += run;
        } else {
            fprintf(f, "\\x%02x", (unsigned)p[i]);
            i++;
        }
    }
}

static void
cli_copy(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src != NULL ? src : "");
}

static int64_t
cli_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

sw_err
cli_run_stream(sw_router *router, const cli_stream_req *req, cli_stream_result *res)
{
    sw_request_opts o;
    sw_stream *s = NULL;
    sw_err err;
    int cancelled = 0;
    int64_t t0, t0_us;

    memset(res, 0, sizeof(*res));
    res->first_item_us = -1;
    sw_request_opts_init(&o);
    o.endpoint = req->endpoint;
    o.instance_id = req->instance_id;
    o.deadline_ms = req->deadline_ms;
    o.max_tokens = req->max_tokens;
    o.heartbeat_ms = req->heartbeat_ms;
    o.migration_limit = req->migration_limit;

    t0 = cli_now_ms();
    t0_us = cli_now_us();
    err = sw_router_open(&s, router, &o, req->payload, req->len);
    if (err != SW_OK) {
        res->elapsed_ms = cli_now_ms() - t0;
        return err;
    }
    if (req->cancel_after == 0) {
        sw_stream_cancel(s);
        cancelled = 1;
    }
    for (;;) {
        const sw_item *item = NULL;

        if (cli_signalled && !cancelled) {
            sw_stream_cancel(s);
            cancelled = 1;
            res->interrupted = 1;
        }
        if (req->give_up_ms > 0 && cli_now_ms() - t0 > req->give_up_ms) {
            snprintf(res->reason, sizeof(res->reason), "no terminal within %lld ms",
                     (long long)req->give_up_ms);
            break;
        }
        err = sw_stream_next(s, &item, 0);
        if (err == SW_ETIMEDOUT) { /* nothing there now: flush, then wait */
            if (req->on_idle != NULL)
                req->on_idle(req->on_data_arg);
            err = sw_stream_next(s, &item, 100);
        }
        if (err == SW_ETIMEDOUT)
            continue;
        if (err != SW_OK || item == NULL) {
            snprintf(res->reason, sizeof(res->reason),
                     "sw_stream_next returned %s before a "
                     "terminal",
                     sw_err_name(err));
            break;
        }
        if (item->kind == SW_ITEM_DATA) {
            if (res->items == 0)
                res->first_item_us = cli_now_us() - t0_us;
            res->items++;
            if (req->on_data != NULL)
                req->on_data(item, req->on_data_arg);
            if (req->cancel_after > 0 && res->items == (uint64_t)req->cancel_after && !cancelled) {
                sw_stream_cancel(s);
                cancelled = 1;
            }
            if (req->read_delay_ms > 0)
                cli_sleep_ms(req->read_delay_ms);
            continue;
        }
        res->got_terminal = 1;
        res->status = item->terminal.status;
        res->error = item->terminal.error;
        res->terminal_seq = item->seq;
        cli_copy(res->reason, sizeof(res->reason), item->terminal.reason);
        cli_copy(res->message, sizeof(res->message), item->terminal.message);
        res->migrations = item->terminal.migrations;
        cli_copy(res->instances, sizeof(res->instances), item->terminal.instances);
        cli_copy(res->instance, sizeof(res->instance),
                 item->instance_id != NULL && item->instance_id[0] != '\0'
                     ? item->instance_id
                     : sw_stream_instance_id(s));
        break;
    }
    res->elapsed_ms = cli_now_ms() - t0;
    res->elapsed_us = cli_now_us() - t0_us;
    sw_stream_close(s);
    return SW_OK;
}
