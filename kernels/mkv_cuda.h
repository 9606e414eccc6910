/* The only door between the C library/tools and the CUDA kernels.
 *
 * Every function here exists in every build: with CUDA it is implemented in
 * the kernels/ .cu files; without, lib/gpu/cuda_absent.c returns MKV_EUNSUP ("built
 * without CUDA"). The benchmark (last) is not in the library: the programs
 * that benchmark link kernels/bench.cu, or kernels/bench_absent.c without
 * CUDA. Functions never exit; CUDA errors become MKV_EGPU with the
 * CUDA error string and the call that failed. */
#ifndef MKV_CUDA_H
#define MKV_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "core/mkv.h"

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
 * Rounding: nearest-even, NaN/Inf preserved, same as lib/core/half.c. */
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
 * method (lib/methods/quest.c, rule in lib/methods/baseline.h).  Request b
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
/* The plan moved to new lengths (and cache_tokens, as at mkv_cuda_quest_plan)
 * without allocating: each request's rule, windows and lengths are copied
 * to the device on the stream from pinned memory.  *replan = 1, the plan
 * unchanged, when its work split or scoring grid no longer fits them (a
 * request's page bound grew): make a new plan then. */
int mkv_cuda_quest_plan_advance(mkv_quest_plan *p, const int64_t *lengths, const int64_t *cache_tokens, void *stream,
                                int *replan, mkv_error *err);
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
/* Adds the tokens the last selection attends, over its requests and KV
 * heads, to *acc (device memory), on the stream: a decode step's count
 * without synchronising. */
int mkv_cuda_quest_add_tokens(const mkv_quest_plan *p, unsigned long long *acc, void *stream, mkv_error *err);

/* ------------------------------------------ packed MosaicKV attention (GPU)
 * The GPU twin of mkv_mosaic_attend (kernels/mosaic_attend.cu): docs/DESIGN.md
 * 5.2 over the packed format of lib/mosaic/packed.h, computing
 * what mkv_mosaic_attend computes (rules 1-4 of that file's top comment)
 * in float32 instead of double: the same budget, block scores and
 * selection (ties to the earlier block), attention over the kept elements
 * only, values accumulated in each segment's rotated space and rotated
 * back once per segment, flash-decoding split over the segments and
 * merged with the dense sink and recent tokens.
 *
 * GPU layout (mkv_gpu_layout_build of lib/mosaic/packed.h, which defines the
 * format, converts loaded heads into it, "conversion happens at load, in
 * one place"; the benchmark synthesises it).  A cache
 * holds heads.  A head holds its dense rows (its sink tokens, then its
 * recent tokens: fp16 [rows][head_dim] in the dense pools) and a range of
 * the segment table, segments in token order.  Per segment and tensor
 * (K, V): dk (dv) rotated channels kept, d' padded with zero channels to a
 * multiple of 32 (K: the rotated channels the values or the block keys
 * use, whichever are more); rk (rv) values per vector; the rotation fp16
 * [head_dim][dk] (as lib/mosaic/packed.h stores it, zero columns past those);
 * K block keys fp16 [n_blocks][bk_width], each row (lib/mosaic/packed.h's)
 * [min | max of the first kbound rotated channels | mean of channels
 * kbound .. kdim-1], zero-padded to bk_width (a multiple of 8).  A block
 * scores sum_c<kbound max(q~_c min_c, q~_c max_c) + sum q~_c mean_c, which
 * is the dot product of the row with [min(q~,0) | max(q~,0) | q~]: the
 * scoring stage computes it like attention scores.  Unrotated segments
 * have dk = head_dim and no rotation.  Packed tokens are stored in records, one per block of B
 * tokens (the segment's last block padded with zero tokens), each record
 * rec_bytes long and 16-byte aligned, its four parts 16-byte aligned:
 *   0           K values   fp16 [B][rk], ascending channel order
 *   kmask_off   K bitmaps  uint32 [B][ceil(dpk/32)]: bit c%32 of word c/32
 *                          set when channel c is kept
 *   vval_off    V values   fp16 [B][rv]
 *   vmask_off   V bitmaps  uint32 [B][dv/32]
 * Bitmaps are per channel (the stored per-group bits of g > 1 expanded,
 * the implicit first-r bitmaps written out), so a value's channel is found
 * by popcount alone.  A segment flagged `always` is a temporary region
 * (GPU-encoded tokens not yet final): it is attended whole, not scored, and
 * its tokens count towards the budget like the sink and recent ones.
 *
 * A plan binds a cache to a batch: request b, KV head h reads cache head
 * heads[b * n_kv_heads + h] (heads may be shared, e.g. many queries of one
 * dump head) with a query at position pos[b] (tokens 0..pos[b]).  q and
 * out are float [batch][n_heads][head_dim] as for dense attention.  Limits:
 * head_dim 64 or 128, 1..8 query heads per KV head, B in {1, 2, 4, 8, 16};
 * others MKV_EUNSUP with the reason.  Running a plan only queues kernels on
 * the stream (q R_k and score -> select -> attend -> merge; the later
 * ones overlap their launch with the earlier ones through programmatic
 * dependent launch unless MKV_NO_PDL is set). */
