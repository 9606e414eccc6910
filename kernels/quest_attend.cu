/* Quest-style decode attention on the GPU, with the selection rule of the
 * CPU Quest method (lib/methods/quest.c, lib/methods/baseline.h; restated in
 * kernels/mkv_cuda.h):
 *   meta_kernel    per page the elementwise min and max of the keys (once
 *                  per cache),
 *   score_kernel   page scores sum_i max(q_i min_i, q_i max_i) = q-.min +
 *                  q+.max, a dot product of length 2 head_dim, on the same
 *                  tensor-core path as the attention scores; max (or sum)
 *                  over the group's query heads; written as
 *                  order-preserving keys,
 *   select_kernel  per (request, KV head) a weighted radix select (12 + 12
 *                  + 8 bits, histograms in shared memory): pages in order
 *                  of descending score, ties to the lower page, are taken
 *                  until the tokens they add (their tokens that are not
 *                  sink or recent) reach the budget; then the ascending list
 *                  of pages to attend by block-wide scans,
 *   split_kernel   (attn_core.cuh) over the listed pages, and the merge. */
#include <cstring>
#include <new>
#include <vector>

#include "attn_core.cuh"

extern "C" {
#include "core/attn.h"
}

using namespace mkv_attn;

namespace {

constexpr int SEL_THREADS = 1024;   /* select_kernel: one block per request and head */
constexpr unsigned FULL = 0xffffffffu;

/* Per request: n tokens attended (a query at n - 1) of a cache of T; the
 * pages scored (first token < n); tokens t < sink_end and t >= recent_start
 * always attended; `need` = budget minus those, the tokens pages must add. */
struct req_info {
    int n, T, n_pages, sink_end, recent_start, need;
};

/* ---------------------------------------------------------------- metadata */

template <int D>
__global__ void meta_kernel(const uint16_t *k, uint16_t *meta, const req_info *info, int64_t t_max,
                            int64_t pages_max, int n_kv, int page_size, int is_bf16, size_t total)
{
    constexpr int CH = D / 8;   /* 16-byte chunks per row */
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        const int chunk = (int)(idx % CH);
        const int64_t page = (int64_t)((idx / CH) % (size_t)pages_max);
        const size_t head = idx / CH / (size_t)pages_max;
        const int64_t T = info[head / n_kv].T;
        const int64_t t0 = page * page_size;
        int64_t t1 = t0 + page_size;
        t1 = t1 < T ? t1 : T;
        uint16_t lo_bits[8] = {}, hi_bits[8] = {};
        float lo[8], hi[8];
        for (int e = 0; e < 8; e++) {
            lo[e] = INFINITY;
            hi[e] = -INFINITY;
        }
        const uint16_t *rows = k + head * (size_t)t_max * D + chunk * 8;
        for (int64_t t = t0; t < t1; t++) {
            const uint4 w = *reinterpret_cast<const uint4 *>(rows + t * D);
            const uint32_t r[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const uint16_t bits = (uint16_t)(r[e / 2] >> (16 * (e & 1)));
                const float x = is_bf16 ? __uint_as_float((uint32_t)bits << 16)
                                        : __half2float(__ushort_as_half(bits));
                if (x < lo[e]) { lo[e] = x; lo_bits[e] = bits; }
                if (x > hi[e]) { hi[e] = x; hi_bits[e] = bits; }
            }
        }
        uint16_t *out = meta + (head * (size_t)pages_max + page) * 2 * D + chunk * 8;
        uint4 a, b;
        a.x = lo_bits[0] | (uint32_t)lo_bits[1] << 16; a.y = lo_bits[2] | (uint32_t)lo_bits[3] << 16;
        a.z = lo_bits[4] | (uint32_t)lo_bits[5] << 16; a.w = lo_bits[6] | (uint32_t)lo_bits[7] << 16;
        b.x = hi_bits[0] | (uint32_t)hi_bits[1] << 16; b.y = hi_bits[2] | (uint32_t)hi_bits[3] << 16;
        b.z = hi_bits[4] | (uint32_t)hi_bits[5] << 16; b.w = hi_bits[6] | (uint32_t)hi_bits[7] << 16;
        *reinterpret_cast<uint4 *>(out) = a;
        *reinterpret_cast<uint4 *>(out + D) = b;
    }
}

/* ----------------------------------------------------------------- scoring */

struct score_args {
    const uint16_t *meta;       /* [batch][n_kv][pages_max][2D] */
    const float *q;
    const req_info *info;
    uint32_t *keys;             /* [batch][n_kv][pages_max] */
    int64_t pages_max;
    int n_kv, G, agg_sum;
};

