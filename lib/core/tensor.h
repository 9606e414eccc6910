/* Element types, overflow-checked sizes and aligned allocation. */
#ifndef MKV_TENSOR_H
#define MKV_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include "core/mkv.h"

typedef enum { MKV_DTYPE_F32 = 0, MKV_DTYPE_F16 = 1, MKV_DTYPE_BF16 = 2 } mkv_dtype;

const char *mkv_dtype_name(mkv_dtype t);          /* "float32", "float16", "bfloat16" */
int mkv_dtype_parse(const char *s, mkv_dtype *t); /* accepts f32/float32/fp32, f16/float16/fp16/half, bf16/bfloat16; 0 ok */
size_t mkv_dtype_size(mkv_dtype t);

/* *out = a * b (and c...); return 0, or -1 on size_t overflow. */
int mkv_mul_size(size_t a, size_t b, size_t *out);
int mkv_mul_size3(size_t a, size_t b, size_t c, size_t *out);

#define MKV_ALIGN 64
/* Aligned (MKV_ALIGN) allocation of n elements of elem bytes; NULL and err
 * (MKV_ENOMEM, naming what) on overflow or failure. Free with mkv_free. */
void *mkv_alloc(size_t n, size_t elem, const char *what, mkv_error *err);
void *mkv_calloc(size_t n, size_t elem, const char *what, mkv_error *err);
void mkv_free(void *p);

/* Convert n values of type t stored at src to float32. */
void mkv_to_f32(mkv_dtype t, const void *src, float *dst, size_t n);
/* Convert n float32 values to type t at dst. */
void mkv_from_f32(mkv_dtype t, const float *src, void *dst, size_t n);

/* Index of the first non-finite value in x[0..n), or -1 if all are finite. */
int64_t mkv_find_nonfinite(const float *x, size_t n);

#endif
