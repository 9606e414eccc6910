/* A compressed KV cache for decoding: the method's compressed prefix and a
 * dense 16-bit tail, merged by log-sum-exp. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/attn.h"
#include "core/half.h"
#include "core/tasks.h"
#include "core/tensor.h"
#include "decode/ccache.h"
#include "io/cdump.h"
#include "methods/compress.h"

struct mkv_ccache {
    const mkv_method *method;
    int n_layers, n_heads, n_kv_heads, G, d;
    int threads;
    int64_t prefix;            /* tokens compressed */
    int tail_cap;
    int *tail_len;             /* [n_layers] */
    float *tail_k, *tail_v;    /* [n_layers][n_kv_heads][tail_cap][d], float16 values */
    void **states;             /* [n_layers][n_kv_heads] */
    uint64_t prefix_bytes;
    uint64_t *bytes_read;      /* [n_layers]: the last attention of the layer */
    uint64_t *head_bytes;      /* [n_kv_heads]: scratch of one attention */
    int appends;               /* the method takes new tokens itself (method->append) */
    /* while built (mkv_ccache_begin .. mkv_ccache_end) */
    int building;
    int next_layer;            /* the layer add_layer takes next */
    int planned;               /* per-head budgets planned, or none wanted */
    mkv_dump_meta meta;        /* the prefix as a raw dump */
    mkv_obs_queries obs;
    mkv_compressor comp;
    mkv_budget_plan plan;
    mkv_cdump_meta cmeta;      /* of the in-memory compressed dump of each layer */
};

static size_t head_index(const mkv_ccache *cc, int layer, int head)
{
    return (size_t)layer * (size_t)cc->n_kv_heads + (size_t)head;
}

static float *tail_row(const mkv_ccache *cc, float *base, int layer, int head, int t)
{
    return base + (head_index(cc, layer, head) * (size_t)cc->tail_cap + (size_t)t) * (size_t)cc->d;
}

/* The scratch of a build: the plan. */
static void end_build(mkv_ccache *cc)
{
    mkv_budget_plan_free(&cc->plan);
    cc->building = 0;
}

void mkv_ccache_free(mkv_ccache *cc)
{
    if (!cc)
        return;
    end_build(cc);
    if (cc->states)
        for (int l = 0; l < cc->n_layers; l++)
            for (int h = 0; h < cc->n_kv_heads; h++)
                if (cc->states[head_index(cc, l, h)])
                    cc->method->free_state(cc->states[head_index(cc, l, h)]);
    free(cc->states);
    free(cc->tail_len);
    mkv_free(cc->tail_k);
    mkv_free(cc->tail_v);
    free(cc->bytes_read);
    free(cc->head_bytes);
    free(cc);
}

static void fill_meta(const mkv_model_config *cfg, int64_t n, int W, mkv_dump_meta *m)
{
    memset(m, 0, sizeof *m);
    snprintf(m->model, sizeof m->model, "%s", cfg->name);
    m->n_layers = cfg->n_layers;
    m->n_heads = cfg->n_heads;
    m->n_kv_heads = cfg->n_kv_heads;
    m->head_dim = cfg->head_dim;
    m->rope_theta = cfg->rope_theta;
    strcpy(m->k_rope, "post");
    strcpy(m->source, "capture");
    m->n_tokens = n;
    m->n_queries = W;
    m->dtype = MKV_DTYPE_F32;
}

