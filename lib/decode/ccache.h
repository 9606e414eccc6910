/* A compressed KV cache for decoding: the cache a prefill leaves,
 * compressed by a method of the registry, plus the tokens decoded since.
 *
 * The prefill's keys and values (every layer and KV head, positions
 * 0..n-1) and its observation queries go through the method's compress
 * into an in-memory compressed dump, are loaded back through the method's
 * load, and from then on answer attention through the method's attend
 * exactly as mkv-attend measures them.  Tokens decoded after the prefill
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

/* Compress the first n positions of the forward pass's own cache (it must
 * still hold it).  The method's check sees the cache as a raw dump of
 * model cfg with n tokens and obs->W queries; its refusals come back
 * prefixed "method 'NAME'". */
int mkv_ccache_build(const mkv_model_config *cfg, const mkv_forward *f, int64_t n, const mkv_obs_queries *obs,
                     const mkv_ccache_opts *o, mkv_ccache **out, mkv_error *err);
void mkv_ccache_free(mkv_ccache *cc);

/* mkv_attention_fn: attend the batch's queries over the compressed prefix
 * and the tail, after appending the batch's keys and values to the tail. */
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

/* Finish the methods' pending decode-time work (a manager's segments)
 * and publish it: the end of a run, never a decode step. */
int mkv_ccache_flush(mkv_ccache *cc, mkv_error *err);

#endif
