/* MosaicKV pieces (DESIGN.md section 5.1, 5.2): rotation, truncation by
 * energy, per-vector selection, packing, block keys, strategy search and
 * byte cost, plus the packed head state and its CPU attention. The
 * methods "mosaic" and "uniform2d" (lib/method_mosaic.c, whose top comment
 * is the algorithm's description, and lib/method_uniform2d.c) are built
 * from them; the GPU kernels and the dual buffer reuse them.
 *
 * Conventions every user of these pieces follows:
 *   - A rotation R is d x d' row-major: R[j * d' + c] is original channel j,
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
 *     first), ceil(d'/g / 8) bytes per vector, pad bits zero. When every
 *     group is kept (r = d') or the strategy is not per-vector (uniform2d:
 *     the first r channels for every vector), no bitmap is stored.
 *   - Values of one vector: the r kept x~_c, fp16, ascending channel
 *     order. The k-th value sits at the channel of the k-th set bit (group
 *     (k/g)-th set bit, offset k%g); equivalently channel c's value index is
 *     g * popcount(bits below c's group) + c%g.
 *   - Block keys (keys only): per block of B tokens of a segment (blocks
 *     start at the segment start; the segment's last block may be shorter),
 *     the mean of the block's rotated keys x~ over the first d' channels
 *     (all elements, not only the kept ones), fp16.
 *   - Stored floats are fp16; in memory they are float32 holding exact fp16
 *     values (the CPU reference); the GPU converts at load. */
#ifndef MKV_MOSAIC_H
#define MKV_MOSAIC_H

#include <stdint.h>
#include "cdump.h"
#include "method.h"
#include "mkv.h"

/* Largest head_dim the pieces handle (per-vector scratch lives on the stack). */
#define MKV_MOSAIC_MAX_D 1024

/* ---- strategy of one tensor (K or V) of one segment ---- */
typedef struct {
    int64_t start, len;   /* tokens [start, start + len) of the cache */
    int rotate;           /* 1: rotation stored and applied; 0: R = identity, d' = d */
    int r;                /* kept elements per vector (multiple of g, <= d') */
    int g;                /* group size: 1, 2 or 4 */
    int dprime;           /* rotated channels kept (multiple of g) */
    int pervector;        /* 1: top groups per vector (bitmap); 0: first r channels */
} mkv_mosaic_strategy;

/* Columns of the stored strategy table (int32 [nseg][7]), in this order. */
#define MKV_MOSAIC_TABLE_COLS 7
/* Columns of the stored loss table (float32 [nseg][2]): fraction of energy
 * dropped, relative attention-score error (-1 when not measured). */
#define MKV_MOSAIC_LOSS_COLS 2

/* Bitmap bytes per vector: ceil(d'/g / 8), 0 when no bitmap is stored. */
int mkv_mosaic_bitmap_bytes(const mkv_mosaic_strategy *s);
/* Blocks of B tokens covering len tokens. */
int64_t mkv_mosaic_nblocks(int64_t len, int B);

/* Bytes one segment of one tensor stores with strategy s, by array. */
typedef struct {
    uint64_t values;      /* len * r * 2 */
    uint64_t bitmap;      /* len * bitmap_bytes */
    uint64_t blockkeys;   /* keys: nblocks * d' * 2; values: 0 */
    uint64_t rotation;    /* rotate: d * d' * 2; else 0 */
    uint64_t total;
} mkv_mosaic_bytes;
/* block = B for keys, 0 for values (no block keys). */
void mkv_mosaic_strategy_bytes(const mkv_mosaic_strategy *s, int d, int block, mkv_mosaic_bytes *b);

/* ---- rotation and truncation ---- */
/* From a Gram matrix C (d x d, double; the dual buffer updates it as
 * C += x x^T): R [d][d] (all d columns, orthonormal in double) and
 * eigenvalues [d], descending. */
int mkv_mosaic_rotation_from_gram(const double *C, int d, double *R, double *evals, mkv_error *err);
/* The same from the rows X [n][d]. */
int mkv_mosaic_rotation(const float *X, int64_t n, int d, double *R, double *evals, mkv_error *err);
/* Round the n elements of a rotation to fp16, as the file stores it; the
 * compressor does this before using R for anything. */
void mkv_mosaic_round_f16(double *R, size_t n);
/* d' for a cumulative eigen-energy fraction: the fewest leading channels
 * holding >= energy of the trace, at least r, rounded up to a multiple of
 * 8 (whole bytes of bitmap for g = 1, 16-byte rows of block keys), at most
 * d. */
