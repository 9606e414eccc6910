/* Packed MosaicKV decode attention on the GPU (see mosaic_attend.cuh for the
 * stages and kernels/mkv_cuda.h for the layout and the semantics, which
 * are those of mkv_mosaic_attend in lib/mosaic/method.c). */
#include <algorithm>
#include <memory>
#include <new>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "mosaic_attend.cuh"

extern "C" {
#include "core/attn.h"
}

using namespace mkv_attn;
using namespace mkv_packed;

namespace {

constexpr unsigned FULL = 0xffffffffu;
constexpr int SEL_THREADS = 1024;   /* select_kernel: find_top takes 4 of the 4096 first-digit bins per thread */
constexpr int DENSE_CHUNK = 32;     /* dense rows staged at once by dense_partial */
constexpr int STAGES = 3;           /* tiles copied in flight per warp, the one computed included */
constexpr int WIN = 512;            /* blocks of a segment compacted at once (4 per thread) */
/* Bytes between the records of a staged tile: the same row of consecutive
 * records then starts in the other half of the banks, so the expansion's
 * loads of tokens 8 apart do not collide. */
constexpr int REC_GAP = 64;

/* ---------------------------------------------------------------- small pieces */

/* Programmatic dependent launch (sm_90): wait for the grids this one
 * depends on to complete (their memory visible); let the next grid launch. */
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

/* 16 bytes by cp.async, the source cut to src_bytes (0 or 16): the rest is zeros. */
__device__ __forceinline__ void cp_async16_zfill(void *smem, const void *gmem, int src_bytes)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

/* Bulk copies (sm_90's copy engine): one thread moves a whole record, and
 * an mbarrier counts its bytes in.  The barrier has one arrival a phase
 * (the issuing thread's, announcing the bytes); its phases alternate in
 * parity, which is how a waiter tells the fill it waits for. */
__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t *bar)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");   /* visible to the copy engine */
}
__device__ __forceinline__ void mbar_expect_bytes(uint64_t *bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bulk_copy(void *smem, const void *gmem, uint32_t bytes, uint64_t *bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_addr(smem)),
                 "l"(gmem), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity)
{
    asm volatile("{\n\t.reg .pred done;\n"
                 "MBAR_WAIT_%=:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
                 "@!done bra MBAR_WAIT_%=;\n}" ::"r"(smem_addr(bar)),
                 "r"(parity)
                 : "memory");
}
/* Orders this thread's earlier shared-memory reads (and those it has
 * synchronised with) before the copy engine's next writes. */
__device__ __forceinline__ void fence_to_bulk() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

__device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }

/* The 8 channels of chunk byte m8 of one packed vector as the 16 bytes a
 * dense row would hold there: kept channel e (bit e of m8) takes the next
 * value from v on, the others are zero.  Each kept bit advances the
 * pointer: a predicated load and add per channel. */
__device__ __forceinline__ uint4 expand8(const uint16_t *v, uint32_t m8)
{
    uint32_t h[8];
#pragma unroll
    for (int e = 0; e < 8; e++) {
        h[e] = 0;
        if (m8 & (1u << e))
            h[e] = *v++;
    }
    return make_uint4(__byte_perm(h[0], h[1], 0x5410), __byte_perm(h[2], h[3], 0x5410),
                      __byte_perm(h[4], h[5], 0x5410), __byte_perm(h[6], h[7], 0x5410));
}

/* A query reaches the tensor cores as fp16 hi + lo parts (attn_core.cuh).
 * Scaled by a power of two that brings its largest magnitude amax into
 * [2^14, 2^15), nothing overflows and the lo parts of entries down to 2^-3
 * stay normal: ~22 significant bits, as float32 scores need.  Returns
 * {up, down}: q * up goes in, scores * down come out, both exact. */
__device__ __forceinline__ float2 q_split_scale(float amax)
{
    int e = (int)((__float_as_uint(amax) >> 23) & 0xffu) - 126;   /* amax = m 2^e, m in [0.5, 1) */
    e = e < -100 ? -100 : e > 100 ? 100 : e;   /* both factors finite (zero, subnormal, inf, NaN amax) */
    return make_float2(ldexpf(1.f, 15 - e), ldexpf(1.f, e - 15));
}

/* Largest |x| over the warp (non-negative floats order as their bits). */
__device__ __forceinline__ float warp_max_abs(float x)
{
    return __uint_as_float(__reduce_max_sync(FULL, __float_as_uint(fabsf(x))));
}

/* The A fragments (fp16 hi + lo, attn_core.cuh) of this lane's head row:
 * channels 8 (4 j + c) .. + 8 of row (NULL: a padding head, zeros),
 * scaled by the power of two q_split_scale picks for the warp's largest
 * magnitude.  Returns that {up, down}. */
template <int KJ>
__device__ __forceinline__ float2 row_fragments(const float *row, q_regs<KJ> &qr)
{
    const int c = threadIdx.x & 3;
    float v[KJ][8] = {};
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < KJ; j++) {
        if (row != nullptr) {
            const float4 x = *reinterpret_cast<const float4 *>(row + 8 * (4 * j + c));
            const float4 y = *reinterpret_cast<const float4 *>(row + 8 * (4 * j + c) + 4);
            v[j][0] = x.x; v[j][1] = x.y; v[j][2] = x.z; v[j][3] = x.w;
            v[j][4] = y.x; v[j][5] = y.y; v[j][6] = y.z; v[j][7] = y.w;
        }
#pragma unroll
        for (int e = 0; e < 8; e++)
            amax = fmaxf(amax, fabsf(v[j][e]));
    }
    const float2 sc = q_split_scale(warp_max_abs(amax));
#pragma unroll
    for (int j = 0; j < KJ; j++) {
#pragma unroll
        for (int e = 0; e < 8; e++)
            v[j][e] *= sc.x;
        q_fragments<false>(v[j], qr.f[j]);
    }
    return sc;
}

/* ------------------------------------------------------------------ scoring */

struct score_args {
    const mkv_packed_seg *segs;
    const uint16_t *blockkeys, *rotations;
    const uint8_t *bk8;        /* 8-bit block keys (score_kernel<.., true>): codes, */
    const float *bk8_scales;   /* one scale per row, */
    const bk8_place *bk8_at;   /* each segment's first row in both */
    const job_info *jobs;
    const int4 *items;       /* {job, segment of its head, segment row, 0} */
    const float *q;          /* [job][G][D] */
    float *qt;               /* [job][seg_max][G][qt_width], scaled */
    uint32_t *keys;          /* [job][kstride] */
    uint8_t *wts;            /* [job][kstride] block weights */
    uint32_t *hist;          /* [job][HIST_BINS] */
    int64_t kstride;
    int seg_max, qt_width, G, block, agg_sum;
    float qscale;
};

/* Block-key stages of score_kernel in flight per warp, 16 rows of 64 KJ
 * bytes each (32 KJ with 8-bit codes): few, so that six blocks fit on an SM with the usual rows of
 * 64 channels (the latency to hide is the kernel's prologue, not the
 * stream). */
__host__ __device__ constexpr int score_stages(int kj) { return kj <= 4 ? 2 : 1; }

/* Bytes of a row of R_k staged in shared memory: dk fp16 and 16 bytes of
 * padding, so that the eight rows an ldmatrix reads start in different
 * banks. */
__host__ __device__ inline int rk_row_bytes(int dk) { return 2 * dk + 16; }

/* Dynamic shared memory of score_kernel: one region that holds R_k while
 * q~ is made and the histogram afterwards, then the warps' block-key
 * stages. */
__host__ __device__ inline size_t score_region(int D, int dkmax)
{
    const size_t r = (size_t)D * rk_row_bytes(dkmax), h = sizeof(uint32_t) * HIST_BINS;
    return r > h ? r : h;
}
/* Bytes of a staged block-key row: 32 channels per KJ step, fp16 or 8-bit codes. */
__host__ __device__ constexpr int score_row_bytes(int kj, bool q8) { return (q8 ? 32 : 64) * kj; }
inline size_t score_smem(int D, int dkmax, int kj, bool q8)
{
    return score_region(D, dkmax) + (size_t)WARPS * score_stages(kj) * TILE * score_row_bytes(kj, q8);
}

/* Eight signed 8-bit codes as the fp16 values they are (exactly): a code
 * biased by 128 becomes the low mantissa byte of 1024 + (code + 128), and
 * 1152 comes off. */
__device__ __forceinline__ uint4 codes_to_half8(uint2 x)
{
    const uint32_t lo = x.x ^ 0x80808080u, hi = x.y ^ 0x80808080u;
    const __half2 bias = __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480));
    auto pair = [&](uint32_t w, uint32_t sel) {
        const uint32_t v = __byte_perm(w, 0x64646464u, sel);
        const __half2 h = __hsub2(*reinterpret_cast<const __half2 *>(&v), bias);
        return *reinterpret_cast<const uint32_t *>(&h);
    };
    return make_uint4(pair(lo, 0x4140), pair(lo, 0x4342), pair(hi, 0x4140), pair(hi, 0x4342));
}

/* Four 8x8 fp16 matrices from shared memory, transposed: lanes 8 i .. 8 i + 7
 * give the row addresses of matrix i; register i of lane (n, c) gets its
 * elements (2 c, n) and (2 c + 1, n), the B fragment of a k8 half. */
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

/* KJ: 32-channel steps of the block-key rows (their width / 32, rounded up).
 * Q8: the rows are the 8-bit codes of mkv_cuda_mosaic_blockkeys8, made
 * fp16 in registers (exact), and a block's aggregate score is multiplied
 * by its row's scale (>= 0, so max and sum over the heads commute with it).
 *
 * One (job, segment) item: q~ = q R_k, written to a.qt for the attention,
 * then the segment's block scores.  R_k and the first block-key stages are
 * in flight together; q R_k runs on the tensor cores with q split into
 * fp16 high and low parts (~22 significant bits, as for the scores), R_k
 * as the B operand read from shared memory by ldmatrix. */
