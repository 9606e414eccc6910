/* GPU unit tests: device query and the 16-bit <-> float32 conversion
 * kernels, checked against hand-computed bit patterns and, exhaustively or
 * on every rounding boundary, against the CPU conversion in lib/core/half.c.
 *
 * CUDA cannot be used in a child forked after the runtime started, so the
 * suite runs without fork (whatever CK_FORK says).  Exit 77 (skip) when this
 * build has no CUDA or no usable GPU is present, after checking that the
 * entry points then fail cleanly.
 *
 * NaN: a NaN input must give a NaN output; the payload may differ (the
 * hardware returns a canonical NaN).  Everything else is compared bit for
 * bit. */
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/half.h"
#include "core/mkv.h"
#include "mkv_cuda.h"
#include "gpu_testutil.h"

#define MAX_GPUS 64
/* Larger than one pass of the conversion (64M elements) and not a multiple
 * of the 8-element vector. */
#define MULTI_PASS_N (((size_t)64 << 20) + 12345)

static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static int f32_bits_nan(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }
static int f16_nan(uint16_t h) { return (h & 0x7fffu) > 0x7c00u; }
static int bf16_nan(uint16_t b) { return (b & 0x7fffu) > 0x7f80u; }
static int half_nan(uint16_t h, int is_bf16) { return is_bf16 ? bf16_nan(h) : f16_nan(h); }

static uint64_t rng_state = 0x9e3779b97f4a7c15u;
static uint32_t rng_next(void)   /* xorshift64*: a fixed seed, the same data every run */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    ck_assert_msg(p != NULL, "out of memory (%zu bytes)", bytes);
    return p;
}

static float cpu_to_f32(uint16_t h, int is_bf16)
{
    return is_bf16 ? mkv_bf16_to_f32(h) : mkv_f16_to_f32(h);
}

static uint16_t cpu_from_f32(float f, int is_bf16)
{
    return is_bf16 ? mkv_f32_to_bf16(f) : mkv_f32_to_f16(f);
}

static void gpu_to_f32(const uint16_t *src, float *dst, size_t n, int is_bf16)
{
    mkv_error err = {0};
    int rc = mkv_cuda_f16_to_f32(src, dst, n, is_bf16, &err);
    ck_assert_msg(rc == MKV_OK, "mkv_cuda_f16_to_f32(n=%zu): %s", n, err.msg);
}

static void gpu_from_f32(const float *src, uint16_t *dst, size_t n, int is_bf16)
{
    mkv_error err = {0};
    int rc = mkv_cuda_f32_to_f16(src, dst, n, is_bf16, &err);
    ck_assert_msg(rc == MKV_OK, "mkv_cuda_f32_to_f16(n=%zu): %s", n, err.msg);
}

/* Count the outputs that differ from the CPU's and remember the first. */
typedef struct {
    size_t bad;
    uint32_t in, got, want;
} mismatch;

static void note(mismatch *m, uint32_t in, uint32_t got, uint32_t want)
{
    if (m->bad++ == 0) {
        m->in = in;
        m->got = got;
        m->want = want;
    }
}

/* GPU 16 -> 32 against lib/core/half.c on src[0..n). */
static mismatch compare_to_f32(const uint16_t *src, size_t n, int is_bf16)
{
    float *gpu = xmalloc(n * sizeof *gpu);
    gpu_to_f32(src, gpu, n, is_bf16);
    mismatch m = {0};
    for (size_t i = 0; i < n; i++) {
        uint32_t got = f32_bits(gpu[i]), want = f32_bits(cpu_to_f32(src[i], is_bf16));
        int ok = half_nan(src[i], is_bf16) ? f32_bits_nan(got) : got == want;
        if (!ok)
            note(&m, src[i], got, want);
    }
    free(gpu);
    return m;
}

