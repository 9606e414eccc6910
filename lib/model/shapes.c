/* Shape-only models: published shapes, seeded random weights. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "core/rng.h"
#include "model/shapes.h"
#include "core/tasks.h"

/* Shapes from the models' published config.json files. */
static const mkv_shape SHAPES[] = {
    /* name, description, layers, dim, heads, kv, head_dim, hidden, vocab, ctx,
       theta, eps, tied, bias, bos, eos, add_bos[, RoPE scaling] */
    {"llama3.1-8b", "Llama-3.1-8B", 32, 4096, 32, 8, 128, 14336, 128256, 131072,
     500000.0, 1e-5f, 0, 0, 128000, 128001, 1, 8.0, 1.0, 4.0, 8192.0},
    {"qwen2.5-7b", "Qwen2.5-7B", 28, 3584, 28, 4, 128, 18944, 152064, 32768,
     1000000.0, 1e-6f, 0, 1, -1, 151643, 0, 0, 0, 0, 0},
    {"smollm2-135m", "SmolLM2-135M", 30, 576, 9, 3, 64, 1536, 49152, 8192,
     100000.0, 1e-5f, 1, 0, 1, 2, 0, 0, 0, 0, 0},
    {"llama2-7b", "Llama-2-7B", 32, 4096, 32, 32, 128, 11008, 32000, 4096,
     10000.0, 1e-5f, 0, 0, 1, 2, 1, 0, 0, 0, 0},
    {"mistral-7b", "Mistral-7B-v0.3", 32, 4096, 32, 8, 128, 14336, 32768, 32768,
     1000000.0, 1e-5f, 0, 0, 1, 2, 1, 0, 0, 0, 0},
    {"ministral-8b", "Ministral-8B-Instruct-2410", 36, 4096, 32, 8, 128, 12288, 131072, 32768,
     100000000.0, 1e-5f, 0, 0, 1, 2, 1, 0, 0, 0, 0},
};
#define N_SHAPES ((int)(sizeof SHAPES / sizeof *SHAPES))

const mkv_shape *mkv_shape_at(int i) { return i >= 0 && i < N_SHAPES ? &SHAPES[i] : NULL; }

const mkv_shape *mkv_shape_find(const char *name)
{
    for (int i = 0; i < N_SHAPES; i++)
        if (strcasecmp(SHAPES[i].name, name) == 0)
            return &SHAPES[i];
    return NULL;
}

const char *mkv_shape_names(void)
{
    static char names[512];
    if (!names[0])
        for (int i = 0; i < N_SHAPES; i++) {
            size_t at = strlen(names);
            snprintf(names + at, sizeof names - at, "%s%s", i ? ", " : "", SHAPES[i].name);
        }
    return names;
}

int mkv_shape_config(const mkv_shape *s, int n_layers, int vocab, mkv_model_config *c,
                     mkv_error *err)
{
    mkv_model_config_defaults(c);
    snprintf(c->name, sizeof c->name, "shape:%s", s->name);
    c->dim = s->dim;
    c->hidden_dim = s->hidden_dim;
    c->n_layers = n_layers > 0 ? n_layers : s->n_layers;
    c->n_heads = s->n_heads;
    c->n_kv_heads = s->n_kv_heads;
    c->head_dim = s->head_dim;
    c->vocab_size = vocab > 0 ? vocab : s->vocab_size;
    c->max_seq_len = s->max_seq_len;
    c->rope_dim = s->head_dim;
    c->rope_theta = s->rope_theta;
    c->rope_layout = MKV_ROPE_HALF;
    c->rms_eps = s->rms_eps;
    c->tied_classifier = s->tied_classifier;
    c->has_qkv_bias = s->has_qkv_bias;
    if (s->rope_factor > 0) {
        c->has_rope_freq_factors = 1;
        mkv_rope_llama3_factors(s->rope_theta, c->rope_dim, s->rope_factor, s->rope_low, s->rope_high,
                                s->rope_orig, c->rope_freq_factors);
    }
    c->bos_id = s->bos_id < c->vocab_size ? s->bos_id : -1;
    c->eos_id = s->eos_id < c->vocab_size ? s->eos_id : -1;
    return mkv_model_config_check(c, c->name, err);
}

