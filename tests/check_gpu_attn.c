/* GPU decode attention (kernels/dense_attend.cu, kernels/quest_attend.cu)
 * against CPU references computed here in double precision:
 *  - dense: exact softmax attention over each request's tokens, for bf16
 *    and fp16 K/V, head_dim 64 and 128, 1, 4 and 8 query heads per KV head,
 *    batches of different lengths (0, 1, and lengths that are multiples of
 *    no tile), a long request cut into many splits, and a single head cut
 *    into many small splits.  The relative L2 error of each output row
 *    must be below 1e-3 (the issue allows 1e-2 for bf16 inputs; the inputs
 *    reach the GPU exactly and q, p are carried with ~16 significant bits,
 *    so the error is fp32 rounding);
 *  - Quest: page metadata, scores sum_i max(q_i min_i, q_i max_i) with max
 *    over the group's heads, and the selection rule of mkv_cuda.h, all
 *    recomputed here; the GPU's attended pages must equal the CPU's except
 *    for pages whose score is within rounding of the selection threshold;
 *    the output must match exact attention over the attended pages; with
 *    equal scores the lower pages win; budget 1 equals dense attention;
 *  - refusals: head_dim 96, 16 query heads per KV head, page size 8,
 *    lengths past t_max, unaligned buffers.
 * Outputs are poisoned (all bits set: NaN) before every run.
 *
 * Inputs are random with a fresh seed per run, printed first; set
 * MKV_TEST_SEED to repeat one.  MKV_TEST_QUICK=1 leaves out the long cases
 * (for runs under compute-sanitizer).  CUDA does not survive fork: the suite runs
 * with CK_NOFORK and exits 77 when there is no CUDA build or no GPU, after
 * checking that the entry points then fail cleanly. */
#include <check.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/attn.h"
#include "methods/baseline.h"
#include "core/half.h"
#include "core/mkv.h"
#include "mkv_cuda.h"
#include "gpu_testutil.h"
#include "core/rng.h"

#define TOL 1e-3

static uint64_t seed;
static mkv_rng rng;
static int quick;   /* MKV_TEST_QUICK: skip the long cases */

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    ck_assert_msg(p != NULL, "out of memory (%zu bytes)", bytes);
    return p;
}

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    ck_assert_msg(p != NULL, "out of memory");
    return p;
}

/* ------------------------------------------------------------ test cases */

typedef struct {
    mkv_attn_shape s;
    int64_t *len;
    float *q;          /* [batch][n_heads][d] */
    uint16_t *k, *v;   /* [batch][n_kv][t_max][d] */
} attn_case;

static size_t kv_elems(const mkv_attn_shape *s)
{
    return (size_t)s->batch * s->n_kv_heads * (size_t)s->t_max * s->head_dim;
}

static size_t q_elems(const mkv_attn_shape *s) { return (size_t)s->batch * s->n_heads * s->head_dim; }

static uint16_t to16(float x, int bf16) { return bf16 ? mkv_f32_to_bf16(x) : mkv_f32_to_f16(x); }
static double from16(uint16_t h, int bf16) { return bf16 ? mkv_bf16_to_f32(h) : mkv_f16_to_f32(h); }

/* Random case; rows past a request's length are filled with NaN so that a
 * kernel reading them shows. */
static attn_case make_case(int bf16, int d, int G, int n_kv, int batch, const int64_t *lengths)
{
    attn_case c;
    memset(&c, 0, sizeof c);
    c.s.batch = batch;
    c.s.n_kv_heads = n_kv;
    c.s.n_heads = n_kv * G;
    c.s.head_dim = d;
    c.s.is_bf16 = bf16;
    c.s.scale = 0;
    c.len = xmalloc(sizeof(int64_t) * (size_t)batch);
    int64_t most = 0;
    for (int b = 0; b < batch; b++) {
        c.len[b] = lengths[b];
        most = lengths[b] > most ? lengths[b] : most;
    }
    c.s.t_max = most + 7;   /* rows past the longest request too */
    c.q = xmalloc(sizeof(float) * q_elems(&c.s));
    c.k = xmalloc(sizeof(uint16_t) * kv_elems(&c.s));
    c.v = xmalloc(sizeof(uint16_t) * kv_elems(&c.s));
    for (size_t i = 0; i < q_elems(&c.s); i++)
        c.q[i] = (float)mkv_rng_normal(&rng);
    const uint16_t nan16 = bf16 ? 0x7fc0 : 0x7e00;
    for (int b = 0; b < batch; b++)
        for (int h = 0; h < n_kv; h++)
            for (int64_t t = 0; t < c.s.t_max; t++) {
                size_t row = (((size_t)b * n_kv + h) * (size_t)c.s.t_max + (size_t)t) * d;
                for (int i = 0; i < d; i++) {
                    c.k[row + i] = t < c.len[b] ? to16((float)mkv_rng_normal(&rng), bf16) : nan16;
                    c.v[row + i] = t < c.len[b] ? to16((float)mkv_rng_normal(&rng), bf16) : nan16;
                }
            }
    return c;
}

