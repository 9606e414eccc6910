/* Counter-based random numbers for the synthetic data of the benchmark
 * and of the speed runs' packed caches (device code, any order). */
#ifndef MKV_RANDOM_CUH
#define MKV_RANDOM_CUH

#include <stddef.h>
#include <stdint.h>

namespace mkv_random {

__device__ __forceinline__ uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Standard normal i of stream `seed` (Box-Muller on a counter hash). */
__device__ __forceinline__ float normal_at(uint64_t seed, size_t i)
{
    const uint64_t r = mix64(seed * 0x9e3779b97f4a7c15ull + i);
    const float u1 = ((uint32_t)(r >> 40) + 1u) * (1.0f / 16777217.0f);   /* (0, 1] */
    const float u2 = (uint32_t)(r & 0xffffffu) * (1.0f / 16777216.0f);
    return sqrtf(-2.f * __logf(u1)) * __cosf(6.2831853f * u2);
}

/* Blocks of 256 threads for a grid-stride fill of n elements. */
inline unsigned fill_blocks(size_t n)
{
    const size_t b = (n + 255) / 256;
    return (unsigned)(b < 8192 ? (b ? b : 1) : 8192);
}

}  // namespace mkv_random

#endif
