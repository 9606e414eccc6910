/* Decoding a model with a compressed KV cache: prefill with full
 * attention, compress the cache the prefill leaves with a method
 * (decode/ccache.h), then run one decode step per token over it; and the
 * teacher-forced perplexity run that compares such a decode with the
 * full-cache one token by token.
 *
 * A method's own prefill on the CPU runs layer by layer
 * (mkv_forward_run_by_layer) and compresses each layer as soon as it is
 * done, so that the dense cache of one layer exists at a time: its peak
 * memory is that layer plus the compressed cache, not the whole dense
 * cache.  A method that plans over every layer first
 * (mkv_ccache_needs_every_layer: per-head budgets) prefills the whole
 * dense cache and compresses it after.  Both give the logits and cache of
 * a decoder forked from a full prefill, bit for bit.
 *
 * The full cache ("full", or no method) is the model's own forward pass,
 * untouched: its logits are those of mkv-capture's run.  A method's decoder
 * either prefills itself or is forked from a full decoder that has just
 * prefilled, so that one prefill serves both sides of a comparison. */
#ifndef MKV_DECODER_H
#define MKV_DECODER_H

#include <stdint.h>
#include "core/mkv.h"
#include "methods/method.h"
#include "model/model.h"

typedef struct {
    const mkv_method *method;   /* NULL or the "full" method: the dense cache */
    const mkv_params *params;   /* NULL: the method's defaults */
    int threads;                /* forward pass and method workers (>= 1) */
    int chunk;                  /* prefill chunk in tokens; 0: 512 */
    int window;                 /* observation queries: the last window prefill positions (>= 1) */
    int max_new;                /* decode steps after the prefill */
    int gpu;                    /* 1: the forward pass on the GPU, with its dense cache
                                   (full, Quest) or the packed cache the CPU's
                                   compression left (MosaicKV); other methods are
                                   MKV_EUNSUP */
    int gpu_f16_weights;        /* with gpu: matrices in fp16 instead of float32 */
    int gpu_blockkey_bits;      /* with gpu, MosaicKV: its blocks scored with block keys of
                                   16 bits (or 0; the CPU's) or 8 (8-bit codes with a scale
                                   per row, the fp16 rows not kept; selection then differs
                                   from the CPU's by the codes' rounding) */
    int64_t fill;               /* > 0: the full cache's first `fill` positions hold the
                                   synthetic rows of core/kvfill.h (fill_seed) and the
                                   prefill runs after them: speed runs at long contexts
                                   (on the GPU also Quest's, and MosaicKV's as a synthetic
                                   packed cache, the prompt then decoded step by step) */
    uint64_t fill_seed;
    int batch;                  /* > 1 (on the GPU: full, Quest, MosaicKV): that many
                                   requests decoded together in one pass per step, each
                                   after its own filled rows (request r's from
                                   fill_seed + r x 0x9e3779b97f4a7c15; MosaicKV's
                                   synthetic caches differ per request, not by that rule) */
} mkv_decoder_opts;

void mkv_decoder_opts_init(mkv_decoder_opts *o);

typedef struct mkv_decoder mkv_decoder;

/* Prefill tokens[0..n) with full attention (logits: the last token's, or
 * NULL; with o->batch > 1 [batch][vocab], every request's) and compress
 * the cache unless the method is the full cache: layer by layer where the
 * method allows it (above).  With o->fill the tokens go at positions
 * fill.. after the filled rows (the full cache only).  MKV_EFORMAT when
 * fill + n + max_new exceeds the model's context. */
int mkv_decoder_prefill(const mkv_model *m, const int32_t *tokens, int64_t n, const mkv_decoder_opts *o,
                        float *logits, mkv_decoder **out, mkv_error *err);
/* The same for a batch of o->batch requests, request b's prompt
 * tokens[b][0..n[b]) (lengths may differ; after --fill, MosaicKV's must not,
 * its prompts being decoded step by step together).  MosaicKV's prompts
 * are prefilled and compressed on the CPU one after the other (a prompt
 * given twice, the same pointer and length, once), then every request's
 * packed heads go to one GPU pass. */
int mkv_decoder_prefill_batch(const mkv_model *m, const int32_t *const *tokens, const int64_t *n,
                              const mkv_decoder_opts *o, float *logits, mkv_decoder **out, mkv_error *err);

/* A decoder of o's method over the cache of full, a full-cache CPU decoder
 * that has prefilled and not stepped yet; full is unchanged. */
int mkv_decoder_fork(const mkv_decoder *full, const mkv_decoder_opts *o, mkv_decoder **out, mkv_error *err);

/* Run token at the next position; logits [vocab] of what follows it. */
int mkv_decoder_step(mkv_decoder *d, int32_t token, float *logits, mkv_error *err);
/* The same for every request of a batch: tokens [batch], logits
 * [batch][vocab]; a decoder of one request takes it too. */
