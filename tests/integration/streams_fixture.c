/* tests/integration/streams_fixture.c -- the shared fixture of the
 * end-to-end stream tests; see streams_fixture.h. Worker side (one
 * configurable handler), the per-test env (setup/teardown), the blocking and
 * callback-mode collectors and their assertions, and the group's
 * nats-server. Locks: wctx.mu and cbgot.mu (leaf locks; no library call is
 * made with either held). */
#include "streams_fixture.h"

swh_nats g_nats;
int g_slow = 1;

int64_t
now_ms(void)
{
    return (int64_t)swh_now_ms();
}

void
sleep_ms(long ms)
{
    swh_sleep_ms(ms);
}

void
cond_init_mono(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

/* Waits on cv (mu held) until the absolute monotonic deadline. */
void
cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t until_ms)
{
    struct timespec ts;
    ts.tv_sec = (time_t)(until_ms / 1000);
    ts.tv_nsec = (long)(until_ms % 1000) * 1000000L;
    (void)pthread_cond_timedwait(cv, mu, &ts);
}

void
wctx_init(wctx *w)
{
    memset(w, 0, sizeof(*w));
    pthread_mutex_init(&w->mu, NULL);
    cond_init_mono(&w->cv);
    w->mode = M_STREAM;
    w->n = 5;
}

void
wctx_fini(wctx *w)
{
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
}

