/* The packed MosaicKV format (see packed.h): byte geometry, the in-memory
 * layout, store, load with its checks, and the conversion to the GPU
 * records. */
#include "config.h"
#include "mosaic/packed.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/half.h"
#include "methods/baseline.h"
#include "mosaic/mosaic.h"

/* ---------------------------------------------------------------- bytes */

int mkv_mosaic_bitmap_bytes(const mkv_mosaic_strategy *s)
{
    if (!s->pervector || s->r >= s->dprime)
        return 0;
    return (s->dprime / s->g + 7) / 8;
}

int mkv_mosaic_vector_bytes(const mkv_mosaic_strategy *s)
{
    return s->bits == 16 ? 2 * s->r : (s->r * s->bits + 7) / 8;
}

int64_t mkv_mosaic_qgroups(const mkv_mosaic_strategy *s)
{
    if (s->bits == 16)
        return 0;
    return s->qgroup > 0 ? (s->len + s->qgroup - 1) / s->qgroup : 1;
}

int64_t mkv_mosaic_qparam_count(const mkv_mosaic_strategy *s) { return 2 * s->dprime * mkv_mosaic_qgroups(s); }

float mkv_mosaic_dequantize(unsigned code, float zero, float step)
{
    return mkv_f16_to_f32(mkv_f32_to_f16((float)((double)zero + (double)code * step)));
}

/* The codes of one vector as bytes, one per value. */
static void unpack_codes(const uint8_t *packed, int bits, int r, uint8_t *code)
{
    switch (bits) {
    case 8: memcpy(code, packed, (size_t)r); break;
    case 4:
        for (int k = 0; k < r; k++)
            code[k] = (uint8_t)((packed[k >> 1] >> ((k & 1) * 4)) & 15u);
        break;
    case 2:
        for (int k = 0; k < r; k++)
            code[k] = (uint8_t)((packed[k >> 2] >> ((k & 3) * 2)) & 3u);
        break;
    default:
        for (int k = 0; k < r; k++)
            code[k] = (uint8_t)mkv_bl_unpack(packed, (size_t)k, bits);
    }
}

/* Code `code` of channel c read back with the fp16 zero and step of qp. */
static float dequantize_at(unsigned code, const uint16_t *qp, int c)
{
    return mkv_mosaic_dequantize(code, mkv_f16_to_f32(qp[2 * c]), mkv_f16_to_f32(qp[2 * c + 1]));
}

void mkv_mosaic_dequantize_vector_scalar(const uint8_t *packed, int bits, int r, const int *pos, const uint16_t *qp,
                                         float *out)
{
    uint8_t code[MKV_MOSAIC_MAX_D];
    unpack_codes(packed, bits, r, code);
    for (int k = 0; k < r; k++)
        out[k] = dequantize_at(code[k], qp, pos[k]);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
/* Eight codes k0..k0+7 as 32-bit integers (k0 a multiple of 8). */
__attribute__((target("avx2"), always_inline)) static inline __m256i codes8(const uint8_t *packed, int bits, int k0,
                                                                           const uint8_t *code)
{
    if (bits == 8)
        return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(packed + k0)));
    if (bits == 4) {
        uint32_t w;
        memcpy(&w, packed + k0 / 2, 4);
        __m128i x = _mm_cvtsi32_si128((int)w), m = _mm_set1_epi8(15);
        /* code 2i is the low nibble of byte i, code 2i + 1 its high one */
        __m128i lo = _mm_and_si128(x, m), hi = _mm_and_si128(_mm_srli_epi16(x, 4), m);
        return _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));
    }
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(code + k0)));
}

/* Eight values at a time with mkv_mosaic_dequantize's result: zeros and
 * steps are fp16 values and codes have at most 8 bits, so code x step is
 * exact in float and zero + code x step is a multiple of 2^-24 below
 * 2^25, exact in double: the float sum rounds the exact value once, as
 * the double sum's conversion does, and the fp16 rounding (to nearest
 * even) is mkv_f32_to_f16's. Channels in a row (pos[k] = k, no bitmap)
 * load the zeros and steps; scattered ones gather them, a channel's fp16
 * zero and step being one 32-bit word (the zero in its low half). */
