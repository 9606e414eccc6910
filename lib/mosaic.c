/* MosaicKV pieces: see mosaic.h for the conventions (rotation layout,
 * bitmap bit order, value order, block keys) and lib/method_mosaic.c for
 * how they make the method. */
#include "config.h"
#include "mosaic.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "eigen.h"
#include "half.h"
#include "tensor.h"

#define F16_MAX 65504.0

/* Doubles of rows converted per BLAS call in mkv_mosaic_rotate (on the stack). */
#define ROTATE_CHUNK_DOUBLES 8192

static double f16r(double x) { return (double)mkv_f16_to_f32(mkv_f32_to_f16((float)x)); }

/* ---------------------------------------------------------------- bytes */

int mkv_mosaic_bitmap_bytes(const mkv_mosaic_strategy *s)
{
    if (!s->pervector || s->r >= s->dprime)
        return 0;
    return (s->dprime / s->g + 7) / 8;
}

int64_t mkv_mosaic_nblocks(int64_t len, int B) { return (len + B - 1) / B; }

void mkv_mosaic_strategy_bytes(const mkv_mosaic_strategy *s, int d, int block, mkv_mosaic_bytes *b)
{
    uint64_t len = (uint64_t)s->len;
    b->values = len * (uint64_t)s->r * 2;
    b->bitmap = len * (uint64_t)mkv_mosaic_bitmap_bytes(s);
    b->blockkeys = block > 0 ? (uint64_t)mkv_mosaic_nblocks(s->len, block) * (uint64_t)s->dprime * 2 : 0;
    b->rotation = s->rotate ? (uint64_t)d * (uint64_t)s->dprime * 2 : 0;
    b->total = b->values + b->bitmap + b->blockkeys + b->rotation;
}

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
    int n = 0, g = s->g, ng = s->dprime / g;
    for (int i = 0; i < ng && n < s->r; i++)
        if (bitmap[i >> 3] >> (i & 7) & 1)
            for (int c = 0; c < g; c++)
                pos[n++] = i * g + c;
    return n;
}

void mkv_mosaic_block_keys(const double *xt, int64_t n, int ldx, int dprime, int B, float *out)
{
    int64_t nb = mkv_mosaic_nblocks(n, B);
    for (int64_t b = 0; b < nb; b++) {
        int64_t t0 = b * B, t1 = t0 + B < n ? t0 + B : n;
        for (int c = 0; c < dprime; c++) {
            double sum = 0;
            for (int64_t t = t0; t < t1; t++)
                sum += xt[t * ldx + c];
            out[b * dprime + c] = (float)f16r(sum / (double)(t1 - t0));
        }
    }
}

int mkv_mosaic_encode(const mkv_mosaic_strategy *s, const float *X, int d, const double *R, int block,
                      float *values, uint8_t *bitmap, float *blockkeys, float *rotation,
                      mkv_error *err)
{
    int dp = s->dprime, nbytes = mkv_mosaic_bitmap_bytes(s);
    double *xt = mkv_alloc((size_t)s->len * (size_t)dp, sizeof *xt, "rotated vectors", err);
    if (!xt)
        return err ? err->code : MKV_ENOMEM;
    mkv_mosaic_rotate(X, s->len, d, s->rotate ? R : NULL, d, dp, xt);
    int pos[MKV_MOSAIC_MAX_D];
    for (int64_t t = 0; t < s->len; t++) {
        const double *x = xt + t * dp;
        mkv_mosaic_select(x, s, pos, nbytes ? bitmap + t * nbytes : NULL);
        for (int i = 0; i < s->r; i++) {
            if (!(fabs(x[pos[i]]) <= F16_MAX)) {
                mkv_free(xt);
                return mkv_fail(err, MKV_EFORMAT, "token %lld: rotated value %g does not fit "
                                "float16 (|x| <= 65504)", (long long)(s->start + t), x[pos[i]]);
            }
            values[t * s->r + i] = (float)f16r(x[pos[i]]);
        }
    }
    if (block > 0)
        mkv_mosaic_block_keys(xt, s->len, dp, dp, block, blockkeys);
    if (s->rotate)
        for (int j = 0; j < d; j++)
            for (int c = 0; c < dp; c++)
                rotation[j * dp + c] = (float)R[j * d + c];
    mkv_free(xt);
    return MKV_OK;
}