int mkv_ccache_begin(const mkv_model_config *cfg, int64_t n, const mkv_obs_queries *obs, int max_seq_len,
                     const mkv_ccache_opts *o, mkv_ccache **out, mkv_error *err)
{
    *out = NULL;
    if (n < 1)
        return mkv_fail(err, MKV_EUSAGE, "no prefill of %lld tokens to compress", (long long)n);
    if (o->max_new < 0 || n + o->max_new > max_seq_len)
        return mkv_fail(err, MKV_EUSAGE, "%lld + %d tokens exceed the context of %d", (long long)n, o->max_new,
                        max_seq_len);
    mkv_dump_meta m;
    fill_meta(cfg, n, obs->W, &m);
    int rc = o->method->check(o->params, &m, err);
    if (rc)
        return mkv_error_prefix(err, "method '%s'", o->method->name);

    mkv_ccache *cc = calloc(1, sizeof *cc);
    if (!cc)
        return mkv_fail(err, MKV_ENOMEM, "out of memory for the compressed cache");
    cc->method = o->method;
    cc->n_layers = cfg->n_layers;
    cc->n_heads = cfg->n_heads;
    cc->n_kv_heads = cfg->n_kv_heads;
    cc->G = cfg->n_heads / cfg->n_kv_heads;
    cc->d = cfg->head_dim;
    cc->threads = o->threads > 0 ? o->threads : 1;
    cc->prefix = n;
    cc->tail_cap = o->max_new > 0 ? o->max_new : 1;
    cc->appends = o->method->append != NULL;
    cc->building = 1;
    cc->meta = m;
    cc->obs = *obs;
    cc->comp = (mkv_compressor){.method = o->method, .params = o->params};
    size_t heads = (size_t)cc->n_layers * (size_t)cc->n_kv_heads;
    /* a method that appends holds new tokens itself: the tail keeps none */
    size_t tail_n = cc->appends ? 1 : heads * (size_t)cc->tail_cap * (size_t)cc->d;
    cc->states = calloc(heads, sizeof *cc->states);
    cc->tail_len = calloc((size_t)cc->n_layers, sizeof *cc->tail_len);
    cc->bytes_read = calloc((size_t)cc->n_layers, sizeof *cc->bytes_read);
    cc->head_bytes = calloc((size_t)cc->n_kv_heads, sizeof *cc->head_bytes);
    if (!cc->states || !cc->tail_len || !cc->bytes_read || !cc->head_bytes ||
        !(cc->tail_k = mkv_alloc(tail_n, sizeof(float), "decode tail keys", err)) ||
        !(cc->tail_v = mkv_alloc(tail_n, sizeof(float), "decode tail values", err))) {
        mkv_ccache_free(cc);
        return mkv_fail(err, MKV_ENOMEM, "out of memory for the compressed cache");
    }
    mkv_cdump_meta *cm = &cc->cmeta;
    snprintf(cm->method, sizeof cm->method, "%s", o->method->name);
    mkv_params_format(o->params, cm->params, sizeof cm->params);
    strcpy(cm->source, "decode");
    cm->raw = m;
    if ((rc = mkv_budget_plan_init(&cc->comp, &cc->meta, &cc->plan, err))) {
        mkv_ccache_free(cc);
        return rc;
    }
    cc->planned = !mkv_budget_plan_wanted(&cc->plan);
    *out = cc;
    return MKV_OK;
}

int mkv_ccache_needs_every_layer(const mkv_ccache *cc)
{
    return cc->building && !cc->planned;
}

/* The layer's rows 0..n-1 of f as compress reads them: in place, each
 * KV head's rows the forward's [max_seq_len][d], one head after the
 * other (model/forward.h). */
