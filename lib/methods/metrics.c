/* Relative error, attention-mass recall and summary statistics. */
#include "config.h"
#include "methods/metrics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double mkv_rel_l2(const float *x, const float *ref, int64_t n)
{
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)x[i] - (double)ref[i];
        diff += d * d;
        norm += (double)ref[i] * (double)ref[i];
    }
    return norm > 0 ? sqrt(diff / norm) : sqrt(diff);
}

double mkv_recall(const double *probs, const uint8_t *attended, int64_t n)
{
    double sum = 0;
    for (int64_t i = 0; i < n; i++)
        if (attended[i])
            sum += probs[i];
    return sum;
}

/* Ascending, NaN last, so that the sort is a total order. */
static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    if (isnan(x) || isnan(y))
        return isnan(x) - isnan(y);
    return x < y ? -1 : x > y;
}

double mkv_quantile_sorted(const double *sorted, int64_t n, double q)
{
    if (n <= 0)
        return NAN;
    double pos = q * (double)(n - 1);
    int64_t lo = (int64_t)floor(pos);
    if (lo >= n - 1)
        return sorted[n - 1];
    double frac = pos - (double)lo;
    return sorted[lo] + frac * (sorted[lo + 1] - sorted[lo]);
}

int mkv_summarize(const double *x, int64_t n, mkv_summary *s)
{
    s->n = n;
    if (n <= 0) {
        s->mean = s->median = s->p90 = s->min = s->max = NAN;
        return 0;
    }
    double *sorted = malloc(sizeof(double) * (size_t)n);
    if (!sorted)
        return -1;
    memcpy(sorted, x, sizeof(double) * (size_t)n);
    qsort(sorted, (size_t)n, sizeof(double), by_value);
    double sum = 0;
    for (int64_t i = 0; i < n; i++)
        sum += sorted[i];
    s->mean = sum / (double)n;
    s->min = sorted[0];
    s->max = sorted[n - 1];
    s->median = mkv_quantile_sorted(sorted, n, 0.5);
    s->p90 = mkv_quantile_sorted(sorted, n, 0.9);
    free(sorted);
    return 0;
}
