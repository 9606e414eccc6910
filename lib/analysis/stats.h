/* Summary statistics of KV tensors: one layer, one KV head, K or V, i.e.
 * T vectors of head_dim values. Values are accumulated in double, chunk by
 * chunk of tokens, so a head never has to be in memory at once.
 *
 * Outlier channels (the rule mkv-analyze stats documents): the RMS of
 * channel j over the T tokens is sqrt(sum_t x[t][j]^2 / T); a channel is an
 * outlier when its RMS is strictly greater than factor times the median
 * channel RMS of the same tensor (median of an even count: the mean of the
 * two middle values). */
#ifndef MKV_STATS_H
#define MKV_STATS_H

#include <stdint.h>
#include "core/mkv.h"
#include "io/dump.h"

#define MKV_OUTLIER_FACTOR_DEFAULT 4.0

typedef struct {
    int head_dim;
    int64_t n_tokens;
    double mean;            /* running mean over every value */
    double m2;              /* sum of squared deviations from that mean */
    double absmax;
    double *channel_sumsq;  /* [head_dim]: sum over tokens of x^2 */
    double *scratch;        /* [2*head_dim]: channel RMS and a copy sorted for the median */
} mkv_tensor_stats;

typedef struct {
    int64_t n_tokens;
    double mean;
    double std;             /* population standard deviation (divides by T*head_dim) */
    double absmax;
    double rms_median;      /* median over channels of the channel RMS */
    double rms_max;         /* largest channel RMS */
    int outlier_channels;   /* channels with RMS > factor * rms_median */
} mkv_tensor_summary;

int mkv_tensor_stats_init(mkv_tensor_stats *s, int head_dim, mkv_error *err);
/* Start over for another tensor of the same head_dim. */
void mkv_tensor_stats_reset(mkv_tensor_stats *s);
/* Add n_tokens vectors x[n_tokens][head_dim]. Values must be finite. */
void mkv_tensor_stats_add(mkv_tensor_stats *s, const float *x, int64_t n_tokens);
/* Writes s->scratch (the channel RMS), hence not const. */
void mkv_tensor_stats_summarize(mkv_tensor_stats *s, double outlier_factor,
                                mkv_tensor_summary *out);
void mkv_tensor_stats_free(mkv_tensor_stats *s);

/* Median of v[0..n) (n > 0); sorts v in place. */
double mkv_median_inplace(double *v, int n);
/* Number of rms[0..n) strictly above factor * median(rms); *median gets the
 * median. scratch holds n doubles (may not alias rms). */
int mkv_count_outlier_channels(const double *rms, int n, double factor,
                               double *scratch, double *median);

/* Accumulate K or V (kind 'k' or 'v') of one layer and KV head of an open
 * dump into s (reset first), reading chunks of tokens. A NaN or infinity
 * fails with MKV_EFORMAT: "'FILE': /layers/NN/k: NaN at [head,token,channel]". */
int mkv_dump_tensor_stats(mkv_dump *d, int layer, char kind, int head,
                          mkv_tensor_stats *s, mkv_error *err);

#endif
