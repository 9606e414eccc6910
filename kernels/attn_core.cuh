/* Device code shared by the decode-attention kernels (dense_attend.cu,
 * quest_attend.cu): one query token per request, 16-bit K/V, fp32
 * accumulation, GQA with up to 8 query heads per KV head.
 *
 * Work layout.  A request's K and V rows for one KV head are cut into tiles
 * of 16 tokens.  The tiles of a (request, KV head) are split into chunks
 * (flash-decoding); one block of 4 warps takes one chunk ("item"), its warps
 * take every 4th tile, and each warp keeps its own online-softmax state.  At
 * the end the block folds its 4 warp states into one partial (m, l, acc)
 * per query head, and merge_kernel folds the partials of each (request,
 * query head) into the output.
 *
 * Tensor cores for both products.  Per tile, S = Q K^T and O += P V are
 * mma.m16n8k16 with fp32 accumulation.  The 16 rows of the A operand are
 * the group's query heads (rows 0..7) and, in rows 8..15, the rounding
 * residual of the same heads: q = q_hi + q_lo with q_hi the 16-bit rounding
 * of q and q_lo the 16-bit rounding of q - q_hi, likewise p = p_hi + p_lo.
 * The padding rows that decode leaves idle thus carry the low half, and the
 * products see ~16 significant bits of q and p instead of 8 (bf16) for free.
 *
 * Registers straight from global memory, no shared-memory staging:
 *  - K: lane (n = lane/4, c = lane%4) loads 16-byte chunks 4j+c of the
 *    n-th token of each 8-token half of the tile (B operand column n); a
 *    chunk feeds two k16 steps.  q.k allows any channel permutation as long
 *    as q follows it, and q's fragments are built in the same order.
 *  - V: lane (n, c) loads chunks n (+8) of tokens 4c..4c+3, so it holds,
 *    for 16 channels, the four tokens that its B fragment pairs up: a byte
 *    permute per register makes the fragment, no shuffles.
 *  - The two 8-token halves of S are assigned tokens so that the C
 *    fragment of S is, element for element, the A fragment P needs (tokens
 *    4c..4c+3 of head row n in lane (n, c)).
 * Every warp load is 16 bytes per lane, each instruction reading whole
 * 32-byte sectors; the next tile's K is issued right after S consumed this
 * tile's K, the next V right after P V, so 8 KB per warp stay in flight.
 *
 * Paged (Quest): tiles come from a per-(request, KV head) list of pages;
 * a page may be attended whole or only for its sink and recent tokens. */
#ifndef MKV_ATTN_CORE_CUH
#define MKV_ATTN_CORE_CUH

#include <stdint.h>
#include <math.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda_check.h"
#include "mkv_cuda.h"

namespace mkv_attn {

constexpr int TILE = 16;           /* tokens per warp step */
constexpr int WARPS = 4;           /* warps per block of the split kernel */
constexpr int THREADS = WARPS * 32;
constexpr int MAX_G = 8;           /* query heads per KV head (A rows 0..7) */
/* Blocks per multiprocessor the attention kernels are built for (see
 * split_kernel): 2 (q in registers) timed faster than 3 (q in shared
 * memory) on every shape of docs/BENCHMARKS.md run 1, by 1-13%. */
constexpr int ATTN_MINB = 2;
constexpr int MERGE_THREADS = 256;   /* merge_kernel: 32 channels x 8 slot lanes */

/* ------------------------------------------------------------ small pieces */

/* 16 bytes of streamed data: read once, so keep it out of L1; ask L2 to
 * fetch the whole 256-byte row segment.  Volatile keeps the load inside
 * its validity branch (a load past the buffer must never execute). */
__device__ __forceinline__ uint4 ld_stream(const void *p)
{
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

__device__ __forceinline__ float fast_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));   /* exp2(-inf) = +0 */
    return y;
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel)
{
    return __byte_perm(a, b, sel);
}
/* Low 16 bits of a and b -> {a.lo, b.lo}; high halves -> {a.hi, b.hi}. */
constexpr uint32_t PRMT_LO = 0x5410u, PRMT_HI = 0x7632u;

