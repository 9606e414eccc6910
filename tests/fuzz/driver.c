/* main() for the fuzz harnesses without a fuzzing engine: runs a harness's
 * LLVMFuzzerTestOneInput over corpus files, then over inputs made from
 * them by a small deterministic mutator (bit flips, interesting integers,
 * arithmetic, truncation, erased, duplicated and random ranges, tokens,
 * splices of two inputs), so that the harnesses build and run with any C
 * compiler. With libFuzzer (scripts/fuzz) the harnesses link against the
 * engine's main() instead.
 *
 *   fuzz_NAME [options] PATH...
 *
 *   PATH            a corpus file, or a directory: its files, recursively,
 *                   in name order
 *   --mutate N      then run N mutated inputs (K/M suffixes; default 0);
 *                   for a given corpus and seed always the same inputs
 *   --seconds S     mutate until S seconds have passed (with --mutate,
 *                   whichever ends first)
 *   --seed N        mutation seed (default 1)
 *   --max-len N     longest mutated input (default twice the longest
 *                   corpus file, at least 4096 bytes)
 *   --timeout S     an input that runs longer than S seconds is a hang
 *                   (default 60, 0 = no limit): it is a bug, not a
 *                   measurement, so the limit is generous
 *   --malloc-limit MB  a single allocation larger than MB megabytes is a
 *                   bug, as with libFuzzer's -malloc_limit_mb (default
 *                   2048; 0 = none; glibc, not under a sanitizer)
 *   --max-memory MB the process's address space limit (default 8192; 0 =
 *                   none; not under AddressSanitizer), so that a runaway
 *                   input cannot take the machine's memory
 *   --crashes DIR   save the input that crashed or hung as
 *                   DIR/crash-NAME-SEED-N (timeout-... for a hang; N is
 *                   the mutation, or "corpus-I" for corpus file I)
 *   -q              print only the summary line and failures
 *
 * An input that crashes or hangs ends the run with a message naming it
 * (the harness's abort, a signal, or a sanitizer's report); exit status 0
 * means every input ran. A reproducer runs again with `fuzz_NAME FILE`. */
#include "fuzz.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define FUZZ_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer) || __has_feature(thread_sanitizer)
#define FUZZ_ASAN 1
#endif
#endif
#if defined(__GLIBC__) && !defined(FUZZ_ASAN)
#define FUZZ_MALLOC_LIMIT 1
#endif

/* Optional hooks: the engines' initializer (util.c has one), a sanitizer
 * runtime's death callback. */
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));
void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

typedef struct {
    unsigned char *data;
    size_t size;
    char *name;
} input;

static input *corpus;
static size_t n_corpus, cap_corpus;

/* ---------------------------------------------------------------- reading the corpus */

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "fuzz: out of memory\n");
        exit(1);
    }
    return p;
}

static void add_file(const char *path)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        fprintf(stderr, "fuzz: cannot open '%s': %s\n", path, strerror(errno));
        exit(1);
    }
    size_t cap = 4096, n = 0;
    unsigned char *buf = xmalloc(cap);
    for (;;) {
        if (n == cap) {
            unsigned char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                fprintf(stderr, "fuzz: out of memory reading '%s'\n", path);
                exit(1);
            }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n, fp);
        n += got;
        if (got == 0)
            break;
    }
    if (ferror(fp)) {
        fprintf(stderr, "fuzz: cannot read '%s'\n", path);
        exit(1);
    }
    fclose(fp);
    if (n_corpus == cap_corpus) {
        cap_corpus = cap_corpus ? 2 * cap_corpus : 64;
        input *nc = realloc(corpus, cap_corpus * sizeof *corpus);
        if (!nc) {
            fprintf(stderr, "fuzz: out of memory\n");
            exit(1);
        }
        corpus = nc;
    }
    corpus[n_corpus].data = buf;
    corpus[n_corpus].size = n;
    corpus[n_corpus].name = strdup(path);
    n_corpus++;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void add_path(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "fuzz: cannot open '%s': %s\n", path, strerror(errno));
        exit(1);
    }
    if (!S_ISDIR(st.st_mode)) {
        add_file(path);
        return;
    }
    DIR *d = opendir(path);
    if (!d) {
        fprintf(stderr, "fuzz: cannot open '%s': %s\n", path, strerror(errno));
        exit(1);
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **nn = realloc(names, cap * sizeof *names);
            if (!nn) {
                fprintf(stderr, "fuzz: out of memory\n");
                exit(1);
            }
            names = nn;
        }
        size_t len = strlen(path) + strlen(e->d_name) + 2;
        names[n] = xmalloc(len);
        snprintf(names[n], len, "%s/%s", path, e->d_name);
        n++;
    }
    closedir(d);
    qsort(names, n, sizeof *names, by_name);
    for (size_t i = 0; i < n; i++) {
        add_path(names[i]);
        free(names[i]);
    }
    free(names);
}