static int layer_of(mkv_ccache *cc, const mkv_forward *f, int layer, mkv_layer_kv *out, mkv_error *err)
{
    int H = cc->n_kv_heads;
    if (mkv_forward_pos(f) < cc->prefix || !mkv_forward_k(f, layer, 0))
        return mkv_fail(err, MKV_EUSAGE, "no prefill cache of %lld tokens of layer %d to compress",
                        (long long)cc->prefix, layer);
    const float *k = mkv_forward_k(f, layer, 0), *v = mkv_forward_v(f, layer, 0);
    size_t stride = (size_t)mkv_forward_max_seq_len(f) * (size_t)cc->d;
    for (int h = 1; h < H; h++)
        if (mkv_forward_k(f, layer, h) != k + (size_t)h * stride || mkv_forward_v(f, layer, h) != v + (size_t)h * stride)
            return mkv_fail(err, MKV_EUSAGE, "the forward cache of layer %d does not hold its heads one after the "
                            "other", layer);
    size_t q_layer = (size_t)cc->n_heads * (size_t)cc->obs.W * (size_t)cc->d;
    *out = (mkv_layer_kv){.layer = layer, .k = k, .v = v, .head_stride = stride,
                          .q = cc->obs.W ? cc->obs.q + (size_t)layer * q_layer : NULL, .query_pos = cc->obs.pos,
                          .budget_scale = cc->plan.scale ? cc->plan.scale + (size_t)layer * (size_t)H : NULL};
    return MKV_OK;
}

/* The per-head budgets over every layer of f (which holds them all), the
 * cache copied once more. */
static int plan_budgets(mkv_ccache *cc, const mkv_forward *f, mkv_error *err)
{
    int rc = MKV_OK;
    for (int l = 0; l < cc->n_layers && !rc; l++) {
        mkv_layer_kv layer;
        if (!(rc = layer_of(cc, f, l, &layer, err)))
            rc = mkv_budget_plan_layer(&cc->plan, &cc->meta, &layer, cc->threads, err);
    }
    if (!rc)
        rc = mkv_budget_plan_finish(&cc->plan, &cc->meta, err);
    if (!rc)
        cc->planned = 1;
    return rc;
}

int mkv_ccache_add_layer(mkv_ccache *cc, const mkv_forward *f, int layer, mkv_error *err)
{
    if (!cc->building)
        return mkv_fail(err, MKV_EUSAGE, "the compressed cache is not being built");
    if (!cc->planned)
        return mkv_fail(err, MKV_EUSAGE, "method '%s' plans its budgets over every layer before compressing one",
                        cc->method->name);
    if (layer != cc->next_layer)
        return mkv_fail(err, MKV_EUSAGE, "layer %d added to the compressed cache where layer %d comes next", layer,
                        cc->next_layer);
    /* compressed into a dump of this layer alone and loaded from it at
     * once: the compressed arrays of one layer exist twice, never the
     * whole cache */
    mkv_layer_kv l;
    mkv_cdump_writer *w = NULL;
    mkv_cdump *c = NULL;
    int rc = layer_of(cc, f, layer, &l, err);
    if (!rc && !(rc = mkv_cdump_create_memory_layer(&cc->cmeta, cc->obs.pos, layer, &w, err))) {
        rc = mkv_compress_layer(&cc->comp, &cc->meta, &l, cc->threads, w, err);
        if (rc)
            mkv_cdump_abort(w);
        else
            rc = mkv_cdump_commit_open(w, &c, err);
    }
    if (!rc)
        cc->prefix_bytes += mkv_cdump_meta_of(c)->physical_bytes;
    for (int h = 0; h < cc->n_kv_heads && !rc; h++)
        if ((rc = cc->method->load(cc->comp.params, c, layer, h, &cc->states[head_index(cc, layer, h)], err)))
            mkv_error_prefix(err, "method '%s': layer %d head %d", cc->method->name, layer, h);
    mkv_cdump_close(c);
    if (!rc)
        cc->next_layer++;
    return rc;
}

int mkv_ccache_end(mkv_ccache *cc, mkv_error *err)
{
    if (!cc->building)
        return mkv_fail(err, MKV_EUSAGE, "the compressed cache is not being built");
    if (cc->next_layer != cc->n_layers)
        return mkv_fail(err, MKV_EUSAGE, "the compressed cache has %d of %d layers", cc->next_layer, cc->n_layers);
    end_build(cc);
    return MKV_OK;
}

