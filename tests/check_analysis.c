/* Unit tests of the eigensolver (lib/core/eigen.c) and the analyses
 * (lib/analysis/analysis.c, overlap.c, segments.c, spectrum.c, sparsity.c,
 * channels.c).
 *
 * References: eigenpairs known in closed form and the defining identities
 * (C v = lambda v, V^T V = I) checked in double here; statistics worked out
 * by hand on tiny inputs; the synthetic generator's ground truth (planted
 * outlier channels, attention targets) for whole dumps. tests/cli_analyze_ref.sh
 * compares every command's table with numpy (tests/analysis_ref.py). */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analysis/analysis.h"
#include "analysis/tables.h"
#include "io/dump.h"
#include "core/eigen.h"
#include "io/synthetic.h"
#include "testutil.h"

/* ------------------------------------------------------------ eigen */

/* max |C v_j - lambda_j v_j| and max |V^T V - I| of a decomposition. */
static void eigen_errors(const double *C, int d, const double *w, const double *V, double *resid,
                         double *ortho)
{
    *resid = 0.0;
    *ortho = 0.0;
    for (int j = 0; j < d; j++)
        for (int i = 0; i < d; i++) {
            double cv = 0.0;
            for (int k = 0; k < d; k++)
                cv += C[i * d + k] * V[k * d + j];
            *resid = fmax(*resid, fabs(cv - w[j] * V[i * d + j]));
        }
    for (int a = 0; a < d; a++)
        for (int b = 0; b < d; b++) {
            double dot = 0.0;
            for (int k = 0; k < d; k++)
                dot += V[k * d + a] * V[k * d + b];
            *ortho = fmax(*ortho, fabs(dot - (a == b)));
        }
}

/* Largest-magnitude component of column j positive (the first of those
 * within 1e-10 of the largest). */
static int sign_convention_holds(const double *V, int d, int j)
{
    double largest = 0.0;
    for (int i = 0; i < d; i++)
        largest = fmax(largest, fabs(V[i * d + j]));
    for (int i = 0; i < d; i++)
        if (fabs(V[i * d + j]) >= largest * (1 - 1e-10))
            return V[i * d + j] > 0;
    return 0;
}

START_TEST(eigen_two_by_two_by_hand)
{
    /* [[2,1],[1,2]]: 3 with (1,1)/sqrt2, 1 with (1,-1)/sqrt2 (tie in
     * magnitude: the first component is made positive). */
    const double C[4] = {2, 1, 1, 2};
    double w[2], V[4];
    mkv_error err;
    ck_assert_int_eq(mkv_eigh(C, 2, w, V, &err), MKV_OK);
    const double r = 1 / sqrt(2.0);
    ck_assert_double_eq_tol(w[0], 3.0, 1e-14);
    ck_assert_double_eq_tol(w[1], 1.0, 1e-14);
    ck_assert_double_eq_tol(V[0], r, 1e-14);   /* column 0 */
    ck_assert_double_eq_tol(V[2], r, 1e-14);
    ck_assert_double_eq_tol(V[1], r, 1e-14);   /* column 1 */
    ck_assert_double_eq_tol(V[3], -r, 1e-14);
}
END_TEST

START_TEST(eigen_three_by_three_by_hand)
{
    /* The second-difference matrix: eigenvalues 2+sqrt2, 2, 2-sqrt2 with
     * vectors (1,-sqrt2,1)/2 (flipped: -sqrt2/2 is its largest component),
     * (1,0,-1)/sqrt2 and (1,sqrt2,1)/2. Only the upper triangle is read:
     * the lower one holds junk. */
    const double C[9] = {2, -1, 0, 99, 2, -1, 99, 99, 2};
    const double s2 = sqrt(2.0);
    const double want_w[3] = {2 + s2, 2, 2 - s2};
    const double want_V[3][3] = {{-0.5, 1 / s2, 0.5}, {s2 / 2, 0, s2 / 2}, {-0.5, -1 / s2, 0.5}};
    double w[3], V[9], w_only[3];
    mkv_error err;
    ck_assert_int_eq(mkv_eigh(C, 3, w, V, &err), MKV_OK);
    ck_assert_int_eq(mkv_eigh(C, 3, w_only, NULL, &err), MKV_OK);
    for (int j = 0; j < 3; j++) {
        ck_assert_double_eq_tol(w[j], want_w[j], 1e-14);
        ck_assert_double_eq_tol(w_only[j], want_w[j], 1e-14);
        for (int i = 0; i < 3; i++)
            ck_assert_double_eq_tol(V[i * 3 + j], want_V[i][j], 1e-14);
    }
}
END_TEST

