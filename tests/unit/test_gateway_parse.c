/* tests/unit/test_gateway_parse.c -- the gateway's pure parts without a
 * server: the request body parser (gateway/request.c) on good and hostile
 * bodies, and the event JSON (gateway/events.c), including UTF-8 split
 * across items. A seeded mutation loop over the good bodies checks that
 * no input crashes, leaks or yields a half-filled result. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gateway/events.h"

static int
parse(const char *body, swg_input *in, swg_error *e)
{
    return swg_parse_request(body, strlen(body), in, e);
}

static void
test_good_bodies(void **state)
{
    swg_input in;
    swg_error e;
    (void)state;
    assert_int_equal(parse("{\"model\":\"m\",\"input\":\"hello  big world\"}", &in, &e), 0);
    assert_string_equal(in.model, "m");
    assert_string_equal(in.text, "hello  big world");
    assert_int_equal(in.input_tokens, 3);
    assert_int_equal(in.stream, 0);
    assert_int_equal(in.max_output_tokens, 0);
    swg_input_free(&in);
    assert_int_equal(
        parse("{\"model\":\"m\",\"stream\":true,\"max_output_tokens\":7,\"metadata\":{\"a\":\"b\"},"
              "\"input\":[{\"role\":\"user\",\"content\":\"one\"},{\"role\":\"user\",\"content\":"
              "[{\"type\":\"input_text\",\"text\":\"two\"},{\"type\":\"input_text\",\"text\":"
              "\"three\"}]}],\"unknown\":[1,2,{}]}",
              &in, &e),
        0);
    assert_string_equal(in.text, "one\ntwo\nthree");
    assert_int_equal(in.stream, 1);
    assert_int_equal(in.max_output_tokens, 7);
    assert_non_null(in.metadata);
    swg_input_free(&in);
}

static void
test_bad_bodies(void **state)
{
    static const struct {
        const char *body, *code, *param;
    } bad[] = {
        {"", "invalid_json", NULL},
        {"{", "invalid_json", NULL},
        {"[]", "invalid_type", NULL},
        {"\"str\"", "invalid_json", NULL},
        {"{\"model\":\"m\",\"model\":\"n\",\"input\":\"x\"}", "invalid_json", NULL}, /* duplicate */
        {"{\"input\":\"x\"}", "missing_required_parameter", "model"},
        {"{\"model\":\"\",\"input\":\"x\"}", "missing_required_parameter", "model"},
        {"{\"model\":7,\"input\":\"x\"}", "missing_required_parameter", "model"},
        {"{\"model\":\"m\"}", "missing_required_parameter", "input"},
        {"{\"model\":\"m\",\"input\":[]}", "missing_required_parameter", "input"},
        {"{\"model\":\"m\",\"input\":5}", "missing_required_parameter", "input"},
        {"{\"model\":\"m\",\"input\":[\"x\"]}", "invalid_value", "input"},
        {"{\"model\":\"m\",\"input\":[{\"content\":5}]}", "invalid_type", "input"},
        {"{\"model\":\"m\",\"input\":[{\"content\":[{\"type\":\"x\"}]}]}", "invalid_value",
         "input"},
        {"{\"model\":\"m\",\"input\":\"x\",\"stream\":1}", "invalid_type", "stream"},
        {"{\"model\":\"m\",\"input\":\"x\",\"max_output_tokens\":0}", "invalid_value",
         "max_output_tokens"},
        {"{\"model\":\"m\",\"input\":\"x\",\"max_output_tokens\":1.5}", "invalid_value",
         "max_output_tokens"},
        {"{\"model\":\"m\",\"input\":\"x\",\"max_output_tokens\":99999999999}", "invalid_value",
         "max_output_tokens"},
        {"{\"model\":\"m\",\"input\":\"x\",\"metadata\":[]}", "invalid_type", "metadata"},
        {"{\"model\":\"m\",\"input\":\"\\xff\"}", "invalid_json", NULL},
    };
    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        swg_input in;
        swg_error e;
        if (parse(bad[i].body, &in, &e) == 0)
            fail_msg("accepted: %s", bad[i].body);
        assert_int_equal(e.http, 400);
        assert_string_equal(e.code, bad[i].code);
        if (bad[i].param == NULL)
            assert_null(e.param);
        else
            assert_string_equal(e.param, bad[i].param);
        assert_true(strlen(e.message) > 0);
        assert_null(in.model);
        assert_null(in.text);
    }
    {
        /* an embedded NUL ends nothing early: the body is its bytes */
        swg_input in;
        swg_error e;
        static const char nul[] = "{\"model\":\"m\",\"input\":\"a\"}\0junk";
        assert_int_equal(swg_parse_request(nul, sizeof(nul) - 1, &in, &e), -1);
        assert_string_equal(e.code, "invalid_json");
    }
}

