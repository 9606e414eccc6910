/* Hugging Face model directories (see hf.h). */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/hf.h"
#include "core/json.h"
#include "io/safetensors.h"
#include "core/tensor.h"
#include "vocab/tokenizer_json.h"

#define PATH_LEN 4096

static const char *const SUPPORTED = "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM";

typedef enum { ARCH_LLAMA, ARCH_MISTRAL, ARCH_QWEN2 } hf_arch;

static int join(char *buf, const char *dir, const char *name)
{
    return snprintf(buf, PATH_LEN, "%s/%s", dir, name) < PATH_LEN ? 0 : -1;
}

static int is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* ------------------------------------------------------------ config.json */

/* A member that is absent or JSON null reads as absent. */
static const mkv_json *member(const mkv_json *obj, const char *key)
{
    const mkv_json *v = mkv_json_get(obj, key);
    return v && mkv_json_type_of(v) != MKV_JSON_NULL ? v : NULL;
}

/* Integer field in [lo, INT_MAX]; *out keeps its value when the field is
 * absent and not required. */
static int get_int(const mkv_json *obj, const char *path, const char *key, int required, long lo,
                   int *out, mkv_error *err)
{
    const mkv_json *v = member(obj, key);
    if (!v) {
        if (required)
            return mkv_fail(err, MKV_EFORMAT, "'%s': required field \"%s\" is missing", path, key);
        return MKV_OK;
    }
    int64_t i;
    if (mkv_json_int64(v, &i) != 0)
        return mkv_fail(err, MKV_EFORMAT, "'%s': \"%s\" must be an integer, not %s", path, key,
                        mkv_json_type_name(mkv_json_type_of(v)));
    if (i < lo || i > INT_MAX)
        return mkv_fail(err, MKV_EFORMAT, "'%s': \"%s\" = %" PRId64 " is out of range [%ld, %d]", path,
                        key, i, lo, INT_MAX);
    *out = (int)i;
    return MKV_OK;
}

static int get_number(const mkv_json *obj, const char *path, const char *key, double *out,
                      mkv_error *err)
{
    const mkv_json *v = member(obj, key);
    if (v && mkv_json_double(v, out) != 0)
        return mkv_fail(err, MKV_EFORMAT, "'%s': \"%s\" must be a number, not %s", path, key,
                        mkv_json_type_name(mkv_json_type_of(v)));
    return MKV_OK;
}

static int get_bool(const mkv_json *obj, const char *path, const char *key, int *out, mkv_error *err)
{
    const mkv_json *v = member(obj, key);
    if (v && mkv_json_bool(v, out) != 0)
        return mkv_fail(err, MKV_EFORMAT, "'%s': \"%s\" must be true or false, not %s", path, key,
                        mkv_json_type_name(mkv_json_type_of(v)));
    return MKV_OK;
}

/* bos_token_id / eos_token_id: an integer, a list (the first counts) or null. */
static int get_token_id(const mkv_json *obj, const char *path, const char *key, int *out,
                        mkv_error *err)
{
    const mkv_json *v = member(obj, key);
    *out = -1;
    if (!v)
        return MKV_OK;
    if (mkv_json_type_of(v) == MKV_JSON_ARRAY) {
        if (mkv_json_len(v) == 0)
            return MKV_OK;
        v = mkv_json_at(v, 0);
    }
    int64_t i;
    if (mkv_json_int64(v, &i) != 0 || i < 0 || i > INT_MAX)
        return mkv_fail(err, MKV_EFORMAT, "'%s': \"%s\" must be a token id", path, key);
    *out = (int)i;
    return MKV_OK;
}

