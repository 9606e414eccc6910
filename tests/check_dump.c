/* Unit tests: KV dump v1 I/O. Files written by our writer are read back
 * and compared with the values put in; defects are planted with the plain
 * HDF5 API (not our writer) and must be reported by the validator. */
#include "config.h"

#include <fcntl.h>
#include <hdf5.h>
#include <math.h>
#include <sys/stat.h>

#include "io/dump.h"
#include "io/h5file.h"
#include "core/half.h"
#include "core/log.h"
#include "testutil.h"

enum { L = 2, KVH = 2, NH = 4, T = 37, W = 5, D = 8 };

static float *make_values(int rows, int len, uint64_t seed)
{
    float *x = malloc(sizeof(float) * rows * len * D);
    uint64_t s = seed;
    for (int i = 0; i < rows * len * D; i++)
        x[i] = (float)((test_uniform(&s) - 0.5) * 8.0);
    return x;
}

static void fill_meta(mkv_dump_meta *m, mkv_dtype t)
{
    mkv_dump_meta_init(m);
    strcpy(m->model, "unit-test");
    m->n_layers = L;
    m->n_heads = NH;
    m->n_kv_heads = KVH;
    m->head_dim = D;
    m->n_tokens = T;
    m->n_queries = W;
    m->dtype = t;
    m->has_tokens = 1;
    strcpy(m->source, "capture");
}

/* Write a dump whose values are make_values(rows, len, seed = 100*layer + kind). */
static int write_dump(const char *path, mkv_dtype t, int deflate, mkv_error *err)
{
    mkv_dump_meta m;
    fill_meta(&m, t);
    mkv_dump_write_opts o;
    mkv_dump_write_opts_init(&o);
    o.deflate = deflate;
    o.chunk_tokens = 16;
    mkv_dump_writer *w;
    int rc = mkv_dump_create(path, &m, &o, &w, err);
    if (rc)
        return rc;
    for (int l = 0; l < L && !rc; l++)
        for (int k = 0; k < 3 && !rc; k++) {
            int rows = k == 2 ? NH : KVH, len = k == 2 ? W : T;
            float *x = make_values(rows, len, (uint64_t)(100 * l + k));
            rc = mkv_dump_write(w, l, "kvq"[k], 0, rows, 0, len, x, err);
            free(x);
        }
    int32_t tok[T], pos[W];
    for (int i = 0; i < T; i++)
        tok[i] = 3 * i + 1;
    for (int i = 0; i < W; i++)
        pos[i] = T - W + i;
    if (!rc)
        rc = mkv_dump_write_tokens(w, tok, err);
    if (!rc)
        rc = mkv_dump_write_query_pos(w, pos, err);
    if (rc) {
        mkv_dump_abort(w);
        return rc;
    }
    return mkv_dump_commit(w, err);
}

/* What storing x as t must give back. */
static float stored(mkv_dtype t, float x)
{
    return t == MKV_DTYPE_F16 ? mkv_f16_to_f32(mkv_f32_to_f16(x))
         : t == MKV_DTYPE_BF16 ? mkv_bf16_to_f32(mkv_f32_to_bf16(x)) : x;
}

