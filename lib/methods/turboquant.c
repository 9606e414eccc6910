/* TurboQuant (Zandieh, Daliri, Hadian, Mirrokni 2025, "TurboQuant: Online
 * Vector Quantization with Near-optimal Distortion Rate"): every key and
 * value vector quantized on its own, data-obliviously, by a random
 * rotation and a fixed scalar codebook per coordinate.
 *
 * For a vector x [d]: its norm ||x||, rounded to float16, is stored; the
 * unit vector u = x / ||x|| (0 for x = 0) is rotated, y = Pi u, after which
 * each coordinate of y has the density of a coordinate of a uniformly
 * random unit vector, proportional to (1 - t^2)^((d - 3) / 2) on [-1, 1]
 * (close to N(0, 1/d)); each y_j is stored as the index of its cell in the
 * Lloyd-Max codebook of b bits for that density (TurboQuant_mse), and the
 * reconstruction is x' = ||x|| Pi^T c[codes].
 *   prod=on (keys only), TurboQuant_prod: of key_bits = b, b - 1 go to the
 *   codebook, and the residual r = y - c[codes] (rotated coordinates) is
 *   stored as its norm gamma (float16) and the signs z = sign(S r), one bit
 *   each, for a d x d matrix S of i.i.d. standard normals; then
 *   k' = ||k|| Pi^T (c[codes] + sqrt(pi/2) / d gamma S^T z), whose inner
 *   product with any q is an unbiased estimate of q.k (the paper's
 *   estimator: S Pi is again an i.i.d. Gaussian matrix, so sketching the
 *   rotated residual is sketching the residual). With b = 1 the codebook
 *   is the single centroid 0 and the key is its sketch alone.
 * Pi is the Q factor (R's diagonal positive) of a d x d matrix of standard
 * normals, filled row by row, Pi's rows being Q's columns; it and S come
 * from mkv_rng streams seeded by (seed, layer, KV head, tensor 0 keys or
 * 1 values, 0 rotation or 1 sketch) (mkv_rng_seed_stream), so loading
 * draws them again from the recorded parameters and nothing of them is
 * stored. The codebook (mkv_tq_codebook_make) is computed at compress and
 * at load by Lloyd-Max iteration on the exact density, in double.
 * Codes of b bits are packed as one bit stream (mkv_bl_pack) in row-major
 * [token][coordinate] order; a sign bit is 1 for (S r)_i >= 0.
 *
 * Stored arrays per (layer, KV head), bk = key_bits - (prod=on):
 *   k_codes  uint8 [ceil(T d bk / 8)]          (absent when bk = 0)
 *   k_norm   float16 [T]
 *   k_signs  uint8 [ceil(T d / 8)]             (prod=on)
 *   k_rnorm  float16 [T]                       (prod=on: gamma)
 *   v_codes  uint8 [ceil(T d value_bits / 8)]
 *   v_norm   float16 [T]
 * Attention for a query at position p: every token 0..p over the
 * reconstructed keys and values, computed in rotated coordinates (q
 * rotated by the keys' Pi, the output rotated back by the values' Pi^T).
 * bytes_read: the codes, signs and norms of tokens 0..p.
 *
 * Decode (append): the method is online, so a new token's key and value
 * are quantized at once with the same rotations and codebooks, exactly as
 * compress quantizes a token: after T' tokens the state is what compress
 * makes of a cache of T' tokens.
 *
 * Of the paper, implemented: TurboQuant_mse and TurboQuant_prod with
 * integer bits (1..4 per coordinate), the random rotation by QR of a
 * Gaussian matrix, the Lloyd-Max codebook of the exact coordinate density,
 * every token quantized, generated ones included (the paper's KV
 * experiments keep no float16 window of recent tokens, unlike KIVI). Not
 * implemented: the fractional settings of its KV experiments (2.5 and 3.5
 * bits per channel, a set of outlier channels quantized by a second
 * instance at more bits), and fast structured rotations. */
#include "config.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "methods/baseline.h"
#include "methods/turboquant_priv.h"
#include "core/half.h"
#include "core/rng.h"

#define TQ_PI 3.14159265358979323846
#define F16_MAX 65504.0
/* The rotation costs O(d^3) to draw and O(d^2) a vector; heads are 64 to
 * 256 wide, and the bound keeps a damaged file's head_dim from asking for
 * hours of work. */
