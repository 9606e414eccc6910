/* MosaicKV's growth at decode time (lib/mosaic/decode.c): tokens leave the
 * recent window for a temporary region packed with the prefill's strategy,
 * closed segments are finalised by the manager and published between
 * steps. The references: compressing the whole sequence at once (the same
 * segments, each compressed alone, must come out byte for byte), a
 * synchronous manager (the asynchronous run must end with the same cache),
 * the Gram matrix computed in double from the open segment's tokens, and
 * hand-computed closing points of the running-loss rule. */
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/half.h"
#include "core/log.h"
#include "io/cdump.h"
#include "methods/compress.h"
#include "methods/method.h"
#include "mosaic/finalize_priv.h"
#include "mosaic/mosaic.h"
#include "testutil.h"

enum { D = 16, SINK = 4, RECENT = 8, SEG = 16, BLOCK = 8 };
/* the prefill: sink, three whole segments, the recent window */
enum { C = SINK + 3 * SEG + RECENT, N = 5 * SEG };

static float keys[C + N][D], values[C + N][D];

static void make_tokens(uint64_t seed)
{
    test_fill(&keys[0][0], (size_t)(C + N) * D, &seed, 0.0, 1.0);
    test_fill(&values[0][0], (size_t)(C + N) * D, &seed, 0.0, 1.0);
    /* a few channels carry more energy, so rotations and strategies matter */
    for (int t = 0; t < C + N; t++) {
        keys[t][3] *= 6;
        keys[t][7] *= 3;
        values[t][1] *= 4;
        /* float16 values, as the dense window holds tokens before they
         * are packed */
        for (int i = 0; i < D; i++) {
            keys[t][i] = mkv_f16_to_f32(mkv_f32_to_f16(keys[t][i]));
            values[t][i] = mkv_f16_to_f32(mkv_f32_to_f16(values[t][i]));
        }
    }
}

/* Compress tokens 0..T-1 with method m and load the state of its head. */
static void *compress_load(const mkv_method *m, const mkv_params *p, int T)
{
    mkv_dump_meta meta;
    memset(&meta, 0, sizeof meta);
    strcpy(meta.model, "dual-buffer-test");
    meta.n_layers = 1;
    meta.n_heads = 1;
    meta.n_kv_heads = 1;
    meta.head_dim = D;
    meta.rope_theta = 10000;
    strcpy(meta.k_rope, "post");
    strcpy(meta.source, "synthetic");
    meta.n_tokens = T;
    meta.n_queries = 0;
    mkv_error err;
    mkv_error_clear(&err);
    ck_assert_msg(m->check(p, &meta, &err) == MKV_OK, "%s", err.msg);
    mkv_cdump_meta cm;
    memset(&cm, 0, sizeof cm);
    strcpy(cm.method, m->name);
    strcpy(cm.source, "test");
    mkv_params_format(p, cm.params, sizeof cm.params);
    cm.raw = meta;
    mkv_cdump_writer *w;
    ck_assert_int_eq(mkv_cdump_create_memory(&cm, NULL, &w, &err), MKV_OK);
    mkv_compressor comp = {.method = m, .params = p};
    mkv_head_kv in = {.layer = 0, .head = 0, .T = T, .d = D, .G = 1, .k = &keys[0][0], .v = &values[0][0],
                      .threads = 1};
    ck_assert_msg(mkv_compress_head(&comp, &in, w, &err) == MKV_OK, "%s", err.msg);
    mkv_cdump *c;
    ck_assert_msg(mkv_cdump_commit_open(w, &c, &err) == MKV_OK, "%s", err.msg);
    void *state;
    ck_assert_msg(m->load(p, c, 0, 0, &state, &err) == MKV_OK, "%s", err.msg);
    ck_assert_uint_eq(m->state_bytes(state), mkv_cdump_meta_of(c)->physical_bytes);
    mkv_cdump_close(c);
    return state;
}

static void params_for(const mkv_method *m, const char *extra, mkv_params *p)
{
    mkv_error err;
    char text[256];
    snprintf(text, sizeof text, "sink=%d recent=%d segment=%d block=%d budget=1 %s", SINK, RECENT, SEG, BLOCK,
             extra);
    mkv_params_init(p, m->params);
    ck_assert_msg(mkv_params_parse_list(p, text, &err) >= 0, "%s", err.msg);
}

