/* GPU encode of new tokens (the GPU half of the dual buffer, docs/DESIGN.md
 * 5.3) and batched eigendecompositions of segment Gram matrices.
 *
 * Encoding follows mkv_mosaic_encode (lib/mosaic/mosaic.c) step by step in
 * double precision: x~ = x R over the first d' rotated channels (R as
 * stored, fp16), group energies summed channel by channel without fused
 * multiply-adds (as the CPU adds them), the r/g groups of most energy kept
 * (ties: the lower group), values rounded double -> float -> fp16 as
 * f16r() does, block keys the double mean of the block's x~.  One warp
 * encodes one vector. */
#include <math.h>
#include <new>
#include <vector>

#include <cusolverDn.h>

#include "mosaic_attend.cuh"

using namespace mkv_packed;

namespace {

constexpr int ENC_WARPS = 4;
constexpr int ENC_MAX_D = 128;

struct strategy {
    int rotate, r, g, dp, pervector;   /* pervector 0: the first r channels */
};

/* f16r(): double -> float -> fp16, both round-to-nearest, as lib/mosaic/mosaic.c. */
__device__ __forceinline__ uint16_t f16r_bits(double x) { return __half_as_ushort(__float2half_rn(__double2float_rn(x))); }

/* One warp: xt[0..cols) = x R (x: d floats; R fp16 [d][ldr], not used
 * without rotation: xt = x). */
__device__ void rotate_vector(const float *x, const uint16_t *R, int ldr, int d, int rotate, int cols, double *xt)
{
    const int lane = threadIdx.x & 31;
    for (int c = lane; c < cols; c += 32) {
        double v = 0;
        if (rotate) {
            /* the loads of R independent of the sum, many in flight: a
             * decode step's rotation is read from DRAM */
#pragma unroll 16
            for (int j = 0; j < d; j++)
                v = fma((double)x[j], (double)__half2float(__ushort_as_half(R[(size_t)j * ldr + c])), v);
        } else {
            v = x[c];
        }
        xt[c] = v;
    }
    __syncwarp();
}

/* One warp: the kept channels of a rotated vector xt[0..dp); kept[w] gets
 * bit c%32 of word c/32 for each kept channel c < dp.  en is scratch. */
__device__ void choose_kept(const double *xt, const strategy &s, double *en, uint32_t *kept)
{
    const int lane = threadIdx.x & 31;
    const int ng = s.dp / s.g, keep_groups = s.r / s.g;
    if (!s.pervector || s.r >= s.dp) {
        for (int w = lane; w < ENC_MAX_D / 32; w += 32) {
            uint32_t m = 0;
            for (int b = 0; b < 32; b++)
                if (32 * w + b < s.r)
                    m |= 1u << b;
            kept[w] = m;
        }
        __syncwarp();
        return;
    }
    for (int i = lane; i < ng; i += 32) {
        double e = 0;
        for (int c = i * s.g; c < i * s.g + s.g; c++)
            e = __dadd_rn(e, __dmul_rn(xt[c], xt[c]));
        en[i] = e;
    }
    __syncwarp();
    for (int w = 0; w < ENC_MAX_D / 32; w++) {
        const int c = 32 * w + lane;
        bool in = false;
        if (c < s.dp) {
            const int i = c / s.g;
            const double e = en[i];
            int rank = 0;
            for (int k = 0; k < ng; k++)
                rank += en[k] > e || (en[k] == e && k < i);
            in = rank < keep_groups;
        }
        const uint32_t m = __ballot_sync(0xffffffffu, in);
        if (lane == 0)
            kept[w] = m;
    }
    __syncwarp();
}

/* One warp: rotate x into xt[0..dp) and choose its kept channels. */
__device__ void encode_vector(const float *x, const uint16_t *R, int ldr, int d, const strategy &s, double *xt,
                              double *en, uint32_t *kept)
{
    rotate_vector(x, R, ldr, d, s.rotate, s.dp, xt);
    choose_kept(xt, s, en, kept);
}

/* Kept values of xt in channel order (fp16), and whether one does not fit
 * fp16 (then *bad gets 1). */
__device__ void write_values(const double *xt, const uint32_t *kept, int dp, uint16_t *vals, unsigned *bad)
{
    const int lane = threadIdx.x & 31;
    int base = 0;
    for (int w = 0; w < (dp + 31) / 32; w++) {
        const int c = 32 * w + lane;
        const uint32_t m = kept[w];
        if (c < dp && (m >> lane & 1u)) {
            const double v = xt[c];
            if (!(fabs(v) <= 65504.0))
                atomicExch(bad, 1u);
            vals[base + __popc(m & ((1u << lane) - 1u))] = f16r_bits(v);
        }
        base += __popc(m);
    }
}

/* The strategy a packed segment stores for tensor 0 (K) or 1 (V). */
__device__ strategy segment_strategy(const mkv_packed_seg &g, int tensor)
{
    strategy s;
    s.rotate = (tensor ? g.rv_off : g.rk_off) >= 0;
    s.r = tensor ? g.rv : g.rk;
    s.g = tensor ? g.gv : g.gk;
    s.dp = tensor ? g.dpv : g.dpk;
    s.pervector = tensor ? g.pvv : g.pvk;
    return s;
}

/* One warp: a vector encoded for segment g (xt, kept) into its record as
 * token idx of the segment: its values and per-channel bitmap. */
__device__ void store_in_record(const double *xt, const uint32_t *kept, const mkv_packed_seg &g, int tensor,
                                const strategy &s, uint8_t *records, int64_t idx, int B, unsigned *bad)
{
    const int lane = threadIdx.x & 31;
    uint8_t *rec = records + g.rec_off + (idx / B) * g.rec_bytes;
    const int row = (int)(idx % B);
    uint16_t *vals = reinterpret_cast<uint16_t *>(rec + (tensor ? g.vval_off : 0)) + row * s.r;
    const int words = tensor ? g.dv / 32 : (s.dp + 31) / 32;
    uint32_t *mask = reinterpret_cast<uint32_t *>(rec + (tensor ? g.vmask_off : g.kmask_off)) + row * words;
    write_values(xt, kept, s.dp, vals, bad);
    for (int i = lane; i < words; i += 32)
        mask[i] = kept[i];
}

struct encode_args {
    const float *X;
    const uint16_t *R;
    int d;
    int64_t n;
    strategy s;
    uint16_t *values;
    uint8_t *bitmap;   /* NULL: none */
    int bitmap_bytes;
    double *xt;        /* [n][dp] for the block keys */
    unsigned *bad;
};

__global__ void __launch_bounds__(ENC_WARPS * 32) encode_kernel(const encode_args a)
{
    __shared__ double sm_xt[ENC_WARPS][ENC_MAX_D];
    __shared__ double sm_en[ENC_WARPS][ENC_MAX_D];
    __shared__ uint32_t sm_kept[ENC_WARPS][ENC_MAX_D / 32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int64_t t = (int64_t)blockIdx.x * ENC_WARPS + warp; t < a.n; t += (int64_t)gridDim.x * ENC_WARPS) {
        encode_vector(a.X + t * a.d, a.R, a.s.dp, a.d, a.s, sm_xt[warp], sm_en[warp], sm_kept[warp]);
        write_values(sm_xt[warp], sm_kept[warp], a.s.dp, a.values + t * a.s.r, a.bad);
        if (a.bitmap) {
            /* bit i of byte i/8: group i kept (its first channel) */
            for (int byte = lane; byte < a.bitmap_bytes; byte += 32) {
                uint32_t v = 0;
                for (int b = 0; b < 8; b++) {
                    const int i = 8 * byte + b, c = i * a.s.g;
                    if (i < a.s.dp / a.s.g && (sm_kept[warp][c / 32] >> (c % 32) & 1u))
                        v |= 1u << b;
                }
                a.bitmap[t * a.bitmap_bytes + byte] = (uint8_t)v;
            }
        }
        for (int c = lane; c < a.s.dp; c += 32)
            a.xt[t * a.s.dp + c] = sm_xt[warp][c];
        __syncwarp();
    }
}

/* Block keys: the double mean of each block's x~, rounded like f16r. */
__global__ void block_keys_kernel(const double *xt, int64_t n, int dp, int B, uint16_t *out)
{
    const int64_t nb = (n + B - 1) / B;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nb * dp; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = i / dp, c = i % dp;
        const int64_t t0 = b * B, t1 = t0 + B < n ? t0 + B : n;
        double sum = 0;
        for (int64_t t = t0; t < t1; t++)
            sum = __dadd_rn(sum, xt[t * dp + c]);
        out[i] = f16r_bits(__ddiv_rn(sum, (double)(t1 - t0)));
    }
}

