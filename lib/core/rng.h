/* A small seeded random number generator whose streams are the same on
 * every machine and compiler: xoshiro256** seeded through splitmix64,
 * uniform doubles from the top 53 bits, standard normals by Marsaglia's
 * polar method with a logarithm computed here from basic IEEE operations
 * (libm's log may differ in the last bit between C libraries).
 *
 * Independent substreams (one per layer and head, say) come from
 * mkv_rng_seed_stream: the same (seed, keys) always give the same stream,
 * whatever else was drawn before. */
#ifndef MKV_RNG_H
#define MKV_RNG_H

#include <stdint.h>

typedef struct {
    uint64_t s[4];
    double spare;      /* second normal of the last polar pair */
    int has_spare;
} mkv_rng;

/* splitmix64 step: advances *state and returns the next output. */
uint64_t mkv_splitmix64(uint64_t *state);

void mkv_rng_seed(mkv_rng *r, uint64_t seed);
/* Seed from seed and n keys (e.g. layer, head, purpose). */
void mkv_rng_seed_stream(mkv_rng *r, uint64_t seed, const uint64_t *keys, int n);

uint64_t mkv_rng_next(mkv_rng *r);            /* 64 random bits */
double mkv_rng_uniform(mkv_rng *r);           /* [0, 1), multiples of 2^-53 */
uint64_t mkv_rng_below(mkv_rng *r, uint64_t n); /* uniform in [0, n), n > 0, unbiased */
double mkv_rng_normal(mkv_rng *r);            /* standard normal */

/* Natural logarithm of x > 0 from +, -, *, / and frexp only (bit-identical
 * on every IEEE machine); exported so tests can compare it with libm. */
double mkv_rng_log(double x);

#endif