static void append_all(const mkv_method *m, void *state, int from, int to)
{
    mkv_error err;
    for (int t = from; t < to; t++)
        ck_assert_msg(m->append(state, keys[t], values[t], &err) == MKV_OK, "token %d: %s", t, err.msg);
}

/* The prefill's state grown by tokens C..C+n-1, everything published. */
static void *grown_state(const mkv_method *m, const mkv_params *p, int n)
{
    void *s = compress_load(m, p, C);
    append_all(m, s, C, C + n);
    mkv_error err;
    ck_assert_msg(m->decode_flush(s, &err) == MKV_OK, "%s", err.msg);
    return s;
}

static void assert_same_tensor(const mkv_mosaic_tensor *a, const mkv_mosaic_tensor *b, const char *what)
{
    ck_assert_int_eq(a->nseg, b->nseg);
    for (int64_t i = 0; i < a->nseg; i++) {
        const mkv_mosaic_strategy *x = &a->seg[i], *y = &b->seg[i];
        ck_assert_msg(x->start == y->start && x->len == y->len && x->rotate == y->rotate && x->r == y->r &&
                          x->g == y->g && x->dprime == y->dprime && x->keydim == y->keydim &&
                          x->bound == y->bound && x->pervector == y->pervector && x->bits == y->bits,
                      "%s: segment %lld: start %lld/%lld len %lld/%lld rotate %d/%d r %d/%d g %d/%d d' %d/%d "
                      "keydim %d/%d bound %d/%d pervector %d/%d", what, (long long)i, (long long)x->start, (long long)y->start,
                      (long long)x->len, (long long)y->len, x->rotate, y->rotate, x->r, y->r, x->g, y->g, x->dprime,
                      y->dprime, x->keydim, y->keydim, x->bound, y->bound, x->pervector, y->pervector);
    }
    ck_assert_int_eq(a->n_values, b->n_values);
    ck_assert_int_eq(a->n_bitmap, b->n_bitmap);
    ck_assert_int_eq(a->n_blockkeys, b->n_blockkeys);
    ck_assert_int_eq(a->n_rotation, b->n_rotation);
    ck_assert_int_eq(a->n_codes, b->n_codes);
    ck_assert_int_eq(a->n_qparams, b->n_qparams);
    ck_assert_msg(a->n_codes == 0 || memcmp(a->codes, b->codes, (size_t)a->n_codes) == 0, "%s: codes", what);
    ck_assert_msg(a->n_qparams == 0 || memcmp(a->qparams, b->qparams, (size_t)a->n_qparams * sizeof(uint16_t)) == 0,
                  "%s: zeros and steps", what);
    ck_assert_msg(a->n_values == 0 || memcmp(a->values, b->values, (size_t)a->n_values * sizeof(uint16_t)) == 0,
                  "%s: values", what);
    ck_assert_msg(a->n_bitmap == 0 || memcmp(a->bitmap, b->bitmap, (size_t)a->n_bitmap) == 0, "%s: bitmaps", what);
    ck_assert_msg(a->n_blockkeys == 0 ||
                      memcmp(a->blockkeys, b->blockkeys, (size_t)a->n_blockkeys * sizeof(uint16_t)) == 0,
                  "%s: block keys", what);
    ck_assert_msg(a->n_rotation == 0 || memcmp(a->rotation, b->rotation, (size_t)a->n_rotation * sizeof(uint16_t)) == 0,
                  "%s: rotations", what);
}

static void assert_same_head(const mkv_mosaic_head *a, const mkv_mosaic_head *b)
{
    ck_assert_int_eq(a->T, b->T);
    ck_assert_int_eq(a->sink_n, b->sink_n);
    ck_assert_int_eq(a->recent_n, b->recent_n);
    size_t nd = (size_t)(a->sink_n + a->recent_n) * D * sizeof *a->dense_k;
    ck_assert(memcmp(a->dense_k, b->dense_k, nd) == 0);
    ck_assert(memcmp(a->dense_v, b->dense_v, nd) == 0);
    assert_same_tensor(&a->k, &b->k, "keys");
    assert_same_tensor(&a->v, &b->v, "values");
}

