/* GGUF reading, dequantization, the llama loader and GPT-2 byte-level BPE.
 *
 * References: GGUF files this test writes itself byte by byte (metadata of
 * every type, tensors of every supported type with blocks whose values are
 * worked out here from the GGML block layouts), the llama2.c loader on the
 * same weights (tests/model_fixture.py's model and stories260K converted
 * to GGUF here: the same logits, ids and greedy continuation), a
 * GGUF with rope_freqs.weight (computed here the way llama.cpp's converter
 * does) against the same weights under a config.json with Llama 3.1's
 * "llama3" rope_scaling read by the Hugging Face loader (the same logits),
 * the published stories260K token ids and sample, hand-worked BPE merges,
 * and token ids and pre-token splits produced by Hugging Face's
 * `tokenizers` (tests/gguf_ref.py says how).
 *
 * Real models, each skipped with a message when absent (the test passes
 * on the rest; exit 77 only without the fixture):
 *   stories260K.bin + tok512.bin (the published ids and sample only):
 *     $MKV_MODELS_DIR, else ../shared/models
 *   SmolLM2-135M-Instruct.Q4_1.gguf: $MKV_SMOLLM2, else
 *     ${MKV_CACHE_DIR:-$HOME/.cache/mosaickv}/ (scripts/get-models fetches it)
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/half.h"
#include "io/gguf.h"
#include "vocab/bpe_gpt2.h"
#include "model/forward.h"
#include "model/ggml_quant.h"
#include "model/gguf.h"
#include "model/hf.h"
#include "model/model.h"
#include "model/sampler.h"
#include "testutil.h"
#include "vocab/gguf_vocab.h"
#include "vocab/tokenizer.h"

/* ------------------------------------------------------------ environment */

static int readable(const char *path) { return access(path, R_OK) == 0; }

static const char *smollm2_path(void)
{
    static char path[4096];
    static int looked;
    if (!looked) {
        looked = 1;
        const char *env = getenv("MKV_SMOLLM2"), *cache = getenv("MKV_CACHE_DIR"),
                   *home = getenv("HOME");
        if (env && *env)
            snprintf(path, sizeof path, "%s", env);
        else if (cache && *cache)
            snprintf(path, sizeof path, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", cache);
        else if (home && *home)
            snprintf(path, sizeof path, "%s/.cache/mosaickv/SmolLM2-135M-Instruct.Q4_1.gguf", home);
        if (!readable(path))
            path[0] = '\0';
    }
    return path[0] ? path : NULL;
}

static const char *tmp_file(const char *name)
{
    static char path[4][256];
    static int which;
    which = (which + 1) % 4;
    return test_path(path[which], sizeof path[which], name);
}

/* ------------------------------------------------------------ a GGUF writer */

typedef struct {
    unsigned char *p;
    size_t n, cap;
} buf;

static void b_put(buf *b, const void *data, size_t n)
{
    if (n == 0)
        return;
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        ck_assert_ptr_nonnull(b->p);
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void b_u8(buf *b, uint8_t v) { b_put(b, &v, 1); }
static void b_u16(buf *b, uint16_t v) { unsigned char x[2] = {(unsigned char)v, (unsigned char)(v >> 8)}; b_put(b, x, 2); }
static void b_u32(buf *b, uint32_t v) { for (int i = 0; i < 4; i++) b_u8(b, (uint8_t)(v >> (8 * i))); }
static void b_u64(buf *b, uint64_t v) { for (int i = 0; i < 8; i++) b_u8(b, (uint8_t)(v >> (8 * i))); }
static void b_f32(buf *b, float f) { uint32_t u; memcpy(&u, &f, 4); b_u32(b, u); }
static void b_f64(buf *b, double f) { uint64_t u; memcpy(&u, &f, 8); b_u64(b, u); }
static void b_strn(buf *b, const char *s, size_t n) { b_u64(b, n); b_put(b, s, n); }
static void b_str(buf *b, const char *s) { b_strn(b, s, strlen(s)); }
static void b_pad(buf *b, size_t base, uint32_t align)
{
    while ((base + b->n) % align)
        b_u8(b, 0);
}

/* Value type ids of the GGUF specification, spelled out here. */
enum { T_U8 = 0, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 };
/* ggml type ids */
enum { G_F32 = 0, G_F16 = 1, G_Q4_0 = 2, G_Q4_1 = 3, G_Q8_0 = 8, G_Q4_K = 12, G_BF16 = 30 };

typedef struct {
    buf kv, info, data;
    uint64_t n_kv, n_tensors;
    uint32_t alignment;
    uint32_t version;
} gguf_w;

static void w_init(gguf_w *w)
{
    memset(w, 0, sizeof *w);
    w->alignment = 32;
    w->version = 3;
}

static void w_free(gguf_w *w)
{
    free(w->kv.p);
    free(w->info.p);
    free(w->data.p);
}

static void w_key(gguf_w *w, const char *key, uint32_t type)
{
    b_str(&w->kv, key);
    b_u32(&w->kv, type);
    w->n_kv++;
}

static void kv_u32(gguf_w *w, const char *k, uint32_t v) { w_key(w, k, T_U32); b_u32(&w->kv, v); }
static void kv_f32(gguf_w *w, const char *k, float v) { w_key(w, k, T_F32); b_f32(&w->kv, v); }
static void kv_bool(gguf_w *w, const char *k, int v) { w_key(w, k, T_BOOL); b_u8(&w->kv, (uint8_t)v); }
static void kv_str(gguf_w *w, const char *k, const char *v) { w_key(w, k, T_STR); b_str(&w->kv, v); }

static void kv_arr_str(gguf_w *w, const char *k, const char *const *s, size_t n)
{
    w_key(w, k, T_ARR);
    b_u32(&w->kv, T_STR);
    b_u64(&w->kv, n);
    for (size_t i = 0; i < n; i++)
        b_str(&w->kv, s[i]);
}

static void kv_arr_i32(gguf_w *w, const char *k, const int32_t *v, size_t n)
{
    w_key(w, k, T_ARR);
    b_u32(&w->kv, T_I32);
    b_u64(&w->kv, n);
    for (size_t i = 0; i < n; i++)
        b_u32(&w->kv, (uint32_t)v[i]);
}

static void kv_arr_f32(gguf_w *w, const char *k, const float *v, size_t n)
{
    w_key(w, k, T_ARR);
    b_u32(&w->kv, T_F32);
    b_u64(&w->kv, n);
    for (size_t i = 0; i < n; i++)
        b_f32(&w->kv, v[i]);
}

/* A tensor info with an explicit offset (data added separately). */
static void w_info(gguf_w *w, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                   uint64_t offset)
{
    b_str(&w->info, name);
    b_u32(&w->info, n_dims);
    for (uint32_t d = 0; d < n_dims; d++)
        b_u64(&w->info, ne[d]);
    b_u32(&w->info, type);
    b_u64(&w->info, offset);
    w->n_tensors++;
}

/* A tensor and its data, placed at the next aligned offset. */
static void w_tensor(gguf_w *w, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                     const void *data, size_t nbytes)
{
    b_pad(&w->data, 0, w->alignment);
    w_info(w, name, n_dims, ne, type, w->data.n);
    b_put(&w->data, data, nbytes);
}

static void w_tensor_f32(gguf_w *w, const char *name, uint64_t ne0, uint64_t ne1, const float *x)
{
    uint64_t ne[2] = {ne0, ne1};
    w_tensor(w, name, ne1 ? 2 : 1, ne, G_F32, x, (size_t)(ne0 * (ne1 ? ne1 : 1)) * sizeof(float));
}

static void w_build(const gguf_w *w, buf *out)
{
    memset(out, 0, sizeof *out);
    b_put(out, "GGUF", 4);
    b_u32(out, w->version);
    b_u64(out, w->n_tensors);
    b_u64(out, w->n_kv);
    b_put(out, w->kv.p, w->kv.n);
    b_put(out, w->info.p, w->info.n);
    b_pad(out, 0, w->alignment);
    b_put(out, w->data.p, w->data.n);
}

static void write_bytes(const char *path, const void *data, size_t n)
{
    FILE *fp = fopen(path, "wb");
    ck_assert_ptr_nonnull(fp);
    ck_assert_uint_eq(fwrite(data, 1, n, fp), n);
    ck_assert_int_eq(fclose(fp), 0);
}

static void w_write(const gguf_w *w, const char *path)
{
    buf out;
    w_build(w, &out);
    write_bytes(path, out.p, out.n);
    free(out.p);
}

/* Open must fail; the message must contain `want`. */
static void expect_open_error(const char *path, const char *want)
{
    mkv_gguf *g = NULL;
    mkv_error err;
    int rc = mkv_gguf_open(path, &g, &err);
    ck_assert_msg(rc != MKV_OK, "'%s' opened, expected an error with \"%s\"", path, want);
    ck_assert_ptr_null(g);
    ck_assert_msg(strstr(err.msg, want) != NULL, "message \"%s\" lacks \"%s\"", err.msg, want);
}

/* ------------------------------------------------------------ metadata */

START_TEST(test_metadata_all_types)
{
    for (uint32_t version = 2; version <= 3; version++) {
        gguf_w w;
        w_init(&w);
        w.version = version;
        w.alignment = 64;
        kv_u32(&w, "general.alignment", 64);
        w_key(&w, "t.u8", T_U8); b_u8(&w.kv, 200);
        w_key(&w, "t.i8", T_I8); b_u8(&w.kv, 0x80);             /* -128 */
        w_key(&w, "t.u16", T_U16); b_u16(&w.kv, 65535);
        w_key(&w, "t.i16", T_I16); b_u16(&w.kv, 0xFFFE);        /* -2 */
        kv_u32(&w, "t.u32", 4000000000u);
        w_key(&w, "t.i32", T_I32); b_u32(&w.kv, 0x80000000u);   /* INT32_MIN */
        kv_f32(&w, "t.f32", 1.5f);
        kv_bool(&w, "t.bool", 1);
        kv_str(&w, "t.str", "h\xC3\xA9llo");
        w_key(&w, "t.u64", T_U64); b_u64(&w.kv, UINT64_MAX);
        w_key(&w, "t.i64", T_I64); b_u64(&w.kv, (uint64_t)-5);
        w_key(&w, "t.f64", T_F64); b_f64(&w.kv, -0.125);
        w_key(&w, "t.str_nul", T_STR); b_strn(&w.kv, "a\0b", 3);
        int32_t ints[3] = {7, -8, 9};
        kv_arr_i32(&w, "t.arr_i32", ints, 3);
        float fl[2] = {0.25f, -4.0f};
        kv_arr_f32(&w, "t.arr_f32", fl, 2);
        const char *strs[3] = {"x", "", "yz"};
        kv_arr_str(&w, "t.arr_str", strs, 3);
        w_key(&w, "t.arr_u8", T_ARR); b_u32(&w.kv, T_U8); b_u64(&w.kv, 2); b_u8(&w.kv, 1); b_u8(&w.kv, 255);
        w_key(&w, "t.arr_bool", T_ARR); b_u32(&w.kv, T_BOOL); b_u64(&w.kv, 2); b_u8(&w.kv, 0); b_u8(&w.kv, 1);
        w_key(&w, "t.arr_u64", T_ARR); b_u32(&w.kv, T_U64); b_u64(&w.kv, 1); b_u64(&w.kv, 1ULL << 40);
        w_key(&w, "t.arr_f64", T_ARR); b_u32(&w.kv, T_F64); b_u64(&w.kv, 1); b_f64(&w.kv, 2.5);
        w_key(&w, "t.arr_empty", T_ARR); b_u32(&w.kv, T_I16); b_u64(&w.kv, 0);
        /* [[1, 2], [], [3]] as arrays of int16 */
        w_key(&w, "t.nested", T_ARR); b_u32(&w.kv, T_ARR); b_u64(&w.kv, 3);
        b_u32(&w.kv, T_I16); b_u64(&w.kv, 2); b_u16(&w.kv, 1); b_u16(&w.kv, 2);
        b_u32(&w.kv, T_I16); b_u64(&w.kv, 0);
        b_u32(&w.kv, T_I16); b_u64(&w.kv, 1); b_u16(&w.kv, 3);
        float t[4] = {1, 2, 3, 4};
        w_tensor_f32(&w, "x", 4, 0, t);
        const char *path = tmp_file("meta.gguf");
        w_write(&w, path);
        w_free(&w);

        mkv_gguf *g;
        mkv_error err;
        ck_assert_msg(mkv_gguf_open(path, &g, &err) == MKV_OK, "%s", err.msg);
        ck_assert_uint_eq(mkv_gguf_version(g), version);
        ck_assert_uint_eq(mkv_gguf_alignment(g), 64);
        ck_assert_uint_eq(mkv_gguf_data_offset(g) % 64, 0);
        ck_assert_uint_eq(mkv_gguf_n_kv(g), 23);
        ck_assert_str_eq(mkv_gguf_kv_key(g, 1), "t.u8");
        ck_assert_str_eq(mkv_gguf_kv_key(g, 22), "t.nested");
        ck_assert_ptr_null(mkv_gguf_kv_key(g, 23));
        int64_t i;
        double f;
        int b;
        size_t len;
        ck_assert_int_eq(mkv_gguf_value_int(mkv_gguf_find(g, "t.u8"), &i), 0); ck_assert_int_eq(i, 200);
        ck_assert_int_eq(mkv_gguf_value_int(mkv_gguf_find(g, "t.i8"), &i), 0); ck_assert_int_eq(i, -128);
        ck_assert_int_eq(mkv_gguf_value_int(mkv_gguf_find(g, "t.u16"), &i), 0); ck_assert_int_eq(i, 65535);
        ck_assert_int_eq(mkv_gguf_value_int(mkv_gguf_find(g, "t.i16"), &i), 0); ck_assert_int_eq(i, -2);
        ck_assert_int_eq(mkv_gguf_value_int(mkv_gguf_find(g, "t.u32"), &i), 0); ck_assert_int_eq(i, 4000000000LL);
        ck_assert_int_eq(mkv_gguf_value_int(mkv_gguf_find(g, "t.i32"), &i), 0); ck_assert_int_eq(i, INT32_MIN);
        ck_assert_int_eq(mkv_gguf_value_int(mkv_gguf_find(g, "t.i64"), &i), 0); ck_assert_int_eq(i, -5);
        /* UINT64_MAX does not fit int64; floats are not integers */
        ck_assert_int_eq(mkv_gguf_value_int(mkv_gguf_find(g, "t.u64"), &i), -1);
        ck_assert(mkv_gguf_find(g, "t.u64")->v.u == UINT64_MAX);
        ck_assert_int_eq(mkv_gguf_value_int(mkv_gguf_find(g, "t.f32"), &i), -1);
        ck_assert_int_eq(mkv_gguf_value_float(mkv_gguf_find(g, "t.f32"), &f), 0); ck_assert(f == 1.5);
        ck_assert_int_eq(mkv_gguf_value_float(mkv_gguf_find(g, "t.f64"), &f), 0); ck_assert(f == -0.125);
        ck_assert_int_eq(mkv_gguf_value_bool(mkv_gguf_find(g, "t.bool"), &b), 0); ck_assert_int_eq(b, 1);
        ck_assert_int_eq(mkv_gguf_value_bool(mkv_gguf_find(g, "t.u8"), &b), -1);
        ck_assert_str_eq(mkv_gguf_value_str(mkv_gguf_find(g, "t.str"), &len), "h\xC3\xA9llo");
        ck_assert_uint_eq(len, 6);
        const char *s = mkv_gguf_value_str(mkv_gguf_find(g, "t.str_nul"), &len);
        ck_assert_uint_eq(len, 3);
        ck_assert_int_eq(memcmp(s, "a\0b", 4), 0);
        ck_assert_ptr_null(mkv_gguf_value_str(mkv_gguf_find(g, "t.u8"), &len));
        ck_assert_ptr_null(mkv_gguf_find(g, "t.missing"));

        const mkv_gguf_value *a = mkv_gguf_find(g, "t.arr_i32");
        ck_assert_int_eq(a->type, MKV_GGUF_ARRAY);
        ck_assert_int_eq(a->elem_type, MKV_GGUF_INT32);
        ck_assert_uint_eq(a->n, 3);
        ck_assert_int_eq(mkv_gguf_array_int(a, 1, &i), 0); ck_assert_int_eq(i, -8);
        ck_assert_int_eq(mkv_gguf_array_int(a, 3, &i), -1);
        ck_assert_int_eq(mkv_gguf_array_float(mkv_gguf_find(g, "t.arr_f32"), 1, &f), 0); ck_assert(f == -4.0);
        ck_assert_int_eq(mkv_gguf_array_int(mkv_gguf_find(g, "t.arr_u8"), 1, &i), 0); ck_assert_int_eq(i, 255);
        ck_assert_int_eq(mkv_gguf_array_int(mkv_gguf_find(g, "t.arr_bool"), 1, &i), -1);
        ck_assert_int_eq(mkv_gguf_array_int(mkv_gguf_find(g, "t.arr_u64"), 0, &i), 0); ck_assert_int_eq(i, 1LL << 40);
        ck_assert_int_eq(mkv_gguf_array_float(mkv_gguf_find(g, "t.arr_f64"), 0, &f), 0); ck_assert(f == 2.5);
        ck_assert_uint_eq(mkv_gguf_find(g, "t.arr_empty")->n, 0);
        a = mkv_gguf_find(g, "t.arr_str");
        ck_assert_str_eq(mkv_gguf_value_str(mkv_gguf_array_item(a, 0), NULL), "x");
        ck_assert_str_eq(mkv_gguf_value_str(mkv_gguf_array_item(a, 1), NULL), "");
        ck_assert_str_eq(mkv_gguf_value_str(mkv_gguf_array_item(a, 2), NULL), "yz");
        ck_assert_ptr_null(mkv_gguf_array_item(a, 3));
        a = mkv_gguf_find(g, "t.nested");
        ck_assert_uint_eq(a->n, 3);
        ck_assert_uint_eq(mkv_gguf_array_item(a, 0)->n, 2);
        ck_assert_uint_eq(mkv_gguf_array_item(a, 1)->n, 0);
        ck_assert_int_eq(mkv_gguf_array_int(mkv_gguf_array_item(a, 0), 1, &i), 0); ck_assert_int_eq(i, 2);
        ck_assert_int_eq(mkv_gguf_array_int(mkv_gguf_array_item(a, 2), 0, &i), 0); ck_assert_int_eq(i, 3);

        ck_assert_uint_eq(mkv_gguf_n_tensors(g), 1);
        const mkv_gguf_tensor *x = mkv_gguf_find_tensor(g, "x");
        ck_assert_ptr_nonnull(x);
        ck_assert_uint_eq(x->offset, mkv_gguf_data_offset(g));
        ck_assert_uint_eq(x->nbytes, 16);
        float back[4];
        ck_assert_int_eq(mkv_gguf_dequantize(g, x, back, &err), MKV_OK);
        ck_assert(back[0] == 1 && back[3] == 4);
        mkv_gguf_close(g);
    }
}
END_TEST

/* ------------------------------------------------------------ dequantization */

/* Blocks built from the GGML layouts; expected values worked out here
 * with the decimal value of each fp16 scale written out. */
START_TEST(test_dequantize_types)
{
    gguf_w w;
    w_init(&w);
    /* F16: 1, -2, 0.5, 65504 (largest), 2^-24 (smallest subnormal), -0,
     * 0x3555 = 1365/4096, 100 */
    uint16_t h[8] = {0x3C00, 0xC000, 0x3800, 0x7BFF, 0x0001, 0x8000, 0x3555, 0x5640};
    float h_want[8] = {1.0f, -2.0f, 0.5f, 65504.0f, 5.9604644775390625e-08f, -0.0f,
                       0.333251953125f, 100.0f};
    uint64_t ne8[1] = {8};
    w_tensor(&w, "f16", 1, ne8, G_F16, h, sizeof h);
    /* BF16: 1, -3, 3.140625, 0, largest finite */
    uint16_t bf[5] = {0x3F80, 0xC040, 0x4049, 0x0000, 0x7F7F};
    float bf_want[5] = {1.0f, -3.0f, 3.140625f, 0.0f, 3.3895313892515355e38f};
    uint64_t ne5[1] = {5};
    w_tensor(&w, "bf16", 1, ne5, G_BF16, bf, sizeof bf);
    /* Q8_0, two blocks: d = 0.5 then d = 1365/4096; q = 8j - 128 then 127 - j */
    unsigned char q8[2 * 34];
    q8[0] = 0x00; q8[1] = 0x38;
    q8[34] = 0x55; q8[35] = 0x35;
    for (int j = 0; j < 32; j++) {
        q8[2 + j] = (unsigned char)(int8_t)(8 * j - 128);
        q8[36 + j] = (unsigned char)(int8_t)(127 - j);
    }
    uint64_t ne_q8[2] = {32, 2};
    w_tensor(&w, "q8_0", 2, ne_q8, G_Q8_0, q8, sizeof q8);
    /* Q4_0, two blocks: d = 0.25, low nibble j, high nibble 15 - j; then
     * d = -2, low nibble 15, high nibble 0 */
    unsigned char q40[2 * 18];
    q40[0] = 0x00; q40[1] = 0x34;
    q40[18] = 0x00; q40[19] = 0xC0;
    for (int j = 0; j < 16; j++) {
        q40[2 + j] = (unsigned char)(j | (15 - j) << 4);
        q40[20 + j] = 0x0F;
    }
    uint64_t ne64[1] = {64};
    w_tensor(&w, "q4_0", 1, ne64, G_Q4_0, q40, sizeof q40);
    /* Q4_1, two blocks: d = 2, m = -1.5, low nibble j, high nibble j ^ 5;
     * then d = 0.125, m = 100, nibbles 15 */
    unsigned char q41[2 * 20];
    q41[0] = 0x00; q41[1] = 0x40; q41[2] = 0x00; q41[3] = 0xBE;
    q41[20] = 0x00; q41[21] = 0x30; q41[22] = 0x40; q41[23] = 0x56;
    for (int j = 0; j < 16; j++) {
        q41[4 + j] = (unsigned char)(j | (j ^ 5) << 4);
        q41[24 + j] = 0xFF;
    }
    w_tensor(&w, "q4_1", 1, ne64, G_Q4_1, q41, sizeof q41);
    float f32[3] = {-1.25f, 3e-30f, 7.0f};
    w_tensor_f32(&w, "f32", 3, 0, f32);
    const char *path = tmp_file("types.gguf");
    w_write(&w, path);
    w_free(&w);

    mkv_gguf *g;
    mkv_error err;
    ck_assert_msg(mkv_gguf_open(path, &g, &err) == MKV_OK, "%s", err.msg);
    float out[64];
    const mkv_gguf_tensor *t = mkv_gguf_find_tensor(g, "f16");
    ck_assert_int_eq(mkv_gguf_dequantize(g, t, out, &err), MKV_OK);
    for (int j = 0; j < 8; j++)
        ck_assert_msg(out[j] == h_want[j] && signbit(out[j]) == signbit(h_want[j]),
                      "f16[%d] = %.9g, want %.9g", j, (double)out[j], (double)h_want[j]);
    t = mkv_gguf_find_tensor(g, "bf16");
    ck_assert_int_eq(mkv_gguf_dequantize(g, t, out, &err), MKV_OK);
    for (int j = 0; j < 5; j++)
        ck_assert_msg(out[j] == bf_want[j], "bf16[%d] = %.9g", j, (double)out[j]);
    t = mkv_gguf_find_tensor(g, "q8_0");
    ck_assert_uint_eq(t->n_elements, 64);
    ck_assert_uint_eq(t->nbytes, 68);
    ck_assert_int_eq(mkv_gguf_dequantize(g, t, out, &err), MKV_OK);
    for (int j = 0; j < 32; j++) {
        ck_assert(out[j] == 0.5f * (float)(8 * j - 128));
        ck_assert(out[32 + j] == (float)(127 - j) * 0.333251953125f);
    }
    ck_assert(out[0] == -64.0f && out[31] == 60.0f && out[32] == 127.0f * 0.333251953125f);
    t = mkv_gguf_find_tensor(g, "q4_0");
    ck_assert_uint_eq(t->nbytes, 36);
    ck_assert_int_eq(mkv_gguf_dequantize(g, t, out, &err), MKV_OK);
    for (int j = 0; j < 16; j++) {
        ck_assert(out[j] == 0.25f * (float)(j - 8));
        ck_assert(out[16 + j] == 0.25f * (float)(7 - j));
        ck_assert(out[32 + j] == -14.0f);  /* (15 - 8) * -2 */
        ck_assert(out[48 + j] == 16.0f);   /* (0 - 8) * -2 */
    }
    ck_assert(out[0] == -2.0f && out[15] == 1.75f && out[16] == 1.75f && out[31] == -2.0f);
    t = mkv_gguf_find_tensor(g, "q4_1");
    ck_assert_uint_eq(t->nbytes, 40);
    ck_assert_int_eq(mkv_gguf_dequantize(g, t, out, &err), MKV_OK);
    for (int j = 0; j < 16; j++) {
        ck_assert(out[j] == 2.0f * (float)j - 1.5f);
        ck_assert(out[16 + j] == 2.0f * (float)(j ^ 5) - 1.5f);
        ck_assert(out[32 + j] == 101.875f && out[48 + j] == 101.875f); /* 15/8 + 100 */
    }
    ck_assert(out[0] == -1.5f && out[16] == 8.5f);
    t = mkv_gguf_find_tensor(g, "f32");
    ck_assert_int_eq(mkv_gguf_dequantize(g, t, out, &err), MKV_OK);
    ck_assert(out[0] == -1.25f && out[1] == 3e-30f && out[2] == 7.0f);
    mkv_gguf_close(g);

    /* The raw entry point: whole blocks only, supported types only. */
    ck_assert_int_eq(mkv_ggml_dequantize(G_Q8_0, q8, out, 16, &err), MKV_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "whole number"));
    ck_assert_int_eq(mkv_ggml_dequantize(G_Q4_K, q8, out, 256, &err), MKV_EUNSUP);
    ck_assert_ptr_nonnull(strstr(err.msg, "Q4_K"));
    ck_assert_str_eq(mkv_ggml_type_name(G_Q4_K), "Q4_K");
    ck_assert_ptr_null(mkv_ggml_type_name(4)); /* retired id */
    ck_assert_uint_eq(mkv_ggml_type_size(G_Q4_K), 144);
    ck_assert_uint_eq(mkv_ggml_block_size(G_Q4_K), 256);
}
END_TEST

/* The vector dequantization (AVX2 where the CPU has it) against the
 * portable loops on random blocks: every byte pattern of the quants and
 * every finite fp16 scale and minimum (subnormals included) give the same
 * floats, bit for bit, at lengths with and without a tail of blocks. */
START_TEST(test_dequantize_vector_equals_scalar)
{
    static const uint32_t types[] = {MKV_GGML_Q8_0, MKV_GGML_Q4_0, MKV_GGML_Q4_1};
    const uint64_t blocks = 517;
    uint64_t seed = 7;
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        uint32_t size = mkv_ggml_type_size(types[t]);
        unsigned char *src = malloc(blocks * size);
        float *fast = malloc(blocks * 32 * sizeof(float)), *slow = malloc(blocks * 32 * sizeof(float));
        ck_assert(src && fast && slow);
        for (uint64_t i = 0; i < blocks * size; i++)
            src[i] = (unsigned char)test_rand64(&seed);
        for (uint64_t b = 0; b < blocks; b++)
            for (int h = 0; h < (types[t] == MKV_GGML_Q4_1 ? 2 : 1); h++) {
                unsigned char *half = src + b * size + 2 * h;
                if ((half[1] & 0x7C) == 0x7C) /* exponent 31: inf or NaN */
                    half[1] ^= 0x40;
            }
        const uint64_t lengths[] = {blocks * 32, 32, 7 * 32, 300 * 32};
        for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
            uint64_t n = lengths[li];
            mkv_error err;
            ck_assert_int_eq(mkv_ggml_dequantize(types[t], src, fast, n, &err), MKV_OK);
            ck_assert_int_eq(mkv_ggml_dequantize_scalar(types[t], src, slow, n, &err), MKV_OK);
            ck_assert_msg(memcmp(fast, slow, n * sizeof(float)) == 0, "%s, %llu elements",
                          mkv_ggml_type_name(types[t]), (unsigned long long)n);
        }
        free(src);
        free(fast);
        free(slow);
    }
}
END_TEST

