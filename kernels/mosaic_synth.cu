/* Synthetic packed MosaicKV caches on the device (mkv_cuda_mosaic_synth of
 * mkv_cuda.h): the attention benchmark's caches and the long contexts of
 * the decode's speed runs (mkv-decode --fill with mosaic).  Every token
 * keeps exactly r of d' channels, chosen uniformly; values, rotations,
 * block keys and dense rows standard normal (rotations and block keys
 * scaled; with 8-bit block keys their codes uniform and no fp16 rows
 * kept); each segment has its own rotations. */
#include <math.h>
#include <string.h>
#include <vector>

#include "mosaic_attend.cuh"
#include "random.cuh"

using mkv_random::mix64;
using mkv_random::normal_at;
using mkv_random::fill_blocks;

namespace {

__global__ void fill_records(uint8_t *rec, int64_t n_rec, mkv_packed_seg g, int B, uint64_t seed)
{
    const int64_t n = n_rec * B;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint8_t *r = rec + (i / B) * g.rec_bytes;
        const int row = (int)(i % B);
        uint64_t h = mix64(seed ^ (uint64_t)i * 0x9e3779b97f4a7c15ull);
        for (int t = 0; t < 2; t++) {
            const int dch = t == 0 ? g.dpk : g.dpv, keep = t == 0 ? g.rk : g.rv;
            const int nw = t == 0 ? (g.dpk + 31) / 32 : g.dv / 32;
            uint16_t *vals = reinterpret_cast<uint16_t *>(r + (t == 0 ? 0 : g.vval_off)) + row * keep;
            uint32_t *mask = reinterpret_cast<uint32_t *>(r + (t == 0 ? g.kmask_off : g.vmask_off)) + row * nw;
            uint32_t m[4] = {0, 0, 0, 0};
            for (int got = 0; got < keep;) {
                h = mix64(h + 0x632be59bd9b4e019ull);
                const int bit = (int)((h >> 32) % (uint64_t)dch);
                const uint32_t b = 1u << (bit & 31);
#pragma unroll
                for (int w = 0; w < 4; w++)
                    if (w == bit >> 5 && !(m[w] & b)) {
                        m[w] |= b;
                        got++;
                    }
            }
            for (int w = 0; w < nw; w++)
                mask[w] = w == 0 ? m[0] : w == 1 ? m[1] : w == 2 ? m[2] : m[3];
            for (int e = 0; e < keep; e++)
                vals[e] = __half_as_ushort(__float2half_rn(normal_at(seed + 17 + t, (size_t)i * 256 + e)));
        }
    }
}

/* 8-bit block-key rows of w codes in rows of rb bytes: codes uniform on
 * -127..127, zeros past w; scales around those of the fp16 rows' codes. */
__global__ void fill_codes8(int8_t *codes, size_t n, int w, int rb, uint64_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        codes[i] = (int)(i % rb) < w ? (int8_t)((int)(mix64(seed ^ i * 0x9e3779b97f4a7c15ull) % 255) - 127) : 0;
}

__global__ void fill_scales8(float *scales, size_t n, uint64_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        scales[i] = 0.35f * (2.0f + (float)(mix64(seed ^ i * 0x9e3779b97f4a7c15ull) >> 40) / 16777216.0f) / 127.0f;
}

__global__ void fill_16_scaled(uint16_t *dst, size_t n, uint64_t seed, float scale)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __half_as_ushort(__float2half_rn(scale * normal_at(seed, i)));
}

int32_t align16(int64_t x) { return (int32_t)((x + 15) / 16 * 16); }

}  // namespace

