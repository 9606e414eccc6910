/* Decoding with a compressed cache (lib/decode): the full cache is the
 * plain forward pass bit for bit; every method at lossless settings equals
 * it within float16 rounding; perplexity matches tests/model_ref.py's
 * independent float64 decode for the full cache and for Quest; bytes held
 * are counted by hand; each method's decode-time rule (its append) gives
 * the state compress makes of the longer cache, or keeps the tokens its
 * paper keeps; misuse is refused.  The models are written by the
 * test (random weights), stories260K is used too where it is found. */
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "decode/ccache.h"
#include "core/attn.h"
#include "core/half.h"
#include "core/log.h"
#include "core/rng.h"
#include "decode/decoder.h"
#include "decode/needle.h"
#include "io/cdump.h"
#include "io/dump.h"
#include "methods/method.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/model_load.h"
#include "model/sampler.h"
#include "model_testutil.h"
#include "testutil.h"


static mkv_decoder_opts opts_for(const mkv_method *m, const mkv_params *p, int max_new, int threads)
{
    mkv_decoder_opts o;
    mkv_decoder_opts_init(&o);
    o.method = m;
    o.params = p;
    o.threads = threads;
    o.chunk = 32;
    o.window = 8;
    o.max_new = max_new;
    return o;
}

enum { C = 150, N = 20 };

/* The method of that name with params parsed into p. */
static const mkv_method *method_with(const char *name, const char *params, mkv_params *p)
{
    mkv_error err;
    const mkv_method *meth = mkv_method_find(name);
    ck_assert_ptr_nonnull(meth);
    mkv_params_init(p, meth->params);
    if (params[0])
        ck_assert_msg(mkv_params_parse_list(p, params, &err) >= 0, "%s: %s", name, err.msg);
    return meth;
}

/* The full cache is the model's own forward pass: the same logits, bit
 * for bit, as a forward pass run by hand with the same chunking. */
START_TEST(full_is_the_forward_pass)
{
    mkv_model_config c;
    test_decode_config(&c);
    mkv_model *m = random_model(&c, 5);
    int32_t *tok = test_tokens(C + N, c.vocab_size, 3);
    mkv_error err;
    mkv_decoder_opts o = opts_for(NULL, NULL, N, 2);
    static float got[64], want[64];
    mkv_decoder *d;
    ck_assert_msg(mkv_decoder_prefill(m, tok, C, &o, got, &d, &err) == MKV_OK, "%s", err.msg);
    mkv_forward *f;
    mkv_forward_opts fo = {.threads = 2, .chunk = 32, .max_seq_len = C + N};
    ck_assert_int_eq(mkv_forward_create(m, &fo, &f, &err), MKV_OK);
    ck_assert_int_eq(mkv_forward_run(f, tok, C, want, MKV_LOGITS_LAST, &err), MKV_OK);
    ck_assert(memcmp(got, want, sizeof want) == 0);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(mkv_decoder_step(d, tok[C + i], got, &err), MKV_OK);
        ck_assert_int_eq(mkv_forward_run(f, &tok[C + i], 1, want, MKV_LOGITS_LAST, &err), MKV_OK);
        ck_assert_msg(memcmp(got, want, sizeof want) == 0, "step %d: logits differ", i);
    }
    mkv_decoder_stats s;
    mkv_decoder_get_stats(d, &s);
    uint64_t per_token = (uint64_t)c.n_layers * c.n_kv_heads * 2 * c.head_dim * 2;
    ck_assert_int_eq(s.tokens, C + N);
    ck_assert_uint_eq(s.bytes_held, (uint64_t)(C + N) * per_token);
    ck_assert_uint_eq(s.bytes_read, (uint64_t)(C + N) * per_token);
    mkv_forward_free(f);
    mkv_decoder_free(d);
    free(tok);
    mkv_model_free(m);
}
END_TEST

/* Greedy decoding of STEPS tokens after ids [n] through the decoder with
 * the full cache gives, at every step, the logits of the plain forward
 * pass bit for bit; all [n + steps] receives the prompt and the tokens. */
static void greedy_equals_forward(const mkv_model *model, const int32_t *ids, size_t n, int steps, int32_t *all)
{
    int V = model->cfg.vocab_size;
    float *got = malloc(2 * (size_t)V * sizeof *got), *want = got + V;
    ck_assert_ptr_nonnull(got);
    mkv_error err;
    mkv_decoder_opts o = opts_for(NULL, NULL, steps, 2);
    mkv_decoder *d;
    ck_assert_msg(mkv_decoder_prefill(model, ids, (int64_t)n, &o, got, &d, &err) == MKV_OK, "%s", err.msg);
    mkv_forward *f;
    mkv_forward_opts fo = {.threads = 2, .chunk = 32, .max_seq_len = (int)n + steps};
    ck_assert_int_eq(mkv_forward_create(model, &fo, &f, &err), MKV_OK);
    ck_assert_int_eq(mkv_forward_run(f, ids, n, want, MKV_LOGITS_LAST, &err), MKV_OK);
    memcpy(all, ids, n * sizeof *ids);
    for (int i = 0; i < steps; i++) {
        ck_assert_msg(memcmp(got, want, (size_t)V * sizeof *got) == 0, "step %d: logits differ", i);
        int32_t tok = (int32_t)mkv_argmax(got, V);
        all[n + (size_t)i] = tok;
        ck_assert_int_eq(mkv_decoder_step(d, tok, got, &err), MKV_OK);
        ck_assert_int_eq(mkv_forward_run(f, &tok, 1, want, MKV_LOGITS_LAST, &err), MKV_OK);
    }
    mkv_forward_free(f);
    mkv_decoder_free(d);
    free(got);
}

/* The same on stories260K, where it is found, ending in the published
 * sample's text. */
START_TEST(full_is_the_forward_pass_on_stories260K)
{
    const char *stories = test_model_file("stories260K.bin");
    if (!stories) {
        printf("check_decode: stories260K decoding skipped: stories260K.bin not found\n");
        return;
    }
    mkv_loaded_model lm;
    mkv_model_load_opts lo = {NULL, 1};
    mkv_error err;
    ck_assert_msg(mkv_model_load(stories, &lo, &lm, &err) == MKV_OK, "%s", err.msg);
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(mkv_tokenizer_encode(lm.tok, "Once upon a time", 16, MKV_ENCODE_BOS, &ids, &n, &err), MKV_OK);
    enum { STEPS = 40 };
    int32_t all[64];
    ck_assert_uint_le(n + STEPS, 64);
    greedy_equals_forward(lm.model, ids, n, STEPS, all);
    /* the prompt and the continuation are the published sample's start */
    char *text;
    size_t len;
    ck_assert_int_eq(mkv_tokenizer_decode(lm.tok, all, n + STEPS, &text, &len, &err), MKV_OK);
    size_t cmp = len < strlen(TEST_PUBLISHED) ? len : strlen(TEST_PUBLISHED);
    ck_assert_msg(cmp > 40 && strncmp(text, TEST_PUBLISHED, cmp) == 0, "decoded '%s'", text);
    free(text);
    free(ids);
    mkv_loaded_model_free(&lm);
}
END_TEST

/* The same on SmolLM2-135M-Instruct (GGUF) where scripts/get-models put
 * it (MKV_SMOLLM2, else the cache directory): every step's logits those
 * of the forward pass, bit for bit. */
START_TEST(full_is_the_forward_pass_on_SmolLM2)
{
    const char *path = test_smollm2_path();
    if (!path) {
        printf("check_decode: SmolLM2 decoding skipped: not found (scripts/get-models)\n");
        return;
    }
    mkv_loaded_model lm;
    mkv_model_load_opts lo = {NULL, 1};
    mkv_error err;
    ck_assert_msg(mkv_model_load(path, &lo, &lm, &err) == MKV_OK, "%s", err.msg);
    int32_t *ids;
    size_t n;
    const char *prompt = "It is a truth universally acknowledged that";
    ck_assert_int_eq(mkv_tokenizer_encode(lm.tok, prompt, strlen(prompt), 0, &ids, &n, &err), MKV_OK);
    enum { STEPS = 24 };
    int32_t all[128];
    ck_assert_uint_le(n + STEPS, 128);
    greedy_equals_forward(lm.model, ids, n, STEPS, all);
    free(ids);
    mkv_loaded_model_free(&lm);
}
END_TEST

