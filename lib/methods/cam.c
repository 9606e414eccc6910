/* CaM (Zhang et al., ICML 2024, "CaM: Cache Merging for Memory-efficient
 * LLMs Inference"): StreamingLLM's eviction (the first tokens and a window
 * of the most recent ones are kept), except that a token leaving the
 * window may first merge its value into the kept tokens after it.
 *
 * Per KV head, with n = mkv_budget_tokens(keep, T) tokens kept,
 * start' = floor(start n) first tokens and a window of recent' = n - start'
 * tokens (at least 1, as start < 1), and m = mkv_budget_tokens(merge,
 * recent') receivers (merge: a fraction <= 1 of the window or a count,
 * clamped to it):
 *   1. score_t = the observation attention of token t: the sum over the G
 *      query heads and the last min(window, W) queries of the dump of
 *      softmax_{0..p}(q.k / sqrt(d))_t over the full-precision keys, as
 *      SnapKV scores tokens (mkv_bl_observe).  The paper accumulates the
 *      attention of the prompt's own queries, each under the streaming
 *      mask of its step; an offline dump holds the queries of a few
 *      positions only, so these stand in for them.
 *   2. The window slides over the prompt: tokens t = start', ...,
 *      T - recent' - 1 leave it in order.  When t leaves, the window holds
 *      t+1..t+recent' and its receivers are R = t+1..t+m.  With
 *      p = min(1, score_t / mean_{u in R} score_u) (p = 1 when the mean is
 *      0 and score_t > 0, 0 when both are) and u_t the first uniform of the
 *      mkv_rng stream (seed, layer, KV head, t), t merges when u_t < p:
 *      v_u <- f16(v_u + v_t / m) for every u in R, in double, rounded to
 *      float32 and then float16, as the cache holds float16 values.  A
 *      merged value carries what it received into later merges (the
 *      cascade of the paper's sliding window).  Keys are never merged: the
 *      evicted key is dropped, the kept keys are the tokens' own.
 * The paper's defaults (its released code, question answering): 20% of the
 * cache kept, half of it the first tokens (start_ratio = recent_ratio =
 * 0.1), the whole window receiving (merge_budget = recent_budget), and a
 * Bernoulli draw per eviction; keep=0.2 start=0.5 merge=1 here.  Not
 * implemented: the H2O pairing (heavy hitters kept beside the window) and
 * the paper's recomputation of scores at every step of the prefill.
 *
 * Stored arrays per (layer, KV head), n = start' + recent' rows:
 *   k       float16 [n][d]      keys of tokens 0..start'-1, then T-recent'..T-1
 *   v       float16 [n][d]      their values, the window's with what merged in
 *   score   float32 [recent']   score of each window token (decode merges by it)
 * Attributes start_tokens and recent_tokens record start' and recent'
 * (both follow from the parameters and T).
 *
 * Attention for a query at position p: exact softmax attention over the
 * kept tokens <= p.  Each query answered adds, to the score of every window
 * token it attended, the token's softmax weight summed over the G heads
 * (the paper's accumulated attention; the answer itself does not depend on
 * it).  bytes_read: K and V of the tokens attended (2 x n_p x d x 2) and
 * the float32 score of each window token among them.
 *
 * Decode (append), the paper's rolling window with merging: a new token
 * (position T, key and value stored in float16, score 0) joins the end of
 * the window; when the window already held recent' tokens its oldest,
 * t = T - recent', leaves by rule 2 (its receivers the m tokens after it,
 * the new one among them when m = recent'; the scores those tokens have
 * accumulated so far; the stream (seed, layer, KV head, t)), so the cache
 * stays start' + recent' tokens.  The draws are seeded: decoding is
 * deterministic. */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/attn.h"
#include "core/half.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "methods/baseline.h"

