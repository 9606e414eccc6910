/* The GPU path of method "full" (lib/methods/full.c): every token 0..pos
 * with the dense decode attention kernel, one query at a time, bytes_read
 * counted as full's CPU attend counts them. */
#include "config.h"
#include "gpu/gpu_method_priv.h"

#include <string.h>

extern const mkv_method mkv_method_full;

static int full_gpu_attend(const mkv_params *pr, mkv_cdump *c, int layer, int head, const mkv_eval_queries *q,
                           mkv_eval_answers *a, mkv_error *err)
{
    (void)pr;
    const int d = q->d, G = q->G;
    const size_t gd = (size_t)G * (size_t)d;
    mkv_gpu_devset ds = {0};
    mkv_gpu_dense_bufs b = {0};
    int rc = mkv_gpu_dense_setup(c, layer, head, q, &ds, &b, err);
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
    mkv_gpu_devset_free(&ds);
    return rc;
}

const mkv_gpu_method mkv_gpu_full = {&mkv_method_full, NULL, full_gpu_attend};