/* ---------------------------------------------------------------- the mutator */

static uint64_t rng_state;

static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Uniform in [0, n); 0 when n is 0. */
static size_t below(size_t n)
{
    return n ? (size_t)(rnd() % n) : 0;
}

static const uint64_t interesting[] = {
    0, 1, 2, 3, 4, 7, 8, 16, 31, 32, 64, 100, 127, 128, 255, 256, 511, 512, 1000, 1023, 1024, 4096,
    32767, 32768, 65535, 65536, 100000, 1u << 20, 0x7fffffff, 0x80000000u, 0xffffffffu, 0x100000000ULL,
    1ULL << 48, 0x7fffffffffffffffULL, 0x8000000000000000ULL, 0xffffffffffffffffULL,
    (uint64_t)-2, (uint64_t)-8, (uint64_t)-128, (uint64_t)-32768,
    0x3c00, 0x7c00, 0xfc00, 0x7e00,                     /* float16 1, +inf, -inf, NaN */
    0x3f800000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, /* float32 1, +inf, -inf, NaN */
};
#define N_INTERESTING (sizeof interesting / sizeof interesting[0])

/* Text that means something to the text formats (JSON, the .npy header). */
static const char *const tokens[] = {
    "\"", "\\", "\\u0000", "\\ud800", "{", "}", "[", "]", ":", ",", "'", "(", ")", " ", "\n",
    "null", "true", "false", "0", "-1", "1e308", "1e309", "-0", "NaN", "Infinity", "4294967296",
    "9223372036854775807", "18446744073709551616", "2147483648", "0.5", "1e-400", "\"\"", "{}", "[]",
    "\"type\"", "\"BPE\"", "\"vocab\"", "\"merges\"", "\"shape\"", "\"dtype\"", "\"data_offsets\"",
    "\"F16\"", "\"BF16\"", "\"F32\"", "\"rope_scaling\"", "\"llama3\"", "'descr'", "'<f4'", "'shape'",
    "'fortran_order'", "True", "False",
};
#define N_TOKENS (sizeof tokens / sizeof tokens[0])

