/* GGUF files (llama.cpp's model format, versions 2 and 3):
 *
 *   "GGUF", uint32 version, uint64 tensor count, uint64 metadata count
 *   metadata: string key, uint32 value type, value
 *   tensor infos: string name, uint32 n_dims, uint64 ne[n_dims],
 *                 uint32 ggml type, uint64 offset (from the data start)
 *   padding to general.alignment (default 32), then the tensor data
 *
 * Strings are a uint64 length and that many bytes; arrays a uint32 element
 * type, a uint64 count and the elements (arrays of arrays allowed).  All
 * little-endian.  ne[0] is the innermost dimension: a matrix of ne = [in,
 * out] is stored row-major as out rows of in values, which is mkv_model's
 * [out x in] layout.
 *
 * mkv_gguf_open maps the file and checks everything before handing it out:
 * every length, count and offset against the file size (overflow-checked),
 * value types, nesting depth, duplicate keys and tensor names, tensor types
 * and shapes (rows a whole number of blocks), offsets aligned and inside
 * the data area, tensors not overlapping.  Tensor data are read from the
 * mapping on demand.
 */
#ifndef MKV_GGUF_H
#define MKV_GGUF_H

#include <stddef.h>
#include <stdint.h>
#include "core/mkv.h"
#include "model/model.h"
#include "vocab/tokenizer.h"

typedef enum {
    MKV_GGUF_UINT8 = 0,
    MKV_GGUF_INT8 = 1,
    MKV_GGUF_UINT16 = 2,
    MKV_GGUF_INT16 = 3,
    MKV_GGUF_UINT32 = 4,
    MKV_GGUF_INT32 = 5,
    MKV_GGUF_FLOAT32 = 6,
    MKV_GGUF_BOOL = 7,
    MKV_GGUF_STRING = 8,
    MKV_GGUF_ARRAY = 9,
    MKV_GGUF_UINT64 = 10,
    MKV_GGUF_INT64 = 11,
    MKV_GGUF_FLOAT64 = 12
} mkv_gguf_type;

/* ggml tensor types mosaickv dequantizes (the ids are ggml's). */
enum {
    MKV_GGML_F32 = 0,
    MKV_GGML_F16 = 1,
    MKV_GGML_Q4_0 = 2,
    MKV_GGML_Q4_1 = 3,
    MKV_GGML_Q8_0 = 8,
    MKV_GGML_BF16 = 30
};

#define MKV_GGUF_MAX_DIMS 4
#define MKV_GGUF_MAX_DEPTH 8           /* arrays nested deeper are refused */
#define MKV_GGUF_DEFAULT_ALIGNMENT 32

/* One metadata value. */
typedef struct mkv_gguf_value {
    mkv_gguf_type type;
    mkv_gguf_type elem_type;  /* arrays: type of the elements */
    uint64_t n;               /* arrays: elements; strings: bytes */
    union {
        uint64_t u;                          /* unsigned integers, bool */
        int64_t i;                           /* signed integers */
        double f;                            /* float32, float64 */
        const char *s;                       /* string: n bytes + NUL (a copy) */
        const unsigned char *raw;            /* array of scalars: n little-endian
                                                elements inside the mapping */
        const struct mkv_gguf_value *items;  /* array of strings or arrays */
    } v;
} mkv_gguf_value;

typedef struct {
    const char *name;
    uint32_t n_dims;
    uint64_t ne[MKV_GGUF_MAX_DIMS]; /* ne[0] innermost; unused dims are 1 */
    uint32_t type;                  /* ggml type id */
    uint64_t n_elements;
    uint64_t offset;                /* absolute byte offset in the file */
    uint64_t nbytes;
    const unsigned char *data;      /* inside the mapping */
} mkv_gguf_tensor;

typedef struct mkv_gguf mkv_gguf;

/* Open, map and validate.  Errors start with "'path': ". */
int mkv_gguf_open(const char *path, mkv_gguf **out, mkv_error *err);
void mkv_gguf_close(mkv_gguf *g);

uint32_t mkv_gguf_version(const mkv_gguf *g);
uint32_t mkv_gguf_alignment(const mkv_gguf *g);
uint64_t mkv_gguf_data_offset(const mkv_gguf *g);
const char *mkv_gguf_path(const mkv_gguf *g);

/* Metadata in file order, and by key (NULL when absent). */
uint64_t mkv_gguf_n_kv(const mkv_gguf *g);
const char *mkv_gguf_kv_key(const mkv_gguf *g, uint64_t i);
const mkv_gguf_value *mkv_gguf_kv_value(const mkv_gguf *g, uint64_t i);
const mkv_gguf_value *mkv_gguf_find(const mkv_gguf *g, const char *key);

const char *mkv_gguf_type_name(mkv_gguf_type t); /* "uint32", "string", ... */

/* Scalar reads: 0 on success, -1 when v (or element i of array v) is NULL,
 * out of range or of another kind.  Integers: any integer type whose value
 * fits int64.  Floats: float32/float64 or any integer.  Bool: bool only. */
