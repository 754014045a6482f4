/* tests/fuzz/gen_corpus.c -- writes the seed corpus for fuzz_decode.
 *
 *   fuzz_gen_corpus DIR
 *
 * Creates DIR if needed. Each file is one selector byte (0 request, 1 item, 2 control, 3 probe
 * reply, 4 instance info) followed by an encoded message: valid messages of
 * every shape plus a few near-misses that fail validation. Deterministic:
 * running it again gives the same bytes. The output is committed in
 * tests/fuzz/corpus/; regenerate it after a wire format change with
 *
 *   build/tests/unit/fuzz_gen_corpus tests/fuzz/corpus
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "proto/sw_codec.h"

static const char *outdir;
static int nwritten;

static void
emit(int sel, const char *name, const void *msg)
{
    char path[4096];
    uint8_t *buf = NULL;
    size_t len = 0;
    FILE *f;
    if (swp_encode_alloc(msg, 1u << 20, &buf, &len) != SW_OK) {
        fprintf(stderr, "gen_corpus: cannot encode %s\n", name);
        exit(1);
    }
    snprintf(path, sizeof(path), "%s/%d-%s.bin", outdir, sel, name);
    if ((f = fopen(path, "wb")) == NULL) {
        perror(path);
        exit(1);
    }
    fputc(sel, f);
    if (len)
        fwrite(buf, 1, len, f);
    if (fclose(f) != 0) {
        perror(path);
        exit(1);
    }
    free(buf);
    nwritten++;
}

/* Writes a selector byte and raw bytes (for inputs the encoder cannot make). */
static void
emit_raw(int sel, const char *name, const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
    char path[4096];
    FILE *f;
    snprintf(path, sizeof(path), "%s/%d-%s.bin", outdir, sel, name);
    if ((f = fopen(path, "wb")) == NULL) {
        perror(path);
        exit(1);
    }
    fputc(sel, f);
    fwrite(a, 1, alen, f);
    if (blen)
        fwrite(b, 1, blen, f);
    if (fclose(f) != 0) {
        perror(path);
        exit(1);
    }
    nwritten++;
}

static const uint8_t RID[16] = {0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77,
                                0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff};
static uint8_t key32[32], nonce24[24], ct40[40];

static ProtobufCBinaryData
bin(const void *p, size_t n)
{
    ProtobufCBinaryData d;
    d.data = (uint8_t *)(uintptr_t)p;
    d.len = n;
    return d;
}

static void
requests(void)
{
    swp_request r = STREAMWIRE__V1__REQUEST__INIT;
    Streamwire__V1__Request__HeadersEntry h1 = STREAMWIRE__V1__REQUEST__HEADERS_ENTRY__INIT;
    Streamwire__V1__Request__HeadersEntry h2 = STREAMWIRE__V1__REQUEST__HEADERS_ENTRY__INIT;
    Streamwire__V1__Request__HeadersEntry *hs[2] = {&h1, &h2};
    Streamwire__V1__Sealed sealed = STREAMWIRE__V1__SEALED__INIT;

    r.version = 1;
    r.request_id = bin(RID, 16);
    r.response_subject = (char *)"sw.rsp.rtr-1.00112233445566778899aabbccddeeff";
    r.router_id = (char *)"rtr-1";
    emit(0, "request-min", &r);
    {
        /* regression seeds: unknown fields, and field number 0 in an over-long
         * tag (a protobuf-c quirk, see pbc_quirks.h) */
        static const uint8_t unknown[] = {0x98, 0x06, 0x01, 0xa2, 0x06, 0x02, 'h', 'i'};
        static const uint8_t tag0[] = {0x82, 0x00, 0x03, 'a', 'b', 'c'};
        uint8_t *enc = NULL;
        size_t n = 0;
        if (swp_encode_alloc(&r, 4096, &enc, &n) != SW_OK)
            exit(1);
        emit_raw(0, "request-unknown-fields", enc, n, unknown, sizeof(unknown));
        emit_raw(0, "request-overlong-tag0", enc, n, tag0, sizeof(tag0));
        free(enc);
    }

    r.payload = bin("{\"prompt\":\"hello\"}", 18);
    r.credit_window = 64;
    r.heartbeat_ms = 250;
    r.deadline_ms = 30000;
    r.endpoint = (char *)"ns.component.generate";
    r.max_tokens = 512;
    h1.key = (char *)"traceparent";
    h1.value = (char *)"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    h2.key = (char *)"tenant";
    h2.value = (char *)"acme";
    r.n_headers = 2;
    r.headers = hs;
    r.resume_from_seq = 5;
    r.auth_token = bin("token", 5);
    emit(0, "request-full", &r);

    sealed.key_id = 3;
    sealed.sender_pk = bin(key32, sizeof(key32));
    sealed.nonce = bin(nonce24, sizeof(nonce24));
    sealed.ciphertext = bin(ct40, sizeof(ct40));
    r.sealed = &sealed;
    emit(0, "request-sealed", &r);
    r.sealed = NULL;

    r.version = 2;
    emit(0, "request-v2", &r);
    r.version = 1;
    r.response_subject = (char *)"sw.rsp.rtr-1.*";
    emit(0, "request-wildcard-subject", &r);
}

