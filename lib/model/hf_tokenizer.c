/* The tokenizer files of a Hugging Face model directory (see hf.h). */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "model/hf_priv.h"
#include "vocab/tokenizer_json.h"

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

int mkv_hf_tokenizer(const char *dir, mkv_model *m, mkv_tokenizer **tok, mkv_hf_info *info,
                     mkv_error *err)
{
    char tj[MKV_HF_PATH_LEN], tc[MKV_HF_PATH_LEN], jinja[MKV_HF_PATH_LEN];
    if (mkv_hf_join(tj, dir, "tokenizer.json") || mkv_hf_join(tc, dir, "tokenizer_config.json") ||
        mkv_hf_join(jinja, dir, "chat_template.jinja"))
        return mkv_fail(err, MKV_EUSAGE, "'%s': directory name too long", dir);
    mkv_tokenizer_json_info ti = {0};
    int rc = mkv_tokenizer_json_load(tj, mkv_hf_is_file(tc) ? tc : NULL, m->cfg.vocab_size, tok, &ti,
                                     err);
    if (rc)
        return rc;
    if (!ti.chat_template && mkv_hf_is_file(jinja) &&
        (rc = read_text_file(jinja, &ti.chat_template, err))) {
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