template <int D, int KJ, bool Q8>
__global__ void __launch_bounds__(THREADS) score_kernel(const score_args a)
{
    constexpr int W = 32 * KJ;        /* block-key row channels at most */
    constexpr int NST = score_stages(KJ);
    constexpr int ROW = score_row_bytes(KJ, Q8);   /* bytes of a staged block-key row */
    constexpr int CHR = ROW / 16;     /* its 16-byte chunks */
    constexpr int KS = D / 16;        /* k16 steps of q R_k */
    __shared__ __align__(16) float sm_qb[MAX_G][W];
    extern __shared__ __align__(16) uint8_t dyn[];
    uint8_t *sm_rk = dyn;                                   /* R_k while q~ is made, */
    uint32_t *sm_hist = reinterpret_cast<uint32_t *>(dyn);  /* then the histogram */

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int n = lane >> 2, c = lane & 3;
    const int4 it = a.items[blockIdx.x];
    const job_info jb = a.jobs[it.x];
    const mkv_packed_seg sg = a.segs[it.z];
    const int G = a.G, B = a.block;
    const int nbv = (int)visible_blocks(sg, B, jb.pos);
    /* tokens of the segment at positions <= pos (blocks past it are not visible) */
    const int vis_tokens = (int)(jb.pos + 1 - sg.start < sg.len ? jb.pos + 1 - sg.start : sg.len);
    const uint16_t *BK = a.blockkeys + sg.bk_off;
    const bk8_place pl = Q8 ? a.bk8_at[it.z] : bk8_place{0, 0};
    const uint8_t *BK8 = a.bk8 + pl.code_off;
    const int bkw = sg.bk_width, rb8 = bk8_row_bytes(bkw), nch = Q8 ? rb8 / 16 : bkw / 8;
    const bool rotated = sg.rk_off >= 0;
    const int dk = sg.dk, rkb = rk_row_bytes(dk);

    /* R_k first (the oldest cp.async group, so that waiting for it leaves
     * the block keys in flight). */
    if (rotated) {
        const uint16_t *R = a.rotations + sg.rk_off;
        const int chunks = dk / 8;
        for (int i = tid; i < D * chunks; i += THREADS) {
            const int r = i / chunks, ch = i % chunks;
            cp_async16_zfill(sm_rk + r * rkb + 16 * ch, R + (size_t)r * dk + 8 * ch, 16);
        }
    }
    cp_async_commit();

    /* Warp w scores blocks [16 (w + WARPS k), +16) at its step k.  Their
     * rows are staged in shared memory by cp.async, NST steps ahead, the
     * first NST issued before q~ is made.  Rows past the visible
     * blocks and chunks past the row width are zero-filled.  fp16: chunk
     * ch of row r sits at ch ^ 4 (r & 1) when rows span a multiple of 128
     * bytes: the fragment reads (rows r, r + 1, four chunks each per
     * quarter warp) then hit distinct banks.  Codes: a half warp reads 32
     * bytes of each of rows r, r + 1, r + 4, r + 5 (r a multiple of 8);
     * their 32-byte groups are swapped by bit 2 of r (rows of 64 bytes),
     * or permuted by bits 0 and 2 (rows of a multiple of 128 bytes), so
     * that the four land in distinct banks. */
    const int n_steps = sg.always || nbv <= warp * TILE ? 0 : (nbv - warp * TILE + WARPS * TILE - 1) / (WARPS * TILE);
    uint8_t *stage0 = dyn + score_region(D, a.qt_width) + (size_t)warp * NST * TILE * ROW;
    auto swz = [](int r) {
        if (!Q8)
            return (KJ % 2 == 0) ? 4 * (r & 1) : 0;
        return KJ == 2 ? 2 * ((r >> 2) & 1) : (KJ % 4 == 0) ? 2 * ((r & 1) | ((r >> 1) & 2)) : 0;
    };
    auto issue = [&](int k) {
        if (k < n_steps) {
            const int t0 = (warp + WARPS * k) * TILE;
            uint8_t *dst = stage0 + (size_t)(k % NST) * TILE * ROW;
#pragma unroll
            for (int i = lane; i < TILE * CHR; i += 32) {
                const int r = i / CHR, ch = i % CHR;
                const bool ok = t0 + r < nbv && ch < nch;
                const void *src = !ok ? (const void *)BK
                                  : Q8 ? (const void *)(BK8 + (size_t)(t0 + r) * rb8 + 16 * ch)
                                       : (const void *)(BK + (size_t)(t0 + r) * bkw + 8 * ch);
                cp_async16_zfill(dst + r * ROW + 16 * (ch ^ swz(r)), src, ok ? 16 : 0);
            }
        }
        cp_async_commit();
    };
#pragma unroll
    for (int k = 0; k < NST; k++)
        issue(k);

    /* This lane's entries of q (scaled): head n, channels 16 s + 2 c + 8 h
     * and the next, as the A operand wants them. */
    const float *qj = a.q + (size_t)it.x * G * D;
    float2 qa[KS][2];
    float amax = 0.f;
#pragma unroll
    for (int s = 0; s < KS; s++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float2 x = make_float2(0.f, 0.f);
            if (n < G)
                x = *reinterpret_cast<const float2 *>(qj + (size_t)n * D + 16 * s + 2 * c + 8 * h);
            qa[s][h] = make_float2(x.x * a.qscale, x.y * a.qscale);
            amax = fmaxf(amax, fmaxf(fabsf(qa[s][h].x), fabsf(qa[s][h].y)));
        }
    /* The block-score query: [min(q~, 0) | max(q~, 0) over the bounded
     * channels | q~ over the others], matching the row layout; entries
     * past kdim + kbound stay zero. */
    const int kb = sg.kbound, kw = sg.kdim + sg.kbound;
    for (int i = tid; i < MAX_G * W; i += THREADS)
        if (i % W >= kw || i / W >= G)
            sm_qb[i / W][i % W] = 0.f;
    float *qt = a.qt + ((size_t)it.x * a.seg_max + it.y) * G * a.qt_width;
    /* Channel ch of head n of q~ is x: into a.qt and the entries of sm_qb
     * made from it. */
    auto put = [&](int ch, float x) {
        qt[(size_t)n * a.qt_width + ch] = x;
        if (ch < kb) {
            sm_qb[n][ch] = fminf(x, 0.f);
            sm_qb[n][ch + kb] = fmaxf(x, 0.f);
        } else if (ch < sg.kdim) {
            sm_qb[n][ch + kb] = x;
        }
    };
    for (int i = tid; i < G * (a.qt_width - dk); i += THREADS)   /* channels past dk are zero */
        qt[(size_t)(i / (a.qt_width - dk)) * a.qt_width + dk + i % (a.qt_width - dk)] = 0.f;

    if (rotated) {
        const float2 sc = q_split_scale(warp_max_abs(amax));
        uint32_t af[KS][4];
#pragma unroll
        for (int s = 0; s < KS; s++) {
            split2<false>(qa[s][0].x * sc.x, qa[s][0].y * sc.x, af[s][0], af[s][1]);
            split2<false>(qa[s][1].x * sc.x, qa[s][1].y * sc.x, af[s][2], af[s][3]);
        }
        cp_async_wait<NST>();   /* this thread's R_k chunks */
        __syncthreads();        /* everyone's */
        /* Warp w makes columns [16 p, 16 p + 16) for p = w, w + WARPS, ...:
         * matrices (k half, column half) = (i & 1, i >> 1) for lane group i. */
        const int mi = lane >> 3, r8 = lane & 7;
        for (int p = warp; p < dk / 16; p += WARPS) {
            float d[2][4] = {};
#pragma unroll
            for (int s = 0; s < KS; s++) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, sm_rk + (16 * s + 8 * (mi & 1) + r8) * rkb + 16 * (2 * p + (mi >> 1)));
                mma<false>(d[0], af[s], b[0], b[1]);
                mma<false>(d[1], af[s], b[2], b[3]);
            }
            if (n < G)   /* rows n (high parts) + rows n + 8 (low parts) */
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    put(16 * p + 8 * h + 2 * c, (d[h][0] + d[h][2]) * sc.y);
                    put(16 * p + 8 * h + 2 * c + 1, (d[h][1] + d[h][3]) * sc.y);
                }
        }
    } else if (n < G && warp == 0) {   /* q~ = q: warp 0 writes it */
#pragma unroll
        for (int s = 0; s < KS; s++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                put(16 * s + 8 * h + 2 * c, qa[s][h].x);
                put(16 * s + 8 * h + 2 * c + 1, qa[s][h].y);
            }
    }

    uint32_t *keys = a.keys + (size_t)it.x * a.kstride + sg.first_block;
    uint8_t *wts = a.wts + (size_t)it.x * a.kstride + sg.first_block;
    if (sg.always) {   /* attended whole: not a candidate (nothing was staged) */
        for (int i = tid; i < nbv; i += THREADS) {
            keys[i] = 0;
            wts[i] = 0;
        }
        return;
    }
    __syncthreads();   /* sm_qb complete; R_k read by every warp */
    for (int i = tid; i < HIST_BINS; i += THREADS)
        sm_hist[i] = 0;
    /* Every warp reads every head row whole: the same scale in each. */
    q_regs<KJ> qr;
    const float2 qsc = row_fragments<KJ>(n < G ? sm_qb[n] : nullptr, qr);
    __syncthreads();   /* the histogram zeroed */

    /* One warp scores 16 blocks per step like 16 tokens of attention. */
    const int ra = half_a_token(n), rb = half_b_token(n);
    for (int k = 0; k < n_steps; k++) {
        const int t0 = (warp + WARPS * k) * TILE;
        const int blk = t0 + 4 * c + n;   /* the block this lane keys, when n < 4 */
        float bscale = 1.f;   /* loaded first: its latency beside the stage's */
        if (Q8 && n < 4 && blk < nbv)
            bscale = a.bk8_scales[pl.scale_off + blk];
        cp_async_wait<NST - 1>();
        __syncwarp();
        const uint8_t *buf = stage0 + (size_t)(k % NST) * TILE * ROW;
        uint4 kr[2][KJ];
#pragma unroll
        for (int j = 0; j < KJ; j++) {
            if (Q8) {
                const int u = 4 * j + c;   /* this lane's 8 codes: 8-byte unit u of the row */
                kr[0][j] = codes_to_half8(*reinterpret_cast<const uint2 *>(buf + ra * ROW + 16 * ((u >> 1) ^ swz(ra))
                                                                           + 8 * (u & 1)));
                kr[1][j] = codes_to_half8(*reinterpret_cast<const uint2 *>(buf + rb * ROW + 16 * ((u >> 1) ^ swz(rb))
                                                                           + 8 * (u & 1)));
            } else {
                kr[0][j] = *reinterpret_cast<const uint4 *>(buf + ra * ROW + 16 * ((4 * j + c) ^ swz(ra)));
                kr[1][j] = *reinterpret_cast<const uint4 *>(buf + rb * ROW + 16 * ((4 * j + c) ^ swz(rb)));
            }
        }
        __syncwarp();   /* read before the slot is refilled */
        issue(k + NST);
        float s[4];
        tile_scores<KJ, false>(qr, kr, s);
#pragma unroll
        for (int u = 0; u < 4; u++) {
            /* Padding head rows score 0: left out of the max, harmless to the sum. */
            float x = n < G || a.agg_sum ? s[u] * qsc.y : -INFINITY;
            if (a.agg_sum) {
                x += __shfl_xor_sync(FULL, x, 4);
                x += __shfl_xor_sync(FULL, x, 8);
                x += __shfl_xor_sync(FULL, x, 16);
            } else {
                x = fmaxf(x, __shfl_xor_sync(FULL, x, 4));
                x = fmaxf(x, __shfl_xor_sync(FULL, x, 8));
                x = fmaxf(x, __shfl_xor_sync(FULL, x, 16));
            }
            s[u] = x;
        }
        /* Every lane holds its column's aggregate: lane (n < 4, c) takes
         * block 4 c + n of the tile, one block per lane. */
        const float sn = (n == 0 ? s[0] : n == 1 ? s[1] : n == 2 ? s[2] : s[3]) * bscale;
        if (n < 4 && blk < nbv) {
            const uint32_t key = order_key(sn);
            const int left = vis_tokens - blk * B;   /* tokens <= pos from the block's start on */
            const int w = left < B ? left : B;
            keys[blk] = key;
            wts[blk] = (uint8_t)w;
            atomicAdd(&sm_hist[key >> 20], (uint32_t)w);
        }
    }
    cp_async_wait<0>();
    __syncthreads();
    uint32_t *gh = a.hist + (size_t)it.x * HIST_BINS;
    for (int i = tid; i < HIST_BINS; i += THREADS)
        if (sm_hist[i])
            atomicAdd(&gh[i], sm_hist[i]);
}

/* mkv_cuda_mosaic_blockkeys8 (mkv_cuda.h): one block per segment, one
 * warp per row; the codes in double so that a reference computes the same
 * ones. */
__global__ void blockkeys8_kernel(const mkv_packed_seg *segs, const bk8_place *at, const uint16_t *bk,
                                  uint8_t *codes, float *scales)
{
    const mkv_packed_seg sg = segs[blockIdx.x];
    if (sg.always)
        return;
    const bk8_place pl = at[blockIdx.x];
    const int lane = threadIdx.x & 31, w = sg.bk_width, rb = bk8_row_bytes(w);
    for (int64_t b = threadIdx.x >> 5; b < sg.n_blocks; b += blockDim.x >> 5) {
        const uint16_t *row = bk + sg.bk_off + b * w;
        float amax = 0.f;
        for (int c = lane; c < w; c += 32)
            amax = fmaxf(amax, fabsf(h2f(row[c])));
        const double a = warp_max_abs(amax);
        uint8_t *out = codes + pl.code_off + b * rb;
        for (int c = lane; c < rb; c += 32)
            out[c] = (uint8_t)(int8_t)(c < w && a > 0 ? (int)rint((double)h2f(row[c]) * 127.0 / a) : 0);
        if (lane == 0)
            scales[pl.scale_off + b] = (float)(a / 127.0);
    }
}

/* ---------------------------------------------------------------- selection */

struct select_args {
    const job_info *jobs;
    const uint32_t *keys;
    const uint8_t *wts;
    uint32_t *hist;
    uint2 *sel;              /* [job] {K*, cut} */
    int64_t kstride;
};

struct select_shared {
    uint32_t hist[HIST_BINS];
    int scan[32];
    int found_digit, found_above, found_bin, found_cut;
    int cut_lo, cut_hi, cut_before;   /* eq_cut: the range where the cut falls */
};

/* The bin where the weight counted from the top bin down reaches `need`
 * (0 < need <= the histogram's total): its digit, the weight above it and
 * its own weight, for every thread. */
__device__ void find_top(select_shared &sh, int nbins, int need, int *digit, int *above, int *binw)
{
    const int tid = threadIdx.x;
    if (tid == 0) {   /* ordered before the writes below by the scan's barriers */
        sh.found_digit = 0;
        sh.found_above = 0;
        sh.found_bin = 0;
    }
    int cnt[4], local = 0;
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const int rk = 4 * tid + q;   /* rk-th bin from the top */
        cnt[q] = rk < nbins ? (int)sh.hist[nbins - 1 - rk] : 0;
        local += cnt[q];
    }
    int total;
    int before = block_scan<SEL_THREADS>(local, &total, sh.scan);
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const int rk = 4 * tid + q;
        if (rk < nbins && before < need && need <= before + cnt[q]) {
            sh.found_digit = nbins - 1 - rk;
            sh.found_above = before;
            sh.found_bin = cnt[q];
        }
        before += cnt[q];
    }
    __syncthreads();
    *digit = sh.found_digit;
    *above = sh.found_above;
    *binw = sh.found_bin;
    __syncthreads();
}