#define TQ_MAX_DIM 1024

static const mkv_param_spec tq_params[] = {
    {"key_bits", MKV_PARAM_INT, "3", 1, MKV_TQ_MAX_BITS, NULL,
     "bits per key coordinate (with prod=on, one of them is the residual's sign)"},
    {"value_bits", MKV_PARAM_INT, "3", 1, MKV_TQ_MAX_BITS, NULL, "bits per value coordinate"},
    {"prod", MKV_PARAM_STRING, "off", 0, 0, "off on",
     "keys by TurboQuant_prod: unbiased q.k from a 1-bit sketch of the residual"},
    {"seed", MKV_PARAM_INT, "1", 0, 4294967295.0, NULL, "seed of the random rotations and sketches"},
    {NULL, 0, NULL, 0, 0, NULL, NULL},
};

/* ---------------------------------------------------------------- codebook */

/* The integral of cos^n over [0, theta], 0 <= theta <= pi/2, by the
 * reduction formula I_n = cos^(n-1) sin / n + (n-1)/n I_(n-2). */
static double cos_power_integral(int n, double theta)
{
    double s = sin(theta), c = cos(theta);
    double integral = n % 2 ? s : theta;
    double cpow = n % 2 ? c * c : c;    /* cos^(k-1) for the first k */
    for (int k = n % 2 + 2; k <= n; k += 2) {
        integral = cpow * s / k + (double)(k - 1) / k * integral;
        cpow *= c * c;
    }
    return integral;
}

/* With t = sin(theta) the density becomes proportional to cos^(d-2) theta:
 * the mass below x, and the first moment below x, which is
 * -(1 - x^2)^((d-1)/2) / ((d-1) Z) exactly. */
typedef struct {
    int d;
    double z;    /* the normalizer: 2 I_(d-2)(pi/2) */
} coord_density;

static double density_mass(const coord_density *f, double x)
{
    double half = cos_power_integral(f->d - 2, asin(fabs(x))) / f->z;
    return x < 0 ? 0.5 - half : 0.5 + half;
}

static double density_moment(const coord_density *f, double x)
{
    return -pow(1 - x * x, (f->d - 1) / 2.0) / ((f->d - 1) * f->z);
}

/* Boundaries from the centroids, then each cell's mass and centroid. */
static void lloyd_cells(const coord_density *f, mkv_tq_codebook *cb, double *mass, double *centre)
{
    int L = cb->levels;
    for (int i = 0; i + 1 < L; i++)
        cb->boundary[i] = (cb->centroid[i] + cb->centroid[i + 1]) / 2;
    double f0 = 0, m0 = 0;  /* mass and moment below -1 */
    for (int i = 0; i < L; i++) {
        double x = i + 1 < L ? cb->boundary[i] : 1.0;
        double f1 = density_mass(f, x), m1 = density_moment(f, x);
        mass[i] = f1 - f0;
        centre[i] = (m1 - m0) / mass[i];
        f0 = f1;
        m0 = m1;
    }
}

void mkv_tq_codebook_make(int d, int bits, mkv_tq_codebook *cb)
{
    int L = 1 << bits;
    coord_density f = {d, 2 * cos_power_integral(d - 2, TQ_PI / 2)};
    double mass[1 << MKV_TQ_MAX_BITS], centre[1 << MKV_TQ_MAX_BITS];
    cb->levels = L;
    cb->iterations = 0;
    /* symmetric start, spread over about two standard deviations (1/sqrt(d)) */
    double span = fmin(2 / sqrt((double)d), 0.9);
    for (int i = 0; i < L; i++)
        cb->centroid[i] = L > 1 ? span * (2 * i + 1 - L) / L : 0;
    /* Lloyd's iteration converges linearly to the optimum (the density is
     * log-concave for d >= 3); stop when the centroids move by less than
     * 1e-14 (they are of order 1/sqrt(d); near the optimum rounding alone
     * moves them by about 1e-15), or after a fixed number of steps */
    while (L > 1 && cb->iterations < 20000) {
        lloyd_cells(&f, cb, mass, centre);
        cb->iterations++;
        double moved = 0;
        for (int i = 0; i < L; i++) {
            moved = fmax(moved, fabs(centre[i] - cb->centroid[i]));
            cb->centroid[i] = centre[i];
        }
        if (moved <= 1e-14)
            break;
    }
    if (L == 1) {
        cb->distortion = 1;
        return;
    }
    lloyd_cells(&f, cb, mass, centre);
    /* E (y - c)^2 = E y^2 - sum_i P_i c_i^2 at centroids, E y^2 = 1/d */
    double kept = 0;
    for (int i = 0; i < L; i++)
        kept += mass[i] * cb->centroid[i] * cb->centroid[i];
    cb->distortion = 1 - d * kept;
}

