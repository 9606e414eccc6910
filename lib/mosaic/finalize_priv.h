/* The finalisation of one segment closed by the dual buffer
 * (lib/mosaic/finalize.c; the dual buffer is lib/mosaic/decode.c). */
#ifndef MKV_MOSAIC_FINALIZE_PRIV_H
#define MKV_MOSAIC_FINALIZE_PRIV_H

#include "mosaic/mosaic.h"

/* Compress the segment k, v [len][d] (fp16 values) as a head of that one
 * segment under c (its sink, recent and segment ignored), taking the
 * rotations from gram_k and gram_v [d][d] (X^T X of the same tokens, both
 * triangles; unused and may be NULL without rotation). The result is
 * mkv_mosaic_compress's for those tokens with no observation queries. */
int mkv_mosaic_finalize_segment(const mkv_mosaic_config *c, const float *k, const float *v, int64_t len, int d,
                                int G, const double *gram_k, const double *gram_v, mkv_mosaic_head *out,
                                mkv_error *err);

#endif
