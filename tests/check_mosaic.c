/* Unit tests of MosaicKV (lib/mosaic/mosaic.c, lib/mosaic/method.c,
 * lib/mosaic/packed.c, lib/mosaic/uniform2d.c). References are hand-worked vectors and byte
 * counts written out below, and double-precision computations done here
 * from the stored arrays with this file's own decoding (bit loops, offsets
 * summed here), never the library's answer read back. */
#include "config.h"

#include <math.h>
#include <pthread.h>

#include <hdf5.h>

#include "core/attn.h"
#include "io/cdump.h"
#include "core/eigen.h"
#include "core/half.h"
#include "core/rng.h"
#include "methods/method.h"
#include "mosaic/packed.h"
#include "mosaic/mosaic.h"
#include "testutil.h"

/* ---------------------------------------------------------------- data */

static double gauss(uint64_t *s)
{
    double u = test_uniform(s), v = test_uniform(s);
    return sqrt(-2 * log(u + 1e-300)) * cos(2 * M_PI * v);
}

/* KV-like rows [T][d]: rank-4 latent part with decaying scales, an
 * offset outlier channel, isotropic noise, fp16-representable. */
static void gen_rows(uint64_t seed, int64_t T, int d, double offset, float *x)
{
    uint64_t s = seed;
    double A[4][MKV_MOSAIC_MAX_D];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < d; j++)
            A[i][j] = gauss(&s) / (i + 1);
    for (int64_t t = 0; t < T; t++) {
        double z[4];
        for (int i = 0; i < 4; i++)
            z[i] = gauss(&s) * (1 + 0.5 * sin((double)t / 37));
        for (int j = 0; j < d; j++) {
            double v = 0.1 * gauss(&s) + (j == 1 ? offset : 0);
            for (int i = 0; i < 4; i++)
                v += z[i] * A[i][j];
            x[t * d + j] = mkv_f16_to_f32(mkv_f32_to_f16((float)v));
        }
    }
}

/* Queries [G][d] aimed at a few keys (so attention is peaked). */
static void gen_queries(uint64_t seed, const float *k, int64_t upto, int d, int G, float *q)
{
    uint64_t s = seed;
    for (int g = 0; g < G; g++) {
        int64_t t1 = (int64_t)(test_uniform(&s) * (double)upto), t2 = (int64_t)(test_uniform(&s) * (double)upto);
        for (int j = 0; j < d; j++)
            q[g * d + j] = (float)(0.8 * (k[t1 * d + j] + k[t2 * d + j]) + 0.3 * gauss(&s));
    }
}

typedef struct {
    int64_t T;
    int d, G;
    int64_t W;
    float *k, *v, *q;      /* q: observation queries [G][W][d] */
    int32_t *qpos;
} head_data;

static void head_data_make(head_data *h, uint64_t seed, int64_t T, int d, int G, int64_t W)
{
    h->T = T;
    h->d = d;
    h->G = G;
    h->W = W;
    h->k = malloc(sizeof(float) * (size_t)(T * d));
    h->v = malloc(sizeof(float) * (size_t)(T * d));
    h->q = malloc(sizeof(float) * (size_t)(G * (W ? W : 1) * d));
    h->qpos = malloc(sizeof(int32_t) * (size_t)(W ? W : 1));
    ck_assert(h->k && h->v && h->q && h->qpos);
    gen_rows(seed, T, d, 3.0, h->k);
    gen_rows(seed + 100, T, d, 0.0, h->v);
    for (int64_t w = 0; w < W; w++) {
        h->qpos[w] = (int32_t)(T - W + w);
        float qq[8 * MKV_MOSAIC_MAX_D];
        gen_queries(seed + 200 + (uint64_t)w, h->k, T, d, G, qq);
        for (int g = 0; g < G; g++)
            memcpy(h->q + ((size_t)g * W + w) * d, qq + g * d, sizeof(float) * (size_t)d);
    }
}

static void head_data_free(head_data *h)
{
    free(h->k);
    free(h->v);
    free(h->q);
    free(h->qpos);
}

static mkv_head_kv as_input(const head_data *h)
{
    mkv_head_kv in = {.layer = 0, .head = 0, .T = h->T, .d = h->d, .G = h->G, .k = h->k, .v = h->v,
                      .W = h->W, .q = h->W ? h->q : NULL, .query_pos = h->qpos, .threads = 1};
    return in;
}

/* A fixed strategy with block keys over half the channels, two of them
 * bounds, and the attention the compressor simulates at budget 0.2. */
static mkv_mosaic_config fixed_config(int d, double keep, int g, double energy)
{
    mkv_mosaic_config c = {.sink = 4, .recent = 16, .segment = 100, .block = 8, .keydim = d / 2, .bound = 2,
                           .dynamic = 0, .rotate = 1, .r = mkv_mosaic_kept(keep, d), .g = g,
                           .energy = energy, .threshold = 0.1, .pervector = 1, .bits = 16,
                           .attn = {.budget = 0.2, .agg_sum = 0}};
    return c;
}

/* ---------------------------------------------------------------- reference decoding */

static int ref_bitmap_bytes(const mkv_mosaic_strategy *s)
{
    return s->pervector && s->r < s->dprime ? (s->dprime / s->g + 7) / 8 : 0;
}

/* Stored rotation columns: keys keep max(d', keydim), values d'. */
static int ref_rot_cols(const mkv_mosaic_strategy *s, int is_key)
{
    if (!s->rotate)
        return 0;
    return is_key && s->keydim > s->dprime ? s->keydim : s->dprime;
}

/* Kept channels of one vector from its bitmap, by a plain bit loop. */
static int ref_positions(const uint8_t *bm, const mkv_mosaic_strategy *s, int *pos)
{
    int n = 0;
    if (!ref_bitmap_bytes(s)) {
        for (int c = 0; c < s->r; c++)
            pos[n++] = c;
        return n;
    }
    for (int grp = 0; grp < s->dprime / s->g; grp++)
        if (bm[grp / 8] & (1 << (grp % 8)))
            for (int c = 0; c < s->g; c++)
                pos[n++] = grp * s->g + c;
    return n;
}

/* The k-th b-bit code of a vector, bit k*b of the bytes, LSB first. */
static unsigned ref_code(const uint8_t *bytes, int k, int b)
{
    unsigned c = 0;
    for (int i = 0; i < b; i++) {
        int at = k * b + i;
        c |= (unsigned)((bytes[at / 8] >> (at % 8)) & 1) << i;
    }
    return c;
}

/* Offsets of segment s's part of a tensor's arrays, summed over the
 * segments before it here (not the library's layout). */
typedef struct {
    int64_t values, codes, qparams;
} ref_offsets;

static void ref_advance(const mkv_mosaic_strategy *st, ref_offsets *o)
{
    if (st->bits == 16) {
        o->values += st->len * st->r;
        return;
    }
    int64_t per = st->qgroup ? st->qgroup : st->len;
    o->codes += st->len * ((st->r * st->bits + 7) / 8);
    o->qparams += 2 * st->dprime * ((st->len + per - 1) / per);
}

/* Value m of vector i of a segment at offsets o, channel pos: fp16 as
 * stored, or fp16(zero + code x step) of its token group's zero and step. */
static double ref_value(const mkv_mosaic_tensor *t, const mkv_mosaic_strategy *st, const ref_offsets *o,
                        int64_t i, int m, int pos)
{
    if (st->bits == 16)
        return mkv_f16_to_f32(t->values[o->values + i * st->r + m]);
    int64_t per = st->qgroup ? st->qgroup : st->len;
    const uint16_t *qp = t->qparams + o->qparams + 2 * (i / per) * st->dprime;
    unsigned code = ref_code(t->codes + o->codes + i * ((st->r * st->bits + 7) / 8), m, st->bits);
    double zero = mkv_f16_to_f32(qp[2 * pos]), step = mkv_f16_to_f32(qp[2 * pos + 1]);
    return mkv_f16_to_f32(mkv_f32_to_f16((float)(zero + (double)code * step)));
}

/* X^ [T][d] in double: dense rows as stored, compressed rows as
 * (sparse x~) R^T from the stored values (or codes), bitmaps and
 * rotations, with offsets summed here. */
static void ref_reconstruct(const mkv_mosaic_head *h, const mkv_mosaic_tensor *t, const uint16_t *dense,
                            int is_key, double *X)
{
    int d = h->d;
    for (int64_t i = 0; i < h->sink_n + h->recent_n; i++) {
        int64_t tok = i < h->sink_n ? i : h->T - h->recent_n + (i - h->sink_n);
        for (int j = 0; j < d; j++)
            X[tok * d + j] = mkv_f16_to_f32(dense[i * d + j]);
    }
    int64_t ob = 0, orot = 0;
    ref_offsets ov = {0, 0, 0};
    for (int64_t s = 0; s < t->nseg; s++) {
        const mkv_mosaic_strategy *st = &t->seg[s];
        int bb = ref_bitmap_bytes(st), pos[MKV_MOSAIC_MAX_D], cols = ref_rot_cols(st, is_key);
        const uint16_t *R = st->rotate ? t->rotation + orot : NULL;
        double val[MKV_MOSAIC_MAX_D];
        for (int64_t i = 0; i < st->len; i++) {
            int n = ref_positions(bb ? t->bitmap + ob + i * bb : NULL, st, pos);
            ck_assert_int_eq(n, st->r);
            for (int m = 0; m < st->r; m++)
                val[m] = ref_value(t, st, &ov, i, m, pos[m]);
            double *x = X + (st->start + i) * d;
            for (int j = 0; j < d; j++) {
                double acc = 0;
                for (int m = 0; m < st->r; m++)
                    acc += R ? val[m] * (double)mkv_f16_to_f32(R[j * cols + pos[m]]) : (pos[m] == j ? val[m] : 0);
                x[j] = acc;
            }
        }
        ref_advance(st, &ov);
        ob += st->len * bb;
        orot += (int64_t)d * cols;
    }
}

/* Softmax attention in double of q [G][d] over the rows with mask set. */
static void ref_attend(const double *K, const double *V, int64_t n, int d, const uint8_t *mask,
                       const float *q, int G, double scale, double *out)
{
    for (int g = 0; g < G; g++) {
        double m = -INFINITY, l = 0;
        double *o = out + g * d;
        for (int j = 0; j < d; j++)
            o[j] = 0;
        for (int64_t t = 0; t < n; t++)
            if (!mask || mask[t]) {
                double s = 0;
                for (int j = 0; j < d; j++)
                    s += q[g * d + j] * K[t * d + j];
                if (s * scale > m)
                    m = s * scale;
            }
        for (int64_t t = 0; t < n; t++)
            if (!mask || mask[t]) {
                double s = 0;
                for (int j = 0; j < d; j++)
                    s += q[g * d + j] * K[t * d + j];
                double w = exp(s * scale - m);
                l += w;
                for (int j = 0; j < d; j++)
                    o[j] += w * V[t * d + j];
            }
        for (int j = 0; j < d; j++)
            o[j] /= l;
    }
}

static double rel_err(const float *a, const double *ref, int n)
{
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        num += (a[i] - ref[i]) * (a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / den);
}

/* ---------------------------------------------------------------- rotation */

START_TEST(rotation_orthonormal_and_sorted)
{
    enum { N = 300, D = 16 };
    float X[N * D];
    gen_rows(7, N, D, 2.0, X);
    double R[D * D], ev[D], C[D * D] = {0};
    mkv_error err;
    ck_assert_int_eq(mkv_mosaic_rotation(X, N, D, R, ev, &err), MKV_OK);
    for (int64_t t = 0; t < N; t++)
        for (int i = 0; i < D; i++)
            for (int j = 0; j < D; j++)
                C[i * D + j] += (double)X[t * D + i] * X[t * D + j];
    for (int a = 0; a < D; a++) {
        for (int b = 0; b < D; b++) {
            double dot = 0;
            for (int i = 0; i < D; i++)
                dot += R[i * D + a] * R[i * D + b];
            ck_assert_double_eq_tol(dot, a == b, 1e-10);
        }
        /* column a is an eigenvector of X^T X with eigenvalue ev[a] */
        double rq = 0, scale = 0;
        for (int i = 0; i < D; i++) {
            double ci = 0;
            for (int j = 0; j < D; j++)
                ci += C[i * D + j] * R[j * D + a];
            rq += R[i * D + a] * ci;
            scale += fabs(ci);
        }
        ck_assert_double_eq_tol(rq, ev[a], 1e-9 * ev[0]);
        for (int i = 0; i < D; i++) {
            double ci = 0;
            for (int j = 0; j < D; j++)
                ci += C[i * D + j] * R[j * D + a];
            ck_assert_double_le(fabs(ci - ev[a] * R[i * D + a]), 1e-9 * ev[0]);
        }
        if (a > 0)
            ck_assert_double_ge(ev[a - 1], ev[a]);
    }
    /* fp16 rounding moves each element by at most half an fp16 step */
    double R16[D * D];
    memcpy(R16, R, sizeof R);
    mkv_mosaic_round_f16(R16, D * D);
    for (int i = 0; i < D * D; i++)
        ck_assert_double_le(fabs(R16[i] - R[i]), fabs(R[i]) * 0x1p-11 + 0x1p-25);
}
END_TEST

START_TEST(dprime_by_energy_hand_count)
{
    /* eigenvalues 32, 31, ..., 1: sum 528. Energy 0.5 wants 264: the first
     * 9 hold 288 - 36 = 252, the first 10 hold 320 - 45 = 275, so 10
     * channels, rounded up to 16. */
    double ev[32];
    for (int i = 0; i < 32; i++)
        ev[i] = 32 - i;
    ck_assert_int_eq(mkv_mosaic_dprime_for_energy(ev, 32, 0.5, 1), 16);
    ck_assert_int_eq(mkv_mosaic_dprime_for_energy(ev, 32, 0.5, 20), 24);   /* at least r */
    ck_assert_int_eq(mkv_mosaic_dprime_for_energy(ev, 32, 1.0, 1), 32);
    ck_assert_int_eq(mkv_mosaic_dprime_for_energy(ev, 32, 0.05, 1), 8);    /* 32 >= 26.4 */
    ev[2] = 0;   /* rank 2 of 3: all energy in 2 channels, rounded to 8, capped at d */
    ck_assert_int_eq(mkv_mosaic_dprime_for_energy(ev, 3, 1.0, 1), 3);
    /* by fraction: ceil(f d), at least r, a multiple of g, at most d */
    ck_assert_int_eq(mkv_mosaic_dprime_of_fraction(0.5, 128, 32, 1), 64);
    ck_assert_int_eq(mkv_mosaic_dprime_of_fraction(0.3, 32, 4, 1), 10);     /* 9.6 */
    ck_assert_int_eq(mkv_mosaic_dprime_of_fraction(0.3, 32, 4, 4), 12);
    ck_assert_int_eq(mkv_mosaic_dprime_of_fraction(0.1, 32, 8, 2), 8);      /* r over 3.2 */
    ck_assert_int_eq(mkv_mosaic_dprime_of_fraction(1.0, 30, 4, 4), 30);     /* capped at d */
}
END_TEST