/* Five segments close during decoding; once published, the cache is the
 * one compressing every token at once gives (each segment is compressed
 * from its own tokens either way), for the fixed and the threshold rules,
 * with fp16 and quantized values, with and without rotation, and for
 * uniform2d. */
START_TEST(grown_equals_compressed_at_once)
{
    make_tokens(3);
    /* budget=1 stores no block keys; 0.5 grows them */
    const struct {
        const char *method, *rule;
    } runs[] = {{"mosaic", "strategy=fixed keep=0.25"},
                {"mosaic", "strategy=dynamic threshold=0.05"},
                {"mosaic", "strategy=fixed keep=0.25 budget=0.5"},
                {"mosaic", "strategy=fixed keep=0.5 bits=4 budget=0.5"},
                {"mosaic", "strategy=fixed keep=0.5 bits=4 qgroup=16 budget=0.5"},
                {"mosaic", "strategy=dynamic threshold=0.05 quantize=on"},
                {"mosaic", "strategy=dynamic threshold=0.05 quantize=on qgroup=16"},
                {"mosaic", "strategy=fixed keep=0.25 rotate=off budget=0.5"},
                {"mosaic", "strategy=dynamic threshold=0.05 rotate=off budget=0.5"},
                {"uniform2d", "keep=0.25"},
                {"uniform2d", "keep=0.25 budget=0.5"}};
    mkv_mosaic_set_manager(MKV_MOSAIC_MANAGER_ASYNC);
    mkv_mosaic_set_close_loss(1);   /* segments close at S tokens only */
    for (int r = 0; r < (int)(sizeof runs / sizeof runs[0]); r++) {
        const mkv_method *m = mkv_method_find(runs[r].method);
        mkv_params p;
        params_for(m, runs[r].rule, &p);
        void *grown = grown_state(m, &p, N);
        mkv_decode_counters dc;
        m->decode_counters(grown, &dc);
        ck_assert_int_eq(dc.finalized, N / SEG);
        ck_assert_int_eq(dc.steps_waited, 0);
        ck_assert_int_eq(dc.temp_tokens, 0);
        ck_assert_uint_gt(dc.temp_bytes_peak, 0);
        void *whole = compress_load(m, &p, C + N);
        assert_same_head(mkv_mosaic_state_head(grown), mkv_mosaic_state_head(whole));
        ck_assert_uint_eq(m->state_bytes(grown), m->state_bytes(whole));
        m->free_state(grown);
        m->free_state(whole);
    }
}
END_TEST

/* A segment finalised from its Gram matrices (computed here in double
 * from its tokens) is the one mkv_mosaic_compress makes of the same
 * tokens as a head of one segment, under every rule; the ratio rule is
 * the one the whole-sequence comparison above cannot check (it spreads
 * one byte budget over all of a head's segments). */
START_TEST(finalized_equals_one_segment_head)
{
    make_tokens(17);
    const mkv_method *m = mkv_method_find("mosaic");
    const char *rules[] = {"strategy=ratio ratio=3 quantize=on budget=0.5", "strategy=ratio ratio=6",
                           "strategy=dynamic threshold=0.1 budget=0.5", "strategy=fixed keep=0.5 bits=8"};
    enum { LEN = 2 * SEG + 5 };
    static double gram[2][D * D];
    for (int x = 0; x < 2; x++)
        for (int i = 0; i < D; i++)
            for (int j = 0; j < D; j++) {
                double sum = 0;
                for (int t = 0; t < LEN; t++)
                    sum += (double)(x ? values : keys)[t][i] * (double)(x ? values : keys)[t][j];
                gram[x][i * D + j] = sum;
            }
    for (int r = 0; r < (int)(sizeof rules / sizeof rules[0]); r++) {
        mkv_params p;
        params_for(m, rules[r], &p);
        mkv_mosaic_config c;
        mkv_mosaic_config_of(&p, D, &c);
        mkv_error err;
        mkv_mosaic_head fin, ref;
        ck_assert_msg(mkv_mosaic_finalize_segment(&c, &keys[0][0], &values[0][0], LEN, D, 1, gram[0], gram[1], &fin,
                                                  &err) == MKV_OK, "%s", err.msg);
        c.sink = c.recent = 0;
        c.segment = LEN;
        mkv_head_kv in = {.T = LEN, .d = D, .G = 1, .k = &keys[0][0], .v = &values[0][0], .threads = 1};
        ck_assert_msg(mkv_mosaic_compress(&c, &in, &ref, &err) == MKV_OK, "%s", err.msg);
        assert_same_tensor(&fin.k, &ref.k, rules[r]);
        assert_same_tensor(&fin.v, &ref.v, rules[r]);
        for (int x = 0; x < 2; x++)
            ck_assert(memcmp(x ? fin.v.loss : fin.k.loss, x ? ref.v.loss : ref.k.loss,
                             MKV_MOSAIC_LOSS_COLS * sizeof(float)) == 0);
        mkv_mosaic_head_free(&fin);
        mkv_mosaic_head_free(&ref);
    }
}
END_TEST

