/* Compression of raw KV dumps by a method: one (layer, KV head) held in
 * memory, one layer of every KV head on worker threads, or a whole dump
 * read layer by layer into a compressed dump with its byte accounting.
 * What mkv-compress runs, and what a decoder that compresses its own cache
 * calls for each layer. */
#ifndef MKV_COMPRESS_H
#define MKV_COMPRESS_H

#include <stdint.h>
#include "io/cdump.h"
#include "io/dump.h"
#include "methods/method.h"
#include "core/mkv.h"

/* A method and its parameters (checked against the method's spec table). */
typedef struct {
    const mkv_method *method;
    const mkv_params *params;
} mkv_compressor;

/* Compress one (layer, KV head) into w. A method that fails without a
 * message gets "method 'NAME' failed without a message". */
int mkv_compress_head(const mkv_compressor *c, const mkv_head_kv *in, mkv_cdump_writer *w,
                      mkv_error *err);

/* One layer of a raw dump of shape m, in memory. */
typedef struct {
    int layer;
    const float *k, *v;         /* [n_kv_heads][T][head_dim], head h at h * head_stride */
    size_t head_stride;         /* floats from one KV head's rows to the next; 0: T x head_dim */
    const float *q;             /* [n_heads][W][head_dim] (NULL when W = 0) */
    const int32_t *query_pos;   /* [W] */
    const double *budget_scale; /* [n_kv_heads] planned per-head budgets (mkv_budget_plan), or NULL */
} mkv_layer_kv;

/* Floats from KV head h's rows to h + 1's in l (of a dump of shape m). */
size_t mkv_layer_head_stride(const mkv_layer_kv *l, const mkv_dump_meta *m);

/* Per-head token budgets for a method that plans them (its
 * head_budget_rule, methods/head_budget.h): the error curves of every
 * head, gathered layer by layer, then one allocation over all of them.
 * scale stays NULL when the method plans none or the dump has no
 * observation queries (a warning says so). */
typedef struct {
    mkv_head_budget_rule rule;
    double *curves;             /* [n_layers][n_kv_heads][MKV_HEAD_BUDGET_POINTS] error curves */
    double *scale;              /* [n_layers][n_kv_heads] budget / mean, after finish */
} mkv_budget_plan;

int mkv_budget_plan_init(const mkv_compressor *c, const mkv_dump_meta *m, mkv_budget_plan *bp, mkv_error *err);
/* Whether bp gathers curves (the drivers read each layer once more for it). */
int mkv_budget_plan_wanted(const mkv_budget_plan *bp);
int mkv_budget_plan_layer(mkv_budget_plan *bp, const mkv_dump_meta *m, const mkv_layer_kv *l, int threads,
                          mkv_error *err);
int mkv_budget_plan_finish(mkv_budget_plan *bp, const mkv_dump_meta *m, mkv_error *err);
void mkv_budget_plan_free(mkv_budget_plan *bp);

/* Compress every KV head of the layer into w with up to `threads` workers
 * (threads >= 1; each head gets threads / min(threads, n_kv_heads)).  The
 * failing head of lowest index gives the error, prefixed "layer L head H"
 * unless its message already names them. */
int mkv_compress_layer(const mkv_compressor *c, const mkv_dump_meta *m, const mkv_layer_kv *l,
                       int threads, mkv_cdump_writer *w, mkv_error *err);

/* Byte accounting of a compressed dump. */
typedef struct {
    uint64_t logical_bytes;    /* dense 16-bit K+V of the raw dump */
    uint64_t physical_bytes;   /* every stored array counted */
} mkv_compress_bytes;

/* Compress the raw dump `input` into the compressed dump `output` ("-" is
 * stdin or stdout; output is written atomically and never overwrites the
 * input). Checks the parameters against the dump's shape first, refuses
 * NaN and infinity, reads one layer at a time and compresses its KV heads
 * on `threads` workers (>= 1). */
int mkv_compress_dump(const mkv_compressor *c, const char *input, const char *output, int threads,
                      mkv_compress_bytes *bytes, mkv_error *err);

#endif