unsigned mkv_tq_cell(const mkv_tq_codebook *cb, double x)
{
    unsigned i = 0;
    while (i + 1 < (unsigned)cb->levels && cb->boundary[i] < x)
        i++;
    return i;
}

/* ---------------------------------------------------------------- quantizer */

static void draw_normals(double *a, size_t n, uint64_t seed, int layer, int head, int tensor, int purpose)
{
    mkv_rng r;
    const uint64_t keys[4] = {(uint64_t)layer, (uint64_t)head, (uint64_t)tensor, (uint64_t)purpose};
    mkv_rng_seed_stream(&r, seed, keys, 4);
    for (size_t i = 0; i < n; i++)
        a[i] = mkv_rng_normal(&r);
}

/* rot [d][d] (its rows) = the columns of Q of a = QR, by modified
 * Gram-Schmidt with a second pass (orthogonal to rounding). */
static void orthonormal_rows(const double *a, int d, double *rot)
{
    for (int j = 0; j < d; j++) {
        double *v = rot + (size_t)j * d;
        for (int k = 0; k < d; k++)
            v[k] = a[(size_t)k * d + j];
        for (int pass = 0; pass < 2; pass++)
            for (int i = 0; i < j; i++) {
                const double *qi = rot + (size_t)i * d;
                double dot = 0;
                for (int k = 0; k < d; k++)
                    dot += qi[k] * v[k];
                for (int k = 0; k < d; k++)
                    v[k] -= dot * qi[k];
            }
        double norm = 0;
        for (int k = 0; k < d; k++)
            norm += v[k] * v[k];
        norm = sqrt(norm);
        for (int k = 0; k < d; k++)
            v[k] /= norm;
    }
}

int mkv_tq_quantizer_init(mkv_tq_quantizer *q, int d, int bits, int sketch, uint64_t seed, int layer, int head,
                          int tensor, mkv_error *err)
{
    size_t n = (size_t)d * (size_t)d;
    memset(q, 0, sizeof *q);
    q->d = d;
    q->bits = bits;
    double *a = mkv_alloc(n, sizeof *a, "rotation draw", err);
    if (!a || !(q->rotation = mkv_alloc(n, sizeof(double), "rotation", err)) ||
        (sketch && !(q->sketch = mkv_alloc(n, sizeof(double), "residual sketch", err)))) {
        mkv_free(a);
        mkv_tq_quantizer_free(q);
        return MKV_ENOMEM;
    }
    draw_normals(a, n, seed, layer, head, tensor, 0);
    orthonormal_rows(a, d, q->rotation);
    mkv_free(a);
    if (sketch)
        draw_normals(q->sketch, n, seed, layer, head, tensor, 1);
    mkv_tq_codebook_make(d, bits, &q->cb);
    return MKV_OK;
}

void mkv_tq_quantizer_free(mkv_tq_quantizer *q)
{
    mkv_free(q->rotation);
    mkv_free(q->sketch);
    q->rotation = q->sketch = NULL;
}

static float round_f16(double x)
{
    return mkv_f16_to_f32(mkv_f32_to_f16((float)x));
}

