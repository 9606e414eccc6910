/* Unit tests: 16-bit float conversions, sizes and allocation, option
 * parsing. References are computed independently: from the IEEE formula in
 * double precision, by nearest-value search over the fp16 table, and with
 * the compiler's own _Float16 where it exists. */
#include "config.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <string.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/attn.h"
#include "core/half.h"
#include "core/log.h"
#include "core/tasks.h"
#include "core/tensor.h"
#include "testutil.h"

static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bitsf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* fp16 value from its fields, by the formula of IEEE 754. */
static double f16_formula(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0)
        v = ldexp(m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

START_TEST(f16_to_f32_exhaustive)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float got = mkv_f16_to_f32((uint16_t)h);
        double want = f16_formula((uint16_t)h);
        if (isnan(want)) {
            ck_assert_msg(isnan(got), "0x%04x: expected NaN", h);
            /* quiet bit and payload survive: converting back is the identity
             * for quiet NaNs */
            if (h & 0x200)
                ck_assert_uint_eq(mkv_f32_to_f16(got), h);
        } else {
            ck_assert_msg((double)got == want && !signbit(got) == !signbit(want),
                          "0x%04x: got %a want %a", h, got, want);
        }
    }
}
END_TEST

/* The array conversion (F16C where the CPU has it) gives every pattern's
 * mkv_f16_to_f32 bits, signalling NaNs included, at every offset and
 * length around its groups of eight. */
START_TEST(f16_to_f32_array_equals_scalar)
{
    static uint16_t h[65536 + 16];
    static float got[65536 + 16];
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)(i * 40503u);   /* odd multiplier: every pattern once, NaNs scattered */
    for (int off = 0; off < 3; off++) {
        size_t n = 65536 - (size_t)off * 5;
        mkv_f16_to_f32_n(h + off, got, n);
        for (size_t i = 0; i < n; i++) {
            float want = mkv_f16_to_f32(h[off + i]);
            ck_assert_msg(memcmp(&got[i], &want, sizeof want) == 0, "0x%04x at %zu: %a, expected %a", h[off + i], i,
                          got[i], want);
        }
    }
}
END_TEST

START_TEST(f16_known_patterns)
{
    ck_assert(mkv_f16_to_f32(0x3c00) == 1.0f);
    ck_assert(mkv_f16_to_f32(0xc000) == -2.0f);
    ck_assert(mkv_f16_to_f32(0x7bff) == 65504.0f);
    ck_assert(mkv_f16_to_f32(0x0001) == 0x1p-24f);
    ck_assert(mkv_f16_to_f32(0x0400) == 0x1p-14f);
    ck_assert(isinf(mkv_f16_to_f32(0x7c00)) && mkv_f16_to_f32(0x7c00) > 0);
    ck_assert(isinf(mkv_f16_to_f32(0xfc00)) && mkv_f16_to_f32(0xfc00) < 0);
    ck_assert(fbits(mkv_f16_to_f32(0x8000)) == 0x80000000u);
    ck_assert(isnan(mkv_f16_to_f32(0x7e00)));
    ck_assert_uint_eq(mkv_f32_to_f16(1.0f), 0x3c00);
    ck_assert_uint_eq(mkv_f32_to_f16(65504.0f), 0x7bff);
    ck_assert_uint_eq(mkv_f32_to_f16(65519.996f), 0x7bff);   /* just below the tie */
    ck_assert_uint_eq(mkv_f32_to_f16(65520.0f), 0x7c00);     /* tie rounds to even = Inf */
    ck_assert_uint_eq(mkv_f32_to_f16(0x1p-25f), 0x0000);     /* tie at half the smallest subnormal */
    ck_assert_uint_eq(mkv_f32_to_f16(0x1.000002p-25f), 0x0001);
    ck_assert_uint_eq(mkv_f32_to_f16(0x3p-25f), 0x0002);     /* 1.5 ulp ties to even 2 */
    ck_assert_uint_eq(mkv_f32_to_f16(-0.0f), 0x8000);
    ck_assert_uint_eq(mkv_f32_to_f16(1.0f + 0x1p-11f), 0x3c00); /* tie, even stays */
    ck_assert_uint_eq(mkv_f32_to_f16(1.0f + 0x3p-11f), 0x3c02); /* tie, odd rounds up */
    ck_assert_uint_eq(mkv_f32_to_f16(INFINITY), 0x7c00);
    ck_assert_uint_eq(mkv_f32_to_f16(-INFINITY), 0xfc00);
    uint16_t qn = mkv_f32_to_f16(NAN);
    ck_assert((qn & 0x7c00) == 0x7c00 && (qn & 0x3ff) != 0);
    /* a signalling NaN whose payload sits only in the low bits must stay NaN */
    uint16_t sn = mkv_f32_to_f16(bitsf(0x7f800001u));
    ck_assert((sn & 0x7c00) == 0x7c00 && (sn & 0x3ff) != 0);
}
END_TEST

