/* KIVI: 2- or 4-bit asymmetric quantization of the cache, keys per channel
 * and values per token, with the most recent tokens kept in fp16.
 *
 * With g = group, b = bits and the residual window r: the first
 * nq = floor((T - r) / g) g tokens are quantized (0 when T <= r), the other
 * T - nq stay fp16 (the residual window plus the tokens after the last full
 * key group).
 *   keys:   per group of g consecutive tokens, each channel has its own
 *           scale and zero;
 *   values: per token, each group of g consecutive channels has its own
 *           scale and zero (the last group is shorter when g does not
 *           divide d); gv = ceil(d / g) groups.
 * For a set with minimum mn and maximum mx: zero = mn rounded down to fp16,
 * scale = (mx - zero) / (2^b - 1) rounded up to fp16 (one more fp16 step if
 * rounding still leaves mx outside), code = clamp(round((x - zero) / scale),
 * 0, 2^b - 1), x' = code scale + zero, so |x - x'| <= scale / 2.
 * Codes are taken in row-major [token][channel] order and packed 8/b to a
 * byte, the first in the low bits (mkv_bl_pack).
 * Stored arrays per (layer, KV head) (quantized ones absent when nq = 0,
 * residual ones when nq = T):
 *   k_codes     uint8 [ceil(nq d b / 8)]
 *   k_scale     float16 [nq / g][d]
 *   k_zero      float16 [nq / g][d]
 *   v_codes     uint8 [ceil(nq d b / 8)]
 *   v_scale     float16 [nq][gv]
 *   v_zero      float16 [nq][gv]
 *   k_residual  float16 [T - nq][d]
 *   v_residual  float16 [T - nq][d]
 * Attention for a query at position p: every token 0..p (no token
 * selection) over the dequantized keys and values.
 * bytes_read: for the tokens <= p, their packed codes (K and V), the key
 * groups' scales and zeros they touch, their value scales and zeros, and the
 * fp16 residual rows.
 *
 * Decode (append), KIVI's streaming rule: the new token's key and value
 * join the fp16 residual (stored in float16); once the residual holds
 * r + g tokens (it holds r to r + g - 1 after compress), its oldest g
 * tokens are quantized as compress quantizes a group (keys per channel over
 * the g tokens, values per token), and the residual is back to r tokens.
 * So after T' tokens the state is split as compress would split a cache of
 * T' tokens: nq = floor((T' - r) / g) g quantized, the rest fp16. A group
 * quantized here is quantized from its float16 residual values (what the
 * cache holds), compress from the values it is given: the same codes,
 * scales and zeros when those are float16 values. */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "methods/baseline.h"
#include "core/tensor.h"

static const mkv_param_spec kivi_params[] = {
    {"bits", MKV_PARAM_INT, "2", 2, 4, "2 4", "bits per code"},
    {"group", MKV_PARAM_INT, "32", 1, 1e9, NULL,
     "group size: tokens per key scale, channels per value scale"},
    {"residual", MKV_PARAM_INT, "128", 0, 1e9, NULL, "most recent tokens kept in float16"},
    {NULL, 0, NULL, 0, 0, NULL, NULL},
};

typedef struct {
    int bits, group;
    int64_t residual;
} kivi_cfg;

typedef struct {
    int64_t T, nq;
    int d, G, gv;
    kivi_cfg cfg;
    float *k, *v;          /* [T][d] dequantized (quantized rows) and fp16 rows */
    int64_t k_cap, v_cap;  /* rows allocated (grown by append) */
} kivi_state;


static void config(const mkv_params *p, kivi_cfg *c)
{
    c->bits = (int)mkv_params_int(p, "bits");
    c->group = (int)mkv_params_int(p, "group");
    c->residual = mkv_params_int(p, "residual");
}

static int64_t quantized_tokens(const kivi_cfg *c, int64_t T)
{
    return T > c->residual ? (T - c->residual) / c->group * c->group : 0;
}

/* Every parameter is checked by its spec; none depends on the dump's shape. */
static int kivi_check(const mkv_params *p, const mkv_dump_meta *m, mkv_error *err)
{
    return MKV_OK;
}

/* Keys: scale/zero per (token group, channel); codes [nq][d]. */
static void quantize_keys(const kivi_cfg *c, const float *k, int64_t nq, int d, uint8_t *codes,
                          float *scale, float *zero)
{
    for (int64_t g0 = 0; g0 < nq; g0 += c->group)
        for (int j = 0; j < d; j++) {
            float mn = k[g0 * d + j], mx = mn;
            for (int64_t t = g0 + 1; t < g0 + c->group; t++) {
                float x = k[t * d + j];
                mn = x < mn ? x : mn;
                mx = x > mx ? x : mx;
            }
            size_t at = (size_t)(g0 / c->group) * (size_t)d + (size_t)j;
            mkv_bl_quant_range(mn, mx, c->bits, &scale[at], &zero[at]);
            for (int64_t t = g0; t < g0 + c->group; t++)
                codes[t * d + j] = (uint8_t)mkv_bl_quant_code(k[t * d + j], scale[at], zero[at], c->bits);
        }
}