/* ---------------------------------------------------------------- selection */

START_TEST(select_hand_made_vector)
{
    const double x[8] = {0.5, -3, 0.1, 2, -0.2, 1.5, 0, -1};
    int pos[8];
    uint8_t bm[1];
    /* g = 1, r = 3: |x| largest at channels 1 (3), 3 (2), 5 (1.5); the
     * dropped five (0.5, 0.1, 0.2, 0, 1) are all smaller than 1.5. */
    mkv_mosaic_strategy s = {.len = 1, .rotate = 0, .r = 3, .g = 1, .dprime = 8, .pervector = 1, .bits = 16};
    ck_assert_int_eq(mkv_mosaic_bitmap_bytes(&s), 1);
    double kept = mkv_mosaic_select(x, &s, pos, bm);
    ck_assert_int_eq(bm[0], 0x2a);   /* bits 1, 3, 5 */
    ck_assert_int_eq(pos[0], 1);
    ck_assert_int_eq(pos[1], 3);
    ck_assert_int_eq(pos[2], 5);
    ck_assert_double_eq_tol(kept, 9 + 4 + 2.25, 1e-15);
    /* g = 2, r = 4: group energies 9.25, 4.01, 2.29, 1 -> groups 0 and 1 */
    s.g = 2;
    s.r = 4;
    mkv_mosaic_select(x, &s, pos, bm);
    ck_assert_int_eq(bm[0], 0x03);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(pos[i], i);
    /* g = 4, r = 4: groups 13.26 and 3.29 -> the first; 2 bits, one byte */
    s.g = 4;
    mkv_mosaic_select(x, &s, pos, bm);
    ck_assert_int_eq(bm[0], 0x01);
    /* d' = 4 of the same vector, g = 1, r = 2: only channels 0..3 compete */
    mkv_mosaic_strategy t = {.len = 1, .r = 2, .g = 1, .dprime = 4, .pervector = 1, .bits = 16};
    mkv_mosaic_select(x, &t, pos, bm);
    ck_assert_int_eq(bm[0], 0x0a);   /* channels 1 (3) and 3 (2) */
    /* ties go to the lower channel */
    const double tie[4] = {1, -1, 1, 0.5};
    mkv_mosaic_select(tie, &t, pos, bm);
    ck_assert_int_eq(bm[0], 0x03);
    /* positions come back from the bitmap */
    uint8_t pattern[1] = {0x2a};
    int back[8];
    ck_assert_int_eq(mkv_mosaic_positions(pattern, &s, back), 4); /* g=4, r=4: group 1 -> 4..7 */
    s.g = 1;
    s.r = 3;
    ck_assert_int_eq(mkv_mosaic_positions(pattern, &s, back), 3);
    ck_assert_int_eq(back[0], 1);
    ck_assert_int_eq(back[2], 5);
}
END_TEST

/* Codes read back as the format defines them (ref_code, fp16 of zero +
 * code x step in double), by the library's vector path and its scalar
 * path, bit for bit: random codes at every width, scattered channels and
 * the first r in a row, zeros and steps from fp16 subnormals to values
 * whose sums overflow fp16. */
START_TEST(dequantize_vector_equals_reference)
{
    mkv_rng rng;
    mkv_rng_seed(&rng, 77);
    static const int widths[] = {8, 4, 2};
    for (int trial = 0; trial < 400; trial++) {
        int bits = widths[trial % 3], dprime = 8 + (int)mkv_rng_below(&rng, 121);
        int r = 1 + (int)mkv_rng_below(&rng, (uint64_t)dprime), pos[128], n = 0;
        for (int c = 0; c < dprime && n < r; c++)   /* r ascending channels of dprime */
            if (trial % 4 == 3 || mkv_rng_below(&rng, (uint64_t)(dprime - c)) < (uint64_t)(r - n))
                pos[n++] = c;   /* every fourth trial: the first r, as without a bitmap */
        uint16_t qp[2 * 128];
        for (int c = 0; c < dprime; c++) {
            double mag = ldexp(1.0, (int)mkv_rng_below(&rng, 46) - 30);   /* 2^-30 .. 2^15 */
            qp[2 * c] = mkv_f32_to_f16((float)((mkv_rng_uniform(&rng) - 0.5) * mag));
            qp[2 * c + 1] = mkv_f32_to_f16((float)(mkv_rng_uniform(&rng) * mag / 16));
        }
        uint8_t packed[128];
        int nbytes = (r * bits + 7) / 8;
        for (int i = 0; i < nbytes; i++)
            packed[i] = (uint8_t)mkv_rng_below(&rng, 256);
        if (r * bits % 8)
            packed[nbytes - 1] &= (uint8_t)((1u << (r * bits % 8)) - 1);   /* pad bits zero */
        float fast[128], scalar[128];
        mkv_mosaic_dequantize_vector(packed, bits, r, pos, qp, fast);
        mkv_mosaic_dequantize_vector_scalar(packed, bits, r, pos, qp, scalar);
        for (int k = 0; k < r; k++) {
            unsigned code = ref_code(packed, k, bits);
            double zero = mkv_f16_to_f32(qp[2 * pos[k]]), step = mkv_f16_to_f32(qp[2 * pos[k] + 1]);
            float want = mkv_f16_to_f32(mkv_f32_to_f16((float)(zero + (double)code * step)));
            ck_assert_msg(memcmp(&fast[k], &want, sizeof want) == 0 && memcmp(&scalar[k], &want, sizeof want) == 0,
                          "trial %d, %d bits, value %d (channel %d, code %u): %a and %a for %a", trial, bits, k,
                          pos[k], code, fast[k], scalar[k], want);
        }
    }
}
END_TEST

START_TEST(encode_keeps_values_exactly)
{
    /* Without rotation the packed values are the kept raw elements,
     * rounded to fp16; block keys (no bound) are block means over all d
     * channels. */
    enum { N = 10, D = 8 };
    float X[N * D];
    for (int t = 0; t < N; t++)
        for (int j = 0; j < D; j++)
            X[t * D + j] = (float)((j * 7 + t * 3) % 11 - 5) * 0.3f;
    mkv_mosaic_strategy s = {.start = 0, .len = N, .rotate = 0, .r = 2, .g = 1, .dprime = D,
                             .pervector = 1, .bits = 16, .keydim = D, .bound = 0};
    uint16_t values[N * 2], keys[2 * D];
    uint8_t bm[N];
    mkv_error err;
    ck_assert_int_eq(mkv_mosaic_encode(&s, X, D, NULL, 8, values, bm, NULL, NULL, keys, NULL, &err), MKV_OK);
    for (int t = 0; t < N; t++) {
        int pos[2], n = ref_positions(bm + t, &s, pos);
        ck_assert_int_eq(n, 2);
        double smallest_kept = INFINITY, largest_dropped = 0;
        for (int j = 0; j < D; j++) {
            int kept = j == pos[0] || j == pos[1];
            double a = fabs(X[t * D + j]);
            if (kept && a < smallest_kept)
                smallest_kept = a;
            if (!kept && a > largest_dropped)
                largest_dropped = a;
        }
        ck_assert_double_ge(smallest_kept, largest_dropped);
        for (int i = 0; i < 2; i++)
            ck_assert_uint_eq(values[t * 2 + i], mkv_f32_to_f16(X[t * D + pos[i]]));
    }
    /* block 1 holds tokens 8 and 9 */
    for (int j = 0; j < D; j++) {
        double mean = ((double)X[8 * D + j] + X[9 * D + j]) / 2;
        ck_assert_double_eq_tol(mkv_f16_to_f32(keys[D + j]), mean, fabs(mean) * 0x1p-11 + 1e-7);
    }
}
END_TEST

START_TEST(popcount_is_r_for_every_vector)
{
    head_data hd;
    head_data_make(&hd, 11, 420, 32, 2, 4);
    mkv_head_kv in = as_input(&hd);
    mkv_error err;
    for (int dyn = 0; dyn < 3; dyn++) {
        mkv_mosaic_config c = fixed_config(32, 0.25, 2, 0.8);
        c.dynamic = dyn > 0;
        c.ratio = dyn == 2 ? 3 : 0;
        mkv_mosaic_head h;
        ck_assert_int_eq(mkv_mosaic_compress(&c, &in, &h, &err), MKV_OK);
        const mkv_mosaic_tensor *ts[2] = {&h.k, &h.v};
        for (int which = 0; which < 2; which++) {
            const mkv_mosaic_tensor *t = ts[which];
            int64_t ob = 0;
            for (int64_t s = 0; s < t->nseg; s++) {
                const mkv_mosaic_strategy *st = &t->seg[s];
                int bb = ref_bitmap_bytes(st);
                for (int64_t i = 0; bb && i < st->len; i++) {
                    int bits = 0;
                    for (int b = 0; b < bb; b++)
                        bits += __builtin_popcount(t->bitmap[ob + i * bb + b]);
                    ck_assert_int_eq(bits * st->g, st->r);
                }
                ob += st->len * bb;
            }
            ck_assert_int_eq(ob, t->n_bitmap);
        }
        mkv_mosaic_head_free(&h);
    }
    head_data_free(&hd);
}
END_TEST

START_TEST(block_keys_hand_made)
{
    /* 5 rotated keys, keydim 3, bound 1, B = 4: block 0 = tokens 0..3,
     * block 1 = token 4. Rows: min c0, max c0, mean c1, mean c2. */
    const double xt[5 * 4] = {1, 2, 0.5, 9,   -3, 4, 0.5, 9,  2, 0, 1, 9,  0.5, -2, 2, 9,  7, 1, -1, 9};
    float out[2 * 4];
    mkv_mosaic_block_keys(xt, 5, 4, 3, 1, 4, out);
    const float want[8] = {-3, 2, 1, 1, 7, 7, 1, -1};   /* c1: (2+4+0-2)/4, c2: (0.5+0.5+1+2)/4 */
    for (int i = 0; i < 8; i++)
        ck_assert_float_eq(out[i], want[i]);
    /* q~ = (2, -1, 0.5): block 0 scores max(2 x -3, 2 x 2) - 1 x 1 + 0.5 x 1 = 3.5;
     * a negative q~_0 takes the minimum: q~ = (-1, 0, 0) gives 3 */
    const double q1[3] = {2, -1, 0.5}, q2[3] = {-1, 0, 0};
    ck_assert_double_eq_tol(mkv_mosaic_block_score(q1, out, 3, 1), 3.5, 1e-15);
    ck_assert_double_eq_tol(mkv_mosaic_block_score(q2, out, 3, 1), 3, 1e-15);
    /* many rows and four queries at once: 11 random rows (two groups of
     * four and a rest) give the hand-checked single-row score of each
     * query, to the bit */
    {
        float rows[11 * 6];      /* fp16 values, stored as rows16 */
        uint16_t rows16[11 * 6];
        double q[4][4] = {{0.7, -1.3, 2.1, -0.4}, {-0.2, 0.9, 0, 1.7}, {3.1, 2.2, -1.1, 0.05}, {-1, -1, 1, 1}};
        double q4[4 * 4], got[11 * 4];
        uint64_t st = 5;
        for (int i = 0; i < 11 * 6; i++) {
            st = st * 6364136223846793005ULL + 1442695040888963407ULL;
            rows16[i] = mkv_f32_to_f16((float)((double)(st >> 40) / (double)(1 << 24) * 4 - 2));
            rows[i] = mkv_f16_to_f32(rows16[i]);
        }
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 4; l++)
                q4[4 * c + l] = q[l][c];
        mkv_mosaic_block_scores4(q4, rows16, 11, 4, 2, got);
        for (int b = 0; b < 11; b++)
            for (int l = 0; l < 4; l++)
                ck_assert(got[4 * b + l] == mkv_mosaic_block_score(q[l], rows + b * 6, 4, 2));
        /* q0 = 0.7 > 0 takes the max of the bound pair, q1 < 0 the min */
        double hand = fmax(0.7 * rows[0], 0.7 * rows[2]) + fmax(-1.3 * rows[1], -1.3 * rows[3]) +
                      2.1 * rows[4] - 0.4 * rows[5];
        ck_assert_double_eq_tol(got[0], hand, 1e-12);
    }
    /* bound 0: means only, rows of keydim values; c0 of block 0 is
     * (1 - 3 + 2 + 0.5) / 4 */
    mkv_mosaic_block_keys(xt, 5, 4, 3, 0, 4, out);
    const float means[6] = {0.125f, 1, 1, 7, 1, -1};
    for (int i = 0; i < 6; i++)
        ck_assert_float_eq(out[i], means[i]);
}
END_TEST

/* ---------------------------------------------------------------- bytes */

START_TEST(segment_bytes_hand_count)
{
    /* d = 64, 100 tokens, r = 16, g = 1, d' = 32, B = 8, keydim 24, bound 2:
     *   values     100 * 16 * 2              = 3200
     *   bitmap     100 * ceil(32/1/8)        =  400
     *   block keys ceil(100/8) = 13 * 26 * 2 =  676
     *   rotation   64 * max(32, 24) * 2      = 4096   -> keys 8372
     * values (no block keys): 3200 + 400 + 4096 = 7696. */
    mkv_mosaic_strategy s = {.len = 100, .rotate = 1, .r = 16, .g = 1, .dprime = 32, .pervector = 1, .bits = 16,
                             .keydim = 24, .bound = 2};
    mkv_mosaic_bytes b;
    mkv_mosaic_strategy_bytes(&s, 64, 8, &b);
    ck_assert_uint_eq(b.values, 3200);
    ck_assert_uint_eq(b.bitmap, 400);
    ck_assert_uint_eq(b.blockkeys, 676);
    ck_assert_uint_eq(b.rotation, 4096);
    ck_assert_uint_eq(b.total, 8372);
    /* block keys wider than d': the rotation keeps 48 columns, 64 x 48 x 2 */
    s.keydim = 48;
    mkv_mosaic_strategy_bytes(&s, 64, 8, &b);
    ck_assert_uint_eq(b.rotation, 6144);
    ck_assert_uint_eq(b.blockkeys, 13 * 50 * 2);
    mkv_mosaic_strategy v = {.len = 100, .rotate = 1, .r = 16, .g = 1, .dprime = 32, .pervector = 1, .bits = 16};
    mkv_mosaic_strategy_bytes(&v, 64, 0, &b);
    ck_assert_uint_eq(b.total, 7696);
    /* g = 4, d' = 20: 5 bits -> 1 byte per vector */
    v.g = 4;
    v.dprime = 20;
    mkv_mosaic_strategy_bytes(&v, 64, 0, &b);
    ck_assert_uint_eq(b.bitmap, 100);
    /* r = d': every channel kept, no bitmap; no rotation: d' = d, block
     * keys over all 64 raw channels */
    mkv_mosaic_strategy u = {.len = 100, .rotate = 0, .r = 64, .g = 1, .dprime = 64, .pervector = 1, .bits = 16,
                             .keydim = 64, .bound = 0};
    mkv_mosaic_strategy_bytes(&u, 64, 8, &b);
    ck_assert_uint_eq(b.total, 100 * 64 * 2 + 13 * 64 * 2);
}
END_TEST