/* Append: tokens of K (tensor 0) and V (tensor 1) into a temporary region's
 * records, one warp per (token, tensor). */
struct append_args {
    const float *k, *v;
    const uint16_t *rotations;
    mkv_packed_seg seg;
    uint8_t *records;
    int d, B;
    int64_t n, first;   /* tokens, segment-relative index of the first */
    unsigned *bad;
};

__global__ void __launch_bounds__(ENC_WARPS * 32) append_kernel(const append_args a)
{
    __shared__ double sm_xt[ENC_WARPS][ENC_MAX_D];
    __shared__ double sm_en[ENC_WARPS][ENC_MAX_D];
    __shared__ uint32_t sm_kept[ENC_WARPS][ENC_MAX_D / 32];
    const int warp = threadIdx.x >> 5;
    const mkv_packed_seg &g = a.seg;
    for (int64_t w = (int64_t)blockIdx.x * ENC_WARPS + warp; w < 2 * a.n; w += (int64_t)gridDim.x * ENC_WARPS) {
        const int tensor = (int)(w & 1);
        const int64_t t = w >> 1, idx = a.first + t;
        const strategy s = segment_strategy(g, tensor);
        const uint16_t *R = s.rotate ? a.rotations + (tensor ? g.rv_off : g.rk_off) : nullptr;
        encode_vector((tensor ? a.v : a.k) + t * a.d, R, tensor ? g.dv : g.dk, a.d, s, sm_xt[warp], sm_en[warp],
                      sm_kept[warp]);
        store_in_record(sm_xt[warp], sm_kept[warp], g, tensor, s, a.records, idx, a.B, a.bad);
        __syncwarp();
    }
}

