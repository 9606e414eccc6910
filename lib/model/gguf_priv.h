/* Internals shared by the GGUF model loader (gguf_llama.c) and its
 * vocabulary (gguf_tokenizer.c). */
#ifndef MKV_GGUF_PRIV_H
#define MKV_GGUF_PRIV_H

#include "core/mkv.h"
#include "io/gguf.h"

/* The integer token id under key: -1 (none) to n_vocab - 1; def when the
 * file has no such key. */
int mkv_gguf_token_id(const mkv_gguf *g, const char *key, int def, int n_vocab, int *out,
                      mkv_error *err);

#endif