int mkv_mosaic_dprime_for_energy(const double *evals, int d, double energy, int r);
/* out [n][d'] = first d' channels of X R, in double (R = NULL: identity).
 * R is d x ldr row-major (ldr >= d'). */
void mkv_mosaic_rotate(const float *X, int64_t n, int d, const double *R, int ldr, int dprime,
                       double *out);

/* ---- per-vector selection and packing ---- */
/* Select the kept channels of one rotated vector xt [d'] under s: pos [r]
 * (ascending channels), bitmap (mkv_mosaic_bitmap_bytes bytes, may be NULL
 * when none is stored). Returns the kept energy sum x~_c^2. */
double mkv_mosaic_select(const double *xt, const mkv_mosaic_strategy *s, int *pos, uint8_t *bitmap);
/* Rebuild the r positions of a vector from its bitmap (or the first r
 * channels when s stores none); returns the number of positions (r for a
 * well-formed bitmap). */
int mkv_mosaic_positions(const uint8_t *bitmap, const mkv_mosaic_strategy *s, int *pos);
/* Block keys of n rotated keys xt [n][ldx] over the first d' channels:
 * out [nblocks][d'], fp16-rounded. */
void mkv_mosaic_block_keys(const double *xt, int64_t n, int ldx, int dprime, int B, float *out);

/* Encode one segment X [s->len][d] with strategy s and rotation R (d x d,
 * fp16-rounded by mkv_mosaic_round_f16; ignored when s->rotate = 0) into values [len][r],
 * bitmap [len][bitmap_bytes] (NULL when none), blockkeys [nblocks][d']
 * (block > 0, keys) and rotation [d][d'] (s->rotate). */
int mkv_mosaic_encode(const mkv_mosaic_strategy *s, const float *X, int d, const double *R, int block,
                      float *values, uint8_t *bitmap, float *blockkeys, float *rotation,
                      mkv_error *err);

/* ---- losses and strategy search ---- */
/* Observation queries for the score error: q [nq][d] at positions pos [nq]
 * (a query sees tokens <= its position). */
typedef struct {
    const float *q;
    const int64_t *pos;
    int64_t nq;
} mkv_mosaic_obs;

/* Losses of strategy s on the segment X [s->len][d] (tokens s->start..):
 * energy = ||X~ - X~_kept||^2 / ||X~||^2 in the rotated space (that is
 * ||X - X^||^2 / ||X||^2 for an orthonormal R); score (obs given and
 * seeing the segment, else -1) = sum over queries q and the m tokens t of
 * the segment q sees of w_qt (q.x_t - q.x^_t)^2, over the sum of
 * (q.x_t - mean_t q.x_t)^2: the score error relative to the spread that
 * decides the softmax, each error weighted w_qt = (1 + m p_qt) / 2 by the
 * attention p_qt = softmax_t(q.x_t / sqrt(d)) the query pays the token
 * (weights sum to m: half uniform, as later queries may look elsewhere,
 * half where this one looks). */
int mkv_mosaic_losses(const mkv_mosaic_strategy *s, const float *X, int d, const double *R,
                      const mkv_mosaic_obs *obs, double *energy, double *score, mkv_error *err);

typedef struct {
    int d;
    int block;             /* B for keys, 0 for values */
    double threshold;      /* loss threshold */
    int allow_rotate;      /* 0: only rotation-free candidates */
    const mkv_mosaic_obs *obs;   /* keys: observation queries, or NULL */
} mkv_mosaic_search_opts;

/* Dynamic strategy of one segment X [len][d] starting at token `start`,
 * R its rotation (mkv_mosaic_rotation): candidates
 *   rotate on:  r in {d/16, d/8, 3d/16, d/4, 3d/8, d/2} (rounded, >= 1),
 *               g in {1, 2, 4}, d' in {d/4, d/2, 3d/4, d}, g | r, g | d',
 *               r <= d';
 *   rotate off: the same r and g with d' = d (raw channels have no order
 *               to truncate by);
 * loss = the energy loss, or the larger of energy and score loss when
 * observation queries see the segment. The candidate with the fewest
 * bytes (mkv_mosaic_strategy_bytes) whose loss <= threshold wins (ties:
 * lower loss); when none qualifies, the one with the lowest loss (ties:
 * fewer bytes). R may be NULL when allow_rotate is 0. Score errors use
 * the usual attention scale 1/sqrt(d) for their weights. Fills *best and
 * its losses. */
