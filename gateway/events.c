/* gateway/events.c -- Responses API objects and server-sent events, built
 * with jansson. Pure: the caller owns every buffer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/events.h"

void
swg_buf_add(swg_buf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t ncap = b->cap ? b->cap : 512;
        char *np;
        while (ncap < b->len + n + 1)
            ncap *= 2;
        if ((np = realloc(b->p, ncap)) == NULL) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = ncap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void
swg_buf_free(swg_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

/* Length of the UTF-8 sequence starting with byte c (0 if c cannot start one). */
static size_t
utf8_len(uint8_t c)
{
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        return 2;
    if (c >= 0xe0 && c <= 0xef)
        return 3;
    if (c >= 0xf0 && c <= 0xf4)
        return 4;
    return 0;
}

/* 1 if p[0..n) is one well-formed UTF-8 character. */
static int
utf8_ok(const uint8_t *p, size_t n)
{
    uint32_t cp;
    for (size_t i = 1; i < n; i++)
        if ((p[i] & 0xc0) != 0x80)
            return 0;
    if (n == 2)
        return 1;
    if (n == 3) {
        cp = ((uint32_t)(p[0] & 0x0f) << 12) | ((uint32_t)(p[1] & 0x3f) << 6) | (p[2] & 0x3f);
        return cp >= 0x800 && (cp < 0xd800 || cp > 0xdfff);
    }
    cp = ((uint32_t)(p[0] & 0x07) << 18) | ((uint32_t)(p[1] & 0x3f) << 12) |
         ((uint32_t)(p[2] & 0x3f) << 6) | (p[3] & 0x3f);
    return cp >= 0x10000 && cp <= 0x10ffff;
}

void
swg_resp_add(swg_resp *r, const void *data, size_t len, size_t *off, size_t *n)
{
    static const char repl[] = "\xef\xbf\xbd";
    const uint8_t *p = data;
    size_t i = 0;
    *off = r->text.len;
    r->items++;
    /* finish a character carried from the last item */
    while (r->ncarry > 0 && i < len) {
        size_t want = utf8_len(r->carry[0]);
        if ((p[i] & 0xc0) != 0x80) {
            swg_buf_add(&r->text, repl, 3);
            r->ncarry = 0;
            break;
        }
        r->carry[r->ncarry++] = p[i++];
        if (r->ncarry == want) {
            if (utf8_ok(r->carry, want))
                swg_buf_add(&r->text, (const char *)r->carry, want);
            else
                swg_buf_add(&r->text, repl, 3);
            r->ncarry = 0;
        }
    }
    while (i < len) {
        size_t k = utf8_len(p[i]);
        if (k == 0) {
            swg_buf_add(&r->text, repl, 3);
            i++;
        } else if (i + k > len) { /* split across items: keep for the next */
            memcpy(r->carry, p + i, len - i);
            r->ncarry = len - i;
            i = len;
        } else if (k == 1 || utf8_ok(p + i, k)) {
            swg_buf_add(&r->text, (const char *)p + i, k);
            i += k;
        } else {
            swg_buf_add(&r->text, repl, 3);
            i++;
        }
    }
    *n = r->text.len - *off;
}

static json_t *
text_part(const char *text, size_t n)
{
    return json_pack("{s:s, s:s%, s:[]}", "type", "output_text", "text", text ? text : "", n,
                     "annotations");
}

static json_t *
refusal_part(const char *text, size_t n)
{
    return json_pack("{s:s, s:s%}", "type", "refusal", "refusal", text ? text : "", n);
}

/* The current part as it stands. */
static json_t *
cur_part(const swg_resp *r)
{
    return r->refusal ? refusal_part(r->text.p, r->text.len) : text_part(r->text.p, r->text.len);
}

static json_t *
message_item(const swg_resp *r, const char *status, int with_content)
{
    json_t *content = json_array();
    if (with_content) {
        if (r->parts != NULL)
            json_array_extend(content, r->parts);
        json_array_append_new(content, cur_part(r));
    }
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", r->msg_id, "type", "message", "status",
                     status, "role", "assistant", "content", content);
}

void
swg_resp_free(swg_resp *r)
{
    json_decref(r->parts);
    r->parts = NULL;
    swg_buf_free(&r->text);
}