/* x, y -> hi = {16-bit(x), 16-bit(y)} (x in the low half), lo = the same
 * for the residuals x - hi.x, y - hi.y. */
template <bool BF16>
__device__ __forceinline__ void split2(float x, float y, uint32_t &hi, uint32_t &lo)
{
    if (BF16) {
        __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
        float2 hf = __bfloat1622float2(h);
        __nv_bfloat162 l = __floats2bfloat162_rn(x - hf.x, y - hf.y);
        hi = *reinterpret_cast<uint32_t *>(&h);
        lo = *reinterpret_cast<uint32_t *>(&l);
    } else {
        __half2 h = __floats2half2_rn(x, y);
        float2 hf = __half22float2(h);
        __half2 l = __floats2half2_rn(x - hf.x, y - hf.y);
        hi = *reinterpret_cast<uint32_t *>(&h);
        lo = *reinterpret_cast<uint32_t *>(&l);
    }
}

/* D (16x8, fp32) += A (16x16) B (16x8), 16-bit inputs. */
template <bool BF16>
__device__ __forceinline__ void mma(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    if (BF16)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Token (0..15 within a tile) that lane group n loads for the first and
 * second 8-token half of S: the C fragment of S then holds tokens
 * 4c..4c+3 in lane (n, c). */
__device__ __forceinline__ int half_a_token(int n) { return 4 * (n >> 1) + (n & 1); }
__device__ __forceinline__ int half_b_token(int n) { return 4 * (n >> 1) + 2 + (n & 1); }

/* A fragments of q for one 16-byte key chunk: v holds the chunk's 8
 * channels of this lane's head (zeros for padding heads); f[t] is the A
 * operand of the k16 step that uses registers 2t, 2t+1 of the chunk:
 * {hi of ch 4t,4t+1; lo of them; hi of ch 4t+2,4t+3; lo of them}. */
template <bool BF16>
__device__ __forceinline__ void q_fragments(const float v[8], uint32_t f[2][4])
{
#pragma unroll
    for (int t = 0; t < 2; t++) {
        split2<BF16>(v[4 * t], v[4 * t + 1], f[t][0], f[t][1]);
        split2<BF16>(v[4 * t + 2], v[4 * t + 3], f[t][2], f[t][3]);
    }
}

/* S for one tile: kr[half][j] is this lane's chunk 4j+c of its token in
 * each half; qf(j, t, a) yields the A fragment of chunk j, step t.
 * s[u] = score of token 4c+u for head row n (hi + lo rows). */
template <int KJ, bool BF16, class QF>
__device__ __forceinline__ void tile_scores(QF qf, const uint4 kr[2][KJ], float s[4])
{
    float ca[4] = {}, cb[4] = {};
#pragma unroll
    for (int j = 0; j < KJ; j++) {
        uint32_t f0[4], f1[4];
        qf(j, 0, f0);
        qf(j, 1, f1);
        mma<BF16>(ca, f0, kr[0][j].x, kr[0][j].y);
        mma<BF16>(cb, f0, kr[1][j].x, kr[1][j].y);
        mma<BF16>(ca, f1, kr[0][j].z, kr[0][j].w);
        mma<BF16>(cb, f1, kr[1][j].z, kr[1][j].w);
    }
    s[0] = ca[0] + ca[2];
    s[1] = ca[1] + ca[3];
    s[2] = cb[0] + cb[2];
    s[3] = cb[1] + cb[3];
}

/* The A fragments of q kept in registers. */
template <int KJ>
struct q_regs {
    uint32_t f[KJ][2][4];
    __device__ __forceinline__ void operator()(int j, int t, uint32_t a[4]) const
    {
        a[0] = f[j][t][0]; a[1] = f[j][t][1]; a[2] = f[j][t][2]; a[3] = f[j][t][3];
    }
};

/* The A fragments of q in shared memory, [j][t][lane] (one 16-byte read
 * per lane and step, conflict-free): 32 registers fewer. */
struct q_shared {
    const uint4 *f;   /* this lane's entry of [j][t][32] */
    __device__ __forceinline__ void operator()(int j, int t, uint32_t a[4]) const
    {
        const uint4 x = f[(2 * j + t) * 32];
        a[0] = x.x; a[1] = x.y; a[2] = x.z; a[3] = x.w;
    }
};

/* Load K chunks of one tile starting at token `start`; tokens that are
 * not `valid` are not read (their scores are masked later). */
template <int D, class VALID>
__device__ __forceinline__ void load_k(const uint16_t *K, int64_t start, VALID valid, int n, int c,
                                       uint4 kr[2][D / 32])
{
    const int64_t ta = start + half_a_token(n), tb = start + half_b_token(n);
    const bool va = valid(ta), vb = valid(tb);
    const uint4 *ra = reinterpret_cast<const uint4 *>(K + ta * D);
    const uint4 *rb = reinterpret_cast<const uint4 *>(K + tb * D);
#pragma unroll
    for (int j = 0; j < D / 32; j++) {
        if (va)
            kr[0][j] = ld_stream(ra + 4 * j + c);
        if (vb)
            kr[1][j] = ld_stream(rb + 4 * j + c);
    }
}

/* Load V chunks n (and n + 8) of tokens start + 4c + u; zeros for tokens
 * that are not `valid` (p = 0 there, and 0 * garbage could be NaN). */
template <int D, class VALID>
__device__ __forceinline__ void load_v(const uint16_t *V, int64_t start, VALID valid, int n, int c,
                                       uint4 vr[4][D / 64])
{
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const int64_t t = start + 4 * c + u;
        const bool ok = valid(t);
        const uint4 *row = reinterpret_cast<const uint4 *>(V + t * D);
#pragma unroll
        for (int h = 0; h < D / 64; h++) {
            vr[u][h] = make_uint4(0, 0, 0, 0);
            if (ok)
                vr[u][h] = ld_stream(row + n + 8 * h);
        }
    }
}