/* Settings at which each method keeps and attends everything, decoded
 * tokens included: StreamingLLM's window has the size compression kept
 * and evicts as tokens come, so it keeps everything only while every
 * token is one of its sinks (sink >= C + N); CaM's has no such setting.
 * Lossless settings are held
 * to float16 rounding (LOSSLESS_TOL, below); a method that always
 * quantizes has its finest setting with a bound of its own. */
#define LOSSLESS_TOL 0x1p-9
static const struct {
    const char *method, *params;
    double tol;          /* on max |logit difference| / max |logit| */
} LOSSLESS[] = {
    {"full", "", LOSSLESS_TOL},
    {"quest", "budget=1", LOSSLESS_TOL},
    {"mosaic", "strategy=fixed keep=1 energy=1 budget=1", LOSSLESS_TOL},
    {"uniform2d", "keep=1 budget=1", LOSSLESS_TOL},
    {"think", "keep=1", LOSSLESS_TOL},
    {"kivi", "bits=4 residual=150", LOSSLESS_TOL},
    {"snapkv", "keep=1", LOSSLESS_TOL},
    {"streaming", "keep=1 sink=170", LOSSLESS_TOL},
    {"naive2d", "keep=1 budget=1", LOSSLESS_TOL},
    /* CaM's cache keeps the prompt's count: every decoded token evicts
     * the window's oldest (its value merged or not), so N of the C + N
     * tokens leave; this random model's logits move by 0.41 of the
     * largest */
    {"cam", "keep=1 start=0.5", 0.6},
    /* 4-bit codes of every key and value, decoded tokens included: a
     * relative error of about 0.09 per vector at head_dim 16, which this
     * random model's logits amplify (0.43 of the largest measured; KIVI
     * at 4 bits without its float16 window gives 0.27, TurboQuant at 2
     * bits 1.2) */
    {"turboquant", "key_bits=4 value_bits=4", 0.6},
};

static double max_abs_diff(const float *a, const float *b, int n)
{
    double m = 0;
    for (int i = 0; i < n; i++)
        if (fabs((double)a[i] - b[i]) > m)
            m = fabs((double)a[i] - b[i]);
    return m;
}

/* Every method of the registry decodes, and at lossless settings its
 * logits stay within float16 rounding of the full cache's at every step:
 * K and V rounded to float16 (relative error 2^-11 each) move the logits
 * by a few units of that relative to their size; 2^-9 of the largest
 * logit bounds it (LOSSLESS_TOL). A quantizing method's finest setting is
 * held to its own bound, which the table states. */
START_TEST(lossless_methods_equal_full)
{
    mkv_model_config c;
    test_decode_config(&c);
    mkv_model *m = random_model(&c, 11);
    int32_t *tok = test_tokens(C + N, c.vocab_size, 7);
    mkv_error err;
    for (int i = 0; mkv_methods[i]; i++) {
        int listed = 0;
        for (size_t j = 0; j < sizeof LOSSLESS / sizeof *LOSSLESS; j++)
            listed |= strcmp(LOSSLESS[j].method, mkv_methods[i]->name) == 0;
        ck_assert_msg(listed, "method '%s' has no lossless setting in tests/check_decode.c", mkv_methods[i]->name);
    }
    for (size_t j = 0; j < sizeof LOSSLESS / sizeof *LOSSLESS; j++) {
        mkv_params p;
        const mkv_method *meth = method_with(LOSSLESS[j].method, LOSSLESS[j].params, &p);
        mkv_decoder_opts fo = opts_for(NULL, NULL, N, 1), mo = opts_for(meth, &p, N, 2);
        mkv_decoder *full, *dec = NULL;
        ck_assert_msg(mkv_decoder_prefill(m, tok, C, &fo, NULL, &full, &err) == MKV_OK, "%s", err.msg);
        if (strcmp(meth->name, "full") == 0) {
            ck_assert_int_eq(mkv_decoder_fork(full, &mo, &dec, &err), MKV_EUSAGE);
            mkv_decoder_free(full);
            continue;
        }
        ck_assert_msg(mkv_decoder_fork(full, &mo, &dec, &err) == MKV_OK, "%s: %s", meth->name, err.msg);
        double worst = 0;
        for (int i = 0; i < N; i++) {
            float a[64], b[64];
            ck_assert_msg(mkv_decoder_step(dec, tok[C + i], a, &err) == MKV_OK, "%s: %s", meth->name, err.msg);
            ck_assert_int_eq(mkv_decoder_step(full, tok[C + i], b, &err), MKV_OK);
            double scale = 0;
            for (int v = 0; v < c.vocab_size; v++)
                scale = fabs(b[v]) > scale ? fabs(b[v]) : scale;
            double e = max_abs_diff(a, b, c.vocab_size) / scale;
            if (e > worst)
                worst = e;
        }
        ck_assert_msg(worst <= LOSSLESS[j].tol,
                      "%s (%s): logits differ from the full cache's by %.3g of their largest, more than %.3g",
                      meth->name, LOSSLESS[j].params, worst, LOSSLESS[j].tol);
        if (getenv("MKV_TEST_VERBOSE"))
            fprintf(stderr, "%-10s %-42s max |logit diff| / max |logit| %.3g\n", meth->name, LOSSLESS[j].params,
                    worst);
        mkv_decoder_free(dec);
        mkv_decoder_free(full);
    }
    free(tok);
    mkv_model_free(m);
}
END_TEST

/* A method's own prefill runs layer by layer, compressing each layer as it
 * is done: the same logits, bit for bit, at the prefill and at every
 * decode step, and the same bytes held, as the decoder forked from a full
 * prefill (which compresses the whole cache at once).  Per-head budgets
 * plan over every layer first: that method takes the whole cache. */
static const struct {
    const char *method, *params;
} BY_LAYER[] = {
    {"quest", "budget=0.3"},
    {"snapkv", "keep=0.3"},
    {"mosaic", ""},
    {"mosaic", "headbudget=on budget=0.2"},
    {"kivi", "bits=2 residual=32"},
    {"streaming", "keep=0.3"},
};

START_TEST(prefill_by_layer_equals_fork)
{
    mkv_model_config c;
    test_decode_config(&c);
    mkv_model *m = random_model(&c, 13);
    int32_t *tok = test_tokens(C + N, c.vocab_size, 9);
    mkv_error err;
    for (size_t j = 0; j < sizeof BY_LAYER / sizeof *BY_LAYER; j++) {
        mkv_params p;
        const mkv_method *meth = method_with(BY_LAYER[j].method, BY_LAYER[j].params, &p);
        mkv_decoder_opts fo = opts_for(NULL, NULL, N, 2), mo = opts_for(meth, &p, N, 2);
        mkv_decoder *full, *forked, *own;
        float lf[64], lo[64];
        ck_assert_msg(mkv_decoder_prefill(m, tok, C, &fo, lf, &full, &err) == MKV_OK, "%s", err.msg);
        ck_assert_msg(mkv_decoder_fork(full, &mo, &forked, &err) == MKV_OK, "%s: %s", meth->name, err.msg);
        mkv_decoder_free(full);
        ck_assert_msg(mkv_decoder_prefill(m, tok, C, &mo, lo, &own, &err) == MKV_OK, "%s: %s", meth->name, err.msg);
        ck_assert_msg(memcmp(lf, lo, sizeof(float) * (size_t)c.vocab_size) == 0, "%s (%s): prefill logits differ",
                      meth->name, BY_LAYER[j].params);
        for (int i = 0; i < N; i++) {
            ck_assert_int_eq(mkv_decoder_step(forked, tok[C + i], lf, &err), MKV_OK);
            ck_assert_msg(mkv_decoder_step(own, tok[C + i], lo, &err) == MKV_OK, "%s: %s", meth->name, err.msg);
            ck_assert_msg(memcmp(lf, lo, sizeof(float) * (size_t)c.vocab_size) == 0,
                          "%s (%s): logits of step %d differ", meth->name, BY_LAYER[j].params, i);
            mkv_decoder_stats sf, so;
            mkv_decoder_get_stats(forked, &sf);
            mkv_decoder_get_stats(own, &so);
            ck_assert_uint_eq(so.bytes_held, sf.bytes_held);
            ck_assert_uint_eq(so.bytes_read, sf.bytes_read);
            ck_assert_int_eq(so.prefix_tokens, C);
        }
        mkv_decoder_free(forked);
        mkv_decoder_free(own);
    }
    free(tok);
    mkv_model_free(m);
}
END_TEST

