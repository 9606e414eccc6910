/* Dense decode attention (flash-decoding) over 16-bit K/V: the split
 * kernel of attn_core.cuh over every token of every request, then the
 * merge.  Also the host side both attention kernels share: shape checks
 * and the work split. */
#include <new>
#include <stdlib.h>
#include <vector>

#include "attn_core.cuh"

namespace mkv_attn {

int check_shape(const mkv_attn_shape *s, const int64_t *lengths, const char *what, mkv_error *err)
{
    if (s == NULL || lengths == NULL)
        return mkv_fail(err, MKV_EUSAGE, "%s: NULL shape or lengths", what);
    if (s->batch < 1 || s->n_kv_heads < 1 || s->n_heads < 1)
        return mkv_fail(err, MKV_EUSAGE, "%s: batch %d, %d query heads, %d KV heads: all must be >= 1",
                        what, s->batch, s->n_heads, s->n_kv_heads);
    if (s->n_heads % s->n_kv_heads != 0)
        return mkv_fail(err, MKV_EUSAGE, "%s: %d query heads are not a multiple of %d KV heads", what,
                        s->n_heads, s->n_kv_heads);
    const int G = s->n_heads / s->n_kv_heads;
    if (G > MAX_G)
        return mkv_fail(err, MKV_EUNSUP,
                        "%s: %d query heads per KV head; the GPU kernels take 1 to %d", what, G, MAX_G);
    if (s->head_dim != 64 && s->head_dim != 128)
        return mkv_fail(err, MKV_EUNSUP, "%s: head_dim %d; the GPU kernels support head_dim 64 and 128",
                        what, s->head_dim);
    if (s->t_max < 0 || s->t_max > INT32_MAX)
        return mkv_fail(err, MKV_EUSAGE, "%s: t_max %lld out of range 0..%d", what,
                        (long long)s->t_max, INT32_MAX);
    if (!(s->scale >= 0) || isinf(s->scale))
        return mkv_fail(err, MKV_EUSAGE, "%s: scale %g must be finite and >= 0 (0: 1/sqrt(head_dim))",
                        what, s->scale);
    if ((uint64_t)s->batch * (uint64_t)s->n_heads > (uint64_t)INT32_MAX / 2)
        return mkv_fail(err, MKV_EUSAGE, "%s: batch x heads too large", what);
    for (int b = 0; b < s->batch; b++)
        if (lengths[b] < 0 || lengths[b] > s->t_max)
            return mkv_fail(err, MKV_EUSAGE, "%s: request %d has %lld tokens, outside 0..t_max = %lld",
                            what, b, (long long)lengths[b], (long long)s->t_max);
    return MKV_OK;
}

static int64_t count_items(const int64_t *tiles, int batch, int n_kv, int64_t chunk)
{
    int64_t items = 0;
    for (int b = 0; b < batch; b++)
        items += n_kv * ((tiles[b] + chunk - 1) / chunk);
    return items;
}

int build_split_plan(split_plan *sp, const int64_t *tiles, const int64_t *lengths, int batch, int n_kv,
                     int G, int D, int resident, mkv_error *err)
{
    int64_t total = 0, most = 0;
    for (int b = 0; b < batch; b++) {
        total += tiles[b] * n_kv;
        most = tiles[b] > most ? tiles[b] : most;
    }
    if (resident < 1)
        resident = 1;
    /* One wave: the fewest equal chunks that keep every resident block
     * busy.  Chunks are whole multiples of WARPS tiles so that a block's
     * warps get equal shares. */
    int64_t chunk = (total + resident - 1) / resident;
    chunk = (chunk + WARPS - 1) / WARPS * WARPS;
    if (chunk < WARPS)
        chunk = WARPS;
    while (chunk < most && count_items(tiles, batch, n_kv, chunk) > resident)
        chunk += WARPS;
    const int64_t n_items = count_items(tiles, batch, n_kv, chunk);
    if (n_items > INT32_MAX / 2 || chunk > INT32_MAX / 2)
        return mkv_fail(err, MKV_EUSAGE, "attention plan: %lld work items, too many", (long long)n_items);

    std::vector<int4> items;
    std::vector<int2> head_items((size_t)batch * n_kv);
    try {
        items.reserve((size_t)n_items);
        for (int b = 0; b < batch; b++)
            for (int h = 0; h < n_kv; h++) {
                head_items[(size_t)b * n_kv + h] = make_int2((int)items.size(), 0);
                for (int64_t t = 0; t < tiles[b]; t += chunk) {
                    const int64_t e = t + chunk < tiles[b] ? t + chunk : tiles[b];
                    items.push_back(make_int4(b, h, (int)t, (int)e));
                }
                head_items[(size_t)b * n_kv + h].y = (int)items.size() - head_items[(size_t)b * n_kv + h].x;
            }
    } catch (const std::bad_alloc &) {
        return mkv_fail(err, MKV_ENOMEM, "attention plan: out of host memory for %lld items",
                        (long long)n_items);
    }
    sp->n_items = (int)n_items;
    sp->chunk_tiles = (int)chunk;
    const size_t n_slot = (size_t)(n_items > 0 ? n_items : 1) * G;
    MKV_CUDA_CHECK(sp->items.alloc(sizeof(int4) * (items.empty() ? 1 : items.size())));
    MKV_CUDA_CHECK(sp->head_items.alloc(sizeof(int2) * head_items.size()));
    MKV_CUDA_CHECK(sp->len.alloc(sizeof(int64_t) * batch));
    MKV_CUDA_CHECK(sp->part_o.alloc(sizeof(float) * n_slot * D));
    MKV_CUDA_CHECK(sp->part_ml.alloc(sizeof(float2) * n_slot));
    if (!items.empty())
        MKV_CUDA_CHECK(cudaMemcpy(sp->items.ptr, items.data(), sizeof(int4) * items.size(),
                                  cudaMemcpyHostToDevice));
    MKV_CUDA_CHECK(cudaMemcpy(sp->head_items.ptr, head_items.data(), sizeof(int2) * head_items.size(),
                              cudaMemcpyHostToDevice));
    MKV_CUDA_CHECK(cudaMemcpy(sp->len.ptr, lengths, sizeof(int64_t) * batch, cudaMemcpyHostToDevice));
    return MKV_OK;
}

int launch_merge(const split_plan *sp, int batch, int n_kv, int G, int D, float *out, cudaStream_t st,
                 mkv_error *err)
{
    const unsigned blocks = (unsigned)(batch * n_kv * G * (D / 32));   /* 32-channel slices */
    if (D == 64)
        merge_kernel<64><<<blocks, MERGE_THREADS, 0, st>>>(sp->head_items.as<int2>(), sp->part_o.as<float>(),
                                                 sp->part_ml.as<float2>(), out, n_kv, G);
    else
        merge_kernel<128><<<blocks, MERGE_THREADS, 0, st>>>(sp->head_items.as<int2>(), sp->part_o.as<float>(),
                                                   sp->part_ml.as<float2>(), out, n_kv, G);
    MKV_CUDA_CHECK_LAUNCH();
    return MKV_OK;
}

}  // namespace mkv_attn