/* physical bytes of a head, counted here from its strategies */
static uint64_t hand_count(const mkv_mosaic_head *h)
{
    uint64_t total = 0;
    int d = h->d;
    /* dense K and V: (sink + recent) x d x 2 bytes each */
    total += 2 * (uint64_t)(h->sink_n + h->recent_n) * d * 2;
    const mkv_mosaic_tensor *ts[2] = {&h->k, &h->v};
    for (int which = 0; which < 2; which++) {
        const mkv_mosaic_tensor *t = ts[which];
        /* strategy table int32 [nseg][9], losses float32 [nseg][2], keys:
         * block-key table int32 [nseg][2] */
        total += (uint64_t)t->nseg * (9 * 4 + 2 * 4 + (which == 0 ? 2 * 4 : 0));
        for (int64_t s = 0; s < t->nseg; s++) {
            const mkv_mosaic_strategy *st = &t->seg[s];
            if (st->bits == 16)
                total += (uint64_t)st->len * st->r * 2;
            else   /* codes packed per vector, a zero and a step (fp16) per rotated channel and token group */
                total += (uint64_t)st->len * (uint64_t)((st->r * st->bits + 7) / 8) +
                         (uint64_t)(st->qgroup ? (st->len + st->qgroup - 1) / st->qgroup : 1) * st->dprime * 2 * 2;
            total += (uint64_t)st->len * ref_bitmap_bytes(st);
            if (which == 0)
                total += (uint64_t)((st->len + h->block - 1) / h->block) * (st->keydim + st->bound) * 2;
            total += (uint64_t)d * ref_rot_cols(st, which == 0) * 2;
        }
    }
    return total;
}

/* ---------------------------------------------------------------- attention */

/* Block score computed here: q~ = q R_k over the stored columns, bound
 * channels by max(q~ min, q~ max), the others by q~ mean. */
static double ref_block_score(const mkv_mosaic_head *h, const mkv_mosaic_strategy *st, const uint16_t *R,
                              const uint16_t *row16, const float *q)
{
    int d = h->d, cols = ref_rot_cols(st, 1), m = st->bound;
    double sc = 0, row[2 * MKV_MOSAIC_MAX_D];
    for (int c = 0; c < st->keydim + m; c++)
        row[c] = mkv_f16_to_f32(row16[c]);
    for (int c = 0; c < st->keydim; c++) {
        double qt = 0;
        for (int j = 0; j < d; j++)
            qt += q[j] * (st->rotate ? mkv_f16_to_f32(R[j * cols + c]) : (j == c));
        if (c < m)
            sc += fmax(qt * row[c], qt * row[m + c]);
        else
            sc += qt * row[m + c];
    }
    return sc;
}

/* Check that the attended set follows the selection rule: sink and recent
 * tokens <= p all in, nothing > p, count within one block above the
 * budget, every selected block scoring at least as high as every
 * unselected one (scores recomputed here from the stored block keys and
 * rotations). */
static void check_selection(const mkv_mosaic_head *h, const float *q, int G, int64_t p, double budget,
                            int agg_sum, const uint8_t *att)
{
    int d = h->d, B = h->block;
    int64_t count = 0, want = mkv_budget_tokens(budget, p + 1);
    for (int64_t t = 0; t < h->T; t++) {
        if (t > p)
            ck_assert_int_eq(att[t], 0);
        else if (t < h->sink_n || t >= h->T - h->recent_n)
            ck_assert_int_eq(att[t], 1);
        count += att[t];
    }
    ck_assert_int_ge(count, want < h->sink_n + h->recent_n ? count : want);
    double min_sel = INFINITY, max_unsel = -INFINITY;
    int64_t ok = 0, orot = 0, nsel_tokens = 0;
    for (int64_t s = 0; s < h->k.nseg; s++) {
        const mkv_mosaic_strategy *st = &h->k.seg[s];
        int w = st->keydim + st->bound;
        for (int64_t b = 0; b * B < st->len && st->start + b * B <= p; b++) {
            double agg = -INFINITY;
            for (int g = 0; g < G; g++) {
                double sc = ref_block_score(h, st, h->k.rotation + orot, h->k.blockkeys + ok + b * w,
                                            q + g * d) / sqrt(d);
                agg = g == 0 ? sc : agg_sum ? agg + sc : fmax(agg, sc);
            }
            int sel = att[st->start + b * B];
            for (int64_t t = st->start + b * B; t < st->start + st->len && t < st->start + (b + 1) * B && t <= p; t++) {
                ck_assert_int_eq(att[t], sel);   /* whole blocks */
                nsel_tokens += sel;
            }
            if (sel)
                min_sel = agg < min_sel ? agg : min_sel;
            else
                max_unsel = agg > max_unsel ? agg : max_unsel;
        }
        ok += ((st->len + B - 1) / B) * w;
        orot += (int64_t)d * ref_rot_cols(st, 1);
    }
    if (nsel_tokens > 0) {
        ck_assert_double_ge(min_sel, max_unsel - 1e-9);
        ck_assert_int_lt(count - want, B);   /* the last block passes the budget by < B */
    }
}

static void attend_both(const mkv_mosaic_head *h, const head_data *hd, double budget, int agg_sum, int64_t p,
                        float *out, uint8_t *att, double *ref_out, uint64_t *bytes)
{
    int d = hd->d, G = hd->G;
    float q[16 * MKV_MOSAIC_MAX_D];
    gen_queries(900 + (uint64_t)p, hd->k, p + 1, d, G, q);
    mkv_attend_query aq = {.G = G, .d = d, .q = q, .pos = p, .scale = 1 / sqrt(d)};
    memset(att, 0, (size_t)hd->T);
    mkv_attend_result res = {.out = out, .attended = att};
    mkv_mosaic_attn_opts o = {.budget = budget, .agg_sum = agg_sum};
    mkv_error err;
    ck_assert_int_eq(mkv_mosaic_attend(h, &o, &aq, &res, &err), MKV_OK);
    if (bytes)
        *bytes = res.bytes_read;
    double *K = malloc(sizeof(double) * (size_t)(hd->T * d)), *V = malloc(sizeof(double) * (size_t)(hd->T * d));
    ck_assert(K && V);
    ref_reconstruct(h, &h->k, h->dense_k, 1, K);
    ref_reconstruct(h, &h->v, h->dense_v, 0, V);
    ref_attend(K, V, p + 1, d, att, q, G, 1 / sqrt(d), ref_out);
    check_selection(h, q, G, p, budget, agg_sum, att);
    free(K);
    free(V);
}

START_TEST(packed_attention_equals_reconstruction)
{
    head_data hd;
    head_data_make(&hd, 21, 437, 32, 3, 8);
    mkv_head_kv in = as_input(&hd);
    mkv_error err;
    /* fixed g = 1, 2, 4; dynamic (threshold); ratio */
    for (int mode = 0; mode < 5; mode++) {
        mkv_mosaic_config c = fixed_config(32, 0.25, mode < 3 ? 1 << mode : 1, 0.8);
        c.dynamic = mode >= 3;
        c.ratio = mode == 4 ? 3 : 0;
        mkv_mosaic_head h;
        ck_assert_int_eq(mkv_mosaic_compress(&c, &in, &h, &err), MKV_OK);
        const int64_t positions[] = {436, 250, 104, 60};
        for (int i = 0; i < 4; i++) {
            float out[3 * 32];
            double ref[3 * 32];
            uint8_t att[437];
            attend_both(&h, &hd, 0.2, i % 2, positions[i], out, att, ref, NULL);
            ck_assert_double_le(rel_err(out, ref, 3 * 32), 2e-3);
        }
        mkv_mosaic_head_free(&h);
    }
    head_data_free(&hd);
}
END_TEST

/* The GPU layout's room for decoded tokens (mkv_gpu_layout_build): an open
 * segment (open 1) continues the last packed segment at T - recent with its
 * strategy, rotations and block-key shape, records and block-key rows of
 * its own right after the last segment's; a temporary region (open 0)
 * starts at T, attended whole, without block keys. */
START_TEST(gpu_layout_room_for_decoded_tokens)
{
    head_data hd;
    head_data_make(&hd, 33, 437, 64, 2, 8);
    mkv_head_kv in = as_input(&hd);
    mkv_error err;
    mkv_mosaic_config c = fixed_config(64, 0.25, 2, 0.8);
    mkv_mosaic_head h;
    ck_assert_int_eq(mkv_mosaic_compress(&c, &in, &h, &err), MKV_OK);
    const mkv_mosaic_head *hp = &h;
    mkv_gpu_layout none, open, temp;
    ck_assert_msg(mkv_gpu_layout_build(&hp, 1, 0, 0, &none, &err) == MKV_OK, "%s", err.msg);
    ck_assert_msg(mkv_gpu_layout_build(&hp, 1, 21, 1, &open, &err) == MKV_OK, "%s", err.msg);
    ck_assert_msg(mkv_gpu_layout_build(&hp, 1, 21, 0, &temp, &err) == MKV_OK, "%s", err.msg);
    const int n = none.heads[0].n_seg;
    ck_assert_int_eq(n, h.k.nseg);
    ck_assert_int_eq(open.heads[0].n_seg, n + 1);
    ck_assert_int_eq(temp.heads[0].n_seg, n + 1);
    const mkv_packed_seg *last = &none.segs[n - 1], *o = &open.segs[n], *t = &temp.segs[n];
    const int64_t room = (21 + h.block - 1) / h.block;   /* 3 blocks of 8 */
    ck_assert_int_eq(o->open, 1);
    ck_assert_int_eq(o->always, 0);
    ck_assert_int_eq(o->start, h.T - h.recent_n);
    ck_assert_int_eq(o->start, last->start + last->len);
    ck_assert_int_eq(o->len, 0);
    ck_assert_int_eq(o->n_blocks, room);
    ck_assert_int_eq(o->first_block, last->first_block + last->n_blocks);
    ck_assert_int_eq(open.heads[0].n_blocks, none.heads[0].n_blocks + room);
    ck_assert_int_eq(o->rk_off, last->rk_off);
    ck_assert_int_eq(o->rv_off, last->rv_off);
    ck_assert_int_eq(o->rk, last->rk);
    ck_assert_int_eq(o->gk, last->gk);
    ck_assert_int_eq(o->kdim, last->kdim);
    ck_assert_int_eq(o->kbound, last->kbound);
    ck_assert_int_eq(o->bk_width, last->bk_width);
    ck_assert_int_eq(o->rec_off, last->rec_off + (int64_t)last->n_blocks * last->rec_bytes);
    ck_assert_uint_eq(open.l.record_bytes, none.l.record_bytes + (size_t)room * last->rec_bytes);
    ck_assert_int_eq(o->bk_off, last->bk_off + (int64_t)last->n_blocks * last->bk_width);
    ck_assert_uint_eq(open.l.n_blockkeys, none.l.n_blockkeys + (size_t)room * last->bk_width);
    ck_assert_uint_eq(open.l.n_rotations, none.l.n_rotations);
    ck_assert_int_eq(t->always, 1);
    ck_assert_int_eq(t->open, 0);
    ck_assert_int_eq(t->start, h.T);
    ck_assert_int_eq(t->bk_off, -1);
    ck_assert_uint_eq(temp.l.n_blockkeys, none.l.n_blockkeys);
    ck_assert_uint_eq(temp.l.record_bytes, open.l.record_bytes);
    mkv_gpu_layout_free(&none);
    mkv_gpu_layout_free(&open);
    mkv_gpu_layout_free(&temp);
    mkv_mosaic_head_free(&h);
    head_data_free(&hd);
}
END_TEST

/* The attention in pieces (what the decoder's threads share) gives
 * mkv_mosaic_attend's floats, whichever thread runs which piece and in
 * which order: here the last piece first, on a thread of its own. */
typedef struct {
    mkv_mosaic_attend_job *job;
    int piece;
} piece_arg;

static void *run_piece(void *arg)
{
    piece_arg *a = arg;
    mkv_mosaic_attend_piece(a->job, a->piece);
    return NULL;
}

