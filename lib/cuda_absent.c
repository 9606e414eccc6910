/* The CUDA entry points in a build without nvcc: GPU features report
 * themselves absent, so the tools fall back to the CPU or say why not. */
#include "mkv_cuda.h"

int mkv_cuda_built(void) { return 0; }

const char *mkv_cuda_build_info(void) { return "no CUDA"; }

int mkv_cuda_devices(mkv_gpu_info *info, int max, int *count, mkv_error *err)
{
    (void)info; (void)max; (void)err;
    *count = 0;
    return MKV_OK;
}

int mkv_cuda_f16_to_f32(const uint16_t *src, float *dst, size_t n, int is_bf16, mkv_error *err)
{
    (void)src; (void)dst; (void)n; (void)is_bf16;
    return mkv_fail(err, MKV_EUNSUP, "GPU conversion: built without CUDA");
}

int mkv_cuda_f32_to_f16(const float *src, uint16_t *dst, size_t n, int is_bf16, mkv_error *err)
{
    (void)src; (void)dst; (void)n; (void)is_bf16;
    return mkv_fail(err, MKV_EUNSUP, "GPU conversion: built without CUDA");
}
