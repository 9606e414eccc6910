/* Tests of the baseline methods: Quest, ThinK, KIVI, SnapKV, StreamingLLM,
 * naive 2-D and TurboQuant.
 *
 * Each method runs end to end (compress into a real compressed dump, read it
 * back, attend), and what it stores and returns is checked against
 * references computed here in double precision: this file's own page
 * bounds, token selection, channel ranking, quantizer decoding, SnapKV
 * scoring and softmax attention over the K/V the method should see
 * (float16-rounded, masked, dequantized). Hand-computed cases pin the Quest
 * bound, the KIVI codes and the ThinK byte count.
 *
 * Tolerances: against attention over the very K/V the method should see,
 * relative L2 error <= 1e-5 (only float32 output rounding differs); against
 * exact attention over the float32 cache, the float16 storage of K and V
 * allows a relative L2 error <= 2e-3. */
#include "config.h"

#include <math.h>

#include "core/attn.h"
#include "methods/baseline.h"
#include "io/cdump.h"
#include "io/dump.h"
#include "core/half.h"
#include "methods/method.h"
#include "methods/turboquant_priv.h"
#include "io/synthetic.h"
#include "core/tensor.h"
#include "testutil.h"

extern const mkv_method mkv_method_quest, mkv_method_think, mkv_method_kivi, mkv_method_snapkv,
    mkv_method_streaming, mkv_method_naive2d, mkv_method_turboquant, mkv_method_cam;

#define TOL_SAME 1e-5
#define TOL_F16 2e-3

/* ------------------------------------------------------------ fixtures */

typedef struct {
    int64_t T, W;
    int d, G;
    float *k, *v;     /* [T][d] */
    float *q;         /* [G][W][d] */
    int32_t *qpos;    /* [W] */
} head_data;