static void check_roundtrip(mkv_dtype t)
{
    char path[256];
    char name[32];
    snprintf(name, sizeof name, "rt-%s.h5", mkv_dtype_name(t));
    test_path(path, sizeof path, name);
    mkv_error err;
    ck_assert_msg(write_dump(path, t, 4, &err) == MKV_OK, "%s", err.msg);
    mkv_dump *d;
    ck_assert_msg(mkv_dump_open(path, &d, &err) == MKV_OK, "%s", err.msg);
    const mkv_dump_meta *m = mkv_dump_meta_of(d);
    ck_assert_int_eq(m->n_layers, L);
    ck_assert_int_eq(m->n_heads, NH);
    ck_assert_int_eq(m->n_kv_heads, KVH);
    ck_assert_int_eq(m->head_dim, D);
    ck_assert_int_eq(m->n_tokens, T);
    ck_assert_int_eq(m->n_queries, W);
    ck_assert_int_eq(m->dtype, t);
    ck_assert_str_eq(m->model, "unit-test");
    ck_assert_str_eq(m->source, "capture");
    ck_assert_str_eq(m->k_rope, "post");
    ck_assert(m->has_tokens);
    /* relative error bound of one rounding: half an ulp */
    double tol = t == MKV_DTYPE_F32 ? 0 : t == MKV_DTYPE_F16 ? 0x1p-11 : 0x1p-8;
    for (int l = 0; l < L; l++)
        for (int k = 0; k < 3; k++) {
            int rows = k == 2 ? NH : KVH, len = k == 2 ? W : T;
            float *want = make_values(rows, len, (uint64_t)(100 * l + k));
            float *got = malloc(sizeof(float) * rows * len * D);
            ck_assert_msg(mkv_dump_read(d, l, "kvq"[k], 0, rows, 0, len, got, &err) == MKV_OK, "%s", err.msg);
            for (int i = 0; i < rows * len * D; i++) {
                ck_assert_msg(got[i] == stored(t, want[i]), "layer %d %c [%d]: %g vs %g", l, "kvq"[k], i,
                              got[i], want[i]);
                ck_assert(fabs(got[i] - want[i]) <= tol * fabs(want[i]) + 0x1p-24);
            }
            free(want);
            free(got);
        }
    int32_t tok[T], pos[W];
    ck_assert_int_eq(mkv_dump_read_tokens(d, tok, &err), MKV_OK);
    ck_assert_int_eq(mkv_dump_read_query_pos(d, pos, &err), MKV_OK);
    for (int i = 0; i < T; i++)
        ck_assert_int_eq(tok[i], 3 * i + 1);
    for (int i = 0; i < W; i++)
        ck_assert_int_eq(pos[i], T - W + i);
    uint64_t st, raw;
    ck_assert_int_eq(mkv_dump_storage_bytes(d, &st, &raw, &err), MKV_OK);
    ck_assert_uint_eq(raw, (uint64_t)L * (2 * KVH * T + NH * W) * D * mkv_dtype_size(t));
    ck_assert_uint_gt(st, 0);
    mkv_dump_close(d);
    ck_assert_int_eq(mkv_dump_validate(path, NULL, NULL, &err), 0);
    unlink(path);
}

START_TEST(roundtrip_f32) { check_roundtrip(MKV_DTYPE_F32); }
END_TEST
START_TEST(roundtrip_f16) { check_roundtrip(MKV_DTYPE_F16); }
END_TEST
START_TEST(roundtrip_bf16) { check_roundtrip(MKV_DTYPE_BF16); }
END_TEST

START_TEST(partial_reads)
{
    char path[256];
    mkv_error err;
    test_path(path, sizeof path, "partial.h5");
    ck_assert_int_eq(write_dump(path, MKV_DTYPE_F32, 1, &err), MKV_OK);
    mkv_dump *d;
    ck_assert_int_eq(mkv_dump_open(path, &d, &err), MKV_OK);
    float *all = make_values(KVH, T, 100 * 1 + 1); /* layer 1, v */
    float part[1 * 11 * D];
    ck_assert_int_eq(mkv_dump_read(d, 1, 'v', 1, 1, 10, 11, part, &err), MKV_OK);
    for (int t = 0; t < 11; t++)
        for (int c = 0; c < D; c++)
            ck_assert(part[t * D + c] == all[(1 * T + 10 + t) * D + c]);
    /* reading past the end or a bad layer is refused with a message */
    ck_assert_int_eq(mkv_dump_read(d, 1, 'v', 1, 1, 30, 11, part, &err), MKV_EUSAGE);
    ck_assert_ptr_nonnull(strstr(err.msg, "positions 30..40 are out of range 0..36"));
    ck_assert_int_eq(mkv_dump_read(d, 2, 'k', 0, 1, 0, 1, part, &err), MKV_EUSAGE);
    ck_assert_int_eq(mkv_dump_read(d, 0, 'x', 0, 1, 0, 1, part, &err), MKV_EUSAGE);
    free(all);
    mkv_dump_close(d);
    unlink(path);
}
END_TEST