/* ---------------------------------------------------------------- losses */

/* One segment seen in one space (rotated or raw): what every candidate's
 * losses are computed from. */
typedef struct {
    int64_t n;
    int d;
    double *xt;          /* [n][d] vectors in this space */
    double etotal;       /* sum of xt^2 */
    int64_t nq;          /* observation queries that see the segment */
    double *qt;          /* [nq][d] queries in this space */
    int64_t *qlast;      /* [nq] last token (segment-relative) each query sees */
    const double *strue; /* [nq][n] exact scores q.x (shared by both spaces) */
    const double *weight;/* [nq][n] attention weight of each score error (see exact_scores) */
    double den;          /* sum over queries of (q.x - mean)^2 over the tokens seen */
} seg_space;

static void seg_space_free(seg_space *v)
{
    mkv_free(v->xt);
    mkv_free(v->qt);
    mkv_free(v->qlast);
    memset(v, 0, sizeof *v);
}

/* Fill v for X [n][d] in the space of R (NULL: raw). Queries of obs that
 * see the segment (position >= start) are kept. */
static int seg_space_init(seg_space *v, const float *X, int64_t start, int64_t n, int d, const double *R,
                          const mkv_mosaic_obs *obs, mkv_error *err)
{
    memset(v, 0, sizeof *v);
    v->n = n;
    v->d = d;
    v->xt = mkv_alloc((size_t)n * (size_t)d, sizeof *v->xt, "rotated vectors", err);
    if (!v->xt)
        return err ? err->code : MKV_ENOMEM;
    mkv_mosaic_rotate(X, n, d, R, d, d, v->xt);
    for (size_t i = 0; i < (size_t)n * (size_t)d; i++)
        v->etotal += v->xt[i] * v->xt[i];
    int64_t nq = 0;
    for (int64_t i = 0; obs && i < obs->nq; i++)
        nq += obs->pos[i] >= start;
    if (nq == 0)
        return MKV_OK;
    v->qt = mkv_alloc((size_t)nq * (size_t)d, sizeof *v->qt, "rotated queries", err);
    v->qlast = v->qt ? mkv_alloc((size_t)nq, sizeof *v->qlast, "query positions", err) : NULL;
    float *qsel = v->qlast ? mkv_alloc((size_t)nq * (size_t)d, sizeof *qsel, "queries", err) : NULL;
    if (!qsel) {
        seg_space_free(v);
        return err ? err->code : MKV_ENOMEM;
    }
    for (int64_t i = 0, j = 0; i < obs->nq; i++)
        if (obs->pos[i] >= start) {
            memcpy(qsel + j * d, obs->q + i * d, sizeof(float) * (size_t)d);
            int64_t last = obs->pos[i] - start;
            v->qlast[j++] = last < n - 1 ? last : n - 1;
        }
    mkv_mosaic_rotate(qsel, nq, d, R, d, d, v->qt);
    mkv_free(qsel);
    v->nq = nq;
    return MKV_OK;
}

/* Exact scores q.x [nq][n] (original space), followed by [nq][n] weights
 * w = (1 + m p) / 2 of their errors, p the softmax of q.x / sqrt(d) over
 * the m tokens of the segment the query sees (sum of w over them = m: the
 * tokens the query attends count more, the others still count, as later
 * queries may attend them), and the spread that decides the softmax: the
 * sum over queries of (q.x - mean over the tokens it sees)^2. */
