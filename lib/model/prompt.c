/* The prompt of a model run as token ids, and the continuation as text. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/rng.h"
#include "model/prompt.h"
#include "vocab/chat.h"

void mkv_prompt_opts_init(mkv_prompt_opts *o)
{
    memset(o, 0, sizeof *o);
    o->bos = -1;
}

int mkv_read_file(const char *path, char **data, size_t *len, mkv_error *err)
{
    FILE *fp = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    const char *name = fp == stdin ? "(stdin)" : path;
    if (!fp)
        return mkv_fail_errno(err, MKV_EIO, errno, "cannot open '%s'", path);
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    int rc = MKV_OK;
    while (buf) {
        if (n + 1 >= cap) {
            char *bigger = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap * 2);
            if (!bigger) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = bigger;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, fp);
        n += got;
        if (got == 0)
            break;
    }
    if (!buf)
        rc = mkv_fail(err, MKV_ENOMEM, "'%s': out of memory", name);
    else if (ferror(fp))
        rc = mkv_fail_errno(err, MKV_EIO, errno, "'%s': read error", name);
    if (fp != stdin)
        fclose(fp);
    if (rc) {
        free(buf);
        return rc;
    }
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return MKV_OK;
}

int mkv_read_token_ids(const char *path, int vocab, mkv_idbuf *ids, mkv_error *err)
{
    char *text;
    size_t len;
    int rc = mkv_read_file(path, &text, &len, err);
    if (rc)
        return rc;
    const char *name = strcmp(path, "-") == 0 ? "(stdin)" : path;
    size_t base = ids->n;   /* ids already there (a BOS) are not the file's */
    char *p = text;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
            p++;
        if (*p == '\0' || (size_t)(p - text) >= len)
            break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        int sep = *end == '\0' || *end == ' ' || *end == '\t' || *end == '\n' || *end == '\r';
        if (end == p || !sep || errno) {
            int n = (int)strcspn(p, " \t\r\n");
            rc = mkv_fail(err, MKV_EFORMAT, "'%s': '%.*s' is not a token id", name, n > 40 ? 40 : n, p);
            break;
        }
        if (v < 0 || v >= vocab) {
            rc = mkv_fail(err, MKV_EFORMAT,
                          "'%s': token id %ld at index %zu is outside the vocabulary of %d", name, v,
                          ids->n - base, vocab);
            break;
        }
        if ((rc = mkv_idbuf_push(ids, (int32_t)v, err)))
            break;
        p = end;
    }
    free(text);
    if (!rc && ids->n == base)
        rc = mkv_fail(err, MKV_EFORMAT, "'%s': no token ids", name);
    return rc;
}

/* BOS (when bos) then the ids of path. */
static int prompt_from_ids(const char *path, int bos, int bos_id, int vocab, mkv_prompt *out,
                           mkv_error *err)
{
    mkv_idbuf ids = {0};
    int rc;
    if ((bos && (rc = mkv_idbuf_push(&ids, bos_id, err))) ||
        (rc = mkv_read_token_ids(path, vocab, &ids, err))) {
        free(ids.ids);
        return rc;
    }
    out->tokens = ids.ids;
    out->n = ids.n;
    out->bos = bos;
    return MKV_OK;
}

/* The prompt text: o->text, o->file, or stdin when it is not a terminal. */
static int read_prompt_text(const mkv_prompt_opts *o, char **text, size_t *len, mkv_error *err)
{
    if (o->text) {
        *text = strdup(o->text);
        *len = strlen(o->text);
        return *text ? MKV_OK : mkv_fail(err, MKV_ENOMEM, "out of memory");
    }
    if (o->file)
        return mkv_read_file(o->file, text, len, err);
    if (isatty(STDIN_FILENO))
        return mkv_fail(err, MKV_EUSAGE,
                        "no prompt: give -p TEXT, -f FILE or --token-ids FILE, or pipe the prompt "
                        "to standard input");
    return mkv_read_file("-", text, len, err);
}

/* Replace *text by its rendering in the chat template tmpl. */
static int wrap_in_chat(const char *tmpl, const char *model_path, const char *system, char **text,
                        size_t *len, mkv_prompt *out, mkv_error *err)
{
    mkv_chat_family fam;
    int rc;
    if (memchr(*text, '\0', *len))
        return mkv_fail(err, MKV_EFORMAT, "the prompt contains a NUL byte, which --chat cannot carry");
    if (!tmpl)
        return mkv_fail(err, MKV_EUNSUP, "'%s': the model has no chat template", model_path);
    if ((rc = mkv_chat_detect(tmpl, &fam, err)))
        return rc;
    char *chat;
    if ((rc = mkv_chat_render(tmpl, system, *text, &chat, err)))
        return rc;
    free(*text);
    *text = chat;
    *len = strlen(chat);
    out->chat_family = mkv_chat_family_name(fam);
    /* the template decides whether the conversation starts with BOS */
    out->bos = mkv_chat_wants_bos(tmpl);
    return MKV_OK;
}

