/* ThinK-style key-channel importance (analysis.h). */
#include "config.h"
#include "analysis/analysis.h"

#include <math.h>

void mkv_channel_sumsq_add(double *sumsq, const float *X, int64_t n, int d)
{
    for (int64_t t = 0; t < n; t++)
        for (int j = 0; j < d; j++)
            sumsq[j] += (double)X[t * d + j] * X[t * d + j];
}

/* ||a b^T||_F^2 = sum_{s,t} a_s^2 b_t^2 = ||a||^2 ||b||^2 */
void mkv_channel_scores(const double *q_sumsq, const double *k_sumsq, int d, double *score)
{
    for (int j = 0; j < d; j++)
        score[j] = sqrt(q_sumsq[j] * k_sumsq[j]);
}
