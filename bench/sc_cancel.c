/* bench/sc_cancel.c -- streamwire-bench: scenario 8: cancellation
 * (sw_stream_cancel -> the handler's cancel callback; SIGKILL of a frontend),
 * and the hidden mode --frontend-mode.
 *
 * Threads and locks: g_cs_mu/g_cs_cv guard the cancel slots (handler and
 * cancel callback threads). */
#include "bench.h"

/* ------------------------------------------------------------------ 8: cancellation (issue 5) */

/* The worker side is an ingress in this process (EP_CANCEL, on the worker
 * connection); its handler registers sw_responder_on_cancel and sends an
 * item every ms (or every 10 ms for the frontend-kill trials) until send
 * fails. Each request's cancel callback time is kept by request id. */

typedef struct cslot {
    struct cslot *next;
    char reqid[40];
    int64_t t_cb, t_stop; /* under g_cs_mu */
    sw_err send_err;
} cslot;

static pthread_mutex_t g_cs_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cs_cv;
static cslot *g_cs_head;

static void
cancel_cb(sw_responder *r, void *arg)
{
    cslot *c = arg;
    int64_t t = now_ns();
    (void)r;
    pthread_mutex_lock(&g_cs_mu);
    if (c->t_cb == 0)
        c->t_cb = t;
    pthread_cond_broadcast(&g_cs_cv);
    pthread_mutex_unlock(&g_cs_mu);
}

static void
cancel_handler(sw_responder *r, void *arg)
{
    size_t len = 0;
    const void *p = sw_responder_payload(r, &len);
    breq q;
    cslot *c;
    uint8_t buf[64];
    sw_err e = SW_OK;
    int64_t t0, iv;
    (void)arg;
    if (p == NULL || len < sizeof(q) || (c = calloc(1, sizeof(*c))) == NULL) {
        (void)sw_responder_fail(r, "bench_bad_request", NULL);
        return;
    }
    memcpy(&q, p, sizeof(q));
    snprintf(c->reqid, sizeof(c->reqid), "%s", sw_responder_request_id(r));
    pthread_mutex_lock(&g_cs_mu);
    c->next = g_cs_head;
    g_cs_head = c;
    pthread_cond_broadcast(&g_cs_cv);
    pthread_mutex_unlock(&g_cs_mu);
    sw_responder_on_cancel(r, cancel_cb, c);
    memset(buf, 0, sizeof(buf));
    t0 = now_ns();
    iv = q.rate ? 1000000000LL / q.rate : 0;
    for (uint32_t i = 0; i < q.n; i++) {
        if (iv)
            sleep_until_ns(t0 + (int64_t)i * iv);
        stamp(buf, sizeof(buf));
        if ((e = sw_responder_send(r, buf, sizeof(buf))) != SW_OK)
            break;
    }
    if (e == SW_OK)
        (void)sw_responder_finish(r, SW_STATUS_COMPLETED, NULL);
    pthread_mutex_lock(&g_cs_mu);
    c->t_stop = now_ns();
    c->send_err = e;
    pthread_cond_broadcast(&g_cs_cv);
    pthread_mutex_unlock(&g_cs_mu);
}

/* The cancel callback time of request reqid (0 if none within timeout);
 * *t_stop gets the time its handler stopped sending (0 if not yet). */
static int64_t
cslot_wait(const char *reqid, int64_t timeout_ns, int64_t *t_stop)
{
    int64_t until = now_ns() + timeout_ns, t = 0;
    struct timespec ts;
    ts.tv_sec = (time_t)(until / 1000000000LL);
    ts.tv_nsec = (long)(until % 1000000000LL);
    pthread_mutex_lock(&g_cs_mu);
    for (;;) {
        cslot *c;
        for (c = g_cs_head; c != NULL && strcmp(c->reqid, reqid) != 0; c = c->next) {
        }
        if (c != NULL && c->t_cb != 0) {
            t = c->t_cb;
            if (t_stop != NULL)
                *t_stop = c->t_stop;
            break;
        }
        if (pthread_cond_timedwait(&g_cs_cv, &g_cs_mu, &ts) == ETIMEDOUT)
            break;
    }
    pthread_mutex_unlock(&g_cs_mu);
    return t;
}

/* Hidden mode --frontend-mode URL: a frontend process that, on "go", opens a
 * stream to INST_CANCEL, prints "streaming <request id>" after the first
 * item and reads until it is killed. */