/* GPU 32 -> 16 against lib/core/half.c on src[0..n). */
static mismatch compare_from_f32(const float *src, size_t n, int is_bf16)
{
    uint16_t *gpu = xmalloc(n * sizeof *gpu);
    gpu_from_f32(src, gpu, n, is_bf16);
    mismatch m = {0};
    for (size_t i = 0; i < n; i++) {
        uint16_t want = cpu_from_f32(src[i], is_bf16);
        int ok = f32_bits_nan(f32_bits(src[i])) ? half_nan(gpu[i], is_bf16) && half_nan(want, is_bf16)
                                                : gpu[i] == want;
        if (!ok)
            note(&m, f32_bits(src[i]), gpu[i], want);
    }
    free(gpu);
    return m;
}

#define ASSERT_NO_MISMATCH(m, what)                                                      \
    ck_assert_msg((m).bad == 0, "%s: %zu mismatches; first: input 0x%08" PRIx32          \
                  " gpu 0x%08" PRIx32 " cpu 0x%08" PRIx32, what, (m).bad, (m).in, (m).got, \
                  (m).want)

/* ------------------------------------------------------------ device query */

START_TEST(test_device_info)
{
    static mkv_gpu_info info[MAX_GPUS];
    mkv_error err = {0};
    int count = -1;
    ck_assert_int_eq(mkv_cuda_devices(info, MAX_GPUS, &count, &err), MKV_OK);
    ck_assert_int_ge(count, 1);
    for (int i = 0; i < count && i < MAX_GPUS; i++) {
        const mkv_gpu_info *g = &info[i];
        ck_assert_int_eq(g->index, i);
        ck_assert_msg(memchr(g->name, '\0', sizeof g->name) != NULL && g->name[0] != '\0',
                      "GPU %d: empty or unterminated name", i);
        ck_assert_int_ge(g->cc_major, 3);
        ck_assert_int_ge(g->cc_minor, 0);
        ck_assert_int_gt(g->multiprocessors, 0);
        ck_assert_msg(g->total_mem >= ((size_t)1 << 30), "GPU %d: total memory %zu", i, g->total_mem);
        ck_assert_msg(g->free_mem > 0 && g->free_mem <= g->total_mem,
                      "GPU %d: free %zu of %zu", i, g->free_mem, g->total_mem);
        /* The build targets sm_90a (+ compute_90a PTX, which only 9.0 runs). */
        if (strstr(mkv_cuda_build_info(), "sm_90a") != NULL && g->usable)
            ck_assert_msg(g->cc_major == 9 && g->cc_minor == 0,
                          "GPU %d: usable at compute capability %d.%d", i, g->cc_major, g->cc_minor);
    }
    /* Counting without filling. */
    int again = -1;
    ck_assert_int_eq(mkv_cuda_devices(NULL, 0, &again, &err), MKV_OK);
    ck_assert_int_eq(again, count);
}
END_TEST

/* ------------------------------------------------ 16 -> 32, known patterns */

typedef struct { uint16_t h; uint32_t f; } known16;
#define NAN32 0xffffffffu   /* marks "any NaN" in the tables */

static void check_known_to_f32(const known16 *t, size_t n, int is_bf16)
{
    uint16_t src[64];
    float dst[64];
    ck_assert(n <= 64);
    for (size_t i = 0; i < n; i++)
        src[i] = t[i].h;
    gpu_to_f32(src, dst, n, is_bf16);
    for (size_t i = 0; i < n; i++) {
        uint32_t got = f32_bits(dst[i]);
        if (t[i].f == NAN32)
            ck_assert_msg(f32_bits_nan(got), "0x%04x -> 0x%08" PRIx32 ", want NaN", t[i].h, got);
        else
            ck_assert_msg(got == t[i].f, "0x%04x -> 0x%08" PRIx32 ", want 0x%08" PRIx32,
                          t[i].h, got, t[i].f);
    }
}

