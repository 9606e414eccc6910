/* Packed MosaicKV on the GPU (kernels/mosaic_attend.cu, kernels/mosaic_encode.cu,
 * lib/gpu/gpu_method.c) against the CPU:
 *  - attention: heads compressed by the CPU compressor (mkv_mosaic_compress)
 *    from random KV-like data, fixed and dynamic strategies, several
 *    segments, groups g = 1, 2, 4, uniform2d's first-r channels, head_dim
 *    64 and 128, 1, 4 and 8 query heads per KV head, blocks of 4, 8 and 16,
 *    budgets as fractions and counts, max and sum over the heads, queries
 *    at positions inside the cache (in the recent window, before it, in
 *    the first segment, among the sink tokens).  For every (query, KV
 *    head) the GPU's attended tokens must be mkv_mosaic_attend's except
 *    for blocks whose score (recomputed here in double) is within float32
 *    rounding (SCORE_TOL) of the selection threshold; where they agree the
 *    outputs must agree within TOL in L2 per query head (relative to the
 *    output with |v| for v, see rel_err), and bytes_read as
 *    lib/gpu/gpu_method.c counts it must equal the CPU's; in every case the
 *    output must match a double-precision reference computed here over
 *    the GPU's own selection (keys and values rebuilt from the stored
 *    arrays, one softmax over all attended tokens);
 *  - 8-bit block keys (mkv_cuda_mosaic_blockkeys8): the selection must be
 *    the rule's (check_rule) over block scores of the codes and scales
 *    recomputed here in double (row_codes), exactly but for blocks within
 *    float32 rounding of the threshold, and the output the reference's
 *    over the GPU's selection; a plan asking for them before they are
 *    made, or for 12-bit keys, is refused; growth (mkv_cuda_mosaic_grow)
 *    keeps the codes of the open blocks row_codes' of the grown fp16 rows,
 *    also with those rows dropped (mkv_cuda_mosaic_drop_blockkeys16),
 *    which then attends as the cache that kept them;
 *  - equal block scores: the lowest blocks are taken, exactly as the CPU;
 *  - a segment of more blocks than the attention compacts at once (1024
 *    blocks of 4 against a window of 512): the block list is rebuilt and
 *    the copy pipeline continues across windows; heads of 5000+ and of
 *    9000 blocks, the latter with every score tied;
 *  - budget 1: every block, output equal to the CPU's;
 *  - the temporary region: tokens appended by the GPU encoder are always
 *    attended and count towards the budget (reference computed here from
 *    the CPU encoder's packing of the same tokens): the blocks and the
 *    token count must be those of the selection rule recomputed here
 *    (check_rule), exactly unless block scores tie within rounding; an
 *    append past the region's capacity is refused (MKV_EUSAGE, message
 *    naming the region and its capacity), before and after a good append,
 *    and leaves the cache as it was;
 *  - for every query: sink, recent and temporary tokens <= the position
 *    attended, every other token exactly when its block is (check_flags);
 *  - GPU encode vs mkv_mosaic_encode: values, bitmaps and block keys bit
 *    for bit; a difference is accepted only where the double sums land
 *    within 1e-12 of a float16 rounding boundary or of an energy tie, and
 *    counted;
 *  - batched rotations: orthonormal, the eigenvalues of mkv_eigh, and each
 *    eigenvector's projector equal to mkv_eigh's (eigenvalues well apart);
 *  - refusals: head_dim 96, block 3, 16 query heads per KV head, a
 *    position past the cache, overlapping record parts.
 * Outputs are poisoned (NaN) before every run.  Inputs are random with a
 * fresh seed per run, printed first; MKV_TEST_SEED repeats one;
 * MKV_TEST_QUICK=1 runs small cases only (for compute-sanitizer).  CUDA
 * does not survive fork: CK_NOFORK; exit 77 without a CUDA build or GPU,
 * after checking that the entry points then fail cleanly. */
#include "config.h"

#include <check.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/attn.h"
#include "core/eigen.h"
#include "gpu/gpu_method.h"
#include "core/half.h"
#include "methods/method.h"
#include "mkv_cuda.h"
#include "gpu_testutil.h"
#include "mosaic/mosaic.h"
#include "core/rng.h"

#define TOL 1e-4

/* The GPU's block scores are float32 arithmetic: q~ = q R_k (d terms),
 * then a dot product with the block-key row (at most 2d terms) whose q~
 * reaches the tensor cores as fp16 hi + lo parts (~22 bits).  Their error
 * is within (3d + 4) u of the sum of the terms' magnitudes (u = 2^-24,
 * rotation terms included), which block_scores returns per block: scores
 * closer than that to the selection threshold may go either way. */
#define SCORE_TOL(d) ((3.0 * (d) + 4) * 0x1p-24)

static uint64_t seed;
static mkv_rng rng;
static int quick;

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    ck_assert_msg(p != NULL, "out of memory (%zu bytes)", bytes);
    return p;
}

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    ck_assert_msg(p != NULL, "out of memory");
    return p;
}

static float f16r(double x) { return mkv_f16_to_f32(mkv_f32_to_f16((float)x)); }

static void *dalloc(size_t bytes)
{
    mkv_error err = {0};
    void *p = NULL;
    ck_assert_msg(mkv_cuda_malloc(&p, bytes, &err) == MKV_OK, "%s", err.msg);
    return p;
}

/* ---------------------------------------------------------------- data */

/* KV-like rows [T][d]: a rank-6 part whose scales drift along the
 * sequence, one offset channel, noise; fp16-representable. */
static void gen_rows(int64_t T, int d, double offset, float *x)
{
    double A[6][128];
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < d; j++)
            A[i][j] = mkv_rng_normal(&rng) / (i + 1);
    for (int64_t t = 0; t < T; t++) {
        double z[6];
        for (int i = 0; i < 6; i++)
            z[i] = mkv_rng_normal(&rng) * (1 + 0.5 * sin((double)t / 53 + i));
        for (int j = 0; j < d; j++) {
            double v = 0.2 * mkv_rng_normal(&rng) + (j == 3 ? offset : 0);
            for (int i = 0; i < 6; i++)
                v += z[i] * A[i][j];
            x[t * d + j] = f16r(v);
        }
    }
}

/* A query aimed at two keys before pos, plus noise. */
static void gen_query(const float *k, int64_t pos, int d, float *q)
{
    int64_t t1 = (int64_t)mkv_rng_below(&rng, (uint64_t)pos + 1), t2 = (int64_t)mkv_rng_below(&rng, (uint64_t)pos + 1);
    for (int j = 0; j < d; j++)
        q[j] = (float)(0.7 * (k[t1 * d + j] + k[t2 * d + j]) + 0.4 * mkv_rng_normal(&rng));
}

typedef struct {
    int64_t T;
    int d, G;
    float *k, *v;          /* [T][d] */
    int64_t W;
    float *obs;            /* [G][W][d] observation queries (dynamic strategy) */
    int32_t *obs_pos;
} head_data;

static head_data make_head(int64_t T, int d, int G)
{
    head_data h = {T, d, G, xmalloc(sizeof(float) * (size_t)T * d), xmalloc(sizeof(float) * (size_t)T * d), 4, NULL,
                   NULL};
    gen_rows(T, d, 2.0, h.k);
    gen_rows(T, d, 0.5, h.v);
    h.obs = xmalloc(sizeof(float) * (size_t)G * h.W * d);
    h.obs_pos = xmalloc(sizeof(int32_t) * (size_t)h.W);
    for (int64_t w = 0; w < h.W; w++)
        h.obs_pos[w] = (int32_t)(T - h.W + w);
    for (int g = 0; g < G; g++)
        for (int64_t w = 0; w < h.W; w++)
            gen_query(h.k, h.obs_pos[w], d, h.obs + ((size_t)g * h.W + w) * d);
    return h;
}

static void free_head_data(head_data *h)
{
    free(h->k);
    free(h->v);
    free(h->obs);
    free(h->obs_pos);
}

static void compress(const head_data *hd, const mkv_mosaic_config *c, mkv_mosaic_head *h)
{
    mkv_head_kv in = {.layer = 0, .head = 0, .T = hd->T, .d = hd->d, .G = hd->G, .k = hd->k, .v = hd->v,
                      .W = c->dynamic ? hd->W : 0, .q = c->dynamic ? hd->obs : NULL,
                      .query_pos = c->dynamic ? hd->obs_pos : NULL, .threads = 1};
    mkv_error err = {0};
#ifdef MKV_MOSAIC_BLOCKDIM_COLS
    /* config() sizes block keys from r alone; they cannot be wider than the head */
    mkv_mosaic_config fitted = *c;
    if (fitted.keydim > hd->d)
        fitted.keydim = hd->d;
    c = &fitted;
#endif
    ck_assert_msg(mkv_mosaic_compress(c, &in, h, &err) == MKV_OK, "compress: %s", err.msg);
}

/* ---------------------------------------------------------- references */

/* The block-key shape of a key strategy and its rotation's columns:
 * lib/mosaic/mosaic.h has bounded block keys (MKV_MOSAIC_BLOCKDIM_COLS) or the
 * mean over the d' channels. */
#ifdef MKV_MOSAIC_BLOCKDIM_COLS
static int key_dim(const mkv_mosaic_strategy *s) { return s->keydim; }
static int key_bound(const mkv_mosaic_strategy *s) { return s->bound; }
static int rot_cols(const mkv_mosaic_strategy *s) { return mkv_mosaic_rotation_cols(s); }
#else
static int key_dim(const mkv_mosaic_strategy *s) { return s->dprime; }
static int key_bound(const mkv_mosaic_strategy *s) { (void)s; return 0; }
static int rot_cols(const mkv_mosaic_strategy *s) { return s->rotate ? s->dprime : 0; }
#endif

/* A stored fp16 array of n values as floats, in memory of its own (NULL
 * for NULL). */
static float *floats_of(const uint16_t *h, size_t n)
{
    if (!h)
        return NULL;
    float *f = xmalloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++)
        f[i] = mkv_f16_to_f32(h[i]);
    return f;
}

/* q~ = q R (n channels; R [d][ldr]) in double; R NULL: q itself. */
static void rotate_q(const float *q, const float *R, int d, int ldr, int n, double *qt)
{
    for (int c = 0; c < n; c++) {
        double s = 0;
        if (R)
            for (int j = 0; j < d; j++)
                s += (double)q[j] * R[(size_t)j * ldr + c];
        else
            s = q[c];
        qt[c] = s;
    }
}