/* Deep nesting is refused by jansson's depth limit, not by a stack
 * overflow. */
/* metadata: 16 pairs, 64-byte keys and 512-byte string values pass; one
 * more pair, a longer key or value, or a value that is not a string is 400
 * with param "metadata" (the response echoes it in several events, so it
 * must not carry a body's worth of bytes). */
static char *
meta_body(int pairs, size_t klen, size_t vlen, const char *raw_value)
{
    size_t cap = 256 + (size_t)pairs * (klen + vlen + 16);
    char *b = malloc(cap), *p = b;
    assert_non_null(b);
    p += sprintf(p, "{\"model\":\"m\",\"input\":\"x\",\"metadata\":{");
    for (int i = 0; i < pairs; i++) {
        p += sprintf(p, "%s\"%02d", i ? "," : "", i);
        memset(p, 'k', klen - 2);
        p += klen - 2;
        if (raw_value != NULL) {
            p += sprintf(p, "\":%s", raw_value);
        } else {
            p += sprintf(p, "\":\"");
            memset(p, 'v', vlen);
            p += vlen;
            *p++ = '"';
        }
    }
    sprintf(p, "}}");
    return b;
}

static void
test_metadata_bounds(void **state)
{
    static const struct {
        int pairs;
        size_t klen, vlen;
        const char *raw; /* a value that is not a string */
        const char *code;
    } cases[] = {
        {16, 64, 512, NULL, NULL},
        {1, 2, 0, NULL, NULL},
        {17, 4, 1, NULL, "invalid_value"},
        {1, 65, 1, NULL, "invalid_value"},
        {1, 4, 513, NULL, "invalid_value"},
        {1, 4, 0, "1", "invalid_value"},
        {1, 4, 0, "{}", "invalid_value"},
        {1, 4, 0, "null", "invalid_value"},
        {16, 64, 0, "[\"x\"]", "invalid_value"},
    };
    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        swg_input in;
        swg_error e;
        char *b = meta_body(cases[i].pairs, cases[i].klen, cases[i].vlen, cases[i].raw);
        int rv = parse(b, &in, &e);
        if (cases[i].code == NULL) {
            if (rv != 0)
                fail_msg("case %zu refused: %s", i, e.message);
            assert_non_null(in.metadata);
            assert_int_equal(json_object_size(in.metadata), (size_t)cases[i].pairs);
            swg_input_free(&in);
        } else {
            if (rv == 0)
                fail_msg("case %zu accepted", i);
            assert_int_equal(e.http, 400);
            if (strcmp(e.code, cases[i].code) != 0)
                fail_msg("case %zu: %s (%s), wanted %s", i, e.code, e.message, cases[i].code);
            assert_string_equal(e.param, "metadata");
            assert_non_null(strstr(e.message, "metadata"));
        }
        free(b);
    }
}

static void
test_deep_nesting(void **state)
{
    size_t depth = 100000;
    char *b = malloc(2 * depth + 64);
    swg_input in;
    swg_error e;
    size_t n = 0;
    (void)state;
    assert_non_null(b);
    n += (size_t)sprintf(b, "{\"model\":\"m\",\"input\":\"x\",\"z\":");
    for (size_t i = 0; i < depth; i++)
        b[n++] = '[';
    for (size_t i = 0; i < depth; i++)
        b[n++] = ']';
    b[n++] = '}';
    assert_int_equal(swg_parse_request(b, n, &in, &e), -1);
    assert_string_equal(e.code, "invalid_json");
    free(b);
}

