/* The LLaMA-family forward pass on the GPU (mkv_cuda_llama of mkv_cuda.h):
 * what lib/model/forward.c computes, with the weights on the device, cuBLAS
 * for the matrix products of a prefill chunk, gemv_kernel for those of a
 * decode step with fp16 weights, and the kernels below for the rest.  Everything
 * runs on the default stream; a run synchronises only to download the
 * logits. */
#include <algorithm>
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <math.h>
#include <new>
#include <vector>

#include "cuda_check.h"
#include "mkv_cuda.h"

extern "C" {
#include "core/kvfill.h"
}

namespace {

const int NORM_THREADS = 256;
const int ATT_WARPS = 4;
const int MAX_HEAD_DIM = 256;  /* 8 channels per lane in causal_attend */
const size_t WEIGHT_ALIGN = 256;
const int MAX_CHUNK = 65535;

/* ------------------------------------------------------------ kernels */

__device__ __forceinline__ float load_weight(const float *w, size_t i) { return w[i]; }
__device__ __forceinline__ float load_weight(const __half *w, size_t i) { return __half2float(w[i]); }

template <typename W>
__global__ void embed_kernel(const W *emb, const int32_t *tokens, int dim, float *x)
{
    const size_t row = (size_t)tokens[blockIdx.x] * (size_t)dim;
    for (int c = threadIdx.x; c < dim; c += blockDim.x)
        x[(size_t)blockIdx.x * dim + c] = load_weight(emb, row + c);
}

/* One row per block; the sum of squares in double, like the CPU pass. */
__global__ void rmsnorm_kernel(const float *x, const float *w, int dim, float eps, float *out)
{
    __shared__ double part[NORM_THREADS];
    const float *xr = x + (size_t)blockIdx.x * dim;
    double ss = 0.0;
    for (int c = threadIdx.x; c < dim; c += blockDim.x)
        ss += (double)xr[c] * xr[c];
    part[threadIdx.x] = ss;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    const float scale = (float)(1.0 / sqrt(part[0] / dim + eps));
    for (int c = threadIdx.x; c < dim; c += blockDim.x)
        out[(size_t)blockIdx.x * dim + c] = xr[c] * scale * w[c];
}

/* cos and sin of every RoPE pair j at position pos0 + blockIdx.x, the
 * angle in double and both rounded to float, as mkv_rope_angle does:
 * cs [row][pairs], once per pass over the layers (every layer, q and k,
 * turns by the same angles). */
__global__ void rope_table_kernel(const double *inv_freq, int pairs, const int *row_pos, float2 *cs)
{
    const double pos = (double)row_pos[blockIdx.x];
    for (int j = threadIdx.x; j < pairs; j += blockDim.x) {
        double sd, cd;
        sincos(pos * inv_freq[j], &sd, &cd);
        cs[(size_t)blockIdx.x * pairs + j] = make_float2((float)cd, (float)sd);
    }
}

/* Head blockIdx.x (query heads, then key heads) of token row blockIdx.y,
 * request row_req[row] at position row_pos[row]: rotated by the angles of
 * cs (rope_table_kernel); a key head is then stored with its value head
 * into one layer's cache ([request][kv_head][max_seq][head_dim]) in fp16. */
__global__ void rope_store_kernel(float *q, float *k, const float *v, int n_heads, int n_kv_heads, int head_dim,
                                  int rope_dim, int half_layout, const float2 *cs, int64_t max_seq,
                                  const int *row_req, const int *row_pos, __half *kc, __half *vc)
{
    const int pairs = rope_dim / 2, row = blockIdx.y, h = blockIdx.x, kvh = h - n_heads;
    const float2 *angle = cs + (size_t)row * pairs;
    float *r = kvh < 0 ? q + ((size_t)row * n_heads + h) * head_dim : k + ((size_t)row * n_kv_heads + kvh) * head_dim;
    for (int j = threadIdx.x; j < pairs; j += blockDim.x) {
        float *a = r + (half_layout ? j : 2 * j);
        float *b = a + (half_layout ? pairs : 1);
        const float c = angle[j].x, s = angle[j].y;
        const float x0 = *a, x1 = *b;
        *a = x0 * c - x1 * s;
        *b = x0 * s + x1 * c;
    }
    if (kvh < 0 || kc == nullptr)   /* no dense cache: the caller takes k and v as they are */
        return;
    __syncthreads();
    const float *vr = v + ((size_t)row * n_kv_heads + kvh) * head_dim;
    const size_t at = (((size_t)row_req[row] * n_kv_heads + kvh) * (size_t)max_seq + (size_t)row_pos[row]) * head_dim;
    for (int c = threadIdx.x; c < head_dim; c += blockDim.x) {
        kc[at + c] = __float2half_rn(r[c]);
        vc[at + c] = __float2half_rn(vr[c]);
    }
}

__global__ void add_bias_kernel(float *y, const float *bias, int width, size_t total)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        y[i] += bias[i % width];
}

__global__ void swiglu_kernel(float *gate, const float *up, size_t total)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

__global__ void to_half_kernel(const float *src, __half *dst, size_t total)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2half_rn(src[i]);
}

/* Rows 0..n-1 of every layer and KV head: core/kvfill.h's values in fp16. */
/* Positions 0..n-1 of every layer, request and KV head (cache
 * [layer][request][kv_head][max_seq][head_dim]); request r's rows come
 * from seed + r x golden, so request 0's are the CPU pass's for seed. */
__global__ void fill_kv_kernel(int n_layers, int batch, int n_kv, int head_dim, int64_t max_seq, int n, uint64_t seed,
                               __half *kc, __half *vc)
{
    const size_t per_head = (size_t)n * head_dim, total = (size_t)n_layers * batch * n_kv * per_head;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t lh = i / per_head, rest = i % per_head, t = rest / head_dim, c = rest % head_dim;
        const int layer = (int)(lh / ((size_t)batch * n_kv)), req = (int)(lh / n_kv % batch), head = (int)(lh % n_kv);
        const uint64_t rs = seed + (uint64_t)req * 0x9e3779b97f4a7c15ull;
        const size_t at = (lh * (size_t)max_seq + t) * head_dim + c;
        kc[at] = __float2half_rn(mkv_kvfill_value(rs, layer, n_kv, head, (int64_t)t, head_dim, (int)c, 0));
        vc[at] = __float2half_rn(mkv_kvfill_value(rs, layer, n_kv, head, (int64_t)t, head_dim, (int)c, 1));
    }
}

/* Quest's page bounds take the keys just stored, one block per (row of
 * the pass, KV head) of one layer, each row at its request and position
 * (row_req, row_pos): a page's first key sets its minimum and maximum, a
 * later one widens them (kc [request][kv_head][max_seq][head_dim], meta
 * [request][kv_head][pages_max][2][head_dim], fp16). */
__global__ void quest_page_append_kernel(const __half *kc, __half *meta, const int *row_req, const int *row_pos,
                                         int n_kv, int64_t max_seq, int64_t pages_max, int page, int head_dim)
{
    const int row = blockIdx.x / n_kv, pos = row_pos[row];
    const size_t head = (size_t)row_req[row] * n_kv + blockIdx.x % n_kv;
    const __half *key = kc + (head * (size_t)max_seq + (size_t)pos) * head_dim;
    __half *mn = meta + (head * (size_t)pages_max + (size_t)(pos / page)) * 2 * head_dim, *mx = mn + head_dim;
    const int first = pos % page == 0;
    for (int c = threadIdx.x; c < head_dim; c += blockDim.x) {
        const __half k = key[c];
        mn[c] = first || __half2float(k) < __half2float(mn[c]) ? k : mn[c];
        mx[c] = first || __half2float(k) > __half2float(mx[c]) ? k : mx[c];
    }
}

