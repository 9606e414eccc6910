/* MosaicKV's growth at decode time (lib/mosaic/decode.c): tokens leave the
 * recent window for a temporary region packed with the prefill's strategy,
 * closed segments are finalised by the manager and published between
 * steps. The references: compressing the whole sequence at once (the same
 * segments, each compressed alone, must come out byte for byte), a
 * synchronous manager (the asynchronous run must end with the same cache),
 * and a hand count of the bytes. */
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
    ck_assert_msg(a->n_qparams == 0 || memcmp(a->qparams, b->qparams, (size_t)a->n_qparams * sizeof(float)) == 0,
                  "%s: zeros and steps", what);
    ck_assert_msg(memcmp(a->values, b->values, (size_t)a->n_values * sizeof(float)) == 0, "%s: values", what);
    ck_assert_msg(a->n_bitmap == 0 || memcmp(a->bitmap, b->bitmap, (size_t)a->n_bitmap) == 0, "%s: bitmaps", what);
    ck_assert_msg(a->n_blockkeys == 0 ||
                      memcmp(a->blockkeys, b->blockkeys, (size_t)a->n_blockkeys * sizeof(float)) == 0,
                  "%s: block keys", what);
    ck_assert_msg(a->n_rotation == 0 || memcmp(a->rotation, b->rotation, (size_t)a->n_rotation * sizeof(float)) == 0,
                  "%s: rotations", what);
}

static void assert_same_head(const mkv_mosaic_head *a, const mkv_mosaic_head *b)
{
    ck_assert_int_eq(a->T, b->T);
    ck_assert_int_eq(a->sink_n, b->sink_n);
    ck_assert_int_eq(a->recent_n, b->recent_n);
    size_t nd = (size_t)(a->sink_n + a->recent_n) * D * sizeof(float);
    ck_assert(memcmp(a->dense_k, b->dense_k, nd) == 0);
    ck_assert(memcmp(a->dense_v, b->dense_v, nd) == 0);
    assert_same_tensor(&a->k, &b->k, "keys");
    assert_same_tensor(&a->v, &b->v, "values");
}

/* Five segments close during decoding; once published, the cache is the
 * one compressing every token at once gives (each segment is compressed
 * from its own tokens either way), for the fixed and the threshold rules,
 * with fp16 and quantized values. */
START_TEST(grown_equals_compressed_at_once)
{
    make_tokens(3);
    const mkv_method *m = mkv_method_find("mosaic");
    /* budget=1 stores no block keys; 0.5 grows them */
    const char *rules[] = {"strategy=fixed keep=0.25", "strategy=dynamic threshold=0.05",
                           "strategy=fixed keep=0.25 budget=0.5", "strategy=fixed keep=0.5 bits=4 budget=0.5",
                           "strategy=fixed keep=0.5 bits=4 qgroup=16 budget=0.5",
                           "strategy=dynamic threshold=0.05 quantize=on qgroup=16"};
    mkv_mosaic_set_sync_manager(0);
    for (int r = 0; r < (int)(sizeof rules / sizeof rules[0]); r++) {
        mkv_params p;
        params_for(m, rules[r], &p);
        void *grown = compress_load(m, &p, C);
        append_all(m, grown, C, C + N);
        mkv_error err;
        ck_assert_msg(m->decode_flush(grown, &err) == MKV_OK, "%s", err.msg);
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

/* The manager on its own thread or on the decoding one: the same cache at
 * the end, under the ratio rule too. */
START_TEST(async_equals_sync)
{
    make_tokens(5);
    const mkv_method *m = mkv_method_find("mosaic");
    mkv_params p;
    params_for(m, "strategy=ratio ratio=3 quantize=on budget=0.5", &p);
    mkv_error err;
    mkv_mosaic_set_sync_manager(1);
    void *sync = compress_load(m, &p, C);
    append_all(m, sync, C, C + N);
    ck_assert_int_eq(m->decode_flush(sync, &err), MKV_OK);
    mkv_mosaic_set_sync_manager(0);
    void *async = compress_load(m, &p, C);
    append_all(m, async, C, C + N);
    ck_assert_int_eq(m->decode_flush(async, &err), MKV_OK);
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
    mkv_mosaic_set_sync_manager(0);
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

int main(void)
{
    mkv_log_init("check_dual_buffer");
    Suite *s = suite_create("dual_buffer");
    TCase *tc = tcase_create("dual_buffer");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, grown_equals_compressed_at_once);
    tcase_add_test(tc, async_equals_sync);
    tcase_add_test(tc, switch_at_step_boundaries);
    suite_add_tcase(s, tc);
    return test_run(s);
}
