/* Method "uniform2d": the ablation step between rotation and per-vector
 * selection. Like "mosaic" with a fixed strategy (lib/mosaic/method.c:
 * same segments, rotations, dense sink/recent, block keys, token selection
 * and attention), but every vector keeps the same r = ceil(keep x
 * head_dim) channels: the first r rotated ones (largest eigenvalues), one
 * global truncation per segment, d' = r for keys and values. No bitmap is
 * stored (strategy column pervector = 0); the key rotation keeps
 * max(r, keydim) columns for the block keys. Stored arrays: those of
 * "mosaic". */
#include "config.h"
#include "mosaic/mosaic.h"
#include "methods/baseline.h"

#include <string.h>

static const mkv_param_spec uniform2d_params[] = {
    {"sink", MKV_PARAM_INT, "4", 0, 1e9, NULL, "tokens kept dense at the start (attention sinks)"},
    {"recent", MKV_PARAM_INT, "64", 0, 1e9, NULL, "most recent tokens kept dense"},
    {"segment", MKV_PARAM_INT, "2048", 1, 1e9, NULL, "tokens per segment S (one rotation each)"},
    {"block", MKV_PARAM_INT, "8", 1, 1e6, NULL, "tokens per block key B (the selection unit)"},
    {"keydim", MKV_PARAM_DOUBLE, "0.5", 0, 1, NULL,
     "fraction of head_dim the block keys span: the first ceil(keydim x head_dim) rotated channels", MKV_PARAM_ABOVE_MIN},
    {"bound", MKV_PARAM_INT, "2", 0, 1024, NULL,
     "leading block-key channels stored as min and max (a bound on q.k) instead of the mean"},
    {"keep", MKV_PARAM_DOUBLE, "0.25", 0, 1, NULL,
     "fraction of head_dim kept, the same r = ceil(keep x head_dim) rotated channels for every vector", MKV_PARAM_ABOVE_MIN},
    {"budget", MKV_PARAM_DOUBLE, "0.1", 0, 1e15, NULL,
     "tokens attended per step: fraction (<= 1) of the context or a count (> 1)", MKV_PARAM_ABOVE_MIN},
    {"agg", MKV_PARAM_STRING, "max", 0, 0, "max sum", "block score over the G query heads: max or sum"},
    {"refine", MKV_PARAM_DOUBLE, "1", 1, 1e3, NULL,
     "blocks for refine x the budget, then the budget's best tokens of them by their compressed keys "
     "(1: blocks only)"},
    {NULL, 0, NULL, 0, 0, NULL, NULL},
};

static void uniform2d_config(const mkv_params *p, int d, mkv_mosaic_config *c)
{
    mkv_mosaic_config_common(p, d, c);
    c->r = mkv_mosaic_kept(mkv_params_double(p, "keep"), d);
    c->g = 1;
    c->pervector = 0;
}

static int uniform2d_check(const mkv_params *p, const mkv_dump_meta *m, mkv_error *err)
{
    int rc = mkv_mosaic_check_common(p, m, err);
    if (rc == MKV_OK)
        mkv_bl_warn_budget("uniform2d", p, m->n_tokens);
    return rc;
}

static int uniform2d_compress(const mkv_params *p, const mkv_head_kv *in, mkv_cdump_writer *w,
                              mkv_error *err)
{
    mkv_mosaic_config c;
    uniform2d_config(p, in->d, &c);
    return mkv_mosaic_compress_store(&c, in, w, err);
}

static int uniform2d_load(const mkv_params *p, mkv_cdump *c, int layer, int head, void **state, mkv_error *err)
{
    return mkv_mosaic_state_load(p, c, layer, head, uniform2d_config, state, err);
}

const mkv_method mkv_method_uniform2d = {
    .name = "uniform2d",
    .summary = "SVD rotation per segment + one channel truncation for all vectors (mosaic's ablation)",
    .params = uniform2d_params,
    .check = uniform2d_check,
    .compress = uniform2d_compress,
    .load = uniform2d_load,
    .attend = mkv_mosaic_method_attend,
    .attend_pieces = MKV_MOSAIC_PIECES,
    .attend_begin = mkv_mosaic_method_attend_begin,
    .attend_piece = mkv_mosaic_method_attend_piece,
    .attend_end = mkv_mosaic_method_attend_end,
    .free_state = mkv_mosaic_method_free,
    .append = mkv_mosaic_method_append,
    .state_bytes = mkv_mosaic_method_state_bytes,
    .decode_counters = mkv_mosaic_method_decode_stats,
    .decode_flush = mkv_mosaic_method_flush,
};