static void collect(void *ctx, const char *problem)
{
    char *buf = ctx;
    strcat(buf, problem);
    strcat(buf, "\n");
}

/* Make a valid dump, apply a defect with plain HDF5, validate. */
typedef void (*defect_fn)(hid_t fid);

static void defect_no_attr(hid_t f) { H5Adelete(f, "n_layers"); }

/* Replace attribute name with the string v: fixed-length (null-terminated),
 * or variable-length as h5py and earlier versions write them. */
static void put_str_as(hid_t f, const char *name, const char *v, int vlen)
{
    H5Adelete(f, name);
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, vlen ? H5T_VARIABLE : strlen(v) + 1);
    H5Tset_cset(t, vlen ? H5T_CSET_UTF8 : H5T_CSET_ASCII);
    hid_t s = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, name, t, s, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, t, vlen ? (const void *)&v : v);
    H5Aclose(a);
    H5Sclose(s);
    H5Tclose(t);
}

static void put_str(hid_t f, const char *name, const char *v) { put_str_as(f, name, v, 0); }

static void defect_format(hid_t f) { put_str(f, "mkv_format", "something-else"); }
static void defect_krope(hid_t f) { put_str(f, "k_rope", "sideways"); }

/* Overwrite the existing attribute name with *v of mem_type. */
static void set_attr(hid_t f, const char *name, hid_t mem_type, const void *v)
{
    hid_t a = H5Aopen(f, name, H5P_DEFAULT);
    H5Awrite(a, mem_type, v);
    H5Aclose(a);
}

static void defect_version(hid_t f)
{
    int v = 2;
    set_attr(f, "mkv_version", H5T_NATIVE_INT, &v);
}

static void defect_shape(hid_t f)
{
    H5Ldelete(f, "/layers/01/k", H5P_DEFAULT);
    hsize_t dims[3] = {KVH, T - 1, D};
    hid_t s = H5Screate_simple(3, dims, NULL);
    hid_t ds = H5Dcreate2(f, "/layers/01/k", H5T_IEEE_F32LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    float *zeros = calloc(KVH * T * D, sizeof(float));
    H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, zeros);
    free(zeros);
    H5Dclose(ds);
    H5Sclose(s);
}

static void defect_nan(hid_t f)
{
    hid_t ds = H5Dopen2(f, "/layers/00/k", H5P_DEFAULT);
    float *x = malloc(sizeof(float) * KVH * T * D);
    H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x);
    x[(1 * T + 5) * D + 3] = NAN;
    x[(1 * T + 6) * D + 0] = INFINITY;
    H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x);
    free(x);
    H5Dclose(ds);
}

static void defect_query_pos(hid_t f)
{
    hid_t ds = H5Dopen2(f, "/query_pos", H5P_DEFAULT);
    int32_t pos[W] = {0, 1, 2, 3, T};
    H5Dwrite(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, pos);
    H5Dclose(ds);
}

static void defect_missing_v(hid_t f) { H5Ldelete(f, "/layers/00/v", H5P_DEFAULT); }

static void check_defect(defect_fn fn, const char *expect, int open_fails)
{
    char path[256], problems[4096] = "";
    mkv_error err;
    test_path(path, sizeof path, "defect.h5");
    ck_assert_int_eq(write_dump(path, MKV_DTYPE_F32, 0, &err), MKV_OK);
    ck_assert_int_eq(mkv_dump_validate(path, collect, problems, &err), 0);
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    ck_assert(f >= 0);
    fn(f);
    H5Fclose(f);
    int n = mkv_dump_validate(path, collect, problems, &err);
    ck_assert_msg(n >= 1, "defect not found (expected '%s')", expect);
    ck_assert_msg(strstr(problems, expect), "expected '%s' in:\n%s", expect, problems);
    mkv_dump *d;
    if (open_fails) {
        ck_assert_int_eq(mkv_dump_open(path, &d, &err), MKV_EFORMAT);
        ck_assert_ptr_nonnull(strstr(err.msg, path));
    }
    unlink(path);
}