static void free_case(attn_case *c)
{
    free(c->len);
    free(c->q);
    free(c->k);
    free(c->v);
}

/* Exact attention in double over the tokens t of (b, kv head) with
 * take(t) (all tokens when take is NULL: [b][h][t_max] flags). */
static void cpu_attention(const attn_case *c, const uint8_t *take, double *out)
{
    const mkv_attn_shape *s = &c->s;
    const int d = s->head_dim, G = s->n_heads / s->n_kv_heads;
    const double scale = 1.0 / sqrt((double)d);
    double *sc = xmalloc(sizeof(double) * (size_t)(s->t_max ? s->t_max : 1));
    for (int b = 0; b < s->batch; b++)
        for (int hq = 0; hq < s->n_heads; hq++) {
            const int h = hq / G;
            const size_t head = (size_t)b * s->n_kv_heads + h;
            const uint8_t *tk = take ? take + head * (size_t)s->t_max : NULL;
            const float *q = c->q + ((size_t)b * s->n_heads + hq) * d;
            double *o = out + ((size_t)b * s->n_heads + hq) * d;
            double mx = -INFINITY;
            for (int64_t t = 0; t < c->len[b]; t++) {
                if (tk && !tk[t])
                    continue;
                const uint16_t *kr = c->k + (head * (size_t)s->t_max + (size_t)t) * d;
                double acc = 0;
                for (int i = 0; i < d; i++)
                    acc += (double)q[i] * from16(kr[i], s->is_bf16);
                sc[t] = acc * scale;
                mx = sc[t] > mx ? sc[t] : mx;
            }
            double l = 0;
            for (int i = 0; i < d; i++)
                o[i] = 0;
            for (int64_t t = 0; t < c->len[b]; t++) {
                if (tk && !tk[t])
                    continue;
                const double w = exp(sc[t] - mx);
                const uint16_t *vr = c->v + (head * (size_t)s->t_max + (size_t)t) * d;
                l += w;
                for (int i = 0; i < d; i++)
                    o[i] += w * from16(vr[i], s->is_bf16);
            }
            for (int i = 0; i < d; i++)
                o[i] = l > 0 ? o[i] / l : 0;
        }
    free(sc);
}

/* Largest relative L2 error over the output rows; zero rows (empty
 * requests) must be exactly zero.  Every element must be finite. */
static double max_rel_err(const attn_case *c, const float *gpu, const double *ref, const char *what)
{
    const mkv_attn_shape *s = &c->s;
    const int d = s->head_dim;
    double worst = 0;
    for (int r = 0; r < s->batch * s->n_heads; r++) {
        double num = 0, den = 0;
        for (int i = 0; i < d; i++) {
            const double g = gpu[(size_t)r * d + i], e = ref[(size_t)r * d + i];
            ck_assert_msg(isfinite(g), "%s: row %d element %d not written or not finite (%g)", what, r, i, g);
            num += (g - e) * (g - e);
            den += e * e;
        }
        const double rel = den > 0 ? sqrt(num / den) : sqrt(num);
        worst = rel > worst ? rel : worst;
    }
    return worst;
}

/* ---------------------------------------------------- device round trips */

typedef struct {
    float *q, *out;
    uint16_t *k, *v;
} dev_case;

static void *dalloc(size_t bytes)
{
    mkv_error err = {0};
    void *p = NULL;
    ck_assert_msg(mkv_cuda_malloc(&p, bytes, &err) == MKV_OK, "%s", err.msg);
    return p;
}

