/* tests/integration/test_sealed.c -- sealing wired into the streams (issue
 * 13), against a real nats-server: a sealed cluster streams, cancels and
 * detects loss; a mixed cluster ends every stream with auth_failed, at
 * once, both ways; and a hostile peer on the bus (nats.c, no key) attacks
 * a sealed cluster: forged items, finals and heartbeats, items replayed
 * from another stream and from earlier positions of the same stream,
 * tampered bytes, forged cancels and credits, forged probe answers for a
 * killed worker, a flood of requests with bad seals. Each is refused or
 * ends its stream with auth_failed; nothing forged reaches a consumer; no
 * healthy worker is evicted; no live stream is cancelled by a forgery. */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <nats/nats.h>

#include "common/sw_common.h"
#include <streamwire/metrics.h>
#include <streamwire/registry.h>
#include "harness.h"
#include "ingress/chaos.h"
#include "proto/sw_codec.h"
#include "transport/envelope.h"
#include "transport/seal.h"
#include "transport/sw_transport.h"

#define EP "seal.demo.gen"
#define T(ms) ((int64_t)(ms)*swh_slow())

static swh_nats g_nats;
static char g_key1[320], g_key2[320];

static void
write_key(char *path, size_t cap, const char *name)
{
    swt_seal_key k;
    char hex[SWT_SEAL_KEY_HEX + 1];
    FILE *f;
    snprintf(path, cap, "%s/%s", g_nats.dir, name);
    assert_int_equal(swt_seal_key_generate(&k), SW_OK);
    swt_seal_key_hex(&k, hex);
    f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "%s\n", hex);
    fclose(f);
    assert_int_equal(chmod(path, 0600), 0);
    swt_seal_key_wipe(&k);
}

/* A connection sealing with `key` that also opens what `open_key` sealed
 * (NULL: none). */
static sw_conn *
conn_open2(const char *key, const char *open_key)
{
    sw_conn_opts o;
    sw_conn *c = NULL;
    sw_conn_opts_init(&o);
    o.url = g_nats.url;
    o.seal_key_file = key;
    o.seal_open_key_file = open_key;
    assert_int_equal(sw_conn_open(&c, &o), SW_OK);
    assert_int_equal(sw_conn_sealed(c), key != NULL);
    return c;
}

static sw_conn *
conn_open(const char *key)
{
    return conn_open2(key, NULL);
}

/* ------------------------------------------------------------ a worker */

typedef struct engine {
    int n;        /* items per request (payload "n=K" overrides) */
    int delay_ms; /* between items */
    pthread_mutex_t mu;
    int cancelled, served;
    int start_delay_ms; /* before the first item */
} engine;

static void
handler(sw_responder *r, void *arg)
{
    engine *e = arg;
    size_t len;
    const char *p = sw_responder_payload(r, &len);
    int n = e->n;
    char buf[32];
    if (len > 2 && len < sizeof(buf) && p[0] == 'n' && p[1] == '=') {
        memcpy(buf, p + 2, len - 2); /* the payload is not a C string */
        buf[len - 2] = '\0';
        n = atoi(buf);
    }
    pthread_mutex_lock(&e->mu);
    e->served++;
    pthread_mutex_unlock(&e->mu);
    if (e->start_delay_ms > 0)
        swh_sleep_ms(e->start_delay_ms);
    for (int i = 0; i < n; i++) {
        int k = snprintf(buf, sizeof(buf), "token-%d", i);
        if (i > 0 && e->delay_ms > 0)
            swh_sleep_ms(e->delay_ms);
        if (sw_responder_send(r, buf, (size_t)k) != SW_OK) {
            pthread_mutex_lock(&e->mu);
            e->cancelled++;
            pthread_mutex_unlock(&e->mu);
            return;
        }
    }
    (void)sw_responder_finish(r, SW_STATUS_COMPLETED, NULL);
}

static sw_ingress *
worker(sw_conn *c, const char *inst, engine *e)
{
    sw_ingress_opts o;
    sw_ingress *ing = NULL;
    sw_ingress_opts_init(&o);
    o.endpoint = EP;
    o.instance_id = inst;
    o.handler = handler;
    o.handler_arg = e;
    assert_int_equal(sw_ingress_start(&ing, c, &o), SW_OK);
    return ing;
}

static sw_router *
router(sw_conn *c)
{
    sw_router_opts o;
    sw_router *r = NULL;
    sw_router_opts_init(&o);
    assert_int_equal(sw_router_create(&r, c, &o), SW_OK);
    return r;
}

static sw_stream *
open_stream(sw_router *r, const char *inst, const char *payload)
{
    sw_request_opts q;
    sw_stream *s = NULL;
    sw_request_opts_init(&q);
    q.endpoint = EP;
    q.instance_id = inst;
    assert_int_equal(sw_router_open(&s, r, &q, payload, strlen(payload)), SW_OK);
    return s;
}

/* Reads to the terminal: the number of items, each checked to be token-k
 * in order (so no forged or garbled bytes reached the consumer). */
static int
drain(sw_stream *s, sw_terminal *term, char *reason, size_t cap)
{
    const sw_item *it;
    int n = 0;
    for (;;) {
        assert_int_equal(sw_stream_next(s, &it, T(15000)), SW_OK);
        if (it->kind == SW_ITEM_TERMINAL)
            break;
        {
            char want[32];
            int k = snprintf(want, sizeof(want), "token-%d", n);
            if (it->len != (size_t)k || memcmp(it->data, want, it->len) != 0)
                fail_msg("item %d is not %s: %.*s", n, want, (int)it->len, (const char *)it->data);
        }
        n++;
    }
    *term = it->terminal;
    snprintf(reason, cap, "%s", it->terminal.reason ? it->terminal.reason : "");
    term->reason = reason;
    term->message = "";
    return n;
}

/* ------------------------------------------------------------ the cases */

static void
sealed_cluster_streams(void **state)
{
    sw_conn *wc = conn_open(g_key1), *fc = conn_open(g_key1);
    engine e = {50, 0, PTHREAD_MUTEX_INITIALIZER, 0, 0, 0};
    sw_ingress *ing = worker(wc, "sw1", &e);
    sw_router *r = router(fc);
    sw_terminal t;
    char reason[64];
    sw_stream *s;
    (void)state;
    /* a sealing worker's messages of items may hold 32 KiB (each is sealed
     * and opened with a key derivation of its own; unsealed: 16 KiB,
     * test_coalescing) */
    assert_int_equal(swx_ingress_batch_bytes(ing), 32 * 1024);
    for (int i = 0; i < 5; i++) {
        s = open_stream(r, "sw1", "n=300"); /* beyond the credit window: credit flows sealed */
        assert_int_equal(drain(s, &t, reason, sizeof(reason)), 300);
        assert_int_equal(t.status, SW_STATUS_COMPLETED);
        sw_stream_close(s);
    }
    /* a cancel, sealed, reaches the handler */
    e.delay_ms = 5;
    s = open_stream(r, "sw1", "n=100000");
    {
        const sw_item *it;
        assert_int_equal(sw_stream_next(s, &it, T(5000)), SW_OK);
        assert_int_equal(sw_stream_cancel(s), SW_OK);
        do
            assert_int_equal(sw_stream_next(s, &it, T(5000)), SW_OK);
        while (it->kind == SW_ITEM_DATA);
        assert_int_equal(it->terminal.status, SW_STATUS_CANCELLED);
    }
    sw_stream_close(s);
    for (int i = 0; i < 5 * 200 * swh_slow(); i++) {
        int c;
        pthread_mutex_lock(&e.mu);
        c = e.cancelled;
        pthread_mutex_unlock(&e.mu);
        if (c == 1)
            break;
        swh_sleep_ms(10);
    }
    assert_int_equal(e.cancelled, 1);
    {
        sw_ingress_stats is;
        sw_router_stats rs;
        sw_ingress_stats_get(ing, &is);
        sw_router_stats_get(r, &rs);
        assert_int_equal(is.auth_failures, 0);
        assert_int_equal(rs.auth_failures, 0);
        assert_int_equal(swt_conn_auth_failures(fc), 0);
    }
    sw_router_destroy(r);
    sw_ingress_destroy(ing);
    sw_conn_close(fc);
    sw_conn_close(wc);
}

/* ------------------------------------------- items at the size limit */

/* The handler of items_at_the_size_limit: sends g_sizes' items (byte i of
 * item k is 'a' + (k + i) % 26), records each send's result, finishes. */
#define NSIZES 8
static size_t g_sizes[NSIZES];
static int g_sent[NSIZES]; /* an sw_err, -1 before the send returned (g_sent_mu) */
static pthread_mutex_t g_sent_mu = PTHREAD_MUTEX_INITIALIZER;

/* The result of the send of item k, once the handler has it (an item may
 * arrive before its send returned). */
static int
sent_result(int k)
{
    int rv;
    for (int64_t until = swh_now_ms() + T(10000);;) {
        pthread_mutex_lock(&g_sent_mu);
        rv = g_sent[k];
        pthread_mutex_unlock(&g_sent_mu);
        if (rv != -1 || swh_now_ms() >= until)
            return rv;
        swh_sleep_ms(1);
    }
}

static void
fill_item(char *buf, size_t len, int k)
{
    for (size_t i = 0; i < len; i++)
        buf[i] = (char)('a' + (k + i) % 26);
}

static void
size_handler(sw_responder *r, void *arg)
{
    char *buf = malloc(1 << 16);
    (void)arg;
    for (int k = 0; k < NSIZES && buf != NULL; k++) {
        sw_err rv;
        fill_item(buf, g_sizes[k], k);
        rv = sw_responder_send(r, buf, g_sizes[k]);
        pthread_mutex_lock(&g_sent_mu);
        g_sent[k] = (int)rv;
        pthread_mutex_unlock(&g_sent_mu);
    }
    free(buf);
    (void)sw_responder_finish(r, SW_STATUS_COMPLETED, NULL);
}

/* Items at the edge of the server's max payload, sealed and not
 * (streamwire.h): sw_conn_max_payload is the server's less the sealed
 * envelope's 78 bytes when sealing; an item of up to that less 128 bytes
 * is sent and delivered byte for byte, one of that less 112 or more is
 * SW_EMSGSIZE with nothing sent and the stream usable: the items that
 * went out arrive in order, their seqs 1, 2, ... without a gap, and the
 * stream completes. (The header said "a wrapper of up to 94 bytes", from
 * before instance ids could be 64 bytes long: an item of 95 bytes less
 * than the max was refused.) */
