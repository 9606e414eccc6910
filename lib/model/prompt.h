/* The prompt of a model run as token ids: text given on the command line,
 * read from a file or standard input, optionally wrapped in the model's
 * chat template, then tokenized; or a file of token ids taken as they are;
 * or, for a shape-only model, seeded random ids.  Also the continuation of
 * a run as text. */
#ifndef MKV_PROMPT_H
#define MKV_PROMPT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "core/mkv.h"
#include "model/model_load.h"
#include "model/shapes.h"
#include "vocab/tokenizer.h"

typedef struct {
    const char *text;       /* the prompt itself, or NULL */
    const char *file;       /* a file holding it ("-" = stdin), or NULL */
    const char *token_ids;  /* a file of whitespace-separated ids ("-" = stdin), or NULL */
    const char *system;     /* system prompt of the chat template, or NULL */
    int chat;               /* wrap the text in the model's chat template */
    int special;            /* control-token text becomes the control tokens */
    int bos;                /* -1: as the model (or template) does, 0 no, 1 yes */
} mkv_prompt_opts;

void mkv_prompt_opts_init(mkv_prompt_opts *o);

typedef struct {
    int32_t *tokens;          /* malloc'd, n entries */
    size_t n;
    int bos;                  /* tokens start with BOS */
    const char *chat_family;  /* the chat template's family, NULL without --chat */
} mkv_prompt;

/* The prompt of a loaded model.  Text comes from o->text, else o->file,
 * else standard input when it is not a terminal (MKV_EUSAGE when it is).
 * Ids of o->token_ids are used as they are: only o->bos == 1 puts a BOS
 * first.  model_path names the model in messages. */
int mkv_prompt_tokens(const mkv_loaded_model *lm, const char *model_path, const mkv_prompt_opts *o,
                      mkv_prompt *out, mkv_error *err);

/* The prompt of a shape-only model of cfg: o->token_ids, or n_random ids
 * drawn with seed (BOS first when the shape's tokenizer adds one, or as
 * o->bos says). */
int mkv_prompt_shape(const mkv_shape *s, const mkv_model_config *cfg, const mkv_prompt_opts *o,
                     size_t n_random, uint64_t seed, mkv_prompt *out, mkv_error *err);

/* Append the whitespace-separated decimal ids of path ("-" = stdin), each
 * below vocab, to ids; MKV_EFORMAT on anything else or on no ids. */
int mkv_read_token_ids(const char *path, int vocab, mkv_idbuf *ids, mkv_error *err);

/* Read a whole file ("-" = stdin) into a malloc'd NUL-terminated buffer. */
int mkv_read_file(const char *path, char **data, size_t *len, mkv_error *err);

/* tokens[n_prompt..n_total-1] as text on fp, each token's bytes after its
 * predecessor (so a leading space after BOS is dropped as in decoding). */
void mkv_print_continuation(const mkv_tokenizer *t, const int32_t *tokens, size_t n_prompt,
                            size_t n_total, FILE *fp);
/* The same as a malloc'd string, or NULL when out of memory. */
char *mkv_continuation_text(const mkv_tokenizer *t, const int32_t *tokens, size_t n_prompt,
                            size_t n_total);

#endif
