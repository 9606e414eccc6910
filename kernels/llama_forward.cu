/* The LLaMA-family forward pass on the GPU (mkv_cuda_llama of mkv_cuda.h):
 * what lib/model/forward.c computes, with the weights on the device, cuBLAS
 * for the matrix products and the kernels below for the rest.  Everything
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

/* Rotate the heads of token row blockIdx.x (position pos0 + row); the
 * angle in double and cos/sin rounded to float, as mkv_rope_angle does. */
__global__ void rope_kernel(float *vec, int n_heads, int head_dim, int rope_dim, int half_layout,
                            const double *inv_freq, int pos0)
{
    const int pairs = rope_dim / 2;
    float *row = vec + (size_t)blockIdx.x * n_heads * head_dim;
    const double pos = (double)(pos0 + (int)blockIdx.x);
    for (int i = threadIdx.x; i < n_heads * pairs; i += blockDim.x) {
        const int h = i / pairs, j = i % pairs;
        float *a = row + (size_t)h * head_dim + (half_layout ? j : 2 * j);
        float *b = a + (half_layout ? pairs : 1);
        double sd, cd;
        sincos(pos * inv_freq[j], &sd, &cd);
        const float c = (float)cd, s = (float)sd;
        const float x0 = *a, x1 = *b;
        *a = x0 * c - x1 * s;
        *b = x0 * s + x1 * c;
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

/* k, v rows [n][n_kv][head_dim] into one layer's cache at pos0.. */
__global__ void store_kv_kernel(const float *k, const float *v, int n, int n_kv, int head_dim, int64_t max_seq,
                                int pos0, __half *kc, __half *vc)
{
    const size_t kv_dim = (size_t)n_kv * head_dim, total = (size_t)n * kv_dim;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t row = i / kv_dim, rest = i % kv_dim, h = rest / head_dim, c = rest % head_dim;
        const size_t at = (h * (size_t)max_seq + (size_t)pos0 + row) * head_dim + c;
        kc[at] = __float2half_rn(k[i]);
        vc[at] = __float2half_rn(v[i]);
    }
}

/* Rows 0..n-1 of every layer and KV head: core/kvfill.h's values in fp16. */
__global__ void fill_kv_kernel(int n_layers, int n_kv, int head_dim, int64_t max_seq, int n, uint64_t seed,
                               __half *kc, __half *vc)
{
    const size_t per_head = (size_t)n * head_dim, total = (size_t)n_layers * n_kv * per_head;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t lh = i / per_head, rest = i % per_head, t = rest / head_dim, c = rest % head_dim;
        const int layer = (int)(lh / n_kv), head = (int)(lh % n_kv);
        const size_t at = (lh * (size_t)max_seq + t) * head_dim + c;
        kc[at] = __float2half_rn(mkv_kvfill_value(seed, layer, n_kv, head, (int64_t)t, head_dim, (int)c, 0));
        vc[at] = __float2half_rn(mkv_kvfill_value(seed, layer, n_kv, head, (int64_t)t, head_dim, (int)c, 1));
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
    int q_dim = 0, kv_dim = 0, group = 0, pos = 0;
    int dense_decode = 0;           /* the dense decode kernel takes this shape */
    cublasHandle_t blas = nullptr;
    mkv_device_buffer weights, inv_freq, kcache, vcache;
    mkv_device_buffer x, xb, q, k, v, att, h1, h3, xh, tokens, logits;
    const void *emb = nullptr, *cls = nullptr;
    const float *rms_final = nullptr;
    std::vector<layer_dev> layers;
    ~mkv_cuda_llama()
    {
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
        *dst = place(n * elem_bytes(g));
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
                (rc = vec(s->bv, kvd, &t->bv, err)) || (rc = mat(s->wq, qd * dim, &t->wq, err)) ||
                (rc = mat(s->wk, kvd * dim, &t->wk, err)) || (rc = mat(s->wv, kvd * dim, &t->wv, err)) ||
                (rc = mat(s->wo, dim * qd, &t->wo, err)) || (rc = mat(s->w1, hid * dim, &t->w1, err)) ||
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
    const size_t pairs = (size_t)d->rope_dim / 2;
    MKV_CUDA_CHECK(g->inv_freq.alloc(pairs * sizeof(double)));
    MKV_CUDA_CHECK(cudaMemcpy(g->inv_freq.ptr, d->rope_inv_freq, pairs * sizeof(double), cudaMemcpyHostToDevice));
    const size_t cache = (size_t)d->n_layers * d->n_kv_heads * (size_t)d->max_seq_len * d->head_dim * 2;
    MKV_CUDA_CHECK(g->kcache.alloc(cache));
    MKV_CUDA_CHECK(g->vcache.alloc(cache));
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
    MKV_CUDA_CHECK(g->logits.alloc((size_t)d->vocab_size * 4));
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

int attend(mkv_cuda_llama *g, int l, int pos0, int n, const mkv_dense_plan *plan, mkv_error *err)
{
    const mkv_cuda_llama_desc *d = &g->d;
    const size_t layer = (size_t)d->n_kv_heads * (size_t)d->max_seq_len * d->head_dim;
    const __half *kc = g->kcache.as<__half>() + (size_t)l * layer, *vc = g->vcache.as<__half>() + (size_t)l * layer;
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

int layer_forward(mkv_cuda_llama *g, int l, int pos0, int n, const mkv_dense_plan *plan, mkv_error *err)
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
        (rc = add_bias(v, w->bv, g->kv_dim, n, err)))
        return rc;
    if (d->rope_dim > 0) {
        rope_kernel<<<n, 128>>>(q, d->n_heads, d->head_dim, d->rope_dim, d->rope_half, g->inv_freq.as<double>(), pos0);
        MKV_CUDA_CHECK_LAUNCH();
        rope_kernel<<<n, 128>>>(k, d->n_kv_heads, d->head_dim, d->rope_dim, d->rope_half, g->inv_freq.as<double>(),
                                pos0);
        MKV_CUDA_CHECK_LAUNCH();
    }
    const size_t layer = (size_t)d->n_kv_heads * (size_t)d->max_seq_len * d->head_dim;
    store_kv_kernel<<<grid_for((size_t)n * g->kv_dim), 256>>>(k, v, n, d->n_kv_heads, d->head_dim, d->max_seq_len,
                                                              pos0, g->kcache.as<__half>() + (size_t)l * layer,
                                                              g->vcache.as<__half>() + (size_t)l * layer);
    MKV_CUDA_CHECK_LAUNCH();
    if ((rc = attend(g, l, pos0, n, plan, err)) ||
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

int run_chunk(mkv_cuda_llama *g, const int32_t *tokens, int n, float *logits, mkv_error *err)
{
    const mkv_cuda_llama_desc *d = &g->d;
    MKV_CUDA_CHECK(cudaMemcpy(g->tokens.ptr, tokens, (size_t)n * 4, cudaMemcpyHostToDevice));
    if (d->weights_f16)
        embed_kernel<<<n, 256>>>((const __half *)g->emb, g->tokens.as<int32_t>(), d->dim, g->x.as<float>());
    else
        embed_kernel<<<n, 256>>>((const float *)g->emb, g->tokens.as<int32_t>(), d->dim, g->x.as<float>());
    MKV_CUDA_CHECK_LAUNCH();
    plan_guard plan;
    int rc;
    if (n == 1 && g->dense_decode) {
        const mkv_attn_shape s = {1, d->n_heads, d->n_kv_heads, d->head_dim, d->max_seq_len, 0, 0.0};
        const int64_t len = g->pos + 1;
        if ((rc = mkv_cuda_dense_plan(&s, &len, &plan.p, err)))
            return rc;
    }
    for (int l = 0; l < d->n_layers; l++)
        if ((rc = layer_forward(g, l, g->pos, n, plan.p, err)))
            return rc;
    if (logits) {
        const void *in;
        if ((rc = rmsnorm(g, g->x.as<float>() + (size_t)(n - 1) * d->dim, g->rms_final, 1, g->xb.as<float>(), err)) ||
            (rc = operand(g, g->xb.as<float>(), (size_t)d->dim, &in, err)) ||
            (rc = gemm(g, g->cls, d->dim, d->vocab_size, 1, in, g->logits.as<float>(), 0.0f, err)))
            return rc;
        MKV_CUDA_CHECK(cudaMemcpy(logits, g->logits.ptr, (size_t)d->vocab_size * 4, cudaMemcpyDeviceToHost));
    } else {
        MKV_CUDA_CHECK(cudaDeviceSynchronize());
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
    g->d.chunk = d->chunk < d->max_seq_len ? d->chunk : d->max_seq_len;
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

extern "C" int mkv_cuda_llama_pos(const mkv_cuda_llama *g) { return g->pos; }

extern "C" uint64_t mkv_cuda_llama_weight_bytes(const mkv_cuda_llama *g) { return g->weights.bytes; }

extern "C" uint64_t mkv_cuda_llama_cache_bytes(const mkv_cuda_llama *g) { return g->kcache.bytes + g->vcache.bytes; }

extern "C" int mkv_cuda_llama_fill(mkv_cuda_llama *g, int n, uint64_t seed, mkv_error *err)
{
    const mkv_cuda_llama_desc *d = &g->d;
    if (g->pos != 0)
        return mkv_fail(err, MKV_EUSAGE, "a cache is filled before its first token, not at position %d", g->pos);
    if (n < 0 || n > d->max_seq_len)
        return mkv_fail(err, MKV_EUSAGE, "%d positions to fill exceed the context of %d tokens", n, d->max_seq_len);
    if (n > 0) {
        const size_t total = (size_t)d->n_layers * d->n_kv_heads * (size_t)n * d->head_dim;
        const size_t blocks = std::min<size_t>((total + 255) / 256, (size_t)132 * 64);
        fill_kv_kernel<<<(unsigned)blocks, 256>>>(d->n_layers, d->n_kv_heads, d->head_dim, d->max_seq_len, n, seed,
                                                  g->kcache.as<__half>(), g->vcache.as<__half>());
        MKV_CUDA_CHECK_LAUNCH();
        MKV_CUDA_CHECK(cudaDeviceSynchronize());
    }
    g->pos = n;
    return MKV_OK;
}

extern "C" int mkv_cuda_llama_run(mkv_cuda_llama *g, const int32_t *tokens, size_t n, float *logits, mkv_error *err)
{
    const mkv_cuda_llama_desc *d = &g->d;
    if (n == 0)
        return mkv_fail(err, MKV_EUSAGE, "no tokens to run");
    if (n > (size_t)(d->max_seq_len - g->pos))
        return mkv_fail(err, MKV_EFORMAT, "%zu tokens at position %d exceed the context of %d tokens", n, g->pos,
                        d->max_seq_len);
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= d->vocab_size)
            return mkv_fail(err, MKV_EFORMAT, "token id %d at index %zu is outside the vocabulary of %d",
                            (int)tokens[i], i, d->vocab_size);
    const int start = g->pos;
    for (size_t done = 0; done < n;) {
        const int count = n - done < (size_t)d->chunk ? (int)(n - done) : d->chunk;
        const int last = done + (size_t)count == n;
        int rc = run_chunk(g, tokens + done, count, last ? logits : nullptr, err);
        if (rc) {
            g->pos = start;
            return rc;
        }
        g->pos += count;
        done += (size_t)count;
    }
    return MKV_OK;
}