__attribute__((target("avx2,f16c"))) static void dequantize_avx2(const uint8_t *packed, int bits, int r,
                                                               const int *pos, const uint16_t *qp, float *out)
{
    uint8_t code[MKV_MOSAIC_MAX_D];
    if (bits != 8 && bits != 4)
        unpack_codes(packed, bits, r, code);
    int dense = pos[r - 1] == r - 1, k = 0;
    for (; k + 8 <= r; k += 8) {
        /* word c: channel c's step << 16 | zero */
        __m256i pairs = dense ? _mm256_loadu_si256((const __m256i *)(qp + 2 * k))
                              : _mm256_i32gather_epi32((const int *)qp, _mm256_loadu_si256((const __m256i *)(pos + k)), 4);
        __m256i halves = _mm256_packus_epi32(_mm256_and_si256(pairs, _mm256_set1_epi32(0xffff)),
                                             _mm256_srli_epi32(pairs, 16));   /* z0-3 s0-3 | z4-7 s4-7 */
        halves = _mm256_permute4x64_epi64(halves, _MM_SHUFFLE(3, 1, 2, 0));   /* z0-7 | s0-7 */
        __m256 zero = _mm256_cvtph_ps(_mm256_castsi256_si128(halves));
        __m256 step = _mm256_cvtph_ps(_mm256_extracti128_si256(halves, 1));
        __m256 c = _mm256_cvtepi32_ps(codes8(packed, bits, k, code));
        __m256 f = _mm256_add_ps(zero, _mm256_mul_ps(c, step));
        _mm256_storeu_ps(out + k, _mm256_cvtph_ps(_mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
    }
    for (; k < r; k++)
        out[k] = dequantize_at(mkv_bl_unpack(packed, (size_t)k, bits), qp, pos[k]);
}

/* libgcc reads the CPU's features once, in a constructor. */
static int have_avx2(void)
{
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
}
#endif

void mkv_mosaic_dequantize_vector(const uint8_t *packed, int bits, int r, const int *pos, const uint16_t *qp,
                                  float *out)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (have_avx2() && r > 0) {
        dequantize_avx2(packed, bits, r, pos, qp, out);
        return;
    }
#endif
    mkv_mosaic_dequantize_vector_scalar(packed, bits, r, pos, qp, out);
}

const float *mkv_mosaic_vector_values(const mkv_mosaic_tensor *t, int64_t si, int64_t i, const int *pos, float *buf)
{
    const mkv_mosaic_strategy *s = &t->seg[si];
    if (s->bits == 16) {
        mkv_f16_to_f32_n(t->values + t->off_values[si] + i * s->r, buf, (size_t)s->r);
        return buf;
    }
    const uint16_t *qp = t->qparams + t->off_qparams[si] + 2 * mkv_mosaic_qgroup_of(s, i) * s->dprime;
    mkv_mosaic_dequantize_vector(t->codes + t->off_codes[si] + i * mkv_mosaic_vector_bytes(s), s->bits, s->r, pos,
                                 qp, buf);
    return buf;
}

uint64_t mkv_mosaic_attended_segment_bytes(const mkv_mosaic_strategy *vs, int d)
{
    return vs->rotate ? (uint64_t)d * (uint64_t)vs->dprime * 2 : 0;
}

int64_t mkv_mosaic_qgroup_of(const mkv_mosaic_strategy *s, int64_t i) { return s->qgroup ? i / s->qgroup : 0; }

uint64_t mkv_mosaic_qparams_read(const mkv_mosaic_strategy *s, int64_t i, int64_t *last)
{
    if (s->bits == 16)
        return 0;
    int64_t grp = mkv_mosaic_qgroup_of(s, i);
    if (grp == *last)
        return 0;
    *last = grp;
    return (uint64_t)s->dprime * 2 * 2;
}

int64_t mkv_mosaic_nblocks(int64_t len, int B) { return (len + B - 1) / B; }

double mkv_mosaic_scaled_budget(float scale, double budget)
{
    if (scale <= 0 || budget > 1)
        return budget;
    double b = (double)scale * budget;
    return b < 1 ? b : 1;
}

int mkv_mosaic_rotation_cols(const mkv_mosaic_strategy *s)
{
    if (!s->rotate)
        return 0;
    return s->keydim > s->dprime ? s->keydim : s->dprime;
}

int mkv_mosaic_block_width(const mkv_mosaic_strategy *s) { return s->keydim + s->bound; }

void mkv_mosaic_strategy_bytes(const mkv_mosaic_strategy *s, int d, int block, mkv_mosaic_bytes *b)
{
    uint64_t len = (uint64_t)s->len;
    b->values = len * (uint64_t)mkv_mosaic_vector_bytes(s);
    b->qparams = (uint64_t)mkv_mosaic_qparam_count(s) * 2;
    b->bitmap = len * (uint64_t)mkv_mosaic_bitmap_bytes(s);
    b->blockkeys = block > 0 ? (uint64_t)mkv_mosaic_nblocks(s->len, block) *
                                   (uint64_t)mkv_mosaic_block_width(s) * 2 : 0;
    b->rotation = (uint64_t)d * (uint64_t)mkv_mosaic_rotation_cols(s) * 2;
    b->total = b->values + b->qparams + b->bitmap + b->blockkeys + b->rotation;
}

/* ---------------------------------------------------------------- head state */

int mkv_mosaic_layout(mkv_mosaic_tensor *t, int d, int block, int64_t first, int64_t last,
                      mkv_error *err)
{
    mkv_free(t->off_values);
    t->off_values = NULL;
    int64_t ns = t->nseg > 0 ? t->nseg : 1;
    int64_t *off = mkv_alloc((size_t)ns * 6, sizeof *off, "segment offsets", err);
    if (!off)
        return err ? err->code : MKV_ENOMEM;
    t->off_values = off;
    t->off_bitmap = off + ns;
    t->off_blockkeys = off + 2 * ns;
    t->off_rotation = off + 3 * ns;
    t->off_codes = off + 4 * ns;
    t->off_qparams = off + 5 * ns;
    int64_t nv = 0, nb = 0, nk = 0, nr = 0, nc = 0, nq = 0, next = first;
    for (int64_t i = 0; i < t->nseg; i++) {
        const mkv_mosaic_strategy *s = &t->seg[i];
        const char *bad = NULL;
        if (s->start != next || s->len < 1 || s->start + s->len > last)
            bad = "segments do not tile the compressed tokens";
        else if (s->rotate != 0 && s->rotate != 1)
            bad = "rotate must be 0 or 1";
        else if (s->pervector != 0 && s->pervector != 1)
            bad = "pervector must be 0 or 1";
        else if (s->bits != 16 && s->bits != 8 && s->bits != 4 && s->bits != 2)
            bad = "bits must be 16, 8, 4 or 2";
        else if (s->qgroup < 0 || (s->qgroup && (s->bits == 16 || s->qgroup >= s->len)))
            bad = "qgroup must be 0 (the whole segment), or 1..length-1 when quantized";
        else if (s->g != 1 && s->g != 2 && s->g != 4)
            bad = "group size must be 1, 2 or 4";
        else if (s->dprime < 1 || s->dprime > d || s->dprime % s->g)
            bad = "d' must be a multiple of the group size, at most head_dim";
        else if (s->r < 1 || s->r > s->dprime || s->r % s->g)
            bad = "r must be a multiple of the group size, at most d'";
        else if (!s->rotate && s->dprime != d)
            bad = "an unrotated segment keeps d' = head_dim";
        else if (block > 0 && s->keydim != 0 && (s->keydim > d || (!s->rotate && s->keydim != d)))
            bad = "block keys span 0 (none) or 1..head_dim channels, all of them when unrotated";
        else if (block > 0 && (s->bound < 0 || s->bound > s->keydim || (!s->rotate && s->bound)))
            bad = "bound channels must be 0..keydim, 0 when unrotated";
        else if (block <= 0 && (s->keydim || s->bound))
            bad = "values have no block keys";
        if (bad)
            return mkv_fail(err, MKV_EFORMAT, "strategy table row %lld (start %lld, length %lld, "
                            "rotate %d, r %d, g %d, d' %d, bits %d, qgroup %d, keydim %d, bound %d): %s",
                            (long long)i, (long long)s->start, (long long)s->len, s->rotate, s->r, s->g, s->dprime,
                            s->bits, s->qgroup, s->keydim, s->bound, bad);
        t->off_values[i] = nv;
        t->off_bitmap[i] = nb;
        t->off_blockkeys[i] = nk;
        t->off_rotation[i] = nr;
        t->off_codes[i] = nc;
        t->off_qparams[i] = nq;
        nv += s->bits == 16 ? s->len * s->r : 0;
        nc += s->bits == 16 ? 0 : s->len * mkv_mosaic_vector_bytes(s);
        nq += mkv_mosaic_qparam_count(s);
        nb += s->len * mkv_mosaic_bitmap_bytes(s);
        nk += block > 0 ? mkv_mosaic_nblocks(s->len, block) * mkv_mosaic_block_width(s) : 0;
        nr += (int64_t)d * mkv_mosaic_rotation_cols(s);
        next = s->start + s->len;
    }
    if (next != last)
        return mkv_fail(err, MKV_EFORMAT, "strategy table covers tokens %lld..%lld, not %lld..%lld",
                        (long long)first, (long long)next, (long long)first, (long long)last);
    t->n_values = nv;
    t->n_bitmap = nb;
    t->n_blockkeys = nk;
    t->n_rotation = nr;
    t->n_codes = nc;
    t->n_qparams = nq;
    return MKV_OK;
}

static void tensor_free(mkv_mosaic_tensor *t)
{
    mkv_free(t->seg);
    mkv_free(t->loss);
    mkv_free(t->values);
    mkv_free(t->bitmap);
    mkv_free(t->blockkeys);
    mkv_free(t->rotation);
    mkv_free(t->codes);
    mkv_free(t->qparams);
    mkv_free(t->off_values);
    memset(t, 0, sizeof *t);
}

void mkv_mosaic_head_free(mkv_mosaic_head *h)
{
    if (!h)
        return;
    mkv_free(h->dense_k);
    mkv_free(h->dense_v);
    tensor_free(&h->k);
    tensor_free(&h->v);
    memset(h, 0, sizeof *h);
}

/* ---------------------------------------------------------------- storage */

static int put_flat(mkv_cdump_writer *w, int layer, int head, const char *name, mkv_el_type type,
                    int64_t n, const void *data, mkv_error *err)
{
    if (n == 0)
        return MKV_OK;
    return mkv_cdump_put(w, layer, head, name, type, 1, &n, data, err);
}
/* The fp16 values of the 16-bit segments (the others store codes). */
static int store_values(const mkv_mosaic_tensor *t, char x, mkv_cdump_writer *w, int layer, int head,
                        mkv_error *err)
{
    char name[32];
    snprintf(name, sizeof name, "%c/values", x);
    return put_flat(w, layer, head, name, MKV_EL_F16_BITS, t->n_values, t->values, err);
}

static int store_tensor(const mkv_mosaic_tensor *t, const mkv_mosaic_head *h, char x,
                        mkv_cdump_writer *w, int layer, int head, mkv_error *err)
{
    char name[32];
    int rc = MKV_OK;
    if (t->nseg > 0) {
        int32_t *table = mkv_alloc((size_t)t->nseg * MKV_MOSAIC_TABLE_COLS, sizeof *table,
                                   "the strategy table", err);
        if (!table)
            return err ? err->code : MKV_ENOMEM;
        for (int64_t i = 0; i < t->nseg; i++) {
            const mkv_mosaic_strategy *s = &t->seg[i];
            int32_t row[MKV_MOSAIC_TABLE_COLS] = {(int32_t)s->start, (int32_t)s->len, s->rotate, s->r,
                                                  s->g, s->dprime, s->pervector, s->bits, s->qgroup};
            memcpy(table + i * MKV_MOSAIC_TABLE_COLS, row, sizeof row);
        }
        snprintf(name, sizeof name, "%c/strategy", x);
        rc = mkv_cdump_put_rows(w, layer, head, name, MKV_EL_I32, t->nseg, MKV_MOSAIC_TABLE_COLS, table, err);
        mkv_free(table);
        snprintf(name, sizeof name, "%c/loss", x);
        if (rc == MKV_OK)
            rc = mkv_cdump_put_rows(w, layer, head, name, MKV_EL_F32_OR_NAN, t->nseg, MKV_MOSAIC_LOSS_COLS, t->loss,
                                    err);
    }
    if (rc == MKV_OK && x == 'k' && t->nseg > 0) {
        int32_t *dims = mkv_alloc((size_t)t->nseg * MKV_MOSAIC_BLOCKDIM_COLS, sizeof *dims,
                                  "the block-key table", err);
        if (!dims)
            return err ? err->code : MKV_ENOMEM;
        for (int64_t i = 0; i < t->nseg; i++) {
            dims[i * MKV_MOSAIC_BLOCKDIM_COLS] = t->seg[i].keydim;
            dims[i * MKV_MOSAIC_BLOCKDIM_COLS + 1] = t->seg[i].bound;
        }
        rc = mkv_cdump_put_rows(w, layer, head, "k/blockdims", MKV_EL_I32, t->nseg, MKV_MOSAIC_BLOCKDIM_COLS, dims,
                                err);
        mkv_free(dims);
    }
    snprintf(name, sizeof name, "%c/dense", x);
    if (rc == MKV_OK)
        rc = mkv_cdump_put_rows(w, layer, head, name, MKV_EL_F16_BITS, h->sink_n + h->recent_n, h->d,
                                x == 'k' ? h->dense_k : h->dense_v, err);
    if (rc == MKV_OK)
        rc = store_values(t, x, w, layer, head, err);
    const struct {
        const char *name;
        mkv_el_type type;
        int64_t n;
        const void *data;
    } flat[] = {
        {"codes", MKV_EL_U8, t->n_codes, t->codes},
        {"qparams", MKV_EL_F16_BITS, t->n_qparams, t->qparams},
        {"bitmap", MKV_EL_U8, t->n_bitmap, t->bitmap},
        {"blockkeys", MKV_EL_F16_BITS, t->n_blockkeys, t->blockkeys},
        {"rotation", MKV_EL_F16_BITS, t->n_rotation, t->rotation},
    };
    for (size_t i = 0; i < sizeof flat / sizeof flat[0] && rc == MKV_OK; i++) {
        snprintf(name, sizeof name, "%c/%s", x, flat[i].name);
        rc = put_flat(w, layer, head, name, flat[i].type, flat[i].n, flat[i].data, err);
    }
    return rc;
}

int mkv_mosaic_store(const mkv_mosaic_head *h, mkv_cdump_writer *w, int layer, int head, mkv_error *err)
{
    int rc = store_tensor(&h->k, h, 'k', w, layer, head, err);
    if (rc == MKV_OK)
        rc = store_tensor(&h->v, h, 'v', w, layer, head, err);
    if (rc == MKV_OK && h->budget_scale > 0)
        rc = put_flat(w, layer, head, "budget_scale", MKV_EL_F32, 1, &h->budget_scale, err);
    return rc;
}

/* MKV_EFORMAT "'file': layer L, KV head H: array 'name': ...". */
static int bad_array(mkv_cdump *c, int layer, int head, const char *name, mkv_error *err, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return mkv_fail(err, MKV_EFORMAT, "'%s': layer %d, KV head %d: array '%s': %s", mkv_cdump_path(c), layer,
                    head, name, what);
}

/* Read a flat array of n elements (absent when n = 0). */
static int get_flat(mkv_cdump *c, int layer, int head, const char *name, mkv_el_type type, int64_t n,
                    void **out, mkv_error *err)
{
    *out = NULL;
    if (n == 0) {
        if (mkv_cdump_has(c, layer, head, name))
            return bad_array(c, layer, head, name, err,
                             "should be absent (the strategy table gives it no element)");
        return MKV_OK;
    }
    return mkv_cdump_get_shaped(c, layer, head, name, type, 1, &n, out, err);
}

/* Every bitmap of t holds exactly r/g set bits, all below d'/g (stored
 * floats are finite already: mkv_cdump_get refuses NaN and Inf). */
static int check_bitmaps(mkv_cdump *c, int layer, int head, char x, const mkv_mosaic_tensor *t, mkv_error *err)
{
    char name[32];
    snprintf(name, sizeof name, "%c/bitmap", x);
    for (int64_t i = 0; i < t->nseg; i++) {
        const mkv_mosaic_strategy *s = &t->seg[i];
        const int bb = mkv_mosaic_bitmap_bytes(s), ng = s->dprime / s->g;
        for (int64_t j = 0; bb > 0 && j < s->len; j++) {
            const uint8_t *bits = t->bitmap + t->off_bitmap[i] + j * bb;
            int set = 0, past = 0;
            for (int b = 0; b < bb * 8; b++)
                if (bits[b >> 3] >> (b & 7) & 1) {
                    set += b < ng;
                    past += b >= ng;
                }
            if (set != s->r / s->g || past)
                return bad_array(c, layer, head, name, err,
                                 "token %lld (segment %lld) keeps %d of %d groups%s, the strategy keeps r/g = %d",
                                 (long long)(s->start + j), (long long)i, set, ng,
                                 past ? " and sets pad bits" : "", s->r / s->g);
        }
    }
    return MKV_OK;
}

/* The fp16 values of the 16-bit segments, the codes and the zeros and
 * steps of the others, checking the codes' pad bits and the steps. */
static int load_values(mkv_cdump *c, int layer, int head, char x, mkv_mosaic_tensor *t, mkv_error *err)
{
    char vname[32], cname[32], qname[32];
    snprintf(vname, sizeof vname, "%c/values", x);
    snprintf(cname, sizeof cname, "%c/codes", x);
    snprintf(qname, sizeof qname, "%c/qparams", x);
    int rc = get_flat(c, layer, head, vname, MKV_EL_F16_BITS, t->n_values, (void **)&t->values, err);
    if (rc == MKV_OK)
        rc = get_flat(c, layer, head, cname, MKV_EL_U8, t->n_codes, (void **)&t->codes, err);
    if (rc == MKV_OK)
        rc = get_flat(c, layer, head, qname, MKV_EL_F16_BITS, t->n_qparams, (void **)&t->qparams, err);
    for (int64_t i = 0; rc == MKV_OK && i < t->nseg; i++) {
        const mkv_mosaic_strategy *s = &t->seg[i];
        if (s->bits == 16)
            continue;
        const uint16_t *qp = t->qparams + t->off_qparams[i];
        const int64_t nq = mkv_mosaic_qgroups(s);
        for (int64_t q = 0; q < nq * s->dprime && rc == MKV_OK; q++)
            if (!(mkv_f16_to_f32(qp[2 * q + 1]) >= 0))
                rc = bad_array(c, layer, head, qname, err, "segment %lld, token group %lld, channel %d: negative "
                               "step %g", (long long)i, (long long)(q / s->dprime), (int)(q % s->dprime),
                               (double)mkv_f16_to_f32(qp[2 * q + 1]));
        const int vb = mkv_mosaic_vector_bytes(s), pad = vb * 8 - s->r * s->bits;
        for (int64_t j = 0; j < s->len && rc == MKV_OK && pad; j++)
            if (t->codes[t->off_codes[i] + j * vb + vb - 1] >> (8 - pad))
                rc = bad_array(c, layer, head, cname, err, "token %lld (segment %lld) sets pad bits",
                               (long long)(s->start + j), (long long)i);
    }
    return rc;
}

static int load_tensor(mkv_cdump *c, int layer, int head, char x, mkv_mosaic_head *h,
                       mkv_mosaic_tensor *t, mkv_error *err)
{
    char name[32];
    int64_t dims[3] = {0, 0, 0};
    int block = x == 'k' ? h->block : 0;
    int64_t first = h->sink_n, last = h->T - h->recent_n;
    snprintf(name, sizeof name, "%c/strategy", x);
    int rank = mkv_cdump_shape(c, layer, head, name, dims);
    int rc = MKV_OK;
    t->nseg = rank ? dims[0] : 0;
    int cols = rank == 2 ? (int)dims[1] : 0;
    if (rank && (rank != 2 || cols < MKV_MOSAIC_TABLE_COLS - 2 || cols > MKV_MOSAIC_TABLE_COLS || dims[0] < 1))
        return bad_array(c, layer, head, name, err, "not an [nseg][%d] table", MKV_MOSAIC_TABLE_COLS);
    t->seg = mkv_calloc((size_t)(t->nseg ? t->nseg : 1), sizeof *t->seg, "strategies", err);
    if (!t->seg)
        return err ? err->code : MKV_ENOMEM;
    if (t->nseg > 0) {
        int32_t *table = NULL;
        int64_t tdims[2] = {t->nseg, cols}, ldims[2] = {t->nseg, MKV_MOSAIC_LOSS_COLS};
        rc = mkv_cdump_get_shaped(c, layer, head, name, MKV_EL_I32, 2, tdims, (void **)&table, err);
        if (rc != MKV_OK)
            return rc;
        for (int64_t i = 0; i < t->nseg; i++) {
            const int32_t *row = table + i * cols;
            t->seg[i] = (mkv_mosaic_strategy){.start = row[0], .len = row[1], .rotate = row[2],
                                              .r = row[3], .g = row[4], .dprime = row[5],
                                              .pervector = row[6], .bits = cols > 7 ? row[7] : 16,
                                              .qgroup = cols > 8 ? row[8] : 0};
        }
        mkv_free(table);
        snprintf(name, sizeof name, "%c/loss", x);
        rc = mkv_cdump_get_shaped(c, layer, head, name, MKV_EL_F32_OR_NAN, 2, ldims, (void **)&t->loss, err);
        if (rc == MKV_OK && x == 'k') {
            int32_t *bd = NULL;
            int64_t bdims[2] = {t->nseg, MKV_MOSAIC_BLOCKDIM_COLS};
            rc = mkv_cdump_get_shaped(c, layer, head, "k/blockdims", MKV_EL_I32, 2, bdims, (void **)&bd, err);
            for (int64_t i = 0; rc == MKV_OK && i < t->nseg; i++) {
                t->seg[i].keydim = bd[i * MKV_MOSAIC_BLOCKDIM_COLS];
                t->seg[i].bound = bd[i * MKV_MOSAIC_BLOCKDIM_COLS + 1];
            }
            mkv_free(bd);
        }
    } else if (last > first) {
        return bad_array(c, layer, head, name, err, "missing");
    }
    snprintf(name, sizeof name, "%c/strategy", x);
    if (rc == MKV_OK && (rc = mkv_mosaic_layout(t, h->d, block, first, last, err)) != MKV_OK)
        mkv_error_prefix(err, "'%s': layer %d, KV head %d: array '%s'", mkv_cdump_path(c), layer, head, name);
    snprintf(name, sizeof name, "%c/bitmap", x);
    if (rc == MKV_OK)
        rc = get_flat(c, layer, head, name, MKV_EL_U8, t->n_bitmap, (void **)&t->bitmap, err);
    if (rc == MKV_OK)
        rc = check_bitmaps(c, layer, head, x, t, err);
    if (rc == MKV_OK)
        rc = load_values(c, layer, head, x, t, err);
    snprintf(name, sizeof name, "%c/blockkeys", x);
    if (rc == MKV_OK)
        rc = get_flat(c, layer, head, name, MKV_EL_F16_BITS, t->n_blockkeys, (void **)&t->blockkeys, err);
    snprintf(name, sizeof name, "%c/rotation", x);
    if (rc == MKV_OK)
        rc = get_flat(c, layer, head, name, MKV_EL_F16_BITS, t->n_rotation, (void **)&t->rotation, err);
    int64_t nd = h->sink_n + h->recent_n, ddims[2] = {nd, h->d};
    uint16_t **dense = x == 'k' ? &h->dense_k : &h->dense_v;
    snprintf(name, sizeof name, "%c/dense", x);
    if (rc == MKV_OK && nd > 0)
        rc = mkv_cdump_get_shaped(c, layer, head, name, MKV_EL_F16_BITS, 2, ddims, (void **)dense, err);
    return rc;
}

int mkv_mosaic_load(mkv_cdump *c, int layer, int head, int block, int64_t sink, int64_t recent,
                    mkv_mosaic_head *h, mkv_error *err)
{
    memset(h, 0, sizeof *h);
    mkv_cdump_cache_shape(c, &h->T, &h->d, &h->G);
    h->block = block;
    h->sink_n = sink < h->T ? sink : h->T;
    h->recent_n = recent < h->T - h->sink_n ? recent : h->T - h->sink_n;
    int rc = MKV_OK;
    if (h->d < 1 || h->d > MKV_MOSAIC_MAX_D)
        rc = mkv_fail(err, MKV_EFORMAT, "'%s': head_dim %d is out of range for mosaic", mkv_cdump_path(c), h->d);
    if (rc == MKV_OK)
        rc = load_tensor(c, layer, head, 'k', h, &h->k, err);
    if (rc == MKV_OK)
        rc = load_tensor(c, layer, head, 'v', h, &h->v, err);
    if (rc == MKV_OK && mkv_cdump_has(c, layer, head, "budget_scale")) {
        float *scale = NULL;
        rc = get_flat(c, layer, head, "budget_scale", MKV_EL_F32, 1, (void **)&scale, err);
        if (rc == MKV_OK && !(scale[0] > 0))
            rc = bad_array(c, layer, head, "budget_scale", err, "%g is not a positive multiple of the budget",
                           (double)scale[0]);
        if (rc == MKV_OK)
            h->budget_scale = scale[0];
        mkv_free(scale);
    }
    if (rc == MKV_OK && h->k.nseg != h->v.nseg)
        rc = bad_array(c, layer, head, "v/strategy", err, "%lld segments, the keys have %lld",
                       (long long)h->v.nseg, (long long)h->k.nseg);
    for (int64_t i = 0; rc == MKV_OK && i < h->k.nseg; i++)
        if (h->k.seg[i].start != h->v.seg[i].start || h->k.seg[i].len != h->v.seg[i].len)
            rc = bad_array(c, layer, head, "v/strategy", err, "segment %lld differs from the keys' (k/strategy)",
                           (long long)i);
    if (rc != MKV_OK)
        mkv_mosaic_head_free(h);
    return rc;
}

/* ---------------------------------------------------------------- GPU records */

static int64_t pad32(int64_t x) { return (x + 31) / 32 * 32; }
static int64_t pad16(int64_t x) { return (x + 15) / 16 * 16; }
static int64_t pad8(int64_t x) { return (x + 7) / 8 * 8; }

/* Bytes of one segment's rows of the two strategy tables and k/blockdims. */
#define TABLE_ROW_BYTES ((2 * MKV_MOSAIC_TABLE_COLS + MKV_MOSAIC_BLOCKDIM_COLS) * 4)

/* Record geometry of one segment (K strategy ks, V strategy vs). */
static void geometry(const mkv_mosaic_strategy *ks, const mkv_mosaic_strategy *vs, int d, int B, mkv_packed_seg *s)
{
    s->dk = (int32_t)(ks->rotate ? pad32(mkv_mosaic_rotation_cols(ks)) : d);
    s->dv = (int32_t)(vs->rotate ? pad32(vs->dprime) : d);
    s->kdim = ks->keydim;
    s->kbound = ks->bound;
    s->bk_width = (int32_t)pad8(s->kdim + s->kbound);
    s->rk = ks->r;
    s->rv = vs->r;
    s->dpk = ks->dprime;
    s->dpv = vs->dprime;
    s->gk = ks->pervector ? ks->g : 1;
    s->gv = vs->pervector ? vs->g : 1;
    s->pvk = ks->pervector && ks->r < ks->dprime;
    s->pvv = vs->pervector && vs->r < vs->dprime;
    s->kmask_off = (int32_t)pad16((int64_t)B * s->rk * 2);
    s->vval_off = s->kmask_off + (int32_t)pad16((int64_t)B * (pad32(ks->dprime) / 32) * 4);
    s->vmask_off = s->vval_off + (int32_t)pad16((int64_t)B * s->rv * 2);
    s->rec_bytes = s->vmask_off + (int32_t)pad16((int64_t)B * (s->dv / 32) * 4);
}

/* Per-channel bitmap words (nw) of one stored vector: the per-group bits
 * of its bitmap spread over the group's channels, or the first r channels
 * when the strategy stores no bitmap. */
static void channel_mask(const mkv_mosaic_strategy *s, const uint8_t *bitmap, uint32_t *w, int nw)
{
    memset(w, 0, sizeof *w * (size_t)nw);
    if (mkv_mosaic_bitmap_bytes(s) == 0) {
        for (int c = 0; c < s->r; c++)
            w[c / 32] |= 1u << (c % 32);
        return;
    }
    int ng = s->dprime / s->g, kept = 0;
    for (int i = 0; i < ng && kept < s->r; i++)
        if (bitmap[i >> 3] >> (i & 7) & 1)
            for (int c = i * s->g; c < i * s->g + s->g; c++, kept++)
                w[c / 32] |= 1u << (c % 32);
}

static int check_shape(const mkv_mosaic_head *h, int d, int B, mkv_error *err)
{
    if (h->d != d || h->block != B)
        return mkv_fail(err, MKV_EUSAGE, "GPU layout: heads differ in head_dim or block size");
    if (d != 64 && d != 128)
        return mkv_fail(err, MKV_EUNSUP, "GPU layout: head_dim %d; the GPU kernels take 64 and 128", d);
    if (B != 1 && B != 2 && B != 4 && B != 8 && B != 16)
        return mkv_fail(err, MKV_EUNSUP, "GPU layout: block of %d tokens; the GPU kernel takes 1, 2, 4, 8 or 16", B);
    if (h->T > INT32_MAX)
        return mkv_fail(err, MKV_EUNSUP, "GPU layout: %lld tokens", (long long)h->T);
    for (int64_t i = 0; i < h->k.nseg; i++)
        if (h->k.seg[i].keydim == 0)
            return mkv_fail(err, MKV_EUNSUP, "GPU layout: segments without block keys (budget=1); the GPU "
                            "kernel selects blocks");
    return MKV_OK;
}

void mkv_gpu_layout_free(mkv_gpu_layout *g)
{
    if (!g)
        return;
    mkv_free(g->heads);
    mkv_free(g->segs);
    mkv_free(g->records);
    mkv_free(g->blockkeys);
    mkv_free(g->rotations);
    mkv_free(g->dense_k);
    mkv_free(g->dense_v);
    memset(g, 0, sizeof *g);
}

/* Rotation [d][dp] (float, fp16 values) into [d][dpad] fp16, zero columns past dp. */
static void put_rotation(const uint16_t *R, int d, int dp, int dpad, uint16_t *out)
{
    for (int j = 0; j < d; j++)
        for (int c = 0; c < dpad; c++)
            out[(size_t)j * dpad + c] = c < dp ? R[(size_t)j * dp + c] : 0;
}

int mkv_gpu_layout_build(const mkv_mosaic_head *const *hs, int n, int64_t temp_tokens, int open, mkv_gpu_layout *g,
                         mkv_error *err)
{
    memset(g, 0, sizeof *g);
    if (n < 1 || !hs || !hs[0])
        return mkv_fail(err, MKV_EUSAGE, "GPU layout: no heads");
    const int d = hs[0]->d, B = hs[0]->block;
    int64_t n_segs = 0, rec_bytes = 0, n_bk = 0, n_rot = 0, n_dense = 0;
    int rc;
    for (int i = 0; i < n; i++) {
        const mkv_mosaic_head *h = hs[i];
        if ((rc = check_shape(h, d, B, err)) != MKV_OK)
            return rc;
        const int temp = temp_tokens > 0 && h->k.nseg > 0;
        n_segs += h->k.nseg + temp;
        n_dense += h->sink_n + h->recent_n;
        for (int64_t s = 0; s < h->k.nseg; s++) {
            const mkv_mosaic_strategy *ks = &h->k.seg[s], *vs = &h->v.seg[s];
            mkv_packed_seg sg;
            geometry(ks, vs, d, B, &sg);
            int64_t nb = mkv_mosaic_nblocks(ks->len, B);
            rec_bytes += nb * sg.rec_bytes;
            n_bk += nb * sg.bk_width;
            n_rot += (ks->rotate ? (int64_t)d * sg.dk : 0) + (vs->rotate ? (int64_t)d * sg.dv : 0);
            if (temp && s == h->k.nseg - 1) {
                rec_bytes += mkv_mosaic_nblocks(temp_tokens, B) * sg.rec_bytes;
                n_bk += open ? mkv_mosaic_nblocks(temp_tokens, B) * sg.bk_width : 0;
            }
        }
    }
    g->heads = mkv_calloc((size_t)n, sizeof *g->heads, "GPU head table", err);
    g->segs = g->heads ? mkv_calloc((size_t)(n_segs ? n_segs : 1), sizeof *g->segs, "GPU segment table", err) : NULL;
    g->records = g->segs ? mkv_calloc((size_t)(rec_bytes ? rec_bytes : 16), 1, "GPU records", err) : NULL;
    g->blockkeys = g->records ? mkv_calloc((size_t)(n_bk ? n_bk : 1), 2, "GPU block keys", err) : NULL;
    g->rotations = g->blockkeys ? mkv_calloc((size_t)(n_rot ? n_rot : 1), 2, "GPU rotations", err) : NULL;
    g->dense_k = g->rotations ? mkv_calloc((size_t)(n_dense ? n_dense : 1) * (size_t)d, 2, "GPU dense keys", err) : NULL;
    g->dense_v = g->dense_k ? mkv_calloc((size_t)(n_dense ? n_dense : 1) * (size_t)d, 2, "GPU dense values", err) : NULL;
    if (!g->dense_v) {
        mkv_gpu_layout_free(g);
        return err ? err->code : MKV_ENOMEM;
    }
    int64_t seg_row = 0, rec_off = 0, bk_off = 0, rot_off = 0, dense_row = 0;
    uint32_t mw[MKV_MOSAIC_MAX_D / 32];
    for (int i = 0; i < n; i++) {
        const mkv_mosaic_head *h = hs[i];
        mkv_packed_head *hd = &g->heads[i];
        const int64_t nd = h->sink_n + h->recent_n;
        hd->T = h->T;
        hd->dense_row = dense_row;
        hd->sink_n = (int32_t)h->sink_n;
        hd->recent_n = (int32_t)h->recent_n;
        hd->first_seg = (int32_t)seg_row;
        if (nd > 0) {
            memcpy(g->dense_k + dense_row * d, h->dense_k, (size_t)(nd * d) * sizeof *g->dense_k);
            memcpy(g->dense_v + dense_row * d, h->dense_v, (size_t)(nd * d) * sizeof *g->dense_v);
        }
        dense_row += nd;
        int32_t blocks = 0;
        for (int64_t s = 0; s < h->k.nseg; s++) {
            const mkv_mosaic_strategy *ks = &h->k.seg[s], *vs = &h->v.seg[s];
            mkv_packed_seg *sg = &g->segs[seg_row++];
            geometry(ks, vs, d, B, sg);
            sg->start = ks->start;
            sg->len = ks->len;
            sg->n_blocks = (int32_t)mkv_mosaic_nblocks(ks->len, B);
            sg->first_block = blocks;
            sg->rec_off = rec_off;
            sg->bk_off = bk_off;
            sg->rk_off = sg->rv_off = -1;
            if (ks->rotate) {
                sg->rk_off = rot_off;
                put_rotation(h->k.rotation + h->k.off_rotation[s], d, mkv_mosaic_rotation_cols(ks), sg->dk, g->rotations + rot_off);
                rot_off += (int64_t)d * sg->dk;
            }
            if (vs->rotate) {
                sg->rv_off = rot_off;
                put_rotation(h->v.rotation + h->v.off_rotation[s], d, vs->dprime, sg->dv, g->rotations + rot_off);
                rot_off += (int64_t)d * sg->dv;
            }
            const int kbb = mkv_mosaic_bitmap_bytes(ks), vbb = mkv_mosaic_bitmap_bytes(vs);
            for (int64_t t = 0; t < ks->len; t++) {
                uint8_t *r = g->records + rec_off + (t / B) * sg->rec_bytes;
                const int row = (int)(t % B);
                uint16_t *kv = (uint16_t *)r + row * sg->rk;
                uint16_t *vv = (uint16_t *)(r + sg->vval_off) + row * sg->rv;
                int kpos[MKV_MOSAIC_MAX_D], vpos[MKV_MOSAIC_MAX_D];
                float kbuf[MKV_MOSAIC_MAX_D], vbuf[MKV_MOSAIC_MAX_D];
                mkv_mosaic_positions(kbb ? h->k.bitmap + h->k.off_bitmap[s] + t * kbb : NULL, ks, kpos);
                mkv_mosaic_positions(vbb ? h->v.bitmap + h->v.off_bitmap[s] + t * vbb : NULL, vs, vpos);
                const float *ksrc = mkv_mosaic_vector_values(&h->k, s, t, kpos, kbuf);
                const float *vsrc = mkv_mosaic_vector_values(&h->v, s, t, vpos, vbuf);
                for (int e = 0; e < ks->r; e++)
                    kv[e] = mkv_f32_to_f16(ksrc[e]);
                for (int e = 0; e < vs->r; e++)
                    vv[e] = mkv_f32_to_f16(vsrc[e]);
                const int kw = (int)(pad32(ks->dprime) / 32);
                channel_mask(ks, kbb ? h->k.bitmap + h->k.off_bitmap[s] + t * kbb : NULL, mw, kw);
                memcpy(r + sg->kmask_off + (size_t)row * kw * 4, mw, (size_t)kw * 4);
                channel_mask(vs, vbb ? h->v.bitmap + h->v.off_bitmap[s] + t * vbb : NULL, mw, sg->dv / 32);
                memcpy(r + sg->vmask_off + (size_t)row * (sg->dv / 32) * 4, mw, (size_t)(sg->dv / 32) * 4);
            }
            const int kw = sg->kdim + sg->kbound;
            for (int64_t b = 0; b < sg->n_blocks; b++)
                for (int c = 0; c < sg->bk_width; c++)
                    g->blockkeys[bk_off + b * sg->bk_width + c] =
                        c < kw ? h->k.blockkeys[h->k.off_blockkeys[s] + b * kw + c] : 0;
            rec_off += (int64_t)sg->n_blocks * sg->rec_bytes;
            bk_off += (int64_t)sg->n_blocks * sg->bk_width;
            blocks += sg->n_blocks;
        }
        if (temp_tokens > 0 && h->k.nseg > 0) {
            mkv_packed_seg *sg = &g->segs[seg_row++];
            *sg = g->segs[seg_row - 2];   /* the last segment's strategy and rotations */
            sg->start = open ? h->T - h->recent_n : h->T;
            sg->len = 0;
            sg->n_blocks = (int32_t)mkv_mosaic_nblocks(temp_tokens, B);
            sg->first_block = blocks;
            sg->rec_off = rec_off;
            sg->bk_off = open ? bk_off : -1;
            sg->always = !open;
            sg->open = open;
            rec_off += (int64_t)sg->n_blocks * sg->rec_bytes;
            bk_off += open ? (int64_t)sg->n_blocks * sg->bk_width : 0;
            blocks += sg->n_blocks;
        }
        hd->n_seg = (int32_t)(seg_row - hd->first_seg);
        hd->n_blocks = blocks;
    }
    mkv_packed_layout *l = &g->l;
    l->head_dim = d;
    l->block = B;
    l->n_heads = n;
    l->heads = g->heads;
    l->n_segs = n_segs;
    l->segs = g->segs;
    l->record_bytes = (size_t)rec_bytes;
    l->records = g->records;
    l->n_blockkeys = (size_t)n_bk;
    l->blockkeys = g->blockkeys;
    l->n_rotations = (size_t)n_rot;
    l->rotations = g->rotations;
    l->n_dense_rows = n_dense;
    l->dense_k = g->dense_k;
    l->dense_v = g->dense_v;
    return MKV_OK;
}

uint64_t mkv_gpu_mosaic_bytes(const mkv_mosaic_head *h, int64_t pos, const uint8_t *blocks, int64_t nd)
{
    const int d = h->d, B = h->block;
    uint64_t bytes = (uint64_t)nd * (uint64_t)d * 2 * 2;
    int64_t id = 0;
    for (int64_t s = 0; s < h->k.nseg; s++) {
        const mkv_mosaic_strategy *ks = &h->k.seg[s], *vs = &h->v.seg[s];
        const int64_t nb = mkv_mosaic_nblocks(ks->len, B);
        if (ks->start <= pos) {
            int64_t upto = (pos - ks->start) / B + 1;
            upto = upto < nb ? upto : nb;
            bytes += TABLE_ROW_BYTES + (uint64_t)d * (uint64_t)mkv_mosaic_rotation_cols(ks) * 2;
            bytes += (uint64_t)upto * (uint64_t)(ks->keydim + ks->bound) * 2;
            const uint64_t per_token = (uint64_t)(mkv_mosaic_vector_bytes(ks) + mkv_mosaic_vector_bytes(vs) +
                                                  mkv_mosaic_bitmap_bytes(ks) + mkv_mosaic_bitmap_bytes(vs));
            int any = 0;
            int64_t kgroup = -1, vgroup = -1;
            for (int64_t b = 0; b < upto; b++) {
                if (!blocks[id + b])
                    continue;
                int64_t t0 = ks->start + b * B, t1 = t0 + B;
                t1 = t1 < ks->start + ks->len ? t1 : ks->start + ks->len;
                t1 = t1 < pos + 1 ? t1 : pos + 1;
                bytes += (uint64_t)(t1 - t0) * per_token;
                for (int64_t t = t0; t < t1; t++)
                    bytes += mkv_mosaic_qparams_read(ks, t - ks->start, &kgroup) +
                             mkv_mosaic_qparams_read(vs, t - ks->start, &vgroup);
                any = 1;
            }
            if (any)
                bytes += mkv_mosaic_attended_segment_bytes(vs, d);
        }
        id += nb;
    }
    return bytes;
}