int mkv_ccache_fill(mkv_ccache *cc, const mkv_forward *f, mkv_error *err)
{
    int rc = mkv_ccache_needs_every_layer(cc) ? plan_budgets(cc, f, err) : MKV_OK;
    for (int l = 0; l < cc->n_layers && !rc; l++)
        rc = mkv_ccache_add_layer(cc, f, l, err);
    return rc ? rc : mkv_ccache_end(cc, err);
}

int mkv_ccache_build(const mkv_model_config *cfg, const mkv_forward *f, int64_t n, const mkv_obs_queries *obs,
                     const mkv_ccache_opts *o, mkv_ccache **out, mkv_error *err)
{
    *out = NULL;
    if (n < 1 || n > mkv_forward_pos(f) || !mkv_forward_k(f, 0, 0))
        return mkv_fail(err, MKV_EUSAGE, "no prefill cache of %lld tokens to compress", (long long)n);
    mkv_ccache *cc = NULL;
    int rc = mkv_ccache_begin(cfg, n, obs, mkv_forward_max_seq_len(f), o, &cc, err);
    if (!rc && (rc = mkv_ccache_fill(cc, f, err)))
        mkv_ccache_free(cc);
    if (!rc)
        *out = cc;
    return rc;
}

typedef struct {
    mkv_ccache *cc;
    const mkv_capture_batch *b;
    float *out;
} attention_ctx;

/* One KV head of one layer: append the batch's keys and values to the
 * tail, then answer each query over the prefix (the method) and the tail
 * up to its own position (exact), merged. */
/* The same for a method that takes new tokens itself: append each, then
 * attend over everything the state holds. */
static int head_task_appending(attention_ctx *a, int h, mkv_error *err)
{
    mkv_ccache *cc = a->cc;
    const mkv_capture_batch *b = a->b;
    int l = b->layer, d = cc->d, G = cc->G, base = cc->tail_len[l];
    size_t kv_dim = (size_t)cc->n_kv_heads * (size_t)d, q_dim = (size_t)cc->n_heads * (size_t)d;
    void *state = cc->states[head_index(cc, l, h)];
    size_t n_att = (size_t)(cc->prefix + cc->tail_cap);
    uint8_t *attended = mkv_alloc(n_att, 1, "attended tokens", err);
    if (!attended)
        return MKV_ENOMEM;
    int rc = MKV_OK;
    uint64_t bytes = 0;
    for (int i = 0; i < b->n && !rc; i++) {
        const float *k = b->k + (size_t)i * kv_dim + (size_t)h * d, *v = b->v + (size_t)i * kv_dim + (size_t)h * d;
        if ((rc = cc->method->append(state, k, v, err))) {
            mkv_error_prefix(err, "method '%s': layer %d head %d", cc->method->name, l, h);
            break;
        }
        memset(attended, 0, n_att);
        mkv_attend_query aq = {.G = G, .d = d, .q = b->q + (size_t)i * q_dim + (size_t)h * G * d,
                               .pos = cc->prefix + base + i, .scale = 1.0 / sqrt((double)d)};
        mkv_attend_result r = {.out = a->out + (size_t)i * q_dim + (size_t)h * G * d, .attended = attended};
        if ((rc = cc->method->attend(state, &aq, &r, err)))
            mkv_error_prefix(err, "method '%s': layer %d head %d", cc->method->name, l, h);
        bytes += r.bytes_read;
    }
    cc->head_bytes[h] = bytes;
    mkv_free(attended);
    return rc;
}

/* Tasks on the forward pass's threads where the batch brings them. */
static int run_heads(const mkv_capture_batch *b, int n, int threads, mkv_task_fn fn, void *ctx, int *failed,
                     mkv_error *err)
{
    return b->threads ? mkv_run_tasks_on(b->threads, n, fn, ctx, failed, err)
                      : mkv_run_tasks(n, threads, fn, ctx, failed, err);
}

/* One decode token over a method that attends in pieces: tasks
 * [0, H) append each head's token and begin its attention, tasks
 * [H, H + H * pieces) run the pieces.  Tasks are taken in index order, so
 * a head's begin is always taken before its pieces; a piece whose begin
 * is still running on another thread waits for it (ready: 0 running, 1
 * done, -1 failed). */
