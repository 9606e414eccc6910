/* Magnitude statistics of one segment of K or V (analysis.h) and the
 * segments table (tables.h). */
#include "config.h"
#include "analysis/analysis.h"
#include "analysis/tables.h"

#include <math.h>
#include <stdio.h>

#include "core/tensor.h"

int mkv_segment_stats(const float *X, int64_t n, int d, double k, int top,
                      mkv_segment_summary *out, int *top_channels, mkv_error *err)
{
    if (n <= 0 || top < 1 || top > d)
        return mkv_fail(err, MKV_EUSAGE, "segment statistics: %lld tokens, top %d of %d channels",
                        (long long)n, top, d);
    double *energy = mkv_calloc(2 * (size_t)d, sizeof *energy, "channel energies", err);
    if (!energy)
        return err ? err->code : MKV_ENOMEM;
    const size_t count = (size_t)n * d;
    const double N = (double)count;

    /* First pass: sums for the means and the channel energies. */
    double sum = 0.0, sum_abs = 0.0, sum_sq = 0.0;
    for (int64_t t = 0; t < n; t++)
        for (int j = 0; j < d; j++) {
            double v = X[t * d + j];
            sum += v;
            sum_abs += fabs(v);
            sum_sq += v * v;
            energy[j] += v * v;
        }
    double mean = sum / N, mean_abs = sum_abs / N, rms = sqrt(sum_sq / N);

    /* Second pass: central moments (no cancellation) and outliers. */
    double m2 = 0.0, m4 = 0.0, abs_m2 = 0.0, limit = k * rms;
    size_t outliers = 0;
    for (size_t i = 0; i < count; i++) {
        double dev = X[i] - mean, dev2 = dev * dev, a = fabs((double)X[i]) - mean_abs;
        m2 += dev2;
        m4 += dev2 * dev2;
        abs_m2 += a * a;
        outliers += fabs((double)X[i]) > limit;
    }
    m2 /= N;
    m4 /= N;

    out->tokens = n;
    out->rms = rms;
    out->mag_var = abs_m2 / N;
    out->kurtosis = m2 > 0.0 ? m4 / (m2 * m2) - 3.0 : 0.0;
    out->outlier_share = (double)outliers / N;
    out->top_energy = mkv_top_share(energy, d, top, energy + d);
    if (top_channels)
        mkv_top_indices(energy, d, top, top_channels);
    mkv_free(energy);
    return MKV_OK;
}

/* ---- the segments table (tables.h) */

static int segments_begin(void *ctx, mkv_dump *d, FILE *out, mkv_error *err)
{
    mkv_segments_settings *cfg = ctx;
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    cfg->seg = cfg->S < m->n_tokens ? cfg->S : m->n_tokens;
    int rc = mkv_table_check_top(cfg->top, m, err);
    if (rc != MKV_OK)
        return rc;
    cfg->X = mkv_alloc((size_t)cfg->seg * (size_t)m->head_dim, sizeof *cfg->X,
                           "a segment", err);
    cfg->channels = cfg->X ? mkv_alloc((size_t)cfg->top, sizeof *cfg->channels,
                                               "channel indices", err)
                                   : NULL;
    if (!cfg->channels)
        return err->code;
    fprintf(out, "layer\thead\ttensor\tsegment\tstart\ttokens\trms\tmag_var\tkurtosis\t"
                 "outlier_share\ttop_energy\ttop_channels\n");
    return MKV_OK;
}

static int segments_rows(void *ctx, mkv_dump *d, int layer, int head, char kind, FILE *out,
                         mkv_error *err)
{
    mkv_segments_settings *cfg = ctx;
    const int64_t T = mkv_dump_meta_of(d)->n_tokens, seg = cfg->seg;
    const int hd = mkv_dump_meta_of(d)->head_dim, top = (int)cfg->top;
    for (int64_t s0 = 0, i = 0; s0 < T; s0 += seg, i++) {
        int64_t n = T - s0 < seg ? T - s0 : seg;
        mkv_segment_summary sum;
        int rc = mkv_dump_read_finite(d, layer, kind, head, 1, s0, n, cfg->X, err);
        if (rc == MKV_OK)
            rc = mkv_segment_stats(cfg->X, n, hd, cfg->factor, top, &sum, cfg->channels,
                                   err);
        if (rc != MKV_OK)
            return rc;
        fprintf(out, "%d\t%d\t%c\t%lld\t%lld\t%lld\t%.9g\t%.9g\t%.9g\t%.9g\t%.9g\t", layer, head,
                kind, (long long)i, (long long)s0, (long long)n, sum.rms, sum.mag_var,
                sum.kurtosis, sum.outlier_share, sum.top_energy);
        for (int c = 0; c < top; c++)
            fprintf(out, "%d%c", cfg->channels[c], c + 1 < top ? ',' : '\n');
    }
    return MKV_OK;
}

static void segments_end(void *ctx)
{
    mkv_segments_settings *cfg = ctx;
    mkv_free(cfg->X);
    mkv_free(cfg->channels);
}

const mkv_table_analysis mkv_segments_table = {"segments", 1, segments_begin, segments_rows,
                                               segments_end};
