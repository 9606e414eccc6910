/* The "llama" architecture of a GGUF file: configuration from the llama.*
 * metadata, weights from the tensors, and the loader over both. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/tensor.h"
#include "model/ggml_quant.h"
#include "model/gguf.h"
#include "model/gguf_priv.h"

typedef struct {
    const mkv_gguf *g;
    const char *path;
    const char *arch;
    mkv_error *err;
} meta;

/* Integer arch.suffix in [lo, hi]; def when absent and not required. */
static int meta_int(const meta *m, const char *suffix, int required, int64_t def, int64_t lo,
                    int64_t hi, int *out)
{
    char key[256];
    snprintf(key, sizeof key, "%s.%s", m->arch, suffix);
    const mkv_gguf_value *v = mkv_gguf_find(m->g, key);
    int64_t x = def;
    if (!v) {
        if (required)
            return mkv_fail(m->err, MKV_EFORMAT, "'%s': metadata '%s' is missing", m->path, key);
    } else if (v->type == MKV_GGUF_ARRAY) {
        return mkv_fail(m->err, MKV_EUNSUP, "'%s': '%s' is per-layer (an array); only models with "
                        "the same value in every layer are supported", m->path, key);
    } else if (mkv_gguf_value_int(v, &x) != 0) {
        return mkv_fail(m->err, MKV_EFORMAT, "'%s': '%s' is a %s, not an integer", m->path, key,
                        mkv_gguf_type_name(v->type));
    }
    if (x < lo || x > hi)
        return mkv_fail(m->err, MKV_EFORMAT, "'%s': '%s' = %lld is out of range [%lld, %lld]",
                        m->path, key, (long long)x, (long long)lo, (long long)hi);
    *out = (int)x;
    return MKV_OK;
}

static int meta_float(const meta *m, const char *suffix, double def, double *out)
{
    char key[256];
    snprintf(key, sizeof key, "%s.%s", m->arch, suffix);
    const mkv_gguf_value *v = mkv_gguf_find(m->g, key);
    *out = def;
    if (v && mkv_gguf_value_float(v, out) != 0)
        return mkv_fail(m->err, MKV_EFORMAT, "'%s': '%s' is a %s, not a number", m->path, key,
                        mkv_gguf_type_name(v->type));
    if (!isfinite(*out))
        return mkv_fail(m->err, MKV_EFORMAT, "'%s': '%s' is not finite", m->path, key);
    return MKV_OK;
}

/* RoPE frequency divisors, as llama.cpp applies them: rope_freqs.weight
 * (one per rotated pair; Llama 3.1 files carry it) times the linear factor
 * of arch.rope.scaling.factor (or the older arch.rope.scale_linear) unless
 * arch.rope.scaling.type is "none".  Other scaling types are refused by
 * name.  c->rope_dim must be set. */
static int rope_scaling(const mkv_gguf *g, const meta *m, mkv_model_config *c, mkv_error *err)
{
    const char *path = mkv_gguf_path(g);
    double scale;
    int rc, pairs = c->rope_dim / 2;
    if ((rc = meta_float(m, "rope.scaling.factor", 0.0, &scale)))
        return rc;
    if (scale == 0.0 && (rc = meta_float(m, "rope.scale_linear", 0.0, &scale)))
        return rc;
    if (scale < 0.0)
        return mkv_fail(err, MKV_EFORMAT, "'%s': RoPE scaling factor %g is negative", path, scale);
    char key[256];
    snprintf(key, sizeof key, "%s.rope.scaling.type", m->arch);
    const mkv_gguf_value *type = mkv_gguf_find(g, key);
    const char *scaling = type ? mkv_gguf_value_str(type, NULL) : "linear";
    if (!scaling)
        return mkv_fail(err, MKV_EFORMAT, "'%s': '%s' is a %s, not a string", path, key,
                        mkv_gguf_type_name(type->type));
    if (!strcmp(scaling, "none") || scale == 0.0)
        scale = 1.0;
    if (scale != 1.0 && strcmp(scaling, "linear") != 0)
        return mkv_fail(err, MKV_EUNSUP, "'%s': RoPE scaling of type '%.64s' (factor %g) is not "
                        "supported (supported: none, linear, rope_freqs.weight)", path, scaling, scale);

    const mkv_gguf_tensor *t = mkv_gguf_find_tensor(g, "rope_freqs.weight");
    if (!t && scale == 1.0)
        return MKV_OK;
    if (pairs < 1 || pairs > MKV_ROPE_MAX_PAIRS)
        return mkv_fail(err, MKV_EFORMAT, "'%s': scaled RoPE over %d channels per head (supported: "
                        "2 to %d)", path, c->rope_dim, 2 * MKV_ROPE_MAX_PAIRS);
    if (t) {
        if (t->n_dims != 1 || t->ne[0] != (uint64_t)pairs)
            return mkv_fail(err, MKV_EFORMAT, "'%s': tensor 'rope_freqs.weight' must be a vector of "
                            "%d values (one per rotated pair)", path, pairs);
        if ((rc = mkv_gguf_dequantize(g, t, c->rope_freq_factors, err)))
            return rc;
        for (int j = 0; j < pairs; j++)
            if (!(c->rope_freq_factors[j] > 0.0f && isfinite(c->rope_freq_factors[j])))
                return mkv_fail(err, MKV_EFORMAT, "'%s': tensor 'rope_freqs.weight' holds %g at "
                                "element %d (frequency divisors must be finite and > 0)", path,
                                (double)c->rope_freq_factors[j], j);
    } else {
        for (int j = 0; j < pairs; j++)
            c->rope_freq_factors[j] = 1.0f;
    }
    for (int j = 0; j < pairs; j++)
        c->rope_freq_factors[j] = (float)(c->rope_freq_factors[j] * scale);
    c->has_rope_freq_factors = 1;
    return MKV_OK;
}

