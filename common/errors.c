/* common/errors.c -- sw_strerror, sw_err_name and friends, generated from
 * SW_ERR_MAP so the code, the name and the sentence cannot drift apart. */
#include <string.h>

#include "common/sw_common.h"

extern const char *swt_nats_status_text(int status) __attribute__((weak));

int
sw_err_is_nats(int err)
{
    return err > SW_ENATS_BASE && err < SW_ENATS_BASE + SWI_NATS_STATUS_MAX;
}

int
sw_err_nats_status(int err)
{
    return sw_err_is_nats(err) ? err - SW_ENATS_BASE : 0;
}

const char *
sw_strerror(int err)
{
    switch (err) {
#define SW__ERR_STR(name, val, str, msg) \
    case val:                            \
        return msg;
        SW_ERR_MAP(SW__ERR_STR)
#undef SW__ERR_STR
    default:
        break;
    }
    if (sw_err_is_nats(err)) {
        /* The text comes from transport/ (the only layer that knows nats.c);
         * a program that links no transport (the fuzzer) gets the generic one. */
        int st = sw_err_nats_status(err);
        const char *t = swt_nats_status_text ? swt_nats_status_text(st) : NULL;
        return t != NULL ? t : "NATS client error";
    }
    return "unknown error";
}

const char *
sw_err_name(int err)
{
    switch (err) {
#define SW__ERR_NAME(name, val, str, msg) \
    case val:                             \
        return str;
        SW_ERR_MAP(SW__ERR_NAME)
#undef SW__ERR_NAME
    default:
        break;
    }
    if (sw_err_is_nats(err))
        return "nats_error";
    return "unknown_error";
}

sw_err
sw_err_from_name(const char *name, sw_err *out)
{
    if (name == NULL || out == NULL)
        return SW_EINVAL;
#define SW__ERR_PARSE(n, val, str, msg) \
    if (strcmp(name, str) == 0) {       \
        *out = (sw_err)val;             \
        return SW_OK;                   \
    }
    SW_ERR_MAP(SW__ERR_PARSE)
#undef SW__ERR_PARSE
    return SW_EINVAL;
}

int
sw_err_is_stream_reason(int err)
{
    /* a defined code of the range only: an undefined one is no reason (the
     * router's metrics wrote one "unknown_error" series for each of the 90
     * undefined values, the same series over and over in one scrape) */
    switch (err) {
#define SW__ERR_REASON(name, val, str, msg) \
    case val:                               \
        return val >= 100 && val < 200;
        SW_ERR_MAP(SW__ERR_REASON)
#undef SW__ERR_REASON
    default:
        return 0;
    }
}

const char *
sw_status_name(int status)
{
    switch (status) {
    case 1:
        return "completed";
    case 2:
        return "incomplete";
    case 3:
        return "failed";
    case 4:
        return "cancelled";
    case 5:
        return "error";
    default:
        return "unknown";
    }
}
