/* Model configuration checks and weight storage. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "model/ggml_quant.h"
#include "core/tensor.h"

/* Limits well above any published LLaMA-family model; larger values come
 * from corrupt headers, and rejecting them early gives a clear message
 * instead of a failed multi-terabyte allocation. */
#define MAX_DIM        (1 << 16)
#define MAX_HIDDEN     (1 << 20)
#define MAX_LAYERS     1024
#define MAX_HEADS      1024
#define MAX_HEAD_DIM   1024
#define MAX_VOCAB      (1 << 24)
#define MAX_SEQ_LEN    (1 << 24)

_Static_assert(MAX_HEAD_DIM / 2 <= MKV_ROPE_MAX_PAIRS, "rope_freq_factors too short for MAX_HEAD_DIM");

/* Each tensor starts on a 64-byte boundary inside the storage block. */
#define TENSOR_ALIGN_FLOATS 16

void mkv_model_config_defaults(mkv_model_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->rope_theta = 10000.0;
    cfg->rope_layout = MKV_ROPE_INTERLEAVED;
    cfg->rms_eps = 1e-5f;
    cfg->tied_classifier = 1;
    cfg->has_qkv_bias = 0;
    cfg->bos_id = 1;
    cfg->eos_id = 2;
}

static int check_range(const char *what, const char *field, long value, long lo, long hi,
                       mkv_error *err)
{
    if (value < lo || value > hi)
        return mkv_fail(err, MKV_EFORMAT, "'%s': %s = %ld is out of range [%ld, %ld]",
                        what, field, value, lo, hi);
    return MKV_OK;
}

int mkv_model_config_check(const mkv_model_config *c, const char *what, mkv_error *err)
{
    int rc;
    if ((rc = check_range(what, "dim", c->dim, 1, MAX_DIM, err)) ||
        (rc = check_range(what, "hidden_dim", c->hidden_dim, 1, MAX_HIDDEN, err)) ||
        (rc = check_range(what, "n_layers", c->n_layers, 1, MAX_LAYERS, err)) ||
        (rc = check_range(what, "n_heads", c->n_heads, 1, MAX_HEADS, err)) ||
        (rc = check_range(what, "n_kv_heads", c->n_kv_heads, 1, c->n_heads, err)) ||
        (rc = check_range(what, "head_dim", c->head_dim, 2, MAX_HEAD_DIM, err)) ||
        (rc = check_range(what, "vocab_size", c->vocab_size, 1, MAX_VOCAB, err)) ||
        (rc = check_range(what, "max_seq_len", c->max_seq_len, 1, MAX_SEQ_LEN, err)) ||
        (rc = check_range(what, "rope_dim", c->rope_dim, 2, c->head_dim, err)))
        return rc;
    if (c->n_heads % c->n_kv_heads != 0)
        return mkv_fail(err, MKV_EFORMAT, "'%s': n_heads = %d is not a multiple of n_kv_heads = %d",
                        what, c->n_heads, c->n_kv_heads);
    if ((long)c->n_heads * c->head_dim > MAX_DIM)
        return mkv_fail(err, MKV_EFORMAT, "'%s': n_heads * head_dim = %ld is too large",
                        what, (long)c->n_heads * c->head_dim);
    if (c->rope_dim % 2 != 0)
        return mkv_fail(err, MKV_EFORMAT, "'%s': rope_dim = %d is odd", what, c->rope_dim);
    if (!(c->rope_theta > 1.0 && isfinite(c->rope_theta)))
        return mkv_fail(err, MKV_EFORMAT, "'%s': rope_theta = %g must be a finite number > 1",
                        what, c->rope_theta);
    if (c->rope_layout != MKV_ROPE_INTERLEAVED && c->rope_layout != MKV_ROPE_HALF)
        return mkv_fail(err, MKV_EFORMAT, "'%s': unknown RoPE layout %d", what, (int)c->rope_layout);
    for (int j = 0; c->has_rope_freq_factors && j < c->rope_dim / 2; j++)
        if (!(c->rope_freq_factors[j] > 0.0f && isfinite(c->rope_freq_factors[j])))
            return mkv_fail(err, MKV_EFORMAT, "'%s': RoPE frequency factor %d = %g must be a finite "
                            "number > 0", what, j, (double)c->rope_freq_factors[j]);
    if (!(c->rms_eps > 0.0f && c->rms_eps < 1.0f))
        return mkv_fail(err, MKV_EFORMAT, "'%s': rms_eps = %g must be in (0, 1)",
                        what, (double)c->rms_eps);
    if (c->bos_id < -1 || c->bos_id >= c->vocab_size || c->eos_id < -1 || c->eos_id >= c->vocab_size)
        return mkv_fail(err, MKV_EFORMAT, "'%s': bos/eos ids %d/%d outside the vocabulary of %d",
                        what, c->bos_id, c->eos_id, c->vocab_size);
    if (mkv_model_storage_floats(c) == 0)
        return mkv_fail(err, MKV_ENOMEM, "'%s': the weights' size overflows", what);
    return MKV_OK;
}