START_TEST(validation_finds_defects)
{
    mkv_h5_quiet();
    check_defect(defect_no_attr, "missing attribute 'n_layers'", 1);
    check_defect(defect_format, "mkv_format is 'something-else', expected 'mosaickv-dump'", 1);
    check_defect(defect_version, "unsupported mkv_version 2", 1);
    check_defect(defect_krope, "k_rope='sideways' must be 'post' or 'pre'", 1);
    check_defect(defect_shape, "/layers/01/k: shape [2,36,8] does not match n_kv_heads=2, T=37, head_dim=8", 1);
    check_defect(defect_nan, "/layers/00/k: NaN at [1,5,3] (2 non-finite values)", 0);
    check_defect(defect_query_pos, "/query_pos: position 37 at index 4 is outside 0..36", 0);
    check_defect(defect_missing_v, "missing dataset /layers/00/v", 1);
}
END_TEST

static void defect_rope_inf(hid_t f)
{
    double inf = INFINITY;
    set_attr(f, "rope_theta", H5T_NATIVE_DOUBLE, &inf);
}

static void defect_heads(hid_t f)
{
    int v = 3;
    set_attr(f, "n_heads", H5T_NATIVE_INT, &v);
}

/* /tokens rewritten as int64 with one id beyond int32 (2^33 + 5 would read
 * back as INT32_MAX through a conversion to int32) */
static void defect_tokens_int64(hid_t f)
{
    H5Ldelete(f, "/tokens", H5P_DEFAULT);
    int64_t tok[T];
    for (int i = 0; i < T; i++)
        tok[i] = i;
    tok[3] = ((int64_t)1 << 33) + 5;
    hsize_t n = T;
    hid_t s = H5Screate_simple(1, &n, NULL);
    hid_t ds = H5Dcreate2(f, "/tokens", H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, tok);
    H5Dclose(ds);
    H5Sclose(s);
}

/* A dataset of shape [KVH, tokens, D] in place of /layers/NN/<kind>, chunked
 * and never written: what one damaged byte of its dimensions looks like. */
static void claim_tokens(hid_t f, const char *name, hsize_t tokens)
{
    H5Ldelete(f, name, H5P_DEFAULT);
    hsize_t dims[3] = {KVH, tokens, D}, chunk[3] = {1, 16, D};
    hid_t s = H5Screate_simple(3, dims, NULL);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 3, chunk);
    hid_t ds = H5Dcreate2(f, name, H5T_IEEE_F32LE, s, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    H5Dclose(ds);
    H5Pclose(dcpl);
    H5Sclose(s);
}

static void defect_huge_k(hid_t f) { claim_tokens(f, "/layers/00/k", (hsize_t)1 << 48); }

/* every k and v claims 2^48 tokens and /tokens is gone: the shapes agree,
 * only the file's size tells */
static void defect_huge_all(hid_t f)
{
    H5Ldelete(f, "/tokens", H5P_DEFAULT);
    for (int l = 0; l < L; l++) {
        char name[32];
        snprintf(name, sizeof name, "/layers/%02d/k", l);
        claim_tokens(f, name, (hsize_t)1 << 48);
        snprintf(name, sizeof name, "/layers/%02d/v", l);
        claim_tokens(f, name, (hsize_t)1 << 48);
    }
}

