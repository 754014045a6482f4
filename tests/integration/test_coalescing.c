/* tests/integration/test_coalescing.c -- end-to-end streams over a real
 * nats-server (issues 3 and 5), split from test_streams.c by theme:
 * coalescing: items a fast producer queues travel batched and
 * in order; coalescing off; an inline handler's held items.
 * Fixture, threads and locks: streams_fixture.h. */
#include "streams_fixture.h"

#include "common/sw_common.h"

/* Reads s to its end: n tokens in order, then COMPLETED, nothing after. */
static void
collect_completed(sw_stream *s, got *g, size_t n)
{
    assert_true(collect(s, g, 0, T(20000)));
    assert_tokens(g, n);
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_done(g);
}

/* ======================================================================== */
/* 6b. Coalescing and acknowledged finals                                    */

/* A producer that sends as fast as it can: the items it queues while a
 * message goes out share the next one (StreamItemWrapper.batch). The
 * consumer still sees every item once, in order, then the terminal. */
static void
batched_items_in_order(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_stream *s;
    sw_ingress_stats st;
    sw_stream_stats ss;
    const int N = 2000;

    e->w.mode = M_STREAM;
    e->w.n = N;
    env_start(e, NULL, NULL);
    s = env_open(e);
    assert_true(collect(s, g, 0, T(20000)));
    assert_tokens(g, (size_t)N);
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_int_equal(g->term_seq, (uint64_t)N + 1);
    assert_done(g);
    ingress_stats(e, &st);
    assert_int_equal(st.items_sent, (uint64_t)N);
    /* Some messages carried several items; none carried none. */
    assert_true(st.messages_sent >= 1);
    if (st.messages_sent >= (uint64_t)N + 1)
        fail_msg("%llu messages for %d items and a final: nothing was coalesced",
                 (unsigned long long)st.messages_sent, N);
    assert_int_equal(st.items_resent, 0);
    sw_stream_stats_get(s, &ss);
    assert_int_equal(ss.items, (uint64_t)N);
    assert_int_equal(ss.duplicates, 0);
    assert_int_equal(ss.reordered, 0);
    got_free(g);
}

/* coalesce_us = SW_COALESCE_OFF: every item and the final in a message of
 * its own; a negative value other than SW_COALESCE_OFF is refused. */
static void
coalescing_off(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_ingress_opts io;
    sw_ingress_stats st;
    sw_stream *s;
    const int N = 300;

    sw_ingress_opts_init(&io);
    io.coalesce_us = SW_COALESCE_OFF;
    e->w.mode = M_STREAM;
    e->w.n = N;
    env_start(e, &io, NULL);
    {
        sw_ingress *bad = NULL;
        sw_ingress_opts b;
        sw_ingress_opts_init(&b);
        b.endpoint = EP;
        b.handler = test_handler;
        b.handler_arg = &e->w;
        b.coalesce_us = -5;
        assert_int_equal(sw_ingress_start(&bad, e->wc, &b), SW_EINVAL);
        assert_null(bad);
    }
    s = env_open(e);
    collect_completed(s, g, (size_t)N);
    ingress_stats(e, &st);
    assert_int_equal(st.items_sent, (uint64_t)N);
    assert_int_equal(st.messages_sent, (uint64_t)N + 1);
    got_free(g);
}

/* Which messages a burst travels in (issue 17). With the sender thread held,
 * a stream that sends 10 items and its final at once is published by its
 * handler's own thread. On a send-asap connection the first item of a quiet
 * stream leaves alone at once (lowest latency), the rest with the final: at
 * least 2 messages. On a buffered connection (no_send_asap) nats.c holds
 * the bytes for its flusher anyway, so the first item waits for the rest
 * and the final takes all 11 entries in one message. Each stream is whole
 * and in order either way. */