static int exact_scores(const float *X, int d, const seg_space *v, const double *raw_q, double **strue,
                        double *den, mkv_error *err)
{
    size_t nqn = (size_t)v->nq * (size_t)v->n;
    double *s = mkv_alloc(2 * nqn, sizeof *s, "exact scores", err);
    if (!s)
        return err ? err->code : MKV_ENOMEM;
    double total = 0, scale = 1 / sqrt((double)d);
    for (int64_t q = 0; q < v->nq; q++) {
        double mean = 0, mx = -INFINITY, z = 0;
        int64_t seen = v->qlast[q] + 1;
        double *sq = s + q * v->n, *wq = s + nqn + q * v->n;
        for (int64_t t = 0; t < seen; t++) {
            double dot = 0;
            for (int j = 0; j < d; j++)
                dot += raw_q[q * d + j] * X[t * d + j];
            sq[t] = dot;
            mean += dot;
            mx = dot > mx ? dot : mx;
        }
        mean /= (double)seen;
        for (int64_t t = 0; t < seen; t++) {
            total += (sq[t] - mean) * (sq[t] - mean);
            wq[t] = exp((sq[t] - mx) * scale);
            z += wq[t];
        }
        for (int64_t t = 0; t < seen; t++)
            wq[t] = 0.5 + 0.5 * (double)seen * wq[t] / z;
    }
    *strue = s;
    *den = total;
    return MKV_OK;
}

/* Energy dropped by s (d' <= v->d), fraction of the segment's energy. */
static double energy_loss(const seg_space *v, const mkv_mosaic_strategy *s)
{
    if (v->etotal <= 0)
        return 0;
    int pos[MKV_MOSAIC_MAX_D];
    double kept = 0;
    for (int64_t t = 0; t < v->n; t++)
        kept += mkv_mosaic_select(v->xt + t * v->d, s, pos, NULL);
    double loss = 1 - kept / v->etotal;
    return loss > 0 ? loss : 0;
}

/* Relative score error of s on the queries of v; -1 without queries. */
static double score_loss(const seg_space *v, const mkv_mosaic_strategy *s)
{
    if (v->nq == 0)
        return -1;
    int pos[MKV_MOSAIC_MAX_D];
    double num = 0;
    for (int64_t t = 0; t < v->n; t++) {
        const double *x = v->xt + t * v->d;
        mkv_mosaic_select(x, s, pos, NULL);
        for (int64_t q = 0; q < v->nq; q++) {
            if (v->qlast[q] < t)
                continue;
            const double *qt = v->qt + q * v->d;
            double dot = 0;
            for (int i = 0; i < s->r; i++)
                dot += qt[pos[i]] * x[pos[i]];
            double e = v->strue[q * v->n + t] - dot;
            num += v->weight[q * v->n + t] * e * e;
        }
    }
    if (v->den > 0)
        return num / v->den;
    return num > 0 ? 1 : 0;
}

/* Queries of obs as double [nq'][d], those that see the segment only. */
static int raw_queries(const mkv_mosaic_obs *obs, int64_t start, int d, int64_t nq, double **out,
                       mkv_error *err)
{
    double *q = mkv_alloc((size_t)nq * (size_t)d, sizeof *q, "queries", err);
    if (!q)
        return err ? err->code : MKV_ENOMEM;
    for (int64_t i = 0, j = 0; i < obs->nq; i++)
        if (obs->pos[i] >= start) {
            for (int c = 0; c < d; c++)
                q[j * d + c] = obs->q[i * d + c];
            j++;
        }
    *out = q;
    return MKV_OK;
}

/* Space of R (or raw) with exact scores attached; strue is owned by the
 * caller (shared between spaces). */
static int make_space(seg_space *v, const float *X, int64_t start, int64_t n, int d, const double *R,
                      const mkv_mosaic_obs *obs, double **strue, double *den, mkv_error *err)
{
    int rc = seg_space_init(v, X, start, n, d, R, obs, err);
    if (rc != MKV_OK || v->nq == 0)
        return rc;
    if (!*strue) {
        double *raw_q = NULL;
        rc = raw_queries(obs, start, d, v->nq, &raw_q, err);
        if (rc == MKV_OK)
            rc = exact_scores(X, d, v, raw_q, strue, den, err);
        mkv_free(raw_q);
        if (rc != MKV_OK) {
            seg_space_free(v);
            return rc;
        }
    }
    v->strue = *strue;
    v->weight = *strue + (size_t)v->nq * (size_t)v->n;
    v->den = *den;
    return MKV_OK;
}

