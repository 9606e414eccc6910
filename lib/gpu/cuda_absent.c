/* The CUDA entry points in a build without nvcc: GPU features report
 * themselves absent, so the tools fall back to the CPU or say why not. */
#include "mkv_cuda.h"

int mkv_cuda_built(void) { return 0; }

const char *mkv_cuda_build_info(void) { return "no CUDA"; }

int mkv_cuda_devices(mkv_gpu_info *info, int max, int *count, mkv_error *err)
{
    (void)info; (void)max; (void)err;
    *count = 0;
    return MKV_OK;
}

int mkv_cuda_f16_to_f32(const uint16_t *src, float *dst, size_t n, int is_bf16, mkv_error *err)
{
    (void)src; (void)dst; (void)n; (void)is_bf16;
    return mkv_fail(err, MKV_EUNSUP, "GPU conversion: built without CUDA");
}

int mkv_cuda_f32_to_f16(const float *src, uint16_t *dst, size_t n, int is_bf16, mkv_error *err)
{
    (void)src; (void)dst; (void)n; (void)is_bf16;
    return mkv_fail(err, MKV_EUNSUP, "GPU conversion: built without CUDA");
}

/* ---- device memory ---- */

int mkv_cuda_malloc(void **ptr, size_t bytes, mkv_error *err)
{
    (void)bytes;
    if (ptr)
        *ptr = NULL;
    return mkv_fail(err, MKV_EUNSUP, "GPU memory: built without CUDA");
}

void mkv_cuda_free(void *ptr) { (void)ptr; }

int mkv_cuda_upload(void *dst_device, const void *src_host, size_t bytes, mkv_error *err)
{
    (void)dst_device; (void)src_host; (void)bytes;
    return mkv_fail(err, MKV_EUNSUP, "GPU memory: built without CUDA");
}

int mkv_cuda_download(void *dst_host, const void *src_device, size_t bytes, mkv_error *err)
{
    (void)dst_host; (void)src_device; (void)bytes;
    return mkv_fail(err, MKV_EUNSUP, "GPU memory: built without CUDA");
}

int mkv_cuda_memset(void *dst_device, int byte, size_t bytes, mkv_error *err)
{
    (void)dst_device; (void)byte; (void)bytes;
    return mkv_fail(err, MKV_EUNSUP, "GPU memory: built without CUDA");
}

int mkv_cuda_synchronize(mkv_error *err)
{
    return mkv_fail(err, MKV_EUNSUP, "GPU synchronisation: built without CUDA");
}

/* ---- decode attention ---- */

int mkv_cuda_dense_plan(const mkv_attn_shape *s, const int64_t *lengths, mkv_dense_plan **plan, mkv_error *err)
{
    (void)s; (void)lengths;
    if (plan)
        *plan = NULL;
    return mkv_fail(err, MKV_EUNSUP, "GPU dense attention: built without CUDA");
}

int mkv_cuda_dense_run(const mkv_dense_plan *p, const float *q, const uint16_t *k, const uint16_t *v,
                       float *out, void *stream, mkv_error *err)
{
    (void)p; (void)q; (void)k; (void)v; (void)out; (void)stream;
    return mkv_fail(err, MKV_EUNSUP, "GPU dense attention: built without CUDA");
}

int mkv_cuda_dense_plan_splits(const mkv_dense_plan *p) { (void)p; return 0; }

void mkv_cuda_dense_plan_free(mkv_dense_plan *p) { (void)p; }

int mkv_cuda_dense_attend_host(const mkv_attn_shape *s, const int64_t *lengths, const float *q,
                               const uint16_t *k, const uint16_t *v, float *out, mkv_error *err)
{
    (void)s; (void)lengths; (void)q; (void)k; (void)v; (void)out;
    return mkv_fail(err, MKV_EUNSUP, "GPU dense attention: built without CUDA");
}

