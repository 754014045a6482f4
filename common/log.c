/* common/log.c -- the only way the library speaks: into a user sink. */
#include <stdio.h>

#include "common/sw_common.h"

const char *
sw_log_level_name(sw_log_level level)
{
    switch (level) {
    case SW_LOG_ERROR:
        return "error";
    case SW_LOG_WARN:
        return "warn";
    case SW_LOG_INFO:
        return "info";
    case SW_LOG_DEBUG:
        return "debug";
    }
    return "unknown";
}

void
swi_log(const swi_logger *lg, sw_log_level lvl, const char *fmt, ...)
{
    char buf[512];
    va_list ap;

    if (lg == NULL || lg->fn == NULL)
        return;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    lg->fn(lg->arg, lvl, buf);
}
