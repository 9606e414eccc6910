/* Tests of the seeded RNG and the synthetic KV generator.
 *
 * References are independent of the code under test: published
 * xoshiro256** and splitmix64 output, libm's log, moments of the normal
 * distribution, and statistics of the generated dumps computed here in
 * double precision from what the dump reader returns (RoPE undone with
 * this file's own rotation, eigenvalues by GSL, softmax over q.k). */
#include "config.h"

#include <gsl/gsl_eigen.h>
#include <gsl/gsl_matrix.h>
#include <gsl/gsl_sort_vector.h>
#include <gsl/gsl_vector.h>
#include <math.h>
#include <sys/stat.h>

#include "io/dump.h"
#include "core/log.h"
#include "core/rng.h"
#include "io/synthetic.h"
#include "testutil.h"

/* ------------------------------------------------------------ RNG */

START_TEST(xoshiro_reference_vector)
{
    /* Blackman & Vigna's reference implementation from state {1,2,3,4}
     * (the vector rand_xoshiro and others test against) */
    static const uint64_t want[10] = {
        11520u, 0u, 1509978240u, 1215971899390074240u, 1216172134540287360u,
        607988272756665600u, 16172922978634559625u, 8476171486693032832u,
        10595114339597558777u, 2904607092377533576u};
    mkv_rng r = {{1, 2, 3, 4}, 0.0, 0};
    for (int i = 0; i < 10; i++)
        ck_assert_uint_eq(mkv_rng_next(&r), want[i]);
}
END_TEST

START_TEST(splitmix_reference_vector)
{
    /* splitmix64 from seed 1234567 (Vigna's splitmix64.c) */
    static const uint64_t want[5] = {6457827717110365317u, 3203168211198807973u,
                                     9817491932198370423u, 4593380528125082431u,
                                     16408922859458223821u};
    uint64_t state = 1234567;
    for (int i = 0; i < 5; i++)
        ck_assert_uint_eq(mkv_splitmix64(&state), want[i]);
}
END_TEST

START_TEST(portable_log_matches_libm)
{
    uint64_t s = 99;
    double worst = 0;
    for (int i = 0; i < 200000; i++) {
        /* log-uniform over the whole double range, subnormals included */
        double x = ldexp(1.0 + test_uniform(&s), (int)(test_rand64(&s) % 2098) - 1074);
        double want = log(x), got = mkv_rng_log(x);
        double err = want == 0 ? fabs(got) : fabs(got - want) / fabs(want);
        if (err > worst)
            worst = err;
    }
    ck_assert_msg(worst <= 4 * DBL_EPSILON, "worst relative error %g", worst);
    ck_assert(mkv_rng_log(1.0) == 0.0);
    ck_assert(fabs(mkv_rng_log(M_E) - 1.0) <= 2 * DBL_EPSILON);
    ck_assert(fabs(mkv_rng_log(0.5) + M_LN2) <= 2 * DBL_EPSILON * M_LN2);
}
END_TEST

START_TEST(uniform_and_below)
{
    mkv_rng r;
    mkv_rng_seed(&r, 7);
    /* the loops count and assert once: an assertion per draw costs Check a
     * write to its parent process each */
    const int n = 200000;
    double sum = 0;
    int outside = 0;
    for (int i = 0; i < n; i++) {
        double u = mkv_rng_uniform(&r);
        outside += !(u >= 0 && u < 1);
        sum += u;
    }
    ck_assert_int_eq(outside, 0);
    /* mean of U(0,1): 1/2, std of the mean sqrt(1/12/n) = 6.5e-4 */
    ck_assert_msg(fabs(sum / n - 0.5) < 0.0033, "mean %g", sum / n);

    int counts[7] = {0};
    uint64_t above = 0;
    for (int i = 0; i < 70000; i++) {
        uint64_t k = mkv_rng_below(&r, 7);
        if (k < 7)
            counts[k]++;
        else
            above++;
    }
    ck_assert_uint_eq(above, 0);
    /* chi-square with 6 degrees of freedom: 22.5 is the 0.999 quantile */
    double chi2 = 0;
    for (int k = 0; k < 7; k++)
        chi2 += (counts[k] - 10000.0) * (counts[k] - 10000.0) / 10000.0;
    ck_assert_msg(chi2 < 22.5, "chi2 %g", chi2);
    ck_assert_uint_eq(mkv_rng_below(&r, 1), 0);
}
END_TEST