typedef struct {
    int64_t start, len;        /* tokens [start, start + len) */
    int64_t rec_off;           /* byte offset of its first record in the record pool */
    int64_t bk_off;            /* element offset of its first block key row */
    int64_t rk_off, rv_off;    /* element offsets of R_k, R_v in the rotation pool; -1: not rotated */
    int32_t first_block;       /* index of its first block among its head's blocks */
    int32_t n_blocks;          /* ceil(len / B); a temporary region: its capacity */
    int32_t dk, dv;            /* channels, multiples of 32, <= head_dim */
    int32_t rk, rv;            /* values per vector, 1..dk (dv) */
    int32_t rec_bytes;         /* bytes of one record */
    int32_t kmask_off, vval_off, vmask_off;
    int32_t always;            /* 1: temporary region */
    /* The stored strategies (lib/mosaic/packed.h), which a temporary region
     * encodes new tokens with: d' before padding, group size, per-vector
     * selection (0: the first r channels). */
    int32_t dpk, dpv, gk, gv, pvk, pvv;
    int32_t kdim, kbound;      /* block keys: channels, and the leading ones bounded (min, max) */
    int32_t bk_width;          /* fp16 values per stored block-key row (>= kdim + kbound, multiple of 8) */
    int32_t open;              /* 1: the open segment of decode-time growth (mkv_cuda_mosaic_grow):
                                * the head's last, scored like any other, room for n_blocks blocks */
} mkv_packed_seg;

typedef struct {
    int64_t T;                 /* tokens of the cache as loaded (dense and segments) */
    int64_t dense_row;         /* its first row in the dense pools */
    int32_t sink_n, recent_n;  /* dense rows: tokens [0, sink_n), then [T - recent_n, T) */
    int32_t first_seg, n_seg;  /* its rows of the segment table */
    int32_t n_blocks;          /* blocks of all its segments */
    int32_t ring;              /* growth: the recent row holding the oldest recent token is
                                * sink_n + ring (0 as loaded: rows in token order) */
} mkv_packed_head;

/* Host copy of a cache: tables and pools.  Pool pointers may be NULL (the
 * pool is then allocated and left for the caller to fill on the device,
 * see mkv_cuda_mosaic_pools). */
typedef struct {
    int head_dim;              /* 64 or 128 */
    int block;                 /* B */
    int n_heads;
    const mkv_packed_head *heads;
    int64_t n_segs;
    const mkv_packed_seg *segs;
    size_t record_bytes;
    const void *records;
    size_t n_blockkeys;        /* fp16 elements */
    const uint16_t *blockkeys;
    size_t n_rotations;        /* fp16 elements */
    const uint16_t *rotations;
    int64_t n_dense_rows;
    const uint16_t *dense_k, *dense_v;   /* fp16 [n_dense_rows][head_dim] */
} mkv_packed_layout;

typedef struct mkv_packed_cache mkv_packed_cache;
typedef struct mkv_packed_plan mkv_packed_plan;

/* Check the tables (offsets inside the pools, dims, segments in order and
 * contiguous block numbering) and copy everything to the device. */