static void
items_at_the_size_limit(void **state)
{
    swh_nats n;
    size_t plain_max = 0;
    (void)state;
    assert_int_equal(swh_nats_start(&n, "max_payload: 4096\n"), 0);
    for (int sealed = 0; sealed < 2; sealed++) {
        sw_conn_opts co;
        sw_conn *wc = NULL, *fc = NULL;
        sw_ingress_opts io;
        sw_ingress *ing = NULL;
        sw_router *r;
        sw_request_opts q;
        sw_stream *s = NULL;
        const sw_item *it;
        char *want = malloc(1 << 16);
        size_t max;
        uint64_t seq = 0;
        int k = 0;
        assert_non_null(want);
        sw_conn_opts_init(&co);
        co.url = n.url;
        co.seal_key_file = sealed ? g_key1 : NULL;
        assert_int_equal(sw_conn_open(&wc, &co), SW_OK);
        assert_int_equal(sw_conn_open(&fc, &co), SW_OK);
        max = sw_conn_max_payload(wc);
        if (!sealed) {
            assert_int_equal(max, 4096);
            plain_max = max;
        } else {
            assert_int_equal(max, plain_max - 78);
        }
        g_sizes[0] = 100;
        g_sizes[1] = max - 128;
        g_sizes[2] = max - 120; /* (fits here: a small seq, a 2-byte length) */
        g_sizes[3] = max - 112;
        g_sizes[4] = max - 1;
        g_sizes[5] = max;
        g_sizes[6] = max + 1;
        g_sizes[7] = 1;
        pthread_mutex_lock(&g_sent_mu);
        for (int j = 0; j < NSIZES; j++)
            g_sent[j] = -1;
        pthread_mutex_unlock(&g_sent_mu);
        sw_ingress_opts_init(&io);
        io.endpoint = EP;
        io.instance_id = "sz1";
        io.handler = size_handler;
        assert_int_equal(sw_ingress_start(&ing, wc, &io), SW_OK);
        r = router(fc);
        sw_request_opts_init(&q);
        q.endpoint = EP;
        q.instance_id = "sz1";
        assert_int_equal(sw_router_open(&s, r, &q, "x", 1), SW_OK);
        for (;;) {
            assert_int_equal(sw_stream_next(s, &it, T(10000)), SW_OK);
            if (it->kind == SW_ITEM_TERMINAL)
                break;
            /* the next item that was sent */
            while (k < NSIZES && sent_result(k) != SW_OK)
                k++;
            assert_true(k < NSIZES);
            assert_int_equal(it->seq, ++seq);
            assert_int_equal(it->len, g_sizes[k]);
            fill_item(want, g_sizes[k], k);
            if (memcmp(it->data, want, it->len) != 0)
                fail_msg("item %d (%zu bytes, sealed %d) arrived changed", k, g_sizes[k], sealed);
            k++;
        }
        print_message("    sealed %d: max %zu, sent %d %d %d %d %d %d %d %d\n", sealed, max,
                      sent_result(0), sent_result(1), sent_result(2), sent_result(3),
                      sent_result(4), sent_result(5), sent_result(6), sent_result(7));
        assert_int_equal(it->terminal.status, SW_STATUS_COMPLETED);
        for (int j = 0; j < NSIZES; j++) {
            if (g_sizes[j] + 128 <= max)
                assert_int_equal(sent_result(j), SW_OK);
            else if (g_sizes[j] + 112 >= max)
                assert_int_equal(sent_result(j), SW_EMSGSIZE);
            else
                assert_true(sent_result(j) == SW_OK || sent_result(j) == SW_EMSGSIZE);
        }
        while (k < NSIZES && sent_result(k) != SW_OK)
            k++;
        assert_int_equal(k, NSIZES); /* every item sent arrived */
        sw_stream_close(s);
        sw_router_destroy(r);
        sw_ingress_destroy(ing);
        sw_conn_close(fc);
        sw_conn_close(wc);
        free(want);
    }
    swh_nats_stop(&n);
}

/* A mixed cluster: auth_failed at once, never a hang or a garbled stream. */
static void
mixed_cluster_fails_fast(void **state)
{
    const char *keys[3][2] = {{g_key1, NULL}, {NULL, g_key1}, {g_key1, g_key2}};
    (void)state;
    for (int k = 0; k < 3; k++) {
        sw_conn *wc = conn_open(keys[k][0]), *fc = conn_open(keys[k][1]);
        engine e = {20, 0, PTHREAD_MUTEX_INITIALIZER, 0, 0, 0};
        sw_ingress *ing = worker(wc, "mix1", &e);
        sw_router *r = router(fc);
        sw_terminal t;
        char reason[64];
        int64_t t0 = swi_now_ms();
        sw_stream *s = open_stream(r, "mix1", "hello");
        assert_int_equal(drain(s, &t, reason, sizeof(reason)), 0);
        assert_int_equal(t.status, SW_STATUS_ERROR);
        assert_int_equal(t.error, SW_AUTH_FAILED);
        assert_string_equal(t.reason, "auth_failed");
        assert_true(swi_now_ms() - t0 < T(1000));
        sw_stream_close(s);
        assert_int_equal(e.served, 0); /* the handler never ran */
        sw_router_destroy(r);
        sw_ingress_destroy(ing);
        sw_conn_close(fc);
        sw_conn_close(wc);
    }
}

/* A rolling key rotation (docs/PROTOCOL.md "Rotation"), with a worker and
 * a frontend at every pair of steps: 0 = the old key only, 1 = old seals and
 * the new one opens too, 2 = new seals and the old one opens too, 3 = the
 * new key only. Steps one apart always stream; 0 and 2, 1 and 3, 0 and 3
 * end with auth_failed (a process skipped a step). Then the configuration
 * errors: a second key without a first, the same key twice. */
static void
rolling_key_rotation(void **state)
{
    const char *cur[4] = {g_key1, g_key1, g_key2, g_key2};
    const char *opn[4] = {NULL, g_key2, g_key1, NULL};
    (void)state;
    for (int w = 0; w < 4; w++) {
        for (int f = 0; f < 4; f++) {
            sw_conn *wc = conn_open2(cur[w], opn[w]), *fc = conn_open2(cur[f], opn[f]);
            engine e = {20, 0, PTHREAD_MUTEX_INITIALIZER, 0, 0, 0};
            sw_ingress *ing = worker(wc, "rot1", &e);
            sw_router *r = router(fc);
            sw_terminal t;
            char reason[64];
            int ok = w - f <= 1 && f - w <= 1;
            sw_stream *s = open_stream(r, "rot1", "n=300"); /* credit flows both ways */
            int n = drain(s, &t, reason, sizeof(reason));
            if (ok) {
                if (t.status != SW_STATUS_COMPLETED || n != 300)
                    fail_msg("worker at step %d, frontend at step %d: %d items, %s", w, f, n,
                             reason);
            } else {
                assert_int_equal(n, 0);
                assert_int_equal(t.error, SW_AUTH_FAILED);
            }
            sw_stream_close(s);
            sw_router_destroy(r);
            sw_ingress_destroy(ing);
            sw_conn_close(fc);
            sw_conn_close(wc);
        }
    }
    {
        sw_conn_opts o;
        sw_conn *c = NULL;
        sw_conn_opts_init(&o);
        o.url = g_nats.url;
        o.seal_open_key_file = g_key2; /* and no key that seals */
        assert_int_equal(sw_conn_open(&c, &o), SW_EINVAL);
        assert_null(c);
        o.seal_key_file = g_key2; /* the same key twice */
        assert_int_equal(sw_conn_open(&c, &o), SW_EINVAL);
        assert_null(c);
    }
    {
        /* The CLI says which flag is wrong (exit 2). */
        const char *same[] = {"generate",   "--server", g_nats.url,        "--endpoint", EP,
                              "--key-file", g_key1,     "--open-key-file", g_key1,       NULL};
        const char *alone[] = {"generate", "--server",        g_nats.url, "--endpoint",
                               EP,         "--open-key-file", g_key1,     NULL};
        char out[4096];
        assert_int_equal(swh_run(same, out, sizeof(out), (int)T(10000)), 2);
        assert_int_equal(swh_run(alone, out, sizeof(out), (int)T(10000)), 2);
    }
}

/* A raw nats.c client: the attacker, or an eavesdropper. */
static natsConnection *
raw_conn(void)
{
    natsConnection *nc = NULL;
    assert_int_equal(natsConnection_ConnectTo(&nc, g_nats.url), NATS_OK);
    return nc;
}

static void
raw_item(natsConnection *nc, const char *subj, const uint8_t *id, uint64_t seq, const char *data,
         int final)
{
    assert_int_equal(swh_raw_item(nc, subj, id, seq, data, final), NATS_OK);
}

/* Opens a slow sealed stream and reads its first item: its subject and id. */
static sw_stream *
slow_stream(sw_router *r, const char *inst, char *subj, size_t cap, uint8_t id[16])
{
    sw_stream *s = open_stream(r, inst, "n=100000");
    const sw_item *it;
    const char *hex = sw_stream_request_id(s);
    assert_int_equal(sw_stream_next(s, &it, T(5000)), SW_OK);
    assert_int_equal(it->kind, SW_ITEM_DATA);
    assert_int_equal(swt_subject_response(subj, cap, sw_router_id(r), hex), SW_OK);
    for (int i = 0; i < 16; i++) {
        unsigned v;
        assert_int_equal(sscanf(hex + 2 * i, "%2x", &v), 1);
        id[i] = (uint8_t)v;
    }
    return s;
}

/* The stream ends auth_failed, and every item it delivered was the
 * worker's own (token-k in order). */
static void
expect_auth_failed(sw_stream *s)
{
    const sw_item *it;
    int n = 1; /* slow_stream read token-0 */
    for (;;) {
        assert_int_equal(sw_stream_next(s, &it, T(5000)), SW_OK);
        if (it->kind == SW_ITEM_TERMINAL)
            break;
        {
            char want[32];
            int k = snprintf(want, sizeof(want), "token-%d", n++);
            assert_int_equal(it->len, (size_t)k);
            assert_memory_equal(it->data, want, (size_t)k);
        }
    }
    assert_int_equal(it->terminal.status, SW_STATUS_ERROR);
    assert_string_equal(it->terminal.reason, "auth_failed");
}

/* A forged plain message on the subject of s, whose worker has answered:
 * refused and counted (the router's auth_failures reaches want), and the
 * stream goes on: its next 10 items are the worker's own, in order after
 * token-0 (slow_stream read it). */
static void
expect_dropped(sw_router *r, sw_stream *s, uint64_t want)
{
    const sw_item *it;
    sw_router_stats rs;
    for (int i = 0; i < 300 * swh_slow(); i++) {
        sw_router_stats_get(r, &rs);
        if (rs.auth_failures >= want)
            break;
        swh_sleep_ms(10);
    }
    assert_int_equal(rs.auth_failures, want);
    for (int n = 1; n <= 10; n++) {
        char want_tok[32];
        int k = snprintf(want_tok, sizeof(want_tok), "token-%d", n);
        assert_int_equal(sw_stream_next(s, &it, T(5000)), SW_OK);
        assert_int_equal(it->kind, SW_ITEM_DATA);
        assert_int_equal(it->len, (size_t)k);
        assert_memory_equal(it->data, want_tok, (size_t)k);
    }
}

typedef struct capture {
    pthread_mutex_t mu;
    uint8_t msgs[64][1024];
    size_t lens[64];
    int n;
} capture;

static void
on_capture(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *arg)
{
    capture *c = arg;
    (void)nc;
    (void)sub;
    pthread_mutex_lock(&c->mu);
    if (c->n < 64 && (size_t)natsMsg_GetDataLength(m) <= sizeof(c->msgs[0])) {
        memcpy(c->msgs[c->n], natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m));
        c->lens[c->n++] = (size_t)natsMsg_GetDataLength(m);
    }
    pthread_mutex_unlock(&c->mu);
    natsMsg_Destroy(m);
}

/* Sealed heartbeat batches recorded on the bus and replayed: they open
 * (same key, same subject), but each names a counter the router has taken
 * already, so none counts (each beat is counted unknown_stream) and the
 * stream sees only the worker's own heartbeats. Without the counters every
 * replay kept the stream alive (docs/PROTOCOL.md "Replays"). */