json_t *
swg_response_json(const swg_resp *r, const swg_end *end)
{
    const char *status = end ? end->status : "in_progress";
    json_t *o = json_pack(
        "{s:s, s:s, s:I, s:s, s:s, s:o, s:o}", "id", r->id, "object", "response", "created_at",
        (json_int_t)r->created_at, "status", status, "model", r->model ? r->model : "", "metadata",
        r->metadata ? json_incref(r->metadata) : json_object(), "output", json_array());
    if (o == NULL)
        return NULL;
    if (end != NULL && r->started)
        json_array_append_new(
            json_object_get(o, "output"),
            message_item(r, strcmp(status, "completed") == 0 ? "completed" : "incomplete", 1));
    if (end != NULL)
        json_object_set_new(o, "usage",
                            json_pack("{s:i, s:i, s:i}", "input_tokens", (int)r->input_tokens,
                                      "output_tokens", (int)r->items, "total_tokens",
                                      (int)(r->input_tokens + r->items)));
    else
        json_object_set_new(o, "usage", json_null());
    if (end != NULL && end->err_code != NULL)
        json_object_set_new(o, "error",
                            json_pack("{s:s, s:s}", "code", end->err_code, "message",
                                      end->err_message ? end->err_message : end->err_code));
    else
        json_object_set_new(o, "error", json_null());
    if (end != NULL && end->inc_reason != NULL)
        json_object_set_new(o, "incomplete_details", json_pack("{s:s}", "reason", end->inc_reason));
    else
        json_object_set_new(o, "incomplete_details", json_null());
    return o;
}

json_t *
swg_error_json(const swg_error *e)
{
    return json_pack("{s:{s:s, s:s, s:s, s:s?}}", "error", "type", e->type, "code", e->code,
                     "message", e->message, "param", e->param);
}

/* Sets type and sequence_number, appends the frame, frees ev. */
static void
sse(swg_buf *b, swg_resp *r, const char *type, json_t *ev)
{
    char *js;
    if (b == NULL) { /* not streamed: nothing to write */
        json_decref(ev);
        return;
    }
    if (ev == NULL) {
        b->oom = 1;
        return;
    }
    json_object_set_new(ev, "type", json_string(type));
    json_object_set_new(ev, "sequence_number", json_integer((json_int_t)r->seq++));
    js = json_dumps(ev, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(ev);
    if (js == NULL) {
        b->oom = 1;
        return;
    }
    swg_buf_add(b, "event: ", 7);
    swg_buf_add(b, type, strlen(type));
    swg_buf_add(b, "\ndata: ", 7);
    swg_buf_add(b, js, strlen(js));
    swg_buf_add(b, "\n\n", 2);
    free(js);
}

void
swg_sse_created(swg_buf *b, swg_resp *r)
{
    sse(b, r, "response.created", json_pack("{s:o}", "response", swg_response_json(r, NULL)));
    sse(b, r, "response.in_progress", json_pack("{s:o}", "response", swg_response_json(r, NULL)));
}

void
swg_sse_started(swg_buf *b, swg_resp *r)
{
    r->started = 1;
    sse(b, r, "response.output_item.added",
        json_pack("{s:i, s:o}", "output_index", 0, "item", message_item(r, "in_progress", 0)));
    sse(b, r, "response.content_part.added",
        json_pack("{s:s, s:i, s:i, s:o}", "item_id", r->msg_id, "output_index", 0, "content_index",
                  (int)r->part, "part", r->refusal ? refusal_part("", 0) : text_part("", 0)));
}

/* Appends s[0..n) as a JSON string body (no quotes): s is valid UTF-8
 * (swg_resp_add made it so); ", \ and control characters are escaped. */
static void
json_escape_into(swg_buf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[6];
        size_t elen = 2;
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        swg_buf_add(b, s + run, i - run);
        run = i + 1;
        esc[0] = '\\';
        switch (c) {
        case '"':
            esc[1] = '"';
            break;
        case '\\':
            esc[1] = '\\';
            break;
        case '\n':
            esc[1] = 'n';
            break;
        case '\r':
            esc[1] = 'r';
            break;
        case '\t':
            esc[1] = 't';
            break;
        default:
            esc[1] = 'u';
            esc[2] = '0';
            esc[3] = '0';
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            elen = 6;
            break;
        }
        swg_buf_add(b, esc, elen);
    }
    swg_buf_add(b, s + run, n - run);
}

/* The per-token event, written by hand (the one event per item: jansson's
 * pack and dump cost more than the rest of the gateway's work per token).
 * Same fields and order as the other events. */
