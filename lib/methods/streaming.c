/* StreamingLLM: keep the first `sink` tokens (attention sinks) and the most
 * recent ones, evict everything in between, permanently.
 *
 * With n = mkv_budget_tokens(keep, T) tokens kept (keep: a fraction <= 1 of
 * T, or a count > 1), sink' = min(sink, n) and recent' = n - sink':
 *   k   float16 [n][d]   keys of tokens 0..sink'-1, then T-recent'..T-1
 *   v   float16 [n][d]   their values
 * Token indices are implicit (attributes sink_tokens and recent_tokens
 * record sink' and recent'; both follow from the parameters and T).
 *
 * Attention for a query at position p: exact softmax attention over the
 * kept tokens <= p; no further selection. bytes_read: K and V of those
 * tokens (2 x n_p x d x 2).
 *
 * Decode (append), StreamingLLM's rolling cache: the sink' sinks stay, and
 * the other kept tokens are a window of the most recent recent' tokens.
 * A new token (position T, its key and value stored in float16) enters the
 * window; when the window is full its oldest token leaves, for good, so
 * the kept count stays sink' + recent' and after T' tokens the cache holds
 * tokens 0..sink'-1 and T'-recent'..T'-1. Two cases of a window of
 * recent' = 0: while every token so far is a sink and fewer than `sink`
 * have come (a prompt shorter than the sinks, all kept), a new token is a
 * sink too, as the sinks are the first `sink` tokens of the sequence;
 * otherwise (a budget within the sinks) the window still holds the newest
 * token, as the rolling cache always holds the token being decoded, and
 * the count is sink' + 1. Queries take positions up to T' - 1, as for the
 * compressed cache. */
#include "config.h"
#include <stdlib.h>
#include <string.h>

#include "core/attn.h"
#include "methods/baseline.h"
#include "core/tensor.h"

static const mkv_param_spec streaming_params[] = {
    {"sink", MKV_PARAM_INT, "4", 0, 1e9, NULL, "first tokens kept (attention sinks)"},
    {"keep", MKV_PARAM_DOUBLE, "0.1", 0, 1e15, NULL,
     "tokens kept, sink included: a fraction (<= 1) of the context, or a count", MKV_PARAM_ABOVE_MIN},
    {NULL, 0, NULL, 0, 0, NULL, NULL},
};

typedef struct {
    int64_t T, sink, recent;  /* recent: the tokens in the window now, T-recent..T-1 */
    int64_t window;           /* its size: recent' (at least 1 once appending) */
    int64_t sink_param;       /* the parameter sink */
    int d, G;
    float *k, *v;             /* [sink + recent][d] */
    int64_t k_cap, v_cap;     /* rows allocated (grown by append) */
} streaming_state;

static int check_params(const mkv_params *p, int64_t T, mkv_error *err)
{
    return mkv_bl_check_budget("keep", mkv_params_double(p, "keep"), T, err);
}

/* sink' and recent' for a cache of T tokens. */
static void kept_tokens(const mkv_params *p, int64_t T, int64_t *sink, int64_t *recent)
{
    int64_t n = mkv_budget_tokens(mkv_params_double(p, "keep"), T);
    int64_t s = mkv_params_int(p, "sink");
    *sink = s < n ? s : n;
    *recent = n - *sink;
}

static int streaming_check(const mkv_params *p, const mkv_dump_meta *m, mkv_error *err)
{
    return check_params(p, m->n_tokens, err);
}

static int streaming_compress(const mkv_params *p, const mkv_head_kv *in, mkv_cdump_writer *w,
                              mkv_error *err)
{
    int rc = check_params(p, in->T, err);
    if (rc)
        return rc;
    int64_t sink, recent, d = in->d;
    kept_tokens(p, in->T, &sink, &recent);
    int64_t n = sink + recent;
    float *k = mkv_alloc((size_t)(n * d), sizeof(float), "kept keys", err);
    float *v = k ? mkv_alloc((size_t)(n * d), sizeof(float), "kept values", err) : NULL;
    if (!v) {
        mkv_free(k);
        return MKV_ENOMEM;
    }
    size_t head = sizeof(float) * (size_t)(sink * d), tail = sizeof(float) * (size_t)(recent * d);
    memcpy(k, in->k, head);
    memcpy(v, in->v, head);
    memcpy(k + sink * d, in->k + (in->T - recent) * d, tail);
    memcpy(v + sink * d, in->v + (in->T - recent) * d, tail);
    if (!(rc = mkv_bl_check_f16_range(k, (size_t)(n * d), "key", in->layer, in->head, err)) &&
        !(rc = mkv_bl_check_f16_range(v, (size_t)(n * d), "value", in->layer, in->head, err)) &&
        !(rc = mkv_cdump_put_rows(w, in->layer, in->head, "k", MKV_EL_F16, n, d, k, err)) &&
        !(rc = mkv_cdump_put_rows(w, in->layer, in->head, "v", MKV_EL_F16, n, d, v, err)) &&
        !(rc = mkv_cdump_put_attr_int(w, in->layer, in->head, "sink_tokens", sink, err)))
        rc = mkv_cdump_put_attr_int(w, in->layer, in->head, "recent_tokens", recent, err);
    mkv_free(k);
    mkv_free(v);
    return rc;
}

