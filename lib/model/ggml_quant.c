/* ggml block layouts to float32. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <string.h>

#include "model/ggml_quant.h"
#include "core/half.h"

int mkv_ggml_can_dequantize(uint32_t type)
{
    return type == MKV_GGML_F32 || type == MKV_GGML_F16 || type == MKV_GGML_BF16 ||
           type == MKV_GGML_Q8_0 || type == MKV_GGML_Q4_0 || type == MKV_GGML_Q4_1;
}

static uint16_t get_u16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }

int mkv_ggml_dequantize(uint32_t type, const void *src, float *dst, uint64_t n, mkv_error *err)
{
    if (!mkv_ggml_can_dequantize(type)) {
        const char *name = mkv_ggml_type_name(type);
        return mkv_fail(err, MKV_EUNSUP,
                        "tensor type %s (%u) cannot be dequantized (supported: F32, F16, BF16, "
                        "Q8_0, Q4_0, Q4_1)", name ? name : "unknown", (unsigned)type);
    }
    uint32_t block = mkv_ggml_block_size(type), size = mkv_ggml_type_size(type);
    if (n % block != 0)
        return mkv_fail(err, MKV_EFORMAT, "%llu elements of type %s is not a whole number of "
                        "%u-element blocks", (unsigned long long)n, mkv_ggml_type_name(type), block);
    const unsigned char *p = src;
    switch (type) {
    case MKV_GGML_F32:
        memcpy(dst, p, n * sizeof(float));
        break;
    case MKV_GGML_F16:
        for (uint64_t i = 0; i < n; i++)
            dst[i] = mkv_f16_to_f32(get_u16(p + 2 * i));
        break;
    case MKV_GGML_BF16:
        for (uint64_t i = 0; i < n; i++)
            dst[i] = mkv_bf16_to_f32(get_u16(p + 2 * i));
        break;
    case MKV_GGML_Q8_0:
        for (uint64_t b = 0; b < n / 32; b++, p += size, dst += 32) {
            float d = mkv_f16_to_f32(get_u16(p));
            for (int j = 0; j < 32; j++)
                dst[j] = (float)(int8_t)p[2 + j] * d;
        }
        break;
    case MKV_GGML_Q4_0:
        for (uint64_t b = 0; b < n / 32; b++, p += size, dst += 32) {
            float d = mkv_f16_to_f32(get_u16(p));
            for (int j = 0; j < 16; j++) {
                dst[j] = (float)((int)(p[2 + j] & 0x0F) - 8) * d;
                dst[j + 16] = (float)((int)(p[2 + j] >> 4) - 8) * d;
            }
        }
        break;
    case MKV_GGML_Q4_1:
        for (uint64_t b = 0; b < n / 32; b++, p += size, dst += 32) {
            float d = mkv_f16_to_f32(get_u16(p)), m = mkv_f16_to_f32(get_u16(p + 2));
            for (int j = 0; j < 16; j++) {
                dst[j] = (float)(p[4 + j] & 0x0F) * d + m;
                dst[j + 16] = (float)(p[4 + j] >> 4) * d + m;
            }
        }
        break;
    }
    return MKV_OK;
}

int mkv_gguf_check_dequantizable(const mkv_gguf *g, const mkv_gguf_tensor *t, mkv_error *err)
{
    if (mkv_ggml_can_dequantize(t->type))
        return MKV_OK;
    const char *name = mkv_ggml_type_name(t->type);
    return mkv_fail(err, MKV_EUNSUP,
                    "'%s': tensor '%s' has type %s, which mosaickv cannot dequantize "
                    "(supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1)",
                    mkv_gguf_path(g), t->name, name ? name : "unknown");
}

int mkv_gguf_dequantize(const mkv_gguf *g, const mkv_gguf_tensor *t, float *dst, mkv_error *err)
{
    int rc = mkv_gguf_check_dequantizable(g, t, err);
    if (rc)
        return rc;
    rc = mkv_ggml_dequantize(t->type, t->data, dst, t->n_elements, err);
    if (rc && err)
        mkv_error_prefix(err, "'%s': tensor '%s'", mkv_gguf_path(g), t->name);
    return rc;
}