START_TEST(pieces_equal_attend)
{
    head_data hd;
    head_data_make(&hd, 23, 437, 32, 3, 8);
    mkv_head_kv in = as_input(&hd);
    mkv_error err;
    mkv_mosaic_config c = fixed_config(32, 0.25, 1, 0.8);
    c.segment = 64;
    mkv_mosaic_head h;
    ck_assert_int_eq(mkv_mosaic_compress(&c, &in, &h, &err), MKV_OK);
    ck_assert_int_ge(h.k.nseg, 4);
    mkv_mosaic_attn_opts o = {.budget = 0.3};
    const int64_t positions[] = {436, 200, 30};
    for (int i = 0; i < 3; i++) {
        float q[3 * 32], out_a[3 * 32], out_b[3 * 32];
        double lse_a[3], lse_b[3];
        uint8_t att_a[437] = {0}, att_b[437] = {0};
        gen_queries(77 + (uint64_t)i, hd.k, positions[i] + 1, 32, 3, q);
        mkv_attend_query aq = {.G = 3, .d = 32, .q = q, .pos = positions[i], .scale = 1 / sqrt(32)};
        mkv_attend_result ra = {.out = out_a, .attended = att_a, .lse = lse_a};
        mkv_attend_result rb = {.out = out_b, .attended = att_b, .lse = lse_b};
        ck_assert_int_eq(mkv_mosaic_attend(&h, &o, &aq, &ra, &err), MKV_OK);
        mkv_mosaic_attend_job *job;
        ck_assert_int_eq(mkv_mosaic_attend_begin(&h, &o, &aq, &rb, &job, &err), MKV_OK);
        pthread_t th;
        piece_arg last = {job, MKV_MOSAIC_PIECES - 1};
        ck_assert_int_eq(pthread_create(&th, NULL, run_piece, &last), 0);
        ck_assert_int_eq(pthread_join(th, NULL), 0);
        for (int piece = MKV_MOSAIC_PIECES - 2; piece >= 0; piece--)
            mkv_mosaic_attend_piece(job, piece);
        mkv_mosaic_attend_end(job, &rb);
        ck_assert(memcmp(out_a, out_b, sizeof out_a) == 0);
        ck_assert(memcmp(lse_a, lse_b, sizeof lse_a) == 0);
        ck_assert(memcmp(att_a, att_b, sizeof att_a) == 0);
        ck_assert_uint_eq(ra.bytes_read, rb.bytes_read);
        /* and both are the attention over what was attended */
        double ref[3 * 32];
        double *K = malloc(sizeof(double) * 437 * 32), *V = malloc(sizeof(double) * 437 * 32);
        ck_assert(K && V);
        ref_reconstruct(&h, &h.k, h.dense_k, 1, K);
        ref_reconstruct(&h, &h.v, h.dense_v, 0, V);
        ref_attend(K, V, positions[i] + 1, 32, att_a, q, 3, 1 / sqrt(32), ref);
        ck_assert_double_le(rel_err(out_a, ref, 3 * 32), 2e-3);
        free(K);
        free(V);
    }
    /* begun and ended without running its pieces: freed (ASan) */
    float q[3 * 32], out[3 * 32];
    uint8_t att[437] = {0};
    gen_queries(5, hd.k, 437, 32, 3, q);
    mkv_attend_query aq = {.G = 3, .d = 32, .q = q, .pos = 436, .scale = 1 / sqrt(32)};
    mkv_attend_result r = {.out = out, .attended = att};
    mkv_mosaic_attend_job *job;
    ck_assert_int_eq(mkv_mosaic_attend_begin(&h, &o, &aq, &r, &job, &err), MKV_OK);
    mkv_mosaic_attend_end(job, NULL);
    mkv_mosaic_head_free(&h);
    head_data_free(&hd);
}
END_TEST

START_TEST(bytes_read_hand_count)
{
    /* d = 32, T = 140, sink 4, recent 16, segment 100, B = 8: one segment
     * of 100 tokens (4..103) and one of 20 (104..123). At p = 139 with
     * budget 1 every token is read:
     *   dense 20 tokens x 32 x 2 bytes x (K, V)
     *   per segment: its rows of both strategy tables (9 int32 each) and
     *   of the block-key table (2 int32), R_k (32 x max(d'_k, keydim) x
     *   2), R_v (32 x d'_v x 2), block keys (ceil(len/8) x (keydim +
     *   bound) x 2), per token (r_k + r_v) x 2 + bitmap bytes of K and V.
     * Quantized at 4 bits with zeros and steps per 32 tokens: per token
     * ceil(r x 4 / 8) bytes of codes instead, and per token group (the
     * first segment 4 of them, 32, 32, 32 and 4 tokens; the second, of 20
     * tokens, one over the segment) d' x 2 fp16 per tensor. */
    head_data hd;
    head_data_make(&hd, 5, 140, 32, 2, 0);
    mkv_head_kv in = as_input(&hd);
    for (int quantized = 0; quantized < 2; quantized++) {
        mkv_mosaic_config c = fixed_config(32, 0.25, 1, 0.8);
        c.bits = quantized ? 4 : 16;
        c.qgroup = 32;
        mkv_mosaic_head h;
        mkv_error err;
        ck_assert_int_eq(mkv_mosaic_compress(&c, &in, &h, &err), MKV_OK);
        ck_assert_int_eq(h.k.nseg, 2);
        uint64_t want = 20 * 32 * 2 * 2;
        for (int s = 0; s < 2; s++) {
            const mkv_mosaic_strategy *ks = &h.k.seg[s], *vs = &h.v.seg[s];
            ck_assert_int_eq(ks->keydim, 16);
            ck_assert_int_eq(ks->bound, 2);
            ck_assert_int_eq(ks->qgroup, quantized && s == 0 ? 32 : 0);
            want += (9 + 9 + 2) * 4 + 32 * (ks->dprime > 16 ? ks->dprime : 16) * 2 + 32 * vs->dprime * 2;
            want += (uint64_t)((ks->len + 7) / 8) * (16 + 2) * 2;
            int per_token = quantized ? (ks->r * 4 + 7) / 8 + (vs->r * 4 + 7) / 8 : (ks->r + vs->r) * 2;
            want += (uint64_t)ks->len * (per_token + ref_bitmap_bytes(ks) + ref_bitmap_bytes(vs));
            if (quantized)
                want += (uint64_t)(s == 0 ? 4 : 1) * (ks->dprime + vs->dprime) * 2 * 2;
        }
        float out[2 * 32];
        double ref[2 * 32];
        uint8_t att[140];
        uint64_t bytes;
        attend_both(&h, &hd, 1.0, 0, 139, out, att, ref, &bytes);
        ck_assert_uint_eq(bytes, want);
        ck_assert_double_le(rel_err(out, ref, 2 * 32), quantized ? 0.1 : 2e-3);
        mkv_mosaic_head_free(&h);
    }
    head_data_free(&hd);
}
END_TEST

/* Step 3b: with refine the blocks cover refine x the budget (the
 * candidates: what the block rule alone selects for that many tokens),
 * and of the compressed candidates the budget's best by their keys stay:
 * scores recomputed here from the reconstructed keys, q . (k~ R^T). The
 * bytes read count every candidate's key once and the attended tokens'
 * values, by hand (per token group of a quantized segment its zeros and
 * steps, d' x 2 fp16, once for the keys of the candidates and once for
 * the values of the attended). */
START_TEST(refine_keeps_best_candidates)
{
    head_data hd;
    head_data_make(&hd, 31, 437, 32, 3, 8);
    mkv_head_kv in = as_input(&hd);
    const int d = 32, G = 3;
    const double scale = 1 / sqrt(d), refine = 2.5;
    double *K = malloc(sizeof(double) * 437 * 32), *V = malloc(sizeof(double) * 437 * 32);
    ck_assert(K && V);
    for (int quantized = 0; quantized < 2; quantized++) {
        mkv_mosaic_config c = fixed_config(d, 0.25, 1, 0.8);
        c.bits = quantized ? 4 : 16;
        c.qgroup = 32;
        mkv_mosaic_head h;
        mkv_error err;
        ck_assert_int_eq(mkv_mosaic_compress(&c, &in, &h, &err), MKV_OK);
        ck_assert_int_ge(h.k.nseg, 4);
        ref_reconstruct(&h, &h.k, h.dense_k, 1, K);
        ref_reconstruct(&h, &h.v, h.dense_v, 0, V);
        const int64_t positions[] = {436, 250, 120};
        for (int i = 0; i < 6; i++) {
            int64_t p = positions[i % 3];
            int agg_sum = i / 3;
            float q[3 * 32], out[3 * 32];
            double ref[3 * 32], qt[8 * 3 * 32];
            uint8_t cand[437] = {0}, att[437] = {0};
            gen_queries(300 + (uint64_t)i, hd.k, p + 1, d, G, q);
            int64_t k = mkv_budget_tokens(0.2, p + 1), want = (int64_t)ceil(refine * (double)k);
            want = want < p + 1 ? want : p + 1;
            ck_assert_int_le(h.k.nseg, 8);
            mkv_mosaic_attn_opts blocks = {.budget = (double)want, .agg_sum = agg_sum};
            ck_assert_int_ge(mkv_mosaic_select_tokens(&h, &blocks, q, G, p, scale, NULL, qt, cand, NULL), want);

            /* the reference: the compressed candidates by score, ties to the earlier */
            int64_t dense = 0, n = 0, tok[437];
            double sc[437];
            for (int64_t t = 0; t <= p; t++) {
                int is_dense = t < h.sink_n || t >= h.T - h.recent_n;
                dense += is_dense;
                if (!cand[t] || is_dense)
                    continue;
                double agg = 0;
                for (int g = 0; g < G; g++) {
                    double dot = 0;
                    for (int j = 0; j < d; j++)
                        dot += q[g * d + j] * K[t * d + j];
                    agg = g == 0 ? dot * scale : agg_sum ? agg + dot * scale : fmax(agg, dot * scale);
                }
                tok[n] = t;
                sc[n++] = agg;
            }
            int64_t keep = k - dense;
            ck_assert_int_gt(keep, 0);
            ck_assert_int_gt(n, keep);
            uint8_t want_att[437] = {0};
            for (int64_t t = 0; t <= p; t++)
                want_att[t] = t < h.sink_n || t >= h.T - h.recent_n;
            for (int64_t a = 0; a < keep; a++) {
                int64_t best = -1;
                for (int64_t b = 0; b < n; b++)
                    if (!want_att[tok[b]] && (best < 0 || sc[b] > sc[best]))
                        best = b;
                want_att[tok[best]] = 1;
            }

            mkv_attend_query aq = {.G = G, .d = d, .q = q, .pos = p, .scale = scale};
            mkv_attend_result res = {.out = out, .attended = att};
            mkv_mosaic_attn_opts o = {.budget = 0.2, .agg_sum = agg_sum, .refine = refine};
            ck_assert_int_eq(mkv_mosaic_attend(&h, &o, &aq, &res, &err), MKV_OK);
            ck_assert(memcmp(att, want_att, sizeof att) == 0);
            ref_attend(K, V, p + 1, d, att, q, G, scale, ref);
            ck_assert_double_le(rel_err(out, ref, G * d), quantized ? 0.1 : 2e-3);

            /* bytes by hand */
            uint64_t bytes = (uint64_t)dense * d * 2 * 2;
            for (int64_t si = 0; si < h.k.nseg && h.k.seg[si].start <= p; si++) {
                const mkv_mosaic_strategy *ks = &h.k.seg[si], *vs = &h.v.seg[si];
                int64_t nb = (ks->len + 7) / 8, upto = (p - ks->start) / 8 + 1, last_k = -1, last_v = -1;
                int attended = 0;
                bytes += (9 + 9 + 2) * 4 + (uint64_t)d * ref_rot_cols(ks, 1) * 2 +
                         (uint64_t)(upto < nb ? upto : nb) * (ks->keydim + ks->bound) * 2;
                for (int64_t t = ks->start; t < ks->start + ks->len && t <= p; t++) {
                    int64_t grp = ks->qgroup ? (t - ks->start) / ks->qgroup : 0;
                    if (cand[t]) {
                        bytes += quantized ? (uint64_t)(ks->r * 4 + 7) / 8 : (uint64_t)ks->r * 2;
                        bytes += (uint64_t)ref_bitmap_bytes(ks);
                        if (quantized && grp != last_k)
                            bytes += (uint64_t)ks->dprime * 2 * 2;
                        last_k = grp;
                    }
                    if (att[t]) {
                        attended = 1;
                        bytes += quantized ? (uint64_t)(vs->r * 4 + 7) / 8 : (uint64_t)vs->r * 2;
                        bytes += (uint64_t)ref_bitmap_bytes(vs);
                        if (quantized && grp != last_v)
                            bytes += (uint64_t)vs->dprime * 2 * 2;
                        last_v = grp;
                    }
                }
                if (attended)
                    bytes += (uint64_t)d * ref_rot_cols(vs, 0) * 2;
            }
            ck_assert_uint_eq(res.bytes_read, bytes);
        }
        /* refine 1 is the block rule itself */
        float q[3 * 32], out_a[3 * 32], out_b[3 * 32];
        uint8_t att_a[437] = {0}, att_b[437] = {0};
        gen_queries(17, hd.k, 437, d, G, q);
        mkv_attend_query aq = {.G = G, .d = d, .q = q, .pos = 436, .scale = scale};
        mkv_attend_result ra = {.out = out_a, .attended = att_a}, rb = {.out = out_b, .attended = att_b};
        mkv_mosaic_attn_opts o1 = {.budget = 0.2, .refine = 1}, o0 = {.budget = 0.2};
        ck_assert_int_eq(mkv_mosaic_attend(&h, &o1, &aq, &ra, &err), MKV_OK);
        ck_assert_int_eq(mkv_mosaic_attend(&h, &o0, &aq, &rb, &err), MKV_OK);
        ck_assert(memcmp(att_a, att_b, sizeof att_a) == 0 && memcmp(out_a, out_b, sizeof out_a) == 0);
        check_selection(&h, q, G, 436, 0.2, 0, att_a);
        mkv_mosaic_head_free(&h);
    }
    free(K);
    free(V);
    head_data_free(&hd);
}
END_TEST

START_TEST(full_keep_equals_exact_attention)
{
    /* keep = 1, energy = 1, budget = 1: nothing dropped; only fp16 storage
     * (values, rotation) separates mosaic from exact attention on raw K, V. */
    head_data hd;
    head_data_make(&hd, 31, 300, 32, 2, 0);
    mkv_head_kv in = as_input(&hd);
    for (int rot = 0; rot < 2; rot++) {
        mkv_mosaic_config c = fixed_config(32, 1.0, 1, 1.0);
        c.rotate = rot;
        mkv_mosaic_head h;
        mkv_error err;
        ck_assert_int_eq(mkv_mosaic_compress(&c, &in, &h, &err), MKV_OK);
        for (int64_t s = 0; s < h.k.nseg; s++) {
            ck_assert_int_eq(h.k.seg[s].dprime, 32);
            /* unrotated keys: block keys over every raw channel, no bound */
            ck_assert_int_eq(h.k.seg[s].keydim, rot ? 16 : 32);
            ck_assert_int_eq(h.k.seg[s].bound, rot ? 2 : 0);
        }
        const int64_t positions[] = {299, 150};
        for (int i = 0; i < 2; i++) {
            int64_t p = positions[i];
            float q[2 * 32], out[2 * 32], exact[2 * 32];
            gen_queries(77 + (uint64_t)p, hd.k, p + 1, 32, 2, q);
            mkv_attend_query aq = {.G = 2, .d = 32, .q = q, .pos = p, .scale = 1 / sqrt(32.0)};
            uint8_t att[300] = {0};
            mkv_attend_result res = {.out = out, .attended = att};
            mkv_mosaic_attn_opts o = {.budget = 1.0};
            ck_assert_int_eq(mkv_mosaic_attend(&h, &o, &aq, &res, &err), MKV_OK);
            for (int64_t t = 0; t < 300; t++)
                ck_assert_int_eq(att[t], t <= p);
            mkv_attend_exact(hd.k, hd.v, 32, &aq, exact, NULL);
            double num = 0, den = 0;
            for (int j = 0; j < 64; j++) {
                num += (out[j] - exact[j]) * (out[j] - exact[j]);
                den += (double)exact[j] * exact[j];
            }
            /* fp16 rotations: R16 R16^T = I only to ~2^-11, which moves
             * the scores of these peaked queries by ~1e-2 */
            ck_assert_double_le(sqrt(num / den), 5e-3);
        }
        mkv_mosaic_head_free(&h);
    }
    head_data_free(&hd);
}
END_TEST