/* Bytes held, counted by hand for Quest: float16 K and V of every prefix
 * token, page minima and maxima, then 16-bit K and V of each decoded
 * token; bytes read in the last step: the page metadata, K and V of the
 * attended prefix tokens and of the tail. */
START_TEST(bytes_counted_by_hand)
{
    mkv_model_config c;
    test_decode_config(&c);
    mkv_model *m = random_model(&c, 13);
    int32_t *tok = test_tokens(C + 4, c.vocab_size, 9);
    const mkv_method *quest = mkv_method_find("quest");
    mkv_params p;
    mkv_params_init(&p, quest->params);
    mkv_error err;
    ck_assert_int_ge(mkv_params_parse_list(&p, "page=16 budget=1", &err), 0);
    mkv_decoder_opts o = opts_for(quest, &p, 4, 1);
    mkv_decoder *d;
    ck_assert_msg(mkv_decoder_prefill(m, tok, C, &o, NULL, &d, &err) == MKV_OK, "%s", err.msg);
    float logits[64];
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(mkv_decoder_step(d, tok[C + i], logits, &err), MKV_OK);
    mkv_decoder_stats s;
    mkv_decoder_get_stats(d, &s);
    uint64_t heads = (uint64_t)c.n_layers * c.n_kv_heads, hd = (uint64_t)c.head_dim;
    uint64_t pages = (C + 15) / 16;
    ck_assert_int_eq(s.prefix_tokens, C);
    ck_assert_int_eq(s.tail_tokens, 3);
    ck_assert_uint_eq(s.bytes_held, heads * (C * hd * 2 * 2 + pages * hd * 2 * 2 + 3 * hd * 2 * 2));
    ck_assert_uint_eq(s.logical_bytes, heads * (C + 3) * hd * 2 * 2);
    ck_assert_uint_eq(s.bytes_read, heads * (pages * 2 * hd * 2 + C * 2 * hd * 2 + 3 * 2 * hd * 2));
    mkv_decoder_free(d);
    free(tok);
    mkv_model_free(m);
}
END_TEST

/* ---------------------------------------------------------- append rules */

/* Each method's decode-time rule (its append) against an independent
 * reference, on one (layer, KV head) of synthetic data: AT = 100 prompt
 * tokens compressed, then AN = 40 appended one by one; after each append
 * a query at the new position (as a decode step asks) and one at an
 * earlier position are answered.  Keys and values are float16 values, so
 * storing them rounds nothing and a state grown by append and a state
 * compressed in one go hold the very same numbers.  Half the key (and
 * value) channels are 4x the others, so that channel masks chosen on 100
 * or on 140 tokens agree (their energies differ 16-fold, the sampling
 * spread of 100 tokens is about 15%). */
enum { AT = 100, AN = 40, AD = 16, AG = 2, AW = 8 };

typedef struct {
    float k[(AT + AN) * AD], v[(AT + AN) * AD];   /* float16 values */
    float q_obs[AG * AW * AD];                     /* [G][W][d] observation queries */
    int32_t qpos[AW];                              /* AT-AW..AT-1 */
    float q[(AT + AN) * AG * AD];                  /* [t][G][d] a query for each position */
} append_data;