/* One warp scores 16 pages per step exactly like 16 tokens of attention
 * scores, with "keys" the 2D-long metadata rows and the query [q-, q+]. */
template <int D, bool BF16>
__global__ void __launch_bounds__(THREADS) score_kernel(const score_args a)
{
    constexpr int DK = 2 * D, KJ = DK / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n = lane >> 2, c = lane & 3;
    const size_t head = blockIdx.y;
    const int b = (int)(head / a.n_kv);
    const int np = a.info[b].n_pages;
    const uint16_t *M = a.meta + head * (size_t)a.pages_max * DK;

    q_regs<KJ> qf;
    {
        const bool real = n < a.G;
        const float *qrow = a.q + (head * a.G + (real ? n : 0)) * D;
#pragma unroll
        for (int j = 0; j < KJ; j++) {
            const int k0 = 8 * (4 * j + c);        /* channel of [min | max] */
            const bool upper = k0 >= D;              /* max half: q+ */
            float v[8] = {};
            if (real) {
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const float x = qrow[(upper ? k0 - D : k0) + e];
                    v[e] = upper ? fmaxf(x, 0.f) : fminf(x, 0.f);
                }
            }
            q_fragments<BF16>(v, qf.f[j]);
        }
    }

    const int n_tiles = (np + TILE - 1) / TILE;
    uint4 kr[2][KJ] = {};
    for (int t = blockIdx.x * WARPS + warp; t < n_tiles; t += gridDim.x * WARPS) {
        load_k<DK>(M, (int64_t)t * TILE, below_len{np}, n, c, kr);
        float s[4];
        tile_scores<KJ, BF16>(qf, kr, s);
#pragma unroll
        for (int u = 0; u < 4; u++) {
            /* Padding head rows score 0: left out of the max, harmless to the sum. */
            float x = n < a.G || a.agg_sum ? s[u] : -INFINITY;
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
        if (n == 0) {
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int page = t * TILE + 4 * c + u;
                if (page < np)
                    a.keys[head * a.pages_max + page] = order_key(s[u]);
            }
        }
    }
}

/* --------------------------------------------------------------- selection */

/* Tokens page pg adds to the sink and recent ones, and whether it holds
 * any of those. */
__device__ __forceinline__ int page_weight(const req_info &r, int pg, int P, bool *touched)
{
    const int t0 = pg * P, t1 = t0 + P < r.n ? t0 + P : r.n;
    const int lo = t0 > r.sink_end ? t0 : r.sink_end;
    const int hi = t1 < r.recent_start ? t1 : r.recent_start;
    *touched = t0 < r.sink_end || t1 > r.recent_start;
    return hi > lo ? hi - lo : 0;
}

struct select_args {
    const uint32_t *keys;
    const req_info *info;
    int32_t *lists;          /* [batch][n_kv][pages_max] */
    int32_t *counts;         /* [batch][n_kv] entries */
    int32_t *tokens;         /* [batch][n_kv] tokens attended */
    int64_t pages_max;
    int n_kv, page_size;
};