START_TEST(metadata_and_extent_defects)
{
    check_defect(defect_rope_inf, "rope_theta=inf must be finite and positive", 1);
    check_defect(defect_heads, "n_heads=3 is not a multiple of n_kv_heads=2", 1);
    check_defect(defect_huge_k, "/layers/00/k: shape [2,281474976710656,8] does not match n_kv_heads=2, T=37",
                 1);
    check_defect(defect_huge_all, "/layers/00/k: shape [2,281474976710656,8] claims 1.8e+16 bytes, more than "
                 "a file of ", 1);
    /* open blames the dimensions, before any value is read */
    char path[256];
    mkv_error err;
    mkv_dump *d;
    test_path(path, sizeof path, "huge.h5");
    ck_assert_int_eq(write_dump(path, MKV_DTYPE_F32, 0, &err), MKV_OK);
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    defect_huge_k(f);
    H5Fclose(f);
    ck_assert_int_eq(mkv_dump_open(path, &d, &err), MKV_EFORMAT);
    ck_assert_msg(strstr(err.msg, "/layers/00/k: shape [2,281474976710656,8] claims 1.8e+16 bytes, more than a "
                         "file of "), "%s", err.msg);
    unlink(path);
}
END_TEST

static void defect_long_model(hid_t f)
{
    char v[301];
    memset(v, 'm', 300);
    v[300] = '\0';
    put_str(f, "model", v);
}

/* Strings are written fixed-length (no global heap), read in either form,
 * and one longer than its field is refused, not cut. */
START_TEST(string_attributes)
{
    char path[256];
    mkv_error err;
    test_path(path, sizeof path, "strings.h5");
    ck_assert_int_eq(write_dump(path, MKV_DTYPE_BF16, 0, &err), MKV_OK);
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    const char *names[] = {"mkv_format", "model", "k_rope", "source", "created_by", "/layers/00/k:dtype"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *colon = strchr(names[i], ':');
        char obj[64] = "/";
        if (colon)
            snprintf(obj, sizeof obj, "%.*s", (int)(colon - names[i]), names[i]);
        hid_t a = H5Aopen_by_name(f, obj, colon ? colon + 1 : names[i], H5P_DEFAULT, H5P_DEFAULT);
        ck_assert_msg(a >= 0, "%s", names[i]);
        hid_t t = H5Aget_type(a);
        ck_assert_msg(H5Tget_class(t) == H5T_STRING && H5Tis_variable_str(t) == 0 &&
                      H5Tget_strpad(t) == H5T_STR_NULLPAD, "%s is not a fixed-length string", names[i]);
        H5Tclose(t);
        H5Aclose(a);
    }
    put_str_as(f, "model", "written by h5py", 1);
    H5Fclose(f);
    mkv_dump *d;
    ck_assert_int_eq(mkv_dump_open(path, &d, &err), MKV_OK);
    ck_assert_str_eq(mkv_dump_meta_of(d)->model, "written by h5py");
    mkv_dump_close(d);
    unlink(path);
    check_defect(defect_long_model, "attribute 'model' is longer than 255 bytes", 1);
}
END_TEST

/* Index values out of range: the validator names the first; open succeeds
 * (the shapes are right) and the reader refuses them as a data error. */
