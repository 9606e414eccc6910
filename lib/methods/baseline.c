/* Helpers shared by the baseline methods (see baseline.h). */
#include "config.h"
#include "methods/baseline.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/attn.h"
#include "core/half.h"
#include "core/log.h"
#include "core/tensor.h"

#define F16_MAX 65504.0f

/* ---------------------------------------------------------------- checks */

int mkv_bl_check_budget(const char *name, double v, int64_t n, mkv_error *err)
{
    if (!(v > 0))
        return mkv_fail(err, MKV_EUSAGE,
                        "%s=%g is out of range: a fraction in (0, 1] or a token count > 1 is required",
                        name, v);
    if (v <= 1)
        return MKV_OK;
    if (v != floor(v))
        return mkv_fail(err, MKV_EUSAGE, "%s=%g: a count above 1 must be a whole number of tokens",
                        name, v);
    if (v > (double)n)
        return mkv_fail(err, MKV_EUSAGE, "%s=%g tokens is larger than the context of %lld tokens",
                        name, v, (long long)n);
    return MKV_OK;
}

int mkv_bl_need_queries(const char *method, int64_t W, mkv_error *err)
{
    if (W <= 0)
        return mkv_fail(err, MKV_EFORMAT,
                        "method '%s' needs observation queries (the dump has W = 0)", method);
    return MKV_OK;
}

int mkv_bl_check_f16_range(const float *x, size_t n, const char *what, int layer, int head,
                           mkv_error *err)
{
    for (size_t i = 0; i < n; i++)
        if (!(fabsf(x[i]) <= F16_MAX))
            return mkv_fail(err, MKV_EFORMAT,
                            "layer %d, KV head %d: %s value %g does not fit float16 (|x| <= 65504)",
                            layer, head, what, (double)x[i]);
    return MKV_OK;
}

int mkv_bl_check_query(const mkv_attend_query *q, int64_t T, int d, int G, mkv_error *err)
{
    if (q->d != d || q->G != G)
        return mkv_fail(err, MKV_EFORMAT,
                        "query of %d heads x %d channels does not fit a cache of %d heads x %d channels",
                        q->G, q->d, G, d);
    int64_t pos = q->pos;
    if (pos < 0 || pos >= T)
        return mkv_fail(err, MKV_EUSAGE, "query position %lld is outside the cache of %lld tokens",
                        (long long)pos, (long long)T);
    return MKV_OK;
}

/* ---------------------------------------------------------------- fp16 directed rounding */

/* The fp16 bit pattern one step towards -inf (down) or +inf (up). */
static uint16_t f16_step(uint16_t h, int up)
{
    int negative = (h & 0x8000) != 0;
    if ((h & 0x7fff) == 0)              /* +0 or -0 */
        return up ? 0x0001 : 0x8001;
    return negative == up ? (uint16_t)(h - 1) : (uint16_t)(h + 1);
}

/* Largest fp16 <= x. */
static float f16_down(float x)
{
    uint16_t h = mkv_f32_to_f16(x);
    if (mkv_f16_to_f32(h) > x)
        h = f16_step(h, 0);
    return mkv_f16_to_f32(h);
}

/* Smallest fp16 >= x. */
static float f16_up(float x)
{
    uint16_t h = mkv_f32_to_f16(x);
    if (mkv_f16_to_f32(h) < x)
        h = f16_step(h, 1);
    return mkv_f16_to_f32(h);
}

/* ---------------------------------------------------------------- Quest */

int64_t mkv_bl_pages(int64_t T, int page)
{
    return (T + page - 1) / page;
}

void mkv_bl_page_minmax(const float *x, int64_t T, int n, int page, float *mn, float *mx)
{
    int64_t pages = mkv_bl_pages(T, page);
    for (int64_t pg = 0; pg < pages; pg++) {
        int64_t t0 = pg * page, t1 = t0 + page < T ? t0 + page : T;
        float *lo = mn + pg * n, *hi = mx + pg * n;
        memcpy(lo, x + t0 * n, sizeof(float) * (size_t)n);
        memcpy(hi, x + t0 * n, sizeof(float) * (size_t)n);
        for (int64_t t = t0 + 1; t < t1; t++)
            for (int i = 0; i < n; i++) {
                float v = x[t * n + i];
                if (v < lo[i])
                    lo[i] = v;
                if (v > hi[i])
                    hi[i] = v;
            }
    }
}

