/* Per-vector vs global top-m overlap of one segment (analysis.h). */
#include "config.h"
#include "analysis/analysis.h"

#include <math.h>
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
