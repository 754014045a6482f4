/* transport/subjects.c -- every sw.* subject is formatted and parsed here.
 * Every name that becomes part of a subject passes sw_validate_token
 * (common/names.c) first, so a wildcard, space or empty token can never
 * reach the server. */
#include <string.h>

#include "proto/sw_codec.h"
#include "transport/sw_transport.h"

/* A subject is built for every message: its pieces are measured (each
 * name checked by swi_token_len, sw_validate_token's table) and copied,
 * without a format walk. SW_EINVAL if a piece is 0 long (not a valid
 * name) or the whole does not fit in cap bytes with its NUL. */
typedef struct subj_part {
    const char *s;
    size_t n;
} subj_part;

#define LIT(x)           \
    {                    \
        x, sizeof(x) - 1 \
    }

static sw_err
subj_join(char *out, size_t cap, const subj_part *p, size_t np)
{
    size_t n = 0, at = 0;
    for (size_t i = 0; i < np; i++) {
        if (p[i].n == 0)
            return SW_EINVAL;
        n += p[i].n;
    }
    if (n >= cap)
        return SW_EINVAL;
    for (size_t i = 0; i < np; at += p[i].n, i++)
        memcpy(out + at, p[i].s, p[i].n);
    out[n] = '\0';
    return SW_OK;
}

#define SUBJ_JOIN(out, cap, ...)                          \
    subj_join(out, cap, (const subj_part[]){__VA_ARGS__}, \
              sizeof((const subj_part[]){__VA_ARGS__}) / sizeof(subj_part))

sw_err
swt_subject_request(char *out, size_t cap, const char *endpoint, const char *instance)
{
    size_t ne = sw_validate_endpoint(endpoint) == SW_OK ? strlen(endpoint) : 0;
    return SUBJ_JOIN(out, cap, LIT("sw.req."), {endpoint, ne}, LIT("."),
                     {instance, swi_token_len(instance)});
}

sw_err
swt_subject_control(char *out, size_t cap, const char *instance)
{
    return SUBJ_JOIN(out, cap, LIT("sw.ctl."), {instance, swi_token_len(instance)});
}

sw_err
swt_subject_response(char *out, size_t cap, const char *router, const char *reqhex)
{
    return SUBJ_JOIN(out, cap, LIT("sw.rsp."), {router, swi_token_len(router)}, LIT("."),
                     {reqhex, swi_token_len(reqhex)});
}

sw_err
swt_subject_response_wildcard(char *out, size_t cap, const char *router)
{
    return SUBJ_JOIN(out, cap, LIT("sw.rsp."), {router, swi_token_len(router)}, LIT(".*"));
}

sw_err
swt_subject_router(char *out, size_t cap, const char *router)
{
    return SUBJ_JOIN(out, cap, LIT("sw.rtr."), {router, swi_token_len(router)});
}

sw_err
swt_subject_beats(char *out, size_t cap, const char *router)
{
    return SUBJ_JOIN(out, cap, LIT("sw.rsp."), {router, swi_token_len(router)}, LIT(".hb"));
}

sw_err
swt_subject_probe_reply(char *out, size_t cap, const char *router, const char *instance)
{
    if (instance == NULL)
        return SUBJ_JOIN(out, cap, LIT("sw.prb."), {router, swi_token_len(router)}, LIT(".*"));
    return SUBJ_JOIN(out, cap, LIT("sw.prb."), {router, swi_token_len(router)}, LIT("."),
                     {instance, swi_token_len(instance)});
}

sw_err
swt_subject_live_reply(char *out, size_t cap, const char *instance, const char *router)
{
    if (router == NULL)
        return SUBJ_JOIN(out, cap, LIT("sw.lv."), {instance, swi_token_len(instance)}, LIT(".*"));
    return SUBJ_JOIN(out, cap, LIT("sw.lv."), {instance, swi_token_len(instance)}, LIT("."),
                     {router, swi_token_len(router)});
}