int mkv_cuda_quest_plan(const mkv_attn_shape *s, const int64_t *lengths, const int64_t *cache_tokens,
                        const mkv_quest_params *qp, mkv_quest_plan **plan, mkv_error *err)
{
    (void)s; (void)lengths; (void)cache_tokens; (void)qp;
    if (plan)
        *plan = NULL;
    return mkv_fail(err, MKV_EUNSUP, "GPU Quest attention: built without CUDA");
}

void mkv_cuda_quest_plan_free(mkv_quest_plan *p) { (void)p; }

int mkv_cuda_quest_plan_advance(mkv_quest_plan *p, const int64_t *lengths, const int64_t *cache_tokens, void *stream,
                                int *replan, mkv_error *err)
{
    (void)p; (void)lengths; (void)cache_tokens; (void)stream;
    if (replan)
        *replan = 0;
    return mkv_fail(err, MKV_EUNSUP, "GPU Quest attention: built without CUDA");
}

int64_t mkv_cuda_quest_pages_max(const mkv_quest_plan *p) { (void)p; return 0; }

size_t mkv_cuda_quest_meta_elems(const mkv_quest_plan *p) { (void)p; return 0; }

int mkv_cuda_quest_counts(const mkv_quest_plan *p, int request, mkv_quest_counts *c, mkv_error *err)
{
    (void)p; (void)request; (void)c;
    return mkv_fail(err, MKV_EUNSUP, "GPU Quest attention: built without CUDA");
}

int mkv_cuda_quest_build_meta(const mkv_quest_plan *p, const uint16_t *k, uint16_t *meta, void *stream,
                              mkv_error *err)
{
    (void)p; (void)k; (void)meta; (void)stream;
    return mkv_fail(err, MKV_EUNSUP, "GPU Quest attention: built without CUDA");
}

int mkv_cuda_quest_select(const mkv_quest_plan *p, const float *q, const uint16_t *meta, void *stream,
                          mkv_error *err)
{
    (void)p; (void)q; (void)meta; (void)stream;
    return mkv_fail(err, MKV_EUNSUP, "GPU Quest attention: built without CUDA");
}

int mkv_cuda_quest_attend(const mkv_quest_plan *p, const float *q, const uint16_t *k, const uint16_t *v,
                          float *out, void *stream, mkv_error *err)
{
    (void)p; (void)q; (void)k; (void)v; (void)out; (void)stream;
    return mkv_fail(err, MKV_EUNSUP, "GPU Quest attention: built without CUDA");
}

int mkv_cuda_quest_selection(const mkv_quest_plan *p, int32_t *pages, int32_t *counts, int64_t *tokens,
                             mkv_error *err)
{
    (void)p; (void)pages; (void)counts; (void)tokens;
    return mkv_fail(err, MKV_EUNSUP, "GPU Quest attention: built without CUDA");
}

int mkv_cuda_quest_add_tokens(const mkv_quest_plan *p, unsigned long long *acc, void *stream, mkv_error *err)
{
    (void)p; (void)acc; (void)stream;
    return mkv_fail(err, MKV_EUNSUP, "GPU Quest attention: built without CUDA");
}

/* ---- packed MosaicKV attention, GPU encode, rotations ---- */

int mkv_cuda_mosaic_upload(const mkv_packed_layout *l, mkv_packed_cache **out, mkv_error *err)
{
    (void)l;
    if (out)
        *out = NULL;
    return mkv_fail(err, MKV_EUNSUP, "GPU packed attention: built without CUDA");
}

void mkv_cuda_mosaic_free(mkv_packed_cache *c) { (void)c; }

int mkv_cuda_mosaic_pools(mkv_packed_cache *c, mkv_packed_pools *pools, mkv_error *err)
{
    (void)c; (void)pools;
    return mkv_fail(err, MKV_EUNSUP, "GPU packed attention: built without CUDA");
}

uint64_t mkv_cuda_mosaic_bytes(const mkv_packed_cache *c) { (void)c; return 0; }

int mkv_cuda_mosaic_blockkeys8(mkv_packed_cache *c, mkv_error *err)
{
    (void)c;
    return mkv_fail(err, MKV_EUNSUP, "GPU packed attention: built without CUDA");
}