static const mkv_param_spec cam_params[] = {
    {"keep", MKV_PARAM_DOUBLE, "0.2", 0, 1e15, NULL,
     "tokens kept, first tokens and window: a fraction (<= 1) of the context, or a count", MKV_PARAM_ABOVE_MIN},
    {"start", MKV_PARAM_DOUBLE, "0.5", 0, 1, NULL,
     "share of the kept tokens that are the first tokens (below 1; the window holds the rest)"},
    {"merge", MKV_PARAM_DOUBLE, "1", 0, 1e15, NULL,
     "tokens after an evicted one that receive its value: a fraction (<= 1) of the window, or a count",
     MKV_PARAM_ABOVE_MIN},
    {"window", MKV_PARAM_INT, "32", 1, 1e9, NULL, "observation queries: the last queries of the dump"},
    {"seed", MKV_PARAM_INT, "1", 0, 4294967295.0, NULL, "seed of the merge draws"},
    {NULL, 0, NULL, 0, 0, NULL, NULL},
};

typedef struct {
    int64_t T, start, recent;  /* recent: the tokens in the window now, T-recent..T-1 */
    int64_t window;            /* its size, recent' */
    int64_t receivers;         /* m */
    int d, G, layer, head;
    uint64_t seed;
    float *k, *v;              /* [start + recent][d] */
    double *score;             /* [recent]: the window's scores */
    int64_t k_cap, v_cap, score_cap;
} cam_state;

static int check_params(const mkv_params *p, int64_t T, mkv_error *err)
{
    int rc = mkv_bl_check_budget("keep", mkv_params_double(p, "keep"), T, err);
    if (rc)
        return rc;
    if (mkv_params_double(p, "start") >= 1)
        return mkv_fail(err, MKV_EUSAGE, "start=1 leaves no window: the share of first tokens must be below 1");
    /* a count of receivers larger than the window is clamped to it */
    return mkv_bl_check_budget("merge", mkv_params_double(p, "merge"), INT64_MAX, err);
}

/* start', recent' and m for a cache of T tokens. */
static void kept_tokens(const mkv_params *p, int64_t T, int64_t *start, int64_t *recent, int64_t *receivers)
{
    int64_t n = mkv_budget_tokens(mkv_params_double(p, "keep"), T);
    *start = (int64_t)floor(mkv_params_double(p, "start") * (double)n);
    *recent = n - *start;
    *receivers = mkv_budget_tokens(mkv_params_double(p, "merge"), *recent);
}

static int cam_check(const mkv_params *p, const mkv_dump_meta *m, mkv_error *err)
{
    int rc = check_params(p, m->n_tokens, err);
    return rc ? rc : mkv_bl_need_queries("cam", m->n_queries, err);
}

/* Rule 2's draw: whether token t, of score `score`, merges into m receivers
 * of scores recv [m]. */
static int merges(double score, const double *recv, int64_t m, uint64_t seed, int layer, int head, int64_t t)
{
    double mean = 0;
    for (int64_t i = 0; i < m; i++)
        mean += recv[i];
    mean /= (double)m;
    double p = mean > 0 ? score / mean : score > 0 ? 1 : 0;
    mkv_rng r;
    uint64_t keys[3] = {(uint64_t)layer, (uint64_t)head, (uint64_t)t};
    mkv_rng_seed_stream(&r, seed, keys, 3);
    return mkv_rng_uniform(&r) < p;
}

/* v_t / m added to the m rows of recv [m][d], each rounded to float16;
 * MKV_EFORMAT, with nothing changed, when a sum does not fit float16. */
static int merge_value(const float *v_t, float *recv, int64_t m, int d, mkv_error *err)
{
    for (int pass = 0; pass < 2; pass++)
        for (int64_t i = 0; i < m * d; i++) {
            uint16_t h = mkv_f32_to_f16((float)((double)recv[i] + (double)v_t[i % d] / (double)m));
            if (!pass && (h & 0x7c00) == 0x7c00)
                return mkv_fail(err, MKV_EFORMAT, "a merged value does not fit float16");
            if (pass)
                recv[i] = mkv_f16_to_f32(h);
        }
    return MKV_OK;
}

