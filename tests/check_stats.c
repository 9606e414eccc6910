/* Unit tests of lib/analysis/stats.c: moments, channel RMS, the median and the
 * outlier rule. References are hand-computed values and plain
 * double-precision two-pass sums written out here; tests/cli_analyze.sh
 * checks the whole `mkv-analyze stats` against numpy. */
#include "config.h"

#include <math.h>

#include "io/dump.h"
#include "analysis/stats.h"
#include "testutil.h"

/* Two-pass population mean/std and per-channel RMS of x[T][d] in double. */
static void reference(const float *x, int64_t T, int d, double *mean, double *std, double *absmax,
                      double *rms)
{
    double sum = 0.0, ss = 0.0, amax = 0.0;
    int64_t n = T * d;
    for (int64_t i = 0; i < n; i++) {
        sum += x[i];
        if (fabs(x[i]) > amax)
            amax = fabs(x[i]);
    }
    *mean = sum / (double)n;
    for (int64_t i = 0; i < n; i++)
        ss += (x[i] - *mean) * (x[i] - *mean);
    *std = sqrt(ss / (double)n);
    *absmax = amax;
    for (int j = 0; j < d; j++) {
        double s = 0.0;
        for (int64_t t = 0; t < T; t++)
            s += (double)x[t * d + j] * x[t * d + j];
        rms[j] = sqrt(s / (double)T);
    }
}

START_TEST(hand_computed_two_by_two)
{
    /* tokens [1,2] and [3,4]: mean 2.5, variance (2.25+0.25+0.25+2.25)/4,
     * channel RMS sqrt((1+9)/2) and sqrt((4+16)/2). */
    const float x[] = {1, 2, 3, 4};
    mkv_tensor_stats s;
    mkv_error err;
    ck_assert_int_eq(mkv_tensor_stats_init(&s, 2, &err), MKV_OK);
    mkv_tensor_stats_add(&s, x, 2);
    mkv_tensor_summary sum;
    mkv_tensor_stats_summarize(&s, 4.0, &sum);
    ck_assert_int_eq(sum.n_tokens, 2);
    ck_assert_double_eq_tol(sum.mean, 2.5, 1e-15);
    ck_assert_double_eq_tol(sum.std, sqrt(1.25), 1e-15);
    ck_assert_double_eq(sum.absmax, 4.0);
    ck_assert_double_eq_tol(sum.rms_median, (sqrt(5.0) + sqrt(10.0)) / 2, 1e-15);
    ck_assert_double_eq_tol(sum.rms_max, sqrt(10.0), 1e-15);
    ck_assert_int_eq(sum.outlier_channels, 0);
    mkv_tensor_stats_free(&s);
}
END_TEST

START_TEST(chunks_match_one_pass)
{
    enum { T = 1000, D = 8 };
    static float x[T * D];
    uint64_t seed = 42;
    for (int i = 0; i < T * D; i++)
        x[i] = (float)(3.0 * test_uniform(&seed) - 1.0 + (i % D == 5 ? 20.0 : 0.0));
    double mean, std, absmax, rms[D];
    reference(x, T, D, &mean, &std, &absmax, rms);

    mkv_tensor_stats s;
    ck_assert_int_eq(mkv_tensor_stats_init(&s, D, NULL), MKV_OK);
    /* uneven chunks, including a single token */
    const int64_t cuts[] = {0, 1, 8, 508, 999, T};
    for (size_t c = 0; c + 1 < sizeof cuts / sizeof cuts[0]; c++)
        mkv_tensor_stats_add(&s, x + cuts[c] * D, cuts[c + 1] - cuts[c]);
    mkv_tensor_summary sum;
    mkv_tensor_stats_summarize(&s, 4.0, &sum);
    ck_assert_int_eq(sum.n_tokens, T);
    ck_assert_double_eq_tol(sum.mean, mean, 1e-12 * fabs(mean));
    ck_assert_double_eq_tol(sum.std, std, 1e-12 * std);
    ck_assert_double_eq(sum.absmax, absmax);
    for (int j = 0; j < D; j++)
        ck_assert_double_eq_tol(s.channel_sumsq[j], rms[j] * rms[j] * T, 1e-9 * rms[j] * rms[j] * T);
    ck_assert_int_eq(sum.outlier_channels, 1); /* channel 5, offset by 20 */

    /* reset starts over: the same data again gives the same summary */
    mkv_tensor_stats_reset(&s);
    mkv_tensor_stats_add(&s, x, T);
    mkv_tensor_summary again;
    mkv_tensor_stats_summarize(&s, 4.0, &again);
    ck_assert_double_eq_tol(again.mean, sum.mean, 1e-12 * fabs(mean));
    ck_assert_double_eq_tol(again.std, sum.std, 1e-12 * std);
    mkv_tensor_stats_free(&s);
}
END_TEST