static dev_case upload_case(const attn_case *c)
{
    dev_case dc;
    mkv_error err = {0};
    dc.q = dalloc(sizeof(float) * q_elems(&c->s));
    dc.out = dalloc(sizeof(float) * q_elems(&c->s));
    dc.k = dalloc(sizeof(uint16_t) * kv_elems(&c->s));
    dc.v = dalloc(sizeof(uint16_t) * kv_elems(&c->s));
    ck_assert_msg(mkv_cuda_upload(dc.q, c->q, sizeof(float) * q_elems(&c->s), &err) == MKV_OK, "%s", err.msg);
    ck_assert_msg(mkv_cuda_upload(dc.k, c->k, sizeof(uint16_t) * kv_elems(&c->s), &err) == MKV_OK, "%s", err.msg);
    ck_assert_msg(mkv_cuda_upload(dc.v, c->v, sizeof(uint16_t) * kv_elems(&c->s), &err) == MKV_OK, "%s", err.msg);
    return dc;
}

static void free_dev(dev_case *dc)
{
    mkv_cuda_free(dc->q);
    mkv_cuda_free(dc->out);
    mkv_cuda_free(dc->k);
    mkv_cuda_free(dc->v);
}

static void poison(const attn_case *c, dev_case *dc)
{
    mkv_error err = {0};
    ck_assert_msg(mkv_cuda_memset(dc->out, 0xff, sizeof(float) * q_elems(&c->s), &err) == MKV_OK, "%s", err.msg);
}

static void download_out(const attn_case *c, const dev_case *dc, float *out)
{
    mkv_error err = {0};
    ck_assert_msg(mkv_cuda_synchronize(&err) == MKV_OK, "kernel failed: %s", err.msg);
    ck_assert_msg(mkv_cuda_download(out, dc->out, sizeof(float) * q_elems(&c->s), &err) == MKV_OK, "%s", err.msg);
}

static int dense_splits;   /* work items of the last dense plan */

static void gpu_dense(const attn_case *c, dev_case *dc, float *out)
{
    mkv_error err = {0};
    mkv_dense_plan *p = NULL;
    ck_assert_msg(mkv_cuda_dense_plan(&c->s, c->len, &p, &err) == MKV_OK, "dense plan: %s", err.msg);
    dense_splits = mkv_cuda_dense_plan_splits(p);
    poison(c, dc);
    int rc = mkv_cuda_dense_run(p, dc->q, dc->k, dc->v, dc->out, NULL, &err);
    mkv_cuda_dense_plan_free(p);
    ck_assert_msg(rc == MKV_OK, "dense run: %s", err.msg);
    download_out(c, dc, out);
}

static const char *dtype_name(int bf16) { return bf16 ? "bf16" : "fp16"; }

/* Dense GPU vs CPU on one case; returns the error. */
static double check_dense_case(const attn_case *c, const char *label)
{
    dev_case dc = upload_case(c);
    float *out = xmalloc(sizeof(float) * q_elems(&c->s));
    double *ref = xmalloc(sizeof(double) * q_elems(&c->s));
    gpu_dense(c, &dc, out);
    cpu_attention(c, NULL, ref);
    char what[200];
    snprintf(what, sizeof what, "dense %s d=%d G=%d %s", dtype_name(c->s.is_bf16), c->s.head_dim,
             c->s.n_heads / c->s.n_kv_heads, label);
    const double e = max_rel_err(c, out, ref, what);
    printf("  %-48s splits %4d  max rel err %.2e\n", what, dense_splits, e);
    ck_assert_msg(e <= TOL, "%s: relative error %.3e > %.0e", what, e, TOL);
    free(out);
    free(ref);
    free_dev(&dc);
    return e;
}

/* ------------------------------------------------------------ dense tests */

START_TEST(test_dense_shapes)
{
    static const int dims[] = {64, 128}, groups[] = {1, 4, 8};
    for (int bf16 = 1; bf16 >= 0; bf16--)
        for (int di = 0; di < 2; di++)
            for (int gi = 0; gi < 3; gi++) {
                /* 0 and 1 token, 17 (one tile and a bit), and two lengths
                 * that are multiples of nothing in particular. */
                const int64_t len[5] = {0, 1, 17, 700 + (int64_t)mkv_rng_below(&rng, 300),
                                        2000 + 16 * (int64_t)mkv_rng_below(&rng, 100) + 1
                                            + (int64_t)mkv_rng_below(&rng, 15)};
                attn_case c = make_case(bf16, dims[di], groups[gi], 2, 5, len);
                check_dense_case(&c, "batch 0/1/17/~850/~2800");
                free_case(&c);
            }
}
END_TEST

