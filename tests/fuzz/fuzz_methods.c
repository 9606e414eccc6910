/* Fuzz harness: every method's loader and attend over damaged arrays
 * (methods/method.h), with the HDF5 layer kept sound. The byte-level
 * cdump harness mostly meets libhdf5's own parsing; this one damages what
 * the methods store, as a reader of a file with intact HDF5 structures but
 * wrong contents would see it: a bitmap with too few bits, an index out of
 * range, a segment table that disagrees with its arrays, a NaN scale.
 *
 * The input is a stream of decisions (bytes; past its end every byte is 0,
 * so an empty input is an undamaged run): byte 0 picks the method of the
 * registry, byte 1 a parameter set of it; the method compresses a fixed
 * synthetic cache (2 KV heads x 2 query heads, T = 80, head_dim 16, 4
 * queries) into an in-memory compressed dump, and each array and
 * attribute it stores (mkv_cdump_put, _put_rows, _put_attr_int,
 * _put_attr_double, wrapped at link time: -Wl,--wrap) takes the next
 * decision: kept, elements set to extreme values, its first dimension cut
 * or grown, filled with one byte, or left out. The dump is then read back
 * (mkv_cdump_commit_open: the same checks as a file) and every head loaded
 * and attended at three positions: a load may refuse, with a message; it
 * may not crash, read outside an array (AddressSanitizer), or leak. */
#include "config.h"
#include "fuzz.h"
#include "core/half.h"
#include "io/cdump.h"
#include "methods/method.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_L 1
#define N_KV 2
#define N_G 2
#define N_T 80
#define N_D 16
#define N_W 4

/* ---------------------------------------------------------------- decisions */

static const uint8_t *in_data;
static size_t in_size, in_at;

static unsigned next(void)
{
    return in_at < in_size ? in_data[in_at++] : 0;
}

static unsigned next16(void)
{
    unsigned a = next();
    return a | next() << 8;
}

/* ---------------------------------------------------------------- the cache */

static float kbuf[N_KV][N_T][N_D], vbuf[N_KV][N_T][N_D], qbuf[N_KV][N_G][N_W][N_D];
static int32_t query_pos[N_W];

static void make_cache(void)
{
    static int made;
    if (made)
        return;
    made = 1;
    uint64_t s = 0x9e3779b97f4a7c15ULL;
    for (int h = 0; h < N_KV; h++)
        for (int t = 0; t < N_T; t++)
            for (int c = 0; c < N_D; c++) {
                s = s * 6364136223846793005ULL + 1442695040888963407ULL;
                double u = (double)(s >> 11) / 9007199254740992.0 - 0.5;
                /* a few strong channels, as real keys have */
                kbuf[h][t][c] = (float)(u * (c % 5 == 0 ? 8.0 : 1.0) + 0.1 * sin(0.3 * t + c));
                vbuf[h][t][c] = (float)(u * 2.0 + 0.05 * c);
            }
    for (int h = 0; h < N_KV; h++)
        for (int g = 0; g < N_G; g++)
            for (int w = 0; w < N_W; w++)
                for (int c = 0; c < N_D; c++)
                    qbuf[h][g][w][c] = kbuf[h][N_T - N_W + w][c] * 0.5f + (float)(0.01 * (g + 1) * c);
    for (int w = 0; w < N_W; w++)
        query_pos[w] = N_T - N_W + w;
}

/* Parameter sets per method (as tests/fuzz/make-corpus compresses); the
 * defaults for a method not named. */
static const char *param_set(const char *method, unsigned pick)
{
    static const struct {
        const char *method, *sets[3];
    } table[] = {
        {"mosaic", {"sink=2 recent=8 segment=32 block=4", "sink=2 recent=8 segment=32 block=4 strategy=fixed group=2 keep=0.5",
                    "sink=2 recent=8 segment=16 block=4 strategy=dynamic rotate=off"}},
        {"uniform2d", {"sink=2 recent=8 segment=32 block=4", "sink=0 recent=0 segment=16 block=8 keep=0.5", NULL}},
        {"quest", {"page=8 recent=8 sink=2", "page=16 recent=0 sink=0 budget=20", NULL}},
        {"naive2d", {"page=8 recent=8 sink=2", "page=4 keep=0.25 budget=0.5", NULL}},
        {"think", {"recent=8 window=2", "keep=0.25 recent=0 window=4", NULL}},
        {"kivi", {"group=8 residual=8", "bits=4 group=4 residual=4", "bits=2 group=16 residual=0"}},
        {"snapkv", {"window=2 kernel=3", "keep=20 window=4 kernel=1 sink=0", NULL}},
        {"streaming", {"sink=2 keep=0.3", "sink=0 keep=10", NULL}},
        {"turboquant", {"key_bits=3 value_bits=2", "key_bits=2 value_bits=4 prod=on", "key_bits=1 value_bits=1 prod=on"}},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strcmp(table[i].method, method) == 0) {
            int n = 0;
            while (n < 3 && table[i].sets[n])
                n++;
            return table[i].sets[pick % (unsigned)n];
        }
    return "";
}

