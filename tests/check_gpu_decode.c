/* The GPU forward pass (kernels/llama_forward.cu through the decoder's
 * gpu option) against the CPU forward pass, whose own tests hold it to
 * independent float64 references: the same prompt prefilled on both, then
 * teacher-forced decode steps with the CPU's greedy tokens, comparing every
 * step's logits relative to their RMS and the argmax.  Models: stories260K
 * (head_dim 8, interleaved RoPE: the causal kernel in every step), random
 * models of the SmolLM2-135M, Llama-3.1-8B and Qwen2.5-7B shapes with few
 * layers and a small vocabulary (half-split RoPE, Llama 3.1's frequency
 * scaling, q/k/v biases, 3 to 7 query heads per KV head: the dense decode
 * kernel in the steps), a small random model whose RoPE turns only half of
 * each head, and SmolLM2-135M itself where scripts/get-models put it; the
 * perplexity of stories260K over data/heldout.txt; the refusals.  With
 * fp16 weights every decode step's products run in the matrix-vector
 * kernel: its 16-byte path on the shapes, its element path on
 * stories260K's hidden width of 172.
 *
 * Tolerances, relative to the RMS of the CPU's logits: float32 weights
 * differ from the CPU only by the fp16 K/V cache and the order of sums:
 * RMS error 5e-3, largest 2e-2; fp16 weights add their own rounding: RMS
 * 3e-2, largest 1.5e-1.  The argmax must agree at every step where the
 * CPU's top two logits are further apart than twice the largest error
 * allowed, and at every step with float32 weights on stories260K (the
 * same greedy text).  Perplexity: equal within 1e-3 relative. */
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/prompt.h"
#include "decode/decoder.h"
#include "methods/method.h"
#include "model/model.h"
#include "model/model_load.h"
#include "model/shapes.h"
#include "mosaic/mosaic.h"
#include "gpu_testutil.h"
#include "model_testutil.h"
#include "testutil.h"

#define F32_RMS 5e-3
#define F32_MAX 2e-2
#define F16_RMS 3e-2
#define F16_MAX 1.5e-1

static int cpu_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 1 ? (int)(n < 16 ? n : 16) : 1;
}

static int argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* The gap between the largest and the second largest logit. */
static double top_margin(const float *x, int n)
{
    double a = -INFINITY, b = -INFINITY;
    for (int i = 0; i < n; i++)
        if (x[i] > a) {
            b = a;
            a = x[i];
        } else if (x[i] > b) {
            b = x[i];
        }
    return a - b;
}

/* Prefill prompt[0..n) on the CPU and on the GPU, then `steps` decode
 * steps of the CPU's greedy tokens fed to both; every logits vector
 * (the prefill's and each step's) compared.  every_argmax: the argmax must
 * agree at every step, whatever the margin (the same greedy text).  fill:
 * both caches first filled with that many synthetic rows, each side
 * making them itself (mkv_forward_fill, mkv_cuda_llama_fill). */
