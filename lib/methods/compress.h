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
    const float *k, *v;         /* [n_kv_heads][T][head_dim] */
    const float *q;             /* [n_heads][W][head_dim] (NULL when W = 0) */
    const int32_t *query_pos;   /* [W] */
} mkv_layer_kv;

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