extern "C" int mkv_cuda_mosaic_synth_segment(const mkv_packed_synth *s, mkv_packed_seg *g, mkv_error *err)
{
    const int d = s ? s->head_dim : 0;
    if (s == NULL || g == NULL)
        return mkv_fail(err, MKV_EUSAGE, "synthetic packed cache: NULL settings");
    if (s->dprime < 32 || s->dprime > d || s->dprime % 32 || s->r < 1 || s->r > s->dprime || s->kdim < 1 ||
        s->kdim > s->dprime || s->kbound < 0 || s->kbound > s->kdim)
        return mkv_fail(err, MKV_EUSAGE, "synthetic packed cache: d' %d (a multiple of 32 up to %d), r %d, block keys "
                        "of %d channels with %d bounded", s->dprime, d, s->r, s->kdim, s->kbound);
    const int B = s->block, dp = s->dprime, r = s->r;
    memset(g, 0, sizeof *g);
    g->dk = g->dv = g->dpk = g->dpv = dp;
    g->rk = g->rv = r;
    g->gk = g->gv = 1;
    g->pvk = g->pvv = r < dp;
    g->kdim = s->kdim;
    g->kbound = s->kbound;
    g->bk_width = (s->kdim + s->kbound + 7) / 8 * 8;
    g->kmask_off = align16((int64_t)B * r * 2);
    g->vval_off = g->kmask_off + align16((int64_t)B * (dp / 32) * 4);
    g->vmask_off = g->vval_off + align16((int64_t)B * r * 2);
    g->rec_bytes = g->vmask_off + align16((int64_t)B * (dp / 32) * 4);
    return MKV_OK;
}

