/* GGUF models: the "llama" architecture's configuration and weights, and
 * the vocabulary and prompt settings of the file.  The container itself is
 * io/gguf.h, its tensor types model/ggml_quant.h, the tokenizers
 * vocab/gguf_vocab.h.
 */
#ifndef MKV_GGUF_H
#define MKV_GGUF_H

#include "core/mkv.h"
#include "io/gguf.h"
#include "model/model.h"
#include "vocab/tokenizer.h"

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
 * scaling types (yarn, ...).  With `blocks` the matrices (token_embd and
 * output included) stay in the file's blocks (mkv_model_create_blocks),
 * each row a whole number of blocks and every value finite; otherwise
 * every tensor is dequantized to float32. */
int mkv_gguf_model(const mkv_gguf *g, int blocks, mkv_model **out, mkv_error *err);

/* The vocabulary: the tokenizer.ggml.* metadata, each checked for its
 * type, into the tokenizer vocab/gguf_vocab.h builds ("gpt2" or "llama").
 * MKV_EFORMAT when the file has none. */
int mkv_gguf_tokenizer(const mkv_gguf *g, mkv_tokenizer **out, mkv_error *err);
/* The extras: tokenizer.ggml.add_bos_token and add_eos_token, and
 * tokenizer.chat_template. */
int mkv_gguf_extra_get(const mkv_gguf *g, mkv_gguf_extra *x, mkv_error *err);

/* Open path and load what is asked for: the model (its matrices in blocks
 * with `blocks`, as mkv_gguf_model), and if tok is non-NULL the tokenizer,
 * and if extra is non-NULL the extras.  On failure nothing is returned
 * (all outputs NULL/zeroed). */
int mkv_gguf_load(const char *path, int blocks, mkv_model **model, mkv_tokenizer **tok,
                  mkv_gguf_extra *extra, mkv_error *err);

#endif
