/* The vocabulary of a GGUF file, as llama.cpp reads it from the
 * tokenizer.ggml.* metadata: tokenizer.ggml.model "gpt2" (byte-level BPE
 * with merges and tokenizer.ggml.pre, vocab/bpe_gpt2.h) or "llama"
 * (sentencepiece pieces with scores, spaces as U+2581, <0xNN> byte
 * fallback).
 *
 * The metadata come already read and type-checked (model/gguf.h reads them
 * from the file) as plain arrays that live as long as the call.
 */
#ifndef MKV_GGUF_VOCAB_H
#define MKV_GGUF_VOCAB_H

#include <stddef.h>
#include "core/mkv.h"
#include "vocab/tokenizer.h"

/* A token id key (tokenizer.ggml.bos_token_id, ...) the file does not have;
 * the vocabulary's default applies. */
#define MKV_GGUF_VOCAB_UNSET (-2)

typedef struct {
    const char *source;           /* the file, for messages */
    const char *model;            /* tokenizer.ggml.model */
    int n_tokens;                 /* at least 1 */
    const char *const *tokens;    /* tokenizer.ggml.tokens, NUL-terminated */
    const size_t *token_lens;     /* their lengths in bytes (a piece may hold a NUL) */
    const int *types;             /* tokenizer.ggml.token_type as mkv_token_type
                                     values; NULL when absent */
    int bos_id, eos_id, unk_id;   /* -1 (none) .. n_tokens - 1, or MKV_GGUF_VOCAB_UNSET */
    /* "gpt2" */
    const char *pre;              /* tokenizer.ggml.pre; NULL when absent */
    const char *const *merges;    /* tokenizer.ggml.merges */
    size_t n_merges;
    /* "llama" */
    const float *scores;          /* tokenizer.ggml.scores; NULL when absent (all 0) */
    int add_space_prefix;         /* tokenizer.ggml.add_space_prefix; -1 when absent (1) */
} mkv_gguf_vocab;

/* The tokenizer of v.  Defaults as llama.cpp's: "gpt2" has no BOS, EOS or
 * unknown token unless given (and only a token of type unknown stands in
 * for bytes the vocabulary lacks); "llama" has unknown 0, BOS 1, EOS 2 and a
 * space prefix, and without token types takes the unknown, BOS and EOS ids
 * as such and "<0xNN>" pieces as byte fallback.  Messages start with
 * "'source': "; MKV_EUNSUP for another tokenizer model. */
int mkv_gguf_vocab_tokenizer(const mkv_gguf_vocab *v, mkv_tokenizer **out, mkv_error *err);

/* Whether prompts start with BOS when tokenizer.ggml.add_bos_token is
 * absent: llama.cpp's default, 1 for sentencepiece vocabularies (model
 * "llama" or none) and the LLaMA-3 pre-tokenizer, 0 for other byte-level
 * ones.  pre may be NULL. */
int mkv_gguf_vocab_default_add_bos(const char *model, const char *pre);

#endif
