/* The only door between the C library/tools and the CUDA kernels.
 *
 * Every function here exists in every build: with CUDA it is implemented in
 * the kernels/ .cu files; without, lib/cuda_absent.c returns MKV_EUNSUP ("built
 * without CUDA"). Functions never exit; CUDA errors become MKV_EGPU with the
 * CUDA error string and the call that failed. */
#ifndef MKV_CUDA_H
#define MKV_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "mkv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 if this build has the CUDA kernels. */
int mkv_cuda_built(void);
/* nvcc version and target flags of this build, or "no CUDA". */
const char *mkv_cuda_build_info(void);

typedef struct {
    int index;
    char name[256];
    int cc_major, cc_minor;
    size_t total_mem, free_mem;
    int multiprocessors;
    int usable;            /* this build has machine code or PTX for it */
} mkv_gpu_info;

/* Number of GPUs the runtime sees (0 when none or no driver; that is not an
 * error). Fills up to max entries of info. */
int mkv_cuda_devices(mkv_gpu_info *info, int max, int *count, mkv_error *err);

/* 16-bit <-> float32 conversion on the GPU (host buffers in and out; the
 * device copies are internal). is_bf16 selects bfloat16 instead of fp16.
 * Rounding: nearest-even, NaN/Inf preserved, same as lib/half.c. */
int mkv_cuda_f16_to_f32(const uint16_t *src, float *dst, size_t n, int is_bf16, mkv_error *err);
int mkv_cuda_f32_to_f16(const float *src, uint16_t *dst, size_t n, int is_bf16, mkv_error *err);


/* ---------------------------------------------------------- device memory
 * For C callers (tools, tests) that keep buffers on the GPU: plain
 * cudaMalloc'd memory on the current device, no managed memory. */
int mkv_cuda_malloc(void **ptr, size_t bytes, mkv_error *err);
void mkv_cuda_free(void *ptr);                       /* NULL is fine */
int mkv_cuda_upload(void *dst_device, const void *src_host, size_t bytes, mkv_error *err);
int mkv_cuda_download(void *dst_host, const void *src_device, size_t bytes, mkv_error *err);
int mkv_cuda_memset(void *dst_device, int byte, size_t bytes, mkv_error *err);
/* Wait for all work on the device; reports faults of earlier kernels. */
int mkv_cuda_synchronize(mkv_error *err);

/* ------------------------------------------------- decode attention (GPU)
 * One query token per request over a batch of requests of different
 * lengths, grouped-query attention, 16-bit K/V (fp16 or bf16) with fp32
 * accumulation, head_dim 64 or 128, 1..8 query heads per KV head (other
 * shapes: MKV_EUNSUP with the reason).
 *
 * Device layouts (all buffers 16-byte aligned):
 *   q    float  [batch][n_heads][head_dim]
 *   k, v 16-bit [batch][n_kv_heads][t_max][head_dim]; request b uses rows
 *        0 .. lengths[b]-1 (rows past it are never read)
 *   out  float  [batch][n_heads][head_dim]
 * Query head h reads KV head h / (n_heads / n_kv_heads).  A request of
 * length 0 gets zeros (like mkv_osm_finish).
 *
 * A plan is made on the host from the lengths (host array): it splits the
 * work over the device's multiprocessors (flash-decoding) and holds the
 * device tables and scratch.  Running a plan only launches kernels on the
 * given stream (a cudaStream_t, NULL for the default stream); it does not
 * synchronise.  One plan must not run on two streams at once.
 * MKV_ATTN_BLOCKS=N in the environment caps the blocks a plan spreads a
 * call over (longer chunks; the tests use it). */
typedef struct {
    int batch;
    int n_heads, n_kv_heads;
    int head_dim;
    int64_t t_max;          /* token rows per request and KV head in k, v */
    int is_bf16;            /* K/V (and page metadata) are bfloat16, else fp16 */
    double scale;           /* score scale; 0 = 1/sqrt(head_dim) */
} mkv_attn_shape;

