/* Unit tests: compressed dumps (lib/io/cdump.h). What the writer stores is read
 * back both through our reader and through the plain HDF5 API (with HDF5's
 * own float16 conversion, not lib/core/half.c); byte counts are compared with
 * hand counts; defects are planted with plain HDF5 and must be refused. */
#include "config.h"

#include <hdf5.h>
#include <math.h>
#include <pthread.h>

#include "io/cdump.h"
#include "io/dump.h"
#include "core/log.h"
#include "testutil.h"

/* Tiny shape: 1 layer, 2 KV heads (4 query heads), T 7, head_dim 4, 2 queries. */
enum { L = 1, KVH = 2, NH = 4, T = 7, D = 4, W = 2 };
static const int32_t qpos[W] = {3, 6};

static void tiny_meta(mkv_cdump_meta *cm, int layers)
{
    memset(cm, 0, sizeof *cm);
    mkv_dump_meta_init(&cm->raw);
    strcpy(cm->raw.model, "tiny");
    cm->raw.n_layers = layers;
    cm->raw.n_heads = NH;
    cm->raw.n_kv_heads = KVH;
    cm->raw.head_dim = D;
    cm->raw.n_tokens = T;
    cm->raw.n_queries = W;
    strcpy(cm->raw.source, "synthetic");
    strcpy(cm->method, "unit");
    strcpy(cm->params, "a=1 b=0.5");
    strcpy(cm->source, "raw.h5");
}