double mkv_bl_page_score(const float *q, const float *mn, const float *mx, int n)
{
    double s[4] = {0, 0, 0, 0}; /* four partial sums: the adds do not wait on each other */
    int i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++) {
            double a = (double)q[i + j] * mn[i + j], b = (double)q[i + j] * mx[i + j];
            s[j] += a > b ? a : b;
        }
    for (; i < n; i++) {
        double a = (double)q[i] * mn[i], b = (double)q[i] * mx[i];
        s[0] += a > b ? a : b;
    }
    return (s[0] + s[1]) + (s[2] + s[3]);
}

void mkv_bl_selection_from(const mkv_params *p, mkv_bl_selection *s)
{
    s->page = (int)mkv_params_int(p, "page");
    s->budget = mkv_params_double(p, "budget");
    s->sink = mkv_params_int(p, "sink");
    s->recent = mkv_params_int(p, "recent");
    s->agg_sum = strcmp(mkv_params_str(p, "agg"), "sum") == 0;
}

void mkv_bl_warn_budget(const char *method, const mkv_params *p, int64_t T)
{
    int64_t sink = mkv_params_int(p, "sink"), recent = mkv_params_int(p, "recent");
    int64_t dense = sink + recent < T ? sink + recent : T;
    int64_t k = mkv_budget_tokens(mkv_params_double(p, "budget"), T);
    if (k < dense)
        mkv_warn("%s: budget=%s is %lld of the %lld tokens, fewer than the sink=%lld and recent=%lld "
                 "tokens always attended: a step attends at least %lld", method, mkv_params_str(p, "budget"),
                 (long long)k, (long long)T, (long long)sink, (long long)recent, (long long)dense);
}

int mkv_bl_check_selection(const mkv_params *p, int64_t T, mkv_error *err)
{
    /* page, sink, recent and agg are checked by their specs */
    return mkv_bl_check_budget("budget", mkv_params_double(p, "budget"), T, err);
}

int64_t mkv_bl_score_pages(const mkv_bl_selection *s, const float *q, int G, int n,
                           const float *mn, const float *mx, int64_t p, double *score)
{
    int64_t visible = p / s->page + 1;
    for (int64_t pg = 0; pg < visible; pg++) {
        double agg = 0;
        for (int g = 0; g < G; g++) {
            double v = mkv_bl_page_score(q + (size_t)g * n, mn + pg * n, mx + pg * n, n);
            if (s->agg_sum)
                agg += v;
            else if (g == 0 || v > agg)
                agg = v;
        }
        score[pg] = agg;
    }
    return visible;
}


int64_t mkv_bl_select(const mkv_bl_selection *s, const double *score, int64_t T, int64_t p,
                      uint8_t *attended, mkv_error *err)
{
    int64_t n = p + 1, count = 0;
    int64_t budget = mkv_budget_tokens(s->budget, n);
    int64_t sink_end = s->sink < n ? s->sink : n;
    for (int64_t t = 0; t < sink_end; t++)
        attended[t] = 1;
    count = sink_end;
    int64_t recent_start = T - s->recent > sink_end ? T - s->recent : sink_end;
    for (int64_t t = recent_start; t <= p; t++) {
        attended[t] = 1;
        count++;
    }
    if (count >= budget)
        return count;

    int64_t visible = p / s->page + 1;
    int64_t *order = mkv_alloc((size_t)visible, sizeof *order, "page ranking", err);
    if (!order)
        return -1;
    if (mkv_rank(score, visible, order) != 0) {
        mkv_free(order);
        mkv_fail(err, MKV_ENOMEM, "out of memory for the page ranking");
        return -1;
    }
    for (int64_t i = 0; i < visible && count < budget; i++) {
        int64_t t0 = order[i] * s->page, t1 = t0 + s->page;
        if (t1 > n)
            t1 = n;
        for (int64_t t = t0; t < t1; t++)
            if (!attended[t]) {
                attended[t] = 1;
                count++;
            }
    }
    mkv_free(order);
    return count;
}

/* ---------------------------------------------------------------- KIVI */

