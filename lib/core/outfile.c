/* Output files: temporary plus rename for regular files, write-through for
 * everything else, stale temporaries removed, signals that clean up. */
#include "config.h"
#include "core/outfile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TMP_TAG ".mkvtmp."
/* longest part of the target's name kept in its temporary's name, so that
 * the temporary's name stays within NAME_MAX */
#define TMP_BASE_MAX 200
#define MAX_LINK_HOPS 40

/* ---------------------------------------------------------------- signals */

/* Temporaries to remove if the process is interrupted. */
#define MAX_TEMPS 16
static char *volatile g_temps[MAX_TEMPS];

static void on_fatal_signal(int sig)
{
    for (int i = 0; i < MAX_TEMPS; i++)
        if (g_temps[i])
            unlink(g_temps[i]);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Catch the signals that end a run, each only where it still has its
 * default action: one inherited as ignored (nohup, trap '' HUP) stays
 * ignored, and a handler the program installed itself stays. */
static void install_handlers(void)
{
    static int installed;
    if (installed)
        return;
    installed = 1;
    const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction old;
        if (sigaction(sigs[i], NULL, &old) != 0 || (old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL)
            continue;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_fatal_signal;
        sigemptyset(&sa.sa_mask);
        sigaction(sigs[i], &sa, NULL);
    }
}

static void track_temp(char *path)
{
    for (int i = 0; i < MAX_TEMPS; i++)
        if (!g_temps[i]) {
            g_temps[i] = path;
            return;
        }
}

static void untrack_temp(const char *path)
{
    for (int i = 0; i < MAX_TEMPS; i++)
        if (g_temps[i] == path)
            g_temps[i] = NULL;
}

/* ---------------------------------------------------------------- names */

/* The directory part of path ("." when it has none) and its last component. */
static int split_path(const char *path, char **dir, const char **base)
{
    const char *slash = strrchr(path, '/');
    if (!slash) {
        *dir = strdup(".");
        *base = path;
    } else {
        size_t n = slash == path ? 1 : (size_t)(slash - path);
        *dir = strndup(path, n);
        *base = slash + 1;
    }
    return *dir ? 0 : ENOMEM;
}

/* The descriptor number when path names one of this process's own open
 * descriptors (/proc/self/fd/N; /dev/fd/N and /dev/stdout lead there),
 * else -1. */
static int own_descriptor(const char *path)
{
    char *dir;
    const char *base;
    if (split_path(path, &dir, &base))
        return -1;
    int fd = -1;
    size_t digits = strspn(base, "0123456789");
    if (digits > 0 && digits < 10 && base[digits] == '\0') {
        char own[64];
        snprintf(own, sizeof own, "/proc/%ld/fd", (long)getpid());
        char *real = realpath(dir, NULL);
        if (real && strcmp(real, own) == 0)
            fd = atoi(base);
        free(real);
    }
    free(dir);
    return fd;
}

/* Follow symbolic links from path to the name they finally lead to, which
 * need not exist (a dangling link), or to one of this process's open
 * descriptors (*fd >= 0, else -1). Returns 0 or an errno value. */
static int resolve_links(const char *path, char **out, int *fd)
{
    char *cur = strdup(path);
    if (!cur)
        return ENOMEM;
    for (int hops = 0;; hops++) {
        struct stat st;
        if ((*fd = own_descriptor(cur)) >= 0 || lstat(cur, &st) != 0 || !S_ISLNK(st.st_mode)) {
            *out = cur;
            return 0;
        }
        if (hops == MAX_LINK_HOPS) {
            free(cur);
            return ELOOP;
        }
        char link[PATH_MAX];
        ssize_t n = readlink(cur, link, sizeof link - 1);
        if (n < 0) {
            int e = errno;
            free(cur);
            return e;
        }
        link[n] = '\0';
        char *next;
        const char *slash = strrchr(cur, '/');
        if (link[0] == '/' || !slash) {
            next = strdup(link);
        } else {
            size_t dlen = (size_t)(slash - cur) + 1;
            next = malloc(dlen + (size_t)n + 1);
            if (next) {
                memcpy(next, cur, dlen);
                memcpy(next + dlen, link, (size_t)n + 1);
            }
        }
        free(cur);
        if (!next)
            return ENOMEM;
        cur = next;
    }
}

/* ".BASE.mkvtmp." for target's last component BASE (cut to TMP_BASE_MAX). */
static char *tmp_prefix(const char *base)
{
    size_t blen = strnlen(base, TMP_BASE_MAX);
    size_t len = 1 + blen + sizeof TMP_TAG;
    char *p = malloc(len);
    if (p)
        snprintf(p, len, ".%.*s%s", (int)blen, base, TMP_TAG);
    return p;
}

/* The process id in a temporary's name after its prefix ("PID.XXXXXX"),
 * or 0 when the rest is not of that form. */
static long tmp_name_pid(const char *rest)
{
    char *end;
    if (*rest < '1' || *rest > '9')
        return 0;
    errno = 0;
    long pid = strtol(rest, &end, 10);
    if (errno || *end != '.' || strlen(end + 1) != 6)
        return 0;
    for (const char *c = end + 1; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9')))
            return 0;
    return pid;
}

int mkv_outfile_remove_stale(const char *target)
{
    char *dir;
    const char *base;
    if (split_path(target, &dir, &base))
        return 0;
    char *prefix = tmp_prefix(base);
    DIR *d = prefix ? opendir(dir) : NULL;
    int removed = 0;
    if (d) {
        size_t plen = strlen(prefix);
        time_t now = time(NULL);
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strncmp(e->d_name, prefix, plen) != 0)
                continue;
            long pid = tmp_name_pid(e->d_name + plen);
            if (pid <= 0 || pid > INT_MAX || pid == (long)getpid())
                continue;
            if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
                continue;
            size_t len = strlen(dir) + strlen(e->d_name) + 2;
            char *full = malloc(len);
            if (!full)
                break;
            snprintf(full, len, "%s/%s", dir, e->d_name);
            struct stat st;
            if (lstat(full, &st) == 0 && S_ISREG(st.st_mode) &&
                now - st.st_mtime >= MKV_OUTFILE_STALE_SECONDS && unlink(full) == 0)
                removed++;
            free(full);
        }
        closedir(d);
    }
    free(prefix);
    free(dir);
    return removed;
}

