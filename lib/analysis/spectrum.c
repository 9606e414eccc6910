/* Eigenvalue energy of a segment's covariance X^T X (analysis.h) and the
 * spectrum table (tables.h). */
#include "config.h"
#include "analysis/analysis.h"
#include "analysis/tables.h"

#include <stdio.h>

#include "core/eigen.h"
#include "core/tensor.h"

int mkv_spectrum(const float *X, int64_t n, int d, double *evals, mkv_error *err)
{
    double *C = mkv_calloc((size_t)d * d, sizeof *C, "a covariance matrix", err);
    if (!C)
        return err ? err->code : MKV_ENOMEM;
    int rc = mkv_gram_add(C, X, n, d, err);
    if (rc == MKV_OK)
        rc = mkv_eigh(C, d, evals, NULL, err);
    mkv_free(C);
    if (rc != MKV_OK)
        return rc;
    /* X^T X is positive semi-definite: a negative eigenvalue is rounding. */
    for (int j = 0; j < d; j++)
        if (evals[j] < 0.0)
            evals[j] = 0.0;
    return MKV_OK;
}

int mkv_energy_rank(const double *evals, int d, double share)
{
    double total = 0.0;
    for (int j = 0; j < d; j++)
        total += evals[j];
    double goal = share * total, cum = 0.0;
    for (int k = 0; k < d; k++) {
        if (cum >= goal)
            return k;
        cum += evals[k];
    }
    return d;
}

/* ---- the spectrum table (tables.h) */

static int spectrum_begin(void *ctx, mkv_dump *d, FILE *out, mkv_error *err)
{
    mkv_spectrum_settings *cfg = ctx;
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    const int64_t T = m->n_tokens;
    cfg->seg = cfg->S == 0 || cfg->S > T ? T : cfg->S;
    cfg->X = mkv_alloc((size_t)cfg->seg * (size_t)m->head_dim, sizeof *cfg->X,
                           "a segment", err);
    cfg->evals = cfg->X ? mkv_alloc((size_t)m->head_dim, sizeof *cfg->evals,
                                            "eigenvalues", err)
                                : NULL;
    if (!cfg->evals)
        return err->code;
    if (cfg->full) {
        fprintf(out, "layer\thead\ttensor\tsegment\tstart\ttokens\tindex\teigenvalue\tshare\t"
                     "cumulative\n");
    } else {
        fprintf(out, "layer\thead\ttensor\tsegment\tstart\ttokens\tenergy\tlambda1_share");
        mkv_table_percent_columns(out, "d", cfg->energy, cfg->n_energy);
    }
    return MKV_OK;
}

static int spectrum_rows(void *ctx, mkv_dump *d, int layer, int head, char kind, FILE *out,
                         mkv_error *err)
{
    mkv_spectrum_settings *cfg = ctx;
    const int64_t T = mkv_dump_meta_of(d)->n_tokens, seg = cfg->seg;
    const int hd = mkv_dump_meta_of(d)->head_dim;
    const double *evals = cfg->evals;
    for (int64_t s0 = 0, i = 0; s0 < T; s0 += seg, i++) {
        int64_t n = T - s0 < seg ? T - s0 : seg;
        int rc = mkv_dump_read_finite(d, layer, kind, head, 1, s0, n, cfg->X, err);
        if (rc == MKV_OK)
            rc = mkv_spectrum(cfg->X, n, hd, cfg->evals, err);
        if (rc != MKV_OK)
            return rc;
        double total = 0.0;
        for (int j = 0; j < hd; j++)
            total += evals[j];
        double share = total > 0.0 ? 1.0 / total : 0.0;
        if (cfg->full) {
            double cum = 0.0;
            for (int j = 0; j < hd; j++) {
                cum += evals[j];
                fprintf(out, "%d\t%d\t%c\t%lld\t%lld\t%lld\t%d\t%.9g\t%.9g\t%.9g\n", layer, head,
                        kind, (long long)i, (long long)s0, (long long)n, j, evals[j],
                        evals[j] * share, cum * share);
            }
            continue;
        }
        fprintf(out, "%d\t%d\t%c\t%lld\t%lld\t%lld\t%.9g\t%.9g", layer, head, kind, (long long)i,
                (long long)s0, (long long)n, total, evals[0] * share);
        for (int e = 0; e < cfg->n_energy; e++)
            fprintf(out, "\t%d", mkv_energy_rank(evals, hd, cfg->energy[e]));
        fputc('\n', out);
    }
    return MKV_OK;
}

static void spectrum_end(void *ctx)
{
    mkv_spectrum_settings *cfg = ctx;
    mkv_free(cfg->X);
    mkv_free(cfg->evals);
}

const mkv_table_analysis mkv_spectrum_table = {"spectrum", 1, spectrum_begin, spectrum_rows,
                                               spectrum_end};