START_TEST(eigen_diagonal_is_a_permutation)
{
    const double C[9] = {1, 0, 0, 0, 3, 0, 0, 0, 2};
    double w[3], V[9];
    ck_assert_int_eq(mkv_eigh(C, 3, w, V, NULL), MKV_OK);
    const double want_w[3] = {3, 2, 1};
    const int want_row[3] = {1, 2, 0};   /* vector j is e_{want_row[j]} */
    for (int j = 0; j < 3; j++) {
        ck_assert_double_eq_tol(w[j], want_w[j], 1e-15);
        for (int i = 0; i < 3; i++)
            ck_assert_double_eq_tol(V[i * 3 + j], i == want_row[j], 1e-15);
    }
}
END_TEST

START_TEST(eigen_random_symmetric)
{
    static const int sizes[] = {1, 2, 3, 5, 8, 17, 64, 128};
    uint64_t seed = 7;
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const int d = sizes[s];
        double *C = malloc(sizeof(double) * d * d), *V = malloc(sizeof(double) * d * d);
        double *w = malloc(sizeof(double) * d), *w_only = malloc(sizeof(double) * d);
        ck_assert_ptr_nonnull(C);
        ck_assert_ptr_nonnull(V);
        ck_assert_ptr_nonnull(w);
        ck_assert_ptr_nonnull(w_only);
        double trace = 0.0, norm = 0.0;
        for (int i = 0; i < d; i++)
            for (int j = i; j < d; j++) {
                C[i * d + j] = C[j * d + i] = 2.0 * test_uniform(&seed) - 1.0;
                norm = fmax(norm, fabs(C[i * d + j]));
            }
        for (int i = 0; i < d; i++)
            trace += C[i * d + i];
        mkv_error err;
        ck_assert_int_eq(mkv_eigh(C, d, w, V, &err), MKV_OK);
        ck_assert_int_eq(mkv_eigh(C, d, w_only, NULL, &err), MKV_OK);
        double resid, ortho, sum = 0.0;
        eigen_errors(C, d, w, V, &resid, &ortho);
        ck_assert_msg(resid <= 1e-12 * d * norm, "d=%d: |Cv - lv| = %g", d, resid);
        ck_assert_msg(ortho <= 1e-13 * d, "d=%d: |V'V - I| = %g", d, ortho);
        for (int j = 0; j < d; j++) {
            sum += w[j];
            if (j > 0)
                ck_assert_msg(w[j] <= w[j - 1], "d=%d: eigenvalues not descending at %d", d, j);
            ck_assert_msg(sign_convention_holds(V, d, j), "d=%d: sign of vector %d", d, j);
            ck_assert_double_eq_tol(w_only[j], w[j], 1e-12 * d * norm);
        }
        ck_assert_double_eq_tol(sum, trace, 1e-12 * d * norm);
        free(C);
        free(V);
        free(w);
        free(w_only);
    }
}
END_TEST

START_TEST(eigen_refuses_bad_input)
{
    double C[4] = {1, NAN, NAN, 1}, w[2], V[4];
    mkv_error err;
    ck_assert_int_eq(mkv_eigh(C, 0, w, V, &err), MKV_EUSAGE);
    ck_assert_int_eq(mkv_eigh(C, 2, w, V, &err), MKV_EFORMAT);
    ck_assert_str_eq(err.msg, "eigendecomposition: non-finite matrix element at [0,1]");
}
END_TEST

START_TEST(gram_in_chunks_matches_direct_sum)
{
    enum { N = 1000, D = 12 };
    static float X[N * D];
    uint64_t seed = 3;
    for (int i = 0; i < N * D; i++)
        X[i] = (float)(4.0 * test_uniform(&seed) - 2.0);
    double want[D * D] = {0}, got[D * D] = {0};
    for (int t = 0; t < N; t++)
        for (int i = 0; i < D; i++)
            for (int j = 0; j < D; j++)
                want[i * D + j] += (double)X[t * D + i] * X[t * D + j];
    /* uneven pieces, single vectors included: the incremental C += x x^T */
    const int cuts[] = {0, 1, 2, 300, 301, 999, N};
    for (size_t c = 0; c + 1 < sizeof cuts / sizeof cuts[0]; c++)
        ck_assert_int_eq(mkv_gram_add(got, X + cuts[c] * D, cuts[c + 1] - cuts[c], D, NULL), MKV_OK);
    for (int i = 0; i < D * D; i++)
        ck_assert_double_eq_tol(got[i], want[i], 1e-12 * fabs(want[i]) + 1e-12);
}
END_TEST

