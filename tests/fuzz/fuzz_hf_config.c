/* Fuzz harness: a Hugging Face model directory's config.json
 * (model/hf.h mkv_hf_read_config). An accepted configuration passes the
 * model's own check. */
#include "config.h"
#include "fuzz.h"
#include "model/hf.h"
#include "model/model.h"

#include <stdio.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file("hf/config.json", data, size);
    char dir[4096];
    snprintf(dir, sizeof dir, "%.*s", (int)(strrchr(path, '/') - path), path);
    mkv_error err;
    mkv_model_config cfg;
    int rc = mkv_hf_read_config(dir, &cfg, &err);
    fuzz_check_refusal(rc, &err, "mkv_hf_read_config");
    if (rc)
        return 0;
    if (mkv_model_config_check(&cfg, path, &err))
        fuzz_bug("mkv_hf_read_config accepted a configuration its check refuses: %s", err.msg);
    return 0;
}