__global__ void __launch_bounds__(SEL_THREADS, 1) select_kernel(const select_args a)
{
    __shared__ int hist[4096];
    __shared__ int sh[32];
    __shared__ int sh_digit, sh_above, sh_bin;
    const size_t head = blockIdx.x;
    const req_info r = a.info[head / a.n_kv];
    const int np = r.n_pages, P = a.page_size;
    const uint32_t *keys = a.keys + head * a.pages_max;
    const int tid = threadIdx.x, lane = tid & 31;

    /* Tokens pages can add at most: the non-sink, non-recent ones. */
    const int mid_end = r.n < r.recent_start ? r.n : r.recent_start;
    const int available = mid_end > r.sink_end ? mid_end - r.sink_end : 0;
    const bool any = r.need > 0;
    /* The page where the running sum of added tokens reaches `need`,
     * found digit by digit from the top of the keys with weighted
     * histograms: afterwards pages whose masked key exceeds prefix are in,
     * and of those equal to it, in page order, the ones whose running
     * weight before them is below rest. */
    int rest = r.need;
    uint32_t prefix = 0, mask = 0;
    if (any && r.need < available) {
        for (int pass = 0; pass < 3; pass++) {
            const int shift = pass == 0 ? 20 : pass == 1 ? 8 : 0;
            const int nb = pass == 2 ? 1 << 8 : 1 << 12;
            for (int i = tid; i < nb; i += SEL_THREADS)
                hist[i] = 0;
            __syncthreads();
            /* Four pages per thread and step: one 16-byte load of keys. */
            for (int base = 0; base < np; base += 4 * SEL_THREADS) {
                const int p0 = base + 4 * tid;
                uint4 kw = make_uint4(0, 0, 0, 0);
                if (p0 < np)   /* pages_max is a multiple of 4: the vector stays inside the row */
                    kw = *reinterpret_cast<const uint4 *>(keys + p0);
                const uint32_t kv[4] = {kw.x, kw.y, kw.z, kw.w};
#pragma unroll
                for (int qq = 0; qq < 4; qq++) {
                    const int pg = p0 + qq;
                    bool touched = false;
                    const int w = pg < np ? page_weight(r, pg, P, &touched) : 0;
                    const bool take = w > 0 && (kv[qq] & mask) == prefix;
                    const int d = take ? (int)((kv[qq] >> shift) & (uint32_t)(nb - 1)) : -1;
                    /* Scores cluster in few top bins: one atomic per distinct
                     * bin per warp for the (common) whole pages. */
                    const bool whole = take && w == P;
                    const unsigned peers = __match_any_sync(FULL, whole ? d : -1);
                    if (whole && lane == __ffs(peers) - 1)
                        atomicAdd(&hist[d], P * __popc(peers));
                    if (take && !whole)
                        atomicAdd(&hist[d], w);
                }
            }
            __syncthreads();
            int cnt[4], local = 0;
#pragma unroll
            for (int qq = 0; qq < 4; qq++) {
                const int rk = 4 * tid + qq;          /* rk-th bin from the top */
                cnt[qq] = rk < nb ? hist[nb - 1 - rk] : 0;
                local += cnt[qq];
            }
            int total;
            int before = block_scan<SEL_THREADS>(local, &total, sh);
#pragma unroll
            for (int qq = 0; qq < 4; qq++) {
                const int rk = 4 * tid + qq;
                if (rk < nb && before < rest && rest <= before + cnt[qq]) {
                    sh_digit = nb - 1 - rk;
                    sh_above = before;
                    sh_bin = cnt[qq];
                }
                before += cnt[qq];
            }
            __syncthreads();
            rest -= sh_above;
            prefix |= (uint32_t)sh_digit << shift;
            mask |= (uint32_t)(nb - 1) << shift;
            /* The whole bin is needed: its order inside no longer matters. */
            const bool whole_bin = sh_bin == rest;
            __syncthreads();
            if (whole_bin)
                break;
        }
    }

    int32_t *list = a.lists + head * a.pages_max;
    int run_eq = 0, run_out = 0, run_tok = 0;
    for (int base = 0; base < np; base += 4 * SEL_THREADS) {
        const int p0 = base + 4 * tid;
        uint4 kw = make_uint4(0, 0, 0, 0);
        if (p0 < np)   /* pages_max is a multiple of 4: the vector stays inside the row */
            kw = *reinterpret_cast<const uint4 *>(keys + p0);
        const uint32_t kv[4] = {kw.x, kw.y, kw.z, kw.w};
        bool valid[4], touched[4], gt[4], eq[4];
        int w[4], eq_w = 0;
#pragma unroll
        for (int qq = 0; qq < 4; qq++) {
            const int pg = p0 + qq;
            valid[qq] = pg < np;
            w[qq] = valid[qq] ? page_weight(r, pg, P, &touched[qq]) : 0;
            touched[qq] = valid[qq] && touched[qq];
            const uint32_t km = kv[qq] & mask;
            gt[qq] = valid[qq] && any && km > prefix;
            eq[qq] = valid[qq] && any && km == prefix;
            eq_w += eq[qq] ? w[qq] : 0;
        }
        int tot_eq;
        int eq_before = run_eq + block_scan<SEL_THREADS>(eq_w, &tot_eq, sh);
        bool sel[4], incl[4];
        int n_in = 0, tok = 0;
#pragma unroll
        for (int qq = 0; qq < 4; qq++) {
            sel[qq] = gt[qq] || (eq[qq] && eq_before < rest);
            eq_before += eq[qq] ? w[qq] : 0;
            incl[qq] = valid[qq] && (touched[qq] || sel[qq]);
            n_in += incl[qq];
            tok += sel[qq] ? w[qq] : 0;
        }
        int tot_in;
        int pos = run_out + block_scan<SEL_THREADS>(n_in, &tot_in, sh);
#pragma unroll
        for (int qq = 0; qq < 4; qq++)
            if (incl[qq])
                list[pos++] = sel[qq] ? p0 + qq : -1 - (p0 + qq);
        int tot_tok;
        (void)block_scan<SEL_THREADS>(tok, &tot_tok, sh);
        run_eq += tot_eq;
        run_out += tot_in;
        run_tok += tot_tok;
    }
    if (tid == 0) {
        const int fixed = r.sink_end + (r.n > r.recent_start ? r.n - r.recent_start : 0);
        a.counts[head] = run_out;
        a.tokens[head] = fixed + run_tok;
    }
}

}  // namespace