/* Rows of blocks dotted with x (the decode step's matrix-vector products,
 * AVX2 where the CPU has it, and the portable path) against the dot
 * products in double of the dequantized floats: within float32 rounding
 * of the sum of |w x|.  Scales and minimums are drawn from a range that
 * matters (random halves would make most rows overflow or vanish), x has
 * both signs, and the rows are long enough for rounding to show. */
START_TEST(test_dot_rows_equal_double)
{
    static const uint32_t types[] = {MKV_GGML_Q8_0, MKV_GGML_Q4_0, MKV_GGML_Q4_1};
    const size_t cols = 1536, rows = 37;
    uint64_t seed = 11;
    float *x = malloc(cols * sizeof(float)), *scratch = malloc(cols / 4 * sizeof(float));
    float *w = malloc(cols * sizeof(float)), *fast = malloc(rows * sizeof(float)), *slow = malloc(rows * sizeof(float));
    ck_assert(x && scratch && w && fast && slow);
    for (size_t k = 0; k < cols; k++)
        x[k] = (float)(test_uniform(&seed) * 4.0 - 2.0);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        ck_assert(mkv_ggml_can_dot(types[t]));
        uint32_t size = mkv_ggml_type_size(types[t]);
        size_t row_bytes = cols / 32 * size;
        unsigned char *src = malloc(rows * row_bytes);
        ck_assert(src);
        for (size_t i = 0; i < rows * row_bytes; i++)
            src[i] = (unsigned char)test_rand64(&seed);
        for (size_t b = 0; b < rows * cols / 32; b++) {
            unsigned char *blk = src + b * size;
            uint16_t d = mkv_f32_to_f16((float)(test_uniform(&seed) * 0.02));
            uint16_t m = mkv_f32_to_f16((float)(test_uniform(&seed) * 0.2 - 0.1));
            blk[0] = (unsigned char)d;
            blk[1] = (unsigned char)(d >> 8);
            if (types[t] == MKV_GGML_Q4_1) {
                blk[2] = (unsigned char)m;
                blk[3] = (unsigned char)(m >> 8);
            }
        }
        mkv_ggml_dot_rows(types[t], src, row_bytes, cols, rows, x, scratch, fast);
        mkv_ggml_dot_rows_scalar(types[t], src, row_bytes, cols, rows, x, slow);
        for (size_t r = 0; r < rows; r++) {
            mkv_error err;
            ck_assert_int_eq(mkv_ggml_dequantize_scalar(types[t], src + r * row_bytes, w, cols, &err), MKV_OK);
            double want = 0.0, mag = 0.0;
            for (size_t k = 0; k < cols; k++) {
                want += (double)w[k] * x[k];
                mag += fabs((double)w[k] * x[k]);
            }
            ck_assert_msg(fabs(fast[r] - want) <= 1e-5 * mag, "%s row %zu: %.9g, double %.9g (sum |wx| %g)",
                          mkv_ggml_type_name(types[t]), r, fast[r], want, mag);
            ck_assert_msg(fabs(slow[r] - want) <= 1e-6 * mag, "%s row %zu, portable: %.9g, double %.9g",
                          mkv_ggml_type_name(types[t]), r, slow[r], want);
        }
        free(src);
    }
    ck_assert(!mkv_ggml_can_dot(MKV_GGML_F16) && !mkv_ggml_can_dot(MKV_GGML_F32));
    free(x);
    free(scratch);
    free(w);
    free(fast);
    free(slow);
}
END_TEST

START_TEST(test_unsupported_type_named)
{
    gguf_w w;
    w_init(&w);
    unsigned char block[144] = {0};
    uint64_t ne[1] = {256};
    w_tensor(&w, "blk.0.attn_q.weight", 1, ne, G_Q4_K, block, sizeof block);
    const char *path = tmp_file("q4k.gguf");
    w_write(&w, path);
    w_free(&w);
    mkv_gguf *g;
    mkv_error err;
    ck_assert_msg(mkv_gguf_open(path, &g, &err) == MKV_OK, "%s", err.msg);
    float out[256];
    ck_assert_int_eq(mkv_gguf_dequantize(g, mkv_gguf_find_tensor(g, "blk.0.attn_q.weight"), out, &err),
                     MKV_EUNSUP);
    ck_assert_ptr_nonnull(strstr(err.msg, "'blk.0.attn_q.weight' has type Q4_K"));
    mkv_gguf_close(g);
}
END_TEST

/* A released tensor (its pages dropped from the mapping) still reads
 * back as written, bytes and floats: tensors of several pages, one inside
 * a page, and one released twice. */