int mkv_cuda_mosaic_drop_blockkeys16(mkv_packed_cache *c, mkv_error *err)
{
    (void)c;
    return mkv_fail(err, MKV_EUNSUP, "GPU packed attention: built without CUDA");
}

int mkv_cuda_mosaic_blockkeys8_rows(const mkv_packed_cache *c, int64_t seg, int64_t first, int64_t n, int8_t *codes,
                                    float *scales, mkv_error *err)
{
    (void)c; (void)seg; (void)first; (void)n; (void)codes; (void)scales;
    return mkv_fail(err, MKV_EUNSUP, "GPU packed attention: built without CUDA");
}

int mkv_cuda_mosaic_plan(const mkv_packed_cache *c, const mkv_packed_params *pp, const int32_t *heads,
                         const int64_t *pos, mkv_packed_plan **out, mkv_error *err)
{
    (void)c; (void)pp; (void)heads; (void)pos;
    if (out)
        *out = NULL;
    return mkv_fail(err, MKV_EUNSUP, "GPU packed attention: built without CUDA");
}

void mkv_cuda_mosaic_plan_free(mkv_packed_plan *p) { (void)p; }

int mkv_cuda_mosaic_select(const mkv_packed_plan *p, const float *q, void *stream, mkv_error *err)
{
    (void)p; (void)q; (void)stream;
    return mkv_fail(err, MKV_EUNSUP, "GPU packed attention: built without CUDA");
}

int mkv_cuda_mosaic_attend(const mkv_packed_plan *p, const float *q, float *out, void *stream, mkv_error *err)
{
    (void)p; (void)q; (void)out; (void)stream;
    return mkv_fail(err, MKV_EUNSUP, "GPU packed attention: built without CUDA");
}

int mkv_cuda_mosaic_run(const mkv_packed_plan *p, const float *q, float *out, void *stream, mkv_error *err)
{
    (void)p; (void)q; (void)out; (void)stream;
    return mkv_fail(err, MKV_EUNSUP, "GPU packed attention: built without CUDA");
}

int mkv_cuda_mosaic_selection(const mkv_packed_plan *p, int request, int kv_head, uint8_t *blocks,
                              uint8_t *attended, mkv_packed_counts *counts, mkv_error *err)
{
    (void)p; (void)request; (void)kv_head; (void)blocks; (void)attended; (void)counts;
    return mkv_fail(err, MKV_EUNSUP, "GPU packed attention: built without CUDA");
}

int mkv_cuda_mosaic_encode(const mkv_cuda_strategy *s, int d, int64_t n, int block, const float *X,
                           const uint16_t *R, uint16_t *values, uint8_t *bitmap, uint16_t *blockkeys,
                           void *stream, mkv_error *err)
{
    (void)s; (void)d; (void)n; (void)block; (void)X; (void)R; (void)values; (void)bitmap; (void)blockkeys;
    (void)stream;
    return mkv_fail(err, MKV_EUNSUP, "GPU encode: built without CUDA");
}

int mkv_cuda_mosaic_append(mkv_packed_cache *c, int head, const float *k, const float *v, int64_t n,
                           void *stream, mkv_error *err)
{
    (void)c; (void)head; (void)k; (void)v; (void)n; (void)stream;
    return mkv_fail(err, MKV_EUNSUP, "GPU encode: built without CUDA");
}

int mkv_cuda_mosaic_plan_advance(mkv_packed_plan *p, const int64_t *pos, void *stream, int *replan, mkv_error *err)
{
    (void)p; (void)pos; (void)stream; (void)replan;
    return mkv_fail(err, MKV_EUNSUP, "GPU packed attention: built without CUDA");
}

int mkv_cuda_mosaic_grow(mkv_packed_cache *c, int first, int n, const float *k, const float *v, void *stream,
                         mkv_error *err)
{
    (void)c; (void)first; (void)n; (void)k; (void)v; (void)stream;
    return mkv_fail(err, MKV_EUNSUP, "GPU encode: built without CUDA");
}

int mkv_cuda_mosaic_grow_check(mkv_packed_cache *c, mkv_error *err)
{
    (void)c; (void)err;
    return MKV_OK;
}