START_TEST(index_ranges)
{
    char path[256], problems[4096];
    mkv_error err;
    test_path(path, sizeof path, "index.h5");
    /* -5 would index before the scores, INT32_MAX overflows p + 1, 2^30
     * asks for gigabytes: all are outside 0..T-1 */
    const int32_t bad[] = {-5, T, INT32_MAX, 1 << 30};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(write_dump(path, MKV_DTYPE_F32, 0, &err), MKV_OK);
        hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
        hid_t ds = H5Dopen2(f, "/query_pos", H5P_DEFAULT);
        int32_t pos[W] = {0, 1, bad[i], 3, 4};
        H5Dwrite(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, pos);
        H5Dclose(ds);
        H5Fclose(f);
        char want[128];
        snprintf(want, sizeof want, "/query_pos: position %d at index 2 is outside 0..36", bad[i]);
        problems[0] = 0;
        ck_assert_int_eq(mkv_dump_validate(path, collect, problems, &err), 1);
        ck_assert_msg(strstr(problems, want), "expected '%s' in:\n%s", want, problems);
        mkv_dump *d;
        ck_assert_int_eq(mkv_dump_open(path, &d, &err), MKV_OK);
        int32_t got[W];
        ck_assert_int_eq(mkv_dump_read_query_pos(d, got, &err), MKV_EFORMAT);
        ck_assert_msg(strstr(err.msg, want), "%s", err.msg);
        mkv_dump_close(d);
    }

    ck_assert_int_eq(write_dump(path, MKV_DTYPE_F32, 0, &err), MKV_OK);
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    defect_tokens_int64(f);
    H5Fclose(f);
    const char *want = "/tokens: token id 8589934597 at index 3 is outside 0..2147483647";
    problems[0] = 0;
    ck_assert_int_eq(mkv_dump_validate(path, collect, problems, &err), 1);
    ck_assert_msg(strstr(problems, want), "expected '%s' in:\n%s", want, problems);
    mkv_dump *d;
    ck_assert_int_eq(mkv_dump_open(path, &d, &err), MKV_OK);
    int32_t tok[T];
    ck_assert_int_eq(mkv_dump_read_tokens(d, tok, &err), MKV_EFORMAT);
    ck_assert_msg(strstr(err.msg, want), "%s", err.msg);
    mkv_dump_close(d);
    /* an int64 /tokens within range reads as it is */
    f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t ds = H5Dopen2(f, "/tokens", H5P_DEFAULT);
    int64_t fixed = 7;
    hsize_t at = 3, one = 1;
    hid_t fs = H5Dget_space(ds), ms = H5Screate_simple(1, &one, NULL);
    H5Sselect_hyperslab(fs, H5S_SELECT_SET, &at, NULL, &one, NULL);
    H5Dwrite(ds, H5T_NATIVE_INT64, ms, fs, H5P_DEFAULT, &fixed);
    H5Sclose(ms);
    H5Sclose(fs);
    H5Dclose(ds);
    H5Fclose(f);
    ck_assert_int_eq(mkv_dump_validate(path, collect, problems, &err), 0);
    ck_assert_int_eq(mkv_dump_open(path, &d, &err), MKV_OK);
    ck_assert_int_eq(mkv_dump_read_tokens(d, tok, &err), MKV_OK);
    for (int i = 0; i < T; i++)
        ck_assert_int_eq(tok[i], i == 3 ? 7 : i);
    mkv_dump_close(d);
    unlink(path);
}
END_TEST

START_TEST(open_errors)
{
    char path[256];
    mkv_error err;
    mkv_dump *d;
    ck_assert_int_eq(mkv_dump_open("/nonexistent/x.h5", &d, &err), MKV_EIO);
    ck_assert_str_eq(err.msg, "cannot open '/nonexistent/x.h5': No such file or directory");
    test_path(path, sizeof path, "empty.h5");
    FILE *fp = fopen(path, "w");
    fclose(fp);
    ck_assert_int_eq(mkv_dump_open(path, &d, &err), MKV_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "is empty"));
    fp = fopen(path, "w");
    fputs("this is text, not HDF5\n", fp);
    fclose(fp);
    ck_assert_int_eq(mkv_dump_open(path, &d, &err), MKV_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "is not an HDF5 file"));
    /* truncated: a valid dump cut in half */
    char full[256];
    test_path(full, sizeof full, "full.h5");
    ck_assert_int_eq(write_dump(full, MKV_DTYPE_F32, 0, &err), MKV_OK);
    struct stat st;
    stat(full, &st);
    ck_assert_int_eq(truncate(full, st.st_size / 2), 0);
    ck_assert_int_eq(mkv_dump_open(full, &d, &err), MKV_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "is truncated or damaged"));
    unlink(full);
    unlink(path);
}
END_TEST