extern "C" int mkv_cuda_mosaic_synth(const mkv_packed_synth *s, mkv_packed_cache **out, mkv_error *err)
{
    mkv_packed_seg g;
    int rc = mkv_cuda_mosaic_synth_segment(s, &g, err);
    if (rc != MKV_OK)
        return rc;
    if (out == NULL || s->n_heads < 1 || s->tokens < 1 || s->segment < 1 || s->sink < 0 || s->recent < 0 ||
        s->open_tokens < 0)
        return mkv_fail(err, MKV_EUSAGE, "synthetic packed cache: %d heads of %lld tokens, segments of %lld",
                        s->n_heads, (long long)s->tokens, (long long)s->segment);
    if (s->blockkey_bits != 0 && s->blockkey_bits != 16 && s->blockkey_bits != 8)
        return mkv_fail(err, MKV_EUSAGE, "synthetic packed cache: block keys of %d bits; 16 or 8", s->blockkey_bits);
    *out = NULL;
    /* 8-bit keys: every segment's fp16 rows alias one segment's worth, only
     * there for the conversion to place the 8-bit rows */
    const bool keys8 = s->blockkey_bits == 8;
    int64_t most_rows = 1;
    const int D = s->head_dim, B = s->block, n_heads = s->n_heads;
    const int64_t T = s->tokens, S = s->segment;
    const int64_t sink = s->sink < T ? s->sink : T;
    const int64_t recent = s->recent < T - sink ? s->recent : T - sink;
    std::vector<mkv_packed_head> heads;
    std::vector<mkv_packed_seg> segs;
    int64_t rec_off = 0, bk_off = 0, rot_off = 0;
    try {
        heads.resize((size_t)n_heads);
        for (int h = 0; h < n_heads; h++) {
            mkv_packed_head &hd = heads[(size_t)h];
            memset(&hd, 0, sizeof hd);
            hd.T = T;
            hd.dense_row = (int64_t)h * (sink + recent);
            hd.sink_n = (int32_t)sink;
            hd.recent_n = (int32_t)recent;
            hd.first_seg = (int32_t)segs.size();
            int32_t blocks = 0;
            for (int64_t t = sink; t < T - recent; t += S) {
                mkv_packed_seg sg = g;
                sg.start = t;
                sg.len = T - recent - t < S ? T - recent - t : S;
                sg.n_blocks = (int32_t)((sg.len + B - 1) / B);
                sg.first_block = blocks;
                sg.rec_off = rec_off;
                sg.bk_off = keys8 ? 0 : bk_off;
                sg.rk_off = rot_off;
                sg.rv_off = rot_off + (int64_t)D * g.dk;
                rec_off += (int64_t)sg.n_blocks * g.rec_bytes;
                bk_off += (int64_t)sg.n_blocks * g.bk_width;
                rot_off += (int64_t)D * (g.dk + g.dv);
                blocks += sg.n_blocks;
                most_rows = sg.n_blocks > most_rows ? sg.n_blocks : most_rows;
                segs.push_back(sg);
            }
            if (s->open_tokens > 0 && (int32_t)segs.size() > hd.first_seg) {
                /* the last segment's strategy and rotations, room for the decode's tokens */
                mkv_packed_seg sg = segs.back();
                sg.start = T - recent;
                sg.len = 0;
                sg.n_blocks = (int32_t)((s->open_tokens + B - 1) / B);
                sg.first_block = blocks;
                sg.rec_off = rec_off;
                sg.bk_off = keys8 ? 0 : bk_off;
                sg.open = 1;
                rec_off += (int64_t)sg.n_blocks * g.rec_bytes;
                bk_off += (int64_t)sg.n_blocks * g.bk_width;
                blocks += sg.n_blocks;
                most_rows = sg.n_blocks > most_rows ? sg.n_blocks : most_rows;
                segs.push_back(sg);
            }
            hd.n_seg = (int32_t)segs.size() - hd.first_seg;
            hd.n_blocks = blocks;
        }
    } catch (const std::bad_alloc &) {
        return mkv_fail(err, MKV_ENOMEM, "synthetic packed cache: out of host memory");
    }
    mkv_packed_layout l = {};
    l.head_dim = D;
    l.block = B;
    l.n_heads = n_heads;
    l.heads = heads.data();
    l.n_segs = (int64_t)segs.size();
    l.segs = segs.data();
    l.record_bytes = (size_t)rec_off;
    if (keys8)
        bk_off = most_rows * g.bk_width;
    l.n_blockkeys = (size_t)bk_off;
    l.n_rotations = (size_t)rot_off;
    l.n_dense_rows = (int64_t)n_heads * (sink + recent);
    mkv_packed_cache *c = NULL;
    if ((rc = mkv_cuda_mosaic_upload(&l, &c, err)) != MKV_OK)   /* pools NULL: allocated only */
        return rc;
    mkv_packed_pools p;
    if ((rc = mkv_cuda_mosaic_pools(c, &p, err)) != MKV_OK) {
        mkv_cuda_mosaic_free(c);
        return rc;
    }
    const uint64_t seed = s->seed;
    const int64_t n_rec = rec_off / g.rec_bytes;
    fill_records<<<fill_blocks((size_t)(n_rec * B)), 256>>>((uint8_t *)p.records, n_rec, g, B, seed);
    fill_16_scaled<<<fill_blocks((size_t)bk_off), 256>>>(p.blockkeys, (size_t)bk_off, seed + 3, 0.35f);
    fill_16_scaled<<<fill_blocks((size_t)rot_off), 256>>>(p.rotations, (size_t)rot_off, seed + 4,
                                                          (float)(1.0 / sqrt((double)D)));
    const size_t dn = (size_t)l.n_dense_rows * D;
    fill_16_scaled<<<fill_blocks(dn), 256>>>(p.dense_k, dn, seed + 5, 1.f);
    fill_16_scaled<<<fill_blocks(dn), 256>>>(p.dense_v, dn, seed + 6, 1.f);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess)
        e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        mkv_cuda_mosaic_free(c);
        return mkv_fail(err, MKV_EGPU, "synthetic packed cache: %s", cudaGetErrorString(e));
    }
    if (keys8) {
        if ((rc = mkv_cuda_mosaic_blockkeys8(c, err)) != MKV_OK) {
            mkv_cuda_mosaic_free(c);
            return rc;
        }
        fill_codes8<<<fill_blocks(c->bk8_bytes), 256>>>(c->bk8.as<int8_t>(), c->bk8_bytes, g.bk_width,
                                                          mkv_packed::bk8_row_bytes(g.bk_width), seed + 7);
        fill_scales8<<<fill_blocks(c->n_bk8_rows), 256>>>(c->bk8_scales.as<float>(), c->n_bk8_rows, seed + 8);
        e = cudaGetLastError();
        if (e != cudaSuccess) {
            mkv_cuda_mosaic_free(c);
            return mkv_fail(err, MKV_EGPU, "synthetic packed cache: %s", cudaGetErrorString(e));
        }
        if ((rc = mkv_cuda_mosaic_drop_blockkeys16(c, err)) != MKV_OK) {
            mkv_cuda_mosaic_free(c);
            return rc;
        }
    }
    *out = c;
    return MKV_OK;
}
