/* The compression driver: a loop over layers that reads all heads of a
 * layer, compresses its KV heads in parallel (each head is independent)
 * and moves on. All HDF5 reading happens between layers, never while the
 * workers write. */
#include "config.h"
#include "methods/compress.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/tasks.h"
#include "core/tensor.h"
#include "methods/head_budget.h"

int mkv_compress_head(const mkv_compressor *c, const mkv_head_kv *in, mkv_cdump_writer *w,
                      mkv_error *err)
{
    int rc = c->method->compress(c->params, in, w, err);
    if (rc && !err->msg[0])
        mkv_fail(err, rc, "method '%s' failed without a message", c->method->name);
    return rc;
}

/* What the workers of one layer share. */
typedef struct {
    const mkv_compressor *c;
    const mkv_dump_meta *m;
    const mkv_layer_kv *l;
    mkv_cdump_writer *w;
    int threads_per_head;
} layer_job;

/* Task h of mkv_run_tasks: KV head h of the layer. */
static int compress_task(void *ctx, int h, mkv_error *err)
{
    const layer_job *j = ctx;
    const mkv_dump_meta *m = j->m;
    int G = m->n_heads / m->n_kv_heads;
    size_t kv_head = mkv_layer_head_stride(j->l, m);
    size_t q_group = (size_t)G * (size_t)m->n_queries * (size_t)m->head_dim;
    mkv_head_kv in = {
        .layer = j->l->layer,
        .head = h,
        .T = m->n_tokens,
        .d = m->head_dim,
        .G = G,
        .k = j->l->k + (size_t)h * kv_head,
        .v = j->l->v + (size_t)h * kv_head,
        .W = m->n_queries,
        /* query heads h*G .. h*G+G-1 are consecutive: [G][W][d] */
        .q = m->n_queries ? j->l->q + (size_t)h * q_group : NULL,
        .query_pos = j->l->query_pos,
        .threads = j->threads_per_head,
        .budget_scale = j->l->budget_scale ? j->l->budget_scale[h] : 0,
    };
    return mkv_compress_head(j->c, &in, j->w, err);
}

size_t mkv_layer_head_stride(const mkv_layer_kv *l, const mkv_dump_meta *m)
{
    return l->head_stride ? l->head_stride : (size_t)m->n_tokens * (size_t)m->head_dim;
}

/* ---------------------------------------------------------------- per-head budgets */

int mkv_budget_plan_init(const mkv_compressor *c, const mkv_dump_meta *m, mkv_budget_plan *bp, mkv_error *err)
{
    memset(bp, 0, sizeof *bp);
    if (!c->method->head_budget_rule || !c->method->head_budget_rule(c->params, &bp->rule))
        return MKV_OK;
    if (m->n_queries == 0) {
        mkv_warn("%s: the dump has no observation queries to plan per-head budgets from: every head gets %g",
                 c->method->name, bp->rule.mean);
        return MKV_OK;
    }
    size_t n = (size_t)m->n_layers * (size_t)m->n_kv_heads;
    bp->curves = mkv_alloc(n * MKV_HEAD_BUDGET_POINTS, sizeof *bp->curves, "coverage curves", err);
    return bp->curves ? MKV_OK : (err ? err->code : MKV_ENOMEM);
}

int mkv_budget_plan_wanted(const mkv_budget_plan *bp) { return bp->curves != NULL; }

typedef struct {
    const mkv_dump_meta *m;
    const mkv_layer_kv *l;
    const mkv_head_budget_rule *rule;
    double *curves;
} curve_job;

static int curve_task(void *ctx, int h, mkv_error *err)
{
    const curve_job *j = ctx;
    const mkv_dump_meta *m = j->m;
    int G = m->n_heads / m->n_kv_heads;
    mkv_head_kv in = {
        .layer = j->l->layer, .head = h, .T = m->n_tokens, .d = m->head_dim, .G = G,
        .k = j->l->k + (size_t)h * mkv_layer_head_stride(j->l, m),
        .v = j->l->v + (size_t)h * mkv_layer_head_stride(j->l, m),
        .W = m->n_queries,
        .q = j->l->q + (size_t)h * (size_t)G * (size_t)m->n_queries * (size_t)m->head_dim,
        .query_pos = j->l->query_pos,
    };
    return mkv_head_error_curve(&in, j->rule->sink, j->rule->recent, j->curves + (size_t)h * MKV_HEAD_BUDGET_POINTS,
                                err);
}