/* Round-to-nearest-even to fp16 by searching the sorted positive table. */
static uint16_t f16_nearest(float f)
{
    if (isnan(f))
        return 0x7e00;
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    double a = fabs((double)f);
    if (a >= 65520.0)
        return sign | 0x7c00;
    uint32_t lo = 0, hi = 0x7bff;          /* largest finite */
    while (lo < hi) {                      /* first h with value >= a */
        uint32_t mid = (lo + hi) / 2;
        if (f16_formula((uint16_t)mid) < a)
            lo = mid + 1;
        else
            hi = mid;
    }
    uint32_t up = lo;
    if (f16_formula((uint16_t)up) == a || up == 0)
        return sign | (uint16_t)up;
    uint32_t down = up - 1;
    double du = f16_formula((uint16_t)up) - a, dd = a - f16_formula((uint16_t)down);
    if (f16_formula((uint16_t)up) < a)     /* a beyond 65504 but below 65520 */
        return sign | (uint16_t)up;
    uint32_t pick = dd < du ? down : du < dd ? up : (down % 2 == 0 ? down : up);
    return sign | (uint16_t)pick;
}

static int same_f16(uint16_t a, uint16_t b)
{
    int nan_a = (a & 0x7c00) == 0x7c00 && (a & 0x3ff), nan_b = (b & 0x7c00) == 0x7c00 && (b & 0x3ff);
    return nan_a || nan_b ? nan_a && nan_b : a == b;
}

START_TEST(f32_to_f16_random_and_edges)
{
    uint64_t s = 42;
    for (int i = 0; i < 400000; i++) {
        float f;
        if (i % 2) {
            f = bitsf((uint32_t)test_rand64(&s));           /* any pattern */
        } else {                                             /* near the fp16 range */
            double mag = ldexp(test_uniform(&s) + 0.5, (int)(test_rand64(&s) % 44) - 28);
            f = (float)(test_rand64(&s) & 1 ? -mag : mag);
        }
        uint16_t got = mkv_f32_to_f16(f), want = f16_nearest(f);
        ck_assert_msg(same_f16(got, want), "%a (0x%08x): got 0x%04x want 0x%04x", f, fbits(f), got, want);
#ifdef __FLT16_MAX__
        _Float16 c = (_Float16)f;
        uint16_t cb;
        memcpy(&cb, &c, 2);
        ck_assert_msg(same_f16(got, cb), "%a: got 0x%04x, compiler 0x%04x", f, got, cb);
#endif
    }
    /* every midpoint between adjacent fp16 values: ties to even */
    for (uint32_t h = 0; h < 0x7bff; h++) {
        double mid = (f16_formula((uint16_t)h) + f16_formula((uint16_t)(h + 1))) / 2;
        float f = (float)mid;   /* exact: a midpoint needs only 12 significant bits */
        ck_assert(mkv_f32_to_f16(f) == (h % 2 ? h + 1 : h));
        ck_assert(mkv_f32_to_f16(-f) == (0x8000 | (h % 2 ? h + 1 : h)));
    }
}
END_TEST