int mkv_cuda_mosaic_upload(const mkv_packed_layout *l, mkv_packed_cache **out, mkv_error *err);
void mkv_cuda_mosaic_free(mkv_packed_cache *c);
/* Device pointers of the pools (for callers that fill them on the device). */
typedef struct {
    void *records;
    uint16_t *blockkeys, *rotations, *dense_k, *dense_v;
} mkv_packed_pools;
int mkv_cuda_mosaic_pools(mkv_packed_cache *c, mkv_packed_pools *pools, mkv_error *err);
/* Device bytes of the cache (pools and tables, the 8-bit block keys when made). */
uint64_t mkv_cuda_mosaic_bytes(const mkv_packed_cache *c);
/* The 8-bit block keys (docs/DESIGN.md 5.2), made on the device from the
 * fp16 pool as it stands (call it after filling the pools on the device):
 * per scored segment, each row of bk_width values becomes codes
 * rint(x 127 / a) (a = the row's largest |x|, computed in double) in a row
 * of bk_width rounded up to 16 bytes, zeros past bk_width, and one float32
 * scale a / 127; a row of zeros has codes and scale 0.  A block then
 * scores scale x (its score with the codes for the row), which selection
 * ranks like the fp16 score within the codes' rounding.  Plans made with
 * blockkey_bits 8 read these instead of the fp16 rows; a second call
 * remakes them. */
int mkv_cuda_mosaic_blockkeys8(mkv_packed_cache *c, mkv_error *err);
/* Free the fp16 rows once the 8-bit ones are made: the cache then scores
 * with blockkey_bits 8 only, mkv_cuda_mosaic_grow keeps the codes of its
 * open blocks by the same rule, and mkv_cuda_mosaic_append and
 * mkv_cuda_mosaic_blockkeys8 are refused (MKV_EUSAGE). */
int mkv_cuda_mosaic_drop_blockkeys16(mkv_packed_cache *c, mkv_error *err);
/* Rows first .. first + n - 1 of segment seg's 8-bit block keys, into host
 * buffers: codes [n][16-byte-aligned bk_width] (each may be NULL), scales [n]. */
int mkv_cuda_mosaic_blockkeys8_rows(const mkv_packed_cache *c, int64_t seg, int64_t first, int64_t n, int8_t *codes,
                                    float *scales, mkv_error *err);

typedef struct {
    int batch, n_kv_heads, n_heads;
    double scale;              /* score scale; 0 = 1/sqrt(head_dim) */
    double budget;             /* <= 1: fraction of pos + 1; > 1: tokens (mkv_budget_tokens) */
    int agg_sum;               /* block score over the group's heads: 0 max, 1 sum */
    int blockkey_bits;         /* block keys scored: 16 (or 0) the fp16 rows; 8 their 8-bit codes
                                * (mkv_cuda_mosaic_blockkeys8 must have made them) */
} mkv_packed_params;

int mkv_cuda_mosaic_plan(const mkv_packed_cache *c, const mkv_packed_params *pp, const int32_t *heads,
                         const int64_t *pos, mkv_packed_plan **out, mkv_error *err);
void mkv_cuda_mosaic_plan_free(mkv_packed_plan *p);
/* Rotation of q, scoring and selection: the first half of a step, alone
 * for timing the scoring stage. */
int mkv_cuda_mosaic_select(const mkv_packed_plan *p, const float *q, void *stream, mkv_error *err);
/* Attention over the dense tokens and the last selection, and the merge
 * into out. */
int mkv_cuda_mosaic_attend(const mkv_packed_plan *p, const float *q, float *out, void *stream, mkv_error *err);
/* Both: one decode step. */
int mkv_cuda_mosaic_run(const mkv_packed_plan *p, const float *q, float *out, void *stream, mkv_error *err);

/* A plan moved to new positions (one per request, as at mkv_cuda_mosaic_plan)
 * after the cache grew (mkv_cuda_mosaic_grow): the jobs are recomputed from
 * the cache's tables and copied to the device on the stream, without
 * allocating.  *replan gets 1 (and the plan is left as it was) when the new
 * positions need more room than the plan has (a segment becomes visible,
 * or more blocks than its buffers hold): make a new plan then. */
int mkv_cuda_mosaic_plan_advance(mkv_packed_plan *p, const int64_t *pos, void *stream, int *replan, mkv_error *err);