/* ------------------------------------------------------------ filling */

/* Floats per block: one substream each, the unit of work of a thread. */
#define BLOCK_FLOATS ((size_t)1 << 20)
/* Tensor keys of the substreams (stable: changing them changes every model). */
enum { T_EMBED, T_RMS_ATT, T_WQ, T_WK, T_WV, T_WO, T_BQ, T_BK, T_BV, T_RMS_FFN, T_W1, T_W2, T_W3,
       T_RMS_FINAL, T_CLASSIFIER };
#define BIAS_STD 0.2
/* Layer key of tensors outside the layers. */
#define NO_LAYER UINT64_MAX

typedef struct {
    float *dst;
    size_t n;
    double std;        /* 0: constant 1 (norm weights) */
    uint64_t layer, tensor;
} fill_tensor;

typedef struct {
    const fill_tensor *tensors;
    int n_tensors;
    size_t *first_block;  /* [n_tensors + 1]: block index where each tensor starts */
    uint64_t seed;
} fill_job;

/* One block of BLOCK_FLOATS floats (a task of mkv_run_tasks). */
static int fill_block(void *ctx, int task, mkv_error *err)
{
    (void)err;
    const fill_job *job = ctx;
    const size_t block = (size_t)task;
    int t = 0;
    while (job->first_block[t + 1] <= block)
        t++;
    const fill_tensor *ft = &job->tensors[t];
    size_t b = block - job->first_block[t];
    size_t start = b * BLOCK_FLOATS;
    size_t n = ft->n - start < BLOCK_FLOATS ? ft->n - start : BLOCK_FLOATS;
    float *dst = ft->dst + start;
    if (ft->std == 0.0) {
        for (size_t i = 0; i < n; i++)
            dst[i] = 1.0f;
        return MKV_OK;
    }
    uint64_t keys[3] = {ft->layer, ft->tensor, (uint64_t)b};
    mkv_rng r;
    mkv_rng_seed_stream(&r, job->seed, keys, 3);
    /* uniform on [-a, a] has variance a^2/3 */
    double a = sqrt(3.0) * ft->std;
    const double scale = 1.0 / 16777216.0;  /* 24-bit uniforms */
    for (size_t i = 0; i < n; i += 2) {
        uint64_t x = mkv_rng_next(&r);
        dst[i] = (float)((2.0 * (double)(x >> 40) * scale - 1.0) * a);
        if (i + 1 < n)
            dst[i + 1] = (float)((2.0 * (double)((x >> 8) & 0xFFFFFF) * scale - 1.0) * a);
    }
    return MKV_OK;
}

static void add(fill_tensor *list, int *n, float *dst, size_t count, double std, uint64_t layer,
                uint64_t tensor)
{
    list[(*n)++] = (fill_tensor){dst, count, std, layer, tensor};
}

