/* SnapKV: evict tokens once, at compression time, keeping those the
 * observation queries attend to most.
 *
 * Per KV head, with the last wq = min(window, W) queries of the dump as the
 * observation queries, the last win = min(window, T) tokens as the
 * observation window and prefix = T - win:
 *   1. score_t (t < prefix) = sum over the G query heads and the wq queries
 *      of softmax_{0..p_w}(q.k / sqrt(d))_t  (p_w: the query's position;
 *      full-precision keys, as at prefill);
 *   2. pooled_t = max of score over [t - (kernel-1)/2, t + (kernel-1)/2]
 *      within the prefix (kernel odd);
 *   3. keep n = mkv_budget_tokens(keep, T) tokens: the first
 *      sink' = min(sink, prefix) tokens, the observation window, and the
 *      n - sink' - win prefix tokens with the highest pooled score (ties:
 *      lower index); at least sink' + win tokens are kept.
 * Stored arrays per (layer, KV head), n kept tokens in increasing order:
 *   k       float16 [n][d]
 *   v       float16 [n][d]
 *   index   int32 [n]      token position of each row
 * Attention for a query at position p: exact softmax attention over the
 * kept tokens <= p (eviction is permanent: no per-step selection).
 * bytes_read: K and V of those tokens (2 x n_p x d x 2); the index array
 * only serves this offline evaluation's causal cut (a decode kernel reads
 * its whole, already causal, cache) and is not counted per step.
 * The observation queries are usually among the queries mkv-attend
 * evaluates: fidelity on them is optimistic by construction.
 *
 * Decode (append): SnapKV compresses once, on the prompt; every token
 * decoded after it is kept, its key and value stored in float16 after the
 * others and its position in index (the arrays grow by one row), and
 * attended at every later step. Nothing is evicted again. */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/attn.h"
#include "methods/baseline.h"
#include "core/tensor.h"

static const mkv_param_spec snapkv_params[] = {
    {"keep", MKV_PARAM_DOUBLE, "0.1", 0, 1e15, NULL,
     "tokens kept, sink and window included: a fraction (<= 1) of the context, or a count", MKV_PARAM_ABOVE_MIN},
    {"window", MKV_PARAM_INT, "32", 1, 1e9, NULL,
     "observation window: the last queries of the dump and the last tokens (always kept)"},
    {"kernel", MKV_PARAM_INT, "7", 1, 1e6, NULL, "max-pool width over token scores", MKV_PARAM_ODD},
    {"sink", MKV_PARAM_INT, "4", 0, 1e9, NULL, "first tokens always kept"},
    {NULL, 0, NULL, 0, 0, NULL, NULL},
};

typedef struct {
    int64_t T, n;
    int d, G;
    float *k, *v;
    int32_t *index;
    int64_t k_cap, v_cap, index_cap;   /* rows allocated (grown by append) */
} snapkv_state;

static int check_params(const mkv_params *p, int64_t T, mkv_error *err)
{
    return mkv_bl_check_budget("keep", mkv_params_double(p, "keep"), T, err);
}

static int snapkv_check(const mkv_params *p, const mkv_dump_meta *m, mkv_error *err)
{
    int rc = check_params(p, m->n_tokens, err);
    return rc ? rc : mkv_bl_need_queries("snapkv", m->n_queries, err);
}