void mkv_bl_quant_range(float mn, float mx, int bits, float *scale, float *zero)
{
    double levels = (double)((1u << bits) - 1);
    float z = f16_down(mn);
    float sc = f16_up((float)(((double)mx - z) / levels));
    /* the rounding of the division may still leave mx just outside */
    while ((double)z + levels * sc < (double)mx)
        sc = mkv_f16_to_f32(f16_step(mkv_f32_to_f16(sc), 1));
    *scale = sc;
    *zero = z;
}

unsigned mkv_bl_quant_code(float x, float scale, float zero, int bits)
{
    unsigned top = (1u << bits) - 1;
    if (scale <= 0)
        return 0;
    double c = nearbyint(((double)x - zero) / scale);
    return c <= 0 ? 0 : c >= top ? top : (unsigned)c;
}

size_t mkv_bl_packed_bytes(size_t n, int bits)
{
    return (n * (size_t)bits + 7) / 8;
}

void mkv_bl_pack(const uint8_t *codes, size_t n, int bits, uint8_t *out)
{
    unsigned mask = (1u << bits) - 1;
    memset(out, 0, mkv_bl_packed_bytes(n, bits));
    for (size_t i = 0; i < n; i++) {
        size_t at = i * (size_t)bits, shift = at % 8;
        unsigned c = codes[i] & mask;
        out[at / 8] |= (uint8_t)(c << shift);
        if (shift + (size_t)bits > 8)   /* the code runs into the next byte */
            out[at / 8 + 1] |= (uint8_t)(c >> (8 - shift));
    }
}

unsigned mkv_bl_unpack(const uint8_t *packed, size_t i, int bits)
{
    size_t at = i * (size_t)bits, shift = at % 8;
    unsigned w = packed[at / 8] >> shift;
    if (shift + (size_t)bits > 8)
        w |= (unsigned)packed[at / 8 + 1] << (8 - shift);
    return w & ((1u << bits) - 1);
}

/* ---------------------------------------------------------------- decode-time growth */

void *mkv_bl_grow(void *p, int64_t *cap, int64_t used, int64_t need, size_t elem, mkv_error *err)
{
    if (need <= *cap)
        return p;
    /* an eighth more at a time: a loaded cache of T rows grows by T/8,
     * not by T, on the first decode step */
    int64_t c = *cap > 0 ? *cap : 16;
    while (c < need)
        c += c / 8 > 16 ? c / 8 : 16;
    void *q = mkv_alloc((size_t)c, elem, "decode-time rows", err);
    if (!q)
        return NULL;
    if (used > 0)
        memcpy(q, p, (size_t)used * elem);
    mkv_free(p);
    *cap = c;
    return q;
}

int mkv_bl_grow_rows(float **rows, int64_t *cap, int64_t used, int64_t need, int n, mkv_error *err)
{
    float *p = mkv_bl_grow(*rows, cap, used, need, (size_t)n * sizeof(float), err);
    if (!p)
        return MKV_ENOMEM;
    *rows = p;
    return MKV_OK;
}

int mkv_bl_round_f16(const float *x, int n, float *out, const char *what, mkv_error *err)
{
    for (int i = 0; i < n; i++) {
        if (!(fabsf(x[i]) <= F16_MAX))
            return mkv_fail(err, MKV_EFORMAT, "a new %s value %g does not fit float16 (|x| <= 65504)", what,
                            (double)x[i]);
        out[i] = mkv_f16_to_f32(mkv_f32_to_f16(x[i]));
    }
    return MKV_OK;
}

int mkv_bl_append_row(float **rows, int64_t *cap, int64_t row, const float *x, const int *idx, int n,
                      const char *what, mkv_error *err)
{
    int rc = mkv_bl_grow_rows(rows, cap, row, row + 1, n, err);
    if (rc)
        return rc;
    float *r = *rows + (size_t)row * (size_t)n;
    if (!idx)
        return mkv_bl_round_f16(x, n, r, what, err);
    for (int j = 0; j < n; j++)
        r[j] = x[idx[j]];
    return mkv_bl_round_f16(r, n, r, what, err);
}