using namespace mkv_attn;

struct mkv_dense_plan {
    mkv_attn_shape shape;
    int G;
    int minb;          /* kernel variant: blocks per multiprocessor */
    split_plan sp;
};

/* The split kernel instance for a shape and variant (dense: no page list). */
template <int MINB>
static const void *dense_kernel_v(int D, int bf16)
{
    if (D == 64)
        return bf16 ? (const void *)split_kernel<64, true, false, MINB> : (const void *)split_kernel<64, false, false, MINB>;
    return bf16 ? (const void *)split_kernel<128, true, false, MINB> : (const void *)split_kernel<128, false, false, MINB>;
}

static const void *dense_kernel(int D, int bf16, int minb)
{
    return minb == 2 ? dense_kernel_v<2>(D, bf16) : dense_kernel_v<3>(D, bf16);
}

namespace mkv_attn {
/* Blocks of `kernel` (THREADS threads) that fit on the device at once. */
int resident_blocks(const void *kernel, int *resident, mkv_error *err)
{
    int dev = 0, sms = 0, per_sm = 0;
    MKV_CUDA_CHECK(cudaGetDevice(&dev));
    MKV_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    MKV_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, THREADS, 0));
    *resident = sms * (per_sm > 0 ? per_sm : 1);
    /* Fewer blocks, longer chunks: lets tests reach the long-chunk paths
     * on small inputs. */
    const char *cap = getenv("MKV_ATTN_BLOCKS");
    if (cap != NULL && atoi(cap) > 0 && atoi(cap) < *resident)
        *resident = atoi(cap);
    return MKV_OK;
}
}  // namespace mkv_attn