static double gauss(uint64_t *s)
{
    double u = test_uniform(s), v = test_uniform(s);
    return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

/* Random keys and values with channel scales that differ, queries at the
 * last W positions. */
static void make_head(head_data *h, int64_t T, int d, int G, int64_t W, uint64_t seed)
{
    h->T = T;
    h->d = d;
    h->G = G;
    h->W = W;
    h->k = malloc(sizeof(float) * (size_t)(T * d));
    h->v = malloc(sizeof(float) * (size_t)(T * d));
    h->q = malloc(sizeof(float) * (size_t)(G * W * d + 1));
    h->qpos = malloc(sizeof(int32_t) * (size_t)(W + 1));
    ck_assert(h->k && h->v && h->q && h->qpos);
    for (int64_t t = 0; t < T; t++)
        for (int j = 0; j < d; j++) {
            h->k[t * d + j] = (float)(gauss(&seed) * (0.5 + (j * 7 % d) / (double)d));
            h->v[t * d + j] = (float)(gauss(&seed) * (0.5 + (j * 5 % d) / (double)d));
        }
    for (int64_t i = 0; i < G * W * d; i++)
        h->q[i] = (float)(gauss(&seed) * 1.5);
    for (int64_t w = 0; w < W; w++)
        h->qpos[w] = (int32_t)(T - W + w);
}

static void free_head(head_data *h)
{
    free(h->k);
    free(h->v);
    free(h->q);
    free(h->qpos);
}

typedef struct {
    const mkv_method *m;
    mkv_params p;
    mkv_cdump *c;
    void *state;
    char path[256];
} compressed;

static void set_params(const mkv_method *m, mkv_params *p, const char *assignments)
{
    mkv_params_init(p, m->params);
    char buf[512];
    snprintf(buf, sizeof buf, "%s", assignments);
    for (char *save = NULL, *tok = strtok_r(buf, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        mkv_error err = {0};
        ck_assert_msg(mkv_params_parse(p, tok, &err) == MKV_OK, "%s: %s", tok, err.msg);
    }
}

static void raw_meta(mkv_dump_meta *m, int64_t T, int d, int G, int64_t W)
{
    mkv_dump_meta_init(m);
    snprintf(m->model, sizeof m->model, "test");
    snprintf(m->source, sizeof m->source, "synthetic");
    m->n_layers = 1;
    m->n_heads = G;
    m->n_kv_heads = 1;
    m->head_dim = d;
    m->n_tokens = T;
    m->n_queries = W;
}

/* Compress h with method m and parameters into a file, read it back, load. */
static void compress_head(const mkv_method *m, const char *assignments, const head_data *h,
                          const char *file, compressed *cp)
{
    mkv_error err = {0};
    cp->m = m;
    set_params(m, &cp->p, assignments);
    mkv_cdump_meta meta;
    memset(&meta, 0, sizeof meta);
    snprintf(meta.method, sizeof meta.method, "%s", m->name);
    mkv_params_format(&cp->p, meta.params, sizeof meta.params);
    snprintf(meta.source, sizeof meta.source, "check_baselines");
    raw_meta(&meta.raw, h->T, h->d, h->G, h->W);
    ck_assert_msg(m->check(&cp->p, &meta.raw, &err) == MKV_OK, "%s check: %s", m->name, err.msg);
    test_path(cp->path, sizeof cp->path, file);
    mkv_cdump_writer *w;
    ck_assert_msg(mkv_cdump_create(cp->path, NULL, &meta, h->qpos, &w, &err) == MKV_OK, "%s", err.msg);
    mkv_head_kv in = {0, 0, h->T, h->d, h->G, h->k, h->v, h->W, h->q, h->qpos, 1};
    int rc = m->compress(&cp->p, &in, w, &err);
    if (rc)
        mkv_cdump_abort(w);
    ck_assert_msg(rc == MKV_OK, "%s compress: %s", m->name, err.msg);
    ck_assert_msg(mkv_cdump_commit(w, &err) == MKV_OK, "%s", err.msg);
    ck_assert_msg(mkv_cdump_open(cp->path, &cp->c, &err) == MKV_OK, "%s", err.msg);
    ck_assert_msg(m->load(&cp->p, cp->c, 0, 0, &cp->state, &err) == MKV_OK, "%s load: %s", m->name, err.msg);
}

static void release(compressed *cp)
{
    cp->m->free_state(cp->state);
    mkv_cdump_close(cp->c);
    unlink(cp->path);
}

/* Run the method for the G queries q [G][d] at pos. */
static void attend(compressed *cp, const head_data *h, const float *q, int64_t pos, float *out,
                   uint8_t *att, uint64_t *bytes)
{
    mkv_attend_query aq = {h->G, h->d, q, pos, 1.0 / sqrt((double)h->d)};
    mkv_attend_result r = {out, att, 0};
    mkv_error err = {0};
    memset(att, 0, (size_t)h->T);
    ck_assert_msg(cp->m->attend(cp->state, &aq, &r, &err) == MKV_OK, "%s attend: %s", cp->m->name, err.msg);
    if (bytes)
        *bytes = r.bytes_read;
}

/* Query vectors [G][d] of query w of h. */
static void query_of(const head_data *h, int64_t w, float *q)
{
    for (int g = 0; g < h->G; g++)
        memcpy(q + g * h->d, h->q + ((size_t)g * (size_t)h->W + (size_t)w) * (size_t)h->d,
               sizeof(float) * (size_t)h->d);
}

static float *read_f(compressed *cp, const char *name, size_t n)
{
    float *x = malloc(sizeof(float) * (n ? n : 1));
    mkv_error err = {0};
    ck_assert(x);
    ck_assert_msg(mkv_cdump_get(cp->c, 0, 0, name, MKV_EL_F16, x, n, &err) == MKV_OK, "%s", err.msg);
    return x;
}

static double f16(float x) { return mkv_f16_to_f32(mkv_f32_to_f16(x)); }

/* ------------------------------------------------------------ references */

/* Softmax attention in double, two passes, over the tokens t <= pos with
 * mask[t] (all when mask is NULL) of K, V [T][d]; out [G][d]. */
static void ref_attend(const float *q, int G, int d, const double *K, const double *V, int64_t pos,
                       const uint8_t *mask, double *out)
{
    double scale = 1.0 / sqrt((double)d);
    double *s = malloc(sizeof(double) * (size_t)(pos + 1));
    ck_assert(s);
    for (int g = 0; g < G; g++) {
        double m = -INFINITY, sum = 0;
        for (int64_t t = 0; t <= pos; t++) {
            s[t] = -INFINITY;
            if (mask && !mask[t])
                continue;
            double dot = 0;
            for (int j = 0; j < d; j++)
                dot += (double)q[g * d + j] * K[t * d + j];
            s[t] = dot * scale;
            m = s[t] > m ? s[t] : m;
        }
        for (int j = 0; j < d; j++)
            out[g * d + j] = 0;
        for (int64_t t = 0; t <= pos; t++)
            if (s[t] > -INFINITY) {
                double e = exp(s[t] - m);
                sum += e;
                for (int j = 0; j < d; j++)
                    out[g * d + j] += e * V[t * d + j];
            }
        for (int j = 0; j < d; j++)
            out[g * d + j] /= sum;
    }
    free(s);
}

static double rel_err(const float *got, const double *want, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += (got[i] - want[i]) * (got[i] - want[i]);
        den += want[i] * want[i];
    }
    return sqrt(num / den);
}

/* x [T][d] as doubles rounded to float16. */
static double *rounded(const float *x, int64_t T, int d)
{
    double *y = malloc(sizeof(double) * (size_t)(T * d));
    ck_assert(y);
    for (int64_t i = 0; i < T * d; i++)
        y[i] = f16(x[i]);
    return y;
}

/* Tokens in the step's budget: a fraction of pos + 1 rounded up (the guard
 * keeps 0.1 x 30 at 3), or a count, within 1..pos+1. */
static int64_t ref_budget(double budget, int64_t pos)
{
    int64_t n = pos + 1;
    int64_t k = budget <= 1 ? (int64_t)ceil(budget * n - 1e-9) : (int64_t)budget;
    return k < 1 ? 1 : k > n ? n : k;
}

/* The common selection rule, written out plainly: sink and recent, then
 * whole pages by aggregated score (ties: lower page). mn, mx [P][n] page
 * bounds, qs [G][n]. */
static void ref_select(const double *mn, const double *mx, int n, const float *qs, int G, int64_t T,
                       int page, int64_t pos, int sink, int recent, double budget, int agg_sum,
                       uint8_t *mask)
{
    memset(mask, 0, (size_t)T);
    int64_t count = 0, want = ref_budget(budget, pos);
    for (int64_t t = 0; t <= pos; t++)
        if (t < sink || t >= T - recent) {
            mask[t] = 1;
            count++;
        }
    int64_t visible = pos / page + 1;
    double *score = malloc(sizeof(double) * (size_t)visible);
    uint8_t *taken = calloc((size_t)visible, 1);
    ck_assert(score && taken);
    for (int64_t pg = 0; pg < visible; pg++) {
        double agg = agg_sum ? 0 : -INFINITY;
        for (int g = 0; g < G; g++) {
            double s = 0;
            for (int i = 0; i < n; i++) {
                double a = qs[g * n + i] * mn[pg * n + i], b = qs[g * n + i] * mx[pg * n + i];
                s += a > b ? a : b;
            }
            agg = agg_sum ? agg + s : (s > agg ? s : agg);
        }
        score[pg] = agg;
    }
    while (count < want) {
        int64_t best = -1;
        for (int64_t pg = 0; pg < visible; pg++)
            if (!taken[pg] && (best < 0 || score[pg] > score[best]))
                best = pg;
        if (best < 0)
            break;
        taken[best] = 1;
        for (int64_t t = best * page; t < (best + 1) * page && t <= pos; t++)
            if (!mask[t]) {
                mask[t] = 1;
                count++;
            }
    }
    free(score);
    free(taken);
}

/* Indices of the k largest of x [n] (ties: lower index), ascending. */
static void ref_top(const double *x, int n, int k, int *idx)
{
    uint8_t *taken = calloc((size_t)n, 1);
    ck_assert(taken);
    for (int i = 0; i < k; i++) {
        int best = -1;
        for (int j = 0; j < n; j++)
            if (!taken[j] && (best < 0 || x[j] > x[best]))
                best = j;
        ck_assert(best >= 0);
        taken[best] = 1;
    }
    for (int j = 0, i = 0; j < n; j++)
        if (taken[j])
            idx[i++] = j;
    free(taken);
}

/* ------------------------------------------------------------ Quest */

START_TEST(quest_page_score_by_hand)
{
    /* max(1*-1, 1*3) + max(-2*-1, -2*1) + max(0.5*2, 0.5*4) = 3 + 2 + 2 */
    const float q[3] = {1, -2, 0.5f}, mn[3] = {-1, -1, 2}, mx[3] = {3, 1, 4};
    ck_assert_double_eq(mkv_bl_page_score(q, mn, mx, 3), 7.0);
}
END_TEST

START_TEST(quest_bound_holds)
{
    head_data h;
    make_head(&h, 203, 16, 2, 3, 11);
    compressed cp;
    compress_head(&mkv_method_quest, "page=16", &h, "quest_bound.h5", &cp);
    int64_t P = (h.T + 15) / 16;
    float *k = read_f(&cp, "k", (size_t)(h.T * h.d));
    float *mn = read_f(&cp, "page_min", (size_t)(P * h.d)), *mx = read_f(&cp, "page_max", (size_t)(P * h.d));
    for (int64_t pg = 0; pg < P; pg++)
        for (int j = 0; j < h.d; j++) {
            double lo = INFINITY, hi = -INFINITY;
            for (int64_t t = pg * 16; t < (pg + 1) * 16 && t < h.T; t++) {
                lo = fmin(lo, k[t * h.d + j]);
                hi = fmax(hi, k[t * h.d + j]);
            }
            ck_assert_double_eq(mn[pg * h.d + j], lo);
            ck_assert_double_eq(mx[pg * h.d + j], hi);
        }
    uint64_t s = 5;
    float q[16];
    for (int trial = 0; trial < 50; trial++) {
        for (int j = 0; j < 16; j++)
            q[j] = (float)gauss(&s);
        for (int64_t pg = 0; pg < P; pg++) {
            double bound = mkv_bl_page_score(q, mn + pg * 16, mx + pg * 16, 16);
            for (int64_t t = pg * 16; t < (pg + 1) * 16 && t < h.T; t++) {
                double dot = 0;
                for (int j = 0; j < 16; j++)
                    dot += (double)q[j] * k[t * 16 + j];
                ck_assert_msg(dot <= bound + 1e-12, "page %lld token %lld: q.k %g > bound %g",
                              (long long)pg, (long long)t, dot, bound);
            }
        }
    }
    /* Quest saves no memory: dense K/V plus two fp16 rows per page */
    const mkv_cdump_meta *m = mkv_cdump_meta_of(cp.c);
    ck_assert_uint_eq(m->physical_bytes, (uint64_t)(2 * h.T * h.d * 2 + 2 * P * h.d * 2));
    ck_assert_uint_eq(m->logical_bytes, (uint64_t)(2 * h.T * h.d * 2));
    free(k);
    free(mn);
    free(mx);
    release(&cp);
    free_head(&h);
}
END_TEST

/* Quest's selection and output against ref_select and ref_attend. */
static void quest_case(const char *params, double budget, int agg_sum)
{
    head_data h;
    make_head(&h, 300, 16, 3, 2, 21);
    compressed cp;
    compress_head(&mkv_method_quest, params, &h, "quest_sel.h5", &cp);
    int64_t P = (h.T + 15) / 16;
    double *K = rounded(h.k, h.T, h.d), *V = rounded(h.v, h.T, h.d);
    double *mn = malloc(sizeof(double) * (size_t)(P * h.d)), *mx = malloc(sizeof(double) * (size_t)(P * h.d));
    for (int64_t pg = 0; pg < P; pg++)
        for (int j = 0; j < h.d; j++) {
            mn[pg * h.d + j] = INFINITY;
            mx[pg * h.d + j] = -INFINITY;
            for (int64_t t = pg * 16; t < (pg + 1) * 16 && t < h.T; t++) {
                mn[pg * h.d + j] = fmin(mn[pg * h.d + j], K[t * h.d + j]);
                mx[pg * h.d + j] = fmax(mx[pg * h.d + j], K[t * h.d + j]);
            }
        }
    const int64_t positions[] = {2, 10, 37, 150, 250, 299};
    float q[3 * 16], out[3 * 16];
    double want[3 * 16];
    uint8_t got[300], mask[300];
    for (size_t i = 0; i < sizeof positions / sizeof *positions; i++) {
        int64_t pos = positions[i];
        query_of(&h, (int64_t)i % h.W, q);
        uint64_t bytes;
        attend(&cp, &h, q, pos, out, got, &bytes);
        ref_select(mn, mx, h.d, q, h.G, h.T, 16, pos, 4, 64, budget, agg_sum, mask);
        int64_t n = 0;
        for (int64_t t = 0; t < h.T; t++) {
            ck_assert_msg(got[t] == mask[t], "%s pos %lld: token %lld attended %d, expected %d", params,
                          (long long)pos, (long long)t, got[t], mask[t]);
            n += mask[t];
        }
        ref_attend(q, h.G, h.d, K, V, pos, mask, want);
        ck_assert_msg(rel_err(out, want, 48) <= TOL_SAME, "%s pos %lld: error %g", params,
                      (long long)pos, rel_err(out, want, 48));
        ck_assert_uint_eq(bytes, (uint64_t)((pos / 16 + 1) + n) * 2 * 16 * 2);
    }
    free(K);
    free(V);
    free(mn);
    free(mx);
    release(&cp);
    free_head(&h);
}

START_TEST(quest_selects_like_reference)
{
    quest_case("budget=0.1", 0.1, 0);
    quest_case("budget=0.3", 0.3, 0);
    quest_case("budget=40 agg=sum", 40, 1);
}
END_TEST

/* ------------------------------------------------------------ all methods at full budget */

START_TEST(full_budget_is_exact)
{
    static const struct {
        const mkv_method *m;
        const char *params;
    } cases[] = {
        {&mkv_method_quest, "budget=1"},
        {&mkv_method_naive2d, "keep=1 budget=1"},
        {&mkv_method_think, "keep=1"},
        {&mkv_method_kivi, "residual=1000"},
        {&mkv_method_snapkv, "keep=1"},
        {&mkv_method_streaming, "keep=1"},
        {&mkv_method_cam, "keep=1"},
    };
    head_data h;
    make_head(&h, 300, 32, 2, 6, 31);
    double *K = rounded(h.k, h.T, h.d), *V = rounded(h.v, h.T, h.d);
    double *K32 = malloc(sizeof(double) * (size_t)(h.T * h.d)), *V32 = malloc(sizeof(double) * (size_t)(h.T * h.d));
    for (int64_t i = 0; i < h.T * h.d; i++) {
        K32[i] = h.k[i];
        V32[i] = h.v[i];
    }
    const int64_t positions[] = {0, 37, 150, 294, 299};
    float q[64], out[64];
    double want[64], exact[64];
    uint8_t att[300];
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        compressed cp;
        compress_head(cases[c].m, cases[c].params, &h, "full_budget.h5", &cp);
        for (size_t i = 0; i < sizeof positions / sizeof *positions; i++) {
            int64_t pos = positions[i];
            query_of(&h, (int64_t)i, q);
            attend(&cp, &h, q, pos, out, att, NULL);
            for (int64_t t = 0; t < h.T; t++)
                ck_assert_msg(att[t] == (t <= pos), "%s pos %lld: token %lld attended %d", cases[c].m->name,
                              (long long)pos, (long long)t, att[t]);
            ref_attend(q, h.G, h.d, K, V, pos, NULL, want);
            ref_attend(q, h.G, h.d, K32, V32, pos, NULL, exact);
            ck_assert_msg(rel_err(out, want, 64) <= TOL_SAME, "%s pos %lld: error %g vs fp16 cache",
                          cases[c].m->name, (long long)pos, rel_err(out, want, 64));
            ck_assert_msg(rel_err(out, exact, 64) <= TOL_F16, "%s pos %lld: error %g vs float32 cache",
                          cases[c].m->name, (long long)pos, rel_err(out, exact, 64));
        }
        release(&cp);
    }
    free(K);
    free(V);
    free(K32);
    free(V32);
    free_head(&h);
}
END_TEST

/* ------------------------------------------------------------ KIVI */