int mkv_mosaic_losses(const mkv_mosaic_strategy *s, const float *X, int d, const double *R,
                      const mkv_mosaic_obs *obs, double *energy, double *score, mkv_error *err)
{
    seg_space v;
    double *strue = NULL, den = 0;
    int rc = make_space(&v, X, s->start, s->len, d, s->rotate ? R : NULL, obs, &strue, &den, err);
    if (rc != MKV_OK)
        return rc;
    *energy = energy_loss(&v, s);
    *score = score_loss(&v, s);
    seg_space_free(&v);
    mkv_free(strue);
    return MKV_OK;
}

/* ---------------------------------------------------------------- search */

/* Candidates sharing a space, a group size and d' rank their groups the
 * same way; r only cuts the ranking. Their energy and score errors are
 * therefore computed together, for every r at once, from one ranking of
 * all d/g groups per vector and space (a d' keeps the order of its own
 * groups within it). */
typedef struct {
    const seg_space *v;
    int g, dprime;
    const uint16_t *rank;   /* [n][d/g] group indices, best first (shared per space and g) */
    double *kept;           /* [d'/g + 1] energy of the top k groups, summed over vectors */
    double *num;            /* [d'/g + 1] squared score error keeping k groups; NULL until needed */
} family;

typedef struct {
    mkv_mosaic_strategy s;
    uint64_t bytes;
    double energy;
    double score;        /* NAN until computed */
    int fam;
} candidate;

static int by_bytes(const void *a, const void *b)
{
    const candidate *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes < y->bytes ? -1 : 1;
    return (x->energy > y->energy) - (x->energy < y->energy);
}

static int by_energy(const void *a, const void *b)
{
    const candidate *x = a, *y = b;
    if (x->energy != y->energy)
        return x->energy < y->energy ? -1 : 1;
    return (x->bytes > y->bytes) - (x->bytes < y->bytes);
}

#define N_R_FRACTIONS 6
#define N_DPRIME_FRACTIONS 4
#define N_GROUP_SIZES 3
#define MAX_FAMILIES (2 * N_GROUP_SIZES * N_DPRIME_FRACTIONS)
static const double r_fractions[N_R_FRACTIONS] = {1.0 / 16, 1.0 / 8, 3.0 / 16, 1.0 / 4, 3.0 / 8, 1.0 / 2};
static const double dprime_fractions[N_DPRIME_FRACTIONS] = {0.25, 0.5, 0.75, 1.0};
static const int group_sizes[N_GROUP_SIZES] = {1, 2, 4};

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

/* rank (all d/g groups of every vector) and kept[k] of the families
 * fam[0..n) of one space and one g. */
static void family_energies(family *fam, int n, uint16_t *rank)
{
    const seg_space *v = fam[0].v;
    int g = fam[0].g, ng = v->d / g;
    group grp[MKV_MOSAIC_MAX_D];
    for (int f = 0; f < n; f++)
        memset(fam[f].kept, 0, sizeof(double) * (size_t)(fam[f].dprime / g + 1));
    for (int64_t t = 0; t < v->n; t++) {
        ranked_groups(v->xt + t * v->d, ng, g, grp);
        for (int j = 0; j < ng; j++)
            rank[t * ng + j] = (uint16_t)grp[j].i;
        for (int f = 0; f < n; f++) {
            int lim = fam[f].dprime / g, k = 0;
            double cum = 0;
            for (int j = 0; j < ng && k < lim; j++)
                if (grp[j].i < lim) {
                    cum += grp[j].e;
                    fam[f].kept[++k] += cum;
                }
        }
    }
}

/* num[k] of one family for the k = r/g its candidates use (need[k]): for
 * every query and token it sees, the score error (q.x - q~.x~ over the top
 * k groups)^2, all k in one walk of the ranking. */
