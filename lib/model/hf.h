/* Hugging Face model directories: config.json + safetensors + tokenizer.json.
 *
 * A directory holds config.json, the weights as model.safetensors or as
 * shards listed by model.safetensors.index.json ("weight_map": tensor ->
 * shard file in the same directory), tokenizer.json and optionally
 * tokenizer_config.json (BOS/EOS, add_bos_token, chat_template) or
 * chat_template.jinja.
 *
 * Architectures: LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM
 * (q/k/v biases); others are refused by name.  HF stores q/k rows in
 * rotate_half order, so the model uses MKV_ROPE_HALF and the weights are
 * taken as they are.  rope_scaling (or transformers 5's rope_parameters)
 * of type "default", "linear" or "llama3" (Llama 3.1) becomes per-pair
 * frequency divisors in the config (mkv_model_config.rope_freq_factors);
 * the others (dynamic, yarn, longrope, ...) change more than the
 * frequencies and are refused by name.  A sliding window narrower than the context (Mistral
 * v0.1; Qwen2 with use_sliding_window) caps max_seq_len at the window, the
 * length up to which full attention computes the same thing.
 *
 * Tensors: model.embed_tokens.weight, model.layers.N.{input_layernorm,
 * post_attention_layernorm}.weight, model.layers.N.self_attn.{q,k,v,o}_proj
 * .weight, {q,k,v}_proj.bias (Qwen2), model.layers.N.mlp.{gate,up,down}_proj
 * .weight, model.norm.weight, lm_head.weight (unless tie_word_embeddings).
 * Dtypes F32, F16, BF16 (and F64), converted to float32 on load.  Every
 * shape is checked against config.json; a tensor the loader does not know
 * (an o_proj or MLP bias, say) is an error rather than silently ignored;
 * rotary_emb.inv_freq buffers are skipped.
 *
 * Memory: weights are held as float32, 4 bytes per parameter whatever the
 * file's dtype: an 8B model needs 32 GB.  The loader refuses (MKV_ENOMEM)
 * a model larger than the memory the system reports available, before
 * reading any weight.
 */
#ifndef MKV_HF_H
#define MKV_HF_H

#include "core/mkv.h"
#include "model/model.h"
#include "vocab/tokenizer.h"

typedef struct {
    char architecture[64]; /* config.json architectures[0] */
    char dtype[8];         /* dtype of the embedding on disk: "BF16", "F16", "F32", "F64" */
    int add_bos;           /* prompts start with BOS (see tokenizer_json.h) */
    char *chat_template;   /* Jinja source, malloc'd; NULL when the directory has none */
} mkv_hf_info;

/* Read dir/config.json into cfg (name = the directory's base name).  BOS
 * and EOS come from config.json's bos_token_id/eos_token_id (the first of a
 * list), -1 when absent. */
int mkv_hf_read_config(const char *dir, mkv_model_config *cfg, mkv_error *err);

/* Load the model and, when tok is non-NULL, its tokenizer (padded to the
 * model's vocabulary; the model's bos/eos become the tokenizer's when it
 * has them).  info may be NULL; free it with mkv_hf_info_free.  On error
 * nothing is returned. */
int mkv_hf_load(const char *dir, mkv_model **model, mkv_tokenizer **tok, mkv_hf_info *info,
                mkv_error *err);
void mkv_hf_info_free(mkv_hf_info *info);

#endif