/* call must succeed; its message (in the caller's err) says why not */
#define OK(call)                                                   \
    do {                                                           \
        int rc_ = (call);                                          \
        ck_assert_msg(rc_ == MKV_OK, "%s: %s", #call, err.msg);    \
    } while (0)

/* ---------------------------------------------------------------- plain HDF5 helpers */

static int64_t h5_int_attr(hid_t obj, const char *name)
{
    int64_t v = -1;
    hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
    ck_assert_msg(a >= 0, "attribute %s", name);
    H5Aread(a, H5T_NATIVE_INT64, &v);
    H5Aclose(a);
    return v;
}

static double h5_double_attr(hid_t obj, const char *name)
{
    double v = NAN;
    hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
    ck_assert_msg(a >= 0, "attribute %s", name);
    H5Aread(a, H5T_NATIVE_DOUBLE, &v);
    H5Aclose(a);
    return v;
}

/* Class, size and sign of a dataset's stored type, and that it has no filters
 * and contiguous layout. */
static void h5_check_type(hid_t f, const char *path, H5T_class_t cls, size_t size, int is_signed)
{
    hid_t ds = H5Dopen2(f, path, H5P_DEFAULT);
    ck_assert_msg(ds >= 0, "dataset %s", path);
    hid_t t = H5Dget_type(ds);
    ck_assert_int_eq(H5Tget_class(t), cls);
    ck_assert_uint_eq(H5Tget_size(t), size);
    if (cls == H5T_INTEGER)
        ck_assert_int_eq(H5Tget_sign(t) == H5T_SGN_2, is_signed);
    if (cls == H5T_FLOAT && size == 2) {
        size_t spos, epos, esize, mpos, msize;
        H5Tget_fields(t, &spos, &epos, &esize, &mpos, &msize);
        ck_assert_uint_eq(esize, 5);
        ck_assert_uint_eq(msize, 10);
    }
    hid_t dcpl = H5Dget_create_plist(ds);
    ck_assert_int_eq(H5Pget_nfilters(dcpl), 0);
    ck_assert_int_eq(H5Pget_layout(dcpl), H5D_CONTIGUOUS);
    H5Pclose(dcpl);
    H5Tclose(t);
    H5Dclose(ds);
}

/* ---------------------------------------------------------------- round trip */

/* Exactly representable float16 values, and 1 + 2^-11, which lies halfway
 * between 1 and the next float16 and must round to even (1). */
static const float f16_in[6] = {0.0f, 1.0f, -2.0f, 0.5f, 65504.0f, 1.0f + 0x1p-11f};
static const float f16_want[6] = {0.0f, 1.0f, -2.0f, 0.5f, 65504.0f, 1.0f};
static const float f32_in[4] = {1e-30f, -3.5f, 1e30f, 0.1f};
static const uint8_t u8_in[5] = {0, 1, 127, 128, 255};
static const int16_t i16_in[8] = {-32768, 32767, -1, 0, 1, 2, 300, -300};
static const int32_t i32_in[3] = {INT32_MIN, 0, INT32_MAX};

static void put_all_types(mkv_cdump_writer *w)
{
    mkv_error err;
    int64_t d2[2] = {2, 3}, d1[1] = {4}, d5[1] = {5}, d3[3] = {2, 2, 2}, d3b[1] = {3};
    OK(mkv_cdump_put(w, 0, 0, "f16", MKV_EL_F16, 2, d2, f16_in, &err));
    OK(mkv_cdump_put(w, 0, 0, "g/f32", MKV_EL_F32, 1, d1, f32_in, &err));
    OK(mkv_cdump_put(w, 0, 0, "u8", MKV_EL_U8, 1, d5, u8_in, &err));
    OK(mkv_cdump_put(w, 0, 1, "i16", MKV_EL_I16, 3, d3, i16_in, &err));
    OK(mkv_cdump_put(w, 0, 1, "g/i32", MKV_EL_I32, 1, d3b, i32_in, &err));
    OK(mkv_cdump_put_attr_int(w, 0, 1, "segments", 3, &err));
    OK(mkv_cdump_put_attr_double(w, 0, 0, "energy", 0.75, &err));
}

/* A writer of the tiny dump's metadata at the test file `name` (its path in path). */
static mkv_cdump_writer *tiny_writer(const char *name, char *path, size_t size)
{
    test_path(path, size, name);
    mkv_cdump_meta cm;
    tiny_meta(&cm, L);
    mkv_cdump_writer *w;
    mkv_error err;
    OK(mkv_cdump_create(path, NULL, &cm, qpos, &w, &err));
    return w;
}

static void write_all_types(const char *path)
{
    mkv_cdump_meta cm;
    tiny_meta(&cm, L);
    mkv_cdump_writer *w;
    mkv_error err;
    OK(mkv_cdump_create(path, NULL, &cm, qpos, &w, &err));
    put_all_types(w);
    OK(mkv_cdump_commit(w, &err));
}

START_TEST(roundtrip_every_type)
{
    char path[256];
    test_path(path, sizeof path, "types.h5");
    write_all_types(path);
    mkv_error err;
    mkv_cdump *c;
    OK(mkv_cdump_open(path, &c, &err));
    const mkv_cdump_meta *m = mkv_cdump_meta_of(c);
    ck_assert_str_eq(m->method, "unit");
    ck_assert_str_eq(m->params, "a=1 b=0.5");
    ck_assert_str_eq(m->source, "raw.h5");
    ck_assert_str_eq(m->raw.model, "tiny");
    ck_assert_str_eq(m->raw.source, "synthetic");
    ck_assert_int_eq(m->raw.n_tokens, T);
    ck_assert_int_eq(m->raw.n_queries, W);
    ck_assert_int_eq(m->raw.n_heads, NH);
    char buf[32];
    ck_assert_str_eq(mkv_cdump_param(c, "b", buf, sizeof buf), "0.5");
    ck_assert_str_eq(mkv_cdump_param(c, "a", buf, sizeof buf), "1");
    ck_assert_ptr_null(mkv_cdump_param(c, "c", buf, sizeof buf));
    int32_t pos[W];
    OK(mkv_cdump_read_query_pos(c, pos, &err));
    ck_assert_int_eq(pos[0], 3);
    ck_assert_int_eq(pos[1], 6);

    int64_t dims[3];
    ck_assert_int_eq(mkv_cdump_shape(c, 0, 0, "f16", dims), 2);
    ck_assert_int_eq(dims[0], 2);
    ck_assert_int_eq(dims[1], 3);
    ck_assert_int_eq(mkv_cdump_shape(c, 0, 1, "i16", dims), 3);
    ck_assert_int_eq(mkv_cdump_shape(c, 0, 1, "nothing", dims), 0);

    float f[6];
    OK(mkv_cdump_get(c, 0, 0, "f16", MKV_EL_F16, f, 6, &err));
    for (int i = 0; i < 6; i++)
        ck_assert_msg(f[i] == f16_want[i], "f16[%d] = %g, expected %g", i, f[i], f16_want[i]);
    OK(mkv_cdump_get(c, 0, 0, "g/f32", MKV_EL_F32, f, 4, &err));
    ck_assert(memcmp(f, f32_in, sizeof f32_in) == 0);
    uint8_t u8[5];
    OK(mkv_cdump_get(c, 0, 0, "u8", MKV_EL_U8, u8, 5, &err));
    ck_assert(memcmp(u8, u8_in, sizeof u8_in) == 0);
    void *p;
    size_t n;
    OK(mkv_cdump_get_alloc(c, 0, 1, "i16", MKV_EL_I16, &p, &n, &err));
    ck_assert_uint_eq(n, 8);
    ck_assert(memcmp(p, i16_in, sizeof i16_in) == 0);
    mkv_free(p);
    OK(mkv_cdump_get_alloc(c, 0, 1, "g/i32", MKV_EL_I32, &p, &n, &err));
    ck_assert_uint_eq(n, 3);
    ck_assert(memcmp(p, i32_in, sizeof i32_in) == 0);
    mkv_free(p);
    int64_t iv;
    double dv;
    OK(mkv_cdump_get_attr_int(c, 0, 1, "segments", &iv, &err));
    ck_assert_int_eq(iv, 3);
    OK(mkv_cdump_get_attr_double(c, 0, 0, "energy", &dv, &err));
    ck_assert(dv == 0.75);
    mkv_cdump_close(c);

    /* the same through plain HDF5, which converts float16 itself */
    hid_t fid = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    ck_assert(fid >= 0);
    h5_check_type(fid, "/layers/00/00/f16", H5T_FLOAT, 2, 0);
    h5_check_type(fid, "/layers/00/00/g/f32", H5T_FLOAT, 4, 0);
    h5_check_type(fid, "/layers/00/00/u8", H5T_INTEGER, 1, 0);
    h5_check_type(fid, "/layers/00/01/i16", H5T_INTEGER, 2, 1);
    h5_check_type(fid, "/layers/00/01/g/i32", H5T_INTEGER, 4, 1);
    h5_check_type(fid, "/query_pos", H5T_INTEGER, 4, 1);
    hid_t ds = H5Dopen2(fid, "/layers/00/00/f16", H5P_DEFAULT);
    ck_assert(H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, f) >= 0);
    H5Dclose(ds);
    for (int i = 0; i < 6; i++)
        ck_assert_msg(f[i] == f16_want[i], "HDF5 reads f16[%d] = %g", i, f[i]);
    int32_t i32[3];
    ds = H5Dopen2(fid, "/layers/00/01/g/i32", H5P_DEFAULT);
    ck_assert(H5Dread(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, i32) >= 0);
    H5Dclose(ds);
    ck_assert(memcmp(i32, i32_in, sizeof i32) == 0);
    /* strings are fixed-length, null-padded, of their own length: no
     * global heap */
    char fmt[64] = "";
    hid_t a = H5Aopen(fid, "mkv_format", H5P_DEFAULT);
    hid_t st = H5Aget_type(a);
    ck_assert(H5Tget_class(st) == H5T_STRING && H5Tis_variable_str(st) == 0);
    ck_assert_int_eq(H5Tget_strpad(st), H5T_STR_NULLPAD);
    ck_assert_uint_eq(H5Tget_size(st), strlen("mosaickv-compressed"));
    ck_assert(H5Aread(a, st, fmt) >= 0);
    H5Tclose(st);
    H5Aclose(a);
    ck_assert_str_eq(fmt, "mosaickv-compressed");
    ck_assert_int_eq(h5_int_attr(fid, "mkv_version"), 1);
    H5Fclose(fid);
    unlink(path);
}
END_TEST