/* What the last step of (request, KV head) attended; synchronises.
 * blocks (may be NULL): [n_blocks of its cache head] 1 for each block
 * attended (selected or in a temporary region, and starting <= pos);
 * attended (may be NULL): [end of its cache head's tokens] 1 for each token
 * attended.  Counts (may be NULL): */
typedef struct {
    int64_t tokens;            /* tokens attended (dense, temporary, selected; <= pos) */
    int64_t blocks;            /* packed blocks attended */
    int64_t scored_blocks;     /* blocks scored (start <= pos, not temporary) */
    int64_t segments;          /* segments starting <= pos */
    int64_t segments_attended; /* of those, segments with an attended block */
    int64_t dense_tokens;      /* dense rows attended */
    uint64_t device_bytes;     /* bytes this request and KV head read from the cache on the device */
    uint64_t scoring_bytes;    /* of those, what q R_k and scoring read (R_k, block keys, their scales)
                                * and the keys they write for the selection */
} mkv_packed_counts;
int mkv_cuda_mosaic_selection(const mkv_packed_plan *p, int request, int kv_head, uint8_t *blocks,
                              uint8_t *attended, mkv_packed_counts *counts, mkv_error *err);

/* Synthetic packed caches (kernels/mosaic_synth.cu), for speed only: the
 * attention benchmark's and the decode's long contexts (mkv-decode --fill).
 * Every head holds `tokens` tokens: sink and recent rows dense, the rest
 * in segments of `segment` tokens with their own rotations, every vector
 * keeping r of d' channels (uniformly chosen, K and V alike), values,
 * rotations, block keys and dense rows random normal; with open_tokens > 0
 * an open segment with room for that many after the last segment
 * (mkv_cuda_mosaic_grow), sharing its rotations. */
typedef struct {
    int head_dim, block, n_heads;
    int64_t tokens, sink, recent, segment;
    int dprime, r;             /* d': 32..head_dim, a multiple of 32; r: 1..d' */
    int kdim, kbound;          /* block keys: channels (<= d'), the leading ones bounded */
    int64_t open_tokens;
    uint64_t seed;
    int blockkey_bits;         /* 8: only 8-bit block keys, their codes and scales drawn
                                * directly (random, as the fp16 rows are otherwise): the
                                * cache never holds fp16 rows, so the largest cache that
                                * fits is not halved by a conversion; 0 or 16: fp16 rows */
} mkv_packed_synth;
/* The segment geometry (record layout, block-key width) of those settings. */
int mkv_cuda_mosaic_synth_segment(const mkv_packed_synth *s, mkv_packed_seg *g, mkv_error *err);
int mkv_cuda_mosaic_synth(const mkv_packed_synth *s, mkv_packed_cache **out, mkv_error *err);

/* ------------------------------------------------- GPU encode (kernels/mosaic_encode.cu)
 * The GPU half of the dual buffer (docs/DESIGN.md 5.3): new tokens are packed
 * at once with a segment's strategy and rotation. */
typedef struct {
    int rotate, r, g, dprime, pervector;   /* as mkv_mosaic_strategy (lib/mosaic/packed.h) */
} mkv_cuda_strategy;

/* mkv_mosaic_encode (lib/mosaic/mosaic.c) for n vectors X [n][d] (device, float32)
 * with the rotation R (device, fp16 [d][d'] as stored; ignored without
 * rotation), in lib/mosaic/packed.h's format: values fp16 [n][r]; bitmap
 * [n][bitmap bytes] (NULL when the strategy stores none); block keys fp16
 * [ceil(n / block)][d'] when block > 0 and blockkeys is not NULL.  Rotated
 * vectors, group energies and block means are computed in double like the
 * CPU's, so the outputs are the CPU's bit for bit except where a double
 * sum rounded differently lands on a float16 rounding boundary or an
 * energy tie (see tests/check_gpu_packed.c).  d <= 128; d' a multiple of
 * g. */
int mkv_cuda_mosaic_encode(const mkv_cuda_strategy *s, int d, int64_t n, int block, const float *X,
                           const uint16_t *R, uint16_t *values, uint8_t *bitmap, uint16_t *blockkeys,
                           void *stream, mkv_error *err);

