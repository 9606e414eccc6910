/* Portable seeded random numbers (see rng.h). */
#include "config.h"
#include "core/rng.h"

#include <math.h>

/* A fused multiply-add rounds differently from a multiply and an add: keep
 * every operation separate so the stream does not depend on the target.
 * (GCC never contracts in ISO C mode; clang honours the standard pragma.) */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

uint64_t mkv_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static void seed_from_state(mkv_rng *r, uint64_t state)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = mkv_splitmix64(&state);
    /* xoshiro must not start from all zeros; splitmix64 never yields four
     * zeros in a row, but make that explicit */
    if ((r->s[0] | r->s[1] | r->s[2] | r->s[3]) == 0)
        r->s[0] = 1;
    r->has_spare = 0;
    r->spare = 0.0;
}

void mkv_rng_seed(mkv_rng *r, uint64_t seed)
{
    seed_from_state(r, seed);
}

void mkv_rng_seed_stream(mkv_rng *r, uint64_t seed, const uint64_t *keys, int n)
{
    /* fold the keys in one at a time through the mixer, so (1, 2) and
     * (2, 1) give unrelated streams */
    uint64_t state = seed;
    uint64_t h = mkv_splitmix64(&state);
    for (int i = 0; i < n; i++) {
        state = h ^ keys[i];
        h = mkv_splitmix64(&state);
    }
    seed_from_state(r, h);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t mkv_rng_next(mkv_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double mkv_rng_uniform(mkv_rng *r)
{
    return (double)(mkv_rng_next(r) >> 11) * 0x1.0p-53;
}

uint64_t mkv_rng_below(mkv_rng *r, uint64_t n)
{
    /* reject the top partial block of 2^64 so every residue is equally
     * likely */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do
        x = mkv_rng_next(r);
    while (x >= limit);
    return x % n;
}

double mkv_rng_log(double x)
{
    /* x = m 2^e with m in [sqrt(1/2), sqrt(2)); log m = 2 atanh(s) with
     * s = (m-1)/(m+1), |s| < 0.172: the odd series below reaches double
     * precision after 11 terms. ln 2 is split so e*LN2_HI is exact. */
    static const double LN2_HI = 6.93147180369123816490e-01;
    static const double LN2_LO = 1.90821492927058770002e-10;
    static const double INV_ODD[12] = {1.0,        1.0 / 3,  1.0 / 5,  1.0 / 7,
                                       1.0 / 9,  1.0 / 11, 1.0 / 13, 1.0 / 15,
                                       1.0 / 17, 1.0 / 19, 1.0 / 21, 1.0 / 23};
    int e;
    double m = frexp(x, &e);
    if (m < 0.70710678118654752440) {
        m *= 2.0;
        e -= 1;
    }
    double s = (m - 1.0) / (m + 1.0);
    double s2 = s * s;
    double poly = INV_ODD[11];
    for (int k = 10; k >= 0; k--)
        poly = INV_ODD[k] + s2 * poly;
    return (double)e * LN2_HI + ((double)e * LN2_LO + 2.0 * s * poly);
}

double mkv_rng_normal(mkv_rng *r)
{
    if (r->has_spare) {
        r->has_spare = 0;
        return r->spare;
    }
    double u, v, s;
    do {
        u = 2.0 * mkv_rng_uniform(r) - 1.0;
        v = 2.0 * mkv_rng_uniform(r) - 1.0;
        s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    /* sqrt is correctly rounded by IEEE 754, so this is portable too */
    double f = sqrt(-2.0 * mkv_rng_log(s) / s);
    r->spare = v * f;
    r->has_spare = 1;
    return u * f;
}
