/* MosaicKV pieces: see packed.h for the conventions (rotation layout,
 * bitmap bit order, value order, block keys) and lib/mosaic/method.c for
 * how they make the method. */
#include "config.h"
#include "mosaic/mosaic.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/blas.h"
#include "core/eigen.h"
#include "core/half.h"
#include "core/tensor.h"
#include "methods/baseline.h"

#define F16_MAX 65504.0

/* Doubles of rows converted per BLAS call in mkv_mosaic_rotate (on the stack). */
#define ROTATE_CHUNK_DOUBLES 8192

static double f16r(double x) { return (double)mkv_f16_to_f32(mkv_f32_to_f16((float)x)); }

/* ---------------------------------------------------------------- rotation */

int mkv_mosaic_rotation_from_gram(const double *C, int d, double *R, double *evals, mkv_error *err)
{
    return mkv_eigh(C, d, evals, R, err);
}

void mkv_mosaic_round_f16(double *R, size_t n)
{
    for (size_t i = 0; i < n; i++)
        R[i] = f16r(R[i]);
}

int mkv_mosaic_rotation(const float *X, int64_t n, int d, double *R, double *evals, mkv_error *err)
{
    double *C = mkv_calloc((size_t)d * (size_t)d, sizeof *C, "a segment's Gram matrix", err);
    if (!C)
        return err ? err->code : MKV_ENOMEM;
    int rc = mkv_gram_add(C, X, n, d, err);
    if (rc == MKV_OK)
        rc = mkv_mosaic_rotation_from_gram(C, d, R, evals, err);
    mkv_free(C);
    return rc;
}

int mkv_mosaic_dprime_for_energy(const double *evals, int d, double energy, int r)
{
    double total = 0;
    for (int i = 0; i < d; i++)
        total += evals[i] > 0 ? evals[i] : 0;
    int k = d;
    if (total > 0) {
        /* relative slack so that energy = 1 is reached despite rounding */
        double want = energy * total * (1 - 1e-12), cum = 0;
        for (int i = 0; i < d; i++) {
            cum += evals[i] > 0 ? evals[i] : 0;
            if (cum >= want) {
                k = i + 1;
                break;
            }
        }
    }
    if (k < r)
        k = r;
    k = (k + 7) / 8 * 8;
    return k > d ? d : k;
}

int mkv_mosaic_dprime_of_fraction(double fraction, int d, int r, int g)
{
    int dp = (int)ceil(fraction * d - 1e-9);
    dp = dp < r ? r : dp;
    dp = (dp + g - 1) / g * g;
    return dp > d ? d : dp;
}

void mkv_mosaic_rotate(const float *X, int64_t n, int d, const double *R, int ldr, int dprime,
                       double *out)
{
    if (!R) {
        for (int64_t t = 0; t < n; t++)
            for (int c = 0; c < dprime; c++)
                out[t * dprime + c] = X[t * d + c];
        return;
    }
    double buf[ROTATE_CHUNK_DOUBLES];
    /* rows per chunk so that their double copy fits buf (d <= MKV_MOSAIC_MAX_D) */
    int64_t rows_per = ROTATE_CHUNK_DOUBLES / d;
    for (int64_t t0 = 0; t0 < n; t0 += rows_per) {
        int rows = (int)(n - t0 < rows_per ? n - t0 : rows_per);
        for (size_t i = 0; i < (size_t)rows * (size_t)d; i++)
            buf[i] = X[(size_t)t0 * (size_t)d + i];
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, dprime, d, 1.0, buf, d, R, ldr,
                    0.0, out + t0 * dprime, dprime);
    }
}

/* ---------------------------------------------------------------- selection */

typedef struct {
    double e;   /* group energy */
    int i;      /* group index */
} group;

/* a is kept before b: more energy, or the lower group on a tie. */
static int before(const group *a, const group *b)
{
    /* no short-circuit: branch-free in the sort's inner loop */
    return (a->e > b->e) | ((a->e == b->e) & (a->i < b->i));
}

/* Stable bottom-up merge sort, best group first (deterministic, no
 * allocation: n <= MKV_MOSAIC_MAX_D). */
static void sort_groups(group *a, int n)
{
    group tmp[MKV_MOSAIC_MAX_D], *src = a, *dst = tmp;
    for (int width = 1; width < n; width *= 2) {
        for (int lo = 0; lo < n; lo += 2 * width) {
            int mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            int i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int take_j = before(&src[j], &src[i]);
                dst[k++] = *(take_j ? &src[j] : &src[i]);
                j += take_j;
                i += !take_j;
            }
            while (i < mid)
                dst[k++] = src[i++];
            while (j < hi)
                dst[k++] = src[j++];
        }
        group *t = src;
        src = dst;
        dst = t;
    }
    if (src != a)
        memcpy(a, src, sizeof *a * (size_t)n);
}

/* Group energies of the first ng groups of g channels of xt, sorted best first. */
static void ranked_groups(const double *xt, int ng, int g, group *out)
{
    for (int i = 0; i < ng; i++) {
        double e = 0;
        for (int c = i * g; c < i * g + g; c++)
            e += xt[c] * xt[c];
        out[i].e = e;
        out[i].i = i;
    }
    sort_groups(out, ng);
}

