/* Tokenizers from the tokenizer.ggml.* metadata of a GGUF file (see
 * gguf_vocab.h). */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <string.h>

#include "vocab/bpe_gpt2.h"
#include "vocab/gguf_vocab.h"

/* id, or def when the file does not give one. */
static int id_or(int id, int def) { return id == MKV_GGUF_VOCAB_UNSET ? def : id; }

static int gpt2_tokenizer(const mkv_gguf_vocab *v, mkv_tokenizer **out, mkv_error *err)
{
    for (int i = 0; i < v->n_tokens; i++)
        if (strlen(v->tokens[i]) != v->token_lens[i])
            return mkv_fail(err, MKV_EFORMAT, "'%s': 'tokenizer.ggml.tokens' entry %d contains a "
                            "NUL byte", v->source, i);
    int rc = mkv_bpe_gpt2_create(v->tokens, v->types, v->n_tokens, v->merges, v->n_merges, v->pre,
                                 id_or(v->bos_id, -1), id_or(v->eos_id, -1), out, err);
    if (rc) {
        mkv_error_prefix(err, "'%s'", v->source);
        return rc;
    }
    /* Only a real unknown token stands in for bytes the vocabulary lacks
     * (SmolLM2 names <|endoftext|>, a control token: encoding such a byte
     * is then an error rather than an end-of-text marker in the prompt). */
    int unk = id_or(v->unk_id, -1);
    if (unk >= 0 && (*out)->tokens[unk].type == MKV_TOKEN_UNKNOWN)
        (*out)->unk_id = unk;
    return MKV_OK;
}

/* "<0xNN>" pieces of a sentencepiece vocabulary without token types. */
static int looks_like_byte(const char *s)
{
    return strlen(s) == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>';
}

static int spm_tokenizer(const mkv_gguf_vocab *v, mkv_tokenizer **out, mkv_error *err)
{
    int n = v->n_tokens;
    mkv_tokenizer *t = NULL;
    int rc = mkv_tokenizer_new(&mkv_scored_bpe_ops, n, &t, err);
    if (rc)
        return rc;
    t->bos_id = id_or(v->bos_id, n > 1 ? 1 : -1);
    t->eos_id = id_or(v->eos_id, n > 2 ? 2 : -1);
    t->unk_id = id_or(v->unk_id, 0);
    int prefix = v->add_space_prefix < 0 ? 1 : v->add_space_prefix;
    t->add_space_prefix = prefix;
    t->strip_space_after_bos = prefix;
    strcpy(t->space, "\xE2\x96\x81"); /* U+2581 LOWER ONE EIGHTH BLOCK */
    for (int id = 0; id < n && rc == MKV_OK; id++) {
        const char *s = v->tokens[id];
        int type = v->types ? v->types[id]
                 : id == t->unk_id ? MKV_TOKEN_UNKNOWN
                 : id == t->bos_id || id == t->eos_id ? MKV_TOKEN_CONTROL
                 : looks_like_byte(s) ? MKV_TOKEN_BYTE : MKV_TOKEN_NORMAL;
        rc = mkv_tokenizer_set_token(t, id, s, v->token_lens[id], v->scores ? v->scores[id] : 0.0f,
                                     type, err);
    }
    if (rc == MKV_OK)
        rc = mkv_tokenizer_finish(t, err);
    if (rc) {
        mkv_error_prefix(err, "'%s'", v->source);
        mkv_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return MKV_OK;
}

int mkv_gguf_vocab_tokenizer(const mkv_gguf_vocab *v, mkv_tokenizer **out, mkv_error *err)
{
    *out = NULL;
    if (strcmp(v->model, "gpt2") == 0)
        return gpt2_tokenizer(v, out, err);
    if (strcmp(v->model, "llama") == 0)
        return spm_tokenizer(v, out, err);
    return mkv_fail(err, MKV_EUNSUP, "'%s': tokenizer model '%.64s' is not supported (only 'gpt2' "
                    "and 'llama')", v->source, v->model);
}

int mkv_gguf_vocab_default_add_bos(const char *model, const char *pre)
{
    return !model || strcmp(model, "llama") == 0 ||
           (pre && (strcmp(pre, "llama3") == 0 || strcmp(pre, "llama-bpe") == 0 ||
                    strcmp(pre, "llama-v3") == 0));
}