static int parse_arch(const mkv_json *root, const char *path, hf_arch *arch, char name[64],
                      mkv_error *err)
{
    const mkv_json *list = member(root, "architectures"), *type = member(root, "model_type");
    const char *s = NULL;
    if (list && mkv_json_type_of(list) == MKV_JSON_ARRAY && mkv_json_len(list) > 0)
        s = mkv_json_str(mkv_json_at(list, 0), NULL);
    else if (list)
        return mkv_fail(err, MKV_EFORMAT, "'%s': \"architectures\" must be a list of names", path);
    if (!s && type) {
        const char *t = mkv_json_str(type, NULL);
        s = !t ? NULL : !strcmp(t, "llama") ? "LlamaForCausalLM"
          : !strcmp(t, "mistral") ? "MistralForCausalLM" : !strcmp(t, "qwen2") ? "Qwen2ForCausalLM" : t;
    }
    if (!s)
        return mkv_fail(err, MKV_EFORMAT, "'%s': neither \"architectures\" nor \"model_type\" names "
                        "the model's architecture", path);
    snprintf(name, 64, "%s", s);
    if (!strcmp(s, "LlamaForCausalLM"))
        *arch = ARCH_LLAMA;
    else if (!strcmp(s, "MistralForCausalLM"))
        *arch = ARCH_MISTRAL;
    else if (!strcmp(s, "Qwen2ForCausalLM"))
        *arch = ARCH_QWEN2;
    else
        return mkv_fail(err, MKV_EUNSUP, "'%s': architecture '%s' is not supported (supported: %s)",
                        path, s, SUPPORTED);
    return MKV_OK;
}

/* A number that must be present, finite and > 0. */
static int get_positive(const mkv_json *obj, const char *path, const char *where, const char *key,
                        double *out, mkv_error *err)
{
    const mkv_json *v = member(obj, key);
    if (!v)
        return mkv_fail(err, MKV_EFORMAT, "'%s': %s.%s is missing", path, where, key);
    if (mkv_json_double(v, out) != 0 || !(*out > 0.0 && isfinite(*out)))
        return mkv_fail(err, MKV_EFORMAT, "'%s': %s.%s must be a number > 0", path, where, key);
    return MKV_OK;
}

/* Frequency divisors of one rope_scaling object of a known type. */
static int rope_factors(const mkv_json *s, const char *path, const char *where, const char *type,
                        mkv_model_config *c, mkv_error *err)
{
    double factor, low, high, orig;
    int rc;
    if ((rc = get_positive(s, path, where, "factor", &factor, err)))
        return rc;
    if (c->rope_dim / 2 > MKV_ROPE_MAX_PAIRS)
        return mkv_fail(err, MKV_EFORMAT, "'%s': %d rotated channels per head is more than the "
                        "%d supported", path, c->rope_dim, 2 * MKV_ROPE_MAX_PAIRS);
    if (!strcmp(type, "linear")) {
        for (int j = 0; j < c->rope_dim / 2; j++)
            c->rope_freq_factors[j] = (float)factor;
    } else {
        if ((rc = get_positive(s, path, where, "low_freq_factor", &low, err)) ||
            (rc = get_positive(s, path, where, "high_freq_factor", &high, err)) ||
            (rc = get_positive(s, path, where, "original_max_position_embeddings", &orig, err)))
            return rc;
        if (!(high > low))
            return mkv_fail(err, MKV_EFORMAT, "'%s': %s.high_freq_factor = %g must exceed "
                            "low_freq_factor = %g", path, where, high, low);
        mkv_rope_llama3_factors(c->rope_theta, c->rope_dim, factor, low, high, orig,
                                c->rope_freq_factors);
    }
    c->has_rope_freq_factors = 1;
    return MKV_OK;
}

/* rope_scaling (or transformers 5's rope_parameters, which also carries
 * rope_theta): plain RoPE, "linear" (every frequency divided by factor) or
 * Llama 3.1's "llama3".  The others (dynamic NTK, YaRN, LongRoPE) change
 * more than the frequencies and are refused by name. */
static int parse_rope_scaling(const mkv_json *root, const char *path, mkv_model_config *c,
                              mkv_error *err)
{
    const char *keys[] = {"rope_scaling", "rope_parameters"};
    int rc;
    /* The base first: the llama3 factors depend on it. */
    for (int k = 0; k < 2; k++) {
        const mkv_json *s = member(root, keys[k]);
        if (s && mkv_json_type_of(s) != MKV_JSON_OBJECT)
            return mkv_fail(err, MKV_EFORMAT, "'%s': \"%s\" must be an object or null", path, keys[k]);
        if (s && (rc = get_number(s, path, "rope_theta", &c->rope_theta, err)))
            return rc;
    }
    for (int k = 0; k < 2; k++) {
        const mkv_json *s = member(root, keys[k]);
        if (!s)
            continue;
        const mkv_json *type = member(s, "rope_type");
        if (!type)
            type = member(s, "type");
        const char *name = type ? mkv_json_str(type, NULL) : "default";
        if (!name)
            return mkv_fail(err, MKV_EFORMAT, "'%s': %s.rope_type must be a string", path, keys[k]);
        if (!strcmp(name, "linear") || !strcmp(name, "llama3")) {
            if ((rc = rope_factors(s, path, keys[k], name, c, err)))
                return rc;
        } else if (strcmp(name, "default") != 0) {
            return mkv_fail(err, MKV_EUNSUP, "'%s': %s of type '%s' is not supported (supported: "
                            "default, linear, llama3)", path, keys[k], name);
        }
    }
    return MKV_OK;
}

