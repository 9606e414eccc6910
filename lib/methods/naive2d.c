/* Naive 2-D compression, the paper's Fig. 3 baseline: Quest token selection
 * combined with one global channel mask per KV head for keys and one for
 * values (no rotation, no per-vector choice).
 *
 * Channels: kk = kv = ceil(keep d); keys keep the kk channels of highest
 * energy ||K[:, j]||_2 over all T tokens, values the kv channels of highest
 * ||V[:, j]||_2 (ties: lower channel; no queries needed). Every token is
 * masked, sink and recent included.
 * Stored arrays per (layer, KV head), P = ceil(T / page):
 *   k           float16 [T][kk]   keys on the kept key channels (increasing)
 *   v           float16 [T][kv]   values on the kept value channels
 *   k_channels  int16 [kk]
 *   v_channels  int16 [kv]
 *   page_min    float16 [P][kk]   elementwise min of the masked keys per page
 *   page_max    float16 [P][kk]   elementwise max
 * Attention for a query at position p: Quest page scores of q restricted to
 * the kept key channels, the common selection rule of lib/methods/baseline.h
 * (sink, recent, whole pages by score until the budget, G heads aggregated
 * with agg), then softmax attention over the chosen tokens with
 * q.k over the kept key channels (scaled by 1/sqrt(d)) and values on the
 * kept value channels; dropped value channels come out 0.
 * bytes_read: both channel lists, the metadata of the pages scored
 * (2 x P_visible x kk x 2) and the masked K and V of the attended tokens
 * ((kk + kv) x 2 each).
 *
 * Decode (append), as Quest with the masks of compress time: a new token's
 * key is stored on the kept key channels and its value on the kept value
 * channels (float16), after the others; the masked key joins the last
 * page, whose minimum and maximum take it in, or opens the next one. The
 * budget, the recent window and the pages then cover the grown cache. The
 * masks are not chosen again (they come from the prompt's energies). */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/attn.h"
#include "methods/baseline.h"
#include "core/tensor.h"

static const mkv_param_spec naive2d_params[] = {
    {"keep", MKV_PARAM_DOUBLE, "0.5", 0, 1, NULL, "fraction of key and of value channels kept per head",
     MKV_PARAM_ABOVE_MIN},
    {"page", MKV_PARAM_INT, "16", 1, 1 << 20, NULL, "tokens per page"},
    {"budget", MKV_PARAM_DOUBLE, "0.1", 0, 1e15, NULL,
     "tokens attended per step: a fraction (<= 1) of the query's context, or a count", MKV_PARAM_ABOVE_MIN},
    {"sink", MKV_PARAM_INT, "4", 0, 1e9, NULL, "first tokens always attended"},
    {"recent", MKV_PARAM_INT, "64", 0, 1e9, NULL, "last tokens of the cache always attended"},
    {"agg", MKV_PARAM_STRING, "max", 0, 0, "max sum", "page score over the G query heads"},
    {NULL, 0, NULL, 0, 0, NULL, NULL},
};

typedef struct {
    int64_t T, pages;
    int d, G, kk, kv;
    mkv_bl_selection sel;
    int *kch, *vch;        /* [kk], [kv] */
    float *k, *v, *mn, *mx;
    int64_t k_cap, v_cap, page_cap;   /* rows allocated (grown by append) */
} naive2d_state;

static int check_params(const mkv_params *p, int64_t T, mkv_error *err)
{
    return mkv_bl_check_selection(p, T, err);
}

static int naive2d_check(const mkv_params *p, const mkv_dump_meta *m, mkv_error *err)
{
    int rc = check_params(p, m->n_tokens, err);
    if (rc == MKV_OK)
        mkv_bl_warn_budget("naive2d", p, m->n_tokens);
    return rc;
}

/* The kept channels of x [T][d] by column energy, as int and int16, and
 * x restricted to them into out [T][n]. */
static int mask_channels(const float *x, int64_t T, int d, int n, int *idx, int16_t *idx16, float *out,
                         mkv_error *err)
{
    double *energy = mkv_calloc((size_t)d, sizeof *energy, "channel energy", err);
    if (!energy)
        return MKV_ENOMEM;
    for (int64_t t = 0; t < T; t++)
        for (int j = 0; j < d; j++)
            energy[j] += (double)x[t * d + j] * x[t * d + j];
    int rc = mkv_bl_top_channels(energy, d, n, idx, err);
    mkv_free(energy);
    if (rc)
        return rc;
    for (int j = 0; j < n; j++)
        idx16[j] = (int16_t)idx[j];
    for (int64_t t = 0; t < T; t++)
        for (int j = 0; j < n; j++)
            out[t * n + j] = x[t * d + idx[j]];
    return MKV_OK;
}