/* Seeded mutations of good bodies: whatever comes back is either a whole
 * result or a whole error. (ASan and LSan in the sanitizer build.) */
static void
test_mutations(void **state)
{
    static const char *seeds[] = {
        "{\"model\":\"m\",\"input\":\"hello\",\"stream\":true}",
        "{\"model\":\"m\",\"input\":[{\"content\":[{\"text\":\"a\"},{\"text\":\"b\"}]}],"
        "\"max_output_tokens\":3,\"metadata\":{\"k\":\"v\"}}",
    };
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    char buf[512];
    (void)state;
    for (int it = 0; it < 200000; it++) {
        const char *s = seeds[it % 2];
        size_t n = strlen(s);
        swg_input in;
        swg_error e;
        memcpy(buf, s, n);
        for (int k = 0; k < 1 + it % 4; k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            switch (x % 3) {
            case 0:
                buf[(x >> 8) % n] = (char)(x >> 16);
                break;
            case 1:
                if (n > 1)
                    n--;
                break;
            default:
                if (n < sizeof(buf) - 1)
                    buf[n++] = (char)(x >> 24);
                break;
            }
        }
        if (swg_parse_request(buf, n, &in, &e) == 0) {
            assert_non_null(in.model);
            assert_non_null(in.text);
            swg_input_free(&in);
        } else {
            assert_true(e.http == 400 || e.http == 500);
            assert_null(in.model);
        }
    }
}

static void
test_utf8_across_items(void **state)
{
    swg_resp r;
    size_t off, n;
    (void)state;
    memset(&r, 0, sizeof(r));
    /* "é" (c3 a9) split over two items, then "€" (e2 82 ac) whole */
    swg_resp_add(&r, "a\xc3", 2, &off, &n);
    assert_int_equal(n, 1);
    swg_resp_add(&r,
                 "\xa9"
                 "b",
                 2, &off, &n);
    assert_int_equal(n, 3);
    assert_memory_equal(r.text.p + off,
                        "\xc3\xa9"
                        "b",
                        3);
    swg_resp_add(&r, "\xe2\x82\xac", 3, &off, &n);
    assert_int_equal(n, 3);
    /* invalid bytes become U+FFFD */
    swg_resp_add(&r, "\xff", 1, &off, &n);
    assert_memory_equal(r.text.p + off, "\xef\xbf\xbd", 3);
    swg_resp_add(&r, "\xed\xa0\x80", 3, &off, &n); /* a surrogate */
    assert_memory_equal(r.text.p + off, "\xef\xbf\xbd", 3);
    assert_int_equal(r.items, 5);
    swg_buf_free(&r.text);
}

/* A response resp_1 / msg_1 of model m, and an empty buffer. */
static void
resp_init(swg_resp *r, swg_buf *b)
{
    memset(r, 0, sizeof(*r));
    memset(b, 0, sizeof(*b));
    snprintf(r->id, sizeof(r->id), "resp_1");
    snprintf(r->msg_id, sizeof(r->msg_id), "msg_1");
    r->model = "m";
}

static void
test_events_json(void **state)
{
    swg_resp r;
    swg_buf b;
    swg_end end = {"incomplete", "max_output_tokens", NULL, NULL};
    size_t off, n;
    (void)state;
    resp_init(&r, &b);
    swg_sse_created(&b, &r);
    swg_sse_started(&b, &r);
    swg_resp_add(&r, "tok\"\n", 5, &off, &n);
    swg_sse_delta(&b, &r, r.text.p + off, n);
    swg_sse_end(&b, &r, &end);
    assert_false(b.oom);
    assert_non_null(strstr(b.p, "event: response.created\ndata: {"));
    assert_non_null(strstr(b.p, "\"delta\":\"tok\\\"\\n\""));
    assert_non_null(strstr(b.p, "event: response.incomplete\n"));
    assert_non_null(strstr(b.p, "\"incomplete_details\":{\"reason\":\"max_output_tokens\"}"));
    assert_non_null(strstr(b.p, "\"sequence_number\":8}"));
    assert_null(strstr(b.p, "\"sequence_number\":9"));
    swg_buf_free(&b);
    swg_resp_free(&r);
}