static int family_scores(family *f, const uint8_t *need, mkv_error *err)
{
    const seg_space *v = f->v;
    int g = f->g, lim = f->dprime / g, ng = v->d / g, kmax = 0;
    for (int k = 1; k <= lim; k++)
        if (need[k])
            kmax = k;
    f->num = mkv_calloc((size_t)lim + 1, sizeof *f->num, "score errors", err);
    if (!f->num)
        return err ? err->code : MKV_ENOMEM;
    int order[MKV_MOSAIC_MAX_D];
    for (int64_t t = 0; t < v->n; t++) {
        const double *x = v->xt + t * v->d;
        const uint16_t *rk = f->rank + t * ng;
        for (int j = 0, k = 0; j < ng && k < kmax; j++)
            if (rk[j] < lim)
                order[k++] = rk[j];
        for (int64_t q = 0; q < v->nq; q++) {
            if (v->qlast[q] < t)
                continue;
            const double *qt = v->qt + q * v->d;
            double exact = v->strue[q * v->n + t], w = v->weight[q * v->n + t], cum = 0;
            for (int k = 0; k < kmax; k++) {
                for (int c = order[k] * g; c < order[k] * g + g; c++)
                    cum += qt[c] * x[c];
                if (need[k + 1])
                    f->num[k + 1] += w * (exact - cum) * (exact - cum);
            }
        }
    }
    return MKV_OK;
}

/* Families and candidates of one space (rotate on or off), appended. */
static int add_candidates(const seg_space *v, int rotate, int64_t start, int block, family *fam,
                          int *nfam, candidate *c, int *n, double *store, uint16_t **ranks,
                          mkv_error *err)
{
    int d = v->d, rs[N_R_FRACTIONS], dps[N_DPRIME_FRACTIONS];
    int nr = candidate_sizes(r_fractions, N_R_FRACTIONS, d, rs);
    int ndp = rotate ? candidate_sizes(dprime_fractions, N_DPRIME_FRACTIONS, d, dps) : 1;
    if (!rotate)
        dps[0] = d;
    for (int gi = 0; gi < N_GROUP_SIZES; gi++) {
        int g = group_sizes[gi], first = *nfam;
        if (d % g)
            continue;
        for (int di = 0; di < ndp; di++)
            if (dps[di] % g == 0) {
                family *f = &fam[(*nfam)++];
                *f = (family){.v = v, .g = g, .dprime = dps[di], .kept = store + (size_t)(*nfam - 1) * (d + 1)};
            }
        if (*nfam == first)
            continue;
        uint16_t *rank = mkv_alloc((size_t)v->n * (size_t)(d / g), sizeof *rank, "group rankings", err);
        if (!rank)
            return err ? err->code : MKV_ENOMEM;
        ranks[rotate * N_GROUP_SIZES + gi] = rank;
        for (int fi = first; fi < *nfam; fi++)
            fam[fi].rank = rank;
        family_energies(fam + first, *nfam - first, rank);
        for (int fi = first; fi < *nfam; fi++)
            for (int ri = 0; ri < nr; ri++) {
                int r = rs[ri], dp = fam[fi].dprime;
                if (r % g || r > dp)
                    continue;
                candidate *x = &c[(*n)++];
                x->s = (mkv_mosaic_strategy){.start = start, .len = v->n, .rotate = rotate, .r = r,
                                             .g = g, .dprime = dp, .pervector = 1};
                mkv_mosaic_bytes b;
                mkv_mosaic_strategy_bytes(&x->s, d, block, &b);
                x->bytes = b.total;
                double loss = v->etotal > 0 ? 1 - fam[fi].kept[r / g] / v->etotal : 0;
                x->energy = loss > 0 ? loss : 0;
                x->score = NAN;
                x->fam = fi;
            }
    }
    return MKV_OK;
}

/* Loss a candidate is judged by (score errors of its family computed on
 * first need, for every r of the grid); NAN when out of memory. */