typedef struct mkv_dense_plan mkv_dense_plan;

int mkv_cuda_dense_plan(const mkv_attn_shape *s, const int64_t *lengths, mkv_dense_plan **plan,
                        mkv_error *err);
int mkv_cuda_dense_run(const mkv_dense_plan *p, const float *q, const uint16_t *k, const uint16_t *v,
                       float *out, void *stream, mkv_error *err);
/* Work items (blocks of the split kernel) of a plan, for reports. */
int mkv_cuda_dense_plan_splits(const mkv_dense_plan *p);
void mkv_cuda_dense_plan_free(mkv_dense_plan *p);
/* Host buffers in and out (copies, plan, run, synchronise).  out is copied
 * to the device first, so that a poisoned buffer reveals unwritten
 * elements. */
int mkv_cuda_dense_attend_host(const mkv_attn_shape *s, const int64_t *lengths, const float *q,
                               const uint16_t *k, const uint16_t *v, float *out, mkv_error *err);

/* Quest-style decode attention with the token selection of the CPU Quest
 * method (lib/method_quest.c, rule in lib/baseline_util.h).  Request b
 * attends tokens 0 .. n-1, n = lengths[b] (a query at position n - 1), of
 * a cache of T = cache_tokens[b] tokens (n <= T <= t_max; cache_tokens
 * NULL: T = n, the decode case).  With P = page_size:
 *   metadata   per page of P tokens (aligned at token 0) the elementwise
 *              min and max of its keys over the cache's tokens (< T);
 *   scores     for the pages whose first token is < n,
 *                  sum_i max(q_i min_i, q_i max_i)   (raw q, no scale),
 *              aggregated over the query heads of the KV head by max (or
 *              sum, agg_sum);
 *   fixed      tokens t < sink and t >= T - recent (those < n) are always
 *              attended;
 *   budget     K = mkv_budget_tokens(budget, n) tokens, the fixed ones
 *              included; pages in order of descending score (ties: lower
 *              page) are added whole (their tokens < n) until the count
 *              reaches K.
 * Selection runs on the GPU (weighted radix select, no host sort).
 * Metadata layout (16-bit, the K type; min and max of 16-bit values are
 * exact):
 *   meta [batch][n_kv_heads][pages_max][2][head_dim], [0] = min, [1] = max,
 *   pages_max = mkv_cuda_quest_pages_max(plan). */
typedef struct {
    int page_size;          /* tokens per page, a multiple of 16 (Quest: 16) */
    int sink;               /* first tokens always attended (4) */
    int recent;             /* last tokens of the cache always attended (64) */
    double budget;          /* <= 1: fraction of the n tokens; > 1: tokens */
    int agg_sum;            /* 0: max over the group's heads (Quest), 1: sum */
} mkv_quest_params;

typedef struct {
    int64_t pages;          /* pages scored (first token < n) */
    int64_t always_tokens;  /* sink and recent tokens attended */
    int64_t budget_tokens;  /* mkv_budget_tokens(budget, n) */
    int64_t max_pages;      /* most pages one KV head can attend (sizes the work split) */
} mkv_quest_counts;

typedef struct mkv_quest_plan mkv_quest_plan;

int mkv_cuda_quest_plan(const mkv_attn_shape *s, const int64_t *lengths, const int64_t *cache_tokens,
                        const mkv_quest_params *qp, mkv_quest_plan **plan, mkv_error *err);
void mkv_cuda_quest_plan_free(mkv_quest_plan *p);
int64_t mkv_cuda_quest_pages_max(const mkv_quest_plan *p);
/* 16-bit elements of the metadata buffer. */
size_t mkv_cuda_quest_meta_elems(const mkv_quest_plan *p);
int mkv_cuda_quest_counts(const mkv_quest_plan *p, int request, mkv_quest_counts *c, mkv_error *err);
/* Page metadata from k (done once per cache, not per step). */
int mkv_cuda_quest_build_meta(const mkv_quest_plan *p, const uint16_t *k, uint16_t *meta, void *stream,
                              mkv_error *err);
