/* Error checking for the CUDA translation units (C++; included only by the
 * .cu files in kernels/).
 *
 * Inside a function that returns an mkv_status and has an `mkv_error *err`
 * in scope:
 *
 *     MKV_CUDA_CHECK(buf.alloc(bytes));
 *     kernel<<<grid, block>>>(...);
 *     MKV_CUDA_CHECK_LAUNCH();
 *     MKV_CUBLAS_CHECK(cublasSgemm(...));
 *     MKV_CUSOLVER_CHECK(cusolverDnSsyevd(...));
 *
 * A failure returns MKV_EGPU from the enclosing function with the call's
 * text, the library's message and the source position, so the tool can
 * print it as is.  Because these macros return early, hold device memory in
 * mkv_device_buffer (below) so that every exit path frees it. */
#ifndef MKV_CUDA_CHECK_H
#define MKV_CUDA_CHECK_H

#ifndef __cplusplus
#error "cuda_check.h is for the .cu files (C++)"
#endif

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime.h>

#include "core/mkv.h"

#define MKV_CUDA_CHECK(call)                                                   \
    do {                                                                       \
        cudaError_t mkv_cuda_e_ = (call);                                      \
        if (mkv_cuda_e_ != cudaSuccess) {                                      \
            (void)cudaGetLastError(); /* clear a non-sticky error */           \
            return mkv_fail(err, MKV_EGPU, "%s: %s (%s:%d)", #call,            \
                            cudaGetErrorString(mkv_cuda_e_), __FILE__, __LINE__); \
        }                                                                      \
    } while (0)

/* After a kernel launch: bad launch configurations are reported at once;
 * faults inside the kernel surface at the next synchronising call, which is
 * itself checked. */
#define MKV_CUDA_CHECK_LAUNCH() MKV_CUDA_CHECK(cudaGetLastError())

/* cuBLAS and cuSOLVER return their own status types; the headers that
 * define them are included by the files that use these macros. */
#define MKV_CUBLAS_CHECK(call)                                                 \
    do {                                                                       \
        cublasStatus_t mkv_cublas_s_ = (call);                                 \
        if (mkv_cublas_s_ != CUBLAS_STATUS_SUCCESS)                            \
            return mkv_fail(err, MKV_EGPU, "%s: %s (%s:%d)", #call,            \
                            cublasGetStatusString(mkv_cublas_s_), __FILE__, __LINE__); \
    } while (0)

#define MKV_CUSOLVER_CHECK(call)                                               \
    do {                                                                       \
        cusolverStatus_t mkv_cusolver_s_ = (call);                             \
        if (mkv_cusolver_s_ != CUSOLVER_STATUS_SUCCESS)                        \
            return mkv_fail(err, MKV_EGPU, "%s: cuSOLVER status %d (%s:%d)",   \
                            #call, (int)mkv_cusolver_s_, __FILE__, __LINE__);  \
    } while (0)

/* Bytes held in mkv_device_buffers, now and at most since the last
 * mkv_device_bytes_reset_peak() (kernels/devmem.cu): the benchmark's
 * memory column. */
void mkv_device_bytes_add(int64_t delta);
uint64_t mkv_device_bytes_now();
uint64_t mkv_device_bytes_peak();
void mkv_device_bytes_reset_peak();

/* Device memory freed when it goes out of scope, so an early return from a
 * check macro does not leak; every device allocation of kernels/ goes
 * through alloc(), which counts it. */
struct mkv_device_buffer {
    void *ptr = nullptr;
    size_t bytes = 0;
    mkv_device_buffer() = default;
    mkv_device_buffer(const mkv_device_buffer &) = delete;
    mkv_device_buffer &operator=(const mkv_device_buffer &) = delete;
    ~mkv_device_buffer() { release(); }
    /* n bytes (16 for 0, so that the pointer is real); frees what it held. */
    cudaError_t alloc(size_t n)
    {
        release();
        const size_t want = n ? n : 16;
        cudaError_t e = cudaMalloc(&ptr, want);
        if (e != cudaSuccess) {
            ptr = nullptr;
            return e;
        }
        bytes = want;
        mkv_device_bytes_add((int64_t)want);
        return cudaSuccess;
    }
    void release()
    {
        if (ptr) {
            (void)cudaFree(ptr);
            mkv_device_bytes_add(-(int64_t)bytes);
        }
        ptr = nullptr;
        bytes = 0;
    }
    template <typename T> T *as() const { return static_cast<T *>(ptr); }
};

#endif
