/* Unit tests of core/outfile: a regular file is replaced by rename, a
 * symbolic link keeps pointing at the file it names, a FIFO and a device
 * are written through and stay what they are, write errors on a device
 * are reported, stale temporaries of dead processes go, and an ignored
 * signal stays ignored. Expected contents and names are written out by
 * hand below. */
#include "config.h"
#include "core/outfile.h"
#include "core/log.h"
#include "testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/time.h>
#include <sys/wait.h>

static char *read_text(const char *path)
{
    static char buf[4096];
    FILE *fp = fopen(path, "r");
    if (!fp)
        return NULL;
    size_t n = fread(buf, 1, sizeof buf - 1, fp);
    fclose(fp);
    buf[n] = '\0';
    return buf;
}

static void write_text(const char *path, const char *text)
{
    FILE *fp = fopen(path, "w");
    ck_assert_ptr_nonnull(fp);
    fputs(text, fp);
    ck_assert_int_eq(fclose(fp), 0);
}

/* Write text to path through an outfile and commit it. */
static int put_text(const char *path, const char *text, mkv_error *err)
{
    mkv_outfile o;
    int rc = mkv_outfile_open(&o, path, NULL, 0, err);
    if (rc)
        return rc;
    fputs(text, mkv_outfile_fp(&o));
    return mkv_outfile_commit(&o, err);
}

static char *make_dir(const char *name)
{
    static char dir[256];
    test_path(dir, sizeof dir, name);
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    return dir;
}

START_TEST(regular_file_by_rename)
{
    char path[300], tmpl[300];
    mkv_error err;
    const char *dir = make_dir("regular");
    snprintf(path, sizeof path, "%s/out.tsv", dir);
    write_text(path, "old\n");

    mkv_outfile o;
    ck_assert_int_eq(mkv_outfile_open(&o, path, NULL, 0, &err), MKV_OK);
    /* the temporary: ".out.tsv.mkvtmp.PID.XXXXXX" beside the target */
    snprintf(tmpl, sizeof tmpl, "%s/.out.tsv.mkvtmp.%ld.", dir, (long)getpid());
    const char *tmp = mkv_outfile_seekable_path(&o);
    ck_assert_ptr_nonnull(tmp);
    ck_assert_int_eq(strncmp(tmp, tmpl, strlen(tmpl)), 0);
    ck_assert_uint_eq(strlen(tmp), strlen(tmpl) + 6);
    ck_assert_int_eq(test_count_entries(dir), 2);
    fputs("new\n", mkv_outfile_fp(&o));
    ck_assert_str_eq(read_text(path), "old\n");
    ck_assert_int_eq(mkv_outfile_commit(&o, &err), MKV_OK);
    ck_assert_str_eq(read_text(path), "new\n");
    ck_assert_int_eq(test_count_entries(dir), 1);

    /* abandoned: the old file stays, the temporary goes */
    ck_assert_int_eq(mkv_outfile_open(&o, path, NULL, 0, &err), MKV_OK);
    fputs("half", mkv_outfile_fp(&o));
    mkv_outfile_abort(&o);
    mkv_outfile_abort(&o);
    ck_assert_str_eq(read_text(path), "new\n");
    ck_assert_int_eq(test_count_entries(dir), 1);

    /* a new name in a missing directory, a directory, the input itself */
    char missing[320];
    snprintf(missing, sizeof missing, "%s/no/such.tsv", dir);
    ck_assert_int_eq(mkv_outfile_open(&o, missing, NULL, 0, &err), MKV_EIO);
    char want[700];
    snprintf(want, sizeof want, "cannot create '%s': No such file or directory", missing);
    ck_assert_str_eq(err.msg, want);
    ck_assert_int_eq(mkv_outfile_open(&o, dir, NULL, 0, &err), MKV_EIO);
    snprintf(want, sizeof want, "cannot create '%s': Is a directory", dir);
    ck_assert_str_eq(err.msg, want);
    ck_assert_int_eq(mkv_outfile_open(&o, path, path, 0, &err), MKV_EUSAGE);
    snprintf(want, sizeof want, "output '%s' would overwrite the input", path);
    ck_assert_str_eq(err.msg, want);
    ck_assert_int_eq(test_count_entries(dir), 1);
}
END_TEST