int mkv_gguf_value_int(const mkv_gguf_value *v, int64_t *out);
int mkv_gguf_value_float(const mkv_gguf_value *v, double *out);
int mkv_gguf_value_bool(const mkv_gguf_value *v, int *out);
/* String contents (NUL-terminated, *len bytes) or NULL. */
const char *mkv_gguf_value_str(const mkv_gguf_value *v, size_t *len);
int mkv_gguf_array_int(const mkv_gguf_value *arr, uint64_t i, int64_t *out);
int mkv_gguf_array_float(const mkv_gguf_value *arr, uint64_t i, double *out);
/* Element i of an array of strings or arrays, or NULL. */
const mkv_gguf_value *mkv_gguf_array_item(const mkv_gguf_value *arr, uint64_t i);

/* Tensors in file order, and by name (NULL when absent). */
uint64_t mkv_gguf_n_tensors(const mkv_gguf *g);
const mkv_gguf_tensor *mkv_gguf_tensor_at(const mkv_gguf *g, uint64_t i);
const mkv_gguf_tensor *mkv_gguf_find_tensor(const mkv_gguf *g, const char *name);

/* ggml type name ("Q4_K"), or NULL for an id ggml does not define. */
const char *mkv_ggml_type_name(uint32_t type);
/* Elements per block and bytes per block; 0 for an unknown id. */
uint32_t mkv_ggml_block_size(uint32_t type);
uint32_t mkv_ggml_type_size(uint32_t type);
/* 1 for the types below (F32, F16, BF16, Q8_0, Q4_0, Q4_1). */
int mkv_ggml_can_dequantize(uint32_t type);

/* Dequantize n elements (a whole number of blocks) of `type` from src to
 * float32 dst.  Q8_0: fp16 d, 32 int8 q: d*q.  Q4_0: fp16 d, 16 bytes whose
 * low nibbles are elements 0..15 and high nibbles 16..31: d*(q-8).  Q4_1:
 * fp16 d, fp16 m, nibbles as Q4_0: d*q + m.  MKV_EUNSUP for another type,
 * MKV_EFORMAT when n is not a whole number of blocks. */
int mkv_ggml_dequantize(uint32_t type, const void *src, float *dst, uint64_t n, mkv_error *err);

/* A tensor of the file into dst (n_elements floats).  Messages name the
 * tensor and its type. */
int mkv_gguf_dequantize(const mkv_gguf *g, const mkv_gguf_tensor *t, float *dst, mkv_error *err);

/* What a model file says besides weights and vocabulary. */
typedef struct {
    char *chat_template;  /* tokenizer.chat_template (malloc'd), NULL if absent */
    int add_bos;          /* prompts start with BOS (tokenizer.ggml.add_bos_token;
                             default 1 for "llama" vocabularies, 0 for "gpt2"
                             except the LLaMA-3 pre-tokenizer) */
    int add_eos;
} mkv_gguf_extra;

void mkv_gguf_extra_free(mkv_gguf_extra *x);

/* Architecture "llama" (others are refused by name) into an mkv_model:
 * tensors token_embd, output_norm, output (absent: tied classifier) and
 * blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm,
 * ffn_gate, ffn_down, ffn_up}.weight (+ optional attn_{q,k,v}.bias), every
 * shape checked, dequantized to float32.  RoPE is MKV_ROPE_INTERLEAVED:
 * llama.cpp's converter permutes the rows of Hugging Face Q and K weights
 * so that pairs are adjacent channels, as in llama2.c.  RoPE frequency
 * divisors (mkv_model_config.rope_freq_factors), as llama.cpp applies
 * them: the rope_freqs.weight tensor (Llama 3.1) times the linear factor
 * of llama.rope.scaling.factor (type "linear" or absent; "none" ignores
 * it).  Refused: MoE (expert_count), per-layer head counts, other RoPE
 * scaling types (yarn, ...). */
int mkv_gguf_model(const mkv_gguf *g, mkv_model **out, mkv_error *err);

/* The vocabulary: tokenizer.ggml.model "gpt2" (byte-level BPE with merges
 * and tokenizer.ggml.pre, lib/vocab/bpe_gpt2.h) or "llama" (sentencepiece pieces
 * with scores, spaces as U+2581, <0xNN> byte fallback).  MKV_EFORMAT when
 * the file has none. */
int mkv_gguf_tokenizer(const mkv_gguf *g, mkv_tokenizer **out, mkv_error *err);
int mkv_gguf_extra_get(const mkv_gguf *g, mkv_gguf_extra *x, mkv_error *err);

/* Open path and load what is asked for: the model, and if tok is non-NULL
 * the tokenizer, and if extra is non-NULL the extras.  On failure nothing
 * is returned (all outputs NULL/zeroed). */
int mkv_gguf_load(const char *path, mkv_model **model, mkv_tokenizer **tok, mkv_gguf_extra *extra,
                  mkv_error *err);

#endif
