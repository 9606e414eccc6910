/* Decoding with a compressed cache (lib/decode): the full cache is the
 * plain forward pass bit for bit; every method at lossless settings equals
 * it within float16 rounding; perplexity matches tests/model_ref.py's
 * independent float64 decode for the full cache and for Quest; bytes held
 * are counted by hand; misuse is refused.  The models are written by the
 * test (random weights), stories260K is used too where it is found. */
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decode/ccache.h"
#include "core/log.h"
#include "decode/decoder.h"
#include "decode/needle.h"
#include "methods/method.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/model_load.h"
#include "model_testutil.h"
#include "testutil.h"

/* GQA group 2, head_dim 16, a context long enough for several pages. */
static void decode_config(mkv_model_config *c)
{
    mkv_model_config_defaults(c);
    snprintf(c->name, sizeof c->name, "decode-test");
    c->dim = 64;
    c->hidden_dim = 96;
    c->n_layers = 2;
    c->n_heads = 4;
    c->n_kv_heads = 2;
    c->head_dim = 16;
    c->rope_dim = 16;
    c->vocab_size = 64;
    c->max_seq_len = 256;
    c->tied_classifier = 0;
}

static int32_t *test_tokens(int n, int vocab, uint64_t seed)
{
    int32_t *t = malloc((size_t)n * sizeof *t);
    ck_assert_ptr_nonnull(t);
    for (int i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = (int32_t)((seed >> 33) % (uint64_t)vocab);
    }
    return t;
}

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

/* The full cache is the model's own forward pass: the same logits, bit
 * for bit, as a forward pass run by hand with the same chunking. */
START_TEST(full_is_the_forward_pass)
{
    mkv_model_config c;
    decode_config(&c);
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

/* Settings at which each method keeps and attends everything. */
static const struct {
    const char *method, *params;
} LOSSLESS[] = {
    {"full", ""},
    {"quest", "budget=1"},
    {"mosaic", "strategy=fixed keep=1 energy=1 budget=1"},
    {"uniform2d", "keep=1 budget=1"},
    {"think", "keep=1"},
    {"kivi", "bits=4 residual=150"},
    {"snapkv", "keep=1"},
    {"streaming", "keep=1"},
    {"naive2d", "keep=1 budget=1"},
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
 * logit bounds it. */
START_TEST(lossless_methods_equal_full)
{
    mkv_model_config c;
    decode_config(&c);
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
        const mkv_method *meth = mkv_method_find(LOSSLESS[j].method);
        ck_assert_ptr_nonnull(meth);
        mkv_params p;
        mkv_params_init(&p, meth->params);
        if (LOSSLESS[j].params[0])
            ck_assert_int_ge(mkv_params_parse_list(&p, LOSSLESS[j].params, &err), 0);
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
        ck_assert_msg(worst <= 0x1p-9, "%s (%s): logits differ from the full cache's by %.3g of their largest",
                      meth->name,
                      LOSSLESS[j].params, worst);
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

/* Bytes held, counted by hand for Quest: float16 K and V of every prefix
 * token, page minima and maxima, then 16-bit K and V of each decoded
 * token; bytes read in the last step: the page metadata, K and V of the
 * attended prefix tokens and of the tail. */
START_TEST(bytes_counted_by_hand)
{
    mkv_model_config c;
    decode_config(&c);
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

/* ---------------------------------------------------------- vs model_ref.py */

static double reference_nll(const char *ckpt, const int32_t *tok, int n, int context, int score,
                            const char *quest)
{
    char ids[8192];
    size_t len = 0;
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(ids + len, sizeof ids - len, "%s%d", i ? "," : "", tok[i]);
    ck_assert_uint_lt(len, sizeof ids);
    char cmd[12288];
    snprintf(cmd, sizeof cmd, "'%s' '%s' decode '%s' --tokens %s --context %d --score %d %s%s", test_python(),
             test_ref_script(), ckpt, ids, context, score, quest ? "--quest " : "", quest ? quest : "");
    FILE *fp = popen(cmd, "r");
    ck_assert_ptr_nonnull(fp);
    double nll = NAN;
    ck_assert_msg(fscanf(fp, "%lf", &nll) == 1, "model_ref.py decode printed no number");
    ck_assert_int_eq(pclose(fp), 0);
    return nll;
}

static void ppl_vs_reference(const mkv_model *m, const char *ckpt, const int32_t *tok, int n, int context,
                             int score, const char *what)
{
    const mkv_method *quest = mkv_method_find("quest");
    mkv_params p;
    mkv_params_init(&p, quest->params);
    mkv_error err;
    ck_assert_int_ge(mkv_params_parse_list(&p, "page=8 budget=0.5 sink=4 recent=16", &err), 0);
    for (int use_quest = 0; use_quest < 2; use_quest++) {
        mkv_decoder_opts o = opts_for(use_quest ? quest : NULL, use_quest ? &p : NULL, 0, 2);
        mkv_ppl_result r;
        ck_assert_msg(mkv_decode_ppl(m, tok, (size_t)n, context, score, &o, 1, &r, &err) == MKV_OK, "%s", err.msg);
        double want = reference_nll(ckpt, tok, n, context, score, use_quest ? "8,0.5,4,16" : NULL);
        /* perplexity exp(nll): its relative error is the error of nll */
        ck_assert_msg(fabs(r.nll - want) <= 1e-4, "%s, %s: perplexity %.9g, model_ref.py %.9g", what,
                      use_quest ? "quest" : "full", exp(r.nll), exp(want));
        if (!use_quest) {
            ck_assert(r.nll == r.nll_full);
            ck_assert(r.kl == 0 && r.agreement == 1);
        } else {
            ck_assert_msg(r.kl >= 0 && r.agreement >= 0 && r.agreement <= 1, "kl %g agreement %g", r.kl,
                          r.agreement);
        }
    }
}

START_TEST(ppl_matches_model_ref)
{
    if (!test_python() || !test_ref_script()) {
        printf("check_decode: perplexity vs model_ref.py skipped: python3 with numpy not found\n");
        return;
    }
    mkv_model_config c;
    decode_config(&c);
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

START_TEST(misuse_refused)
{
    mkv_model_config c;
    decode_config(&c);
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
    ck_assert_int_eq(mkv_decode_ppl(m, tok, 40, 30, 10, &o, 1, &r, &err), MKV_EFORMAT);
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
    tcase_add_test(tc, lossless_methods_equal_full);
    tcase_add_test(tc, bytes_counted_by_hand);
    tcase_add_test(tc, ppl_matches_model_ref);
    tcase_add_test(tc, misuse_refused);
    tcase_add_test(tc, needle_passkeys);
    tcase_add_test(tc, needle_text_layout);
    suite_add_tcase(s, tc);
    return test_run(s);
}
