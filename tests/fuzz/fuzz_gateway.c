/* tests/fuzz/fuzz_gateway.c -- libFuzzer target for the gateway's pure parts
 * (issue 12): the request body parser, and what the gateway makes of a
 * worker's item bytes (bus bytes) on their way to a client.
 *
 * The first input byte selects the path:
 *   0: swg_parse_request(rest). Properties: it returns 0 or -1; on 0 the
 *      model is a non-empty string, the text has text_len bytes and no NUL
 *      inside, the word count is at most the text's length; on -1 the error
 *      has an HTTP status of 400 or 413, a type, a code and a NUL-terminated
 *      message; nothing leaks (ASan).
 *   1: the rest, split into items at 0xff bytes, as items of a response:
 *      text, refusal and metrics items (by the byte after each 0xff), then
 *      the terminal events. Properties: every SSE frame is "event: T\ndata: "
 *      + one JSON object whose type is T and whose sequence_number counts up
 *      from 0, the output text is valid UTF-8 (jansson accepts it), and the
 *      terminal response object serializes.
 * Built as fuzz_gateway with -DSW_BUILD_FUZZ=ON (clang) and, in every
 * build, as fuzz_gateway_replay over tests/fuzz/corpus-gateway. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "gateway/events.h"

void fuzz_decode_stats(unsigned long *decoded, unsigned long *rejected);

static unsigned long n_ok, n_rejected;

void
fuzz_decode_stats(unsigned long *decoded, unsigned long *rejected)
{
    *decoded = n_ok;
    *rejected = n_rejected;
}

#define CHECK(c)                                                                            \
    do {                                                                                    \
        if (!(c)) {                                                                         \
            fprintf(stderr, "fuzz_gateway: property failed: %s (line %d)\n", #c, __LINE__); \
            abort();                                                                        \
        }                                                                                   \
    } while (0)

static void
parse_path(const uint8_t *p, size_t n)
{
    swg_input in;
    swg_error e;
    int rv = swg_parse_request((const char *)p, n, &in, &e);
    CHECK(rv == 0 || rv == -1);
    if (rv == 0) {
        n_ok++;
        CHECK(in.model != NULL && in.model[0] != '\0');
        CHECK(in.text != NULL && strlen(in.text) == in.text_len);
        CHECK(in.input_tokens <= in.text_len);
        swg_input_free(&in);
    } else {
        n_rejected++;
        CHECK(e.http == 400 || e.http == 413);
        CHECK(e.type != NULL && e.code != NULL);
        CHECK(memchr(e.message, '\0', sizeof(e.message)) != NULL);
    }
}

/* Every frame in b: event name, JSON data of that type, counting up. */
static void
check_frames(const swg_buf *b)
{
    const char *p = b->p ? b->p : "";
    json_int_t want = 0;
    while (*p != '\0') {
        const char *nl, *end = strstr(p, "\n\n");
        char type[64];
        json_t *j;
        size_t tl;
        CHECK(end != NULL);
        CHECK(strncmp(p, "event: ", 7) == 0);
        nl = strchr(p, '\n');
        tl = (size_t)(nl - (p + 7));
        CHECK(tl > 0 && tl < sizeof(type));
        memcpy(type, p + 7, tl);
        type[tl] = '\0';
        CHECK(strncmp(nl + 1, "data: ", 6) == 0);
        /* U+0000 in a worker's text is valid JSON (\\u0000) */
        j = json_loadb(nl + 7, (size_t)(end - (nl + 7)), JSON_ALLOW_NUL, NULL);
        CHECK(j != NULL && json_is_object(j));
        CHECK(strcmp(json_string_value(json_object_get(j, "type")), type) == 0);
        CHECK(json_integer_value(json_object_get(j, "sequence_number")) == want);
        want++;
        json_decref(j);
        p = end + 2;
    }
}

static void
items_path(const uint8_t *p, size_t n)
{
    swg_resp r;
    swg_buf b;
    swg_end end;
    json_t *o;
    char msg[65];
    size_t i = 0;
    memset(&r, 0, sizeof(r));
    memset(&b, 0, sizeof(b));
    snprintf(r.id, sizeof(r.id), "resp_fuzz");
    snprintf(r.msg_id, sizeof(r.msg_id), "msg_fuzz");
    r.model = "m";
    swg_sse_created(&b, &r);
    swg_sse_narration(&b, &r, "start", "routed to instance w1");
    while (i < n) {
        const uint8_t *q = memchr(p + i, 0xff, n - i);
        size_t len = q ? (size_t)(q - (p + i)) : n - i;
        uint8_t kind = q && q + 1 < p + n ? q[1] : 0;
        size_t off, got;
        if (kind % 3 == 2) {
            swg_sse_metrics(&b, &r, p + i, len);
        } else {
            int refusal = kind % 3 == 1;
            if (!r.started) {
                r.refusal = refusal;
                swg_sse_started(&b, &r);
            } else if (refusal != r.refusal) {
                swg_sse_switch(&b, &r, refusal);
            }
            swg_resp_add(&r, p + i, len, &off, &got);
            if (got > 0)
                swg_sse_delta(&b, &r, r.text.p + off, got);
        }
        i += len + (q ? 2 : 0);
    }
    memset(&end, 0, sizeof(end));
    end.status = n % 2 ? "completed" : "failed";
    end.err_code = n % 2 ? NULL : "instance_lost";
    /* a worker's message: any bytes (bad UTF-8 is replaced, not refused) */
    memcpy(msg, p, n < 64 ? n : 64);
    msg[n < 64 ? n : 64] = '\0';
    end.err_message = msg;
    swg_sse_done(&b, &r, &end);
    swg_sse_narration(&b, &r, "end", msg);
    swg_sse_terminal(&b, &r, &end);
    CHECK(!b.oom);
    check_frames(&b);
    {
        /* valid UTF-8: json_stringn refuses anything else */
        json_t *t = json_stringn(r.text.p ? r.text.p : "", r.text.len);
        CHECK(t != NULL);
        json_decref(t);
    }
    {
        /* the non-streamed answer: one JSON object */
        swg_buf a = {NULL, 0, 0, 0};
        swg_response_write(&a, &r, &end);
        CHECK(!a.oom);
        o = json_loadb(a.p, a.len, JSON_ALLOW_NUL, NULL);
        CHECK(o != NULL && json_is_object(o));
        CHECK(strcmp(json_string_value(json_object_get(o, "status")), end.status) == 0);
        json_decref(o);
        swg_buf_free(&a);
    }
    swg_buf_free(&b);
    swg_resp_free(&r);
    n_ok++;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    if (data[0] % 2 == 0)
        parse_path(data + 1, size - 1);
    else
        items_path(data + 1, size - 1);
    return 0;
}