/* Weighted histogram of the keys of blocks [0, nb) whose key >> shift equals
 * prefix: bin (key >> bshift) & (nbins - 1).  With ids (nbins <= HIST_BINS
 * / 3), hist[nbins + bin] also counts the bin's blocks and hist[2 nbins +
 * bin] holds the highest of their ids: the id of the only one when the
 * count is 1, the usual case for the last digit, which then needs no
 * eq_cut. */
__device__ void key_hist(select_shared &sh, const uint32_t *keys, const uint8_t *wts, int nb, int shift,
                         uint32_t prefix, int bshift, int nbins, bool ids)
{
    constexpr int U = 4;   /* 4-key loads in flight per thread */
    for (int i = threadIdx.x; i < (ids ? 3 : 1) * nbins; i += SEL_THREADS)
        sh.hist[i] = 0;
    __syncthreads();
    for (int i0 = 4 * threadIdx.x; i0 < nb; i0 += 4 * SEL_THREADS * U) {
        uint4 k4[U];
        uint32_t w4[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int i = i0 + 4 * SEL_THREADS * u;   /* rows are padded to 4 keys */
            k4[u] = make_uint4(0, 0, 0, 0);
            w4[u] = 0;
            if (i < nb) {
                k4[u] = *reinterpret_cast<const uint4 *>(keys + i);
                w4[u] = *reinterpret_cast<const uint32_t *>(wts + i);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int i = i0 + 4 * SEL_THREADS * u;
            const uint32_t kv[4] = {k4[u].x, k4[u].y, k4[u].z, k4[u].w};
#pragma unroll
            for (int q = 0; q < 4; q++)
                if (i + q < nb && kv[q] != 0u && (kv[q] >> shift) == prefix) {
                    const uint32_t bin = (kv[q] >> bshift) & (uint32_t)(nbins - 1);
                    atomicAdd(&sh.hist[bin], w4[u] >> (8 * q) & 0xffu);
                    if (ids) {
                        atomicAdd(&sh.hist[nbins + bin], 1u);
                        atomicMax(&sh.hist[2 * nbins + bin], (uint32_t)(i + q));
                    }
                }
        }
    }
    __syncthreads();
}

/* Among the blocks keyed exactly kstar, in id order, the id of the one at
 * which their running weight reaches rest.  Each thread counts a
 * contiguous range; warp 0 then walks the one range where the weight is
 * reached, 32 keys per step, so the walk is a few wide loads rather than
 * one thread's chain of dependent loads. */
__device__ int eq_cut(select_shared &sh, const uint32_t *keys, const uint8_t *wts, int nb, uint32_t kstar, int rest)
{
    const int tid = threadIdx.x, lane = tid & 31;
    const int per = ((nb + SEL_THREADS - 1) / SEL_THREADS + 3) / 4 * 4;
    const int lo = tid * per, hi = lo + per < nb ? lo + per : nb;
    if (tid == 0) {   /* ordered before the writes below by the scan's barriers */
        sh.found_cut = -1;
        sh.cut_lo = sh.cut_hi = sh.cut_before = 0;
    }
    int local = 0;
#pragma unroll 4
    for (int i = lo; i < hi; i += 4) {
        const uint4 k4 = *reinterpret_cast<const uint4 *>(keys + i);
        const uint32_t w4 = *reinterpret_cast<const uint32_t *>(wts + i);
        const uint32_t kv[4] = {k4.x, k4.y, k4.z, k4.w};
#pragma unroll
        for (int q = 0; q < 4; q++)
            if (i + q < hi && kv[q] == kstar)
                local += w4 >> (8 * q) & 0xffu;
    }
    int total;
    const int before = block_scan<SEL_THREADS>(local, &total, sh.scan);
    if (before < rest && rest <= before + local) {   /* one thread at most */
        sh.cut_lo = lo;
        sh.cut_hi = hi;
        sh.cut_before = before;
    }
    __syncthreads();
    if (tid < 32) {
        int run = sh.cut_before;
        for (int i0 = sh.cut_lo; i0 < sh.cut_hi; i0 += 32) {
            const int i = i0 + lane;
            const bool eq = i < sh.cut_hi && keys[i] == kstar;
            int x = eq ? (int)wts[i] : 0;   /* inclusive scan of the tied weights */
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int y = __shfl_up_sync(FULL, x, o);
                if (lane >= o)
                    x += y;
            }
            const unsigned hit = __ballot_sync(FULL, eq && run + x >= rest);
            if (hit) {
                if (lane == 0)
                    sh.found_cut = i0 + __ffs(hit) - 1;
                break;
            }
            run += __shfl_sync(FULL, x, 31);
        }
    }
    __syncthreads();
    return sh.found_cut;
}

/* Lowest key L of a bin taken whole: selected iff key > L - 1 (keys are >= 1). */
__device__ __forceinline__ uint32_t below(uint32_t lowest) { return lowest >= 1u ? lowest - 1u : 0u; }

__global__ void __launch_bounds__(SEL_THREADS, 1) select_kernel(const select_args a)
{
    __shared__ select_shared sh;

    /* The attention grid may launch now: its dense items need only q, and
     * its packed items wait for this grid to complete. */
    pdl_trigger();
    const int tid = threadIdx.x;
    const int job = blockIdx.x;
    const job_info jb = a.jobs[job];

    pdl_wait();   /* scoring complete: keys, weights, histograms */

    uint32_t *gh = a.hist + (size_t)job * HIST_BINS;
    const uint32_t *keys = a.keys + (size_t)job * a.kstride;
    const uint8_t *wts = a.wts + (size_t)job * a.kstride;
    const int nb = jb.nb_vis, need = jb.need;
    uint32_t kstar;
    int cut = -1;
    if (need <= 0) {
        kstar = 0xffffffffu;   /* no key is above it */
    } else if (need >= jb.cand_w) {
        kstar = 0u;            /* every candidate */
    } else {
        for (int i = tid; i < HIST_BINS; i += SEL_THREADS)
            sh.hist[i] = gh[i];
        __syncthreads();
        int d1, above, binw;
        find_top(sh, HIST_BINS, need, &d1, &above, &binw);
        int rest = need - above;
        if (binw == rest) {
            kstar = below((uint32_t)d1 << 20);
        } else {
            key_hist(sh, keys, wts, nb, 20, (uint32_t)d1, 8, 4096, false);
            int d2;
            find_top(sh, 4096, rest, &d2, &above, &binw);
            rest -= above;
            const uint32_t prefix = (uint32_t)d1 << 12 | (uint32_t)d2;
            if (binw == rest) {
                kstar = below(prefix << 8);
            } else {
                key_hist(sh, keys, wts, nb, 8, prefix, 0, 256, true);
                int d3;
                find_top(sh, 256, rest, &d3, &above, &binw);
                rest -= above;
                kstar = prefix << 8 | (uint32_t)d3;
                if (binw == rest)
                    kstar -= 1u;   /* all of them: key >= K* */
                else if (sh.hist[256 + d3] == 1u)
                    cut = (int)sh.hist[512 + d3];   /* one block keyed K*: the cut falls in it */
                else
                    cut = eq_cut(sh, keys, wts, nb, kstar, rest);
            }
        }
    }
    if (tid == 0)
        a.sel[job] = make_uint2(kstar, (uint32_t)cut);
    /* Ready for the next step (the histogram was read above, if at all). */
    for (int i = tid; i < HIST_BINS; i += SEL_THREADS)
        gh[i] = 0;
}

/* ---------------------------------------------------------------- attention */

struct attend_args {
    const mkv_packed_head *heads;
    const mkv_packed_seg *segs;
    const uint16_t *dense_k, *dense_v;
    const float *q;          /* [job][G][D], for the dense tokens */
    const uint8_t *records;
    const uint16_t *rotations;
    const job_info *jobs;
    const int4 *items;       /* {job, segment of its head, part, segment row}; part -1: the dense tokens */
    const float *qt;
    const uint32_t *keys;
    const uint2 *sel;
    float *part_o;
    float2 *part_ml;
    int64_t kstride;
    int seg_max, G, block, bshift, nparts;   /* block = 1 << bshift */
    int stage_bytes;         /* bytes of one stage buffer (a tile of the largest records, REC_GAP apart) */
    float qscale;
};

/* The rotation back, out[g][j] = sum over c < dv of o[g][c] R_v[j][c], on
 * the tensor cores: the scores of o (split into fp16 hi + lo like a
 * query) against the rows of R_v (exact in fp16) as if they were keys.
 * Warp w makes channels [16 (RS w + s), +16) for s < RS; rot_frags holds
 * this lane's B fragments of them (its "tokens" are rows of R_v), loaded
 * by rot_frags_load before the warps' states are folded. */
template <int D, int DVMAX>
struct rot_frags {
    static constexpr int RS = D / (WARPS * TILE);
    uint4 r[RS][2][DVMAX / 32];
};

template <int D, int DVMAX>
__device__ __forceinline__ void rot_frags_load(const uint16_t *R, int dv, rot_frags<D, DVMAX> &f)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n = lane >> 2, c = lane & 3;
#pragma unroll
    for (int s = 0; s < f.RS; s++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int j = TILE * (f.RS * warp + s) + (h ? half_b_token(n) : half_a_token(n));
#pragma unroll
            for (int jj = 0; jj < DVMAX / 32; jj++) {
                const int ch = 4 * jj + c;
                f.r[s][h][jj] = R != nullptr && 8 * ch < dv ? __ldg(reinterpret_cast<const uint4 *>(R + (size_t)j * dv) + ch)
                                                            : make_uint4(0, 0, 0, 0);
            }
        }
}

template <int D, int DVMAX>
__device__ void rotate_back(const float (*o)[DVMAX], const rot_frags<D, DVMAX> &f, bool rotated, int G, float *out)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n = lane >> 2, c = lane & 3;
    if (!rotated) {   /* o is in the original space already */
        for (int i = threadIdx.x; i < G * D; i += THREADS)
            out[i] = i % D < DVMAX ? o[i / D][i % D] : 0.f;
        return;
    }
    constexpr int KJ = DVMAX / 32;
    q_regs<KJ> orr;
    const float2 sc = row_fragments<KJ>(n < G ? o[n] : nullptr, orr);
#pragma unroll
    for (int s = 0; s < f.RS; s++) {
        float r[4];
        tile_scores<KJ, false>(orr, f.r[s], r);
        if (n < G)
            *reinterpret_cast<float4 *>(out + (size_t)n * D + TILE * (f.RS * warp + s) + 4 * c) =
                make_float4(r[0] * sc.y, r[1] * sc.y, r[2] * sc.y, r[3] * sc.y);
    }
}

/* Shared memory dense_partial needs: DENSE_CHUNK K and V rows, their
 * scores, the scaled query. */
inline size_t dense_smem(int D)
{
    return (size_t)2 * DENSE_CHUNK * D * 2 + sizeof(float) * DENSE_CHUNK * MAX_G + sizeof(float) * MAX_G * D;
}

/* The partial (m, l, acc) of a job's dense sink and recent tokens into its
 * first slot: exact attention over 16-bit rows staged DENSE_CHUNK at a
 * time.  Thread k-th (head, channel) pair idx = tid + k THREADS keeps the
 * head's running max and sum (every thread of a head computes the same)
 * and the channel's accumulator. */
