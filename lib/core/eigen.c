/* Symmetric eigendecomposition (LAPACK dsyevd from OpenBLAS, or GSL) and
 * Gram matrices over BLAS. See eigen.h for the conventions. */
#include "config.h"
#include "core/eigen.h"

#include <limits.h>
#include <math.h>
#include <string.h>

#include "core/blas.h"
#include "core/tensor.h"

#ifndef HAVE_OPENBLAS
#include <gsl/gsl_eigen.h>
#include <gsl/gsl_errno.h>
#include <gsl/gsl_sort_vector.h>
#endif

/* Rows converted to double per BLAS call in mkv_gram_add. */
#define GRAM_CHUNK_ROWS 256

/* Flip each eigenvector (column) so that its largest-magnitude component
 * is positive. Components within SIGN_TIE of the largest count as tied and
 * the first of them decides: solvers differ in the last bits, so an exact
 * comparison would let LAPACK and GSL pick different signs for a vector
 * like (1, 0, -1)/sqrt2. */
#define SIGN_TIE 1e-10
static void fix_signs(double *evecs, int d)
{
    for (int j = 0; j < d; j++) {
        double largest = 0.0;
        for (int i = 0; i < d; i++)
            largest = fmax(largest, fabs(evecs[(size_t)i * d + j]));
        int best = 0;
        while (fabs(evecs[(size_t)best * d + j]) < largest * (1.0 - SIGN_TIE))
            best++;
        if (evecs[(size_t)best * d + j] < 0)
            for (int i = 0; i < d; i++)
                evecs[(size_t)i * d + j] = -evecs[(size_t)i * d + j];
    }
}

#ifdef HAVE_OPENBLAS
/* LAPACK from OpenBLAS, declared here so that lapacke.h is not needed. The
 * two trailing arguments are the lengths of the character arguments that
 * gfortran-compiled LAPACK expects. */
extern void dsyevd_(const char *jobz, const char *uplo, const int *n, double *a, const int *lda,
                    double *w, double *work, const int *lwork, int *iwork, const int *liwork,
                    int *info, size_t jobz_len, size_t uplo_len);

/* a: d x d symmetric, overwritten by the eigenvectors (column-major: vector
 * j at a[j*d .. j*d+d)); w: ascending eigenvalues. */
static int solve(double *a, int d, int want_vectors, double *w, mkv_error *err)
{
    const char jobz = want_vectors ? 'V' : 'N', uplo = 'L';
    int info = 0, lwork = -1, liwork = -1, iwork_size = 0;
    double work_size = 0.0;
    dsyevd_(&jobz, &uplo, &d, a, &d, w, &work_size, &lwork, &iwork_size, &liwork, &info, 1, 1);
    if (info != 0)
        return mkv_fail(err, MKV_EFORMAT, "eigendecomposition of a %dx%d matrix: dsyevd workspace "
                        "query failed (info %d)", d, d, info);
    lwork = (int)work_size;
    liwork = iwork_size;
    double *work = mkv_alloc((size_t)lwork, sizeof *work, "the eigensolver's workspace", err);
    int *iwork = work ? mkv_alloc((size_t)liwork, sizeof *iwork, "the eigensolver's workspace", err)
                      : NULL;
    if (!iwork) {
        mkv_free(work);
        return err ? err->code : MKV_ENOMEM;
    }
    dsyevd_(&jobz, &uplo, &d, a, &d, w, work, &lwork, iwork, &liwork, &info, 1, 1);
    mkv_free(work);
    mkv_free(iwork);
    if (info != 0)
        return mkv_fail(err, MKV_EFORMAT, "eigendecomposition of a %dx%d matrix did not converge "
                        "(dsyevd info %d)", d, d, info);
    return MKV_OK;
}
#else
/* Same contract with GSL. GSL's default error handler aborts the process;
 * it is switched off (for the whole process) so that failures come back
 * as status codes. */
