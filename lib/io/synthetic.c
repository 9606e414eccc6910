/* Seeded synthetic KV dumps (model in synthetic.h and man/mkv-capture.1). */
#include "config.h"
#include "io/synthetic.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/half.h"
#include "core/log.h"
#include "core/rng.h"
#include "core/tensor.h"

/* Query scale search: the factor on the unit query direction lies in
 * [1, QUERY_SCALE_MAX]; a query whose targets cannot be singled out (a
 * non-target scores highest) stops at the cap instead of growing without
 * bound. */
#define QUERY_SCALE_MAX 64.0
#define QUERY_SCALE_STEPS 60
/* target weights a_j are uniform in [1 - TARGET_WEIGHT_SPREAD, 1] */
#define TARGET_WEIGHT_SPREAD 0.25

/* Substream purposes: every random quantity has its own stream keyed by
 * (seed, purpose, layer, head, index). */
enum {
    STREAM_REGIONS = 1,
    STREAM_HEAD,      /* outlier channels, mixing matrices A and B */
    STREAM_KEYS,
    STREAM_VALUES,
    STREAM_TARGETS,
    STREAM_QUERY,
    STREAM_CODE       /* salient direction e_t of a target token */
};

static void open_stream(mkv_rng *r, const mkv_synthetic_params *p, uint64_t purpose, uint64_t a,
                        uint64_t b, uint64_t c)
{
    const uint64_t keys[4] = {purpose, a, b, c};
    mkv_rng_seed_stream(r, p->seed, keys, 4);
}

void mkv_synthetic_params_init(mkv_synthetic_params *p)
{
    memset(p, 0, sizeof *p);
    strcpy(p->model, "synthetic");
    p->n_layers = 2;
    p->n_heads = 8;
    p->n_kv_heads = 2;
    p->head_dim = 64;
    p->n_tokens = 1024;
    p->n_queries = 16;
    p->seed = 1;
    p->rope_theta = 10000.0;
    p->dtype = MKV_DTYPE_F16;
    p->rank = 8;
    p->noise = 0.1;
    p->n_outliers = 4;
    p->outlier_scale = 6.0;
    p->region_len = 128;
    p->region_sigma = 0.3;
    p->value_sigma = 0.5;
    p->n_targets = 4;
    p->sink = 1;
    p->recent_window = 64;
    p->salience = 2.5;
    p->query_content = 0.1;
    p->attn_mass = 0.8;
}

typedef enum { PARAM_INT, PARAM_DOUBLE, PARAM_U64 } param_type;

static const struct {
    const char *name;
    param_type type;
    size_t offset;
} param_table[] = {
    {"seed", PARAM_U64, offsetof(mkv_synthetic_params, seed)},
    {"rank", PARAM_INT, offsetof(mkv_synthetic_params, rank)},
    {"noise", PARAM_DOUBLE, offsetof(mkv_synthetic_params, noise)},
    {"outliers", PARAM_INT, offsetof(mkv_synthetic_params, n_outliers)},
    {"outlier_scale", PARAM_DOUBLE, offsetof(mkv_synthetic_params, outlier_scale)},
    {"region_len", PARAM_INT, offsetof(mkv_synthetic_params, region_len)},
    {"region_sigma", PARAM_DOUBLE, offsetof(mkv_synthetic_params, region_sigma)},
    {"value_sigma", PARAM_DOUBLE, offsetof(mkv_synthetic_params, value_sigma)},
    {"targets", PARAM_INT, offsetof(mkv_synthetic_params, n_targets)},
    {"sink", PARAM_INT, offsetof(mkv_synthetic_params, sink)},
    {"recent_window", PARAM_INT, offsetof(mkv_synthetic_params, recent_window)},
    {"salience", PARAM_DOUBLE, offsetof(mkv_synthetic_params, salience)},
    {"query_content", PARAM_DOUBLE, offsetof(mkv_synthetic_params, query_content)},
    {"attn_mass", PARAM_DOUBLE, offsetof(mkv_synthetic_params, attn_mass)},
};