START_TEST(test_release_keeps_contents)
{
    enum { BIG = 5000, SMALL = 20 };
    float *big = malloc(BIG * 4 * sizeof(float)), small[SMALL], *back = malloc(BIG * 4 * sizeof(float));
    ck_assert(big && back);
    uint64_t seed = 3;
    for (int i = 0; i < BIG * 4; i++)
        big[i] = (float)(test_uniform(&seed) - 0.5);
    for (int i = 0; i < SMALL; i++)
        small[i] = (float)i;
    gguf_w w;
    w_init(&w);
    w_tensor_f32(&w, "small", SMALL, 1, small);
    w_tensor_f32(&w, "big", BIG, 4, big);
    const char *path = tmp_file("release.gguf");
    w_write(&w, path);
    w_free(&w);
    mkv_gguf *g;
    mkv_error err;
    ck_assert_msg(mkv_gguf_open(path, &g, &err) == MKV_OK, "%s", err.msg);
    const mkv_gguf_tensor *tb = mkv_gguf_find_tensor(g, "big"), *ts = mkv_gguf_find_tensor(g, "small");
    ck_assert(tb && ts);
    for (int round = 0; round < 2; round++) {
        mkv_gguf_release(g, tb);
        mkv_gguf_release(g, ts);
        ck_assert(memcmp(tb->data, big, sizeof(float) * BIG * 4) == 0);
        ck_assert(memcmp(ts->data, small, sizeof small) == 0);
        ck_assert_int_eq(mkv_gguf_dequantize(g, tb, back, &err), MKV_OK);
        ck_assert(memcmp(back, big, sizeof(float) * BIG * 4) == 0);
    }
    mkv_gguf_close(g);
    free(big);
    free(back);
}
END_TEST

/* ------------------------------------------------------------ corrupt files */

/* A small valid file whose last tensor ends at the end of the file. */
static void small_valid(buf *out)
{
    gguf_w w;
    w_init(&w);
    kv_str(&w, "general.architecture", "llama");
    int32_t v[3] = {1, 2, 3};
    kv_arr_i32(&w, "a.ints", v, 3);
    const char *s[2] = {"one", "two"};
    kv_arr_str(&w, "a.strs", s, 2);
    float x[40];
    for (int i = 0; i < 40; i++)
        x[i] = (float)i;
    w_tensor_f32(&w, "first", 8, 0, x);
    w_tensor_f32(&w, "second", 8, 4, x);
    w_build(&w, out);
    w_free(&w);
}

START_TEST(test_truncated_everywhere)
{
    buf whole;
    small_valid(&whole);
    const char *path = tmp_file("trunc.gguf");
    write_bytes(path, whole.p, whole.n);
    mkv_gguf *g;
    mkv_error err;
    ck_assert_msg(mkv_gguf_open(path, &g, &err) == MKV_OK, "%s", err.msg);
    mkv_gguf_close(g);
    for (size_t n = 0; n < whole.n; n++) {
        write_bytes(path, whole.p, n);
        int rc = mkv_gguf_open(path, &g, &err);
        ck_assert_msg(rc == MKV_EFORMAT, "a file cut to %zu of %zu bytes opened (rc %d)", n, whole.n, rc);
        ck_assert_msg(strstr(err.msg, path) != NULL, "message without the file name: %s", err.msg);
        int clear = strstr(err.msg, "truncated") || strstr(err.msg, "too short") ||
                    strstr(err.msg, "past the end") || strstr(err.msg, "cannot fit");
        ck_assert_msg(clear, "cut to %zu bytes: unclear message \"%s\"", n, err.msg);
    }
    free(whole.p);
}
END_TEST

/* Random damage to a valid file: each result opens or fails with a
 * message, and whatever opens can be read completely (the sanitizer build
 * checks that nothing is read out of bounds). */
START_TEST(test_random_corruption)
{
    buf whole;
    small_valid(&whole);
    const char *path = tmp_file("fuzz.gguf");
    unsigned char *copy = malloc(whole.n);
    uint64_t seed = 7;
    int opened = 0;
    for (int round = 0; round < 3000; round++) {
        memcpy(copy, whole.p, whole.n);
        int hits = 1 + (int)(test_rand64(&seed) % 4);
        for (int h = 0; h < hits; h++) {
            size_t at = (size_t)(test_rand64(&seed) % whole.n);
            uint64_t r = test_rand64(&seed);
            /* small integers, all-ones and random bytes are the dangerous values */
            copy[at] = (unsigned char)(r % 3 == 0 ? r >> 8 : r % 3 == 1 ? 0xFF : (r >> 8) % 4);
        }
        write_bytes(path, copy, whole.n);
        mkv_gguf *g;
        mkv_error err;
        if (mkv_gguf_open(path, &g, &err) != MKV_OK) {
            ck_assert_msg(err.msg[0] != '\0', "round %d: empty message", round);
            continue;
        }
        opened++;
        for (uint64_t i = 0; i < mkv_gguf_n_kv(g); i++)
            ck_assert_ptr_nonnull(mkv_gguf_kv_value(g, i));
        for (uint64_t i = 0; i < mkv_gguf_n_tensors(g); i++) {
            const mkv_gguf_tensor *t = mkv_gguf_tensor_at(g, i);
            if (!mkv_ggml_can_dequantize(t->type) || t->n_elements > 4096)
                continue;
            float *out = malloc((size_t)t->n_elements * sizeof(float) + 1);
            mkv_gguf_dequantize(g, t, out, &err);
            free(out);
        }
        mkv_gguf_close(g);
    }
    ck_assert_int_gt(opened, 0);
    free(copy);
    free(whole.p);
}
END_TEST

static void put_u32_at(buf *b, size_t at, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        b->p[at + i] = (unsigned char)(v >> (8 * i));
}

static void put_u64_at(buf *b, size_t at, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        b->p[at + i] = (unsigned char)(v >> (8 * i));
}

START_TEST(test_corrupt_headers)
{
    const char *path = tmp_file("bad.gguf");
    buf b;
    /* header fields: magic 0..3, version 4..7, n_tensors 8..15, n_kv 16..23;
     * the first key's length is at 24 */
    small_valid(&b);
    memcpy(b.p, "GGUX", 4);
    write_bytes(path, b.p, b.n);
    expect_open_error(path, "not a GGUF file");
    free(b.p);

    small_valid(&b);
    put_u32_at(&b, 4, 1);
    write_bytes(path, b.p, b.n);
    expect_open_error(path, "GGUF version 1 is not supported");
    put_u32_at(&b, 4, 0x03000000u);
    write_bytes(path, b.p, b.n);
    expect_open_error(path, "big-endian");
    put_u32_at(&b, 4, 3);
    put_u64_at(&b, 16, 1ULL << 60);
    write_bytes(path, b.p, b.n);
    expect_open_error(path, "metadata entries cannot fit");
    put_u64_at(&b, 16, 3);
    put_u64_at(&b, 8, UINT64_MAX);
    write_bytes(path, b.p, b.n);
    expect_open_error(path, "tensors cannot fit");
    put_u64_at(&b, 8, 2);
    put_u64_at(&b, 24, 1ULL << 62);
    write_bytes(path, b.p, b.n);
    expect_open_error(path, "exceeds the limit");
    put_u64_at(&b, 24, 0);
    write_bytes(path, b.p, b.n);
    expect_open_error(path, "empty");
    free(b.p);
    write_bytes(path, "", 0);
    expect_open_error(path, "too short");
    expect_open_error(tmp_file("does-not-exist.gguf"), "cannot open");
}
END_TEST

/* One corrupt case: what the builder writes, and the expected message. */
typedef struct {
    const char *want;
    void (*build)(gguf_w *w);
} corrupt_case;

static void c_huge_string(gguf_w *w) { w_key(w, "k", T_STR); b_u64(&w->kv, 1ULL << 50); b_put(&w->kv, "ab", 2); }
static void c_huge_array(gguf_w *w) { w_key(w, "k", T_ARR); b_u32(&w->kv, T_U32); b_u64(&w->kv, 1ULL << 61); }
static void c_huge_str_array(gguf_w *w) { w_key(w, "k", T_ARR); b_u32(&w->kv, T_STR); b_u64(&w->kv, UINT64_MAX); }
static void c_bad_type(gguf_w *w) { w_key(w, "k", 13); b_u32(&w->kv, 0); }
static void c_bad_elem(gguf_w *w) { w_key(w, "k", T_ARR); b_u32(&w->kv, 42); b_u64(&w->kv, 1); }
static void c_bad_bool(gguf_w *w) { w_key(w, "k", T_BOOL); b_u8(&w->kv, 2); }
static void c_dup_key(gguf_w *w) { kv_u32(w, "k", 1); kv_u32(w, "k", 2); }
static void c_deep(gguf_w *w)
{
    w_key(w, "k", T_ARR);
    for (int d = 0; d < 9; d++) {
        b_u32(&w->kv, T_ARR);
        b_u64(&w->kv, 1);
    }
    b_u32(&w->kv, T_U8);
    b_u64(&w->kv, 0);
}
static void c_alignment(gguf_w *w) { kv_u32(w, "general.alignment", 3); }
static void c_alignment_type(gguf_w *w) { kv_str(w, "general.alignment", "32"); }
static void c_dims(gguf_w *w)
{
    uint64_t ne[5] = {1, 1, 1, 1, 1};
    w_info(w, "t", 5, ne, G_F32, 0);
}
static void c_unknown_tensor_type(gguf_w *w)
{
    uint64_t ne[1] = {4};
    w_info(w, "t", 1, ne, 99, 0);
    b_put(&w->data, "0123456789abcdef", 16);
}
static void c_past_end(gguf_w *w)
{
    uint64_t ne[1] = {4};
    w_info(w, "t", 1, ne, G_F32, 32);
    b_put(&w->data, "0123456789abcdef", 16);
}
static void c_offset_overflow(gguf_w *w)
{
    uint64_t ne[1] = {4};
    w_info(w, "t", 1, ne, G_F32, UINT64_MAX - 31);
    b_put(&w->data, "0123456789abcdef", 16);
}
static void c_misaligned(gguf_w *w)
{
    uint64_t ne[1] = {2};
    w_info(w, "t", 1, ne, G_F32, 4);
    b_put(&w->data, "0123456789abcdef", 16);
}
static void c_partial_block(gguf_w *w)
{
    uint64_t ne[1] = {16};
    w_info(w, "t", 1, ne, G_Q8_0, 0);
    b_put(&w->data, "0123456789abcdef0123456789abcdef0123", 36);
}
static void c_overlap(gguf_w *w)
{
    uint64_t ne[1] = {16};
    w_info(w, "a", 1, ne, G_F32, 0);
    w_info(w, "b", 1, ne, G_F32, 32);
    float x[24] = {0};
    b_put(&w->data, x, sizeof x);
}
static void c_dup_tensor(gguf_w *w)
{
    uint64_t ne[1] = {4};
    float x[4] = {0};
    w_tensor(w, "a", 1, ne, G_F32, x, sizeof x);
    w_tensor(w, "a", 1, ne, G_F32, x, sizeof x);
}
static void c_count_overflow(gguf_w *w)
{
    uint64_t ne[3] = {1ULL << 32, 1ULL << 32, 1ULL << 32};
    w_info(w, "t", 3, ne, G_F32, 0);
}
static void c_empty_name(gguf_w *w)
{
    uint64_t ne[1] = {1};
    w_info(w, "", 1, ne, G_F32, 0);
    b_put(&w->data, "abcd", 4);
}

START_TEST(test_corrupt_structures)
{
    static const corrupt_case cases[] = {
        {"truncated", c_huge_string},
        {"cannot fit", c_huge_array},
        {"cannot fit", c_huge_str_array},
        {"unknown value type 13", c_bad_type},
        {"array of unknown value type 42", c_bad_elem},
        {"neither 0 nor 1", c_bad_bool},
        {"'k' appears twice", c_dup_key},
        {"nested deeper than 8", c_deep},
        {"power of two", c_alignment},
        {"power of two", c_alignment_type},
        {"5 dimensions", c_dims},
        {"unknown type id 99", c_unknown_tensor_type},
        {"run past the end", c_past_end},
        {"run past the end", c_offset_overflow},
        {"not a multiple of the alignment", c_misaligned},
        {"not a whole number of 32-element blocks", c_partial_block},
        {"overlap", c_overlap},
        {"'a' appears twice", c_dup_tensor},
        {"element count overflows", c_count_overflow},
        {"empty", c_empty_name},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gguf_w w;
        w_init(&w);
        cases[i].build(&w);
        const char *path = tmp_file("corrupt.gguf");
        w_write(&w, path);
        w_free(&w);
        expect_open_error(path, cases[i].want);
    }
}
END_TEST

/* ------------------------------------------------------------ llama models */

/* Small model: head_dim 16 with dim 64 and 4 heads, GQA 2, untied, rows a
 * multiple of 32 so that matrices can be written quantized. */
static mkv_model *tiny_model(int with_bias, int tied)
{
    mkv_model_config c;
    mkv_model_config_defaults(&c);
    snprintf(c.name, sizeof c.name, "tiny");
    c.dim = 64;
    c.hidden_dim = 96;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 16;
    c.rope_dim = 16;
    c.vocab_size = 40;
    c.max_seq_len = 32;
    c.rope_theta = 500000.0;
    c.rms_eps = 1e-6f;
    c.tied_classifier = tied;
    c.has_qkv_bias = with_bias;
    mkv_model *m;
    mkv_error err;
    ck_assert_msg(mkv_model_create(&c, &m, &err) == MKV_OK, "%s", err.msg);
    uint64_t seed = 42;
    test_fill(m->storage, m->storage_floats, &seed, 0.0, 0.5);
    return m;
}

typedef struct {
    const char *arch;
    const char *skip_key;
    const char *skip_tensor;
    const char *swap_tensor;   /* written with ne[0] and ne[1] exchanged */
    const char *nan_tensor;    /* element 3 is NaN */
    const char *q8_tensor;     /* Q8_0 blocks: d = 1/16, q = pattern_q8 */
    const char *q41_tensor;    /* Q4_1 blocks: d = 1/8, m = -1, q = pattern_q4 */
    const char *q4k_tensor;    /* written as (zeroed) Q4_K */
    void (*extra)(gguf_w *w);
    const char *vocab;         /* add this llama2.c tokenizer as a "llama" vocabulary */
    const float *rope_freqs;   /* rope_dim/2 values written as rope_freqs.weight */
} llama_opts;

static int8_t pattern_q8(uint64_t i) { return (int8_t)((i * 37 + 11) % 256 - 128); }
static unsigned pattern_q4(uint64_t i) { return (unsigned)((i * 5 + i / 32) % 16); }

static void w_matrix(gguf_w *w, const llama_opts *o, const char *name, uint64_t ne0, uint64_t ne1,
                     float *x)
{
    uint64_t n = ne0 * (ne1 ? ne1 : 1);
    uint64_t ne[2] = {ne0, ne1};
    uint32_t dims = ne1 ? 2 : 1;
    if (o->skip_tensor && strcmp(name, o->skip_tensor) == 0)
        return;
    if (o->swap_tensor && strcmp(name, o->swap_tensor) == 0) {
        ne[0] = ne1;
        ne[1] = ne0;
    }
    if (o->nan_tensor && strcmp(name, o->nan_tensor) == 0)
        x[3] = NAN;
    if (o->q8_tensor && strcmp(name, o->q8_tensor) == 0) {
        unsigned char *q = malloc(n / 32 * 34);
        for (uint64_t b = 0; b < n / 32; b++) {
            q[34 * b] = 0x00;
            q[34 * b + 1] = 0x2C; /* 0.0625 */
            for (int j = 0; j < 32; j++)
                q[34 * b + 2 + j] = (unsigned char)pattern_q8(32 * b + j);
        }
        w_tensor(w, name, dims, ne, G_Q8_0, q, n / 32 * 34);
        free(q);
        return;
    }
    if (o->q41_tensor && strcmp(name, o->q41_tensor) == 0) {
        unsigned char *q = malloc(n / 32 * 20);
        for (uint64_t b = 0; b < n / 32; b++) {
            unsigned char *p = q + 20 * b;
            p[0] = 0x00; p[1] = 0x30;  /* d = 0.125 */
            p[2] = 0x00; p[3] = 0xBC;  /* m = -1 */
            for (int j = 0; j < 16; j++)
                p[4 + j] = (unsigned char)(pattern_q4(32 * b + j) | pattern_q4(32 * b + 16 + j) << 4);
        }
        w_tensor(w, name, dims, ne, G_Q4_1, q, n / 32 * 20);
        free(q);
        return;
    }
    if (o->q4k_tensor && strcmp(name, o->q4k_tensor) == 0) {
        unsigned char *q = calloc(n / 256 + 1, 144);
        ne[0] = 256;
        ne[1] = 0;
        w_tensor(w, name, 1, ne, G_Q4_K, q, 144);
        free(q);
        return;
    }
    w_tensor(w, name, dims, ne, G_F32, x, (size_t)n * sizeof(float));
}

static void w_meta_u32(gguf_w *w, const llama_opts *o, const char *arch, const char *suffix,
                       uint32_t v)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (!o->skip_key || strcmp(key, o->skip_key) != 0)
        kv_u32(w, key, v);
}

