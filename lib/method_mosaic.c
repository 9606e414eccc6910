/* Method "mosaic": MosaicKV dynamic two-dimensional (sequence x channel)
 * compression, DESIGN.md 5.1 and 5.2. The pieces (and the conventions for
 * rotations, bitmaps and value order) are in lib/mosaic.h; this file puts
 * them together and is where the algorithm is described.
 *
 * COMPRESSION, per layer and KV head, K and V separately:
 *  1. The first `sink` and the last `recent` tokens stay dense (fp16).
 *  2. The tokens between are cut into segments of `segment` tokens (S; the
 *     last one shorter). K and V share the segmentation.
 *  3. Per segment: Gram matrix C = X^T X (double), eigendecomposition,
 *     R = eigenvectors by eigenvalue, largest first, sign fixed (largest
 *     component positive), rounded to fp16. Keys are post-RoPE, so
 *     q.k = (qR).(kR) up to that rounding.
 *  4. Strategy (rotate, r, g, d') of the segment:
 *       fixed:   rotation as `rotate`; r = ceil(keep * d) elements per
 *                vector (the baselines' rule); g = `group`; d' = the fewest
 *                leading rotated channels holding `energy` of the
 *                eigen-energy, at least r, rounded up to a multiple of 8,
 *                at most d (d' = d without rotation);
 *       dynamic: mkv_mosaic_search over rotation {on, off} x r {d/16 ..
 *                d/2} x g {1,2,4} x d' {d/4 .. d}: the fewest stored bytes
 *                whose loss <= `threshold`, else the lowest loss. Loss:
 *                fraction of energy dropped; for keys, when the dump has
 *                queries, the larger of that and the relative score error
 *                on them, weighted towards the tokens they attend
 *                (mkv_mosaic_losses in lib/mosaic.h; at most 64 query
 *                vectors: every query head at up to 64/G positions spread
 *                evenly over the dump's queries).
 *                `rotate=off` leaves out the rotated candidates; `keep`,
 *                `group` and `energy` do not apply.
 *  5. Per vector x~ = x R: keep the r/g groups of g adjacent channels among
 *     the first d' with the largest energy (g = 1: the r largest |x~|);
 *     values fp16 in channel order, bitmap of d'/g bits (none when r = d').
 *  6. Keys: per block of `block` tokens (B, blocks start at the segment
 *     start) the mean rotated key over d' channels, fp16.
 *
 * STORED ARRAYS (group /layers/NN/HH of the compressed dump; X is k or v;
 * flat arrays concatenate the segments in order; a segment's offsets
 * follow from the strategy table, so none are stored; an array with no
 * element is absent):
 *   X/dense      float16 [sink_n + recent_n][d]  tokens 0..sink_n-1 then
 *                T-recent_n..T-1 (sink_n = min(sink, T), recent_n =
 *                min(recent, T - sink_n))
 *   X/strategy   int32 [nseg][7]   start, length, rotate, r, g, d',
 *                pervector (1; 0 only for uniform2d)
 *   X/loss       float32 [nseg][2] energy dropped, score error (-1: none)
 *   X/values     float16 [sum len*r]
 *   X/bitmap     uint8 [sum len*ceil(d'/g/8)]  (segments with r < d')
 *   k/blockkeys  float16 [sum ceil(len/B)*d']
 *   X/rotation   float16 [sum d*d']  (rotated segments; [d][d'] each)
 * Every byte attention needs is one of these, so physical_bytes counts
 * it. At d = 128, keep 0.25, d' = 64, B = 8, S = 2048 one token costs
 * K 64 + 8 + 16, V 64 + 8 bytes, rotations 2*128*64*2/2048 = 16: 176 of
 * 512 dense bytes (2.9x).
 *
 * DEFAULTS: keep 0.25, block 8, budget 0.1, sink 4, recent 64 (the
 * paper's); segment 2048; energy 0.95 makes the fixed strategy about 3.2x
 * at d = 64 and d = 128 on `mkv-capture --synthetic` dumps of 8K tokens;
 * threshold 0.1 (at most a tenth of the energy, or of the score spread, per
 * segment) gives about 2.5x there when the dump has queries, since the
 * synthetic keys' salient parts are spread over many channels.
 *
 * ATTENTION for the G query heads of a KV head at position p (tokens
 * 0..p), the semantics the GPU kernels copy:
 *  1. Budget k = mkv_budget_tokens(budget, p + 1) tokens. Sink and recent
 *     tokens <= p are always attended and count towards it.
 *  2. For every segment starting <= p: q~_h = q_h R_k (first d'_k
 *     channels) once per head; for every block starting <= p its score
 *     s_b = agg_h (q~_h . kbar_b) * scale, agg = max or sum over the G
 *     heads.
 *  3. Blocks in descending score (ties: the earlier block) are added whole
 *     (tokens > p left out) while the attended count is below k.
 *  4. Scores of attended compressed tokens: q~_h . k~ over the kept
 *     positions only (rebuilt from the bitmap), times scale. Values are
 *     accumulated in the segment's rotated V space by an online softmax per
 *     segment and head (unnormalised: max m_s, sum l_s, acc_s); acc_s is
 *     rotated back once, acc_s R_v^T, and merged into the head's state with
 *     the dense tokens (attended exactly, original space) by the
 *     flash-decoding rule: m = max m_s, l = sum l_s e^(m_s - m), acc = sum
 *     acc_s e^(m_s - m); out = acc / l. Accumulation is in double.
 *  5. Bytes read: both tables' rows of segments starting <= p, their R_k
 *     and block keys (blocks starting <= p), R_v of segments with attended
 *     tokens, values and bitmaps (K and V) of attended compressed tokens,
 *     dense K and V of attended sink/recent tokens. */
