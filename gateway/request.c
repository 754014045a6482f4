/* gateway/request.c -- the body of POST /v1/responses: parsed and checked
 * with jansson, into what the gateway sends to a worker. Pure: no I/O, no
 * globals. Unknown fields are ignored, as the OpenAI API does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/events.h"

static int
bad(swg_error *e, int http, const char *code, const char *param, const char *msg)
{
    e->http = http;
    e->type = http == 404 ? "not_found_error" : "invalid_request_error";
    e->code = code;
    e->param = param;
    snprintf(e->message, sizeof(e->message), "%s", msg);
    return -1;
}

/* Appends s (n bytes) to the prompt, with a newline between parts. */
static int
add_text(swg_input *in, const char *s, size_t n)
{
    size_t need = in->text_len + n + 2;
    char *nt = realloc(in->text, need);
    if (nt == NULL)
        return -1;
    in->text = nt;
    if (in->text_len > 0)
        in->text[in->text_len++] = '\n';
    memcpy(in->text + in->text_len, s, n);
    in->text_len += n;
    in->text[in->text_len] = '\0';
    return 0;
}

/* A message's content: a string, or an array of parts with a "text". */
static int
add_content(swg_input *in, json_t *content, swg_error *e)
{
    if (json_is_string(content))
        return add_text(in, json_string_value(content), json_string_length(content)) == 0
                   ? 0
                   : bad(e, 500, "server_error", NULL, "out of memory");
    if (json_is_array(content)) {
        size_t i;
        json_t *part;
        json_array_foreach(content, i, part)
        {
            json_t *t = json_object_get(part, "text");
            if (!json_is_object(part) || !json_is_string(t))
                return bad(e, 400, "invalid_value", "input",
                           "each content part must be an object with a string \"text\"");
            if (add_text(in, json_string_value(t), json_string_length(t)) != 0)
                return bad(e, 500, "server_error", NULL, "out of memory");
        }
        return 0;
    }
    return bad(e, 400, "invalid_type", "input",
               "a message's \"content\" must be a string or an array of text parts");
}

static unsigned
count_words(const char *s, size_t n)
{
    unsigned w = 0;
    int in = 0;
    for (size_t i = 0; i < n; i++) {
        int sp = s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r';
        if (!sp && !in)
            w++;
        in = !sp;
    }
    return w;
}

/* The Responses API's bounds on metadata (at most SWG_META_PAIRS pairs,
 * keys up to SWG_META_KEY bytes, string values up to SWG_META_VALUE): the
 * response object echoes it in several events, so a stream's round of
 * events stays bounded whatever the body. NULL if v is acceptable, else
 * why not. */
static const char *
metadata_bad(json_t *v)
{
    const char *key;
    json_t *val;
    if (!json_is_object(v))
        return "\"metadata\" must be an object";
    if (json_object_size(v) > SWG_META_PAIRS)
        return "\"metadata\" may have at most 16 keys";
    json_object_foreach(v, key, val)
    {
        if (strlen(key) > SWG_META_KEY)
            return "a \"metadata\" key may be at most 64 bytes long";
        if (!json_is_string(val) || json_string_length(val) > SWG_META_VALUE)
            return "a \"metadata\" value must be a string of at most 512 bytes";
    }
    return NULL;
}

int
swg_parse_request(const char *body, size_t len, swg_input *in, swg_error *e)
{
    json_error_t je;
    json_t *root, *v;
    memset(in, 0, sizeof(*in));
    memset(e, 0, sizeof(*e));
    root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL) {
        char msg[200];
        snprintf(msg, sizeof(msg), "the body is not valid JSON (UTF-8): %s", je.text);
        return bad(e, 400, "invalid_json", NULL, msg);
    }
    if (!json_is_object(root)) {
        json_decref(root);
        return bad(e, 400, "invalid_type", NULL, "the body must be a JSON object");
    }
    v = json_object_get(root, "model");
    if (!json_is_string(v) || json_string_length(v) == 0) {
        json_decref(root);
        return bad(e, 400, "missing_required_parameter", "model",
                   "\"model\" is required and must be a non-empty string");
    }
    if ((in->model = strdup(json_string_value(v))) == NULL)
        goto nomem;
    v = json_object_get(root, "input");
    if (json_is_string(v)) {
        if (add_text(in, json_string_value(v), json_string_length(v)) != 0)
            goto nomem;
    } else if (json_is_array(v) && json_array_size(v) > 0) {
        size_t i;
        json_t *msg;
        json_array_foreach(v, i, msg)
        {
            json_t *c = json_object_get(msg, "content");
            if (!json_is_object(msg) || c == NULL) {
                json_decref(root);
                swg_input_free(in);
                return bad(e, 400, "invalid_value", "input",
                           "each input message must be an object with \"content\"");
            }
            if (add_content(in, c, e) != 0) {
                json_decref(root);
                swg_input_free(in);
                return -1;
            }
        }
    } else {
        json_decref(root);
        swg_input_free(in);
        return bad(e, 400, "missing_required_parameter", "input",
                   "\"input\" is required: a string or a non-empty array of messages");
    }
    if (in->text == NULL && add_text(in, "", 0) != 0)
        goto nomem;
    v = json_object_get(root, "stream");
    if (v != NULL && !json_is_null(v) && !json_is_boolean(v)) {
        json_decref(root);
        swg_input_free(in);
        return bad(e, 400, "invalid_type", "stream", "\"stream\" must be a boolean");
    }
    in->stream = json_is_true(v);
    v = json_object_get(root, "max_output_tokens");
    if (v != NULL && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 ||
            json_integer_value(v) > 0x7fffffff) {
            json_decref(root);
            swg_input_free(in);
            return bad(e, 400, "invalid_value", "max_output_tokens",
                       "\"max_output_tokens\" must be an integer from 1 to 2147483647");
        }
        in->max_output_tokens = (uint32_t)json_integer_value(v);
    }
    v = json_object_get(root, "metadata");
    if (v != NULL && !json_is_null(v)) {
        const char *why = metadata_bad(v);
        if (why != NULL) {
            const char *code = json_is_object(v) ? "invalid_value" : "invalid_type";
            json_decref(root); /* (v with it) */
            swg_input_free(in);
            return bad(e, 400, code, "metadata", why);
        }
        in->metadata = json_incref(v);
    }
    in->input_tokens = count_words(in->text, in->text_len);
    json_decref(root);
    return 0;
nomem:
    json_decref(root);
    swg_input_free(in);
    return bad(e, 500, "server_error", NULL, "out of memory");
}

void
swg_input_free(swg_input *in)
{
    free(in->model);
    free(in->text);
    if (in->metadata != NULL)
        json_decref(in->metadata);
    memset(in, 0, sizeof(*in));
}
