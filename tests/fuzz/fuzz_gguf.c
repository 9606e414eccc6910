/* Fuzz harness: the GGUF container (io/gguf.h), then what the model loader
 * reads from an accepted file (model/gguf.h): the vocabulary, the extras
 * and the llama model. Every value and tensor an accepted file holds is
 * visited; tensors must lie inside the file. */
#include "config.h"
#include "fuzz.h"
#include "io/gguf.h"
#include "model/gguf.h"

#include <string.h>

static volatile unsigned char sink;

static void visit(const mkv_gguf_value *v, int depth)
{
    if (depth > MKV_GGUF_MAX_DEPTH + 1)
        fuzz_bug("a value nested %d deep was accepted", depth);
    int64_t i;
    double f;
    int b;
    size_t len;
    (void)mkv_gguf_value_int(v, &i);
    (void)mkv_gguf_value_float(v, &f);
    (void)mkv_gguf_value_bool(v, &b);
    const char *s = mkv_gguf_value_str(v, &len);
    if (s && s[len] != '\0')
        fuzz_bug("a string of %zu bytes is not NUL-terminated there", len);
    if (v->type != MKV_GGUF_ARRAY)
        return;
    for (uint64_t k = 0; k < v->n && k < 4096; k++) {
        const mkv_gguf_value *item = mkv_gguf_array_item(v, k);
        if (item)
            visit(item, depth + 1);
        (void)mkv_gguf_array_int(v, k, &i);
        (void)mkv_gguf_array_float(v, k, &f);
    }
    if (v->n) {   /* the last element too */
        const mkv_gguf_value *item = mkv_gguf_array_item(v, v->n - 1);
        if (item)
            visit(item, depth + 1);
        (void)mkv_gguf_array_int(v, v->n - 1, &i);
        (void)mkv_gguf_array_float(v, v->n - 1, &f);
    }
    if (mkv_gguf_array_item(v, v->n) || mkv_gguf_array_int(v, v->n, &i) == 0)
        fuzz_bug("element %llu of an array of %llu was given", (unsigned long long)v->n,
                 (unsigned long long)v->n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_file("in.gguf", data, size);
    mkv_error err;
    mkv_gguf *g = NULL;
    int rc = mkv_gguf_open(path, &g, &err);
    fuzz_check_refusal(rc, &err, "mkv_gguf_open");
    if (rc)
        return 0;
    for (uint64_t i = 0; i < mkv_gguf_n_kv(g); i++) {
        const char *key = mkv_gguf_kv_key(g, i);
        const mkv_gguf_value *v = mkv_gguf_kv_value(g, i);
        if (!key || !v || mkv_gguf_find(g, key) != v)
            fuzz_bug("metadata %llu is not found by its key", (unsigned long long)i);
        visit(v, 0);
    }
    for (uint64_t i = 0; i < mkv_gguf_n_tensors(g); i++) {
        const mkv_gguf_tensor *t = mkv_gguf_tensor_at(g, i);
        if (mkv_gguf_find_tensor(g, t->name) != t)
            fuzz_bug("tensor %llu ('%s') is not found by its name", (unsigned long long)i, t->name);
        if (t->offset > size || t->nbytes > size - t->offset || t->offset < mkv_gguf_data_offset(g))
            fuzz_bug("tensor '%s' at %llu+%llu lies outside the data of the %zu bytes", t->name,
                     (unsigned long long)t->offset, (unsigned long long)t->nbytes, size);
        if (t->nbytes) {
            sink ^= t->data[0];
            sink ^= t->data[t->nbytes - 1];
        }
    }

    mkv_tokenizer *tok = NULL;
    rc = mkv_gguf_tokenizer(g, &tok, &err);
    fuzz_check_refusal(rc, &err, "mkv_gguf_tokenizer");
    if (!rc) {
        fuzz_tokenizer_roundtrip(tok);
        mkv_tokenizer_free(tok);
    }
    mkv_gguf_extra x;
    memset(&x, 0, sizeof x);
    rc = mkv_gguf_extra_get(g, &x, &err);
    fuzz_check_refusal(rc, &err, "mkv_gguf_extra_get");
    if (!rc)
        mkv_gguf_extra_free(&x);
    for (int blocks = 0; blocks < 2; blocks++) { /* float32, then the matrices in blocks */
        mkv_model *m = NULL;
        rc = mkv_gguf_model(g, blocks, &m, &err);
        fuzz_check_refusal(rc, &err, "mkv_gguf_model");
        if (!rc)
            mkv_model_free(m);
    }
    mkv_gguf_close(g);
    return 0;
}
