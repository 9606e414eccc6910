/* Shape-only models: the configuration of a published LLaMA-family model
 * (layer count, widths, heads, vocabulary, RoPE base) with seeded random
 * weights, for speed and memory measurements without the real weights.
 * Their outputs mean nothing and are never accuracy figures.
 *
 * Weights are uniform with the variance of N(0, 1/in) (in = the matrix's
 * input width), so every projection keeps unit-variance activations
 * unit-variance; norm weights are 1; q/k/v biases (Qwen2) have standard
 * deviation 0.2.  Each tensor is filled in blocks, each block from its own
 * substream keyed by (seed, original layer index, tensor, block), so a
 * layer's weights do not depend on which other layers are built or on the
 * thread count.
 */
#ifndef MKV_SHAPES_H
#define MKV_SHAPES_H

#include <stdint.h>
#include "core/mkv.h"
#include "model/model.h"

typedef struct {
    const char *name;         /* e.g. "llama3.1-8b" */
    const char *description;  /* the model it copies */
    int n_layers, dim, n_heads, n_kv_heads, head_dim, hidden_dim, vocab_size, max_seq_len;
    double rope_theta;
    float rms_eps;
    int tied_classifier, has_qkv_bias;
    int bos_id, eos_id;       /* -1 when the model has none */
    int add_bos;              /* its tokenizer starts prompts with BOS */
    /* Llama 3.1 "llama3" RoPE scaling: factor, low/high frequency factors,
     * original context (factor 0: none) */
    double rope_factor, rope_low, rope_high, rope_orig;
} mkv_shape;

/* The i-th known shape, NULL past the last. */
const mkv_shape *mkv_shape_at(int i);
/* Shape by name (case-insensitive), NULL if unknown. */
const mkv_shape *mkv_shape_find(const char *name);
/* "llama3.1-8b, qwen2.5-7b, ..." for messages. */
const char *mkv_shape_names(void);

/* Configuration of shape s built with n_layers layers and a vocabulary of
 * vocab tokens (0: the shape's); BOS/EOS ids outside the vocabulary become
 * -1.  Name "shape:NAME", HF rotate_half RoPE with the model's frequency
 * scaling. */
int mkv_shape_config(const mkv_shape *s, int n_layers, int vocab, mkv_model_config *cfg,
                     mkv_error *err);

/* Build the model of cfg (from mkv_shape_config) with random weights;
 * layer i of the model gets the weights of original layer layer_index[i]
 * (NULL: layer i).  threads <= 0 means 1. */
int mkv_shape_build(const mkv_model_config *cfg, const int *layer_index, uint64_t seed,
                    int threads, mkv_model **out, mkv_error *err);

/* Bytes a capture run needs besides the weights: KV cache for seq_len
 * positions, activations of a prefill chunk, logits, attention scratch of
 * `threads` threads.  An estimate (within a few percent). */
uint64_t mkv_run_bytes_estimate(const mkv_model_config *cfg, int seq_len, int chunk, int threads);

/* Memory the system can give this process now (MemAvailable of
 * /proc/meminfo, else free pages), 0 if unknown. */
uint64_t mkv_available_memory(void);

#endif
