/* Running a model over a prompt, and capturing its KV cache into a dump. */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "core/tensor.h"
#include "model/capture.h"
#include "model/sampler.h"

/* ---------------------------------------------------------------- a run */

void mkv_run_opts_init(mkv_run_opts *o)
{
    memset(o, 0, sizeof *o);
    o->threads = 1;
    o->chunk = 512;
    o->top_p = 1.0;
    o->seed = 1;
}

int mkv_run_check(const mkv_model_config *cfg, size_t n_prompt, int64_t generate, mkv_error *err)
{
    if (n_prompt == 0)
        return mkv_fail(err, MKV_EFORMAT, "empty prompt");
    if (n_prompt > (size_t)cfg->max_seq_len)
        return mkv_fail(err, MKV_EFORMAT, "the prompt has %zu tokens, more than the context of %d",
                        n_prompt, cfg->max_seq_len);
    if (generate < 0 || n_prompt + (size_t)generate > (size_t)cfg->max_seq_len)
        return mkv_fail(err, MKV_EFORMAT,
                        "the prompt has %zu tokens; %" PRId64 " more to generate exceed the context of %d",
                        n_prompt, generate, cfg->max_seq_len);
    return MKV_OK;
}

int mkv_run_init(mkv_run *r, const mkv_model *model, const int32_t *prompt, size_t n_prompt,
                 const mkv_run_opts *opts, mkv_error *err)
{
    memset(r, 0, sizeof *r);
    const mkv_model_config *c = &model->cfg;
    int rc = mkv_run_check(c, n_prompt, opts->generate, err);
    if (rc)
        return rc;
    r->model = model;
    r->opts = *opts;
    r->n_prompt = n_prompt;
    r->n_total = n_prompt + (size_t)opts->generate;
    r->tokens = malloc(r->n_total * sizeof *r->tokens);
    if (!r->tokens)
        return mkv_fail(err, MKV_ENOMEM, "out of memory for %zu tokens", r->n_total);
    memcpy(r->tokens, prompt, n_prompt * sizeof *prompt);
    if (opts->generate > 0 || opts->last_logits) {
        r->logits = malloc((size_t)c->vocab_size * sizeof *r->logits);
        if (!r->logits) {
            mkv_run_free(r);
            return mkv_fail(err, MKV_ENOMEM, "out of memory for the logits");
        }
    }
    mkv_forward_opts fo = {opts->threads, opts->chunk, (int)r->n_total};
    if ((rc = mkv_forward_create(model, &fo, &r->fwd, err)))
        mkv_run_free(r);
    return rc;
}

void mkv_run_free(mkv_run *r)
{
    mkv_forward_free(r->fwd);
    free(r->tokens);
    free(r->logits);
    memset(r, 0, sizeof *r);
}

/* The caller's hook behind a progress bar over the prefill. */
typedef struct {
    mkv_capture_fn hook;
    void *user;
    int n_layers;
    mkv_progress progress;
} progress_hook;