/* ---------------------------------------------------------------- damage */

int __real_mkv_cdump_put(mkv_cdump_writer *w, int layer, int head, const char *name, mkv_el_type type, int rank,
                         const int64_t *dims, const void *data, mkv_error *err);
int __real_mkv_cdump_put_rows(mkv_cdump_writer *w, int layer, int head, const char *name, mkv_el_type type,
                              int64_t rows, int64_t cols, const void *data, mkv_error *err);
int __real_mkv_cdump_put_attr_int(mkv_cdump_writer *w, int layer, int head, const char *name, int64_t v,
                                  mkv_error *err);
int __real_mkv_cdump_put_attr_double(mkv_cdump_writer *w, int layer, int head, const char *name, double v,
                                     mkv_error *err);

static const int64_t int_values[] = {0, 1, -1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 63, 64, 79, 80, 81, 127, 128, 255,
                                     256, 32767, -32768, 65535, 2147483647, -2147483647 - 1};
#define N_INT_VALUES (sizeof int_values / sizeof int_values[0])

static float float_value(unsigned pick)
{
    switch (pick % 10) {
    case 0: return 0.0f;
    case 1: return NAN;
    case 2: return INFINITY;
    case 3: return -INFINITY;
    case 4: return 65504.0f;     /* the largest float16 */
    case 5: return -1.0f;
    case 6: return 1e-8f;
    case 7: return 1e30f;
    case 8: return (float)(int)next16();
    default: return 0.5f;
    }
}

static void set_element(void *data, mkv_el_type type, size_t i, unsigned pick)
{
    int64_t v = int_values[pick % N_INT_VALUES];
    switch (type) {
    case MKV_EL_U8: ((uint8_t *)data)[i] = (uint8_t)v; break;
    case MKV_EL_I16: ((int16_t *)data)[i] = (int16_t)v; break;
    case MKV_EL_I32: ((int32_t *)data)[i] = (int32_t)v; break;
    case MKV_EL_F16_BITS: ((uint16_t *)data)[i] = mkv_f32_to_f16(float_value(pick)); break;
    default: ((float *)data)[i] = float_value(pick); break;
    }
}

static size_t host_size(mkv_el_type type)
{
    return type == MKV_EL_U8 ? 1 : type == MKV_EL_I16 || type == MKV_EL_F16_BITS ? 2 : 4;
}

int __wrap_mkv_cdump_put(mkv_cdump_writer *w, int layer, int head, const char *name, mkv_el_type type, int rank,
                         const int64_t *dims, const void *data, mkv_error *err)
{
    unsigned op = next();
    if (op < 0x80 || rank < 1 || rank > 3)
        return __real_mkv_cdump_put(w, layer, head, name, type, rank, dims, data, err);
    int64_t nd[3] = {dims[0], rank > 1 ? dims[1] : 1, rank > 2 ? dims[2] : 1};
    size_t row = (size_t)(nd[1] * nd[2]), numel = (size_t)nd[0] * row, es = host_size(type);
    int64_t d0 = nd[0];
    switch (op % 5) {
    case 0: /* left out */
        return MKV_OK;
    case 1: /* first dimension cut */
        d0 = nd[0] > 0 ? nd[0] - 1 - (int64_t)(next() % (unsigned)(nd[0] < 3 ? nd[0] : 3)) : 0;
        break;
    case 2: /* first dimension grown by a row or two of zeros */
        d0 = nd[0] + 1 + next() % 2;
        break;
    default: /* elements changed, or every byte the same */
        break;
    }
    size_t n = (size_t)d0 * row;
    unsigned char *copy = calloc(n ? n : 1, es);
    if (!copy)
        fuzz_bug("out of memory");
    memcpy(copy, data, (n < numel ? n : numel) * es);
    if (op % 5 == 3 && n) {
        for (unsigned k = 1 + next() % 4; k > 0; k--)
            set_element(copy, type, next16() % n, next());
    } else if (op % 5 == 4 && n) {
        unsigned pick = next();
        if (type == MKV_EL_U8 || type == MKV_EL_I16 || type == MKV_EL_I32)
            memset(copy, pick & 1 ? 0xff : 0, n * es);
        else
            for (size_t i = 0; i < n; i++)
                set_element(copy, type, i, pick);
    }
    int64_t newdims[3] = {d0, nd[1], nd[2]};
    int rc = __real_mkv_cdump_put(w, layer, head, name, type, rank, newdims, copy, err);
    free(copy);
    return rc;
}

