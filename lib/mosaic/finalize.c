/* The dual buffer's finalisation of one closed segment (docs/DESIGN.md
 * 5.3): what mkv_mosaic_compress does for a head that is one segment with
 * no dense tokens and no observation queries -- steps 3 to 6 of
 * lib/mosaic/method.c's COMPRESSION -- except that the rotations come from
 * the Gram matrices the dual buffer accumulated token by token, so the
 * segment's tokens are read only to choose the strategy and to pack them.
 * tests/check_dual_buffer.c checks the result against mkv_mosaic_compress
 * over the same tokens. */
#include "config.h"
#include "mosaic/finalize_priv.h"

#include <math.h>
#include <string.h>

#include "core/tensor.h"

/* Step 5: the strategies of K (which = 0) and V into chosen[]. */
static int choose(const mkv_mosaic_config *c, const float *const X[2], int64_t len, int d, double *const R[2],
                  const double *const evals[2], const mkv_mosaic_strategy base[2], mkv_mosaic_candidate chosen[2],
                  mkv_error *err)
{
    mkv_mosaic_search_opts o[2];
    for (int x = 0; x < 2; x++)
        o[x] = (mkv_mosaic_search_opts){.d = d, .block = x ? 0 : c->block, .keydim = base[x].keydim,
                                        .bound = base[x].bound, .allow_rotate = c->rotate,
                                        .quantize = c->quantize, .qgroup = c->qgroup};
    if (!c->dynamic) {
        for (int x = 0; x < 2; x++) {
            chosen[x] = (mkv_mosaic_candidate){.s = base[x]};
            mkv_mosaic_fixed_strategy(c, d, evals[x], &chosen[x].s);
            int rc = mkv_mosaic_evaluate(&o[x], X[x], R[x], &chosen[x], 1, err);
            if (rc)
                return rc;
        }
        return MKV_OK;
    }
    mkv_mosaic_candidate *cand[2] = {NULL, NULL};
    int ncand[2] = {0, 0}, pick[2] = {0, 0}, rc = MKV_OK;
    for (int x = 0; x < 2 && !rc; x++)
        rc = mkv_mosaic_candidates(&o[x], X[x], 0, len, R[x], &cand[x], &ncand[x], err);
    if (!rc && c->ratio > 0) {
        /* the ratio rule for a head of this one segment */
        mkv_mosaic_allocate(cand, ncand, 2, mkv_mosaic_ratio_budget(c->ratio, len, d, 0, 1, 0), pick);
    } else if (!rc) {
        for (int x = 0; x < 2; x++)
            pick[x] = mkv_mosaic_pick(cand[x], ncand[x], c->threshold);
    }
    for (int x = 0; x < 2 && !rc; x++)
        chosen[x] = cand[x][pick[x]];
    mkv_free(cand[0]);
    mkv_free(cand[1]);
    return rc;
}

/* Step 6: the packed arrays of t (one segment) from its strategy. */
static int pack_tensor(const mkv_mosaic_strategy *s, const float *X, int d, int block, const double *R,
                       mkv_mosaic_tensor *t, mkv_error *err)
{
    mkv_mosaic_bytes b;
    mkv_mosaic_strategy_bytes(s, d, block, &b);
    int quantized = s->bits != 16;
    if (!(t->values = mkv_alloc((size_t)(quantized ? 0 : s->len * s->r) + 1, sizeof *t->values, "packed values", err)) ||
        (quantized && !(t->codes = mkv_alloc((size_t)b.values, 1, "codes", err))) ||
        (quantized && !(t->qparams = mkv_alloc((size_t)b.qparams / 2, sizeof *t->qparams, "zeros and steps", err))) ||
        (b.bitmap && !(t->bitmap = mkv_alloc((size_t)b.bitmap, 1, "bitmaps", err))) ||
        (b.blockkeys && !(t->blockkeys = mkv_alloc((size_t)b.blockkeys / 2, sizeof *t->blockkeys, "block keys", err))) ||
        (b.rotation && !(t->rotation = mkv_alloc((size_t)b.rotation / 2, sizeof *t->rotation, "a rotation", err))))
        return err ? err->code : MKV_ENOMEM;
    int rc = mkv_mosaic_encode(s, X, d, R, block, quantized ? NULL : t->values, t->bitmap, t->codes, t->qparams, t->blockkeys,
                               t->rotation, err);
    return rc ? rc : mkv_mosaic_layout(t, d, block, 0, s->len, err);
}