static int read_config(const mkv_gguf *g, mkv_model_config *c, mkv_error *err)
{
    const char *path = mkv_gguf_path(g);
    size_t arch_len;
    const char *arch = mkv_gguf_value_str(mkv_gguf_find(g, "general.architecture"), &arch_len);
    if (!arch)
        return mkv_fail(err, MKV_EFORMAT, "'%s': general.architecture is missing", path);
    if (strcmp(arch, "llama") != 0)
        return mkv_fail(err, MKV_EUNSUP, "'%s': architecture '%.64s' is not supported (only 'llama')",
                        path, arch);
    meta m = {g, path, arch, err};
    int rc, experts = 0, key_len, value_len;
    mkv_model_config_defaults(c);
    if ((rc = meta_int(&m, "expert_count", 0, 0, 0, INT32_MAX, &experts)))
        return rc;
    if (experts > 0)
        return mkv_fail(err, MKV_EUNSUP, "'%s': mixture-of-experts models (%s.expert_count = %d) are "
                        "not supported", path, arch, experts);
    if ((rc = meta_int(&m, "embedding_length", 1, 0, 1, INT32_MAX, &c->dim)) ||
        (rc = meta_int(&m, "feed_forward_length", 1, 0, 1, INT32_MAX, &c->hidden_dim)) ||
        (rc = meta_int(&m, "block_count", 1, 0, 1, INT32_MAX, &c->n_layers)) ||
        (rc = meta_int(&m, "context_length", 1, 0, 1, INT32_MAX, &c->max_seq_len)) ||
        (rc = meta_int(&m, "attention.head_count", 1, 0, 1, INT32_MAX, &c->n_heads)) ||
        (rc = meta_int(&m, "attention.head_count_kv", 0, c->n_heads, 1, INT32_MAX, &c->n_kv_heads)))
        return rc;
    if ((rc = meta_int(&m, "attention.key_length", 0, c->dim / c->n_heads, 1, INT32_MAX, &key_len)) ||
        (rc = meta_int(&m, "attention.value_length", 0, key_len, 1, INT32_MAX, &value_len)))
        return rc;
    if (value_len != key_len)
        return mkv_fail(err, MKV_EUNSUP, "'%s': key length %d differs from value length %d", path,
                        key_len, value_len);
    c->head_dim = key_len;
    if ((rc = meta_int(&m, "rope.dimension_count", 0, c->head_dim, 1, INT32_MAX, &c->rope_dim)))
        return rc;
    double theta, eps;
    if ((rc = meta_float(&m, "rope.freq_base", 10000.0, &theta)) ||
        (rc = meta_float(&m, "attention.layer_norm_rms_epsilon", 1e-5, &eps)) ||
        (rc = rope_scaling(g, &m, c, err)))
        return rc;
    c->rope_theta = theta;
    c->rms_eps = (float)eps;
    c->rope_layout = MKV_ROPE_INTERLEAVED;
    const mkv_gguf_tensor *embd = mkv_gguf_find_tensor(g, "token_embd.weight");
    if (!embd)
        return mkv_fail(err, MKV_EFORMAT, "'%s': tensor 'token_embd.weight' is missing", path);
    if (embd->n_dims != 2 || embd->ne[1] > INT32_MAX)
        return mkv_fail(err, MKV_EFORMAT, "'%s': tensor 'token_embd.weight' is not a matrix of at "
                        "most 2^31 rows", path);
    c->vocab_size = (int)embd->ne[1];
    int vocab;
    if ((rc = meta_int(&m, "vocab_size", 0, c->vocab_size, 1, INT32_MAX, &vocab)))
        return rc;
    if (vocab != c->vocab_size)
        return mkv_fail(err, MKV_EFORMAT, "'%s': %s.vocab_size = %d but token_embd.weight has %d rows",
                        path, arch, vocab, c->vocab_size);
    c->tied_classifier = mkv_gguf_find_tensor(g, "output.weight") == NULL;
    c->has_qkv_bias = mkv_gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL;
    if ((rc = mkv_gguf_token_id(g, "tokenizer.ggml.bos_token_id", -1, c->vocab_size, &c->bos_id, err)) ||
        (rc = mkv_gguf_token_id(g, "tokenizer.ggml.eos_token_id", -1, c->vocab_size, &c->eos_id, err)))
        return rc;
    const char *name = mkv_gguf_value_str(mkv_gguf_find(g, "general.name"), NULL);
    if (!name || !*name) {
        name = strrchr(path, '/');
        name = name ? name + 1 : path;
    }
    snprintf(c->name, sizeof c->name, "%s", name);
    return mkv_model_config_check(c, path, err);
}

