/* The packed MosaicKV format, in one place: what a compressed dump of the
 * methods "mosaic" and "uniform2d" stores per layer and KV head, the
 * in-memory layout of a head (mkv_mosaic_head), storing and loading it
 * (the load checks everything the writer guarantees), and its conversion
 * to the GPU records of kernels/mkv_cuda.h. man/mosaickv.5 describes the
 * same format for readers of the files.
 *
 * CONVENTIONS
 *   - A stored rotation R is d x cols row-major (cols = d' for values,
 *     max(d', keydim) for keys): R[j * cols + c] is original channel j,
 *     rotated channel c; column c is the eigenvector of the c-th largest
 *     eigenvalue of the segment's Gram matrix X^T X. Rotated vectors are
 *     x~ = x R (x~_c = sum_j x_j R[j][c]); outputs rotate back o = o~ R^T
 *     (o_j = sum_c o~_c R[j][c]). Rotations are rounded to fp16 before they
 *     are used for anything, so compression and attention see the same
 *     matrix the file stores.
 *   - A strategy (r, g, d') keeps per vector the r/g groups of g adjacent
 *     rotated channels among the first d' with the largest energy
 *     sum x~_c^2 (ties: the lower group), r/g of d'/g groups.
 *   - Bitmap of one vector: d'/g bits, bit i = group i (channels
 *     i*g .. i*g+g-1) kept, bit i at byte i/8, bit position i%8 (LSB
 *     first), ceil(d'/g / 8) bytes per vector, pad bits zero; exactly r/g
 *     bits are set. When every group is kept (r = d') or the strategy is
 *     not per-vector (uniform2d: the first r channels for every vector), no
 *     bitmap is stored.
 *   - Values of one vector: the r kept x~_c in ascending channel order.
 *     The k-th value sits at the channel of the k-th set bit (group
 *     (k/g)-th set bit, offset k%g); equivalently channel c's value index is
 *     g * popcount(bits below c's group) + c%g. A strategy of 16 bits
 *     stores them as fp16. One of b = 8, 4 or 2 bits stores b-bit codes:
 *     per segment, tensor and token group (qgroup consecutive tokens from the
 *     segment start, the last group shorter; qgroup 0: the whole segment)
 *     each rotated channel c < d' has a zero z_c and a step s_c (fp16;
 *     mkv_bl_quant_range over the minimum and maximum of x~_c over all the
 *     group's vectors, kept or not, so z_c <= x~_c <= z_c + (2^b - 1) s_c;
 *     groups localise outlier tokens, which would widen every step of the
 *     segment), a value's code is round((x~_c - z_c) / s_c)
 *     clamped to 0..2^b - 1, and it reads back as fp16(z_c + code s_c),
 *     within s_c / 2 of x~_c (mkv_mosaic_dequantize). The codes of one
 *     vector are packed in value order, the first in the low bits
 *     (mkv_bl_pack), ceil(r b / 8) bytes per vector, pad bits zero.
 *   - Block keys (keys only): per block of B tokens of a segment (blocks
 *     start at the segment start; the segment's last block may be shorter)
 *     one row of keydim + bound fp16 values over the first keydim
 *     channels of the segment's key space (rotated: the leading rotated
 *     channels; unrotated: all d raw channels), all elements of the
 *     block's keys, not only the kept ones:
 *       [0, bound)                  minimum over the block of channel c
 *       [bound, 2 bound)            maximum over the block of channel c - bound
 *       [2 bound, keydim + bound)   mean over the block of channel c - bound
 *     A query q~ scores the block with sum over c < bound of
 *     max(q~_c min_c, q~_c max_c) (Quest's bound of q~.k over the block on
 *     those channels) plus sum over bound <= c < keydim of q~_c mean_c.
 *     The bound channels are the leading eigen-directions: on real keys a
 *     large share of a block's spread in q~.k lives there, and a mean
 *     hides it. A segment with keydim = 0 (and bound 0) stores no block
 *     keys: no step selects among its tokens, every query attends them all
 *     (written when every token is attended, budget 1).
 *   - Stored floats are fp16, and stay fp16 bit patterns (uint16_t) in
 *     memory: attention converts what it reads to float32 (exactly, in
 *     F16C where the CPU has it). Codes stay codes: attention reads a
 *     quantized vector back when it attends it (mkv_mosaic_vector_values).
 *
 * STORED ARRAYS (group /layers/NN/HH of the compressed dump; X is k or v;
 * flat arrays concatenate the segments in order; a segment's offsets
 * follow from the tables, so none are stored; an array with no element is
 * absent):
 *   X/dense      float16 [sink_n + recent_n][d]  tokens 0..sink_n-1 then
 *                T-recent_n..T-1 (sink_n = min(sink, T), recent_n =
 *                min(recent, T - sink_n))
 *   X/strategy   int32 [nseg][9]   start, length, rotate, r, g, d',
 *                pervector (1; 0 only for uniform2d), bits (16, 8, 4 or
 *                2), qgroup (tokens per zero/step group; 0: the whole
 *                segment); a table of the first 8 columns reads as
 *                qgroup 0, of the first 7 as 16 bits throughout.
 *   k/blockdims  int32 [nseg][2]   keydim, bound of the block keys
 *   X/loss       float32 [nseg][2] energy dropped, output error added (NaN:
 *                not measured; it may be < 0 where packing happens to help)
 *   X/values     float16 [sum len*r]  (16-bit segments)
 *   X/codes      uint8 [sum len*ceil(r*bits/8)]  (quantized segments)
 *   X/qparams    float16 [sum groups*d'][2]  zero and step of each
 *                rotated channel c < d' per token group (quantized
 *                segments; groups = ceil(len/qgroup), 1 for qgroup 0)
 *   X/bitmap     uint8 [sum len*ceil(d'/g/8)]  (segments with a bitmap)
 *   k/blockkeys  float16 [sum ceil(len/B)*(keydim+bound)]
 *   budget_scale float32 [1]  the head's token budget as a multiple of the
 *                method's (per-head budgets planned over every head,
 *                methods/head_budget.h; absent: the method's budget)
 *   X/rotation   float16 [sum d*cols]  (rotated segments; [d][cols] each,
 *                cols = max(d', keydim) for keys, d' for values)
 * ("sum" runs over the segments the parenthesis names, in order.)
 * Every byte attention needs is one of these, so physical_bytes counts it.
 *
 * WHAT THE WRITER GUARANTEES and mkv_mosaic_load checks (MKV_EFORMAT naming
 * the file, layer, KV head and array otherwise): every array has the
 * shape and type above, absent exactly when empty; the K and V strategy
 * tables have the same segments, which tile tokens [sink_n, T - recent_n)
 * in order; every row is a valid strategy (g in {1, 2, 4}, g | r, g | d',
 * r <= d' <= d, d' = d unrotated, keydim 0 (no block keys, bound 0) or
 * 1 <= keydim <= d and 0 <= bound <= keydim for keys, keydim = d or 0
 * and bound = 0 unrotated, bits 16, 8, 4 or
 * 2, qgroup 0 at 16 bits and 0 or 1..len-1 otherwise); budget_scale is
 * > 0 and finite; every bitmap has
 * exactly r/g set bits, all below d'/g; the pad bits
 * of every vector's codes are zero, every step is >= 0; values, zeros,
 * steps, block keys, rotations and dense rows are finite (mkv_cdump_get refuses NaN and Inf, naming the
 * file and the dataset's path). */