int mkv_shape_build(const mkv_model_config *cfg, const int *layer_index, uint64_t seed,
                    int threads, mkv_model **out, mkv_error *err)
{
    *out = NULL;
    mkv_model *m;
    int rc = mkv_model_create(cfg, &m, err);
    if (rc)
        return rc;
    const mkv_model_config *c = &m->cfg;
    size_t dim = (size_t)c->dim, hid = (size_t)c->hidden_dim;
    size_t q_dim = (size_t)c->n_heads * (size_t)c->head_dim;
    size_t kv_dim = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    size_t embed = (size_t)c->vocab_size * dim;
    double in_dim = 1.0 / sqrt((double)dim);

    int max_tensors = 3 + 12 * c->n_layers;
    fill_tensor *list = malloc((size_t)max_tensors * sizeof *list);
    size_t *first = malloc(((size_t)max_tensors + 1) * sizeof *first);
    if (!list || !first) {
        free(list);
        free(first);
        mkv_model_free(m);
        return mkv_fail(err, MKV_ENOMEM, "out of memory building '%s'", c->name);
    }
    int n = 0;
    /* The embedding has the classifier's scale, so tied logits have unit
     * variance; the first RMSNorm makes the scale irrelevant to layer 0. */
    add(list, &n, m->tok_embedding, embed, in_dim, NO_LAYER, T_EMBED);
    for (int l = 0; l < c->n_layers; l++) {
        const mkv_layer_weights *w = &m->layers[l];
        uint64_t key = (uint64_t)(layer_index ? layer_index[l] : l);
        add(list, &n, w->rms_att, dim, 0.0, key, T_RMS_ATT);
        add(list, &n, w->wq, q_dim * dim, in_dim, key, T_WQ);
        add(list, &n, w->wk, kv_dim * dim, in_dim, key, T_WK);
        add(list, &n, w->wv, kv_dim * dim, in_dim, key, T_WV);
        add(list, &n, w->wo, dim * q_dim, 1.0 / sqrt((double)q_dim), key, T_WO);
        if (c->has_qkv_bias) {
            add(list, &n, w->bq, q_dim, BIAS_STD, key, T_BQ);
            add(list, &n, w->bk, kv_dim, BIAS_STD, key, T_BK);
            add(list, &n, w->bv, kv_dim, BIAS_STD, key, T_BV);
        }
        add(list, &n, w->rms_ffn, dim, 0.0, key, T_RMS_FFN);
        add(list, &n, w->w1, hid * dim, in_dim, key, T_W1);
        add(list, &n, w->w2, dim * hid, 1.0 / sqrt((double)hid), key, T_W2);
        add(list, &n, w->w3, hid * dim, in_dim, key, T_W3);
    }
    add(list, &n, m->rms_final, dim, 0.0, NO_LAYER, T_RMS_FINAL);
    if (!c->tied_classifier)
        add(list, &n, m->classifier, embed, in_dim, NO_LAYER, T_CLASSIFIER);
    first[0] = 0;
    for (int i = 0; i < n; i++)
        first[i + 1] = first[i] + (list[i].n + BLOCK_FLOATS - 1) / BLOCK_FLOATS;

    fill_job job = {list, n, first, seed};
    int failed;
    rc = first[n] > INT32_MAX ? mkv_fail(err, MKV_EUNSUP, "'%s': too many weights to fill", c->name)
                              : mkv_run_tasks((int)first[n], threads < 1 ? 1 : threads, fill_block, &job, &failed, err);
    free(list);
    free(first);
    if (rc != MKV_OK) {
        mkv_model_free(m);
        return rc;
    }
    *out = m;
    return MKV_OK;
}

/* ------------------------------------------------------------ memory */

uint64_t mkv_run_bytes_estimate(const mkv_model_config *c, int seq_len, int chunk, int threads)
{
    uint64_t kv_dim = (uint64_t)c->n_kv_heads * (uint64_t)c->head_dim;
    uint64_t q_dim = (uint64_t)c->n_heads * (uint64_t)c->head_dim;
    uint64_t cache = 2 * (uint64_t)c->n_layers * kv_dim * (uint64_t)seq_len;
    /* x, xb, q, k, v, k_pre, att, h1, h3, RoPE tables, capture transpose */
    uint64_t per_token = 2 * (uint64_t)c->dim + 3 * q_dim + 3 * kv_dim + 2 * (uint64_t)c->hidden_dim +
                         (uint64_t)c->head_dim;
    uint64_t scores = (uint64_t)(threads > 0 ? threads : 1) * 16 * (uint64_t)seq_len;
    uint64_t floats = cache + per_token * (uint64_t)chunk + scores + (uint64_t)c->vocab_size;
    return floats * sizeof(float);
}

uint64_t mkv_available_memory(void)
{
    FILE *fp = fopen("/proc/meminfo", "r");
    if (fp) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, fp))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
                fclose(fp);
                return (uint64_t)kb * 1024;
            }
        fclose(fp);
    }
    long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0;
}
