/* Decoding with a compressed cache, and the teacher-forced perplexity run. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "core/tensor.h"
#include "decode/ccache.h"
#include "decode/decoder.h"
#include "gpu/decode_gpu.h"
#include "model/forward.h"
#include "mkv_cuda.h"

#define DEFAULT_CHUNK 512

struct mkv_decoder {
    const mkv_model *model;
    mkv_forward *f;            /* NULL when the pass runs on the GPU */
    mkv_cuda_llama *gpu;       /* the GPU forward pass and its dense cache */
    int gpu_quest_page;        /* that cache attended as Quest, with pages of this many tokens (0: dense) */
    int gpu_mosaic;            /* the pass decodes over the packed MosaicKV cache the prefill left */
    int batch;                 /* requests decoded together (on the GPU) */
    mkv_ccache *cc;            /* NULL: the forward pass's own cache */
    int64_t prefilled;         /* tokens of the prefill (of the first request of a batch) */
    int64_t prefilled_all;     /* of every request */
    int64_t filled;            /* synthetic positions before them (mkv_decoder_opts.fill) */
    int stepped;               /* decode steps run */
    /* observation queries of the prefill (full decoders) */
    int W;
    int32_t *obs_pos;          /* [W] */
    float *obs_q;              /* [n_layers][n_heads][W][head_dim] */
    double prefill_seconds, compress_seconds;
    mkv_params defaults;       /* the method's parameters when the options give none */
};

