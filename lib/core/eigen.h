/* Symmetric eigendecomposition and the Gram ("covariance") matrix of KV
 * vectors: the rotation of MosaicKV (docs/DESIGN.md 5.1 step 3) and of
 * the analyses in mkv-analyze.
 *
 * Matrices are row-major double arrays: M[i * d + j] is row i, column j.
 * Eigenvectors are the columns of the d x d result: component i of vector
 * j is evecs[i * d + j]; they are orthonormal and ordered by eigenvalue,
 * largest first. Sign convention (so that results are reproducible across
 * LAPACK and GSL): the component of largest magnitude of every eigenvector
 * is positive; components within 1e-10 (relative) of the largest count as
 * tied, and the first of them is made positive.
 *
 * With a rotation R (the eigenvector matrix) a row vector x becomes
 * x~ = x R, and dot products are kept: (q R) . (k R) = q . k. */
#ifndef MKV_EIGEN_H
#define MKV_EIGEN_H

#include <stdint.h>
#include "core/mkv.h"

/* Eigenvalues (descending) and eigenvectors of the symmetric d x d matrix
 * C (only its upper triangle is read; C is not modified). evecs may be
 * NULL when only eigenvalues are wanted. LAPACK dsyevd when the build has
 * OpenBLAS, GSL's symmetric solver otherwise. MKV_EUSAGE for d < 1,
 * MKV_EFORMAT for a non-finite input or when the solver does not converge,
 * MKV_ENOMEM when out of memory. */
int mkv_eigh(const double *C, int d, double *evals_desc, double *evecs, mkv_error *err);

/* C += X^T X for n row vectors X[n][d] (float32, as read from a dump), in
 * double precision. C is d x d row-major and stays symmetric (both
 * triangles are written). Accumulating chunk by chunk gives the same
 * matrix as one call, and adding single vectors is the incremental
 * C += x x^T of a growing segment. MKV_ENOMEM when out of memory. */
int mkv_gram_add(double *C, const float *X, int64_t n, int d, mkv_error *err);

/* out[n][d] = X[n][d] R for a d x d rotation R (row-major, column j =
 * eigenvector j). out must not alias X. */
void mkv_rotate(const double *X, int64_t n, int d, const double *R, double *out);

#endif
