/* Internals of the Hugging Face loader: config.json (hf_config.c), the
 * safetensors weights (hf_weights.c) and the tokenizer files
 * (hf_tokenizer.c), put together by hf.c. */
#ifndef MKV_HF_PRIV_H
#define MKV_HF_PRIV_H

#include "core/mkv.h"
#include "model/hf.h"
#include "model/model.h"
#include "vocab/tokenizer.h"

#define MKV_HF_PATH_LEN 4096

/* dir/name into buf (MKV_HF_PATH_LEN bytes); -1 when it does not fit. */
int mkv_hf_join(char *buf, const char *dir, const char *name);
/* 1 when path is a regular file. */
int mkv_hf_is_file(const char *path);

/* mkv_hf_read_config, and config.json's architecture name into arch. */
int mkv_hf_read_config_arch(const char *dir, mkv_model_config *cfg, char arch[64], mkv_error *err);

typedef struct mkv_hf_weights mkv_hf_weights;

/* Check that the weights of config c fit in the memory available, open
 * model.safetensors or the shards of model.safetensors.index.json, and
 * check that they hold every tensor c implies with its shape and a float
 * dtype, and nothing unknown.  arch names the architecture in messages. */
int mkv_hf_weights_open(const char *dir, const char *arch, const mkv_model_config *c,
                        mkv_hf_weights **out, mkv_error *err);
/* Read every tensor into m (made from the same config), as float32,
 * refusing non-finite values. */
int mkv_hf_weights_read(mkv_hf_weights *w, mkv_model *m, mkv_error *err);
/* The dtype of the embedding on disk ("BF16", ...). */
const char *mkv_hf_weights_dtype(const mkv_hf_weights *w);
void mkv_hf_weights_close(mkv_hf_weights *w);

/* dir/tokenizer.json (with tokenizer_config.json and chat_template.jinja
 * when there) for model m: the tokenizer's BOS/EOS, where it has them,
 * become m's; info (may be NULL) gets add_bos and the chat template. */
int mkv_hf_tokenizer(const char *dir, mkv_model *m, mkv_tokenizer **tok, mkv_hf_info *info,
                     mkv_error *err);

#endif
