/* Fuzz harness: llama2.c checkpoints (model/model.h mkv_llama2c_load). A
 * model that loads runs two tokens through the forward pass: a header the
 * loader accepts must describe a model the pass can run. */
#include "config.h"
#include "fuzz.h"
#include "model/forward.h"
#include "model/model.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file("model.bin", data, size);
    mkv_error err;
    mkv_model *m = NULL;
    int rc = mkv_llama2c_load(path, &m, &err);
    fuzz_check_refusal(rc, &err, "mkv_llama2c_load");
    if (rc)
        return 0;
    mkv_forward_opts o = {.threads = 1, .chunk = 2, .max_seq_len = 2};
    mkv_forward *f = NULL;
    rc = mkv_forward_create(m, &o, &f, &err);
    fuzz_check_refusal(rc, &err, "mkv_forward_create");
    if (!rc) {
        float *logits = malloc(sizeof(float) * (size_t)m->cfg.vocab_size);
        int32_t tokens[2] = {0, m->cfg.vocab_size - 1};
        if (!logits)
            fuzz_bug("out of memory for %d logits", m->cfg.vocab_size);
        rc = mkv_forward_run(f, tokens, 2, logits, MKV_LOGITS_LAST, &err);
        if (rc)
            fuzz_bug("the forward pass of a loaded model: %s", err.msg);
        free(logits);
        mkv_forward_free(f);
    }
    mkv_model_free(m);
    return 0;
}