/* The manager on its own thread or on the decoding one: the same cache at
 * the end, under the ratio rule too. */
START_TEST(async_equals_sync)
{
    make_tokens(5);
    const mkv_method *m = mkv_method_find("mosaic");
    mkv_params p;
    params_for(m, "strategy=ratio ratio=3 quantize=on budget=0.5", &p);
    mkv_mosaic_set_manager(MKV_MOSAIC_MANAGER_SYNC);
    void *sync = grown_state(m, &p, N);
    /* each segment finalised on the decoding thread made its step wait */
    mkv_decode_counters dc;
    m->decode_counters(sync, &dc);
    ck_assert_int_gt(dc.finalized, 0);
    ck_assert_int_eq(dc.steps_waited, dc.finalized);
    mkv_mosaic_set_manager(MKV_MOSAIC_MANAGER_ASYNC);
    void *async = grown_state(m, &p, N);
    assert_same_head(mkv_mosaic_state_head(sync), mkv_mosaic_state_head(async));
    m->free_state(sync);
    m->free_state(async);
}
END_TEST

static void attend_last(const mkv_method *m, void *state, int pos, float *out, uint8_t *att)
{
    float q[D];
    for (int i = 0; i < D; i++)
        q[i] = keys[pos][i];
    memset(att, 0, C + N);
    mkv_attend_query aq = {.G = 1, .d = D, .q = q, .pos = pos, .scale = 0.25};
    mkv_attend_result r = {.out = out, .attended = att};
    mkv_error err;
    ck_assert_msg(m->attend(state, &aq, &r, &err) == MKV_OK, "%s", err.msg);
}

/* A token that left the window is attended at once from the temporary
 * region; a finished segment changes the cache only at the next append. */
START_TEST(switch_at_step_boundaries)
{
    make_tokens(7);
    const mkv_method *m = mkv_method_find("mosaic");
    mkv_params p;
    params_for(m, "strategy=fixed keep=0.5", &p);
    mkv_mosaic_set_manager(MKV_MOSAIC_MANAGER_ASYNC);
    mkv_mosaic_set_close_loss(1);   /* the segment closes at S tokens */
    void *s = compress_load(m, &p, C);
    /* C - RECENT .. : the first token to leave the window */
    append_all(m, s, C, C + 1);
    float out[D], again[D];
    uint8_t att[C + N];
    attend_last(m, s, C, out, att);
    ck_assert_msg(att[C - RECENT], "the token in the temporary region was not attended");
    const mkv_mosaic_head *h = mkv_mosaic_state_head(s);
    ck_assert_int_eq(h->k.nseg, 4);
    ck_assert_int_eq(h->k.seg[3].start, C - RECENT);
    ck_assert_int_eq(h->k.seg[3].len, 1);
    /* fill the open segment: it closes; give the manager time; nothing
     * changes until the next append */
    append_all(m, s, C + 1, C + SEG);
    mkv_decode_counters dc;
    m->decode_counters(s, &dc);
    ck_assert_int_eq(dc.finalized, 0);
    ck_assert_int_eq(dc.temp_tokens, SEG);
    attend_last(m, s, C + SEG - 1, out, att);
    usleep(200000);
    attend_last(m, s, C + SEG - 1, again, att);
    ck_assert(memcmp(out, again, sizeof out) == 0);
    m->decode_counters(s, &dc);
    ck_assert_int_eq(dc.finalized, 0);
    mkv_error err;
    ck_assert_int_eq(m->decode_flush(s, &err), MKV_OK);
    m->decode_counters(s, &dc);
    ck_assert_int_eq(dc.finalized, 1);
    m->free_state(s);
}
END_TEST

