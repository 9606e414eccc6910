/* Fidelity metrics of compressed attention (docs/DESIGN.md 7) and the
 * summary statistics mkv-attend reports over them. */
#ifndef MKV_METRICS_H
#define MKV_METRICS_H

#include <stdint.h>

/* Relative L2 error ||x - ref|| / ||ref|| over n values, in double. When
 * ref is all zeros the absolute error ||x - ref|| is returned instead. */
double mkv_rel_l2(const float *x, const float *ref, int64_t n);

/* Attention-mass recall: the sum of the exact softmax weights probs[t] of
 * the tokens t < n with attended[t] != 0 (1 when every token was attended). */
double mkv_recall(const double *probs, const uint8_t *attended, int64_t n);

typedef struct {
    int64_t n;
    double mean, median, p90, min, max;
} mkv_summary;

/* Summary of x[0..n): mean, min, max, and the median and 90th percentile
 * by linear interpolation between order statistics (numpy's default:
 * position q (n - 1) of the sorted values). x is not modified. NaN counts
 * as larger than every number. Returns 0, or -1 when out of memory; with
 * n = 0 every statistic is NaN. */
int mkv_summarize(const double *x, int64_t n, mkv_summary *s);

/* q-quantile (0 <= q <= 1) of sorted[0..n) by the same rule. */
double mkv_quantile_sorted(const double *sorted, int64_t n, double q);

#endif
