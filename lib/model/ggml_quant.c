/* ggml block layouts to float32. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <string.h>

#include "model/ggml_quant.h"
#include "core/half.h"

int mkv_ggml_can_dequantize(uint32_t type)
{
    return type == MKV_GGML_F32 || type == MKV_GGML_F16 || type == MKV_GGML_BF16 ||
           type == MKV_GGML_Q8_0 || type == MKV_GGML_Q4_0 || type == MKV_GGML_Q4_1;
}

static uint16_t get_u16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1

/* The same products and sums as the scalar loops below, eight lanes at a
 * time (a multiply then an add, never fused; F16C's conversion is exact
 * like mkv_f16_to_f32), so the floats are identical; the forward pass
 * dequantizes every matrix tile of every decode step through these.  All
 * in VEX code: calling the SSE-compiled helpers from here costs a state
 * transition per block on some CPUs. */
__attribute__((target("avx2"), always_inline)) static inline __m256 widen(__m128i bytes)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
}

/* dst[0..32) = v * d (+ m): lo holds elements 0..15, hi 16..31, as bytes. */
__attribute__((target("avx2"), always_inline)) static inline void store_block(float *dst, __m128i lo, __m128i hi,
                                                                             __m256 d, __m256 m, int add)
{
    __m256 a = _mm256_mul_ps(widen(lo), d), b = _mm256_mul_ps(widen(_mm_srli_si128(lo, 8)), d);
    __m256 c = _mm256_mul_ps(widen(hi), d), e = _mm256_mul_ps(widen(_mm_srli_si128(hi, 8)), d);
    if (add) {
        a = _mm256_add_ps(a, m);
        b = _mm256_add_ps(b, m);
        c = _mm256_add_ps(c, m);
        e = _mm256_add_ps(e, m);
    }
    _mm256_storeu_ps(dst, a);
    _mm256_storeu_ps(dst + 8, b);
    _mm256_storeu_ps(dst + 16, c);
    _mm256_storeu_ps(dst + 24, e);
}

/* Q8_0: 32 signed bytes times d. */
__attribute__((target("avx2,f16c"))) static void q8_0_avx2(const unsigned char *p, float *dst, uint64_t blocks)
{
    for (uint64_t b = 0; b < blocks; b++, p += 34, dst += 32) {
        __m256 d = _mm256_set1_ps(_cvtsh_ss(get_u16(p)));
        store_block(dst, _mm_loadu_si128((const __m128i *)(p + 2)),
                    _mm_loadu_si128((const __m128i *)(p + 18)), d, d, 0);
    }
}

/* Q4_0 (q - 8) * d and Q4_1 q * d + m: low nibbles are elements 0..15,
 * high nibbles 16..31. */
__attribute__((target("avx2,f16c"), always_inline)) static inline void q4_avx2(const unsigned char *p, float *dst,
                                                                              uint64_t blocks, int with_min)
{
    const __m128i low4 = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
    size_t size = with_min ? 20 : 18;
    for (uint64_t b = 0; b < blocks; b++, p += size, dst += 32) {
        __m256 d = _mm256_set1_ps(_cvtsh_ss(get_u16(p)));
        __m256 m = _mm256_set1_ps(with_min ? _cvtsh_ss(get_u16(p + 2)) : 0.0f);
        __m128i q = _mm_loadu_si128((const __m128i *)(p + (with_min ? 4 : 2)));
        __m128i lo = _mm_and_si128(q, low4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), low4);
        if (!with_min) {
            lo = _mm_sub_epi8(lo, eight);
            hi = _mm_sub_epi8(hi, eight);
        }
        store_block(dst, lo, hi, d, m, with_min);
    }
}

__attribute__((target("avx2,f16c"))) static void q4_0_avx2(const unsigned char *p, float *dst, uint64_t blocks)
{
    q4_avx2(p, dst, blocks, 0);
}

__attribute__((target("avx2,f16c"))) static void q4_1_avx2(const unsigned char *p, float *dst, uint64_t blocks)
{
    q4_avx2(p, dst, blocks, 1);
}

/* libgcc reads the CPU's features once, in a constructor; this reads its
 * copy. */
static int have_avx2(void)
{
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
}

/* ---- rows dotted with x, the blocks never written out as floats */

/* The 32 values of a block as four vectors of 8 floats, from its bytes:
 * lo holds elements 0..15, hi 16..31. */