int mkv_synthetic_set(mkv_synthetic_params *p, const char *name, const char *value, mkv_error *err)
{
    for (size_t i = 0; i < sizeof param_table / sizeof param_table[0]; i++) {
        if (strcmp(name, param_table[i].name) != 0)
            continue;
        char *field = (char *)p + param_table[i].offset, *end;
        errno = 0;
        switch (param_table[i].type) {
        case PARAM_INT: {
            long v = strtol(value, &end, 10);
            if (end == value || *end || errno || v < INT_MIN || v > INT_MAX)
                return mkv_fail(err, MKV_EUSAGE, "invalid value '%s' for %s: not an integer", value, name);
            *(int *)(void *)field = (int)v;
            break;
        }
        case PARAM_DOUBLE: {
            double v = strtod(value, &end);
            if (end == value || *end || errno || !isfinite(v))
                return mkv_fail(err, MKV_EUSAGE, "invalid value '%s' for %s: not a number", value, name);
            *(double *)(void *)field = v;
            break;
        }
        case PARAM_U64: {
            unsigned long long v = strtoull(value, &end, 10);
            if (end == value || *end || errno || value[strspn(value, " \t")] == '-')
                return mkv_fail(err, MKV_EUSAGE, "invalid value '%s' for %s: not an integer in 0..2^64-1",
                                value, name);
            *(uint64_t *)(void *)field = (uint64_t)v;
            break;
        }
        }
        return MKV_OK;
    }
    return mkv_fail(err, MKV_EUSAGE, "unknown synthetic parameter '%s' (known: seed, rank, noise, "
                    "outliers, outlier_scale, region_len, region_sigma, value_sigma, targets, sink, "
                    "recent_window, salience, query_content, attn_mass)", name);
}

static int nonneg_finite(double x) { return isfinite(x) && x >= 0; }

int mkv_synthetic_check(const mkv_synthetic_params *p, mkv_error *err)
{
    if (p->n_layers < 1 || p->n_layers > 1000)
        return mkv_fail(err, MKV_EUSAGE, "n_layers=%d is out of range 1..1000", p->n_layers);
    if (p->n_kv_heads < 1 || p->n_kv_heads > 4096 || p->n_heads < 1 || p->n_heads > 4096)
        return mkv_fail(err, MKV_EUSAGE, "n_heads=%d and n_kv_heads=%d must be in 1..4096",
                        p->n_heads, p->n_kv_heads);
    if (p->n_heads % p->n_kv_heads != 0)
        return mkv_fail(err, MKV_EUSAGE, "n_heads=%d is not a multiple of n_kv_heads=%d",
                        p->n_heads, p->n_kv_heads);
    if (p->head_dim < 2 || p->head_dim > 4096 || p->head_dim % 2 != 0)
        return mkv_fail(err, MKV_EUSAGE, "head_dim=%d must be even and in 2..4096 (RoPE rotates pairs)",
                        p->head_dim);
    if (p->n_tokens < 1 || p->n_tokens > INT32_MAX)
        return mkv_fail(err, MKV_EUSAGE, "n_tokens=%" PRId64 " is out of range 1..%d", p->n_tokens,
                        INT32_MAX);
    if (p->n_queries < 0 || p->n_queries > p->n_tokens)
        return mkv_fail(err, MKV_EUSAGE, "n_queries=%" PRId64 " must be in 0..n_tokens (%" PRId64 ")",
                        p->n_queries, p->n_tokens);
    if (!isfinite(p->rope_theta) || p->rope_theta <= 0)
        return mkv_fail(err, MKV_EUSAGE, "rope_theta=%g must be positive", p->rope_theta);
    if (p->rank < 1 || p->rank > 4096)
        return mkv_fail(err, MKV_EUSAGE, "rank=%d is out of range 1..4096", p->rank);
    if (!nonneg_finite(p->noise) || !nonneg_finite(p->outlier_scale) ||
        !nonneg_finite(p->region_sigma) || !nonneg_finite(p->value_sigma) ||
        !nonneg_finite(p->salience) || !nonneg_finite(p->query_content))
        return mkv_fail(err, MKV_EUSAGE, "noise, outlier_scale, region_sigma, value_sigma, salience "
                                         "and query_content must be finite and not negative");
    if (p->region_sigma > 4 || p->value_sigma > 4)
        return mkv_fail(err, MKV_EUSAGE, "region_sigma and value_sigma must be at most 4");
    if (p->n_outliers < 0 || p->region_len < 1 || p->recent_window < 1)
        return mkv_fail(err, MKV_EUSAGE, "n_outliers must not be negative, region_len and "
                                         "recent_window must be positive");
    if (p->n_targets < 1 || p->n_targets > 256)
        return mkv_fail(err, MKV_EUSAGE, "n_targets=%d is out of range 1..256", p->n_targets);
    if (p->sink != 0 && p->sink != 1)
        return mkv_fail(err, MKV_EUSAGE, "sink=%d must be 0 or 1", p->sink);
    if (!(p->attn_mass > 0 && p->attn_mass < 1))
        return mkv_fail(err, MKV_EUSAGE, "attn_mass=%g must be in (0, 1)", p->attn_mass);
    return MKV_OK;
}

