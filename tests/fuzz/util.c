/* The harnesses' scratch files, bug reports and fixed texts (fuzz.h). */
#include "fuzz.h"
#include "core/log.h"
#include "methods/method.h"
#include "vocab/tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char scratch[4096];

/* Called once by libFuzzer and by the driver: warnings the library logs
 * (a method's check of odd parameters) are no findings. */
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    mkv_log_init("fuzz");
    mkv_log_set_level(MKV_LOG_ERROR);
    return 0;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void remove_scratch(void)
{
    if (scratch[0])
        nftw(scratch, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static const char *scratch_dir(void)
{
    if (!scratch[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(scratch, sizeof scratch, "%s/mkv-fuzz.XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(scratch)) {
            perror("fuzz: mkdtemp");
            abort();
        }
        atexit(remove_scratch);
    }
    return scratch;
}

const char *fuzz_path(const char *name)
{
    /* one buffer per name the harnesses use at once */
    static char paths[8][4096 + 64];
    static const char *names[8];
    int slot = 0;
    while (slot < 8 && names[slot] && strcmp(names[slot], name) != 0)
        slot++;
    if (slot == 8)
        fuzz_bug("fuzz_path: more than 8 scratch names");
    names[slot] = name;
    snprintf(paths[slot], sizeof paths[slot], "%s/%s", scratch_dir(), name);
    const char *slash = strchr(name, '/');
    if (slash) {
        char dir[4096 + 64];
        snprintf(dir, sizeof dir, "%s/%.*s", scratch_dir(), (int)(slash - name), name);
        if (mkdir(dir, 0700) != 0 && errno != EEXIST)
            fuzz_bug("cannot make '%s': %s", dir, strerror(errno));
    }
    return paths[slot];
}

const char *fuzz_file(const char *name, const void *data, size_t size)
{
    const char *path = fuzz_path(name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        fuzz_bug("cannot create '%s': %s", path, strerror(errno));
    const char *p = data;
    while (size > 0) {
        ssize_t n = write(fd, p, size);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            fuzz_bug("cannot write '%s': %s", path, n < 0 ? strerror(errno) : "short write");
        p += n;
        size -= (size_t)n;
    }
    if (close(fd) != 0)
        fuzz_bug("cannot write '%s': %s", path, strerror(errno));
    return path;
}

void fuzz_bug(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("fuzz: BUG: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

void fuzz_check_refusal(int rc, const mkv_error *err, const char *call)
{
    if (rc == MKV_OK)
        return;
    if ((int)err->code != rc)
        fuzz_bug("%s returned status %d but err->code is %d (\"%s\")", call, rc, (int)err->code, err->msg);
    size_t len = strnlen(err->msg, sizeof err->msg);
    if (len == 0 || len == sizeof err->msg)
        fuzz_bug("%s refused the input (status %d) without a message", call, rc);
    if (memchr(err->msg, '\n', len))
        fuzz_bug("%s: the message is not one line: \"%s\"", call, err->msg);
    static int verbose = -1;
    if (verbose < 0)
        verbose = getenv("MKV_FUZZ_VERBOSE") != NULL;
    if (verbose)
        fprintf(stderr, "  %s: %s\n", call, err->msg);
}

static const char *const texts[] = {
    "Once upon a time, there was a little girl named Lily.",
    "  leading spaces\n\n\tand tabs  ",
    "I'm 12345 years old; it's 3.14159.",
    "\xc3\x9cn\xc3\xaf" "c\xc3\xb6" "d\xc3\xa9 \xe6\x9d\xb1\xe4\xba\xac \xf0\x9f\xa6\x99",
    "<s></s><unk><|im_start|>user\n<|endoftext|>",
    "\xff\xfe\x80\xc0 invalid UTF-8 \xed\xa0\x80",
    "",
    NULL,
};

void fuzz_tokenizer_roundtrip(const mkv_tokenizer *t)
{
    static const int flags[] = {0, MKV_ENCODE_SPECIAL, MKV_ENCODE_BOS | MKV_ENCODE_EOS | MKV_ENCODE_SPECIAL};
    for (int i = 0; texts[i]; i++)
        for (size_t f = 0; f < sizeof flags / sizeof flags[0]; f++) {
            mkv_error err;
            int32_t *ids = NULL;
            size_t n = 0;
            size_t len = strlen(texts[i]);
            int rc = mkv_tokenizer_encode(t, texts[i], len, flags[f], &ids, &n, &err);
            fuzz_check_refusal(rc, &err, "mkv_tokenizer_encode");
            if (rc)
                continue;
            for (size_t k = 0; k < n; k++)
                if (ids[k] < 0 || ids[k] >= t->vocab_size)
                    fuzz_bug("mkv_tokenizer_encode gave id %d outside the vocabulary of %d", (int)ids[k],
                             t->vocab_size);
            char *text = NULL;
            size_t tlen = 0;
            if (mkv_tokenizer_decode(t, ids, n, &text, &tlen, &err))
                fuzz_bug("mkv_tokenizer_decode of what mkv_tokenizer_encode gave: %s", err.msg);
            free(text);
            free(ids);
        }
    for (int id = -1; id < t->vocab_size && id < 300; id++) {
        size_t len;
        const char *piece = mkv_tokenizer_piece(t, id > 0 ? id - 1 : -1, id, &len);
        if ((id < 0) != (piece == NULL))
            fuzz_bug("mkv_tokenizer_piece(%d) is %s", id, piece ? "a piece" : "NULL");
        if (piece && mkv_tokenizer_lookup(t, t->tokens[id].text, t->tokens[id].len) >= t->vocab_size)
            fuzz_bug("mkv_tokenizer_lookup of token %d gave an id outside the vocabulary", id);
    }
}

void fuzz_load_attend(const mkv_method *m, const mkv_params *p, mkv_cdump *c, int layer, int head,
                      const float *q, const int64_t *positions, int n_positions)
{
    int64_t T;
    int d, G;
    mkv_cdump_cache_shape(c, &T, &d, &G);
    mkv_error err;
    void *state = NULL;
    int rc = m->load(p, c, layer, head, &state, &err);
    fuzz_check_refusal(rc, &err, "load");
    if (rc)
        return;
    size_t gd = (size_t)G * (size_t)d;
    float *out = malloc(sizeof(float) * gd);
    double *lse = malloc(sizeof(double) * (size_t)G);
    uint8_t *attended = malloc((size_t)T);
    if (!out || !lse || !attended)
        fuzz_bug("out of memory for G=%d, d=%d, T=%lld", G, d, (long long)T);
    for (int i = 0; i < n_positions; i++) {
        memset(attended, 0, (size_t)T);
        mkv_attend_query aq = {.G = G, .d = d, .q = q, .pos = positions[i], .scale = 1.0 / sqrt((double)d)};
        mkv_attend_result r = {.out = out, .attended = attended, .bytes_read = 0, .lse = lse};
        rc = m->attend(state, &aq, &r, &err);
        fuzz_check_refusal(rc, &err, "attend");
    }
    free(out);
    free(lse);
    free(attended);
    m->free_state(state);
}