START_TEST(pipe_roundtrip)
{
    /* write to "-" (stdout is a file here, not a terminal), then read the
     * same bytes back from "-" on stdin */
    char path[256];
    mkv_error err;
    test_path(path, sizeof path, "pipe.h5");
    fflush(stdout);
    int saved_out = dup(STDOUT_FILENO);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, STDOUT_FILENO);
    close(fd);
    int rc = write_dump("-", MKV_DTYPE_F16, 4, &err);
    fflush(stdout);
    dup2(saved_out, STDOUT_FILENO);
    close(saved_out);
    ck_assert_msg(rc == MKV_OK, "%s", err.msg);
    ck_assert_int_eq(mkv_dump_validate(path, NULL, NULL, &err), 0);

    int saved_in = dup(STDIN_FILENO);
    fd = open(path, O_RDONLY);
    dup2(fd, STDIN_FILENO);
    close(fd);
    mkv_dump *d;
    rc = mkv_dump_open("-", &d, &err);
    dup2(saved_in, STDIN_FILENO);
    close(saved_in);
    ck_assert_msg(rc == MKV_OK, "%s", err.msg);
    float *want = make_values(NH, W, 100 * 1 + 2);
    float got[NH * W * D];
    ck_assert_int_eq(mkv_dump_read(d, 1, 'q', 0, NH, 0, W, got, &err), MKV_OK);
    for (int i = 0; i < NH * W * D; i++)
        ck_assert(got[i] == stored(MKV_DTYPE_F16, want[i]));
    free(want);
    mkv_dump_close(d);
    unlink(path);
}
END_TEST

START_TEST(atomic_output)
{
    char dir[200], path[256];
    mkv_error err;
    test_path(dir, sizeof dir, "atomic");
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/out.h5", dir);
    mkv_dump_meta m;
    fill_meta(&m, MKV_DTYPE_F32);
    mkv_dump_writer *w;
    /* abandoned midway: nothing remains, not even the temporary */
    ck_assert_int_eq(mkv_dump_create(path, &m, NULL, &w, &err), MKV_OK);
    ck_assert_int_eq(test_count_entries(dir), 1); /* the hidden temporary */
    float *x = make_values(KVH, T, 1);
    ck_assert_int_eq(mkv_dump_write(w, 0, 'k', 0, KVH, 0, T, x, &err), MKV_OK);
    mkv_dump_abort(w);
    ck_assert_int_eq(test_count_entries(dir), 0);
    /* commit with datasets missing fails and leaves nothing */
    ck_assert_int_eq(mkv_dump_create(path, &m, NULL, &w, &err), MKV_OK);
    ck_assert_int_eq(mkv_dump_write(w, 0, 'k', 0, KVH, 0, T, x, &err), MKV_OK);
    ck_assert_int_eq(mkv_dump_commit(w, &err), MKV_EFORMAT);
    ck_assert_str_eq(err.msg, "/layers/00/v was not completely written");
    ck_assert_int_eq(test_count_entries(dir), 0);
    /* a NaN in the data is refused at the write, naming where */
    ck_assert_int_eq(mkv_dump_create(path, &m, NULL, &w, &err), MKV_OK);
    x[(1 * T + 2) * D + 5] = NAN;
    ck_assert_int_eq(mkv_dump_write(w, 1, 'v', 0, KVH, 0, T, x, &err), MKV_EFORMAT);
    ck_assert_str_eq(err.msg, "/layers/01/v: NaN at [1,2,5]");
    mkv_dump_abort(w);
    ck_assert_int_eq(test_count_entries(dir), 0);
    free(x);
    /* an existing file under the name survives a failed rewrite untouched */
    ck_assert_int_eq(write_dump(path, MKV_DTYPE_F16, 1, &err), MKV_OK);
    struct stat before, after;
    stat(path, &before);
    ck_assert_int_eq(mkv_dump_create(path, &m, NULL, &w, &err), MKV_OK);
    mkv_dump_abort(w);
    stat(path, &after);
    ck_assert(before.st_ino == after.st_ino && before.st_size == after.st_size);
    ck_assert_int_eq(test_count_entries(dir), 1);
    /* never overwrite the input */
    mkv_dump_write_opts o;
    mkv_dump_write_opts_init(&o);
    o.protect = path;
    ck_assert_int_eq(mkv_dump_create(path, &m, &o, &w, &err), MKV_EUSAGE);
    ck_assert_ptr_nonnull(strstr(err.msg, "would overwrite the input"));
    /* an unwritable place fails at once with the reason */
    ck_assert_int_eq(mkv_dump_create("/nonexistent/dir/out.h5", &m, NULL, &w, &err), MKV_EIO);
    ck_assert_str_eq(err.msg, "cannot create '/nonexistent/dir/out.h5': No such file or directory");
    unlink(path);
    rmdir(dir);
}
END_TEST

