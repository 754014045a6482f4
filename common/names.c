/* common/names.c -- validation of the names that become subject tokens:
 * instance ids, router ids and endpoints. Used by the codec (proto/) and by
 * the subject builders (transport/), so it lives below both. Also the W3C
 * traceparent parser and the tag log lines give a stream. */
#include <stdio.h>
#include <string.h>

#include "common/sw_common.h"

/* [A-Za-z0-9_-]: 1 for the characters a token may hold. A table, because
 * every subject built for a message checks its tokens. */
static const unsigned char swi_token_char[256] = {
    ['0'] = 1, ['1'] = 1, ['2'] = 1, ['3'] = 1, ['4'] = 1, ['5'] = 1, ['6'] = 1, ['7'] = 1,
    ['8'] = 1, ['9'] = 1, ['a'] = 1, ['b'] = 1, ['c'] = 1, ['d'] = 1, ['e'] = 1, ['f'] = 1,
    ['g'] = 1, ['h'] = 1, ['i'] = 1, ['j'] = 1, ['k'] = 1, ['l'] = 1, ['m'] = 1, ['n'] = 1,
    ['o'] = 1, ['p'] = 1, ['q'] = 1, ['r'] = 1, ['s'] = 1, ['t'] = 1, ['u'] = 1, ['v'] = 1,
    ['w'] = 1, ['x'] = 1, ['y'] = 1, ['z'] = 1, ['A'] = 1, ['B'] = 1, ['C'] = 1, ['D'] = 1,
    ['E'] = 1, ['F'] = 1, ['G'] = 1, ['H'] = 1, ['I'] = 1, ['J'] = 1, ['K'] = 1, ['L'] = 1,
    ['M'] = 1, ['N'] = 1, ['O'] = 1, ['P'] = 1, ['Q'] = 1, ['R'] = 1, ['S'] = 1, ['T'] = 1,
    ['U'] = 1, ['V'] = 1, ['W'] = 1, ['X'] = 1, ['Y'] = 1, ['Z'] = 1, ['_'] = 1, ['-'] = 1};

size_t
swi_token_len(const char *t)
{
    size_t n = 0;
    if (t == NULL)
        return 0;
    for (; t[n] != '\0'; n++)
        if (n >= SW_MAX_TOKEN || !swi_token_char[(unsigned char)t[n]])
            return 0;
    return n;
}

sw_err
sw_validate_token(const char *t)
{
    return swi_token_len(t) != 0 ? SW_OK : SW_EINVAL;
}

sw_err
sw_validate_endpoint(const char *e)
{
    size_t tok = 0;
    int parts = 1;
    if (e == NULL)
        return SW_EINVAL;
    for (; *e != '\0'; e++) {
        if (*e == '.') {
            if (tok == 0)
                return SW_EINVAL;
            tok = 0;
            parts++;
            continue;
        }
        if (tok >= SW_MAX_TOKEN || !swi_token_char[(unsigned char)*e])
            return SW_EINVAL;
        tok++;
    }
    return parts == 3 && tok > 0 ? SW_OK : SW_EINVAL;
}

static int
swi_lower_hex(const char *s, size_t n, int *all_zero)
{
    *all_zero = 1;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return 0;
        if (c != '0')
            *all_zero = 0;
    }
    return 1;
}

int
swi_trace_id(const char *tp, char out[SWI_TRACE_ID_LEN + 1])
{
    int zero;
    out[0] = '\0';
    /* 2 + 1 + 32 + 1 + 16 + 1 + 2 = 55; later versions may append "-..." */
    if (tp == NULL || strlen(tp) < 55 || tp[2] != '-' || tp[35] != '-' || tp[52] != '-')
        return 0;
    if (!swi_lower_hex(tp, 2, &zero) || (tp[0] == 'f' && tp[1] == 'f'))
        return 0;
    /* version 00 is exactly 55 long; a later one may go on after a '-' */
    if (tp[55] != '\0' && ((tp[0] == '0' && tp[1] == '0') || tp[55] != '-'))
        return 0;
    if (!swi_lower_hex(tp + 3, 32, &zero) || zero)
        return 0;
    {
        int pzero;
        if (!swi_lower_hex(tp + 36, 16, &pzero) || pzero || !swi_lower_hex(tp + 53, 2, &zero))
            return 0;
    }
    memcpy(out, tp + 3, 32);
    out[32] = '\0';
    return 1;
}

void
swi_logtag(char out[SWI_LOGTAG_MAX], const char *idhex, const char *trace_id)
{
    size_t n = swi_strlcpy(out, idhex, SWI_LOGTAG_MAX);
    if (trace_id != NULL && trace_id[0] != '\0' && n + 1 < SWI_LOGTAG_MAX) {
        n += swi_strlcpy(out + n, " trace=", SWI_LOGTAG_MAX - n);
        if (n + 1 < SWI_LOGTAG_MAX)
            swi_strlcpy(out + n, trace_id, SWI_LOGTAG_MAX - n);
    }
}
