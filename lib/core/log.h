/* Logging with verbosity levels and a progress bar that only draws when
 * stderr is a terminal. The program name prefixes every line. */
#ifndef MKV_LOG_H
#define MKV_LOG_H

#include <stdint.h>

typedef enum { MKV_LOG_ERROR = 0, MKV_LOG_WARN = 1, MKV_LOG_INFO = 2, MKV_LOG_DEBUG = 3 } mkv_log_level;

void mkv_log_init(const char *progname);   /* basename is kept */
const char *mkv_progname(void);
void mkv_log_set_level(int level);         /* default MKV_LOG_WARN; -q -> ERROR, -v -> INFO, -vv -> DEBUG */
int mkv_log_get_level(void);
void mkv_log(mkv_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define mkv_warn(...)  mkv_log(MKV_LOG_WARN, __VA_ARGS__)
#define mkv_info(...)  mkv_log(MKV_LOG_INFO, __VA_ARGS__)
#define mkv_debug(...) mkv_log(MKV_LOG_DEBUG, __VA_ARGS__)

/* Progress bar on stderr; silent unless stderr is a tty and level >= WARN. */
typedef struct {
    const char *label;
    int64_t total;
    int64_t done;
    int enabled;
    int last_permille;
} mkv_progress;

void mkv_progress_start(mkv_progress *p, const char *label, int64_t total);
void mkv_progress_update(mkv_progress *p, int64_t done);
void mkv_progress_finish(mkv_progress *p);

#endif