static void compare_decode(const mkv_model *m, const int32_t *prompt, int n, int steps, int chunk, int f16,
                           int every_argmax, int fill, const mkv_method *method, const mkv_params *params,
                           const char *what)
{
    const int V = m->cfg.vocab_size;
    const double tol_rms = f16 ? F16_RMS : F32_RMS, tol_max = f16 ? F16_MAX : F32_MAX;
    mkv_decoder_opts o;
    mkv_decoder_opts_init(&o);
    o.threads = cpu_threads();
    o.max_new = steps;
    o.chunk = chunk;
    o.fill = fill;
    o.fill_seed = 5;
    o.method = method;
    o.params = params;
    const int mosaic = method && strcmp(method->name, "mosaic") == 0;
    mkv_decoder_opts og = o;
    og.gpu = 1;
    og.gpu_f16_weights = f16;
    float *ref = malloc((size_t)V * sizeof *ref), *got = malloc((size_t)V * sizeof *got);
    ck_assert_ptr_nonnull(ref);
    ck_assert_ptr_nonnull(got);
    mkv_decoder *cpu, *gpu;
    mkv_error err;
    ck_assert_msg(mkv_decoder_prefill(m, prompt, n, &o, ref, &cpu, &err) == MKV_OK, "%s", err.msg);
    for (int i = 0; i < V; i++)
        got[i] = NAN;
    ck_assert_msg(mkv_decoder_prefill(m, prompt, n, &og, got, &gpu, &err) == MKV_OK, "%s", err.msg);
    double worst_rms = 0, worst_max = 0;   /* relative, over the steps */
    int checked = 0;                       /* steps whose argmax was checked */
    for (int s = 0;; s++) {
        double ss_ref = 0, ss_diff = 0, worst = 0;
        for (int i = 0; i < V; i++) {
            ck_assert_msg(isfinite(got[i]), "%s: step %d: logit %d is %g", what, s, i, got[i]);
            const double d = (double)got[i] - ref[i];
            ss_ref += (double)ref[i] * ref[i];
            ss_diff += d * d;
            worst = fabs(d) > worst ? fabs(d) : worst;
        }
        const double rms = sqrt(ss_ref / V), rms_rel = sqrt(ss_diff / V) / rms, max_rel = worst / rms;
        worst_rms = rms_rel > worst_rms ? rms_rel : worst_rms;
        worst_max = max_rel > worst_max ? max_rel : worst_max;
        ck_assert_msg(rms_rel <= tol_rms && max_rel <= tol_max,
                      "%s (%s weights): step %d: logits differ by %.3g RMS, %.3g at most (of their RMS %.3g)",
                      what, f16 ? "fp16" : "float32", s, rms_rel, max_rel, rms);
        const int token = argmax(ref, V);
        if (every_argmax || top_margin(ref, V) > 2 * tol_max * rms) {
            checked++;
            ck_assert_msg(argmax(got, V) == token, "%s: step %d: the GPU's argmax %d is not the CPU's %d", what, s,
                          argmax(got, V), token);
        }
        if (s == steps)
            break;
        ck_assert_msg(mkv_decoder_step(cpu, token, ref, &err) == MKV_OK, "%s", err.msg);
        for (int i = 0; i < V; i++)
            got[i] = NAN;
        ck_assert_msg(mkv_decoder_step(gpu, token, got, &err) == MKV_OK, "%s", err.msg);
    }
    mkv_decoder_stats sc, sg;
    mkv_decoder_get_stats(cpu, &sc);
    mkv_decoder_get_stats(gpu, &sg);
    ck_assert_int_eq(sg.tokens, fill + n + steps);
    if (mosaic) {
        /* the GPU counts its device records (padded, room for the decode
         * included) and what its kernels read, the CPU the stored arrays
         * and what its attend reads: compared in the printed line only */
        ck_assert_msg(sg.bytes_held > 0 && sg.bytes_read > 0, "%s: %llu bytes held, %llu read", what,
                      (unsigned long long)sg.bytes_held, (unsigned long long)sg.bytes_read);
        printf("check_gpu_decode: %s: bytes held %llu on the GPU, %llu on the CPU; the last step read %llu, %llu\n",
               what, (unsigned long long)sg.bytes_held, (unsigned long long)sc.bytes_held,
               (unsigned long long)sg.bytes_read, (unsigned long long)sc.bytes_read);
        ck_assert_int_eq(sg.prefix_tokens, sc.prefix_tokens);
        ck_assert_int_eq(sg.tail_tokens, steps);
    } else {
        ck_assert_uint_eq(sg.bytes_held, sc.bytes_held);
        /* Quest's last step: the same bounds scored and, the selections
         * agreeing, the same tokens attended */
        ck_assert_msg(fabs((double)sg.bytes_read - (double)sc.bytes_read) <= 0.02 * (double)sc.bytes_read,
                      "%s: the last step read %llu bytes on the GPU, %llu on the CPU", what,
                      (unsigned long long)sg.bytes_read, (unsigned long long)sc.bytes_read);
    }
    printf("check_gpu_decode: %s, %s weights: %d filled + %d + %d tokens, logits within %.2g RMS, %.2g at most; argmax "
           "checked at %d of %d steps\n",
           what, f16 ? "fp16" : "float32", fill, n, steps, worst_rms, worst_max, checked, steps + 1);
    mkv_decoder_free(cpu);
    mkv_decoder_free(gpu);
    free(ref);
    free(got);
}


/* Load the model at path; 0 (and a note) when there is none. */
static int load_model(const char *path, const char *what, mkv_loaded_model *lm)
{
    if (!path) {
        printf("check_gpu_decode: skipped a case: %s not found\n", what);
        return 0;
    }
    mkv_model_load_opts lo = {NULL, 1};
    mkv_error err;
    ck_assert_msg(mkv_model_load(path, &lo, lm, &err) == MKV_OK, "%s", err.msg);
    return 1;
}

START_TEST(stories260K_on_gpu_is_the_cpu_pass)
{
    mkv_loaded_model lm;
    if (!load_model(test_model_file("stories260K.bin"), "stories260K.bin (MKV_MODELS_DIR)", &lm))
        return;
    mkv_error err;
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(mkv_tokenizer_encode(lm.tok, "Once upon a time", 16, MKV_ENCODE_BOS, &ids, &n, &err), MKV_OK);
    compare_decode(lm.model, ids, (int)n, 60, 0, 0, 1, 0, NULL, NULL, "stories260K");
    compare_decode(lm.model, ids, (int)n, 60, 0, 1, 0, 0, NULL, NULL, "stories260K");
    free(ids);
    mkv_loaded_model_free(&lm);
}
END_TEST

/* A random model of a published shape: `layers` layers, the shape's small
 * test vocabulary, a context of max_seq positions, weights from seed. */
static mkv_model *shape_model(const char *name, int layers, int max_seq, uint64_t seed)
{
    const mkv_shape *s = mkv_shape_find(name);
    ck_assert_ptr_nonnull(s);
    mkv_model_config c;
    mkv_model *m;
    mkv_error err;
    ck_assert_msg(mkv_shape_config(s, layers, 2048, &c, &err) == MKV_OK, "%s", err.msg);
    c.max_seq_len = max_seq;
    ck_assert_msg(mkv_shape_build(&c, NULL, seed, cpu_threads(), &m, &err) == MKV_OK, "%s", err.msg);
    return m;
}

/* A random model of a published shape with `layers` layers and a small
 * vocabulary; prefill in chunks of 48 so that later chunks attend earlier
 * ones. */
