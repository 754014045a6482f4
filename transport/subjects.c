/* transport/subjects.c -- every sw.* subject is formatted and parsed here.
 * Every name that becomes part of a subject passes sw_validate_token
 * (common/names.c) first, so a wildcard, space or empty token can never
 * reach the server. */
#include <stdio.h>
#include <string.h>

#include "proto/sw_codec.h"
#include "transport/sw_transport.h"

static sw_err
swt_fmt_check(int n, size_t cap)
{
    return (n < 0 || (size_t)n >= cap) ? SW_EINVAL : SW_OK;
}

sw_err
swt_subject_request(char *out, size_t cap, const char *endpoint, const char *instance)
{
    if (sw_validate_endpoint(endpoint) != SW_OK || sw_validate_token(instance) != SW_OK)
        return SW_EINVAL;
    return swt_fmt_check(snprintf(out, cap, "sw.req.%s.%s", endpoint, instance), cap);
}

sw_err
swt_subject_control(char *out, size_t cap, const char *instance)
{
    if (sw_validate_token(instance) != SW_OK)
        return SW_EINVAL;
    return swt_fmt_check(snprintf(out, cap, "sw.ctl.%s", instance), cap);
}

sw_err
swt_subject_response(char *out, size_t cap, const char *router, const char *reqhex)
{
    if (sw_validate_token(router) != SW_OK || sw_validate_token(reqhex) != SW_OK)
        return SW_EINVAL;
    return swt_fmt_check(snprintf(out, cap, "sw.rsp.%s.%s", router, reqhex), cap);
}

sw_err
swt_subject_response_wildcard(char *out, size_t cap, const char *router)
{
    if (sw_validate_token(router) != SW_OK)
        return SW_EINVAL;
    return swt_fmt_check(snprintf(out, cap, "sw.rsp.%s.*", router), cap);
}

sw_err
swt_subject_router(char *out, size_t cap, const char *router)
{
    if (sw_validate_token(router) != SW_OK)
        return SW_EINVAL;
    return swt_fmt_check(snprintf(out, cap, "sw.rtr.%s", router), cap);
}

sw_err
swt_subject_beats(char *out, size_t cap, const char *router)
{
    if (sw_validate_token(router) != SW_OK)
        return SW_EINVAL;
    return swt_fmt_check(snprintf(out, cap, "sw.rsp.%s.hb", router), cap);
}

sw_err
swt_subject_probe_reply(char *out, size_t cap, const char *router, const char *instance)
{
    if (sw_validate_token(router) != SW_OK)
        return SW_EINVAL;
    if (instance == NULL)
        return swt_fmt_check(snprintf(out, cap, "sw.prb.%s.*", router), cap);
    if (sw_validate_token(instance) != SW_OK)
        return SW_EINVAL;
    return swt_fmt_check(snprintf(out, cap, "sw.prb.%s.%s", router, instance), cap);
}

sw_err
swt_subject_live_reply(char *out, size_t cap, const char *instance, const char *router)
{
    if (sw_validate_token(instance) != SW_OK)
        return SW_EINVAL;
    if (router == NULL)
        return swt_fmt_check(snprintf(out, cap, "sw.lv.%s.*", instance), cap);
    if (sw_validate_token(router) != SW_OK)
        return SW_EINVAL;
    return swt_fmt_check(snprintf(out, cap, "sw.lv.%s.%s", instance, router), cap);
}

int
swt_is_response_subject(const char *subject)
{
    return subject != NULL && strncmp(subject, "sw.rsp.", 7) == 0 && swp_valid_subject(subject);
}

const char *
swt_subject_last_token(const char *subject)
{
    const char *last = subject ? strrchr(subject, '.') : NULL;
    return last != NULL && last[1] != '\0' ? last + 1 : NULL;
}

int
swt_is_beats_subject(const char *subject)
{
    size_t n = subject ? strlen(subject) : 0;
    return n >= 3 && memcmp(subject + n - 3, ".hb", 3) == 0; /* the last token is "hb" */
}

static int
swt_prefix(const char *s, const char *p)
{
    return strncmp(s, p, strlen(p)) == 0;
}

swt_subject_kind
swt_subject_kind_of(const char *subject)
{
    size_t n;
    if (subject == NULL)
        return SWT_SUBJ_OTHER;
    n = strlen(subject);
    if (swt_prefix(subject, "sw.req."))
        return SWT_SUBJ_REQUEST;
    if (swt_prefix(subject, "sw.ctl."))
        return SWT_SUBJ_CONTROL;
    if (swt_prefix(subject, "sw.lv."))
        return SWT_SUBJ_LIVE_REPLY;
    if (swt_prefix(subject, "sw.rsp.") && n > 10 && strcmp(subject + n - 3, ".hb") == 0)
        return SWT_SUBJ_BEATS;
    if (swt_prefix(subject, "sw.prb."))
        return SWT_SUBJ_PROBE_REPLY;
    if (swt_prefix(subject, "sw.rtr."))
        return SWT_SUBJ_ROUTER;
    return SWT_SUBJ_OTHER;
}

/* A hex digit's value + 1 (lowercase only, as we write them); 0 for any
 * other byte. */
static const int8_t swt_hexval[256] = {
    ['0'] = 1, ['1'] = 2,  ['2'] = 3,  ['3'] = 4,  ['4'] = 5,  ['5'] = 6,  ['6'] = 7,  ['7'] = 8,
    ['8'] = 9, ['9'] = 10, ['a'] = 11, ['b'] = 12, ['c'] = 13, ['d'] = 14, ['e'] = 15, ['f'] = 16,
};

int
swt_response_subject_id(const char *subject, uint8_t id[SW_REQUEST_ID_BYTES])
{
    /* The last token is the id: 2 * SW_REQUEST_ID_BYTES hex digits after
     * the last dot (a dot is no hex digit). Once per received item: one
     * length and a table lookup per digit (was strrchr, strlen and a
     * branchy decode, ~400 instructions). */
    size_t n = subject ? strlen(subject) : 0;
    const unsigned char *p;
    uint8_t v[SW_REQUEST_ID_BYTES]; /* id is written only on success */
    if (n < 2 * SW_REQUEST_ID_BYTES + 1 || subject[n - 2 * SW_REQUEST_ID_BYTES - 1] != '.')
        return -1;
    p = (const unsigned char *)subject + n - 2 * SW_REQUEST_ID_BYTES;
    for (int i = 0; i < SW_REQUEST_ID_BYTES; i++) {
        int hi = swt_hexval[p[2 * i]], lo = swt_hexval[p[2 * i + 1]];
        if (hi == 0 || lo == 0)
            return -1;
        v[i] = (uint8_t)((hi - 1) << 4 | (lo - 1));
    }
    memcpy(id, v, sizeof(v));
    return 0;
}