START_TEST(test_known_f16_to_f32)
{
    static const known16 t[] = {
        {0x0000, 0x00000000}, {0x8000, 0x80000000},  /* +0, -0 */
        {0x3c00, 0x3f800000}, {0xc000, 0xc0000000},  /* 1, -2 */
        {0x3800, 0x3f000000}, {0x5640, 0x42c80000},  /* 0.5, 100 */
        {0x3555, 0x3eaaa000},                        /* 0.333251953125 */
        {0x7bff, 0x477fe000}, {0xfbff, 0xc77fe000},  /* +-65504, largest finite */
        {0x0400, 0x38800000},                        /* 2^-14, smallest normal */
        {0x03ff, 0x387fc000},                        /* 1023 * 2^-24, largest subnormal */
        {0x0001, 0x33800000}, {0x8001, 0xb3800000},  /* +-2^-24, smallest subnormal */
        {0x0200, 0x38000000},                        /* 2^-15 */
        {0x7c00, 0x7f800000}, {0xfc00, 0xff800000},  /* +-Inf */
        {0x7e00, NAN32}, {0xfe00, NAN32}, {0x7c01, NAN32}, {0x7fff, NAN32},
    };
    check_known_to_f32(t, sizeof t / sizeof t[0], 0);
}
END_TEST

START_TEST(test_known_bf16_to_f32)
{
    static const known16 t[] = {
        {0x0000, 0x00000000}, {0x8000, 0x80000000},
        {0x3f80, 0x3f800000}, {0xc000, 0xc0000000},  /* 1, -2 */
        {0x42c8, 0x42c80000}, {0x3eab, 0x3eab0000},  /* 100, 0.333984375 */
        {0x7f7f, 0x7f7f0000}, {0xff7f, 0xff7f0000},  /* +-largest finite */
        {0x0080, 0x00800000},                        /* 2^-126, smallest normal */
        {0x0001, 0x00010000}, {0x807f, 0x807f0000},  /* subnormals */
        {0x7f80, 0x7f800000}, {0xff80, 0xff800000},  /* +-Inf */
        {0x7fc0, NAN32}, {0xffc0, NAN32}, {0x7f81, NAN32}, {0x7fff, NAN32},
    };
    check_known_to_f32(t, sizeof t / sizeof t[0], 1);
}
END_TEST

/* --------------------------------------------- 16 -> 32, every bit pattern */

static void exhaustive_to_f32(int is_bf16)
{
    uint16_t *src = xmalloc(65536 * sizeof *src);
    for (uint32_t i = 0; i < 65536; i++)
        src[i] = (uint16_t)i;
    mismatch m = compare_to_f32(src, 65536, is_bf16);
    free(src);
    ASSERT_NO_MISMATCH(m, is_bf16 ? "bf16 -> f32, all patterns" : "f16 -> f32, all patterns");
}

START_TEST(test_exhaustive_f16_to_f32) { exhaustive_to_f32(0); }
END_TEST

START_TEST(test_exhaustive_bf16_to_f32) { exhaustive_to_f32(1); }
END_TEST

/* ------------------------------------------------ 32 -> 16, known patterns */

typedef struct { uint32_t f; uint16_t h; } known32;
#define NAN16 0xffffu       /* "any NaN" */

static void check_known_from_f32(const known32 *t, size_t n, int is_bf16)
{
    float src[64];
    uint16_t dst[64];
    ck_assert(n <= 64);
    for (size_t i = 0; i < n; i++)
        src[i] = bits_f32(t[i].f);
    gpu_from_f32(src, dst, n, is_bf16);
    for (size_t i = 0; i < n; i++) {
        if (t[i].h == NAN16)
            ck_assert_msg(half_nan(dst[i], is_bf16), "0x%08" PRIx32 " -> 0x%04x, want NaN",
                          t[i].f, dst[i]);
        else
            ck_assert_msg(dst[i] == t[i].h, "0x%08" PRIx32 " -> 0x%04x, want 0x%04x",
                          t[i].f, dst[i], t[i].h);
    }
}