static void shape_case(const char *name, int layers, int prompt, int steps, int fill, const mkv_method *method,
                       const mkv_params *params)
{
    mkv_model *m = shape_model(name, layers, fill + prompt + steps, 7);
    int32_t *tok = test_tokens(prompt, m->cfg.vocab_size, 11);
    char what[400];
    snprintf(what, sizeof what, "%s shape, %d layers", name, layers);
    if (method) {
        char text[256];
        mkv_params_format(params, text, sizeof text);
        snprintf(what, sizeof what, "%s shape, %d layers, %s %s", name, layers, method->name, text);
    }
    compare_decode(m, tok, prompt, steps, 48, 0, 0, fill, method, params, what);
    /* fp16 weights move q enough to swap pages or blocks near the budget's
     * edge, a different selection rather than an error: the selecting
     * methods are compared with float32 weights only */
    if (!method)
        compare_decode(m, tok, prompt, steps, 48, 1, 0, fill, method, params, what);
    free(tok);
    mkv_model_free(m);
}

START_TEST(shapes_on_gpu_are_the_cpu_pass)
{
    shape_case("smollm2-135m", 4, 130, 12, 0, NULL, NULL);
    shape_case("llama3.1-8b", 1, 100, 8, 0, NULL, NULL);
    shape_case("qwen2.5-7b", 1, 100, 8, 0, NULL, NULL);
}
END_TEST

/* Caches filled with synthetic rows (the speed runs' long contexts), made
 * on each side by its own code: the dense decode kernel over 5000 filled
 * positions (Llama-3.1-8B's shape) and the causal kernel over 300 (head_dim
 * 16), prompts prefilled after them in chunks. */
START_TEST(filled_caches_on_gpu_are_the_cpus)
{
    shape_case("llama3.1-8b", 1, 60, 8, 5000, NULL, NULL);
    shape_case("smollm2-135m", 2, 70, 8, 1200, NULL, NULL);
    mkv_model_config c;
    test_decode_config(&c);
    c.max_seq_len = 300 + 40 + 10;
    mkv_model *m = random_model(&c, 9);
    int32_t *tok = test_tokens(40, c.vocab_size, 4);
    compare_decode(m, tok, 40, 10, 16, 0, 0, 300, NULL, NULL, "test model, head_dim 16");
    free(tok);
    mkv_model_free(m);
}
END_TEST

static void method_case(const char *name, int layers, int prompt, int steps, const char *method, const char *params)
{
    const mkv_method *mt = mkv_method_find(method);
    ck_assert_ptr_nonnull(mt);
    mkv_params p;
    mkv_error err;
    mkv_params_init(&p, mt->params);
    ck_assert_msg(mkv_params_parse_list(&p, params, &err) >= 0, "%s", err.msg);
    shape_case(name, layers, prompt, steps, 0, mt, &p);
}

/* --ppl's pairing on the GPU for method with params on a 2-layer model
 * of SmolLM2's shape: the full reference and the method each prefilled,
 * as a GPU decoder does not fork; perplexities within 1e-3 relative. */
static void ppl_case(const char *method, const char *params, mkv_ppl_result *cpu, mkv_ppl_result *gpu)
{
    mkv_model *m = shape_model("smollm2-135m", 2, 400, 3);
    mkv_error err;
    const int64_t context = 320, score = 48;
    int32_t *tok = test_tokens((int)(context + score + 1), m->cfg.vocab_size, 8);
    mkv_params p;
    mkv_params_init(&p, mkv_method_find(method)->params);
    ck_assert_msg(mkv_params_parse_list(&p, params, &err) >= 0, "%s", err.msg);
    mkv_decoder_opts o;
    mkv_decoder_opts_init(&o);
    o.threads = cpu_threads();
    o.method = mkv_method_find(method);
    o.params = &p;
    ck_assert_msg(mkv_decode_ppl(m, tok, (size_t)(context + score + 1), context, score, &o, 1, cpu, NULL, &err) == MKV_OK,
                  "%s", err.msg);
    o.gpu = 1;
    ck_assert_msg(mkv_decode_ppl(m, tok, (size_t)(context + score + 1), context, score, &o, 1, gpu, NULL, &err) == MKV_OK,
                  "%s", err.msg);
    const double rel = fabs(exp(gpu->nll) / exp(cpu->nll) - 1), rel_full = fabs(exp(gpu->nll_full) / exp(cpu->nll_full) - 1);
    printf("check_gpu_decode: %s perplexity, smollm2-135m shape, 2 layers: CPU %.6f (full %.6f, KL %.3g), GPU %.6f "
           "(full %.6f, KL %.3g)\n",
           method, exp(cpu->nll), exp(cpu->nll_full), cpu->kl, exp(gpu->nll), exp(gpu->nll_full), gpu->kl);
    ck_assert_msg(rel <= 1e-3 && rel_full <= 1e-3, "%s: perplexity %.6f (full %.6f) on the GPU, %.6f (%.6f) on the CPU",
                  method, exp(gpu->nll), exp(gpu->nll_full), exp(cpu->nll), exp(cpu->nll_full));
    free(tok);
    mkv_model_free(m);
}

/* Quest on the GPU (page bounds kept by the decode steps, the Quest
 * kernels' selection and attention) against quest's CPU decode: pages of
 * 16 and 32, budgets as fractions and as token counts, max and sum over
 * 3 to 7 query heads per KV head; the budgets leave most pages out, so
 * the selection decides the logits (float32 weights: shape_case). */
