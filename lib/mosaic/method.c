/* Method "mosaic": MosaicKV dynamic two-dimensional (sequence x channel)
 * compression, docs/DESIGN.md 5.1 and 5.2. The pieces are in lib/mosaic/mosaic.h,
 * the packed format (conventions for rotations, bitmaps, block keys and
 * value order; the stored arrays; store and load) in lib/mosaic/packed.h;
 * this file puts them together and is where the algorithm is described.
 *
 * COMPRESSION, per layer and KV head, K and V separately unless said:
 *  1. The first `sink` and the last `recent` tokens stay dense (fp16).
 *  2. The tokens between are cut into segments of `segment` tokens (S; the
 *     last one shorter). K and V share the segmentation.
 *  3. Per segment: Gram matrix C = X^T X (double), eigendecomposition,
 *     R = eigenvectors by eigenvalue, largest first, sign fixed (largest
 *     component positive), rounded to fp16. Keys are post-RoPE, so
 *     q.k = (qR).(kR) up to that rounding. `rotate=off`: no rotation.
 *  4. Block keys (keys): per block of `block` tokens (B, blocks start at
 *     the segment start) a row over the first kd = ceil(keydim x d)
 *     rotated channels: the first m = `bound` of them as the block's
 *     minimum and maximum, the others as its mean (lib/mosaic/packed.h). An
 *     unrotated segment uses kd = d raw channels and m = 0. With
 *     strategy dynamic or ratio and observation queries, a segment's m is
 *     `bound` or 0, whichever captures more exact attention on them: per
 *     query position seeing the segment, its visible blocks ranked by
 *     the score of step 2 of ATTENTION are taken until they cover the
 *     position's budget fraction of the segment's visible tokens; the
 *     exact softmax mass (within the segment's visible tokens) they hold,
 *     averaged over the G heads and the positions, decides (ties: 0).
 *     With budget 1 (every token attended) no step selects: no block keys
 *     are stored (kd = m = 0) and every segment is attended whole.
 *  5. Strategy (rotate, r, g, d', bits) of each tensor of a segment:
 *       fixed:   rotation as `rotate`; r = ceil(keep x d) elements per
 *                vector (the baselines' rule); g = `group`; d' = the fewest
 *                leading rotated channels holding `energy` of the
 *                eigen-energy, at least r, rounded up to a multiple of 8,
 *                at most d (d' = d without rotation), or with `dprime` > 0
 *                ceil(dprime x d) of them (at least r, a multiple of g);
 *                values in `bits`. The paper's 2-D form: keep 0.25,
 *                dprime 0.5, block 8, budget 0.1, bits 16;
 *       dynamic, ratio: the candidates of mkv_mosaic_candidates (r from
 *                d/32 to d, g 1, 2, 4, d' d/4 .. d; values also unrotated;
 *                keys of a rotated segment stay rotated; fp16 values, and
 *                with `quantize` also 8-, 4- and 2-bit codes, their zeros
 *                and steps over the segment or per `qgroup` tokens; candidates
 *                that another beats on both bytes and energy dropped), each
 *                with its bytes and its loss: with observation queries,
 *                the attention-output error it adds on them
 *                (mkv_mosaic_evaluate: the tokens the attention rule
 *                below selects for each query, this tensor of this
 *                segment packed, everything else exact; relative L2 error
 *                minus the selection's own, averaged over the query
 *                vectors that see the segment); without, the fraction of
 *                energy dropped or lost to quantization. Then
 *         dynamic: per tensor and segment, the fewest bytes whose loss
 *                <= `threshold`, else the lowest loss (the paper's rule;
 *                the ratio follows from the data);
 *         ratio:   over all tensors and segments of the head at once, the
 *                least summed loss within logical/`ratio` physical bytes
 *                once the dense rows and the tables are paid
 *                (mkv_mosaic_allocate; the head lands at or just above
 *                `ratio`).
 *       Observation queries: every query head of the dump at up to 64/G
 *       positions spread evenly over its queries (first and last
 *       included). `rotate=off` leaves out the rotated candidates; `keep`,
 *       `group`, `energy`, `dprime` and `bits` apply to fixed only (given under
 *       another strategy they draw a warning, as do `threshold`, `ratio`
 *       and `quantize`).
 *  6. Per vector x~ = x R: keep the r/g groups of g adjacent channels among
 *     the first d' with the largest energy (g = 1: the r largest |x~|);
 *     values in channel order, fp16 or b-bit codes of a zero and a step
 *     per rotated channel over the segment or a group of `qgroup` tokens
 *     (its minimum and maximum: no value is clamped), bitmap of d'/g bits
 *     (none when r = d').
 *
 * STORED ARRAYS: lib/mosaic/packed.h. Every byte attention needs is one of
 * them, so physical_bytes counts it. At d = 128, keep 0.25, d' = 64,
 * keydim 64, bound 2, B = 8, S = 2048 one token costs K 64 + 8 + 16.5,
 * V 64 + 8 bytes, rotations 2*128*64*2/2048 = 16: 176.5 of 512 dense bytes
 * (2.9x).
 *
 * DEFAULTS: keep 0.25, block 8, budget 0.1, sink 4, recent 64 (the
 * paper's); segment 2048; strategy ratio with ratio 3 (the paper's memory
 * saving, met per head whatever the data); keydim 0.5 and bound 2, the
 * best block keys per byte on real SmolLM2 keys (2029 and 4263-token
 * captures): min/max on the two leading rotated channels lifts the
 * attention recall of the selection from 0.76 to 0.81, and half the
 * channels leave bytes to the values; threshold 0.1 makes the dynamic
 * rule land near 3x on those captures (less on synthetic dumps, whose
 * attention is harder to select); quantize on: on data/sample.h5 with
 * every token attended it halves the mean attention error at 3x (0.211
 * to 0.093) and at 6x (0.400 to 0.214), the candidates being a superset
 * of the fp16 ones (`bits` stays 16 for fixed, the paper's 2-D form).
 *
 * ATTENTION for the G query heads of a KV head at position p (tokens
 * 0..p), the semantics the GPU kernels copy:
 *  1. Budget k = mkv_budget_tokens(budget, p + 1) tokens. Sink and recent
 *     tokens <= p are always attended and count towards it.
 *  2. For every segment starting <= p: q~_h = q_h R_k over its stored
 *     columns, once per head. A segment without block keys is attended
 *     whole (its tokens <= p, counted towards k); for every block of the
 *     others starting <= p its score
 *     s_b = agg_h mkv_mosaic_block_score(q~_h, row_b) * scale, agg = max
 *     or sum over the G heads.
 *  3. Blocks in descending score (ties: the earlier block) are added whole
 *     (tokens > p left out) while the attended count is below k, or with
 *     `refine` f > 1 below min(ceil(f k), p + 1): the candidates.
 *  3b. refine > 1 (two-level selection): every compressed candidate t is
 *     scored with its compressed key, agg_h q~_h . k~_t * scale over the
 *     kept positions (the score step 4 computes); the k - (sink and
 *     recent tokens <= p) best stay (ties: the earlier token), the other
 *     candidates are dropped. The block keys stay the coarse, cheap first
 *     level; the keys themselves decide at token granularity. The
 *     observation queries of COMPRESSION step 5 score with the exact
 *     keys here, the compressed ones being what that step chooses.
 *  4. Scores of attended compressed tokens: q~_h . k~ over the kept
 *     positions only (rebuilt from the bitmap), times scale. Values are
 *     accumulated in the segment's rotated V space by an online softmax per
 *     segment and head (unnormalised: max m_s, sum l_s, acc_s); acc_s is
 *     rotated back once, acc_s R_v^T, and merged into the head's state with
 *     the dense tokens (attended exactly, original space) by the
 *     flash-decoding rule: m = max m_s, l = sum l_s e^(m_s - m), acc = sum
 *     acc_s e^(m_s - m); out = acc / l. Accumulation is in double.
 *  5. Bytes read: per segment starting <= p its rows of both strategy
 *     tables and of k/blockdims, its R_k and the block keys of its blocks
 *     starting <= p; R_v of segments with attended tokens, the zeros and
 *     steps (K and V) of token groups with attended tokens; values or
 *     codes and bitmaps (K and V) of attended compressed tokens; dense K
 *     and V of attended sink/recent tokens. With step 3b the keys (codes
 *     or values, bitmap, zeros and steps of their groups) of every
 *     candidate instead, read once, and V of the attended as before. */