int mkv_budget_plan_layer(mkv_budget_plan *bp, const mkv_dump_meta *m, const mkv_layer_kv *l, int threads,
                          mkv_error *err)
{
    curve_job j = {m, l, &bp->rule, bp->curves + (size_t)l->layer * (size_t)m->n_kv_heads * MKV_HEAD_BUDGET_POINTS};
    int h, rc = mkv_run_tasks(m->n_kv_heads, threads, curve_task, &j, &h, err);
    return rc && h >= 0 ? mkv_error_prefix(err, "layer %d head %d", l->layer, h) : rc;
}

int mkv_budget_plan_finish(mkv_budget_plan *bp, const mkv_dump_meta *m, mkv_error *err)
{
    if (!bp->curves)
        return MKV_OK;
    int n = m->n_layers * m->n_kv_heads;
    if (!(bp->scale = mkv_alloc((size_t)n, sizeof *bp->scale, "per-head budgets", err)))
        return err ? err->code : MKV_ENOMEM;
    int rc = mkv_allocate_head_budgets(bp->curves, n, bp->rule.mean, bp->rule.floor_frac, bp->scale, err);
    for (int i = 0; i < n && rc == MKV_OK; i++)
        bp->scale[i] /= bp->rule.mean;
    return rc;
}

void mkv_budget_plan_free(mkv_budget_plan *bp)
{
    mkv_free(bp->curves);
    mkv_free(bp->scale);
    memset(bp, 0, sizeof *bp);
}

int mkv_compress_layer(const mkv_compressor *c, const mkv_dump_meta *m, const mkv_layer_kv *l,
                       int threads, mkv_cdump_writer *w, mkv_error *err)
{
    int concurrent = threads < m->n_kv_heads ? threads : m->n_kv_heads;
    layer_job j = {
        .c = c,
        .m = m,
        .l = l,
        .w = w,
        .threads_per_head = threads / concurrent > 0 ? threads / concurrent : 1,
    };
    int h;
    int rc = mkv_run_tasks(m->n_kv_heads, threads, compress_task, &j, &h, err);
    if (rc != MKV_OK && h >= 0) {
        /* name the head unless the message (from lib/io/cdump.c) does */
        char tag[64];
        snprintf(tag, sizeof tag, "layer %d head %d:", l->layer, h);
        if (strncmp(err->msg, tag, strlen(tag)) != 0)
            mkv_error_prefix(err, "layer %d head %d", l->layer, h);
    }
    return rc;
}