typedef struct {
    mkv_ccache *cc;
    const mkv_capture_batch *b;
    float *out;
    size_t n_att;
    uint8_t *attended;          /* [H][n_att] */
    mkv_attend_query *aq;       /* [H] */
    mkv_attend_result *r;       /* [H] */
    void **jobs;                /* [H] */
    atomic_int *ready;          /* [H] */
} pieces_ctx;

static int pieces_task(void *ctx, int t, mkv_error *err)
{
    pieces_ctx *a = ctx;
    mkv_ccache *cc = a->cc;
    const mkv_method *m = cc->method;
    int H = cc->n_kv_heads;
    if (t >= H) {
        int h = (t - H) / m->attend_pieces, piece = (t - H) % m->attend_pieces, st;
        while ((st = atomic_load_explicit(&a->ready[h], memory_order_acquire)) == 0)
            sched_yield();
        if (st > 0)
            m->attend_piece(a->jobs[h], piece);
        return MKV_OK;
    }
    int h = t, l = a->b->layer, d = cc->d, G = cc->G;
    void *state = cc->states[head_index(cc, l, h)];
    int rc = m->append(state, a->b->k + (size_t)h * d, a->b->v + (size_t)h * d, err);
    if (!rc) {
        a->aq[h] = (mkv_attend_query){.G = G, .d = d, .q = a->b->q + (size_t)h * G * d,
                                      .pos = cc->prefix + cc->tail_len[l], .scale = 1.0 / sqrt((double)d)};
        a->r[h] = (mkv_attend_result){.out = a->out + (size_t)h * G * d, .attended = a->attended + (size_t)h * a->n_att};
        rc = m->attend_begin(state, &a->aq[h], &a->r[h], &a->jobs[h], err);
    }
    if (rc)
        mkv_error_prefix(err, "method '%s': layer %d head %d", m->name, l, h);
    atomic_store_explicit(&a->ready[h], rc ? -1 : 1, memory_order_release);
    return rc;
}

static int attention_in_pieces(mkv_ccache *cc, const mkv_capture_batch *b, float *out, mkv_error *err)
{
    int H = cc->n_kv_heads, failed;
    pieces_ctx a = {cc, b, out, (size_t)(cc->prefix + cc->tail_cap), NULL, NULL, NULL, NULL, NULL};
    a.attended = mkv_calloc((size_t)H, a.n_att, "attended tokens", err);
    a.aq = mkv_calloc((size_t)H, sizeof *a.aq, "attention queries", err);
    a.r = mkv_calloc((size_t)H, sizeof *a.r, "attention results", err);
    a.jobs = mkv_calloc((size_t)H, sizeof *a.jobs, "attention jobs", err);
    a.ready = mkv_calloc((size_t)H, sizeof *a.ready, "attention jobs", err);
    int rc = a.attended && a.aq && a.r && a.jobs && a.ready ? MKV_OK : MKV_ENOMEM;
    for (int h = 0; !rc && h < H; h++)
        atomic_init(&a.ready[h], 0);
    if (!rc)
        rc = run_heads(b, H * (1 + cc->method->attend_pieces), cc->threads, pieces_task, &a, &failed, err);
    /* after a failure some pieces never ran: the jobs are only freed */
    for (int h = 0; a.jobs && h < H; h++)
        if (a.jobs[h]) {
            cc->method->attend_end(a.jobs[h], rc ? NULL : &a.r[h]);
            cc->head_bytes[h] = rc ? 0 : a.r[h].bytes_read;
        }
    mkv_free(a.attended);
    mkv_free(a.aq);
    mkv_free(a.r);
    mkv_free(a.jobs);
    mkv_free((void *)a.ready);
    return rc;
}