static int naive2d_compress(const mkv_params *p, const mkv_head_kv *in, mkv_cdump_writer *w,
                            mkv_error *err)
{
    int rc;
    size_t n = (size_t)in->T * (size_t)in->d;
    if ((rc = check_params(p, in->T, err)) ||
        (rc = mkv_bl_check_f16_range(in->k, n, "key", in->layer, in->head, err)) ||
        (rc = mkv_bl_check_f16_range(in->v, n, "value", in->layer, in->head, err)))
        return rc;
    int d = in->d, kk = mkv_bl_kept_channels(mkv_params_double(p, "keep"), d), kv = kk;
    int page = (int)mkv_params_int(p, "page");
    int64_t T = in->T, pages = mkv_bl_pages(T, page);
    int *kch = NULL, *vch = NULL;
    int16_t *kch16 = NULL, *vch16 = NULL;
    float *k = NULL, *v = NULL, *mn = NULL, *mx = NULL;
    if (!(kch = mkv_alloc((size_t)kk, sizeof *kch, "key channels", err)) ||
        !(vch = mkv_alloc((size_t)kv, sizeof *vch, "value channels", err)) ||
        !(kch16 = mkv_alloc((size_t)kk, sizeof *kch16, "key channels", err)) ||
        !(vch16 = mkv_alloc((size_t)kv, sizeof *vch16, "value channels", err)) ||
        !(k = mkv_alloc((size_t)T * (size_t)kk, sizeof *k, "masked keys", err)) ||
        !(v = mkv_alloc((size_t)T * (size_t)kv, sizeof *v, "masked values", err)) ||
        !(mn = mkv_alloc((size_t)pages * (size_t)kk, sizeof *mn, "page minima", err)) ||
        !(mx = mkv_alloc((size_t)pages * (size_t)kk, sizeof *mx, "page maxima", err))) {
        rc = MKV_ENOMEM;
        goto done;
    }
    if ((rc = mask_channels(in->k, T, d, kk, kch, kch16, k, err)) ||
        (rc = mask_channels(in->v, T, d, kv, vch, vch16, v, err)))
        goto done;
    mkv_bl_page_minmax(k, T, kk, page, mn, mx);
    int64_t kdims[1] = {kk}, vdims[1] = {kv};
    if (!(rc = mkv_cdump_put_rows(w, in->layer, in->head, "k", MKV_EL_F16, T, kk, k, err)) &&
        !(rc = mkv_cdump_put_rows(w, in->layer, in->head, "v", MKV_EL_F16, T, kv, v, err)) &&
        !(rc = mkv_cdump_put(w, in->layer, in->head, "k_channels", MKV_EL_I16, 1, kdims, kch16, err)) &&
        !(rc = mkv_cdump_put(w, in->layer, in->head, "v_channels", MKV_EL_I16, 1, vdims, vch16, err)) &&
        !(rc = mkv_cdump_put_rows(w, in->layer, in->head, "page_min", MKV_EL_F16, pages, kk, mn, err)))
        rc = mkv_cdump_put_rows(w, in->layer, in->head, "page_max", MKV_EL_F16, pages, kk, mx, err);
done:
    mkv_free(kch);
    mkv_free(vch);
    mkv_free(kch16);
    mkv_free(vch16);
    mkv_free(k);
    mkv_free(v);
    mkv_free(mn);
    mkv_free(mx);
    return rc;
}

static void naive2d_free(void *state)
{
    naive2d_state *s = state;
    if (!s)
        return;
    mkv_free(s->kch);
    mkv_free(s->vch);
    mkv_free(s->k);
    mkv_free(s->v);
    mkv_free(s->mn);
    mkv_free(s->mx);
    free(s);
}

/* Read a channel list of n entries, which must increase within 0..d-1. */
static int load_channels(mkv_cdump *c, int layer, int head, const char *name, int n, int d, int **out,
                         mkv_error *err)
{
    int16_t *ch = NULL;
    int64_t dims[1] = {n};
    int rc = mkv_cdump_get_shaped(c, layer, head, name, MKV_EL_I16, 1, dims, (void **)&ch, err);
    if (rc)
        return rc;
    int *idx = mkv_alloc((size_t)n, sizeof *idx, name, err);
    if (!idx)
        rc = MKV_ENOMEM;
    for (int j = 0; !rc && j < n; j++) {
        idx[j] = ch[j];
        if (ch[j] < 0 || ch[j] >= d || (j && ch[j] <= ch[j - 1]))
            rc = mkv_fail(err, MKV_EFORMAT, "layer %d, KV head %d: '%s' is not increasing within 0..%d",
                          layer, head, name, d - 1);
    }
    mkv_free(ch);
    if (rc) {
        mkv_free(idx);
        return rc;
    }
    *out = idx;
    return MKV_OK;
}

