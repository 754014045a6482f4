/* gateway/events.c -- Responses API objects and server-sent events,
 * written straight into a buffer. Pure: the caller owns every buffer. */
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

int
swg_utf8_fix(const char *s, size_t n, swg_buf *out)
{
    static const char repl[] = "\xef\xbf\xbd";
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0, run = 0;
    int ok = 1;
    while (i < n) {
        size_t k = utf8_len(p[i]);
        if (k == 1 || (k > 1 && i + k <= n && utf8_ok(p + i, k))) {
            i += k;
            continue;
        }
        ok = 0;
        swg_buf_add(out, s + run, i - run);
        swg_buf_add(out, repl, 3);
        run = ++i;
    }
    if (!ok)
        swg_buf_add(out, s + run, n - run);
    return ok;
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
            size_t j = i + 1;
            while (j < len && (p[j] & 0xc0) == 0x80)
                j++;
            if (j < len) { /* a byte that cannot continue it comes first */
                swg_buf_add(&r->text, repl, 3);
                i++;
                continue;
            }
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

/* ---------------------------------------------------------------- JSON out
 *
 * Every object the gateway sends is written here straight into the output
 * buffer, compact and in a fixed field order: jansson's pack and dump cost
 * more than the rest of the gateway's work per stream (perf: a fifth of the
 * event loop's time under 1,000 streams). Strings are escaped as jansson
 * escapes them; a string that is not valid UTF-8 (a worker's message) has
 * its bad bytes replaced by U+FFFD (a message cut at a byte limit may end
 * inside a character). jansson still reads request bodies and writes the
 * model list and a metrics item's JSON. */

static void
put(swg_buf *b, const char *lit)
{
    swg_buf_add(b, lit, strlen(lit));
}

/* s[0..n) as the body of a JSON string (no quotes), s valid UTF-8. */
static void
put_escaped(swg_buf *b, const char *s, size_t n)
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
        case '\b':
            esc[1] = 'b';
            break;
        case '\f':
            esc[1] = 'f';
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

/* "s" for any bytes: valid UTF-8 runs escaped, each bad byte as U+FFFD. */
static void
put_strn(swg_buf *b, const char *s, size_t n)
{
    static const char repl[] = "\xef\xbf\xbd";
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0, run = 0;
    swg_buf_add(b, "\"", 1);
    while (i < n) {
        size_t k = utf8_len(p[i]);
        if (k == 1 || (k > 1 && i + k <= n && utf8_ok(p + i, k))) {
            i += k;
            continue;
        }
        put_escaped(b, s + run, i - run);
        swg_buf_add(b, repl, 3);
        run = ++i;
    }
    put_escaped(b, s + run, n - run);
    swg_buf_add(b, "\"", 1);
}

static void
put_str(swg_buf *b, const char *s)
{
    put_strn(b, s ? s : "", s ? strlen(s) : 0);
}

static void
put_uint(swg_buf *b, unsigned long long v)
{
    char num[20]; /* 18446744073709551615 */
    size_t i = sizeof(num);
    do {
        num[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    swg_buf_add(b, num + i, sizeof(num) - i);
}

static void
put_int(swg_buf *b, long long v)
{
    if (v < 0) {
        swg_buf_add(b, "-", 1);
        put_uint(b, 0ULL - (unsigned long long)v);
    } else {
        put_uint(b, (unsigned long long)v);
    }
}

/* A content part: output_text or refusal, with its text. */
static void
put_part(swg_buf *b, int refusal, const char *text, size_t n)
{
    if (refusal) {
        put(b, "{\"type\":\"refusal\",\"refusal\":\"");
        put_escaped(b, text, n);
        put(b, "\"}");
    } else {
        put(b, "{\"type\":\"output_text\",\"text\":\"");
        put_escaped(b, text, n);
        put(b, "\",\"annotations\":[]}");
    }
}

static void
put_cur_part(swg_buf *b, const swg_resp *r)
{
    put_part(b, r->refusal, r->text.p ? r->text.p : "", r->text.len);
}

/* The message output item; its content is every part so far when with_content. */
static void
put_message(swg_buf *b, const swg_resp *r, const char *status, int with_content)
{
    put(b, "{\"id\":");
    put_str(b, r->msg_id);
    put(b, ",\"type\":\"message\",\"status\":");
    put_str(b, status);
    put(b, ",\"role\":\"assistant\",\"content\":[");
    if (with_content) {
        if (r->parts.len > 0) {
            swg_buf_add(b, r->parts.p, r->parts.len);
            swg_buf_add(b, ",", 1);
        }
        put_cur_part(b, r);
    }
    put(b, "]}");
}

void
swg_resp_free(swg_resp *r)
{
    swg_buf_free(&r->parts);
    swg_buf_free(&r->text);
    swg_buf_free(&r->delta_pre);
    free(r->meta_js);
    r->meta_js = NULL;
}

void
swg_response_write(swg_buf *b, swg_resp *r, const swg_end *end)
{
    const char *status = end ? end->status : "in_progress";
    put(b, "{\"id\":");
    put_str(b, r->id);
    put(b, ",\"object\":\"response\",\"created_at\":");
    put_int(b, (long long)r->created_at);
    put(b, ",\"status\":");
    put_str(b, status);
    put(b, ",\"model\":");
    put_str(b, r->model);
    put(b, ",\"metadata\":");
    if (r->metadata != NULL && r->meta_js == NULL)
        r->meta_js = json_dumps(r->metadata, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (r->metadata != NULL && r->meta_js == NULL)
        b->oom = 1;
    put(b, r->meta_js != NULL ? r->meta_js : "{}");
    put(b, ",\"output\":[");
    if (end != NULL && r->started)
        put_message(b, r, strcmp(status, "completed") == 0 ? "completed" : "incomplete", 1);
    put(b, "],\"usage\":");
    if (end != NULL) {
        put(b, "{\"input_tokens\":");
        put_uint(b, r->input_tokens);
        put(b, ",\"output_tokens\":");
        put_uint(b, r->items);
        put(b, ",\"total_tokens\":");
        put_uint(b, (unsigned long long)r->input_tokens + r->items);
        put(b, "}");
    } else {
        put(b, "null");
    }
    put(b, ",\"error\":");
    if (end != NULL && end->err_code != NULL) {
        put(b, "{\"code\":");
        put_str(b, end->err_code);
        put(b, ",\"message\":");
        put_str(b, end->err_message ? end->err_message : end->err_code);
        put(b, "}");
    } else {
        put(b, "null");
    }
    put(b, ",\"incomplete_details\":");
    if (end != NULL && end->inc_reason != NULL) {
        put(b, "{\"reason\":");
        put_str(b, end->inc_reason);
        put(b, "}");
    } else {
        put(b, "null");
    }
    put(b, "}");
}

void
swg_error_write(swg_buf *b, const swg_error *e)
{
    put(b, "{\"error\":{\"type\":");
    put_str(b, e->type);
    put(b, ",\"code\":");
    put_str(b, e->code);
    put(b, ",\"message\":");
    put_str(b, e->message);
    put(b, ",\"param\":");
    if (e->param != NULL)
        put_str(b, e->param);
    else
        put(b, "null");
    put(b, "}}");
}

/* An event's frame: ev_open, its fields (each ending with a comma), ev_close
 * (type and sequence_number last). b NULL: not streamed, nothing written
 * (and no sequence number used: none is ever shown). */
static void
ev_open(swg_buf *b, const char *type)
{
    put(b, "event: ");
    put(b, type);
    put(b, "\ndata: {");
}

static void
ev_close(swg_buf *b, swg_resp *r, const char *type)
{
    put(b, "\"type\":\"");
    put(b, type);
    put(b, "\",\"sequence_number\":");
    put_uint(b, (unsigned long long)r->seq++);
    put(b, "}\n\n");
}

/* {"response":{...},"type":T,...} */
static void
ev_response(swg_buf *b, swg_resp *r, const char *type, const swg_end *end)
{
    if (b == NULL)
        return;
    ev_open(b, type);
    put(b, "\"response\":");
    swg_response_write(b, r, end);
    put(b, ",");
    ev_close(b, r, type);
}

void
swg_sse_created(swg_buf *b, swg_resp *r)
{
    ev_response(b, r, "response.created", NULL);
    ev_response(b, r, "response.in_progress", NULL);
}

/* "item_id":...,"output_index":0,"content_index":N, */
static void
put_part_ref(swg_buf *b, const swg_resp *r)
{
    put(b, "\"item_id\":");
    put_str(b, r->msg_id);
    put(b, ",\"output_index\":0,\"content_index\":");
    put_uint(b, r->part);
    put(b, ",");
}

static void
part_added(swg_buf *b, swg_resp *r)
{
    if (b == NULL)
        return;
    ev_open(b, "response.content_part.added");
    put_part_ref(b, r);
    put(b, "\"part\":");
    put_part(b, r->refusal, "", 0);
    put(b, ",");
    ev_close(b, r, "response.content_part.added");
}

void
swg_sse_started(swg_buf *b, swg_resp *r)
{
    r->started = 1;
    if (b != NULL) {
        ev_open(b, "response.output_item.added");
        put(b, "\"output_index\":0,\"item\":");
        put_message(b, r, "in_progress", 0);
        put(b, ",");
        ev_close(b, r, "response.output_item.added");
    }
    part_added(b, r);
}

/* The per-token event. Its frame up to the text is the same for every
 * token of a part: written once per part (r->delta_pre), then copied. */
void
swg_sse_delta(swg_buf *b, swg_resp *r, const char *text, size_t n)
{
    const char *type = r->refusal ? "response.refusal.delta" : "response.output_text.delta";
    if (b == NULL)
        return;
    if (r->delta_pre.len == 0 || r->delta_part != r->part || r->delta_refusal != r->refusal) {
        r->delta_pre.len = 0;
        r->delta_part = r->part;
        r->delta_refusal = r->refusal;
        ev_open(&r->delta_pre, type);
        put_part_ref(&r->delta_pre, r);
        put(&r->delta_pre, "\"delta\":\"");
        if (r->delta_pre.oom) {
            b->oom = 1;
            return;
        }
    }
    swg_buf_add(b, r->delta_pre.p, r->delta_pre.len);
    put_escaped(b, text, n);
    put(b, "\",");
    ev_close(b, r, type);
}

/* The done events of the current part. */
static void
part_done(swg_buf *b, swg_resp *r)
{
    const char *t = r->text.p ? r->text.p : "";
    const char *type = r->refusal ? "response.refusal.done" : "response.output_text.done";
    if (b == NULL)
        return;
    ev_open(b, type);
    put_part_ref(b, r);
    put(b, r->refusal ? "\"refusal\":\"" : "\"text\":\"");
    put_escaped(b, t, r->text.len);
    put(b, "\",");
    ev_close(b, r, type);
    ev_open(b, "response.content_part.done");
    put_part_ref(b, r);
    put(b, "\"part\":");
    put_cur_part(b, r);
    put(b, ",");
    ev_close(b, r, "response.content_part.done");
}

/* A character cut off by the end of its part: U+FFFD, in the text and as
 * a delta, so the deltas always add up to the part's text. */
static void
carry_flush(swg_buf *b, swg_resp *r)
{
    static const char repl[] = "\xef\xbf\xbd";
    size_t off = r->text.len;
    if (r->ncarry == 0)
        return;
    r->ncarry = 0;
    swg_buf_add(&r->text, repl, 3);
    swg_sse_delta(b, r, r->text.p + off, 3);
}

void
swg_sse_switch(swg_buf *b, swg_resp *r, int refusal)
{
    carry_flush(b, r);
    part_done(b, r);
    if (r->parts.len > 0)
        swg_buf_add(&r->parts, ",", 1);
    put_cur_part(&r->parts, r);
    if (r->parts.oom) {
        if (b != NULL)
            b->oom = 1;
        r->text.oom = 1;
    }
    r->text.len = 0;
    if (r->text.p != NULL)
        r->text.p[0] = '\0';
    r->part++;
    r->refusal = refusal;
    part_added(b, r);
}

void
swg_sse_metrics(swg_buf *b, swg_resp *r, const void *data, size_t len)
{
    json_t *d;
    char *js;
    if (b == NULL)
        return;
    if ((d = json_loadb(data, len, JSON_DECODE_ANY, NULL)) != NULL) {
        js = json_dumps(d, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY);
        json_decref(d);
        if (js == NULL) {
            b->oom = 1;
            return;
        }
    } else {
        js = NULL; /* not JSON: its text as a string (bad UTF-8 replaced) */
    }
    ev_open(b, "metrics");
    put(b, "\"data\":");
    if (js != NULL)
        put(b, js);
    else
        put_strn(b, data, len);
    put(b, ",");
    ev_close(b, r, "metrics");
    free(js);
}

void
swg_sse_narration(swg_buf *b, swg_resp *r, const char *phase, const char *message)
{
    if (b == NULL)
        return;
    ev_open(b, "narration");
    put(b, "\"phase\":");
    put_str(b, phase);
    put(b, ",\"message\":");
    put_str(b, message);
    put(b, ",");
    ev_close(b, r, "narration");
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
        carry_flush(b, r);
        part_done(b, r);
        if (b == NULL)
            return;
        ev_open(b, "response.output_item.done");
        put(b, "\"output_index\":0,\"item\":");
        put_message(b, r, st, 1);
        put(b, ",");
        ev_close(b, r, "response.output_item.done");
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
    ev_response(b, r, type, end);
}

void
swg_sse_error(swg_buf *b, swg_resp *r, const char *code, const char *message)
{
    if (b == NULL)
        return;
    ev_open(b, "error");
    put(b, "\"code\":");
    put_str(b, code);
    put(b, ",\"message\":");
    put_str(b, message ? message : code);
    put(b, ",\"param\":null,");
    ev_close(b, r, "error");
}

void
swg_sse_keepalive(swg_buf *b)
{
    swg_buf_add(b, ": keep-alive\n\n", 14);
}