START_TEST(uniform2d_is_fixed_channel_truncation)
{
    /* uniform2d keeps the first r rotated channels of every vector: its
     * attention at budget 1 equals attention over X R_r R_r^T, R_r the r
     * leading eigenvectors (fp16) of each segment, computed here. */
    head_data hd;
    head_data_make(&hd, 41, 260, 32, 2, 0);
    mkv_head_kv in = as_input(&hd);
    mkv_mosaic_config c = fixed_config(32, 0.25, 1, 0.9);
    c.pervector = 0;
    mkv_mosaic_head h;
    mkv_error err;
    ck_assert_int_eq(mkv_mosaic_compress(&c, &in, &h, &err), MKV_OK);
    ck_assert_int_eq(h.k.n_bitmap + h.v.n_bitmap, 0);
    int d = 32, r = 8;
    double *K = calloc(260 * 32, sizeof(double)), *V = calloc(260 * 32, sizeof(double));
    const float *src[2] = {hd.k, hd.v};
    double *dst[2] = {K, V};
    for (int which = 0; which < 2; which++) {
        const mkv_mosaic_tensor *t = which ? &h.v : &h.k;
        for (int64_t tok = 0; tok < 260; tok++)
            if (tok < 4 || tok >= 260 - 16)
                for (int j = 0; j < d; j++)
                    dst[which][tok * d + j] = src[which][tok * d + j];
        for (int64_t s = 0; s < t->nseg; s++) {
            const mkv_mosaic_strategy *st = &t->seg[s];
            ck_assert_int_eq(st->r, r);
            ck_assert_int_eq(st->dprime, r);
            ck_assert_int_eq(st->pervector, 0);
            double C[32 * 32] = {0}, R[32 * 32], ev[32];
            ck_assert_int_eq(mkv_gram_add(C, src[which] + st->start * d, st->len, d, &err), MKV_OK);
            ck_assert_int_eq(mkv_eigh(C, d, ev, R, &err), MKV_OK);
            mkv_mosaic_round_f16(R, 32 * 32);
            for (int64_t i = 0; i < st->len; i++) {
                const float *x = src[which] + (st->start + i) * d;
                double xt[32];
                for (int cc = 0; cc < r; cc++) {
                    xt[cc] = 0;
                    for (int j = 0; j < d; j++)
                        xt[cc] += x[j] * R[j * d + cc];
                    xt[cc] = mkv_f16_to_f32(mkv_f32_to_f16((float)xt[cc]));
                }
                for (int j = 0; j < d; j++) {
                    double acc = 0;
                    for (int cc = 0; cc < r; cc++)
                        acc += xt[cc] * R[j * d + cc];
                    dst[which][(st->start + i) * d + j] = acc;
                }
            }
        }
    }
    float q[2 * 32], out[2 * 32];
    double ref[2 * 32];
    gen_queries(3, hd.k, 260, 32, 2, q);
    mkv_attend_query aq = {.G = 2, .d = 32, .q = q, .pos = 259, .scale = 1 / sqrt(32.0)};
    uint8_t att[260] = {0};
    mkv_attend_result res = {.out = out, .attended = att};
    mkv_mosaic_attn_opts o = {.budget = 1.0};
    ck_assert_int_eq(mkv_mosaic_attend(&h, &o, &aq, &res, &err), MKV_OK);
    ref_attend(K, V, 260, d, NULL, q, 2, 1 / sqrt(32.0), ref);
    ck_assert_double_le(rel_err(out, ref, 64), 2e-3);
    free(K);
    free(V);
    mkv_mosaic_head_free(&h);
    head_data_free(&hd);
}
END_TEST

/* ---------------------------------------------------------------- strategy search */

static uint64_t ref_bytes(const mkv_mosaic_strategy *s, int d, int block)
{
    uint64_t b = (uint64_t)s->len * s->r * 2 + (uint64_t)s->len * ref_bitmap_bytes(s);
    if (block > 0)
        b += (uint64_t)((s->len + block - 1) / block) * (s->keydim + s->bound) * 2;
    return b + (uint64_t)d * ref_rot_cols(s, block > 0) * 2;
}

START_TEST(search_energy_picks_cheapest)
{
    /* Rank-2 keys, d = 32, 64 tokens, B = 8, block keys over 8 channels,
     * no queries (loss = energy). The cheapest candidate losing <= 1% is
     * r = 2 (d/16), d' = 8 (d/4):
     *   values 64 x 2 x 2 = 256, bitmap 64 x 1 = 64, block keys 8 x 8 x 2
     *   = 128, rotation 32 x 8 x 2 = 512: 960 bytes,
     * and rank-2 data lose nothing there (only fp16 rounding of R). */
    enum { N = 64, D = 32 };
    float X[N * D];
    uint64_t seed = 3;
    double a[D], b[D];
    for (int j = 0; j < D; j++) {
        a[j] = gauss(&seed);
        b[j] = gauss(&seed) * 0.5;
    }
    for (int t = 0; t < N; t++) {
        double z1 = gauss(&seed), z2 = gauss(&seed);
        for (int j = 0; j < D; j++)
            X[t * D + j] = (float)(z1 * a[j] + z2 * b[j]);
    }
    double R[D * D], ev[D];
    mkv_error err;
    ck_assert_int_eq(mkv_mosaic_rotation(X, N, D, R, ev, &err), MKV_OK);
    mkv_mosaic_round_f16(R, D * D);
    mkv_mosaic_search_opts o = {.d = D, .block = 8, .keydim = 8, .bound = 0, .allow_rotate = 1, .obs = NULL};
    mkv_mosaic_candidate *c;
    int n;
    ck_assert_int_eq(mkv_mosaic_candidates(&o, X, 0, N, R, &c, &n, &err), MKV_OK);
    const mkv_mosaic_candidate *s = &c[mkv_mosaic_pick(c, n, 0.01)];
    ck_assert_int_eq(s->s.rotate, 1);   /* keys of a rotatable segment are rotated */
    ck_assert_int_eq(s->s.r, 2);
    ck_assert_int_eq(s->s.dprime, 8);
    ck_assert_uint_eq(s->bytes, 960);
    ck_assert_double_le(s->energy, 1e-4);
    ck_assert_int_eq(s->measured, 0);
    for (int i = 0; i < n; i++)
        ck_assert_int_eq(c[i].s.rotate, 1);
    mkv_free(c);

    /* Values (no block keys) living on raw channels 3 and 17: no rotation,
     * r = 2, g = 1 costs 64 x 2 x 2 + 64 x 4 = 512 bytes and loses
     * nothing; any rotated candidate pays 32 x d' x 2 >= 512 for R alone. */
    for (int t = 0; t < N; t++) {
        for (int j = 0; j < D; j++)
            X[t * D + j] = 0;
        X[t * D + 3] = (float)gauss(&seed);
        X[t * D + 17] = (float)gauss(&seed);
    }
    ck_assert_int_eq(mkv_mosaic_rotation(X, N, D, R, ev, &err), MKV_OK);
    mkv_mosaic_round_f16(R, D * D);
    o = (mkv_mosaic_search_opts){.d = D, .block = 0, .allow_rotate = 1};
    ck_assert_int_eq(mkv_mosaic_candidates(&o, X, 0, N, R, &c, &n, &err), MKV_OK);
    s = &c[mkv_mosaic_pick(c, n, 0.01)];
    ck_assert_int_eq(s->s.rotate, 0);
    ck_assert_int_eq(s->s.r, 2);
    ck_assert_int_eq(s->s.g, 1);
    ck_assert_uint_eq(s->bytes, 512);
    ck_assert_double_eq(s->energy, 0);
    mkv_free(c);
}
END_TEST

static int same_strategy(const mkv_mosaic_strategy *a, const mkv_mosaic_strategy *b)
{
    return a->start == b->start && a->len == b->len && a->rotate == b->rotate && a->r == b->r && a->g == b->g &&
           a->dprime == b->dprime && a->pervector == b->pervector && a->keydim == b->keydim &&
           a->bound == b->bound;
}

static int ref_group_cmp(const void *a, const void *b)
{
    const double *x = a, *y = b;   /* {energy, index} */
    if (x[0] != y[0])
        return x[0] > y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : 1;
}

/* The reconstruction x^ [d] of x under s, computed here: rotated by R
 * (raw when not rotated), top r/g groups among the first d'/g by a qsort,
 * kept values rounded to fp16, rotated back; *dropped receives the energy
 * of the rotated elements not kept, *total that of all of them. */
static void ref_candidate_vector(const float *x, int d, const double *R, const mkv_mosaic_strategy *s,
                                 double *xhat, double *dropped, double *total)
{
    double xt[MKV_MOSAIC_MAX_D], grp[MKV_MOSAIC_MAX_D][2];
    for (int c = 0; c < d; c++) {
        xt[c] = 0;
        for (int j = 0; j < d; j++)
            xt[c] += x[j] * (s->rotate ? R[j * d + c] : (j == c));
        *total += xt[c] * xt[c];
    }
    int ng = s->dprime / s->g;
    for (int i = 0; i < ng; i++) {
        grp[i][0] = 0;
        grp[i][1] = i;
        for (int c = i * s->g; c < (i + 1) * s->g; c++)
            grp[i][0] += xt[c] * xt[c];
    }
    qsort(grp, (size_t)ng, sizeof grp[0], ref_group_cmp);
    uint8_t kept[MKV_MOSAIC_MAX_D] = {0};
    for (int i = 0; i < s->r / s->g; i++)
        for (int c = 0; c < s->g; c++)
            kept[(int)grp[i][1] * s->g + c] = 1;
    for (int j = 0; j < d; j++)
        xhat[j] = 0;
    for (int c = 0; c < d; c++) {
        if (!kept[c]) {
            *dropped += xt[c] * xt[c];
            continue;
        }
        double v = mkv_f16_to_f32(mkv_f32_to_f16((float)xt[c]));
        for (int j = 0; j < d; j++)
            xhat[j] += v * (s->rotate ? R[j * d + c] : (j == c));
    }
}

/* Softmax attention in double of q over n rows K, V where use[t]; the
 * relative L2 error of the result against ref [d]. */
static double ref_masked_err(const double *q, const double *K, const double *V, int n, const uint8_t *use,
                             int d, const double *ref)
{
    double m = -INFINITY, l = 0, o[MKV_MOSAIC_MAX_D] = {0}, s[256];
    for (int t = 0; t < n; t++)
        if (use[t]) {
            s[t] = 0;
            for (int j = 0; j < d; j++)
                s[t] += q[j] * K[t * d + j];
            s[t] /= sqrt(d);
            m = fmax(m, s[t]);
        }
    for (int t = 0; t < n; t++)
        if (use[t]) {
            double w = exp(s[t] - m);
            l += w;
            for (int j = 0; j < d; j++)
                o[j] += w * V[t * d + j];
        }
    double num = 0, den = 0;
    for (int j = 0; j < d; j++) {
        num += (o[j] / l - ref[j]) * (o[j] / l - ref[j]);
        den += ref[j] * ref[j];
    }
    return sqrt(num / den);
}