/* Tokens before len. */
struct below_len {
    int64_t len;
    __device__ __forceinline__ bool operator()(int64_t t) const { return t < len; }
};

/* O += P V for one tile.  o[8h + e] is the n-tile of channels
 * 8 (n' + 8h) + e, n' = 0..7 its columns. */
template <int D, bool BF16>
__device__ __forceinline__ void tile_pv(const uint32_t pa[4], const uint4 vr[4][D / 64], float o[D / 8][4])
{
#pragma unroll
    for (int h = 0; h < D / 64; h++) {
        const uint32_t r0[4] = {vr[0][h].x, vr[0][h].y, vr[0][h].z, vr[0][h].w};
        const uint32_t r1[4] = {vr[1][h].x, vr[1][h].y, vr[1][h].z, vr[1][h].w};
        const uint32_t r2[4] = {vr[2][h].x, vr[2][h].y, vr[2][h].z, vr[2][h].w};
        const uint32_t r3[4] = {vr[3][h].x, vr[3][h].y, vr[3][h].z, vr[3][h].w};
#pragma unroll
        for (int r = 0; r < 4; r++) {
            mma<BF16>(o[8 * h + 2 * r], pa, prmt(r0[r], r1[r], PRMT_LO), prmt(r2[r], r3[r], PRMT_LO));
            mma<BF16>(o[8 * h + 2 * r + 1], pa, prmt(r0[r], r1[r], PRMT_HI), prmt(r2[r], r3[r], PRMT_HI));
        }
    }
}

/* The online-softmax step of one tile: s[u] (token 4c + u of head row n,
 * -inf where not attended) against the running max m_run and sum l_run
 * (a tile with no valid token must not make exp2(-inf - -inf)); o is
 * rescaled, with LAZY only when some row's max moved (a vote and a branch
 * per tile: worth it where tiles cost many instructions, a register
 * spill in the dense kernel's 3-block build); pa gets P's A fragments for
 * tile_pv. */