START_TEST(quest_on_gpu_is_the_cpus)
{
    method_case("smollm2-135m", 2, 300, 16, "quest", "page=16,budget=0.25");
    method_case("llama3.1-8b", 1, 400, 16, "quest", "page=32,budget=96,recent=32");
    method_case("qwen2.5-7b", 1, 250, 8, "quest", "page=16,budget=0.3,agg=sum");
    mkv_ppl_result cpu, gpu;
    ppl_case("quest", "page=16,budget=0.2", &cpu, &gpu);
    ck_assert_uint_eq(gpu.bytes_held, cpu.bytes_held);
    ck_assert_msg(fabs(gpu.bytes_read_mean / cpu.bytes_read_mean - 1) <= 0.02, "bytes read per step %.0f vs %.0f",
                  gpu.bytes_read_mean, cpu.bytes_read_mean);
}
END_TEST

/* Relative RMS and largest difference of got against ref over n logits. */
static void logit_error(const float *ref, const float *got, int n, double *rms_rel, double *max_rel)
{
    double ss_ref = 0, ss_diff = 0, worst = 0;
    for (int i = 0; i < n; i++) {
        const double d = (double)got[i] - ref[i];
        ss_ref += (double)ref[i] * ref[i];
        ss_diff += d * d;
        worst = fabs(d) > worst ? fabs(d) : worst;
    }
    const double rms = sqrt(ss_ref / n);
    *rms_rel = sqrt(ss_diff / n) / rms;
    *max_rel = worst / rms;
}

/* MosaicKV on the GPU scoring with 8-bit block keys (gpu_blockkey_bits 8:
 * codes with a scale per row, the fp16 rows dropped) against the CPU's
 * mosaic with the manager off, which scores with the fp16 rows: the codes'
 * rounding may move blocks near the selection's threshold, so the logits
 * are held to the fp16-weight tolerances; the cache holds and a step reads
 * fewer bytes than with the fp16 rows.  A filled batch decodes too. */
START_TEST(mosaic_8bit_blockkeys_on_gpu)
{
    mkv_mosaic_set_manager(MKV_MOSAIC_MANAGER_OFF);
    mkv_model *m = shape_model("smollm2-135m", 2, 340, 5);
    const int V = m->cfg.vocab_size, n = 300, steps = 16;
    int32_t *tok = test_tokens(n, V, 17);
    mkv_error err;
    mkv_params p;
    mkv_decoder_opts o;
    mkv_decoder_opts_init(&o);
    o.threads = cpu_threads();
    o.max_new = steps;
    o.method = mkv_method_find("mosaic");
    mkv_params_init(&p, o.method->params);
    ck_assert(mkv_params_parse_list(&p, "strategy=fixed,segment=96,budget=0.2", &err) >= 0);
    o.params = &p;
    mkv_decoder_opts o16 = o, o8 = o;
    o16.gpu = o8.gpu = 1;
    o8.gpu_blockkey_bits = 8;
    float *ref = malloc((size_t)V * sizeof *ref), *g16 = malloc((size_t)V * sizeof *g16),
          *g8 = malloc((size_t)V * sizeof *g8);
    ck_assert(ref && g16 && g8);
    mkv_decoder *cpu, *d16, *d8;
    ck_assert_msg(mkv_decoder_prefill(m, tok, n, &o, ref, &cpu, &err) == MKV_OK, "%s", err.msg);
    ck_assert_msg(mkv_decoder_prefill(m, tok, n, &o16, g16, &d16, &err) == MKV_OK, "%s", err.msg);
    ck_assert_msg(mkv_decoder_prefill(m, tok, n, &o8, g8, &d8, &err) == MKV_OK, "%s", err.msg);
    double worst16 = 0, worst8 = 0, max_rel;
    int checked = 0;
    for (int s = 0;; s++) {
        double r16, r8;
        logit_error(ref, g16, V, &r16, &max_rel);
        ck_assert_msg(r16 <= F32_RMS && max_rel <= F32_MAX, "fp16 block keys: step %d: %.3g RMS, %.3g at most", s,
                      r16, max_rel);
        logit_error(ref, g8, V, &r8, &max_rel);
        ck_assert_msg(r8 <= F16_RMS && max_rel <= F16_MAX, "8-bit block keys: step %d: %.3g RMS, %.3g at most", s,
                      r8, max_rel);
        worst16 = r16 > worst16 ? r16 : worst16;
        worst8 = r8 > worst8 ? r8 : worst8;
        const int token = argmax(ref, V);
        double ss = 0;
        for (int i = 0; i < V; i++)
            ss += (double)ref[i] * ref[i];
        if (top_margin(ref, V) > 2 * F16_MAX * sqrt(ss / V)) {
            checked++;
            ck_assert_int_eq(argmax(g8, V), token);
        }
        if (s == steps)
            break;
        ck_assert_msg(mkv_decoder_step(cpu, token, ref, &err) == MKV_OK, "%s", err.msg);
        ck_assert_msg(mkv_decoder_step(d16, token, g16, &err) == MKV_OK, "%s", err.msg);
        ck_assert_msg(mkv_decoder_step(d8, token, g8, &err) == MKV_OK, "%s", err.msg);
    }
    mkv_decoder_stats s16, s8;
    mkv_decoder_get_stats(d16, &s16);
    mkv_decoder_get_stats(d8, &s8);
    ck_assert_int_eq(s8.tokens, s16.tokens);
    ck_assert_uint_lt(s8.bytes_held, s16.bytes_held);
    ck_assert_uint_lt(s8.bytes_read, s16.bytes_read);
    printf("check_gpu_decode: mosaic, 8-bit block keys: logits within %.2g RMS of the CPU's (fp16 rows: %.2g), argmax "
           "checked at %d of %d steps; %llu bytes held, %llu read by the last step (fp16 rows: %llu, %llu)\n",
           worst8, worst16, checked, steps + 1, (unsigned long long)s8.bytes_held, (unsigned long long)s8.bytes_read,
           (unsigned long long)s16.bytes_held, (unsigned long long)s16.bytes_read);
    mkv_decoder_free(cpu);
    mkv_decoder_free(d16);
    mkv_decoder_free(d8);
    /* a filled batch: synthetic packed caches, the 8-bit keys made from their rows */
    mkv_decoder_opts of = o8;
    of.fill = 2000;
    of.batch = 2;
    of.max_new = 4;
    mkv_model_free(m);
    m = shape_model("smollm2-135m", 2, 2000 + 8 + 4, 5);
    float *two = malloc((size_t)2 * V * sizeof *two);
    int32_t next[2] = {tok[0], tok[1]};
    mkv_decoder *df;
    ck_assert_msg(mkv_decoder_prefill(m, tok, 8, &of, two, &df, &err) == MKV_OK, "%s", err.msg);
    for (int s = 0; s < 4; s++)
        ck_assert_msg(mkv_decoder_step_batch(df, next, two, &err) == MKV_OK, "%s", err.msg);
    for (int i = 0; i < 2 * V; i++)
        ck_assert_msg(isfinite(two[i]), "filled batch: logit %d is %g", i, two[i]);
    mkv_decoder_free(df);
    /* the CPU has no 8-bit block keys */
    o8.gpu = 0;
    ck_assert_int_eq(mkv_decoder_prefill(m, tok, 8, &o8, ref, &df, &err), MKV_EUSAGE);
    free(two);
    free(ref);
    free(g16);
    free(g8);
    free(tok);
    mkv_model_free(m);
    mkv_mosaic_set_manager(MKV_MOSAIC_MANAGER_ASYNC);
}
END_TEST