START_TEST(rotation_keeps_dot_products)
{
    enum { N = 50, D = 16 };
    static float Xf[N * D];
    static double X[N * D], Y[N * D];
    double C[D * D] = {0}, R[D * D], w[D];
    uint64_t seed = 11;
    for (int i = 0; i < N * D; i++)
        X[i] = Xf[i] = (float)(2.0 * test_uniform(&seed) - 1.0 + (i % D == 3 ? 4.0 : 0.0));
    ck_assert_int_eq(mkv_gram_add(C, Xf, N, D, NULL), MKV_OK);
    ck_assert_int_eq(mkv_eigh(C, D, w, R, NULL), MKV_OK);
    mkv_rotate(X, N, D, R, Y);
    for (int a = 0; a < N; a++) {
        for (int j = 0; j < D; j++) {   /* y = x R, written out */
            double y = 0.0;
            for (int k = 0; k < D; k++)
                y += X[a * D + k] * R[k * D + j];
            ck_assert_double_eq_tol(Y[a * D + j], y, 1e-12);
        }
        for (int b = 0; b < N; b++) {
            double xx = 0.0, yy = 0.0;
            for (int k = 0; k < D; k++) {
                xx += X[a * D + k] * X[b * D + k];
                yy += Y[a * D + k] * Y[b * D + k];
            }
            ck_assert_double_eq_tol(yy, xx, 1e-11);
        }
    }
    /* rotated channel j carries energy w[j]: sum_t y_tj^2 = v_j' C v_j */
    for (int j = 0; j < D; j++) {
        double e = 0.0;
        for (int t = 0; t < N; t++)
            e += Y[t * D + j] * Y[t * D + j];
        ck_assert_double_eq_tol(e, w[j], 1e-10 * w[0]);
    }
}
END_TEST

/* ------------------------------------------------------------ helpers */

START_TEST(counts_for_shares_and_fractions)
{
    ck_assert_int_eq(mkv_keep_count(0.25, 128), 32);
    ck_assert_int_eq(mkv_keep_count(0.25, 64), 16);
    ck_assert_int_eq(mkv_keep_count(0.25, 10), 3);   /* 2.5 rounds up */
    ck_assert_int_eq(mkv_keep_count(0.01, 8), 1);    /* at least one */
    ck_assert_int_eq(mkv_keep_count(1.0, 8), 8);
    ck_assert_int_eq(mkv_fraction_count(0.07, 100), 7);   /* not 8: 7.000000000000001 */
    ck_assert_int_eq(mkv_fraction_count(0.1, 1000), 100);
    ck_assert_int_eq(mkv_fraction_count(0.01, 1024), 11);   /* ceil(10.24) */
    ck_assert_int_eq(mkv_fraction_count(0.25, 3), 1);
    ck_assert_int_eq(mkv_fraction_count(0.001, 5), 1);
    ck_assert_int_eq(mkv_fraction_count(1.0, 77), 77);
}
END_TEST

START_TEST(top_selection_breaks_ties_by_index)
{
    const double s[6] = {1, 5, 3, 5, 3, 0};
    unsigned char mask[6];
    double scratch[6];
    int idx[6];
    mkv_top_mask(s, 6, 3, mask, scratch);   /* 5, 5 and the first 3 */
    const unsigned char want3[6] = {0, 1, 1, 1, 0, 0};
    ck_assert_mem_eq(mask, want3, 6);
    mkv_top_mask(s, 6, 1, mask, scratch);
    const unsigned char want1[6] = {0, 1, 0, 0, 0, 0};
    ck_assert_mem_eq(mask, want1, 6);
    mkv_top_indices(s, 6, 6, idx);
    const int order[6] = {1, 3, 2, 4, 0, 5};
    ck_assert_mem_eq(idx, order, sizeof order);
    mkv_top_indices(s, 6, 2, idx);
    ck_assert_int_eq(idx[0], 1);
    ck_assert_int_eq(idx[1], 3);
    ck_assert_double_eq_tol(mkv_top_share(s, 6, 3, scratch), 13.0 / 17.0, 1e-15);
    ck_assert_double_eq_tol(mkv_top_share(s, 6, 6, scratch), 1.0, 1e-15);
    const double zero[3] = {0, 0, 0};
    ck_assert_double_eq(mkv_top_share(zero, 3, 1, scratch), 0.0);
}
END_TEST

START_TEST(top_mask_matches_a_full_sort)
{
    /* Many ties (values from a small set) against a rank count. */
    enum { D = 40 };
    uint64_t seed = 5;
    double s[D], scratch[D];
    unsigned char mask[D];
    for (int round = 0; round < 200; round++) {
        for (int j = 0; j < D; j++)
            s[j] = (double)(test_rand64(&seed) % 7);
        int m = 1 + (int)(test_rand64(&seed) % D);
        mkv_top_mask(s, D, m, mask, scratch);
        for (int j = 0; j < D; j++) {
            int rank = 0;   /* entries before j in a stable sort by decreasing score */
            for (int k = 0; k < D; k++)
                rank += s[k] > s[j] || (s[k] == s[j] && k < j);
            ck_assert_int_eq(mask[j], rank < m);
        }
    }
}
END_TEST