/* Growth: one block of two warps (K, V) per cache head, one token each. */
struct grow_args {
    const float *k, *v;               /* [n][d] */
    mkv_packed_head *heads;           /* device tables */
    mkv_packed_seg *segs;
    uint8_t *records;
    uint16_t *blockkeys, *rotations, *dense_k, *dense_v;   /* blockkeys NULL: dropped, the 8-bit ones only */
    uint8_t *bk8;                     /* the 8-bit block keys, NULL when the cache has none */
    float *bk8_scales;
    const bk8_place *bk8_at;
    double *blocks;                   /* [heads][3][ENC_MAX_D] */
    int first, d, B;
    unsigned *bad;
};

__global__ void __launch_bounds__(64) grow_kernel(const grow_args a)
{
    __shared__ float sm_x[2][ENC_MAX_D];
    __shared__ double sm_xt[2][ENC_MAX_D];
    __shared__ double sm_en[2][ENC_MAX_D];
    __shared__ uint32_t sm_kept[2][ENC_MAX_D / 32];
    __shared__ uint16_t sm_key[2 * ENC_MAX_D];
    const int head = a.first + blockIdx.x, tensor = threadIdx.x >> 5, lane = threadIdx.x & 31, D = a.d;
    const mkv_packed_head hd = a.heads[head];
    const int64_t row = (int64_t)hd.first_seg + hd.n_seg - 1;
    const mkv_packed_seg g = a.segs[row];
    /* the oldest recent token leaves its row for the open segment; the new one takes the row */
    __half *dense = reinterpret_cast<__half *>(tensor ? a.dense_v : a.dense_k) +
                    (size_t)(hd.dense_row + hd.sink_n + hd.ring) * D;
    for (int c = lane; c < D; c += 32)
        sm_x[tensor][c] = __half2float(dense[c]);
    __syncwarp();
    const float *nx = (tensor ? a.v : a.k) + (size_t)blockIdx.x * D;
    for (int c = lane; c < D; c += 32) {
        const float f = nx[c];
        if (!(fabsf(f) <= 65504.0f))
            atomicExch(a.bad, 1u);
        dense[c] = __float2half_rn(f);
    }
    const strategy s = segment_strategy(g, tensor);
    const int cols = tensor || g.kdim <= s.dp ? s.dp : g.kdim;   /* the block keys may span more channels */
    rotate_vector(sm_x[tensor], s.rotate ? a.rotations + (tensor ? g.rv_off : g.rk_off) : nullptr,
                  tensor ? g.dv : g.dk, D, s.rotate, cols, sm_xt[tensor]);
    choose_kept(sm_xt[tensor], s, sm_en[tensor], sm_kept[tensor]);
    const int64_t idx = g.len;
    const int in_block = (int)(idx % a.B);
    store_in_record(sm_xt[tensor], sm_kept[tensor], g, tensor, s, a.records, idx, a.B, a.bad);
    if (tensor == 0) {
        /* the block's key row over its tokens so far, as mkv_mosaic_block_keys sums them */
        double *sum = a.blocks + (size_t)head * 3 * ENC_MAX_D, *lo = sum + ENC_MAX_D, *hi = lo + ENC_MAX_D;
        const int64_t blk = idx / a.B;
        float amax = 0.f;
        for (int c = lane; c < g.kdim; c += 32) {
            const double x = sm_xt[0][c];
            const double s0 = in_block ? sum[c] : 0.0, l0 = in_block ? lo[c] : INFINITY, h0 = in_block ? hi[c] : -INFINITY;
            sum[c] = __dadd_rn(s0, x);
            lo[c] = x < l0 ? x : l0;
            hi[c] = x > h0 ? x : h0;
            if (c < g.kbound) {
                sm_key[c] = f16r_bits(lo[c]);
                amax = fmaxf(amax, fabsf(__half2float(__ushort_as_half(sm_key[c]))));
                sm_key[g.kbound + c] = f16r_bits(hi[c]);
            } else {
                sm_key[g.kbound + c] = f16r_bits(__ddiv_rn(sum[c], (double)(in_block + 1)));
            }
            amax = fmaxf(amax, fabsf(__half2float(__ushort_as_half(sm_key[g.kbound + c]))));
        }
        for (int c = g.kbound + g.kdim + lane; c < g.bk_width; c += 32)   /* the row's padding */
            sm_key[c] = 0;
        __syncwarp();
        if (a.blockkeys) {
            uint16_t *key = a.blockkeys + g.bk_off + blk * g.bk_width;
            for (int c = lane; c < g.bk_width; c += 32)
                key[c] = sm_key[c];
        }
        if (a.bk8) {
            /* the row's codes by mkv_cuda_mosaic_blockkeys8's rule */
            const double amx = (double)__uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(amax)));
            const bk8_place pl = a.bk8_at[row];
            uint8_t *codes = a.bk8 + pl.code_off + blk * bk8_row_bytes(g.bk_width);
            for (int c = lane; c < g.bk_width; c += 32)
                codes[c] = (uint8_t)(int8_t)(amx > 0
                    ? (int)rint((double)__half2float(__ushort_as_half(sm_key[c])) * 127.0 / amx) : 0);
            if (lane == 0)
                a.bk8_scales[pl.scale_off + blk] = (float)(amx / 127.0);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        a.segs[row].len = g.len + 1;
        a.heads[head].T = hd.T + 1;
        a.heads[head].ring = hd.ring + 1 < hd.recent_n ? hd.ring + 1 : 0;
    }
}