START_TEST(test_known_f32_to_f16)
{
    static const known32 t[] = {
        {0x00000000, 0x0000}, {0x80000000, 0x8000},
        {0x3f800000, 0x3c00}, {0xc0000000, 0xc000}, {0x42c80000, 0x5640},
        /* ties at 1: 1 + 2^-11 -> even 1; 1 + 3*2^-11 -> even 1 + 2^-9 */
        {0x3f801000, 0x3c00}, {0x3f801001, 0x3c01}, {0x3f800fff, 0x3c00}, {0x3f803000, 0x3c02},
        /* 2047.5: tie between 2047 and 2048, carry into the exponent */
        {0x44fff000, 0x6800},
        /* the top: 65504 is the largest finite; 65520 ties to even = Inf */
        {0x477fe000, 0x7bff}, {0x477fefff, 0x7bff}, {0x477ff000, 0x7c00}, {0x477ff001, 0x7c00},
        {0xc77fefff, 0xfbff}, {0xc77ff000, 0xfc00}, {0x47800000, 0x7c00}, {0x7f7fffff, 0x7c00},
        /* normal/subnormal boundary: 2^-14, and the midpoint below it */
        {0x38800000, 0x0400}, {0x387fe000, 0x0400}, {0x387fdfff, 0x03ff}, {0x387fc000, 0x03ff},
        /* smallest subnormal 2^-24; 2^-25 ties to 0; 1.5 and 2.5 * 2^-24 tie to 2 */
        {0x33800000, 0x0001}, {0x33000000, 0x0000}, {0x33000001, 0x0001}, {0xb3000000, 0x8000},
        {0x33c00000, 0x0002}, {0x34200000, 0x0002}, {0x32ffffff, 0x0000},
        /* float32 subnormals vanish, keeping the sign */
        {0x00000001, 0x0000}, {0x807fffff, 0x8000},
        {0x7f800000, 0x7c00}, {0xff800000, 0xfc00},
        {0x7fc00000, NAN16}, {0xffc00001, NAN16}, {0x7f800001, NAN16}, {0x7fffffff, NAN16},
    };
    check_known_from_f32(t, sizeof t / sizeof t[0], 0);
}
END_TEST

START_TEST(test_known_f32_to_bf16)
{
    static const known32 t[] = {
        {0x00000000, 0x0000}, {0x80000000, 0x8000},
        {0x3f800000, 0x3f80}, {0xc0000000, 0xc000}, {0x42c80000, 0x42c8},
        /* ties at 1: 1 + 2^-8 -> even 1; 1 + 3*2^-8 -> even 1 + 2^-6 */
        {0x3f808000, 0x3f80}, {0x3f808001, 0x3f81}, {0x3f807fff, 0x3f80}, {0x3f818000, 0x3f82},
        /* 1/3 = 0x3eaaaaab rounds up */
        {0x3eaaaaab, 0x3eab},
        /* the top: rounding past the largest finite gives Inf */
        {0x7f7f7fff, 0x7f7f}, {0x7f7f8000, 0x7f80}, {0x7f7e8000, 0x7f7e}, {0x7f7fffff, 0x7f80},
        {0xff7fffff, 0xff80},
        /* float32 subnormals become bf16 subnormals, ties to even */
        {0x00010000, 0x0001}, {0x00008000, 0x0000}, {0x00008001, 0x0001}, {0x00018000, 0x0002},
        {0x80008000, 0x8000}, {0x007fffff, 0x0080},
        {0x7f800000, 0x7f80}, {0xff800000, 0xff80},
        {0x7fc00000, NAN16}, {0xffc00001, NAN16}, {0x7f800001, NAN16}, {0x7fffffff, NAN16},
    };
    check_known_from_f32(t, sizeof t / sizeof t[0], 1);
}
END_TEST

/* --------------------------------- 32 -> 16, rounding boundaries and random */

/* Every finite 16-bit value and every midpoint between neighbours, each with
 * its float32 neighbours one ulp either side, both signs; then random float32
 * bit patterns (NaN, Inf, subnormals included) and random values of the
 * format's range; then the specials. */