/* What the loader needs besides the mkv_model_config. */
typedef struct {
    hf_arch arch;
    char arch_name[64];
} hf_extra;

static int parse_config(const mkv_json *root, const char *path, const char *dir, mkv_model_config *c,
                        hf_extra *x, mkv_error *err)
{
    int rc;
    if (mkv_json_type_of(root) != MKV_JSON_OBJECT)
        return mkv_fail(err, MKV_EFORMAT, "'%s': not a JSON object", path);
    if ((rc = parse_arch(root, path, &x->arch, x->arch_name, err)))
        return rc;
    mkv_model_config_defaults(c);
    /* Name: the directory's base name, trailing slashes ignored. */
    size_t end = strlen(dir);
    while (end > 1 && dir[end - 1] == '/')
        end--;
    size_t start = end;
    while (start > 0 && dir[start - 1] != '/')
        start--;
    snprintf(c->name, sizeof c->name, "%.*s", (int)(end - start), dir + start);
    c->rope_layout = MKV_ROPE_HALF;
    c->rms_eps = 1e-6f; /* the transformers default of all three families */
    c->tied_classifier = 0;
    c->has_qkv_bias = x->arch == ARCH_QWEN2;

    if ((rc = get_int(root, path, "hidden_size", 1, 1, &c->dim, err)) ||
        (rc = get_int(root, path, "intermediate_size", 1, 1, &c->hidden_dim, err)) ||
        (rc = get_int(root, path, "num_hidden_layers", 1, 1, &c->n_layers, err)) ||
        (rc = get_int(root, path, "num_attention_heads", 1, 1, &c->n_heads, err)) ||
        (rc = get_int(root, path, "vocab_size", 1, 1, &c->vocab_size, err)) ||
        (rc = get_int(root, path, "max_position_embeddings", 1, 1, &c->max_seq_len, err)))
        return rc;
    c->n_kv_heads = c->n_heads;
    if ((rc = get_int(root, path, "num_key_value_heads", 0, 1, &c->n_kv_heads, err)))
        return rc;
    if (c->dim % c->n_heads != 0 && !member(root, "head_dim"))
        return mkv_fail(err, MKV_EFORMAT, "'%s': hidden_size = %d is not a multiple of "
                        "num_attention_heads = %d and no head_dim is given", path, c->dim, c->n_heads);
    c->head_dim = c->dim / c->n_heads;
    if ((rc = get_int(root, path, "head_dim", 0, 1, &c->head_dim, err)))
        return rc;
    c->rope_dim = c->head_dim;
    if (member(root, "partial_rotary_factor")) {
        double factor;
        if ((rc = get_number(root, path, "partial_rotary_factor", &factor, err)))
            return rc;
        double rotated = c->head_dim * factor;
        if (!(factor > 0.0 && factor <= 1.0) || rotated != floor(rotated) || fmod(rotated, 2.0) != 0.0)
            return mkv_fail(err, MKV_EFORMAT, "'%s': partial_rotary_factor = %g does not give an even "
                            "number of rotated channels of the %d of a head", path, factor, c->head_dim);
        c->rope_dim = (int)rotated;
    }

    double eps = c->rms_eps;
    if ((rc = get_number(root, path, "rms_norm_eps", &eps, err)) ||
        (rc = get_number(root, path, "rope_theta", &c->rope_theta, err)) ||
        (rc = parse_rope_scaling(root, path, c, err)) ||
        (rc = get_bool(root, path, "tie_word_embeddings", &c->tied_classifier, err)) ||
        (rc = get_token_id(root, path, "bos_token_id", &c->bos_id, err)) ||
        (rc = get_token_id(root, path, "eos_token_id", &c->eos_id, err)))
        return rc;
    c->rms_eps = (float)eps;

    const mkv_json *act = member(root, "hidden_act");
    const char *act_name = act ? mkv_json_str(act, NULL) : "silu";
    if (!act_name || strcmp(act_name, "silu") != 0)
        return mkv_fail(err, MKV_EUNSUP, "'%s': hidden_act '%s' is not supported (only silu)", path,
                        act_name ? act_name : "(not a string)");
    int attention_bias = 0, mlp_bias = 0;
    if ((rc = get_bool(root, path, "attention_bias", &attention_bias, err)) ||
        (rc = get_bool(root, path, "mlp_bias", &mlp_bias, err)))
        return rc;
    if (x->arch != ARCH_QWEN2 && attention_bias)
        return mkv_fail(err, MKV_EUNSUP, "'%s': attention_bias = true (biases on q, k, v and o) is "
                        "not supported", path);
    if (mlp_bias)
        return mkv_fail(err, MKV_EUNSUP, "'%s': mlp_bias = true is not supported", path);

    int window = 0, use_window = x->arch == ARCH_MISTRAL;
    if (x->arch == ARCH_QWEN2 && (rc = get_bool(root, path, "use_sliding_window", &use_window, err)))
        return rc;
    if (use_window && (rc = get_int(root, path, "sliding_window", 0, 1, &window, err)))
        return rc;
    if (window > 0 && window < c->max_seq_len)
        c->max_seq_len = window;

    /* config.json may name special tokens the vocabulary does not have. */
    if (c->bos_id >= c->vocab_size)
        c->bos_id = -1;
    if (c->eos_id >= c->vocab_size)
        c->eos_id = -1;
    return mkv_model_config_check(c, path, err);
}

