/* The model of a run and its prompt. */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "model/capture.h"
#include "model/run_model.h"

void mkv_shape_list(FILE *fp)
{
    fprintf(fp, "name\tlayers\tdim\theads\tkv_heads\thead_dim\thidden\tvocab\tcontext\trope_theta\t"
                "tied\tqkv_bias\tmodel\n");
    for (int i = 0; mkv_shape_at(i); i++) {
        const mkv_shape *s = mkv_shape_at(i);
        fprintf(fp, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%.0f\t%s\t%s\t%s\n", s->name, s->n_layers,
                s->dim, s->n_heads, s->n_kv_heads, s->head_dim, s->hidden_dim, s->vocab_size,
                s->max_seq_len, s->rope_theta, s->tied_classifier ? "yes" : "no",
                s->has_qkv_bias ? "yes" : "no", s->description);
    }
}

int mkv_prompt_opts_check(const mkv_prompt_opts *po, mkv_error *err)
{
    if (po->system && !po->chat)
        return mkv_fail(err, MKV_EUSAGE, "--system needs --chat");
    if (!!po->text + !!po->file + !!po->token_ids > 1)
        return mkv_fail(err, MKV_EUSAGE, "give only one of -p, -f and --token-ids");
    if (po->token_ids && po->chat)
        return mkv_fail(err, MKV_EUSAGE, "--chat applies to text prompts, not --token-ids");
    if (po->token_ids && po->special)
        return mkv_fail(err, MKV_EUSAGE, "--special applies to text prompts, not --token-ids");
    return MKV_OK;
}

static double gib(uint64_t bytes) { return (double)bytes / (1024.0 * 1024.0 * 1024.0); }

/* Build the shape-only model of cfg after checking that its weights and a
 * run of seq_len tokens fit in memory. */
static int build_shape(const mkv_run_model_opts *o, const mkv_shape *s, const mkv_model_config *cfg,
                       const int *layer_index, int seq_len, mkv_model **out, mkv_error *err)
{
    uint64_t weights = (uint64_t)mkv_model_storage_floats(cfg) * sizeof(float);
    uint64_t need = weights + mkv_run_bytes_estimate(cfg, seq_len, o->chunk, o->threads);
    uint64_t limit = o->max_memory > 0 ? (uint64_t)o->max_memory : mkv_available_memory();
    if (limit > 0 && need > limit)
        return mkv_fail(err, MKV_ENOMEM,
                        "shape %s with %d layers and a vocabulary of %d needs about %.1f GiB "
                        "(weights %.1f GiB), more than the %.1f GiB %s; build fewer layers "
                        "(--layers) or a smaller vocabulary (--vocab)",
                        s->name, cfg->n_layers, cfg->vocab_size, gib(need), gib(weights), gib(limit),
                        o->max_memory > 0 ? "of --max-memory" : "available");
    mkv_info("building shape %s: %d layers, %.2f GiB of random weights, seed %" PRIu64, s->name,
             cfg->n_layers, gib(weights), o->seed);
    return mkv_shape_build(cfg, layer_index, o->seed, o->threads, out, err);
}

int mkv_run_model_open(const mkv_run_model_opts *o, const mkv_prompt_opts *po, mkv_run_model *out,
                       mkv_error *err)
{
    memset(out, 0, sizeof *out);
    mkv_model_config cfg;
    int rc;
    if (o->path) {
        mkv_model_load_opts lo = {o->tokenizer, o->need_tokenizer, o->keep_blocks};
        if ((rc = mkv_model_load(o->path, &lo, &out->lm, err)))
            return rc;
        out->model = out->lm.model;
        cfg = out->model->cfg;
        if ((rc = mkv_layer_list_parse(o->layers, cfg.n_layers, &out->layer_index, &out->n_layers, err)) ||
            (rc = mkv_prompt_tokens(&out->lm, o->path, po, &out->prompt, err)))
            return rc;
    } else {
        if (!(out->shape = mkv_shape_find(o->shape)))
            return mkv_fail(err, MKV_EUSAGE, "unknown shape '%s' (known: %s)", o->shape, mkv_shape_names());
        if ((rc = mkv_layer_list_parse(o->layers, out->shape->n_layers, &out->layer_index, &out->n_layers,
                                       err)) ||
            (rc = mkv_shape_config(out->shape, out->n_layers, o->vocab, &cfg, err)) ||
            (rc = mkv_prompt_shape(out->shape, &cfg, po, o->random_tokens, o->seed, &out->prompt, err)))
            return rc;
    }
    if (o->run_tokens > 0 && out->prompt.n == 0)
        return mkv_fail(err, MKV_EFORMAT, "empty text");
    if (o->run_tokens > 0 && (rc = mkv_run_check(&cfg, (size_t)o->run_tokens, 0, err)))
        return mkv_fail(err, MKV_EFORMAT, "a run of %lld tokens exceeds the context of %d of model '%s'",
                        (long long)o->run_tokens, cfg.max_seq_len, cfg.name);
    int64_t fill = o->fill > 0 ? o->fill : 0;
    if (out->shape && fill > 0 && fill + (int64_t)out->prompt.n + o->generate > cfg.max_seq_len &&
        fill + (int64_t)out->prompt.n + o->generate <= INT32_MAX) {
        mkv_info("shape %s: context %d grown to %lld for the filled positions (random weights: speed only)",
                 out->shape->name, cfg.max_seq_len, (long long)(fill + (int64_t)out->prompt.n + o->generate));
        cfg.max_seq_len = (int)(fill + (int64_t)out->prompt.n + o->generate);
    }
    if (o->run_tokens <= 0 && (rc = mkv_run_check(&cfg, (size_t)fill + out->prompt.n, o->generate, err)))
        return rc;
    if (out->shape)
        rc = build_shape(o, out->shape, &cfg, out->layer_index,
                         (int)((o->fill_on_host ? fill : 0) + (int64_t)out->prompt.n + o->generate), &out->model, err);
    return rc;
}

void mkv_run_model_free(mkv_run_model *m)
{
    if (m->lm.model)
        mkv_loaded_model_free(&m->lm);
    else
        mkv_model_free(m->model);
    free(m->layer_index);
    free(m->prompt.tokens);
    memset(m, 0, sizeof *m);
}
