/* Running a model over a prompt, and capturing its KV cache into a dump.
 *
 * Two levels:
 *
 *   mkv_run      prefill a prompt in chunks, then generate tokens one at a
 *                time with the sampler.  An optional hook (see forward.h)
 *                sees every layer's K, V and queries as they are computed;
 *                afterwards the forward state holds the whole KV cache
 *                (mkv_forward_k/_v per layer and KV head) and, on request,
 *                the logits of the last token run.
 *
 *   mkv_capture  an mkv_run whose hook writes K, V and the queries of the
 *                chosen positions (the last `window` prompt positions and
 *                every generated one) of the chosen layers into a dump
 *                writer, head-major, keys and queries post- or pre-RoPE;
 *                then /tokens and /query_pos.
 *
 * A typical capture:
 *
 *   mkv_capture_opts o;  mkv_capture_opts_init(&o);  ... set o ...
 *   mkv_capture *cap;
 *   mkv_capture_create(model, prompt, n_prompt, &o, &cap, err);
 *   mkv_capture_meta(cap, &meta);  ... name, dtype ...
 *   mkv_dump_create(path, &meta, &wo, &w, err);
 *   mkv_capture_write(cap, w, err);
 *   mkv_dump_commit(w, err);
 *   ... cap->run.tokens[0..n_total-1] ...
 *   mkv_capture_free(cap);
 */
#ifndef MKV_CAPTURE_H
#define MKV_CAPTURE_H

#include <stddef.h>
#include <stdint.h>
#include "core/mkv.h"
#include "io/dump.h"
#include "model/forward.h"
#include "model/model.h"

/* ---------------------------------------------------------------- a run */

typedef struct {
    int threads;          /* worker threads of the forward pass (default 1) */
    int chunk;            /* prefill chunk in tokens (default 512) */
    int generate;         /* tokens to generate after the prompt (default 0) */
    double temperature;   /* 0 = greedy (default) */
    double top_p;         /* nucleus cut-off in (0, 1] (default 1) */
    uint64_t seed;        /* sampling seed (default 1) */
    int last_logits;      /* 1: logits holds the logits after the last token
                             run even where sampling does not need them */
} mkv_run_opts;

void mkv_run_opts_init(mkv_run_opts *o);

typedef struct {
    const mkv_model *model;
    mkv_run_opts opts;
    mkv_forward *fwd;     /* sized to n_total positions; after mkv_run_go it
                             holds the KV cache of every position */
    int32_t *tokens;      /* [n_total]: the prompt, then the generated tokens */
    size_t n_prompt, n_total;
    float *logits;        /* [vocab_size] or NULL (neither generation nor
                             last_logits asked for them) */
} mkv_run;

/* The prompt is not empty, and it and generate more tokens fit in the
 * context of cfg (MKV_EFORMAT otherwise). */
int mkv_run_check(const mkv_model_config *cfg, size_t n_prompt, int64_t generate, mkv_error *err);

/* mkv_run_check, then copy the prompt and create the forward state.  On failure r is left empty (safe
 * to free). */
int mkv_run_init(mkv_run *r, const mkv_model *model, const int32_t *prompt, size_t n_prompt,
                 const mkv_run_opts *opts, mkv_error *err);

/* Prefill the prompt, then generate opts.generate tokens; hook (may be
 * NULL) sees every layer of every processed position.  The last generated
 * token is run too, for its K, V and query.  A progress bar is drawn for a
 * prompt longer than one chunk; timings are logged at info level. */
int mkv_run_go(mkv_run *r, mkv_capture_fn hook, void *user, mkv_error *err);

void mkv_run_free(mkv_run *r);

/* ---------------------------------------------------------------- a capture */

typedef struct {
    mkv_run_opts run;
    const int *layers;    /* model layers written to the dump, in dump order;
                             NULL: every layer of the model */
    int n_layers;         /* entries of layers */
    int k_rope_pre;       /* store keys and queries before RoPE */
    int window;           /* queries of the last window prompt positions
                             (at most the prompt; default 32) */
} mkv_capture_opts;

void mkv_capture_opts_init(mkv_capture_opts *o);

typedef struct {
    mkv_run run;
    int n_layers;         /* layers in the dump */
    int n_queries;        /* captured queries: window + generated */
    int q_first;          /* position of the first captured query */
    /* private to capture.c */
    int *dump_layer;      /* model layer -> dump layer, -1 when not captured */
    int k_rope_pre;
    float *scratch;       /* one chunk, head-major: [heads][n][head_dim] */
    mkv_dump_writer *writer;
} mkv_capture;

/* Check opts against the model and prompt and allocate everything the
 * capture needs, before any dump is created. */
int mkv_capture_create(const mkv_model *model, const int32_t *prompt, size_t n_prompt,
                       const mkv_capture_opts *opts, mkv_capture **out, mkv_error *err);

/* The dump's metadata: shape, k_rope, source "capture", tokens and
 * queries, model = the model's name; dtype stays as meta_init set it. */
void mkv_capture_meta(const mkv_capture *c, mkv_dump_meta *meta);

/* Root attributes of a captured dump beyond the normative ones:
 * layer_index (the original index of each captured layer, comma
 * separated), capture_params (the caller's text) and what it takes to
 * rotate pre-RoPE keys like the model: rope ("dim=D layout=half") and,
 * where the model scales its frequencies, rope_freq_factors. */
int mkv_capture_set_attrs(mkv_dump_writer *w, const mkv_model_config *cfg, const int *layer_index,
                          int n_layers, const char *capture_params, mkv_error *err);

/* Run the model and write K, V, queries, /tokens and /query_pos into w
 * (created with mkv_capture_meta's metadata); the caller commits. */
int mkv_capture_write(mkv_capture *c, mkv_dump_writer *w, mkv_error *err);

void mkv_capture_free(mkv_capture *c);

/* A list of layers like "0,3,5-7" of a model with n layers: sorted,
 * without repeats, into a malloc'd array of *count entries; NULL list:
 * every layer.  MKV_EUSAGE naming --layers on a bad list. */
int mkv_layer_list_parse(const char *list, int n, int **out, int *count, mkv_error *err);

#endif