static int cam_compress(const mkv_params *p, const mkv_head_kv *in, mkv_cdump_writer *w, mkv_error *err)
{
    int rc;
    if ((rc = check_params(p, in->T, err)) || (rc = mkv_bl_need_queries("cam", in->W, err)))
        return rc;
    int64_t start, recent, m, d = in->d, T = in->T;
    kept_tokens(p, T, &start, &recent, &m);
    int64_t n = start + recent, window = mkv_params_int(p, "window");
    uint64_t seed = (uint64_t)mkv_params_int(p, "seed");
    double *score = mkv_alloc((size_t)T, sizeof *score, "token scores", err);
    float *v = score ? mkv_alloc((size_t)(T * d), sizeof *v, "merged values", err) : NULL;
    float *k = v ? mkv_alloc((size_t)(n * d), sizeof *k, "kept keys", err) : NULL;
    float *kept_score = k ? mkv_alloc((size_t)recent, sizeof *kept_score, "window scores", err) : NULL;
    if (!kept_score) {
        rc = MKV_ENOMEM;
        goto done;
    }
    if ((rc = mkv_bl_check_f16_range(in->v, (size_t)(T * d), "value", in->layer, in->head, err)) ||
        (rc = mkv_bl_observe(in, window < in->W ? window : in->W, T, score, err)))
        goto done;
    for (int64_t i = 0; i < T * d; i++)
        v[i] = mkv_f16_to_f32(mkv_f32_to_f16(in->v[i]));
    for (int64_t t = start; t < T - recent; t++)
        if (merges(score[t], score + t + 1, m, seed, in->layer, in->head, t) &&
            (rc = merge_value(v + t * d, v + (t + 1) * d, m, (int)d, err)))
            goto done;
    /* the window's rows move up behind the first tokens */
    memmove(v + start * d, v + (T - recent) * d, sizeof(float) * (size_t)(recent * d));
    memcpy(k, in->k, sizeof(float) * (size_t)(start * d));
    memcpy(k + start * d, in->k + (T - recent) * d, sizeof(float) * (size_t)(recent * d));
    for (int64_t i = 0; i < recent; i++)
        kept_score[i] = (float)score[T - recent + i];
    int64_t dims[1] = {recent};
    if (!(rc = mkv_bl_check_f16_range(k, (size_t)(n * d), "key", in->layer, in->head, err)) &&
        !(rc = mkv_cdump_put_rows(w, in->layer, in->head, "k", MKV_EL_F16, n, d, k, err)) &&
        !(rc = mkv_cdump_put_rows(w, in->layer, in->head, "v", MKV_EL_F16, n, d, v, err)) &&
        !(rc = mkv_cdump_put(w, in->layer, in->head, "score", MKV_EL_F32, 1, dims, kept_score, err)) &&
        !(rc = mkv_cdump_put_attr_int(w, in->layer, in->head, "start_tokens", start, err)))
        rc = mkv_cdump_put_attr_int(w, in->layer, in->head, "recent_tokens", recent, err);
done:
    mkv_free(score);
    mkv_free(v);
    mkv_free(k);
    mkv_free(kept_score);
    return rc;
}

static void cam_free(void *state)
{
    cam_state *s = state;
    if (!s)
        return;
    mkv_free(s->k);
    mkv_free(s->v);
    mkv_free(s->score);
    free(s);
}

static int cam_load(const mkv_params *p, mkv_cdump *c, int layer, int head, void **state, mkv_error *err)
{
    cam_state *s = calloc(1, sizeof *s);
    if (!s)
        return mkv_fail(err, MKV_ENOMEM, "out of memory loading cam state");
    mkv_cdump_cache_shape(c, &s->T, &s->d, &s->G);
    s->layer = layer;
    s->head = head;
    float *score = NULL;
    int rc = check_params(p, s->T, err);
    if (!rc) {
        kept_tokens(p, s->T, &s->start, &s->recent, &s->receivers);
        s->window = s->recent;
        s->seed = (uint64_t)mkv_params_int(p, "seed");
        s->k_cap = s->v_cap = s->start + s->recent;
        s->score_cap = s->recent;
        int64_t dims[2] = {s->start + s->recent, s->d}, sdims[1] = {s->recent};
        if (!(rc = mkv_cdump_get_shaped(c, layer, head, "k", MKV_EL_F16, 2, dims, (void **)&s->k, err)) &&
            !(rc = mkv_cdump_get_shaped(c, layer, head, "v", MKV_EL_F16, 2, dims, (void **)&s->v, err)) &&
            !(rc = mkv_cdump_get_shaped(c, layer, head, "score", MKV_EL_F32, 1, sdims, (void **)&score, err)) &&
            !(s->score = mkv_alloc((size_t)s->recent, sizeof *s->score, "window scores", err)))
            rc = MKV_ENOMEM;
    }
    for (int64_t i = 0; !rc && i < s->recent; i++)
        if (!((s->score[i] = score[i]) >= 0))
            rc = mkv_fail(err, MKV_EFORMAT, "layer %d, KV head %d: array 'score' holds a negative score",
                          layer, head);
    mkv_free(score);
    if (rc) {
        cam_free(s);
        return rc;
    }
    *state = s;
    return MKV_OK;
}