/* A long request next to a short one, 8 KV heads of 4 query heads
 * (LLaMA-3 shape): many chunks per head, merged. */
START_TEST(test_dense_long)
{
    if (quick)
        return;
    const int64_t len[2] = {70001 + (int64_t)mkv_rng_below(&rng, 1000), 333};
    attn_case c = make_case(1, 128, 4, 8, 2, len);
    check_dense_case(&c, "70K + 333 tokens, 8 KV heads");
    free_case(&c);
}
END_TEST

/* One head: its tiles are spread over all resident blocks in small chunks. */
START_TEST(test_dense_many_splits)
{
    const int64_t len[1] = {5000 + (int64_t)mkv_rng_below(&rng, 100)};
    attn_case c = make_case(0, 64, 4, 1, 1, len);
    check_dense_case(&c, "one head of ~5000 tokens");
    ck_assert_msg(dense_splits > 8, "expected the head to be split, got %d items", dense_splits);
    free_case(&c);
}
END_TEST

/* One block per head: every warp walks a long chunk alone. */
START_TEST(test_dense_one_split)
{
    const int64_t len[2] = {9000 + (int64_t)mkv_rng_below(&rng, 100), 4321};
    attn_case c = make_case(1, 128, 4, 2, 2, len);
    setenv("MKV_ATTN_BLOCKS", "1", 1);
    check_dense_case(&c, "one split per head");
    unsetenv("MKV_ATTN_BLOCKS");
    ck_assert_msg(dense_splits == 4, "expected 4 items (one per head), got %d", dense_splits);
    free_case(&c);
}
END_TEST

/* The host-buffer wrapper gives the same numbers as the device API. */
START_TEST(test_dense_host_wrapper)
{
    const int64_t len[3] = {300, 1, 1234};
    attn_case c = make_case(1, 128, 8, 1, 3, len);
    float *out = xmalloc(sizeof(float) * q_elems(&c.s));
    double *ref = xmalloc(sizeof(double) * q_elems(&c.s));
    for (size_t i = 0; i < q_elems(&c.s); i++)
        out[i] = NAN;
    mkv_error err = {0};
    ck_assert_msg(mkv_cuda_dense_attend_host(&c.s, c.len, c.q, c.k, c.v, out, &err) == MKV_OK, "%s", err.msg);
    cpu_attention(&c, NULL, ref);
    const double e = max_rel_err(&c, out, ref, "dense host wrapper");
    ck_assert_msg(e <= TOL, "host wrapper: relative error %.3e", e);
    free(out);
    free(ref);
    free_case(&c);
}
END_TEST

/* ---------------------------------------------------------------- Quest */

/* The CPU Quest method's selection (lib/methods/baseline.h) for (b, KV head
 * h) of a cache of T tokens and a query at n - 1: attended [T] (zeroed
 * here) and, for near-tie judgement, the score of every page and the score
 * of the last page the greedy walk took (INFINITY when it took none). */
static void cpu_quest(const attn_case *c, int b, int h, int64_t T, const mkv_quest_params *qp, uint8_t *attended,
                      double *score, double *last_score)
{
    const mkv_attn_shape *s = &c->s;
    const int d = s->head_dim, G = s->n_heads / s->n_kv_heads;
    const int64_t n = c->len[b], pages = mkv_bl_pages(T, qp->page_size);
    const size_t head = (size_t)b * s->n_kv_heads + h;
    float *kf = xmalloc(sizeof(float) * (size_t)(T ? T : 1) * d);
    float *mn = xmalloc(sizeof(float) * (size_t)(pages ? pages : 1) * d);
    float *mx = xmalloc(sizeof(float) * (size_t)(pages ? pages : 1) * d);
    for (int64_t t = 0; t < T; t++)
        for (int i = 0; i < d; i++)
            kf[t * d + i] = (float)from16(c->k[(head * (size_t)s->t_max + (size_t)t) * d + i], s->is_bf16);
    mkv_bl_page_minmax(kf, T, d, qp->page_size, mn, mx);
    mkv_bl_selection sel = {qp->sink, qp->recent, qp->page_size, qp->budget, qp->agg_sum};
    memset(attended, 0, (size_t)(T ? T : 1));
    *last_score = INFINITY;
    if (n > 0) {
        const float *q = c->q + ((size_t)b * s->n_heads + (size_t)h * G) * d;
        const int64_t visible = mkv_bl_score_pages(&sel, q, G, d, mn, mx, n - 1, score);
        mkv_error err = {0};
        ck_assert_msg(mkv_bl_select(&sel, score, T, n - 1, attended, &err) >= 0, "%s", err.msg);
        /* Replay the greedy walk for the threshold score. */
        uint8_t *seen = xcalloc((size_t)T, 1);
        int64_t count = 0;
        const int64_t budget = mkv_budget_tokens(qp->budget, n);
        const int64_t sink_end = qp->sink < n ? qp->sink : n;
        const int64_t recent_start = T - qp->recent > sink_end ? T - qp->recent : sink_end;
        for (int64_t t = 0; t < n; t++)
            if (t < sink_end || t >= recent_start) {
                seen[t] = 1;
                count++;
            }
        uint8_t *used = xcalloc((size_t)visible, 1);
        while (count < budget) {
            int64_t best = -1;
            for (int64_t pg = 0; pg < visible; pg++)
                if (!used[pg] && (best < 0 || score[pg] > score[best]))
                    best = pg;
            if (best < 0)
                break;
            used[best] = 1;
            *last_score = score[best];
            for (int64_t t = best * qp->page_size; t < (best + 1) * qp->page_size && t < n; t++)
                if (!seen[t]) {
                    seen[t] = 1;
                    count++;
                }
        }
        free(used);
        free(seen);
    }
    free(kf);
    free(mn);
    free(mx);
}