int mkv_tq_encode(const mkv_tq_quantizer *q, const float *x, float *norm, uint8_t *codes, uint8_t *signs,
                  float *rnorm, double *work, const char *what, mkv_error *err)
{
    int d = q->d;
    double n2 = 0;
    for (int j = 0; j < d; j++)
        n2 += (double)x[j] * x[j];
    double n = sqrt(n2);
    if (!(n <= F16_MAX))
        return mkv_fail(err, MKV_EFORMAT, "%s has norm %g, which does not fit float16 (<= 65504)", what, n);
    *norm = round_f16(n);
    double *u = work, *y = work + d;
    for (int j = 0; j < d; j++)
        u[j] = n > 0 ? x[j] / n : 0;
    for (int i = 0; i < d; i++) {
        const double *row = q->rotation + (size_t)i * d;
        double s = 0;
        for (int j = 0; j < d; j++)
            s += row[j] * u[j];
        y[i] = s;
        codes[i] = (uint8_t)mkv_tq_cell(&q->cb, s);
    }
    if (!q->sketch)
        return MKV_OK;
    double *r = u, r2 = 0;
    for (int j = 0; j < d; j++) {
        r[j] = y[j] - q->cb.centroid[codes[j]];
        r2 += r[j] * r[j];
    }
    *rnorm = round_f16(sqrt(r2));
    for (int i = 0; i < d; i++) {
        const double *row = q->sketch + (size_t)i * d;
        double s = 0;
        for (int j = 0; j < d; j++)
            s += row[j] * r[j];
        signs[i] = s >= 0;
    }
    return MKV_OK;
}

void mkv_tq_decode(const mkv_tq_quantizer *q, float norm, const uint8_t *codes, const uint8_t *signs, float rnorm,
                   float *y)
{
    int d = q->d;
    double scale = q->sketch ? sqrt(TQ_PI / 2) / d * rnorm : 0;
    for (int j = 0; j < d; j++) {
        double c = q->cb.centroid[codes[j]];
        if (q->sketch) {
            double s = 0;
            for (int i = 0; i < d; i++)
                s += signs[i] ? q->sketch[(size_t)i * d + j] : -q->sketch[(size_t)i * d + j];
            c += scale * s;
        }
        y[j] = (float)(norm * c);
    }
}

/* ---------------------------------------------------------------- the method */

typedef struct {
    int key_bits, value_bits, prod;
    uint64_t seed;
} tq_cfg;

typedef struct {
    int64_t T;
    int d, G;
    tq_cfg cfg;
    mkv_tq_quantizer kq, vq;
    float *k, *v;              /* [T][d] reconstructions, rotated coordinates */
    int64_t k_cap, v_cap;      /* rows allocated (grown by append) */
    uint8_t *codes, *signs;    /* [d] each: one token's, for append */
    double *work;              /* [2d] */
} tq_state;

static void config(const mkv_params *p, tq_cfg *c)
{
    c->key_bits = (int)mkv_params_int(p, "key_bits");
    c->value_bits = (int)mkv_params_int(p, "value_bits");
    c->prod = strcmp(mkv_params_str(p, "prod"), "on") == 0;
    c->seed = (uint64_t)mkv_params_int(p, "seed");
}

static int key_code_bits(const tq_cfg *c)
{
    return c->key_bits - c->prod;
}

static int init_quantizers(const tq_cfg *c, int d, int layer, int head, mkv_tq_quantizer *kq, mkv_tq_quantizer *vq,
                           mkv_error *err)
{
    int rc = mkv_tq_quantizer_init(kq, d, key_code_bits(c), c->prod, c->seed, layer, head, 0, err);
    if (!rc && (rc = mkv_tq_quantizer_init(vq, d, c->value_bits, 0, c->seed, layer, head, 1, err)))
        mkv_tq_quantizer_free(kq);
    return rc;
}

/* Bytes of n tokens: codes, sign bits and norms of keys and values. */
static uint64_t tokens_bytes(const tq_cfg *c, int d, int64_t n)
{
    size_t nd = (size_t)n * (size_t)d;
    uint64_t b = mkv_bl_packed_bytes(nd, key_code_bits(c)) + mkv_bl_packed_bytes(nd, c->value_bits) +
                 2u * 2u * (uint64_t)n;
    if (c->prod)
        b += mkv_bl_packed_bytes(nd, 1) + 2u * (uint64_t)n;
    return b;
}

static int tq_check(const mkv_params *p, const mkv_dump_meta *m, mkv_error *err)
{
    if (m->head_dim < 2 || m->head_dim > TQ_MAX_DIM)
        return mkv_fail(err, MKV_EUSAGE, "turboquant takes head_dim 2..%d (the dump has %d)", TQ_MAX_DIM,
                        m->head_dim);
    return MKV_OK;
}

/* Encode the rows of x [T][d] with q into codes [T][d], norms [T] and,
 * with a sketch, signs [T][d] and rnorms [T]. */
