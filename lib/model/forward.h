/* fp32 CPU forward pass of a LLaMA-family decoder, with a KV cache.
 *
 * Tokens are processed in chunks: each chunk's projections are matrix-
 * matrix products (CBLAS sgemm), so a long prompt costs a few large GEMMs
 * per layer and memory bounded by the chunk, not the prompt.  Work is
 * divided into tasks whose boundaries depend only on the model's shapes;
 * threads take tasks, so the logits do not depend on the thread count.
 *
 * The KV cache is [layer][kv_head][pos][head_dim] float32, keys after RoPE;
 * mkv_forward_k/_v give a head's [max_seq_len x head_dim] rows.
 *
 * A prefill by layer (mkv_forward_run_by_layer) runs every layer over the
 * whole prompt before the next, so that a caller can take each layer's
 * cache as soon as it is complete (a compressed cache compresses it): with
 * one_layer_cache the pass then holds the dense rows of one layer at a
 * time.  Its logits and cache rows are those of mkv_forward_run.
 */
#ifndef MKV_FORWARD_H
#define MKV_FORWARD_H

#include <stddef.h>
#include <stdint.h>
#include "core/mkv.h"
#include "core/tasks.h"
#include "model/model.h"

typedef struct mkv_forward mkv_forward;

typedef struct {
    int threads;      /* worker threads including the caller; <= 0 means 1 */
    int chunk;        /* tokens per prefill chunk; <= 0 means 128 */
    int max_seq_len;  /* KV cache length; <= 0 means the model's.  The cache
                         takes 2 x n_layers x n_kv_heads x max_seq_len x
                         head_dim floats: size it to the run (prompt plus
                         generated tokens) for models with long contexts. */
    int one_layer_cache;  /* 1: the cache holds the rows of one layer at a
                             time (2 x n_kv_heads x max_seq_len x head_dim
                             floats), for a prefill by layer whose cache the
                             caller takes layer by layer.  mkv_forward_run
                             then runs only with an external attention, and
                             mkv_forward_k/_v give only the layer the
                             prefill by layer holds. */
} mkv_forward_opts;

/* What the capture hook sees, per layer, for the n tokens at positions
 * pos0..pos0+n-1 of one chunk.  Rows are per token, heads contiguous:
 * q [n][n_heads][head_dim], k/v [n][n_kv_heads][head_dim].  Pointers are
 * valid only during the call. */
typedef struct {
    int layer;
    int pos0, n;
    const float *q;      /* after RoPE (and bias) */
    const float *k;      /* after RoPE (and bias): what the cache holds */
    const float *k_pre;  /* before RoPE, after bias */
    const float *v;
    /* the pass's threads, idle during the hook: an attention divides its
     * work among them (mkv_run_tasks_on) rather than waking threads of
     * its own */
    const mkv_task_threads *threads;
} mkv_capture_batch;

/* Called once per layer and chunk, after RoPE and before attention, from
 * the thread that called mkv_forward_run (chunk-major: every layer of a
 * chunk, then the next chunk) or mkv_forward_run_by_layer (layer-major).  A non-zero return stops the
 * forward pass with that status (the hook fills err). */
typedef int (*mkv_capture_fn)(void *user, const mkv_capture_batch *batch, mkv_error *err);

/* An attention the caller provides (a compressed KV cache): called once per
 * layer and chunk in place of the pass's own attention, with the chunk's
 * batch as the capture hook sees it (q after RoPE; k and v what a cache
 * would hold), writing the attention output out [n][n_heads][head_dim].
 * While one is set the pass writes nothing to its own cache. A non-zero
 * return stops the pass with that status (the function fills err). */
typedef int (*mkv_attention_fn)(void *user, const mkv_capture_batch *batch, float *out, mkv_error *err);

typedef enum {
    MKV_LOGITS_NONE = 0,  /* prefill only */
    MKV_LOGITS_LAST = 1,  /* logits of the last token: vocab_size floats */
    MKV_LOGITS_ALL = 2    /* logits of every token: n x vocab_size floats */
} mkv_logits_mode;

/* opts may be NULL (defaults).  The model must outlive the forward state.
 * With OpenBLAS this sets OpenBLAS to one thread (process-wide): the
 * forward pass divides the work among its own threads. */