/* Values: scale/zero per (token, channel group); codes [nq][d]. */
static void quantize_values(const kivi_cfg *c, const float *v, int64_t nq, int d, int gv,
                            uint8_t *codes, float *scale, float *zero)
{
    for (int64_t t = 0; t < nq; t++)
        for (int cg = 0; cg < gv; cg++) {
            int j0 = cg * c->group, j1 = j0 + c->group < d ? j0 + c->group : d;
            float mn = v[t * d + j0], mx = mn;
            for (int j = j0 + 1; j < j1; j++) {
                float x = v[t * d + j];
                mn = x < mn ? x : mn;
                mx = x > mx ? x : mx;
            }
            size_t at = (size_t)t * (size_t)gv + (size_t)cg;
            mkv_bl_quant_range(mn, mx, c->bits, &scale[at], &zero[at]);
            for (int j = j0; j < j1; j++)
                codes[t * d + j] = (uint8_t)mkv_bl_quant_code(v[t * d + j], scale[at], zero[at], c->bits);
        }
}

static int kivi_compress(const mkv_params *p, const mkv_head_kv *in, mkv_cdump_writer *w,
                         mkv_error *err)
{
    int rc;
    size_t n = (size_t)in->T * (size_t)in->d;
    if ((rc = mkv_bl_check_f16_range(in->k, n, "key", in->layer, in->head, err)) ||
        (rc = mkv_bl_check_f16_range(in->v, n, "value", in->layer, in->head, err)))
        return rc;
    kivi_cfg c;
    config(p, &c);
    int d = in->d, gv = (d + c.group - 1) / c.group;
    int64_t nq = quantized_tokens(&c, in->T), ngk = nq / c.group;
    size_t nc = (size_t)nq * (size_t)d, packed = mkv_bl_packed_bytes(nc, c.bits);
    uint8_t *codes = NULL, *kpack = NULL, *vpack = NULL;
    float *ks = NULL, *kz = NULL, *vs = NULL, *vz = NULL;
    if (nq > 0 &&
        (!(codes = mkv_alloc(nc, 1, "codes", err)) || !(kpack = mkv_alloc(packed, 1, "key codes", err)) ||
         !(vpack = mkv_alloc(packed, 1, "value codes", err)) ||
         !(ks = mkv_alloc((size_t)ngk * (size_t)d, sizeof(float), "key scales", err)) ||
         !(kz = mkv_alloc((size_t)ngk * (size_t)d, sizeof(float), "key zeros", err)) ||
         !(vs = mkv_alloc((size_t)nq * (size_t)gv, sizeof(float), "value scales", err)) ||
         !(vz = mkv_alloc((size_t)nq * (size_t)gv, sizeof(float), "value zeros", err)))) {
        rc = MKV_ENOMEM;
        goto done;
    }
    if (nq > 0) {
        int64_t dims[1] = {(int64_t)packed};
        quantize_keys(&c, in->k, nq, d, codes, ks, kz);
        mkv_bl_pack(codes, nc, c.bits, kpack);
        quantize_values(&c, in->v, nq, d, gv, codes, vs, vz);
        mkv_bl_pack(codes, nc, c.bits, vpack);
        if ((rc = mkv_cdump_put(w, in->layer, in->head, "k_codes", MKV_EL_U8, 1, dims, kpack, err)) ||
            (rc = mkv_cdump_put_rows(w, in->layer, in->head, "k_scale", MKV_EL_F16, ngk, d, ks, err)) ||
            (rc = mkv_cdump_put_rows(w, in->layer, in->head, "k_zero", MKV_EL_F16, ngk, d, kz, err)) ||
            (rc = mkv_cdump_put(w, in->layer, in->head, "v_codes", MKV_EL_U8, 1, dims, vpack, err)) ||
            (rc = mkv_cdump_put_rows(w, in->layer, in->head, "v_scale", MKV_EL_F16, nq, gv, vs, err)) ||
            (rc = mkv_cdump_put_rows(w, in->layer, in->head, "v_zero", MKV_EL_F16, nq, gv, vz, err)))
            goto done;
    }
    if (!(rc = mkv_cdump_put_rows(w, in->layer, in->head, "k_residual", MKV_EL_F16, in->T - nq, d,
                                in->k + nq * d, err)))
        rc = mkv_cdump_put_rows(w, in->layer, in->head, "v_residual", MKV_EL_F16, in->T - nq, d,
                                in->v + nq * d, err);
done:
    mkv_free(codes);
    mkv_free(kpack);
    mkv_free(vpack);
    mkv_free(ks);
    mkv_free(kz);
    mkv_free(vs);
    mkv_free(vz);
    return rc;
}

