/* Load a model from a path, whatever its format:
 *
 *   a directory with config.json          Hugging Face (safetensors + tokenizer.json)
 *   a file starting with the bytes "GGUF"  GGUF
 *   any other file                         llama2.c checkpoint; its tokenizer is
 *                                          the given file, or tokenizer.bin or
 *                                          tok<vocab>.bin beside the checkpoint
 */
#ifndef MKV_MODEL_LOAD_H
#define MKV_MODEL_LOAD_H

#include "core/mkv.h"
#include "model/model.h"
#include "vocab/tokenizer.h"

typedef enum {
    MKV_FORMAT_LLAMA2C = 0,
    MKV_FORMAT_GGUF,
    MKV_FORMAT_HF
} mkv_model_format;

const char *mkv_model_format_name(mkv_model_format f);  /* "llama2.c", "gguf", "hf" */

typedef struct {
    const char *tokenizer;  /* llama2.c tokenizer file; NULL: look beside the checkpoint */
    int need_tokenizer;     /* 0: a llama2.c checkpoint without one loads (tok NULL) */
    int keep_blocks;        /* 1: a GGUF model's matrices stay in the file's quantized
                               blocks (for the CPU forward pass; model/model.h) */
} mkv_model_load_opts;

typedef struct {
    mkv_model *model;
    mkv_tokenizer *tok;       /* NULL only when not needed and not found */
    char *chat_template;      /* NULL when the model has none */
    mkv_model_format format;
    int add_bos;              /* the tokenizer starts a prompt with BOS */
    char tokenizer_path[4096];/* llama2.c: the tokenizer file used ("" if none) */
} mkv_loaded_model;

/* Which format path is (the file or directory must exist and be readable). */
int mkv_model_detect(const char *path, mkv_model_format *format, mkv_error *err);

/* Detect and load.  opts may be NULL (look beside, tokenizer required).
 * On failure *out is left empty (all NULL). */
int mkv_model_load(const char *path, const mkv_model_load_opts *opts, mkv_loaded_model *out,
                   mkv_error *err);
void mkv_loaded_model_free(mkv_loaded_model *m);

#endif