static double candidate_loss(candidate *x, family *fam, mkv_error *err)
{
    family *f = &fam[x->fam];
    const seg_space *v = f->v;
    if (v->nq == 0)
        return x->energy;
    if (isnan(x->score)) {
        if (!f->num) {
            uint8_t need[MKV_MOSAIC_MAX_D + 1] = {0};
            int rs[N_R_FRACTIONS], nr = candidate_sizes(r_fractions, N_R_FRACTIONS, v->d, rs);
            for (int i = 0; i < nr; i++)
                if (rs[i] % f->g == 0 && rs[i] <= f->dprime)
                    need[rs[i] / f->g] = 1;
            if (family_scores(f, need, err) != MKV_OK)
                return NAN;
        }
        double num = f->num[x->s.r / x->s.g];
        x->score = v->den > 0 ? num / v->den : num > 0 ? 1 : 0;
    }
    return x->score > x->energy ? x->score : x->energy;
}

int mkv_mosaic_search(const mkv_mosaic_search_opts *o, const float *X, int64_t start, int64_t len,
                      const double *R, mkv_mosaic_strategy *best, double *energy, double *score,
                      mkv_error *err)
{
    int d = o->d;
    seg_space on = {0}, off = {0};
    double *strue = NULL, den = 0, *store = NULL;
    family fam[MAX_FAMILIES];
    uint16_t *ranks[2 * N_GROUP_SIZES] = {NULL};
    int nfam = 0, n = 0;
    candidate *c = NULL;
    int rc = MKV_OK;
    if (o->allow_rotate)
        rc = make_space(&on, X, start, len, d, R, o->obs, &strue, &den, err);
    if (rc == MKV_OK)
        rc = make_space(&off, X, start, len, d, NULL, o->obs, &strue, &den, err);
    if (rc == MKV_OK &&
        (!(c = mkv_alloc(MAX_FAMILIES * N_R_FRACTIONS, sizeof *c, "strategy candidates", err)) ||
         !(store = mkv_alloc((size_t)MAX_FAMILIES * (size_t)(d + 1), sizeof *store, "energy tables", err))))
        rc = err ? err->code : MKV_ENOMEM;
    if (rc == MKV_OK && o->allow_rotate)
        rc = add_candidates(&on, 1, start, o->block, fam, &nfam, c, &n, store, ranks, err);
    if (rc == MKV_OK)
        rc = add_candidates(&off, 0, start, o->block, fam, &nfam, c, &n, store, ranks, err);
    if (rc == MKV_OK && n == 0)
        rc = mkv_fail(err, MKV_EUSAGE, "no strategy candidate fits head_dim %d", d);
    int pick = -1;
    double pick_loss = INFINITY;
    if (rc == MKV_OK) {
        /* Cheapest first; within one price the lowest energy loss first.
         * The first qualifying candidate fixes the price; the others of
         * that price may still have a lower loss. */
        qsort(c, (size_t)n, sizeof *c, by_bytes);
        for (int i = 0; i < n && rc == MKV_OK; i++) {
            if (pick >= 0 && c[i].bytes > c[pick].bytes)
                break;
            if (c[i].energy > o->threshold)
                continue;
            double loss = candidate_loss(&c[i], fam, err);
            if (isnan(loss))
                rc = err ? err->code : MKV_ENOMEM;
            else if (loss <= o->threshold && loss < pick_loss) {
                pick = i;
                pick_loss = loss;
            }
        }
    }
    if (rc == MKV_OK && pick < 0) {
        /* None qualifies: the lowest loss. A candidate's loss is at least
         * its energy loss, so the walk in energy order stops once that
         * passes the best loss found. */
        qsort(c, (size_t)n, sizeof *c, by_energy);
        for (int i = 0; i < n && c[i].energy <= pick_loss && rc == MKV_OK; i++) {
            double loss = candidate_loss(&c[i], fam, err);
            if (isnan(loss))
                rc = err ? err->code : MKV_ENOMEM;
            else if (pick < 0 || loss < pick_loss || (loss == pick_loss && c[i].bytes < c[pick].bytes)) {
                pick = i;
                pick_loss = loss;
            }
        }
    }
    if (rc == MKV_OK) {
        *best = c[pick].s;
        *energy = c[pick].energy;
        *score = fam[c[pick].fam].v->nq ? c[pick].score : -1;
    }
    for (int f = 0; f < nfam; f++)
        mkv_free(fam[f].num);
    for (int i = 0; i < 2 * N_GROUP_SIZES; i++)
        mkv_free(ranks[i]);
    mkv_free(c);
    mkv_free(store);
    seg_space_free(&on);
    seg_space_free(&off);
    mkv_free(strue);
    return rc;
}

