/* A LLaMA-family decoder in memory: its configuration and weights.
 *
 * Every loader (llama2.c, GGUF, safetensors) and the shape-only mode fill
 * the same structure: they describe the model in an mkv_model_config, call
 * mkv_model_create to get zeroed storage for every weight, and write the
 * weights (dequantized to float32) into it.  Matrices are row-major
 * [out x in], so y = W x is row i of W dotted with x.
 *
 * The GGUF loader can instead keep the matrices in the quantized blocks of
 * the file (mkv_model_create_blocks): a matrix's float pointer is then
 * NULL and its mkv_qmatrix says where its rows are.  The CPU forward pass
 * dequantizes a tile of rows at a time into the same float32 values the
 * float path holds, so both give the same logits while a decode step reads
 * the checkpoint's bytes (about 5 bits per weight for Q4_1) instead of 32.
 */
#ifndef MKV_MODEL_H
#define MKV_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include "core/mkv.h"

/* How RoPE pairs the channels of a head.  Both rotate pair number j
 * (0 <= j < rope_dim/2) by the angle pos * theta^(-2j/rope_dim), divided
 * by rope_freq_factors[j] when the model scales its frequencies. */
typedef enum {
    MKV_ROPE_INTERLEAVED = 0, /* pairs (2j, 2j+1): llama2.c, GGUF "llama" */
    MKV_ROPE_HALF = 1         /* pairs (j, j + rope_dim/2): Hugging Face
                                 rotate_half, GGUF "qwen2"/NeoX */
} mkv_rope_layout;

/* Most RoPE pairs a head can have (head_dim is at most 1024). */
#define MKV_ROPE_MAX_PAIRS 512

typedef struct {
    char name[128];        /* for messages and the dump's "model" attribute */
    int dim;               /* residual stream width */
    int hidden_dim;        /* SwiGLU inner width */
    int n_layers;
    int n_heads;           /* query heads */
    int n_kv_heads;        /* key/value heads; divides n_heads (GQA) */
    int head_dim;          /* n_heads * head_dim need not equal dim */
    int vocab_size;
    int max_seq_len;       /* context length the model was trained for */
    int rope_dim;          /* leading channels of a head that RoPE rotates
                              (even, <= head_dim; usually head_dim) */
    double rope_theta;     /* RoPE base, 10000 for LLaMA-2, 500000 LLaMA-3 */
    mkv_rope_layout rope_layout;
    /* Frequency scaling (Llama 3.1's "llama3" rope_scaling, "linear", GGUF
     * rope_freqs.weight): pair j's frequency is divided by
     * rope_freq_factors[j], j < rope_dim/2.  Stored in the config, not
     * pointed to, because configs are copied by value and read without a
     * model.  Ignored unless has_rope_freq_factors. */
    int has_rope_freq_factors;
    float rope_freq_factors[MKV_ROPE_MAX_PAIRS];
    float rms_eps;
    int tied_classifier;   /* 1: logits use the token embedding matrix */
    int has_qkv_bias;      /* 1: q, k, v projections have biases (Qwen2) */
    int bos_id, eos_id;    /* -1 when the model has none */
} mkv_model_config;

/* A matrix kept in ggml blocks (model/ggml_quant.h types): row r is the
 * row_bytes bytes at data + r * row_bytes. */
typedef struct {
    const unsigned char *data; /* NULL: the float32 pointer beside it holds the matrix */
    size_t row_bytes;
    uint32_t type;             /* MKV_GGML_* */
} mkv_qmatrix;

typedef struct {
    float *rms_att;        /* [dim] */
    float *wq;             /* [n_heads*head_dim x dim] */
    float *wk;             /* [n_kv_heads*head_dim x dim] */
    float *wv;             /* [n_kv_heads*head_dim x dim] */
    float *wo;             /* [dim x n_heads*head_dim] */
    float *bq, *bk, *bv;   /* biases, NULL unless has_qkv_bias */
    float *rms_ffn;        /* [dim] */
    float *w1;             /* gate [hidden_dim x dim] */
    float *w2;             /* down [dim x hidden_dim] */
    float *w3;             /* up   [hidden_dim x dim] */
    /* The matrices in blocks, where their float pointers are NULL. */
    mkv_qmatrix qwq, qwk, qwv, qwo, qw1, qw2, qw3;
} mkv_layer_weights;

