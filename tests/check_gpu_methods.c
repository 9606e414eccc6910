/* Every method of the registry against its GPU path (lib/gpu/), driven by
 * the registry and the GPU table rather than by method names:
 *  - each method with a GPU path, on a few shapes (head_dim 64 and 128, 1,
 *    4 and 8 query heads per KV head, contexts of several segments and
 *    pages), compresses a synthetic KV-like head with its own compress,
 *    answers queries at positions early, in the middle, before and inside
 *    the recent window with its CPU attend (the reference) and with
 *    mkv_gpu_method_attend.  Per query:
 *      attended tokens: equal, except where blocks or pages whose scores
 *        are within float32 rounding of the selection threshold went the
 *        other way: at most 4 selection units (two swapped for two others)
 *        may differ, in at most a quarter of the queries of a method, and
 *        never for a method that attends every token;
 *      where they are equal: bytes_read equal, and per query head
 *        ||o_gpu - o_cpu|| <= OUT_TOL x the RMS norm of the attended value
 *        vectors (the GPU accumulates in float32 what the CPU does in
 *        double, over the same stored 16-bit values);
 *  - mkv_gpu_method_usable answers 1 exactly for the methods with a GPU
 *    path; every other method gets -1 and a reason naming it, and
 *    mkv_gpu_method_attend refuses it with MKV_EUNSUP;
 *  - shapes no GPU kernel takes (head_dim 96, 16 query heads per KV head)
 *    are refused with the reason.
 * CUDA does not survive fork: the suite runs with CK_NOFORK and exits 77
 * when there is no CUDA build or no GPU, after checking that every GPU path
 * then fails cleanly.  Inputs are random with a fresh seed per run, printed
 * first; MKV_TEST_SEED repeats one. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/mkv.h"
#include "gpu/gpu_method_priv.h"
#include "gpu/gpu_method.h"
#include "io/cdump.h"
#include "methods/method.h"
#include "gpu_testutil.h"
#include "testutil.h"

#define OUT_TOL 2e-3
#define NQ 8                     /* queries per head */

static uint64_t seed;

typedef struct {
    int d, G;
    int64_t T;
} shape;

static const shape shapes[] = {{64, 1, 400}, {128, 4, 700}, {128, 8, 1100}};

/* One KV head of a synthetic cache: keys with channel scales spread over
 * a decade and two outlier channels, values normal, queries near some
 * keys (so that attention is peaked, as in real caches). */
typedef struct {
    shape s;
    float *k, *v;                /* [T][d] */
    float *q;                    /* [G][NQ][d], as mkv_head_kv takes them */
    int32_t pos[NQ];
} head_case;

/* Test data allocations (also made outside a running test, where Check's
 * assertions cannot report). */
static void *alloc_or_die(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "check_gpu_methods: out of memory\n");
        exit(1);
    }
    return p;
}

static double normal(uint64_t *s)
{
    double u = test_uniform(s), v = test_uniform(s);
    return sqrt(-2 * log(u > 0 ? u : 0x1p-53)) * cos(2 * M_PI * v);
}

static void head_case_make(head_case *x, const shape *s, uint64_t *rs)
{
    const int d = s->d;
    x->s = *s;
    x->k = alloc_or_die(sizeof(float) * (size_t)(s->T * d));
    x->v = alloc_or_die(sizeof(float) * (size_t)(s->T * d));
    x->q = alloc_or_die(sizeof(float) * (size_t)(s->G * NQ * d));
    for (int64_t t = 0; t < s->T; t++)
        for (int i = 0; i < d; i++) {
            const double scale = pow(10.0, -(double)i / d) * (i == 3 || i == d / 2 + 1 ? 8 : 1);
            x->k[t * d + i] = (float)(scale * normal(rs));
            x->v[t * d + i] = (float)normal(rs);
        }
    const int32_t T = (int32_t)s->T;
    const int32_t pos[NQ] = {20, T / 4, T / 2, 3 * T / 4, T - 100, T - 65, T - 30, T - 1};
    memcpy(x->pos, pos, sizeof pos);
    for (int g = 0; g < s->G; g++)
        for (int w = 0; w < NQ; w++) {
            const int64_t near = (int64_t)(test_uniform(rs) * (double)(x->pos[w] + 1));
            for (int i = 0; i < d; i++)
                x->q[((size_t)g * NQ + w) * d + i] = (float)(0.5 * x->k[near * d + i] + 0.3 * normal(rs));
        }
}

