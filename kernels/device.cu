/* What this CUDA build is and which GPUs it can run on (for --version and
 * for --device auto). */
#include "config.h"

#include <stdio.h>
#include <string.h>
#include <cublas_api.h>
#include <cusolver_common.h>

#include "cuda_check.h"
#include "mkv_cuda.h"

#define MKV_STR2(x) #x
#define MKV_STR(x) MKV_STR2(x)

extern "C" int mkv_cuda_built(void) { return 1; }

extern "C" const char *mkv_cuda_build_info(void)
{
    return "nvcc " MKV_CUDA_VERSION " (" MKV_CUDA_ARCH "), cuBLAS "
        MKV_STR(CUBLAS_VER_MAJOR) "." MKV_STR(CUBLAS_VER_MINOR) "." MKV_STR(CUBLAS_VER_PATCH)
        ", cuSOLVER "
        MKV_STR(CUSOLVER_VER_MAJOR) "." MKV_STR(CUSOLVER_VER_MINOR) "." MKV_STR(CUSOLVER_VER_PATCH);
}

/* Compiled with the same -gencode flags as every other kernel: whether the
 * runtime finds an image of it for a device answers whether this build can
 * run there, without restating the target list in code. */
__global__ void mkv_probe_kernel(int *out) { if (out) *out = 1; }

/* Whether this build has machine code or compatible PTX for the current
 * device; a missing image is an answer, any other error is an error. */
static int probe_current_device(int *usable, mkv_error *err)
{
    cudaFuncAttributes attr;
    cudaError_t e = cudaFuncGetAttributes(&attr, mkv_probe_kernel);
    if (e == cudaSuccess) {
        *usable = 1;
        return MKV_OK;
    }
    (void)cudaGetLastError();
    if (e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction
        || e == cudaErrorInvalidPtx || e == cudaErrorUnsupportedPtxVersion) {
        *usable = 0;
        return MKV_OK;
    }
    return mkv_fail(err, MKV_EGPU, "cudaFuncGetAttributes(probe kernel): %s (%s:%d)",
                    cudaGetErrorString(e), __FILE__, __LINE__);
}

static int describe_device(int index, mkv_gpu_info *gi, mkv_error *err)
{
    cudaDeviceProp prop;
    MKV_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
    memset(gi, 0, sizeof *gi);
    gi->index = index;
    snprintf(gi->name, sizeof gi->name, "%s", prop.name);
    gi->cc_major = prop.major;
    gi->cc_minor = prop.minor;
    gi->multiprocessors = prop.multiProcessorCount;
    /* Free memory needs a context on the device. */
    MKV_CUDA_CHECK(cudaSetDevice(index));
    MKV_CUDA_CHECK(cudaMemGetInfo(&gi->free_mem, &gi->total_mem));
    return probe_current_device(&gi->usable, err);
}

extern "C" int mkv_cuda_devices(mkv_gpu_info *info, int max, int *count, mkv_error *err)
{
    *count = 0;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
        /* No GPU or no driver: the CPU paths serve; not an error. */
        (void)cudaGetLastError();
        return MKV_OK;
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return mkv_fail(err, MKV_EGPU, "cudaGetDeviceCount: %s (%s:%d)",
                        cudaGetErrorString(e), __FILE__, __LINE__);
    }
    *count = n;
    if (max <= 0 || info == NULL || n == 0)
        return MKV_OK;

    /* Leave the caller's current device as it was. */
    int previous = 0;
    MKV_CUDA_CHECK(cudaGetDevice(&previous));
    int status = MKV_OK;
    for (int i = 0; i < n && i < max && status == MKV_OK; i++)
        status = describe_device(i, &info[i], err);
    cudaError_t restore = cudaSetDevice(previous);
    if (status != MKV_OK)
        return status;
    MKV_CUDA_CHECK(restore);
    return MKV_OK;
}