int
frontend_main(const char *url)
{
    sw_conn *c;
    sw_router *rt = NULL;
    sw_router_opts o;
    sw_request_opts ro;
    sw_stream *s = NULL;
    breq q = {BREQ_MAGIC, K_SEND, 1000000, 64, 100, 0};
    char line[64];
    const sw_item *it;
    sw_err e;
    pid_t parent = getppid();

    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        return 1;
    setvbuf(stdout, NULL, _IOLBF, 0);
    c = sw_connect(url, "bench-frontend-child");
    sw_router_opts_init(&o);
    if ((e = sw_router_create(&rt, c, &o)) != SW_OK)
        die("frontend child: sw_router_create: %s", sw_err_name(e));
    printf("ready\n");
    if (fgets(line, sizeof(line), stdin) == NULL || strncmp(line, "go", 2) != 0)
        goto out;
    sw_request_opts_init(&ro);
    ro.endpoint = EP_CANCEL;
    ro.instance_id = INST_CANCEL;
    if ((e = sw_router_open(&s, rt, &ro, &q, sizeof(q))) != SW_OK)
        die("frontend child: sw_router_open: %s", sw_err_name(e));
    for (;;) {
        if ((e = sw_stream_next(s, &it, 10000)) != SW_OK)
            die("frontend child: sw_stream_next: %s", sw_err_name(e));
        if (it->kind == SW_ITEM_DATA)
            break;
        die("frontend child: terminal before data: %s", it->terminal.reason);
    }
    printf("streaming %s\n", sw_stream_request_id(s));
    for (;;) {
        e = sw_stream_next(s, &it, 1000);
        if (e == SW_OK && it->kind == SW_ITEM_TERMINAL) {
            printf("ended %s\n", it->terminal.reason);
            break;
        }
        if (e != SW_OK && e != SW_ETIMEDOUT)
            break;
    }
    while (fgets(line, sizeof(line), stdin) != NULL)
        if (strncmp(line, "quit", 4) == 0)
            break;
out:
    sw_stream_close(s);
    sw_router_destroy(rt);
    sw_conn_close(c);
    nats_Close();
    return 0;
}

static void
fe_start(child *c)
{
    char *argv[4];
    argv[0] = (char *)"streamwire-bench";
    argv[1] = (char *)"--frontend-mode";
    argv[2] = (char *)g_url;
    argv[3] = NULL;
    child_start(c, argv);
}

static atomic_ulong g_live_ended;

static void
discard_item(sw_stream *s, const sw_item *it, void *arg)
{
    (void)s;
    (void)arg;
    if (it->kind == SW_ITEM_TERMINAL) {
        atomic_fetch_add(&g_live_ended, 1);
        if (cfg.verbose)
            progress("  live frontend stream ended: %s/%s", sw_status_name(it->terminal.status),
                     it->terminal.reason);
    }
}

/* goal inputs (issue 5) */
double g_goal_cancel_p99 = NAN, g_goal_fekill_p99 = NAN;