template <int NT, bool BF16, bool LAZY>
__device__ __forceinline__ void softmax_step(const float s[4], float &m_run, float &l_run, float o[NT][4],
                                             uint32_t pa[4])
{
    float mt = fmaxf(fmaxf(s[0], s[1]), fmaxf(s[2], s[3]));
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
    const float m_new = fmaxf(m_run, mt);
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    const float alpha = fast_exp2(m_run - m_use);
    float p[4];
#pragma unroll
    for (int u = 0; u < 4; u++)
        p[u] = fast_exp2(s[u] - m_use);
    l_run = l_run * alpha + ((p[0] + p[1]) + (p[2] + p[3]));
    m_run = m_new;
    if (!LAZY || __any_sync(0xffffffffu, alpha != 1.f))
#pragma unroll
        for (int t = 0; t < NT; t++) {
            o[t][0] *= alpha; o[t][1] *= alpha; o[t][2] *= alpha; o[t][3] *= alpha;
        }
    split2<BF16>(p[0], p[1], pa[0], pa[1]);
    split2<BF16>(p[2], p[3], pa[2], pa[3]);
}

/* Channel of column `col` (0..7) of output n-tile i. */
__host__ __device__ __forceinline__ int out_channel(int i, int col)
{
    return 8 * (col + 8 * (i >> 3)) + (i & 7);
}

/* --------------------------------------------------------- split kernel */

struct split_args {
    const uint16_t *k, *v;     /* [batch][n_kv][t_max][D] */
    const float *q;            /* [batch][n_kv * G][D] */
    const int4 *items;         /* {request, KV head, first tile, end tile} */
    const int64_t *len;        /* [batch] */
    /* paged only: */
    const int32_t *pages;      /* [batch][n_kv][list_max] ascending entries: page p attended
                                  whole, or -1 - p: only its sink and recent tokens */
    const int32_t *n_pages;    /* [batch][n_kv] entries in the list */
    const int2 *window;        /* [batch] {sink_end, recent_start}: tokens always attended are
                                  t < sink_end and t >= recent_start */
    int64_t t_max;
    int n_kv, G;
    int list_max, page_size, page_tiles;
    float qscale;              /* scale * log2(e): scores come out in log2 units */
    float *part_o;             /* [items][G][D] unnormalised accumulators */
    float2 *part_ml;           /* [items][G] (max, sum) in log2 units */
};

/* Tile i (0, 1, 2, ...) of a warp: the token it starts at and which of
 * its tokens count.  Dense tiles are consecutive; paged tiles come from
 * the page list, whose entries a warp prefetches 32 at a time, one per
 * lane, a batch ahead. */
template <bool PAGED>
struct tile_walk {
    int first, stride, end;          /* tile numbers first, first+stride, ... < end */
    const int32_t *list;
    int page_size, page_tiles;
    int cur, nxt;                    /* entries of tiles base .. base+31, next 32 (by lane) */

    __device__ int entry_of(int i, int lane) const
    {
        const int tile = first + (i + lane) * stride;
        return tile < end ? list[tile / page_tiles] : 0;
    }
    __device__ void init(int lane)
    {
        if (PAGED) {
            cur = entry_of(0, lane);
            nxt = entry_of(32, lane);
        }
    }
    /* Called with i = 0, 1, 2, ... in order by all lanes of the warp;
     * *whole: every token of the tile before len counts (paged: the page
     * was selected), else only the sink and recent ones. */
    __device__ int64_t start(int i, int lane, bool *whole)
    {
        const int tile = first + i * stride;
        *whole = true;
        if (!PAGED)
            return (int64_t)tile * TILE;
        if (i > 0 && (i & 31) == 0) {
            cur = nxt;
            nxt = entry_of(i + 32, lane);
        }
        const int e = __shfl_sync(0xffffffffu, cur, i & 31);
        *whole = e >= 0;
        const int page = e >= 0 ? e : -1 - e;
        return (int64_t)page * page_size + (int64_t)(tile % page_tiles) * TILE;
    }
};