typedef struct {
    char name[64];
    float *dst;        /* NULL: a matrix kept in blocks at *q */
    mkv_qmatrix *q;
    uint64_t ne0, ne1; /* ne1 = 0: a vector */
} expected_tensor;

/* Each matrix's blocks start on a 64-byte boundary of m->blocks. */
#define BLOCK_ALIGN 64

static uint64_t aligned_bytes(uint64_t n) { return (n + BLOCK_ALIGN - 1) / BLOCK_ALIGN * BLOCK_ALIGN; }

/* Copy matrix t's blocks to m->blocks at *at and point q at them; the
 * rows must be whole blocks and every value finite (checked a chunk of
 * rows at a time through scratch, `cols` * SCRATCH_ROWS floats). */
#define SCRATCH_ROWS 64
static int keep_blocks(const mkv_gguf *g, const mkv_gguf_tensor *t, mkv_model *m, size_t *at,
                       mkv_qmatrix *q, float *scratch, mkv_error *err)
{
    const char *path = mkv_gguf_path(g);
    uint64_t cols = t->ne[0], rows = t->ne[1];
    uint32_t block = mkv_ggml_block_size(t->type);
    if (cols % block != 0)
        return mkv_fail(err, MKV_EFORMAT, "'%s': tensor '%s' has rows of %llu elements, not whole "
                        "%u-element blocks of %s", path, t->name, (unsigned long long)cols, block,
                        mkv_ggml_type_name(t->type));
    size_t row_bytes = (size_t)(cols / block) * mkv_ggml_type_size(t->type);
    if ((uint64_t)row_bytes * rows != t->nbytes || *at + t->nbytes > m->block_bytes)
        return mkv_fail(err, MKV_EFORMAT, "'%s': tensor '%s' holds %llu bytes, its shape and type "
                        "imply %llu", path, t->name, (unsigned long long)t->nbytes,
                        (unsigned long long)row_bytes * rows);
    memcpy(m->blocks + *at, t->data, t->nbytes);
    *q = (mkv_qmatrix){m->blocks + *at, row_bytes, t->type};
    *at += aligned_bytes(t->nbytes);
    for (uint64_t r0 = 0; r0 < rows; r0 += SCRATCH_ROWS) {
        uint64_t n = rows - r0 < SCRATCH_ROWS ? rows - r0 : SCRATCH_ROWS;
        mkv_matrix_rows(NULL, q, cols, r0, n, scratch);
        for (uint64_t j = 0; j < n * cols; j++)
            if (!isfinite(scratch[j]))
                return mkv_fail(err, MKV_EFORMAT, "'%s': tensor '%s' holds a non-finite value at "
                                "element %llu", path, t->name, (unsigned long long)(r0 * cols + j));
    }
    return MKV_OK;
}