/* o with the method's default parameters (in d) where it gives none. */
static mkv_decoder_opts with_params(mkv_decoder *d, const mkv_decoder_opts *o)
{
    mkv_decoder_opts r = *o;
    if (r.method && !r.params) {
        mkv_params_init(&d->defaults, r.method->params);
        r.params = &d->defaults;
    }
    return r;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void mkv_decoder_opts_init(mkv_decoder_opts *o)
{
    memset(o, 0, sizeof *o);
    o->threads = 1;
    o->window = 32;
}

static int is_full(const mkv_decoder_opts *o)
{
    return !o->method || strcmp(o->method->name, "full") == 0;
}

void mkv_decoder_free(mkv_decoder *d)
{
    if (!d)
        return;
    mkv_ccache_free(d->cc);
    mkv_forward_free(d->f);
    mkv_cuda_llama_free(d->gpu);
    free(d->obs_pos);
    mkv_free(d->obs_q);
    free(d);
}

/* The capture hook of the prefill: keep the queries of the last W positions. */
static int keep_queries(void *user, const mkv_capture_batch *b, mkv_error *err)
{
    (void)err;
    mkv_decoder *d = user;
    const mkv_model_config *c = &d->model->cfg;
    int first = (int)(d->filled + d->prefilled) - d->W;
    size_t hd = (size_t)c->head_dim, W = (size_t)d->W;
    for (int i = 0; i < b->n; i++) {
        int w = b->pos0 + i - first;
        if (w < 0 || w >= d->W)
            continue;
        for (int h = 0; h < c->n_heads; h++)
            memcpy(d->obs_q + (((size_t)b->layer * c->n_heads + h) * W + (size_t)w) * hd,
                   b->q + ((size_t)i * c->n_heads + h) * hd, hd * sizeof(float));
    }
    return MKV_OK;
}

static int check_context(const mkv_model *m, int64_t positions, mkv_error *err)
{
    if (positions > m->cfg.max_seq_len)
        return mkv_fail(err, MKV_EFORMAT, "%lld tokens exceed the context of %d of model '%s'",
                        (long long)positions, m->cfg.max_seq_len, m->cfg.name);
    return MKV_OK;
}

/* The observation queries of d's prefill: the last d->W positions. */
static int alloc_queries(mkv_decoder *d, mkv_error *err)
{
    const mkv_model_config *c = &d->model->cfg;
    d->obs_pos = calloc((size_t)d->W, sizeof *d->obs_pos);
    d->obs_q = mkv_alloc((size_t)c->n_layers * (size_t)c->n_heads * (size_t)d->W, (size_t)c->head_dim * sizeof(float),
                         "observation queries", err);
    if (!d->obs_pos || !d->obs_q)
        return mkv_fail(err, MKV_ENOMEM, "out of memory for the observation queries");
    for (int w = 0; w < d->W; w++)
        d->obs_pos[w] = (int32_t)(d->filled + d->prefilled - d->W + w);
    return MKV_OK;
}

/* one_layer: the cache of one layer, for a prefill by layer. */
static int create_forward(const mkv_model *m, const mkv_decoder_opts *o, int64_t positions, int one_layer,
                          mkv_forward **f, mkv_error *err)
{
    int rc = check_context(m, positions, err);
    if (rc)
        return rc;
    mkv_forward_opts fo = {.threads = o->threads, .chunk = o->chunk > 0 ? o->chunk : DEFAULT_CHUNK,
                           .max_seq_len = (int)positions, .one_layer_cache = one_layer};
    return mkv_forward_create(m, &fo, f, err);
}

static int is_quest(const mkv_decoder_opts *o)
{
    return o->method && strcmp(o->method->name, "quest") == 0;
}

static int is_mosaic(const mkv_decoder_opts *o)
{
    return o->method && strcmp(o->method->name, "mosaic") == 0;
}

/* o's parameters, or the method's defaults in *store: for the checks made
 * before a decoder exists (a decoder resolves them once, with_params). */
static const mkv_params *params_of(const mkv_decoder_opts *o, mkv_params *store)
{
    if (o->params)
        return o->params;
    mkv_params_init(store, o->method->params);
    return store;
}

/* The full cache, Quest and MosaicKV have GPU decode paths so far. */
static int check_gpu_method(const mkv_decoder_opts *o, mkv_error *err)
{
    if (!o->gpu || is_full(o) || is_quest(o))
        return MKV_OK;
    if (!is_mosaic(o))
        return mkv_fail(err, MKV_EUNSUP, "method '%s' has no GPU decode path yet", o->method->name);
    mkv_params store;
    char why[160];
    if (!mkv_gpu_decode_mosaic_supports(params_of(o, &store), why, sizeof why))
        return mkv_fail(err, MKV_EUNSUP, "mosaic on the GPU: %s", why);
    return MKV_OK;
}

/* Quest on the GPU: the dense cache the pass filled or prefilled, with
 * page bounds, attended by the Quest kernels with o's parameters (resolved:
 * with_params). */
static int gpu_use_quest(mkv_cuda_llama *g, const mkv_decoder_opts *o, int *page, mkv_error *err)
{
    const mkv_params *p = o->params;
    const mkv_quest_params qp = {(int)mkv_params_int(p, "page"), (int)mkv_params_int(p, "sink"),
                                 (int)mkv_params_int(p, "recent"), mkv_params_double(p, "budget"),
                                 strcmp(mkv_params_str(p, "agg"), "sum") == 0};
    *page = qp.page_size;
    return mkv_cuda_llama_use_quest(g, &qp, err);
}

/* The GPU forward pass of m with a cache of `positions` tokens (external:
 * none of its own, a compressed one to be handed over). */
static int create_gpu(const mkv_model *m, const mkv_decoder_opts *o, int64_t positions, int external,
                      mkv_cuda_llama **g, mkv_error *err)
{
    const mkv_model_config *c = &m->cfg;
    if (positions > c->max_seq_len)
        return mkv_fail(err, MKV_EFORMAT, "%lld tokens exceed the context of %d of model '%s'",
                        (long long)positions, c->max_seq_len, c->name);
    if (mkv_model_has_blocks(m))
        return mkv_fail(err, MKV_EUSAGE, "the GPU forward pass needs model '%s' loaded in float32, "
                        "not in quantized blocks", c->name);
    mkv_cuda_llama_layer *layers = calloc((size_t)c->n_layers, sizeof *layers);
    double *inv_freq = calloc((size_t)c->rope_dim / 2 + 1, sizeof *inv_freq);
    if (!layers || !inv_freq) {
        free(layers);
        free(inv_freq);
        return mkv_fail(err, MKV_ENOMEM, "out of memory for the GPU forward pass");
    }
    for (int l = 0; l < c->n_layers; l++) {
        const mkv_layer_weights *w = &m->layers[l];
        layers[l] = (mkv_cuda_llama_layer){w->rms_att, w->wq, w->wk, w->wv, w->wo, w->bq, w->bk, w->bv,
                                           w->rms_ffn, w->w1, w->w2, w->w3};
    }
    for (int j = 0; j < c->rope_dim / 2; j++)
        inv_freq[j] = mkv_rope_inv_freq(c, j);
    mkv_cuda_llama_desc desc = {
        .dim = c->dim, .hidden_dim = c->hidden_dim, .n_layers = c->n_layers, .n_heads = c->n_heads,
        .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim, .vocab_size = c->vocab_size,
        .rope_dim = c->rope_dim, .rope_half = c->rope_layout == MKV_ROPE_HALF, .rope_inv_freq = inv_freq,
        .rms_eps = c->rms_eps, .max_seq_len = (int)positions, .chunk = o->chunk > 0 ? o->chunk : DEFAULT_CHUNK,
        .weights_f16 = o->gpu_f16_weights, .tok_embedding = m->tok_embedding, .rms_final = m->rms_final,
        .classifier = m->classifier, .layers = layers, .external_cache = external,
        .batch = o->batch > 1 ? o->batch : 1};
    int rc = mkv_cuda_llama_create(&desc, g, err);
    free(layers);
    free(inv_freq);
    return rc;
}

static mkv_ccache_opts ccache_opts(const mkv_decoder_opts *o)
{
    return (mkv_ccache_opts){.method = o->method, .params = o->params, .threads = o->threads > 0 ? o->threads : 1,
                             .max_new = o->max_new};
}

/* From now on d's forward pass attends through its compressed cache. */
static int use_ccache(mkv_decoder *d, mkv_error *err)
{
    mkv_forward_drop_cache(d->f);
    int rc = mkv_forward_seek(d->f, (int)d->prefilled, err);
    if (!rc)
        mkv_forward_set_attention(d->f, mkv_ccache_attention, d->cc);
    return rc;
}

/* MosaicKV on the GPU: the packed caches the CPU's prefills and
 * compression left (subs[b]: request b's decoder, on the CPU) go to one GPU
 * pass, which decodes from then on; the CPU's passes and caches are freed
 * by the caller.  The GPU closes no segment: its open segments take every
 * token leaving the recent windows (the CPU's --manager off). */
static int use_gpu_mosaic(mkv_decoder *d, mkv_decoder *const *subs, const mkv_decoder_opts *o, int64_t positions,
                          mkv_error *err)
{
    const mkv_model_config *c = &d->model->cfg;
    const int B = d->batch, n = c->n_layers * B * c->n_kv_heads;
    const mkv_params *p = o->params;   /* resolved: with_params */
    const int64_t opens = mkv_params_int(p, "segment") / 4;
    if (o->max_new > opens)
        mkv_warn("mosaic on the GPU closes no segment: %d decoded tokens all stay in each head's open segment "
                 "(the CPU's manager would close one after %lld; --manager off decodes as the GPU does)",
                 o->max_new, (long long)opens);
    void **states = calloc((size_t)n, sizeof *states);
    if (!states)
        return mkv_fail(err, MKV_ENOMEM, "out of memory for the state list");
    /* heads (layer, request, KV head), as the GPU pass reads them */
    for (int l = 0; l < c->n_layers; l++)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < c->n_kv_heads; h++)
                states[(l * B + b) * c->n_kv_heads + h] = mkv_ccache_state(subs[b]->cc, l, h);
    int rc = mkv_gpu_decode_mosaic_check(states, n, p, err);
    if (!rc)
        rc = create_gpu(d->model, o, positions, 1, &d->gpu, err);
    if (!rc)
        rc = mkv_gpu_decode_use_mosaic(d->gpu, states, n, p, o->max_new, o->gpu_blockkey_bits, err);
    free(states);
    if (!rc)
        d->gpu_mosaic = 1;
    return rc;
}