START_TEST(codes_pack_by_hand)
{
    const uint8_t c2[5] = {1, 2, 3, 0, 3}, c4[3] = {0xA, 0x5, 0xF};
    uint8_t out[2];
    ck_assert_uint_eq(mkv_bl_packed_bytes(5, 2), 2);
    mkv_bl_pack(c2, 5, 2, out);
    ck_assert_uint_eq(out[0], 1 | 2 << 2 | 3 << 4 | 0 << 6);
    ck_assert_uint_eq(out[1], 3);
    ck_assert_uint_eq(mkv_bl_packed_bytes(3, 4), 2);
    mkv_bl_pack(c4, 3, 4, out);
    ck_assert_uint_eq(out[0], 0x5A);
    ck_assert_uint_eq(out[1], 0x0F);
    /* 3 bits: codes 5 6 7 are the stream 101 011 111, the second straddling */
    const uint8_t c3[3] = {5, 6, 7};
    ck_assert_uint_eq(mkv_bl_packed_bytes(3, 3), 2);
    mkv_bl_pack(c3, 3, 3, out);
    ck_assert_uint_eq(out[0], 5 | 6 << 3 | (7 & 3) << 6);
    ck_assert_uint_eq(out[1], 7 >> 2);
    const uint8_t c1[9] = {1, 0, 1, 1, 0, 0, 0, 1, 1};
    ck_assert_uint_eq(mkv_bl_packed_bytes(9, 1), 2);
    mkv_bl_pack(c1, 9, 1, out);
    ck_assert_uint_eq(out[0], 0x8D);
    ck_assert_uint_eq(out[1], 1);
    for (int bits = 1; bits <= 8; bits++) {
        uint8_t codes[1001], packed[1001];
        uint64_t s = (uint64_t)bits;
        for (int i = 0; i < 1001; i++)
            codes[i] = (uint8_t)(test_rand64(&s) & ((1u << bits) - 1));
        mkv_bl_pack(codes, 1001, bits, packed);
        for (int i = 0; i < 1001; i++)
            ck_assert_uint_eq(mkv_bl_unpack(packed, (size_t)i, bits), codes[i]);
    }
}
END_TEST

static void read_u8(compressed *cp, const char *name, uint8_t *out, size_t n)
{
    mkv_error err = {0};
    ck_assert_msg(mkv_cdump_get(cp->c, 0, 0, name, MKV_EL_U8, out, n, &err) == MKV_OK, "%s", err.msg);
}

START_TEST(kivi_two_bit_by_hand)
{
    /* group = 4 tokens, residual 0: all four tokens quantized.
     * key channels over the tokens: 0 1 2 3 | 1 1 1 1 | -3 -0.8 3 1.5 | 10 16 12.1 14.2
     * -> zero 0, 1, -3, 10; scale 1, 0, 2, 2; codes 0123, 0000, 0132, 0312.
     * values of token t: t, 3+t, 1+t, 2+t -> zero t, scale 1, codes 0 3 1 2. */
    const float kch[4][4] = {{0, 1, 2, 3}, {1, 1, 1, 1}, {-3, -0.8f, 3, 1.5f}, {10, 16, 12.1f, 14.2f}};
    head_data h;
    make_head(&h, 4, 4, 1, 1, 1);
    for (int t = 0; t < 4; t++)
        for (int j = 0; j < 4; j++) {
            h.k[t * 4 + j] = kch[j][t];
            h.v[t * 4 + j] = (float)(t + (const int[]){0, 3, 1, 2}[j]);
        }
    compressed cp;
    compress_head(&mkv_method_kivi, "bits=2 group=4 residual=0", &h, "kivi_hand.h5", &cp);
    uint8_t kc[4], vc[4];
    read_u8(&cp, "k_codes", kc, 4);
    read_u8(&cp, "v_codes", vc, 4);
    /* byte t holds token t's four codes, channel 0 in the low bits */
    const uint8_t want_k[4] = {0, 1 | 0 << 2 | 1 << 4 | 3 << 6, 2 | 0 << 2 | 3 << 4 | 1 << 6,
                               3 | 0 << 2 | 2 << 4 | 2 << 6};
    for (int i = 0; i < 4; i++) {
        ck_assert_uint_eq(kc[i], want_k[i]);
        ck_assert_uint_eq(vc[i], 0 | 3 << 2 | 1 << 4 | 2 << 6);
    }
    float *ks = read_f(&cp, "k_scale", 4), *kz = read_f(&cp, "k_zero", 4);
    float *vs = read_f(&cp, "v_scale", 4), *vz = read_f(&cp, "v_zero", 4);
    const float want_ks[4] = {1, 0, 2, 2}, want_kz[4] = {0, 1, -3, 10};
    for (int i = 0; i < 4; i++) {
        ck_assert_float_eq(ks[i], want_ks[i]);
        ck_assert_float_eq(kz[i], want_kz[i]);
        ck_assert_float_eq(vs[i], 1);
        ck_assert_float_eq(vz[i], (float)i);
    }
    ck_assert(!mkv_cdump_has(cp.c, 0, 0, "k_residual"));
    /* 2 x 4 code bytes + 2 x 4 key and 2 x 4 value scale/zero halves */
    ck_assert_uint_eq(mkv_cdump_meta_of(cp.c)->physical_bytes, 8 + 16 + 16);
    free(ks);
    free(kz);
    free(vs);
    free(vz);
    release(&cp);
    free_head(&h);
}
END_TEST

/* Code i of a packed stream, read bit by bit: bit k of code i is bit
 * i bits + k of the stream, bit k mod 8 of byte k / 8. */
static unsigned code_at(const uint8_t *packed, size_t i, int bits)
{
    unsigned c = 0;
    for (int k = 0; k < bits; k++) {
        size_t at = i * (size_t)bits + (size_t)k;
        c |= (unsigned)(packed[at / 8] >> (at % 8) & 1) << k;
    }
    return c;
}

/* Decode KIVI's arrays here, check the error bound, the covering range,
 * the byte count and attention over the decoded cache. */
static void kivi_case(int bits, int group, int residual)
{
    head_data h;
    make_head(&h, 300, 16, 2, 2, 41 + (uint64_t)group);
    char params[128];
    snprintf(params, sizeof params, "bits=%d group=%d residual=%d", bits, group, residual);
    compressed cp;
    compress_head(&mkv_method_kivi, params, &h, "kivi.h5", &cp);
    int d = h.d, L = (1 << bits) - 1, gv = (d + group - 1) / group;
    int64_t T = h.T, nq = (T - residual) / group * group, ng = nq / group;
    size_t packed = (size_t)((nq * d * bits + 7) / 8);
    uint8_t *kc = malloc(packed), *vc = malloc(packed);
    read_u8(&cp, "k_codes", kc, packed);
    read_u8(&cp, "v_codes", vc, packed);
    float *ks = read_f(&cp, "k_scale", (size_t)(ng * d)), *kz = read_f(&cp, "k_zero", (size_t)(ng * d));
    float *vs = read_f(&cp, "v_scale", (size_t)(nq * gv)), *vz = read_f(&cp, "v_zero", (size_t)(nq * gv));
    float *kr = NULL, *vr = NULL;
    if (nq < T) {
        kr = read_f(&cp, "k_residual", (size_t)((T - nq) * d));
        vr = read_f(&cp, "v_residual", (size_t)((T - nq) * d));
    } else {
        ck_assert(!mkv_cdump_has(cp.c, 0, 0, "k_residual") && !mkv_cdump_has(cp.c, 0, 0, "v_residual"));
    }
    double *K = malloc(sizeof(double) * (size_t)(T * d)), *V = malloc(sizeof(double) * (size_t)(T * d));
    for (int64_t t = 0; t < nq; t++)
        for (int j = 0; j < d; j++) {
            size_t i = (size_t)(t * d + j), ka = (size_t)(t / group * d + j), va = (size_t)(t * gv + j / group);
            K[i] = code_at(kc, i, bits) * (double)ks[ka] + kz[ka];
            V[i] = code_at(vc, i, bits) * (double)vs[va] + vz[va];
            ck_assert_msg(fabs(K[i] - h.k[i]) <= ks[ka] / 2 * (1 + 1e-6) + 1e-7, "key %lld,%d: %g vs %g, scale %g",
                          (long long)t, j, K[i], h.k[i], ks[ka]);
            ck_assert_msg(fabs(V[i] - h.v[i]) <= vs[va] / 2 * (1 + 1e-6) + 1e-7, "value %lld,%d: %g vs %g, scale %g",
                          (long long)t, j, V[i], h.v[i], vs[va]);
        }
    /* zero <= min, zero + L scale >= max, and the scale is the tight one up
     * to float16 rounding (a huge scale would meet the bound trivially) */
    for (int64_t g = 0; g < ng; g++)
        for (int j = 0; j < d; j++) {
            double lo = INFINITY, hi = -INFINITY;
            for (int64_t t = g * group; t < (g + 1) * group; t++) {
                lo = fmin(lo, h.k[t * d + j]);
                hi = fmax(hi, h.k[t * d + j]);
            }
            double sc = ks[g * d + j], z = kz[g * d + j];
            ck_assert(z <= lo && z + L * sc >= hi);
            ck_assert_msg(sc <= (hi - lo + fabs(lo) * 0x1p-10) / L * (1 + 0x1p-9) + 0x1p-24, "scale %g for range %g",
                          sc, hi - lo);
        }
    for (int64_t i = 0; i < (T - nq) * d; i++) {
        K[nq * d + i] = kr[i];
        V[nq * d + i] = vr[i];
        ck_assert_double_eq(kr[i], f16(h.k[nq * d + i]));
        ck_assert_double_eq(vr[i], f16(h.v[nq * d + i]));
    }
    uint64_t phys = 2 * packed + (uint64_t)(2 * ng * d * 2) + (uint64_t)(2 * nq * gv * 2) + (uint64_t)(2 * (T - nq) * d * 2);
    ck_assert_uint_eq(mkv_cdump_meta_of(cp.c)->physical_bytes, phys);
    float q[32], out[32];
    double want[32];
    uint8_t att[300];
    const int64_t positions[] = {5, 100, 260, 299};
    for (size_t i = 0; i < sizeof positions / sizeof *positions; i++) {
        uint64_t bytes;
        query_of(&h, (int64_t)i % h.W, q);
        attend(&cp, &h, q, positions[i], out, att, &bytes);
        ref_attend(q, h.G, d, K, V, positions[i], NULL, want);
        ck_assert_msg(rel_err(out, want, 32) <= TOL_SAME, "%s pos %lld: error %g", params,
                      (long long)positions[i], rel_err(out, want, 32));
        if (positions[i] == T - 1)
            ck_assert_uint_eq(bytes, phys);
    }
    free(kc);
    free(vc);
    free(ks);
    free(kz);
    free(vs);
    free(vz);
    free(kr);
    free(vr);
    free(K);
    free(V);
    release(&cp);
    free_head(&h);
}