static void streaming_free(void *state)
{
    streaming_state *s = state;
    if (!s)
        return;
    mkv_free(s->k);
    mkv_free(s->v);
    free(s);
}

static int streaming_load(const mkv_params *p, mkv_cdump *c, int layer, int head, void **state,
                          mkv_error *err)
{
    streaming_state *s = calloc(1, sizeof *s);
    if (!s)
        return mkv_fail(err, MKV_ENOMEM, "out of memory loading streaming state");
    mkv_cdump_cache_shape(c, &s->T, &s->d, &s->G);
    int rc = check_params(p, s->T, err);
    if (!rc) {
        kept_tokens(p, s->T, &s->sink, &s->recent);
        s->window = s->recent > 0 ? s->recent : 1;
        s->sink_param = mkv_params_int(p, "sink");
        s->k_cap = s->v_cap = s->sink + s->recent;
        int64_t dims[2] = {s->sink + s->recent, s->d};
        if (!(rc = mkv_cdump_get_shaped(c, layer, head, "k", MKV_EL_F16, 2, dims, (void **)&s->k, err)))
            rc = mkv_cdump_get_shaped(c, layer, head, "v", MKV_EL_F16, 2, dims, (void **)&s->v, err);
    }
    if (rc) {
        streaming_free(s);
        return rc;
    }
    *state = s;
    return MKV_OK;
}

static int streaming_attend(void *state, const mkv_attend_query *q, mkv_attend_result *r,
                            mkv_error *err)
{
    streaming_state *s = state;
    int rc = mkv_bl_check_query(q, s->T, s->d, s->G, err);
    if (rc)
        return rc;
    /* kept tokens are in increasing order: those <= p are a prefix of the rows */
    int64_t rows = 0;
    for (int64_t i = 0; i < s->sink && i <= q->pos; i++, rows++)
        r->attended[i] = 1;
    for (int64_t t = s->T - s->recent; t <= q->pos; t++, rows++)
        r->attended[t] = 1;
    r->bytes_read = (uint64_t)rows * 2u * (uint64_t)s->d * 2u;
    return mkv_bl_attend_rows(q, s->k, s->v, rows, NULL, r, err);
}

static int streaming_append(void *state, const float *k, const float *v, mkv_error *err)
{
    streaming_state *s = state;
    int64_t row = s->sink + s->recent, d = s->d;
    int rc;
    /* stored after the window first, so that a refused token changes nothing */
    if ((rc = mkv_bl_append_row(&s->k, &s->k_cap, row, k, NULL, s->d, "key", err)) ||
        (rc = mkv_bl_append_row(&s->v, &s->v_cap, row, v, NULL, s->d, "value", err)))
        return rc;
    if (s->sink == s->T && s->T < s->sink_param) {
        s->sink++;            /* one of the first `sink` tokens: a sink (the window is empty) */
    } else if (s->recent == s->window) {
        /* the window is full: its oldest token leaves, the rows after it move up */
        size_t n = sizeof(float) * (size_t)s->window * (size_t)d;
        memmove(s->k + s->sink * d, s->k + (s->sink + 1) * d, n);
        memmove(s->v + s->sink * d, s->v + (s->sink + 1) * d, n);
    } else {
        s->recent++;
    }
    s->T++;
    return MKV_OK;
}

static uint64_t streaming_state_bytes(const void *state)
{
    const streaming_state *s = state;
    return (uint64_t)(s->sink + s->recent) * 2u * (uint64_t)s->d * 2u;
}

const mkv_method mkv_method_streaming = {
    .name = "streaming",
    .summary = "StreamingLLM: keep attention-sink and recent tokens, evict the rest",
    .params = streaming_params,
    .check = streaming_check,
    .compress = streaming_compress,
    .load = streaming_load,
    .attend = streaming_attend,
    .free_state = streaming_free,
    .append = streaming_append,
    .state_bytes = streaming_state_bytes,
};