static int head_task(void *ctx, int h, mkv_error *err)
{
    attention_ctx *a = ctx;
    mkv_ccache *cc = a->cc;
    if (cc->appends)
        return head_task_appending(a, h, err);
    const mkv_capture_batch *b = a->b;
    int l = b->layer, d = cc->d, G = cc->G, base = cc->tail_len[l];
    size_t kv_dim = (size_t)cc->n_kv_heads * (size_t)d, q_dim = (size_t)cc->n_heads * (size_t)d;
    for (int i = 0; i < b->n; i++) {
        float *tk = tail_row(cc, cc->tail_k, l, h, base + i), *tv = tail_row(cc, cc->tail_v, l, h, base + i);
        const float *k = b->k + (size_t)i * kv_dim + (size_t)h * d, *v = b->v + (size_t)i * kv_dim + (size_t)h * d;
        for (int j = 0; j < d; j++) {
            tk[j] = mkv_f16_to_f32(mkv_f32_to_f16(k[j]));
            tv[j] = mkv_f16_to_f32(mkv_f32_to_f16(v[j]));
        }
    }
    uint8_t *attended = mkv_alloc((size_t)cc->prefix, 1, "attended tokens", err);
    float *prefix_out = mkv_alloc((size_t)G * (size_t)d, sizeof(float), "prefix attention", err);
    double *lse = mkv_alloc((size_t)G, sizeof(double), "log-sum-exp", err);
    double *acc = mkv_alloc((size_t)d, sizeof(double), "attention accumulator", err);
    int rc = attended && prefix_out && lse && acc ? MKV_OK : MKV_ENOMEM;
    double scale = 1.0 / sqrt((double)d);
    uint64_t bytes = 0;
    for (int i = 0; i < b->n && !rc; i++) {
        const float *q = b->q + (size_t)i * q_dim + (size_t)h * G * d;
        memset(attended, 0, (size_t)cc->prefix);
        mkv_attend_query aq = {.G = G, .d = d, .q = q, .pos = cc->prefix - 1, .scale = scale};
        mkv_attend_result r = {.out = prefix_out, .attended = attended, .bytes_read = 0, .lse = lse};
        if ((rc = cc->method->attend(cc->states[head_index(cc, l, h)], &aq, &r, err))) {
            mkv_error_prefix(err, "method '%s': layer %d head %d", cc->method->name, l, h);
            break;
        }
        int visible = base + i + 1;
        bytes += r.bytes_read + (uint64_t)visible * 2u * (uint64_t)d * 2u;
        for (int g = 0; g < G; g++) {
            const float *qg = q + (size_t)g * d;
            mkv_osm s;
            mkv_osm_from_output(&s, acc, d, prefix_out + (size_t)g * d, lse[g]);
            for (int t = 0; t < visible; t++) {
                const float *tk = tail_row(cc, cc->tail_k, l, h, t);
                double dot = 0;
                for (int j = 0; j < d; j++)
                    dot += (double)qg[j] * tk[j];
                mkv_osm_add(&s, dot * scale, tail_row(cc, cc->tail_v, l, h, t));
            }
            mkv_osm_finish(&s, a->out + (size_t)i * q_dim + ((size_t)h * G + g) * d);
        }
    }
    cc->head_bytes[h] = bytes;
    mkv_free(attended);
    mkv_free(prefix_out);
    mkv_free(lse);
    mkv_free(acc);
    return rc;
}