static void
items(void)
{
    swp_item m;
    Streamwire__V1__Heartbeat hb = STREAMWIRE__V1__HEARTBEAT__INIT;
    Streamwire__V1__Terminal t = STREAMWIRE__V1__TERMINAL__INIT;
    Streamwire__V1__Error err = STREAMWIRE__V1__ERROR__INIT;
    static const struct {
        Streamwire__V1__Status st;
        const char *reason, *name;
    } finals[] = {
        {STREAMWIRE__V1__STATUS__STATUS_COMPLETED, "stop", "item-final-completed"},
        {STREAMWIRE__V1__STATUS__STATUS_INCOMPLETE, "max_tokens", "item-final-incomplete"},
        {STREAMWIRE__V1__STATUS__STATUS_CANCELLED, "cancelled", "item-final-cancelled"},
    };

    streamwire__v1__stream_item_wrapper__init(&m); /* INIT trips -Wmissing-braces */
    m.version = 1;
    m.request_id = bin(RID, 16);
    m.instance_id = (char *)"inst-a";
    m.seq = 1;
    m.body_case = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_DATA;
    m.data = bin("{\"token\":\"hi\"}", 14);
    emit(1, "item-data", &m);
    m.droppable = 1;
    m.resent = 1;
    m.seq = 1000000;
    emit(1, "item-data-droppable-resent", &m);
    m.droppable = 0;
    m.resent = 0;
    {
        /* bigger than the egress's decode arena (SWP_ARENA_BYTES) */
        static uint8_t big[3000];
        for (size_t i = 0; i < sizeof(big); i++)
            big[i] = (uint8_t)(i * 7);
        m.seq = 2;
        m.data = bin(big, sizeof(big));
        emit(1, "item-data-large", &m);
        m.seq = 1;
        m.data = bin("{\"token\":\"hi\"}", 14);
    }

    m.seq = 0;
    m.body_case = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY_HEARTBEAT;
    hb.last_seq = 41;
    hb.inflight = 3;
    m.heartbeat = &hb;
    emit(1, "item-heartbeat", &m);

    m.seq = 42;
    m.body_case = STREAMWIRE__V1__STREAM_ITEM_WRAPPER__BODY__NOT_SET;
    m.complete_final = 1;
    m.terminal = &t;
    for (size_t i = 0; i < sizeof(finals) / sizeof(finals[0]); i++) {
        t.status = finals[i].st;
        t.finish_reason = (char *)finals[i].reason;
        emit(1, finals[i].name, &m);
    }
    t.status = STREAMWIRE__V1__STATUS__STATUS_FAILED;
    t.finish_reason = (char *)"";
    t.error = &err;
    err.app_code = (char *)"engine_error";
    err.message = (char *)"CUDA out of memory";
    emit(1, "item-final-failed-app", &m);
    err.sw_code = SW_EOVERLOADED;
    err.app_code = (char *)"";
    err.message = (char *)"";
    emit(1, "item-final-failed-sw", &m);
    t.error = NULL;
    emit(1, "item-final-failed-no-error", &m);
}

/* Batches, written the way the worker writes them (swp_hdr_write, data and
 * final bodies, swp_batch_prefix): a header, the first item's body, then a
 * prefix + body per further item. */
static uint8_t bbuf[4096];
static size_t blen;

static void
b_hdr(void)
{
    swp_hdr h;
    h.request_id = RID;
    h.instance_id = "inst-a";
    h.credit_window = 0;
    h.resent = 0;
    h.credit_window_max = 0;
    h.credit_bytes = 0;
    blen = swp_hdr_write(&h, bbuf);
}

static void
b_data(int batched, uint64_t seq, const char *data, int droppable)
{
    size_t len = strlen(data), size = swp_data_body_size(seq, len, droppable, 0);
    if (blen + SWP_PREFIX_MAX + size > sizeof(bbuf))
        exit(1);
    if (batched)
        blen += swp_batch_prefix(bbuf + blen, size);
    blen += swp_data_body_write(bbuf + blen, seq, data, len, droppable, NULL, 0);
}

