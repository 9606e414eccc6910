/* The GPU decode paths of the compressing methods, host side: what the
 * cache a prefill left (lib/decode/ccache.h) becomes for the GPU forward
 * pass (kernels/mkv_cuda.h, mkv_cuda_llama_*).  Quest keeps the pass's
 * dense cache (lib/decode/decoder.c); MosaicKV's packed heads are
 * converted here, since only gpu/ may read mosaic's format. */
#ifndef MKV_DECODE_GPU_H
#define MKV_DECODE_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "core/mkv.h"
#include "methods/method.h"
#include "mkv_cuda.h"

/* Whether mosaic with parameters p decodes on the GPU: 1 yes; 0 no, with
 * the reason in why (a parameter the packed kernels do not take). */
int mkv_gpu_decode_mosaic_supports(const mkv_params *p, char *why, size_t len);

/* Whether the GPU takes those states (the checks of use_mosaic below,
 * before any GPU work). */
int mkv_gpu_decode_mosaic_check(void *const *states, int n_states, const mkv_params *p, mkv_error *err);

/* Hand the pass g (made with external_cache) the packed cache of the
 * mosaic states of every layer, request and KV head (states
 * [n_layers][batch][n_kv_heads], as the compressed caches hold them, right
 * after their prefills), with room for max_new decoded tokens per head,
 * attended under p's budget and agg, the blocks scored with block keys of
 * blockkey_bits: 16 (or 0) the fp16 rows, as the CPU's; 8 their 8-bit
 * codes, the fp16 rows then dropped (kernels/mkv_cuda.h,
 * mkv_cuda_mosaic_blockkeys8).  MKV_EUNSUP, naming why, for a cache the GPU cannot take (a head
 * without a packed segment or with its recent window not full, a shape
 * of the kernels' limits). */
int mkv_gpu_decode_use_mosaic(mkv_cuda_llama *g, void *const *states, int n_states, const mkv_params *p,
                              int max_new, int blockkey_bits, mkv_error *err);

/* In place of a prefill, for speed runs: the pass g (made with
 * external_cache) takes a synthetic packed cache of n tokens per head
 * (mkv_cuda_mosaic_synth) shaped by p's fixed strategy in every segment:
 * r = ceil(keep x head_dim) values of d' = ceil(dprime x head_dim) rotated
 * channels (head_dim / 2 when dprime is 0, as the paper's d' = d/2),
 * rounded up to a multiple of 32, block keys of keydim with bound bounded
 * channels, p's sink, recent, segment and block; room for open_tokens
 * decoded tokens; blockkey_bits as above. */
int mkv_gpu_decode_fill_mosaic(mkv_cuda_llama *g, int n, int n_heads, int head_dim, const mkv_params *p,
                               int open_tokens, uint64_t seed, int blockkey_bits, mkv_error *err);

#endif