static void
burst_messages(env *e, int buffered)
{
    uint64_t before;
    sw_ingress_stats st;
    e->worker_no_send_asap = buffered;
    e->w.mode = M_STREAM;
    e->w.n = 10;
    env_start(e, NULL, NULL);
    swx_ingress_hold_sender(e->ing, 1);
    ingress_stats(e, &st);
    before = st.messages_sent;
    for (int k = 0; k < 3; k++) {
        got *g = new_got(e);
        sw_stream *s = env_open(e);
        uint64_t msgs;
        collect_completed(s, g, 10);
        ingress_stats(e, &st);
        msgs = st.messages_sent - before;
        before = st.messages_sent;
        if (buffered && msgs != 1)
            fail_msg("buffered stream %d: %llu messages, expected the burst in 1", k,
                     (unsigned long long)msgs);
        if (!buffered && msgs < 2)
            fail_msg("send-asap stream %d: %llu message(s), expected the first item alone", k,
                     (unsigned long long)msgs);
    }
    swx_ingress_hold_sender(e->ing, 0);
}

static void
burst_send_asap_first_item_alone(void **state)
{
    burst_messages(*state, 0);
}

static void
burst_buffered_one_message(void **state)
{
    burst_messages(*state, 1);
}

/* An inline handler (issue 17): its items wait for its next ones while it
 * sends them less than the hold window apart (10 s here: always), and go
 * out together, without the sender thread. On a buffered connection the
 * window is coalesce_us; on a send-asap one it is at most 20 us, which the
 * chaos hook widens here so that sanitizer builds see the same runs, and
 * only a quiet stream's items are held there (once it has published, they
 * go by the sender thread: coalesce_us is 10 s). */
static void
inline_start(env *e, int buffered, int mode, int k, int n, int delay_ms)
{
    sw_ingress_opts io;
    sw_ingress_opts_init(&io);
    io.handler_inline = 1;
    io.coalesce_us = 10 * 1000 * 1000;
    io.send_timeout_ms = 3000;
    e->worker_no_send_asap = buffered;
    e->w.mode = mode;
    e->w.k = k;
    e->w.n = n;
    e->w.delay_ms = delay_ms;
    env_start(e, &io, NULL);
    if (!buffered)
        swx_ingress_set_hold_us(e->ing, io.coalesce_us);
}

/* Messages an ingress sent, streams it handed to its sender thread, and
 * runs of held items its timer published, so far. */
typedef struct sendcounts {
    uint64_t msgs, handoffs, timer;
} sendcounts;

static sendcounts
send_counts(env *e)
{
    sw_ingress_stats st;
    sendcounts c;
    ingress_stats(e, &st);
    c.msgs = st.messages_sent;
    swx_ingress_send_counts(e->ing, &c.handoffs, &c.timer);
    return c;
}

/* Opens a stream of n tokens and checks its messages since *before: at
 * least `want`, at most `want` plus the runs the timer cut short (a tick
 * that lands in the middle of the burst publishes what waits so far), and
 * no stream handed to the sender thread unless the timer cut a run (on
 * send-asap the stream has then published: the rest goes the usual way,
 * perhaps one more message). */
static void
inline_stream_messages(env *e, sendcounts *before, int n, uint64_t want)
{
    got *g = new_got(e);
    sw_stream *s;
    sendcounts now;
    e->w.n = n;
    s = env_open(e);
    collect_completed(s, g, (size_t)n);
    now = send_counts(e);
    if (now.handoffs != before->handoffs && now.timer == before->timer)
        fail_msg("%d items: %llu stream(s) handed to the sender thread", n,
                 (unsigned long long)(now.handoffs - before->handoffs));
    if (now.msgs - before->msgs < want ||
        now.msgs - before->msgs >
            want + now.timer - before->timer + now.handoffs - before->handoffs)
        fail_msg("%d items: %llu messages (%llu runs cut by the timer), expected %llu", n,
                 (unsigned long long)(now.msgs - before->msgs),
                 (unsigned long long)(now.timer - before->timer), (unsigned long long)want);
    *before = now;
}

/* A burst of 10 items and the final is one message, published by the
 * handler's thread (the sender thread is never woken); 200 items at once
 * (window 256) go in message-sized runs: 128, then 72 and the final.
 * With send-asap the first 128 go the same way, from a quiet stream; the
 * stream has then published, and the rest goes by the sender thread. */