void
scen_cancel(void)
{
    unsigned n = cfg.cancel_trials, nk = cfg.trials;
    int64_t *lat = calloc(n + 1, sizeof(int64_t)), *stop = calloc(n + 1, sizeof(int64_t));
    int64_t *klat = calloc(nk + 1, sizeof(int64_t));
    size_t got = 0, ngot_stop = 0, kgot = 0;
    unsigned long data_after = 0, bad_term = 0, errors = 0, kerrors = 0;
    sw_ingress *ing = NULL;
    sw_ingress_opts io;
    sw_ingress_stats is0, is1;
    pthread_condattr_t ca;
    breq q = {BREQ_MAGIC, K_SEND, 1000000, 64, 1000, 0};
    char err[160] = "", kerr[160] = "", param[48], note[200];
    sw_router **live_rt = NULL;
    sw_stream **live_st = NULL;
    sw_err e;

    if (lat == NULL || stop == NULL || klat == NULL)
        die("out of memory");
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g_cs_cv, &ca);
    pthread_condattr_destroy(&ca);
    sw_ingress_opts_init(&io);
    io.endpoint = EP_CANCEL;
    io.instance_id = INST_CANCEL;
    io.handler = cancel_handler;
    io.max_inflight = 64 + cfg.live_fe; /* 64 is the default */
    io.log = cfg.verbose ? loss_rt_log : NULL;
    io.log_arg = (void *)"cancel worker";
    io.handler_threads = 4 + cfg.live_fe; /* each live stream holds a handler thread */
    if ((e = sw_ingress_start(&ing, g_sw_work, &io)) != SW_OK)
        die("sw_ingress_start %s: %s", EP_CANCEL, sw_err_name(e));
    sw_ingress_stats_get(ing, &is0);
    progress("8 cancel: %u sw_stream_cancel -> on_cancel trials, then %u frontend SIGKILL trials",
             n, nk);
    for (unsigned i = 0; i < n; i++) {
        sw_request_opts ro;
        sw_stream *s = NULL;
        const sw_item *it;
        unsigned items = 0;
        int64_t t0, tcb, tstop = 0;
        sw_request_opts_init(&ro);
        ro.endpoint = EP_CANCEL;
        ro.instance_id = INST_CANCEL;
        ro.credit_window = cfg.window;
        if ((e = sw_router_open(&s, g_router, &ro, &q, sizeof(q))) != SW_OK)
            die("sw_router_open: %s", sw_err_name(e));
        while (items < 3) {
            if ((e = sw_stream_next(s, &it, 5000)) != SW_OK || it->kind != SW_ITEM_DATA)
                break;
            items++;
        }
        if (items < 3) {
            errors++;
            if (!err[0])
                snprintf(err, sizeof(err), "trial %u: %u items before the cancel (%s)", i, items,
                         e != SW_OK ? sw_err_name(e) : it->terminal.reason);
            sw_stream_close(s);
            continue;
        }
        t0 = now_ns();
        (void)sw_stream_cancel(s);
        for (;;) {
            if ((e = sw_stream_next(s, &it, 5000)) != SW_OK) {
                bad_term++;
                break;
            }
            if (it->kind == SW_ITEM_DATA) {
                data_after++;
                continue;
            }
            if (it->terminal.status != SW_STATUS_CANCELLED)
                bad_term++;
            break;
        }
        tcb = cslot_wait(sw_stream_request_id(s), 5000000000LL, &tstop);
        if (tcb != 0) {
            lat[got++] = tcb - t0;
        } else {
            errors++;
            if (!err[0])
                snprintf(err, sizeof(err), "trial %u: no cancel callback within 5 s", i);
        }
        {
            /* the handler's send returns SW_ECANCELLED at its next item (<= 1 ms) */
            char rid[40];
            snprintf(rid, sizeof(rid), "%s", sw_stream_request_id(s));
            sw_stream_close(s);
            for (int w = 0; w < 200 && tcb != 0 && tstop == 0; w++) {
                pthread_mutex_lock(&g_cs_mu);
                for (cslot *c = g_cs_head; c != NULL; c = c->next)
                    if (strcmp(c->reqid, rid) == 0)
                        tstop = c->t_stop;
                pthread_mutex_unlock(&g_cs_mu);
                if (tstop == 0)
                    sleep_ms(1);
            }
        }
        if (tstop != 0)
            stop[ngot_stop++] = tstop - t0;
    }

    /* frontend SIGKILL: a child frontend per trial, the next one started
     * while the current one streams */
    if (nk > 0 && cfg.live_fe > 0) {
        /* other live frontends: one router each, a slow stream each */
        sw_router_opts o;
        sw_request_opts ro;
        breq lq = {BREQ_MAGIC, K_SEND, 1000000, 64, 20, 0};
        if ((live_rt = calloc(cfg.live_fe, sizeof(*live_rt))) == NULL ||
            (live_st = calloc(cfg.live_fe, sizeof(*live_st))) == NULL)
            die("out of memory");
        sw_router_opts_init(&o);
        sw_request_opts_init(&ro);
        ro.endpoint = EP_CANCEL;
        ro.instance_id = INST_CANCEL;
        ro.on_item = discard_item;
        for (unsigned i = 0; i < cfg.live_fe; i++)
            if (sw_router_create(&live_rt[i], g_sw_front, &o) != SW_OK ||
                sw_router_open(&live_st[i], live_rt[i], &ro, &lq, sizeof(lq)) != SW_OK)
                die("live frontend %u", i);
        progress("  %u other live frontends stream meanwhile", cfg.live_fe);
        sleep_ms(500);
    }
    if (nk > 0) {
        child cur, nxt, fz;
        char line[128], fz_req[64] = "";
        fz.pid = -1;
        fe_start(&cur);
        if (child_line(&cur, line, sizeof(line), 20000) != 0 || strcmp(line, "ready") != 0)
            die("frontend child did not start");
        for (unsigned i = 0; i < nk; i++) {
            int have_next = i + 1 < nk;
            size_t kgot_before = kgot;
            int64_t t0, tcb;
            char reqid[64];
            ssize_t w;
            /* --frozen-frontend: another frontend with a stream here is
             * SIGSTOPped throughout (replaced once the worker cancels it) */
            if (cfg.frozen_fe && (fz.pid <= 0 || cslot_wait(fz_req, 0, NULL) != 0)) {
                if (fz.pid > 0)
                    child_reap(&fz, 0);
                fe_start(&fz);
                w = write(fz.to, "go\n", 3);
                (void)w;
                if (child_line(&fz, line, sizeof(line), 20000) != 0 || strcmp(line, "ready") != 0 ||
                    child_line(&fz, line, sizeof(line), 20000) != 0 ||
                    sscanf(line, "streaming %63s", fz_req) != 1)
                    die("frozen frontend child did not start");
                kill(fz.pid, SIGSTOP);
                progress("  trial %u: froze frontend %d (stream %s)", i + 1, (int)fz.pid, fz_req);
            }
            if (have_next)
                fe_start(&nxt);
            w = write(cur.to, "go\n", 3);
            (void)w;
            if (child_line(&cur, line, sizeof(line), 10000) != 0 ||
                sscanf(line, "streaming %63s", reqid) != 1) {
                kerrors++;
                if (!kerr[0])
                    snprintf(kerr, sizeof(kerr), "trial %u: frontend child said \"%.80s\"", i,
                             line);
                child_reap(&cur, 0);
            } else {
                sleep_ms(10 + rand() % 100); /* decorrelate from the worker's probe timer */
                t0 = now_ns();
                kill(cur.pid, SIGKILL);
                tcb = cslot_wait(reqid, 5000000000LL, NULL);
                if (tcb != 0) {
                    klat[kgot++] = tcb - t0;
                } else {
                    kerrors++;
                    if (!kerr[0])
                        snprintf(kerr, sizeof(kerr), "trial %u: no cancel within 5 s", i);
                }
                child_reap(&cur, 0);
            }
            if (have_next) {
                cur = nxt;
                if (child_line(&cur, line, sizeof(line), 20000) != 0 || strcmp(line, "ready") != 0)
                    die("frontend child did not start");
            }
            if (cfg.verbose || cfg.frozen_fe || cfg.live_fe)
                progress("  trial %u: frontend SIGKILL -> cancel %.1f ms", i + 1,
                         kgot > kgot_before ? (double)klat[kgot - 1] / 1e6 : NAN);
        }
        if (fz.pid > 0)
            child_reap(&fz, 0);
    }
    if (live_rt != NULL)
        progress("  %lu of %u other live frontends' streams ended during the trials (want 0)",
                 atomic_load(&g_live_ended), cfg.live_fe);
    for (unsigned i = 0; live_rt != NULL && i < cfg.live_fe; i++) {
        sw_stream_close(live_st[i]);
        sw_router_destroy(live_rt[i]);
    }
    free(live_rt);
    free(live_st);
    sw_ingress_stats_get(ing, &is1);
    sw_ingress_destroy(ing);
    pthread_mutex_lock(&g_cs_mu);
    while (g_cs_head != NULL) {
        cslot *c = g_cs_head;
        g_cs_head = c->next;
        free(c);
    }
    pthread_mutex_unlock(&g_cs_mu);

    snprintf(param, sizeof(param), "sw_stream_cancel -> on_cancel, %zu trials", got);
    snprintf(note, sizeof(note),
             "same process, separate sw_conn; data items after cancel %lu; non-cancelled "
             "terminals %lu; errors %lu%s%.60s",
             data_after, bad_term, errors, err[0] ? ": " : "", err);
    lat_rows_sw("8 cancel", param, lat, got, "us", 1, 1, note, "goal <= 20 ms (issue 5)");
    g_goal_cancel_p99 = pct(lat, got, 0.99) / 1e6;
    snprintf(param, sizeof(param), "sw_stream_cancel -> send fails, %zu trials", ngot_stop);
    lat_rows_sw("8 cancel", param, stop, ngot_stop, "us", 1, 0,
                "handler sends every 1 ms: its next send returns SW_ECANCELLED", "");
    snprintf(param, sizeof(param), "frontend SIGKILL -> on_cancel, %zu trials", kgot);
    snprintf(note, sizeof(note),
             "frontend is a child process; worker frontend_probe_ms 250 (default); "
             "frontends_lost +%" PRIu64 "; errors %lu%s%.60s",
             is1.frontends_lost - is0.frontends_lost, kerrors, kerr[0] ? ": " : "", kerr);
    g_goal_fekill_p99 =
        lat_rows_sw("8 cancel", param, klat, kgot, "ms", 1, 1, note, "goal <= 1000 ms (issue 5)");
    free(lat);
    free(stop);
    free(klat);
}