/* Two names of one file, existing or not yet created. */
START_TEST(same_file_told_apart)
{
    const char *dir = make_dir("names");
    char a[300], b[300], c[300], sub[300];
    snprintf(a, sizeof a, "%s/t.tsv", dir);
    snprintf(b, sizeof b, "%s/./t.tsv", dir);
    snprintf(c, sizeof c, "%s/u.tsv", dir);
    snprintf(sub, sizeof sub, "%s/sub", dir);
    ck_assert_int_eq(mkdir(sub, 0755), 0);
    /* not created yet: the same directory and name, or not */
    ck_assert(mkv_outfile_overwrites(a, b));
    ck_assert(!mkv_outfile_overwrites(a, c));
    snprintf(b, sizeof b, "%s/sub/../t.tsv", dir);
    ck_assert(mkv_outfile_overwrites(b, a));
    snprintf(b, sizeof b, "%s/sub/t.tsv", dir);
    ck_assert(!mkv_outfile_overwrites(b, a));
    /* existing, and a hard link under another name */
    write_text(a, "x\n");
    ck_assert_int_eq(link(a, c), 0);
    ck_assert(mkv_outfile_overwrites(c, a));
    ck_assert(!mkv_outfile_overwrites(a, NULL) && !mkv_outfile_overwrites("-", "-"));
    /* a name without a directory is in "." */
    ck_assert(mkv_outfile_overwrites("t.tsv", "./t.tsv"));
    ck_assert(!mkv_outfile_overwrites("t.tsv", "t.tsv/"));
}
END_TEST

START_TEST(symlink_keeps_pointing)
{
    char target[300], link[300], chain[300], dangling[300], created[300];
    mkv_error err;
    const char *dir = make_dir("links");
    snprintf(target, sizeof target, "%s/target.tsv", dir);
    snprintf(link, sizeof link, "%s/link.tsv", dir);
    snprintf(chain, sizeof chain, "%s/chain.tsv", dir);
    snprintf(dangling, sizeof dangling, "%s/dangling.tsv", dir);
    snprintf(created, sizeof created, "%s/sub/created.tsv", dir);
    write_text(target, "old\n");
    ck_assert_int_eq(symlink("target.tsv", link), 0);
    ck_assert_int_eq(symlink(link, chain), 0); /* absolute, to a relative one */
    snprintf(created, sizeof created, "%s/sub", dir);
    ck_assert_int_eq(mkdir(created, 0755), 0);
    snprintf(created, sizeof created, "%s/sub/created.tsv", dir);
    ck_assert_int_eq(symlink("sub/created.tsv", dangling), 0);

    struct stat st;
    char buf[300];
    ck_assert_int_eq(put_text(link, "via link\n", &err), MKV_OK);
    ck_assert_str_eq(read_text(target), "via link\n");
    ck_assert_int_eq(lstat(link, &st), 0);
    ck_assert(S_ISLNK(st.st_mode));
    ssize_t n = readlink(link, buf, sizeof buf - 1);
    ck_assert_int_eq(n, (ssize_t)strlen("target.tsv"));

    ck_assert_int_eq(put_text(chain, "via chain\n", &err), MKV_OK);
    ck_assert_str_eq(read_text(target), "via chain\n");
    ck_assert_int_eq(lstat(chain, &st), 0);
    ck_assert(S_ISLNK(st.st_mode));
    ck_assert_int_eq(lstat(link, &st), 0);
    ck_assert(S_ISLNK(st.st_mode));

    /* a dangling link: its target is created, the link stays */
    ck_assert_int_eq(put_text(dangling, "created\n", &err), MKV_OK);
    ck_assert_str_eq(read_text(created), "created\n");
    ck_assert_int_eq(lstat(dangling, &st), 0);
    ck_assert(S_ISLNK(st.st_mode));
    ck_assert_int_eq(lstat(created, &st), 0);
    ck_assert(S_ISREG(st.st_mode));
    /* target, link, chain, dangling, sub: no temporary left anywhere */
    ck_assert_int_eq(test_count_entries(dir), 5);
    snprintf(buf, sizeof buf, "%s/sub", dir);
    ck_assert_int_eq(test_count_entries(buf), 1);
}
END_TEST

