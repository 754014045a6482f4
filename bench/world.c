/* bench/world.c -- streamwire-bench: the shared world of the raw and
 * streamwire runs: the connections, the hand-written raw responder, the bench
 * handler and ingresses.
 *
 * Threads and locks: The responders run on nats.c and ingress handler threads;
 * no locks of their own. */
#include "bench.h"

/* ------------------------------------------------------------------ connections */

int g_raw_mode = RAW_ASAP;
const char *const g_raw_mode_name[RAW_MODES] = {"send-asap", "buffered"};

natsConnection *
raw_connect(const char *url, const char *name, int asap)
{
    natsOptions *o = NULL;
    natsConnection *nc = NULL;
    natsStatus s = natsOptions_Create(&o);
    if (s == NATS_OK)
        s = natsOptions_SetURL(o, url);
    if (s == NATS_OK)
        s = natsOptions_SetName(o, name);
    if (s == NATS_OK)
        s = natsOptions_SetTimeout(o, 5000);
    if (s == NATS_OK)
        s = natsOptions_SetSendAsap(o, asap ? true : false);
    if (s == NATS_OK)
        s = natsConnection_Connect(&nc, o);
    natsOptions_Destroy(o);
    if (s != NATS_OK)
        die("nats connect %s: %s", url, natsStatus_GetText(s));
    return nc;
}

sw_conn *
sw_connect_mode(const char *url, const char *name, const char *key_file, int asap)
{
    sw_conn_opts co;
    sw_conn *c = NULL;
    sw_err e;
    sw_conn_opts_init(&co);
    co.url = url;
    co.name = name;
    co.connect_timeout_ms = 5000;
    co.no_send_asap = !asap;
    co.seal_key_file = key_file;
    if ((e = sw_conn_open(&c, &co)) != SW_OK)
        die("sw_conn_open %s%s: %s", url, key_file ? " (sealed)" : "", sw_err_name(e));
    return c;
}

sw_conn *
sw_connect(const char *url, const char *name)
{
    return sw_connect_mode(url, name, NULL, cfg.send_asap);
}

/* ------------------------------------------------------------------ worker side, raw */

natsConnection *g_raw_fronts[RAW_MODES], *g_raw_works[RAW_MODES];
natsSubscription *g_raw_resp_subs[RAW_MODES];

natsConnection *
raw_front(void)
{
    return g_raw_fronts[g_raw_mode];
}

natsConnection *
raw_work(void)
{
    return g_raw_works[g_raw_mode];
}

const char *
raw_req_subj(void)
{
    return g_raw_mode == RAW_BUFFERED ? "bench.raw.req.buffered" : "bench.raw.req.asap";
}

double
raw_best(double asap, double buffered, int lower_better, int *which)
{
    int b;
    if (isnan(buffered))
        b = RAW_ASAP;
    else if (isnan(asap))
        b = RAW_BUFFERED;
    else if (lower_better)
        b = buffered < asap ? RAW_BUFFERED : RAW_ASAP;
    else
        b = buffered > asap ? RAW_BUFFERED : RAW_ASAP;
    if (which != NULL)
        *which = b;
    return b == RAW_BUFFERED ? buffered : asap;
}

void
rep_ratio_range(const double *raw_a, const double *raw_b, const double *sw_a, const double *sw_b,
                unsigned n, double *lo, double *hi)
{
    *lo = *hi = NAN;
    for (unsigned i = 0; i < n; i++) {
        double x = raw_best(sw_a[i], sw_b[i], 0, NULL) / raw_best(raw_a[i], raw_b[i], 0, NULL);
        if (isnan(x))
            continue;
        if (isnan(*lo) || x < *lo)
            *lo = x;
        if (isnan(*hi) || x > *hi)
            *hi = x;
    }
}

void
best_note(char *note, size_t cap, const char *who, double asap, double buffered, int which,
          int prec)
{
    size_t n = strlen(note);
    if (n < cap)
        snprintf(note + n, cap - n, "%s%s best: %s (send-asap %.*f, buffered %.*f)", n ? "; " : "",
                 who, g_raw_mode_name[which], prec, asap, prec, buffered);
}

void
raw_best_note(char *note, size_t cap, double asap, double buffered, int which, int prec)
{
    best_note(note, cap, "raw", asap, buffered, which, prec);
}

/* The hand-written responder: publishes n items to the request's reply
 * subject, on nats.c's delivery thread of its one subscription. */
void
raw_responder_cb(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *arg)
{
    breq q;
    const char *reply = natsMsg_GetReply(m);
    (void)sub;
    (void)arg;
    if (reply != NULL && natsMsg_GetDataLength(m) >= (int)sizeof(q)) {
        memcpy(&q, natsMsg_GetData(m), sizeof(q));
        if (q.magic == BREQ_MAGIC && q.kind == K_SEND) {
            uint8_t *buf = calloc(1, q.size ? q.size : 1);
            int64_t t0 = now_ns(), iv = q.rate ? 1000000000LL / q.rate : 0;
            for (uint32_t i = 0; buf != NULL && i < q.n; i++) {
                if (iv)
                    sleep_until_ns(t0 + (int64_t)i * iv);
                stamp(buf, q.size);
                if (natsConnection_Publish(nc, reply, buf, (int)q.size) != NATS_OK)
                    break;
            }
            free(buf);
        }
    }
    natsMsg_Destroy(m);
}

