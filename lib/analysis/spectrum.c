/* Eigenvalue energy of a segment's covariance X^T X (analysis.h). */
#include "config.h"
#include "analysis/analysis.h"

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
