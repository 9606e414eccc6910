/* GPT-2-style byte-level BPE (GPT-2, SmolLM, LLaMA-3, Qwen2 vocabularies).
 *
 * Every byte of the input is spelled as one printable Unicode character
 * (GPT-2's byte<->unicode table: printable Latin-1 bytes stand for
 * themselves, the others map to U+0100 upwards, so a space is 'Ġ' U+0120),
 * and vocabulary pieces and merges are written in that spelling.  Encoding:
 *   1. control and user-defined tokens found in the text become their ids
 *      (with MKV_ENCODE_SPECIAL, done by lib/vocab/tokenizer.c);
 *   2. the rest is split into pre-tokens by the vocabulary's pre-tokenizer
 *      (hand-written equivalents of its regular expressions, below);
 *   3. each pre-token starts as one symbol per byte and the adjacent pair
 *      with the lowest merge rank (its line in the merges list) is merged,
 *      leftmost first on ties, until no listed pair is left.
 * Decoding maps each character of a piece back to its byte; control tokens
 * decode to nothing, user-defined tokens to their text as written.
 *
 * Pre-tokenizers (names as GGUF's tokenizer.ggml.pre spells them):
 *   "gpt2", "gpt-2"   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+
 *                     | ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   "smollm", "starcoder", "refact", "command-r", "codeshell", "exaone",
 *   "minerva"         every \p{N} character on its own, then the GPT-2 rules
 *                     (llama.cpp's list for these names; Hugging Face's
 *                     Digits(individual_digits) + ByteLevel for SmolLM2)
 *   "llama3", "llama-bpe"
 *                     (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+
 *                     |\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+
 *                     |\s+(?!\S)|\s+      (whole pre-tokens found in the
 *                     vocabulary are emitted without merging: ignore_merges)
 *   "qwen2"           the LLaMA-3 rules with \p{N} instead of \p{N}{1,3}
 * \p{L}, \p{N} are Unicode general categories L* and N* (all planes, from a
 * table generated from Python's unicodedata: lib/vocab/bpe_gpt2_tables_priv.h), \s is
 * the Unicode White_Space property.  Bytes that are not valid UTF-8 are
 * single characters of no class (they behave like punctuation), so any
 * byte string encodes and decode(encode(s)) == s.
 */
#ifndef MKV_BPE_GPT2_H
#define MKV_BPE_GPT2_H

#include <stddef.h>
#include "core/mkv.h"
#include "vocab/tokenizer.h"

extern const mkv_tokenizer_ops mkv_bpe_gpt2_ops;

/* Build a byte-level BPE tokenizer.
 *   tokens[0..n)    pieces in the byte-level spelling, NUL-terminated
 *                   (user-defined and control tokens: their literal text)
 *   types           mkv_token_type of each token (GGUF token_type); NULL
 *                   means every token is MKV_TOKEN_NORMAL
 *   merges          n_merges strings "LEFT RIGHT" (one space between the
 *                   two pieces), highest priority first; LEFT, RIGHT and
 *                   LEFT+RIGHT must all be in the vocabulary
 *   pre             pre-tokenizer name (above); NULL means "gpt2"
 *   bos, eos        ids, or -1 when the vocabulary has none
 * Errors (MKV_EFORMAT, MKV_EUNSUP for an unknown pre-tokenizer name,
 * MKV_ENOMEM) say which token or merge is wrong.  unk_id is left -1; a
 * caller may set it afterwards: a byte whose character is not in the
 * vocabulary (SmolLM2 lacks 0xC0, 0xF5..0xFF and a few control bytes)
 * then encodes as that token, otherwise encoding it is an MKV_EFORMAT
 * error naming the byte. */
int mkv_bpe_gpt2_create(const char *const *tokens, const int *types, int n,
                        const char *const *merges, size_t n_merges, const char *pre,
                        int bos, int eos, mkv_tokenizer **out, mkv_error *err);

/* The regular expressions as tokenizer.json files spell them (C string
 * escapes aside).  Hugging Face pre_tokenizer configurations map to names:
 *   ByteLevel(use_regex=true)                          -> MKV_BPE_REGEX_GPT2
 *   Sequence[Digits(individual_digits=true),
 *            ByteLevel(use_regex=true)]  (SmolLM2)     -> "smollm"
 *   Sequence[Split(Regex R, "isolated"),
 *            ByteLevel(use_regex=false)] (LLaMA-3, Qwen2) -> R */
#define MKV_BPE_REGEX_GPT2 \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define MKV_BPE_REGEX_LLAMA3                                                                \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+" \
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define MKV_BPE_REGEX_QWEN2                                                                 \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"      \
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* Name of the pre-tokenizer whose regular expression is `regex` (one of
 * the three above), or NULL.  `individual_digits`: the regex is preceded
 * by a Digits(individual_digits=true) pre-tokenizer (only with the GPT-2
 * expression: "smollm"). */
const char *mkv_bpe_gpt2_pre_for_regex(const char *regex, int individual_digits);

/* 1 when `pre` names a supported pre-tokenizer. */
int mkv_bpe_gpt2_pre_known(const char *pre);

/* Pre-tokenize text[0..len) with the named rules: *ends (malloc'd, caller
 * frees) gets the end offset of each of the *n pre-tokens, in order (the
 * first starts at 0, the last ends at len).  For tests and tools. */
int mkv_bpe_gpt2_pretokenize(const char *pre, const char *text, size_t len, size_t **ends,
                             size_t *n, mkv_error *err);

/* The character GPT-2's table spells byte b with (a code point). */
unsigned mkv_bpe_gpt2_byte_char(unsigned char b);

#endif
