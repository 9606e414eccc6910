/* ThinK: prune the least important key channels of each KV head, one mask
 * for all its tokens, and drop them physically (values are kept whole).
 *
 * With the last wq = min(window, W) queries of the dump as observation
 * queries Q_obs (of all G query heads of the KV head), channel j scores
 *   score_j = || Q_obs[:, j] K[:, j]^T ||_F = ||Q_obs[:, j]|| ||K[:, j]||
 * (norms over the G x wq queries and all T keys). The kk = ceil(keep d)
 * highest-scoring channels are kept (ties: lower channel). The keys of the
 * last recent' = min(recent, T) tokens stay whole; the other Tp = T - recent'
 * keep only kk channels.
 * Stored arrays per (layer, KV head):
 *   k_kept      float16 [Tp][kk]       pruned keys, channels in increasing order
 *                                      (absent when Tp = 0)
 *   k_channels  int16 [kk]             the kept channels, increasing
 *   k_recent    float16 [recent'][d]   unpruned recent keys (absent when 0)
 *   v           float16 [T][d]         values, unpruned
 * Attention for a query at position p: every token 0..p (no token
 * selection), q.k over the kept channels for pruned keys and over all d for
 * recent ones, scaled by 1/sqrt(d) as usual.
 * bytes_read: the channel list, the pruned keys (kk x 2 each) and recent
 * keys (d x 2 each) of tokens <= p, and their values (d x 2 each).
 *
 * Decode (append): the head's channel mask stays the one chosen at
 * compress time. A new token's key joins the unpruned recent window and
 * its value the values (float16); once the window holds more than recent
 * keys, its oldest key leaves it pruned to the kk kept channels (at once
 * when recent = 0). After T' tokens the first T' - min(recent, T') keys are
 * pruned, as compress splits a cache of T' tokens; values stay whole. */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/attn.h"
#include "methods/baseline.h"
#include "core/tensor.h"

static const mkv_param_spec think_params[] = {
    {"keep", MKV_PARAM_DOUBLE, "0.5", 0, 1, NULL, "fraction of key channels kept per head", MKV_PARAM_ABOVE_MIN},
    {"recent", MKV_PARAM_INT, "64", 0, 1e9, NULL, "last tokens whose keys are not pruned"},
    {"window", MKV_PARAM_INT, "32", 1, 1e9, NULL, "observation queries: the last queries of the dump"},
    {NULL, 0, NULL, 0, 0, NULL, NULL},
};

typedef struct {
    int64_t T, pruned;     /* tokens, of which the first `pruned` are pruned */
    int64_t recent;        /* the parameter: keys of the last `recent` tokens stay whole */
    int d, G, kk;
    int *channels;         /* [kk] */
    float *k_kept, *k_recent, *v;   /* [pruned][kk], [T - pruned][d], [T][d] */
    int64_t kept_cap, recent_cap, v_cap;   /* rows allocated (grown by append) */
} think_state;

static int think_check(const mkv_params *p, const mkv_dump_meta *m, mkv_error *err)
{
    return mkv_bl_need_queries("think", m->n_queries, err);
}

static int64_t pruned_tokens(const mkv_params *p, int64_t T)
{
    int64_t recent = mkv_params_int(p, "recent");
    return recent < T ? T - recent : 0;
}

/* The kk best channels by the score above, increasing, into idx. */
static int choose_channels(const mkv_head_kv *in, int64_t wq, int kk, int *idx, mkv_error *err)
{
    int d = in->d;
    double *score = mkv_calloc((size_t)d, sizeof *score, "channel scores", err);
    double *qn = score ? mkv_calloc((size_t)d, sizeof *qn, "query norms", err) : NULL;
    if (!qn) {
        mkv_free(score);
        return MKV_ENOMEM;
    }
    for (int g = 0; g < in->G; g++)
        for (int64_t w = in->W - wq; w < in->W; w++) {
            const float *q = in->q + ((size_t)g * (size_t)in->W + (size_t)w) * (size_t)d;
            for (int j = 0; j < d; j++)
                qn[j] += (double)q[j] * q[j];
        }
    for (int64_t t = 0; t < in->T; t++)
        for (int j = 0; j < d; j++)
            score[j] += (double)in->k[t * d + j] * in->k[t * d + j];
    for (int j = 0; j < d; j++)
        score[j] = sqrt(qn[j] * score[j]);
    int rc = mkv_bl_top_channels(score, d, kk, idx, err);
    mkv_free(score);
    mkv_free(qn);
    return rc;
}