static int read_config(const char *dir, mkv_model_config *cfg, hf_extra *x, mkv_error *err)
{
    char path[PATH_LEN];
    if (join(path, dir, "config.json"))
        return mkv_fail(err, MKV_EUSAGE, "'%s': directory name too long", dir);
    mkv_json_doc *doc;
    int rc = mkv_json_parse_file(path, NULL, &doc, err);
    if (rc)
        return rc;
    rc = parse_config(mkv_json_root(doc), path, dir, cfg, x, err);
    mkv_json_free(doc);
    return rc;
}

int mkv_hf_read_config(const char *dir, mkv_model_config *cfg, mkv_error *err)
{
    hf_extra x;
    return read_config(dir, cfg, &x, err);
}

/* ------------------------------------------------------------ memory */

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
    char path[PATH_LEN];
    mkv_st_file *st;
} shard_file;

typedef struct {
    const char *dir;
    const char *arch;          /* for messages */
    char index_path[PATH_LEN]; /* empty for a single model.safetensors */
    mkv_json_doc *index;
    const mkv_json *weight_map;
    shard_file *shards;
    int n_shards;
    want_tensor *want;
    int n_want;
} hf_weights;

static void add_want(hf_weights *w, float *dst, int ndim, int64_t d0, int64_t d1, const char *fmt, int layer)
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
static int list_tensors(hf_weights *w, const mkv_model_config *c, mkv_model *m, mkv_error *err)
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

static void close_weights(hf_weights *w)
{
    for (int i = 0; i < w->n_shards; i++)
        mkv_st_close(w->shards[i].st);
    free(w->shards);
    free(w->want);
    mkv_json_free(w->index);
}

static int open_shard(hf_weights *w, const char *file, int *index, mkv_error *err)
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
    if (join(s->path, w->dir, file))
        return mkv_fail(err, MKV_EUSAGE, "'%s': path of shard '%s' too long", w->dir, file);
    int rc = mkv_st_open(s->path, &s->st, err);
    if (rc)
        return rc;
    *index = w->n_shards++;
    return MKV_OK;
}