/* Append n new tokens of cache head `head` (device float32 K and V rows
 * [n][head_dim]) to its temporary region (its segment with `always` set,
 * which carries the strategy and rotations it encodes with): the tokens
 * become [start + len, start + len + n) of that segment.  MKV_EUSAGE when
 * the head has no temporary region or its capacity is exceeded.  Plans
 * made before an append do not see the new tokens: make a new plan. */
int mkv_cuda_mosaic_append(mkv_packed_cache *c, int head, const float *k, const float *v, int64_t n,
                           void *stream, mkv_error *err);

/* Decode-time growth (lib/mosaic/decode.c, GROWTH 1-2, with no segment
 * closing): cache heads first .. first + n - 1 each take one new token, row
 * i of k and v (device float32 [n][head_dim], keys after RoPE).  Its fp16
 * copy replaces the oldest recent row (the ring of mkv_packed_head), and that
 * row's token enters the head's open segment: packed with the segment's
 * strategy and rotations as mkv_cuda_mosaic_encode packs it, its block's key
 * row recomputed over the block's tokens so far (min and max of the first
 * kbound rotated channels, the double mean of the rest, as
 * mkv_mosaic_block_keys).  The device tables change on the stream, the host
 * copies at once (plans made or advanced afterwards see the token); nothing
 * synchronises.  MKV_EUSAGE when a head has no open segment, no recent rows
 * or no room left; a value outside float16 is reported by the next
 * mkv_cuda_mosaic_grow_check. */
int mkv_cuda_mosaic_grow(mkv_packed_cache *c, int first, int n, const float *k, const float *v, void *stream,
                         mkv_error *err);
/* MKV_EFORMAT when a token grown since the last check did not fit float16
 * (synchronises), and clears the flag. */
int mkv_cuda_mosaic_grow_check(mkv_packed_cache *c, mkv_error *err);

/* ------------------------------------- segment rotations (cuSOLVER, batched)
 * Eigenvectors and eigenvalues of `batch` symmetric d x d Gram matrices
 * (host, row-major double, [batch][d][d]) on the GPU, with mkv_eigh's
 * conventions (lib/core/eigen.h): eigenvalues descending, R [batch][d][d]
 * row-major with eigenvector j in column j, the largest-magnitude
 * component of each positive.  syevjBatched (Jacobi) for d <= 32, where
 * cuSOLVER's batched Jacobi solver is limited to, else the batched
 * cusolverDnXsyevBatched. */
int mkv_cuda_eigh_batched(const double *gram, int d, int batch, double *R, double *evals, mkv_error *err);

/* ------------------------------------ LLaMA-family forward pass (GPU)
 * kernels/llama_forward.cu: the forward pass of lib/model/forward.c on the
 * GPU, with its own dense KV cache.  The weights are uploaded once, as
 * float32 or fp16 (weights_f16); projections and logits are cuBLAS GEMMs
 * (fp32 accumulation; no TF32), the rest small kernels: embedding lookup,
 * RMSNorm, RoPE, SwiGLU, the K/V store, attention.  The cache is fp16
 * [layer][request][kv_head][max_seq_len][head_dim], keys after RoPE (a
 * batch of requests, each at its own position, decodes in one pass per
 * step: mkv_cuda_llama_step); a decode step
 * attends it with the dense decode kernel above where its shapes allow
 * (head_dim 64 or 128, 1..8 query heads per KV head), every other case
 * (prefill rows, other shapes) with a causal kernel of this file.  After
 * mkv_cuda_llama_use_quest the decode steps attend it with the Quest
 * kernels (mkv_cuda_quest_*) instead; a pass made with external_cache has
 * none and decodes over a packed MosaicKV cache (mkv_cuda_llama_use_mosaic,
 * _fill_mosaic). */
typedef struct {
    const float *rms_att;                  /* [dim] */
    const float *wq, *wk, *wv, *wo;        /* row-major [out x in], as model.h */
    const float *bq, *bk, *bv;             /* NULL unless the model has biases */
    const float *rms_ffn;                  /* [dim] */
    const float *w1, *w2, *w3;             /* gate, down, up */
} mkv_cuda_llama_layer;

