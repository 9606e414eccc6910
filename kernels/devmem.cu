/* Device buffers for C callers: thin, checked wrappers of the runtime; and
 * the count of the bytes kernels/ holds in mkv_device_buffers. */
#include <atomic>

#include "cuda_check.h"
#include "mkv_cuda.h"

extern "C" int mkv_cuda_malloc(void **ptr, size_t bytes, mkv_error *err)
{
    if (ptr == NULL)
        return mkv_fail(err, MKV_EUSAGE, "GPU allocation: NULL pointer");
    *ptr = NULL;
    cudaError_t e = cudaMalloc(ptr, bytes ? bytes : 16);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        *ptr = NULL;
        return mkv_fail(err, MKV_ENOMEM, "GPU allocation of %zu bytes: out of device memory", bytes);
    }
    MKV_CUDA_CHECK(e);
    return MKV_OK;
}

extern "C" void mkv_cuda_free(void *ptr)
{
    if (ptr)
        (void)cudaFree(ptr);
}

extern "C" int mkv_cuda_upload(void *dst_device, const void *src_host, size_t bytes, mkv_error *err)
{
    if (bytes == 0)
        return MKV_OK;
    MKV_CUDA_CHECK(cudaMemcpy(dst_device, src_host, bytes, cudaMemcpyHostToDevice));
    return MKV_OK;
}

extern "C" int mkv_cuda_download(void *dst_host, const void *src_device, size_t bytes, mkv_error *err)
{
    if (bytes == 0)
        return MKV_OK;
    MKV_CUDA_CHECK(cudaMemcpy(dst_host, src_device, bytes, cudaMemcpyDeviceToHost));
    return MKV_OK;
}

extern "C" int mkv_cuda_memset(void *dst_device, int byte, size_t bytes, mkv_error *err)
{
    if (bytes == 0)
        return MKV_OK;
    MKV_CUDA_CHECK(cudaMemset(dst_device, byte, bytes));
    return MKV_OK;
}

extern "C" int mkv_cuda_synchronize(mkv_error *err)
{
    MKV_CUDA_CHECK(cudaDeviceSynchronize());
    return MKV_OK;
}

/* The count behind mkv_device_buffer (cuda_check.h). */
static std::atomic<uint64_t> device_bytes_now{0}, device_bytes_peak{0};

void mkv_device_bytes_add(int64_t delta)
{
    const uint64_t now = device_bytes_now.fetch_add((uint64_t)delta) + (uint64_t)delta;
    uint64_t peak = device_bytes_peak.load();
    while (now > peak && !device_bytes_peak.compare_exchange_weak(peak, now)) {
    }
}

uint64_t mkv_device_bytes_now() { return device_bytes_now.load(); }
uint64_t mkv_device_bytes_peak() { return device_bytes_peak.load(); }
void mkv_device_bytes_reset_peak() { device_bytes_peak.store(device_bytes_now.load()); }
