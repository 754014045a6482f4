/* gateway/events.h -- the gateway's pure parts: the request body
 * (request.c) and the JSON of Responses API objects and server-sent events
 * (events.c). No I/O; testable without a server (tests/unit/test_gateway.c). */
#ifndef SW_GATEWAY_EVENTS_H
#define SW_GATEWAY_EVENTS_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

/* ---------------------------------------------------------------- request */

typedef struct swg_input {
    char *model;
    char *text; /* the prompt: the string input, or the messages' texts joined by "\n" */
    size_t text_len;
    int stream;
    uint32_t max_output_tokens; /* 0 = unset */
    json_t *metadata;           /* NULL or an object (a reference) */
    unsigned input_tokens;      /* whitespace-separated words of the prompt */
} swg_input;

/* An OpenAI-style error: {"error":{"type","code","message","param"}} and an
 * HTTP status. */
typedef struct swg_error {
    int http;
    const char *type;
    const char *code;
    const char *param; /* NULL = null */
    char message[256];
} swg_error;

/* 0 and *in filled (free with swg_input_free), or -1 and *e filled. */
/* `metadata`'s bounds (the Responses API's): pairs, key bytes, value bytes. */
#define SWG_META_PAIRS 16
#define SWG_META_KEY 64
#define SWG_META_VALUE 512
int swg_parse_request(const char *body, size_t len, swg_input *in, swg_error *e);
void swg_input_free(swg_input *in);

/* ---------------------------------------------------------------- output */

typedef struct swg_buf {
    char *p;
    size_t len, cap;
    int oom;
} swg_buf;

void swg_buf_add(swg_buf *b, const char *s, size_t n);
void swg_buf_free(swg_buf *b);
/* 1 if s[0..n) is valid UTF-8; else 0, and out gets s with each byte that
 * starts no well-formed character as U+FFFD (NUL-terminated; out->oom if
 * it could not be written). */
int swg_utf8_fix(const char *s, size_t n, swg_buf *out);

/* One response as the events describe it. */
typedef struct swg_resp {
    char id[48];     /* resp_<request id> */
    char msg_id[48]; /* msg_<request id> */
    const char *model;
    int64_t created_at;
    uint64_t seq;     /* the next sequence_number */
    swg_buf text;     /* output text so far (valid UTF-8) */
    uint8_t carry[4]; /* the start of a UTF-8 character split across items */
    size_t ncarry;
    unsigned items; /* output tokens: data items */
    unsigned input_tokens;
    json_t *metadata;  /* borrowed; may be NULL */
    char *meta_js;     /* metadata as JSON, written once; owned */
    int started;       /* the output item and content part were announced */
    int refusal;       /* the current content part is a refusal (else output_text) */
    unsigned part;     /* the current part's content_index */
    swg_buf parts;     /* the finished parts before it, as JSON joined by commas */
    swg_buf delta_pre; /* a delta event's frame up to its text, for this part */
    unsigned delta_part;
    int delta_refusal;
} swg_resp;

/* How a response ended. */
typedef struct swg_end {
    const char *status;      /* completed, incomplete, failed, cancelled */
    const char *inc_reason;  /* incomplete_details.reason, or NULL */
    const char *err_code;    /* error.code for failed, or NULL */
    const char *err_message; /* may be NULL */
} swg_end;

/* Appends the response object (id, object, created_at, status, model,
 * metadata, output, usage, error, incomplete_details) as compact JSON. */
void swg_response_write(swg_buf *b, swg_resp *r, const swg_end *end /* NULL: in progress */);
/* Appends {"error":{"type","code","message","param"}}; any bytes in the
 * strings (bad UTF-8 becomes U+FFFD). */
void swg_error_write(swg_buf *b, const swg_error *e);

/* Appends a data item's bytes to the output text (an incomplete UTF-8
 * character waits for the next item; invalid bytes become U+FFFD), and
 * returns the text added (in r->text from *off, *n bytes). */
void swg_resp_add(swg_resp *r, const void *data, size_t len, size_t *off, size_t *n);

/* Server-sent events, appended to b as "event: T\ndata: JSON\n\n" with
 * type and sequence_number set. b may be NULL (a response that is not
 * streamed): the state in r changes all the same and nothing is written.
 * The text of a part goes out as response.output_text.delta, or as
 * response.refusal.delta when r->refusal is set for the part (set it before
 * swg_sse_started; swg_sse_switch starts a part of the other kind). */
void swg_sse_created(swg_buf *b, swg_resp *r); /* created + in_progress */
void swg_sse_started(swg_buf *b, swg_resp *r); /* output_item.added + content_part.added */
void swg_sse_delta(swg_buf *b, swg_resp *r, const char *text, size_t n);
void swg_sse_end(swg_buf *b, swg_resp *r, const swg_end *end);      /* the done events + terminal */
void swg_sse_done(swg_buf *b, swg_resp *r, const swg_end *end);     /* the done events */
void swg_sse_terminal(swg_buf *b, swg_resp *r, const swg_end *end); /* the terminal event */
void swg_sse_error(swg_buf *b, swg_resp *r, const char *code, const char *message);
/* Ends the current content part (its done events) and starts the next one,
 * a refusal part if refusal, else output_text. */
void swg_sse_switch(swg_buf *b, swg_resp *r, int refusal);
/* A `metrics` event: {"type","sequence_number","data"}, data the item's JSON
 * (or its text as a string when it is not JSON). */
void swg_sse_metrics(swg_buf *b, swg_resp *r, const void *data, size_t len);
/* A `narration` event: {"type","sequence_number","phase","message"};
 * phase is start, cancel or end. */
void swg_sse_narration(swg_buf *b, swg_resp *r, const char *phase, const char *message);
/* Frees what r owns (the finished parts and the text). */
void swg_resp_free(swg_resp *r);
void swg_sse_keepalive(swg_buf *b);

#endif
