/* The methods' GPU paths behind mkv_gpu_method_usable and
 * mkv_gpu_method_attend (gpu_method.h): the table of paths (why it is a
 * table here: gpu_method_priv.h), the device and shape checks they share,
 * and the device buffers of the dense paths. */
#include "config.h"
#include "gpu/gpu_method_priv.h"

#include <stdio.h>
#include <string.h>

#include "core/half.h"

static const mkv_gpu_method *const gpu_methods[] = {&mkv_gpu_full, &mkv_gpu_mosaic, &mkv_gpu_uniform2d,
                                                    &mkv_gpu_quest, NULL};

const mkv_gpu_method *mkv_gpu_method_of(const mkv_method *m)
{
    for (int i = 0; gpu_methods[i]; i++)
        if (gpu_methods[i]->method == m)
            return gpu_methods[i];
    return NULL;
}

int mkv_gpu_shape_supported(const mkv_dump_meta *meta, char *why, size_t len)
{
    const int G = meta->n_kv_heads > 0 ? meta->n_heads / meta->n_kv_heads : 0;
    if (meta->head_dim != 64 && meta->head_dim != 128) {
        snprintf(why, len, "head_dim %d (the GPU kernels take 64 and 128)", meta->head_dim);
        return 0;
    }
    if (G < 1 || G > 8) {
        snprintf(why, len, "%d query heads per KV head (the GPU kernels take 1 to 8)", G);
        return 0;
    }
    return 1;
}

int mkv_gpu_method_usable(const mkv_method *m, const mkv_params *p, const mkv_dump_meta *meta, char *why, size_t len)
{
    static int probed = 0, count = 0, usable = 0;
    static char name[256];
    if (!mkv_cuda_built()) {
        snprintf(why, len, "this build has no CUDA");
        return 0;
    }
    if (!probed) {
        mkv_gpu_info info[1];
        mkv_error e = {0};
        if (mkv_cuda_devices(info, 1, &count, &e) != MKV_OK)
            count = 0;
        usable = count > 0 && info[0].usable;
        snprintf(name, sizeof name, "%s", count > 0 ? info[0].name : "");
        probed = 1;
    }
    if (count == 0) {
        snprintf(why, len, "no GPU is visible");
        return 0;
    }
    if (!usable) {
        snprintf(why, len, "GPU '%s' is not a target of this build", name);
        return 0;
    }
    const mkv_gpu_method *g = mkv_gpu_method_of(m);
    if (!g) {
        snprintf(why, len, "method '%s' has no GPU path", m->name);
        return -1;
    }
    if (!mkv_gpu_shape_supported(meta, why, len))
        return -1;
    if (g->supports && !g->supports(p, meta, why, len))
        return -1;
    return 1;
}

int mkv_gpu_method_attend(const mkv_method *m, const mkv_params *p, mkv_cdump *c, int layer, int head,
                          const mkv_eval_queries *q, mkv_eval_answers *a, mkv_error *err)
{
    const mkv_gpu_method *g = mkv_gpu_method_of(m);
    if (!g)
        return mkv_fail(err, MKV_EUNSUP, "method '%s' has no GPU path", m->name);
    return g->attend(p, c, layer, head, q, a, err);
}

/* ---------------------------------------------------------------- buffers */

void *mkv_gpu_devset_alloc(mkv_gpu_devset *s, size_t bytes, mkv_error *err)
{
    const int cap = (int)(sizeof s->p / sizeof s->p[0]);
    void *ptr = NULL;
    if (s->n >= cap) {
        mkv_fail(err, MKV_EUSAGE, "GPU buffers: more than %d in one call", cap);
        return NULL;
    }
    if (mkv_cuda_malloc(&ptr, bytes, err) != MKV_OK)
        return NULL;
    s->p[s->n++] = ptr;
    return ptr;
}

void mkv_gpu_devset_free(mkv_gpu_devset *s)
{
    for (int i = 0; i < s->n; i++)
        mkv_cuda_free(s->p[i]);
    s->n = 0;
}

/* K and V of a dense method's head as fp16 [T][d]. */
static int load_kv16(mkv_cdump *c, int layer, int head, int64_t T, int d, uint16_t **k16, uint16_t **v16, mkv_error *err)
{
    size_t n = (size_t)T * (size_t)d;
    float *f = mkv_alloc(n, sizeof *f, "keys", err);
    *k16 = f ? mkv_alloc(n, 2, "keys", err) : NULL;
    *v16 = *k16 ? mkv_alloc(n, 2, "values", err) : NULL;
    int rc = *v16 ? MKV_OK : (err ? err->code : MKV_ENOMEM);
    if (rc == MKV_OK && (rc = mkv_cdump_get(c, layer, head, "k", MKV_EL_F16, f, n, err)) == MKV_OK) {
        mkv_f32_to_f16_n(f, *k16, n);
        if ((rc = mkv_cdump_get(c, layer, head, "v", MKV_EL_F16, f, n, err)) == MKV_OK)
            mkv_f32_to_f16_n(f, *v16, n);
    }
    mkv_free(f);
    if (rc != MKV_OK) {
        mkv_free(*k16);
        mkv_free(*v16);
        *k16 = *v16 = NULL;
    }
    return rc;
}

int mkv_gpu_dense_setup(mkv_cdump *c, int layer, int head, const mkv_eval_queries *q, mkv_gpu_devset *ds,
                        mkv_gpu_dense_bufs *b, mkv_error *err)
{
    const size_t gd = (size_t)q->G * (size_t)q->d;
    uint16_t *k16, *v16;
    int rc = load_kv16(c, layer, head, q->T, q->d, &k16, &v16, err);
    if (rc != MKV_OK)
        return rc;
    const size_t kv = (size_t)q->T * (size_t)q->d * 2;
    b->k = mkv_gpu_devset_alloc(ds, kv, err);
    b->v = b->k ? mkv_gpu_devset_alloc(ds, kv, err) : NULL;
    b->q = b->v ? mkv_gpu_devset_alloc(ds, gd * 4, err) : NULL;
    b->out = b->q ? mkv_gpu_devset_alloc(ds, gd * 4, err) : NULL;
    rc = b->out ? MKV_OK : (err ? err->code : MKV_ENOMEM);
    if (rc == MKV_OK && (rc = mkv_cuda_upload(b->k, k16, kv, err)) == MKV_OK)
        rc = mkv_cuda_upload(b->v, v16, kv, err);
    mkv_free(k16);
    mkv_free(v16);
    return rc;
}