/* A typed data item (an event name). */
static void
b_event(int batched, uint64_t seq, const char *data, const char *event)
{
    size_t len = strlen(data), elen = strlen(event), size = swp_data_body_size(seq, len, 0, elen);
    if (blen + SWP_PREFIX_MAX + size > sizeof(bbuf))
        exit(1);
    if (batched)
        blen += swp_batch_prefix(bbuf + blen, size);
    blen += swp_data_body_write(bbuf + blen, seq, data, len, 0, event, elen);
}

static void
b_final(int batched, uint64_t seq, const swp_terminal *t)
{
    uint8_t *body = NULL;
    size_t n = 0;
    if (swp_final_body_alloc(seq, t, sizeof(bbuf) - blen - SWP_PREFIX_MAX, &body, &n) != SW_OK) {
        fprintf(stderr, "gen_corpus: cannot encode a final body\n");
        exit(1);
    }
    if (batched)
        blen += swp_batch_prefix(bbuf + blen, n);
    memcpy(bbuf + blen, body, n);
    blen += n;
    free(body);
}

static void
batches(void)
{
    Streamwire__V1__Terminal t = STREAMWIRE__V1__TERMINAL__INIT;
    Streamwire__V1__Error err = STREAMWIRE__V1__ERROR__INIT;

    b_hdr();
    b_data(0, 1, "{\"token\":\"a\"}", 0);
    b_data(1, 2, "{\"token\":\"b\"}", 1);
    b_data(1, 3, "{\"token\":\"c\"}", 0);
    emit_raw(1, "item-batch-data3", bbuf, blen, NULL, 0);

    t.status = STREAMWIRE__V1__STATUS__STATUS_COMPLETED;
    t.finish_reason = (char *)"stop";
    b_hdr();
    b_data(0, 7, "{\"token\":\"x\"}", 0);
    b_data(1, 8, "{\"token\":\"y\"}", 0);
    b_final(1, 9, &t);
    emit_raw(1, "item-batch-final", bbuf, blen, NULL, 0);

    t.status = STREAMWIRE__V1__STATUS__STATUS_FAILED;
    t.finish_reason = (char *)"";
    t.error = &err;
    err.app_code = (char *)"engine_error";
    err.message = (char *)"CUDA out of memory";
    b_hdr();
    b_data(0, 20, "{\"token\":\"z\"}", 1);
    b_final(1, 21, &t);
    emit_raw(1, "item-batch-final-failed", bbuf, blen, NULL, 0);

    b_hdr();
    b_data(0, 4, "{\"token\":\"p\"}", 0);
    b_data(1, 5, "", 0);
    b_data(1, 6, "{\"token\":\"q\"}", 0);
    emit_raw(1, "item-batch-empty-data", bbuf, blen, NULL, 0);

    /* typed items (an event name), alone and batched */
    b_hdr();
    b_event(0, 1, "I can't", "refusal");
    b_data(1, 2, "{\"token\":\"b\"}", 0);
    b_event(1, 3, "{\"tokens\":2}", "metrics");
    emit_raw(1, "item-batch-typed", bbuf, blen, NULL, 0);
    b_hdr();
    b_event(0, 1, "x", "bad name");
    emit_raw(1, "item-typed-bad-name", bbuf, blen, NULL, 0);

    /* near-misses: rejected by swp_check_batch */
    b_hdr();
    b_data(0, 5, "{\"token\":\"a\"}", 0);
    b_data(1, 7, "{\"token\":\"b\"}", 0);
    b_data(1, 6, "{\"token\":\"c\"}", 0);
    emit_raw(1, "item-batch-seq-decreasing", bbuf, blen, NULL, 0);

    t.status = STREAMWIRE__V1__STATUS__STATUS_COMPLETED;
    t.finish_reason = (char *)"stop";
    t.error = NULL;
    b_hdr();
    b_data(0, 5, "{\"token\":\"a\"}", 0);
    b_final(1, 6, &t);
    b_data(1, 7, "{\"token\":\"b\"}", 0);
    emit_raw(1, "item-batch-final-middle", bbuf, blen, NULL, 0);
}