/* ------------------------------------------------------------ structure */

static int n_outliers_of(const mkv_synthetic_params *p)
{
    return p->n_outliers < p->head_dim / 4 ? p->n_outliers : p->head_dim / 4;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Outlier channels come first in the head stream, so
 * mkv_synthetic_outliers needs no other draw. They lie in the lowest-frequency quarter of
 * the channels, where RoPE turns slowest: in real models the key outliers
 * stay in the same channels after RoPE, as these do. */
static int draw_outliers(mkv_rng *r, const mkv_synthetic_params *p, int *channels, double *signs)
{
    int d = p->head_dim, quarter = d / 4, n = n_outliers_of(p);
    int pool[1024];   /* head_dim <= 4096 */
    for (int i = 0; i < quarter; i++)
        pool[i] = d - quarter + i;
    for (int i = 0; i < n; i++) {   /* partial Fisher-Yates */
        int j = i + (int)mkv_rng_below(r, (uint64_t)(quarter - i));
        int tmp = pool[i];
        pool[i] = pool[j];
        pool[j] = tmp;
        channels[i] = pool[i];
    }
    qsort(channels, (size_t)n, sizeof *channels, cmp_int);
    for (int i = 0; i < n; i++)
        signs[i] = mkv_rng_uniform(r) < 0.5 ? -1.0 : 1.0;
    return n;
}

int mkv_synthetic_outliers(const mkv_synthetic_params *p, int layer, int kv_head, int *channels)
{
    mkv_rng r;
    double signs[1024];
    if (mkv_synthetic_check(p, NULL) != MKV_OK)
        return -1;
    open_stream(&r, p, STREAM_HEAD, (uint64_t)layer, (uint64_t)kv_head, 0);
    return draw_outliers(&r, p, channels, signs);
}

int mkv_synthetic_targets(const mkv_synthetic_params *p, int layer, int q_head, int64_t w,
                          int64_t *positions)
{
    if (mkv_synthetic_check(p, NULL) != MKV_OK || w < 0 || w >= p->n_queries)
        return -1;
    int64_t pos = p->n_tokens - p->n_queries + w;
    int64_t avail = pos + 1;
    int want = avail < p->n_targets ? (int)avail : p->n_targets;
    int64_t recent = avail < p->recent_window ? avail : p->recent_window;
    mkv_rng r;
    open_stream(&r, p, STREAM_TARGETS, (uint64_t)layer, (uint64_t)q_head, (uint64_t)w);
    int n = 0;
    if (p->sink)
        positions[n++] = 0;
    while (n < want) {
        /* half local attention, half anywhere in the context */
        int64_t c = mkv_rng_uniform(&r) < 0.5 ? pos - (int64_t)mkv_rng_below(&r, (uint64_t)recent)
                                              : (int64_t)mkv_rng_below(&r, (uint64_t)avail);
        int dup = 0;
        for (int i = 0; i < n; i++)
            dup |= positions[i] == c;
        if (!dup)
            positions[n++] = c;
    }
    return n;
}

/* Everything drawn once per (layer, KV head). */
typedef struct {
    int d, r;
    double *A, *B;        /* [r][d] key and value mixing, row i scaled by lambda_i */
    double *scale;        /* [d] S: outlier_scale on outlier channels, else 1 */
    double *offset;       /* [d] mu: +-1 on outlier channels, else 0 */
    unsigned char *free_channel;  /* [d] 1 if the channel's RoPE pair holds no outlier */
} head_model;

static void draw_head(head_model *h, const mkv_synthetic_params *p, int layer, int kv_head)
{
    int d = h->d, r = h->r, channels[1024];
    double signs[1024];
    mkv_rng rng;
    open_stream(&rng, p, STREAM_HEAD, (uint64_t)layer, (uint64_t)kv_head, 0);
    int n = draw_outliers(&rng, p, channels, signs);
    for (int c = 0; c < d; c++) {
        h->scale[c] = 1.0;
        h->offset[c] = 0.0;
        h->free_channel[c] = 1;
    }
    for (int i = 0; i < n; i++) {
        int c = channels[i];
        h->scale[c] = p->outlier_scale;
        h->offset[c] = signs[i];
        h->free_channel[c & ~1] = h->free_channel[c | 1] = 0;
    }
    /* lambda_i = 1/(i+1), normalised so every channel has unit variance on
     * average: a decaying spectrum of effective rank well below r */
    double norm = 0;
    for (int i = 0; i < r; i++)
        norm += 1.0 / ((i + 1.0) * (i + 1.0));
    norm = sqrt(norm);
    for (int i = 0; i < r; i++) {
        double lambda = 1.0 / ((i + 1.0) * norm);
        for (int c = 0; c < d; c++)
            h->A[(size_t)i * d + c] = lambda * mkv_rng_normal(&rng);
    }
    for (int i = 0; i < r; i++) {
        double lambda = 1.0 / ((i + 1.0) * norm);
        for (int c = 0; c < d; c++)
            h->B[(size_t)i * d + c] = lambda * mkv_rng_normal(&rng);
    }
}

/* ------------------------------------------------------------ RoPE */

/* llama2.c convention: channels (2i, 2i+1) rotate by pos * theta^(-2i/d). */
static void rope_rotate(double *x, int d, const double *inv_freq, int64_t pos)
{
    for (int i = 0; i < d / 2; i++) {
        double a = (double)pos * inv_freq[i];
        double c = cos(a), s = sin(a);
        double x0 = x[2 * i], x1 = x[2 * i + 1];
        x[2 * i] = x0 * c - x1 * s;
        x[2 * i + 1] = x0 * s + x1 * c;
    }
}

/* ------------------------------------------------------------ generator */

typedef struct {
    const mkv_synthetic_params *p;
    int d, r, G;
    int64_t T, W;
    double *inv_freq;     /* [d/2] */
    double *rho;          /* [T] region scale */
    head_model head;      /* r = min(rank, head_dim) */
    float *buf;           /* [T][d]: keys, then values */
    float *q;             /* [G][W][d] */
    double *scores;       /* [T] */
    double *vec;          /* [4][d] scratch */
    unsigned char *marked;  /* [T] target of some query of the head */
    int64_t *planted;     /* sorted target positions of the head */
    double *codes;        /* [n_planted][d] unit salient directions */
    int64_t n_planted;
    int64_t *targets;     /* [n_targets] */
} generator;

static void draw_regions(generator *g)
{
    mkv_rng r;
    open_stream(&r, g->p, STREAM_REGIONS, 0, 0, 0);
    int64_t t = 0;
    while (t < g->T) {
        /* length uniform in 1..2L-1 (mean L) */
        int64_t len = 1 + (int64_t)mkv_rng_below(&r, (uint64_t)(2 * g->p->region_len - 1));
        double rho = exp(g->p->region_sigma * mkv_rng_normal(&r));
        for (int64_t i = 0; i < len && t < g->T; i++)
            g->rho[t++] = rho;
    }
}

/* Round x to what the storage type keeps, so the query scale is chosen on
 * the keys a reader will see. */
static float storage_round(mkv_dtype t, float x)
{
    switch (t) {
    case MKV_DTYPE_F16: return mkv_f16_to_f32(mkv_f32_to_f16(x));
    case MKV_DTYPE_BF16: return mkv_bf16_to_f32(mkv_f32_to_bf16(x));
    case MKV_DTYPE_F32: break;
    }
    return x;
}

/* Mark every target of every query of the KV head's query heads and draw
 * a unit salient direction for each, on channels whose RoPE pair carries
 * no outlier (rotation keeps it off the outliers). */
static void plant_targets(generator *g, int layer, int kv_head)
{
    const mkv_synthetic_params *p = g->p;
    int d = g->d;
    memset(g->marked, 0, (size_t)g->T);
    for (int j = 0; j < g->G; j++)
        for (int64_t w = 0; w < g->W; w++) {
            int n = mkv_synthetic_targets(p, layer, kv_head * g->G + j, w, g->targets);
            for (int i = 0; i < n; i++)
                g->marked[g->targets[i]] = 1;
        }
    g->n_planted = 0;
    for (int64_t t = 0; t < g->T; t++)
        if (g->marked[t])
            g->planted[g->n_planted++] = t;
    for (int64_t k = 0; k < g->n_planted; k++) {
        double *e = g->codes + (size_t)k * d, norm = 0;
        mkv_rng r;
        open_stream(&r, p, STREAM_CODE, (uint64_t)layer, (uint64_t)kv_head, (uint64_t)g->planted[k]);
        for (int c = 0; c < d; c++) {
            double x = mkv_rng_normal(&r);
            e[c] = g->head.free_channel[c] ? x : 0.0;
            norm += e[c] * e[c];
        }
        norm = norm > 0 ? 1.0 / sqrt(norm) : 0.0;
        for (int c = 0; c < d; c++)
            e[c] *= norm;
    }
}

static const double *code_of(const generator *g, int64_t t)
{
    int64_t lo = 0, hi = g->n_planted;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (g->planted[mid] < t)
            lo = mid + 1;
        else
            hi = mid;
    }
    return g->codes + (size_t)lo * g->d;
}