int mkv_mosaic_finalize_segment(const mkv_mosaic_config *c, const float *k, const float *v, int64_t len, int d,
                                int G, const double *gram_k, const double *gram_v, mkv_mosaic_head *out,
                                mkv_error *err)
{
    memset(out, 0, sizeof *out);
    if (len < 1 || d < 1 || d > MKV_MOSAIC_MAX_D || (c->rotate && (!gram_k || !gram_v)))
        return mkv_fail(err, MKV_EUSAGE, "mosaic: cannot finalise a segment of %lld tokens of head_dim %d",
                        (long long)len, d);
    *out = (mkv_mosaic_head){.d = d, .G = G, .block = c->block, .T = len};
    size_t dd = (size_t)d * (size_t)d;
    double *rot = NULL, *ev = NULL;
    int rc = MKV_OK;
    if (!(out->k.seg = mkv_calloc(1, sizeof *out->k.seg, "a strategy", err)) ||
        !(out->v.seg = mkv_calloc(1, sizeof *out->v.seg, "a strategy", err)) ||
        !(out->k.loss = mkv_calloc(MKV_MOSAIC_LOSS_COLS, sizeof *out->k.loss, "losses", err)) ||
        !(out->v.loss = mkv_calloc(MKV_MOSAIC_LOSS_COLS, sizeof *out->v.loss, "losses", err)) ||
        !(ev = mkv_calloc(2 * (size_t)d, sizeof *ev, "eigenvalues", err)) ||
        (c->rotate && !(rot = mkv_alloc(2 * dd, sizeof *rot, "rotations", err))))
        rc = err ? err->code : MKV_ENOMEM;
    out->k.nseg = out->v.nseg = 1;
    const double *gram[2] = {gram_k, gram_v};
    double *R[2] = {rot, rot ? rot + dd : NULL};
    const double *evals[2] = {ev, ev ? ev + d : NULL};
    /* step 3: decompose the accumulated Gram matrices */
    for (int x = 0; x < 2 && !rc && c->rotate; x++) {
        rc = mkv_mosaic_rotation_from_gram(gram[x], d, R[x], ev + (size_t)x * d, err);
        mkv_mosaic_round_f16(R[x], dd);
    }
    /* step 4: the keys' block-key shape; none when every token is attended */
    int all = c->attn.budget == 1.0;
    mkv_mosaic_strategy base[2] = {{.len = len}, {.len = len}};
    base[0].keydim = all ? 0 : c->rotate ? c->keydim : d;
    base[0].bound = all || !c->rotate ? 0 : c->bound;
    const float *X[2] = {k, v};
    mkv_mosaic_candidate chosen[2];
    if (!rc)
        rc = choose(c, X, len, d, R, evals, base, chosen, err);
    for (int x = 0; x < 2 && !rc; x++) {
        mkv_mosaic_tensor *t = x ? &out->v : &out->k;
        t->seg[0] = chosen[x].s;
        t->loss[0] = (float)chosen[x].energy;
        t->loss[1] = chosen[x].measured ? (float)chosen[x].output : NAN;
        rc = pack_tensor(&t->seg[0], X[x], d, x ? 0 : c->block, R[x], t, err);
    }
    mkv_free(rot);
    mkv_free(ev);
    if (rc)
        mkv_mosaic_head_free(out);
    return rc;
}