/* Steps 2 and 3: the kept token positions, increasing, into index; returns n. */
static int64_t choose(const mkv_params *p, int64_t T, int64_t prefix, const double *score,
                      int32_t *index, mkv_error *err)
{
    int64_t half = (mkv_params_int(p, "kernel") - 1) / 2;
    int64_t sink = mkv_params_int(p, "sink");
    if (sink > prefix)
        sink = prefix;
    int64_t want = mkv_budget_tokens(mkv_params_double(p, "keep"), T) - sink - (T - prefix);
    int64_t pool_n = prefix - sink;
    if (want > pool_n)
        want = pool_n;
    int64_t n = 0;
    for (int64_t t = 0; t < sink; t++)
        index[n++] = (int32_t)t;
    if (want > 0) {
        double *pooled = mkv_alloc((size_t)pool_n, sizeof *pooled, "pooled scores", err);
        int64_t *top = pooled ? mkv_alloc((size_t)want, sizeof *top, "kept tokens", err) : NULL;
        if (!top) {
            mkv_free(pooled);
            return -1;
        }
        for (int64_t i = 0; i < pool_n; i++) {
            int64_t t = sink + i, lo = t - half < 0 ? 0 : t - half, hi = t + half >= prefix ? prefix - 1 : t + half;
            double m = score[lo];
            for (int64_t u = lo + 1; u <= hi; u++)
                if (score[u] > m)
                    m = score[u];
            pooled[i] = m;
        }
        int64_t got = mkv_topk(pooled, pool_n, want, top);
        for (int64_t i = 0; i < got; i++)
            index[n++] = (int32_t)(sink + top[i]);
        mkv_free(pooled);
        mkv_free(top);
        if (got < 0) {
            mkv_fail(err, MKV_ENOMEM, "out of memory ranking tokens");
            return -1;
        }
    }
    for (int64_t t = prefix; t < T; t++)
        index[n++] = (int32_t)t;
    return n;
}

static int snapkv_compress(const mkv_params *p, const mkv_head_kv *in, mkv_cdump_writer *w,
                           mkv_error *err)
{
    int rc;
    if ((rc = check_params(p, in->T, err)) || (rc = mkv_bl_need_queries("snapkv", in->W, err)))
        return rc;
    int64_t window = mkv_params_int(p, "window"), d = in->d;
    int64_t wq = window < in->W ? window : in->W;
    int64_t prefix = window < in->T ? in->T - window : 0;
    double *score = mkv_alloc((size_t)(prefix ? prefix : 1), sizeof *score, "token scores", err);
    int32_t *index = score ? mkv_alloc((size_t)in->T, sizeof *index, "kept positions", err) : NULL;
    float *k = NULL, *v = NULL;
    int64_t n = -1;
    if (!index) {
        rc = MKV_ENOMEM;
        goto done;
    }
    if ((rc = mkv_bl_observe(in, wq, prefix, score, err)))
        goto done;
    if ((n = choose(p, in->T, prefix, score, index, err)) < 0) {
        rc = err ? err->code : MKV_ENOMEM;
        goto done;
    }
    if (!(k = mkv_alloc((size_t)(n * d), sizeof(float), "kept keys", err)) ||
        !(v = mkv_alloc((size_t)(n * d), sizeof(float), "kept values", err))) {
        rc = MKV_ENOMEM;
        goto done;
    }
    for (int64_t i = 0; i < n; i++) {
        memcpy(k + i * d, in->k + (int64_t)index[i] * d, sizeof(float) * (size_t)d);
        memcpy(v + i * d, in->v + (int64_t)index[i] * d, sizeof(float) * (size_t)d);
    }
    int64_t dims[1] = {n};
    if (!(rc = mkv_bl_check_f16_range(k, (size_t)(n * d), "key", in->layer, in->head, err)) &&
        !(rc = mkv_bl_check_f16_range(v, (size_t)(n * d), "value", in->layer, in->head, err)) &&
        !(rc = mkv_cdump_put_rows(w, in->layer, in->head, "k", MKV_EL_F16, n, d, k, err)) &&
        !(rc = mkv_cdump_put_rows(w, in->layer, in->head, "v", MKV_EL_F16, n, d, v, err)))
        rc = mkv_cdump_put(w, in->layer, in->head, "index", MKV_EL_I32, 1, dims, index, err);
done:
    mkv_free(score);
    mkv_free(index);
    mkv_free(k);
    mkv_free(v);
    return rc;
}

static void snapkv_free(void *state)
{
    snapkv_state *s = state;
    if (!s)
        return;
    mkv_free(s->k);
    mkv_free(s->v);
    mkv_free(s->index);
    free(s);
}

