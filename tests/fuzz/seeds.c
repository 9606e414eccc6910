/* fuzz_seeds DIR: write the seed inputs of the harnesses whose formats no
 * tool of this project writes, straight from the formats' descriptions
 * (the headers named below; man/mosaickv.5), one directory per harness:
 *
 *   DIR/npy/             .npy v1, v2 and v3: a KV cache [L, 2, KH, T, D]
 *                        that imports, other dtypes and shapes (io/npy.h)
 *   DIR/safetensors/     a KV cache with queries, tokens and positions that
 *                        imports; every dtype, a scalar, an empty tensor
 *                        (io/safetensors.h)
 *   DIR/gguf/            a tiny "llama" model with a sentencepiece
 *                        vocabulary; a "gpt2" vocabulary with merges and
 *                        quantized tensors; metadata of every type
 *                        (io/gguf.h, model/gguf.h)
 *   DIR/llama2c/         tiny checkpoints, tied and untied (model/model.h)
 *   DIR/tokenizer/       tokenizer.bin with byte fallback (vocab/tokenizer.h)
 *   DIR/tokenizer_json/  byte-level and sentencepiece-style tokenizer.json,
 *                        one followed by NUL and tokenizer_config.json
 *                        (vocab/tokenizer_json.h, tests/fuzz/fuzz_tokenizer_json.c)
 *   DIR/hf_config/       config.json of LLaMA, Llama 3.1 (rope_scaling),
 *                        Mistral (sliding window) and Qwen2 (model/hf.h)
 *   DIR/methods/         two bytes each: every method of the first 16 of the
 *                        registry with each parameter set, undamaged
 *                        (tests/fuzz/fuzz_methods.c)
 *
 * Every file is small (at most a few KB) and the same on every run; DIR/llama2c
 * also gets the matching tokenizer.bin as DIR/tokenizer.bin, for
 * tests/fuzz/make-corpus to capture a dump from the model. */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *out_dir;

typedef struct {
    unsigned char *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *data, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 256;
        b->p = realloc(b->p, b->cap);
        if (!b->p) {
            perror("fuzz_seeds");
            exit(1);
        }
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void put_le(buf *b, uint64_t v, int width)
{
    unsigned char x[8];
    for (int i = 0; i < width; i++)
        x[i] = (unsigned char)(v >> (8 * i));
    put(b, x, (size_t)width);
}

static void u8(buf *b, unsigned v) { put_le(b, v, 1); }
static void u16(buf *b, unsigned v) { put_le(b, v, 2); }
static void u32(buf *b, uint32_t v) { put_le(b, v, 4); }
static void u64(buf *b, uint64_t v) { put_le(b, v, 8); }
static void f32(buf *b, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u32(b, u);
}
static void f64(buf *b, double f)
{
    uint64_t u;
    memcpy(&u, &f, 8);
    u64(b, u);
}
static void text(buf *b, const char *s) { put(b, s, strlen(s)); }
static void printf_buf(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void printf_buf(buf *b, const char *fmt, ...)
{
    char tmp[8192];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp) {
        fprintf(stderr, "fuzz_seeds: text too long\n");
        exit(1);
    }
    put(b, tmp, (size_t)n);
}

/* float32 -> float16 bits (round to nearest; the seeds hold small values) */
static unsigned half(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    unsigned sign = (x >> 16) & 0x8000;
    int exp = (int)((x >> 23) & 0xff) - 127 + 15;
    uint32_t mant = x & 0x7fffff;
    if (exp <= 0)
        return sign;
    if (exp >= 31)
        return sign | 0x7c00;
    return sign | (unsigned)(exp << 10) | (unsigned)((mant + 0x1000) >> 13);
}

/* A deterministic value for element i of array `salt`. */
static float value(int salt, int i)
{
    uint32_t h = (uint32_t)salt * 2654435761u ^ (uint32_t)i * 40503u;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    return ((float)(h % 2001) - 1000.0f) / 1000.0f;
}

static void write_file(const char *sub, const char *name, const buf *b)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", out_dir, sub);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "fuzz_seeds: cannot make '%s': %s\n", path, strerror(errno));
        exit(1);
    }
    snprintf(path, sizeof path, "%s/%s/%s", out_dir, sub, name);
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(b->p, 1, b->n, fp) != b->n || fclose(fp) != 0) {
        fprintf(stderr, "fuzz_seeds: cannot write '%s': %s\n", path, strerror(errno));
        exit(1);
    }
}