static void
controls(void)
{
    swp_control c = STREAMWIRE__V1__CONTROL__INIT;
    c.version = 1;
    c.request_id = bin(RID, 16);
    c.router_id = (char *)"rtr-1";
    c.kind = STREAMWIRE__V1__CONTROL_KIND__CONTROL_CANCEL;
    emit(2, "control-cancel", &c);
    c.kind = STREAMWIRE__V1__CONTROL_KIND__CONTROL_KILL;
    emit(2, "control-kill", &c);
    c.kind = STREAMWIRE__V1__CONTROL_KIND__CONTROL_CREDIT;
    c.credit_limit = 96;
    c.ack_seq = 32;
    emit(2, "control-credit", &c);
    c.credit_limit = c.ack_seq = 0;
    c.kind = STREAMWIRE__V1__CONTROL_KIND__CONTROL_RESEND;
    c.resend_from = 7;
    c.resend_to = 11;
    emit(2, "control-resend", &c);
    c.resend_from = 12;
    emit(2, "control-resend-backwards", &c);
    c.resend_from = c.resend_to = 0;
    c.kind = STREAMWIRE__V1__CONTROL_KIND__CONTROL_PROBE;
    emit(2, "control-probe", &c);
    c.request_id = bin(NULL, 0);
    emit(2, "control-probe-instance", &c);
}

static void
probe_and_instance(void)
{
    swp_probe_reply p = STREAMWIRE__V1__PROBE_REPLY__INIT;
    swp_instance in = STREAMWIRE__V1__INSTANCE_INFO__INIT;
    Streamwire__V1__InstanceInfo__LabelsEntry l1 =
        STREAMWIRE__V1__INSTANCE_INFO__LABELS_ENTRY__INIT;
    Streamwire__V1__InstanceInfo__LabelsEntry *ls[1] = {&l1};

    p.version = 1;
    p.instance_id = (char *)"inst-a";
    p.known = 1;
    p.last_seq = 42;
    p.inflight = 2;
    emit(3, "probe-reply", &p);
    p.known = 0;
    p.draining = 1;
    emit(3, "probe-reply-draining", &p);

    in.version = 1;
    in.instance_id = (char *)"inst-a";
    in.endpoint = (char *)"ns.component.generate";
    in.request_subject = (char *)"sw.req.ns.component.generate.inst-a";
    in.control_subject = (char *)"sw.ctl.inst-a";
    in.started_unix_ms = 1700000000000ULL;
    in.host = (char *)"node-1";
    in.pid = 1234;
    l1.key = (char *)"gpu";
    l1.value = (char *)"h100";
    in.n_labels = 1;
    in.labels = ls;
    in.public_key = bin(key32, sizeof(key32));
    in.refreshed_unix_ms = 1700000001000ULL;
    in.lease_ms = 3000;
    emit(4, "instance", &in);
    in.endpoint = (char *)"ns.component";
    emit(4, "instance-bad-endpoint", &in);
}

/* Heartbeat batches (selector 5): one beat, three, and near-misses. */
static void
beats(void)
{
    static uint8_t ids[3][16];
    swp_beat b[3];
    swp_beat *p[3] = {&b[0], &b[1], &b[2]};
    swp_beats m = STREAMWIRE__V1__HEARTBEAT_BATCH__INIT;
    for (int i = 0; i < 3; i++) {
        memset(ids[i], 0x30 + i, sizeof(ids[i]));
        streamwire__v1__stream_beat__init(&b[i]);
        b[i].request_id.data = ids[i];
        b[i].request_id.len = sizeof(ids[i]);
        b[i].last_seq = (uint64_t)(i * 300 + 7);
    }
    m.version = 1;
    m.instance_id = (char *)"worker-1";
    m.beats = p;
    m.n_beats = 1;
    emit(5, "beats-one", &m);
    m.n_beats = 3;
    emit(5, "beats-three", &m);
    m.version = 9;
    emit(5, "beats-bad-version", &m);
    m.version = 1;
    b[1].request_id.len = 8;
    emit(5, "beats-short-id", &m);
}

int
main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    outdir = argv[1];
    if (mkdir(outdir, 0777) != 0 && errno != EEXIST) {
        perror(outdir);
        return 1;
    }
    for (size_t i = 0; i < sizeof(key32); i++)
        key32[i] = (uint8_t)(i * 7 + 1);
    for (size_t i = 0; i < sizeof(nonce24); i++)
        nonce24[i] = (uint8_t)(i * 13 + 5);
    for (size_t i = 0; i < sizeof(ct40); i++)
        ct40[i] = (uint8_t)(i * 31 + 11);
    requests();
    items();
    batches();
    controls();
    probe_and_instance();
    beats();
    printf("gen_corpus: wrote %d files to %s\n", nwritten, outdir);
    return 0;
}