__attribute__((target("avx2,fma"), always_inline)) static inline __m256 block_dot(__m128i lo, __m128i hi,
                                                                                 const float *x)
{
    __m256 t = _mm256_mul_ps(widen(lo), _mm256_loadu_ps(x));
    t = _mm256_fmadd_ps(widen(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(x + 8), t);
    t = _mm256_fmadd_ps(widen(hi), _mm256_loadu_ps(x + 16), t);
    return _mm256_fmadd_ps(widen(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(x + 24), t);
}

__attribute__((target("avx2"), always_inline)) static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* One row of `blocks` blocks dotted with x.  A block's sum is
 * d * sum(q x) (+ m * sum(x) for Q4_1, the block sums of x precomputed in
 * xs, 8 lanes a block). */
__attribute__((target("avx2,fma,f16c"))) static float row_dot_avx2(uint32_t type, const unsigned char *p,
                                                                  size_t blocks, const float *x,
                                                                  const float *xs)
{
    const __m128i low4 = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (size_t b = 0; b < blocks; b++, x += 32) {
        __m256 d = _mm256_set1_ps(_cvtsh_ss(get_u16(p)));
        if (type == MKV_GGML_Q8_0) {
            acc = _mm256_fmadd_ps(d, block_dot(_mm_loadu_si128((const __m128i *)(p + 2)),
                                               _mm_loadu_si128((const __m128i *)(p + 18)), x), acc);
            p += 34;
            continue;
        }
        int with_min = type == MKV_GGML_Q4_1;
        __m128i q = _mm_loadu_si128((const __m128i *)(p + (with_min ? 4 : 2)));
        __m128i lo = _mm_and_si128(q, low4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), low4);
        if (with_min) {
            __m256 m = _mm256_set1_ps(_cvtsh_ss(get_u16(p + 2)));
            accm = _mm256_fmadd_ps(m, _mm256_loadu_ps(xs + 8 * b), accm);
            p += 20;
        } else {
            lo = _mm_sub_epi8(lo, eight);
            hi = _mm_sub_epi8(hi, eight);
            p += 18;
        }
        acc = _mm256_fmadd_ps(d, block_dot(lo, hi, x), acc);
    }
    return hsum8(_mm256_add_ps(acc, accm));
}

__attribute__((target("avx2"))) static void block_sums_avx2(const float *x, size_t blocks, float *xs)
{
    for (size_t b = 0; b < blocks; b++, x += 32)
        _mm256_storeu_ps(xs + 8 * b, _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8)),
                                                   _mm256_add_ps(_mm256_loadu_ps(x + 16),
                                                                 _mm256_loadu_ps(x + 24))));
}

static int have_fma(void) { return have_avx2() && __builtin_cpu_supports("fma"); }
#endif

static int check_request(uint32_t type, uint64_t n, mkv_error *err)
{
    if (!mkv_ggml_can_dequantize(type)) {
        const char *name = mkv_ggml_type_name(type);
        return mkv_fail(err, MKV_EUNSUP,
                        "tensor type %s (%u) cannot be dequantized (supported: F32, F16, BF16, "
                        "Q8_0, Q4_0, Q4_1)", name ? name : "unknown", (unsigned)type);
    }
    uint32_t block = mkv_ggml_block_size(type);
    if (n % block != 0)
        return mkv_fail(err, MKV_EFORMAT, "%llu elements of type %s is not a whole number of "
                        "%u-element blocks", (unsigned long long)n, mkv_ggml_type_name(type), block);
    return MKV_OK;
}