/* Give d a compressed cache built from the prefill cache of src, and make
 * it d's attention. */
static int attach_ccache(mkv_decoder *d, const mkv_decoder *src, const mkv_decoder_opts *o, mkv_error *err)
{
    double t0 = now();
    mkv_obs_queries obs = {.W = src->W, .pos = src->obs_pos, .q = src->obs_q};
    mkv_ccache_opts co = ccache_opts(o);
    int rc = mkv_ccache_build(&d->model->cfg, src->f, src->prefilled, &obs, &co, &d->cc, err);
    if (!rc)
        rc = use_ccache(d, err);
    d->compress_seconds = now() - t0;
    return rc;
}

/* The done hook of a prefill by layer: compress the layer just finished
 * (its observation queries are complete too), timed as compression. */
static int compress_layer_done(void *user, int layer, mkv_error *err)
{
    mkv_decoder *d = user;
    double t0 = now();
    int rc = mkv_ccache_add_layer(d->cc, d->f, layer, err);
    d->compress_seconds += now() - t0;
    return rc;
}

/* The CPU prefill of d (batch 1): full attention, the observation queries
 * kept, and the method's compressed cache made d's attention. */
static int prefill_cpu(mkv_decoder *d, const int32_t *tokens, int64_t n, const mkv_decoder_opts *o, float *logits,
                       mkv_error *err)
{
    const mkv_model *m = d->model;
    const mkv_model_config *c = &m->cfg;
    const int64_t positions = o->fill + n + o->max_new;
    int rc = check_context(m, positions, err);
    if (!rc)
        rc = alloc_queries(d, err);
    /* A compressed cache that takes the prefill layer by layer: the pass
     * then holds the dense cache of one layer at a time.  A method that
     * plans over every layer first is built from the whole cache. */
    int by_layer = 0;
    if (!rc && !is_full(o)) {
        mkv_obs_queries obs = {.W = d->W, .pos = d->obs_pos, .q = d->obs_q};
        mkv_ccache_opts co = ccache_opts(o);
        rc = mkv_ccache_begin(c, n, &obs, (int)(n + o->max_new), &co, &d->cc, err);
        by_layer = !rc && !mkv_ccache_needs_every_layer(d->cc);
    }
    if (!rc)
        rc = create_forward(m, o, positions, by_layer, &d->f, err);
    if (!rc && o->fill)
        rc = mkv_forward_fill(d->f, (int)o->fill, o->fill_seed, err);
    if (rc)
        return rc;
    double t0 = now();
    mkv_forward_set_capture(d->f, keep_queries, d);
    if (by_layer)
        rc = mkv_forward_run_by_layer(d->f, tokens, (size_t)n, logits, compress_layer_done, d, err);
    else
        rc = mkv_forward_run(d->f, tokens, (size_t)n, logits, logits ? MKV_LOGITS_LAST : MKV_LOGITS_NONE, err);
    mkv_forward_set_capture(d->f, NULL, NULL);
    /* the layers' compression (compress_seconds so far) ran inside it */
    d->prefill_seconds = now() - t0 - d->compress_seconds;
    if (!rc && d->cc) {
        double t1 = now();
        rc = by_layer ? mkv_ccache_end(d->cc, err) : mkv_ccache_fill(d->cc, d->f, err);
        if (!rc)
            rc = use_ccache(d, err);
        d->compress_seconds += now() - t1;
    }
    return rc;
}

