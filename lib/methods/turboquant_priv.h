/* The pieces of TurboQuant (lib/methods/turboquant.c, whose top comment is
 * the algorithm), exported to the unit tests: the Lloyd-Max codebook of a
 * rotated unit vector's coordinate, the seeded rotation and sketch, and
 * the quantizer of one vector. */
#ifndef MKV_METHODS_TURBOQUANT_PRIV_H
#define MKV_METHODS_TURBOQUANT_PRIV_H

#include <stdint.h>
#include "core/mkv.h"

#define MKV_TQ_MAX_BITS 4

typedef struct {
    int levels;                                      /* 2^bits (1 for 0 bits: the centroid 0) */
    double centroid[1 << MKV_TQ_MAX_BITS];           /* ascending */
    double boundary[(1 << MKV_TQ_MAX_BITS) - 1];     /* midpoints of neighbouring centroids */
    double distortion;   /* E ||u - u'||^2 for a uniformly random unit vector u */
    int iterations;      /* Lloyd-Max iterations taken */
} mkv_tq_codebook;

/* The Lloyd-Max quantizer with 2^bits levels (bits 0..MKV_TQ_MAX_BITS) of
 * one coordinate of a uniformly random unit vector of d >= 2 dimensions,
 * whose density is proportional to (1 - x^2)^((d - 3) / 2) on [-1, 1];
 * computed in double from the density's closed-form mass and first
 * moment. */
void mkv_tq_codebook_make(int d, int bits, mkv_tq_codebook *cb);
/* Index of the cell of x: the number of boundaries below x. */
unsigned mkv_tq_cell(const mkv_tq_codebook *cb, double x);

typedef struct {
    int d, bits;             /* bits of the codebook, 0..MKV_TQ_MAX_BITS */
    mkv_tq_codebook cb;
    double *rotation;        /* [d][d]: y = rotation u */
    double *sketch;          /* [d][d] i.i.d. standard normals, or NULL: no residual sketch */
} mkv_tq_quantizer;

/* The quantizer of tensor `tensor` (0 keys, 1 values) of (layer, head) for
 * `seed`: its rotation and, when sketch is set, its QJL matrix, drawn from
 * their own mkv_rng streams (mkv_tq_streams). MKV_ENOMEM. */
int mkv_tq_quantizer_init(mkv_tq_quantizer *q, int d, int bits, int sketch, uint64_t seed, int layer, int head,
                          int tensor, mkv_error *err);
void mkv_tq_quantizer_free(mkv_tq_quantizer *q);

/* Encode x [d]: *norm its norm rounded to float16, codes [d], and with a
 * sketch signs [d] (1 for a non-negative projection) and *rnorm, the norm
 * of the unit vector's residual rounded to float16. work holds 2d doubles.
 * MKV_EFORMAT (naming what) when the norm is not finite or beyond
 * float16. */
int mkv_tq_encode(const mkv_tq_quantizer *q, const float *x, float *norm, uint8_t *codes, uint8_t *signs,
                  float *rnorm, double *work, const char *what, mkv_error *err);
/* The reconstruction in rotated coordinates y [d] (the vector itself is
 * rotation^T y) from what mkv_tq_encode gave. */
void mkv_tq_decode(const mkv_tq_quantizer *q, float norm, const uint8_t *codes, const uint8_t *signs, float rnorm,
                   float *y);

#endif