START_TEST(large_offset_keeps_small_variance)
{
    /* 1e6 + k/16 for k = t mod 8 (exact in float32): mean 1e6 + 3.5/16,
     * variance (1/16)^2 * (8^2 - 1)/12. E[x^2] - E[x]^2 summed in double
     * gets even the sign wrong here (-0.039 instead of 0.0205). */
    enum { T = 4096, D = 4 };
    static float x[T * D];
    for (int t = 0; t < T; t++)
        for (int j = 0; j < D; j++)
            x[t * D + j] = 1e6f + (float)(t % 8) / 16.0f;
    mkv_tensor_stats s;
    ck_assert_int_eq(mkv_tensor_stats_init(&s, D, NULL), MKV_OK);
    mkv_tensor_stats_add(&s, x, 1000);
    mkv_tensor_stats_add(&s, x + 1000 * D, 3);
    mkv_tensor_stats_add(&s, x + 1003 * D, T - 1003);
    mkv_tensor_summary sum;
    mkv_tensor_stats_summarize(&s, 4.0, &sum);
    double want_std = sqrt(63.0 / 12.0) / 16.0;
    ck_assert_double_eq_tol(sum.mean, 1e6 + 3.5 / 16.0, 1e-9);
    ck_assert_double_eq_tol(sum.std, want_std, 1e-9 * want_std);
    mkv_tensor_stats_free(&s);
}
END_TEST

START_TEST(median_odd_and_even)
{
    double odd[] = {5, 1, 3};
    double even[] = {4, 1, 100, 2};
    double one[] = {7};
    ck_assert_double_eq(mkv_median_inplace(odd, 3), 3.0);
    ck_assert_double_eq(mkv_median_inplace(even, 4), 3.0);
    ck_assert_double_eq(mkv_median_inplace(one, 1), 7.0);
}
END_TEST

START_TEST(outlier_rule_is_strict)
{
    /* median of 8 values: (1 + 2) / 2 = 1.5 */
    const double rms[] = {1, 1, 1, 1, 2, 3, 4.5, 9};
    double scratch[8], median = 0;
    ck_assert_int_eq(mkv_count_outlier_channels(rms, 8, 4.0, scratch, &median), 1);  /* > 6 */
    ck_assert_double_eq(median, 1.5);
    ck_assert_int_eq(mkv_count_outlier_channels(rms, 8, 3.0, scratch, NULL), 1);     /* > 4.5: not 4.5 */
    ck_assert_int_eq(mkv_count_outlier_channels(rms, 8, 2.9, scratch, NULL), 2);     /* > 4.35 */
    ck_assert_int_eq(mkv_count_outlier_channels(rms, 8, 6.0, scratch, NULL), 0);     /* > 9: none */
    ck_assert_double_eq(rms[7], 9.0); /* input untouched */
}
END_TEST

START_TEST(summary_channel_rms)
{
    /* x[t][j] = +-s_j: channel RMS is exactly s_j, mean exactly 0 */
    enum { T = 6, D = 8 };
    const float scale[D] = {1, 1, 1, 1, 2, 3, 4.5f, 9};
    float x[T * D];
    for (int t = 0; t < T; t++)
        for (int j = 0; j < D; j++)
            x[t * D + j] = t % 2 ? scale[j] : -scale[j];
    mkv_tensor_stats s;
    ck_assert_int_eq(mkv_tensor_stats_init(&s, D, NULL), MKV_OK);
    mkv_tensor_stats_add(&s, x, T);
    mkv_tensor_summary sum;
    mkv_tensor_stats_summarize(&s, 2.9, &sum);
    ck_assert_double_eq(sum.mean, 0.0);
    ck_assert_double_eq_tol(sum.std, sqrt((4 + 4 + 9 + 20.25 + 81) / 8.0), 1e-14);
    ck_assert_double_eq(sum.absmax, 9.0);
    ck_assert_double_eq(sum.rms_median, 1.5);
    ck_assert_double_eq(sum.rms_max, 9.0);
    ck_assert_int_eq(sum.outlier_channels, 2);
    mkv_tensor_stats_free(&s);
}
END_TEST