/* A decoder of m with o's parameters resolved (in it) into *ro, before
 * its prefill of n tokens. */
static mkv_decoder *decoder_new(const mkv_model *m, const mkv_decoder_opts *o, int64_t n, mkv_decoder_opts *ro,
                                mkv_error *err)
{
    mkv_decoder *d = calloc(1, sizeof *d);
    if (!d) {
        mkv_fail(err, MKV_ENOMEM, "out of memory for the decoder");
        return NULL;
    }
    *ro = with_params(d, o);
    d->model = m;
    d->prefilled = n;
    d->filled = ro->fill;
    d->batch = ro->batch > 1 ? ro->batch : 1;
    d->W = (int)(ro->window < n ? ro->window : n);
    return d;
}

/* MosaicKV on the GPU over synthetic packed caches of o->fill tokens per
 * request; the prompts (of one length, n) are then decoded token by token. */
static int prefill_gpu_fill_mosaic(mkv_decoder *d, const int32_t *const *tokens, int64_t n,
                                   const mkv_decoder_opts *o, int64_t positions, float *logits, mkv_error *err)
{
    const mkv_model_config *c = &d->model->cfg;
    int rc = create_gpu(d->model, o, positions, 1, &d->gpu, err);
    if (!rc)
        rc = mkv_gpu_decode_fill_mosaic(d->gpu, (int)o->fill, c->n_layers * d->batch * c->n_kv_heads, c->head_dim,
                                        o->params, (int)(n + o->max_new), o->fill_seed, o->gpu_blockkey_bits, err);
    int32_t *row = calloc((size_t)d->batch, sizeof *row);
    if (!rc && !row)
        rc = mkv_fail(err, MKV_ENOMEM, "out of memory for a batch's tokens");
    double t0 = now();
    for (int64_t i = 0; i < n && !rc; i++) {
        for (int b = 0; b < d->batch; b++)
            row[b] = tokens[b][i];
        rc = mkv_cuda_llama_step(d->gpu, row, i == n - 1 ? logits : NULL, err);
    }
    d->prefill_seconds = now() - t0;
    free(row);
    if (!rc)
        d->gpu_mosaic = 1;
    return rc;
}

/* The full cache and Quest on the GPU: every request prefilled (after its
 * filled rows) into its dense cache; Quest keeps no observation queries,
 * its pages bound the keys as they are. */
static int prefill_gpu_dense(mkv_decoder *d, const int32_t *const *tokens, const int64_t *n,
                             const mkv_decoder_opts *o, int64_t positions, float *logits, mkv_error *err)
{
    const int V = d->model->cfg.vocab_size;
    int rc = create_gpu(d->model, o, positions, 0, &d->gpu, err);
    if (!rc && o->fill)
        rc = mkv_cuda_llama_fill(d->gpu, (int)o->fill, o->fill_seed, err);
    double t0 = now();
    for (int b = 0; b < d->batch && !rc; b++)
        rc = mkv_cuda_llama_run_request(d->gpu, b, tokens[b], (size_t)n[b], logits ? logits + (size_t)b * V : NULL,
                                        err);
    d->prefill_seconds = now() - t0;
    if (!rc && is_quest(o)) {
        double t1 = now();
        rc = gpu_use_quest(d->gpu, o, &d->gpu_quest_page, err);
        d->compress_seconds = now() - t1;
    }
    return rc;
}

/* MosaicKV on the GPU after real prefills: each request's prompt
 * prefilled and compressed on the CPU (a prompt given again reuses its
 * cache), then every request's packed heads go to one GPU pass. */
static int prefill_gpu_mosaic(mkv_decoder *d, const int32_t *const *tokens, const int64_t *n,
                              const mkv_decoder_opts *o, int64_t positions, float *logits, mkv_error *err)
{
    const int B = d->batch, V = d->model->cfg.vocab_size;
    mkv_decoder **subs = calloc((size_t)B, sizeof *subs), **owned = calloc((size_t)B, sizeof *owned);
    int rc = subs && owned ? MKV_OK : mkv_fail(err, MKV_ENOMEM, "out of memory for a batch's decoders");
    mkv_decoder_opts so = *o;
    so.gpu = 0;
    so.batch = 1;
    for (int b = 0; b < B && !rc; b++) {
        float *lb = logits ? logits + (size_t)b * V : NULL;
        for (int e = 0; e < b && !subs[b]; e++)
            if (tokens[e] == tokens[b] && n[e] == n[b]) {
                subs[b] = subs[e];
                if (lb)
                    memcpy(lb, logits + (size_t)e * V, (size_t)V * sizeof *lb);
            }
        if (subs[b])
            continue;
        mkv_decoder_opts ro;
        if (!(owned[b] = subs[b] = decoder_new(d->model, &so, n[b], &ro, err))) {
            rc = err ? err->code : MKV_ENOMEM;
            break;
        }
        rc = prefill_cpu(subs[b], tokens[b], n[b], &ro, lb, err);
        /* only the compressed cache is kept */
        mkv_forward_free(subs[b]->f);
        subs[b]->f = NULL;
        d->prefill_seconds += subs[b]->prefill_seconds;
        d->compress_seconds += subs[b]->compress_seconds;
    }
    if (!rc) {
        double t0 = now();
        rc = use_gpu_mosaic(d, subs, o, positions, err);
        d->compress_seconds += now() - t0;
    }
    for (int b = 0; owned && b < B; b++)
        mkv_decoder_free(owned[b]);
    free(owned);
    free(subs);
    return rc;
}