static void head_case_free(head_case *x)
{
    free(x->k);
    free(x->v);
    free(x->q);
}

static void fill_meta(mkv_dump_meta *m, const shape *s)
{
    mkv_dump_meta_init(m);
    strcpy(m->model, "unit-gpu-methods");
    m->n_layers = 1;
    m->n_heads = s->G;
    m->n_kv_heads = 1;
    m->head_dim = s->d;
    m->n_tokens = s->T;
    m->n_queries = NQ;
}

static int has_param(const mkv_method *m, const char *name)
{
    for (const mkv_param_spec *p = m->params; p && p->name; p++)
        if (!strcmp(p->name, name))
            return 1;
    return 0;
}

/* The method's defaults, with segments short enough that the contexts
 * above hold several. */
static int params_for(const mkv_method *m, mkv_params *p, mkv_error *err)
{
    mkv_params_init(p, m->params);
    return has_param(m, "segment") ? mkv_params_set(p, "segment", "128", err) : MKV_OK;
}

/* Compress x with m's own compress into path. */
static int compress_to(const mkv_method *m, const mkv_params *p, const head_case *x, const char *path, mkv_error *err)
{
    mkv_dump_meta meta;
    fill_meta(&meta, &x->s);
    int rc = m->check(p, &meta, err);
    if (rc != MKV_OK)
        return rc;
    mkv_cdump_meta cm;
    memset(&cm, 0, sizeof cm);
    snprintf(cm.method, sizeof cm.method, "%s", m->name);
    mkv_params_format(p, cm.params, sizeof cm.params);
    strcpy(cm.source, "memory");
    cm.raw = meta;
    mkv_cdump_writer *w;
    if ((rc = mkv_cdump_create(path, NULL, &cm, x->pos, &w, err)) != MKV_OK)
        return rc;
    mkv_head_kv in = {.layer = 0, .head = 0, .T = x->s.T, .d = x->s.d, .G = x->s.G, .k = x->k, .v = x->v,
                      .W = NQ, .q = x->q, .query_pos = x->pos, .threads = 1};
    if ((rc = m->compress(p, &in, w, err)) != MKV_OK) {
        mkv_cdump_abort(w);
        return rc;
    }
    return mkv_cdump_commit(w, err);
}

/* The queries of x as mkv_gpu_method_attend takes them, and room for the
 * answers (out poisoned with NaN, attended zeroed). */
typedef struct {
    float *q;                    /* [NQ][G][d] */
    int64_t pos[NQ];
    float *out;                  /* [NQ][G][d] */
    uint8_t *attended;           /* [NQ][T] */
    uint64_t bytes[NQ];
    mkv_eval_queries gq;
    mkv_eval_answers ga;
} gpu_io;

static void gpu_io_make(gpu_io *io, const head_case *x)
{
    const int d = x->s.d, G = x->s.G;
    const size_t n = (size_t)NQ * (size_t)G * (size_t)d;
    io->q = alloc_or_die(sizeof(float) * n);
    io->out = alloc_or_die(sizeof(float) * n);
    io->attended = alloc_or_die((size_t)(NQ * x->s.T));
    memset(io->attended, 0, (size_t)(NQ * x->s.T));
    for (int w = 0; w < NQ; w++) {
        io->pos[w] = x->pos[w];
        io->bytes[w] = 0;
        for (int g = 0; g < G; g++)
            memcpy(io->q + ((size_t)w * G + g) * d, x->q + ((size_t)g * NQ + w) * d, sizeof(float) * (size_t)d);
    }
    memset(io->out, 0xff, sizeof(float) * n);
    io->gq = (mkv_eval_queries){G, d, x->s.T, NQ, io->q, io->pos};
    io->ga = (mkv_eval_answers){io->out, io->attended, io->bytes};
}