unsigned grid_for(int64_t work)
{
    const int64_t b = (work + ENC_WARPS - 1) / ENC_WARPS;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

}  // namespace

extern "C" int mkv_cuda_mosaic_encode(const mkv_cuda_strategy *cs, int d, int64_t n, int block, const float *X,
                                      const uint16_t *R, uint16_t *values, uint8_t *bitmap, uint16_t *blockkeys,
                                      void *stream, mkv_error *err)
{
    const char *what = "GPU encode";
    if (cs == NULL || X == NULL || values == NULL || n < 0)
        return mkv_fail(err, MKV_EUSAGE, "%s: NULL strategy or buffer", what);
    strategy s = {cs->rotate, cs->r, cs->pervector ? cs->g : 1, cs->dprime, cs->pervector};
    if (d < 1 || d > ENC_MAX_D || s.dp < 1 || s.dp > d || s.g < 1 || s.g > 4 || s.dp % s.g || s.r % s.g || s.r < 1
        || s.r > s.dp || (!s.rotate && s.dp != d) || (s.rotate && R == NULL))
        return mkv_fail(err, MKV_EUNSUP, "%s: strategy r %d, g %d, d' %d of head_dim %d not supported (d <= %d)", what,
                        s.r, s.g, s.dp, d, ENC_MAX_D);
    const bool has_bitmap = s.pervector && s.r < s.dp;
    if (has_bitmap != (bitmap != NULL))
        return mkv_fail(err, MKV_EUSAGE, "%s: a bitmap buffer is needed exactly when the strategy stores one", what);
    if (n == 0)
        return MKV_OK;
    cudaStream_t st = (cudaStream_t)stream;
    mkv_device_buffer xt, bad;
    MKV_CUDA_CHECK(xt.alloc(sizeof(double) * (size_t)n * s.dp));
    MKV_CUDA_CHECK(bad.alloc(sizeof(unsigned)));
    MKV_CUDA_CHECK(cudaMemsetAsync(bad.ptr, 0, sizeof(unsigned), st));
    encode_args a = {X, R, d, n, s, values, bitmap, (s.dp / s.g + 7) / 8, xt.as<double>(), bad.as<unsigned>()};
    encode_kernel<<<grid_for(n), ENC_WARPS * 32, 0, st>>>(a);
    MKV_CUDA_CHECK_LAUNCH();
    if (block > 0 && blockkeys != NULL) {
        const int64_t work = (n + block - 1) / block * s.dp;
        const unsigned blocks = (unsigned)((work + 255) / 256 < 65535 ? (work + 255) / 256 : 65535);
        block_keys_kernel<<<blocks, 256, 0, st>>>(xt.as<double>(), n, s.dp, block, blockkeys);
        MKV_CUDA_CHECK_LAUNCH();
    }
    unsigned h = 0;
    MKV_CUDA_CHECK(cudaMemcpyAsync(&h, bad.ptr, sizeof h, cudaMemcpyDeviceToHost, st));
    MKV_CUDA_CHECK(cudaStreamSynchronize(st));
    if (h)
        return mkv_fail(err, MKV_EFORMAT, "%s: a rotated value does not fit float16 (|x| <= 65504)", what);
    return MKV_OK;
}