int mkv_cuda_eigh_batched(const double *gram, int d, int batch, double *R, double *evals, mkv_error *err)
{
    (void)gram; (void)d; (void)batch; (void)R; (void)evals;
    return mkv_fail(err, MKV_EUNSUP, "GPU rotations: built without CUDA");
}

/* ---- the forward pass ---- */

int mkv_cuda_llama_create(const mkv_cuda_llama_desc *d, mkv_cuda_llama **out, mkv_error *err)
{
    (void)d;
    *out = NULL;
    return mkv_fail(err, MKV_EUNSUP, "GPU forward pass: built without CUDA");
}

void mkv_cuda_llama_free(mkv_cuda_llama *g) { (void)g; }

int mkv_cuda_llama_run(mkv_cuda_llama *g, const int32_t *tokens, size_t n, float *logits, mkv_error *err)
{
    (void)g; (void)tokens; (void)n; (void)logits;
    return mkv_fail(err, MKV_EUNSUP, "GPU forward pass: built without CUDA");
}

int mkv_cuda_llama_run_request(mkv_cuda_llama *g, int request, const int32_t *tokens, size_t n, float *logits,
                               mkv_error *err)
{
    (void)g; (void)request; (void)tokens; (void)n; (void)logits;
    return mkv_fail(err, MKV_EUNSUP, "GPU forward pass: built without CUDA");
}

int mkv_cuda_llama_step(mkv_cuda_llama *g, const int32_t *tokens, float *logits, mkv_error *err)
{
    (void)g; (void)tokens; (void)logits;
    return mkv_fail(err, MKV_EUNSUP, "GPU forward pass: built without CUDA");
}

int mkv_cuda_llama_request_pos(const mkv_cuda_llama *g, int request) { (void)g; (void)request; return -1; }

int mkv_cuda_llama_fill(mkv_cuda_llama *g, int n, uint64_t seed, mkv_error *err)
{
    (void)g; (void)n; (void)seed;
    return mkv_fail(err, MKV_EUNSUP, "GPU forward pass: built without CUDA");
}

int mkv_cuda_llama_pos(const mkv_cuda_llama *g) { (void)g; return 0; }

uint64_t mkv_cuda_llama_weight_bytes(const mkv_cuda_llama *g) { (void)g; return 0; }

uint64_t mkv_cuda_llama_cache_bytes(const mkv_cuda_llama *g) { (void)g; return 0; }

int mkv_cuda_llama_use_quest(mkv_cuda_llama *g, const mkv_quest_params *qp, mkv_error *err)
{
    (void)g; (void)qp;
    return mkv_fail(err, MKV_EUNSUP, "GPU forward pass: built without CUDA");
}

int mkv_cuda_llama_fill_mosaic(mkv_cuda_llama *g, int n, const mkv_packed_synth *s, const mkv_packed_params *pp,
                               mkv_error *err)
{
    (void)g; (void)n; (void)s; (void)pp;
    return mkv_fail(err, MKV_EUNSUP, "GPU forward pass: built without CUDA");
}

int mkv_cuda_mosaic_synth_segment(const mkv_packed_synth *s, mkv_packed_seg *g, mkv_error *err)
{
    (void)s; (void)g;
    return mkv_fail(err, MKV_EUNSUP, "GPU packed attention: built without CUDA");
}

int mkv_cuda_mosaic_synth(const mkv_packed_synth *s, mkv_packed_cache **out, mkv_error *err)
{
    (void)s;
    *out = NULL;
    return mkv_fail(err, MKV_EUNSUP, "GPU packed attention: built without CUDA");
}

int mkv_cuda_llama_use_mosaic(mkv_cuda_llama *g, const mkv_packed_layout *l, const mkv_packed_params *pp,
                              mkv_error *err)
{
    (void)g; (void)l; (void)pp;
    return mkv_fail(err, MKV_EUNSUP, "GPU forward pass: built without CUDA");
}

uint64_t mkv_cuda_llama_step_bytes_read(const mkv_cuda_llama *g) { (void)g; return 0; }