START_TEST(bf16_conversions)
{
    ck_assert(mkv_bf16_to_f32(0x3f80) == 1.0f);
    ck_assert(mkv_bf16_to_f32(0xc000) == -2.0f);
    ck_assert(isinf(mkv_bf16_to_f32(0x7f80)));
    ck_assert(isnan(mkv_bf16_to_f32(0x7fc0)));
    ck_assert_uint_eq(mkv_f32_to_bf16(1.0f), 0x3f80);
    ck_assert_uint_eq(mkv_f32_to_bf16(bitsf(0x3f808000u)), 0x3f80); /* tie, even */
    ck_assert_uint_eq(mkv_f32_to_bf16(bitsf(0x3f818000u)), 0x3f82); /* tie, odd up */
    ck_assert_uint_eq(mkv_f32_to_bf16(bitsf(0x7f7fffffu)), 0x7f80); /* FLT_MAX rounds to Inf */
    ck_assert_uint_eq(mkv_f32_to_bf16(INFINITY), 0x7f80);
    uint16_t n = mkv_f32_to_bf16(bitsf(0x7f800001u));              /* sNaN, low payload */
    ck_assert((n & 0x7f80) == 0x7f80 && (n & 0x7f));
    /* every bf16 pattern converts to the float with those top 16 bits */
    for (uint32_t b = 0; b < 65536; b++) {
        float f = mkv_bf16_to_f32((uint16_t)b);
        ck_assert_uint_eq(fbits(f), b << 16);
        if (!isnan(f))
            ck_assert_uint_eq(mkv_f32_to_bf16(f), b);
    }
    /* random floats: nearest of the two bf16 neighbours, ties to even */
    uint64_t s = 7;
    for (int i = 0; i < 200000; i++) {
        uint32_t x = (uint32_t)test_rand64(&s);
        float f = bitsf(x);
        if (isnan(f) || isinf(f))
            continue;
        uint32_t lo = x & 0xffff0000u, hi = lo + 0x10000u;
        double dlo = fabs((double)f - (double)bitsf(lo));
        double dhi = (hi & 0x7f800000u) == 0x7f800000u ? INFINITY : fabs((double)bitsf(hi) - (double)f);
        uint16_t want;
        if (dlo < dhi)
            want = lo >> 16;
        else if (dhi < dlo)
            want = hi >> 16;
        else
            want = ((lo >> 16) & 1) ? hi >> 16 : lo >> 16;
        /* rounding past the largest finite value gives infinity */
        if ((x & 0x7fffffffu) >= 0x7f7f8000u)
            want = (x >> 16 & 0x8000) | 0x7f80;
        ck_assert_msg(mkv_f32_to_bf16(f) == want, "0x%08x: got 0x%04x want 0x%04x", x, mkv_f32_to_bf16(f), want);
    }
}
END_TEST

START_TEST(sizes_and_alloc)
{
    size_t out;
    ck_assert_int_eq(mkv_mul_size(3, 5, &out), 0);
    ck_assert_uint_eq(out, 15);
    ck_assert_int_eq(mkv_mul_size(SIZE_MAX / 2 + 1, 2, &out), -1);
    ck_assert_int_eq(mkv_mul_size3(1u << 30, 1u << 30, 1u << 30, &out), -1);
    mkv_error err;
    void *p = mkv_alloc(SIZE_MAX / 4, 8, "huge", &err);
    ck_assert_ptr_null(p);
    ck_assert_int_eq(err.code, MKV_ENOMEM);
    ck_assert_str_eq(err.msg, "huge: size 4611686018427387903 x 8 bytes overflows");
    float *f = mkv_alloc(3, sizeof(float), "small", &err);
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq((uintptr_t)f % MKV_ALIGN, 0);
    mkv_free(f);
    mkv_dtype t;
    ck_assert_int_eq(mkv_dtype_parse("bf16", &t), 0);
    ck_assert_int_eq(t, MKV_DTYPE_BF16);
    ck_assert_int_eq(mkv_dtype_parse("f8", &t), -1);
    float nf[4] = {1, 2, NAN, 3};
    ck_assert_int_eq(mkv_find_nonfinite(nf, 4), 2);
    ck_assert_int_eq(mkv_find_nonfinite(nf, 2), -1);
}
END_TEST