/* ------------------------------------------------------------ overlap */

/* Four vectors of four channels for the overlap cases by hand. */
static const float hand_X[16] = {4, 1, 0, 0,
                                 0, 3, 1, 0,
                                 -5, 0, 0, 1,
                                 0, 0, 2, -1};

START_TEST(overlap_by_hand)
{
    /* Channel sums of |x|: 9, 4, 3, 2.
     * m = 1: global {0}; the vectors' tops are 0, 1, 0, 2 -> 1, 0, 1, 0.
     * m = 2: global {0,1}; tops {0,1}, {1,2}, {0,3}, {2,3} -> 1, .5, .5, 0. */
    const float *X = hand_X;
    double ov[4];
    mkv_error err;
    ck_assert_int_eq(mkv_overlap(X, 4, 4, 1, 0, ov, &err), MKV_OK);
    const double want1[4] = {1, 0, 1, 0};
    for (int t = 0; t < 4; t++)
        ck_assert_double_eq(ov[t], want1[t]);
    ck_assert_int_eq(mkv_overlap(X, 4, 4, 2, 0, ov, &err), MKV_OK);
    const double want2[4] = {1, 0.5, 0.5, 0};
    for (int t = 0; t < 4; t++)
        ck_assert_double_eq(ov[t], want2[t]);
    ck_assert_int_eq(mkv_overlap(X, 4, 4, 0, 0, ov, &err), MKV_EUSAGE);
}
END_TEST

START_TEST(overlap_windows_by_hand)
{
    /* overlap_by_hand's vectors as two windows of 2 tokens, m = 2.
     * Window 0: channel sums of |x| 4, 4, 1, 0: global {0,1}; tops {0,1},
     * {1,2} -> 1, .5 (mean .75). Window 1: sums 5, 0, 2, 2: global {0,2}
     * (tie to the lower index); tops {0,3}, {2,3} -> .5, .5 (mean .5). */
    const float *X = hand_X;
    double ov[2];
    mkv_overlap_summary o;
    mkv_error err;
    ck_assert_int_eq(mkv_overlap_windows(X, 2, 2, 4, 2, 0, ov, &o, &err), MKV_OK);
    ck_assert_double_eq(o.mean, 0.625);
    ck_assert_double_eq(o.vec_min, 0.5);
    ck_assert_double_eq(o.win_min, 0.5);
    ck_assert_double_eq(o.win_max, 0.75);
    /* the first window alone (--prefix) */
    ck_assert_int_eq(mkv_overlap_windows(X, 1, 2, 4, 2, 0, ov, &o, &err), MKV_OK);
    ck_assert_double_eq(o.mean, 0.75);
    ck_assert_double_eq(o.win_min, 0.75);
}
END_TEST

START_TEST(percent_labels_of_columns)
{
    char buf[32];
    ck_assert_str_eq(mkv_table_percent(0.25, buf, sizeof buf), "25");
    ck_assert_str_eq(mkv_table_percent(0.005, buf, sizeof buf), "0.5");
    ck_assert_str_eq(mkv_table_percent(1.0, buf, sizeof buf), "100");
}
END_TEST

START_TEST(overlap_rotated_by_hand)
{
    /* X = [1,1; 1,1; 1,-1]: X'X = [3,1; 1,3], eigenvectors (1,1)/sqrt2
     * (eigenvalue 4) and (1,-1)/sqrt2 (2), so X~ = [sqrt2,0; sqrt2,0;
     * 0,sqrt2]: global channel 0 (sum 2 sqrt2 against sqrt2); the third
     * vector's top element is channel 1 -> overlaps 1, 1, 0.
     * Unrotated every sum and every vector ties: channel 0 throughout. */
    const float X[6] = {1, 1, 1, 1, 1, -1};
    double ov[3];
    ck_assert_int_eq(mkv_overlap(X, 3, 2, 1, 1, ov, NULL), MKV_OK);
    ck_assert_double_eq(ov[0], 1);
    ck_assert_double_eq(ov[1], 1);
    ck_assert_double_eq(ov[2], 0);
    ck_assert_int_eq(mkv_overlap(X, 3, 2, 1, 0, ov, NULL), MKV_OK);
    for (int t = 0; t < 3; t++)
        ck_assert_double_eq(ov[t], 1);
}
END_TEST

