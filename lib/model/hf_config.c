/* config.json of a Hugging Face model directory (see hf.h). */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/json.h"
#include "model/hf_priv.h"

static const char *const SUPPORTED = "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM";

typedef enum { ARCH_LLAMA, ARCH_MISTRAL, ARCH_QWEN2 } hf_arch;

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

int mkv_hf_read_config_arch(const char *dir, mkv_model_config *cfg, char arch[64], mkv_error *err)
{
    char path[MKV_HF_PATH_LEN];
    if (mkv_hf_join(path, dir, "config.json"))
        return mkv_fail(err, MKV_EUSAGE, "'%s': directory name too long", dir);
    mkv_json_doc *doc;
    int rc = mkv_json_parse_file(path, NULL, &doc, err);
    if (rc)
        return rc;
    hf_extra x;
    rc = parse_config(mkv_json_root(doc), path, dir, cfg, &x, err);
    mkv_json_free(doc);
    if (rc == MKV_OK)
        snprintf(arch, 64, "%s", x.arch_name);
    return rc;
}

int mkv_hf_read_config(const char *dir, mkv_model_config *cfg, mkv_error *err)
{
    char arch[64];
    return mkv_hf_read_config_arch(dir, cfg, arch, err);
}
