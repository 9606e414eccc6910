/* Messages on stderr prefixed by the program name, filtered by verbosity;
 * a progress bar drawn only on a terminal. */
#include "core/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char *g_progname = "mosaickv";
static int g_level = MKV_LOG_WARN;

void mkv_log_init(const char *progname)
{
    if (progname) {
        const char *slash = strrchr(progname, '/');
        g_progname = slash ? slash + 1 : progname;
        /* libtool-style wrappers prefix "lt-" to the real binary */
        if (strncmp(g_progname, "lt-", 3) == 0)
            g_progname += 3;
    }
}

const char *mkv_progname(void) { return g_progname; }
void mkv_log_set_level(int level) { g_level = level; }
int mkv_log_get_level(void) { return g_level; }

void mkv_log(mkv_log_level level, const char *fmt, ...)
{
    if ((int)level > g_level)
        return;
    static const char *tag[] = {"", "warning: ", "", "debug: "};
    fprintf(stderr, "%s: %s", g_progname, tag[level]);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

void mkv_progress_start(mkv_progress *p, const char *label, int64_t total)
{
    p->label = label;
    p->total = total > 0 ? total : 1;
    p->done = 0;
    p->last_permille = -1;
    p->enabled = g_level >= MKV_LOG_WARN && isatty(STDERR_FILENO);
    mkv_progress_update(p, 0);
}

void mkv_progress_update(mkv_progress *p, int64_t done)
{
    p->done = done;
    if (!p->enabled)
        return;
    int permille = (int)(1000 * (done < p->total ? done : p->total) / p->total);
    if (permille == p->last_permille)
        return;
    p->last_permille = permille;
    enum { WIDTH = 30 };
    char bar[WIDTH + 1];
    int fill = permille * WIDTH / 1000;
    for (int i = 0; i < WIDTH; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[WIDTH] = '\0';
    fprintf(stderr, "\r%s: %s [%s] %5.1f%%", g_progname, p->label, bar, permille / 10.0);
    fflush(stderr);
}

void mkv_progress_finish(mkv_progress *p)
{
    if (!p->enabled)
        return;
    mkv_progress_update(p, p->total);
    fputc('\n', stderr);
    p->enabled = 0;
}