/* Every event of a response, byte for byte: the field order, compact form
 * and escapes clients parse (they were jansson's; the writer is now by
 * hand). A worker's message with a byte that is not UTF-8 keeps the error
 * object, with U+FFFD in place of the byte (jansson refused the string and
 * the response lost its "error"). */
static void
test_events_exact(void **state)
{
    static const char want_events[] =
        "event: response.created\n"
        "data: "
        "{\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"created_at\":7,\"status\":\"in_"
        "progress\",\"model\":\"m\",\"metadata\":{\"k\":\"v\",\"a\":1},\"output\":[],\"usage\":"
        "null,\"error\":null,\"incomplete_details\":null},\"type\":\"response.created\",\"sequence_"
        "number\":0}\n"
        "\n"
        "event: response.in_progress\n"
        "data: "
        "{\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"created_at\":7,\"status\":\"in_"
        "progress\",\"model\":\"m\",\"metadata\":{\"k\":\"v\",\"a\":1},\"output\":[],\"usage\":"
        "null,\"error\":null,\"incomplete_details\":null},\"type\":\"response.in_progress\","
        "\"sequence_number\":1}\n"
        "\n"
        "event: response.output_item.added\n"
        "data: "
        "{\"output_index\":0,\"item\":{\"id\":\"msg_1\",\"type\":\"message\",\"status\":\"in_"
        "progress\",\"role\":\"assistant\",\"content\":[]},\"type\":\"response.output_item.added\","
        "\"sequence_number\":2}\n"
        "\n"
        "event: response.content_part.added\n"
        "data: "
        "{\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"part\":{\"type\":\"output_"
        "text\",\"text\":\"\",\"annotations\":[]},\"type\":\"response.content_part.added\","
        "\"sequence_number\":3}\n"
        "\n"
        "event: response.output_text.delta\n"
        "data: "
        "{\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":"
        "\"a\\b\\u0001\\\"\",\"type\":\"response.output_text.delta\",\"sequence_number\":4}\n"
        "\n"
        "event: response.output_text.done\n"
        "data: "
        "{\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"text\":"
        "\"a\\b\\u0001\\\"\",\"type\":\"response.output_text.done\",\"sequence_number\":5}\n"
        "\n"
        "event: response.content_part.done\n"
        "data: "
        "{\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"part\":{\"type\":\"output_"
        "text\",\"text\":\"a\\b\\u0001\\\"\",\"annotations\":[]},\"type\":\"response.content_part."
        "done\",\"sequence_number\":6}\n"
        "\n"
        "event: response.content_part.added\n"
        "data: "
        "{\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":1,\"part\":{\"type\":"
        "\"refusal\",\"refusal\":\"\"},\"type\":\"response.content_part.added\",\"sequence_"
        "number\":7}\n"
        "\n"
        "event: response.refusal.delta\n"
        "data: "
        "{\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":1,\"delta\":\"no\",\"type\":"
        "\"response.refusal.delta\",\"sequence_number\":8}\n"
        "\n"
        "event: response.refusal.done\n"
        "data: "
        "{\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":1,\"refusal\":\"no\",\"type\":"
        "\"response.refusal.done\",\"sequence_number\":9}\n"
        "\n"
        "event: response.content_part.done\n"
        "data: "
        "{\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":1,\"part\":{\"type\":"
        "\"refusal\",\"refusal\":\"no\"},\"type\":\"response.content_part.done\",\"sequence_"
        "number\":10}\n"
        "\n"
        "event: response.output_item.done\n"
        "data: "
        "{\"output_index\":0,\"item\":{\"id\":\"msg_1\",\"type\":\"message\",\"status\":"
        "\"incomplete\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":"
        "\"a\\b\\u0001\\\"\",\"annotations\":[]},{\"type\":\"refusal\",\"refusal\":\"no\"}]},"
        "\"type\":\"response.output_item.done\",\"sequence_number\":11}\n"
        "\n"
        "event: response.failed\n"
        "data: "
        "{\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"created_at\":7,\"status\":"
        "\"failed\",\"model\":\"m\",\"metadata\":{\"k\":\"v\",\"a\":1},\"output\":[{\"id\":\"msg_"
        "1\",\"type\":\"message\",\"status\":\"incomplete\",\"role\":\"assistant\",\"content\":[{"
        "\"type\":\"output_text\",\"text\":\"a\\b\\u0001\\\"\",\"annotations\":[]},{\"type\":"
        "\"refusal\",\"refusal\":\"no\"}]}],\"usage\":{\"input_tokens\":2,\"output_tokens\":2,"
        "\"total_tokens\":4},\"error\":{\"code\":\"app_error\",\"message\":\"bad \xef\xbf\xbd"
        " byte\\n\"},\"incomplete_details\":null},\"type\":\"response.failed\",\"sequence_number\":"
        "12}\n"
        "\n";
    static const char want_body[] =
        "{\"id\":\"resp_1\",\"object\":\"response\",\"created_at\":7,\"status\":\"failed\","
        "\"model\":\"m\",\"metadata\":{\"k\":\"v\",\"a\":1},\"output\":[{\"id\":\"msg_1\",\"type\":"
        "\"message\",\"status\":\"incomplete\",\"role\":\"assistant\",\"content\":[{\"type\":"
        "\"output_text\",\"text\":\"a\\b\\u0001\\\"\",\"annotations\":[]},{\"type\":\"refusal\","
        "\"refusal\":\"no\"}]}],\"usage\":{\"input_tokens\":2,\"output_tokens\":2,\"total_tokens\":"
        "4},\"error\":{\"code\":\"app_error\",\"message\":\"bad \xef\xbf\xbd"
        " byte\\n\"},\"incomplete_details\":null}";
    swg_resp r;
    swg_buf b;
    swg_end end = {"failed", NULL, "app_error", "bad \xff byte\n"};
    size_t off, n;
    (void)state;
    resp_init(&r, &b);
    r.created_at = 7;
    r.input_tokens = 2;
    r.metadata = json_loads("{\"k\":\"v\",\"a\":1}", 0, NULL);
    assert_non_null(r.metadata);
    swg_sse_created(&b, &r);
    swg_sse_started(&b, &r);
    swg_resp_add(&r, "a\b\x01\"", 4, &off, &n);
    swg_sse_delta(&b, &r, r.text.p + off, n);
    swg_sse_switch(&b, &r, 1);
    swg_resp_add(&r, "no", 2, &off, &n);
    swg_sse_delta(&b, &r, r.text.p + off, n);
    swg_sse_end(&b, &r, &end);
    assert_false(b.oom);
    assert_string_equal(b.p, want_events);
    b.len = 0;
    swg_response_write(&b, &r, &end);
    assert_false(b.oom);
    assert_string_equal(b.p, want_body);
    swg_buf_free(&b);
    json_decref(r.metadata);
    swg_resp_free(&r);
}

