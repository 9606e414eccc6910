/* Per-vector vs global top-m overlap of one segment (analysis.h) and the
 * overlap table (tables.h). */
#include "config.h"
#include "analysis/analysis.h"
#include "analysis/tables.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/eigen.h"
#include "core/tensor.h"

/* Y = X R with R the eigenvectors of X^T X; Y holds n*d doubles. */
static int rotate_segment(const float *X, int64_t n, int d, double *Y, mkv_error *err)
{
    size_t dd = (size_t)d * d;
    double *C = mkv_calloc(dd, sizeof *C, "a covariance matrix", err);
    double *R = C ? mkv_alloc(dd, sizeof *R, "a rotation", err) : NULL;
    double *evals = R ? mkv_alloc((size_t)d, sizeof *evals, "eigenvalues", err) : NULL;
    double *Xd = evals ? mkv_alloc((size_t)n * d, sizeof *Xd, "a segment in double", err) : NULL;
    int rc = Xd ? MKV_OK : (err ? err->code : MKV_ENOMEM);
    if (rc == MKV_OK)
        rc = mkv_gram_add(C, X, n, d, err);
    if (rc == MKV_OK)
        rc = mkv_eigh(C, d, evals, R, err);
    if (rc == MKV_OK) {
        for (size_t i = 0; i < (size_t)n * d; i++)
            Xd[i] = X[i];
        mkv_rotate(Xd, n, d, R, Y);
    }
    mkv_free(Xd);
    mkv_free(evals);
    mkv_free(R);
    mkv_free(C);
    return rc;
}

int mkv_overlap(const float *X, int64_t n, int d, int m, int rotate, double *overlap,
                mkv_error *err)
{
    if (n <= 0)
        return MKV_OK;
    if (m < 1 || m > d)
        return mkv_fail(err, MKV_EUSAGE, "overlap: %d elements per vector out of %d", m, d);
    double *Y = mkv_alloc((size_t)n * d, sizeof *Y, "a segment in double", err);
    double *work = Y ? mkv_alloc(3 * (size_t)d, sizeof *work, "overlap scratch", err) : NULL;
    unsigned char *masks = work ? mkv_alloc(2 * (size_t)d, 1, "overlap masks", err) : NULL;
    int rc = masks ? MKV_OK : (err ? err->code : MKV_ENOMEM);
    if (rc == MKV_OK && rotate)
        rc = rotate_segment(X, n, d, Y, err);
    else if (rc == MKV_OK)
        for (size_t i = 0; i < (size_t)n * d; i++)
            Y[i] = X[i];

    if (rc == MKV_OK) {
        double *channel_l1 = work, *row_abs = work + d, *scratch = work + 2 * d;
        unsigned char *global = masks, *mine = masks + d;
        memset(channel_l1, 0, (size_t)d * sizeof *channel_l1);
        for (int64_t t = 0; t < n; t++)
            for (int j = 0; j < d; j++)
                channel_l1[j] += fabs(Y[t * d + j]);
        mkv_top_mask(channel_l1, d, m, global, scratch);
        for (int64_t t = 0; t < n; t++) {
            for (int j = 0; j < d; j++)
                row_abs[j] = fabs(Y[t * d + j]);
            mkv_top_mask(row_abs, d, m, mine, scratch);
            int shared = 0;
            for (int j = 0; j < d; j++)
                shared += mine[j] & global[j];
            overlap[t] = (double)shared / m;
        }
    }
    mkv_free(masks);
    mkv_free(work);
    mkv_free(Y);
    return rc;
}

/* ---- the overlap table (tables.h) */