/* Tokens a paged tile attends. */
struct in_window {
    int64_t len, sink_end, recent_start;
    bool whole;
    __device__ __forceinline__ bool operator()(int64_t t) const
    {
        return t < len && (whole || t < sink_end || t >= recent_start);
    }
};

template <int D, bool BF16, bool PAGED, int MINB>
__global__ void __launch_bounds__(THREADS, MINB) split_kernel(const split_args a)
{
    static_assert(D == 64 || D == 128, "head_dim 64 or 128");
    constexpr int KJ = D / 32, VH = D / 64, NT = D / 8;
    constexpr bool Q_SHARED = MINB >= 3;
    __shared__ float sm_o[WARPS][MAX_G][D];
    __shared__ float sm_m[WARPS][MAX_G], sm_l[WARPS][MAX_G];
    __shared__ uint4 sm_q[Q_SHARED ? KJ * 2 * 32 : 1];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n = lane >> 2, c = lane & 3;
    const int4 it = a.items[blockIdx.x];
    const int b = it.x, h = it.y;
    const int64_t len = a.len[b];
    const size_t head = (size_t)b * a.n_kv + h;
    const uint16_t *K = a.k + head * (size_t)a.t_max * D;
    const uint16_t *V = a.v + head * (size_t)a.t_max * D;

    q_regs<KJ> qr;
    {
        const bool real = n < a.G;
        const float *qrow = a.q + (head * a.G + (real ? n : 0)) * D;
#pragma unroll
        for (int j = 0; j < KJ; j++) {
            float v[8] = {};
            if (real) {
                const float4 x = *reinterpret_cast<const float4 *>(qrow + 8 * (4 * j + c));
                const float4 y = *reinterpret_cast<const float4 *>(qrow + 8 * (4 * j + c) + 4);
                v[0] = x.x; v[1] = x.y; v[2] = x.z; v[3] = x.w;
                v[4] = y.x; v[5] = y.y; v[6] = y.z; v[7] = y.w;
#pragma unroll
                for (int e = 0; e < 8; e++)
                    v[e] *= a.qscale;
            }
            q_fragments<BF16>(v, qr.f[j]);
            if (Q_SHARED && warp == 0) {
#pragma unroll
                for (int t = 0; t < 2; t++)
                    sm_q[(2 * j + t) * 32 + lane] = make_uint4(qr.f[j][t][0], qr.f[j][t][1], qr.f[j][t][2], qr.f[j][t][3]);
            }
        }
    }
    if (Q_SHARED)
        __syncthreads();
    q_shared qs;
    qs.f = sm_q + lane;

    tile_walk<PAGED> walk;
    walk.first = it.z + warp;
    walk.stride = WARPS;
    walk.end = it.w;
    int2 win = make_int2(0, 0);
    if (PAGED) {
        /* The plan sized the items for the longest possible list. */
        const int listed = a.n_pages[head] * a.page_tiles;
        walk.end = it.w < listed ? it.w : listed;
        win = a.window[b];
    }
    walk.list = PAGED ? a.pages + head * a.list_max : nullptr;
    walk.page_size = a.page_size;
    walk.page_tiles = a.page_tiles;
    walk.init(lane);
    const int n_mine = walk.end - walk.first > 0 ? (walk.end - walk.first + WARPS - 1) / WARPS : 0;

    float m_run = -INFINITY, l_run = 0.f;
    float o[NT][4];
#pragma unroll
    for (int i = 0; i < NT; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    uint4 kr[2][KJ], vr[4][VH];
#pragma unroll
    for (int j = 0; j < KJ; j++)
        kr[0][j] = kr[1][j] = make_uint4(0, 0, 0, 0);

    /* Paged: which tokens of a tile count. */
    auto validity = [&](bool whole) {
        in_window w;
        w.len = len;
        w.sink_end = win.x;
        w.recent_start = win.y;
        w.whole = whole;
        return w;
    };

    int64_t start = 0;
    bool whole = true;
    if (n_mine > 0) {
        start = walk.start(0, lane, &whole);
        if (PAGED) {
            load_k<D>(K, start, validity(whole), n, c, kr);
            load_v<D>(V, start, validity(whole), n, c, vr);
        } else {
            load_k<D>(K, start, below_len{len}, n, c, kr);
            load_v<D>(V, start, below_len{len}, n, c, vr);
        }
    }
    for (int i = 0; i < n_mine; i++) {
        const bool more = i + 1 < n_mine;
        bool whole_next = true;
        const int64_t next = more ? walk.start(i + 1, lane, &whole_next) : 0;

        float s[4];
        if (Q_SHARED)
            tile_scores<KJ, BF16>(qs, kr, s);
        else
            tile_scores<KJ, BF16>(qr, kr, s);
        if (more) {
            if (PAGED)
                load_k<D>(K, next, validity(whole_next), n, c, kr);
            else
                load_k<D>(K, next, below_len{len}, n, c, kr);
        }

#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int64_t t = start + 4 * c + u;
            const bool ok = PAGED ? validity(whole)(t) : t < len;
            if (!ok)
                s[u] = -INFINITY;
        }
        /* A page attended only for a few sink or recent tokens may leave
         * a whole tile out: softmax_step takes a tile of -inf. */
        uint32_t pa[4];
        softmax_step<NT, BF16, false>(s, m_run, l_run, o, pa);
        tile_pv<D, BF16>(pa, vr, o);
        if (more) {
            if (PAGED)
                load_v<D>(V, next, validity(whole_next), n, c, vr);
            else
                load_v<D>(V, next, below_len{len}, n, c, vr);
        }
        start = next;
        whole = whole_next;
    }

    /* Fold the warps' states: head row n, rows n and n + 8 summed. */
    l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);
    l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);
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
    for (int idx = threadIdx.x; idx < a.G * D; idx += THREADS) {
        const int g = idx / D, ch = idx % D;
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
        const size_t slot = (size_t)blockIdx.x * a.G + g;
        a.part_o[slot * D + ch] = acc;
        if (ch == 0)
            a.part_ml[slot] = make_float2(mx, l);
    }
}

