/* IEEE binary16 and bfloat16 conversions, bit-exact and portable (no
 * dependence on the compiler's _Float16), round to nearest even. */
#include "core/half.h"

#include <string.h>

static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

uint16_t mkv_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;

    if (ax >= 0x7f800000u) {                 /* Inf or NaN */
        if (ax > 0x7f800000u)                /* NaN: quiet, keep the top payload bits */
            return sign | 0x7e00u | (uint16_t)((ax >> 13) & 0x3ffu);
        return sign | 0x7c00u;
    }
    if (ax >= 0x477ff000u)                   /* >= 65520 rounds to infinity */
        return sign | 0x7c00u;
    if (ax < 0x38800000u) {                  /* below 2^-14: fp16 subnormal or zero */
        if (ax < 0x33000000u)                /* < 2^-25: rounds to zero (2^-25 is a tie to even 0) */
            return sign;
        uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(ax >> 23);   /* value / 2^-24 = mant >> shift */
        uint32_t h = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1);
        uint32_t halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (h & 1u)))
            h++;
        return sign | (uint16_t)h;
    }
    uint32_t h = (ax - 0x38000000u) >> 13;   /* rebias exponent 127 -> 15 */
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++;                                 /* a carry into the exponent is correct */
    return sign | (uint16_t)h;
}

float mkv_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        if (mant == 0)
            return bits_f32(sign);
        uint32_t e = 113;                    /* normalise the subnormal */
        while (!(mant & 0x400u)) {
            mant <<= 1;
            e--;
        }
        return bits_f32(sign | (e << 23) | ((mant & 0x3ffu) << 13));
    }
    if (exp == 31)
        return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t mkv_f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)     /* NaN: keep sign and top payload, force quiet */
        return (uint16_t)((x >> 16) | 0x40u);
    uint32_t bias = 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)((x + bias) >> 16);
}

float mkv_bf16_to_f32(uint16_t b) { return bits_f32((uint32_t)b << 16); }

void mkv_f32_to_f16_n(const float *src, uint16_t *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = mkv_f32_to_f16(src[i]);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
/* Eight at a time with F16C, which converts every finite value and
 * infinity exactly; a group holding a NaN or an infinity goes through
 * mkv_f16_to_f32 (F16C would quiet a signalling NaN). */
__attribute__((target("avx,f16c"))) static size_t f16_to_f32_f16c(const uint16_t *src, float *dst, size_t n)
{
    const __m128i exp = _mm_set1_epi16(0x7c00);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(src + i));
        if (_mm_movemask_epi8(_mm_cmpeq_epi16(_mm_and_si128(h, exp), exp)))
            for (size_t j = i; j < i + 8; j++)
                dst[j] = mkv_f16_to_f32(src[j]);
        else
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
    return i;
}

static int have_f16c(void) { return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c"); }
#endif

void mkv_f16_to_f32_n(const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (have_f16c())
        i = f16_to_f32_f16c(src, dst, n);
#endif
    for (; i < n; i++)
        dst[i] = mkv_f16_to_f32(src[i]);
}

void mkv_f32_to_bf16_n(const float *src, uint16_t *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = mkv_f32_to_bf16(src[i]);
}

void mkv_bf16_to_f32_n(const uint16_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = mkv_bf16_to_f32(src[i]);
}