/* ---------------------------------------------------------------- accounting */

/* fp16 bit patterns in memory (MKV_EL_F16_BITS) are stored as float16:
 * hand-picked patterns (zero, one, -2, the smallest subnormal 2^-24, the
 * largest finite, -0) read back as those values and as the same bits;
 * the float16 array written from floats reads back as its hand-rounded
 * bits; NaN and infinity patterns are refused, naming the element. */
START_TEST(f16_bits_roundtrip)
{
    char path[256];
    mkv_cdump_writer *w = tiny_writer("bits.h5", path, sizeof path);
    mkv_error err;
    const uint16_t bits[6] = {0x0000, 0x3c00, 0xc000, 0x0001, 0x7bff, 0x8000};
    const float values[6] = {0.0f, 1.0f, -2.0f, 0x1p-24f, 65504.0f, -0.0f};
    int64_t d6[1] = {6}, d23[2] = {2, 3};
    OK(mkv_cdump_put(w, 0, 0, "h", MKV_EL_F16_BITS, 1, d6, bits, &err));
    OK(mkv_cdump_put(w, 0, 0, "f16", MKV_EL_F16, 2, d23, f16_in, &err));
    const uint16_t inf[6] = {0, 0, 0, 0, 0x7c00, 0}, nan[6] = {0xfe00, 0, 0, 0, 0, 0};
    ck_assert_int_eq(mkv_cdump_put(w, 0, 0, "i", MKV_EL_F16_BITS, 2, d23, inf, &err), MKV_EFORMAT);
    ck_assert_str_eq(err.msg, "layer 0 head 0: 'i': Inf at [1,1]");
    ck_assert_int_eq(mkv_cdump_put(w, 0, 0, "n", MKV_EL_F16_BITS, 1, d6, nan, &err), MKV_EFORMAT);
    ck_assert_str_eq(err.msg, "layer 0 head 0: 'n': NaN at [0]");
    OK(mkv_cdump_put(w, 0, 1, "h", MKV_EL_F16_BITS, 1, d6, bits, &err));
    OK(mkv_cdump_commit(w, &err));

    mkv_cdump *c;
    OK(mkv_cdump_open(path, &c, &err));
    float f[6];
    uint16_t back[6];
    OK(mkv_cdump_get(c, 0, 0, "h", MKV_EL_F16, f, 6, &err));
    ck_assert(memcmp(f, values, sizeof f) == 0);
    OK(mkv_cdump_get(c, 0, 0, "h", MKV_EL_F16_BITS, back, 6, &err));
    ck_assert(memcmp(back, bits, sizeof back) == 0);
    /* 0, 1, -2, 0.5, 65504 and 1 + 2^-11 rounded to even: 1 */
    const uint16_t f16_bits[6] = {0x0000, 0x3c00, 0xc000, 0x3800, 0x7bff, 0x3c00};
    OK(mkv_cdump_get(c, 0, 0, "f16", MKV_EL_F16_BITS, back, 6, &err));
    ck_assert(memcmp(back, f16_bits, sizeof back) == 0);
    ck_assert_int_eq(mkv_cdump_get(c, 0, 0, "h", MKV_EL_F16_BITS, back, 5, &err), MKV_EFORMAT);
    mkv_cdump_close(c);

    hid_t fid = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    ck_assert(fid >= 0);
    h5_check_type(fid, "/layers/00/00/h", H5T_FLOAT, 2, 0);
    hid_t ds = H5Dopen2(fid, "/layers/00/00/h", H5P_DEFAULT);
    ck_assert(H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, f) >= 0);
    H5Dclose(ds);
    H5Fclose(fid);
    ck_assert(memcmp(f, values, sizeof f) == 0);
}
END_TEST

/* A dump built in memory reads back like the same dump from a file: the
 * same metadata, arrays and byte count. */
START_TEST(memory_dump_reads_back)
{
    char path[256];
    test_path(path, sizeof path, "types-file.h5");
    write_all_types(path);
    mkv_error err;
    mkv_cdump *file, *mem;
    OK(mkv_cdump_open(path, &file, &err));
    mkv_cdump_meta cm;
    tiny_meta(&cm, L);
    mkv_cdump_writer *w;
    OK(mkv_cdump_create_memory(&cm, qpos, &w, &err));
    put_all_types(w);
    OK(mkv_cdump_commit_open(w, &mem, &err));
    ck_assert_str_eq(mkv_cdump_path(mem), "(memory)");
    /* a second one while the first is open */
    mkv_cdump *mem2;
    OK(mkv_cdump_create_memory(&cm, qpos, &w, &err));
    put_all_types(w);
    OK(mkv_cdump_commit_open(w, &mem2, &err));
    mkv_cdump_close(mem2);
    const mkv_cdump_meta *a = mkv_cdump_meta_of(file), *b = mkv_cdump_meta_of(mem);
    ck_assert_str_eq(a->params, b->params);
    ck_assert_uint_eq(a->physical_bytes, b->physical_bytes);
    ck_assert_uint_eq(a->logical_bytes, b->logical_bytes);
    ck_assert_int_eq(a->raw.n_tokens, b->raw.n_tokens);
    float fa[6], fb[6];
    OK(mkv_cdump_get(file, 0, 0, "f16", MKV_EL_F16, fa, 6, &err));
    OK(mkv_cdump_get(mem, 0, 0, "f16", MKV_EL_F16, fb, 6, &err));
    ck_assert(memcmp(fa, fb, sizeof fa) == 0);
    int32_t ia[3], ib[3];
    OK(mkv_cdump_get(file, 0, 1, "g/i32", MKV_EL_I32, ia, 3, &err));
    OK(mkv_cdump_get(mem, 0, 1, "g/i32", MKV_EL_I32, ib, 3, &err));
    ck_assert(memcmp(ia, ib, sizeof ia) == 0);
    mkv_cdump_close(mem);
    mkv_cdump_close(file);
    unlink(path);

    /* a head left empty is refused at commit, as for a file */
    OK(mkv_cdump_create_memory(&cm, qpos, &w, &err));
    int64_t d1[1] = {4};
    OK(mkv_cdump_put(w, 0, 0, "g/f32", MKV_EL_F32, 1, d1, f32_in, &err));
    ck_assert_int_eq(mkv_cdump_commit_open(w, &mem, &err), MKV_EFORMAT);
    ck_assert_ptr_null(mem);
    ck_assert_msg(strstr(err.msg, "stored nothing"), "%s", err.msg);
}
END_TEST