START_TEST(fifo_written_through)
{
    char fifo[300], copy[300];
    mkv_error err;
    const char *dir = make_dir("fifo");
    snprintf(fifo, sizeof fifo, "%s/pipe", dir);
    snprintf(copy, sizeof copy, "%s/copy", dir);
    ck_assert_int_eq(mkfifo(fifo, 0644), 0);
    pid_t reader = fork();
    ck_assert_int_ge(reader, 0);
    if (reader == 0) {
        /* the reader: copy what arrives through the FIFO to a file */
        char buf[256];
        int in = open(fifo, O_RDONLY), out = open(copy, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        ssize_t n;
        while (in >= 0 && out >= 0 && (n = read(in, buf, sizeof buf)) > 0)
            if (write(out, buf, (size_t)n) != n)
                _exit(1);
        _exit(in >= 0 && out >= 0 && close(out) == 0 ? 0 : 1);
    }
    mkv_outfile o;
    ck_assert_int_eq(mkv_outfile_open(&o, fifo, NULL, MKV_OUTFILE_BINARY, &err), MKV_OK);
    ck_assert_ptr_null(mkv_outfile_seekable_path(&o));
    ck_assert_int_eq(mkv_outfile_write(&o, "through\n", 8, &err), MKV_OK);
    ck_assert_int_eq(mkv_outfile_commit(&o, &err), MKV_OK);
    int status;
    ck_assert_int_eq(waitpid(reader, &status, 0), reader);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ck_assert_str_eq(read_text(copy), "through\n");
    struct stat st;
    ck_assert_int_eq(lstat(fifo, &st), 0);
    ck_assert(S_ISFIFO(st.st_mode));
    ck_assert_int_eq(test_count_entries(dir), 2);
}
END_TEST

START_TEST(own_descriptors_written_through)
{
    char path[300], name[64], want[128];
    mkv_error err;
    const char *dir = make_dir("descriptors");
    snprintf(path, sizeof path, "%s/log.tsv", dir);
    write_text(path, "head\n");
    struct stat before, after;
    ck_assert_int_eq(stat(path, &before), 0);

    /* a file opened for appending (>>): appended to, never replaced */
    int fd = open(path, O_WRONLY | O_APPEND);
    ck_assert_int_ge(fd, 0);
    snprintf(name, sizeof name, "/dev/fd/%d", fd);
    ck_assert_int_eq(put_text(name, "body\n", &err), MKV_OK);
    snprintf(name, sizeof name, "/proc/self/fd/%d", fd);
    ck_assert_int_eq(put_text(name, "tail\n", &err), MKV_OK);
    ck_assert_str_eq(read_text(path), "head\nbody\ntail\n");
    ck_assert_int_eq(stat(path, &after), 0);
    ck_assert(before.st_ino == after.st_ino);
    ck_assert_int_eq(test_count_entries(dir), 1);
    ck_assert_int_eq(close(fd), 0);

    /* a pipe, as bash's >(...) names it */
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    snprintf(name, sizeof name, "/dev/fd/%d", p[1]);
    ck_assert_int_eq(put_text(name, "piped\n", &err), MKV_OK);
    ck_assert_int_eq(close(p[1]), 0);
    char buf[16] = {0};
    ck_assert_int_eq(read(p[0], buf, sizeof buf - 1), 6);
    ck_assert_str_eq(buf, "piped\n");

    /* a descriptor that is not open */
    ck_assert_int_eq(close(p[0]), 0);
    snprintf(name, sizeof name, "/dev/fd/%d", p[0]);
    ck_assert_int_eq(put_text(name, "x", &err), MKV_EIO);
    snprintf(want, sizeof want, "cannot create '%s': Bad file descriptor", name);
    ck_assert_str_eq(err.msg, want);
}
END_TEST

START_TEST(device_write_error)
{
    struct stat st;
    if (stat("/dev/full", &st) != 0 || !S_ISCHR(st.st_mode)) {
        fprintf(stderr, "check_outfile: no /dev/full, device case skipped\n");
        return;
    }
    mkv_error err;
    mkv_outfile o;
    ck_assert_int_eq(mkv_outfile_open(&o, "/dev/full", NULL, MKV_OUTFILE_BINARY, &err), MKV_OK);
    ck_assert_ptr_null(mkv_outfile_seekable_path(&o));
    /* buffered: the error may come at the write or at the commit */
    int rc = mkv_outfile_write(&o, "x", 1, &err);
    if (rc == MKV_OK)
        rc = mkv_outfile_commit(&o, &err);
    else
        mkv_outfile_abort(&o);
    ck_assert_int_eq(rc, MKV_EIO);
    ck_assert_str_eq(err.msg, "cannot write '/dev/full': No space left on device");
    ck_assert_int_eq(lstat("/dev/full", &st), 0);
    ck_assert(S_ISCHR(st.st_mode));
}
END_TEST

static pid_t dead_pid(void)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        _exit(0);
    ck_assert_int_eq(waitpid(pid, NULL, 0), pid);
    return pid;
}

static void make_aged(const char *path, int seconds_old)
{
    write_text(path, "left behind");
    struct timeval tv[2];
    gettimeofday(&tv[0], NULL);
    tv[0].tv_sec -= seconds_old;
    tv[1] = tv[0];
    ck_assert_int_eq(utimes(path, tv), 0);
}