START_TEST(normal_moments)
{
    mkv_rng r;
    mkv_rng_seed(&r, 2024);
    const int n = 1000000;
    double m1 = 0, m2 = 0, m4 = 0;
    int within1 = 0;
    for (int i = 0; i < n; i++) {
        double x = mkv_rng_normal(&r);
        m1 += x;
        m2 += x * x;
        m4 += x * x * x * x;
        within1 += fabs(x) < 1;
    }
    m1 /= n;
    m2 /= n;
    m4 /= n;
    /* N(0,1): mean 0, variance 1, fourth moment 3, P(|x|<1) = erf(1/sqrt 2) */
    ck_assert_msg(fabs(m1) < 0.005, "mean %g", m1);
    ck_assert_msg(fabs(m2 - 1) < 0.01, "variance %g", m2);
    ck_assert_msg(fabs(m4 - 3) < 0.06, "fourth moment %g", m4);
    ck_assert_msg(fabs((double)within1 / n - erf(M_SQRT1_2)) < 0.002, "P(|x|<1) %g",
                  (double)within1 / n);
}
END_TEST

START_TEST(streams_are_keyed)
{
    const uint64_t k1[3] = {1, 2, 3}, k2[3] = {1, 2, 4}, k3[3] = {2, 1, 3};
    mkv_rng a, b, c, d, e;
    mkv_rng_seed_stream(&a, 5, k1, 3);
    mkv_rng_seed_stream(&b, 5, k1, 3);
    mkv_rng_seed_stream(&c, 5, k2, 3);
    mkv_rng_seed_stream(&d, 5, k3, 3);
    mkv_rng_seed_stream(&e, 6, k1, 3);
    int same_c = 0, same_d = 0, same_e = 0;
    for (int i = 0; i < 100; i++) {
        uint64_t x = mkv_rng_next(&a);
        ck_assert_uint_eq(x, mkv_rng_next(&b));
        same_c += x == mkv_rng_next(&c);
        same_d += x == mkv_rng_next(&d);
        same_e += x == mkv_rng_next(&e);
    }
    ck_assert_int_eq(same_c + same_d + same_e, 0);
}
END_TEST

/* ------------------------------------------------------------ helpers */

static void small_params(mkv_synthetic_params *p)
{
    mkv_synthetic_params_init(p);
    p->n_layers = 2;
    p->n_heads = 4;
    p->n_kv_heads = 2;
    p->head_dim = 64;
    p->n_tokens = 512;
    p->n_queries = 8;
    p->seed = 11;
    p->dtype = MKV_DTYPE_F32;
}

static void write_or_fail(const mkv_synthetic_params *p, const char *path)
{
    mkv_error err;
    mkv_error_clear(&err);
    int rc = mkv_synthetic_write(p, path, NULL, &err);
    ck_assert_msg(rc == MKV_OK, "mkv_synthetic_write: %s", err.msg);
}

static mkv_dump *open_or_fail(const char *path)
{
    mkv_error err;
    mkv_error_clear(&err);
    mkv_dump *d = NULL;
    int rc = mkv_dump_open(path, &d, &err);
    ck_assert_msg(rc == MKV_OK, "mkv_dump_open: %s", err.msg);
    return d;
}