template <int D>
__device__ __noinline__ void dense_partial(const attend_args &a, int job, uint8_t *smem)
{
    constexpr int PER = MAX_G * D / THREADS;
    uint16_t(*sm_k)[D] = reinterpret_cast<uint16_t(*)[D]>(smem);
    uint16_t(*sm_v)[D] = reinterpret_cast<uint16_t(*)[D]>(smem + (size_t)DENSE_CHUNK * D * 2);
    float(*sm_s)[MAX_G] = reinterpret_cast<float(*)[MAX_G]>(smem + (size_t)2 * DENSE_CHUNK * D * 2);
    float(*sm_q)[D] = reinterpret_cast<float(*)[D]>(smem + (size_t)2 * DENSE_CHUNK * D * 2
                                                    + sizeof(float) * DENSE_CHUNK * MAX_G);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const job_info jb = a.jobs[job];
    const mkv_packed_head hd = a.heads[jb.head];
    const int G = a.G;
    for (int i = tid; i < G * D; i += THREADS)
        sm_q[i / D][i % D] = a.q[(size_t)job * G * D + i] * a.qscale;
    float m[PER], l[PER], acc[PER];
#pragma unroll
    for (int k = 0; k < PER; k++) {
        m[k] = -INFINITY;
        l[k] = acc[k] = 0.f;
    }
    for (int r0 = 0; r0 < jb.nd_vis; r0 += DENSE_CHUNK) {
        const int nr = jb.nd_vis - r0 < DENSE_CHUNK ? jb.nd_vis - r0 : DENSE_CHUNK;
        const size_t row0 = (size_t)(hd.dense_row + r0) * D;
        for (int i = tid; i < nr * (D / 8); i += THREADS) {
            const int r = i / (D / 8), ch = i % (D / 8);
            *reinterpret_cast<uint4 *>(&sm_k[r][8 * ch]) =
                *reinterpret_cast<const uint4 *>(a.dense_k + row0 + (size_t)r * D + 8 * ch);
            *reinterpret_cast<uint4 *>(&sm_v[r][8 * ch]) =
                *reinterpret_cast<const uint4 *>(a.dense_v + row0 + (size_t)r * D + 8 * ch);
        }
        __syncthreads();
        for (int r = warp; r < nr; r += WARPS)
            for (int g = 0; g < G; g++) {
                float x = 0.f;
#pragma unroll
                for (int e = 0; e < D / 32; e++)
                    x += sm_q[g][lane + 32 * e] * h2f(sm_k[r][lane + 32 * e]);
#pragma unroll
                for (int o = 16; o > 0; o >>= 1)
                    x += __shfl_xor_sync(FULL, x, o);
                if (lane == 0)
                    sm_s[r][g] = x;
            }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < PER; k++) {
            const int idx = tid + k * THREADS, g = idx / D, j = idx % D;
            if (g < G) {
                float mc = -INFINITY;
                for (int r = 0; r < nr; r++)
                    mc = fmaxf(mc, sm_s[r][g]);
                const float m_new = fmaxf(m[k], mc);
                const float alpha = m[k] == -INFINITY ? 0.f : fast_exp2(m[k] - m_new);
                l[k] *= alpha;
                acc[k] *= alpha;
                for (int r = 0; r < nr; r++) {
                    const float p = fast_exp2(sm_s[r][g] - m_new);
                    l[k] += p;
                    acc[k] += p * h2f(sm_v[r][j]);
                }
                m[k] = m_new;
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int idx = tid + k * THREADS, g = idx / D, j = idx % D;
        if (g < G) {
            const size_t slot = (size_t)jb.slot0 * G + g;
            a.part_o[slot * D + j] = acc[k];
            if (j == 0)
                a.part_ml[slot] = make_float2(m[k], l[k]);
        }
    }
}

/* Dynamic shared memory of attend_kernel: [WARPS + 1][MAX_G] maxima and
 * sums (row WARPS: the folded ones), the block list, the scan scratch, the
 * warps' chunk metadata ([2][TILE][CHS] words: K, V), then the warps'
 * stage buffers, which the fold reuses for the [WARPS][MAX_G][DVMAX]
 * per-warp accumulators once every tile is computed (8 KB less per block
 * with 64-channel values: room for the fifth block per SM). */
template <int DKMAX, int DVMAX>
struct attend_smem {
    /* 8-channel chunks per vector, padded to an odd count: conflict-free reads */
    static constexpr int CHS = (DKMAX > DVMAX ? DKMAX : DVMAX) / 8 + 1;
    static constexpr size_t o_bytes = sizeof(float) * WARPS * MAX_G * DVMAX;
    static constexpr size_t ml_bytes = sizeof(float) * 2 * (WARPS + 1) * MAX_G;
    static constexpr size_t list_bytes = sizeof(int) * WIN;
    static constexpr size_t scan_bytes = sizeof(int) * 32;
    static constexpr size_t meta_bytes = (sizeof(uint32_t) * WARPS * 2 * TILE * CHS + 15) / 16 * 16;
    static constexpr size_t bar_bytes = (sizeof(uint64_t) * WARPS * STAGES + 15) / 16 * 16;
    static constexpr size_t fixed = ml_bytes + list_bytes + scan_bytes + meta_bytes + bar_bytes;
    static size_t total(int stage_bytes)
    {
        const size_t st = (size_t)WARPS * STAGES * stage_bytes;
        return fixed + (st > o_bytes ? st : o_bytes);
    }
};

/* Five blocks per SM with 64-channel keys and values (96 registers):
 * more items in flight hide more of each item's prologue and fold; timed
 * 1.4-2.9% faster per step than four (docs/BENCHMARKS.md, session 6);
 * six (80 registers) spill and lose 7%. */
template <int D, int DKMAX, int DVMAX>
__global__ void __launch_bounds__(THREADS, (DKMAX + DVMAX <= 128 ? 5 : 2)) attend_kernel(const __grid_constant__ attend_args a)
{
    constexpr int KJ = DKMAX / 32, VH = DVMAX / 64, NT = DVMAX / 8;
    constexpr int NW = (DKMAX > DVMAX ? DKMAX : DVMAX) / 32;   /* bitmap words per vector at most */
    using smem = attend_smem<DKMAX, DVMAX>;
    constexpr int CHS = smem::CHS;
    extern __shared__ __align__(16) uint8_t dyn[];
    float(*sm_m)[MAX_G] = reinterpret_cast<float(*)[MAX_G]>(dyn);
    float(*sm_l)[MAX_G] = reinterpret_cast<float(*)[MAX_G]>(dyn + smem::ml_bytes / 2);
    int *sm_list = reinterpret_cast<int *>(dyn + smem::ml_bytes);
    int *sm_scan = reinterpret_cast<int *>(dyn + smem::ml_bytes + smem::list_bytes);
    uint32_t *sm_meta = reinterpret_cast<uint32_t *>(dyn + smem::ml_bytes + smem::list_bytes + smem::scan_bytes);
    uint64_t *sm_bar = reinterpret_cast<uint64_t *>(dyn + smem::fixed - smem::bar_bytes);
    uint8_t *stages = dyn + smem::fixed;
    /* the fold's accumulators: over the stage buffers, which are idle by then */
    float(*sm_o)[MAX_G][DVMAX] = reinterpret_cast<float(*)[MAX_G][DVMAX]>(stages);

    const int4 it = a.items[blockIdx.x];
    if (it.z < 0) {   /* the dense tokens need q only: no wait */
        dense_partial<D>(a, it.x, dyn);
        return;
    }
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int n = lane >> 2, c = lane & 3;
    const int job = it.x, G = a.G, B = a.block, bs = a.bshift;
    const job_info jb = a.jobs[job];      /* the plan's tables: no wait */
    const mkv_packed_seg sg = a.segs[it.w];
    const int nbv = (int)visible_blocks(sg, B, jb.pos);
    if (sg.rv_off >= 0)   /* R_v is read once, at the end: start fetching it now */
        for (int ofs = 128 * tid; ofs < D * sg.dv * 2; ofs += 128 * THREADS)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(reinterpret_cast<const uint8_t *>(a.rotations + sg.rv_off) + ofs));
    pdl_wait();   /* selection complete (and through it, scoring and q~) */
    const uint2 sl = a.sel[job];
    const uint32_t *keys = a.keys + (size_t)job * a.kstride + sg.first_block;
    uint32_t key0[4];   /* the first window's keys, on their way while q~ is read */
#pragma unroll
    for (int q = 0; q < 4; q++)
        key0[q] = 4 * tid + q < nbv ? keys[4 * tid + q] : 0u;
    const int TB = TILE / B;                 /* blocks per 16-token tile */
    const int rec = sg.rec_bytes, rstride = rec + REC_GAP, tile_bytes = TB * rstride;
    /* This lane's vector in the chunk metadata: tensor (K, V), token. */
    const int m_tensor = lane >> 4, m_tok = lane & 15;
    const int m_words = m_tensor ? sg.dv / 32 : (sg.dpk + 31) / 32, m_r = m_tensor ? sg.rv : sg.rk;
    const int m_vals = m_tensor ? sg.vval_off : 0, m_mask = m_tensor ? sg.vmask_off : sg.kmask_off;
    uint32_t *meta = sm_meta + (size_t)warp * 2 * TILE * CHS;
    const int64_t seg_end = sg.start + sg.len;

    /* The warp holds all of q~ (every head, every channel): the same scale in every warp. */
    q_regs<KJ> qr;
    const float *qt = a.qt + ((size_t)job * a.seg_max + it.y) * G * DKMAX;
    const float2 qsc = row_fragments<KJ>(n < G ? qt + (size_t)n * DKMAX : nullptr, qr);

    float m_run = -INFINITY, l_run = 0.f;
    float o[NT][4];
#pragma unroll
    for (int i = 0; i < NT; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;

    uint8_t *stage0 = stages + (size_t)warp * STAGES * a.stage_bytes;
    const uint8_t *src_seg = a.records + sg.rec_off;
    const int first_t = it.z * WARPS + warp, stride_t = a.nparts * WARPS;
    /* The warp's stage buffers fill by bulk copies; fill g (counted over
     * all windows) goes to buffer g % STAGES and completes phase g /
     * STAGES of its barrier. */
    uint64_t *bar = sm_bar + warp * STAGES;
    if (lane == 0)
        for (int i = 0; i < STAGES; i++)
            mbar_init(&bar[i]);
    __syncwarp();
    int fills = 0;

    for (int w0 = 0; w0 < nbv; w0 += WIN) {
        /* The window's selected blocks, ascending, compacted. */
        int flag[4], cnt = 0;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int b = w0 + 4 * tid + q;
            flag[q] = b < nbv && (sg.always || selected(w0 == 0 ? key0[q] : keys[b], sg.first_block + b, sl.x,
                                                        (int32_t)sl.y));
            cnt += flag[q];
        }
        int n_list;
        int pos = block_scan<THREADS>(cnt, &n_list, sm_scan);
#pragma unroll
        for (int q = 0; q < 4; q++)
            if (flag[q])
                sm_list[pos++] = w0 + 4 * tid + q;
        __syncthreads();

        const int n_tiles = (n_list + TB - 1) / TB;
        const int n_mine = first_t < n_tiles ? (n_tiles - first_t + stride_t - 1) / stride_t : 0;
        /* Tile k's records, one bulk copy each, issued by lane 0 once the
         * warp is done with the buffer's previous tile. */
        auto issue = [&](int k) {
            if (k < n_mine && lane == 0) {
                const int slot = (fills + k) % STAGES;
                const int li0 = (first_t + k * stride_t) * TB;
                const int nblk = n_list - li0 < TB ? n_list - li0 : TB;
                uint8_t *dst = stage0 + slot * tile_bytes;
                fence_to_bulk();
                mbar_expect_bytes(&bar[slot], (uint32_t)(nblk * rec));
                for (int s = 0; s < nblk; s++)
                    bulk_copy(dst + s * rstride, src_seg + (int64_t)sm_list[li0 + s] * rec, (uint32_t)rec, &bar[slot]);
            }
        };
#pragma unroll
        for (int k = 0; k < STAGES - 1; k++)
            issue(k);

        for (int k = 0; k < n_mine; k++) {
            issue(k + STAGES - 1);
            const int g = fills + k;
            mbar_wait(&bar[g % STAGES], (uint32_t)(g / STAGES) & 1u);
            const uint8_t *buf = stage0 + (g % STAGES) * tile_bytes;
            const int li0 = (first_t + k * stride_t) * TB;
            /* Token t of the tile: block slot t >> bs, row t & (B - 1); which
             * of the 16 count, found once per tile (lane t % 16 asks).  The
             * same lane describes its token's K (lanes 0-15) or V (16-31)
             * vector chunk by chunk: where the chunk's first value sits in
             * the stage buffer and its 8 bitmap bits; tokens that do not
             * count get empty bitmaps, hence zero rows. */
            uint32_t vmask;
            {
                const int t = m_tok, li = li0 + (t >> bs);
                bool ok = false;
                if (li < n_list) {
                    const int64_t tok = sg.start + ((int64_t)sm_list[li] << bs) + (t & (B - 1));
                    ok = tok <= jb.pos && tok < seg_end;
                }
                vmask = __ballot_sync(FULL, ok) & 0xffffu;
                const int r0 = (t >> bs) * rstride, row = t & (B - 1);
                const uint32_t *mp = reinterpret_cast<const uint32_t *>(buf + r0 + m_mask) + row * m_words;
                uint32_t at = (uint32_t)(r0 + m_vals + 2 * row * m_r);
                uint32_t *mo = meta + (m_tensor * TILE + t) * CHS;
#pragma unroll
                for (int w = 0; w < NW; w++) {
                    const uint32_t word = ok && w < m_words ? mp[w] : 0u;
#pragma unroll
                    for (int b = 0; b < 4; b++) {
                        const uint32_t m8 = word >> (8 * b) & 0xffu;
                        mo[4 * w + b] = at | m8 << 16;
                        at += 2 * __popc(m8);
                    }
                }
                __syncwarp();
            }
            auto valid = [&](int t) { return (vmask >> t & 1u) != 0; };
            auto chunk = [&](int tensor, int t, int ch) {
                const uint32_t x = meta[(tensor * TILE + t) * CHS + ch];
                return expand8(reinterpret_cast<const uint16_t *>(buf + (x & 0xffffu)), x >> 16);
            };
            uint4 kr[2][KJ];
#pragma unroll
            for (int j = 0; j < KJ; j++) {
                kr[0][j] = chunk(0, half_a_token(n), 4 * j + c);
                kr[1][j] = chunk(0, half_b_token(n), 4 * j + c);
            }
            float s[4];
            tile_scores<KJ, false>(qr, kr, s);
#pragma unroll
            for (int u = 0; u < 4; u++)
                s[u] = valid(4 * c + u) ? s[u] * qsc.y : -INFINITY;
            uint32_t pa[4];
            softmax_step<NT, false, true>(s, m_run, l_run, o, pa);

            uint4 vr[4][VH];
#pragma unroll
            for (int u = 0; u < 4; u++)
#pragma unroll
                for (int h = 0; h < VH; h++)
                    vr[u][h] = chunk(1, 4 * c + u, n + 8 * h);
            tile_pv<DVMAX, false>(pa, vr, o);
            __syncwarp();   /* the buffer is refilled by the next issue */
        }
        fills += n_mine;
        __syncthreads();   /* the list is rebuilt for the next window */
    }

    /* Fold the warps' states (rotated space), then rotate back once: this
     * thread's row of R_v is loaded first, its latency behind the fold.
     * Every warp is past the last window's barrier, every copy consumed:
     * sm_o may overwrite the stage buffers. */
    const uint16_t *R = sg.rv_off >= 0 ? a.rotations + sg.rv_off : nullptr;
    rot_frags<D, DVMAX> rf;
    rot_frags_load<D, DVMAX>(R, sg.dv, rf);
    l_run += __shfl_xor_sync(FULL, l_run, 1);
    l_run += __shfl_xor_sync(FULL, l_run, 2);
#pragma unroll
    for (int t = 0; t < NT; t++) {
        sm_o[warp][n][out_channel(t, 2 * c)] = o[t][0] + o[t][2];
        sm_o[warp][n][out_channel(t, 2 * c + 1)] = o[t][1] + o[t][3];
    }
    if (c == 0) {
        sm_m[warp][n] = m_run;
        sm_l[warp][n] = l_run;
    }
    __syncthreads();
    /* In place into warp 0's rows: each element is read and written by the
     * same thread. */
    for (int idx = tid; idx < G * DVMAX; idx += THREADS) {
        const int g = idx / DVMAX, ch = idx % DVMAX;
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < WARPS; w++)
            mx = fmaxf(mx, sm_m[w][g]);
        float l = 0.f, acc = 0.f;
        if (mx != -INFINITY) {
#pragma unroll
            for (int w = 0; w < WARPS; w++) {
                const float f = fast_exp2(sm_m[w][g] - mx);
                l += sm_l[w][g] * f;
                acc += sm_o[w][g][ch] * f;
            }
        }
        sm_o[0][g][ch] = acc;
        if (ch == 0) {
            sm_m[WARPS][g] = mx;
            sm_l[WARPS][g] = l;
        }
    }
    __syncthreads();
    const size_t slot = (size_t)jb.slot0 + 1 + (size_t)it.y * a.nparts + it.z;
    float *out = a.part_o + slot * G * D;
    rotate_back<D, DVMAX>(sm_o[0], rf, R != nullptr, G, out);
    if (tid < G)
        a.part_ml[slot * G + tid] = make_float2(sm_m[WARPS][tid], sm_l[WARPS][tid]);
}

