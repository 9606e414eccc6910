/* MosaicKV pieces (docs/DESIGN.md 5.1, 5.2): rotation, truncation by
 * energy, per-vector selection, packing, block keys, strategy search,
 * and compression and CPU attention of a whole head. The
 * methods "mosaic" and "uniform2d" (lib/mosaic/method.c, whose top comment
 * is the algorithm's description, and lib/mosaic/uniform2d.c) are built
 * from them; the GPU kernels and the dual buffer reuse them.
 *
 * The packed format they produce and read -- rotation layout, bitmap bit
 * order, value order, block keys, the stored arrays and the in-memory head
 * state -- is defined in lib/mosaic/packed.h. */
#ifndef MKV_MOSAIC_H
#define MKV_MOSAIC_H

#include <stdint.h>
#include "io/cdump.h"
#include "methods/method.h"
#include "mosaic/packed.h"
#include "core/mkv.h"

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
/* d' = ceil(fraction x d) rotated channels, raised to r and then to a
 * multiple of g, at most d. */
int mkv_mosaic_dprime_of_fraction(double fraction, int d, int r, int g);
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
/* Block keys of n rotated keys xt [n][ldx] over their first keydim
 * channels, the first bound as min and max (rows as in the conventions
 * above): out [nblocks][keydim + bound], fp16-rounded. */
void mkv_mosaic_block_keys(const double *xt, int64_t n, int ldx, int keydim, int bound, int B, float *out);
/* Unscaled score of one block-key row for a query q~ [keydim] in the
 * segment's key space. */
double mkv_mosaic_block_score(const double *qt, const float *row, int keydim, int bound);
/* The same for four queries and n consecutive rows [n][keydim + bound]
 * of fp16 bit patterns (as stored), q4 [keydim][4] (query l's channel c
 * at q4[4 c + l]): out [n][4], each equal to mkv_mosaic_block_score's on
 * the rows' values; in AVX2 and F16C where the CPU has them. */
void mkv_mosaic_block_scores4(const double *q4, const uint16_t *rows, int64_t n, int keydim, int bound, double *out);

/* Zero and step (qparams [groups][nc][2]) of nc channels quantized to
 * `bits` bits, per group of qgroup consecutive vectors of xt [n][ldx]
 * (qgroup 0: one group of all n), from each channel's minimum and maximum
 * over the group (mkv_bl_quant_range: every value inside the range,
 * clamping none; on attention a clamped key outlier costs more than the
 * finer steps a clipped range gives the rest). */
void mkv_mosaic_channel_qparams(const double *xt, int64_t n, int ldx, int nc, int bits, int qgroup,
                                float *qparams);

/* Encode one segment X [s->len][d] with strategy s and rotation R (d x d,
 * fp16-rounded by mkv_mosaic_round_f16; ignored when s->rotate = 0) into
 * the arrays of the packed format (fp16 ones as fp16 bit patterns):
 * values [len][r] (16-bit strategies; quantized ones write none, values
 * may be NULL), bitmap [len][bitmap_bytes] (NULL when none), codes
 * [len][vector bytes] and qparams [token groups][d'][2] (quantized
 * strategies; NULL at 16 bits), blockkeys [nblocks][keydim + bound]
 * (block > 0, keys) and rotation [d][mkv_mosaic_rotation_cols]
 * (s->rotate). */
int mkv_mosaic_encode(const mkv_mosaic_strategy *s, const float *X, int d, const double *R, int block,
                      uint16_t *values, uint8_t *bitmap, uint8_t *codes, uint16_t *qparams, uint16_t *blockkeys,
                      uint16_t *rotation, mkv_error *err);

/* ---- losses and strategy search ---- */
/* What the observation queries see of one segment when everything but
 * one tensor of it is exact (built by the compressor, lib/mosaic/method.c):
 * for each query vector that sees the segment, the exact attention output
 * over tokens 0..pos, the state of its attention over the tokens the
 * attention rule selects for it (exact keys and values) with the
 * segment's part taken out, and the segment's selected tokens with their
 * exact weights. */
typedef struct {
    int64_t nq;              /* query vectors whose position >= the segment's start */
    int d;
    double scale;            /* score scale 1/sqrt(d) */
    const double *q;         /* [nq][d] */
    const double *exact;     /* [nq][d] exact attention output over tokens 0..pos */
    const double *err0;      /* [nq] relative output error with the segment exact */
    const double *m;         /* [nq] the largest exact scaled score over the selected tokens */
    const double *l_rest;    /* [nq] sum of e^(s - m) over the selected tokens outside the segment */
    const double *acc_rest;  /* [nq][d] sum of e^(s - m) v over them */
    const int64_t *first;    /* [nq + 1] the selected tokens of query j are pairs first[j]..first[j+1) */
    const int32_t *tok;      /* [pairs] token, relative to the segment start */
    const double *w;         /* [pairs] e^(s - m) with the exact key */
    const float *keys, *values;   /* the segment's exact keys and values [len][d] */
} mkv_mosaic_segobs;