int mkv_mosaic_search(const mkv_mosaic_search_opts *o, const float *X, int64_t start, int64_t len,
                      const double *R, mkv_mosaic_strategy *best, double *energy, double *score,
                      mkv_error *err);

/* ---- packed head state (one layer x KV head) ---- */
typedef struct {
    int64_t nseg;
    mkv_mosaic_strategy *seg;   /* [nseg] */
    float *loss;                /* [nseg][2] */
    float *values;              /* concatenated per segment [len][r] */
    uint8_t *bitmap;            /* [len][bitmap_bytes] */
    float *blockkeys;           /* keys only: [nblocks][d'] */
    float *rotation;            /* rotated segments only: [d][d'] */
    /* element offsets of each segment's part of the arrays above (derived
     * from the table by mkv_mosaic_layout, not stored) */
    int64_t *off_values, *off_bitmap, *off_blockkeys, *off_rotation;
    int64_t n_values, n_bitmap, n_blockkeys, n_rotation;
} mkv_mosaic_tensor;

typedef struct {
    int d, G, block;
    int64_t T;
    int64_t sink_n, recent_n;   /* dense tokens [0, sink_n) and [T - recent_n, T) */
    float *dense_k, *dense_v;   /* [sink_n + recent_n][d], fp16 values, sink first */
    mkv_mosaic_tensor k, v;
} mkv_mosaic_head;

/* Offsets and totals of t from its strategy table (keys: block > 0).
 * MKV_EFORMAT when the table is inconsistent (d' > d, g not dividing r,
 * segments not contiguous, ...). */
int mkv_mosaic_layout(mkv_mosaic_tensor *t, int d, int block, int64_t first, int64_t last,
                      mkv_error *err);
void mkv_mosaic_head_free(mkv_mosaic_head *h);

/* ---- head-level compression and attention (lib/method_mosaic.c) ---- */
typedef struct {
    int64_t sink, recent;   /* tokens kept dense */
    int64_t segment;        /* S tokens per segment */
    int block;              /* B tokens per block key */
    int dynamic;            /* 1: mkv_mosaic_search per segment and tensor */
    int rotate;             /* fixed: rotation on; dynamic: rotation allowed */
    int r, g;               /* fixed strategy: kept elements per vector, group */
    double energy;          /* fixed: d' by cumulative eigen-energy */
    double threshold;       /* dynamic: loss threshold */
    int pervector;          /* 0: uniform2d (first r rotated channels, V d' = r) */
} mkv_mosaic_config;

typedef struct {
    double budget;          /* fraction <= 1 of p + 1, or a token count */
    int agg_sum;            /* block scores over the G heads: 0 max, 1 sum */
} mkv_mosaic_attn_opts;

int mkv_mosaic_compress(const mkv_mosaic_config *c, const mkv_head_kv *in, mkv_mosaic_head *out,
                        mkv_error *err);
/* Arrays of a head in a compressed dump (names in lib/method_mosaic.c). */
int mkv_mosaic_store(const mkv_mosaic_head *h, mkv_cdump_writer *w, int layer, int head,
                     mkv_error *err);
int mkv_mosaic_load(mkv_cdump *c, int layer, int head, int block, int64_t sink, int64_t recent,
                    mkv_mosaic_head *h, mkv_error *err);
/* DESIGN.md 5.2 over the packed state: see lib/method_mosaic.c. */
int mkv_mosaic_attend(const mkv_mosaic_head *h, const mkv_mosaic_attn_opts *o,
                      const mkv_attend_query *q, mkv_attend_result *res, mkv_error *err);

/* ---- what "mosaic" and "uniform2d" share (lib/method_mosaic.c) ---- */
/* Elements kept per vector for a fraction of d: ceil(keep d), 1..d (the
 * baselines' rule). */
int mkv_mosaic_kept(double keep, int d);
/* Checks of sink, recent, segment, block, keep, energy, budget against a
 * dump (MKV_EUSAGE naming the parameter). */
int mkv_mosaic_check_common(const mkv_params *p, const mkv_dump_meta *m, mkv_error *err);
/* mkv_method hooks over a packed head; the state also holds budget and agg. */
int mkv_mosaic_method_load(const mkv_params *p, mkv_cdump *c, int layer, int head, void **state,
                           mkv_error *err);
int mkv_mosaic_method_attend(void *state, const mkv_attend_query *q, mkv_attend_result *r,
                             mkv_error *err);
void mkv_mosaic_method_free(void *state);

extern const mkv_method mkv_method_mosaic;
extern const mkv_method mkv_method_uniform2d;

#endif