__device__ __forceinline__ float warp_max(float x)
{
    for (int o = 16; o > 0; o >>= 1)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

__device__ __forceinline__ float warp_sum(float x)
{
    for (int o = 16; o > 0; o >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

/* ---------------------------------------------- decode-step products */

/* One token's matrix-vector products with fp16 weights, the whole step's
 * cost at batch 1: every weight byte is read once, so the kernel streams
 * rows at copy bandwidth (16-byte loads, several in flight per lane) and
 * folds in what cuBLAS needed separate kernels for: the RMSNorm of its
 * input, the biases, the residual add and SwiGLU. */
enum gemv_kind {
    GEMV_STORE,   /* y = W x (+ bias), the rows split over up to three outputs (q, k, v) */
    GEMV_ADD,     /* y += W x: the residual */
    GEMV_SWIGLU,  /* y = silu(W x) * (W_up x) */
};

struct gemv_job {
    const __half *w, *w_up;  /* [rows][in], row-major; w_up only for GEMV_SWIGLU */
    const float *x;          /* [in] */
    const float *norm;       /* RMSNorm weights applied to x first, or NULL */
    float eps;
    int in, rows, kind;
    float *y[3];             /* GEMV_STORE: rows [0, split[0]) to y[0], [split[0], split[1]) to y[1], the rest to y[2] */
    const float *bias[3];
    int split[2];
};

const int GEMV_WARPS = 8;
const int GEMV_UNROLL = 8;

__device__ __forceinline__ float dot8(uint4 w, float4 lo, float4 hi, float acc)
{
    const __half2 *h = reinterpret_cast<const __half2 *>(&w);
    const float2 a = __half22float2(h[0]), b = __half22float2(h[1]), c = __half22float2(h[2]),
                 d = __half22float2(h[3]);
    acc = fmaf(a.x, lo.x, acc);
    acc = fmaf(a.y, lo.y, acc);
    acc = fmaf(b.x, lo.z, acc);
    acc = fmaf(b.y, lo.w, acc);
    acc = fmaf(c.x, hi.x, acc);
    acc = fmaf(c.y, hi.y, acc);
    acc = fmaf(d.x, hi.z, acc);
    return fmaf(d.y, hi.w, acc);
}

/* Each warp takes two weight rows at a time against the block's copy of x
 * in shared memory: rows r and r + 1 of w, or row r of w and of w_up.
 * VEC (in a multiple of 8, rows and x 16-byte aligned): x is kept as two
 * planes of float4, channels 8i..8i+3 and 8i+4..8i+7, so that lane l's
 * reads of group i are consecutive and free of bank conflicts. */
template <bool VEC>
__global__ void __launch_bounds__(32 * GEMV_WARPS) gemv_kernel(gemv_job j)
{
    extern __shared__ float4 xs4[];
    float *xs = reinterpret_cast<float *>(xs4);
    __shared__ double part[GEMV_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n8 = j.in / 8;
    /* One pass over x: the block's copy holds x times the norm weights; the
     * sum of squares (in double, like the CPU pass) gives the RMS scale,
     * applied to each finished dot product. */
    double ss = 0.0;
    if (VEC) {
        const float4 *x4 = reinterpret_cast<const float4 *>(j.x), *w4 = reinterpret_cast<const float4 *>(j.norm);
#pragma unroll 4
        for (int i = threadIdx.x; i < 2 * n8; i += blockDim.x) {
            float4 v = x4[i];
            if (j.norm) {
                const float4 w = w4[i];
                ss += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
                v = make_float4(v.x * w.x, v.y * w.y, v.z * w.z, v.w * w.w);
            }
            xs4[(i % 2) * n8 + i / 2] = v;
        }
    } else {
        for (int c = threadIdx.x; c < j.in; c += blockDim.x) {
            const float v = j.x[c];
            if (j.norm)
                ss += (double)v * v;
            xs[c] = j.norm ? v * j.norm[c] : v;
        }
    }
    float scale = 1.0f;
    if (j.norm) {
        for (int o = 16; o > 0; o >>= 1)
            ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0)
            part[warp] = ss;
    }
    __syncthreads();
    if (j.norm) {
        double total = 0.0;
        for (int w = 0; w < GEMV_WARPS; w++)
            total += part[w];
        scale = (float)(1.0 / sqrt(total / j.in + j.eps));
    }
    const int swiglu = j.kind == GEMV_SWIGLU, per_warp = swiglu ? 1 : 2;
    for (int r = (blockIdx.x * GEMV_WARPS + warp) * per_warp; r < j.rows; r += gridDim.x * GEMV_WARPS * per_warp) {
        const int second = swiglu ? r : (r + 1 < j.rows ? r + 1 : r);
        const __half *wa = j.w + (size_t)r * j.in, *wb = (swiglu ? j.w_up : j.w) + (size_t)second * j.in;
        float sa = 0.0f, sb = 0.0f;
        if (VEC) {
            const uint4 *pa = reinterpret_cast<const uint4 *>(wa), *pb = reinterpret_cast<const uint4 *>(wb);
            const float4 *hi = xs4 + n8;
            int i = lane;
            for (; i + 32 * (GEMV_UNROLL - 1) < n8; i += 32 * GEMV_UNROLL) {
                uint4 va[GEMV_UNROLL], vb[GEMV_UNROLL];
#pragma unroll
                for (int u = 0; u < GEMV_UNROLL; u++) {
                    va[u] = __ldcs(pa + i + 32 * u);
                    vb[u] = __ldcs(pb + i + 32 * u);
                }
#pragma unroll
                for (int u = 0; u < GEMV_UNROLL; u++) {
                    const float4 lo4 = xs4[i + 32 * u], hi4 = hi[i + 32 * u];
                    sa = dot8(va[u], lo4, hi4, sa);
                    sb = dot8(vb[u], lo4, hi4, sb);
                }
            }
            for (; i < n8; i += 32) {
                const uint4 va = __ldcs(pa + i), vb = __ldcs(pb + i);
                sa = dot8(va, xs4[i], hi[i], sa);
                sb = dot8(vb, xs4[i], hi[i], sb);
            }
        } else {
            for (int c = lane; c < j.in; c += 32) {
                sa = fmaf(__half2float(wa[c]), xs[c], sa);
                sb = fmaf(__half2float(wb[c]), xs[c], sb);
            }
        }
        sa = warp_sum(sa) * scale;
        sb = warp_sum(sb) * scale;
        if (lane != 0)
            continue;
        if (swiglu) {
            j.y[0][r] = sa / (1.0f + expf(-sa)) * sb;
            continue;
        }
        for (int t = 0; t < 2 && r + t < j.rows; t++) {
            const int row = r + t;
            const float s = t ? sb : sa;
            if (j.kind == GEMV_ADD) {
                j.y[0][row] += s;
            } else {
                float *y = j.y[0];
                const float *bias = j.bias[0];
                int at = row;
                if (row >= j.split[1]) {
                    y = j.y[2];
                    bias = j.bias[2];
                    at = row - j.split[1];
                } else if (row >= j.split[0]) {
                    y = j.y[1];
                    bias = j.bias[1];
                    at = row - j.split[0];
                }
                y[at] = bias ? s + bias[at] : s;
            }
        }
    }
}

/* Causal attention of query row blockIdx.y (position pos0 + row), head
 * blockIdx.x, over the cache rows 0..pos0+row of its KV head.  Each warp
 * takes tiles of 32 keys (one score per lane), keeps an online softmax,
 * and accumulates values with lane l owning channels l, l+32, ...; the
 * warps merge by their maxima at the end. */
template <int CH>
__global__ void causal_attend_kernel(const float *q, const __half *kc, const __half *vc, int n_heads, int group,
                                     int head_dim, int64_t max_seq, int pos0, float scale, float *out)
{
    extern __shared__ float sh[];
    float *qs = sh, *wm = qs + head_dim, *wl = wm + ATT_WARPS, *wacc = wl + ATT_WARPS;
    const int h = blockIdx.x, r = blockIdx.y, kvh = h / group;
    const int visible = pos0 + r + 1;
    const size_t q_at = ((size_t)r * n_heads + h) * head_dim;
    for (int c = threadIdx.x; c < head_dim; c += blockDim.x)
        qs[c] = q[q_at + c] * scale;
    __syncthreads();
    const __half *K = kc + (size_t)kvh * (size_t)max_seq * head_dim;
    const __half *V = vc + (size_t)kvh * (size_t)max_seq * head_dim;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float m = -INFINITY, l = 0.0f, acc[CH];
#pragma unroll
    for (int i = 0; i < CH; i++)
        acc[i] = 0.0f;
    for (int base = warp * 32; base < visible; base += ATT_WARPS * 32) {
        const int t = base + lane;
        float s = -INFINITY;
        if (t < visible) {
            const __half *kr = K + (size_t)t * head_dim;
            float dot = 0.0f;
            for (int c = 0; c < head_dim; c++)
                dot += qs[c] * __half2float(kr[c]);
            s = dot;
        }
        const float m_new = fmaxf(m, warp_max(s));
        const float corr = expf(m - m_new);
        const float p = t < visible ? expf(s - m_new) : 0.0f;
        l = l * corr + warp_sum(p);
        const int count = min(32, visible - base);
#pragma unroll
        for (int i = 0; i < CH; i++)
            acc[i] *= corr;
        for (int j = 0; j < count; j++) {
            const float pj = __shfl_sync(0xffffffffu, p, j);
            const __half *vr = V + (size_t)(base + j) * head_dim;
#pragma unroll
            for (int i = 0; i < CH; i++) {
                const int c = lane + 32 * i;
                if (c < head_dim)
                    acc[i] += pj * __half2float(vr[c]);
            }
        }
        m = m_new;
    }
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < CH; i++) {
        const int c = lane + 32 * i;
        if (c < head_dim)
            wacc[warp * head_dim + c] = acc[i];
    }
    __syncthreads();
    for (int c = threadIdx.x; c < head_dim; c += blockDim.x) {
        float M = -INFINITY;
        for (int w = 0; w < ATT_WARPS; w++)
            M = fmaxf(M, wm[w]);
        float L = 0.0f, o = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            if (wl[w] > 0.0f) {
                const float e = expf(wm[w] - M);
                L += wl[w] * e;
                o += wacc[w * head_dim + c] * e;
            }
        out[q_at + c] = o / L;
    }
}

unsigned grid_for(size_t total)
{
    const size_t blocks = (total + 255) / 256;
    return (unsigned)(blocks < 65535 ? (blocks ? blocks : 1) : 65535);
}

/* ------------------------------------------------------------ state */

struct layer_dev {
    const float *rms_att, *rms_ffn, *bq, *bk, *bv;
    const void *wq, *wk, *wv, *wo, *w1, *w2, *w3;
};

/* Owns a dense decode plan for the length of one step. */
struct plan_guard {
    mkv_dense_plan *p = nullptr;
    ~plan_guard() { mkv_cuda_dense_plan_free(p); }
};

}  // namespace

struct mkv_cuda_llama {
    mkv_cuda_llama_desc d = {};
    int q_dim = 0, kv_dim = 0, group = 0;
    int batch = 1;                  /* requests, each with its own cache rows and position */
    std::vector<int> pos;           /* [batch]: the positions each request has run */
    int dense_decode = 0;           /* the dense decode kernel takes this shape */
    int step_gemv = 0;              /* fp16 weights whose widest input fits gemv_kernel's shared memory */
    int sms = 0;
    int quest = 0;                  /* decode steps attend with the Quest kernels */
    mkv_quest_params qp = {};
    int64_t quest_pages_max = 0;
    size_t quest_layer_elems = 0;                 /* a layer's bounds: [request][kv_head][pages_max][2][head_dim] */
    mkv_device_buffer quest_meta, quest_tokens;   /* bounds [layer][...]; a step's tokens */
    mkv_quest_plan *quest_plan = nullptr;         /* the running step's */
    int mosaic = 0;                 /* decode steps attend the packed MosaicKV cache pc */
    mkv_packed_cache *pc = nullptr;
    mkv_packed_params mp = {};
    std::vector<mkv_packed_plan *> mosaic_plans;  /* per layer, advanced step by step */
    uint64_t step_read = 0;
    cublasHandle_t blas = nullptr;
    mkv_device_buffer weights, inv_freq, rope_cs, kcache, vcache;
    mkv_device_buffer x, xb, q, k, v, att, h1, h3, xh, tokens, logits;
    mkv_device_buffer row_req, row_pos;           /* a pass's rows: request and position of each */
    const void *emb = nullptr, *cls = nullptr;
    const float *rms_final = nullptr;
    std::vector<layer_dev> layers;
    ~mkv_cuda_llama()
    {
        mkv_cuda_quest_plan_free(quest_plan);
        for (mkv_packed_plan *p : mosaic_plans)
            mkv_cuda_mosaic_plan_free(p);
        mkv_cuda_mosaic_free(pc);
        if (blas)
            (void)cublasDestroy(blas);
    }
};

namespace {

size_t elem_bytes(const mkv_cuda_llama *g) { return g->d.weights_f16 ? 2 : 4; }

/* Lays the tensors out in one allocation and uploads them. */
struct weight_loader {
    mkv_cuda_llama *g;
    size_t offset = 0;
    char *base = nullptr;          /* NULL while sizing */
    mkv_device_buffer staging;     /* float32 of one matrix, for fp16 weights */

    /* A vector kept in float32 (norms, biases); NULL stays NULL. */
    int vec(const float *src, size_t n, const float **dst, mkv_error *err)
    {
        if (!src) {
            *dst = nullptr;
            return MKV_OK;
        }
        *dst = (const float *)place(n * 4);
        if (base)
            MKV_CUDA_CHECK(cudaMemcpy((void *)*dst, src, n * 4, cudaMemcpyHostToDevice));
        return MKV_OK;
    }

    /* A matrix in the weight type. */
    int mat(const float *src, size_t n, const void **dst, mkv_error *err)
    {
        return upload(src, n, place(n * elem_bytes(g)), dst, err);
    }

    /* Matrices back to back, in one placement: a layer's wq, wk and wv,
     * which the decode step multiplies as one matrix. */
    int mats(const float *const *src, const size_t *n, int count, const void **dst, mkv_error *err)
    {
        size_t total = 0;
        for (int i = 0; i < count; i++)
            total += n[i];
        char *at = (char *)place(total * elem_bytes(g));
        for (int i = 0; i < count; i++) {
            int rc = upload(src[i], n[i], at, &dst[i], err);
            if (rc)
                return rc;
            if (at)
                at += n[i] * elem_bytes(g);
        }
        return MKV_OK;
    }

    int upload(const float *src, size_t n, void *at, const void **dst, mkv_error *err)
    {
        *dst = at;
        if (!base)
            return MKV_OK;
        if (!g->d.weights_f16) {
            MKV_CUDA_CHECK(cudaMemcpy((void *)*dst, src, n * 4, cudaMemcpyHostToDevice));
            return MKV_OK;
        }
        if (staging.bytes < n * 4)
            MKV_CUDA_CHECK(staging.alloc(n * 4));
        MKV_CUDA_CHECK(cudaMemcpy(staging.ptr, src, n * 4, cudaMemcpyHostToDevice));
        to_half_kernel<<<grid_for(n), 256>>>(staging.as<float>(), (__half *)*dst, n);
        MKV_CUDA_CHECK_LAUNCH();
        return MKV_OK;
    }

    void *place(size_t bytes)
    {
        void *p = base ? base + offset : nullptr;
        offset += (bytes + WEIGHT_ALIGN - 1) / WEIGHT_ALIGN * WEIGHT_ALIGN;
        return p;
    }

    /* Every tensor once: sizing with base NULL, then uploading. */
    int all(mkv_error *err)
    {
        const mkv_cuda_llama_desc *d = &g->d;
        const size_t dim = d->dim, hid = d->hidden_dim, qd = g->q_dim, kvd = g->kv_dim, V = d->vocab_size;
        offset = 0;
        int rc;
        if ((rc = mat(d->tok_embedding, V * dim, &g->emb, err)))
            return rc;
        if (d->classifier == d->tok_embedding)
            g->cls = g->emb;
        else if ((rc = mat(d->classifier, V * dim, &g->cls, err)))
            return rc;
        if ((rc = vec(d->rms_final, dim, &g->rms_final, err)))
            return rc;
        for (int l = 0; l < d->n_layers; l++) {
            const mkv_cuda_llama_layer *s = &d->layers[l];
            layer_dev *t = &g->layers[l];
            if ((rc = vec(s->rms_att, dim, &t->rms_att, err)) || (rc = vec(s->rms_ffn, dim, &t->rms_ffn, err)) ||
                (rc = vec(s->bq, qd, &t->bq, err)) || (rc = vec(s->bk, kvd, &t->bk, err)) ||
                (rc = vec(s->bv, kvd, &t->bv, err)))
                return rc;
            const float *qkv[3] = {s->wq, s->wk, s->wv};
            const size_t qkv_n[3] = {qd * dim, kvd * dim, kvd * dim};
            const void *qkv_dev[3];
            if ((rc = mats(qkv, qkv_n, 3, qkv_dev, err)))
                return rc;
            t->wq = qkv_dev[0];
            t->wk = qkv_dev[1];
            t->wv = qkv_dev[2];
            if ((rc = mat(s->wo, dim * qd, &t->wo, err)) || (rc = mat(s->w1, hid * dim, &t->w1, err)) ||
                (rc = mat(s->w2, dim * hid, &t->w2, err)) || (rc = mat(s->w3, hid * dim, &t->w3, err)))
                return rc;
        }
        return MKV_OK;
    }
};

int check_desc(const mkv_cuda_llama_desc *d, mkv_error *err)
{
    const char *what = "GPU forward pass";
    if (!d || !d->tok_embedding || !d->rms_final || !d->classifier || !d->layers || !d->rope_inv_freq)
        return mkv_fail(err, MKV_EUSAGE, "%s: missing weights", what);
    if (d->dim < 1 || d->hidden_dim < 1 || d->n_layers < 1 || d->n_heads < 1 || d->n_kv_heads < 1 ||
        d->head_dim < 1 || d->vocab_size < 1 || d->max_seq_len < 1 || d->chunk < 1)
        return mkv_fail(err, MKV_EUSAGE, "%s: shapes must be positive", what);
    if (d->n_heads % d->n_kv_heads != 0)
        return mkv_fail(err, MKV_EUSAGE, "%s: %d query heads are not a multiple of %d KV heads", what,
                        d->n_heads, d->n_kv_heads);
    if (d->rope_dim < 0 || d->rope_dim % 2 != 0 || d->rope_dim > d->head_dim)
        return mkv_fail(err, MKV_EUSAGE, "%s: rope_dim %d must be even and at most head_dim %d", what,
                        d->rope_dim, d->head_dim);
    if (d->head_dim > MAX_HEAD_DIM)
        return mkv_fail(err, MKV_EUNSUP, "%s: head_dim %d; the GPU attention takes at most %d", what,
                        d->head_dim, MAX_HEAD_DIM);
    for (int l = 0; l < d->n_layers; l++) {
        const mkv_cuda_llama_layer *s = &d->layers[l];
        if (!s->rms_att || !s->rms_ffn || !s->wq || !s->wk || !s->wv || !s->wo || !s->w1 || !s->w2 || !s->w3)
            return mkv_fail(err, MKV_EUSAGE, "%s: layer %d lacks weights", what, l);
    }
    return MKV_OK;
}

/* The decode step's products go through gemv_kernel when the weights are
 * fp16 and the widest input row fits in a block's shared memory. */
int setup_gemv(mkv_cuda_llama *g, mkv_error *err)
{
    const mkv_cuda_llama_desc *d = &g->d;
    int dev = 0, optin = 0;
    MKV_CUDA_CHECK(cudaGetDevice(&dev));
    MKV_CUDA_CHECK(cudaDeviceGetAttribute(&g->sms, cudaDevAttrMultiProcessorCount, dev));
    MKV_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    const size_t widest = (size_t)std::max(std::max(d->dim, g->q_dim), d->hidden_dim);
    const size_t shared = widest * sizeof(float);
    if (!d->weights_f16 || shared + GEMV_WARPS * sizeof(double) > (size_t)optin)
        return MKV_OK;
    MKV_CUDA_CHECK(cudaFuncSetAttribute(gemv_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
    MKV_CUDA_CHECK(cudaFuncSetAttribute(gemv_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
    g->step_gemv = 1;
    return MKV_OK;
}

int setup(mkv_cuda_llama *g, mkv_error *err)
{
    const mkv_cuda_llama_desc *d = &g->d;
    MKV_CUBLAS_CHECK(cublasCreate(&g->blas));
    /* fp32 products stay fp32 (no TF32), so the pass stays close to the CPU's */
    MKV_CUBLAS_CHECK(cublasSetMathMode(g->blas, CUBLAS_DEFAULT_MATH));
    g->layers.assign((size_t)d->n_layers, layer_dev{});
    weight_loader wl{g};
    int rc = wl.all(err);
    if (rc)
        return rc;
    MKV_CUDA_CHECK(g->weights.alloc(wl.offset));
    wl.base = g->weights.as<char>();
    if ((rc = wl.all(err)))
        return rc;
    if ((rc = setup_gemv(g, err)))
        return rc;
    const size_t pairs = (size_t)d->rope_dim / 2;
    MKV_CUDA_CHECK(g->inv_freq.alloc(pairs * sizeof(double)));
    MKV_CUDA_CHECK(cudaMemcpy(g->inv_freq.ptr, d->rope_inv_freq, pairs * sizeof(double), cudaMemcpyHostToDevice));
    MKV_CUDA_CHECK(g->rope_cs.alloc((size_t)d->chunk * (pairs ? pairs : 1) * sizeof(float2)));
    if (!d->external_cache) {
        const size_t cache =
            (size_t)d->n_layers * g->batch * d->n_kv_heads * (size_t)d->max_seq_len * d->head_dim * 2;
        MKV_CUDA_CHECK(g->kcache.alloc(cache));
        MKV_CUDA_CHECK(g->vcache.alloc(cache));
    }
    const size_t ch = (size_t)d->chunk, widest = (size_t)std::max(std::max(d->dim, g->q_dim), d->hidden_dim);
    MKV_CUDA_CHECK(g->x.alloc(ch * d->dim * 4));
    MKV_CUDA_CHECK(g->xb.alloc(ch * d->dim * 4));
    MKV_CUDA_CHECK(g->q.alloc(ch * g->q_dim * 4));
    MKV_CUDA_CHECK(g->k.alloc(ch * g->kv_dim * 4));
    MKV_CUDA_CHECK(g->v.alloc(ch * g->kv_dim * 4));
    MKV_CUDA_CHECK(g->att.alloc(ch * g->q_dim * 4));
    MKV_CUDA_CHECK(g->h1.alloc(ch * d->hidden_dim * 4));
    MKV_CUDA_CHECK(g->h3.alloc(ch * d->hidden_dim * 4));
    MKV_CUDA_CHECK(g->xh.alloc(ch * widest * 2));
    MKV_CUDA_CHECK(g->tokens.alloc(ch * 4));
    MKV_CUDA_CHECK(g->row_req.alloc(ch * 4));
    MKV_CUDA_CHECK(g->row_pos.alloc(ch * 4));
    MKV_CUDA_CHECK(g->logits.alloc((size_t)g->batch * d->vocab_size * 4));
    MKV_CUDA_CHECK(cudaDeviceSynchronize());
    return MKV_OK;
}

/* The GEMM's right operand: x itself, or x rounded to fp16 for fp16 weights. */
int operand(mkv_cuda_llama *g, const float *x, size_t count, const void **out, mkv_error *err)
{
    if (!g->d.weights_f16) {
        *out = x;
        return MKV_OK;
    }
    to_half_kernel<<<grid_for(count), 256>>>(x, g->xh.as<__half>(), count);
    MKV_CUDA_CHECK_LAUNCH();
    *out = g->xh.ptr;
    return MKV_OK;
}

/* y [n][out] = beta y + x [n][in] . W^T, W row-major [out x in]: in cuBLAS's
 * column-major terms y^T = W^T' x^T with W read transposed. */
int gemm(mkv_cuda_llama *g, const void *w, int in, int out, int n, const void *x, float *y, float beta,
         mkv_error *err)
{
    const float one = 1.0f;
    if (g->d.weights_f16)
        MKV_CUBLAS_CHECK(cublasGemmEx(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, w, CUDA_R_16F, in, x,
                                      CUDA_R_16F, in, &beta, y, CUDA_R_32F, out, CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT));
    else
        MKV_CUBLAS_CHECK(cublasSgemm(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, (const float *)w, in,
                                     (const float *)x, in, &beta, y, out));
    return MKV_OK;
}

int add_bias(float *y, const float *bias, int width, int n, mkv_error *err)
{
    if (!bias)
        return MKV_OK;
    const size_t total = (size_t)width * n;
    add_bias_kernel<<<grid_for(total), 256>>>(y, bias, width, total);
    MKV_CUDA_CHECK_LAUNCH();
    return MKV_OK;
}

int rmsnorm(const mkv_cuda_llama *g, const float *x, const float *w, int rows, float *out, mkv_error *err)
{
    rmsnorm_kernel<<<rows, NORM_THREADS>>>(x, w, g->d.dim, g->d.rms_eps, out);
    MKV_CUDA_CHECK_LAUNCH();
    return MKV_OK;
}

template <int CH>
void launch_causal(const mkv_cuda_llama *g, const __half *kc, const __half *vc, int pos0, int n)
{
    const mkv_cuda_llama_desc *d = &g->d;
    const size_t shared = ((size_t)d->head_dim * (1 + ATT_WARPS) + 2 * ATT_WARPS) * sizeof(float);
    causal_attend_kernel<CH><<<dim3(d->n_heads, n), 32 * ATT_WARPS, shared>>>(
        g->q.as<float>(), kc, vc, d->n_heads, g->group, d->head_dim, d->max_seq_len, pos0,
        (float)(1.0 / sqrt((double)d->head_dim)), g->att.as<float>());
}

/* A decode step of layer l over the packed cache: the new token grows
 * the layer's heads, the layer's plan moves to pos (a new plan when it
 * has no room), then the packed attention. */
int attend_mosaic(mkv_cuda_llama *g, int l, mkv_error *err)
{
    const int kv = g->d.n_kv_heads, B = g->batch;
    /* heads (l, request, kv_head) in that order: the rows of k and v */
    int rc = mkv_cuda_mosaic_grow(g->pc, l * B * kv, B * kv, g->k.as<float>(), g->v.as<float>(), NULL, err);
    if (rc)
        return rc;
    std::vector<int64_t> at(g->pos.begin(), g->pos.end());
    int replan = 1;
    mkv_packed_plan *&p = g->mosaic_plans[(size_t)l];
    if (p && (rc = mkv_cuda_mosaic_plan_advance(p, at.data(), NULL, &replan, err)))
        return rc;
    if (replan) {
        mkv_cuda_mosaic_plan_free(p);
        p = nullptr;
        std::vector<int32_t> heads((size_t)B * kv);
        for (int h = 0; h < B * kv; h++)
            heads[(size_t)h] = l * B * kv + h;
        if ((rc = mkv_cuda_mosaic_plan(g->pc, &g->mp, heads.data(), at.data(), &p, err)))
            return rc;
    }
    return mkv_cuda_mosaic_run(p, g->q.as<float>(), g->att.as<float>(), NULL, err);
}

/* Layer l's attention for a pass: a decode step of every request (req < 0:
 * the dense plan over the batch, or MosaicKV), a decode step of request req
 * (the dense plan of one request, Quest, MosaicKV), or a chunk of request
 * req from pos0 on (the causal kernel). */
int attend(mkv_cuda_llama *g, int l, int req, int pos0, int n, const mkv_dense_plan *plan, mkv_error *err)
{
    const mkv_cuda_llama_desc *d = &g->d;
    if (g->mosaic)
        return attend_mosaic(g, l, err);
    const size_t per_req = (size_t)d->n_kv_heads * (size_t)d->max_seq_len * d->head_dim, layer = per_req * g->batch;
    const __half *kc = g->kcache.as<__half>() + (size_t)l * layer, *vc = g->vcache.as<__half>() + (size_t)l * layer;
    if (g->quest) {
        /* a step of every request, or of the only one */
        __half *meta = g->quest_meta.as<__half>() + (size_t)l * g->quest_layer_elems;
        const int rows = req < 0 ? g->batch : 1;
        quest_page_append_kernel<<<(unsigned)(rows * d->n_kv_heads), 128>>>(
            kc, meta, g->row_req.as<int>(), g->row_pos.as<int>(), d->n_kv_heads, d->max_seq_len, g->quest_pages_max,
            g->qp.page_size, d->head_dim);
        MKV_CUDA_CHECK_LAUNCH();
        int rc;
        if ((rc = mkv_cuda_quest_select(g->quest_plan, g->q.as<float>(), (const uint16_t *)meta, NULL, err)) ||
            (rc = mkv_cuda_quest_attend(g->quest_plan, g->q.as<float>(), (const uint16_t *)kc,
                                        (const uint16_t *)vc, g->att.as<float>(), NULL, err)))
            return rc;
        return mkv_cuda_quest_add_tokens(g->quest_plan, g->quest_tokens.as<unsigned long long>(), NULL, err);
    }
    if (req > 0) {
        kc += (size_t)req * per_req;
        vc += (size_t)req * per_req;
    }
    if (plan)
        return mkv_cuda_dense_run(plan, g->q.as<float>(), (const uint16_t *)kc, (const uint16_t *)vc,
                                  g->att.as<float>(), NULL, err);
    if (d->head_dim <= 32)
        launch_causal<1>(g, kc, vc, pos0, n);
    else if (d->head_dim <= 64)
        launch_causal<2>(g, kc, vc, pos0, n);
    else if (d->head_dim <= 128)
        launch_causal<4>(g, kc, vc, pos0, n);
    else
        launch_causal<8>(g, kc, vc, pos0, n);
    MKV_CUDA_CHECK_LAUNCH();
    return MKV_OK;
}

/* Rotate the pass's q and k and store its K/V rows into layer l's cache,
 * each at its request and position (row_req, row_pos). */
int rope_store(mkv_cuda_llama *g, int l, int n, mkv_error *err)
{
    const mkv_cuda_llama_desc *d = &g->d;
    const size_t layer = (size_t)g->batch * d->n_kv_heads * (size_t)d->max_seq_len * d->head_dim;
    __half *kc = g->kcache.ptr ? g->kcache.as<__half>() + (size_t)l * layer : nullptr;
    __half *vc = g->vcache.ptr ? g->vcache.as<__half>() + (size_t)l * layer : nullptr;
    rope_store_kernel<<<dim3(d->n_heads + d->n_kv_heads, n), 64>>>(
        g->q.as<float>(), g->k.as<float>(), g->v.as<float>(), d->n_heads, d->n_kv_heads, d->head_dim, d->rope_dim,
        d->rope_half, g->rope_cs.as<float2>(), d->max_seq_len, g->row_req.as<int>(), g->row_pos.as<int>(), kc, vc);
    MKV_CUDA_CHECK_LAUNCH();
    return MKV_OK;
}

gemv_job make_gemv(const void *w, int in, int rows, gemv_kind kind, const float *x, float *y)
{
    gemv_job j = {};
    j.w = (const __half *)w;
    j.in = in;
    j.rows = rows;
    j.kind = kind;
    j.x = x;
    j.y[0] = y;
    j.split[0] = j.split[1] = rows;
    return j;
}

gemv_job normed(gemv_job j, const float *norm, float eps)
{
    j.norm = norm;
    j.eps = eps;
    return j;
}

int gemv(const mkv_cuda_llama *g, const gemv_job &j, mkv_error *err)
{
    const int per_block = GEMV_WARPS * (j.kind == GEMV_SWIGLU ? 1 : 2);
    const int groups = (j.rows + per_block - 1) / per_block;
    const unsigned grid = (unsigned)std::min(groups, g->sms * 8);
    const size_t shared = (size_t)j.in * sizeof(float);
    if (j.in % 8 == 0)
        gemv_kernel<true><<<grid, 32 * GEMV_WARPS, shared>>>(j);
    else
        gemv_kernel<false><<<grid, 32 * GEMV_WARPS, shared>>>(j);
    MKV_CUDA_CHECK_LAUNCH();
    return MKV_OK;
}

/* One layer for one token (n = 1) with gemv_kernel: q, k and v in one
 * product (weight_loader places their weights back to back), the gate and
 * up projections in another. */
int layer_step(mkv_cuda_llama *g, int l, int pos0, const mkv_dense_plan *plan, mkv_error *err)
{
    const mkv_cuda_llama_desc *d = &g->d;
    const layer_dev *w = &g->layers[(size_t)l];
    const int dim = d->dim, qd = g->q_dim, kvd = g->kv_dim;
    const float eps = d->rms_eps;
    float *x = g->x.as<float>(), *q = g->q.as<float>(), *k = g->k.as<float>(), *v = g->v.as<float>();
    gemv_job qkv = normed(make_gemv(w->wq, dim, qd + 2 * kvd, GEMV_STORE, x, q), w->rms_att, eps);
    qkv.y[1] = k;
    qkv.y[2] = v;
    qkv.bias[0] = w->bq;
    qkv.bias[1] = w->bk;
    qkv.bias[2] = w->bv;
    qkv.split[0] = qd;
    qkv.split[1] = qd + kvd;
    int rc = gemv(g, qkv, err);
    if (rc || (rc = rope_store(g, l, 1, err)) || (rc = attend(g, l, 0, pos0, 1, plan, err)) ||
        (rc = gemv(g, make_gemv(w->wo, qd, dim, GEMV_ADD, g->att.as<float>(), x), err)))
        return rc;
    gemv_job ffn = normed(make_gemv(w->w1, dim, d->hidden_dim, GEMV_SWIGLU, x, g->h1.as<float>()), w->rms_ffn, eps);
    ffn.w_up = (const __half *)w->w3;
    if ((rc = gemv(g, ffn, err)))
        return rc;
    return gemv(g, make_gemv(w->w2, d->hidden_dim, dim, GEMV_ADD, g->h1.as<float>(), x), err);
}

/* One layer for a chunk of n tokens with cuBLAS. */
int layer_chunk(mkv_cuda_llama *g, int l, int req, int pos0, int n, const mkv_dense_plan *plan, mkv_error *err)
{
    const mkv_cuda_llama_desc *d = &g->d;
    const layer_dev *w = &g->layers[(size_t)l];
    const int dim = d->dim, hid = d->hidden_dim;
    float *x = g->x.as<float>(), *xb = g->xb.as<float>(), *q = g->q.as<float>(), *k = g->k.as<float>();
    float *v = g->v.as<float>(), *h1 = g->h1.as<float>(), *h3 = g->h3.as<float>();
    const void *in;
    int rc;
    if ((rc = rmsnorm(g, x, w->rms_att, n, xb, err)) || (rc = operand(g, xb, (size_t)n * dim, &in, err)) ||
        (rc = gemm(g, w->wq, dim, g->q_dim, n, in, q, 0.0f, err)) ||
        (rc = gemm(g, w->wk, dim, g->kv_dim, n, in, k, 0.0f, err)) ||
        (rc = gemm(g, w->wv, dim, g->kv_dim, n, in, v, 0.0f, err)) ||
        (rc = add_bias(q, w->bq, g->q_dim, n, err)) || (rc = add_bias(k, w->bk, g->kv_dim, n, err)) ||
        (rc = add_bias(v, w->bv, g->kv_dim, n, err)) || (rc = rope_store(g, l, n, err)) ||
        (rc = attend(g, l, req, pos0, n, plan, err)) ||
        (rc = operand(g, g->att.as<float>(), (size_t)n * g->q_dim, &in, err)) ||
        (rc = gemm(g, w->wo, g->q_dim, dim, n, in, x, 1.0f, err)) ||
        (rc = rmsnorm(g, x, w->rms_ffn, n, xb, err)) || (rc = operand(g, xb, (size_t)n * dim, &in, err)) ||
        (rc = gemm(g, w->w1, dim, hid, n, in, h1, 0.0f, err)) ||
        (rc = gemm(g, w->w3, dim, hid, n, in, h3, 0.0f, err)))
        return rc;
    const size_t total = (size_t)n * hid;
    swiglu_kernel<<<grid_for(total), 256>>>(h1, h3, total);
    MKV_CUDA_CHECK_LAUNCH();
    if ((rc = operand(g, h1, total, &in, err)))
        return rc;
    return gemm(g, w->w2, hid, dim, n, in, x, 1.0f, err);
}

/* One pass over the layers: n tokens of request req from its position on
 * (a prefill chunk, or its decode step when n is 1), or with req < 0 a
 * decode step of every request (n = batch, row b request b's token).
 * logits (host): the last row's, or every row's for a step of every
 * request; NULL for none. */
int run_pass(mkv_cuda_llama *g, const int32_t *tokens, int n, int req, float *logits, mkv_error *err)
{
    const mkv_cuda_llama_desc *d = &g->d;
    const bool all = req < 0;
    std::vector<int> rr((size_t)n), rp((size_t)n);
    for (int i = 0; i < n; i++) {
        rr[(size_t)i] = all ? i : req;
        rp[(size_t)i] = all ? g->pos[(size_t)i] : g->pos[(size_t)req] + i;
    }
    MKV_CUDA_CHECK(cudaMemcpy(g->tokens.ptr, tokens, (size_t)n * 4, cudaMemcpyHostToDevice));
    MKV_CUDA_CHECK(cudaMemcpy(g->row_req.ptr, rr.data(), (size_t)n * 4, cudaMemcpyHostToDevice));
    MKV_CUDA_CHECK(cudaMemcpy(g->row_pos.ptr, rp.data(), (size_t)n * 4, cudaMemcpyHostToDevice));
    if (d->weights_f16)
        embed_kernel<<<n, 256>>>((const __half *)g->emb, g->tokens.as<int32_t>(), d->dim, g->x.as<float>());
    else
        embed_kernel<<<n, 256>>>((const float *)g->emb, g->tokens.as<int32_t>(), d->dim, g->x.as<float>());
    MKV_CUDA_CHECK_LAUNCH();
    if (d->rope_dim > 0) {
        rope_table_kernel<<<n, 64>>>(g->inv_freq.as<double>(), d->rope_dim / 2, g->row_pos.as<int>(),
                                     g->rope_cs.as<float2>());
        MKV_CUDA_CHECK_LAUNCH();
    }
    const int pos0 = rp[0];
    const int step = all || n == 1;   /* one new token per request involved */
    plan_guard plan;
    int rc;
    if (g->mosaic) {
        /* each layer advances its own plan (attend_mosaic) */
    } else if (g->quest) {
        /* the plan moves with the requests; a new one only when its split no longer fits */
        const int rows = all ? g->batch : 1;
        std::vector<int64_t> len((size_t)rows);
        for (int b = 0; b < rows; b++)
            len[(size_t)b] = rp[(size_t)b] + 1;
        int replan = 1;
        if (g->quest_plan && (rc = mkv_cuda_quest_plan_advance(g->quest_plan, len.data(), len.data(), NULL, &replan, err)))
            return rc;
        if (replan) {
            const mkv_attn_shape s = {rows, d->n_heads, d->n_kv_heads, d->head_dim, d->max_seq_len, 0, 0.0};
            mkv_cuda_quest_plan_free(g->quest_plan);
            g->quest_plan = nullptr;
            if ((rc = mkv_cuda_quest_plan(&s, len.data(), len.data(), &g->qp, &g->quest_plan, err)))
                return rc;
        }
        MKV_CUDA_CHECK(cudaMemsetAsync(g->quest_tokens.ptr, 0, sizeof(unsigned long long)));
    } else if (step && g->dense_decode) {
        const int rows = all ? g->batch : 1;
        const mkv_attn_shape s = {rows, d->n_heads, d->n_kv_heads, d->head_dim, d->max_seq_len, 0, 0.0};
        std::vector<int64_t> len((size_t)rows);
        for (int b = 0; b < rows; b++)
            len[(size_t)b] = rp[(size_t)b] + 1;
        if ((rc = mkv_cuda_dense_plan(&s, len.data(), &plan.p, err)))
            return rc;
    }
    const int gemv_step = n == 1 && g->batch == 1 && g->step_gemv;
    for (int l = 0; l < d->n_layers; l++)
        if ((rc = gemv_step ? layer_step(g, l, pos0, plan.p, err)
                            : layer_chunk(g, l, all ? -1 : req, pos0, n, plan.p, err)))
            return rc;
    if (logits) {
        const void *in;
        const int rows = all ? n : 1;
        const float *first = g->x.as<float>() + (size_t)(n - rows) * d->dim;
        if (g->step_gemv && rows == 1) {
            if ((rc = gemv(g, normed(make_gemv(g->cls, d->dim, d->vocab_size, GEMV_STORE, first, g->logits.as<float>()),
                                     g->rms_final, d->rms_eps),
                           err)))
                return rc;
        } else if ((rc = rmsnorm(g, first, g->rms_final, rows, g->xb.as<float>(), err)) ||
                   (rc = operand(g, g->xb.as<float>(), (size_t)rows * d->dim, &in, err)) ||
                   (rc = gemm(g, g->cls, d->dim, d->vocab_size, rows, in, g->logits.as<float>(), 0.0f, err))) {
            return rc;
        }
        MKV_CUDA_CHECK(cudaMemcpy(logits, g->logits.ptr, (size_t)rows * d->vocab_size * 4, cudaMemcpyDeviceToHost));
    } else {
        MKV_CUDA_CHECK(cudaDeviceSynchronize());
    }
    const uint64_t row = (uint64_t)d->head_dim * 2 * 2;   /* K and V (or min and max) of one row */
    if (g->mosaic) {
        if ((rc = mkv_cuda_mosaic_grow_check(g->pc, err)))
            return rc;
        g->step_read = 0;   /* counted when asked for (mkv_cuda_llama_step_bytes_read) */
    } else if (g->quest) {
        unsigned long long tokens = 0;
        uint64_t pages = 0;
        MKV_CUDA_CHECK(cudaMemcpy(&tokens, g->quest_tokens.ptr, sizeof tokens, cudaMemcpyDeviceToHost));
        for (int b = 0; b < (all ? g->batch : 1); b++) {
            mkv_quest_counts qc;
            if ((rc = mkv_cuda_quest_counts(g->quest_plan, b, &qc, err)))
                return rc;
            pages += (uint64_t)qc.pages;
        }
        g->step_read = (pages * d->n_layers * d->n_kv_heads + tokens) * row;
    } else if (step) {
        uint64_t tokens = 0;
        for (int i = 0; i < n; i++)
            tokens += (uint64_t)rp[(size_t)i] + 1;
        g->step_read = tokens * d->n_layers * d->n_kv_heads * row;
    }
    return MKV_OK;
}

}  // namespace

extern "C" int mkv_cuda_llama_create(const mkv_cuda_llama_desc *d, mkv_cuda_llama **out, mkv_error *err)
{
    *out = nullptr;
    int rc = check_desc(d, err);
    if (rc)
        return rc;
    mkv_cuda_llama *g = new (std::nothrow) mkv_cuda_llama;
    if (!g)
        return mkv_fail(err, MKV_ENOMEM, "out of memory for the GPU forward pass");
    g->d = *d;
    g->batch = d->batch > 1 ? d->batch : 1;
    if (g->batch > MAX_CHUNK) {
        delete g;
        return mkv_fail(err, MKV_EUNSUP, "GPU forward pass: a batch of %d requests; at most %d", d->batch, MAX_CHUNK);
    }
    try {
        g->pos.assign((size_t)g->batch, 0);
    } catch (const std::bad_alloc &) {
        delete g;
        return mkv_fail(err, MKV_ENOMEM, "out of memory for the GPU forward pass");
    }
    /* a chunk's rows are a grid dimension of the attention and RoPE kernels;
     * a decode step of every request is one pass of batch rows */
    g->d.chunk = std::max(std::min(std::min(d->chunk, d->max_seq_len), MAX_CHUNK), g->batch);
    g->q_dim = d->n_heads * d->head_dim;
    g->kv_dim = d->n_kv_heads * d->head_dim;
    g->group = d->n_heads / d->n_kv_heads;
    /* the dense kernel's own shape rule decides whether it takes the decode step */
    const mkv_attn_shape s = {1, d->n_heads, d->n_kv_heads, d->head_dim, d->max_seq_len, 0, 0.0};
    mkv_dense_plan *probe = nullptr;
    mkv_error ignored;
    const int64_t one = 1;
    if ((rc = mkv_cuda_dense_plan(&s, &one, &probe, &ignored)) == MKV_OK)
        g->dense_decode = 1;
    mkv_cuda_dense_plan_free(probe);
    if (rc != MKV_EGPU && g->batch > 1 && !g->dense_decode) {
        delete g;
        return mkv_fail(err, MKV_EUNSUP, "GPU forward pass: a batch of requests needs the dense decode kernel's "
                        "shapes (%s)", ignored.msg);
    }
    if (rc == MKV_EGPU) {
        delete g;
        return mkv_fail(err, MKV_EGPU, "GPU forward pass: %s", ignored.msg);
    }
    if ((rc = setup(g, err))) {
        delete g;
        return rc;
    }
    *out = g;
    return MKV_OK;
}

extern "C" void mkv_cuda_llama_free(mkv_cuda_llama *g) { delete g; }

extern "C" int mkv_cuda_llama_pos(const mkv_cuda_llama *g) { return g->pos[0]; }

extern "C" int mkv_cuda_llama_request_pos(const mkv_cuda_llama *g, int request)
{
    return request >= 0 && request < g->batch ? g->pos[(size_t)request] : -1;
}

extern "C" uint64_t mkv_cuda_llama_weight_bytes(const mkv_cuda_llama *g) { return g->weights.bytes; }

extern "C" uint64_t mkv_cuda_llama_cache_bytes(const mkv_cuda_llama *g)
{
    return g->kcache.bytes + g->vcache.bytes + g->quest_meta.bytes + (g->pc ? mkv_cuda_mosaic_bytes(g->pc) : 0);
}

extern "C" uint64_t mkv_cuda_llama_step_bytes_read(const mkv_cuda_llama *g)
{
    if (!g->mosaic)
        return g->step_read;
    uint64_t bytes = 0;
    for (const mkv_packed_plan *p : g->mosaic_plans)
        for (int j = 0; p && j < g->batch * g->d.n_kv_heads; j++) {
            mkv_packed_counts counts;
            mkv_error ignored;
            if (mkv_cuda_mosaic_selection(p, j / g->d.n_kv_heads, j % g->d.n_kv_heads, NULL, NULL, &counts,
                                          &ignored) != MKV_OK)
                return 0;
            bytes += counts.device_bytes;
        }
    return bytes;
}

namespace {

const char *const MOSAIC_WHAT = "MosaicKV on the GPU";

int mosaic_check(const mkv_cuda_llama *g, int head_dim, int n_heads, const mkv_packed_params *pp, mkv_error *err)
{
    const mkv_cuda_llama_desc *d = &g->d;
    if (!d->external_cache || g->pc || g->pos[0] != 0)
        return mkv_fail(err, MKV_EUSAGE, "%s: the pass must have no cache of its own and no tokens yet", MOSAIC_WHAT);
    if (pp == NULL || head_dim != d->head_dim || n_heads != d->n_layers * g->batch * d->n_kv_heads)
        return mkv_fail(err, MKV_EUSAGE,
                        "%s: the cache must hold head_dim %d and %d heads (layers x requests x KV heads)", MOSAIC_WHAT,
                        d->head_dim, d->n_layers * g->batch * d->n_kv_heads);
    return MKV_OK;
}

/* The pass decodes over cache c (its own from now on), request b at
 * position T[b]. */
int mosaic_adopt(mkv_cuda_llama *g, mkv_packed_cache *c, const int64_t *T, const mkv_packed_params *pp, bool keys8_made,
                 mkv_error *err)
{
    const mkv_cuda_llama_desc *d = &g->d;
    for (int b = 0; b < g->batch; b++)
        if (T[b] < 1 || T[b] > d->max_seq_len) {
            mkv_cuda_mosaic_free(c);
            return mkv_fail(err, MKV_EUSAGE, "%s: request %d: %lld tokens in a context of %d", MOSAIC_WHAT, b,
                            (long long)T[b], d->max_seq_len);
        }
    /* scored with 8-bit block keys: the fp16 rows are not kept */
    int rc;
    if (pp->blockkey_bits == 8 && !keys8_made &&
        ((rc = mkv_cuda_mosaic_blockkeys8(c, err)) || (rc = mkv_cuda_mosaic_drop_blockkeys16(c, err)))) {
        mkv_cuda_mosaic_free(c);
        return rc;
    }
    g->pc = c;
    try {
        g->mosaic_plans.assign((size_t)d->n_layers, nullptr);
    } catch (const std::bad_alloc &) {
        return mkv_fail(err, MKV_ENOMEM, "%s: out of host memory", MOSAIC_WHAT);
    }
    g->mp = *pp;
    g->mp.batch = g->batch;
    g->mp.n_kv_heads = d->n_kv_heads;
    g->mp.n_heads = d->n_heads;
    g->mp.scale = 0;
    for (int b = 0; b < g->batch; b++)
        g->pos[(size_t)b] = (int)T[b];
    g->mosaic = 1;
    return MKV_OK;
}

}  // namespace

extern "C" int mkv_cuda_llama_use_mosaic(mkv_cuda_llama *g, const mkv_packed_layout *l, const mkv_packed_params *pp,
                                         mkv_error *err)
{
    int rc = l ? mosaic_check(g, l->head_dim, l->n_heads, pp, err) : mkv_fail(err, MKV_EUSAGE, "NULL layout");
    if (rc)
        return rc;
    /* heads (layer, request, KV head): a request's hold its tokens */
    const int B = g->batch, kv = g->d.n_kv_heads;
    std::vector<int64_t> T((size_t)B);
    for (int b = 0; b < B; b++)
        T[(size_t)b] = l->heads[b * kv].T;
    for (int i = 0; i < l->n_heads; i++) {
        const int b = i / kv % B;
        if (l->heads[i].T != T[(size_t)b])
            return mkv_fail(err, MKV_EUSAGE, "%s: request %d's heads hold %lld and %lld tokens", MOSAIC_WHAT, b,
                            (long long)T[(size_t)b], (long long)l->heads[i].T);
    }
    mkv_packed_cache *c = nullptr;
    if ((rc = mkv_cuda_mosaic_upload(l, &c, err)))
        return rc;
    return mosaic_adopt(g, c, T.data(), pp, false, err);
}

extern "C" int mkv_cuda_llama_fill_mosaic(mkv_cuda_llama *g, int n, const mkv_packed_synth *s,
                                          const mkv_packed_params *pp, mkv_error *err)
{
    int rc = s ? mosaic_check(g, s->head_dim, s->n_heads, pp, err) : mkv_fail(err, MKV_EUSAGE, "NULL settings");
    if (rc)
        return rc;
    if (n < 1 || n > g->d.max_seq_len)
        return mkv_fail(err, MKV_EUSAGE, "%d positions to fill exceed the context of %d tokens", n, g->d.max_seq_len);
    mkv_packed_synth at = *s;
    at.tokens = n;
    at.blockkey_bits = pp->blockkey_bits;   /* the synthetic cache makes them */
    mkv_packed_cache *c = nullptr;
    if ((rc = mkv_cuda_mosaic_synth(&at, &c, err)))
        return rc;
    const std::vector<int64_t> T((size_t)g->batch, n);
    return mosaic_adopt(g, c, T.data(), pp, true, err);
}

extern "C" int mkv_cuda_llama_use_quest(mkv_cuda_llama *g, const mkv_quest_params *qp, mkv_error *err)
{
    const mkv_cuda_llama_desc *d = &g->d;
    if (g->quest)
        return mkv_fail(err, MKV_EUSAGE, "the GPU cache already attends as Quest");
    std::vector<int64_t> len((size_t)g->batch);
    for (int b = 0; b < g->batch; b++) {
        if (g->pos[(size_t)b] < 1)
            return mkv_fail(err, MKV_EUSAGE, "Quest on the GPU starts from a filled or prefilled cache (request %d "
                            "has none)", b);
        len[(size_t)b] = g->pos[(size_t)b];
    }
    if (d->head_dim != 64 && d->head_dim != 128)
        return mkv_fail(err, MKV_EUNSUP, "Quest on the GPU: head_dim %d; its kernels take 64 or 128", d->head_dim);
    /* the bounds of every request's pages, built from its cache as it stands */
    const mkv_attn_shape s = {g->batch, d->n_heads, d->n_kv_heads, d->head_dim, d->max_seq_len, 0, 0.0};
    mkv_quest_plan *p = nullptr;
    int rc = mkv_cuda_quest_plan(&s, len.data(), len.data(), qp, &p, err);
    if (rc)
        return rc;
    struct plan_free {
        mkv_quest_plan *p;
        ~plan_free() { mkv_cuda_quest_plan_free(p); }
    } owner{p};
    const size_t per_layer = mkv_cuda_quest_meta_elems(p);
    MKV_CUDA_CHECK(g->quest_meta.alloc(per_layer * d->n_layers * sizeof(__half)));
    MKV_CUDA_CHECK(g->quest_tokens.alloc(sizeof(unsigned long long)));
    const size_t layer = (size_t)g->batch * d->n_kv_heads * (size_t)d->max_seq_len * d->head_dim;
    for (int l = 0; l < d->n_layers; l++)
        if ((rc = mkv_cuda_quest_build_meta(p, (const uint16_t *)(g->kcache.as<__half>() + (size_t)l * layer),
                                            (uint16_t *)(g->quest_meta.as<__half>() + (size_t)l * per_layer), NULL,
                                            err)))
            return rc;
    MKV_CUDA_CHECK(cudaDeviceSynchronize());
    g->quest_pages_max = mkv_cuda_quest_pages_max(p);
    g->quest_layer_elems = per_layer;
    g->qp = *qp;
    g->quest = 1;
    return MKV_OK;
}

extern "C" int mkv_cuda_llama_fill(mkv_cuda_llama *g, int n, uint64_t seed, mkv_error *err)
{
    const mkv_cuda_llama_desc *d = &g->d;
    for (int r = 0; r < g->batch; r++)
        if (g->pos[(size_t)r] != 0)
            return mkv_fail(err, MKV_EUSAGE, "a cache is filled before its first token, not at position %d",
                            g->pos[(size_t)r]);
    if (d->external_cache)
        return mkv_fail(err, MKV_EUSAGE, "the GPU pass has no dense cache to fill");
    if (n < 0 || n > d->max_seq_len)
        return mkv_fail(err, MKV_EUSAGE, "%d positions to fill exceed the context of %d tokens", n, d->max_seq_len);
    if (n > 0) {
        const size_t total = (size_t)d->n_layers * g->batch * d->n_kv_heads * (size_t)n * d->head_dim;
        const size_t blocks = std::min<size_t>((total + 255) / 256, (size_t)132 * 64);
        fill_kv_kernel<<<(unsigned)blocks, 256>>>(d->n_layers, g->batch, d->n_kv_heads, d->head_dim, d->max_seq_len,
                                                  n, seed, g->kcache.as<__half>(), g->vcache.as<__half>());
        MKV_CUDA_CHECK_LAUNCH();
        MKV_CUDA_CHECK(cudaDeviceSynchronize());
    }
    g->pos.assign((size_t)g->batch, n);
    return MKV_OK;
}

namespace {

int check_tokens(const mkv_cuda_llama *g, const int32_t *tokens, size_t n, mkv_error *err)
{
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= g->d.vocab_size)
            return mkv_fail(err, MKV_EFORMAT, "token id %d at index %zu is outside the vocabulary of %d",
                            (int)tokens[i], i, g->d.vocab_size);
    if (g->d.external_cache && !g->mosaic)
        return mkv_fail(err, MKV_EUSAGE, "the GPU pass has no cache yet (mkv_cuda_llama_use_mosaic)");
    return MKV_OK;
}

}  // namespace

extern "C" int mkv_cuda_llama_run_request(mkv_cuda_llama *g, int request, const int32_t *tokens, size_t n,
                                          float *logits, mkv_error *err)
{
    const mkv_cuda_llama_desc *d = &g->d;
    if (request < 0 || request >= g->batch)
        return mkv_fail(err, MKV_EUSAGE, "no request %d in a batch of %d", request, g->batch);
    if (n == 0)
        return mkv_fail(err, MKV_EUSAGE, "no tokens to run");
    if ((g->quest || g->mosaic) && n != 1)
        return mkv_fail(err, MKV_EUSAGE, "the %s cache on the GPU takes one token per step, not %zu",
                        g->quest ? "Quest" : "MosaicKV", n);
    if ((g->quest || g->mosaic) && g->batch > 1)
        return mkv_fail(err, MKV_EUSAGE, "a batch's %s caches step together: run every request's step at once",
                        g->quest ? "Quest" : "MosaicKV");
    int &pos = g->pos[(size_t)request];
    if (n > (size_t)(d->max_seq_len - pos))
        return mkv_fail(err, MKV_EFORMAT, "%zu tokens at position %d exceed the context of %d tokens", n, pos,
                        d->max_seq_len);
    int rc = check_tokens(g, tokens, n, err);
    if (rc)
        return rc;
    const int start = pos;
    for (size_t done = 0; done < n;) {
        const int count = n - done < (size_t)d->chunk ? (int)(n - done) : d->chunk;
        const int last = done + (size_t)count == n;
        if ((rc = run_pass(g, tokens + done, count, request, last ? logits : nullptr, err))) {
            pos = start;
            return rc;
        }
        pos += count;
        done += (size_t)count;
    }
    return MKV_OK;
}

extern "C" int mkv_cuda_llama_run(mkv_cuda_llama *g, const int32_t *tokens, size_t n, float *logits, mkv_error *err)
{
    if (g->batch > 1)
        return mkv_fail(err, MKV_EUSAGE, "a pass of %d requests runs them with mkv_cuda_llama_run_request or _step",
                        g->batch);
    return mkv_cuda_llama_run_request(g, 0, tokens, n, logits, err);
}

extern "C" int mkv_cuda_llama_step(mkv_cuda_llama *g, const int32_t *tokens, float *logits, mkv_error *err)
{
    const mkv_cuda_llama_desc *d = &g->d;
    for (int r = 0; r < g->batch; r++)
        if (g->pos[(size_t)r] >= d->max_seq_len)
            return mkv_fail(err, MKV_EFORMAT, "request %d at position %d: the context of %d tokens is full", r,
                            g->pos[(size_t)r], d->max_seq_len);
    int rc = check_tokens(g, tokens, (size_t)g->batch, err);
    if (rc)
        return rc;
    if ((rc = run_pass(g, tokens, g->batch, -1, logits, err)))
        return rc;
    for (int r = 0; r < g->batch; r++)
        g->pos[(size_t)r]++;
    return MKV_OK;
}