START_TEST(overlap_is_one_when_every_vector_agrees)
{
    /* Scaled copies of one vector: the same top elements as the sums,
     * before and after rotation (X~ is then rank one). */
    enum { N = 30, D = 16 };
    float X[N * D];
    uint64_t seed = 9;
    float base[D];
    for (int j = 0; j < D; j++)
        base[j] = (float)(test_uniform(&seed) * 2 - 1);
    for (int t = 0; t < N; t++)
        for (int j = 0; j < D; j++)
            X[t * D + j] = base[j] * (float)(t + 1) * (t % 2 ? -1.0f : 1.0f);
    double ov[N];
    ck_assert_int_eq(mkv_overlap(X, N, D, 4, 0, ov, NULL), MKV_OK);
    for (int t = 0; t < N; t++)
        ck_assert_double_eq(ov[t], 1.0);
    /* rotated, only channel 0 is more than rounding noise: m = 1 */
    ck_assert_int_eq(mkv_overlap(X, N, D, 1, 1, ov, NULL), MKV_OK);
    for (int t = 0; t < N; t++)
        ck_assert_double_eq(ov[t], 1.0);
}
END_TEST

/* ------------------------------------------------------------ segments, spectrum */

START_TEST(segment_statistics_by_hand)
{
    /* values 1, -1, 3, -3: mean 0, m2 = 5, m4 = 41, excess kurtosis
     * 41/25 - 3; rms sqrt5; |x| = 1,1,3,3: variance 1; with k = 1 the
     * two 3s exceed sqrt5; channel energies 10 and 10 (tie: channel 0). */
    const float X[4] = {1, -1, 3, -3};
    mkv_segment_summary s;
    int top[2];
    ck_assert_int_eq(mkv_segment_stats(X, 2, 2, 1.0, 1, &s, top, NULL), MKV_OK);
    ck_assert_int_eq(s.tokens, 2);
    ck_assert_double_eq_tol(s.rms, sqrt(5.0), 1e-15);
    ck_assert_double_eq_tol(s.mag_var, 1.0, 1e-15);
    ck_assert_double_eq_tol(s.kurtosis, 41.0 / 25.0 - 3.0, 1e-15);
    ck_assert_double_eq(s.outlier_share, 0.5);
    ck_assert_double_eq(s.top_energy, 0.5);
    ck_assert_int_eq(top[0], 0);
    ck_assert_int_eq(mkv_segment_stats(X, 2, 2, 1.0, 2, &s, top, NULL), MKV_OK);
    ck_assert_double_eq(s.top_energy, 1.0);
    ck_assert_int_eq(mkv_segment_stats(X, 2, 2, 1.0, 3, &s, top, NULL), MKV_EUSAGE);
    /* a constant segment: no spread, kurtosis defined as 0 */
    const float flat[4] = {2, 2, 2, 2};
    ck_assert_int_eq(mkv_segment_stats(flat, 2, 2, 6.0, 1, &s, NULL, NULL), MKV_OK);
    ck_assert_double_eq(s.kurtosis, 0.0);
    ck_assert_double_eq(s.mag_var, 0.0);
    ck_assert_double_eq(s.outlier_share, 0.0);
}
END_TEST

START_TEST(spectrum_by_hand)
{
    /* X = [1,1; 1,-1; 1,1]: X'X = [3,1; 1,3], eigenvalues 4 and 2. */
    const float X[6] = {1, 1, 1, -1, 1, 1};
    double w[2];
    ck_assert_int_eq(mkv_spectrum(X, 3, 2, w, NULL), MKV_OK);
    ck_assert_double_eq_tol(w[0], 4.0, 1e-14);
    ck_assert_double_eq_tol(w[1], 2.0, 1e-14);
    ck_assert_int_eq(mkv_energy_rank(w, 2, 0.5), 1);
    ck_assert_int_eq(mkv_energy_rank(w, 2, 2.0 / 3.0), 1);
    ck_assert_int_eq(mkv_energy_rank(w, 2, 0.9), 2);
    ck_assert_int_eq(mkv_energy_rank(w, 2, 1.0), 2);
    const double none[3] = {0, 0, 0};
    ck_assert_int_eq(mkv_energy_rank(none, 3, 0.9), 0);
    /* rank one: all energy in one direction */
    const float line[6] = {1, 2, -2, -4, 3, 6};
    ck_assert_int_eq(mkv_spectrum(line, 3, 2, w, NULL), MKV_OK);
    ck_assert_double_eq_tol(w[0], 70.0, 1e-12);
    ck_assert_double_eq_tol(w[1], 0.0, 1e-12);
    ck_assert_int_eq(mkv_energy_rank(w, 2, 0.99), 1);
}
END_TEST

/* ------------------------------------------------------------ sparsity, channels */