static float *read_or_fail(mkv_dump *d, int layer, char kind, int head, int64_t n, int dim)
{
    mkv_error err;
    mkv_error_clear(&err);
    float *x = malloc((size_t)n * dim * sizeof *x);
    ck_assert_ptr_nonnull(x);
    int rc = mkv_dump_read(d, layer, kind, head, 1, 0, n, x, &err);
    ck_assert_msg(rc == MKV_OK, "mkv_dump_read: %s", err.msg);
    return x;
}

static unsigned char *slurp(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)n + 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_uint_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *size = (size_t)n;
    return buf;
}

/* Share of the energy of X^T X (rows x, n rows of dim d) in its top k
 * eigenvalues. */
static double top_energy_share(const double *x, int64_t n, int d, int k)
{
    gsl_matrix *c = gsl_matrix_calloc((size_t)d, (size_t)d);
    for (int64_t t = 0; t < n; t++)
        for (int i = 0; i < d; i++)
            for (int j = 0; j <= i; j++)
                *gsl_matrix_ptr(c, (size_t)i, (size_t)j) += x[t * d + i] * x[t * d + j];
    for (int i = 0; i < d; i++)
        for (int j = 0; j < i; j++)
            gsl_matrix_set(c, (size_t)j, (size_t)i, gsl_matrix_get(c, (size_t)i, (size_t)j));
    gsl_vector *ev = gsl_vector_alloc((size_t)d);
    gsl_eigen_symm_workspace *w = gsl_eigen_symm_alloc((size_t)d);
    gsl_eigen_symm(c, ev, w);
    gsl_sort_vector(ev);
    double total = 0, top = 0;
    for (int i = 0; i < d; i++) {
        total += gsl_vector_get(ev, (size_t)i);
        if (i >= d - k)
            top += gsl_vector_get(ev, (size_t)i);
    }
    gsl_eigen_symm_free(w);
    gsl_vector_free(ev);
    gsl_matrix_free(c);
    return top / total;
}

/* Rotate channel pairs (2i, 2i+1) of x back by -t * theta^(-2i/d). */
static void unrope(double *x, int d, double theta, int64_t t)
{
    for (int i = 0; i < d / 2; i++) {
        double a = -(double)t * pow(theta, -2.0 * i / d);
        double x0 = x[2 * i], x1 = x[2 * i + 1];
        x[2 * i] = x0 * cos(a) - x1 * sin(a);
        x[2 * i + 1] = x0 * sin(a) + x1 * cos(a);
    }
}

/* ------------------------------------------------------------ generator */

static void print_problem(void *ctx, const char *problem)
{
    (void)ctx;
    fprintf(stderr, "validate: %s\n", problem);
}

START_TEST(shape_and_attributes)
{
    mkv_synthetic_params p;
    small_params(&p);
    p.rope_theta = 500000;
    snprintf(p.model, sizeof p.model, "tiny-test");
    p.dtype = MKV_DTYPE_BF16;
    char path[256];
    test_path(path, sizeof path, "shape.h5");
    write_or_fail(&p, path);
    mkv_dump *d = open_or_fail(path);
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    ck_assert_int_eq(m->n_layers, 2);
    ck_assert_int_eq(m->n_heads, 4);
    ck_assert_int_eq(m->n_kv_heads, 2);
    ck_assert_int_eq(m->head_dim, 64);
    ck_assert_int_eq(m->n_tokens, 512);
    ck_assert_int_eq(m->n_queries, 8);
    ck_assert(m->rope_theta == 500000);
    ck_assert_str_eq(m->model, "tiny-test");
    ck_assert_str_eq(m->k_rope, "post");
    ck_assert_str_eq(m->source, "synthetic");
    ck_assert_int_eq(m->has_tokens, 0);
    ck_assert_int_eq(m->dtype, MKV_DTYPE_BF16);
    int32_t qpos[8];
    mkv_error err;
    ck_assert_int_eq(mkv_dump_read_query_pos(d, qpos, &err), MKV_OK);
    for (int w = 0; w < 8; w++)
        ck_assert_int_eq(qpos[w], 512 - 8 + w);
    mkv_dump_close(d);
    ck_assert_int_eq(mkv_dump_validate(path, print_problem, NULL, &err), 0);
    unlink(path);
}
END_TEST