/* ----------------------------------------------------------- launch helpers */

bool pdl_enabled()
{
    const char *e = getenv("MKV_NO_PDL");
    return !(e && *e && *e != '0');
}

template <typename K, typename A>
cudaError_t launch(K kernel, unsigned grid, unsigned block, size_t smem, cudaStream_t st, bool pdl, const A &args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(block);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, args);
}

}  // namespace

/* -------------------------------------------------------------- the cache */

namespace mkv_packed {

/* Sanity check of a layout before upload, so that no kernel reads outside
 * a pool: the records of kernels/mkv_cuda.h as mkv_gpu_layout_build
 * (lib/mosaic/packed.h, the definition of the packed format) or the
 * benchmark builds them.  The stored format itself is checked when it is
 * loaded (mkv_mosaic_load). */
int check_layout(const mkv_packed_layout *l, mkv_error *err)
{
    const char *what = "packed cache";
    if (l == NULL)
        return mkv_fail(err, MKV_EUSAGE, "%s: NULL layout", what);
    const int D = l->head_dim, B = l->block;
    if (D != 64 && D != 128)
        return mkv_fail(err, MKV_EUNSUP, "%s: head_dim %d; the GPU kernels support head_dim 64 and 128", what, D);
    if (B != 1 && B != 2 && B != 4 && B != 8 && B != 16)
        return mkv_fail(err, MKV_EUNSUP, "%s: block of %d tokens; the GPU kernel takes 1, 2, 4, 8 or 16", what, B);
    if (l->n_heads < 1 || l->heads == NULL || l->n_segs < 0 || (l->n_segs > 0 && l->segs == NULL))
        return mkv_fail(err, MKV_EUSAGE, "%s: no heads or no segment table", what);
    if (l->n_segs > INT32_MAX)
        return mkv_fail(err, MKV_EUNSUP, "%s: %lld segments, too many", what, (long long)l->n_segs);
    for (int h = 0; h < l->n_heads; h++) {
        const mkv_packed_head *hd = &l->heads[h];
        if (hd->T < 0 || hd->T > INT32_MAX || hd->sink_n < 0 || hd->recent_n < 0
            || (int64_t)hd->sink_n + hd->recent_n > hd->T || hd->dense_row < 0
            || hd->dense_row + hd->sink_n + hd->recent_n > l->n_dense_rows)
            return mkv_fail(err, MKV_EUSAGE, "%s: head %d: dense rows or length out of range", what, h);
        if (hd->ring < 0 || (hd->ring > 0 && hd->ring >= hd->recent_n))
            return mkv_fail(err, MKV_EUSAGE, "%s: head %d: ring %d outside its %d recent rows", what, h, hd->ring,
                            hd->recent_n);
        if (hd->first_seg < 0 || hd->n_seg < 0 || (int64_t)hd->first_seg + hd->n_seg > l->n_segs)
            return mkv_fail(err, MKV_EUSAGE, "%s: head %d: segment rows %d..%d outside the table of %lld", what, h,
                            hd->first_seg, hd->first_seg + hd->n_seg, (long long)l->n_segs);
        int64_t blocks = 0, prev_end = hd->sink_n;
        for (int i = 0; i < hd->n_seg; i++) {
            const mkv_packed_seg *s = &l->segs[hd->first_seg + i];
            const int64_t nb = (s->len + B - 1) / B;
            const bool last = i == hd->n_seg - 1;
#define BAD(...) mkv_fail(err, MKV_EUSAGE, "%s: head %d segment %d: " __VA_ARGS__)
            if ((s->always || s->open) && !last)
                return BAD("a temporary region or open segment must be the head's last segment", what, h, i);
            if (s->always && s->open)
                return BAD("a temporary region is not an open segment", what, h, i);
            if (s->len < 0 || s->start < prev_end || (s->always && s->start < hd->T)
                || (!s->always && s->start + s->len > hd->T - hd->recent_n))
                return BAD("tokens %lld..%lld out of order or outside the packed range", what, h, i,
                           (long long)s->start, (long long)(s->start + s->len));
            if (s->first_block != blocks || (s->always || s->open ? s->n_blocks < nb : s->n_blocks != nb))
                return BAD("block numbering: first %d, %d blocks; expected %lld, %lld", what, h, i, s->first_block,
                           s->n_blocks, (long long)blocks, (long long)nb);
            if (s->dk < 32 || s->dk > D || s->dk % 32 || s->dv < 32 || s->dv > D || s->dv % 32 || s->rk < 1
                || s->rk > s->dk || s->rv < 1 || s->rv > s->dv)
                return BAD("channels dk %d, dv %d (multiples of 32 up to %d), values rk %d, rv %d", what, h, i,
                           s->dk, s->dv, D, s->rk, s->rv);
            if ((s->rk_off < 0 && s->dk != D) || (s->rv_off < 0 && s->dv != D))
                return BAD("an unrotated tensor keeps all %d channels", what, h, i, D);
            if (s->dpk < s->rk || s->dpk > s->dk || s->dpv < s->rv || s->dpv > s->dv)
                return BAD("d' of %d (K) and %d (V) channels outside r..dk", what, h, i, s->dpk, s->dpv);
            const int64_t kv = (int64_t)B * s->rk * 2, km = (int64_t)B * ((s->dpk + 31) / 32) * 4;
            const int64_t vv = (int64_t)B * s->rv * 2, vm = (int64_t)B * (s->dv / 32) * 4;
            if (s->rec_bytes % 16 || s->kmask_off % 16 || s->vval_off % 16 || s->vmask_off % 16 || s->kmask_off < kv
                || s->vval_off < s->kmask_off + km || s->vmask_off < s->vval_off + vv
                || s->rec_bytes < s->vmask_off + vm || s->rec_bytes > 65536)
                return BAD("record parts (%d, %d, %d of %d bytes) overlap or are not 16-byte aligned", what, h, i,
                           s->kmask_off, s->vval_off, s->vmask_off, s->rec_bytes);
            if (s->rec_off < 0 || s->rec_off % 16 || (uint64_t)s->rec_off + (uint64_t)s->n_blocks * s->rec_bytes > l->record_bytes)
                return BAD("records outside the record pool", what, h, i);
            if (!s->always
                && (s->kdim < 1 || s->kdim > s->dk || s->kbound < 0 || s->kbound > s->kdim || s->bk_width % 8
                    || s->bk_width < s->kdim + s->kbound || s->bk_width > 256))
                return BAD("block keys of %d channels, %d bounded, rows of %d (at most 256, a multiple of 8)", what, h,
                           i, s->kdim, s->kbound, s->bk_width);
            if (!s->always
                && (s->bk_off < 0 || s->bk_off % 8
                    || (uint64_t)s->bk_off + (uint64_t)s->n_blocks * s->bk_width > l->n_blockkeys))
                return BAD("block keys outside their pool", what, h, i);
            if ((s->rk_off >= 0 && (s->rk_off % 8 || (uint64_t)s->rk_off + (uint64_t)D * s->dk > l->n_rotations))
                || (s->rv_off >= 0 && (s->rv_off % 8 || (uint64_t)s->rv_off + (uint64_t)D * s->dv > l->n_rotations)))
                return BAD("rotations outside their pool", what, h, i);
#undef BAD
            blocks += s->n_blocks;
            prev_end = s->start + s->len;
        }
        if (blocks != hd->n_blocks || blocks > INT32_MAX / 2)
            return mkv_fail(err, MKV_EUSAGE, "%s: head %d has %lld blocks, its table says %d", what, h,
                            (long long)blocks, hd->n_blocks);
    }
    return MKV_OK;
}

int cache_alloc(const mkv_packed_layout *l, mkv_packed_cache **out, mkv_error *err)
{
    *out = NULL;
    int rc = check_layout(l, err);
    if (rc != MKV_OK)
        return rc;
    mkv_packed_cache *c = new (std::nothrow) mkv_packed_cache;
    if (c == NULL)
        return mkv_fail(err, MKV_ENOMEM, "packed cache: out of host memory");
    try {
        c->heads.assign(l->heads, l->heads + l->n_heads);
        c->segs.assign(l->segs, l->segs + l->n_segs);
    } catch (const std::bad_alloc &) {
        delete c;
        return mkv_fail(err, MKV_ENOMEM, "packed cache: out of host memory");
    }
    c->head_dim = l->head_dim;
    c->block = l->block;
    c->record_bytes = l->record_bytes;
    c->n_blockkeys = l->n_blockkeys;
    c->n_rotations = l->n_rotations;
    c->n_dense_rows = l->n_dense_rows;
    const size_t dense = (size_t)l->n_dense_rows * l->head_dim * 2;
    struct { mkv_device_buffer *b; size_t bytes; } allocs[] = {
        {&c->d_heads, sizeof(mkv_packed_head) * (size_t)l->n_heads},
        {&c->d_segs, sizeof(mkv_packed_seg) * (size_t)l->n_segs},
        {&c->records, l->record_bytes},
        {&c->blockkeys, l->n_blockkeys * 2},
        {&c->rotations, l->n_rotations * 2},
        {&c->dense_k, dense},
        {&c->dense_v, dense},
    };
    for (auto &a : allocs) {
        cudaError_t e = a.b->alloc(a.bytes);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            delete c;
            return mkv_fail(err, e == cudaErrorMemoryAllocation ? MKV_ENOMEM : MKV_EGPU,
                            "packed cache: cudaMalloc(%zu): %s", a.bytes, cudaGetErrorString(e));
        }
    }
    cudaError_t e = cudaMemcpy(c->d_heads.ptr, l->heads, sizeof(mkv_packed_head) * (size_t)l->n_heads,
                               cudaMemcpyHostToDevice);
    if (e == cudaSuccess && l->n_segs > 0)
        e = cudaMemcpy(c->d_segs.ptr, l->segs, sizeof(mkv_packed_seg) * (size_t)l->n_segs, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        delete c;
        return mkv_fail(err, MKV_EGPU, "packed cache: tables: %s", cudaGetErrorString(e));
    }
    *out = c;
    return MKV_OK;
}