int mkv_decoder_prefill_batch(const mkv_model *m, const int32_t *const *tokens, const int64_t *n,
                              const mkv_decoder_opts *o, float *logits, mkv_decoder **out, mkv_error *err)
{
    *out = NULL;
    const int B = o->batch > 1 ? o->batch : 1;
    int64_t longest = 0, all = 0;
    for (int b = 0; b < B; b++) {
        if (n[b] < 1)
            return mkv_fail(err, MKV_EFORMAT, "nothing to prefill%s", B > 1 ? " in a request of the batch" : "");
        longest = n[b] > longest ? n[b] : longest;
        all += n[b];
    }
    if (o->window < 1 || o->max_new < 0)
        return mkv_fail(err, MKV_EUSAGE, "the window must be positive and the decode steps not negative");
    int rc = check_gpu_method(o, err);
    if (rc)
        return rc;
    if (o->fill < 0 || o->fill > INT32_MAX)
        return mkv_fail(err, MKV_EUSAGE, "%lld positions to fill", (long long)o->fill);
    if (B > 1 && !o->gpu)
        return mkv_fail(err, MKV_EUNSUP, "a batch of requests decodes on the GPU");
    if (o->gpu_blockkey_bits && o->gpu_blockkey_bits != 16 && !(o->gpu && is_mosaic(o)))
        return mkv_fail(err, MKV_EUSAGE, "block keys of %d bits are an option of mosaic on the GPU",
                        o->gpu_blockkey_bits);
    if (o->fill > 0 && !is_full(o) && !(o->gpu && (is_quest(o) || is_mosaic(o))))
        return mkv_fail(err, MKV_EUNSUP,
                        "method '%s' compresses a prefill; only the full cache (and Quest's and mosaic's on the GPU) "
                        "is filled", o->method->name);
    if (o->gpu && is_mosaic(o) && o->fill)
        for (int b = 1; b < B; b++)
            if (n[b] != n[0])
                return mkv_fail(err, MKV_EUNSUP, "mosaic on the GPU after --fill decodes the prompts step by step, "
                                "together: requests of %lld and %lld tokens", (long long)n[0], (long long)n[b]);
    const int64_t positions = o->fill + longest + o->max_new;
    mkv_decoder_opts resolved;
    mkv_decoder *d = decoder_new(m, o, n[0], &resolved, err);
    if (!d)
        return err ? err->code : MKV_ENOMEM;
    o = &resolved;
    d->prefilled_all = all;
    if (o->gpu && is_mosaic(o) && o->fill)
        rc = prefill_gpu_fill_mosaic(d, tokens, n[0], o, positions, logits, err);
    else if (o->gpu && is_mosaic(o))
        rc = prefill_gpu_mosaic(d, tokens, n, o, positions, logits, err);
    else if (o->gpu)
        rc = prefill_gpu_dense(d, tokens, n, o, positions, logits, err);
    else
        rc = prefill_cpu(d, tokens[0], n[0], o, logits, err);
    if (rc) {
        mkv_decoder_free(d);
        return rc;
    }
    *out = d;
    return MKV_OK;
}

int mkv_decoder_prefill(const mkv_model *m, const int32_t *tokens, int64_t n, const mkv_decoder_opts *o,
                        float *logits, mkv_decoder **out, mkv_error *err)
{
    const int B = o->batch > 1 ? o->batch : 1;
    const int32_t **each = malloc((size_t)B * sizeof *each);
    int64_t *len = malloc((size_t)B * sizeof *len);
    int rc = each && len ? MKV_OK : mkv_fail(err, MKV_ENOMEM, "out of memory for a batch's prompts");
    for (int b = 0; !rc && b < B; b++) {
        each[b] = tokens;
        len[b] = n;
    }
    if (!rc)
        rc = mkv_decoder_prefill_batch(m, each, len, o, logits, out, err);
    else
        *out = NULL;
    free(each);
    free(len);
    return rc;
}