START_TEST(same_seed_same_bytes)
{
    mkv_synthetic_params p;
    small_params(&p);
    p.dtype = MKV_DTYPE_F16;
    char a[256], b[256], c[256];
    test_path(a, sizeof a, "seed-a.h5");
    test_path(b, sizeof b, "seed-b.h5");
    test_path(c, sizeof c, "seed-c.h5");
    write_or_fail(&p, a);
    write_or_fail(&p, b);
    p.seed++;
    write_or_fail(&p, c);
    size_t na, nb, nc;
    unsigned char *fa = slurp(a, &na), *fb = slurp(b, &nb), *fc = slurp(c, &nc);
    ck_assert_uint_eq(na, nb);
    ck_assert_msg(memcmp(fa, fb, na) == 0, "same seed gave different files");
    ck_assert_msg(na != nc || memcmp(fa, fc, na) != 0, "seeds 11 and 12 gave the same file");
    free(fa);
    free(fb);
    free(fc);
    unlink(a);
    unlink(b);
    unlink(c);
}
END_TEST

START_TEST(outlier_channels)
{
    mkv_synthetic_params p;
    small_params(&p);
    char path[256];
    test_path(path, sizeof path, "outliers.h5");
    write_or_fail(&p, path);
    mkv_dump *d = open_or_fail(path);
    const int dim = 64;
    const int64_t T = 512;
    for (int l = 0; l < 2; l++)
        for (int h = 0; h < 2; h++) {
            int out[64];
            int n = mkv_synthetic_outliers(&p, l, h, out);
            ck_assert_int_eq(n, 4);
            float *k = read_or_fail(d, l, 'k', h, T, dim);
            double mean_abs[64] = {0}, sorted[64];
            for (int64_t t = 0; t < T; t++)
                for (int c = 0; c < dim; c++)
                    mean_abs[c] += fabs(k[t * dim + c]) / T;
            memcpy(sorted, mean_abs, sizeof sorted);
            for (int i = 1; i < dim; i++)   /* insertion sort for the median */
                for (int j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) {
                    double tmp = sorted[j];
                    sorted[j] = sorted[j - 1];
                    sorted[j - 1] = tmp;
                }
            double median = 0.5 * (sorted[31] + sorted[32]);
            int is_out[64] = {0}, near_out[64] = {0};
            for (int i = 0; i < n; i++) {
                is_out[out[i]] = 1;
                near_out[out[i] ^ 1] = 1;   /* RoPE partner */
                ck_assert_msg(mean_abs[out[i]] > 4 * median,
                              "layer %d head %d channel %d: mean |k| %g, median %g", l, h, out[i],
                              mean_abs[out[i]], median);
            }
            for (int c = 0; c < dim; c++)
                if (!is_out[c] && !near_out[c])
                    ck_assert_msg(mean_abs[c] < 2 * median, "channel %d: %g (median %g)", c,
                                  mean_abs[c], median);
            free(k);
        }
    mkv_dump_close(d);
    unlink(path);
}
END_TEST