double mkv_mosaic_select(const double *xt, const mkv_mosaic_strategy *s, int *pos, uint8_t *bitmap)
{
    double kept = 0;
    int nbytes = mkv_mosaic_bitmap_bytes(s);
    if (nbytes == 0) {
        for (int c = 0; c < s->r; c++) {
            pos[c] = c;
            kept += xt[c] * xt[c];
        }
        return kept;
    }
    int g = s->g, ng = s->dprime / g, k = s->r / g;
    group grp[MKV_MOSAIC_MAX_D];
    ranked_groups(xt, ng, g, grp);
    uint8_t bits[MKV_MOSAIC_MAX_D / 8] = {0};
    for (int j = 0; j < k; j++) {
        bits[grp[j].i >> 3] |= (uint8_t)(1u << (grp[j].i & 7));
        kept += grp[j].e;
    }
    if (bitmap)
        memcpy(bitmap, bits, (size_t)nbytes);
    mkv_mosaic_positions(bits, s, pos);
    return kept;
}

int mkv_mosaic_positions(const uint8_t *bitmap, const mkv_mosaic_strategy *s, int *pos)
{
    if (mkv_mosaic_bitmap_bytes(s) == 0) {
        for (int c = 0; c < s->r; c++)
            pos[c] = c;
        return s->r;
    }
    int n = 0, g = s->g, ng = s->dprime / g, bytes = (ng + 7) / 8;
    /* 64 bits at a time, lowest set bit first: bit i is bit i & 7 of byte i >> 3 */
    for (int w0 = 0; w0 < bytes && n < s->r; w0 += 8) {
        uint64_t word = 0;
        for (int b = 0; b < 8 && w0 + b < bytes; b++)
            word |= (uint64_t)bitmap[w0 + b] << (8 * b);
        while (word && n < s->r) {
            int i = 8 * w0 + __builtin_ctzll(word);
            word &= word - 1;
            if (i >= ng)
                return n;
            for (int c = 0; c < g; c++)
                pos[n++] = i * g + c;
        }
    }
    return n;
}

void mkv_mosaic_block_keys(const double *xt, int64_t n, int ldx, int keydim, int bound, int B, float *out)
{
    int64_t nb = mkv_mosaic_nblocks(n, B);
    int w = keydim + bound;
    for (int64_t b = 0; b < nb; b++) {
        int64_t t0 = b * B, t1 = t0 + B < n ? t0 + B : n;
        float *row = out + b * w;
        for (int c = 0; c < keydim; c++) {
            double sum = 0, lo = INFINITY, hi = -INFINITY;
            for (int64_t t = t0; t < t1; t++) {
                double x = xt[t * ldx + c];
                sum += x;
                lo = x < lo ? x : lo;
                hi = x > hi ? x : hi;
            }
            if (c < bound) {
                row[c] = (float)f16r(lo);
                row[bound + c] = (float)f16r(hi);
            } else {
                row[bound + c] = (float)f16r(sum / (double)(t1 - t0));
            }
        }
    }
}

double mkv_mosaic_block_score(const double *qt, const float *row, int keydim, int bound)
{
    double s = 0;
    for (int c = 0; c < bound; c++) {
        double a = qt[c] * row[c], b = qt[c] * row[bound + c];
        s += a > b ? a : b;
    }
    for (int c = bound; c < keydim; c++)
        s += qt[c] * row[bound + c];
    return s;
}