static int encode_rows(const mkv_tq_quantizer *q, const mkv_head_kv *in, const float *x, const char *what,
                       uint8_t *codes, float *norms, uint8_t *signs, float *rnorms, double *work, mkv_error *err)
{
    int d = in->d;
    for (int64_t t = 0; t < in->T; t++) {
        size_t at = (size_t)t * (size_t)d;
        int rc = mkv_tq_encode(q, x + at, &norms[t], codes + at, signs ? signs + at : NULL, rnorms ? &rnorms[t] : NULL,
                               work, what, err);
        if (rc) {
            char msg[MKV_ERRMSG_MAX];
            snprintf(msg, sizeof msg, "%s", err->msg);
            return mkv_fail(err, rc, "layer %d, head %d, token %lld: %s", in->layer, in->head, (long long)t, msg);
        }
    }
    return MKV_OK;
}

/* Pack codes [n] of `bits` into packed and store them as `name` (nothing
 * for 0 bits). */
static int put_codes(mkv_cdump_writer *w, const mkv_head_kv *in, const char *name, const uint8_t *codes, size_t n,
                     int bits, uint8_t *packed, mkv_error *err)
{
    if (bits == 0)
        return MKV_OK;
    int64_t dims[1] = {(int64_t)mkv_bl_packed_bytes(n, bits)};
    mkv_bl_pack(codes, n, bits, packed);
    return mkv_cdump_put(w, in->layer, in->head, name, MKV_EL_U8, 1, dims, packed, err);
}

static int tq_compress(const mkv_params *p, const mkv_head_kv *in, mkv_cdump_writer *w, mkv_error *err)
{
    tq_cfg c;
    config(p, &c);
    int d = in->d;
    int64_t T = in->T, tdims[1] = {T};
    size_t n = (size_t)T * (size_t)d;
    mkv_tq_quantizer kq, vq;
    int rc = init_quantizers(&c, d, in->layer, in->head, &kq, &vq, err);
    if (rc)
        return rc;
    uint8_t *codes = NULL, *signs = NULL, *packed = NULL;
    float *norms = NULL, *rnorms = NULL;
    double *work = NULL;
    if (!(codes = mkv_alloc(n, 1, "codes", err)) || !(packed = mkv_alloc(n, 1, "packed codes", err)) ||
        !(norms = mkv_alloc((size_t)T, sizeof(float), "norms", err)) ||
        !(work = mkv_alloc(2 * (size_t)d, sizeof(double), "encoder", err)) ||
        (c.prod && (!(signs = mkv_alloc(n, 1, "residual signs", err)) ||
                    !(rnorms = mkv_alloc((size_t)T, sizeof(float), "residual norms", err))))) {
        rc = MKV_ENOMEM;
        goto done;
    }
    if ((rc = encode_rows(&kq, in, in->k, "the key", codes, norms, signs, rnorms, work, err)) ||
        (rc = put_codes(w, in, "k_codes", codes, n, key_code_bits(&c), packed, err)) ||
        (rc = mkv_cdump_put(w, in->layer, in->head, "k_norm", MKV_EL_F16, 1, tdims, norms, err)))
        goto done;
    if (c.prod && ((rc = put_codes(w, in, "k_signs", signs, n, 1, packed, err)) ||
                   (rc = mkv_cdump_put(w, in->layer, in->head, "k_rnorm", MKV_EL_F16, 1, tdims, rnorms, err))))
        goto done;
    if (!(rc = encode_rows(&vq, in, in->v, "the value", codes, norms, NULL, NULL, work, err)) &&
        !(rc = put_codes(w, in, "v_codes", codes, n, c.value_bits, packed, err)))
        rc = mkv_cdump_put(w, in->layer, in->head, "v_norm", MKV_EL_F16, 1, tdims, norms, err);
done:
    mkv_tq_quantizer_free(&kq);
    mkv_tq_quantizer_free(&vq);
    mkv_free(codes);
    mkv_free(signs);
    mkv_free(packed);
    mkv_free(norms);
    mkv_free(rnorms);
    mkv_free(work);
    return rc;
}

static void tq_free(void *state)
{
    tq_state *s = state;
    if (!s)
        return;
    mkv_tq_quantizer_free(&s->kq);
    mkv_tq_quantizer_free(&s->vq);
    mkv_free(s->k);
    mkv_free(s->v);
    mkv_free(s->codes);
    mkv_free(s->signs);
    mkv_free(s->work);
    free(s);
}

