/* The GPU layout of loaded MosaicKV heads (see gpu_packed.h); the
 * per-method GPU paths are in lib/gpu/gpu_method.c and the files it
 * lists. */
#include "config.h"
#include "gpu/gpu_packed.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/attn.h"
#include "methods/baseline.h"
#include "core/half.h"
#include "core/tensor.h"

static int64_t pad32(int64_t x) { return (x + 31) / 32 * 32; }
static int64_t pad16(int64_t x) { return (x + 15) / 16 * 16; }
static int64_t pad8(int64_t x) { return (x + 7) / 8 * 8; }

/* The block keys of a key strategy: channels, bounded channels, row width,
 * and the stored rotation's columns.  lib/mosaic/mosaic.h either has bounded
 * block keys (keydim, bound; MKV_MOSAIC_BLOCKDIM_COLS defined) or the
 * mean over the d' channels. */
#ifdef MKV_MOSAIC_BLOCKDIM_COLS
static int key_dim(const mkv_mosaic_strategy *s) { return s->keydim; }
static int key_bound(const mkv_mosaic_strategy *s) { return s->bound; }
static int rot_cols(const mkv_mosaic_strategy *s) { return mkv_mosaic_rotation_cols(s); }
#define TABLE_ROW_BYTES ((2 * MKV_MOSAIC_TABLE_COLS + MKV_MOSAIC_BLOCKDIM_COLS) * 4)
#else
static int key_dim(const mkv_mosaic_strategy *s) { return s->dprime; }
static int key_bound(const mkv_mosaic_strategy *s) { (void)s; return 0; }
static int rot_cols(const mkv_mosaic_strategy *s) { return s->rotate ? s->dprime : 0; }
#define TABLE_ROW_BYTES (2 * MKV_MOSAIC_TABLE_COLS * 4)
#endif

/* Record geometry of one segment (K strategy ks, V strategy vs). */
static void geometry(const mkv_mosaic_strategy *ks, const mkv_mosaic_strategy *vs, int d, int B, mkv_packed_seg *s)
{
    s->dk = (int32_t)(ks->rotate ? pad32(rot_cols(ks)) : d);
    s->dv = (int32_t)(vs->rotate ? pad32(vs->dprime) : d);
    s->kdim = key_dim(ks);
    s->kbound = key_bound(ks);
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
static void put_rotation(const float *R, int d, int dp, int dpad, uint16_t *out)
{
    for (int j = 0; j < d; j++)
        for (int c = 0; c < dpad; c++)
            out[(size_t)j * dpad + c] = c < dp ? mkv_f32_to_f16(R[(size_t)j * dp + c]) : 0;
}

int mkv_gpu_layout_build(const mkv_mosaic_head *const *hs, int n, int64_t temp_tokens, mkv_gpu_layout *g,
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
            if (temp && s == h->k.nseg - 1)
                rec_bytes += mkv_mosaic_nblocks(temp_tokens, B) * sg.rec_bytes;
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
        for (int64_t r = 0; r < nd * d; r++) {
            g->dense_k[dense_row * d + r] = mkv_f32_to_f16(h->dense_k[r]);
            g->dense_v[dense_row * d + r] = mkv_f32_to_f16(h->dense_v[r]);
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
                put_rotation(h->k.rotation + h->k.off_rotation[s], d, rot_cols(ks), sg->dk, g->rotations + rot_off);
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
                const float *ksrc = h->k.values + h->k.off_values[s] + t * ks->r;
                const float *vsrc = h->v.values + h->v.off_values[s] + t * vs->r;
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
                        c < kw ? mkv_f32_to_f16(h->k.blockkeys[h->k.off_blockkeys[s] + b * kw + c]) : 0;
            rec_off += (int64_t)sg->n_blocks * sg->rec_bytes;
            bk_off += (int64_t)sg->n_blocks * sg->bk_width;
            blocks += sg->n_blocks;
        }
        if (temp_tokens > 0 && h->k.nseg > 0) {
            mkv_packed_seg *sg = &g->segs[seg_row++];
            *sg = g->segs[seg_row - 2];   /* the last segment's strategy and rotations */
            sg->start = h->T;
            sg->len = 0;
            sg->n_blocks = (int32_t)mkv_mosaic_nblocks(temp_tokens, B);
            sg->first_block = blocks;
            sg->rec_off = rec_off;
            sg->bk_off = -1;
            sg->always = 1;
            rec_off += (int64_t)sg->n_blocks * sg->rec_bytes;
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
            bytes += TABLE_ROW_BYTES + (uint64_t)d * (uint64_t)rot_cols(ks) * 2;
            bytes += (uint64_t)upto * (uint64_t)(key_dim(ks) + key_bound(ks)) * 2;
            const uint64_t per_token = (uint64_t)(ks->r + vs->r) * 2 + (uint64_t)(mkv_mosaic_bitmap_bytes(ks) +
                                                                                mkv_mosaic_bitmap_bytes(vs));
            int any = 0;
            for (int64_t b = 0; b < upto; b++) {
                if (!blocks[id + b])
                    continue;
                int64_t t0 = ks->start + b * B, t1 = t0 + B;
                t1 = t1 < ks->start + ks->len ? t1 : ks->start + ks->len;
                t1 = t1 < pos + 1 ? t1 : pos + 1;
                bytes += (uint64_t)(t1 - t0) * per_token;
                any = 1;
            }
            if (any && vs->rotate)
                bytes += (uint64_t)d * (uint64_t)vs->dprime * 2;
        }
        id += nb;
    }
    return bytes;
}