int mkv_gguf_model(const mkv_gguf *g, int blocks, mkv_model **out, mkv_error *err)
{
    const char *path = mkv_gguf_path(g);
    *out = NULL;
    mkv_model_config c;
    int rc = read_config(g, &c, err);
    if (rc)
        return rc;
    mkv_model *m;
    if ((rc = blocks ? mkv_model_create_blocks(&c, &m, err) : mkv_model_create(&c, &m, err)))
        return rc;
    float *scratch = NULL;
    size_t n_expected = 3 + (size_t)c.n_layers * 12;
    expected_tensor *ex = calloc(n_expected, sizeof *ex);
    unsigned char *used = calloc(mkv_gguf_n_tensors(g) ? mkv_gguf_n_tensors(g) : 1, 1);
    if (!ex || !used) {
        rc = mkv_fail(err, MKV_ENOMEM, "'%s': out of memory", path);
        goto done;
    }
    uint64_t dim = (uint64_t)c.dim, hid = (uint64_t)c.hidden_dim;
    uint64_t qd = (uint64_t)c.n_heads * c.head_dim, kvd = (uint64_t)c.n_kv_heads * c.head_dim;
    size_t k = 0;
    ex[k++] = (expected_tensor){"token_embd.weight", m->tok_embedding, &m->qtok_embedding, dim,
                                (uint64_t)c.vocab_size};
    ex[k++] = (expected_tensor){"output_norm.weight", m->rms_final, NULL, dim, 0};
    if (!c.tied_classifier)
        ex[k++] = (expected_tensor){"output.weight", m->classifier, &m->qclassifier, dim,
                                    (uint64_t)c.vocab_size};
    for (int l = 0; l < c.n_layers; l++) {
        mkv_layer_weights *w = &m->layers[l];
        struct { const char *suffix; float *dst; mkv_qmatrix *q; uint64_t ne0, ne1; } layer[] = {
            {"attn_norm.weight", w->rms_att, NULL, dim, 0},   {"attn_q.weight", w->wq, &w->qwq, dim, qd},
            {"attn_k.weight", w->wk, &w->qwk, dim, kvd},      {"attn_v.weight", w->wv, &w->qwv, dim, kvd},
            {"attn_output.weight", w->wo, &w->qwo, qd, dim},  {"ffn_norm.weight", w->rms_ffn, NULL, dim, 0},
            {"ffn_gate.weight", w->w1, &w->qw1, dim, hid},    {"ffn_down.weight", w->w2, &w->qw2, hid, dim},
            {"ffn_up.weight", w->w3, &w->qw3, dim, hid},      {"attn_q.bias", w->bq, NULL, qd, 0},
            {"attn_k.bias", w->bk, NULL, kvd, 0},             {"attn_v.bias", w->bv, NULL, kvd, 0},
        };
        for (size_t i = 0; i < sizeof layer / sizeof layer[0]; i++) {
            if (i >= 9 && !c.has_qkv_bias)
                break;
            expected_tensor *e = &ex[k++];
            snprintf(e->name, sizeof e->name, "blk.%d.%s", l, layer[i].suffix);
            e->dst = layer[i].dst;
            e->q = layer[i].q;
            e->ne0 = layer[i].ne0;
            e->ne1 = layer[i].ne1;
        }
    }
    /* Check names, shapes and types of everything before the slow part. */
    for (size_t i = 0; i < k; i++) {
        const mkv_gguf_tensor *t = mkv_gguf_find_tensor(g, ex[i].name);
        if (!t) {
            rc = mkv_fail(err, MKV_EFORMAT, "'%s': tensor '%s' is missing", path, ex[i].name);
            goto done;
        }
        used[t - mkv_gguf_tensor_at(g, 0)] = 1;
        int ok = ex[i].ne1 ? t->n_dims == 2 && t->ne[0] == ex[i].ne0 && t->ne[1] == ex[i].ne1
                           : t->n_dims == 1 && t->ne[0] == ex[i].ne0;
        if (!ok) {
            char want[64], got[128];
            if (ex[i].ne1)
                snprintf(want, sizeof want, "[%llu, %llu]", (unsigned long long)ex[i].ne0,
                         (unsigned long long)ex[i].ne1);
            else
                snprintf(want, sizeof want, "[%llu]", (unsigned long long)ex[i].ne0);
            int at = snprintf(got, sizeof got, "[");
            for (uint32_t d = 0; d < t->n_dims; d++)
                at += snprintf(got + at, sizeof got - (size_t)at, "%s%llu", d ? ", " : "",
                               (unsigned long long)t->ne[d]);
            snprintf(got + at, sizeof got - (size_t)at, "]");
            rc = mkv_fail(err, MKV_EFORMAT, "'%s': tensor '%s' has shape %s (ne), the configuration "
                          "implies %s", path, ex[i].name, got, want);
            goto done;
        }
        if ((rc = mkv_gguf_check_dequantizable(g, t, err)))
            goto done;
    }
    const mkv_gguf_tensor *freqs = mkv_gguf_find_tensor(g, "rope_freqs.weight");
    if (freqs) /* read into the config by read_config */
        used[freqs - mkv_gguf_tensor_at(g, 0)] = 1;
    for (uint64_t i = 0; i < mkv_gguf_n_tensors(g); i++) {
        if (!used[i]) {
            rc = mkv_fail(err, MKV_EUNSUP, "'%s': tensor '%s' is not part of a LLaMA model this "
                          "loader knows", path, mkv_gguf_tensor_at(g, i)->name);
            goto done;
        }
    }
    if (blocks) {
        uint64_t total = 0;
        for (size_t i = 0; i < k; i++)
            if (!ex[i].dst)
                total += aligned_bytes(mkv_gguf_find_tensor(g, ex[i].name)->nbytes);
        if ((rc = mkv_model_alloc_blocks(m, (size_t)total, err)))
            goto done;
        if (!(scratch = mkv_calloc((size_t)SCRATCH_ROWS * (size_t)mkv_model_widest_input(&c), sizeof(float),
                                   "weight rows", err))) {
            rc = err ? err->code : MKV_ENOMEM;
            goto done;
        }
    }
    size_t at = 0;
    for (size_t i = 0; i < k; i++) {
        const mkv_gguf_tensor *t = mkv_gguf_find_tensor(g, ex[i].name);
        if (!ex[i].dst) {
            if ((rc = keep_blocks(g, t, m, &at, ex[i].q, scratch, err)))
                goto done;
            mkv_gguf_release(g, t);
            continue;
        }
        if ((rc = mkv_gguf_dequantize(g, t, ex[i].dst, err)))
            goto done;
        mkv_gguf_release(g, t);
        for (uint64_t j = 0; j < t->n_elements; j++) {
            if (!isfinite(ex[i].dst[j])) {
                rc = mkv_fail(err, MKV_EFORMAT, "'%s': tensor '%s' holds a non-finite value at "
                              "element %llu", path, ex[i].name, (unsigned long long)j);
                goto done;
            }
        }
    }
    if (blocks && c.tied_classifier)
        m->qclassifier = m->qtok_embedding;
done:
    free(ex);
    free(used);
    mkv_free(scratch);
    if (rc) {
        mkv_model_free(m);
        return rc;
    }
    *out = m;
    return MKV_OK;
}