#ifndef MKV_MOSAIC_PACKED_H
#define MKV_MOSAIC_PACKED_H

#include <stdint.h>
#include "io/cdump.h"
#include "core/mkv.h"
#include "mkv_cuda.h"

/* Largest head_dim the format handles (per-vector scratch lives on the stack). */
#define MKV_MOSAIC_MAX_D 1024

/* ---- strategy of one tensor (K or V) of one segment ---- */
typedef struct {
    int64_t start, len;   /* tokens [start, start + len) of the cache */
    int rotate;           /* 1: rotation stored and applied; 0: R = identity, d' = d */
    int r;                /* kept elements per vector (multiple of g, <= d') */
    int g;                /* group size: 1, 2 or 4 */
    int dprime;           /* rotated channels kept (multiple of g) */
    int pervector;        /* 1: top groups per vector (bitmap); 0: first r channels */
    int bits;             /* 16: fp16 values; 8, 4, 2: codes with per-channel zero and step */
    int qgroup;           /* quantized: tokens sharing one zero and step per channel (1..len-1);
                             0: the whole segment (and always at 16 bits) */
    int keydim;           /* keys: block-key channels (1..d; d when unrotated; 0: no block
                             keys, the segment attended whole); values: 0 */
    int bound;            /* keys: leading block-key channels stored as min and max
                             (0..keydim; 0 when unrotated); values: 0 */
} mkv_mosaic_strategy;

/* Columns of the stored strategy table (int32 [nseg][9]), in this order:
 * start, length, rotate, r, g, d', pervector, bits, qgroup. */
#define MKV_MOSAIC_TABLE_COLS 9
/* Columns of the stored block-key table of the keys (int32 [nseg][2]):
 * keydim, bound. */
