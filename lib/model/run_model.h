/* The model of a run and its prompt: a model file (llama2.c, GGUF,
 * Hugging Face; its tokenizer found beside a llama2.c checkpoint unless
 * given) or a shape-only model with seeded random weights, the layers the
 * run keeps, and the prompt as token ids.  Also the table of known shapes. */
#ifndef MKV_RUN_MODEL_H
#define MKV_RUN_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "core/mkv.h"
#include "model/model.h"
#include "model/model_load.h"
#include "model/prompt.h"
#include "model/shapes.h"

typedef struct {
    const char *path;         /* model file or directory; NULL: shape */
    const char *shape;        /* shape name when path is NULL */
    const char *tokenizer;    /* llama2.c tokenizer; NULL: beside the checkpoint */
    int need_tokenizer;       /* 0: a llama2.c checkpoint without one loads */
    const char *layers;       /* layer list like "0,3,5-7" (--layers); NULL: all */
    /* shape-only models */
    int vocab;                /* vocabulary instead of the shape's; 0: the shape's */
    uint64_t seed;            /* weights and random prompt */
    size_t random_tokens;     /* prompt length without token ids */
    int64_t max_memory;       /* bytes the run may need; 0: what is available */
    /* the run, for a shape-only model's memory estimate and the context check */
    int threads, chunk, generate;
    int64_t run_tokens;       /* > 0: the run takes this many tokens of the prompt,
                                 checked against the context instead of the
                                 prompt and generate (a text read in parts) */
    int keep_blocks;          /* a GGUF model's matrices in the file's blocks
                                 (mkv_model_load_opts; the CPU forward pass) */
    int64_t fill;             /* positions filled before the prompt (mkv_decoder_opts.fill):
                                 in the context check; a shape-only model's context grows
                                 to hold them (random weights have no trained length) */
    int fill_on_host;         /* the filled rows live in host memory (the CPU pass) */
} mkv_run_model_opts;

typedef struct {
    mkv_loaded_model lm;      /* a model file (lm.model NULL for a shape) */
    const mkv_shape *shape;   /* a shape-only model, or NULL */
    mkv_model *model;         /* lm.model or the shape-only model */
    int *layer_index;         /* original index of each kept layer */
    int n_layers;
    mkv_prompt prompt;
} mkv_run_model;

/* The conflicts among prompt options (text, file and token ids, chat and
 * special with token ids, system without chat): MKV_EUSAGE naming them. */
int mkv_prompt_opts_check(const mkv_prompt_opts *po, mkv_error *err);

/* Load or build the model, parse the layers, read the prompt and check
 * that it and generate more tokens fit in the context.  A shape-only
 * model is built from the kept layers alone (model->cfg.n_layers ==
 * n_layers), once its memory need is known to fit.  On failure out is
 * left safe to free. */
int mkv_run_model_open(const mkv_run_model_opts *o, const mkv_prompt_opts *po, mkv_run_model *out,
                       mkv_error *err);
void mkv_run_model_free(mkv_run_model *m);

/* One TSV row per known shape, after a header line. */
void mkv_shape_list(FILE *fp);

#endif
