/* Quest (query-aware page selection): keeps the whole cache and, per decode
 * step, attends only the pages whose key bound is highest for the query.
 * It saves bandwidth, not memory: its page metadata makes the physical
 * size larger than the dense cache.
 *
 * Stored arrays per (layer, KV head), P = ceil(T / page):
 *   k          float16 [T][d]   keys (post-RoPE)
 *   v          float16 [T][d]   values
 *   page_min   float16 [P][d]   elementwise minimum of the keys of each page
 *   page_max   float16 [P][d]   elementwise maximum
 * (fp16 rounding is monotone, so these are also the bounds of the stored
 * fp16 keys.)
 *
 * Attention for a query at position p: each page whose first token is <= p
 * scores sum_i max(q_i page_min_i, q_i page_max_i) (an upper bound of q.k
 * over the page), aggregated over the G query heads (agg=max|sum); tokens
 * are chosen by the common rule of lib/methods/baseline.h (sink and recent
 * always, whole pages by descending score until the budget); exact softmax
 * attention over the chosen tokens <= p.
 * bytes_read: the metadata of the pages scored (2 x P_visible x d x 2) plus
 * K and V of the attended tokens (2 x n x d x 2).
 *
 * In memory the keys and values stay fp16 (as stored), read as floats when
 * attended; the page bounds are floats holding fp16 values.
 *
 * Decode (append): a new token's key and value are stored in float16 after
 * the others; it joins the last page, whose minimum and maximum take it in,
 * or opens the next one. The budget, the recent window and the pages then
 * cover the grown cache as they covered the compressed one. */
#include "config.h"
#include <stdlib.h>
#include <string.h>

#include "methods/baseline.h"
#include "core/half.h"
#include "core/tensor.h"

static const mkv_param_spec quest_params[] = {
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
    int d, G;
    mkv_bl_selection sel;
    uint16_t *k, *v;                  /* [T][d] fp16 */
    float *mn, *mx;                   /* [pages][d] */
    int64_t k_cap, v_cap, page_cap;   /* rows allocated (grown by append) */
} quest_state;

static int quest_check(const mkv_params *p, const mkv_dump_meta *m, mkv_error *err)
{
    int rc = mkv_bl_check_selection(p, m->n_tokens, err);
    if (rc == MKV_OK)
        mkv_bl_warn_budget("quest", p, m->n_tokens);
    return rc;
}

static int quest_compress(const mkv_params *p, const mkv_head_kv *in, mkv_cdump_writer *w,
                          mkv_error *err)
{
    int rc;
    size_t n = (size_t)in->T * (size_t)in->d;
    if ((rc = mkv_bl_check_selection(p, in->T, err)) ||
        (rc = mkv_bl_check_f16_range(in->k, n, "key", in->layer, in->head, err)) ||
        (rc = mkv_bl_check_f16_range(in->v, n, "value", in->layer, in->head, err)))
        return rc;
    int page = (int)mkv_params_int(p, "page");
    int64_t pages = mkv_bl_pages(in->T, page);
    float *mn = mkv_alloc((size_t)pages * (size_t)in->d, sizeof(float), "page minima", err);
    float *mx = mn ? mkv_alloc((size_t)pages * (size_t)in->d, sizeof(float), "page maxima", err) : NULL;
    if (!mx) {
        mkv_free(mn);
        return MKV_ENOMEM;
    }
    mkv_bl_page_minmax(in->k, in->T, in->d, page, mn, mx);
    if (!(rc = mkv_cdump_put_rows(w, in->layer, in->head, "k", MKV_EL_F16, in->T, in->d, in->k, err)) &&
        !(rc = mkv_cdump_put_rows(w, in->layer, in->head, "v", MKV_EL_F16, in->T, in->d, in->v, err)) &&
        !(rc = mkv_cdump_put_rows(w, in->layer, in->head, "page_min", MKV_EL_F16, pages, in->d, mn, err)))
        rc = mkv_cdump_put_rows(w, in->layer, in->head, "page_max", MKV_EL_F16, pages, in->d, mx, err);
    mkv_free(mn);
    mkv_free(mx);
    return rc;
}

static void quest_free(void *state)
{
    quest_state *s = state;
    if (!s)
        return;
    mkv_free(s->k);
    mkv_free(s->v);
    mkv_free(s->mn);
    mkv_free(s->mx);
    free(s);
}