START_TEST(topk_mass_by_hand)
{
    /* q = (sqrt2 ln2, 0), keys (0,0), (1,0), (2,0), d = 2: logits 0, ln2,
     * 2 ln2 -> probabilities 1/7, 2/7, 4/7. */
    const float q[2] = {(float)(sqrt(2.0) * log(2.0)), 0};
    const float K[6] = {0, 0, 1, 0, 2, 0};
    const double fractions[4] = {0.3, 0.34, 0.67, 1.0};   /* 1, 2, 3 (ceil 2.01), 3 keys */
    double mass[4], scratch[3];
    mkv_topk_mass(q, K, 3, 2, fractions, 4, mass, scratch);
    ck_assert_double_eq_tol(mass[0], 4.0 / 7.0, 1e-7);
    ck_assert_double_eq_tol(mass[1], 6.0 / 7.0, 1e-7);
    ck_assert_double_eq_tol(mass[2], 1.0, 1e-15);
    ck_assert_double_eq_tol(mass[3], 1.0, 1e-15);
    /* a single key holds everything */
    mkv_topk_mass(q, K, 1, 2, fractions, 1, mass, scratch);
    ck_assert_double_eq(mass[0], 1.0);
}
END_TEST

START_TEST(channel_scores_are_outer_product_norms)
{
    enum { NQ = 3, NK = 5, D = 4 };
    uint64_t seed = 21;
    float Q[NQ * D], K[NK * D];
    for (int i = 0; i < NQ * D; i++)
        Q[i] = (float)(test_uniform(&seed) * 4 - 2);
    for (int i = 0; i < NK * D; i++)
        K[i] = (float)(test_uniform(&seed) * 4 - 2);
    double qsq[D] = {0}, ksq[D] = {0}, score[D];
    mkv_channel_sumsq_add(qsq, Q, 1, D);          /* in two pieces */
    mkv_channel_sumsq_add(qsq, Q + D, NQ - 1, D);
    mkv_channel_sumsq_add(ksq, K, NK, D);
    mkv_channel_scores(qsq, ksq, D, score);
    for (int j = 0; j < D; j++) {
        double fro = 0.0;   /* || Q[:,j] K[:,j]^T ||_F from its entries */
        for (int a = 0; a < NQ; a++)
            for (int b = 0; b < NK; b++) {
                double e = (double)Q[a * D + j] * K[b * D + j];
                fro += e * e;
            }
        ck_assert_double_eq_tol(score[j], sqrt(fro), 1e-12 * sqrt(fro));
    }
}
END_TEST

/* ------------------------------------------------------------ synthetic dumps */

static mkv_dump *synthetic_dump(const mkv_synthetic_params *p, const char *name)
{
    char path[256];
    mkv_error err;
    test_path(path, sizeof path, name);
    int rc = mkv_synthetic_write(p, path, NULL, &err);
    ck_assert_msg(rc == MKV_OK, "mkv_synthetic_write: %s", err.msg);
    mkv_dump *d = NULL;
    rc = mkv_dump_open(path, &d, &err);
    ck_assert_msg(rc == MKV_OK, "mkv_dump_open: %s", err.msg);
    return d;
}

START_TEST(segments_find_the_planted_outlier_channels)
{
    /* The planted outlier channels of the keys hold the most energy of the
     * first segment (little RoPE rotation yet); later, RoPE turns part of
     * their energy into their pair partners, so they stay among the 2n
     * channels of most energy. No value segment concentrates its energy so. */
    mkv_synthetic_params p;
    mkv_synthetic_params_init(&p);
    p.seed = 4;
    mkv_dump *d = synthetic_dump(&p, "outliers.h5");
    const int hd = p.head_dim, S = 256;
    float *X = malloc(sizeof(float) * S * hd);
    ck_assert_ptr_nonnull(X);
    int planted[64], top[64];
    for (int layer = 0; layer < p.n_layers; layer++)
        for (int head = 0; head < p.n_kv_heads; head++) {
            int n = mkv_synthetic_outliers(&p, layer, head, planted);
            ck_assert_int_eq(n, p.n_outliers);
            for (int64_t s0 = 0; s0 < p.n_tokens; s0 += S) {
                mkv_error err;
                mkv_segment_summary k_sum, v_sum;
                ck_assert_int_eq(mkv_dump_read_finite(d, layer, 'k', head, 1, s0, S, X, &err), MKV_OK);
                const int among = s0 == 0 ? n : 2 * n;
                ck_assert_int_eq(mkv_segment_stats(X, S, hd, 6.0, among, &k_sum, top, &err), MKV_OK);
                for (int i = 0; i < n; i++) {
                    int found = 0;
                    for (int j = 0; j < among; j++)
                        found |= top[j] == planted[i];
                    ck_assert_msg(found, "layer %d head %d segment at %lld: outlier channel %d "
                                  "not among the top %d", layer, head, (long long)s0, planted[i],
                                  among);
                }
                ck_assert_int_eq(mkv_segment_stats(X, S, hd, 6.0, n, &k_sum, NULL, &err), MKV_OK);
                ck_assert_int_eq(mkv_dump_read_finite(d, layer, 'v', head, 1, s0, S, X, &err), MKV_OK);
                ck_assert_int_eq(mkv_segment_stats(X, S, hd, 6.0, n, &v_sum, NULL, &err), MKV_OK);
                ck_assert_msg(k_sum.top_energy > 2 * v_sum.top_energy,
                              "top-%d energy share: keys %g, values %g", n, k_sum.top_energy,
                              v_sum.top_energy);
            }
        }
    free(X);
    mkv_dump_close(d);
}
END_TEST