static void gpu_io_free(gpu_io *io)
{
    free(io->q);
    free(io->out);
    free(io->attended);
}

/* Tokens per selection unit of m's parameters (block, page), 0 when it
 * selects none (attends every token). */
static int64_t selection_unit(const mkv_method *m, const mkv_params *p)
{
    if (has_param(m, "block"))
        return mkv_params_int(p, "block");
    if (has_param(m, "page"))
        return mkv_params_int(p, "page");
    return 0;
}

typedef struct {
    int queries, flipped;
    double worst;                /* largest output error / value RMS where the selections agree */
} compare_stats;

/* m's CPU attend and GPU path on x; the per-query checks of the top
 * comment. */
static void compare_method(const mkv_method *m, const head_case *x, compare_stats *st)
{
    const int d = x->s.d, G = x->s.G;
    const int64_t T = x->s.T;
    char path[512], name[64];
    snprintf(name, sizeof name, "%s-%d-%d.h5", m->name, d, G);
    test_path(path, sizeof path, name);
    mkv_params p;
    mkv_error err = {0};
    ck_assert_msg(params_for(m, &p, &err) == MKV_OK, "%s: %s", m->name, err.msg);
    ck_assert_msg(compress_to(m, &p, x, path, &err) == MKV_OK, "%s: compress: %s", m->name, err.msg);
    mkv_cdump *c;
    ck_assert_msg(mkv_cdump_open(path, &c, &err) == MKV_OK, "%s: %s", m->name, err.msg);

    mkv_dump_meta meta;
    fill_meta(&meta, &x->s);
    char why[256] = "";
    ck_assert_msg(mkv_gpu_method_usable(m, &p, &meta, why, sizeof why) == 1, "%s (d %d, G %d): not usable: %s",
                  m->name, d, G, why);
    gpu_io io;
    gpu_io_make(&io, x);
    ck_assert_msg(mkv_gpu_method_attend(m, &p, c, 0, 0, &io.gq, &io.ga, &err) == MKV_OK, "%s: GPU attend: %s",
                  m->name, err.msg);

    void *state = NULL;
    ck_assert_msg(m->load(&p, c, 0, 0, &state, &err) == MKV_OK, "%s: load: %s", m->name, err.msg);
    const int64_t unit = selection_unit(m, &p);
    float *out = alloc_or_die(sizeof(float) * (size_t)(G * d));
    uint8_t *att = alloc_or_die((size_t)T);
    for (int w = 0; w < NQ; w++) {
        memset(att, 0, (size_t)T);
        mkv_attend_query aq = {.G = G, .d = d, .q = io.q + (size_t)w * G * d, .pos = x->pos[w],
                               .scale = 1 / sqrt((double)d)};
        mkv_attend_result r = {.out = out, .attended = att, .bytes_read = 0};
        ck_assert_msg(m->attend(state, &aq, &r, &err) == MKV_OK, "%s: CPU attend: %s", m->name, err.msg);
        const uint8_t *gatt = io.attended + (size_t)w * T;
        int64_t differ = 0;
        double v_sq = 0;
        int64_t n_att = 0;
        for (int64_t t = 0; t < T; t++) {
            differ += (att[t] != 0) != (gatt[t] != 0);
            if (att[t]) {
                for (int i = 0; i < d; i++)
                    v_sq += (double)x->v[t * d + i] * x->v[t * d + i];
                n_att++;
            }
        }
        st->queries++;
        if (differ) {
            ck_assert_msg(unit > 0 && differ <= 4 * unit,
                          "%s (d %d, G %d) query at %d: %lld attended tokens differ (selection unit %lld)", m->name,
                          d, G, x->pos[w], (long long)differ, (long long)unit);
            st->flipped++;
            continue;
        }
        ck_assert_msg(io.bytes[w] == r.bytes_read, "%s (d %d, G %d) query at %d: bytes_read GPU %llu, CPU %llu",
                      m->name, d, G, x->pos[w], (unsigned long long)io.bytes[w], (unsigned long long)r.bytes_read);
        const double v_rms = sqrt(v_sq / (double)(n_att ? n_att : 1));
        for (int g = 0; g < G; g++) {
            double e = 0;
            for (int i = 0; i < d; i++) {
                const double dv = (double)io.out[((size_t)w * G + g) * d + i] - out[g * d + i];
                e += dv * dv;
            }
            e = sqrt(e) / v_rms;
            ck_assert_msg(e <= OUT_TOL, "%s (d %d, G %d) query at %d head %d: error %.3g x value RMS (limit %g)",
                          m->name, d, G, x->pos[w], g, e, OUT_TOL);
            if (e > st->worst)
                st->worst = e;
        }
    }
    free(out);
    free(att);
    m->free_state(state);
    gpu_io_free(&io);
    mkv_cdump_close(c);
    unlink(path);
}

