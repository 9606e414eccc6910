/* Chat templates, shape-only models, model format detection, and the
 * model run and capture of lib/model.
 *
 * References: the conversations Hugging Face's apply_chat_template renders
 * for the templates quoted here (SmolLM2-135M-Instruct, Qwen2.5, Llama-3,
 * Llama-2, Mistral), written out by hand; the published parameter counts of
 * each model a shape copies; statistics of the random weights; files this
 * test writes with known contents; stories260K's published greedy sample;
 * RoPE recomputed here in double precision from its formula.  The capture
 * test runs over the model tests/model_fixture.py writes and, when it is
 * there, stories260K; only the published-sample run needs stories260K.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/outfile.h"
#include "io/dump.h"
#include "model/capture.h"
#include "model/model_load.h"
#include "model/prompt.h"
#include "model/run_model.h"
#include "model/shapes.h"
#include "vocab/chat.h"
#include "testutil.h"

/* ------------------------------------------------------------ chat */

/* SmolLM2-135M-Instruct's template as the GGUF stores it (real newlines
 * inside the string literals). */
static const char *const SMOLLM2 =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";

/* Qwen2.5's (excerpt): newlines written as Jinja escapes, the spliced
 * system message before the literal default one. */
static const char *const QWEN25 =
    "{%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a "
    "helpful assistant.<|im_end|>\\n' }}\n    {%- endif %}\n"
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content "
    "+ '<|im_end|>' + '\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

static const char *const LLAMA3 =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

static const char *const LLAMA2 =
    "{% if messages[0]['role'] == 'system' %}{% set system_message = '<<SYS>>\\n' + "
    "messages[0]['content'] | trim + '\\n<</SYS>>\\n\\n' %}{% endif %}{% for message in "
    "messages %}{{ bos_token + '[INST] ' + content | trim + ' [/INST]' }}{% endfor %}";