extern "C" int mkv_cuda_mosaic_append(mkv_packed_cache *c, int head, const float *k, const float *v, int64_t n,
                                      void *stream, mkv_error *err)
{
    const char *what = "packed append";
    if (c == NULL || k == NULL || v == NULL || n < 0 || head < 0 || head >= (int)c->heads.size())
        return mkv_fail(err, MKV_EUSAGE, "%s: NULL cache or buffers, or no head %d", what, head);
    const mkv_packed_head &hd = c->heads[(size_t)head];
    const int64_t row = (int64_t)hd.first_seg + hd.n_seg - 1;
    if (hd.n_seg < 1 || !c->segs[(size_t)row].always)
        return mkv_fail(err, MKV_EUSAGE, "%s: head %d has no temporary region", what, head);
    if (c->bk16_dropped)
        return mkv_fail(err, MKV_EUSAGE, "%s: the cache's fp16 block keys were dropped", what);
    mkv_packed_seg &g = c->segs[(size_t)row];
    const int B = c->block;
    if (g.len + n > (int64_t)g.n_blocks * B)
        return mkv_fail(err, MKV_EUSAGE, "%s: head %d: %lld + %lld tokens exceed the temporary region's %lld", what,
                        head, (long long)g.len, (long long)n, (long long)g.n_blocks * B);
    if (c->head_dim > ENC_MAX_D)
        return mkv_fail(err, MKV_EUNSUP, "%s: head_dim %d", what, c->head_dim);
    if (n == 0)
        return MKV_OK;
    cudaStream_t st = (cudaStream_t)stream;
    mkv_device_buffer bad;
    MKV_CUDA_CHECK(bad.alloc(sizeof(unsigned)));
    MKV_CUDA_CHECK(cudaMemsetAsync(bad.ptr, 0, sizeof(unsigned), st));
    append_args a = {k, v, c->rotations.as<uint16_t>(), g, c->records.as<uint8_t>(), c->head_dim, B, n, g.len,
                     bad.as<unsigned>()};
    append_kernel<<<grid_for(2 * n), ENC_WARPS * 32, 0, st>>>(a);
    MKV_CUDA_CHECK_LAUNCH();
    unsigned h = 0;
    MKV_CUDA_CHECK(cudaMemcpyAsync(&h, bad.ptr, sizeof h, cudaMemcpyDeviceToHost, st));
    MKV_CUDA_CHECK(cudaStreamSynchronize(st));
    if (h)
        return mkv_fail(err, MKV_EFORMAT, "%s: a rotated value does not fit float16 (|x| <= 65504)", what);
    g.len += n;
    return cache_sync_seg(c, row, st, err);
}

