/* Fuzz harness: llama2.c tokenizer.bin files (vocab/tokenizer.h
 * mkv_tokenizer_load_llama2c), then encoding and decoding fixed texts with
 * an accepted vocabulary. */
#include "config.h"
#include "fuzz.h"
#include "vocab/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file("tokenizer.bin", data, size);
    mkv_error err;
    mkv_tokenizer *t = NULL;
    int rc = mkv_tokenizer_load_llama2c(path, 0, &t, &err);
    fuzz_check_refusal(rc, &err, "mkv_tokenizer_load_llama2c");
    if (rc)
        return 0;
    fuzz_tokenizer_roundtrip(t);
    mkv_tokenizer_free(t);
    return 0;
}