START_TEST(stale_temporaries)
{
    char path[300], dead_old[360], dead_new[360], live_old[360], other[360], foreign[360];
    mkv_error err;
    const char *dir = make_dir("stale");
    snprintf(path, sizeof path, "%s/out.h5", dir);
    long dead = (long)dead_pid(), live = (long)getppid();
    snprintf(dead_old, sizeof dead_old, "%s/.out.h5.mkvtmp.%ld.a1B2c3", dir, dead);
    snprintf(dead_new, sizeof dead_new, "%s/.out.h5.mkvtmp.%ld.d4E5f6", dir, dead);
    snprintf(live_old, sizeof live_old, "%s/.out.h5.mkvtmp.%ld.g7H8i9", dir, live);
    snprintf(other, sizeof other, "%s/.other.h5.mkvtmp.%ld.j0K1l2", dir, dead);
    snprintf(foreign, sizeof foreign, "%s/.out.h5.mkvtmp.%ld.longer-suffix", dir, dead);
    make_aged(dead_old, 60);
    make_aged(dead_new, 0);
    make_aged(live_old, 60);
    make_aged(other, 60);
    make_aged(foreign, 60);

    ck_assert_int_eq(put_text(path, "data\n", &err), MKV_OK);
    /* only the old temporary of this target whose process is gone */
    ck_assert_int_eq(access(dead_old, F_OK), -1);
    ck_assert_int_eq(access(dead_new, F_OK), 0);
    ck_assert_int_eq(access(live_old, F_OK), 0);
    ck_assert_int_eq(access(other, F_OK), 0);
    ck_assert_int_eq(access(foreign, F_OK), 0);
    ck_assert_str_eq(read_text(path), "data\n");

    /* once it is old enough the second one goes too */
    make_aged(dead_new, 60);
    ck_assert_int_eq(mkv_outfile_remove_stale(path), 1);
    ck_assert_int_eq(access(dead_new, F_OK), -1);
    ck_assert_int_eq(test_count_entries(dir), 4);
}
END_TEST

/* In a child: ignore SIGHUP, leave SIGTERM at its default, open an output;
 * then the given signal is raised while the temporary exists. */
static void child_with_output(const char *path, int sig)
{
    signal(SIGHUP, SIG_IGN);
    signal(SIGTERM, SIG_DFL);
    mkv_error err;
    mkv_outfile o;
    if (mkv_outfile_open(&o, path, NULL, 0, &err) != MKV_OK)
        _exit(10);
    struct sigaction sa;
    if (sigaction(SIGHUP, NULL, &sa) != 0 || sa.sa_handler != SIG_IGN)
        _exit(11);
    if (sigaction(SIGTERM, NULL, &sa) != 0 || sa.sa_handler == SIG_DFL || sa.sa_handler == SIG_IGN)
        _exit(12);
    fputs("survived\n", mkv_outfile_fp(&o));
    raise(sig);
    _exit(mkv_outfile_commit(&o, &err) == MKV_OK ? 0 : 13);
}

START_TEST(ignored_signal_stays_ignored)
{
    char path[300];
    const char *dir = make_dir("signals");
    snprintf(path, sizeof path, "%s/out.tsv", dir);
    int status;

    /* SIGHUP was ignored when the output was opened: the run goes on */
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        child_with_output(path, SIGHUP);
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status));
    ck_assert_int_eq(WEXITSTATUS(status), 0);
    ck_assert_str_eq(read_text(path), "survived\n");

    /* SIGTERM ends it, with its own status, and takes the temporary along */
    ck_assert_int_eq(unlink(path), 0);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        child_with_output(path, SIGTERM);
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFSIGNALED(status));
    ck_assert_int_eq(WTERMSIG(status), SIGTERM);
    ck_assert_int_eq(test_count_entries(dir), 0);
}
END_TEST

int main(void)
{
    mkv_log_init("check_outfile");
    Suite *s = suite_create("outfile");
    TCase *tc = tcase_create("outfile");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, regular_file_by_rename);
    tcase_add_test(tc, same_file_told_apart);
    tcase_add_test(tc, symlink_keeps_pointing);
    tcase_add_test(tc, fifo_written_through);
    tcase_add_test(tc, own_descriptors_written_through);
    tcase_add_test(tc, device_write_error);
    tcase_add_test(tc, stale_temporaries);
    tcase_add_test(tc, ignored_signal_stays_ignored);
    suite_add_tcase(s, tc);
    return test_run(s);
}
