/* The safetensors weights of a Hugging Face model directory (see hf.h). */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "core/tensor.h"
#include "io/safetensors.h"
#include "model/hf_priv.h"

/* Bytes of memory the system says are available, or 0 when unknown. */
static uint64_t available_memory(void)
{
    FILE *fp = fopen("/proc/meminfo", "r");
    if (!fp)
        return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, fp))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    fclose(fp);
    return (uint64_t)kb * 1024;
}

static int check_memory(const mkv_model_config *c, const char *dir, mkv_error *err)
{
    double need = (double)mkv_model_storage_floats(c) * sizeof(float);
    uint64_t avail = available_memory();
    if (avail > 0 && need > (double)avail)
        return mkv_fail(err, MKV_ENOMEM,
                        "'%s': the weights take %.2f GiB as float32 (4 bytes per parameter whatever "
                        "the files' dtype); only %.2f GiB of memory is available",
                        dir, need / 1073741824.0, (double)avail / 1073741824.0);
    return MKV_OK;
}

/* ------------------------------------------------------------ tensors */

typedef struct {
    char name[96];
    int ndim;
    int64_t shape[2];
    float *dst;            /* set once the model exists */
    int shard;             /* file holding it */
    const mkv_st_tensor *t;
} want_tensor;

typedef struct {
    char path[MKV_HF_PATH_LEN];
    mkv_st_file *st;
} shard_file;

struct mkv_hf_weights {
    const char *dir;
    const char *arch;          /* for messages */
    char index_path[MKV_HF_PATH_LEN]; /* empty for a single model.safetensors */
    mkv_json_doc *index;
    const mkv_json *weight_map;
    shard_file *shards;
    int n_shards;
    want_tensor *want;
    int n_want;
};

static void add_want(mkv_hf_weights *w, float *dst, int ndim, int64_t d0, int64_t d1, const char *fmt, int layer)
{
    want_tensor *t = &w->want[w->n_want++];
    snprintf(t->name, sizeof t->name, fmt, layer);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->dst = dst;
    t->shard = -1;
    t->t = NULL;
}

