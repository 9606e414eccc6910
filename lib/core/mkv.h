/* libmosaickv: shared status codes and error reporting.
 *
 * Library functions never exit or print errors themselves: they return a
 * status and fill an mkv_error with a one-line message that already carries
 * its context (file name, dataset, parameter).  The tool prefixes its own
 * name and decides the exit code (mkv_exit_code).
 */
#ifndef MKV_H
#define MKV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    MKV_OK = 0,
    MKV_EUSAGE,   /* bad option or parameter value (exit 2) */
    MKV_EIO,      /* cannot open/read/write a file */
    MKV_EFORMAT,  /* input is not what it should be: wrong format, shape, NaN */
    MKV_ENOMEM,   /* allocation failed or size overflow */
    MKV_EGPU,     /* CUDA error, no usable GPU */
    MKV_EUNSUP    /* valid input this build does not support */
} mkv_status;

#define MKV_ERRMSG_MAX 1024

typedef struct {
    mkv_status code;
    char msg[MKV_ERRMSG_MAX];
} mkv_error;

/* Set err (if non-NULL) to code and a printf-formatted message; returns code. */
int mkv_fail(mkv_error *err, mkv_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Like mkv_fail, appending ": strerror(errno_value)". */
int mkv_fail_errno(mkv_error *err, mkv_status code, int errno_value, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Prepend context to an existing message: "ctx: old message". */
int mkv_error_prefix(mkv_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void mkv_error_clear(mkv_error *err);

/* Exit code a tool uses for a status: 0 ok, 2 usage, 1 everything else. */
int mkv_exit_code(mkv_status code);

#ifdef __cplusplus
}
#endif
#endif