static void make_keys(generator *g, int layer, int kv_head)
{
    const mkv_synthetic_params *p = g->p;
    const head_model *h = &g->head;
    int d = g->d, r = g->r;
    double beta = p->salience * sqrt((double)d);
    double *z = g->vec, *x = g->vec + d;
    mkv_rng rng;
    open_stream(&rng, p, STREAM_KEYS, (uint64_t)layer, (uint64_t)kv_head, 0);
    int64_t next = 0;   /* index of the next planted position */
    for (int64_t t = 0; t < g->T; t++) {
        for (int i = 0; i < r; i++)
            z[i] = g->rho[t] * mkv_rng_normal(&rng);
        for (int c = 0; c < d; c++) {
            double lat = 0;
            for (int i = 0; i < r; i++)
                lat += z[i] * h->A[(size_t)i * d + c];
            x[c] = h->scale[c] * (lat + h->offset[c]) + p->noise * mkv_rng_normal(&rng);
        }
        if (next < g->n_planted && g->planted[next] == t) {
            const double *e = g->codes + (size_t)next * d;
            for (int c = 0; c < d; c++)
                x[c] += beta * e[c];
            next++;
        }
        rope_rotate(x, d, g->inv_freq, t);
        float *out = g->buf + (size_t)t * d;
        for (int c = 0; c < d; c++)
            out[c] = storage_round(p->dtype, (float)x[c]);
    }
}