START_TEST(kivi_decodes_within_half_scale)
{
    kivi_case(2, 32, 128);
    kivi_case(4, 32, 40);
    kivi_case(2, 8, 40);
    kivi_case(4, 6, 0);    /* 6 does not divide 16: value groups 6, 6, 4 */
}
END_TEST

/* ------------------------------------------------------------ TurboQuant */

/* Rows of x [n][d] in rotated coordinates y rotated back: rot^T y. */
static void unrotate(const mkv_tq_quantizer *q, const float *y, double *x)
{
    for (int j = 0; j < q->d; j++) {
        x[j] = 0;
        for (int i = 0; i < q->d; i++)
            x[j] += q->rotation[(size_t)i * q->d + j] * y[i];
    }
}

/* A coordinate of a random unit vector in 3 dimensions is uniform on
 * [-1, 1] (Archimedes): its Lloyd-Max quantizer is the uniform one, by
 * hand, with distortion 4^-b of the unit vector's squared norm. In 2
 * dimensions, at 1 bit, the centroids are +-E|cos| = +-2/pi. */
START_TEST(turboquant_codebook_by_hand)
{
    for (int b = 1; b <= 4; b++) {
        mkv_tq_codebook cb;
        mkv_tq_codebook_make(3, b, &cb);
        int L = 1 << b;
        ck_assert_int_eq(cb.levels, L);
        for (int i = 0; i < L; i++)
            ck_assert_msg(fabs(cb.centroid[i] - (2.0 * i + 1 - L) / L) < 1e-12, "b %d centroid %d: %.15g", b, i,
                          cb.centroid[i]);
        for (int i = 0; i + 1 < L; i++)
            ck_assert(fabs(cb.boundary[i] - (2.0 * (i + 1) - L) / L) < 1e-12);
        ck_assert_msg(fabs(cb.distortion - pow(4, -b)) < 1e-12, "b %d: distortion %.15g", b, cb.distortion);
    }
    mkv_tq_codebook cb;
    mkv_tq_codebook_make(2, 1, &cb);
    ck_assert(fabs(cb.centroid[1] - 2 / 3.141592653589793) < 1e-13 && fabs(cb.centroid[0] + cb.centroid[1]) < 1e-15);
    mkv_tq_codebook_make(64, 0, &cb);
    ck_assert(cb.levels == 1 && cb.centroid[0] == 0 && cb.distortion == 1);
    /* the cell rule: boundaries below x, ties to the lower cell */
    mkv_tq_codebook_make(3, 2, &cb);
    ck_assert_uint_eq(mkv_tq_cell(&cb, -0.9), 0);
    ck_assert_uint_eq(mkv_tq_cell(&cb, -0.5), 0);
    ck_assert_uint_eq(mkv_tq_cell(&cb, 0.0), 1);
    ck_assert_uint_eq(mkv_tq_cell(&cb, 0.2), 2);
    ck_assert_uint_eq(mkv_tq_cell(&cb, 0.99), 3);
}
END_TEST

static void random_unit(uint64_t *s, int d, float *x)
{
    double n = 0;
    for (int j = 0; j < d; j++) {
        x[j] = (float)gauss(s);
        n += (double)x[j] * x[j];
    }
    for (int j = 0; j < d; j++)
        x[j] = (float)(x[j] / sqrt(n));
}

/* TurboQuant_mse on random unit vectors at d = 128: the mean squared error
 * per vector against the paper's figures (about 0.36, 0.117, 0.03, 0.009
 * for b = 1..4, printed to one or two digits: within 15%), against Max's
 * (1960) Lloyd-Max errors for the Gaussian, the large-d limit (0.3634,
 * 0.1175, 0.03454, 0.009497: within 3%, the finite-d density being a
 * little narrower), and against the codebook's own expectation (within 2%:
 * 2000 vectors of 128 coordinates leave a sampling error below 0.5%). */
START_TEST(turboquant_mse_distortion_as_published)
{
    static const double paper[4] = {0.36, 0.117, 0.03, 0.009}, max1960[4] = {0.3634, 0.1175, 0.03454, 0.009497};
    enum { D = 128, N = 2000 };
    for (int b = 1; b <= 4; b++) {
        mkv_tq_quantizer q;
        mkv_error err = {0};
        ck_assert_int_eq(mkv_tq_quantizer_init(&q, D, b, 0, 7, 0, 0, 0, &err), MKV_OK);
        uint64_t s = 100 + (uint64_t)b;
        float x[D], y[D], norm;
        uint8_t codes[D];
        double work[2 * D], back[D], sum = 0;
        for (int n = 0; n < N; n++) {
            random_unit(&s, D, x);
            ck_assert_int_eq(mkv_tq_encode(&q, x, &norm, codes, NULL, NULL, work, "x", &err), MKV_OK);
            ck_assert_float_eq(norm, 1.0f);
            mkv_tq_decode(&q, norm, codes, NULL, 0, y);
            unrotate(&q, y, back);
            for (int j = 0; j < D; j++)
                sum += (back[j] - x[j]) * (back[j] - x[j]);
        }
        double mse = sum / N;
        if (getenv("MKV_TEST_VERBOSE"))
            fprintf(stderr, "turboquant_mse b=%d d=%d: mse %.5f, codebook %.5f\n", b, D, mse, q.cb.distortion);
        ck_assert_msg(fabs(mse - paper[b - 1]) <= 0.15 * paper[b - 1], "b %d: mse %.5g, paper %g", b, mse, paper[b - 1]);
        ck_assert_msg(fabs(mse - max1960[b - 1]) <= 0.03 * max1960[b - 1], "b %d: mse %.5g, Gaussian %g", b, mse,
                      max1960[b - 1]);
        ck_assert_msg(fabs(mse - q.cb.distortion) <= 0.02 * q.cb.distortion, "b %d: mse %.5g, codebook %.5g", b, mse,
                      q.cb.distortion);
        mkv_tq_quantizer_free(&q);
    }
}
END_TEST

/* The error of the estimate of q.k over N independent quantizers (the
 * seed's streams differ by layer): its mean and standard error. */
static void inner_product_error(int d, int bits, int sketch, const float *q, const float *k, int N, double *mean,
                                double *se)
{
    double exact = 0, sum = 0, sum2 = 0;
    for (int j = 0; j < d; j++)
        exact += (double)q[j] * k[j];
    float *y = malloc(sizeof(float) * (size_t)d), norm, rnorm;
    uint8_t *codes = malloc((size_t)d), *signs = malloc((size_t)d);
    double *work = malloc(sizeof(double) * 2 * (size_t)d), *back = malloc(sizeof(double) * (size_t)d);
    ck_assert(y && codes && signs && work && back);
    for (int n = 0; n < N; n++) {
        mkv_tq_quantizer qz;
        mkv_error err = {0};
        ck_assert_int_eq(mkv_tq_quantizer_init(&qz, d, bits, sketch, 3, n, 0, 0, &err), MKV_OK);
        ck_assert_int_eq(mkv_tq_encode(&qz, k, &norm, codes, signs, &rnorm, work, "k", &err), MKV_OK);
        mkv_tq_decode(&qz, norm, codes, signs, rnorm, y);
        unrotate(&qz, y, back);
        double est = 0;
        for (int j = 0; j < d; j++)
            est += (double)q[j] * back[j];
        sum += est - exact;
        sum2 += (est - exact) * (est - exact);
        mkv_tq_quantizer_free(&qz);
    }
    *mean = sum / N;
    *se = sqrt((sum2 / N - *mean * *mean) / (N - 1));
    free(y);
    free(codes);
    free(signs);
    free(work);
    free(back);
}

/* TurboQuant_prod's estimate of q.k is unbiased: over 2000 quantizers
 * (rotation and sketch drawn anew) the mean error for one pair, q close to
 * k, is within 4 standard errors of 0 and below 1% of |q| |k| at 1, 2 and 3
 * bits. TurboQuant_mse at the same bits is biased (it shrinks q.k by about
 * its distortion): the same test fails for it, by more than 8 standard
 * errors. */
START_TEST(turboquant_prod_unbiased)
{
    enum { D = 32, N = 2000 };
    float k[D], q[D];
    uint64_t s = 5;
    random_unit(&s, D, k);
    double qn = 0;
    for (int j = 0; j < D; j++) {
        k[j] *= 3;
        q[j] = (float)(0.4 * k[j] + 0.3 * gauss(&s));
        qn += (double)q[j] * q[j];
    }
    qn = sqrt(qn);
    for (int b = 1; b <= 3; b++) {
        double mean, se;
        inner_product_error(D, b - 1, 1, q, k, N, &mean, &se);
        if (getenv("MKV_TEST_VERBOSE"))
            fprintf(stderr, "turboquant_prod b=%d: mean error %.4g, se %.3g\n", b, mean, se);
        ck_assert_msg(fabs(mean) <= 4 * se && fabs(mean) <= 0.01 * qn * 3, "prod at %d bits: mean error %.4g, se %.3g",
                      b, mean, se);
        inner_product_error(D, b, 0, q, k, N, &mean, &se);
        if (getenv("MKV_TEST_VERBOSE"))
            fprintf(stderr, "turboquant_mse b=%d: mean error %.4g, se %.3g\n", b, mean, se);
        ck_assert_msg(fabs(mean) > 8 * se, "mse at %d bits: mean error %.4g, se %.3g", b, mean, se);
    }
}
END_TEST

/* Bytes counted by hand, codes read back against an encoder run here, and
 * attention over the reconstruction decoded from the stored arrays. */
