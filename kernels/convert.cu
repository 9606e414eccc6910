/* 16-bit float <-> float32 conversion on the GPU.
 *
 * Host buffers in and out; the data passes through device buffers of at
 * most MKV_CONVERT_CHUNK elements, so device memory use is bounded whatever
 * n is.  Rounding is the hardware's cvt.rn (nearest, ties to even; fp16
 * subnormals exact; overflow to Inf), which is what lib/core/half.c computes in
 * software; tests/check_gpu.c compares the two on every fp16/bf16 pattern
 * and on the float32 rounding boundaries.  NaN stays NaN; its payload may
 * differ from the CPU's (the hardware returns a canonical NaN). */
#include <stdint.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "cuda_check.h"
#include "mkv_cuda.h"

/* Elements per pass: 256 MiB of float32 plus 128 MiB of 16-bit values on
 * the device.  A multiple of the vector width, so each pass starts aligned. */
#define MKV_CONVERT_CHUNK ((size_t)64 << 20)
/* Elements per 16-byte load/store of 16-bit values. */
#define VEC 8
#define THREADS 256

static_assert(MKV_CONVERT_CHUNK % VEC == 0, "chunks must keep vector alignment");

template <bool BF16> __device__ __forceinline__ float to_f32(uint16_t h)
{
    if (BF16)
        return __uint_as_float((uint32_t)h << 16); /* bf16 is float32's upper half: exact */
    return __half2float(__ushort_as_half(h));
}

template <bool BF16> __device__ __forceinline__ uint16_t from_f32(float f)
{
    if (BF16)
        return __bfloat16_as_ushort(__float2bfloat16_rn(f));
    return __half_as_ushort(__float2half_rn(f));
}

/* 16-byte loads of eight 16-bit values, two 16-byte stores of floats; the
 * n % VEC elements after the last full vector go one per thread. */
template <bool BF16>
__global__ void __launch_bounds__(THREADS)
k16_to_f32(const uint16_t *__restrict__ src, float *__restrict__ dst, size_t n)
{
    const size_t n_vec = n / VEC;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const uint4 *src_v = reinterpret_cast<const uint4 *>(src);
    float4 *dst_v = reinterpret_cast<float4 *>(dst);
    for (size_t i = tid; i < n_vec; i += stride) {
        uint4 in = src_v[i];
        uint32_t w[4] = {in.x, in.y, in.z, in.w};
        float out[VEC];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            out[2 * j] = to_f32<BF16>((uint16_t)(w[j] & 0xFFFFu));
            out[2 * j + 1] = to_f32<BF16>((uint16_t)(w[j] >> 16));
        }
        dst_v[2 * i] = make_float4(out[0], out[1], out[2], out[3]);
        dst_v[2 * i + 1] = make_float4(out[4], out[5], out[6], out[7]);
    }
    const size_t tail = n_vec * VEC + tid;
    if (tail < n)
        dst[tail] = to_f32<BF16>(src[tail]);
}

template <bool BF16>
__global__ void __launch_bounds__(THREADS)
f32_to_k16(const float *__restrict__ src, uint16_t *__restrict__ dst, size_t n)
{
    const size_t n_vec = n / VEC;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const float4 *src_v = reinterpret_cast<const float4 *>(src);
    uint4 *dst_v = reinterpret_cast<uint4 *>(dst);
    for (size_t i = tid; i < n_vec; i += stride) {
        float4 a = src_v[2 * i], b = src_v[2 * i + 1];
        uint4 out;
        out.x = from_f32<BF16>(a.x) | ((uint32_t)from_f32<BF16>(a.y) << 16);
        out.y = from_f32<BF16>(a.z) | ((uint32_t)from_f32<BF16>(a.w) << 16);
        out.z = from_f32<BF16>(b.x) | ((uint32_t)from_f32<BF16>(b.y) << 16);
        out.w = from_f32<BF16>(b.z) | ((uint32_t)from_f32<BF16>(b.w) << 16);
        dst_v[i] = out;
    }
    const size_t tail = n_vec * VEC + tid;
    if (tail < n)
        dst[tail] = from_f32<BF16>(src[tail]);
}

/* Enough blocks to fill the device a few times over; the grid-stride loop
 * covers the rest.  At least one block for the tail. */
