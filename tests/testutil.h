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

static inline void test_remove_tmpdir(void) { nftw(test_tmpdir(), test_rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

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
    test_remove_tmpdir();
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

/* Path of a file in the models directory, NULL without one; two stay
 * valid at once. */
static inline const char *test_model_file(const char *name)
{
    static char path[2][4200];
    static int which;
    const char *dir = test_models_dir();
    if (!dir)
        return NULL;
    which ^= 1;
    snprintf(path[which], sizeof path[which], "%s/%s", dir, name);
    return path[which];
}

/* SmolLM2-135M-Instruct (GGUF) where scripts/get-models put it:
 * MKV_SMOLLM2, else MKV_CACHE_DIR, else ~/.cache/mosaickv; NULL when it
 * is not there. */
static inline const char *test_smollm2_path(void)
{
    static char path[4096];
    const char *env = getenv("MKV_SMOLLM2"), *cache = getenv("MKV_CACHE_DIR"), *home = getenv("HOME");
    if (env)
        snprintf(path, sizeof path, "%s", env);
    else if (cache)
        snprintf(path, sizeof path, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", cache);
    else
        snprintf(path, sizeof path, "%s/.cache/mosaickv/SmolLM2-135M-Instruct.Q4_1.gguf", home ? home : "/nonexistent");
    return access(path, R_OK) == 0 ? path : NULL;
}

/* stories260K's published sample: greedy decoding from BOS + "Once upon a
 * time" (../shared/models/README.md). */
#define TEST_PUBLISHED                                                                             \
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the "      \
    "park. One day, she saw a big, red ball. She wanted to play with it, but it was too high."

/* Texts for tokenizer round trips and comparisons: spaces, control
 * characters, several scripts, emoji, bytes that are not UTF-8, text that
 * looks like special pieces, English; *n of them. */
static inline const char *const *test_texts(size_t *n)
{
    static const char *const texts[] = {
        "Once upon a time",
        "",
        " leading and trailing spaces  ",
        "Line one\nline two\ttab\r\n",
        "caf\xc3\xa9 cr\xc3\xa8me br\xc3\xbbl\xc3\xa9" "e",           /* café crème brûlée */
        "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82", /* 日本語 Привет */
        "emoji \xf0\x9f\x98\x80\xf0\x9f\x8e\x89 done",                  /* 😀🎉 */
        "\xd8\xa7\xd9\x84\xd8\xb9\xd8\xb1\xd8\xa8\xd9\x8a\xd8\xa9 and \xe0\xa4\xb9\xe0\xa4\xbf", /* Arabic, Hindi */
        "invalid \xff\xfe\x80 bytes \xc3",                               /* not UTF-8 */
        "<0x41> <s> looks special",
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.",
    };
    *n = sizeof texts / sizeof *texts;
    return texts;
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

/* tests/NAME of the source tree, or NULL; two stay valid at once. */
static inline const char *test_src_file(const char *name)
{
    static char path[2][4200];
    static int which;
    which ^= 1;
    const char *dirs[] = {getenv("top_srcdir"), getenv("srcdir"), "."};
    for (int i = 0; i < 3; i++) {
        if (!dirs[i] || !*dirs[i])
            continue;
        snprintf(path[which], sizeof path[which], "%s/tests/%s", dirs[i], name);
        if (test_file_exists(path[which]))
            return path[which];
    }
    return NULL;
}

/* tests/model_ref.py of the source tree, or NULL. */
static inline const char *test_ref_script(void) { return test_src_file("model_ref.py"); }

/* ---- a small model the test writes itself ----
 * tests/model_fixture.py --bpe: a llama2.c checkpoint of random weights
 * (dim 32, FIXTURE_LAYERS layers, 4 query heads on 2 KV heads, head size 8,
 * shared classifier) and a tokenizer.bin laid out as tok512.bin, with
 * FIXTURE_VOCAB pieces whose merges the script learns from data/filler.txt.
 * Written by test_write_fixture() in main(), before the tests fork, into
 * fixture/ of the run's temporary directory, the tokenizer where the
 * loader looks for it (beside the checkpoint). */
#define FIXTURE_VOCAB 512
#define FIXTURE_LAYERS 5

static inline const char *test_fixture_model(void)
{
    static char path[4200];
    return test_path(path, sizeof path, "fixture/model.bin");
}

static inline const char *test_fixture_tokenizer(void)
{
    static char path[4200];
    return test_path(path, sizeof path, "fixture/tokenizer.bin");
}

/* The llama2.c models that tests run over in a loop (tcase_add_loop_test,
 * _i): the fixture (where python is) and stories260K (where it is). */
enum { TEST_FIXTURE, TEST_STORIES };

static inline const char *test_checkpoint(int which)
{
    return which == TEST_FIXTURE ? test_fixture_model() : test_model_file("stories260K.bin");
}

static inline const char *test_tokenizer(int which)
{
    return which == TEST_FIXTURE ? test_fixture_tokenizer() : test_model_file("tok512.bin");
}

static inline int test_vocab(int which) { return which == TEST_FIXTURE ? FIXTURE_VOCAB : 512; }

/* Add test as a loop over the models there are: none, one or both. */
static inline void test_add_model_loop(TCase *tc, const TTest *test, int have_fixture, int have_stories)
{
    int first = have_fixture ? TEST_FIXTURE : TEST_STORIES, end = have_stories ? TEST_STORIES + 1 : TEST_FIXTURE + 1;
    if (first < end)
        tcase_add_loop_test(tc, test, first, end);
}

/* Write the fixture: 1 when written, 0 (and a line naming `test` and what
 * is skipped) when python with numpy or the script is missing; a failing
 * script ends the run. */
static inline int test_write_fixture(const char *test)
{
    const char *script = test_src_file("model_fixture.py");
    if (!test_python() || !script) {
        printf("%s: python3 with numpy or tests/model_fixture.py not found: "
               "the tests over the model it writes skipped\n", test);
        return 0;
    }
    char dir[4200], cmd[16000];
    if (mkdir(test_path(dir, sizeof dir, "fixture"), 0700) != 0) {
        perror(dir);
        exit(EXIT_FAILURE);
    }
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' '%s' --bpe --vocab %d --layers %d", test_python(), script,
             test_fixture_model(), test_fixture_tokenizer(), FIXTURE_VOCAB, FIXTURE_LAYERS);
    if (system(cmd) != 0) {
        fprintf(stderr, "%s: failed: %s\n", test, cmd);
        test_remove_tmpdir();
        exit(EXIT_FAILURE);
    }
    return 1;
}

#endif