/* A strategy with its price and losses. */
typedef struct {
    mkv_mosaic_strategy s;
    uint64_t bytes;          /* mkv_mosaic_strategy_bytes total */
    double energy;           /* ||X - X^||^2 / ||X||^2, X^ the kept elements as stored (16
                                bits: before fp16 rounding), rotated back */
    double output;           /* see mkv_mosaic_candidates; meaningful when measured */
    int measured;            /* 1 when output was measured (observation queries see the segment) */
} mkv_mosaic_candidate;

/* The loss choices use: output when measured, else energy. */
double mkv_mosaic_candidate_loss(const mkv_mosaic_candidate *c);

typedef struct {
    int d;
    int block;               /* B for keys, 0 for values */
    int keydim, bound;       /* keys: the segment's block keys (fixed before any choice) */
    int allow_rotate;        /* 0: only rotation-free candidates */
    int quantize;            /* 1: candidates at 16, 8, 4 and 2 bits; 0: 16 only */
    int qgroup;              /* > 0: quantized candidates also with zeros and steps per
                                qgroup tokens (segments longer than qgroup) */
    const mkv_mosaic_segobs *obs;   /* NULL: energy only */
} mkv_mosaic_search_opts;

/* Losses of the n strategies c[i].s (start, len set; keys carry o's
 * keydim and bound) on the segment X [len][d], R its fp16-rounded
 * rotation (d x d; may be NULL when none is rotated): bytes, energy and,
 * when o->obs has queries, output = the mean over those query vectors of
 * ||o^ - o|| / ||o|| - err0, o the exact attention output and o^ the
 * attention over the selected tokens with this tensor of the segment
 * replaced by its packed form (scores q~.k~ over the kept elements,
 * values (sparse v~) R^T) and everything else exact: the error the
 * strategy adds to the selection's own. */
int mkv_mosaic_evaluate(const mkv_mosaic_search_opts *o, const float *X, const double *R,
                        mkv_mosaic_candidate *c, int n, mkv_error *err);

/* Every candidate strategy of one segment X [len][d] starting at `start`,
 * evaluated (*out allocated, *n of them):
 *   r  in {1, 2, ..., 8, 10, 12, 14, 16, 20, 24, 28, 32} / 32 x d
 *      (rounded, >= 1, distinct), g in {1, 2, 4}, g | r, g | d', r <= d';
 *   rotated (allow_rotate): d' in {1/4, 1/2, 3/4, 1} x d;
 *   unrotated (values always; keys only without allow_rotate): d' = d;
 *   each at 16 bits, and with o->quantize also at 8, 4 and 2 bits, with
 *   zeros and steps over the segment and, when 0 < o->qgroup < len, also
 *   over groups of o->qgroup tokens.
 * Keys of a rotatable segment are always rotated: their block keys live in
 * the rotated space. Candidates that another beats on bytes and energy
 * (no more of either, less of one; ties: the earlier stays) are dropped
 * before their output errors are measured. */
int mkv_mosaic_candidates(const mkv_mosaic_search_opts *o, const float *X, int64_t start, int64_t len,
                          const double *R, mkv_mosaic_candidate **out, int *n, mkv_error *err);

/* The threshold rule: the candidate with the fewest bytes whose loss <=
 * threshold (ties: lower loss, then earlier); when none qualifies, the
 * lowest loss (ties: fewer bytes, then earlier). Returns its index. */
int mkv_mosaic_pick(const mkv_mosaic_candidate *c, int n, double threshold);

/* The byte-budget rule: one candidate per item (cand[i][0..ncand[i]))
 * into pick[i], minimising the summed loss with the summed bytes <=
 * budget: the choices at the smallest price per byte whose argmin of loss
 * + price x bytes fits (bisection), then, while bytes remain, the upgrade
 * with the largest loss saved per extra byte that fits, then changes of
 * two items at once (one gives bytes to the other) while one lowers the
 * summed loss, the largest drop first. When even the cheapest candidates
 * do not fit, the cheapest. */
/* The bytes the ratio rule may give the segments of a head of T tokens:
 * logical / ratio less what the head stores besides them (nd dense rows of
 * K and V, the tables of nseg segments, a budget share when has_scale);
 * 0 when those alone exceed it. */
