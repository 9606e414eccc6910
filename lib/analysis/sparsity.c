/* Attention sparsity of one query: mass in the most probable keys (analysis.h). */
#include "config.h"
#include "analysis/analysis.h"

#include <math.h>
#include <stdlib.h>

static int cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

void mkv_topk_mass(const float *q, const float *K, int64_t n, int d, const double *fractions,
                   int n_fractions, double *mass, double *scratch)
{
    const double scale = 1.0 / sqrt((double)d);
    double smax = -INFINITY;
    for (int64_t t = 0; t < n; t++) {
        double s = 0.0;
        for (int j = 0; j < d; j++)
            s += (double)q[j] * K[t * d + j];
        scratch[t] = s * scale;
        if (scratch[t] > smax)
            smax = scratch[t];
    }
    double z = 0.0;
    for (int64_t t = 0; t < n; t++) {
        scratch[t] = exp(scratch[t] - smax);
        z += scratch[t];
    }
    qsort(scratch, (size_t)n, sizeof *scratch, cmp_desc);
    /* fractions may come in any order: each sums its own prefix. */
    for (int i = 0; i < n_fractions; i++) {
        int64_t k = mkv_fraction_count(fractions[i], n);
        double top = 0.0;
        for (int64_t t = 0; t < k; t++)
            top += scratch[t];
        mass[i] = top / z;
    }
}
