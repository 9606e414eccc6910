/* Import KV caches from safetensors (one file, or vLLM's directory of
 * per-layer files) and .npy into a dump v1 (see import.h).
 *
 * Every source is first described completely (shapes checked against each
 * other and against the options) before the output is created; the data
 * are then copied in chunks of tokens, so memory stays at a few chunks
 * whatever the size of the cache. */
#include "io/import.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/npy.h"
#include "io/safetensors.h"

#define MAX_LAYERS 1000 /* mkv_dump_meta_check's limit */

void mkv_import_opts_init(mkv_import_opts *o)
{
    memset(o, 0, sizeof *o);
    o->kind = MKV_IMPORT_AUTO;
    o->rope_theta = 10000.0;
    o->k_rope = "post";
    o->dtype = MKV_DTYPE_F16;
}

/* ---------------------------------------------------------------- the source */

/* Where the [heads, len, head_dim] block of one k, v or q lies in a flat
 * tensor: element (h, t, d) is at base + h*head_stride + t*tok_stride + d.
 * Head-major layouts have tok_stride == head_dim, token-major ones (vLLM)
 * head_stride == head_dim. */
typedef struct {
    mkv_st_file *st;            /* exactly one of st (with tensor) and npy */
    const mkv_st_tensor *tensor;
    mkv_npy *npy;
    const char *what;           /* for messages: tensor name */
    uint64_t base, head_stride, tok_stride;
    int heads;
    int64_t len;
} kv_view;

typedef struct {
    mkv_import_kind kind;
    const char *path;
    int n_layers, kv_heads, head_dim, q_heads;
    int64_t T, W;
    /* safetensors, one file */
    mkv_st_file *st;
    const mkv_st_tensor **k, **v, **q; /* [n_layers]; q NULL when absent */
    const mkv_st_tensor *tokens, *query_pos;
    /* vLLM directory */
    char **layer_files;                /* [n_layers] */
    /* .npy */
    mkv_npy *npy;
} source;

static void source_close(source *s)
{
    mkv_st_close(s->st);
    free(s->k);
    free(s->v);
    free(s->q);
    if (s->layer_files)
        for (int l = 0; l < s->n_layers; l++)
            free(s->layer_files[l]);
    free(s->layer_files);
    mkv_npy_close(s->npy);
}