void mkv_rope_llama3_factors(double theta, int rope_dim, double factor, double low, double high,
                             double orig, float *out)
{
    const double two_pi = 6.283185307179586;
    double short_wavelen = orig / high, long_wavelen = orig / low;
    for (int j = 0; j < rope_dim / 2; j++) {
        double wavelen = two_pi / pow(theta, -2.0 * j / rope_dim);
        double divisor;
        if (wavelen < short_wavelen) {
            divisor = 1.0;
        } else if (wavelen > long_wavelen) {
            divisor = factor;
        } else {
            /* inv' = (1 - s) inv / factor + s inv, as a divisor of inv */
            double s = (orig / wavelen - low) / (high - low);
            divisor = 1.0 / ((1.0 - s) / factor + s);
        }
        out[j] = (float)divisor;
    }
}

/* Advance *offset past a tensor of n floats, keeping alignment; returns the
 * tensor's start or SIZE_MAX on overflow. */
static size_t place(size_t *offset, size_t n)
{
    size_t start = *offset;
    if (start == SIZE_MAX || n > SIZE_MAX - start - TENSOR_ALIGN_FLOATS) {
        *offset = SIZE_MAX;
        return SIZE_MAX;
    }
    *offset = start + (n + TENSOR_ALIGN_FLOATS - 1) / TENSOR_ALIGN_FLOATS * TENSOR_ALIGN_FLOATS;
    return start;
}

/* Reserve n floats for one tensor; with base non-NULL point *slot at them. */
static void put(float **slot, float *base, size_t *offset, size_t n)
{
    size_t at = place(offset, n);
    if (base && at != SIZE_MAX)
        *slot = base + at;
}

/* A matrix: stored like a vector, or left NULL when the matrices are kept
 * in blocks. */
static void put_matrix(float **slot, float *base, size_t *offset, size_t n, int blocks)
{
    if (!blocks)
        put(slot, base, offset, n);
}

/* Lay the tensors out in one block (the vectors only when `blocks`).  With
 * m == NULL only the total is computed; otherwise m's pointers are set into
 * m->storage.  Shapes are bounded by mkv_model_config_check, so per-tensor
 * products fit in size_t; only the running total can overflow. */
