/* Unit tests over every registered method (lib/methods/registry.c), plus the
 * parameter parser, the exact-attention reference and the metrics.
 *
 * The references are independent of the methods: attention is recomputed
 * here in long double from the raw K/V, hand-computed cases pin down the
 * reference itself, and the metrics are checked against hand values (numpy's
 * percentile rule for the quantiles).
 *
 * Tolerance of 16-bit storage. A method that keeps every token and element
 * but stores them as float16 perturbs each value by at most 2^-11 of itself
 * and each score by about 2^-11 x scale x sum|q_i k_i|; with the inputs below
 * (|x| <= 1, head_dim 16) the output moves by well under 2e-3 of the RMS of
 * the attended values, sqrt(sum_t p_t |v_t|^2). That RMS is the yardstick:
 * |o - o_exact| itself can be small when values cancel, so dividing by it
 * would turn a rounding into a large "relative" error. */
#include "config.h"

#include <hdf5.h>
#include <math.h>
#include <zlib.h>

#include "io/cdump.h"
#include "methods/compress.h"
#include "methods/evaluate.h"
#include "methods/head_budget.h"
#include "core/log.h"
#include "methods/method.h"
#include "methods/metrics.h"
#include "testutil.h"

/* ================================================================ parameters */

static const mkv_param_spec test_specs[] = {
    {"keep", MKV_PARAM_DOUBLE, "0.25", 0.01, 1, NULL, "fraction of elements kept per vector"},
    {"block", MKV_PARAM_INT, "8", 1, 65536, NULL, "tokens per block"},
    {"mode", MKV_PARAM_STRING, "auto", 0, 0, "auto fixed", "strategy choice"},
    {NULL, 0, NULL, 0, 0, NULL, NULL}};

START_TEST(params_defaults_and_format)
{
    mkv_params p;
    mkv_params_init(&p, test_specs);
    ck_assert_int_eq(p.n, 3);
    char buf[256];
    mkv_params_format(&p, buf, sizeof buf);
    ck_assert_str_eq(buf, "keep=0.25 block=8 mode=auto");
    ck_assert(mkv_params_double(&p, "keep") == 0.25);
    ck_assert_int_eq(mkv_params_int(&p, "block"), 8);
    ck_assert_str_eq(mkv_params_str(&p, "mode"), "auto");
    ck_assert_ptr_null(mkv_params_str(&p, "nope"));
    mkv_params none;
    mkv_params_init(&none, (const mkv_param_spec[]){{NULL, 0, NULL, 0, 0, NULL, NULL}});
    ck_assert_int_eq(none.n, 0);
    mkv_params_format(&none, buf, sizeof buf);
    ck_assert_str_eq(buf, "");
}
END_TEST

START_TEST(params_set_canonical)
{
    mkv_params p;
    mkv_params_init(&p, test_specs);
    mkv_error err;
    ck_assert_int_eq(mkv_params_parse(&p, "keep=0.10", &err), MKV_OK);
    ck_assert_str_eq(mkv_params_str(&p, "keep"), "0.1");
    ck_assert_int_eq(mkv_params_parse(&p, "keep=1e-1", &err), MKV_OK);
    ck_assert_str_eq(mkv_params_str(&p, "keep"), "0.1");
    ck_assert_int_eq(mkv_params_parse(&p, "keep=1", &err), MKV_OK);
    ck_assert_str_eq(mkv_params_str(&p, "keep"), "1");
    ck_assert_int_eq(mkv_params_parse(&p, "keep=0.3333333333333333", &err), MKV_OK);
    ck_assert(mkv_params_double(&p, "keep") == 0.3333333333333333);
    ck_assert_int_eq(mkv_params_set(&p, "block", "008", &err), MKV_OK);
    ck_assert_str_eq(mkv_params_str(&p, "block"), "8");
    ck_assert_int_eq(mkv_params_set(&p, "block", "4K", &err), MKV_OK);
    ck_assert_int_eq(mkv_params_int(&p, "block"), 4096);
    ck_assert_int_eq(mkv_params_set(&p, "mode", "fixed", &err), MKV_OK);
    char buf[256];
    mkv_params_format(&p, buf, sizeof buf);
    ck_assert_str_eq(buf, "keep=0.3333333333333333 block=4096 mode=fixed");
}
END_TEST