/* out[b][hq] = sum of the partials of (b, hq / G), normalised; zeros when
 * the request has no token.  One block per (request, query head, 32-channel
 * slice): its MERGE_THREADS threads are 32 channels x P slot lanes.  A
 * (request, head) may have hundreds of partials; one thread walking them in
 * turn would wait on a load per partial, P lanes with unrolled loads keep
 * many in flight. */
template <int D>
__global__ void __launch_bounds__(MERGE_THREADS) merge_kernel(const int2 *head_items, const float *part_o,
                                                              const float2 *part_ml, float *out, int n_kv, int G)
{
    constexpr int CW = 32, P = MERGE_THREADS / CW, NW = MERGE_THREADS / 32, CS = D / CW;
    __shared__ float sm_red[NW];
    __shared__ float sm_acc[P][CW];
    __shared__ float sm_l[P];
    const int hq_all = n_kv * G;
    const int bh = blockIdx.x / CS, cs = blockIdx.x % CS;
    const int b = bh / hq_all, hq = bh % hq_all;
    const int h = hq / G, g = hq % G;
    const int2 r = head_items[(size_t)b * n_kv + h];
    const int tid = threadIdx.x, lane = tid % CW, p = tid / CW, ch = cs * CW + lane;
    float mx = -INFINITY;
#pragma unroll 4
    for (int i = tid; i < r.y; i += MERGE_THREADS)
        mx = fmaxf(mx, part_ml[(size_t)(r.x + i) * G + g].x);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((tid & 31) == 0)
        sm_red[tid >> 5] = mx;
    __syncthreads();
    mx = sm_red[0];
#pragma unroll
    for (int w = 1; w < NW; w++)
        mx = fmaxf(mx, sm_red[w]);
    float l = 0.f, acc = 0.f;
    if (mx != -INFINITY) {
#pragma unroll 4
        for (int i = p; i < r.y; i += P) {
            const size_t slot = (size_t)(r.x + i) * G + g;
            const float2 ml = part_ml[slot];
            const float f = fast_exp2(ml.x - mx);
            l += ml.y * f;
            acc += part_o[slot * D + ch] * f;
        }
    }
    sm_acc[p][lane] = acc;
    if (lane == 0)
        sm_l[p] = l;
    __syncthreads();
    if (p == 0) {
#pragma unroll
        for (int q = 1; q < P; q++) {
            acc += sm_acc[q][lane];
            l += sm_l[q];
        }
        out[(size_t)bh * D + ch] = l > 0.f ? acc / l : 0.f;
    }
}