static int32_t get_i32(const unsigned char *p)
{
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

/* A llama2.c tokenizer (tok512.bin's layout) of n pieces as GGUF "llama"
 * vocabulary: pieces with spaces spelled U+2581 (as sentencepiece writes
 * them), scores, token types. */
static void w_llama2c_vocab(gguf_w *w, const char *path, int n)
{
    FILE *fp = fopen(path, "rb");
    ck_assert_ptr_nonnull(fp);
    unsigned char data[1 << 15];
    size_t size = fread(data, 1, sizeof data, fp);
    ck_assert(feof(fp));
    fclose(fp);
    char **pieces = calloc((size_t)n, sizeof *pieces);
    float *scores = calloc((size_t)n, sizeof *scores);
    int32_t *types = calloc((size_t)n, sizeof *types);
    ck_assert(pieces && scores && types);
    size_t at = 4;
    for (int id = 0; id < n; id++) {
        ck_assert(at + 8 <= size);
        float score;
        memcpy(&score, data + at, 4);
        int32_t len = get_i32(data + at + 4);
        ck_assert(len >= 0 && at + 8 + (size_t)len <= size);
        char *p = malloc(3 * (size_t)len + 1), *q = p;
        for (int32_t k = 0; k < len; k++) {
            char ch = (char)data[at + 8 + k];
            if (ch == ' ') {
                memcpy(q, "\xE2\x96\x81", 3);
                q += 3;
            } else {
                *q++ = ch;
            }
        }
        *q = '\0';
        pieces[id] = p;
        scores[id] = score;
        types[id] = id == 0 ? 2 : id <= 2 ? 3 : (len == 6 && memcmp(p, "<0x", 3) == 0) ? 6 : 1;
        at += 8 + (size_t)len;
    }
    ck_assert_uint_eq(at, size);
    kv_str(w, "tokenizer.ggml.model", "llama");
    kv_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)pieces, (size_t)n);
    kv_arr_f32(w, "tokenizer.ggml.scores", scores, (size_t)n);
    kv_arr_i32(w, "tokenizer.ggml.token_type", types, (size_t)n);
    kv_u32(w, "tokenizer.ggml.bos_token_id", 1);
    kv_u32(w, "tokenizer.ggml.eos_token_id", 2);
    kv_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    for (int id = 0; id < n; id++)
        free(pieces[id]);
    free(pieces);
    free(scores);
    free(types);
}

/* m as a GGUF "llama" model, tensors in llama.cpp's names with ne reversed
 * from mkv_model's [out x in]. */
static void write_llama_gguf(const char *path, const mkv_model *m, const llama_opts *o)
{
    const mkv_model_config *c = &m->cfg;
    const char *arch = o->arch ? o->arch : "llama";
    gguf_w w;
    w_init(&w);
    kv_str(&w, "general.architecture", arch);
    kv_str(&w, "general.name", c->name);
    w_meta_u32(&w, o, arch, "context_length", (uint32_t)c->max_seq_len);
    w_meta_u32(&w, o, arch, "embedding_length", (uint32_t)c->dim);
    w_meta_u32(&w, o, arch, "feed_forward_length", (uint32_t)c->hidden_dim);
    w_meta_u32(&w, o, arch, "block_count", (uint32_t)c->n_layers);
    w_meta_u32(&w, o, arch, "attention.head_count", (uint32_t)c->n_heads);
    w_meta_u32(&w, o, arch, "attention.head_count_kv", (uint32_t)c->n_kv_heads);
    w_meta_u32(&w, o, arch, "rope.dimension_count", (uint32_t)c->rope_dim);
    w_meta_u32(&w, o, arch, "vocab_size", (uint32_t)c->vocab_size);
    if (c->head_dim * c->n_heads != c->dim) {
        w_meta_u32(&w, o, arch, "attention.key_length", (uint32_t)c->head_dim);
        w_meta_u32(&w, o, arch, "attention.value_length", (uint32_t)c->head_dim);
    }
    char key[128];
    snprintf(key, sizeof key, "%s.rope.freq_base", arch);
    kv_f32(&w, key, (float)c->rope_theta);
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    kv_f32(&w, key, c->rms_eps);
    if (o->vocab) {
        w_llama2c_vocab(&w, o->vocab, c->vocab_size);
    } else {
        kv_u32(&w, "tokenizer.ggml.bos_token_id", (uint32_t)c->bos_id);
        kv_u32(&w, "tokenizer.ggml.eos_token_id", (uint32_t)c->eos_id);
    }
    if (o->extra)
        o->extra(&w);
    if (o->rope_freqs)
        w_tensor_f32(&w, "rope_freqs.weight", (uint64_t)c->rope_dim / 2, 0, o->rope_freqs);
    uint64_t dim = (uint64_t)c->dim, hid = (uint64_t)c->hidden_dim, vocab = (uint64_t)c->vocab_size;
    uint64_t qd = (uint64_t)c->n_heads * c->head_dim, kvd = (uint64_t)c->n_kv_heads * c->head_dim;
    size_t embed = (size_t)(vocab * dim);
    float *scratch = malloc(m->storage_floats * sizeof(float)); /* room for any one tensor */
    /* w_matrix may poke a NaN in: write copies. */
#define COPY(src, n) (memcpy(scratch, (src), (size_t)(n) * sizeof(float)), scratch)
    w_matrix(&w, o, "token_embd.weight", dim, vocab, COPY(m->tok_embedding, embed));
    for (int l = 0; l < c->n_layers; l++) {
        const mkv_layer_weights *lw = &m->layers[l];
        char name[64];
#define LAYER(suffix, src, ne0, ne1)                                   \
        snprintf(name, sizeof name, "blk.%d.%s", l, suffix);          \
        w_matrix(&w, o, name, ne0, ne1, COPY(src, (ne0) * ((ne1) ? (ne1) : 1)))
        LAYER("attn_norm.weight", lw->rms_att, dim, 0);
        LAYER("attn_q.weight", lw->wq, dim, qd);
        LAYER("attn_k.weight", lw->wk, dim, kvd);
        LAYER("attn_v.weight", lw->wv, dim, kvd);
        LAYER("attn_output.weight", lw->wo, qd, dim);
        if (c->has_qkv_bias) {
            LAYER("attn_q.bias", lw->bq, qd, 0);
            LAYER("attn_k.bias", lw->bk, kvd, 0);
            LAYER("attn_v.bias", lw->bv, kvd, 0);
        }
        LAYER("ffn_norm.weight", lw->rms_ffn, dim, 0);
        LAYER("ffn_gate.weight", lw->w1, dim, hid);
        LAYER("ffn_down.weight", lw->w2, hid, dim);
        LAYER("ffn_up.weight", lw->w3, dim, hid);
#undef LAYER
    }
    w_matrix(&w, o, "output_norm.weight", dim, 0, COPY(m->rms_final, dim));
    if (!c->tied_classifier)
        w_matrix(&w, o, "output.weight", dim, vocab, COPY(m->classifier, embed));
#undef COPY
    free(scratch);
    w_write(&w, path);
    w_free(&w);
}

static void assert_same_floats(const float *a, const float *b, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(a[i] == b[i], "%s[%zu]: %.9g != %.9g", what, i, (double)a[i], (double)b[i]);
}

static void assert_same_model(const mkv_model *a, const mkv_model *b)
{
    const mkv_model_config *c = &a->cfg, *d = &b->cfg;
    ck_assert_int_eq(c->dim, d->dim);
    ck_assert_int_eq(c->hidden_dim, d->hidden_dim);
    ck_assert_int_eq(c->n_layers, d->n_layers);
    ck_assert_int_eq(c->n_heads, d->n_heads);
    ck_assert_int_eq(c->n_kv_heads, d->n_kv_heads);
    ck_assert_int_eq(c->head_dim, d->head_dim);
    ck_assert_int_eq(c->rope_dim, d->rope_dim);
    ck_assert_int_eq(c->vocab_size, d->vocab_size);
    ck_assert_int_eq(c->max_seq_len, d->max_seq_len);
    ck_assert(c->rope_theta == d->rope_theta);
    ck_assert(c->rms_eps == d->rms_eps);
    ck_assert_int_eq(c->rope_layout, d->rope_layout);
    ck_assert_int_eq(c->tied_classifier, d->tied_classifier);
    ck_assert_int_eq(c->has_qkv_bias, d->has_qkv_bias);
    ck_assert_int_eq(c->bos_id, d->bos_id);
    ck_assert_int_eq(c->eos_id, d->eos_id);
    ck_assert_uint_eq(a->storage_floats, b->storage_floats);
    /* Same configuration, same layout: the weights are one block. */
    assert_same_floats(a->storage, b->storage, a->storage_floats, "weights");
}

START_TEST(test_llama_round_trip)
{
    for (int variant = 0; variant < 3; variant++) {
        mkv_model *m = tiny_model(variant == 1, variant == 2);
        const char *path = tmp_file("tiny.gguf");
        llama_opts o = {0};
        write_llama_gguf(path, m, &o);
        static int sentinel;
        mkv_model *back;
        mkv_tokenizer *tok;
        mkv_gguf_extra x;
        mkv_error err;
        ck_assert_msg(mkv_gguf_load(path, 0, &back, NULL, &x, &err) == MKV_OK, "%s", err.msg);
        ck_assert_str_eq(back->cfg.name, "tiny");
        ck_assert_int_eq(back->cfg.rope_layout, MKV_ROPE_INTERLEAVED);
        ck_assert_ptr_null(x.chat_template);
        ck_assert_int_eq(x.add_bos, 1); /* no vocabulary: llama.cpp's default */
        assert_same_model(m, back);
        if (variant == 2)
            ck_assert_ptr_eq(back->classifier, back->tok_embedding);
        mkv_model_free(back);
        /* Asking for a vocabulary the file lacks is an error, and nothing leaks out. */
        back = (mkv_model *)&sentinel;
        tok = (mkv_tokenizer *)&sentinel;
        ck_assert_int_eq(mkv_gguf_load(path, 0, &back, &tok, NULL, &err), MKV_EFORMAT);
        ck_assert_ptr_null(back);
        ck_assert_ptr_null(tok);
        ck_assert_ptr_nonnull(strstr(err.msg, "has no vocabulary"));
        mkv_model_free(m);
    }
}
END_TEST

/* Quantized matrices land in the model with ne reversed: element (row r,
 * column c) of [out x in] is element r * in + c of the tensor. */
typedef struct {
    const float *w;
    const mkv_qmatrix *q;
    size_t rows, cols;
} matrix_pair;

/* Every matrix of `blocks` (kept in blocks) reads back, row by row, as the
 * float32 model `floats` holds it. */
static void assert_same_matrices(const mkv_model *floats, const mkv_model *blocks)
{
    const mkv_model_config *c = &floats->cfg;
    size_t dim = (size_t)c->dim, hid = (size_t)c->hidden_dim;
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    float *row = malloc((hid > qd ? (hid > dim ? hid : dim) : (qd > dim ? qd : dim)) * sizeof(float));
    ck_assert_ptr_nonnull(row);
    matrix_pair *mats = malloc((2 + 7 * (size_t)c->n_layers) * sizeof *mats);
    ck_assert_ptr_nonnull(mats);
    size_t k = 0;
    mats[k++] = (matrix_pair){floats->tok_embedding, &blocks->qtok_embedding, (size_t)c->vocab_size, dim};
    mats[k++] = (matrix_pair){floats->classifier, &blocks->qclassifier, (size_t)c->vocab_size, dim};
    for (int l = 0; l < c->n_layers; l++) {
        const mkv_layer_weights *f = &floats->layers[l], *b = &blocks->layers[l];
        mats[k++] = (matrix_pair){f->wq, &b->qwq, qd, dim};
        mats[k++] = (matrix_pair){f->wk, &b->qwk, kvd, dim};
        mats[k++] = (matrix_pair){f->wv, &b->qwv, kvd, dim};
        mats[k++] = (matrix_pair){f->wo, &b->qwo, dim, qd};
        mats[k++] = (matrix_pair){f->w1, &b->qw1, hid, dim};
        mats[k++] = (matrix_pair){f->w2, &b->qw2, dim, hid};
        mats[k++] = (matrix_pair){f->w3, &b->qw3, hid, dim};
    }
    for (size_t i = 0; i < k; i++)
        for (size_t r = 0; r < mats[i].rows; r++) {
            mkv_matrix_rows(NULL, mats[i].q, mats[i].cols, r, 1, row);
            ck_assert_msg(memcmp(row, mats[i].w + r * mats[i].cols, mats[i].cols * sizeof(float)) == 0,
                          "matrix %zu row %zu", i, r);
        }
    free(mats);
    free(row);
}

/* The forward pass of both models, a prefill in chunks of 5 on two threads
 * and then single-token steps: the prefill's logits are identical (the
 * same floats through the same BLAS calls); a step's matrix-vector
 * products read the blocks directly (mkv_ggml_dot_rows), so its logits
 * agree within float32 rounding and pick the same token. */
static void assert_same_logits(const mkv_model *a, const mkv_model *b)
{
    const int n = 17, steps = 4, vocab = a->cfg.vocab_size;
    int32_t ids[17 + 4];
    for (int i = 0; i < n + steps; i++)
        ids[i] = (int32_t)((7 * i + 3) % vocab);
    mkv_forward_opts opts = {2, 5, n + steps};
    mkv_forward *fa, *fb;
    mkv_error err;
    ck_assert_msg(mkv_forward_create(a, &opts, &fa, &err) == MKV_OK, "%s", err.msg);
    ck_assert_msg(mkv_forward_create(b, &opts, &fb, &err) == MKV_OK, "%s", err.msg);
    float *la = malloc((size_t)n * vocab * sizeof(float)), *lb = malloc((size_t)n * vocab * sizeof(float));
    ck_assert(la && lb);
    ck_assert_int_eq(mkv_forward_run(fa, ids, n, la, MKV_LOGITS_ALL, &err), MKV_OK);
    ck_assert_int_eq(mkv_forward_run(fb, ids, n, lb, MKV_LOGITS_ALL, &err), MKV_OK);
    ck_assert(memcmp(la, lb, (size_t)n * vocab * sizeof(float)) == 0);
    for (int s = 0; s < steps; s++) {
        ck_assert_int_eq(mkv_forward_run(fa, ids + n + s, 1, la, MKV_LOGITS_LAST, &err), MKV_OK);
        ck_assert_int_eq(mkv_forward_run(fb, ids + n + s, 1, lb, MKV_LOGITS_LAST, &err), MKV_OK);
        double diff = 0.0, big = 0.0;
        for (int j = 0; j < vocab; j++) {
            diff = fmax(diff, fabs((double)la[j] - lb[j]));
            big = fmax(big, fabs((double)la[j]));
        }
        ck_assert_msg(diff <= 1e-4 * big, "step %d: logits differ by %g (largest %g)", s, diff, big);
        ck_assert_int_eq(mkv_argmax(la, vocab), mkv_argmax(lb, vocab));
    }
    free(la);
    free(lb);
    mkv_forward_free(fa);
    mkv_forward_free(fb);
}

START_TEST(test_llama_quantized_matrices)
{
    mkv_model *m = tiny_model(0, 0);
    const char *path = tmp_file("tinyq.gguf");
    llama_opts o = {0};
    o.q8_tensor = "blk.1.attn_k.weight";   /* ne [64, 32] */
    o.q41_tensor = "blk.0.ffn_down.weight"; /* ne [96, 64] */
    write_llama_gguf(path, m, &o);
    mkv_model *back;
    mkv_error err;
    ck_assert_msg(mkv_gguf_load(path, 0, &back, NULL, NULL, &err) == MKV_OK, "%s", err.msg);
    for (int r = 0; r < 32; r++)
        for (int c = 0; c < 64; c++)
            ck_assert(back->layers[1].wk[r * 64 + c] == (float)pattern_q8((uint64_t)(r * 64 + c)) * 0.0625f);
    for (int r = 0; r < 64; r++)
        for (int c = 0; c < 96; c++)
            ck_assert(back->layers[0].w2[r * 96 + c] ==
                      (float)pattern_q4((uint64_t)(r * 96 + c)) * 0.125f - 1.0f);
    /* everything else as written */
    assert_same_floats(m->layers[0].wk, back->layers[0].wk, 32 * 64, "wk");
    assert_same_floats(m->layers[1].w2, back->layers[1].w2, 64 * 96, "w2");
    assert_same_floats(m->classifier, back->classifier, 40 * 64, "classifier");

    /* Kept in blocks: the same rows, the same logits. */
    mkv_model *kept;
    ck_assert_msg(mkv_gguf_load(path, 1, &kept, NULL, NULL, &err) == MKV_OK, "%s", err.msg);
    ck_assert(mkv_model_has_blocks(kept) && !mkv_model_has_blocks(back));
    ck_assert_ptr_null(kept->layers[0].wq);
    ck_assert_ptr_null(kept->classifier);
    ck_assert_int_eq(kept->layers[1].qwk.type, MKV_GGML_Q8_0);
    ck_assert_int_eq(kept->layers[0].qw2.type, MKV_GGML_Q4_1);
    ck_assert_int_eq(kept->layers[0].qwq.type, MKV_GGML_F32);
    assert_same_matrices(back, kept);
    assert_same_logits(back, kept);
    mkv_model_free(kept);
    mkv_model_free(back);
    mkv_model_free(m);
}
END_TEST