/* Softmax mass on the targets of logits scale * s[0..n), and its
 * derivative in scale: mass * (mean score on the targets - mean score),
 * both means under the softmax. */
static double target_mass(const double *s, int64_t n, double smax, const int64_t *tg, int ntg,
                          double scale, double *slope)
{
    double total = 0, total_s = 0, on = 0, on_s = 0;
    for (int64_t t = 0; t < n; t++) {
        double e = exp(scale * (s[t] - smax));
        total += e;
        total_s += e * s[t];
    }
    for (int i = 0; i < ntg; i++) {
        double e = exp(scale * (s[tg[i]] - smax));
        on += e;
        on_s += e * s[tg[i]];
    }
    double mass = on / total;
    *slope = mass * (on_s / on - total_s / total);
    return mass;
}

/* The scale in [1, QUERY_SCALE_MAX] at which the targets hold goal of the
 * softmax. Newton's method on logit(mass), which is close to linear in
 * the scale, kept inside a shrinking bracket (bisection when a step
 * leaves it). */
static double solve_scale(const double *s, int64_t n, const int64_t *tg, int ntg, double goal)
{
    double smax = -INFINITY, slope;
    for (int64_t t = 0; t < n; t++)
        if (s[t] > smax)
            smax = s[t];
    double lo = 1.0, hi = QUERY_SCALE_MAX;
    if (target_mass(s, n, smax, tg, ntg, lo, &slope) >= goal)
        return lo;
    if (target_mass(s, n, smax, tg, ntg, hi, &slope) < goal)
        return hi;
    double want = log(goal / (1 - goal)), c = lo;
    for (int it = 0; it < QUERY_SCALE_STEPS; it++) {
        double m = target_mass(s, n, smax, tg, ntg, c, &slope);
        if (m <= 0 || m >= 1) {   /* logit undefined: halve the bracket */
            if (m <= 0)
                lo = c;
            else
                hi = c;
            c = 0.5 * (lo + hi);
            continue;
        }
        double f = log(m / (1 - m)) - want;
        if (fabs(f) < 1e-6)
            break;
        if (f < 0)
            lo = c;
        else
            hi = c;
        double fslope = slope / (m * (1 - m));
        double next = fslope > 0 ? c - f / fslope : lo - 1;
        c = next > lo && next < hi ? next : 0.5 * (lo + hi);
    }
    return c;
}