START_TEST(gpu_paths_match_cpu_attend)
{
    uint64_t rs = seed;
    head_case cases[sizeof shapes / sizeof shapes[0]];
    const int n_cases = (int)(sizeof shapes / sizeof shapes[0]);
    for (int i = 0; i < n_cases; i++)
        head_case_make(&cases[i], &shapes[i], &rs);
    int with_gpu = 0;
    for (int k = 0; mkv_methods[k]; k++) {
        const mkv_method *m = mkv_methods[k];
        if (!mkv_gpu_method_of(m))
            continue;
        with_gpu++;
        compare_stats st = {0, 0, 0};
        for (int i = 0; i < n_cases; i++)
            compare_method(m, &cases[i], &st);
        printf("check_gpu_methods: %s: %d queries, %d with a selection flip, worst error %.3g x value RMS\n",
               m->name, st.queries, st.flipped, st.worst);
        ck_assert_msg(st.flipped * 4 <= st.queries, "%s: %d of %d queries attended other tokens than the CPU",
                      m->name, st.flipped, st.queries);
    }
    ck_assert_msg(with_gpu > 0, "no method of the registry has a GPU path");
    for (int i = 0; i < n_cases; i++)
        head_case_free(&cases[i]);
}
END_TEST

START_TEST(methods_without_gpu_path_say_why)
{
    const shape s = {128, 4, 256};
    mkv_dump_meta meta;
    fill_meta(&meta, &s);
    for (int k = 0; mkv_methods[k]; k++) {
        const mkv_method *m = mkv_methods[k];
        mkv_params p;
        mkv_error err = {0};
        ck_assert_msg(params_for(m, &p, &err) == MKV_OK, "%s: %s", m->name, err.msg);
        char why[256] = "";
        const int usable = mkv_gpu_method_usable(m, &p, &meta, why, sizeof why);
        if (mkv_gpu_method_of(m)) {
            ck_assert_msg(usable == 1, "%s has a GPU path but is not usable: %s", m->name, why);
            continue;
        }
        ck_assert_msg(usable == -1 && strstr(why, m->name) && strstr(why, "no GPU path"),
                      "%s: usable %d, reason '%s'", m->name, usable, why);
        gpu_io io = {0};
        ck_assert_int_eq(mkv_gpu_method_attend(m, &p, NULL, 0, 0, &io.gq, &io.ga, &err), MKV_EUNSUP);
        ck_assert_msg(strstr(err.msg, m->name) != NULL, "%s: attend refused with '%s'", m->name, err.msg);
    }
}
END_TEST

