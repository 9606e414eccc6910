/* MosaicKV's GPU decode path (decode_gpu.h): every (layer, KV head)'s
 * packed head in one GPU layout, each with an open segment for the tokens
 * the decode will push out of its recent window. */
#include "config.h"
#include "gpu/decode_gpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/gpu_method.h"
#include "mosaic/mosaic.h"
#include "mosaic/packed.h"

int mkv_gpu_decode_mosaic_supports(const mkv_params *p, char *why, size_t len)
{
    if (!mkv_gpu_mosaic_kernel_takes(p, why, len))
        return 0;
    if (strcmp(mkv_params_str(p, "headbudget"), "off") != 0) {
        snprintf(why, len, "headbudget=%s (the GPU kernel gives every head one budget)", mkv_params_str(p, "headbudget"));
        return 0;
    }
    if (mkv_params_int(p, "recent") < 1) {
        snprintf(why, len, "recent=0 (the GPU growth moves tokens out of a recent window)");
        return 0;
    }
    return 1;
}

static int packed_params(const mkv_params *p, int blockkey_bits, mkv_packed_params *pp, mkv_error *err)
{
    if (blockkey_bits != 0 && blockkey_bits != 16 && blockkey_bits != 8)
        return mkv_fail(err, MKV_EUSAGE, "mosaic on the GPU: block keys of %d bits; 16 or 8", blockkey_bits);
    *pp = (mkv_packed_params){.budget = mkv_params_double(p, "budget"),
                              .agg_sum = strcmp(mkv_params_str(p, "agg"), "sum") == 0,
                              .blockkey_bits = blockkey_bits ? blockkey_bits : 16};
    return MKV_OK;
}

int mkv_gpu_decode_fill_mosaic(mkv_cuda_llama *g, int n, int n_heads, int head_dim, const mkv_params *p,
                               int open_tokens, uint64_t seed, int blockkey_bits, mkv_error *err)
{
    char why[160];
    if (!mkv_gpu_decode_mosaic_supports(p, why, sizeof why))
        return mkv_fail(err, MKV_EUNSUP, "mosaic on the GPU: %s", why);
    const double dprime = mkv_params_double(p, "dprime");
    int dp = dprime > 0 ? mkv_mosaic_kept(dprime, head_dim) : head_dim / 2;
    dp = (dp + 31) / 32 * 32;
    dp = dp > head_dim ? head_dim : dp;
    int r = mkv_mosaic_kept(mkv_params_double(p, "keep"), head_dim);
    int kdim = mkv_mosaic_kept(mkv_params_double(p, "keydim"), head_dim);
    r = r > dp ? dp : r;
    kdim = kdim > dp ? dp : kdim;
    const int bound = (int)mkv_params_int(p, "bound");
    const mkv_packed_synth s = {.head_dim = head_dim, .block = (int)mkv_params_int(p, "block"), .n_heads = n_heads,
                                .tokens = n, .sink = mkv_params_int(p, "sink"), .recent = mkv_params_int(p, "recent"),
                                .segment = mkv_params_int(p, "segment"), .dprime = dp, .r = r, .kdim = kdim,
                                .kbound = bound < kdim ? bound : kdim, .open_tokens = open_tokens > 0 ? open_tokens : 1,
                                .seed = seed};
    if (n <= s.sink + s.recent)
        return mkv_fail(err, MKV_EUSAGE, "mosaic on the GPU: --fill %d leaves no packed segment beside sink=%lld "
                        "and recent=%lld", n, (long long)s.sink, (long long)s.recent);
    mkv_packed_params pp;
    int rc = packed_params(p, blockkey_bits, &pp, err);
    return rc ? rc : mkv_cuda_llama_fill_mosaic(g, n, &s, &pp, err);
}

int mkv_gpu_decode_mosaic_check(void *const *states, int n_states, const mkv_params *p, mkv_error *err)
{
    char why[160];
    if (!mkv_gpu_decode_mosaic_supports(p, why, sizeof why))
        return mkv_fail(err, MKV_EUNSUP, "mosaic on the GPU: %s", why);
    const int64_t recent = mkv_params_int(p, "recent");
    for (int i = 0; i < n_states; i++) {
        const mkv_mosaic_head *h = mkv_mosaic_state_head(states[i]);
        if (h->k.nseg < 1 || h->recent_n != recent)
            return mkv_fail(err, MKV_EUNSUP, "mosaic on the GPU: a prompt of %lld tokens leaves no packed segment "
                            "beside a full recent window (sink + recent + 1 tokens at least)", (long long)h->T);
        if (h->budget_scale > 0)
            return mkv_fail(err, MKV_EUNSUP, "mosaic on the GPU: per-head budgets (the GPU kernel gives every head one)");
        if (h->d != 64 && h->d != 128)
            return mkv_fail(err, MKV_EUNSUP, "mosaic on the GPU: head_dim %d; the GPU kernels take 64 and 128", h->d);
    }
    return MKV_OK;
}

int mkv_gpu_decode_use_mosaic(mkv_cuda_llama *g, void *const *states, int n_states, const mkv_params *p,
                              int max_new, int blockkey_bits, mkv_error *err)
{
    mkv_packed_params pp;
    int rc = mkv_gpu_decode_mosaic_check(states, n_states, p, err);
    if (!rc)
        rc = packed_params(p, blockkey_bits, &pp, err);
    if (rc)
        return rc;
    const mkv_mosaic_head **heads = mkv_calloc((size_t)n_states, sizeof *heads, "head list", err);
    if (!heads)
        return err ? err->code : MKV_ENOMEM;
    for (int i = 0; i < n_states; i++)
        heads[i] = mkv_mosaic_state_head(states[i]);
    mkv_gpu_layout lay;
    if (rc == MKV_OK && (rc = mkv_gpu_layout_build(heads, n_states, max_new > 0 ? max_new : 1, 1, &lay, err)) == MKV_OK) {
        rc = mkv_cuda_llama_use_mosaic(g, &lay.l, &pp, err);
        mkv_gpu_layout_free(&lay);
    }
    mkv_free(heads);
    return rc;
}