START_TEST(candidates_match_reference)
{
    /* A segment of N tokens after NO other (already attended, exact)
     * tokens; NQ queries with their own visible range and a selection of
     * the segment's tokens made up here. The view of mkv_mosaic_evaluate
     * is filled from its definition; each returned candidate's bytes,
     * energy and output error must equal those computed here by
     * reconstructing the segment (ref_candidate_vector) and attending
     * over [other tokens, selected segment tokens] directly; grid
     * candidates not returned must be beaten on bytes and energy by a
     * returned one. */
    enum { NO = 6, N = 40, D = 16, NQ = 5, T = NO + N };
    float K[T * D], V[T * D];
    gen_rows(61, T, D, 1.5, K);
    gen_rows(62, T, D, 0.0, V);
    const float *Kseg = K + NO * D, *Vseg = V + NO * D;
    const int visible[NQ] = {40, 40, 26, 11, 40};
    uint8_t sel[NQ][N] = {{0}};
    uint64_t seed = 63;
    for (int j = 0; j < NQ; j++)
        for (int t = 0; t < visible[j]; t++)
            sel[j][t] = j != 3 && test_uniform(&seed) < 0.4;   /* query 3 selects none */
    double q[NQ * D], exact[NQ * D], err0[NQ], m[NQ], l_rest[NQ], acc_rest[NQ * D], w[NQ * N];
    int64_t first[NQ + 1];
    int32_t tok[NQ * N];
    double Kd[T * D], Vd[T * D];
    for (int i = 0; i < T * D; i++) {
        Kd[i] = K[i];
        Vd[i] = V[i];
    }
    float qf[NQ * D];
    gen_queries(64, K, T, D, NQ, qf);
    int64_t np = 0;
    for (int j = 0; j < NQ; j++) {
        uint8_t all[T], chosen[T];
        for (int t = 0; t < T; t++) {
            all[t] = t < NO + visible[j];
            chosen[t] = t < NO || (t < NO + visible[j] && sel[j][t - NO]);
        }
        for (int c = 0; c < D; c++)
            q[j * D + c] = qf[j * D + c];
        ref_attend(Kd, Vd, T, D, all, qf + j * D, 1, 1 / sqrt(D), exact + j * D);
        err0[j] = ref_masked_err(q + j * D, Kd, Vd, T, chosen, D, exact + j * D);
        double s[T];
        m[j] = -INFINITY;
        for (int t = 0; t < T; t++) {
            s[t] = 0;
            for (int c = 0; c < D; c++)
                s[t] += q[j * D + c] * Kd[t * D + c];
            s[t] /= sqrt(D);
            if (chosen[t])
                m[j] = fmax(m[j], s[t]);
        }
        l_rest[j] = 0;
        for (int c = 0; c < D; c++)
            acc_rest[j * D + c] = 0;
        for (int t = 0; t < NO; t++) {
            l_rest[j] += exp(s[t] - m[j]);
            for (int c = 0; c < D; c++)
                acc_rest[j * D + c] += exp(s[t] - m[j]) * Vd[t * D + c];
        }
        first[j] = np;
        for (int t = 0; t < N; t++)
            if (t < visible[j] && sel[j][t]) {
                tok[np] = t;
                w[np++] = exp(s[NO + t] - m[j]);
            }
    }
    first[NQ] = np;
    mkv_mosaic_segobs obs = {.nq = NQ, .d = D, .scale = 1 / sqrt(D), .q = q, .exact = exact, .err0 = err0,
                             .m = m, .l_rest = l_rest, .acc_rest = acc_rest, .first = first, .tok = tok,
                             .w = w, .keys = Kseg, .values = Vseg};
    /* r: {1..8, 10, 12, 14, 16, 20, 24, 28, 32} / 32 of d = 16, rounded half up, distinct */
    const int rs[] = {1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16}, dps[] = {4, 8, 12, 16}, gs[] = {1, 2, 4};
    mkv_error err;
    for (int which = 0; which < 2; which++) {
        const float *X = which ? Vseg : Kseg;
        double R[D * D], ev[D];
        ck_assert_int_eq(mkv_mosaic_rotation(X, N, D, R, ev, &err), MKV_OK);
        mkv_mosaic_round_f16(R, D * D);
        int block = which ? 0 : 8;
        mkv_mosaic_search_opts o = {.d = D, .block = block, .keydim = which ? 0 : 8, .bound = which ? 0 : 2,
                                    .allow_rotate = 1, .obs = &obs};
        mkv_mosaic_candidate *c;
        int n;
        ck_assert_int_eq(mkv_mosaic_candidates(&o, X, NO, N, R, &c, &n, &err), MKV_OK);
        ck_assert_int_gt(n, 0);
        /* the grid, priced and judged here */
        static mkv_mosaic_candidate grid[2 * 3 * 4 * 12];
        int ng = 0;
        for (int rot = 0; rot < 2; rot++)
            for (int gi = 0; gi < 3; gi++)
                for (int di = 0; di < 4; di++)
                    for (int ri = 0; ri < 12; ri++) {
                        int g = gs[gi], dp = rot ? dps[di] : D, r = rs[ri];
                        if ((!rot && (di > 0 || which == 0)) || r % g || dp % g || r > dp)
                            continue;
                        mkv_mosaic_candidate *x = &grid[ng++];
                        x->s = (mkv_mosaic_strategy){.start = NO, .len = N, .rotate = rot, .r = r, .g = g,
                                                     .dprime = dp, .pervector = 1, .bits = 16,
                                                     .keydim = which ? 0 : 8, .bound = which ? 0 : 2};
                        x->bytes = ref_bytes(&x->s, D, block);
                        double dropped = 0, total = 0, hat[N * D];
                        for (int t = 0; t < N; t++)
                            ref_candidate_vector(X + t * D, D, R, &x->s, hat + t * D, &dropped, &total);
                        x->energy = dropped / total;
                        double sum = 0;
                        for (int j = 0; j < NQ; j++) {
                            double Kc[T * D], Vc[T * D];
                            uint8_t chosen[T];
                            memcpy(Kc, Kd, sizeof Kc);
                            memcpy(Vc, Vd, sizeof Vc);
                            memcpy(which ? Vc + NO * D : Kc + NO * D, hat, sizeof(double) * N * D);
                            for (int t = 0; t < T; t++)
                                chosen[t] = t < NO || (t < NO + visible[j] && sel[j][t - NO]);
                            sum += ref_masked_err(q + j * D, Kc, Vc, T, chosen, D, exact + j * D) - err0[j];
                        }
                        x->output = sum / NQ;
                    }
        for (int i = 0; i < n; i++) {
            int k = 0;
            while (k < ng && !same_strategy(&grid[k].s, &c[i].s))
                k++;
            ck_assert_msg(k < ng, "candidate %d is not in the grid", i);
            ck_assert_uint_eq(c[i].bytes, grid[k].bytes);
            ck_assert_double_eq_tol(c[i].energy, grid[k].energy, 1e-10);
            ck_assert_int_eq(c[i].measured, 1);
            ck_assert_double_eq_tol(c[i].output, grid[k].output, 1e-9);
        }
        for (int k = 0; k < ng; k++) {
            int beaten = 0;
            for (int i = 0; i < n && !beaten; i++)
                beaten = c[i].bytes <= grid[k].bytes && c[i].energy <= grid[k].energy + 1e-10;
            ck_assert_msg(beaten, "grid candidate %d (r %d g %d d' %d rotate %d) dropped unbeaten", k,
                          grid[k].s.r, grid[k].s.g, grid[k].s.dprime, grid[k].s.rotate);
        }
        mkv_free(c);
    }
}
END_TEST

START_TEST(pick_threshold_rule)
{
    mkv_mosaic_candidate c[5] = {
        {.bytes = 100, .output = 0.3, .measured = 1},
        {.bytes = 50, .output = 0.2, .measured = 1},
        {.bytes = 50, .output = 0.1, .measured = 1},
        {.bytes = 200, .output = 0.05, .measured = 1},
        {.bytes = 300, .output = 0.05, .measured = 1},
    };
    ck_assert_int_eq(mkv_mosaic_pick(c, 5, 0.25), 2);    /* fewest bytes, then lower loss */
    ck_assert_int_eq(mkv_mosaic_pick(c, 5, 0.1), 2);
    ck_assert_int_eq(mkv_mosaic_pick(c, 5, 0.07), 3);
    ck_assert_int_eq(mkv_mosaic_pick(c, 5, 0.01), 3);    /* none qualifies: lowest loss, fewer bytes */
    /* not measured: the energy decides */
    mkv_mosaic_candidate e[2] = {{.bytes = 10, .energy = 0.5, .output = 0}, {.bytes = 20, .energy = 0.1}};
    ck_assert_int_eq(mkv_mosaic_pick(e, 2, 0.2), 1);
    ck_assert_double_eq(mkv_mosaic_candidate_loss(&e[0]), 0.5);
}
END_TEST

START_TEST(allocate_matches_brute_force)
{
    /* three items with decreasing returns; every budget from the
     * cheapest total up: the choice fits, and its summed loss equals the
     * best of all 4^3 combinations found here */
    static mkv_mosaic_candidate a[4] = {{.bytes = 10, .energy = 1.0}, {.bytes = 20, .energy = 0.5},
                                        {.bytes = 40, .energy = 0.2}, {.bytes = 80, .energy = 0.1}};
    static mkv_mosaic_candidate b[4] = {{.bytes = 10, .energy = 0.8}, {.bytes = 30, .energy = 0.3},
                                        {.bytes = 50, .energy = 0.25}, {.bytes = 70, .energy = 0.24}};
    static mkv_mosaic_candidate e[4] = {{.bytes = 5, .energy = 0.4}, {.bytes = 15, .energy = 0.2},
                                        {.bytes = 25, .energy = 0.12}, {.bytes = 45, .energy = 0.05}};
    mkv_mosaic_candidate *const items[3] = {a, b, e};
    const int nc[3] = {4, 4, 4};
    for (uint64_t budget = 25; budget <= 200; budget += 5) {
        int pick[3];
        mkv_mosaic_allocate(items, nc, 3, budget, pick);
        uint64_t used = a[pick[0]].bytes + b[pick[1]].bytes + e[pick[2]].bytes;
        double loss = a[pick[0]].energy + b[pick[1]].energy + e[pick[2]].energy, best = INFINITY;
        ck_assert_uint_le(used, budget);
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++)
                for (int k = 0; k < 4; k++)
                    if (a[i].bytes + b[j].bytes + e[k].bytes <= budget)
                        best = fmin(best, a[i].energy + b[j].energy + e[k].energy);
        ck_assert_msg(fabs(loss - best) < 1e-12, "budget %d: loss %g, best %g", (int)budget, loss, best);
    }
    /* nothing fits: the cheapest of each */
    int pick[3];
    mkv_mosaic_allocate(items, nc, 3, 10, pick);
    ck_assert_int_eq(pick[0] + pick[1] + pick[2], 0);
}
END_TEST

/* Attention of aq over h (budget b) against exact double attention over
 * the raw rows; the relative error per query head into e [G]. */
static void errors_of(const mkv_mosaic_head *h, const head_data *hd, const mkv_attend_query *aq, double b,
                      double *e)
{
    float out[8 * 32];
    uint8_t att[2000] = {0};
    mkv_attend_result res = {.out = out, .attended = att};
    mkv_mosaic_attn_opts o = {.budget = b};
    mkv_error err;
    ck_assert_int_eq(mkv_mosaic_attend(h, &o, aq, &res, &err), MKV_OK);
    double *K = malloc(sizeof(double) * (size_t)(hd->T * hd->d)), *V = malloc(sizeof(double) * (size_t)(hd->T * hd->d));
    ck_assert(K && V);
    for (int64_t i = 0; i < hd->T * hd->d; i++) {
        K[i] = hd->k[i];
        V[i] = hd->v[i];
    }
    double ref[8 * 32];
    ref_attend(K, V, aq->pos + 1, hd->d, NULL, aq->q, aq->G, aq->scale, ref);
    for (int g = 0; g < aq->G; g++)
        e[g] = rel_err(out + g * hd->d, ref + g * hd->d, hd->d);
    free(K);
    free(V);
}

START_TEST(recorded_loss_is_attention_error)
{
    /* One segment, every query an observation (W = 8 <= 64 / G). A head
     * with K packed (keep 0.25) and V kept whole, attended at the
     * compressor's budget, must add to the error of the head with both
     * whole (same selection: block keys do not depend on r) what the K
     * loss table says, averaged over the queries; likewise for V. Only
     * fp16 storage of the whole tensors separates the two. */
    head_data hd;
    head_data_make(&hd, 71, 600, 32, 2, 8);
    mkv_head_kv in = as_input(&hd);
    mkv_mosaic_config c = fixed_config(32, 0.25, 1, 1.0);
    c.segment = 600;
    mkv_mosaic_head packed, whole_a, whole_b;
    mkv_error err;
    ck_assert_int_eq(mkv_mosaic_compress(&c, &in, &packed, &err), MKV_OK);
    c.r = 32;
    ck_assert_int_eq(mkv_mosaic_compress(&c, &in, &whole_a, &err), MKV_OK);
    ck_assert_int_eq(mkv_mosaic_compress(&c, &in, &whole_b, &err), MKV_OK);
    ck_assert_int_eq(packed.k.nseg, 1);
    ck_assert_mem_eq(packed.k.blockkeys, whole_a.k.blockkeys, sizeof *packed.k.blockkeys * (size_t)packed.k.n_blockkeys);
    /* whole_a: K packed, V whole; whole_b: K whole, V packed */
    mkv_mosaic_tensor tmp = packed.k;
    packed.k = whole_a.k;
    whole_a.k = tmp;
    tmp = packed.v;
    packed.v = whole_b.v;
    whole_b.v = tmp;
    double added[2] = {0, 0};
    for (int64_t w = 0; w < hd.W; w++) {
        float q[2 * 32];
        for (int g = 0; g < 2; g++)
            memcpy(q + g * 32, hd.q + ((size_t)g * hd.W + w) * 32, sizeof(float) * 32);
        mkv_attend_query aq = {.G = 2, .d = 32, .q = q, .pos = hd.qpos[w], .scale = 1 / sqrt(32.0)};
        double e0[2], ek[2], ev[2];
        errors_of(&packed, &hd, &aq, c.attn.budget, e0);   /* now both whole */
        errors_of(&whole_a, &hd, &aq, c.attn.budget, ek);
        errors_of(&whole_b, &hd, &aq, c.attn.budget, ev);
        for (int g = 0; g < 2; g++) {
            added[0] += (ek[g] - e0[g]) / (2.0 * hd.W);
            added[1] += (ev[g] - e0[g]) / (2.0 * hd.W);
        }
    }
    /* whole_a holds packed's original K loss table, whole_b its V table */
    ck_assert_double_gt(whole_a.k.loss[1], 1e-3);
    ck_assert_double_eq_tol(added[0], whole_a.k.loss[1], 2e-3 + 0.02 * whole_a.k.loss[1]);
    ck_assert_double_eq_tol(added[1], whole_b.v.loss[1], 2e-3 + 0.02 * whole_b.v.loss[1]);
    mkv_mosaic_head_free(&packed);
    mkv_mosaic_head_free(&whole_a);
    mkv_mosaic_head_free(&whole_b);
    head_data_free(&hd);
}
END_TEST

START_TEST(ratio_rule_hits_target)
{
    /* 4 segments; with and without queries, ratio 3 and 2: the hand count
     * of the head's bytes is within the budget and within 8% of it. */
    for (int withq = 0; withq < 2; withq++) {
        head_data hd;
        head_data_make(&hd, 81, 1220, 32, 2, withq ? 8 : 0);
        mkv_head_kv in = as_input(&hd);
        for (int ri = 0; ri < 2; ri++) {
            double ratio = ri ? 2 : 3;
            mkv_mosaic_config c = fixed_config(32, 0.25, 1, 1.0);
            c.segment = 300;
            c.dynamic = 1;
            c.ratio = ratio;
            mkv_mosaic_head h;
            mkv_error err;
            ck_assert_int_eq(mkv_mosaic_compress(&c, &in, &h, &err), MKV_OK);
            ck_assert_int_eq(h.k.nseg, 4);
            double budget = 2.0 * 1220 * 32 * 2 / ratio, got = (double)hand_count(&h);
            ck_assert_double_le(got, budget);
            ck_assert_double_ge(got, 0.92 * budget);
            for (int64_t s = 0; s < 4; s++)
                ck_assert_int_eq(!isnan(h.k.loss[2 * s + 1]), withq);
            mkv_mosaic_head_free(&h);
        }
        head_data_free(&hd);
    }
}
END_TEST