/* ------------------------------------------------------------------- plan */

struct mkv_quest_plan {
    mkv_attn_shape shape;
    mkv_quest_params qp;
    int G = 0;
    int64_t pages_max = 0;
    int page_tiles = 0;
    std::vector<req_info> info;
    std::vector<mkv_quest_counts> counts;
    mkv_device_buffer d_info, window, keys, lists, list_counts, tokens;
    split_plan sp;
    std::vector<int64_t> tiles;   /* per request: the attention tiles sp was split for */
    int sms = 1;
    int score_blocks_x = 1;
    /* mkv_cuda_quest_plan_advance: the requests' rule, windows and lengths
     * staged in pinned memory, and the event of their last copy */
    unsigned char *staged = nullptr;
    cudaEvent_t staged_copied = nullptr;
    ~mkv_quest_plan()
    {
        if (staged)
            (void)cudaFreeHost(staged);
        if (staged_copied)
            (void)cudaEventDestroy(staged_copied);
    }
};

/* Scoring: enough blocks per (request, KV head) to fill the device a few
 * times, no more than there are 16-page tiles for its warps. */
static int score_blocks(int sms, size_t heads, int64_t most_tiles)
{
    int64_t bx = (8 * (int64_t)sms + (int64_t)heads - 1) / (int64_t)heads;
    const int64_t need = (most_tiles + WARPS - 1) / WARPS;
    bx = bx < need ? bx : need;
    return bx < 1 ? 1 : (int)bx;
}

static const void *quest_attn_kernel(int D, int bf16)
{
    if (D == 64)
        return bf16 ? (const void *)split_kernel<64, true, true, ATTN_MINB> : (const void *)split_kernel<64, false, true, ATTN_MINB>;
    return bf16 ? (const void *)split_kernel<128, true, true, ATTN_MINB> : (const void *)split_kernel<128, false, true, ATTN_MINB>;
}

/* The selection rule of mkv_cuda.h (that of lib/methods/baseline.h) for one
 * request: the fixed part, and a bound on the pages a KV head can list. */
static void quest_rule(int64_t n, int64_t T, const mkv_quest_params *qp, req_info *ri, mkv_quest_counts *qc)
{
    const int64_t P = qp->page_size;
    const int64_t pages = (n + P - 1) / P;
    const int64_t sink_end = qp->sink < n ? qp->sink : n;
    const int64_t recent_start = T - qp->recent > sink_end ? T - qp->recent : sink_end;
    const int64_t fixed = sink_end + (n > recent_start ? n - recent_start : 0);
    const int64_t budget = n > 0 ? mkv_budget_tokens(qp->budget, n) : 0;
    const int64_t need = budget - fixed;
    /* Pages adding fewer than P tokens (sink, recent or last pages) and
     * pages holding sink or recent tokens. */
    int64_t low = 0, touched = 0;
    for (int64_t pg = 0; pg < pages; pg++) {
        const int64_t t0 = pg * P, t1 = t0 + P < n ? t0 + P : n;
        const int64_t lo = t0 > sink_end ? t0 : sink_end, hi = t1 < recent_start ? t1 : recent_start;
        low += (hi > lo ? hi - lo : 0) < P;
        touched += t0 < sink_end || t1 > recent_start;
    }
    /* Pages are taken until they add `need` tokens: at most ceil(need / P)
     * whole ones, plus any of the low ones. */
    int64_t cap = touched;
    if (need > 0) {
        cap = (need + P - 1) / P + low;
        cap = cap < pages ? cap : pages;
    }
    ri->n = (int)n;
    ri->T = (int)T;
    ri->n_pages = (int)pages;
    ri->sink_end = (int)sink_end;
    ri->recent_start = (int)(recent_start < INT32_MAX ? recent_start : INT32_MAX);
    ri->need = (int)need;
    qc->pages = pages;
    qc->always_tokens = fixed;
    qc->budget_tokens = budget;
    qc->max_pages = cap;
}