/* Run Quest on the GPU; its attended tokens must be the CPU method's
 * except for pages whose score sits at the selection threshold, and its
 * output must match exact attention over the tokens it attended.
 * cache: tokens per request's cache (NULL: the lengths).  Returns the
 * number of pages that differed (near-ties). */
static int check_quest_case(const attn_case *c, const int64_t *cache, const mkv_quest_params *qp, const char *label,
                            float *out_keep)
{
    const mkv_attn_shape *s = &c->s;
    mkv_error err = {0};
    mkv_quest_plan *p = NULL;
    ck_assert_msg(mkv_cuda_quest_plan(s, c->len, cache, qp, &p, &err) == MKV_OK, "quest plan: %s", err.msg);
    const int64_t pages_max = mkv_cuda_quest_pages_max(p);
    dev_case dc = upload_case(c);
    uint16_t *meta = dalloc(2 * mkv_cuda_quest_meta_elems(p));
    ck_assert_msg(mkv_cuda_quest_build_meta(p, dc.k, meta, NULL, &err) == MKV_OK, "%s", err.msg);
    poison(c, &dc);
    ck_assert_msg(mkv_cuda_quest_select(p, dc.q, meta, NULL, &err) == MKV_OK, "quest select: %s", err.msg);
    ck_assert_msg(mkv_cuda_quest_attend(p, dc.q, dc.k, dc.v, dc.out, NULL, &err) == MKV_OK, "quest attend: %s", err.msg);
    float *out = xmalloc(sizeof(float) * q_elems(s));
    download_out(c, &dc, out);
    const size_t heads = (size_t)s->batch * s->n_kv_heads;
    int32_t *pages = xmalloc(sizeof(int32_t) * heads * (size_t)pages_max);
    int32_t *counts = xmalloc(sizeof(int32_t) * heads);
    int64_t *tokens = xmalloc(sizeof(int64_t) * heads);
    ck_assert_msg(mkv_cuda_quest_selection(p, pages, counts, tokens, &err) == MKV_OK, "%s", err.msg);

    char what[200];
    snprintf(what, sizeof what, "quest %s d=%d G=%d P=%d %s", dtype_name(s->is_bf16), s->head_dim,
             s->n_heads / s->n_kv_heads, qp->page_size, label);
    const size_t tm = (size_t)(s->t_max ? s->t_max : 1);
    uint8_t *take = xcalloc(heads * tm, 1);
    uint8_t *want = xmalloc(tm);
    double *score = xmalloc(sizeof(double) * tm);
    int differ = 0;
    for (int b = 0; b < s->batch; b++) {
        const int64_t n = c->len[b], T = cache ? cache[b] : n, P = qp->page_size;
        mkv_quest_counts qc;
        ck_assert_msg(mkv_cuda_quest_counts(p, b, &qc, &err) == MKV_OK, "%s", err.msg);
        const int64_t sink_end = qp->sink < n ? qp->sink : n;
        const int64_t recent_start = T - qp->recent > sink_end ? T - qp->recent : sink_end;
        for (int h = 0; h < s->n_kv_heads; h++) {
            const size_t head = (size_t)b * s->n_kv_heads + h;
            double last = INFINITY;
            cpu_quest(c, b, h, T, qp, want, score, &last);
            ck_assert_msg(counts[head] >= 0 && counts[head] <= qc.max_pages,
                          "%s: request %d head %d lists %d pages, plan bound %lld", what, b, h, counts[head],
                          (long long)qc.max_pages);
            uint8_t *got = take + head * tm;
            const int32_t *list = pages + head * (size_t)pages_max;
            int64_t n_got = 0;
            for (int i = 0; i < counts[head]; i++) {
                const int e = list[i], pg = e >= 0 ? e : -1 - e;
                ck_assert_msg(pg * P < n, "%s: page %d out of range", what, pg);
                if (i > 0) {
                    const int prev = list[i - 1] >= 0 ? list[i - 1] : -1 - list[i - 1];
                    ck_assert_msg(pg > prev, "%s: page list not ascending at %d", what, i);
                }
                for (int64_t t = pg * P; t < (pg + 1) * P && t < n; t++)
                    if (e >= 0 || t < sink_end || t >= recent_start) {
                        got[t] = 1;
                        n_got++;
                    }
            }
            ck_assert_msg(tokens[head] == n_got, "%s: request %d head %d: %lld tokens reported, %lld listed", what, b,
                          h, (long long)tokens[head], (long long)n_got);
            for (int64_t pg = 0; pg * P < n; pg++) {
                int same = 1;
                for (int64_t t = pg * P; t < (pg + 1) * P && t < n; t++)
                    same &= got[t] == want[t];
                if (same)
                    continue;
                /* Only a page scored at the threshold may go the other way. */
                const double tol = 1e-4 * (fabs(last) + 1.0);
                ck_assert_msg(isfinite(last) && fabs(score[pg] - last) <= tol,
                              "%s: request %d head %d page %lld: GPU and CPU attend different tokens "
                              "(score %.9g, threshold %.9g)",
                              what, b, h, (long long)pg, score[pg], last);
                differ++;
            }
        }
    }
    double *ref = xmalloc(sizeof(double) * q_elems(s));
    cpu_attention(c, take, ref);
    const double e = max_rel_err(c, out, ref, what);
    printf("  %-60s near-tie pages %d  max rel err %.2e\n", what, differ, e);
    ck_assert_msg(e <= TOL, "%s: relative error %.3e > %.0e", what, e, TOL);
    if (out_keep)
        memcpy(out_keep, out, sizeof(float) * q_elems(s));
    free(ref);
    free(take);
    free(want);
    free(score);
    free(pages);
    free(counts);
    free(tokens);
    free(out);
    mkv_cuda_free(meta);
    free_dev(&dc);
    mkv_cuda_quest_plan_free(p);
    return differ;
}

