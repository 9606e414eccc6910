/* Fuzz harness: Hugging Face tokenizer.json, with tokenizer_config.json
 * (vocab/tokenizer_json.h). The input is tokenizer.json, or tokenizer.json,
 * a NUL byte and tokenizer_config.json (JSON text holds no NUL). An
 * accepted tokenizer encodes and decodes fixed texts. */
#include "config.h"
#include "fuzz.h"
#include "vocab/tokenizer_json.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, '\0', size);
    size_t json_len = nul ? (size_t)(nul - data) : size;
    const char *json = fuzz_file("tokenizer.json", data, json_len);
    const char *config = nul ? fuzz_file("tokenizer_config.json", nul + 1, size - json_len - 1) : NULL;
    mkv_error err;
    mkv_tokenizer *t = NULL;
    mkv_tokenizer_json_info info;
    int rc = mkv_tokenizer_json_load(json, config, 0, &t, &info, &err);
    fuzz_check_refusal(rc, &err, "mkv_tokenizer_json_load");
    if (rc)
        return 0;
    fuzz_tokenizer_roundtrip(t);
    mkv_tokenizer_free(t);
    mkv_tokenizer_json_info_free(&info);
    return 0;
}