START_TEST(option_parsing)
{
    int64_t v;
    long l;
    double d;
    /* silence the usage messages these misuses print */
    FILE *saved = stderr;
    stderr = fopen("/dev/null", "w");
    ck_assert_int_eq(mkv_parse_size("64K", "tokens", 1, INT64_MAX, &v), 0);
    ck_assert_int_eq(v, 65536);
    ck_assert_int_eq(mkv_parse_size("1M", "tokens", 1, INT64_MAX, &v), 0);
    ck_assert_int_eq(v, 1048576);
    ck_assert_int_eq(mkv_parse_size("2g", "tokens", 1, INT64_MAX, &v), 0);
    ck_assert_int_eq(v, INT64_C(2147483648));
    ck_assert_int_eq(mkv_parse_size("12", "tokens", 1, INT64_MAX, &v), 0);
    ck_assert_int_eq(v, 12);
    ck_assert_int_eq(mkv_parse_size("12KB", "tokens", 1, INT64_MAX, &v), -1);
    ck_assert_int_eq(mkv_parse_size("K", "tokens", 1, INT64_MAX, &v), -1);
    ck_assert_int_eq(mkv_parse_size("0", "tokens", 1, INT64_MAX, &v), -1);
    ck_assert_int_eq(mkv_parse_size("99999999999G", "tokens", 1, INT64_MAX, &v), -1);
    ck_assert_int_eq(mkv_parse_int("7", "deflate", 0, 9, &l), 0);
    ck_assert_int_eq(l, 7);
    ck_assert_int_eq(mkv_parse_int("10", "deflate", 0, 9, &l), -1);
    ck_assert_int_eq(mkv_parse_int("3x", "deflate", 0, 9, &l), -1);
    ck_assert_int_eq(mkv_parse_double("0.25", "keep", 0, 1, &d), 0);
    ck_assert(d == 0.25);
    ck_assert_int_eq(mkv_parse_double("nan", "keep", 0, 1, &d), -1);
    ck_assert_int_eq(mkv_parse_double("1.5", "keep", 0, 1, &d), -1);
    fclose(stderr);
    stderr = saved;
}
END_TEST

/* Ranking and top-k against orders worked out by hand: ties go to the
 * lower index, and top-k returns its indices in ascending order. */
START_TEST(rank_and_topk)
{
    const double scores[7] = {0.5, 2.0, -1.0, 2.0, 0.5, 3.0, -INFINITY};
    int64_t order[7], idx[7];
    ck_assert_int_eq(mkv_rank(scores, 7, order), 0);
    const int64_t want[7] = {5, 1, 3, 0, 4, 2, 6};
    for (int i = 0; i < 7; i++)
        ck_assert_int_eq(order[i], want[i]);
    ck_assert_int_eq(mkv_topk(scores, 7, 3, idx), 3);
    ck_assert_int_eq(idx[0], 1);
    ck_assert_int_eq(idx[1], 3);
    ck_assert_int_eq(idx[2], 5);
    ck_assert_int_eq(mkv_topk(scores, 7, 4, idx), 4); /* 0 and 4 tie at 0.5: the lower wins */
    ck_assert_int_eq(idx[0], 0);
    ck_assert_int_eq(idx[3], 5);
    ck_assert_int_eq(mkv_topk(scores, 7, 0, idx), 0);
    ck_assert_int_eq(mkv_topk(scores, 7, 99, idx), 7);
    ck_assert_int_eq(mkv_rank(scores, 0, order), 0);
}
END_TEST

START_TEST(error_context)
{
    mkv_error err;
    ck_assert_int_eq(mkv_fail(&err, MKV_EFORMAT, "bad %s", "thing"), MKV_EFORMAT);
    mkv_error_prefix(&err, "'%s'", "x.h5");
    ck_assert_str_eq(err.msg, "'x.h5': bad thing");
    mkv_fail_errno(&err, MKV_EIO, 2, "cannot open '%s'", "y");
    ck_assert_str_eq(err.msg, "cannot open 'y': No such file or directory");
    ck_assert_int_eq(mkv_exit_code(MKV_EUSAGE), 2);
    ck_assert_int_eq(mkv_exit_code(MKV_EIO), 1);
    ck_assert_int_eq(mkv_exit_code(MKV_OK), 0);
}
END_TEST