static int solve(double *a, int d, int want_vectors, double *w, mkv_error *err)
{
    gsl_set_error_handler_off();
    gsl_matrix_view A = gsl_matrix_view_array(a, (size_t)d, (size_t)d);
    gsl_vector_view W = gsl_vector_view_array(w, (size_t)d);
    int rc;
    if (want_vectors) {
        double *v = mkv_alloc((size_t)d * d, sizeof *v, "eigenvectors", err);
        gsl_eigen_symmv_workspace *ws = v ? gsl_eigen_symmv_alloc((size_t)d) : NULL;
        if (!v)
            return err ? err->code : MKV_ENOMEM;
        if (!ws) {
            mkv_free(v);
            return mkv_fail(err, MKV_ENOMEM, "out of memory for the eigensolver (d=%d)", d);
        }
        gsl_matrix_view V = gsl_matrix_view_array(v, (size_t)d, (size_t)d);
        rc = gsl_eigen_symmv(&A.matrix, &W.vector, &V.matrix, ws);
        gsl_eigen_symmv_free(ws);
        if (rc == GSL_SUCCESS)
            rc = gsl_eigen_symmv_sort(&W.vector, &V.matrix, GSL_EIGEN_SORT_VAL_ASC);
        /* GSL's V is row-major with vector j in column j: transpose into
         * the column-major layout the LAPACK path leaves. */
        for (int i = 0; i < d; i++)
            for (int j = 0; j < d; j++)
                a[(size_t)j * d + i] = v[(size_t)i * d + j];
        mkv_free(v);
    } else {
        gsl_eigen_symm_workspace *ws = gsl_eigen_symm_alloc((size_t)d);
        if (!ws)
            return mkv_fail(err, MKV_ENOMEM, "out of memory for the eigensolver (d=%d)", d);
        rc = gsl_eigen_symm(&A.matrix, &W.vector, ws);
        gsl_eigen_symm_free(ws);
        if (rc == GSL_SUCCESS)
            gsl_sort_vector(&W.vector);
    }
    if (rc != GSL_SUCCESS)
        return mkv_fail(err, MKV_EFORMAT, "eigendecomposition of a %dx%d matrix failed: %s", d, d,
                        gsl_strerror(rc));
    return MKV_OK;
}
#endif

int mkv_eigh(const double *C, int d, double *evals_desc, double *evecs, mkv_error *err)
{
    if (d < 1)
        return mkv_fail(err, MKV_EUSAGE, "eigendecomposition: dimension must be positive (got %d)", d);
    double *a = mkv_alloc((size_t)d * d, sizeof *a, "a symmetric matrix", err);
    double *w = a ? mkv_alloc((size_t)d, sizeof *w, "eigenvalues", err) : NULL;
    if (!w) {
        mkv_free(a);
        return err ? err->code : MKV_ENOMEM;
    }
    /* Both triangles from C's upper one: the solvers read the lower. */
    int rc = MKV_OK;
    for (int i = 0; i < d && rc == MKV_OK; i++)
        for (int j = i; j < d; j++) {
            double v = C[(size_t)i * d + j];
            if (!isfinite(v)) {
                rc = mkv_fail(err, MKV_EFORMAT, "eigendecomposition: non-finite matrix element "
                              "at [%d,%d]", i, j);
                break;
            }
            a[(size_t)i * d + j] = a[(size_t)j * d + i] = v;
        }
    if (rc == MKV_OK)
        rc = solve(a, d, evecs != NULL, w, err);
    if (rc == MKV_OK) {
        for (int k = 0; k < d; k++)
            evals_desc[k] = w[d - 1 - k];
        if (evecs) {
            for (int i = 0; i < d; i++)
                for (int k = 0; k < d; k++)
                    evecs[(size_t)i * d + k] = a[(size_t)(d - 1 - k) * d + i];
            fix_signs(evecs, d);
        }
    }
    mkv_free(a);
    mkv_free(w);
    return rc;
}

int mkv_gram_add(double *C, const float *X, int64_t n, int d, mkv_error *err)
{
    if (n <= 0)
        return MKV_OK;
    int64_t chunk = n < GRAM_CHUNK_ROWS ? n : GRAM_CHUNK_ROWS;
    double *buf = mkv_alloc((size_t)chunk * (size_t)d, sizeof *buf, "a chunk of vectors", err);
    if (!buf)
        return err ? err->code : MKV_ENOMEM;
    for (int64_t t0 = 0; t0 < n; t0 += chunk) {
        int rows = (int)(n - t0 < chunk ? n - t0 : chunk);
        const float *src = X + t0 * d;
        for (size_t i = 0; i < (size_t)rows * d; i++)
            buf[i] = src[i];
        cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, d, rows, 1.0, buf, d, 1.0, C, d);
    }
    mkv_free(buf);
    for (int i = 0; i < d; i++)
        for (int j = i + 1; j < d; j++)
            C[(size_t)j * d + i] = C[(size_t)i * d + j];
    return MKV_OK;
}

void mkv_rotate(const double *X, int64_t n, int d, const double *R, double *out)
{
    /* BLAS takes int dimensions. */
    const int64_t step = INT_MAX / 2;
    for (int64_t t0 = 0; t0 < n; t0 += step) {
        int rows = (int)(n - t0 < step ? n - t0 : step);
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, d, d, 1.0, X + t0 * d, d, R, d,
                    0.0, out + t0 * d, d);
    }
}
