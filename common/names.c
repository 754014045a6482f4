/* common/names.c -- validation of the names that become subject tokens:
 * instance ids, router ids and endpoints. Used by the codec (proto/) and by
 * the subject builders (transport/), so it lives below both. */
#include <string.h>

#include "common/sw_common.h"

sw_err
sw_validate_token(const char *t)
{
    size_t n = 0;
    if (t == NULL || *t == '\0')
        return SW_EINVAL;
    for (; *t; t++, n++) {
        char ch = *t;
        if (n >= SW_MAX_TOKEN)
            return SW_EINVAL;
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '_' || ch == '-'))
            return SW_EINVAL;
    }
    return SW_OK;
}

sw_err
sw_validate_endpoint(const char *e)
{
    char tok[SW_MAX_TOKEN + 1];
    int parts = 0;
    if (e == NULL)
        return SW_EINVAL;
    for (;;) {
        const char *dot = strchr(e, '.');
        size_t n = dot ? (size_t)(dot - e) : strlen(e);
        if (n == 0 || n > SW_MAX_TOKEN)
            return SW_EINVAL;
        memcpy(tok, e, n);
        tok[n] = '\0';
        if (sw_validate_token(tok) != SW_OK)
            return SW_EINVAL;
        parts++;
        if (dot == NULL)
            break;
        e = dot + 1;
    }
    return parts == 3 ? SW_OK : SW_EINVAL;
}