int mkv_gguf_load(const char *path, int blocks, mkv_model **model, mkv_tokenizer **tok,
                  mkv_gguf_extra *extra, mkv_error *err)
{
    *model = NULL;
    if (tok)
        *tok = NULL;
    if (extra)
        memset(extra, 0, sizeof *extra);
    mkv_gguf *g;
    int rc = mkv_gguf_open(path, &g, err);
    if (rc)
        return rc;
    mkv_model *m = NULL;
    mkv_tokenizer *t = NULL;
    mkv_gguf_extra x = {0};
    if ((rc = mkv_gguf_model(g, blocks, &m, err)))
        goto done;
    if (tok) {
        if ((rc = mkv_gguf_tokenizer(g, &t, err)))
            goto done;
        if (t->vocab_size != m->cfg.vocab_size) {
            rc = mkv_fail(err, MKV_EFORMAT, "'%s': the vocabulary has %d tokens, the model %d",
                          path, t->vocab_size, m->cfg.vocab_size);
            goto done;
        }
    }
    if (extra && (rc = mkv_gguf_extra_get(g, &x, err)))
        goto done;
done:
    mkv_gguf_close(g);
    if (rc) {
        mkv_model_free(m);
        mkv_tokenizer_free(t);
        mkv_gguf_extra_free(&x);
        return rc;
    }
    *model = m;
    if (tok)
        *tok = t;
    if (extra)
        *extra = x;
    return MKV_OK;
}