/* A memory dump of one layer of a 3-layer shape: only that layer is
 * taken, stored, counted (by hand: logical 1 layer x 2 heads x 2 x 7 x 4
 * x 2 = 224 bytes; physical 12 x 2 + 4 x 4 = 40) and answered for. */
START_TEST(memory_dump_of_one_layer)
{
    mkv_cdump_meta cm;
    tiny_meta(&cm, 3);
    mkv_cdump_writer *w;
    mkv_cdump *c;
    mkv_error err;
    float a[12], y[4], back[12];
    for (int i = 0; i < 12; i++)
        a[i] = 0.25f * (float)i;
    for (int i = 0; i < 4; i++)
        y[i] = -1.5f * (float)i;
    int64_t da[2] = {3, 4}, dy[1] = {4};
    ck_assert_int_eq(mkv_cdump_create_memory_layer(&cm, qpos, 3, &w, &err), MKV_EUSAGE);
    ck_assert_int_eq(mkv_cdump_create_memory_layer(&cm, qpos, -1, &w, &err), MKV_EUSAGE);
    OK(mkv_cdump_create_memory_layer(&cm, qpos, 1, &w, &err));
    ck_assert_int_eq(mkv_cdump_put(w, 0, 0, "a", MKV_EL_F16, 2, da, a, &err), MKV_EUSAGE);
    ck_assert_msg(strstr(err.msg, "layer 0 is not the layer"), "%s", err.msg);
    ck_assert_int_eq(mkv_cdump_put(w, 2, 1, "a", MKV_EL_F16, 2, da, a, &err), MKV_EUSAGE);
    OK(mkv_cdump_put(w, 1, 0, "a", MKV_EL_F16, 2, da, a, &err));
    OK(mkv_cdump_put(w, 1, 1, "y", MKV_EL_F32, 1, dy, y, &err));
    OK(mkv_cdump_commit_open(w, &c, &err));
    const mkv_cdump_meta *m = mkv_cdump_meta_of(c);
    ck_assert_int_eq(m->raw.n_layers, 3);
    ck_assert_uint_eq(m->logical_bytes, 224);
    ck_assert_uint_eq(m->physical_bytes, 40);
    OK(mkv_cdump_get(c, 1, 0, "a", MKV_EL_F16, back, 12, &err));
    ck_assert(memcmp(a, back, sizeof a) == 0);
    OK(mkv_cdump_get(c, 1, 1, "y", MKV_EL_F32, back, 4, &err));
    ck_assert(memcmp(y, back, sizeof y) == 0);
    ck_assert_int_eq(mkv_cdump_get(c, 0, 0, "a", MKV_EL_F16, back, 12, &err), MKV_EUSAGE);
    ck_assert_msg(strstr(err.msg, "outside the dump"), "%s", err.msg);
    ck_assert_int_eq(mkv_cdump_get(c, 2, 0, "a", MKV_EL_F16, back, 12, &err), MKV_EUSAGE);
    mkv_cdump_close(c);
    /* a head of the layer left empty is refused at commit */
    OK(mkv_cdump_create_memory_layer(&cm, qpos, 2, &w, &err));
    OK(mkv_cdump_put(w, 2, 0, "a", MKV_EL_F16, 2, da, a, &err));
    ck_assert_int_eq(mkv_cdump_commit_open(w, &c, &err), MKV_EFORMAT);
    ck_assert_msg(strstr(err.msg, "layer 2 head 1"), "%s", err.msg);
}
END_TEST

