/* Attention sparsity of one query: mass in the most probable keys
 * (analysis.h), and the sparsity table (tables.h). */
#include "config.h"
#include "analysis/analysis.h"
#include "analysis/tables.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/tensor.h"

static int cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

void mkv_topk_mass(const float *q, const float *K, int64_t n, int d, const double *fractions,
                   int n_fractions, double *mass, double *scratch)
{
    const double scale = 1.0 / sqrt((double)d);
    double smax = -INFINITY;
    for (int64_t t = 0; t < n; t++) {
        double s = 0.0;
        for (int j = 0; j < d; j++)
            s += (double)q[j] * K[t * d + j];
        scratch[t] = s * scale;
        if (scratch[t] > smax)
            smax = scratch[t];
    }
    double z = 0.0;
    for (int64_t t = 0; t < n; t++) {
        scratch[t] = exp(scratch[t] - smax);
        z += scratch[t];
    }
    qsort(scratch, (size_t)n, sizeof *scratch, cmp_desc);
    /* fractions may come in any order: each sums its own prefix. */
    for (int i = 0; i < n_fractions; i++) {
        int64_t k = mkv_fraction_count(fractions[i], n);
        double top = 0.0;
        for (int64_t t = 0; t < k; t++)
            top += scratch[t];
        mass[i] = top / z;
    }
}

/* ---- the sparsity table (tables.h) */

/* Positions of the dump's queries, refusing a dump without any (the
 * query-based analyses have nothing to measure then). */
static int32_t *read_query_positions(mkv_dump *d, mkv_error *err)
{
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    if (m->n_queries == 0) {
        mkv_fail(err, MKV_EFORMAT, "'%s' has no queries (W = 0)", mkv_dump_path(d));
        return NULL;
    }
    int32_t *pos = mkv_alloc((size_t)m->n_queries, sizeof *pos, "query positions", err);
    if (pos && mkv_dump_read_query_pos(d, pos, err) != MKV_OK) {
        mkv_free(pos);
        return NULL;
    }
    return pos;
}

static int sparsity_begin(void *ctx, mkv_dump *d, FILE *out, mkv_error *err)
{
    mkv_sparsity_settings *cfg = ctx;
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    const int64_t W = m->n_queries;
    const int hd = m->head_dim, G = m->n_heads / m->n_kv_heads, nf = cfg->n_fractions;
    cfg->pos = read_query_positions(d, err);
    cfg->keys = 0;
    for (int64_t w = 0; cfg->pos && w < W; w++)
        cfg->keys = cfg->pos[w] + 1 > cfg->keys ? cfg->pos[w] + 1 : cfg->keys;
    const int64_t keys = cfg->keys;
    cfg->K = cfg->pos ? mkv_alloc((size_t)keys * (size_t)hd, sizeof *cfg->K,
                                          "one head's keys", err)
                              : NULL;
    cfg->Q = cfg->K ? mkv_alloc((size_t)G * (size_t)W * (size_t)hd, sizeof *cfg->Q,
                                        "queries", err)
                            : NULL;
    cfg->scratch = cfg->Q ? mkv_alloc((size_t)keys, sizeof *cfg->scratch,
                                              "attention weights", err)
                                  : NULL;
    cfg->sums = cfg->scratch ? mkv_alloc(3 * (size_t)nf, sizeof *cfg->sums, "sums", err)
                                     : NULL;
    if (!cfg->sums)
        return err->code;
    char pct[32];
    fprintf(out, "layer\thead\tkv_head\tqueries");
    for (int f = 0; f < nf; f++) {
        mkv_table_percent(cfg->fractions[f], pct, sizeof pct);
        fprintf(out, "\ttop%s_mean\ttop%s_min", pct, pct);
    }
    fputc('\n', out);
    return MKV_OK;
}

static int sparsity_rows(void *ctx, mkv_dump *d, int layer, int kv, char kind, FILE *out,
                         mkv_error *err)
{
    mkv_sparsity_settings *cfg = ctx;
    (void)kind;
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    const int64_t W = m->n_queries;
    const int hd = m->head_dim, G = m->n_heads / m->n_kv_heads, nf = cfg->n_fractions;
    const float *K = cfg->K, *Q = cfg->Q;
    int rc = mkv_dump_read_finite(d, layer, 'k', kv, 1, 0, cfg->keys, cfg->K, err);
    if (rc == MKV_OK)
        rc = mkv_dump_read_finite(d, layer, 'q', kv * G, G, 0, W, cfg->Q, err);
    for (int g = 0; g < G && rc == MKV_OK; g++) {
        double *sum = cfg->sums, *min = sum + nf, *mass = sum + 2 * nf;
        for (int f = 0; f < nf; f++)
            sum[f] = 0.0, min[f] = 1.0;
        for (int64_t w = 0; w < W; w++) {
            mkv_topk_mass(Q + ((size_t)g * W + w) * hd, K, cfg->pos[w] + 1, hd,
                          cfg->fractions, nf, mass, cfg->scratch);
            for (int f = 0; f < nf; f++) {
                sum[f] += mass[f];
                min[f] = mass[f] < min[f] ? mass[f] : min[f];
            }
        }
        fprintf(out, "%d\t%d\t%d\t%lld", layer, kv * G + g, kv, (long long)W);
        for (int f = 0; f < nf; f++)
            fprintf(out, "\t%.9g\t%.9g", sum[f] / (double)W, min[f]);
        fputc('\n', out);
    }
    return rc;
}

static void sparsity_end(void *ctx)
{
    mkv_sparsity_settings *cfg = ctx;
    mkv_free(cfg->pos);
    mkv_free(cfg->K);
    mkv_free(cfg->Q);
    mkv_free(cfg->scratch);
    mkv_free(cfg->sums);
}

const mkv_table_analysis mkv_sparsity_table = {"sparsity", 0, sparsity_begin, sparsity_rows,
                                               sparsity_end};