/* A batch of B requests on the GPU against B decoders of one request
 * each: request b has a prompt of its own (prompt + 5b tokens, its own
 * ids) after its own filled rows; every request's logits compared at the
 * prefill and every step (teacher-forced with each request's own
 * argmax); the single decoders are held to the CPU by the tests above.
 * method NULL: the full cache; quest and mosaic (a real prefill, each
 * request's compressed on the CPU, the packed heads of all in one GPU
 * pass) with params. */
static void batch_case(const char *name, int B, int fill, int prompt, int steps, int f16, const char *method,
                       const char *params)
{
    mkv_model *m = shape_model(name, 2, fill + prompt + 5 * B + steps, 5);
    mkv_error err;
    const int V = m->cfg.vocab_size;
    int32_t **tok = calloc((size_t)B, sizeof *tok);
    int64_t *len = calloc((size_t)B, sizeof *len);
    ck_assert(tok && len);
    for (int b = 0; b < B; b++) {
        len[b] = prompt + 5 * b;
        tok[b] = test_tokens((int)len[b], V, 13 + (uint64_t)b);
    }
    mkv_params p;
    mkv_decoder_opts o;
    mkv_decoder_opts_init(&o);
    o.threads = cpu_threads();
    o.max_new = steps;
    o.gpu = 1;
    o.gpu_f16_weights = f16;
    o.fill = fill;
    o.fill_seed = 21;
    o.chunk = 32;
    if (method) {
        o.method = mkv_method_find(method);
        ck_assert_ptr_nonnull(o.method);
        mkv_params_init(&p, o.method->params);
        ck_assert_msg(mkv_params_parse_list(&p, params, &err) >= 0, "%s", err.msg);
        o.params = &p;
    }
    float *ref = malloc((size_t)B * V * sizeof *ref), *got = malloc((size_t)B * V * sizeof *got);
    mkv_decoder **one = calloc((size_t)B, sizeof *one), *all;
    int32_t *next = malloc((size_t)B * sizeof *next);
    ck_assert(ref && got && one && next);
    for (int b = 0; b < B; b++) {
        mkv_decoder_opts ob = o;
        ob.fill_seed = o.fill_seed + (uint64_t)b * 0x9e3779b97f4a7c15ull;
        ck_assert_msg(mkv_decoder_prefill(m, tok[b], len[b], &ob, ref + (size_t)b * V, &one[b], &err) == MKV_OK,
                      "%s", err.msg);
    }
    o.batch = B;
    ck_assert_msg(mkv_decoder_prefill_batch(m, (const int32_t *const *)tok, len, &o, got, &all, &err) == MKV_OK,
                  "%s", err.msg);
    const double tol_rms = f16 ? F16_RMS : F32_RMS, tol_max = f16 ? F16_MAX : F32_MAX;
    double worst_rms = 0, worst_max = 0;
    for (int step = 0;; step++) {
        for (int b = 0; b < B; b++) {
            double rms_rel, max_rel;
            logit_error(ref + (size_t)b * V, got + (size_t)b * V, V, &rms_rel, &max_rel);
            ck_assert_msg(rms_rel <= tol_rms && max_rel <= tol_max,
                          "%s %s batch of %d: step %d request %d: logits differ by %.3g RMS, %.3g at most", name,
                          method ? method : "full", B, step, b, rms_rel, max_rel);
            worst_rms = rms_rel > worst_rms ? rms_rel : worst_rms;
            worst_max = max_rel > worst_max ? max_rel : worst_max;
            next[b] = argmax(ref + (size_t)b * V, V);
        }
        if (step == steps)
            break;
        for (int b = 0; b < B; b++)
            ck_assert_msg(mkv_decoder_step(one[b], next[b], ref + (size_t)b * V, &err) == MKV_OK, "%s", err.msg);
        ck_assert_msg(mkv_decoder_step_batch(all, next, got, &err) == MKV_OK, "%s", err.msg);
    }
    mkv_decoder_stats sa, sb;
    mkv_decoder_get_stats(all, &sa);
    int64_t tokens = 0;
    uint64_t read = 0;
    for (int b = 0; b < B; b++) {
        mkv_decoder_get_stats(one[b], &sb);
        tokens += sb.tokens;
        read += sb.bytes_read;
    }
    ck_assert_int_eq(sa.tokens, tokens);
    ck_assert_uint_eq(sa.bytes_read, read);
    printf("check_gpu_decode: %s shape, 2 layers, %s weights, %s, a batch of %d after %d filled + %d..%d tokens: "
           "every request's logits within %.2g RMS, %.2g at most, of its own decoder's over %d steps\n",
           name, f16 ? "fp16" : "float32", method ? method : "full", B, fill, prompt, prompt + 5 * (B - 1), worst_rms,
           worst_max, steps);
    for (int b = 0; b < B; b++) {
        mkv_decoder_free(one[b]);
        free(tok[b]);
    }
    mkv_decoder_free(all);
    free(one);
    free(tok);
    free(len);
    free(next);
    free(ref);
    free(got);
    mkv_model_free(m);
}

