/* Hugging Face model directories (see hf.h): config.json (hf_config.c),
 * the safetensors weights (hf_weights.c) and the tokenizer files
 * (hf_tokenizer.c) into a model. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/hf.h"
#include "model/hf_priv.h"

int mkv_hf_join(char *buf, const char *dir, const char *name)
{
    return snprintf(buf, MKV_HF_PATH_LEN, "%s/%s", dir, name) < MKV_HF_PATH_LEN ? 0 : -1;
}

int mkv_hf_is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int mkv_hf_load(const char *dir, mkv_model **model, mkv_tokenizer **tok, mkv_hf_info *info,
                mkv_error *err)
{
    *model = NULL;
    if (tok)
        *tok = NULL;
    if (info)
        memset(info, 0, sizeof *info);
    mkv_model_config cfg;
    char arch[64];
    int rc = mkv_hf_read_config_arch(dir, &cfg, arch, err);
    if (rc)
        return rc;
    mkv_hf_weights *w = NULL;
    mkv_model *m = NULL;
    if ((rc = mkv_hf_weights_open(dir, arch, &cfg, &w, err)) ||
        (rc = mkv_model_create(&cfg, &m, err)) || (rc = mkv_hf_weights_read(w, m, err)))
        goto fail;
    if (info) {
        snprintf(info->architecture, sizeof info->architecture, "%s", arch);
        snprintf(info->dtype, sizeof info->dtype, "%s", mkv_hf_weights_dtype(w));
    }
    if (tok && (rc = mkv_hf_tokenizer(dir, m, tok, info, err)))
        goto fail;
    mkv_hf_weights_close(w);
    *model = m;
    return MKV_OK;
fail:
    mkv_hf_weights_close(w);
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