static void shape_str(char *buf, size_t size, int ndim, const int64_t *shape)
{
    size_t n = (size_t)snprintf(buf, size, "[");
    for (int d = 0; d < ndim && n < size; d++)
        n += (size_t)snprintf(buf + n, size - n, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (n < size)
        snprintf(buf + n, size - n, "]");
}

static int is_float_dtype(mkv_st_dtype t)
{
    return t == MKV_ST_F32 || t == MKV_ST_F16 || t == MKV_ST_BF16 || t == MKV_ST_F64;
}

static int is_int_dtype(mkv_st_dtype t)
{
    return t == MKV_ST_I32 || t == MKV_ST_I64 || t == MKV_ST_I16 || t == MKV_ST_I8 || t == MKV_ST_U8 ||
           t == MKV_ST_U16 || t == MKV_ST_U32 || t == MKV_ST_U64;
}

/* A dimension read from the source must fit an int and be positive. */
static int dim_int(const char *path, const char *what, int64_t v, int *out, mkv_error *err)
{
    if (v <= 0 || v > 1000000)
        return mkv_fail(err, MKV_EFORMAT, "'%s': %s has %s %lld", path, what,
                        v <= 0 ? "an empty dimension:" : "an implausible dimension", (long long)v);
    *out = (int)v;
    return MKV_OK;
}

/* An option (0 = not given) must agree with what the source says. */
static int agree(const char *option, int given, int found, const char *path, const char *where,
                 mkv_error *err)
{
    if (given != 0 && given != found)
        return mkv_fail(err, MKV_EFORMAT, "%s %d was requested but '%s' has %s %d (%s)", option, given,
                        path, option, found, where);
    return MKV_OK;
}

/* Parse "layers.<digits>.<k|v|q>"; returns the kind letter or 0. */
static char layer_tensor_name(const char *name, long *layer)
{
    const char *p = name;
    if (strncmp(p, "layers.", 7) != 0)
        return 0;
    p += 7;
    long l = 0;
    int digits = 0;
    while (*p >= '0' && *p <= '9' && digits < 7) {
        l = l * 10 + (*p++ - '0');
        digits++;
    }
    if (digits == 0 || digits == 7 || *p != '.')
        return 0;
    p++;
    if ((p[0] == 'k' || p[0] == 'v' || p[0] == 'q') && p[1] == '\0') {
        *layer = l;
        return p[0];
    }
    return 0;
}

static int check_kv_shape(const source *s, const mkv_st_tensor *t, const mkv_st_tensor *ref,
                          mkv_error *err)
{
    char got[96], want[96];
    if (!is_float_dtype(t->dtype))
        return mkv_fail(err, MKV_EFORMAT, "'%s': tensor '%s' has dtype %s; K, V and Q must be floating point",
                        s->path, t->name, mkv_st_dtype_name(t->dtype));
    int same = t->ndim == ref->ndim;
    for (int d = 0; same && d < t->ndim; d++)
        same = t->shape[d] == ref->shape[d];
    if (!same) {
        shape_str(got, sizeof got, t->ndim, t->shape);
        shape_str(want, sizeof want, ref->ndim, ref->shape);
        return mkv_fail(err, MKV_EFORMAT, "'%s': tensor '%s' has shape %s but '%s' has %s", s->path,
                        t->name, got, ref->name, want);
    }
    return MKV_OK;
}

static int open_safetensors(source *s, const mkv_import_opts *o, mkv_error *err)
{
    int rc = mkv_st_open(s->path, &s->st, err);
    if (rc)
        return rc;
    size_t n = mkv_st_count(s->st);
    s->k = calloc(MAX_LAYERS, sizeof *s->k);
    s->v = calloc(MAX_LAYERS, sizeof *s->v);
    s->q = calloc(MAX_LAYERS, sizeof *s->q);
    if (!s->k || !s->v || !s->q)
        return mkv_fail(err, MKV_ENOMEM, "out of memory");
    long max_layer = -1;
    int n_q = 0;
    for (size_t i = 0; i < n; i++) {
        const mkv_st_tensor *t = mkv_st_tensor_at(s->st, i);
        long l;
        char kind = layer_tensor_name(t->name, &l);
        if (!kind)
            continue; /* other tensors are not ours to judge */
        if (l >= MAX_LAYERS)
            return mkv_fail(err, MKV_EFORMAT, "'%s': tensor '%s': layer %ld is beyond the limit of %d layers",
                            s->path, t->name, l, MAX_LAYERS);
        const mkv_st_tensor **slot = kind == 'k' ? &s->k[l] : kind == 'v' ? &s->v[l] : &s->q[l];
        if (*slot)
            return mkv_fail(err, MKV_EFORMAT, "'%s': tensors '%s' and '%s' both name layer %ld's %c",
                            s->path, (*slot)->name, t->name, l, kind);
        *slot = t;
        n_q += kind == 'q';
        if (l > max_layer)
            max_layer = l;
    }
    if (max_layer < 0)
        return mkv_fail(err, MKV_EFORMAT, "'%s': no tensors named layers.{L}.k / layers.{L}.v", s->path);
    s->n_layers = (int)max_layer + 1;
    for (int l = 0; l < s->n_layers; l++)
        if (!s->k[l] || !s->v[l])
            return mkv_fail(err, MKV_EFORMAT, "'%s': tensor layers.%d.%c is missing (layers 0..%d expected)",
                            s->path, l, s->k[l] ? 'v' : 'k', s->n_layers - 1);
    if (n_q != 0 && n_q != s->n_layers)
        for (int l = 0; l < s->n_layers; l++)
            if (!s->q[l])
                return mkv_fail(err, MKV_EFORMAT,
                                "'%s': tensor layers.%d.q is missing (other layers have queries)", s->path, l);

    const mkv_st_tensor *k0 = s->k[0];
    char shape[96];
    shape_str(shape, sizeof shape, k0->ndim, k0->shape);
    if (k0->ndim != 3)
        return mkv_fail(err, MKV_EFORMAT, "'%s': tensor '%s' has shape %s; expected [kv_heads, T, head_dim]",
                        s->path, k0->name, shape);
    for (int l = 0; l < s->n_layers; l++)
        if ((rc = check_kv_shape(s, s->k[l], k0, err)) || (rc = check_kv_shape(s, s->v[l], k0, err)))
            return rc;
    char where[160];
    snprintf(where, sizeof where, "tensor '%s' has shape %s", k0->name, shape);
    if ((rc = dim_int(s->path, k0->name, k0->shape[0], &s->kv_heads, err)) ||
        (rc = dim_int(s->path, k0->name, k0->shape[2], &s->head_dim, err)) ||
        (rc = agree("n_kv_heads", o->n_kv_heads, s->kv_heads, s->path, where, err)) ||
        (rc = agree("head_dim", o->head_dim, s->head_dim, s->path, where, err)))
        return rc;
    s->T = k0->shape[1];

    if (n_q) {
        const mkv_st_tensor *q0 = s->q[0];
        shape_str(shape, sizeof shape, q0->ndim, q0->shape);
        if (q0->ndim != 3 || q0->shape[2] != s->head_dim)
            return mkv_fail(err, MKV_EFORMAT,
                            "'%s': tensor '%s' has shape %s; expected [n_heads, W, %d]", s->path, q0->name,
                            shape, s->head_dim);
        for (int l = 0; l < s->n_layers; l++)
            if ((rc = check_kv_shape(s, s->q[l], q0, err)))
                return rc;
        snprintf(where, sizeof where, "tensor '%s' has shape %s", q0->name, shape);
        if ((rc = dim_int(s->path, q0->name, q0->shape[0], &s->q_heads, err)) ||
            (rc = agree("n_heads", o->n_heads, s->q_heads, s->path, where, err)))
            return rc;
        s->W = q0->shape[1];
        if (s->W > s->T)
            return mkv_fail(err, MKV_EFORMAT, "'%s': %lld queries for %lld tokens", s->path,
                            (long long)s->W, (long long)s->T);
    }

    if ((s->tokens = mkv_st_find(s->st, "tokens")) != NULL) {
        const mkv_st_tensor *t = s->tokens;
        shape_str(shape, sizeof shape, t->ndim, t->shape);
        if (!is_int_dtype(t->dtype) || t->ndim != 1 || t->shape[0] != s->T)
            return mkv_fail(err, MKV_EFORMAT,
                            "'%s': tensor 'tokens' is %s %s; expected integers of shape [%lld]", s->path,
                            mkv_st_dtype_name(t->dtype), shape, (long long)s->T);
    }
    if ((s->query_pos = mkv_st_find(s->st, "query_pos")) != NULL) {
        const mkv_st_tensor *t = s->query_pos;
        shape_str(shape, sizeof shape, t->ndim, t->shape);
        if (!n_q)
            return mkv_fail(err, MKV_EFORMAT, "'%s': tensor 'query_pos' given without queries (layers.{L}.q)",
                            s->path);
        if (!is_int_dtype(t->dtype) || t->ndim != 1 || t->shape[0] != s->W)
            return mkv_fail(err, MKV_EFORMAT,
                            "'%s': tensor 'query_pos' is %s %s; expected integers of shape [%lld]", s->path,
                            mkv_st_dtype_name(t->dtype), shape, (long long)s->W);
    }
    return MKV_OK;
}

/* "<digits>.safetensors" -> layer number (LONG_MAX for a number too large
 * to hold, which the caller refuses as beyond the limit); -1 for other
 * names. */
static long vllm_layer_of(const char *name)
{
    const char *p = name;
    long l = 0;
    for (; *p >= '0' && *p <= '9'; p++)
        l = l > (LONG_MAX - 9) / 10 ? LONG_MAX : l * 10 + (*p - '0');
    if (p == name || strcmp(p, ".safetensors") != 0)
        return -1;
    return l;
}

static char *join_path(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s%s%s", dir, dir[0] && dir[strlen(dir) - 1] == '/' ? "" : "/", name);
    return p;
}

/* vLLM's kv_cache: [2, T, kv_heads, head_dim], or [2, T, kv_heads*head_dim]
 * when the options say how to split the last dimension. */
static int vllm_shape(source *s, const char *file, const mkv_st_tensor *t, const mkv_import_opts *o,
                      mkv_error *err)
{
    char shape[96], where[160];
    shape_str(shape, sizeof shape, t->ndim, t->shape);
    snprintf(where, sizeof where, "kv_cache has shape %s", shape);
    if (!is_float_dtype(t->dtype))
        return mkv_fail(err, MKV_EFORMAT, "'%s': kv_cache has dtype %s; expected floating point", file,
                        mkv_st_dtype_name(t->dtype));
    if ((t->ndim != 3 && t->ndim != 4) || t->shape[0] != 2)
        return mkv_fail(err, MKV_EFORMAT, "'%s': kv_cache has shape %s; expected [2, T, kv_heads, head_dim]",
                        file, shape);
    int rc;
    if (t->ndim == 4) {
        if ((rc = dim_int(file, "kv_cache", t->shape[2], &s->kv_heads, err)) ||
            (rc = dim_int(file, "kv_cache", t->shape[3], &s->head_dim, err)) ||
            (rc = agree("n_kv_heads", o->n_kv_heads, s->kv_heads, file, where, err)) ||
            (rc = agree("head_dim", o->head_dim, s->head_dim, file, where, err)))
            return rc;
    } else {
        int merged = 0;
        if ((rc = dim_int(file, "kv_cache", t->shape[2], &merged, err)))
            return rc;
        if (o->n_kv_heads == 0 && o->head_dim == 0)
            return mkv_fail(err, MKV_EFORMAT,
                            "'%s': kv_cache has shape %s, heads and channels merged: the number of KV "
                            "heads or the head dimension must be given", file, shape);
        int h = o->n_kv_heads ? o->n_kv_heads : merged / o->head_dim;
        int d = o->head_dim ? o->head_dim : merged / o->n_kv_heads;
        if (h <= 0 || d <= 0 || (int64_t)h * d != merged)
            return mkv_fail(err, MKV_EFORMAT,
                            "'%s': kv_cache has shape %s: its last dimension %d is not n_kv_heads %d x "
                            "head_dim %d", file, shape, merged, h, d);
        s->kv_heads = h;
        s->head_dim = d;
    }
    s->T = t->shape[1];
    return MKV_OK;
}

static int open_vllm(source *s, const mkv_import_opts *o, mkv_error *err)
{
    DIR *dir = opendir(s->path);
    if (dir == NULL)
        return mkv_fail_errno(err, MKV_EIO, errno, "cannot open directory '%s'", s->path);
    s->layer_files = calloc(MAX_LAYERS, sizeof *s->layer_files);
    if (s->layer_files == NULL) {
        closedir(dir);
        return mkv_fail(err, MKV_ENOMEM, "out of memory");
    }
    s->n_layers = MAX_LAYERS; /* source_close frees every slot */
    long max_layer = -1;
    int rc = MKV_OK;
    struct dirent *e;
    while (rc == MKV_OK && (e = readdir(dir)) != NULL) {
        long l = vllm_layer_of(e->d_name);
        if (l < 0)
            continue;
        if (l >= MAX_LAYERS) {
            rc = mkv_fail(err, MKV_EFORMAT, "'%s/%s': layer %ld is beyond the limit of %d layers", s->path,
                          e->d_name, l, MAX_LAYERS);
        } else if (s->layer_files[l]) {
            rc = mkv_fail(err, MKV_EFORMAT, "'%s' and '%s/%s' both hold layer %ld", s->layer_files[l],
                          s->path, e->d_name, l);
        } else if ((s->layer_files[l] = join_path(s->path, e->d_name)) == NULL) {
            rc = mkv_fail(err, MKV_ENOMEM, "out of memory");
        } else if (l > max_layer) {
            max_layer = l;
        }
    }
    closedir(dir);
    if (rc)
        return rc;
    if (max_layer < 0)
        return mkv_fail(err, MKV_EFORMAT, "'%s': no <layer>.safetensors files (0.safetensors, ...)", s->path);
    for (long l = 0; l <= max_layer; l++)
        if (!s->layer_files[l])
            return mkv_fail(err, MKV_EFORMAT, "'%s': layer file %ld.safetensors is missing (found layers up to %ld)",
                            s->path, l, max_layer);
    s->n_layers = (int)max_layer + 1;

    /* Check every file's header now, so a bad layer fails before any output. */
    int H = 0, D = 0;
    int64_t T = 0;
    for (int l = 0; l < s->n_layers && rc == MKV_OK; l++) {
        mkv_st_file *f;
        if ((rc = mkv_st_open(s->layer_files[l], &f, err)))
            break;
        const mkv_st_tensor *t = mkv_st_find(f, "kv_cache");
        if (t == NULL)
            rc = mkv_fail(err, MKV_EFORMAT, "'%s': no tensor 'kv_cache'", s->layer_files[l]);
        else if ((rc = vllm_shape(s, s->layer_files[l], t, o, err)) == MKV_OK && l > 0 &&
                 (s->kv_heads != H || s->head_dim != D || s->T != T))
            rc = mkv_fail(err, MKV_EFORMAT,
                          "'%s': kv_cache holds %lld tokens x %d heads x %d, but layer 0 holds %lld x %d x %d",
                          s->layer_files[l], (long long)s->T, s->kv_heads, s->head_dim, (long long)T, H, D);
        H = s->kv_heads;
        D = s->head_dim;
        T = s->T;
        mkv_st_close(f);
    }
    return rc;
}

static int open_npy(source *s, const mkv_import_opts *o, mkv_error *err)
{
    int rc = mkv_npy_open(s->path, &s->npy, err);
    if (rc)
        return rc;
    const mkv_npy_info *in = mkv_npy_info_of(s->npy);
    char shape[96], where[160];
    shape_str(shape, sizeof shape, in->ndim, in->shape);
    snprintf(where, sizeof where, "the array has shape %s", shape);
    if (in->ndim != 5 || in->shape[1] != 2)
        return mkv_fail(err, MKV_EFORMAT,
                        "'%s': array of shape %s; expected [n_layers, 2, kv_heads, T, head_dim]", s->path, shape);
    if (!in->is_float)
        return mkv_fail(err, MKV_EFORMAT, "'%s': array of dtype %s; K and V must be floating point", s->path,
                        in->descr);
    if (in->shape[0] > MAX_LAYERS)
        return mkv_fail(err, MKV_EFORMAT, "'%s': %lld layers is beyond the limit of %d", s->path,
                        (long long)in->shape[0], MAX_LAYERS);
    if ((rc = dim_int(s->path, "the array", in->shape[0], &s->n_layers, err)) ||
        (rc = dim_int(s->path, "the array", in->shape[2], &s->kv_heads, err)) ||
        (rc = dim_int(s->path, "the array", in->shape[4], &s->head_dim, err)) ||
        (rc = agree("n_kv_heads", o->n_kv_heads, s->kv_heads, s->path, where, err)) ||
        (rc = agree("head_dim", o->head_dim, s->head_dim, s->path, where, err)))
        return rc;
    s->T = in->shape[3];
    return MKV_OK;
}

/* ---------------------------------------------------------------- copying */

static int view_read(const kv_view *v, uint64_t first, size_t count, float *out, mkv_error *err)
{
    if (v->st)
        return mkv_st_read_f32(v->st, v->tensor, first, count, out, err);
    return mkv_npy_read_f32(v->npy, first, count, out, err);
}

/* Copy one [heads, len, head_dim] block into the dump, chunk tokens at a
 * time; buf and tmp hold heads * chunk * head_dim floats. */
static int copy_view(mkv_dump_writer *w, int layer, char kind, const kv_view *v, int head_dim,
                     int64_t chunk, float *buf, float *tmp, const char *src_path, mkv_error *err)
{
    const uint64_t D = (uint64_t)head_dim;
    for (int64_t t0 = 0; t0 < v->len; t0 += chunk) {
        int64_t nt = v->len - t0 < chunk ? v->len - t0 : chunk;
        int rc;
        if (v->tok_stride == D) { /* head-major: one run per head */
            for (int h = 0; h < v->heads; h++)
                if ((rc = view_read(v, v->base + (uint64_t)h * v->head_stride + (uint64_t)t0 * D,
                                    (size_t)nt * D, buf + (size_t)h * nt * D, err)))
                    return rc;
        } else { /* token-major: one run, then transpose [t][h][d] -> [h][t][d] */
            if ((rc = view_read(v, v->base + (uint64_t)t0 * v->tok_stride, (size_t)nt * v->heads * D, tmp,
                                err)))
                return rc;
            for (int64_t t = 0; t < nt; t++)
                for (int h = 0; h < v->heads; h++)
                    memcpy(buf + ((size_t)h * nt + t) * D, tmp + ((size_t)t * v->heads + h) * D,
                           D * sizeof(float));
        }
        if ((rc = mkv_dump_write(w, layer, kind, 0, v->heads, t0, nt, buf, err)))
            return mkv_error_prefix(err, "'%s' (%s)", src_path, v->what);
    }
    return MKV_OK;
}

static kv_view st_view(mkv_st_file *f, const mkv_st_tensor *t)
{
    kv_view v = {.st = f, .tensor = t, .what = t->name};
    v.heads = (int)t->shape[0];
    v.len = t->shape[1];
    v.tok_stride = (uint64_t)t->shape[2];
    v.head_stride = (uint64_t)(t->shape[1] * t->shape[2]);
    return v;
}

static int copy_layers(source *s, mkv_dump_writer *w, int64_t chunk, float *buf, float *tmp, mkv_error *err)
{
    const uint64_t H = (uint64_t)s->kv_heads, D = (uint64_t)s->head_dim, T = (uint64_t)s->T;
    int rc = MKV_OK;
    for (int l = 0; l < s->n_layers && rc == MKV_OK; l++) {
        switch (s->kind) {
        case MKV_IMPORT_SAFETENSORS: {
            kv_view k = st_view(s->st, s->k[l]), v = st_view(s->st, s->v[l]);
            if ((rc = copy_view(w, l, 'k', &k, s->head_dim, chunk, buf, tmp, s->path, err)) ||
                (rc = copy_view(w, l, 'v', &v, s->head_dim, chunk, buf, tmp, s->path, err)))
                break;
            if (s->q[l]) {
                kv_view q = st_view(s->st, s->q[l]);
                rc = copy_view(w, l, 'q', &q, s->head_dim, chunk, buf, tmp, s->path, err);
            }
            break;
        }
        case MKV_IMPORT_VLLM: {
            mkv_st_file *f;
            if ((rc = mkv_st_open(s->layer_files[l], &f, err)))
                break;
            const mkv_st_tensor *t = mkv_st_find(f, "kv_cache");
            if (t == NULL) /* replaced since it was checked */
                rc = mkv_fail(err, MKV_EFORMAT, "'%s': no tensor 'kv_cache'", s->layer_files[l]);
            for (int kv = 0; kv < 2 && rc == MKV_OK; kv++) {
                kv_view v = {.st = f, .tensor = t, .what = kv ? "kv_cache[1]" : "kv_cache[0]",
                             .base = (uint64_t)kv * T * H * D, .head_stride = D, .tok_stride = H * D,
                             .heads = s->kv_heads, .len = s->T};
                rc = copy_view(w, l, kv ? 'v' : 'k', &v, s->head_dim, chunk, buf, tmp, s->layer_files[l], err);
            }
            mkv_st_close(f);
            break;
        }
        default: /* npy [L, 2, H, T, D] */
            for (int kv = 0; kv < 2 && rc == MKV_OK; kv++) {
                kv_view v = {.npy = s->npy, .what = kv ? "v" : "k",
                             .base = ((uint64_t)l * 2 + (uint64_t)kv) * H * T * D, .head_stride = T * D,
                             .tok_stride = D, .heads = s->kv_heads, .len = s->T};
                rc = copy_view(w, l, kv ? 'v' : 'k', &v, s->head_dim, chunk, buf, tmp, s->path, err);
            }
            break;
        }
    }
    return rc;
}

static int write_ints(source *s, mkv_dump_writer *w, mkv_error *err)
{
    int rc = MKV_OK;
    if (s->tokens) {
        int32_t *tok = mkv_alloc((size_t)s->T, sizeof(int32_t), "token ids", err);
        if (tok == NULL)
            return MKV_ENOMEM;
        if ((rc = mkv_st_read_i32(s->st, s->tokens, 0, (size_t)s->T, tok, err)) == MKV_OK &&
            (rc = mkv_dump_write_tokens(w, tok, err)) != MKV_OK)
            mkv_error_prefix(err, "'%s'", s->path);
        mkv_free(tok);
        if (rc)
            return rc;
    }
    int32_t *pos = mkv_alloc(s->W ? (size_t)s->W : 1, sizeof(int32_t), "query positions", err);
    if (pos == NULL)
        return MKV_ENOMEM;
    if (s->query_pos)
        rc = mkv_st_read_i32(s->st, s->query_pos, 0, (size_t)s->W, pos, err);
    else /* queries without positions are the last W tokens' */
        for (int64_t i = 0; i < s->W; i++)
            pos[i] = (int32_t)(s->T - s->W + i);
    if (rc == MKV_OK && (rc = mkv_dump_write_query_pos(w, pos, err)) != MKV_OK)
        mkv_error_prefix(err, "'%s'", s->path);
    mkv_free(pos);
    return rc;
}

static const char *base_name(const char *path, char *buf, size_t size)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/')
        b--;
    snprintf(buf, size, "%.*s", (int)(n - b), path + b);
    return buf;
}