extern "C" int mkv_cuda_mosaic_grow(mkv_packed_cache *c, int first, int n, const float *k, const float *v,
                                    void *stream, mkv_error *err)
{
    const char *what = "packed growth";
    if (c == NULL || k == NULL || v == NULL || n < 1 || first < 0 || first > (int)c->heads.size() - n)
        return mkv_fail(err, MKV_EUSAGE, "%s: NULL cache or buffers, or heads %d..%d outside the cache", what, first,
                        first + n - 1);
    if (c->head_dim > ENC_MAX_D)
        return mkv_fail(err, MKV_EUNSUP, "%s: head_dim %d", what, c->head_dim);
    const int B = c->block;
    for (int h = first; h < first + n; h++) {
        const mkv_packed_head &hd = c->heads[(size_t)h];
        const mkv_packed_seg *g = hd.n_seg > 0 ? &c->segs[(size_t)(hd.first_seg + hd.n_seg - 1)] : nullptr;
        if (g == nullptr || !g->open || hd.recent_n < 1)
            return mkv_fail(err, MKV_EUSAGE, "%s: head %d has no open segment or no recent rows", what, h);
        if (g->len >= (int64_t)g->n_blocks * B || hd.T >= INT32_MAX)
            return mkv_fail(err, MKV_EUSAGE, "%s: head %d: its open segment is full (%lld tokens)", what, h,
                            (long long)g->len);
    }
    if (c->grow_blocks.ptr == nullptr) {
        MKV_CUDA_CHECK(c->grow_blocks.alloc(sizeof(double) * 3 * ENC_MAX_D * c->heads.size()));
        MKV_CUDA_CHECK(c->grow_bad.alloc(sizeof(unsigned)));
        MKV_CUDA_CHECK(cudaMemset(c->grow_bad.ptr, 0, sizeof(unsigned)));
    }
    const grow_args a = {k, v, c->d_heads.as<mkv_packed_head>(), c->d_segs.as<mkv_packed_seg>(),
                         c->records.as<uint8_t>(), c->blockkeys.as<uint16_t>(), c->rotations.as<uint16_t>(),
                         c->dense_k.as<uint16_t>(), c->dense_v.as<uint16_t>(),
                         c->has_bk8 ? c->bk8.as<uint8_t>() : nullptr, c->has_bk8 ? c->bk8_scales.as<float>() : nullptr,
                         c->has_bk8 ? c->bk8_at.as<bk8_place>() : nullptr, c->grow_blocks.as<double>(),
                         first, c->head_dim, B, c->grow_bad.as<unsigned>()};
    grow_kernel<<<(unsigned)n, 64, 0, (cudaStream_t)stream>>>(a);
    MKV_CUDA_CHECK_LAUNCH();
    for (int h = first; h < first + n; h++) {
        mkv_packed_head &hd = c->heads[(size_t)h];
        c->segs[(size_t)(hd.first_seg + hd.n_seg - 1)].len++;
        hd.T++;
        hd.ring = hd.ring + 1 < hd.recent_n ? hd.ring + 1 : 0;
    }
    return MKV_OK;
}

