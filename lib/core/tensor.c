/* Element types, overflow-checked sizes, aligned allocation. */
#include "core/tensor.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/half.h"

const char *mkv_dtype_name(mkv_dtype t)
{
    switch (t) {
    case MKV_DTYPE_F32: return "float32";
    case MKV_DTYPE_F16: return "float16";
    case MKV_DTYPE_BF16: return "bfloat16";
    }
    return "?";
}

int mkv_dtype_parse(const char *s, mkv_dtype *t)
{
    static const struct { const char *name; mkv_dtype t; } names[] = {
        {"f32", MKV_DTYPE_F32}, {"fp32", MKV_DTYPE_F32}, {"float32", MKV_DTYPE_F32},
        {"f16", MKV_DTYPE_F16}, {"fp16", MKV_DTYPE_F16}, {"float16", MKV_DTYPE_F16},
        {"half", MKV_DTYPE_F16}, {"bf16", MKV_DTYPE_BF16}, {"bfloat16", MKV_DTYPE_BF16},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcasecmp(s, names[i].name) == 0) {
            *t = names[i].t;
            return 0;
        }
    return -1;
}

size_t mkv_dtype_size(mkv_dtype t) { return t == MKV_DTYPE_F32 ? 4 : 2; }

int mkv_mul_size(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a)
        return -1;
    *out = a * b;
    return 0;
}

int mkv_mul_size3(size_t a, size_t b, size_t c, size_t *out)
{
    size_t ab;
    return mkv_mul_size(a, b, &ab) ? -1 : mkv_mul_size(ab, c, out);
}

void *mkv_alloc(size_t n, size_t elem, const char *what, mkv_error *err)
{
    size_t bytes;
    if (mkv_mul_size(n, elem, &bytes) || bytes > SIZE_MAX - MKV_ALIGN) {
        mkv_fail(err, MKV_ENOMEM, "%s: size %zu x %zu bytes overflows", what, n, elem);
        return NULL;
    }
    /* aligned_alloc needs a multiple of the alignment; never ask for 0 */
    size_t rounded = (bytes + MKV_ALIGN - 1) / MKV_ALIGN * MKV_ALIGN;
    void *p = aligned_alloc(MKV_ALIGN, rounded ? rounded : MKV_ALIGN);
    if (!p)
        mkv_fail(err, MKV_ENOMEM, "%s: out of memory allocating %zu bytes", what, bytes);
    return p;
}

void *mkv_calloc(size_t n, size_t elem, const char *what, mkv_error *err)
{
    void *p = mkv_alloc(n, elem, what, err);
    if (p)
        memset(p, 0, n * elem);
    return p;
}

void mkv_free(void *p) { free(p); }

void mkv_to_f32(mkv_dtype t, const void *src, float *dst, size_t n)
{
    switch (t) {
    case MKV_DTYPE_F32: memmove(dst, src, n * sizeof(float)); break;
    case MKV_DTYPE_F16: mkv_f16_to_f32_n(src, dst, n); break;
    case MKV_DTYPE_BF16: mkv_bf16_to_f32_n(src, dst, n); break;
    }
}

void mkv_from_f32(mkv_dtype t, const float *src, void *dst, size_t n)
{
    switch (t) {
    case MKV_DTYPE_F32: memmove(dst, src, n * sizeof(float)); break;
    case MKV_DTYPE_F16: mkv_f32_to_f16_n(src, dst, n); break;
    case MKV_DTYPE_BF16: mkv_f32_to_bf16_n(src, dst, n); break;
    }
}

int64_t mkv_find_nonfinite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return (int64_t)i;
    return -1;
}