void
swg_sse_delta(swg_buf *b, swg_resp *r, const char *text, size_t n)
{
    const char *type = r->refusal ? "response.refusal.delta" : "response.output_text.delta";
    char num[96];
    int k;
    if (b == NULL)
        return;
    swg_buf_add(b, "event: ", 7);
    swg_buf_add(b, type, strlen(type));
    swg_buf_add(b, "\ndata: {\"item_id\":\"", 19);
    swg_buf_add(b, r->msg_id, strlen(r->msg_id));
    k = snprintf(num, sizeof(num), "\",\"output_index\":0,\"content_index\":%u,\"delta\":\"",
                 r->part);
    swg_buf_add(b, num, (size_t)k);
    json_escape_into(b, text, n);
    swg_buf_add(b, "\",\"type\":\"", 10);
    swg_buf_add(b, type, strlen(type));
    k = snprintf(num, sizeof(num), "\",\"sequence_number\":%llu}\n\n",
                 (unsigned long long)r->seq++);
    swg_buf_add(b, num, (size_t)k);
}

/* The done events of the current part. */
static void
part_done(swg_buf *b, swg_resp *r)
{
    const char *t = r->text.p ? r->text.p : "";
    if (r->refusal)
        sse(b, r, "response.refusal.done",
            json_pack("{s:s, s:i, s:i, s:s%}", "item_id", r->msg_id, "output_index", 0,
                      "content_index", (int)r->part, "refusal", t, r->text.len));
    else
        sse(b, r, "response.output_text.done",
            json_pack("{s:s, s:i, s:i, s:s%}", "item_id", r->msg_id, "output_index", 0,
                      "content_index", (int)r->part, "text", t, r->text.len));
    sse(b, r, "response.content_part.done",
        json_pack("{s:s, s:i, s:i, s:o}", "item_id", r->msg_id, "output_index", 0, "content_index",
                  (int)r->part, "part", cur_part(r)));
}

void
swg_sse_switch(swg_buf *b, swg_resp *r, int refusal)
{
    static const char repl[] = "\xef\xbf\xbd";
    if (r->ncarry > 0) { /* a character cut off by the switch */
        swg_buf_add(&r->text, repl, 3);
        r->ncarry = 0;
    }
    part_done(b, r);
    if (r->parts == NULL)
        r->parts = json_array();
    if (r->parts == NULL || json_array_append_new(r->parts, cur_part(r)) != 0) {
        if (b != NULL)
            b->oom = 1;
        r->text.oom = 1;
    }
    r->text.len = 0;
    if (r->text.p != NULL)
        r->text.p[0] = '\0';
    r->part++;
    r->refusal = refusal;
    sse(b, r, "response.content_part.added",
        json_pack("{s:s, s:i, s:i, s:o}", "item_id", r->msg_id, "output_index", 0, "content_index",
                  (int)r->part, "part", refusal ? refusal_part("", 0) : text_part("", 0)));
}

void
swg_sse_metrics(swg_buf *b, swg_resp *r, const void *data, size_t len)
{
    json_t *d = json_loadb(data, len, JSON_DECODE_ANY, NULL);
    if (d == NULL)
        d = json_stringn(data, len); /* NULL unless valid UTF-8 */
    sse(b, r, "metrics", json_pack("{s:o}", "data", d != NULL ? d : json_null()));
}

void
swg_sse_narration(swg_buf *b, swg_resp *r, const char *phase, const char *message)
{
    sse(b, r, "narration", json_pack("{s:s, s:s}", "phase", phase, "message", message));
}

void
swg_sse_end(swg_buf *b, swg_resp *r, const swg_end *end)
{
    swg_sse_done(b, r, end);
    swg_sse_terminal(b, r, end);
}

void
swg_sse_done(swg_buf *b, swg_resp *r, const swg_end *end)
{
    if (r->started) {
        const char *st = strcmp(end->status, "completed") == 0 ? "completed" : "incomplete";
        part_done(b, r);
        sse(b, r, "response.output_item.done",
            json_pack("{s:i, s:o}", "output_index", 0, "item", message_item(r, st, 1)));
    }
}

void
swg_sse_terminal(swg_buf *b, swg_resp *r, const swg_end *end)
{
    const char *type;
    if (strcmp(end->status, "completed") == 0)
        type = "response.completed";
    else if (strcmp(end->status, "failed") == 0)
        type = "response.failed";
    else
        type = "response.incomplete"; /* incomplete, and cancelled (reason "cancelled") */
    sse(b, r, type, json_pack("{s:o}", "response", swg_response_json(r, end)));
}

void
swg_sse_error(swg_buf *b, swg_resp *r, const char *code, const char *message)
{
    sse(b, r, "error",
        json_pack("{s:s, s:s, s:n}", "code", code, "message", message ? message : code, "param"));
}

void
swg_sse_keepalive(swg_buf *b)
{
    swg_buf_add(b, ": keep-alive\n\n", 14);
}
