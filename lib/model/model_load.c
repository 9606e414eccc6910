/* Model format detection and loading through the format's loader. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/gguf.h"
#include "model/hf.h"
#include "model/model_load.h"

const char *mkv_model_format_name(mkv_model_format f)
{
    switch (f) {
    case MKV_FORMAT_LLAMA2C: return "llama2.c";
    case MKV_FORMAT_GGUF: return "gguf";
    case MKV_FORMAT_HF: return "hf";
    }
    return "?";
}

int mkv_model_detect(const char *path, mkv_model_format *format, mkv_error *err)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return mkv_fail_errno(err, MKV_EIO, errno, "cannot open '%s'", path);
    if (S_ISDIR(st.st_mode)) {
        char cfg[4200];
        snprintf(cfg, sizeof cfg, "%s/config.json", path);
        if (access(cfg, F_OK) != 0)
            return mkv_fail(err, MKV_EFORMAT,
                            "'%s': a directory without config.json is not a Hugging Face model", path);
        *format = MKV_FORMAT_HF;
        return MKV_OK;
    }
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return mkv_fail_errno(err, MKV_EIO, errno, "cannot open '%s'", path);
    char magic[4];
    size_t got = fread(magic, 1, sizeof magic, fp);
    int read_error = ferror(fp);
    fclose(fp);
    if (read_error)
        return mkv_fail(err, MKV_EIO, "'%s': read error", path);
    *format = got == 4 && memcmp(magic, "GGUF", 4) == 0 ? MKV_FORMAT_GGUF : MKV_FORMAT_LLAMA2C;
    return MKV_OK;
}

/* Directory part of path ("." when it has none) into buf. */
static void dir_of(const char *path, char *buf, size_t size)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(buf, size, ".");
    else if (slash == path)
        snprintf(buf, size, "/");
    else
        snprintf(buf, size, "%.*s", (int)(slash - path), path);
}

/* The llama2.c tokenizer of a checkpoint: opts' file, else tokenizer.bin
 * or tok<vocab>.bin beside it.  Leaves *tok NULL when none is found and
 * none is required. */
static int load_llama2c_tokenizer(const char *path, const mkv_model_load_opts *o,
                                  mkv_loaded_model *lm, mkv_error *err)
{
    int vocab = lm->model->cfg.vocab_size;
    if (o->tokenizer) {
        snprintf(lm->tokenizer_path, sizeof lm->tokenizer_path, "%s", o->tokenizer);
        return mkv_tokenizer_load_llama2c(o->tokenizer, vocab, &lm->tok, err);
    }
    char dir[4096], cand[2][4200];
    dir_of(path, dir, sizeof dir);
    snprintf(cand[0], sizeof cand[0], "%s/tokenizer.bin", dir);
    snprintf(cand[1], sizeof cand[1], "%s/tok%d.bin", dir, vocab);
    for (int i = 0; i < 2; i++)
        if (access(cand[i], F_OK) == 0) {
            snprintf(lm->tokenizer_path, sizeof lm->tokenizer_path, "%s", cand[i]);
            return mkv_tokenizer_load_llama2c(cand[i], vocab, &lm->tok, err);
        }
    if (!o->need_tokenizer)
        return MKV_OK;
    return mkv_fail(err, MKV_EIO,
                    "'%s': no tokenizer beside the checkpoint (looked for tokenizer.bin and "
                    "tok%d.bin in %s); give --tokenizer FILE", path, vocab, dir);
}

int mkv_model_load(const char *path, const mkv_model_load_opts *opts, mkv_loaded_model *out,
                   mkv_error *err)
{
    mkv_model_load_opts defaults = {NULL, 1};
    const mkv_model_load_opts *o = opts ? opts : &defaults;
    memset(out, 0, sizeof *out);
    mkv_model_format fmt;
    int rc = mkv_model_detect(path, &fmt, err);
    if (rc)
        return rc;
    out->format = fmt;
    if (fmt != MKV_FORMAT_LLAMA2C && o->tokenizer)
        return mkv_fail(err, MKV_EUSAGE,
                        "--tokenizer is for llama2.c checkpoints; '%s' (%s) carries its own tokenizer",
                        path, mkv_model_format_name(fmt));
    switch (fmt) {
    case MKV_FORMAT_LLAMA2C:
        if ((rc = mkv_llama2c_load(path, &out->model, err)))
            break;
        rc = load_llama2c_tokenizer(path, o, out, err);
        /* llama2.c's run.c starts every prompt with BOS */
        out->add_bos = out->model->cfg.bos_id >= 0;
        break;
    case MKV_FORMAT_GGUF: {
        /* the vocabulary is read only when needed: token ids run without it */
        mkv_gguf_extra extra;
        memset(&extra, 0, sizeof extra);
        if ((rc = mkv_gguf_load(path, o->keep_blocks, &out->model, o->need_tokenizer ? &out->tok : NULL,
                                &extra, err)))
            break;
        out->chat_template = extra.chat_template;
        extra.chat_template = NULL;
        out->add_bos = extra.add_bos;
        mkv_gguf_extra_free(&extra);
        break;
    }
    case MKV_FORMAT_HF: {
        mkv_hf_info info;
        memset(&info, 0, sizeof info);
        if ((rc = mkv_hf_load(path, &out->model, o->need_tokenizer ? &out->tok : NULL, &info, err)))
            break;
        out->chat_template = info.chat_template;
        info.chat_template = NULL;
        out->add_bos = info.add_bos;
        mkv_hf_info_free(&info);
        break;
    }
    }
    if (rc)
        mkv_loaded_model_free(out);
    return rc;
}

void mkv_loaded_model_free(mkv_loaded_model *m)
{
    mkv_model_free(m->model);
    mkv_tokenizer_free(m->tok);
    free(m->chat_template);
    memset(m, 0, sizeof *m);
}