static int hook_with_progress(void *user, const mkv_capture_batch *b, mkv_error *err)
{
    progress_hook *p = user;
    int rc = p->hook ? p->hook(p->user, b, err) : MKV_OK;
    if (rc == MKV_OK)
        mkv_progress_update(&p->progress, (int64_t)b->pos0 * p->n_layers + (int64_t)(b->layer + 1) * b->n);
    return rc;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double per_second(double n, double seconds) { return n / (seconds > 1e-9 ? seconds : 1e-9); }

int mkv_run_go(mkv_run *r, mkv_capture_fn hook, void *user, mkv_error *err)
{
    const mkv_model_config *c = &r->model->cfg;
    int gen = r->opts.generate, rc;
    int want_last = gen > 0 || r->opts.last_logits;
    progress_hook ph = {hook, user, c->n_layers, {0}};
    int progress_on = r->n_prompt > (size_t)r->opts.chunk;
    if (progress_on) {
        mkv_progress_start(&ph.progress, "prefill", (int64_t)r->n_prompt * c->n_layers);
        mkv_forward_set_capture(r->fwd, hook_with_progress, &ph);
    } else {
        mkv_forward_set_capture(r->fwd, hook, user);
    }
    double t0 = now_seconds();
    rc = mkv_forward_run(r->fwd, r->tokens, r->n_prompt, r->logits,
                         want_last ? MKV_LOGITS_LAST : MKV_LOGITS_NONE, err);
    if (progress_on) {
        mkv_progress_finish(&ph.progress);
        mkv_forward_set_capture(r->fwd, hook, user);
    }
    if (rc)
        return rc;
    double t1 = now_seconds();
    mkv_info("prefill: %zu tokens in %.2f s (%.1f tokens/s)", r->n_prompt, t1 - t0,
             per_second((double)r->n_prompt, t1 - t0));
    mkv_sampler sampler;
    mkv_sampler_init(&sampler, (float)r->opts.temperature, (float)r->opts.top_p, r->opts.seed);
    for (int i = 0; i < gen && rc == MKV_OK; i++) {
        int next = mkv_sample(&sampler, r->logits, c->vocab_size, err);
        if (next < 0) {
            rc = err->code ? err->code : MKV_ENOMEM;
            break;
        }
        size_t at = r->n_prompt + (size_t)i;
        r->tokens[at] = next;
        int need = i + 1 < gen || r->opts.last_logits;
        rc = mkv_forward_run(r->fwd, &r->tokens[at], 1, r->logits,
                             need ? MKV_LOGITS_LAST : MKV_LOGITS_NONE, err);
    }
    mkv_sampler_free(&sampler);
    if (rc)
        return rc;
    if (gen > 0) {
        double t2 = now_seconds();
        mkv_info("generate: %d tokens in %.2f s (%.1f tokens/s)", gen, t2 - t1,
                 per_second(gen, t2 - t1));
    }
    return MKV_OK;
}

/* ---------------------------------------------------------------- a capture */

void mkv_capture_opts_init(mkv_capture_opts *o)
{
    memset(o, 0, sizeof *o);
    mkv_run_opts_init(&o->run);
    o->window = 32;
}

int mkv_capture_create(const mkv_model *model, const int32_t *prompt, size_t n_prompt,
                       const mkv_capture_opts *opts, mkv_capture **out, mkv_error *err)
{
    *out = NULL;
    const mkv_model_config *c = &model->cfg;
    for (int i = 0; opts->layers && i < opts->n_layers; i++)
        if (opts->layers[i] < 0 || opts->layers[i] >= c->n_layers)
            return mkv_fail(err, MKV_EUSAGE, "layer %d is not a layer of the model (0..%d)",
                            opts->layers[i], c->n_layers - 1);
    mkv_capture *cap = calloc(1, sizeof *cap);
    if (!cap)
        return mkv_fail(err, MKV_ENOMEM, "out of memory");
    int rc = mkv_run_init(&cap->run, model, prompt, n_prompt, &opts->run, err);
    if (rc) {
        free(cap);
        return rc;
    }
    int window = opts->window < (int)n_prompt ? opts->window : (int)n_prompt;
    cap->n_queries = window + opts->run.generate;
    cap->q_first = (int)n_prompt - window;
    cap->k_rope_pre = opts->k_rope_pre;
    cap->n_layers = opts->layers ? opts->n_layers : c->n_layers;
    int widest = c->n_heads > c->n_kv_heads ? c->n_heads : c->n_kv_heads;
    cap->scratch = mkv_alloc((size_t)opts->run.chunk * (size_t)widest, (size_t)c->head_dim * sizeof(float),
                             "capture buffer", err);
    cap->dump_layer = malloc((size_t)c->n_layers * sizeof *cap->dump_layer);
    if (!cap->scratch || !cap->dump_layer) {
        rc = cap->scratch ? mkv_fail(err, MKV_ENOMEM, "out of memory") : (int)err->code;
        mkv_capture_free(cap);
        return rc;
    }
    for (int l = 0; l < c->n_layers; l++)
        cap->dump_layer[l] = opts->layers ? -1 : l;
    for (int i = 0; opts->layers && i < opts->n_layers; i++)
        cap->dump_layer[opts->layers[i]] = i;
    *out = cap;
    return MKV_OK;
}

void mkv_capture_free(mkv_capture *c)
{
    if (!c)
        return;
    mkv_run_free(&c->run);
    mkv_free(c->scratch);
    free(c->dump_layer);
    free(c);
}

void mkv_capture_meta(const mkv_capture *cap, mkv_dump_meta *meta)
{
    const mkv_model_config *c = &cap->run.model->cfg;
    snprintf(meta->model, sizeof meta->model, "%s", c->name);
    meta->n_layers = cap->n_layers;
    meta->n_heads = c->n_heads;
    meta->n_kv_heads = c->n_kv_heads;
    meta->head_dim = c->head_dim;
    meta->rope_theta = c->rope_theta;
    snprintf(meta->k_rope, sizeof meta->k_rope, "%s", cap->k_rope_pre ? "pre" : "post");
    snprintf(meta->source, sizeof meta->source, "capture");
    meta->n_tokens = (int64_t)cap->run.n_total;
    meta->n_queries = cap->n_queries;
    meta->has_tokens = 1;
}

int mkv_capture_set_attrs(mkv_dump_writer *w, const mkv_model_config *cfg, const int *layer_index,
                          int n_layers, const char *capture_params, mkv_error *err)
{
    char layers[8192];
    size_t at = 0;
    layers[0] = '\0';
    for (int i = 0; i < n_layers && at < sizeof layers; i++)
        at += (size_t)snprintf(layers + at, sizeof layers - at, "%s%d", i ? "," : "", layer_index[i]);
    char rope[64];
    snprintf(rope, sizeof rope, "dim=%d layout=%s", cfg->rope_dim,
             cfg->rope_layout == MKV_ROPE_HALF ? "half" : "interleaved");
    int rc;
    if ((rc = mkv_dump_set_attr(w, "layer_index", layers, err)) ||
        (rc = mkv_dump_set_attr(w, "capture_params", capture_params, err)) ||
        (rc = mkv_dump_set_attr(w, "rope", rope, err)))
        return rc;
    if (!cfg->has_rope_freq_factors)
        return MKV_OK;
    char factors[MKV_ROPE_MAX_PAIRS * 18];
    size_t fat = 0;
    factors[0] = '\0';
    for (int j = 0; j < cfg->rope_dim / 2 && fat < sizeof factors; j++)
        fat += (size_t)snprintf(factors + fat, sizeof factors - fat, "%s%.9g", j ? "," : "",
                                (double)cfg->rope_freq_factors[j]);
    return mkv_dump_set_attr(w, "rope_freq_factors", factors, err);
}

/* [n][heads][d] rows from src into [heads][n][d] at dst. */
static void to_head_major(const float *src, int n, int heads, int d, float *dst)
{
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < n; i++)
            memcpy(dst + ((size_t)h * n + i) * d, src + ((size_t)i * heads + h) * d, (size_t)d * sizeof(float));
}