START_TEST(init_rejects_bad_head_dim)
{
    mkv_tensor_stats s;
    mkv_error err;
    ck_assert_int_eq(mkv_tensor_stats_init(&s, 0, &err), MKV_EUSAGE);
    ck_assert_str_eq(err.msg, "head_dim must be positive (got 0)");
}
END_TEST

/* A float32 dump longer than one read chunk: mkv_dump_tensor_stats must
 * equal the reference over the values written. */
START_TEST(dump_tensor_stats_over_chunks)
{
    enum { T = 5000, D = 16, KV = 2 };
    mkv_dump_meta meta;
    mkv_dump_meta_init(&meta);
    strcpy(meta.model, "check_stats");
    meta.n_layers = 1;
    meta.n_heads = KV;
    meta.n_kv_heads = KV;
    meta.head_dim = D;
    meta.n_tokens = T;
    meta.n_queries = 0;
    meta.dtype = MKV_DTYPE_F32;
    float *k = malloc(sizeof(float) * KV * T * D), *v = malloc(sizeof(float) * KV * T * D);
    ck_assert_ptr_nonnull(k);
    ck_assert_ptr_nonnull(v);
    uint64_t seed = 7;
    for (int i = 0; i < KV * T * D; i++) {
        k[i] = (float)(test_uniform(&seed) * 4.0 - 1.0);
        v[i] = (float)(test_uniform(&seed) - 0.5);
    }
    char path[256];
    test_path(path, sizeof path, "stats.h5");
    mkv_dump_write_opts opts;
    mkv_dump_write_opts_init(&opts);
    mkv_dump_writer *w;
    mkv_error err;
    ck_assert_msg(mkv_dump_create(path, &meta, &opts, &w, &err) == MKV_OK, "%s", err.msg);
    ck_assert_msg(mkv_dump_write(w, 0, 'k', 0, KV, 0, T, k, &err) == MKV_OK, "%s", err.msg);
    ck_assert_msg(mkv_dump_write(w, 0, 'v', 0, KV, 0, T, v, &err) == MKV_OK, "%s", err.msg);
    ck_assert_msg(mkv_dump_write_query_pos(w, NULL, &err) == MKV_OK, "%s", err.msg);
    ck_assert_msg(mkv_dump_commit(w, &err) == MKV_OK, "%s", err.msg);

    mkv_dump *d;
    ck_assert_msg(mkv_dump_open(path, &d, &err) == MKV_OK, "%s", err.msg);
    mkv_tensor_stats s;
    ck_assert_int_eq(mkv_tensor_stats_init(&s, D, &err), MKV_OK);
    for (int kind = 0; kind < 2; kind++)
        for (int h = 0; h < KV; h++) {
            const float *x = (kind ? v : k) + (size_t)h * T * D;
            double mean, std, absmax, rms[D];
            reference(x, T, D, &mean, &std, &absmax, rms);
            ck_assert_msg(mkv_dump_tensor_stats(d, 0, "kv"[kind], h, &s, &err) == MKV_OK, "%s", err.msg);
            mkv_tensor_summary sum;
            mkv_tensor_stats_summarize(&s, 4.0, &sum);
            ck_assert_int_eq(sum.n_tokens, T);
            ck_assert_double_eq_tol(sum.mean, mean, 1e-12);
            ck_assert_double_eq_tol(sum.std, std, 1e-12 * std);
            ck_assert_double_eq(sum.absmax, absmax);
            double rmax = 0;
            for (int j = 0; j < D; j++)
                rmax = rms[j] > rmax ? rms[j] : rmax;
            ck_assert_double_eq_tol(sum.rms_max, rmax, 1e-12 * rmax);
        }
    mkv_tensor_stats_free(&s);
    mkv_dump_close(d);
    unlink(path);
    free(k);
    free(v);
}
END_TEST

static Suite *stats_suite(void)
{
    Suite *s = suite_create("stats");
    TCase *tc = tcase_create("moments");
    tcase_add_test(tc, hand_computed_two_by_two);
    tcase_add_test(tc, chunks_match_one_pass);
    tcase_add_test(tc, large_offset_keeps_small_variance);
    tcase_add_test(tc, summary_channel_rms);
    tcase_add_test(tc, init_rejects_bad_head_dim);
    suite_add_tcase(s, tc);
    tc = tcase_create("outliers");
    tcase_add_test(tc, median_odd_and_even);
    tcase_add_test(tc, outlier_rule_is_strict);
    suite_add_tcase(s, tc);
    tc = tcase_create("dump");
    tcase_add_test(tc, dump_tensor_stats_over_chunks);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return test_run(stats_suite());
}
