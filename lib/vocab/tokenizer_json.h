/* Hugging Face tokenizer.json (+ tokenizer_config.json) -> mkv_tokenizer.
 *
 * Supported: model.type "BPE" (vocab + merges, merges written as "a b"
 * strings or [a, b] pairs) in one of two styles:
 *
 *  - byte-level (GPT-2, LLaMA-3, Qwen2, SmolLM): a ByteLevel pre-tokenizer.
 *    The pre-tokenization rule is recognised from the pre_tokenizer section
 *    (the Split regex of LLaMA-3 or Qwen2, individual Digits + ByteLevel of
 *    SmolLM, a lone ByteLevel of GPT-2) and the tokenizer is built by
 *    mkv_bpe_gpt2_create (lib/vocab/bpe_gpt2.h).  A NFC normalizer (Qwen2) is
 *    accepted and not applied: input is taken to be NFC already.
 *
 *  - sentencepiece-style (LLaMA-2, Mistral): spaces become U+2581 ("▁")
 *    through a Metaspace pre-tokenizer or a Prepend/Replace normalizer,
 *    characters missing from the vocabulary fall back to <0xNN> byte tokens
 *    (byte_fallback) or the unknown token.  Merging follows the file's merge
 *    ranks (lowest rank first, leftmost on ties), as the tokenizers library
 *    does, not piece scores.
 *
 * Everything else (Unigram, WordPiece, other pre-tokenizer regexes, other
 * normalizers, continuing-subword prefixes, dropout) is refused with
 * MKV_EUNSUP and a message naming what was found.
 *
 * added_tokens become CONTROL tokens ("special": true) or USER_DEFINED ones;
 * both are matched whole in the text with MKV_ENCODE_SPECIAL.  BOS/EOS come
 * from tokenizer_config.json (bos_token/eos_token), else from the
 * post-processor's template, else "<s>"/"</s>" for sentencepiece-style
 * vocabularies.
 */
#ifndef MKV_TOKENIZER_JSON_H
#define MKV_TOKENIZER_JSON_H

#include "core/mkv.h"
#include "vocab/tokenizer.h"

typedef struct {
    int add_bos;          /* a prompt should start with BOS: tokenizer_config's
                             add_bos_token, else the post-processor's template */
    char *chat_template;  /* tokenizer_config.json chat_template (Jinja source;
                             the "default" one of a list), malloc'd; NULL if none */
} mkv_tokenizer_json_info;

/* Load tokenizer_json and, when tokenizer_config is non-NULL, that file.
 * vocab_size > 0 is the model's vocabulary: ids the files do not define up
 * to it become unused tokens (decoding to nothing), and an id at or above it
 * is an error; 0 accepts any size.  info may be NULL; otherwise free it with
 * mkv_tokenizer_json_info_free.  Messages name the file. */
int mkv_tokenizer_json_load(const char *tokenizer_json, const char *tokenizer_config, int vocab_size,
                            mkv_tokenizer **out, mkv_tokenizer_json_info *info, mkv_error *err);
void mkv_tokenizer_json_info_free(mkv_tokenizer_json_info *info);

#endif