#include "config.h"
#include "mosaic.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_util.h"
#include "baseline_util.h"
#include "half.h"
#include "tensor.h"

/* Query vectors the dynamic search measures the score error on. */
#define OBS_MAX 64

static const mkv_param_spec mosaic_params[] = {
    {"sink", MKV_PARAM_INT, "4", 0, 1e9, NULL, "tokens kept dense at the start (attention sinks)"},
    {"recent", MKV_PARAM_INT, "64", 0, 1e9, NULL, "most recent tokens kept dense"},
    {"segment", MKV_PARAM_INT, "2048", 1, 1e9, NULL,
     "tokens per segment S (one rotation and one strategy each)"},
    {"block", MKV_PARAM_INT, "8", 1, 1e6, NULL, "tokens per block key B (the selection unit)"},
    {"keep", MKV_PARAM_DOUBLE, "0.25", 0, 1, NULL,
     "fixed: fraction of head_dim kept per vector, r = ceil(keep x head_dim) elements"},
    {"group", MKV_PARAM_INT, "1", 1, 4, NULL,
     "fixed: channels per selection group g (1, 2 or 4 adjacent rotated channels)"},
    {"energy", MKV_PARAM_DOUBLE, "0.95", 0, 1, NULL,
     "fixed: fraction of eigen-energy the d' kept rotated channels hold"},
    {"rotate", MKV_PARAM_STRING, "on", 0, 0, "on off",
     "per-segment SVD rotation (dynamic: allowed where it pays; off: never)"},
    {"strategy", MKV_PARAM_STRING, "dynamic", 0, 0, "fixed dynamic",
     "per-segment strategy: fixed (keep, group, energy) or dynamic (cheapest under threshold)"},
    {"threshold", MKV_PARAM_DOUBLE, "0.1", 0, 1, NULL,
     "dynamic: largest loss allowed (fraction of energy dropped; relative score error)"},
    {"budget", MKV_PARAM_DOUBLE, "0.1", 0, 1e15, NULL,
     "tokens attended per step: fraction (<= 1) of the context or a count (> 1)"},
    {"agg", MKV_PARAM_STRING, "max", 0, 0, "max sum", "block score over the G query heads: max or sum"},
    {NULL, 0, NULL, 0, 0, NULL, NULL},
};

/* ---------------------------------------------------------------- parameters */

int mkv_mosaic_kept(double keep, int d)
{
    int r = (int)ceil(keep * d - 1e-9);
    return r < 1 ? 1 : r > d ? d : r;
}

int mkv_mosaic_check_common(const mkv_params *p, const mkv_dump_meta *m, mkv_error *err)
{
    int d = m->head_dim;
    int64_t block = mkv_params_int(p, "block"), segment = mkv_params_int(p, "segment");
    int rc;
    if (d < 1 || d > MKV_MOSAIC_MAX_D)
        return mkv_fail(err, MKV_EUSAGE, "head_dim %d is out of range for mosaic (1..%d)", d,
                        MKV_MOSAIC_MAX_D);
    if ((rc = mkv_bl_check_min("sink", mkv_params_int(p, "sink"), 0, err)) ||
        (rc = mkv_bl_check_min("recent", mkv_params_int(p, "recent"), 0, err)) ||
        (rc = mkv_bl_check_min("block", block, 1, err)) ||
        (rc = mkv_bl_check_min("segment", segment, 1, err)) ||
        (rc = mkv_bl_check_fraction("keep", mkv_params_double(p, "keep"), err)) ||
        (rc = mkv_bl_check_fraction("energy", mkv_params_double(p, "energy"), err)) ||
        (rc = mkv_bl_check_budget("budget", mkv_params_double(p, "budget"), m->n_tokens, err)))
        return rc;
    if (segment < block)
        return mkv_fail(err, MKV_EUSAGE, "segment=%lld tokens is smaller than block=%lld tokens: a "
                        "segment holds whole blocks", (long long)segment, (long long)block);
    return MKV_OK;
}

static int mosaic_check(const mkv_params *p, const mkv_dump_meta *m, mkv_error *err)
{
    int rc = mkv_mosaic_check_common(p, m, err);
    if (rc != MKV_OK)
        return rc;
    int d = m->head_dim;
    int64_t g = mkv_params_int(p, "group");
    double keep = mkv_params_double(p, "keep"), threshold = mkv_params_double(p, "threshold");
    if (g != 1 && g != 2 && g != 4)
        return mkv_fail(err, MKV_EUSAGE, "group=%lld is out of range: 1, 2 or 4 channels", (long long)g);
    if (!(threshold >= 0 && threshold <= 1))
        return mkv_fail(err, MKV_EUSAGE, "threshold=%g is out of range: a loss in [0, 1] is required",
                        threshold);
    if (strcmp(mkv_params_str(p, "strategy"), "fixed") != 0)
        return MKV_OK;
    int r = mkv_mosaic_kept(keep, d);
    if (r % g)
        return mkv_fail(err, MKV_EUSAGE, "group=%lld does not divide r = %d elements kept per vector "
                        "(keep=%g of head_dim %d)", (long long)g, r, keep, d);
    /* d' is a multiple of 8 or d itself */
    if (d % g)
        return mkv_fail(err, MKV_EUSAGE, "group=%lld does not divide head_dim %d, which d' may reach",
                        (long long)g, d);
    return MKV_OK;
}