int mkv_decoder_fork(const mkv_decoder *full, const mkv_decoder_opts *o, mkv_decoder **out, mkv_error *err)
{
    *out = NULL;
    int rc = check_gpu_method(o, err);
    if (rc)
        return rc;
    if (full->gpu)
        return mkv_fail(err, MKV_EUNSUP, "a decoder on the GPU does not fork: prefill each method there");
    if (full->filled)
        return mkv_fail(err, MKV_EUNSUP, "a filled cache does not fork: its rows are synthetic");
    if (full->cc || full->stepped || !mkv_forward_k(full->f, 0, 0))
        return mkv_fail(err, MKV_EUSAGE, "a decoder forks only from a full-cache decoder right after its prefill");
    if (full->prefilled + o->max_new > mkv_forward_max_seq_len(full->f))
        return mkv_fail(err, MKV_EUSAGE, "%lld + %d tokens exceed the %d positions of the prefill",
                        (long long)full->prefilled, o->max_new, mkv_forward_max_seq_len(full->f));
    mkv_decoder *d = calloc(1, sizeof *d);
    if (!d)
        return mkv_fail(err, MKV_ENOMEM, "out of memory for the decoder");
    const mkv_decoder_opts resolved = with_params(d, o);
    o = &resolved;
    d->model = full->model;
    d->prefilled = full->prefilled;
    d->prefilled_all = full->prefilled_all;
    d->prefill_seconds = full->prefill_seconds;
    rc = create_forward(d->model, o, full->prefilled + o->max_new, 0, &d->f, err);
    if (!rc && is_full(o))
        rc = mkv_fail(err, MKV_EUSAGE, "the full cache is not forked: use the full decoder itself");
    if (!rc)
        rc = attach_ccache(d, full, o, err);
    if (rc) {
        mkv_decoder_free(d);
        return rc;
    }
    *out = d;
    return MKV_OK;
}

int mkv_decoder_step_batch(mkv_decoder *d, const int32_t *tokens, float *logits, mkv_error *err)
{
    if (d->batch == 1)
        return mkv_decoder_step(d, tokens[0], logits, err);
    int rc = mkv_cuda_llama_step(d->gpu, tokens, logits, err);
    if (!rc)
        d->stepped++;
    return rc;
}

int mkv_decoder_step(mkv_decoder *d, int32_t token, float *logits, mkv_error *err)
{
    if (d->batch > 1)
        return mkv_fail(err, MKV_EUSAGE, "a batch of %d requests steps with mkv_decoder_step_batch", d->batch);
    int rc = d->gpu ? mkv_cuda_llama_run(d->gpu, &token, 1, logits, err)
                    : mkv_forward_run(d->f, &token, 1, logits, MKV_LOGITS_LAST, err);
    if (!rc)
        d->stepped++;
    return rc;
}

void mkv_decoder_get_stats(const mkv_decoder *d, mkv_decoder_stats *s)
{
    const mkv_model_config *c = &d->model->cfg;
    uint64_t per_token = (uint64_t)c->n_layers * (uint64_t)c->n_kv_heads * 2u * (uint64_t)c->head_dim * 2u;
    memset(s, 0, sizeof *s);
    s->tokens = d->gpu ? 0 : mkv_forward_pos(d->f);
    for (int b = 0; d->gpu && b < d->batch; b++)
        s->tokens += mkv_cuda_llama_request_pos(d->gpu, b);
    s->prefill_seconds = d->prefill_seconds;
    s->compress_seconds = d->compress_seconds;
    s->logical_bytes = (uint64_t)s->tokens * per_token;
    if (d->gpu_mosaic) {
        /* the device bytes of the packed cache, room for the decode's tokens included */
        s->prefix_tokens = d->filled * d->batch + d->prefilled_all;
        s->tail_tokens = (int64_t)d->stepped * d->batch;
        s->bytes_held = mkv_cuda_llama_cache_bytes(d->gpu);
        s->bytes_read = d->stepped ? mkv_cuda_llama_step_bytes_read(d->gpu) : 0;
        s->growth.temp_tokens = d->stepped;
        return;
    }
    if (d->gpu_quest_page) {
        /* quest's arrays (lib/methods/quest.c): K and V, and a minimum and
         * a maximum per page, all 16-bit */
        const int64_t page = d->gpu_quest_page;
        const uint64_t pages = (uint64_t)((s->tokens + page - 1) / page);
        s->prefix_tokens = s->tokens;
        s->bytes_held = s->logical_bytes + pages * per_token;
        s->bytes_read = d->stepped ? mkv_cuda_llama_step_bytes_read(d->gpu) : 0;
        return;
    }
    if (!d->cc) {
        /* the dense cache counted in 16 bits, as the full method stores it */
        s->bytes_held = s->logical_bytes;
        s->bytes_read = d->stepped ? s->logical_bytes : 0;
        s->tail_tokens = s->tokens - d->filled * d->batch - d->prefilled_all;
        return;
    }
    mkv_ccache_stats cs;
    mkv_ccache_get_stats(d->cc, &cs);
    s->prefix_tokens = cs.prefix_tokens;
    s->tail_tokens = cs.tail_tokens;
    s->bytes_held = cs.held_bytes;
    s->growth = cs.growth;
    s->bytes_read = d->stepped ? cs.bytes_read : 0;
}

int mkv_decoder_finish(mkv_decoder *d, mkv_error *err)
{
    return d->cc ? mkv_ccache_flush(d->cc, err) : MKV_OK;
}

/* ---------------------------------------------------------- perplexity */