static unsigned grid_for(size_t n, int multiprocessors)
{
    size_t blocks = (n / VEC + THREADS - 1) / THREADS;
    size_t cap = (size_t)multiprocessors * 8;
    if (blocks > cap)
        blocks = cap;
    return blocks ? (unsigned)blocks : 1u;
}

static int check_args(const void *src, const void *dst, size_t n, mkv_error *err)
{
    if (n > SIZE_MAX / sizeof(float))
        return mkv_fail(err, MKV_ENOMEM, "GPU conversion of %zu elements: size overflow", n);
    if (src == NULL || dst == NULL)
        return mkv_fail(err, MKV_EUSAGE, "GPU conversion of %zu elements: NULL buffer", n);
    return MKV_OK;
}

static int current_multiprocessors(int *sms, mkv_error *err)
{
    int dev = 0;
    MKV_CUDA_CHECK(cudaGetDevice(&dev));
    MKV_CUDA_CHECK(cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev));
    return MKV_OK;
}

extern "C" int mkv_cuda_f16_to_f32(const uint16_t *src, float *dst, size_t n, int is_bf16,
                                   mkv_error *err)
{
    if (n == 0)
        return MKV_OK;
    int rc = check_args(src, dst, n, err);
    if (rc != MKV_OK)
        return rc;
    int sms = 0;
    if ((rc = current_multiprocessors(&sms, err)) != MKV_OK)
        return rc;

    const size_t chunk = n < MKV_CONVERT_CHUNK ? n : MKV_CONVERT_CHUNK;
    mkv_device_buffer d_src, d_dst;
    MKV_CUDA_CHECK(d_src.alloc(chunk * sizeof(uint16_t)));
    MKV_CUDA_CHECK(d_dst.alloc(chunk * sizeof(float)));
    for (size_t off = 0; off < n; off += chunk) {
        const size_t m = n - off < chunk ? n - off : chunk;
        MKV_CUDA_CHECK(cudaMemcpy(d_src.ptr, src + off, m * sizeof(uint16_t),
                                  cudaMemcpyHostToDevice));
        if (is_bf16)
            k16_to_f32<true><<<grid_for(m, sms), THREADS>>>(d_src.as<uint16_t>(), d_dst.as<float>(), m);
        else
            k16_to_f32<false><<<grid_for(m, sms), THREADS>>>(d_src.as<uint16_t>(), d_dst.as<float>(), m);
        MKV_CUDA_CHECK_LAUNCH();
        MKV_CUDA_CHECK(cudaMemcpy(dst + off, d_dst.ptr, m * sizeof(float),
                                  cudaMemcpyDeviceToHost));
    }
    return MKV_OK;
}

extern "C" int mkv_cuda_f32_to_f16(const float *src, uint16_t *dst, size_t n, int is_bf16,
                                   mkv_error *err)
{
    if (n == 0)
        return MKV_OK;
    int rc = check_args(src, dst, n, err);
    if (rc != MKV_OK)
        return rc;
    int sms = 0;
    if ((rc = current_multiprocessors(&sms, err)) != MKV_OK)
        return rc;

    const size_t chunk = n < MKV_CONVERT_CHUNK ? n : MKV_CONVERT_CHUNK;
    mkv_device_buffer d_src, d_dst;
    MKV_CUDA_CHECK(d_src.alloc(chunk * sizeof(float)));
    MKV_CUDA_CHECK(d_dst.alloc(chunk * sizeof(uint16_t)));
    for (size_t off = 0; off < n; off += chunk) {
        const size_t m = n - off < chunk ? n - off : chunk;
        MKV_CUDA_CHECK(cudaMemcpy(d_src.ptr, src + off, m * sizeof(float),
                                  cudaMemcpyHostToDevice));
        if (is_bf16)
            f32_to_k16<true><<<grid_for(m, sms), THREADS>>>(d_src.as<float>(), d_dst.as<uint16_t>(), m);
        else
            f32_to_k16<false><<<grid_for(m, sms), THREADS>>>(d_src.as<float>(), d_dst.as<uint16_t>(), m);
        MKV_CUDA_CHECK_LAUNCH();
        MKV_CUDA_CHECK(cudaMemcpy(dst + off, d_dst.ptr, m * sizeof(uint16_t),
                                  cudaMemcpyDeviceToHost));
    }
    return MKV_OK;
}