/* Query w of query head q_head (of the current KV head, keys in buf). */
static void make_query(generator *g, int layer, int q_head, int64_t w, float *out)
{
    const mkv_synthetic_params *p = g->p;
    int d = g->d, r = g->r;
    int64_t pos = g->T - g->W + w;
    int ntg = mkv_synthetic_targets(p, layer, q_head, w, g->targets);
    double *u = g->vec, *v = g->vec + d, *xi = g->vec + 2 * d, *e = g->vec + 3 * d;
    mkv_rng rng;
    open_stream(&rng, p, STREAM_QUERY, (uint64_t)layer, (uint64_t)q_head, (uint64_t)w);

    /* u = sum_j a_j RoPE(t_j) e_{t_j}: the salient parts of the targets'
     * keys as they sit in the (post-RoPE) cache */
    for (int c = 0; c < d; c++)
        u[c] = 0;
    for (int j = 0; j < ntg; j++) {
        double a = 1.0 - TARGET_WEIGHT_SPREAD * mkv_rng_uniform(&rng);
        memcpy(e, code_of(g, g->targets[j]), (size_t)d * sizeof *e);
        rope_rotate(e, d, g->inv_freq, g->targets[j]);
        for (int c = 0; c < d; c++)
            u[c] += a * e[c];
    }
    /* v = RoPE(pos) (xi A): content along the head's main key directions */
    for (int i = 0; i < r; i++)
        xi[i] = mkv_rng_normal(&rng);
    for (int c = 0; c < d; c++) {
        double acc = 0;
        for (int i = 0; i < r; i++)
            acc += xi[i] * g->head.A[(size_t)i * d + c];
        v[c] = acc;
    }
    rope_rotate(v, d, g->inv_freq, pos);
    double nu = 0, nv = 0;
    for (int c = 0; c < d; c++) {
        nu += u[c] * u[c];
        nv += v[c] * v[c];
    }
    nu = nu > 0 ? 1.0 / sqrt(nu) : 0.0;
    nv = nv > 0 ? p->query_content / sqrt(nv) : 0.0;
    for (int c = 0; c < d; c++)
        u[c] = u[c] * nu + v[c] * nv;

    /* logits of the unit direction over the causal context, then the
     * scale that gives the targets attn_mass; four partial sums (in a
     * fixed order) keep the dot products from waiting on one adder */
    int64_t n = pos + 1;
    double inv_sqrt_d = 1.0 / sqrt((double)d);
    for (int64_t t = 0; t < n; t++) {
        const float *k = g->buf + (size_t)t * d;
        double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        int c = 0;
        for (; c + 4 <= d; c += 4) {
            a0 += u[c] * (double)k[c];
            a1 += u[c + 1] * (double)k[c + 1];
            a2 += u[c + 2] * (double)k[c + 2];
            a3 += u[c + 3] * (double)k[c + 3];
        }
        for (; c < d; c++)
            a0 += u[c] * (double)k[c];
        g->scores[t] = ((a0 + a1) + (a2 + a3)) * inv_sqrt_d;
    }
    double scale = solve_scale(g->scores, n, g->targets, ntg, p->attn_mass);
    for (int c = 0; c < d; c++)
        out[c] = (float)(scale * u[c]);
}