/* Read a float16 array of T norms (`name`), which must not be negative. */
static int get_norms(mkv_cdump *c, int layer, int head, const char *name, int64_t T, float **out, mkv_error *err)
{
    int64_t dims[1] = {T};
    int rc = mkv_cdump_get_shaped(c, layer, head, name, MKV_EL_F16, 1, dims, (void **)out, err);
    for (int64_t t = 0; !rc && t < T; t++)
        if ((*out)[t] < 0)
            rc = mkv_fail(err, MKV_EFORMAT, "%s: layer %d, head %d: %s of token %lld is negative (%g)",
                          mkv_cdump_path(c), layer, head, name, (long long)t, (double)(*out)[t]);
    return rc;
}

/* Read packed codes of `bits` for T tokens (`name`; none for 0 bits). */
static int get_codes(mkv_cdump *c, int layer, int head, const char *name, int64_t T, int d, int bits,
                     uint8_t **out, mkv_error *err)
{
    int64_t dims[1] = {(int64_t)mkv_bl_packed_bytes((size_t)T * (size_t)d, bits)};
    *out = NULL;
    return bits ? mkv_cdump_get_shaped(c, layer, head, name, MKV_EL_U8, 1, dims, (void **)out, err) : MKV_OK;
}

/* Rows [T][d] of reconstructions from packed codes (NULL: 0 bits), norms
 * and, with a sketch, packed signs and residual norms. */
static void decode_rows(tq_state *s, const mkv_tq_quantizer *q, const uint8_t *codes, const float *norms,
                        const uint8_t *signs, const float *rnorms, float *rows)
{
    int d = s->d;
    for (int64_t t = 0; t < s->T; t++) {
        size_t at = (size_t)t * (size_t)d;
        for (int j = 0; j < d; j++) {
            s->codes[j] = (uint8_t)(codes ? mkv_bl_unpack(codes, at + (size_t)j, q->bits) : 0);
            s->signs[j] = (uint8_t)(signs ? mkv_bl_unpack(signs, at + (size_t)j, 1) : 0);
        }
        mkv_tq_decode(q, norms[t], s->codes, s->signs, rnorms ? rnorms[t] : 0, rows + at);
    }
}

static int load_arrays(tq_state *s, mkv_cdump *c, int layer, int head, mkv_error *err)
{
    int64_t T = s->T;
    int d = s->d;
    uint8_t *kc = NULL, *ks = NULL, *vc = NULL;
    float *kn = NULL, *kr = NULL, *vn = NULL;
    int rc;
    if (!(rc = get_codes(c, layer, head, "k_codes", T, d, key_code_bits(&s->cfg), &kc, err)) &&
        !(rc = get_norms(c, layer, head, "k_norm", T, &kn, err)) &&
        !(rc = get_codes(c, layer, head, "v_codes", T, d, s->cfg.value_bits, &vc, err)) &&
        !(rc = get_norms(c, layer, head, "v_norm", T, &vn, err)) &&
        (!s->cfg.prod || (!(rc = get_codes(c, layer, head, "k_signs", T, d, 1, &ks, err)) &&
                          !(rc = get_norms(c, layer, head, "k_rnorm", T, &kr, err)))) &&
        !(rc = init_quantizers(&s->cfg, d, layer, head, &s->kq, &s->vq, err))) {
        decode_rows(s, &s->kq, kc, kn, ks, kr, s->k);
        decode_rows(s, &s->vq, vc, vn, NULL, NULL, s->v);
    }
    mkv_free(kc);
    mkv_free(ks);
    mkv_free(vc);
    mkv_free(kn);
    mkv_free(kr);
    mkv_free(vn);
    return rc;
}