static int think_compress(const mkv_params *p, const mkv_head_kv *in, mkv_cdump_writer *w,
                          mkv_error *err)
{
    int rc;
    if ((rc = mkv_bl_need_queries("think", in->W, err)))
        return rc;
    size_t n = (size_t)in->T * (size_t)in->d;
    if ((rc = mkv_bl_check_f16_range(in->k, n, "key", in->layer, in->head, err)) ||
        (rc = mkv_bl_check_f16_range(in->v, n, "value", in->layer, in->head, err)))
        return rc;
    int d = in->d, kk = mkv_bl_kept_channels(mkv_params_double(p, "keep"), d);
    int64_t window = mkv_params_int(p, "window"), wq = window < in->W ? window : in->W;
    int64_t Tp = pruned_tokens(p, in->T);
    int *idx = mkv_alloc((size_t)kk, sizeof *idx, "kept channels", err);
    int16_t *idx16 = idx ? mkv_alloc((size_t)kk, sizeof *idx16, "kept channels", err) : NULL;
    float *kept = idx16 ? mkv_alloc((size_t)(Tp ? Tp : 1) * (size_t)kk, sizeof *kept, "pruned keys", err)
                        : NULL;
    if (!kept) {
        rc = MKV_ENOMEM;
        goto done;
    }
    if ((rc = choose_channels(in, wq, kk, idx, err)))
        goto done;
    for (int j = 0; j < kk; j++)
        idx16[j] = (int16_t)idx[j];
    for (int64_t t = 0; t < Tp; t++)
        for (int j = 0; j < kk; j++)
            kept[t * kk + j] = in->k[t * d + idx[j]];
    int64_t dims[1] = {kk};
    if (!(rc = mkv_cdump_put_rows(w, in->layer, in->head, "k_kept", MKV_EL_F16, Tp, kk, kept, err)) &&
        !(rc = mkv_cdump_put(w, in->layer, in->head, "k_channels", MKV_EL_I16, 1, dims, idx16, err)) &&
        !(rc = mkv_cdump_put_rows(w, in->layer, in->head, "k_recent", MKV_EL_F16, in->T - Tp, d,
                                  in->k + Tp * d, err)))
        rc = mkv_cdump_put_rows(w, in->layer, in->head, "v", MKV_EL_F16, in->T, d, in->v, err);
done:
    mkv_free(idx);
    mkv_free(idx16);
    mkv_free(kept);
    return rc;
}

static void think_free(void *state)
{
    think_state *s = state;
    if (!s)
        return;
    mkv_free(s->channels);
    mkv_free(s->k_kept);
    mkv_free(s->k_recent);
    mkv_free(s->v);
    free(s);
}

static int think_load(const mkv_params *p, mkv_cdump *c, int layer, int head, void **state,
                      mkv_error *err)
{
    think_state *s = calloc(1, sizeof *s);
    if (!s)
        return mkv_fail(err, MKV_ENOMEM, "out of memory loading think state");
    mkv_cdump_cache_shape(c, &s->T, &s->d, &s->G);
    int16_t *ch = NULL;
    s->kk = mkv_bl_kept_channels(mkv_params_double(p, "keep"), s->d);
    s->pruned = pruned_tokens(p, s->T);
    s->recent = mkv_params_int(p, "recent");
    s->kept_cap = s->pruned;
    s->recent_cap = s->T - s->pruned;
    s->v_cap = s->T;
    int64_t nch[1] = {s->kk}, kept[2] = {s->pruned, s->kk}, rec[2] = {s->T - s->pruned, s->d},
            v[2] = {s->T, s->d};
    int rc = mkv_cdump_get_shaped(c, layer, head, "k_channels", MKV_EL_I16, 1, nch, (void **)&ch, err);
    if (!rc && s->pruned)
        rc = mkv_cdump_get_shaped(c, layer, head, "k_kept", MKV_EL_F16, 2, kept, (void **)&s->k_kept, err);
    if (!rc && rec[0])
        rc = mkv_cdump_get_shaped(c, layer, head, "k_recent", MKV_EL_F16, 2, rec, (void **)&s->k_recent, err);
    if (!rc)
        rc = mkv_cdump_get_shaped(c, layer, head, "v", MKV_EL_F16, 2, v, (void **)&s->v, err);
    if (!rc && !(s->channels = mkv_alloc((size_t)s->kk, sizeof *s->channels, "kept channels", err)))
        rc = MKV_ENOMEM;
    for (int j = 0; !rc && j < s->kk; j++) {
        s->channels[j] = ch[j];
        if (ch[j] < 0 || ch[j] >= s->d || (j && ch[j] <= ch[j - 1]))
            rc = mkv_fail(err, MKV_EFORMAT,
                          "layer %d, KV head %d: 'k_channels' is not increasing within 0..%d", layer,
                          head, s->d - 1);
    }
    mkv_free(ch);
    if (rc) {
        think_free(s);
        return rc;
    }
    *state = s;
    return MKV_OK;
}