static void config_from(const mkv_params *p, int d, mkv_mosaic_config *c)
{
    memset(c, 0, sizeof *c);
    c->sink = mkv_params_int(p, "sink");
    c->recent = mkv_params_int(p, "recent");
    c->segment = mkv_params_int(p, "segment");
    c->block = (int)mkv_params_int(p, "block");
    c->dynamic = strcmp(mkv_params_str(p, "strategy"), "dynamic") == 0;
    c->rotate = strcmp(mkv_params_str(p, "rotate"), "on") == 0;
    c->r = mkv_mosaic_kept(mkv_params_double(p, "keep"), d);
    c->g = (int)mkv_params_int(p, "group");
    c->energy = mkv_params_double(p, "energy");
    c->threshold = mkv_params_double(p, "threshold");
    c->pervector = 1;
}

/* ---------------------------------------------------------------- compression */

/* A growing flat array of one element type. */
typedef struct {
    void *p;
    int64_t n, cap;
    size_t elem;
} flat;

/* Room for `more` (>= 0) elements at the end of f; returns their address
 * (never NULL on success, even for none). */
static void *flat_extend(flat *f, int64_t more, const char *what, mkv_error *err)
{
    if (!f->p || f->n + more > f->cap) {
        int64_t cap = f->cap ? f->cap : 1024;
        while (cap < f->n + more)
            cap *= 2;
        void *p = mkv_alloc((size_t)cap, f->elem, what, err);
        if (!p)
            return NULL;
        if (f->n)
            memcpy(p, f->p, (size_t)f->n * f->elem);
        mkv_free(f->p);
        f->p = p;
        f->cap = cap;
    }
    void *at = (char *)f->p + (size_t)f->n * f->elem;
    f->n += more;
    return at;
}

/* Observation queries: every head at up to OBS_MAX / G positions spread
 * evenly over the dump's W queries (first and last included). */
static int pick_obs(const mkv_head_kv *in, float **q, int64_t **pos, int64_t *nq, mkv_error *err)
{
    *q = NULL;
    *pos = NULL;
    *nq = 0;
    if (in->W <= 0 || !in->q)
        return MKV_OK;
    int64_t nw = OBS_MAX / in->G;
    if (nw < 1)
        nw = 1;
    if (nw > in->W)
        nw = in->W;
    int64_t n = nw * in->G;
    *q = mkv_alloc((size_t)n * (size_t)in->d, sizeof **q, "observation queries", err);
    *pos = *q ? mkv_alloc((size_t)n, sizeof **pos, "observation query positions", err) : NULL;
    if (!*pos) {
        mkv_free(*q);
        *q = NULL;
        return err ? err->code : MKV_ENOMEM;
    }
    for (int64_t i = 0; i < nw; i++) {
        int64_t w = nw == 1 ? in->W - 1 : (i * (in->W - 1) + (nw - 1) / 2) / (nw - 1);
        for (int h = 0; h < in->G; h++) {
            int64_t j = i * in->G + h;
            memcpy(*q + j * in->d, in->q + ((size_t)h * (size_t)in->W + (size_t)w) * (size_t)in->d,
                   sizeof(float) * (size_t)in->d);
            (*pos)[j] = in->query_pos[w];
        }
    }
    *nq = n;
    return MKV_OK;
}

/* The fixed strategy of one segment (evals: the segment's eigenvalues). */
static void fixed_strategy(const mkv_mosaic_config *c, int d, int is_key, const double *evals,
                           mkv_mosaic_strategy *s)
{
    s->rotate = c->rotate;
    s->r = c->r;
    s->g = c->pervector ? c->g : 1;
    s->pervector = c->pervector;
    if (!c->rotate)
        s->dprime = d;
    else if (!c->pervector && !is_key)
        s->dprime = c->r;   /* uniform2d values: the first r rotated channels, nothing more */
    else
        s->dprime = mkv_mosaic_dprime_for_energy(evals, d, c->energy, c->r);
}