START_TEST(accounting_hand_count)
{
    char path[256];
    test_path(path, sizeof path, "count.h5");
    mkv_cdump_meta cm;
    tiny_meta(&cm, L);
    mkv_cdump_writer *w;
    mkv_error err;
    float a[12] = {0};
    uint8_t b[5] = {0};
    int32_t x[4] = {0};
    float y[1] = {0};
    int64_t da[2] = {3, 4}, db[1] = {5}, dx[2] = {2, 2}, dy[1] = {1};
    OK(mkv_cdump_create(path, NULL, &cm, qpos, &w, &err));
    OK(mkv_cdump_put(w, 0, 0, "a", MKV_EL_F16, 2, da, a, &err));   /* 12 x 2 = 24 */
    OK(mkv_cdump_put(w, 0, 0, "b/c", MKV_EL_U8, 1, db, b, &err));  /*  5 x 1 =  5 */
    OK(mkv_cdump_put(w, 0, 1, "x", MKV_EL_I32, 2, dx, x, &err));   /*  4 x 4 = 16 */
    OK(mkv_cdump_put(w, 0, 1, "y", MKV_EL_F32, 1, dy, y, &err));   /*  1 x 4 =  4 */
    OK(mkv_cdump_put_attr_int(w, 0, 0, "not_counted", 12345, &err));
    ck_assert_uint_eq(mkv_cdump_head_bytes(w, 0, 0), 29);
    ck_assert_uint_eq(mkv_cdump_head_bytes(w, 0, 1), 20);
    ck_assert_uint_eq(mkv_cdump_total_bytes(w), 49);
    OK(mkv_cdump_commit(w, &err));

    /* logical: 1 layer x 2 heads x 2 (K, V) x 7 tokens x 4 channels x 2 bytes */
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    ck_assert(f >= 0);
    ck_assert_int_eq(h5_int_attr(f, "logical_bytes"), 224);
    ck_assert_int_eq(h5_int_attr(f, "physical_bytes"), 49);
    ck_assert(fabs(h5_double_attr(f, "compression_ratio") - 224.0 / 49.0) < 1e-12);
    hid_t g0 = H5Gopen2(f, "/layers/00/00", H5P_DEFAULT), g1 = H5Gopen2(f, "/layers/00/01", H5P_DEFAULT);
    ck_assert_int_eq(h5_int_attr(g0, "physical_bytes"), 29);
    ck_assert_int_eq(h5_int_attr(g1, "physical_bytes"), 20);
    ck_assert_int_eq(h5_int_attr(g0, "logical_bytes"), 112);
    ck_assert_int_eq(h5_int_attr(g1, "logical_bytes"), 112);
    H5Gclose(g0);
    H5Gclose(g1);
    H5Fclose(f);

    mkv_cdump *c;
    OK(mkv_cdump_open(path, &c, &err));
    ck_assert_uint_eq(mkv_cdump_meta_of(c)->logical_bytes, 224);
    ck_assert_uint_eq(mkv_cdump_meta_of(c)->physical_bytes, 49);
    mkv_cdump_close(c);
    unlink(path);
}
END_TEST

/* ---------------------------------------------------------------- reader errors */

/* A valid file at path with one float16 array "k" [T][D] per head. */
static void write_valid(const char *path, int layers)
{
    mkv_cdump_meta cm;
    tiny_meta(&cm, layers);
    mkv_cdump_writer *w;
    mkv_error err;
    float k[T * D];
    for (int i = 0; i < T * D; i++)
        k[i] = (float)i / 8;
    int64_t dims[2] = {T, D};
    OK(mkv_cdump_create(path, NULL, &cm, qpos, &w, &err));
    for (int l = 0; l < layers; l++)
        for (int h = 0; h < KVH; h++)
            OK(mkv_cdump_put(w, l, h, "k", MKV_EL_F16, 2, dims, k, &err));
    OK(mkv_cdump_commit(w, &err));
}

typedef void (*defect_fn)(hid_t f);

static void set_int_attr(hid_t obj, const char *name, int64_t v)
{
    H5Adelete(obj, name);
    hid_t s = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(obj, name, H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT64, &v);
    H5Aclose(a);
    H5Sclose(s);
}

static void set_str_attr(hid_t obj, const char *name, const char *v)
{
    H5Adelete(obj, name);
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, strlen(v) + 1);
    hid_t s = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(obj, name, t, s, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, t, v);
    H5Aclose(a);
    H5Sclose(s);
    H5Tclose(t);
}

