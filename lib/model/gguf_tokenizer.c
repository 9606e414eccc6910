/* The vocabulary and prompt settings of a GGUF file: tokenizer.ggml.*
 * metadata, checked for their types, handed to vocab/gguf_vocab.h. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "model/gguf_priv.h"
#include "vocab/gguf_vocab.h"

int mkv_gguf_token_id(const mkv_gguf *g, const char *key, int def, int n_vocab, int *out,
                      mkv_error *err)
{
    const mkv_gguf_value *v = mkv_gguf_find(g, key);
    int64_t x;
    if (!v) {
        *out = def;
        return MKV_OK;
    }
    if (mkv_gguf_value_int(v, &x) != 0)
        return mkv_fail(err, MKV_EFORMAT, "'%s': '%s' is a %s, not an integer", mkv_gguf_path(g),
                        key, mkv_gguf_type_name(v->type));
    if (x < -1 || x >= n_vocab)
        return mkv_fail(err, MKV_EFORMAT, "'%s': '%s' = %lld is outside the vocabulary of %d",
                        mkv_gguf_path(g), key, (long long)x, n_vocab);
    *out = (int)x;
    return MKV_OK;
}

/* tokenizer.ggml.tokens as C strings and their lengths. */
static int token_pieces(const mkv_gguf *g, const mkv_gguf_value *tokens, const char ***pieces,
                        size_t **lens, mkv_error *err)
{
    *pieces = malloc(tokens->n * sizeof **pieces);
    *lens = malloc(tokens->n * sizeof **lens);
    if (!*pieces || !*lens)
        return mkv_fail(err, MKV_ENOMEM, "'%s': out of memory for the vocabulary", mkv_gguf_path(g));
    for (uint64_t i = 0; i < tokens->n; i++) {
        const mkv_gguf_value *s = mkv_gguf_array_item(tokens, i);
        (*pieces)[i] = s->v.s;
        (*lens)[i] = (size_t)s->n;
    }
    return MKV_OK;
}

/* A string array of the tokenizer, as an array of C strings. */
static int string_list(const mkv_gguf *g, const char *key, const mkv_gguf_value *v,
                       const char ***out, mkv_error *err)
{
    *out = NULL;
    if (v->type != MKV_GGUF_ARRAY || v->elem_type != MKV_GGUF_STRING)
        return mkv_fail(err, MKV_EFORMAT, "'%s': '%s' is not an array of strings",
                        mkv_gguf_path(g), key);
    const char **list = malloc((v->n ? v->n : 1) * sizeof *list);
    if (!list)
        return mkv_fail(err, MKV_ENOMEM, "'%s': out of memory for '%s'", mkv_gguf_path(g), key);
    for (uint64_t i = 0; i < v->n; i++) {
        const mkv_gguf_value *s = mkv_gguf_array_item(v, i);
        if (strlen(s->v.s) != s->n) {
            free(list);
            return mkv_fail(err, MKV_EFORMAT, "'%s': '%s' entry %llu contains a NUL byte",
                            mkv_gguf_path(g), key, (unsigned long long)i);
        }
        list[i] = s->v.s;
    }
    *out = list;
    return MKV_OK;
}

/* tokenizer.ggml.token_type as mkv_token_type values (undefined = normal). */
static int token_types(const mkv_gguf *g, uint64_t n, int **out, mkv_error *err)
{
    *out = NULL;
    const mkv_gguf_value *v = mkv_gguf_find(g, "tokenizer.ggml.token_type");
    if (!v)
        return MKV_OK;
    if (v->type != MKV_GGUF_ARRAY || v->n != n)
        return mkv_fail(err, MKV_EFORMAT, "'%s': tokenizer.ggml.token_type is not an array of %llu "
                        "integers", mkv_gguf_path(g), (unsigned long long)n);
    int *types = malloc((n ? n : 1) * sizeof *types);
    if (!types)
        return mkv_fail(err, MKV_ENOMEM, "'%s': out of memory for token types", mkv_gguf_path(g));
    for (uint64_t i = 0; i < n; i++) {
        int64_t t;
        if (mkv_gguf_array_int(v, i, &t) != 0 || t < 0 || t > MKV_TOKEN_BYTE) {
            free(types);
            return mkv_fail(err, MKV_EFORMAT, "'%s': token %llu has an invalid type",
                            mkv_gguf_path(g), (unsigned long long)i);
        }
        types[i] = t == 0 ? MKV_TOKEN_NORMAL : (int)t;
    }
    *out = types;
    return MKV_OK;
}

/* tokenizer.ggml.scores as floats; NULL when absent. */
static int token_scores(const mkv_gguf *g, int n, float **out, mkv_error *err)
{
    *out = NULL;
    const mkv_gguf_value *v = mkv_gguf_find(g, "tokenizer.ggml.scores");
    if (!v)
        return MKV_OK;
    if (v->type != MKV_GGUF_ARRAY || v->n != (uint64_t)n)
        return mkv_fail(err, MKV_EFORMAT, "'%s': tokenizer.ggml.scores is not an array of %d numbers",
                        mkv_gguf_path(g), n);
    float *scores = malloc((size_t)n * sizeof *scores);
    if (!scores)
        return mkv_fail(err, MKV_ENOMEM, "'%s': out of memory for token scores", mkv_gguf_path(g));
    for (int id = 0; id < n; id++) {
        double score;
        if (mkv_gguf_array_float(v, (uint64_t)id, &score) != 0) {
            free(scores);
            return mkv_fail(err, MKV_EFORMAT, "'%s': tokenizer.ggml.scores entry %d is not a number",
                            mkv_gguf_path(g), id);
        }
        scores[id] = (float)score;
    }
    *out = scores;
    return MKV_OK;
}