START_TEST(bound_follows_recall)
{
    /* dynamic with queries: each segment's block keys keep bound 2 exactly
     * when its top blocks (ranked with bound 2) hold more of the exact
     * attention within the segment than with bound 0, recomputed here */
    enum { T = 900, D = 32, G = 2, W = 8, KD = 16, B = 8 };
    head_data hd;
    head_data_make(&hd, 91, T, D, G, W);
    /* a token in every few carries a spike on the offset channel the
     * queries share, so the leading rotated channel varies within blocks */
    for (int64_t t = 20; t < T; t += 13)
        hd.k[t * D + 1] += 4.0f;
    mkv_head_kv in = as_input(&hd);
    mkv_mosaic_config c = fixed_config(D, 0.25, 1, 1.0);
    c.segment = 300;
    c.dynamic = 1;
    mkv_mosaic_head h;
    mkv_error err;
    ck_assert_int_eq(mkv_mosaic_compress(&c, &in, &h, &err), MKV_OK);
    int decided = 0;
    for (int64_t si = 0; si < h.k.nseg; si++) {
        const mkv_mosaic_strategy *st = &h.k.seg[si];
        ck_assert(st->bound == 0 || st->bound == 2);
        double R[D * D], ev[D];
        ck_assert_int_eq(mkv_mosaic_rotation(hd.k + st->start * D, st->len, D, R, ev, &err), MKV_OK);
        mkv_mosaic_round_f16(R, D * D);
        double recall[2] = {0, 0};
        for (int mi = 0; mi < 2; mi++) {
            int m = mi ? 2 : 0;
            int64_t nb = (st->len + B - 1) / B;
            static float rows[400 * (KD + 2)];
            for (int64_t b = 0; b < nb; b++)
                for (int cc = 0; cc < KD; cc++) {
                    double lo = INFINITY, hi = -INFINITY, sum = 0;
                    int64_t cnt = 0;
                    for (int64_t t = b * B; t < (b + 1) * B && t < st->len; t++, cnt++) {
                        double x = 0;
                        for (int j = 0; j < D; j++)
                            x += hd.k[(st->start + t) * D + j] * R[j * D + cc];
                        lo = fmin(lo, x);
                        hi = fmax(hi, x);
                        sum += x;
                    }
                    float *row = rows + b * (KD + m);
                    if (cc < m) {
                        row[cc] = mkv_f16_to_f32(mkv_f32_to_f16((float)lo));
                        row[m + cc] = mkv_f16_to_f32(mkv_f32_to_f16((float)hi));
                    } else {
                        row[m + cc] = mkv_f16_to_f32(mkv_f32_to_f16((float)(sum / (double)cnt)));
                    }
                }
            for (int w = 0; w < W; w++) {
                int64_t p = hd.qpos[w];
                if (p < st->start)
                    continue;
                int64_t vis = (p + 1 < st->start + st->len ? p + 1 : st->start + st->len) - st->start;
                int64_t nbv = (vis + B - 1) / B, want = (int64_t)ceil((double)vis *
                    (double)mkv_budget_tokens(c.attn.budget, p + 1) / (double)(p + 1) - 1e-9);
                double score[400];
                for (int64_t b = 0; b < nbv; b++) {
                    score[b] = -INFINITY;
                    for (int g = 0; g < G; g++) {
                        const float *q = hd.q + ((size_t)g * W + w) * D;
                        double sc = 0;
                        for (int cc = 0; cc < KD; cc++) {
                            double qt = 0;
                            for (int j = 0; j < D; j++)
                                qt += q[j] * R[j * D + cc];
                            const float *row = rows + b * (KD + m);
                            sc += cc < m ? fmax(qt * row[cc], qt * row[m + cc]) : qt * row[m + cc];
                        }
                        score[b] = fmax(score[b], sc / sqrt(D));
                    }
                }
                uint8_t taken[400 * B] = {0};
                for (int64_t got = 0; got < want;) {
                    int64_t best = -1;
                    for (int64_t b = 0; b < nbv; b++)
                        if (score[b] > -INFINITY && (best < 0 || score[b] > score[best]))
                            best = b;
                    if (best < 0)
                        break;
                    score[best] = -INFINITY;
                    for (int64_t t = best * B; t < (best + 1) * B && t < vis; t++, got++)
                        taken[t] = 1;
                }
                for (int g = 0; g < G; g++) {
                    const float *q = hd.q + ((size_t)g * W + w) * D;
                    double s[400 * B], mx = -INFINITY, all = 0, held = 0;
                    for (int64_t t = 0; t < vis; t++) {
                        s[t] = 0;
                        for (int j = 0; j < D; j++)
                            s[t] += q[j] * hd.k[(st->start + t) * D + j];
                        s[t] /= sqrt(D);
                        mx = fmax(mx, s[t]);
                    }
                    for (int64_t t = 0; t < vis; t++) {
                        all += exp(s[t] - mx);
                        held += taken[t] ? exp(s[t] - mx) : 0;
                    }
                    recall[mi] += held / all / G;
                }
            }
        }
        if (fabs(recall[1] - recall[0]) > 1e-9) {
            ck_assert_int_eq(st->bound, recall[1] > recall[0] ? 2 : 0);
            decided++;
        }
    }
    ck_assert_int_gt(decided, 0);
    mkv_mosaic_head_free(&h);
    head_data_free(&hd);
}
END_TEST

/* ---------------------------------------------------------------- parameters */

static int set_raw(mkv_params *p, const char *key, const char *value)
{
    for (int i = 0; i < p->n; i++)
        if (strcmp(p->spec[i]->name, key) == 0) {
            snprintf(p->value[i], sizeof p->value[i], "%s", value);
            return 0;
        }
    return -1;
}

static void expect_refused(const mkv_method *m, const char *key, const char *value, const char *strategy,
                           const char *words)
{
    mkv_params p;
    mkv_params_init(&p, m->params);
    if (strategy)
        ck_assert_int_eq(set_raw(&p, "strategy", strategy), 0);
    ck_assert_int_eq(set_raw(&p, key, value), 0);
    mkv_dump_meta meta;
    mkv_dump_meta_init(&meta);
    meta.n_layers = 1;
    meta.n_heads = 4;
    meta.n_kv_heads = 2;
    meta.head_dim = 64;
    meta.n_tokens = 1024;
    mkv_error err;
    mkv_error_clear(&err);
    ck_assert_int_eq(m->check(&p, &meta, &err), MKV_EUSAGE);
    ck_assert_msg(strstr(err.msg, words) != NULL, "message '%s' lacks '%s'", err.msg, words);
}

START_TEST(bad_parameters_refused)
{
    const mkv_method *m = &mkv_method_mosaic;
    expect_refused(m, "segment", "4", NULL, "smaller than block");
    expect_refused(m, "budget", "5000", NULL, "larger than the context");
    expect_refused(m, "budget", "10.5", NULL, "whole number");
    expect_refused(m, "bound", "40", NULL, "larger than the 32 block-key channels");   /* keydim 0.5 of 64 */
    /* keep 0.1 of 64: r = 7, not a multiple of 4 */
    mkv_params p;
    mkv_params_init(&p, m->params);
    ck_assert_int_eq(set_raw(&p, "keep", "0.1"), 0);
    ck_assert_int_eq(set_raw(&p, "group", "4"), 0);
    ck_assert_int_eq(set_raw(&p, "strategy", "fixed"), 0);
    mkv_dump_meta meta;
    mkv_dump_meta_init(&meta);
    meta.n_layers = 1;
    meta.n_heads = 4;
    meta.n_kv_heads = 2;
    meta.head_dim = 64;
    meta.n_tokens = 1024;
    mkv_error err;
    ck_assert_int_eq(m->check(&p, &meta, &err), MKV_EUSAGE);
    ck_assert_ptr_nonnull(strstr(err.msg, "does not divide r = 7"));
    /* defaults pass */
    mkv_params_init(&p, m->params);
    ck_assert_int_eq(m->check(&p, &meta, &err), MKV_OK);
    mkv_params_init(&p, mkv_method_uniform2d.params);
    ck_assert_int_eq(mkv_method_uniform2d.check(&p, &meta, &err), MKV_OK);
    expect_refused(&mkv_method_uniform2d, "segment", "2", NULL, "smaller than block");
    /* the ranges (those --list-methods shows) are the parameter layer's,
     * in one wording */
    static const char *const ranges[][3] = {
        {"keep", "1.5", "must be in (0, 1]"},   {"keep", "0", "must be in (0, 1]"},
        {"keydim", "0", "must be in (0, 1]"},   {"energy", "0", "must be in (0, 1]"},
        {"group", "3", "must be one of 1|2|4"}, {"threshold", "2", "must be in 0..1"},
        {"block", "0", "must be in 1..1000000"}, {"budget", "0", "must be in (0, 1e+15]"},
        {"rotate", "maybe", "must be one of on|off"}, {"ratio", "0.5", "must be in 1..1000000"},
        {"strategy", "greedy", "must be one of fixed|dynamic|ratio"},
    };
    for (size_t i = 0; i < sizeof ranges / sizeof *ranges; i++) {
        mkv_params_init(&p, m->params);
        ck_assert_int_eq(mkv_params_set(&p, ranges[i][0], ranges[i][1], &err), MKV_EUSAGE);
        char want[160];
        snprintf(want, sizeof want, "invalid value '%s' for parameter '%s': %s", ranges[i][1], ranges[i][0],
                 ranges[i][2]);
        ck_assert_str_eq(err.msg, want);
    }
}
END_TEST

/* ---------------------------------------------------------------- file round trip */

/* Compress hd (1 layer, 1 KV head, G = 2, d = 32) with method m and the
 * space-separated parameters into the compressed dump at path; p gets the
 * parameters. */
static void write_dump(const head_data *hd, const mkv_method *m, const char *params, mkv_params *p,
                       const char *path)
{
    mkv_error err;
    mkv_params_init(p, m->params);
    ck_assert_msg(mkv_params_parse_list(p, params, &err) > 0, "%s", err.msg);
    mkv_cdump_meta meta;
    memset(&meta, 0, sizeof meta);
    snprintf(meta.method, sizeof meta.method, "%s", m->name);
    mkv_params_format(p, meta.params, sizeof meta.params);
    snprintf(meta.source, sizeof meta.source, "test");
    mkv_dump_meta_init(&meta.raw);
    meta.raw.n_layers = 1;
    meta.raw.n_heads = 2;
    meta.raw.n_kv_heads = 1;
    meta.raw.head_dim = 32;
    meta.raw.n_tokens = hd->T;
    meta.raw.n_queries = hd->W;
    ck_assert_int_eq(m->check(p, &meta.raw, &err), MKV_OK);
    mkv_cdump_writer *w;
    ck_assert_int_eq(mkv_cdump_create(path, NULL, &meta, hd->qpos, &w, &err), MKV_OK);
    mkv_head_kv in = as_input(hd);
    ck_assert_msg(m->compress(p, &in, w, &err) == MKV_OK, "%s", err.msg);
    ck_assert_msg(mkv_cdump_commit(w, &err) == MKV_OK, "%s", err.msg);
}

START_TEST(cdump_round_trip_counts_bytes)
{
    head_data hd;
    head_data_make(&hd, 51, 500, 32, 2, 4);
    const mkv_method *m = &mkv_method_mosaic;
    mkv_params p;
    mkv_error err;
    char path[256];
    test_path(path, sizeof path, "mosaic.h5");
    write_dump(&hd, m, "segment=128 recent=16 budget=0.25", &p, path);
    mkv_head_kv in = as_input(&hd);

    /* the same head in memory, for the hand count and the comparison: the
     * defaults (strategy ratio 3, block keys over 16 channels, 2 bounds)
     * with the parameters set above */
    mkv_mosaic_config c = {.sink = 4, .recent = 16, .segment = 128, .block = 8, .keydim = 16, .bound = 2,
                           .dynamic = 1, .rotate = 1, .r = 8, .g = 1, .energy = 0.95, .threshold = 0.1,
                           .ratio = 3, .pervector = 1, .bits = 16, .quantize = 1, .qgroup = 64,
                           .attn = {.budget = 0.25, .agg_sum = 0}};
    mkv_mosaic_head h;
    ck_assert_int_eq(mkv_mosaic_compress(&c, &in, &h, &err), MKV_OK);

    mkv_cdump *cd;
    ck_assert_int_eq(mkv_cdump_open(path, &cd, &err), MKV_OK);
    ck_assert_uint_eq(mkv_cdump_meta_of(cd)->physical_bytes, hand_count(&h));
    ck_assert_uint_eq(mkv_cdump_meta_of(cd)->logical_bytes, 2 * 500 * 32 * 2);
    ck_assert_uint_le(hand_count(&h) * 3, 2 * 500 * 32 * 2);
    void *state;
    ck_assert_msg(m->load(&p, cd, 0, 0, &state, &err) == MKV_OK, "%s", err.msg);
    float q[2 * 32], out1[2 * 32], out2[2 * 32];
    gen_queries(5, hd.k, 500, 32, 2, q);
    mkv_attend_query aq = {.G = 2, .d = 32, .q = q, .pos = 480, .scale = 1 / sqrt(32.0)};
    uint8_t att1[500] = {0}, att2[500] = {0};
    mkv_attend_result r1 = {.out = out1, .attended = att1}, r2 = {.out = out2, .attended = att2};
    ck_assert_int_eq(m->attend(state, &aq, &r1, &err), MKV_OK);
    mkv_mosaic_attn_opts o = {.budget = 0.25};
    ck_assert_int_eq(mkv_mosaic_attend(&h, &o, &aq, &r2, &err), MKV_OK);
    ck_assert_mem_eq(out1, out2, sizeof out1);
    ck_assert_mem_eq(att1, att2, sizeof att1);
    ck_assert_uint_eq(r1.bytes_read, r2.bytes_read);
    /* a query outside the cache is refused */
    aq.pos = 500;
    ck_assert_int_eq(m->attend(state, &aq, &r1, &err), MKV_EUSAGE);
    m->free_state(state);
    mkv_cdump_close(cd);
    mkv_mosaic_head_free(&h);
    unlink(path);
    head_data_free(&hd);
}
END_TEST

/* Quantized values (fixed bits, and the ratio rule with quantize=on)
 * survive the file bit for bit, are counted by hand, attend as in memory,
 * and every value reads back within half a step of the rotated element
 * x.R computed here in double from the raw key or value and the stored
 * rotation. */