/* A tied classifier kept in blocks is the token embedding's. */
START_TEST(test_llama_blocks_tied)
{
    mkv_model *m = tiny_model(1, 1);
    const char *path = tmp_file("tinyq-tied.gguf");
    llama_opts o = {0};
    o.q8_tensor = "token_embd.weight";      /* ne [64, 40] */
    o.q41_tensor = "blk.1.attn_q.weight";   /* ne [64, 64] */
    write_llama_gguf(path, m, &o);
    mkv_model *back, *kept;
    mkv_error err;
    ck_assert_msg(mkv_gguf_load(path, 0, &back, NULL, NULL, &err) == MKV_OK, "%s", err.msg);
    ck_assert_msg(mkv_gguf_load(path, 1, &kept, NULL, NULL, &err) == MKV_OK, "%s", err.msg);
    ck_assert_ptr_eq(kept->qclassifier.data, kept->qtok_embedding.data);
    ck_assert_int_eq(kept->qtok_embedding.type, MKV_GGML_Q8_0);
    assert_same_matrices(back, kept);
    assert_same_logits(back, kept);
    mkv_model_free(kept);
    mkv_model_free(back);
    mkv_model_free(m);
}
END_TEST

static void x_expert(gguf_w *w) { kv_u32(w, "llama.expert_count", 8); }
static void x_rope_freqs(gguf_w *w) { float f[8] = {1}; w_tensor_f32(w, "rope_freqs.weight", 8, 0, f); }
static void x_extra_tensor(gguf_w *w) { float f[64] = {1}; w_tensor_f32(w, "blk.0.attn_q_norm.weight", 64, 0, f); }
static void x_per_layer(gguf_w *w) { int32_t v[2] = {2, 2}; kv_arr_i32(w, "llama.attention.head_count_kv", v, 2); }
static void x_vocab(gguf_w *w) { kv_u32(w, "llama.vocab_size", 41); }
static void x_short_rope_freqs(gguf_w *w) { float f[4] = {1, 1, 1, 1}; w_tensor_f32(w, "rope_freqs.weight", 4, 0, f); }
static void x_yarn(gguf_w *w) { kv_str(w, "llama.rope.scaling.type", "yarn"); kv_f32(w, "llama.rope.scaling.factor", 4.0f); }
static void x_negative_scale(gguf_w *w) { kv_f32(w, "llama.rope.scaling.factor", -2.0f); }

START_TEST(test_llama_errors)
{
    struct {
        llama_opts o;
        const char *want;
    } cases[] = {
        {{0}, NULL}, /* the baseline loads */
        {{.arch = "qwen2"}, "architecture 'qwen2' is not supported (only 'llama')"},
        {{.skip_key = "llama.block_count"}, "metadata 'llama.block_count' is missing"},
        {{.skip_tensor = "blk.1.ffn_up.weight"}, "tensor 'blk.1.ffn_up.weight' is missing"},
        {{.skip_tensor = "output_norm.weight"}, "tensor 'output_norm.weight' is missing"},
        {{.swap_tensor = "blk.0.attn_k.weight"},
         "tensor 'blk.0.attn_k.weight' has shape [32, 64] (ne), the configuration implies [64, 32]"},
        {{.nan_tensor = "blk.1.ffn_gate.weight"}, "'blk.1.ffn_gate.weight' holds a non-finite value"},
        {{.extra = x_expert}, "mixture-of-experts"},
        {{.extra = x_rope_freqs}, "tensor 'rope_freqs.weight' holds 0 at element 1"},
        {{.extra = x_short_rope_freqs}, "'rope_freqs.weight' must be a vector of 8 values"},
        {{.extra = x_extra_tensor}, "tensor 'blk.0.attn_q_norm.weight' is not part of a LLaMA model"},
        {{.skip_key = "llama.attention.head_count_kv", .extra = x_per_layer}, "is per-layer"},
        {{.skip_key = "llama.vocab_size", .extra = x_vocab},
         "llama.vocab_size = 41 but token_embd.weight has 40 rows"},
        {{.extra = x_yarn}, "RoPE scaling of type 'yarn' (factor 4) is not supported"},
        {{.extra = x_negative_scale}, "RoPE scaling factor -2 is negative"},
    };
    mkv_model *m = tiny_model(0, 0);
    for (size_t i = 0; i < 2 * (sizeof cases / sizeof cases[0]); i++) {
        size_t c = i / 2;
        int blocks = (int)(i % 2); /* the matrices in float32, then kept in blocks */
        const char *path = tmp_file("bad-llama.gguf");
        write_llama_gguf(path, m, &cases[c].o);
        mkv_model *back;
        mkv_error err;
        int rc = mkv_gguf_load(path, blocks, &back, NULL, NULL, &err);
        if (!cases[c].want) {
            ck_assert_msg(rc == MKV_OK, "case %zu: %s", c, err.msg);
            mkv_model_free(back);
            continue;
        }
        ck_assert_msg(rc != MKV_OK, "case %zu (blocks %d) loaded, expected \"%s\"", c, blocks, cases[c].want);
        ck_assert_ptr_null(back);
        ck_assert_msg(strstr(err.msg, cases[c].want) != NULL, "case %zu (blocks %d): \"%s\" lacks \"%s\"",
                      c, blocks, err.msg, cases[c].want);
        ck_assert_msg(strstr(err.msg, path) != NULL, "case %zu: no file name in \"%s\"", c, err.msg);
    }
    mkv_model_free(m);
}
END_TEST

START_TEST(test_llama_unsupported_quant)
{
    /* dim 256 so that one row of attn_norm is one Q4_K block */
    mkv_model_config c;
    mkv_model_config_defaults(&c);
    snprintf(c.name, sizeof c.name, "wide");
    c.dim = 256; c.hidden_dim = 32; c.n_layers = 1; c.n_heads = 4; c.n_kv_heads = 4;
    c.head_dim = 64; c.rope_dim = 64; c.vocab_size = 8; c.max_seq_len = 8;
    mkv_model *m;
    mkv_error err;
    ck_assert_msg(mkv_model_create(&c, &m, &err) == MKV_OK, "%s", err.msg);
    llama_opts o = {.q4k_tensor = "blk.0.attn_norm.weight"};
    const char *path = tmp_file("q4k-llama.gguf");
    write_llama_gguf(path, m, &o);
    mkv_model *back;
    ck_assert_int_eq(mkv_gguf_load(path, 0, &back, NULL, NULL, &err), MKV_EUNSUP);
    ck_assert_msg(strstr(err.msg, "tensor 'blk.0.attn_norm.weight' has type Q4_K, which mosaickv "
                                  "cannot dequantize") != NULL, "%s", err.msg);
    mkv_model_free(m);
}
END_TEST

/* ------------------------------------------------------------ llama2.c models as GGUF */

static void logits_of(const mkv_model *m, const int32_t *ids, size_t n, float *out)
{
    mkv_forward *f;
    mkv_error err;
    mkv_forward_opts opts = {2, 4, 0};
    ck_assert_msg(mkv_forward_create(m, &opts, &f, &err) == MKV_OK, "%s", err.msg);
    ck_assert_msg(mkv_forward_run(f, ids, n, out, MKV_LOGITS_ALL, &err) == MKV_OK, "%s", err.msg);
    mkv_forward_free(f);
}

static int32_t *encode_bos(const mkv_tokenizer *t, const char *text, size_t *n)
{
    int32_t *ids;
    mkv_error err;
    ck_assert_msg(mkv_tokenizer_encode(t, text, strlen(text), MKV_ENCODE_BOS, &ids, n, &err) == MKV_OK, "%s",
                  err.msg);
    return ids;
}

/* Greedy continuation of prompt up to n_total tokens (prompt included). */
static int32_t *greedy(const mkv_model *m, const int32_t *prompt, size_t n_prompt, size_t n_total)
{
    mkv_forward *f;
    mkv_error err;
    mkv_forward_opts opts = {1, 0, 0};
    ck_assert_int_eq(mkv_forward_create(m, &opts, &f, &err), MKV_OK);
    size_t v = (size_t)m->cfg.vocab_size;
    float *logits = malloc(v * sizeof(float));
    int32_t *out = malloc(n_total * sizeof *out);
    ck_assert(logits && out);
    memcpy(out, prompt, n_prompt * sizeof *prompt);
    ck_assert_int_eq(mkv_forward_run(f, prompt, n_prompt, logits, MKV_LOGITS_LAST, &err), MKV_OK);
    for (size_t i = n_prompt; i < n_total; i++) {
        out[i] = mkv_argmax(logits, (int)v);
        ck_assert_int_eq(mkv_forward_run(f, &out[i], 1, logits, MKV_LOGITS_LAST, &err), MKV_OK);
    }
    free(logits);
    mkv_forward_free(f);
    return out;
}

/* A llama2.c checkpoint (tests/model_fixture.py's; stories260K) and its
 * tokenizer, as a GGUF file written here (F32 tensors, no row permutation:
 * llama2.c already pairs adjacent channels, as GGUF "llama" does; the
 * tokenizer as the "llama" vocabulary): the same model as the llama2.c
 * loader gives, the same ids as the llama2.c tokenizer, the same logits
 * and the same greedy continuation.  For stories260K, also the published
 * ids and sample. */
START_TEST(test_llama2c_gguf_equivalence)
{
    mkv_model *ref, *m;
    mkv_tokenizer *ref_tok, *tok;
    mkv_gguf_extra x;
    mkv_error err;
    ck_assert_msg(mkv_llama2c_load(test_checkpoint(_i), &ref, &err) == MKV_OK, "%s", err.msg);
    ck_assert_msg(mkv_tokenizer_load_llama2c(test_tokenizer(_i), ref->cfg.vocab_size, &ref_tok, &err) == MKV_OK,
                  "%s", err.msg);
    const char *path = tmp_file("llama2c.gguf");
    llama_opts o = {.vocab = test_tokenizer(_i)};
    write_llama_gguf(path, ref, &o);
    ck_assert_msg(mkv_gguf_load(path, 0, &m, &tok, &x, &err) == MKV_OK, "%s", err.msg);
    ck_assert_int_eq(x.add_bos, 1);
    assert_same_model(ref, m);
    ck_assert_int_eq(tok->vocab_size, ref_tok->vocab_size);
    ck_assert_int_eq(tok->bos_id, 1);
    ck_assert_int_eq(tok->eos_id, 2);

    /* The sentencepiece vocabulary from the file tokenizes as the
     * llama2.c tokenizer (checked against tests/model_ref.py by
     * check_model) and decodes back to the text. */
    size_t n_texts;
    const char *const *texts = test_texts(&n_texts);
    for (size_t k = 0; k < n_texts; k++) {
        size_t n, n_ref, len;
        int32_t *ids = encode_bos(tok, texts[k], &n), *want = encode_bos(ref_tok, texts[k], &n_ref);
        ck_assert_msg(n == n_ref && !memcmp(ids, want, n * sizeof *ids), "text %zu: %zu ids, llama2.c %zu", k, n,
                      n_ref);
        char *back;
        ck_assert_int_eq(mkv_tokenizer_decode(tok, ids, n, &back, &len, &err), MKV_OK);
        ck_assert_msg(len == strlen(texts[k]) && !memcmp(back, texts[k], len), "text %zu decodes as '%s'", k, back);
        free(back);
        free(ids);
        free(want);
    }
    size_t n_prompt, n_seq;
    int32_t *prompt = encode_bos(tok, "Once upon a time", &n_prompt);
    if (_i == TEST_STORIES) {
        int32_t want[5] = {1, 403, 407, 261, 378};
        ck_assert_uint_eq(n_prompt, 5);
        ck_assert(!memcmp(prompt, want, sizeof want));
    }

    int32_t *seq = encode_bos(ref_tok, texts[n_texts - 1], &n_seq);
    size_t v = (size_t)ref->cfg.vocab_size;
    float *a = malloc(n_seq * v * sizeof(float)), *b = malloc(n_seq * v * sizeof(float));
    ck_assert(a && b);
    logits_of(ref, seq, n_seq, a);
    logits_of(m, seq, n_seq, b);
    assert_same_floats(a, b, n_seq * v, "logits");

    /* Greedy decoding from the GGUF model and vocabulary: that of the
     * llama2.c files; for stories260K the published sample. */
    size_t n_total = 64;
    if (_i == TEST_STORIES)
        free(encode_bos(tok, TEST_PUBLISHED, &n_total));
    int32_t *got = greedy(m, prompt, n_prompt, n_total), *want = greedy(ref, prompt, n_prompt, n_total);
    for (size_t i = 0; i < n_total; i++)
        ck_assert_msg(got[i] == want[i], "token %zu: GGUF %d, llama2.c %d", i, got[i], want[i]);
    char *text;
    size_t len;
    ck_assert_int_eq(mkv_tokenizer_decode(tok, got, n_total, &text, &len, &err), MKV_OK);
    if (_i == TEST_STORIES)
        ck_assert_str_eq(text, TEST_PUBLISHED);
    free(text);
    free(got);
    free(want);
    free(seq);
    free(prompt);
    free(a);
    free(b);
    mkv_gguf_extra_free(&x);
    mkv_tokenizer_free(tok);
    mkv_tokenizer_free(ref_tok);
    mkv_model_free(m);
    mkv_model_free(ref);
}
END_TEST

/* ------------------------------------------------------------ scaled RoPE */

/* Llama 3.1's frequency divisors the way llama.cpp's convert_hf_to_gguf.py
 * derives rope_freqs.weight from config.json: per pair, from the wavelength
 * 2 pi / freq against orig / high and orig / low, 1, factor, or
 * 1 / ((1 - smooth) / factor + smooth) in between. */
static void converter_rope_freqs(double theta, int rope_dim, double factor, double low, double high,
                                 double orig, float *out)
{
    for (int j = 0; j < rope_dim / 2; j++) {
        double freq = 1.0 / pow(theta, 2.0 * j / rope_dim);
        double wavelen = 2.0 * 3.14159265358979324 / freq;
        if (wavelen < orig / high) {
            out[j] = 1.0f;
        } else if (wavelen > orig / low) {
            out[j] = (float)factor;
        } else {
            double smooth = (orig / wavelen - low) / (high - low);
            out[j] = (float)(1.0 / ((1.0 - smooth) / factor + smooth));
        }
    }
}

/* Rows of the q or k matrix reordered per head from GGUF's interleaved
 * pairs (2j, 2j+1) to Hugging Face's rotate_half (j, j + hd/2). */
static void to_rotate_half(float *w, int heads, int hd, int dim)
{
    size_t n = (size_t)heads * hd * dim;
    float *copy = malloc(n * sizeof(float));
    ck_assert_ptr_nonnull(copy);
    memcpy(copy, w, n * sizeof(float));
    for (int h = 0; h < heads; h++)
        for (int r = 0; r < hd; r++) {
            int src = r < hd / 2 ? 2 * r : 2 * (r - hd / 2) + 1;
            memcpy(w + ((size_t)h * hd + r) * dim, copy + ((size_t)h * hd + src) * dim,
                   (size_t)dim * sizeof(float));
        }
    free(copy);
}

static double max_rel_diff(const float *a, const float *b, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        num = fmax(num, fabs((double)a[i] - b[i]));
        den = fmax(den, fabs((double)b[i]));
    }
    ck_assert(den > 1e-3);
    return num / den;
}

/* tiny_model with theta 10000, so that its 8 RoPE wavelengths, 2 pi x
 * 10^(j/2), straddle the llama3 band of orig 256, low 1, high 8: pairs 0-1
 * keep their frequency, 2-3 are blended, 4-7 divided by 8. */
#define SCALED_THETA 10000.0
#define SCALED_CONFIG_JSON                                                                       \
    "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, \"intermediate_size\": 96, " \
    "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "          \
    "\"max_position_embeddings\": 32, \"vocab_size\": 40, \"rms_norm_eps\": 1e-06, "              \
    "\"rope_theta\": 10000.0, \"tie_word_embeddings\": false, \"hidden_act\": \"silu\", "          \
    "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "       \
    "\"high_freq_factor\": 8.0, \"original_max_position_embeddings\": 256}}\n"

/* A GGUF with rope_freqs.weight (as llama.cpp converts Llama 3.1) gives the
 * logits of the same weights under the Hugging Face config.json that
 * declares the llama3 scaling, read by the HF loader. */
