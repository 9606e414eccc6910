/* Small helpers shared by the Check test programs. */
#ifndef MKV_TESTUTIL_H
#define MKV_TESTUTIL_H

#include <check.h>
#include <dirent.h>
#include <ftw.h>
#include <sys/stat.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A fresh temporary directory for one test (removed by the OS's tmp
 * cleaning; tests delete what they create). */
static inline const char *test_tmpdir(void)
{
    static char dir[64];
    if (!dir[0]) {
        strcpy(dir, "/tmp/mkv-test-XXXXXX");
        if (!mkdtemp(dir)) {
            perror("mkdtemp");
            abort();
        }
    }
    return dir;
}

static inline char *test_path(char *buf, size_t size, const char *name)
{
    snprintf(buf, size, "%s/%s", test_tmpdir(), name);
    return buf;
}

/* Deterministic 64-bit generator for test inputs (splitmix64). */
static inline uint64_t test_rand64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline double test_uniform(uint64_t *s) { return (test_rand64(s) >> 11) * 0x1.0p-53; }

/* n floats uniform in [center - spread, center + spread). */
static inline void test_fill(float *p, size_t n, uint64_t *seed, double center, double spread)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (float)(center + spread * (2.0 * test_uniform(seed) - 1.0));
}

/* Number of entries in a directory (".", ".." excluded); -1 on error. */
static inline int test_count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

static inline int test_rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st; (void)flag; (void)ftw;
    return remove(path);
}

/* Run a suite; CK_FORK follows the environment. The temporary directory is
 * made before the tests fork (so every child shares it) and removed with
 * whatever is left in it afterwards. Returns the exit status. */
static inline int test_run(Suite *s)
{
    test_tmpdir();
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    nftw(test_tmpdir(), test_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* ---- real models and the numpy reference (tests that need them skip) ---- */

static inline int test_file_exists(const char *path) { return access(path, R_OK) == 0; }

static inline int test_has_models(const char *dir)
{
    char a[4200], b[4200];
    snprintf(a, sizeof a, "%s/stories260K.bin", dir);
    snprintf(b, sizeof b, "%s/tok512.bin", dir);
    return test_file_exists(a) && test_file_exists(b);
}

/* Directory with stories260K.bin and tok512.bin, or NULL.  MKV_MODELS_DIR,
 * when set, is the only place looked at; else ../shared/models beside the
 * source tree (top_srcdir) or the working directory. */
static inline const char *test_models_dir(void)
{
    static char dir[4096];
    static int looked;
    if (!looked) {
        looked = 1;
        const char *env = getenv("MKV_MODELS_DIR"), *top = getenv("top_srcdir");
        if (env && *env) {
            snprintf(dir, sizeof dir, "%s", env);
        } else {
            if (top && *top)
                snprintf(dir, sizeof dir, "%s/../shared/models", top);
            if (!dir[0] || !test_has_models(dir))
                snprintf(dir, sizeof dir, "../shared/models");
        }
        if (!test_has_models(dir))
            dir[0] = '\0';
    }
    return dir[0] ? dir : NULL;
}

/* Path of a file in the models directory; two stay valid at once. */
static inline const char *test_model_file(const char *name)
{
    static char path[2][4200];
    static int which;
    which ^= 1;
    snprintf(path[which], sizeof path[which], "%s/%s", test_models_dir(), name);
    return path[which];
}

/* Python with numpy for the reference, or NULL. */
static inline const char *test_python(void)
{
    static char py[1024];
    static int looked;
    if (!looked) {
        looked = 1;
        const char *cands[] = {getenv("PYTHON_H5PY"), "/usr/bin/python3", "python3"};
        for (int i = 0; i < 3 && !py[0]; i++) {
            if (!cands[i] || !*cands[i])
                continue;
            char cmd[1200];
            snprintf(cmd, sizeof cmd, "'%s' -c 'import numpy' >/dev/null 2>&1", cands[i]);
            if (system(cmd) == 0)
                snprintf(py, sizeof py, "%s", cands[i]);
        }
    }
    return py[0] ? py : NULL;
}

/* tests/model_ref.py of the source tree, or NULL. */
static inline const char *test_ref_script(void)
{
    static char path[4200];
    const char *dirs[] = {getenv("top_srcdir"), getenv("srcdir"), "."};
    for (int i = 0; i < 3; i++) {
        if (!dirs[i] || !*dirs[i])
            continue;
        snprintf(path, sizeof path, "%s/tests/model_ref.py", dirs[i]);
        if (test_file_exists(path))
            return path;
    }
    return NULL;
}

#endif