START_TEST(test_quest_shapes)
{
    static const int dims[] = {64, 128}, groups[] = {1, 4, 8};
    mkv_quest_params qp = {16, 4, 64, 0.1, 0};
    for (int bf16 = 1; bf16 >= 0; bf16--)
        for (int di = 0; di < 2; di++)
            for (int gi = 0; gi < 3; gi++) {
                const int64_t len[4] = {3000 + (int64_t)mkv_rng_below(&rng, 2000),
                                        1500 + (int64_t)mkv_rng_below(&rng, 16), 100, 0};
                attn_case c = make_case(bf16, dims[di], groups[gi], 2, 4, len);
                check_quest_case(&c, NULL, &qp, "budget 10%", NULL);
                free_case(&c);
            }
}
END_TEST

/* Larger pages, no sink or recent, a budget in tokens, sum over the heads,
 * sink and recent not page-aligned, a long request (thousands of pages,
 * several 1024-page rounds of the selection), and few blocks so that each
 * warp walks hundreds of pages past several batches of its page-list
 * prefetch. */
START_TEST(test_quest_variants)
{
    if (quick)
        return;
    const int64_t len[2] = {40000 + (int64_t)mkv_rng_below(&rng, 5000), 777};
    attn_case c = make_case(1, 128, 4, 4, 2, len);
    mkv_quest_params a = {32, 0, 0, 900, 0};
    check_quest_case(&c, NULL, &a, "no sink/recent, 900 tokens", NULL);
    mkv_quest_params b = {16, 4, 64, 0.25, 1};
    check_quest_case(&c, NULL, &b, "budget 25%, sum over heads", NULL);
    mkv_quest_params d = {64, 100, 300, 0.0625, 0};
    check_quest_case(&c, NULL, &d, "sink 100, recent 300, 6.25%", NULL);
    mkv_quest_params e = {16, 4, 64, 0.25, 0};
    setenv("MKV_ATTN_BLOCKS", "3", 1);
    check_quest_case(&c, NULL, &e, "budget 25%, 3 blocks", NULL);
    unsetenv("MKV_ATTN_BLOCKS");
    free_case(&c);
}
END_TEST

