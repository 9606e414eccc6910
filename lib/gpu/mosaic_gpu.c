/* The GPU paths of methods "mosaic" (lib/mosaic/method.c) and
 * "uniform2d" (lib/mosaic/uniform2d.c), which store the same arrays: the
 * loaded head converted to the GPU layout (gpu_method.h), all queries of
 * the head in one plan of the packed attention kernel; attended tokens and
 * bytes_read as mkv_mosaic_attend reports them.  MKV_GPU_BLOCKKEY_BITS=8
 * scores with the 8-bit block keys (mkv_cuda_mosaic_blockkeys8) instead,
 * to measure what they cost in fidelity; bytes_read then counts the rows
 * of codes and their scales that the kernel reads in place of the fp16
 * rows. */
#include "config.h"
#include "gpu/gpu_method_priv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int blockkey_bits(int *bits, mkv_error *err)
{
    const char *e = getenv("MKV_GPU_BLOCKKEY_BITS");
    *bits = 16;
    if (e == NULL || *e == '\0' || strcmp(e, "16") == 0)
        return MKV_OK;
    if (strcmp(e, "8") == 0) {
        *bits = 8;
        return MKV_OK;
    }
    return mkv_fail(err, MKV_EUSAGE, "MKV_GPU_BLOCKKEY_BITS='%s': expected 16 or 8", e);
}

/* Bytes the 8-bit block keys read for a query at pos beyond what the fp16
 * rows' count says (negative: fewer): per scored block, a row of codes
 * padded to 16 bytes and a float32 scale against keydim + bound fp16. */
static int64_t blockkeys8_delta(const mkv_gpu_layout *g, int64_t pos)
{
    const mkv_packed_head *hd = &g->heads[0];
    int64_t delta = 0;
    for (int32_t i = 0; i < hd->n_seg; i++) {
        const mkv_packed_seg *s = &g->segs[hd->first_seg + i];
        if (s->always || pos < s->start || s->len <= 0)
            continue;
        int64_t vb = (pos - s->start) / g->l.block + 1;
        vb = vb < s->n_blocks ? vb : s->n_blocks;
        delta += vb * ((int64_t)(s->bk_width + 15) / 16 * 16 + 4 - 2 * (int64_t)(s->kdim + s->kbound));
    }
    return delta;
}

int mkv_gpu_mosaic_kernel_takes(const mkv_params *p, char *why, size_t len)
{
    const int64_t B = mkv_params_int(p, "block");
    if (B != 1 && B != 2 && B != 4 && B != 8 && B != 16) {
        snprintf(why, len, "block=%lld (the GPU kernel takes 1, 2, 4, 8 or 16 tokens)", (long long)B);
        return 0;
    }
    if (mkv_params_double(p, "refine") != 1) {
        snprintf(why, len, "refine=%s (the GPU kernel selects whole blocks: refine=1)", mkv_params_str(p, "refine"));
        return 0;
    }
    return 1;
}

static int mosaic_gpu_supports(const mkv_params *p, const mkv_dump_meta *meta, char *why, size_t len)
{
    (void)meta;
    return mkv_gpu_mosaic_kernel_takes(p, why, len);
}

static int mosaic_gpu_attend(const mkv_params *pr, mkv_cdump *c, int layer, int head, const mkv_eval_queries *q,
                             mkv_eval_answers *a, mkv_error *err)
{
    const int d = q->d, G = q->G;
    const size_t gd = (size_t)G * (size_t)d;
    int bits;
    int rc = blockkey_bits(&bits, err);
    if (rc != MKV_OK)
        return rc;
    mkv_mosaic_head h;
    rc = mkv_mosaic_load(c, layer, head, (int)mkv_params_int(pr, "block"), mkv_params_int(pr, "sink"),
                         mkv_params_int(pr, "recent"), &h, err);
    if (rc != MKV_OK)
        return rc;
    const mkv_mosaic_head *hp = &h;
    mkv_gpu_layout g;
    mkv_packed_cache *cache = NULL;
    mkv_packed_plan *plan = NULL;
    mkv_gpu_devset ds = {0};
    int32_t *heads = mkv_calloc((size_t)q->W, sizeof *heads, "head table", err);
    uint8_t *blocks = NULL;
    rc = heads ? mkv_gpu_layout_build(&hp, 1, 0, 0, &g, err) : (err ? (int)err->code : MKV_ENOMEM);
    if (rc != MKV_OK) {
        mkv_free(heads);
        mkv_mosaic_head_free(&h);
        return rc;
    }
    float *dq = NULL, *dout = NULL;
    if ((rc = mkv_cuda_mosaic_upload(&g.l, &cache, err)) == MKV_OK &&
        (bits != 8 || (rc = mkv_cuda_mosaic_blockkeys8(cache, err)) == MKV_OK)) {
        mkv_packed_params pp = {(int)q->W, 1, G, 0,
                                mkv_mosaic_scaled_budget(h.budget_scale, mkv_params_double(pr, "budget")),
                                strcmp(mkv_params_str(pr, "agg"), "sum") == 0, bits};
        rc = mkv_cuda_mosaic_plan(cache, &pp, heads, q->pos, &plan, err);
    }
    if (rc == MKV_OK) {
        dq = mkv_gpu_devset_alloc(&ds, gd * 4 * (size_t)q->W, err);
        dout = dq ? mkv_gpu_devset_alloc(&ds, gd * 4 * (size_t)q->W, err) : NULL;
        blocks = dout ? mkv_alloc((size_t)(g.heads[0].n_blocks ? g.heads[0].n_blocks : 1), 1, "block flags", err) : NULL;
        rc = blocks ? MKV_OK : (err ? err->code : MKV_ENOMEM);
    }
    if (rc == MKV_OK && (rc = mkv_cuda_upload(dq, q->q, gd * 4 * (size_t)q->W, err)) == MKV_OK &&
        (rc = mkv_cuda_mosaic_run(plan, dq, dout, NULL, err)) == MKV_OK && (rc = mkv_cuda_synchronize(err)) == MKV_OK)
        rc = mkv_cuda_download(a->out, dout, gd * 4 * (size_t)q->W, err);
    for (int64_t w = 0; w < q->W && rc == MKV_OK; w++) {
        mkv_packed_counts ct;
        rc = mkv_cuda_mosaic_selection(plan, (int)w, 0, blocks, a->attended + w * q->T, &ct, err);
        if (rc == MKV_OK)
            a->bytes_read[w] = mkv_gpu_mosaic_bytes(&h, q->pos[w], blocks, ct.dense_tokens) +
                               (bits == 8 ? (uint64_t)blockkeys8_delta(&g, q->pos[w]) : 0);
    }
    mkv_free(blocks);
    mkv_gpu_devset_free(&ds);
    mkv_cuda_mosaic_plan_free(plan);
    mkv_cuda_mosaic_free(cache);
    mkv_gpu_layout_free(&g);
    mkv_free(heads);
    mkv_mosaic_head_free(&h);
    return rc;
}

const mkv_gpu_method mkv_gpu_mosaic = {&mkv_method_mosaic, mosaic_gpu_supports, mosaic_gpu_attend};
const mkv_gpu_method mkv_gpu_uniform2d = {&mkv_method_uniform2d, mosaic_gpu_supports, mosaic_gpu_attend};
