/* Device buffers for C callers: thin, checked wrappers of the runtime. */
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