static void
inline_burst_messages(env *e, int buffered)
{
    sendcounts c;
    inline_start(e, buffered, M_STREAM, 0, 10, 0);
    c = send_counts(e);
    for (int k = 0; k < 3; k++)
        inline_stream_messages(e, &c, 10, 1);
    if (buffered) {
        inline_stream_messages(e, &c, 200, 2);
    } else {
        got *g = new_got(e);
        sendcounts now;
        e->w.n = 200;
        collect_completed(env_open(e), g, 200);
        now = send_counts(e);
        if (now.msgs - c.msgs < 2 || now.handoffs == c.handoffs)
            fail_msg("200 items: %llu messages, %llu hand-offs: expected 2 or more, the "
                     "second run by the sender thread",
                     (unsigned long long)(now.msgs - c.msgs),
                     (unsigned long long)(now.handoffs - c.handoffs));
    }
}

static void
inline_buffered_burst_messages(void **state)
{
    inline_burst_messages(*state, 1);
}

static void
inline_asap_burst_messages(void **state)
{
    inline_burst_messages(*state, 0);
}

/* A handler that sends an item, then blocks (M_STREAM: 2 tokens 1 s apart,
 * the first after 1 s): the item goes out at the timer's next tick, not
 * when the handler sends again 1 s later or returns, even with the sender
 * thread held (held items never depend on it). Heartbeats are 5 s apart,
 * so no beat's tick publishes it instead. The bound is not scaled for
 * sanitizer builds: it must come before the second send. */
static void
inline_pause_timer_publishes(env *e, int buffered)
{
    got *g = new_got(e);
    sw_request_opts o;
    sw_stream *s;
    int64_t t0;
    inline_start(e, buffered, M_STREAM, 0, 2, 1000);
    swx_ingress_hold_sender(e->ing, 1);
    ropts(e, &o);
    o.heartbeat_ms = 5000;
    t0 = now_ms();
    s = env_open_with(e, &o, "prompt", 6);
    assert_false(collect(s, g, 1, 1800));
    if (g->n != 1)
        fail_msg("the item sent 1 s in had not arrived %lld ms in", (long long)(now_ms() - t0));
    collect_completed(s, g, 2);
    assert_true(send_counts(e).timer >= 1);
    swx_ingress_hold_sender(e->ing, 0);
}

static void
inline_buffered_pause_timer_publishes(void **state)
{
    inline_pause_timer_publishes(*state, 1);
}

static void
inline_asap_pause_timer_publishes(void **state)
{
    inline_pause_timer_publishes(*state, 0);
}

/* More items than the window: a send that waits for credit first publishes
 * what waits (the credit comes for items that went out), rather than
 * leaving it for the timer's tick (or, without the timer, waiting out
 * send_timeout_ms). Buffered, the handler publishes every run itself; with
 * send-asap only the first (the stream is then hot: the sender thread). */
static void
inline_credit_wait_publishes(env *e, int buffered)
{
    got *g = new_got(e);
    sw_request_opts o;
    sw_stream *s;
    sendcounts c;
    inline_start(e, buffered, M_STREAM, 0, 800, 0);
    ropts(e, &o);
    o.credit_window = 4;
    s = env_open_with(e, &o, "prompt", 6);
    collect_completed(s, g, 800);
    assert_int_equal(wctx_get(&e->w, &e->w.stopped), 0);
    /* Each of the 200 windows would wait for a tick (~5 s in all) if the
     * send did not publish first; a tick landing while 4 items wait
     * happens a few times at most. */
    c = send_counts(e);
    if (c.timer > 40)
        fail_msg("the timer published held items %llu times for 200 windows: the sends "
                 "waited for credit with their items held",
                 (unsigned long long)c.timer);
    if (buffered)
        assert_int_equal(c.handoffs, 0);
}

static void
inline_buffered_credit_wait_publishes(void **state)
{
    inline_credit_wait_publishes(*state, 1);
}

static void
inline_asap_credit_wait_publishes(void **state)
{
    inline_credit_wait_publishes(*state, 0);
}

/* An inline handler with the default hold window on this mode and
 * coalesce_us: it sends n items 1 ms apart, then its final; the stream is
 * read to its end. The ingress's counts afterwards. */
static sendcounts
inline_paced(env *e, int buffered, int coalesce_us, int n)
{
    got *g = new_got(e);
    sw_ingress_opts io;
    sw_ingress_opts_init(&io);
    io.handler_inline = 1;
    io.coalesce_us = coalesce_us;
    e->worker_no_send_asap = buffered;
    e->w.mode = M_STREAM;
    e->w.n = n;
    e->w.delay_ms = 1;
    env_start(e, &io, NULL);
    collect_completed(env_open(e), g, (size_t)n);
    return send_counts(e);
}