START_TEST(low_effective_rank)
{
    mkv_synthetic_params p;
    small_params(&p);
    p.n_queries = 2;   /* few targets: their salient parts add rank */
    char path[256];
    test_path(path, sizeof path, "rank.h5");
    write_or_fail(&p, path);
    mkv_dump *d = open_or_fail(path);
    const int dim = 64, r = p.rank;   /* rank 8 < head_dim */
    const int64_t T = 512;
    unsigned char target[512] = {0};
    int64_t pos[16];
    for (int hq = 0; hq < 2; hq++)   /* query heads of KV head 0 */
        for (int w = 0; w < 2; w++) {
            int n = mkv_synthetic_targets(&p, 0, hq, w, pos);
            for (int i = 0; i < n; i++)
                target[pos[i]] = 1;
        }
    float *k = read_or_fail(d, 0, 'k', 0, T, dim);
    float *v = read_or_fail(d, 0, 'v', 0, T, dim);
    double *pre = calloc((size_t)T * dim, sizeof *pre), *post = calloc((size_t)T * dim, sizeof *post),
           *vv = calloc((size_t)T * dim, sizeof *vv);
    int64_t rows = 0;
    for (int64_t t = 0; t < T; t++) {
        for (int c = 0; c < dim; c++)
            vv[t * dim + c] = v[t * dim + c];
        if (target[t])
            continue;
        for (int c = 0; c < dim; c++)
            pre[rows * dim + c] = post[rows * dim + c] = k[t * dim + c];
        unrope(pre + rows * dim, dim, p.rope_theta, t);
        rows++;
    }
    /* rank r latent + the outliers' fixed offset; RoPE spreads the energy */
    double pre_share = top_energy_share(pre, rows, dim, r + 1);
    double post_share = top_energy_share(post, rows, dim, r + 1);
    double v_share = top_energy_share(vv, T, dim, r);
    ck_assert_msg(pre_share > 0.97, "pre-RoPE keys: top %d share %g", r + 1, pre_share);
    ck_assert_msg(post_share < pre_share - 0.02, "post-RoPE share %g vs pre %g", post_share, pre_share);
    ck_assert_msg(v_share > 0.97, "values: top %d share %g", r, v_share);
    free(k);
    free(v);
    free(pre);
    free(post);
    free(vv);
    mkv_dump_close(d);
    unlink(path);
}
END_TEST

START_TEST(value_token_scale)
{
    /* The same parameters with and without the per-token value scale draw
     * the same latent values, so v_on / v_off must be one factor per token
     * (equal over channels) whose log has standard deviation value_sigma. */
    float *v[2];
    mkv_synthetic_params p;
    for (int on = 0; on < 2; on++) {
        small_params(&p);
        p.value_sigma = on ? 0.5 : 0.0;
        char path[256];
        test_path(path, sizeof path, "vscale.h5");
        write_or_fail(&p, path);
        mkv_dump *d = open_or_fail(path);
        v[on] = read_or_fail(d, 1, 'v', 1, 512, 64);
        mkv_dump_close(d);
        unlink(path);
    }
    double s = 0, s2 = 0;
    for (int t = 0; t < 512; t++) {
        double ratio = (double)v[1][t * 64] / v[0][t * 64];
        for (int c = 1; c < 64; c++)
            ck_assert_msg(fabs((double)v[1][t * 64 + c] / v[0][t * 64 + c] - ratio) < 1e-5 * ratio,
                          "token %d: channel %d scaled differently", t, c);
        ck_assert(ratio > 0);
        s += log(ratio);
        s2 += log(ratio) * log(ratio);
    }
    double sd = sqrt(s2 / 512 - (s / 512) * (s / 512));
    /* sample std of 512 normals: 0.5 +- 0.016 */
    ck_assert_msg(fabs(sd - 0.5) < 0.06, "std of log scale %g", sd);
    ck_assert_msg(fabs(s / 512) < 0.08, "mean of log scale %g", s / 512);
    free(v[0]);
    free(v[1]);
}
END_TEST

