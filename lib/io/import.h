/* Importing KV caches from other tools' files into a dump v1:
 *   - safetensors, one file with tensors named per layer
 *     (default names "layers.{L}.k", "layers.{L}.v", optional
 *     "layers.{L}.q", "tokens", "query_pos"; see man/mkv-capture.1),
 *   - vLLM's per-layer layout: a directory of <layer>.safetensors files each
 *     holding "kv_cache" of shape [2, T, kv_heads, head_dim],
 *   - NumPy .npy: one file of shape [n_layers, 2, kv_heads, T, head_dim].
 * Attributes the source lacks (model name, n_heads, rope_theta, ...) come
 * from the options. A source without queries gives a dump with W = 0
 * (empty q datasets and query_pos). */
#ifndef MKV_IMPORT_H
#define MKV_IMPORT_H

#include "io/dump.h"

typedef enum {
    MKV_IMPORT_AUTO = 0,     /* by path: directory -> vllm, *.npy -> npy, else safetensors */
    MKV_IMPORT_SAFETENSORS,
    MKV_IMPORT_VLLM,
    MKV_IMPORT_NPY
} mkv_import_kind;

typedef struct {
    mkv_import_kind kind;
    const char *model;       /* model name attribute (default: source file name) */
    int n_heads;             /* query heads; 0 = same as kv heads */
    int n_kv_heads;          /* 0 = from the source */
    int head_dim;            /* 0 = from the source */
    double rope_theta;       /* default 10000 */
    const char *k_rope;      /* "post" (default) or "pre" */
    mkv_dtype dtype;         /* storage type of the dump */
} mkv_import_opts;

void mkv_import_opts_init(mkv_import_opts *o);

/* Read the source at in_path and write a dump to out_path ("-" = stdout)
 * atomically. */
int mkv_import(const char *in_path, const mkv_import_opts *o,
               const char *out_path, const mkv_dump_write_opts *wo, mkv_error *err);

#endif