START_TEST(batches_on_gpu_are_each_request)
{
    batch_case("llama3.1-8b", 3, 700, 40, 6, 0, NULL, NULL);
    batch_case("smollm2-135m", 4, 300, 20, 6, 1, NULL, NULL);
    batch_case("llama3.1-8b", 3, 600, 40, 8, 0, "quest", "page=16,budget=0.25,recent=32");
    batch_case("smollm2-135m", 4, 0, 300, 8, 0, "quest", "page=32,budget=96");
    mkv_mosaic_set_manager(MKV_MOSAIC_MANAGER_OFF);
    batch_case("smollm2-135m", 3, 0, 260, 8, 0, "mosaic", "strategy=fixed,segment=96,budget=0.25");
    batch_case("llama3.1-8b", 2, 0, 300, 6, 0, "mosaic", "strategy=fixed,keep=0.5,segment=128,budget=96,recent=32");
    mkv_mosaic_set_manager(MKV_MOSAIC_MANAGER_ASYNC);
    /* what a batch does not take */
    mkv_model *m = shape_model("smollm2-135m", 1, 600, 5);
    mkv_error err;
    int32_t *tok = test_tokens(9, m->cfg.vocab_size, 2);
    float *logits = malloc((size_t)2 * m->cfg.vocab_size * sizeof *logits);
    mkv_decoder_opts o;
    mkv_decoder_opts_init(&o);
    o.gpu = 1;
    o.max_new = 4;
    o.batch = 2;
    o.fill = 500;
    o.method = mkv_method_find("mosaic");
    const int32_t *prompts[2] = {tok, tok + 1};
    const int64_t lengths[2] = {8, 7};
    mkv_decoder *d = NULL;
    ck_assert_int_eq(mkv_decoder_prefill_batch(m, prompts, lengths, &o, logits, &d, &err), MKV_EUNSUP);
    ck_assert_msg(strstr(err.msg, "step by step") != NULL, "%s", err.msg);
    ck_assert_ptr_null(d);
    o.method = mkv_method_find("quest");
    ck_assert_msg(mkv_decoder_prefill_batch(m, prompts, lengths, &o, logits, &d, &err) == MKV_OK, "%s", err.msg);
    ck_assert_int_eq(mkv_decoder_step(d, 1, logits, &err), MKV_EUSAGE);
    mkv_decoder_free(d);
    o.gpu = 0;
    o.method = NULL;
    ck_assert_int_eq(mkv_decoder_prefill_batch(m, prompts, lengths, &o, logits, &d, &err), MKV_EUNSUP);
    ck_assert_msg(strstr(err.msg, "on the GPU") != NULL, "%s", err.msg);
    free(logits);
    free(tok);
    mkv_model_free(m);
}
END_TEST

/* MosaicKV on the GPU (the CPU's packed heads converted once, each step's
 * token pushed through the recent rows into the open segment by the GPU
 * encode, the packed kernels' selection and attention) against mosaic's
 * CPU decode with the manager off (no segment closes, as on the GPU):
 * fixed strategies of 25% and 50% of the elements with and without groups,
 * the default ratio strategy (quantized values, which the GPU holds as
 * fp16 of the same values), blocks of 8 and 4, budgets as fractions and
 * counts, max and sum over 3 to 7 query heads per KV head, open segments
 * that fill several blocks. */