int mkv_forward_create(const mkv_model *model, const mkv_forward_opts *opts, mkv_forward **out,
                       mkv_error *err);
void mkv_forward_free(mkv_forward *f);

void mkv_forward_set_capture(mkv_forward *f, mkv_capture_fn fn, void *user);
/* fn = NULL gives the attention back to the pass (its cache must exist). */
void mkv_forward_set_attention(mkv_forward *f, mkv_attention_fn fn, void *user);
/* Free the pass's own K/V cache, after a prefill whose cache the caller has
 * taken over: from then on only an external attention can run, and
 * mkv_forward_k/_v return NULL. */
void mkv_forward_drop_cache(mkv_forward *f);

/* Run n tokens at positions pos..pos+n-1 (pos = mkv_forward_pos) and
 * advance.  logits: see mode (NULL with MKV_LOGITS_NONE).  Token ids outside
 * the vocabulary or running past the cache are MKV_EFORMAT errors, reported
 * before any work; a failing hook leaves the position unchanged. */
int mkv_forward_run(mkv_forward *f, const int32_t *tokens, size_t n, float *logits,
                    mkv_logits_mode mode, mkv_error *err);

/* Called by a prefill by layer once layer is complete: mkv_forward_k/_v(f,
 * layer, h) hold its rows 0..pos+n-1 (mkv_forward_pos says pos+n during the
 * call).  A non-zero return stops the pass with that status (the function
 * fills err). */
typedef int (*mkv_layer_done_fn)(void *user, int layer, mkv_error *err);

/* Run n tokens at positions pos..pos+n-1 like mkv_forward_run, but layer by
 * layer: each layer over all n tokens, in the same chunks and with the
 * same arithmetic (logits and cache rows are bit-identical), before the
 * next; the residual stream of the n tokens (n x dim floats) is held for
 * the call.  After the last chunk of layer l, done(user, l, err) (done may
 * be NULL), while the pass holds no activation buffers: done's memory and
 * theirs do not add up.  logits: NULL or the last token's vocab_size floats.  Runs the
 * pass's own attention (none may be set); with one_layer_cache only from
 * position 0.  The same checks as mkv_forward_run; on failure the position
 * is unchanged. */
int mkv_forward_run_by_layer(mkv_forward *f, const int32_t *tokens, size_t n, float *logits,
                             mkv_layer_done_fn done, void *user, mkv_error *err);

int mkv_forward_pos(const mkv_forward *f);
int mkv_forward_max_seq_len(const mkv_forward *f);
/* Forget the cache: the next token is at position 0. */
void mkv_forward_reset(mkv_forward *f);
/* Place a pass that has no cache of its own (an external attention holds
 * the past) at position pos in 0..max_seq_len. */
int mkv_forward_seek(mkv_forward *f, int pos, mkv_error *err);
/* Fill positions 0..n-1 of the pass's own cache (every layer) with the
 * synthetic rows of core/kvfill.h for seed, rounded to fp16, and place
 * the pass at n: a speed run's long context without its prefill. Only
 * before the first token. */
int mkv_forward_fill(mkv_forward *f, int n, uint64_t seed, mkv_error *err);
/* Rewind to position pos <= current (drops later cache entries). */
int mkv_forward_rewind(mkv_forward *f, int pos, mkv_error *err);

/* Cache rows of one layer and KV head: [max_seq_len][head_dim], rows
 * 0..pos-1 valid (written by the pass's own attention).  K after RoPE.
 * NULL without a cache, and with one_layer_cache for every layer but the
 * one a prefill by layer holds (during its done, the layer done). */
const float *mkv_forward_k(const mkv_forward *f, int layer, int kv_head);
const float *mkv_forward_v(const mkv_forward *f, int layer, int kv_head);

/* Cosine and sine of RoPE pair j at position pos, computed in double:
 * angle pos * theta^(-2j/rope_dim) / rope_freq_factors[j] (no divisor
 * unless cfg->has_rope_freq_factors). */
void mkv_rope_angle(const mkv_model_config *cfg, int pos, int j, double *c, double *s);
/* The frequency of that pair: the angle is pos times it. */
double mkv_rope_inv_freq(const mkv_model_config *cfg, int j);

#endif