void mkv_log_softmax(const float *logits, int n, double *out)
{
    double max = logits[0];
    for (int i = 1; i < n; i++)
        if (logits[i] > max)
            max = logits[i];
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += exp((double)logits[i] - max);
    double lse = max + log(sum);
    for (int i = 0; i < n; i++)
        out[i] = (double)logits[i] - lse;
}

static int argmax(const double *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

int mkv_ppl_check(size_t n_tokens, int64_t context, int64_t score, int windows, mkv_error *err)
{
    if (context < 1 || score < 1 || windows < 1)
        return mkv_fail(err, MKV_EUSAGE, "the context, the scored tokens and the windows must be positive");
    if (context > INT64_MAX / 4 || score > INT64_MAX / 4 || (context + score + 1) > INT64_MAX / windows)
        return mkv_fail(err, MKV_EUSAGE, "the context and the scored tokens are too large");
    int64_t need = windows * (context + score + 1);
    if ((uint64_t)n_tokens < (uint64_t)need) {
        if (windows == 1)
            return mkv_fail(err, MKV_EFORMAT, "the text has %zu tokens; context %lld and %lld scored need %lld",
                            n_tokens, (long long)context, (long long)score, (long long)need);
        return mkv_fail(err, MKV_EFORMAT, "the text has %zu tokens; %d windows of context %lld and %lld scored need %lld",
                        n_tokens, windows, (long long)context, (long long)score, (long long)need);
    }
    return MKV_OK;
}

/* One window of mkv_decode_ppl_windows (checked by it): every field of r
 * but nll_diff_se, each scored token into tk [score]. */
static int ppl_window(const mkv_model *m, const int32_t *tokens, int64_t context, int64_t score,
                      const mkv_decoder_opts *o, int reference, mkv_ppl_result *r, mkv_ppl_token *tk,
                      mkv_error *err)
{
    memset(r, 0, sizeof *r);
    r->context = context;
    r->scored = score;
    r->nll_full = r->nll_diff_se = r->step_seconds_full = NAN;
    int rc = check_gpu_method(o, err);
    if (rc)
        return rc;
    int V = m->cfg.vocab_size;
    mkv_decoder_opts fo = *o;
    fo.method = NULL;
    fo.max_new = (int)score;
    mkv_decoder_opts mo = *o;
    mo.max_new = (int)score;
    mkv_decoder *full = NULL, *dec = NULL;
    float *logits = mkv_alloc((size_t)V, 2 * sizeof(float), "logits", err);
    double *lp = mkv_alloc((size_t)V, 2 * sizeof(double), "log-probabilities", err);
    if (!logits || !lp) {
        mkv_free(logits);
        mkv_free(lp);
        return MKV_ENOMEM;
    }
    float *logits_full = logits + V;
    double *lp_full = lp + V;
    int compressed = !is_full(o);
    /* a GPU decoder does not fork: the method gets a prefill of its own */
    rc = compressed && o->gpu && !reference ? MKV_OK : mkv_decoder_prefill(m, tokens, context, &fo, NULL, &full, err);
    if (!rc && compressed && o->gpu) {
        rc = mkv_decoder_prefill(m, tokens, context, &mo, NULL, &dec, err);
    } else if (!rc && compressed) {
        rc = mkv_decoder_fork(full, &mo, &dec, err);
        if (!rc && !reference) {
            mkv_decoder_free(full);
            full = NULL;
        }
    } else if (!rc) {
        dec = full;   /* the full cache is its own reference */
        full = NULL;
    }
    if (!rc) {
        mkv_decoder_stats s;
        mkv_decoder_get_stats(dec, &s);
        r->prefill_seconds = s.prefill_seconds;
        r->compress_seconds = s.compress_seconds;
        r->prefix_bytes_held = s.bytes_held;
        r->prefix_logical_bytes = s.logical_bytes;
    }
    double nll = 0, nll_full = 0, kl = 0, t_dec = 0, t_full = 0, read = 0, dense = 0;
    int64_t agree = 0;
    for (int64_t i = 0; i < score && !rc; i++) {
        int32_t in = tokens[context + i], target = tokens[context + i + 1];
        double t0 = now();
        if ((rc = mkv_decoder_step(dec, in, logits, err)))
            break;
        t_dec += now() - t0;
        mkv_decoder_stats s;
        mkv_decoder_get_stats(dec, &s);
        read += (double)s.bytes_read;
        dense += (double)s.logical_bytes;
        mkv_log_softmax(logits, V, lp);
        nll -= lp[target];
        mkv_ppl_token *t = &tk[i];
        *t = (mkv_ppl_token){context + i + 1, target, argmax(lp, V), -1, lp[target], NAN, NAN};
        if (full) {
            t0 = now();
            if ((rc = mkv_decoder_step(full, in, logits_full, err)))
                break;
            t_full += now() - t0;
            mkv_log_softmax(logits_full, V, lp_full);
            nll_full -= lp_full[target];
            double k = 0;
            for (int j = 0; j < V; j++)
                k += exp(lp_full[j]) * (lp_full[j] - lp[j]);
            kl += k;
            t->top1_full = argmax(lp_full, V);
            t->logprob_full = lp_full[target];
            t->kl = k;
            agree += t->top1 == t->top1_full;
        } else if (!compressed) {   /* the full cache is its own reference */
            t->top1_full = t->top1;
            t->logprob_full = t->logprob;
            t->kl = 0;
        }
    }
    if (!rc) {
        double n = (double)score;
        r->nll = nll / n;
        r->bytes_read_mean = read / n;
        r->dense_read_mean = dense / n;
        r->step_seconds = t_dec / n;
        if (full || !compressed) {
            r->nll_full = full ? nll_full / n : r->nll;
            r->kl = full ? kl / n : 0;
            r->agreement = full ? (double)agree / n : 1;
            r->step_seconds_full = full ? t_full / n : r->step_seconds;
        } else {
            r->kl = r->agreement = NAN;
        }
        mkv_decoder_stats s;
        mkv_decoder_get_stats(dec, &s);
        r->bytes_held = s.bytes_held;
        r->logical_bytes = s.logical_bytes;
    }
    mkv_decoder_free(dec);
    mkv_decoder_free(full);
    mkv_free(logits);
    mkv_free(lp);
    return rc;
}

/* The standard error of the mean of logprob_full - logprob over t [n]
 * (NaN below 2 tokens or without the full cache's log-probabilities). */
static double diff_se(const mkv_ppl_token *t, int64_t n)
{
    double mean = 0, ss = 0;
    for (int64_t i = 0; i < n; i++)
        mean += (t[i].logprob_full - t[i].logprob) / (double)n;
    for (int64_t i = 0; i < n; i++) {
        double d = t[i].logprob_full - t[i].logprob - mean;
        ss += d * d;
    }
    return n > 1 ? sqrt(ss / (double)(n - 1) / (double)n) : NAN;
}

int mkv_decode_ppl(const mkv_model *m, const int32_t *tokens, size_t n_tokens, int64_t context, int64_t score,
                   const mkv_decoder_opts *o, int reference, mkv_ppl_result *r, mkv_ppl_token *per_token,
                   mkv_error *err)
{
    return mkv_decode_ppl_windows(m, tokens, n_tokens, context, score, 1, o, reference, r, per_token, err);
}

int mkv_decode_ppl_windows(const mkv_model *m, const int32_t *tokens, size_t n_tokens, int64_t context,
                           int64_t score, int windows, const mkv_decoder_opts *o, int reference, mkv_ppl_result *r,
                           mkv_ppl_token *per_token, mkv_error *err)
{
    int rc = mkv_ppl_check(n_tokens, context, score, windows, err);
    if (rc)
        return rc;
    mkv_ppl_token *tk = per_token;
    if (!tk && !(tk = mkv_alloc((size_t)windows * (size_t)score, sizeof *tk, "per-token results", err)))
        return MKV_ENOMEM;
    mkv_ppl_result sum = {0};
    double held = 0, logical = 0, prefix_held = 0, prefix_logical = 0;
    const int64_t span = context + score + 1;
    for (int w = 0; w < windows && !rc; w++) {
        mkv_ppl_result one;
        mkv_ppl_token *t = tk + (size_t)w * (size_t)score;
        rc = ppl_window(m, tokens + w * span, context, score, o, reference, &one, t, err);
        if (rc)
            break;
        for (int64_t i = 0; i < score; i++)
            t[i].position += w * span;
        sum.nll += one.nll;
        sum.nll_full += one.nll_full;
        sum.kl += one.kl;
        sum.agreement += one.agreement;
        sum.bytes_read_mean += one.bytes_read_mean;
        sum.dense_read_mean += one.dense_read_mean;
        sum.prefill_seconds += one.prefill_seconds;
        sum.compress_seconds += one.compress_seconds;
        sum.step_seconds += one.step_seconds;
        sum.step_seconds_full += one.step_seconds_full;
        held += (double)one.bytes_held;
        logical += (double)one.logical_bytes;
        prefix_held += (double)one.prefix_bytes_held;
        prefix_logical += (double)one.prefix_logical_bytes;
    }
    if (!rc) {
        /* every window scores the same number of tokens: token means are window means */
        const double k = (double)windows;
        memset(r, 0, sizeof *r);
        r->context = context;
        r->scored = windows * score;
        r->nll = sum.nll / k;
        r->nll_full = sum.nll_full / k;
        r->kl = sum.kl / k;
        r->agreement = sum.agreement / k;
        r->bytes_read_mean = sum.bytes_read_mean / k;
        r->dense_read_mean = sum.dense_read_mean / k;
        r->prefill_seconds = sum.prefill_seconds;
        r->compress_seconds = sum.compress_seconds;
        r->step_seconds = sum.step_seconds / k;
        r->step_seconds_full = sum.step_seconds_full / k;
        r->bytes_held = (uint64_t)(held / k + 0.5);
        r->logical_bytes = (uint64_t)(logical / k + 0.5);
        r->prefix_bytes_held = (uint64_t)(prefix_held / k + 0.5);
        r->prefix_logical_bytes = (uint64_t)(prefix_logical / k + 0.5);
        r->nll_diff_se = diff_se(tk, r->scored);
    }
    if (tk != per_token)
        mkv_free(tk);
    return rc;
}