/* A lead byte at an item's end followed by a byte that cannot continue it:
 * U+FFFD for the lead, and the byte after it kept (it was carried and lost).
 * A character still cut off at the end of the response: U+FFFD, in the
 * text and as one more delta, so the deltas add up to the done text. */
static void
test_utf8_cut_at_the_end(void **state)
{
    swg_resp r;
    swg_buf b;
    swg_end end = {"completed", NULL, NULL, NULL};
    size_t off, n;
    const char *last;
    (void)state;
    resp_init(&r, &b);
    swg_resp_add(&r,
                 "x\xe2"
                 "A",
                 3, &off, &n);
    assert_int_equal(r.text.len, 5);
    assert_memory_equal(r.text.p,
                        "x\xef\xbf\xbd"
                        "A",
                        5);
    assert_int_equal(r.ncarry, 0);
    swg_sse_started(&b, &r);
    swg_resp_add(&r, "\xe2\x82", 2, &off, &n); /* the start of a euro sign, and the end */
    assert_int_equal(n, 0);
    assert_int_equal(r.ncarry, 2);
    swg_sse_done(&b, &r, &end);
    assert_false(b.oom);
    last = strstr(b.p, "event: response.output_text.delta\n");
    assert_non_null(last);
    assert_non_null(strstr(last, "\"delta\":\"\xef\xbf\xbd\""));
    assert_non_null(strstr(b.p, "\"text\":\"x\xef\xbf\xbd"
                                "A\xef\xbf\xbd\""));
    assert_int_equal(r.ncarry, 0);
    swg_buf_free(&b);
    swg_resp_free(&r);
}