int __wrap_mkv_cdump_put_rows(mkv_cdump_writer *w, int layer, int head, const char *name, mkv_el_type type,
                              int64_t rows, int64_t cols, const void *data, mkv_error *err)
{
    if (rows <= 0)   /* absent means empty: nothing to damage */
        return __real_mkv_cdump_put_rows(w, layer, head, name, type, rows, cols, data, err);
    int64_t dims[2] = {rows, cols};
    return __wrap_mkv_cdump_put(w, layer, head, name, type, 2, dims, data, err);
}

int __wrap_mkv_cdump_put_attr_int(mkv_cdump_writer *w, int layer, int head, const char *name, int64_t v,
                                  mkv_error *err)
{
    unsigned op = next();
    if (op >= 0xc0)
        v = op & 1 ? v + (int64_t)(op % 7) - 3 : int_values[next() % N_INT_VALUES];
    return __real_mkv_cdump_put_attr_int(w, layer, head, name, v, err);
}

int __wrap_mkv_cdump_put_attr_double(mkv_cdump_writer *w, int layer, int head, const char *name, double v,
                                     mkv_error *err)
{
    unsigned op = next();
    if (op >= 0xc0)
        v = float_value(next());
    return __real_mkv_cdump_put_attr_double(w, layer, head, name, v, err);
}

/* ---------------------------------------------------------------- the run */

static int n_methods(void)
{
    int n = 0;
    while (mkv_methods[n])
        n++;
    return n;
}

/* The G query rows of the cache's last query for KV head `head`. */
static void attend_head(const mkv_method *m, const mkv_params *p, mkv_cdump *c, int head)
{
    static float q[N_G * N_D];
    for (int g = 0; g < N_G; g++)
        memcpy(q + g * N_D, qbuf[head][g][N_W - 1], sizeof(float) * N_D);
    const int64_t positions[3] = {0, N_T / 2, N_T - 1};
    fuzz_load_attend(m, p, c, 0, head, q, positions, 3);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    make_cache();
    in_data = data;
    in_size = size;
    in_at = 0;
    const mkv_method *m = mkv_methods[next() % (unsigned)n_methods()];
    mkv_error err;
    mkv_params p;
    mkv_params_init(&p, m->params);
    const char *set = param_set(m->name, next());
    if (*set && mkv_params_parse_list(&p, set, &err) < 0)
        fuzz_bug("method '%s': the harness's parameters: %s", m->name, err.msg);

    mkv_cdump_meta cm;
    memset(&cm, 0, sizeof cm);
    snprintf(cm.method, sizeof cm.method, "%s", m->name);
    mkv_params_format(&p, cm.params, sizeof cm.params);
    strcpy(cm.source, "fuzz");
    mkv_dump_meta_init(&cm.raw);
    cm.raw.n_layers = N_L;
    cm.raw.n_heads = N_KV * N_G;
    cm.raw.n_kv_heads = N_KV;
    cm.raw.head_dim = N_D;
    cm.raw.n_tokens = N_T;
    cm.raw.n_queries = N_W;
    if (m->check(&p, &cm.raw, &err))
        fuzz_bug("method '%s': the harness's parameters do not fit: %s", m->name, err.msg);
    mkv_cdump_writer *w = NULL;
    if (mkv_cdump_create_memory(&cm, query_pos, &w, &err))
        fuzz_bug("mkv_cdump_create_memory: %s", err.msg);
    int rc = MKV_OK;
    for (int h = 0; h < N_KV && !rc; h++) {
        mkv_head_kv kv = {.layer = 0, .head = h, .T = N_T, .d = N_D, .G = N_G, .k = &kbuf[h][0][0], .v = &vbuf[h][0][0],
                          .W = N_W, .q = &qbuf[h][0][0][0], .query_pos = query_pos, .threads = 1};
        rc = m->compress(&p, &kv, w, &err);
        /* a damaged array can be refused as it is stored (a NaN, an
         * infinity): then there is nothing to read */
        fuzz_check_refusal(rc, &err, "compress");
    }
    if (rc) {
        mkv_cdump_abort(w);
        return 0;
    }
    mkv_cdump *c = NULL;
    rc = mkv_cdump_commit_open(w, &c, &err);
    fuzz_check_refusal(rc, &err, "mkv_cdump_commit_open");
    if (rc)
        return 0;
    for (int h = 0; h < N_KV; h++)
        attend_head(m, &p, c, h);
    mkv_cdump_close(c);
    return 0;
}