static int naive2d_load(const mkv_params *p, mkv_cdump *c, int layer, int head, void **state,
                        mkv_error *err)
{
    naive2d_state *s = calloc(1, sizeof *s);
    if (!s)
        return mkv_fail(err, MKV_ENOMEM, "out of memory loading naive2d state");
    mkv_cdump_cache_shape(c, &s->T, &s->d, &s->G);
    int rc = check_params(p, s->T, err);
    if (!rc) {
        mkv_bl_selection_from(p, &s->sel);
        s->kk = s->kv = mkv_bl_kept_channels(mkv_params_double(p, "keep"), s->d);
        s->pages = s->page_cap = mkv_bl_pages(s->T, s->sel.page);
        s->k_cap = s->v_cap = s->T;
        int64_t kd[2] = {s->T, s->kk}, vd[2] = {s->T, s->kv}, md[2] = {s->pages, s->kk};
        if (!(rc = load_channels(c, layer, head, "k_channels", s->kk, s->d, &s->kch, err)) &&
            !(rc = load_channels(c, layer, head, "v_channels", s->kv, s->d, &s->vch, err)) &&
            !(rc = mkv_cdump_get_shaped(c, layer, head, "k", MKV_EL_F16, 2, kd, (void **)&s->k, err)) &&
            !(rc = mkv_cdump_get_shaped(c, layer, head, "v", MKV_EL_F16, 2, vd, (void **)&s->v, err)) &&
            !(rc = mkv_cdump_get_shaped(c, layer, head, "page_min", MKV_EL_F16, 2, md, (void **)&s->mn, err)))
            rc = mkv_cdump_get_shaped(c, layer, head, "page_max", MKV_EL_F16, 2, md, (void **)&s->mx, err);
    }
    if (rc) {
        naive2d_free(s);
        return rc;
    }
    *state = s;
    return MKV_OK;
}

static int naive2d_attend(void *state, const mkv_attend_query *q, mkv_attend_result *r,
                          mkv_error *err)
{
    naive2d_state *s = state;
    int rc = mkv_bl_check_query(q, s->T, s->d, s->G, err);
    if (rc)
        return rc;
    int d = s->d, kk = s->kk;
    float *qk = mkv_alloc((size_t)s->G * (size_t)kk, sizeof *qk, "masked queries", err);
    double *score = qk ? mkv_alloc((size_t)s->pages, sizeof *score, "page scores", err) : NULL;
    double *acc = score ? mkv_alloc((size_t)d, sizeof *acc, "attention accumulator", err) : NULL;
    if (!acc) {
        mkv_free(qk);
        mkv_free(score);
        return MKV_ENOMEM;
    }
    for (int g = 0; g < s->G; g++)
        for (int j = 0; j < kk; j++)
            qk[g * kk + j] = q->q[g * d + s->kch[j]];
    int64_t visible = mkv_bl_score_pages(&s->sel, qk, s->G, kk, s->mn, s->mx, q->pos, score);
    int64_t n = mkv_bl_select(&s->sel, score, s->T, q->pos, r->attended, err);
    if (n >= 0) {
        for (int g = 0; g < s->G; g++) {
            mkv_osm o;
            mkv_osm_init(&o, acc, d);
            for (int64_t t = 0; t <= q->pos; t++)
                if (r->attended[t])
                    mkv_osm_add_sparse(&o, q->scale * mkv_bl_dot(qk + g * kk, s->k + t * kk, kk),
                                       s->v + t * s->kv, s->vch, s->kv);
            mkv_osm_finish(&o, r->out + (size_t)g * d);
            if (r->lse)
                r->lse[g] = mkv_osm_lse(&o);
        }
        r->bytes_read = (uint64_t)(kk + s->kv) * 2u + (uint64_t)visible * 2u * (uint64_t)kk * 2u +
                        (uint64_t)n * (uint64_t)(kk + s->kv) * 2u;
    }
    mkv_free(qk);
    mkv_free(score);
    mkv_free(acc);
    return n < 0 ? MKV_ENOMEM : MKV_OK;
}

static int naive2d_append(void *state, const float *k, const float *v, mkv_error *err)
{
    naive2d_state *s = state;
    int rc;
    if ((rc = mkv_bl_append_row(&s->k, &s->k_cap, s->T, k, s->kch, s->kk, "key", err)) ||
        (rc = mkv_bl_append_row(&s->v, &s->v_cap, s->T, v, s->vch, s->kv, "value", err)) ||
        (rc = mkv_bl_page_append(&s->mn, &s->mx, &s->page_cap, &s->pages, s->T, s->sel.page,
                                 s->k + (size_t)s->T * s->kk, s->kk, err)))
        return rc;
    s->T++;
    return MKV_OK;
}

/* Masked K and V, both channel lists (int16), the page minima and maxima. */
static uint64_t naive2d_state_bytes(const void *state)
{
    const naive2d_state *s = state;
    uint64_t kk = (uint64_t)s->kk, kv = (uint64_t)s->kv;
    return (uint64_t)s->T * (kk + kv) * 2u + (kk + kv) * 2u + (uint64_t)s->pages * 2u * kk * 2u;
}

const mkv_method mkv_method_naive2d = {
    .name = "naive2d",
    .summary = "naive 2-D: Quest page selection plus one global key and value channel mask",
    .params = naive2d_params,
    .check = naive2d_check,
    .compress = naive2d_compress,
    .load = naive2d_load,
    .attend = naive2d_attend,
    .free_state = naive2d_free,
    .append = naive2d_append,
    .state_bytes = naive2d_state_bytes,
};