int cache_sync_seg(mkv_packed_cache *c, int64_t row, cudaStream_t st, mkv_error *err)
{
    MKV_CUDA_CHECK(cudaMemcpyAsync(c->d_segs.as<mkv_packed_seg>() + row, &c->segs[(size_t)row],
                                   sizeof(mkv_packed_seg), cudaMemcpyHostToDevice, st));
    MKV_CUDA_CHECK(cudaStreamSynchronize(st));
    return MKV_OK;
}

}  // namespace mkv_packed

extern "C" int mkv_cuda_mosaic_upload(const mkv_packed_layout *l, mkv_packed_cache **out, mkv_error *err)
{
    if (out == NULL)
        return mkv_fail(err, MKV_EUSAGE, "packed cache: NULL result pointer");
    *out = NULL;
    mkv_packed_cache *c = NULL;
    int rc = cache_alloc(l, &c, err);
    if (rc != MKV_OK)
        return rc;
    const size_t dense = (size_t)l->n_dense_rows * l->head_dim * 2;
    struct { void *dst; const void *src; size_t bytes; } copies[] = {
        {c->records.ptr, l->records, l->record_bytes},
        {c->blockkeys.ptr, l->blockkeys, l->n_blockkeys * 2},
        {c->rotations.ptr, l->rotations, l->n_rotations * 2},
        {c->dense_k.ptr, l->dense_k, dense},
        {c->dense_v.ptr, l->dense_v, dense},
    };
    for (auto &cp : copies)
        if (cp.src != NULL && cp.bytes > 0) {
            cudaError_t e = cudaMemcpy(cp.dst, cp.src, cp.bytes, cudaMemcpyHostToDevice);
            if (e != cudaSuccess) {
                delete c;
                return mkv_fail(err, MKV_EGPU, "packed cache: upload: %s", cudaGetErrorString(e));
            }
        }
    *out = c;
    return MKV_OK;
}

extern "C" void mkv_cuda_mosaic_free(mkv_packed_cache *c) { delete c; }

extern "C" int mkv_cuda_mosaic_pools(mkv_packed_cache *c, mkv_packed_pools *p, mkv_error *err)
{
    if (c == NULL || p == NULL)
        return mkv_fail(err, MKV_EUSAGE, "packed cache: NULL cache or pools");
    p->records = c->records.ptr;
    p->blockkeys = c->blockkeys.as<uint16_t>();
    p->rotations = c->rotations.as<uint16_t>();
    p->dense_k = c->dense_k.as<uint16_t>();
    p->dense_v = c->dense_v.as<uint16_t>();
    return MKV_OK;
}

extern "C" uint64_t mkv_cuda_mosaic_bytes(const mkv_packed_cache *c)
{
    if (c == NULL)
        return 0;
    return c->record_bytes + 2 * (c->n_blockkeys + c->n_rotations) + 4ull * c->n_dense_rows * c->head_dim
        + sizeof(mkv_packed_head) * c->heads.size() + sizeof(mkv_packed_seg) * c->segs.size()
        + (c->has_bk8 ? c->bk8_bytes + 4 * c->n_bk8_rows + sizeof(bk8_place) * c->segs.size() : 0);
}

extern "C" int mkv_cuda_mosaic_blockkeys8(mkv_packed_cache *c, mkv_error *err)
{
    const char *what = "8-bit block keys";
    if (c == NULL)
        return mkv_fail(err, MKV_EUSAGE, "%s: NULL cache", what);
    if (c->bk16_dropped)
        return mkv_fail(err, MKV_EUSAGE, "%s: the fp16 rows they are made from were dropped", what);
    std::vector<bk8_place> at;
    try {
        at.resize(c->segs.size() + 1);
    } catch (const std::bad_alloc &) {
        return mkv_fail(err, MKV_ENOMEM, "%s: out of host memory", what);
    }
    int64_t bytes = 0, rows = 0;
    for (size_t i = 0; i < c->segs.size(); i++) {
        const mkv_packed_seg &s = c->segs[i];
        at[i] = bk8_place{bytes, rows};
        if (!s.always) {
            bytes += (int64_t)s.n_blocks * bk8_row_bytes(s.bk_width);
            rows += s.n_blocks;
        }
    }
    c->has_bk8 = false;
    struct { mkv_device_buffer *b; size_t bytes; } allocs[] = {
        {&c->bk8, (size_t)bytes},
        {&c->bk8_scales, sizeof(float) * (size_t)rows},
        {&c->bk8_at, sizeof(bk8_place) * c->segs.size()},
    };
    for (auto &a : allocs) {
        cudaError_t e = a.b->alloc(a.bytes);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return mkv_fail(err, e == cudaErrorMemoryAllocation ? MKV_ENOMEM : MKV_EGPU, "%s: cudaMalloc(%zu): %s",
                            what, a.bytes, cudaGetErrorString(e));
        }
    }
    if (!c->segs.empty()) {
        MKV_CUDA_CHECK(cudaMemcpy(c->bk8_at.ptr, at.data(), sizeof(bk8_place) * c->segs.size(), cudaMemcpyHostToDevice));
        blockkeys8_kernel<<<(unsigned)c->segs.size(), 256>>>(c->d_segs.as<mkv_packed_seg>(), c->bk8_at.as<bk8_place>(),
                                                             c->blockkeys.as<uint16_t>(), c->bk8.as<uint8_t>(),
                                                             c->bk8_scales.as<float>());
        MKV_CUDA_CHECK_LAUNCH();
        MKV_CUDA_CHECK(cudaDeviceSynchronize());
    }
    c->bk8_bytes = (size_t)bytes;
    c->n_bk8_rows = (size_t)rows;
    c->has_bk8 = true;
    return MKV_OK;
}

extern "C" int mkv_cuda_mosaic_blockkeys8_rows(const mkv_packed_cache *c, int64_t seg, int64_t first, int64_t n,
                                               int8_t *codes, float *scales, mkv_error *err)
{
    if (c == NULL || !c->has_bk8 || seg < 0 || seg >= (int64_t)c->segs.size())
        return mkv_fail(err, MKV_EUSAGE, "8-bit block keys: NULL cache, none made, or no segment %lld", (long long)seg);
    const mkv_packed_seg &s = c->segs[(size_t)seg];
    if (s.always || first < 0 || n < 0 || first + n > s.n_blocks)
        return mkv_fail(err, MKV_EUSAGE, "8-bit block keys: segment %lld has no rows %lld..%lld", (long long)seg,
                        (long long)first, (long long)(first + n - 1));
    bk8_place pl;
    MKV_CUDA_CHECK(cudaMemcpy(&pl, c->bk8_at.as<bk8_place>() + seg, sizeof pl, cudaMemcpyDeviceToHost));
    const size_t rb = (size_t)bk8_row_bytes(s.bk_width);
    if (codes && n)
        MKV_CUDA_CHECK(cudaMemcpy(codes, c->bk8.as<uint8_t>() + pl.code_off + (size_t)first * rb, (size_t)n * rb,
                                  cudaMemcpyDeviceToHost));
    if (scales && n)
        MKV_CUDA_CHECK(cudaMemcpy(scales, c->bk8_scales.as<float>() + pl.scale_off + first, sizeof(float) * (size_t)n,
                                  cudaMemcpyDeviceToHost));
    return MKV_OK;
}

extern "C" int mkv_cuda_mosaic_drop_blockkeys16(mkv_packed_cache *c, mkv_error *err)
{
    if (c == NULL || !c->has_bk8)
        return mkv_fail(err, MKV_EUSAGE, "fp16 block keys: NULL cache, or no 8-bit ones to score with instead");
    MKV_CUDA_CHECK(cudaDeviceSynchronize());   /* no kernel still reads them */
    c->blockkeys.release();
    c->n_blockkeys = 0;
    c->bk16_dropped = true;
    return MKV_OK;
}

/* ---------------------------------------------------------------- the plan */

struct mkv_packed_plan {
    const mkv_packed_cache *c = nullptr;
    mkv_packed_params pp = {};
    int G = 0, n_jobs = 0, nparts = 1, seg_max = 1, dkmax = 64, dvmax = 64, score_kj = 2;
    bool bk8 = false;   /* scoring reads the 8-bit block keys */
    int64_t kstride = 4;
    int stage_bytes = 16;
    float qscale = 0.f;
    std::vector<job_info> jobs;
    std::vector<int4> score_items;
    std::vector<int4> attend_items;
    mkv_device_buffer d_jobs, d_score_items, d_attend_items, keys, wts, hist, sel, qt;
    split_plan sp;   /* head_items, part_o, part_ml for merge_kernel */
    /* mkv_cuda_mosaic_plan_advance: the jobs staged in pinned memory (an
     * asynchronous copy from pageable memory would wait for the stream),
     * and the event of their last copy */
    job_info *staged = nullptr;
    cudaEvent_t staged_copied = nullptr;
    ~mkv_packed_plan()
    {
        if (staged)
            (void)cudaFreeHost(staged);
        if (staged_copied)
            (void)cudaEventDestroy(staged_copied);
    }
};

namespace {

using score_fn = void (*)(score_args);
using select_fn = void (*)(select_args);
using attend_fn = void (*)(attend_args);

template <int D, bool Q8>
score_fn score_kernel_of(int kj)
{
    return kj <= 2 ? score_kernel<D, 2, Q8> : kj <= 4 ? score_kernel<D, 4, Q8> : kj <= 5 ? score_kernel<D, 5, Q8>
                                                                                       : score_kernel<D, 8, Q8>;
}

score_fn score_kernel_for(int D, int kj, bool q8)
{
    if (D == 64)
        return q8 ? score_kernel_of<64, true>(kj) : score_kernel_of<64, false>(kj);
    return q8 ? score_kernel_of<128, true>(kj) : score_kernel_of<128, false>(kj);
}


attend_fn attend_kernel_for(int D, int dkmax, int dvmax)
{
    if (D == 64)
        return attend_kernel<64, 64, 64>;
    if (dkmax <= 64)
        return dvmax <= 64 ? attend_kernel<128, 64, 64> : attend_kernel<128, 64, 128>;
    return dvmax <= 64 ? attend_kernel<128, 128, 64> : attend_kernel<128, 128, 128>;
}

size_t attend_smem_for(int D, int dkmax, int dvmax, int stage_bytes)
{
    size_t b;
    if (dkmax <= 64)
        b = dvmax <= 64 ? attend_smem<64, 64>::total(stage_bytes) : attend_smem<64, 128>::total(stage_bytes);
    else
        b = dvmax <= 64 ? attend_smem<128, 64>::total(stage_bytes) : attend_smem<128, 128>::total(stage_bytes);
    return b > dense_smem(D) ? b : dense_smem(D);
}

}  // namespace

namespace {

/* A kernel's dynamic shared memory limit is one per function, for every
 * plan alive: raised to what a new plan needs, never lowered. */
cudaError_t raise_smem(const void *fn, size_t bytes)
{
    static std::vector<std::pair<const void *, size_t>> limits;
    for (auto &l : limits)
        if (l.first == fn) {
            if (bytes <= l.second)
                return cudaSuccess;
            const cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
            if (e == cudaSuccess)
                l.second = bytes;
            return e;
        }
    const cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e == cudaSuccess)
        limits.emplace_back(fn, bytes);
    return e;
}

/* What a plan's buffers and kernel builds must hold, over its jobs. */
struct job_extent {
    int32_t rec_most = 16, dkmax = 0, dvmax = 0, score_kj = 0;
    int32_t blocks_most = 4;   /* blocks of the jobs' heads, room to grow included */
};

/* The job of cache head hi for a query at pos (tokens 0..pos); false when
 * pos is outside the head's tokens. */