static int bool_key(const mkv_gguf *g, const char *key, int def, int *out, mkv_error *err)
{
    const mkv_gguf_value *v = mkv_gguf_find(g, key);
    *out = def;
    if (v && mkv_gguf_value_bool(v, out) != 0)
        return mkv_fail(err, MKV_EFORMAT, "'%s': '%s' is a %s, not a bool", mkv_gguf_path(g), key,
                        mkv_gguf_type_name(v->type));
    return MKV_OK;
}

int mkv_gguf_tokenizer(const mkv_gguf *g, mkv_tokenizer **out, mkv_error *err)
{
    *out = NULL;
    const char *path = mkv_gguf_path(g);
    const char *model = mkv_gguf_value_str(mkv_gguf_find(g, "tokenizer.ggml.model"), NULL);
    const mkv_gguf_value *tokens = mkv_gguf_find(g, "tokenizer.ggml.tokens");
    if (!model || !tokens)
        return mkv_fail(err, MKV_EFORMAT, "'%s': the file has no vocabulary (tokenizer.ggml.model "
                        "and tokenizer.ggml.tokens)", path);
    if (tokens->type != MKV_GGUF_ARRAY || tokens->elem_type != MKV_GGUF_STRING ||
        tokens->n < 1 || tokens->n > INT32_MAX)
        return mkv_fail(err, MKV_EFORMAT, "'%s': tokenizer.ggml.tokens is not a non-empty array of "
                        "strings", path);
    mkv_gguf_vocab v = {.source = path, .model = model, .n_tokens = (int)tokens->n,
                        .add_space_prefix = -1};
    const char **pieces = NULL, **merges = NULL;
    size_t *lens = NULL;
    int *types = NULL;
    float *scores = NULL;
    int n = v.n_tokens, rc;
    if ((rc = token_pieces(g, tokens, &pieces, &lens, err)) ||
        (rc = token_types(g, tokens->n, &types, err)) ||
        (rc = mkv_gguf_token_id(g, "tokenizer.ggml.bos_token_id", MKV_GGUF_VOCAB_UNSET, n,
                                &v.bos_id, err)) ||
        (rc = mkv_gguf_token_id(g, "tokenizer.ggml.eos_token_id", MKV_GGUF_VOCAB_UNSET, n,
                                &v.eos_id, err)) ||
        (rc = mkv_gguf_token_id(g, "tokenizer.ggml.unknown_token_id", MKV_GGUF_VOCAB_UNSET, n,
                                &v.unk_id, err)))
        goto done;
    if (strcmp(model, "gpt2") == 0) {
        const mkv_gguf_value *mv = mkv_gguf_find(g, "tokenizer.ggml.merges");
        if (!mv) {
            rc = mkv_fail(err, MKV_EFORMAT, "'%s': tokenizer.ggml.merges is missing", path);
            goto done;
        }
        if ((rc = string_list(g, "tokenizer.ggml.merges", mv, &merges, err)))
            goto done;
        v.merges = merges;
        v.n_merges = (size_t)mv->n;
        v.pre = mkv_gguf_value_str(mkv_gguf_find(g, "tokenizer.ggml.pre"), NULL);
    } else if (strcmp(model, "llama") == 0) {
        const mkv_gguf_value *pv = mkv_gguf_find(g, "tokenizer.ggml.add_space_prefix");
        if (pv && mkv_gguf_value_bool(pv, &v.add_space_prefix) != 0) {
            rc = mkv_fail(err, MKV_EFORMAT, "'%s': tokenizer.ggml.add_space_prefix is not a bool",
                          path);
            goto done;
        }
        if ((rc = token_scores(g, n, &scores, err)))
            goto done;
        v.scores = scores;
    }
    v.tokens = pieces;
    v.token_lens = lens;
    v.types = types;
    rc = mkv_gguf_vocab_tokenizer(&v, out, err);
done:
    free(pieces);
    free(lens);
    free(merges);
    free(types);
    free(scores);
    return rc;
}

void mkv_gguf_extra_free(mkv_gguf_extra *x)
{
    if (!x)
        return;
    free(x->chat_template);
    memset(x, 0, sizeof *x);
}

int mkv_gguf_extra_get(const mkv_gguf *g, mkv_gguf_extra *x, mkv_error *err)
{
    memset(x, 0, sizeof *x);
    const char *model = mkv_gguf_value_str(mkv_gguf_find(g, "tokenizer.ggml.model"), NULL);
    const char *pre = mkv_gguf_value_str(mkv_gguf_find(g, "tokenizer.ggml.pre"), NULL);
    int rc;
    if ((rc = bool_key(g, "tokenizer.ggml.add_bos_token", mkv_gguf_vocab_default_add_bos(model, pre),
                       &x->add_bos, err)) ||
        (rc = bool_key(g, "tokenizer.ggml.add_eos_token", 0, &x->add_eos, err)))
        return rc;
    const mkv_gguf_value *tv = mkv_gguf_find(g, "tokenizer.chat_template");
    if (tv) {
        size_t len;
        const char *s = mkv_gguf_value_str(tv, &len);
        if (!s)
            return mkv_fail(err, MKV_EFORMAT, "'%s': tokenizer.chat_template is not a string",
                            mkv_gguf_path(g));
        if (!(x->chat_template = malloc(len + 1)))
            return mkv_fail(err, MKV_ENOMEM, "'%s': out of memory", mkv_gguf_path(g));
        memcpy(x->chat_template, s, len + 1);
    }
    return MKV_OK;
}
