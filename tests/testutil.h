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

#endif