extern "C" int mkv_cuda_mosaic_grow_check(mkv_packed_cache *c, mkv_error *err)
{
    if (c == NULL || c->grow_bad.ptr == nullptr)
        return MKV_OK;
    unsigned bad = 0;
    MKV_CUDA_CHECK(cudaMemcpy(&bad, c->grow_bad.ptr, sizeof bad, cudaMemcpyDeviceToHost));
    if (!bad)
        return MKV_OK;
    MKV_CUDA_CHECK(cudaMemset(c->grow_bad.ptr, 0, sizeof bad));
    return mkv_fail(err, MKV_EFORMAT, "mosaic: a new key or value does not fit float16");
}

/* ------------------------------------------------------------- rotations */

namespace {

struct solver_holder {
    cusolverDnHandle_t h = nullptr;
    syevjInfo_t j = nullptr;
    cusolverDnParams_t p = nullptr;
    ~solver_holder()
    {
        if (j)
            (void)cusolverDnDestroySyevjInfo(j);
        if (p)
            (void)cusolverDnDestroyParams(p);
        if (h)
            (void)cusolverDnDestroy(h);
    }
};

/* Eigenvector columns V (column-major, ascending eigenvalues W) into
 * mkv_eigh's convention: descending, row-major, largest component
 * positive (ties within 1e-10 relative: the first of them). */
void to_convention(const double *V, const double *W, int d, double *R, double *evals)
{
    for (int j = 0; j < d; j++) {
        const int src = d - 1 - j;
        evals[j] = W[src];
        const double *col = V + (size_t)src * d;
        double big = 0;
        for (int i = 0; i < d; i++)
            big = fabs(col[i]) > big ? fabs(col[i]) : big;
        int first = 0;
        for (int i = 0; i < d; i++)
            if (fabs(col[i]) >= big * (1 - 1e-10)) {
                first = i;
                break;
            }
        const double sign = col[first] < 0 ? -1.0 : 1.0;
        for (int i = 0; i < d; i++)
            R[(size_t)i * d + j] = sign * col[i];
    }
}

}  // namespace