int mkv_compress_dump(const mkv_compressor *c, const char *input, const char *output, int threads,
                      mkv_compress_bytes *bytes, mkv_error *err)
{
    mkv_dump *d = NULL;
    int rc = mkv_dump_open(input, &d, err);
    if (rc)
        return rc;
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    mkv_cdump_writer *w = NULL;
    int32_t *query_pos = NULL;
    float *k = NULL, *v = NULL, *q = NULL;
    mkv_budget_plan plan = {0};

    if ((rc = c->method->check(c->params, m, err))) {
        mkv_error_prefix(err, "method '%s'", c->method->name);
        goto done;
    }
    size_t kv_n, q_n;
    if (mkv_mul_size3((size_t)m->n_kv_heads, (size_t)m->n_tokens, (size_t)m->head_dim, &kv_n) ||
        mkv_mul_size3((size_t)m->n_heads, (size_t)m->n_queries, (size_t)m->head_dim, &q_n)) {
        rc = mkv_fail(err, MKV_ENOMEM, "'%s': a layer is too large to hold in memory", mkv_dump_path(d));
        goto done;
    }
    query_pos = calloc((size_t)m->n_queries + 1, sizeof *query_pos);
    k = mkv_alloc(kv_n, sizeof(float), "keys of a layer", err);
    v = mkv_alloc(kv_n, sizeof(float), "values of a layer", err);
    q = mkv_alloc(q_n ? q_n : 1, sizeof(float), "queries of a layer", err);
    if (!query_pos || !k || !v || !q) {
        rc = mkv_fail(err, MKV_ENOMEM, "out of memory for one layer of '%s'", mkv_dump_path(d));
        goto done;
    }
    if ((rc = mkv_dump_read_query_pos(d, query_pos, err)))
        goto done;

    mkv_cdump_meta cm;
    memset(&cm, 0, sizeof cm);
    snprintf(cm.method, sizeof cm.method, "%s", c->method->name);
    mkv_params_format(c->params, cm.params, sizeof cm.params);
    snprintf(cm.source, sizeof cm.source, "%s", input);
    cm.raw = *m;
    if ((rc = mkv_cdump_create(output, input, &cm, query_pos, &w, err)))
        goto done;

    mkv_info("%s: %d layers x %d KV heads x %" PRId64 " tokens, head_dim %d, %" PRId64
             " queries; method %s (%s), %d threads",
             mkv_dump_path(d), m->n_layers, m->n_kv_heads, m->n_tokens, m->head_dim, m->n_queries,
             c->method->name, cm.params[0] ? cm.params : "no parameters", threads);
    mkv_layer_kv layer = {.k = k, .v = v, .q = q, .query_pos = query_pos};
    if ((rc = mkv_budget_plan_init(c, m, &plan, err)))
        goto done;
    for (int l = 0; l < m->n_layers && !rc && mkv_budget_plan_wanted(&plan); l++) {
        layer.layer = l;
        if ((rc = mkv_dump_read_finite(d, l, 'k', 0, m->n_kv_heads, 0, m->n_tokens, k, err)) ||
            (rc = mkv_dump_read_finite(d, l, 'v', 0, m->n_kv_heads, 0, m->n_tokens, v, err)) ||
            (rc = mkv_dump_read_finite(d, l, 'q', 0, m->n_heads, 0, m->n_queries, q, err)))
            break;
        rc = mkv_budget_plan_layer(&plan, m, &layer, threads, err);
    }
    if (rc || (rc = mkv_budget_plan_finish(&plan, m, err)))
        goto done;
    uint32_t digest = 0;
    mkv_progress progress;
    mkv_progress_start(&progress, "compressing", m->n_layers);
    for (int l = 0; l < m->n_layers && !rc; l++) {
        layer.layer = l;
        layer.budget_scale = plan.scale ? plan.scale + (size_t)l * (size_t)m->n_kv_heads : NULL;
        if ((rc = mkv_dump_read_finite(d, l, 'k', 0, m->n_kv_heads, 0, m->n_tokens, k, err)) ||
            (rc = mkv_dump_read_finite(d, l, 'v', 0, m->n_kv_heads, 0, m->n_tokens, v, err)) ||
            (rc = mkv_dump_read_finite(d, l, 'q', 0, m->n_heads, 0, m->n_queries, q, err)))
            break;
        digest = mkv_kv_digest_update(mkv_kv_digest_update(digest, k, kv_n), v, kv_n);
        rc = mkv_compress_layer(c, m, &layer, threads, w, err);
        mkv_progress_update(&progress, l + 1);
    }
    mkv_progress_finish(&progress);
    if (!rc) {
        bytes->logical_bytes = cm.raw.n_layers * (uint64_t)cm.raw.n_kv_heads * 2 *
                               (uint64_t)m->n_tokens * (uint64_t)m->head_dim * 2;
        bytes->physical_bytes = mkv_cdump_total_bytes(w);
        if (c->method->check_result)
            c->method->check_result(c->params, m, w);
        char text[MKV_KV_DIGEST_TEXT];
        mkv_kv_digest_text(digest, text);
        mkv_cdump_set_source_digest(w, text);
        rc = mkv_cdump_commit(w, err);
        w = NULL;
    }
done:
    if (w)
        mkv_cdump_abort(w);
    mkv_budget_plan_free(&plan);
    mkv_free(k);
    mkv_free(v);
    mkv_free(q);
    free(query_pos);
    mkv_dump_close(d);
    return rc;
}
