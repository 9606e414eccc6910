/* ThinK-style key-channel importance (analysis.h) and the channels table
 * (tables.h). */
#include "config.h"
#include "analysis/analysis.h"
#include "analysis/tables.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/tensor.h"

void mkv_channel_sumsq_add(double *sumsq, const float *X, int64_t n, int d)
{
    for (int64_t t = 0; t < n; t++)
        for (int j = 0; j < d; j++)
            sumsq[j] += (double)X[t * d + j] * X[t * d + j];
}

/* ||a b^T||_F^2 = sum_{s,t} a_s^2 b_t^2 = ||a||^2 ||b||^2 */
void mkv_channel_scores(const double *q_sumsq, const double *k_sumsq, int d, double *score)
{
    for (int j = 0; j < d; j++)
        score[j] = sqrt(q_sumsq[j] * k_sumsq[j]);
}

/* ---- the channels table (tables.h) */

/* Tokens read per call when summing the keys' channel energies. */
#define CHANNEL_CHUNK_TOKENS 4096

static int channels_begin(void *ctx, mkv_dump *d, FILE *out, mkv_error *err)
{
    mkv_channels_settings *cfg = ctx;
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    const int64_t T = m->n_tokens, W = m->n_queries;
    const int hd = m->head_dim, G = m->n_heads / m->n_kv_heads;
    cfg->chunk = T < CHANNEL_CHUNK_TOKENS ? T : CHANNEL_CHUNK_TOKENS;
    int rc = mkv_table_check_top(cfg->top, m, err);
    if (rc == MKV_OK && W == 0)
        rc = mkv_fail(err, MKV_EFORMAT, "'%s' has no queries (W = 0)", mkv_dump_path(d));
    if (rc != MKV_OK)
        return rc;
    cfg->K = mkv_alloc((size_t)cfg->chunk * hd, sizeof *cfg->K, "a chunk of keys", err);
    cfg->Q = cfg->K ? mkv_alloc((size_t)G * (size_t)W * (size_t)hd, sizeof *cfg->Q,
                                        "queries", err)
                            : NULL;
    cfg->work = cfg->Q ? mkv_alloc(4 * (size_t)hd, sizeof *cfg->work, "channel scores",
                                           err)
                               : NULL;
    cfg->order = cfg->work ? mkv_alloc((size_t)hd, sizeof *cfg->order,
                                               "channel ranks", err)
                                   : NULL;
    if (!cfg->order)
        return err->code;
    if (cfg->full) {
        fprintf(out, "layer\thead\tchannel\trank\tscore\tshare\n");
    } else {
        fprintf(out, "layer\thead\tqueries\tkeys\ttop_channels");
        mkv_table_percent_columns(out, "share_top", cfg->shares, cfg->n_shares);
    }
    return MKV_OK;
}

static int channels_rows(void *ctx, mkv_dump *d, int layer, int kv, char kind, FILE *out,
                         mkv_error *err)
{
    mkv_channels_settings *cfg = ctx;
    (void)kind;
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    const int64_t T = m->n_tokens, W = m->n_queries, chunk = cfg->chunk;
    const int hd = m->head_dim, G = m->n_heads / m->n_kv_heads, top = (int)cfg->top;
    double *work = cfg->work, *qsq = work, *ksq = work + hd, *score = work + 2 * hd,
           *scratch = work + 3 * hd;
    int *order = cfg->order;
    int rc = MKV_OK;
    memset(work, 0, 2 * (size_t)hd * sizeof *work);
    for (int64_t t0 = 0; t0 < T && rc == MKV_OK; t0 += chunk) {
        int64_t n = T - t0 < chunk ? T - t0 : chunk;
        rc = mkv_dump_read_finite(d, layer, 'k', kv, 1, t0, n, cfg->K, err);
        if (rc == MKV_OK)
            mkv_channel_sumsq_add(ksq, cfg->K, n, hd);
    }
    if (rc == MKV_OK)
        rc = mkv_dump_read_finite(d, layer, 'q', kv * G, G, 0, W, cfg->Q, err);
    if (rc != MKV_OK)
        return rc;
    mkv_channel_sumsq_add(qsq, cfg->Q, (int64_t)G * W, hd);
    mkv_channel_scores(qsq, ksq, hd, score);
    if (cfg->full) {
        double total = 0.0;
        for (int j = 0; j < hd; j++)
            total += score[j];
        mkv_top_indices(score, hd, hd, order);
        for (int r = 0; r < hd; r++)
            fprintf(out, "%d\t%d\t%d\t%d\t%.9g\t%.9g\n", layer, kv, order[r], r + 1,
                    score[order[r]], total > 0.0 ? score[order[r]] / total : 0.0);
        return MKV_OK;
    }
    mkv_top_indices(score, hd, top, order);
    fprintf(out, "%d\t%d\t%lld\t%lld\t", layer, kv, (long long)G * W, (long long)T);
    for (int c = 0; c < top; c++)
        fprintf(out, "%d%s", order[c], c + 1 < top ? "," : "");
    for (int s = 0; s < cfg->n_shares; s++)
        fprintf(out, "\t%.9g", mkv_top_share(score, hd, mkv_keep_count(cfg->shares[s], hd), scratch));
    fputc('\n', out);
    return MKV_OK;
}

static void channels_end(void *ctx)
{
    mkv_channels_settings *cfg = ctx;
    mkv_free(cfg->K);
    mkv_free(cfg->Q);
    mkv_free(cfg->work);
    mkv_free(cfg->order);
}

const mkv_table_analysis mkv_channels_table = {"channels", 0, channels_begin, channels_rows,
                                               channels_end};