int mkv_ggml_dequantize_scalar(uint32_t type, const void *src, float *dst, uint64_t n, mkv_error *err)
{
    int rc = check_request(type, n, err);
    if (rc)
        return rc;
    uint32_t size = mkv_ggml_type_size(type);
    const unsigned char *p = src;
    switch (type) {
    case MKV_GGML_F32:
        memcpy(dst, p, n * sizeof(float));
        break;
    case MKV_GGML_F16:
        for (uint64_t i = 0; i < n; i++)
            dst[i] = mkv_f16_to_f32(get_u16(p + 2 * i));
        break;
    case MKV_GGML_BF16:
        for (uint64_t i = 0; i < n; i++)
            dst[i] = mkv_bf16_to_f32(get_u16(p + 2 * i));
        break;
    case MKV_GGML_Q8_0:
        for (uint64_t b = 0; b < n / 32; b++, p += size, dst += 32) {
            float d = mkv_f16_to_f32(get_u16(p));
            for (int j = 0; j < 32; j++)
                dst[j] = (float)(int8_t)p[2 + j] * d;
        }
        break;
    case MKV_GGML_Q4_0:
        for (uint64_t b = 0; b < n / 32; b++, p += size, dst += 32) {
            float d = mkv_f16_to_f32(get_u16(p));
            for (int j = 0; j < 16; j++) {
                dst[j] = (float)((int)(p[2 + j] & 0x0F) - 8) * d;
                dst[j + 16] = (float)((int)(p[2 + j] >> 4) - 8) * d;
            }
        }
        break;
    case MKV_GGML_Q4_1:
        for (uint64_t b = 0; b < n / 32; b++, p += size, dst += 32) {
            float d = mkv_f16_to_f32(get_u16(p)), m = mkv_f16_to_f32(get_u16(p + 2));
            for (int j = 0; j < 16; j++) {
                dst[j] = (float)(p[4 + j] & 0x0F) * d + m;
                dst[j + 16] = (float)(p[4 + j] >> 4) * d + m;
            }
        }
        break;
    }
    return MKV_OK;
}

int mkv_ggml_dequantize(uint32_t type, const void *src, float *dst, uint64_t n, mkv_error *err)
{
#ifdef HAVE_AVX2_PATH
    if (have_avx2() && (type == MKV_GGML_Q8_0 || type == MKV_GGML_Q4_0 || type == MKV_GGML_Q4_1)) {
        int rc = check_request(type, n, err);
        if (rc)
            return rc;
        if (type == MKV_GGML_Q8_0)
            q8_0_avx2(src, dst, n / 32);
        else if (type == MKV_GGML_Q4_0)
            q4_0_avx2(src, dst, n / 32);
        else
            q4_1_avx2(src, dst, n / 32);
        return MKV_OK;
    }
#endif
    return mkv_ggml_dequantize_scalar(type, src, dst, n, err);
}

int mkv_gguf_check_dequantizable(const mkv_gguf *g, const mkv_gguf_tensor *t, mkv_error *err)
{
    if (mkv_ggml_can_dequantize(t->type))
        return MKV_OK;
    const char *name = mkv_ggml_type_name(t->type);
    return mkv_fail(err, MKV_EUNSUP,
                    "'%s': tensor '%s' has type %s, which mosaickv cannot dequantize "
                    "(supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1)",
                    mkv_gguf_path(g), t->name, name ? name : "unknown");
}

int mkv_gguf_dequantize(const mkv_gguf *g, const mkv_gguf_tensor *t, float *dst, mkv_error *err)
{
    int rc = mkv_gguf_check_dequantizable(g, t, err);
    if (rc)
        return rc;
    rc = mkv_ggml_dequantize(t->type, t->data, dst, t->n_elements, err);
    if (rc && err)
        mkv_error_prefix(err, "'%s': tensor '%s'", mkv_gguf_path(g), t->name);
    return rc;
}

int mkv_ggml_can_dot(uint32_t type)
{
    return type == MKV_GGML_Q8_0 || type == MKV_GGML_Q4_0 || type == MKV_GGML_Q4_1;
}

void mkv_ggml_dot_rows_scalar(uint32_t type, const void *rows, size_t row_bytes, size_t cols, size_t n,
                              const float *x, float *y)
{
    float w[32];
    for (size_t r = 0; r < n; r++) {
        const unsigned char *p = (const unsigned char *)rows + r * row_bytes;
        double sum = 0.0;
        for (size_t k = 0; k < cols; k += 32, p += mkv_ggml_type_size(type)) {
            mkv_ggml_dequantize_scalar(type, p, w, 32, NULL);
            for (int j = 0; j < 32; j++)
                sum += (double)w[j] * x[k + (size_t)j];
        }
        y[r] = (float)sum;
    }
}

void mkv_ggml_dot_rows(uint32_t type, const void *rows, size_t row_bytes, size_t cols, size_t n, const float *x,
                       float *scratch, float *y)
{
#ifdef HAVE_AVX2_PATH
    if (have_fma()) {
        size_t blocks = cols / 32;
        if (type == MKV_GGML_Q4_1)
            block_sums_avx2(x, blocks, scratch);
        for (size_t r = 0; r < n; r++)
            y[r] = row_dot_avx2(type, (const unsigned char *)rows + r * row_bytes, blocks, x, scratch);
        return;
    }
#endif
    (void)scratch;
    mkv_ggml_dot_rows_scalar(type, rows, row_bytes, cols, n, x, y);
}
