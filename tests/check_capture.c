/* Chat templates, shape-only models and model format detection.
 *
 * References: the conversations Hugging Face's apply_chat_template renders
 * for the templates quoted here (SmolLM2-135M-Instruct, Qwen2.5, Llama-3,
 * Llama-2, Mistral), written out by hand; the published parameter counts of
 * each model a shape copies; statistics of the random weights; files this
 * test writes with known contents.
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

#include "vocab/chat.h"
#include "model/model_load.h"
#include "model/shapes.h"
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

START_TEST(test_shape_weights)
{
    const mkv_shape *s = mkv_shape_find("qwen2.5-7b");
    mkv_model_config c;
    mkv_error err;
    /* 2 layers of Qwen2.5-7B's shape with a vocabulary of 64 */
    ck_assert_int_eq(mkv_shape_config(s, 2, 64, &c, &err), MKV_OK);
    int pick[2] = {3, 20};
    mkv_model *a, *b, *one;
    ck_assert_int_eq(mkv_shape_build(&c, pick, 9, 1, &a, &err), MKV_OK);
    ck_assert_int_eq(mkv_shape_build(&c, pick, 9, 3, &b, &err), MKV_OK);
    /* the thread count changes nothing */
    ck_assert(memcmp(a->storage, b->storage, a->storage_floats * sizeof(float)) == 0);
    /* layer 20 is layer 20 whatever else is built */
    mkv_model_config c1 = c;
    c1.n_layers = 1;
    ck_assert_int_eq(mkv_shape_build(&c1, &pick[1], 9, 2, &one, &err), MKV_OK);
    size_t wq = (size_t)c.n_heads * c.head_dim * c.dim;
    ck_assert(memcmp(one->layers[0].wq, a->layers[1].wq, wq * sizeof(float)) == 0);
    ck_assert(memcmp(one->layers[0].w2, a->layers[1].w2, (size_t)c.dim * c.hidden_dim * sizeof(float)) == 0);
    ck_assert(memcmp(one->layers[0].wq, a->layers[0].wq, wq * sizeof(float)) != 0);

    /* variances: 1/in for matrices, 0.2^2 for biases; norms 1; uniform
     * draws bounded by sqrt(3) standard deviations */
    const mkv_layer_weights *w = &a->layers[0];
    double in = c.dim, hid = c.hidden_dim;
    ck_assert_double_eq_tol(mean_sq(w->wq, wq) * in, 1.0, 0.01);
    ck_assert_double_eq_tol(mean_sq(w->w2, (size_t)c.dim * c.hidden_dim) * hid, 1.0, 0.01);
    ck_assert_double_eq_tol(mean_sq(w->w1, (size_t)c.dim * c.hidden_dim) * in, 1.0, 0.01);
    ck_assert_double_eq_tol(mean_sq(w->bk, (size_t)c.n_kv_heads * c.head_dim), 0.04, 0.008);
    double bound = sqrt(3.0 / in) * (1 + 1e-6);
    for (size_t i = 0; i < wq; i++)
        ck_assert(fabs(w->wq[i]) <= bound);
    for (int i = 0; i < c.dim; i++)
        ck_assert(w->rms_att[i] == 1.0f && w->rms_ffn[i] == 1.0f && a->rms_final[i] == 1.0f);
    ck_assert(a->classifier != a->tok_embedding);
    /* another seed, other weights */
    mkv_model *d;
    ck_assert_int_eq(mkv_shape_build(&c, pick, 10, 1, &d, &err), MKV_OK);
    ck_assert(memcmp(a->layers[0].wq, d->layers[0].wq, wq * sizeof(float)) != 0);
    mkv_model_free(a);
    mkv_model_free(b);
    mkv_model_free(one);
    mkv_model_free(d);
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

int main(void)
{
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
    suite_add_tcase(s, tc);
    return test_run(s);
}
