/* GPU attention over compressed dumps, host side.
 *
 * 1. Conversion at load, in one place (DESIGN.md 5.1): loaded MosaicKV
 *    heads (lib/mosaic/mosaic.h, as mkv_mosaic_load or mkv_mosaic_compress give
 *    them) become the GPU layout of kernels/mkv_cuda.h: per-block records
 *    of packed values and per-channel bitmaps (groups of g > 1 and the
 *    implicit first-r bitmaps written out), d' padded to multiples of 32,
 *    block keys and rotations padded alike, fp16 throughout.  The stored
 *    values are not changed, so the GPU computes the CPU's function.
 * 2. The methods' GPU paths, which answer all queries of one dump head
 *    on the GPU, for mkv-attend --device gpu: mosaic and uniform2d (the
 *    packed kernel), quest (the Quest-style kernel), full (the dense
 *    kernel); one file each in lib/gpu/, listed in lib/gpu/gpu_method.c.
 *    Each reports the output, the attended tokens and bytes_read exactly
 *    as the method's CPU attend does, so the two devices' tables compare
 *    row by row. */
#ifndef MKV_GPU_PACKED_H
#define MKV_GPU_PACKED_H

#include <stddef.h>
#include <stdint.h>

#include "methods/method.h"
#include "core/mkv.h"
#include "mkv_cuda.h"
#include "mosaic/mosaic.h"

/* Host copy of the GPU layout of some heads; `l` points into the arrays. */
typedef struct {
    mkv_packed_layout l;
    mkv_packed_head *heads;
    mkv_packed_seg *segs;
    uint8_t *records;
    uint16_t *blockkeys, *rotations, *dense_k, *dense_v;
} mkv_gpu_layout;

/* Build the layout of n heads (same head_dim and block size).  With
 * temp_tokens > 0 every head that has a segment gets a temporary region
 * for that many tokens after its T tokens, with its last segment's
 * strategy and rotations (what mkv_cuda_mosaic_append encodes with).
 * MKV_EUNSUP (with the reason) for shapes the GPU kernel does not take. */
int mkv_gpu_layout_build(const mkv_mosaic_head *const *heads, int n, int64_t temp_tokens, mkv_gpu_layout *out,
                         mkv_error *err);
void mkv_gpu_layout_free(mkv_gpu_layout *g);

/* bytes_read of mkv_mosaic_attend (rule 5 of lib/mosaic/method.c) for a
 * query at pos that attended the packed blocks flagged in blocks [head's
 * blocks, numbered over its segments in order] and nd dense tokens. */
uint64_t mkv_gpu_mosaic_bytes(const mkv_mosaic_head *h, int64_t pos, const uint8_t *blocks, int64_t nd);

/* Whether method m can run on the GPU for this dump: 1 yes; 0 no, because
 * the build has no CUDA or no usable GPU is visible; -1 no, because the
 * method has no GPU path or the dump's shape is not supported.  why gets
 * the reason. */
int mkv_gpu_method_usable(const mkv_method *m, const mkv_params *p, const mkv_dump_meta *meta, char *why,
                          size_t len);

/* The queries of one (layer, KV head) of a dump. */
typedef struct {
    int G, d;
    int64_t T, W;
    const float *q;          /* [W][G][d] */
    const int64_t *pos;      /* [W] query positions */
} mkv_gpu_queries;

typedef struct {
    float *out;              /* [W][G][d] */
    uint8_t *attended;       /* [W][T], zeroed by the caller */
    uint64_t *bytes_read;    /* [W], as the method's CPU attend counts them */
} mkv_gpu_answers;

/* Answer every query of (layer, head) with method m's GPU kernel over the
 * arrays of compressed dump c (the scale is 1/sqrt(d)).  Not thread-safe
 * with respect to other GPU work of the process: callers serialise. */
int mkv_gpu_method_attend(const mkv_method *m, const mkv_params *p, mkv_cdump *c, int layer, int head,
                          const mkv_gpu_queries *q, mkv_gpu_answers *a, mkv_error *err);

#endif