uint64_t mkv_mosaic_ratio_budget(double ratio, int64_t T, int d, int64_t nd, int64_t nseg, int has_scale);
void mkv_mosaic_allocate(mkv_mosaic_candidate *const *cand, const int *ncand, int nitems, uint64_t budget,
                         int *pick);

/* ---- head-level compression and attention (lib/mosaic/method.c) ---- */
typedef struct {
    double budget;          /* fraction <= 1 of p + 1, or a token count */
    int agg_sum;            /* block scores over the G heads: 0 max, 1 sum */
    double refine;          /* >= 1: blocks for refine x the budget, then the budget's best tokens
                               of them by their keys (step 3b of lib/mosaic/method.c); 1: off */
} mkv_mosaic_attn_opts;

typedef struct {
    int64_t sink, recent;   /* tokens kept dense */
    int64_t segment;        /* S tokens per segment */
    int block;              /* B tokens per block key */
    int keydim;             /* block-key channels of rotated segments (1..d) */
    int bound;              /* leading block-key channels stored as min and max (<= keydim) */
    int dynamic;            /* 1: candidates per segment and tensor, threshold or ratio rule */
    int rotate;             /* fixed: rotation on; dynamic: rotation allowed */
    int r, g;               /* fixed strategy: kept elements per vector, group */
    double energy;          /* fixed: d' by cumulative eigen-energy */
    double dprime;          /* fixed: > 0: d' = ceil(dprime x d) instead (mkv_mosaic_dprime_of_fraction) */
    int bits;               /* fixed: bits per kept value (16: fp16; 8, 4, 2: codes) */
    int quantize;           /* dynamic: candidates at 8, 4 and 2 bits besides 16 */
    int qgroup;             /* quantized: tokens per zero/step group (0: the segment);
                               dynamic: offered beside the segment-wide ones */
    double threshold;       /* dynamic: loss threshold */
    double ratio;           /* dynamic: > 0 replaces the threshold by a byte budget of
                               logical / ratio bytes per head */
    int pervector;          /* 0: uniform2d (first r rotated channels, d' = r) */
    mkv_mosaic_attn_opts attn;   /* the attention the observation queries simulate */
} mkv_mosaic_config;

int mkv_mosaic_compress(const mkv_mosaic_config *c, const mkv_head_kv *in, mkv_mosaic_head *out,
                        mkv_error *err);
/* Step 5 of lib/mosaic/method.c under the fixed rule: rotation, r, g,
 * d' (by `dprime`, else from the eigenvalues evals [d] by `energy`), bits
 * and qgroup of c into s (start, len and the block-key shape already set). */
void mkv_mosaic_fixed_strategy(const mkv_mosaic_config *c, int d, const double *evals, mkv_mosaic_strategy *s);
/* Compress one head (mkv_mosaic_compress) and store it: a method's
 * compress step. */
int mkv_mosaic_compress_store(const mkv_mosaic_config *c, const mkv_head_kv *in, mkv_cdump_writer *w,
                              mkv_error *err);
/* Selection rule 1-3b of lib/mosaic/method.c for the G queries q [G][d]
 * at position p: marks att[t] = 1 for the sink/recent tokens <= p and the
 * chosen tokens of the compressed segments (att [T], zeroed by the
 * caller); returns the number marked, or -1 when out of memory. qt
 * [nseg][G][d] receives the rotated queries (q R_k over the segment's
 * rotation columns) of the segments starting <= p. Step 3b scores the
 * candidates with their compressed keys, or with exact_k [T][d] (the
 * original keys) where not NULL; key_bytes (may be NULL) receives the
 * bytes of compressed keys it read (0 without step 3b). */
int64_t mkv_mosaic_select_tokens(const mkv_mosaic_head *h, const mkv_mosaic_attn_opts *o, const float *q,
                                 int G, int64_t p, double scale, const float *exact_k, double *qt, uint8_t *att,
                                 uint64_t *key_bytes);
/* docs/DESIGN.md 5.2 over the packed state: see lib/mosaic/method.c. */
int mkv_mosaic_attend(const mkv_mosaic_head *h, const mkv_mosaic_attn_opts *o,
                      const mkv_attend_query *q, mkv_attend_result *res, mkv_error *err);
/* mkv_mosaic_attend in pieces that threads can share: begin checks the
 * query, selects the tokens (res->attended) and splits the visible
 * segments into MKV_MOSAIC_PIECES pieces of about equal attended tokens;
 * each piece may then run on any thread, concurrently with the others;
 * end merges them in piece order into res (out, lse, bytes_read) and frees
 * the job (res NULL: only frees it).  mkv_mosaic_attend is these three on one thread, so both give
 * the same floats.  The head and res stay in place until end. */