#define MKV_MOSAIC_BLOCKDIM_COLS 2
/* Columns of the stored loss table (float32 [nseg][2]): fraction of energy
 * dropped, attention-output error the strategy adds on the observation
 * queries (NaN when not measured; see mkv_mosaic_evaluate). */
#define MKV_MOSAIC_LOSS_COLS 2

/* Bitmap bytes per vector: ceil(d'/g / 8), 0 when no bitmap is stored. */
int mkv_mosaic_bitmap_bytes(const mkv_mosaic_strategy *s);
/* Bytes of one vector's values: 2 r at 16 bits, else ceil(r bits / 8). */
int mkv_mosaic_vector_bytes(const mkv_mosaic_strategy *s);
/* Token groups with their own zeros and steps: ceil(len / qgroup), 1 when
 * qgroup is 0; 0 at 16 bits. */
int64_t mkv_mosaic_qgroups(const mkv_mosaic_strategy *s);
/* fp16 elements of the segment's zeros and steps: 2 d' per token group. */
int64_t mkv_mosaic_qparam_count(const mkv_mosaic_strategy *s);
/* The value a code reads back as: fp16(zero + code step), as a float. */
float mkv_mosaic_dequantize(unsigned code, float zero, float step);
/* Bytes attention reads once per segment with attended tokens, beside
 * the tokens' own: R_v (rotated values). */
uint64_t mkv_mosaic_attended_segment_bytes(const mkv_mosaic_strategy *vs, int d);
/* Bytes of zeros and steps attention reads for the segment's token i
 * (tokens visited in ascending order): those of its token group when the
 * group differs from *last (the previous token's, -1 at first), which
 * becomes *last; 0 at 16 bits. */
uint64_t mkv_mosaic_qparams_read(const mkv_mosaic_strategy *s, int64_t i, int64_t *last);
/* The token group of the segment's token i (0 when qgroup is 0). */
int64_t mkv_mosaic_qgroup_of(const mkv_mosaic_strategy *s, int64_t i);
/* Blocks of B tokens covering len tokens. */
int64_t mkv_mosaic_nblocks(int64_t len, int B);
/* Stored columns of the segment's rotation: max(d', keydim) when rotated, else 0. */
int mkv_mosaic_rotation_cols(const mkv_mosaic_strategy *s);
/* fp16 values per block-key row: keydim + bound. */
int mkv_mosaic_block_width(const mkv_mosaic_strategy *s);

/* Bytes one segment of one tensor stores with strategy s, by array. */
typedef struct {
    uint64_t values;      /* len * mkv_mosaic_vector_bytes (fp16 values or codes) */
    uint64_t qparams;     /* mkv_mosaic_qparam_count * 2 */
    uint64_t bitmap;      /* len * bitmap_bytes */
    uint64_t blockkeys;   /* keys: nblocks * (keydim + bound) * 2; values: 0 */
    uint64_t rotation;    /* rotate: d * mkv_mosaic_rotation_cols * 2; else 0 */
    uint64_t total;
} mkv_mosaic_bytes;
/* block = B for keys, 0 for values (no block keys). */
void mkv_mosaic_strategy_bytes(const mkv_mosaic_strategy *s, int d, int block, mkv_mosaic_bytes *b);

/* ---- packed head state (one layer x KV head) ---- */
typedef struct {
    int64_t nseg;
    mkv_mosaic_strategy *seg;   /* [nseg] */
    float *loss;                /* [nseg][2] */
    /* fp16 arrays (uint16_t) are fp16 bit patterns, as stored */
    uint16_t *values;           /* the 16-bit segments' values, concatenated [len][r] each
                                   (quantized segments: none; mkv_mosaic_vector_values reads
                                   their codes) */
    uint8_t *codes;             /* quantized segments: [len][vector bytes] */
    uint16_t *qparams;          /* quantized segments: [token groups][d'][2] zero, step */
    uint8_t *bitmap;            /* [len][bitmap_bytes] */
    uint16_t *blockkeys;        /* keys only: [nblocks][keydim + bound] */
    uint16_t *rotation;         /* rotated segments only: [d][mkv_mosaic_rotation_cols] */
    /* element offsets of each segment's part of the arrays above (derived
     * from the table by mkv_mosaic_layout, not stored) */
    int64_t *off_values, *off_bitmap, *off_blockkeys, *off_rotation, *off_codes, *off_qparams;
    int64_t n_values, n_bitmap, n_blockkeys, n_rotation, n_codes, n_qparams;
} mkv_mosaic_tensor;