static void turboquant_case(int key_bits, int value_bits, int prod)
{
    head_data h;
    make_head(&h, 37, 16, 2, 2, 61 + (uint64_t)key_bits);
    char params[128];
    snprintf(params, sizeof params, "key_bits=%d value_bits=%d prod=%s seed=9", key_bits, value_bits,
             prod ? "on" : "off");
    compressed cp;
    compress_head(&mkv_method_turboquant, params, &h, "turboquant.h5", &cp);
    int d = h.d, bk = key_bits - prod;
    int64_t T = h.T;
    size_t nd = (size_t)(T * d), kbytes = (nd * (size_t)bk + 7) / 8, vbytes = (nd * (size_t)value_bits + 7) / 8;
    /* codes, norms, and for prod signs (one bit a coordinate) and residual norms */
    uint64_t phys = kbytes + vbytes + 2 * (uint64_t)T * 2 + (prod ? (nd + 7) / 8 + (uint64_t)T * 2 : 0);
    ck_assert_uint_eq(mkv_cdump_meta_of(cp.c)->physical_bytes, phys);
    ck_assert_int_eq(mkv_cdump_has(cp.c, 0, 0, "k_codes"), bk > 0);
    ck_assert_int_eq(mkv_cdump_has(cp.c, 0, 0, "k_signs"), prod);
    ck_assert_int_eq(mkv_cdump_has(cp.c, 0, 0, "k_rnorm"), prod);
    mkv_tq_quantizer kq, vq;
    mkv_error err = {0};
    ck_assert_int_eq(mkv_tq_quantizer_init(&kq, d, bk, prod, 9, 0, 0, 0, &err), MKV_OK);
    ck_assert_int_eq(mkv_tq_quantizer_init(&vq, d, value_bits, 0, 9, 0, 0, 1, &err), MKV_OK);
    uint8_t *kc = malloc(kbytes + 1), *vc = malloc(vbytes), *ks = malloc(nd / 8 + 1);
    ck_assert(kc && vc && ks);
    if (bk)
        read_u8(&cp, "k_codes", kc, kbytes);
    read_u8(&cp, "v_codes", vc, vbytes);
    if (prod)
        read_u8(&cp, "k_signs", ks, (nd + 7) / 8);
    float *kn = read_f(&cp, "k_norm", (size_t)T), *vn = read_f(&cp, "v_norm", (size_t)T);
    float *kr = prod ? read_f(&cp, "k_rnorm", (size_t)T) : NULL;
    double *K = malloc(sizeof(double) * nd), *V = malloc(sizeof(double) * nd);
    ck_assert(K && V);
    for (int64_t t = 0; t < T; t++) {
        float y[16], norm, rnorm;
        uint8_t codes[16], signs[16], got[16], got_signs[16];
        double work[32];
        size_t at = (size_t)t * (size_t)d;
        ck_assert_int_eq(mkv_tq_encode(&kq, h.k + at, &norm, codes, signs, &rnorm, work, "k", &err), MKV_OK);
        ck_assert_float_eq(kn[t], norm);
        ck_assert(fabs(kn[t] - sqrt(mkv_bl_dot(h.k + at, h.k + at, d))) <= 0x1p-11 * kn[t]);
        for (int j = 0; j < d; j++) {
            got[j] = (uint8_t)code_at(kc, at + (size_t)j, bk);
            ck_assert_uint_eq(got[j], codes[j]);
            got_signs[j] = prod ? (uint8_t)code_at(ks, at + (size_t)j, 1) : 0;
            ck_assert_uint_eq(got_signs[j], prod ? signs[j] : 0);
        }
        if (prod)
            ck_assert_float_eq(kr[t], rnorm);
        mkv_tq_decode(&kq, kn[t], got, got_signs, prod ? kr[t] : 0, y);
        unrotate(&kq, y, K + at);
        ck_assert_int_eq(mkv_tq_encode(&vq, h.v + at, &norm, codes, NULL, NULL, work, "v", &err), MKV_OK);
        ck_assert_float_eq(vn[t], norm);
        for (int j = 0; j < d; j++)
            ck_assert_uint_eq(code_at(vc, at + (size_t)j, value_bits), codes[j]);
        mkv_tq_decode(&vq, vn[t], codes, NULL, 0, y);
        unrotate(&vq, y, V + at);
    }
    float q[32], out[32];
    double want[32];
    uint8_t att[64];
    const int64_t positions[] = {0, 5, 20, 36};
    for (size_t i = 0; i < sizeof positions / sizeof *positions; i++) {
        uint64_t bytes;
        int64_t n = positions[i] + 1;
        query_of(&h, (int64_t)i % h.W, q);
        attend(&cp, &h, q, positions[i], out, att, &bytes);
        for (int64_t t = 0; t < T; t++)
            ck_assert_int_eq(att[t], t <= positions[i]);
        ref_attend(q, h.G, d, K, V, positions[i], NULL, want);
        ck_assert_msg(rel_err(out, want, 32) <= TOL_SAME, "%s pos %lld: error %g", params, (long long)positions[i],
                      rel_err(out, want, 32));
        size_t m = (size_t)(n * d);
        ck_assert_uint_eq(bytes, (m * (size_t)bk + 7) / 8 + (m * (size_t)value_bits + 7) / 8 + 4 * (uint64_t)n +
                                     (prod ? (m + 7) / 8 + 2 * (uint64_t)n : 0));
    }
    mkv_tq_quantizer_free(&kq);
    mkv_tq_quantizer_free(&vq);
    free(kc);
    free(vc);
    free(ks);
    free(kn);
    free(vn);
    free(kr);
    free(K);
    free(V);
    release(&cp);
    free_head(&h);
}

START_TEST(turboquant_stores_and_attends)
{
    turboquant_case(3, 2, 0);
    turboquant_case(4, 1, 0);
    turboquant_case(3, 3, 1);
    turboquant_case(1, 4, 1);   /* no codebook bits for keys: the sketch alone */
}
END_TEST

/* A norm beyond float16 and a head_dim outside 2..1024 are refused in one
 * line. */
START_TEST(turboquant_refuses_what_it_cannot_store)
{
    head_data h;
    make_head(&h, 8, 4, 1, 1, 3);
    for (int j = 0; j < 4; j++)
        h.k[5 * 4 + j] = 40000;
    mkv_params p;
    set_params(&mkv_method_turboquant, &p, "");
    mkv_head_kv in = {1, 0, h.T, h.d, h.G, h.k, h.v, h.W, h.q, h.qpos, 1};
    mkv_error err = {0};
    ck_assert_int_eq(mkv_method_turboquant.compress(&p, &in, NULL, &err), MKV_EFORMAT);
    ck_assert_str_eq(err.msg, "layer 1, head 0, token 5: the key has norm 80000, which does not fit float16 (<= 65504)");
    mkv_dump_meta m;
    raw_meta(&m, 8, 1, 1, 1);
    ck_assert_int_eq(mkv_method_turboquant.check(&p, &m, &err), MKV_EUSAGE);
    ck_assert_str_eq(err.msg, "turboquant takes head_dim 2..1024 (the dump has 1)");
    raw_meta(&m, 8, 1025, 1, 1);
    ck_assert_int_eq(mkv_method_turboquant.check(&p, &m, &err), MKV_EUSAGE);
    ck_assert_str_eq(err.msg, "turboquant takes head_dim 2..1024 (the dump has 1025)");
    free_head(&h);
}
END_TEST

/* ------------------------------------------------------------ ThinK */

START_TEST(think_keeps_top_channels)
{
    /* Channel 0 has by far the largest keys but no observation query uses
     * it; channel 1 is huge in query 0, which is outside the window of 3. */
    head_data h;
    make_head(&h, 100, 8, 2, 4, 51);
    uint64_t s = 7;
    for (int64_t t = 0; t < h.T; t++)
        for (int j = 0; j < 8; j++)
            h.k[t * 8 + j] = (float)(gauss(&s) * (j == 0 ? 50 : j));
    for (int g = 0; g < 2; g++)
        for (int w = 0; w < 4; w++)
            for (int j = 0; j < 8; j++)
                h.q[(g * 4 + w) * 8 + j] = (float)(j == 0 ? 0 : w == 0 && j == 1 ? 1000 : gauss(&s));
    compressed cp;
    compress_head(&mkv_method_think, "keep=0.5 recent=10 window=3", &h, "think.h5", &cp);

    double score[8];
    for (int j = 0; j < 8; j++) {
        double qn = 0, kn = 0;
        for (int g = 0; g < 2; g++)
            for (int w = 1; w < 4; w++)
                qn += pow(h.q[(g * 4 + w) * 8 + j], 2);
        for (int64_t t = 0; t < h.T; t++)
            kn += pow(h.k[t * 8 + j], 2);
        score[j] = sqrt(qn) * sqrt(kn);
    }
    int want[4];
    ref_top(score, 8, 4, want);
    int16_t ch[4];
    mkv_error err = {0};
    ck_assert_msg(mkv_cdump_get(cp.c, 0, 0, "k_channels", MKV_EL_I16, ch, 4, &err) == MKV_OK, "%s", err.msg);
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(ch[i], want[i]);
        ck_assert(ch[i] != 0 && ch[i] != 1);
    }
    float *kept = read_f(&cp, "k_kept", 90 * 4), *rec = read_f(&cp, "k_recent", 10 * 8);
    for (int64_t t = 0; t < 90; t++)
        for (int i = 0; i < 4; i++)
            ck_assert_double_eq(kept[t * 4 + i], f16(h.k[t * 8 + want[i]]));
    for (int i = 0; i < 80; i++)
        ck_assert_double_eq(rec[i], f16(h.k[90 * 8 + i]));
    /* by hand: k_kept 90x4x2 + k_channels 4x2 + k_recent 10x8x2 + v 100x8x2 */
    ck_assert_uint_eq(mkv_cdump_meta_of(cp.c)->physical_bytes, 720 + 8 + 160 + 1600);
    ck_assert_uint_eq(mkv_cdump_meta_of(cp.c)->logical_bytes, 3200);

    /* attention: pruned keys lose the other channels, recent keys do not */
    double *K = rounded(h.k, h.T, 8), *V = rounded(h.v, h.T, 8);
    for (int64_t t = 0; t < 90; t++)
        for (int j = 0; j < 8; j++)
            if (j != want[0] && j != want[1] && j != want[2] && j != want[3])
                K[t * 8 + j] = 0;
    float q[16], out[16];
    double ref[16];
    uint8_t att[100];
    uint64_t bytes;
    query_of(&h, 3, q);
    attend(&cp, &h, q, 99, out, att, &bytes);
    ref_attend(q, 2, 8, K, V, 99, NULL, ref);
    ck_assert_msg(rel_err(out, ref, 16) <= TOL_SAME, "error %g", rel_err(out, ref, 16));
    ck_assert_uint_eq(bytes, 8 + 720 + 160 + 1600);
    attend(&cp, &h, q, 50, out, att, &bytes);
    ref_attend(q, 2, 8, K, V, 50, NULL, ref);
    ck_assert_msg(rel_err(out, ref, 16) <= TOL_SAME, "error %g", rel_err(out, ref, 16));
    ck_assert_uint_eq(bytes, 8 + 51 * 4 * 2 + 51 * 8 * 2);
    free(kept);
    free(rec);
    free(K);
    free(V);
    release(&cp);
    free_head(&h);
}
END_TEST