static void
replayed_heartbeat_batches_refused(void **state)
{
    sw_conn *wc = conn_open(g_key1), *fc = conn_open(g_key1);
    engine e = {2, 1500, PTHREAD_MUTEX_INITIALIZER, 0, 0, 0}; /* idle 1.5 s between its 2 items */
    sw_ingress *ing = worker(wc, "hb1", &e);
    sw_router_opts ro;
    sw_router *r = NULL;
    natsConnection *nc = raw_conn();
    natsSubscription *spy = NULL;
    char hb[SWT_SUBJECT_MAX];
    capture cap;
    sw_stream *s;
    sw_stream_stats ss;
    sw_router_stats rs0, rs1;
    sw_terminal t;
    char reason[64];
    int n;
    (void)state;
    sw_router_opts_init(&ro);
    ro.heartbeat_ms = 50;
    assert_int_equal(sw_router_create(&r, fc, &ro), SW_OK);
    memset(&cap, 0, sizeof(cap));
    pthread_mutex_init(&cap.mu, NULL);
    assert_int_equal(swt_subject_beats(hb, sizeof(hb), sw_router_id(r)), SW_OK);
    assert_int_equal(natsConnection_Subscribe(&spy, nc, hb, on_capture, &cap), NATS_OK);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    s = open_stream(r, "hb1", "n=2");
    /* Wait for a few batches the router took. */
    for (int i = 0; i < 200; i++) {
        sw_stream_stats_get(s, &ss);
        pthread_mutex_lock(&cap.mu);
        n = cap.n;
        pthread_mutex_unlock(&cap.mu);
        if (n >= 3 && ss.heartbeats >= 3)
            break;
        swh_sleep_ms(10);
    }
    assert_true(n >= 3);
    assert_true(ss.heartbeats >= 3);
    assert_true(swt_env_is_sealed(cap.msgs[0], cap.lens[0]));
    sw_router_stats_get(r, &rs0);
    for (int k = 0; k < 10; k++)
        for (int i = 0; i < 3; i++)
            assert_int_equal(natsConnection_Publish(nc, hb, cap.msgs[i], (int)cap.lens[i]),
                             NATS_OK);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    for (int i = 0; i < 200; i++) {
        sw_router_stats_get(r, &rs1);
        if (rs1.unknown_stream >= rs0.unknown_stream + 30)
            break;
        swh_sleep_ms(10);
    }
    if (rs1.unknown_stream < rs0.unknown_stream + 30)
        fail_msg("30 replayed batches of one beat: unknown_stream went from %llu to %llu",
                 (unsigned long long)rs0.unknown_stream, (unsigned long long)rs1.unknown_stream);
    assert_int_equal(rs1.auth_failures, 0); /* they open: refused for their counter */
    assert_int_equal(drain(s, &t, reason, sizeof(reason)), 2);
    assert_int_equal(t.status, SW_STATUS_COMPLETED);
    sw_stream_close(s);
    natsSubscription_Destroy(spy);
    natsConnection_Destroy(nc);
    sw_router_destroy(r);
    sw_ingress_destroy(ing);
    sw_conn_close(fc);
    sw_conn_close(wc);
    pthread_mutex_destroy(&cap.mu);
}

/* Heartbeat batches count only after a probe answer names the worker's
 * incarnation; with probes hours apart, the first batch it has not learned
 * asks for a probe at once: an idle stream (1.5 s between its items, an
 * inactivity timeout of 0.7 s) still completes on heartbeats. */
static void
heartbeats_count_with_rare_probes(void **state)
{
    sw_conn *wc = conn_open(g_key1), *fc = conn_open(g_key1);
    engine e = {2, 1500, PTHREAD_MUTEX_INITIALIZER, 0, 0, 0};
    sw_ingress *ing = worker(wc, "hb2", &e);
    sw_router_opts ro;
    sw_router *r = NULL;
    sw_stream *s;
    sw_stream_stats ss;
    sw_terminal t;
    char reason[64];
    (void)state;
    sw_router_opts_init(&ro);
    ro.heartbeat_ms = 50;
    ro.probe_interval_ms = 3600000;
    assert_int_equal(sw_router_create(&r, fc, &ro), SW_OK);
    s = open_stream(r, "hb2", "n=2");
    assert_int_equal(drain(s, &t, reason, sizeof(reason)), 2);
    if (t.status != SW_STATUS_COMPLETED)
        fail_msg("an idle stream with rare probes ended %s", reason);
    sw_stream_stats_get(s, &ss);
    assert_true(ss.heartbeats >= 5);
    sw_stream_close(s);
    sw_router_destroy(r);
    sw_ingress_destroy(ing);
    sw_conn_close(fc);
    sw_conn_close(wc);
}

/* Stream probes in a sealed cluster (issue 17): with every heartbeat of
 * the worker lost (swx_ingress_drop_beats), an idle stream lives through a
 * 4 s pause (its silence limit is 1.5 s) on the answers to its stream
 * probes, sealed as instance probes are (the probe under its stream's key,
 * the answer instance-wide on the router's probe-answer subject), and
 * completes. Those answers, recorded on the bus (sealed: they open
 * wherever they are published again on that subject) and replayed every
 * 50 ms while a second stream's probes go unanswered, keep it from
 * nothing: it ends stream_incomplete at its silence limit, and no answer
 * more counts. */
static void
stream_probes_sealed(void **state)
{
    sw_conn *wc = conn_open(g_key1), *fc = conn_open(g_key1);
    engine e = {2, 4000, PTHREAD_MUTEX_INITIALIZER, 0, 0, 0};
    sw_ingress *ing = worker(wc, "sp1", &e);
    sw_router_opts ro;
    sw_router *r = NULL;
    natsConnection *nc = raw_conn();
    natsSubscription *spy = NULL;
    char prb[SWT_SUBJECT_MAX];
    capture *cap = calloc(1, sizeof(*cap));
    sw_router_stats rs0, rs1;
    const sw_item *it = NULL;
    sw_stream *s;
    sw_terminal t;
    char reason[64];
    int64_t t0, took;
    int items = 0, replays = 0;
    (void)state;
    assert_non_null(cap);
    pthread_mutex_init(&cap->mu, NULL);
    sw_router_opts_init(&ro);
    assert_int_equal(sw_router_create(&r, fc, &ro), SW_OK);
    swx_ingress_drop_beats(ing, 1);
    assert_int_equal(swt_subject_probe_reply(prb, sizeof(prb), sw_router_id(r), "sp1"), SW_OK);
    assert_int_equal(natsConnection_Subscribe(&spy, nc, prb, on_capture, cap), NATS_OK);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    s = open_stream(r, "sp1", "n=2");
    assert_int_equal(drain(s, &t, reason, sizeof(reason)), 2);
    if (t.status != SW_STATUS_COMPLETED)
        fail_msg("an idle stream whose beats were all lost ended %s", reason);
    sw_stream_close(s);
    sw_router_stats_get(r, &rs0);
    if (rs0.stream_probes_answered < 2 || rs0.auth_failures != 0)
        fail_msg("%llu stream probes answered, %llu auth failures (want 2 or more, none)",
                 (unsigned long long)rs0.stream_probes_answered,
                 (unsigned long long)rs0.auth_failures);
    pthread_mutex_lock(&cap->mu);
    assert_true(cap->n >= 3);
    assert_true(swt_env_is_sealed(cap->msgs[0], cap->lens[0]));
    pthread_mutex_unlock(&cap->mu);
    /* The second stream: its probes lost, the recorded answers replayed. */
    swx_ingress_drop_stream_probes(ing, 1);
    s = open_stream(r, "sp1", "n=2");
    t0 = swh_now_ms();
    for (;;) {
        sw_err rv = sw_stream_next(s, &it, 50);
        if (rv == SW_OK && it->kind == SW_ITEM_TERMINAL)
            break;
        if (rv == SW_OK) {
            items++;
            continue;
        }
        assert_int_equal(rv, SW_ETIMEDOUT);
        assert_true(swh_now_ms() - t0 < T(10000));
        pthread_mutex_lock(&cap->mu);
        for (int i = 0; i < cap->n && i < 32; i++)
            assert_int_equal(natsConnection_Publish(nc, prb, cap->msgs[i], (int)cap->lens[i]),
                             NATS_OK);
        pthread_mutex_unlock(&cap->mu);
        replays++;
    }
    took = swh_now_ms() - t0;
    assert_int_equal(items, 1);
    assert_int_equal(it->terminal.status, SW_STATUS_ERROR);
    assert_int_equal(it->terminal.error, SW_STREAM_INCOMPLETE);
    if (took < 1450 || took > 1500 + T(500))
        fail_msg("ended after %lld ms with replayed answers (want the silence limit, 1,500 ms)",
                 (long long)took);
    assert_true(replays >= 10);
    sw_router_stats_get(r, &rs1);
    assert_int_equal(rs1.stream_probes_answered, rs0.stream_probes_answered);
    assert_true(rs1.stream_probes_sent > rs0.stream_probes_sent);
    sw_stream_close(s);
    natsSubscription_Destroy(spy);
    natsConnection_Destroy(nc);
    sw_router_destroy(r);
    sw_ingress_destroy(ing);
    sw_conn_close(fc);
    sw_conn_close(wc);
    pthread_mutex_destroy(&cap->mu);
    free(cap);
}