static float *boundary_set(int is_bf16, size_t *n_out)
{
    const size_t n_random = (size_t)1 << 22;
    size_t cap = 65536 * 6 + 2 * n_random + 16, n = 0;
    float *v = xmalloc(cap * sizeof *v);
    const uint16_t top = is_bf16 ? 0x7f7f : 0x7bff;  /* largest finite */
    for (uint32_t h = 0; h <= top; h++) {
        double lo = cpu_to_f32((uint16_t)h, is_bf16);
        double hi = h == top ? (is_bf16 ? 0x1p128 : 65536.0) : cpu_to_f32((uint16_t)(h + 1), is_bf16);
        /* The midpoint has one bit more than the 16-bit format: exact in float32. */
        uint32_t exact = f32_bits((float)lo), mid = f32_bits((float)((lo + hi) / 2));
        if (h == top && is_bf16)
            mid = 0x7f7f8000u;                         /* (lo + 2^128)/2 overflows float */
        uint32_t around[6] = {exact, exact + 1, exact ? exact - 1 : 0, mid, mid + 1, mid - 1};
        for (int j = 0; j < 6; j++) {
            v[n++] = bits_f32(around[j]);
            ck_assert(n < cap);
        }
    }
    size_t half = n;
    for (size_t i = 0; i < half && n < cap; i++)      /* the same, negative */
        v[n++] = -v[i];
    for (size_t i = 0; i < n_random / 2 && n < cap; i++)
        v[n++] = bits_f32(rng_next());
    for (size_t i = 0; i < n_random / 2 && n < cap; i++) {
        /* exponents around the format's finite range (fp16: 2^-27 .. 2^17) */
        uint32_t r = rng_next();
        uint32_t exp = is_bf16 ? (r >> 24) : 100 + (r >> 24) % 45;
        v[n++] = bits_f32((r & 0x80000000u) | (exp << 23) | (rng_next() & 0x7fffffu));
    }
    static const uint32_t specials[] = {0x00000000, 0x80000000, 0x7f800000, 0xff800000,
                                        0x7fc00000, 0xffc00000, 0x7f800001, 0x7fbfffff,
                                        0x00000001, 0x807fffff};
    for (size_t i = 0; i < sizeof specials / sizeof specials[0] && n < cap; i++)
        v[n++] = bits_f32(specials[i]);
    *n_out = n;
    return v;
}

static void sweep_from_f32(int is_bf16)
{
    size_t n = 0;
    float *v = boundary_set(is_bf16, &n);
    mismatch m = compare_from_f32(v, n, is_bf16);
    free(v);
    ASSERT_NO_MISMATCH(m, is_bf16 ? "f32 -> bf16 boundaries/random" : "f32 -> f16 boundaries/random");
}

START_TEST(test_sweep_f32_to_f16) { sweep_from_f32(0); }
END_TEST

START_TEST(test_sweep_f32_to_bf16) { sweep_from_f32(1); }
END_TEST

/* ----------------------------------------------------------------- lengths */

START_TEST(test_lengths)
{
    mkv_error err = {0};
    /* n = 0 touches no buffer. */
    ck_assert_int_eq(mkv_cuda_f16_to_f32(NULL, NULL, 0, 0, &err), MKV_OK);
    ck_assert_int_eq(mkv_cuda_f32_to_f16(NULL, NULL, 0, 1, &err), MKV_OK);
    /* A NULL buffer with n > 0 is the caller's mistake, reported. */
    ck_assert_int_eq(mkv_cuda_f16_to_f32(NULL, NULL, 5, 0, &err), MKV_EUSAGE);

    /* Lengths around the 8-element vector, odd host offsets. */
    static const size_t lengths[] = {1, 2, 7, 8, 9, 15, 17, 255, 1000003};
    uint16_t *h = xmalloc((1000003 + 1) * sizeof *h);
    float *f = xmalloc((1000003 + 1) * sizeof *f);
    for (size_t i = 0; i < 1000003 + 1; i++) {
        h[i] = (uint16_t)rng_next();
        f[i] = bits_f32(rng_next());
    }
    for (int is_bf16 = 0; is_bf16 <= 1; is_bf16++) {
        for (size_t k = 0; k < sizeof lengths / sizeof lengths[0]; k++) {
            size_t n = lengths[k];
            mismatch a = compare_to_f32(h + 1, n, is_bf16);
            mismatch b = compare_from_f32(f + 1, n, is_bf16);
            ck_assert_msg(a.bad == 0 && b.bad == 0, "%s, n=%zu: %zu/%zu mismatches",
                          is_bf16 ? "bf16" : "f16", n, a.bad, b.bad);
        }
    }
    /* Outputs past n are left alone. */
    float guard[10];
    uint16_t in[9] = {0x3c00, 0x3c00, 0x3c00, 0x3c00, 0x3c00, 0x3c00, 0x3c00, 0x3c00, 0x3c00};
    for (int i = 0; i < 10; i++)
        guard[i] = -7.0f;
    gpu_to_f32(in, guard, 9, 0);
    ck_assert(guard[8] == 1.0f && guard[9] == -7.0f);
    free(h);
    free(f);
}
END_TEST