static int cam_attend(void *state, const mkv_attend_query *q, mkv_attend_result *r, mkv_error *err)
{
    cam_state *s = state;
    int rc = mkv_bl_check_query(q, s->T, s->d, s->G, err);
    if (rc)
        return rc;
    /* kept tokens are in increasing order: those <= p are a prefix of the rows */
    int64_t rows = 0, first = s->T - s->recent;
    for (int64_t i = 0; i < s->start && i <= q->pos; i++, rows++)
        r->attended[i] = 1;
    for (int64_t t = first; t <= q->pos; t++, rows++)
        r->attended[t] = 1;
    int64_t in_window = rows - (s->start < q->pos + 1 ? s->start : q->pos + 1);
    r->bytes_read = (uint64_t)rows * 2u * (uint64_t)s->d * 2u + (uint64_t)in_window * sizeof(float);
    double *lse = r->lse ? r->lse : mkv_alloc((size_t)q->G, sizeof *lse, "log-sum-exp", err);
    if (!lse)
        return MKV_ENOMEM;
    mkv_attend_result with_lse = *r;
    with_lse.lse = lse;
    if (!(rc = mkv_bl_attend_rows(q, s->k, s->v, rows, NULL, &with_lse, err)))
        for (int64_t i = 0; i < in_window; i++) {
            const float *k = s->k + (s->start + i) * s->d;
            for (int g = 0; g < q->G; g++)
                s->score[i] += exp(q->scale * mkv_bl_dot(q->q + (size_t)g * (size_t)q->d, k, s->d) - lse[g]);
        }
    if (!r->lse)
        mkv_free(lse);
    return rc;
}

static int cam_append(void *state, const float *k, const float *v, mkv_error *err)
{
    cam_state *s = state;
    int64_t row = s->start + s->recent, d = s->d;
    int rc;
    /* stored after the window first, so that a refused token changes nothing */
    double *score = mkv_bl_grow(s->score, &s->score_cap, s->recent, s->recent + 1, sizeof *score, err);
    if (!score)
        return MKV_ENOMEM;
    s->score = score;
    if ((rc = mkv_bl_append_row(&s->k, &s->k_cap, row, k, NULL, s->d, "key", err)) ||
        (rc = mkv_bl_append_row(&s->v, &s->v_cap, row, v, NULL, s->d, "value", err)))
        return rc;
    s->score[s->recent] = 0;
    if (s->recent == s->window) {
        /* the window is full: its oldest token leaves, merging by rule 2 */
        float *oldest = s->v + s->start * d;
        if (merges(s->score[0], s->score + 1, s->receivers, s->seed, s->layer, s->head, s->T - s->recent) &&
            (rc = merge_value(oldest, oldest + d, s->receivers, s->d, err)))
            return rc;
        size_t bytes = sizeof(float) * (size_t)(s->window * d);
        memmove(s->k + s->start * d, s->k + (s->start + 1) * d, bytes);
        memmove(oldest, oldest + d, bytes);
        memmove(s->score, s->score + 1, sizeof *s->score * (size_t)s->window);
    } else {
        s->recent++;
    }
    s->T++;
    return MKV_OK;
}

/* K and V of every row and the window's scores (as compress counts them). */
static uint64_t cam_state_bytes(const void *state)
{
    const cam_state *s = state;
    return (uint64_t)(s->start + s->recent) * 2u * (uint64_t)s->d * 2u + (uint64_t)s->recent * sizeof(float);
}

const mkv_method mkv_method_cam = {
    .name = "cam",
    .summary = "CaM: StreamingLLM's window, evicted values merged into the next kept tokens by attention",
    .params = cam_params,
    .check = cam_check,
    .compress = cam_compress,
    .load = cam_load,
    .attend = cam_attend,
    .free_state = cam_free,
    .append = cam_append,
    .state_bytes = cam_state_bytes,
};
