/* Importance-distribution statistics of KV caches: the computations behind
 * `mkv-analyze overlap|segments|spectrum|sparsity|channels` (definitions in
 * man/mkv-analyze.1). They work on in-memory arrays of one layer and head
 * (X[n][d], row t = vector of token t, float32 as a dump hands them out)
 * and accumulate in double; the tables of tables.h do the reading.
 *
 * Top-m selection is deterministic everywhere: the m largest scores, ties
 * going to the lower index (what a stable sort by decreasing score keeps). */
#ifndef MKV_ANALYSIS_H
#define MKV_ANALYSIS_H

#include <stdint.h>
#include "io/dump.h"
#include "core/mkv.h"

/* ---- shared helpers ---- */

/* Elements kept out of d for a share p in (0, 1]: round(p * d), at least 1. */
int mkv_keep_count(double p, int d);
/* Tokens out of n for a fraction f in (0, 1]: ceil(f * n), between 1 and n
 * (f * n within 1e-9 relative of an integer counts as that integer). */
int64_t mkv_fraction_count(double f, int64_t n);
/* mask[j] = 1 for the m largest score[0..d) (ties: lower index), else 0.
 * scratch holds d doubles. 0 < m <= d. */
void mkv_top_mask(const double *score, int d, int m, unsigned char *mask, double *scratch);
/* Indices of the m largest score[0..d) (0 < m <= d), largest first (ties:
 * lower index first). */
void mkv_top_indices(const double *score, int d, int m, int *idx);
/* Share of sum(score[0..d)) held by its m largest entries (0 if the sum is
 * 0); scores are non-negative. scratch holds d doubles. */
double mkv_top_share(const double *score, int d, int m, double *scratch);

/* ---- overlap (the paper's Fig. 4 statistic) ---- */

/* For one segment X[n][d], with m elements per vector: the global channels
 * are the m channels with the largest sum over the segment of |x[t][j]|;
 * overlap[t] = (number of the m largest-|x| elements of vector t that are
 * global channels) / m. With rotate, X is first rotated, X~ = X R with R
 * the eigenvectors of X^T X (mkv_eigh), and everything is measured on X~. */
int mkv_overlap(const float *X, int64_t n, int d, int m, int rotate, double *overlap,
                mkv_error *err);

/* The overlap of consecutive windows of one head, summarised. */
typedef struct {
    double mean;      /* over every vector of every window */
    double vec_min;   /* lowest vector */
    double win_min;   /* lowest window mean */
    double win_max;   /* highest window mean */
} mkv_overlap_summary;
/* Overlap (mkv_overlap, m elements per vector) of the first `windows`
 * windows of L tokens of X[.][hd]; ov holds L doubles. */
int mkv_overlap_windows(const float *X, int64_t windows, int64_t L, int hd, int m, int rotated,
                        double *ov, mkv_overlap_summary *o, mkv_error *err);

/* ---- segments ---- */

typedef struct {
    int64_t tokens;
    double rms;            /* sqrt(mean of x^2) over the segment's n*d elements */
    double mag_var;        /* population variance of |x| over those elements */
    double kurtosis;       /* excess kurtosis of x: m4 / m2^2 - 3 (central moments), 0 if m2 = 0 */
    double outlier_share;  /* share of elements with |x| > k * rms */
    double top_energy;     /* share of sum x^2 held by the `top` channels of largest sum x^2 */
} mkv_segment_summary;

/* Statistics of one segment X[n][d] (n > 0). top_channels (may be NULL)
 * receives those `top` channels (1 <= top <= d), largest energy first. */
int mkv_segment_stats(const float *X, int64_t n, int d, double k, int top,
                      mkv_segment_summary *out, int *top_channels, mkv_error *err);

/* ---- spectrum ---- */

/* Eigenvalues of X^T X, descending, negative rounding residues set to 0. */
int mkv_spectrum(const float *X, int64_t n, int d, double *evals, mkv_error *err);
/* Smallest k such that evals[0..k) hold at least `share` of the sum of
 * evals[0..d) (0 when the sum is 0). */
int mkv_energy_rank(const double *evals, int d, double share);

/* ---- sparsity ---- */

/* Attention of query q[d] over keys K[n][d] (softmax of q.k / sqrt(d), in
 * double): mass[i] = total probability of the mkv_fraction_count(
 * fractions[i], n) most probable keys. scratch holds n doubles. */
void mkv_topk_mass(const float *q, const float *K, int64_t n, int d, const double *fractions,
                   int n_fractions, double *mass, double *scratch);

/* ---- channels (ThinK key-channel importance) ---- */

/* sumsq[j] += sum over the n vectors of x[t][j]^2. */
void mkv_channel_sumsq_add(double *sumsq, const float *X, int64_t n, int d);
/* score[j] = || Q[:,j] K[:,j]^T ||_F = sqrt(q_sumsq[j] * k_sumsq[j]): the
 * Frobenius norm of the outer product of channel j of the observation
 * queries and of the keys. */
void mkv_channel_scores(const double *q_sumsq, const double *k_sumsq, int d, double *score);

#endif