static void write_done(const char *sub, const char *name, buf *b)
{
    write_file(sub, name, b);
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ---------------------------------------------------------------- npy */

static void npy(const char *name, int major, const char *descr, const char *shape, size_t elem, size_t numel,
                int is_int)
{
    buf b = {0};
    char dict[256];
    snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, shape);
    size_t pre = 6 + 2 + (major == 1 ? 2 : 4);
    size_t hlen = strlen(dict) + 1;
    size_t pad = (64 - (pre + hlen) % 64) % 64;
    text(&b, "\x93NUMPY");
    u8(&b, (unsigned)major);
    u8(&b, 0);
    if (major == 1)
        u16(&b, (unsigned)(hlen + pad));
    else
        u32(&b, (uint32_t)(hlen + pad));
    text(&b, dict);
    for (size_t i = 0; i < pad; i++)
        u8(&b, ' ');
    u8(&b, '\n');
    for (size_t i = 0; i < numel; i++) {
        float v = value((int)elem, (int)i);
        if (is_int)
            put_le(&b, (uint64_t)(int64_t)(v * 100), (int)elem);
        else if (elem == 2)
            u16(&b, half(v));
        else if (elem == 4)
            f32(&b, v);
        else
            f64(&b, v);
    }
    write_done("npy", name, &b);
}

static void seeds_npy(void)
{
    npy("kv-f4-v1.npy", 1, "<f4", "(1, 2, 1, 8, 4)", 4, 64, 0);
    npy("kv-f2-v2.npy", 2, "<f2", "(2, 2, 2, 4, 2)", 2, 64, 0);
    npy("kv-f8-v3.npy", 3, "<f8", "(1, 2, 1, 4, 2)", 8, 16, 0);
    npy("i4.npy", 1, "<i4", "(2, 3)", 4, 6, 1);
    npy("i8-scalar.npy", 1, "<i8", "()", 8, 1, 1);
    npy("f4-empty.npy", 1, "<f4", "(0,)", 4, 0, 0);
}

/* ---------------------------------------------------------------- safetensors */

typedef struct {
    const char *name, *dtype, *shape;  /* shape as JSON, e.g. "[1, 8, 4]" */
    size_t elem, numel;
    int kind;                          /* 0 float, 1 integer, 2 bool */
} st_entry;

static void safetensors(const char *name, const st_entry *e, int n, const char *metadata)
{
    buf header = {0}, data = {0};
    text(&header, "{");
    if (metadata)
        printf_buf(&header, "\"__metadata__\": %s, ", metadata);
    for (int i = 0; i < n; i++) {
        size_t begin = data.n;
        for (size_t k = 0; k < e[i].numel; k++) {
            float v = value(i + 7, (int)k);
            if (e[i].kind == 2)
                u8(&data, v > 0);
            else if (e[i].kind == 1)
                put_le(&data, (uint64_t)(int64_t)(k % 8), (int)e[i].elem);
            else if (strcmp(e[i].dtype, "BF16") == 0) {
                uint32_t u;
                memcpy(&u, &v, 4);
                u16(&data, u >> 16);
            } else if (e[i].elem == 2)
                u16(&data, half(v));
            else if (e[i].elem == 4)
                f32(&data, v);
            else
                f64(&data, v);
        }
        printf_buf(&header, "%s\"%s\": {\"dtype\": \"%s\", \"shape\": %s, \"data_offsets\": [%zu, %zu]}", i ? ", " : "",
                   e[i].name, e[i].dtype, e[i].shape, begin, data.n);
    }
    text(&header, "}");
    while (header.n % 8)
        text(&header, " ");
    buf b = {0};
    u64(&b, header.n);
    put(&b, header.p, header.n);
    put(&b, data.p, data.n);
    write_done("safetensors", name, &b);
    free(header.p);
    free(data.p);
}