typedef struct {
    mkv_model_config cfg;
    float *tok_embedding;       /* [vocab_size x dim] */
    mkv_layer_weights *layers;  /* [n_layers] */
    float *rms_final;           /* [dim] */
    float *classifier;          /* [vocab_size x dim]; == tok_embedding when tied */
    mkv_qmatrix qtok_embedding, qclassifier; /* in blocks where the floats are NULL */
    float *storage;             /* one allocation holding every float weight */
    size_t storage_floats;      /* floats in storage, padding included */
    unsigned char *blocks;      /* the matrices' blocks (mkv_model_create_blocks) */
    size_t block_bytes;
} mkv_model;

/* A config with the LLaMA defaults for everything a format may leave out:
 * rope_theta 10000, interleaved layout, rms_eps 1e-5, tied classifier,
 * no biases, bos 1, eos 2.  Shapes are zero and must be set. */
void mkv_model_config_defaults(mkv_model_config *cfg);

/* Reject configurations the forward pass cannot run or that are absurd
 * (non-positive or huge shapes, n_heads not a multiple of n_kv_heads, odd
 * rope_dim, bad eps/theta, RoPE frequency factors that are not finite and
 * positive, bos/eos outside the vocabulary).  Messages name
 * `what` (a file name).  Returns MKV_OK or MKV_EFORMAT. */
int mkv_model_config_check(const mkv_model_config *cfg, const char *what, mkv_error *err);

/* Per-pair RoPE frequency divisors of Llama 3.1's "llama3" scaling, as
 * Hugging Face defines it: for pair j (j < rope_dim/2) with frequency
 * inv = theta^(-2j/rope_dim) and wavelength 2 pi / inv, against
 * orig = original_max_position_embeddings: wavelengths below orig / high
 * keep their frequency (divisor 1), those above orig / low are divided by
 * factor, and in between s = (orig / wavelength - low) / (high - low)
 * blends the two: inv' = (1 - s) inv / factor + s inv.  out[j] = inv / inv'
 * (what GGUF files store as rope_freqs.weight).  Requires high > low > 0
 * and factor > 0. */
void mkv_rope_llama3_factors(double theta, int rope_dim, double factor, double low, double high,
                             double orig, float *out);

/* Floats of storage all weights of cfg take, alignment padding included
 * (0 on size_t overflow). */
size_t mkv_model_storage_floats(const mkv_model_config *cfg);

/* Check cfg and allocate a model with zeroed weights. */
int mkv_model_create(const mkv_model_config *cfg, mkv_model **out, mkv_error *err);
/* The same with float32 storage for the vectors only: every matrix pointer
 * (tok_embedding and classifier included) is NULL, for the loader to
 * allocate m->blocks (mkv_model_alloc_blocks), fill it and point the
 * mkv_qmatrix fields into it. */
int mkv_model_create_blocks(const mkv_model_config *cfg, mkv_model **out, mkv_error *err);
/* bytes of zeroed m->blocks, freed with m. */
int mkv_model_alloc_blocks(mkv_model *m, size_t bytes, mkv_error *err);
/* The widest input of a matrix of cfg: max(dim, hidden_dim, n_heads x head_dim). */
int mkv_model_widest_input(const mkv_model_config *cfg);
void mkv_model_free(mkv_model *m);

/* 1 when some matrix of m is kept in blocks (m->blocks). */
int mkv_model_has_blocks(const mkv_model *m);

/* Rows r0..r0+n of a [rows x cols] matrix as float32 into dst (n * cols
 * floats): a copy of w's rows, or q's rows dequantized when w is NULL.
 * The blocks were checked when the model was loaded. */
void mkv_matrix_rows(const float *w, const mkv_qmatrix *q, size_t cols, size_t r0, size_t n, float *dst);

/* llama2.c version-0 checkpoint (lib/model/llama2c.c): 7 int32 header then
 * float32 weights; a negative vocab_size means an untied classifier stored
 * after the two legacy RoPE tables.  The file size must match the header. */
int mkv_llama2c_load(const char *path, mkv_model **out, mkv_error *err);

#endif