static size_t layout(const mkv_model_config *c, mkv_model *m, int blocks)
{
    size_t off = 0;
    size_t dim = (size_t)c->dim, hid = (size_t)c->hidden_dim;
    size_t q_dim = (size_t)c->n_heads * (size_t)c->head_dim;
    size_t kv_dim = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    size_t embed = (size_t)c->vocab_size * dim;
    float *base = m ? m->storage : NULL;
    float *ignored;
    mkv_layer_weights scratch;

    put_matrix(m ? &m->tok_embedding : &ignored, base, &off, embed, blocks);
    for (int l = 0; l < c->n_layers; l++) {
        mkv_layer_weights *w = m ? &m->layers[l] : &scratch;
        put(&w->rms_att, base, &off, dim);
        put_matrix(&w->wq, base, &off, q_dim * dim, blocks);
        put_matrix(&w->wk, base, &off, kv_dim * dim, blocks);
        put_matrix(&w->wv, base, &off, kv_dim * dim, blocks);
        put_matrix(&w->wo, base, &off, dim * q_dim, blocks);
        if (c->has_qkv_bias) {
            put(&w->bq, base, &off, q_dim);
            put(&w->bk, base, &off, kv_dim);
            put(&w->bv, base, &off, kv_dim);
        }
        put(&w->rms_ffn, base, &off, dim);
        put_matrix(&w->w1, base, &off, hid * dim, blocks);
        put_matrix(&w->w2, base, &off, dim * hid, blocks);
        put_matrix(&w->w3, base, &off, hid * dim, blocks);
    }
    put(m ? &m->rms_final : &ignored, base, &off, dim);
    if (!c->tied_classifier)
        put_matrix(m ? &m->classifier : &ignored, base, &off, embed, blocks);
    return off == SIZE_MAX ? 0 : off;
}

size_t mkv_model_storage_floats(const mkv_model_config *cfg)
{
    return layout(cfg, NULL, 0);
}

static int create(const mkv_model_config *cfg, int blocks, mkv_model **out, mkv_error *err)
{
    *out = NULL;
    int rc = mkv_model_config_check(cfg, cfg->name, err);
    if (rc)
        return rc;
    mkv_model *m = calloc(1, sizeof *m);
    if (!m)
        return mkv_fail(err, MKV_ENOMEM, "out of memory for model '%s'", cfg->name);
    m->cfg = *cfg;
    m->storage_floats = layout(cfg, NULL, blocks);
    m->layers = calloc((size_t)cfg->n_layers, sizeof *m->layers);
    if (!m->layers) {
        free(m);
        return mkv_fail(err, MKV_ENOMEM, "out of memory for model '%s'", cfg->name);
    }
    m->storage = mkv_calloc(m->storage_floats, sizeof(float), "model weights", err);
    if (!m->storage) {
        free(m->layers);
        free(m);
        return err ? err->code : MKV_ENOMEM;
    }
    layout(cfg, m, blocks);
    if (cfg->tied_classifier)
        m->classifier = m->tok_embedding;
    *out = m;
    return MKV_OK;
}

int mkv_model_create(const mkv_model_config *cfg, mkv_model **out, mkv_error *err)
{
    return create(cfg, 0, out, err);
}

int mkv_model_create_blocks(const mkv_model_config *cfg, mkv_model **out, mkv_error *err)
{
    return create(cfg, 1, out, err);
}

int mkv_model_alloc_blocks(mkv_model *m, size_t bytes, mkv_error *err)
{
    if (!(m->blocks = mkv_calloc(bytes ? bytes : 1, 1, "model weight blocks", err)))
        return err ? err->code : MKV_ENOMEM;
    m->block_bytes = bytes;
    return MKV_OK;
}

int mkv_model_widest_input(const mkv_model_config *cfg)
{
    int q_dim = cfg->n_heads * cfg->head_dim, w = cfg->dim > cfg->hidden_dim ? cfg->dim : cfg->hidden_dim;
    return q_dim > w ? q_dim : w;
}

int mkv_model_has_blocks(const mkv_model *m)
{
    return m->blocks != NULL;
}

void mkv_matrix_rows(const float *w, const mkv_qmatrix *q, size_t cols, size_t r0, size_t n, float *dst)
{
    if (w)
        memcpy(dst, w + r0 * cols, n * cols * sizeof(float));
    else
        mkv_ggml_dequantize(q->type, q->data + r0 * q->row_bytes, dst, (uint64_t)(n * cols), NULL);
}

void mkv_model_free(mkv_model *m)
{
    if (!m)
        return;
    mkv_free(m->storage);
    mkv_free(m->blocks);
    free(m->layers);
    free(m);
}