static void seeds_safetensors(void)
{
    const st_entry kv[] = {
        {"layers.0.k", "F16", "[1, 8, 4]", 2, 32, 0},
        {"layers.0.v", "F16", "[1, 8, 4]", 2, 32, 0},
        {"layers.0.q", "F32", "[2, 2, 4]", 4, 16, 0},
        {"tokens", "I32", "[8]", 4, 8, 1},
        {"query_pos", "I32", "[2]", 4, 2, 1},
    };
    safetensors("kv-queries.safetensors", kv, 5, "{\"format\": \"pt\"}");
    const st_entry two[] = {
        {"layers.0.k", "BF16", "[2, 4, 2]", 2, 16, 0},
        {"layers.0.v", "BF16", "[2, 4, 2]", 2, 16, 0},
        {"layers.1.k", "F32", "[2, 4, 2]", 4, 16, 0},
        {"layers.1.v", "F64", "[2, 4, 2]", 8, 16, 0},
    };
    safetensors("kv-two-layers.safetensors", two, 4, NULL);
    const st_entry all[] = {
        {"bool", "BOOL", "[3]", 1, 3, 2},     {"u8", "U8", "[2, 2]", 1, 4, 1},   {"i8", "I8", "[2]", 1, 2, 1},
        {"i16", "I16", "[2]", 2, 2, 1},       {"u16", "U16", "[2]", 2, 2, 1},    {"i32", "I32", "[2]", 4, 2, 1},
        {"u32", "U32", "[2]", 4, 2, 1},       {"i64", "I64", "[2]", 8, 2, 1},    {"u64", "U64", "[2]", 8, 2, 1},
        {"f8", "F8_E4M3", "[2]", 1, 2, 1},    {"f8b", "F8_E5M2", "[2]", 1, 2, 1}, {"scalar", "F32", "[]", 4, 1, 0},
        {"empty", "F16", "[0, 4]", 2, 0, 0},  {"f64", "F64", "[1, 1, 2]", 8, 2, 0},
    };
    safetensors("dtypes.safetensors", all, 14, "{\"a\": \"b\", \"c\": \"\"}");
}

/* ---------------------------------------------------------------- GGUF */

/* Byte b as GPT-2's byte-level vocabularies spell it (bytes_to_unicode:
 * printable bytes stand for themselves, the others are U+0100 + n in
 * order), UTF-8 into u; returns its length. */
