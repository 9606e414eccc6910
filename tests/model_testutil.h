/* Small models written by the tests themselves: random weights of a given
 * config, and a llama2.c checkpoint of them for tests/model_ref.py (or
 * for the loaders). */
#ifndef MKV_MODEL_TESTUTIL_H
#define MKV_MODEL_TESTUTIL_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "testutil.h"

static inline void layer_tensors(const mkv_model_config *c, const mkv_layer_weights *w, float *ptrs[9],
                          size_t sizes[9])
{
    size_t dim = (size_t)c->dim, hid = (size_t)c->hidden_dim;
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    float *p[9] = {w->rms_att, w->wq, w->wk, w->wv, w->wo, w->rms_ffn, w->w1, w->w2, w->w3};
    size_t s[9] = {dim, qd * dim, kvd * dim, kvd * dim, dim * qd, dim, hid * dim, dim * hid, hid * dim};
    memcpy(ptrs, p, sizeof p);
    memcpy(sizes, s, sizeof s);
}

/* A small decoder: GQA group 2, head_dim 16, a context long enough for
 * several pages of 16 tokens. */
static inline void test_decode_config(mkv_model_config *c)
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

/* n token ids below vocab from a seeded LCG. */
static inline int32_t *test_tokens(int n, int vocab, uint64_t seed)
{
    int32_t *t = malloc((size_t)n * sizeof *t);
    ck_assert_ptr_nonnull(t);
    for (int i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = (int32_t)((seed >> 33) % (uint64_t)vocab);
    }
    return t;
}

static inline mkv_model *random_model(const mkv_model_config *c, uint64_t seed)
{
    mkv_model *m;
    mkv_error err;
    ck_assert_msg(mkv_model_create(c, &m, &err) == MKV_OK, "%s", err.msg);
    size_t embed = (size_t)c->vocab_size * c->dim;
    test_fill(m->tok_embedding, embed, &seed, 0.0, 1.0);
    for (int l = 0; l < c->n_layers; l++) {
        float *p[9];
        size_t s[9];
        layer_tensors(c, &m->layers[l], p, s);
        for (int t = 0; t < 9; t++) {
            int is_norm = t == 0 || t == 5;
            test_fill(p[t], s[t], &seed, is_norm ? 1.0 : 0.0, is_norm ? 0.2 : 0.3);
        }
        if (c->has_qkv_bias) {
            size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
            test_fill(m->layers[l].bq, qd, &seed, 0.0, 0.5);
            test_fill(m->layers[l].bk, kvd, &seed, 0.0, 0.5);
            test_fill(m->layers[l].bv, kvd, &seed, 0.0, 0.5);
        }
    }
    test_fill(m->rms_final, (size_t)c->dim, &seed, 1.0, 0.2);
    if (!c->tied_classifier)
        test_fill(m->classifier, embed, &seed, 0.0, 0.5);
    return m;
}

/* Write m as a llama2.c version-0 checkpoint, laid out as README.md says. */
static inline void write_llama2c(const char *path, const mkv_model *m)
{
    const mkv_model_config *c = &m->cfg;
    FILE *fp = fopen(path, "wb");
    ck_assert_ptr_nonnull(fp);
    int32_t h[7] = {c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads,
                    c->tied_classifier ? c->vocab_size : -c->vocab_size, c->max_seq_len};
    fwrite(h, sizeof h, 1, fp);
    size_t embed = (size_t)c->vocab_size * c->dim;
    fwrite(m->tok_embedding, sizeof(float), embed, fp);
    for (int t = 0; t < 9; t++) {
        for (int l = 0; l < c->n_layers; l++) {
            float *p[9];
            size_t s[9];
            layer_tensors(c, &m->layers[l], p, s);
            fwrite(p[t], sizeof(float), s[t], fp);
        }
    }
    fwrite(m->rms_final, sizeof(float), (size_t)c->dim, fp);
    /* Legacy RoPE tables: garbage the loader must skip. */
    for (size_t i = 0; i < (size_t)c->max_seq_len * c->head_dim; i++) {
        float junk = 1e30f;
        fwrite(&junk, sizeof junk, 1, fp);
    }
    if (!c->tied_classifier)
        fwrite(m->classifier, sizeof(float), embed, fp);
    ck_assert_int_eq(ferror(fp), 0);
    ck_assert_int_eq(fclose(fp), 0);
}

#endif
