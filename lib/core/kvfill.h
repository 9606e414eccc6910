/* The synthetic keys and values a speed run fills a dense cache with
 * instead of prefilling that many tokens (mkv-decode --fill): element c
 * of the key (which 0) or value (which 1) row of position pos, KV head
 * `head`, layer `layer` is uniform on [-sqrt 3, sqrt 3) (mean 0, variance
 * 1), from a counter-based hash of (seed, layer, head, pos, c, which), so
 * the CPU pass (lib/model/forward.c) and the GPU pass
 * (kernels/llama_forward.cu) fill the same rows in any order; each cache
 * stores it rounded to fp16. Independent across elements: attention over
 * such rows is close to uniform, which changes nothing in the time of a
 * dense step. Speed only, never accuracy. */
#ifndef MKV_KVFILL_H
#define MKV_KVFILL_H

#include <stdint.h>

#ifdef __CUDACC__
#define MKV_KVFILL_FN static __host__ __device__ __forceinline__
#else
#define MKV_KVFILL_FN static inline
#endif

/* splitmix64's output function of x (a bijection with good avalanche) */
MKV_KVFILL_FN uint64_t mkv_kvfill_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

MKV_KVFILL_FN float mkv_kvfill_value(uint64_t seed, int layer, int n_kv_heads, int head, int64_t pos,
                                     int head_dim, int c, int which)
{
    uint64_t row = ((uint64_t)layer * (uint64_t)n_kv_heads + (uint64_t)head) << 40 | (uint64_t)pos;
    uint64_t u = mkv_kvfill_mix(seed ^ mkv_kvfill_mix((row * (uint64_t)head_dim + (uint64_t)c) * 2u + (uint64_t)which));
    double x = (double)(u >> 11) * (1.0 / 9007199254740992.0);   /* [0, 1) in 53 bits */
    return (float)((2.0 * x - 1.0) * 1.7320508075688772);
}

#endif
