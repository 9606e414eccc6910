/* Error reporting: a status code plus one line of context. */
#include "core/mkv.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Messages quote names read from files (a GGUF key, a tensor name): a
 * control character there is written as an escape (\n, \t, \r, \xNN), so
 * a message stays one line and cannot reach the terminal as a control
 * sequence. What does not fit is cut. */
static void one_line(char *msg, size_t size)
{
    size_t i = 0;
    while (msg[i] && (unsigned char)msg[i] >= 0x20 && msg[i] != 0x7f)
        i++;
    if (!msg[i])
        return;
    char out[MKV_ERRMSG_MAX];
    size_t o = 0, cap = size < sizeof out ? size : sizeof out;
    memcpy(out, msg, i);
    o = i;
    for (; msg[i] && o + 1 < cap; i++) {
        unsigned char c = (unsigned char)msg[i];
        char esc[5];
        size_t n;
        if (c >= 0x20 && c != 0x7f) {
            esc[0] = (char)c;
            n = 1;
        } else if (c == '\n' || c == '\t' || c == '\r') {
            esc[0] = '\\';
            esc[1] = c == '\n' ? 'n' : c == '\t' ? 't' : 'r';
            n = 2;
        } else {
            snprintf(esc, sizeof esc, "\\x%02x", c);
            n = 4;
        }
        if (o + n >= cap)
            break;
        memcpy(out + o, esc, n);
        o += n;
    }
    out[o] = '\0';
    memcpy(msg, out, o + 1);
}

static int vfail(mkv_error *err, mkv_status code, const char *fmt, va_list ap)
{
    if (err) {
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        one_line(err->msg, sizeof err->msg);
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
    one_line(err->msg, sizeof err->msg);
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