#define MKV_MOSAIC_PIECES 2
typedef struct mkv_mosaic_attend_job mkv_mosaic_attend_job;
int mkv_mosaic_attend_begin(const mkv_mosaic_head *h, const mkv_mosaic_attn_opts *o, const mkv_attend_query *q,
                            mkv_attend_result *res, mkv_mosaic_attend_job **job, mkv_error *err);
void mkv_mosaic_attend_piece(mkv_mosaic_attend_job *job, int piece);
void mkv_mosaic_attend_end(mkv_mosaic_attend_job *job, mkv_attend_result *res);

/* ---- what "mosaic" and "uniform2d" share (lib/mosaic/method.c) ---- */
/* Elements kept per vector for a fraction of d: ceil(keep d), 1..d (the
 * baselines' rule). */
int mkv_mosaic_kept(double keep, int d);
/* The compression settings every mosaic-family method shares (sink,
 * recent, segment, block, keydim, bound, budget, agg) from p. */
void mkv_mosaic_config_common(const mkv_params *p, int d, mkv_mosaic_config *c);
/* Checks of sink, recent, segment, block, keydim, bound, keep, budget
 * against a dump (MKV_EUSAGE naming the parameter). */
int mkv_mosaic_check_common(const mkv_params *p, const mkv_dump_meta *m, mkv_error *err);
/* The settings of "mosaic" from its parameters. */
void mkv_mosaic_config_of(const mkv_params *p, int d, mkv_mosaic_config *c);

/* ---- the state at decode time (lib/mosaic/decode.c) ---- */
/* A method's settings from its parameters, for a head of head_dim d. */
typedef void (*mkv_mosaic_config_fn)(const mkv_params *p, int d, mkv_mosaic_config *c);
/* mkv_method hooks over a packed head: load (config: the method's
 * settings, which closed segments are compressed with), attend (also in
 * pieces), free;
 * growth by the dual buffer (append, its bytes and counters, flush: wait
 * for the manager and publish everything). */
int mkv_mosaic_state_load(const mkv_params *p, mkv_cdump *c, int layer, int head, mkv_mosaic_config_fn config,
                          void **state, mkv_error *err);
int mkv_mosaic_method_attend(void *state, const mkv_attend_query *q, mkv_attend_result *r,
                             mkv_error *err);
int mkv_mosaic_method_attend_begin(void *state, const mkv_attend_query *q, mkv_attend_result *r, void **job,
                                   mkv_error *err);
void mkv_mosaic_method_attend_piece(void *job, int piece);
void mkv_mosaic_method_attend_end(void *job, mkv_attend_result *r);
void mkv_mosaic_method_free(void *state);
int mkv_mosaic_method_append(void *state, const float *k, const float *v, mkv_error *err);
uint64_t mkv_mosaic_method_state_bytes(const void *state);
void mkv_mosaic_method_decode_stats(const void *state, mkv_decode_counters *out);
int mkv_mosaic_method_flush(void *state, mkv_error *err);
/* The packed head of a state (tests compare them). */
const mkv_mosaic_head *mkv_mosaic_state_head(const void *state);
/* Physical bytes of a head as mkv_mosaic_store stores it. */
uint64_t mkv_mosaic_head_bytes(const mkv_mosaic_head *h);
/* Who finalises closed segments, process-wide, for states that start
 * growing afterwards: the manager thread (default); the decoding thread at
 * once (tests: the cache an asynchronous run ends with must be the same);
 * nobody: no segment closes, every token stays in the temporary region
 * (what decoding costs without the manager). */
typedef enum {
    MKV_MOSAIC_MANAGER_ASYNC,
    MKV_MOSAIC_MANAGER_SYNC,
    MKV_MOSAIC_MANAGER_OFF
} mkv_mosaic_manager_mode;
void mkv_mosaic_set_manager(mkv_mosaic_manager_mode mode);
/* The running-loss rule (lib/mosaic/decode.c, 3): an open segment closes
 * early once the fraction of its tokens' energy the temporary strategy
 * drops exceeds that strategy's recorded loss by more than `rise` (>= 1:
 * segments close at `segment` tokens only). Process-wide, for states that
 * start growing afterwards. */
#define MKV_MOSAIC_CLOSE_LOSS_DEFAULT 0.1
void mkv_mosaic_set_close_loss(double rise);
/* The open segment's Gram matrix of K (is_key) or V as the dual buffer
 * accumulated it ([d][d], the upper triangle (i <= j) meaningful; NULL
 * when the configuration does not rotate or nothing grows yet) and, in
 * *tokens, the tokens it holds (tests compare it with X^T X). */
const double *mkv_mosaic_state_gram(const void *state, int is_key, int64_t *tokens);

extern const mkv_method mkv_method_mosaic;
extern const mkv_method mkv_method_uniform2d;

#endif