bool make_job(const mkv_packed_cache *c, double budget_param, int32_t hi, int64_t pos, job_info &jb, job_extent &e)
{
    const int B = c->block;
    const mkv_packed_head &hd = c->heads[(size_t)hi];
    int64_t end = hd.T;
    if (hd.n_seg > 0 && c->segs[(size_t)(hd.first_seg + hd.n_seg - 1)].always) {
        const mkv_packed_seg &t = c->segs[(size_t)(hd.first_seg + hd.n_seg - 1)];
        end = t.len > 0 ? t.start + t.len : end;
    }
    if (pos < 0 || pos >= end)
        return false;
    jb.pos = pos;
    jb.head = hi;
    e.blocks_most = hd.n_blocks > e.blocks_most ? hd.n_blocks : e.blocks_most;
    const int64_t n_tok = pos + 1;
    int64_t fixed = 0, cand = 0;
    /* dense rows: sink rows then recent rows (in ring order: all of them
     * are visible whenever the newest is) */
    const int64_t sink_vis = hd.sink_n < n_tok ? hd.sink_n : n_tok;
    int64_t rec_vis = n_tok - (hd.T - hd.recent_n);
    rec_vis = rec_vis < 0 ? 0 : rec_vis > hd.recent_n ? hd.recent_n : rec_vis;
    jb.nd_vis = (int32_t)(sink_vis + rec_vis);
    fixed += jb.nd_vis;
    jb.seg_vis = 0;
    jb.nb_vis = 0;
    for (int s = 0; s < hd.n_seg; s++) {
        const mkv_packed_seg &sg = c->segs[(size_t)(hd.first_seg + s)];
        const int64_t vb = visible_blocks(sg, B, pos);
        if (vb == 0)
            break;
        jb.seg_vis = s + 1;
        jb.nb_vis = (int32_t)(sg.first_block + vb);
        int64_t toks = (pos < sg.start + sg.len ? pos + 1 : sg.start + sg.len) - sg.start;
        if (sg.always)
            fixed += toks;
        else
            cand += toks;
        e.rec_most = sg.rec_bytes > e.rec_most ? sg.rec_bytes : e.rec_most;
        e.dkmax = sg.dk > e.dkmax ? sg.dk : e.dkmax;
        e.dvmax = sg.dv > e.dvmax ? sg.dv : e.dvmax;
        if (!sg.always && (sg.bk_width + 31) / 32 > e.score_kj)
            e.score_kj = (sg.bk_width + 31) / 32;
    }
    const int64_t budget = mkv_budget_tokens(budget_param, n_tok);
    jb.need = (int32_t)(budget - fixed > -1 ? budget - fixed : -1);
    jb.cand_w = (int32_t)cand;
    return true;
}

}  // namespace

extern "C" int mkv_cuda_mosaic_plan(const mkv_packed_cache *c, const mkv_packed_params *pp, const int32_t *heads,
                                    const int64_t *pos, mkv_packed_plan **out, mkv_error *err)
{
    const char *what = "packed attention";
    if (out == NULL)
        return mkv_fail(err, MKV_EUSAGE, "%s: NULL plan pointer", what);
    *out = NULL;
    if (c == NULL || pp == NULL || heads == NULL || pos == NULL)
        return mkv_fail(err, MKV_EUSAGE, "%s: NULL cache, parameters, heads or positions", what);
    if (pp->batch < 1 || pp->n_kv_heads < 1 || pp->n_heads < 1 || pp->n_heads % pp->n_kv_heads)
        return mkv_fail(err, MKV_EUSAGE, "%s: batch %d, %d query heads, %d KV heads", what, pp->batch, pp->n_heads,
                        pp->n_kv_heads);
    const int G = pp->n_heads / pp->n_kv_heads;
    if (G > MAX_G)
        return mkv_fail(err, MKV_EUNSUP, "%s: %d query heads per KV head; the GPU kernels take 1 to %d", what, G,
                        MAX_G);
    if (!(pp->budget > 0) || isinf(pp->budget))
        return mkv_fail(err, MKV_EUSAGE, "%s: budget %g must be > 0 (<= 1: fraction, > 1: tokens)", what,
                        pp->budget);
    if (!(pp->scale >= 0) || isinf(pp->scale))
        return mkv_fail(err, MKV_EUSAGE, "%s: scale %g must be finite and >= 0", what, pp->scale);
    if (pp->blockkey_bits != 0 && pp->blockkey_bits != 16 && pp->blockkey_bits != 8)
        return mkv_fail(err, MKV_EUSAGE, "%s: block keys of %d bits; 16 or 8", what, pp->blockkey_bits);
    if (pp->blockkey_bits != 8 && c->bk16_dropped)
        return mkv_fail(err, MKV_EUSAGE, "%s: the cache keeps only 8-bit block keys (blockkey_bits 8)", what);
    if (pp->blockkey_bits == 8 && !c->has_bk8)
        return mkv_fail(err, MKV_EUSAGE, "%s: 8-bit block keys asked for, the cache has none (mkv_cuda_mosaic_blockkeys8)",
                        what);
    const int64_t n_jobs = (int64_t)pp->batch * pp->n_kv_heads;
    if (n_jobs > 65535)
        return mkv_fail(err, MKV_EUNSUP, "%s: batch x KV heads = %lld; at most 65535", what, (long long)n_jobs);
    const int D = c->head_dim, B = c->block;

    mkv_packed_plan *p = new (std::nothrow) mkv_packed_plan;
    if (p == NULL)
        return mkv_fail(err, MKV_ENOMEM, "%s: out of host memory", what);
    std::unique_ptr<mkv_packed_plan> hold(p);
    p->c = c;
    p->pp = *pp;
    p->G = G;
    p->n_jobs = (int)n_jobs;
    p->bk8 = pp->blockkey_bits == 8;
    const double scale = pp->scale > 0 ? pp->scale : 1.0 / sqrt((double)D);
    p->qscale = (float)(scale * 1.4426950408889634);

    int32_t nb_most = 4;
    int64_t total_seg_items = 0, total_need = 0;
    job_extent ext;
    try {
        p->jobs.resize((size_t)n_jobs);
        for (int b = 0; b < pp->batch; b++)
            for (int h = 0; h < pp->n_kv_heads; h++) {
                const int64_t j = (int64_t)b * pp->n_kv_heads + h;
                const int32_t hi = heads[j];
                if (hi < 0 || hi >= (int)c->heads.size())
                    return mkv_fail(err, MKV_EUSAGE, "%s: request %d KV head %d: no cache head %d", what, b, h, hi);
                job_info &jb = p->jobs[(size_t)j];
                if (!make_job(c, pp->budget, hi, pos[b], jb, ext))
                    return mkv_fail(err, MKV_EUSAGE, "%s: request %d: position %lld outside the cache's tokens",
                                    what, b, (long long)pos[b]);
                nb_most = jb.nb_vis > nb_most ? jb.nb_vis : nb_most;
                p->seg_max = jb.seg_vis > p->seg_max ? jb.seg_vis : p->seg_max;
                total_seg_items += jb.seg_vis;
                total_need += jb.need > 0 ? jb.need : 0;
            }
    } catch (const std::bad_alloc &) {
        return mkv_fail(err, MKV_ENOMEM, "%s: out of host memory", what);
    }
    p->dkmax = ext.dkmax <= 64 ? 64 : 128;
    p->dvmax = ext.dvmax <= 64 ? 64 : 128;
    if (D == 64)
        p->dkmax = p->dvmax = 64;
    /* score kernel builds: rows of 64, 128, 160 or 256 channels */
    p->score_kj = ext.score_kj <= 2 ? 2 : ext.score_kj <= 4 ? 4 : ext.score_kj <= 5 ? 5 : 8;
    /* keys for every block of the heads: a growing head's plan advances without a new allocation */
    p->kstride = ((int64_t)(ext.blocks_most > nb_most ? ext.blocks_most : nb_most) + 3) / 4 * 4;
    p->stage_bytes = (TILE / B) * (ext.rec_most + REC_GAP);

    const attend_fn ak = attend_kernel_for(D, p->dkmax, p->dvmax);
    const size_t smem = attend_smem_for(D, p->dkmax, p->dvmax, p->stage_bytes);
    int dev = 0, sms = 1, per_sm = 0, smem_max = 0;
    MKV_CUDA_CHECK(cudaGetDevice(&dev));
    MKV_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    MKV_CUDA_CHECK(cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (smem > (size_t)smem_max)
        return mkv_fail(err, MKV_EUNSUP, "%s: records of %d bytes need %zu bytes of shared memory, the device has %d",
                        what, ext.rec_most, smem, smem_max);
    MKV_CUDA_CHECK(raise_smem((const void *)ak, smem));
    MKV_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, ak, THREADS, smem));
    /* score_kernel: R_k (up to 128 x 128 fp16, padded rows) or the
     * histogram, and the block-key stages: may pass the 48 KB default. */
    MKV_CUDA_CHECK(raise_smem((const void *)score_kernel_for(D, p->score_kj, p->bk8),
                              score_smem(D, p->dkmax, p->score_kj, p->bk8)));
    /* Parts per segment: enough items for two waves of the attention
     * kernel, as long as each part keeps a few tiles per warp. */
    {
        const int64_t resident = (int64_t)sms * (per_sm > 0 ? per_sm : 1);
        int64_t parts = total_seg_items > 0 ? (2 * resident + total_seg_items - 1) / total_seg_items : 1;
        const int64_t tiles_per_seg = total_seg_items > 0 ? total_need / B / (TILE / B) / total_seg_items : 0;
        const int64_t cap = tiles_per_seg / (2 * WARPS) > 1 ? tiles_per_seg / (2 * WARPS) : 1;
        parts = parts < cap ? parts : cap;
        p->nparts = (int)(parts < 1 ? 1 : parts > 16 ? 16 : parts);
    }

    std::vector<int2> head_items((size_t)n_jobs);
    int64_t slots = 0;
    try {
        /* The dense tokens' items first: they start while selection runs. */
        for (int64_t j = 0; j < n_jobs; j++)
            p->attend_items.push_back(make_int4((int)j, 0, -1, 0));
        for (int64_t j = 0; j < n_jobs; j++) {
            job_info &jb = p->jobs[(size_t)j];
            jb.slot0 = (int32_t)slots;
            const int64_t count = 1 + (int64_t)jb.seg_vis * p->nparts;
            head_items[(size_t)j] = make_int2((int)slots, (int)count);
            slots += count;
            for (int s = 0; s < jb.seg_vis; s++) {
                const int row = c->heads[(size_t)jb.head].first_seg + s;
                p->score_items.push_back(make_int4((int)j, s, row, 0));
                for (int part = 0; part < p->nparts; part++)
                    p->attend_items.push_back(make_int4((int)j, s, part, row));
            }
        }
    } catch (const std::bad_alloc &) {
        return mkv_fail(err, MKV_ENOMEM, "%s: out of host memory", what);
    }
    if (slots > INT32_MAX / 2 || (int64_t)p->score_items.size() > INT32_MAX / 2)
        return mkv_fail(err, MKV_EUNSUP, "%s: %lld work items, too many", what, (long long)slots);

    const size_t nj = (size_t)n_jobs;
    struct { mkv_device_buffer *b; size_t bytes; } allocs[] = {
        {&p->d_jobs, sizeof(job_info) * nj},
        {&p->d_score_items, sizeof(int4) * (p->score_items.size() + 1)},
        {&p->d_attend_items, sizeof(int4) * (p->attend_items.size() + 1)},
        {&p->keys, sizeof(uint32_t) * nj * (size_t)p->kstride},
        {&p->wts, nj * (size_t)p->kstride},
        {&p->hist, sizeof(uint32_t) * nj * HIST_BINS},
        {&p->sel, sizeof(uint2) * nj},
        {&p->qt, sizeof(float) * nj * (size_t)p->seg_max * G * p->dkmax},
        {&p->sp.head_items, sizeof(int2) * nj},
        {&p->sp.part_o, sizeof(float) * (size_t)slots * G * D},
        {&p->sp.part_ml, sizeof(float2) * (size_t)slots * G},
    };
    for (auto &a : allocs) {
        cudaError_t e = a.b->alloc(a.bytes);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return mkv_fail(err, e == cudaErrorMemoryAllocation ? MKV_ENOMEM : MKV_EGPU, "%s: plan: cudaMalloc(%zu): %s",
                            what, a.bytes, cudaGetErrorString(e));
        }
    }
    MKV_CUDA_CHECK(cudaMemcpy(p->d_jobs.ptr, p->jobs.data(), sizeof(job_info) * nj, cudaMemcpyHostToDevice));
    if (!p->score_items.empty())
        MKV_CUDA_CHECK(cudaMemcpy(p->d_score_items.ptr, p->score_items.data(), sizeof(int4) * p->score_items.size(),
                                  cudaMemcpyHostToDevice));
    if (!p->attend_items.empty())
        MKV_CUDA_CHECK(cudaMemcpy(p->d_attend_items.ptr, p->attend_items.data(),
                                  sizeof(int4) * p->attend_items.size(), cudaMemcpyHostToDevice));
    MKV_CUDA_CHECK(cudaMemcpy(p->sp.head_items.ptr, head_items.data(), sizeof(int2) * nj, cudaMemcpyHostToDevice));
    MKV_CUDA_CHECK(cudaMemset(p->hist.ptr, 0, sizeof(uint32_t) * nj * HIST_BINS));
    MKV_CUDA_CHECK(cudaMemset(p->keys.ptr, 0, sizeof(uint32_t) * nj * (size_t)p->kstride));
    MKV_CUDA_CHECK(cudaMemset(p->wts.ptr, 0, nj * (size_t)p->kstride));
    p->sp.n_items = (int)slots;
    *out = hold.release();
    return MKV_OK;
}