/* Undo RoPE on [heads][n][d] vectors at positions pos0..pos0+n-1: the
 * forward pass hands out queries only after RoPE. */
static void unrotate(const mkv_model_config *c, float *x, int heads, int n, int pos0)
{
    int half = c->rope_dim / 2;
    int stride = c->rope_layout == MKV_ROPE_INTERLEAVED ? 2 : 1;
    int second = c->rope_layout == MKV_ROPE_INTERLEAVED ? 1 : half;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < half; j++) {
            double cs, sn;
            mkv_rope_angle(c, pos0 + i, j, &cs, &sn);
            for (int h = 0; h < heads; h++) {
                float *a = x + ((size_t)h * n + i) * c->head_dim + j * stride, *b = a + second;
                double x0 = *a, x1 = *b;
                *a = (float)(x0 * cs + x1 * sn);
                *b = (float)(-x0 * sn + x1 * cs);
            }
        }
}

/* One layer of one chunk into the dump: K and V of every position, the
 * queries of the positions from q_first on. */
static int write_batch(void *user, const mkv_capture_batch *b, mkv_error *err)
{
    mkv_capture *s = user;
    const mkv_model_config *c = &s->run.model->cfg;
    int layer = s->dump_layer[b->layer], d = c->head_dim, rc;
    if (layer < 0)
        return MKV_OK;
    to_head_major(s->k_rope_pre ? b->k_pre : b->k, b->n, c->n_kv_heads, d, s->scratch);
    if ((rc = mkv_dump_write(s->writer, layer, 'k', 0, c->n_kv_heads, b->pos0, b->n, s->scratch, err)))
        return rc;
    to_head_major(b->v, b->n, c->n_kv_heads, d, s->scratch);
    if ((rc = mkv_dump_write(s->writer, layer, 'v', 0, c->n_kv_heads, b->pos0, b->n, s->scratch, err)))
        return rc;
    int first = b->pos0 > s->q_first ? b->pos0 : s->q_first;
    int m = b->pos0 + b->n - first;
    if (m <= 0)
        return MKV_OK;
    const float *q = b->q + (size_t)(first - b->pos0) * c->n_heads * d;
    to_head_major(q, m, c->n_heads, d, s->scratch);
    if (s->k_rope_pre)
        unrotate(c, s->scratch, c->n_heads, m, first);
    return mkv_dump_write(s->writer, layer, 'q', 0, c->n_heads, first - s->q_first, m, s->scratch, err);
}