/* ---------------------------------------------------------------- output */

/* The same name in the same directory, whether or not it exists yet. */
static int same_entry(const char *a, const char *b)
{
    char *da = NULL, *db = NULL;
    const char *na, *nb;
    struct stat sa, sb;
    int same = !split_path(a, &da, &na) && !split_path(b, &db, &nb) && na[0] && strcmp(na, nb) == 0 &&
               stat(da, &sa) == 0 && stat(db, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    free(da);
    free(db);
    return same;
}

int mkv_outfile_overwrites(const char *path, const char *input)
{
    if (!input || strcmp(path, "-") == 0 || strcmp(input, "-") == 0)
        return 0;
    struct stat sp, si;
    return strcmp(path, input) == 0 ||
           (stat(path, &sp) == 0 && stat(input, &si) == 0 && sp.st_dev == si.st_dev && sp.st_ino == si.st_ino) ||
           same_entry(path, input);
}

static int fail_write(const mkv_outfile *o, int errno_value, mkv_error *err)
{
    if (o->is_stdout)
        return mkv_fail_errno(err, MKV_EIO, errno_value ? errno_value : EIO, "cannot write standard output");
    return mkv_fail_errno(err, MKV_EIO, errno_value ? errno_value : EIO, "cannot write '%s'", o->name);
}

/* Write through fd, which becomes the output's. */
static int attach_stream(mkv_outfile *o, int fd, int flags, mkv_error *err)
{
    if ((flags & MKV_OUTFILE_BINARY) && isatty(fd)) {
        close(fd);
        return mkv_fail(err, MKV_EUSAGE, "refusing to write binary output to terminal '%s'", o->name);
    }
    o->fp = fdopen(fd, "w");
    if (!o->fp) {
        int e = errno;
        close(fd);
        return mkv_fail_errno(err, MKV_EIO, e, "cannot create '%s'", o->name);
    }
    return MKV_OK;
}

/* A destination that cannot be replaced (a device, a FIFO): open it and
 * write through. */
static int open_through(mkv_outfile *o, const char *target, int flags, mkv_error *err)
{
    int fd = open(target, O_WRONLY | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return mkv_fail_errno(err, MKV_EIO, errno, "cannot create '%s'", o->name);
    return attach_stream(o, fd, flags, err);
}

/* One of the process's own descriptors: write through a duplicate of it,
 * which shares its offset and flags (O_APPEND from >>), whatever it is. */
static int open_descriptor(mkv_outfile *o, int which, int flags, mkv_error *err)
{
    if (which == STDOUT_FILENO)
        fflush(stdout);
    int fd = fcntl(which, F_DUPFD_CLOEXEC, 3);
    if (fd < 0)
        return mkv_fail_errno(err, MKV_EIO, errno, "cannot create '%s'", o->name);
    return attach_stream(o, fd, flags, err);
}

/* A regular file or a new name: a temporary beside o->target, the file
 * the name finally leads to. */
static int open_temporary(mkv_outfile *o, mkv_error *err)
{
    mkv_outfile_remove_stale(o->target);

    char *dir;
    const char *base;
    if (split_path(o->target, &dir, &base))
        return mkv_fail(err, MKV_ENOMEM, "out of memory");
    char *prefix = tmp_prefix(base);
    size_t len = strlen(dir) + (prefix ? strlen(prefix) : 0) + 32;
    o->tmp_path = prefix ? malloc(len) : NULL;
    if (o->tmp_path)
        snprintf(o->tmp_path, len, "%s/%s%ld.XXXXXX", dir, prefix, (long)getpid());
    free(prefix);
    free(dir);
    if (!o->tmp_path)
        return mkv_fail(err, MKV_ENOMEM, "out of memory");

    int fd = mkstemp(o->tmp_path);
    if (fd < 0) {
        int e = errno;
        free(o->tmp_path);
        o->tmp_path = NULL;
        return mkv_fail_errno(err, MKV_EIO, e, "cannot create '%s'", o->name);
    }
    track_temp(o->tmp_path);
    /* mkstemp makes the file 0600; an output gets the usual umask mode */
    mode_t mask = umask(0);
    umask(mask);
    if (fchmod(fd, 0666 & ~mask) != 0 || !(o->fp = fdopen(fd, "w"))) {
        int e = errno;
        close(fd);
        return mkv_fail_errno(err, MKV_EIO, e, "cannot create '%s'", o->name);
    }
    return MKV_OK;
}

int mkv_outfile_open(mkv_outfile *o, const char *path, const char *protect, int flags, mkv_error *err)
{
    memset(o, 0, sizeof *o);
    install_handlers();
    if (strcmp(path, "-") == 0) {
        if ((flags & MKV_OUTFILE_BINARY) && isatty(STDOUT_FILENO))
            return mkv_fail(err, MKV_EUSAGE,
                            "refusing to write binary output to a terminal (use -o FILE or a pipe)");
        o->is_stdout = 1;
        o->fp = stdout;
        return MKV_OK;
    }
    if (mkv_outfile_overwrites(path, protect))
        return mkv_fail(err, MKV_EUSAGE, "output '%s' would overwrite the input", path);
    o->name = strdup(path);
    if (!o->name)
        return mkv_fail(err, MKV_ENOMEM, "out of memory");

    char *target;
    int descriptor, rc;
    int e = resolve_links(path, &target, &descriptor);
    if (e) {
        rc = mkv_fail_errno(err, MKV_EIO, e, "cannot create '%s'", path);
    } else if (descriptor >= 0) {
        free(target);
        rc = open_descriptor(o, descriptor, flags, err);
    } else {
        struct stat st;
        if (stat(target, &st) == 0 && !S_ISREG(st.st_mode)) {
            rc = S_ISDIR(st.st_mode) ? mkv_fail_errno(err, MKV_EIO, EISDIR, "cannot create '%s'", path)
                                     : open_through(o, target, flags, err);
            free(target);
        } else {
            o->target = target;
            rc = open_temporary(o, err);
        }
    }
    if (rc)
        mkv_outfile_abort(o);
    return rc;
}

FILE *mkv_outfile_fp(const mkv_outfile *o) { return o->fp; }

const char *mkv_outfile_seekable_path(const mkv_outfile *o) { return o->tmp_path; }

int mkv_outfile_write(mkv_outfile *o, const void *buf, size_t n, mkv_error *err)
{
    errno = 0;
    if (fwrite(buf, 1, n, o->fp) != n)
        return fail_write(o, errno, err);
    return MKV_OK;
}

/* fsync the directory holding path, so that a rename into it is durable. */
static void sync_directory(const char *path)
{
    char *dir;
    const char *base;
    if (split_path(path, &dir, &base))
        return;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    free(dir);
}

int mkv_outfile_commit(mkv_outfile *o, mkv_error *err)
{
    int rc = MKV_OK;
    errno = 0;
    if (fflush(o->fp) != 0 || ferror(o->fp))
        rc = fail_write(o, errno, err);
    if (o->is_stdout) {
        o->fp = NULL;
        mkv_outfile_abort(o);
        return rc;
    }
    if (!rc && o->tmp_path && fsync(fileno(o->fp)) != 0)
        rc = fail_write(o, errno, err);
    FILE *fp = o->fp;
    o->fp = NULL;
    if (fclose(fp) != 0 && !rc)
        rc = fail_write(o, errno, err);
    if (!rc && o->tmp_path) {
        if (rename(o->tmp_path, o->target) != 0) {
            rc = fail_write(o, errno, err);
        } else {
            untrack_temp(o->tmp_path);
            free(o->tmp_path);
            o->tmp_path = NULL;
            sync_directory(o->target);
        }
    }
    mkv_outfile_abort(o);
    return rc;
}

void mkv_outfile_abort(mkv_outfile *o)
{
    if (o->fp && !o->is_stdout)
        fclose(o->fp);
    if (o->tmp_path) {
        unlink(o->tmp_path);
        untrack_temp(o->tmp_path);
        free(o->tmp_path);
    }
    free(o->target);
    free(o->name);
    memset(o, 0, sizeof *o);
}