namespace mkv_attn {
int dense_plan_variant(const mkv_attn_shape *s, const int64_t *lengths, int minb, mkv_dense_plan **out,
                       mkv_error *err)
{
    if (minb != 2 && minb != 3)
        return mkv_fail(err, MKV_EUSAGE, "dense attention: no kernel variant %d", minb);
    if (out == NULL)
        return mkv_fail(err, MKV_EUSAGE, "dense attention: NULL plan pointer");
    *out = NULL;
    int rc = check_shape(s, lengths, "dense attention", err);
    if (rc != MKV_OK)
        return rc;
    int resident = 0;
    if ((rc = resident_blocks(dense_kernel(s->head_dim, s->is_bf16, minb), &resident, err)) != MKV_OK)
        return rc;
    mkv_dense_plan *p = new (std::nothrow) mkv_dense_plan;
    if (p == NULL)
        return mkv_fail(err, MKV_ENOMEM, "dense attention: out of host memory");
    p->shape = *s;
    p->G = s->n_heads / s->n_kv_heads;
    p->minb = minb;
    std::vector<int64_t> tiles;
    try {
        tiles.resize((size_t)s->batch);
    } catch (const std::bad_alloc &) {
        delete p;
        return mkv_fail(err, MKV_ENOMEM, "dense attention: out of host memory");
    }
    for (int b = 0; b < s->batch; b++)
        tiles[(size_t)b] = (lengths[b] + TILE - 1) / TILE;
    rc = build_split_plan(&p->sp, tiles.data(), lengths, s->batch, s->n_kv_heads, p->G, s->head_dim,
                          resident, err);
    if (rc != MKV_OK) {
        delete p;
        return rc;
    }
    *out = p;
    return MKV_OK;
}
}  // namespace mkv_attn

extern "C" int mkv_cuda_dense_plan(const mkv_attn_shape *s, const int64_t *lengths, mkv_dense_plan **out,
                                   mkv_error *err)
{
    return dense_plan_variant(s, lengths, ATTN_MINB, out, err);
}

extern "C" void mkv_cuda_dense_plan_free(mkv_dense_plan *p) { delete p; }

extern "C" int mkv_cuda_dense_plan_splits(const mkv_dense_plan *p) { return p ? p->sp.n_items : 0; }

template <int D, bool BF16>
static void launch_dense(const split_args &a, int n_items, int minb, cudaStream_t st)
{
    if (minb == 2)
        split_kernel<D, BF16, false, 2><<<n_items, THREADS, 0, st>>>(a);
    else
        split_kernel<D, BF16, false, 3><<<n_items, THREADS, 0, st>>>(a);
}