/* The 8-bit block keys of mkv_cuda_mosaic_blockkeys8 (mkv_cuda.h) for one
 * row of n values as the GPU layout holds them (fp16), in double: the
 * codes into code[], the scale returned (as the float the GPU stores). */
static double row_codes(const uint16_t *row, int n, double *code)
{
    double amax = 0;
    for (int c = 0; c < n; c++)
        amax = fmax(amax, fabs((double)mkv_f16_to_f32(row[c])));
    for (int c = 0; c < n; c++)
        code[c] = amax > 0 ? rint((double)mkv_f16_to_f32(row[c]) * 127.0 / amax) : 0;
    return (double)(float)(amax / 127.0);
}

/* Block scores of head h for the G queries q at pos, in double, and the
 * sums of their terms' magnitudes (mag, see SCORE_TOL); blocks starting
 * after pos get -INFINITY and 0.  bits 8: scored with the 8-bit block keys
 * (row_codes): the scale times the score of the codes. */
static void block_scores(const mkv_mosaic_head *h, const float *q, int G, int64_t pos, int agg_sum, int bits,
                         double *score, double *mag)
{
    const int d = h->d, B = h->block;
    const double scale = 1.0 / sqrt((double)d);
    double qt[128], qabs[128];
    int64_t id = 0;
    for (int64_t s = 0; s < h->k.nseg; s++) {
        const mkv_mosaic_strategy *ks = &h->k.seg[s];
        const int64_t nb = mkv_mosaic_nblocks(ks->len, B);
        for (int64_t b = 0; b < nb; b++) {
            score[id + b] = -INFINITY;
            mag[id + b] = 0;
        }
        const int kd = key_dim(ks), kb = key_bound(ks);
        float *R = ks->rotate ? floats_of(h->k.rotation + h->k.off_rotation[s], (size_t)d * rot_cols(ks)) : NULL;
        for (int g = 0; g < G; g++) {
            rotate_q(q + (size_t)g * d, R, d, rot_cols(ks), kd, qt);
            for (int c = 0; c < kd; c++) {   /* |q| |R|: the magnitude of q~'s terms */
                qabs[c] = R ? 0 : fabsf(q[(size_t)g * d + c]);
                for (int j = 0; R && j < d; j++)
                    qabs[c] += fabsf(q[(size_t)g * d + j]) * fabsf(R[(size_t)j * rot_cols(ks) + c]);
            }
            for (int64_t b = 0; b < nb && ks->start + b * B <= pos; b++) {
                /* [min | max] of the first kb channels, mean of the others */
                const uint16_t *stored = h->k.blockkeys + h->k.off_blockkeys[s] + b * (kd + kb);
                double row[2 * 128 + 8], bscale = 1;
                if (bits == 8)
                    bscale = row_codes(stored, kd + kb, row);
                else
                    for (int c = 0; c < kd + kb; c++)
                        row[c] = mkv_f16_to_f32(stored[c]);
                double x = 0, m = 0;
                for (int c = 0; c < kb; c++) {
                    const double lo = qt[c] * row[c], hi = qt[c] * row[kb + c];
                    x += lo > hi ? lo : hi;
                    m += qabs[c] * fmax(fabs(row[c]), fabs(row[kb + c]));
                }
                for (int c = kb; c < kd; c++) {
                    x += qt[c] * row[kb + c];
                    m += qabs[c] * fabs(row[kb + c]);
                }
                x *= scale * bscale;
                m *= scale * bscale;
                score[id + b] = g == 0 ? x : agg_sum ? score[id + b] + x : (x > score[id + b] ? x : score[id + b]);
                mag[id + b] = g == 0 ? m : agg_sum ? mag[id + b] + m : (m > mag[id + b] ? m : mag[id + b]);
            }
        }
        free(R);
        id += nb;
    }
}

/* Tokens <= pos of block bb (0-based in its segment) of segment ks. */
static int64_t block_tokens(const mkv_mosaic_strategy *ks, int64_t bb, int B, int64_t pos)
{
    const int64_t t0 = ks->start + bb * B;
    int64_t t1 = t0 + B;
    t1 = t1 < ks->start + ks->len ? t1 : ks->start + ks->len;
    t1 = t1 < pos + 1 ? t1 : pos + 1;
    return t1 > t0 ? t1 - t0 : 0;
}

/* Whether token t is one the rule always attends (when t <= pos): a sink
 * token, a recent token, or one of the tmp_n tokens of the temporary
 * region, which follows the head's T tokens. */
static int always_token(const mkv_mosaic_head *h, int64_t tmp_n, int64_t t)
{
    return t < h->sink_n || (t >= h->T - h->recent_n && t < h->T) || (t >= h->T && t < h->T + tmp_n);
}

static const char *token_kind(const mkv_mosaic_head *h, int64_t t)
{
    return t < h->sink_n ? "sink" : t < h->T ? "recent" : "temporary";
}

/* The attended flags of one query at pos against its block flags blk
 * (all nb_all blocks of the cache head: the packed segments' in order,
 * then the temporary region's): the sink, recent and temporary tokens
 * <= pos are attended; a packed token <= pos exactly when its block is
 * flagged; no block starting after pos is flagged; the temporary region's
 * blocks are flagged exactly when they hold a token <= pos. */
static void check_flags(const mkv_mosaic_head *h, int64_t tmp_n, int64_t pos, const uint8_t *blk, int64_t nb_all,
                        const uint8_t *att, const char *what)
{
    const int B = h->block;
    for (int64_t t = 0; t <= pos; t++)
        if (always_token(h, tmp_n, t))
            ck_assert_msg(att[t], "%s: %s token %lld not attended", what, token_kind(h, t), (long long)t);
    int64_t id = 0;
    for (int64_t s = 0; s < h->k.nseg; s++) {
        const mkv_mosaic_strategy *ks = &h->k.seg[s];
        const int64_t nbs = mkv_mosaic_nblocks(ks->len, B);
        for (int64_t bb = 0; bb < nbs; bb++, id++) {
            const int64_t t0 = ks->start + bb * B;
            ck_assert_msg(t0 <= pos || !blk[id], "%s: block %lld (tokens from %lld) after the query flagged", what,
                          (long long)id, (long long)t0);
            for (int64_t t = t0; t < t0 + B && t < ks->start + ks->len && t <= pos; t++)
                ck_assert_msg(att[t] == blk[id], "%s: token %lld %sattended, its block %lld %sflagged", what,
                              (long long)t, att[t] ? "" : "not ", (long long)id, blk[id] ? "" : "not ");
        }
    }
    for (int64_t j = 0; id + j < nb_all; j++) {
        const int64_t t0 = h->T + j * B;
        const int want = t0 <= pos && t0 < h->T + tmp_n;
        ck_assert_msg(blk[id + j] == want, "%s: temporary block %lld (tokens from %lld) %sflagged", what,
                      (long long)(id + j), (long long)t0, blk[id + j] ? "" : "not ");
    }
}

typedef struct {
    double score;
    int64_t id;
} ranked_block;