static int snapkv_load(const mkv_params *p, mkv_cdump *c, int layer, int head, void **state,
                       mkv_error *err)
{
    snapkv_state *s = calloc(1, sizeof *s);
    if (!s)
        return mkv_fail(err, MKV_ENOMEM, "out of memory loading snapkv state");
    mkv_cdump_cache_shape(c, &s->T, &s->d, &s->G);
    int64_t dims[3] = {0, 0, 0};
    int rc = check_params(p, s->T, err);
    if (!rc && mkv_cdump_shape(c, layer, head, "index", dims) != 1)
        rc = mkv_fail(err, MKV_EFORMAT, "layer %d, KV head %d: array 'index' is missing or not 1-D",
                      layer, head);
    if (!rc) {
        s->n = s->k_cap = s->v_cap = s->index_cap = dims[0];
        int64_t kv[2] = {s->n, s->d};
        if (!(rc = mkv_cdump_get_shaped(c, layer, head, "index", MKV_EL_I32, 1, dims, (void **)&s->index, err)) &&
            !(rc = mkv_cdump_get_shaped(c, layer, head, "k", MKV_EL_F16, 2, kv, (void **)&s->k, err)))
            rc = mkv_cdump_get_shaped(c, layer, head, "v", MKV_EL_F16, 2, kv, (void **)&s->v, err);
    }
    for (int64_t i = 0; !rc && i < s->n; i++)
        if (s->index[i] < 0 || s->index[i] >= s->T || (i && s->index[i] <= s->index[i - 1]))
            rc = mkv_fail(err, MKV_EFORMAT,
                          "layer %d, KV head %d: 'index' is not increasing within 0..%lld", layer,
                          head, (long long)s->T - 1);
    if (rc) {
        snapkv_free(s);
        return rc;
    }
    *state = s;
    return MKV_OK;
}

static int snapkv_attend(void *state, const mkv_attend_query *q, mkv_attend_result *r, mkv_error *err)
{
    snapkv_state *s = state;
    int rc = mkv_bl_check_query(q, s->T, s->d, s->G, err);
    if (rc)
        return rc;
    int64_t rows = 0;
    while (rows < s->n && s->index[rows] <= q->pos)
        r->attended[s->index[rows++]] = 1;
    r->bytes_read = (uint64_t)rows * 2u * (uint64_t)s->d * 2u;
    return mkv_bl_attend_rows(q, s->k, s->v, rows, NULL, r, err);
}

static int snapkv_append(void *state, const float *k, const float *v, mkv_error *err)
{
    snapkv_state *s = state;
    int rc;
    if (s->T >= INT32_MAX)
        return mkv_fail(err, MKV_EUSAGE, "position %lld does not fit the int32 index", (long long)s->T);
    int32_t *index = mkv_bl_grow(s->index, &s->index_cap, s->n, s->n + 1, sizeof *index, err);
    if (!index)
        return MKV_ENOMEM;
    s->index = index;
    if ((rc = mkv_bl_append_row(&s->k, &s->k_cap, s->n, k, NULL, s->d, "key", err)) ||
        (rc = mkv_bl_append_row(&s->v, &s->v_cap, s->n, v, NULL, s->d, "value", err)))
        return rc;
    s->index[s->n++] = (int32_t)s->T++;
    return MKV_OK;
}

/* K and V of every row, and the index (as compress counts them). */
static uint64_t snapkv_state_bytes(const void *state)
{
    const snapkv_state *s = state;
    return (uint64_t)s->n * (2u * (uint64_t)s->d * 2u + sizeof(int32_t));
}

const mkv_method mkv_method_snapkv = {
    .name = "snapkv",
    .summary = "SnapKV: one-time eviction by observation-window attention, pooled",
    .params = snapkv_params,
    .check = snapkv_check,
    .compress = snapkv_compress,
    .load = snapkv_load,
    .attend = snapkv_attend,
    .free_state = snapkv_free,
    .append = snapkv_append,
    .state_bytes = snapkv_state_bytes,
};
