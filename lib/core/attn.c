/* Online softmax, the budget rule and top-k selection. */
#include "core/attn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void mkv_osm_init(mkv_osm *s, double *acc, int d)
{
    s->m = -INFINITY;
    s->l = 0;
    s->acc = acc;
    s->d = d;
    memset(acc, 0, sizeof(double) * (size_t)d);
}

/* Rescale the state so that its max becomes at least score; return the
 * weight exp(score - m) of the new token. */
static double rescale_for(mkv_osm *s, double score)
{
    if (score > s->m) {
        double f = s->m == -INFINITY ? 0 : exp(s->m - score);
        s->l *= f;
        for (int i = 0; i < s->d; i++)
            s->acc[i] *= f;
        s->m = score;
        return 1.0;
    }
    return exp(score - s->m);
}

void mkv_osm_add(mkv_osm *s, double score, const float *v)
{
    double w = rescale_for(s, score);
    s->l += w;
    for (int i = 0; i < s->d; i++)
        s->acc[i] += w * v[i];
}

void mkv_osm_add_sparse(mkv_osm *s, double score, const float *vals, const int *idx, int n)
{
    double w = mkv_osm_weigh(s, score);
    for (int i = 0; i < n; i++)
        s->acc[idx[i]] += w * vals[i];
}

double mkv_osm_weigh(mkv_osm *s, double score)
{
    double w = rescale_for(s, score);
    s->l += w;
    return w;
}

void mkv_osm_merge(mkv_osm *a, const mkv_osm *b)
{
    if (b->l == 0)
        return;
    double m = a->m > b->m ? a->m : b->m;
    double fa = a->l == 0 ? 0 : exp(a->m - m), fb = exp(b->m - m);
    for (int i = 0; i < a->d; i++)
        a->acc[i] = a->acc[i] * fa + b->acc[i] * fb;
    a->l = a->l * fa + b->l * fb;
    a->m = m;
}

void mkv_osm_finish(const mkv_osm *s, float *out)
{
    for (int i = 0; i < s->d; i++)
        out[i] = s->l > 0 ? (float)(s->acc[i] / s->l) : 0.0f;
}

double mkv_osm_lse(const mkv_osm *s)
{
    return s->l > 0 ? s->m + log(s->l) : -INFINITY;
}

void mkv_osm_from_output(mkv_osm *s, double *acc, int d, const float *out, double lse)
{
    mkv_osm_init(s, acc, d);
    if (!(lse > -INFINITY))
        return;
    s->m = lse;
    s->l = 1.0;
    for (int i = 0; i < d; i++)
        acc[i] = out[i];
}

int64_t mkv_budget_tokens(double budget, int64_t n)
{
    int64_t k = budget <= 1.0 ? (int64_t)ceil(budget * (double)n - 1e-9) : (int64_t)budget;
    if (k < 1)
        k = 1;
    return k > n ? n : k;
}

typedef struct {
    double score;
    int64_t index;
} ranked;

/* Higher score first, then lower index. */
static int by_score_desc(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

static int by_index(const void *a, const void *b)
{
    int64_t i = *(const int64_t *)a, j = *(const int64_t *)b;
    return i < j ? -1 : i > j;
}

int mkv_rank(const double *scores, int64_t n, int64_t *order)
{
    if (n <= 0)
        return 0;
    ranked *r = malloc(sizeof(ranked) * (size_t)n);
    if (!r)
        return -1;
    for (int64_t i = 0; i < n; i++) {
        r[i].score = scores[i];
        r[i].index = i;
    }
    /* the CPU reference favours clarity: a full sort is fine at these sizes */
    qsort(r, (size_t)n, sizeof(ranked), by_score_desc);
    for (int64_t i = 0; i < n; i++)
        order[i] = r[i].index;
    free(r);
    return 0;
}

int64_t mkv_topk(const double *scores, int64_t n, int64_t k, int64_t *idx)
{
    if (k > n)
        k = n;
    if (k <= 0)
        return 0;
    int64_t *order = malloc(sizeof(int64_t) * (size_t)n);
    if (!order || mkv_rank(scores, n, order) != 0) {
        free(order);
        return -1;
    }
    memcpy(idx, order, sizeof(int64_t) * (size_t)k);
    free(order);
    qsort(idx, (size_t)k, sizeof(int64_t), by_index);
    return k;
}