typedef struct {
    int dim, hidden_dim, n_layers, n_heads, n_kv_heads, head_dim, vocab_size;
    int rope_dim;                  /* leading channels of a head RoPE rotates */
    int rope_half;                 /* 1: pairs (j, j + rope_dim/2); 0: (2j, 2j+1) */
    const double *rope_inv_freq;   /* [rope_dim/2]: pair j turns by pos * inv_freq[j] */
    float rms_eps;
    int max_seq_len;               /* positions of the cache */
    int chunk;                     /* most tokens one pass over the layers takes */
    int weights_f16;               /* 1: matrices and embedding in fp16 */
    const float *tok_embedding;    /* host float32 [vocab x dim] */
    const float *rms_final;        /* [dim] */
    const float *classifier;       /* [vocab x dim]; may equal tok_embedding */
    const mkv_cuda_llama_layer *layers;  /* [n_layers] */
    int external_cache;            /* 1: no dense cache; mkv_cuda_llama_use_mosaic hands the pass
                                    * its cache before the first token */
    int batch;                     /* requests (0: 1); above 1 needs the dense decode kernel's shapes */
} mkv_cuda_llama_desc;

typedef struct mkv_cuda_llama mkv_cuda_llama;

/* Check the shapes, allocate, upload.  The host weights may be freed
 * afterwards.  Shapes the kernels cannot run (head_dim above 256, odd
 * rope_dim) are MKV_EUNSUP; no GPU is MKV_EGPU. */
int mkv_cuda_llama_create(const mkv_cuda_llama_desc *d, mkv_cuda_llama **out, mkv_error *err);
void mkv_cuda_llama_free(mkv_cuda_llama *g);
/* Run n tokens at the next positions; logits (host, vocab_size floats):
 * the last token's, or NULL for none.  Token ids outside the vocabulary
 * or past the cache are MKV_EFORMAT, reported before any work. */
int mkv_cuda_llama_run(mkv_cuda_llama *g, const int32_t *tokens, size_t n, float *logits, mkv_error *err);
/* The same for request `request` of a batch (a prefill of its prompt, or
 * one token: a decode step of that request alone). */
int mkv_cuda_llama_run_request(mkv_cuda_llama *g, int request, const int32_t *tokens, size_t n, float *logits,
                               mkv_error *err);
/* One decode step of every request: tokens [batch] (request b's next
 * token), logits (host, may be NULL) [batch][vocab_size]. */
int mkv_cuda_llama_step(mkv_cuda_llama *g, const int32_t *tokens, float *logits, mkv_error *err);
/* Position of request `request` (-1 when there is none). */
int mkv_cuda_llama_request_pos(const mkv_cuda_llama *g, int request);
/* Fill cache positions 0..n-1 of every layer and request with
 * core/kvfill.h's rows (request r's for seed + r x 0x9e3779b97f4a7c15, so
 * request 0's are what mkv_forward_fill gives the CPU pass for seed) and
 * place every request at n: only before the first token. */
int mkv_cuda_llama_fill(mkv_cuda_llama *g, int n, uint64_t seed, mkv_error *err);
int mkv_cuda_llama_pos(const mkv_cuda_llama *g);
/* Device bytes of the weights and of the cache (with Quest's page
 * metadata once it is used). */
uint64_t mkv_cuda_llama_weight_bytes(const mkv_cuda_llama *g);
uint64_t mkv_cuda_llama_cache_bytes(const mkv_cuda_llama *g);
/* From the next decode step on, attend the cache with the Quest kernels
 * above (the selection of lib/methods/quest.c):
 * the page bounds of the positions so far are built now, each new key
 * joins them as it is stored.  Needs a filled or prefilled cache in every
 * request, head_dim 64 or 128 and the kernel's page sizes (MKV_EUNSUP
 * otherwise); runs take one token each from then on, a batch's all at once
 * (mkv_cuda_llama_step).  A step's plan is moved along
 * (mkv_cuda_quest_plan_advance), made anew only when it no longer fits. */