/* ------------------------------------------------------------ SnapKV */

START_TEST(snapkv_selects_like_reference)
{
    /* prefix = 116 tokens; observation queries 2..4 (window 3 of W = 5);
     * keep 30 = sink 2 + window 3 + 25 pooled picks from tokens 2..115 */
    head_data h;
    make_head(&h, 119, 8, 2, 5, 61);
    compressed cp;
    compress_head(&mkv_method_snapkv, "keep=30 window=3 kernel=5 sink=2", &h, "snapkv.h5", &cp);
    const int64_t T = h.T, prefix = T - 3;
    double score[116] = {0}, pooled[114];
    for (int g = 0; g < 2; g++)
        for (int w = 2; w < 5; w++) {
            const float *q = h.q + (g * 5 + w) * 8;
            int64_t pos = h.qpos[w];
            double s[119], m = -INFINITY, sum = 0;
            for (int64_t t = 0; t <= pos; t++) {
                s[t] = 0;
                for (int j = 0; j < 8; j++)
                    s[t] += (double)q[j] * h.k[t * 8 + j];
                s[t] /= sqrt(8.0);
                m = fmax(m, s[t]);
            }
            for (int64_t t = 0; t <= pos; t++)
                sum += exp(s[t] - m);
            for (int64_t t = 0; t < prefix && t <= pos; t++)
                score[t] += exp(s[t] - m) / sum;
        }
    for (int64_t t = 2; t < prefix; t++) {
        pooled[t - 2] = -INFINITY;
        for (int64_t u = t - 2; u <= t + 2; u++)
            if (u >= 0 && u < prefix)
                pooled[t - 2] = fmax(pooled[t - 2], score[u]);
    }
    int top[25];
    ref_top(pooled, 114, 25, top);
    int32_t want[30], got[30];
    int n = 0;
    want[n++] = 0;
    want[n++] = 1;
    for (int i = 0; i < 25; i++)
        want[n++] = top[i] + 2;
    for (int64_t t = prefix; t < T; t++)
        want[n++] = (int32_t)t;
    mkv_error err = {0};
    int64_t dims[3];
    ck_assert_int_eq(mkv_cdump_shape(cp.c, 0, 0, "index", dims), 1);
    ck_assert_int_eq(dims[0], 30);
    ck_assert_msg(mkv_cdump_get(cp.c, 0, 0, "index", MKV_EL_I32, got, 30, &err) == MKV_OK, "%s", err.msg);
    for (int i = 0; i < 30; i++)
        ck_assert_int_eq(got[i], want[i]);
    float *k = read_f(&cp, "k", 30 * 8);
    for (int i = 0; i < 30; i++)
        for (int j = 0; j < 8; j++)
            ck_assert_double_eq(k[i * 8 + j], f16(h.k[want[i] * 8 + j]));
    ck_assert_uint_eq(mkv_cdump_meta_of(cp.c)->physical_bytes, 30 * 8 * 2 * 2 + 30 * 4);

    /* attention over the kept tokens <= pos */
    double *K = rounded(h.k, T, 8), *V = rounded(h.v, T, 8), ref[16];
    uint8_t mask[119], att[119];
    float q[16], out[16];
    for (int64_t pos = 40; pos < T; pos += 39) {
        memset(mask, 0, sizeof mask);
        int64_t nk = 0;
        for (int i = 0; i < 30; i++)
            if (want[i] <= pos) {
                mask[want[i]] = 1;
                nk++;
            }
        uint64_t bytes;
        query_of(&h, 0, q);
        attend(&cp, &h, q, pos, out, att, &bytes);
        ck_assert(memcmp(att, mask, sizeof mask) == 0);
        ref_attend(q, 2, 8, K, V, pos, mask, ref);
        ck_assert_msg(rel_err(out, ref, 16) <= TOL_SAME, "pos %lld: error %g", (long long)pos, rel_err(out, ref, 16));
        ck_assert_uint_eq(bytes, (uint64_t)nk * 2 * 8 * 2);
    }
    free(k);
    free(K);
    free(V);
    release(&cp);
    free_head(&h);
}
END_TEST

START_TEST(snapkv_keeps_planted_targets)
{
    /* The synthetic queries attend planted targets, unevenly: a target is a
     * heavy hitter when its query gives it >= 10% of the softmax (computed
     * here). SnapKV keeping 30% must keep every one of them. */
    mkv_synthetic_params sp;
    mkv_synthetic_params_init(&sp);
    sp.n_layers = 1;
    sp.n_tokens = 1024;
    sp.n_queries = 8;
    char path[256];
    test_path(path, sizeof path, "planted.h5");
    mkv_error err = {0};
    ck_assert_msg(mkv_synthetic_write(&sp, path, NULL, &err) == MKV_OK, "%s", err.msg);
    mkv_dump *dump;
    ck_assert_msg(mkv_dump_open(path, &dump, &err) == MKV_OK, "%s", err.msg);
    int G = sp.n_heads / sp.n_kv_heads, d = sp.head_dim, heavy = 0;
    double *prob = malloc(sizeof(double) * 1024);
    ck_assert(prob);
    for (int kvh = 0; kvh < sp.n_kv_heads; kvh++) {
        head_data h;
        make_head(&h, sp.n_tokens, d, G, sp.n_queries, 1);
        ck_assert(mkv_dump_read(dump, 0, 'k', kvh, 1, 0, h.T, h.k, &err) == MKV_OK);
        ck_assert(mkv_dump_read(dump, 0, 'v', kvh, 1, 0, h.T, h.v, &err) == MKV_OK);
        ck_assert(mkv_dump_read(dump, 0, 'q', kvh * G, G, 0, h.W, h.q, &err) == MKV_OK);
        ck_assert(mkv_dump_read_query_pos(dump, h.qpos, &err) == MKV_OK);
        compressed cp;
        compress_head(&mkv_method_snapkv, "keep=0.3", &h, "planted_c.h5", &cp);
        int32_t index[1024];
        int64_t dims[3];
        ck_assert_int_eq(mkv_cdump_shape(cp.c, 0, 0, "index", dims), 1);
        ck_assert_int_eq(dims[0], 308);   /* ceil(0.3 x 1024) */
        ck_assert(mkv_cdump_get(cp.c, 0, 0, "index", MKV_EL_I32, index, 308, &err) == MKV_OK);
        uint8_t kept[1024] = {0};
        for (int i = 0; i < 308; i++)
            kept[index[i]] = 1;
        int64_t targets[16];
        for (int g = 0; g < G; g++)
            for (int64_t w = 0; w < h.W; w++) {
                const float *q = h.q + (g * h.W + w) * d;
                int64_t pos = h.qpos[w];
                double m = -INFINITY, sum = 0;
                for (int64_t t = 0; t <= pos; t++) {
                    prob[t] = 0;
                    for (int j = 0; j < d; j++)
                        prob[t] += (double)q[j] * h.k[t * d + j];
                    prob[t] /= sqrt((double)d);
                    m = fmax(m, prob[t]);
                }
                for (int64_t t = 0; t <= pos; t++)
                    sum += (prob[t] = exp(prob[t] - m));
                int n = mkv_synthetic_targets(&sp, 0, kvh * G + g, w, targets);
                for (int i = 0; i < n; i++) {
                    if (prob[targets[i]] / sum < 0.1)
                        continue;
                    heavy++;
                    ck_assert_msg(kept[targets[i]], "KV head %d: target %lld of head %d query %lld (%.0f%%) evicted",
                                  kvh, (long long)targets[i], kvh * G + g, (long long)w,
                                  100 * prob[targets[i]] / sum);
                }
            }
        release(&cp);
        free_head(&h);
    }
    ck_assert_int_ge(heavy, 40);
    free(prob);
    mkv_dump_close(dump);
    unlink(path);
}
END_TEST

/* ------------------------------------------------------------ StreamingLLM */

START_TEST(streaming_attends_sink_and_recent)
{
    head_data h;
    make_head(&h, 200, 8, 2, 1, 71);
    double *K = rounded(h.k, h.T, 8), *V = rounded(h.v, h.T, 8), ref[16];
    static const struct {
        const char *params;
        int sink, recent;
    } cases[] = {{"keep=0.25", 4, 46}, {"keep=3 sink=4", 3, 0}, {"keep=20 sink=0", 0, 20}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        compressed cp;
        compress_head(&mkv_method_streaming, cases[c].params, &h, "streaming.h5", &cp);
        int n = cases[c].sink + cases[c].recent;
        ck_assert_uint_eq(mkv_cdump_meta_of(cp.c)->physical_bytes, (uint64_t)n * 8 * 2 * 2);
        float *k = read_f(&cp, "k", (size_t)n * 8);
        for (int i = 0; i < n; i++) {
            int64_t t = i < cases[c].sink ? i : h.T - n + i;
            for (int j = 0; j < 8; j++)
                ck_assert_double_eq(k[i * 8 + j], f16(h.k[t * 8 + j]));
        }
        free(k);
        const int64_t positions[] = {2, 100, 170, 199};
        uint8_t mask[200], att[200];
        float q[16], out[16];
        for (size_t i = 0; i < 4; i++) {
            int64_t pos = positions[i], nk = 0;
            for (int64_t t = 0; t < h.T; t++) {
                mask[t] = t <= pos && (t < cases[c].sink || t >= h.T - cases[c].recent);
                nk += mask[t];
            }
            uint64_t bytes;
            query_of(&h, 0, q);
            attend(&cp, &h, q, pos, out, att, &bytes);
            for (int64_t t = 0; t < h.T; t++)
                ck_assert_msg(att[t] == mask[t], "%s pos %lld token %lld", cases[c].params, (long long)pos,
                              (long long)t);
            ck_assert_uint_eq(bytes, (uint64_t)nk * 2 * 8 * 2);
            if (nk) {
                ref_attend(q, 2, 8, K, V, pos, mask, ref);
                ck_assert_msg(rel_err(out, ref, 16) <= TOL_SAME, "error %g", rel_err(out, ref, 16));
            }
        }
        release(&cp);
    }
    free(K);
    free(V);
    free_head(&h);
}
END_TEST