/* Higher score first, then the earlier block. */
static int by_rank(const void *a, const void *b)
{
    const ranked_block *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* The selection of one query at pos (G heads q) against the rule,
 * recomputed here from the head's stored arrays (lib/mosaic/method.c
 * ATTENTION 1-3, docs/DESIGN.md 5.2, mkv_cuda.h), the temporary region's tmp_n
 * tokens included:
 *   fixed = the sink, recent and temporary tokens <= pos (always
 *           attended, counted towards the budget);
 *   k     = mkv_budget_tokens(budget, pos + 1);
 *   E     = the packed blocks starting <= pos in descending score (double,
 *           block_scores; ties: the earlier block), added whole (their
 *           tokens <= pos) while fixed + the tokens added are below k;
 *   want  = fixed + the tokens of E.
 * blk (the GPU's block flags) must be E and tokens (its count) want,
 * exactly, when fixed >= k (no block), when fixed plus every candidate's
 * tokens <= k (every block), and whenever blk is E.  Otherwise the GPU's
 * float32 scores ordered blocks within rounding of each other (SCORE_TOL)
 * differently: each block in one set only must score within that of E's
 * threshold (the score of its last block), and the count must be what
 * any order gives under the rule: at least k (the candidates reach it),
 * and below k + B, since adding stops at the first block (<= B tokens)
 * that reaches k.  Returns the blocks in one set only. */
static int check_rule(const mkv_mosaic_head *h, int64_t tmp_n, const float *q, int G, int64_t pos, double budget,
                      int agg_sum, int bits, const uint8_t *blk, int64_t tokens, const char *what)
{
    const int d = h->d, B = h->block;
    int64_t nb = 0;
    for (int64_t s = 0; s < h->k.nseg; s++)
        nb += mkv_mosaic_nblocks(h->k.seg[s].len, B);
    double *score = xmalloc(sizeof(double) * (size_t)(nb + 1)), *mag = xmalloc(sizeof(double) * (size_t)(nb + 1));
    int64_t *w = xmalloc(sizeof(int64_t) * (size_t)(nb + 1));
    ranked_block *rank = xmalloc(sizeof(ranked_block) * (size_t)(nb + 1));
    uint8_t *want = xcalloc((size_t)nb + 1, 1);
    block_scores(h, q, G, pos, agg_sum, bits, score, mag);
    int64_t fixed = 0;
    for (int64_t t = 0; t <= pos; t++)
        fixed += always_token(h, tmp_n, t);
    const int64_t k = mkv_budget_tokens(budget, pos + 1);
    int64_t n_cand = 0, cand = 0, id = 0;
    double mag_max = 0;
    for (int64_t s = 0; s < h->k.nseg; s++) {
        const mkv_mosaic_strategy *ks = &h->k.seg[s];
        const int64_t nbs = mkv_mosaic_nblocks(ks->len, B);
        for (int64_t bb = 0; bb < nbs; bb++, id++) {
            w[id] = block_tokens(ks, bb, B, pos);
            if (ks->start + bb * B > pos)
                continue;
            rank[n_cand].score = score[id];
            rank[n_cand++].id = id;
            cand += w[id];
            mag_max = mag[id] > mag_max ? mag[id] : mag_max;
        }
    }
    qsort(rank, (size_t)n_cand, sizeof *rank, by_rank);
    int64_t count = fixed;
    double thr = INFINITY;
    for (int64_t i = 0; i < n_cand && count < k; i++) {
        want[rank[i].id] = 1;
        count += w[rank[i].id];
        thr = rank[i].score;
    }
    int64_t got = fixed;
    int same = 1, differ = 0;
    for (id = 0; id < nb; id++) {
        got += blk[id] ? w[id] : 0;
        same &= blk[id] == want[id];
    }
    ck_assert_msg(tokens == got, "%s: %lld tokens counted, but %lld always attended + %lld in its blocks", what,
                  (long long)tokens, (long long)fixed, (long long)(got - fixed));
    if (fixed >= k) {
        ck_assert_msg(same && tokens == fixed,
                      "%s: %lld sink, recent and temporary tokens reach the budget of %lld, yet %lld tokens attended",
                      what, (long long)fixed, (long long)k, (long long)tokens);
    } else if (fixed + cand <= k) {
        ck_assert_msg(same && tokens == fixed + cand,
                      "%s: the budget of %lld takes every block (%lld always attended + %lld), %lld tokens attended",
                      what, (long long)k, (long long)fixed, (long long)cand, (long long)tokens);
    } else if (same) {
        ck_assert_msg(tokens == count, "%s: %lld tokens attended, the rule's %lld", what, (long long)tokens,
                      (long long)count);
    } else {
        for (id = 0; id < nb; id++)
            if (blk[id] != want[id]) {
                ck_assert_msg(fabs(score[id] - thr) <= 2 * SCORE_TOL(d) * mag_max,
                              "%s: block %lld %s although it scores %.9g, the rule's threshold %.9g", what,
                              (long long)id, blk[id] ? "selected" : "left", score[id], thr);
                differ++;
            }
        ck_assert_msg(tokens >= k && tokens < k + B,
                      "%s: %lld tokens attended for a budget of %lld (%lld always attended): the rule stops at the "
                      "first block that reaches it, so at most %d more",
                      what, (long long)tokens, (long long)k, (long long)fixed, B - 1);
    }
    free(score);
    free(mag);
    free(w);
    free(rank);
    free(want);
    return differ;
}

/* An append refused for the temporary region's capacity: MKV_EUSAGE, a
 * message that names the region and its capacity. */
static void expect_full(mkv_packed_cache *cache, int head, const float *k, const float *v, int64_t n, int64_t cap,
                        const char *what)
{
    mkv_error err = {0};
    char capstr[32];
    snprintf(capstr, sizeof capstr, "%lld", (long long)cap);
    const int rc = mkv_cuda_mosaic_append(cache, head, k, v, n, NULL, &err);
    ck_assert_msg(rc == MKV_EUSAGE, "%s: appending %lld tokens past a capacity of %lld returned %d (%s)", what,
                  (long long)n, (long long)cap, rc, err.msg);
    ck_assert_msg(strstr(err.msg, "temporary region") != NULL
                      && (strstr(err.msg, "exceed") != NULL || strstr(err.msg, "capacity") != NULL)
                      && strstr(err.msg, capstr) != NULL,
                  "%s: the message does not name the full temporary region (of %s tokens): '%s'", what, capstr,
                  err.msg);
}

/* Packed tokens of a temporary region as the CPU encoder packs them. */
typedef struct {
    int64_t start, n;
    mkv_mosaic_strategy ks, vs;
    float *Rk, *Rv;                /* [d][d'] or NULL */
    float *kval, *vval;            /* [n][r] */
    uint8_t *kbits, *vbits;        /* [n][bytes] */
} temp_tokens;

/* One packed token's score (double) and its value in the original space. */
static double packed_token(const mkv_mosaic_strategy *ks, const mkv_mosaic_strategy *vs, const float *Rk,
                           const float *Rv, const float *kval, const uint8_t *kbits, const float *vval,
                           const uint8_t *vbits, const float *q, int d, double *v)
{
    int pos[128];
    double qt[128], vt[128] = {0};
    rotate_q(q, Rk, d, Rk ? rot_cols(ks) : d, ks->dprime, qt);
    mkv_mosaic_positions(kbits, ks, pos);
    double s = 0;
    for (int i = 0; i < ks->r; i++)
        s += qt[pos[i]] * kval[i];
    mkv_mosaic_positions(vbits, vs, pos);
    for (int i = 0; i < vs->r; i++)
        vt[pos[i]] = vval[i];
    for (int j = 0; j < d; j++) {
        double x = 0;
        if (Rv)
            for (int c = 0; c < vs->dprime; c++)
                x += vt[c] * Rv[(size_t)j * vs->dprime + c];
        else
            x = vt[j];
        v[j] = x;
    }
    return s;
}

/* Exact softmax attention over the dense tokens <= pos, the packed tokens
 * <= pos of the flagged blocks and the temporary tokens (may be NULL), in
 * double; out [G][d], out_mag the same with |v| for every value v. */
static void ref_attend(const mkv_mosaic_head *h, const float *q, int G, int64_t pos, const uint8_t *blk,
                       const temp_tokens *tmp, double *out, double *out_mag)
{
    const int d = h->d, B = h->block;
    const double scale = 1.0 / sqrt((double)d);
    int64_t cap = h->sink_n + h->recent_n + h->T + (tmp ? tmp->n : 0);
    double *sc = xmalloc(sizeof(double) * (size_t)cap), *val = xmalloc(sizeof(double) * (size_t)cap * d);
    for (int g = 0; g < G; g++) {
        const float *qg = q + (size_t)g * d;
        int64_t n = 0;
        for (int64_t i = 0; i < h->sink_n + h->recent_n; i++) {
            const int64_t t = i < h->sink_n ? i : h->T - h->recent_n + (i - h->sink_n);
            if (t > pos)
                continue;
            double s = 0;
            for (int j = 0; j < d; j++) {
                s += (double)qg[j] * mkv_f16_to_f32(h->dense_k[i * d + j]);
                val[n * d + j] = mkv_f16_to_f32(h->dense_v[i * d + j]);
            }
            sc[n++] = s * scale;
        }
        int64_t id = 0;
        for (int64_t si = 0; si < h->k.nseg; si++) {
            const mkv_mosaic_strategy *ks = &h->k.seg[si], *vs = &h->v.seg[si];
            const int kbb = mkv_mosaic_bitmap_bytes(ks), vbb = mkv_mosaic_bitmap_bytes(vs);
            const int64_t nb = mkv_mosaic_nblocks(ks->len, B);
            for (int64_t b = 0; b < nb; b++) {
                if (!blk[id + b])
                    continue;
                for (int64_t t = ks->start + b * B; t < ks->start + b * B + B && t < ks->start + ks->len && t <= pos; t++) {
                    const int64_t i = t - ks->start;
                    int kpos[MKV_MOSAIC_MAX_D], vpos[MKV_MOSAIC_MAX_D];
                    float kbuf[MKV_MOSAIC_MAX_D], vbuf[MKV_MOSAIC_MAX_D];
                    mkv_mosaic_positions(kbb ? h->k.bitmap + h->k.off_bitmap[si] + i * kbb : NULL, ks, kpos);
                    mkv_mosaic_positions(vbb ? h->v.bitmap + h->v.off_bitmap[si] + i * vbb : NULL, vs, vpos);
                    float *Rk = ks->rotate ? floats_of(h->k.rotation + h->k.off_rotation[si],
                                                       (size_t)d * rot_cols(ks)) : NULL;
                    float *Rv = vs->rotate ? floats_of(h->v.rotation + h->v.off_rotation[si],
                                                       (size_t)d * vs->dprime) : NULL;
                    sc[n] = scale * packed_token(ks, vs, Rk, Rv, mkv_mosaic_vector_values(&h->k, si, i, kpos, kbuf),
                                                 kbb ? h->k.bitmap + h->k.off_bitmap[si] + i * kbb : NULL,
                                                 mkv_mosaic_vector_values(&h->v, si, i, vpos, vbuf),
                                                 vbb ? h->v.bitmap + h->v.off_bitmap[si] + i * vbb : NULL, qg, d,
                                                 val + n * d);
                    free(Rk);
                    free(Rv);
                    n++;
                }
            }
            id += nb;
        }
        for (int64_t i = 0; tmp && i < tmp->n && tmp->start + i <= pos; i++) {
            const int kbb = mkv_mosaic_bitmap_bytes(&tmp->ks), vbb = mkv_mosaic_bitmap_bytes(&tmp->vs);
            sc[n] = scale * packed_token(&tmp->ks, &tmp->vs, tmp->Rk, tmp->Rv, tmp->kval + i * tmp->ks.r,
                                         kbb ? tmp->kbits + i * kbb : NULL, tmp->vval + i * tmp->vs.r,
                                         vbb ? tmp->vbits + i * vbb : NULL, qg, d, val + n * d);
            n++;
        }
        double mx = -INFINITY, l = 0;
        for (int64_t i = 0; i < n; i++)
            mx = sc[i] > mx ? sc[i] : mx;
        double *o = out + (size_t)g * d, *om = out_mag + (size_t)g * d;
        for (int j = 0; j < d; j++)
            o[j] = om[j] = 0;
        for (int64_t i = 0; i < n; i++) {
            const double w = exp(sc[i] - mx);
            l += w;
            for (int j = 0; j < d; j++) {
                o[j] += w * val[i * d + j];
                om[j] += w * fabs(val[i * d + j]);
            }
        }
        for (int j = 0; j < d; j++) {
            o[j] = l > 0 ? o[j] / l : 0;
            om[j] = l > 0 ? om[j] / l : 0;
        }
    }
    free(sc);
    free(val);
}

/* L2 error of got relative to mag, the attention output with |v| for v
 * (>= want elementwise): float32 rounding is relative to the terms'
 * magnitudes, and want itself may be small where values cancel. */
static double rel_err(const float *got, const double *want, const double *mag, int n, const char *what)
{
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        ck_assert_msg(isfinite(got[i]), "%s: element %d not written or not finite (%g)", what, i, got[i]);
        num += (got[i] - want[i]) * (got[i] - want[i]);
        den += mag[i] * mag[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ------------------------------------------------------------ GPU runs */

typedef struct {
    const char *label;
    int d, G, B, nh;
    int64_t T;
    mkv_mosaic_config cfg;
    double budget;
    int agg_sum;
    int64_t temp;          /* tokens appended to a temporary region before attending (0: none) */
    int equal_keys;        /* overwrite every block key with the first: all scores tie */
    int blockkey_bits;     /* 8: scored with mkv_cuda_mosaic_blockkeys8's codes (0: fp16) */
} pcase;

typedef struct {
    int differ_blocks, queries;
    double worst_cpu, worst_ref;
} pstats;

static mkv_mosaic_config config(int dynamic, int B, int64_t segment, int r, int g, int pervector)
{
    mkv_mosaic_config c = {.sink = 4, .recent = 64, .segment = segment, .block = B, .dynamic = dynamic,
                           .rotate = 1, .r = r, .g = g, .energy = 0.95, .threshold = 0.1, .pervector = pervector, .bits = 16};
#ifdef MKV_MOSAIC_BLOCKDIM_COLS
    /* the method's defaults: block keys over all channels, the first 2 bounded */
    c.keydim = 4 * r <= 128 ? 4 * r : 128;
    c.bound = 2;
    c.attn.budget = 0.1;
#endif
    return c;
}

/* Positions of the queries of a case: the last token, inside the recent
 * window, before it, in the first segment, among the sink tokens, random. */
static int64_t pick_positions(int64_t T, int64_t *pos)
{
    int64_t n = 0;
    pos[n++] = T - 1;
    pos[n++] = T - 1 - (int64_t)mkv_rng_below(&rng, 60);
    pos[n++] = T - 65 - (int64_t)mkv_rng_below(&rng, 200);
    pos[n++] = 4 + 200 + (int64_t)mkv_rng_below(&rng, 300);
    pos[n++] = (int64_t)mkv_rng_below(&rng, 4);
    pos[n++] = 300 + (int64_t)mkv_rng_below(&rng, (uint64_t)(T - 300));
    return n;
}

static void run_case(const pcase *pc, pstats *st)
{
    const int d = pc->d, G = pc->G, nh = pc->nh;
    mkv_error err = {0};
    head_data *hd = xcalloc((size_t)nh, sizeof *hd);
    mkv_mosaic_head *h = xcalloc((size_t)nh, sizeof *h);
    const mkv_mosaic_head **hp = xcalloc((size_t)nh, sizeof *hp);
    for (int i = 0; i < nh; i++) {
        hd[i] = make_head(pc->T, d, G);
        compress(&hd[i], &pc->cfg, &h[i]);
        if (pc->equal_keys)
            for (int64_t e = 0; e < h[i].k.n_blockkeys; e++)
                h[i].k.blockkeys[e] = h[i].k.blockkeys[e % (key_dim(&h[i].k.seg[0]) + key_bound(&h[i].k.seg[0]))];
        hp[i] = &h[i];
    }
    mkv_gpu_layout lay;
    ck_assert_msg(mkv_gpu_layout_build(hp, nh, pc->temp, 0, &lay, &err) == MKV_OK, "layout: %s", err.msg);
    mkv_packed_cache *cache = NULL;
    ck_assert_msg(mkv_cuda_mosaic_upload(&lay.l, &cache, &err) == MKV_OK, "upload: %s", err.msg);
    const int bits = pc->blockkey_bits == 8 ? 8 : 16;
    if (bits == 8)
        ck_assert_msg(mkv_cuda_mosaic_blockkeys8(cache, &err) == MKV_OK, "8-bit block keys: %s", err.msg);

    /* The temporary region: pc->temp new tokens per head, encoded by the
     * GPU; the reference packs the same tokens with the CPU encoder. */
    temp_tokens *tmp = xcalloc((size_t)nh, sizeof *tmp);
    int64_t end = pc->T;
    if (pc->temp > 0) {
        end = pc->T + pc->temp;
        for (int i = 0; i < nh; i++) {
            const int64_t n = pc->temp, ls = h[i].k.nseg - 1;
            float *nk = xmalloc(sizeof(float) * (size_t)n * d), *nv = xmalloc(sizeof(float) * (size_t)n * d);
            gen_rows(n, d, 2.0, nk);
            gen_rows(n, d, 0.5, nv);
            float *dk = dalloc(sizeof(float) * (size_t)n * d), *dv = dalloc(sizeof(float) * (size_t)n * d);
            ck_assert(mkv_cuda_upload(dk, nk, sizeof(float) * (size_t)n * d, &err) == MKV_OK);
            ck_assert(mkv_cuda_upload(dv, nv, sizeof(float) * (size_t)n * d, &err) == MKV_OK);
            /* The region holds n_blocks x B tokens (the uploaded table): one
             * token more is refused, into the empty region and after the
             * append; the refusals change nothing (the good append still
             * lands at T, planning at T + n is still refused below, and
             * the attention matches the reference of the n tokens). */
            const mkv_packed_seg *tr = &lay.segs[lay.heads[i].first_seg + lay.heads[i].n_seg - 1];
            ck_assert_msg(tr->always, "%s: head %d has no temporary region", pc->label, i);
            const int64_t cap = (int64_t)tr->n_blocks * h[i].block;
            ck_assert(cap >= n);
            float *dz = dalloc(sizeof(float) * (size_t)(cap + 1) * d);
            ck_assert(mkv_cuda_memset(dz, 0, sizeof(float) * (size_t)(cap + 1) * d, &err) == MKV_OK);
            expect_full(cache, i, dz, dz, cap + 1, cap, pc->label);
            ck_assert_msg(mkv_cuda_mosaic_append(cache, i, dk, dv, n, NULL, &err) == MKV_OK, "append: %s", err.msg);
            expect_full(cache, i, dz, dz, cap - n + 1, cap, pc->label);
            mkv_cuda_free(dz);
            mkv_cuda_free(dk);
            mkv_cuda_free(dv);
            temp_tokens *t = &tmp[i];
            t->start = pc->T;
            t->n = n;
            t->ks = h[i].k.seg[ls];
            t->vs = h[i].v.seg[ls];
            t->ks.start = t->vs.start = pc->T;
            t->ks.len = t->vs.len = n;
            t->Rk = t->ks.rotate ? floats_of(h[i].k.rotation + h[i].k.off_rotation[ls], (size_t)d * rot_cols(&t->ks))
                                 : NULL;
            t->Rv = t->vs.rotate ? floats_of(h[i].v.rotation + h[i].v.off_rotation[ls], (size_t)d * t->vs.dprime)
                                 : NULL;
            t->kval = xmalloc(sizeof(float) * (size_t)n * t->ks.r);
            t->vval = xmalloc(sizeof(float) * (size_t)n * t->vs.r);
            t->kbits = xcalloc((size_t)n * (mkv_mosaic_bitmap_bytes(&t->ks) + 1), 1);
            t->vbits = xcalloc((size_t)n * (mkv_mosaic_bitmap_bytes(&t->vs) + 1), 1);
            double *R = xmalloc(sizeof(double) * (size_t)d * d);
            for (int pass = 0; pass < 2; pass++) {
                const mkv_mosaic_strategy *s = pass ? &t->vs : &t->ks;
                const float *Rs = pass ? t->Rv : t->Rk;
                const int cols = pass ? s->dprime : rot_cols(s);
                for (int j = 0; j < d; j++)
                    for (int c = 0; c < d; c++)
                        R[(size_t)j * d + c] = Rs && c < cols ? Rs[(size_t)j * cols + c] : 0;
                uint16_t *rot = xmalloc(sizeof(uint16_t) * (size_t)d * d), *vals = xmalloc(2 * (size_t)n * s->r);
                ck_assert_msg(mkv_mosaic_encode(s, pass ? nv : nk, d, R, 0, vals,
                                                mkv_mosaic_bitmap_bytes(s) ? (pass ? t->vbits : t->kbits) : NULL, NULL,
                                                NULL, NULL, rot, &err) == MKV_OK,
                              "CPU encode: %s", err.msg);
                for (int64_t e = 0; e < n * s->r; e++)
                    (pass ? t->vval : t->kval)[e] = mkv_f16_to_f32(vals[e]);
                free(vals);
                free(rot);
            }
            free(R);
            free(nk);
            free(nv);
        }
    }

    int64_t pos[8];
    const int64_t nq = pick_positions(end, pos);
    const int n_heads = nh * G;
    const size_t qn = (size_t)nq * n_heads * d;
    float *q = xmalloc(sizeof(float) * qn), *out = xmalloc(sizeof(float) * qn);
    for (int64_t b = 0; b < nq; b++)
        for (int i = 0; i < nh; i++)
            for (int g = 0; g < G; g++)
                gen_query(hd[i].k, pos[b] < pc->T ? pos[b] : pc->T - 1, d, q + (((size_t)b * nh + i) * G + g) * d);
    int32_t *heads = xmalloc(sizeof(int32_t) * (size_t)nq * nh);
    for (int64_t b = 0; b < nq; b++)
        for (int i = 0; i < nh; i++)
            heads[b * nh + i] = i;
    mkv_packed_params pp = {(int)nq, nh, n_heads, 0, pc->budget, pc->agg_sum, bits};
    mkv_packed_plan *plan = NULL;
    if (pc->temp > 0) {   /* the cache ends at T + temp: the refused appends added nothing */
        mkv_packed_params p1 = pp;
        int64_t past = end;
        p1.batch = 1;
        ck_assert_int_eq(mkv_cuda_mosaic_plan(cache, &p1, heads, &past, &plan, &err), MKV_EUSAGE);
        ck_assert_msg(strstr(err.msg, "position") != NULL, "%s: message: %s", pc->label, err.msg);
        ck_assert_ptr_null(plan);
    }
    ck_assert_msg(mkv_cuda_mosaic_plan(cache, &pp, heads, pos, &plan, &err) == MKV_OK, "plan: %s", err.msg);
    float *dq = dalloc(sizeof(float) * qn), *dout = dalloc(sizeof(float) * qn);
    ck_assert(mkv_cuda_upload(dq, q, sizeof(float) * qn, &err) == MKV_OK);
    ck_assert(mkv_cuda_memset(dout, 0xff, sizeof(float) * qn, &err) == MKV_OK);
    ck_assert_msg(mkv_cuda_mosaic_run(plan, dq, dout, NULL, &err) == MKV_OK, "run: %s", err.msg);
    ck_assert_msg(mkv_cuda_synchronize(&err) == MKV_OK, "kernels failed: %s", err.msg);
    ck_assert(mkv_cuda_download(out, dout, sizeof(float) * qn, &err) == MKV_OK);

    int differ = 0;
    double worst_cpu = 0, worst_ref = 0;
    for (int i = 0; i < nh; i++) {
        const int nb = lay.heads[i].n_blocks;
        uint8_t *blk = xmalloc((size_t)nb + 1), *att = xcalloc((size_t)end, 1), *catt = xcalloc((size_t)end, 1);
        uint8_t *cblk = xcalloc((size_t)nb + 1, 1);
        double *score = xmalloc(sizeof(double) * (size_t)(nb + 1)), *mag = xmalloc(sizeof(double) * (size_t)(nb + 1));
        double *ref = xmalloc(sizeof(double) * (size_t)G * d), *ref_mag = xmalloc(sizeof(double) * (size_t)G * d);
        float *cpu = xmalloc(sizeof(float) * (size_t)G * d);
        for (int64_t b = 0; b < nq; b++) {
            const float *qb = q + ((size_t)b * nh + i) * G * d;
            const float *ob = out + ((size_t)b * nh + i) * G * d;
            mkv_packed_counts ct;
            memset(att, 0, (size_t)end);
            ck_assert_msg(mkv_cuda_mosaic_selection(plan, (int)b, i, blk, att, &ct, &err) == MKV_OK, "%s", err.msg);
            int64_t n_att = 0;
            for (int64_t t = 0; t < end; t++) {
                ck_assert_msg(!att[t] || t <= pos[b], "%s: token %lld after the query at %lld attended", pc->label,
                              (long long)t, (long long)pos[b]);
                n_att += att[t];
            }
            ck_assert_msg(n_att == ct.tokens, "%s: %lld tokens flagged, %lld counted", pc->label, (long long)n_att,
                          (long long)ct.tokens);
            char what[256];
            snprintf(what, sizeof what, "%s: query at %lld, KV head %d", pc->label, (long long)pos[b], i);
            check_flags(&h[i], pc->temp, pos[b], blk, nb, att, what);
            /* the GPU's own selection, recomputed in double */
            ref_attend(&h[i], qb, G, pos[b], blk, pc->temp ? &tmp[i] : NULL, ref, ref_mag);
            for (int g = 0; g < G; g++) {
                const double e = rel_err(ob + g * d, ref + (size_t)g * d, ref_mag + (size_t)g * d, d, what);
                worst_ref = e > worst_ref ? e : worst_ref;
                ck_assert_msg(e <= TOL, "%s head %d: %.3e from the reference over its selection", what, g, e);
            }
            if (bits == 8 || pc->temp > 0 || pos[b] >= pc->T) {
                /* The CPU method has no 8-bit block keys and no temporary
                 * region: the rule, recomputed here with them. */
                differ += check_rule(&h[i], pc->temp, qb, G, pos[b], pc->budget, pc->agg_sum, bits, blk, ct.tokens,
                                     what);
                continue;
            }
            /* the CPU method */
            mkv_mosaic_attn_opts o = {pc->budget, pc->agg_sum};
            mkv_attend_query aq = {.G = G, .d = d, .q = qb, .pos = pos[b], .scale = 1.0 / sqrt((double)d)};
            memset(catt, 0, (size_t)end);
            mkv_attend_result r = {.out = cpu, .attended = catt, .bytes_read = 0};
            ck_assert_msg(mkv_mosaic_attend(&h[i], &o, &aq, &r, &err) == MKV_OK, "%s", err.msg);
            int same = 1;
            for (int64_t t = 0; t < end; t++)
                same &= att[t] == catt[t];
            if (same) {
                for (int g = 0; g < G; g++) {
                    double want[128];
                    for (int j = 0; j < d; j++)
                        want[j] = cpu[g * d + j];
                    const double e = rel_err(ob + g * d, want, ref_mag + (size_t)g * d, d, what);
                    worst_cpu = e > worst_cpu ? e : worst_cpu;
                    ck_assert_msg(e <= TOL, "%s head %d: %.3e from mkv_mosaic_attend", what, g, e);
                }
                ck_assert_msg(mkv_gpu_mosaic_bytes(&h[i], pos[b], blk, ct.dense_tokens) == r.bytes_read,
                              "%s: bytes_read %llu, the CPU's %llu", what,
                              (unsigned long long)mkv_gpu_mosaic_bytes(&h[i], pos[b], blk, ct.dense_tokens),
                              (unsigned long long)r.bytes_read);
                continue;
            }
            ck_assert_msg(!pc->equal_keys, "%s: equal scores must select exactly the CPU's blocks", what);
            /* Blocks attended by one side only must score at the CPU's
             * threshold: the lowest score it took. */
            block_scores(&h[i], qb, G, pos[b], pc->agg_sum, 16, score, mag);
            double thr = INFINITY, mag_max = 0;
            int64_t id = 0;
            for (int64_t s = 0; s < h[i].k.nseg; s++) {
                const mkv_mosaic_strategy *ks = &h[i].k.seg[s];
                const int64_t nbs = mkv_mosaic_nblocks(ks->len, h[i].block);
                for (int64_t bb = 0; bb < nbs; bb++) {
                    const int64_t t0 = ks->start + bb * h[i].block;
                    cblk[id + bb] = t0 <= pos[b] && catt[t0];
                    if (cblk[id + bb] && score[id + bb] < thr)
                        thr = score[id + bb];
                    if (t0 <= pos[b])
                        mag_max = mag[id + bb] > mag_max ? mag[id + bb] : mag_max;
                }
                id += nbs;
            }
            for (int64_t k = 0; k < id; k++)
                if (blk[k] != cblk[k]) {
                    ck_assert_msg(isfinite(thr) && fabs(score[k] - thr) <= 2 * SCORE_TOL(d) * mag_max,
                                  "%s: block %lld attended by one device only (score %.9g, CPU threshold %.9g)", what,
                                  (long long)k, score[k], thr);
                    differ++;
                }
        }
        free(blk);
        free(att);
        free(catt);
        free(cblk);
        free(score);
        free(mag);
        free(ref);
        free(ref_mag);
        free(cpu);
    }
    st->differ_blocks += differ;
    st->queries += (int)nq * nh;
    st->worst_cpu = worst_cpu > st->worst_cpu ? worst_cpu : st->worst_cpu;
    st->worst_ref = worst_ref > st->worst_ref ? worst_ref : st->worst_ref;
    printf("  %-58s near-tie blocks %3d  err vs CPU %.1e, vs reference %.1e\n", pc->label, differ, worst_cpu,
           worst_ref);

    for (int i = 0; i < nh; i++) {
        free(tmp[i].kval);
        free(tmp[i].vval);
        free(tmp[i].Rk);
        free(tmp[i].Rv);
        free(tmp[i].kbits);
        free(tmp[i].vbits);
        mkv_mosaic_head_free(&h[i]);
        free_head_data(&hd[i]);
    }
    free(tmp);
    mkv_cuda_free(dq);
    mkv_cuda_free(dout);
    mkv_cuda_mosaic_plan_free(plan);
    mkv_cuda_mosaic_free(cache);
    mkv_gpu_layout_free(&lay);
    free(q);
    free(out);
    free(heads);
    free(hp);
    free(h);
    free(hd);
}

/* ------------------------------------------------------------ attention */

START_TEST(test_shapes)
{
    pstats st = {0};
    static const int dims[] = {64, 128}, groups[] = {1, 4, 8};
    for (int di = 0; di < 2; di++)
        for (int gi = 0; gi < 3; gi++) {
            if (quick && (di + gi) % 2)
                continue;
            const int d = dims[di], G = groups[gi];
            char label[128];
            snprintf(label, sizeof label, "fixed d=%d G=%d B=8 S=1024", d, G);
            pcase pc = {label, d, G, 8, 2, quick ? 1500 : 3000 + (int64_t)mkv_rng_below(&rng, 2000),
                        config(0, 8, 1024, d / 4, 1, 1), 0.1, 0, 0, 0};
            run_case(&pc, &st);
        }
    ck_assert_int_gt(st.queries, 0);
}
END_TEST

START_TEST(test_strategies)
{
    pstats st = {0};
    const int64_t T = quick ? 1800 : 4000 + (int64_t)mkv_rng_below(&rng, 1000);
    pcase cases[] = {
        {"dynamic d=64 G=4", 64, 4, 8, 2, T, config(1, 8, 1024, 16, 1, 1), 0.1, 0, 0, 0},
        {"dynamic d=128 G=8, sum", 128, 8, 8, 2, T, config(1, 8, 2048, 32, 1, 1), 0.15, 1, 0, 0},
        {"fixed g=2 d=64 G=4", 64, 4, 8, 1, T, config(0, 8, 1024, 16, 2, 1), 0.1, 0, 0, 0},
        {"fixed g=4 d=128 G=4", 128, 4, 8, 1, T, config(0, 8, 1024, 32, 4, 1), 0.1, 0, 0, 0},
        {"uniform2d (first r) d=64 G=4", 64, 4, 8, 1, T, config(0, 8, 1024, 16, 1, 0), 0.1, 0, 0, 0},
        {"fixed B=4 d=64 G=1, 300 tokens", 64, 1, 4, 1, T, config(0, 4, 512, 24, 1, 1), 300, 0, 0, 0},
        {"fixed B=16 d=128 G=4, 25%", 128, 4, 16, 1, T, config(0, 16, 1024, 32, 1, 1), 0.25, 0, 0, 0},
        {"fixed B=8 S=700 (short blocks) d=64 G=4", 64, 4, 8, 1, T, config(0, 8, 700, 16, 1, 1), 0.1, 0, 0, 0},
        {"unrotated d=64 G=4", 64, 4, 8, 1, T, config(0, 8, 1024, 16, 1, 1), 0.1, 0, 0, 0},
    };
    cases[8].cfg.rotate = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (quick && i % 3 != 0)
            continue;
        run_case(&cases[i], &st);
    }
    printf("  strategies: %d near-tie blocks over %d queries\n", st.differ_blocks, st.queries);
}
END_TEST

/* Every block: the output is the CPU's, with no selection to differ. */
START_TEST(test_full_budget)
{
    pstats st = {0};
    pcase pc = {"budget 100% d=128 G=4", 128, 4, 8, 2, quick ? 1200 : 2500, config(0, 8, 1024, 32, 1, 1), 1.0, 0, 0, 0};
    run_case(&pc, &st);
    ck_assert_int_eq(st.differ_blocks, 0);
}
END_TEST

/* One segment with all block keys equal: every score ties, and the
 * earliest blocks must be taken (run_case fails on any difference). */
START_TEST(test_ties)
{
    pstats st = {0};
    pcase pc = {"equal scores (one segment) d=64 G=4", 64, 4, 8, 1, 2000, config(0, 8, 100000, 16, 1, 1), 0.1, 0, 0, 1};
    run_case(&pc, &st);
}
END_TEST

/* 8-bit block keys: the selection is the rule's over scores of the codes
 * (recomputed here in double, row_codes), the output the reference's over
 * that selection; rows of 130, 66 and 34 channels (keydim 4 r, 2 of them
 * bounded: codes in rows of 144, 80 and 48 bytes, the three row widths of
 * the scoring kernel), one unrotated, sums over the heads, blocks of 4 and
 * 16, a segment of 1024 blocks, a temporary region. */
START_TEST(test_blockkeys8)
{
    pstats st = {0};
    const int64_t T = quick ? 1800 : 4000 + (int64_t)mkv_rng_below(&rng, 1000);
    pcase cases[] = {
        {"8-bit keys fixed d=128 G=4", 128, 4, 8, 2, T, config(0, 8, 1024, 32, 1, 1), 0.1, 0, 0, 0, 8},
        {"8-bit keys dynamic d=64 G=4", 64, 4, 8, 2, T, config(1, 8, 1024, 16, 1, 1), 0.1, 0, 0, 0, 8},
        {"8-bit keys fixed d=64 G=8, sum", 64, 8, 8, 1, T, config(0, 8, 2048, 8, 1, 1), 0.15, 1, 0, 0, 8},
        {"8-bit keys unrotated d=64 G=1", 64, 1, 8, 1, T, config(0, 8, 1024, 16, 1, 1), 0.1, 0, 0, 0, 8},
        {"8-bit keys B=4 S=4096 d=64 G=4", 64, 4, 4, 1, 5000, config(0, 4, 4096, 16, 1, 1), 0.1, 0, 0, 0, 8},
        {"8-bit keys B=16 d=128 G=4, 25%", 128, 4, 16, 1, T, config(0, 16, 1024, 32, 1, 1), 0.25, 0, 0, 0, 8},
        {"8-bit keys, temporary region d=64 G=4", 64, 4, 8, 1, T, config(0, 8, 1024, 16, 1, 1), 0.1, 0, 40, 0, 8},
    };
    cases[3].cfg.rotate = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (quick && i % 3 != 0)
            continue;
        run_case(&cases[i], &st);
    }
    printf("  8-bit block keys: %d near-tie blocks over %d queries\n", st.differ_blocks, st.queries);
    ck_assert_int_gt(st.queries, 0);
}
END_TEST

/* Long heads: a segment of 1024 blocks (two compaction windows of the
 * attention, WIN in kernels/mosaic_attend.cu, four blocks a tile), heads of
 * 5000+ and 9000 blocks (the selection's passes take several loads per
 * thread), the latter with every score tied (eq_cut over 9000 blocks). */
START_TEST(test_long_heads)
{
    pstats st = {0};
    pcase cases[] = {
        {"fixed B=4 S=4096 (1024 blocks, two windows) d=64 G=4", 64, 4, 4, 1, 5000, config(0, 4, 4096, 16, 1, 1), 0.1,
         0, 0, 0},
        {"fixed B=4 (5000+ blocks) d=64 G=4", 64, 4, 4, 1, 20000 + (int64_t)mkv_rng_below(&rng, 2000),
         config(0, 4, 2048, 16, 1, 1), 0.1, 0, 0, 0},
        {"equal scores (9000 blocks) d=64 G=4", 64, 4, 4, 1, 36000, config(0, 4, 100000, 16, 1, 1), 0.1, 0, 0, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_case(&cases[i], &st);
}
END_TEST

/* A temporary region of GPU-encoded tokens: always attended. */
START_TEST(test_temporary_region)
{
    pstats st = {0};
    pcase pc = {"temporary region (+37 tokens) d=128 G=4", 128, 4, 8, 2, quick ? 1500 : 3000,
                config(0, 8, 1024, 32, 1, 1), 0.1, 0, 37, 0};
    run_case(&pc, &st);
    pcase pd = {"temporary region (+20 tokens) dynamic d=64 G=8", 64, 8, 8, 1, quick ? 1500 : 3000,
                config(1, 8, 1024, 16, 1, 1), 0.1, 0, 20, 0};
    run_case(&pd, &st);
}
END_TEST

/* ---------------------------------------------------------------- encode */

/* Whether x (double) lies within 1e-12 (relative) of a point where
 * double -> float -> fp16 rounding changes. */
static int near_rounding_boundary(double x)
{
    const float f = (float)x;
    const uint16_t h = mkv_f32_to_f16(f);
    const double lo = mkv_f16_to_f32((uint16_t)(h - 1)), hi = mkv_f16_to_f32((uint16_t)(h + 1)), m = mkv_f16_to_f32(h);
    const double tol = 1e-12 * (fabs(x) + 1e-30) + fabs((double)f - x);
    return fabs(x - (m + lo) / 2) <= tol || fabs(x - (m + hi) / 2) <= tol;
}

static void check_encode(const mkv_mosaic_strategy *s, int d, int64_t n, int block, int *odd)
{
    mkv_error err = {0};
    float *X = xmalloc(sizeof(float) * (size_t)n * d);
    gen_rows(n, d, 1.5, X);
    double *R = xmalloc(sizeof(double) * (size_t)d * d), *ev = xmalloc(sizeof(double) * (size_t)d);
    ck_assert(mkv_mosaic_rotation(X, n, d, R, ev, &err) == MKV_OK);
    mkv_mosaic_round_f16(R, (size_t)d * d);
    const int dp = s->dprime, bb = mkv_mosaic_bitmap_bytes(s);
    const int64_t nb = (n + block - 1) / block;
    uint16_t *cv = xmalloc(2 * (size_t)n * s->r), *ck = xmalloc(2 * (size_t)nb * dp);
    uint16_t *r16 = xmalloc(2 * (size_t)d * dp);   /* the GPU gets the stored rotation [d][d'] */
    uint8_t *cbits = xcalloc((size_t)n * (bb + 1), 1);
    ck_assert_msg(mkv_mosaic_encode(s, X, d, R, block, cv, bb ? cbits : NULL, NULL, NULL, ck, r16, &err) == MKV_OK,
                  "%s", err.msg);
    float *dX = dalloc(sizeof(float) * (size_t)n * d);
    uint16_t *dR = dalloc(2 * (size_t)d * dp), *dv = dalloc(2 * (size_t)n * s->r), *dk = dalloc(2 * (size_t)nb * dp);
    uint8_t *db = bb ? dalloc((size_t)n * bb) : NULL;
    ck_assert(mkv_cuda_upload(dX, X, sizeof(float) * (size_t)n * d, &err) == MKV_OK);
    ck_assert(mkv_cuda_upload(dR, r16, 2 * (size_t)d * dp, &err) == MKV_OK);
    mkv_cuda_strategy cs = {s->rotate, s->r, s->g, s->dprime, s->pervector};
    ck_assert_msg(mkv_cuda_mosaic_encode(&cs, d, n, block, dX, s->rotate ? dR : NULL, dv, db, dk, NULL, &err) == MKV_OK,
                  "GPU encode: %s", err.msg);
    uint16_t *gv = xmalloc(2 * (size_t)n * s->r), *gk = xmalloc(2 * (size_t)nb * dp);
    uint8_t *gb = xcalloc((size_t)n * (bb + 1), 1);
    ck_assert(mkv_cuda_download(gv, dv, 2 * (size_t)n * s->r, &err) == MKV_OK);
    ck_assert(mkv_cuda_download(gk, dk, 2 * (size_t)nb * dp, &err) == MKV_OK);
    if (bb)
        ck_assert(mkv_cuda_download(gb, db, (size_t)n * bb, &err) == MKV_OK);
    /* x~ in double, as the CPU computes it, to judge any difference */
    double *xt = xmalloc(sizeof(double) * (size_t)n * dp);
    mkv_mosaic_rotate(X, n, d, s->rotate ? R : NULL, d, dp, xt);
    for (int64_t t = 0; t < n; t++) {
        if (bb && memcmp(gb + t * bb, cbits + t * bb, (size_t)bb) != 0) {
            /* only an energy tie between the last group kept and the first left may go the other way */
            const int ng = dp / s->g, k = s->r / s->g;
            double e[128], sorted[128];
            for (int i = 0; i < ng; i++) {
                e[i] = 0;
                for (int c = i * s->g; c < i * s->g + s->g; c++)
                    e[i] += xt[t * dp + c] * xt[t * dp + c];
                sorted[i] = e[i];
            }
            for (int i = 1; i < ng; i++)
                for (int j = i; j > 0 && sorted[j] > sorted[j - 1]; j--) {
                    double x = sorted[j];
                    sorted[j] = sorted[j - 1];
                    sorted[j - 1] = x;
                }
            ck_assert_msg(fabs(sorted[k - 1] - sorted[k]) <= 1e-12 * sorted[k - 1],
                          "encode: vector %lld: bitmaps differ without an energy tie", (long long)t);
            (*odd)++;
            continue;
        }
        int posn[128];
        mkv_mosaic_positions(bb ? cbits + t * bb : NULL, s, posn);
        for (int i = 0; i < s->r; i++) {
            const uint16_t want = cv[t * s->r + i];
            if (gv[t * s->r + i] == want)
                continue;
            ck_assert_msg(near_rounding_boundary(xt[t * dp + posn[i]]),
                          "encode: vector %lld value %d: GPU %04x, CPU %04x", (long long)t, i, gv[t * s->r + i], want);
            (*odd)++;
        }
    }
    for (int64_t i = 0; i < nb * dp; i++) {
        const uint16_t want = ck[i];
        if (gk[i] == want)
            continue;
        const int64_t b = i / dp, c = i % dp, t0 = b * block, t1 = t0 + block < n ? t0 + block : n;
        double sum = 0;
        for (int64_t t = t0; t < t1; t++)
            sum += xt[t * dp + c];
        ck_assert_msg(near_rounding_boundary(sum / (double)(t1 - t0)), "encode: block key %lld: GPU %04x, CPU %04x",
                      (long long)i, gk[i], want);
        (*odd)++;
    }
    mkv_cuda_free(dX);
    mkv_cuda_free(dR);
    mkv_cuda_free(dv);
    mkv_cuda_free(dk);
    mkv_cuda_free(db);
    free(X);
    free(R);
    free(ev);
    free(cv);
    free(ck);
    free(cbits);
    free(r16);
    free(gv);
    free(gk);
    free(gb);
    free(xt);
}

START_TEST(test_encode)
{
    int odd = 0, cases = 0;
    const int64_t n = quick ? 300 : 2000 + (int64_t)mkv_rng_below(&rng, 500);
    static const struct { int d, rotate, r, g, dp, pervector; } ss[] = {
        {64, 1, 16, 1, 48, 1}, {64, 1, 16, 2, 32, 1}, {128, 1, 32, 4, 64, 1}, {128, 1, 32, 1, 64, 1},
        {64, 0, 16, 1, 64, 1}, {128, 1, 32, 1, 32, 0}, {64, 1, 40, 1, 40, 1},
    };
    for (size_t i = 0; i < sizeof ss / sizeof ss[0]; i++) {
        if (quick && i % 2)
            continue;
        mkv_mosaic_strategy s = {.start = 0, .len = n, .rotate = ss[i].rotate, .r = ss[i].r, .g = ss[i].g,
                                 .dprime = ss[i].dp, .pervector = ss[i].pervector, .bits = 16};
#ifdef MKV_MOSAIC_BLOCKDIM_COLS
        s.keydim = ss[i].dp;   /* the GPU encoder's block keys: the mean over d' */
        s.bound = 0;
#endif
        check_encode(&s, ss[i].d, n, 8, &odd);
        cases++;
    }
    printf("  encode: %d strategies x %lld vectors, %d differences at rounding boundaries or energy ties\n", cases,
           (long long)n, odd);
}
END_TEST

/* ------------------------------------------------------------- rotations */

START_TEST(test_rotations)
{
    static const int dims[] = {16, 32, 64, 128};
    const int batch = 3;
    for (int di = 0; di < 4; di++) {
        if (quick && di % 2 == 0)
            continue;
        const int d = dims[di];
        const size_t dd = (size_t)d * d;
        double *C = xmalloc(sizeof(double) * dd * batch), *Q = xmalloc(sizeof(double) * dd);
        double *R = xmalloc(sizeof(double) * dd * batch), *ev = xmalloc(sizeof(double) * (size_t)d * batch);
        double *Rc = xmalloc(sizeof(double) * dd), *evc = xmalloc(sizeof(double) * (size_t)d);
        mkv_error err = {0};
        for (int b = 0; b < batch; b++) {
            /* Q: orthonormal from a random Gram matrix; eigenvalues 1, 2, ..., d (well apart) */
            float *X = xmalloc(sizeof(float) * (size_t)4 * d * d);
            for (size_t i = 0; i < (size_t)4 * d * d; i++)
                X[i] = (float)mkv_rng_normal(&rng);
            double *G = xcalloc(dd, sizeof(double)), *w = xmalloc(sizeof(double) * (size_t)d);
            ck_assert(mkv_gram_add(G, X, 4 * d, d, &err) == MKV_OK);
            ck_assert(mkv_eigh(G, d, w, Q, &err) == MKV_OK);
            for (int i = 0; i < d; i++)
                for (int j = 0; j < d; j++) {
                    double s = 0;
                    for (int k = 0; k < d; k++)
                        s += Q[(size_t)i * d + k] * (double)(k + 1) * Q[(size_t)j * d + k];
                    C[(size_t)b * dd + (size_t)i * d + j] = s;
                }
            free(X);
            free(G);
            free(w);
        }
        ck_assert_msg(mkv_cuda_eigh_batched(C, d, batch, R, ev, &err) == MKV_OK, "rotations d=%d: %s", d, err.msg);
        double worst_orth = 0, worst_proj = 0, worst_ev = 0;
        for (int b = 0; b < batch; b++) {
            const double *Rb = R + (size_t)b * dd;
            ck_assert(mkv_eigh(C + (size_t)b * dd, d, evc, Rc, &err) == MKV_OK);
            for (int i = 0; i < d; i++) {
                const double e = fabs(ev[(size_t)b * d + i] - evc[i]) / evc[0];
                worst_ev = e > worst_ev ? e : worst_ev;
                ck_assert_msg(i == 0 || ev[(size_t)b * d + i] <= ev[(size_t)b * d + i - 1], "eigenvalues not descending");
                for (int j = 0; j < d; j++) {
                    double s = 0, p = 0;
                    for (int k = 0; k < d; k++)
                        s += Rb[(size_t)k * d + i] * Rb[(size_t)k * d + j];
                    const double o = fabs(s - (i == j));
                    worst_orth = o > worst_orth ? o : worst_orth;
                    /* projector of eigenvector i: v v^T, sign-free */
                    p = fabs(Rb[(size_t)j * d + i] * Rb[(size_t)j * d + i] - Rc[(size_t)j * d + i] * Rc[(size_t)j * d + i]);
                    worst_proj = p > worst_proj ? p : worst_proj;
                }
            }
        }
        printf("  rotations d=%3d: orthonormality %.1e, eigenvalues %.1e, projector diagonals %.1e\n", d, worst_orth,
               worst_ev, worst_proj);
        ck_assert_msg(worst_orth < 1e-10 && worst_ev < 1e-10 && worst_proj < 1e-8,
                      "rotations d=%d: orthonormality %.3e, eigenvalues %.3e, projectors %.3e", d, worst_orth, worst_ev,
                      worst_proj);
        free(C);
        free(Q);
        free(R);
        free(ev);
        free(Rc);
        free(evc);
    }
}
END_TEST

/* ------------------------------------------------------------- refusals */

/* Growth with 8-bit block keys (mkv_cuda_mosaic_grow after
 * mkv_cuda_mosaic_blockkeys8): every open-segment row the new tokens
 * reach carries row_codes of its fp16 row (grown alongside in a cache that
 * keeps them), and a cache whose fp16 rows were dropped grows the same
 * codes and scales and attends the same; it holds their bytes less and
 * refuses fp16 scoring, a second conversion and appends. */
START_TEST(test_grow_blockkeys8)
{
    mkv_error err = {0};
    const int d = 64, G = 4, B = 8, n_new = 21;   /* three blocks of the open segment */
    head_data hd = make_head(700, d, G);
    mkv_mosaic_config c = config(0, B, 256, 16, 1, 1);
    mkv_mosaic_head h;
    compress(&hd, &c, &h);
    const mkv_mosaic_head *hp = &h;
    mkv_gpu_layout lay;
    ck_assert_msg(mkv_gpu_layout_build(&hp, 1, n_new, 1, &lay, &err) == MKV_OK, "layout: %s", err.msg);
    mkv_packed_cache *kept = NULL, *dropped = NULL;
    ck_assert_msg(mkv_cuda_mosaic_upload(&lay.l, &kept, &err) == MKV_OK, "upload: %s", err.msg);
    ck_assert_msg(mkv_cuda_mosaic_upload(&lay.l, &dropped, &err) == MKV_OK, "upload: %s", err.msg);
    ck_assert_int_eq(mkv_cuda_mosaic_drop_blockkeys16(dropped, &err), MKV_EUSAGE);   /* no 8-bit ones yet */
    ck_assert_int_eq(mkv_cuda_mosaic_blockkeys8(kept, &err), MKV_OK);
    ck_assert_int_eq(mkv_cuda_mosaic_blockkeys8(dropped, &err), MKV_OK);
    const uint64_t bytes_kept = mkv_cuda_mosaic_bytes(kept);
    ck_assert_msg(mkv_cuda_mosaic_drop_blockkeys16(dropped, &err) == MKV_OK, "drop: %s", err.msg);
    ck_assert_uint_eq(mkv_cuda_mosaic_bytes(dropped), bytes_kept - 2 * (uint64_t)lay.l.n_blockkeys);

    float *dk = dalloc(sizeof(float) * d), *dv = dalloc(sizeof(float) * d), kx[128], vx[128];
    for (int t = 0; t < n_new; t++) {
        gen_rows(1, d, 2.0, kx);
        gen_rows(1, d, 0.5, vx);
        ck_assert_int_eq(mkv_cuda_upload(dk, kx, sizeof(float) * d, &err), MKV_OK);
        ck_assert_int_eq(mkv_cuda_upload(dv, vx, sizeof(float) * d, &err), MKV_OK);
        ck_assert_msg(mkv_cuda_mosaic_grow(kept, 0, 1, dk, dv, NULL, &err) == MKV_OK, "grow: %s", err.msg);
        ck_assert_msg(mkv_cuda_mosaic_grow(dropped, 0, 1, dk, dv, NULL, &err) == MKV_OK, "grow: %s", err.msg);
    }
    ck_assert_int_eq(mkv_cuda_mosaic_grow_check(kept, &err), MKV_OK);
    ck_assert_int_eq(mkv_cuda_mosaic_grow_check(dropped, &err), MKV_OK);

    const int64_t seg = lay.heads[0].first_seg + lay.heads[0].n_seg - 1, rows = (n_new + B - 1) / B;
    const mkv_packed_seg *g = &lay.segs[seg];
    ck_assert_int_eq(g->open, 1);
    const int w = g->bk_width, rb = (w + 15) / 16 * 16;
    int8_t *ck = xmalloc((size_t)rows * rb), *cd = xmalloc((size_t)rows * rb);
    float sk[8], sd[8];
    uint16_t *row16 = xmalloc(sizeof(uint16_t) * (size_t)rows * w);
    ck_assert_int_eq(mkv_cuda_mosaic_blockkeys8_rows(kept, seg, 0, rows, ck, sk, &err), MKV_OK);
    ck_assert_int_eq(mkv_cuda_mosaic_blockkeys8_rows(dropped, seg, 0, rows, cd, sd, &err), MKV_OK);
    mkv_packed_pools pools;
    ck_assert_int_eq(mkv_cuda_mosaic_pools(kept, &pools, &err), MKV_OK);
    ck_assert_int_eq(mkv_cuda_download(row16, pools.blockkeys + g->bk_off, sizeof(uint16_t) * (size_t)rows * w, &err),
                     MKV_OK);
    int nonzero = 0;
    for (int64_t r = 0; r < rows; r++) {
        double code[2 * 128 + 8];
        const double scale = row_codes(row16 + r * w, w, code);
        ck_assert_msg((double)sk[r] == scale, "row %lld: scale %.9g, wanted %.9g", (long long)r, sk[r], scale);
        for (int i = g->kdim + g->kbound; i < w; i++)
            ck_assert_msg(row16[r * w + i] == 0, "row %lld: padding channel %d is %#x", (long long)r, i, row16[r * w + i]);
        for (int i = 0; i < rb; i++) {
            const int want = i < w ? (int)code[i] : 0;
            ck_assert_msg(ck[r * rb + i] == want, "row %lld code %d: %d, wanted %d", (long long)r, i,
                          ck[r * rb + i], want);
            nonzero += want != 0;
        }
    }
    ck_assert_int_gt(nonzero, rows * w / 2);
    ck_assert_int_eq(memcmp(ck, cd, (size_t)rows * rb), 0);
    ck_assert_int_eq(memcmp(sk, sd, sizeof(float) * (size_t)rows), 0);

    /* both attend a query at the last token alike with the 8-bit keys; the dropped one no other way */
    int32_t heads[1] = {0};
    int64_t pos[1] = {700 + n_new - 1};
    mkv_packed_params pp = {1, 1, G, 0, 0.1, 0, 8};
    mkv_packed_plan *pk = NULL, *pdr = NULL;
    float q[4 * 128], ok[4 * 128], od[4 * 128];
    for (int i = 0; i < G; i++)
        gen_query(hd.k, 650 + i, d, q + (size_t)i * d);
    float *dq = dalloc(sizeof(float) * G * d), *dout = dalloc(sizeof(float) * G * d);
    ck_assert_int_eq(mkv_cuda_upload(dq, q, sizeof(float) * G * d, &err), MKV_OK);
    ck_assert_msg(mkv_cuda_mosaic_plan(kept, &pp, heads, pos, &pk, &err) == MKV_OK, "plan: %s", err.msg);
    ck_assert_msg(mkv_cuda_mosaic_plan(dropped, &pp, heads, pos, &pdr, &err) == MKV_OK, "plan: %s", err.msg);
    ck_assert_int_eq(mkv_cuda_mosaic_run(pk, dq, dout, NULL, &err), MKV_OK);
    ck_assert_int_eq(mkv_cuda_download(ok, dout, sizeof(float) * G * d, &err), MKV_OK);
    ck_assert_int_eq(mkv_cuda_mosaic_run(pdr, dq, dout, NULL, &err), MKV_OK);
    ck_assert_int_eq(mkv_cuda_download(od, dout, sizeof(float) * G * d, &err), MKV_OK);
    ck_assert_int_eq(memcmp(ok, od, sizeof(float) * G * d), 0);
    mkv_cuda_mosaic_plan_free(pk);
    mkv_cuda_mosaic_plan_free(pdr);
    pdr = NULL;
    pp.blockkey_bits = 16;
    ck_assert_int_eq(mkv_cuda_mosaic_plan(dropped, &pp, heads, pos, &pdr, &err), MKV_EUSAGE);
    ck_assert_msg(strstr(err.msg, "only 8-bit") != NULL, "message: %s", err.msg);
    ck_assert_ptr_null(pdr);
    ck_assert_int_eq(mkv_cuda_mosaic_blockkeys8(dropped, &err), MKV_EUSAGE);
    ck_assert_int_eq(mkv_cuda_mosaic_append(dropped, 0, dk, dv, 1, NULL, &err), MKV_EUSAGE);

    mkv_cuda_free(dq);
    mkv_cuda_free(dout);
    mkv_cuda_free(dk);
    mkv_cuda_free(dv);
    free(ck);
    free(cd);
    free(row16);
    mkv_cuda_mosaic_free(kept);
    mkv_cuda_mosaic_free(dropped);
    mkv_gpu_layout_free(&lay);
    mkv_mosaic_head_free(&h);
    free_head_data(&hd);
}
END_TEST

START_TEST(test_refusals)
{
    mkv_error err = {0};
    head_data hd = make_head(600, 64, 4);
    mkv_mosaic_config c = config(0, 8, 256, 16, 1, 1);
    mkv_mosaic_head h;
    compress(&hd, &c, &h);
    const mkv_mosaic_head *hp = &h;
    mkv_gpu_layout lay;
    ck_assert_int_eq(mkv_gpu_layout_build(&hp, 1, 0, 0, &lay, &err), MKV_OK);
    mkv_packed_cache *cache = NULL;

    mkv_packed_layout bad = lay.l;
    bad.head_dim = 96;
    ck_assert_int_eq(mkv_cuda_mosaic_upload(&bad, &cache, &err), MKV_EUNSUP);
    ck_assert_msg(strstr(err.msg, "head_dim 96") != NULL, "message: %s", err.msg);
    bad = lay.l;
    bad.block = 3;
    ck_assert_int_eq(mkv_cuda_mosaic_upload(&bad, &cache, &err), MKV_EUNSUP);
    ck_assert_msg(strstr(err.msg, "block of 3") != NULL, "message: %s", err.msg);
    /* overlapping record parts */
    mkv_packed_seg seg0 = lay.segs[0];
    lay.segs[0].vval_off = lay.segs[0].kmask_off;
    ck_assert_int_eq(mkv_cuda_mosaic_upload(&lay.l, &cache, &err), MKV_EUSAGE);
    ck_assert_ptr_null(cache);
    lay.segs[0] = seg0;

    ck_assert_int_eq(mkv_cuda_mosaic_upload(&lay.l, &cache, &err), MKV_OK);
    int32_t heads[1] = {0};
    int64_t pos[1] = {600};   /* past the cache */
    mkv_packed_params pp = {1, 1, 4, 0, 0.1, 0};
    mkv_packed_plan *plan = NULL;
    ck_assert_int_eq(mkv_cuda_mosaic_plan(cache, &pp, heads, pos, &plan, &err), MKV_EUSAGE);
    ck_assert_msg(strstr(err.msg, "position 600") != NULL, "message: %s", err.msg);
    pos[0] = 599;
    pp.n_heads = 16;   /* 16 query heads per KV head */
    ck_assert_int_eq(mkv_cuda_mosaic_plan(cache, &pp, heads, pos, &plan, &err), MKV_EUNSUP);
    ck_assert_msg(strstr(err.msg, "16 query heads per KV head") != NULL, "message: %s", err.msg);
    ck_assert_ptr_null(plan);
    pp.n_heads = 4;
    pp.blockkey_bits = 12;
    ck_assert_int_eq(mkv_cuda_mosaic_plan(cache, &pp, heads, pos, &plan, &err), MKV_EUSAGE);
    ck_assert_msg(strstr(err.msg, "12 bits") != NULL, "message: %s", err.msg);
    pp.blockkey_bits = 8;   /* before mkv_cuda_mosaic_blockkeys8 made them */
    ck_assert_int_eq(mkv_cuda_mosaic_plan(cache, &pp, heads, pos, &plan, &err), MKV_EUSAGE);
    ck_assert_msg(strstr(err.msg, "8-bit block keys") != NULL, "message: %s", err.msg);
    ck_assert_ptr_null(plan);
    ck_assert_int_eq(mkv_cuda_mosaic_blockkeys8(NULL, &err), MKV_EUSAGE);
    ck_assert_int_eq(mkv_cuda_mosaic_blockkeys8(cache, &err), MKV_OK);
    ck_assert_int_eq(mkv_cuda_mosaic_plan(cache, &pp, heads, pos, &plan, &err), MKV_OK);
    mkv_cuda_mosaic_plan_free(plan);
    plan = NULL;
    pp.blockkey_bits = 0;
    ck_assert_int_eq(mkv_cuda_mosaic_plan(cache, &pp, heads, pos, &plan, &err), MKV_OK);
    /* no temporary region to append to */
    float *dk = dalloc(sizeof(float) * 64);
    ck_assert_int_eq(mkv_cuda_mosaic_append(cache, 0, dk, dk, 1, NULL, &err), MKV_EUSAGE);
    mkv_cuda_free(dk);
    mkv_cuda_mosaic_plan_free(plan);
    mkv_cuda_mosaic_free(cache);
    mkv_gpu_layout_free(&lay);
    mkv_mosaic_head_free(&h);
    free_head_data(&hd);
}
END_TEST

static Suite *packed_suite(void)
{
    Suite *s = suite_create("gpu_packed");
    TCase *tc = tcase_create("attention");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_shapes);
    tcase_add_test(tc, test_strategies);
    tcase_add_test(tc, test_full_budget);
    tcase_add_test(tc, test_ties);
    tcase_add_test(tc, test_long_heads);
    tcase_add_test(tc, test_temporary_region);
    tcase_add_test(tc, test_blockkeys8);
    tcase_add_test(tc, test_grow_blockkeys8);
    suite_add_tcase(s, tc);
    tc = tcase_create("encode");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_encode);
    tcase_add_test(tc, test_rotations);
    suite_add_tcase(s, tc);
    return s;
}

/* ------------------------------------------------------------------- main */

static int check_clean_failure(mkv_status want)
{
    mkv_error err = {0};
    mkv_packed_head hd = {10, 0, 4, 6, 0, 0, 0, 0};
    uint16_t dense[10 * 64] = {0};
    mkv_packed_layout l = {0};
    l.head_dim = 64;
    l.block = 8;
    l.n_heads = 1;
    l.heads = &hd;
    l.n_dense_rows = 10;
    l.dense_k = l.dense_v = dense;
    mkv_packed_cache *c = (mkv_packed_cache *)&l;   /* must be reset to NULL */
    int rc = mkv_cuda_mosaic_upload(&l, &c, &err);
    if (rc != (int)want || err.msg[0] == '\0' || c != NULL) {
        fprintf(stderr, "check_gpu_packed: FAIL: upload without a GPU returned %d '%s', want %d\n", rc, err.msg,
                (int)want);
        return 1;
    }
    err.msg[0] = '\0';
    rc = mkv_cuda_mosaic_blockkeys8(NULL, &err);
    if (rc == MKV_OK || err.msg[0] == '\0') {
        fprintf(stderr, "check_gpu_packed: FAIL: 8-bit block keys of no cache returned %d '%s'\n", rc, err.msg);
        return 1;
    }
    return 0;
}

int main(void)
{
    seed = gpu_test_seed("check_gpu_packed");
    mkv_rng_seed(&rng, seed);
    quick = gpu_test_quick();
    return gpu_test_main("check_gpu_packed", packed_suite, check_clean_failure);
}