static int compress_tensor(const mkv_mosaic_config *c, const mkv_mosaic_head *h, const float *data,
                           int is_key, const mkv_mosaic_obs *obs, mkv_mosaic_tensor *t, mkv_error *err)
{
    int d = h->d, block = is_key ? h->block : 0;
    int64_t first = h->sink_n, last = h->T - h->recent_n;
    int64_t nseg = last > first ? (last - first + c->segment - 1) / c->segment : 0;
    flat values = {.elem = sizeof(float)}, bitmap = {.elem = 1}, keys = {.elem = sizeof(float)},
         rot = {.elem = sizeof(float)};
    double *R = mkv_alloc((size_t)d * (size_t)d, sizeof *R, "a rotation", err);
    double *evals = R ? mkv_alloc((size_t)d, sizeof *evals, "eigenvalues", err) : NULL;
    t->nseg = nseg;
    t->seg = evals ? mkv_calloc((size_t)(nseg ? nseg : 1), sizeof *t->seg, "strategies", err) : NULL;
    t->loss = t->seg ? mkv_calloc((size_t)(nseg ? nseg : 1) * MKV_MOSAIC_LOSS_COLS, sizeof *t->loss,
                                  "losses", err) : NULL;
    int rc = t->loss ? MKV_OK : (err ? err->code : MKV_ENOMEM);
    for (int64_t i = 0; i < nseg && rc == MKV_OK; i++) {
        int64_t start = first + i * c->segment;
        int64_t len = last - start < c->segment ? last - start : c->segment;
        const float *X = data + start * d;
        mkv_mosaic_strategy *s = &t->seg[i];
        double energy = 0, score = -1;
        if (c->rotate) {
            rc = mkv_mosaic_rotation(X, len, d, R, evals, err);
            if (rc != MKV_OK)
                break;
            /* the file stores fp16: every use below sees the stored matrix */
            mkv_mosaic_round_f16(R, (size_t)d * (size_t)d);
        }
        if (c->dynamic) {
            mkv_mosaic_search_opts o = {.d = d, .block = block, .threshold = c->threshold,
                                        .allow_rotate = c->rotate, .obs = obs};
            rc = mkv_mosaic_search(&o, X, start, len, R, s, &energy, &score, err);
        } else {
            *s = (mkv_mosaic_strategy){.start = start, .len = len};
            fixed_strategy(c, d, is_key, evals, s);
            rc = mkv_mosaic_losses(s, X, d, R, obs, &energy, &score, err);
        }
        if (rc != MKV_OK)
            break;
        t->loss[i * 2] = (float)energy;
        t->loss[i * 2 + 1] = (float)score;
        mkv_mosaic_bytes b;
        mkv_mosaic_strategy_bytes(s, d, block, &b);
        float *pv, *pk, *pr;
        uint8_t *pb;
        if (!(pv = flat_extend(&values, (int64_t)b.values / 2, "packed values", err)) ||
            !(pb = flat_extend(&bitmap, (int64_t)b.bitmap, "bitmaps", err)) ||
            !(pk = flat_extend(&keys, (int64_t)b.blockkeys / 2, "block keys", err)) ||
            !(pr = flat_extend(&rot, (int64_t)b.rotation / 2, "rotations", err))) {
            rc = err ? err->code : MKV_ENOMEM;
            break;
        }
        rc = mkv_mosaic_encode(s, X, d, R, block, pv, b.bitmap ? pb : NULL, pk, pr, err);
    }
    mkv_free(R);
    mkv_free(evals);
    t->values = values.p;
    t->bitmap = bitmap.p;
    t->blockkeys = keys.p;
    t->rotation = rot.p;
    if (rc == MKV_OK)
        rc = mkv_mosaic_layout(t, d, block, first, last, err);
    return rc;
}

int mkv_mosaic_compress(const mkv_mosaic_config *c, const mkv_head_kv *in, mkv_mosaic_head *h,
                        mkv_error *err)
{
    memset(h, 0, sizeof *h);
    int d = in->d;
    if (d < 1 || d > MKV_MOSAIC_MAX_D || in->T < 1 || in->G < 1)
        return mkv_fail(err, MKV_EUSAGE, "mosaic: cannot compress %lld tokens of head_dim %d",
                        (long long)in->T, d);
    if (in->T > INT32_MAX)
        return mkv_fail(err, MKV_EUNSUP, "mosaic: %lld tokens do not fit the int32 strategy table",
                        (long long)in->T);
    int rc;
    size_t n = (size_t)in->T * (size_t)d;
    if ((rc = mkv_bl_check_f16_range(in->k, n, "key", in->layer, in->head, err)) ||
        (rc = mkv_bl_check_f16_range(in->v, n, "value", in->layer, in->head, err)))
        return rc;
    h->d = d;
    h->G = in->G;
    h->block = c->block;
    h->T = in->T;
    h->sink_n = c->sink < in->T ? c->sink : in->T;
    h->recent_n = c->recent < in->T - h->sink_n ? c->recent : in->T - h->sink_n;
    int64_t nd = h->sink_n + h->recent_n;
    h->dense_k = mkv_alloc((size_t)(nd ? nd : 1) * (size_t)d, sizeof(float), "dense keys", err);
    h->dense_v = h->dense_k ? mkv_alloc((size_t)(nd ? nd : 1) * (size_t)d, sizeof(float),
                                        "dense values", err) : NULL;
    if (!h->dense_v) {
        mkv_mosaic_head_free(h);
        return err ? err->code : MKV_ENOMEM;
    }
    for (int64_t i = 0; i < nd; i++) {
        int64_t t = i < h->sink_n ? i : in->T - h->recent_n + (i - h->sink_n);
        for (int j = 0; j < d; j++) {
            h->dense_k[i * d + j] = mkv_f16_to_f32(mkv_f32_to_f16(in->k[t * d + j]));
            h->dense_v[i * d + j] = mkv_f16_to_f32(mkv_f32_to_f16(in->v[t * d + j]));
        }
    }
    float *oq = NULL;
    int64_t *opos = NULL, nq = 0;
    rc = pick_obs(in, &oq, &opos, &nq, err);
    mkv_mosaic_obs obs = {.q = oq, .pos = opos, .nq = nq};
    if (rc == MKV_OK)
        rc = compress_tensor(c, h, in->k, 1, nq ? &obs : NULL, &h->k, err);
    if (rc == MKV_OK)
        rc = compress_tensor(c, h, in->v, 0, NULL, &h->v, err);
    mkv_free(oq);
    mkv_free(opos);
    if (rc != MKV_OK) {
        mkv_error_prefix(err, "layer %d, KV head %d", in->layer, in->head);
        mkv_mosaic_head_free(h);
    }
    return rc;
}