static void
hostile_peer_against_sealed_cluster(void **state)
{
    sw_conn *wc = conn_open(g_key1), *fc = conn_open(g_key1);
    engine e = {0, 20, PTHREAD_MUTEX_INITIALIZER, 0, 0, 0};
    sw_ingress *ing = worker(wc, "hw1", &e);
    sw_router *r = router(fc);
    natsConnection *nc = raw_conn();
    char subj[SWT_SUBJECT_MAX], ctl[SWT_SUBJECT_MAX];
    uint8_t id[16];
    sw_stream *s;
    capture cap;
    natsSubscription *spy = NULL;
    sw_router_stats rs;
    sw_ingress_stats is;
    (void)state;
    memset(&cap, 0, sizeof(cap));
    pthread_mutex_init(&cap.mu, NULL);

    /* 1. forged item (unsealed) on a live stream's subject, whose worker
     * has answered (sealed): refused, counted, and the stream goes on (it
     * used to end with auth_failed: a worker's plain answer to a junk
     * request, unsealed_junk_request_does_not_end_a_stream) */
    s = slow_stream(r, "hw1", subj, sizeof(subj), id);
    raw_item(nc, subj, id, 2, "FORGED", 0);
    expect_dropped(r, s, 1);
    sw_stream_close(s);

    /* 2. forged final (unsealed): the same */
    s = slow_stream(r, "hw1", subj, sizeof(subj), id);
    raw_item(nc, subj, id, 2, NULL, 1);
    expect_dropped(r, s, 2);
    sw_stream_close(s);

    /* 3. an eavesdropper records a stream's sealed items ... */
    s = slow_stream(r, "hw1", subj, sizeof(subj), id);
    assert_int_equal(natsConnection_Subscribe(&spy, nc, subj, on_capture, &cap), NATS_OK);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    for (int i = 0; i < 5 * 200 * swh_slow(); i++) {
        int n;
        pthread_mutex_lock(&cap.mu);
        n = cap.n;
        pthread_mutex_unlock(&cap.mu);
        if (n >= 3)
            break;
        swh_sleep_ms(10);
    }
    natsSubscription_Unsubscribe(spy);
    natsSubscription_Destroy(spy);
    assert_true(cap.n >= 3);
    /* ... and nothing of the tokens is readable in what it recorded */
    for (int i = 0; i < cap.n; i++)
        assert_null(memmem(cap.msgs[i], cap.lens[i], "token-", 6));
    /* 3a. replays of earlier positions of the same stream: dropped as
     * duplicates, the consumer's view does not change */
    for (int i = 0; i < cap.n; i++)
        assert_int_equal(natsConnection_Publish(nc, subj, cap.msgs[i], (int)cap.lens[i]), NATS_OK);
    {
        const sw_item *it;
        int next = -1;
        for (int k = 0; k < 10; k++) {
            char tok[32];
            assert_int_equal(sw_stream_next(s, &it, T(5000)), SW_OK);
            assert_int_equal(it->kind, SW_ITEM_DATA);
            assert_true(it->len < sizeof(tok));
            memcpy(tok, it->data, it->len);
            tok[it->len] = '\0';
            if (next >= 0)
                assert_int_equal(atoi(tok + 6), next);
            next = atoi(tok + 6) + 1;
        }
    }
    sw_stream_close(s);
    /* 3b. the recorded items replayed into another stream: they do not
     * open (sealed, not plain: the stream ends auth_failed) */
    s = slow_stream(r, "hw1", subj, sizeof(subj), id);
    assert_int_equal(natsConnection_Publish(nc, subj, cap.msgs[1], (int)cap.lens[1]), NATS_OK);
    expect_auth_failed(s);
    sw_stream_close(s);

    /* 4. tampered bytes: a recorded item of a live stream, one bit flipped */
    s = slow_stream(r, "hw1", subj, sizeof(subj), id);
    memset(&cap, 0, sizeof(cap));
    pthread_mutex_init(&cap.mu, NULL);
    assert_int_equal(natsConnection_Subscribe(&spy, nc, subj, on_capture, &cap), NATS_OK);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    while (1) {
        int n;
        pthread_mutex_lock(&cap.mu);
        n = cap.n;
        pthread_mutex_unlock(&cap.mu);
        if (n >= 1)
            break;
        swh_sleep_ms(5);
    }
    natsSubscription_Unsubscribe(spy);
    natsSubscription_Destroy(spy);
    cap.msgs[0][cap.lens[0] - 3] ^= 0x20;
    assert_int_equal(natsConnection_Publish(nc, subj, cap.msgs[0], (int)cap.lens[0]), NATS_OK);
    expect_auth_failed(s);
    sw_stream_close(s);

    /* 5. forged cancel, kill and credit (unsealed) for a live stream: never
     * acted on; the stream completes, every item once */
    e.delay_ms = 2;
    s = open_stream(r, "hw1", "n=400");
    {
        const char *hex = sw_stream_request_id(s);
        swp_control c = STREAMWIRE__V1__CONTROL__INIT;
        uint8_t buf[256];
        size_t len;
        for (int i = 0; i < 16; i++) {
            unsigned v;
            assert_int_equal(sscanf(hex + 2 * i, "%2x", &v), 1);
            id[i] = (uint8_t)v;
        }
        assert_int_equal(swt_subject_control(ctl, sizeof(ctl), "hw1"), SW_OK);
        c.version = SW_PROTOCOL_VERSION;
        c.request_id.data = id;
        c.request_id.len = 16;
        c.router_id = (char *)sw_router_id(r);
        for (int kind = STREAMWIRE__V1__CONTROL_KIND__CONTROL_CANCEL;
             kind <= STREAMWIRE__V1__CONTROL_KIND__CONTROL_CREDIT; kind++) {
            c.kind = (Streamwire__V1__ControlKind)kind;
            c.credit_limit = 1u << 20;
            assert_int_equal(swp_encode(&c, buf, sizeof(buf), &len), SW_OK);
            assert_int_equal(natsConnection_Publish(nc, ctl, buf, (int)len), NATS_OK);
        }
        natsConnection_Flush(nc);
    }
    {
        sw_terminal t;
        char reason[64];
        assert_int_equal(drain(s, &t, reason, sizeof(reason)), 400);
        assert_int_equal(t.status, SW_STATUS_COMPLETED);
    }
    sw_stream_close(s);

    /* 6. a flood of requests with bad seals (sealed with another key, and
     * unsealed): none served; the worker still serves */
    {
        int served0 = e.served;
        char rsubj[SWT_SUBJECT_MAX], reply[SWT_SUBJECT_MAX];
        swp_request q = STREAMWIRE__V1__REQUEST__INIT;
        uint8_t *buf = NULL;
        size_t len = 0;
        assert_int_equal(swt_subject_request(rsubj, sizeof(rsubj), EP, "hw1"), SW_OK);
        for (int i = 0; i < 1000; i++) {
            char hex[33];
            for (int b = 0; b < 16; b++)
                id[b] = (uint8_t)rand();
            swi_hex(hex, id, 16);
            assert_int_equal(swt_subject_response(reply, sizeof(reply), "attacker", hex), SW_OK);
            q.version = SW_PROTOCOL_VERSION;
            q.request_id.data = id;
            q.request_id.len = 16;
            q.response_subject = reply;
            q.router_id = (char *)"attacker";
            q.endpoint = (char *)EP;
            assert_int_equal(swp_encode_alloc(&q, SIZE_MAX, &buf, &len), SW_OK);
            assert_int_equal(natsConnection_PublishRequest(nc, rsubj, reply, buf, (int)len),
                             NATS_OK);
            free(buf);
        }
        natsConnection_Flush(nc);
        for (int i = 0; i < 5 * 300 * swh_slow(); i++) {
            sw_ingress_stats_get(ing, &is);
            if (is.auth_failures >= 1000)
                break;
            swh_sleep_ms(10);
        }
        assert_true(is.auth_failures >= 1000);
        assert_int_equal(e.served, served0);
        e.delay_ms = 0;
        s = open_stream(r, "hw1", "n=10");
        {
            sw_terminal t;
            char reason[64];
            assert_int_equal(drain(s, &t, reason, sizeof(reason)), 10);
            assert_int_equal(t.status, SW_STATUS_COMPLETED);
        }
        sw_stream_close(s);
    }
    /* 7. a recorded (sealed) request replayed to the same instance after its
     * stream ended: it opens, and is not run twice (review finding A3) */
    {
        char rsubj[SWT_SUBJECT_MAX];
        capture rq;
        int served0;
        memset(&rq, 0, sizeof(rq));
        pthread_mutex_init(&rq.mu, NULL);
        assert_int_equal(swt_subject_request(rsubj, sizeof(rsubj), EP, "hw1"), SW_OK);
        assert_int_equal(natsConnection_Subscribe(&spy, nc, rsubj, on_capture, &rq), NATS_OK);
        assert_int_equal(natsConnection_Flush(nc), NATS_OK);
        s = open_stream(r, "hw1", "n=3");
        {
            sw_terminal t;
            char reason[64];
            assert_int_equal(drain(s, &t, reason, sizeof(reason)), 3);
        }
        sw_stream_close(s);
        /* the spy's copy comes on its own connection's thread: wait for it
         * (unsubscribing first dropped it now and then under ASan) */
        for (int i = 0; i < 500; i++) {
            int n;
            pthread_mutex_lock(&rq.mu);
            n = rq.n;
            pthread_mutex_unlock(&rq.mu);
            if (n >= 1)
                break;
            swh_sleep_ms(10);
        }
        natsSubscription_Unsubscribe(spy);
        natsSubscription_Destroy(spy);
        assert_int_equal(rq.n, 1);
        {
            /* The frontend stamped it with its clock (Request.issued_unix_ms):
             * a worker refuses it once more than 5 minutes old. */
            swt_sealer *ks = NULL;
            uint8_t pt[1024];
            size_t plen = 0;
            swp_request *q = NULL;
            char why[SWT_SEAL_WHY_MAX];
            int64_t now = swi_unix_ms();
            assert_int_equal(swt_sealer_load(&ks, g_key1, NULL, why, sizeof(why)), SW_OK);
            assert_int_equal(swt_env_open(ks, rsubj, rq.msgs[0], rq.lens[0], pt, sizeof(pt), &plen),
                             SW_OK);
            assert_int_equal(swp_decode_request(pt, plen, sizeof(pt), &q), SW_OK);
            assert_true((int64_t)q->issued_unix_ms <= now &&
                        (int64_t)q->issued_unix_ms > now - T(10000));
            swp_free(q);
            swt_sealer_free(ks);
        }
        served0 = e.served;
        /* wait until the worker let go of the stream (its final acknowledged):
         * only the record of served ids can catch the replay then */
        for (int i = 0; i < 5 * 300 * swh_slow(); i++) {
            sw_ingress_stats_get(ing, &is);
            if (is.streams_held == 0)
                break;
            swh_sleep_ms(10);
        }
        assert_int_equal(is.streams_held, 0);
        assert_int_equal(is.replays, 0);
        assert_int_equal(
            natsConnection_PublishRequest(nc, rsubj, "sw.rsp.x.y", rq.msgs[0], (int)rq.lens[0]),
            NATS_OK);
        natsConnection_Flush(nc);
        for (int i = 0; i < 5 * 200 * swh_slow() && is.replays == 0; i++) {
            swh_sleep_ms(10);
            sw_ingress_stats_get(ing, &is);
        }
        assert_int_equal(is.replays, 1);
        assert_int_equal(e.served, served0);
    }
    sw_router_stats_get(r, &rs);
    assert_true(rs.auth_failures >= 4); /* cases 1, 2, 3b, 4 */
    print_message("    refused: frontend %llu, worker %llu\n", (unsigned long long)rs.auth_failures,
                  (unsigned long long)is.auth_failures);
    {
        /* exported as Prometheus families, with the same counts */
        sw_metrics *m = NULL;
        char *text = NULL, want[160];
        size_t tl = 0;
        assert_int_equal(sw_metrics_create(&m), SW_OK);
        assert_int_equal(sw_metrics_add_router(m, r), SW_OK);
        assert_int_equal(sw_metrics_add_ingress(m, ing), SW_OK);
        assert_int_equal(sw_metrics_render(m, &text, &tl), SW_OK);
        sw_router_stats_get(r, &rs);
        sw_ingress_stats_get(ing, &is);
        snprintf(want, sizeof(want),
                 "streamwire_frontend_auth_failures_total{router=\"%s\"} %llu\n", sw_router_id(r),
                 (unsigned long long)rs.auth_failures);
        if (strstr(text, want) == NULL)
            fail_msg("no line %s", want);
        snprintf(want, sizeof(want), "} %llu\n", (unsigned long long)is.auth_failures);
        assert_non_null(strstr(text, "streamwire_worker_auth_failures_total{"));
        assert_non_null(strstr(strstr(text, "streamwire_worker_auth_failures_total{"), want));
        assert_non_null(strstr(text, "streamwire_worker_replays_total{"));
        free(text);
        sw_metrics_destroy(m);
    }

    natsConnection_Destroy(nc);
    sw_router_destroy(r);
    sw_ingress_destroy(ing);
    sw_conn_close(fc);
    sw_conn_close(wc);
}

/* Publishes what looks like the server's "no responders" status: an empty
 * message with the header "Status: 503", on subj with reply subject reply. */
static void
forged_503(natsConnection *nc, const char *subj, const char *reply)
{
    natsMsg *m = NULL;
    assert_int_equal(natsMsg_Create(&m, subj, reply, NULL, 0), NATS_OK);
    assert_int_equal(natsMsgHeader_Set(m, "Status", "503"), NATS_OK);
    assert_int_equal(natsConnection_PublishMsg(nc, m), NATS_OK);
    natsMsg_Destroy(m);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
}

/* The worker's auth_failures, once it reaches want (or after 3 s). */
static uint64_t
worker_auth_failures(sw_ingress *ing, uint64_t want)
{
    sw_ingress_stats is;
    for (int i = 0; i < 300 * swh_slow(); i++) {
        sw_ingress_stats_get(ing, &is);
        if (is.auth_failures >= want)
            break;
        swh_sleep_ms(10);
    }
    return is.auth_failures;
}

/* "No responders" is a NATS status, never sealed: anyone may forge one. As
 * a request to a sealed worker (nr2), with the response subject of another
 * router's live stream (on nr1) as its reply subject, it was answered with
 * a final sealed by the worker (the empty body did not decode), which ended
 * that stream. A sealing connection takes the status only where the server
 * can send one (reply subjects); on a request subject it is refused and
 * counted (auth_failed), and never answered: the victim completes with its
 * items. The same on a control subject, and on a router's probe subject,
 * where the router answered the forgery with a sealed ProbeReply on the
 * subject the sender chose. */