/* A handler that keeps sending less than the window apart does not keep
 * its items for a message's worth: what waits goes out at the first send
 * after it has waited the window (5 ms here, buffered: coalesce_us). 60
 * items 1 ms apart then travel in runs of about 6, 10 messages or more;
 * without that bound only the timer's ticks (25 ms) would cut them, about
 * 4 messages. */
static void
inline_hold_window_bounds_wait(void **state)
{
    sendcounts c = inline_paced(*state, 1, 5000, 60);
    if (c.msgs < 8)
        fail_msg("60 items 1 ms apart with a 5 ms window: %llu messages (%llu cut by the "
                 "timer), expected 8 or more",
                 (unsigned long long)c.msgs, (unsigned long long)c.timer);
    assert_int_equal(c.handoffs, 0);
}

/* On a send-asap connection the window is at most 20 us whatever
 * coalesce_us says (10 ms here): a handler that paces its items 1 ms apart
 * has none of them wait, not even the first (sent 1 ms after its start):
 * each goes the usual way (the first at once, the others by the sender
 * thread, the stream having published less than coalesce_us before), which
 * has nothing else to put with it, so each travels alone: 6 messages with
 * the final, 5 when the final catches the last item still queued; a held
 * run would be 1 or 2. Under a heavy load the sender thread may be late by
 * a millisecond or two: 3 or more is asked, with a hand-off and nothing
 * published by the timer. */
static void
inline_asap_paced_items_not_held(void **state)
{
    sendcounts c = inline_paced(*state, 0, 10000, 5);
    if (c.msgs < 3 || c.handoffs == 0 || c.timer != 0)
        fail_msg("5 items 1 ms apart and the final: %llu messages, %llu hand-offs, %llu "
                 "published by the timer; expected 3 or more, some, none",
                 (unsigned long long)c.msgs, (unsigned long long)c.handoffs,
                 (unsigned long long)c.timer);
}

/* The real send-asap window, unwidened: a handler's loop of 10 sends and
 * its final are held and go out in one message (the window is 20 us; the
 * handler's start and each send are a few microseconds apart). A send
 * delayed past the window by the scheduler cuts the run, so of 5 streams
 * at least one is asked to be whole; under sanitizers, whose sends are far
 * slower, only the counts are logged. Fails with no hold on send-asap or a
 * window too narrow for a loop. */
static void
inline_asap_default_window_holds_burst(void **state)
{
    env *e = *state;
    sw_ingress_opts io;
    sendcounts c;
    int whole = 0;
    sw_ingress_opts_init(&io);
    io.handler_inline = 1;
    e->w.mode = M_STREAM;
    e->w.n = 10;
    env_start(e, &io, NULL);
    c = send_counts(e);
    for (int k = 0; k < 5; k++) {
        got *g = new_got(e);
        uint64_t before = c.msgs;
        collect_completed(env_open(e), g, 10);
        c = send_counts(e);
        whole += c.msgs - before == 1;
    }
    if (whole == 0 && g_slow == 1)
        fail_msg("no burst of 10 items and a final went out in one message (5 streams, %llu "
                 "messages)",
                 (unsigned long long)c.msgs);
    if (g_slow != 1)
        print_message("sanitizer build: %d of 5 bursts in one message\n", whole);
}

/* A handler that breaks handler_inline's contract on send-asap: it sends 2
 * items at once and then blocks (300 ms of "work") before the rest. The 2
 * items were sent within the window of its start, so they wait; the
 * timer's next tick publishes them (25 ms), long before the handler sends
 * again. The bound is not scaled: it must come before the pause ends. */
static void
inline_asap_items_before_pause_bounded(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sw_ingress_opts io;
    sw_request_opts o;
    sw_stream *s;
    int64_t t0;
    sw_ingress_opts_init(&io);
    io.handler_inline = 1;
    e->w.mode = M_PAUSE;
    e->w.k = 2;
    e->w.n = 4;
    e->w.delay_ms = 300;
    env_start(e, &io, NULL);
    ropts(e, &o);
    o.heartbeat_ms = 5000; /* no beat's tick publishes them instead */
    t0 = now_ms();
    s = env_open_with(e, &o, "prompt", 6);
    assert_false(collect(s, g, 2, 250));
    if (g->n != 2)
        fail_msg("%zu of the 2 items sent before a 300 ms pause had arrived %lld ms in", g->n,
                 (long long)(now_ms() - t0));
    collect_completed(s, g, 4);
}