/* ---------------------------------------------------------------- storage */

static int put_flat(mkv_cdump_writer *w, int layer, int head, const char *name, mkv_el_type type,
                    int64_t n, const void *data, mkv_error *err)
{
    if (n == 0)
        return MKV_OK;
    return mkv_cdump_put(w, layer, head, name, type, 1, &n, data, err);
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
                                                  s->g, s->dprime, s->pervector};
            memcpy(table + i * MKV_MOSAIC_TABLE_COLS, row, sizeof row);
        }
        snprintf(name, sizeof name, "%c/strategy", x);
        rc = mkv_bl_put2(w, layer, head, name, MKV_EL_I32, t->nseg, MKV_MOSAIC_TABLE_COLS, table, err);
        mkv_free(table);
        snprintf(name, sizeof name, "%c/loss", x);
        if (rc == MKV_OK)
            rc = mkv_bl_put2(w, layer, head, name, MKV_EL_F32, t->nseg, MKV_MOSAIC_LOSS_COLS, t->loss,
                             err);
    }
    snprintf(name, sizeof name, "%c/dense", x);
    if (rc == MKV_OK)
        rc = mkv_bl_put2(w, layer, head, name, MKV_EL_F16, h->sink_n + h->recent_n, h->d,
                         x == 'k' ? h->dense_k : h->dense_v, err);
    snprintf(name, sizeof name, "%c/values", x);
    if (rc == MKV_OK)
        rc = put_flat(w, layer, head, name, MKV_EL_F16, t->n_values, t->values, err);
    snprintf(name, sizeof name, "%c/bitmap", x);
    if (rc == MKV_OK)
        rc = put_flat(w, layer, head, name, MKV_EL_U8, t->n_bitmap, t->bitmap, err);
    snprintf(name, sizeof name, "%c/blockkeys", x);
    if (rc == MKV_OK)
        rc = put_flat(w, layer, head, name, MKV_EL_F16, t->n_blockkeys, t->blockkeys, err);
    snprintf(name, sizeof name, "%c/rotation", x);
    if (rc == MKV_OK)
        rc = put_flat(w, layer, head, name, MKV_EL_F16, t->n_rotation, t->rotation, err);
    return rc;
}

int mkv_mosaic_store(const mkv_mosaic_head *h, mkv_cdump_writer *w, int layer, int head, mkv_error *err)
{
    int rc = store_tensor(&h->k, h, 'k', w, layer, head, err);
    return rc ? rc : store_tensor(&h->v, h, 'v', w, layer, head, err);
}

/* Read a flat array of n elements (absent when n = 0). */
static int get_flat(mkv_cdump *c, int layer, int head, const char *name, mkv_el_type type, int64_t n,
                    void **out, mkv_error *err)
{
    *out = NULL;
    if (n == 0) {
        if (mkv_bl_has(c, layer, head, name))
            return mkv_fail(err, MKV_EFORMAT, "layer %d, KV head %d: '%s' should be absent "
                            "(the strategy table gives it no element)", layer, head, name);
        return MKV_OK;
    }
    return mkv_bl_get(c, layer, head, name, type, 1, &n, out, err);
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
    if (rank && (rank != 2 || dims[1] != MKV_MOSAIC_TABLE_COLS || dims[0] < 1))
        return mkv_fail(err, MKV_EFORMAT, "layer %d, KV head %d: '%s' is not an [nseg][%d] table",
                        layer, head, name, MKV_MOSAIC_TABLE_COLS);
    t->seg = mkv_calloc((size_t)(t->nseg ? t->nseg : 1), sizeof *t->seg, "strategies", err);
    if (!t->seg)
        return err ? err->code : MKV_ENOMEM;
    if (t->nseg > 0) {
        int32_t *table = NULL;
        int64_t tdims[2] = {t->nseg, MKV_MOSAIC_TABLE_COLS}, ldims[2] = {t->nseg, MKV_MOSAIC_LOSS_COLS};
        rc = mkv_bl_get(c, layer, head, name, MKV_EL_I32, 2, tdims, (void **)&table, err);
        if (rc != MKV_OK)
            return rc;
        for (int64_t i = 0; i < t->nseg; i++) {
            const int32_t *row = table + i * MKV_MOSAIC_TABLE_COLS;
            t->seg[i] = (mkv_mosaic_strategy){.start = row[0], .len = row[1], .rotate = row[2],
                                              .r = row[3], .g = row[4], .dprime = row[5],
                                              .pervector = row[6]};
        }
        mkv_free(table);
        snprintf(name, sizeof name, "%c/loss", x);
        rc = mkv_bl_get(c, layer, head, name, MKV_EL_F32, 2, ldims, (void **)&t->loss, err);
    } else if (last > first) {
        return mkv_fail(err, MKV_EFORMAT, "layer %d, KV head %d: '%s' is missing", layer, head, name);
    }
    if (rc == MKV_OK && (rc = mkv_mosaic_layout(t, h->d, block, first, last, err)) != MKV_OK)
        mkv_error_prefix(err, "layer %d, KV head %d: %c", layer, head, x);
    snprintf(name, sizeof name, "%c/values", x);
    if (rc == MKV_OK)
        rc = get_flat(c, layer, head, name, MKV_EL_F16, t->n_values, (void **)&t->values, err);
    snprintf(name, sizeof name, "%c/bitmap", x);
    if (rc == MKV_OK)
        rc = get_flat(c, layer, head, name, MKV_EL_U8, t->n_bitmap, (void **)&t->bitmap, err);
    snprintf(name, sizeof name, "%c/blockkeys", x);
    if (rc == MKV_OK)
        rc = get_flat(c, layer, head, name, MKV_EL_F16, t->n_blockkeys, (void **)&t->blockkeys, err);
    snprintf(name, sizeof name, "%c/rotation", x);
    if (rc == MKV_OK)
        rc = get_flat(c, layer, head, name, MKV_EL_F16, t->n_rotation, (void **)&t->rotation, err);
    int64_t nd = h->sink_n + h->recent_n, ddims[2] = {nd, h->d};
    float **dense = x == 'k' ? &h->dense_k : &h->dense_v;
    snprintf(name, sizeof name, "%c/dense", x);
    if (rc == MKV_OK && nd > 0)
        rc = mkv_bl_get(c, layer, head, name, MKV_EL_F16, 2, ddims, (void **)dense, err);
    return rc;
}