static void kivi_free(void *state)
{
    kivi_state *s = state;
    if (!s)
        return;
    mkv_free(s->k);
    mkv_free(s->v);
    free(s);
}

/* Dequantize n tokens (a whole number of key groups) from their packed
 * codes, key scales and zeros [n / g][d] and value scales and zeros
 * [n][gv] into k, v [n][d]. */
static void dequantize(const kivi_state *s, const uint8_t *kc, const float *ks, const float *kz,
                       const uint8_t *vc, const float *vs, const float *vz, int64_t n, float *k, float *v)
{
    int d = s->d, g = s->cfg.group, bits = s->cfg.bits;
    for (int64_t t = 0; t < n; t++)
        for (int j = 0; j < d; j++) {
            size_t i = (size_t)t * (size_t)d + (size_t)j;
            size_t ka = (size_t)(t / g) * (size_t)d + (size_t)j;
            size_t va = (size_t)t * (size_t)s->gv + (size_t)(j / g);
            k[i] = (float)(mkv_bl_unpack(kc, i, bits) * (double)ks[ka] + kz[ka]);
            v[i] = (float)(mkv_bl_unpack(vc, i, bits) * (double)vs[va] + vz[va]);
        }
}

/* Read the quantized arrays and dequantize rows 0..nq of s->k and s->v. */
static int load_quantized(kivi_state *s, mkv_cdump *c, int layer, int head, mkv_error *err)
{
    int d = s->d, g = s->cfg.group, bits = s->cfg.bits;
    int64_t nq = s->nq;
    int64_t packed[1] = {(int64_t)mkv_bl_packed_bytes((size_t)nq * (size_t)d, bits)};
    int64_t kdims[2] = {nq / g, d}, vdims[2] = {nq, s->gv};
    uint8_t *kc = NULL, *vc = NULL;
    float *ks = NULL, *kz = NULL, *vs = NULL, *vz = NULL;
    int rc;
    if (!(rc = mkv_cdump_get_shaped(c, layer, head, "k_codes", MKV_EL_U8, 1, packed, (void **)&kc, err)) &&
        !(rc = mkv_cdump_get_shaped(c, layer, head, "k_scale", MKV_EL_F16, 2, kdims, (void **)&ks, err)) &&
        !(rc = mkv_cdump_get_shaped(c, layer, head, "k_zero", MKV_EL_F16, 2, kdims, (void **)&kz, err)) &&
        !(rc = mkv_cdump_get_shaped(c, layer, head, "v_codes", MKV_EL_U8, 1, packed, (void **)&vc, err)) &&
        !(rc = mkv_cdump_get_shaped(c, layer, head, "v_scale", MKV_EL_F16, 2, vdims, (void **)&vs, err)) &&
        !(rc = mkv_cdump_get_shaped(c, layer, head, "v_zero", MKV_EL_F16, 2, vdims, (void **)&vz, err))) {
        dequantize(s, kc, ks, kz, vc, vs, vz, nq, s->k, s->v);
    }
    mkv_free(kc);
    mkv_free(vc);
    mkv_free(ks);
    mkv_free(kz);
    mkv_free(vs);
    mkv_free(vz);
    return rc;
}

static int kivi_load(const mkv_params *p, mkv_cdump *c, int layer, int head, void **state,
                     mkv_error *err)
{
    kivi_state *s = calloc(1, sizeof *s);
    if (!s)
        return mkv_fail(err, MKV_ENOMEM, "out of memory loading kivi state");
    mkv_cdump_cache_shape(c, &s->T, &s->d, &s->G);
    int rc = MKV_OK;
    config(p, &s->cfg);
    s->nq = quantized_tokens(&s->cfg, s->T);
    s->gv = (s->d + s->cfg.group - 1) / s->cfg.group;
    s->k_cap = s->v_cap = s->T;
    size_t n = (size_t)s->T * (size_t)s->d;
    if (!(s->k = mkv_alloc(n, sizeof(float), "keys", err)) ||
        !(s->v = mkv_alloc(n, sizeof(float), "values", err))) {
        rc = MKV_ENOMEM;
        goto fail;
    }
    if (s->nq > 0 && (rc = load_quantized(s, c, layer, head, err)))
        goto fail;
    if (s->nq < s->T) {
        int64_t dims[2] = {s->T - s->nq, s->d};
        float *kr = NULL, *vr = NULL;
        if (!(rc = mkv_cdump_get_shaped(c, layer, head, "k_residual", MKV_EL_F16, 2, dims, (void **)&kr, err)) &&
            !(rc = mkv_cdump_get_shaped(c, layer, head, "v_residual", MKV_EL_F16, 2, dims, (void **)&vr, err))) {
            memcpy(s->k + s->nq * s->d, kr, sizeof(float) * (size_t)(dims[0] * dims[1]));
            memcpy(s->v + s->nq * s->d, vr, sizeof(float) * (size_t)(dims[0] * dims[1]));
        }
        mkv_free(kr);
        mkv_free(vr);
        if (rc)
            goto fail;
    }
    *state = s;
    return MKV_OK;
fail:
    kivi_free(s);
    return rc;
}

