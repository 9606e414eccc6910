/* Magnitude statistics of one segment of K or V (analysis.h). */
#include "config.h"
#include "analysis/analysis.h"

#include <math.h>

#include "core/tensor.h"

int mkv_segment_stats(const float *X, int64_t n, int d, double k, int top,
                      mkv_segment_summary *out, int *top_channels, mkv_error *err)
{
    if (n <= 0 || top < 1 || top > d)
        return mkv_fail(err, MKV_EUSAGE, "segment statistics: %lld tokens, top %d of %d channels",
                        (long long)n, top, d);
    double *energy = mkv_calloc(2 * (size_t)d, sizeof *energy, "channel energies", err);
    if (!energy)
        return err ? err->code : MKV_ENOMEM;
    const size_t count = (size_t)n * d;
    const double N = (double)count;

    /* First pass: sums for the means and the channel energies. */
    double sum = 0.0, sum_abs = 0.0, sum_sq = 0.0;
    for (int64_t t = 0; t < n; t++)
        for (int j = 0; j < d; j++) {
            double v = X[t * d + j];
            sum += v;
            sum_abs += fabs(v);
            sum_sq += v * v;
            energy[j] += v * v;
        }
    double mean = sum / N, mean_abs = sum_abs / N, rms = sqrt(sum_sq / N);

    /* Second pass: central moments (no cancellation) and outliers. */
    double m2 = 0.0, m4 = 0.0, abs_m2 = 0.0, limit = k * rms;
    size_t outliers = 0;
    for (size_t i = 0; i < count; i++) {
        double dev = X[i] - mean, dev2 = dev * dev, a = fabs((double)X[i]) - mean_abs;
        m2 += dev2;
        m4 += dev2 * dev2;
        abs_m2 += a * a;
        outliers += fabs((double)X[i]) > limit;
    }
    m2 /= N;
    m4 /= N;

    out->tokens = n;
    out->rms = rms;
    out->mag_var = abs_m2 / N;
    out->kurtosis = m2 > 0.0 ? m4 / (m2 * m2) - 3.0 : 0.0;
    out->outlier_share = (double)outliers / N;
    out->top_energy = mkv_top_share(energy, d, top, energy + d);
    if (top_channels)
        mkv_top_indices(energy, d, top, top_channels);
    mkv_free(energy);
    return MKV_OK;
}