void
wctx_add(wctx *w, int *field, int delta)
{
    pthread_mutex_lock(&w->mu);
    *field += delta;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

int
wctx_get(wctx *w, const int *field)
{
    int v;
    pthread_mutex_lock(&w->mu);
    v = *field;
    pthread_mutex_unlock(&w->mu);
    return v;
}

/* Waits until *field >= atleast. Returns 1 if reached. */
int
wctx_wait(wctx *w, const int *field, int atleast, int64_t timeout_ms)
{
    int64_t until = now_ms() + timeout_ms;
    int ok;
    pthread_mutex_lock(&w->mu);
    while (*field < atleast && now_ms() < until)
        cond_wait_until(&w->cv, &w->mu, until);
    ok = *field >= atleast;
    pthread_mutex_unlock(&w->mu);
    return ok;
}

void
wctx_open_gate(wctx *w)
{
    wctx_add(w, &w->gate, 1);
}

void
w_on_cancel(sw_responder *r, void *arg)
{
    wctx *w = arg;
    (void)r;
    wctx_add(w, &w->cancel_cb, 1);
}

/* A cancel callback that takes its time (an engine tearing a batch down
 * synchronously). */
void
w_on_cancel_slow(sw_responder *r, void *arg)
{
    wctx *w = arg;
    (void)r;
    sleep_ms(1500);
    wctx_add(w, &w->cancel_cb, 1);
}

void
w_stop(wctx *w, sw_responder *r, sw_err rv)
{
    int flag = sw_responder_cancelled(r);
    pthread_mutex_lock(&w->mu);
    w->stopped++;
    w->stop_rv = rv;
    w->stop_saw_flag = flag;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

void
w_finished(wctx *w, sw_err rv)
{
    pthread_mutex_lock(&w->mu);
    w->finish_rv = rv;
    if (rv == SW_OK)
        w->finished++;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Sends "token-i" for i in [from, to). Returns 1 if all went out, 0 if a
 * send failed (recorded with w_stop). */
int
w_send_tokens(wctx *w, sw_responder *r, int from, int to, int delay_ms)
{
    char buf[32];
    for (int i = from; i < to; i++) {
        int len;
        int64_t t0;
        sw_err rv;
        if (delay_ms > 0)
            sleep_ms(delay_ms);
        len = snprintf(buf, sizeof(buf), "token-%d", i);
        t0 = now_ms();
        rv = sw_responder_send(r, buf, (size_t)len);
        if (rv != SW_OK) {
            pthread_mutex_lock(&w->mu);
            w->stop_ms = now_ms() - t0; /* set before w_stop counts it */
            pthread_mutex_unlock(&w->mu);
            w_stop(w, r, rv);
            return 0;
        }
        wctx_add(w, &w->sent, 1);
    }
    return 1;
}

/* Sends "token-i" padded with '.' to len bytes for i in [from, to).
 * Returns 1 if all went out, 0 if a send failed (recorded with w_stop). */
static int
w_send_padded(wctx *w, sw_responder *r, int from, int to, size_t len)
{
    char *buf = malloc(len);
    int ok = 1;
    assert_non_null(buf);
    for (int i = from; i < to && ok; i++) {
        sw_err rv;
        int n = snprintf(buf, len, "token-%d", i);
        memset(buf + n, '.', len - (size_t)n);
        if ((rv = sw_responder_send(r, buf, len)) != SW_OK) {
            w_stop(w, r, rv);
            ok = 0;
        } else {
            wctx_add(w, &w->sent, 1);
        }
    }
    free(buf);
    return ok;
}

void *
w_retained_main(void *arg)
{
    wctx *w = arg;
    sw_responder *r;
    pthread_mutex_lock(&w->mu);
    r = w->kept;
    pthread_mutex_unlock(&w->mu);
    /* Stream only once the handler has returned: the responder is ours now. */
    (void)wctx_wait(w, &w->returned, 1, T(10000));
    if (w_send_tokens(w, r, 0, w->n, w->delay_ms) && w->mode == M_RETAIN_FINISH)
        w_finished(w, sw_responder_finish(r, SW_STATUS_COMPLETED, NULL));
    sw_responder_release(r);
    wctx_add(w, &w->thr_done, 1);
    return NULL;
}

void
w_try(wctx *w, sw_responder *r)
{
    /* The request's window is 4 and nobody reads: a droppable that fits,
     * three data items, then no credit. */
    sw_err rv[6];
    rv[0] = sw_responder_send_droppable(r, "metrics-a", 9);
    rv[1] = sw_responder_try_send(r, "token-0", 7);
    rv[2] = sw_responder_try_send(r, "token-1", 7);
    rv[3] = sw_responder_try_send(r, "token-2", 7);
    rv[4] = sw_responder_try_send(r, "token-3", 7);         /* no credit: SW_EAGAIN */
    rv[5] = sw_responder_send_droppable(r, "metrics-b", 9); /* shed */
    pthread_mutex_lock(&w->mu);
    memcpy(w->rv, rv, sizeof(rv));
    w->nrv = 6;
    w->try_done = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    /* Blocking sends wait for the consumer's credit. */
    if (w_send_tokens(w, r, 3, w->n, 0))
        w_finished(w, sw_responder_finish(r, SW_STATUS_COMPLETED, NULL));
}

void
w_api(wctx *w, sw_responder *r)
{
    sw_err rv[12];
    char *big = calloc(1, w->big_len);
    rv[0] = sw_responder_finish(r, SW_STATUS_FAILED, "x");      /* not for finish */
    rv[1] = sw_responder_finish(r, SW_STATUS_INCOMPLETE, NULL); /* reason required */
    rv[2] = sw_responder_fail(r, "Bad Code", "m");              /* not a code token */
    rv[3] = sw_responder_fail(r, "", "m");
    rv[4] = sw_responder_send(r, NULL, 5);
    rv[5] = big ? sw_responder_send(r, big, w->big_len) : SW_ENOMEM; /* too big: nothing sent */
    rv[6] = sw_responder_send(r, "token-0", 7);
    rv[7] = sw_responder_finish(r, SW_STATUS_COMPLETED, "eos");
    rv[8] = sw_responder_finish(r, SW_STATUS_COMPLETED, NULL);
    rv[9] = sw_responder_send(r, "token-1", 7);
    rv[10] = sw_responder_fail(r, "engine_error", "late");
    rv[11] = sw_responder_try_send(r, "token-1", 7);
    free(big);
    pthread_mutex_lock(&w->mu);
    memcpy(w->rv, rv, sizeof(rv));
    w->nrv = 12;
    w->try_done = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

void
test_handler(sw_responder *r, void *arg)
{
    wctx *w = arg;
    size_t plen = 0;
    const void *p = sw_responder_payload(r, &plen);
    static const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                      0xff, 0xff, 0xff, 0xff, 0xff, 0x01};

    pthread_mutex_lock(&w->mu);
    w->started++;
    if (plen < sizeof(w->payload)) {
        if (plen > 0) /* an empty payload may come as NULL */
            memcpy(w->payload, p, plen);
        w->payload[plen] = '\0';
    }
    w->max_tokens = sw_responder_max_tokens(r);
    snprintf(w->reqid, sizeof(w->reqid), "%s", sw_responder_request_id(r));
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    if (plen == 10 && memcmp(p, "slowcancel", 10) == 0) {
        /* Per-request override: stream until cancelled, slow cancel callback. */
        sw_responder_on_cancel(r, w_on_cancel_slow, w);
        (void)w_send_tokens(w, r, 0, 100000, 20);
        wctx_add(w, &w->returned, 1);
        return;
    }
    sw_responder_on_cancel(r, w_on_cancel, w);

    switch (w->mode) {
    case M_STREAM:
        if (w_send_tokens(w, r, 0, w->n, w->delay_ms))
            w_finished(w, sw_responder_finish(r, SW_STATUS_COMPLETED, NULL));
        break;
    case M_MAXTOK: {
        uint32_t mt = sw_responder_max_tokens(r);
        if (mt != 0 && mt < (uint32_t)w->n) {
            if (w_send_tokens(w, r, 0, (int)mt, w->delay_ms))
                w_finished(w, sw_responder_finish(r, SW_STATUS_INCOMPLETE, "max_tokens"));
        } else if (w_send_tokens(w, r, 0, w->n, w->delay_ms)) {
            w_finished(w, sw_responder_finish(r, SW_STATUS_COMPLETED, NULL));
        }
        break;
    }
    case M_FAIL:
        if (w_send_tokens(w, r, 0, w->n, w->delay_ms))
            w_finished(w, sw_responder_fail(r, "engine_error", FAIL_MSG));
        break;
    case M_RETURN:
        (void)w_send_tokens(w, r, 0, w->n, w->delay_ms);
        break;
    case M_RETAIN_RELEASE:
    case M_RETAIN_FINISH:
        sw_responder_retain(r);
        pthread_mutex_lock(&w->mu);
        w->kept = r;
        if (pthread_create(&w->thr, NULL, w_retained_main, w) == 0)
            w->thr_started = 1;
        pthread_mutex_unlock(&w->mu);
        if (!w->thr_started)
            sw_responder_release(r);
        break;
    case M_ABANDON:
        if (w_send_tokens(w, r, 0, w->k, w->delay_ms))
            swx_responder_abandon(r);
        break;
    case M_AFTER_FINAL:
        if (w_send_tokens(w, r, 0, w->n, w->delay_ms)) {
            sw_err rv = sw_responder_finish(r, SW_STATUS_COMPLETED, NULL);
            if (rv == SW_OK)
                rv = swx_responder_send_after_final(r, "token-late", 10);
            w_finished(w, rv);
        }
        break;
    case M_GARBAGE:
        if (w_send_tokens(w, r, 0, w->k, 0)) {
            sw_err rv = swx_responder_publish_raw(r, garbage, sizeof(garbage));
            w_finished(w, rv);
            /* Keep going: the frontend must not show any of these. */
            if (w_send_tokens(w, r, w->k, w->n, w->delay_ms))
                (void)sw_responder_finish(r, SW_STATUS_COMPLETED, NULL);
        }
        break;
    case M_GAP:
        if (w_send_tokens(w, r, 0, w->k, 0)) {
            w_finished(w, swx_responder_skip_seq(r));
            if (w_send_tokens(w, r, w->k, w->n, w->delay_ms))
                (void)sw_responder_finish(r, SW_STATUS_COMPLETED, NULL);
        }
        break;
    case M_BLOCK:
        if (!w_send_tokens(w, r, 0, w->k, 0))
            break;
        pthread_mutex_lock(&w->mu);
        while (!w->gate && !sw_responder_cancelled(r))
            cond_wait_until(&w->cv, &w->mu, now_ms() + 5);
        pthread_mutex_unlock(&w->mu);
        if (sw_responder_cancelled(r)) {
            sw_err rv = sw_responder_send(r, "token-x", 7);
            sw_err frv = sw_responder_finish(r, SW_STATUS_COMPLETED, NULL);
            sw_err xrv = sw_responder_fail(r, "engine_error", "after the cancel");
            pthread_mutex_lock(&w->mu);
            w->cancelled_finish_rv = frv;
            w->cancelled_fail_rv = xrv;
            pthread_mutex_unlock(&w->mu);
            w_stop(w, r, rv);
        } else if (w_send_tokens(w, r, w->k, w->n, w->delay_ms)) {
            w_finished(w, sw_responder_finish(r, SW_STATUS_COMPLETED, NULL));
        }
        break;
    case M_TRY:
        w_try(w, r);
        break;
    case M_API:
        w_api(w, r);
        break;
    case M_LOSE_FINAL:
        if (w_send_tokens(w, r, 0, w->n, w->delay_ms)) {
            swx_responder_lose_next(r);
            w_finished(w, sw_responder_finish(r, SW_STATUS_COMPLETED, NULL));
        }
        break;
    case M_STRAND_FINAL:
    case M_STRAND_UNKEPT:
        if (w_send_tokens(w, r, 0, w->n - 1, w->delay_ms)) {
            sleep_ms(w->delay_ms); /* quiet: the last token and the final publish inline */
            swx_responder_fail_builds(r, w->k);
            if (w_send_tokens(w, r, w->n - 1, w->n, 0)) {
                if (w->mode == M_STRAND_UNKEPT)
                    swx_responder_fail_final_keep(r);
                w_finished(w, sw_responder_finish(r, SW_STATUS_COMPLETED, NULL));
            }
        }
        break;
    case M_KEEP:
        sw_responder_retain(r);
        pthread_mutex_lock(&w->mu);
        w->kept = r;
        pthread_mutex_unlock(&w->mu);
        break;
    case M_BIG:
        if (w_send_tokens(w, r, 0, w->k, 0) && w_send_padded(w, r, w->k, w->n, w->big_len))
            w_finished(w, sw_responder_finish(r, SW_STATUS_COMPLETED, NULL));
        break;
    case M_LOSE_LATE:
        sleep_ms(w->delay_ms);
        swx_responder_lose_next(r);
        if (w_send_tokens(w, r, 0, 1, 0)) {
            sleep_ms(w->delay_ms);
            if (w_send_tokens(w, r, 1, w->n, 0))
                w_finished(w, sw_responder_finish(r, SW_STATUS_COMPLETED, NULL));
        }
        break;
    case M_PAUSE:
        if (w_send_tokens(w, r, 0, w->k, 0)) {
            sleep_ms(w->delay_ms);
            if (w_send_tokens(w, r, w->k, w->n, 0))
                w_finished(w, sw_responder_finish(r, SW_STATUS_COMPLETED, NULL));
        }
        break;
    default:
        break;
    }
    wctx_add(w, &w->returned, 1);
}

int
setup(void **state)
{
    env *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return -1;
    wctx_init(&e->w);
    *state = e;
    return 0;
}

void
env_untrack(env *e, sw_stream *s)
{
    for (int i = 0; i < MAX_TRACKED; i++)
        if (e->streams[i] == s)
            e->streams[i] = NULL;
}

int
teardown(void **state)
{
    env *e = *state;
    wctx_open_gate(&e->w);
    for (int i = 0; i < MAX_TRACKED; i++) {
        sw_stream_close(e->streams[i]);
        e->streams[i] = NULL;
    }
    if (e->scale_cleanup != NULL)
        e->scale_cleanup(e);
    sw_router_destroy(e->rt2);
    sw_router_destroy(e->rt);
    sw_ingress_destroy(e->ing);
    if (e->w.thr_started)
        pthread_join(e->w.thr, NULL);
    if (e->w.mode == M_KEEP && e->w.kept != NULL) /* a test that failed before its release */
        sw_responder_release(e->w.kept);
    env_free_collectors(e);
    sw_conn_close(e->fc2);
    sw_conn_close(e->fc);
    sw_conn_close(e->wc);
    wctx_fini(&e->w);
    free(e);
    return 0;
}

sw_conn *
conn_open(const char *name)
{
    return conn_open_mode(name, 0);
}

sw_conn *
conn_open_mode(const char *name, int no_send_asap)
{
    sw_conn_opts o;
    sw_conn *c = NULL;
    sw_conn_opts_init(&o);
    o.url = g_nats.url;
    o.name = name;
    o.no_send_asap = no_send_asap;
    assert_int_equal(sw_conn_open(&c, &o), SW_OK);
    assert_non_null(c);
    return c;
}

/* Starts worker and frontend. io/ro may be NULL (defaults); endpoint,
 * handler and handler_arg are filled in here. */
void
env_start(env *e, sw_ingress_opts *io, sw_router_opts *ro)
{
    sw_ingress_opts iod;
    sw_router_opts rod;
    if (io == NULL) {
        sw_ingress_opts_init(&iod);
        io = &iod;
    }
    if (ro == NULL) {
        sw_router_opts_init(&rod);
        ro = &rod;
    }
    io->endpoint = EP;
    io->handler = test_handler;
    io->handler_arg = &e->w;
    e->wc = conn_open_mode("itest-worker", e->worker_no_send_asap);
    e->fc = conn_open("itest-frontend");
    assert_int_equal(sw_ingress_start(&e->ing, e->wc, io), SW_OK);
    assert_int_equal(sw_router_create(&e->rt, e->fc, ro), SW_OK);
}

void
ropts(env *e, sw_request_opts *o)
{
    sw_request_opts_init(o);
    o->endpoint = EP;
    o->instance_id = sw_ingress_instance_id(e->ing);
}

/* Opens a stream (tracked for teardown). */
sw_stream *
env_open_with(env *e, const sw_request_opts *o, const void *payload, size_t len)
{
    sw_stream *s = NULL;
    assert_int_equal(sw_router_open(&s, e->rt, o, payload, len), SW_OK);
    assert_non_null(s);
    for (int i = 0; i < MAX_TRACKED; i++) {
        if (e->streams[i] == NULL) {
            e->streams[i] = s;
            return s;
        }
    }
    fail_msg("too many tracked streams");
    return NULL;
}

sw_stream *
env_open(env *e)
{
    sw_request_opts o;
    ropts(e, &o);
    return env_open_with(e, &o, "prompt", 6);
}

void
env_close(env *e, sw_stream *s)
{
    env_untrack(e, s);
    sw_stream_close(s);
}

void
ingress_stats(env *e, sw_ingress_stats *st)
{
    sw_ingress_stats_get(e->ing, st);
}
uint64_t
ist_wait(env *e, ist_field_fn fn, uint64_t want, int64_t timeout_ms)
{
    int64_t until = now_ms() + timeout_ms;
    sw_ingress_stats st;
    for (;;) {
        ingress_stats(e, &st);
        if (fn(&st) >= want || now_ms() >= until)
            return fn(&st);
        sleep_ms(5);
    }
}
uint64_t
f_cancels(const sw_ingress_stats *s)
{
    return s->cancels;
}
uint64_t
f_bad(const sw_ingress_stats *s)
{
    return s->bad_requests;
}
uint64_t
f_fin_cancelled(const sw_ingress_stats *s)
{
    return s->finished[SW_STATUS_CANCELLED];
}
uint64_t
f_fin_completed(const sw_ingress_stats *s)
{
    return s->finished[SW_STATUS_COMPLETED];
}
uint64_t
f_inflight_zero(const sw_ingress_stats *s)
{
    return s->inflight == 0;
}
uint64_t
f_held_zero(const sw_ingress_stats *s)
{
    return s->streams_held == 0;
}
uint64_t
f_items_sent(const sw_ingress_stats *s)
{
    return s->items_sent;
}
uint64_t
f_requests_waiting(const sw_ingress_stats *s)
{
    return s->requests_waiting;
}
uint64_t
f_credit_stalls(const sw_ingress_stats *s)
{
    return s->credit_stalls;
}

void
got_free(got *g)
{
    for (size_t i = 0; i < g->n; i++)
        free(g->data[i]);
    free(g->data);
    free(g->seq);
    free(g->droppable);
    memset(g, 0, sizeof(*g));
}

void
got_add(got *g, const sw_item *it)
{
    const char *inst = it->instance_id ? it->instance_id : "(null)";
    if (g->n == 0 && g->terminals == 0)
        snprintf(g->instance, sizeof(g->instance), "%s", inst);
    else if (strcmp(g->instance, inst) != 0)
        g->instance_changed++;
    if (it->kind == SW_ITEM_TERMINAL) {
        g->terminals++;
        if (g->terminals == 1) {
            g->status = it->terminal.status;
            g->error = it->terminal.error;
            snprintf(g->reason, sizeof(g->reason), "%s",
                     it->terminal.reason ? it->terminal.reason : "(null)");
            snprintf(g->message, sizeof(g->message), "%s",
                     it->terminal.message ? it->terminal.message : "(null)");
            g->term_seq = it->seq;
        }
        return;
    }
    if (g->n == g->cap) {
        size_t nc = g->cap ? g->cap * 2 : 64;
        g->data = realloc(g->data, nc * sizeof(*g->data));
        g->seq = realloc(g->seq, nc * sizeof(*g->seq));
        g->droppable = realloc(g->droppable, nc * sizeof(*g->droppable));
        if (g->data == NULL || g->seq == NULL || g->droppable == NULL)
            abort();
        g->cap = nc;
    }
    g->data[g->n] = malloc(it->len + 1);
    if (g->data[g->n] == NULL)
        abort();
    if (it->len)
        memcpy(g->data[g->n], it->data, it->len);
    g->data[g->n][it->len] = '\0';
    g->seq[g->n] = it->seq;
    g->droppable[g->n] = it->droppable;
    g->n++;
}

/* Blocking mode: reads items until the terminal, until max_data data items
 * were collected in total (0 = no limit), or until timeout_ms. After the
 * terminal, calls next twice more and counts SW_EEOF results. Returns 1 if
 * the terminal was seen. */
int
collect(sw_stream *s, got *g, size_t max_data, int64_t timeout_ms)
{
    int64_t until = now_ms() + timeout_ms;
    const sw_item *it;
    while (g->terminals == 0) {
        int64_t left;
        sw_err rv;
        if (max_data != 0 && g->n >= max_data)
            return 0;
        left = until - now_ms();
        if (left <= 0) {
            g->timed_out = 1;
            return 0;
        }
        rv = sw_stream_next(s, &it, left);
        if (rv == SW_ETIMEDOUT) {
            g->timed_out = 1;
            return 0;
        }
        if (rv != SW_OK || it == NULL) {
            g->bad_rv = rv != SW_OK ? rv : SW_EINTERNAL;
            return 0;
        }
        got_add(g, it);
        if (g->read_delay_ms > 0 && it->kind == SW_ITEM_DATA)
            sleep_ms(g->read_delay_ms);
    }
    for (int i = 0; i < 2; i++) {
        it = (const sw_item *)(uintptr_t)1;
        if (sw_stream_next(s, &it, 0) == SW_EEOF && it == NULL)
            g->eof++;
    }
    return 1;
}

/* Data items are exactly "token-<first>".."token-<first+count-1>" with seqs
 * first_seq.. in order. */
void
assert_tokens_from(const got *g, size_t count, size_t first, uint64_t first_seq)
{
    char exp[32];
    assert_int_equal(g->n, count);
    for (size_t i = 0; i < count; i++) {
        snprintf(exp, sizeof(exp), "token-%zu", first + i);
        assert_string_equal(g->data[i], exp);
        assert_int_equal(g->seq[i], first_seq + i);
        assert_int_equal(g->droppable[i], 0);
    }
}

void
assert_tokens(const got *g, size_t count)
{
    assert_tokens_from(g, count, 0, 1);
}

/* Whatever arrived is a gap-free prefix token-0.. with seqs 1.. */
void
assert_token_prefix(const got *g)
{
    assert_tokens(g, g->n);
}

void
assert_terminal(const got *g, sw_status status, sw_err err, const char *reason)
{
    if (g->terminals != 1)
        fail_msg("terminals=%d (timed_out=%d bad_rv=%s items=%zu)", g->terminals, g->timed_out,
                 sw_err_name(g->bad_rv), g->n);
    assert_int_equal(g->terminals, 1);
    if ((int)g->status != (int)status || g->error != err || strcmp(g->reason, reason) != 0)
        fail_msg("terminal %s/%s/%s (message \"%s\"), want %s/%s/%s", sw_status_name(g->status),
                 sw_err_name(g->error), g->reason, g->message, sw_status_name(status),
                 sw_err_name(err), reason);
    assert_int_equal(g->instance_changed, 0);
}

/* A synthesized or wire terminal delivered, then end-of-stream twice. */
void
assert_done(const got *g)
{
    assert_int_equal(g->terminals, 1);
    assert_int_equal(g->eof, 2);
}

void
cbgot_init(cbgot *c)
{
    memset(c, 0, sizeof(*c));
    pthread_mutex_init(&c->mu, NULL);
    cond_init_mono(&c->cv);
    atomic_init(&c->in_cb, 0);
}

void
cbgot_fini(cbgot *c)
{
    got_free(&c->g);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
}

void *
env_push(void ***v, size_t *n, void *p)
{
    void **nv = realloc(*v, (*n + 1) * sizeof(*nv));
    if (nv == NULL || p == NULL)
        abort();
    nv[(*n)++] = p;
    *v = nv;
    return p;
}

got *
new_got(env *e)
{
    return env_push((void ***)&e->gots, &e->ngots, calloc(1, sizeof(got)));
}

/* A zeroed object of `size` bytes that starts with a cbgot (initialised). */
cbgot *
new_cbgot_sized(env *e, size_t size)
{
    cbgot *c = calloc(1, size);
    if (c == NULL)
        abort();
    cbgot_init(c);
    return env_push((void ***)&e->cbs, &e->ncbs, c);
}

cbgot *
new_cbgot(env *e)
{
    return new_cbgot_sized(e, sizeof(cbgot));
}

void
env_free_collectors(env *e)
{
    for (size_t i = 0; i < e->ngots; i++) {
        got_free(e->gots[i]);
        free(e->gots[i]);
    }
    free(e->gots);
    for (size_t i = 0; i < e->ncbs; i++) {
        cbgot_fini(e->cbs[i]);
        free(e->cbs[i]);
    }
    free(e->cbs);
    e->gots = NULL;
    e->cbs = NULL;
    e->ngots = e->ncbs = 0;
}

void
cb_item(sw_stream *s, const sw_item *it, void *arg)
{
    cbgot *c = arg;
    int do_cancel = 0, do_close = 0;
    const sw_item *dummy = NULL;
    sw_err nrv;

    if (atomic_fetch_add(&c->in_cb, 1) != 0)
        c->concurrent = 1;
    nrv = sw_stream_next(s, &dummy, 0);
    pthread_mutex_lock(&c->mu);
    c->busy_checks++;
    if (nrv == SW_EBUSY && dummy == NULL)
        c->busy_ok++;
    if (c->g.terminals > 0)
        c->after_terminal++;
    got_add(&c->g, it);
    if (it->kind == SW_ITEM_DATA && c->cancel_after != 0 && c->g.n == c->cancel_after &&
        !c->cancel_called) {
        c->cancel_called = 1;
        do_cancel = 1;
    }
    if (it->kind == SW_ITEM_TERMINAL && c->close_on_terminal)
        do_close = 1;
    pthread_mutex_unlock(&c->mu);
    if (do_cancel) {
        sw_err rv = sw_stream_cancel(s);
        pthread_mutex_lock(&c->mu);
        c->cancel_rv = rv;
        pthread_mutex_unlock(&c->mu);
    }
    atomic_fetch_sub(&c->in_cb, 1);
    if (do_close)
        sw_stream_close(s); /* s is gone after this */
    pthread_mutex_lock(&c->mu);
    if (do_close)
        c->closed = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* Waits for the terminal callback (and the close, if asked). */
int
cb_wait(cbgot *c, int64_t timeout_ms)
{
    int64_t until = now_ms() + timeout_ms;
    int ok;
    pthread_mutex_lock(&c->mu);
    while ((c->g.terminals == 0 || (c->close_on_terminal && !c->closed)) && now_ms() < until)
        cond_wait_until(&c->cv, &c->mu, until);
    ok = c->g.terminals > 0 && (!c->close_on_terminal || c->closed);
    pthread_mutex_unlock(&c->mu);
    return ok;
}

void
cb_assert_clean(cbgot *c)
{
    /* Nothing after the terminal, never two callbacks at once. */
    sleep_ms(100);
    pthread_mutex_lock(&c->mu);
    assert_int_equal(c->after_terminal, 0);
    assert_int_equal(c->concurrent, 0);
    assert_int_equal(c->g.terminals, 1);
    assert_int_equal(c->busy_ok, c->busy_checks);
    pthread_mutex_unlock(&c->mu);
}

void
random_id(uint8_t id[16], char hex[SW_REQUEST_ID_HEX])
{
    for (int i = 0; i < 16; i++)
        id[i] = (uint8_t)(rand() & 0xff);
    for (int i = 0; i < 16; i++)
        snprintf(hex + 2 * i, 3, "%02x", id[i]);
}

/* ======================================================================== */
/* Group                                                                     */

int
sf_group_setup(void **state)
{
    (void)state;
    g_slow = swh_slow();
    if (swh_nats_start(&g_nats, NULL) != 0) {
        fprintf(stderr, "streams fixture: could not start nats-server\n");
        return -1;
    }
    return 0;
}

int
sf_group_teardown(void **state)
{
    (void)state;
    swh_nats_stop(&g_nats);
    return 0;
}

void
sf_filters(int argc, char **argv)
{
    if (argc > 1 && argv[1][0] != '\0')
        cmocka_set_test_filter(argv[1]);
    if (argc > 2)
        cmocka_set_skip_filter(argv[2]);
}