int mkv_mosaic_load(mkv_cdump *c, int layer, int head, int block, int64_t sink, int64_t recent,
                    mkv_mosaic_head *h, mkv_error *err)
{
    memset(h, 0, sizeof *h);
    mkv_bl_shape(c, &h->T, &h->d, &h->G);
    h->block = block;
    h->sink_n = sink < h->T ? sink : h->T;
    h->recent_n = recent < h->T - h->sink_n ? recent : h->T - h->sink_n;
    int rc = MKV_OK;
    if (h->d < 1 || h->d > MKV_MOSAIC_MAX_D)
        rc = mkv_fail(err, MKV_EFORMAT, "head_dim %d is out of range for mosaic", h->d);
    if (rc == MKV_OK)
        rc = load_tensor(c, layer, head, 'k', h, &h->k, err);
    if (rc == MKV_OK)
        rc = load_tensor(c, layer, head, 'v', h, &h->v, err);
    if (rc == MKV_OK && h->k.nseg != h->v.nseg)
        rc = mkv_fail(err, MKV_EFORMAT, "layer %d, KV head %d: keys have %lld segments, values %lld",
                      layer, head, (long long)h->k.nseg, (long long)h->v.nseg);
    for (int64_t i = 0; rc == MKV_OK && i < h->k.nseg; i++)
        if (h->k.seg[i].start != h->v.seg[i].start || h->k.seg[i].len != h->v.seg[i].len)
            rc = mkv_fail(err, MKV_EFORMAT, "layer %d, KV head %d: segment %lld differs between "
                          "keys and values", layer, head, (long long)i);
    if (rc != MKV_OK)
        mkv_mosaic_head_free(h);
    return rc;
}

/* ---------------------------------------------------------------- attention */

/* A scored block: segment, block within it, aggregated score. */
typedef struct {
    double score;
    int64_t seg, block, order;
} scored_block;

static int by_score(const void *a, const void *b)
{
    const scored_block *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return (x->order > y->order) - (x->order < y->order);
}

static int by_order(const void *a, const void *b)
{
    const scored_block *x = a, *y = b;
    return (x->order > y->order) - (x->order < y->order);
}

/* Working memory of one attention step. */
typedef struct {
    double *qt;           /* [nsc][G][d] rotated queries */
    scored_block *blk;    /* [nblk] */
    mkv_osm *tot, *seg;   /* [G] per head: all tokens (original space), one segment (rotated) */
    double *acc;          /* [G][d] accumulators of tot */
    double *sacc;         /* [G][d] accumulators of seg */
    double *back;         /* [d] one segment's accumulator rotated back */
} attend_work;

static void work_free(attend_work *w)
{
    mkv_free(w->qt);
    mkv_free(w->blk);
    mkv_free(w->tot);
    mkv_free(w->seg);
    mkv_free(w->acc);
    mkv_free(w->sacc);
    mkv_free(w->back);
}

static int work_alloc(attend_work *w, int64_t nsc, int64_t nblk, int G, int d, mkv_error *err)
{
    memset(w, 0, sizeof *w);
    size_t gd = (size_t)G * (size_t)d;
    if (!(w->qt = mkv_alloc((size_t)(nsc ? nsc : 1) * gd, sizeof *w->qt, "rotated queries", err)) ||
        !(w->blk = mkv_alloc((size_t)(nblk ? nblk : 1), sizeof *w->blk, "block scores", err)) ||
        !(w->tot = mkv_alloc((size_t)G, sizeof *w->tot, "softmax states", err)) ||
        !(w->seg = mkv_alloc((size_t)G, sizeof *w->seg, "softmax states", err)) ||
        !(w->acc = mkv_alloc(gd, sizeof *w->acc, "accumulators", err)) ||
        !(w->sacc = mkv_alloc(gd, sizeof *w->sacc, "accumulators", err)) ||
        !(w->back = mkv_alloc((size_t)d, sizeof *w->back, "accumulators", err))) {
        work_free(w);
        return err ? err->code : MKV_ENOMEM;
    }
    return MKV_OK;
}

/* Token held by row i of the dense arrays (sink rows, then recent rows). */
static int64_t dense_token(const mkv_mosaic_head *h, int64_t i)
{
    return i < h->sink_n ? i : h->T - h->recent_n + (i - h->sink_n);
}