START_TEST(test_llama3_rope_freqs)
{
    mkv_model *m = tiny_model(0, 0);
    m->cfg.rope_theta = SCALED_THETA;
    float freqs[8];
    converter_rope_freqs(SCALED_THETA, 16, 8.0, 1.0, 8.0, 256.0, freqs);
    ck_assert(freqs[1] == 1.0f && freqs[2] > 1.0f && freqs[3] < 8.0f && freqs[4] == 8.0f);
    const char *path = tmp_file("llama3.gguf");
    llama_opts o = {.rope_freqs = freqs};
    write_llama_gguf(path, m, &o);
    mkv_model *g;
    mkv_error err;
    ck_assert_msg(mkv_gguf_load(path, 0, &g, NULL, NULL, &err) == MKV_OK, "%s", err.msg);
    ck_assert_int_eq(g->cfg.has_rope_freq_factors, 1);
    assert_same_floats(g->cfg.rope_freq_factors, freqs, 8, "rope_freqs");

    /* The HF version: config.json through the HF loader's parser, weights
     * with q and k rows in rotate_half order. */
    const char *dir = tmp_file("llama3-hf");
    ck_assert(mkdir(dir, 0755) == 0);
    char json[4400];
    snprintf(json, sizeof json, "%s/config.json", dir);
    write_bytes(json, SCALED_CONFIG_JSON, strlen(SCALED_CONFIG_JSON));
    mkv_model_config hc;
    ck_assert_msg(mkv_hf_read_config(dir, &hc, &err) == MKV_OK, "%s", err.msg);
    ck_assert_int_eq(hc.rope_layout, MKV_ROPE_HALF);
    ck_assert_int_eq(hc.has_rope_freq_factors, 1);
    for (int j = 0; j < 8; j++)
        ck_assert_msg(fabs(hc.rope_freq_factors[j] - freqs[j]) <= 1e-6 * freqs[j], "pair %d: %g vs %g",
                      j, (double)hc.rope_freq_factors[j], (double)freqs[j]);
    mkv_model *h;
    ck_assert_msg(mkv_model_create(&hc, &h, &err) == MKV_OK, "%s", err.msg);
    ck_assert_uint_eq(h->storage_floats, g->storage_floats);
    memcpy(h->storage, g->storage, g->storage_floats * sizeof(float));
    for (int l = 0; l < 2; l++) {
        to_rotate_half(h->layers[l].wq, 4, 16, 64);
        to_rotate_half(h->layers[l].wk, 2, 16, 64);
    }

    int32_t ids[24];
    for (int i = 0; i < 24; i++)
        ids[i] = (int32_t)((i * 7 + 3) % 40);
    size_t n = 24 * 40;
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    logits_of(g, ids, 24, a);
    logits_of(h, ids, 24, b);
    double e = max_rel_diff(a, b, n);
    ck_assert_msg(e <= 1e-5, "GGUF rope_freqs vs HF llama3 logits: relative difference %.3g", e);
    /* ... and the divisors matter at these positions. */
    g->cfg.has_rope_freq_factors = 0;
    logits_of(g, ids, 24, b);
    e = max_rel_diff(b, a, n);
    ck_assert_msg(e > 1e-2, "plain RoPE logits differ by only %.3g", e);
    free(a);
    free(b);
    mkv_model_free(h);
    mkv_model_free(g);
    mkv_model_free(m);
}
END_TEST

static void x_linear(gguf_w *w) { kv_str(w, "llama.rope.scaling.type", "linear"); kv_f32(w, "llama.rope.scaling.factor", 4.0f); }
static void x_none(gguf_w *w) { kv_str(w, "llama.rope.scaling.type", "none"); kv_f32(w, "llama.rope.scaling.factor", 4.0f); }
static void x_scale_linear(gguf_w *w) { kv_f32(w, "llama.rope.scale_linear", 2.0f); }

/* llama.cpp's reading of the metadata: the linear factor (type "linear" or
 * none given) divides every frequency, on top of rope_freqs.weight; type
 * "none" turns it off. */
START_TEST(test_rope_scaling_metadata)
{
    struct {
        void (*extra)(gguf_w *w);
        int with_freqs;
        double want; /* factor of pair j: want x (with_freqs ? j + 1 : 1); 0 = no factors */
    } cases[] = {
        {NULL, 0, 0.0}, {x_linear, 0, 4.0}, {x_linear, 1, 4.0}, {x_none, 0, 0.0}, {x_none, 1, 1.0},
        {x_scale_linear, 0, 2.0},
    };
    float freqs[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    mkv_model *m = tiny_model(0, 0);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        llama_opts o = {.extra = cases[i].extra, .rope_freqs = cases[i].with_freqs ? freqs : NULL};
        const char *path = tmp_file("scaled.gguf");
        write_llama_gguf(path, m, &o);
        mkv_model *g;
        mkv_error err;
        ck_assert_msg(mkv_gguf_load(path, 0, &g, NULL, NULL, &err) == MKV_OK, "case %zu: %s", i, err.msg);
        ck_assert_int_eq(g->cfg.has_rope_freq_factors, cases[i].want != 0.0);
        for (int j = 0; cases[i].want != 0.0 && j < 8; j++)
            ck_assert_msg(g->cfg.rope_freq_factors[j] == (float)(cases[i].want * (cases[i].with_freqs ? j + 1 : 1)),
                          "case %zu pair %d: %g", i, j, (double)g->cfg.rope_freq_factors[j]);
        mkv_model_free(g);
    }
    mkv_model_free(m);
}
END_TEST

/* ------------------------------------------------------------ GPT-2 BPE by hand */

/* GPT-2's byte spelling, from its description: bytes '!'..'~', 0xA1..0xAC
 * and 0xAE..0xFF are themselves, the other 68 are U+0100.. in byte order. */
static unsigned ref_byte_char(unsigned b)
{
    static unsigned table[256];
    static int made;
    if (!made) {
        unsigned next = 0x100;
        for (unsigned x = 0; x < 256; x++) {
            int printable = (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE);
            table[x] = printable ? x : next++;
        }
        made = 1;
    }
    return table[b];
}

static void spell(unsigned cp, char *dst)
{
    if (cp < 0x80) {
        dst[0] = (char)cp;
        dst[1] = 0;
    } else {
        dst[0] = (char)(0xC0 | cp >> 6);
        dst[1] = (char)(0x80 | (cp & 0x3F));
        dst[2] = 0;
    }
}

/* Vocabulary: the 256 byte characters (ids 0..255 in byte order, minus
 * `missing` when >= 0), then `extra` pieces. */
typedef struct {
    char *tokens[300];
    int types[300];
    int n;
} tiny_vocab;

static void tiny_vocab_init(tiny_vocab *v, int missing, const char *const *extra, const int *extra_types,
                            int n_extra)
{
    v->n = 0;
    for (unsigned b = 0; b < 256; b++) {
        char s[4] = "\xE2\x98\x83"; /* a snowman stands in for the missing byte */
        if (b != (unsigned)missing)
            spell(ref_byte_char(b), s);
        v->tokens[v->n] = strdup(s);
        v->types[v->n++] = MKV_TOKEN_NORMAL;
    }
    for (int i = 0; i < n_extra; i++) {
        v->tokens[v->n] = strdup(extra[i]);
        v->types[v->n++] = extra_types ? extra_types[i] : MKV_TOKEN_NORMAL;
    }
}

static void tiny_vocab_free(tiny_vocab *v)
{
    for (int i = 0; i < v->n; i++)
        free(v->tokens[i]);
}

static void expect_ids(const mkv_tokenizer *t, const char *text, int flags, const int32_t *want,
                       size_t n_want)
{
    int32_t *ids;
    size_t n;
    mkv_error err;
    ck_assert_msg(mkv_tokenizer_encode(t, text, strlen(text), flags, &ids, &n, &err) == MKV_OK, "%s",
                  err.msg);
    int same = n == n_want;
    for (size_t i = 0; same && i < n; i++)
        same = ids[i] == want[i];
    if (!same) {
        char got[512] = "";
        for (size_t i = 0; i < n && strlen(got) < 480; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%d ", ids[i]);
        ck_abort_msg("\"%s\": got %s", text, got);
    }
    char *back;
    size_t len;
    ck_assert_int_eq(mkv_tokenizer_decode(t, ids, n, &back, &len, &err), MKV_OK);
    if (!(flags & MKV_ENCODE_SPECIAL))
        ck_assert_str_eq(back, text);
    free(back);
    free(ids);
}

/* The vocabulary layer on its own, from metadata given as plain arrays:
 * llama.cpp's sentencepiece defaults (unknown 0, BOS 1, EOS 2, a space
 * prefix, token types inferred when the file has none) and a hand-worked
 * merge by score. */
START_TEST(test_vocab_from_metadata)
{
    static const char *const pieces[] = {"<unk>", "<s>", "</s>", "<0x41>", "\xE2\x96\x81", "a",
                                         "\xE2\x96\x81" "a", "b"};
    static const size_t lens[] = {5, 3, 4, 6, 3, 1, 4, 1};
    static const float scores[] = {0, 0, 0, 0, -5, -3, -1, -4};
    mkv_gguf_vocab v = {.source = "v.gguf", .model = "llama", .n_tokens = 8, .tokens = pieces,
                        .token_lens = lens, .bos_id = MKV_GGUF_VOCAB_UNSET,
                        .eos_id = MKV_GGUF_VOCAB_UNSET, .unk_id = MKV_GGUF_VOCAB_UNSET,
                        .scores = scores, .add_space_prefix = -1};
    mkv_tokenizer *t;
    mkv_error err;
    ck_assert_msg(mkv_gguf_vocab_tokenizer(&v, &t, &err) == MKV_OK, "%s", err.msg);
    ck_assert_int_eq(t->unk_id, 0);
    ck_assert_int_eq(t->bos_id, 1);
    ck_assert_int_eq(t->eos_id, 2);
    ck_assert_int_eq(t->add_space_prefix, 1);
    static const int want_types[] = {MKV_TOKEN_UNKNOWN, MKV_TOKEN_CONTROL, MKV_TOKEN_CONTROL,
                                     MKV_TOKEN_BYTE, MKV_TOKEN_NORMAL, MKV_TOKEN_NORMAL,
                                     MKV_TOKEN_NORMAL, MKV_TOKEN_NORMAL};
    for (int i = 0; i < 8; i++)
        ck_assert_int_eq(t->tokens[i].type, want_types[i]);
    /* "ab" -> U+2581 a b; the best-scored pair (U+2581 a, -1) merges, then
     * nothing more: BOS, 6, 7.  "A" has no piece: BOS, U+2581 and byte
     * <0x41>. */
    expect_ids(t, "ab", MKV_ENCODE_BOS, (int32_t[]){1, 6, 7}, 3);
    expect_ids(t, "A", MKV_ENCODE_BOS, (int32_t[]){1, 4, 3}, 3);
    mkv_tokenizer_free(t);

    v.add_space_prefix = 0;
    v.bos_id = -1;
    ck_assert_msg(mkv_gguf_vocab_tokenizer(&v, &t, &err) == MKV_OK, "%s", err.msg);
    ck_assert_int_eq(t->bos_id, -1);
    expect_ids(t, "ab", 0, (int32_t[]){5, 7}, 2);
    mkv_tokenizer_free(t);

    v.model = "bert";
    ck_assert_int_eq(mkv_gguf_vocab_tokenizer(&v, &t, &err), MKV_EUNSUP);
    ck_assert_ptr_null(t);
    ck_assert_ptr_nonnull(strstr(err.msg, "'v.gguf': tokenizer model 'bert' is not supported"));

    /* byte-level BPE pieces are C strings: a NUL inside one is refused */
    static const size_t nul_lens[] = {5, 3, 4, 6, 3, 2, 4, 1};
    v.model = "gpt2";
    v.token_lens = nul_lens;
    ck_assert_int_eq(mkv_gguf_vocab_tokenizer(&v, &t, &err), MKV_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "'tokenizer.ggml.tokens' entry 5 contains a NUL byte"));

    /* llama.cpp: sentencepiece vocabularies and the LLaMA-3 pre-tokenizer
     * start prompts with BOS, other byte-level ones do not */
    ck_assert_int_eq(mkv_gguf_vocab_default_add_bos("llama", NULL), 1);
    ck_assert_int_eq(mkv_gguf_vocab_default_add_bos(NULL, NULL), 1);
    ck_assert_int_eq(mkv_gguf_vocab_default_add_bos("gpt2", "smollm"), 0);
    ck_assert_int_eq(mkv_gguf_vocab_default_add_bos("gpt2", NULL), 0);
    ck_assert_int_eq(mkv_gguf_vocab_default_add_bos("gpt2", "llama-bpe"), 1);
}
END_TEST

START_TEST(test_bpe_by_hand)
{
    for (unsigned b = 0; b < 256; b++)
        ck_assert_uint_eq(mkv_bpe_gpt2_byte_char((unsigned char)b), ref_byte_char(b));
    ck_assert_uint_eq(mkv_bpe_gpt2_byte_char(' '), 0x120);  /* Ġ */
    ck_assert_uint_eq(mkv_bpe_gpt2_byte_char('\n'), 0x10A); /* Ċ */
    ck_assert_uint_eq(mkv_bpe_gpt2_byte_char(0xAD), 0x143);

    /* ids: bytes 0..255 ('a' = 97, 'b' = 98, 'c' = 99, ' ' = 32 spelled Ġ),
     * 256 ab, 257 abc, 258 Ġa, 259 aa, 260 bc, 261 <|x|> control,
     * 262 <u> user-defined */
    static const char *const extra[] = {"ab", "abc", "\xC4\xA0" "a", "aa", "bc", "<|x|>", "<u>"};
    static const int extra_types[] = {1, 1, 1, 1, 1, MKV_TOKEN_CONTROL, MKV_TOKEN_USER_DEFINED};
    tiny_vocab v;
    tiny_vocab_init(&v, -1, extra, extra_types, 7);
    static const char *const merges[] = {"a b", "ab c", "\xC4\xA0 a", "a a"};
    mkv_tokenizer *t;
    mkv_error err;
    ck_assert_msg(mkv_bpe_gpt2_create((const char *const *)v.tokens, v.types, v.n, merges, 4, "gpt2",
                                      -1, 261, &t, &err) == MKV_OK, "%s", err.msg);
    /* a b c: (a b) rank 0 first, then (ab c) rank 1 */
    expect_ids(t, "abc", 0, (int32_t[]){257}, 1);
    /* a a a: both pairs rank 3, the leftmost merges */
    expect_ids(t, "aaa", 0, (int32_t[]){259, 97}, 2);
    /* Ġ a b c: (a b) rank 0 beats (Ġ a) rank 2; then (ab c); Ġ abc is no merge */
    expect_ids(t, " abc", 0, (int32_t[]){32, 257}, 2);
    /* Ġ a: one merge; "a c" no merge */
    expect_ids(t, " ac", 0, (int32_t[]){258, 99}, 2);
    /* pre-tokens never merge across: "ab" and " ab" */
    expect_ids(t, "ab ab", 0, (int32_t[]){256, 32, 256}, 3);
    /* control and user-defined pieces are whole with MKV_ENCODE_SPECIAL only */
    expect_ids(t, "ab<|x|>c", MKV_ENCODE_SPECIAL, (int32_t[]){256, 261, 99}, 3);
    expect_ids(t, "<u>", MKV_ENCODE_SPECIAL, (int32_t[]){262}, 1);
    expect_ids(t, "<|x|>", 0, (int32_t[]){'<', '|', 'x', '|', '>'}, 5);
    expect_ids(t, "", 0, NULL, 0);
    /* every byte (invalid UTF-8 included) encodes and decodes back */
    char all[256];
    for (int i = 0; i < 255; i++)
        all[i] = (char)(i + 1);
    all[255] = '\0';
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(mkv_tokenizer_encode(t, all, 255, 0, &ids, &n, &err), MKV_OK);
    char *back;
    size_t len;
    ck_assert_int_eq(mkv_tokenizer_decode(t, ids, n, &back, &len, &err), MKV_OK);
    ck_assert_uint_eq(len, 255);
    ck_assert_int_eq(memcmp(back, all, 255), 0);
    free(back);
    free(ids);
    /* decoding: control tokens emit nothing, user-defined their text */
    ck_assert_int_eq(mkv_tokenizer_decode(t, (int32_t[]){258, 261, 262, 10}, 4, &back, &len, &err), MKV_OK);
    ck_assert_str_eq(back, " a<u>\n");
    free(back);
    ck_assert_int_eq(mkv_tokenizer_encode(t, "ab", 2, MKV_ENCODE_EOS, &ids, &n, &err), MKV_OK);
    ck_assert_uint_eq(n, 2);
    ck_assert_int_eq(ids[1], 261);
    free(ids);
    ck_assert_int_eq(mkv_tokenizer_encode(t, "ab", 2, MKV_ENCODE_BOS, &ids, &n, &err), MKV_EUNSUP);
    mkv_tokenizer_free(t);

    /* Merge order decides: with (b c) first, "abc" is a + bc. */
    static const char *const merges2[] = {"b c", "a b", "ab c"};
    ck_assert_int_eq(mkv_bpe_gpt2_create((const char *const *)v.tokens, v.types, v.n, merges2, 3,
                                         NULL, -1, -1, &t, &err), MKV_OK);
    expect_ids(t, "abc", 0, (int32_t[]){97, 260}, 2);
    expect_ids(t, "abab", 0, (int32_t[]){256, 256}, 2);
    mkv_tokenizer_free(t);

    /* Errors name what is wrong. */
    static const char *const bad1[] = {"a b", "ab"};
    ck_assert_int_eq(mkv_bpe_gpt2_create((const char *const *)v.tokens, v.types, v.n, bad1, 2, "gpt2",
                                         -1, -1, &t, &err), MKV_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "merge 1 ('ab') is not two pieces"));
    static const char *const bad2[] = {"a zz"};
    ck_assert_int_eq(mkv_bpe_gpt2_create((const char *const *)v.tokens, v.types, v.n, bad2, 1, "gpt2",
                                         -1, -1, &t, &err), MKV_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "the right piece is not in the vocabulary"));
    static const char *const bad3[] = {"b b"}; /* "bb" is not a token */
    ck_assert_int_eq(mkv_bpe_gpt2_create((const char *const *)v.tokens, v.types, v.n, bad3, 1, "gpt2",
                                         -1, -1, &t, &err), MKV_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "the merged piece is not in the vocabulary"));
    ck_assert_int_eq(mkv_bpe_gpt2_create((const char *const *)v.tokens, v.types, v.n, merges, 4, "bogus",
                                         -1, -1, &t, &err), MKV_EUNSUP);
    ck_assert_ptr_nonnull(strstr(err.msg, "unsupported pre-tokenizer 'bogus'"));
    ck_assert_int_eq(mkv_bpe_gpt2_create((const char *const *)v.tokens, v.types, v.n, merges, 4, "gpt2",
                                         v.n, -1, &t, &err), MKV_EFORMAT);
    tiny_vocab_free(&v);

    /* A vocabulary without byte 0x04: that byte is an error, or the unknown token. */
    static const char *const unk[] = {"<unk>"};
    static const int unk_type[] = {MKV_TOKEN_UNKNOWN};
    tiny_vocab_init(&v, 4, unk, unk_type, 1);
    ck_assert_int_eq(mkv_bpe_gpt2_create((const char *const *)v.tokens, v.types, v.n, NULL, 0, "gpt2",
                                         -1, -1, &t, &err), MKV_OK);
    ck_assert_int_eq(mkv_tokenizer_encode(t, "a\004b", 3, 0, &ids, &n, &err), MKV_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "cannot encode byte 0x04 at offset 1"));
    t->unk_id = 256;
    expect_ids(t, "a", 0, (int32_t[]){97}, 1);
    ck_assert_int_eq(mkv_tokenizer_encode(t, "a\004b", 3, 0, &ids, &n, &err), MKV_OK);
    ck_assert_uint_eq(n, 3);
    ck_assert_int_eq(ids[1], 256);
    free(ids);
    mkv_tokenizer_free(t);
    tiny_vocab_free(&v);
}
END_TEST