int
swt_is_live_reply_for(const char *subject, const char *router)
{
    char inst[SW_MAX_TOKEN + 1];
    const char *dot;
    size_t n;
    if (subject == NULL || router == NULL || strncmp(subject, "sw.lv.", 6) != 0)
        return 0;
    subject += 6;
    if ((dot = strchr(subject, '.')) == NULL || strcmp(dot + 1, router) != 0)
        return 0; /* (a router id has no '.': the subject ends with it) */
    n = (size_t)(dot - subject);
    if (n == 0 || n > SW_MAX_TOKEN)
        return 0;
    memcpy(inst, subject, n);
    inst[n] = '\0';
    return swi_token_len(inst) == n;
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

/* The last token of subject[n] is "hb". */
static int
swt_beats_n(const char *subject, size_t n)
{
    return n >= 3 && subject[n - 3] == '.' && subject[n - 2] == 'h' && subject[n - 1] == 'b';
}

int
swt_is_beats_subject(const char *subject)
{
    return subject != NULL && swt_beats_n(subject, strlen(subject));
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
    if (swt_prefix(subject, "sw.rsp.") && n > 10 && swt_beats_n(subject, n))
        return SWT_SUBJ_BEATS;
    if (swt_prefix(subject, "sw.prb."))
        return SWT_SUBJ_PROBE_REPLY;
    if (swt_prefix(subject, "sw.rtr."))
        return SWT_SUBJ_ROUTER;
    return SWT_SUBJ_OTHER;
}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
/* 16 lowercase hex digits at p into 8 bytes at v, 8 digits at a time in a
 * 64-bit word (each byte a lane; no lane carries into the next, since every
 * byte is checked below 0x80 first): 0, or -1 if any byte is not one of
 * 0-9 a-f. Once per received item: ~70 instructions where a table lookup
 * per digit took ~260 (issue 17). */
#define SWT_LANES(b) (0x0101010101010101ULL * (uint64_t)(b))
static int
swt_hex8(const unsigned char *p, uint8_t *v)
{
    for (int half = 0; half < 2; half++) {
        uint64_t x, digit, af, nib, t;
        uint32_t out;
        memcpy(&x, p + 8 * half, 8);
        if (x & SWT_LANES(0x80))
            return -1;
        /* a lane's high bit after adding 0x80 - lo: set iff the byte >= lo */
        digit = (x + SWT_LANES(0x80 - '0')) & ~(x + SWT_LANES(0x80 - '9' - 1));
        af = (x + SWT_LANES(0x80 - 'a')) & ~(x + SWT_LANES(0x80 - 'f' - 1));
        if (((digit | af) & SWT_LANES(0x80)) != SWT_LANES(0x80))
            return -1;
        /* '0'-'9': the low nibble; 'a'-'f' (bit 6 set): the low nibble + 9 */
        nib = (x & SWT_LANES(0x0f)) + ((x >> 6) & SWT_LANES(0x01)) * 9;
        /* the first digit of each pair (the lower byte) is the high nibble */
        t = ((nib & 0x000f000f000f000fULL) << 4) | ((nib >> 8) & 0x000f000f000f000fULL);
        t = (t | t >> 8) & 0x0000ffff0000ffffULL;
        t = (t | t >> 16) & 0x00000000ffffffffULL;
        out = (uint32_t)t;
        memcpy(v + 4 * half, &out, 4);
    }
    return 0;
}
#else
/* A hex digit's value + 1 (lowercase only, as we write them); 0 for any
 * other byte. */
static const int8_t swt_hexval[256] = {
    ['0'] = 1, ['1'] = 2,  ['2'] = 3,  ['3'] = 4,  ['4'] = 5,  ['5'] = 6,  ['6'] = 7,  ['7'] = 8,
    ['8'] = 9, ['9'] = 10, ['a'] = 11, ['b'] = 12, ['c'] = 13, ['d'] = 14, ['e'] = 15, ['f'] = 16,
};

static int
swt_hex8(const unsigned char *p, uint8_t *v)
{
    for (int i = 0; i < 8; i++) {
        int hi = swt_hexval[p[2 * i]], lo = swt_hexval[p[2 * i + 1]];
        if (hi == 0 || lo == 0)
            return -1;
        v[i] = (uint8_t)((hi - 1) << 4 | (lo - 1));
    }
    return 0;
}
#endif

/* The id of subject[n]: its last token, 2 * SW_REQUEST_ID_BYTES hex digits
 * after the last dot (a dot is no hex digit). */
static int
swt_id_n(const char *subject, size_t n, uint8_t id[SW_REQUEST_ID_BYTES])
{
    const unsigned char *p;
    uint8_t v[SW_REQUEST_ID_BYTES]; /* id is written only on success */
    _Static_assert(SW_REQUEST_ID_BYTES == 16, "two runs of 16 digits");
    if (n < 2 * SW_REQUEST_ID_BYTES + 1 || subject[n - 2 * SW_REQUEST_ID_BYTES - 1] != '.')
        return -1;
    p = (const unsigned char *)subject + n - 2 * SW_REQUEST_ID_BYTES;
    if (swt_hex8(p, v) != 0 || swt_hex8(p + 16, v + 8) != 0)
        return -1;
    memcpy(id, v, sizeof(v));
    return 0;
}

int
swt_response_subject_id(const char *subject, uint8_t id[SW_REQUEST_ID_BYTES])
{
    return subject != NULL ? swt_id_n(subject, strlen(subject), id) : -1;
}

swt_mux_kind
swt_mux_subject(const char *subject, uint8_t id[SW_REQUEST_ID_BYTES])
{
    size_t n = subject != NULL ? strlen(subject) : 0;
    if (n == 0)
        return SWT_MUX_OTHER;
    if (swt_beats_n(subject, n))
        return SWT_MUX_BEATS;
    return swt_id_n(subject, n, id) == 0 ? SWT_MUX_ID : SWT_MUX_OTHER;
}

/* A token of 1-20 decimal digits that fits 64 bits into *v: 0, or -1. */
static int
swt_u64_token(const char *p, size_t n, uint64_t *v)
{
    uint64_t x = 0;
    if (n == 0 || n > 20)
        return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned d = (unsigned char)p[i] - (unsigned char)'0';
        if (d > 9 || x > (UINT64_MAX - d) / 10)
            return -1;
        x = x * 10 + d;
    }
    *v = x;
    return 0;
}