/* Softmax mass on the ground-truth targets for every query of a dump. */
static void check_attention(mkv_dtype dtype, double tol)
{
    mkv_synthetic_params p;
    small_params(&p);
    p.dtype = dtype;
    char path[256];
    test_path(path, sizeof path, "attn.h5");
    write_or_fail(&p, path);
    mkv_dump *d = open_or_fail(path);
    const int dim = 64, G = 2, W = 8;
    const int64_t T = 512;
    double *logit = malloc(T * sizeof *logit);
    for (int l = 0; l < 2; l++)
        for (int hq = 0; hq < 4; hq++) {
            float *k = read_or_fail(d, l, 'k', hq / G, T, dim);   /* grouped-query attention */
            float *q = read_or_fail(d, l, 'q', hq, W, dim);
            for (int w = 0; w < W; w++) {
                int64_t pos = T - W + w, tg[16];
                int n = mkv_synthetic_targets(&p, l, hq, w, tg);
                ck_assert_int_eq(n, 4);
                ck_assert_int_eq(tg[0], 0);   /* the sink */
                for (int i = 0; i < n; i++) {
                    ck_assert(tg[i] >= 0 && tg[i] <= pos);
                    for (int j = 0; j < i; j++)
                        ck_assert(tg[i] != tg[j]);
                }
                double mx = -INFINITY;
                for (int64_t t = 0; t <= pos; t++) {
                    double s = 0;
                    for (int c = 0; c < dim; c++)
                        s += (double)q[w * dim + c] * k[t * dim + c];
                    logit[t] = s / sqrt((double)dim);
                    if (logit[t] > mx)
                        mx = logit[t];
                }
                double total = 0, on = 0;
                for (int64_t t = 0; t <= pos; t++)
                    total += exp(logit[t] - mx);
                for (int i = 0; i < n; i++)
                    on += exp(logit[tg[i]] - mx);
                ck_assert_msg(fabs(on / total - p.attn_mass) < tol,
                              "layer %d head %d query %d: mass on targets %g, wanted %g", l, hq, w,
                              on / total, p.attn_mass);
            }
            free(k);
            free(q);
        }
    free(logit);
    mkv_dump_close(d);
    unlink(path);
}

START_TEST(queries_attend_to_targets_f32) { check_attention(MKV_DTYPE_F32, 0.002); }
END_TEST

START_TEST(queries_attend_to_targets_f16) { check_attention(MKV_DTYPE_F16, 0.03); }
END_TEST

START_TEST(no_queries)
{
    mkv_synthetic_params p;
    small_params(&p);
    p.n_queries = 0;
    p.n_tokens = 3;
    char path[256];
    test_path(path, sizeof path, "noq.h5");
    write_or_fail(&p, path);
    mkv_dump *d = open_or_fail(path);
    ck_assert_int_eq(mkv_dump_meta_of(d)->n_queries, 0);
    ck_assert_int_eq(mkv_dump_meta_of(d)->n_tokens, 3);
    mkv_dump_close(d);
    unlink(path);
}
END_TEST

START_TEST(bad_parameters)
{
    mkv_synthetic_params base, p;
    small_params(&base);
    mkv_error err;
    int count = test_count_entries(test_tmpdir());

#define EXPECT_BAD(stmt, fragment)                                                     \
    do {                                                                               \
        p = base;                                                                      \
        stmt;                                                                          \
        mkv_error_clear(&err);                                                         \
        ck_assert_int_eq(mkv_synthetic_check(&p, &err), MKV_EUSAGE);                   \
        ck_assert_msg(strstr(err.msg, fragment), "'%s' lacks '%s'", err.msg, fragment); \
        char path[256];                                                                \
        test_path(path, sizeof path, "bad.h5");                                        \
        ck_assert_int_eq(mkv_synthetic_write(&p, path, NULL, &err), MKV_EUSAGE);       \
    } while (0)

    EXPECT_BAD(p.n_heads = 6; p.n_kv_heads = 4, "not a multiple");
    EXPECT_BAD(p.head_dim = 63, "even");
    EXPECT_BAD(p.n_queries = p.n_tokens + 1, "n_queries");
    EXPECT_BAD(p.n_tokens = 0, "n_tokens");
    EXPECT_BAD(p.n_layers = 0, "n_layers");
    EXPECT_BAD(p.rank = 0, "rank");
    EXPECT_BAD(p.attn_mass = 1.0, "attn_mass");
    EXPECT_BAD(p.noise = -1, "noise");
    EXPECT_BAD(p.rope_theta = 0, "rope_theta");
    EXPECT_BAD(p.n_targets = 0, "n_targets");
#undef EXPECT_BAD
    /* nothing was written */
    ck_assert_int_eq(test_count_entries(test_tmpdir()), count);
    /* and the ground truth refuses them too */
    p = base;
    p.head_dim = 63;
    int ch[64];
    int64_t tg[8];
    ck_assert_int_eq(mkv_synthetic_outliers(&p, 0, 0, ch), -1);
    ck_assert_int_eq(mkv_synthetic_targets(&p, 0, 0, 0, tg), -1);
    ck_assert_int_eq(mkv_synthetic_targets(&base, 0, 0, base.n_queries, tg), -1);
}
END_TEST