START_TEST(mosaic_on_gpu_is_the_cpus)
{
    mkv_mosaic_set_manager(MKV_MOSAIC_MANAGER_OFF);
    method_case("smollm2-135m", 2, 300, 20, "mosaic", "strategy=fixed,segment=96,budget=0.25");
    method_case("llama3.1-8b", 1, 400, 16, "mosaic", "strategy=fixed,keep=0.5,group=2,segment=128,budget=96,recent=32");
    method_case("qwen2.5-7b", 1, 250, 12, "mosaic", "segment=64,block=4,budget=0.3,agg=sum");
    mkv_ppl_result cpu, gpu;
    ppl_case("mosaic", "strategy=fixed,segment=96,budget=0.2", &cpu, &gpu);
    mkv_mosaic_set_manager(MKV_MOSAIC_MANAGER_ASYNC);
}
END_TEST

/* Partial RoPE (rope_dim 8 of head_dim 16), interleaved pairs, untied
 * classifier, a decode past one prefill chunk. */
START_TEST(partial_rope_on_gpu_is_the_cpu_pass)
{
    mkv_model_config c;
    test_decode_config(&c);
    c.rope_dim = 8;
    mkv_model *m = random_model(&c, 5);
    int32_t *tok = test_tokens(150, c.vocab_size, 3);
    compare_decode(m, tok, 150, 40, 64, 0, 0, 0, NULL, NULL, "partial RoPE model");
    free(tok);
    mkv_model_free(m);
}
END_TEST

START_TEST(smollm2_on_gpu_is_the_cpu_pass)
{
    mkv_loaded_model lm;
    if (!load_model(test_smollm2_path(), "SmolLM2-135M-Instruct.Q4_1.gguf (scripts/get-models)", &lm))
        return;
    mkv_error err;
    const char *prompt = "It is a truth universally acknowledged that";
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(mkv_tokenizer_encode(lm.tok, prompt, strlen(prompt), 0, &ids, &n, &err), MKV_OK);
    compare_decode(lm.model, ids, (int)n, 32, 0, 0, 0, 0, NULL, NULL, "SmolLM2-135M");
    compare_decode(lm.model, ids, (int)n, 32, 0, 1, 0, 0, NULL, NULL, "SmolLM2-135M");
    free(ids);
    mkv_loaded_model_free(&lm);
}
END_TEST

START_TEST(perplexity_on_gpu_is_the_cpus)
{
    mkv_loaded_model lm;
    if (!load_model(test_model_file("stories260K.bin"), "stories260K.bin (MKV_MODELS_DIR)", &lm))
        return;
    mkv_error err;
    char path[4200];
    const char *dir = getenv("MKV_DATA_DIR");
    snprintf(path, sizeof path, "%s/heldout.txt", dir && *dir ? dir : MKV_SOURCE_DATA_DIR);
    char *text;
    size_t len;
    ck_assert_msg(mkv_read_file(path, &text, &len, &err) == MKV_OK, "%s", err.msg);
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(mkv_tokenizer_encode(lm.tok, text, len, MKV_ENCODE_BOS, &ids, &n, &err), MKV_OK);
    const int64_t context = 300, score = 200;
    ck_assert_uint_ge(n, context + score + 1);
    mkv_decoder_opts o;
    mkv_decoder_opts_init(&o);
    o.threads = cpu_threads();
    o.chunk = 128;
    mkv_ppl_result cpu, gpu;
    ck_assert_msg(mkv_decode_ppl(lm.model, ids, n, context, score, &o, 1, &cpu, NULL, &err) == MKV_OK, "%s", err.msg);
    o.gpu = 1;
    ck_assert_msg(mkv_decode_ppl(lm.model, ids, n, context, score, &o, 1, &gpu, NULL, &err) == MKV_OK, "%s", err.msg);
    const double rel = fabs(exp(gpu.nll) / exp(cpu.nll) - 1);
    printf("check_gpu_decode: stories260K perplexity over %lld tokens after %lld: CPU %.6f, GPU %.6f (%.2g relative)\n",
           (long long)score, (long long)context, exp(cpu.nll), exp(gpu.nll), rel);
    ck_assert_msg(rel <= 1e-3, "perplexity %.6f on the GPU, %.6f on the CPU", exp(gpu.nll), exp(cpu.nll));
    ck_assert_uint_eq(gpu.bytes_held, cpu.bytes_held);
    free(ids);
    free(text);
    mkv_loaded_model_free(&lm);
}
END_TEST

static mkv_model *tiny_model(void)
{
    mkv_model_config c;
    test_decode_config(&c);
    return random_model(&c, 9);
}

/* Bad tokens and positions past the cache are refused before any work;
 * a method without a GPU path is refused by name. */