/* Queries before the end of the cache (an offline dump): the recent window
 * and the page metadata follow the cache, attention stops at the query. */
START_TEST(test_quest_cache_longer)
{
    const int64_t cache[3] = {2500 + (int64_t)mkv_rng_below(&rng, 100), 1200, 300};
    attn_case c = make_case(0, 64, 4, 2, 3, cache);
    c.len[0] = cache[0] - 30;     /* inside the recent window */
    c.len[1] = cache[1] - 500;    /* before it */
    c.len[2] = 17;
    mkv_quest_params qp = {16, 4, 64, 0.2, 0};
    check_quest_case(&c, cache, &qp, "queries inside the cache", NULL);
    free_case(&c);
}
END_TEST

/* Every page has the same keys, so every score is equal: the pages must
 * be taken from the lowest. */
START_TEST(test_quest_ties)
{
    const int64_t len[1] = {16 * 200 + 5};
    attn_case c = make_case(1, 64, 4, 1, 1, len);
    for (int64_t t = 16; t < len[0]; t++)
        memcpy(c.k + (size_t)t * 64, c.k + (size_t)(t % 16) * 64, 64 * sizeof(uint16_t));
    mkv_quest_params qp = {16, 4, 64, 0.1, 0};
    const int differ = check_quest_case(&c, NULL, &qp, "all scores equal", NULL);
    ck_assert_msg(differ == 0, "equal scores: %d pages differ from the lowest-index choice", differ);
    free_case(&c);
}
END_TEST

/* Budget 1 attends everything: the output equals dense attention. */
START_TEST(test_quest_full_budget)
{
    const int64_t len[3] = {5000 + (int64_t)mkv_rng_below(&rng, 100), 64, 1};
    attn_case c = make_case(1, 128, 8, 2, 3, len);
    mkv_quest_params qp = {16, 4, 64, 1.0, 0};
    float *quest = xmalloc(sizeof(float) * q_elems(&c.s)), *dense = xmalloc(sizeof(float) * q_elems(&c.s));
    check_quest_case(&c, NULL, &qp, "budget 100%", quest);
    dev_case dc = upload_case(&c);
    gpu_dense(&c, &dc, dense);
    double worst = 0;
    for (size_t i = 0; i < q_elems(&c.s); i++) {
        const double diff = fabs((double)quest[i] - dense[i]);
        worst = diff > worst ? diff : worst;
    }
    printf("  quest at budget 1 vs dense: max abs difference %.2e\n", worst);
    ck_assert_msg(worst <= 1e-4, "quest at budget 1 differs from dense by %.3e", worst);
    free(quest);
    free(dense);
    free_dev(&dc);
    free_case(&c);
}
END_TEST

/* ---------------------------------------------------------------- refusals */