START_TEST(set_by_name)
{
    mkv_synthetic_params p;
    mkv_synthetic_params_init(&p);
    mkv_error err;
    ck_assert_int_eq(mkv_synthetic_set(&p, "rank", "16", &err), MKV_OK);
    ck_assert_int_eq(p.rank, 16);
    ck_assert_int_eq(mkv_synthetic_set(&p, "attn_mass", "0.5", &err), MKV_OK);
    ck_assert(p.attn_mass == 0.5);
    ck_assert_int_eq(mkv_synthetic_set(&p, "seed", "18446744073709551615", &err), MKV_OK);
    ck_assert_uint_eq(p.seed, UINT64_MAX);
    ck_assert_int_eq(mkv_synthetic_set(&p, "outliers", "2", &err), MKV_OK);
    ck_assert_int_eq(p.n_outliers, 2);
    ck_assert_int_eq(mkv_synthetic_set(&p, "rank", "4x", &err), MKV_EUSAGE);
    ck_assert_str_eq(err.msg, "invalid value '4x' for rank: not an integer");
    ck_assert_int_eq(mkv_synthetic_set(&p, "noise", "nan", &err), MKV_EUSAGE);
    ck_assert_int_eq(mkv_synthetic_set(&p, "seed", "-1", &err), MKV_EUSAGE);
    ck_assert_int_eq(mkv_synthetic_set(&p, "colour", "1", &err), MKV_EUSAGE);
    ck_assert(strstr(err.msg, "unknown synthetic parameter 'colour'"));
    ck_assert_int_eq(p.rank, 16);
}
END_TEST

static Suite *synthetic_suite(void)
{
    Suite *s = suite_create("synthetic");
    TCase *rng = tcase_create("rng");
    tcase_set_timeout(rng, 30);
    tcase_add_test(rng, xoshiro_reference_vector);
    tcase_add_test(rng, splitmix_reference_vector);
    tcase_add_test(rng, portable_log_matches_libm);
    tcase_add_test(rng, uniform_and_below);
    tcase_add_test(rng, normal_moments);
    tcase_add_test(rng, streams_are_keyed);
    suite_add_tcase(s, rng);

    TCase *gen = tcase_create("generator");
    tcase_set_timeout(gen, 60);
    tcase_add_test(gen, shape_and_attributes);
    tcase_add_test(gen, same_seed_same_bytes);
    tcase_add_test(gen, outlier_channels);
    tcase_add_test(gen, low_effective_rank);
    tcase_add_test(gen, value_token_scale);
    tcase_add_test(gen, queries_attend_to_targets_f32);
    tcase_add_test(gen, queries_attend_to_targets_f16);
    tcase_add_test(gen, no_queries);
    tcase_add_test(gen, bad_parameters);
    tcase_add_test(gen, set_by_name);
    suite_add_tcase(s, gen);
    return s;
}

int main(void)
{
    mkv_log_init("check_synthetic");
    test_tmpdir();   /* made here, so forked tests share it and it is removed below */
    int rc = test_run(synthetic_suite());
    rmdir(test_tmpdir());
    return rc;
}