static void
forged_no_responders_refused(void **state)
{
    sw_conn *wc1 = conn_open(g_key1), *wc2 = conn_open(g_key1), *fc = conn_open(g_key1);
    engine e1 = {3, 0, PTHREAD_MUTEX_INITIALIZER, 0, 0, 1500}; /* 1.5 s before its first item */
    engine e2 = {3, 0, PTHREAD_MUTEX_INITIALIZER, 0, 0, 0};
    sw_ingress *ing1 = worker(wc1, "nr1", &e1), *ing2 = worker(wc2, "nr2", &e2);
    sw_router *r = router(fc);
    natsConnection *nc = raw_conn();
    natsSubscription *spy = NULL;
    capture cap;
    char victim[SWT_SUBJECT_MAX], subj[SWT_SUBJECT_MAX], reply[SWT_SUBJECT_MAX];
    sw_stream *s;
    sw_terminal t;
    char reason[64];
    sw_router_stats rs;
    uint64_t failures;
    int n;
    (void)state;
    memset(&cap, 0, sizeof(cap));
    pthread_mutex_init(&cap.mu, NULL);
    s = open_stream(r, "nr1", "n=3");
    assert_int_equal(
        swt_subject_response(victim, sizeof(victim), sw_router_id(r), sw_stream_request_id(s)),
        SW_OK);
    for (int i = 0; i < 300 * swh_slow(); i++) { /* the victim's handler runs (and waits) */
        pthread_mutex_lock(&e1.mu);
        n = e1.served;
        pthread_mutex_unlock(&e1.mu);
        if (n == 1)
            break;
        swh_sleep_ms(10);
    }
    assert_int_equal(n, 1);
    assert_int_equal(swt_subject_request(subj, sizeof(subj), EP, "nr2"), SW_OK);
    forged_503(nc, subj, victim);
    n = drain(s, &t, reason, sizeof(reason));
    failures = worker_auth_failures(ing2, 1);
    print_message("    victim on nr1: %d items, %s; nr2 auth_failures %llu\n", n, reason,
                  (unsigned long long)failures);
    assert_int_equal(t.status, SW_STATUS_COMPLETED);
    assert_int_equal(n, 3);
    assert_int_equal(failures, 1);
    assert_int_equal(e2.served, 0);
    sw_stream_close(s);
    /* on the worker's control subject */
    assert_int_equal(swt_subject_control(subj, sizeof(subj), "nr2"), SW_OK);
    forged_503(nc, subj, NULL);
    assert_int_equal(worker_auth_failures(ing2, 2), 2);
    /* on the router's probe subject, with a worker's probe-answer subject
     * as the reply: no answer goes there */
    assert_int_equal(swt_subject_live_reply(reply, sizeof(reply), "nr2", sw_router_id(r)), SW_OK);
    assert_int_equal(natsConnection_Subscribe(&spy, nc, reply, on_capture, &cap), NATS_OK);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    assert_int_equal(swt_subject_router(subj, sizeof(subj), sw_router_id(r)), SW_OK);
    forged_503(nc, subj, reply);
    for (int i = 0; i < 300 * swh_slow(); i++) {
        sw_router_stats_get(r, &rs);
        if (rs.auth_failures >= 1)
            break;
        swh_sleep_ms(10);
    }
    swh_sleep_ms(100); /* (an answer would be on its way by now) */
    natsSubscription_Unsubscribe(spy);
    natsSubscription_Destroy(spy);
    assert_int_equal(rs.auth_failures, 1);
    assert_int_equal(cap.n, 0);
    natsConnection_Destroy(nc);
    sw_router_destroy(r);
    sw_ingress_destroy(ing1);
    sw_ingress_destroy(ing2);
    sw_conn_close(fc);
    sw_conn_close(wc1);
    sw_conn_close(wc2);
    pthread_mutex_destroy(&cap.mu);
}

/* The first message on the subscription whose reply subject starts with
 * sw.prb. (a router's probe of an instance), recorded. */
typedef struct probe_rec {
    pthread_mutex_t mu;
    uint8_t msg[1024];
    size_t len;
} probe_rec;

static void
on_probe(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *arg)
{
    probe_rec *p = arg;
    const char *reply = natsMsg_GetReply(m);
    (void)nc;
    (void)sub;
    pthread_mutex_lock(&p->mu);
    if (p->len == 0 && reply != NULL && strncmp(reply, "sw.prb.", 7) == 0 &&
        (size_t)natsMsg_GetDataLength(m) <= sizeof(p->msg)) {
        memcpy(p->msg, natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m));
        p->len = (size_t)natsMsg_GetDataLength(m);
    }
    pthread_mutex_unlock(&p->mu);
    natsMsg_Destroy(m);
}

/* A router's sealed PROBE, recorded on the bus and published again with a
 * live stream's response subject as its reply (the reply subject is not
 * sealed): the worker answered it there with a ProbeReply sealed by it,
 * which ended the stream (decode_error). It now answers a probe only on
 * sw.prb.<router_id>.<instance> (the router id is in the sealed plaintext),
 * counts the other in bad_controls, and the stream completes. */
static void
replayed_probe_not_answered_on_a_stream(void **state)
{
    sw_conn *wc = conn_open(g_key1), *fc = conn_open(g_key1);
    engine e = {30, 20, PTHREAD_MUTEX_INITIALIZER, 0, 0, 0};
    sw_ingress *ing = worker(wc, "pr1", &e);
    sw_router *r = router(fc);
    natsConnection *nc = raw_conn();
    natsSubscription *spy = NULL;
    probe_rec rec;
    char victim[SWT_SUBJECT_MAX], ctl[SWT_SUBJECT_MAX], reason[64];
    sw_ingress_stats st;
    sw_terminal t;
    sw_stream *s;
    size_t len = 0;
    int n;
    (void)state;
    memset(&rec, 0, sizeof(rec));
    pthread_mutex_init(&rec.mu, NULL);
    assert_int_equal(swt_subject_control(ctl, sizeof(ctl), "pr1"), SW_OK);
    assert_int_equal(natsConnection_Subscribe(&spy, nc, ctl, on_probe, &rec), NATS_OK);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    s = open_stream(r, "pr1", "n=30");
    assert_int_equal(
        swt_subject_response(victim, sizeof(victim), sw_router_id(r), sw_stream_request_id(s)),
        SW_OK);
    for (int i = 0; i < 300 * swh_slow() && len == 0; i++) { /* probes go every 100 ms */
        swh_sleep_ms(10);
        pthread_mutex_lock(&rec.mu);
        len = rec.len;
        pthread_mutex_unlock(&rec.mu);
    }
    natsSubscription_Unsubscribe(spy);
    natsSubscription_Destroy(spy);
    assert_true(len > 0);
    pthread_mutex_lock(&e.mu);
    n = e.served; /* (its handler runs: 30 items, 20 ms apart) */
    pthread_mutex_unlock(&e.mu);
    assert_int_equal(n, 1);
    assert_int_equal(natsConnection_PublishRequest(nc, ctl, victim, rec.msg, (int)len), NATS_OK);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    n = drain(s, &t, reason, sizeof(reason));
    for (int i = 0; i < 300 * swh_slow(); i++) {
        sw_ingress_stats_get(ing, &st);
        if (st.bad_controls >= 1)
            break;
        swh_sleep_ms(10);
    }
    print_message("    victim: %d items, %s %s; worker bad_controls %llu, auth_failures %llu\n", n,
                  sw_status_name(t.status), reason, (unsigned long long)st.bad_controls,
                  (unsigned long long)st.auth_failures);
    assert_int_equal(t.status, SW_STATUS_COMPLETED);
    assert_int_equal(n, 30);
    assert_int_equal(st.bad_controls, 1);
    assert_int_equal(st.auth_failures, 0);
    sw_stream_close(s);
    natsConnection_Destroy(nc);
    sw_router_destroy(r);
    sw_ingress_destroy(ing);
    sw_conn_close(fc);
    sw_conn_close(wc);
    pthread_mutex_destroy(&rec.mu);
}

/* Unsealed junk published on a sealed worker's request subject, with the
 * response subject of another router's live stream as its reply: the
 * worker refuses it and answers a plain auth_failed final there (the
 * diagnostic for a frontend whose sealing differs), and the router that
 * owns the stream ended it with auth_failed. Anyone who may publish a
 * request (a frontend credential) could so end any stream. Now a plain
 * message on a stream whose worker has answered sealed is dropped and
 * counted (auth_failures): the victim completes with all its items. Before
 * the worker's first item the plain final still ends the stream (the
 * window SECURITY.md describes): the second stream, whose worker waits
 * 1.5 s before its first item, ends auth_failed with nothing. */
static void
unsealed_junk_request_does_not_end_a_stream(void **state)
{
    sw_conn *wc1 = conn_open(g_key1), *wc2 = conn_open(g_key1), *fc = conn_open(g_key1);
    engine e1 = {30, 20, PTHREAD_MUTEX_INITIALIZER, 0, 0, 0};
    engine e2 = {3, 0, PTHREAD_MUTEX_INITIALIZER, 0, 0, 1500};
    sw_ingress *ing1 = worker(wc1, "uj1", &e1), *ing2 = worker(wc2, "uj2", &e2);
    sw_router *r = router(fc);
    natsConnection *nc = raw_conn();
    static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0x02, 0x17};
    char victim[SWT_SUBJECT_MAX], subj[SWT_SUBJECT_MAX];
    const sw_item *it;
    sw_stream *s;
    sw_router_stats rs;
    sw_terminal t;
    char reason[64];
    int n = 0, served = 0;
    (void)state;
    s = open_stream(r, "uj1", "n=30");
    assert_int_equal(
        swt_subject_response(victim, sizeof(victim), sw_router_id(r), sw_stream_request_id(s)),
        SW_OK);
    /* the victim has taken a sealed item */
    assert_int_equal(sw_stream_next(s, &it, T(5000)), SW_OK);
    assert_int_equal(it->kind, SW_ITEM_DATA);
    assert_int_equal(it->len, 7);
    assert_memory_equal(it->data, "token-0", 7);
    n = 1;
    assert_int_equal(swt_subject_request(subj, sizeof(subj), EP, "uj2"), SW_OK);
    assert_int_equal(natsConnection_PublishRequest(nc, subj, victim, junk, (int)sizeof(junk)),
                     NATS_OK);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    assert_int_equal(worker_auth_failures(ing2, 1), 1); /* refused, and answered plain */
    for (;;) {
        char want[32];
        int k;
        assert_int_equal(sw_stream_next(s, &it, T(15000)), SW_OK);
        if (it->kind == SW_ITEM_TERMINAL)
            break;
        k = snprintf(want, sizeof(want), "token-%d", n++);
        assert_int_equal(it->len, (size_t)k);
        assert_memory_equal(it->data, want, (size_t)k);
    }
    print_message("    victim: %d items, %s\n", n, it->terminal.reason);
    assert_int_equal(it->terminal.status, SW_STATUS_COMPLETED);
    assert_int_equal(n, 30);
    sw_router_stats_get(r, &rs);
    assert_int_equal(rs.auth_failures, 1); /* the plain final, dropped */
    assert_int_equal(e2.served, 0);
    sw_stream_close(s);

    /* before the worker's first item: the plain final ends the stream */
    s = open_stream(r, "uj2", "n=3");
    assert_int_equal(
        swt_subject_response(victim, sizeof(victim), sw_router_id(r), sw_stream_request_id(s)),
        SW_OK);
    for (int i = 0; i < 300 * swh_slow() && served == 0; i++) { /* its handler waits */
        pthread_mutex_lock(&e2.mu);
        served = e2.served;
        pthread_mutex_unlock(&e2.mu);
        if (served == 0)
            swh_sleep_ms(10);
    }
    assert_int_equal(served, 1);
    assert_int_equal(swt_subject_request(subj, sizeof(subj), EP, "uj1"), SW_OK);
    assert_int_equal(natsConnection_PublishRequest(nc, subj, victim, junk, (int)sizeof(junk)),
                     NATS_OK);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    assert_int_equal(drain(s, &t, reason, sizeof(reason)), 0);
    assert_int_equal(t.status, SW_STATUS_ERROR);
    assert_int_equal(t.error, SW_AUTH_FAILED);
    assert_int_equal(worker_auth_failures(ing1, 1), 1);
    sw_router_stats_get(r, &rs);
    assert_int_equal(rs.auth_failures, 2);
    sw_stream_close(s);
    natsConnection_Destroy(nc);
    sw_router_destroy(r);
    sw_ingress_destroy(ing1);
    sw_ingress_destroy(ing2);
    sw_conn_close(fc);
    sw_conn_close(wc1);
    sw_conn_close(wc2);
}