int mkv_decoder_step_batch(mkv_decoder *d, const int32_t *tokens, float *logits, mkv_error *err);

void mkv_decoder_free(mkv_decoder *d);

typedef struct {
    int64_t tokens;            /* in the cache (of every request of a batch) */
    int64_t prefix_tokens;     /* compressed by the method (0 for the full cache) */
    int64_t tail_tokens;       /* decoded since, held dense */
    uint64_t bytes_held;       /* physical bytes of K and V held */
    uint64_t logical_bytes;    /* dense 16-bit K and V of the same tokens */
    uint64_t bytes_read;       /* read by attention in the last step */
    /* compress_seconds: building the compressed cache (compressing every
     * layer, loading the states); prefill_seconds: the forward pass of
     * the prefill without it, also where a prefill by layer interleaves
     * the two.  A forked decoder has its full decoder's prefill_seconds. */
    double prefill_seconds, compress_seconds;
    mkv_decode_counters growth;  /* the method's decode-time growth (mkv_ccache_stats) */
} mkv_decoder_stats;

void mkv_decoder_get_stats(const mkv_decoder *d, mkv_decoder_stats *s);

/* The end of a run: the method's pending decode-time work done and
 * published (mkv_ccache_flush). */
int mkv_decoder_finish(mkv_decoder *d, mkv_error *err);

/* ---------------------------------------------------------- perplexity */

typedef struct {
    int64_t context, scored;
    double nll;                /* mean negative log-likelihood, nats */
    double nll_full;           /* the same with the full cache (NaN without reference) */
    double nll_diff_se;        /* standard error of nll - nll_full: the sample standard
                                  deviation of the per-token differences over sqrt(scored),
                                  tokens taken as independent (NaN without reference or
                                  below 2 scored) */
    double kl;                 /* mean KL(full || method) of the next-token distribution */
    double agreement;          /* share of steps whose argmax equals the full cache's */
    uint64_t bytes_held, logical_bytes;   /* at the end of the run */
    uint64_t prefix_bytes_held, prefix_logical_bytes;  /* right after compression */
    double bytes_read_mean;    /* per step */
    double dense_read_mean;    /* what the full cache reads per step */
    double prefill_seconds, compress_seconds;
    double step_seconds;       /* mean decode step of the method */
    double step_seconds_full;  /* mean decode step of the full cache (NaN without reference) */
} mkv_ppl_result;

/* One scored token of a perplexity run. */
typedef struct {
    int64_t position;          /* of the target in the text */
    int32_t target;
    int32_t top1, top1_full;   /* the argmax of each next-token distribution (-1 without reference) */
    double logprob;            /* log p(target) with the method, nats */
    double logprob_full;       /* the same with the full cache (NaN without reference) */
    double kl;                 /* KL(full || method) of this step (NaN without reference) */
} mkv_ppl_token;

/* Teacher forcing: prefill tokens[0..context), compress, then feed
 * tokens[context..context+score) one decode step each and score the
 * prediction of tokens[context+1..context+score] (the prediction of
 * tokens[context] comes from the prefill and is the same for every
 * method, so it is not scored).  With reference, a full-cache decoder
 * forked from the same prefill runs in lockstep for KL and agreement.
 * per_token (may be NULL) receives the score scored tokens in order.
 * MKV_EFORMAT when n_tokens < context + score + 1. */
int mkv_decode_ppl(const mkv_model *m, const int32_t *tokens, size_t n_tokens, int64_t context, int64_t score,
                   const mkv_decoder_opts *o, int reference, mkv_ppl_result *r, mkv_ppl_token *per_token,
                   mkv_error *err);

/* mkv_decode_ppl over `windows` disjoint windows of the text, window i
 * the context + score + 1 tokens from token i (context + score + 1): one
 * prefill and compression each, their windows x score scored tokens
 * pooled into r (means over the tokens; the standard error from the
 * pooled differences; bytes held and read the mean of the windows;
 * prefill and compression seconds their sum). per_token (may be NULL)
 * receives windows x score tokens, positions in the whole text. */
int mkv_decode_ppl_windows(const mkv_model *m, const int32_t *tokens, size_t n_tokens, int64_t context,
                           int64_t score, int windows, const mkv_decoder_opts *o, int reference, mkv_ppl_result *r,
                           mkv_ppl_token *per_token, mkv_error *err);

/* The text is long enough for `windows` windows of context and score
 * (MKV_EFORMAT otherwise). */
int mkv_ppl_check(size_t n_tokens, int64_t context, int64_t score, int windows, mkv_error *err);

/* log softmax of logits [n] into out [n], in double. */
void mkv_log_softmax(const float *logits, int n, double *out);

#endif
