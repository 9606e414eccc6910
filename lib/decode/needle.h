/* Passkey retrieval (the RULER passkey task): a random number of 5 to 7
 * digits hidden at a given depth of filler prose, the question at the end,
 * a greedy answer, exact match.
 *
 * The prompt text is
 *
 *   <instruction> <filler before> <needle> <filler after> <question>
 *
 * where the needle is "The pass key is N. Remember it. N is the pass key."
 * and the filler is cut at sentence ends from the start of a text (wrapped
 * around when it is shorter than needed); the needle goes to the sentence
 * end nearest depth x the filler's length (0: before it, 1: after it).
 * The text goes through the model's prompt path (the chat template with
 * --chat), and the filler is sized until the prompt has the requested
 * number of tokens: within 1% (or 8 tokens) where sentence ends allow,
 * else the longest prompt that fits.  Everything is a function of
 * (seed, length, depth, trial). */
#ifndef MKV_NEEDLE_H
#define MKV_NEEDLE_H

#include <stddef.h>
#include <stdint.h>
#include "core/mkv.h"
#include "decode/decoder.h"
#include "model/model_load.h"
#include "model/prompt.h"

/* The passkey of one case: 5 to 7 digits, the first not 0, NUL-terminated. */
void mkv_needle_passkey(uint64_t seed, int64_t length, double depth, int trial, char out[8]);

/* The prompt text (malloc'd) for haystack_bytes of filler, cut back to a
 * sentence end; *needle_at: the needle's byte offset in the text,
 * *needle_depth: where it went in the filler, 0..1. */
int mkv_needle_text(const char *filler, size_t filler_len, size_t haystack_bytes, double depth,
                    const char *passkey, char **text, size_t *needle_at, double *needle_depth, mkv_error *err);

typedef struct {
    char passkey[8];
    size_t needle_at;          /* byte offset of the needle in the text */
    double needle_depth;       /* where the needle went in the filler, 0..1 */
    mkv_prompt prompt;         /* the tokens (free prompt.tokens) */
    char *text;                /* the prompt text before any chat template (free it) */
} mkv_needle_case;

/* Build the case of (seed, length, depth, trial): its prompt as tokens
 * through the prompt path of lm with the options of po (chat, system,
 * BOS; its text and file are ignored), about `tokens` long. */
int mkv_needle_build(const mkv_loaded_model *lm, const char *model_path, const mkv_prompt_opts *po,
                     const char *filler, size_t filler_len, int64_t tokens, uint64_t seed, int64_t length,
                     double depth, int trial, mkv_needle_case *out, mkv_error *err);

/* The first run of digits of answer equals passkey. */
int mkv_needle_correct(const char *answer, const char *passkey);

/* Greedy answers of max_new tokens at most (stopping at EOS): of the
 * method (o) and, when answer_full is not NULL, of the full cache forked
 * from the same prefill: token ids into answer and answer_full
 * [max_new], their counts into n and n_full. */
int mkv_needle_answer(const mkv_model *m, const int32_t *prompt, size_t n_prompt, const mkv_decoder_opts *o,
                      int max_new, int eos, int32_t *answer, int *n, int32_t *answer_full, int *n_full,
                      mkv_error *err);

#endif
