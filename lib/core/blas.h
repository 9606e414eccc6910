/* CBLAS from OpenBLAS when configure found it, GSL's reference CBLAS
 * otherwise; both declare the standard cblas_* functions and enums. */
#ifndef MKV_BLAS_H
#define MKV_BLAS_H

#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#ifdef HAVE_OPENBLAS
#include <cblas.h>
#else
#include <gsl/gsl_cblas.h>
#endif

#endif