/* Scoring and selection; the page lists stay in the plan. */
int mkv_cuda_quest_select(const mkv_quest_plan *p, const float *q, const uint16_t *meta, void *stream,
                          mkv_error *err);
/* Attention over the pages of the last selection. */
int mkv_cuda_quest_attend(const mkv_quest_plan *p, const float *q, const uint16_t *k, const uint16_t *v,
                          float *out, void *stream, mkv_error *err);
/* The last selection, into host buffers (each may be NULL); synchronises.
 * pages [batch][n_kv_heads][pages_max]: per KV head, counts[b][h] entries
 * in ascending page order, p for a page attended whole and -1 - p for a
 * page attended only for its sink and recent tokens; tokens
 * [batch][n_kv_heads]: tokens attended. */
int mkv_cuda_quest_selection(const mkv_quest_plan *p, int32_t *pages, int32_t *counts, int64_t *tokens,
                             mkv_error *err);

/* ------------------------------------------------ attention benchmark (GPU)
 * Synthetic random caches of one attention shape (default LLaMA-3.1-8B: 32
 * query heads, 8 KV heads, head_dim 128, bf16) for every context x batch;
 * per configuration and method (dense, Quest at each budget) the median
 * kernel time of `runs` steps after `warmup` (CUDA events; the steps are
 * queued behind a spin kernel so host launch gaps stay out), inputs
 * rotated over enough buffer sets that L2 cannot serve them, bytes read,
 * achieved bandwidth against a device-to-device copy measured in the same
 * run, and device memory in use.  Configurations that do not fit in memory
 * get a row saying so.  Rows go to tsv (header first, the columns of
 * scripts/sdpa_peer.py); one line per configuration to log (may be NULL). */
#define MKV_BENCH_MAX_LIST 16
enum {
    MKV_BENCH_DENSE = 1u,           /* dense decode attention */
    MKV_BENCH_DENSE_VARIANT = 2u,   /* also the other build of the dense kernel */
    MKV_BENCH_QUEST = 4u            /* Quest-style selection + attention */
};

typedef struct {
    int64_t contexts[MKV_BENCH_MAX_LIST];
    int n_contexts;
    int batches[MKV_BENCH_MAX_LIST];
    int n_batches;
    double budgets[MKV_BENCH_MAX_LIST];    /* Quest token budgets */
    int n_budgets;
    int n_heads, n_kv_heads, head_dim, is_bf16;
    int warmup, runs;
    int page_size, sink, recent;           /* Quest */
    uint64_t seed;
    double mem_fraction;                   /* of the free device memory the bench may take */
    unsigned methods;                      /* MKV_BENCH_* bits */
} mkv_bench_opts;

static inline void mkv_bench_opts_default(mkv_bench_opts *o)
{
    static const int64_t ctx[] = {32768, 131072, 262144, 524288, 1048576};
    static const int bat[] = {1, 4, 8};
    int i;
    for (i = 0; i < 5; i++)
        o->contexts[i] = ctx[i];
    o->n_contexts = 5;
    for (i = 0; i < 3; i++)
        o->batches[i] = bat[i];
    o->n_batches = 3;
    o->budgets[0] = 0.0625;
    o->budgets[1] = 0.10;
    o->budgets[2] = 0.125;
    o->budgets[3] = 0.25;
    o->n_budgets = 4;
    o->n_heads = 32;
    o->n_kv_heads = 8;
    o->head_dim = 128;
    o->is_bf16 = 1;
    o->warmup = 5;
    o->runs = 30;
    o->page_size = 16;
    o->sink = 4;
    o->recent = 64;
    o->seed = 20250101u;
    o->mem_fraction = 0.9;
    o->methods = MKV_BENCH_DENSE | MKV_BENCH_QUEST;
}

int mkv_bench_attention(const mkv_bench_opts *o, FILE *tsv, FILE *log, mkv_error *err);

#ifdef __cplusplus
}
#endif
#endif