/* ------------------------------------------------------------ CaM */

/* Five tokens of d = 2, one observation query at position 4, keep=3
 * start=0: the window is tokens 2..4, tokens 0 and 1 leave it in turn.
 * The query (10 sqrt 2, 0) gives logit 10 k_x; the rule worked by hand:
 *   a. k_x = 1, -10, 1, 1, 1: scores 1/4, ~e^-110, 1/4, 1/4, 1/4.
 *      Token 0 leaves, receivers 1..3, mean 1/6, p = 1.5 -> 1: v1..v3 +=
 *      v0 / 3.  Token 1 leaves, receivers 2..4, p ~ 1e-48: no merge (a
 *      draw is below it only if it is 0).  Kept values: v2 + v0/3,
 *      v3 + v0/3, v4 = (2, -0.5), (1, 1.5), (5, 5).
 *   b. every key alike: scores 1/5, p = 1 for both.  Token 0 merges into
 *      1..3, then token 1, carrying v0/3, into 2..4: v2 + v0/3 + (v1 +
 *      v0/3)/3 and so on = (2, 3), (3, 4), (0, 1).
 *   c. as b with merge=2: token 0 into 1, 2, token 1 into 2, 3 (halves):
 *      (2, 3), (2, 2), (-1, 0).
 * Keys stay the tokens' own; the query at position 4 then sees three
 * equal logits (a: all three keys are (1, 0)) and answers the mean of the
 * kept values.  Bytes: 3 rows of float16 K and V and 3 float32 scores. */
START_TEST(cam_merges_by_hand)
{
    static const struct {
        const char *params;
        float kx[5], v[5][2], want[3][2];
        double score;   /* of each kept token */
    } cases[] = {
        {"keep=3 start=0", {1, -10, 1, 1, 1}, {{3, -1.5f}, {100, 100}, {1, 0}, {0, 2}, {5, 5}},
         {{2, -0.5f}, {1, 1.5f}, {5, 5}}, 0.25},
        {"keep=3 start=0", {1, 1, 1, 1, 1}, {{3, 6}, {2, 1}, {0, 0}, {1, 1}, {-1, 0}},
         {{2, 3}, {3, 4}, {0, 1}}, 0.2},
        {"keep=3 start=0 merge=2", {1, 1, 1, 1, 1}, {{2, 4}, {1, 0}, {0, 0}, {1, 1}, {-1, 0}},
         {{2, 3}, {2, 2}, {-1, 0}}, 0.2},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        float k[10], v[10], q[2] = {(float)(10 * sqrt(2.0)), 0};
        int32_t qpos[1] = {4};
        for (int t = 0; t < 5; t++) {
            k[2 * t] = cases[c].kx[t];
            k[2 * t + 1] = 0;
            v[2 * t] = cases[c].v[t][0];
            v[2 * t + 1] = cases[c].v[t][1];
        }
        head_data h = {5, 1, 2, 1, k, v, q, qpos};
        compressed cp;
        compress_head(&mkv_method_cam, cases[c].params, &h, "cam_hand.h5", &cp);
        ck_assert_uint_eq(mkv_cdump_meta_of(cp.c)->physical_bytes, 3 * 2 * 2 * 2 + 3 * 4);
        float *kept_v = read_f(&cp, "v", 6), *kept_k = read_f(&cp, "k", 6), score[3];
        mkv_error err = {0};
        ck_assert_msg(mkv_cdump_get(cp.c, 0, 0, "score", MKV_EL_F32, score, 3, &err) == MKV_OK, "%s", err.msg);
        for (int i = 0; i < 3; i++) {
            ck_assert_msg(kept_v[2 * i] == cases[c].want[i][0] && kept_v[2 * i + 1] == cases[c].want[i][1],
                          "%s: kept value %d is (%g, %g), by hand (%g, %g)", cases[c].params, i, kept_v[2 * i],
                          kept_v[2 * i + 1], cases[c].want[i][0], cases[c].want[i][1]);
            ck_assert(kept_k[2 * i] == cases[c].kx[2 + i] && kept_k[2 * i + 1] == 0);
            ck_assert_msg(fabs(score[i] - cases[c].score) <= 1e-7, "%s: score %d is %g", cases[c].params, i,
                          score[i]);
        }
        float out[2];
        uint8_t att[5];
        uint64_t bytes;
        attend(&cp, &h, q, 4, out, att, &bytes);
        ck_assert(!att[0] && !att[1] && att[2] && att[3] && att[4]);
        ck_assert_uint_eq(bytes, 3 * 2 * 2 * 2 + 3 * 4);
        for (int j = 0; j < 2; j++) {
            double mean = (cases[c].want[0][j] + cases[c].want[1][j] + cases[c].want[2][j]) / 3;
            ck_assert_msg(fabs(out[j] - mean) <= 1e-6, "%s: output %d is %g, by hand %g", cases[c].params, j,
                          out[j], mean);
        }
        attend(&cp, &h, q, 3, out, att, &bytes);
        ck_assert_uint_eq(bytes, 2 * 2 * 2 * 2 + 2 * 4);
        free(kept_v);
        free(kept_k);
        release(&cp);
    }
}
END_TEST

/* ------------------------------------------------------------ naive 2-D */

static void naive2d_case(const char *params, double keep, double budget, int agg_sum)
{
    head_data h;
    make_head(&h, 300, 16, 3, 2, 81);
    compressed cp;
    compress_head(&mkv_method_naive2d, params, &h, "naive2d.h5", &cp);
    int d = h.d, kk = (int)ceil(keep * d - 1e-9);
    int64_t T = h.T, P = (T + 15) / 16;
    /* channels by energy, computed here */
    double ek[16] = {0}, ev[16] = {0};
    for (int64_t t = 0; t < T; t++)
        for (int j = 0; j < d; j++) {
            ek[j] += (double)h.k[t * d + j] * h.k[t * d + j];
            ev[j] += (double)h.v[t * d + j] * h.v[t * d + j];
        }
    int kch[16], vch[16];
    ref_top(ek, d, kk, kch);
    ref_top(ev, d, kk, vch);
    int16_t got_k[16], got_v[16];
    mkv_error err = {0};
    ck_assert(mkv_cdump_get(cp.c, 0, 0, "k_channels", MKV_EL_I16, got_k, (size_t)kk, &err) == MKV_OK);
    ck_assert(mkv_cdump_get(cp.c, 0, 0, "v_channels", MKV_EL_I16, got_v, (size_t)kk, &err) == MKV_OK);
    for (int i = 0; i < kk; i++) {
        ck_assert_int_eq(got_k[i], kch[i]);
        ck_assert_int_eq(got_v[i], vch[i]);
    }
    /* masked fp16 K/V (zeros on dropped channels) and page bounds on the kept key channels */
    double *K = calloc((size_t)(T * d), sizeof(double)), *V = calloc((size_t)(T * d), sizeof(double));
    double *mn = malloc(sizeof(double) * (size_t)(P * kk)), *mx = malloc(sizeof(double) * (size_t)(P * kk));
    for (int64_t t = 0; t < T; t++)
        for (int i = 0; i < kk; i++) {
            K[t * d + kch[i]] = f16(h.k[t * d + kch[i]]);
            V[t * d + vch[i]] = f16(h.v[t * d + vch[i]]);
        }
    for (int64_t pg = 0; pg < P; pg++)
        for (int i = 0; i < kk; i++) {
            mn[pg * kk + i] = INFINITY;
            mx[pg * kk + i] = -INFINITY;
            for (int64_t t = pg * 16; t < (pg + 1) * 16 && t < T; t++) {
                mn[pg * kk + i] = fmin(mn[pg * kk + i], K[t * d + kch[i]]);
                mx[pg * kk + i] = fmax(mx[pg * kk + i], K[t * d + kch[i]]);
            }
        }
    uint64_t phys = (uint64_t)(2 * T * kk * 2 + 2 * kk * 2 + 2 * P * kk * 2);
    ck_assert_uint_eq(mkv_cdump_meta_of(cp.c)->physical_bytes, phys);
    const int64_t positions[] = {3, 40, 150, 260, 299};
    float q[48], qs[48], out[48];
    double want[48];
    uint8_t mask[300], got[300];
    for (size_t i = 0; i < sizeof positions / sizeof *positions; i++) {
        int64_t pos = positions[i], n = 0;
        query_of(&h, (int64_t)i % h.W, q);
        for (int g = 0; g < h.G; g++)
            for (int j = 0; j < kk; j++)
                qs[g * kk + j] = q[g * d + kch[j]];
        ref_select(mn, mx, kk, qs, h.G, T, 16, pos, 4, 64, budget, agg_sum, mask);
        uint64_t bytes;
        attend(&cp, &h, q, pos, out, got, &bytes);
        for (int64_t t = 0; t < T; t++) {
            ck_assert_msg(got[t] == mask[t], "%s pos %lld token %lld", params, (long long)pos, (long long)t);
            n += mask[t];
        }
        ref_attend(q, h.G, d, K, V, pos, mask, want);
        ck_assert_msg(rel_err(out, want, 48) <= TOL_SAME, "%s pos %lld: error %g", params, (long long)pos,
                      rel_err(out, want, 48));
        ck_assert_uint_eq(bytes, (uint64_t)(2 * kk * 2 + (pos / 16 + 1) * 2 * kk * 2 + n * 2 * kk * 2));
    }
    free(K);
    free(V);
    free(mn);
    free(mx);
    release(&cp);
    free_head(&h);
}

START_TEST(naive2d_matches_masked_reference)
{
    naive2d_case("keep=0.5", 0.5, 0.1, 0);
    naive2d_case("keep=0.25 budget=0.3 agg=sum", 0.25, 0.3, 1);
    naive2d_case("keep=0.75 budget=50", 0.75, 50, 0);
}
END_TEST

/* ------------------------------------------------------------ parameters */

/* Write key=value straight into the parameters (bypassing mkv_params_set,
 * so that check itself is what refuses) and expect check to fail. */
