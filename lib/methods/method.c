/* The reference attention every method is measured against, and method
 * lookup in the registry (lib/methods/registry.c). */
#include "config.h"
#include "methods/method.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const mkv_method *mkv_method_find(const char *name)
{
    for (int i = 0; mkv_methods[i]; i++)
        if (strcmp(mkv_methods[i]->name, name) == 0)
            return mkv_methods[i];
    return NULL;
}

/* Softmax over tokens 0..pos in double: scores first (to find the max),
 * then weights and the weighted sum of values. The weights go to probs, or
 * to a scratch buffer when the caller does not want them. */
void mkv_attend_exact(const float *k, const float *v, int d, const mkv_attend_query *q, float *out, double *probs)
{
    int64_t n = q->pos + 1;
    double *acc = malloc(sizeof(double) * (size_t)d);
    double *own = probs ? NULL : malloc(sizeof(double) * (size_t)n);
    for (int g = 0; g < q->G; g++) {
        const float *qg = q->q + (size_t)g * (size_t)d;
        double *s = probs ? probs + (size_t)g * (size_t)n : own;
        if (!acc || !s) {
            /* out of memory: a NaN output is reported by every caller */
            for (int i = 0; i < d; i++)
                out[(size_t)g * (size_t)d + (size_t)i] = NAN;
            continue;
        }
        double m = -INFINITY;
        for (int64_t t = 0; t < n; t++) {
            const float *kt = k + (size_t)t * (size_t)d;
            double dot = 0;
            for (int i = 0; i < d; i++)
                dot += (double)qg[i] * (double)kt[i];
            s[t] = dot * q->scale;
            if (s[t] > m)
                m = s[t];
        }
        double sum = 0;
        for (int64_t t = 0; t < n; t++) {
            s[t] = exp(s[t] - m);
            sum += s[t];
        }
        memset(acc, 0, sizeof(double) * (size_t)d);
        for (int64_t t = 0; t < n; t++) {
            s[t] /= sum;
            const float *vt = v + (size_t)t * (size_t)d;
            for (int i = 0; i < d; i++)
                acc[i] += s[t] * (double)vt[i];
        }
        for (int i = 0; i < d; i++)
            out[(size_t)g * (size_t)d + (size_t)i] = (float)acc[i];
    }
    free(acc);
    free(own);
}