START_TEST(test_refusals)
{
    mkv_error err = {0};
    int64_t len[2] = {10, 20};
    mkv_attn_shape s = {2, 8, 2, 96, 32, 1, 0};
    mkv_dense_plan *dp = (mkv_dense_plan *)&s;   /* must be reset to NULL */
    ck_assert_int_eq(mkv_cuda_dense_plan(&s, len, &dp, &err), MKV_EUNSUP);
    ck_assert_ptr_null(dp);
    ck_assert_msg(strstr(err.msg, "head_dim 96") != NULL, "message: %s", err.msg);
    mkv_quest_plan *qplan = NULL;
    mkv_quest_params qp = {16, 4, 64, 0.1, 0};
    ck_assert_int_eq(mkv_cuda_quest_plan(&s, len, NULL, &qp, &qplan, &err), MKV_EUNSUP);
    ck_assert_msg(strstr(err.msg, "head_dim 96") != NULL, "message: %s", err.msg);

    s.head_dim = 128;
    s.n_heads = 32;   /* 16 per KV head */
    ck_assert_int_eq(mkv_cuda_dense_plan(&s, len, &dp, &err), MKV_EUNSUP);
    ck_assert_msg(strstr(err.msg, "16 query heads per KV head") != NULL, "message: %s", err.msg);
    s.n_heads = 7;    /* not a multiple */
    ck_assert_int_eq(mkv_cuda_dense_plan(&s, len, &dp, &err), MKV_EUSAGE);

    s.n_heads = 8;
    len[1] = 33;      /* past t_max */
    ck_assert_int_eq(mkv_cuda_dense_plan(&s, len, &dp, &err), MKV_EUSAGE);
    ck_assert_msg(strstr(err.msg, "request 1") != NULL, "message: %s", err.msg);
    len[1] = 20;

    qp.page_size = 8;
    ck_assert_int_eq(mkv_cuda_quest_plan(&s, len, NULL, &qp, &qplan, &err), MKV_EUNSUP);
    ck_assert_msg(strstr(err.msg, "page size 8") != NULL, "message: %s", err.msg);
    qp.page_size = 16;
    qp.budget = 0;
    ck_assert_int_eq(mkv_cuda_quest_plan(&s, len, NULL, &qp, &qplan, &err), MKV_EUSAGE);
    qp.budget = 0.1;
    const int64_t short_cache[2] = {10, 19};   /* shorter than request 1 */
    ck_assert_int_eq(mkv_cuda_quest_plan(&s, len, short_cache, &qp, &qplan, &err), MKV_EUSAGE);

    /* Unaligned device pointers are refused before any launch. */
    ck_assert_int_eq(mkv_cuda_dense_plan(&s, len, &dp, &err), MKV_OK);
    char *buf = dalloc(1 << 20);
    ck_assert_int_eq(mkv_cuda_dense_run(dp, (float *)(buf + 4), (uint16_t *)buf, (uint16_t *)buf, (float *)buf,
                                        NULL, &err),
                     MKV_EUSAGE);
    ck_assert_msg(strstr(err.msg, "aligned") != NULL, "message: %s", err.msg);
    mkv_cuda_dense_plan_free(dp);
    mkv_cuda_free(buf);
}
END_TEST

static Suite *attn_suite(void)
{
    Suite *s = suite_create("gpu_attn");
    TCase *tc = tcase_create("dense");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_dense_shapes);
    tcase_add_test(tc, test_dense_long);
    tcase_add_test(tc, test_dense_many_splits);
    tcase_add_test(tc, test_dense_one_split);
    tcase_add_test(tc, test_dense_host_wrapper);
    suite_add_tcase(s, tc);
    tc = tcase_create("quest");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_quest_shapes);
    tcase_add_test(tc, test_quest_variants);
    tcase_add_test(tc, test_quest_cache_longer);
    tcase_add_test(tc, test_quest_ties);
    tcase_add_test(tc, test_quest_full_budget);
    suite_add_tcase(s, tc);
    return s;
}

/* ------------------------------------------------------------------- main */

/* Without a usable GPU the entry points must fail cleanly with `want`. */
static int check_clean_failure(mkv_status want)
{
    mkv_error err = {0};
    int64_t len[1] = {10};
    mkv_attn_shape s = {1, 4, 1, 128, 16, 1, 0};
    mkv_dense_plan *dp = NULL;
    int rc = mkv_cuda_dense_plan(&s, len, &dp, &err);
    if (rc != (int)want || err.msg[0] == '\0' || dp != NULL) {
        fprintf(stderr, "check_gpu_attn: FAIL: dense plan without a GPU returned %d '%s', want %d\n", rc, err.msg,
                (int)want);
        return 1;
    }
    mkv_error_clear(&err);
    mkv_quest_plan *qp = NULL;
    mkv_quest_params par = {16, 4, 64, 0.1, 0};
    rc = mkv_cuda_quest_plan(&s, len, NULL, &par, &qp, &err);
    if (rc != (int)want || err.msg[0] == '\0' || qp != NULL) {
        fprintf(stderr, "check_gpu_attn: FAIL: Quest plan without a GPU returned %d '%s', want %d\n", rc, err.msg,
                (int)want);
        return 1;
    }
    return 0;
}

int main(void)
{
    seed = gpu_test_seed("check_gpu_attn");
    mkv_rng_seed(&rng, seed);
    quick = gpu_test_quick();
    return gpu_test_main("check_gpu_attn", attn_suite, check_clean_failure);
}