static void block_scores4_scalar(const double *q4, const uint16_t *rows, int64_t n, int keydim, int bound,
                                 double *out)
{
    int w = keydim + bound;
    float row[2 * MKV_MOSAIC_MAX_D];
    for (int64_t b = 0; b < n; b++) {
        mkv_f16_to_f32_n(rows + b * w, row, (size_t)w);
        for (int l = 0; l < 4; l++) {
            double s = 0;
            for (int c = 0; c < bound; c++) {
                double a = q4[4 * c + l] * row[c], e = q4[4 * c + l] * row[bound + c];
                s += a > e ? a : e;
            }
            for (int c = bound; c < keydim; c++)
                s += q4[4 * c + l] * row[bound + c];
            out[4 * b + l] = s;
        }
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
/* The four queries in the lanes of a vector, four rows at a time (their
 * fp16 values converted by F16C, exactly); each lane multiplies, takes the
 * larger (_mm256_max_pd(a, e) is a > e ? a : e) and adds as the scalar
 * form does. */
__attribute__((target("avx2,f16c"))) static void block_scores4_avx2(const double *q4, const uint16_t *rows,
                                                                  int64_t n, int keydim, int bound, double *out)
{
    int w = keydim + bound;
    float four[4 * 2 * MKV_MOSAIC_MAX_D];
    int64_t b = 0;
    for (; b + 4 <= n; b += 4) {
        const uint16_t *h = rows + b * w;
        int i = 0;
        for (; i + 8 <= 4 * w; i += 8)
            _mm256_storeu_ps(four + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
        for (; i < 4 * w; i++)
            four[i] = mkv_f16_to_f32(h[i]);
        const float *r0 = four, *r1 = r0 + w, *r2 = r1 + w, *r3 = r2 + w;
        __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
        for (int c = 0; c < bound; c++) {
            __m256d q = _mm256_loadu_pd(q4 + 4 * c);
#define BOUND_TERM(s, r)                                                                                   \
    s = _mm256_add_pd(s, _mm256_max_pd(_mm256_mul_pd(q, _mm256_set1_pd(r[c])),                              \
                                       _mm256_mul_pd(q, _mm256_set1_pd(r[bound + c]))))
            BOUND_TERM(s0, r0);
            BOUND_TERM(s1, r1);
            BOUND_TERM(s2, r2);
            BOUND_TERM(s3, r3);
#undef BOUND_TERM
        }
        for (int c = bound; c < keydim; c++) {
            __m256d q = _mm256_loadu_pd(q4 + 4 * c);
            s0 = _mm256_add_pd(s0, _mm256_mul_pd(q, _mm256_set1_pd(r0[bound + c])));
            s1 = _mm256_add_pd(s1, _mm256_mul_pd(q, _mm256_set1_pd(r1[bound + c])));
            s2 = _mm256_add_pd(s2, _mm256_mul_pd(q, _mm256_set1_pd(r2[bound + c])));
            s3 = _mm256_add_pd(s3, _mm256_mul_pd(q, _mm256_set1_pd(r3[bound + c])));
        }
        _mm256_storeu_pd(out + 4 * b, s0);
        _mm256_storeu_pd(out + 4 * b + 4, s1);
        _mm256_storeu_pd(out + 4 * b + 8, s2);
        _mm256_storeu_pd(out + 4 * b + 12, s3);
    }
    if (b < n)
        block_scores4_scalar(q4, rows + b * w, n - b, keydim, bound, out + 4 * b);
}

static int have_avx2(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c"); }
#endif

void mkv_mosaic_block_scores4(const double *q4, const uint16_t *rows, int64_t n, int keydim, int bound, double *out)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (have_avx2()) {
        block_scores4_avx2(q4, rows, n, keydim, bound, out);
        return;
    }
#endif
    block_scores4_scalar(q4, rows, n, keydim, bound, out);
}

void mkv_mosaic_channel_qparams(const double *xt, int64_t n, int ldx, int nc, int bits, int qgroup,
                                float *qparams)
{
    int64_t per = qgroup > 0 ? qgroup : (n > 0 ? n : 1);
    for (int64_t t0 = 0, grp = 0; t0 < n; t0 += per, grp++) {
        int64_t t1 = t0 + per < n ? t0 + per : n;
        float *qp = qparams + 2 * grp * nc;
        for (int c = 0; c < nc; c++) {
            double mn = t1 > t0 ? xt[t0 * ldx + c] : 0, mx = mn;
            for (int64_t t = t0 + 1; t < t1; t++) {
                double x = xt[t * ldx + c];
                mn = x < mn ? x : mn;
                mx = x > mx ? x : mx;
            }
            /* float bounds rounded outwards, so the range holds the double values */
            float lo = (float)mn, hi = (float)mx;
            lo = (double)lo > mn ? nextafterf(lo, -INFINITY) : lo;
            hi = (double)hi < mx ? nextafterf(hi, INFINITY) : hi;
            mkv_bl_quant_range(lo, hi, bits, &qp[2 * c + 1], &qp[2 * c]);
        }
    }
}

int mkv_mosaic_encode(const mkv_mosaic_strategy *s, const float *X, int d, const double *R, int block,
                      uint16_t *values, uint8_t *bitmap, uint8_t *codes, uint16_t *qparams, uint16_t *blockkeys,
                      uint16_t *rotation, mkv_error *err)
{
    /* rotated channels the values and the block keys need */
    int dp = s->dprime, nbytes = mkv_mosaic_bitmap_bytes(s), vb = mkv_mosaic_vector_bytes(s);
    int w = block > 0 && s->keydim > dp ? s->keydim : dp;
    size_t nq = (size_t)mkv_mosaic_qparam_count(s);
    size_t nk = block > 0 ? (size_t)mkv_mosaic_nblocks(s->len, block) * (size_t)mkv_mosaic_block_width(s) : 0;
    /* zeros, steps and block keys are made in float (fp16 values), then stored as fp16 */
    double *xt = mkv_alloc((size_t)s->len * (size_t)w, sizeof *xt, "rotated vectors", err);
    float *fq = xt ? mkv_alloc(nq + nk + 1, sizeof *fq, "zeros, steps and block keys", err) : NULL;
    if (!fq) {
        mkv_free(xt);
        return err ? err->code : MKV_ENOMEM;
    }
    float *fk = fq + nq;
    mkv_mosaic_rotate(X, s->len, d, s->rotate ? R : NULL, d, w, xt);
    if (s->bits != 16)
        mkv_mosaic_channel_qparams(xt, s->len, w, dp, s->bits, s->qgroup, fq);
    int pos[MKV_MOSAIC_MAX_D];
    uint8_t code[MKV_MOSAIC_MAX_D];
    int rc = MKV_OK;
    for (int64_t t = 0; t < s->len && rc == MKV_OK; t++) {
        const double *x = xt + t * w;
        mkv_mosaic_select(x, s, pos, nbytes ? bitmap + t * nbytes : NULL);
        for (int i = 0; i < s->r; i++) {
            if (!(fabs(x[pos[i]]) <= F16_MAX)) {
                rc = mkv_fail(err, MKV_EFORMAT, "token %lld: rotated value %g does not fit "
                              "float16 (|x| <= 65504)", (long long)(s->start + t), x[pos[i]]);
                break;
            }
            if (s->bits == 16) {
                values[t * s->r + i] = mkv_f32_to_f16((float)f16r(x[pos[i]]));
                continue;
            }
            const float *gq = fq + 2 * mkv_mosaic_qgroup_of(s, t) * dp;
            const float zero = gq[2 * pos[i]], step = gq[2 * pos[i] + 1];
            code[i] = (uint8_t)mkv_bl_quant_code((float)x[pos[i]], step, zero, s->bits);
        }
        if (s->bits != 16)
            mkv_bl_pack(code, (size_t)s->r, s->bits, codes + t * vb);
    }
    if (rc == MKV_OK && s->bits != 16)
        mkv_f32_to_f16_n(fq, qparams, nq);
    if (rc == MKV_OK && block > 0) {
        mkv_mosaic_block_keys(xt, s->len, w, s->keydim, s->bound, block, fk);
        mkv_f32_to_f16_n(fk, blockkeys, nk);
    }
    int cols = mkv_mosaic_rotation_cols(s);
    for (int j = 0; j < d && s->rotate && rc == MKV_OK; j++)
        for (int c = 0; c < cols; c++)
            rotation[j * cols + c] = mkv_f32_to_f16((float)R[j * d + c]);
    mkv_free(xt);
    mkv_free(fq);
    return rc;
}

/* ---------------------------------------------------------------- losses */

/* The candidate grid (mkv_mosaic_candidates). */
#define N_GROUP_SIZES 3
#define N_R_FRACTIONS 16
#define N_DPRIME_FRACTIONS 4
#define N_BIT_WIDTHS 4
/* storage forms: each bit width with zeros and steps over the segment,
 * then the quantized ones over token groups */
#define N_FORMS (2 * N_BIT_WIDTHS)
#define MAX_CANDIDATES (2 * N_GROUP_SIZES * N_DPRIME_FRACTIONS * N_R_FRACTIONS * N_FORMS)
static const int group_sizes[N_GROUP_SIZES] = {1, 2, 4};
static const int bit_widths[N_BIT_WIDTHS] = {16, 8, 4, 2};
static const double r_fractions[N_R_FRACTIONS] = {1.0 / 32, 2.0 / 32,  3.0 / 32,  4.0 / 32,
                                                  5.0 / 32, 6.0 / 32,  7.0 / 32,  8.0 / 32,
                                                  10.0 / 32, 12.0 / 32, 14.0 / 32, 16.0 / 32,
                                                  20.0 / 32, 24.0 / 32, 28.0 / 32, 1.0};
static const double dprime_fractions[N_DPRIME_FRACTIONS] = {0.25, 0.5, 0.75, 1.0};

static int group_index(int g)
{
    int gi = 0;
    while (gi < N_GROUP_SIZES - 1 && group_sizes[gi] != g)
        gi++;
    return gi;
}

static int bits_index(int bits)
{
    int bi = 0;
    while (bi < N_BIT_WIDTHS - 1 && bit_widths[bi] != bits)
        bi++;
    return bi;
}

static int form_index(const mkv_mosaic_strategy *s) { return bits_index(s->bits) + (s->qgroup ? N_BIT_WIDTHS : 0); }

/* One segment seen in one space (rotated by R, or raw): its vectors, the
 * observation queries in that space and, per group size, the ranking of
 * every vector's groups, which every candidate of the space shares (a
 * candidate with d' keeps the first r/g of them that lie within d'). */
typedef struct {
    int64_t n;
    int d;
    const double *R;                  /* d x d, NULL: raw */
    double *xt;                       /* [n][d] */
    double etotal;                    /* sum of xt^2 */
    double *qt;                       /* [nq][d] observation queries, NULL without */
    int rank_d;                       /* channels the rankings cover: the widest d' of the candidates */
    uint16_t *rank[N_GROUP_SIZES];    /* [n][rank_ng] group indices, best first; on first need */
    int rank_ng[N_GROUP_SIZES];       /* groups ranked: those of the first rank_d channels */
    int qgroup;                       /* tokens per zero/step group of the grouped forms */
    float *stored;                    /* [n][d] xt as attention reads it back in form stored_fi
                                         (fp16-rounded or dequantized, exact in float); one form
                                         at a time, the candidates asking for them in order */
    int stored_fi;                    /* the form held, while stored is set */
    /* with observation queries: */
    int64_t nu;                       /* distinct tokens the queries attend */
    int32_t *utok;                    /* [nu] those tokens */
    int32_t *prow;                    /* [pairs] the row of utok each pair's token is */
    int *pcache;                      /* [nu][d] kept channels of those tokens (one strategy) */
} seg_space;

static void seg_space_free(seg_space *v)
{
    mkv_free(v->xt);
    mkv_free(v->qt);
    for (int i = 0; i < N_GROUP_SIZES; i++)
        mkv_free(v->rank[i]);
    mkv_free(v->stored);
    mkv_free(v->utok);
    mkv_free(v->prow);
    mkv_free(v->pcache);
    memset(v, 0, sizeof *v);
}

static int seg_space_init(seg_space *v, const float *X, int64_t n, int d, const double *R,
                          const mkv_mosaic_segobs *obs, mkv_error *err)
{
    memset(v, 0, sizeof *v);
    v->n = n;
    v->d = d;
    v->R = R;
    v->xt = mkv_alloc((size_t)n * (size_t)d, sizeof *v->xt, "rotated vectors", err);
    if (!v->xt)
        return err ? err->code : MKV_ENOMEM;
    mkv_mosaic_rotate(X, n, d, R, d, d, v->xt);
    for (size_t i = 0; i < (size_t)n * (size_t)d; i++)
        v->etotal += v->xt[i] * v->xt[i];
    if (!obs || obs->nq == 0)
        return MKV_OK;
    int64_t npairs = obs->first[obs->nq];
    if (!(v->qt = mkv_alloc((size_t)obs->nq * (size_t)d, sizeof *v->qt, "rotated queries", err)) ||
        !(v->utok = mkv_alloc((size_t)n, sizeof *v->utok, "attended tokens", err)) ||
        !(v->prow = mkv_alloc((size_t)(npairs ? npairs : 1), sizeof *v->prow, "attended tokens", err))) {
        seg_space_free(v);
        return err ? err->code : MKV_ENOMEM;
    }
    /* rows of the distinct attended tokens (utok doubles as the map
     * token -> row while it is built) */
    for (int64_t t = 0; t < n; t++)
        v->utok[t] = -1;
    for (int64_t i = 0; i < npairs; i++)
        v->utok[obs->tok[i]] = 0;
    for (int64_t t = 0; t < n; t++)
        if (v->utok[t] == 0)
            v->utok[t] = (int32_t)v->nu++;
    for (int64_t i = 0; i < npairs; i++)
        v->prow[i] = v->utok[obs->tok[i]];
    for (int64_t t = 0; t < n; t++)
        if (v->utok[t] >= 0)
            v->utok[v->utok[t]] = (int32_t)t;   /* rows are numbered in token order: row <= t */
    if (!(v->pcache = mkv_alloc((size_t)(v->nu ? v->nu : 1) * (size_t)d, sizeof *v->pcache, "kept channels",
                                err))) {
        seg_space_free(v);
        return err ? err->code : MKV_ENOMEM;
    }
    for (int64_t j = 0; j < obs->nq; j++)
        for (int c = 0; c < d; c++) {
            double s = 0;
            if (R)
                for (int i = 0; i < d; i++)
                    s += obs->q[j * d + i] * R[i * d + c];
            else
                s = obs->q[j * d + c];
            v->qt[j * d + c] = s;
        }
    return MKV_OK;
}

/* The group ranking of group size g (index gi), computed once.  Only the
 * groups within the first rank_d channels are ranked: a candidate keeps
 * none beyond its d', and the ranking of a subset is the subset of the
 * ranking (one strict order), so every candidate sees the same kept set. */
static const uint16_t *space_rank(seg_space *v, int gi, mkv_error *err)
{
    if (v->rank[gi])
        return v->rank[gi];
    int g = group_sizes[gi], ng = (v->rank_d + g - 1) / g;
    if (ng > v->d / g)
        ng = v->d / g;
    v->rank_ng[gi] = ng;
    uint16_t *rank = mkv_alloc((size_t)v->n * (size_t)ng, sizeof *rank, "group rankings", err);
    if (!rank)
        return NULL;
    group grp[MKV_MOSAIC_MAX_D];
    for (int64_t t = 0; t < v->n; t++) {
        ranked_groups(v->xt + t * v->d, ng, g, grp);
        for (int j = 0; j < ng; j++)
            rank[t * ng + j] = (uint16_t)grp[j].i;
    }
    v->rank[gi] = rank;
    return rank;
}

/* The vectors as stored in form fi: fp16 values (16 bits) or the
 * dequantized codes of per-channel zeros and steps over the whole segment
 * or over its token groups (mkv_mosaic_encode's, channel by channel, so
 * the same for every d'). */
static const float *space_stored(seg_space *v, int fi, mkv_error *err)
{
    if (v->stored && v->stored_fi == fi)
        return v->stored;
    mkv_free(v->stored);
    v->stored = NULL;
    int bits = bit_widths[fi % N_BIT_WIDTHS], qgroup = fi >= N_BIT_WIDTHS ? v->qgroup : 0;
    int64_t per = qgroup ? qgroup : v->n, ngroups = (v->n + per - 1) / per;
    size_t nd = (size_t)v->n * (size_t)v->d;
    float *x = mkv_alloc(nd, sizeof *x, "stored vectors", err);
    float *qp = mkv_alloc(2 * (size_t)v->d * (size_t)ngroups, sizeof *qp, "zeros and steps", err);
    if (!x || !qp) {
        mkv_free(x);
        mkv_free(qp);
        return NULL;
    }
    if (bits == 16) {
        for (size_t i = 0; i < nd; i++)
            x[i] = f16r(v->xt[i]);
    } else {
        mkv_mosaic_channel_qparams(v->xt, v->n, v->d, v->d, bits, qgroup, qp);
        for (size_t i = 0; i < nd; i++) {
            const float *gq = qp + 2 * (size_t)((int64_t)(i / (size_t)v->d) / per) * (size_t)v->d;
            const float zero = gq[2 * (i % (size_t)v->d)], step = gq[2 * (i % (size_t)v->d) + 1];
            x[i] = mkv_mosaic_dequantize(mkv_bl_quant_code((float)v->xt[i], step, zero, bits), zero, step);
        }
    }
    mkv_free(qp);
    v->stored = x;
    v->stored_fi = fi;
    return x;
}

/* Kept channels of token t under s (mkv_mosaic_select's choice, in
 * ranking order), from a space_rank table of ng groups per token. */
static int kept_positions(const uint16_t *rank, int ng, const mkv_mosaic_strategy *s, int64_t t, int *pos)
{
    if (mkv_mosaic_bitmap_bytes(s) == 0) {
        for (int c = 0; c < s->r; c++)
            pos[c] = c;
        return s->r;
    }
    int g = s->g, lim = s->dprime / g, k = s->r / g, n = 0;
    const uint16_t *rk = rank + t * ng;
    for (int j = 0; j < ng && n < k * g; j++)
        if (rk[j] < lim)
            for (int c = 0; c < g; c++)
                pos[n++] = rk[j] * g + c;
    return n;
}

/* Relative output error, minus the selection's own, averaged over the
 * observation queries, of s (keys when is_key, else values), with xs the
 * vectors in s's stored form (space_stored). */
static double output_loss(seg_space *v, const uint16_t *rank, const float *xs, const mkv_mosaic_strategy *s,
                          int is_key, const mkv_mosaic_segobs *obs)
{
    int d = v->d, r = s->r;
    double total = 0, acc[MKV_MOSAIC_MAX_D], b[MKV_MOSAIC_MAX_D];
    const int ng = v->rank_ng[group_index(s->g)];
    for (int64_t u = 0; u < v->nu; u++)
        kept_positions(rank, ng, s, v->utok[u], v->pcache + u * r);
    for (int64_t j = 0; j < obs->nq; j++) {
        const double *qt = v->qt + j * d, *ex = obs->exact + j * d;
        int64_t p0 = obs->first[j], p1 = obs->first[j + 1];
        if (p0 == p1)
            continue;   /* nothing of the segment attended: err0 */
        double l;
        if (is_key) {
            /* scores over the kept elements, added to the rest of the
             * state by an online softmax */
            l = obs->l_rest[j];
            /* an empty rest (the segment holds every selected token) must
             * not pin the maximum: kept scores far below the exact one
             * would underflow to a zero sum */
            double mx = l > 0 ? obs->m[j] : -INFINITY;
            for (int c = 0; c < d; c++)
                acc[c] = obs->acc_rest[j * d + c];
            for (int64_t i = p0; i < p1; i++) {
                const int *pos = v->pcache + (int64_t)v->prow[i] * r;
                const float *x = xs + (int64_t)obs->tok[i] * d;
                const float *val = obs->values + (int64_t)obs->tok[i] * d;
                double dot = 0;
                for (int c = 0; c < r; c++)
                    dot += qt[pos[c]] * x[pos[c]];
                double sc = dot * obs->scale;
                if (sc > mx) {
                    double f = exp(mx - sc);
                    l *= f;
                    for (int c = 0; c < d; c++)
                        acc[c] *= f;
                    mx = sc;
                }
                double w = exp(sc - mx);
                l += w;
                for (int c = 0; c < d; c++)
                    acc[c] += w * val[c];
            }
        } else {
            /* values: sum w v~ over the kept elements in the segment's
             * space, rotated back once */
            l = obs->l_rest[j];
            for (int c = 0; c < d; c++) {
                acc[c] = obs->acc_rest[j * d + c];
                b[c] = 0;
            }
            for (int64_t i = p0; i < p1; i++) {
                const int *pos = v->pcache + (int64_t)v->prow[i] * r;
                const float *x = xs + (int64_t)obs->tok[i] * d;
                l += obs->w[i];
                for (int c = 0; c < r; c++)
                    b[pos[c]] += obs->w[i] * x[pos[c]];
            }
            for (int c = 0; c < d; c++) {
                double sum = 0;
                if (v->R)
                    for (int cc = 0; cc < s->dprime; cc++)
                        sum += b[cc] * v->R[c * d + cc];
                else
                    sum = b[c];
                acc[c] += sum;
            }
        }
        double num = 0, den = 0;
        for (int c = 0; c < d; c++) {
            double o = acc[c] / l;
            num += (o - ex[c]) * (o - ex[c]);
            den += ex[c] * ex[c];
        }
        double e = den > 0 ? sqrt(num / den) : sqrt(num);
        total += e - obs->err0[j];
    }
    return total / (double)obs->nq;
}

/* Bytes and energy loss of c in space v. */
static int price_and_energy(seg_space *v, mkv_mosaic_candidate *c, int block, mkv_error *err)
{
    const uint16_t *rank = space_rank(v, group_index(c->s.g), err);
    if (!rank)
        return err ? err->code : MKV_ENOMEM;
    mkv_mosaic_bytes b;
    mkv_mosaic_strategy_bytes(&c->s, v->d, block, &b);
    c->bytes = b.total;
    int pos[MKV_MOSAIC_MAX_D];
    const int ng = v->rank_ng[group_index(c->s.g)];
    /* energy kept: sum x^2 - (x - x')^2 over the kept elements, x' as
     * stored (16 bits: the rounding to fp16 is not counted) */
    const float *xs = c->s.bits == 16 ? NULL : space_stored(v, form_index(&c->s), err);
    if (c->s.bits != 16 && !xs)
        return err ? err->code : MKV_ENOMEM;
    double kept = 0;
    for (int64_t t = 0; t < v->n; t++) {
        int np = kept_positions(rank, ng, &c->s, t, pos);
        const double *x = v->xt + t * v->d;
        const float *xq = xs ? xs + t * v->d : NULL;
        for (int i = 0; i < np; i++) {
            double e = xq ? x[pos[i]] - xq[pos[i]] : 0;
            kept += x[pos[i]] * x[pos[i]] - e * e;
        }
    }
    double loss = v->etotal > 0 ? 1 - kept / v->etotal : 0;
    c->energy = loss > 0 ? loss : 0;
    c->measured = 0;
    c->output = -1;
    return MKV_OK;
}

/* c[i] is dominated: another costs no more and drops no more energy, and
 * is better in one of the two (ties of both: the earlier one stays). */
static int dominated(const mkv_mosaic_candidate *c, int n, int i)
{
    for (int j = 0; j < n; j++) {
        if (j == i || c[j].bytes > c[i].bytes || c[j].energy > c[i].energy)
            continue;
        if (c[j].bytes < c[i].bytes || c[j].energy < c[i].energy || j < i)
            return 1;
    }
    return 0;
}

/* Prices and energies of c[0..*n); with prune, the dominated ones are
 * dropped (*n shrinks); then the output errors of the rest. */
static int evaluate_list(const mkv_mosaic_search_opts *o, const float *X, const double *R, mkv_mosaic_candidate *c,
                         int *n, int prune, mkv_error *err)
{
    seg_space sp[2];   /* raw, rotated */
    int have[2] = {0, 0}, widest[2] = {0, 0}, rc = MKV_OK;
    for (int i = 0; i < *n; i++)
        if (c[i].s.dprime > widest[c[i].s.rotate])
            widest[c[i].s.rotate] = c[i].s.dprime;
    for (int i = 0; i < *n && rc == MKV_OK; i++) {
        int rot = c[i].s.rotate;
        if (!have[rot]) {
            rc = seg_space_init(&sp[rot], X, c[i].s.len, o->d, rot ? R : NULL, o->obs, err);
            if (rc != MKV_OK)
                break;
            sp[rot].rank_d = widest[rot];
            sp[rot].qgroup = o->qgroup;
            have[rot] = 1;
        }
        rc = price_and_energy(&sp[rot], &c[i], o->block, err);
    }
    if (rc == MKV_OK && prune) {
        uint8_t drop[MAX_CANDIDATES];
        int k = 0;
        for (int i = 0; i < *n; i++)
            drop[i] = (uint8_t)dominated(c, *n, i);
        for (int i = 0; i < *n; i++)
            if (!drop[i])
                c[k++] = c[i];
        *n = k;
    }
    for (int i = 0; i < *n && rc == MKV_OK && o->obs && o->obs->nq > 0; i++) {
        seg_space *v = &sp[c[i].s.rotate];
        const uint16_t *rank = space_rank(v, group_index(c[i].s.g), err);
        const float *xs = rank ? space_stored(v, form_index(&c[i].s), err) : NULL;
        if (!xs) {
            rc = err ? err->code : MKV_ENOMEM;
            break;
        }
        c[i].measured = 1;
        c[i].output = output_loss(v, rank, xs, &c[i].s, o->block > 0, o->obs);
    }
    for (int i = 0; i < 2; i++)
        if (have[i])
            seg_space_free(&sp[i]);
    return rc;
}

double mkv_mosaic_candidate_loss(const mkv_mosaic_candidate *c) { return c->measured ? c->output : c->energy; }

int mkv_mosaic_evaluate(const mkv_mosaic_search_opts *o, const float *X, const double *R,
                        mkv_mosaic_candidate *c, int n, mkv_error *err)
{
    return evaluate_list(o, X, R, c, &n, 0, err);
}

/* ---------------------------------------------------------------- search */


/* Distinct rounded values of fractions f of d, at least 1, ascending. */
static int candidate_sizes(const double *f, int nf, int d, int *out)
{
    int n = 0;
    for (int i = 0; i < nf; i++) {
        int v = (int)lround(f[i] * d);
        if (v < 1)
            v = 1;
        if (n == 0 || out[n - 1] != v)
            out[n++] = v;
    }
    return n;
}

int mkv_mosaic_candidates(const mkv_mosaic_search_opts *o, const float *X, int64_t start, int64_t len,
                          const double *R, mkv_mosaic_candidate **out, int *n, mkv_error *err)
{
    int d = o->d, is_key = o->block > 0, rs[N_R_FRACTIONS], dps[N_DPRIME_FRACTIONS];
    int nr = candidate_sizes(r_fractions, N_R_FRACTIONS, d, rs);
    int ndp = candidate_sizes(dprime_fractions, N_DPRIME_FRACTIONS, d, dps);
    mkv_mosaic_candidate *c = mkv_alloc(MAX_CANDIDATES, sizeof *c, "strategy candidates", err);
    if (!c)
        return err ? err->code : MKV_ENOMEM;
    int k = 0;
    for (int rot = 1; rot >= 0; rot--) {
        /* keys of a rotatable segment are rotated (their block keys live
         * there); values try both */
        if ((rot && !o->allow_rotate) || (!rot && is_key && o->allow_rotate))
            continue;
        for (int fi = 0; fi < (o->quantize ? N_FORMS : 1); fi++)
            for (int gi = 0; gi < N_GROUP_SIZES; gi++)
                for (int di = 0; di < (rot ? ndp : 1); di++)
                    for (int ri = 0; ri < nr; ri++) {
                        int g = group_sizes[gi], dp = rot ? dps[di] : d, r = rs[ri];
                        int bits = bit_widths[fi % N_BIT_WIDTHS], qgroup = fi >= N_BIT_WIDTHS ? o->qgroup : 0;
                        if (r % g || dp % g || r > dp || (fi >= N_BIT_WIDTHS && (bits == 16 || qgroup <= 0 ||
                                                                                  qgroup >= len)))
                            continue;
                        c[k++].s = (mkv_mosaic_strategy){
                            .start = start, .len = len, .rotate = rot, .r = r, .g = g, .dprime = dp,
                            .pervector = 1, .bits = bits, .qgroup = qgroup,
                            .keydim = is_key ? (rot ? o->keydim : d) : 0,
                            .bound = is_key && rot ? o->bound : 0};
                    }
    }
    int rc = k ? evaluate_list(o, X, R, c, &k, 1, err)
               : mkv_fail(err, MKV_EUSAGE, "no strategy candidate fits head_dim %d", d);
    if (rc != MKV_OK) {
        mkv_free(c);
        return rc;
    }
    *out = c;
    *n = k;
    return MKV_OK;
}

int mkv_mosaic_pick(const mkv_mosaic_candidate *c, int n, double threshold)
{
    int pick = -1;
    for (int i = 0; i < n; i++) {
        double l = mkv_mosaic_candidate_loss(&c[i]);
        if (l > threshold)
            continue;
        if (pick < 0 || c[i].bytes < c[pick].bytes ||
            (c[i].bytes == c[pick].bytes && l < mkv_mosaic_candidate_loss(&c[pick])))
            pick = i;
    }
    if (pick >= 0)
        return pick;
    for (int i = 0; i < n; i++) {
        double l = mkv_mosaic_candidate_loss(&c[i]), lp = pick < 0 ? 0 : mkv_mosaic_candidate_loss(&c[pick]);
        if (pick < 0 || l < lp || (l == lp && c[i].bytes < c[pick].bytes))
            pick = i;
    }
    return pick;
}

/* Choices minimising loss + price x bytes (ties: fewer bytes, then
 * earlier); returns their bytes. */
static uint64_t priced_choice(mkv_mosaic_candidate *const *cand, const int *ncand, int nitems, double price,
                              int *pick)
{
    uint64_t total = 0;
    for (int it = 0; it < nitems; it++) {
        int best = 0;
        double bv = INFINITY;
        for (int i = 0; i < ncand[it]; i++) {
            const mkv_mosaic_candidate *c = &cand[it][i];
            double v = mkv_mosaic_candidate_loss(c) + price * (double)c->bytes;
            if (v < bv || (v == bv && c->bytes < cand[it][best].bytes)) {
                best = i;
                bv = v;
            }
        }
        pick[it] = best;
        total += cand[it][best].bytes;
    }
    return total;
}

uint64_t mkv_mosaic_ratio_budget(double ratio, int64_t T, int d, int64_t nd, int64_t nseg, int has_scale)
{
    uint64_t logical = 2 * (uint64_t)T * (uint64_t)d * 2;
    uint64_t fixed = 2 * (uint64_t)nd * (uint64_t)d * 2 +
                     (uint64_t)nseg * (2 * (MKV_MOSAIC_TABLE_COLS + MKV_MOSAIC_LOSS_COLS) + MKV_MOSAIC_BLOCKDIM_COLS) * 4 +
                     (has_scale ? sizeof(float) : 0);
    uint64_t target = (uint64_t)floor((double)logical / ratio);
    return target > fixed ? target - fixed : 0;
}

void mkv_mosaic_allocate(mkv_mosaic_candidate *const *cand, const int *ncand, int nitems, uint64_t budget,
                         int *pick)
{
    uint64_t used = priced_choice(cand, ncand, nitems, 0, pick);
    if (used > budget) {
        /* a price high enough that only bytes count: the cheapest */
        double hi = 1e-12;
        while (priced_choice(cand, ncand, nitems, hi, pick) > budget && hi < 1e30)
            hi *= 4;
        double lo = hi / 4 < 1e-12 ? 0 : hi / 4;
        for (int it = 0; it < 100; it++) {
            double mid = 0.5 * (lo + hi);
            if (mid <= lo || mid >= hi)
                break;
            if (priced_choice(cand, ncand, nitems, mid, pick) > budget)
                lo = mid;
            else
                hi = mid;
        }
        used = priced_choice(cand, ncand, nitems, hi, pick);
        if (used > budget)
            return;   /* even the cheapest does not fit */
    }
    /* spend what is left: the upgrade saving the most loss per extra byte */
    for (;;) {
        int bi = -1, bc = -1;
        double best = 0;
        for (int it = 0; it < nitems; it++) {
            const mkv_mosaic_candidate *cur = &cand[it][pick[it]];
            double lcur = mkv_mosaic_candidate_loss(cur);
            for (int i = 0; i < ncand[it]; i++) {
                const mkv_mosaic_candidate *c = &cand[it][i];
                double saved = lcur - mkv_mosaic_candidate_loss(c);
                if (saved <= 0 || c->bytes > budget - used + cur->bytes)
                    continue;
                double gain = c->bytes <= cur->bytes ? INFINITY : saved / (double)(c->bytes - cur->bytes);
                if (bi < 0 || gain > best) {
                    bi = it;
                    bc = i;
                    best = gain;
                }
            }
        }
        if (bi < 0)
            break;
        used = used - cand[bi][pick[bi]].bytes + cand[bi][bc].bytes;
        pick[bi] = bc;
    }
    /* then paired changes (one item gives bytes to another) while one
     * lowers the summed loss within the budget, the largest drop first */
    for (int round = 0; round < 16 * nitems + 16; round++) {
        int bi = -1, ba = -1, bj = -1, bb = -1;
        double best = -1e-12;
        for (int i = 0; i < nitems; i++) {
            const mkv_mosaic_candidate *ci = &cand[i][pick[i]];
            for (int a = 0; a < ncand[i]; a++) {
                const mkv_mosaic_candidate *x = &cand[i][a];
                double di = mkv_mosaic_candidate_loss(x) - mkv_mosaic_candidate_loss(ci);
                uint64_t after_i = used - ci->bytes + x->bytes;
                for (int j = i + 1; j < nitems; j++) {
                    const mkv_mosaic_candidate *cj = &cand[j][pick[j]];
                    for (int b2 = 0; b2 < ncand[j]; b2++) {
                        const mkv_mosaic_candidate *y = &cand[j][b2];
                        double delta = di + mkv_mosaic_candidate_loss(y) - mkv_mosaic_candidate_loss(cj);
                        if (delta < best && after_i - cj->bytes + y->bytes <= budget) {
                            best = delta;
                            bi = i;
                            ba = a;
                            bj = j;
                            bb = b2;
                        }
                    }
                }
            }
        }
        if (bi < 0)
            break;
        used = used - cand[bi][pick[bi]].bytes + cand[bi][ba].bytes - cand[bj][pick[bj]].bytes + cand[bj][bb].bytes;
        pick[bi] = ba;
        pick[bj] = bb;
    }
}
