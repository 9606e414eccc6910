/* The only door between the C library/tools and the CUDA kernels.
 *
 * Every function here exists in every build: with CUDA it is implemented in
 * the kernels/ .cu files; without, lib/cuda_absent.c returns MKV_EUNSUP ("built
 * without CUDA"). Functions never exit; CUDA errors become MKV_EGPU with the
 * CUDA error string and the call that failed. */
#ifndef MKV_CUDA_H
#define MKV_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include "mkv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 if this build has the CUDA kernels. */
int mkv_cuda_built(void);
/* nvcc version and target flags of this build, or "no CUDA". */
const char *mkv_cuda_build_info(void);

typedef struct {
    int index;
    char name[256];
    int cc_major, cc_minor;
    size_t total_mem, free_mem;
    int multiprocessors;
    int usable;            /* this build has machine code or PTX for it */
} mkv_gpu_info;

/* Number of GPUs the runtime sees (0 when none or no driver; that is not an
 * error). Fills up to max entries of info. */
int mkv_cuda_devices(mkv_gpu_info *info, int max, int *count, mkv_error *err);

/* 16-bit <-> float32 conversion on the GPU (host buffers in and out; the
 * device copies are internal). is_bf16 selects bfloat16 instead of fp16.
 * Rounding: nearest-even, NaN/Inf preserved, same as lib/half.c. */
int mkv_cuda_f16_to_f32(const uint16_t *src, float *dst, size_t n, int is_bf16, mkv_error *err);
int mkv_cuda_f32_to_f16(const float *src, uint16_t *dst, size_t n, int is_bf16, mkv_error *err);

#ifdef __cplusplus
}
#endif
#endif