namespace mkv_attn {
int check_aligned(const void *p, const char *name, const char *what, mkv_error *err)
{
    if (p == NULL || ((uintptr_t)p & 15u) != 0)
        return mkv_fail(err, MKV_EUSAGE, "%s: device buffer %s is NULL or not 16-byte aligned", what, name);
    return MKV_OK;
}
}  // namespace mkv_attn

extern "C" int mkv_cuda_dense_run(const mkv_dense_plan *p, const float *q, const uint16_t *k,
                                  const uint16_t *v, float *out, void *stream, mkv_error *err)
{
    const char *what = "dense attention";
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
        a.pages = NULL;
        a.t_max = s->t_max;
        a.n_kv = s->n_kv_heads;
        a.G = p->G;
        a.qscale = qscale_of(s);
        a.part_o = p->sp.part_o.as<float>();
        a.part_ml = p->sp.part_ml.as<float2>();
        const int ni = p->sp.n_items, mb = p->minb;
        if (s->head_dim == 64)
            s->is_bf16 ? launch_dense<64, true>(a, ni, mb, st) : launch_dense<64, false>(a, ni, mb, st);
        else
            s->is_bf16 ? launch_dense<128, true>(a, ni, mb, st) : launch_dense<128, false>(a, ni, mb, st);
        MKV_CUDA_CHECK_LAUNCH();
    }
    return launch_merge(&p->sp, s->batch, s->n_kv_heads, p->G, s->head_dim, out, st, err);
}

extern "C" int mkv_cuda_dense_attend_host(const mkv_attn_shape *s, const int64_t *lengths, const float *q,
                                          const uint16_t *k, const uint16_t *v, float *out, mkv_error *err)
{
    int rc = check_shape(s, lengths, "dense attention", err);
    if (rc != MKV_OK)
        return rc;
    if (q == NULL || k == NULL || v == NULL || out == NULL)
        return mkv_fail(err, MKV_EUSAGE, "dense attention: NULL host buffer");
    const size_t nq = (size_t)s->batch * s->n_heads * s->head_dim;
    const size_t nkv = (size_t)s->batch * s->n_kv_heads * (size_t)s->t_max * s->head_dim;
    mkv_device_buffer dq, dk, dv, dout;
    MKV_CUDA_CHECK(dq.alloc(nq * sizeof(float)));
    MKV_CUDA_CHECK(dout.alloc(nq * sizeof(float)));
    MKV_CUDA_CHECK(dk.alloc((nkv ? nkv : 8) * sizeof(uint16_t)));
    MKV_CUDA_CHECK(dv.alloc((nkv ? nkv : 8) * sizeof(uint16_t)));
    MKV_CUDA_CHECK(cudaMemcpy(dq.ptr, q, nq * sizeof(float), cudaMemcpyHostToDevice));
    MKV_CUDA_CHECK(cudaMemcpy(dk.ptr, k, nkv * sizeof(uint16_t), cudaMemcpyHostToDevice));
    MKV_CUDA_CHECK(cudaMemcpy(dv.ptr, v, nkv * sizeof(uint16_t), cudaMemcpyHostToDevice));
    /* The caller's out reaches the device first, so a poisoned buffer
     * shows any element the kernels fail to write. */
    MKV_CUDA_CHECK(cudaMemcpy(dout.ptr, out, nq * sizeof(float), cudaMemcpyHostToDevice));
    mkv_dense_plan *p = NULL;
    if ((rc = mkv_cuda_dense_plan(s, lengths, &p, err)) != MKV_OK)
        return rc;
    rc = mkv_cuda_dense_run(p, dq.as<float>(), dk.as<uint16_t>(), dv.as<uint16_t>(), dout.as<float>(), NULL, err);
    mkv_cuda_dense_plan_free(p);
    if (rc != MKV_OK)
        return rc;
    MKV_CUDA_CHECK(cudaDeviceSynchronize());
    MKV_CUDA_CHECK(cudaMemcpy(out, dout.ptr, nq * sizeof(float), cudaMemcpyDeviceToHost));
    return MKV_OK;
}