static mkv_import_kind detect_kind(const char *path)
{
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return MKV_IMPORT_VLLM;
    size_t n = strlen(path);
    if (n >= 4 && strcmp(path + n - 4, ".npy") == 0)
        return MKV_IMPORT_NPY;
    return MKV_IMPORT_SAFETENSORS;
}

int mkv_import(const char *in_path, const mkv_import_opts *o, const char *out_path,
               const mkv_dump_write_opts *wo, mkv_error *err)
{
    mkv_import_opts default_opts;
    mkv_dump_write_opts default_wo;
    if (o == NULL) {
        mkv_import_opts_init(&default_opts);
        o = &default_opts;
    }
    if (wo == NULL) {
        mkv_dump_write_opts_init(&default_wo);
        wo = &default_wo;
    }
    if (o->n_heads < 0 || o->n_kv_heads < 0 || o->head_dim < 0)
        return mkv_fail(err, MKV_EUSAGE, "head counts and head_dim must not be negative");

    source s = {.kind = o->kind ? o->kind : detect_kind(in_path), .path = in_path};
    int rc;
    switch (s.kind) {
    case MKV_IMPORT_VLLM: rc = open_vllm(&s, o, err); break;
    case MKV_IMPORT_NPY: rc = open_npy(&s, o, err); break;
    default: s.kind = MKV_IMPORT_SAFETENSORS; rc = open_safetensors(&s, o, err); break;
    }
    if (rc) {
        source_close(&s);
        return rc;
    }
    if (s.q_heads == 0)
        s.q_heads = o->n_heads ? o->n_heads : s.kv_heads;

    mkv_dump_meta meta;
    mkv_dump_meta_init(&meta);
    if (o->model)
        snprintf(meta.model, sizeof meta.model, "%s", o->model);
    else
        base_name(in_path, meta.model, sizeof meta.model);
    meta.n_layers = s.n_layers;
    meta.n_heads = s.q_heads;
    meta.n_kv_heads = s.kv_heads;
    meta.head_dim = s.head_dim;
    meta.rope_theta = o->rope_theta;
    snprintf(meta.k_rope, sizeof meta.k_rope, "%s", o->k_rope ? o->k_rope : "post");
    snprintf(meta.source, sizeof meta.source, "import");
    meta.n_tokens = s.T;
    meta.n_queries = s.W;
    meta.dtype = o->dtype;
    meta.has_tokens = s.tokens != NULL;
    if ((rc = mkv_dump_meta_check(&meta, err))) {
        mkv_error_prefix(err, "'%s'", in_path);
        source_close(&s);
        return rc;
    }

    /* Copy in chunks the size of the output's chunks: whole HDF5 chunks are
     * written at once and memory stays small. */
    int64_t chunk = wo->chunk_tokens > 0 ? wo->chunk_tokens : 1024;
    int max_heads = s.q_heads > s.kv_heads ? s.q_heads : s.kv_heads;
    size_t n_buf;
    float *buf = NULL, *tmp = NULL;
    if (mkv_mul_size3((size_t)max_heads, (size_t)chunk, (size_t)s.head_dim, &n_buf) ||
        (buf = mkv_alloc(n_buf, sizeof(float), "import buffer", err)) == NULL ||
        (tmp = mkv_alloc(n_buf, sizeof(float), "import buffer", err)) == NULL) {
        mkv_free(buf);
        source_close(&s);
        return mkv_fail(err, MKV_ENOMEM, "out of memory for the import buffers (%d heads x %lld tokens x %d)",
                        max_heads, (long long)chunk, s.head_dim);
    }

    mkv_dump_writer *w;
    if ((rc = mkv_dump_create(out_path, &meta, wo, &w, err)) == MKV_OK) {
        if ((rc = copy_layers(&s, w, chunk, buf, tmp, err)) == MKV_OK &&
            (rc = write_ints(&s, w, err)) == MKV_OK)
            rc = mkv_dump_commit(w, err); /* frees w whatever happens */
        else
            mkv_dump_abort(w);
    }
    mkv_free(buf);
    mkv_free(tmp);
    source_close(&s);
    return rc;
}