static void expect_refused(const mkv_method *m, const char *key, const char *value, int64_t W, int code,
                           const char *needle)
{
    mkv_params p;
    mkv_params_init(&p, m->params);
    int i = 0;
    while (i < p.n && strcmp(p.spec[i]->name, key))
        i++;
    ck_assert_msg(i < p.n, "%s has no parameter %s", m->name, key);
    snprintf(p.value[i], sizeof p.value[i], "%s", value);
    mkv_dump_meta meta;
    raw_meta(&meta, 1024, 64, 4, W);
    mkv_error err = {0};
    int rc = m->check(&p, &meta, &err);
    ck_assert_msg(rc == code, "%s %s=%s: status %d (%s), expected %d", m->name, key, value, rc, err.msg, code);
    ck_assert_msg(strstr(err.msg, needle), "%s %s=%s: message '%s' lacks '%s'", m->name, key, value, err.msg,
                  needle);
}

START_TEST(bad_parameters_refused)
{
    /* what depends on the dump: a budget or count beyond its context, a
     * count that is not whole (the ranges are the parameter layer's) */
    expect_refused(&mkv_method_quest, "budget", "5000", 16, MKV_EUSAGE, "larger than the context of 1024");
    expect_refused(&mkv_method_quest, "budget", "2.5", 16, MKV_EUSAGE, "whole number");
    expect_refused(&mkv_method_naive2d, "budget", "2000", 16, MKV_EUSAGE, "larger than the context");
    expect_refused(&mkv_method_snapkv, "keep", "2000", 16, MKV_EUSAGE, "larger than the context");
    expect_refused(&mkv_method_streaming, "keep", "2000", 16, MKV_EUSAGE, "larger than the context");
    expect_refused(&mkv_method_cam, "keep", "2000", 16, MKV_EUSAGE, "larger than the context");
    expect_refused(&mkv_method_cam, "start", "1", 16, MKV_EUSAGE, "start=1 leaves no window");
    expect_refused(&mkv_method_cam, "merge", "2.5", 16, MKV_EUSAGE, "whole number");
    /* methods that need observation queries, on a dump without them */
    expect_refused(&mkv_method_think, "keep", "0.5", 0, MKV_EFORMAT,
                   "needs observation queries (the dump has W = 0)");
    expect_refused(&mkv_method_snapkv, "keep", "0.1", 0, MKV_EFORMAT,
                   "needs observation queries (the dump has W = 0)");
    expect_refused(&mkv_method_cam, "keep", "0.2", 0, MKV_EFORMAT,
                   "needs observation queries (the dump has W = 0)");
}
END_TEST

START_TEST(parameter_ranges_refused_when_set)
{
    /* every range --list-methods shows is what the parameter layer takes,
     * in one wording */
    static const struct {
        const mkv_method *m;
        const char *assignment, *msg;
    } cases[] = {
        {&mkv_method_kivi, "bits=3", "invalid value '3' for parameter 'bits': must be one of 2|4"},
        {&mkv_method_kivi, "bits=5", "invalid value '5' for parameter 'bits': must be one of 2|4"},
        {&mkv_method_kivi, "group=0", "invalid value '0' for parameter 'group': must be in 1..1000000000"},
        {&mkv_method_kivi, "residual=-1", "invalid value '-1' for parameter 'residual': must be in 0..1000000000"},
        {&mkv_method_think, "keep=0", "invalid value '0' for parameter 'keep': must be in (0, 1]"},
        {&mkv_method_think, "keep=1.5", "invalid value '1.5' for parameter 'keep': must be in (0, 1]"},
        {&mkv_method_think, "window=0", "invalid value '0' for parameter 'window': must be in 1..1000000000"},
        {&mkv_method_quest, "page=0", "invalid value '0' for parameter 'page': must be in 1..1048576"},
        {&mkv_method_quest, "budget=0", "invalid value '0' for parameter 'budget': must be in (0, 1e+15]"},
        {&mkv_method_quest, "agg=mean", "invalid value 'mean' for parameter 'agg': must be one of max|sum"},
        {&mkv_method_quest, "sink=-2", "invalid value '-2' for parameter 'sink': must be in 0..1000000000"},
        {&mkv_method_naive2d, "keep=0", "invalid value '0' for parameter 'keep': must be in (0, 1]"},
        {&mkv_method_naive2d, "keep=2", "invalid value '2' for parameter 'keep': must be in (0, 1]"},
        {&mkv_method_snapkv, "keep=0", "invalid value '0' for parameter 'keep': must be in (0, 1e+15]"},
        {&mkv_method_snapkv, "kernel=0", "invalid value '0' for parameter 'kernel': must be in 1..1000000, odd"},
        {&mkv_method_snapkv, "kernel=4", "invalid value '4' for parameter 'kernel': must be in 1..1000000, odd"},
        {&mkv_method_streaming, "sink=-1", "invalid value '-1' for parameter 'sink': must be in 0..1000000000"},
        {&mkv_method_turboquant, "key_bits=0", "invalid value '0' for parameter 'key_bits': must be in 1..4"},
        {&mkv_method_turboquant, "value_bits=5", "invalid value '5' for parameter 'value_bits': must be in 1..4"},
        {&mkv_method_turboquant, "value_bits=2.5", "invalid value '2.5' for parameter 'value_bits': not an integer"},
        {&mkv_method_turboquant, "prod=yes", "invalid value 'yes' for parameter 'prod': must be one of off|on"},
        {&mkv_method_turboquant, "seed=-1", "invalid value '-1' for parameter 'seed': must be in 0..4294967295"},
        {&mkv_method_cam, "keep=0", "invalid value '0' for parameter 'keep': must be in (0, 1e+15]"},
        {&mkv_method_cam, "start=1.5", "invalid value '1.5' for parameter 'start': must be in 0..1"},
        {&mkv_method_cam, "merge=0", "invalid value '0' for parameter 'merge': must be in (0, 1e+15]"},
        {&mkv_method_cam, "window=0", "invalid value '0' for parameter 'window': must be in 1..1000000000"},
        {&mkv_method_cam, "seed=4294967296", "invalid value '4294967296' for parameter 'seed': must be in 0..4294967295"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        mkv_params p;
        mkv_params_init(&p, cases[i].m->params);
        mkv_error err = {0};
        ck_assert_msg(mkv_params_parse(&p, cases[i].assignment, &err) == MKV_EUSAGE, "%s %s accepted",
                      cases[i].m->name, cases[i].assignment);
        ck_assert_str_eq(err.msg, cases[i].msg);
    }
    /* and what it shows is accepted */
    mkv_params p;
    mkv_error err = {0};
    mkv_params_init(&p, mkv_method_kivi.params);
    ck_assert_int_eq(mkv_params_parse(&p, "bits=4", &err), MKV_OK);
    mkv_params_init(&p, mkv_method_snapkv.params);
    ck_assert_int_eq(mkv_params_parse(&p, "kernel=5", &err), MKV_OK);
}
END_TEST

START_TEST(defaults_pass_and_queries_required_at_compress)
{
    const mkv_method *all[] = {&mkv_method_quest, &mkv_method_think, &mkv_method_kivi, &mkv_method_snapkv,
                               &mkv_method_streaming, &mkv_method_naive2d, &mkv_method_turboquant,
                               &mkv_method_cam};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
        mkv_params p;
        mkv_params_init(&p, all[i]->params);
        mkv_dump_meta meta;
        raw_meta(&meta, 1024, 64, 4, 16);
        mkv_error err = {0};
        ck_assert_msg(all[i]->check(&p, &meta, &err) == MKV_OK, "%s defaults: %s", all[i]->name, err.msg);
    }
    /* compress refuses too, before touching the writer */
    head_data h;
    make_head(&h, 64, 8, 2, 0, 3);
    mkv_head_kv in = {0, 0, h.T, h.d, h.G, h.k, h.v, 0, NULL, NULL, 1};
    const mkv_method *need[] = {&mkv_method_think, &mkv_method_snapkv, &mkv_method_cam};
    for (size_t i = 0; i < sizeof need / sizeof *need; i++) {
        mkv_params p;
        mkv_params_init(&p, need[i]->params);
        mkv_error err = {0};
        ck_assert_int_eq(need[i]->compress(&p, &in, NULL, &err), MKV_EFORMAT);
        ck_assert(strstr(err.msg, "needs observation queries (the dump has W = 0)"));
    }
    free_head(&h);
}
END_TEST

/* A query that does not fit the loaded cache is refused, not read past. */
START_TEST(attend_refuses_bad_position)
{
    head_data h;
    make_head(&h, 40, 8, 2, 1, 9);
    compressed cp;
    compress_head(&mkv_method_quest, "", &h, "badpos.h5", &cp);
    float q[16] = {0}, out[16];
    uint8_t att[64];
    mkv_attend_query aq = {2, 8, q, 40, 1.0 / sqrt(8.0)};
    mkv_attend_result r = {out, att, 0};
    mkv_error err = {0};
    ck_assert_int_eq(cp.m->attend(cp.state, &aq, &r, &err), MKV_EUSAGE);
    ck_assert(strstr(err.msg, "outside the cache"));
    release(&cp);
    free_head(&h);
}
END_TEST

static Suite *baselines_suite(void)
{
    Suite *s = suite_create("baselines");
    TCase *tc = tcase_create("methods");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, quest_page_score_by_hand);
    tcase_add_test(tc, quest_bound_holds);
    tcase_add_test(tc, quest_selects_like_reference);
    tcase_add_test(tc, full_budget_is_exact);
    tcase_add_test(tc, codes_pack_by_hand);
    tcase_add_test(tc, kivi_two_bit_by_hand);
    tcase_add_test(tc, kivi_decodes_within_half_scale);
    tcase_add_test(tc, turboquant_codebook_by_hand);
    tcase_add_test(tc, turboquant_mse_distortion_as_published);
    tcase_add_test(tc, turboquant_prod_unbiased);
    tcase_add_test(tc, turboquant_stores_and_attends);
    tcase_add_test(tc, turboquant_refuses_what_it_cannot_store);
    tcase_add_test(tc, think_keeps_top_channels);
    tcase_add_test(tc, snapkv_selects_like_reference);
    tcase_add_test(tc, snapkv_keeps_planted_targets);
    tcase_add_test(tc, streaming_attends_sink_and_recent);
    tcase_add_test(tc, cam_merges_by_hand);
    tcase_add_test(tc, naive2d_matches_masked_reference);
    tcase_add_test(tc, bad_parameters_refused);
    tcase_add_test(tc, parameter_ranges_refused_when_set);
    tcase_add_test(tc, defaults_pass_and_queries_required_at_compress);
    tcase_add_test(tc, attend_refuses_bad_position);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return test_run(baselines_suite());
}