/* --------------------------------------------------------------- host side */

/* The work split of one call: items and, per (request, KV head), its first
 * item and item count; device copies plus the partial buffers. */
struct split_plan {
    int n_items = 0;
    int chunk_tiles = 0;
    mkv_device_buffer items, head_items, len, part_o, part_ml;
};

/* Cut tiles[b] tiles of each (request, KV head) into chunks so that all
 * items fit in one wave of `resident` blocks (chunks a multiple of WARPS
 * tiles), and upload the tables and allocate the partials. */
int build_split_plan(split_plan *sp, const int64_t *tiles, const int64_t *lengths, int batch, int n_kv,
                     int G, int D, int resident, mkv_error *err);

/* Check a shape: 1 <= G <= 8, head_dim 64 or 128, lengths within t_max. */
int check_shape(const mkv_attn_shape *s, const int64_t *lengths, const char *what, mkv_error *err);

/* Blocks of `kernel` (THREADS threads each) resident on the device at once. */
int resident_blocks(const void *kernel, int *resident, mkv_error *err);

/* MKV_EUSAGE unless p is a non-NULL, 16-byte aligned device pointer. */
int check_aligned(const void *p, const char *name, const char *what, mkv_error *err);

/* mkv_cuda_dense_plan with a chosen kernel variant (minb 2 or 3, see
 * split_kernel), for the benchmark. */
int dense_plan_variant(const mkv_attn_shape *s, const int64_t *lengths, int minb, mkv_dense_plan **out,
                       mkv_error *err);

/* Launch merge_kernel for a plan. */
int launch_merge(const split_plan *sp, int batch, int n_kv, int G, int D, float *out, cudaStream_t st,
                 mkv_error *err);

inline float qscale_of(const mkv_attn_shape *s)
{
    const double scale = s->scale > 0 ? s->scale : 1.0 / sqrt((double)s->head_dim);
    return (float)(scale * 1.4426950408889634);
}

/* ------------------------------------------------ selection pieces (Quest, packed) */

/* Order-preserving key of a score: larger score, larger key; never 0
 * (0 marks blocks that are not candidates); NaN ranks lowest. */
__device__ __forceinline__ uint32_t order_key(float s)
{
    if (s != s)
        return 1u;
    if (s == 0.f)
        s = 0.f;   /* -0 ties with +0 */
    uint32_t u = __float_as_uint(s);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return u < 1u ? 1u : u;
}

/* Exclusive prefix sum over a block of NT threads (a multiple of 32, at
 * most 1024); *total gets the sum.  All threads must call it; sh holds
 * NT / 32 ints. */
template <int NT>
__device__ int block_scan(int v, int *total, int *sh)
{
    constexpr int NW = NT / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o)
            x += y;
    }
    if (lane == 31)
        sh[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int w = lane < NW ? sh[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o)
                w += y;
        }
        if (lane < NW)
            sh[lane] = w;
    }
    __syncthreads();
    const int before = warp > 0 ? sh[warp - 1] : 0;
    *total = sh[NW - 1];
    __syncthreads();   /* sh is reused by the next call */
    return before + x - v;
}

}  // namespace mkv_attn

#endif
