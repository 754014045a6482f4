/* cmd/metrics_http.c -- `--metrics-listen HOST:PORT`: serves GET /metrics
 * (sw_metrics_render) to Prometheus, from one thread.
 *
 * It answers one connection at a time: a scrape is small and rare. Every
 * connection gets at most CLI_MH_TIMEOUT_MS to send its request line (a
 * slow or idle client costs nothing after that), requests are read into a
 * bounded buffer, and anything but GET or HEAD /metrics gets 404 (405 for
 * other methods). A HEAD gets the head a GET would (Content-Length too),
 * without the body. The HTTP gateway (`streamwire gateway`) serves /metrics
 * through its own HTTP server. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cli.h"

#define CLI_MH_TIMEOUT_MS 2000
#define CLI_MH_REQ_MAX 4096

struct cli_metrics_http {
    int fd;
    int stop[2];
    pthread_t th;
    sw_metrics *m;
    char where[128];
};

static void
mh_write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) {
            if (w < 0 && errno == EINTR)
                continue;
            return;
        }
        p += w;
        n -= (size_t)w;
    }
}

/* head_only (a HEAD request): the same head, Content-Length included, and
 * no body. */
static void
mh_reply(int fd, int head_only, const char *status, const char *type, const char *body, size_t len)
{
    char head[256];
    int n = snprintf(head, sizeof(head),
                     "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n",
                     status, type, len);
    mh_write_all(fd, head, (size_t)n);
    if (!head_only)
        mh_write_all(fd, body, len);
}

/* Reads until the end of the request head, the buffer is full, or the
 * deadline; returns the bytes read (0 on nothing usable). */
static size_t
mh_read_head(int fd, char *buf, size_t cap)
{
    size_t got = 0;
    int64_t until = cli_now_ms() + CLI_MH_TIMEOUT_MS;
    while (got + 1 < cap) {
        struct pollfd p = {fd, POLLIN, 0};
        int64_t left = until - cli_now_ms();
        ssize_t r;
        if (left <= 0 || poll(&p, 1, (int)left) <= 0)
            break;
        r = recv(fd, buf + got, cap - 1 - got, 0);
        if (r <= 0)
            break;
        got += (size_t)r;
        buf[got] = '\0';
        if (strstr(buf, "\r\n\r\n") != NULL || strstr(buf, "\n\n") != NULL)
            break;
    }
    buf[got] = '\0';
    return got;
}

static void
mh_serve(struct cli_metrics_http *h, int fd)
{
    char req[CLI_MH_REQ_MAX];
    char *out = NULL;
    const char *target;
    size_t len = 0;
    int head_only;
    if (mh_read_head(fd, req, sizeof(req)) == 0)
        return;
    if (strncmp(req, "GET ", 4) == 0) {
        head_only = 0;
        target = req + 4;
    } else if (strncmp(req, "HEAD ", 5) == 0) {
        head_only = 1;
        target = req + 5;
    } else {
        mh_reply(fd, 0, "405 Method Not Allowed", "text/plain", "method not allowed\n", 19);
        return;
    }
    if (strncmp(target, "/metrics ", 9) != 0 && strncmp(target, "/metrics?", 9) != 0) {
        mh_reply(fd, head_only, "404 Not Found", "text/plain", "not found: try /metrics\n", 24);
        return;
    }
    if (sw_metrics_render(h->m, &out, &len) != SW_OK) {
        mh_reply(fd, head_only, "500 Internal Server Error", "text/plain", "out of memory\n", 14);
        return;
    }
    mh_reply(fd, head_only, "200 OK", "text/plain; version=0.0.4; charset=utf-8", out, len);
    free(out);
}

static void *
mh_main(void *arg)
{
    struct cli_metrics_http *h = arg;
    for (;;) {
        struct pollfd p[2] = {{h->fd, POLLIN, 0}, {h->stop[0], POLLIN, 0}};
        int c;
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (p[1].revents != 0)
            break;
        if ((p[0].revents & POLLIN) == 0)
            continue;
        if ((c = accept(h->fd, NULL, NULL)) < 0)
            continue;
        mh_serve(h, c);
        close(c);
    }
    return NULL;
}

int
cli_metrics_addr_ok(const char *addr)
{
    const char *colon = addr ? strrchr(addr, ':') : NULL;
    long port = 0;
    if (colon == NULL || colon == addr || colon - addr >= 128 || colon[1] == '\0')
        return 0;
    for (const char *p = colon + 1; *p != '\0'; p++) {
        if (*p < '0' || *p > '9' || (port = port * 10 + (*p - '0')) > 65535)
            return 0;
    }
    return 1;
}

int
cli_metrics_http_start(cli_metrics_http **out, const char *addr, sw_metrics *m)
{
    struct cli_metrics_http *h;
    char host[128];
    const char *colon = addr ? strrchr(addr, ':') : NULL;
    struct addrinfo hints, *ai = NULL;
    int one = 1;
    *out = NULL;
    if (!cli_metrics_addr_ok(addr)) {
        fprintf(stderr, "--metrics-listen: expected HOST:PORT, got '%s'\n", addr ? addr : "");
        return -1;
    }
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    if (getaddrinfo(host, colon + 1, &hints, &ai) != 0 || ai == NULL) {
        fprintf(stderr, "--metrics-listen: cannot resolve '%s'\n", addr);
        return -1;
    }
    if ((h = calloc(1, sizeof(*h))) == NULL) {
        freeaddrinfo(ai);
        return -1;
    }
    h->m = m;
    snprintf(h->where, sizeof(h->where), "%s", addr);
    h->fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (h->fd < 0 || setsockopt(h->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(h->fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(h->fd, 16) != 0 ||
        pipe(h->stop) != 0) {
        fprintf(stderr, "--metrics-listen %s: %s\n", addr, strerror(errno));
        if (h->fd >= 0)
            close(h->fd);
        freeaddrinfo(ai);
        free(h);
        return -1;
    }
    freeaddrinfo(ai);
    if (pthread_create(&h->th, NULL, mh_main, h) != 0) {
        close(h->fd);
        close(h->stop[0]);
        close(h->stop[1]);
        free(h);
        return -1;
    }
    *out = h;
    return 0;
}

void
cli_metrics_http_stop(cli_metrics_http *h)
{
    if (h == NULL)
        return;
    (void)!write(h->stop[1], "x", 1);
    pthread_join(h->th, NULL);
    close(h->fd);
    close(h->stop[0]);
    close(h->stop[1]);
    free(h);
}

int
cli_metrics_http_port(const cli_metrics_http *h)
{
    struct sockaddr_storage a;
    socklen_t n = sizeof(a);
    if (h == NULL || getsockname(h->fd, (struct sockaddr *)&a, &n) != 0)
        return -1;
    if (a.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&a)->sin_port);
    if (a.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&a)->sin6_port);
    return -1;
}