static int quest_load(const mkv_params *p, mkv_cdump *c, int layer, int head, void **state,
                      mkv_error *err)
{
    quest_state *s = calloc(1, sizeof *s);
    if (!s)
        return mkv_fail(err, MKV_ENOMEM, "out of memory loading quest state");
    mkv_cdump_cache_shape(c, &s->T, &s->d, &s->G);
    mkv_bl_selection_from(p, &s->sel);
    int rc = mkv_bl_check_selection(p, s->T, err);
    if (rc) {
        quest_free(s);
        return rc;
    }
    s->pages = mkv_bl_pages(s->T, s->sel.page);
    s->k_cap = s->v_cap = s->T;
    s->page_cap = s->pages;
    int64_t kv[2] = {s->T, s->d}, meta[2] = {s->pages, s->d};
    if ((rc = mkv_cdump_get_shaped(c, layer, head, "k", MKV_EL_F16_BITS, 2, kv, (void **)&s->k, err)) ||
        (rc = mkv_cdump_get_shaped(c, layer, head, "v", MKV_EL_F16_BITS, 2, kv, (void **)&s->v, err)) ||
        (rc = mkv_cdump_get_shaped(c, layer, head, "page_min", MKV_EL_F16, 2, meta, (void **)&s->mn, err)) ||
        (rc = mkv_cdump_get_shaped(c, layer, head, "page_max", MKV_EL_F16, 2, meta, (void **)&s->mx, err))) {
        quest_free(s);
        return rc;
    }
    *state = s;
    return MKV_OK;
}

static int quest_attend(void *state, const mkv_attend_query *q, mkv_attend_result *r, mkv_error *err)
{
    quest_state *s = state;
    int rc = mkv_bl_check_query(q, s->T, s->d, s->G, err);
    if (rc)
        return rc;
    double *score = mkv_alloc((size_t)s->pages, sizeof *score, "page scores", err);
    if (!score)
        return MKV_ENOMEM;
    int64_t visible = mkv_bl_score_pages(&s->sel, q->q, s->G, s->d, s->mn, s->mx, q->pos, score);
    int64_t n = mkv_bl_select(&s->sel, score, s->T, q->pos, r->attended, err);
    mkv_free(score);
    if (n < 0)
        return MKV_ENOMEM;
    r->bytes_read = (uint64_t)(visible + n) * 2u * (uint64_t)s->d * 2u;
    return mkv_bl_attend_rows_f16(q, s->k, s->v, q->pos + 1, r->attended, r, err);
}

/* Row `row` of *rows ([cap][d] fp16, grown) set to x [d] rounded to fp16,
 * whose values go to xr [d]. */
static int append_f16(uint16_t **rows, int64_t *cap, int64_t row, const float *x, int d, float *xr,
                      const char *what, mkv_error *err)
{
    int rc = mkv_bl_round_f16(x, d, xr, what, err);
    uint16_t *p = rc ? NULL : mkv_bl_grow(*rows, cap, row, row + 1, (size_t)d * sizeof **rows, err);
    if (!p)
        return rc ? rc : MKV_ENOMEM;
    *rows = p;
    mkv_f32_to_f16_n(xr, p + (size_t)row * (size_t)d, (size_t)d);
    return MKV_OK;
}

static int quest_append(void *state, const float *k, const float *v, mkv_error *err)
{
    quest_state *s = state;
    float *kr = mkv_alloc(2 * (size_t)s->d, sizeof *kr, "a new key and value", err);
    if (!kr)
        return MKV_ENOMEM;
    int rc;
    if (!(rc = append_f16(&s->k, &s->k_cap, s->T, k, s->d, kr, "key", err)) &&
        !(rc = append_f16(&s->v, &s->v_cap, s->T, v, s->d, kr + s->d, "value", err)) &&
        !(rc = mkv_bl_page_append(&s->mn, &s->mx, &s->page_cap, &s->pages, s->T, s->sel.page, kr, s->d, err)))
        s->T++;
    mkv_free(kr);
    return rc;
}

static uint64_t quest_state_bytes(const void *state)
{
    const quest_state *s = state;
    return ((uint64_t)s->T + (uint64_t)s->pages) * 2u * (uint64_t)s->d * 2u;
}

const mkv_method mkv_method_quest = {
    .name = "quest",
    .summary = "Quest: per-step selection of key pages by min/max bound (saves bandwidth, not memory)",
    .params = quest_params,
    .check = quest_check,
    .compress = quest_compress,
    .load = quest_load,
    .attend = quest_attend,
    .free_state = quest_free,
    .append = quest_append,
    .state_bytes = quest_state_bytes,
};