static int think_attend(void *state, const mkv_attend_query *q, mkv_attend_result *r, mkv_error *err)
{
    think_state *s = state;
    int rc = mkv_bl_check_query(q, s->T, s->d, s->G, err);
    if (rc)
        return rc;
    int d = s->d;
    double *acc = mkv_alloc((size_t)d, sizeof *acc, "attention accumulator", err);
    if (!acc)
        return MKV_ENOMEM;
    for (int g = 0; g < s->G; g++) {
        const float *qg = q->q + (size_t)g * d;
        mkv_osm o;
        mkv_osm_init(&o, acc, d);
        for (int64_t t = 0; t <= q->pos; t++) {
            double dot = t < s->pruned ? mkv_bl_dot_idx(qg, s->channels, s->k_kept + t * s->kk, s->kk)
                                       : mkv_bl_dot(qg, s->k_recent + (t - s->pruned) * d, d);
            mkv_osm_add(&o, q->scale * dot, s->v + t * d);
        }
        mkv_osm_finish(&o, r->out + (size_t)g * d);
        if (r->lse)
            r->lse[g] = mkv_osm_lse(&o);
    }
    mkv_free(acc);
    int64_t n = q->pos + 1, np = n < s->pruned ? n : s->pruned;
    memset(r->attended, 1, (size_t)n);
    r->bytes_read = (uint64_t)s->kk * 2u + (uint64_t)np * (uint64_t)s->kk * 2u +
                    (uint64_t)(n - np) * (uint64_t)d * 2u + (uint64_t)n * (uint64_t)d * 2u;
    return MKV_OK;
}

static int think_append(void *state, const float *k, const float *v, mkv_error *err)
{
    think_state *s = state;
    int d = s->d, rc;
    int64_t in_window = s->T - s->pruned;
    if ((rc = mkv_bl_append_row(&s->k_recent, &s->recent_cap, in_window, k, NULL, d, "key", err)) ||
        (rc = mkv_bl_append_row(&s->v, &s->v_cap, s->T, v, NULL, d, "value", err)))
        return rc;
    if (in_window + 1 > s->recent) {
        /* the oldest key of the window leaves it, pruned to the kept channels */
        if ((rc = mkv_bl_append_row(&s->k_kept, &s->kept_cap, s->pruned, s->k_recent, s->channels, s->kk,
                                    "key", err)))
            return rc;
        memmove(s->k_recent, s->k_recent + d, sizeof(float) * (size_t)in_window * (size_t)d);
        s->pruned++;
    }
    s->T++;
    return MKV_OK;
}

/* The channel list (int16), pruned and recent keys, values. */
static uint64_t think_state_bytes(const void *state)
{
    const think_state *s = state;
    uint64_t d = (uint64_t)s->d, kk = (uint64_t)s->kk;
    return kk * 2u + (uint64_t)s->pruned * kk * 2u + (uint64_t)(s->T - s->pruned) * d * 2u +
           (uint64_t)s->T * d * 2u;
}

const mkv_method mkv_method_think = {
    .name = "think",
    .summary = "ThinK: query-driven key-channel pruning, one mask per head, channels dropped",
    .params = think_params,
    .check = think_check,
    .compress = think_compress,
    .load = think_load,
    .attend = think_attend,
    .free_state = think_free,
    .append = think_append,
    .state_bytes = think_state_bytes,
};
