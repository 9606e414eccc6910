/* Method "full": the uncompressed baseline. K and V are stored dense in
 * float16, exactly the logical bytes (ratio 1.0), and every token 0..p
 * takes part in attention.
 *
 * Arrays per layer and KV head (/layers/NN/HH):
 *   k   float16 [T, head_dim]   keys as in the raw dump
 *   v   float16 [T, head_dim]   values
 * Bytes read per step: (p + 1) x head_dim x 2 bytes for K and again for V. */
#include "config.h"
#include "methods/method.h"

#include <math.h>
#include <stdlib.h>

#include "core/attn.h"
#include "core/tensor.h"

static const mkv_param_spec full_params[] = {{NULL, 0, NULL, 0, 0, NULL, NULL}};

typedef struct {
    int64_t T;
    int d;
    float *k, *v;   /* [T][d], float16 values widened */
} full_state;

static int full_check(const mkv_params *p, const mkv_dump_meta *m, mkv_error *err)
{
    (void)p;
    (void)m;
    (void)err;
    return MKV_OK;
}

static int full_compress(const mkv_params *p, const mkv_head_kv *in, mkv_cdump_writer *w, mkv_error *err)
{
    (void)p;
    int64_t dims[2] = {in->T, in->d};
    int rc = mkv_cdump_put(w, in->layer, in->head, "k", MKV_EL_F16, 2, dims, in->k, err);
    if (!rc)
        rc = mkv_cdump_put(w, in->layer, in->head, "v", MKV_EL_F16, 2, dims, in->v, err);
    return rc;
}

static void full_free(void *state)
{
    full_state *s = state;
    if (!s)
        return;
    mkv_free(s->k);
    mkv_free(s->v);
    free(s);
}

static int full_load(const mkv_params *p, mkv_cdump *c, int layer, int head, void **state, mkv_error *err)
{
    (void)p;
    const mkv_dump_meta *m = &mkv_cdump_meta_of(c)->raw;
    full_state *s = calloc(1, sizeof *s);
    if (!s)
        return mkv_fail(err, MKV_ENOMEM, "out of memory");
    s->T = m->n_tokens;
    s->d = m->head_dim;
    size_t n = (size_t)s->T * (size_t)s->d;
    s->k = mkv_alloc(n, sizeof(float), "keys", err);
    s->v = mkv_alloc(n, sizeof(float), "values", err);
    int rc = !s->k || !s->v ? MKV_ENOMEM : MKV_OK;
    if (!rc)
        rc = mkv_cdump_get(c, layer, head, "k", MKV_EL_F16, s->k, n, err);
    if (!rc)
        rc = mkv_cdump_get(c, layer, head, "v", MKV_EL_F16, s->v, n, err);
    if (rc) {
        full_free(s);
        return rc;
    }
    *state = s;
    return MKV_OK;
}

static int full_attend(void *state, const mkv_attend_query *q, mkv_attend_result *r, mkv_error *err)
{
    full_state *s = state;
    if (q->pos < 0 || q->pos >= s->T || q->d != s->d)
        return mkv_fail(err, MKV_EUSAGE, "query at position %lld (head_dim %d) does not fit %lld tokens of head_dim %d",
                        (long long)q->pos, q->d, (long long)s->T, s->d);
    double *acc = malloc(sizeof(double) * (size_t)s->d);
    if (!acc)
        return mkv_fail(err, MKV_ENOMEM, "out of memory");
    for (int g = 0; g < q->G; g++) {
        const float *qg = q->q + (size_t)g * (size_t)s->d;
        mkv_osm osm;
        mkv_osm_init(&osm, acc, s->d);
        for (int64_t t = 0; t <= q->pos; t++) {
            const float *kt = s->k + (size_t)t * (size_t)s->d;
            double dot = 0;
            for (int i = 0; i < s->d; i++)
                dot += (double)qg[i] * (double)kt[i];
            mkv_osm_add(&osm, dot * q->scale, s->v + (size_t)t * (size_t)s->d);
        }
        mkv_osm_finish(&osm, r->out + (size_t)g * (size_t)s->d);
        if (r->lse)
            r->lse[g] = mkv_osm_lse(&osm);
    }
    free(acc);
    for (int64_t t = 0; t <= q->pos; t++)
        r->attended[t] = 1;
    r->bytes_read = (uint64_t)(q->pos + 1) * (uint64_t)s->d * 2 * 2;
    return MKV_OK;
}

const mkv_method mkv_method_full = {
    .name = "full",
    .summary = "uncompressed baseline: dense float16 K and V, attends to every token",
    .params = full_params,
    .check = full_check,
    .compress = full_compress,
    .load = full_load,
    .attend = full_attend,
    .free_state = full_free,
};