extern "C" int mkv_cuda_eigh_batched(const double *gram, int d, int batch, double *R, double *evals, mkv_error *err)
{
    const char *what = "GPU rotations";
    if (gram == NULL || R == NULL || evals == NULL || d < 1 || batch < 1)
        return mkv_fail(err, MKV_EUSAGE, "%s: NULL buffer, d %d or batch %d", what, d, batch);
    for (size_t i = 0; i < (size_t)batch * d * d; i++)
        if (!isfinite(gram[i]))
            return mkv_fail(err, MKV_EFORMAT, "%s: non-finite Gram matrix entry", what);
    const size_t nn = (size_t)d * d * batch;
    solver_holder s;
    MKV_CUSOLVER_CHECK(cusolverDnCreate(&s.h));
    mkv_device_buffer A, W, info, work;
    MKV_CUDA_CHECK(A.alloc(sizeof(double) * nn));
    MKV_CUDA_CHECK(W.alloc(sizeof(double) * (size_t)d * batch));
    MKV_CUDA_CHECK(info.alloc(sizeof(int) * (size_t)batch));
    /* Symmetric: row-major equals column-major. */
    MKV_CUDA_CHECK(cudaMemcpy(A.ptr, gram, sizeof(double) * nn, cudaMemcpyHostToDevice));
    const cusolverEigMode_t jobz = CUSOLVER_EIG_MODE_VECTOR;
    const cublasFillMode_t uplo = CUBLAS_FILL_MODE_UPPER;
    if (d <= 32) {
        MKV_CUSOLVER_CHECK(cusolverDnCreateSyevjInfo(&s.j));
        MKV_CUSOLVER_CHECK(cusolverDnXsyevjSetTolerance(s.j, 1e-14));
        MKV_CUSOLVER_CHECK(cusolverDnXsyevjSetMaxSweeps(s.j, 100));
        int lwork = 0;
        MKV_CUSOLVER_CHECK(cusolverDnDsyevjBatched_bufferSize(s.h, jobz, uplo, d, A.as<double>(), d, W.as<double>(),
                                                              &lwork, s.j, batch));
        MKV_CUDA_CHECK(work.alloc(sizeof(double) * (size_t)(lwork > 0 ? lwork : 1)));
        MKV_CUSOLVER_CHECK(cusolverDnDsyevjBatched(s.h, jobz, uplo, d, A.as<double>(), d, W.as<double>(),
                                                   work.as<double>(), lwork, info.as<int>(), s.j, batch));
    } else {
        MKV_CUSOLVER_CHECK(cusolverDnCreateParams(&s.p));
        size_t dev_bytes = 0, host_bytes = 0;
        MKV_CUSOLVER_CHECK(cusolverDnXsyevBatched_bufferSize(s.h, s.p, jobz, uplo, d, CUDA_R_64F, A.ptr, d, CUDA_R_64F,
                                                             W.ptr, CUDA_R_64F, &dev_bytes, &host_bytes, batch));
        MKV_CUDA_CHECK(work.alloc(dev_bytes ? dev_bytes : 16));
        std::vector<char> host;
        try {
            host.resize(host_bytes ? host_bytes : 1);
        } catch (const std::bad_alloc &) {
            return mkv_fail(err, MKV_ENOMEM, "%s: out of host memory", what);
        }
        MKV_CUSOLVER_CHECK(cusolverDnXsyevBatched(s.h, s.p, jobz, uplo, d, CUDA_R_64F, A.ptr, d, CUDA_R_64F, W.ptr,
                                                  CUDA_R_64F, work.ptr, dev_bytes, host.data(), host_bytes,
                                                  info.as<int>(), batch));
    }
    std::vector<double> V, Wh;
    std::vector<int> infos;
    try {
        V.resize(nn);
        Wh.resize((size_t)d * batch);
        infos.resize((size_t)batch);
    } catch (const std::bad_alloc &) {
        return mkv_fail(err, MKV_ENOMEM, "%s: out of host memory", what);
    }
    MKV_CUDA_CHECK(cudaMemcpy(V.data(), A.ptr, sizeof(double) * nn, cudaMemcpyDeviceToHost));
    MKV_CUDA_CHECK(cudaMemcpy(Wh.data(), W.ptr, sizeof(double) * (size_t)d * batch, cudaMemcpyDeviceToHost));
    MKV_CUDA_CHECK(cudaMemcpy(infos.data(), info.ptr, sizeof(int) * (size_t)batch, cudaMemcpyDeviceToHost));
    for (int b = 0; b < batch; b++)
        if (infos[(size_t)b] != 0)
            return mkv_fail(err, MKV_EFORMAT, "%s: matrix %d: the eigensolver did not converge (info %d)", what, b,
                            infos[(size_t)b]);
    for (int b = 0; b < batch; b++)
        to_convention(V.data() + (size_t)b * d * d, Wh.data() + (size_t)b * d, d, R + (size_t)b * d * d,
                      evals + (size_t)b * d);
    return MKV_OK;
}