int mkv_bl_page_append(float **mn, float **mx, int64_t *cap, int64_t *pages, int64_t t, int page,
                       const float *x, int n, mkv_error *err)
{
    int64_t pg = t / page, cap_mn = *cap, cap_mx = *cap;
    int rc;
    /* *cap is raised only once both have grown: it never claims more than either holds */
    if ((rc = mkv_bl_grow_rows(mn, &cap_mn, *pages, pg + 1, n, err)) ||
        (rc = mkv_bl_grow_rows(mx, &cap_mx, *pages, pg + 1, n, err)))
        return rc;
    *cap = cap_mn;
    float *lo = *mn + (size_t)pg * (size_t)n, *hi = *mx + (size_t)pg * (size_t)n;
    if (pg == *pages) {
        memcpy(lo, x, (size_t)n * sizeof(float));
        memcpy(hi, x, (size_t)n * sizeof(float));
        (*pages)++;
        return MKV_OK;
    }
    for (int i = 0; i < n; i++) {
        lo[i] = x[i] < lo[i] ? x[i] : lo[i];
        hi[i] = x[i] > hi[i] ? x[i] : hi[i];
    }
    return MKV_OK;
}

/* ---------------------------------------------------------------- attention */

double mkv_bl_dot(const float *q, const float *k, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += (double)q[i] * k[i];
    return s;
}

double mkv_bl_dot_idx(const float *q, const int *idx, const float *k, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += (double)q[idx[i]] * k[i];
    return s;
}

int mkv_bl_observe(const mkv_head_kv *in, int64_t wq, int64_t n, double *score, mkv_error *err)
{
    double scale = 1.0 / sqrt((double)in->d);
    double *s = mkv_alloc((size_t)in->T, sizeof *s, "observation scores", err);
    if (!s)
        return MKV_ENOMEM;
    memset(score, 0, sizeof(double) * (size_t)n);
    for (int64_t w = in->W - wq; w < in->W; w++) {
        int64_t pos = in->query_pos[w];
        if (pos < 0 || pos >= in->T) {
            mkv_free(s);
            return mkv_fail(err, MKV_EFORMAT, "query %lld has position %lld outside 0..%lld",
                            (long long)w, (long long)pos, (long long)in->T - 1);
        }
        for (int g = 0; g < in->G; g++) {
            const float *q = in->q + ((size_t)g * (size_t)in->W + (size_t)w) * (size_t)in->d;
            double m = -INFINITY, l = 0;
            for (int64_t t = 0; t <= pos; t++) {
                s[t] = scale * mkv_bl_dot(q, in->k + t * in->d, in->d);
                if (s[t] > m)
                    m = s[t];
            }
            for (int64_t t = 0; t <= pos; t++)
                l += exp(s[t] - m);
            for (int64_t t = 0; t < n && t <= pos; t++)
                score[t] += exp(s[t] - m) / l;
        }
    }
    mkv_free(s);
    return MKV_OK;
}

/* q.k in double with four partial sums, so that the adds of a decode
 * step's scores do not wait on each other. */
static double dot4(const float *q, const float *k, int n)
{
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += (double)q[i] * k[i];
        s1 += (double)q[i + 1] * k[i + 1];
        s2 += (double)q[i + 2] * k[i + 2];
        s3 += (double)q[i + 3] * k[i + 3];
    }
    for (; i < n; i++)
        s0 += (double)q[i] * k[i];
    return (s0 + s1) + (s2 + s3);
}

/* acc[i] += w * v[i], two lanes at a time (each lane's sum as the scalar
 * loop makes it). */
static void add_scaled(double *acc, double w, const float *v, int n)
{
    int i = 0;
#if defined(__GNUC__)
    typedef double v2d __attribute__((vector_size(16)));
    v2d wv = {w, w};
    for (; i + 2 <= n; i += 2) {
        v2d a, x = {v[i], v[i + 1]};
        memcpy(&a, acc + i, sizeof a);
        a += wv * x;
        memcpy(acc + i, &a, sizeof a);
    }
#endif
    for (; i < n; i++)
        acc[i] += w * v[i];
}

/* Row r of d values of rows (float, or fp16 when f16), as floats: the row
 * itself, or its values converted into buf. */
static const float *row_of(const void *rows, int f16, int64_t r, int d, float *buf)
{
    if (!f16)
        return (const float *)rows + r * d;
    mkv_f16_to_f32_n((const uint16_t *)rows + r * d, buf, (size_t)d);
    return buf;
}