static void defect_version(hid_t f) { set_int_attr(f, "mkv_version", 2); }
static void defect_format(hid_t f) { set_str_attr(f, "mkv_format", "something-else"); }
static void defect_no_format(hid_t f) { H5Adelete(f, "mkv_format"); }
static void defect_no_params(hid_t f) { H5Adelete(f, "params"); }
static void defect_physical(hid_t f) { set_int_attr(f, "physical_bytes", 1); }
static void defect_logical(hid_t f) { set_int_attr(f, "logical_bytes", 1000); }
static void defect_head_group(hid_t f) { H5Ldelete(f, "/layers/00/01", H5P_DEFAULT); }
static void defect_query_pos(hid_t f)
{
    int32_t bad[W] = {3, 7};
    hid_t ds = H5Dopen2(f, "/query_pos", H5P_DEFAULT);
    H5Dwrite(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, bad);
    H5Dclose(ds);
}
/* An array nobody counted: the per-head attribute no longer matches. */
static void defect_extra_array(hid_t f)
{
    hsize_t n = 3;
    hid_t s = H5Screate_simple(1, &n, NULL);
    hid_t ds = H5Dcreate2(f, "/layers/00/00/extra", H5T_STD_U8LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    uint8_t v[3] = {1, 2, 3};
    H5Dwrite(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
    H5Dclose(ds);
    H5Sclose(s);
}

static void expect_open_error(const char *name, defect_fn defect, int code, const char *msg)
{
    char path[256], want[512];
    test_path(path, sizeof path, name);
    write_valid(path, 1);
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    ck_assert(f >= 0);
    defect(f);
    H5Fclose(f);
    mkv_cdump *c = NULL;
    mkv_error err;
    mkv_error_clear(&err);
    ck_assert_int_eq(mkv_cdump_open(path, &c, &err), code);
    ck_assert_ptr_null(c);
    snprintf(want, sizeof want, "'%s'%s", path, msg);
    ck_assert_str_eq(err.msg, want);
    unlink(path);
}

START_TEST(reader_errors)
{
    expect_open_error("v2.h5", defect_version, MKV_EFORMAT, ": unsupported mkv_version 2 (this build reads version 1)");
    expect_open_error("fmt.h5", defect_format, MKV_EFORMAT,
                      " is not a compressed KV dump (mkv_format is 'something-else', expected 'mosaickv-compressed')");
    expect_open_error("nofmt.h5", defect_no_format, MKV_EFORMAT, " is not a mosaickv dump (no mkv_format attribute)");
    expect_open_error("noparams.h5", defect_no_params, MKV_EFORMAT, ": missing attribute 'params'");
    expect_open_error("phys.h5", defect_physical, MKV_EFORMAT, ": physical_bytes says 1 but /layers holds 112 bytes");
    expect_open_error("logical.h5", defect_logical, MKV_EFORMAT,
                      ": logical_bytes says 1000, expected 224 (n_layers x n_kv_heads x 2 x n_tokens x head_dim x 2)");
    expect_open_error("group.h5", defect_head_group, MKV_EFORMAT, ": missing group /layers/00/01");
    expect_open_error("qpos.h5", defect_query_pos, MKV_EFORMAT, ": /query_pos: position 7 at index 1 is outside 0..6");
    expect_open_error("extra.h5", defect_extra_array, MKV_EFORMAT,
                      ": /layers/00/00: physical_bytes says 56 but its datasets hold 59 bytes");

    /* files that are not compressed dumps at all */
    mkv_cdump *c = NULL;
    mkv_error err;
    char path[256], want[512];
    ck_assert_int_eq(mkv_cdump_open("/nonexistent/x.h5", &c, &err), MKV_EIO);
    ck_assert_str_eq(err.msg, "cannot open '/nonexistent/x.h5': No such file or directory");
    test_path(path, sizeof path, "raw.h5");
    mkv_dump_meta m;
    mkv_dump_meta_init(&m);
    m.n_layers = 1, m.n_heads = 2, m.n_kv_heads = 1, m.head_dim = 2, m.n_tokens = 3, m.n_queries = 0;
    mkv_dump_writer *dw;
    OK(mkv_dump_create(path, &m, NULL, &dw, &err));
    float x[6] = {0};
    OK(mkv_dump_write(dw, 0, 'k', 0, 1, 0, 3, x, &err));
    OK(mkv_dump_write(dw, 0, 'v', 0, 1, 0, 3, x, &err));
    OK(mkv_dump_write_query_pos(dw, NULL, &err));
    OK(mkv_dump_commit(dw, &err));
    ck_assert_int_eq(mkv_cdump_open(path, &c, &err), MKV_EFORMAT);
    snprintf(want, sizeof want, "'%s' is a raw KV dump; mkv-attend needs a compressed dump (mkv-compress)", path);
    ck_assert_str_eq(err.msg, want);
    unlink(path);
}
END_TEST

START_TEST(get_errors)
{
    char path[256], want[512];
    test_path(path, sizeof path, "get.h5");
    write_valid(path, 1);
    mkv_cdump *c;
    mkv_error err;
    OK(mkv_cdump_open(path, &c, &err));
    float k[T * D];
    ck_assert_int_eq(mkv_cdump_get(c, 0, 1, "k", MKV_EL_F32, k, T * D, &err), MKV_EFORMAT);
    snprintf(want, sizeof want, "'%s': /layers/00/01/k is float16, expected float32", path);
    ck_assert_str_eq(err.msg, want);
    ck_assert_int_eq(mkv_cdump_get(c, 0, 1, "k", MKV_EL_I16, k, T * D, &err), MKV_EFORMAT);
    snprintf(want, sizeof want, "'%s': /layers/00/01/k is float16, expected int16", path);
    ck_assert_str_eq(err.msg, want);
    ck_assert_int_eq(mkv_cdump_get(c, 0, 1, "k", MKV_EL_F16, k, T * D - 1, &err), MKV_EFORMAT);
    snprintf(want, sizeof want, "'%s': /layers/00/01/k has 28 elements, expected 27", path);
    ck_assert_str_eq(err.msg, want);
    ck_assert_int_eq(mkv_cdump_get(c, 0, 1, "v", MKV_EL_F16, k, T * D, &err), MKV_EFORMAT);
    snprintf(want, sizeof want, "'%s': missing dataset /layers/00/01/v", path);
    ck_assert_str_eq(err.msg, want);
    void *p = (void *)1;
    size_t n = 7;
    ck_assert_int_eq(mkv_cdump_get_alloc(c, 0, 0, "v/x", MKV_EL_F16, &p, &n, &err), MKV_EFORMAT);
    ck_assert_ptr_null(p);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(mkv_cdump_get(c, 1, 0, "k", MKV_EL_F16, k, T * D, &err), MKV_EUSAGE);
    int64_t v;
    ck_assert_int_eq(mkv_cdump_get_attr_int(c, 0, 0, "nope", &v, &err), MKV_EFORMAT);
    snprintf(want, sizeof want, "'%s': /layers/00/00: missing attribute 'nope'", path);
    ck_assert_str_eq(err.msg, want);
    /* values come back as written (float16 of i/8 is exact) */
    OK(mkv_cdump_get(c, 0, 1, "k", MKV_EL_F16, k, T * D, &err));
    for (int i = 0; i < T * D; i++)
        ck_assert(k[i] == (float)i / 8);
    mkv_cdump_close(c);
    unlink(path);
}
END_TEST

/* ---------------------------------------------------------------- writer refusals */

START_TEST(put_refusals)
{
    char path[256];
    mkv_cdump_writer *w = tiny_writer("refuse.h5", path, sizeof path);
    mkv_error err;
    float x[4] = {1, 2, 3, 4};
    int64_t d1[1] = {4}, d4[4] = {1, 1, 1, 4}, neg[1] = {-1};
    struct { const char *name; int head; int rank; const int64_t *dims; int code; const char *msg; } cases[] = {
        {"", 0, 1, d1, MKV_EUSAGE, "layer 0 head 0: invalid array name ''"},
        {"/k", 0, 1, d1, MKV_EUSAGE, "layer 0 head 0: invalid array name '/k'"},
        {"a/b/c", 0, 1, d1, MKV_EUSAGE, "layer 0 head 0: invalid array name 'a/b/c'"},
        {"sp ace", 0, 1, d1, MKV_EUSAGE, "layer 0 head 0: invalid array name 'sp ace'"},
        {"k", 2, 1, d1, MKV_EUSAGE, "layer 0 head 2 is outside the dump (1 layers, 2 KV heads)"},
        {"k", 0, 0, d1, MKV_EUSAGE, "layer 0 head 0: 'k': rank 0 is outside 1..3"},
        {"k", 0, 4, d4, MKV_EUSAGE, "layer 0 head 0: 'k': rank 4 is outside 1..3"},
        {"k", 0, 1, neg, MKV_EUSAGE, "layer 0 head 0: 'k': negative dimension -1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mkv_error_clear(&err);
        ck_assert_int_eq(mkv_cdump_put(w, 0, cases[i].head, cases[i].name, MKV_EL_F32, cases[i].rank, cases[i].dims,
                                       x, &err), cases[i].code);
        ck_assert_msg(strncmp(err.msg, cases[i].msg, strlen(cases[i].msg)) == 0, "case %zu: %s", i, err.msg);
    }
    float nan4[4] = {0, NAN, 0, 0}, big[4] = {0, 0, 70000.0f, 0}, edge[4] = {65504.0f, -65504.0f, 0, 0};
    ck_assert_int_eq(mkv_cdump_put(w, 0, 0, "n", MKV_EL_F32, 1, d1, nan4, &err), MKV_EFORMAT);
    ck_assert_str_eq(err.msg, "layer 0 head 0: 'n': NaN at [1]");
    ck_assert_int_eq(mkv_cdump_put(w, 0, 0, "b", MKV_EL_F16, 1, d1, big, &err), MKV_EFORMAT);
    ck_assert_str_eq(err.msg, "layer 0 head 0: 'b': value 70000 at [2] does not fit float16");
    int64_t d23[2] = {2, 3};
    float inf6[6] = {0, 0, 0, 0, -INFINITY, 0};
    ck_assert_int_eq(mkv_cdump_put(w, 0, 0, "m", MKV_EL_F16, 2, d23, inf6, &err), MKV_EFORMAT);
    ck_assert_str_eq(err.msg, "layer 0 head 0: 'm': -Inf at [1,1]");
    OK(mkv_cdump_put(w, 0, 0, "edge", MKV_EL_F16, 1, d1, edge, &err));
    OK(mkv_cdump_put(w, 0, 0, "k", MKV_EL_F32, 1, d1, x, &err));
    ck_assert_int_eq(mkv_cdump_put(w, 0, 0, "k", MKV_EL_F32, 1, d1, x, &err), MKV_EUSAGE);
    ck_assert_str_eq(err.msg, "layer 0 head 0: array 'k' clashes with 'k' stored before");
    ck_assert_int_eq(mkv_cdump_put(w, 0, 0, "k/x", MKV_EL_F32, 1, d1, x, &err), MKV_EUSAGE);
    ck_assert_str_eq(err.msg, "layer 0 head 0: array 'k/x' clashes with 'k' stored before");
    ck_assert_int_eq(mkv_cdump_put_attr_int(w, 0, 0, "physical_bytes", 1, &err), MKV_EUSAGE);
    ck_assert_int_eq(mkv_cdump_put_attr_double(w, 0, 0, "x", INFINITY, &err), MKV_EFORMAT);
    /* refused puts count nothing */
    ck_assert_uint_eq(mkv_cdump_total_bytes(w), 8 + 16);
    mkv_cdump_abort(w);
    ck_assert_int_eq(access(path, F_OK), -1);
}
END_TEST

START_TEST(create_refusals)
{
    char path[256];
    test_path(path, sizeof path, "protected.h5");
    write_valid(path, 1);
    mkv_cdump_meta cm;
    tiny_meta(&cm, L);
    mkv_cdump_writer *w = NULL;
    mkv_error err;
    ck_assert_int_eq(mkv_cdump_create(path, path, &cm, qpos, &w, &err), MKV_EUSAGE);
    ck_assert_ptr_null(w);
    char want[512];
    snprintf(want, sizeof want, "output '%s' would overwrite the input", path);
    ck_assert_str_eq(err.msg, want);
    int32_t bad[W] = {0, 7};
    ck_assert_int_eq(mkv_cdump_create(path, NULL, &cm, bad, &w, &err), MKV_EFORMAT);
    ck_assert_str_eq(err.msg, "query position 7 at index 1 is outside 0..6");
    cm.raw.n_heads = 3;
    ck_assert_int_eq(mkv_cdump_create(path, NULL, &cm, qpos, &w, &err), MKV_EFORMAT);
    ck_assert_str_eq(err.msg, "n_heads=3 is not a multiple of n_kv_heads=2");
    unlink(path);
}
END_TEST

/* ---------------------------------------------------------------- no partial output */

START_TEST(no_partial_output)
{
    char dir[256], path[512];
    snprintf(dir, sizeof dir, "%s/partial", test_tmpdir());
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    snprintf(path, sizeof path, "%s/out.h5", dir);
    mkv_cdump_meta cm;
    tiny_meta(&cm, L);
    mkv_cdump_writer *w;
    mkv_error err;
    float k[T * D] = {0};
    int64_t dims[2] = {T, D};

    /* abandoned: nothing appears */
    OK(mkv_cdump_create(path, NULL, &cm, qpos, &w, &err));
    OK(mkv_cdump_put(w, 0, 0, "k", MKV_EL_F16, 2, dims, k, &err));
    mkv_cdump_abort(w);
    ck_assert_int_eq(test_count_entries(dir), 0);

    /* a head the method skipped: commit fails, nothing appears */
    OK(mkv_cdump_create(path, NULL, &cm, qpos, &w, &err));
    OK(mkv_cdump_put(w, 0, 0, "k", MKV_EL_F16, 2, dims, k, &err));
    ck_assert_int_eq(mkv_cdump_commit(w, &err), MKV_EFORMAT);
    ck_assert_str_eq(err.msg, "/layers/00/01: the method stored nothing for layer 0 head 1");
    ck_assert_int_eq(test_count_entries(dir), 0);

    /* an existing file under the name stays as it was */
    FILE *fp = fopen(path, "w");
    fputs("old contents\n", fp);
    fclose(fp);
    OK(mkv_cdump_create(path, NULL, &cm, qpos, &w, &err));
    OK(mkv_cdump_put(w, 0, 1, "k", MKV_EL_F16, 2, dims, k, &err));
    mkv_cdump_abort(w);
    ck_assert_int_eq(test_count_entries(dir), 1);
    char buf[64] = "";
    fp = fopen(path, "r");
    ck_assert_ptr_nonnull(fgets(buf, sizeof buf, fp));
    fclose(fp);
    ck_assert_str_eq(buf, "old contents\n");
    unlink(path);
    rmdir(dir);
}
END_TEST

/* ---------------------------------------------------------------- threads, determinism */

enum { TL = 3, PUTS = 20 };

typedef struct {
    mkv_cdump_writer *w;
    int head;
    int rc;
} put_job;

/* One head's arrays over every layer, as a method compressing in parallel would. */
static void *put_head(void *arg)
{
    put_job *j = arg;
    mkv_error err;
    for (int l = 0; l < TL && !j->rc; l++)
        for (int i = 0; i < PUTS && !j->rc; i++) {
            char name[16];
            snprintf(name, sizeof name, "a%02d", i);
            int64_t n = i + 1;
            float v[PUTS];
            for (int k = 0; k < n; k++)
                v[k] = (float)(100 * l + 10 * j->head + k);
            j->rc = mkv_cdump_put(j->w, l, j->head, name, MKV_EL_F32, 1, &n, v, &err);
        }
    return NULL;
}

START_TEST(parallel_puts)
{
    char path[256];
    test_path(path, sizeof path, "threads.h5");
    mkv_cdump_meta cm;
    tiny_meta(&cm, TL);
    mkv_cdump_writer *w;
    mkv_error err;
    OK(mkv_cdump_create(path, NULL, &cm, qpos, &w, &err));
    pthread_t tid[KVH];
    put_job jobs[KVH];
    for (int h = 0; h < KVH; h++) {
        jobs[h] = (put_job){w, h, 0};
        pthread_create(&tid[h], NULL, put_head, &jobs[h]);
    }
    for (int h = 0; h < KVH; h++) {
        pthread_join(tid[h], NULL);
        ck_assert_int_eq(jobs[h].rc, MKV_OK);
    }
    /* per head and layer: sum over i of (i + 1) floats = 210 x 4 bytes */
    ck_assert_uint_eq(mkv_cdump_total_bytes(w), (uint64_t)TL * KVH * 210 * 4);
    OK(mkv_cdump_commit(w, &err));
    mkv_cdump *c;
    OK(mkv_cdump_open(path, &c, &err));
    for (int l = 0; l < TL; l++)
        for (int h = 0; h < KVH; h++) {
            float v[PUTS];
            OK(mkv_cdump_get(c, l, h, "a19", MKV_EL_F32, v, PUTS, &err));
            for (int k = 0; k < PUTS; k++)
                ck_assert(v[k] == (float)(100 * l + 10 * h + k));
        }
    mkv_cdump_close(c);
    unlink(path);
}
END_TEST

static void write_in_order(const char *path, const int *heads)
{
    mkv_cdump_meta cm;
    tiny_meta(&cm, L);
    mkv_cdump_writer *w;
    mkv_error err;
    int64_t n = 3;
    OK(mkv_cdump_create(path, NULL, &cm, qpos, &w, &err));
    for (int i = 0; i < KVH; i++) {
        float v[3] = {1, 2, (float)heads[i]};
        OK(mkv_cdump_put(w, 0, heads[i], "x", MKV_EL_F32, 1, &n, v, &err));
        OK(mkv_cdump_put(w, 0, heads[i], "s/y", MKV_EL_I16, 1, &n, (int16_t[]){1, 2, 3}, &err));
        OK(mkv_cdump_put_attr_int(w, 0, heads[i], "n", heads[i], &err));
    }
    OK(mkv_cdump_commit(w, &err));
}

static char *slurp(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    ck_assert_ptr_nonnull(fp);
    fseek(fp, 0, SEEK_END);
    *len = (size_t)ftell(fp);
    rewind(fp);
    char *buf = malloc(*len);
    ck_assert_uint_eq(fread(buf, 1, *len, fp), *len);
    fclose(fp);
    return buf;
}

/* Heads finished in any order give the same bytes (no timestamps either). */
START_TEST(deterministic_output)
{
    char a[256], b[256];
    test_path(a, sizeof a, "order-a.h5");
    test_path(b, sizeof b, "order-b.h5");
    write_in_order(a, (const int[]){0, 1});
    sleep(1);
    write_in_order(b, (const int[]){1, 0});
    size_t la, lb;
    char *x = slurp(a, &la), *y = slurp(b, &lb);
    ck_assert_uint_eq(la, lb);
    ck_assert(memcmp(x, y, la) == 0);
    free(x);
    free(y);
    unlink(a);
    unlink(b);
}
END_TEST

static Suite *cdump_suite(void)
{
    Suite *s = suite_create("cdump");
    TCase *tc = tcase_create("cdump");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, roundtrip_every_type);
    tcase_add_test(tc, f16_bits_roundtrip);
    tcase_add_test(tc, memory_dump_reads_back);
    tcase_add_test(tc, memory_dump_of_one_layer);
    tcase_add_test(tc, accounting_hand_count);
    tcase_add_test(tc, reader_errors);
    tcase_add_test(tc, get_errors);
    tcase_add_test(tc, put_refusals);
    tcase_add_test(tc, create_refusals);
    tcase_add_test(tc, no_partial_output);
    tcase_add_test(tc, parallel_puts);
    tcase_add_test(tc, deterministic_output);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    /* messages name the tool that needs a compressed dump */
    mkv_log_init("mkv-attend");
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    return test_run(cdump_suite());
}