/* A worker's liveness probe of a router (sw.rtr.<router>), recorded on the
 * bus and published again with a reply subject of the attacker's choice:
 * it opens (sealed for that subject), and the router answered with a
 * sealed ProbeReply on whatever reply subject it named, a live stream's
 * response subject among them (the same reflection as a worker answering
 * PROBEs anywhere). The router now answers only on the protocol's reply
 * subject for it, sw.lv.<instance>.<its own id>: nothing reaches another
 * reply subject, the victim completes with all its items, and the replay
 * with the right reply subject is still answered. */
static void
replayed_live_probe_answered_only_on_its_subject(void **state)
{
    sw_conn *wc = conn_open(g_key1), *fc = conn_open(g_key1);
    engine e = {40, 25, PTHREAD_MUTEX_INITIALIZER, 0, 0, 0};
    sw_ingress *ing = worker(wc, "lp1", &e);
    sw_router *r = router(fc);
    natsConnection *nc = raw_conn();
    natsSubscription *rec = NULL, *spy = NULL, *lv = NULL;
    capture probes, seen, answers;
    char rtr[SWT_SUBJECT_MAX], victim[SWT_SUBJECT_MAX], other[SWT_SUBJECT_MAX];
    char good[SWT_SUBJECT_MAX], wrong[SWT_SUBJECT_MAX];
    sw_stream *s;
    sw_terminal t;
    char reason[64];
    int n;
    (void)state;
    memset(&probes, 0, sizeof(probes));
    memset(&seen, 0, sizeof(seen));
    memset(&answers, 0, sizeof(answers));
    pthread_mutex_init(&probes.mu, NULL);
    pthread_mutex_init(&seen.mu, NULL);
    pthread_mutex_init(&answers.mu, NULL);
    assert_int_equal(swt_subject_router(rtr, sizeof(rtr), sw_router_id(r)), SW_OK);
    assert_int_equal(natsConnection_Subscribe(&rec, nc, rtr, on_capture, &probes), NATS_OK);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    s = open_stream(r, "lp1", "n=40"); /* 1 s of items: the worker probes the router */
    assert_int_equal(
        swt_subject_response(victim, sizeof(victim), sw_router_id(r), sw_stream_request_id(s)),
        SW_OK);
    for (int i = 0; i < 300 * swh_slow(); i++) {
        pthread_mutex_lock(&probes.mu);
        n = probes.n;
        pthread_mutex_unlock(&probes.mu);
        if (n >= 1)
            break;
        swh_sleep_ms(10);
    }
    natsSubscription_Unsubscribe(rec);
    natsSubscription_Destroy(rec);
    assert_true(probes.n >= 1);
    /* another reply subject the attacker reads: a response subject of no
     * stream, a made-up one, the worker's reply subject with another
     * router's id, and the victim's own */
    assert_int_equal(swt_subject_response(other, sizeof(other), sw_router_id(r),
                                          "00112233445566778899aabbccddeeff"),
                     SW_OK);
    assert_int_equal(swt_subject_live_reply(wrong, sizeof(wrong), "lp1", "another-router"), SW_OK);
    assert_int_equal(natsConnection_Subscribe(&spy, nc, other, on_capture, &seen), NATS_OK);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    {
        const char *replies[] = {other, "attacker.inbox", wrong, victim};
        for (size_t k = 0; k < sizeof(replies) / sizeof(replies[0]); k++)
            assert_int_equal(natsConnection_PublishRequest(nc, rtr, replies[k], probes.msgs[0],
                                                           (int)probes.lens[0]),
                             NATS_OK);
        assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    }
    n = drain(s, &t, reason, sizeof(reason));
    print_message("    victim: %d items, %s; answers on another stream's subject: %d\n", n, reason,
                  seen.n);
    assert_int_equal(t.status, SW_STATUS_COMPLETED);
    assert_int_equal(n, 40);
    {
        sw_router_stats rs;
        sw_router_stats_get(r, &rs);
        assert_int_equal(rs.bad_messages, 4); /* the four probes, unanswered */
    }
    swh_sleep_ms(100); /* (an answer on `other` would be there by now) */
    natsSubscription_Unsubscribe(spy);
    natsSubscription_Destroy(spy);
    assert_int_equal(seen.n, 0);
    sw_stream_close(s);
    /* the protocol's reply subject is still answered (the worker has its
     * own subscription there too; ours sees the same answer) */
    assert_int_equal(swt_subject_live_reply(good, sizeof(good), "lp1", sw_router_id(r)), SW_OK);
    assert_int_equal(natsConnection_Subscribe(&lv, nc, good, on_capture, &answers), NATS_OK);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    assert_int_equal(
        natsConnection_PublishRequest(nc, rtr, good, probes.msgs[0], (int)probes.lens[0]), NATS_OK);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    for (int i = 0; i < 300 * swh_slow(); i++) {
        pthread_mutex_lock(&answers.mu);
        n = answers.n;
        pthread_mutex_unlock(&answers.mu);
        if (n >= 1)
            break;
        swh_sleep_ms(10);
    }
    natsSubscription_Unsubscribe(lv);
    natsSubscription_Destroy(lv);
    assert_true(answers.n >= 1);
    natsConnection_Destroy(nc);
    sw_router_destroy(r);
    sw_ingress_destroy(ing);
    sw_conn_close(fc);
    sw_conn_close(wc);
    pthread_mutex_destroy(&probes.mu);
    pthread_mutex_destroy(&seen.mu);
    pthread_mutex_destroy(&answers.mu);
}

/* Forged probe answers (unsealed) and the worker's own earlier answers
 * (recorded, sealed) replayed for a worker that froze: the router still
 * declares it lost, by its probes' timeouts (a sealed cluster takes no
 * unsealed "no responders" shortcut, and an answer must echo the current
 * probe's id). */
typedef struct spammer {
    natsConnection *nc;
    char subj[SWT_SUBJECT_MAX];
    uint8_t buf[128];
    size_t len;
    capture *rec; /* recorded (sealed) answers, replayed in turn */
    int stop;     /* atomic */
    int sent;
} spammer;

static void *
spam_main(void *arg)
{
    spammer *sp = arg;
    while (!__atomic_load_n(&sp->stop, __ATOMIC_ACQUIRE)) {
        (void)natsConnection_Publish(sp->nc, sp->subj, sp->buf, (int)sp->len);
        if (sp->rec != NULL && sp->rec->n > 0) {
            int k = sp->sent % sp->rec->n;
            (void)natsConnection_Publish(sp->nc, sp->subj, sp->rec->msgs[k], (int)sp->rec->lens[k]);
        }
        sp->sent++;
        swh_sleep_ms(5);
    }
    return NULL;
}