/* The Gram matrix the dual buffer accumulates token by token is X^T X of
 * the open segment's tokens, computed here in long double from them; a
 * closed segment's matrix starts again from zero. */
START_TEST(gram_is_the_segments_tokens)
{
    make_tokens(11);
    const mkv_method *m = mkv_method_find("mosaic");
    mkv_params p;
    params_for(m, "strategy=fixed keep=0.25", &p);
    mkv_mosaic_set_manager(MKV_MOSAIC_MANAGER_SYNC);
    mkv_mosaic_set_close_loss(1);
    void *s = compress_load(m, &p, C);
    /* SEG + 5 tokens leave the window: one segment closes, 5 are open */
    int leave = SEG + 5, first_open = C - RECENT + SEG;
    append_all(m, s, C, C + leave);
    for (int is_key = 0; is_key < 2; is_key++) {
        int64_t n;
        const double *G = mkv_mosaic_state_gram(s, is_key, &n);
        ck_assert_int_eq(n, 5);
        ck_assert_ptr_nonnull(G);
        float(*X)[D] = is_key ? keys : values;
        for (int i = 0; i < D; i++)
            for (int j = i; j < D; j++) {
                long double want = 0;
                for (int t = first_open; t < first_open + n; t++)
                    want += (long double)X[t][i] * (long double)X[t][j];
                ck_assert_msg(fabsl((long double)G[i * D + j] - want) <= 1e-12L * (1 + fabsl(want)),
                              "%s Gram [%d][%d]: %.17g, want %.17Lg", is_key ? "key" : "value", i, j,
                              G[i * D + j], want);
            }
    }
    m->free_state(s);
}
END_TEST

/* A hand-built stream for the running-loss rule: rotation off, 4 of 16
 * channels kept per vector. Prefill tokens carry +-2 on channels 0..3 and
 * nothing else, so the strategy drops none of their energy (recorded loss
 * 0); tokens from `change` on carry +-1 on all 16 channels, the same
 * energy (16), of which the strategy keeps 4 and drops 12. */
static void make_shift(int change)
{
    for (int t = 0; t < C + N; t++)
        for (int i = 0; i < D; i++) {
            float sign = ((t * 7 + i * 3) % 5) < 2 ? -1.0f : 1.0f;
            float x = t >= change ? sign : i < 4 ? 2 * sign : 0;
            keys[t][i] = x;
            values[t][i] = -x;
        }
}

/* The method and settings the shifted stream runs with. */
static const mkv_method *shift_method(mkv_mosaic_manager_mode mode, mkv_params *p)
{
    const mkv_method *m = mkv_method_find("mosaic");
    params_for(m, "strategy=fixed keep=0.25 rotate=off", p);
    mkv_mosaic_set_manager(mode);
    mkv_mosaic_set_close_loss(0.32);
    return m;
}

/* The open segment starts at C - RECENT; the stream changes 6 tokens
 * into it. With m changed tokens of n the running loss is 12 m / 16 n,
 * which exceeds the recorded 0 by more than 0.32 first at m = 5 (0.75 x
 * 5 / 11 = 0.341; m = 4 gives 0.3): the segment closes at 11 tokens.
 * Every later token drops 0.75, so each next segment closes as soon as the
 * rule looks, at SEG / 4 = 4 tokens. Without the change no segment closes
 * before SEG. */