static int tq_load(const mkv_params *p, mkv_cdump *c, int layer, int head, void **state, mkv_error *err)
{
    tq_state *s = calloc(1, sizeof *s);
    if (!s)
        return mkv_fail(err, MKV_ENOMEM, "out of memory loading turboquant state");
    mkv_cdump_cache_shape(c, &s->T, &s->d, &s->G);
    config(p, &s->cfg);
    int rc;
    if (s->d < 2 || s->d > TQ_MAX_DIM) {
        rc = mkv_fail(err, MKV_EFORMAT, "%s: turboquant takes head_dim 2..%d (the file has %d)", mkv_cdump_path(c),
                      TQ_MAX_DIM, s->d);
        free(s);
        return rc;
    }
    size_t n = (size_t)s->T * (size_t)s->d;
    s->k_cap = s->v_cap = s->T;
    if (!(s->k = mkv_alloc(n, sizeof(float), "keys", err)) || !(s->v = mkv_alloc(n, sizeof(float), "values", err)) ||
        !(s->codes = mkv_alloc((size_t)s->d, 1, "codes", err)) ||
        !(s->signs = mkv_alloc((size_t)s->d, 1, "signs", err)) ||
        !(s->work = mkv_alloc(2 * (size_t)s->d, sizeof(double), "encoder", err))) {
        rc = MKV_ENOMEM;
        goto fail;
    }
    if ((rc = load_arrays(s, c, layer, head, err)))
        goto fail;
    *state = s;
    return MKV_OK;
fail:
    tq_free(s);
    return rc;
}

static int tq_attend(void *state, const mkv_attend_query *q, mkv_attend_result *r, mkv_error *err)
{
    tq_state *s = state;
    int rc = mkv_bl_check_query(q, s->T, s->d, s->G, err);
    if (rc)
        return rc;
    int d = s->d, G = q->G;
    int64_t n = q->pos + 1;
    float *rq = mkv_alloc(2 * (size_t)G * (size_t)d, sizeof(float), "rotated queries", err);
    if (!rq)
        return MKV_ENOMEM;
    float *rout = rq + (size_t)G * (size_t)d;
    for (int g = 0; g < G; g++)
        for (int i = 0; i < d; i++) {
            const double *row = s->kq.rotation + (size_t)i * d;
            double acc = 0;
            for (int j = 0; j < d; j++)
                acc += row[j] * q->q[(size_t)g * d + j];
            rq[(size_t)g * d + i] = (float)acc;
        }
    mkv_attend_query rotated = *q;
    rotated.q = rq;
    mkv_attend_result rres = {rout, r->attended, 0, r->lse};
    memset(r->attended, 1, (size_t)n);
    if (!(rc = mkv_bl_attend_rows(&rotated, s->k, s->v, n, NULL, &rres, err)))
        for (int g = 0; g < G; g++)
            for (int j = 0; j < d; j++) {
                double acc = 0;
                for (int i = 0; i < d; i++)
                    acc += s->vq.rotation[(size_t)i * d + j] * rout[(size_t)g * d + i];
                r->out[(size_t)g * d + j] = (float)acc;
            }
    r->bytes_read = tokens_bytes(&s->cfg, d, n);
    mkv_free(rq);
    return rc;
}

/* Quantize one new vector x with q and store its reconstruction as row T
 * of *rows. */
static int append_vector(tq_state *s, const mkv_tq_quantizer *q, float **rows, int64_t *cap, const float *x,
                         const char *what, mkv_error *err)
{
    float norm, rnorm = 0;
    int rc = mkv_bl_grow_rows(rows, cap, s->T, s->T + 1, s->d, err);
    if (!rc && !(rc = mkv_tq_encode(q, x, &norm, s->codes, s->signs, &rnorm, s->work, what, err)))
        mkv_tq_decode(q, norm, s->codes, s->signs, rnorm, *rows + (size_t)s->T * (size_t)s->d);
    return rc;
}

static int tq_append(void *state, const float *k, const float *v, mkv_error *err)
{
    tq_state *s = state;
    int rc;
    if ((rc = append_vector(s, &s->kq, &s->k, &s->k_cap, k, "a new key", err)) ||
        (rc = append_vector(s, &s->vq, &s->v, &s->v_cap, v, "a new value", err)))
        return rc;
    s->T++;
    return MKV_OK;
}

/* Every array as compress stores it for the tokens held. */
static uint64_t tq_state_bytes(const void *state)
{
    const tq_state *s = state;
    return tokens_bytes(&s->cfg, s->d, s->T);
}

const mkv_method mkv_method_turboquant = {
    .name = "turboquant",
    .summary = "TurboQuant: random rotation, Lloyd-Max codes per coordinate, optional 1-bit residual sketch for keys",
    .params = tq_params,
    .check = tq_check,
    .compress = tq_compress,
    .load = tq_load,
    .attend = tq_attend,
    .free_state = tq_free,
    .append = tq_append,
    .state_bytes = tq_state_bytes,
};
