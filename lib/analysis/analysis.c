/* Helpers shared by the analyses: counts for shares and fractions,
 * deterministic top-m selection. */
#include "config.h"
#include "analysis/analysis.h"

#include <math.h>
#include <string.h>

#include "core/tensor.h"

int mkv_keep_count(double p, int d)
{
    int m = (int)floor(p * d + 0.5);
    return m < 1 ? 1 : m > d ? d : m;
}

int64_t mkv_fraction_count(double f, int64_t n)
{
    double x = f * (double)n;
    double r = floor(x + 0.5);
    /* 0.07 * 100 is 7.000000000000001 in binary: it means 7 tokens, not 8. */
    int64_t k = fabs(x - r) <= 1e-9 * x ? (int64_t)r : (int64_t)ceil(x);
    return k < 1 ? 1 : k > n ? n : k;
}

/* The k-th largest (k = 1..n) of v[0..n); reorders v (Hoare selection). */
static double kth_largest(double *v, int n, int k)
{
    int lo = 0, hi = n - 1, target = k - 1;
    while (lo < hi) {
        double pivot = v[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (v[i] > pivot)
                i++;
            while (v[j] < pivot)
                j--;
            if (i <= j) {
                double t = v[i];
                v[i++] = v[j];
                v[j--] = t;
            }
        }
        /* now v[lo..j] >= pivot >= v[i..hi], and v(j..i) == pivot */
        if (target <= j)
            hi = j;
        else if (target >= i)
            lo = i;
        else
            return v[target];
    }
    return v[lo];
}

void mkv_top_mask(const double *score, int d, int m, unsigned char *mask, double *scratch)
{
    memcpy(scratch, score, (size_t)d * sizeof *scratch);
    double threshold = kth_largest(scratch, d, m);
    int above = 0;
    for (int j = 0; j < d; j++)
        above += score[j] > threshold;
    int ties_left = m - above;
    for (int j = 0; j < d; j++) {
        int in = score[j] > threshold || (score[j] == threshold && ties_left > 0);
        if (score[j] == threshold && in)
            ties_left--;
        mask[j] = (unsigned char)in;
    }
}

void mkv_top_indices(const double *score, int d, int m, int *idx)
{
    /* Insertion into a sorted list of at most m: d and m are a head_dim. */
    int count = 0;
    for (int j = 0; j < d; j++) {
        if (count == m && !(score[j] > score[idx[m - 1]]))
            continue;
        int pos = count < m ? count++ : m - 1;
        while (pos > 0 && score[j] > score[idx[pos - 1]]) {
            idx[pos] = idx[pos - 1];
            pos--;
        }
        idx[pos] = j;
    }
}

double mkv_top_share(const double *score, int d, int m, double *scratch)
{
    double total = 0.0;
    for (int j = 0; j < d; j++)
        total += score[j];
    if (total <= 0.0)
        return 0.0;
    memcpy(scratch, score, (size_t)d * sizeof *scratch);
    double threshold = kth_largest(scratch, d, m);
    double top = 0.0;
    int above = 0;
    for (int j = 0; j < d; j++)
        if (score[j] > threshold) {
            top += score[j];
            above++;
        }
    return (top + (m - above) * threshold) / total;
}
