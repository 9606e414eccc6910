/* Per-head token budgets (head_budget.h). */
#include "config.h"
#include "methods/head_budget.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/attn.h"

static double rel_l2(const double *acc, double l, const double *exact, int d)
{
    double num = 0, den = 0;
    for (int c = 0; c < d; c++) {
        double o = l > 0 ? acc[c] / l : 0;
        num += (o - exact[c]) * (o - exact[c]);
        den += exact[c] * exact[c];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Adds the error curve of one query q at position p to curve (w, order:
 * room for p + 1 tokens; acc, exact: for d). */
static int query_curve(const mkv_head_kv *in, const float *q, int64_t p, int64_t sink, int64_t recent, double *w,
                       int64_t *order, double *acc, double *exact, double *curve)
{
    const int P = MKV_HEAD_BUDGET_POINTS, d = in->d;
    const double scale = 1 / sqrt((double)d);
    int64_t n = p + 1, s_n = sink < n ? sink : n, r_n = recent < n - s_n ? recent : n - s_n;
    double mx = -INFINITY, sum = 0;
    for (int64_t t = 0; t < n; t++) {
        const float *k = in->k + (size_t)t * (size_t)d;
        double s = 0;
        for (int c = 0; c < d; c++)
            s += (double)q[c] * k[c];
        w[t] = s * scale;
        mx = w[t] > mx ? w[t] : mx;
    }
    for (int c = 0; c < d; c++)
        exact[c] = acc[c] = 0;
    for (int64_t t = 0; t < n; t++) {
        w[t] = exp(w[t] - mx);
        sum += w[t];
        for (int c = 0; c < d; c++)
            exact[c] += w[t] * in->v[(size_t)t * (size_t)d + c];
    }
    for (int c = 0; c < d; c++)
        exact[c] /= sum;
    /* the always-attended tokens rank first, then the others by weight */
    double *rank_by = w + n;
    for (int64_t t = 0; t < n; t++)
        rank_by[t] = t < s_n || t >= n - r_n ? INFINITY : w[t];
    if (mkv_rank(rank_by, n, order) < 0)
        return MKV_ENOMEM;
    double l = 0;
    int64_t taken = 0;
    for (int i = 0; i < P; i++) {
        int64_t want = (int64_t)ceil((double)(i + 1) / P * (double)n - 1e-9);
        want = want < s_n + r_n ? s_n + r_n : want;
        for (; taken < want; taken++) {
            int64_t t = order[taken];
            l += w[t];
            for (int c = 0; c < d; c++)
                acc[c] += w[t] * in->v[(size_t)t * (size_t)d + c];
        }
        curve[i] += rel_l2(acc, l, exact, d);
    }
    return MKV_OK;
}

int mkv_head_error_curve(const mkv_head_kv *in, int64_t sink, int64_t recent, double *curve, mkv_error *err)
{
    const int P = MKV_HEAD_BUDGET_POINTS, d = in->d;
    memset(curve, 0, (size_t)P * sizeof *curve);
    if (in->W < 1 || !in->q)
        return mkv_fail(err, MKV_EUSAGE, "per-head budgets need observation queries");
    double *w = mkv_alloc(2 * (size_t)in->T + 2 * (size_t)d, sizeof *w, "attention weights", err);
    int64_t *order = w ? mkv_alloc((size_t)in->T, sizeof *order, "a token order", err) : NULL;
    if (!order) {
        mkv_free(w);
        return err ? err->code : MKV_ENOMEM;
    }
    double *acc = w + 2 * in->T;
    int64_t n = 0;
    int rc = MKV_OK;
    for (int g = 0; g < in->G && rc == MKV_OK; g++)
        for (int64_t j = 0; j < in->W && rc == MKV_OK; j++) {
            int64_t p = in->query_pos[j];
            if (p < 0 || p >= in->T)
                continue;
            rc = query_curve(in, in->q + ((size_t)g * (size_t)in->W + (size_t)j) * (size_t)d, p, sink, recent, w,
                             order, acc, acc + d, curve);
            n++;
        }
    mkv_free(w);
    mkv_free(order);
    if (rc != MKV_OK)
        return mkv_fail(err, rc, "out of memory ranking tokens");
    if (n == 0)
        return mkv_fail(err, MKV_EUSAGE, "per-head budgets: no observation query lies in the cache");
    for (int i = 0; i < P; i++)
        curve[i] /= (double)n;
    return MKV_OK;
}

int mkv_allocate_head_budgets(const double *curves, int nheads, double mean, double floor_frac, double *budget,
                              mkv_error *err)
{
    const int P = MKV_HEAD_BUDGET_POINTS;
    int floor_steps = (int)ceil(floor_frac * P - 1e-9);
    floor_steps = floor_steps < 1 ? 1 : floor_steps > P ? P : floor_steps;
    int64_t total = (int64_t)llround(mean * P * nheads), used = (int64_t)floor_steps * nheads;
    int *steps = mkv_alloc((size_t)(nheads > 0 ? nheads : 1), sizeof *steps, "per-head budgets", err);
    if (!steps)
        return err ? err->code : MKV_ENOMEM;
    for (int h = 0; h < nheads; h++)
        steps[h] = floor_steps;
    /* each round: the head and run of j steps with the largest mean fall
     * in error per step (a run crosses flat stretches, such as budgets
     * the always-attended tokens fill alone) */
    while (used < total) {
        int best = -1, best_j = 0;
        double rate = -INFINITY;
        for (int h = 0; h < nheads; h++) {
            const double *c = curves + (size_t)h * P;
            for (int jn = 1; steps[h] + jn <= P && used + jn <= total; jn++) {
                double r = (c[steps[h] - 1] - c[steps[h] + jn - 1]) / jn;
                if (r > rate) {
                    rate = r;
                    best = h;
                    best_j = jn;
                }
            }
        }
        if (best < 0)
            break;
        steps[best] += best_j;
        used += best_j;
    }
    for (int h = 0; h < nheads; h++)
        budget[h] = (double)steps[h] / P;
    mkv_free(steps);
    return MKV_OK;
}
