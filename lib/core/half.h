/* 16-bit floating point formats: IEEE binary16 (fp16) and bfloat16.
 * Conversions round to nearest, ties to even; NaN stays NaN (quiet),
 * infinities and signed zeros are preserved, fp16 subnormals are exact. */
#ifndef MKV_HALF_H
#define MKV_HALF_H

#include <stddef.h>
#include <stdint.h>

uint16_t mkv_f32_to_f16(float f);
float mkv_f16_to_f32(uint16_t h);
uint16_t mkv_f32_to_bf16(float f);
float mkv_bf16_to_f32(uint16_t b);

void mkv_f32_to_f16_n(const float *src, uint16_t *dst, size_t n);
/* In F16C where the CPU has it, bit for bit mkv_f16_to_f32 of each. */
void mkv_f16_to_f32_n(const uint16_t *src, float *dst, size_t n);
void mkv_f32_to_bf16_n(const float *src, uint16_t *dst, size_t n);
void mkv_bf16_to_f32_n(const uint16_t *src, float *dst, size_t n);

#endif