/* The error object, written by hand: jansson's shape, and any bytes in a
 * message (one cut inside a character at a byte limit) give valid JSON
 * with U+FFFD, where jansson refused the whole object. */
static void
test_error_object(void **state)
{
    swg_error e = {404, "not_found_error", "model_not_found", "model", ""};
    swg_buf b = {NULL, 0, 0, 0};
    json_t *j;
    (void)state;
    snprintf(e.message, sizeof(e.message), "the model 'm' does not exist");
    swg_error_write(&b, &e);
    assert_string_equal(b.p,
                        "{\"error\":{\"type\":\"not_found_error\",\"code\":\"model_not_found\","
                        "\"message\":\"the model 'm' does not exist\",\"param\":\"model\"}}");
    b.len = 0;
    e.param = NULL;
    snprintf(e.message, sizeof(e.message), "cut \xc3"); /* half of an e-acute */
    swg_error_write(&b, &e);
    assert_false(b.oom);
    j = json_loadb(b.p, b.len, 0, NULL);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "message")),
                        "cut \xef\xbf\xbd");
    assert_true(json_is_null(json_object_get(json_object_get(j, "error"), "param")));
    json_decref(j);
    swg_buf_free(&b);
}

/* swg_utf8_fix, which the access log's strings go through (a worker's
 * reason is its bytes): valid UTF-8 is left alone; each byte that starts
 * no well-formed character becomes U+FFFD -- stray continuation bytes,
 * bytes that never occur, a character cut short, overlong forms and
 * surrogates -- and the text around it is kept. */
static void
test_utf8_fix(void **state)
{
    static const struct {
        const char *in, *out; /* out NULL: valid */
    } cases[] = {
        {"", NULL},
        {"length", NULL},
        {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", NULL},
        {"length\xff\xfe", "length\xef\xbf\xbd\xef\xbf\xbd"},
        {"\x80x", "\xef\xbf\xbdx"},
        {"a\xe2\x82", "a\xef\xbf\xbd\xef\xbf\xbd"},                 /* cut short */
        {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},                   /* overlong '/' */
        {"\xed\xa0\x80!", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd!"}, /* a surrogate */
    };
    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        swg_buf b = {NULL, 0, 0, 0};
        int ok = swg_utf8_fix(cases[i].in, strlen(cases[i].in), &b);
        if (cases[i].out == NULL) {
            assert_int_equal(ok, 1);
            assert_int_equal(b.len, 0);
        } else {
            json_t *j;
            assert_int_equal(ok, 0);
            assert_false(b.oom);
            assert_string_equal(b.p, cases[i].out);
            /* jansson takes it */
            assert_non_null(j = json_string(b.p));
            json_decref(j);
        }
        swg_buf_free(&b);
    }
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_bodies),       cmocka_unit_test(test_bad_bodies),
        cmocka_unit_test(test_deep_nesting),      cmocka_unit_test(test_mutations),
        cmocka_unit_test(test_utf8_across_items), cmocka_unit_test(test_events_json),
        cmocka_unit_test(test_events_exact),      cmocka_unit_test(test_utf8_cut_at_the_end),
        cmocka_unit_test(test_error_object),      cmocka_unit_test(test_metadata_bounds),
        cmocka_unit_test(test_utf8_fix),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
