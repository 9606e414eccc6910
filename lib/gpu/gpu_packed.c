/* GPU attention over compressed dumps, host side: the per-method drivers
 * of mkv-attend --device gpu (see gpu_packed.h) over the GPU layout that
 * lib/mosaic/packed.c builds. */
#include "config.h"
#include "gpu/gpu_packed.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/attn.h"
#include "methods/baseline.h"
#include "core/half.h"
#include "core/tensor.h"

/* ---------------------------------------------------------------- usability */

int mkv_gpu_method_usable(const mkv_method *m, const mkv_params *p, const mkv_dump_meta *meta, char *why, size_t len)
{
    static int probed = 0, count = 0, usable = 0;
    static char name[256];
    if (!mkv_cuda_built()) {
        snprintf(why, len, "this build has no CUDA");
        return 0;
    }
    if (!probed) {
        mkv_gpu_info info[1];
        mkv_error e = {0};
        if (mkv_cuda_devices(info, 1, &count, &e) != MKV_OK)
            count = 0;
        usable = count > 0 && info[0].usable;
        snprintf(name, sizeof name, "%s", count > 0 ? info[0].name : "");
        probed = 1;
    }
    if (count == 0) {
        snprintf(why, len, "no GPU is visible");
        return 0;
    }
    if (!usable) {
        snprintf(why, len, "GPU '%s' is not a target of this build", name);
        return 0;
    }
    const char *n = m->name;
    int mosaic = !strcmp(n, "mosaic") || !strcmp(n, "uniform2d");
    if (!mosaic && strcmp(n, "quest") && strcmp(n, "full")) {
        snprintf(why, len, "method '%s' has no GPU path", n);
        return -1;
    }
    int G = meta->n_kv_heads > 0 ? meta->n_heads / meta->n_kv_heads : 0;
    if (meta->head_dim != 64 && meta->head_dim != 128) {
        snprintf(why, len, "head_dim %d (the GPU kernels take 64 and 128)", meta->head_dim);
        return -1;
    }
    if (G < 1 || G > 8) {
        snprintf(why, len, "%d query heads per KV head (the GPU kernels take 1 to 8)", G);
        return -1;
    }
    if (mosaic) {
        int64_t B = mkv_params_int(p, "block");
        if (B != 1 && B != 2 && B != 4 && B != 8 && B != 16) {
            snprintf(why, len, "block=%lld (the GPU kernel takes 1, 2, 4, 8 or 16 tokens)", (long long)B);
            return -1;
        }
    }
    if (!strcmp(n, "quest")) {
        int64_t page = mkv_params_int(p, "page");
        if (page < 16 || page % 16 || page > 4096) {
            snprintf(why, len, "page=%lld (the GPU kernel takes multiples of 16 up to 4096)", (long long)page);
            return -1;
        }
    }
    return 1;
}

/* ---------------------------------------------------------------- drivers */

/* Device buffers of one call, freed together. */
typedef struct {
    void *p[8];
    int n;
} dev_set;

static void *dev_alloc(dev_set *s, size_t bytes, mkv_error *err)
{
    void *ptr = NULL;
    if (mkv_cuda_malloc(&ptr, bytes, err) != MKV_OK)
        return NULL;
    s->p[s->n++] = ptr;
    return ptr;
}

static void dev_free(dev_set *s)
{
    for (int i = 0; i < s->n; i++)
        mkv_cuda_free(s->p[i]);
    s->n = 0;
}

/* K and V of a dense method's head as fp16 [T][d]. */
static int load_kv16(mkv_cdump *c, int layer, int head, int64_t T, int d, uint16_t **k16, uint16_t **v16, mkv_error *err)
{
    size_t n = (size_t)T * (size_t)d;
    float *f = mkv_alloc(n, sizeof *f, "keys", err);
    *k16 = f ? mkv_alloc(n, 2, "keys", err) : NULL;
    *v16 = *k16 ? mkv_alloc(n, 2, "values", err) : NULL;
    int rc = *v16 ? MKV_OK : (err ? err->code : MKV_ENOMEM);
    if (rc == MKV_OK && (rc = mkv_cdump_get(c, layer, head, "k", MKV_EL_F16, f, n, err)) == MKV_OK) {
        mkv_f32_to_f16_n(f, *k16, n);
        if ((rc = mkv_cdump_get(c, layer, head, "v", MKV_EL_F16, f, n, err)) == MKV_OK)
            mkv_f32_to_f16_n(f, *v16, n);
    }
    mkv_free(f);
    if (rc != MKV_OK) {
        mkv_free(*k16);
        mkv_free(*v16);
        *k16 = *v16 = NULL;
    }
    return rc;
}

/* The dense methods' device buffers: the head's K and V in fp16 (uploaded)
 * and room for one query window's q and out, in ds. */
typedef struct {
    uint16_t *k, *v;
    float *q, *out;
} dense_bufs;