/* ---------------------------------------------------------------- head state */

int mkv_mosaic_layout(mkv_mosaic_tensor *t, int d, int block, int64_t first, int64_t last,
                      mkv_error *err)
{
    mkv_free(t->off_values);
    t->off_values = NULL;
    int64_t ns = t->nseg > 0 ? t->nseg : 1;
    int64_t *off = mkv_alloc((size_t)ns * 4, sizeof *off, "segment offsets", err);
    if (!off)
        return err ? err->code : MKV_ENOMEM;
    t->off_values = off;
    t->off_bitmap = off + ns;
    t->off_blockkeys = off + 2 * ns;
    t->off_rotation = off + 3 * ns;
    int64_t nv = 0, nb = 0, nk = 0, nr = 0, next = first;
    for (int64_t i = 0; i < t->nseg; i++) {
        const mkv_mosaic_strategy *s = &t->seg[i];
        const char *bad = NULL;
        if (s->start != next || s->len < 1 || s->start + s->len > last)
            bad = "segments do not tile the compressed tokens";
        else if (s->rotate != 0 && s->rotate != 1)
            bad = "rotate must be 0 or 1";
        else if (s->pervector != 0 && s->pervector != 1)
            bad = "pervector must be 0 or 1";
        else if (s->g != 1 && s->g != 2 && s->g != 4)
            bad = "group size must be 1, 2 or 4";
        else if (s->dprime < 1 || s->dprime > d || s->dprime % s->g)
            bad = "d' must be a multiple of the group size, at most head_dim";
        else if (s->r < 1 || s->r > s->dprime || s->r % s->g)
            bad = "r must be a multiple of the group size, at most d'";
        else if (!s->rotate && s->dprime != d)
            bad = "an unrotated segment keeps d' = head_dim";
        if (bad)
            return mkv_fail(err, MKV_EFORMAT, "strategy table row %lld (start %lld, length %lld, "
                            "rotate %d, r %d, g %d, d' %d): %s", (long long)i, (long long)s->start,
                            (long long)s->len, s->rotate, s->r, s->g, s->dprime, bad);
        t->off_values[i] = nv;
        t->off_bitmap[i] = nb;
        t->off_blockkeys[i] = nk;
        t->off_rotation[i] = nr;
        nv += s->len * s->r;
        nb += s->len * mkv_mosaic_bitmap_bytes(s);
        nk += block > 0 ? mkv_mosaic_nblocks(s->len, block) * s->dprime : 0;
        nr += s->rotate ? (int64_t)d * s->dprime : 0;
        next = s->start + s->len;
    }
    if (next != last)
        return mkv_fail(err, MKV_EFORMAT, "strategy table covers tokens %lld..%lld, not %lld..%lld",
                        (long long)first, (long long)next, (long long)first, (long long)last);
    t->n_values = nv;
    t->n_bitmap = nb;
    t->n_blockkeys = nk;
    t->n_rotation = nr;
    return MKV_OK;
}

static void tensor_free(mkv_mosaic_tensor *t)
{
    mkv_free(t->seg);
    mkv_free(t->loss);
    mkv_free(t->values);
    mkv_free(t->bitmap);
    mkv_free(t->blockkeys);
    mkv_free(t->rotation);
    mkv_free(t->off_values);
    memset(t, 0, sizeof *t);
}

void mkv_mosaic_head_free(mkv_mosaic_head *h)
{
    if (!h)
        return;
    mkv_free(h->dense_k);
    mkv_free(h->dense_v);
    tensor_free(&h->k);
    tensor_free(&h->v);
    memset(h, 0, sizeof *h);
}