static size_t gpt2_byte(int b, char u[4])
{
#define PRINTABLE(c) (((c) >= 33 && (c) <= 126) || ((c) >= 161 && (c) <= 172) || (c) >= 174)
    int cp = b;
    if (!PRINTABLE(b)) {
        cp = 256;
        for (int c = 0; c < b; c++)
            cp += !PRINTABLE(c);
    }
#undef PRINTABLE
    if (cp < 0x80) {
        u[0] = (char)cp;
        return 1;
    }
    u[0] = (char)(0xc0 | (cp >> 6));
    u[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
}

enum { G_U8, G_I8, G_U16, G_I16, G_U32, G_I32, G_F32, G_BOOL, G_STR, G_ARR, G_U64, G_I64, G_F64 };

typedef struct {
    buf kv, info, data;
    uint64_t n_kv, n_tensors;
} gguf;

static void g_str(buf *b, const char *s, size_t n)
{
    u64(b, n);
    put(b, s, n);
}

static void g_key(gguf *g, const char *key, uint32_t type)
{
    g_str(&g->kv, key, strlen(key));
    u32(&g->kv, type);
    g->n_kv++;
}

static void g_u32(gguf *g, const char *key, uint32_t v)
{
    g_key(g, key, G_U32);
    u32(&g->kv, v);
}

static void g_f32(gguf *g, const char *key, float v)
{
    g_key(g, key, G_F32);
    f32(&g->kv, v);
}

static void g_string(gguf *g, const char *key, const char *v)
{
    g_key(g, key, G_STR);
    g_str(&g->kv, v, strlen(v));
}

/* A tensor of type ggml_type with ne[0..n_dims) and its bytes. */
static void g_tensor(gguf *g, const char *name, uint32_t ggml_type, int n_dims, const uint64_t *ne,
                     const buf *bytes)
{
    while (g->data.n % 32)
        u8(&g->data, 0);
    g_str(&g->info, name, strlen(name));
    u32(&g->info, (uint32_t)n_dims);
    for (int i = 0; i < n_dims; i++)
        u64(&g->info, ne[i]);
    u32(&g->info, ggml_type);
    u64(&g->info, g->data.n);
    put(&g->data, bytes->p, bytes->n);
    g->n_tensors++;
}

/* A float32 tensor of ne0 x ne1 (ne1 0: a vector) of deterministic values. */
static void g_f32_tensor(gguf *g, const char *name, uint64_t ne0, uint64_t ne1, int salt)
{
    buf b = {0};
    uint64_t n = ne0 * (ne1 ? ne1 : 1);
    for (uint64_t i = 0; i < n; i++)
        f32(&b, ne1 ? 0.3f * value(salt, (int)i) : 1.0f + 0.1f * value(salt, (int)i));
    uint64_t ne[2] = {ne0, ne1};
    g_tensor(g, name, 0, ne1 ? 2 : 1, ne, &b);
    free(b.p);
}

static void g_write(gguf *g, const char *name, uint32_t version)
{
    buf b = {0};
    text(&b, "GGUF");
    u32(&b, version);
    u64(&b, g->n_tensors);
    u64(&b, g->n_kv);
    put(&b, g->kv.p, g->kv.n);
    put(&b, g->info.p, g->info.n);
    while (b.n % 32)
        u8(&b, 0);
    put(&b, g->data.p, g->data.n);
    write_done("gguf", name, &b);
    free(g->kv.p);
    free(g->info.p);
    free(g->data.p);
    memset(g, 0, sizeof *g);
}

/* The tiny model of every seed: dim 8, hidden 16, one layer, two query
 * heads on one KV head (head_dim 4), context 16. */
#define M_DIM 8
#define M_HIDDEN 16
#define M_LAYERS 1
#define M_HEADS 2
#define M_KV 1
#define M_HD 4
#define M_SEQ 16

/* A sentencepiece vocabulary of 3 specials, 256 byte pieces and a few
 * words: what llama2.c's tokenizer.bin and GGUF "llama" vocabularies hold. */
#define SPM_WORDS 8
static const char *const spm_words[SPM_WORDS] = {" ", "a", "b", " a", "ab", " ab", "Once", " upon"};
#define SPM_VOCAB (3 + 256 + SPM_WORDS)

static void spm_piece(int id, char *out, int spell_space)
{
    if (id < 3) {
        strcpy(out, id == 0 ? "<unk>" : id == 1 ? "<s>" : "</s>");
    } else if (id < 259) {
        snprintf(out, 8, "<0x%02X>", id - 3);
    } else {
        const char *w = spm_words[id - 259];
        char *o = out;
        for (; *w; w++)
            if (*w == ' ' && spell_space) {
                memcpy(o, "\xe2\x96\x81", 3);
                o += 3;
            } else {
                *o++ = *w;
            }
        *o = '\0';
    }
}

static void seeds_gguf(void)
{
    gguf g = {0};
    /* a llama model with its vocabulary */
    g_string(&g, "general.architecture", "llama");
    g_string(&g, "general.name", "fuzz-tiny");
    g_u32(&g, "llama.context_length", M_SEQ);
    g_u32(&g, "llama.embedding_length", M_DIM);
    g_u32(&g, "llama.feed_forward_length", M_HIDDEN);
    g_u32(&g, "llama.block_count", M_LAYERS);
    g_u32(&g, "llama.attention.head_count", M_HEADS);
    g_u32(&g, "llama.attention.head_count_kv", M_KV);
    g_u32(&g, "llama.rope.dimension_count", M_HD);
    g_f32(&g, "llama.rope.freq_base", 10000.0f);
    g_f32(&g, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    g_string(&g, "tokenizer.ggml.model", "llama");
    g_key(&g, "tokenizer.ggml.tokens", G_ARR);
    u32(&g.kv, G_STR);
    u64(&g.kv, SPM_VOCAB);
    for (int id = 0; id < SPM_VOCAB; id++) {
        char piece[32];
        spm_piece(id, piece, 1);
        g_str(&g.kv, piece, strlen(piece));
    }
    g_key(&g, "tokenizer.ggml.scores", G_ARR);
    u32(&g.kv, G_F32);
    u64(&g.kv, SPM_VOCAB);
    for (int id = 0; id < SPM_VOCAB; id++)
        f32(&g.kv, id < 259 ? 0.0f : (float)-(id - 259));
    g_key(&g, "tokenizer.ggml.token_type", G_ARR);
    u32(&g.kv, G_I32);
    u64(&g.kv, SPM_VOCAB);
    for (int id = 0; id < SPM_VOCAB; id++)
        u32(&g.kv, id == 0 ? 2 : id < 3 ? 3 : id < 259 ? 6 : 1);
    g_u32(&g, "tokenizer.ggml.bos_token_id", 1);
    g_u32(&g, "tokenizer.ggml.eos_token_id", 2);
    g_u32(&g, "tokenizer.ggml.unknown_token_id", 0);
    g_key(&g, "tokenizer.ggml.add_bos_token", G_BOOL);
    u8(&g.kv, 1);
    g_string(&g, "tokenizer.chat_template", "{% for m in messages %}{{ m['content'] }}{% endfor %}");
    g_f32_tensor(&g, "token_embd.weight", M_DIM, SPM_VOCAB, 1);
    g_f32_tensor(&g, "blk.0.attn_norm.weight", M_DIM, 0, 2);
    g_f32_tensor(&g, "blk.0.attn_q.weight", M_DIM, M_HEADS * M_HD, 3);
    g_f32_tensor(&g, "blk.0.attn_k.weight", M_DIM, M_KV * M_HD, 4);
    g_f32_tensor(&g, "blk.0.attn_v.weight", M_DIM, M_KV * M_HD, 5);
    g_f32_tensor(&g, "blk.0.attn_output.weight", M_HEADS * M_HD, M_DIM, 6);
    g_f32_tensor(&g, "blk.0.ffn_norm.weight", M_DIM, 0, 7);
    g_f32_tensor(&g, "blk.0.ffn_gate.weight", M_DIM, M_HIDDEN, 8);
    g_f32_tensor(&g, "blk.0.ffn_down.weight", M_HIDDEN, M_DIM, 9);
    g_f32_tensor(&g, "blk.0.ffn_up.weight", M_DIM, M_HIDDEN, 10);
    g_f32_tensor(&g, "output_norm.weight", M_DIM, 0, 11);
    g_write(&g, "llama-spm.gguf", 3);

    /* a gpt2 vocabulary (bytes as GPT-2 spells them, two merges) and
     * tensors of the quantized types, no model */
    g_string(&g, "general.architecture", "gpt2");
    g_string(&g, "tokenizer.ggml.model", "gpt2");
    g_string(&g, "tokenizer.ggml.pre", "smollm");
    g_key(&g, "tokenizer.ggml.tokens", G_ARR);
    u32(&g.kv, G_STR);
    u64(&g.kv, 256 + 3);
    for (int b = 0; b < 256; b++) {
        char u[4];
        g_str(&g.kv, u, gpt2_byte(b, u));
    }
    g_str(&g.kv, "ab", 2);
    g_str(&g.kv, "\xc4\xa0" "ab", 4);
    g_str(&g.kv, "<|endoftext|>", 13);
    g_key(&g, "tokenizer.ggml.merges", G_ARR);
    u32(&g.kv, G_STR);
    u64(&g.kv, 2);
    g_str(&g.kv, "a b", 3);
    g_str(&g.kv, "\xc4\xa0 ab", 5);
    g_key(&g, "tokenizer.ggml.token_type", G_ARR);
    u32(&g.kv, G_I32);
    u64(&g.kv, 259);
    for (int id = 0; id < 259; id++)
        u32(&g.kv, id == 258 ? 3 : 1);
    g_u32(&g, "tokenizer.ggml.eos_token_id", 258);
    buf q = {0};
    /* Q8_0 (type 8): a float16 scale and 32 int8 */
    u16(&q, half(0.05f));
    for (int i = 0; i < 32; i++)
        u8(&q, (unsigned)(i * 7 - 100) & 0xff);
    uint64_t ne32[1] = {32};
    g_tensor(&g, "q8_0", 8, 1, ne32, &q);
    free(q.p);
    memset(&q, 0, sizeof q);
    /* Q4_0 (type 2): a float16 scale and 16 bytes of two 4-bit codes */
    u16(&q, half(0.1f));
    for (int i = 0; i < 16; i++)
        u8(&q, (unsigned)(i * 17) & 0xff);
    g_tensor(&g, "q4_0", 2, 1, ne32, &q);
    free(q.p);
    memset(&q, 0, sizeof q);
    for (int i = 0; i < 8; i++)
        u16(&q, half(value(3, i)));
    uint64_t ne42[2] = {4, 2};
    g_tensor(&g, "f16", 1, 2, ne42, &q);
    free(q.p);
    g_write(&g, "gpt2-quant.gguf", 3);

    /* metadata of every type, version 2 */
    g_u32(&g, "general.alignment", 32);
    g_key(&g, "t.u8", G_U8), u8(&g.kv, 200);
    g_key(&g, "t.i8", G_I8), u8(&g.kv, 0x80);
    g_key(&g, "t.u16", G_U16), u16(&g.kv, 65535);
    g_key(&g, "t.i16", G_I16), u16(&g.kv, 0xfffe);
    g_key(&g, "t.i32", G_I32), u32(&g.kv, 0x80000000u);
    g_f32(&g, "t.f32", 1.5f);
    g_key(&g, "t.bool", G_BOOL), u8(&g.kv, 1);
    g_key(&g, "t.str_nul", G_STR), g_str(&g.kv, "a\0b", 3);
    g_key(&g, "t.u64", G_U64), u64(&g.kv, UINT64_MAX);
    g_key(&g, "t.i64", G_I64), u64(&g.kv, (uint64_t)-5);
    g_key(&g, "t.f64", G_F64), f64(&g.kv, -0.125);
    g_key(&g, "t.arr_u8", G_ARR), u32(&g.kv, G_U8), u64(&g.kv, 2), u8(&g.kv, 1), u8(&g.kv, 255);
    g_key(&g, "t.arr_empty", G_ARR), u32(&g.kv, G_I16), u64(&g.kv, 0);
    g_key(&g, "t.nested", G_ARR), u32(&g.kv, G_ARR), u64(&g.kv, 2);
    u32(&g.kv, G_I16), u64(&g.kv, 2), u16(&g.kv, 1), u16(&g.kv, 2);
    u32(&g.kv, G_STR), u64(&g.kv, 1), g_str(&g.kv, "x", 1);
    g_f32_tensor(&g, "x", 4, 0, 12);
    g_write(&g, "metadata-v2.gguf", 2);
}

/* ---------------------------------------------------------------- llama2.c */

static void llama2c(const char *name, int untied, int vocab)
{
    buf b = {0};
    int32_t hdr[7] = {M_DIM, M_HIDDEN, M_LAYERS, M_HEADS, M_KV, untied ? -vocab : vocab, M_SEQ};
    for (int i = 0; i < 7; i++)
        u32(&b, (uint32_t)hdr[i]);
    int salt = 0;
#define ARRAY(n, center)                                 \
    for (int i = 0, s_ = ++salt; i < (n); i++)           \
        f32(&b, (center) + 0.3f * value(s_, i));
    ARRAY(vocab * M_DIM, 0.0f);                       /* token embedding */
    ARRAY(M_LAYERS * M_DIM, 1.0f);                    /* rms_att */
    ARRAY(M_LAYERS * M_DIM * M_HEADS * M_HD, 0.0f);   /* wq */
    ARRAY(M_LAYERS * M_DIM * M_KV * M_HD, 0.0f);      /* wk */
    ARRAY(M_LAYERS * M_DIM * M_KV * M_HD, 0.0f);      /* wv */
    ARRAY(M_LAYERS * M_HEADS * M_HD * M_DIM, 0.0f);   /* wo */
    ARRAY(M_LAYERS * M_DIM, 1.0f);                    /* rms_ffn */
    ARRAY(M_LAYERS * M_HIDDEN * M_DIM, 0.0f);         /* w1 */
    ARRAY(M_LAYERS * M_DIM * M_HIDDEN, 0.0f);         /* w2 */
    ARRAY(M_LAYERS * M_HIDDEN * M_DIM, 0.0f);         /* w3 */
    ARRAY(M_DIM, 1.0f);                               /* rms_final */
    ARRAY(M_SEQ * M_HD, 0.0f);                        /* the legacy RoPE tables, real and imaginary */
    if (untied)
        ARRAY(vocab * M_DIM, 0.0f);                   /* classifier */
#undef ARRAY
    write_done("llama2c", name, &b);
}

static void tokenizer_bin(const char *sub, const char *name)
{
    buf b = {0};
    u32(&b, 16);
    for (int id = 0; id < SPM_VOCAB; id++) {
        char piece[32];
        spm_piece(id, piece, 0);
        f32(&b, id < 259 ? 0.0f : (float)-(id - 259));
        u32(&b, (uint32_t)strlen(piece));
        text(&b, piece);
    }
    write_done(sub, name, &b);
}

static void seeds_llama2c(void)
{
    llama2c("tied.bin", 0, SPM_VOCAB);
    llama2c("untied-small-vocab.bin", 1, 5);
    tokenizer_bin("tokenizer", "tokenizer.bin");
    tokenizer_bin(".", "tokenizer.bin");
}

/* ---------------------------------------------------------------- tokenizer.json */

static void json_piece(buf *b, const char *s)
{
    text(b, "\"");
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            printf_buf(b, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            printf_buf(b, "\\u%04x", (unsigned char)*s);
        else
            put(b, s, 1);
    }
    text(b, "\"");
}

static void seeds_tokenizer_json(void)
{
    /* sentencepiece style: Metaspace, byte fallback, rank-ordered merges */
    buf b = {0};
    text(&b, "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null, \"added_tokens\": ["
             "{\"id\": 0, \"content\": \"<unk>\", \"special\": true}, "
             "{\"id\": 1, \"content\": \"<s>\", \"special\": true}, "
             "{\"id\": 2, \"content\": \"</s>\", \"special\": true}],\n"
             "\"normalizer\": null,\n\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\xe2\x96\x81\", "
             "\"prepend_scheme\": \"first\", \"split\": false},\n"
             "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", "
             "\"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"pair\": [], \"special_tokens\": {}},\n"
             "\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": "
             "\"\xe2\x96\x81\"}, \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, "
             "{\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]},\n"
             "\"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": \"<unk>\", "
             "\"continuing_subword_prefix\": null, \"end_of_word_suffix\": null, \"fuse_unk\": true, "
             "\"byte_fallback\": true, \"ignore_merges\": false, \"vocab\": {");
    for (int id = 0; id < SPM_VOCAB; id++) {
        char piece[32];
        spm_piece(id, piece, 1);
        text(&b, id ? ", " : "");
        json_piece(&b, piece);
        printf_buf(&b, ": %d", id);
    }
    text(&b, "},\n\"merges\": [\"a b\", \"\xe2\x96\x81 a\", \"\xe2\x96\x81 ab\", \"\xe2\x96\x81" "a b\"]}}\n");
    write_file("tokenizer_json", "spm-metaspace.json", &b);
    /* the same with tokenizer_config.json after a NUL */
    u8(&b, 0);
    text(&b, "{\"add_bos_token\": true, \"add_eos_token\": false, \"bos_token\": {\"__type\": \"AddedToken\", "
             "\"content\": \"<s>\", \"special\": true}, \"eos_token\": \"</s>\", \"unk_token\": \"<unk>\", "
             "\"chat_template\": \"{% for m in messages %}{{ m['content'] }}{% endfor %}\"}\n");
    write_done("tokenizer_json", "spm-with-config.json", &b);

    /* byte-level (SmolLM's digits-then-ByteLevel), merges as pairs */
    text(&b, "{\"version\": \"1.0\", \"added_tokens\": ["
             "{\"id\": 259, \"content\": \"<|endoftext|>\", \"special\": true},"
             "{\"id\": 260, \"content\": \"<|im_start|>\", \"special\": true}],\n"
             "\"normalizer\": null,\n\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
             "{\"type\": \"Digits\", \"individual_digits\": true}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
             "\"trim_offsets\": true, \"use_regex\": true}]},\n"
             "\"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": false, "
             "\"use_regex\": false},\n\"decoder\": {\"type\": \"ByteLevel\"},\n"
             "\"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, \"continuing_subword_prefix\": \"\", "
             "\"end_of_word_suffix\": \"\", \"fuse_unk\": false, \"byte_fallback\": false, \"vocab\": {");
    for (int c = 0; c < 256; c++) {
        char u[4] = {0};
        gpt2_byte(c, u);
        text(&b, c ? ", " : "");
        json_piece(&b, u);
        printf_buf(&b, ": %d", c);
    }
    text(&b, ", \"ab\": 256, \"\xc4\xa0" "a\": 257, \"\xc4\xa0" "ab\": 258},\n"
             "\"merges\": [[\"a\", \"b\"], [\"\xc4\xa0\", \"a\"], [\"\xc4\xa0" "a\", \"b\"]]}}\n");
    write_done("tokenizer_json", "byte-level-smollm.json", &b);

    /* GPT-2's lone ByteLevel pre-tokenizer, merges as strings, a tiny vocabulary */
    text(&b, "{\"added_tokens\": [], \"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\", "
             "\"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": true}, \"decoder\": "
             "{\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, "
             "\"\\u0120\": 3}, \"merges\": [\"a b\"]}}\n");
    write_done("tokenizer_json", "byte-level-gpt2.json", &b);
}

/* ---------------------------------------------------------------- config.json */

static void seeds_hf_config(void)
{
    const char *common =
        "\"hidden_size\": 8, \"intermediate_size\": 16, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
        "\"num_key_value_heads\": 1, \"max_position_embeddings\": 64, \"vocab_size\": 32, \"rms_norm_eps\": 1e-05, "
        "\"hidden_act\": \"silu\", \"torch_dtype\": \"bfloat16\"";
    buf b = {0};
    printf_buf(&b, "{\"architectures\": [\"LlamaForCausalLM\"], %s, \"rope_theta\": 10000.0, \"rope_scaling\": null, "
                   "\"tie_word_embeddings\": true, \"bos_token_id\": 1, \"eos_token_id\": 2}\n", common);
    write_done("hf_config", "llama.json", &b);
    printf_buf(&b, "{\"architectures\": [\"LlamaForCausalLM\"], %s, \"rope_theta\": 500000.0, \"rope_scaling\": "
                   "{\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                   "\"original_max_position_embeddings\": 32, \"rope_type\": \"llama3\"}, \"head_dim\": 4, "
                   "\"tie_word_embeddings\": false, \"bos_token_id\": 1, \"eos_token_id\": [2, 3]}\n", common);
    write_done("hf_config", "llama31-rope-scaling.json", &b);
    printf_buf(&b, "{\"architectures\": [\"MistralForCausalLM\"], %s, \"rope_theta\": 10000.0, \"sliding_window\": 32, "
                   "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}}\n", common);
    write_done("hf_config", "mistral-window.json", &b);
    printf_buf(&b, "{\"architectures\": [\"Qwen2ForCausalLM\"], %s, \"rope_theta\": 1000000.0, "
                   "\"use_sliding_window\": false, \"sliding_window\": 16, \"max_window_layers\": 1, "
                   "\"tie_word_embeddings\": true, \"bos_token_id\": null, \"eos_token_id\": 3}\n", common);
    write_done("hf_config", "qwen2.json", &b);
    printf_buf(&b, "{\"architectures\": [\"LlamaForCausalLM\"], %s, \"rope_parameters\": {\"rope_type\": \"default\", "
                   "\"rope_theta\": 10000.0}}\n", common);
    write_done("hf_config", "transformers5-rope-parameters.json", &b);
}

/* ---------------------------------------------------------------- methods */

static void seeds_methods(void)
{
    for (int m = 0; m < 16; m++)
        for (int p = 0; p < 3; p++) {
            buf b = {0};
            u8(&b, (unsigned)m);
            u8(&b, (unsigned)p);
            char name[32];
            snprintf(name, sizeof name, "m%02d-p%d", m, p);
            write_done("methods", name, &b);
        }
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz_seeds DIR\n");
        return 2;
    }
    out_dir = argv[1];
    if (mkdir(out_dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "fuzz_seeds: cannot make '%s': %s\n", out_dir, strerror(errno));
        return 1;
    }
    seeds_npy();
    seeds_safetensors();
    seeds_gguf();
    seeds_llama2c();
    seeds_tokenizer_json();
    seeds_hf_config();
    seeds_methods();
    return 0;
}