static int dense_setup(mkv_cdump *c, int layer, int head, const mkv_gpu_queries *q, dev_set *ds, dense_bufs *b,
                       mkv_error *err)
{
    const size_t gd = (size_t)q->G * (size_t)q->d;
    uint16_t *k16, *v16;
    int rc = load_kv16(c, layer, head, q->T, q->d, &k16, &v16, err);
    if (rc != MKV_OK)
        return rc;
    const size_t kv = (size_t)q->T * (size_t)q->d * 2;
    b->k = dev_alloc(ds, kv, err);
    b->v = b->k ? dev_alloc(ds, kv, err) : NULL;
    b->q = b->v ? dev_alloc(ds, gd * 4, err) : NULL;
    b->out = b->q ? dev_alloc(ds, gd * 4, err) : NULL;
    rc = b->out ? MKV_OK : (err ? err->code : MKV_ENOMEM);
    if (rc == MKV_OK && (rc = mkv_cuda_upload(b->k, k16, kv, err)) == MKV_OK)
        rc = mkv_cuda_upload(b->v, v16, kv, err);
    mkv_free(k16);
    mkv_free(v16);
    return rc;
}

static int attend_full(mkv_cdump *c, int layer, int head, const mkv_gpu_queries *q, mkv_gpu_answers *a, mkv_error *err)
{
    const int d = q->d, G = q->G;
    const size_t gd = (size_t)G * (size_t)d;
    dev_set ds = {0};
    dense_bufs b = {0};
    int rc = dense_setup(c, layer, head, q, &ds, &b, err);
    mkv_attn_shape s = {1, G, 1, d, q->T, 0, 0};
    for (int64_t w = 0; w < q->W && rc == MKV_OK; w++) {
        int64_t len = q->pos[w] + 1;
        mkv_dense_plan *p = NULL;
        if ((rc = mkv_cuda_upload(b.q, q->q + w * gd, gd * 4, err)) != MKV_OK ||
            (rc = mkv_cuda_dense_plan(&s, &len, &p, err)) != MKV_OK)
            break;
        rc = mkv_cuda_dense_run(p, b.q, b.k, b.v, b.out, NULL, err);
        mkv_cuda_dense_plan_free(p);
        if (rc == MKV_OK && (rc = mkv_cuda_synchronize(err)) == MKV_OK)
            rc = mkv_cuda_download(a->out + w * gd, b.out, gd * 4, err);
        memset(a->attended + w * q->T, 1, (size_t)len);
        a->bytes_read[w] = (uint64_t)len * (uint64_t)d * 2 * 2;
    }
    dev_free(&ds);
    return rc;
}

static int attend_quest(const mkv_params *pr, mkv_cdump *c, int layer, int head, const mkv_gpu_queries *q,
                        mkv_gpu_answers *a, mkv_error *err)
{
    const int d = q->d, G = q->G;
    const size_t gd = (size_t)G * (size_t)d;
    mkv_quest_params qp = {(int)mkv_params_int(pr, "page"), (int)mkv_params_int(pr, "sink"),
                           (int)mkv_params_int(pr, "recent"), mkv_params_double(pr, "budget"),
                           strcmp(mkv_params_str(pr, "agg"), "sum") == 0};
    dev_set ds = {0};
    dense_bufs b = {0};
    int rc = dense_setup(c, layer, head, q, &ds, &b, err);
    mkv_attn_shape s = {1, G, 1, d, q->T, 0, 0};
    uint16_t *meta = NULL;
    int32_t *pages = NULL;
    for (int64_t w = 0; w < q->W && rc == MKV_OK; w++) {
        int64_t len = q->pos[w] + 1, T = q->T;
        mkv_quest_plan *p = NULL;
        if ((rc = mkv_cuda_upload(b.q, q->q + w * gd, gd * 4, err)) != MKV_OK ||
            (rc = mkv_cuda_quest_plan(&s, &len, &T, &qp, &p, err)) != MKV_OK)
            break;
        if (!meta) {   /* page metadata depends on K and the page size only */
            meta = dev_alloc(&ds, mkv_cuda_quest_meta_elems(p) * 2, err);
            pages = meta ? mkv_alloc((size_t)mkv_cuda_quest_pages_max(p), sizeof *pages, "page list", err) : NULL;
            if (!pages || (rc = mkv_cuda_quest_build_meta(p, b.k, meta, NULL, err)) != MKV_OK) {
                rc = rc != MKV_OK ? rc : (err ? (int)err->code : MKV_ENOMEM);
                mkv_cuda_quest_plan_free(p);
                break;
            }
        }
        int32_t count = 0;
        int64_t tokens = 0;
        mkv_quest_counts qc;
        if ((rc = mkv_cuda_quest_select(p, b.q, meta, NULL, err)) == MKV_OK &&
            (rc = mkv_cuda_quest_attend(p, b.q, b.k, b.v, b.out, NULL, err)) == MKV_OK &&
            (rc = mkv_cuda_quest_selection(p, pages, &count, &tokens, err)) == MKV_OK &&
            (rc = mkv_cuda_quest_counts(p, 0, &qc, err)) == MKV_OK)
            rc = mkv_cuda_download(a->out + w * gd, b.out, gd * 4, err);
        mkv_cuda_quest_plan_free(p);
        if (rc != MKV_OK)
            break;
        /* the rule of mkv_cuda.h: whole pages, or only their sink and recent tokens */
        uint8_t *att = a->attended + w * q->T;
        const int64_t P = qp.page_size, sink_end = qp.sink < len ? qp.sink : len;
        const int64_t recent_start = T - qp.recent > sink_end ? T - qp.recent : sink_end;
        for (int32_t i = 0; i < count; i++) {
            const int32_t e = pages[i], pg = e >= 0 ? e : -1 - e;
            for (int64_t t = (int64_t)pg * P; t < (int64_t)(pg + 1) * P && t < len; t++)
                if (e >= 0 || t < sink_end || t >= recent_start)
                    att[t] = 1;
        }
        a->bytes_read[w] = (uint64_t)(qc.pages + tokens) * 2u * (uint64_t)d * 2u;
    }
    mkv_free(pages);
    dev_free(&ds);
    return rc;
}

