/* llama2.c version-0 ("legacy") checkpoints.
 *
 * Layout: int32 dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
 * seq_len; then float32 token embedding [vocab x dim], rms_att [L x dim],
 * wq [L x dim x dim], wk [L x kv_dim x dim], wv [L x kv_dim x dim],
 * wo [L x dim x dim], rms_ffn [L x dim], w1 [L x hidden x dim],
 * w2 [L x dim x hidden], w3 [L x hidden x dim], rms_final [dim], two unused
 * RoPE tables [seq_len x head_dim/2] each and, when vocab_size < 0, the
 * classifier [vocab x dim].  All little-endian.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "model/model.h"
#include "core/tensor.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the llama2.c loader reads little-endian float32 directly"
#endif

#define HEADER_INTS 7
/* First int32 of llama2.c version >= 1 files ("ak42"). */
#define LLAMA2C_MAGIC 0x616b3432

typedef struct {
    FILE *fp;
    const char *path;
    mkv_error *err;
} reader;

static int read_floats(reader *r, float *dst, size_t n, const char *tensor, int layer)
{
    if (fread(dst, sizeof(float), n, r->fp) != n) {
        if (ferror(r->fp))
            return mkv_fail_errno(r->err, MKV_EIO, errno, "'%s': read error in %s", r->path, tensor);
        return mkv_fail(r->err, MKV_EFORMAT, "'%s': file ends inside %s", r->path, tensor);
    }
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(dst[i])) {
            if (layer >= 0)
                return mkv_fail(r->err, MKV_EFORMAT, "'%s': non-finite value in %s of layer %d",
                                r->path, tensor, layer);
            return mkv_fail(r->err, MKV_EFORMAT, "'%s': non-finite value in %s", r->path, tensor);
        }
    }
    return MKV_OK;
}

/* Bytes the checkpoint described by c must have; 0 on overflow. */
static uint64_t expected_size(const mkv_model_config *c)
{
    uint64_t dim = (uint64_t)c->dim, hid = (uint64_t)c->hidden_dim, layers = (uint64_t)c->n_layers;
    uint64_t kv_dim = (uint64_t)c->n_kv_heads * (uint64_t)c->head_dim;
    uint64_t per_layer = 0, floats = 0, embed = 0, bytes = 0, tables = 0, body = 0;
    /* rms_att + wq + wk + wv + wo + rms_ffn + w1 + w2 + w3 */
    if (__builtin_mul_overflow(dim, 2 * dim + 2 * kv_dim + 3 * hid + 2, &per_layer) ||
        __builtin_mul_overflow(per_layer, layers, &body) ||
        __builtin_mul_overflow((uint64_t)c->vocab_size, dim, &embed) ||
        __builtin_mul_overflow((uint64_t)c->max_seq_len, (uint64_t)c->head_dim, &tables) ||
        __builtin_add_overflow(body, embed, &floats) ||
        __builtin_add_overflow(floats, dim + tables, &floats) ||
        (!c->tied_classifier && __builtin_add_overflow(floats, embed, &floats)) ||
        __builtin_mul_overflow(floats, (uint64_t)sizeof(float), &bytes) ||
        __builtin_add_overflow(bytes, (uint64_t)HEADER_INTS * 4, &bytes))
        return 0;
    return bytes;
}

/* Model name: the file's base name without its extension. */
static void set_name(mkv_model_config *c, const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    snprintf(c->name, sizeof c->name, "%s", base);
    char *dot = strrchr(c->name, '.');
    if (dot && dot != c->name)
        *dot = '\0';
}

static int parse_header(const int32_t h[HEADER_INTS], const char *path, mkv_model_config *c,
                        mkv_error *err)
{
    if (h[0] == LLAMA2C_MAGIC)
        return mkv_fail(err, MKV_EUNSUP,
                        "'%s': llama2.c checkpoint version 1 or later (magic \"ak42\"); "
                        "only version 0 (legacy export) is supported", path);
    for (int i = 0; i < HEADER_INTS; i++) {
        if (h[i] == 0 || (h[i] < 0 && i != 5) || h[i] == INT32_MIN)
            return mkv_fail(err, MKV_EFORMAT,
                            "'%s': not a llama2.c checkpoint (header field %d is %d)", path, i, (int)h[i]);
    }
    mkv_model_config_defaults(c);
    set_name(c, path);
    c->dim = h[0];
    c->hidden_dim = h[1];
    c->n_layers = h[2];
    c->n_heads = h[3];
    c->n_kv_heads = h[4];
    c->tied_classifier = h[5] > 0;
    c->vocab_size = h[5] > 0 ? h[5] : -h[5];
    c->max_seq_len = h[6];
    if (c->dim % c->n_heads != 0)
        return mkv_fail(err, MKV_EFORMAT, "'%s': dim = %d is not a multiple of n_heads = %d",
                        path, c->dim, c->n_heads);
    c->head_dim = c->dim / c->n_heads;
    c->rope_dim = c->head_dim;
    int rc = mkv_model_config_check(c, path, err);
    if (rc)
        return rc;
    /* llama2.c's tokenizers have <unk>, <s>, </s> first. */
    if (c->vocab_size < 3)
        c->bos_id = c->eos_id = -1;
    return MKV_OK;
}

