/* The GPU path of method "quest" (lib/methods/quest.c): page metadata once
 * per head, then per query the Quest-style selection and attention
 * kernels; attended tokens and bytes_read as quest's CPU attend reports
 * them. */
#include "config.h"
#include "gpu/gpu_method_priv.h"

#include <stdio.h>
#include <string.h>

extern const mkv_method mkv_method_quest;

static int quest_gpu_supports(const mkv_params *p, const mkv_dump_meta *meta, char *why, size_t len)
{
    (void)meta;
    const int64_t page = mkv_params_int(p, "page");
    if (page < 16 || page % 16 || page > 4096) {
        snprintf(why, len, "page=%lld (the GPU kernel takes multiples of 16 up to 4096)", (long long)page);
        return 0;
    }
    return 1;
}

static int quest_gpu_attend(const mkv_params *pr, mkv_cdump *c, int layer, int head, const mkv_eval_queries *q,
                            mkv_eval_answers *a, mkv_error *err)
{
    const int d = q->d, G = q->G;
    const size_t gd = (size_t)G * (size_t)d;
    mkv_quest_params qp = {(int)mkv_params_int(pr, "page"), (int)mkv_params_int(pr, "sink"),
                           (int)mkv_params_int(pr, "recent"), mkv_params_double(pr, "budget"),
                           strcmp(mkv_params_str(pr, "agg"), "sum") == 0};
    mkv_gpu_devset ds = {0};
    mkv_gpu_dense_bufs b = {0};
    int rc = mkv_gpu_dense_setup(c, layer, head, q, &ds, &b, err);
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
            meta = mkv_gpu_devset_alloc(&ds, mkv_cuda_quest_meta_elems(p) * 2, err);
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
    mkv_gpu_devset_free(&ds);
    return rc;
}

const mkv_gpu_method mkv_gpu_quest = {&mkv_method_quest, quest_gpu_supports, quest_gpu_attend};