/* Store the low `width` bytes of v at p, little- or big-endian. */
static void put_int(unsigned char *p, uint64_t v, int width, int big)
{
    for (int i = 0; i < width; i++)
        p[big ? width - 1 - i : i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_int(const unsigned char *p, int width, int big)
{
    uint64_t v = 0;
    for (int i = 0; i < width; i++)
        v |= (uint64_t)p[big ? width - 1 - i : i] << (8 * i);
    return v;
}

/* Insert n bytes at pos (room permitting: cut to what fits). Returns the
 * number inserted; the caller fills them. */
static size_t open_gap(unsigned char *buf, size_t *len, size_t cap, size_t pos, size_t n)
{
    if (*len + n > cap)
        n = cap - *len;
    memmove(buf + pos + n, buf + pos, *len - pos);
    *len += n;
    return n;
}

/* One mutation of buf[0..*len) (capacity cap); other is a second corpus
 * input for splicing. */
static void mutate_once(unsigned char *buf, size_t *len, size_t cap, const input *other)
{
    size_t n = *len;
    switch (below(15)) {
    case 0: /* flip a bit */
        if (n)
            buf[below(n)] ^= (unsigned char)(1u << below(8));
        break;
    case 1: /* a random byte */
        if (n)
            buf[below(n)] = (unsigned char)rnd();
        break;
    case 2: /* an interesting integer of 1, 2, 4 or 8 bytes, either byte order */
    case 3: {
        int width = 1 << below(4);
        if (n >= (size_t)width) {
            uint64_t v = below(8) == 0 ? (uint64_t)n : interesting[below(N_INTERESTING)];
            put_int(buf + below(n - (size_t)width + 1), v, width, below(4) == 0);
        }
        break;
    }
    case 4: { /* add or subtract a little from an integer */
        int width = 1 << below(4);
        if (n >= (size_t)width) {
            unsigned char *p = buf + below(n - (size_t)width + 1);
            int big = below(4) == 0;
            uint64_t delta = 1 + below(35);
            put_int(p, get_int(p, width, big) + (below(2) ? delta : -delta), width, big);
        }
        break;
    }
    case 5: /* truncate */
        *len = below(n + 1);
        break;
    case 6: /* truncate near the end */
        if (n)
            *len = n - 1 - below(n < 64 ? n : 64);
        break;
    case 7: { /* erase a range */
        if (!n)
            break;
        size_t pos = below(n), cnt = 1 + below(n - pos < 64 ? n - pos : 64);
        memmove(buf + pos, buf + pos + cnt, n - pos - cnt);
        *len = n - cnt;
        break;
    }
    case 8: { /* duplicate a range */
        if (!n)
            break;
        size_t src = below(n), cnt = 1 + below(n - src < 64 ? n - src : 64), dst = below(n + 1);
        unsigned char tmp[64];
        memcpy(tmp, buf + src, cnt);
        cnt = open_gap(buf, len, cap, dst, cnt);
        memcpy(buf + dst, tmp, cnt);
        break;
    }
    case 9: { /* copy a range over another */
        if (n < 2)
            break;
        size_t src = below(n), dst = below(n), cnt = 1 + below(64);
        if (cnt > n - src)
            cnt = n - src;
        if (cnt > n - dst)
            cnt = n - dst;
        memmove(buf + dst, buf + src, cnt);
        break;
    }
    case 10: { /* random bytes inserted */
        size_t pos = below(n + 1), cnt = open_gap(buf, len, cap, pos, 1 + below(8));
        for (size_t i = 0; i < cnt; i++)
            buf[pos + i] = (unsigned char)rnd();
        break;
    }
    case 11: { /* a token inserted */
        const char *t = tokens[below(N_TOKENS)];
        size_t pos = below(n + 1), cnt = open_gap(buf, len, cap, pos, strlen(t));
        memcpy(buf + pos, t, cnt);
        break;
    }
    case 12: { /* a token written over */
        const char *t = tokens[below(N_TOKENS)];
        size_t tl = strlen(t);
        if (n >= tl)
            memcpy(buf + below(n - tl + 1), t, tl);
        break;
    }
    case 13: { /* a decimal number written over a run of digits */
        if (!n)
            break;
        size_t pos = below(n), end;
        while (pos < n && (buf[pos] < '0' || buf[pos] > '9'))
            pos++;
        if (pos == n)
            break;
        for (end = pos; end < n && buf[end] >= '0' && buf[end] <= '9'; end++)
            ;
        char num[32];
        int neg = below(4) == 0;
        int nl = snprintf(num, sizeof num, "%s%llu", neg ? "-" : "", (unsigned long long)interesting[below(N_INTERESTING)]);
        size_t old = end - pos;
        if ((size_t)nl > old) {
            size_t got = open_gap(buf, len, cap, end, (size_t)nl - old);
            nl = (int)(old + got);
        } else {
            memmove(buf + pos + nl, buf + end, n - end);
            *len = n - (old - (size_t)nl);
        }
        memcpy(buf + pos, num, (size_t)nl);
        break;
    }
    case 14: { /* splice: a prefix of this input, then a suffix of the other */
        if (!other)
            break;
        size_t cut = below(n + 1), from = below(other->size + 1), cnt = other->size - from;
        if (cut + cnt > cap)
            cnt = cap - cut;
        memcpy(buf + cut, other->data + from, cnt);
        *len = cut + cnt;
        break;
    }
    }
}

/* ---------------------------------------------------------------- crashes and hangs */

static char crash_prefix[4096];     /* "DIR/crash-NAME-SEED-" or "" */
static char hang_prefix[4096];      /* "DIR/timeout-NAME-SEED-" */
static const unsigned char *volatile current_data;
static volatile size_t current_size;
static volatile long current_mutation = -1;  /* -1: a corpus file */
static volatile size_t current_file;
static const char *harness = "fuzz";
static unsigned timeout_s = 60;
static int saved;

static void write_all(int fd, const void *data, size_t n)
{
    const char *p = data;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}

static void say(const char *s)
{
    write_all(STDERR_FILENO, s, strlen(s));
}

static void format_ulong(char *out, unsigned long v)
{
    char tmp[24];
    int n = 0;
    do
        tmp[n++] = (char)('0' + v % 10);
    while (v /= 10);
    while (n)
        *out++ = tmp[--n];
    *out = '\0';
}

/* Name what was running and save it (async-signal-safe). */
static void save_current(const char *what)
{
    if (saved)
        return;
    saved = 1;
    char num[24];
    say("\n");
    say(harness);
    say(": ");
    say(what);
    if (current_mutation >= 0) {
        format_ulong(num, (unsigned long)current_mutation);
        say(" on mutation ");
        say(num);
        say(" (of ");
        say(corpus[current_file].name);
        say(")");
    } else if (current_file < n_corpus) {
        say(" on ");
        say(corpus[current_file].name);
    }
    say("\n");
    if (!crash_prefix[0] || !current_data)
        return;
    char path[sizeof crash_prefix + 64];
    const char *prefix = what[0] == 'h' ? hang_prefix : crash_prefix;
    size_t plen = strlen(prefix);
    memcpy(path, prefix, plen + 1);
    if (current_mutation >= 0) {
        format_ulong(path + plen, (unsigned long)current_mutation);
    } else {
        memcpy(path + plen, "corpus-", 8);
        format_ulong(path + plen + 7, (unsigned long)current_file);
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        say("fuzz: cannot save the reproducer\n");
        return;
    }
    write_all(fd, current_data, current_size);
    close(fd);
    say("reproducer: ");
    say(path);
    say("\n");
}

#ifdef FUZZ_MALLOC_LIMIT
/* Every allocation of the process, HDF5's too, passes here (the
 * executable's malloc interposes on glibc's). */
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
static size_t malloc_limit;

static void check_size(size_t n)
{
    if (malloc_limit && n > malloc_limit && current_data) {
        char what[96] = "allocation of ";
        format_ulong(what + strlen(what), (unsigned long)(n >> 20));
        strcat(what, " MB (past --malloc-limit)");
        save_current(what);
        abort();
    }
}

void *malloc(size_t n)
{
    check_size(n);
    return __libc_malloc(n);
}

void *calloc(size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        return NULL;
    check_size(n * size);
    return __libc_calloc(n, size);
}

void *realloc(void *p, size_t n)
{
    check_size(n);
    return __libc_realloc(p, n);
}
#endif

static void on_death(void)
{
    save_current("crash");
}

static void on_signal(int sig)
{
    if (sig == SIGALRM) {
        save_current("hang (input ran past --timeout)");
        signal(SIGABRT, SIG_DFL);
        abort();
    }
    save_current("crash");
    signal(sig, SIG_DFL);
    raise(sig);
}

static void install_handlers(void)
{
    static char altstack[1 << 16];   /* for stack overflows */
    stack_t ss = {.ss_sp = altstack, .ss_size = sizeof altstack, .ss_flags = 0};
    sigaltstack(&ss, NULL);
    const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGALRM};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sa.sa_flags = SA_ONSTACK | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        sigaction(sigs[i], &sa, NULL);
    }
    if (__sanitizer_set_death_callback)
        __sanitizer_set_death_callback(on_death);
}

