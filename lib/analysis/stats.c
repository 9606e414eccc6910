/* Summary statistics of KV tensors (see stats.h for the outlier rule) and
 * the stats table (tables.h). */
#include "config.h"
#include "analysis/stats.h"
#include "analysis/tables.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/tensor.h"

/* Tokens read per mkv_dump_read call: bounds memory for long contexts. */
#define STATS_CHUNK_TOKENS 4096

int mkv_tensor_stats_init(mkv_tensor_stats *s, int head_dim, mkv_error *err)
{
    memset(s, 0, sizeof *s);
    if (head_dim <= 0)
        return mkv_fail(err, MKV_EUSAGE, "head_dim must be positive (got %d)", head_dim);
    s->head_dim = head_dim;
    s->channel_sumsq = calloc((size_t)head_dim, sizeof *s->channel_sumsq);
    s->scratch = calloc(2 * (size_t)head_dim, sizeof *s->scratch);
    if (!s->channel_sumsq || !s->scratch) {
        mkv_tensor_stats_free(s);
        return mkv_fail(err, MKV_ENOMEM, "out of memory for channel statistics (head_dim %d)", head_dim);
    }
    return MKV_OK;
}

void mkv_tensor_stats_reset(mkv_tensor_stats *s)
{
    s->n_tokens = 0;
    s->mean = 0.0;
    s->m2 = 0.0;
    s->absmax = 0.0;
    memset(s->channel_sumsq, 0, (size_t)s->head_dim * sizeof *s->channel_sumsq);
}

void mkv_tensor_stats_add(mkv_tensor_stats *s, const float *x, int64_t n_tokens)
{
    if (n_tokens <= 0)
        return;
    const int d = s->head_dim;
    const double nb = (double)n_tokens * d;

    /* Two passes over the chunk give its own mean and M2 without the
     * cancellation of a sum-of-squares formula... */
    double sum = 0.0;
    for (int64_t t = 0; t < n_tokens; t++) {
        const float *row = x + t * d;
        for (int j = 0; j < d; j++) {
            double v = row[j];
            sum += v;
            s->channel_sumsq[j] += v * v;
            if (fabs(v) > s->absmax)
                s->absmax = fabs(v);
        }
    }
    double chunk_mean = sum / nb;
    double chunk_m2 = 0.0;
    for (int64_t i = 0; i < n_tokens * d; i++) {
        double dev = x[i] - chunk_mean;
        chunk_m2 += dev * dev;
    }

    /* ...and Chan et al.'s pairwise update merges it into the running totals. */
    double na = (double)s->n_tokens * d;
    double n = na + nb;
    double delta = chunk_mean - s->mean;
    s->mean += delta * (nb / n);
    s->m2 += chunk_m2 + delta * delta * (na * nb / n);
    s->n_tokens += n_tokens;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double mkv_median_inplace(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int mkv_count_outlier_channels(const double *rms, int n, double factor,
                               double *scratch, double *median)
{
    memcpy(scratch, rms, (size_t)n * sizeof *scratch);
    double med = mkv_median_inplace(scratch, n);
    double limit = factor * med;
    int count = 0;
    for (int j = 0; j < n; j++)
        if (rms[j] > limit)
            count++;
    if (median)
        *median = med;
    return count;
}

void mkv_tensor_stats_summarize(mkv_tensor_stats *s, double outlier_factor,
                                mkv_tensor_summary *out)
{
    const int d = s->head_dim;
    memset(out, 0, sizeof *out);
    out->n_tokens = s->n_tokens;
    if (s->n_tokens == 0)
        return;
    out->mean = s->mean;
    out->std = sqrt(s->m2 / ((double)s->n_tokens * d));
    out->absmax = s->absmax;

    /* scratch holds the channel RMS in its first half and the copy the
     * median sorts in its second half. */
    double *rms = s->scratch;
    double rms_max = 0.0;
    for (int j = 0; j < d; j++) {
        rms[j] = sqrt(s->channel_sumsq[j] / (double)s->n_tokens);
        if (rms[j] > rms_max)
            rms_max = rms[j];
    }
    out->rms_max = rms_max;
    out->outlier_channels = mkv_count_outlier_channels(rms, d, outlier_factor, rms + d,
                                                       &out->rms_median);
}

void mkv_tensor_stats_free(mkv_tensor_stats *s)
{
    free(s->channel_sumsq);
    free(s->scratch);
    s->channel_sumsq = NULL;
    s->scratch = NULL;
}

int mkv_dump_tensor_stats(mkv_dump *d, int layer, char kind, int head,
                          mkv_tensor_stats *s, mkv_error *err)
{
    const mkv_dump_meta *meta = mkv_dump_meta_of(d);
    const int64_t T = meta->n_tokens;
    const int64_t chunk = T < STATS_CHUNK_TOKENS ? T : STATS_CHUNK_TOKENS;
    mkv_tensor_stats_reset(s);
    if (T == 0)
        return MKV_OK;
    float *buf = mkv_alloc((size_t)chunk, (size_t)s->head_dim * sizeof(float), "a chunk of tokens", err);
    if (!buf)
        return err ? err->code : MKV_ENOMEM;
    int rc = MKV_OK;
    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
        int64_t nt = T - t0 < chunk ? T - t0 : chunk;
        rc = mkv_dump_read(d, layer, kind, head, 1, t0, nt, buf, err);
        if (rc != MKV_OK)
            break;
        int64_t bad = mkv_find_nonfinite(buf, (size_t)nt * (size_t)s->head_dim);
        if (bad >= 0) {
            float v = buf[bad];
            rc = mkv_fail(err, MKV_EFORMAT, "'%s': /layers/%02d/%c: %s at [%d,%lld,%d]",
                          mkv_dump_path(d), layer, kind,
                          isnan(v) ? "NaN" : v > 0 ? "Inf" : "-Inf", head,
                          (long long)(t0 + bad / s->head_dim), (int)(bad % s->head_dim));
            break;
        }
        mkv_tensor_stats_add(s, buf, nt);
    }
    mkv_free(buf);
    return rc;
}

/* ---- the stats table (tables.h) */

static int stats_begin(void *ctx, mkv_dump *d, FILE *out, mkv_error *err)
{
    mkv_stats_settings *cfg = ctx;
    int rc = mkv_tensor_stats_init(&cfg->acc, mkv_dump_meta_of(d)->head_dim, err);
    if (rc == MKV_OK)
        fprintf(out, "layer\thead\ttensor\ttokens\tmean\tstd\tabsmax\t"
                     "rms_median\trms_max\toutlier_channels\n");
    return rc;
}

static int stats_rows(void *ctx, mkv_dump *d, int layer, int head, char kind, FILE *out,
                      mkv_error *err)
{
    mkv_stats_settings *cfg = ctx;
    int rc = mkv_dump_tensor_stats(d, layer, kind, head, &cfg->acc, err);
    if (rc != MKV_OK)
        return rc;
    mkv_tensor_summary s;
    mkv_tensor_stats_summarize(&cfg->acc, cfg->factor, &s);
    fprintf(out, "%d\t%d\t%c\t%" PRId64 "\t%.9g\t%.9g\t%.9g\t%.9g\t%.9g\t%d\n", layer, head, kind,
            s.n_tokens, s.mean, s.std, s.absmax, s.rms_median, s.rms_max, s.outlier_channels);
    return MKV_OK;
}

static void stats_end(void *ctx)
{
    mkv_stats_settings *cfg = ctx;
    mkv_tensor_stats_free(&cfg->acc);
}

const mkv_table_analysis mkv_stats_table = {"stats", 1, stats_begin, stats_rows, stats_end};