#include "config.h"
#include "mosaic/mosaic.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/attn.h"
#include "core/log.h"
#include "methods/baseline.h"
#include "core/half.h"
#include "core/tensor.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
/* libgcc reads the CPU's features once, in a constructor. */
static int have_avx2(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c"); }
#endif

/* Query vectors the dynamic search measures losses on. */
#define OBS_MAX 64

static const mkv_param_spec mosaic_params[] = {
    {"sink", MKV_PARAM_INT, "4", 0, 1e9, NULL, "tokens kept dense at the start (attention sinks)"},
    {"recent", MKV_PARAM_INT, "64", 0, 1e9, NULL, "most recent tokens kept dense"},
    {"segment", MKV_PARAM_INT, "2048", 1, 1e9, NULL,
     "tokens per segment S (one rotation and one strategy each)"},
    {"block", MKV_PARAM_INT, "8", 1, 1e6, NULL, "tokens per block key B (the selection unit)"},
    {"keydim", MKV_PARAM_DOUBLE, "0.5", 0, 1, NULL,
     "fraction of head_dim the block keys span: the first ceil(keydim x head_dim) rotated channels", MKV_PARAM_ABOVE_MIN},
    {"bound", MKV_PARAM_INT, "2", 0, 1024, NULL,
     "leading block-key channels stored as min and max (a bound on q.k) instead of the mean"},
    {"keep", MKV_PARAM_DOUBLE, "0.25", 0, 1, NULL,
     "fixed: fraction of head_dim kept per vector, r = ceil(keep x head_dim) elements", MKV_PARAM_ABOVE_MIN},
    {"group", MKV_PARAM_INT, "1", 1, 4, "1 2 4",
     "fixed: channels per selection group g (adjacent rotated channels)"},
    {"energy", MKV_PARAM_DOUBLE, "0.95", 0, 1, NULL,
     "fixed: fraction of eigen-energy the d' kept rotated channels hold", MKV_PARAM_ABOVE_MIN},
    {"dprime", MKV_PARAM_DOUBLE, "0", 0, 1, NULL,
     "fixed: d' as a fraction of head_dim, ceil(dprime x head_dim) rotated channels (at least r, a multiple "
     "of the group) instead of by energy; 0: by energy"},
    {"bits", MKV_PARAM_INT, "16", 2, 16, "2 4 8 16",
     "fixed: bits per kept value (16: float16; 8, 4, 2: codes with a zero and step per rotated channel)"},
    {"quantize", MKV_PARAM_STRING, "on", 0, 0, "on off",
     "dynamic, ratio: candidates also keep values in 8, 4 and 2 bits"},
    {"qgroup", MKV_PARAM_INT, "64", 0, 1e9, NULL,
     "quantized values: tokens per group with its own zeros and steps (0: one per segment; dynamic, "
     "ratio: offered beside the segment-wide ones)"},
    {"rotate", MKV_PARAM_STRING, "on", 0, 0, "on off",
     "per-segment SVD rotation (dynamic: values may go without where it pays; off: never)"},
    {"strategy", MKV_PARAM_STRING, "ratio", 0, 0, "fixed dynamic ratio",
     "per-segment strategies: fixed (keep, group, energy), dynamic (threshold rule) or ratio (byte budget)"},
    {"threshold", MKV_PARAM_DOUBLE, "0.1", 0, 1, NULL,
     "dynamic: largest loss per segment and tensor (output error added; without queries, energy dropped)"},
    {"ratio", MKV_PARAM_DOUBLE, "3", 1, 1e6, NULL,
     "ratio: physical compression per head, logical/physical bytes, the least loss within it"},
    {"budget", MKV_PARAM_DOUBLE, "0.1", 0, 1e15, NULL,
     "tokens attended per step: fraction (<= 1) of the context or a count (> 1)", MKV_PARAM_ABOVE_MIN},
    {"agg", MKV_PARAM_STRING, "max", 0, 0, "max sum", "block score over the G query heads: max or sum"},
    {"refine", MKV_PARAM_DOUBLE, "1", 1, 1e3, NULL,
     "blocks for refine x the budget, then the budget's best tokens of them by their compressed keys "
     "(1: blocks only)"},
    {"headbudget", MKV_PARAM_STRING, "off", 0, 0, "on off",
     "a fractional budget < 1 split over the (layer, KV head)s by their observation queries' attention, "
     "the mean kept, each at least a quarter of it (off: every head the same)"},
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
    if ((rc = mkv_bl_check_budget("budget", mkv_params_double(p, "budget"), m->n_tokens, err)))
        return rc;
    if (segment < block)
        return mkv_fail(err, MKV_EUSAGE, "segment=%lld tokens is smaller than block=%lld tokens: a "
                        "segment holds whole blocks", (long long)segment, (long long)block);
    int kd = mkv_mosaic_kept(mkv_params_double(p, "keydim"), d);
    if (mkv_params_int(p, "bound") > kd)
        return mkv_fail(err, MKV_EUSAGE, "bound=%lld is larger than the %d block-key channels "
                        "(keydim=%g of head_dim %d)", (long long)mkv_params_int(p, "bound"), kd,
                        mkv_params_double(p, "keydim"), d);
    return MKV_OK;
}

/* Parameters given for a strategy other than the chosen one change
 * nothing: say which, once. */
static void warn_ignored(const mkv_params *p)
{
    static const struct {
        const char *strategies[3];
        const char *const params[6];
    } own[] = {
        {{"fixed", NULL}, {"keep", "group", "energy", "dprime", "bits", NULL}},
        {{"dynamic", NULL}, {"threshold", NULL}},
        {{"ratio", NULL}, {"ratio", NULL}},
        {{"dynamic", "ratio", NULL}, {"quantize", NULL}},
    };
    const char *strategy = mkv_params_str(p, "strategy");
    char text[512] = "";
    size_t len = 0;
    for (size_t i = 0; i < sizeof own / sizeof own[0] && len < sizeof text; i++) {
        char given[256];
        const char *const *st = own[i].strategies;
        if (strcmp(st[0], strategy) == 0 || (st[1] && strcmp(st[1], strategy) == 0) ||
            !mkv_params_given_text(p, own[i].params, given, sizeof given))
            continue;
        len += (size_t)snprintf(text + len, sizeof text - len, "%s%s (strategy=%s%s%s only)", len ? ", " : "",
                                given, st[0], st[1] ? " or " : "", st[1] ? st[1] : "");
    }
    if (len)
        mkv_warn("mosaic: strategy=%s ignores %s", strategy, text);
}

static int mosaic_check(const mkv_params *p, const mkv_dump_meta *m, mkv_error *err)
{
    int rc = mkv_mosaic_check_common(p, m, err);
    if (rc != MKV_OK)
        return rc;
    int d = m->head_dim;
    int64_t g = mkv_params_int(p, "group");
    double keep = mkv_params_double(p, "keep");
    int fixed = strcmp(mkv_params_str(p, "strategy"), "fixed") == 0;
    mkv_bl_warn_budget("mosaic", p, m->n_tokens);
    warn_ignored(p);
    if (!fixed)
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

void mkv_mosaic_config_common(const mkv_params *p, int d, mkv_mosaic_config *c)
{
    memset(c, 0, sizeof *c);
    c->sink = mkv_params_int(p, "sink");
    c->recent = mkv_params_int(p, "recent");
    c->segment = mkv_params_int(p, "segment");
    c->block = (int)mkv_params_int(p, "block");
    c->keydim = mkv_mosaic_kept(mkv_params_double(p, "keydim"), d);
    c->bound = (int)mkv_params_int(p, "bound");
    c->rotate = 1;
    c->bits = 16;
    c->attn.budget = mkv_params_double(p, "budget");
    c->attn.agg_sum = strcmp(mkv_params_str(p, "agg"), "sum") == 0;
    c->attn.refine = mkv_params_double(p, "refine");
}

void mkv_mosaic_config_of(const mkv_params *p, int d, mkv_mosaic_config *c)
{
    mkv_mosaic_config_common(p, d, c);
    c->dynamic = strcmp(mkv_params_str(p, "strategy"), "fixed") != 0;
    c->rotate = strcmp(mkv_params_str(p, "rotate"), "on") == 0;
    c->r = mkv_mosaic_kept(mkv_params_double(p, "keep"), d);
    c->g = (int)mkv_params_int(p, "group");
    c->energy = mkv_params_double(p, "energy");
    c->dprime = mkv_params_double(p, "dprime");
    c->bits = (int)mkv_params_int(p, "bits");
    c->quantize = strcmp(mkv_params_str(p, "quantize"), "on") == 0;
    c->qgroup = (int)mkv_params_int(p, "qgroup");
    c->threshold = mkv_params_double(p, "threshold");
    c->ratio = strcmp(mkv_params_str(p, "strategy"), "ratio") == 0 ? mkv_params_double(p, "ratio") : 0;
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

/* What the observation queries see of the whole head. Query vector j =
 * position i = j / G, head j % G. */
typedef struct {
    int64_t npos, nq;
    int G, d;
    float *q;          /* [nq][d] */
    int64_t *pos;      /* [npos] */
    uint8_t *sel;      /* [npos][T] tokens the attention rule attends */
    double *m, *l;     /* [nq] over the selected tokens, exact keys: max scaled score, sum e^(s-m) */
    double *acc;       /* [nq][d] sum e^(s-m) v over them */
    double *exact;     /* [nq][d] exact attention output over tokens 0..pos */
    double *err0;      /* [nq] relative error of acc / l against exact */
} head_obs;

static void head_obs_free(head_obs *o)
{
    mkv_free(o->q);
    mkv_free(o->pos);
    mkv_free(o->sel);
    mkv_free(o->m);   /* l, err0, acc and exact live in its block */
    memset(o, 0, sizeof *o);
}

/* Observation queries: every head at up to OBS_MAX / G positions spread
 * evenly over the dump's W queries (first and last included). */
static int pick_obs(const mkv_head_kv *in, head_obs *o, mkv_error *err)
{
    memset(o, 0, sizeof *o);
    o->G = in->G;
    o->d = in->d;
    if (in->W <= 0 || !in->q)
        return MKV_OK;
    int64_t nw = OBS_MAX / in->G;
    if (nw < 1)
        nw = 1;
    if (nw > in->W)
        nw = in->W;
    int64_t n = nw * in->G;
    o->q = mkv_alloc((size_t)n * (size_t)in->d, sizeof *o->q, "observation queries", err);
    o->pos = o->q ? mkv_alloc((size_t)nw, sizeof *o->pos, "observation query positions", err) : NULL;
    if (!o->pos) {
        head_obs_free(o);
        return err ? err->code : MKV_ENOMEM;
    }
    for (int64_t i = 0; i < nw; i++) {
        int64_t w = nw == 1 ? in->W - 1 : (i * (in->W - 1) + (nw - 1) / 2) / (nw - 1);
        for (int h = 0; h < in->G; h++)
            memcpy(o->q + (i * in->G + h) * in->d,
                   in->q + ((size_t)h * (size_t)in->W + (size_t)w) * (size_t)in->d,
                   sizeof(float) * (size_t)in->d);
        o->pos[i] = in->query_pos[w];
        if (o->pos[i] < 0 || o->pos[i] >= in->T) {
            int64_t bad = o->pos[i];
            head_obs_free(o);
            return mkv_fail(err, MKV_EFORMAT, "query %lld is at position %lld, outside the %lld tokens",
                            (long long)w, (long long)bad, (long long)in->T);
        }
    }
    o->npos = nw;
    o->nq = n;
    return MKV_OK;
}

/* q . k in double: four running sums (channels j mod 4), added in a fixed
 * order, so the additions do not wait on each other and the result does
 * not depend on anything but the inputs. */
static double dot_fd(const float *a, const float *b, int d)
{
    double s[4] = {0, 0, 0, 0};
    int j = 0;
    for (; j + 4 <= d; j += 4)
        for (int u = 0; u < 4; u++)
            s[u] += (double)a[j + u] * b[j + u];
    for (; j < d; j++)
        s[0] += (double)a[j] * b[j];
    return (s[0] + s[1]) + (s[2] + s[3]);
}

/* Exact outputs and the selected-set states of o's queries; sel from the
 * skeleton head hs (keys' rotations and block keys final). */
static int observe(const mkv_head_kv *in, const mkv_mosaic_head *hs, const mkv_mosaic_attn_opts *ao,
                   head_obs *o, mkv_error *err)
{
    int d = in->d, G = in->G;
    int64_t T = in->T, nq = o->nq;
    double scale = 1 / sqrt((double)d);
    o->sel = mkv_calloc((size_t)o->npos * (size_t)T, 1, "selections", err);
    o->m = o->sel ? mkv_alloc((size_t)nq * (size_t)(2 * d + 3), sizeof *o->m, "observations", err) : NULL;
    double *sc = o->m ? mkv_alloc((size_t)T, sizeof *sc, "scores", err) : NULL;
    double *qt = sc ? mkv_alloc((size_t)(hs->k.nseg ? hs->k.nseg : 1) * (size_t)G * (size_t)d, sizeof *qt,
                                "rotated queries", err) : NULL;
    if (!qt) {
        mkv_free(sc);
        return err ? err->code : MKV_ENOMEM;
    }
    /* one block: m, l, err0 [nq], acc, exact [nq][d] */
    o->l = o->m + nq;
    o->err0 = o->m + 2 * nq;
    o->acc = o->m + 3 * nq;
    o->exact = o->acc + (size_t)nq * d;
    double *ex = o->exact;
    for (int64_t i = 0; i < o->npos; i++) {
        int64_t p = o->pos[i];
        uint8_t *sel = o->sel + i * T;
        if (mkv_mosaic_select_tokens(hs, ao, o->q + i * G * d, G, p, scale, in->k, qt, sel, NULL) < 0) {
            mkv_free(sc);
            mkv_free(qt);
            return mkv_fail(err, MKV_ENOMEM, "out of memory selecting blocks");
        }
        for (int h = 0; h < G; h++) {
            int64_t j = i * G + h;
            const float *q = o->q + j * d;
            double mx = -INFINITY, ms = -INFINITY, l = 0, ls = 0, *e = ex + j * d, *a = o->acc + j * d;
            for (int64_t t = 0; t <= p; t++) {
                sc[t] = dot_fd(q, in->k + t * d, d) * scale;
                mx = sc[t] > mx ? sc[t] : mx;
                if (sel[t])
                    ms = sc[t] > ms ? sc[t] : ms;
            }
            for (int c = 0; c < d; c++)
                e[c] = a[c] = 0;
            for (int64_t t = 0; t <= p; t++) {
                double w = exp(sc[t] - mx);
                l += w;
                for (int c = 0; c < d; c++)
                    e[c] += w * in->v[t * d + c];
                if (sel[t]) {
                    double ws = exp(sc[t] - ms);
                    ls += ws;
                    for (int c = 0; c < d; c++)
                        a[c] += ws * in->v[t * d + c];
                }
            }
            double num = 0, den = 0;
            for (int c = 0; c < d; c++) {
                e[c] /= l;
                num += (a[c] / ls - e[c]) * (a[c] / ls - e[c]);
                den += e[c] * e[c];
            }
            o->m[j] = ms;
            o->l[j] = ls;
            o->err0[j] = den > 0 ? sqrt(num / den) : sqrt(num);
        }
    }
    mkv_free(sc);
    mkv_free(qt);
    return MKV_OK;
}

/* The view of segment [start, start + len) for mkv_mosaic_evaluate: the
 * query vectors whose position >= start, their selected tokens of the
 * segment with exact weights, and the rest of their states. */
typedef struct {
    mkv_mosaic_segobs v;
    double *buf;     /* q, exact, err0, m, l_rest, acc_rest */
    int64_t *first;
    int32_t *tok;
    double *w;
} seg_view;

static void seg_view_free(seg_view *s)
{
    mkv_free(s->buf);
    mkv_free(s->first);
    mkv_free(s->tok);
    mkv_free(s->w);
    memset(s, 0, sizeof *s);
}

static int seg_view_make(const head_obs *o, const mkv_head_kv *in, int64_t start, int64_t len, seg_view *s,
                         mkv_error *err)
{
    memset(s, 0, sizeof *s);
    int d = in->d, G = o->G;
    int64_t T = in->T, nq = 0, npairs = 0;
    for (int64_t i = 0; i < o->npos; i++)
        if (o->pos[i] >= start) {
            nq += G;
            for (int64_t t = start; t < start + len && t <= o->pos[i]; t++)
                npairs += (int64_t)G * o->sel[i * T + t];
        }
    s->v.nq = nq;
    s->v.d = d;
    s->v.scale = 1 / sqrt((double)d);
    s->v.keys = in->k + start * d;
    s->v.values = in->v + start * d;
    if (nq == 0)
        return MKV_OK;
    size_t nd = (size_t)nq * (size_t)d;
    if (!(s->buf = mkv_alloc(3 * nd + 3 * (size_t)nq, sizeof *s->buf, "observations", err)) ||
        !(s->first = mkv_alloc((size_t)nq + 1, sizeof *s->first, "observations", err)) ||
        !(s->tok = mkv_alloc((size_t)(npairs ? npairs : 1), sizeof *s->tok, "observations", err)) ||
        !(s->w = mkv_alloc((size_t)(npairs ? npairs : 1), sizeof *s->w, "observations", err))) {
        seg_view_free(s);
        return err ? err->code : MKV_ENOMEM;
    }
    double *q = s->buf, *exact = q + nd, *acc_rest = exact + nd, *err0 = acc_rest + nd, *m = err0 + nq,
           *l_rest = m + nq;
    int64_t j = 0, k = 0;
    for (int64_t i = 0; i < o->npos; i++) {
        if (o->pos[i] < start)
            continue;
        for (int h = 0; h < G; h++, j++) {
            int64_t jo = i * G + h;
            const float *qv = o->q + jo * d;
            for (int c = 0; c < d; c++) {
                q[j * d + c] = qv[c];
                exact[j * d + c] = o->exact[jo * d + c];
                acc_rest[j * d + c] = o->acc[jo * d + c];
            }
            err0[j] = o->err0[jo];
            m[j] = o->m[jo];
            l_rest[j] = o->l[jo];
            s->first[j] = k;
            for (int64_t t = start; t < start + len && t <= o->pos[i]; t++) {
                if (!o->sel[i * T + t])
                    continue;
                double w = exp(dot_fd(qv, in->k + t * d, d) * s->v.scale - m[j]);
                s->tok[k] = (int32_t)(t - start);
                s->w[k++] = w;
                l_rest[j] -= w;
                for (int c = 0; c < d; c++)
                    acc_rest[j * d + c] -= w * in->v[t * d + c];
            }
            /* rounding may leave a hair below zero when the segment holds
             * everything selected */
            l_rest[j] = l_rest[j] > 0 ? l_rest[j] : 0;
        }
    }
    s->first[nq] = k;
    s->v.q = q;
    s->v.exact = exact;
    s->v.err0 = err0;
    s->v.m = m;
    s->v.l_rest = l_rest;
    s->v.acc_rest = acc_rest;
    s->v.first = s->first;
    s->v.tok = s->tok;
    s->v.w = s->w;
    return MKV_OK;
}

/* A scored block: segment, block within it, aggregated score. */
typedef struct {
    double score;
    int64_t seg, block, order;
} scored_block;

/* Descending score, ties: the earlier block. */
static int by_score(const void *a, const void *b)
{
    const scored_block *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return (x->order > y->order) - (x->order < y->order);
}

/* Reorder blk [n] so that its first k are the k first of by_score's order
 * (in any order among themselves): quickselect. */
static void select_best(scored_block *blk, int64_t n, int64_t k)
{
    int64_t lo = 0, hi = n - 1;
    while (k > 0 && k < n && lo < hi) {
        scored_block pivot = blk[lo + (hi - lo) / 2], t;
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (by_score(&blk[i], &pivot) < 0)
                i++;
            while (by_score(&blk[j], &pivot) > 0)
                j--;
            if (i <= j) {
                t = blk[i];
                blk[i++] = blk[j];
                blk[j--] = t;
            }
        }
        /* [lo, j] precede the pivot or equal it, [i, hi] follow or equal it */
        if (k - 1 <= j)
            hi = j;
        else if (k - 1 >= i)
            lo = i;
        else
            return;
    }
}

/* The exact attention weights, within the segment [start, start + len),
 * of every observation query vector that sees it: mass [nq][len], each
 * query's visible tokens summing to 1 (the others 0). */
static void segment_mass(const head_obs *o, const mkv_head_kv *in, int64_t start, int64_t len, double *mass)
{
    int d = in->d;
    double scale = 1 / sqrt((double)d);
    for (int64_t j = 0; j < o->nq; j++) {
        int64_t p = o->pos[j / o->G], vis = p + 1 < start + len ? p + 1 - start : len;
        double *w = mass + j * len, mx = -INFINITY, all = 0;
        for (int64_t t = 0; t < len; t++) {
            w[t] = t < vis ? dot_fd(o->q + j * d, in->k + (start + t) * d, d) * scale : -INFINITY;
            mx = w[t] > mx ? w[t] : mx;
        }
        for (int64_t t = 0; t < len; t++) {
            w[t] = t < vis ? exp(w[t] - mx) : 0;
            all += w[t];
        }
        for (int64_t t = 0; t < vis; t++)
            w[t] /= all;
    }
}

/* Step 4 of COMPRESSION for block-key rows bk (keydim + bound wide) of the
 * segment [start, start + len): the exact attention mass (segment_mass)
 * its top blocks hold, summed over the query positions that see it and
 * averaged over their G heads. R: the segment's key rotation (d x d);
 * blk [nblocks], taken [len], qt [d]: scratch. */
static double bound_recall(const head_obs *o, const mkv_head_kv *in, const mkv_mosaic_attn_opts *ao, int64_t start,
                           int64_t len, int B, const double *R, int keydim, int bound, const float *bk,
                           const double *mass, scored_block *blk, uint8_t *taken, double *qt)
{
    int d = in->d, G = o->G;
    double scale = 1 / sqrt((double)d), total = 0;
    for (int64_t i = 0; i < o->npos; i++) {
        int64_t p = o->pos[i];
        if (p < start)
            continue;
        int64_t vis = (p + 1 < start + len ? p + 1 : start + len) - start, nbv = (vis + B - 1) / B;
        int64_t want = (int64_t)ceil((double)vis * (double)mkv_budget_tokens(ao->budget, p + 1) /
                                     (double)(p + 1) - 1e-9);
        for (int h = 0; h < G; h++) {
            const float *q = o->q + (i * G + h) * d;
            for (int c = 0; c < keydim; c++) {
                double s = 0;
                for (int j = 0; j < d; j++)
                    s += (double)q[j] * R[j * d + c];
                qt[c] = s;
            }
            for (int64_t b = 0; b < nbv; b++) {
                double s = mkv_mosaic_block_score(qt, bk + b * (keydim + bound), keydim, bound) * scale;
                if (h == 0)
                    blk[b] = (scored_block){.score = s, .block = b, .order = b};
                else
                    blk[b].score = ao->agg_sum ? blk[b].score + s : s > blk[b].score ? s : blk[b].score;
            }
        }
        qsort(blk, (size_t)nbv, sizeof *blk, by_score);
        memset(taken, 0, (size_t)vis);
        for (int64_t k = 0, got = 0; k < nbv && got < want; k++)
            for (int64_t t = blk[k].block * B; t < (blk[k].block + 1) * B && t < vis; t++, got++)
                taken[t] = 1;
        for (int h = 0; h < G; h++) {
            const double *w = mass + (i * G + h) * len;
            for (int64_t t = 0; t < vis; t++)
                total += taken[t] ? w[t] / G : 0;
        }
    }
    return total;
}

/* The fixed strategy of one segment (evals: the segment's eigenvalues). */
void mkv_mosaic_fixed_strategy(const mkv_mosaic_config *c, int d, const double *evals, mkv_mosaic_strategy *s)
{
    s->rotate = c->rotate;
    s->r = c->r;
    s->g = c->pervector ? c->g : 1;
    s->pervector = c->pervector;
    s->bits = c->bits;
    s->qgroup = c->bits != 16 && c->qgroup > 0 && c->qgroup < s->len ? c->qgroup : 0;
    if (!c->rotate)
        s->dprime = d;
    else if (!c->pervector)
        s->dprime = c->r;   /* uniform2d: the first r rotated channels, nothing more */
    else if (c->dprime > 0)
        s->dprime = mkv_mosaic_dprime_of_fraction(c->dprime, d, c->r, s->g);
    else
        s->dprime = mkv_mosaic_dprime_for_energy(evals, d, c->energy, c->r);
}

/* Everything a head's compression works with besides the head itself. */
typedef struct {
    int64_t nseg;
    double *R;        /* [2][nseg][d][d] rotations of K and V (fp16-rounded), when rotating */
    double *evals;    /* [2][nseg][d] */
    head_obs obs;
    mkv_mosaic_candidate **cand;   /* [2 nseg] (dynamic) */
    int *ncand, *pick;
} compress_work;

static void compress_work_free(compress_work *w)
{
    mkv_free(w->R);
    mkv_free(w->evals);
    head_obs_free(&w->obs);
    for (int64_t i = 0; w->cand && i < 2 * w->nseg; i++)
        mkv_free(w->cand[i]);
    mkv_free(w->cand);
    mkv_free(w->ncand);
    mkv_free(w->pick);
    memset(w, 0, sizeof *w);
}

static const double *rot_of(const compress_work *w, int which, int64_t i, int d)
{
    return w->R ? w->R + ((size_t)which * (size_t)w->nseg + (size_t)i) * (size_t)d * (size_t)d : NULL;
}

/* Step 4: the keys' block-key shape per segment (h->k.seg keydim and
 * bound), and the skeleton head hs the attention rule can select from
 * (keys with every rotated column, d' = d, and their block keys). */
static int key_skeleton(const mkv_mosaic_config *c, const mkv_head_kv *in, mkv_mosaic_head *h,
                        const compress_work *w, mkv_mosaic_head *hs, mkv_error *err)
{
    int d = h->d, B = c->block;
    int64_t nseg = h->k.nseg, first = h->sink_n, last = h->T - h->recent_n, nblk = 0;
    *hs = (mkv_mosaic_head){.d = d, .G = h->G, .block = B, .T = h->T, .sink_n = h->sink_n,
                            .recent_n = h->recent_n};
    hs->k.nseg = nseg;
    for (int64_t i = 0; i < nseg; i++)
        nblk += mkv_mosaic_nblocks(h->k.seg[i].len, B);
    /* every token attended: no step selects, so no block keys */
    int all = c->attn.budget == 1.0;
    int kd = all ? 0 : c->rotate ? c->keydim : d, bound = all || !c->rotate ? 0 : c->bound;
    int choose = c->dynamic && w->obs.nq > 0 && bound > 0;
    size_t seglen = (size_t)(c->segment < last - first ? c->segment : last - first);
    double *xt = NULL, *qt = NULL, *mass = NULL;
    scored_block *blk = NULL;
    uint8_t *taken = NULL;
    float *alt = NULL, *bk = NULL;   /* one segment's block keys, fp16 values in float */
    int rc = MKV_OK;
    if (!(hs->k.seg = mkv_calloc((size_t)(nseg ? nseg : 1), sizeof *hs->k.seg, "strategies", err)) ||
        !(hs->k.blockkeys = mkv_alloc((size_t)(nblk ? nblk : 1) * (size_t)(kd + bound + 1),
                                      sizeof *hs->k.blockkeys, "block keys", err)) ||
        !(hs->k.rotation = mkv_alloc((size_t)(nseg && c->rotate ? nseg : 1) * (size_t)d * (size_t)d,
                                     sizeof *hs->k.rotation, "rotations", err)) ||
        !(bk = mkv_alloc((seglen / (size_t)B + 1) * (size_t)(kd + bound + 1), sizeof *bk, "block keys", err)) ||
        !(xt = mkv_alloc((seglen ? seglen : 1) * (size_t)(kd ? kd : 1), sizeof *xt, "rotated keys", err)) ||
        (choose && (!(qt = mkv_alloc((size_t)d, sizeof *qt, "rotated queries", err)) ||
                    !(mass = mkv_alloc((size_t)w->obs.nq * seglen, sizeof *mass, "attention weights", err)) ||
                    !(blk = mkv_alloc(seglen / (size_t)B + 1, sizeof *blk, "block scores", err)) ||
                    !(taken = mkv_alloc(seglen + 1, 1, "taken tokens", err)) ||
                    !(alt = mkv_alloc((seglen / (size_t)B + 1) * (size_t)kd, sizeof *alt, "block keys", err)))))
        rc = err ? err->code : MKV_ENOMEM;
    for (int64_t i = 0, off = 0; i < nseg && rc == MKV_OK; i++) {
        mkv_mosaic_strategy *ks = &h->k.seg[i];
        const double *R = rot_of(w, 0, i, d);
        ks->keydim = kd;
        ks->bound = bound;
        mkv_mosaic_rotate(in->k + ks->start * d, ks->len, d, R, d, kd, xt);
        mkv_mosaic_block_keys(xt, ks->len, kd, kd, bound, B, bk);
        if (choose) {
            mkv_mosaic_block_keys(xt, ks->len, kd, kd, 0, B, alt);
            segment_mass(&w->obs, in, ks->start, ks->len, mass);
            double with = bound_recall(&w->obs, in, &c->attn, ks->start, ks->len, B, R, kd, bound, bk, mass,
                                       blk, taken, qt);
            double without = bound_recall(&w->obs, in, &c->attn, ks->start, ks->len, B, R, kd, 0, alt, mass,
                                          blk, taken, qt);
            if (without >= with) {
                ks->bound = 0;
                memcpy(bk, alt, sizeof *alt * (size_t)mkv_mosaic_nblocks(ks->len, B) * (size_t)kd);
            }
        }
        int64_t width = mkv_mosaic_nblocks(ks->len, B) * mkv_mosaic_block_width(ks);
        mkv_f32_to_f16_n(bk, hs->k.blockkeys + off, (size_t)width);
        off += width;
        hs->k.seg[i] = (mkv_mosaic_strategy){.start = ks->start, .len = ks->len, .rotate = c->rotate, .r = d,
                                             .g = 1, .dprime = d, .pervector = 1, .bits = 16, .keydim = kd,
                                             .bound = ks->bound};
        for (size_t j = 0; R && j < (size_t)d * (size_t)d; j++)
            hs->k.rotation[(size_t)i * d * d + j] = mkv_f32_to_f16((float)R[j]);
    }
    mkv_free(bk);
    mkv_free(xt);
    mkv_free(qt);
    mkv_free(mass);
    mkv_free(blk);
    mkv_free(taken);
    mkv_free(alt);
    if (rc == MKV_OK)
        rc = mkv_mosaic_layout(&hs->k, d, B, first, last, err);
    return rc;
}

/* Step 5 for segment i: the strategies of K and V, or (ratio rule) their
 * candidates left in w. */
static int segment_strategies(const mkv_mosaic_config *c, const mkv_head_kv *in, mkv_mosaic_head *h,
                              compress_work *w, int64_t i, mkv_error *err)
{
    int d = h->d;
    seg_view sv;
    const mkv_mosaic_strategy *sk = &h->k.seg[i];
    int rc = MKV_OK;
    memset(&sv, 0, sizeof sv);
    if (w->obs.nq > 0)
        rc = seg_view_make(&w->obs, in, sk->start, sk->len, &sv, err);
    for (int which = 0; which < 2 && rc == MKV_OK; which++) {
        mkv_mosaic_tensor *t = which ? &h->v : &h->k;
        mkv_mosaic_strategy *s = &t->seg[i];
        const float *X = (which ? in->v : in->k) + s->start * d;
        const double *R = rot_of(w, which, i, d);
        mkv_mosaic_search_opts o = {.d = d, .block = which ? 0 : c->block, .keydim = which ? 0 : s->keydim,
                                    .bound = which ? 0 : s->bound, .allow_rotate = c->rotate,
                                    .quantize = c->quantize, .qgroup = c->qgroup,
                                    .obs = w->obs.nq > 0 ? &sv.v : NULL};
        mkv_mosaic_candidate one, *chosen = &one;
        if (c->dynamic) {
            int64_t item = 2 * i + which;
            rc = mkv_mosaic_candidates(&o, X, s->start, s->len, R, &w->cand[item], &w->ncand[item], err);
            if (rc != MKV_OK || c->ratio > 0)
                continue;   /* the ratio rule chooses once every segment has its candidates */
            chosen = &w->cand[item][mkv_mosaic_pick(w->cand[item], w->ncand[item], c->threshold)];
        } else {
            one.s = *s;
            mkv_mosaic_fixed_strategy(c, d, w->evals + ((size_t)which * (size_t)w->nseg + (size_t)i) * (size_t)d, &one.s);
            rc = mkv_mosaic_evaluate(&o, X, R, &one, 1, err);
        }
        if (rc == MKV_OK) {
            *s = chosen->s;
            t->loss[i * 2] = (float)chosen->energy;
            t->loss[i * 2 + 1] = chosen->measured ? (float)chosen->output : NAN;
        }
    }
    seg_view_free(&sv);
    return rc;
}

/* The ratio rule: all tensors of all segments within the head's byte
 * budget once the dense rows and the tables are paid. */
static void ratio_strategies(const mkv_mosaic_config *c, mkv_mosaic_head *h, compress_work *w)
{
    int64_t nseg = w->nseg;
    uint64_t budget = mkv_mosaic_ratio_budget(c->ratio, h->T, h->d, h->sink_n + h->recent_n, nseg, h->budget_scale > 0);
    mkv_mosaic_allocate(w->cand, w->ncand, (int)(2 * nseg), budget, w->pick);
    for (int64_t item = 0; item < 2 * nseg; item++) {
        mkv_mosaic_tensor *t = item % 2 ? &h->v : &h->k;
        const mkv_mosaic_candidate *ch = &w->cand[item][w->pick[item]];
        int64_t i = item / 2;
        t->seg[i] = ch->s;
        t->loss[i * 2] = (float)ch->energy;
        t->loss[i * 2 + 1] = ch->measured ? (float)ch->output : NAN;
    }
}

/* Step 6: the packed arrays of t from its strategies. */
static int encode_tensor(const mkv_mosaic_head *h, const float *data, int is_key, const compress_work *w,
                         mkv_mosaic_tensor *t, mkv_error *err)
{
    int d = h->d, block = is_key ? h->block : 0;
    flat values = {.elem = 2}, bitmap = {.elem = 1}, codes = {.elem = 1}, qparams = {.elem = 2}, keys = {.elem = 2},
         rot = {.elem = 2};
    int rc = MKV_OK;
    for (int64_t i = 0; i < t->nseg && rc == MKV_OK; i++) {
        const mkv_mosaic_strategy *s = &t->seg[i];
        mkv_mosaic_bytes b;
        mkv_mosaic_strategy_bytes(s, d, block, &b);
        uint16_t *pv, *pq, *pk, *pr;
        uint8_t *pb, *pc;
        if (!(pv = flat_extend(&values, s->bits == 16 ? s->len * s->r : 0, "packed values", err)) ||
            !(pc = flat_extend(&codes, s->bits == 16 ? 0 : (int64_t)b.values, "codes", err)) ||
            !(pq = flat_extend(&qparams, (int64_t)b.qparams / 2, "zeros and steps", err)) ||
            !(pb = flat_extend(&bitmap, (int64_t)b.bitmap, "bitmaps", err)) ||
            !(pk = flat_extend(&keys, (int64_t)b.blockkeys / 2, "block keys", err)) ||
            !(pr = flat_extend(&rot, (int64_t)b.rotation / 2, "rotations", err))) {
            rc = err ? err->code : MKV_ENOMEM;
            break;
        }
        rc = mkv_mosaic_encode(s, data + s->start * d, d, rot_of(w, !is_key, i, d), block, s->bits == 16 ? pv : NULL,
                               b.bitmap ? pb : NULL, s->bits == 16 ? NULL : pc, s->bits == 16 ? NULL : pq, pk, pr,
                               err);
    }
    t->values = values.p;
    t->codes = codes.p;
    t->qparams = qparams.p;
    t->bitmap = bitmap.p;
    t->blockkeys = keys.p;
    t->rotation = rot.p;
    if (rc == MKV_OK)
        rc = mkv_mosaic_layout(t, d, block, h->sink_n, h->T - h->recent_n, err);
    return rc;
}

/* Steps 1-2: dense rows, the segments of both tensors (start and length),
 * their loss tables; the arrays of w sized for them. */
static int head_init(const mkv_mosaic_config *c, const mkv_head_kv *in, mkv_mosaic_head *h, compress_work *w,
                     mkv_error *err)
{
    int d = in->d;
    h->d = d;
    h->G = in->G;
    h->block = c->block;
    h->T = in->T;
    h->sink_n = c->sink < in->T ? c->sink : in->T;
    h->recent_n = c->recent < in->T - h->sink_n ? c->recent : in->T - h->sink_n;
    int64_t nd = h->sink_n + h->recent_n, first = h->sink_n, last = h->T - h->recent_n;
    int64_t nseg = last > first ? (last - first + c->segment - 1) / c->segment : 0, ns = nseg ? nseg : 1;
    w->nseg = h->k.nseg = h->v.nseg = nseg;
    size_t dd = (size_t)d * (size_t)d;
    if (!(h->dense_k = mkv_alloc((size_t)(nd ? nd : 1) * (size_t)d, sizeof *h->dense_k, "dense keys", err)) ||
        !(h->dense_v = mkv_alloc((size_t)(nd ? nd : 1) * (size_t)d, sizeof *h->dense_v, "dense values", err)) ||
        !(h->k.seg = mkv_calloc((size_t)ns, sizeof *h->k.seg, "strategies", err)) ||
        !(h->v.seg = mkv_calloc((size_t)ns, sizeof *h->v.seg, "strategies", err)) ||
        !(h->k.loss = mkv_calloc((size_t)ns * MKV_MOSAIC_LOSS_COLS, sizeof *h->k.loss, "losses", err)) ||
        !(h->v.loss = mkv_calloc((size_t)ns * MKV_MOSAIC_LOSS_COLS, sizeof *h->v.loss, "losses", err)) ||
        !(w->evals = mkv_alloc(2 * (size_t)ns * (size_t)d, sizeof *w->evals, "eigenvalues", err)) ||
        (c->rotate && !(w->R = mkv_alloc(2 * (size_t)ns * dd, sizeof *w->R, "rotations", err))) ||
        (c->dynamic && (!(w->cand = mkv_calloc(2 * (size_t)ns, sizeof *w->cand, "candidates", err)) ||
                        !(w->ncand = mkv_calloc(2 * (size_t)ns, sizeof *w->ncand, "candidates", err)) ||
                        !(w->pick = mkv_calloc(2 * (size_t)ns, sizeof *w->pick, "candidates", err)))))
        return err ? err->code : MKV_ENOMEM;
    for (int64_t i = 0; i < nd; i++) {
        int64_t t = i < h->sink_n ? i : in->T - h->recent_n + (i - h->sink_n);
        for (int j = 0; j < d; j++) {
            h->dense_k[i * d + j] = mkv_f32_to_f16(in->k[t * d + j]);
            h->dense_v[i * d + j] = mkv_f32_to_f16(in->v[t * d + j]);
        }
    }
    for (int64_t i = 0; i < nseg; i++) {
        int64_t start = first + i * c->segment, len = last - start < c->segment ? last - start : c->segment;
        h->k.seg[i] = h->v.seg[i] = (mkv_mosaic_strategy){.start = start, .len = len};
    }
    return MKV_OK;
}

/* Step 3: rotations (rounded to fp16: every use sees the stored matrix)
 * and eigenvalues of every segment and tensor. */
static int rotations(const mkv_mosaic_config *c, const mkv_head_kv *in, const mkv_mosaic_head *h,
                     compress_work *w, mkv_error *err)
{
    int d = h->d;
    for (int which = 0; which < 2 && c->rotate; which++)
        for (int64_t i = 0; i < w->nseg; i++) {
            const mkv_mosaic_strategy *s = &(which ? &h->v : &h->k)->seg[i];
            double *R = (double *)rot_of(w, which, i, d);
            int rc = mkv_mosaic_rotation((which ? in->v : in->k) + s->start * d, s->len, d, R,
                                         w->evals + ((size_t)which * (size_t)w->nseg + (size_t)i) * (size_t)d,
                                         err);
            if (rc != MKV_OK)
                return rc;
            mkv_mosaic_round_f16(R, (size_t)d * (size_t)d);
        }
    return MKV_OK;
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
    if (c->block < 1 || c->segment < c->block || (c->rotate && (c->keydim < 1 || c->keydim > d)) ||
        c->bound < 0 || (c->rotate && c->bound > c->keydim))
        return mkv_fail(err, MKV_EUSAGE, "mosaic: block %d, segment %lld, keydim %d, bound %d do not fit "
                        "head_dim %d", c->block, (long long)c->segment, c->keydim, c->bound, d);
    /* a planned per-head budget: the head's own share, as attention will read it back */
    mkv_mosaic_config planned;
    float scale = (float)in->budget_scale;
    if (scale > 0) {
        planned = *c;
        planned.attn.budget = mkv_mosaic_scaled_budget(scale, c->attn.budget);
        c = &planned;
    }
    int rc;
    size_t n = (size_t)in->T * (size_t)d;
    if ((rc = mkv_bl_check_f16_range(in->k, n, "key", in->layer, in->head, err)) ||
        (rc = mkv_bl_check_f16_range(in->v, n, "value", in->layer, in->head, err)))
        return rc;
    compress_work w;
    mkv_mosaic_head hs;
    memset(&w, 0, sizeof w);
    memset(&hs, 0, sizeof hs);
    h->budget_scale = scale > 0 ? scale : 0;
    if ((rc = head_init(c, in, h, &w, err)) == MKV_OK && (rc = rotations(c, in, h, &w, err)) == MKV_OK &&
        (rc = pick_obs(in, &w.obs, err)) == MKV_OK && (rc = key_skeleton(c, in, h, &w, &hs, err)) == MKV_OK &&
        w.obs.nq > 0)
        rc = observe(in, &hs, &c->attn, &w.obs, err);
    mkv_mosaic_head_free(&hs);
    for (int64_t i = 0; i < w.nseg && rc == MKV_OK; i++)
        rc = segment_strategies(c, in, h, &w, i, err);
    if (rc == MKV_OK && c->dynamic && c->ratio > 0)
        ratio_strategies(c, h, &w);
    if (rc == MKV_OK)
        rc = encode_tensor(h, in->k, 1, &w, &h->k, err);
    if (rc == MKV_OK)
        rc = encode_tensor(h, in->v, 0, &w, &h->v, err);
    compress_work_free(&w);
    if (rc != MKV_OK) {
        mkv_error_prefix(err, "layer %d, KV head %d", in->layer, in->head);
        mkv_mosaic_head_free(h);
    }
    return rc;
}

/* ---------------------------------------------------------------- attention */

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

/* Segments starting <= p, and their blocks starting <= p. */
static int64_t visible(const mkv_mosaic_tensor *K, int B, int64_t p, int64_t *nblk)
{
    int64_t nsc = 0;
    *nblk = 0;
    for (; nsc < K->nseg && K->seg[nsc].start <= p; nsc++) {
        int64_t nb = mkv_mosaic_nblocks(K->seg[nsc].len, B), upto = (p - K->seg[nsc].start) / B + 1;
        *nblk += upto < nb ? upto : nb;
    }
    return nsc;
}

/* out[c] = sum_j q[j] R[j][c] (R fp16) for the columns c < a multiple of
 * eight, in AVX2 and F16C where the CPU has them: each column summed over
 * j in order, multiply then add, as the scalar loop below; returns the
 * columns done. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2,f16c"))) static int rotate_columns_avx2_impl(const float *q, const uint16_t *R, int d,
                                                                       int cols, double *out)
{
    int c0 = 0;
    for (; c0 + 8 <= cols; c0 += 8) {
        __m256d s0 = _mm256_setzero_pd(), s1 = s0;
        for (int j = 0; j < d; j++) {
            __m256d x = _mm256_set1_pd((double)q[j]);
            __m256 r = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(R + (size_t)j * cols + c0)));
            s0 = _mm256_add_pd(s0, _mm256_mul_pd(x, _mm256_cvtps_pd(_mm256_castps256_ps128(r))));
            s1 = _mm256_add_pd(s1, _mm256_mul_pd(x, _mm256_cvtps_pd(_mm256_extractf128_ps(r, 1))));
        }
        _mm256_storeu_pd(out + c0, s0);
        _mm256_storeu_pd(out + c0 + 4, s1);
    }
    return c0;
}
#endif

static int rotate_columns_avx2(const float *q, const uint16_t *R, int d, int cols, double *out)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (have_avx2())
        return rotate_columns_avx2_impl(q, R, d, cols, out);
#endif
    (void)q, (void)R, (void)d, (void)cols, (void)out;
    return 0;
}

/* q~ [G][d] = q R_k over the stored columns of segment si (q itself when
 * not rotated). */
static void rotate_queries(const mkv_mosaic_head *h, int64_t si, const float *q, int G, double *qt)
{
    const mkv_mosaic_tensor *K = &h->k;
    const mkv_mosaic_strategy *ks = &K->seg[si];
    int d = h->d, cols = ks->rotate ? mkv_mosaic_rotation_cols(ks) : d;
    const uint16_t *Rk = ks->rotate ? K->rotation + K->off_rotation[si] : NULL;
    float row[MKV_MOSAIC_MAX_D];
    for (int g = 0; g < G; g++) {
        const float *qg = q + (size_t)g * d;
        double *out = qt + (size_t)g * d;
        if (!Rk) {
            for (int c = 0; c < cols; c++)
                out[c] = qg[c];
            continue;
        }
        /* each column sums j = 0..d-1 in order */
        int c0 = rotate_columns_avx2(qg, Rk, d, cols, out);
        for (int c = c0; c < cols; c++)
            out[c] = 0;
        for (int j = 0; j < d && c0 < cols; j++) {
            mkv_f16_to_f32_n(Rk + (size_t)j * cols + c0, row, (size_t)(cols - c0));
            double x = qg[j];
            for (int c = c0; c < cols; c++)
                out[c] += x * row[c - c0];
        }
    }
}

/* Step 3b: of the compressed tokens att marks (the candidates), keep the
 * `keep` best by agg_h q~_h . k~ * scale over their compressed keys (or
 * q_h . k with exact_k's rows), ties to the earlier token; the others are
 * unmarked. Adds the bytes of the compressed keys read to *bytes. Returns
 * 0, or -1 when out of memory. */
static int refine_tokens(const mkv_mosaic_head *h, const mkv_mosaic_attn_opts *o, const float *q, const double *qt,
                         const float *exact_k, int G, int64_t p, double scale, int64_t keep, uint8_t *att,
                         uint64_t *bytes)
{
    const mkv_mosaic_tensor *K = &h->k;
    int d = h->d;
    int64_t n = 0;
    for (int64_t si = 0; si < K->nseg && K->seg[si].start <= p; si++)
        for (int64_t t = K->seg[si].start; t < K->seg[si].start + K->seg[si].len && t <= p; t++)
            n += att[t];
    if (keep < 0)
        keep = 0;
    if (n <= keep)
        return 0;
    scored_block *cand = malloc(sizeof *cand * (size_t)n);
    if (!cand)
        return -1;
    int pos[MKV_MOSAIC_MAX_D];
    float buf[MKV_MOSAIC_MAX_D];
    n = 0;
    for (int64_t si = 0; si < K->nseg && K->seg[si].start <= p; si++) {
        const mkv_mosaic_strategy *ks = &K->seg[si];
        const double *qs = qt + (size_t)si * G * d;
        int kbb = mkv_mosaic_bitmap_bytes(ks);
        int64_t group = -1;
        if (!kbb)
            mkv_mosaic_positions(NULL, ks, pos);
        for (int64_t t = ks->start; t < ks->start + ks->len && t <= p; t++) {
            if (!att[t])
                continue;
            int64_t i = t - ks->start;
            const float *x = NULL;
            if (!exact_k) {
                if (kbb)
                    mkv_mosaic_positions(K->bitmap + K->off_bitmap[si] + i * kbb, ks, pos);
                x = mkv_mosaic_vector_values(K, si, i, pos, buf);
                *bytes += (uint64_t)(mkv_mosaic_vector_bytes(ks) + kbb) + mkv_mosaic_qparams_read(ks, i, &group);
            }
            double agg = 0;
            for (int g = 0; g < G; g++) {
                double dot = 0;
                if (exact_k)
                    dot = dot_fd(q + (size_t)g * d, exact_k + t * d, d);
                else
                    for (int j = 0; j < ks->r; j++)
                        dot += qs[(size_t)g * d + pos[j]] * (double)x[j];
                double sc = dot * scale;
                agg = g == 0 ? sc : o->agg_sum ? agg + sc : sc > agg ? sc : agg;
            }
            cand[n++] = (scored_block){.score = agg, .seg = si, .block = t, .order = t};
        }
    }
    select_best(cand, n, keep);
    for (int64_t i = keep; i < n; i++)
        att[cand[i].block] = 0;
    free(cand);
    return 0;
}

int64_t mkv_mosaic_select_tokens(const mkv_mosaic_head *h, const mkv_mosaic_attn_opts *o, const float *q,
                                 int G, int64_t p, double scale, const float *exact_k, double *qt, uint8_t *att,
                                 uint64_t *key_bytes)
{
    const mkv_mosaic_tensor *K = &h->k;
    int d = h->d, B = h->block;
    int64_t budget = mkv_budget_tokens(o->budget, p + 1), count = 0, nblk;
    /* step 3 gathers refine x the budget (at most every visible token) */
    int64_t want = budget;
    if (o->refine > 1) {
        double w = ceil(o->refine * (double)budget);
        want = w < (double)(p + 1) ? (int64_t)w : p + 1;
    }
    if (key_bytes)
        *key_bytes = 0;
    for (int64_t i = 0; i < h->sink_n + h->recent_n; i++) {
        int64_t t = dense_token(h, i);
        if (t <= p) {
            att[t] = 1;
            count++;
        }
    }
    int64_t nsc = visible(K, B, p, &nblk), n = 0;
    scored_block *blk = malloc(sizeof *blk * (size_t)(nblk ? nblk : 1));
    double *gscore = malloc(sizeof *gscore * 4 * (size_t)(nblk ? nblk : 1));   /* four query heads' block scores */
    double q4[4 * MKV_MOSAIC_MAX_D];
    if (!blk || !gscore) {
        free(blk);
        free(gscore);
        return -1;
    }
    for (int64_t si = 0; si < nsc; si++) {
        const mkv_mosaic_strategy *ks = &K->seg[si];
        double *qs = qt + (size_t)si * G * d;
        rotate_queries(h, si, q, G, qs);
        if (ks->keydim == 0) {
            /* no block keys: attended whole */
            for (int64_t t = ks->start; t < ks->start + ks->len && t <= p; t++, count++)
                att[t] = 1;
            continue;
        }
        int64_t nb = mkv_mosaic_nblocks(ks->len, B), upto = (p - ks->start) / B + 1;
        int64_t nv = upto < nb ? upto : nb;
        const uint16_t *rows = K->blockkeys + K->off_blockkeys[si];
        for (int g0 = 0; g0 < G; g0 += 4) {
            for (int c = 0; c < ks->keydim; c++)
                for (int l = 0; l < 4; l++)
                    q4[4 * c + l] = g0 + l < G ? qs[(size_t)(g0 + l) * d + c] : 0;
            mkv_mosaic_block_scores4(q4, rows, nv, ks->keydim, ks->bound, gscore);
            for (int g = g0; g < G && g < g0 + 4; g++)
                for (int64_t b = 0; b < nv; b++) {
                    double s = gscore[4 * b + g - g0] * scale, *agg = &blk[n + b].score;
                    *agg = g == 0 ? s : o->agg_sum ? *agg + s : s > *agg ? s : *agg;
                }
        }
        for (int64_t b = 0; b < nv; b++, n++) {
            blk[n].seg = si;
            blk[n].block = b;
            blk[n].order = n;
        }
    }
    /* Only the best blocks can be taken: every block but the last visible
     * one of a segment holds B tokens, so the first ceil(need / B) + nsc of
     * the order cover the budget.  Those are put first, then ordered. */
    int64_t dense = count, need = want - count, top = need > 0 ? (need + B - 1) / B + nsc : 0;
    if (top > n)
        top = n;
    select_best(blk, n, top);
    qsort(blk, (size_t)top, sizeof *blk, by_score);
    for (int64_t i = 0; i < top && count < want; i++) {
        const mkv_mosaic_strategy *s = &K->seg[blk[i].seg];
        for (int64_t t = s->start + blk[i].block * B; t < block_end(s, blk[i].block, B, p); t++) {
            att[t] = 1;
            count++;
        }
    }
    free(blk);
    free(gscore);
    if (want > budget && count > budget) {
        uint64_t kb = 0;
        if (refine_tokens(h, o, q, qt, exact_k, G, p, scale, budget - dense, att, &kb) < 0)
            return -1;
        if (key_bytes)
            *key_bytes = kb;
        count = 0;
        for (int64_t t = 0; t <= p && t < h->T; t++)
            count += att[t];
    }
    return count;
}

/* Attended tokens of a segment handled together: their scores are
 * summed side by side, each in its own order. */
#define TOKEN_BATCH 8

/* Working memory of one attention step. */
typedef struct {
    double *quad;         /* [ceil(G/4)][d][4] one segment's rotated queries, heads side by side */
    mkv_osm *tot;         /* [G] per head: all tokens (original space) */
    double *acc;          /* [G][d] accumulators of tot */
    /* one segment's online softmax in its rotated space (mkv_osm's rules),
     * four heads side by side: maxima, sums, accumulators [quads][d][4] */
    double *seg_m, *seg_l, *quad_acc;
    double *back;         /* [4][d] one quad's accumulators rotated back */
    double *dots;         /* [TOKEN_BATCH][G] scores, then [quads][4] weights */
    int *kpos, *vpos;     /* [TOKEN_BATCH][d] the batch's channels */
    float *kbuf, *vbuf;   /* [TOKEN_BATCH][d] the batch's quantized vectors read back */
} attend_work;

static void work_free(attend_work *w)
{
    mkv_free(w->quad);
    mkv_free(w->tot);
    mkv_free(w->acc);
    mkv_free(w->seg_m);
    mkv_free(w->seg_l);
    mkv_free(w->quad_acc);
    mkv_free(w->back);
    mkv_free(w->dots);
    mkv_free(w->kpos);
    mkv_free(w->vpos);
    mkv_free(w->kbuf);
    mkv_free(w->vbuf);
}

static int work_alloc(attend_work *w, int G, int d, mkv_error *err)
{
    memset(w, 0, sizeof *w);
    size_t gd = (size_t)G * (size_t)d, bd = (size_t)TOKEN_BATCH * (size_t)d, lanes = (size_t)(G + 3) / 4 * 4;
    if (!(w->quad = mkv_calloc(lanes * (size_t)d, sizeof *w->quad, "rotated queries", err)) ||
        !(w->tot = mkv_alloc((size_t)G, sizeof *w->tot, "softmax states", err)) ||
        !(w->acc = mkv_alloc(gd, sizeof *w->acc, "accumulators", err)) ||
        !(w->seg_m = mkv_alloc(lanes, sizeof *w->seg_m, "softmax states", err)) ||
        !(w->seg_l = mkv_alloc(lanes, sizeof *w->seg_l, "softmax states", err)) ||
        !(w->quad_acc = mkv_alloc(lanes * (size_t)d, sizeof *w->quad_acc, "accumulators", err)) ||
        !(w->back = mkv_alloc(4 * (size_t)d, sizeof *w->back, "accumulators", err)) ||
        !(w->dots = mkv_alloc(TOKEN_BATCH * (size_t)G + lanes, sizeof *w->dots, "scores", err)) ||
        !(w->kpos = mkv_alloc(bd, sizeof *w->kpos, "channels", err)) ||
        !(w->vpos = mkv_alloc(bd, sizeof *w->vpos, "channels", err)) ||
        !(w->kbuf = mkv_alloc(bd, sizeof *w->kbuf, "values", err)) ||
        !(w->vbuf = mkv_alloc(bd, sizeof *w->vbuf, "values", err))) {
        work_free(w);
        return err ? err->code : MKV_ENOMEM;
    }
    return MKV_OK;
}

/* dot[b * G + g] = sum_j q[g][pos[b][j]] x[b][j] for the nb tokens of a
 * batch (pos [nb][ldp]) and the G heads, each summed in j order like a
 * loop of its own: the scalar form. */
static void batch_dots_scalar(const double *q, int d, int G, const int *pos, int ldp, const float *const *x,
                              int nb, int r, double *dot)
{
    for (int b = 0; b < nb; b++)
        for (int g = 0; g < G; g++) {
            const double *qg = q + (size_t)g * d;
            const int *p = pos + (size_t)b * ldp;
            double s = 0;
            for (int j = 0; j < r; j++)
                s += qg[p[j]] * (double)x[b][j];
            dot[b * G + g] = s;
        }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* The same with four heads in the lanes of one vector (quad [d][4]) and
 * four tokens at a time, so that four sums advance together; each lane
 * multiplies and then adds, as the scalar form does. */
__attribute__((target("avx2"))) static void quad_dots_avx2(const double *quad, const int *pos, int ldp,
                                                         const float *const *x, int nb, int r, double *out)
{
    int b = 0;
    for (; b + 4 <= nb; b += 4) {
        const int *p0 = pos + (size_t)b * ldp, *p1 = p0 + ldp, *p2 = p1 + ldp, *p3 = p2 + ldp;
        const float *x0 = x[b], *x1 = x[b + 1], *x2 = x[b + 2], *x3 = x[b + 3];
        __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
        for (int j = 0; j < r; j++) {
            s0 = _mm256_add_pd(s0, _mm256_mul_pd(_mm256_loadu_pd(quad + 4 * p0[j]), _mm256_set1_pd(x0[j])));
            s1 = _mm256_add_pd(s1, _mm256_mul_pd(_mm256_loadu_pd(quad + 4 * p1[j]), _mm256_set1_pd(x1[j])));
            s2 = _mm256_add_pd(s2, _mm256_mul_pd(_mm256_loadu_pd(quad + 4 * p2[j]), _mm256_set1_pd(x2[j])));
            s3 = _mm256_add_pd(s3, _mm256_mul_pd(_mm256_loadu_pd(quad + 4 * p3[j]), _mm256_set1_pd(x3[j])));
        }
        _mm256_storeu_pd(out + 4 * b, s0);
        _mm256_storeu_pd(out + 4 * b + 4, s1);
        _mm256_storeu_pd(out + 4 * b + 8, s2);
        _mm256_storeu_pd(out + 4 * b + 12, s3);
    }
    for (; b < nb; b++) {
        const int *p = pos + (size_t)b * ldp;
        __m256d s = _mm256_setzero_pd();
        for (int j = 0; j < r; j++)
            s = _mm256_add_pd(s, _mm256_mul_pd(_mm256_loadu_pd(quad + 4 * p[j]), _mm256_set1_pd(x[b][j])));
        _mm256_storeu_pd(out + 4 * b, s);
    }
}

#endif

/* batch_dots_scalar's sums; quad holds the same queries, four heads side
 * by side. */
static void batch_dots(const double *q, const double *quad, int d, int G, const int *pos, int ldp,
                       const float *const *x, int nb, int r, double *dot)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (have_avx2()) {
        double lanes[4 * TOKEN_BATCH];
        for (int g0 = 0; g0 < G; g0 += 4) {
            quad_dots_avx2(quad + (size_t)g0 * d, pos, ldp, x, nb, r, lanes);
            for (int b = 0; b < nb; b++)
                for (int g = g0; g < G && g < g0 + 4; g++)
                    dot[b * G + g] = lanes[4 * b + g - g0];
        }
        return;
    }
#endif
    (void)quad;
    batch_dots_scalar(q, d, G, pos, ldp, x, nb, r, dot);
}

/* The weight of a token of score `score` for head g of the segment's
 * softmax (w->seg_m, seg_l, quad_acc), as mkv_osm_weigh gives it: a new
 * maximum rescales the head's sum and accumulator first. */
static double quad_weigh(attend_work *w, int d, int g, double score)
{
    double *m = &w->seg_m[g], *l = &w->seg_l[g];
    if (score > *m) {
        double f = *m == -INFINITY ? 0 : exp(*m - score), *a = w->quad_acc + (size_t)(g / 4) * 4 * d + g % 4;
        *l *= f;
        for (int c = 0; c < d; c++)
            a[4 * c] *= f;
        *m = score;
        *l += 1.0;
        return 1.0;
    }
    double wt = exp(score - *m);
    *l += wt;
    return wt;
}

/* acc[pos[j]][l] += wt[l] x[j] for the four heads of one quad (acc
 * [d][4]), in j order for each head as mkv_osm_add_sparse adds; a lane
 * without a head has weight 0 and is never read. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* The same with the four lanes of a position in one vector: each lane
 * multiplies and then adds, so the sums are quad_add's. */
__attribute__((target("avx2"))) static void quad_add_avx2(double *acc, const double *wt, const int *pos,
                                                        const float *x, int n)
{
    __m256d w = _mm256_loadu_pd(wt);
    for (int j = 0; j < n; j++) {
        double *a = acc + 4 * (size_t)pos[j];
        _mm256_storeu_pd(a, _mm256_add_pd(_mm256_loadu_pd(a), _mm256_mul_pd(w, _mm256_set1_pd(x[j]))));
    }
}
#endif

static void quad_add(double *acc, const double *wt, const int *pos, const float *x, int n)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (have_avx2()) {
        quad_add_avx2(acc, wt, pos, x, n);
        return;
    }
#endif
    double w0 = wt[0], w1 = wt[1], w2 = wt[2], w3 = wt[3];
    for (int j = 0; j < n; j++) {
        double xj = x[j], *a = acc + 4 * (size_t)pos[j];
        a[0] += w0 * xj;
        a[1] += w1 * xj;
        a[2] += w2 * xj;
        a[3] += w3 * xj;
    }
}

/* The same for a dense key: dot[g] = sum_j q[g][j] k[j]. */
static void dense_dots(const float *q, int d, int G, const float *k, double *dot)
{
    for (int g0 = 0; g0 < G; g0 += 4) {
        const float *q0 = q + (size_t)g0 * d;
        const float *q1 = g0 + 1 < G ? q0 + d : q0, *q2 = g0 + 2 < G ? q0 + 2 * d : q0;
        const float *q3 = g0 + 3 < G ? q0 + 3 * d : q0;
        double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (int j = 0; j < d; j++) {
            double kj = k[j];
            s0 += (double)q0[j] * kj;
            s1 += (double)q1[j] * kj;
            s2 += (double)q2[j] * kj;
            s3 += (double)q3[j] * kj;
        }
        double s[4] = {s0, s1, s2, s3};
        for (int g = g0; g < G && g < g0 + 4; g++)
            dot[g] = s[g - g0];
    }
}

/* Attend the selected compressed tokens (att) of segment si, <= p, and
 * merge into the heads' states w->tot; returns the tokens attended. */
static int64_t attend_segment(const mkv_mosaic_head *h, int64_t si, const double *qt, const uint8_t *att,
                              const mkv_attend_query *q, int keys_read, attend_work *w, uint64_t *bytes_read)
{
    const mkv_mosaic_strategy *ks = &h->k.seg[si], *vs = &h->v.seg[si];
    int d = h->d, G = q->G, kbb = mkv_mosaic_bitmap_bytes(ks), vbb = mkv_mosaic_bitmap_bytes(vs);
    int64_t n = 0, end = ks->start + ks->len < q->pos + 1 ? ks->start + ks->len : q->pos + 1;
    int quads = (G + 3) / 4;
    for (int l = 0; l < 4 * quads; l++) {
        w->seg_m[l] = -INFINITY;
        w->seg_l[l] = 0;
    }
    memset(w->quad_acc, 0, sizeof *w->quad_acc * 4 * (size_t)quads * (size_t)d);
    for (int g0 = 0; g0 < G; g0 += 4)
        for (int c = 0; c < d; c++)
            for (int l = 0; l < 4; l++)
                w->quad[((size_t)g0 * d) + 4 * (size_t)c + l] = g0 + l < G ? qt[(size_t)(g0 + l) * d + c] : 0;
    int64_t kgroup = -1, vgroup = -1, tok[TOKEN_BATCH];
    const float *kval[TOKEN_BATCH], *vval[TOKEN_BATCH];
    /* without a bitmap every vector has the first r channels */
    for (int b = 0; b < TOKEN_BATCH; b++) {
        if (!kbb)
            mkv_mosaic_positions(NULL, ks, w->kpos + (size_t)b * d);
        if (!vbb)
            mkv_mosaic_positions(NULL, vs, w->vpos + (size_t)b * d);
    }
    for (int64_t t = ks->start; t < end;) {
        int nb = 0;
        for (; t < end && nb < TOKEN_BATCH; t++)
            if (att[t])
                tok[nb++] = t - ks->start;
        for (int b = 0; b < nb; b++) {
            int64_t i = tok[b];
            int *kp = w->kpos + (size_t)b * d, *vp = w->vpos + (size_t)b * d;
            if (kbb)
                mkv_mosaic_positions(h->k.bitmap + h->k.off_bitmap[si] + i * kbb, ks, kp);
            if (vbb)
                mkv_mosaic_positions(h->v.bitmap + h->v.off_bitmap[si] + i * vbb, vs, vp);
            kval[b] = mkv_mosaic_vector_values(&h->k, si, i, kp, w->kbuf + (size_t)b * d);
            vval[b] = mkv_mosaic_vector_values(&h->v, si, i, vp, w->vbuf + (size_t)b * d);
        }
        double *dot = w->dots, *wt = w->dots + (size_t)TOKEN_BATCH * G;
        batch_dots(qt, w->quad, d, G, w->kpos, d, kval, nb, ks->r, dot);
        for (int b = 0; b < nb; b++) {
            int64_t i = tok[b];
            for (int l = 0; l < 4 * quads; l++)
                wt[l] = l < G ? quad_weigh(w, d, l, dot[b * G + l] * q->scale) : 0;
            for (int qd = 0; qd < quads; qd++)
                quad_add(w->quad_acc + (size_t)qd * 4 * d, wt + 4 * qd, w->vpos + (size_t)b * d, vval[b], vs->r);
            /* keys the selection already read (step 3b) are not read again */
            if (!keys_read)
                *bytes_read += (uint64_t)(mkv_mosaic_vector_bytes(ks) + kbb) + mkv_mosaic_qparams_read(ks, i, &kgroup);
            *bytes_read += (uint64_t)(mkv_mosaic_vector_bytes(vs) + vbb) + mkv_mosaic_qparams_read(vs, i, &vgroup);
        }
        n += nb;
    }
    if (n == 0)
        return 0;
    const uint16_t *Rv = vs->rotate ? h->v.rotation + h->v.off_rotation[si] : NULL;
    float rrow[MKV_MOSAIC_MAX_D];
    *bytes_read += mkv_mosaic_attended_segment_bytes(vs, d);
    for (int qd = 0; qd < quads; qd++) {
        /* o = o~ R_v^T once per segment: linear, so valid unnormalised;
         * each head's sums in c order */
        const double *a = w->quad_acc + (size_t)qd * 4 * d;
        for (int j = 0; j < d; j++) {
            double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            if (Rv)
                mkv_f16_to_f32_n(Rv + (size_t)j * vs->dprime, rrow, (size_t)vs->dprime);
            if (Rv)
                for (int c = 0; c < vs->dprime; c++) {
                    double r = rrow[c];
                    s0 += a[4 * c] * r;
                    s1 += a[4 * c + 1] * r;
                    s2 += a[4 * c + 2] * r;
                    s3 += a[4 * c + 3] * r;
                }
            else
                s0 = a[4 * j], s1 = a[4 * j + 1], s2 = a[4 * j + 2], s3 = a[4 * j + 3];
            w->back[j] = s0, w->back[d + j] = s1, w->back[2 * d + j] = s2, w->back[3 * d + j] = s3;
        }
        for (int g = 4 * qd; g < G && g < 4 * qd + 4; g++) {
            mkv_osm back = {.m = w->seg_m[g], .l = w->seg_l[g], .acc = w->back + (size_t)(g - 4 * qd) * d, .d = d};
            mkv_osm_merge(&w->tot[g], &back);
        }
    }
    return n;
}

/* One step's attention in MKV_MOSAIC_PIECES pieces: the selection and
 * the rotated queries are shared; piece i attends the segments
 * [first[i], first[i + 1]) (piece 0 also the dense tokens) into softmax
 * states of its own, which the end merges in piece order. */
struct mkv_mosaic_attend_job {
    const mkv_mosaic_head *h;
    mkv_attend_query q;
    const uint8_t *att;
    double *qt;                   /* [nsc][G][d] rotated queries */
    int64_t first[MKV_MOSAIC_PIECES + 1];
    attend_work w[MKV_MOSAIC_PIECES];
    uint64_t bytes[MKV_MOSAIC_PIECES];
    uint64_t key_bytes;           /* compressed keys step 3b read (0: it did not run) */
};

static void job_free(mkv_mosaic_attend_job *j)
{
    if (!j)
        return;
    for (int i = 0; i < MKV_MOSAIC_PIECES; i++)
        work_free(&j->w[i]);
    mkv_free(j->qt);
    mkv_free(j);
}

/* Piece boundaries with about equal attended tokens in each, of the
 * `total` marked (the dense tokens, `dense` of them, count towards piece
 * 0, which attends them). */
static void split_segments(mkv_mosaic_attend_job *j, int64_t nsc, int64_t dense, int64_t total)
{
    const mkv_mosaic_head *h = j->h;
    int64_t seen = dense, si = 0;
    j->first[0] = 0;
    for (int i = 1; i < MKV_MOSAIC_PIECES; i++) {
        /* segments go to piece i - 1 while it holds less than its share */
        while (si < nsc && seen * MKV_MOSAIC_PIECES < total * i) {
            const mkv_mosaic_strategy *s = &h->k.seg[si++];
            for (int64_t t = s->start; t < s->start + s->len && t <= j->q.pos; t++)
                seen += j->att[t];
        }
        j->first[i] = si;
    }
    j->first[MKV_MOSAIC_PIECES] = nsc;
}

int mkv_mosaic_attend_begin(const mkv_mosaic_head *h, const mkv_mosaic_attn_opts *o, const mkv_attend_query *q,
                            mkv_attend_result *res, mkv_mosaic_attend_job **out, mkv_error *err)
{
    *out = NULL;
    int rc = mkv_bl_check_query(q, h->T, h->d, h->G, err);
    if (rc != MKV_OK)
        return rc;
    int d = h->d, G = q->G;
    int64_t nblk, nsc = visible(&h->k, h->block, q->pos, &nblk);
    mkv_mosaic_attend_job *j = mkv_calloc(1, sizeof *j, "an attention step", err);
    if (!j)
        return MKV_ENOMEM;
    j->h = h;
    j->q = *q;
    j->att = res->attended;
    if (!(j->qt = mkv_alloc((size_t)(nsc ? nsc : 1) * (size_t)G * (size_t)d, sizeof *j->qt, "rotated queries",
                            err))) {
        job_free(j);
        return MKV_ENOMEM;
    }
    for (int i = 0; i < MKV_MOSAIC_PIECES; i++)
        if ((rc = work_alloc(&j->w[i], G, d, err)) != MKV_OK) {
            job_free(j);
            return rc;
        }
    int64_t marked = mkv_mosaic_select_tokens(h, o, q->q, G, q->pos, q->scale, NULL, j->qt, res->attended,
                                              &j->key_bytes);
    if (marked < 0) {
        job_free(j);
        return mkv_fail(err, MKV_ENOMEM, "out of memory selecting blocks");
    }
    int64_t dense = 0;
    for (int64_t i = 0; i < h->sink_n + h->recent_n; i++)
        dense += dense_token(h, i) <= q->pos;
    split_segments(j, nsc, dense, marked);
    *out = j;
    return MKV_OK;
}

void mkv_mosaic_attend_piece(mkv_mosaic_attend_job *j, int piece)
{
    const mkv_mosaic_head *h = j->h;
    const mkv_attend_query *q = &j->q;
    attend_work *w = &j->w[piece];
    int d = h->d, G = q->G, B = h->block;
    int64_t p = q->pos;
    uint64_t bytes = 0;
    for (int g = 0; g < G; g++)
        mkv_osm_init(&w->tot[g], w->acc + (size_t)g * d, d);

    /* dense sink and recent tokens: always, exactly */
    for (int64_t i = 0; piece == 0 && i < h->sink_n + h->recent_n; i++) {
        int64_t t = dense_token(h, i);
        if (t > p)
            continue;
        float kd[MKV_MOSAIC_MAX_D], vd[MKV_MOSAIC_MAX_D];
        mkv_f16_to_f32_n(h->dense_k + i * d, kd, (size_t)d);
        mkv_f16_to_f32_n(h->dense_v + i * d, vd, (size_t)d);
        dense_dots(q->q, d, G, kd, w->dots);
        for (int g = 0; g < G; g++)
            mkv_osm_add(&w->tot[g], w->dots[g] * q->scale, vd);
        bytes += (uint64_t)d * 2 * 2;
    }

    /* per visible segment: table rows, R_k, block keys; then its attended tokens */
    for (int64_t si = j->first[piece]; si < j->first[piece + 1]; si++) {
        const mkv_mosaic_strategy *ks = &h->k.seg[si];
        int64_t nb = mkv_mosaic_nblocks(ks->len, B), upto = (p - ks->start) / B + 1;
        bytes += (2 * MKV_MOSAIC_TABLE_COLS + MKV_MOSAIC_BLOCKDIM_COLS) * 4 +
                 (uint64_t)d * (uint64_t)mkv_mosaic_rotation_cols(ks) * 2 +
                 (uint64_t)(upto < nb ? upto : nb) * (uint64_t)mkv_mosaic_block_width(ks) * 2;
        attend_segment(h, si, j->qt + (size_t)si * G * d, j->att, q, j->key_bytes > 0, w, &bytes);
    }
    j->bytes[piece] = bytes;
}

void mkv_mosaic_attend_end(mkv_mosaic_attend_job *j, mkv_attend_result *res)
{
    if (!res) {
        job_free(j);
        return;
    }
    int d = j->h->d, G = j->q.G;
    res->bytes_read = j->key_bytes;
    for (int i = 0; i < MKV_MOSAIC_PIECES; i++) {
        res->bytes_read += j->bytes[i];
        for (int g = 0; i > 0 && g < G; g++)
            mkv_osm_merge(&j->w[0].tot[g], &j->w[i].tot[g]);
    }
    for (int g = 0; g < G; g++) {
        mkv_osm_finish(&j->w[0].tot[g], res->out + (size_t)g * d);
        if (res->lse)
            res->lse[g] = mkv_osm_lse(&j->w[0].tot[g]);
    }
    job_free(j);
}

int mkv_mosaic_attend(const mkv_mosaic_head *h, const mkv_mosaic_attn_opts *o,
                      const mkv_attend_query *q, mkv_attend_result *res, mkv_error *err)
{
    mkv_mosaic_attend_job *j;
    int rc = mkv_mosaic_attend_begin(h, o, q, res, &j, err);
    if (rc != MKV_OK)
        return rc;
    for (int i = 0; i < MKV_MOSAIC_PIECES; i++)
        mkv_mosaic_attend_piece(j, i);
    mkv_mosaic_attend_end(j, res);
    return MKV_OK;
}

/* ---------------------------------------------------------------- method hooks */

static int mosaic_load(const mkv_params *p, mkv_cdump *c, int layer, int head, void **state, mkv_error *err)
{
    return mkv_mosaic_state_load(p, c, layer, head, mkv_mosaic_config_of, state, err);
}

int mkv_mosaic_compress_store(const mkv_mosaic_config *c, const mkv_head_kv *in, mkv_cdump_writer *w,
                              mkv_error *err)
{
    mkv_mosaic_head h;
    int rc = mkv_mosaic_compress(c, in, &h, err);
    if (rc != MKV_OK)
        return rc;
    rc = mkv_mosaic_store(&h, w, in->layer, in->head, err);
    mkv_mosaic_head_free(&h);
    return rc;
}

static int mosaic_compress(const mkv_params *p, const mkv_head_kv *in, mkv_cdump_writer *w,
                           mkv_error *err)
{
    mkv_mosaic_config c;
    mkv_mosaic_config_of(p, in->d, &c);
    return mkv_mosaic_compress_store(&c, in, w, err);
}

static int mosaic_head_budget_rule(const mkv_params *p, mkv_head_budget_rule *rule)
{
    double b = mkv_params_double(p, "budget");
    if (strcmp(mkv_params_str(p, "headbudget"), "on") != 0 || b >= 1)
        return 0;
    *rule = (mkv_head_budget_rule){.mean = b, .floor_frac = b / 4, .sink = mkv_params_int(p, "sink"),
                                   .recent = mkv_params_int(p, "recent")};
    return 1;
}

/* strategy=ratio asks every head for `ratio`; a head whose cheapest
 * strategies, dense rows and tables cost more stays short of it. */
static void mosaic_check_result(const mkv_params *p, const mkv_dump_meta *m, const mkv_cdump_writer *w)
{
    if (strcmp(mkv_params_str(p, "strategy"), "ratio") != 0)
        return;
    double want = mkv_params_double(p, "ratio");
    uint64_t head_logical = 2 * (uint64_t)m->n_tokens * (uint64_t)m->head_dim * 2;
    int heads = m->n_layers * m->n_kv_heads, short_of = 0;
    double lowest = INFINITY;
    for (int l = 0; l < m->n_layers; l++)
        for (int h = 0; h < m->n_kv_heads; h++) {
            uint64_t b = mkv_cdump_head_bytes(w, l, h);
            double got = b ? (double)head_logical / (double)b : INFINITY;
            short_of += got < want;
            lowest = got < lowest ? got : lowest;
        }
    if (!short_of)
        return;
    uint64_t total = mkv_cdump_total_bytes(w);
    mkv_warn("mosaic: ratio=%s requested, %.2f reached (%d of %d heads short of it, the lowest at %.2f): "
             "the most compact strategies with the dense sink and recent tokens, block keys and rotations "
             "take more bytes", mkv_params_str(p, "ratio"),
             total ? (double)head_logical * heads / (double)total : 0.0, short_of, heads, lowest);
}

const mkv_method mkv_method_mosaic = {
    .name = "mosaic",
    .summary = "MosaicKV: per-segment rotation and strategy, per-vector top elements, packed",
    .params = mosaic_params,
    .check = mosaic_check,
    .compress = mosaic_compress,
    .head_budget_rule = mosaic_head_budget_rule,
    .check_result = mosaic_check_result,
    .load = mosaic_load,
    .attend = mkv_mosaic_method_attend,
    .attend_pieces = MKV_MOSAIC_PIECES,
    .attend_begin = mkv_mosaic_method_attend_begin,
    .attend_piece = mkv_mosaic_method_attend_piece,
    .attend_end = mkv_mosaic_method_attend_end,
    .free_state = mkv_mosaic_method_free,
    .append = mkv_mosaic_method_append,
    .state_bytes = mkv_mosaic_method_state_bytes,
    .decode_counters = mkv_mosaic_method_decode_stats,
    .decode_flush = mkv_mosaic_method_flush,
};