static int kivi_attend(void *state, const mkv_attend_query *q, mkv_attend_result *r, mkv_error *err)
{
    kivi_state *s = state;
    int rc = mkv_bl_check_query(q, s->T, s->d, s->G, err);
    if (rc)
        return rc;
    int64_t n = q->pos + 1, nq = n < s->nq ? n : s->nq;
    uint64_t d = (uint64_t)s->d;
    memset(r->attended, 1, (size_t)n);
    r->bytes_read = 2u * mkv_bl_packed_bytes((size_t)nq * (size_t)d, s->cfg.bits) +
                    (uint64_t)((nq + s->cfg.group - 1) / s->cfg.group) * d * 2u * 2u +
                    (uint64_t)nq * (uint64_t)s->gv * 2u * 2u + (uint64_t)(n - nq) * 2u * d * 2u;
    return mkv_bl_attend_rows(q, s->k, s->v, n, NULL, r, err);
}

/* Quantize the oldest g residual tokens (rows nq..nq+g-1, float16 values)
 * in place: codes, scales and zeros as compress makes them, the rows
 * replaced by their dequantized values. */
static int quantize_group(kivi_state *s, mkv_error *err)
{
    const kivi_cfg *c = &s->cfg;
    int d = s->d, g = c->group;
    size_t nc = (size_t)g * (size_t)d, packed = mkv_bl_packed_bytes(nc, c->bits);
    uint8_t *codes = mkv_alloc(nc + 2 * packed, 1, "codes", err);
    float *sz = codes ? mkv_alloc(2 * (size_t)d + 2 * (size_t)g * (size_t)s->gv, sizeof(float), "scales", err) : NULL;
    if (!sz) {
        mkv_free(codes);
        return MKV_ENOMEM;
    }
    uint8_t *kpack = codes + nc, *vpack = kpack + packed;
    float *ks = sz, *kz = ks + d, *vs = kz + d, *vz = vs + (size_t)g * (size_t)s->gv;
    float *k = s->k + s->nq * d, *v = s->v + s->nq * d;
    quantize_keys(c, k, g, d, codes, ks, kz);
    mkv_bl_pack(codes, nc, c->bits, kpack);
    quantize_values(c, v, g, d, s->gv, codes, vs, vz);
    mkv_bl_pack(codes, nc, c->bits, vpack);
    dequantize(s, kpack, ks, kz, vpack, vs, vz, g, k, v);
    s->nq += g;
    mkv_free(codes);
    mkv_free(sz);
    return MKV_OK;
}

static int kivi_append(void *state, const float *k, const float *v, mkv_error *err)
{
    kivi_state *s = state;
    int rc;
    if ((rc = mkv_bl_append_row(&s->k, &s->k_cap, s->T, k, NULL, s->d, "key", err)) ||
        (rc = mkv_bl_append_row(&s->v, &s->v_cap, s->T, v, NULL, s->d, "value", err)))
        return rc;
    if (quantized_tokens(&s->cfg, s->T + 1) > s->nq && (rc = quantize_group(s, err)))
        return rc;
    s->T++;
    return MKV_OK;
}

/* Every array as compress stores it: packed K and V codes, key scales and
 * zeros per group and channel, value scales and zeros per token and
 * channel group, the fp16 residual K and V. */
static uint64_t kivi_state_bytes(const void *state)
{
    const kivi_state *s = state;
    uint64_t d = (uint64_t)s->d, nq = (uint64_t)s->nq;
    return 2u * mkv_bl_packed_bytes((size_t)nq * (size_t)d, s->cfg.bits) +
           nq / (uint64_t)s->cfg.group * d * 2u * 2u + nq * (uint64_t)s->gv * 2u * 2u +
           (uint64_t)(s->T - s->nq) * 2u * d * 2u;
}

const mkv_method mkv_method_kivi = {
    .name = "kivi",
    .summary = "KIVI: 2/4-bit asymmetric quantization, keys per channel, values per token, fp16 residual",
    .params = kivi_params,
    .check = kivi_check,
    .compress = kivi_compress,
    .load = kivi_load,
    .attend = kivi_attend,
    .free_state = kivi_free,
    .append = kivi_append,
    .state_bytes = kivi_state_bytes,
};