static void make_values(generator *g, int layer, int kv_head)
{
    const mkv_synthetic_params *p = g->p;
    const head_model *h = &g->head;
    int d = g->d, r = g->r;
    double *y = g->vec;
    mkv_rng rng;
    open_stream(&rng, p, STREAM_VALUES, (uint64_t)layer, (uint64_t)kv_head, 0);
    for (int64_t t = 0; t < g->T; t++) {
        double tau = exp(p->value_sigma * mkv_rng_normal(&rng));
        for (int i = 0; i < r; i++)
            y[i] = g->rho[t] * mkv_rng_normal(&rng);
        float *out = g->buf + (size_t)t * d;
        for (int c = 0; c < d; c++) {
            double lat = 0;
            for (int i = 0; i < r; i++)
                lat += y[i] * h->B[(size_t)i * d + c];
            out[c] = (float)(tau * (lat + p->noise * mkv_rng_normal(&rng)));
        }
    }
}

static void generator_free(generator *g)
{
    mkv_free(g->inv_freq);
    mkv_free(g->rho);
    mkv_free(g->head.A);
    mkv_free(g->head.B);
    mkv_free(g->head.scale);
    mkv_free(g->head.offset);
    mkv_free(g->head.free_channel);
    mkv_free(g->buf);
    mkv_free(g->q);
    mkv_free(g->scores);
    mkv_free(g->vec);
    mkv_free(g->marked);
    mkv_free(g->planted);
    mkv_free(g->codes);
    mkv_free(g->targets);
}

static int generator_init(generator *g, const mkv_synthetic_params *p, mkv_error *err)
{
    memset(g, 0, sizeof *g);
    g->p = p;
    g->d = p->head_dim;
    g->r = p->rank < p->head_dim ? p->rank : p->head_dim;
    g->G = p->n_heads / p->n_kv_heads;
    g->T = p->n_tokens;
    g->W = p->n_queries;
    size_t T = (size_t)g->T, d = (size_t)g->d, r = (size_t)g->r, gw;
    if (mkv_mul_size((size_t)g->G, (size_t)(g->W ? g->W : 1), &gw))
        return mkv_fail(err, MKV_ENOMEM, "%d query heads x %" PRId64 " queries overflow", g->G, g->W);
    if (!(g->inv_freq = mkv_alloc(d / 2, sizeof(double), "RoPE frequencies", err)) ||
        !(g->rho = mkv_alloc(T, sizeof(double), "region scales", err)) ||
        !(g->head.A = mkv_alloc(r * d, sizeof(double), "key mixing matrix", err)) ||
        !(g->head.B = mkv_alloc(r * d, sizeof(double), "value mixing matrix", err)) ||
        !(g->head.scale = mkv_alloc(d, sizeof(double), "channel scales", err)) ||
        !(g->head.offset = mkv_alloc(d, sizeof(double), "channel offsets", err)) ||
        !(g->head.free_channel = mkv_alloc(d, 1, "channel flags", err)) ||
        !(g->buf = mkv_alloc(T, d * sizeof(float), "key/value buffer", err)) ||
        !(g->q = mkv_alloc(gw, d * sizeof(float), "query buffer", err)) ||
        !(g->scores = mkv_alloc(T, sizeof(double), "score buffer", err)) ||
        !(g->vec = mkv_alloc(4 * d, sizeof(double), "scratch vectors", err)) ||
        !(g->marked = mkv_alloc(T, 1, "target marks", err)) ||
        !(g->planted = mkv_alloc(T, sizeof(int64_t), "target positions", err)) ||
        !(g->codes = mkv_alloc(gw * (size_t)p->n_targets < T ? gw * (size_t)p->n_targets : T,
                               d * sizeof(double), "salient directions", err)) ||
        !(g->targets = mkv_alloc((size_t)p->n_targets, sizeof(int64_t), "targets", err))) {
        generator_free(g);
        return MKV_ENOMEM;
    }
    for (int i = 0; i < g->d / 2; i++)
        g->inv_freq[i] = pow(p->rope_theta, -2.0 * i / g->d);
    g->head.d = g->d;
    g->head.r = g->r;
    draw_regions(g);
    return MKV_OK;
}