/* Last token (exclusive) of block b of segment s, cut at p + 1. */
static int64_t block_end(const mkv_mosaic_strategy *s, int64_t b, int B, int64_t p)
{
    int64_t t1 = s->start + (b + 1) * B;
    if (t1 > s->start + s->len)
        t1 = s->start + s->len;
    return t1 < p + 1 ? t1 : p + 1;
}

/* Attend the compressed tokens of one segment's selected blocks blk[0..n)
 * (in token order) and merge into the heads' states w->tot. */
static void attend_segment(const mkv_mosaic_head *h, int64_t si, const double *qt,
                           const scored_block *blk, int64_t n, const mkv_attend_query *q,
                           attend_work *w, mkv_attend_result *res)
{
    const mkv_mosaic_strategy *ks = &h->k.seg[si], *vs = &h->v.seg[si];
    int d = h->d, G = q->G, kbb = mkv_mosaic_bitmap_bytes(ks), vbb = mkv_mosaic_bitmap_bytes(vs);
    for (int g = 0; g < G; g++)
        mkv_osm_init(&w->seg[g], w->sacc + (size_t)g * d, d);
    int kpos[MKV_MOSAIC_MAX_D], vpos[MKV_MOSAIC_MAX_D];
    for (int64_t b = 0; b < n; b++) {
        int64_t t1 = block_end(ks, blk[b].block, h->block, q->pos);
        for (int64_t t = ks->start + blk[b].block * h->block; t < t1; t++) {
            int64_t i = t - ks->start;
            const float *kv = h->k.values + h->k.off_values[si] + i * ks->r;
            const float *vv = h->v.values + h->v.off_values[si] + i * vs->r;
            mkv_mosaic_positions(kbb ? h->k.bitmap + h->k.off_bitmap[si] + i * kbb : NULL, ks, kpos);
            mkv_mosaic_positions(vbb ? h->v.bitmap + h->v.off_bitmap[si] + i * vbb : NULL, vs, vpos);
            for (int g = 0; g < G; g++) {
                const double *qg = qt + (size_t)g * d;
                double dot = 0;
                for (int j = 0; j < ks->r; j++)
                    dot += qg[kpos[j]] * kv[j];
                mkv_osm_add_sparse(&w->seg[g], dot * q->scale, vv, vpos, vs->r);
            }
            res->attended[t] = 1;
            res->bytes_read += (uint64_t)(ks->r + vs->r) * 2 + (uint64_t)(kbb + vbb);
        }
    }
    const float *Rv = vs->rotate ? h->v.rotation + h->v.off_rotation[si] : NULL;
    if (Rv)
        res->bytes_read += (uint64_t)d * (uint64_t)vs->dprime * 2;
    for (int g = 0; g < G; g++) {
        /* o = o~ R_v^T once per segment: linear, so valid unnormalised */
        const double *a = w->seg[g].acc;
        for (int j = 0; j < d; j++) {
            double s = 0;
            if (Rv)
                for (int c = 0; c < vs->dprime; c++)
                    s += a[c] * Rv[(size_t)j * vs->dprime + c];
            else
                s = a[j];
            w->back[j] = s;
        }
        mkv_osm back = w->seg[g];
        back.acc = w->back;
        mkv_osm_merge(&w->tot[g], &back);
    }
}

/* q~ [G][d'] = q R_k for segment si (R_k = identity when not rotated), and
 * the aggregated scores of its blocks starting <= p appended to w->blk. */
static void score_segment(const mkv_mosaic_head *h, int64_t si, const mkv_attend_query *q, int agg_sum,
                          attend_work *w, int64_t *nblk, mkv_attend_result *res)
{
    const mkv_mosaic_tensor *K = &h->k;
    const mkv_mosaic_strategy *ks = &K->seg[si];
    int d = h->d, G = q->G, dp = ks->dprime, B = h->block;
    double *qt = w->qt + (size_t)si * G * d;
    const float *Rk = ks->rotate ? K->rotation + K->off_rotation[si] : NULL;
    for (int g = 0; g < G; g++) {
        const float *qg = q->q + (size_t)g * d;
        for (int c = 0; c < dp; c++) {
            double s = 0;
            if (Rk)
                for (int j = 0; j < d; j++)
                    s += (double)qg[j] * Rk[(size_t)j * dp + c];
            else
                s = qg[c];
            qt[(size_t)g * d + c] = s;
        }
    }
    res->bytes_read += 2 * MKV_MOSAIC_TABLE_COLS * 4 + (Rk ? (uint64_t)d * dp * 2 : 0);
    int64_t nb = mkv_mosaic_nblocks(ks->len, B), upto = (q->pos - ks->start) / B + 1;
    if (upto > nb)
        upto = nb;
    for (int64_t b = 0; b < upto; b++) {
        const float *kb = K->blockkeys + K->off_blockkeys[si] + b * dp;
        double agg = 0;
        for (int g = 0; g < G; g++) {
            double s = 0;
            for (int c = 0; c < dp; c++)
                s += qt[(size_t)g * d + c] * kb[c];
            s *= q->scale;
            agg = g == 0 ? s : agg_sum ? agg + s : s > agg ? s : agg;
        }
        w->blk[*nblk] = (scored_block){.score = agg, .seg = si, .block = b, .order = *nblk};
        (*nblk)++;
    }
    res->bytes_read += (uint64_t)upto * (uint64_t)dp * 2;
}