static void run_one(const unsigned char *data, size_t size)
{
    current_data = data;
    current_size = size;
    if (timeout_s)
        alarm(timeout_s);
    LLVMFuzzerTestOneInput(data, size);
    if (timeout_s)
        alarm(0);
    current_data = NULL;
}

/* ---------------------------------------------------------------- main */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int parse_count(const char *s, unsigned long long *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    unsigned long long mul = 1;
    if (*end == 'K' || *end == 'k')
        mul = 1024, end++;
    else if (*end == 'M' || *end == 'm')
        mul = 1024 * 1024, end++;
    if (errno || end == s || *end || (v && mul > ULLONG_MAX / v) || s[0] == '-')
        return -1;
    *out = v * mul;
    return 0;
}

static void usage(void)
{
    fprintf(stderr, "usage: %s [--mutate N] [--seconds S] [--seed N] [--max-len N] [--timeout S] "
                    "[--malloc-limit MB] [--max-memory MB] [--crashes DIR] [-q] PATH...\n", harness);
    exit(2);
}

int main(int argc, char **argv)
{
    const char *slash = strrchr(argv[0], '/');
    harness = slash ? slash + 1 : argv[0];
    unsigned long long mutations = 0, seconds = 0, seed = 1, max_len = 0, timeout = 60;
    unsigned long long malloc_mb = 2048, memory_mb = 8192;
    int have_seconds = 0, quiet = 0;
    const char *crashes = NULL;
    int first = 1;
    for (; first < argc && argv[first][0] == '-' && argv[first][1]; first++) {
        const char *o = argv[first];
        unsigned long long *target = NULL;
        if (strcmp(o, "-q") == 0) {
            quiet = 1;
            continue;
        }
        if (strcmp(o, "--") == 0) {
            first++;
            break;
        }
        if (first + 1 >= argc)
            usage();
        if (strcmp(o, "--crashes") == 0) {
            crashes = argv[++first];
            continue;
        }
        if (strcmp(o, "--mutate") == 0)
            target = &mutations;
        else if (strcmp(o, "--seconds") == 0)
            target = &seconds, have_seconds = 1;
        else if (strcmp(o, "--seed") == 0)
            target = &seed;
        else if (strcmp(o, "--max-len") == 0)
            target = &max_len;
        else if (strcmp(o, "--timeout") == 0)
            target = &timeout;
        else if (strcmp(o, "--malloc-limit") == 0)
            target = &malloc_mb;
        else if (strcmp(o, "--max-memory") == 0)
            target = &memory_mb;
        else
            usage();
        if (parse_count(argv[++first], target) != 0) {
            fprintf(stderr, "%s: %s: not a count: '%s'\n", harness, o, argv[first]);
            return 2;
        }
    }
    if (first == argc && mutations == 0 && !have_seconds)
        usage();
    timeout_s = timeout > 86400 ? 86400 : (unsigned)timeout;
#ifdef FUZZ_MALLOC_LIMIT
    malloc_limit = malloc_mb > SIZE_MAX >> 20 ? 0 : (size_t)(malloc_mb << 20);
#endif
#ifndef FUZZ_ASAN
    if (memory_mb && memory_mb < (1ULL << 40)) {
        struct rlimit rl = {.rlim_cur = (rlim_t)(memory_mb << 20), .rlim_max = (rlim_t)(memory_mb << 20)};
        if (setrlimit(RLIMIT_AS, &rl) != 0)
            perror("fuzz: setrlimit");
    }
#endif
    if (crashes) {
        mkdir(crashes, 0755);
        snprintf(crash_prefix, sizeof crash_prefix, "%s/crash-%s-%llu-", crashes, harness, seed);
        snprintf(hang_prefix, sizeof hang_prefix, "%s/timeout-%s-%llu-", crashes, harness, seed);
    }
    if (LLVMFuzzerInitialize)
        LLVMFuzzerInitialize(&argc, &argv);
    for (int i = first; i < argc; i++)
        add_path(argv[i]);
    install_handlers();

    double t0 = now();
    size_t longest = 0;
    for (size_t i = 0; i < n_corpus; i++) {
        current_file = i;
        if (!quiet)
            fprintf(stderr, "%s: %s (%zu bytes)\n", harness, corpus[i].name, corpus[i].size);
        run_one(corpus[i].data, corpus[i].size);
        if (corpus[i].size > longest)
            longest = corpus[i].size;
    }
    double t1 = now();

    unsigned long long done = 0;
    if (mutations || have_seconds) {
        if (!max_len)
            max_len = longest * 2 > 4096 ? longest * 2 : 4096;
        unsigned char *buf = xmalloc((size_t)max_len);
        static const input empty = {(unsigned char *)"", 0, "(empty)"};
        rng_state = seed;
        while ((!mutations || done < mutations) && (!have_seconds || now() - t1 < (double)seconds)) {
            size_t pick = below(n_corpus);
            const input *base = n_corpus ? &corpus[pick] : &empty;
            const input *other = n_corpus ? &corpus[below(n_corpus)] : NULL;
            size_t len = base->size < max_len ? base->size : (size_t)max_len;
            memcpy(buf, base->data, len);
            for (size_t k = 1 + below(4); k > 0; k--)
                mutate_once(buf, &len, (size_t)max_len, other);
            current_file = pick;
            current_mutation = (long)done;
            run_one(buf, len);
            done++;
        }
        current_mutation = -1;
        free(buf);
    }
    double t2 = now();
    fprintf(stderr, "%s: %zu corpus files in %.1f s, %llu mutations (seed %llu) in %.1f s\n", harness,
            n_corpus, t1 - t0, done, seed, t2 - t1);
    return 0;
}
