/* Error reporting: a status code plus one line of context. */
#include "core/mkv.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int vfail(mkv_error *err, mkv_status code, const char *fmt, va_list ap)
{
    if (err) {
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    }
    return code;
}

int mkv_fail(mkv_error *err, mkv_status code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(err, code, fmt, ap);
    va_end(ap);
    return code;
}

int mkv_fail_errno(mkv_error *err, mkv_status code, int errno_value, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(err, code, fmt, ap);
    va_end(ap);
    if (err) {
        size_t len = strlen(err->msg);
        snprintf(err->msg + len, sizeof err->msg - len, ": %s", strerror(errno_value));
    }
    return code;
}

int mkv_error_prefix(mkv_error *err, const char *fmt, ...)
{
    if (!err)
        return MKV_OK;
    char prefix[MKV_ERRMSG_MAX], old[MKV_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    snprintf(err->msg, sizeof err->msg, "%s: %s", prefix, old);
    return err->code;
}

void mkv_error_clear(mkv_error *err)
{
    if (err) {
        err->code = MKV_OK;
        err->msg[0] = '\0';
    }
}

int mkv_exit_code(mkv_status code)
{
    switch (code) {
    case MKV_OK: return 0;
    case MKV_EUSAGE: return 2;
    default: return 1;
    }
}