static void
forged_probe_answers_do_not_hide_a_loss(void **state)
{
    sw_conn *fc = conn_open(g_key1);
    const char *argv[] = {"worker",   "--server",
                          g_nats.url, "--endpoint",
                          EP,         "--instance-id",
                          "pw1",      "--tokens",
                          "100000",   "--token-interval-ms",
                          "10",       "--registry",
                          "none",     "--key-file",
                          g_key1,     "--quiet",
                          NULL};
    int wfd = -1;
    pid_t wpid = swh_spawn(argv, &wfd);
    sw_router *r = router(fc);
    spammer sp;
    pthread_t th;
    char subj[SWT_SUBJECT_MAX];
    uint8_t id[16];
    sw_stream *s;
    swp_probe_reply p = STREAMWIRE__V1__PROBE_REPLY__INIT;
    const sw_item *it = NULL;
    int64_t t0;
    sw_router_stats rs;
    (void)state;
    assert_true(wpid > 0);
    assert_int_equal(swh_wait_line(wfd, "worker ready", NULL, 0, (int)T(10000)), 0);
    s = slow_stream(r, "pw1", subj, sizeof(subj), id);
    memset(&sp, 0, sizeof(sp));
    sp.nc = raw_conn();
    assert_int_equal(swt_subject_probe_reply(sp.subj, sizeof(sp.subj), sw_router_id(r), "pw1"),
                     SW_OK);
    p.version = SW_PROTOCOL_VERSION;
    p.instance_id = (char *)"pw1";
    assert_int_equal(swp_encode(&p, sp.buf, sizeof(sp.buf), &sp.len), SW_OK);
    {
        /* record the worker's own sealed answers to this router's probes
         * while it is healthy: replayed later, they must not count (each
         * answers an older probe id) */
        static capture rec;
        natsSubscription *spy = NULL;
        memset(&rec, 0, sizeof(rec));
        pthread_mutex_init(&rec.mu, NULL);
        assert_int_equal(natsConnection_Subscribe(&spy, sp.nc, sp.subj, on_capture, &rec), NATS_OK);
        assert_int_equal(natsConnection_Flush(sp.nc), NATS_OK);
        for (int i = 0; i < 5 * 300 * swh_slow(); i++) {
            int n;
            pthread_mutex_lock(&rec.mu);
            n = rec.n;
            pthread_mutex_unlock(&rec.mu);
            if (n >= 3)
                break;
            swh_sleep_ms(10);
        }
        natsSubscription_Unsubscribe(spy);
        natsSubscription_Destroy(spy);
        assert_true(rec.n >= 3);
        sp.rec = &rec;
    }
    assert_int_equal(pthread_create(&th, NULL, spam_main, &sp), 0);
    /* the worker freezes: nothing more from it, its subscriptions stay
     * (so only probe timeouts can tell), and the attacker answers every
     * probe for it */
    t0 = swi_now_ms();
    swh_kill(wpid, SIGSTOP);
    do
        assert_int_not_equal(sw_stream_next(s, &it, 20), SW_EINVAL);
    while ((it == NULL || it->kind != SW_ITEM_TERMINAL) && swi_now_ms() - t0 < T(10000));
    __atomic_store_n(&sp.stop, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    assert_non_null(it);
    assert_int_equal(it->kind, SW_ITEM_TERMINAL);
    assert_int_equal(it->terminal.status, SW_STATUS_ERROR);
    assert_string_equal(it->terminal.reason, "instance_lost");
    sw_router_stats_get(r, &rs);
    assert_true(rs.auth_failures > 0); /* the forged answers, refused */
    print_message("    frozen worker -> instance_lost in %lld ms despite %d forged and as many "
                  "replayed answers\n",
                  (long long)(swi_now_ms() - t0), sp.sent);
    sw_stream_close(s);
    swh_kill(wpid, SIGCONT);
    swh_terminate(wpid, 5000);
    close(wfd);
    natsConnection_Destroy(sp.nc);
    sw_router_destroy(r);
    sw_conn_close(fc);
}

/* A sealed item of a live stream, recorded on the bus and replayed on its
 * own subject every 100 ms after the worker froze: it opens, and is
 * dropped as a duplicate of a delivered position, and it is no sign of
 * life: the router still declares the worker lost by its probes' timeouts.
 * Every item that opened used to count as the stream's activity, which
 * also excused the instance's unanswered probes: the stream never ended. */
static void
replayed_items_do_not_hide_a_loss(void **state)
{
    sw_conn *fc = conn_open(g_key1);
    const char *argv[] = {"worker",   "--server",
                          g_nats.url, "--endpoint",
                          EP,         "--instance-id",
                          "rw1",      "--tokens",
                          "100000",   "--token-interval-ms",
                          "10",       "--registry",
                          "none",     "--key-file",
                          g_key1,     "--quiet",
                          NULL};
    int wfd = -1;
    pid_t wpid = swh_spawn(argv, &wfd);
    sw_router *r = router(fc);
    static capture rec;
    natsConnection *nc = raw_conn();
    natsSubscription *spy = NULL;
    char subj[SWT_SUBJECT_MAX];
    uint8_t id[16];
    sw_stream *s;
    const sw_item *it = NULL;
    int64_t t0, took;
    int sent = 0, ndata = 0, n = 0;
    sw_stream_stats ss;
    sw_router_stats rs;
    (void)state;
    assert_true(wpid > 0);
    assert_int_equal(swh_wait_line(wfd, "worker ready", NULL, 0, (int)T(10000)), 0);
    s = slow_stream(r, "rw1", subj, sizeof(subj), id);
    memset(&rec, 0, sizeof(rec));
    pthread_mutex_init(&rec.mu, NULL);
    assert_int_equal(natsConnection_Subscribe(&spy, nc, subj, on_capture, &rec), NATS_OK);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    for (int i = 0; i < 5 * 300 * swh_slow() && n < 3; i++) {
        swh_sleep_ms(10);
        pthread_mutex_lock(&rec.mu);
        n = rec.n;
        pthread_mutex_unlock(&rec.mu);
    }
    natsSubscription_Unsubscribe(spy);
    natsSubscription_Destroy(spy);
    assert_true(rec.n >= 3);
    assert_true(swt_env_is_sealed(rec.msgs[0], rec.lens[0]));
    /* the worker freezes: nothing more from it, its subscriptions stay (so
     * only probe timeouts can tell); the attacker replays one of its items */
    swh_kill(wpid, SIGSTOP);
    t0 = swi_now_ms();
    for (;;) {
        sw_err rv;
        if (swi_now_ms() - t0 >= 100 * (int64_t)sent) {
            assert_int_equal(natsConnection_Publish(nc, subj, rec.msgs[0], (int)rec.lens[0]),
                             NATS_OK);
            sent++;
        }
        rv = sw_stream_next(s, &it, 50);
        if (rv == SW_OK && it->kind == SW_ITEM_TERMINAL)
            break;
        assert_true(rv == SW_OK || rv == SW_ETIMEDOUT);
        ndata += rv == SW_OK;
        if (swi_now_ms() - t0 > T(10000))
            fail_msg("no terminal 10 s after the worker froze (%d replays)", sent);
    }
    took = swi_now_ms() - t0;
    sw_stream_stats_get(s, &ss);
    sw_router_stats_get(r, &rs);
    print_message("    frozen worker, %d replays: %s after %lld ms (duplicates %llu, data items "
                  "after the freeze %d)\n",
                  sent, it->terminal.reason, (long long)took, (unsigned long long)ss.duplicates,
                  ndata);
    assert_int_equal(it->terminal.status, SW_STATUS_ERROR);
    assert_string_equal(it->terminal.reason, "instance_lost");
    assert_true(took < T(2000));
    assert_true(ss.duplicates >= 1);       /* the replays opened and reached the stream ... */
    assert_int_equal(rs.auth_failures, 0); /* ... none was refused by sealing */
    sw_stream_close(s);
    swh_kill(wpid, SIGCONT);
    swh_terminate(wpid, 5000);
    close(wfd);
    natsConnection_Destroy(nc);
    sw_router_destroy(r);
    sw_conn_close(fc);
    pthread_mutex_destroy(&rec.mu);
}

/* The same with a heartbeat: a stream whose consumer stopped taking items
 * runs out of credit, and its worker says so in a heartbeat wrapper of its
 * own on the stream's subject (a stalled beat is never in a batch). One of
 * those, recorded and replayed every 100 ms after the worker froze, opens
 * (the stream's key and subject), but names a counter the router has taken
 * already: it is refused (unknown_stream), and the worker is declared lost
 * by its probes' timeouts. Without the counter every replay counted as the
 * stream's heartbeat, and as its instance's activity: no terminal at all. */
static void
replayed_stalled_heartbeats_do_not_hide_a_loss(void **state)
{
    sw_conn *fc = conn_open(g_key1);
    const char *argv[] = {"worker",        "--server",   g_nats.url, "--endpoint", EP,
                          "--instance-id", "sh1",        "--tokens", "100000",     "--registry",
                          "none",          "--key-file", g_key1,     "--quiet",    NULL};
    int wfd = -1;
    pid_t wpid = swh_spawn(argv, &wfd);
    sw_router_opts ro;
    sw_router *r = NULL;
    sw_request_opts q;
    static capture rec;
    natsConnection *nc = raw_conn();
    natsSubscription *spy = NULL;
    swt_sealer *ks = NULL;
    char subj[SWT_SUBJECT_MAX], why[SWT_SEAL_WHY_MAX];
    sw_stream *s = NULL;
    const sw_item *it = NULL;
    int64_t t0, took;
    int sent = 0, beat = -1;
    sw_stream_stats ss;
    sw_router_stats rs0, rs;
    (void)state;
    assert_true(wpid > 0);
    assert_int_equal(swh_wait_line(wfd, "worker ready", NULL, 0, (int)T(10000)), 0);
    sw_router_opts_init(&ro);
    ro.heartbeat_ms = 100;
    ro.inactivity_ms = 5000; /* (so that only the probes can end the stream) */
    assert_int_equal(sw_router_create(&r, fc, &ro), SW_OK);
    sw_request_opts_init(&q);
    q.endpoint = EP;
    q.instance_id = "sh1";
    q.credit_window = 8;
    memset(&rec, 0, sizeof(rec));
    pthread_mutex_init(&rec.mu, NULL);
    assert_int_equal(sw_router_open(&s, r, &q, "x", 1), SW_OK);
    assert_int_equal(
        swt_subject_response(subj, sizeof(subj), sw_router_id(r), sw_stream_request_id(s)), SW_OK);
    assert_int_equal(natsConnection_Subscribe(&spy, nc, subj, on_capture, &rec), NATS_OK);
    assert_int_equal(natsConnection_Flush(nc), NATS_OK);
    assert_int_equal(sw_stream_next(s, &it, T(5000)), SW_OK);
    assert_int_equal(it->kind, SW_ITEM_DATA);
    /* the consumer takes nothing more: the worker stalls and beats; find a
     * stalled heartbeat among what the spy recorded */
    assert_int_equal(swt_sealer_load(&ks, g_key1, NULL, why, sizeof(why)), SW_OK);
    memset(&ss, 0, sizeof(ss));
    for (int i = 0, seen = 0; i < 5 * 300 * swh_slow() && beat < 0; i++) {
        int n;
        swh_sleep_ms(10);
        pthread_mutex_lock(&rec.mu);
        n = rec.n;
        pthread_mutex_unlock(&rec.mu);
        for (; seen < n && beat < 0; seen++) {
            uint8_t pt[1024];
            size_t plen = 0;
            swp_item *w = NULL;
            if (swt_env_open(ks, subj, rec.msgs[seen], rec.lens[seen], pt, sizeof(pt), &plen) !=
                    SW_OK ||
                swp_decode_item(pt, plen, sizeof(pt), &w) != SW_OK)
                fail_msg("message %d on the stream's subject does not open", seen);
            if (w->body_case == STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_HEARTBEAT &&
                w->heartbeat->stalled)
                beat = seen;
            swp_free(w);
        }
    }
    natsSubscription_Unsubscribe(spy);
    natsSubscription_Destroy(spy);
    swt_sealer_free(ks);
    assert_true(beat >= 0);
    for (int i = 0; i < 300 * swh_slow() && ss.heartbeats < 2; i++) {
        swh_sleep_ms(10);
        sw_stream_stats_get(s, &ss);
    }
    assert_true(ss.heartbeats >= 2); /* the worker's own stalled beats count */
    sw_router_stats_get(r, &rs0);
    /* the worker freezes; the attacker replays the beat */
    swh_kill(wpid, SIGSTOP);
    t0 = swi_now_ms();
    for (;;) {
        sw_err rv;
        if (swi_now_ms() - t0 >= 100 * (int64_t)sent) {
            assert_int_equal(natsConnection_Publish(nc, subj, rec.msgs[beat], (int)rec.lens[beat]),
                             NATS_OK);
            sent++;
        }
        rv = sw_stream_next(s, &it, 50);
        if (rv == SW_OK && it->kind == SW_ITEM_TERMINAL)
            break;
        assert_true(rv == SW_OK || rv == SW_ETIMEDOUT);
        if (swi_now_ms() - t0 > T(10000))
            fail_msg("no terminal 10 s after the worker froze (%d replays)", sent);
    }
    took = swi_now_ms() - t0;
    sw_router_stats_get(r, &rs);
    print_message("    frozen worker, stalled stream, %d replayed heartbeats: %s after %lld ms "
                  "(unknown_stream +%llu)\n",
                  sent, it->terminal.reason, (long long)took,
                  (unsigned long long)(rs.unknown_stream - rs0.unknown_stream));
    assert_int_equal(it->terminal.status, SW_STATUS_ERROR);
    assert_string_equal(it->terminal.reason, "instance_lost");
    assert_true(took < T(2000));
    assert_true(rs.unknown_stream > rs0.unknown_stream); /* the replays, refused ... */
    assert_int_equal(rs.auth_failures, 0);               /* ... after they opened */
    sw_stream_close(s);
    swh_kill(wpid, SIGCONT);
    swh_terminate(wpid, 5000);
    close(wfd);
    natsConnection_Destroy(nc);
    sw_router_destroy(r);
    sw_conn_close(fc);
    pthread_mutex_destroy(&rec.mu);
}

/* The registry of a sealed cluster: entries and tombstones are sealed under
 * their key. A sealed router sees sealed workers only; a forged (unsealed)
 * entry is not an instance; a forged tombstone for a live worker evicts
 * nothing; an unsealed router sees no sealed worker. */
static size_t
listed(sw_registry *reg, const char *want)
{
    sw_instance *v = NULL;
    size_t n = 0, hits = 0;
    assert_int_equal(sw_registry_list(reg, EP, &v, &n), SW_OK);
    for (size_t i = 0; i < n; i++)
        if (want == NULL || strcmp(v[i].instance_id, want) == 0)
            hits++;
    sw_instances_free(v, n);
    return hits;
}

static void
kv_put_raw(const char *key, const void *val, size_t len)
{
    natsConnection *nc = raw_conn();
    jsCtx *js = NULL;
    kvStore *kv = NULL;
    uint64_t rev = 0;
    assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    assert_int_equal(js_KeyValue(&kv, js, "sw_sealed_reg"), NATS_OK);
    assert_int_equal(kvStore_Put(&rev, kv, key, val, (int)len), NATS_OK);
    kvStore_Destroy(kv);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
}

/* The timing taps on sealing connections (transport/sw_transport.h): the
 * publisher's tap sees the bytes as they go out, sealed; the receiver's
 * sees the same sealed bytes, before they are opened; the subscription's
 * callback gets the plaintext. */
typedef struct sealtap {
    pthread_mutex_t mu;
    int n;
    swt_tap_point at[4];
    size_t len[4];
    uint8_t bytes[4][256];
} sealtap;

static void
sealtap_rec(void *arg, swt_tap_point at, const uint8_t *data, size_t len)
{
    sealtap *t = arg;
    pthread_mutex_lock(&t->mu);
    if (t->n < 4) {
        t->at[t->n] = at;
        t->len[t->n] = len;
        memcpy(t->bytes[t->n], data, len < 256 ? len : 256);
    }
    t->n++;
    pthread_mutex_unlock(&t->mu);
}

typedef struct sealtap_sub {
    atomic_int calls;
    size_t len;
    uint8_t text[64];
} sealtap_sub;

static void
sealtap_cb(const swt_msg *m, void *arg)
{
    sealtap_sub *k = arg;
    if (!m->auth_failed && m->len < sizeof(k->text)) {
        memcpy(k->text, m->data, m->len);
        k->len = m->len;
    }
    atomic_fetch_add(&k->calls, 1);
}

static void
taps_see_sealed_bytes(void **state)
{
    /* a wrapper (the envelope seals protobuf only): request_id (field 2),
     * the subject's id; data (field 4) "hello" */
    static const uint8_t msg[] = {0x12, 0x10, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd,
                                  0xef, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef,
                                  0x22, 0x05, 'h',  'e',  'l',  'l',  'o'};
    static const char hello[] = "hello";
    sw_conn *pub = conn_open(g_key1), *rx = conn_open(g_key1);
    swt_sub *sub = NULL;
    sealtap tp, tr;
    sealtap_sub k;
    char subj[SWT_SUBJECT_MAX];
    (void)state;
    /* a response subject: the envelope binds a subject of ours */
    assert_int_equal(
        swt_subject_response(subj, sizeof(subj), "taprouter", "0123456789abcdef0123456789abcdef"),
        SW_OK);
    memset(&tp, 0, sizeof(tp));
    memset(&tr, 0, sizeof(tr));
    memset(&k, 0, sizeof(k));
    pthread_mutex_init(&tp.mu, NULL);
    pthread_mutex_init(&tr.mu, NULL);
    assert_int_equal(swt_subscribe(rx, &sub, subj, sealtap_cb, &k), SW_OK);
    assert_int_equal(swt_flush(rx, T(2000)), SW_OK);
    swt_conn_set_tap(pub, sealtap_rec, &tp);
    swt_conn_set_tap(rx, sealtap_rec, &tr);
    assert_int_equal(swt_publish(pub, subj, NULL, msg, sizeof(msg)), SW_OK);
    assert_int_equal(swt_flush(pub, T(2000)), SW_OK);
    for (int64_t until = swh_now_ms() + T(5000); atomic_load(&k.calls) < 1;) {
        assert_true(swh_now_ms() < until);
        swh_sleep_ms(2);
    }
    swt_conn_set_tap(pub, NULL, NULL);
    swt_conn_set_tap(rx, NULL, NULL);
    /* the callback: the plaintext, opened */
    assert_int_equal(k.len, sizeof(msg));
    assert_memory_equal(k.text, msg, sizeof(msg));
    /* the publisher's tap: begin and end, the same sealed bytes, longer
     * than the plaintext and not containing it */
    assert_int_equal(tp.n, 2);
    assert_int_equal(tp.at[0], SWT_TAP_PUB_BEGIN);
    assert_int_equal(tp.at[1], SWT_TAP_PUB_END);
    assert_true(tp.len[0] > sizeof(msg) && tp.len[0] <= sizeof(msg) + SWT_ENV_OVERHEAD &&
                tp.len[0] <= 256);
    assert_int_equal(tp.len[1], tp.len[0]);
    assert_memory_equal(tp.bytes[0], tp.bytes[1], tp.len[0]);
    assert_true(swt_env_is_sealed(tp.bytes[0], tp.len[0]));
    assert_null(memmem(tp.bytes[0], tp.len[0], hello, 5));
    /* the receiver's tap: those sealed bytes, as they came */
    assert_int_equal(tr.n, 1);
    assert_int_equal(tr.at[0], SWT_TAP_RX);
    assert_int_equal(tr.len[0], tp.len[0]);
    assert_memory_equal(tr.bytes[0], tp.bytes[0], tp.len[0]);
    swt_sub_close(rx, &sub);
    sw_conn_close(pub);
    sw_conn_close(rx);
    pthread_mutex_destroy(&tp.mu);
    pthread_mutex_destroy(&tr.mu);
}

static void
sealed_registry(void **state)
{
    sw_conn *wc = conn_open(g_key1), *fc = conn_open(g_key1), *uc = conn_open(NULL);
    engine e = {5, 0, PTHREAD_MUTEX_INITIALIZER, 0, 0, 0};
    sw_ingress *ing = worker(wc, "rw1", &e);
    sw_registry_opts ro;
    sw_registry *wreg = NULL, *freg = NULL, *ureg = NULL;
    sw_registration rg;
    (void)state;
    sw_registry_opts_init(&ro);
    ro.bucket = "sw_sealed_reg";
    ro.lease_ms = 1000;
    assert_int_equal(sw_registry_open(&wreg, wc, &ro), SW_OK);
    assert_int_equal(sw_registry_open(&freg, fc, &ro), SW_OK);
    assert_int_equal(sw_registry_open(&ureg, uc, &ro), SW_OK);
    assert_int_equal(sw_ingress_registration(ing, &rg), SW_OK);
    assert_int_equal(sw_registry_register(wreg, &rg), SW_OK);
    for (int i = 0; i < 5 * 300 * swh_slow() && listed(freg, "rw1") == 0; i++)
        swh_sleep_ms(10);
    assert_int_equal(listed(freg, "rw1"), 1);
    /* forged, unsealed: an entry for a fake instance, and a tombstone of
     * the live one (what an attacker with KV write access could put) */
    {
        swp_instance m = STREAMWIRE__V1__INSTANCE_INFO__INIT;
        uint8_t buf[512];
        size_t len;
        char key[128];
        m.version = SW_PROTOCOL_VERSION;
        m.instance_id = (char *)"fake1";
        m.endpoint = (char *)EP;
        m.request_subject = (char *)"sw.req." EP ".fake1";
        m.control_subject = (char *)"sw.ctl.fake1";
        m.lease_ms = 60000;
        m.refreshed_unix_ms = (uint64_t)swi_unix_ms();
        assert_int_equal(swp_encode(&m, buf, sizeof(buf), &len), SW_OK);
        snprintf(key, sizeof(key), "%s.fake1", EP);
        kv_put_raw(key, buf, len);
        m.instance_id = (char *)"rw1";
        m.request_subject = (char *)"sw.req." EP ".rw1";
        m.control_subject = (char *)"sw.ctl.rw1";
        m.dead = 1;
        m.dead_reason = (char *)"forged";
        assert_int_equal(swp_encode(&m, buf, sizeof(buf), &len), SW_OK);
        snprintf(key, sizeof(key), "%s.rw1", EP);
        kv_put_raw(key, buf, len);
    }
    swh_sleep_ms(T(500));
    assert_int_equal(listed(freg, "fake1"), 0); /* never an instance */
    /* the live worker stays (its next keep-alive rewrites the entry anyway;
     * the forged tombstone never counted) */
    for (int i = 0; i < 5; i++) {
        assert_int_equal(listed(freg, "rw1"), 1);
        swh_sleep_ms(T(100));
    }
    /* an unsealed registry sees no sealed worker, and believes the forgery:
     * what sealing prevents */
    assert_int_equal(listed(ureg, "rw1"), 0);
    assert_int_equal(listed(ureg, "fake1"), 1);
    {
        /* counted: the two forgeries ignored, a refused report for a live
         * instance, one live instance; exported as streamwire_registry_* */
        sw_registry_stats rst;
        sw_metrics *mx = NULL;
        char *text = NULL;
        size_t tl = 0;
        assert_int_equal(sw_registry_report_silent(freg, "rw1", 60000, "test"), SW_EBUSY);
        sw_registry_stats_get(freg, &rst);
        assert_true(rst.entries_ignored >= 2);
        assert_int_equal(rst.dead_reports_sent, 0);
        assert_int_equal(rst.dead_reports_refused, 1);
        assert_int_equal(rst.live, 1);
        assert_int_equal(sw_metrics_create(&mx), SW_OK);
        assert_int_equal(sw_metrics_add_registry(mx, freg), SW_OK);
        assert_int_equal(sw_metrics_render(mx, &text, &tl), SW_OK);
        assert_non_null(
            strstr(text, "streamwire_registry_live_instances{bucket=\"sw_sealed_reg\"} 1\n"));
        assert_non_null(strstr(
            text, "streamwire_registry_dead_reports_refused_total{bucket=\"sw_sealed_reg\"} 1\n"));
        free(text);
        sw_metrics_destroy(mx);
    }
    /* a sealed router routes to it through the registry */
    {
        sw_router_opts o;
        sw_router *r = NULL;
        sw_request_opts q;
        sw_stream *s = NULL;
        sw_terminal t;
        char reason[64];
        sw_router_opts_init(&o);
        o.registry = freg;
        assert_int_equal(sw_router_create(&r, fc, &o), SW_OK);
        sw_request_opts_init(&q);
        q.endpoint = EP;
        assert_int_equal(sw_router_open(&s, r, &q, "n=5", 3), SW_OK);
        assert_int_equal(drain(s, &t, reason, sizeof(reason)), 5);
        assert_int_equal(t.status, SW_STATUS_COMPLETED);
        assert_string_equal(sw_stream_instance_id(s), "rw1");
        sw_stream_close(s);
        sw_router_destroy(r);
    }
    (void)sw_registry_deregister(wreg, "rw1");
    sw_registry_close(ureg);
    sw_registry_close(freg);
    sw_registry_close(wreg);
    sw_ingress_destroy(ing);
    sw_conn_close(uc);
    sw_conn_close(fc);
    sw_conn_close(wc);
}

static int
group_setup(void **state)
{
    (void)state;
    if (swh_nats_start(&g_nats, NULL) != 0)
        return -1;
    write_key(g_key1, sizeof(g_key1), "k1");
    write_key(g_key2, sizeof(g_key2), "k2");
    return 0;
}

static int
group_teardown(void **state)
{
    (void)state;
    swh_nats_stop(&g_nats);
    return 0;
}

/* test_sealed [<glob>]: only the tests whose names match. */
int
main(int argc, char **argv)
{
    if (argc > 1 && argv[1][0] != '\0')
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sealed_cluster_streams),
        cmocka_unit_test(mixed_cluster_fails_fast),
        cmocka_unit_test(rolling_key_rotation),
        cmocka_unit_test(hostile_peer_against_sealed_cluster),
        cmocka_unit_test(forged_no_responders_refused),
        cmocka_unit_test(replayed_probe_not_answered_on_a_stream),
        cmocka_unit_test(unsealed_junk_request_does_not_end_a_stream),
        cmocka_unit_test(replayed_live_probe_answered_only_on_its_subject),
        cmocka_unit_test(replayed_heartbeat_batches_refused),
        cmocka_unit_test(heartbeats_count_with_rare_probes),
        cmocka_unit_test(forged_probe_answers_do_not_hide_a_loss),
        cmocka_unit_test(replayed_items_do_not_hide_a_loss),
        cmocka_unit_test(stream_probes_sealed),
        cmocka_unit_test(replayed_stalled_heartbeats_do_not_hide_a_loss),
        cmocka_unit_test(sealed_registry),
        cmocka_unit_test(taps_see_sealed_bytes),
        cmocka_unit_test(items_at_the_size_limit),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