/* The tensors config c implies, with destinations in m when non-NULL. */
static int list_tensors(mkv_hf_weights *w, const mkv_model_config *c, mkv_model *m, mkv_error *err)
{
    size_t per_layer = c->has_qkv_bias ? 12 : 9;
    size_t n = 3 + (size_t)c->n_layers * per_layer;
    free(w->want);
    w->n_want = 0;
    if (!(w->want = calloc(n, sizeof *w->want)))
        return mkv_fail(err, MKV_ENOMEM, "out of memory listing %zu tensors", n);
    int64_t dim = c->dim, hid = c->hidden_dim, vocab = c->vocab_size;
    int64_t qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim;
    add_want(w, m ? m->tok_embedding : NULL, 2, vocab, dim, "model.embed_tokens.weight", 0);
    for (int l = 0; l < c->n_layers; l++) {
        mkv_layer_weights *lw = m ? &m->layers[l] : NULL;
        add_want(w, lw ? lw->rms_att : NULL, 1, dim, 0, "model.layers.%d.input_layernorm.weight", l);
        add_want(w, lw ? lw->wq : NULL, 2, qd, dim, "model.layers.%d.self_attn.q_proj.weight", l);
        add_want(w, lw ? lw->wk : NULL, 2, kvd, dim, "model.layers.%d.self_attn.k_proj.weight", l);
        add_want(w, lw ? lw->wv : NULL, 2, kvd, dim, "model.layers.%d.self_attn.v_proj.weight", l);
        if (c->has_qkv_bias) {
            add_want(w, lw ? lw->bq : NULL, 1, qd, 0, "model.layers.%d.self_attn.q_proj.bias", l);
            add_want(w, lw ? lw->bk : NULL, 1, kvd, 0, "model.layers.%d.self_attn.k_proj.bias", l);
            add_want(w, lw ? lw->bv : NULL, 1, kvd, 0, "model.layers.%d.self_attn.v_proj.bias", l);
        }
        add_want(w, lw ? lw->wo : NULL, 2, dim, qd, "model.layers.%d.self_attn.o_proj.weight", l);
        add_want(w, lw ? lw->rms_ffn : NULL, 1, dim, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        add_want(w, lw ? lw->w1 : NULL, 2, hid, dim, "model.layers.%d.mlp.gate_proj.weight", l);
        add_want(w, lw ? lw->w3 : NULL, 2, hid, dim, "model.layers.%d.mlp.up_proj.weight", l);
        add_want(w, lw ? lw->w2 : NULL, 2, dim, hid, "model.layers.%d.mlp.down_proj.weight", l);
    }
    add_want(w, m ? m->rms_final : NULL, 1, dim, 0, "model.norm.weight", 0);
    if (!c->tied_classifier)
        add_want(w, m ? m->classifier : NULL, 2, vocab, dim, "lm_head.weight", 0);
    return MKV_OK;
}

void mkv_hf_weights_close(mkv_hf_weights *w)
{
    if (!w)
        return;
    for (int i = 0; i < w->n_shards; i++)
        mkv_st_close(w->shards[i].st);
    free(w->shards);
    free(w->want);
    mkv_json_free(w->index);
    free(w);
}

static int open_shard(mkv_hf_weights *w, const char *file, int *index, mkv_error *err)
{
    for (int i = 0; i < w->n_shards; i++) {
        if (!strcmp(strrchr(w->shards[i].path, '/') + 1, file)) {
            *index = i;
            return MKV_OK;
        }
    }
    shard_file *grown = realloc(w->shards, ((size_t)w->n_shards + 1) * sizeof *grown);
    if (!grown)
        return mkv_fail(err, MKV_ENOMEM, "out of memory opening shards");
    w->shards = grown;
    shard_file *s = &w->shards[w->n_shards];
    if (mkv_hf_join(s->path, w->dir, file))
        return mkv_fail(err, MKV_EUSAGE, "'%s': path of shard '%s' too long", w->dir, file);
    int rc = mkv_st_open(s->path, &s->st, err);
    if (rc)
        return rc;
    *index = w->n_shards++;
    return MKV_OK;
}

/* Open model.safetensors, or every shard model.safetensors.index.json names. */
static int open_weights(mkv_hf_weights *w, mkv_error *err)
{
    char single[MKV_HF_PATH_LEN];
    if (mkv_hf_join(w->index_path, w->dir, "model.safetensors.index.json") ||
        mkv_hf_join(single, w->dir, "model.safetensors"))
        return mkv_fail(err, MKV_EUSAGE, "'%s': directory name too long", w->dir);
    int dummy;
    if (!mkv_hf_is_file(w->index_path)) {
        w->index_path[0] = '\0';
        if (!mkv_hf_is_file(single))
            return mkv_fail(err, MKV_EIO, "'%s': neither model.safetensors nor "
                            "model.safetensors.index.json is there", w->dir);
        return open_shard(w, "model.safetensors", &dummy, err);
    }
    int rc = mkv_json_parse_file(w->index_path, NULL, &w->index, err);
    if (rc)
        return rc;
    w->weight_map = mkv_json_get(mkv_json_root(w->index), "weight_map");
    if (!w->weight_map || mkv_json_type_of(w->weight_map) != MKV_JSON_OBJECT)
        return mkv_fail(err, MKV_EFORMAT, "'%s': no \"weight_map\" object", w->index_path);
    for (size_t i = 0; i < mkv_json_len(w->weight_map); i++) {
        const char *tensor = mkv_json_key_at(w->weight_map, i, NULL);
        size_t len;
        const char *file = mkv_json_str(mkv_json_value_at(w->weight_map, i), &len);
        /* Shards live in the directory itself: no paths, no NULs. */
        if (!file || len == 0 || strlen(file) != len || strchr(file, '/') || !strcmp(file, "..") ||
            !strcmp(file, "."))
            return mkv_fail(err, MKV_EFORMAT, "'%s': tensor '%s' maps to an invalid shard name",
                            w->index_path, tensor);
        if ((rc = open_shard(w, file, &dummy, err))) {
            mkv_error_prefix(err, "'%s': shard of tensor '%s'", w->index_path, tensor);
            return rc;
        }
    }
    return MKV_OK;
}

static void format_shape(char *buf, size_t size, int ndim, const int64_t *shape)
{
    size_t at = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < ndim && at < size; i++)
        at += (size_t)snprintf(buf + at, size - at, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (at < size)
        snprintf(buf + at, size - at, "]");
}

/* A tensor in the files that is not in the list: skippable buffers only. */
static int check_known(mkv_hf_weights *w, const mkv_model_config *c, const char *file, const char *name,
                       mkv_error *err)
{
    for (int i = 0; i < w->n_want; i++)
        if (!strcmp(w->want[i].name, name))
            return MKV_OK;
    size_t n = strlen(name);
    const char *inv = ".rotary_emb.inv_freq";
    if (n >= strlen(inv) && !strcmp(name + n - strlen(inv), inv))
        return MKV_OK;
    if (c->tied_classifier && !strcmp(name, "lm_head.weight"))
        return MKV_OK;
    return mkv_fail(err, MKV_EUNSUP, "'%s': tensor '%s' is not part of the %s decoder this loader "
                    "knows; refusing to ignore it", file, name, w->arch);
}

/* Find every listed tensor and check dtype and shape; reject unknown ones. */
static int locate_tensors(mkv_hf_weights *w, const mkv_model_config *c, mkv_error *err)
{
    for (int i = 0; i < w->n_want; i++) {
        want_tensor *t = &w->want[i];
        int shard = 0;
        if (w->weight_map) {
            const mkv_json *file = mkv_json_get(w->weight_map, t->name);
            if (!file)
                return mkv_fail(err, MKV_EFORMAT, "'%s': tensor '%s' is missing from the weight_map",
                                w->index_path, t->name);
            int rc = open_shard(w, mkv_json_str(file, NULL), &shard, err);
            if (rc)
                return rc;
        }
        const char *path = w->shards[shard].path;
        t->shard = shard;
        t->t = mkv_st_find(w->shards[shard].st, t->name);
        if (!t->t) {
            if (w->weight_map)
                return mkv_fail(err, MKV_EFORMAT, "'%s': tensor '%s' is missing (the index places it "
                                "in this shard)", path, t->name);
            return mkv_fail(err, MKV_EFORMAT, "'%s': tensor '%s' is missing", path, t->name);
        }
        mkv_st_dtype d = t->t->dtype;
        if (d != MKV_ST_F32 && d != MKV_ST_F16 && d != MKV_ST_BF16 && d != MKV_ST_F64)
            return mkv_fail(err, MKV_EUNSUP, "'%s': tensor '%s' has dtype %s; only F32, F16 and BF16 "
                            "weights are supported", path, t->name, mkv_st_dtype_name(d));
        int same = t->t->ndim == t->ndim;
        for (int k = 0; same && k < t->ndim; k++)
            same = t->t->shape[k] == t->shape[k];
        if (!same) {
            char got[128], want[128];
            format_shape(got, sizeof got, t->t->ndim, t->t->shape);
            format_shape(want, sizeof want, t->ndim, t->shape);
            return mkv_fail(err, MKV_EFORMAT, "'%s': tensor '%s' has shape %s, config.json implies %s",
                            path, t->name, got, want);
        }
    }
    for (int s = 0; s < w->n_shards; s++) {
        for (size_t i = 0; i < mkv_st_count(w->shards[s].st); i++) {
            int rc = check_known(w, c, w->shards[s].path, mkv_st_tensor_at(w->shards[s].st, i)->name, err);
            if (rc)
                return rc;
        }
    }
    return MKV_OK;
}

int mkv_hf_weights_read(mkv_hf_weights *w, mkv_model *m, mkv_error *err)
{
    int rc = list_tensors(w, &m->cfg, m, err);
    if (rc || (rc = locate_tensors(w, &m->cfg, err)))
        return rc;
    for (int i = 0; i < w->n_want; i++) {
        want_tensor *t = &w->want[i];
        shard_file *s = &w->shards[t->shard];
        if ((rc = mkv_st_read_f32(s->st, t->t, 0, (size_t)t->t->numel, t->dst, err)))
            return rc;
        int64_t bad = mkv_find_nonfinite(t->dst, (size_t)t->t->numel);
        if (bad >= 0)
            return mkv_fail(err, MKV_EFORMAT, "'%s': tensor '%s' has a non-finite value at element %" PRId64,
                            s->path, t->name, bad);
    }
    return MKV_OK;
}


int mkv_hf_weights_open(const char *dir, const char *arch, const mkv_model_config *c,
                        mkv_hf_weights **out, mkv_error *err)
{
    *out = NULL;
    int rc = check_memory(c, dir, err);
    if (rc)
        return rc;
    mkv_hf_weights *w = calloc(1, sizeof *w);
    if (!w)
        return mkv_fail(err, MKV_ENOMEM, "'%s': out of memory", dir);
    w->dir = dir;
    w->arch = arch;
    if ((rc = open_weights(w, err)) || (rc = list_tensors(w, c, NULL, err)) ||
        (rc = locate_tensors(w, c, err))) {
        mkv_hf_weights_close(w);
        return rc;
    }
    *out = w;
    return MKV_OK;
}

const char *mkv_hf_weights_dtype(const mkv_hf_weights *w)
{
    return mkv_st_dtype_name(w->want[0].t->dtype);
}