int mkv_cuda_llama_use_quest(mkv_cuda_llama *g, const mkv_quest_params *qp, mkv_error *err);
/* A pass made with external_cache decodes over a packed MosaicKV cache:
 * the layout's heads are (layer, request, KV head) in that order (head
 * (l * batch + b) * n_kv_heads + h), each with its open segment (mkv_gpu_layout_build with open
 * 1, lib/mosaic/packed.h), request b's all holding the same T_b tokens;
 * request b continues at position T_b.  Each decode step grows every head by its token
 * (mkv_cuda_mosaic_grow: the recent rows and the open segment, no segment
 * closing) and attends with the packed kernels under pp's budget, agg and
 * block-key bits (batch, heads and scale are the pass's; with bits 8 the
 * cache keeps the 8-bit block keys only: mkv_cuda_mosaic_blockkeys8, then
 * mkv_cuda_mosaic_drop_blockkeys16).  Runs take one
 * token each. */
int mkv_cuda_llama_use_mosaic(mkv_cuda_llama *g, const mkv_packed_layout *l, const mkv_packed_params *pp,
                              mkv_error *err);
/* The same over a synthetic cache of n tokens per head (s's head count,
 * head_dim and tokens are the pass's and n; mkv_cuda_mosaic_synth), in
 * place of a prefill: long contexts for speed runs.  A batch's caches grow
 * together: its requests decode with mkv_cuda_llama_step only. */
int mkv_cuda_llama_fill_mosaic(mkv_cuda_llama *g, int n, const mkv_packed_synth *s, const mkv_packed_params *pp,
                               mkv_error *err);
/* Bytes the last decode step read from the cache, over every layer and KV
 * head: the whole cache for the dense kernels; for Quest, the bounds of
 * the pages scored and K and V of the tokens attended (as quest's CPU
 * attend counts them); for MosaicKV what its kernels read on the device
 * (mkv_packed_counts.device_bytes; this synchronises).  0 before the
 * first step. */
uint64_t mkv_cuda_llama_step_bytes_read(const mkv_cuda_llama *g);

/* ------------------------------------------------ attention benchmark (GPU)
 * Synthetic random caches of one attention shape (default LLaMA-3.1-8B: 32
 * query heads, 8 KV heads, head_dim 128, bf16) for every context x batch;
 * per configuration and method (dense, Quest at each budget, packed
 * MosaicKV at each budget and its scoring stage alone) the median
 * kernel time of `runs` steps after `warmup` (CUDA events; the steps are
 * queued behind a spin kernel so host launch gaps stay out), inputs
 * rotated over enough buffer sets that L2 cannot serve them, bytes read,
 * achieved bandwidth against a device-to-device copy measured in the same
 * run, and the device memory one step needs (one buffer set, the plan).
 * Configurations that do not fit in memory get a row saying so.  Rows go
 * to tsv (header first, the columns of scripts/sdpa_peer.py); one line per
 * configuration to log (may be NULL). */
#define MKV_BENCH_MAX_LIST 16
enum {
    MKV_BENCH_DENSE = 1u,           /* dense decode attention */
    MKV_BENCH_DENSE_VARIANT = 2u,   /* also the other build of the dense kernel */
    MKV_BENCH_QUEST = 4u,           /* Quest-style selection + attention */
    MKV_BENCH_PACKED = 8u           /* packed MosaicKV: full step, and scoring + selection alone */
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
    /* Packed MosaicKV caches (fixed strategy for every segment, K and V):
     * r = ceil(keep x head_dim) values per vector among d' rotated
     * channels, per-channel bitmaps, block keys per `block` tokens, one
     * rotation pair per `segment` tokens, sink and recent tokens dense;
     * budgets as for Quest; each budget timed for every block-key width
     * listed (16: fp16 rows; 8: their 8-bit codes, mkv_cuda_mosaic_blockkeys8,
     * rows named mosaic-bk8). */
    double keep;
    int dprime, block, segment;
    int blockkey_bits[2];
    int n_blockkey_bits;
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
    o->methods = MKV_BENCH_DENSE | MKV_BENCH_QUEST | MKV_BENCH_PACKED;
    o->keep = 0.25;
    o->dprime = 64;
    o->block = 8;
    o->segment = 4096;
    o->blockkey_bits[0] = 16;
    o->n_blockkey_bits = 1;
}

int mkv_bench_attention(const mkv_bench_opts *o, FILE *tsv, FILE *log, mkv_error *err);

#ifdef __cplusplus
}
#endif
#endif