int mkv_prompt_tokens(const mkv_loaded_model *lm, const char *model_path, const mkv_prompt_opts *o,
                      mkv_prompt *out, mkv_error *err)
{
    const mkv_model_config *c = &lm->model->cfg;
    memset(out, 0, sizeof *out);
    int rc;
    if (o->token_ids) {
        if (o->bos == 1 && c->bos_id < 0)
            return mkv_fail(err, MKV_EUSAGE, "--bos: the model has no BOS token");
        return prompt_from_ids(o->token_ids, o->bos == 1, c->bos_id, c->vocab_size, out, err);
    }
    char *text;
    size_t len;
    if ((rc = read_prompt_text(o, &text, &len, err)))
        return rc;
    if (len == 0) {
        free(text);
        return mkv_fail(err, MKV_EFORMAT, "empty prompt%s",
                        o->text ? "" : o->file && strcmp(o->file, "-") != 0 ? " file" : " on standard input");
    }
    out->bos = lm->add_bos;
    if (o->chat && (rc = wrap_in_chat(lm->chat_template, model_path, o->system, &text, &len, out, err))) {
        free(text);
        return rc;
    }
    if (o->bos >= 0)
        out->bos = o->bos;
    const mkv_tokenizer *t = lm->tok;
    if (out->bos && t->bos_id < 0) {
        if (o->bos == 1) {
            free(text);
            return mkv_fail(err, MKV_EUSAGE, "--bos: the model has no BOS token");
        }
        out->bos = 0;   /* a default the vocabulary cannot honour */
    }
    int flags = (out->bos ? MKV_ENCODE_BOS : 0) | (o->chat || o->special ? MKV_ENCODE_SPECIAL : 0);
    rc = mkv_tokenizer_encode(t, text, len, flags, &out->tokens, &out->n, err);
    free(text);
    return rc;
}

int mkv_prompt_shape(const mkv_shape *s, const mkv_model_config *c, const mkv_prompt_opts *o,
                     size_t n_random, uint64_t seed, mkv_prompt *out, mkv_error *err)
{
    memset(out, 0, sizeof *out);
    int bos = o->bos >= 0 ? o->bos : (o->token_ids ? 0 : s->add_bos && c->bos_id >= 0);
    if (bos && c->bos_id < 0)
        return mkv_fail(err, MKV_EUSAGE, "--bos: shape %s with a vocabulary of %d has no BOS token",
                        s->name, c->vocab_size);
    if (o->token_ids)
        return prompt_from_ids(o->token_ids, bos, c->bos_id, c->vocab_size, out, err);
    out->tokens = malloc((n_random ? n_random : 1) * sizeof *out->tokens);
    if (!out->tokens)
        return mkv_fail(err, MKV_ENOMEM, "out of memory for %zu prompt tokens", n_random);
    mkv_rng rng;
    const uint64_t key[1] = {UINT64_C(0x70726f6d7074)}; /* "prompt": apart from the weights' streams */
    mkv_rng_seed_stream(&rng, seed, key, 1);
    for (size_t i = 0; i < n_random; i++)
        out->tokens[i] = (int32_t)mkv_rng_below(&rng, (uint64_t)c->vocab_size);
    if (bos && n_random > 0)
        out->tokens[0] = c->bos_id;
    out->n = n_random;
    out->bos = bos;
    return MKV_OK;
}

void mkv_print_continuation(const mkv_tokenizer *t, const int32_t *tokens, size_t n_prompt,
                            size_t n_total, FILE *fp)
{
    for (size_t i = n_prompt; i < n_total; i++) {
        size_t len;
        const char *piece = mkv_tokenizer_piece(t, i > 0 ? tokens[i - 1] : -1, tokens[i], &len);
        if (piece)
            fwrite(piece, 1, len, fp);
    }
}

char *mkv_continuation_text(const mkv_tokenizer *t, const int32_t *tokens, size_t n_prompt,
                            size_t n_total)
{
    char *buf = NULL;
    size_t size = 0;
    FILE *fp = open_memstream(&buf, &size);
    if (!fp)
        return NULL;
    mkv_print_continuation(t, tokens, n_prompt, n_total, fp);
    fclose(fp);
    return buf;
}