/* The rows a table prints for one dump, through its callbacks. */
static char *table_text(const mkv_table_analysis *a, void *ctx, mkv_dump *d)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    ck_assert_ptr_nonnull(out);
    mkv_error err;
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    int rc = a->begin(ctx, d, out, &err);
    for (int layer = 0; layer < m->n_layers && rc == MKV_OK; layer++)
        for (int head = 0; head < m->n_kv_heads && rc == MKV_OK; head++)
            for (int k = 0; k < (a->per_tensor ? 2 : 1) && rc == MKV_OK; k++)
                rc = a->rows(ctx, d, layer, head, a->per_tensor ? "kv"[k] : 0, out, &err);
    a->end(ctx);
    ck_assert_msg(rc == MKV_OK, "%s: %s", a->label, err.msg);
    fclose(out);
    return buf;
}

static int starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

START_TEST(tables_print_a_header_and_a_row_per_visit)
{
    /* the default shape, 512 tokens */
    mkv_synthetic_params p;
    mkv_synthetic_params_init(&p);
    p.n_tokens = 512;
    mkv_dump *d = synthetic_dump(&p, "tables.h5");
    const int visits = p.n_layers * p.n_kv_heads;

    mkv_stats_settings st = {.factor = MKV_OUTLIER_FACTOR_DEFAULT};
    char *text = table_text(&mkv_stats_table, &st, d);
    ck_assert_int_eq(count_lines(text), 1 + 2 * visits);
    ck_assert(starts_with(text, "layer\thead\ttensor\ttokens\tmean\t"));
    ck_assert_ptr_nonnull(strstr(text, "\n0\t0\tk\t512\t"));
    ck_assert_ptr_nonnull(strstr(text, "\n1\t1\tv\t512\t"));
    free(text);

    /* segments of 200 tokens: 3 per tensor, the last of 112 */
    mkv_segments_settings sg = {.S = 200, .factor = 6.0, .top = 2};
    text = table_text(&mkv_segments_table, &sg, d);
    ck_assert_int_eq(count_lines(text), 1 + 2 * visits * 3);
    ck_assert_ptr_nonnull(strstr(text, "\n0\t1\tv\t2\t400\t112\t"));
    free(text);

    /* spectrum's energy columns are named by percent */
    mkv_spectrum_settings sp = {.energy = {0.5, 0.995}, .n_energy = 2};
    text = table_text(&mkv_spectrum_table, &sp, d);
    ck_assert(starts_with(text, "layer\thead\ttensor\tsegment\tstart\ttokens\tenergy\t"
                            "lambda1_share\td50\td99.5\n"));
    ck_assert_int_eq(count_lines(text), 1 + 2 * visits);
    free(text);

    /* sparsity: a row per query head */
    mkv_sparsity_settings sa = {.fractions = {0.1}, .n_fractions = 1};
    text = table_text(&mkv_sparsity_table, &sa, d);
    ck_assert_int_eq(count_lines(text), 1 + p.n_layers * p.n_heads);
    ck_assert(starts_with(text, "layer\thead\tkv_head\tqueries\ttop10_mean\ttop10_min\n"));
    free(text);

    /* channels refuses more channels than head_dim */
    mkv_channels_settings ch = {.top = p.head_dim + 1, .shares = {0.25}, .n_shares = 1};
    mkv_error err;
    FILE *null = fopen("/dev/null", "w");
    ck_assert_int_eq(mkv_channels_table.begin(&ch, d, null, &err), MKV_EUSAGE);
    mkv_channels_table.end(&ch);
    fclose(null);
    mkv_dump_close(d);
}
END_TEST