int mkv_ccache_attention(void *user, const mkv_capture_batch *b, float *out, mkv_error *err)
{
    mkv_ccache *cc = user;
    if (cc->building)
        return mkv_fail(err, MKV_EUSAGE, "the compressed cache is still being built");
    if (b->layer < 0 || b->layer >= cc->n_layers)
        return mkv_fail(err, MKV_EUSAGE, "layer %d is not in the compressed cache", b->layer);
    if (b->pos0 != cc->prefix + cc->tail_len[b->layer])
        return mkv_fail(err, MKV_EUSAGE, "tokens at position %d do not follow the %lld cached",
                        b->pos0, (long long)(cc->prefix + cc->tail_len[b->layer]));
    if (b->n > cc->tail_cap - cc->tail_len[b->layer])
        return mkv_fail(err, MKV_EUSAGE, "the decode tail holds %d tokens; %d more do not fit", cc->tail_cap,
                        b->n);
    int rc;
    if (cc->appends && b->n == 1 && cc->threads > 1 && cc->method->attend_pieces > 1) {
        rc = attention_in_pieces(cc, b, out, err);
    } else {
        attention_ctx a = {cc, b, out};
        int failed, threads = cc->threads < cc->n_kv_heads ? cc->threads : cc->n_kv_heads;
        rc = run_heads(b, cc->n_kv_heads, threads, head_task, &a, &failed, err);
    }
    if (rc)
        return rc;
    cc->tail_len[b->layer] += b->n;
    uint64_t bytes = 0;
    for (int h = 0; h < cc->n_kv_heads; h++)
        bytes += cc->head_bytes[h];
    cc->bytes_read[b->layer] = bytes;
    return MKV_OK;
}

void *mkv_ccache_state(const mkv_ccache *cc, int layer, int head)
{
    return cc->states[head_index(cc, layer, head)];
}

void mkv_ccache_get_stats(const mkv_ccache *cc, mkv_ccache_stats *s)
{
    uint64_t heads = (uint64_t)cc->n_layers * (uint64_t)cc->n_kv_heads, per_token = 2u * (uint64_t)cc->d * 2u;
    s->prefix_tokens = cc->prefix;
    s->tail_tokens = cc->tail_len[0];
    s->prefix_bytes = cc->prefix_bytes;
    s->tail_bytes = heads * (uint64_t)cc->tail_len[0] * per_token;
    s->held_bytes = s->prefix_bytes + s->tail_bytes;
    if (cc->appends) {
        /* what the states hold now, new tokens the method's own way */
        s->held_bytes = 0;
        for (size_t i = 0; i < heads; i++)
            s->held_bytes += cc->method->state_bytes(cc->states[i]);
        s->tail_bytes = s->held_bytes > s->prefix_bytes ? s->held_bytes - s->prefix_bytes : 0;
    }
    s->logical_bytes = heads * (uint64_t)(cc->prefix + cc->tail_len[0]) * per_token;
    s->bytes_read = 0;
    for (int l = 0; l < cc->n_layers; l++)
        s->bytes_read += cc->bytes_read[l];
    memset(&s->growth, 0, sizeof s->growth);
    for (size_t i = 0; cc->method->decode_counters && i < heads; i++) {
        mkv_decode_counters c;
        cc->method->decode_counters(cc->states[i], &c);
        mkv_decode_counters *g = &s->growth;
        g->finalized += c.finalized;
        g->finalize_seconds += c.finalize_seconds;
        g->manager_cpu_seconds += c.manager_cpu_seconds;
        if (c.finalize_seconds_max > g->finalize_seconds_max)
            g->finalize_seconds_max = c.finalize_seconds_max;
        if (c.temp_tokens > g->temp_tokens)
            g->temp_tokens = c.temp_tokens;
        g->temp_bytes += c.temp_bytes;
        g->temp_bytes_peak += c.temp_bytes_peak;
        g->steps_waited += c.steps_waited;
    }
}

int mkv_ccache_flush(mkv_ccache *cc, mkv_error *err)
{
    if (cc->building)
        return mkv_fail(err, MKV_EUSAGE, "the compressed cache is still being built");
    size_t heads = (size_t)cc->n_layers * (size_t)cc->n_kv_heads;
    for (size_t i = 0; cc->method->decode_flush && i < heads; i++) {
        int rc = cc->method->decode_flush(cc->states[i], err);
        if (rc)
            return rc;
    }
    return MKV_OK;
}
