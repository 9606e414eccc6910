/* Dequantization of ggml tensor data (the block layouts llama.cpp's ggml
 * defines) to float32. */
#ifndef MKV_GGML_QUANT_H
#define MKV_GGML_QUANT_H

#include <stdint.h>
#include "core/mkv.h"
#include "io/gguf.h"

/* ggml tensor types mosaickv dequantizes (the ids are ggml's). */
enum {
    MKV_GGML_F32 = 0,
    MKV_GGML_F16 = 1,
    MKV_GGML_Q4_0 = 2,
    MKV_GGML_Q4_1 = 3,
    MKV_GGML_Q8_0 = 8,
    MKV_GGML_BF16 = 30
};

/* 1 for the types mkv_ggml_dequantize converts (F32, F16, BF16, Q8_0, Q4_0,
 * Q4_1). */
int mkv_ggml_can_dequantize(uint32_t type);

/* Dequantize n elements (a whole number of blocks) of `type` from src to
 * float32 dst.  Q8_0: fp16 d, 32 int8 q: d*q.  Q4_0: fp16 d, 16 bytes whose
 * low nibbles are elements 0..15 and high nibbles 16..31: d*(q-8).  Q4_1:
 * fp16 d, fp16 m, nibbles as Q4_0: d*q + m.  MKV_EUNSUP for another type,
 * MKV_EFORMAT when n is not a whole number of blocks.  On x86-64 CPUs with
 * AVX2 and F16C the block types run eight lanes at a time, with the same
 * float operations in the same order: the results equal, bit for bit,
 * those of mkv_ggml_dequantize_scalar, the portable loops. */
int mkv_ggml_dequantize(uint32_t type, const void *src, float *dst, uint64_t n, mkv_error *err);
int mkv_ggml_dequantize_scalar(uint32_t type, const void *src, float *dst, uint64_t n, mkv_error *err);

/* 1 for the block types mkv_ggml_dot_rows takes (Q8_0, Q4_0, Q4_1). */
int mkv_ggml_can_dot(uint32_t type);

/* y[r] = sum_k W[r][k] x[k] for the n rows of a matrix in blocks of a
 * type mkv_ggml_can_dot takes, row r at rows + r * row_bytes, cols a
 * multiple of 32: a decode step's matrix-vector products read the blocks
 * once and never write them out as floats.  On CPUs with AVX2, FMA and
 * F16C each block adds d * sum(q x) (+ m * sum(x) for Q4_1) to eight float
 * lanes; the sum is that of the dequantized weights times x in another
 * order, so it differs from a dot product of mkv_ggml_dequantize's floats
 * by float32 rounding only.  scratch: cols / 4 floats (block sums of x).
 * mkv_ggml_dot_rows_scalar, the portable path, sums the dequantized
 * weights' products in double. */
void mkv_ggml_dot_rows(uint32_t type, const void *rows, size_t row_bytes, size_t cols, size_t n, const float *x,
                       float *scratch, float *y);
void mkv_ggml_dot_rows_scalar(uint32_t type, const void *rows, size_t row_bytes, size_t cols, size_t n,
                              const float *x, float *y);

/* MKV_OK when tensor t of g has a type mkv_ggml_dequantize converts, else
 * MKV_EUNSUP with a message that names the file, the tensor and its type. */
int mkv_gguf_check_dequantizable(const mkv_gguf *g, const mkv_gguf_tensor *t, mkv_error *err);

/* A tensor of a GGUF file into dst (n_elements floats).  Messages name the
 * tensor and its type. */
int mkv_gguf_dequantize(const mkv_gguf *g, const mkv_gguf_tensor *t, float *dst, mkv_error *err);

#endif