/* The size of a message of items: on an unsealed connection a run of
 * 1 KiB items goes in messages of at most 16 KiB (SWN_BATCH_BYTES;
 * BENCHMARKS.md session 39). An inline handler on a buffered connection,
 * whose hold window (10 s) holds its items until 16 KiB of data waits:
 * 64 items go as 15, 2, 15, 2, 15, 2 and 13 with the final (a held run of
 * 17 makes a full message and a runt of 2; sending the run as it fills a
 * message measured slower, session 39), so four messages over 12 KiB. The
 * ingress timer's tick may cut a run short (a burst slower than 25 ms:
 * sanitizer builds); each cut may cost one of them. The publishing
 * connection's tap sees every message's length as it goes out (heartbeats
 * and probe answers are under 1 KiB). */
typedef struct sizetap {
    pthread_mutex_t mu;
    size_t max;
    unsigned full; /* messages over 12 KiB */
} sizetap;

/* Static: a publish that began before the tap was cleared may still call
 * it (transport/sw_transport.h), on another thread, after the test is
 * done with it. */
static sizetap g_sizetap = {PTHREAD_MUTEX_INITIALIZER, 0, 0};

static void
sizetap_rec(void *arg, swt_tap_point at, const uint8_t *data, size_t len)
{
    sizetap *t = arg;
    (void)data;
    if (at != SWT_TAP_PUB_END)
        return;
    pthread_mutex_lock(&t->mu);
    if (len > t->max)
        t->max = len;
    if (len > 12 * 1024)
        t->full++;
    pthread_mutex_unlock(&t->mu);
}

static void
inline_big_items_16k_messages(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    sizetap t;
    sendcounts c0, c1;
    unsigned cuts;
    sw_stream *s;
    const int N = 64;
    const size_t LEN = 1024;
    pthread_mutex_lock(&g_sizetap.mu);
    g_sizetap.max = 0;
    g_sizetap.full = 0;
    pthread_mutex_unlock(&g_sizetap.mu);
    e->w.big_len = LEN;
    inline_start(e, 1, M_BIG, 0, N, 0);
    assert_int_equal(swx_ingress_batch_bytes(e->ing), 16 * 1024);
    c0 = send_counts(e);
    swt_conn_set_tap(e->wc, sizetap_rec, &g_sizetap);
    s = env_open(e);
    assert_true(collect(s, g, 0, T(20000)));
    /* the handler published its last message itself before it returned */
    for (int64_t until = now_ms() + T(5000); wctx_get(&e->w, &e->w.returned) < 1;) {
        assert_true(now_ms() < until);
        sleep_ms(2);
    }
    swt_conn_set_tap(e->wc, NULL, NULL);
    pthread_mutex_lock(&g_sizetap.mu);
    t = g_sizetap;
    pthread_mutex_unlock(&g_sizetap.mu);
    c1 = send_counts(e);
    assert_int_equal(g->n, (size_t)N);
    for (int i = 0; i < N; i++) {
        char want[32];
        int k = snprintf(want, sizeof(want), "token-%d", i);
        if (strlen(g->data[i]) != LEN || strncmp(g->data[i], want, (size_t)k) != 0)
            fail_msg("item %d is not %s padded to %zu bytes", i, want, LEN);
    }
    assert_terminal(g, SW_STATUS_COMPLETED, SW_OK, "stop");
    assert_done(g);
    cuts = (unsigned)(c1.timer - c0.timer);
    if (t.max > 16 * 1024)
        fail_msg("a message of %zu bytes: more than 16 KiB", t.max);
    if (t.full + cuts < 4 || t.full < 1)
        fail_msg("%u messages over 12 KiB (largest %zu), %u runs cut by the timer: the items "
                 "were not coalesced",
                 t.full, t.max, cuts);
}

/* A stream probe's answer says what went out (ProbeReply.last_seq, as a
 * heartbeat's last_seq), not what the worker numbered and still holds: a
 * buffered worker's handler sends 5 items, which wait for the sender
 * thread (held here), and a PROBE naming the stream is answered with
 * last_seq 0 (it said 5 before). Released, the items arrive in order. */
