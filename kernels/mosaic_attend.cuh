/* Packed MosaicKV attention: what mosaic_attend.cu, mosaic_encode.cu and bench.cu
 * share (C++; the C door is kernels/mkv_cuda.h).
 *
 * One decode step is four kernels on one stream:
 *   score_kernel   per (request x KV head = "job", visible segment): R_k
 *                  and the first block keys staged in shared memory by
 *                  cp.async together; q~ = q R_k on the tensor cores
 *                  (ldmatrix of R_k, q as fp16 hi + lo parts), kept for
 *                  the attention; block scores q~ . kbar on the tensor
 *                  cores (the same mma path as the attention scores;
 *                  with 8-bit block keys the codes made fp16 in
 *                  registers and each score times its row's scale),
 *                  aggregated over the group's heads, written as
 *                  order-preserving 32-bit keys, and a weighted histogram
 *                  of their top 12 bits per job (the first digit of the
 *                  selection, fused into scoring);
 *   select_kernel  per job: the token budget's threshold: the key K* and,
 *                  among blocks scored exactly K*, the last block id taken,
 *                  found digit by digit (12 + 12 + 8 bits) from the fused
 *                  histogram with early exit when a whole bin is needed, so
 *                  the block list is never sorted or compacted globally;
 *   attend_kernel  first one item per job for its dense sink/recent tokens
 *                  (they need q only, so they run while selection does),
 *                  then per (job, segment, part): the segment's blocks with
 *                  key > K* (or = K* and id <= cut) compacted in shared
 *                  memory, their records streamed into shared memory by
 *                  bulk copies (one per record, issued by one lane and
 *                  counted in by an mbarrier) two tiles ahead per warp,
 *                  expanded into the register fragments a dense 16-token
 *                  tile would have (positions by popcount, zeros
 *                  elsewhere), scores and P V on the tensor cores
 *                  (attn_core.cuh), online softmax in the segment's
 *                  rotated V space, then one rotation back per segment
 *                  and part, also on the tensor cores (o against the rows
 *                  of R_v, like scores): a partial (m, l, acc);
 *   merge_kernel   (attn_core.cuh) over each job's partials.
 * The layout and semantics are in mkv_cuda.h. */
#ifndef MKV_MOSAIC_ATTEND_CUH
#define MKV_MOSAIC_ATTEND_CUH

#include <vector>

#include "attn_core.cuh"

namespace mkv_packed {

/* Per job (request b, KV head h): what the kernels need of the plan. */
struct job_info {
    int64_t pos;          /* query position */
    int32_t head;         /* cache head */
    int32_t seg_vis;      /* segments starting <= pos */
    int32_t nb_vis;       /* blocks (head-wide ids) starting <= pos: ids [0, nb_vis) */
    int32_t nd_vis;       /* dense rows at tokens <= pos (a prefix of the rows) */
    int32_t need;         /* budget minus the always-attended tokens: what blocks must add */
    int32_t cand_w;       /* tokens <= pos in scored (non-temporary) blocks */
    int32_t slot0;        /* its first partial slot (the dense tokens), then its attend items */
    int32_t reserved;
};

constexpr int HIST_BINS = 4096;      /* first digit: key bits 31..20 */

}  // namespace mkv_packed

struct mkv_packed_cache {
    int head_dim = 0, block = 0;
    std::vector<mkv_packed_head> heads;
    std::vector<mkv_packed_seg> segs;
    size_t record_bytes = 0, n_blockkeys = 0, n_rotations = 0;
    int64_t n_dense_rows = 0;
    mkv_device_buffer d_heads, d_segs, records, blockkeys, rotations, dense_k, dense_v;
    /* 8-bit block keys (mkv_cuda_mosaic_blockkeys8): codes, one scale per
     * row, and per segment where its rows start in both. */
    bool has_bk8 = false;
    bool bk16_dropped = false;   /* the fp16 rows freed (mkv_cuda_mosaic_drop_blockkeys16) */
    size_t bk8_bytes = 0, n_bk8_rows = 0;
    mkv_device_buffer bk8, bk8_scales, bk8_at;
    /* Decode-time growth (mkv_cuda_mosaic_grow): per head the open block's
     * running key-row state (sums, minima, maxima: 3 x 128 doubles), and
     * the flag of a value outside float16. */
    mkv_device_buffer grow_blocks, grow_bad;
};

namespace mkv_packed {

/* Check a layout's tables against its pool sizes and limits. */
int check_layout(const mkv_packed_layout *l, mkv_error *err);
/* Allocate a cache for a layout's tables (pools uninitialised); upload
 * copies the pools that are given. */
int cache_alloc(const mkv_packed_layout *l, mkv_packed_cache **out, mkv_error *err);
/* Rewrite segment row `row` on the device from the host table (after an
 * append changed its length). */
int cache_sync_seg(mkv_packed_cache *c, int64_t row, cudaStream_t st, mkv_error *err);

/* Where a segment's 8-bit block-key rows start: byte offset of its codes,
 * index of its first scale. */
struct bk8_place {
    int64_t code_off, scale_off;
};

/* Bytes of an 8-bit block-key row of bk_width codes: 16-byte aligned. */
__host__ __device__ inline int bk8_row_bytes(int bk_width) { return (bk_width + 15) / 16 * 16; }

/* Tokens <= pos of block b (0-based within the segment) of segment s. */
__host__ __device__ inline int block_weight(const mkv_packed_seg &s, int64_t b, int B, int64_t pos)
{
    const int64_t t0 = s.start + b * B;
    int64_t t1 = t0 + B;
    if (t1 > s.start + s.len)
        t1 = s.start + s.len;
    if (t1 > pos + 1)
        t1 = pos + 1;
    return t1 > t0 ? (int)(t1 - t0) : 0;
}

/* Blocks of segment s that start <= pos. */
__host__ __device__ inline int64_t visible_blocks(const mkv_packed_seg &s, int B, int64_t pos)
{
    if (pos < s.start || s.len <= 0)
        return 0;
    const int64_t v = (pos - s.start) / B + 1, nb = (s.len + B - 1) / B;
    return v < nb ? v : nb;
}

/* Whether block `id` (head-wide) with key k is selected by (K*, cut). */
__host__ __device__ inline bool selected(uint32_t k, int32_t id, uint32_t kstar, int32_t cut)
{
    return k > kstar || (k == kstar && id <= cut);
}

}  // namespace mkv_packed

#endif