/* ------------------------------------------------------------ pre-tokenizers */

/* Produced by `python3 tests/gguf_ref.py pieces` with Hugging Face
 * tokenizers 0.23.3 (Split with the models' published regular expressions,
 * behavior "isolated"; SmolLM: Digits(individual_digits) first). */
static const struct {
    const char *pre, *text;
    const char *pieces[20];
} PIECES[] = {
    {"gpt2", "Hello world\012\012  foo\015\012\011bar   \012",
     {"Hello", " world", "\012\012 ", " foo", "\015\012", "\011", "bar", "   \012"}},
    {"gpt2", "x  \012 y",
     {"x", "  \012", " y"}},
    {"gpt2", "a\302\240b c\343\200\200d",
     {"a", "\302\240", "b", " c", "\343\200\200", "d"}},
    {"gpt2", "1234567 12 x1y22",
     {"1234567", " 12", " x", "1", "y", "22"}},
    {"gpt2", "'S 's 'll 'LL 'Re it's",
     {"'", "S", " '", "s", " '", "ll", " '", "LL", " '", "Re", " it", "'s"}},
    {"gpt2", "(word) [x] --flag",
     {"(", "word", ")", " [", "x", "]", " --", "flag"}},
    {"gpt2", "\346\227\245\346\234\254\350\252\236\343\203\206\343\202\255\343\202\271\343\203\210123 \303\234n\303\257c\303\266d\303\251",
     {"\346\227\245\346\234\254\350\252\236\343\203\206\343\202\255\343\202\271\343\203\210", "123", " \303\234n\303\257c\303\266d\303\251"}},
    {"gpt2", "hello...world!!! ?? \012\012\012",
     {"hello", "...", "world", "!!!", " ??", " \012\012\012"}},
    {"gpt2", "   ",
     {"   "}},
    {"gpt2", " \012 ",
     {" \012 "}},
    {"gpt2", "tab\011sep\011\011end",
     {"tab", "\011", "sep", "\011", "\011", "end"}},
    {"gpt2", "a\034b",
     {"a", "\034", "b"}},
    {"smollm", "Hello world\012\012  foo\015\012\011bar   \012",
     {"Hello", " world", "\012\012 ", " foo", "\015\012", "\011", "bar", "   \012"}},
    {"smollm", "x  \012 y",
     {"x", "  \012", " y"}},
    {"smollm", "a\302\240b c\343\200\200d",
     {"a", "\302\240", "b", " c", "\343\200\200", "d"}},
    {"smollm", "1234567 12 x1y22",
     {"1", "2", "3", "4", "5", "6", "7", " ", "1", "2", " x", "1", "y", "2", "2"}},
    {"smollm", "'S 's 'll 'LL 'Re it's",
     {"'", "S", " '", "s", " '", "ll", " '", "LL", " '", "Re", " it", "'s"}},
    {"smollm", "(word) [x] --flag",
     {"(", "word", ")", " [", "x", "]", " --", "flag"}},
    {"smollm", "\346\227\245\346\234\254\350\252\236\343\203\206\343\202\255\343\202\271\343\203\210123 \303\234n\303\257c\303\266d\303\251",
     {"\346\227\245\346\234\254\350\252\236\343\203\206\343\202\255\343\202\271\343\203\210", "1", "2", "3", " \303\234n\303\257c\303\266d\303\251"}},
    {"smollm", "hello...world!!! ?? \012\012\012",
     {"hello", "...", "world", "!!!", " ??", " \012\012\012"}},
    {"smollm", "   ",
     {"   "}},
    {"smollm", " \012 ",
     {" \012 "}},
    {"smollm", "tab\011sep\011\011end",
     {"tab", "\011", "sep", "\011", "\011", "end"}},
    {"smollm", "a\034b",
     {"a", "\034", "b"}},
    {"llama3", "Hello world\012\012  foo\015\012\011bar   \012",
     {"Hello", " world", "\012\012", " ", " foo", "\015\012", "\011bar", "   \012"}},
    {"llama3", "x  \012 y",
     {"x", "  \012", " y"}},
    {"llama3", "a\302\240b c\343\200\200d",
     {"a", "\302\240b", " c", "\343\200\200d"}},
    {"llama3", "1234567 12 x1y22",
     {"123", "456", "7", " ", "12", " x", "1", "y", "22"}},
    {"llama3", "'S 's 'll 'LL 'Re it's",
     {"'S", " '", "s", " '", "ll", " '", "LL", " '", "Re", " it", "'s"}},
    {"llama3", "(word) [x] --flag",
     {"(word", ")", " [", "x", "]", " --", "flag"}},
    {"llama3", "\346\227\245\346\234\254\350\252\236\343\203\206\343\202\255\343\202\271\343\203\210123 \303\234n\303\257c\303\266d\303\251",
     {"\346\227\245\346\234\254\350\252\236\343\203\206\343\202\255\343\202\271\343\203\210", "123", " \303\234n\303\257c\303\266d\303\251"}},
    {"llama3", "hello...world!!! ?? \012\012\012",
     {"hello", "...", "world", "!!!", " ??", " \012\012\012"}},
    {"llama3", "   ",
     {"   "}},
    {"llama3", " \012 ",
     {" \012", " "}},
    {"llama3", "tab\011sep\011\011end",
     {"tab", "\011sep", "\011", "\011end"}},
    {"llama3", "a\034b",
     {"a", "\034b"}},
    {"qwen2", "Hello world\012\012  foo\015\012\011bar   \012",
     {"Hello", " world", "\012\012", " ", " foo", "\015\012", "\011bar", "   \012"}},
    {"qwen2", "x  \012 y",
     {"x", "  \012", " y"}},
    {"qwen2", "a\302\240b c\343\200\200d",
     {"a", "\302\240b", " c", "\343\200\200d"}},
    {"qwen2", "1234567 12 x1y22",
     {"1", "2", "3", "4", "5", "6", "7", " ", "1", "2", " x", "1", "y", "2", "2"}},
    {"qwen2", "'S 's 'll 'LL 'Re it's",
     {"'S", " '", "s", " '", "ll", " '", "LL", " '", "Re", " it", "'s"}},
    {"qwen2", "(word) [x] --flag",
     {"(word", ")", " [", "x", "]", " --", "flag"}},
    {"qwen2", "\346\227\245\346\234\254\350\252\236\343\203\206\343\202\255\343\202\271\343\203\210123 \303\234n\303\257c\303\266d\303\251",
     {"\346\227\245\346\234\254\350\252\236\343\203\206\343\202\255\343\202\271\343\203\210", "1", "2", "3", " \303\234n\303\257c\303\266d\303\251"}},
    {"qwen2", "hello...world!!! ?? \012\012\012",
     {"hello", "...", "world", "!!!", " ??", " \012\012\012"}},
    {"qwen2", "   ",
     {"   "}},
    {"qwen2", " \012 ",
     {" \012", " "}},
    {"qwen2", "tab\011sep\011\011end",
     {"tab", "\011sep", "\011", "\011end"}},
    {"qwen2", "a\034b",
     {"a", "\034b"}},
};

