/* A compressed KV cache for decoding: the cache a prefill leaves,
 * compressed by a method of the registry, plus the tokens decoded since.
 *
 * The prefill's keys and values (every layer and KV head, positions
 * 0..n-1) and its observation queries go through the method's compress
 * into an in-memory compressed dump of each layer, are loaded back through
 * the method's load as soon as the layer is compressed (the dump then
 * freed), and from then on answer attention through the method's attend
 * exactly as mkv-attend measures them.  The cache is built layer by layer
 * (mkv_ccache_begin, mkv_ccache_add_layer for layers 0..n_layers-1,
 * mkv_ccache_end), so a prefill by layer (mkv_forward_run_by_layer) can
 * hand each layer over as soon as it is done and hold one layer of dense
 * cache at a time; a method that plans budgets over every layer before
 * compressing any (mkv_ccache_needs_every_layer) needs the whole dense
 * cache instead (mkv_ccache_fill).  Tokens decoded after the prefill
 * are kept in a dense 16-bit tail per layer and KV head (the generic decode
 * path: every method holds them the same way) and attended exactly; the
 * two parts are merged by their log-sum-exp (mkv_osm_from_output), so a
 * step's attention is the softmax over both.
 *
 * A method with its own decode-time rule (mkv_method.append: Quest adds
 * pages, ...) takes each new token itself instead, and its attend answers
 * over everything it holds.
 *
 * Physical bytes are those of the compressed dump (every stored array,
 * as mkv-compress counts them) plus 2 x d x 2 bytes per tail token and KV
 * head, or what an appending method's states hold (state_bytes).
 * mkv_ccache_attention is the forward pass's external attention
 * (model/forward.h). */
#ifndef MKV_CCACHE_H
#define MKV_CCACHE_H

#include <stdint.h>
#include "core/mkv.h"
#include "methods/method.h"
#include "model/forward.h"
#include "model/model.h"

/* The queries of the last W prefill positions, which methods that select
 * by observation (SnapKV, MosaicKV's loss) read as a raw dump's queries. */
typedef struct {
    int W;
    const int32_t *pos;      /* [W] ascending, < n */
    const float *q;          /* [n_layers][n_heads][W][head_dim], after RoPE */
} mkv_obs_queries;

typedef struct {
    const mkv_method *method;
    const mkv_params *params;  /* checked against the method's table */
    int threads;               /* workers for compression and attention (>= 1) */
    int max_new;               /* tokens the tail can take after the prefill */
} mkv_ccache_opts;

typedef struct mkv_ccache mkv_ccache;

/* Start a compressed cache of n prefill positions in a context of
 * max_seq_len (n + o->max_new must fit).  The method's check sees the
 * cache as a raw dump of model cfg with n tokens and obs->W queries; its
 * refusals come back prefixed "method 'NAME'".  obs's arrays and
 * o->params must outlive the cache; the queries of a layer need be
 * complete only when the layer is added.  Holds the scratch of one
 * layer's keys and values until mkv_ccache_end. */
int mkv_ccache_begin(const mkv_model_config *cfg, int64_t n, const mkv_obs_queries *obs, int max_seq_len,
                     const mkv_ccache_opts *o, mkv_ccache **out, mkv_error *err);
/* Whether the method plans over every layer before compressing any
 * (per-head budgets, mkv_budget_plan_wanted): such a cache is built from
 * the whole dense prefill cache by mkv_ccache_fill, and add_layer
 * refuses it until then. */
int mkv_ccache_needs_every_layer(const mkv_ccache *cc);
/* Compress layer `layer` from rows 0..n-1 of f's cache (f at position >=
 * n).  Layers come in order 0..n_layers-1, each once. */
int mkv_ccache_add_layer(mkv_ccache *cc, const mkv_forward *f, int layer, mkv_error *err);
/* After the last layer: load every state from the compressed dump and free
 * the scratch; from then on the cache attends.  On failure only
 * mkv_ccache_free remains. */
int mkv_ccache_end(mkv_ccache *cc, mkv_error *err);

/* The rest of a build from f's whole cache (it must still hold every
 * layer): the budget plan over every layer if the method wants one,
 * add_layer for each layer, end. */
int mkv_ccache_fill(mkv_ccache *cc, const mkv_forward *f, mkv_error *err);
/* begin and fill: the first n positions of the forward pass's own cache. */
int mkv_ccache_build(const mkv_model_config *cfg, const mkv_forward *f, int64_t n, const mkv_obs_queries *obs,
                     const mkv_ccache_opts *o, mkv_ccache **out, mkv_error *err);
/* Also frees a cache left half-built. */
void mkv_ccache_free(mkv_ccache *cc);

/* mkv_attention_fn: attend the batch's queries over the compressed prefix
 * and the tail, after appending the batch's keys and values to the tail.
 * Stats, flush and attention need a cache that mkv_ccache_end finished. */
int mkv_ccache_attention(void *cc, const mkv_capture_batch *b, float *out, mkv_error *err);

typedef struct {
    int64_t prefix_tokens;     /* compressed by the method */
    int64_t tail_tokens;       /* decoded since (layer 0's count) */
    uint64_t prefix_bytes;     /* physical bytes of the compressed prefix */
    uint64_t tail_bytes;       /* what new tokens added to it (16-bit K and V of the tail) */
    uint64_t held_bytes;       /* physical bytes held now */
    uint64_t logical_bytes;    /* dense 16-bit K and V of prefix and tail */
    uint64_t bytes_read;       /* read by the last attention of every layer */
    /* a method's decode-time growth (mkv_decode_counters), over every
     * layer and KV head: summed, except temp_tokens (the most any head
     * holds) */
    mkv_decode_counters growth;
} mkv_ccache_stats;

void mkv_ccache_get_stats(const mkv_ccache *cc, mkv_ccache_stats *s);

/* The method's state of (layer, KV head) in a finished cache (what its
 * load made; a GPU decode path converts it). */
void *mkv_ccache_state(const mkv_ccache *cc, int layer, int head);

/* Finish the methods' pending decode-time work (a manager's segments)
 * and publish it: the end of a run, never a decode step. */
int mkv_ccache_flush(mkv_ccache *cc, mkv_error *err);

#endif