/* ------------------------------------------------------------------ worker side, streamwire */

sw_conn *g_sw_front, *g_sw_work;
sw_router *g_router;
const char *g_sw_inst = INST_MAIN;
sw_ingress *g_ing_main, *g_ing_big;
unsigned g_default_window;

void
sw_bench_handler(sw_responder *r, void *arg)
{
    size_t len = 0;
    const void *p = sw_responder_payload(r, &len);
    breq q;
    uint8_t *buf;
    int64_t t0, iv;
    sw_err e = SW_OK;
    (void)arg;
    if (p == NULL || len < sizeof(q)) {
        (void)sw_responder_fail(r, "bench_bad_request", "short payload");
        return;
    }
    memcpy(&q, p, sizeof(q));
    if (q.magic != BREQ_MAGIC || q.kind != K_SEND) {
        (void)sw_responder_fail(r, "bench_bad_request", "bad magic or kind");
        return;
    }
    if ((buf = calloc(1, q.size ? q.size : 1)) == NULL) {
        (void)sw_responder_fail(r, "bench_nomem", NULL);
        return;
    }
    t0 = now_ns();
    iv = q.rate ? 1000000000LL / q.rate : 0;
    for (uint32_t i = 0; i < q.n; i++) {
        if (iv)
            sleep_until_ns(t0 + (int64_t)i * iv);
        stamp(buf, q.size);
        stages_sending(i, buf);
        if ((e = sw_responder_send(r, buf, q.size)) != SW_OK)
            break;
    }
    free(buf);
    if (e == SW_OK)
        (void)sw_responder_finish(r, SW_STATUS_COMPLETED, NULL);
    else if (e != SW_ECANCELLED && e != SW_ECLOSED)
        (void)sw_responder_fail(r, "bench_send_failed", sw_err_name(e));
}

void
bench_world_open(bench_world *w, const char *tag, const char *key_file, int asap, const char *inst)
{
    char fname[64], wname[64];
    sw_router_opts ro;
    sw_conn *keep = g_sw_work;
    unsigned max_conc = 64;
    sw_err e;
    snprintf(fname, sizeof(fname), "bench-%s-frontend", tag);
    snprintf(wname, sizeof(wname), "bench-%s-worker", tag);
    w->front = sw_connect_mode(g_url, fname, key_file, asap);
    w->work = sw_connect_mode(g_url, wname, key_file, asap);
    for (int i = 0; i < cfg.nconc; i++)
        if (cfg.conc[i] > max_conc)
            max_conc = cfg.conc[i];
    g_sw_work = w->work; /* start_ingress's connection */
    w->ing = start_ingress(EP_MAIN, inst, 2 * max_conc,
                           cfg.window > SW_INGRESS_MAX_WINDOW_DEFAULT ? cfg.window : 0);
    g_sw_work = keep;
    sw_router_opts_init(&ro);
    if ((e = sw_router_create(&w->router, w->front, &ro)) != SW_OK)
        die("sw_router_create (%s): %s", tag, sw_err_name(e));
}

static bench_world s_alt;

bench_world *
bench_alt_world(void)
{
    if (s_alt.router == NULL)
        bench_world_open(&s_alt, cfg.send_asap ? "sw-buffered" : "sw-asap", NULL, !cfg.send_asap,
                         INST_ALT);
    return &s_alt;
}

void
bench_alt_world_close(void)
{
    bench_world_close(&s_alt);
}

void
bench_world_close(bench_world *w)
{
    sw_router_destroy(w->router);
    sw_ingress_destroy(w->ing);
    sw_conn_close(w->front);
    sw_conn_close(w->work);
    memset(w, 0, sizeof(*w));
}

sw_ingress *
start_ingress(const char *ep, const char *inst, unsigned max_inflight, unsigned max_window)
{
    sw_ingress_opts io;
    sw_ingress *ing = NULL;
    sw_err e;
    sw_ingress_opts_init(&io);
    io.endpoint = ep;
    io.instance_id = inst;
    io.handler = sw_bench_handler;
    /* Inline, as raw's responder (a nats.c subscription callback): the
     * handler sends its items and returns. */
    io.handler_inline = !cfg.handler_pool;
    if (max_inflight)
        io.max_inflight = max_inflight;
    if (max_window)
        io.max_window = max_window;
    if ((e = sw_ingress_start(&ing, g_sw_work, &io)) != SW_OK)
        die("sw_ingress_start %s: %s", ep, sw_err_name(e));
    return ing;
}