int mkv_mosaic_attend(const mkv_mosaic_head *h, const mkv_mosaic_attn_opts *o,
                      const mkv_attend_query *q, mkv_attend_result *res, mkv_error *err)
{
    int rc = mkv_bl_check_query(q, h->T, h->d, h->G, err);
    if (rc != MKV_OK)
        return rc;
    int d = h->d, G = q->G, B = h->block;
    int64_t p = q->pos, budget = mkv_budget_tokens(o->budget, p + 1), count = 0;
    const mkv_mosaic_tensor *K = &h->k;
    res->bytes_read = 0;

    /* segments that start <= p, and their blocks that start <= p */
    int64_t nsc = 0, nblk = 0;
    for (; nsc < K->nseg && K->seg[nsc].start <= p; nsc++) {
        int64_t nb = mkv_mosaic_nblocks(K->seg[nsc].len, B), upto = (p - K->seg[nsc].start) / B + 1;
        nblk += upto < nb ? upto : nb;
    }
    attend_work w;
    if ((rc = work_alloc(&w, nsc, nblk, G, d, err)) != MKV_OK)
        return rc;
    for (int g = 0; g < G; g++)
        mkv_osm_init(&w.tot[g], w.acc + (size_t)g * d, d);

    /* dense sink and recent tokens: always, exactly */
    for (int64_t i = 0; i < h->sink_n + h->recent_n; i++) {
        int64_t t = dense_token(h, i);
        if (t > p)
            continue;
        const float *kd = h->dense_k + i * d, *vd = h->dense_v + i * d;
        for (int g = 0; g < G; g++) {
            double s = 0;
            for (int j = 0; j < d; j++)
                s += (double)q->q[(size_t)g * d + j] * kd[j];
            mkv_osm_add(&w.tot[g], s * q->scale, vd);
        }
        res->attended[t] = 1;
        res->bytes_read += (uint64_t)d * 2 * 2;
        count++;
    }

    /* block scores, then the best blocks while the budget is not reached */
    int64_t nb_all = 0;
    for (int64_t si = 0; si < nsc; si++)
        score_segment(h, si, q, o->agg_sum, &w, &nb_all, res);
    qsort(w.blk, (size_t)nblk, sizeof *w.blk, by_score);
    int64_t nsel = 0;
    while (nsel < nblk && count < budget) {
        const scored_block *b = &w.blk[nsel++];
        const mkv_mosaic_strategy *s = &K->seg[b->seg];
        count += block_end(s, b->block, B, p) - (s->start + b->block * B);
    }
    qsort(w.blk, (size_t)nsel, sizeof *w.blk, by_order);

    /* the selected blocks, segment by segment */
    for (int64_t i = 0; i < nsel;) {
        int64_t j = i, si = w.blk[i].seg;
        while (j < nsel && w.blk[j].seg == si)
            j++;
        attend_segment(h, si, w.qt + (size_t)si * G * d, w.blk + i, j - i, q, &w, res);
        i = j;
    }
    for (int g = 0; g < G; g++)
        mkv_osm_finish(&w.tot[g], res->out + (size_t)g * d);
    work_free(&w);
    return MKV_OK;
}

/* ---------------------------------------------------------------- method hooks */

typedef struct {
    mkv_mosaic_head h;
    mkv_mosaic_attn_opts o;
} mosaic_state;

int mkv_mosaic_method_load(const mkv_params *p, mkv_cdump *c, int layer, int head, void **state,
                           mkv_error *err)
{
    mosaic_state *s = mkv_calloc(1, sizeof *s, "a mosaic state", err);
    if (!s)
        return err ? err->code : MKV_ENOMEM;
    s->o.budget = mkv_params_double(p, "budget");
    s->o.agg_sum = strcmp(mkv_params_str(p, "agg"), "sum") == 0;
    int rc = mkv_mosaic_load(c, layer, head, (int)mkv_params_int(p, "block"), mkv_params_int(p, "sink"),
                             mkv_params_int(p, "recent"), &s->h, err);
    if (rc != MKV_OK) {
        mkv_free(s);
        return rc;
    }
    *state = s;
    return MKV_OK;
}

int mkv_mosaic_method_attend(void *state, const mkv_attend_query *q, mkv_attend_result *r,
                             mkv_error *err)
{
    mosaic_state *s = state;
    return mkv_mosaic_attend(&s->h, &s->o, q, r, err);
}

void mkv_mosaic_method_free(void *state)
{
    mosaic_state *s = state;
    if (!s)
        return;
    mkv_mosaic_head_free(&s->h);
    mkv_free(s);
}

static int mosaic_compress(const mkv_params *p, const mkv_head_kv *in, mkv_cdump_writer *w,
                           mkv_error *err)
{
    mkv_mosaic_config c;
    config_from(p, in->d, &c);
    mkv_mosaic_head h;
    int rc = mkv_mosaic_compress(&c, in, &h, err);
    if (rc != MKV_OK)
        return rc;
    rc = mkv_mosaic_store(&h, w, in->layer, in->head, err);
    mkv_mosaic_head_free(&h);
    return rc;
}

const mkv_method mkv_method_mosaic = {
    .name = "mosaic",
    .summary = "MosaicKV: per-segment rotation and strategy, per-vector top elements, packed",
    .params = mosaic_params,
    .check = mosaic_check,
    .compress = mosaic_compress,
    .load = mkv_mosaic_method_load,
    .attend = mkv_mosaic_method_attend,
    .free_state = mkv_mosaic_method_free,
};