/* Two passes over the attended rows rather than an online softmax: the
 * scores of all G heads from each key row while it is in cache, their
 * maxima, then the weighted values, each value row read once for the G
 * heads. */
static int attend_rows(const mkv_attend_query *q, const void *k, const void *v, int f16, int64_t n,
                       const uint8_t *mask, mkv_attend_result *res, mkv_error *err)
{
    int d = q->d, G = q->G;
    int64_t count = 0;
    for (int64_t r = 0; r < n; r++)
        count += !mask || mask[r];
    int64_t *rows = mkv_alloc((size_t)(count ? count : 1), sizeof *rows, "attended rows", err);
    double *w = rows ? mkv_alloc((size_t)(count ? count : 1) * (size_t)G, sizeof *w, "attention weights", err)
                     : NULL;
    double *acc = w ? mkv_alloc((size_t)G * (size_t)(d + 2), sizeof *acc, "attention accumulator", err) : NULL;
    float *buf = acc ? mkv_alloc((size_t)d, sizeof *buf, "an attended row", err) : NULL;
    if (!buf) {
        mkv_free(rows);
        mkv_free(w);
        mkv_free(acc);
        return MKV_ENOMEM;
    }
    double *mx = acc + (size_t)G * d, *l = mx + G;
    count = 0;
    for (int64_t r = 0; r < n; r++)
        if (!mask || mask[r])
            rows[count++] = r;
    for (int g = 0; g < G; g++) {
        mx[g] = -INFINITY;
        l[g] = 0;
    }
    for (int64_t j = 0; j < count; j++) {
        const float *kr = row_of(k, f16, rows[j], d, buf);
        for (int g = 0; g < G; g++) {
            double sc = q->scale * dot4(q->q + (size_t)g * d, kr, d);
            w[j * G + g] = sc;
            mx[g] = sc > mx[g] ? sc : mx[g];
        }
    }
    for (int64_t j = 0; j < count; j++)
        for (int g = 0; g < G; g++) {
            double e = exp(w[j * G + g] - mx[g]);
            w[j * G + g] = e;
            l[g] += e;
        }
    memset(acc, 0, sizeof(double) * (size_t)G * (size_t)d);
    for (int64_t j = 0; j < count; j++) {
        const float *vr = row_of(v, f16, rows[j], d, buf);
        for (int g = 0; g < G; g++)
            add_scaled(acc + (size_t)g * d, w[j * G + g], vr, d);
    }
    for (int g = 0; g < G; g++) {
        float *out = res->out + (size_t)g * d;
        for (int i = 0; i < d; i++)
            out[i] = l[g] > 0 ? (float)(acc[(size_t)g * d + i] / l[g]) : 0.0f;
        if (res->lse)
            res->lse[g] = l[g] > 0 ? mx[g] + log(l[g]) : -INFINITY;
    }
    mkv_free(rows);
    mkv_free(w);
    mkv_free(acc);
    mkv_free(buf);
    return MKV_OK;
}

int mkv_bl_attend_rows(const mkv_attend_query *q, const float *k, const float *v, int64_t n,
                       const uint8_t *mask, mkv_attend_result *res, mkv_error *err)
{
    return attend_rows(q, k, v, 0, n, mask, res, err);
}

int mkv_bl_attend_rows_f16(const mkv_attend_query *q, const uint16_t *k, const uint16_t *v, int64_t n,
                           const uint8_t *mask, mkv_attend_result *res, mkv_error *err)
{
    return attend_rows(q, k, v, 1, n, mask, res, err);
}

int mkv_bl_kept_channels(double keep, int d)
{
    int k = (int)ceil(keep * d - 1e-9);
    return k < 1 ? 1 : k > d ? d : k;
}

int mkv_bl_top_channels(const double *score, int n, int k, int *idx, mkv_error *err)
{
    int64_t *top = mkv_alloc((size_t)k, sizeof *top, "channel ranking", err);
    if (!top)
        return MKV_ENOMEM;
    if (mkv_topk(score, n, k, top) != k) {
        mkv_free(top);
        return mkv_fail(err, MKV_ENOMEM, "out of memory ranking channels");
    }
    for (int i = 0; i < k; i++)
        idx[i] = (int)top[i];
    mkv_free(top);
    return MKV_OK;
}