START_TEST(deterministic_bytes)
{
    char a[256], b[256];
    mkv_error err;
    test_path(a, sizeof a, "det-a.h5");
    test_path(b, sizeof b, "det-b.h5");
    ck_assert_int_eq(write_dump(a, MKV_DTYPE_F16, 6, &err), MKV_OK);
    ck_assert_int_eq(write_dump(b, MKV_DTYPE_F16, 6, &err), MKV_OK);
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int ca, cb;
    long n = 0;
    do {
        ca = fgetc(fa);
        cb = fgetc(fb);
        ck_assert_msg(ca == cb, "files differ at byte %ld", n);
        n++;
    } while (ca != EOF);
    fclose(fa);
    fclose(fb);
    unlink(a);
    unlink(b);
}
END_TEST

START_TEST(meta_checks)
{
    mkv_dump_meta m;
    mkv_error err;
    fill_meta(&m, MKV_DTYPE_F32);
    ck_assert_int_eq(mkv_dump_meta_check(&m, &err), MKV_OK);
    m.n_heads = 5;
    ck_assert_int_eq(mkv_dump_meta_check(&m, &err), MKV_EFORMAT);
    ck_assert_str_eq(err.msg, "n_heads=5 is not a multiple of n_kv_heads=2");
    fill_meta(&m, MKV_DTYPE_F32);
    m.rope_theta = INFINITY;
    ck_assert_int_eq(mkv_dump_meta_check(&m, &err), MKV_EFORMAT);
    ck_assert_str_eq(err.msg, "rope_theta=inf must be finite and positive");
    m.rope_theta = NAN;
    ck_assert_int_eq(mkv_dump_meta_check(&m, &err), MKV_EFORMAT);
    fill_meta(&m, MKV_DTYPE_F32);
    m.n_queries = T + 1;
    mkv_dump_writer *w;
    ck_assert_int_eq(mkv_dump_create("/tmp/never.h5", &m, NULL, &w, &err), MKV_EFORMAT);
    ck_assert_int_eq(access("/tmp/never.h5", F_OK), -1);
}
END_TEST

int main(void)
{
    mkv_log_init("check_dump");
    mkv_h5_quiet();
    Suite *s = suite_create("dump");
    TCase *tc = tcase_create("dump");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, roundtrip_f32);
    tcase_add_test(tc, roundtrip_f16);
    tcase_add_test(tc, roundtrip_bf16);
    tcase_add_test(tc, partial_reads);
    tcase_add_test(tc, validation_finds_defects);
    tcase_add_test(tc, metadata_and_extent_defects);
    tcase_add_test(tc, string_attributes);
    tcase_add_test(tc, index_ranges);
    tcase_add_test(tc, open_errors);
    tcase_add_test(tc, pipe_roundtrip);
    tcase_add_test(tc, atomic_output);
    tcase_add_test(tc, deterministic_bytes);
    tcase_add_test(tc, meta_checks);
    suite_add_tcase(s, tc);
    return test_run(s);
}