extern "C" void mkv_cuda_mosaic_plan_free(mkv_packed_plan *p) { delete p; }

extern "C" int mkv_cuda_mosaic_plan_advance(mkv_packed_plan *p, const int64_t *pos, void *stream, int *replan,
                                            mkv_error *err)
{
    if (p == NULL || pos == NULL || replan == NULL)
        return mkv_fail(err, MKV_EUSAGE, "packed attention: NULL plan, positions or result");
    *replan = 0;
    const mkv_packed_params &pp = p->pp;
    std::vector<job_info> jobs;
    try {
        jobs = p->jobs;
    } catch (const std::bad_alloc &) {
        return mkv_fail(err, MKV_ENOMEM, "packed attention: out of host memory");
    }
    job_extent ext;
    for (int b = 0; b < pp.batch; b++)
        for (int h = 0; h < pp.n_kv_heads; h++) {
            job_info &jb = jobs[(size_t)b * pp.n_kv_heads + h];
            const int32_t seg_vis = jb.seg_vis;
            if (!make_job(p->c, pp.budget, jb.head, pos[b], jb, ext))
                return mkv_fail(err, MKV_EUSAGE, "packed attention: request %d: position %lld outside the cache's tokens",
                                b, (long long)pos[b]);
            /* the work items, the selection's keys and q~ were laid out for these */
            if (jb.seg_vis != seg_vis || jb.nb_vis > p->kstride) {
                *replan = 1;
                return MKV_OK;
            }
        }
    if ((ext.dkmax > 64 && p->dkmax == 64) || (ext.dvmax > 64 && p->dvmax == 64) || ext.score_kj > p->score_kj
        || (TILE / p->c->block) * (ext.rec_most + REC_GAP) > p->stage_bytes) {
        *replan = 1;
        return MKV_OK;
    }
    const size_t bytes = sizeof(job_info) * jobs.size();
    if (p->staged == nullptr) {
        MKV_CUDA_CHECK(cudaMallocHost((void **)&p->staged, bytes));
        MKV_CUDA_CHECK(cudaEventCreateWithFlags(&p->staged_copied, cudaEventDisableTiming));
    } else {
        MKV_CUDA_CHECK(cudaEventSynchronize(p->staged_copied));   /* the last step's copy has left */
    }
    p->jobs.swap(jobs);
    memcpy(p->staged, p->jobs.data(), bytes);
    MKV_CUDA_CHECK(cudaMemcpyAsync(p->d_jobs.ptr, p->staged, bytes, cudaMemcpyHostToDevice, (cudaStream_t)stream));
    MKV_CUDA_CHECK(cudaEventRecord(p->staged_copied, (cudaStream_t)stream));
    return MKV_OK;
}

extern "C" int mkv_cuda_mosaic_select(const mkv_packed_plan *p, const float *q, void *stream, mkv_error *err)
{
    const char *what = "packed selection";
    if (p == NULL)
        return mkv_fail(err, MKV_EUSAGE, "%s: NULL plan", what);
    int rc = check_aligned(q, "q", what, err);
    if (rc != MKV_OK)
        return rc;
    const mkv_packed_cache *c = p->c;
    cudaStream_t st = (cudaStream_t)stream;
    const bool pdl = pdl_enabled();
    if (!p->score_items.empty()) {
        const unsigned n_items = (unsigned)p->score_items.size();
        score_args a = {};
        a.segs = c->d_segs.as<mkv_packed_seg>();
        a.blockkeys = c->blockkeys.as<uint16_t>();
        a.rotations = c->rotations.as<uint16_t>();
        a.bk8 = c->bk8.as<uint8_t>();
        a.bk8_scales = c->bk8_scales.as<float>();
        a.bk8_at = c->bk8_at.as<bk8_place>();
        a.jobs = p->d_jobs.as<job_info>();
        a.items = p->d_score_items.as<int4>();
        a.q = q;
        a.qt = p->qt.as<float>();
        a.keys = p->keys.as<uint32_t>();
        a.wts = p->wts.as<uint8_t>();
        a.hist = p->hist.as<uint32_t>();
        a.kstride = p->kstride;
        a.seg_max = p->seg_max;
        a.qt_width = p->dkmax;
        a.G = p->G;
        a.block = c->block;
        a.agg_sum = p->pp.agg_sum != 0;
        a.qscale = p->qscale;
        /* The first kernel of a step waits for everything before it (the
         * previous step still reads the q~, keys and histograms this step
         * rewrites): launched plainly. */
        MKV_CUDA_CHECK(launch(score_kernel_for(c->head_dim, p->score_kj, p->bk8), n_items, THREADS,
                              score_smem(c->head_dim, p->dkmax, p->score_kj, p->bk8), st, false, a));
    }
    select_args s = {};
    s.jobs = p->d_jobs.as<job_info>();
    s.keys = p->keys.as<uint32_t>();
    s.wts = p->wts.as<uint8_t>();
    s.hist = p->hist.as<uint32_t>();
    s.sel = p->sel.as<uint2>();
    s.kstride = p->kstride;
    MKV_CUDA_CHECK(launch(select_kernel, (unsigned)p->n_jobs, SEL_THREADS, 0, st,
                          pdl && !p->score_items.empty(), s));
    return MKV_OK;
}

extern "C" int mkv_cuda_mosaic_attend(const mkv_packed_plan *p, const float *q, float *out, void *stream,
                                      mkv_error *err)
{
    const char *what = "packed attention";
    if (p == NULL)
        return mkv_fail(err, MKV_EUSAGE, "%s: NULL plan", what);
    int rc;
    if ((rc = check_aligned(q, "q", what, err)) || (rc = check_aligned(out, "out", what, err)))
        return rc;
    const mkv_packed_cache *c = p->c;
    cudaStream_t st = (cudaStream_t)stream;
    if (!p->attend_items.empty()) {
        attend_args a = {};
        a.heads = c->d_heads.as<mkv_packed_head>();
        a.segs = c->d_segs.as<mkv_packed_seg>();
        a.dense_k = c->dense_k.as<uint16_t>();
        a.dense_v = c->dense_v.as<uint16_t>();
        a.q = q;
        a.qscale = p->qscale;
        a.records = c->records.as<uint8_t>();
        a.rotations = c->rotations.as<uint16_t>();
        a.jobs = p->d_jobs.as<job_info>();
        a.items = p->d_attend_items.as<int4>();
        a.qt = p->qt.as<float>();
        a.keys = p->keys.as<uint32_t>();
        a.sel = p->sel.as<uint2>();
        a.part_o = p->sp.part_o.as<float>();
        a.part_ml = p->sp.part_ml.as<float2>();
        a.kstride = p->kstride;
        a.seg_max = p->seg_max;
        a.G = p->G;
        a.block = c->block;
        a.bshift = __builtin_ctz((unsigned)c->block);
        a.nparts = p->nparts;
        a.stage_bytes = p->stage_bytes;
        MKV_CUDA_CHECK(launch(attend_kernel_for(c->head_dim, p->dkmax, p->dvmax), (unsigned)p->attend_items.size(),
                              THREADS, attend_smem_for(c->head_dim, p->dkmax, p->dvmax, p->stage_bytes), st, pdl_enabled(), a));
    }
    /* merge_kernel does not wait programmatically: launched plainly. */
    return launch_merge(&p->sp, p->pp.batch, p->pp.n_kv_heads, p->G, c->head_dim, out, st, err);
}

extern "C" int mkv_cuda_mosaic_run(const mkv_packed_plan *p, const float *q, float *out, void *stream, mkv_error *err)
{
    int rc = mkv_cuda_mosaic_select(p, q, stream, err);
    return rc != MKV_OK ? rc : mkv_cuda_mosaic_attend(p, q, out, stream, err);
}

extern "C" int mkv_cuda_mosaic_selection(const mkv_packed_plan *p, int request, int kv_head, uint8_t *blocks,
                                         uint8_t *attended, mkv_packed_counts *counts, mkv_error *err)
{
    if (p == NULL || request < 0 || request >= p->pp.batch || kv_head < 0 || kv_head >= p->pp.n_kv_heads)
        return mkv_fail(err, MKV_EUSAGE, "packed selection: no request %d, KV head %d in the plan", request, kv_head);
    const size_t j = (size_t)request * p->pp.n_kv_heads + kv_head;
    const job_info &jb = p->jobs[j];
    const mkv_packed_cache *c = p->c;
    const mkv_packed_head &hd = c->heads[(size_t)jb.head];
    const int B = c->block, D = c->head_dim;
    std::vector<uint32_t> keys;
    uint2 sel = make_uint2(0, 0);
    try {
        keys.resize((size_t)jb.nb_vis + 1);
    } catch (const std::bad_alloc &) {
        return mkv_fail(err, MKV_ENOMEM, "packed selection: out of host memory");
    }
    MKV_CUDA_CHECK(cudaDeviceSynchronize());
    if (jb.nb_vis > 0)
        MKV_CUDA_CHECK(cudaMemcpy(keys.data(), p->keys.as<uint32_t>() + j * (size_t)p->kstride,
                                  sizeof(uint32_t) * (size_t)jb.nb_vis, cudaMemcpyDeviceToHost));
    MKV_CUDA_CHECK(cudaMemcpy(&sel, p->sel.as<uint2>() + j, sizeof sel, cudaMemcpyDeviceToHost));
    mkv_packed_counts ct = {};
    ct.dense_tokens = jb.nd_vis;
    ct.tokens = jb.nd_vis;
    /* bytes: q, the dense rows, then per segment below */
    uint64_t bytes = (uint64_t)p->G * D * 4 + (uint64_t)jb.nd_vis * D * 2 * 2;
    ct.scoring_bytes = (uint64_t)p->G * D * 4;
    if (attended) {
        const int64_t end = jb.pos + 1;
        for (int64_t t = 0; t < end; t++)
            attended[t] = 0;
        for (int r = 0; r < jb.nd_vis; r++)
            attended[r < hd.sink_n ? r : hd.T - hd.recent_n + (r - hd.sink_n)] = 1;
    }
    for (int s = 0; s < jb.seg_vis; s++) {
        const mkv_packed_seg &sg = c->segs[(size_t)(hd.first_seg + s)];
        const int64_t vb = visible_blocks(sg, B, jb.pos);
        int64_t taken = 0;
        ct.segments++;
        if (!sg.always) {
            ct.scored_blocks += vb;
            /* block keys (8-bit: codes and scale); key written and read back */
            const uint64_t row = p->bk8 ? (uint64_t)bk8_row_bytes(sg.bk_width) + 4 : (uint64_t)sg.bk_width * 2;
            uint64_t sb = (uint64_t)vb * (row + 8);
            if (sg.rk_off >= 0)
                sb += (uint64_t)D * sg.dk * 2;
            bytes += sb;
            ct.scoring_bytes += sb;
        }
        for (int64_t b = 0; b < vb; b++) {
            const int32_t id = (int32_t)(sg.first_block + b);
            const bool in = sg.always || selected(keys[(size_t)id], id, sel.x, (int32_t)sel.y);
            if (blocks)
                blocks[id] = in;
            if (!in)
                continue;
            taken++;
            const int w = block_weight(sg, b, B, jb.pos);
            ct.tokens += w;
            if (attended)
                for (int64_t t = sg.start + b * B; t < sg.start + b * B + w; t++)
                    attended[t] = 1;
        }
        ct.blocks += taken;
        bytes += (uint64_t)taken * sg.rec_bytes;
        if (taken > 0) {
            ct.segments_attended++;
            if (sg.rv_off >= 0)
                bytes += (uint64_t)p->nparts * D * sg.dv * 2;
        }
    }
    if (blocks)
        for (int64_t id = jb.nb_vis; id < hd.n_blocks; id++)
            blocks[id] = 0;
    ct.device_bytes = bytes;
    if (counts)
        *counts = ct;
    return MKV_OK;
}