/* A name read from a file and quoted in a message cannot break it into
 * lines or send control sequences (found by tests/fuzz/fuzz_gguf: a GGUF
 * key holding a newline). */
START_TEST(error_one_line)
{
    mkv_error err;
    mkv_fail(&err, MKV_EFORMAT, "'%s' has unknown value type %d", "t.u2\n\t\r\x1b[31m\x7f", 7);
    ck_assert_str_eq(err.msg, "'t.u2\\n\\t\\r\\x1b[31m\\x7f' has unknown value type 7");
    mkv_error_prefix(&err, "'%s'", "a\nb");
    ck_assert_str_eq(err.msg, "'a\\nb': 't.u2\\n\\t\\r\\x1b[31m\\x7f' has unknown value type 7");
    mkv_fail_errno(&err, MKV_EIO, 2, "cannot open '%s'", "\001");
    ck_assert_str_eq(err.msg, "cannot open '\\x01': No such file or directory");
    /* escapes that do not fit are cut whole, the message stays terminated */
    char name[MKV_ERRMSG_MAX];
    memset(name, '\n', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    mkv_fail(&err, MKV_EFORMAT, "xy%s", name);
    size_t len = strlen(err.msg);
    ck_assert_uint_eq(len, MKV_ERRMSG_MAX - 2); /* one byte more would split an escape */
    ck_assert(err.msg[0] == 'x' && err.msg[1] == 'y' && err.msg[2] == '\\' && err.msg[3] == 'n');
    ck_assert(err.msg[len - 2] == '\\' && err.msg[len - 1] == 'n');
}
END_TEST

/* ---------------------------------------------------------------- tasks */

typedef struct {
    atomic_int *runs;   /* [n] times each task ran */
    int fail_from;      /* tasks >= this fail (-1: none) */
    int nested;         /* each task also runs 5 tasks of its own */
} task_ctx;

static int count_task(void *ctx, int t, mkv_error *err);

static int nested_task(void *ctx, int t, mkv_error *err)
{
    atomic_fetch_add((atomic_int *)ctx + t, 1);
    return MKV_OK;
}

static int count_task(void *ctx, int t, mkv_error *err)
{
    task_ctx *c = ctx;
    atomic_fetch_add(&c->runs[t], 1);
    if (c->nested) {
        atomic_int inner[5] = {0};
        int failed;
        if (mkv_run_tasks(5, 2, nested_task, inner, &failed, err) != MKV_OK)
            return err->code;
        for (int i = 0; i < 5; i++)
            if (atomic_load(&inner[i]) != 1)
                return mkv_fail(err, MKV_EFORMAT, "nested task %d ran %d times", i, atomic_load(&inner[i]));
    }
    if (c->fail_from >= 0 && t >= c->fail_from)
        return mkv_fail(err, MKV_EFORMAT, "task %d fails", t);
    return MKV_OK;
}

/* Every task runs exactly once, call after call, whatever the threads. */
static void run_and_count(int n, int threads, int nested)
{
    atomic_int runs[64];
    for (int i = 0; i < n; i++)
        atomic_init(&runs[i], 0);
    task_ctx c = {runs, -1, nested};
    mkv_error err;
    int failed = 7;
    ck_assert_int_eq(mkv_run_tasks(n, threads, count_task, &c, &failed, &err), MKV_OK);
    ck_assert_int_eq(failed, -1);
    for (int i = 0; i < n; i++)
        ck_assert_msg(atomic_load(&runs[i]) == 1, "n %d threads %d: task %d ran %d times", n, threads, i,
                      atomic_load(&runs[i]));
}

static void *run_from_thread(void *arg)
{
    for (int k = 0; k < 50; k++)
        run_and_count(1 + k % 40, 1 + k % 3, 0);
    return arg;
}

/* Tasks 5.. fail: the call returns the lowest failing index and its
 * message, every task before it having run once (on: mkv_run_tasks_on,
 * NULL: mkv_run_tasks on 3 threads). */
static void check_failure_rule(const mkv_task_threads *on)
{
    atomic_int runs[20];
    for (int i = 0; i < 20; i++)
        atomic_init(&runs[i], 0);
    task_ctx c = {runs, 5, 0};
    mkv_error err;
    int failed;
    int rc = on ? mkv_run_tasks_on(on, 20, count_task, &c, &failed, &err)
                : mkv_run_tasks(20, 3, count_task, &c, &failed, &err);
    ck_assert_int_eq(rc, MKV_EFORMAT);
    ck_assert_int_eq(failed, 5);
    ck_assert_str_eq(err.msg, "task 5 fails");
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(atomic_load(&runs[i]), 1);
}

START_TEST(tasks_run_once_each)
{
    for (int k = 0; k < 300; k++)
        run_and_count(1 + k % 64, 1 + k % 4, 0);
    run_and_count(12, 2, 1);   /* a task's own call while the workers are taken */
    pthread_t other;           /* two callers at once */
    ck_assert_int_eq(pthread_create(&other, NULL, run_from_thread, NULL), 0);
    run_from_thread(NULL);
    pthread_join(other, NULL);
    check_failure_rule(NULL);
    mkv_error err;
    /* a forked child has none of the parent's threads and still runs tasks */
    pid_t pid = fork();
    ck_assert(pid >= 0);
    if (pid == 0) {
        atomic_int r[9];
        for (int i = 0; i < 9; i++)
            atomic_init(&r[i], 0);
        task_ctx cc = {r, -1, 0};
        int f, ok = mkv_run_tasks(9, 2, count_task, &cc, &f, &err) == MKV_OK;
        for (int i = 0; i < 9; i++)
            ok = ok && atomic_load(&r[i]) == 1;
        _exit(ok ? 0 : 1);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}
END_TEST

/* Threads someone else keeps, as mkv_task_threads: `extra` threads
 * started for each run, and the caller. */
typedef struct {
    void (*body)(void *arg);
    void *arg;
} given_body;

static void *given_thread(void *arg)
{
    given_body *b = arg;
    b->body(b->arg);
    return NULL;
}

static void given_run(void *user, void (*body)(void *arg), void *arg)
{
    int extra = *(int *)user;
    pthread_t tids[4];
    given_body b = {body, arg};
    for (int i = 0; i < extra; i++)
        ck_assert_int_eq(pthread_create(&tids[i], NULL, given_thread, &b), 0);
    body(arg);
    for (int i = 0; i < extra; i++)
        pthread_join(tids[i], NULL);
}

START_TEST(tasks_on_given_threads)
{
    for (int k = 0; k < 60; k++) {
        int extra = k % 4, n = 1 + k % 64;
        mkv_task_threads on = {given_run, &extra};
        atomic_int runs[64];
        for (int i = 0; i < n; i++)
            atomic_init(&runs[i], 0);
        task_ctx c = {runs, -1, 0};
        mkv_error err;
        int failed = 7;
        ck_assert_int_eq(mkv_run_tasks_on(&on, n, count_task, &c, &failed, &err), MKV_OK);
        ck_assert_int_eq(failed, -1);
        for (int i = 0; i < n; i++)
            ck_assert_msg(atomic_load(&runs[i]) == 1, "n %d, %d extra threads: task %d ran %d times", n, extra, i,
                          atomic_load(&runs[i]));
    }
    int extra = 2;
    mkv_task_threads on = {given_run, &extra};
    check_failure_rule(&on);
}
END_TEST

int main(void)
{
    mkv_log_init("check_core");
    Suite *s = suite_create("core");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, f16_to_f32_exhaustive);
    tcase_add_test(tc, f16_to_f32_array_equals_scalar);
    tcase_add_test(tc, f16_known_patterns);
    tcase_add_test(tc, f32_to_f16_random_and_edges);
    tcase_add_test(tc, bf16_conversions);
    tcase_add_test(tc, sizes_and_alloc);
    tcase_add_test(tc, option_parsing);
    tcase_add_test(tc, error_context);
    tcase_add_test(tc, error_one_line);
    tcase_add_test(tc, rank_and_topk);
    tcase_add_test(tc, tasks_run_once_each);
    tcase_add_test(tc, tasks_on_given_threads);
    suite_add_tcase(s, tc);
    return test_run(s);
}