static const char *const MISTRAL =
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}{{ message['content'] + "
    "eos_token}}{% endif %}{% endfor %}";

static void assert_render(const char *tmpl, const char *system, const char *user, const char *want)
{
    char *got;
    mkv_error err;
    ck_assert_int_eq(mkv_chat_render(tmpl, system, user, &got, &err), MKV_OK);
    ck_assert_str_eq(got, want);
    free(got);
}

START_TEST(test_chat_families)
{
    mkv_chat_family f;
    mkv_error err;
    ck_assert_int_eq(mkv_chat_detect(SMOLLM2, &f, &err), MKV_OK);
    ck_assert_int_eq(f, MKV_CHAT_CHATML);
    ck_assert_int_eq(mkv_chat_detect(QWEN25, &f, &err), MKV_OK);
    ck_assert_int_eq(f, MKV_CHAT_CHATML);
    ck_assert_int_eq(mkv_chat_detect(LLAMA3, &f, &err), MKV_OK);
    ck_assert_int_eq(f, MKV_CHAT_LLAMA3);
    ck_assert_int_eq(mkv_chat_detect(LLAMA2, &f, &err), MKV_OK);
    ck_assert_int_eq(f, MKV_CHAT_LLAMA2);
    ck_assert_int_eq(mkv_chat_detect(MISTRAL, &f, &err), MKV_OK);
    ck_assert_int_eq(f, MKV_CHAT_MISTRAL);
    ck_assert_str_eq(mkv_chat_family_name(MKV_CHAT_LLAMA3), "llama3");

    ck_assert_int_eq(mkv_chat_detect("{{ messages[0]['content'] }}<|user|>", &f, &err), MKV_EUNSUP);
    ck_assert_msg(strstr(err.msg, "unknown chat template"), "%s", err.msg);
    ck_assert_int_eq(mkv_chat_detect(NULL, &f, &err), MKV_EUNSUP);
    ck_assert_str_eq(err.msg, "the model has no chat template");
    char *out;
    ck_assert_int_eq(mkv_chat_render("plain", NULL, "hi", &out, &err), MKV_EUNSUP);
    ck_assert_ptr_null(out);

    /* the template, not the tokenizer, puts BOS first */
    ck_assert(!mkv_chat_wants_bos(SMOLLM2));
    ck_assert(!mkv_chat_wants_bos(QWEN25));
    ck_assert(mkv_chat_wants_bos(LLAMA3));
    ck_assert(mkv_chat_wants_bos(LLAMA2));
    ck_assert(mkv_chat_wants_bos(MISTRAL));
}
END_TEST

START_TEST(test_chat_chatml)
{
    char *sys = mkv_chat_default_system(SMOLLM2);
    ck_assert_str_eq(sys, "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
    free(sys);
    /* the spliced '<|im_start|>system\n' + content is skipped, the escaped
     * newline of the literal one is not part of the prompt */
    sys = mkv_chat_default_system(QWEN25);
    ck_assert_str_eq(sys, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
    free(sys);
    ck_assert_ptr_null(mkv_chat_default_system(LLAMA3));

    assert_render(SMOLLM2, NULL, "What is 2+2?",
                  "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                  "Hugging Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                  "<|im_start|>assistant\n");
    assert_render(QWEN25, NULL, "hi",
                  "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                  "assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    assert_render(QWEN25, "Be brief.", "hi",
                  "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                  "<|im_start|>assistant\n");
    /* "" asks for no system turn at all */
    assert_render(SMOLLM2, "", "hi", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}
END_TEST

START_TEST(test_chat_llama_mistral)
{
    assert_render(LLAMA3, NULL, "Hello",
                  "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
    assert_render(LLAMA3, "Be brief.", "Hello",
                  "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
    assert_render(LLAMA2, NULL, "Hello", "[INST] Hello [/INST]");
    assert_render(LLAMA2, "Be brief.", "Hello", "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHello [/INST]");
    assert_render(MISTRAL, NULL, "Hello", "[INST] Hello [/INST]");
    assert_render(MISTRAL, "Be brief.", "Hello", "[INST] Be brief.\n\nHello [/INST]");
}
END_TEST

/* ------------------------------------------------------------ shapes */

/* Parameters of a LLaMA-family model from its shape. */
static uint64_t param_count(const mkv_shape *s)
{
    uint64_t d = (uint64_t)s->dim, q = (uint64_t)s->n_heads * s->head_dim;
    uint64_t kv = (uint64_t)s->n_kv_heads * s->head_dim, hid = (uint64_t)s->hidden_dim;
    uint64_t per_layer = 2 * d + d * q + 2 * d * kv + q * d + 3 * d * hid + (s->has_qkv_bias ? q + 2 * kv : 0);
    return (uint64_t)s->vocab_size * d * (s->tied_classifier ? 1 : 2) + (uint64_t)s->n_layers * per_layer + d;
}

START_TEST(test_shape_table)
{
    /* the models' published parameter counts */
    static const struct {
        const char *name;
        uint64_t params;
    } published[] = {{"llama3.1-8b", 8030261248ull}, {"qwen2.5-7b", 7615616512ull},
                     {"smollm2-135m", 134515008ull}, {"llama2-7b", 6738415616ull},
                     {"mistral-7b", 7248023552ull},  {"ministral-8b", 8019808256ull}};
    int n = 0;
    while (mkv_shape_at(n))
        n++;
    ck_assert_int_eq(n, (int)(sizeof published / sizeof *published));
    for (int i = 0; i < n; i++) {
        const mkv_shape *s = mkv_shape_find(published[i].name);
        ck_assert_msg(s != NULL, "%s", published[i].name);
        ck_assert_msg(param_count(s) == published[i].params, "%s: %llu parameters, published %llu",
                      s->name, (unsigned long long)param_count(s), (unsigned long long)published[i].params);
        mkv_model_config c;
        mkv_error err;
        ck_assert_int_eq(mkv_shape_config(s, 0, 0, &c, &err), MKV_OK);
        ck_assert_uint_ge(mkv_model_storage_floats(&c), param_count(s));
        ck_assert_int_eq(c.rope_layout, MKV_ROPE_HALF);
    }
    const mkv_shape *l = mkv_shape_find("LLaMA3.1-8B");
    ck_assert(l && strcmp(l->name, "llama3.1-8b") == 0);
    ck_assert_int_eq(l->n_kv_heads, 8);
    ck_assert(l->rope_theta == 500000.0);
    ck_assert_ptr_null(mkv_shape_find("gpt-5"));
    ck_assert_str_eq(mkv_shape_names(),
                     "llama3.1-8b, qwen2.5-7b, smollm2-135m, llama2-7b, mistral-7b, ministral-8b");
    const mkv_shape *q = mkv_shape_find("qwen2.5-7b");
    ck_assert(q->has_qkv_bias && q->rope_theta == 1e6 && q->n_kv_heads == 4);
    ck_assert(mkv_shape_find("smollm2-135m")->tied_classifier);

    /* Llama 3.1's "llama3" RoPE scaling (factor 8, low 1, high 4, original
     * context 8192): pair 0 turns once per 2 pi tokens, far below 8192/4,
     * and keeps its frequency; pair 63 (wavelength 2 pi 500000^(126/128),
     * about 2.6 million tokens, above 8192/1) is divided by 8. */
    mkv_model_config c;
    mkv_error err;
    ck_assert_int_eq(mkv_shape_config(l, 0, 0, &c, &err), MKV_OK);
    ck_assert(c.has_rope_freq_factors);
    ck_assert_float_eq_tol(c.rope_freq_factors[0], 1.0f, 1e-6f);
    ck_assert_float_eq_tol(c.rope_freq_factors[63], 8.0f, 1e-5f);
    ck_assert_int_eq(mkv_shape_config(q, 0, 0, &c, &err), MKV_OK);
    ck_assert(!c.has_rope_freq_factors);

    /* a smaller vocabulary drops BOS/EOS ids it no longer holds */
    ck_assert_int_eq(mkv_shape_config(l, 2, 1000, &c, &err), MKV_OK);
    ck_assert_int_eq(c.n_layers, 2);
    ck_assert_int_eq(c.vocab_size, 1000);
    ck_assert_int_eq(c.bos_id, -1);
    ck_assert_int_eq(c.eos_id, -1);
    ck_assert_str_eq(c.name, "shape:llama3.1-8b");
}
END_TEST

static double mean_sq(const float *x, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return s / (double)n;
}

/* The shape builder, on SmolLM2-135M's shape (small, so the test stays
 * far below the suite's memory limit) and on one layer of Qwen2.5-7B's
 * (its QKV biases). */
START_TEST(test_shape_weights)
{
    const mkv_shape *s = mkv_shape_find("smollm2-135m");
    mkv_model_config c;
    mkv_error err;
    /* 2 layers with a vocabulary of 64 */
    ck_assert_int_eq(mkv_shape_config(s, 2, 64, &c, &err), MKV_OK);
    int pick[2] = {3, 20};
    mkv_model *a, *b, *one;
    ck_assert_int_eq(mkv_shape_build(&c, pick, 9, 1, &a, &err), MKV_OK);
    ck_assert_int_eq(mkv_shape_build(&c, pick, 9, 3, &b, &err), MKV_OK);
    /* the thread count changes nothing */
    ck_assert(memcmp(a->storage, b->storage, a->storage_floats * sizeof(float)) == 0);
    mkv_model_free(b);
    /* layer 20 is layer 20 whatever else is built */
    mkv_model_config c1 = c;
    c1.n_layers = 1;
    ck_assert_int_eq(mkv_shape_build(&c1, &pick[1], 9, 2, &one, &err), MKV_OK);
    size_t wq = (size_t)c.n_heads * c.head_dim * c.dim;
    ck_assert(memcmp(one->layers[0].wq, a->layers[1].wq, wq * sizeof(float)) == 0);
    ck_assert(memcmp(one->layers[0].w2, a->layers[1].w2, (size_t)c.dim * c.hidden_dim * sizeof(float)) == 0);
    ck_assert(memcmp(one->layers[0].wq, a->layers[0].wq, wq * sizeof(float)) != 0);
    mkv_model_free(one);

    /* variances: 1/in for matrices; norms 1; uniform draws bounded by
     * sqrt(3) standard deviations */
    const mkv_layer_weights *w = &a->layers[0];
    double in = c.dim, hid = c.hidden_dim;
    ck_assert_double_eq_tol(mean_sq(w->wq, wq) * in, 1.0, 0.01);
    ck_assert_double_eq_tol(mean_sq(w->w2, (size_t)c.dim * c.hidden_dim) * hid, 1.0, 0.01);
    ck_assert_double_eq_tol(mean_sq(w->w1, (size_t)c.dim * c.hidden_dim) * in, 1.0, 0.01);
    double bound = sqrt(3.0 / in) * (1 + 1e-6);
    for (size_t i = 0; i < wq; i++)
        ck_assert(fabs(w->wq[i]) <= bound);
    for (int i = 0; i < c.dim; i++)
        ck_assert(w->rms_att[i] == 1.0f && w->rms_ffn[i] == 1.0f && a->rms_final[i] == 1.0f);
    /* another seed, other weights */
    mkv_model *d;
    ck_assert_int_eq(mkv_shape_build(&c, pick, 10, 1, &d, &err), MKV_OK);
    ck_assert(memcmp(a->layers[0].wq, d->layers[0].wq, wq * sizeof(float)) != 0);
    mkv_model_free(a);
    mkv_model_free(d);

    /* biases of variance 0.2^2, an untied classifier */
    const mkv_shape *q = mkv_shape_find("qwen2.5-7b");
    mkv_model_config cq;
    ck_assert_int_eq(mkv_shape_config(q, 1, 64, &cq, &err), MKV_OK);
    mkv_model *m;
    ck_assert_int_eq(mkv_shape_build(&cq, &pick[0], 9, 2, &m, &err), MKV_OK);
    ck_assert_double_eq_tol(mean_sq(m->layers[0].bk, (size_t)cq.n_kv_heads * cq.head_dim), 0.04, 0.008);
    ck_assert_double_eq_tol(mean_sq(m->layers[0].bq, (size_t)cq.n_heads * cq.head_dim), 0.04, 0.004);
    ck_assert(m->classifier != m->tok_embedding);
    mkv_model_free(m);
}
END_TEST

START_TEST(test_memory_estimate)
{
    const mkv_shape *s = mkv_shape_find("llama3.1-8b");
    mkv_model_config c;
    mkv_error err;
    ck_assert_int_eq(mkv_shape_config(s, 0, 0, &c, &err), MKV_OK);
    /* the KV cache alone: 2 x 32 layers x 8 heads x 128 x 4 bytes per token */
    uint64_t small = mkv_run_bytes_estimate(&c, 1, 1, 1), big = mkv_run_bytes_estimate(&c, 8193, 1, 1);
    ck_assert_uint_ge(big - small, 8192ull * 2 * 32 * 8 * 128 * 4);
    ck_assert_uint_le(big - small, 8192ull * 2 * 32 * 8 * 128 * 4 * 11 / 10);
    ck_assert_uint_gt(mkv_available_memory(), 0);
}
END_TEST

/* ------------------------------------------------------------ loading */

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *fp = fopen(path, "wb");
    ck_assert_msg(fp != NULL, "cannot create %s", path);
    ck_assert_uint_eq(fwrite(data, 1, n, fp), n);
    fclose(fp);
}

/* A llama2.c checkpoint: dim 4, hidden 4, 1 layer, 2 heads, 2 KV heads,
 * vocab 8, seq_len 16, small finite weights. */
static void write_tiny_checkpoint(const char *path)
{
    int32_t h[7] = {4, 4, 1, 2, 2, 8, 16};
    /* embedding 32 + layer 4*(2*4 + 2*4 + 3*4 + 2) = 120 + final 4 + RoPE tables 2*16 */
    enum { FLOATS = 32 + 120 + 4 + 32 };
    unsigned char buf[sizeof h + FLOATS * 4];
    memcpy(buf, h, sizeof h);
    float *f = (float *)(void *)(buf + sizeof h);
    for (int i = 0; i < FLOATS; i++)
        f[i] = 0.01f * (float)(i % 7);
    write_file(path, buf, sizeof buf);
}

/* A llama2.c tokenizer of 8 pieces. */
static void write_tiny_tokenizer(const char *path)
{
    static const char *const pieces[8] = {"<unk>", "<s>", "</s>", " ", "a", "b", "ab", " a"};
    unsigned char buf[256];
    size_t n = 0;
    int32_t max_len = 5;
    memcpy(buf, &max_len, 4);
    n = 4;
    for (int i = 0; i < 8; i++) {
        float score = (float)i;
        int32_t len = (int32_t)strlen(pieces[i]);
        memcpy(buf + n, &score, 4);
        memcpy(buf + n + 4, &len, 4);
        memcpy(buf + n + 8, pieces[i], (size_t)len);
        n += 8 + (size_t)len;
    }
    write_file(path, buf, n);
}

START_TEST(test_detect)
{
    char dir[512], path[600];
    mkv_model_format f;
    mkv_error err;
    snprintf(dir, sizeof dir, "%s/detect", test_tmpdir());
    mkdir(dir, 0700);
    ck_assert_int_eq(mkv_model_detect(dir, &f, &err), MKV_EFORMAT);
    ck_assert_msg(strstr(err.msg, "a directory without config.json is not a Hugging Face model"), "%s", err.msg);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_file(path, "{}", 2);
    ck_assert_int_eq(mkv_model_detect(dir, &f, &err), MKV_OK);
    ck_assert_int_eq(f, MKV_FORMAT_HF);
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    write_file(path, "GGUF\3\0\0\0", 8);
    ck_assert_int_eq(mkv_model_detect(path, &f, &err), MKV_OK);
    ck_assert_int_eq(f, MKV_FORMAT_GGUF);
    snprintf(path, sizeof path, "%s/short", dir);
    write_file(path, "GG", 2);
    ck_assert_int_eq(mkv_model_detect(path, &f, &err), MKV_OK);
    ck_assert_int_eq(f, MKV_FORMAT_LLAMA2C);
    snprintf(path, sizeof path, "%s/absent", dir);
    ck_assert_int_eq(mkv_model_detect(path, &f, &err), MKV_EIO);
    ck_assert_msg(strstr(err.msg, "No such file or directory"), "%s", err.msg);
    ck_assert_str_eq(mkv_model_format_name(MKV_FORMAT_GGUF), "gguf");

    /* --tokenizer belongs to llama2.c checkpoints */
    mkv_loaded_model lm;
    mkv_model_load_opts o = {"tok.bin", 1};
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    ck_assert_int_eq(mkv_model_load(path, &o, &lm, &err), MKV_EUSAGE);
    ck_assert_msg(strstr(err.msg, "--tokenizer is for llama2.c checkpoints"), "%s", err.msg);
    ck_assert_ptr_null(lm.model);
}
END_TEST

START_TEST(test_llama2c_tokenizer_search)
{
    char dir[512], model[600], tok[600], other[600];
    mkv_loaded_model lm;
    mkv_error err;
    snprintf(dir, sizeof dir, "%s/l2c", test_tmpdir());
    mkdir(dir, 0700);
    snprintf(model, sizeof model, "%s/tiny.bin", dir);
    write_tiny_checkpoint(model);

    /* none beside: an error naming both candidates, unless not needed */
    ck_assert_int_eq(mkv_model_load(model, NULL, &lm, &err), MKV_EIO);
    ck_assert_msg(strstr(err.msg, "looked for tokenizer.bin and tok8.bin in"), "%s", err.msg);
    ck_assert_ptr_null(lm.model);
    mkv_model_load_opts optional = {NULL, 0};
    ck_assert_int_eq(mkv_model_load(model, &optional, &lm, &err), MKV_OK);
    ck_assert_ptr_null(lm.tok);
    ck_assert_int_eq(lm.model->cfg.vocab_size, 8);
    ck_assert_int_eq(lm.format, MKV_FORMAT_LLAMA2C);
    ck_assert(lm.add_bos);
    ck_assert_ptr_null(lm.chat_template);
    mkv_loaded_model_free(&lm);

    /* tok<vocab>.bin beside the checkpoint */
    snprintf(tok, sizeof tok, "%s/tok8.bin", dir);
    write_tiny_tokenizer(tok);
    ck_assert_int_eq(mkv_model_load(model, NULL, &lm, &err), MKV_OK);
    ck_assert_ptr_nonnull(lm.tok);
    ck_assert_str_eq(lm.tokenizer_path, tok);
    mkv_loaded_model_free(&lm);

    /* tokenizer.bin first */
    snprintf(other, sizeof other, "%s/tokenizer.bin", dir);
    write_tiny_tokenizer(other);
    ck_assert_int_eq(mkv_model_load(model, NULL, &lm, &err), MKV_OK);
    ck_assert_str_eq(lm.tokenizer_path, other);
    mkv_loaded_model_free(&lm);

    /* an explicit file, checked against the model's vocabulary */
    mkv_model_load_opts given = {tok, 1};
    ck_assert_int_eq(mkv_model_load(model, &given, &lm, &err), MKV_OK);
    ck_assert_str_eq(lm.tokenizer_path, tok);
    mkv_loaded_model_free(&lm);
    given.tokenizer = model;  /* not a tokenizer */
    ck_assert_int_ne(mkv_model_load(model, &given, &lm, &err), MKV_OK);
    ck_assert_ptr_null(lm.model);
}
END_TEST

/* ------------------------------------------------------------ run and capture */

START_TEST(test_layer_list)
{
    mkv_error err;
    int *l, n;
    ck_assert_int_eq(mkv_layer_list_parse("4,0-2,1", 5, &l, &n, &err), MKV_OK);
    ck_assert_int_eq(n, 4);
    ck_assert(l[0] == 0 && l[1] == 1 && l[2] == 2 && l[3] == 4);
    free(l);
    ck_assert_int_eq(mkv_layer_list_parse(NULL, 3, &l, &n, &err), MKV_OK);
    ck_assert(n == 3 && l[0] == 0 && l[1] == 1 && l[2] == 2);
    free(l);
    const char *bad[] = {"5", "3-1", "1,,2", "-1", "a", "2-", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        ck_assert_msg(mkv_layer_list_parse(bad[i], 5, &l, &n, &err) == MKV_EUSAGE, "'%s'", bad[i]);
    ck_assert_str_eq(err.msg, "invalid value '' for --layers: expected a list of layers like 0,3,5-7");
}
END_TEST

static void write_text(const char *path, const char *text)
{
    FILE *fp = fopen(path, "wb");
    ck_assert_ptr_nonnull(fp);
    ck_assert_int_eq(fputs(text, fp) >= 0, 1);
    ck_assert_int_eq(fclose(fp), 0);
}

START_TEST(test_token_ids)
{
    char path[600];
    mkv_error err;
    mkv_idbuf ids = {0};
    test_path(path, sizeof path, "ids.txt");
    write_text(path, "  3\n7\t 11\r\n");
    ck_assert_int_eq(mkv_idbuf_push(&ids, 1, &err), MKV_OK);   /* a BOS before the file's */
    ck_assert_int_eq(mkv_read_token_ids(path, 12, &ids, &err), MKV_OK);
    ck_assert_int_eq((int)ids.n, 4);
    ck_assert(ids.ids[0] == 1 && ids.ids[1] == 3 && ids.ids[2] == 7 && ids.ids[3] == 11);
    ids.n = 0;
    ck_assert_int_eq(mkv_read_token_ids(path, 11, &ids, &err), MKV_EFORMAT);
    ck_assert_msg(strstr(err.msg, "token id 11 at index 2 is outside the vocabulary of 11"), "%s", err.msg);
    write_text(path, "1 2x 5");
    ids.n = 0;
    ck_assert_int_eq(mkv_read_token_ids(path, 12, &ids, &err), MKV_EFORMAT);
    ck_assert_msg(strstr(err.msg, "'2x' is not a token id"), "%s", err.msg);
    write_text(path, " \n");
    ids.n = 0;
    ck_assert_int_eq(mkv_read_token_ids(path, 12, &ids, &err), MKV_EFORMAT);
    ck_assert_msg(strstr(err.msg, "no token ids"), "%s", err.msg);
    free(ids.ids);
}
END_TEST

START_TEST(test_output_overwrites)
{
    char a[600], b[600], link_a[600], dot_a[700];
    test_path(a, sizeof a, "in.txt");
    test_path(b, sizeof b, "other.txt");
    test_path(link_a, sizeof link_a, "hard.txt");
    snprintf(dot_a, sizeof dot_a, "%s/./in.txt", test_tmpdir());
    write_text(a, "x");
    write_text(b, "x");
    unlink(link_a);
    ck_assert_int_eq(link(a, link_a), 0);
    ck_assert(mkv_outfile_overwrites(a, a));
    ck_assert(mkv_outfile_overwrites(dot_a, a));
    ck_assert(mkv_outfile_overwrites(link_a, a));
    ck_assert(!mkv_outfile_overwrites(b, a));
    ck_assert(!mkv_outfile_overwrites("-", "-"));
    ck_assert(!mkv_outfile_overwrites(a, "-"));
}
END_TEST

START_TEST(test_run_published_sample)
{
    mkv_error err;
    mkv_prompt_opts po;
    mkv_prompt_opts_init(&po);
    po.text = "Once upon a time";
    mkv_run_model_opts mo = {0};
    mo.path = test_model_file("stories260K.bin");
    mo.need_tokenizer = 1;
    mo.generate = 24;
    mkv_run_model m;
    ck_assert_int_eq(mkv_run_model_open(&mo, &po, &m, &err), MKV_OK);
    ck_assert_int_eq(m.n_layers, 5);
    ck_assert(m.prompt.bos && m.prompt.tokens[0] == m.model->cfg.bos_id);

    mkv_run_opts ro;
    mkv_run_opts_init(&ro);
    ro.generate = 24;
    ro.chunk = 2;   /* a prompt of three chunks */
    ro.last_logits = 1;
    mkv_run r;
    ck_assert_int_eq(mkv_run_init(&r, m.model, m.prompt.tokens, m.prompt.n, &ro, &err), MKV_OK);
    ck_assert_int_eq(mkv_run_go(&r, NULL, NULL, &err), MKV_OK);
    ck_assert_int_eq(mkv_forward_pos(r.fwd), (int)r.n_total);
    ck_assert_int_eq((int)r.n_total, (int)m.prompt.n + 24);
    char *text = mkv_continuation_text(m.lm.tok, r.tokens, r.n_prompt, r.n_total);
    ck_assert_ptr_nonnull(text);
    size_t len = strlen(text);
    ck_assert_msg(len > 60 && strncmp(TEST_PUBLISHED + strlen(po.text), text, len) == 0, "'%s'", text);
    /* the logits after the last token run: their argmax continues the sample */
    int best = 0;
    for (int i = 1; i < m.model->cfg.vocab_size; i++)
        if (r.logits[i] > r.logits[best])
            best = i;
    size_t plen;
    const char *piece = mkv_tokenizer_piece(m.lm.tok, r.tokens[r.n_total - 1], best, &plen);
    ck_assert_ptr_nonnull(piece);
    ck_assert_msg(strncmp(TEST_PUBLISHED + strlen(po.text) + len, piece, plen) == 0, "'%.*s'", (int)plen, piece);
    free(text);
    mkv_run_free(&r);

    /* more than the context left */
    ck_assert_int_eq(mkv_run_check(&m.model->cfg, m.prompt.n, 512, &err), MKV_EFORMAT);
    ck_assert_int_eq(mkv_run_check(&m.model->cfg, 0, 0, &err), MKV_EFORMAT);
    mkv_run_model_free(&m);
}
END_TEST

/* Capture layers 1 and 3 with keys before or after RoPE. */
static void capture_layers(const mkv_model *model, const mkv_prompt *p, int pre, const char *path)
{
    mkv_error err;
    static const int layers[] = {1, 3};
    mkv_capture_opts co;
    mkv_capture_opts_init(&co);
    co.run.chunk = 3;
    co.run.generate = 3;
    co.layers = layers;
    co.n_layers = 2;
    co.k_rope_pre = pre;
    co.window = 4;
    mkv_capture *cap;
    ck_assert_int_eq(mkv_capture_create(model, p->tokens, p->n, &co, &cap, &err), MKV_OK);
    ck_assert_int_eq(cap->n_queries, 7);
    mkv_dump_meta meta;
    mkv_dump_meta_init(&meta);
    mkv_capture_meta(cap, &meta);
    meta.dtype = MKV_DTYPE_F32;
    ck_assert_str_eq(meta.k_rope, pre ? "pre" : "post");
    mkv_dump_write_opts wo;
    mkv_dump_write_opts_init(&wo);
    mkv_dump_writer *w;
    ck_assert_int_eq(mkv_dump_create(path, &meta, &wo, &w, &err), MKV_OK);
    ck_assert_int_eq(mkv_capture_set_attrs(w, &model->cfg, layers, 2, "test", &err), MKV_OK);
    ck_assert_int_eq(mkv_capture_write(cap, w, &err), MKV_OK);
    ck_assert_int_eq(mkv_dump_commit(w, &err), MKV_OK);
    mkv_capture_free(cap);
}

/* Rotate [n][d] rows at positions pos0.. by llama2.c's RoPE (pairs 2j, 2j+1,
 * angle pos * theta^(-2j/d)), in double. */
static void rope_rows(double *x, int n, int d, int pos0, double theta)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < d / 2; j++) {
            double a = (pos0 + i) * pow(theta, -2.0 * j / d), c = cos(a), s = sin(a);
            double *v = x + (size_t)i * d + 2 * j, x0 = v[0], x1 = v[1];
            v[0] = x0 * c - x1 * s;
            v[1] = x0 * s + x1 * c;
        }
}

/* Over test_checkpoint(_i) (tests/model_fixture.py's model, stories260K),
 * its tokenizer found beside it. */
START_TEST(test_capture_pre_post)
{
    mkv_error err;
    mkv_loaded_model lm;
    ck_assert_int_eq(mkv_model_load(test_checkpoint(_i), NULL, &lm, &err), MKV_OK);
    mkv_prompt_opts po;
    mkv_prompt_opts_init(&po);
    po.text = "Once upon a time there";
    mkv_prompt p;
    ck_assert_int_eq(mkv_prompt_tokens(&lm, test_checkpoint(_i), &po, &p, &err), MKV_OK);
    char post_path[600], pre_path[600];
    test_path(post_path, sizeof post_path, "post.h5");
    test_path(pre_path, sizeof pre_path, "pre.h5");
    capture_layers(lm.model, &p, 0, post_path);
    capture_layers(lm.model, &p, 1, pre_path);

    mkv_dump *post, *pre;
    ck_assert_int_eq(mkv_dump_open(post_path, &post, &err), MKV_OK);
    ck_assert_int_eq(mkv_dump_open(pre_path, &pre, &err), MKV_OK);
    const mkv_dump_meta *m = mkv_dump_meta_of(post);
    int T = (int)p.n + 3, W = 7, d = m->head_dim;
    ck_assert_int_eq((int)m->n_tokens, T);
    ck_assert_int_eq((int)m->n_queries, W);
    int32_t qpos[7], tokens[64];
    ck_assert_int_eq(mkv_dump_read_query_pos(post, qpos, &err), MKV_OK);
    for (int i = 0; i < W; i++)
        ck_assert_int_eq(qpos[i], (int)p.n - 4 + i);
    ck_assert_int_eq(mkv_dump_read_tokens(pre, tokens, &err), MKV_OK);
    for (size_t i = 0; i < p.n; i++)
        ck_assert_int_eq(tokens[i], p.tokens[i]);

    /* RoPE applied here to the pre-RoPE keys and queries gives the post-RoPE ones */
    size_t most = (size_t)m->n_heads * T * d;
    float *a = malloc(most * sizeof *a), *b = malloc(most * sizeof *b);
    double *x = malloc(most * sizeof *x);
    ck_assert(a && b && x);
    for (int layer = 0; layer < 2; layer++)
        for (int kind = 0; kind < 2; kind++) {
            int heads = kind ? m->n_heads : m->n_kv_heads, n = kind ? W : T, pos0 = kind ? qpos[0] : 0;
            char k = kind ? 'q' : 'k';
            ck_assert_int_eq(mkv_dump_read(post, layer, k, 0, heads, 0, n, a, &err), MKV_OK);
            ck_assert_int_eq(mkv_dump_read(pre, layer, k, 0, heads, 0, n, b, &err), MKV_OK);
            for (size_t i = 0; i < (size_t)heads * n * d; i++)
                x[i] = b[i];
            double worst = 0;
            for (int h = 0; h < heads; h++) {
                rope_rows(x + (size_t)h * n * d, n, d, pos0, m->rope_theta);
                for (size_t i = (size_t)h * n * d; i < (size_t)(h + 1) * n * d; i++)
                    worst = fmax(worst, fabs(x[i] - a[i]) / (fabs(a[i]) + 1e-3));
            }
            ck_assert_msg(worst < 1e-4, "layer %d %c: relative error %g", layer, k, worst);
            ck_assert_int_eq(mkv_dump_read(post, layer, 'v', 0, m->n_kv_heads, 0, T, a, &err), MKV_OK);
            ck_assert_int_eq(mkv_dump_read(pre, layer, 'v', 0, m->n_kv_heads, 0, T, b, &err), MKV_OK);
            ck_assert_int_eq(memcmp(a, b, (size_t)m->n_kv_heads * T * d * sizeof *a), 0);
        }
    free(a);
    free(b);
    free(x);
    mkv_dump_close(post);
    mkv_dump_close(pre);
    free(p.tokens);
    mkv_loaded_model_free(&lm);
}
END_TEST

int main(void)
{
    int have_stories = test_models_dir() != NULL, have_fixture = test_write_fixture("check_capture");
    Suite *s = suite_create("capture");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_chat_families);
    tcase_add_test(tc, test_chat_chatml);
    tcase_add_test(tc, test_chat_llama_mistral);
    tcase_add_test(tc, test_shape_table);
    tcase_add_test(tc, test_shape_weights);
    tcase_add_test(tc, test_memory_estimate);
    tcase_add_test(tc, test_detect);
    tcase_add_test(tc, test_llama2c_tokenizer_search);
    tcase_add_test(tc, test_layer_list);
    tcase_add_test(tc, test_token_ids);
    tcase_add_test(tc, test_output_overwrites);
    if (have_stories)
        tcase_add_test(tc, test_run_published_sample);
    else
        printf("note: no stories260K: its published-sample run skipped\n");
    test_add_model_loop(tc, test_capture_pre_post, have_fixture, have_stories);
    suite_add_tcase(s, tc);
    int status = test_run(s);
    return status == EXIT_SUCCESS && !have_fixture ? 77 : status;
}