static int write_head(generator *g, mkv_dump_writer *w, int layer, int kv_head, mkv_error *err)
{
    int rc;
    draw_head(&g->head, g->p, layer, kv_head);
    plant_targets(g, layer, kv_head);
    make_keys(g, layer, kv_head);
    if ((rc = mkv_dump_write(w, layer, 'k', kv_head, 1, 0, g->T, g->buf, err)))
        return rc;
    for (int j = 0; j < g->G; j++)
        for (int64_t q = 0; q < g->W; q++)
            make_query(g, layer, kv_head * g->G + j, q, g->q + ((size_t)j * g->W + q) * g->d);
    if ((rc = mkv_dump_write(w, layer, 'q', kv_head * g->G, g->G, 0, g->W, g->q, err)))
        return rc;
    make_values(g, layer, kv_head);
    return mkv_dump_write(w, layer, 'v', kv_head, 1, 0, g->T, g->buf, err);
}

int mkv_synthetic_write(const mkv_synthetic_params *p, const char *path,
                        const mkv_dump_write_opts *opts, mkv_error *err)
{
    int rc = mkv_synthetic_check(p, err);
    if (rc)
        return rc;
    mkv_dump_meta meta;
    mkv_dump_meta_init(&meta);
    snprintf(meta.model, sizeof meta.model, "%s", p->model);
    meta.n_layers = p->n_layers;
    meta.n_heads = p->n_heads;
    meta.n_kv_heads = p->n_kv_heads;
    meta.head_dim = p->head_dim;
    meta.rope_theta = p->rope_theta;
    strcpy(meta.k_rope, "post");
    strcpy(meta.source, "synthetic");
    meta.n_tokens = p->n_tokens;
    meta.n_queries = p->n_queries;
    meta.dtype = p->dtype;
    meta.has_tokens = 0;

    generator g;
    if ((rc = generator_init(&g, p, err)))
        return rc;
    int32_t *qpos = mkv_alloc(p->n_queries ? (size_t)p->n_queries : 1, sizeof(int32_t),
                              "query positions", err);
    if (!qpos) {
        generator_free(&g);
        return MKV_ENOMEM;
    }
    for (int64_t w = 0; w < p->n_queries; w++)
        qpos[w] = (int32_t)(p->n_tokens - p->n_queries + w);

    /* every parameter of the model as used (rank and outliers within
     * their bounds), so the file says how to remake it */
    int rank = g.r, outliers = n_outliers_of(p);
    if (rank != p->rank)
        mkv_warn("synthetic: rank=%d is more than head_dim %d: %d used", p->rank, p->head_dim, rank);
    if (outliers != p->n_outliers)
        mkv_warn("synthetic: outliers=%d is more than head_dim/4 = %d: %d used", p->n_outliers,
                 p->head_dim / 4, outliers);
    char desc[512];
    snprintf(desc, sizeof desc,
             "seed=%" PRIu64 " rank=%d noise=%.9g outliers=%d outlier_scale=%.9g region_len=%d "
             "region_sigma=%.9g value_sigma=%.9g targets=%d sink=%d recent_window=%d "
             "salience=%.9g query_content=%.9g attn_mass=%.9g",
             p->seed, rank, p->noise, outliers, p->outlier_scale, p->region_len,
             p->region_sigma, p->value_sigma, p->n_targets, p->sink, p->recent_window,
             p->salience, p->query_content, p->attn_mass);

    mkv_dump_writer *w = NULL;
    if ((rc = mkv_dump_create(path, &meta, opts, &w, err)))
        goto done;
    if ((rc = mkv_dump_set_attr(w, "synthetic_params", desc, err)))
        goto fail;
    mkv_progress progress;
    mkv_progress_start(&progress, "synthetic", (int64_t)p->n_layers * p->n_kv_heads);
    for (int l = 0; l < p->n_layers && rc == MKV_OK; l++)
        for (int h = 0; h < p->n_kv_heads && rc == MKV_OK; h++) {
            rc = write_head(&g, w, l, h, err);
            mkv_progress_update(&progress, (int64_t)l * p->n_kv_heads + h + 1);
        }
    mkv_progress_finish(&progress);
    if (rc || (rc = mkv_dump_write_query_pos(w, qpos, err)))
        goto fail;
    rc = mkv_dump_commit(w, err);
    goto done;
fail:
    mkv_dump_abort(w);
done:
    mkv_free(qpos);
    generator_free(&g);
    return rc;
}