START_TEST(params_refused)
{
    struct { const char *assignment, *msg; } cases[] = {
        {"keep=1.5", "invalid value '1.5' for parameter 'keep': must be in 0.01..1"},
        {"keep=0", "invalid value '0' for parameter 'keep': must be in 0.01..1"},
        {"keep=abc", "invalid value 'abc' for parameter 'keep': not a number"},
        {"keep=nan", "invalid value 'nan' for parameter 'keep': not a number"},
        {"keep=inf", "invalid value 'inf' for parameter 'keep': not a number"},
        {"keep=0.5x", "invalid value '0.5x' for parameter 'keep': not a number"},
        {"keep=", "invalid value '' for parameter 'keep': empty"},
        {"block=0", "invalid value '0' for parameter 'block': must be in 1..65536"},
        {"block=2.5", "invalid value '2.5' for parameter 'block': not an integer"},
        {"block=128K", "invalid value '128K' for parameter 'block': must be in 1..65536"},
        {"block=99999999999999999999", "invalid value '99999999999999999999' for parameter 'block': not an integer"},
        {"mode=best", "invalid value 'best' for parameter 'mode': must be one of auto|fixed"},
        {"mode=a b", "invalid value 'a b' for parameter 'mode': must not contain spaces or '='"},
        {"bogus=1", "unknown parameter 'bogus' (parameters: keep, block, mode)"},
        {"keep", "invalid parameter 'keep': expected KEY=VALUE"},
        {"=1", "invalid parameter '=1': expected KEY=VALUE"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mkv_params p;
        mkv_params_init(&p, test_specs);
        mkv_error err;
        mkv_error_clear(&err);
        ck_assert_msg(mkv_params_parse(&p, cases[i].assignment, &err) == MKV_EUSAGE, "'%s' accepted",
                      cases[i].assignment);
        ck_assert_str_eq(err.msg, cases[i].msg);
        /* a refused value leaves the old one */
        char buf[256];
        mkv_params_format(&p, buf, sizeof buf);
        ck_assert_str_eq(buf, "keep=0.25 block=8 mode=auto");
    }
    mkv_params none;
    mkv_params_init(&none, (const mkv_param_spec[]){{NULL, 0, NULL, 0, 0, NULL, NULL}});
    mkv_error err;
    ck_assert_int_eq(mkv_params_parse(&none, "keep=1", &err), MKV_EUSAGE);
    ck_assert_str_eq(err.msg, "unknown parameter 'keep' (the method takes none)");
}
END_TEST

/* A list of assignments: commas and blanks separate them, the count comes
 * back, and the result is that of the same assignments one by one. */
START_TEST(params_parse_list)
{
    struct { const char *list; int n; const char *canon; } cases[] = {
        {"keep=1,mode=fixed", 2, "keep=1 block=8 mode=fixed"},
        {"keep=1 mode=fixed", 2, "keep=1 block=8 mode=fixed"},
        {" keep=0.5,, block=4\tmode=fixed, ", 3, "keep=0.5 block=4 mode=fixed"},
        {"block=4", 1, "keep=0.25 block=4 mode=auto"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mkv_params p;
        mkv_params_init(&p, test_specs);
        mkv_error err;
        mkv_error_clear(&err);
        ck_assert_int_eq(mkv_params_parse_list(&p, cases[i].list, &err), cases[i].n);
        char buf[256];
        mkv_params_format(&p, buf, sizeof buf);
        ck_assert_str_eq(buf, cases[i].canon);
    }
    struct { const char *list, *msg; } bad[] = {
        {"", "invalid parameter list '': expected KEY=VALUE[,KEY=VALUE...]"},
        {" , ", "invalid parameter list ' , ': expected KEY=VALUE[,KEY=VALUE...]"},
        {"keep=1,block", "invalid parameter 'block': expected KEY=VALUE"},
        {"keep=1,mode=best", "invalid value 'best' for parameter 'mode': must be one of auto|fixed"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mkv_params p;
        mkv_params_init(&p, test_specs);
        mkv_error err;
        mkv_error_clear(&err);
        ck_assert_int_eq(mkv_params_parse_list(&p, bad[i].list, &err), -1);
        ck_assert_str_eq(err.msg, bad[i].msg);
    }
}
END_TEST

/* Which parameters were given (not defaults): what the checks warn about
 * when a given one is ignored; parameters read back from a file are a
 * record, forgotten as given. */
START_TEST(params_given)
{
    mkv_params p;
    mkv_params_init(&p, test_specs);
    mkv_error err;
    mkv_error_clear(&err);
    ck_assert(!mkv_params_given(&p, "keep") && !mkv_params_given(&p, "block"));
    ck_assert_int_eq(mkv_params_parse_list(&p, "mode=fixed,keep=0.5", &err), 2);
    ck_assert(mkv_params_given(&p, "keep") && mkv_params_given(&p, "mode") && !mkv_params_given(&p, "block"));
    ck_assert(!mkv_params_given(&p, "nope"));
    /* a refused value leaves the parameter as it was */
    ck_assert_int_eq(mkv_params_set(&p, "block", "0", &err), MKV_EUSAGE);
    ck_assert(!mkv_params_given(&p, "block"));
    char buf[128];
    static const char *const keys[] = {"block", "keep", "mode", NULL};
    /* in spec order, whatever the order of keys */
    ck_assert_int_eq(mkv_params_given_text(&p, keys, buf, sizeof buf), 2);
    ck_assert_str_eq(buf, "keep=0.5, mode=fixed");
    static const char *const block_only[] = {"block", NULL};
    ck_assert_int_eq(mkv_params_given_text(&p, block_only, buf, sizeof buf), 0);
    ck_assert_str_eq(buf, "");
    mkv_params_forget_given(&p);
    ck_assert(!mkv_params_given(&p, "keep"));
    ck_assert(mkv_params_double(&p, "keep") == 0.5);
}
END_TEST

/* ================================================================ metrics */

START_TEST(metrics_hand_values)
{
    float x[3] = {1, 2, 2}, ref[3] = {1, 2, 3}, zero[3] = {0, 0, 0};
    ck_assert(fabs(mkv_rel_l2(x, ref, 3) - 1 / sqrt(14.0)) < 1e-15);
    ck_assert(mkv_rel_l2(ref, ref, 3) == 0);
    ck_assert(fabs(mkv_rel_l2(x, zero, 3) - 3.0) < 1e-15);   /* absolute when ref = 0 */
    double probs[4] = {0.5, 0.25, 0.125, 0.125};
    uint8_t att[4] = {1, 0, 1, 0}, all[4] = {1, 1, 1, 1}, none[4] = {0};
    ck_assert(mkv_recall(probs, att, 4) == 0.625);
    ck_assert(mkv_recall(probs, all, 4) == 1.0);
    ck_assert(mkv_recall(probs, none, 4) == 0.0);

    /* numpy: mean 4, median 3, percentile(.., 90) = 7.6 */
    double v[5] = {3, 1, 2, 10, 4};
    mkv_summary s;
    ck_assert_int_eq(mkv_summarize(v, 5, &s), 0);
    ck_assert_int_eq(s.n, 5);
    ck_assert(fabs(s.mean - 4) < 1e-15);
    ck_assert(s.median == 3);
    ck_assert(fabs(s.p90 - 7.6) < 1e-12);
    ck_assert(s.min == 1 && s.max == 10);
    ck_assert(v[0] == 3 && v[3] == 10);   /* input untouched */
    /* even count: median 2.5, percentile 90 = 3.7 */
    double e[4] = {4, 3, 2, 1};
    mkv_summarize(e, 4, &s);
    ck_assert(s.median == 2.5);
    ck_assert(fabs(s.p90 - 3.7) < 1e-12);
    double one = 0.125;
    mkv_summarize(&one, 1, &s);
    ck_assert(s.mean == 0.125 && s.median == 0.125 && s.p90 == 0.125);
    mkv_summarize(NULL, 0, &s);
    ck_assert(isnan(s.mean) && isnan(s.median) && s.n == 0);
}
END_TEST

/* ================================================================ exact attention */

START_TEST(exact_attention_hand_case)
{
    /* scale 1: scores 0 and ln 3 -> weights 1/4, 3/4; second head q = 0 -> 1/2, 1/2 */
    float k[4] = {0, 0, (float)log(3.0), 0};
    float v[4] = {4, 0, 0, 4};
    float q[4] = {1, 0, 0, 0};
    float out[4];
    double probs[4];
    mkv_attend_query aq = {.G = 2, .d = 2, .q = q, .pos = 1, .scale = 1.0};
    mkv_attend_exact(k, v, 2, &aq, out, probs);
    ck_assert(fabs(probs[0] - 0.25) < 1e-7 && fabs(probs[1] - 0.75) < 1e-7);
    ck_assert(fabs(probs[2] - 0.5) < 1e-15 && fabs(probs[3] - 0.5) < 1e-15);
    ck_assert(fabs(out[0] - 1) < 1e-6 && fabs(out[1] - 3) < 1e-6);
    ck_assert(out[2] == 2 && out[3] == 2);
    /* position 0 sees only token 0 */
    aq.pos = 0;
    mkv_attend_exact(k, v, 2, &aq, out, NULL);
    ck_assert(out[0] == 4 && out[1] == 0 && out[2] == 4 && out[3] == 0);
}
END_TEST

/* ================================================================ every method */

/* Most generous settings of each method: every token and every element kept
 * (or the finest quantization), so attention must match exact attention to
 * storage precision. A registered method missing here fails the test: decide
 * its generous settings and add a line. A method may have several lines. */
static const struct {
    const char *method;
    const char *params;   /* space-separated KEY=VALUE */
    double tol;           /* error / RMS of attended values */
    const char *why;
} generous[] = {
    {"full", "", 2e-3, "float16 storage"},
    {"mosaic", "strategy=fixed keep=1 energy=1 budget=1", 2e-3, "float16 storage after an orthogonal rotation"},
    {"uniform2d", "keep=1 budget=1", 2e-3, "float16 storage after an orthogonal rotation"},
    {"quest", "budget=1", 2e-3, "float16 storage"},
    {"think", "keep=1", 2e-3, "float16 storage"},
    /* every token (MT = 150) in the float16 residual window: nothing quantized */
    {"kivi", "bits=4 residual=150", 2e-3, "float16 storage"},
    /* quantization cannot be exact: a 4-bit code moves a value by up to half
     * a step, 1/30 of its group's range; over inputs in [-1, 1] that stays
     * below 0.1 of the value RMS */
    {"kivi", "bits=4 residual=0", 0.1, "4-bit quantization of keys and values"},
    {"snapkv", "keep=1", 2e-3, "float16 storage"},
    {"streaming", "keep=1", 2e-3, "float16 storage"},
    {"cam", "keep=1", 2e-3, "float16 storage"},
    {"naive2d", "keep=1 budget=1", 2e-3, "float16 storage"},
    /* every token quantized at 4 bits a coordinate: at d = 16 the codebook
     * leaves 0.008 of a vector's squared norm, a relative error of 0.09 per
     * vector on average; a query at position 0 sees one value, so its error
     * is that vector's, which may be twice the average */
    {"turboquant", "key_bits=4 value_bits=4", 0.2, "4-bit codes of rotated keys and values"},
    {"turboquant", "key_bits=4 value_bits=4 prod=on", 0.2, "3-bit codes and 1-bit residual sketch of keys"},
};
#define N_GENEROUS (sizeof generous / sizeof generous[0])

enum { ML = 1, MKVH = 2, MG = 2, MNH = MKVH * MG, MD = 16, MT = 150, MW = 6 };
static const int32_t m_qpos[MW] = {0, 1, 37, 90, 148, 149};

typedef struct {
    float k[MKVH][MT][MD], v[MKVH][MT][MD];
    float q[MNH][MW][MD];   /* as in a raw dump: query heads h*G..h*G+G-1 belong to KV head h */
} head_data;

/* Values in [-1, 1] with a few larger keys, so that attention is not uniform. */
static void make_data(head_data *x, uint64_t seed, int f16_exact)
{
    uint64_t s = seed;
    for (int h = 0; h < MKVH; h++)
        for (int t = 0; t < MT; t++)
            for (int i = 0; i < MD; i++) {
                double a = 2 * test_uniform(&s) - 1, b = 2 * test_uniform(&s) - 1;
                if (t % 17 == 3)
                    a *= 3;   /* some salient keys */
                if (f16_exact) {
                    /* multiples of 1/256 below 4 are exact in float16 */
                    a = round(a * 256) / 256;
                    b = round(b * 256) / 256;
                }
                x->k[h][t][i] = (float)a;
                x->v[h][t][i] = (float)b;
            }
    for (int h = 0; h < MNH; h++)
        for (int w = 0; w < MW; w++)
            for (int i = 0; i < MD; i++)
                x->q[h][w][i] = (float)(2 * test_uniform(&s) - 1);
}

static void fill_meta(mkv_dump_meta *m)
{
    mkv_dump_meta_init(m);
    strcpy(m->model, "unit-methods");
    m->n_layers = ML;
    m->n_heads = MNH;
    m->n_kv_heads = MKVH;
    m->head_dim = MD;
    m->n_tokens = MT;
    m->n_queries = MW;
}

/* Set "K=V K=V ..." on p; fail the test naming the method and assignment. */
static void set_all(const mkv_method *meth, mkv_params *p, const char *list)
{
    char copy[256];
    snprintf(copy, sizeof copy, "%s", list);
    for (char *save = NULL, *tok = strtok_r(copy, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        mkv_error err;
        mkv_error_clear(&err);
        ck_assert_msg(mkv_params_parse(p, tok, &err) == MKV_OK,
                      "generous-parameter table: method '%s': %s (update tests/check_methods.c)", meth->name, err.msg);
    }
}

/* Compress x with the method into path. */
static void compress_to(const mkv_method *meth, const mkv_params *p, const head_data *x, const char *path)
{
    mkv_dump_meta m;
    fill_meta(&m);
    mkv_error err;
    mkv_error_clear(&err);
    ck_assert_msg(meth->check(p, &m, &err) == MKV_OK, "%s: check: %s", meth->name, err.msg);
    mkv_cdump_meta cm;
    memset(&cm, 0, sizeof cm);
    snprintf(cm.method, sizeof cm.method, "%s", meth->name);
    mkv_params_format(p, cm.params, sizeof cm.params);
    strcpy(cm.source, "memory");
    cm.raw = m;
    mkv_cdump_writer *w;
    ck_assert_msg(mkv_cdump_create(path, NULL, &cm, m_qpos, &w, &err) == MKV_OK, "%s", err.msg);
    for (int h = 0; h < MKVH; h++) {
        mkv_head_kv in = {.layer = 0, .head = h, .T = MT, .d = MD, .G = MG,
                          .k = &x->k[h][0][0], .v = &x->v[h][0][0], .W = MW,
                          .q = &x->q[h * MG][0][0], .query_pos = m_qpos, .threads = 1};
        ck_assert_msg(meth->compress(p, &in, w, &err) == MKV_OK, "%s: compress head %d: %s", meth->name, h, err.msg);
    }
    ck_assert_msg(mkv_cdump_commit(w, &err) == MKV_OK, "%s: commit: %s", meth->name, err.msg);
}

/* Exact attention in long double over the given K/V (independent of
 * mkv_attend_exact): output, weights and the RMS of the attended values. */
static void reference(const float *k, const float *v, const float *q, int64_t pos, double *out, double *probs,
                      double *rms, double *lse)
{
    long double s[MT], m = -INFINITY, sum = 0;
    for (int64_t t = 0; t <= pos; t++) {
        long double dot = 0;
        for (int i = 0; i < MD; i++)
            dot += (long double)q[i] * k[t * MD + i];
        s[t] = dot / sqrtl(MD);
        if (s[t] > m)
            m = s[t];
    }
    for (int64_t t = 0; t <= pos; t++)
        sum += (s[t] = expl(s[t] - m));
    *lse = (double)(m + logl(sum));
    long double acc[MD] = {0}, sq = 0;
    for (int64_t t = 0; t <= pos; t++) {
        long double pt = s[t] / sum, norm = 0;
        probs[t] = (double)pt;
        for (int i = 0; i < MD; i++) {
            acc[i] += pt * v[t * MD + i];
            norm += (long double)v[t * MD + i] * v[t * MD + i];
        }
        sq += pt * norm;
    }
    for (int i = 0; i < MD; i++)
        out[i] = (double)acc[i];
    *rms = (double)sqrtl(sq);
}

/* Load every head, answer every query; the largest error / RMS, the
 * smallest recall and the largest error of the log-sum-exp seen (the
 * latter only meaningful where every token is attended). */
static void attend_all(const mkv_method *meth, const mkv_params *p, const head_data *x, const char *path,
                       double *worst, double *min_recall, double *worst_lse)
{
    mkv_cdump *c;
    mkv_error err;
    mkv_error_clear(&err);
    ck_assert_msg(mkv_cdump_open(path, &c, &err) == MKV_OK, "%s: %s", meth->name, err.msg);
    *worst = 0;
    *min_recall = 1;
    *worst_lse = 0;
    for (int h = 0; h < MKVH; h++) {
        void *state = NULL;
        ck_assert_msg(meth->load(p, c, 0, h, &state, &err) == MKV_OK, "%s: load: %s", meth->name, err.msg);
        for (int w = 0; w < MW; w++) {
            float q[MG * MD], out[MG * MD];
            double lse[MG];
            uint8_t attended[MT] = {0};
            for (int g = 0; g < MG; g++)
                memcpy(q + g * MD, x->q[h * MG + g][w], sizeof(float) * MD);
            mkv_attend_query aq = {.G = MG, .d = MD, .q = q, .pos = m_qpos[w], .scale = 1 / sqrt((double)MD)};
            mkv_attend_result r = {.out = out, .attended = attended, .bytes_read = 0, .lse = lse};
            ck_assert_msg(meth->attend(state, &aq, &r, &err) == MKV_OK, "%s: attend: %s", meth->name, err.msg);
            ck_assert_msg(r.bytes_read > 0, "%s: bytes_read is 0", meth->name);
            for (int t = m_qpos[w] + 1; t < MT; t++)
                ck_assert_msg(!attended[t], "%s: attended token %d after position %d", meth->name, t, m_qpos[w]);
            for (int g = 0; g < MG; g++) {
                double ref[MD], probs[MT], rms, ref_lse, diff = 0, recall = 0;
                reference(&x->k[h][0][0], &x->v[h][0][0], q + g * MD, m_qpos[w], ref, probs, &rms, &ref_lse);
                if (fabs(lse[g] - ref_lse) > *worst_lse)
                    *worst_lse = fabs(lse[g] - ref_lse);
                for (int i = 0; i < MD; i++)
                    diff += (out[g * MD + i] - ref[i]) * (out[g * MD + i] - ref[i]);
                for (int t = 0; t <= m_qpos[w]; t++)
                    recall += attended[t] ? probs[t] : 0;
                if (sqrt(diff) / rms > *worst)
                    *worst = sqrt(diff) / rms;
                if (recall < *min_recall)
                    *min_recall = recall;
            }
        }
        meth->free_state(state);
    }
    mkv_cdump_close(c);
}

START_TEST(registry_is_sound)
{
    ck_assert_ptr_nonnull(mkv_methods[0]);
    ck_assert_ptr_null(mkv_method_find("no-such-method"));
    for (int i = 0; mkv_methods[i]; i++) {
        const mkv_method *m = mkv_methods[i];
        ck_assert_msg(m->name && m->name[0] && strlen(m->name) < 32, "method %d has no usable name", i);
        ck_assert_msg(m->summary && m->summary[0], "%s: no summary", m->name);
        ck_assert_msg(m->params && m->check && m->compress && m->load && m->attend && m->free_state,
                      "%s: missing callbacks", m->name);
        ck_assert_ptr_eq(mkv_method_find(m->name), m);
        ck_assert_msg(!m->append == !m->state_bytes, "%s: append and state_bytes come together", m->name);
        ck_assert_msg(m->append || (!m->decode_counters && !m->decode_flush),
                      "%s: decode counters and flush without append", m->name);
        int n_specs = 0;
        while (m->params[n_specs].name)
            n_specs++;
        ck_assert_msg(n_specs <= MKV_MAX_PARAMS, "%s: %d parameters, at most %d fit mkv_params", m->name, n_specs,
                      MKV_MAX_PARAMS);
        for (int j = 0; j < i; j++)
            ck_assert_msg(strcmp(mkv_methods[j]->name, m->name) != 0, "method '%s' registered twice", m->name);
        int known = 0;
        for (size_t j = 0; j < N_GENEROUS; j++)
            known |= strcmp(generous[j].method, m->name) == 0;
        ck_assert_msg(known, "method '%s' is not in the generous-parameter table of tests/check_methods.c",
                      m->name);
    }
}
END_TEST

/* Every default is valid; values outside each range, bad choices and
 * unknown names are refused; a budget beyond the context is refused. */
START_TEST(bad_parameters_refused)
{
    for (int i = 0; mkv_methods[i]; i++) {
        const mkv_method *meth = mkv_methods[i];
        mkv_params p;
        mkv_params_init(&p, meth->params);
        mkv_error err;
        for (int j = 0; j < p.n; j++) {
            const mkv_param_spec *s = p.spec[j];
            char v[64];
            ck_assert_msg(s->help && s->help[0], "%s: parameter '%s' has no help", meth->name, s->name);
            ck_assert_msg(mkv_params_set(&p, s->name, s->def, &err) == MKV_OK, "%s: default of '%s': %s",
                          meth->name, s->name, err.msg);
            if (s->kind == MKV_PARAM_STRING) {
                if (s->choices)
                    ck_assert_int_eq(mkv_params_set(&p, s->name, "no-such-choice", &err), MKV_EUSAGE);
                continue;
            }
            ck_assert_msg(s->min <= s->max, "%s: '%s' has an empty range", meth->name, s->name);
            if (s->max < 1e15) {
                snprintf(v, sizeof v, "%.17g", s->kind == MKV_PARAM_INT ? s->max + 1 : s->max + fabs(s->max) + 1);
                ck_assert_msg(mkv_params_set(&p, s->name, v, &err) == MKV_EUSAGE, "%s: %s=%s accepted",
                              meth->name, s->name, v);
            }
            if (s->min > -1e15) {
                snprintf(v, sizeof v, "%.17g", s->kind == MKV_PARAM_INT ? s->min - 1 : s->min - fabs(s->min) - 1);
                ck_assert_msg(mkv_params_set(&p, s->name, v, &err) == MKV_EUSAGE, "%s: %s=%s accepted",
                              meth->name, s->name, v);
            }
            ck_assert_int_eq(mkv_params_set(&p, s->name, "not-a-number", &err), MKV_EUSAGE);
        }
        ck_assert_int_eq(mkv_params_set(&p, "no_such_parameter", "1", &err), MKV_EUSAGE);

        mkv_dump_meta m;
        fill_meta(&m);
        mkv_error_clear(&err);
        ck_assert_msg(meth->check(&p, &m, &err) == MKV_OK, "%s: defaults refused: %s", meth->name, err.msg);
        /* a budget counted in tokens may not exceed the context */
        const mkv_param_spec *budget = NULL;
        for (int j = 0; j < p.n; j++)
            if (strcmp(p.spec[j]->name, "budget") == 0)
                budget = p.spec[j];
        if (budget && budget->max >= MT + 1) {
            char v[32];
            snprintf(v, sizeof v, "%d", MT + 1);
            ck_assert_int_eq(mkv_params_set(&p, "budget", v, &err), MKV_OK);
            ck_assert_msg(meth->check(&p, &m, &err) == MKV_EUSAGE, "%s: budget=%d for %d tokens accepted",
                          meth->name, MT + 1, MT);
            ck_assert_msg(strstr(err.msg, "budget"), "%s: the message does not name the budget: %s", meth->name,
                          err.msg);
        }
    }
}
END_TEST

/* At its most generous settings every method equals exact attention to the
 * precision of its storage, and attends to every token. */
START_TEST(generous_equals_exact)
{
    static head_data x;
    make_data(&x, 42, 0);
    for (size_t j = 0; j < N_GENEROUS; j++) {
        const mkv_method *meth = mkv_method_find(generous[j].method);
        if (!meth)
            continue;   /* not in this build */
        mkv_params p;
        mkv_params_init(&p, meth->params);
        set_all(meth, &p, generous[j].params);
        char path[256], name[64];
        snprintf(name, sizeof name, "generous-%s-%zu.h5", meth->name, j);
        test_path(path, sizeof path, name);
        compress_to(meth, &p, &x, path);
        double worst, min_recall, worst_lse;
        attend_all(meth, &p, &x, path, &worst, &min_recall, &worst_lse);
        /* scores are of order 1 here, so a storage error that moves the
         * output by tol of the value RMS moves the log-sum-exp about as much */
        ck_assert_msg(worst_lse <= generous[j].tol, "%s (%s): log-sum-exp off by %.3g, more than %.3g (%s)",
                      meth->name, generous[j].params, worst_lse, generous[j].tol, generous[j].why);
        ck_assert_msg(worst <= generous[j].tol, "%s (%s): error %.3g of the value RMS exceeds %.3g (%s)",
                      meth->name, generous[j].params, worst, generous[j].tol, generous[j].why);
        ck_assert_msg(min_recall > 1 - 1e-9, "%s (%s): recall %.9f < 1: not every token attended", meth->name,
                      generous[j].params, min_recall);
        if (getenv("MKV_TEST_VERBOSE"))
            fprintf(stderr, "%-10s %-40s error/RMS %.3g\n", meth->name, generous[j].params, worst);
        unlink(path);
    }
}
END_TEST

/* "full" stores float16: on float16-exact inputs it is exact up to the
 * float32 output, and it stores exactly the logical bytes. */
START_TEST(full_exact_on_f16_values)
{
    const mkv_method *full = mkv_method_find("full");
    ck_assert_ptr_nonnull(full);
    static head_data x;
    make_data(&x, 7, 1);
    mkv_params p;
    mkv_params_init(&p, full->params);
    char path[256];
    test_path(path, sizeof path, "full.h5");
    compress_to(full, &p, &x, path);
    double worst, min_recall, worst_lse;
    attend_all(full, &p, &x, path, &worst, &min_recall, &worst_lse);
    ck_assert_msg(worst_lse < 1e-6, "full: log-sum-exp off by %.3g on float16-exact inputs", worst_lse);
    ck_assert_msg(worst < 1e-6, "full: error %.3g on float16-exact inputs", worst);
    ck_assert(min_recall > 1 - 1e-12);
    mkv_cdump *c;
    mkv_error err;
    ck_assert_int_eq(mkv_cdump_open(path, &c, &err), MKV_OK);
    ck_assert_uint_eq(mkv_cdump_meta_of(c)->physical_bytes, (uint64_t)ML * MKVH * 2 * MT * MD * 2);
    ck_assert_uint_eq(mkv_cdump_meta_of(c)->physical_bytes, mkv_cdump_meta_of(c)->logical_bytes);
    /* bytes read: K and V of tokens 0..p in float16 */
    void *state;
    ck_assert_int_eq(full->load(&p, c, 0, 1, &state, &err), MKV_OK);
    float out[MG * MD];
    uint8_t attended[MT] = {0};
    mkv_attend_query aq = {.G = MG, .d = MD, .q = &x.q[2][2][0], .pos = 37, .scale = 0.25};
    mkv_attend_result r = {.out = out, .attended = attended};
    ck_assert_int_eq(full->attend(state, &aq, &r, &err), MKV_OK);
    ck_assert_uint_eq(r.bytes_read, 38 * MD * 2 * 2);
    full->free_state(state);
    mkv_cdump_close(c);
    unlink(path);
}
END_TEST

/* The layer driver hands every KV head its own keys, values and query
 * group: with "full" on float16-exact inputs each stored head is exactly
 * its input, whatever the number of workers. */
START_TEST(compress_layer_every_head)
{
    const mkv_method *full = mkv_method_find("full");
    ck_assert_ptr_nonnull(full);
    static head_data x;
    make_data(&x, 11, 1);
    mkv_params p;
    mkv_params_init(&p, full->params);
    mkv_compressor comp = {.method = full, .params = &p};
    mkv_dump_meta m;
    fill_meta(&m);
    for (int threads = 1; threads <= 3; threads++) {
        char path[256];
        test_path(path, sizeof path, "layer.h5");
        mkv_cdump_meta cm;
        memset(&cm, 0, sizeof cm);
        strcpy(cm.method, "full");
        strcpy(cm.source, "memory");
        cm.raw = m;
        mkv_error err;
        mkv_error_clear(&err);
        mkv_cdump_writer *w;
        ck_assert_msg(mkv_cdump_create(path, NULL, &cm, m_qpos, &w, &err) == MKV_OK, "%s", err.msg);
        mkv_layer_kv l = {.layer = 0, .k = &x.k[0][0][0], .v = &x.v[0][0][0], .q = &x.q[0][0][0],
                          .query_pos = m_qpos};
        ck_assert_msg(mkv_compress_layer(&comp, &m, &l, threads, w, &err) == MKV_OK, "%s", err.msg);
        ck_assert_msg(mkv_cdump_commit(w, &err) == MKV_OK, "%s", err.msg);
        mkv_cdump *c;
        ck_assert_msg(mkv_cdump_open(path, &c, &err) == MKV_OK, "%s", err.msg);
        static float got[MT * MD];
        for (int h = 0; h < MKVH; h++) {
            ck_assert_int_eq(mkv_cdump_get(c, 0, h, "k", MKV_EL_F16, got, MT * MD, &err), MKV_OK);
            ck_assert(memcmp(got, &x.k[h][0][0], sizeof got) == 0);
            ck_assert_int_eq(mkv_cdump_get(c, 0, h, "v", MKV_EL_F16, got, MT * MD, &err), MKV_OK);
            ck_assert(memcmp(got, &x.v[h][0][0], sizeof got) == 0);
        }
        mkv_cdump_close(c);
        unlink(path);
    }
}
END_TEST

/* Write x as a one-layer raw dump at path, value (0, 0, 0) of v replaced by
 * v000 when non-zero. */
static void write_raw(const char *path, const head_data *x, float v000)
{
    mkv_dump_meta m;
    fill_meta(&m);
    strcpy(m.source, "synthetic");
    m.has_tokens = 0;
    mkv_dump_write_opts o;
    mkv_dump_write_opts_init(&o);
    mkv_dump_writer *w;
    mkv_error err;
    ck_assert_msg(mkv_dump_create(path, &m, &o, &w, &err) == MKV_OK, "%s", err.msg);
    static head_data y;
    y = *x;
    if (v000 != 0)
        y.v[0][0][0] = v000;
    ck_assert_int_eq(mkv_dump_write(w, 0, 'k', 0, MKVH, 0, MT, &y.k[0][0][0], &err), MKV_OK);
    ck_assert_int_eq(mkv_dump_write(w, 0, 'v', 0, MKVH, 0, MT, &y.v[0][0][0], &err), MKV_OK);
    ck_assert_int_eq(mkv_dump_write(w, 0, 'q', 0, MNH, 0, MW, &y.q[0][0][0], &err), MKV_OK);
    ck_assert_int_eq(mkv_dump_write_query_pos(w, m_qpos, &err), MKV_OK);
    ck_assert_msg(mkv_dump_commit(w, &err) == MKV_OK, "%s", err.msg);
}

/* A compressed dump records the digest of its source's K and V (zlib's
 * CRC-32 of their little-endian float32 bytes, computed here on the arrays
 * written), and evaluation refuses a reference of the same shape whose K
 * and V differ in one value. */
START_TEST(source_digest_recorded_and_checked)
{
    static head_data x;
    make_data(&x, 12, 1);
    char raw[256], other[256], comp[256];
    test_path(raw, sizeof raw, "digest-raw.h5");
    test_path(other, sizeof other, "digest-other.h5");
    test_path(comp, sizeof comp, "digest-full.h5");
    write_raw(raw, &x, 0);
    write_raw(other, &x, 0.5f);

    uLong crc = crc32(0L, Z_NULL, 0);
    const float *arrays[2] = {&x.k[0][0][0], &x.v[0][0][0]};
    for (int a = 0; a < 2; a++)
        for (size_t i = 0; i < (size_t)MKVH * MT * MD; i++) {
            uint32_t bits;
            memcpy(&bits, &arrays[a][i], 4);
            unsigned char le[4] = {bits & 0xff, (bits >> 8) & 0xff, (bits >> 16) & 0xff, bits >> 24};
            crc = crc32(crc, le, 4);
        }
    char want[32];
    snprintf(want, sizeof want, "crc32:%08lx", (unsigned long)crc);

    const mkv_method *full = mkv_method_find("full");
    mkv_params p;
    mkv_params_init(&p, full->params);
    mkv_compressor c = {.method = full, .params = &p};
    mkv_compress_bytes bytes;
    mkv_error err;
    ck_assert_msg(mkv_compress_dump(&c, raw, comp, 1, &bytes, &err) == MKV_OK, "%s", err.msg);
    mkv_cdump *cd;
    ck_assert_int_eq(mkv_cdump_open(comp, &cd, &err), MKV_OK);
    ck_assert_str_eq(mkv_cdump_meta_of(cd)->source_digest, want);
    mkv_cdump_close(cd);

    const char *refs[2] = {raw, other};
    for (int r = 0; r < 2; r++) {
        mkv_eval e;
        mkv_eval_inputs in = {.compressed = comp, .reference = refs[r]};
        ck_assert_msg(mkv_eval_open(&e, &in, &err) == MKV_OK, "%s", err.msg);
        mkv_eval_row *rows = calloc((size_t)mkv_eval_n_rows(&e), sizeof *rows);
        int rc = mkv_eval_run(&e, 1, rows, &err);
        if (r == 0)
            ck_assert_msg(rc == MKV_OK, "%s", err.msg);
        else {
            ck_assert_int_eq(rc, MKV_EFORMAT);
            ck_assert_msg(strstr(err.msg, "is not the dump") && strstr(err.msg, want), "%s", err.msg);
        }
        free(rows);
        mkv_eval_close(&e);
    }
    unlink(raw);
    unlink(other);
    unlink(comp);
}
END_TEST

/* A method that fails on KV head 1 without saying why. */
static int fail_on_head1(const mkv_params *p, const mkv_head_kv *in, mkv_cdump_writer *w, mkv_error *err)
{
    (void)p, (void)w, (void)err;
    return in->head == 1 ? MKV_EFORMAT : MKV_OK;
}

/* The failing head is named, and a method without a message gets one. */
START_TEST(compress_layer_names_failing_head)
{
    mkv_method failing = {.name = "failing", .summary = "fails", .compress = fail_on_head1};
    mkv_params p;
    mkv_params_init(&p, NULL);
    mkv_compressor comp = {.method = &failing, .params = &p};
    mkv_dump_meta m;
    fill_meta(&m);
    static head_data x;
    mkv_layer_kv l = {.layer = 3, .k = &x.k[0][0][0], .v = &x.v[0][0][0], .q = &x.q[0][0][0],
                      .query_pos = m_qpos};
    for (int threads = 1; threads <= 2; threads++) {
        mkv_error err;
        mkv_error_clear(&err);
        ck_assert_int_eq(mkv_compress_layer(&comp, &m, &l, threads, NULL, &err), MKV_EFORMAT);
        ck_assert_str_eq(err.msg, "layer 3 head 1: method 'failing' failed without a message");
    }
}
END_TEST


/* One query at position 3 over 4 tokens, d = 1, q = 1: keys ln 4, ln 2,
 * 0, 0 give weights 4/8, 2/8, 1/8, 1/8; values 1, 0, 0, 0 an exact
 * output of 1/2. With token 3 always attended (recent 1) the tokens taken
 * are {3}, {3, 0}, {3, 0, 1}, all: outputs 0, 4/5, 4/7, 1/2, relative
 * errors 1, 3/5, 1/7, 0 at ceil(f 4) = 1, 2, 3, 4 tokens. Without it: {0},
 * {0, 1}, {0, 1, 2}, all: 1, 1/3, 1/7, 0. */
START_TEST(head_error_curve_hand_case)
{
    float k[4] = {(float)log(4.0), (float)log(2.0), 0, 0}, v[4] = {1, 0, 0, 0}, q[1] = {1};
    int32_t pos[1] = {3};
    double c[MKV_HEAD_BUDGET_POINTS];
    mkv_head_kv in = {.T = 4, .d = 1, .G = 1, .k = k, .v = v, .W = 1, .q = q, .query_pos = pos};
    mkv_error err;
    static const double with_recent[5] = {0, 1, 0.6, 1.0 / 7, 0}, by_weight[5] = {0, 1, 1.0 / 3, 1.0 / 7, 0};
    for (int recent = 0; recent < 2; recent++) {
        ck_assert_int_eq(mkv_head_error_curve(&in, 0, recent, c, &err), MKV_OK);
        for (int i = 0; i < MKV_HEAD_BUDGET_POINTS; i++) {
            int tokens = (int)ceil((i + 1) * 4.0 / MKV_HEAD_BUDGET_POINTS - 1e-9);
            ck_assert_double_eq_tol(c[i], recent ? with_recent[tokens] : by_weight[tokens], 1e-6);
        }
    }
    /* no observation query inside the cache */
    pos[0] = 4;
    ck_assert_int_eq(mkv_head_error_curve(&in, 0, 0, c, &err), MKV_EUSAGE);
}
END_TEST

/* The greedy allocation on error curves built by hand: head 0 loses 0.01
 * per step throughout, head 1 0.02 per step up to 40 steps and nothing
 * after, head 2 nothing at all. Mean 0.1 of 200 steps over 3 heads = 60
 * steps, floor 0.025 = 5 each: head 1 takes steps 6..40 (35), head 0 the
 * remaining 10 (15 in all), head 2 stays at the floor. */
START_TEST(head_budgets_hand_case)
{
    enum { P = MKV_HEAD_BUDGET_POINTS };
    static double curves[3 * P];
    for (int i = 0; i < P; i++) {
        curves[i] = 2 - 0.01 * (i + 1);
        curves[P + i] = 1 - 0.02 * (i < 40 ? i + 1 : 40);
        curves[2 * P + i] = 0.5;
    }
    double b[3];
    mkv_error err;
    ck_assert_int_eq(mkv_allocate_head_budgets(curves, 3, 0.1, 0.025, b, &err), MKV_OK);
    ck_assert_double_eq_tol(b[0], 15.0 / P, 1e-12);
    ck_assert_double_eq_tol(b[1], 40.0 / P, 1e-12);
    ck_assert_double_eq_tol(b[2], 5.0 / P, 1e-12);
    ck_assert_double_eq_tol((b[0] + b[1] + b[2]) / 3, 0.1, 1e-12);
    /* every head at the floor already spends more than the mean: the floor */
    ck_assert_int_eq(mkv_allocate_head_budgets(curves, 3, 0.01, 0.05, b, &err), MKV_OK);
    for (int h = 0; h < 3; h++)
        ck_assert_double_eq_tol(b[h], 10.0 / P, 1e-12);
}
END_TEST

static Suite *methods_suite(void)
{
    Suite *s = suite_create("methods");
    TCase *tc = tcase_create("params");
    tcase_add_test(tc, params_defaults_and_format);
    tcase_add_test(tc, params_set_canonical);
    tcase_add_test(tc, params_refused);
    tcase_add_test(tc, params_parse_list);
    tcase_add_test(tc, params_given);
    suite_add_tcase(s, tc);
    tc = tcase_create("reference");
    tcase_add_test(tc, metrics_hand_values);
    tcase_add_test(tc, exact_attention_hand_case);
    suite_add_tcase(s, tc);
    tc = tcase_create("head_budget");
    tcase_add_test(tc, head_error_curve_hand_case);
    tcase_add_test(tc, head_budgets_hand_case);
    suite_add_tcase(s, tc);
    tc = tcase_create("registry");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, registry_is_sound);
    tcase_add_test(tc, bad_parameters_refused);
    tcase_add_test(tc, generous_equals_exact);
    tcase_add_test(tc, full_exact_on_f16_values);
    tcase_add_test(tc, compress_layer_every_head);
    tcase_add_test(tc, source_digest_recorded_and_checked);
    tcase_add_test(tc, compress_layer_names_failing_head);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    mkv_log_init("check_methods");
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    return test_run(methods_suite());
}