static double append_gauss(uint64_t *s)
{
    double u = test_uniform(s), v = test_uniform(s);
    return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

static float f16_of(double x)
{
    return mkv_f16_to_f32(mkv_f32_to_f16((float)x));
}

static void append_data_make(append_data *x, uint64_t seed)
{
    for (int t = 0; t < AT + AN; t++)
        for (int j = 0; j < AD; j++) {
            double ks = (j * 5 + 3) % AD < AD / 2 ? 1.0 : 0.25, vs = (j * 3 + 1) % AD < AD / 2 ? 1.0 : 0.25;
            x->k[t * AD + j] = f16_of(append_gauss(&seed) * ks);
            x->v[t * AD + j] = f16_of(append_gauss(&seed) * vs);
        }
    for (int i = 0; i < AG * AW * AD; i++)
        x->q_obs[i] = (float)append_gauss(&seed);
    for (int w = 0; w < AW; w++)
        x->qpos[w] = AT - AW + w;
    for (int i = 0; i < (AT + AN) * AG * AD; i++)
        x->q[i] = (float)(append_gauss(&seed) * 1.5);
}

typedef struct {
    const mkv_method *m;
    mkv_params p;
    void *state;
    uint64_t head_bytes;   /* what compress stored, as the compressed dump counts it */
} append_state;

/* Compress the first T tokens of x in one go into a compressed dump in
 * memory and load the state back. */
static void append_compress(const char *method, const char *params, const append_data *x, int64_t T,
                            append_state *s)
{
    mkv_error err = {0};
    s->m = mkv_method_find(method);
    ck_assert_ptr_nonnull(s->m);
    mkv_params_init(&s->p, s->m->params);
    ck_assert_msg(mkv_params_parse_list(&s->p, params, &err) >= 0, "%s", err.msg);
    mkv_cdump_meta meta;
    memset(&meta, 0, sizeof meta);
    snprintf(meta.method, sizeof meta.method, "%s", method);
    mkv_params_format(&s->p, meta.params, sizeof meta.params);
    snprintf(meta.source, sizeof meta.source, "check_decode");
    mkv_dump_meta_init(&meta.raw);
    snprintf(meta.raw.model, sizeof meta.raw.model, "test");
    snprintf(meta.raw.source, sizeof meta.raw.source, "synthetic");
    meta.raw.n_layers = 1;
    meta.raw.n_heads = AG;
    meta.raw.n_kv_heads = 1;
    meta.raw.head_dim = AD;
    meta.raw.n_tokens = T;
    meta.raw.n_queries = AW;
    ck_assert_msg(s->m->check(&s->p, &meta.raw, &err) == MKV_OK, "%s check: %s", method, err.msg);
    mkv_cdump_writer *w;
    ck_assert_msg(mkv_cdump_create_memory(&meta, x->qpos, &w, &err) == MKV_OK, "%s", err.msg);
    mkv_head_kv in = {0, 0, T, AD, AG, x->k, x->v, AW, x->q_obs, x->qpos, 1};
    int rc = s->m->compress(&s->p, &in, w, &err);
    if (rc)
        mkv_cdump_abort(w);
    ck_assert_msg(rc == MKV_OK, "%s compress: %s", method, err.msg);
    s->head_bytes = mkv_cdump_head_bytes(w, 0, 0);
    mkv_cdump *c;
    ck_assert_msg(mkv_cdump_commit_open(w, &c, &err) == MKV_OK, "%s", err.msg);
    ck_assert_msg(s->m->load(&s->p, c, 0, 0, &s->state, &err) == MKV_OK, "%s load: %s", method, err.msg);
    mkv_cdump_close(c);   /* the state holds what it needs, as a decoder's does */
}

static void append_release(append_state *s)
{
    s->m->free_state(s->state);
}

static void append_token(append_state *s, const append_data *x, int64_t t)
{
    mkv_error err = {0};
    ck_assert_msg(s->m->append(s->state, x->k + t * AD, x->v + t * AD, &err) == MKV_OK, "%s append: %s",
                  s->m->name, err.msg);
}

typedef struct {
    float out[AG * AD];
    uint8_t attended[AT + AN];
    uint64_t bytes_read;
} append_answer;

/* The state's answer to the query of position pos. */
static void append_attend(append_state *s, const append_data *x, int64_t pos, append_answer *a)
{
    mkv_error err = {0};
    memset(a, 0, sizeof *a);
    mkv_attend_query q = {AG, AD, x->q + pos * AG * AD, pos, 1.0 / sqrt((double)AD)};
    mkv_attend_result r = {a->out, a->attended, 0, NULL};
    ck_assert_msg(s->m->attend(s->state, &q, &r, &err) == MKV_OK, "%s attend at %lld: %s", s->m->name,
                  (long long)pos, err.msg);
    a->bytes_read = r.bytes_read;
}

/* Exact softmax attention in double over the tokens marked in set, of the
 * query of position pos: the reference for rules that keep whole tokens. */
static void append_reference(const append_data *x, int64_t pos, const uint8_t *set, double *out)
{
    for (int g = 0; g < AG; g++) {
        const float *q = x->q + (pos * AG + g) * AD;
        double m = -INFINITY, l = 0, acc[AD] = {0};
        for (int64_t t = 0; t <= pos; t++)
            if (set[t]) {
                double sc = 0;
                for (int j = 0; j < AD; j++)
                    sc += (double)q[j] * x->k[t * AD + j];
                m = fmax(m, sc / sqrt((double)AD));
            }
        for (int64_t t = 0; t <= pos; t++)
            if (set[t]) {
                double sc = 0;
                for (int j = 0; j < AD; j++)
                    sc += (double)q[j] * x->k[t * AD + j];
                double e = exp(sc / sqrt((double)AD) - m);
                l += e;
                for (int j = 0; j < AD; j++)
                    acc[j] += e * x->v[t * AD + j];
            }
        for (int j = 0; j < AD; j++)
            out[g * AD + j] = acc[j] / l;
    }
}

/* The method's answer is the reference over `set` and attends exactly it.
 * Tolerance: both accumulate in double; the method's output is rounded to
 * float32 (2^-24 relative) and its online softmax rescales in another
 * order: 1e-6 of the largest |value| bounds the difference. */
static void append_expect_set(append_state *s, const append_data *x, int64_t pos, const uint8_t *set,
                              const char *what)
{
    append_answer a;
    append_attend(s, x, pos, &a);
    int64_t n = 0;
    for (int64_t t = 0; t < AT + AN; t++) {
        int want = t <= pos && set[t];
        ck_assert_msg(a.attended[t] == want, "%s at position %lld: token %lld %s", what, (long long)pos,
                      (long long)t, want ? "not attended" : "attended");
        n += want;
    }
    ck_assert_msg(a.bytes_read == (uint64_t)n * 2 * AD * 2, "%s at %lld: bytes read %llu for %lld tokens", what,
                  (long long)pos, (unsigned long long)a.bytes_read, (long long)n);
    double want[AG * AD], vmax = 0;
    append_reference(x, pos, set, want);
    for (int i = 0; i < (AT + AN) * AD; i++)
        vmax = fmax(vmax, fabs(x->v[i]));
    for (int i = 0; i < AG * AD; i++)
        ck_assert_msg(fabs(a.out[i] - want[i]) <= 1e-6 * vmax, "%s at %lld: output %d is %.9g, reference %.9g",
                      what, (long long)pos, i, a.out[i], want[i]);
}

/* Physical bytes of a state of T tokens, counted by hand from the stored
 * arrays each method's file lists (float16 2 bytes, int16 2, int32 4). */
static uint64_t append_hand_bytes(const append_state *s, int64_t T, int64_t kept)
{
    const mkv_params *p = &s->p;
    const char *m = s->m->name;
    uint64_t d = AD;
    if (strcmp(m, "streaming") == 0)
        return (uint64_t)kept * 2 * d * 2;                     /* K, V */
    if (strcmp(m, "snapkv") == 0)
        return (uint64_t)kept * (2 * d * 2 + 4);               /* K, V, index */
    if (strcmp(m, "cam") == 0) {
        int64_t start = (int64_t)floor(mkv_params_double(p, "start") * (double)kept);
        return (uint64_t)kept * 2 * d * 2 + (uint64_t)(kept - start) * 4;   /* K, V, window scores */
    }
    if (strcmp(m, "quest") == 0 || strcmp(m, "naive2d") == 0) {
        uint64_t pages = (uint64_t)((T + mkv_params_int(p, "page") - 1) / mkv_params_int(p, "page"));
        uint64_t kk = strcmp(m, "quest") == 0 ? d : (uint64_t)ceil(mkv_params_double(p, "keep") * AD - 1e-9);
        uint64_t lists = strcmp(m, "quest") == 0 ? 0 : 2 * kk * 2;   /* k_channels, v_channels */
        uint64_t kv = strcmp(m, "quest") == 0 ? 2 * d : 2 * kk;
        return (uint64_t)T * kv * 2 + lists + pages * 2 * kk * 2;     /* K, V, page min and max */
    }
    if (strcmp(m, "think") == 0) {
        uint64_t kk = (uint64_t)ceil(mkv_params_double(p, "keep") * AD - 1e-9);
        int64_t r = mkv_params_int(p, "recent"), rec = r < T ? r : T;
        /* channel list, pruned keys, recent keys, values */
        return kk * 2 + (uint64_t)(T - rec) * kk * 2 + (uint64_t)rec * d * 2 + (uint64_t)T * d * 2;
    }
    if (strcmp(m, "turboquant") == 0) {
        int prod = strcmp(mkv_params_str(p, "prod"), "on") == 0;
        uint64_t kb = (uint64_t)(mkv_params_int(p, "key_bits") - prod), vb = (uint64_t)mkv_params_int(p, "value_bits");
        uint64_t n = (uint64_t)T * d;
        /* K and V codes and norms; with prod the key signs and residual norms */
        return (n * kb + 7) / 8 + (n * vb + 7) / 8 + (uint64_t)T * 2 * 2 + (prod ? (n + 7) / 8 + (uint64_t)T * 2 : 0);
    }
    ck_assert_str_eq(m, "kivi");
    int64_t g = mkv_params_int(p, "group"), r = mkv_params_int(p, "residual"), bits = mkv_params_int(p, "bits");
    uint64_t nq = T > r ? (uint64_t)((T - r) / g * g) : 0, gv = (uint64_t)((AD + g - 1) / g);
    /* packed K and V codes, key scale and zero per group and channel, value
     * scale and zero per token and channel group, fp16 residual K and V */
    return 2 * ((nq * d * (uint64_t)bits + 7) / 8) + nq / (uint64_t)g * d * 2 * 2 + nq * gv * 2 * 2 +
           (T - nq) * 2 * d * 2;
}

/* CaM's rule (lib/methods/cam.c) followed here on its own: the kept
 * positions in order (start' first tokens, then the window), every
 * token's value as merged so far and every token's score. */
typedef struct {
    int64_t start, window, m, n;
    int64_t merged_in_decode;   /* evictions that merged after the prompt */
    uint64_t seed;
    int64_t kept[AT + AN];
    float v[(AT + AN) * AD];
    double score[AT + AN];
} merge_ref;

/* Token t leaves: it merges into the positions recv [m] with probability
 * min(1, its score / their mean score), drawn from stream (seed, 0, 0, t). */
static void merge_ref_evict(merge_ref *r, int64_t t, const int64_t *recv)
{
    double mean = 0;
    for (int64_t i = 0; i < r->m; i++)
        mean += r->score[recv[i]];
    mean /= (double)r->m;
    double p = mean > 0 ? r->score[t] / mean : r->score[t] > 0;
    mkv_rng g;
    uint64_t keys[3] = {0, 0, (uint64_t)t};
    mkv_rng_seed_stream(&g, r->seed, keys, 3);
    if (!(mkv_rng_uniform(&g) < p))
        return;
    r->merged_in_decode += t >= AT - r->window;
    for (int64_t i = 0; i < r->m; i++)
        for (int j = 0; j < AD; j++)
            r->v[recv[i] * AD + j] = f16_of((double)r->v[recv[i] * AD + j] + (double)r->v[t * AD + j] / (double)r->m);
}

/* The compressed prompt of AT tokens: observation scores, the window slid
 * over the prompt, the window's scores as stored (float32). */
static void merge_ref_init(merge_ref *r, const append_data *x, const mkv_params *p)
{
    int64_t n = mkv_budget_tokens(mkv_params_double(p, "keep"), AT);
    r->start = (int64_t)floor(mkv_params_double(p, "start") * (double)n);
    r->window = n - r->start;
    r->m = mkv_budget_tokens(mkv_params_double(p, "merge"), r->window);
    r->seed = (uint64_t)mkv_params_int(p, "seed");
    memcpy(r->v, x->v, sizeof r->v);
    memset(r->score, 0, sizeof r->score);
    int64_t wq = mkv_params_int(p, "window") < AW ? mkv_params_int(p, "window") : AW;
    for (int64_t w = AW - wq; w < AW; w++)
        for (int g = 0; g < AG; g++) {
            const float *q = x->q_obs + (g * AW + w) * AD;
            double s[AT], mx = -INFINITY, l = 0;
            for (int64_t t = 0; t <= x->qpos[w]; t++) {
                s[t] = 0;
                for (int j = 0; j < AD; j++)
                    s[t] += (double)q[j] * x->k[t * AD + j];
                s[t] /= sqrt((double)AD);
                mx = fmax(mx, s[t]);
            }
            for (int64_t t = 0; t <= x->qpos[w]; t++)
                l += exp(s[t] - mx);
            for (int64_t t = 0; t <= x->qpos[w]; t++)
                r->score[t] += exp(s[t] - mx) / l;
        }
    int64_t recv[AT + AN];
    for (int64_t t = r->start; t < AT - r->window; t++) {
        for (int64_t i = 0; i < r->m; i++)
            recv[i] = t + 1 + i;
        merge_ref_evict(r, t, recv);
    }
    r->n = 0;
    r->merged_in_decode = 0;
    for (int64_t t = 0; t < AT; t++)
        if (t < r->start || t >= AT - r->window)
            r->kept[r->n++] = t;
    for (int64_t t = AT - r->window; t < AT; t++)
        r->score[t] = (float)r->score[t];
}

/* Token t joins the window; a full window's oldest token leaves. */
static void merge_ref_append(merge_ref *r, int64_t t)
{
    r->kept[r->n++] = t;
    if (r->n - r->start <= r->window)
        return;
    merge_ref_evict(r, r->kept[r->start], r->kept + r->start + 1);
    memmove(r->kept + r->start, r->kept + r->start + 1, sizeof *r->kept * (size_t)r->window);
    r->n--;
}

/* The state's answer at pos against attention over the reference's kept
 * tokens and merged values; both then add the query's weights to the
 * window's scores. */
static void merge_expect(append_state *s, merge_ref *r, const append_data *x, int64_t pos, const char *what)
{
    append_answer a;
    append_attend(s, x, pos, &a);
    uint8_t set[AT + AN] = {0};
    int64_t rows = 0, in_window = 0;
    for (int64_t i = 0; i < r->n && r->kept[i] <= pos; i++, rows++) {
        set[r->kept[i]] = 1;
        in_window += i >= r->start;
    }
    for (int64_t t = 0; t < AT + AN; t++)
        ck_assert_msg(a.attended[t] == set[t], "%s at %lld: token %lld %s", what, (long long)pos, (long long)t,
                      set[t] ? "not attended" : "attended");
    ck_assert_msg(a.bytes_read == (uint64_t)rows * 2 * AD * 2 + (uint64_t)in_window * 4,
                  "%s at %lld: bytes read %llu", what, (long long)pos, (unsigned long long)a.bytes_read);
    for (int g = 0; g < AG; g++) {
        const float *q = x->q + (pos * AG + g) * AD;
        double sc[AT + AN], mx = -INFINITY, l = 0, out[AD] = {0};
        for (int64_t i = 0; i < rows; i++) {
            sc[i] = 0;
            for (int j = 0; j < AD; j++)
                sc[i] += (double)q[j] * x->k[r->kept[i] * AD + j];
            sc[i] /= sqrt((double)AD);
            mx = fmax(mx, sc[i]);
        }
        for (int64_t i = 0; i < rows; i++)
            l += exp(sc[i] - mx);
        for (int64_t i = 0; i < rows; i++) {
            double w = exp(sc[i] - mx) / l;
            for (int j = 0; j < AD; j++)
                out[j] += w * r->v[r->kept[i] * AD + j];
            if (i >= r->start)
                r->score[r->kept[i]] += w;
        }
        for (int j = 0; j < AD; j++)
            ck_assert_msg(fabs(a.out[g * AD + j] - out[j]) <= 1e-5, "%s at %lld: output %d is %.9g, reference %.9g",
                          what, (long long)pos, g * AD + j, a.out[g * AD + j], out[j]);
    }
}

/* Rules checked: SAME, the state after appending equals the state
 * compress makes of the longer cache in one go (answers, attended tokens,
 * bytes read and held, to the bit: the same stored numbers, the same
 * arithmetic in the same order); WINDOW, StreamingLLM's kept set (the
 * sinks and the most recent tokens, the count fixed) against the
 * reference attention; KEPT, SnapKV's, the tokens compression kept and
 * every appended one, against the reference attention; MERGE, CaM's
 * window with merged values, against merge_ref. */
enum { SAME = 1, WINDOW = 2, KEPT = 4, MERGE = 8 };

static const struct {
    const char *method, *params;
    int rules;
} APPEND_CASES[] = {
    {"quest", "page=8 budget=0.3 sink=4 recent=16", SAME},
    {"naive2d", "keep=0.5 page=8 budget=0.3 sink=4 recent=16", SAME},
    {"think", "keep=0.5 recent=16 window=8", SAME},
    {"think", "keep=0.5 recent=0 window=8", SAME},
    {"kivi", "bits=2 group=8 residual=16", SAME},
    {"kivi", "bits=2 group=32 residual=7", SAME},
    {"kivi", "bits=4 group=5 residual=0", SAME},
    {"turboquant", "key_bits=3 value_bits=2", SAME},
    {"turboquant", "key_bits=2 value_bits=4 prod=on seed=77", SAME},
    {"turboquant", "key_bits=1 value_bits=1 prod=on", SAME},
    {"streaming", "sink=4 keep=30", SAME | WINDOW},
    {"streaming", "sink=4 keep=0.25", WINDOW},
    {"streaming", "sink=8 keep=5", WINDOW},
    {"streaming", "sink=120 keep=1", WINDOW},
    {"snapkv", "keep=0.3 window=8 kernel=3 sink=4", KEPT},
    {"cam", "keep=0.3 start=0.25 window=8", MERGE},
    {"cam", "keep=12 start=0.5 merge=3 seed=9", MERGE},
    {"cam", "keep=1 start=0", MERGE},
};

START_TEST(append_follows_each_method_rule)
{
    append_data *x = malloc(sizeof *x);
    ck_assert_ptr_nonnull(x);
    append_data_make(x, 29);
    for (size_t c = 0; c < sizeof APPEND_CASES / sizeof *APPEND_CASES; c++) {
        const char *method = APPEND_CASES[c].method, *params = APPEND_CASES[c].params;
        int rules = APPEND_CASES[c].rules;
        char what[160];
        append_state grown;
        append_compress(method, params, x, AT, &grown);
        ck_assert_msg(grown.m->append && grown.m->state_bytes, "%s has no append", method);
        ck_assert_msg(grown.m->state_bytes(grown.state) == grown.head_bytes,
                      "%s (%s): state_bytes %llu after load, compress stored %llu", method, params,
                      (unsigned long long)grown.m->state_bytes(grown.state), (unsigned long long)grown.head_bytes);
        /* what compression kept (SnapKV), the sinks and window (StreamingLLM) */
        append_answer first;
        append_attend(&grown, x, AT - 1, &first);
        int64_t n0 = 0, sinks = 0;
        for (int64_t t = 0; t < AT; t++)
            n0 += first.attended[t];
        merge_ref mr;
        if (rules & MERGE) {
            /* the query just answered added to the state's scores: to the reference's too */
            merge_ref_init(&mr, x, &grown.p);
            append_release(&grown);
            append_compress(method, params, x, AT, &grown);
        }
        int64_t keep_n = 0, window = 0;
        if (rules & WINDOW) {
            keep_n = mkv_budget_tokens(mkv_params_double(&grown.p, "keep"), AT);
            sinks = mkv_params_int(&grown.p, "sink") < keep_n ? mkv_params_int(&grown.p, "sink") : keep_n;
            window = keep_n - sinks > 0 ? keep_n - sinks : 1;
            ck_assert_int_eq(n0, keep_n);
        }
        for (int64_t T = AT + 1; T <= AT + AN; T++) {
            append_token(&grown, x, T - 1);
            int64_t ask[3] = {T - 1, T - 2, AT - 1 + (T - AT) / 2};
            uint8_t set[AT + AN];
            int64_t kept = 0;
            if (rules & WINDOW) {
                /* a prompt all sinks and shorter than `sink`: the sinks still come */
                int64_t sink_param = mkv_params_int(&grown.p, "sink");
                int64_t s_now = sinks == AT && sink_param > AT ? (sink_param < T ? sink_param : T) : sinks;
                int64_t w0 = T - window > s_now ? T - window : s_now;
                for (int64_t t = 0; t < AT + AN; t++)
                    kept += set[t] = t < s_now || (t >= w0 && t < T);
                if (keep_n > sinks)
                    ck_assert_int_eq(kept, keep_n);
            }
            if (rules & KEPT)
                for (int64_t t = 0; t < AT + AN; t++)
                    kept += set[t] = t < AT ? first.attended[t] : t < T;
            if (rules & MERGE) {
                merge_ref_append(&mr, T - 1);
                kept = mr.n;
                for (int i = 0; i < 3; i++) {
                    snprintf(what, sizeof what, "%s (%s) after %lld tokens", method, params, (long long)T);
                    merge_expect(&grown, &mr, x, ask[i], what);
                }
            }
            if (rules & (WINDOW | KEPT))
                for (int i = 0; i < 3; i++) {
                    snprintf(what, sizeof what, "%s (%s) after %lld tokens", method, params, (long long)T);
                    append_expect_set(&grown, x, ask[i], set, what);
                }
            uint64_t held = grown.m->state_bytes(grown.state);
            ck_assert_msg(held == append_hand_bytes(&grown, T, kept), "%s (%s) after %lld tokens: state_bytes %llu, by hand %llu",
                          method, params, (long long)T, (unsigned long long)held,
                          (unsigned long long)append_hand_bytes(&grown, T, kept));
            if (!(rules & SAME))
                continue;
            append_state once;
            append_compress(method, params, x, T, &once);
            ck_assert_msg(held == once.head_bytes, "%s (%s) after %lld tokens: state_bytes %llu, compress stored %llu",
                          method, params, (long long)T, (unsigned long long)held,
                          (unsigned long long)once.head_bytes);
            for (int i = 0; i < 3; i++) {
                append_answer a, b;
                append_attend(&grown, x, ask[i], &a);
                append_attend(&once, x, ask[i], &b);
                ck_assert_msg(memcmp(a.attended, b.attended, sizeof a.attended) == 0,
                              "%s (%s) after %lld tokens, query at %lld: other tokens attended than compress's",
                              method, params, (long long)T, (long long)ask[i]);
                ck_assert_msg(a.bytes_read == b.bytes_read, "%s (%s) after %lld tokens: bytes read %llu, compress's %llu",
                              method, params, (long long)T, (unsigned long long)a.bytes_read,
                              (unsigned long long)b.bytes_read);
                ck_assert_msg(memcmp(a.out, b.out, sizeof a.out) == 0,
                              "%s (%s) after %lld tokens, query at %lld: output differs from compress's by %.3g",
                              method, params, (long long)T, (long long)ask[i], max_abs_diff(a.out, b.out, AG * AD));
            }
            append_release(&once);
        }
        if (rules & MERGE)
            ck_assert_msg(mr.merged_in_decode > 0, "%s (%s): no token merged while decoding", method, params);
        append_release(&grown);
    }
    free(x);
}
END_TEST

/* ---------------------------------------------------------- vs model_ref.py */

/* model_ref.py's teacher-forced decode: returns the mean NLL and, with
 * logprobs [score] not NULL, each scored token's log-probability. */
static double reference_nll(const char *ckpt, const int32_t *tok, int n, int context, int score,
                            const char *quest, double *logprobs)
{
    char ids[8192];
    size_t len = 0;
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(ids + len, sizeof ids - len, "%s%d", i ? "," : "", tok[i]);
    ck_assert_uint_lt(len, sizeof ids);
    char cmd[12288];
    snprintf(cmd, sizeof cmd, "'%s' '%s' decode '%s' --tokens %s --context %d --score %d %s%s%s", test_python(),
             test_ref_script(), ckpt, ids, context, score, quest ? "--quest " : "", quest ? quest : "",
             logprobs ? " --per-token" : "");
    FILE *fp = popen(cmd, "r");
    ck_assert_ptr_nonnull(fp);
    double nll = NAN;
    ck_assert_msg(fscanf(fp, "%lf", &nll) == 1, "model_ref.py decode printed no number");
    for (int i = 0; logprobs && i < score; i++)
        ck_assert_msg(fscanf(fp, "%lf", &logprobs[i]) == 1, "model_ref.py decode printed %d of %d log-probabilities",
                      i, score);
    ck_assert_int_eq(pclose(fp), 0);
    return nll;
}

/* Perplexity of the full cache and of Quest against model_ref.py; for
 * Quest also every scored token (its log-probability with Quest and with
 * the full cache) and the standard error of the NLL difference, computed
 * here in double from the reference's per-token values. */
static void ppl_vs_reference(const mkv_model *m, const char *ckpt, const int32_t *tok, int n, int context,
                             int score, const char *what)
{
    const mkv_method *quest = mkv_method_find("quest");
    mkv_params p;
    mkv_params_init(&p, quest->params);
    mkv_error err;
    ck_assert_int_ge(mkv_params_parse_list(&p, "page=8 budget=0.5 sink=4 recent=16", &err), 0);
    double *want_full = calloc((size_t)score, sizeof *want_full), *want_quest = calloc((size_t)score, sizeof *want_quest);
    mkv_ppl_token *got = calloc((size_t)score, sizeof *got);
    ck_assert(want_full && want_quest && got);
    for (int use_quest = 0; use_quest < 2; use_quest++) {
        mkv_decoder_opts o = opts_for(use_quest ? quest : NULL, use_quest ? &p : NULL, 0, 2);
        mkv_ppl_result r;
        ck_assert_msg(mkv_decode_ppl(m, tok, (size_t)n, context, score, &o, 1, &r, got, &err) == MKV_OK, "%s",
                      err.msg);
        double *want = use_quest ? want_quest : want_full;
        double want_nll = reference_nll(ckpt, tok, n, context, score, use_quest ? "8,0.5,4,16" : NULL, want);
        /* perplexity exp(nll): its relative error is the error of nll */
        ck_assert_msg(fabs(r.nll - want_nll) <= 1e-4, "%s, %s: perplexity %.9g, model_ref.py %.9g", what,
                      use_quest ? "quest" : "full", exp(r.nll), exp(want_nll));
        double kl = 0;
        int agree = 0;
        for (int i = 0; i < score; i++) {
            ck_assert_int_eq(got[i].position, context + i + 1);
            ck_assert_int_eq(got[i].target, tok[context + i + 1]);
            /* Quest holds K and V in float16, rounded from float32 here and from
             * double in the reference: an element on a rounding boundary moves by
             * one ulp, which moves single tokens by up to ~6e-4 (the full cache:
             * 2e-6). */
            double tol = use_quest ? 2e-3 : 2e-5;
            ck_assert_msg(fabs(got[i].logprob - want[i]) <= tol, "%s, %s, token %d: log-probability %.9g, "
                          "model_ref.py %.9g", what, use_quest ? "quest" : "full", i, got[i].logprob, want[i]);
            ck_assert_msg(fabs(got[i].logprob_full - want_full[i]) <= 2e-5, "%s, token %d: full %.9g, ref %.9g",
                          what, i, got[i].logprob_full, want_full[i]);
            ck_assert(got[i].kl >= 0);
            kl += got[i].kl;
            agree += got[i].top1 == got[i].top1_full;
        }
        ck_assert_double_eq_tol(kl / score, r.kl, 1e-12);
        ck_assert_double_eq_tol((double)agree / score, r.agreement, 1e-12);
        if (!use_quest) {
            ck_assert(r.nll == r.nll_full);
            ck_assert(r.kl == 0 && r.agreement == 1 && r.nll_diff_se == 0);
            continue;
        }
        ck_assert_msg(r.kl >= 0 && r.agreement >= 0 && r.agreement <= 1, "kl %g agreement %g", r.kl, r.agreement);
        double mean = 0, ss = 0;
        for (int i = 0; i < score; i++)
            mean += (want_full[i] - want_quest[i]) / score;
        for (int i = 0; i < score; i++)
            ss += (want_full[i] - want_quest[i] - mean) * (want_full[i] - want_quest[i] - mean);
        double se = sqrt(ss / (score - 1) / score);
        ck_assert_msg(se > 1e-3, "%s: Quest changes too little for the test (standard error %g)", what, se);
        ck_assert_msg(fabs(r.nll_diff_se - se) <= 1e-4, "%s: standard error %.9g, from model_ref.py %.9g", what,
                      r.nll_diff_se, se);
    }
    free(got);
    free(want_full);
    free(want_quest);
}

START_TEST(ppl_matches_model_ref)
{
    if (!test_python() || !test_ref_script()) {
        printf("check_decode: perplexity vs model_ref.py skipped: python3 with numpy not found\n");
        return;
    }
    mkv_model_config c;
    test_decode_config(&c);
    mkv_model *orig = random_model(&c, 17);
    char ckpt[256];
    test_path(ckpt, sizeof ckpt, "decode-model.bin");
    write_llama2c(ckpt, orig);
    mkv_model *m;
    mkv_error err;
    ck_assert_msg(mkv_llama2c_load(ckpt, &m, &err) == MKV_OK, "%s", err.msg);
    int32_t *tok = test_tokens(100 + 12 + 1, c.vocab_size, 21);
    ppl_vs_reference(m, ckpt, tok, 113, 100, 12, "random model");
    free(tok);
    mkv_model_free(m);
    mkv_model_free(orig);

    const char *stories = test_model_file("stories260K.bin");
    if (!stories) {
        printf("check_decode: stories260K perplexity skipped: stories260K.bin not found\n");
        return;
    }
    mkv_loaded_model lm;
    mkv_model_load_opts lo = {NULL, 1};
    ck_assert_msg(mkv_model_load(stories, &lo, &lm, &err) == MKV_OK, "%s", err.msg);
    static const char text[] = "Once upon a time, there was a little girl named Lily. She loved to play outside "
                               "in the park. One day, she saw a big, red ball. She wanted to play with it, but "
                               "it was too high. Lily asked her mom to help her.";
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(mkv_tokenizer_encode(lm.tok, text, strlen(text), MKV_ENCODE_BOS, &ids, &n, &err), MKV_OK);
    ck_assert_uint_ge(n, 50);
    ppl_vs_reference(lm.model, stories, ids, (int)n, (int)n - 17, 16, "stories260K");
    free(ids);
    mkv_loaded_model_free(&lm);
}
END_TEST

/* Two windows pooled: each window's tokens are those of a run over that
 * window alone, and the pooled means and standard error are recomputed
 * here from the per-token values. */
START_TEST(ppl_windows_pooled)
{
    mkv_model_config c;
    test_decode_config(&c);
    mkv_model *m = random_model(&c, 23);
    const int context = 40, score = 9, span = context + score + 1;
    int32_t *tok = test_tokens(2 * span + 3, c.vocab_size, 5);
    const mkv_method *quest = mkv_method_find("quest");
    mkv_params p;
    mkv_params_init(&p, quest->params);
    mkv_error err;
    ck_assert_int_ge(mkv_params_parse_list(&p, "page=4 budget=0.3 sink=2 recent=4", &err), 0);
    mkv_decoder_opts o = opts_for(quest, &p, 0, 1);
    mkv_ppl_token pooled[2 * 9], alone[2][9];
    mkv_ppl_result r, w[2];
    ck_assert_msg(mkv_decode_ppl_windows(m, tok, 2 * span + 3, context, score, 2, &o, 1, &r, pooled, &err) == MKV_OK,
                  "%s", err.msg);
    for (int k = 0; k < 2; k++)
        ck_assert_msg(mkv_decode_ppl(m, tok + k * span, span, context, score, &o, 1, &w[k], alone[k], &err) == MKV_OK,
                      "%s", err.msg);
    ck_assert_int_eq(r.scored, 2 * score);
    double mean = 0, nll = 0, nll_full = 0, kl = 0, agree = 0;
    for (int i = 0; i < 2 * score; i++) {
        const mkv_ppl_token *a = &alone[i / score][i % score], *b = &pooled[i];
        ck_assert_int_eq(b->position, a->position + (i / score) * span);
        ck_assert_int_eq(b->target, tok[b->position]);
        ck_assert(b->logprob == a->logprob && b->logprob_full == a->logprob_full && b->kl == a->kl);
        nll -= b->logprob;
        nll_full -= b->logprob_full;
        kl += b->kl;
        agree += b->top1 == b->top1_full;
        mean += (b->logprob_full - b->logprob) / (2 * score);
    }
    double ss = 0;
    for (int i = 0; i < 2 * score; i++)
        ss += (pooled[i].logprob_full - pooled[i].logprob - mean) * (pooled[i].logprob_full - pooled[i].logprob - mean);
    ck_assert_double_eq_tol(r.nll, nll / (2 * score), 1e-12);
    ck_assert_double_eq_tol(r.nll_full, nll_full / (2 * score), 1e-12);
    ck_assert_double_eq_tol(r.kl, kl / (2 * score), 1e-12);
    ck_assert_double_eq_tol(r.agreement, agree / (2 * score), 1e-12);
    ck_assert_msg(ss > 0, "quest changed nothing");
    ck_assert_double_eq_tol(r.nll_diff_se, sqrt(ss / (2 * score - 1) / (2 * score)), 1e-12);
    ck_assert_uint_eq(r.prefix_bytes_held, (w[0].prefix_bytes_held + w[1].prefix_bytes_held + 1) / 2);
    /* a third window does not fit */
    ck_assert_int_eq(mkv_decode_ppl_windows(m, tok, 2 * span + 3, context, score, 3, &o, 1, &r, NULL, &err),
                     MKV_EFORMAT);
    ck_assert_str_eq(err.msg, "the text has 103 tokens; 3 windows of context 40 and 9 scored need 150");
    free(tok);
    mkv_model_free(m);
}
END_TEST

START_TEST(misuse_refused)
{
    mkv_model_config c;
    test_decode_config(&c);
    mkv_model *m = random_model(&c, 19);
    int32_t *tok = test_tokens(c.max_seq_len + 1, c.vocab_size, 1);
    mkv_error err;
    mkv_decoder_opts o = opts_for(NULL, NULL, 10, 1);
    mkv_decoder *d = NULL;
    /* prefill and decode steps beyond the model's context */
    ck_assert_int_eq(mkv_decoder_prefill(m, tok, c.max_seq_len - 5, &o, NULL, &d, &err), MKV_EFORMAT);
    ck_assert_ptr_null(d);
    ck_assert_msg(strstr(err.msg, "context"), "%s", err.msg);
    /* a text too short for the context and the scored tokens */
    mkv_ppl_result r;
    ck_assert_int_eq(mkv_decode_ppl(m, tok, 40, 30, 10, &o, 1, &r, NULL, &err), MKV_EFORMAT);
    ck_assert_msg(strstr(err.msg, "the text has 40 tokens"), "%s", err.msg);
    /* forking after a step; a step past the decode steps asked for */
    ck_assert_int_eq(mkv_decoder_prefill(m, tok, 20, &o, NULL, &d, &err), MKV_OK);
    float logits[64];
    ck_assert_int_eq(mkv_decoder_step(d, tok[20], logits, &err), MKV_OK);
    const mkv_method *quest = mkv_method_find("quest");
    mkv_params p;
    mkv_params_init(&p, quest->params);
    mkv_decoder_opts qo = opts_for(quest, &p, 2, 1);
    mkv_decoder *q = NULL;
    ck_assert_int_eq(mkv_decoder_fork(d, &qo, &q, &err), MKV_EUSAGE);
    mkv_decoder_free(d);
    ck_assert_int_eq(mkv_decoder_prefill(m, tok, 20, &qo, NULL, &q, &err), MKV_OK);
    ck_assert_int_eq(mkv_decoder_step(q, tok[20], logits, &err), MKV_OK);
    ck_assert_int_eq(mkv_decoder_step(q, tok[21], logits, &err), MKV_OK);
    ck_assert_int_ne(mkv_decoder_step(q, tok[22], logits, &err), MKV_OK);
    mkv_decoder_free(q);
    /* a method's own refusal names it */
    ck_assert_int_ge(mkv_params_parse_list(&p, "budget=500", &err), 0);
    ck_assert_int_eq(mkv_decoder_prefill(m, tok, 20, &qo, NULL, &q, &err), MKV_EUSAGE);
    ck_assert_msg(strstr(err.msg, "method 'quest'"), "%s", err.msg);
    /* filled caches: the full cache only (on the CPU), within the context, never forked */
    mkv_params_init(&p, quest->params);
    qo.fill = 30;
    ck_assert_int_eq(mkv_decoder_prefill(m, tok, 20, &qo, NULL, &q, &err), MKV_EUNSUP);
    ck_assert_msg(strstr(err.msg, "only the full cache (and Quest's and mosaic's on the GPU) is filled"), "%s", err.msg);
    mkv_decoder_opts fo = opts_for(NULL, NULL, 10, 1);
    fo.fill = c.max_seq_len - 29;
    ck_assert_int_eq(mkv_decoder_prefill(m, tok, 20, &fo, NULL, &d, &err), MKV_EFORMAT);
    ck_assert_ptr_null(d);
    fo.fill = 100;
    ck_assert_int_eq(mkv_decoder_prefill(m, tok, 20, &fo, logits, &d, &err), MKV_OK);
    mkv_decoder_stats st;
    mkv_decoder_get_stats(d, &st);
    ck_assert_int_eq(st.tokens, 120);
    qo.fill = 0;
    ck_assert_int_eq(mkv_decoder_fork(d, &qo, &q, &err), MKV_EUNSUP);
    ck_assert_msg(strstr(err.msg, "filled cache does not fork"), "%s", err.msg);
    ck_assert_int_eq(mkv_decoder_step(d, tok[20], logits, &err), MKV_OK);
    mkv_decoder_free(d);
    /* batches: on the GPU only, every prompt non-empty; a filled mosaic
     * batch steps its prompts together, so they have one length; 8-bit
     * block keys are mosaic's on the GPU (all refused before any GPU work) */
    const int32_t *prompts[2] = {tok, tok + 5};
    int64_t lengths[2] = {20, 0};
    mkv_decoder_opts bo = opts_for(NULL, NULL, 4, 1);
    bo.batch = 2;
    ck_assert_int_eq(mkv_decoder_prefill_batch(m, prompts, lengths, &bo, NULL, &d, &err), MKV_EFORMAT);
    ck_assert_msg(strstr(err.msg, "nothing to prefill in a request of the batch"), "%s", err.msg);
    lengths[1] = 12;
    ck_assert_int_eq(mkv_decoder_prefill_batch(m, prompts, lengths, &bo, NULL, &d, &err), MKV_EUNSUP);
    ck_assert_msg(strstr(err.msg, "a batch of requests decodes on the GPU"), "%s", err.msg);
    ck_assert_ptr_null(d);
    const mkv_method *mosaic = mkv_method_find("mosaic");
    mkv_params mp;
    mkv_params_init(&mp, mosaic->params);
    mkv_decoder_opts mo = opts_for(mosaic, &mp, 4, 1);
    mo.gpu = 1;
    mo.batch = 2;
    mo.fill = 200;
    ck_assert_int_eq(mkv_decoder_prefill_batch(m, prompts, lengths, &mo, NULL, &d, &err), MKV_EUNSUP);
    ck_assert_msg(strstr(err.msg, "requests of 20 and 12 tokens"), "%s", err.msg);
    ck_assert_ptr_null(d);
    fo = opts_for(NULL, NULL, 4, 1);
    fo.gpu_blockkey_bits = 8;
    ck_assert_int_eq(mkv_decoder_prefill(m, tok, 20, &fo, NULL, &d, &err), MKV_EUSAGE);
    ck_assert_msg(strstr(err.msg, "block keys of 8 bits are an option of mosaic on the GPU"), "%s", err.msg);
    ck_assert_ptr_null(d);
    free(tok);
    mkv_model_free(m);
}
END_TEST

/* The passkey generator: deterministic by (seed, length, depth, trial),
 * 5 to 7 digits without a leading zero, all three lengths seen. */
START_TEST(needle_passkeys)
{
    char a[8], b[8];
    int seen[8] = {0};
    for (int t = 0; t < 200; t++) {
        mkv_needle_passkey(7, 4096, 0.25, t, a);
        mkv_needle_passkey(7, 4096, 0.25, t, b);
        ck_assert_str_eq(a, b);
        size_t n = strlen(a);
        ck_assert_msg(n >= 5 && n <= 7 && a[0] != '0', "passkey '%s'", a);
        for (size_t i = 0; i < n; i++)
            ck_assert(a[i] >= '0' && a[i] <= '9');
        seen[n] = 1;
    }
    ck_assert(seen[5] && seen[6] && seen[7]);
    mkv_needle_passkey(7, 4096, 0.25, 0, a);
    mkv_needle_passkey(8, 4096, 0.25, 0, b);
    ck_assert_str_ne(a, b);
    mkv_needle_passkey(7, 4096, 0.5, 0, b);
    ck_assert_str_ne(a, b);

    ck_assert(mkv_needle_correct(" The pass key is 12345.", "12345"));
    ck_assert(mkv_needle_correct("12345", "12345"));
    ck_assert(!mkv_needle_correct("The pass key is 123456.", "12345"));
    ck_assert(!mkv_needle_correct("The pass key is 1234.", "12345"));
    ck_assert(!mkv_needle_correct("I do not know.", "12345"));
    ck_assert(!mkv_needle_correct("It is 54321, not 12345.", "12345"));
}
END_TEST

/* The needle goes to the sentence end nearest the depth, the filler is cut
 * at a sentence end and wraps around, the instruction comes first and the
 * question last. */
START_TEST(needle_text_layout)
{
    static const char filler[] = "One two. Three four five. Six! Seven eight nine ten.";
    size_t flen = strlen(filler);
    char *t;
    size_t at;
    double nd;
    mkv_error err;
    /* 30 bytes of filler: cut back to "One two. Three four five. Six!" */
    ck_assert_int_eq(mkv_needle_text(filler, flen, 33, 0.5, "4242", &t, &at, &nd, &err), MKV_OK);
    const char *needle = " The pass key is 4242. Remember it. 4242 is the pass key.";
    ck_assert_ptr_nonnull(strstr(t, needle));
    ck_assert_uint_eq((size_t)(strstr(t, needle) - t), at);
    /* the middle of 30 bytes is 15: the nearest sentence end is after "two." (8) */
    ck_assert_msg(strncmp(t + at - 8, "One two.", 8) == 0, "needle at %zu in '%s'", at, t);
    ck_assert(fabs(nd - 8.0 / 30.0) < 1e-12);
    ck_assert_msg(strstr(t, "Six!\n\nWhat is the pass key?") != NULL, "%s", t);
    free(t);
    /* depth 0: right after the instruction; depth 1: before the question */
    ck_assert_int_eq(mkv_needle_text(filler, flen, 33, 0.0, "4242", &t, &at, &nd, &err), MKV_OK);
    ck_assert(strncmp(t + at + strlen(needle), "One two.", 8) == 0);
    ck_assert(t[at - 1] == '\n');
    ck_assert(nd == 0.0);
    free(t);
    ck_assert_int_eq(mkv_needle_text(filler, flen, 33, 1.0, "4242", &t, &at, &nd, &err), MKV_OK);
    ck_assert(strncmp(t + at + strlen(needle), "\n\nWhat is", 9) == 0);
    ck_assert(nd == 1.0);
    free(t);
    /* more filler than the text has: it wraps */
    ck_assert_int_eq(mkv_needle_text(filler, flen, 2 * flen + 10, 0.5, "4242", &t, &at, &nd, &err), MKV_OK);
    ck_assert_ptr_nonnull(strstr(t, "ten.One two."));
    free(t);
    ck_assert_int_eq(mkv_needle_text(filler, 0, 10, 0.5, "4242", &t, &at, &nd, &err), MKV_EFORMAT);
}
END_TEST

int main(void)
{
    mkv_log_init("check_decode");
    Suite *s = suite_create("decode");
    TCase *tc = tcase_create("decode");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, full_is_the_forward_pass);
    tcase_add_test(tc, full_is_the_forward_pass_on_stories260K);
    tcase_add_test(tc, full_is_the_forward_pass_on_SmolLM2);
    tcase_add_test(tc, lossless_methods_equal_full);
    tcase_add_test(tc, prefill_by_layer_equals_fork);
    tcase_add_test(tc, bytes_counted_by_hand);
    tcase_add_test(tc, append_follows_each_method_rule);
    tcase_add_test(tc, ppl_matches_model_ref);
    tcase_add_test(tc, ppl_windows_pooled);
    tcase_add_test(tc, misuse_refused);
    tcase_add_test(tc, needle_passkeys);
    tcase_add_test(tc, needle_text_layout);
    suite_add_tcase(s, tc);
    return test_run(s);
}