/* More than one device pass, ending in a partial pass that is not a
 * multiple of the vector width. */
START_TEST(test_multi_pass)
{
    const size_t n = MULTI_PASS_N;
    for (int is_bf16 = 0; is_bf16 <= 1; is_bf16++) {
        uint16_t *h = xmalloc(n * sizeof *h);
        for (size_t i = 0; i < n; i++)
            h[i] = (uint16_t)rng_next();
        mismatch a = compare_to_f32(h, n, is_bf16);
        free(h);
        ASSERT_NO_MISMATCH(a, "16 -> 32 over several passes");

        float *f = xmalloc(n * sizeof *f);
        for (size_t i = 0; i < n; i++)
            f[i] = bits_f32(rng_next());
        mismatch b = compare_from_f32(f, n, is_bf16);
        free(f);
        ASSERT_NO_MISMATCH(b, "32 -> 16 over several passes");
    }
}
END_TEST

static Suite *gpu_suite(void)
{
    Suite *s = suite_create("gpu");
    TCase *tc = tcase_create("device");
    tcase_add_test(tc, test_device_info);
    suite_add_tcase(s, tc);

    tc = tcase_create("convert");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_known_f16_to_f32);
    tcase_add_test(tc, test_known_bf16_to_f32);
    tcase_add_test(tc, test_exhaustive_f16_to_f32);
    tcase_add_test(tc, test_exhaustive_bf16_to_f32);
    tcase_add_test(tc, test_known_f32_to_f16);
    tcase_add_test(tc, test_known_f32_to_bf16);
    tcase_add_test(tc, test_sweep_f32_to_f16);
    tcase_add_test(tc, test_sweep_f32_to_bf16);
    tcase_add_test(tc, test_lengths);
    tcase_add_test(tc, test_multi_pass);
    suite_add_tcase(s, tc);
    return s;
}

/* Without a GPU to test on, the entry points must still fail cleanly:
 * "built without CUDA" (MKV_EUNSUP) or a CUDA error (MKV_EGPU), with a
 * message.  Returns 0 when they do. */
static int check_clean_failure(mkv_status want)
{
    uint16_t h[9] = {0x3c00};
    float f[9] = {1.0f};
    mkv_error err = {0};
    int rc = mkv_cuda_f16_to_f32(h, f, 9, 0, &err);
    if (rc != (int)want || err.msg[0] == '\0') {
        fprintf(stderr, "check_gpu: FAIL: f16 -> f32 without a GPU returned %d '%s', want %d\n",
                rc, err.msg, (int)want);
        return 1;
    }
    mkv_error_clear(&err);
    rc = mkv_cuda_f32_to_f16(f, h, 9, 1, &err);
    if (rc != (int)want || err.msg[0] == '\0') {
        fprintf(stderr, "check_gpu: FAIL: f32 -> bf16 without a GPU returned %d '%s', want %d\n",
                rc, err.msg, (int)want);
        return 1;
    }
    return 0;
}

int main(void)
{
    return gpu_test_main("check_gpu", gpu_suite, check_clean_failure);
}