int
swt_u64_parse(const char *s, uint64_t *v)
{
    size_t n = 0;
    if (s == NULL)
        return -1;
    while (n <= 20 && s[n] != '\0')
        n++;
    return s[n] == '\0' ? swt_u64_token(s, n, v) : -1;
}

#define SWT_ACK_TOKENS_MAX 16
int
swt_js_ack_parse(const char *reply, swt_js_ack *out)
{
    const char *tok[SWT_ACK_TOKENS_MAX];
    size_t len[SWT_ACK_TOKENS_MAX], nt = 0, first;
    const char *p = reply;
    swt_js_ack a;
    if (reply == NULL || strncmp(reply, "$JS.ACK.", 8) != 0)
        return -1;
    for (;;) { /* split at '.', at most SWT_ACK_TOKENS_MAX tokens */
        const char *q = p;
        while (*q != '\0' && *q != '.' && q - reply < SWT_SUBJECT_MAX)
            q++;
        if (q - reply >= SWT_SUBJECT_MAX || nt == SWT_ACK_TOKENS_MAX || q == p)
            return -1;
        tok[nt] = p;
        len[nt++] = (size_t)(q - p);
        if (*q == '\0')
            break;
        p = q + 1;
    }
    if (nt == 9)
        first = 4; /* $JS ACK stream consumer | delivered ... */
    else if (nt >= 11)
        first = 6; /* $JS ACK domain account stream consumer | ... (the rest ignored) */
    else
        return -1;
    if (swt_u64_token(tok[first], len[first], &a.delivered) != 0 ||
        swt_u64_token(tok[first + 1], len[first + 1], &a.stream_seq) != 0 ||
        swt_u64_token(tok[first + 2], len[first + 2], &a.consumer_seq) != 0 ||
        swt_u64_token(tok[first + 3], len[first + 3], &a.timestamp_ns) != 0 ||
        swt_u64_token(tok[first + 4], len[first + 4], &a.pending) != 0)
        return -1;
    *out = a;
    return 0;
}