/* Open model.safetensors, or every shard model.safetensors.index.json names. */
static int open_weights(hf_weights *w, mkv_error *err)
{
    char single[PATH_LEN];
    if (join(w->index_path, w->dir, "model.safetensors.index.json") || join(single, w->dir, "model.safetensors"))
        return mkv_fail(err, MKV_EUSAGE, "'%s': directory name too long", w->dir);
    int dummy;
    if (!is_file(w->index_path)) {
        w->index_path[0] = '\0';
        if (!is_file(single))
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
static int check_known(hf_weights *w, const mkv_model_config *c, const char *file, const char *name,
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
static int locate_tensors(hf_weights *w, const mkv_model_config *c, mkv_error *err)
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

static int read_tensors(hf_weights *w, mkv_model *m, mkv_error *err)
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

/* ------------------------------------------------------------ tokenizer */

static int read_text_file(const char *path, char **out, mkv_error *err)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return mkv_fail_errno(err, MKV_EIO, errno, "cannot open '%s'", path);
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int rc = MKV_OK;
    for (;;) {
        if (cap - len < 4096) {
            char *grown = cap < ((size_t)1 << 30) ? realloc(buf, cap ? 2 * cap : 8192) : NULL;
            if (!grown) {
                rc = mkv_fail(err, MKV_ENOMEM, "'%s': out of memory or too large", path);
                break;
            }
            buf = grown;
            cap = cap ? 2 * cap : 8192;
        }
        size_t got = fread(buf + len, 1, cap - len - 1, fp);
        len += got;
        if (got == 0) {
            if (ferror(fp))
                rc = mkv_fail_errno(err, MKV_EIO, errno, "cannot read '%s'", path);
            break;
        }
    }
    fclose(fp);
    if (rc) {
        free(buf);
        return rc;
    }
    buf[len] = '\0';
    *out = buf;
    return MKV_OK;
}

static int load_tokenizer(const char *dir, mkv_model *m, mkv_tokenizer **tok, mkv_hf_info *info,
                          mkv_error *err)
{
    char tj[PATH_LEN], tc[PATH_LEN], jinja[PATH_LEN];
    if (join(tj, dir, "tokenizer.json") || join(tc, dir, "tokenizer_config.json") ||
        join(jinja, dir, "chat_template.jinja"))
        return mkv_fail(err, MKV_EUSAGE, "'%s': directory name too long", dir);
    mkv_tokenizer_json_info ti = {0};
    int rc = mkv_tokenizer_json_load(tj, is_file(tc) ? tc : NULL, m->cfg.vocab_size, tok, &ti, err);
    if (rc)
        return rc;
    if (!ti.chat_template && is_file(jinja) && (rc = read_text_file(jinja, &ti.chat_template, err))) {
        mkv_tokenizer_free(*tok);
        *tok = NULL;
        return rc;
    }
    mkv_tokenizer *t = *tok;
    /* The tokenizer files know the special tokens better than config.json
     * (instruct models end turns with another token than the base model). */
    if (t->bos_id < 0)
        t->bos_id = m->cfg.bos_id;
    if (t->eos_id < 0)
        t->eos_id = m->cfg.eos_id;
    m->cfg.bos_id = t->bos_id;
    m->cfg.eos_id = t->eos_id;
    if (info) {
        info->add_bos = ti.add_bos && t->bos_id >= 0;
        info->chat_template = ti.chat_template;
        ti.chat_template = NULL;
    }
    mkv_tokenizer_json_info_free(&ti);
    return MKV_OK;
}

/* ------------------------------------------------------------ load */

int mkv_hf_load(const char *dir, mkv_model **model, mkv_tokenizer **tok, mkv_hf_info *info,
                mkv_error *err)
{
    *model = NULL;
    if (tok)
        *tok = NULL;
    if (info)
        memset(info, 0, sizeof *info);
    mkv_model_config cfg;
    hf_extra x;
    int rc = read_config(dir, &cfg, &x, err);
    if (rc)
        return rc;
    if ((rc = check_memory(&cfg, dir, err)))
        return rc;
    hf_weights w = {.dir = dir, .arch = x.arch_name};
    mkv_model *m = NULL;
    if ((rc = open_weights(&w, err)) || (rc = list_tensors(&w, &cfg, NULL, err)) ||
        (rc = locate_tensors(&w, &cfg, err)) || (rc = mkv_model_create(&cfg, &m, err)) ||
        (rc = read_tensors(&w, m, err)))
        goto fail;
    if (info) {
        snprintf(info->architecture, sizeof info->architecture, "%s", x.arch_name);
        snprintf(info->dtype, sizeof info->dtype, "%s", mkv_st_dtype_name(w.want[0].t->dtype));
    }
    if (tok && (rc = load_tokenizer(dir, m, tok, info, err)))
        goto fail;
    close_weights(&w);
    *model = m;
    return MKV_OK;
fail:
    close_weights(&w);
    mkv_model_free(m);
    return rc;
}

void mkv_hf_info_free(mkv_hf_info *info)
{
    if (!info)
        return;
    free(info->chat_template);
    info->chat_template = NULL;
}