static void
probe_answer_counts_what_went_out(void **state)
{
    env *e = *state;
    got *g = new_got(e);
    natsConnection *nc;
    natsSubscription *sub = NULL;
    natsMsg *m = NULL;
    swp_control c = STREAMWIRE__V1__CONTROL__INIT;
    swp_probe_reply *p = NULL;
    ProtobufCBinaryData rid;
    uint8_t id[SW_REQUEST_ID_BYTES], buf[256];
    char subj[SWT_SUBJECT_MAX], reply[SWT_SUBJECT_MAX];
    const char *hex, *inst;
    size_t len;
    sw_stream *s;
    int64_t until;

    e->worker_no_send_asap = 1;
    e->w.mode = M_BLOCK;
    e->w.k = 5;
    e->w.n = 8;
    env_start(e, NULL, NULL);
    nc = sw_conn_nats(e->fc);
    swx_ingress_hold_sender(e->ing, 1);
    s = env_open(e);
    until = now_ms() + T(10000);
    while (wctx_get(&e->w, &e->w.sent) < 5) {
        assert_true(now_ms() < until);
        sleep_ms(2);
    }
    hex = sw_stream_request_id(s);
    inst = sw_ingress_instance_id(e->ing);
    assert_int_equal(strlen(hex), 2 * SW_REQUEST_ID_BYTES);
    assert_int_equal(swi_unhex(id, hex, sizeof(id)), 0);
    rid.data = id;
    rid.len = sizeof(id);
    c.version = SW_PROTOCOL_VERSION;
    c.kind = STREAMWIRE__V1__CONTROL_KIND__CONTROL_PROBE;
    c.router_id = (char *)sw_router_id(e->rt);
    c.request_id = rid;
    c.probe_id = (UINT64_C(1) << 63) | 12345;
    assert_int_equal(swt_subject_control(subj, sizeof(subj), inst), SW_OK);
    assert_int_equal(swt_subject_probe_reply(reply, sizeof(reply), sw_router_id(e->rt), inst),
                     SW_OK);
    assert_int_equal(swp_encode(&c, buf, sizeof(buf), &len), SW_OK);
    assert_int_equal(natsConnection_SubscribeSync(&sub, nc, reply), NATS_OK);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    assert_int_equal(natsConnection_PublishRequest(nc, subj, reply, buf, (int)len), NATS_OK);
    /* the router's own probes share the subject: take the answer to ours */
    for (;;) {
        assert_int_equal(natsSubscription_NextMsg(&m, sub, (int64_t)T(5000)), NATS_OK);
        assert_int_equal(swp_decode_probe_reply((const uint8_t *)natsMsg_GetData(m),
                                                (size_t)natsMsg_GetDataLength(m), 4096, &p),
                         SW_OK);
        natsMsg_Destroy(m);
        if (p->probe_id == c.probe_id)
            break;
        swp_free(p);
    }
    natsSubscription_Destroy(sub);
    assert_true(p->known);
    if (p->last_seq != 0)
        fail_msg("the answer says last_seq %llu; nothing went out yet (5 items wait)",
                 (unsigned long long)p->last_seq);
    swp_free(p);
    swx_ingress_hold_sender(e->ing, 0);
    wctx_open_gate(&e->w);
    collect_completed(s, g, 8);
}

/* ======================================================================== */

int
main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        T_(batched_items_in_order),
        T_(coalescing_off),
        T_(burst_send_asap_first_item_alone),
        T_(burst_buffered_one_message),
        T_(inline_buffered_burst_messages),
        T_(inline_buffered_pause_timer_publishes),
        T_(inline_buffered_credit_wait_publishes),
        T_(inline_asap_burst_messages),
        T_(inline_asap_pause_timer_publishes),
        T_(inline_asap_credit_wait_publishes),
        T_(inline_hold_window_bounds_wait),
        T_(inline_asap_paced_items_not_held),
        T_(inline_asap_default_window_holds_burst),
        T_(inline_asap_items_before_pause_bounded),
        T_(inline_big_items_16k_messages),
        T_(probe_answer_counts_what_went_out),
    };
    sf_filters(argc, argv);
    return cmocka_run_group_tests_name("streams.coalescing", tests, sf_group_setup,
                                       sf_group_teardown);
}