extern "C" int mkv_cuda_quest_plan(const mkv_attn_shape *s, const int64_t *lengths, const int64_t *cache_tokens,
                                   const mkv_quest_params *qp, mkv_quest_plan **out, mkv_error *err)
{
    const char *what = "Quest attention";
    if (out == NULL || qp == NULL)
        return mkv_fail(err, MKV_EUSAGE, "%s: NULL plan or parameters", what);
    *out = NULL;
    int rc = check_shape(s, lengths, what, err);
    if (rc != MKV_OK)
        return rc;
    if (qp->page_size < TILE || qp->page_size % TILE != 0 || qp->page_size > 4096)
        return mkv_fail(err, MKV_EUNSUP, "%s: page size %d; the GPU kernel takes multiples of %d up to 4096",
                        what, qp->page_size, TILE);
    if (qp->sink < 0 || qp->recent < 0)
        return mkv_fail(err, MKV_EUSAGE, "%s: sink %d and recent %d must be >= 0", what, qp->sink, qp->recent);
    if (!(qp->budget > 0) || isinf(qp->budget))
        return mkv_fail(err, MKV_EUSAGE, "%s: budget %g must be > 0 (<= 1: fraction, > 1: tokens)", what,
                        qp->budget);
    if ((size_t)s->batch * s->n_kv_heads > 65535)
        return mkv_fail(err, MKV_EUNSUP, "%s: batch x KV heads = %lld; at most 65535", what,
                        (long long)s->batch * s->n_kv_heads);
    for (int b = 0; cache_tokens && b < s->batch; b++)
        if (cache_tokens[b] < lengths[b] || cache_tokens[b] > s->t_max)
            return mkv_fail(err, MKV_EUSAGE, "%s: request %d: cache of %lld tokens, outside %lld..t_max = %lld",
                            what, b, (long long)cache_tokens[b], (long long)lengths[b], (long long)s->t_max);

    mkv_quest_plan *p = new (std::nothrow) mkv_quest_plan;
    if (p == NULL)
        return mkv_fail(err, MKV_ENOMEM, "%s: out of host memory", what);
    p->shape = *s;
    p->qp = *qp;
    p->G = s->n_heads / s->n_kv_heads;
    p->page_tiles = qp->page_size / TILE;
    /* A multiple of 16 keeps key rows aligned for the 16-byte loads. */
    p->pages_max = ((s->t_max + qp->page_size - 1) / qp->page_size + 15) / 16 * 16;
    if (p->pages_max == 0)
        p->pages_max = 16;
    std::vector<int64_t> &tiles = p->tiles;
    std::vector<int2> window;
    try {
        p->info.resize((size_t)s->batch);
        p->counts.resize((size_t)s->batch);
        tiles.resize((size_t)s->batch);
        window.resize((size_t)s->batch);
    } catch (const std::bad_alloc &) {
        delete p;
        return mkv_fail(err, MKV_ENOMEM, "%s: out of host memory", what);
    }
    int64_t most_tiles = 0;
    for (int b = 0; b < s->batch; b++) {
        const int64_t T = cache_tokens ? cache_tokens[b] : lengths[b];
        quest_rule(lengths[b], T, qp, &p->info[(size_t)b], &p->counts[(size_t)b]);
        tiles[(size_t)b] = p->counts[(size_t)b].max_pages * p->page_tiles;
        window[(size_t)b] = make_int2(p->info[(size_t)b].sink_end, p->info[(size_t)b].recent_start);
        const int64_t score_tiles = (p->counts[(size_t)b].pages + TILE - 1) / TILE;
        most_tiles = score_tiles > most_tiles ? score_tiles : most_tiles;
    }

    int resident = 0, dev = 0, sms = 1;
    if ((rc = resident_blocks(quest_attn_kernel(s->head_dim, s->is_bf16), &resident, err)) != MKV_OK
        || (rc = build_split_plan(&p->sp, tiles.data(), lengths, s->batch, s->n_kv_heads, p->G, s->head_dim,
                                  resident, err)) != MKV_OK) {
        delete p;
        return rc;
    }
    const size_t heads = (size_t)s->batch * s->n_kv_heads;
    const size_t slots = heads * (size_t)p->pages_max;
    cudaError_t e = cudaSuccess;
    if ((e = cudaGetDevice(&dev)) != cudaSuccess
        || (e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess
        || (e = p->d_info.alloc(sizeof(req_info) * (size_t)s->batch)) != cudaSuccess
        || (e = p->window.alloc(sizeof(int2) * (size_t)s->batch)) != cudaSuccess
        || (e = p->keys.alloc(sizeof(uint32_t) * slots)) != cudaSuccess
        || (e = p->lists.alloc(sizeof(int32_t) * slots)) != cudaSuccess
        || (e = p->list_counts.alloc(sizeof(int32_t) * heads)) != cudaSuccess
        || (e = p->tokens.alloc(sizeof(int32_t) * heads)) != cudaSuccess
        || (e = cudaMemcpy(p->d_info.ptr, p->info.data(), sizeof(req_info) * (size_t)s->batch,
                           cudaMemcpyHostToDevice)) != cudaSuccess
        || (e = cudaMemcpy(p->window.ptr, window.data(), sizeof(int2) * (size_t)s->batch,
                           cudaMemcpyHostToDevice)) != cudaSuccess
        || (e = cudaMemset(p->list_counts.ptr, 0, sizeof(int32_t) * heads)) != cudaSuccess) {
        (void)cudaGetLastError();
        delete p;
        return mkv_fail(err, e == cudaErrorMemoryAllocation ? MKV_ENOMEM : MKV_EGPU, "%s: plan: %s", what,
                        cudaGetErrorString(e));
    }
    p->sms = sms;
    p->score_blocks_x = score_blocks(sms, heads, most_tiles);
    *out = p;
    return MKV_OK;
}

extern "C" int mkv_cuda_quest_plan_advance(mkv_quest_plan *p, const int64_t *lengths, const int64_t *cache_tokens,
                                           void *stream, int *replan, mkv_error *err)
{
    const char *what = "Quest attention";
    if (p == NULL || lengths == NULL || replan == NULL)
        return mkv_fail(err, MKV_EUSAGE, "%s: NULL plan, lengths or result", what);
    *replan = 0;
    const mkv_attn_shape *s = &p->shape;
    const size_t B = (size_t)s->batch;
    std::vector<req_info> info;
    std::vector<mkv_quest_counts> counts;
    try {
        info.resize(B);
        counts.resize(B);
    } catch (const std::bad_alloc &) {
        return mkv_fail(err, MKV_ENOMEM, "%s: out of host memory", what);
    }
    int64_t most_tiles = 0;
    for (size_t b = 0; b < B; b++) {
        const int64_t n = lengths[b], T = cache_tokens ? cache_tokens[b] : n;
        if (n < 1 || n > T || T > s->t_max)
            return mkv_fail(err, MKV_EUSAGE, "%s: request %zu: %lld tokens of a cache of %lld, t_max %lld", what, b,
                            (long long)n, (long long)T, (long long)s->t_max);
        quest_rule(n, T, &p->qp, &info[b], &counts[b]);
        /* the work items were split for these tiles */
        if (counts[b].max_pages * p->page_tiles != p->tiles[b]) {
            *replan = 1;
            return MKV_OK;
        }
        const int64_t score_tiles = (counts[b].pages + TILE - 1) / TILE;
        most_tiles = score_tiles > most_tiles ? score_tiles : most_tiles;
    }
    if (score_blocks(p->sms, B * (size_t)s->n_kv_heads, most_tiles) != p->score_blocks_x) {
        *replan = 1;
        return MKV_OK;
    }
    const size_t info_bytes = sizeof(req_info) * B, window_bytes = sizeof(int2) * B, len_bytes = sizeof(int64_t) * B;
    if (p->staged == nullptr) {
        MKV_CUDA_CHECK(cudaMallocHost((void **)&p->staged, info_bytes + window_bytes + len_bytes));
        MKV_CUDA_CHECK(cudaEventCreateWithFlags(&p->staged_copied, cudaEventDisableTiming));
    } else {
        MKV_CUDA_CHECK(cudaEventSynchronize(p->staged_copied));   /* the last step's copies have left */
    }
    int2 *window = (int2 *)(p->staged + info_bytes);
    int64_t *len = (int64_t *)(p->staged + info_bytes + window_bytes);
    for (size_t b = 0; b < B; b++) {
        window[b] = make_int2(info[b].sink_end, info[b].recent_start);
        len[b] = lengths[b];
    }
    memcpy(p->staged, info.data(), info_bytes);
    cudaStream_t st = (cudaStream_t)stream;
    MKV_CUDA_CHECK(cudaMemcpyAsync(p->d_info.ptr, p->staged, info_bytes, cudaMemcpyHostToDevice, st));
    MKV_CUDA_CHECK(cudaMemcpyAsync(p->window.ptr, window, window_bytes, cudaMemcpyHostToDevice, st));
    MKV_CUDA_CHECK(cudaMemcpyAsync(p->sp.len.ptr, len, len_bytes, cudaMemcpyHostToDevice, st));
    MKV_CUDA_CHECK(cudaEventRecord(p->staged_copied, st));
    p->info.swap(info);
    p->counts.swap(counts);
    return MKV_OK;
}

extern "C" void mkv_cuda_quest_plan_free(mkv_quest_plan *p) { delete p; }

extern "C" int64_t mkv_cuda_quest_pages_max(const mkv_quest_plan *p) { return p ? p->pages_max : 0; }

extern "C" size_t mkv_cuda_quest_meta_elems(const mkv_quest_plan *p)
{
    if (p == NULL)
        return 0;
    return (size_t)p->shape.batch * p->shape.n_kv_heads * (size_t)p->pages_max * 2 * p->shape.head_dim;
}

extern "C" int mkv_cuda_quest_counts(const mkv_quest_plan *p, int request, mkv_quest_counts *c, mkv_error *err)
{
    if (p == NULL || c == NULL || request < 0 || request >= p->shape.batch)
        return mkv_fail(err, MKV_EUSAGE, "Quest attention: no request %d in the plan", request);
    *c = p->counts[(size_t)request];
    return MKV_OK;
}

extern "C" int mkv_cuda_quest_build_meta(const mkv_quest_plan *p, const uint16_t *k, uint16_t *meta,
                                         void *stream, mkv_error *err)
{
    const char *what = "Quest metadata";
    if (p == NULL)
        return mkv_fail(err, MKV_EUSAGE, "%s: NULL plan", what);
    int rc;
    if ((rc = check_aligned(k, "k", what, err)) || (rc = check_aligned(meta, "meta", what, err)))
        return rc;
    const mkv_attn_shape *s = &p->shape;
    const size_t total = (size_t)s->batch * s->n_kv_heads * (size_t)p->pages_max * (s->head_dim / 8);
    const unsigned blocks = (unsigned)((total + 255) / 256 < 65536 ? (total + 255) / 256 : 65536);
    cudaStream_t st = (cudaStream_t)stream;
    if (s->head_dim == 64)
        meta_kernel<64><<<blocks, 256, 0, st>>>(k, meta, p->d_info.as<req_info>(), s->t_max, p->pages_max,
                                                s->n_kv_heads, p->qp.page_size, s->is_bf16, total);
    else
        meta_kernel<128><<<blocks, 256, 0, st>>>(k, meta, p->d_info.as<req_info>(), s->t_max, p->pages_max,
                                                 s->n_kv_heads, p->qp.page_size, s->is_bf16, total);
    MKV_CUDA_CHECK_LAUNCH();
    return MKV_OK;
}

extern "C" int mkv_cuda_quest_select(const mkv_quest_plan *p, const float *q, const uint16_t *meta, void *stream,
                                     mkv_error *err)
{
    const char *what = "Quest selection";
    if (p == NULL)
        return mkv_fail(err, MKV_EUSAGE, "%s: NULL plan", what);
    int rc;
    if ((rc = check_aligned(q, "q", what, err)) || (rc = check_aligned(meta, "meta", what, err)))
        return rc;
    const mkv_attn_shape *s = &p->shape;
    cudaStream_t st = (cudaStream_t)stream;
    score_args a = {};
    a.meta = meta;
    a.q = q;
    a.info = p->d_info.as<req_info>();
    a.keys = p->keys.as<uint32_t>();
    a.pages_max = p->pages_max;
    a.n_kv = s->n_kv_heads;
    a.G = p->G;
    a.agg_sum = p->qp.agg_sum != 0;
    const unsigned heads = (unsigned)(s->batch * s->n_kv_heads);
    const dim3 grid((unsigned)p->score_blocks_x, heads);
    if (s->head_dim == 64)
        s->is_bf16 ? score_kernel<64, true><<<grid, THREADS, 0, st>>>(a) : score_kernel<64, false><<<grid, THREADS, 0, st>>>(a);
    else
        s->is_bf16 ? score_kernel<128, true><<<grid, THREADS, 0, st>>>(a) : score_kernel<128, false><<<grid, THREADS, 0, st>>>(a);
    MKV_CUDA_CHECK_LAUNCH();
    select_args sa = {};
    sa.keys = p->keys.as<uint32_t>();
    sa.info = p->d_info.as<req_info>();
    sa.lists = p->lists.as<int32_t>();
    sa.counts = p->list_counts.as<int32_t>();
    sa.tokens = p->tokens.as<int32_t>();
    sa.pages_max = p->pages_max;
    sa.n_kv = s->n_kv_heads;
    sa.page_size = p->qp.page_size;
    select_kernel<<<heads, SEL_THREADS, 0, st>>>(sa);
    MKV_CUDA_CHECK_LAUNCH();
    return MKV_OK;
}

template <int D, bool BF16>
static void launch_paged(const split_args &a, int n_items, cudaStream_t st)
{
    split_kernel<D, BF16, true, ATTN_MINB><<<n_items, THREADS, 0, st>>>(a);
}

extern "C" int mkv_cuda_quest_attend(const mkv_quest_plan *p, const float *q, const uint16_t *k, const uint16_t *v,
                                     float *out, void *stream, mkv_error *err)
{
    const char *what = "Quest attention";
    if (p == NULL)
        return mkv_fail(err, MKV_EUSAGE, "%s: NULL plan", what);
    int rc;
    if ((rc = check_aligned(q, "q", what, err)) || (rc = check_aligned(k, "k", what, err))
        || (rc = check_aligned(v, "v", what, err)) || (rc = check_aligned(out, "out", what, err)))
        return rc;
    const mkv_attn_shape *s = &p->shape;
    cudaStream_t st = (cudaStream_t)stream;
    if (p->sp.n_items > 0) {
        split_args a = {};
        a.k = k;
        a.v = v;
        a.q = q;
        a.items = p->sp.items.as<int4>();
        a.len = p->sp.len.as<int64_t>();
        a.pages = p->lists.as<int32_t>();
        a.n_pages = p->list_counts.as<int32_t>();
        a.window = p->window.as<int2>();
        a.t_max = s->t_max;
        a.n_kv = s->n_kv_heads;
        a.G = p->G;
        a.list_max = (int)p->pages_max;
        a.page_size = p->qp.page_size;
        a.page_tiles = p->page_tiles;
        a.qscale = qscale_of(s);
        a.part_o = p->sp.part_o.as<float>();
        a.part_ml = p->sp.part_ml.as<float2>();
        if (s->head_dim == 64)
            s->is_bf16 ? launch_paged<64, true>(a, p->sp.n_items, st) : launch_paged<64, false>(a, p->sp.n_items, st);
        else
            s->is_bf16 ? launch_paged<128, true>(a, p->sp.n_items, st) : launch_paged<128, false>(a, p->sp.n_items, st);
        MKV_CUDA_CHECK_LAUNCH();
    }
    return launch_merge(&p->sp, s->batch, s->n_kv_heads, p->G, s->head_dim, out, st, err);
}

extern "C" int mkv_cuda_quest_selection(const mkv_quest_plan *p, int32_t *pages, int32_t *counts, int64_t *tokens,
                                        mkv_error *err)
{
    if (p == NULL)
        return mkv_fail(err, MKV_EUSAGE, "Quest selection: NULL plan");
    const size_t heads = (size_t)p->shape.batch * p->shape.n_kv_heads;
    MKV_CUDA_CHECK(cudaDeviceSynchronize());
    if (pages)
        MKV_CUDA_CHECK(cudaMemcpy(pages, p->lists.ptr, sizeof(int32_t) * heads * (size_t)p->pages_max,
                                  cudaMemcpyDeviceToHost));
    if (counts)
        MKV_CUDA_CHECK(cudaMemcpy(counts, p->list_counts.ptr, sizeof(int32_t) * heads, cudaMemcpyDeviceToHost));
    if (tokens) {
        std::vector<int32_t> t;
        try {
            t.resize(heads);
        } catch (const std::bad_alloc &) {
            return mkv_fail(err, MKV_ENOMEM, "Quest selection: out of host memory");
        }
        MKV_CUDA_CHECK(cudaMemcpy(t.data(), p->tokens.ptr, sizeof(int32_t) * heads, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < heads; i++)
            tokens[i] = t[i];
    }
    return MKV_OK;
}

static __global__ void add_tokens_kernel(const int32_t *tokens, int heads, unsigned long long *acc)
{
    unsigned long long sum = 0;
    for (int i = threadIdx.x; i < heads; i += blockDim.x)
        sum += (unsigned long long)tokens[i];
    for (int o = 16; o > 0; o >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (threadIdx.x == 0)
        *acc += sum;
}

extern "C" int mkv_cuda_quest_add_tokens(const mkv_quest_plan *p, unsigned long long *acc, void *stream,
                                         mkv_error *err)
{
    if (p == NULL || acc == NULL)
        return mkv_fail(err, MKV_EUSAGE, "Quest selection: NULL plan or counter");
    const int heads = p->shape.batch * p->shape.n_kv_heads;
    add_tokens_kernel<<<1, 32, 0, (cudaStream_t)stream>>>(p->tokens.as<int32_t>(), heads, acc);
    MKV_CUDA_CHECK_LAUNCH();
    return MKV_OK;
}