static int attend_mosaic(const mkv_params *pr, mkv_cdump *c, int layer, int head, const mkv_gpu_queries *q,
                         mkv_gpu_answers *a, mkv_error *err)
{
    const int d = q->d, G = q->G;
    const size_t gd = (size_t)G * (size_t)d;
    mkv_mosaic_head h;
    int rc = mkv_mosaic_load(c, layer, head, (int)mkv_params_int(pr, "block"), mkv_params_int(pr, "sink"),
                             mkv_params_int(pr, "recent"), &h, err);
    if (rc != MKV_OK)
        return rc;
    const mkv_mosaic_head *hp = &h;
    mkv_gpu_layout g;
    mkv_packed_cache *cache = NULL;
    mkv_packed_plan *plan = NULL;
    dev_set ds = {0};
    int32_t *heads = mkv_calloc((size_t)q->W, sizeof *heads, "head table", err);
    uint8_t *blocks = NULL;
    rc = heads ? mkv_gpu_layout_build(&hp, 1, 0, &g, err) : (err ? (int)err->code : MKV_ENOMEM);
    if (rc != MKV_OK) {
        mkv_free(heads);
        mkv_mosaic_head_free(&h);
        return rc;
    }
    float *dq = NULL, *dout = NULL;
    if ((rc = mkv_cuda_packed_upload(&g.l, &cache, err)) == MKV_OK) {
        mkv_packed_params pp = {(int)q->W, 1, G, 0, mkv_params_double(pr, "budget"),
                                strcmp(mkv_params_str(pr, "agg"), "sum") == 0};
        rc = mkv_cuda_packed_plan(cache, &pp, heads, q->pos, &plan, err);
    }
    if (rc == MKV_OK) {
        dq = dev_alloc(&ds, gd * 4 * (size_t)q->W, err);
        dout = dq ? dev_alloc(&ds, gd * 4 * (size_t)q->W, err) : NULL;
        blocks = dout ? mkv_alloc((size_t)(g.heads[0].n_blocks ? g.heads[0].n_blocks : 1), 1, "block flags", err) : NULL;
        rc = blocks ? MKV_OK : (err ? err->code : MKV_ENOMEM);
    }
    if (rc == MKV_OK && (rc = mkv_cuda_upload(dq, q->q, gd * 4 * (size_t)q->W, err)) == MKV_OK &&
        (rc = mkv_cuda_packed_run(plan, dq, dout, NULL, err)) == MKV_OK && (rc = mkv_cuda_synchronize(err)) == MKV_OK)
        rc = mkv_cuda_download(a->out, dout, gd * 4 * (size_t)q->W, err);
    for (int64_t w = 0; w < q->W && rc == MKV_OK; w++) {
        mkv_packed_counts ct;
        rc = mkv_cuda_packed_selection(plan, (int)w, 0, blocks, a->attended + w * q->T, &ct, err);
        if (rc == MKV_OK)
            a->bytes_read[w] = mkv_gpu_mosaic_bytes(&h, q->pos[w], blocks, ct.dense_tokens);
    }
    mkv_free(blocks);
    dev_free(&ds);
    mkv_cuda_packed_plan_free(plan);
    mkv_cuda_packed_free(cache);
    mkv_gpu_layout_free(&g);
    mkv_free(heads);
    mkv_mosaic_head_free(&h);
    return rc;
}

int mkv_gpu_method_attend(const mkv_method *m, const mkv_params *p, mkv_cdump *c, int layer, int head,
                          const mkv_gpu_queries *q, mkv_gpu_answers *a, mkv_error *err)
{
    if (!strcmp(m->name, "mosaic") || !strcmp(m->name, "uniform2d"))
        return attend_mosaic(p, c, layer, head, q, a, err);
    if (!strcmp(m->name, "quest"))
        return attend_quest(p, c, layer, head, q, a, err);
    if (!strcmp(m->name, "full"))
        return attend_full(c, layer, head, q, a, err);
    return mkv_fail(err, MKV_EUNSUP, "method '%s' has no GPU path", m->name);
}