START_TEST(quantized_round_trip)
{
    static const char *const cases[] = {
        "segment=128 recent=16 budget=0.25 strategy=fixed bits=4 keep=0.5",
        "segment=128 recent=16 budget=0.25 strategy=fixed bits=4 keep=0.5 qgroup=0",
        "segment=128 recent=16 budget=0.25 strategy=fixed bits=4 keep=0.5 qgroup=24",
        "segment=128 recent=16 budget=0.25 strategy=fixed bits=2 keep=1 energy=0.7 group=2",
        "segment=128 recent=16 budget=0.25 strategy=fixed bits=8 keep=0.25 rotate=off",
        "segment=128 recent=16 budget=0.25 quantize=on ratio=6",
    };
    head_data hd;
    head_data_make(&hd, 71, 500, 32, 2, 6);
    mkv_head_kv in = as_input(&hd);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        mkv_params p;
        mkv_error err;
        char path[256];
        test_path(path, sizeof path, "quant.h5");
        write_dump(&hd, &mkv_method_mosaic, cases[k], &p, path);
        mkv_mosaic_config c;
        mkv_mosaic_config_of(&p, 32, &c);
        mkv_mosaic_head h;
        ck_assert_int_eq(mkv_mosaic_compress(&c, &in, &h, &err), MKV_OK);
        mkv_cdump *cd;
        ck_assert_int_eq(mkv_cdump_open(path, &cd, &err), MKV_OK);
        ck_assert_uint_eq(mkv_cdump_meta_of(cd)->physical_bytes, hand_count(&h));
        void *state;
        ck_assert_msg(mkv_method_mosaic.load(&p, cd, 0, 0, &state, &err) == MKV_OK, "%s", err.msg);
        const mkv_mosaic_head *l = mkv_mosaic_state_head(state);
        int quantized = 0;
        for (int x = 0; x < 2; x++) {
            const mkv_mosaic_tensor *t = x ? &l->v : &l->k, *tm = x ? &h.v : &h.k;
            const float *raw = x ? hd.v : hd.k;
            ck_assert_int_eq(t->n_values, tm->n_values);
            ck_assert_int_eq(t->n_codes, tm->n_codes);
            if (t->n_values)
                ck_assert_mem_eq(t->values, tm->values, (size_t)t->n_values * sizeof *t->values);
            if (t->n_codes)
                ck_assert_mem_eq(t->codes, tm->codes, (size_t)t->n_codes);
            ref_offsets ro = {0, 0, 0};
            for (int64_t si = 0; si < t->nseg; ref_advance(&t->seg[si], &ro), si++) {
                const mkv_mosaic_strategy *st = &t->seg[si];
                if (st->bits == 16)
                    continue;
                quantized++;
                const uint16_t *R = st->rotate ? t->rotation + t->off_rotation[si] : NULL;
                int cols = mkv_mosaic_rotation_cols(st), bb = mkv_mosaic_bitmap_bytes(st), pos[32];
                /* zeros and steps of each token's group: qgroup tokens, or the segment */
                int64_t per = st->qgroup ? st->qgroup : st->len;
                int64_t qend = si + 1 < t->nseg ? t->off_qparams[si + 1] : t->n_qparams;
                ck_assert_int_eq(qend - t->off_qparams[si], 2 * st->dprime * ((st->len + per - 1) / per));
                for (int64_t j = 0; j < st->len; j++) {
                    const uint16_t *qp = t->qparams + t->off_qparams[si] + 2 * (j / per) * st->dprime;
                    mkv_mosaic_positions(bb ? t->bitmap + t->off_bitmap[si] + j * bb : NULL, st, pos);
                    const float *xr = raw + (st->start + j) * 32;
                    for (int e = 0; e < st->r; e++) {
                        double xt = 0;
                        for (int i = 0; i < 32; i++)
                            xt += (double)xr[i] * (R ? mkv_f16_to_f32(R[i * cols + pos[e]]) : i == pos[e]);
                        double got = ref_value(t, st, &ro, j, e, pos[e]), step = mkv_f16_to_f32(qp[2 * pos[e] + 1]);
                        ck_assert_msg(fabs(got - xt) <= step / 2 * (1 + 1e-6) + fabs(xt) * 0x1p-10 + 1e-6,
                                      "%s: segment %lld token %lld value %d: %g for %g, step %g", cases[k],
                                      (long long)si, (long long)j, e, got, xt, step);
                    }
                }
            }
        }
        ck_assert_msg(quantized > 0, "%s: no quantized segment", cases[k]);
        float q[2 * 32], out1[2 * 32], out2[2 * 32];
        gen_queries(9, hd.k, 500, 32, 2, q);
        mkv_attend_query aq = {.G = 2, .d = 32, .q = q, .pos = 490, .scale = 1 / sqrt(32.0)};
        uint8_t att1[500] = {0}, att2[500] = {0};
        mkv_attend_result r1 = {.out = out1, .attended = att1}, r2 = {.out = out2, .attended = att2};
        ck_assert_int_eq(mkv_method_mosaic.attend(state, &aq, &r1, &err), MKV_OK);
        ck_assert_int_eq(mkv_mosaic_attend(&h, &c.attn, &aq, &r2, &err), MKV_OK);
        ck_assert_mem_eq(out1, out2, sizeof out1);
        ck_assert_uint_eq(r1.bytes_read, r2.bytes_read);
        mkv_method_mosaic.free_state(state);
        mkv_cdump_close(cd);
        mkv_mosaic_head_free(&h);
        unlink(path);
    }
    head_data_free(&hd);
}
END_TEST

/* A dump without queries compresses (the output loss is not measured: NaN
 * in its table, which the file takes for that table alone) and loads back;
 * uniform2d likewise. */
START_TEST(cdump_without_queries)
{
    head_data hd;
    head_data_make(&hd, 53, 400, 32, 2, 0);
    const mkv_method *methods[] = {&mkv_method_mosaic, &mkv_method_uniform2d};
    for (int k = 0; k < 2; k++) {
        mkv_params p;
        mkv_error err;
        char path[256];
        test_path(path, sizeof path, "noq.h5");
        write_dump(&hd, methods[k], "segment=128 recent=16", &p, path);
        mkv_cdump *cd;
        ck_assert_int_eq(mkv_cdump_open(path, &cd, &err), MKV_OK);
        void *state;
        ck_assert_msg(methods[k]->load(&p, cd, 0, 0, &state, &err) == MKV_OK, "%s", err.msg);
        int64_t dims[3];
        ck_assert_int_eq(mkv_cdump_shape(cd, 0, 0, "k/loss", dims), 2);
        float *loss = malloc((size_t)(dims[0] * dims[1]) * sizeof *loss);
        ck_assert_int_eq(mkv_cdump_get(cd, 0, 0, "k/loss", MKV_EL_F32_OR_NAN, loss, (size_t)(dims[0] * dims[1]),
                                       &err), MKV_OK);
        for (int64_t s = 0; s < dims[0]; s++) {
            ck_assert(loss[2 * s] >= 0 && loss[2 * s] <= 1);
            ck_assert(isnan(loss[2 * s + 1]));
        }
        free(loss);
        methods[k]->free_state(state);
        mkv_cdump_close(cd);
        unlink(path);
    }
    head_data_free(&hd);
}
END_TEST

/* Overwrite element `at` of dataset `name` of layer 0, KV head 0 with the
 * raw bits `bits` (1 or 2 bytes, the dataset's own element size). */
static void poke(const char *path, const char *name, hsize_t at, unsigned bits)
{
    char obj[96];
    snprintf(obj, sizeof obj, "/layers/00/00/%s", name);
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    ck_assert(f >= 0);
    hid_t ds = H5Dopen2(f, obj, H5P_DEFAULT), ft = H5Dget_type(ds), fs = H5Dget_space(ds);
    ck_assert(ds >= 0 && ft >= 0 && fs >= 0);
    hsize_t one = 1;
    hid_t ms = H5Screate_simple(1, &one, NULL);
    ck_assert(H5Sselect_elements(fs, H5S_SELECT_SET, 1, &at) >= 0);
    uint8_t b8 = (uint8_t)bits;
    uint16_t b16 = (uint16_t)bits;
    ck_assert(H5Dwrite(ds, ft, ms, fs, H5P_DEFAULT, H5Tget_size(ft) == 1 ? (void *)&b8 : (void *)&b16) >= 0);
    H5Sclose(ms);
    H5Sclose(fs);
    H5Tclose(ft);
    H5Dclose(ds);
    H5Fclose(f);
}

/* Row 0 of X/strategy and byte 0 of X/bitmap of layer 0, KV head 0. */
static void first_row(const char *path, char x, int32_t row[MKV_MOSAIC_TABLE_COLS], uint8_t *byte0)
{
    char obj[96];
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    ck_assert(f >= 0);
    snprintf(obj, sizeof obj, "/layers/00/00/%c/strategy", x);
    hid_t ds = H5Dopen2(f, obj, H5P_DEFAULT), fs = H5Dget_space(ds);
    hsize_t start[2] = {0, 0}, count[2] = {1, MKV_MOSAIC_TABLE_COLS}, n = MKV_MOSAIC_TABLE_COLS, zero = 0, one = 1;
    hid_t ms = H5Screate_simple(1, &n, NULL);
    ck_assert(H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL) >= 0);
    ck_assert(H5Dread(ds, H5T_NATIVE_INT32, ms, fs, H5P_DEFAULT, row) >= 0);
    H5Sclose(ms);
    H5Sclose(fs);
    H5Dclose(ds);
    snprintf(obj, sizeof obj, "/layers/00/00/%c/bitmap", x);
    ds = H5Dopen2(f, obj, H5P_DEFAULT);
    fs = H5Dget_space(ds);
    ms = H5Screate_simple(1, &one, NULL);
    ck_assert(H5Sselect_elements(fs, H5S_SELECT_SET, 1, &zero) >= 0);
    ck_assert(H5Dread(ds, H5T_NATIVE_UINT8, ms, fs, H5P_DEFAULT, byte0) >= 0);
    H5Sclose(ms);
    H5Sclose(fs);
    H5Dclose(ds);
    H5Fclose(f);
}

/* The load refuses what the writer never writes: a bitmap with fewer or
 * more than r/g set bits (attention would read values that are not there,
 * or miss some), a value that is not finite; each with MKV_EFORMAT and a message
 * naming the file, layer, head and array. The expected messages are
 * worked out here from the stored strategy row. */
START_TEST(load_refuses_corrupt_arrays)
{
    head_data hd;
    head_data_make(&hd, 52, 300, 32, 2, 4);
    const mkv_method *m = &mkv_method_mosaic;
    char path[256], want[512];
    test_path(path, sizeof path, "corrupt.h5");
    for (int c = 0; c < 5; c++) {
        const char x = c % 2 ? 'v' : 'k';
        mkv_params p;
        /* fixed: keep 0.25 of 32 = 8 of d' = 32 channels (energy 1), bitmaps of 4 bytes */
        write_dump(&hd, m, "strategy=fixed energy=1 segment=128 recent=16", &p, path);
        int32_t row[MKV_MOSAIC_TABLE_COLS];
        uint8_t b0;
        first_row(path, x, row, &b0);
        const int start = row[0], r = row[3], g = row[4], dp = row[5], ng = dp / g;
        ck_assert_int_eq(start, 4);
        ck_assert_int_eq(r, 8);
        ck_assert_int_eq(dp, 32);
        if (c < 2) {
            /* one group of token 4 (the first compressed token) dropped */
            ck_assert_uint_ne(b0, 0);
            poke(path, x == 'k' ? "k/bitmap" : "v/bitmap", 0, b0 & (b0 - 1u));
            snprintf(want, sizeof want, "'%s': layer 0, KV head 0: array '%c/bitmap': token %d (segment 0) "
                     "keeps %d of %d groups, the strategy keeps r/g = %d", path, x, start, r / g - 1, ng, r / g);
        } else if (c < 4) {
            /* the values of the first compressed token: +inf (fp16 0x7c00) as its third */
            poke(path, x == 'k' ? "k/values" : "v/values", 2, 0x7c00);
            snprintf(want, sizeof want, "'%s': /layers/00/00/%c/values: Inf at index 2", path, x);
        } else {
            /* one group too many: the lowest group of token 4 not kept, added */
            ck_assert_uint_ne(b0, 0xff);
            poke(path, "k/bitmap", 0, b0 | (~b0 & (b0 + 1u)));
            snprintf(want, sizeof want, "'%s': layer 0, KV head 0: array 'k/bitmap': token %d (segment 0) "
                     "keeps %d of %d groups, the strategy keeps r/g = %d", path, start, r / g + 1, ng, r / g);
        }
        mkv_cdump *cd;
        mkv_error err;
        ck_assert_int_eq(mkv_cdump_open(path, &cd, &err), MKV_OK);
        void *state = NULL;
        ck_assert_int_eq(m->load(&p, cd, 0, 0, &state, &err), MKV_EFORMAT);
        ck_assert_ptr_null(state);
        ck_assert_str_eq(err.msg, want);
        mkv_cdump_close(cd);
    }
    unlink(path);
    head_data_free(&hd);
}
END_TEST

static Suite *mosaic_suite(void)
{
    Suite *s = suite_create("mosaic");
    TCase *tc = tcase_create("pieces");
    tcase_add_test(tc, rotation_orthonormal_and_sorted);
    tcase_add_test(tc, dprime_by_energy_hand_count);
    tcase_add_test(tc, select_hand_made_vector);
    tcase_add_test(tc, dequantize_vector_equals_reference);
    tcase_add_test(tc, encode_keeps_values_exactly);
    tcase_add_test(tc, block_keys_hand_made);
    tcase_add_test(tc, popcount_is_r_for_every_vector);
    tcase_add_test(tc, segment_bytes_hand_count);
    suite_add_tcase(s, tc);
    tc = tcase_create("attention");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, packed_attention_equals_reconstruction);
    tcase_add_test(tc, gpu_layout_room_for_decoded_tokens);
    tcase_add_test(tc, pieces_equal_attend);
    tcase_add_test(tc, bytes_read_hand_count);
    tcase_add_test(tc, refine_keeps_best_candidates);
    tcase_add_test(tc, full_keep_equals_exact_attention);
    tcase_add_test(tc, uniform2d_is_fixed_channel_truncation);
    suite_add_tcase(s, tc);
    tc = tcase_create("strategy");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, search_energy_picks_cheapest);
    tcase_add_test(tc, candidates_match_reference);
    tcase_add_test(tc, pick_threshold_rule);
    tcase_add_test(tc, allocate_matches_brute_force);
    tcase_add_test(tc, recorded_loss_is_attention_error);
    tcase_add_test(tc, ratio_rule_hits_target);
    tcase_add_test(tc, bound_follows_recall);
    suite_add_tcase(s, tc);
    tc = tcase_create("method");
    tcase_add_test(tc, bad_parameters_refused);
    tcase_add_test(tc, cdump_round_trip_counts_bytes);
    tcase_add_test(tc, cdump_without_queries);
    tcase_add_test(tc, quantized_round_trip);
    tcase_add_test(tc, load_refuses_corrupt_arrays);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return test_run(mosaic_suite());
}