int mkv_capture_write(mkv_capture *c, mkv_dump_writer *w, mkv_error *err)
{
    c->writer = w;
    int rc = mkv_run_go(&c->run, write_batch, c, err);
    c->writer = NULL;
    if (rc)
        return rc;
    int32_t *qpos = malloc((size_t)(c->n_queries > 0 ? c->n_queries : 1) * sizeof *qpos);
    if (!qpos)
        return mkv_fail(err, MKV_ENOMEM, "out of memory");
    for (int i = 0; i < c->n_queries; i++)
        qpos[i] = c->q_first + i;
    rc = mkv_dump_write_tokens(w, c->run.tokens, err);
    if (!rc)
        rc = mkv_dump_write_query_pos(w, qpos, err);
    free(qpos);
    return rc;
}

static int cmp_int(const void *x, const void *y)
{
    int a = *(const int *)x, b = *(const int *)y;
    return (a > b) - (a < b);
}

int mkv_layer_list_parse(const char *list, int n, int **out, int *count, mkv_error *err)
{
    int *layers = malloc((size_t)(n > 0 ? n : 1) * sizeof *layers);
    char *seen = calloc((size_t)(n > 0 ? n : 1), 1);
    int rc = MKV_OK, k = 0;
    if (!layers || !seen) {
        rc = mkv_fail(err, MKV_ENOMEM, "out of memory");
        goto done;
    }
    for (const char *p = list; p;) {
        char *end;
        errno = 0;
        long lo = strtol(p, &end, 10), hi = lo;
        int ok = end != p && errno == 0 && (*p >= '0' && *p <= '9');
        if (ok && *end == '-') {
            const char *q = end + 1;
            hi = strtol(q, &end, 10);
            ok = end != q && errno == 0 && (*q >= '0' && *q <= '9') && hi >= lo;
        }
        if (!ok || (*end != ',' && *end != '\0')) {
            rc = mkv_fail(err, MKV_EUSAGE,
                          "invalid value '%s' for --layers: expected a list of layers like 0,3,5-7", list);
            goto done;
        }
        if (hi >= n) {
            rc = mkv_fail(err, MKV_EUSAGE, "invalid value '%s' for --layers: the model has %d layers (0..%d)",
                          list, n, n - 1);
            goto done;
        }
        for (long l = lo; l <= hi; l++)
            if (!seen[l]) {
                seen[l] = 1;
                layers[k++] = (int)l;
            }
        p = *end == '\0' ? NULL : end + 1;
    }
    if (!list)
        for (k = 0; k < n; k++)
            layers[k] = k;
    qsort(layers, (size_t)k, sizeof *layers, cmp_int);
done:
    free(seen);
    if (rc) {
        free(layers);
        return rc;
    }
    *out = layers;
    *count = k;
    return MKV_OK;
}