static int read_weights(reader *r, mkv_model *m)
{
    const mkv_model_config *c = &m->cfg;
    size_t dim = (size_t)c->dim, hid = (size_t)c->hidden_dim;
    size_t kv_dim = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    int rc;
    /* Each array holds all layers back to back; walk them in file order. */
    static const char *const names[] = {"rms_att", "wq", "wk", "wv", "wo", "rms_ffn", "w1", "w2", "w3"};
    if ((rc = read_floats(r, m->tok_embedding, (size_t)c->vocab_size * dim, "token_embedding", -1)))
        return rc;
    for (int t = 0; t < 9; t++) {
        for (int l = 0; l < c->n_layers; l++) {
            mkv_layer_weights *w = &m->layers[l];
            float *dst[] = {w->rms_att, w->wq, w->wk, w->wv, w->wo, w->rms_ffn, w->w1, w->w2, w->w3};
            size_t n[] = {dim, dim * dim, kv_dim * dim, kv_dim * dim, dim * dim, dim,
                          hid * dim, dim * hid, hid * dim};
            if ((rc = read_floats(r, dst[t], n[t], names[t], l)))
                return rc;
        }
    }
    if ((rc = read_floats(r, m->rms_final, dim, "rms_final", -1)))
        return rc;
    if (!c->tied_classifier) {
        off_t tables = (off_t)c->max_seq_len * c->head_dim * (off_t)sizeof(float);
        if (fseeko(r->fp, tables, SEEK_CUR) != 0)
            return mkv_fail_errno(r->err, MKV_EIO, errno, "'%s': cannot seek past the RoPE tables",
                                  r->path);
        if ((rc = read_floats(r, m->classifier, (size_t)c->vocab_size * dim, "classifier", -1)))
            return rc;
    }
    return MKV_OK;
}

int mkv_llama2c_load(const char *path, mkv_model **out, mkv_error *err)
{
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return mkv_fail_errno(err, MKV_EIO, errno, "cannot open '%s'", path);
    int rc;
    struct stat st;
    if (fstat(fileno(fp), &st) != 0) {
        rc = mkv_fail_errno(err, MKV_EIO, errno, "cannot stat '%s'", path);
        goto done;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = mkv_fail(err, MKV_EIO, "'%s': not a regular file", path);
        goto done;
    }
    unsigned char raw[HEADER_INTS * 4];
    if (st.st_size < (off_t)sizeof raw || fread(raw, 1, sizeof raw, fp) != sizeof raw) {
        rc = mkv_fail(err, MKV_EFORMAT, "'%s': too short for a llama2.c checkpoint (%lld bytes)",
                      path, (long long)st.st_size);
        goto done;
    }
    int32_t h[HEADER_INTS];
    for (int i = 0; i < HEADER_INTS; i++)
        h[i] = (int32_t)((uint32_t)raw[4 * i] | (uint32_t)raw[4 * i + 1] << 8 |
                         (uint32_t)raw[4 * i + 2] << 16 | (uint32_t)raw[4 * i + 3] << 24);
    mkv_model_config cfg;
    if ((rc = parse_header(h, path, &cfg, err)))
        goto done;
    uint64_t want = expected_size(&cfg);
    if (want == 0 || want > (uint64_t)INT64_MAX) {
        rc = mkv_fail(err, MKV_EFORMAT, "'%s': header implies an impossible file size", path);
        goto done;
    }
    if ((uint64_t)st.st_size != want) {
        rc = mkv_fail(err, MKV_EFORMAT,
                      "'%s': %s: the header (dim %d, hidden %d, %d layers, vocab %d, seq_len %d) "
                      "implies %llu bytes, the file has %lld",
                      path, (uint64_t)st.st_size < want ? "truncated" : "trailing data",
                      cfg.dim, cfg.hidden_dim, cfg.n_layers, cfg.vocab_size, cfg.max_seq_len,
                      (unsigned long long)want, (long long)st.st_size);
        goto done;
    }
    mkv_model *m;
    if ((rc = mkv_model_create(&cfg, &m, err)))
        goto done;
    reader r = {fp, path, err};
    if ((rc = read_weights(&r, m))) {
        mkv_model_free(m);
        goto done;
    }
    *out = m;
done:
    fclose(fp);
    return rc;
}