START_TEST(shapes_no_kernel_takes_are_refused)
{
    const shape odd[] = {{96, 4, 256}, {128, 16, 256}};
    const char *const reason[] = {"head_dim 96", "16 query heads"};
    for (int k = 0; mkv_methods[k]; k++) {
        const mkv_method *m = mkv_methods[k];
        if (!mkv_gpu_method_of(m))
            continue;
        mkv_params p;
        mkv_error err = {0};
        ck_assert_msg(params_for(m, &p, &err) == MKV_OK, "%s: %s", m->name, err.msg);
        for (int i = 0; i < 2; i++) {
            mkv_dump_meta meta;
            fill_meta(&meta, &odd[i]);
            char why[256] = "";
            ck_assert_int_eq(mkv_gpu_method_usable(m, &p, &meta, why, sizeof why), -1);
            ck_assert_msg(strstr(why, reason[i]) != NULL, "%s: reason '%s', want '%s'", m->name, why, reason[i]);
        }
    }
}
END_TEST

/* Without a usable GPU: every method is reported unusable with a reason,
 * and every GPU path fails with want, leaving the answers unwritten. */
static int check_clean_failure(mkv_status want)
{
    uint64_t rs = 1;
    head_case x;
    head_case_make(&x, &shapes[0], &rs);
    mkv_dump_meta meta;
    fill_meta(&meta, &x.s);
    int bad = 0;
    for (int k = 0; mkv_methods[k] && !bad; k++) {
        const mkv_method *m = mkv_methods[k];
        mkv_params p;
        mkv_error err = {0};
        char why[256] = "", path[512], name[64];
        if (params_for(m, &p, &err) != MKV_OK || mkv_gpu_method_usable(m, &p, &meta, why, sizeof why) != 0 ||
            !why[0]) {
            fprintf(stderr, "check_gpu_methods: FAIL: %s without a GPU: usable, or no reason ('%s')\n", m->name, why);
            bad = 1;
            break;
        }
        if (!mkv_gpu_method_of(m))
            continue;
        snprintf(name, sizeof name, "clean-%s.h5", m->name);
        test_path(path, sizeof path, name);
        mkv_cdump *c = NULL;
        if (compress_to(m, &p, &x, path, &err) != MKV_OK || mkv_cdump_open(path, &c, &err) != MKV_OK) {
            fprintf(stderr, "check_gpu_methods: FAIL: %s: %s\n", m->name, err.msg);
            bad = 1;
            unlink(path);
            break;
        }
        gpu_io io;
        gpu_io_make(&io, &x);
        const int rc = mkv_gpu_method_attend(m, &p, c, 0, 0, &io.gq, &io.ga, &err);
        int written = 0;
        for (size_t i = 0; i < (size_t)NQ * (size_t)x.s.G * (size_t)x.s.d; i++)
            written |= !isnan(io.out[i]);
        if (rc != (int)want || !err.msg[0] || written) {
            fprintf(stderr, "check_gpu_methods: FAIL: %s GPU attend without a GPU returned %d '%s'%s, want %d\n",
                    m->name, rc, err.msg, written ? " and wrote answers" : "", (int)want);
            bad = 1;
        }
        gpu_io_free(&io);
        mkv_cdump_close(c);
        unlink(path);
    }
    head_case_free(&x);
    return bad;
}

static Suite *methods_suite(void)
{
    Suite *s = suite_create("gpu_methods");
    TCase *tc = tcase_create("registry");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, gpu_paths_match_cpu_attend);
    tcase_add_test(tc, methods_without_gpu_path_say_why);
    tcase_add_test(tc, shapes_no_kernel_takes_are_refused);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    seed = gpu_test_seed("check_gpu_methods");
    return gpu_test_main("check_gpu_methods", methods_suite, check_clean_failure);
}