START_TEST(test_pretokenize_reference)
{
    for (size_t i = 0; i < sizeof PIECES / sizeof PIECES[0]; i++) {
        const char *text = PIECES[i].text;
        size_t *ends, n;
        mkv_error err;
        ck_assert_msg(mkv_bpe_gpt2_pretokenize(PIECES[i].pre, text, strlen(text), &ends, &n, &err) == MKV_OK,
                      "%s", err.msg);
        size_t want_n = 0;
        while (want_n < 20 && PIECES[i].pieces[want_n])
            want_n++;
        size_t start = 0;
        for (size_t k = 0; k < n && k < want_n; k++) {
            const char *want = PIECES[i].pieces[k];
            ck_assert_msg(ends[k] - start == strlen(want) && memcmp(text + start, want, strlen(want)) == 0,
                          "%s case %zu piece %zu: got \"%.*s\", want \"%s\"", PIECES[i].pre, i, k,
                          (int)(ends[k] - start), text + start, want);
            start = ends[k];
        }
        ck_assert_msg(n == want_n, "%s case %zu: %zu pieces, want %zu", PIECES[i].pre, i, n, want_n);
        free(ends);
    }
    /* Bytes that are not UTF-8 are characters of their own; nothing is lost. */
    const char *bad = "a\xFF\xC3 b\xE2\x82";
    size_t *ends, n;
    mkv_error err;
    ck_assert_int_eq(mkv_bpe_gpt2_pretokenize("llama3", bad, strlen(bad), &ends, &n, &err), MKV_OK);
    ck_assert_uint_eq(ends[n - 1], strlen(bad));
    free(ends);
    ck_assert_int_eq(mkv_bpe_gpt2_pretokenize("nope", bad, 1, &ends, &n, &err), MKV_EUNSUP);

    ck_assert_str_eq(mkv_bpe_gpt2_pre_for_regex(
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+", 1), "smollm");
    ck_assert_str_eq(mkv_bpe_gpt2_pre_for_regex(
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
        "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", 0), "llama3");
    ck_assert_ptr_null(mkv_bpe_gpt2_pre_for_regex("\\w+", 0));
    ck_assert_int_eq(mkv_bpe_gpt2_pre_known("llama-bpe"), 1);
    ck_assert_int_eq(mkv_bpe_gpt2_pre_known("default"), 0);
}
END_TEST

/* ------------------------------------------------------------ SmolLM2 */

/* Produced by `python3 tests/gguf_ref.py ids SmolLM2-135M-Instruct.Q4_1.gguf`:
 * Hugging Face tokenizers 0.23.3 with the GGUF's vocabulary and merges read
 * by llama.cpp's gguf-py, SmolLM2's pre-tokenizer (Digits with
 * individual_digits, then ByteLevel without prefix space) and its control
 * tokens as special tokens. */
static const struct {
    const char *text;
    int32_t ids[40];
    size_t n;
} SMOL_IDS[] = {
    {"Hello, world!",
     {19556, 28, 905, 17}, 4},
    {"The capital of France is Paris.",
     {504, 3575, 282, 4649, 314, 7042, 30}, 7},
    {"I'm 12345 years old; it's 3.14159.",
     {57, 5248, 216, 33, 34, 35, 36, 37, 929, 1573, 43, 357, 506, 216, 35, 30, 33, 36, 33, 37, 41, 30}, 22},
    {"  leading spaces\012\012\011and tabs  ",
     {216, 2899, 5600, 1116, 197, 397, 29416, 256}, 8},
    {"don't DON'T we've they'll I'd",
     {12420, 982, 422, 2154, 23, 68, 392, 3543, 502, 3060, 339, 6737}, 12},
    {"\303\234n\303\257c\303\266d\303\251: na\303\257ve caf\303\251, \346\235\261\344\272\254\343\202\277\343\203\257\343\203\274, \320\237\321\200\320\270\320\262\320\265\321\202 \320\274\320\270\321\200, \331\205\330\261\330\255\330\250\330\247",
     {142, 246, 94, 25972, 83, 7466, 84, 2756, 42, 15486, 46494, 37366, 28, 17097, 247, 126, 16736, 122, 10391, 140, 11100, 124, 35130, 28, 5470, 249, 46879, 16464, 32547, 41337, 7872, 9175, 28, 36395, 20602, 44626, 31462, 10805}, 38},
    {"emoji \360\237\246\231\360\237\232\200 and symbols \342\211\244\342\211\245 \342\202\254100",
     {391, 33777, 15107, 116, 243, 10813, 244, 218, 284, 7349, 38599, 40533, 115, 24927, 33, 32, 32}, 17},
    {"<|im_start|>user\012What is the capital of France?<|im_end|>\012",
     {1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198}, 12},
};

/* Text in many scripts; SmolLM2's vocabulary lacks a few control bytes
 * (0x04, 0x06, 0x13, 0x14, 0x16, 0x1D), which the corpus avoids. */
static const char *const CORPUS[] = {
    "The quick brown fox jumps over the lazy dog. 1234567890",
    "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich.",
    "Voix ambiguë d'un cœur qui, au zéphyr, préfère les jattes de kiwis.",
    "Съешь же ещё этих мягких французских булок да выпей чаю.",
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
    "نص حكيم له سر قاطع وذو شأن عظيم مكتوب على ثوب أخضر",
    "דג סקרן שט בים מאוכזב ולפתע מצא חברה",
    "ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले",
    "いろはにほへと ちりぬるを わかよたれそ つねならむ",
    "我能吞下玻璃而不伤身体。",
    "다람쥐 헌 쳇바퀴에 타고파",
    "เป็นมนุษย์สุดประเสริฐเลิศคุณค่า",
    "e\xCC\x81 n\xCC\x83 combining marks, Z\xCD\x91\xCD\x8B" "algo",
    "Emoji: 👩‍👩‍👧‍👦 🇫🇷 🦙 ✅ — and dashes – “quotes” «guillemets»",
    "int main(void) {\n\treturn 0; // 42\r\n}\n\n\n   trailing   ",
    "'s 't 're 've 'm 'll 'd 'S 'LL  multiple   spaces\u00a0nbsp\u3000ideographic",
    "Math: ∑ᵢ xᵢ² ≤ ∞, ½ + ¼ = ¾, Ⅻ, ①②③",
    "\xF0\x90\x8D\x88 Gothic hwair, \xF0\x9D\x94\x84 fraktur, \xF0\xA0\x80\x80 ext-B",
};

static mkv_tokenizer *smol_tokenizer(const char *pre, mkv_gguf **keep)
{
    mkv_gguf *g;
    mkv_error err;
    ck_assert_msg(mkv_gguf_open(smollm2_path(), &g, &err) == MKV_OK, "%s", err.msg);
    mkv_tokenizer *t;
    if (!pre) {
        ck_assert_msg(mkv_gguf_tokenizer(g, &t, &err) == MKV_OK, "%s", err.msg);
    } else {
        /* The same vocabulary with other pre-tokenizer rules, through the
         * builder other loaders use. */
        const mkv_gguf_value *tv = mkv_gguf_find(g, "tokenizer.ggml.tokens");
        const mkv_gguf_value *mv = mkv_gguf_find(g, "tokenizer.ggml.merges");
        const char **tokens = malloc(tv->n * sizeof *tokens), **merges = malloc(mv->n * sizeof *merges);
        for (uint64_t i = 0; i < tv->n; i++)
            tokens[i] = mkv_gguf_array_item(tv, i)->v.s;
        for (uint64_t i = 0; i < mv->n; i++)
            merges[i] = mkv_gguf_array_item(mv, i)->v.s;
        ck_assert_msg(mkv_bpe_gpt2_create(tokens, NULL, (int)tv->n, merges, mv->n, pre, 1, 2, &t, &err)
                      == MKV_OK, "%s", err.msg);
        free(tokens);
        free(merges);
    }
    *keep = g;
    return t;
}

START_TEST(test_smollm2_known_ids)
{
    mkv_gguf *g;
    mkv_tokenizer *t = smol_tokenizer(NULL, &g);
    ck_assert_int_eq(t->vocab_size, 49152);
    ck_assert_int_eq(t->bos_id, 1);
    ck_assert_int_eq(t->eos_id, 2);
    for (size_t i = 0; i < sizeof SMOL_IDS / sizeof SMOL_IDS[0]; i++)
        expect_ids(t, SMOL_IDS[i].text, MKV_ENCODE_SPECIAL, SMOL_IDS[i].ids, SMOL_IDS[i].n);
    /* Without MKV_ENCODE_SPECIAL the markers are ordinary text. */
    int32_t *ids;
    size_t n;
    mkv_error err;
    ck_assert_int_eq(mkv_tokenizer_encode(t, "<|im_end|>", 10, 0, &ids, &n, &err), MKV_OK);
    ck_assert_uint_gt(n, 1);
    free(ids);
    ck_assert_int_eq(mkv_tokenizer_encode(t, "a\x04", 2, 0, &ids, &n, &err), MKV_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "byte 0x04"));

    mkv_gguf_extra x;
    ck_assert_int_eq(mkv_gguf_extra_get(g, &x, &err), MKV_OK);
    ck_assert_int_eq(x.add_bos, 0);
    ck_assert_ptr_nonnull(x.chat_template);
    ck_assert_ptr_nonnull(strstr(x.chat_template, "<|im_start|>"));
    mkv_gguf_extra_free(&x);
    ck_assert_uint_eq(mkv_gguf_version(g), 3);
    ck_assert_uint_eq(mkv_gguf_n_tensors(g), 272);
    ck_assert_int_eq(mkv_gguf_find_tensor(g, "token_embd.weight")->type, G_Q8_0);
    ck_assert_int_eq(mkv_gguf_find_tensor(g, "blk.0.attn_q.weight")->type, G_Q4_1);
    mkv_tokenizer_free(t);
    mkv_gguf_close(g);
}
END_TEST

static char *read_text(const char *path, size_t max, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    char *s = malloc(max + 1);
    *len = fread(s, 1, max, fp);
    s[*len] = '\0';
    fclose(fp);
    return s;
}

START_TEST(test_smollm2_roundtrip)
{
    static const char *const pres[] = {NULL, "gpt2", "llama3", "qwen2"};
    size_t gpl_len;
    char *gpl = read_text("/usr/share/common-licenses/GPL-3", 1 << 20, &gpl_len);
    for (size_t p = 0; p < 4; p++) {
        mkv_gguf *g;
        mkv_tokenizer *t = smol_tokenizer(pres[p], &g);
        for (size_t i = 0; i < sizeof CORPUS / sizeof CORPUS[0] + 1; i++) {
            const char *s = i < sizeof CORPUS / sizeof CORPUS[0] ? CORPUS[i] : gpl;
            if (!s)
                continue;
            size_t slen = s == gpl ? gpl_len : strlen(s);
            int32_t *ids;
            size_t n;
            mkv_error err;
            ck_assert_msg(mkv_tokenizer_encode(t, s, slen, 0, &ids, &n, &err) == MKV_OK, "%s", err.msg);
            char *back;
            size_t len;
            ck_assert_int_eq(mkv_tokenizer_decode(t, ids, n, &back, &len, &err), MKV_OK);
            ck_assert_msg(len == slen && memcmp(back, s, slen) == 0, "pre %s: \"%s\" came back as \"%s\"",
                          pres[p] ? pres[p] : "smollm", s == gpl ? "GPL-3" : s, back);
            if (s == gpl && !pres[p]) {
                printf("check_gguf: GPL-3 (%zu bytes) is %zu SmolLM2 tokens\n", slen, n);
                fflush(stdout);
            }
            free(back);
            free(ids);
        }
        mkv_tokenizer_free(t);
        mkv_gguf_close(g);
    }
    free(gpl);
}
END_TEST

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

START_TEST(test_smollm2_answers)
{
    mkv_model *m;
    mkv_tokenizer *t;
    mkv_gguf_extra x;
    mkv_error err;
    double t0 = seconds();
    ck_assert_msg(mkv_gguf_load(smollm2_path(), 0, &m, &t, &x, &err) == MKV_OK, "%s", err.msg);
    double t_load = seconds() - t0;
    ck_assert_int_eq(m->cfg.dim, 576);
    ck_assert_int_eq(m->cfg.n_layers, 30);
    ck_assert_int_eq(m->cfg.n_heads, 9);
    ck_assert_int_eq(m->cfg.n_kv_heads, 3);
    ck_assert_int_eq(m->cfg.head_dim, 64);
    ck_assert_int_eq(m->cfg.rope_dim, 64);
    ck_assert_int_eq(m->cfg.hidden_dim, 1536);
    ck_assert_int_eq(m->cfg.max_seq_len, 8192);
    ck_assert(m->cfg.rope_theta == 100000.0);
    ck_assert_int_eq(m->cfg.tied_classifier, 1);
    ck_assert_int_eq(m->cfg.eos_id, 2);
    /* Largest logits after "The capital of France is", from an independent
     * float64 numpy forward pass over tensors dequantized by llama.cpp's
     * gguf-py (`python3 tests/gguf_ref.py logits`, gguf 0.19.0). */
    static const struct { int id; double logit; } top5[] = {
        {7042, 17.371259}, {260, 14.888589}, {4528, 13.244974}, {2250, 13.009467}, {1315, 12.951514}};
    {
        int32_t capital[5] = {504, 3575, 282, 4649, 314};
        mkv_forward *f;
        mkv_forward_opts opts = {2, 8, 8};
        float *l = malloc(5 * (size_t)m->cfg.vocab_size * sizeof(float));
        ck_assert_int_eq(mkv_forward_create(m, &opts, &f, &err), MKV_OK);
        ck_assert_int_eq(mkv_forward_run(f, capital, 5, l, MKV_LOGITS_LAST, &err), MKV_OK);
        for (int i = 0; i < 5; i++) {
            ck_assert_msg(fabs((double)l[top5[i].id] - top5[i].logit) < 1e-4, "logit of %d: %.6f, reference %.6f",
                          top5[i].id, (double)l[top5[i].id], top5[i].logit);
            int above = 0; /* the reference's i-th largest is our i-th largest */
            for (int v = 0; v < m->cfg.vocab_size; v++)
                above += l[v] > l[top5[i].id];
            ck_assert_int_eq(above, i);
        }
        free(l);
        mkv_forward_free(f);
    }
    /* ChatML as the file's template writes it, without its default system turn. */
    const char *prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                         "<|im_start|>assistant\n";
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(mkv_tokenizer_encode(t, prompt, strlen(prompt), MKV_ENCODE_SPECIAL, &ids, &n, &err),
                     MKV_OK);
    mkv_forward *f;
    mkv_forward_opts opts = {2, 64, 256};
    ck_assert_int_eq(mkv_forward_create(m, &opts, &f, &err), MKV_OK);
    float *logits = malloc((size_t)m->cfg.vocab_size * sizeof(float));
    t0 = seconds();
    ck_assert_int_eq(mkv_forward_run(f, ids, n, logits, MKV_LOGITS_LAST, &err), MKV_OK);
    int32_t out[48];
    size_t k = 0;
    while (k < 48) {
        int tok = mkv_argmax(logits, m->cfg.vocab_size);
        if (tok == m->cfg.eos_id)
            break;
        out[k] = tok;
        ck_assert_int_eq(mkv_forward_run(f, &out[k], 1, logits, MKV_LOGITS_LAST, &err), MKV_OK);
        k++;
    }
    char *answer;
    size_t len;
    ck_assert_int_eq(mkv_tokenizer_decode(t, out, k, &answer, &len, &err), MKV_OK);
    printf("check_gguf: SmolLM2 (load %.2f s, %zu prompt + %zu generated tokens in %.2f s) answers: %s\n",
           t_load, n, k, seconds() - t0, answer);
    fflush(stdout);
    ck_assert_msg(strstr(answer, "Paris") != NULL, "answer without Paris: %s", answer);
    free(answer);
    free(ids);
    free(logits);
    mkv_forward_free(f);
    mkv_gguf_extra_free(&x);
    mkv_tokenizer_free(t);
    mkv_model_free(m);
}
END_TEST

/* SmolLM2's Q8_0 embedding and Q4_1 matrices kept in blocks: every row as
 * the float32 load has it, and the same logits. */
START_TEST(test_smollm2_blocks)
{
    mkv_model *floats, *blocks;
    mkv_error err;
    ck_assert_msg(mkv_gguf_load(smollm2_path(), 0, &floats, NULL, NULL, &err) == MKV_OK, "%s", err.msg);
    ck_assert_msg(mkv_gguf_load(smollm2_path(), 1, &blocks, NULL, NULL, &err) == MKV_OK, "%s", err.msg);
    ck_assert_int_eq(blocks->qtok_embedding.type, MKV_GGML_Q8_0);
    ck_assert_int_eq(blocks->layers[0].qw2.type, MKV_GGML_Q4_1);
    /* the matrices take the file's bytes: about 5 bits per Q4_1 weight */
    ck_assert_uint_lt(blocks->block_bytes, (size_t)110 << 20);
    assert_same_matrices(floats, blocks);
    assert_same_logits(floats, blocks);
    mkv_model_free(blocks);
    mkv_model_free(floats);
}
END_TEST

/* Perplexity over the first 1024 tokens of the GPL-3 text. */
START_TEST(test_smollm2_perplexity)
{
    size_t len;
    char *text = read_text("/usr/share/common-licenses/GPL-3", 1 << 16, &len);
    if (!text) {
        printf("check_gguf: perplexity skipped: /usr/share/common-licenses/GPL-3 not found\n");
        return;
    }
    mkv_model *m;
    mkv_tokenizer *t;
    mkv_error err;
    ck_assert_msg(mkv_gguf_load(smollm2_path(), 0, &m, &t, NULL, &err) == MKV_OK, "%s", err.msg);
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(mkv_tokenizer_encode(t, text, len, 0, &ids, &n, &err), MKV_OK);
    ck_assert_uint_ge(n, 1024);
    const size_t total = 1024, chunk = 128, vocab = (size_t)m->cfg.vocab_size;
    mkv_forward *f;
    mkv_forward_opts opts = {2, (int)chunk, (int)total};
    ck_assert_int_eq(mkv_forward_create(m, &opts, &f, &err), MKV_OK);
    float *logits = malloc(chunk * vocab * sizeof(float));
    double nll = 0.0, t0 = seconds();
    size_t predicted = 0;
    for (size_t at = 0; at < total; at += chunk) {
        ck_assert_int_eq(mkv_forward_run(f, ids + at, chunk, logits, MKV_LOGITS_ALL, &err), MKV_OK);
        for (size_t j = 0; j < chunk && at + j + 1 < total; j++) {
            const float *l = logits + j * vocab;
            double mx = l[0], sum = 0.0;
            for (size_t v = 1; v < vocab; v++)
                mx = l[v] > mx ? l[v] : mx;
            for (size_t v = 0; v < vocab; v++)
                sum += exp((double)l[v] - mx);
            nll -= (double)l[ids[at + j + 1]] - mx - log(sum);
            predicted++;
        }
    }
    double ppl = exp(nll / (double)predicted);
    printf("check_gguf: SmolLM2 perplexity over the first %zu tokens of GPL-3: %.3f (%.2f s)\n", total,
           ppl, seconds() - t0);
    fflush(stdout);
    ck_assert_msg(isfinite(ppl) && ppl > 2.0 && ppl < 60.0, "implausible perplexity %g", ppl);
    free(logits);
    free(ids);
    free(text);
    mkv_forward_free(f);
    mkv_tokenizer_free(t);
    mkv_model_free(m);
}
END_TEST

/* 4 MiB of text without digits under the SmolLM2 rules, split piece by
 * piece against the hand-made split of its repeated line. The split is
 * linear in the text: a split that rescanned the rest of a digit-free
 * fragment for every piece would do about 10^12 character steps here,
 * hours rather than the fraction of a second this takes, and would run
 * out of this test case's timeout by far. */
START_TEST(test_pretokenize_smollm_long_text)
{
    static const char *const line[] = {"Hello", " world", ",", " it", "'s", " ", " a", " test", "!", "\n"};
    const size_t n_line = sizeof line / sizeof line[0];
    size_t line_len = 0;
    for (size_t k = 0; k < n_line; k++)
        line_len += strlen(line[k]);
    const size_t reps = (4u << 20) / line_len;
    /* digits at the end: each is a piece of its own, after the last fragment */
    static const char *const tail[] = {"x", "1", "2"};
    const size_t len = reps * line_len + 3;
    char *text = malloc(len);
    ck_assert_ptr_nonnull(text);
    for (size_t r = 0; r < reps; r++) {
        char *at = text + r * line_len;
        for (size_t k = 0; k < n_line; k++) {
            memcpy(at, line[k], strlen(line[k]));
            at += strlen(line[k]);
        }
    }
    memcpy(text + reps * line_len, "x12", 3);

    size_t *ends, n;
    mkv_error err;
    ck_assert_msg(mkv_bpe_gpt2_pretokenize("smollm", text, len, &ends, &n, &err) == MKV_OK, "%s", err.msg);
    ck_assert_uint_eq(n, reps * n_line + 3);
    size_t start = 0, wrong = 0, first_wrong = 0;
    for (size_t k = 0; k < n; k++) {
        size_t want = strlen(k < reps * n_line ? line[k % n_line] : tail[k - reps * n_line]);
        if (ends[k] != start + want && wrong++ == 0)
            first_wrong = k;
        start += want;
    }
    ck_assert_msg(wrong == 0, "%zu pieces end in the wrong place, the first is piece %zu", wrong, first_wrong);
    ck_assert_uint_eq(ends[n - 1], len);
    free(ends);
    free(text);
}
END_TEST

int main(void)
{
    int have_stories = test_models_dir() != NULL, have_smol = smollm2_path() != NULL;
    int have_fixture = test_write_fixture("check_gguf");
    Suite *s = suite_create("gguf");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_metadata_all_types);
    tcase_add_test(tc, test_dequantize_types);
    tcase_add_test(tc, test_dequantize_vector_equals_scalar);
    tcase_add_test(tc, test_dot_rows_equal_double);
    tcase_add_test(tc, test_unsupported_type_named);
    tcase_add_test(tc, test_release_keeps_contents);
    tcase_add_test(tc, test_truncated_everywhere);
    tcase_add_test(tc, test_random_corruption);
    tcase_add_test(tc, test_corrupt_headers);
    tcase_add_test(tc, test_corrupt_structures);
    tcase_add_test(tc, test_llama_round_trip);
    tcase_add_test(tc, test_llama_quantized_matrices);
    tcase_add_test(tc, test_llama_blocks_tied);
    tcase_add_test(tc, test_llama_errors);
    tcase_add_test(tc, test_llama_unsupported_quant);
    tcase_add_test(tc, test_llama3_rope_freqs);
    tcase_add_test(tc, test_rope_scaling_metadata);
    tcase_add_test(tc, test_vocab_from_metadata);
    tcase_add_test(tc, test_bpe_by_hand);
    tcase_add_test(tc, test_pretokenize_reference);
    test_add_model_loop(tc, test_llama2c_gguf_equivalence, have_fixture, have_stories);
    if (have_smol) {
        tcase_add_test(tc, test_smollm2_known_ids);
        tcase_add_test(tc, test_smollm2_roundtrip);
        tcase_add_test(tc, test_smollm2_answers);
        tcase_add_test(tc, test_smollm2_perplexity);
        tcase_add_test(tc, test_smollm2_blocks);
    }
    suite_add_tcase(s, tc);
    TCase *long_text = tcase_create("long-text");
    tcase_set_timeout(long_text, 20);
    tcase_add_test(long_text, test_pretokenize_smollm_long_text);
    suite_add_tcase(s, long_text);
    int status = test_run(s);
    if (!have_stories)
        printf("check_gguf: stories260K.bin/tok512.bin not found (set MKV_MODELS_DIR, default "
               "../shared/models): its published ids and sample through GGUF skipped\n");
    if (!have_smol)
        printf("check_gguf: SmolLM2 GGUF not found (run scripts/get-models, or set MKV_SMOLLM2): "
               "SmolLM2 tokenizer and model tests skipped\n");
    /* real models no test can write are said above; only the missing
     * fixture (no numpy) leaves too little run to call it a pass */
    if (status == EXIT_SUCCESS && !have_fixture)
        return 77;
    return status;
}