START_TEST(running_loss_closes_where_the_stream_changes)
{
    mkv_params p;
    const mkv_method *m = shift_method(MKV_MOSAIC_MANAGER_ASYNC, &p);
    int open = C - RECENT, appended = 3 * SEG;
    for (int shift = 0; shift < 2; shift++) {
        make_shift(shift ? open + 6 : C + N);
        void *s = grown_state(m, &p, appended);
        const mkv_mosaic_head *h = mkv_mosaic_state_head(s);
        /* the prefill's 3 segments, then what decoding closed and the open one */
        int want[16], nwant = 0, left = appended, closed = 0;
        for (int len = shift ? 11 : SEG; left > 0; len = shift ? SEG / 4 : SEG) {
            want[nwant++] = len < left ? len : left;
            closed += len <= left;   /* else the last one is still open */
            left -= len;
        }
        ck_assert_int_eq(h->k.nseg, 3 + nwant);
        for (int i = 0; i < nwant; i++) {
            ck_assert_int_eq(h->k.seg[3 + i].len, want[i]);
            ck_assert_int_eq(h->v.seg[3 + i].len, want[i]);
        }
        ck_assert_int_eq(h->k.seg[3].start, open);
        mkv_decode_counters dc;
        m->decode_counters(s, &dc);
        ck_assert_int_eq(dc.finalized, closed);
        ck_assert(dc.finalize_seconds > 0 && dc.manager_cpu_seconds > 0);
        m->free_state(s);
    }
}
END_TEST

/* A segment the rule closes is published at the next step, not at once,
 * even when the manager finalised it on the spot: until then its tokens
 * are the temporary region's (no loss recorded yet). */
START_TEST(early_close_published_at_the_next_step)
{
    mkv_params p;
    const mkv_method *m = shift_method(MKV_MOSAIC_MANAGER_SYNC, &p);
    make_shift(C - RECENT + 6);
    void *s = compress_load(m, &p, C);
    /* the 11th token to leave the window closes the segment (above) */
    append_all(m, s, C, C + 11);
    const mkv_mosaic_head *h = mkv_mosaic_state_head(s);
    mkv_decode_counters dc;
    m->decode_counters(s, &dc);
    ck_assert_int_eq(dc.finalized, 0);
    ck_assert_int_eq(dc.temp_tokens, 11);
    ck_assert_int_eq(h->k.nseg, 4);
    ck_assert(isnan(h->k.loss[3 * MKV_MOSAIC_LOSS_COLS]));
    append_all(m, s, C + 11, C + 12);
    m->decode_counters(s, &dc);
    ck_assert_int_eq(dc.finalized, 1);
    ck_assert_int_eq(h->k.nseg, 5);
    ck_assert_int_eq(h->k.seg[3].len, 11);
    ck_assert(isfinite(h->k.loss[3 * MKV_MOSAIC_LOSS_COLS]));
    ck_assert_int_eq(h->k.seg[4].len, 1);
    m->free_state(s);
}
END_TEST

/* With the manager off no segment closes: every token that left the
 * window stays in one temporary segment, packed with the prefill's
 * strategy. */
START_TEST(manager_off_closes_nothing)
{
    make_tokens(13);
    const mkv_method *m = mkv_method_find("mosaic");
    mkv_params p;
    params_for(m, "strategy=fixed keep=0.25 budget=0.5", &p);
    mkv_mosaic_set_manager(MKV_MOSAIC_MANAGER_OFF);
    void *s = grown_state(m, &p, N);
    mkv_decode_counters dc;
    m->decode_counters(s, &dc);
    ck_assert_int_eq(dc.finalized, 0);
    ck_assert_int_eq(dc.temp_tokens, N);
    const mkv_mosaic_head *h = mkv_mosaic_state_head(s);
    ck_assert_int_eq(h->k.nseg, 4);
    ck_assert_int_eq(h->k.seg[3].start, C - RECENT);
    ck_assert_int_eq(h->k.seg[3].len, N);
    ck_assert_int_eq(h->k.seg[3].r, h->k.seg[2].r);
    ck_assert_int_eq(h->k.seg[3].dprime, h->k.seg[2].dprime);
    m->free_state(s);
}
END_TEST

int main(void)
{
    mkv_log_init("check_dual_buffer");
    Suite *s = suite_create("dual_buffer");
    TCase *tc = tcase_create("dual_buffer");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, grown_equals_compressed_at_once);
    tcase_add_test(tc, finalized_equals_one_segment_head);
    tcase_add_test(tc, async_equals_sync);
    tcase_add_test(tc, switch_at_step_boundaries);
    tcase_add_test(tc, gram_is_the_segments_tokens);
    tcase_add_test(tc, running_loss_closes_where_the_stream_changes);
    tcase_add_test(tc, early_close_published_at_the_next_step);
    tcase_add_test(tc, manager_off_closes_nothing);
    suite_add_tcase(s, tc);
    return test_run(s);
}