typedef struct {
    int d, G, block;
    int64_t T;
    int64_t sink_n, recent_n;   /* dense tokens [0, sink_n) and [T - recent_n, T) */
    float budget_scale;         /* > 0: the head's token budget is mkv_mosaic_scaled_budget of the
                                   method's (stored "budget_scale"); 0: the method's */
    uint16_t *dense_k, *dense_v;   /* [sink_n + recent_n][d], fp16, sink first */
    mkv_mosaic_tensor k, v;
} mkv_mosaic_head;

/* A fractional budget (<= 1) scaled by a head's budget_scale, at most 1;
 * a token count (> 1) stays as it is. */
double mkv_mosaic_scaled_budget(float scale, double budget);

/* The r values of the segment's vector i as attention reads them, in buf
 * [r] (returned), pos [r] its channels (mkv_mosaic_positions): a 16-bit
 * segment's fp16 values converted; a quantized one's codes read back
 * (mkv_mosaic_dequantize with the zero and step of the value's channel in
 * the token's group). */
const float *mkv_mosaic_vector_values(const mkv_mosaic_tensor *t, int64_t si, int64_t i, const int *pos, float *buf);
/* out [r] = the r codes of `bits` bits packed in `packed` read back with
 * qp [d'][2] (fp16 zero, step per channel) at the channels pos [r]; in
 * AVX2 and F16C where the CPU has them, equal bit for bit to the scalar
 * form. */
void mkv_mosaic_dequantize_vector(const uint8_t *packed, int bits, int r, const int *pos, const uint16_t *qp,
                                  float *out);
void mkv_mosaic_dequantize_vector_scalar(const uint8_t *packed, int bits, int r, const int *pos, const uint16_t *qp,
                                         float *out);

/* Offsets and totals of t from its strategy table (keys: block > 0), the
 * segments tiling tokens [first, last). MKV_EFORMAT when the table is
 * inconsistent (d' > d, g not dividing r, segments not contiguous,
 * block-key shape out of range, ...). */
int mkv_mosaic_layout(mkv_mosaic_tensor *t, int d, int block, int64_t first, int64_t last,
                      mkv_error *err);
void mkv_mosaic_head_free(mkv_mosaic_head *h);

/* ---- the compressed dump ---- */
/* Write the arrays of a head (STORED ARRAYS above). */
int mkv_mosaic_store(const mkv_mosaic_head *h, mkv_cdump_writer *w, int layer, int head,
                     mkv_error *err);
/* Read and check the arrays of (layer, head) for block keys of `block`
 * tokens and sink and recent dense tokens as recorded in the dump's
 * parameters. MKV_EFORMAT (see WHAT THE WRITER GUARANTEES) leaves h empty. */
int mkv_mosaic_load(mkv_cdump *c, int layer, int head, int block, int64_t sink, int64_t recent,
                    mkv_mosaic_head *h, mkv_error *err);

/* ---- conversion to the GPU records (kernels/mkv_cuda.h) ----
 * Loaded heads become the GPU layout: per-block records of packed values
 * and per-channel bitmaps (groups of g > 1 and the implicit first-r
 * bitmaps written out), d' padded to multiples of 32, block keys and
 * rotations padded alike, fp16 throughout. The stored values are not
 * changed, so the GPU computes the CPU's function. */

/* Host copy of the GPU layout of some heads; `l` points into the arrays. */
typedef struct {
    mkv_packed_layout l;
    mkv_packed_head *heads;
    mkv_packed_seg *segs;
    uint8_t *records;
    uint16_t *blockkeys, *rotations, *dense_k, *dense_v;
} mkv_gpu_layout;

/* Build the layout of n heads (same head_dim and block size).  With
 * temp_tokens > 0 every head that has a segment gets room for that many
 * new tokens with its last segment's strategy and rotations: open 0, a
 * temporary region after its T tokens, attended whole (what
 * mkv_cuda_mosaic_append encodes into); open 1, an open segment after its
 * last segment, scored with block keys of the same shape (what
 * mkv_cuda_mosaic_grow packs the tokens leaving the recent rows into, as
 * lib/mosaic/decode.c grows a head).  MKV_EUNSUP (with the reason) for
 * shapes the GPU kernel does not take. */
int mkv_gpu_layout_build(const mkv_mosaic_head *const *heads, int n, int64_t temp_tokens, int open,
                         mkv_gpu_layout *out, mkv_error *err);
void mkv_gpu_layout_free(mkv_gpu_layout *g);

/* bytes_read of mkv_mosaic_attend (rule 5 of lib/mosaic/method.c) for a
 * query at pos that attended the packed blocks flagged in blocks [head's
 * blocks, numbered over its segments in order] and nd dense tokens. */
uint64_t mkv_gpu_mosaic_bytes(const mkv_mosaic_head *h, int64_t pos, const uint8_t *blocks, int64_t nd);

#endif