int mkv_overlap_windows(const float *X, int64_t windows, int64_t L, int hd, int m, int rotated,
                        double *ov, mkv_overlap_summary *o, mkv_error *err)
{
    double sum = 0.0;
    o->vec_min = o->win_min = 1.0;
    o->win_max = 0.0;
    for (int64_t w = 0; w < windows; w++) {
        int rc = mkv_overlap(X + (size_t)(w * L) * (size_t)hd, L, hd, m, rotated, ov, err);
        if (rc != MKV_OK)
            return rc;
        double wsum = 0.0;
        for (int64_t i = 0; i < L; i++) {
            wsum += ov[i];
            o->vec_min = ov[i] < o->vec_min ? ov[i] : o->vec_min;
        }
        double wmean = wsum / (double)L;
        o->win_min = wmean < o->win_min ? wmean : o->win_min;
        o->win_max = wmean > o->win_max ? wmean : o->win_max;
        sum += wsum;
    }
    o->mean = sum / ((double)windows * (double)L);
    return MKV_OK;
}

static int overlap_begin(void *ctx, mkv_dump *d, FILE *out, mkv_error *err)
{
    mkv_overlap_settings *cfg = ctx;
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    const int64_t T = m->n_tokens;
    int64_t *lengths = cfg->lengths;
    if (cfg->n_lengths == 0) {
        int n = 0;
        lengths[n++] = T < 256 ? T : 256;
        while (n < MKV_TABLE_LIST_MAX && lengths[n - 1] * 4 <= T)
            lengths[n] = lengths[n - 1] * 4, n++;
        cfg->n_lengths = n;
    }
    int64_t longest = 0;
    for (int i = 0; i < cfg->n_lengths; i++) {
        if (lengths[i] > T)
            return mkv_fail(err, MKV_EUSAGE, "--lengths %lld is longer than the context of '%s' "
                            "(%lld tokens)", (long long)lengths[i], mkv_dump_path(d), (long long)T);
        longest = lengths[i] > longest ? lengths[i] : longest;
    }
    cfg->m_keep = mkv_keep_count(cfg->keep, m->head_dim);
    cfg->X = mkv_alloc((size_t)T * (size_t)m->head_dim, sizeof *cfg->X, "one head's vectors", err);
    cfg->ov = cfg->X ? mkv_alloc((size_t)longest, sizeof *cfg->ov, "per-vector overlaps", err)
                           : NULL;
    if (!cfg->ov)
        return err->code;
    fprintf(out, "layer\thead\ttensor\tlength\trotated\twindows\toverlap_mean\toverlap_min\t"
                 "window_min\twindow_max\n");
    return MKV_OK;
}

static int overlap_rows(void *ctx, mkv_dump *d, int layer, int head, char kind, FILE *out,
                        mkv_error *err)
{
    mkv_overlap_settings *cfg = ctx;
    const int64_t T = mkv_dump_meta_of(d)->n_tokens;
    const int hd = mkv_dump_meta_of(d)->head_dim;
    int rc = mkv_dump_read_finite(d, layer, kind, head, 1, 0, T, cfg->X, err);
    for (int li = 0; li < cfg->n_lengths && rc == MKV_OK; li++) {
        const int64_t L = cfg->lengths[li], windows = cfg->prefix ? 1 : T / L;
        for (int rotated = 0; rotated < 2 && rc == MKV_OK; rotated++) {
            mkv_overlap_summary o;
            rc = mkv_overlap_windows(cfg->X, windows, L, hd, cfg->m_keep, rotated, cfg->ov, &o,
                                 err);
            if (rc == MKV_OK)
                fprintf(out, "%d\t%d\t%c\t%lld\t%d\t%lld\t%.9g\t%.9g\t%.9g\t%.9g\n", layer, head,
                        kind, (long long)L, rotated, (long long)windows, o.mean, o.vec_min,
                        o.win_min, o.win_max);
        }
    }
    return rc;
}

static void overlap_end(void *ctx)
{
    mkv_overlap_settings *cfg = ctx;
    mkv_free(cfg->X);
    mkv_free(cfg->ov);
}

const mkv_table_analysis mkv_overlap_table = {"overlap", 1, overlap_begin, overlap_rows,
                                              overlap_end};