START_TEST(sparsity_sees_the_planted_attention_targets)
{
    /* Each query puts attn_mass (0.8) of its softmax on its planted targets
     * (sink and a few others). Independently of mkv_topk_mass: the target
     * mass by a softmax written here; then the top-k mass over as many
     * tokens as targets is at least that, and the top-1% mass (more
     * tokens than targets) averages at least attn_mass. */
    mkv_synthetic_params p;
    mkv_synthetic_params_init(&p);
    mkv_dump *d = synthetic_dump(&p, "targets.h5");
    const int hd = p.head_dim, G = p.n_heads / p.n_kv_heads;
    const int64_t T = p.n_tokens, W = p.n_queries;
    float *K = malloc(sizeof(float) * T * hd), *Q = malloc(sizeof(float) * W * hd);
    double *scratch = malloc(sizeof(double) * T), *prob = malloc(sizeof(double) * T);
    ck_assert(K && Q && scratch && prob);
    int32_t pos[64];
    int64_t targets[256];
    ck_assert_int_eq(mkv_dump_read_query_pos(d, pos, NULL), MKV_OK);
    double target_sum = 0.0, top1_sum = 0.0;
    int n_queries = 0;
    for (int layer = 0; layer < p.n_layers; layer++)
        for (int h = 0; h < p.n_heads; h++) {
            ck_assert_int_eq(mkv_dump_read_finite(d, layer, 'k', h / G, 1, 0, T, K, NULL), MKV_OK);
            ck_assert_int_eq(mkv_dump_read_finite(d, layer, 'q', h, 1, 0, W, Q, NULL), MKV_OK);
            for (int64_t w = 0; w < W; w++) {
                const float *q = Q + w * hd;
                const int64_t n = pos[w] + 1;
                double smax = -INFINITY, z = 0.0, on_targets = 0.0;
                for (int64_t t = 0; t < n; t++) {
                    double s = 0.0;
                    for (int j = 0; j < hd; j++)
                        s += (double)q[j] * K[t * hd + j];
                    prob[t] = s / sqrt((double)hd);
                    smax = fmax(smax, prob[t]);
                }
                for (int64_t t = 0; t < n; t++)
                    z += prob[t] = exp(prob[t] - smax);
                int nt = mkv_synthetic_targets(&p, layer, h, w, targets);
                ck_assert_int_gt(nt, 0);
                for (int i = 0; i < nt; i++)
                    on_targets += prob[targets[i]] / z;
                /* a fraction whose count is exactly nt tokens, and 1% */
                const double fractions[2] = {(double)nt / (double)n, 0.01};
                double mass[2];
                mkv_topk_mass(q, K, n, hd, fractions, 2, mass, scratch);
                ck_assert_int_eq(mkv_fraction_count(fractions[0], n), nt);
                ck_assert_msg(mass[0] >= on_targets - 1e-12, "top-%d mass %g below the "
                              "targets' %g", nt, mass[0], on_targets);
                target_sum += on_targets;
                top1_sum += mass[1];
                n_queries++;
            }
        }
    double target_mean = target_sum / n_queries, top1_mean = top1_sum / n_queries;
    ck_assert_msg(fabs(target_mean - p.attn_mass) < 0.03, "mean mass on targets %g, planted %g",
                  target_mean, p.attn_mass);
    ck_assert_msg(top1_mean >= target_mean, "top-1%% mass %g below the targets' %g", top1_mean,
                  target_mean);
    free(K);
    free(Q);
    free(scratch);
    free(prob);
    mkv_dump_close(d);
}
END_TEST

static Suite *analysis_suite(void)
{
    Suite *s = suite_create("analysis");
    TCase *eig = tcase_create("eigen");
    tcase_add_test(eig, eigen_two_by_two_by_hand);
    tcase_add_test(eig, eigen_three_by_three_by_hand);
    tcase_add_test(eig, eigen_diagonal_is_a_permutation);
    tcase_add_test(eig, eigen_random_symmetric);
    tcase_add_test(eig, eigen_refuses_bad_input);
    tcase_add_test(eig, gram_in_chunks_matches_direct_sum);
    tcase_add_test(eig, rotation_keeps_dot_products);
    suite_add_tcase(s, eig);
    TCase *stat = tcase_create("statistics");
    tcase_add_test(stat, counts_for_shares_and_fractions);
    tcase_add_test(stat, top_selection_breaks_ties_by_index);
    tcase_add_test(stat, top_mask_matches_a_full_sort);
    tcase_add_test(stat, overlap_by_hand);
    tcase_add_test(stat, overlap_windows_by_hand);
    tcase_add_test(stat, percent_labels_of_columns);
    tcase_add_test(stat, overlap_rotated_by_hand);
    tcase_add_test(stat, overlap_is_one_when_every_vector_agrees);
    tcase_add_test(stat, segment_statistics_by_hand);
    tcase_add_test(stat, spectrum_by_hand);
    tcase_add_test(stat, topk_mass_by_hand);
    tcase_add_test(stat, channel_scores_are_outer_product_norms);
    suite_add_tcase(s, stat);
    TCase *dumps = tcase_create("synthetic dumps");
    tcase_set_timeout(dumps, 60);
    tcase_add_test(dumps, segments_find_the_planted_outlier_channels);
    tcase_add_test(dumps, sparsity_sees_the_planted_attention_targets);
    tcase_add_test(dumps, tables_print_a_header_and_a_row_per_visit);
    suite_add_tcase(s, dumps);
    return s;
}

int main(void)
{
    return test_run(analysis_suite());
}