START_TEST(gpu_decoder_refuses_misuse)
{
    mkv_model *m = tiny_model();
    mkv_decoder_opts o;
    mkv_decoder_opts_init(&o);
    o.gpu = 1;
    o.max_new = 2;
    int32_t tok[4] = {1, 2, 3, 4};
    float logits[64];
    mkv_decoder *d = NULL;
    mkv_error err;
    int32_t bad[2] = {1, 64};
    ck_assert_int_eq(mkv_decoder_prefill(m, bad, 2, &o, logits, &d, &err), MKV_EFORMAT);
    ck_assert_ptr_null(d);
    ck_assert_msg(strstr(err.msg, "outside the vocabulary") != NULL, "%s", err.msg);
    ck_assert_int_eq(mkv_decoder_prefill(m, tok, 4, &o, logits, &d, &err), MKV_OK);
    ck_assert_int_eq(mkv_decoder_step(d, -1, logits, &err), MKV_EFORMAT);
    ck_assert_int_eq(mkv_decoder_step(d, 5, logits, &err), MKV_OK);
    ck_assert_int_eq(mkv_decoder_step(d, 6, logits, &err), MKV_OK);
    ck_assert_int_eq(mkv_decoder_step(d, 7, logits, &err), MKV_EFORMAT);
    ck_assert_msg(strstr(err.msg, "exceed the context") != NULL, "%s", err.msg);
    mkv_decoder *fork = NULL;
    const mkv_method *quest = mkv_method_find("quest");
    ck_assert_ptr_nonnull(quest);
    mkv_decoder_opts oq = o;
    oq.gpu = 0;
    oq.method = quest;
    ck_assert_int_eq(mkv_decoder_fork(d, &oq, &fork, &err), MKV_EUNSUP);
    mkv_decoder_free(d);
    oq.gpu = 1;
    ck_assert_int_eq(mkv_decoder_prefill(m, tok, 4, &oq, logits, &d, &err), MKV_EUNSUP);
    ck_assert_msg(strstr(err.msg, "its kernels take 64 or 128") != NULL, "%s", err.msg);
    oq.method = mkv_method_find("kivi");
    ck_assert_ptr_nonnull(oq.method);
    ck_assert_int_eq(mkv_decoder_prefill(m, tok, 4, &oq, logits, &d, &err), MKV_EUNSUP);
    ck_assert_msg(strstr(err.msg, "method 'kivi' has no GPU decode path") != NULL, "%s", err.msg);
    /* mosaic: a selection the GPU kernel does not make, and a prompt too
     * short to leave a packed segment */
    oq.method = mkv_method_find("mosaic");
    mkv_params mp;
    mkv_params_init(&mp, oq.method->params);
    ck_assert_int_ge(mkv_params_parse_list(&mp, "refine=2", &err), 0);
    oq.params = &mp;
    ck_assert_int_eq(mkv_decoder_prefill(m, tok, 4, &oq, logits, &d, &err), MKV_EUNSUP);
    ck_assert_msg(strstr(err.msg, "refine=2") != NULL, "%s", err.msg);
    oq.params = NULL;
    ck_assert_int_eq(mkv_decoder_prefill(m, tok, 4, &oq, logits, &d, &err), MKV_EUNSUP);
    ck_assert_msg(strstr(err.msg, "leaves no packed segment") != NULL, "%s", err.msg);
    ck_assert_ptr_null(d);
    mkv_model_free(m);
}
END_TEST

/* Without CUDA or without a GPU the GPU decoder fails with `want` and a
 * message, leaving no decoder. */
static int clean_failure(mkv_status want)
{
    mkv_model_config c;
    test_decode_config(&c);
    mkv_model *m;
    mkv_error err;
    if (mkv_model_create(&c, &m, &err) != MKV_OK) {
        fprintf(stderr, "check_gpu_decode: %s\n", err.msg);
        return 1;
    }
    mkv_decoder_opts o;
    mkv_decoder_opts_init(&o);
    o.gpu = 1;
    int32_t tok[2] = {1, 2};
    float logits[64];
    mkv_decoder *d = (mkv_decoder *)&o;
    mkv_error_clear(&err);
    int rc = mkv_decoder_prefill(m, tok, 2, &o, logits, &d, &err);
    mkv_model_free(m);
    if (rc != (int)want || d != NULL || err.msg[0] == '\0') {
        fprintf(stderr, "check_gpu_decode: the GPU decoder gave %d ('%s'), wanted %d\n", rc, err.msg, (int)want);
        return 1;
    }
    return 0;
}

static Suite *gpu_decode_suite(void)
{
    Suite *s = suite_create("gpu_decode");
    TCase *tc = tcase_create("gpu_decode");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, stories260K_on_gpu_is_the_cpu_pass);
    tcase_add_test(tc, partial_rope_on_gpu_is_the_cpu_pass);
    tcase_add_test(tc, shapes_on_gpu_are_the_cpu_pass);
    tcase_add_test(tc, filled_caches_on_gpu_are_the_cpus);
    tcase_add_test(tc, quest_on_gpu_is_the_cpus);
    tcase_add_test(tc, mosaic_on_gpu_is_the_cpus);
    tcase_add_test(tc, batches_on_gpu_are_each_request);
    tcase_add_test(tc, mosaic_8bit_blockkeys_on_gpu);
    tcase_add_test(tc, smollm2_on_gpu_is_the_cpu_pass);
    tcase_add_test(tc, perplexity_on_gpu_is_the_cpus);
    tcase_add_test(tc, gpu_decoder_refuses_misuse);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return gpu_test_main("check_gpu_decode", gpu_decode_suite, clean_failure); }
